//! Schedule IR: the launch plan of one whole-tensor function.
//!
//! Lowered from Graph IR. It holds the buffers (inputs, outputs, temporaries and
//! views, each with symbolic dims and a dtype) and an ordered list of [`Step`]s:
//! kernel launches, host steps (`randn` fills a buffer on the host, `data`
//! writes a `tensor` literal's numbers, `set $v = e` sets a host variable) and structured control flow (`if`, `for`, `while`,
//! whose bodies are step lists). Host scalars are [`ScalarExpr`]s over function
//! parameters, dims, constants and host variables (`$name`: loop counters,
//! values carried by loops, results of `if`). Each launch runs one fusion group
//! of graph nodes with a kernel:
//!
//! * a maximal group of elementwise ops (unary, binary with broadcasting, casts,
//!   `where`, activations, `zeros`/`ones`/`full` as sources) whose inner nodes are
//!   used only inside the group becomes ONE generated kernel, built directly as Tile IR: the group's
//!   shape is viewed as `[R, C]` (C the last dim, R the product of the others), one
//!   program computes a `[BR, BC]` tile, and each input is loaded as a full tile, a
//!   row vector (`[C]`, broadcast down), a column (`[R]`, keepdims results, broadcast
//!   across) or a single element; scalars are kernel parameters or constants. Inputs
//!   broadcast along leading axes (`[N, M]` against `[B, H, N, M]`) switch the group
//!   to a kernel indexing every axis (`fused_nd`): any numpy broadcast is covered;
//! * `matmul` → `std.linalg` `gemm` (f16), `gemm_bf16`, `gemm_tf32` (f32 inputs:
//!   the only f32 gemm of the stdlib, so the launch records that it multiplies at
//!   tf32 precision) or `gemm_batched` (f16, batch dims equal, flattened): these write an f32 `C`;
//!   a narrower result dtype is a cast done by the consumer's fused kernel; a
//!   matmul no stdlib gemm covers (bf16/f32 with batch dims, broadcast batch dims)
//!   is a generated gemm (64 x 64 tiles, a K loop of `dot` in f32, batch indices
//!   per program);
//! * `softmax` (last axis, f32) → `std.nn` `softmax_rows` (the row fits 1024) or
//!   `softmax_rows_online`; over another axis or of another float dtype, a
//!   generated kernel (three loops over the axis: max, sum, normalise);
//!   `layer_norm`/`rms_norm` of f32 with f32 weights → `layer_norm_rows`/`rms_norm_rows`
//!   (the row must fit the kernel's BLOCK of 1024: recorded as a requirement when
//!   the row length is symbolic); other dtypes, missing weights or longer rows, a
//!   generated kernel (one program per row looping over it: mean, variance of the
//!   in-bounds lanes, normalise);
//!   `sum`/`max`/`mean` of f32 over the last axis → `std.reduce` `*_rows`; every
//!   other reduction (any axis, all axes, `min`, other dtypes) is a generated
//!   kernel looping over the reduced extent;
//! * `matmul(softmax(matmul(q, transpose(k, -2, -1)) * s, dim=-1), v)` (bf16, rank
//!   4) → `std.attention` `flash_attn` with `scale = s`;
//! * `reshape` is a view (buffers are contiguous row-major), `empty` an allocation;
//! * kernel calls are launched as written, in program order.
//!
//! A generated kernel whose grid axis 1 could pass CUDA's 65535 (a run-time
//! count, or more than 65535 column tiles) is launched on a 1-D grid
//! `(X * Y, 1)` with a `grid_y` parameter: its programs split their id back
//! into `(pid / Y, pid % Y)`. A scalar result is written by a one-element
//! kernel into a rank-0 output buffer (`out (scalar)` in the dump).
//!
//! `transpose` of the last two axes is a generated kernel (32 x 32 tiles, the batch
//! on grid axis 2); transposes of other axes and subscripts (`x[i]`, `x[a:b, 2]`)
//! are a generated gather copy (a program copies a run of the result's last
//! axis, from whichever source axis it maps to; a run-time index out of range
//! reads zeros). Integer matmuls are the generated matmul accumulating exactly in
//! i32 (i64 for i64). `randn` is a host step (`randn BUF seed=S`, seed 0 when
//! omitted) writing its buffer; the numbers are the executor's.
//!
//! Control flow: a region (see [`crate::ir::graph::Region`]) lowers to its own
//! step list with its params bound to buffers or host scalars. Results of an
//! `if` and values carried by a loop live in fresh buffers and host variables:
//! a loop copies its initial values in before it, every branch or trip copies
//! its results in at its end (through temporaries when one result is read from
//! another's place, as in `a, b = b, a`). A call that stays in the graph (a
//! recursive one) is a `call` step running the callee's own schedule; one with
//! const arguments or without a tensor result is a [`LowerError`] (E0512 at
//! `tsrc emit`).
//!
//! The dump lists the buffers, the steps in order (launches with kernel, grid,
//! graph nodes, arguments with the view each kernel sees, requirements; host
//! steps; regions indented three more) and the outputs, then every generated
//! kernel in the Tile IR dump format. `verify` checks buffers, views,
//! write-before-read (through regions: after an `if`, what both branches write;
//! after a loop, what was written before it), host variables set before they
//! are read and arguments, and runs the Tile IR verifier on every generated
//! kernel.

use std::collections::HashMap;
use std::fmt::{self, Write};

use crate::check::dims::Dim;
use crate::check::DType;
use crate::ir::graph::{
    binary_name, render_constant, Activation, Fill, GType, Graph, LowerError, NodeId, NodeKind,
    ReduceKind, Region as GRegion, SliceAxis,
};
use crate::ir::tile::{
    self, Access, BinaryOp, Constant, Kernel, Op, OpKind, ParamKind, Region, Type, UnaryOp, Value,
};
use crate::syntax::span::Span;

mod generate;
use generate::{Group, SrcAxis};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u32);

#[derive(Clone, Debug, PartialEq)]
pub enum BufKind {
    /// Tensor parameter `i` of the function.
    Input(usize),
    /// Result `i` of the function.
    Output(usize),
    Temp,
    /// The same memory as another buffer, with other dims (same element count).
    View(BufId),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    pub name: String,
    pub kind: BufKind,
    pub dims: Vec<Dim>,
    pub dtype: DType,
    /// Allocated uninitialised by `empty` (and written, if at all, by kernel calls).
    pub alloc: bool,
}

/// A scalar computed on the host at launch time.
#[derive(Clone, Debug, PartialEq)]
pub enum ScalarExpr {
    Param(String),
    /// A dim or other integer known when the function is specialised.
    Index(Dim),
    Const(Constant),
    Unary(UnaryOp, Box<ScalarExpr>),
    Binary(BinaryOp, Box<ScalarExpr>, Box<ScalarExpr>),
    Cast(Box<ScalarExpr>, DType),
    /// `cdiv(a, k)`.
    CDiv(Box<ScalarExpr>, i64),
    /// A host variable (set by a `SetVar` step or a `For` step's counter),
    /// dumped `$name`.
    Var(String),
}

impl fmt::Display for ScalarExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScalarExpr::Param(p) => f.write_str(p),
            ScalarExpr::Index(d) => write!(f, "{d}"),
            ScalarExpr::Const(c) => f.write_str(&render_constant(c)),
            ScalarExpr::Unary(op, x) => write!(f, "{}({x})", op.name()),
            ScalarExpr::Binary(op, a, b) => write!(f, "{}({a}, {b})", binary_name(*op)),
            ScalarExpr::Cast(x, d) => write!(f, "{d}({x})"),
            ScalarExpr::CDiv(x, k) => write!(f, "cdiv({x}, {k})"),
            ScalarExpr::Var(v) => write!(f, "${v}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum KernelRef {
    /// A kernel of the standard library: module path and name.
    Std {
        module: &'static str,
        name: &'static str,
    },
    /// A user kernel called by name, with its decorator's options.
    User(String),
    /// `Schedule::kernels[i]`.
    Generated(usize),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// A buffer passed with the dims the kernel sees (a view of it).
    Buffer {
        buf: BufId,
        dims: Vec<Dim>,
    },
    Scalar(ScalarExpr),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: KernelRef,
    /// The graph nodes this launch computes.
    pub nodes: Vec<NodeId>,
    /// `None`: the kernel's decorator grid, evaluated with the bound dims.
    pub grid: Option<Vec<ScalarExpr>>,
    /// Arguments by parameter name, in the kernel's parameter order.
    pub args: Vec<(String, Arg)>,
    /// Const parameters set by the launch (others keep their defaults).
    pub consts: Vec<(String, String)>,
    /// Facts the launch relies on that are not proven at compile time (`N <= 1024`).
    pub requires: Vec<String>,
    /// Buffers the launch writes.
    pub writes: Vec<BufId>,
}

/// One step of the plan; steps run in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Launch(Launch),
    /// Fills `buf` (every element, in its dtype) with standard-normal samples
    /// drawn on the host: deterministic per `seed` (an integer host scalar; 0
    /// when `randn` is given none). Dumped `randn buf seed=S nodes=[%i]`.
    HostRandn {
        buf: BufId,
        seed: ScalarExpr,
        node: NodeId,
    },
    /// A call of another whole-tensor function that is not inlined (a recursive
    /// one): runs `func`'s own schedule (the function of that name in the same
    /// module) with `args` by parameter name, in its parameter order (its dims
    /// bind to the argument buffers' dims), and writes its result into `out`.
    /// Dumped `call f(x=t0, n=sub(n, 1)) -> t1`.
    Call {
        func: String,
        node: NodeId,
        args: Vec<(String, Arg)>,
        out: BufId,
    },
    /// Fills `buf` on the host with constants in row-major order (a `tensor`
    /// literal; dumped `data BUF [1.0, 2.0]`).
    HostData {
        buf: BufId,
        values: Vec<Constant>,
        node: NodeId,
    },
    /// Sets host variable `var` (dumped `set $var = value`).
    SetVar {
        var: String,
        value: ScalarExpr,
    },
    /// Runs `then` when the bool host scalar `cond` is true, else `otherwise`.
    If {
        cond: ScalarExpr,
        then: Vec<Step>,
        otherwise: Vec<Step>,
    },
    /// `for $var in range(lo, hi, step)` (Python's `range`, `step` non-zero; i32
    /// host scalars): `body` runs once per value with `$var` set to it.
    For {
        var: String,
        lo: ScalarExpr,
        hi: ScalarExpr,
        step: ScalarExpr,
        body: Vec<Step>,
    },
    /// Runs `cond`, then while the bool `test` (which `cond` sets) is true,
    /// `body` and `cond` again.
    While {
        cond: Vec<Step>,
        test: ScalarExpr,
        body: Vec<Step>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub name: String,
    pub buffers: Vec<Buffer>,
    pub steps: Vec<Step>,
    /// Generated kernels (fusion groups), in Tile IR.
    pub kernels: Vec<Kernel>,
    pub outputs: Vec<BufId>,
    /// Per output: the function returns it as a scalar (its buffer holds the
    /// one element, rank 0), not as a rank-0 tensor.
    pub scalar_outputs: Vec<bool>,
}

