// The extension's side of the contract with a real `tessera lsp`: the messages the
// extension sends (initializationOptions, didChangeConfiguration, tessera/emit with a
// position, with a kernel name, with -D values) and what it reads from the answers.
// Runs when TESSERA_BIN names a `tessera` binary (scripts/vscode-check.sh builds one).

import * as assert from 'node:assert/strict';
import { ChildProcess, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { pathToFileURL } from 'node:url';
import { after, before, describe, test } from 'node:test';
import {
    createProtocolConnection,
    Diagnostic,
    ExitNotification,
    InlayHint,
    ProtocolConnection,
    ResponseError,
    ShutdownRequest,
    StreamMessageReader,
    StreamMessageWriter,
} from 'vscode-languageserver-protocol/node';

import { EMIT_KINDS, EMIT_REQUEST, EmitParams, EmitResult, missingValueName } from '../../src/emitTarget';
import { repoRoot } from './repo';

const bin = process.env.TESSERA_BIN;
const skip = bin ? false : 'TESSERA_BIN is not set (scripts/vscode-check.sh sets it to a freshly built tessera)';

describe('tessera lsp, as the extension speaks to it', { skip, timeout: 180_000 }, () => {
    let server: ChildProcess;
    let conn: ProtocolConnection;
    let stderr = '';
    const workspace = fs.mkdtempSync(path.join(os.tmpdir(), 'tessera-vscode-client-'));
    const diagnostics = new Map<string, Diagnostic[]>();
    const waiting = new Map<string, () => void>();

    function open(name: string): { uri: string; text: string } {
        const text = fs.readFileSync(path.join(repoRoot, 'examples', name), 'utf8');
        const file = path.join(workspace, name);
        fs.writeFileSync(file, text);
        const uri = pathToFileURL(file).toString();
        void conn.sendNotification('textDocument/didOpen', { textDocument: { uri, languageId: 'tessera', version: 1, text } });
        return { uri, text };
    }

    function published(uri: string): Promise<void> {
        return diagnostics.has(uri) ? Promise.resolve() : new Promise((resolve) => waiting.set(uri, resolve));
    }

    function emit(params: EmitParams): Promise<EmitResult> {
        return conn.sendRequest<EmitResult>(EMIT_REQUEST, params);
    }

    async function emitError(params: EmitParams): Promise<string> {
        try {
            const r = await emit(params);
            assert.fail(`expected an error, got ${r.name}: ${r.text.slice(0, 200)}`);
        } catch (e) {
            assert.ok(e instanceof ResponseError, String(e));
            return e.message;
        }
    }

    /** The estimate inlay hint of the kernel whose `def` header ends on `line`. */
    async function kernelHint(uri: string, line: number): Promise<string> {
        const hints: InlayHint[] | null = await conn.sendRequest('textDocument/inlayHint', {
            textDocument: { uri },
            range: { start: { line: 0, character: 0 }, end: { line: 200, character: 0 } },
        });
        const labels = (hints ?? [])
            .filter((h) => h.position.line === line)
            .map((h) => (typeof h.label === 'string' ? h.label : h.label.map((p) => p.value).join('')));
        const estimate = labels.find((l) => l.includes('regs'));
        assert.ok(estimate, `no estimate hint on line ${line + 1}: ${JSON.stringify(hints)}`);
        return estimate;
    }

    before(async () => {
        server = spawn(bin!, ['lsp'], { cwd: workspace, stdio: ['pipe', 'pipe', 'pipe'] });
        server.stderr!.on('data', (d) => (stderr += d.toString()));
        conn = createProtocolConnection(new StreamMessageReader(server.stdout!), new StreamMessageWriter(server.stdin!));
        conn.onNotification('textDocument/publishDiagnostics', (p: { uri: string; diagnostics: Diagnostic[] }) => {
            diagnostics.set(p.uri, p.diagnostics);
            waiting.get(p.uri)?.();
        });
        // Requests a server may send its client: answered as a client without these features.
        conn.onRequest('workspace/configuration', (p: { items: unknown[] }) => p.items.map(() => null));
        for (const method of ['workspace/inlayHint/refresh', 'workspace/semanticTokens/refresh', 'client/registerCapability', 'window/workDoneProgress/create']) {
            conn.onRequest(method, () => null);
        }
        conn.listen();
        // A server that cannot start (bad path, crash) fails the suite with the reason
        // instead of leaving `initialize` unanswered until the suite times out.
        const died = new Promise<never>((_, reject) => {
            server.on('error', (e) => reject(new Error(`cannot start ${bin} lsp: ${e.message}`)));
            server.on('exit', (code, signal) => reject(new Error(`${bin} lsp exited (${code ?? signal}) during initialize:\n${stderr}`)));
        });
        died.catch(() => undefined);
        const uri = pathToFileURL(workspace).toString();
        await Promise.race([
            died,
            conn.sendRequest('initialize', {
                processId: process.pid,
                rootUri: uri,
                workspaceFolders: [{ uri, name: 'ws' }],
                capabilities: {},
                initializationOptions: { arch: 'sm_90' },
            }),
        ]);
        await conn.sendNotification('initialized', {});
    });

    // Cleanup never waits on the server: the exit contract itself is tested in
    // repl/tests/lsp.rs. A server still alive 5 s after `exit` (or one that does not
    // answer `shutdown`) is killed, and its pipes are closed, so that this file's
    // process always ends (an open pipe to a live child keeps node running).
    after(async () => {
        const gone = new Promise<void>((resolve) => {
            if (server.exitCode !== null || server.signalCode !== null) resolve();
            else server.once('exit', () => resolve());
        });
        /** Whether `p` settles within `ms`; the timer is cleared either way. */
        const within = async (p: Promise<unknown>, ms: number): Promise<boolean> => {
            let timer: NodeJS.Timeout | undefined;
            const late = new Promise<boolean>((r) => (timer = setTimeout(() => r(false), ms)));
            try {
                return await Promise.race([p.then(() => true), late]);
            } finally {
                clearTimeout(timer);
            }
        };
        try {
            if (await within(conn.sendRequest(ShutdownRequest.type), 10_000)) {
                await conn.sendNotification(ExitNotification.type);
            }
        } finally {
            conn.dispose();
            server.stdin?.end();
            if (!(await within(gone, 5_000))) {
                process.stderr.write(`tessera lsp did not exit after shutdown/exit; killed\n${stderr}\n`);
                server.kill('SIGKILL');
            }
            server.stdout?.destroy();
            server.stderr?.destroy();
            server.unref();
            fs.rmSync(workspace, { recursive: true, force: true });
        }
    });

    test('a clean file gets (empty) diagnostics and an estimate hint for the arch of initializationOptions', async () => {
        const { uri } = open('gemm.tsr');
        await published(uri);
        assert.deepEqual(diagnostics.get(uri), [], stderr);
        assert.match(await kernelHint(uri, 4), /^≈ \d+ regs · [\d.]+ K?i?B smem · occ [\d.]+% \(sm_90\)$/);
    });

    test('didChangeConfiguration as synchronize.configurationSection sends it moves every estimate', async () => {
        const uri = pathToFileURL(path.join(workspace, 'gemm.tsr')).toString();
        await conn.sendNotification('workspace/didChangeConfiguration', { settings: { tessera: { arch: 'sm_80' } } });
        assert.match(await kernelHint(uri, 4), /\(sm_80\)/);
        await conn.sendNotification('workspace/didChangeConfiguration', { settings: { tessera: { arch: 'sm_90' } } });
        assert.match(await kernelHint(uri, 4), /^≈ \d+ regs · [\d.]+ K?i?B smem · occ [\d.]+% \(sm_90\)$/);
    });

    test('Show PTX: emit at the cursor answers the kernel name, which then emits by name', async () => {
        const uri = pathToFileURL(path.join(workspace, 'gemm.tsr')).toString();
        const atCursor = await emit({ uri, kind: 'ptx', arch: 'sm_90', position: { line: 9, character: 12 } });
        assert.equal(atCursor.name, 'gemm');
        assert.match(atCursor.text, /\.entry\s+gemm/);
        for (const kind of ['ptx', 'target-ir', 'tile-ir'] as const) {
            const byName = await emit({ uri, kind, arch: 'sm_80', kernel: atCursor.name });
            assert.equal(byName.name, 'gemm', kind);
            assert.ok(byName.text.length > 0, kind);
        }
        const sm80 = await emit({ uri, kind: 'ptx', arch: 'sm_80', kernel: 'gemm' });
        assert.match(sm80.text, /\.target\s+sm_80/);
    });

    test('an E0511 answer names the value to ask for; the answer with defines is the kernel', async () => {
        const { uri } = open('flash_attn.tsr');
        await published(uri);
        const message = await emitError({ uri, kind: 'ptx', arch: 'sm_90', position: { line: 10, character: 8 } });
        assert.equal(missingValueName(message), 'D', message);
        const r = await emit({ uri, kind: 'ptx', arch: 'sm_90', position: { line: 10, character: 8 }, defines: { D: 64 } });
        assert.equal(r.name, 'flash_attn');
        const again = await emit({ uri, kind: 'tile-ir', arch: 'sm_90', kernel: r.name, defines: { D: 64 } });
        assert.equal(again.name, 'flash_attn');
    });

    test('errors are messages the extension can show: wrong level for a kernel, PTX for an AMD arch', async () => {
        const uri = pathToFileURL(path.join(workspace, 'gemm.tsr')).toString();
        assert.ok((await emitError({ uri, kind: 'graph-ir', arch: 'sm_90', kernel: 'gemm' })).length > 0);
        assert.match(await emitError({ uri, kind: 'ptx', arch: 'gfx942', kernel: 'gemm' }), /NVIDIA/);
        assert.match(await emitError({ uri, kind: 'hip', arch: 'sm_90', kernel: 'gemm' }), /AMD/);
    });

    test('Show HIP: the kernel as HIP C++ for an AMD arch', async () => {
        const uri = pathToFileURL(path.join(workspace, 'gemm.tsr')).toString();
        const r = await emit({ uri, kind: 'hip', arch: 'gfx1100', kernel: 'gemm' });
        assert.equal(r.name, 'gemm');
        assert.match(r.text, /extern "C" __global__ __launch_bounds__\(\d+\) void gemm\(/);
    });

    test('every level the extension has a command for is a kind the server knows', async () => {
        const uri = pathToFileURL(path.join(workspace, 'gemm.tsr')).toString();
        for (const kind of Object.keys(EMIT_KINDS)) {
            try {
                await emit({ uri, kind: kind as EmitParams['kind'], arch: 'sm_90', kernel: 'gemm' });
            } catch (e) {
                assert.ok(!/unknown kind/.test((e as Error).message), `${kind}: ${(e as Error).message}`);
            }
        }
    });
});
