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

mod chain;
mod deferred;
mod gemm;
mod liveness;
mod packed;

use std::rc::Rc;
use std::sync::atomic::{
    AtomicI16, AtomicI32, AtomicI64, AtomicI8, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering,
};

use half::{bf16, f16};
use rayon::prelude::*;

use self::chain::{ChainedDot, ChainedLoops};
use self::deferred::DeferredLoads;
use self::gemm::{Part, Source, View};
use self::liveness::Liveness;
use self::packed::PackCache;
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
        ));
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
    fn written(r: &Region, out: &mut Vec<usize>) {
        for op in &r.ops {
            if let OpKind::Store { tensor, .. } | OpKind::AtomicAdd { tensor, .. } = &op.kind {
                out.push(*tensor);
            }
            for nested in op.kind.regions() {
                written(nested, out);
            }
        }
    }
    let mut w = Vec::new();
    written(&kernel.body, &mut w);
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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Repr {
    F,
    D,
    I,
}

fn repr(d: DType) -> Repr {
    if d == DType::F64 {
        Repr::D
    } else if d.is_float() {
        Repr::F
    } else {
        Repr::I
    }
}

#[derive(Clone, Debug)]
enum Buf {
    F(Vec<f32>),
    D(Vec<f64>),
    I(Vec<i64>),
}

impl Buf {
    fn len(&self) -> usize {
        match self {
            Buf::F(v) => v.len(),
            Buf::D(v) => v.len(),
            Buf::I(v) => v.len(),
        }
    }

    fn filled(r: Repr, n: usize, c: Constant) -> Buf {
        let (x, i) = match c {
            Constant::Int(i) => (i as f64, i),
            Constant::Float(x) => (x, float_to_i64(x)),
            Constant::Bool(b) => (b as i64 as f64, b as i64),
        };
        match r {
            Repr::F => Buf::F(vec![x as f32; n]),
            Repr::D => Buf::D(vec![x; n]),
            Repr::I => Buf::I(vec![i; n]),
        }
    }

    /// A one-element buffer repeated `n` times.
    fn repeat(&self, n: usize) -> Buf {
        match self {
            Buf::F(v) => Buf::F(vec![v[0]; n]),
            Buf::D(v) => Buf::D(vec![v[0]; n]),
            Buf::I(v) => Buf::I(vec![v[0]; n]),
        }
    }

    fn f(&self) -> &[f32] {
        match self {
            Buf::F(v) => v,
            _ => unreachable!("an f32 tile"),
        }
    }

    fn i(&self) -> &[i64] {
        match self {
            Buf::I(v) => v,
            _ => unreachable!("an integer tile"),
        }
    }

    /// Element `i` as f64 (scalars: loop bounds, conditions).
    fn get(&self, i: usize) -> f64 {
        match self {
            Buf::F(v) => v[i] as f64,
            Buf::D(v) => v[i],
            Buf::I(v) => v[i] as f64,
        }
    }

    fn get_i(&self, i: usize) -> i64 {
        match self {
            Buf::F(v) => v[i] as i64,
            Buf::D(v) => v[i] as i64,
            Buf::I(v) => v[i],
        }
    }

    /// Elements picked by `idx` (gathers for broadcasts and transposes).
    fn gather(&self, idx: &[usize]) -> Buf {
        match self {
            Buf::F(v) => Buf::F(idx.iter().map(|&i| v[i]).collect()),
            Buf::D(v) => Buf::D(idx.iter().map(|&i| v[i]).collect()),
            Buf::I(v) => Buf::I(idx.iter().map(|&i| v[i]).collect()),
        }
    }
}

#[derive(Clone, Debug)]
struct Tile {
    shape: Vec<usize>,
    buf: Buf,
    /// Lanes computed from an integer division by zero (see [`Program::poison`]).
    poison: Option<Vec<bool>>,
}

type T = Rc<Tile>;

fn scalar_tile(buf: Buf) -> T {
    Rc::new(Tile {
        shape: Vec::new(),
        buf,
        poison: None,
    })
}

/// Rounds every element of an f32-represented tile to `d` (f16, bf16, f8).
fn round_f32s(d: DType, v: &mut [f32]) {
    match d {
        DType::F16 => v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        DType::BF16 => v.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
        DType::F8E4M3 | DType::F8E5M2 => v
            .iter_mut()
            .for_each(|x| *x = round_to(d, *x as f64) as f32),
        _ => {}
    }
}

fn wrap_ints(d: DType, v: &mut [i64]) {
    if d != DType::I64 {
        v.iter_mut().for_each(|x| *x = wrap_int(d, *x));
    }
}

/// Fixes a freshly computed buffer up to dtype `d`.
fn normalise(d: DType, mut b: Buf) -> Buf {
    match &mut b {
        Buf::F(v) => round_f32s(d, v),
        Buf::I(v) => wrap_ints(d, v),
        Buf::D(_) => {}
    }
    b
}

fn div_by_zero() -> ExecError {
    ExecError::new("E0704", "integer division by zero").with_help(
        "an integer `//` or `%` had a zero divisor; guard it with `where(d != 0, ...)` or use floats",
    )
}

struct Program<'a> {
    k: &'a Kernel,
    params: &'a [Param],
    pid: [i64; 3],
    grid: [i64; 3],
    vals: Vec<Option<T>>,
    /// Per value, the tensor memory of a load left to its dots; the value
    /// itself is then a tile of the right shape with no elements.
    views: Vec<Option<View>>,
    interrupt: &'a Interrupt,
    live: &'a Liveness,
    deferred: &'a DeferredLoads,
    chained: &'a ChainedLoops,
    /// Inside a chained loop: its loads are packed a chain at a time, long
    /// after they run, so prefetching for the next load is of no use.
    in_chained_loop: bool,
    /// The launch's packed dot operands.
    cache: &'a PackCache,
}

/// The dots of a chained loop not multiplied yet (see [`chain`]).
struct Pending {
    parts: Vec<(View, View, usize)>,
    /// The summed `k` of `parts`.
    k: usize,
    mn: (usize, usize),
    tf32: bool,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            parts: Vec::new(),
            k: 0,
            mn: (0, 0),
            tf32: false,
        }
    }

    fn is_full(&self) -> bool {
        gemm::chain_is_full(self.mn.0, self.k, self.mn.1)
    }

    /// Multiplies the pending dots into `acc` (an f32 tile, copied first if
    /// it is shared).
    fn multiply(&mut self, acc: &mut T, cache: &PackCache) {
        if self.parts.is_empty() {
            return;
        }
        let parts: Vec<Part> = self
            .parts
            .iter()
            .map(|&(a, b, k)| Part {
                a: Source::Mem(a),
                b: Source::Mem(b),
                k,
            })
            .collect();
        let Buf::F(c) = &mut Rc::make_mut(acc).buf else {
            unreachable!("a chained dot accumulates in f32")
        };
        gemm::sdot_chain(&parts, c, self.mn, self.tf32, Some(cache));
        self.parts.clear();
        self.k = 0;
    }
}