impl Schedule {
    /// The kernel launches among the steps (regions included), in program order.
    pub fn launches(&self) -> impl Iterator<Item = &Launch> {
        fn collect<'s>(steps: &'s [Step], out: &mut Vec<&'s Launch>) {
            for s in steps {
                match s {
                    Step::Launch(l) => out.push(l),
                    Step::If {
                        then, otherwise, ..
                    } => {
                        collect(then, out);
                        collect(otherwise, out);
                    }
                    Step::For { body, .. } => collect(body, out),
                    Step::While { cond, body, .. } => {
                        collect(cond, out);
                        collect(body, out);
                    }
                    Step::HostRandn { .. }
                    | Step::HostData { .. }
                    | Step::SetVar { .. }
                    | Step::Call { .. } => {}
                }
            }
        }
        let mut out = Vec::new();
        collect(&self.steps, &mut out);
        out.into_iter()
    }

    pub fn buffer(&self, b: BufId) -> &Buffer {
        &self.buffers[b.0 as usize]
    }

    /// The buffer owning the memory of `b` (through views).
    pub fn base(&self, mut b: BufId) -> BufId {
        let mut steps = 0;
        while let BufKind::View(of) = self.buffer(b).kind {
            b = of;
            steps += 1;
            if steps > self.buffers.len() {
                break;
            }
        }
        b
    }
}

type R<T> = Result<T, LowerError>;

/// `cdiv(d, k)`, folded when `d` is a constant.
fn cdiv(d: &Dim, k: i64) -> ScalarExpr {
    match d.as_const() {
        Some(c) => ScalarExpr::Index(Dim::constant((c + k - 1).div_euclid(k))),
        None => ScalarExpr::CDiv(Box::new(ScalarExpr::Index(d.clone())), k),
    }
}

/// How a fused kernel reads one input over its `[R, C]` domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Pattern {
    Full,
    Row,
    Col,
    One,
}

/// Row kernels hold a row in one tile of this many elements (their BLOCK default).
const ROW_BLOCK: i64 = 1024;

struct Lower<'g> {
    g: &'g Graph,
    uses: Vec<u32>,
    consumers: Vec<Vec<NodeId>>,
    buffers: Vec<Buffer>,
    buf_of: HashMap<NodeId, BufId>,
    steps: Vec<Step>,
    kernels: Vec<Kernel>,
    temps: usize,
    cast_of: HashMap<NodeId, BufId>,
    f32_of: HashMap<NodeId, BufId>,
    /// Host scalars of nodes bound from outside the graph (region params,
    /// results of control flow): host variables.
    scalar_of: HashMap<NodeId, ScalarExpr>,
    /// Host variables made so far (for fresh names).
    vars: usize,
}

/// A matched attention pattern: (q, k, v, scale, absorbed nodes).
type Attention = (NodeId, NodeId, NodeId, ScalarExpr, Vec<NodeId>);

fn product(dims: &[Dim]) -> Option<Dim> {
    dims.iter()
        .try_fold(Dim::constant(1), |acc, d| acc.checked_mul(d))
}

fn is_elementwise(g: &Graph, n: NodeId) -> bool {
    let node = g.node(n);
    node.ty.is_tensor()
        && matches!(
            node.kind,
            NodeKind::Unary { .. }
                | NodeKind::Activation { .. }
                | NodeKind::Binary { .. }
                | NodeKind::Select { .. }
                | NodeKind::Cast { .. }
                | NodeKind::Fill(Fill::Zeros | Fill::Ones | Fill::Full(_))
        )
}

fn constant_of(dtype: DType, c: &Constant) -> Constant {
    let f = match c {
        Constant::Int(i) => *i as f64,
        Constant::Float(x) => *x,
        Constant::Bool(b) => *b as i64 as f64,
    };
    if dtype == DType::Bool {
        Constant::Bool(f != 0.0)
    } else if dtype.is_float() {
        Constant::Float(f)
    } else {
        Constant::Int(f as i64)
    }
}

fn zero_of(dtype: DType) -> Constant {
    constant_of(dtype, &Constant::Int(0))
}

impl<'g> Lower<'g> {
    fn span(&self, n: NodeId) -> Span {
        self.g.node(n).span
    }

    fn unsupported(&self, n: NodeId, what: impl Into<String>) -> LowerError {
        LowerError::new(self.span(n), what)
    }

    fn add_buffer(&mut self, name: String, kind: BufKind, dims: Vec<Dim>, dtype: DType) -> BufId {
        let id = BufId(self.buffers.len() as u32);
        self.buffers.push(Buffer {
            name,
            kind,
            dims,
            dtype,
            alloc: false,
        });
        id
    }

    fn temp(&mut self, dims: Vec<Dim>, dtype: DType) -> BufId {
        let name = format!("t{}", self.temps);
        self.temps += 1;
        self.add_buffer(name, BufKind::Temp, dims, dtype)
    }

    /// A buffer holding a tensor node's value in the node's dtype: a matmul's f32
    /// result for a narrower matmul is cast by a copy kernel (once per node).
    fn buf_as(&mut self, n: NodeId, user: NodeId) -> R<BufId> {
        let b = self.buf(n, user)?;
        let want = self.g.ty(n).dtype();
        if Some(self.buffers[b.0 as usize].dtype) == want {
            return Ok(b);
        }
        if let Some(c) = self.cast_of.get(&n) {
            return Ok(*c);
        }
        let t = self.temp(self.g.ty(n).dims().to_vec(), want.unwrap_or(DType::F32));
        self.fused(
            &Group {
                members: vec![],
                root: n,
                copy: true,
            },
            t,
        )?;
        self.cast_of.insert(n, t);
        Ok(t)
    }

    /// A buffer holding a float node's value as f32: a copy when its dtype is
    /// narrower (one kernel, also when the value sits in an f32 buffer: the copy
    /// rounds it to the node's dtype first, as the program says).
    fn buf_f32(&mut self, n: NodeId, user: NodeId) -> R<BufId> {
        let b = self.buf(n, user)?;
        if self.buffers[b.0 as usize].dtype == DType::F32
            && self.g.ty(n).dtype() == Some(DType::F32)
        {
            return Ok(b);
        }
        if let Some(c) = self.f32_of.get(&n) {
            return Ok(*c);
        }
        let t = self.temp(self.g.ty(n).dims().to_vec(), DType::F32);
        self.fused(
            &Group {
                members: vec![],
                root: n,
                copy: true,
            },
            t,
        )?;
        self.f32_of.insert(n, t);
        Ok(t)
    }

    /// The buffer holding a tensor node's value.
    fn buf(&self, n: NodeId, user: NodeId) -> R<BufId> {
        self.buf_of.get(&n).copied().ok_or_else(|| {
            self.unsupported(user, "an operand that is not materialised in a buffer")
        })
    }

    fn scalar(&self, n: NodeId) -> R<ScalarExpr> {
        if let Some(e) = self.scalar_of.get(&n) {
            return Ok(e.clone());
        }
        let node = self.g.node(n);
        if !node.ty.is_scalar() {
            return Err(self.unsupported(n, "a tensor where a scalar is needed"));
        }
        Ok(match &node.kind {
            NodeKind::Param(p) => ScalarExpr::Param(self.g.params[*p].name.clone()),
            NodeKind::Const(c) => ScalarExpr::Const(*c),
            NodeKind::Index(d) => ScalarExpr::Index(d.clone()),
            NodeKind::Unary { op, x } => {
                ScalarExpr::Unary(*op, Box::new(self.scalar_as(*x, node.ty.dtype())?))
            }
            NodeKind::Binary { op, a, b } => {
                // Operands in one dtype: the result's, or for comparisons the
                // wider of the two.
                let (da, db) = (self.g.ty(*a).dtype(), self.g.ty(*b).dtype());
                let want = if op.is_comparison() {
                    match (da, db) {
                        (Some(x), Some(y)) => DType::join(x, y).or(Some(x)),
                        _ => da,
                    }
                } else {
                    node.ty.dtype()
                };
                ScalarExpr::Binary(
                    *op,
                    Box::new(self.scalar_as(*a, want)?),
                    Box::new(self.scalar_as(*b, want)?),
                )
            }
            NodeKind::Cast { x, to } => ScalarExpr::Cast(Box::new(self.scalar(*x)?), *to),
            // As the fused kernels compute them, on one value.
            NodeKind::Activation { act, x } => {
                let x = self.scalar_as(*x, node.ty.dtype())?;
                let f = |v: f64| Box::new(ScalarExpr::Const(Constant::Float(v)));
                let bin = |op, a: Box<ScalarExpr>, b: Box<ScalarExpr>| {
                    Box::new(ScalarExpr::Binary(op, a, b))
                };
                let x = Box::new(x);
                match act {
                    Activation::Relu => ScalarExpr::Binary(BinaryOp::Max, x, f(0.0)),
                    Activation::Silu => {
                        let s = Box::new(ScalarExpr::Unary(UnaryOp::Sigmoid, x.clone()));
                        ScalarExpr::Binary(BinaryOp::Mul, x, s)
                    }
                    Activation::Gelu => {
                        let t = bin(BinaryOp::Mul, x.clone(), f(std::f64::consts::FRAC_1_SQRT_2));
                        let e = bin(
                            BinaryOp::Add,
                            f(1.0),
                            Box::new(ScalarExpr::Unary(UnaryOp::Erf, t)),
                        );
                        ScalarExpr::Binary(BinaryOp::Mul, bin(BinaryOp::Mul, f(0.5), x), e)
                    }
                }
            }
            _ => return Err(self.unsupported(n, "this scalar operation on the host")),
        })
    }

