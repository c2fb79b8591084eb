//! Graph IR: one whole-tensor function (a plain `def`) as a DAG of tensor ops.
//!
//! Nodes are kept in program order, which is a topological order: every operand
//! precedes its user. Types are the checker's (symbolic dims as [`Dim`], dtypes),
//! read from the checked expressions instead of being re-derived: `build` looks
//! each expression's type up by its span in the values the checker recorded.
//!
//! * Scalars known at compile time (literals, consts, dims such as `D`) are
//!   `Const`/`Index` nodes; other scalars (scalar parameters, arithmetic on them)
//!   are host scalars computed at launch time.
//! * Elementwise ops keep numpy broadcasting implicit in the types; the dump
//!   records which operands are broadcast (`bcast`).
//! * Kernel calls are effects (they write their tensor arguments): they have no
//!   result and later nodes see the written tensors, so nodes are never reordered
//!   across them.
//! * Calls to other whole-tensor functions: `build` makes `call` nodes, and
//!   `inline` replaces them with the callee's graph (dims substituted, spans set to
//!   the call's), so that fusion sees across function boundaries. The db query
//!   `graph_ir` is the inlined graph (`graph_ir_uninlined` the one as written); a
//!   call giving const arguments inlines the callee re-checked with those values;
//!   recursive calls stay `call` nodes (and the schedule reports them).
//!   std.nn's spelled-out definitions of the builtins (`softmax`, `layer_norm`,
//!   `rms_norm`, `relu`, `gelu`, `silu`) are documented by the standard library as
//!   having the builtin's meaning: a call to one of them is the builtin.
//! * Subscripts: `:` and `None` only are a reshape (a view); integer indices
//!   (compile-time or host scalars, negative ones counting from the end at run
//!   time) and `start:end` slices (bounds known at specialisation, normalised as
//!   numpy does) are a `slice` node over the kept axes, then a reshape for `None`
//!   axes. Indexing with an integer tensor (a gather) is not lowered.
//! * `.shape`/`.dtype` bindings (`s = x.shape`, `m, n = x.shape`) make no node:
//!   their uses read the checker's values (dims are `index` nodes).
//! * `if` statements on compile-time conditions take their branch; `for` loops
//!   over `range` of compile-time integers are unrolled (at most 64 trips).
//!   Run-time control flow is structured: `if`/`elif`/`else` on a bool host
//!   scalar is an `If` node, `for` over `range` with run-time bounds (or more
//!   than 64 trips) a `For` node, `while` a `While` node. Each holds
//!   [`Region`]s, nested graphs whose params are the node's leading values (the
//!   loop variable, the carried values: names the body assigns that are bound
//!   before it) then captures (values of the enclosing graph the region reads);
//!   their outputs are the node's results, read by `project` nodes. A run-time
//!   loop's variable is not readable after the loop. `break`/`continue` and a
//!   `return` inside run-time control flow are not lowered yet: `build` returns a
//!   [`LowerError`] saying so (E0512 at `tsrc emit`).
//!
//! The dump: a header `graph NAME(params) -> result types`, one line per node
//! `%i = op operands [bcast(lhs|rhs|cond)] : type` (kernel launches `%i = launch
//! k[grid](param=%j, ..., CONST=value)`, subscripts `%i = slice %x[%j, 2:+3, :]`
//! with each range as `start:+length`, control flow `%i = if %c then(captures)
//! else(captures)`, `for range(lo, hi, step) carry(init) body(captures)`, `while
//! carry(init) cond(captures) body(captures)`, each followed by its regions'
//! graphs indented), and `return %i, ...`. `verify` checks operands defined
//! before use, shapes against each op's rule, regions against their nodes and
//! valued outputs.
//!
//! # Layout of this module
//!
//! The IR's types and the structure of a node (its operands and regions) are
//! here; each pass over it has its own file:
//!
//! | file | holds |
//! |------|-------|
//! | `build/` | `build`: the graph of a checked function (see its module doc) |
//! | `inline.rs` | `inline`: calls to other whole-tensor functions replaced by their graphs |
//! | `verify.rs` | `verify`: the graph's invariants |
//! | `dump.rs` | `dump`: the textual form |

mod build;
mod dump;
mod inline;
mod verify;

pub use build::build;
pub use dump::dump;
pub use inline::{inline, Resolver};
pub use verify::verify;