impl Program<'_> {
    /// Integer division by zero: as on the GPU the lane's value is garbage
    /// (0 here), and lowering divides in masked-off lanes too (loads fill them
    /// with `other=0`). So the lane is marked poisoned and the marks follow the
    /// data; E0704 is raised only when a poisoned lane is stored (in bounds and
    /// unmasked), decides control flow or addresses memory.
    fn poison(&self, op: &Op, out: &mut [T]) -> Result<(), ExecError> {
        // A value taken by its op (a dying `dot` accumulator) carried its
        // marks over itself.
        let pz = |v: Value| {
            self.vals[v.0 as usize]
                .as_ref()
                .and_then(|t| t.poison.as_ref())
        };
        let any = |v: Value| pz(v).is_some_and(|p| p.iter().any(|b| *b));
        let lanes = |v: Value| -> Option<Vec<bool>> { pz(v).cloned() };
        let or = |a: Option<Vec<bool>>, b: Option<Vec<bool>>| match (a, b) {
            (Some(a), Some(b)) => Some(a.iter().zip(&b).map(|(x, y)| *x || *y).collect()),
            (a, None) => a,
            (None, b) => b,
        };
        let set = |out: &mut [T], p: Option<Vec<bool>>| {
            if let Some(p) = p.filter(|p| p.iter().any(|b| *b)) {
                if let Some(t) = out.first_mut() {
                    Rc::make_mut(t).poison = Some(p);
                }
            }
        };
        let all = |out: &mut [T]| {
            for t in out.iter_mut() {
                let n = t.buf.len();
                Rc::make_mut(t).poison = Some(vec![true; n]);
            }
        };
        match &op.kind {
            OpKind::Unary { x, .. } | OpKind::Cast { x, .. } | OpKind::ExpandDims { x, .. } => {
                set(out, lanes(*x))
            }
            OpKind::Binary { a, b, .. } => {
                let own = out[0].poison.clone();
                set(out, or(own, or(lanes(*a), lanes(*b))))
            }
            OpKind::Select { cond, a, b }
                if pz(*cond).is_some() || pz(*a).is_some() || pz(*b).is_some() =>
            {
                let c = self.v(*cond).buf.i();
                let n = c.len();
                let get = |v: Value, i: usize| pz(v).is_some_and(|p| p[i]);
                let p = (0..n)
                    .map(|i| get(*cond, i) || if c[i] != 0 { get(*a, i) } else { get(*b, i) })
                    .collect();
                set(out, Some(p));
            }
            OpKind::Extract {
                x,
                axis,
                start,
                len,
                ..
            } if any(*x) => {
                let src = self.v(*x);
                let idx = extract_index(&src.shape, *axis, *start as usize, *len as usize);
                let p = src.poison.as_ref().expect("poisoned");
                set(out, Some(idx.iter().map(|&i| p[i]).collect()))
            }
            OpKind::Broadcast { x, .. } | OpKind::Transpose { x } if any(*x) => {
                // The same rearrangement applied to the marks.
                let src = self.v(*x);
                let marks = Tile {
                    shape: src.shape.clone(),
                    buf: Buf::I(
                        src.poison
                            .as_ref()
                            .unwrap()
                            .iter()
                            .map(|b| *b as i64)
                            .collect(),
                    ),
                    poison: None,
                };
                let moved = match &op.kind {
                    OpKind::Broadcast { shape, .. } => {
                        broadcast(
                            &marks,
                            &shape.iter().map(|&s| s as usize).collect::<Vec<_>>(),
                        )
                        .buf
                    }
                    _ => {
                        let (r, c) = (src.shape[0], src.shape[1]);
                        let idx: Vec<usize> = (0..c)
                            .flat_map(|j| (0..r).map(move |i| i * c + j))
                            .collect();
                        marks.buf.gather(&idx)
                    }
                };
                set(out, Some(moved.i().iter().map(|v| *v != 0).collect()))
            }
            OpKind::Splat { x, .. } | OpKind::Reduce { x, .. } if any(*x) => all(out),
            OpKind::Dot { a, b, acc, .. } if any(*a) || any(*b) || acc.is_some_and(any) => all(out),
            OpKind::Load { access, mask, .. } => {
                if access_poisoned(access, &any) {
                    return Err(div_by_zero());
                }
                if let Some(m) = mask {
                    set(out, lanes(*m))
                }
            }
            OpKind::Store { access, mask, .. } | OpKind::AtomicAdd { access, mask, .. }
                if access_poisoned(access, &any) || mask.is_some_and(any) =>
            {
                return Err(div_by_zero());
            }
            OpKind::Arange { start: v, .. } | OpKind::If { cond: v, .. } if any(*v) => {
                return Err(div_by_zero())
            }
            OpKind::For { lo, hi, step, .. } if any(*lo) || any(*hi) || any(*step) => {
                return Err(div_by_zero())
            }
            _ => {}
        }
        Ok(())
    }

    fn v(&self, v: Value) -> &T {
        self.vals[v.0 as usize]
            .as_ref()
            .expect("Tile IR: a value used before its definition")
    }

    fn dtype(&self, v: Value) -> DType {
        self.k.ty(v).dtype()
    }

    /// Runs the ops of `r`; in the body of a chained loop, its dot joins
    /// `chain` instead of running.
    fn region(
        &mut self,
        r: &Region,
        mut chain: Option<(ChainedDot, &mut Pending)>,
    ) -> Result<Vec<T>, ExecError> {
        for (i, op) in r.ops.iter().enumerate() {
            if let OpKind::Yield(vs) = &op.kind {
                let out = vs.iter().map(|v| self.v(*v).clone()).collect();
                self.drop_dead(op);
                return Ok(out);
            }
            let mut out = match &mut chain {
                Some((c, pending)) if c.dot == i => {
                    self.chained_dot(op, r.args[1 + c.carried], pending)?
                }
                _ => self.op(op)?,
            };
            self.poison(op, &mut out)?;
            for (res, t) in op.results.iter().zip(out) {
                self.vals[res.0 as usize] = Some(t);
            }
            self.drop_dead(op);
        }
        Ok(Vec::new())
    }

    /// Forgets the values `op` read for the last time (their buffers are
    /// freed, or reused by whoever holds the only other reference).
    fn drop_dead(&mut self, op: &Op) {
        for v in self.live.dying(op) {
            self.vals[v.0 as usize] = None;
        }
    }

    fn run_region(&mut self, r: &Region, args: Vec<T>) -> Result<Vec<T>, ExecError> {
        self.run_region_chained(r, args, None)
    }

    fn run_region_chained(
        &mut self,
        r: &Region,
        args: Vec<T>,
        chain: Option<(ChainedDot, &mut Pending)>,
    ) -> Result<Vec<T>, ExecError> {
        for (a, x) in r.args.iter().zip(args) {
            self.vals[a.0 as usize] = Some(x);
        }
        self.region(r, chain)
    }

    /// The dot of a chained loop: when both operands were left as views and
    /// nothing is poisoned, it joins `pending` and its result is the
    /// accumulator as it stands (read by nothing but the yield, and
    /// multiplied into when the chain is); otherwise the chain is multiplied
    /// and the dot runs.
    fn chained_dot(
        &mut self,
        op: &Op,
        acc: Value,
        pending: &mut Pending,
    ) -> Result<Vec<T>, ExecError> {
        let OpKind::Dot {
            a, b, precision, ..
        } = &op.kind
        else {
            unreachable!("a chained loop's dot")
        };
        let (x, y, c) = (self.v(*a), self.v(*b), self.v(acc));
        let clean = x.poison.is_none() && y.poison.is_none() && c.poison.is_none();
        if let (Some(va), Some(vb), true) =
            (self.views[a.0 as usize], self.views[b.0 as usize], clean)
        {
            let k = x.shape[1];
            pending.mn = (x.shape[0], y.shape[1]);
            pending.tf32 = *precision == Precision::Tf32;
            pending.parts.push((va, vb, k));
            pending.k += k;
            return Ok(vec![c.clone()]);
        }
        let slot = &mut self.vals[acc.0 as usize];
        let mut t = slot
            .take()
            .expect("Tile IR: a value used before its definition");
        pending.multiply(&mut t, self.cache);
        *slot = Some(t);
        self.op(op)
    }

    fn mem(&self, i: usize) -> &Mem {
        match &self.params[i] {
            Param::Mem(m) => m,
            Param::Scalar(_) => unreachable!("Tile IR: a scalar parameter used as a tensor"),
        }
    }

    fn op(&mut self, op: &Op) -> Result<Vec<T>, ExecError> {
        let k = self.k;
        let rd = |i: usize| k.ty(op.results[i]).dtype();
        let one = |t: Tile| Ok(vec![Rc::new(t)]);
        match &op.kind {
            OpKind::Const(c) => {
                let d = rd(0);
                let b = normalise(d, Buf::filled(repr(d), 1, *c));
                Ok(vec![scalar_tile(b)])
            }
            OpKind::ProgramId(a) => Ok(vec![scalar_tile(Buf::I(vec![self.pid[*a as usize]]))]),
            OpKind::NumPrograms(a) => Ok(vec![scalar_tile(Buf::I(vec![self.grid[*a as usize]]))]),
            OpKind::TensorDim { param, axis } => Ok(vec![scalar_tile(Buf::I(vec![
                self.mem(*param).dims[*axis],
            ]))]),
            OpKind::ScalarParam(i) => {
                let b = match &self.params[*i] {
                    Param::Scalar(Rc0::F(x)) => Buf::F(vec![*x]),
                    Param::Scalar(Rc0::D(x)) => Buf::D(vec![*x]),
                    Param::Scalar(Rc0::I(x)) => Buf::I(vec![*x]),
                    Param::Mem(_) => unreachable!("Tile IR: a tensor parameter used as a scalar"),
                };
                Ok(vec![scalar_tile(b)])
            }
            OpKind::Unary { op: u, x } => {
                let a = self.v(*x);
                let d = rd(0);
                let b = unary(*u, d, &a.buf);
                one(Tile {
                    shape: a.shape.clone(),
                    buf: b,
                    poison: None,
                })
            }
            OpKind::Binary { op: bop, a, b } => {
                let (x, y) = (self.v(*a), self.v(*b));

                let (buf, poison) = binary(*bop, rd(0), &x.buf, &y.buf);
                one(Tile {
                    shape: x.shape.clone(),
                    buf,
                    poison,
                })
            }
            OpKind::Select { cond, a, b } => {
                let (c, x, y) = (self.v(*cond), self.v(*a), self.v(*b));
                let c = c.buf.i();
                let buf = match (&x.buf, &y.buf) {
                    (Buf::F(p), Buf::F(q)) => Buf::F(select(c, p, q)),
                    (Buf::D(p), Buf::D(q)) => Buf::D(select(c, p, q)),
                    (Buf::I(p), Buf::I(q)) => Buf::I(select(c, p, q)),
                    _ => unreachable!("Tile IR: select operands of one type"),
                };
                one(Tile {
                    shape: x.shape.clone(),
                    buf,
                    poison: None,
                })
            }
            OpKind::Cast { x, to } => {
                let a = self.v(*x);
                let buf = cast(&a.buf, *to);
                one(Tile {
                    shape: a.shape.clone(),
                    buf,
                    poison: None,
                })
            }
            OpKind::Splat { x, shape } => {
                let a = self.v(*x);
                let n: usize = shape.iter().map(|&s| s as usize).product();
                let buf = match &a.buf {
                    Buf::F(v) => Buf::F(vec![v[0]; n]),
                    Buf::D(v) => Buf::D(vec![v[0]; n]),
                    Buf::I(v) => Buf::I(vec![v[0]; n]),
                };
                one(Tile {
                    shape: shape.iter().map(|&s| s as usize).collect(),
                    buf,
                    poison: None,
                })
            }
            OpKind::Broadcast { x, shape } => {
                let a = self.v(*x);
                let to: Vec<usize> = shape.iter().map(|&s| s as usize).collect();
                one(broadcast(a, &to))
            }
            OpKind::ExpandDims { x, axis } => {
                let a = self.v(*x);
                let mut shape = a.shape.clone();
                shape.insert(*axis, 1);
                one(Tile {
                    shape,
                    buf: a.buf.clone(),
                    poison: None,
                })
            }
            OpKind::Transpose { x } => {
                let a = self.v(*x);
                let (r, c) = (a.shape[0], a.shape[1]);
                let mut idx = Vec::with_capacity(r * c);
                for j in 0..c {
                    for i in 0..r {
                        idx.push(i * c + j);
                    }
                }
                one(Tile {
                    shape: vec![c, r],
                    buf: a.buf.gather(&idx),
                    poison: None,
                })
            }
            OpKind::Extract {
                x,
                axis,
                start,
                len,
                drop,
            } => {
                let a = self.v(*x);
                let idx = extract_index(&a.shape, *axis, *start as usize, *len as usize);
                let mut shape = a.shape.clone();
                if *drop {
                    shape.remove(*axis);
                } else {
                    shape[*axis] = *len as usize;
                }
                one(Tile {
                    shape,
                    buf: a.buf.gather(&idx),
                    poison: None,
                })
            }
            OpKind::Arange { start, len } => {
                let s = self.v(*start).buf.get_i(0);
                let mut v: Vec<i64> = (0..*len as i64).map(|i| s + i).collect();
                wrap_ints(rd(0), &mut v);
                one(Tile {
                    shape: vec![*len as usize],
                    buf: Buf::I(v),
                    poison: None,
                })
            }
            OpKind::Load {
                tensor,
                access,
                mask,
                other,
            } => {
                let d = rd(0);
                let placed = self.access(*tensor, access);
                let shape = placed.shape().to_vec();
                let res = op.results[0].0 as usize;
                let last = self.views[res].take();
                if let (true, Placed::Window { starts, .. }) = (self.deferred.contains(op), &placed)
                {
                    if let Some(view) =
                        self.deferred_load(*tensor, d, &shape, starts, *mask, *other)
                    {
                        if let Some(last) = last.filter(|l| l.off != view.off) {
                            if !self.in_chained_loop {
                                view.prefetch_moved(view.off - last.off);
                            }
                        }
                        self.views[res] = Some(view);
                        return one(Tile {
                            shape,
                            buf: Buf::F(Vec::new()),
                            poison: None,
                        });
                    }
                }
                let n: usize = shape.iter().product();
                let mut buf = normalise(d, Buf::filled(repr(d), 1, *other)).repeat(n);
                let m = self.mem(*tensor);
                placed.for_each_run(m, |dst, off, len| {
                    // SAFETY: `off..off + len` is in bounds of the tensor.
                    unsafe { read_run(m, off, &mut buf, dst, len) }
                });
                if let Some(mk) = mask {
                    let fill = normalise(d, Buf::filled(repr(d), 1, *other));
                    let mk = self.v(*mk).buf.i().to_vec();
                    apply_mask(&mut buf, &fill, &mk);
                }
                one(Tile {
                    shape,
                    buf,
                    poison: None,
                })
            }
            OpKind::Store {
                tensor,
                access,
                value,
                mask,
            }
            | OpKind::AtomicAdd {
                tensor,
                access,
                value,
                mask,
            } => {
                let add = matches!(op.kind, OpKind::AtomicAdd { .. });
                let placed = self.access(*tensor, access);
                let v = self.v(*value).clone();
                let mk = mask.map(|mk| self.v(mk).clone());
                let mk = mk.as_ref().map(|t| t.buf.i());
                let m = self.mem(*tensor);
                if let Some(p) = &v.poison {
                    let mut bad = false;
                    placed.for_each_run(m, |at, _, len| {
                        bad |= (at..at + len).any(|j| {
                            p[if p.len() == 1 { 0 } else { j }] && mk.is_none_or(|mk| mk[j] != 0)
                        });
                    });
                    if bad {
                        return Err(div_by_zero());
                    }
                }
                placed.for_each_run(m, |src, off, len| {
                    // SAFETY: `off..off + len` is in bounds of the tensor.
                    unsafe { write_run(m, off, &v.buf, src, len, mk, add) }
                });
                Ok(vec![])
            }
            OpKind::Dot {
                a,
                b,
                acc,
                precision,
            } => {
                // An accumulator read for the last time here is taken, so that
                // its buffer is accumulated into in place (no copy per K step).
                let acc = acc.map(|c| {
                    if c != *a && c != *b && self.live.dying(op).contains(&c) {
                        self.vals[c.0 as usize]
                            .take()
                            .expect("Tile IR: a value used before its definition")
                    } else {
                        self.v(c).clone()
                    }
                });
                let acc_poisoned = acc
                    .as_ref()
                    .and_then(|t| t.poison.as_ref())
                    .is_some_and(|p| p.iter().any(|b| *b));
                let acc = acc.map(|t| Rc::try_unwrap(t).map_or_else(|t| t.buf.clone(), |t| t.buf));
                let (x, y) = (self.v(*a), self.v(*b));
                let (m, kk, n) = (x.shape[0], x.shape[1], y.shape[1]);
                let buf = match (
                    source(x, self.views[a.0 as usize]),
                    source(y, self.views[b.0 as usize]),
                ) {
                    (Some(sa), Some(sb)) => {
                        let mut c = match acc {
                            Some(Buf::F(c)) => c,
                            Some(other) => cast(&other, DType::F32).f().to_vec(),
                            None => vec![0.0f32; m * n],
                        };
                        let parts = [Part {
                            a: sa,
                            b: sb,
                            k: kk,
                        }];
                        let tf32 = *precision == Precision::Tf32;
                        gemm::sdot_chain(&parts, &mut c, (m, n), tf32, Some(self.cache));
                        normalise(rd(0), Buf::F(c))
                    }
                    _ => dot(&x.buf, &y.buf, acc, m, kk, n, rd(0)),
                };
                one(Tile {
                    shape: vec![m, n],
                    buf,
                    poison: acc_poisoned.then(|| vec![true; m * n]),
                })
            }
            OpKind::Reduce {
                op: r,
                x,
                axis,
                keepdims,
            } => {
                let a = self.v(*x);
                let d = rd(0);
                let outer: usize = a.shape[..*axis].iter().product();
                let len = a.shape[*axis];
                let inner: usize = a.shape[*axis + 1..].iter().product();
                let buf = normalise(d, reduce(*r, &a.buf, outer, len, inner));
                let mut shape = a.shape.clone();
                if *keepdims {
                    shape[*axis] = 1;
                } else {
                    shape.remove(*axis);
                }
                one(Tile {
                    shape,
                    buf,
                    poison: None,
                })
            }
            OpKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let iv_dtype = self.dtype(body.args[0]);
                let (mut i, h, s) = (
                    self.v(*lo).buf.get_i(0),
                    self.v(*hi).buf.get_i(0),
                    self.v(*step).buf.get_i(0),
                );
                if s == 0 {
                    return Err(ExecError::new("E0703", "`range` step is zero")
                        .with_help("a loop step must be non-zero"));
                }
                let mut carried: Vec<T> = init.iter().map(|v| self.v(*v).clone()).collect();
                let chain = self.chained.get(op);
                let mut pending = Pending::new();
                let outer = self.in_chained_loop;
                self.in_chained_loop |= chain.is_some();
                while (s > 0 && i < h) || (s < 0 && i > h) {
                    self.interrupt.check()?;
                    let mut args = vec![scalar_tile(Buf::I(vec![wrap_int(iv_dtype, i)]))];
                    args.extend(carried);
                    carried =
                        self.run_region_chained(body, args, chain.map(|c| (c, &mut pending)))?;
                    if let Some(c) = chain.filter(|_| pending.is_full()) {
                        pending.multiply(&mut carried[c.carried], self.cache);
                    }
                    i += s;
                }
                self.in_chained_loop = outer;
                if let Some(c) = chain {
                    pending.multiply(&mut carried[c.carried], self.cache);
                }
                Ok(carried)
            }
            OpKind::While { init, cond, body } => {
                let mut carried: Vec<T> = init.iter().map(|v| self.v(*v).clone()).collect();
                loop {
                    self.interrupt.check()?;
                    let c = self.run_region(cond, carried.clone())?;
                    if c[0].poison.is_some() {
                        return Err(div_by_zero());
                    }
                    if c[0].buf.get(0) == 0.0 {
                        break;
                    }
                    carried = self.run_region(body, carried)?;
                }
                Ok(carried)
            }
            OpKind::If {
                cond,
                then,
                otherwise,
            } => {
                if self.v(*cond).buf.get(0) != 0.0 {
                    self.run_region(then, vec![])
                } else {
                    self.run_region(otherwise, vec![])
                }
            }
            OpKind::Yield(_) => unreachable!("handled by region"),
        }
    }

    /// The view a load of a 2-d f32/f16/bf16 tile can be left as (see
    /// [`deferred`]): any access and bounds, a mask only when it is all set.
    fn deferred_load(
        &self,
        tensor: usize,
        d: DType,
        shape: &[usize],
        starts: &[(i64, Option<usize>)],
        mask: Option<Value>,
        other: Constant,
    ) -> Option<View> {
        let m = self.mem(tensor);
        if shape.len() != 2 || m.dtype != d || !matches!(d, DType::F32 | DType::F16 | DType::BF16) {
            return None;
        }
        if let Some(mk) = mask {
            if self.v(mk).buf.i().contains(&0) {
                return None;
            }
        }
        let mut off = 0i64;
        let mut ranges = Vec::with_capacity(2);
        for (axis, (s, len)) in starts.iter().enumerate() {
            match len {
                // A point out of bounds: the whole tile is `other`, rare
                // enough to leave to the general load.
                None if *s < 0 || *s >= m.dims[axis] => return None,
                None => {}
                Some(len) => {
                    let len = *len as i64;
                    // A window wholly outside the tensor is left to the general
                    // load (which clips); so the offsets below stay small.
                    if *s < -len || *s > m.dims[axis] {
                        return None;
                    }
                    let lo = (-s).clamp(0, len);
                    let hi = (m.dims[axis] - s).clamp(lo, len);
                    ranges.push((m.strides[axis], (lo as usize, hi as usize)));
                }
            }
            off = off.checked_add(s.checked_mul(m.strides[axis])?)?;
        }
        let fill = normalise(d, Buf::filled(Repr::F, 1, other)).f()[0];
        Some(View {
            ptr: m.ptr,
            dtype: d,
            off,
            rs: ranges[0].0,
            cs: ranges[1].0,
            rows: ranges[0].1,
            cols: ranges[1].1,
            fill,
            read_only: m.read_only,
        })
    }

    /// Where an access of tensor `tensor` reads or writes.
    fn access(&self, tensor: usize, access: &[Access]) -> Placed {
        if Access::is_gather(access) {
            let shape: Vec<usize> = Access::shape(access, &self.k.types)
                .iter()
                .map(|&d| d as usize)
                .collect();
            let n = shape.iter().product();
            let m = self.mem(tensor);
            let idx: Vec<&[i64]> = access.iter().map(|a| self.v(a.value()).buf.i()).collect();
            let offsets = (0..n)
                .map(|e| {
                    let mut off = 0i64;
                    for (axis, ix) in idx.iter().enumerate() {
                        let i = ix[if ix.len() == 1 { 0 } else { e }];
                        if i < 0 || i >= m.dims[axis] {
                            return None;
                        }
                        off += i * m.strides[axis];
                    }
                    Some(off as usize)
                })
                .collect();
            return Placed::Gathered { shape, offsets };
        }
        let mut shape = Vec::new();
        let mut starts = Vec::new();
        for a in access {
            match a {
                Access::Point(v) => starts.push((self.v(*v).buf.get_i(0), None)),
                Access::Range { start, len } => {
                    shape.push(*len as usize);
                    starts.push((self.v(*start).buf.get_i(0), Some(*len as usize)));
                }
                Access::Gather(_) => unreachable!("Tile IR: a gather mixed with points or ranges"),
            }
        }
        Placed::Window { shape, starts }
    }
}