    /// A host scalar converted to `want` when its own dtype differs, so that
    /// every host operation has operands of one dtype (`rsqrt(f32(D))`).
    fn scalar_as(&self, n: NodeId, want: Option<DType>) -> R<ScalarExpr> {
        let e = self.scalar(n)?;
        Ok(match (want, self.g.ty(n).dtype()) {
            (Some(w), Some(d)) if w != d => match e {
                ScalarExpr::Const(c) => ScalarExpr::Const(constant_of(w, &c)),
                e => ScalarExpr::Cast(Box::new(e), w),
            },
            _ => e,
        })
    }

    /// `[R, C]`: the product of the leading dims and the last dim (`[1, 1]`
    /// for a rank-0 tensor: one row of one element).
    fn rows_cols(&self, dims: &[Dim], n: NodeId) -> R<(Dim, Dim)> {
        let Some((last, lead)) = dims.split_last() else {
            return Ok((Dim::constant(1), Dim::constant(1)));
        };
        let r = product(lead).ok_or_else(|| self.unsupported(n, "a dim product that overflows"))?;
        Ok((r, last.clone()))
    }

    fn launch(&mut self, mut l: Launch) {
        self.columns_on_x(&mut l);
        self.flatten_grid(&mut l);
        self.steps.push(Step::Launch(l));
    }

    /// A generated kernel whose grid axis 1 may pass CUDA's 65535 (a run-time
    /// count, or a constant above it: column tiles of a tensor wider than 8.4M)
    /// is launched on a 1-D grid `(X * Y, 1)`: each program splits its id back
    /// into `(pid / Y, pid % Y)`, so any grid of up to 2^31 - 1 programs runs.
    fn flatten_grid(&mut self, l: &mut Launch) {
        let KernelRef::Generated(k) = l.kernel else {
            return;
        };
        let Some(grid) = l.grid.as_mut() else { return };
        let small = |e: &ScalarExpr| matches!(e, ScalarExpr::Index(d) if d.as_const().is_some_and(|c| c <= 65535));
        if grid.len() != 2 || small(&grid[1]) || k + 1 != self.kernels.len() {
            return;
        }
        let kernel = &mut self.kernels[k];
        // The split needs the grid's extents inside the kernel only for
        // `program_id`; a kernel reading `num_programs` keeps its grid.
        let mut stack = vec![&kernel.body];
        while let Some(r) = stack.pop() {
            for op in &r.ops {
                if matches!(op.kind, OpKind::NumPrograms(_)) {
                    return;
                }
                stack.extend(op.kind.regions());
            }
        }
        let i32t = Type::Scalar(DType::I32);
        let fresh = |types: &mut Vec<Type>| {
            types.push(i32t.clone());
            Value(types.len() as u32 - 1)
        };
        let pid = fresh(&mut kernel.types);
        let ny = fresh(&mut kernel.types);
        let idx = kernel.params.len();
        kernel.params.push(tile::Param {
            name: "grid_y".into(),
            kind: ParamKind::Scalar(DType::I32),
        });
        l.args.push(("grid_y".into(), Arg::Scalar(grid[1].clone())));
        let mut stack = vec![&mut kernel.body];
        while let Some(r) = stack.pop() {
            for op in &mut r.ops {
                match op.kind {
                    OpKind::ProgramId(0) => {
                        op.kind = OpKind::Binary {
                            op: BinaryOp::FloorDiv,
                            a: pid,
                            b: ny,
                        }
                    }
                    OpKind::ProgramId(1) => {
                        op.kind = OpKind::Binary {
                            op: BinaryOp::Mod,
                            a: pid,
                            b: ny,
                        }
                    }
                    _ => {}
                }
                stack.extend(op.kind.regions_mut());
            }
        }
        let span = kernel.body.ops.first().map(|o| o.span).unwrap_or_default();
        kernel.body.ops.splice(
            0..0,
            [
                Op {
                    results: vec![pid],
                    kind: OpKind::ProgramId(0),
                    span,
                },
                Op {
                    results: vec![ny],
                    kind: OpKind::ScalarParam(idx),
                    span,
                },
            ],
        );
        let y = std::mem::replace(&mut grid[1], ScalarExpr::Index(Dim::constant(1)));
        grid[0] = ScalarExpr::Binary(BinaryOp::Mul, Box::new(grid[0].clone()), Box::new(y));
    }

    /// A grid may have 2^31 - 1 programs on axis 0 but only 65535 on axis 1
    /// (CUDA's limits, checked at every launch): a generated kernel over a
    /// single row of tiles, grid `(1, cdiv(N, BLOCK))`, is launched as
    /// `(cdiv(N, BLOCK), 1)` with its program ids swapped, so a 1-D tensor of
    /// more than 65535 blocks (8.4M elements) still runs.
    fn columns_on_x(&mut self, l: &mut Launch) {
        let KernelRef::Generated(k) = l.kernel else {
            return;
        };
        let Some(grid) = l.grid.as_mut() else { return };
        let one_row = matches!(&grid[..], [ScalarExpr::Index(d), _] if d.as_const() == Some(1));
        // Only a kernel made for this launch alone (the one just generated).
        if !one_row || k + 1 != self.kernels.len() {
            return;
        }
        grid.swap(0, 1);
        let mut stack = vec![&mut self.kernels[k].body];
        while let Some(r) = stack.pop() {
            for op in &mut r.ops {
                if let OpKind::ProgramId(a) | OpKind::NumPrograms(a) = &mut op.kind {
                    if *a < 2 {
                        *a = 1 - *a;
                    }
                }
                stack.extend(op.kind.regions_mut());
            }
        }
    }

    /// Matches `matmul(softmax(matmul(q, transpose(k, -2, -1)) * s, dim=-1), v)`:
    /// returns (q, k, v, scale, absorbed nodes).
    fn attention(&self, n: NodeId) -> Option<Attention> {
        let g = self.g;
        let single = |x: NodeId| self.uses[x.0 as usize] == 1;
        let NodeKind::MatMul { a: sm, b: v, .. } = g.node(n).kind else {
            return None;
        };
        let NodeKind::Softmax { x: scaled, axis } = g.node(sm).kind else {
            return None;
        };
        if axis != 3 || !single(sm) {
            return None;
        }
        let (scores, scale) = match g.node(scaled).kind {
            NodeKind::Binary {
                op: BinaryOp::Mul,
                a,
                b,
            } if g.ty(b).is_scalar() => (a, self.scalar(b).ok()?),
            NodeKind::Binary {
                op: BinaryOp::Mul,
                a,
                b,
            } if g.ty(a).is_scalar() => (b, self.scalar(a).ok()?),
            NodeKind::Binary {
                op: BinaryOp::Div,
                a,
                b,
            } if g.ty(b).is_scalar() => (
                a,
                ScalarExpr::Binary(
                    BinaryOp::Div,
                    Box::new(ScalarExpr::Const(Constant::Float(1.0))),
                    Box::new(self.scalar(b).ok()?),
                ),
            ),
            _ => return None,
        };
        if !single(scaled) || !single(scores) {
            return None;
        }
        let NodeKind::MatMul { a: q, b: kt, .. } = g.node(scores).kind else {
            return None;
        };
        let (NodeKind::Transpose { x: k, a: 2, b: 3 } | NodeKind::Transpose { x: k, a: 3, b: 2 }) =
            g.node(kt).kind
        else {
            return None;
        };
        if !single(kt) {
            return None;
        }
        let qt = g.ty(q);
        let bf16_4d = |t: &GType| t.dtype() == Some(DType::BF16) && t.dims().len() == 4;
        if !bf16_4d(qt) || g.ty(k) != qt || g.ty(v) != qt || g.ty(n) != qt {
            return None;
        }
        if g.ty(scaled).dtype() != Some(DType::BF16) {
            return None;
        }
        Some((q, k, v, scale, vec![kt, scores, scaled, sm]))
    }

    fn arg_buf(&self, buf: BufId, dims: Vec<Dim>) -> Arg {
        Arg::Buffer { buf, dims }
    }

