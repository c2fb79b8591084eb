// The targets of `tessera.arch` (the compiler's `--arch` values). The unit tests
// check this list against package.json and compiler/src/target/limits.rs.

export const ARCHES = [
    'sm_70',
    'sm_75',
    'sm_80',
    'sm_86',
    'sm_89',
    'sm_90',
    'sm_90a',
    'gfx90a',
    'gfx942',
    'gfx1100',
] as const;

export const DEFAULT_ARCH = 'sm_90';