use std::fmt;

use crate::check::builtins::{Builtin, Builtin as B};
use crate::check::dims::Dim;
use crate::check::scope::FnSig;
use crate::check::{DType, Value};
use crate::ir::tile::{BinaryOp, Constant, UnaryOp};
use crate::syntax::span::Span;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// The type of a node's value.
#[derive(Clone, Debug, PartialEq)]
pub enum GType {
    Tensor {
        dims: Vec<Dim>,
        dtype: DType,
    },
    Scalar(DType),
    /// No value (kernel calls).
    Unit,
}

impl GType {
    pub fn dtype(&self) -> Option<DType> {
        match self {
            GType::Tensor { dtype, .. } | GType::Scalar(dtype) => Some(*dtype),
            GType::Unit => None,
        }
    }

    /// The dims of a tensor; empty for a scalar.
    pub fn dims(&self) -> &[Dim] {
        match self {
            GType::Tensor { dims, .. } => dims,
            _ => &[],
        }
    }

    pub fn is_tensor(&self) -> bool {
        matches!(self, GType::Tensor { .. })
    }

    pub fn is_scalar(&self) -> bool {
        matches!(self, GType::Scalar(_))
    }
}

impl fmt::Display for GType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GType::Tensor { dims, dtype } => {
                write!(f, "Tensor[")?;
                for d in dims {
                    write!(f, "{d}, ")?;
                }
                write!(f, "{dtype}]")
            }
            GType::Scalar(d) => write!(f, "{d}"),
            GType::Unit => f.write_str("()"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    Relu,
    Gelu,
    Silu,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Max,
    Min,
    Mean,
}

/// A collective over the parts a distributed tensor has on the devices
/// (docs/multi-gpu.md). A function run on one device (or on whole tensors)
/// has one part: a collective is then the identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every part becomes the elementwise reduction of all parts.
    AllReduce(ReduceKind),
    /// Every part becomes a copy of part `src`.
    Broadcast { src: usize },
    /// Of a whole tensor, the part along `axis` this device holds (no
    /// communication: each device takes its piece).
    Shard { axis: usize },
    /// Every device gets the whole of a sharded tensor; `axis` is the one it
    /// is sharded along, known once the arguments' placements are (`None`
    /// in the graph of the function as written).
    AllGather { axis: Option<usize> },
    /// Device i gets block i along `axis` of the parts' reduction.
    ReduceScatter { op: ReduceKind, axis: usize },
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let red = |r: &ReduceKind| format!("{r:?}").to_lowercase();
        match self {
            Collective::AllReduce(r) => write!(f, "all_reduce op={}", red(r)),
            Collective::Broadcast { src } => write!(f, "broadcast src={src}"),
            Collective::Shard { axis } => write!(f, "shard axis={axis}"),
            Collective::AllGather { axis: Some(a) } => write!(f, "all_gather axis={a}"),
            Collective::AllGather { axis: None } => f.write_str("all_gather"),
            Collective::ReduceScatter { op, axis } => {
                write!(f, "reduce_scatter op={} axis={axis}", red(op))
            }
        }
    }
}

/// How a creation op fills its tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum Fill {
    Zeros,
    Ones,
    /// `full(shape, value)`: the value is a scalar node.
    Full(NodeId),
    /// Uninitialised.
    Empty,
    Randn {
        seed: Option<NodeId>,
    },
    /// `tensor([...])`: the elements in row-major order, as constants of the
    /// node's dtype.
    Data(Vec<Constant>),
}

/// What a subscript takes from one axis of its tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum SliceAxis {
    /// `:`, the whole axis.
    Full,
    /// `i`: one element (a scalar node, compile-time or host; a negative index
    /// counts from the end at run time); the axis is dropped.
    Index(NodeId),
    /// `a:b`: the result's dim elements from `start` (normalised at build time:
    /// not negative, clamped to the axis when both are constants).
    Range { start: Dim },
}