    fn lower_matmul(&mut self, n: NodeId, out: Option<BufId>) -> R<()> {
        let g = self.g;
        let NodeKind::MatMul { a, b, tf32 } = g.node(n).kind else {
            unreachable!("a matmul")
        };
        let dn = g.ty(n).dims();
        // numpy's 1-D operands: a row `[1, K]` on the left, a column `[K, 1]` on the right.
        let mut da = g.ty(a).dims().to_vec();
        if da.len() == 1 {
            da.insert(0, Dim::constant(1));
        }
        let mut db = g.ty(b).dims().to_vec();
        if db.len() == 1 {
            db.push(Dim::constant(1));
        }
        let (ba, bb) = (self.buf_as(a, n)?, self.buf_as(b, n)?);
        let dt = g.ty(a).dtype().unwrap_or(DType::F32);
        let overflow = || self.unsupported(n, "a dim product that overflows");
        // A right operand without batch dims: the left one's rows are all one `M`
        // (contiguous), so a plain gemm does it.
        let flat = db.len() == 2;
        let m = if flat {
            product(&da[..da.len() - 1]).ok_or_else(overflow)?
        } else {
            da[da.len() - 2].clone()
        };
        let (k, nn) = (da[da.len() - 1].clone(), db[db.len() - 1].clone());
        let acc = generate::acc_dtype(g.ty(n).dtype().unwrap_or(DType::F32));
        let c = match out {
            Some(o) if g.ty(n).dtype() == Some(acc) => o,
            _ => self.temp(dn.to_vec(), acc),
        };
        let (name, batched): (&'static str, bool) = match (dt, flat, da.len(), db.len()) {
            (DType::F16, true, _, _) => ("gemm", false),
            (DType::BF16, true, _, _) => ("gemm_bf16", false),
            // Full f32 unless tf32 was asked for: the generated gemm's `dot`
            // at ieee precision (FMA units), not `gemm_tf32`'s tensor cores.
            (DType::F32, true, _, _) if tf32 => ("gemm_tf32", false),
            (DType::F16, false, ra, rb) if ra == rb && da[..ra - 2] == db[..rb - 2] => {
                ("gemm_batched", true)
            }
            (d, ..)
                if (d.is_float() && g.ty(b).dtype().is_some_and(DType::is_float))
                    || (d.is_int() && g.ty(b).dtype().is_some_and(DType::is_int)) =>
            {
                self.matmul_generated(n, &da, &db, ba, bb, c)?;
                self.buf_of.insert(n, c);
                return Ok(());
            }
            _ => {
                return Err(self.unsupported(
                    n,
                    format!(
                        "matmul of {} x {} (tensor cores multiply floats)",
                        g.ty(a),
                        g.ty(b)
                    ),
                ))
            }
        };
        let (bm, bn) = if name == "gemm_tf32" {
            (128, 64)
        } else {
            (128, 128)
        };
        let mut grid = vec![cdiv(&m, bm), cdiv(&nn, bn)];
        let args = if batched {
            let z =
                product(&da[..da.len() - 2]).ok_or_else(|| self.unsupported(n, "batch dims"))?;
            grid.push(ScalarExpr::Index(z.clone()));
            vec![
                (
                    "A".to_string(),
                    self.arg_buf(ba, vec![z.clone(), m.clone(), k.clone()]),
                ),
                (
                    "B".to_string(),
                    self.arg_buf(bb, vec![z.clone(), k, nn.clone()]),
                ),
                ("C".to_string(), self.arg_buf(c, vec![z, m, nn])),
            ]
        } else {
            vec![
                (
                    "A".to_string(),
                    self.arg_buf(ba, vec![m.clone(), k.clone()]),
                ),
                ("B".to_string(), self.arg_buf(bb, vec![k, nn.clone()])),
                ("C".to_string(), self.arg_buf(c, vec![m, nn])),
            ]
        };
        self.launch(Launch {
            kernel: KernelRef::Std {
                module: "std.linalg",
                name,
            },
            nodes: vec![n],
            grid: Some(grid),
            args,
            consts: vec![],
            requires: if name == "gemm_tf32" {
                vec!["f32 inputs multiplied at tf32 precision (tensor cores, sm_80+)".to_string()]
            } else {
                vec![]
            },
            writes: vec![c],
        });
        self.buf_of.insert(n, c);
        Ok(())
    }

    /// A row kernel over the `[R, C]` view of `x`: softmax, norms, reductions.
    fn lower_rows(&mut self, n: NodeId, out: Option<BufId>) -> R<()> {
        let g = self.g;
        let node = g.node(n);
        let x = match node.kind {
            NodeKind::Softmax { x, .. }
            | NodeKind::LayerNorm { x, .. }
            | NodeKind::RmsNorm { x, .. }
            | NodeKind::Reduce { x, .. } => x,
            _ => unreachable!("a row op"),
        };
        let xdims = g.ty(x).dims().to_vec();
        let (r, c) = self.rows_cols(&xdims, n)?;
        if !g.ty(x).dtype().is_some_and(DType::is_float) {
            return Err(self.unsupported(
                n,
                format!("this op on `{}` (its stdlib row kernel is f32)", g.ty(x)),
            ));
        }
        // The row kernels are f32: other float dtypes go through cast copies, and
        // the result stays in an f32 buffer that its users read with a cast.
        let bx = self.buf_f32(x, n)?;
        let fits = c.as_const().map(|c| c <= ROW_BLOCK);
        let mut requires = Vec::new();
        let last = xdims.len() - 1;
        let (module, name, fits_needed): (&'static str, &'static str, bool) = match &node.kind {
            NodeKind::Softmax { axis, .. } if *axis == last => {
                if fits == Some(true) {
                    ("std.nn", "softmax_rows", true)
                } else {
                    ("std.nn", "softmax_rows_online", false)
                }
            }
            NodeKind::LayerNorm { .. } => ("std.nn", "layer_norm_rows", true),
            NodeKind::RmsNorm { .. } => ("std.nn", "rms_norm_rows", true),
            NodeKind::Reduce {
                op, axis: Some(a), ..
            } if *a == last => match op {
                ReduceKind::Sum => ("std.reduce", "sum_rows", false),
                ReduceKind::Max => ("std.reduce", "max_rows", false),
                ReduceKind::Mean => ("std.reduce", "mean_rows", false),
                ReduceKind::Min => {
                    return Err(self
                        .unsupported(n, "`min` over an axis (std.reduce has sum, max and mean)"))
                }
            },
            NodeKind::Softmax { .. } => {
                return Err(self.unsupported(n, "softmax over an axis other than the last"))
            }
            _ => {
                return Err(self.unsupported(
                    n,
                    "a reduction over all axes or over an axis other than the last",
                ))
            }
        };
        if fits_needed && fits != Some(true) {
            if fits == Some(false) {
                return Err(self.unsupported(
                    n,
                    format!("`{name}` holds a row in {ROW_BLOCK} elements; this row has {c}"),
                ));
            }
            requires.push(format!("{c} <= {ROW_BLOCK}"));
        }
        let reduce = matches!(node.kind, NodeKind::Reduce { .. });
        let ob = match out {
            Some(o) => o,
            None => self.temp(node.ty.dims().to_vec(), DType::F32),
        };
        let out_dims = if reduce {
            vec![r.clone()]
        } else {
            vec![r.clone(), c.clone()]
        };
        let mut args = vec![(
            "x".to_string(),
            self.arg_buf(bx, vec![r.clone(), c.clone()]),
        )];
        let vec_arg = |s: &mut Self, w: NodeId| -> R<Arg> {
            if g.ty(w).dims() != [c.clone()] {
                return Err(s.unsupported(w, format!("a weight `{}` that is not `[{c}]`", g.ty(w))));
            }
            let bw = s.buf_f32(w, n)?;
            if s.buffers[bw.0 as usize].dtype != DType::F32 {
                return Err(
                    s.unsupported(w, format!("a weight `{}` that is not `[{c}]` f32", g.ty(w)))
                );
            }
            Ok(s.arg_buf(bw, vec![c.clone()]))
        };
        let eps_arg = |s: &Self, e: Option<NodeId>, default: f64| -> R<Arg> {
            Ok(Arg::Scalar(match e {
                Some(e) => s.scalar(e)?,
                None => ScalarExpr::Const(Constant::Float(default)),
            }))
        };
        let mut tail = Vec::new();
        match node.kind {
            NodeKind::LayerNorm {
                weight, bias, eps, ..
            } => {
                let (Some(w), Some(b)) = (weight, bias) else {
                    return Err(self.unsupported(
                        n,
                        "layer_norm without weight and bias (layer_norm_rows takes both)",
                    ));
                };
                args.push(("weight".into(), vec_arg(self, w)?));
                args.push(("bias".into(), vec_arg(self, b)?));
                tail.push(("eps".to_string(), eps_arg(self, eps, 1e-5)?));
            }
            NodeKind::RmsNorm { weight, eps, .. } => {
                let Some(w) = weight else {
                    return Err(
                        self.unsupported(n, "rms_norm without weight (rms_norm_rows takes one)")
                    );
                };
                args.push(("weight".into(), vec_arg(self, w)?));
                tail.push(("eps".to_string(), eps_arg(self, eps, 1e-6)?));
            }
            _ => {}
        }
        args.push(("out".to_string(), self.arg_buf(ob, out_dims)));
        args.extend(tail);
        self.launch(Launch {
            kernel: KernelRef::Std { module, name },
            nodes: vec![n],
            grid: Some(vec![ScalarExpr::Index(r)]),
            args,
            consts: vec![],
            requires,
            writes: vec![ob],
        });
        self.buf_of.insert(n, ob);
        Ok(())
    }

    fn lower_attention(
        &mut self,
        n: NodeId,
        (q, k, v, scale, absorbed): Attention,
        out: Option<BufId>,
    ) -> R<()> {
        let dims = self.g.ty(n).dims().to_vec();
        let (bq, bk, bv) = (self.buf_as(q, n)?, self.buf_as(k, n)?, self.buf_as(v, n)?);
        let o = match out {
            Some(o) => o,
            None => self.temp(dims.clone(), DType::BF16),
        };
        let bh = dims[0]
            .checked_mul(&dims[1])
            .ok_or_else(|| self.unsupported(n, "batch dims"))?;
        let mut nodes = absorbed;
        nodes.push(n);
        let full = |b| Arg::Buffer {
            buf: b,
            dims: dims.clone(),
        };
        self.launch(Launch {
            kernel: KernelRef::Std {
                module: "std.attention",
                name: "flash_attn",
            },
            nodes,
            grid: Some(vec![cdiv(&dims[2], 128), ScalarExpr::Index(bh)]),
            args: vec![
                ("q".into(), full(bq)),
                ("k".into(), full(bk)),
                ("v".into(), full(bv)),
                ("o".into(), full(o)),
                ("scale".into(), Arg::Scalar(scale)),
            ],
            consts: vec![("causal".into(), "False".into())],
            requires: vec![],
            writes: vec![o],
        });
        self.buf_of.insert(n, o);
        Ok(())
    }
}

