import * as assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'node:test';

import {
    decodeEmitQuery,
    EMIT_KINDS,
    emitDocumentPath,
    encodeEmitQuery,
    EmitTarget,
    isEmitKind,
    missingValueName,
    parseDefineValue,
} from '../../src/emitTarget';
import { extensionDir, readExtensionJson } from './repo';

const target: EmitTarget = {
    source: 'file:///home/me/My%20Kernels/gemm.tsr',
    kind: 'ptx',
    arch: 'sm_90a',
    kernel: 'gemm',
    defines: {},
};

test('the view URI query round-trips every field, including URIs with escapes', () => {
    assert.deepEqual(decodeEmitQuery(encodeEmitQuery(target)), target);
    const odd = { ...target, kind: 'target-ir' as const, kernel: 'a&b=c?d' };
    assert.deepEqual(decodeEmitQuery(encodeEmitQuery(odd)), odd);
    const specialised = { ...target, kernel: 'flash_attn', defines: { D: 128, causal: 1, OFF: -4 } };
    assert.deepEqual(decodeEmitQuery(encodeEmitQuery(specialised)), specialised);
});

test('a query with a missing field or an unknown kind is refused', () => {
    assert.equal(decodeEmitQuery('source=file%3A%2F%2F%2Fa.tsr&kind=ptx&arch=sm_90'), undefined);
    assert.equal(decodeEmitQuery('source=file%3A%2F%2F%2Fa.tsr&kind=sass&arch=sm_90&kernel=k'), undefined);
    assert.equal(decodeEmitQuery(''), undefined);
    assert.equal(decodeEmitQuery(encodeEmitQuery(target) + '&D=D%3Dx'), undefined);
    assert.equal(isEmitKind('toString'), false);
});

test('the view path names kernel, arch and level, and ends in .ptx for PTX', () => {
    assert.equal(emitDocumentPath(target), '/gemm.sm_90a.ptx');
    assert.equal(emitDocumentPath({ ...target, kind: 'tile-ir' }), '/gemm.sm_90a.tile-ir');
    assert.equal(emitDocumentPath({ ...target, kernel: '../x/y z' }), '/.._x_y_z.sm_90a.ptx');
    assert.equal(emitDocumentPath({ ...target, kernel: 'flash_attn', defines: { D: 64 } }), '/flash_attn.D=64.sm_90a.ptx');
});

// The three E0511 messages of compiler/src/ir/tile/lower.rs, as the server renders them.
test('E0511 errors name the const parameter or tensor dim that needs a value', () => {
    assert.equal(
        missingValueName('error[E0511] at 10:37: `:` over the tensor dim `D` needs its size at compile time: kernel `flash_attn` must be specialised on `D`'),
        'D',
    );
    assert.equal(missingValueName('error[E0511] at 3:5: tile shape depends on the tensor dim `N`: kernel `k` must be specialised on it'), 'N');
    assert.equal(
        missingValueName('error[E0511] at 2:40: kernel `gemm` needs a value for const parameter `BK`, which has no default (and 1 more)'),
        'BK',
    );
    assert.equal(missingValueName('error[E0401] at 1:1: the tensor dim `K` does not unify'), undefined);
});

test('-D values: integers as the language writes them, True and False', () => {
    assert.equal(parseDefineValue('128'), 128);
    assert.equal(parseDefineValue(' 1_024 '), 1024);
    assert.equal(parseDefineValue('0x80'), 128);
    assert.equal(parseDefineValue('-4'), -4);
    assert.equal(parseDefineValue('True'), 1);
    assert.equal(parseDefineValue('False'), 0);
    for (const bad of ['', '1.5', 'abc', '12abc', '99999999999999999999']) {
        assert.equal(parseDefineValue(bad), undefined, bad);
    }
});

test('the emit kinds are the levels of the tessera/emit contract', () => {
    assert.deepEqual(Object.keys(EMIT_KINDS).sort(), ['graph-ir', 'hip', 'ptx', 'schedule-ir', 'target-ir', 'tile-ir']);
});

test('every emit command is contributed in package.json, with the title its kind has', () => {
    const commands: { command: string; title: string }[] = readExtensionJson('package.json').contributes.commands;
    for (const info of Object.values(EMIT_KINDS)) {
        const c = commands.find((x) => x.command === info.command);
        assert.ok(c, `${info.command} is not contributed`);
        assert.equal(c.title, `Show ${info.title}`);
    }
});

test('every contributed command is registered by the extension', () => {
    const commands: { command: string }[] = readExtensionJson('package.json').contributes.commands;
    const source = fs.readFileSync(path.join(extensionDir, 'src', 'extension.ts'), 'utf8');
    const emitCommands = new Set<string>(Object.values(EMIT_KINDS).map((k) => k.command));
    for (const { command } of commands) {
        assert.ok(emitCommands.has(command) || source.includes(`registerCommand('${command}'`), `${command} is never registered`);
    }
});