/// A nested graph of a control-flow node: its params are the node's leading
/// values (a loop's induction variable and carried values) followed by
/// `captures`, values of the enclosing graph it reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Region {
    pub graph: std::sync::Arc<Graph>,
    pub captures: Vec<NodeId>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    /// Parameter `i` of the function.
    Param(usize),
    /// A scalar constant.
    Const(Constant),
    /// An integer known symbolically when the function is specialised (a dim, a const).
    Index(Dim),
    Unary {
        op: UnaryOp,
        x: NodeId,
    },
    Activation {
        act: Activation,
        x: NodeId,
    },
    /// Elementwise with numpy broadcasting; comparisons give bool.
    Binary {
        op: BinaryOp,
        a: NodeId,
        b: NodeId,
    },
    Select {
        cond: NodeId,
        a: NodeId,
        b: NodeId,
    },
    Cast {
        x: NodeId,
        to: DType,
    },
    /// Batched matrix product, batch dims broadcast. `tf32`: f32 operands
    /// are rounded to tf32 (asked for by `precision="tf32"` or the session's
    /// default); otherwise f32 multiplies in full f32.
    MatMul {
        a: NodeId,
        b: NodeId,
        tf32: bool,
    },
    Softmax {
        x: NodeId,
        axis: usize,
    },
    /// Over the last axis.
    LayerNorm {
        x: NodeId,
        weight: Option<NodeId>,
        bias: Option<NodeId>,
        eps: Option<NodeId>,
    },
    /// Over the last axis.
    RmsNorm {
        x: NodeId,
        weight: Option<NodeId>,
        eps: Option<NodeId>,
    },
    /// `axis: None` reduces every axis.
    Reduce {
        op: ReduceKind,
        x: NodeId,
        axis: Option<usize>,
        keepdims: bool,
    },
    Transpose {
        x: NodeId,
        a: usize,
        b: usize,
    },
    /// `x[...]` with integer indices and slices: one entry per axis of `x`;
    /// the node's dims are those of the kept axes (`None` axes are a reshape
    /// after it).
    Slice {
        x: NodeId,
        axes: Vec<SliceAxis>,
    },
    /// The new shape is the node's type.
    Reshape {
        x: NodeId,
    },
    /// A new tensor of the node's type.
    Fill(Fill),
    /// A collective; the node's type is `x`'s.
    Collective {
        op: Collective,
        x: NodeId,
    },
    /// A kernel launch: writes its tensor arguments. `grid: None` is the
    /// kernel's decorator grid.
    KernelCall {
        kernel: String,
        grid: Option<Vec<NodeId>>,
        /// Run-time arguments by parameter name, in the kernel's parameter order.
        args: Vec<(String, NodeId)>,
        /// Const parameters given at the call (others take their defaults).
        consts: Vec<(String, Value)>,
    },
    /// A run-time `if` on a host scalar (or a one-element bool tensor): both
    /// regions take only captures and output the node's results (read with
    /// `Project`). Control-flow nodes have type `Unit`.
    If {
        cond: NodeId,
        then: Region,
        otherwise: Region,
    },
    /// `for iv in range(lo, hi, step)` with run-time bounds: the body's leading
    /// params are `[iv, carried...]`, its outputs the next carried values; the
    /// node's results are the last ones.
    For {
        lo: NodeId,
        hi: NodeId,
        step: NodeId,
        init: Vec<NodeId>,
        body: Region,
    },
    /// `while`: `cond` (leading params the carried values, one bool output)
    /// runs before each trip of `body` (same leading params, next carried values).
    While {
        init: Vec<NodeId>,
        cond: Region,
        body: Region,
    },
    /// Result `index` of an `If`, `For` or `While` node.
    Project {
        of: NodeId,
        index: usize,
    },
    /// A call to another whole-tensor function (one `graph_ir` could not inline).
    Call {
        func: String,
        /// The callee's signature (to find its definition).
        sig: std::sync::Arc<FnSig>,
        args: Vec<(String, NodeId)>,
        /// Const parameters given at the call.
        consts: Vec<(String, Value)>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    pub ty: GType,
    /// Item-relative span of the expression.
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GParam {
    pub name: String,
    pub ty: GType,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    pub name: String,
    /// Run-time parameters (const parameters are folded into the nodes).
    pub params: Vec<GParam>,
    pub nodes: Vec<Node>,
    pub outputs: Vec<NodeId>,
}

impl Graph {
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    pub fn ty(&self, id: NodeId) -> &GType {
        &self.node(id).ty
    }

    /// The operands of a node, in order.
    pub fn operands(&self, id: NodeId) -> Vec<NodeId> {
        operands(&self.node(id).kind)
    }

    /// How many times each node is used (as an operand or an output).
    pub fn use_counts(&self) -> Vec<u32> {
        let mut uses = vec![0u32; self.nodes.len()];
        for n in &self.nodes {
            for o in operands(&n.kind) {
                uses[o.0 as usize] += 1;
            }
        }
        for o in &self.outputs {
            uses[o.0 as usize] += 1;
        }
        uses
    }
}

pub fn operands(kind: &NodeKind) -> Vec<NodeId> {
    match kind {
        NodeKind::Param(_) | NodeKind::Const(_) | NodeKind::Index(_) => vec![],
        NodeKind::Unary { x, .. }
        | NodeKind::Activation { x, .. }
        | NodeKind::Cast { x, .. }
        | NodeKind::Softmax { x, .. }
        | NodeKind::Reduce { x, .. }
        | NodeKind::Transpose { x, .. }
        | NodeKind::Collective { x, .. }
        | NodeKind::Reshape { x } => vec![*x],
        NodeKind::Binary { a, b, .. } | NodeKind::MatMul { a, b, .. } => vec![*a, *b],
        NodeKind::Select { cond, a, b } => vec![*cond, *a, *b],
        NodeKind::LayerNorm {
            x,
            weight,
            bias,
            eps,
        } => std::iter::once(*x)
            .chain(weight.iter().copied())
            .chain(bias.iter().copied())
            .chain(eps.iter().copied())
            .collect(),
        NodeKind::RmsNorm { x, weight, eps } => std::iter::once(*x)
            .chain(weight.iter().copied())
            .chain(eps.iter().copied())
            .collect(),
        NodeKind::Fill(Fill::Full(v)) => vec![*v],
        NodeKind::Fill(Fill::Randn { seed }) => seed.iter().copied().collect(),
        NodeKind::Fill(_) => vec![],
        NodeKind::KernelCall { grid, args, .. } => grid
            .iter()
            .flatten()
            .copied()
            .chain(args.iter().map(|(_, a)| *a))
            .collect(),
        NodeKind::Call { args, .. } => args.iter().map(|(_, a)| *a).collect(),
        NodeKind::If {
            cond,
            then,
            otherwise,
        } => std::iter::once(*cond)
            .chain(then.captures.iter().copied())
            .chain(otherwise.captures.iter().copied())
            .collect(),
        NodeKind::For {
            lo,
            hi,
            step,
            init,
            body,
        } => [*lo, *hi, *step]
            .into_iter()
            .chain(init.iter().copied())
            .chain(body.captures.iter().copied())
            .collect(),
        NodeKind::While { init, cond, body } => init
            .iter()
            .chain(&cond.captures)
            .chain(&body.captures)
            .copied()
            .collect(),
        NodeKind::Project { of, .. } => vec![*of],
        NodeKind::Slice { x, axes } => std::iter::once(*x)
            .chain(axes.iter().filter_map(|a| match a {
                SliceAxis::Index(i) => Some(*i),
                _ => None,
            }))
            .collect(),
    }
}

/// Something the lowering does not handle (yet), at an item-relative span.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LowerError {
    pub span: Span,
    pub message: String,
}

