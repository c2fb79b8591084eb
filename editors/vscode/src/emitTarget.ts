// What a `tessera/emit` view shows, and how that is written into the URI of its
// virtual document. Free of the `vscode` module so that the unit tests run it.

/** The custom request of `tessera lsp` that returns an IR level, PTX or HIP. */
export const EMIT_REQUEST = 'tessera/emit';

/** The `kind` values of the `tessera/emit` request, with their commands. */
export const EMIT_KINDS = {
    'graph-ir': { command: 'tessera.showGraphIr', title: 'Graph IR', suffix: 'graph-ir' },
    'schedule-ir': { command: 'tessera.showScheduleIr', title: 'Schedule IR', suffix: 'schedule-ir' },
    'tile-ir': { command: 'tessera.showTileIr', title: 'Tile IR', suffix: 'tile-ir' },
    'target-ir': { command: 'tessera.showTargetIr', title: 'Target IR', suffix: 'target-ir' },
    ptx: { command: 'tessera.showPtx', title: 'PTX', suffix: 'ptx' },
    hip: { command: 'tessera.showHip', title: 'HIP', suffix: 'hip' },
} as const;

export type EmitKind = keyof typeof EMIT_KINDS;

export function isEmitKind(s: string): s is EmitKind {
    return Object.prototype.hasOwnProperty.call(EMIT_KINDS, s);
}

/** Params of the `tessera/emit` request (the server's contract). */
export interface EmitParams {
    uri: string;
    kind: EmitKind;
    arch?: string;
    kernel?: string;
    position?: { line: number; character: number };
    /**
     * Values for const parameters without a default and for tensor dims the kernel
     * must be specialised on (`tsrc -D NAME=VALUE`); `True`/`False` are 1/0.
     */
    defines?: Record<string, number>;
}

/** Result of the `tessera/emit` request. */
export interface EmitResult {
    text: string;
    /** The kernel (or function) the text was emitted for. */
    name: string;
}

/** One open view: the source file, the level, the arch, the kernel and its -D values. */
export interface EmitTarget {
    source: string;
    kind: EmitKind;
    arch: string;
    kernel: string;
    defines: Record<string, number>;
}

export const EMIT_SCHEME = 'tessera-emit';

/**
 * The path of the view's virtual document: its basename is the editor tab's title,
 * e.g. `gemm.sm_90.ptx` (a `.ptx` name lets a PTX extension, if installed, colour it).
 */
export function emitDocumentPath(t: EmitTarget): string {
    const safe = (s: string) => s.replace(/[^A-Za-z0-9_.-]+/g, '_') || '_';
    const defines = Object.entries(t.defines).map(([k, v]) => `.${safe(k)}=${v}`);
    return `/${safe(t.kernel)}${defines.join('')}.${safe(t.arch)}.${EMIT_KINDS[t.kind].suffix}`;
}

/** The query of the view's URI: everything needed to emit the text again. */
export function encodeEmitQuery(t: EmitTarget): string {
    const q = new URLSearchParams({ source: t.source, kind: t.kind, arch: t.arch, kernel: t.kernel });
    for (const [name, value] of Object.entries(t.defines)) {
        q.append('D', `${name}=${value}`);
    }
    return q.toString();
}

export function decodeEmitQuery(query: string): EmitTarget | undefined {
    const q = new URLSearchParams(query);
    const source = q.get('source');
    const kind = q.get('kind');
    const arch = q.get('arch');
    const kernel = q.get('kernel');
    if (!source || !kind || !isEmitKind(kind) || !arch || !kernel) {
        return undefined;
    }
    const defines: Record<string, number> = {};
    for (const d of q.getAll('D')) {
        const m = /^([A-Za-z_]\w*)=(-?\d+)$/.exec(d);
        if (m === null) {
            return undefined;
        }
        defines[m[1]] = Number(m[2]);
    }
    return { source, kind, arch, kernel, defines };
}

/**
 * The name an E0511 error asks a value for (a const parameter without a default, or a
 * tensor dim a tile shape needs), from the message the server answers `tessera/emit` with.
 */
export function missingValueName(message: string): string | undefined {
    if (!message.includes('E0511')) {
        return undefined;
    }
    return /(?:tensor dim|const parameter) `([A-Za-z_]\w*)`/.exec(message)?.[1];
}

/** A `-D` value as typed: an integer (`128`, `1_024`, `0x80`) or `True`/`False`. */
export function parseDefineValue(text: string): number | undefined {
    const t = text.trim().replace(/_/g, '');
    if (t === 'True') {
        return 1;
    }
    if (t === 'False') {
        return 0;
    }
    if (!/^-?(?:\d+|0[xX][0-9a-fA-F]+)$/.test(t)) {
        return undefined;
    }
    const n = t.startsWith('-') ? -Number(t.slice(1)) : Number(t);
    return Number.isSafeInteger(n) ? n : undefined;
}
