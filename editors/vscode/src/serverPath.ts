// Finding the `tessera` binary named by the `tessera.serverPath` setting.
// Kept free of the `vscode` module so that it runs under plain node in the unit tests.

import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

export const DEFAULT_SERVER_PATH = 'tessera';

export interface LookupContext {
    env: NodeJS.ProcessEnv;
    platform: NodeJS.Platform;
    /** Where a relative path in the setting starts from (the first workspace folder). */
    baseDir?: string;
    home?: string;
}

export interface Lookup {
    /** The absolute path of an executable file, when one was found. */
    found?: string;
    /** What was tried, in words, for the error message when nothing was found. */
    tried: string;
}

/**
 * Resolves the setting the way a shell would: a bare name is searched on PATH
 * (with PATHEXT on Windows), anything with a directory part is a path.
 */
export function findServer(setting: string | undefined, ctx: LookupContext): Lookup {
    let name = (setting ?? '').trim() || DEFAULT_SERVER_PATH;
    const home = ctx.home ?? os.homedir();
    if (name === '~' || name.startsWith('~/') || name.startsWith('~\\')) {
        name = path.join(home, name.slice(1));
    }
    const win = ctx.platform === 'win32';
    const hasDir = name.includes('/') || (win && name.includes('\\'));
    if (hasDir) {
        const full = path.resolve(ctx.baseDir ?? process.cwd(), name);
        const found = executableVariants(full, ctx).find(isExecutableFile(win));
        return { found, tried: full };
    }
    const dirs = (pathVariable(ctx.env) ?? '').split(win ? ';' : ':').filter((d) => d.length > 0);
    for (const dir of dirs) {
        const found = executableVariants(path.join(dir, name), ctx).find(isExecutableFile(win));
        if (found) {
            return { found, tried: `\`${name}\` on PATH` };
        }
    }
    return { tried: `\`${name}\` on PATH (${dirs.length} directories)` };
}

// Windows spells the variable `Path` as often as `PATH`.
function pathVariable(env: NodeJS.ProcessEnv): string | undefined {
    const key = Object.keys(env).find((k) => k.toUpperCase() === 'PATH');
    return key === undefined ? undefined : env[key];
}

function executableVariants(file: string, ctx: LookupContext): string[] {
    if (ctx.platform !== 'win32' || path.extname(file) !== '') {
        return [file];
    }
    const exts = (ctx.env.PATHEXT ?? '.EXE;.CMD;.BAT;.COM').split(';').filter((e) => e.length > 0);
    return [file, ...exts.map((e) => file + e.toLowerCase())];
}

function isExecutableFile(win: boolean): (file: string) => boolean {
    return (file) => {
        try {
            if (!fs.statSync(file).isFile()) {
                return false;
            }
            if (!win) {
                fs.accessSync(file, fs.constants.X_OK);
            }
            return true;
        } catch {
            return false;
        }
    };
}