/// The elements an access touches.
enum Placed {
    /// A window: per tensor axis, `(start, Some(len))` for a range or
    /// `(index, None)` for a point.
    Window {
        shape: Vec<usize>,
        starts: Vec<(i64, Option<usize>)>,
    },
    /// A gather: each element's tensor offset, `None` when out of bounds.
    Gathered {
        shape: Vec<usize>,
        offsets: Vec<Option<usize>>,
    },
}

impl Placed {
    fn shape(&self) -> &[usize] {
        match self {
            Placed::Window { shape, .. } | Placed::Gathered { shape, .. } => shape,
        }
    }

    /// Calls `f(tile_offset, tensor_offset, len)` for every in-bounds run.
    fn for_each_run(&self, m: &Mem, mut f: impl FnMut(usize, usize, usize)) {
        match self {
            Placed::Window { shape, starts } => for_each_run(m, shape, starts, f),
            Placed::Gathered { offsets, .. } => {
                for (e, off) in offsets.iter().enumerate() {
                    if let Some(off) = off {
                        f(e, *off, 1);
                    }
                }
            }
        }
    }
}

/// A `dot` operand for [`gemm::sdot`]: the view of a deferred load, or an
/// f32-represented tile.
fn source(t: &Tile, view: Option<View>) -> Option<Source<'_>> {
    match (&t.buf, view) {
        (_, Some(view)) => Some(Source::Mem(view)),
        (Buf::F(f), None) => Some(Source::Dense(f)),
        _ => None,
    }
}

