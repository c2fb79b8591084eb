// VS Code reads these patterns as JavaScript regular expressions.

import * as assert from 'node:assert/strict';
import { test } from 'node:test';

import { readExtensionJson } from './repo';

const config = readExtensionJson('language-configuration.json');
const increase = new RegExp(config.indentationRules.increaseIndentPattern);
const decrease = new RegExp(config.indentationRules.decreaseIndentPattern);
const onEnter: { beforeText: string; afterText?: string; action: { indent: string; appendText?: string } }[] = config.onEnterRules;

/** What Enter does at the end of `line`, as the first matching onEnter rule says. */
function enterAfter(line: string, after = ''): string | undefined {
    const rule = onEnter.find((r) => new RegExp(r.beforeText).test(line) && (r.afterText === undefined || new RegExp(r.afterText).test(after)));
    return rule === undefined ? undefined : rule.action.indent + (rule.action.appendText ?? '');
}

test('comments are #, brackets are the three pairs', () => {
    assert.equal(config.comments.lineComment, '#');
    assert.deepEqual(config.brackets, [['{', '}'], ['[', ']'], ['(', ')']]);
    const closers = Object.fromEntries(config.autoClosingPairs.map((p: { open: string; close: string }) => [p.open, p.close]));
    for (const [open, close] of [['(', ')'], ['[', ']'], ['{', '}'], ['"', '"'], ["'", "'"]]) {
        assert.equal(closers[open], close);
    }
});

test('Enter after a line ending in `:` indents, also with a trailing comment', () => {
    for (const line of [
        'def gemm(A: Tensor["M", "K", f16], BM: const = 128):',
        '    for k in range(0, K, BK):',
        '        if causal:  # mask the upper triangle',
        '    else:',
        '    elif n > 0:',
        '    while i < n :',
        'def f(x: Tensor["N", f32]) -> Tensor["N", f32]:',
    ]) {
        assert.equal(enterAfter(line), 'indent', line);
        if (!line.includes('Tensor') || line.trimStart().startsWith('def')) {
            assert.ok(increase.test(line), `increaseIndentPattern misses ${line}`);
        }
    }
});

test('a colon inside a comment or a slice does not indent', () => {
    for (const line of ['x = load(t[0 : 4])  # note:', '# Example:', '    y = t[i : i + 4]', '    s = x  # ratio: 1:2']) {
        assert.notEqual(enterAfter(line), 'indent', line);
        assert.ok(!increase.test(line), line);
    }
});

test('Enter after return/pass/break/continue outdents; splitting a comment continues it', () => {
    for (const line of ['    return x * 2', '        pass', '            break', '            continue']) {
        assert.equal(enterAfter(line), 'outdent', line);
    }
    assert.equal(enterAfter('    # a long comment', ' that goes on'), 'none# ');
    assert.equal(enterAfter('    returned = 1'), undefined);
});

test('else: and elif ...: dedent when typed', () => {
    assert.ok(decrease.test('        else:'));
    assert.ok(decrease.test('    elif causal:  # why'));
    assert.ok(!decrease.test('    elsewhere = 1'));
    assert.ok(!decrease.test('    x = a if c else b'));
});

test('folding follows indentation', () => {
    assert.equal(config.folding.offSide, true);
});
