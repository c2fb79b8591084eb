//! Generated kernels of the launch plan, built directly as Tile IR: fused
//! elementwise groups (flat `[R, C]` and every-axis variants), copies, transposes,
//! reductions, softmax, layer/RMS norms and batched gemms.
//!
//! The kernel builder, the fusion group and the helpers shared by several
//! kernels are here; each kind of kernel has its file (each an `impl Lower`
//! block whose entry point the launch plan calls):
//!
//! | file | holds |
//! |------|-------|
//! | `fused.rs` | a fused elementwise group over the flat `[R, C]` view |
//! | `fused_nd.rs` | a fused group indexing every axis (leading-axis broadcasts) |
//! | `copy.rs` | transposes of the last two axes, gather copies (permutations, subscripts) |
//! | `reduce.rs` | reductions over any axis or all of them |
//! | `softmax.rs` | softmax over any axis and float dtype |
//! | `norm.rs` | layer and RMS norms the std.nn row kernels do not cover |
//! | `matmul.rs` | gemms the std.linalg gemms do not cover |
//!
//! A kernel's entry point is `pub(in crate::ir::schedule)`, since the plan in
//! the parent module calls it; another method or item is `pub(super)` only where
//! a sibling file uses it.

mod copy;
mod fused;
mod fused_nd;
mod matmul;
mod norm;
mod reduce;
mod softmax;

use super::{constant_of, zero_of, ScalarExpr};
use crate::check::DType;
use crate::ir::graph::{NodeId, ReduceKind};
use crate::ir::tile::{self, BinaryOp, Constant, Op, OpKind, Type, UnaryOp, Value};
use crate::syntax::span::Span;

/// The body of a generated loop over K: (builder, induction variable, the loaded
/// tile in f32, carried values) -> the values to carry on.
type LoopBody<'a> = dyn FnMut(&mut KernelBuilder, Value, Value, &[Value]) -> Vec<Value> + 'a;

/// Builds one generated kernel in Tile IR.
struct KernelBuilder {
    ops: Vec<Op>,
    types: Vec<Type>,
    params: Vec<tile::Param>,
    span: Span,
}

impl KernelBuilder {
    fn emit(&mut self, kind: OpKind, ty: Type) -> Value {
        let v = Value(self.types.len() as u32);
        self.types.push(ty);
        self.ops.push(Op {
            results: vec![v],
            kind,
            span: self.span,
        });
        v
    }

    fn ty(&self, v: Value) -> &Type {
        &self.types[v.0 as usize]
    }

    /// A value defined by no op (a region argument, or a result pushed by hand).
    fn fresh(&mut self, ty: Type) -> Value {
        let v = Value(self.types.len() as u32);
        self.types.push(ty);
        v
    }

    fn cnst(&mut self, c: Constant, dtype: DType) -> Value {
        self.emit(OpKind::Const(constant_of(dtype, &c)), Type::Scalar(dtype))
    }

    fn tile_ty(shape: &[u32], dtype: DType) -> Type {
        Type::Tile {
            shape: shape.to_vec(),
            dtype,
        }
    }

    fn cast(&mut self, x: Value, to: DType) -> Value {
        let t = self.ty(x).clone();
        if t.dtype() == to {
            return x;
        }
        let ty = match t {
            Type::Scalar(_) => Type::Scalar(to),
            Type::Tile { shape, .. } => Type::Tile { shape, dtype: to },
        };
        self.emit(OpKind::Cast { x, to }, ty)
    }

    fn splat(&mut self, x: Value, shape: &[u32]) -> Value {
        let dt = self.ty(x).dtype();
        self.emit(
            OpKind::Splat {
                x,
                shape: shape.to_vec(),
            },
            Self::tile_ty(shape, dt),
        )
    }

    fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        let t = self.ty(a).clone();
        let ty = if op.is_comparison() {
            match t {
                Type::Scalar(_) => Type::Scalar(DType::Bool),
                Type::Tile { .. } => Self::tile_ty(t.shape(), DType::Bool),
            }
        } else {
            t
        };
        self.emit(OpKind::Binary { op, a, b }, ty)
    }

    fn unary(&mut self, op: UnaryOp, x: Value) -> Value {
        let t = self.ty(x).clone();
        self.emit(OpKind::Unary { op, x }, t)
    }
}

pub(super) struct Group {
    pub(super) members: Vec<NodeId>,
    pub(super) root: NodeId,
    /// The root is a leaf (a copy kernel: load, cast, store).
    pub(super) copy: bool,
}