/// Lowers a graph to its launch plan.
pub fn lower(g: &Graph) -> Result<Schedule, LowerError> {
    let mut l = Lower::new(g);
    for (i, p) in g.params.iter().enumerate() {
        if let GType::Tensor { dims, dtype } = &p.ty {
            let b = l.add_buffer(p.name.clone(), BufKind::Input(i), dims.clone(), *dtype);
            if let Some(n) = g.nodes.iter().position(|n| n.kind == NodeKind::Param(i)) {
                l.buf_of.insert(NodeId(n as u32), b);
            }
        }
    }
    // Attention patterns: the final matmul absorbs its producers.
    let (attention, absorbed) = l.attentions();
    // Output buffers for results a launch can write directly.
    let mut out_for: HashMap<NodeId, BufId> = HashMap::new();
    let mut outputs = Vec::new();
    let mut scalar_outputs = Vec::new();
    for (k, &o) in g.outputs.iter().enumerate() {
        let node = g.node(o);
        let name = if g.outputs.len() == 1 {
            "out".to_string()
        } else {
            format!("out{k}")
        };
        let (dims, dtype) = match &node.ty {
            GType::Tensor { dims, dtype } => (dims, dtype),
            // A scalar result is written by a one-element kernel into a
            // rank-0 buffer, which the executor reads back as the scalar.
            GType::Scalar(dtype) => {
                let b = l.add_buffer(name, BufKind::Output(k), vec![], *dtype);
                outputs.push(b);
                scalar_outputs.push(true);
                continue;
            }
            _ => {
                return Err(LowerError::new(
                    node.span,
                    "returning this value from a whole-tensor function",
                ))
            }
        };
        let b = l.add_buffer(name, BufKind::Output(k), dims.clone(), *dtype);
        outputs.push(b);
        scalar_outputs.push(false);
        let direct = match &node.kind {
            _ if out_for.contains_key(&o) => false,
            _ if is_elementwise(g, o) => true,
            NodeKind::MatMul { .. } => {
                *dtype == generate::acc_dtype(*dtype) || attention.contains_key(&(o.0 as usize))
            }
            NodeKind::LayerNorm { .. } | NodeKind::RmsNorm { .. } => {
                *dtype == DType::F32 || !l.norm_fits_std(o)
            }
            NodeKind::Softmax { .. }
            | NodeKind::Reduce { .. }
            | NodeKind::Transpose { .. }
            | NodeKind::Slice { .. }
            | NodeKind::Call { .. }
            | NodeKind::Fill(Fill::Empty | Fill::Randn { .. } | Fill::Data(_)) => true,
            _ => false,
        };
        if direct {
            out_for.insert(o, b);
        }
    }
    l.run(&out_for, attention, absorbed)?;
    // Results not written in place: copy (and cast) into the output buffer.
    for (k, &o) in g.outputs.iter().enumerate() {
        let ob = outputs[k];
        if l.buf_of.get(&o) == Some(&ob) {
            continue;
        }
        if !scalar_outputs[k] {
            l.buf(o, o)?;
        }
        l.fused(
            &Group {
                members: vec![],
                root: o,
                copy: true,
            },
            ob,
        )?;
    }
    let s = Schedule {
        name: g.name.clone(),
        buffers: l.buffers,
        steps: l.steps,
        kernels: l.kernels,
        outputs,
        scalar_outputs,
    };
    Ok(s)
}

fn arg_str(s: &Schedule, a: &Arg) -> String {
    match a {
        Arg::Buffer { buf, dims } => {
            let b = s.buffer(*buf);
            if *dims == b.dims {
                b.name.clone()
            } else {
                format!("{} as {}", b.name, crate::check::types::render_dims(dims))
            }
        }
        Arg::Scalar(e) => e.to_string(),
    }
}

/// Checks the plan: arguments name existing buffers with the right element
/// count, every buffer a launch reads was written (or is an input or an
/// allocation) before, every output is written, and generated kernels are
/// well-formed Tile IR with one argument per parameter.
pub fn verify(s: &Schedule) -> Result<(), String> {
    let err = |m: String| Err(format!("schedule `{}`: {m}", s.name));
    let count = |d: &[Dim]| product(d);
    for (i, b) in s.buffers.iter().enumerate() {
        if let BufKind::View(of) = b.kind {
            if of.0 as usize >= i {
                return err(format!("view `{}` of a later buffer", b.name));
            }
            if count(&b.dims) != count(&s.buffer(of).dims) {
                return err(format!("view `{}` changes the element count", b.name));
            }
        }
    }
    let mut written: Vec<bool> = s
        .buffers
        .iter()
        .map(|b| b.alloc || matches!(b.kind, BufKind::Input(_)))
        .collect();
    let mut vars = Vec::new();
    if let Err(m) = verify_steps(s, &s.steps, &mut written, &mut vars) {
        return err(m);
    }
    for o in &s.outputs {
        if !written[s.base(*o).0 as usize] {
            return err(format!("output `{}` is never written", s.buffer(*o).name));
        }
    }
    Ok(())
}

/// The host variables an expression reads.
fn vars_of(e: &ScalarExpr, out: &mut Vec<String>) {
    match e {
        ScalarExpr::Var(v) => out.push(v.clone()),
        ScalarExpr::Unary(_, x) | ScalarExpr::Cast(x, _) | ScalarExpr::CDiv(x, _) => {
            vars_of(x, out)
        }
        ScalarExpr::Binary(_, a, b) => {
            vars_of(a, out);
            vars_of(b, out);
        }
        ScalarExpr::Param(_) | ScalarExpr::Index(_) | ScalarExpr::Const(_) => {}
    }
}

/// Checks a list of steps: buffers written before they are read, host
/// variables set before they are read; regions see the state before them,
/// and after an `if` a buffer counts as written when both branches write it
/// (after a loop, when it was before: a loop may run no trip).
fn verify_steps(
    s: &Schedule,
    steps: &[Step],
    written: &mut Vec<bool>,
    vars: &mut Vec<String>,
) -> Result<(), String> {
    let err = |m: String| Err(m);
    let count = |d: &[Dim]| product(d);
    let defined = |e: &ScalarExpr, vars: &Vec<String>, li: usize| -> Result<(), String> {
        let mut used = Vec::new();
        vars_of(e, &mut used);
        match used.iter().find(|v| !vars.contains(v)) {
            Some(v) => Err(format!(
                "step {li}: host variable `${v}` read before it is set"
            )),
            None => Ok(()),
        }
    };
    // A region's steps from the state before them; gives the state after.
    let scope = |body: &[Step], written: &Vec<bool>, vars: &Vec<String>, extra: Option<&String>| {
        let (mut w, mut v) = (written.clone(), vars.clone());
        v.extend(extra.cloned());
        verify_steps(s, body, &mut w, &mut v).map(|_| (w, v))
    };
    for (li, step) in steps.iter().enumerate() {
        let l = match step {
            Step::Launch(l) => l,
            Step::SetVar { var, value } => {
                defined(value, vars, li)?;
                vars.push(var.clone());
                continue;
            }
            Step::HostData { buf, values, .. } => {
                let Some(b) = s.buffers.get(buf.0 as usize) else {
                    return err(format!("step {li}: `data` names no buffer"));
                };
                if count(&b.dims).and_then(|d| d.as_const()) != Some(values.len() as i64) {
                    return err(format!(
                        "step {li}: {} values for `{}`",
                        values.len(),
                        b.name
                    ));
                }
                written[s.base(*buf).0 as usize] = true;
                continue;
            }
            Step::Call {
                func, args, out, ..
            } => {
                for (name, a) in args {
                    match a {
                        Arg::Scalar(e) => defined(e, vars, li)?,
                        Arg::Buffer { buf, .. } => {
                            if buf.0 as usize >= s.buffers.len()
                                || !written[s.base(*buf).0 as usize]
                            {
                                return err(format!(
                                    "step {li}: `{name}` of the call to `{func}` is not a written buffer"
                                ));
                            }
                        }
                    }
                }
                match s.buffers.get(out.0 as usize) {
                    Some(b) if !matches!(b.kind, BufKind::Input(_)) => {}
                    _ => return err(format!("step {li}: the call to `{func}` writes no buffer")),
                }
                written[s.base(*out).0 as usize] = true;
                continue;
            }
            Step::If {
                cond,
                then,
                otherwise,
            } => {
                defined(cond, vars, li)?;
                let (a, va) = scope(then, written, vars, None)?;
                let (b, vb) = scope(otherwise, written, vars, None)?;
                // What both branches write or set stays so.
                for v in va {
                    if vb.contains(&v) && !vars.contains(&v) {
                        vars.push(v);
                    }
                }
                for (w, (x, y)) in written.iter_mut().zip(a.iter().zip(&b)) {
                    *w |= *x && *y;
                }
                continue;
            }
            Step::For {
                var,
                lo,
                hi,
                step,
                body,
            } => {
                for e in [lo, hi, step] {
                    defined(e, vars, li)?;
                }
                scope(body, written, vars, Some(var))?;
                continue;
            }
            Step::While { cond, test, body } => {
                // The condition runs at least once, the body maybe never.
                verify_steps(s, cond, written, vars)?;
                defined(test, vars, li)?;
                scope(body, written, vars, None)?;
                continue;
            }
            Step::HostRandn { buf, seed, .. } => {
                let Some(b) = s.buffers.get(buf.0 as usize) else {
                    return err(format!("step {li}: `randn` names no buffer"));
                };
                if !b.dtype.is_float() {
                    return err(format!("step {li}: `randn` into a `{}` buffer", b.dtype));
                }
                if matches!(b.kind, BufKind::Input(_)) {
                    return err(format!("step {li}: `randn` overwrites input `{}`", b.name));
                }
                if matches!(
                    seed,
                    ScalarExpr::Const(Constant::Float(_) | Constant::Bool(_))
                ) {
                    return err(format!("step {li}: a `randn` seed that is not an integer"));
                }
                defined(seed, vars, li)?;
                written[s.base(*buf).0 as usize] = true;
                continue;
            }
        };
        for e in l.grid.iter().flatten() {
            defined(e, vars, li)?;
        }
        for (name, a) in &l.args {
            if let Arg::Scalar(e) = a {
                defined(e, vars, li)?;
            }
            if let Arg::Buffer { buf, dims } = a {
                if buf.0 as usize >= s.buffers.len() {
                    return err(format!("step {li}: `{name}` names no buffer"));
                }
                if count(dims) != count(&s.buffer(*buf).dims) {
                    return err(format!(
                        "step {li}: `{name}` is viewed with another element count"
                    ));
                }
                let base = s.base(*buf);
                if !l.writes.contains(buf) && !written[base.0 as usize] {
                    return err(format!(
                        "step {li}: `{name}` reads `{}` before it is written",
                        s.buffer(*buf).name
                    ));
                }
            }
        }
        for w in &l.writes {
            written[s.base(*w).0 as usize] = true;
        }
        if let Some(g) = &l.grid {
            if g.is_empty() || g.len() > 3 {
                return err(format!("step {li}: a grid of rank {}", g.len()));
            }
        }
        if let KernelRef::Generated(k) = l.kernel {
            let Some(kernel) = s.kernels.get(k) else {
                return err(format!("step {li}: no generated kernel {k}"));
            };
            if kernel.params.len() != l.args.len()
                || kernel.params.iter().zip(&l.args).any(|(p, (n, a))| {
                    p.name != *n
                        || match (&p.kind, a) {
                            (ParamKind::Tensor { dims, dtype }, Arg::Buffer { buf, dims: ad }) => {
                                dims.len() != ad.len() || *dtype != s.buffer(*buf).dtype
                            }
                            (ParamKind::Scalar(_), Arg::Scalar(_)) => false,
                            _ => true,
                        }
                })
            {
                return err(format!(
                    "step {li}: arguments do not match `{}`'s parameters",
                    kernel.name
                ));
            }
            verify_kernel(kernel)?;
            let errors = tile::verify(kernel);
            if !errors.is_empty() {
                return err(format!(
                    "generated kernel `{}`: {}",
                    kernel.name,
                    errors.join("; ")
                ));
            }
        }
    }
    Ok(())
}

