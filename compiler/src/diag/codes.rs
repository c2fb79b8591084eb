//! The catalogue of diagnostic codes. Codes are stable: never renumber one, and
//! retire a code by leaving it out of new output rather than reusing it.
//! `docs/diagnostics.md` documents each entry with an example, and the UI tests
//! require every code here to be produced by at least one case.

use super::Severity;

#[derive(Clone, Copy, Debug)]
pub struct CodeInfo {
    pub code: &'static str,
    pub severity: Severity,
    pub title: &'static str,
}

const fn e(code: &'static str, title: &'static str) -> CodeInfo {
    CodeInfo {
        code,
        severity: Severity::Error,
        title,
    }
}

const fn n(code: &'static str, title: &'static str) -> CodeInfo {
    CodeInfo {
        code,
        severity: Severity::Note,
        title,
    }
}

const fn w(code: &'static str, title: &'static str) -> CodeInfo {
    CodeInfo {
        code,
        severity: Severity::Warning,
        title,
    }
}

pub const CATALOGUE: &[CodeInfo] = &[
    // E01xx syntax
    e("E0101", "unexpected token"),
    e(
        "E0102",
        "unexpected end of input (unclosed bracket or block)",
    ),
    e("E0103", "tab in indentation"),
    e("E0104", "dedent does not match any outer indentation level"),
    e("E0105", "unexpected indent"),
    e("E0106", "expected an indented block"),
    e("E0107", "invalid character"),
    e("E0108", "unterminated string literal"),
    e("E0109", "invalid numeric literal"),
    e("E0110", "invalid assignment target"),
    e("E0111", "invalid dim expression"),
    e("E0112", "positional argument after keyword argument"),
    e("E0113", "decorator not followed by a def"),
    e("E0114", "`break` or `continue` outside a loop"),
    e("E0115", "`return` outside a function"),
    e("E0116", "expression nested too deeply"),
    e("E0119", "kernel too large"),
    // E02xx names and imports
    e("E0201", "unknown name"),
    e("E0202", "unknown module"),
    e("E0203", "name not found in module"),
    e("E0204", "duplicate definition"),
    e("E0205", "unknown keyword argument"),
    e("E0206", "duplicate parameter or argument"),
    e("E0207", "unknown decorator or decorator option"),
    e(
        "E0208",
        "assignment to a constant, parameter dim or builtin",
    ),
    e("E0209", "name may be used before it is assigned"),
    // E03xx types and dtypes
    e("E0301", "dtype mismatch"),
    e("E0302", "argument has the wrong kind of type"),
    e("E0303", "unknown attribute"),
    e("E0304", "wrong number of arguments"),
    e("E0305", "unknown type or dtype"),
    e("E0306", "malformed type annotation"),
    e("E0307", "return type mismatch"),
    e("E0308", "condition is not a scalar"),
    e("E0309", "value is not callable"),
    e("E0310", "value is not a compile-time constant"),
    e("E0311", "unsupported dtype for this operation"),
    e("E0312", "invalid cast"),
    e(
        "E0313",
        "tensor used where a tile or scalar is needed (load it first)",
    ),
    e("E0314", "operation needs integer or bool operands"),
    e("E0315", "constant evaluation failed"),
    e("E0316", "function used as a value"),
    e("E0317", "reduction of an empty extent has no identity"),
    e("E0320", "dtype variable bound to two different dtypes"),
    e("E0321", "dtype outside the dtype variable's bound"),
    e("E0322", "malformed dtype variable"),
    e("E0323", "kernel with dtype variables or a batch run"),
    e("E0324", "integer out of range for the dtype it meets"),
    // E04xx shapes
    e("E0401", "dim bound to two different sizes"),
    e("E0402", "shapes do not broadcast"),
    e("E0403", "inner dims of dot/matmul differ"),
    e("E0404", "axis out of range"),
    e("E0405", "slice length is not a compile-time constant"),
    e("E0406", "tile dim is not known at compile time"),
    e(
        "E0407",
        "loop-carried or branch-merged value changes shape or dtype",
    ),
    e("E0408", "stored tile does not match the slice shape"),
    e("E0409", "returned shape does not match the signature"),
    e("E0410", "wrong number of indices"),
    e("E0411", "wrong rank for this operation"),
    e("E0412", "reshape changes the number of elements"),
    e("E0413", "constant index out of range"),
    e("E0414", "batch run bound to two different runs of dims"),
    e("E0415", "misplaced batch run"),
    e("E0416", "too many dims"),
    // E05xx kernels and launches
    e("E0501", "kernel launched without a grid"),
    e("E0502", "invalid grid"),
    e("E0503", "kernel-only builtin used outside a kernel"),
    e("E0504", "kernel returns a value"),
    e("E0505", "const parameter needs a compile-time value"),
    e("E0506", "invalid decorator option value"),
    e("E0507", "program axis out of range"),
    e("E0508", "whole-tensor operation inside a kernel"),
    e("E0509", "invalid autotune space"),
    e("E0510", "parameter type not allowed here"),
    e(
        "E0511",
        "kernel needs a value for a const parameter or specialised dim",
    ),
    e("E0512", "not supported by code generation yet"),
    e("E0513", "assumed divisor contradicts a fixed value"),
    // E06xx targets and resources
    e("E0602", "tiles exceed the register file"),
    e("E0603", "tiles exceed shared memory"),
    e("E0604", "too many threads per block"),
    e(
        "E0605",
        "dot shape not supported by the target's tensor cores",
    ),
    e("E0606", "tile too large for the target"),
    e("E0607", "invalid `num_warps`"),
    e("E0608", "invalid `num_stages`"),
    e("E0609", "launch grid exceeds the target's limits"),
    e("E0615", "output not available for the target"),
    // E07xx execution (run-time errors of `tessera::exec`; no static check
    // produces them: tests/harness/numerics.rs triggers each one)
    e(
        "E0701",
        "tensor argument shape does not match the signature",
    ),
    e(
        "E0702",
        "tensor argument dtype does not match the signature",
    ),
    e("E0703", "invalid launch grid"),
    e("E0704", "integer division by zero"),
    e("E0705", "tensor index out of bounds"),
    e("E0706", "interrupted"),
    e("E0707", "bad arguments to a call"),
    e("E0708", "cannot read or write a .npy file"),
    e("E0709", "kernel cannot be compiled for this launch"),
    e("E0710", "function cannot run yet"),
    e("E0711", "launch requirement does not hold"),
    e("E0712", "tensor size overflows"),
    e("E0713", "cannot allocate tensor memory"),
    // E072x sessions (`tessera repl`, `tessera run`)
    e("E0720", "not supported in a session statement"),
    e("E0721", "device not available"),
    e("E0722", "unknown session command or bad command usage"),
    e("E0723", "file cannot be read"),
    e("E0724", "integer overflow in a session computation"),
    e("E0725", "session builtin used outside top-level statements"),
    e(
        "E0726",
        "assigned value does not fit the shape of the indexed part",
    ),
    e("E0727", "assigned value does not fit the tensor's dtype"),
    // E073x the GPU
    e("E0730", "error on the GPU"),
    e("E0735", "a saved session cannot be resumed"),
    e("E0736", "tensor arguments on two GPUs"),
    e("E0737", "a tensor cannot be sharded or collected this way"),
    e(
        "E0738",
        "an operation that cannot run on each device's part",
    ),
    // W0xxx warnings
    w("W0001", "unused variable"),
    w("W0002", "unused import"),
    w("W0005", "unreachable code"),
    w("W0003", "kernel likely spills registers"),
    w("W0007", "kernel likely spills scalar registers (AMD)"),
    w(
        "W0004",
        "low occupancy (under 25%) with nothing hiding memory latency",
    ),
    w(
        "W0008",
        "an f8 dot runs on FMA units on a target whose tensor cores take f8",
    ),
    // Notes (severity `note`): information, no action needed.
    n(
        "W0006",
        "low occupancy (under 25%), latency hidden by tensor cores or pipelined copies",
    ),
];

pub fn lookup(code: &str) -> Option<&'static CodeInfo> {
    CATALOGUE.iter().find(|c| c.code == code)
}
