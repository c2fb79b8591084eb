// What a `tessera/emit` view shows, and how that is written into the URI of its
// virtual document. Free of the `vscode` module so that the unit tests run it.

/** The `kind` values of the `tessera/emit` request, with their commands. */
export const EMIT_KINDS = {
    'graph-ir': { command: 'tessera.showGraphIr', title: 'Graph IR', suffix: 'graph-ir' },
    'schedule-ir': { command: 'tessera.showScheduleIr', title: 'Schedule IR', suffix: 'schedule-ir' },
    'tile-ir': { command: 'tessera.showTileIr', title: 'Tile IR', suffix: 'tile-ir' },
    'target-ir': { command: 'tessera.showTargetIr', title: 'Target IR', suffix: 'target-ir' },
    ptx: { command: 'tessera.showPtx', title: 'PTX', suffix: 'ptx' },
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
}

/** Result of the `tessera/emit` request. */
export interface EmitResult {
    text: string;
    /** The kernel (or function) the text was emitted for. */
    name: string;
}

/** One open view: the source file, the level, the arch and the kernel it shows. */
export interface EmitTarget {
    source: string;
    kind: EmitKind;
    arch: string;
    kernel: string;
}

export const EMIT_SCHEME = 'tessera-emit';

/**
 * The path of the view's virtual document: its basename is the editor tab's title,
 * e.g. `gemm.sm_90.ptx` (a `.ptx` name lets a PTX extension, if installed, colour it).
 */
export function emitDocumentPath(t: EmitTarget): string {
    const safe = (s: string) => s.replace(/[^A-Za-z0-9_.-]+/g, '_') || '_';
    return `/${safe(t.kernel)}.${safe(t.arch)}.${EMIT_KINDS[t.kind].suffix}`;
}

/** The query of the view's URI: everything needed to emit the text again. */
export function encodeEmitQuery(t: EmitTarget): string {
    return new URLSearchParams({ source: t.source, kind: t.kind, arch: t.arch, kernel: t.kernel }).toString();
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
    return { source, kind, arch, kernel };
}