/// A structural check of a generated Tile IR kernel: values defined once and
/// before use (region arguments at the region's start), elementwise operands
/// of equal types, loads and stores matching their accesses, loop bounds of one
/// integer type, loop bodies yielding their carried types. (The Tile IR
/// verifier proper checks every typing rule.)
pub fn verify_kernel(k: &Kernel) -> Result<(), String> {
    let mut defined = vec![false; k.types.len()];
    verify_region(k, &k.body, &mut defined, None).map_err(|m| format!("kernel `{}`: {m}", k.name))
}

fn verify_region(
    k: &Kernel,
    r: &Region,
    defined: &mut Vec<bool>,
    carried: Option<&[Value]>,
) -> Result<(), String> {
    let define = |v: Value, defined: &mut Vec<bool>| match defined.get_mut(v.0 as usize) {
        Some(d) if !*d => {
            *d = true;
            Ok(())
        }
        _ => Err(format!("%{} defined twice or without a type", v.0)),
    };
    for a in &r.args {
        define(*a, defined)?;
    }
    for (i, op) in r.ops.iter().enumerate() {
        let access_uses = |a: &[Access]| -> Vec<Value> { a.iter().map(Access::value).collect() };
        let uses: Vec<Value> = match &op.kind {
            OpKind::Unary { x, .. }
            | OpKind::Transpose { x }
            | OpKind::Extract { x, .. }
            | OpKind::Cast { x, .. }
            | OpKind::Splat { x, .. }
            | OpKind::Broadcast { x, .. }
            | OpKind::ExpandDims { x, .. }
            | OpKind::Reduce { x, .. } => vec![*x],
            OpKind::Binary { a, b, .. } => vec![*a, *b],
            OpKind::Select { cond, a, b } => vec![*cond, *a, *b],
            OpKind::Load { access, .. } => access_uses(access),
            OpKind::Store { access, value, .. } => {
                let mut u = access_uses(access);
                u.push(*value);
                u
            }
            OpKind::For {
                lo, hi, step, init, ..
            } => [*lo, *hi, *step]
                .into_iter()
                .chain(init.iter().copied())
                .collect(),
            OpKind::Yield(vs) => vs.clone(),
            _ => vec![],
        };
        for u in &uses {
            if !defined.get(u.0 as usize).copied().unwrap_or(false) {
                return Err(format!("op {i}: %{} used before its definition", u.0));
            }
        }
        match &op.kind {
            OpKind::Binary { a, b, .. } | OpKind::Select { a, b, .. } if k.ty(*a) != k.ty(*b) => {
                return Err(format!("op {i}: operands of different types"))
            }
            OpKind::Load { tensor, access, .. } | OpKind::Store { tensor, access, .. } => {
                let Some(ParamKind::Tensor { dims, .. }) = k.params.get(*tensor).map(|p| &p.kind)
                else {
                    return Err(format!("op {i}: param {tensor} is not a tensor"));
                };
                if dims.len() != access.len() {
                    return Err(format!("op {i}: access rank differs from the tensor's"));
                }
                let lens = Access::shape(access, &k.types);
                let tile = match &op.kind {
                    OpKind::Store { value, .. } => k.ty(*value).shape().to_vec(),
                    _ => k.types[op.results[0].0 as usize].shape().to_vec(),
                };
                if lens != tile {
                    return Err(format!("op {i}: tile shape differs from the access"));
                }
            }
            OpKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let t = k.ty(*lo);
                if !matches!(t, Type::Scalar(d) if d.is_int()) || k.ty(*hi) != t || k.ty(*step) != t
                {
                    return Err(format!(
                        "op {i}: loop bounds of different or non-integer types"
                    ));
                }
                if body.args.len() != init.len() + 1 || op.results.len() != init.len() {
                    return Err(format!("op {i}: loop arity"));
                }
                verify_region(k, body, defined, Some(init))?;
            }
            OpKind::Yield(vs) => {
                let Some(c) = carried else {
                    return Err(format!("op {i}: a yield in the kernel body"));
                };
                if vs.len() != c.len() || vs.iter().zip(c).any(|(v, c)| k.ty(*v) != k.ty(*c)) {
                    return Err(format!(
                        "op {i}: the yield does not match the carried values"
                    ));
                }
            }
            _ => {}
        }
        for res in &op.results {
            define(*res, defined)?;
        }
    }
    if carried.is_some() && !matches!(r.ops.last().map(|o| &o.kind), Some(OpKind::Yield(_))) {
        return Err("a loop body that does not end with a yield".into());
    }
    Ok(())
}

/// Steps at an indentation; regions nest three spaces deeper.
fn dump_steps(s: &Schedule, steps: &[Step], ind: &str, out: &mut String) {
    let inner = format!("{ind}   ");
    for (i, step) in steps.iter().enumerate() {
        let l = match step {
            Step::Launch(l) => l,
            Step::HostRandn { buf, seed, node } => {
                let _ = writeln!(
                    out,
                    "{ind}{i}: randn {} seed={seed} nodes=[{node}] (host)",
                    s.buffer(*buf).name
                );
                continue;
            }
            Step::SetVar { var, value } => {
                let _ = writeln!(out, "{ind}{i}: set ${var} = {value}");
                continue;
            }
            Step::HostData { buf, values, node } => {
                let v: Vec<String> = values.iter().map(render_constant).collect();
                let _ = writeln!(
                    out,
                    "{ind}{i}: data {} [{}] nodes=[{node}] (host)",
                    s.buffer(*buf).name,
                    v.join(", ")
                );
                continue;
            }
            Step::Call {
                func,
                node,
                args,
                out: o,
            } => {
                let args: Vec<String> = args
                    .iter()
                    .map(|(n, a)| format!("{n}={}", arg_str(s, a)))
                    .collect();
                let _ = writeln!(
                    out,
                    "{ind}{i}: call {func}({}) -> {} nodes=[{node}]",
                    args.join(", "),
                    s.buffer(*o).name
                );
                continue;
            }
            Step::If {
                cond,
                then,
                otherwise,
            } => {
                let _ = writeln!(out, "{ind}{i}: if {cond}");
                dump_steps(s, then, &inner, out);
                let _ = writeln!(out, "{ind}   else");
                dump_steps(s, otherwise, &inner, out);
                continue;
            }
            Step::For {
                var,
                lo,
                hi,
                step,
                body,
            } => {
                let _ = writeln!(out, "{ind}{i}: for ${var} in range({lo}, {hi}, {step})");
                dump_steps(s, body, &inner, out);
                continue;
            }
            Step::While { cond, test, body } => {
                let _ = writeln!(out, "{ind}{i}: while");
                dump_steps(s, cond, &inner, out);
                let _ = writeln!(out, "{ind}   test {test}, then");
                dump_steps(s, body, &inner, out);
                continue;
            }
        };
        let kname = match &l.kernel {
            KernelRef::Std { module, name } => format!("{module}.{name}"),
            KernelRef::User(n) => n.clone(),
            KernelRef::Generated(k) => format!("{} (generated)", s.kernels[*k].name),
        };
        let grid = match &l.grid {
            Some(g) => format!(
                "({}{})",
                g.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                if g.len() == 1 { "," } else { "" }
            ),
            None => "@kernel".into(),
        };
        let nodes: Vec<String> = l.nodes.iter().map(|n| n.to_string()).collect();
        let _ = writeln!(
            out,
            "{ind}{i}: {kname} grid={grid} nodes=[{}]",
            nodes.join(", ")
        );
        let args: Vec<String> = l
            .args
            .iter()
            .map(|(n, a)| format!("{n}={}", arg_str(s, a)))
            .chain(l.consts.iter().map(|(n, v)| format!("{n}={v}")))
            .collect();
        let _ = writeln!(out, "{ind}     ({})", args.join(", "));
        for r in &l.requires {
            let _ = writeln!(out, "{ind}     requires {r}");
        }
    }
}

