// Read-only views of `tessera/emit` results (PTX and the IR levels), opened beside the
// source and emitted again whenever the source is saved.

import * as vscode from 'vscode';
import { LanguageClient, LSPErrorCodes, ResponseError } from 'vscode-languageclient/node';

import {
    decodeEmitQuery,
    EMIT_KINDS,
    EMIT_REQUEST,
    EMIT_SCHEME,
    EmitKind,
    EmitParams,
    EmitResult,
    EmitTarget,
    emitDocumentPath,
    encodeEmitQuery,
    missingValueName,
    parseDefineValue,
} from './emitTarget';

export class EmitViews implements vscode.TextDocumentContentProvider, vscode.Disposable {
    private readonly changed = new vscode.EventEmitter<vscode.Uri>();
    readonly onDidChange = this.changed.event;
    /** The text of each open view, by URI: the provider answers from here. */
    private readonly texts = new Map<string, string>();
    /** `-D` values given for a kernel (by source and kernel), asked once per session. */
    private readonly defines = new Map<string, Record<string, number>>();
    private readonly disposables: vscode.Disposable[] = [];

    constructor(
        private readonly client: () => LanguageClient | undefined,
        private readonly arch: () => string,
        private readonly log: vscode.OutputChannel,
    ) {
        this.disposables.push(
            this.changed,
            vscode.workspace.registerTextDocumentContentProvider(EMIT_SCHEME, this),
            vscode.workspace.onDidSaveTextDocument((doc) => this.refreshViewsOf(doc)),
            vscode.workspace.onDidCloseTextDocument((doc) => {
                if (doc.uri.scheme === EMIT_SCHEME) {
                    this.texts.delete(doc.uri.toString());
                }
            }),
        );
    }

    dispose(): void {
        this.disposables.forEach((d) => d.dispose());
    }

    async provideTextDocumentContent(uri: vscode.Uri, token: vscode.CancellationToken): Promise<string> {
        const cached = this.texts.get(uri.toString());
        if (cached !== undefined) {
            return cached;
        }
        // VS Code may drop a hidden view's text and ask again: emit it anew.
        const target = decodeEmitQuery(uri.query);
        if (target === undefined) {
            return `This is not a Tessera emit view: ${uri.toString()}`;
        }
        const text = await this.emitText(target, token);
        this.texts.set(uri.toString(), text);
        return text;
    }

    /** The command behind "Tessera: Show PTX" and friends: emit at the cursor, show beside. */
    async show(kind: EmitKind): Promise<void> {
        const title = EMIT_KINDS[kind].title;
        const editor = vscode.window.activeTextEditor;
        if (editor === undefined || editor.document.languageId !== 'tessera') {
            void vscode.window.showWarningMessage(`Tessera: open a .tsr file and put the cursor inside a kernel to show its ${title}.`);
            return;
        }
        const client = this.runningClient();
        if (client === undefined) {
            return;
        }
        const c2p = client.code2ProtocolConverter;
        const source = c2p.asUri(editor.document.uri);
        const arch = this.arch();
        const position = c2p.asPosition(editor.selection.active);
        // A kernel with a const parameter without default, or a tile shape over a tensor
        // dim (flash_attn's `D`), needs values (`tsrc -D`): E0511 names one at a time.
        const defines: Record<string, number> = {};
        let result: EmitResult;
        for (;;) {
            const params: EmitParams = { uri: source, kind, arch, position };
            if (Object.keys(defines).length > 0) {
                params.defines = defines;
            }
            try {
                result = await vscode.window.withProgress(
                    { location: vscode.ProgressLocation.Window, title: `Tessera: emitting ${title} (${arch})` },
                    (_progress, token) => this.request(client, params, token),
                );
                break;
            } catch (e) {
                const message = errorMessage(e);
                const name = missingValueName(message);
                if (name !== undefined && !(name in defines)) {
                    const kernel = /kernel `([A-Za-z_]\w*)`/.exec(message)?.[1];
                    const value = this.remembered(source, kernel)[name] ?? (await askValue(name, kernel, title, message));
                    if (value !== undefined) {
                        defines[name] = value;
                        continue;
                    }
                    return;
                }
                this.log.appendLine(`[emit] ${title} at ${source}:${position.line + 1}: ${message}`);
                void vscode.window.showErrorMessage(`Tessera: cannot show ${title}: ${message}`);
                return;
            }
        }
        Object.assign(this.remembered(source, result.name), defines);
        const target: EmitTarget = { source, kind, arch, kernel: result.name, defines };
        const uri = vscode.Uri.from({ scheme: EMIT_SCHEME, path: emitDocumentPath(target), query: encodeEmitQuery(target) });
        this.texts.set(uri.toString(), result.text);
        this.changed.fire(uri); // a view of the same kernel that is already open shows the new text
        let doc = await vscode.workspace.openTextDocument(uri);
        doc = await this.setLanguage(doc, kind);
        await vscode.window.showTextDocument(doc, { viewColumn: vscode.ViewColumn.Beside, preserveFocus: true, preview: false });
    }

