// Paths into the extension and the Tessera repository around it, for the tests that
// keep the extension in step with the compiler's own tables.

import * as fs from 'fs';
import * as path from 'path';

/** editors/vscode, found from the compiled test file in out/test/unit. */
export const extensionDir = path.resolve(__dirname, '..', '..', '..');

/** The repository root (holds compiler/), two levels above editors/vscode. */
export const repoRoot = path.resolve(extensionDir, '..', '..');

export function readRepoFile(relative: string): string {
    const file = path.join(repoRoot, relative);
    if (!fs.existsSync(file)) {
        throw new Error(`${file} is missing: these tests run inside the Tessera repository (editors/vscode)`);
    }
    return fs.readFileSync(file, 'utf8');
}

export function readExtensionJson(relative: string): any {
    return JSON.parse(fs.readFileSync(path.join(extensionDir, relative), 'utf8'));
}

/** Every first capture of `re` in `text`, in order, without repeats. */
export function captures(text: string, re: RegExp): string[] {
    return [...new Set([...text.matchAll(re)].map((m) => m[1]))];
}