/// A softmax or norm axis of at most this many elements (times the columns a
/// program handles) is one register tile: loaded once, kept through the
/// statistics and the normalised store, its weights loaded before the first
/// reduction so that their latency overlaps the row's. (At 4096 bf16 a row
/// over 8 warps this ran at 0.86-0.88 of a device copy on an H100, against
/// 0.65-0.83 for a loop over 1024-wide chunks re-reading the row.)
const ROW_TILE: i64 = 8192;

/// A longer axis is walked in chunks by programs of this many warps, each
/// thread keeping its own partial statistics (no block-wide reduction inside
/// the loop), in two passes: the statistics, then the normalised values. One
/// program per SM keeps the rows in flight small enough for L2 to serve the
/// second pass: at 4096 x 65536 bf16 on an H100, two programs of 16 warps
/// (or four of 8) an SM ran at 0.67-0.73 of a device copy against 0.93-0.96
/// for one of 32 (split rows, below).
const LONG_WARPS: u32 = 32;

/// How an axis that is not split (its length unknown, or not a multiple of
/// `PIECE`) is walked by a kernel whose statistics loop carries `carried` f32
/// tiles: (elements a chunk, whether its loops prefetch; see `chunk_loop`),
/// under the 64 registers a thread of 1024 may have. One carried tile (RMS
/// norm's sum of squares) leaves room for 16 elements a thread and a
/// prefetched chunk; two (softmax's running max and sum) for 16 without one;
/// three (Welford's mean, M2 and count) for 8. Measured at 4096 x 65536 bf16
/// on an H100, in fractions of a device copy: RMS norm 0.68 without
/// prefetching, 0.91 with; softmax 0.81 without, 0.75 prefetching at 8 a
/// thread, 0.70 prefetching only its normalising pass; layer norm 0.75
/// either way. A chunk of 4-byte elements as stored takes twice the
/// registers of a bf16 one, so a thread takes half as many (16 f32 elements
/// and softmax's two carried tiles spilled at 64 registers).
fn long_plan(carried: usize, stored: DType) -> (i64, bool) {
    let threads = LONG_WARPS as i64 * 32;
    let (elems, prefetch) = match carried {
        0 | 1 => (16, true),
        2 => (16, false),
        _ => (8, false),
    };
    let elems = if stored.bytes() >= 4 {
        elems / 2
    } else {
        elems
    };
    (threads * elems, prefetch)
}

/// A long last axis whose length is a known multiple of `PIECE` is viewed as
/// `[K / PIECE, PIECE]` and walked in `[T, PIECE]` chunks: each thread holds
/// whole pieces and reduces them first (in registers, then one shuffle), so
/// the statistics are per piece rather than per element: softmax takes one
/// `exp` an element instead of two, layer norm a piece's mean and M2 instead
/// of a Welford step an element, and the carried state is a few registers.
const PIECE: i64 = 16;

/// `K / PIECE` for a known `K` that `PIECE` divides.
fn split_len(k: &crate::check::dims::Dim) -> Option<i64> {
    k.as_const()
        .filter(|k| *k > 0 && k % PIECE == 0)
        .map(|k| k / PIECE)
}

/// Pieces a chunk and whether the loop prefetches, for a split row's
/// statistics pass and for its normalising pass, which also loads `weights`
/// vectors. The normalising pass takes 16 elements a thread, prefetching
/// where it loads weights, within the 64 registers a thread of 1024 may have
/// (32 with weights spilled there); the statistics pass 16 too, 32 for layer
/// norm (two weights). The normalising pass's loads and the stores stream
/// (`ir::tile::streaming`), so the row stays in L2 between the passes.
/// Measured at 4096 x 65536 bf16, in fractions of a device copy: on an H100,
/// before the streaming hints and at 32 a thread in every pass without
/// weights, softmax 0.943, layer norm 0.932, RMS norm 0.960 (16 a thread
/// and prefetching in both passes: 0.897, 0.891, 0.940); on an H200 that way
/// 0.814, 0.804 and 0.87; with the hints and 16 a thread 0.92, 0.686 and
/// 0.921, layer norm at 32 in its statistics pass 0.796.
fn split_passes(weights: usize) -> [(u32, bool); 2] {
    let pieces = |elems: i64| (LONG_WARPS as i64 * 32 * elems / PIECE) as u32;
    let second = if weights > 0 {
        (pieces(16), true)
    } else {
        (pieces(16), false)
    };
    let first = if weights > 1 { pieces(32) } else { pieces(16) };
    [(first, false), second]
}

