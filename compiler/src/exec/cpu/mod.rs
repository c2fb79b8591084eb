//! The CPU executor of Tile IR.
//!
//! A program of the grid is interpreted op by op, each op on a whole tile (a
//! flat vector and a shape): the program is walked once per program, never
//! once per element. Tiles are kept in one of three representations by dtype:
//! `f32` for f32, f16, bf16 and the f8 formats (computed in f32 and rounded to
//! the dtype after every op, as the device does), `f64` for f64 and `i64` for
//! every integer dtype and bool (wrapped to the dtype's width after every op).
//! `dot` multiplies in f32 (f64 for f64 tiles) with f32 accumulation, as on the
//! GPU; `precision="tf32"` rounds its f32 inputs to tf32 first. A load read
//! only by dots is left in tensor memory for the dot to pack from there
//! ([`deferred`], [`gemm`]); a K loop of such dots multiplies several
//! iterations at once ([`chain`]), and operands packed from memory that the
//! launch does not write are packed once and shared by its programs
//! ([`packed`]). None of these changes a bit of the result.
//!
//! Programs run in parallel on rayon's pool. Tensor memory is written through
//! raw pointers ([`Mem`]): stores of different programs to the same element race
//! as on the GPU (one of the values is kept), `atomic_add` is a real atomic
//! read-modify-write (compare-and-swap on the element's bits).

mod access;
mod chain;
mod deferred;
mod gemm;
mod liveness;
mod ops;
mod packed;
mod program;
#[cfg(test)]
mod tests;
mod tile;

use std::rc::Rc;
use std::sync::atomic::{
    AtomicI16, AtomicI32, AtomicI64, AtomicI8, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering,
};

use half::{bf16, f16};
use rayon::prelude::*;

use self::access::*;
use self::chain::{ChainedDot, ChainedLoops};
use self::deferred::DeferredLoads;
use self::gemm::{Part, Source, View};
use self::liveness::Liveness;
pub(crate) use self::ops::erf64;
use self::ops::*;
use self::packed::PackCache;
use self::program::*;
use self::tile::*;
use super::tensor::{decode_byte, encode_byte, float_to_i64, float_to_int, round_to, wrap_int};
use super::{ExecError, Interrupt, Tensor};
use crate::check::DType;
use crate::ir::tile::{
    Access, BinaryOp, Constant, Dim, Kernel, Op, OpKind, ParamKind, Precision, ReduceOp, Region,
    UnaryOp, Value,
};
use crate::target::MAX_GRID;

/// A launch argument, in the order of `Kernel::params`.
#[derive(Clone, Debug)]
pub enum Arg {
    Tensor(Tensor),
    Int(i64),
    Float(f64),
}

/// Tensor memory seen by the programs of one launch.
struct Mem {
    ptr: *mut u8,
    dtype: DType,
    dims: Vec<i64>,
    strides: Vec<i64>,
    /// No store or atomic of the kernel writes this memory, through this
    /// parameter or another one sharing it.
    read_only: bool,
}

// SAFETY: the pointer stays valid for the launch (the tensors are held by the
// caller) and addresses the product of `dims` elements (checked against the
// storage in `run_grid_with`); element races between programs are the
// kernel's, as on the GPU.
unsafe impl Send for Mem {}
unsafe impl Sync for Mem {}

enum Param {
    Mem(Mem),
    Scalar(Rc0),
}

/// A scalar parameter's value (the representation of its dtype).
#[derive(Clone, Copy)]
enum Rc0 {
    F(f32),
    D(f64),
    I(i64),
}

/// Runs every program of `grid` (x fastest) of `kernel` on `args`.
pub fn run_grid(
    kernel: &Kernel,
    args: &[Arg],
    grid: [i64; 3],
    interrupt: &Interrupt,
) -> Result<(), ExecError> {
    let deferred = DeferredLoads::of(kernel);
    let chained = ChainedLoops::of(kernel, &deferred);
    run_grid_with(kernel, args, grid, interrupt, &deferred, &chained)
}

