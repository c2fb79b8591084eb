// The grammar against the compiler's own tables: every keyword of the lexer, every
// dtype and every builtin gets its scope (the grammar tests in test/grammar check
// each construct by example; these catch a word added to the compiler later).

import * as assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { before, test } from 'node:test';
import * as oniguruma from 'vscode-oniguruma';
import * as textmate from 'vscode-textmate';

import { captures, extensionDir, readRepoFile } from './repo';

let grammar: textmate.IGrammar;

before(async () => {
    const wasm = fs.readFileSync(path.join(path.dirname(require.resolve('vscode-oniguruma')), 'onig.wasm'));
    await oniguruma.loadWASM(wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength));
    const registry = new textmate.Registry({
        onigLib: Promise.resolve({
            createOnigScanner: (patterns: string[]) => new oniguruma.OnigScanner(patterns),
            createOnigString: (s: string) => new oniguruma.OnigString(s),
        }),
        loadGrammar: async () => {
            const file = path.join(extensionDir, 'syntaxes', 'tessera.tmLanguage.json');
            return textmate.parseRawGrammar(fs.readFileSync(file, 'utf8'), file);
        },
    });
    grammar = (await registry.loadGrammar('source.tessera'))!;
});

/** The scopes of `word` at its first occurrence in `line`. */
function scopesOf(line: string, word: string): string[] {
    const at = line.indexOf(word);
    const token = grammar.tokenizeLine(line, textmate.INITIAL).tokens.find((t) => t.startIndex <= at && at < t.endIndex)!;
    assert.equal(line.slice(token.startIndex, token.endIndex), word, `\`${word}\` is not one token in: ${line}`);
    return token.scopes;
}

test('every keyword of the lexer is highlighted', () => {
    const lexer = readRepoFile('compiler/src/syntax/lexer.rs');
    const words = captures(lexer, /#\[token\("([A-Za-z_]+)"\)\]/g);
    assert.ok(words.length >= 20, `found only ${words.length} keywords in lexer.rs`);
    for (const word of words) {
        const scopes = scopesOf(`    x = ${word} `, word);
        assert.ok(scopes.length > 1, `keyword \`${word}\` has no scope`);
        assert.ok(!scopes.some((s) => s.startsWith('entity.name')), `keyword \`${word}\` looks like a name: ${scopes}`);
    }
});

test('every dtype of the checker is support.type.dtype', () => {
    const dtypes = captures(readRepoFile('compiler/src/check/types.rs'), /DType::\w+ => "(\w+)"/g);
    assert.equal(dtypes.length, 13);
    for (const d of dtypes) {
        assert.ok(scopesOf(`def f(x: Tensor["N", ${d}], s: ${d}):`, d).includes('support.type.dtype.tessera'), d);
        assert.ok(scopesOf(`    y = x.to(${d})`, d).includes('support.type.dtype.tessera'), d);
    }
});

test('every builtin of the checker is support.function.builtin when called', () => {
    const builtins = captures(readRepoFile('compiler/src/check/builtins.rs'), /(?:\bb\(\s*|name:\s*)"([a-z_0-9]+)"/g);
    assert.ok(builtins.length >= 40, `found only ${builtins.length} builtins in builtins.rs`);
    for (const b of builtins) {
        assert.ok(scopesOf(`    y = ${b}(x, axis=0)`, b).includes('support.function.builtin.tessera'), b);
    }
});