fn access_poisoned(access: &[Access], any: &dyn Fn(Value) -> bool) -> bool {
    access.iter().any(|a| any(a.value()))
}

/// The row-major indices into a tile of `shape` of elements `start ..
/// start + len` of `axis`, in order.
fn extract_index(shape: &[usize], axis: usize, start: usize, len: usize) -> Vec<usize> {
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let mut idx = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        for a in start..start + len {
            let base = (o * shape[axis] + a) * inner;
            idx.extend(base..base + inner);
        }
    }
    idx
}

fn select<X: Copy>(c: &[i64], a: &[X], b: &[X]) -> Vec<X> {
    c.iter()
        .zip(a.iter().zip(b))
        .map(|(c, (a, b))| if *c != 0 { *a } else { *b })
        .collect()
}

fn apply_mask(buf: &mut Buf, fill: &Buf, mask: &[i64]) {
    match (buf, fill) {
        (Buf::F(v), Buf::F(f)) => v.iter_mut().zip(mask).for_each(|(x, m)| {
            if *m == 0 {
                *x = f[0]
            }
        }),
        (Buf::D(v), Buf::D(f)) => v.iter_mut().zip(mask).for_each(|(x, m)| {
            if *m == 0 {
                *x = f[0]
            }
        }),
        (Buf::I(v), Buf::I(f)) => v.iter_mut().zip(mask).for_each(|(x, m)| {
            if *m == 0 {
                *x = f[0]
            }
        }),
        _ => unreachable!("same representation"),
    }
}

/// Calls `f(tile_offset, tensor_offset, len)` for every in-bounds run of
/// consecutive elements of an access (the innermost axis is contiguous in the
/// tile; it is contiguous in memory when it is the tensor's last axis).
///
/// This is what the unsafe reads and writes of a launch rely on: every
/// position passed on is clipped to `0..dims[axis]` on every axis (in
/// saturating arithmetic, whatever the kernel computed for its starts), so
/// `tensor_offset + len` is at most the tensor's element count, which its
/// storage holds (see `run_grid_with`).
fn for_each_run(
    m: &Mem,
    shape: &[usize],
    starts: &[(i64, Option<usize>)],
    mut f: impl FnMut(usize, usize, usize),
) {
    let rank = starts.len();
    // A point out of bounds: nothing is in bounds.
    for (axis, (s, len)) in starts.iter().enumerate() {
        if len.is_none() && (*s < 0 || *s >= m.dims[axis]) {
            return;
        }
    }
    if rank == 0 {
        f(0, 0, 1);
        return;
    }
    let (last_start, last_len) = starts[rank - 1];
    // The innermost run: the last axis' valid window (a point: one element).
    let (lo, hi) = match last_len {
        Some(len) => {
            let lo = last_start.saturating_neg().clamp(0, len as i64);
            let hi = m.dims[rank - 1]
                .saturating_sub(last_start)
                .clamp(lo, len as i64);
            (lo as usize, hi as usize)
        }
        None => (0, 1),
    };
    if lo >= hi {
        return;
    }
    let inner_tile = last_len.unwrap_or(1);
    // The outer range axes, odometer style.
    let outer: Vec<usize> = (0..rank - 1).filter(|&a| starts[a].1.is_some()).collect();
    let counts: Vec<usize> = outer.iter().map(|&a| starts[a].1.unwrap()).collect();
    let total: usize = counts.iter().product();
    let _ = shape;
    let mut idx = vec![0usize; outer.len()];
    for t in 0..total {
        if t > 0 {
            let mut j = outer.len();
            while j > 0 {
                j -= 1;
                idx[j] += 1;
                if idx[j] < counts[j] {
                    break;
                }
                idx[j] = 0;
            }
        }
        let mut off = 0i64;
        let mut ok = true;
        let mut oi = 0;
        for (axis, (s, len)) in starts.iter().enumerate().take(rank - 1) {
            let pos = if len.is_some() {
                oi += 1;
                s.saturating_add(idx[oi - 1] as i64)
            } else {
                *s
            };
            if pos < 0 || pos >= m.dims[axis] {
                ok = false;
                break;
            }
            off += pos * m.strides[axis];
        }
        if !ok {
            continue;
        }
        let last_pos = last_start + lo as i64;
        off += last_pos * m.strides[rank - 1];
        f(t * inner_tile + lo, off as usize, hi - lo);
    }
}

/// Reads `len` elements at `off` of `m` into `dst[at..]`, converting.
///
/// # Safety
/// `off + len` must be within the tensor.
unsafe fn read_run(m: &Mem, off: usize, dst: &mut Buf, at: usize, len: usize) {
    macro_rules! rd {
        ($t:ty, $v:expr, $conv:expr) => {{
            let p = (m.ptr as *const $t).add(off);
            let src = std::slice::from_raw_parts(p, len);
            for (o, x) in $v[at..at + len].iter_mut().zip(src) {
                *o = $conv(*x);
            }
        }};
    }
    match (m.dtype, dst) {
        (DType::F32, Buf::F(v)) => {
            let p = (m.ptr as *const f32).add(off);
            v[at..at + len].copy_from_slice(std::slice::from_raw_parts(p, len));
        }
        (DType::F16, Buf::F(v)) => rd!(f16, v, |x: f16| x.to_f32()),
        (DType::BF16, Buf::F(v)) => rd!(bf16, v, |x: bf16| x.to_f32()),
        (DType::F8E4M3 | DType::F8E5M2, Buf::F(v)) => {
            rd!(u8, v, |x: u8| decode_byte(m.dtype, x) as f32)
        }
        (DType::F64, Buf::D(v)) => rd!(f64, v, |x: f64| x),
        (DType::I64, Buf::I(v)) => rd!(i64, v, |x: i64| x),
        (DType::I32, Buf::I(v)) => rd!(i32, v, |x: i32| x as i64),
        (DType::I16, Buf::I(v)) => rd!(i16, v, |x: i16| x as i64),
        (DType::I8, Buf::I(v)) => rd!(i8, v, |x: i8| x as i64),
        (DType::U32, Buf::I(v)) => rd!(u32, v, |x: u32| x as i64),
        (DType::U8, Buf::I(v)) => rd!(u8, v, |x: u8| x as i64),
        (DType::Bool, Buf::I(v)) => rd!(u8, v, |x: u8| (x != 0) as i64),
        (d, b) => unreachable!("Tile IR: a {d} load into a {b:?} tile"),
    }
}

/// Writes (or atomically adds) `src[at..at + len]` to `m` at `off`, where the
/// mask (if any) is set.
///
/// # Safety
/// `off + len` must be within the tensor.
unsafe fn write_run(
    m: &Mem,
    off: usize,
    src: &Buf,
    at: usize,
    len: usize,
    mask: Option<&[i64]>,
    add: bool,
) {
    let on = |j: usize| mask.is_none_or(|mk| mk[at + j] != 0);
    // A scalar value stored to a range (or a tile to a point) is not produced
    // by lowering; a one-element source repeats.
    let val = |j: usize| -> f64 {
        let i = if src.len() == 1 { 0 } else { at + j };
        src.get(i)
    };
    if add {
        for j in 0..len {
            if on(j) {
                atomic_add(m, off + j, val(j), src, at + j);
            }
        }
        return;
    }
    match (m.dtype, src) {
        (DType::F32, Buf::F(v)) if mask.is_none() && v.len() >= at + len => {
            let p = (m.ptr as *mut f32).add(off);
            std::ptr::copy_nonoverlapping(v[at..].as_ptr(), p, len);
        }
        (DType::F32, Buf::F(v)) if v.len() >= at + len => {
            let p = (m.ptr as *mut f32).add(off);
            for j in 0..len {
                if on(j) {
                    p.add(j).write(v[at + j]);
                }
            }
        }
        (DType::F16, Buf::F(v)) if v.len() >= at + len => {
            let p = (m.ptr as *mut f16).add(off);
            for j in 0..len {
                if on(j) {
                    p.add(j).write(f16::from_f32(v[at + j]));
                }
            }
        }
        (DType::BF16, Buf::F(v)) if v.len() >= at + len => {
            let p = (m.ptr as *mut bf16).add(off);
            for j in 0..len {
                if on(j) {
                    p.add(j).write(bf16::from_f32(v[at + j]));
                }
            }
        }
        _ => {
            for j in 0..len {
                if on(j) {
                    write_one(m, off + j, val(j), src, at + j);
                }
            }
        }
    }
}