/// The textual dump: buffers, launches in order, outputs, then the generated kernels.
pub fn dump(s: &Schedule) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "schedule {}", s.name);
    let _ = writeln!(out, "buffers:");
    for b in &s.buffers {
        let kind = match &b.kind {
            BufKind::Input(_) => "input".to_string(),
            BufKind::Output(_) => "output".to_string(),
            BufKind::Temp => "temp".to_string(),
            BufKind::View(of) => format!("view of {}", s.buffer(*of).name),
        };
        let kind = if b.alloc {
            format!("{kind} (empty)")
        } else {
            kind
        };
        let t = GType::Tensor {
            dims: b.dims.clone(),
            dtype: b.dtype,
        };
        let _ = writeln!(out, "  {}: {t} {kind}", b.name);
    }
    let _ = writeln!(out, "steps:");
    dump_steps(s, &s.steps, "  ", &mut out);
    let outs: Vec<String> = s
        .outputs
        .iter()
        .zip(&s.scalar_outputs)
        .map(|(o, &scalar)| {
            let name = &s.buffer(*o).name;
            if scalar {
                format!("{name} (scalar)")
            } else {
                name.clone()
            }
        })
        .collect();
    let _ = writeln!(out, "outputs: {}", outs.join(", "));
    for k in &s.kernels {
        out.push('\n');
        out.push_str(&k.dump());
    }
    out
}

/// Where a value crosses a region boundary: a buffer, or a host scalar (a
/// host variable where a region writes it).
#[derive(Clone, Debug)]
enum Slot {
    Buf(BufId),
    Scalar(ScalarExpr),
}

/// The types of a region's outputs.
fn region_types(r: &GRegion) -> Vec<GType> {
    r.graph
        .outputs
        .iter()
        .map(|o| r.graph.ty(*o).clone())
        .collect()
}

impl Lower<'_> {
    fn fresh_var(&mut self, hint: &str) -> String {
        self.vars += 1;
        format!("{hint}{}", self.vars - 1)
    }

    /// A bool host scalar for a condition node.
    fn host_condition(&self, cond: NodeId, user: NodeId) -> R<ScalarExpr> {
        if !self.g.ty(cond).is_scalar() {
            return Err(self.unsupported(user, "a condition read back from a tensor"));
        }
        self.scalar(cond)
    }

    /// Fresh places for results of these types: temporaries and host variables.
    fn result_slots(&mut self, tys: &[GType], hint: &str) -> Vec<Slot> {
        tys.iter()
            .map(|t| match t {
                GType::Tensor { dims, dtype } => Slot::Buf(self.temp(dims.clone(), *dtype)),
                _ => Slot::Scalar(ScalarExpr::Var(self.fresh_var(hint))),
            })
            .collect()
    }

    /// The places of a loop's carried values, set to their initial values.
    fn carried_slots(&mut self, init: &[NodeId]) -> R<Vec<Slot>> {
        let tys: Vec<GType> = init.iter().map(|i| self.g.ty(*i).clone()).collect();
        let slots = self.result_slots(&tys, "v");
        for (i, slot) in init.iter().zip(&slots) {
            match slot {
                Slot::Buf(b) => {
                    self.buf(*i, *i)?;
                    self.fused(
                        &Group {
                            members: vec![],
                            root: *i,
                            copy: true,
                        },
                        *b,
                    )?;
                }
                Slot::Scalar(ScalarExpr::Var(v)) => {
                    let value = self.scalar(*i)?;
                    self.steps.push(Step::SetVar {
                        var: v.clone(),
                        value,
                    });
                }
                Slot::Scalar(_) => {}
            }
        }
        Ok(slots)
    }

    /// Binds the `Project` nodes of a control-flow node to its result slots.
    fn bind_results(&mut self, node: NodeId, slots: &[Slot]) {
        for u in self.consumers[node.0 as usize].clone() {
            if let NodeKind::Project { index, .. } = self.g.node(u).kind {
                match &slots[index] {
                    Slot::Buf(b) => {
                        self.buf_of.insert(u, *b);
                    }
                    Slot::Scalar(e) => {
                        self.scalar_of.insert(u, e.clone());
                    }
                }
            }
        }
    }

    /// Lowers a region to its own steps: its leading params bound to
    /// `leading`, its captures to this graph's values, its outputs written to
    /// `targets` (buffers by copy kernels, host variables by `SetVar`) in two
    /// phases when an output is read from another target (`a, b = b, a`).
    fn lower_region(&mut self, r: &GRegion, leading: &[Slot], targets: &[Slot]) -> R<Vec<Step>> {
        let mut bind: Vec<Slot> = leading.to_vec();
        for c in &r.captures {
            bind.push(if self.g.ty(*c).is_scalar() {
                Slot::Scalar(self.scalar(*c)?)
            } else {
                Slot::Buf(self.buf_as(*c, *c)?)
            });
        }
        // Generated kernels are named after the function and the region.
        let g = Graph {
            name: format!("{}_{}", self.g.name, r.graph.name),
            ..(*r.graph).clone()
        };
        let mut c = Lower::new(&g);
        c.buffers = std::mem::take(&mut self.buffers);
        c.kernels = std::mem::take(&mut self.kernels);
        c.temps = self.temps;
        c.vars = self.vars;
        let result = c.lower_region_body(&bind, targets);
        self.buffers = std::mem::take(&mut c.buffers);
        self.kernels = std::mem::take(&mut c.kernels);
        self.temps = c.temps;
        self.vars = c.vars;
        result?;
        Ok(c.steps)
    }

    fn lower_region_body(&mut self, bind: &[Slot], targets: &[Slot]) -> R<()> {
        let g = self.g;
        for (i, n) in g.nodes.iter().enumerate() {
            if let NodeKind::Param(p) = n.kind {
                match &bind[p] {
                    Slot::Buf(b) => {
                        self.buf_of.insert(NodeId(i as u32), *b);
                    }
                    Slot::Scalar(e) => {
                        self.scalar_of.insert(NodeId(i as u32), e.clone());
                    }
                }
            }
        }
        let (attention, absorbed) = self.attentions();
        self.run(&HashMap::new(), attention, absorbed)?;
        let target_bases: Vec<BufId> = targets
            .iter()
            .filter_map(|t| match t {
                Slot::Buf(b) => Some(self.base(*b)),
                _ => None,
            })
            .collect();
        let copy = |l: &mut Self, root: NodeId, to: BufId| {
            l.fused(
                &Group {
                    members: vec![],
                    root,
                    copy: true,
                },
                to,
            )
        };
        // Phase 1: values that sit in another target move to a temporary.
        let mut scalars: Vec<Option<ScalarExpr>> = vec![None; targets.len()];
        let several_vars = targets
            .iter()
            .filter(|t| matches!(t, Slot::Scalar(_)))
            .count()
            > 1;
        for (k, (&o, t)) in g.outputs.iter().zip(targets).enumerate() {
            match t {
                Slot::Buf(b) => {
                    let src = self.base(self.buf(o, o)?);
                    if src != self.base(*b) && target_bases.contains(&src) {
                        let t =
                            self.temp(g.ty(o).dims().to_vec(), self.buffers[b.0 as usize].dtype);
                        copy(self, o, t)?;
                        self.buf_of.insert(o, t);
                    }
                }
                Slot::Scalar(_) => {
                    let value = self.scalar(o)?;
                    scalars[k] = Some(if several_vars {
                        let v = self.fresh_var("t");
                        self.steps.push(Step::SetVar {
                            var: v.clone(),
                            value,
                        });
                        ScalarExpr::Var(v)
                    } else {
                        value
                    });
                }
            }
        }
        // Phase 2: into the targets.
        for (k, (&o, t)) in g.outputs.iter().zip(targets).enumerate() {
            match t {
                Slot::Buf(b) => {
                    if self.base(self.buf(o, o)?) != self.base(*b) {
                        copy(self, o, *b)?;
                    }
                }
                Slot::Scalar(ScalarExpr::Var(var)) => {
                    let value = scalars[k].take().unwrap_or(ScalarExpr::Var(var.clone()));
                    if value != ScalarExpr::Var(var.clone()) {
                        self.steps.push(Step::SetVar {
                            var: var.clone(),
                            value,
                        });
                    }
                }
                Slot::Scalar(_) => {}
            }
        }
        Ok(())
    }

    /// The buffer owning the memory of `b` (through views).
    fn base(&self, mut b: BufId) -> BufId {
        while let BufKind::View(of) = self.buffers[b.0 as usize].kind {
            b = of;
        }
        b
    }

    /// Attention matches: the patterns by final matmul, and the nodes they absorb.
    fn attentions(&self) -> (HashMap<usize, Attention>, Vec<bool>) {
        let n = self.g.nodes.len();
        let mut absorbed = vec![false; n];
        let mut attention = HashMap::new();
        for i in 0..n {
            if let Some(m) = self.attention(NodeId(i as u32)) {
                for a in &m.4 {
                    absorbed[a.0 as usize] = true;
                }
                attention.insert(i, m);
            }
        }
        (attention, absorbed)
    }
}

impl<'g> Lower<'g> {
    fn new(g: &'g Graph) -> Self {
        let uses = g.use_counts();
        let mut consumers = vec![Vec::new(); g.nodes.len()];
        for (i, n) in g.nodes.iter().enumerate() {
            for o in crate::ir::graph::operands(&n.kind) {
                consumers[o.0 as usize].push(NodeId(i as u32));
            }
        }
        Lower {
            g,
            uses,
            consumers,
            buffers: Vec::new(),
            buf_of: HashMap::new(),
            steps: Vec::new(),
            kernels: Vec::new(),
            temps: 0,
            cast_of: HashMap::new(),
            f32_of: HashMap::new(),
            scalar_of: HashMap::new(),
            vars: 0,
        }
    }