/// A loop from `lo` to `hi` in `step`-wide chunks whose body gets each chunk
/// in f32: `body(kb, iv, chunk, carried) -> yielded`; returns the carried
/// values after the loop. `load(kb, start)` loads a chunk as stored and
/// `widen` converts it. With `prefetch`, each iteration first issues the next
/// chunk's load (past the end it is masked off) and carries it, as stored, to
/// the next iteration: two chunks in flight a thread instead of one, at the
/// cost of a chunk's registers.
fn chunk_loop(
    kb: &mut KernelBuilder,
    (lo, hi, step): (Value, Value, Value),
    (load, widen, prefetch): (&ChunkLoad<'_>, &ChunkLoad<'_>, bool),
    init: Vec<Value>,
    body: &mut LoopBody<'_>,
) -> Vec<Value> {
    let first = prefetch.then(|| load(kb, lo));
    let iv = kb.fresh(Type::Scalar(DType::I32));
    let mut region_args = vec![iv];
    let mut all_init = Vec::new();
    if let Some(first) = first {
        let t = kb.ty(first).clone();
        region_args.push(kb.fresh(t));
        all_init.push(first);
    }
    all_init.extend(init);
    for v in all_init.clone() {
        if Some(v) != first {
            let t = kb.ty(v).clone();
            region_args.push(kb.fresh(t));
        }
    }
    let outer = std::mem::take(&mut kb.ops);
    let mut yielded = Vec::new();
    let (raw, args) = if prefetch {
        let next_at = kb.binary(BinaryOp::Add, iv, step);
        yielded.push(load(kb, next_at));
        (region_args[1], &region_args[2..])
    } else {
        (load(kb, iv), &region_args[1..])
    };
    let chunk = widen(kb, raw);
    let args = args.to_vec();
    yielded.extend(body(kb, iv, chunk, &args));
    kb.ops.push(Op {
        results: vec![],
        kind: OpKind::Yield(yielded),
        span: kb.span,
    });
    let body_ops = std::mem::replace(&mut kb.ops, outer);
    let mut results = Vec::new();
    for v in &all_init {
        let t = kb.ty(*v).clone();
        results.push(kb.fresh(t));
    }
    kb.ops.push(Op {
        results: results.clone(),
        kind: OpKind::For {
            lo,
            hi,
            step,
            init: all_init,
            body: tile::Region {
                args: region_args,
                ops: body_ops,
            },
        },
        span: kb.span,
    });
    results.split_off(usize::from(prefetch))
}

/// A chunk loader or converter of `chunk_loop`.
type ChunkLoad<'a> = dyn Fn(&mut KernelBuilder, Value) -> Value + 'a;

/// Warps for a row kernel whose tile has `elems` elements: 16 a thread, so
/// that each thread's part of a bf16 row is whole 16-byte vectors; at least
/// two, since an SM runs at most 32 programs and short rows need them all.
fn row_warps(elems: i64) -> u32 {
    (elems / 512).clamp(2, 32) as u32
}

fn next_pow2(x: i64) -> i64 {
    let mut p = 1;
    while p < x && p < (1 << 20) {
        p *= 2;
    }
    p
}

/// Where one axis of a gather copy's source comes from.
pub(super) enum SrcAxis {
    /// Out axis `k`, shifted by `offset` (an integer host scalar; when `wrap`, a
    /// negative offset counts from the end of the source axis).
    Out {
        k: usize,
        offset: ScalarExpr,
        wrap: bool,
    },
    /// One index (an integer host scalar, negative counts from the end).
    Fixed(ScalarExpr),
}

/// The accumulator dtype of a matmul producing `dt`: f64 for f64, f32 for
/// other floats, the integer's own width for integers (at least i32), i32
/// for bool.
pub(super) fn acc_dtype(dt: DType) -> DType {
    match dt {
        DType::F64 => DType::F64,
        DType::I64 => DType::I64,
        DType::U32 => DType::U32,
        d if d.is_int() || d == DType::Bool => DType::I32,
        _ => DType::F32,
    }
}

/// The identity of a reduction, as a constant of `dtype`.
fn neutral(op: ReduceKind, dtype: DType) -> Constant {
    let (lo, hi): (i64, i64) = match dtype {
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::I16 => (i16::MIN as i64, i16::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::I64 => (i64::MIN, i64::MAX),
        DType::U8 => (0, u8::MAX as i64),
        DType::U32 => (0, u32::MAX as i64),
        _ => (0, 1),
    };
    match (op, dtype) {
        (ReduceKind::Sum | ReduceKind::Mean, d) => zero_of(d),
        (ReduceKind::Max, DType::Bool) => Constant::Bool(false),
        (ReduceKind::Min, DType::Bool) => Constant::Bool(true),
        (ReduceKind::Max, d) if d.is_float() => Constant::Float(f64::NEG_INFINITY),
        (ReduceKind::Min, d) if d.is_float() => Constant::Float(f64::INFINITY),
        (ReduceKind::Max, _) => Constant::Int(lo),
        (ReduceKind::Min, _) => Constant::Int(hi),
    }
}