/// Element `i` of an integer tile exactly (i64 values do not survive f64).
fn int_of(src: &Buf, i: usize) -> Option<i64> {
    match src {
        Buf::I(v) => Some(v[if v.len() == 1 { 0 } else { i }]),
        _ => None,
    }
}

/// Writes `x` (or the integer `src[si]` exactly) to element `at` of `m`.
///
/// # Safety
/// `at` must be within the tensor.
unsafe fn write_one(m: &Mem, at: usize, x: f64, src: &Buf, si: usize) {
    let int = int_of(src, si).unwrap_or_else(|| float_to_int(m.dtype, x));
    match m.dtype {
        DType::F64 => (m.ptr as *mut f64).add(at).write(x),
        DType::F32 => (m.ptr as *mut f32).add(at).write(x as f32),
        DType::F16 => (m.ptr as *mut f16).add(at).write(f16::from_f64(x)),
        DType::BF16 => (m.ptr as *mut bf16).add(at).write(bf16::from_f64(x)),
        DType::I64 => (m.ptr as *mut i64).add(at).write(int),
        DType::I32 => (m.ptr as *mut i32).add(at).write(int as i32),
        DType::I16 => (m.ptr as *mut i16).add(at).write(int as i16),
        DType::I8 => (m.ptr as *mut i8).add(at).write(int as i8),
        DType::U32 => (m.ptr as *mut u32).add(at).write(int as u32),
        DType::U8 => m.ptr.add(at).write(int as u8),
        DType::Bool => m.ptr.add(at).write((int != 0) as u8),
        DType::F8E4M3 | DType::F8E5M2 => m.ptr.add(at).write(encode_byte(m.dtype, x)),
    }
}

/// `m[at] += x` as one atomic read-modify-write.
///
/// # Safety
/// `at` must be within the tensor (whose elements are aligned for their
/// type, as the storage vector is).
unsafe fn atomic_add(m: &Mem, at: usize, x: f64, src: &Buf, si: usize) {
    let int = int_of(src, si).unwrap_or_else(|| float_to_i64(x));
    macro_rules! cas {
        ($atomic:ty, $bits:ty, $from:expr, $to:expr) => {{
            let a = <$atomic>::from_ptr((m.ptr as *mut $bits).add(at));
            let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some($to($from(old)))
            });
        }};
    }
    macro_rules! int_add {
        ($atomic:ty, $t:ty) => {{
            let a = <$atomic>::from_ptr((m.ptr as *mut $t).add(at));
            a.fetch_add(int as $t, Ordering::Relaxed);
        }};
    }
    match m.dtype {
        DType::F64 => cas!(AtomicU64, u64, f64::from_bits, |v: f64| (v + x).to_bits()),
        DType::F32 => cas!(AtomicU32, u32, f32::from_bits, |v: f32| (v + x as f32)
            .to_bits()),
        DType::F16 => cas!(AtomicU16, u16, f16::from_bits, |v: f16| f16::from_f32(
            v.to_f32() + x as f32
        )
        .to_bits()),
        DType::BF16 => cas!(AtomicU16, u16, bf16::from_bits, |v: bf16| bf16::from_f32(
            v.to_f32() + x as f32
        )
        .to_bits()),
        DType::F8E4M3 | DType::F8E5M2 => {
            cas!(AtomicU8, u8, |b: u8| decode_byte(m.dtype, b), |v: f64| {
                encode_byte(m.dtype, v + x)
            })
        }
        DType::I64 => int_add!(AtomicI64, i64),
        DType::I32 => int_add!(AtomicI32, i32),
        DType::I16 => int_add!(AtomicI16, i16),
        DType::I8 => int_add!(AtomicI8, i8),
        DType::U32 => int_add!(AtomicU32, u32),
        DType::U8 => int_add!(AtomicU8, u8),
        DType::Bool => cas!(AtomicU8, u8, |b: u8| b as i64, |v: i64| ((v + int) != 0)
            as u8),
    }
}

pub(crate) fn erf64(x: f64) -> f64 {
    // Abramowitz-Stegun 7.1.26 is too coarse; W. J. Cody's rational
    // approximations via libm-quality erfc is not in std, so a series for
    // small |x| and a continued-fraction tail (accurate to ~1e-15 / 1e-12).
    if x.abs() < 2.5 {
        let mut sum = x;
        let mut term = x;
        for n in 1..80 {
            term *= -x * x / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(x) = exp(-x^2)/(x sqrt(pi)) * 1/(1+ 1/(2x^2)/(1+2/(2x^2)/(1+...))) (Lentz).
        let a = x.abs();
        let mut f = 0.0;
        for n in (1..60).rev() {
            f = (n as f64 / 2.0) / (a + f);
        }
        let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f);
        if x > 0.0 {
            1.0 - erfc
        } else {
            erfc - 1.0
        }
    }
}

/// Calls `$name` in the variant compiled for the widest vector unit the
/// machine has (AVX-512 or AVX2, detected at run time; the build targets
/// baseline x86-64, SSE2). No fast-math: results are bit-identical on every
/// path.
macro_rules! widest {
    ($avx512:ident, $avx2:ident, $base:ident, $($a:expr),*) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the feature was detected.
                return unsafe { $avx512($($a),*) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the feature was detected.
                return unsafe { $avx2($($a),*) };
            }
        }
        $base($($a),*)
    }};
}

/// The element loops, inlined into each variant (a plain loop, not `collect`,
/// which would be an out-of-line call compiled for the baseline).
#[inline(always)]
fn map1_loop<X: Copy, Y>(p: &[X], f: &impl Fn(X) -> Y) -> Vec<Y> {
    let mut out = Vec::with_capacity(p.len());
    for (o, a) in out.spare_capacity_mut().iter_mut().zip(p) {
        o.write(f(*a));
    }
    // SAFETY: every element up to `p.len()` was written.
    unsafe { out.set_len(p.len()) };
    out
}

#[inline(always)]
fn zip_map_loop<X: Copy, Y>(p: &[X], q: &[X], f: &impl Fn(X, X) -> Y) -> Vec<Y> {
    let n = p.len().min(q.len());
    let mut out = Vec::with_capacity(n);
    for ((o, a), b) in out.spare_capacity_mut().iter_mut().zip(p).zip(q) {
        o.write(f(*a, *b));
    }
    // SAFETY: every element up to `n` was written.
    unsafe { out.set_len(n) };
    out
}

/// # Safety
/// The CPU must have the feature (only safe code runs inside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn map1_avx512<X: Copy, Y>(p: &[X], f: &impl Fn(X) -> Y) -> Vec<Y> {
    map1_loop(p, f)
}

/// # Safety
/// The CPU must have the feature (only safe code runs inside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn map1_avx2<X: Copy, Y>(p: &[X], f: &impl Fn(X) -> Y) -> Vec<Y> {
    map1_loop(p, f)
}

/// # Safety
/// The CPU must have the feature (only safe code runs inside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn zip_map_avx512<X: Copy, Y>(p: &[X], q: &[X], f: &impl Fn(X, X) -> Y) -> Vec<Y> {
    zip_map_loop(p, q, f)
}

/// # Safety
/// The CPU must have the feature (only safe code runs inside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn zip_map_avx2<X: Copy, Y>(p: &[X], q: &[X], f: &impl Fn(X, X) -> Y) -> Vec<Y> {
    zip_map_loop(p, q, f)
}

fn map1<X: Copy, Y>(p: &[X], f: impl Fn(X) -> Y) -> Vec<Y> {
    widest!(map1_avx512, map1_avx2, map1_loop, p, &f)
}

fn zip_map<X: Copy, Y>(p: &[X], q: &[X], f: impl Fn(X, X) -> Y) -> Vec<Y> {
    widest!(zip_map_avx512, zip_map_avx2, zip_map_loop, p, q, &f)
}

/// Float unary ops; each arm is its own monomorphic loop (vectorisable, no
/// call per element).
macro_rules! float_unary {
    ($u:expr, $v:expr, $t:ty) => {{
        let v = $v;
        match $u {
            UnaryOp::Neg => map1(v, |x: $t| -x),
            UnaryOp::Exp => map1(v, |x: $t| x.exp()),
            UnaryOp::Exp2 => map1(v, |x: $t| x.exp2()),
            UnaryOp::Log => map1(v, |x: $t| x.ln()),
            UnaryOp::Log2 => map1(v, |x: $t| x.log2()),
            UnaryOp::Sqrt => map1(v, |x: $t| x.sqrt()),
            UnaryOp::Rsqrt => map1(v, |x: $t| 1.0 / x.sqrt()),
            UnaryOp::Abs => map1(v, |x: $t| x.abs()),
            UnaryOp::Sigmoid => map1(v, |x: $t| 1.0 / (1.0 + (-x).exp())),
            UnaryOp::Tanh => map1(v, |x: $t| x.tanh()),
            UnaryOp::Erf => map1(v, |x: $t| erf64(x as f64) as $t),
            UnaryOp::Not => map1(v, |x: $t| if x == 0.0 { 1.0 } else { 0.0 }),
            UnaryOp::Invert => v.to_vec(),
        }
    }};
}

/// `e^x` in f32 without a call per element (vectorisable): Cephes' expf
/// polynomial after range reduction by ln 2, within 2 ulp of the exact value
/// for normal results; results below the smallest normal f32 flush to 0.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    let xc = x.clamp(-87.5, 88.75);
    // Round to nearest with the 1.5 * 2^23 trick: `floor` is a libm call on
    // baseline x86-64 (no SSE4.1), which would stop vectorisation.
    const MAGIC: f32 = 12_582_912.0;
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_2e-4f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // 2^n as two factors, each within the normal exponent range.
    // `n` as an integer, read from the mantissa of `t` (an `as` cast
    // saturates, which does not vectorise).
    let ni = t.to_bits() as i32 - MAGIC.to_bits() as i32;
    let h = ni >> 1;
    let s1 = f32::from_bits(((h + 127) as u32) << 23);
    let s2 = f32::from_bits(((ni - h + 127) as u32) << 23);
    let y = e * s1 * s2;
    if x.is_nan() {
        x
    } else if x < -87.33 {
        0.0
    } else if x > 88.72 {
        f32::INFINITY
    } else {
        y
    }
}