impl LowerError {
    pub fn new(span: Span, message: impl Into<String>) -> Self {
        LowerError {
            span,
            message: message.into(),
        }
    }

    /// As a diagnostic: E0512, not supported by code generation yet.
    pub fn diagnostic(&self) -> crate::diag::Diagnostic {
        crate::diag::Diagnostic::new(
            "E0512",
            self.span,
            format!("not supported by code generation yet: {}", self.message),
        )
        .with_help("write this step as a `@kernel` and launch it from the function")
    }

    /// The same error with its span shifted by `offset` (item → file).
    pub fn shifted(mut self, offset: u32) -> Self {
        self.span = Span::new(self.span.start + offset, self.span.end + offset);
        self
    }
}

impl fmt::Display for LowerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "not supported yet: {} (at {}..{})",
            self.message, self.span.start, self.span.end
        )
    }
}

pub fn binary_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        BinaryOp::FloorDiv => "floordiv",
        BinaryOp::Mod => "mod",
        BinaryOp::Pow => "pow",
        BinaryOp::Max => "max",
        BinaryOp::Min => "min",
        BinaryOp::And => "and",
        BinaryOp::Or => "or",
        BinaryOp::Xor => "xor",
        BinaryOp::Eq => "eq",
        BinaryOp::Ne => "ne",
        BinaryOp::Lt => "lt",
        BinaryOp::Le => "le",
        BinaryOp::Gt => "gt",
        BinaryOp::Ge => "ge",
    }
}