/// [`run_grid`] with the loads that may be left to their dots and the loops
/// whose dots may be chained given.
fn run_grid_with(
    kernel: &Kernel,
    args: &[Arg],
    grid: [i64; 3],
    interrupt: &Interrupt,
    deferred: &DeferredLoads,
    chained: &ChainedLoops,
) -> Result<(), ExecError> {
    if args.len() != kernel.params.len() {
        return Err(ExecError::new(
            "E0707",
            format!(
                "kernel `{}` takes {} run-time arguments, {} given",
                kernel.name,
                kernel.params.len(),
                args.len()
            ),
        )
        .with_help("pass one argument for each tensor and scalar parameter of the kernel"));
    }
    let mut params = Vec::new();
    for (p, a) in kernel.params.iter().zip(args) {
        params.push(match (&p.kind, a) {
            (ParamKind::Tensor { dims, dtype }, Arg::Tensor(t)) => {
                if t.dtype() != *dtype {
                    return Err(ExecError::new(
                        "E0702",
                        format!(
                            "argument `{}` of `{}` must be {dtype}, got {}",
                            p.name,
                            kernel.name,
                            t.dtype()
                        ),
                    )
                    .with_help(format!("convert it with `.to({dtype})`")));
                }
                if dims.len() != t.shape().len() {
                    return Err(ExecError::new(
                        "E0701",
                        format!(
                            "argument `{}` of `{}` must have rank {}, got shape {:?}",
                            p.name,
                            kernel.name,
                            dims.len(),
                            t.shape()
                        ),
                    )
                    .with_help(
                        format!("pass a tensor of rank {}, e.g. `reshape(t, [...])`", dims.len()),
                    ));
                }
                for (axis, (d, &n)) in dims.iter().zip(t.shape()).enumerate() {
                    if let Dim::Static(s) = d {
                        if *s as usize != n {
                            return Err(ExecError::new(
                                "E0701",
                                format!(
                                    "argument `{}` of `{}`: dim {axis} must be {s}, got {n}",
                                    p.name, kernel.name
                                ),
                            )
                            .with_help(
                                format!("pass a tensor whose dim {axis} is {s}, or change the parameter's annotation"),
                            ));
                        }
                    }
                }
                // The invariant `Mem` relies on: the storage holds the
                // shape's element count (established by every `Tensor`
                // constructor; checked again here because the unsafe accesses
                // depend on it), so every stride and offset below fits an i64.
                let numel = super::tensor::checked_numel(t.shape(), t.dtype())?;
                if t.storage.data().len() != numel || numel > i64::MAX as usize {
                    return Err(super::tensor::too_large(t.shape(), t.dtype()));
                }
                let d: Vec<i64> = t.shape().iter().map(|&x| x as i64).collect();
                let mut st = vec![1i64; d.len()];
                for i in (0..d.len().saturating_sub(1)).rev() {
                    st[i] = st[i + 1] * d[i + 1];
                }
                Param::Mem(Mem {
                    ptr: t.storage.ptr(),
                    dtype: *dtype,
                    dims: d,
                    strides: st,
                    read_only: false,
                })
            }
            (ParamKind::Scalar(d), Arg::Int(i)) => Param::Scalar(scalar_of(*d, *i as f64, *i)),
            (ParamKind::Scalar(d), Arg::Float(x)) => {
                Param::Scalar(scalar_of(*d, *x, float_to_int(*d, *x)))
            }
            _ => {
                return Err(ExecError::new(
                    "E0707",
                    format!(
                        "argument `{}` of `{}` must be a {}",
                        p.name,
                        kernel.name,
                        if matches!(p.kind, ParamKind::Tensor { .. }) {
                            "tensor"
                        } else {
                            "scalar"
                        }
                    ),
                )
                .with_help(
                    "pass a tensor for a `Tensor[...]` parameter and one number for a scalar parameter",
                ))
            }
        });
    }
    check_grid(&kernel.name, grid)?;
    // A grid with a 0 dim is a launch of no programs (a tensor of 0
    // elements: `cdiv(0, BLOCK)`), which does nothing, as in Triton.
    if grid.contains(&0) {
        return Ok(());
    }
    mark_read_only(kernel, &mut params);
    // A device copy of what this launch writes is stale from here on.
    for i in kernel.written_params() {
        if let Some(Arg::Tensor(t)) = args.get(i) {
            t.storage.host_written();
        }
    }
    // At most (2^31 - 1) * 65535 * 65535 < 2^63 after `check_grid`.
    let total = grid[0] * grid[1] * grid[2];
    let params = &params;
    let live = &Liveness::of(kernel);
    let cache = &PackCache::new();
    (0..total).into_par_iter().try_for_each(|p| {
        interrupt.check()?;
        let pid = [
            p % grid[0],
            (p / grid[0]) % grid[1],
            p / (grid[0] * grid[1]),
        ];
        let mut prog = Program {
            k: kernel,
            params,
            pid,
            grid,
            vals: vec![None; kernel.types.len()],
            views: vec![None; kernel.types.len()],
            interrupt,
            live,
            deferred,
            chained,
            in_chained_loop: false,
            cache,
        };
        prog.region(&kernel.body, None).map(|_| ())
    })
}