fn unary(u: UnaryOp, d: DType, x: &Buf) -> Buf {
    match x {
        Buf::F(v) if u == UnaryOp::Exp => normalise(d, Buf::F(map1(v, exp_f32))),
        Buf::F(v) => normalise(d, Buf::F(float_unary!(u, v, f32))),
        Buf::D(v) => Buf::D(float_unary!(u, v, f64)),
        Buf::I(v) => {
            let out = match u {
                UnaryOp::Neg => map1(v, |x: i64| x.wrapping_neg()),
                UnaryOp::Not => map1(v, |x: i64| (x == 0) as i64),
                UnaryOp::Invert => map1(v, |x: i64| !x),
                UnaryOp::Abs => map1(v, |x: i64| x.wrapping_abs()),
                // Float functions of integers are cast first by lowering.
                _ => v.to_vec(),
            };
            normalise(d, Buf::I(out))
        }
    }
}

macro_rules! compare {
    ($op:expr, $p:expr, $q:expr, $t:ty) => {{
        let (p, q) = ($p, $q);
        match $op {
            BinaryOp::Eq => zip_map(p, q, |a: $t, b: $t| (a == b) as i64),
            BinaryOp::Ne => zip_map(p, q, |a: $t, b: $t| (a != b) as i64),
            BinaryOp::Lt => zip_map(p, q, |a: $t, b: $t| (a < b) as i64),
            BinaryOp::Le => zip_map(p, q, |a: $t, b: $t| (a <= b) as i64),
            BinaryOp::Gt => zip_map(p, q, |a: $t, b: $t| (a > b) as i64),
            _ => zip_map(p, q, |a: $t, b: $t| (a >= b) as i64),
        }
    }};
}

macro_rules! float_binary {
    ($op:expr, $p:expr, $q:expr, $t:ty) => {{
        let (p, q) = ($p, $q);
        match $op {
            BinaryOp::Add => zip_map(p, q, |a: $t, b: $t| a + b),
            BinaryOp::Sub => zip_map(p, q, |a: $t, b: $t| a - b),
            BinaryOp::Mul => zip_map(p, q, |a: $t, b: $t| a * b),
            BinaryOp::Div => zip_map(p, q, |a: $t, b: $t| a / b),
            BinaryOp::FloorDiv => zip_map(p, q, |a: $t, b: $t| (a / b).floor()),
            BinaryOp::Mod => zip_map(p, q, |a: $t, b: $t| {
                let r = a % b;
                if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
                    r + b
                } else {
                    r
                }
            }),
            BinaryOp::Pow => zip_map(p, q, |a: $t, b: $t| a.powf(b)),
            // NaN propagates, as in the device's max/min of the language.
            BinaryOp::Max => zip_map(p, q, |a: $t, b: $t| {
                if a.is_nan() || b.is_nan() {
                    <$t>::NAN
                } else {
                    a.max(b)
                }
            }),
            BinaryOp::Min => zip_map(p, q, |a: $t, b: $t| {
                if a.is_nan() || b.is_nan() {
                    <$t>::NAN
                } else {
                    a.min(b)
                }
            }),
            BinaryOp::And => zip_map(p, q, |a: $t, b: $t| ((a != 0.0) && (b != 0.0)) as i64 as $t),
            BinaryOp::Or => zip_map(p, q, |a: $t, b: $t| ((a != 0.0) || (b != 0.0)) as i64 as $t),
            _ => zip_map(p, q, |a: $t, b: $t| ((a != 0.0) != (b != 0.0)) as i64 as $t),
        }
    }};
}

fn floor_div(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let q = a.wrapping_div(b);
    if (a.wrapping_rem(b) != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

fn py_mod(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let r = a.wrapping_rem(b);
    if r != 0 && ((r < 0) != (b < 0)) {
        r + b
    } else {
        r
    }
}

fn int_pow(a: i64, b: i64) -> i64 {
    if b < 0 {
        // Python gives a float; integer powers are non-negative in checked
        // code, so this is 1/a truncated.
        match a {
            1 => 1,
            -1 if b % 2 == 0 => 1,
            -1 => -1,
            _ => 0,
        }
    } else {
        a.wrapping_pow(b.min(u32::MAX as i64) as u32)
    }
}

/// An elementwise binary op. Integer division by zero gives 0 in that lane and
/// marks it in the returned poison lanes.
fn binary(op: BinaryOp, rd: DType, x: &Buf, y: &Buf) -> (Buf, Option<Vec<bool>>) {
    use BinaryOp::*;
    let buf = match (x, y) {
        (Buf::F(p), Buf::F(q)) if op.is_comparison() => Buf::I(compare!(op, p, q, f32)),
        (Buf::D(p), Buf::D(q)) if op.is_comparison() => Buf::I(compare!(op, p, q, f64)),
        (Buf::I(p), Buf::I(q)) if op.is_comparison() => Buf::I(compare!(op, p, q, i64)),
        (Buf::F(p), Buf::F(q)) => normalise(rd, Buf::F(float_binary!(op, p, q, f32))),
        (Buf::D(p), Buf::D(q)) => Buf::D(float_binary!(op, p, q, f64)),
        (Buf::I(p), Buf::I(q)) => {
            let poison = (matches!(op, Div | FloorDiv | Mod) && q.contains(&0))
                .then(|| q.iter().map(|b| *b == 0).collect::<Vec<bool>>());
            let out = match op {
                Add => zip_map(p, q, |a: i64, b: i64| a.wrapping_add(b)),
                Sub => zip_map(p, q, |a: i64, b: i64| a.wrapping_sub(b)),
                Mul => zip_map(p, q, |a: i64, b: i64| a.wrapping_mul(b)),
                // Integer true division is not produced by lowering (it casts
                // to float); floor division keeps integers exact.
                Div | FloorDiv => zip_map(p, q, floor_div),
                Mod => zip_map(p, q, py_mod),
                Pow => zip_map(p, q, int_pow),
                Max => zip_map(p, q, |a: i64, b: i64| a.max(b)),
                Min => zip_map(p, q, |a: i64, b: i64| a.min(b)),
                And => zip_map(p, q, |a: i64, b: i64| a & b),
                Or => zip_map(p, q, |a: i64, b: i64| a | b),
                _ => zip_map(p, q, |a: i64, b: i64| a ^ b),
            };
            return (normalise(rd, Buf::I(out)), poison);
        }
        _ => unreachable!("Tile IR: binary operands of one type"),
    };
    (buf, None)
}

fn cast(x: &Buf, to: DType) -> Buf {
    let b = match (x, repr(to)) {
        (Buf::F(v), Repr::F) => Buf::F(v.clone()),
        (Buf::F(v), Repr::D) => Buf::D(v.iter().map(|x| *x as f64).collect()),
        (Buf::D(v), Repr::F) => Buf::F(v.iter().map(|x| round_to(to, *x) as f32).collect()),
        (Buf::D(v), Repr::D) => Buf::D(v.clone()),
        (Buf::I(v), Repr::F) => Buf::F(v.iter().map(|x| *x as f32).collect()),
        (Buf::I(v), Repr::D) => Buf::D(v.iter().map(|x| *x as f64).collect()),
        (Buf::I(v), Repr::I) => Buf::I(v.clone()),
        (Buf::F(v), Repr::I) => Buf::I(v.iter().map(|x| float_to_int(to, *x as f64)).collect()),
        (Buf::D(v), Repr::I) => Buf::I(v.iter().map(|x| float_to_int(to, *x)).collect()),
    };
    normalise(to, b)
}

fn broadcast(a: &Tile, to: &[usize]) -> Tile {
    let n: usize = to.iter().product();
    if a.buf.len() == 1 {
        let buf = match &a.buf {
            Buf::F(v) => Buf::F(vec![v[0]; n]),
            Buf::D(v) => Buf::D(vec![v[0]; n]),
            Buf::I(v) => Buf::I(vec![v[0]; n]),
        };
        return Tile {
            shape: to.to_vec(),
            buf,
            poison: None,
        };
    }
    // Source strides, 0 along broadcast axes.
    let mut st = vec![0usize; to.len()];
    let mut s = 1;
    for i in (0..to.len()).rev() {
        st[i] = if a.shape[i] == 1 { 0 } else { s };
        s *= a.shape[i];
    }
    let mut idx = Vec::with_capacity(n);
    let mut cur = vec![0usize; to.len()];
    for _ in 0..n {
        idx.push(cur.iter().zip(&st).map(|(c, s)| c * s).sum());
        let mut j = to.len();
        while j > 0 {
            j -= 1;
            cur[j] += 1;
            if cur[j] < to[j] {
                break;
            }
            cur[j] = 0;
        }
    }
    Tile {
        shape: to.to_vec(),
        buf: a.buf.gather(&idx),
        poison: None,
    }
}

/// `dot` of f64 and integer tiles (f32-represented ones go through
/// [`gemm::sdot`]).
fn dot(a: &Buf, b: &Buf, acc: Option<Buf>, m: usize, k: usize, n: usize, rd: DType) -> Buf {
    match (a, b) {
        (Buf::D(x), Buf::D(y)) => {
            let mut c = match acc {
                Some(Buf::D(c)) => c,
                Some(other) => cast(&other, DType::F64).get_d(),
                None => vec![0.0f64; m * n],
            };
            assert!(
                x.len() == m * k && y.len() == k * n && c.len() == m * n,
                "Tile IR: dot operands of their shapes"
            );
            // SAFETY: row-major slices of the stated sizes (asserted above).
            unsafe {
                matrixmultiply::dgemm(
                    m,
                    k,
                    n,
                    1.0,
                    x.as_ptr(),
                    k as isize,
                    1,
                    y.as_ptr(),
                    n as isize,
                    1,
                    1.0,
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
            cast(&Buf::D(c), rd)
        }
        (Buf::I(x), Buf::I(y)) => {
            let mut c: Vec<i64> = match acc {
                Some(t) => cast(&t, DType::I64).i().to_vec(),
                None => vec![0; m * n],
            };
            for i in 0..m {
                for l in 0..k {
                    let xv = x[i * k + l];
                    for j in 0..n {
                        c[i * n + j] = c[i * n + j].wrapping_add(xv.wrapping_mul(y[l * n + j]));
                    }
                }
            }
            cast(&Buf::I(c), rd)
        }
        _ => unreachable!("Tile IR: dot operands of one type"),
    }
}

impl Buf {
    fn get_d(self) -> Vec<f64> {
        match self {
            Buf::D(v) => v,
            _ => unreachable!("an f64 tile"),
        }
    }
}

// NaN propagates (b is NaN: b != b).
#[allow(clippy::eq_op)]
fn fmax<X: PartialOrd + Copy>(a: X, b: X) -> X {
    if b > a || b != b {
        b
    } else {
        a
    }
}

#[allow(clippy::eq_op)]
fn fmin<X: PartialOrd + Copy>(a: X, b: X) -> X {
    if b < a || b != b {
        b
    } else {
        a
    }
}
/// Folds `row` with `f` in eight interleaved lanes, then the lanes together.
#[inline(always)]
fn lanes8(row: &[f32], init: f32, f: &impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] = f(acc[i], c[i]);
        }
    }
    for (i, x) in chunks.remainder().iter().enumerate() {
        acc[i] = f(acc[i], *x);
    }
    acc.into_iter().fold(init, f)
}

#[inline(always)]
fn rows_fold_loop(v: &[f32], len: usize, init: f32, f: &impl Fn(f32, f32) -> f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(v.len() / len.max(1));
    for row in v.chunks(len) {
        out.push(lanes8(row, init, f));
    }
    out
}

/// # Safety
/// The CPU must have the feature (only safe code runs inside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rows_fold_avx512(
    v: &[f32],
    len: usize,
    init: f32,
    f: &impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    rows_fold_loop(v, len, init, f)
}