pub fn render_constant(c: &Constant) -> String {
    match c {
        Constant::Int(i) => i.to_string(),
        Constant::Float(x) if x.is_infinite() => if *x > 0.0 { "inf" } else { "-inf" }.to_string(),
        Constant::Float(x) => format!("{x:?}"),
        Constant::Bool(b) => if *b { "True" } else { "False" }.to_string(),
    }
}

/// The std.nn functions that have the meaning of the builtin of the same name.
pub const STD_NN_BUILTINS: &[Builtin] = &[
    B::Softmax,
    B::LayerNorm,
    B::RmsNorm,
    B::Relu,
    B::Gelu,
    B::Silu,
];

/// A copy of `kind` with every operand mapped through `f`.
pub fn map_operands(kind: &NodeKind, f: &dyn Fn(NodeId) -> NodeId) -> NodeKind {
    let mut k = kind.clone();
    let o = |x: &mut NodeId| *x = f(*x);
    let oo = |x: &mut Option<NodeId>| {
        if let Some(x) = x {
            *x = f(*x);
        }
    };
    match &mut k {
        NodeKind::Param(_) | NodeKind::Const(_) | NodeKind::Index(_) => {}
        NodeKind::Unary { x, .. }
        | NodeKind::Activation { x, .. }
        | NodeKind::Cast { x, .. }
        | NodeKind::Softmax { x, .. }
        | NodeKind::Reduce { x, .. }
        | NodeKind::Transpose { x, .. }
        | NodeKind::Collective { x, .. }
        | NodeKind::Reshape { x } => o(x),
        NodeKind::Binary { a, b, .. } | NodeKind::MatMul { a, b, .. } => {
            o(a);
            o(b);
        }
        NodeKind::Select { cond, a, b } => {
            o(cond);
            o(a);
            o(b);
        }
        NodeKind::LayerNorm {
            x,
            weight,
            bias,
            eps,
        } => {
            o(x);
            oo(weight);
            oo(bias);
            oo(eps);
        }
        NodeKind::RmsNorm { x, weight, eps } => {
            o(x);
            oo(weight);
            oo(eps);
        }
        NodeKind::Fill(Fill::Full(v)) => o(v),
        NodeKind::Fill(Fill::Randn { seed }) => oo(seed),
        NodeKind::Fill(_) => {}
        NodeKind::KernelCall { grid, args, .. } => {
            for g in grid.iter_mut().flatten() {
                o(g);
            }
            for (_, a) in args {
                o(a);
            }
        }
        NodeKind::Call { args, .. } => {
            for (_, a) in args {
                o(a);
            }
        }
        NodeKind::Slice { x, axes } => {
            o(x);
            for a in axes {
                if let SliceAxis::Index(i) = a {
                    o(i);
                }
            }
        }
        NodeKind::If {
            cond,
            then,
            otherwise,
        } => {
            o(cond);
            then.captures.iter_mut().for_each(o);
            otherwise.captures.iter_mut().for_each(o);
        }
        NodeKind::For {
            lo,
            hi,
            step,
            init,
            body,
        } => {
            o(lo);
            o(hi);
            o(step);
            init.iter_mut().for_each(o);
            body.captures.iter_mut().for_each(o);
        }
        NodeKind::While { init, cond, body } => {
            init.iter_mut().for_each(o);
            cond.captures.iter_mut().for_each(o);
            body.captures.iter_mut().for_each(o);
        }
        NodeKind::Project { of, .. } => o(of),
    }
    k
}

/// The regions of a control-flow node.
pub fn regions(kind: &NodeKind) -> Vec<&Region> {
    match kind {
        NodeKind::If {
            then, otherwise, ..
        } => vec![then, otherwise],
        NodeKind::For { body, .. } => vec![body],
        NodeKind::While { cond, body, .. } => vec![cond, body],
        _ => vec![],
    }
}

fn regions_mut(kind: &mut NodeKind) -> Vec<&mut Region> {
    match kind {
        NodeKind::If {
            then, otherwise, ..
        } => vec![then, otherwise],
        NodeKind::For { body, .. } => vec![body],
        NodeKind::While { cond, body, .. } => vec![cond, body],
        _ => vec![],
    }
}