    /// Lowers every node (params already bound): fusion groups, then one or
    /// more steps per node in program order. `out_for` names the buffers some
    /// results are written to directly.
    fn run(
        &mut self,
        out_for: &HashMap<NodeId, BufId>,
        mut attention: HashMap<usize, Attention>,
        absorbed: Vec<bool>,
    ) -> R<()> {
        let l = self;
        let g = l.g;
        let n = g.nodes.len();
        // Fusion: an elementwise node whose users are all elementwise and already in
        // one group, with no kernel call between it and them, joins that group (so a
        // value used twice inside one chain, as in `t * sigmoid(t)`, is computed once
        // in registers); results and other nodes root their own group.
        let is_output = |x: usize| g.outputs.contains(&NodeId(x as u32));
        let mut root_of: Vec<NodeId> = (0..n).map(|i| NodeId(i as u32)).collect();
        for i in (0..n).rev() {
            let id = NodeId(i as u32);
            let users = &l.consumers[i];
            if !is_elementwise(g, id) || is_output(i) || users.is_empty() {
                continue;
            }
            let root = root_of[users[0].0 as usize];
            let last = users.iter().map(|u| u.0 as usize).max().unwrap_or(i);
            let effect_between = g.nodes[i + 1..last].iter().any(|x| {
                matches!(
                    x.kind,
                    NodeKind::KernelCall { .. }
                        | NodeKind::If { .. }
                        | NodeKind::For { .. }
                        | NodeKind::While { .. }
                )
            });
            if !effect_between
                && users
                    .iter()
                    .all(|u| is_elementwise(g, *u) && root_of[u.0 as usize] == root)
            {
                root_of[i] = root;
            }
        }
        for i in 0..n {
            let id = NodeId(i as u32);
            let node = g.node(id);
            if absorbed[i] || node.ty.is_scalar() || matches!(node.kind, NodeKind::Param(_)) {
                continue;
            }
            let out = out_for.get(&id).copied();
            if is_elementwise(g, id) {
                if root_of[i] != id {
                    continue;
                }
                let members: Vec<NodeId> = (0..=i)
                    .map(|j| NodeId(j as u32))
                    .filter(|&j| root_of[j.0 as usize] == id && is_elementwise(g, j))
                    .collect();
                let dims = node.ty.dims().to_vec();
                let b = match out {
                    Some(b) => b,
                    None => l.temp(dims, node.ty.dtype().unwrap_or(DType::F32)),
                };
                l.fused(
                    &Group {
                        members,
                        root: id,
                        copy: false,
                    },
                    b,
                )?;
                l.buf_of.insert(id, b);
                continue;
            }
            match &node.kind {
            NodeKind::MatMul { .. } => match attention.remove(&i) {
                Some(m) => l.lower_attention(id, m, out)?,
                None => l.lower_matmul(id, out)?,
            },
            NodeKind::Reduce { op, x, axis, .. }
                if !(*op != ReduceKind::Min
                    && *axis == Some(g.ty(*x).dims().len().saturating_sub(1))
                    && g.ty(*x).dtype() == Some(DType::F32)
                    && l.buf(*x, id)
                        .is_ok_and(|b| l.buffers[b.0 as usize].dtype == DType::F32)) =>
            {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.reduce_generated(id, b)?;
                l.buf_of.insert(id, b);
            }
            NodeKind::LayerNorm { .. } | NodeKind::RmsNorm { .. } if !l.norm_fits_std(id) => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.norm_generated(id, b)?;
                l.buf_of.insert(id, b);
            }
            NodeKind::Softmax { x, axis }
                if !(*axis + 1 == g.ty(*x).dims().len()
                    && g.ty(*x).dtype() == Some(DType::F32)
                    && l.buf(*x, id)
                        .is_ok_and(|b| l.buffers[b.0 as usize].dtype == DType::F32)) =>
            {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.softmax_generated(id, b)?;
                l.buf_of.insert(id, b);
            }
            NodeKind::Softmax { .. }
            | NodeKind::LayerNorm { .. }
            | NodeKind::RmsNorm { .. }
            | NodeKind::Reduce { .. } => l.lower_rows(id, out)?,
            NodeKind::Reshape { x } => {
                let base = l.buf(*x, id)?;
                let name = format!("v{}", l.buffers.len());
                let dtype = l.buffers[base.0 as usize].dtype;
                let v = l.add_buffer(name, BufKind::View(base), node.ty.dims().to_vec(), dtype);
                l.buf_of.insert(id, v);
            }
            NodeKind::Fill(Fill::Empty) => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.buffers[b.0 as usize].alloc = true;
                l.buf_of.insert(id, b);
            }
            NodeKind::KernelCall {
                kernel,
                grid,
                args,
                consts,
            } => {
                let mut largs = Vec::new();
                let mut writes = Vec::new();
                for (name, a) in args {
                    if g.ty(*a).is_scalar() {
                        largs.push((name.clone(), Arg::Scalar(l.scalar(*a)?)));
                    } else {
                        let b = l.buf_as(*a, id)?;
                        writes.push(b);
                        largs.push((
                            name.clone(),
                            Arg::Buffer {
                                buf: b,
                                dims: g.ty(*a).dims().to_vec(),
                            },
                        ));
                    }
                }
                let grid = match grid {
                    Some(gr) => Some(gr.iter().map(|x| l.scalar(*x)).collect::<R<Vec<_>>>()?),
                    None => None,
                };
                l.launch(Launch {
                    kernel: KernelRef::User(kernel.clone()),
                    nodes: vec![id],
                    grid,
                    args: largs,
                    consts: consts
                        .iter()
                        .map(|(n, v)| (n.clone(), v.to_string()))
                        .collect(),
                    requires: vec![],
                    writes,
                });
            }
            NodeKind::Transpose { .. } => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.transpose(id, b)?;
                l.buf_of.insert(id, b);
            }
            // Bound when their control-flow node was lowered.
            NodeKind::Project { .. } => {}
            NodeKind::If {
                cond,
                then,
                otherwise,
            } => {
                let c = l.host_condition(*cond, id)?;
                let slots = l.result_slots(&region_types(then), "r");
                let then = l.lower_region(then, &[], &slots)?;
                let otherwise = l.lower_region(otherwise, &[], &slots)?;
                l.steps.push(Step::If {
                    cond: c,
                    then,
                    otherwise,
                });
                l.bind_results(id, &slots);
            }
            NodeKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let (lo, hi, step) = (
                    l.scalar_as(*lo, Some(DType::I32))?,
                    l.scalar_as(*hi, Some(DType::I32))?,
                    l.scalar_as(*step, Some(DType::I32))?,
                );
                let slots = l.carried_slots(init)?;
                let var = l.fresh_var("i");
                let mut leading = vec![Slot::Scalar(ScalarExpr::Var(var.clone()))];
                leading.extend(slots.iter().cloned());
                let body = l.lower_region(body, &leading, &slots)?;
                l.steps.push(Step::For {
                    var,
                    lo,
                    hi,
                    step,
                    body,
                });
                l.bind_results(id, &slots);
            }
            NodeKind::While { init, cond, body } => {
                let slots = l.carried_slots(init)?;
                let test = l.fresh_var("c");
                let cond = l.lower_region(cond, &slots, &[Slot::Scalar(ScalarExpr::Var(test.clone()))])?;
                let body = l.lower_region(body, &slots, &slots)?;
                l.steps.push(Step::While {
                    cond,
                    test: ScalarExpr::Var(test),
                    body,
                });
                l.bind_results(id, &slots);
            }
            NodeKind::Slice { x, axes } => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                let zero = || ScalarExpr::Const(Constant::Int(0));
                let mut src = Vec::with_capacity(axes.len());
                let mut k = 0;
                for a in axes {
                    src.push(match a {
                        SliceAxis::Index(i) => SrcAxis::Fixed(l.scalar_as(*i, Some(DType::I32))?),
                        SliceAxis::Full => SrcAxis::Out {
                            k,
                            offset: zero(),
                            wrap: false,
                        },
                        SliceAxis::Range { start } => SrcAxis::Out {
                            k,
                            offset: ScalarExpr::Index(start.clone()),
                            wrap: false,
                        },
                    });
                    if !matches!(a, SliceAxis::Index(_)) {
                        k += 1;
                    }
                }
                l.gather_copy(id, *x, src, b)?;
                l.buf_of.insert(id, b);
            }
            NodeKind::Fill(Fill::Data(values)) => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.steps.push(Step::HostData {
                    buf: b,
                    values: values.clone(),
                    node: id,
                });
                l.buf_of.insert(id, b);
            }
            NodeKind::Fill(Fill::Randn { seed }) => {
                if !node.ty.dtype().is_some_and(DType::is_float) {
                    return Err(l.unsupported(
                        id,
                        format!("`randn` of `{}` (normal samples are floats)", node.ty),
                    ));
                }
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                let seed = match seed {
                    Some(s) => l.scalar_as(*s, Some(DType::I64))?,
                    None => ScalarExpr::Const(Constant::Int(0)),
                };
                l.steps.push(Step::HostRandn {
                    buf: b,
                    seed,
                    node: id,
                });
                l.buf_of.insert(id, b);
            }
            NodeKind::Call {
                func, args, consts, ..
            } if consts.is_empty() && node.ty.is_tensor() => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                let mut cargs = Vec::new();
                for (name, a) in args {
                    cargs.push((
                        name.clone(),
                        if g.ty(*a).is_scalar() {
                            Arg::Scalar(l.scalar(*a)?)
                        } else {
                            Arg::Buffer {
                                buf: l.buf_as(*a, id)?,
                                dims: g.ty(*a).dims().to_vec(),
                            }
                        },
                    ));
                }
                l.steps.push(Step::Call {
                    func: func.clone(),
                    node: id,
                    args: cargs,
                    out: b,
                });
                l.buf_of.insert(id, b);
            }
            NodeKind::Call { func, .. } => {
                return Err(l.unsupported(
                    id,
                    format!("the call to `{func}`: its definition cannot be found, its dims do not bind, it takes const arguments or it returns no tensor"),
                ))
            }
            other => return Err(l.unsupported(id, format!("{other:?}"))),
        }
            // The maximum, minimum or mean of nothing has no value: checked at
            // run time unless the extent is known to be positive (E0317).
            if let NodeKind::Reduce { op, x, axis, .. } = &node.kind {
                let xd = g.ty(*x).dims();
                let reduced = match axis {
                    Some(j) => xd.get(*j).cloned(),
                    None => product(xd),
                };
                // A constant 0 reaches here from a function specialised on
                // the sizes it is called with.
                let unproven = reduced.filter(|d| d.as_const().is_none_or(|c| c <= 0));
                if let (false, Some(extent)) = (*op == ReduceKind::Sum, unproven) {
                    if let Some(Step::Launch(last)) = l.steps.last_mut() {
                        let name = format!("{op:?}").to_lowercase();
                        last.requires.push(format!("nonempty {name}: {extent}"));
                    }
                }
            }
        }
        Ok(())
    }
}
