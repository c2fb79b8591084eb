import * as assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'node:test';

import { decodeEmitQuery, EMIT_KINDS, emitDocumentPath, encodeEmitQuery, EmitTarget, isEmitKind } from '../../src/emitTarget';
import { extensionDir, readExtensionJson } from './repo';

const target: EmitTarget = {
    source: 'file:///home/me/My%20Kernels/gemm.tsr',
    kind: 'ptx',
    arch: 'sm_90a',
    kernel: 'gemm',
};

test('the view URI query round-trips every field, including URIs with escapes', () => {
    assert.deepEqual(decodeEmitQuery(encodeEmitQuery(target)), target);
    const odd = { ...target, kind: 'target-ir' as const, kernel: 'a&b=c?d' };
    assert.deepEqual(decodeEmitQuery(encodeEmitQuery(odd)), odd);
});

test('a query with a missing field or an unknown kind is refused', () => {
    assert.equal(decodeEmitQuery('source=file%3A%2F%2F%2Fa.tsr&kind=ptx&arch=sm_90'), undefined);
    assert.equal(decodeEmitQuery('source=file%3A%2F%2F%2Fa.tsr&kind=hip&arch=sm_90&kernel=k'), undefined);
    assert.equal(decodeEmitQuery(''), undefined);
    assert.equal(isEmitKind('toString'), false);
});

test('the view path names kernel, arch and level, and ends in .ptx for PTX', () => {
    assert.equal(emitDocumentPath(target), '/gemm.sm_90a.ptx');
    assert.equal(emitDocumentPath({ ...target, kind: 'tile-ir' }), '/gemm.sm_90a.tile-ir');
    assert.equal(emitDocumentPath({ ...target, kernel: '../x/y z' }), '/.._x_y_z.sm_90a.ptx');
});

test('the emit kinds are the levels of the tessera/emit contract', () => {
    assert.deepEqual(Object.keys(EMIT_KINDS).sort(), ['graph-ir', 'ptx', 'schedule-ir', 'target-ir', 'tile-ir']);
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