/// Every grid dim non-negative (a 0 dim launches nothing) and within CUDA's
/// limits (`MAX_GRID`), as the device would launch it: E0703 otherwise.
pub(crate) fn check_grid(kernel: &str, grid: [i64; 3]) -> Result<(), ExecError> {
    for (axis, g) in grid.iter().enumerate() {
        if *g < 0 {
            return Err(ExecError::new(
                "E0703",
                format!("grid dim {axis} of `{kernel}` is {g}; grid dims must not be negative"),
            )
            .with_help("a grid dim counts programs: check how it is computed"));
        }
        let max = MAX_GRID[axis];
        if *g > max {
            return Err(ExecError::new(
                "E0703",
                format!(
                    "grid dim {axis} of `{kernel}` is {g}, more than the {max} a launch may have"
                ),
            )
            .with_help(
                "grids are at most (2147483647, 65535, 65535) programs (CUDA's limits): use bigger blocks, or loop inside the kernel",
            ));
        }
    }
    Ok(())
}

/// Marks the tensor parameters whose memory no store or atomic of `kernel`
/// writes: not written through the parameter itself, nor through another
/// one whose tensor shares its memory.
fn mark_read_only(kernel: &Kernel, params: &mut [Param]) {
    let w = kernel.written_params();
    let span = |m: &Mem| {
        let len: i64 = m.dims.iter().product();
        let start = m.ptr as usize;
        (start, start + len as usize * m.dtype.bytes() as usize)
    };
    let written_spans: Vec<(usize, usize)> = w
        .iter()
        .filter_map(|&i| match &params[i] {
            Param::Mem(m) => Some(span(m)),
            Param::Scalar(_) => None,
        })
        .collect();
    for (i, p) in params.iter_mut().enumerate() {
        if let Param::Mem(m) = p {
            let (lo, hi) = span(m);
            m.read_only = !w.contains(&i) && written_spans.iter().all(|&(a, b)| hi <= a || b <= lo);
        }
    }
}

fn scalar_of(d: DType, x: f64, i: i64) -> Rc0 {
    match repr(d) {
        Repr::F => Rc0::F(round_to(d, x) as f32),
        Repr::D => Rc0::D(x),
        Repr::I => Rc0::I(if d == DType::Bool {
            (i != 0 || x != 0.0) as i64
        } else {
            wrap_int(d, i)
        }),
    }
}
