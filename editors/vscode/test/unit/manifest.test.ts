import * as assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'node:test';

import { ARCHES, DEFAULT_ARCH } from '../../src/arches';
import { captures, extensionDir, readExtensionJson, readRepoFile } from './repo';

const manifest = readExtensionJson('package.json');

test('tessera.arch offers exactly the targets of the compiler (target/limits.rs), default sm_90', () => {
    const fromCompiler = captures(readRepoFile('compiler/src/target/limits.rs'), /"((?:sm_\d+a?)|(?:gfx[0-9a-z]+))"/g);
    assert.deepEqual([...ARCHES].sort(), fromCompiler.sort());
    const setting = manifest.contributes.configuration.properties['tessera.arch'];
    assert.deepEqual(setting.enum, [...ARCHES]);
    assert.equal(setting.enumDescriptions.length, ARCHES.length);
    assert.equal(setting.default, DEFAULT_ARCH);
    assert.equal(DEFAULT_ARCH, 'sm_90');
});

test('tessera.defines is an object of integers (tsrc report -D NAME=VALUE), empty by default', () => {
    const setting = manifest.contributes.configuration.properties['tessera.defines'];
    assert.equal(setting.type, 'object');
    assert.deepEqual(setting.additionalProperties, { type: 'integer' });
    assert.deepEqual(setting.default, {});
    assert.match(readRepoFile('editors/vscode/src/extension.ts'), /initializationOptions: \(\) => \(\{ arch: currentArch\(\), defines: currentDefines\(\) \}\)/);
});

test('.tsr files are the tessera language, with the grammar and language configuration', () => {
    const [language] = manifest.contributes.languages;
    assert.equal(language.id, 'tessera');
    assert.deepEqual(language.extensions, ['.tsr']);
    const [grammar] = manifest.contributes.grammars;
    assert.equal(grammar.language, 'tessera');
    assert.equal(grammar.scopeName, 'source.tessera');
    for (const file of [language.configuration, grammar.path]) {
        assert.ok(fs.existsSync(path.join(extensionDir, file)), `${file} is missing`);
    }
    assert.equal(readExtensionJson(grammar.path).scopeName, 'source.tessera');
    assert.ok(manifest.activationEvents.includes('onLanguage:tessera'));
});

test('the packaged entry point is what tsc writes for src/extension.ts', () => {
    assert.equal(manifest.main, './out/src/extension.js');
    assert.ok(fs.existsSync(path.join(extensionDir, 'out', 'src', 'extension.js')), 'run `npm run build` first');
});

test('@types/vscode is not newer than engines.vscode (vsce refuses to package otherwise)', () => {
    const engine = /\d+\.\d+/.exec(manifest.engines.vscode)![0];
    const types = /\d+\.\d+/.exec(manifest.devDependencies['@types/vscode'])![0];
    const [em, en] = engine.split('.').map(Number);
    const [tm, tn] = types.split('.').map(Number);
    assert.ok(tm < em || (tm === em && tn <= en), `@types/vscode ${types} > engines.vscode ${engine}`);
});