    private async setLanguage(doc: vscode.TextDocument, kind: EmitKind): Promise<vscode.TextDocument> {
        // PTX is coloured only when some installed extension knows the `ptx` language;
        // HIP is C++ (a language VS Code ships).
        const known = await vscode.languages.getLanguages();
        const language = kind === 'ptx' ? 'ptx' : kind === 'hip' ? 'cpp' : undefined;
        const wanted = language !== undefined && known.includes(language) ? language : 'plaintext';
        return doc.languageId === wanted ? doc : vscode.languages.setTextDocumentLanguage(doc, wanted);
    }

    private async refreshViewsOf(saved: vscode.TextDocument): Promise<void> {
        if (saved.languageId !== 'tessera') {
            return;
        }
        const client = this.client();
        if (client === undefined || !client.isRunning()) {
            return;
        }
        const source = client.code2ProtocolConverter.asUri(saved.uri);
        for (const doc of vscode.workspace.textDocuments) {
            if (doc.uri.scheme !== EMIT_SCHEME || doc.isClosed) {
                continue;
            }
            const target = decodeEmitQuery(doc.uri.query);
            if (target === undefined || target.source !== source) {
                continue;
            }
            this.texts.set(doc.uri.toString(), await this.emitText(target));
            this.changed.fire(doc.uri);
        }
    }

    /** Emits a view's text by kernel name; a failure becomes the text, so a view is never stale. */
    private async emitText(target: EmitTarget, token?: vscode.CancellationToken): Promise<string> {
        const title = EMIT_KINDS[target.kind].title;
        const client = this.client();
        if (client === undefined || !client.isRunning()) {
            return `Tessera: the language server is not running, so ${title} of \`${target.kernel}\` cannot be emitted.\n`;
        }
        const params: EmitParams = { uri: target.source, kind: target.kind, arch: target.arch, kernel: target.kernel };
        if (Object.keys(target.defines).length > 0) {
            params.defines = target.defines;
        }
        try {
            return (await this.request(client, params, token)).text;
        } catch (e) {
            const message = errorMessage(e);
            this.log.appendLine(`[emit] ${title} of ${target.kernel} (${target.arch}): ${message}`);
            return `Tessera: cannot emit ${title} of \`${target.kernel}\` for ${target.arch}:\n\n${message}\n`;
        }
    }

    private async request(client: LanguageClient, params: EmitParams, token?: vscode.CancellationToken): Promise<EmitResult> {
        // An edit that lands while the server works cancels the request (ContentModified):
        // ask again, the server then answers from the new text.
        for (let attempt = 1; ; attempt++) {
            try {
                const result = await client.sendRequest<EmitResult>(EMIT_REQUEST, params, token);
                if (result === null || typeof result !== 'object' || typeof result.text !== 'string' || typeof result.name !== 'string') {
                    throw new Error(`the server answered ${EMIT_REQUEST} without { text, name }`);
                }
                return result;
            } catch (e) {
                if (attempt < 3 && e instanceof ResponseError && e.code === LSPErrorCodes.ContentModified) {
                    continue;
                }
                throw e;
            }
        }
    }

    private remembered(source: string, kernel: string | undefined): Record<string, number> {
        if (kernel === undefined) {
            return {};
        }
        const key = `${source}#${kernel}`;
        let values = this.defines.get(key);
        if (values === undefined) {
            values = {};
            this.defines.set(key, values);
        }
        return values;
    }

    private runningClient(): LanguageClient | undefined {
        const client = this.client();
        if (client === undefined || !client.isRunning()) {
            void vscode.window.showErrorMessage(
                'Tessera: the language server is not running; see the "Tessera Language Server" output, or run "Tessera: Restart Language Server".',
            );
            return undefined;
        }
        return client;
    }
}

async function askValue(name: string, kernel: string | undefined, title: string, message: string): Promise<number | undefined> {
    const text = await vscode.window.showInputBox({
        title: `Tessera: ${title} of ${kernel === undefined ? 'this kernel' : `\`${kernel}\``} needs a value for \`${name}\``,
        prompt: `${message} — the value is used like \`tsrc emit -D ${name}=VALUE\`.`,
        placeHolder: 'an integer such as 128, or True / False',
        ignoreFocusOut: true,
        validateInput: (v) => (parseDefineValue(v) === undefined ? 'an integer (128, 1_024, 0x80) or True / False' : undefined),
    });
    return text === undefined ? undefined : parseDefineValue(text);
}

function errorMessage(e: unknown): string {
    if (e instanceof ResponseError || e instanceof Error) {
        return e.message;
    }
    return String(e);
}