/// # Safety
/// The CPU must have the feature (only safe code runs inside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rows_fold_avx2(
    v: &[f32],
    len: usize,
    init: f32,
    f: &impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    rows_fold_loop(v, len, init, f)
}

/// Every `len`-long row of `v` folded with `f` (see [`lanes8`]).
fn rows_fold(v: &[f32], len: usize, init: f32, f: &impl Fn(f32, f32) -> f32) -> Vec<f32> {
    widest!(
        rows_fold_avx512,
        rows_fold_avx2,
        rows_fold_loop,
        v,
        len,
        init,
        f
    )
}

fn reduce(op: ReduceOp, x: &Buf, outer: usize, len: usize, inner: usize) -> Buf {
    macro_rules! red {
        ($v:expr, $t:ty, $init:expr, $f:expr) => {{
            let mut out: Vec<$t> = vec![$init; outer * inner];
            for o in 0..outer {
                let acc = &mut out[o * inner..(o + 1) * inner];
                for j in 0..len {
                    let row = &$v[(o * len + j) * inner..(o * len + j + 1) * inner];
                    for (a, x) in acc.iter_mut().zip(row) {
                        *a = $f(*a, *x);
                    }
                }
            }
            out
        }};
    }
    if inner == 1 && len > 0 {
        if let Buf::F(v) = x {
            // Rows reduced along their contiguous axis: eight partial results
            // per row (vectorisable; the GPU's tree order differs as much).
            let rows = &v[..(outer * len).min(v.len())];
            return Buf::F(match op {
                ReduceOp::Sum => rows_fold(rows, len, 0.0, &|a, b| a + b),
                ReduceOp::Max => rows_fold(rows, len, f32::NEG_INFINITY, &fmax),
                ReduceOp::Min => rows_fold(rows, len, f32::INFINITY, &fmin),
            });
        }
    }
    match (x, op) {
        (Buf::F(v), ReduceOp::Sum) => Buf::F(red!(v, f32, 0.0, |a, b| a + b)),
        (Buf::F(v), ReduceOp::Max) => Buf::F(red!(v, f32, f32::NEG_INFINITY, fmax)),
        (Buf::F(v), ReduceOp::Min) => Buf::F(red!(v, f32, f32::INFINITY, fmin)),
        (Buf::D(v), ReduceOp::Sum) => Buf::D(red!(v, f64, 0.0, |a, b| a + b)),
        (Buf::D(v), ReduceOp::Max) => Buf::D(red!(v, f64, f64::NEG_INFINITY, fmax)),
        (Buf::D(v), ReduceOp::Min) => Buf::D(red!(v, f64, f64::INFINITY, fmin)),
        (Buf::I(v), ReduceOp::Sum) => Buf::I(red!(v, i64, 0, |a: i64, b: i64| a.wrapping_add(b))),
        (Buf::I(v), ReduceOp::Max) => Buf::I(red!(v, i64, i64::MIN, |a: i64, b: i64| a.max(b))),
        (Buf::I(v), ReduceOp::Min) => Buf::I(red!(v, i64, i64::MAX, |a: i64, b: i64| a.min(b))),
    }
}

#[cfg(test)]
mod tests {
    use super::exp_f32;

    #[test]
    fn fast_exp_is_within_two_ulp() {
        let mut x = -87.0f32;
        while x < 88.5 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            assert!(
                ((got - want) / want).abs() < 2.5e-7,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-100.0), 0.0);
    }
}

/// Loads left to their dots ([`deferred`]) against the same launches with
/// every load materialised: the results must be bit-identical.
#[cfg(test)]
mod deferred_tests {
    use super::chain::ChainedLoops;
    use super::deferred::DeferredLoads;
    use super::*;
    use crate::db::Database;
    use crate::exec::launch::prepared;
    use crate::exec::{rng, Value as V};

    const SRC: &str = r#"
from std.linalg import gemm, gemm_tf32, gemm_bf16

@kernel(grid=(1,))
def rewrites_a(A: Tensor["M", "K", f32], B: Tensor["K", "N", f32], C: Tensor["M", "N", f32],
               BM: const = 16, BN: const = 16, BK: const = 16):
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        acc = dot(load(A[0 : BM, k : k + BK]), load(B[k : k + BK, 0 : BN]), acc, precision="tf32")
    store(A[0 : BM, 0 : BN], acc)
    again = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        again = dot(load(A[0 : BM, k : k + BK]), load(B[k : k + BK, 0 : BN]), again, precision="tf32")
    store(C[0 : BM, 0 : BN], again)

@kernel(grid=(cdiv(M, BM), cdiv(N, BN)))
def strided(A: Tensor["M", "K", "Z", f32], B: Tensor["K", "N", f32], C: Tensor["M", "N", f32],
            BM: const = 32, BN: const = 32, BK: const = 16):
    m0 = program_id(0) * BM
    n0 = program_id(1) * BN
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        a = load(A[m0 : m0 + BM, k : k + BK, 1], other=0.5)
        acc = dot(a, load(B[k : k + BK, n0 : n0 + BN], other=-2.0), acc)
    store(C[m0 : m0 + BM, n0 : n0 + BN], acc)

@kernel(grid=(cdiv(M, BM), cdiv(N, BN)))
def masked(A: Tensor["M", "K", f16], B: Tensor["K", "N", f16], C: Tensor["M", "N", f32],
           BM: const = 32, BN: const = 32, BK: const = 16):
    m0 = program_id(0) * BM
    n0 = program_id(1) * BN
    rows = arange(0, BM) + m0
    cols = arange(0, BK)
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        keep = (rows[:, None] < 40) & (cols[None, :] + k < K)
        a = load(A[m0 : m0 + BM, k : k + BK], mask=keep, other=1.5)
        acc = dot(a, load(B[k : k + BK, n0 : n0 + BN]), acc)
    store(C[m0 : m0 + BM, n0 : n0 + BN], acc)

@kernel(grid=(cdiv(M, BM), cdiv(N, BN)))
def reused(A: Tensor["M", "K", f32], B: Tensor["K", "N", f32], C: Tensor["M", "N", f32],
           BM: const = 32, BN: const = 32, BK: const = 32):
    m0 = program_id(0) * BM
    n0 = program_id(1) * BN
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        a = load(A[m0 : m0 + BM, k : k + BK])
        b = load(B[k : k + BK, n0 : n0 + BN])
        acc = dot(a, b, acc) + dot(a * 2.0, b)
    store(C[m0 : m0 + BM, n0 : n0 + BN], acc)
"#;

    /// Runs `kernel` on copies of `args` with loads deferred and K loops
    /// chained, with loads deferred only, and with neither; checks that the
    /// first two give the same bits and returns tensor argument `out` of the
    /// first and last runs, how many loads the kernel may defer and how many
    /// loops it may chain.
    fn both(kernel: &str, args: &[V], out: usize) -> (Vec<f32>, Vec<f32>, usize, usize) {
        let mut db = Database::new();
        let file = db.set_source("/deferred_tests.tsr", SRC.into());
        let mut results = Vec::new();
        let (mut deferrable, mut chainable) = (0, 0);
        for mode in 0..3 {
            let args: Vec<V> = args
                .iter()
                .map(|a| match a {
                    V::Tensor(t) => V::Tensor(t.deep_clone()),
                    other => other.clone(),
                })
                .collect();
            let (k, a, grid) = prepared(&db, file, kernel, &args);
            let loads = if mode < 2 {
                DeferredLoads::of(&k)
            } else {
                DeferredLoads::none()
            };
            let loops = if mode == 0 {
                ChainedLoops::of(&k, &loads)
            } else {
                ChainedLoops::none()
            };
            if mode == 0 {
                deferrable = loads.len();
                chainable = loops.len();
            }
            run_grid_with(&k, &a, grid, &Interrupt::new(), &loads, &loops).unwrap();
            let V::Tensor(t) = &args[out] else {
                unreachable!()
            };
            results.push(t.to_f32_vec());
        }
        let none = results.pop().unwrap();
        let unchained = results.pop().unwrap();
        let chained = results.pop().unwrap();
        same_bits(&chained, &unchained);
        (chained, none, deferrable, chainable)
    }

