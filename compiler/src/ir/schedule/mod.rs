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
//!
//!
//! # Layout of this module
//!
//! The IR's types, the lowering context `Lower` and the entry point `lower` are
//! here; `Lower`'s `impl` is spread over files by concern (each file has
//! `impl Lower { ... }` for its part), and the checks and the dump have their own:
//!
//! | file | holds |
//! |------|-------|
//! | `nodes.rs` | the walk over a graph: fusion groups, then each node's steps |
//! | `buffers.rs` | buffers and host scalars of nodes: temporaries, casts, views |
//! | `launch.rs` | launches and their grids (columns on grid axis x, 1-D grids past 65535) |
//! | `stdlib.rs` | launches of standard-library kernels: gemms, row kernels, flash attention |
//! | `control.rs` | regions of `if`/`for`/`while`: their slots, bindings and step lists |
//! | `generate/` | kernels generated as Tile IR: fused elementwise groups, copies, reductions, softmax, norms, matmuls (one file each) |
//! | `verify.rs` | `verify`: buffers, views, write-before-read, generated kernels |
//! | `dump.rs` | `dump`: the textual form |
//!
//! A method or item is `pub(super)` only where a sibling file uses it.

mod buffers;
mod control;
mod dump;
mod generate;
mod launch;
mod nodes;
mod stdlib;
mod verify;

pub use dump::dump;
pub use verify::{verify, verify_kernel};

use std::collections::HashMap;
use std::fmt;

use crate::check::dims::Dim;
use crate::check::DType;
use crate::ir::graph::{
    binary_name, render_constant, Fill, GType, Graph, LowerError, NodeId, NodeKind,
};
use crate::ir::tile::{BinaryOp, Constant, Kernel, UnaryOp};
use generate::Group;

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
    /// A collective over the devices running this function together (one
    /// part each): `output` gets this device's part of `op` of `input`s. On
    /// one device, a copy. Dumped `all_reduce t0 op=sum -> t1 nodes=[%i]`.
    Collective {
        op: crate::ir::graph::Collective,
        input: BufId,
        output: BufId,
        node: NodeId,
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
    /// Generated kernels (fusion groups), in Tile IR; shared, so an executor
    /// can tell a kernel it launched before by its address.
    pub kernels: Vec<std::sync::Arc<Kernel>>,
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
                    | Step::Collective { .. }
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
            | NodeKind::Collective { .. }
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
        kernels: l
            .kernels
            .into_iter()
            .map(|mut k| {
                // As user kernels get it (`ir::tile::program_order`).
                if k.order_programs() {
                    k.remove_dead_code();
                    k.renumber();
                }
                std::sync::Arc::new(k)
            })
            .collect(),
        outputs,
        scalar_outputs,
    };
    Ok(s)
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
}
