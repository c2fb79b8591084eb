import * as assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { after, test } from 'node:test';

import { findServer } from '../../src/serverPath';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tessera-server-path-'));
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

function file(relative: string, mode: number): string {
    const full = path.join(tmp, relative);
    fs.mkdirSync(path.dirname(full), { recursive: true });
    fs.writeFileSync(full, '#!/bin/sh\n');
    fs.chmodSync(full, mode);
    return full;
}

const exe = file('bin/tessera', 0o755);
const notExe = file('plain/tessera', 0o644);
const inHome = file('home/.cargo/bin/tessera', 0o755);
const rel = file('ws/target/release/tessera', 0o755);
const winExe = file('win/tessera.exe', 0o644);
fs.mkdirSync(path.join(tmp, 'dir/tessera'), { recursive: true });

const unix = { platform: 'linux' as NodeJS.Platform, home: path.join(tmp, 'home') };

test('a bare name is looked up on PATH, skipping files that are not executable and directories', () => {
    const PATH = [path.join(tmp, 'plain'), path.join(tmp, 'dir'), '', path.join(tmp, 'bin')].join(':');
    assert.equal(findServer('tessera', { ...unix, env: { PATH } }).found, exe);
});

test('the default (empty setting) is `tessera` on PATH', () => {
    assert.equal(findServer('', { ...unix, env: { PATH: path.join(tmp, 'bin') } }).found, exe);
    assert.equal(findServer(undefined, { ...unix, env: { PATH: path.join(tmp, 'bin') } }).found, exe);
});

test('a name not on PATH is not found, and the message says what was searched', () => {
    const r = findServer('tessera', { ...unix, env: { PATH: path.join(tmp, 'plain') } });
    assert.equal(r.found, undefined);
    assert.match(r.tried, /`tessera` on PATH \(1 directories\)/);
    assert.equal(findServer('tessera', { ...unix, env: {} }).found, undefined);
});

test('a relative path starts at the workspace folder; ~ is the home directory', () => {
    assert.equal(findServer('target/release/tessera', { ...unix, env: {}, baseDir: path.join(tmp, 'ws') }).found, rel);
    assert.equal(findServer('./target/release/tessera', { ...unix, env: {}, baseDir: path.join(tmp, 'ws') }).found, rel);
    assert.equal(findServer('~/.cargo/bin/tessera', { ...unix, env: {} }).found, inHome);
    assert.equal(findServer(` ${exe} `, { ...unix, env: {} }).found, exe);
});

test('an explicit path to a missing or non-executable file is not found and is named', () => {
    const r = findServer(notExe, { ...unix, env: {} });
    assert.equal(r.found, undefined);
    assert.equal(r.tried, notExe);
});

test('on Windows, PATH (any case) is searched with the PATHEXT extensions', () => {
    const r = findServer('tessera', { platform: 'win32', env: { Path: path.join(tmp, 'win'), PATHEXT: '.COM;.EXE' } });
    assert.equal(r.found, winExe);
});