    fn randn(shape: &[usize], d: DType, seed: u64) -> V {
        V::Tensor(rng::randn(shape, d, seed))
    }

    fn zeros(shape: &[usize]) -> V {
        V::Tensor(Tensor::zeros(shape, DType::F32))
    }

    fn same_bits(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert_eq!(x.to_bits(), y.to_bits(), "element {i}: {x} vs {y}");
        }
    }

    #[test]
    fn stdlib_gemms_with_edge_tiles() {
        // Sizes that are not multiples of the tiles: windows on both axes;
        // K = 300 makes chains deeper than one pass of the micro-kernel.
        for ((m, k, n), (kernel, d)) in [(150, 70, 90), (70, 300, 40)].into_iter().flat_map(|s| {
            [
                ("gemm_tf32", DType::F32),
                ("gemm", DType::F16),
                ("gemm_bf16", DType::BF16),
            ]
            .map(|kd| (s, kd))
        }) {
            let args = [randn(&[m, k], d, 1), randn(&[k, n], d, 2), zeros(&[m, n])];
            let (fast, slow, loads, loops) = both(kernel, &args, 2);
            assert_eq!(loads, 2, "{kernel}: both loads deferrable");
            assert_eq!(loops, 1, "{kernel}: the K loop chainable");
            same_bits(&fast, &slow);
            assert!(fast.iter().any(|x| *x != 0.0));
        }
    }

    /// A kernel that writes A between two K loops over it: packed copies of
    /// A must not outlive the store (only B's may be kept).
    #[test]
    fn packed_operands_of_written_tensors_are_not_kept() {
        let args = [
            randn(&[16, 32], DType::F32, 9),
            randn(&[32, 16], DType::F32, 10),
            zeros(&[16, 16]),
        ];
        let (fast, slow, loads, loops) = both("rewrites_a", &args, 2);
        assert_eq!((loads, loops), (4, 2));
        same_bits(&fast, &slow);
        // The second product really read the rewritten A.
        let (mut first, _, _, _) = both("rewrites_a", &args, 0);
        first.truncate(16);
        assert!(fast.iter().any(|x| *x != 0.0) && first.iter().any(|x| *x != 0.0));
    }

    #[test]
    fn non_contiguous_source_and_other() {
        let args = [
            randn(&[45, 37, 3], DType::F32, 3),
            randn(&[37, 50], DType::F32, 4),
            zeros(&[45, 50]),
        ];
        let (fast, slow, loads, loops) = both("strided", &args, 2);
        assert_eq!((loads, loops), (2, 1));
        same_bits(&fast, &slow);
    }

    #[test]
    fn masked_loads_fall_back_where_a_lane_is_off() {
        let args = [
            randn(&[70, 40], DType::F16, 5),
            randn(&[40, 33], DType::F16, 6),
            zeros(&[70, 33]),
        ];
        let (fast, slow, loads, loops) = both("masked", &args, 2);
        assert_eq!((loads, loops), (2, 1));
        same_bits(&fast, &slow);
    }

    #[test]
    fn a_load_read_by_other_ops_is_materialised() {
        let args = [
            randn(&[64, 64], DType::F32, 7),
            randn(&[64, 64], DType::F32, 8),
            zeros(&[64, 64]),
        ];
        let (fast, slow, loads, loops) = both("reused", &args, 2);
        // `a` is also multiplied by 2: only `b` is left to the dots, and
        // neither dot can be chained.
        assert_eq!((loads, loops), (1, 0));
        same_bits(&fast, &slow);
    }
}

/// The invariants the unsafe reads and writes of a launch rely on: accesses are
/// clipped to the tensor whatever the kernel computes, and a tensor's storage
/// holds its shape's elements.
#[cfg(test)]
mod bounds_tests {
    use super::deferred::DeferredLoads;
    use super::*;
    use crate::db::Database;
    use crate::exec::launch::prepared;
    use crate::exec::Value as V;

    const SRC: &str = r#"
@kernel(grid=(3,))
def shifted(x: Tensor["N", f32], y: Tensor["R", "C", i32], shift: i64, BLOCK: const = 8):
    i = program_id(0) * BLOCK + shift
    v = load(x[i : i + BLOCK], other=5.0)
    store(x[i : i + BLOCK], v + 1.0)
    atomic_add(x[i : i + BLOCK], v)
    r = program_id(0) + shift + 4
    t = load(y[r : r + 2, i : i + BLOCK], other=7)
    store(y[r : r + 2, i : i + BLOCK], t + 1)

@kernel(grid=(1,))
def mm(a: Tensor[16, 16, f32], b: Tensor[16, 16, f32], c: Tensor[16, 16, f32], shift: i64):
    x = load(a[shift : shift + 16, 0 : 16])
    y = load(b[0 : 16, shift : shift + 16])
    store(c[0 : 16, 0 : 16], dot(x, y))
"#;

    fn run(shift: i64) -> (Vec<f64>, Vec<f64>) {
        let mut db = Database::new();
        let file = db.set_source("/bounds_tests.tsr", SRC.into());
        let x = Tensor::zeros(&[10], DType::F32);
        let y = Tensor::zeros(&[3, 10], DType::I32);
        let args = [V::Tensor(x.clone()), V::Tensor(y.clone()), V::Int(shift)];
        let (k, a, grid) = prepared(&db, file, "shifted", &args);
        run_grid(&k, &a, grid, &Interrupt::new()).unwrap();
        (x.to_f64_vec(), y.to_f64_vec())
    }

    /// Windows that start before, straddle or lie far past the tensor (up to
    /// the ends of i64) touch only its elements: the reads and writes outside
    /// are clipped (the kernel's arithmetic wraps, the clipping saturates).
    #[test]
    fn accesses_outside_the_tensor_are_clipped() {
        let (x, y) = run(-4);
        // Programs cover -4..20: elements 0..10 are written once, `2 * 0 + 1`.
        assert_eq!(x, vec![1.0; 10]);
        assert_eq!(y.iter().filter(|&&v| v != 0.0).count(), 20, "{y:?}");
        for shift in [
            i64::MIN,
            i64::MIN + 3,
            -1 << 40,
            1 << 40,
            i64::MAX - 3,
            i64::MAX,
        ] {
            let (x, y) = run(shift);
            assert_eq!(x, vec![0.0; 10], "shift {shift}");
            assert_eq!(y, vec![0.0; 30], "shift {shift}");
        }
    }

    /// Loads read by a `dot` straight from tensor memory (deferred) are
    /// clipped too, wherever their windows start.
    #[test]
    fn deferred_loads_outside_the_tensor_read_their_fill() {
        let mut db = Database::new();
        let file = db.set_source("/bounds_tests.tsr", SRC.into());
        let ones = Tensor::full(&[16, 16], DType::F32, 1.0);
        for shift in [0, 8, -8, 1 << 40, -1 << 40, i64::MIN, i64::MAX - 3] {
            let c = Tensor::zeros(&[16, 16], DType::F32);
            let args = [
                V::Tensor(ones.clone()),
                V::Tensor(ones.clone()),
                V::Tensor(c.clone()),
                V::Int(shift),
            ];
            let (k, a, grid) = prepared(&db, file, "mm", &args);
            assert_eq!(DeferredLoads::of(&k).len(), 2, "both loads are deferred");
            run_grid(&k, &a, grid, &Interrupt::new()).unwrap();
            // c[i, j] is 16 where row i of the `a` window and column j of the
            // `b` window are in the tensor, else 0.
            let inside = |p: i64| (0..16).contains(&(p as i128 + shift as i128));
            let want: Vec<f64> = (0..256)
                .map(|e| {
                    if inside(e / 16) && inside(e % 16) {
                        16.0
                    } else {
                        0.0
                    }
                })
                .collect();
            assert_eq!(c.to_f64_vec(), want, "shift {shift}");
        }
    }

    /// The old segfault: a tensor whose shape claims more elements than its
    /// storage holds cannot be made (the shape's size is checked, a view must
    /// keep the element count), so a launch never addresses past a buffer.
    #[test]
    fn a_shape_bigger_than_its_storage_cannot_be_made() {
        let empty = Tensor::zeros(&[0], DType::F32);
        // 2^32 * 2^32 wraps to 0 in unchecked arithmetic: the count of `empty`.
        assert!(empty.view(&[1 << 32, 1 << 32]).is_none());
        assert_eq!(
            Tensor::try_zeros(&[1 << 32, 1 << 32], DType::F32, &Interrupt::new())
                .unwrap_err()
                .code,
            "E0712"
        );
        let r = std::panic::catch_unwind(|| {
            Tensor::from_data(
                &[1 << 32, 1 << 32],
                DType::F32,
                super::super::tensor::Data::F32(vec![]),
            )
        });
        assert!(r.is_err(), "a tensor over storage of another size");
    }

    /// Grids past CUDA's limits are refused before any program runs (a grid
    /// of 2^63 - 1 programs used to run for ever).
    #[test]
    fn grids_are_bounded() {
        let mut db = Database::new();
        let file = db.set_source("/bounds_tests.tsr", SRC.into());
        let x = Tensor::zeros(&[10], DType::F32);
        let y = Tensor::zeros(&[3, 10], DType::I32);
        let args = [V::Tensor(x.clone()), V::Tensor(y), V::Int(0)];
        let (k, a, _) = prepared(&db, file, "shifted", &args);
        for grid in [
            [i64::MAX, 1, 1],
            [1 << 31, 1, 1],
            [1, 65536, 1],
            [1, 1, 65536],
            [-1, 1, 1],
        ] {
            let e = run_grid(&k, &a, grid, &Interrupt::new()).unwrap_err();
            assert_eq!(e.code, "E0703", "{grid:?}: {e}");
        }
        // A 0 dim is a launch of no programs (work on an empty tensor).
        run_grid(&k, &a, [0, 1, 1], &Interrupt::new()).unwrap();
        assert_eq!(x.to_f64_vec(), vec![0.0; 10]);
        run_grid(&k, &a, [1, 1, 65535], &Interrupt::new()).unwrap();
    }
}
