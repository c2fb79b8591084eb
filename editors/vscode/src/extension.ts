// The Tessera extension: starts `tessera lsp` through vscode-languageclient, keeps
// `tessera.arch` in sync with the server, and adds the Show PTX / Show IR commands.

import * as vscode from 'vscode';
import { LanguageClient, LanguageClientOptions, ServerOptions } from 'vscode-languageclient/node';

import { ARCHES, DEFAULT_ARCH } from './arches';
import { EMIT_KINDS, EmitKind } from './emitTarget';
import { EmitViews } from './emitViews';
import { findServer } from './serverPath';

let client: LanguageClient | undefined;
let clientDisposables: vscode.Disposable[] = [];
let output: vscode.OutputChannel;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
    output = vscode.window.createOutputChannel('Tessera Language Server');
    const views = new EmitViews(() => client, currentArch, output);
    context.subscriptions.push(output, views);

    for (const kind of Object.keys(EMIT_KINDS) as EmitKind[]) {
        context.subscriptions.push(vscode.commands.registerCommand(EMIT_KINDS[kind].command, () => views.show(kind)));
    }
    context.subscriptions.push(
        vscode.commands.registerCommand('tessera.restartServer', restartClient),
        vscode.commands.registerCommand('tessera.selectArch', selectArch),
        vscode.workspace.onDidChangeConfiguration((e) => {
            if (e.affectsConfiguration('tessera.serverPath')) {
                void restartClient();
            }
        }),
        archStatusItem(),
    );
    await startClient();
}

export async function deactivate(): Promise<void> {
    await stopClient();
}

function currentArch(): string {
    return vscode.workspace.getConfiguration('tessera').get<string>('arch') ?? DEFAULT_ARCH;
}

/** `tessera.defines`: NAME → integer, as `tsrc report -D NAME=VALUE`. */
function currentDefines(): Record<string, number> {
    return vscode.workspace.getConfiguration('tessera').get<Record<string, number>>('defines') ?? {};
}

async function startClient(): Promise<void> {
    const setting = vscode.workspace.getConfiguration('tessera').get<string>('serverPath');
    const folder = vscode.workspace.workspaceFolders?.[0]?.uri;
    const baseDir = folder?.scheme === 'file' ? folder.fsPath : undefined;
    const lookup = findServer(setting, { env: process.env, platform: process.platform, baseDir });
    if (lookup.found === undefined) {
        const message =
            `Tessera: cannot start the language server: ${lookup.tried} was not found. ` +
            'Build it with `cargo build --release -p tessera-repl` (the binary is target/release/tessera) ' +
            'and put it on PATH, or set "tessera.serverPath" to its full path.';
        output.appendLine(message);
        void vscode.window.showErrorMessage(message, 'Open Settings').then((choice) => {
            if (choice !== undefined) {
                void vscode.commands.executeCommand('workbench.action.openSettings', 'tessera.serverPath');
            }
        });
        return;
    }

    const serverOptions: ServerOptions = {
        command: lookup.found,
        args: ['lsp'],
        // No `transport`: the client would add `--stdio`; plain pipes are stdio already.
        options: baseDir === undefined ? {} : { cwd: baseDir },
    };
    const watcher = vscode.workspace.createFileSystemWatcher('**/*.tsr');
    clientDisposables.push(watcher);
    const clientOptions: LanguageClientOptions = {
        documentSelector: [
            { scheme: 'file', language: 'tessera' },
            { scheme: 'untitled', language: 'tessera' },
        ],
        initializationOptions: () => ({ arch: currentArch(), defines: currentDefines() }),
        // Sends `workspace/didChangeConfiguration` with `{ settings: { tessera: {...} } }`.
        synchronize: { configurationSection: 'tessera', fileEvents: watcher },
        outputChannel: output,
    };
    output.appendLine(`Starting ${lookup.found} lsp (arch ${currentArch()})`);
    const started = new LanguageClient('tessera', 'Tessera Language Server', serverOptions, clientOptions);
    client = started;
    try {
        await started.start();
    } catch (e) {
        const message = e instanceof Error ? e.message : String(e);
        output.appendLine(`The server failed to start: ${message}`);
        void vscode.window.showErrorMessage(
            `Tessera: \`${lookup.found} lsp\` failed to start (${message}). ` +
                'Is the binary recent enough to have the `lsp` subcommand? See the "Tessera Language Server" output.',
        );
    }
}

async function stopClient(): Promise<void> {
    const old = client;
    client = undefined;
    clientDisposables.forEach((d) => d.dispose());
    clientDisposables = [];
    if (old !== undefined) {
        try {
            await old.dispose();
        } catch (e) {
            output.appendLine(`Stopping the server: ${e instanceof Error ? e.message : String(e)}`);
        }
    }
}

async function restartClient(): Promise<void> {
    await stopClient();
    await startClient();
}

async function selectArch(): Promise<void> {
    const config = vscode.workspace.getConfiguration('tessera');
    const now = currentArch();
    const pick = await vscode.window.showQuickPick(
        ARCHES.map((a) => ({ label: a, description: a === now ? 'current' : undefined })),
        { placeHolder: 'Target architecture for estimates, diagnostics and Show PTX/IR (tessera.arch)' },
    );
    if (pick === undefined || pick.label === now) {
        return;
    }
    // Change the setting where it is set now: the workspace if it has a value, else the user settings.
    const inspected = config.inspect<string>('arch');
    const target =
        inspected?.workspaceFolderValue !== undefined
            ? vscode.ConfigurationTarget.WorkspaceFolder
            : inspected?.workspaceValue !== undefined
              ? vscode.ConfigurationTarget.Workspace
              : vscode.ConfigurationTarget.Global;
    await config.update('arch', pick.label, target);
}

/** `$(chip) sm_90` in the status bar while a .tsr file is active; a click changes the arch. */
function archStatusItem(): vscode.Disposable {
    const item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
    item.name = 'Tessera target architecture';
    item.command = 'tessera.selectArch';
    item.tooltip = 'Tessera target architecture (tessera.arch): click to change';
    const update = () => {
        item.text = `$(chip) ${currentArch()}`;
        if (vscode.window.activeTextEditor?.document.languageId === 'tessera') {
            item.show();
        } else {
            item.hide();
        }
    };
    update();
    return vscode.Disposable.from(
        item,
        vscode.window.onDidChangeActiveTextEditor(update),
        vscode.workspace.onDidChangeConfiguration((e) => {
            if (e.affectsConfiguration('tessera.arch')) {
                update();
            }
        }),
    );
}
