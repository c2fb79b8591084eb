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

use std::collections::HashMap;
use std::fmt::{self, Write};

use crate::check::builtins::{Builtin, Builtin as B};
use crate::check::ctx::Val;
use crate::check::dims::Dim;
use crate::check::expr::broadcast;
use crate::check::generics::{bind_call, CallArg, TypeEnv};
use crate::check::scope::FnSig;
use crate::check::types::{render_dims, Callee};
use crate::check::{DType, Ty, Value};
use crate::ir::tile::{unary_op, BinaryOp, Constant, UnaryOp};
use crate::syntax::ast::{self, Expr, ExprKind, Function, StmtKind};
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

struct Builder<'a> {
    vals: HashMap<(u32, u32), &'a Val>,
    nodes: Vec<Node>,
    env: HashMap<String, NodeId>,
    /// Names that are dims of tensor parameters or const parameters (compile-time symbols).
    static_syms: Vec<String>,
    is_builtin_alias: &'a dyn Fn(&FnSig) -> bool,
    /// f32 `matmul` without `precision=` rounds to tf32.
    default_tf32: bool,
}

type R<T> = Result<T, LowerError>;

fn gtype(ty: &Ty, span: Span) -> R<GType> {
    match ty {
        Ty::Tensor { dims, .. } if dims.iter().any(|d| d.symbols().contains(&"?")) => Err(
            LowerError::new(span, format!("a tensor whose shape is not known (`{ty}`)")),
        ),
        Ty::Tensor { dims, dtype } => Ok(GType::Tensor {
            dims: dims.clone(),
            dtype: *dtype,
        }),
        Ty::Scalar { dtype, .. } => Ok(GType::Scalar(*dtype)),
        Ty::NoneV => Ok(GType::Unit),
        other => Err(LowerError::new(
            span,
            format!(
                "a {} value (`{other}`) in a whole-tensor function",
                other.kind_name()
            ),
        )),
    }
}

impl<'a> Builder<'a> {
    fn push(&mut self, kind: NodeKind, ty: GType, span: Span) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node { kind, ty, span });
        id
    }

    fn val(&self, e: &Expr) -> R<&'a Val> {
        self.vals
            .get(&(e.span.start, e.span.end))
            .copied()
            .filter(|v| !v.ty.is_err())
            .ok_or_else(|| LowerError::new(e.span, "an expression the checker could not type"))
    }

    fn ty_of(&self, id: NodeId) -> &GType {
        &self.nodes[id.0 as usize].ty
    }

    fn is_static(&self, d: &Dim) -> bool {
        d.symbols()
            .iter()
            .all(|s| self.static_syms.iter().any(|n| n == s))
    }

    /// A compile-time scalar as a node, if the checker knows its value.
    fn known_scalar(&mut self, v: &Val, span: Span) -> Option<NodeId> {
        let Ty::Scalar { dtype, .. } = v.ty else {
            return None;
        };
        let (kind, dtype) = match v.value.as_ref()? {
            Value::Int(d) => match d.as_const() {
                Some(c) if dtype.is_float() => (NodeKind::Const(Constant::Float(c as f64)), dtype),
                Some(c) => (NodeKind::Const(Constant::Int(c)), dtype),
                None if self.is_static(d) => (NodeKind::Index(d.clone()), DType::I32),
                None => return None,
            },
            Value::Float(x) => (NodeKind::Const(Constant::Float(*x)), dtype),
            Value::Bool(b) => (NodeKind::Const(Constant::Bool(*b)), DType::Bool),
            _ => return None,
        };
        Some(self.push(kind, GType::Scalar(dtype), span))
    }

    fn const_int(&self, e: &Expr) -> R<i64> {
        self.val(e)?
            .value
            .as_ref()
            .and_then(Value::as_int)
            .ok_or_else(|| LowerError::new(e.span, "an integer argument that is not a constant"))
    }

    fn const_bool(&self, e: &Expr) -> R<bool> {
        match self.val(e)?.value {
            Some(Value::Bool(b)) => Ok(b),
            _ => Err(LowerError::new(
                e.span,
                "a bool argument that is not a constant",
            )),
        }
    }

    fn axis(&self, e: &Expr, rank: usize) -> R<usize> {
        let a = self.const_int(e)?;
        let j = if a < 0 { a + rank as i64 } else { a };
        if j < 0 || j >= rank as i64 {
            return Err(LowerError::new(
                e.span,
                format!("axis {a} of a rank-{rank} tensor"),
            ));
        }
        Ok(j as usize)
    }

    fn expr(&mut self, e: &Expr) -> R<NodeId> {
        crate::cancel::checkpoint();
        let v = self.val(e)?;
        if let Some(id) = self.known_scalar(v, e.span) {
            return Ok(id);
        }
        let ty = gtype(&v.ty, e.span)?;
        match &e.kind {
            ExprKind::Name(id) => self.env.get(&id.name).copied().ok_or_else(|| {
                LowerError::new(e.span, format!("the run-time value of `{}`", id.name))
            }),
            ExprKind::Unary { op, operand } => {
                let x = self.expr(operand)?;
                let op = match op {
                    ast::UnaryOp::Pos => return Ok(x),
                    ast::UnaryOp::Neg => UnaryOp::Neg,
                    ast::UnaryOp::Not => UnaryOp::Not,
                    // `~` of bools is logical not (the checker's meaning), as in kernels.
                    ast::UnaryOp::Invert if ty.dtype() == Some(DType::Bool) => UnaryOp::Not,
                    ast::UnaryOp::Invert => UnaryOp::Invert,
                };
                Ok(self.push(NodeKind::Unary { op, x }, ty, e.span))
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let a = self.expr(lhs)?;
                let b = self.expr(rhs)?;
                let kind = match BinaryOp::from_ast(*op) {
                    Some(op) => NodeKind::Binary { op, a, b },
                    None => NodeKind::MatMul {
                        a,
                        b,
                        tf32: self.default_tf32,
                    },
                };
                Ok(self.push(kind, ty, e.span))
            }
            ExprKind::IfElse {
                cond,
                then,
                otherwise,
            } => match self.val(cond)?.value {
                Some(Value::Bool(c)) => self.expr(if c { then } else { otherwise }),
                _ => Err(LowerError::new(
                    cond.span,
                    "a conditional expression on a run-time condition",
                )),
            },
            ExprKind::Attribute { value, attr } if attr.name == "T" => {
                let x = self.expr(value)?;
                Ok(self.push(NodeKind::Transpose { x, a: 0, b: 1 }, ty, e.span))
            }
            ExprKind::Call { func, args } => self.call(e, func, args, ty),
            // `x[:, None]`: new axes and whole dims only, a view of the same memory.
            ExprKind::Subscript { value, indices }
                if indices.iter().all(|i| match i {
                    ast::Index::Slice {
                        start: None,
                        end: None,
                        step: None,
                        ..
                    } => true,
                    ast::Index::Expr(x) => matches!(x.kind, ExprKind::None),
                    _ => false,
                }) =>
            {
                let x = self.expr(value)?;
                Ok(self.push(NodeKind::Reshape { x }, ty, e.span))
            }
            ExprKind::Subscript { value, indices } => self.subscript(e, value, indices, ty),
            _ => Err(LowerError::new(
                e.span,
                format!("this expression (`{}`) in a whole-tensor function", v.ty),
            )),
        }
    }

    /// `x[i, a:b, None, ...]`: a `Slice` node of the kept axes, then a reshape
    /// when the subscript adds new axes.
    fn subscript(
        &mut self,
        e: &Expr,
        value: &Expr,
        indices: &[ast::Index],
        ty: GType,
    ) -> R<NodeId> {
        let x = self.expr(value)?;
        let xd = self.ty_of(x).dims().to_vec();
        let mut axes = Vec::with_capacity(xd.len());
        let mut kept = Vec::new();
        let mut new_axes = false;
        for i in indices {
            let d = axes.len();
            match i {
                ast::Index::Expr(ie) if matches!(ie.kind, ExprKind::None) => new_axes = true,
                ast::Index::Expr(ie) => {
                    if matches!(self.val(ie)?.ty, Ty::Tensor { .. }) {
                        return Err(LowerError::new(
                            ie.span,
                            "indexing with an integer tensor (a gather) in a whole-tensor function",
                        ));
                    }
                    axes.push(SliceAxis::Index(self.expr(ie)?));
                }
                ast::Index::Slice {
                    start, end, span, ..
                } => {
                    let full = xd[d].clone();
                    let bound = |b: &Option<Expr>, default: Dim| -> R<Dim> {
                        match b {
                            None => Ok(default),
                            Some(b) => match &self.val(b)?.value {
                                Some(Value::Int(v)) => {
                                    Ok(crate::check::expr::python_bound(v, &full))
                                }
                                _ => Err(LowerError::new(
                                    b.span,
                                    "a slice bound that is not known when the function is specialised",
                                )),
                            },
                        }
                    };
                    let a = bound(start, Dim::constant(0))?;
                    let b = bound(end, full.clone())?;
                    let len = b
                        .checked_sub(&a)
                        .ok_or_else(|| LowerError::new(*span, "a slice length"))?;
                    if a.as_const() == Some(0) && len == full {
                        axes.push(SliceAxis::Full);
                    } else {
                        axes.push(SliceAxis::Range { start: a });
                    }
                    kept.push(len);
                    continue;
                }
            }
        }
        for d in &xd[axes.len()..] {
            axes.push(SliceAxis::Full);
            kept.push(d.clone());
        }
        let dtype = ty
            .dtype()
            .ok_or_else(|| LowerError::new(e.span, "a subscript of a tensor"))?;
        if !new_axes && kept != ty.dims() {
            return Err(LowerError::new(
                e.span,
                format!("a subscript whose shape the checker gives as `{ty}`"),
            ));
        }
        let sliced = if axes.iter().all(|a| matches!(a, SliceAxis::Full)) {
            x
        } else {
            self.push(
                NodeKind::Slice { x, axes },
                GType::Tensor { dims: kept, dtype },
                e.span,
            )
        };
        if new_axes || sliced == x {
            Ok(self.push(NodeKind::Reshape { x: sliced }, ty, e.span))
        } else {
            Ok(sliced)
        }
    }

    /// Binds call arguments to parameter names (positional, then by name;
    /// `dim=` is `axis=`).
    fn bind<'e>(params: &[&str], args: &'e [ast::Arg], span: Span) -> R<Vec<Option<&'e Expr>>> {
        let mut slots = vec![None; params.len()];
        let mut pos = 0;
        for a in args {
            let j = match &a.name {
                None => {
                    pos += 1;
                    pos - 1
                }
                Some(n) => {
                    let name = if n.name == "dim" && !params.contains(&"dim") {
                        "axis"
                    } else {
                        n.name.as_str()
                    };
                    params
                        .iter()
                        .position(|p| *p == name)
                        .ok_or_else(|| LowerError::new(a.span, format!("argument `{}`", n.name)))?
                }
            };
            if j >= slots.len() {
                return Err(LowerError::new(span, "too many arguments"));
            }
            slots[j] = Some(&a.value);
        }
        Ok(slots)
    }

    /// The values of `range(a)`, `range(a, b)` or `range(a, b, step)` with
    /// compile-time integer arguments (at most 64 of them).
    fn const_range(&self, iter: &Expr) -> R<Vec<i64>> {
        let not_const = || {
            LowerError::new(
                iter.span,
                "a `for` loop over anything but `range` of compile-time integers",
            )
        };
        let ExprKind::Call { func, args } = &iter.kind else {
            return Err(not_const());
        };
        if !matches!(&func.kind, ExprKind::Name(n) if n.name == "range")
            || args.iter().any(|a| a.name.is_some())
        {
            return Err(not_const());
        }
        let v: Vec<i64> = args
            .iter()
            .map(|a| self.const_int(&a.value).map_err(|_| not_const()))
            .collect::<R<_>>()?;
        let (lo, hi, step) = match v[..] {
            [b] => (0, b, 1),
            [a, b] => (a, b, 1),
            [a, b, c] if c != 0 => (a, b, c),
            _ => return Err(not_const()),
        };
        let mut out = Vec::new();
        let mut i = lo;
        while (step > 0 && i < hi) || (step < 0 && i > hi) {
            out.push(i);
            if out.len() > 64 {
                return Err(LowerError::new(
                    iter.span,
                    "a `for` loop of more than 64 trips in a whole-tensor function (loops are unrolled)",
                ));
            }
            i += step;
        }
        Ok(out)
    }

    fn opt(&mut self, e: Option<&Expr>) -> R<Option<NodeId>> {
        match e {
            Some(e) if matches!(e.kind, ExprKind::None) => Ok(None),
            Some(e) => self.expr(e).map(Some),
            None => Ok(None),
        }
    }

    fn call(&mut self, e: &Expr, func: &Expr, args: &[ast::Arg], ty: GType) -> R<NodeId> {
        let (callee_expr, grid) = match &func.kind {
            ExprKind::Subscript { value, indices } => (&**value, Some(indices)),
            _ => (func, None),
        };
        let callee = match &self.val(callee_expr)?.ty {
            Ty::Callable(c) => c.clone(),
            other => {
                return Err(LowerError::new(func.span, format!("calling a `{other}`")));
            }
        };
        match callee {
            Callee::Method { name: "to", .. } => {
                let ExprKind::Attribute { value, .. } = &callee_expr.kind else {
                    return Err(LowerError::new(func.span, "a method call"));
                };
                let x = self.expr(value)?;
                let to = ty
                    .dtype()
                    .ok_or_else(|| LowerError::new(e.span, "a cast"))?;
                Ok(self.push(NodeKind::Cast { x, to }, ty, e.span))
            }
            Callee::Method { name, .. } => {
                Err(LowerError::new(func.span, format!("the method `{name}`")))
            }
            Callee::Builtin(b) => self.builtin(b, e, args, ty),
            Callee::Function(sig) if sig.is_kernel => self.kernel_call(&sig, e, grid, args),
            Callee::Function(sig) if (self.is_builtin_alias)(&sig) => {
                let b = Builtin::from_name(&sig.name)
                    .ok_or_else(|| LowerError::new(func.span, "an unknown builtin"))?;
                self.builtin(b, e, args, ty)
            }
            Callee::Function(sig) => {
                let names: Vec<&str> = sig.params.iter().map(|p| p.name.as_str()).collect();
                let slots = Self::bind(&names, args, e.span)?;
                let mut bound = Vec::new();
                let mut consts = Vec::new();
                for (p, a) in sig.params.iter().zip(slots) {
                    let Some(a) = a else {
                        // A scalar parameter left at its default.
                        let c = match (&p.ty, &p.default) {
                            (Ty::Scalar { dtype, .. }, Some(v)) => match v {
                                Value::Float(x) => Some((Constant::Float(*x), *dtype)),
                                Value::Bool(b) => Some((Constant::Bool(*b), *dtype)),
                                v => v.as_int().map(|i| {
                                    let c = if dtype.is_float() {
                                        Constant::Float(i as f64)
                                    } else {
                                        Constant::Int(i)
                                    };
                                    (c, *dtype)
                                }),
                            },
                            _ => None,
                        };
                        if let (false, Some((c, dtype))) = (p.is_const, c) {
                            let c = self.push(NodeKind::Const(c), GType::Scalar(dtype), e.span);
                            bound.push((p.name.clone(), c));
                        }
                        continue;
                    };
                    if p.is_const {
                        let v = self.val(a)?.value.clone().ok_or_else(|| {
                            LowerError::new(a.span, "a const argument without a known value")
                        })?;
                        consts.push((p.name.clone(), v));
                    } else {
                        bound.push((p.name.clone(), self.expr(a)?));
                    }
                }
                Ok(self.push(
                    NodeKind::Call {
                        func: sig.name.clone(),
                        sig: sig.clone(),
                        args: bound,
                        consts,
                    },
                    ty,
                    e.span,
                ))
            }
        }
    }

    fn kernel_call(
        &mut self,
        sig: &FnSig,
        e: &Expr,
        grid: Option<&Vec<ast::Index>>,
        args: &[ast::Arg],
    ) -> R<NodeId> {
        let grid = match grid {
            None => None,
            Some(indices) => {
                let mut g = Vec::new();
                for i in indices {
                    let items: Vec<&Expr> = match i {
                        ast::Index::Expr(Expr {
                            kind: ExprKind::Tuple(items),
                            ..
                        }) => items.iter().collect(),
                        ast::Index::Expr(x) => vec![x],
                        ast::Index::Slice { span, .. } => {
                            return Err(LowerError::new(*span, "a slice in a launch grid"))
                        }
                    };
                    for x in items {
                        g.push(self.expr(x)?);
                    }
                }
                Some(g)
            }
        };
        let names: Vec<&str> = sig.params.iter().map(|p| p.name.as_str()).collect();
        let slots = Self::bind(&names, args, e.span)?;
        let mut bound = Vec::new();
        let mut consts = Vec::new();
        for (p, a) in sig.params.iter().zip(slots) {
            let Some(a) = a else { continue };
            if p.is_const {
                let v = self.val(a)?.value.clone().ok_or_else(|| {
                    LowerError::new(a.span, "a const argument without a known value")
                })?;
                consts.push((p.name.clone(), v));
            } else {
                bound.push((p.name.clone(), self.expr(a)?));
            }
        }
        Ok(self.push(
            NodeKind::KernelCall {
                kernel: sig.name.clone(),
                grid,
                args: bound,
                consts,
            },
            GType::Unit,
            e.span,
        ))
    }

    fn builtin(&mut self, id: Builtin, e: &Expr, args: &[ast::Arg], ty: GType) -> R<NodeId> {
        let (name, b) = (id.name(), id.info());
        let positional = args.iter().filter(|a| a.name.is_none()).count();
        if matches!(id, B::Min | B::Max) && positional >= 2 {
            // Scalar min/max of run-time values.
            let op = if id == B::Min {
                BinaryOp::Min
            } else {
                BinaryOp::Max
            };
            let mut acc = self.expr(&args[0].value)?;
            for a in &args[1..] {
                let x = self.expr(&a.value)?;
                acc = self.push(NodeKind::Binary { op, a: acc, b: x }, ty.clone(), e.span);
            }
            return Ok(acc);
        }
        let slots = Self::bind(b.params, args, e.span)?;
        let arg = |j: usize| slots.get(j).copied().flatten();
        let need = |j: usize| {
            arg(j).ok_or_else(|| {
                LowerError::new(e.span, format!("`{name}` without its argument {j}"))
            })
        };
        let kind = match id {
            B::Exp
            | B::Exp2
            | B::Log
            | B::Log2
            | B::Sqrt
            | B::Rsqrt
            | B::Abs
            | B::Sigmoid
            | B::Tanh
            | B::Erf => NodeKind::Unary {
                op: unary_op(id).ok_or_else(|| LowerError::new(e.span, format!("`{name}`")))?,
                x: self.expr(need(0)?)?,
            },
            B::Relu | B::Gelu | B::Silu => NodeKind::Activation {
                act: match id {
                    B::Relu => Activation::Relu,
                    B::Gelu => Activation::Gelu,
                    _ => Activation::Silu,
                },
                x: self.expr(need(0)?)?,
            },
            B::Maximum | B::Minimum => NodeKind::Binary {
                op: if id == B::Maximum {
                    BinaryOp::Max
                } else {
                    BinaryOp::Min
                },
                a: self.expr(need(0)?)?,
                b: self.expr(need(1)?)?,
            },
            B::Where => NodeKind::Select {
                cond: self.expr(need(0)?)?,
                a: self.expr(need(1)?)?,
                b: self.expr(need(2)?)?,
            },
            B::Cdiv => {
                // (a + b - 1) // b on run-time scalars.
                let a = self.expr(need(0)?)?;
                let bb = self.expr(need(1)?)?;
                let one = self.push(NodeKind::Const(Constant::Int(1)), ty.clone(), e.span);
                let s = self.push(
                    NodeKind::Binary {
                        op: BinaryOp::Add,
                        a,
                        b: bb,
                    },
                    ty.clone(),
                    e.span,
                );
                let s = self.push(
                    NodeKind::Binary {
                        op: BinaryOp::Sub,
                        a: s,
                        b: one,
                    },
                    ty.clone(),
                    e.span,
                );
                NodeKind::Binary {
                    op: BinaryOp::FloorDiv,
                    a: s,
                    b: bb,
                }
            }
            B::Sum | B::Mean | B::Min | B::Max => {
                let x0 = need(0)?;
                let x = self.expr(x0)?;
                let rank = self.ty_of(x).dims().len();
                let axis = match arg(1) {
                    Some(a) if !matches!(a.kind, ExprKind::None) => Some(self.axis(a, rank)?),
                    _ => None,
                };
                let keepdims = match arg(2) {
                    Some(k) => self.const_bool(k)?,
                    None => false,
                };
                NodeKind::Reduce {
                    op: match id {
                        B::Sum => ReduceKind::Sum,
                        B::Mean => ReduceKind::Mean,
                        B::Min => ReduceKind::Min,
                        _ => ReduceKind::Max,
                    },
                    x,
                    axis,
                    keepdims,
                }
            }
            B::Matmul => {
                let tf32 = match arg(2) {
                    Some(p) => match &p.kind {
                        ExprKind::Str(s) => s == "tf32",
                        _ => self.default_tf32,
                    },
                    None => self.default_tf32,
                };
                NodeKind::MatMul {
                    a: self.expr(need(0)?)?,
                    b: self.expr(need(1)?)?,
                    tf32,
                }
            }
            B::Softmax => {
                let x = self.expr(need(0)?)?;
                let rank = self.ty_of(x).dims().len();
                let axis = match arg(1) {
                    Some(a) => self.axis(a, rank)?,
                    None => rank - 1,
                };
                NodeKind::Softmax { x, axis }
            }
            B::LayerNorm => NodeKind::LayerNorm {
                x: self.expr(need(0)?)?,
                weight: self.opt(arg(1))?,
                bias: self.opt(arg(2))?,
                eps: self.opt(arg(3))?,
            },
            B::RmsNorm => NodeKind::RmsNorm {
                x: self.expr(need(0)?)?,
                weight: self.opt(arg(1))?,
                eps: self.opt(arg(2))?,
            },
            B::Transpose => {
                let x = self.expr(need(0)?)?;
                let rank = self.ty_of(x).dims().len();
                let a = self.axis(need(1)?, rank)?;
                let b = self.axis(need(2)?, rank)?;
                NodeKind::Transpose { x, a, b }
            }
            B::Reshape => NodeKind::Reshape {
                x: self.expr(need(0)?)?,
            },
            B::Zeros => NodeKind::Fill(Fill::Zeros),
            B::Ones => NodeKind::Fill(Fill::Ones),
            B::Empty => NodeKind::Fill(Fill::Empty),
            B::Full => NodeKind::Fill(Fill::Full(self.expr(need(1)?)?)),
            B::Randn => NodeKind::Fill(Fill::Randn {
                seed: self.opt(arg(2))?,
            }),
            B::Tensor => {
                let data = need(0)?;
                let dtype = ty.dtype().unwrap_or(DType::F32);
                let mut out = Vec::new();
                if !flatten_literal(self.val(data)?.value.as_ref(), dtype, &mut out) {
                    return Err(LowerError::new(
                        data.span,
                        "a `tensor` whose elements are not compile-time numbers",
                    ));
                }
                NodeKind::Fill(Fill::Data(out))
            }
            // Kernel and session builtins: the checker rejects them here
            // (E0503, E0725), and `range` is lowered by `for`.
            B::ProgramId
            | B::NumPrograms
            | B::Arange
            | B::Load
            | B::Store
            | B::AtomicAdd
            | B::Dot
            | B::Range
            | B::Print
            | B::Len
            | B::LoadNpy
            | B::SaveNpy
            | B::SetFloat32MatmulPrecision => {
                return Err(LowerError::new(
                    e.span,
                    format!("the builtin `{name}` in a whole-tensor function"),
                ))
            }
        };
        Ok(self.push(kind, ty, e.span))
    }

    fn block(&mut self, body: &[ast::Stmt], outputs: &mut Vec<NodeId>) -> R<bool> {
        for s in body {
            match &s.kind {
                StmtKind::Expr(Expr {
                    kind: ExprKind::Str(_),
                    ..
                })
                | StmtKind::Pass => {}
                StmtKind::Expr(x) => {
                    self.expr(x)?;
                }
                StmtKind::Assign { target, value, .. } => match (&target.kind, &value.kind) {
                    // `s = x.shape`, `m, n = x.shape`, `d = x.dtype`: compile-time
                    // values, read from the checker's values where they are used.
                    _ if matches!(self.val(value)?.ty, Ty::Shape(_) | Ty::DTypeV) => {}
                    (ExprKind::Name(id), _) => {
                        let v = self.expr(value)?;
                        self.env.insert(id.name.clone(), v);
                    }
                    // `a, b = x, y`: every value first, then the names.
                    (ExprKind::Tuple(ts), ExprKind::Tuple(vs))
                        if ts.len() == vs.len()
                            && ts.iter().all(|t| matches!(t.kind, ExprKind::Name(_))) =>
                    {
                        let vals: Vec<NodeId> =
                            vs.iter().map(|v| self.expr(v)).collect::<R<_>>()?;
                        for (t, v) in ts.iter().zip(vals) {
                            if let ExprKind::Name(id) = &t.kind {
                                self.env.insert(id.name.clone(), v);
                            }
                        }
                    }
                    _ => return Err(LowerError::new(target.span, "assignment to this target")),
                },
                StmtKind::AugAssign { target, op, value } => {
                    let ExprKind::Name(id) = &target.kind else {
                        return Err(LowerError::new(target.span, "assignment to this target"));
                    };
                    let a = *self.env.get(&id.name).ok_or_else(|| {
                        LowerError::new(target.span, format!("the run-time value of `{}`", id.name))
                    })?;
                    let b = self.expr(value)?;
                    let ty = self.ty_of(a).clone();
                    let kind = match BinaryOp::from_ast(*op) {
                        Some(op) => NodeKind::Binary { op, a, b },
                        None => NodeKind::MatMul {
                            a,
                            b,
                            tf32: self.default_tf32,
                        },
                    };
                    let n = self.push(kind, ty, s.span);
                    self.env.insert(id.name.clone(), n);
                }
                StmtKind::Return(Some(x)) => {
                    match &x.kind {
                        ExprKind::Tuple(items) => {
                            for i in items {
                                outputs.push(self.expr(i)?);
                            }
                        }
                        _ => {
                            // `return k(...)` of a kernel launch returns None:
                            // the launch runs, and nothing is returned.
                            let n = self.expr(x)?;
                            if !matches!(self.ty_of(n), GType::Unit) {
                                outputs.push(n);
                            }
                        }
                    }
                    return Ok(true);
                }
                StmtKind::Return(None) => return Ok(true),
                StmtKind::If { branches, orelse } => {
                    if self.if_chain(branches, orelse.as_deref(), outputs)? {
                        return Ok(true);
                    }
                }
                StmtKind::While { cond, body } => {
                    if self.val(cond)?.value != Some(Value::Bool(false)) {
                        self.runtime_while(cond, body)?;
                    }
                }
                StmtKind::For { target, iter, body } if self.const_range(iter).is_err() => {
                    self.runtime_for(target, iter, body)?;
                }
                StmtKind::For { target, iter, body } => {
                    // Unrolled: `range(...)` with compile-time bounds, at most 64 trips.
                    let trips = self.const_range(iter)?;
                    for i in trips {
                        let c = self.push(
                            NodeKind::Const(Constant::Int(i)),
                            GType::Scalar(DType::I32),
                            target.span,
                        );
                        self.env.insert(target.name.clone(), c);
                        if self.block(body, outputs)? {
                            return Ok(true);
                        }
                    }
                }
                _ => {
                    return Err(LowerError::new(
                        s.span,
                        "`break` and `continue` in a whole-tensor function",
                    ))
                }
            }
        }
        Ok(false)
    }

    /// `if`/`elif`/`else`: branches on compile-time conditions are taken or
    /// dropped; the first run-time condition makes an `If` node whose else
    /// region holds the rest of the chain. Returns whether the block returned.
    fn if_chain(
        &mut self,
        branches: &[(Expr, ast::Block)],
        orelse: Option<&[ast::Stmt]>,
        outputs: &mut Vec<NodeId>,
    ) -> R<bool> {
        for (j, (cond, body)) in branches.iter().enumerate() {
            match self.val(cond)?.value {
                Some(Value::Bool(true)) => return self.block(body, outputs),
                Some(Value::Bool(false)) => {}
                _ => {
                    self.runtime_if(cond, body, &branches[j + 1..], orelse)?;
                    return Ok(false);
                }
            }
        }
        match orelse {
            Some(b) => self.block(b, outputs),
            None => Ok(false),
        }
    }

    /// A child builder for a region, sharing the checker's values.
    fn child(&self) -> Builder<'a> {
        Builder {
            vals: self.vals.clone(),
            nodes: Vec::new(),
            env: HashMap::new(),
            static_syms: self.static_syms.clone(),
            is_builtin_alias: self.is_builtin_alias,
            default_tf32: self.default_tf32,
        }
    }

    /// Builds a region: params `leading`, then one capture per name bound
    /// here (those the region does not read are dropped); `build` fills it
    /// and gives its outputs.
    fn region(
        &self,
        name: &str,
        leading: &[(String, GType)],
        span: Span,
        build: &mut dyn FnMut(&mut Builder<'a>) -> R<Vec<NodeId>>,
    ) -> R<Region> {
        let mut c = self.child();
        let mut params = Vec::new();
        for (n, ty) in leading {
            let id = c.push(NodeKind::Param(params.len()), ty.clone(), span);
            c.env.insert(n.clone(), id);
            params.push(GParam {
                name: n.clone(),
                ty: ty.clone(),
            });
        }
        let mut names: Vec<&String> = self
            .env
            .keys()
            .filter(|n| !leading.iter().any(|(l, _)| l == *n))
            .collect();
        names.sort();
        let mut captures = Vec::new();
        for n in names {
            let outer = self.env[n];
            let ty = self.ty_of(outer).clone();
            let id = c.push(NodeKind::Param(params.len()), ty.clone(), span);
            c.env.insert(n.clone(), id);
            params.push(GParam {
                name: n.clone(),
                ty,
            });
            captures.push(outer);
        }
        let outputs = build(&mut c)?;
        let g = Graph {
            name: name.to_string(),
            params,
            nodes: c.nodes,
            outputs,
        };
        let (g, kept) = prune_captures(g, leading.len());
        Ok(Region {
            graph: std::sync::Arc::new(g),
            captures: kept.into_iter().map(|k| captures[k]).collect(),
        })
    }

    /// A condition node: a bool scalar or one-element bool tensor.
    fn condition(&mut self, cond: &Expr) -> R<NodeId> {
        let c = self.expr(cond)?;
        if !is_condition(self.ty_of(c)) {
            return Err(LowerError::new(
                cond.span,
                format!("a condition of type `{}`", self.ty_of(c)),
            ));
        }
        Ok(c)
    }

    fn runtime_if(
        &mut self,
        cond: &Expr,
        body: &[ast::Stmt],
        rest: &[(Expr, ast::Block)],
        orelse: Option<&[ast::Stmt]>,
    ) -> R<()> {
        let c = self.condition(cond)?;
        let (mut in_then, mut in_else) = (Vec::new(), Vec::new());
        assigned_names(body, &mut in_then);
        for (_, b) in rest {
            assigned_names(b, &mut in_else);
        }
        if let Some(b) = orelse {
            assigned_names(b, &mut in_else);
        }
        // Results: names bound before and assigned on some path, or assigned on both.
        let mut names: Vec<String> = Vec::new();
        for n in in_then.iter().chain(&in_else) {
            let bound = self.env.contains_key(n) || (in_then.contains(n) && in_else.contains(n));
            if bound && !names.contains(n) {
                names.push(n.clone());
            }
        }
        let span = cond.span;
        let results = |b: &Builder<'a>| -> R<Vec<NodeId>> {
            names
                .iter()
                .map(|n| {
                    b.env.get(n).copied().ok_or_else(|| {
                        LowerError::new(
                            span,
                            format!(
                                "`{n}`, bound on one path of an `if` on a run-time condition only"
                            ),
                        )
                    })
                })
                .collect()
        };
        let returns = || LowerError::new(span, "a `return` inside an `if` on a run-time condition");
        let then = self.region("then", &[], span, &mut |b| {
            if b.block(body, &mut Vec::new())? {
                return Err(returns());
            }
            results(b)
        })?;
        let otherwise = self.region("else", &[], span, &mut |b| {
            if b.if_chain(rest, orelse, &mut Vec::new())? {
                return Err(returns());
            }
            results(b)
        })?;
        let tys = region_outputs(&then);
        if tys != region_outputs(&otherwise) {
            return Err(LowerError::new(
                span,
                "branches that give a name different shapes or dtypes",
            ));
        }
        let node = self.push(
            NodeKind::If {
                cond: c,
                then,
                otherwise,
            },
            GType::Unit,
            span,
        );
        self.project(node, &names, tys, span);
        Ok(())
    }

    /// Binds `names` to the results of a control-flow node.
    fn project(&mut self, node: NodeId, names: &[String], tys: Vec<GType>, span: Span) {
        for (index, (n, ty)) in names.iter().zip(tys).enumerate() {
            let p = self.push(NodeKind::Project { of: node, index }, ty, span);
            self.env.insert(n.clone(), p);
        }
    }

    /// Names a loop body assigns that are bound before it (its carried values),
    /// with their types, as the region's leading params.
    fn carried(&self, body: &[ast::Stmt], skip: Option<&str>) -> Vec<(String, GType)> {
        let mut assigned = Vec::new();
        assigned_names(body, &mut assigned);
        let mut out: Vec<(String, GType)> = Vec::new();
        for n in assigned {
            if Some(n.as_str()) == skip || out.iter().any(|(m, _)| *m == n) {
                continue;
            }
            if let Some(id) = self.env.get(&n) {
                out.push((n, self.ty_of(*id).clone()));
            }
        }
        out
    }

    /// The loop's carried values after its body, which must keep their types.
    fn loop_results(b: &Builder<'a>, carried: &[(String, GType)], span: Span) -> R<Vec<NodeId>> {
        carried
            .iter()
            .map(|(n, ty)| {
                let id = b.env[n];
                if b.ty_of(id) != ty {
                    return Err(LowerError::new(
                        span,
                        format!("a loop that changes `{n}` from `{ty}` to `{}`", b.ty_of(id)),
                    ));
                }
                Ok(id)
            })
            .collect()
    }

    fn runtime_for(&mut self, target: &ast::Ident, iter: &Expr, body: &[ast::Stmt]) -> R<()> {
        let span = iter.span;
        let not_range = || {
            LowerError::new(
                span,
                "a `for` loop over anything but `range(...)` in a whole-tensor function",
            )
        };
        let ExprKind::Call { func, args } = &iter.kind else {
            return Err(not_range());
        };
        if !matches!(&func.kind, ExprKind::Name(n) if n.name == "range")
            || args.iter().any(|a| a.name.is_some())
        {
            return Err(not_range());
        }
        let int = |b: &mut Self, v: i64| {
            b.push(
                NodeKind::Const(Constant::Int(v)),
                GType::Scalar(DType::I32),
                span,
            )
        };
        let (lo, hi, step) = match &args[..] {
            [h] => (int(self, 0), self.expr(&h.value)?, int(self, 1)),
            [l, h] => (self.expr(&l.value)?, self.expr(&h.value)?, int(self, 1)),
            [l, h, st] => (
                self.expr(&l.value)?,
                self.expr(&h.value)?,
                self.expr(&st.value)?,
            ),
            _ => return Err(not_range()),
        };
        let carried = self.carried(body, Some(&target.name));
        let init: Vec<NodeId> = carried.iter().map(|(n, _)| self.env[n]).collect();
        let mut leading = vec![(target.name.clone(), GType::Scalar(DType::I32))];
        leading.extend(carried.iter().cloned());
        let body_r = self.region("body", &leading, span, &mut |b| {
            if b.block(body, &mut Vec::new())? {
                return Err(LowerError::new(span, "a `return` inside a run-time loop"));
            }
            Self::loop_results(b, &carried, span)
        })?;
        let node = self.push(
            NodeKind::For {
                lo,
                hi,
                step,
                init,
                body: body_r,
            },
            GType::Unit,
            span,
        );
        let names: Vec<String> = carried.iter().map(|(n, _)| n.clone()).collect();
        self.project(
            node,
            &names,
            carried.into_iter().map(|(_, t)| t).collect(),
            span,
        );
        // The loop variable is not readable after a run-time loop.
        self.env.remove(&target.name);
        Ok(())
    }

    fn runtime_while(&mut self, cond: &Expr, body: &[ast::Stmt]) -> R<()> {
        let span = cond.span;
        let carried = self.carried(body, None);
        let init: Vec<NodeId> = carried.iter().map(|(n, _)| self.env[n]).collect();
        let cond_r = self.region("cond", &carried, span, &mut |b| {
            Ok(vec![b.condition(cond)?])
        })?;
        let body_r = self.region("body", &carried, span, &mut |b| {
            if b.block(body, &mut Vec::new())? {
                return Err(LowerError::new(span, "a `return` inside a run-time loop"));
            }
            Self::loop_results(b, &carried, span)
        })?;
        let node = self.push(
            NodeKind::While {
                init,
                cond: cond_r,
                body: body_r,
            },
            GType::Unit,
            span,
        );
        let names: Vec<String> = carried.iter().map(|(n, _)| n.clone()).collect();
        self.project(
            node,
            &names,
            carried.into_iter().map(|(_, t)| t).collect(),
            span,
        );
        Ok(())
    }
}

/// The numbers of a nested-list literal in row-major order, as constants of
/// `dtype`; false when one is not known at compile time.
fn flatten_literal(v: Option<&Value>, dtype: DType, out: &mut Vec<Constant>) -> bool {
    // An integer into an integer dtype exactly: an i64 above 2^53 does not
    // survive f64 (a float or bool element goes through f64 below).
    if let (Some(i), true) = (v.and_then(Value::as_int), dtype.is_int()) {
        out.push(Constant::Int(i));
        return true;
    }
    let c = match v {
        Some(Value::Tuple(items)) => {
            return items.iter().all(|i| flatten_literal(Some(i), dtype, out));
        }
        Some(Value::Float(x)) => *x,
        Some(Value::Bool(b)) => *b as i64 as f64,
        Some(v) => match v.as_int() {
            Some(i) => i as f64,
            None => return false,
        },
        None => return false,
    };
    out.push(if dtype == DType::Bool {
        Constant::Bool(c != 0.0)
    } else if dtype.is_float() {
        Constant::Float(c)
    } else {
        Constant::Int(c as i64)
    });
    true
}

/// Names a block assigns (assignment targets, loop variables), nested blocks included.
fn assigned_names(body: &[ast::Stmt], out: &mut Vec<String>) {
    fn targets(t: &Expr, out: &mut Vec<String>) {
        match &t.kind {
            ExprKind::Name(id) => out.push(id.name.clone()),
            ExprKind::Tuple(items) | ExprKind::List(items) => {
                items.iter().for_each(|i| targets(i, out))
            }
            _ => {}
        }
    }
    for s in body {
        match &s.kind {
            StmtKind::Assign { target, .. } | StmtKind::AugAssign { target, .. } => {
                targets(target, out)
            }
            StmtKind::If { branches, orelse } => {
                for (_, b) in branches {
                    assigned_names(b, out);
                }
                if let Some(b) = orelse {
                    assigned_names(b, out);
                }
            }
            StmtKind::For { target, body, .. } => {
                out.push(target.name.clone());
                assigned_names(body, out);
            }
            StmtKind::While { body, .. } => assigned_names(body, out),
            _ => {}
        }
    }
}

/// Drops the params after the first `leading` that no node uses; returns the
/// graph and the indices (among those params) of the ones kept.
fn prune_captures(g: Graph, leading: usize) -> (Graph, Vec<usize>) {
    let uses = g.use_counts();
    let mut map: Vec<Option<NodeId>> = Vec::with_capacity(g.nodes.len());
    let mut nodes: Vec<Node> = Vec::with_capacity(g.nodes.len());
    let mut params = Vec::new();
    let mut kept = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if let NodeKind::Param(p) = n.kind {
            if p >= leading && uses[i] == 0 {
                map.push(None);
                continue;
            }
            if p >= leading {
                kept.push(p - leading);
            }
            map.push(Some(NodeId(nodes.len() as u32)));
            nodes.push(Node {
                kind: NodeKind::Param(params.len()),
                ty: n.ty.clone(),
                span: n.span,
            });
            params.push(g.params[p].clone());
            continue;
        }
        let kind = map_operands(&n.kind, &|x| map[x.0 as usize].unwrap_or(x));
        map.push(Some(NodeId(nodes.len() as u32)));
        nodes.push(Node {
            kind,
            ty: n.ty.clone(),
            span: n.span,
        });
    }
    let outputs = g
        .outputs
        .iter()
        .map(|o| map[o.0 as usize].unwrap_or(*o))
        .collect();
    (
        Graph {
            name: g.name,
            params,
            nodes,
            outputs,
        },
        kept,
    )
}

/// Builds the Graph IR of a whole-tensor function from its AST, its signature
/// and the expression values its check recorded (`check_function_typed`).
/// `is_builtin_alias` says whether a callee is std.nn's definition of the builtin
/// of the same name. The function must have checked without errors.
pub fn build(
    f: &Function,
    sig: &FnSig,
    vals: &[(Span, Val)],
    is_builtin_alias: &dyn Fn(&FnSig) -> bool,
    default_tf32: bool,
) -> Result<Graph, LowerError> {
    if sig.is_kernel {
        return Err(LowerError::new(
            f.name.span,
            format!(
                "`{}` is a kernel: its IR is Tile IR, not Graph IR",
                f.name.name
            ),
        ));
    }
    let mut b = Builder {
        vals: vals.iter().map(|(s, v)| ((s.start, s.end), v)).collect(),
        nodes: Vec::new(),
        env: HashMap::new(),
        static_syms: Vec::new(),
        is_builtin_alias,
        default_tf32,
    };
    let mut params = Vec::new();
    for p in &sig.params {
        if p.is_const {
            b.static_syms.push(p.name.clone());
            continue;
        }
        if let Ty::Tensor { dims, .. } = &p.ty {
            for d in dims {
                b.static_syms
                    .extend(d.symbols().into_iter().map(str::to_string));
            }
        }
    }
    for p in sig.params.iter().filter(|p| !p.is_const) {
        let span = f
            .params
            .iter()
            .find(|q| q.name.name == p.name)
            .map(|q| q.name.span)
            .unwrap_or(f.name.span);
        let ty = gtype(&p.ty, span)?;
        let id = b.push(NodeKind::Param(params.len()), ty.clone(), span);
        b.env.insert(p.name.clone(), id);
        params.push(GParam {
            name: p.name.clone(),
            ty,
        });
    }
    let mut outputs = Vec::new();
    b.block(&f.body, &mut outputs)?;
    Ok(Graph {
        name: f.name.name.clone(),
        params,
        nodes: b.nodes,
        outputs,
    })
}

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

fn subst_type(t: &GType, env: &dyn Fn(&str) -> Option<Dim>) -> Option<GType> {
    Some(match t {
        GType::Tensor { dims, dtype } => GType::Tensor {
            dims: dims
                .iter()
                .map(|d| d.substitute(env))
                .collect::<Option<Vec<_>>>()?,
            dtype: *dtype,
        },
        other => other.clone(),
    })
}

/// Inlines calls to other whole-tensor functions. `resolve` gives the (already
/// inlined) graph of a callee for the const arguments of the call, or `None` to
/// keep the call (callee not found, a recursive call, const arguments it cannot
/// specialise on). A call whose dims do not bind is kept too. Inlined nodes take
/// the call's span.
/// A generic callee's instance (its dtype variables and batch runs as the
/// call's arguments bind them) is passed too; it is empty for other callees.
pub type Resolver<'a> =
    dyn FnMut(&FnSig, &[(String, Value)], &TypeEnv) -> Option<std::sync::Arc<Graph>> + 'a;

/// The instance of a generic callee that a call's argument types bind
/// (`None` when they do not bind, which the checker has reported).
fn call_env(
    sig: &FnSig,
    args: &[(String, NodeId)],
    ty: &dyn Fn(NodeId) -> GType,
) -> Option<TypeEnv> {
    if sig.generics.is_none() {
        return Some(TypeEnv::default());
    }
    let tys: Vec<(usize, Ty)> = args
        .iter()
        .filter_map(|(name, a)| {
            let j = sig.params.iter().position(|p| p.name == *name)?;
            let t = match ty(*a) {
                GType::Tensor { dims, dtype } => Ty::Tensor { dims, dtype },
                GType::Scalar(dtype) => Ty::scalar(dtype),
                GType::Unit => return None,
            };
            Some((j, t))
        })
        .collect();
    let cargs: Vec<CallArg<'_>> = tys
        .iter()
        .map(|(j, t)| CallArg {
            param: *j,
            ty: t,
            span: Span::new(0, 0),
        })
        .collect();
    bind_call(sig, &cargs).ok()
}

pub fn inline(g: &Graph, resolve: &mut Resolver<'_>) -> Graph {
    let mut nodes: Vec<Node> = Vec::new();
    let mut map: Vec<NodeId> = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        let remap = |x: NodeId| map[x.0 as usize];
        if let NodeKind::Call {
            sig, args, consts, ..
        } = &n.kind
        {
            let env = call_env(sig, args, &|a| nodes[remap(a).0 as usize].ty.clone());
            if let Some(callee) = env.and_then(|env| resolve(sig, consts, &env)) {
                if let Some(out) = inline_one(&mut nodes, &callee, args, &remap, n.span) {
                    map.push(out);
                    continue;
                }
            }
        }
        let mut kind = map_operands(&n.kind, &remap);
        for r in regions_mut(&mut kind) {
            r.graph = std::sync::Arc::new(inline(&r.graph, resolve));
        }
        map.push(NodeId(nodes.len() as u32));
        nodes.push(Node {
            kind,
            ty: n.ty.clone(),
            span: n.span,
        });
    }
    Graph {
        name: g.name.clone(),
        params: g.params.clone(),
        nodes,
        outputs: g.outputs.iter().map(|o| map[o.0 as usize]).collect(),
    }
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

/// A node kind with the dims it names substituted (inside regions too), or
/// `None` when a dim does not bind.
fn subst_kind(kind: NodeKind, env: &dyn Fn(&str) -> Option<Dim>, span: Span) -> Option<NodeKind> {
    Some(match kind {
        NodeKind::Index(d) => NodeKind::Index(d.substitute(env)?),
        NodeKind::Slice { x, axes } => NodeKind::Slice {
            x,
            axes: axes
                .into_iter()
                .map(|a| match a {
                    SliceAxis::Range { start } => start
                        .substitute(env)
                        .map(|start| SliceAxis::Range { start }),
                    a => Some(a),
                })
                .collect::<Option<Vec<_>>>()?,
        },
        mut k => {
            for r in regions_mut(&mut k) {
                r.graph = std::sync::Arc::new(subst_graph(&r.graph, env, span)?);
            }
            k
        }
    })
}

/// A region's graph with dims substituted and every span set to `span`.
fn subst_graph(g: &Graph, env: &dyn Fn(&str) -> Option<Dim>, span: Span) -> Option<Graph> {
    Some(Graph {
        name: g.name.clone(),
        params: g
            .params
            .iter()
            .map(|p| {
                Some(GParam {
                    name: p.name.clone(),
                    ty: subst_type(&p.ty, env)?,
                })
            })
            .collect::<Option<Vec<_>>>()?,
        nodes: g
            .nodes
            .iter()
            .map(|n| {
                Some(Node {
                    kind: subst_kind(n.kind.clone(), env, span)?,
                    ty: subst_type(&n.ty, env)?,
                    span,
                })
            })
            .collect::<Option<Vec<_>>>()?,
        outputs: g.outputs.clone(),
    })
}

/// Appends the callee's nodes; returns its result node (or `None`, leaving
/// `nodes` as it was, when the call cannot be inlined).
fn inline_one(
    nodes: &mut Vec<Node>,
    callee: &Graph,
    args: &[(String, NodeId)],
    remap: &dyn Fn(NodeId) -> NodeId,
    span: Span,
) -> Option<NodeId> {
    let [out] = callee.outputs[..] else {
        return None;
    };
    // Bind the callee's dim names to the argument dims.
    let mut dims: HashMap<String, Dim> = HashMap::new();
    let mut bound: HashMap<usize, NodeId> = HashMap::new();
    for (i, p) in callee.params.iter().enumerate() {
        let (_, a) = args.iter().find(|(n, _)| *n == p.name)?;
        let a = remap(*a);
        let at = &nodes[a.0 as usize].ty;
        if let (GType::Tensor { dims: pd, .. }, GType::Tensor { dims: ad, .. }) = (&p.ty, at) {
            if pd.len() != ad.len() {
                return None;
            }
            for (pd, ad) in pd.iter().zip(ad) {
                if let Some(s) = pd.as_symbol() {
                    match dims.get(s) {
                        Some(prev) if prev != ad => return None,
                        _ => {
                            dims.insert(s.to_string(), ad.clone());
                        }
                    }
                }
            }
        }
        // A shape computed from an integer parameter (`zeros([n], f32)`) names
        // the parameter's symbol: bound by a known argument too.
        if matches!(p.ty, GType::Scalar(d) if d.is_int()) && !dims.contains_key(&p.name) {
            match &nodes[a.0 as usize].kind {
                NodeKind::Const(Constant::Int(v)) => {
                    dims.insert(p.name.clone(), Dim::constant(*v));
                }
                NodeKind::Index(d) => {
                    dims.insert(p.name.clone(), d.clone());
                }
                _ => {}
            }
        }
        bound.insert(i, a);
    }
    let env = |s: &str| dims.get(s).cloned();
    let start = nodes.len();
    let mut local: Vec<NodeId> = Vec::with_capacity(callee.nodes.len());
    for n in &callee.nodes {
        if let NodeKind::Param(i) = n.kind {
            local.push(*bound.get(&i)?);
            continue;
        }
        let Some(kind) = subst_kind(map_operands(&n.kind, &|x| local[x.0 as usize]), &env, span)
        else {
            nodes.truncate(start);
            return None;
        };
        let Some(ty) = subst_type(&n.ty, &env) else {
            nodes.truncate(start);
            return None;
        };
        local.push(NodeId(nodes.len() as u32));
        nodes.push(Node { kind, ty, span });
    }
    Some(local[out.0 as usize])
}

/// Checks the graph's invariants: operands defined before use, types
/// consistent with each op (broadcasting, matmul inner dims, axes), outputs valued.
pub fn verify(g: &Graph) -> Result<(), String> {
    let err = |i: usize, m: String| Err(format!("graph `{}`: %{i}: {m}", g.name));
    for (i, n) in g.nodes.iter().enumerate() {
        for o in operands(&n.kind) {
            if o.0 as usize >= i {
                return err(i, format!("operand {o} is not defined before its use"));
            }
            if matches!(g.ty(o), GType::Unit) && !matches!(n.kind, NodeKind::Project { .. }) {
                return err(i, format!("operand {o} has no value"));
            }
        }
        if let Err(m) = verify_control(g, n) {
            return err(i, m);
        }
        let dims = |id: NodeId| g.ty(id).dims().to_vec();
        let rank = n.ty.dims().len();
        match &n.kind {
            NodeKind::Param(p) => {
                if g.params.get(*p).map(|p| &p.ty) != Some(&n.ty) {
                    return err(i, format!("param {p} does not match the signature"));
                }
            }
            NodeKind::Const(_) | NodeKind::Index(_) => {
                if !n.ty.is_scalar() {
                    return err(i, "a constant that is not a scalar".into());
                }
            }
            NodeKind::Binary { a, b, .. } => {
                if broadcast(&dims(*a), &dims(*b)).as_deref() != Some(n.ty.dims()) {
                    return err(
                        i,
                        "result shape is not the broadcast of the operands".into(),
                    );
                }
            }
            NodeKind::Select { cond, a, b } => {
                let ab = broadcast(&dims(*a), &dims(*b));
                if ab.and_then(|ab| broadcast(&dims(*cond), &ab)).as_deref() != Some(n.ty.dims()) {
                    return err(
                        i,
                        "result shape is not the broadcast of the operands".into(),
                    );
                }
            }
            NodeKind::Unary { x, .. }
            | NodeKind::Activation { x, .. }
            | NodeKind::Cast { x, .. }
            | NodeKind::Softmax { x, .. }
            | NodeKind::LayerNorm { x, .. }
            | NodeKind::RmsNorm { x, .. } => {
                if dims(*x) != n.ty.dims() {
                    return err(i, "an elementwise or row op changes the shape".into());
                }
                if let NodeKind::Softmax { axis, .. } = &n.kind {
                    if *axis >= rank {
                        return err(i, format!("softmax axis {axis} out of range"));
                    }
                }
            }
            NodeKind::MatMul { a, b, .. } => {
                let (mut da, mut db) = (dims(*a), dims(*b));
                if da.is_empty() || db.is_empty() {
                    return err(i, "matmul of a scalar".into());
                }
                if da.len() == 1 {
                    da.insert(0, Dim::constant(1));
                }
                if db.len() == 1 {
                    db.push(Dim::constant(1));
                }
                if da[da.len() - 1] != db[db.len() - 2] {
                    return err(i, "matmul inner dims differ".into());
                }
            }
            NodeKind::Reduce {
                x, axis, keepdims, ..
            } => {
                let xd = dims(*x);
                let expect: Vec<Dim> = match axis {
                    Some(j) if *j >= xd.len() => {
                        return err(i, format!("reduce axis {j} out of range"))
                    }
                    Some(j) => xd
                        .iter()
                        .enumerate()
                        .filter_map(|(k, d)| {
                            if k == *j {
                                keepdims.then(|| Dim::constant(1))
                            } else {
                                Some(d.clone())
                            }
                        })
                        .collect(),
                    None if *keepdims => vec![Dim::constant(1); xd.len()],
                    None => vec![],
                };
                if expect != n.ty.dims() {
                    return err(i, "reduce result shape".into());
                }
            }
            NodeKind::Transpose { x, a, b } => {
                let mut xd = dims(*x);
                if *a >= xd.len() || *b >= xd.len() {
                    return err(i, "transpose axis out of range".into());
                }
                xd.swap(*a, *b);
                if xd != n.ty.dims() {
                    return err(i, "transpose result shape".into());
                }
            }
            NodeKind::Slice { x, axes } => {
                let xd = dims(*x);
                if axes.len() != xd.len() {
                    return err(i, "a subscript without one entry per axis".into());
                }
                let kept = axes
                    .iter()
                    .filter(|a| !matches!(a, SliceAxis::Index(_)))
                    .count();
                if kept != rank {
                    return err(i, "a subscript's result rank".into());
                }
                let mut k = 0;
                for (a, d) in axes.iter().zip(&xd) {
                    match a {
                        SliceAxis::Full if n.ty.dims()[k] != *d => {
                            return err(i, "a `:` axis changes its size".into())
                        }
                        SliceAxis::Index(ix) if !g.ty(*ix).dtype().is_some_and(DType::is_int) => {
                            return err(i, "an index that is not an integer scalar".into())
                        }
                        _ => {}
                    }
                    if !matches!(a, SliceAxis::Index(_)) {
                        k += 1;
                    }
                }
            }
            NodeKind::KernelCall { .. } => {
                if n.ty != GType::Unit {
                    return err(i, "a kernel call has a value".into());
                }
            }
            NodeKind::Reshape { .. }
            | NodeKind::Fill(_)
            | NodeKind::Call { .. }
            | NodeKind::If { .. }
            | NodeKind::For { .. }
            | NodeKind::While { .. }
            | NodeKind::Project { .. } => {}
        }
    }
    for o in &g.outputs {
        if o.0 as usize >= g.nodes.len() || matches!(g.ty(*o), GType::Unit) {
            return Err(format!("graph `{}`: output {o} has no value", g.name));
        }
    }
    Ok(())
}

/// The types of a region's results (its outputs).
fn region_outputs(r: &Region) -> Vec<GType> {
    r.graph
        .outputs
        .iter()
        .map(|o| r.graph.ty(*o).clone())
        .collect()
}

/// A host condition: a bool scalar or a one-element bool tensor.
fn is_condition(t: &GType) -> bool {
    t.dtype() == Some(DType::Bool) && t.dims().iter().all(|d| d.as_const() == Some(1))
}

/// The rules of control-flow nodes: regions well-formed, params matching the
/// leading values and captures, results agreeing, projections in range.
fn verify_control(g: &Graph, n: &Node) -> Result<(), String> {
    let check_region = |r: &Region, leading: &[GType], what: &str| -> Result<(), String> {
        verify(&r.graph)?;
        let want: Vec<GType> = leading
            .iter()
            .cloned()
            .chain(r.captures.iter().map(|c| g.ty(*c).clone()))
            .collect();
        let have: Vec<GType> = r.graph.params.iter().map(|p| p.ty.clone()).collect();
        if want != have {
            return Err(format!("the {what} region's params do not match"));
        }
        Ok(())
    };
    let int_scalar = |x: NodeId| matches!(g.ty(x), GType::Scalar(d) if d.is_int());
    let tys = |ids: &[NodeId]| ids.iter().map(|x| g.ty(*x).clone()).collect::<Vec<_>>();
    if !regions(&n.kind).is_empty() && n.ty != GType::Unit {
        return Err("a control-flow node has a value".into());
    }
    match &n.kind {
        NodeKind::If {
            cond,
            then,
            otherwise,
        } => {
            if !is_condition(g.ty(*cond)) {
                return Err("an `if` condition that is not bool".into());
            }
            check_region(then, &[], "then")?;
            check_region(otherwise, &[], "else")?;
            if region_outputs(then) != region_outputs(otherwise) {
                return Err("the branches of an `if` give different types".into());
            }
        }
        NodeKind::For {
            lo,
            hi,
            step,
            init,
            body,
        } => {
            if ![*lo, *hi, *step].into_iter().all(int_scalar) {
                return Err("`for` bounds that are not integer scalars".into());
            }
            let mut leading = vec![GType::Scalar(DType::I32)];
            leading.extend(tys(init));
            check_region(body, &leading, "body")?;
            if region_outputs(body) != tys(init) {
                return Err("a loop body changes the types it carries".into());
            }
        }
        NodeKind::While { init, cond, body } => {
            check_region(cond, &tys(init), "cond")?;
            check_region(body, &tys(init), "body")?;
            if !matches!(&region_outputs(cond)[..], [t] if is_condition(t)) {
                return Err("a `while` condition that is not one bool".into());
            }
            if region_outputs(body) != tys(init) {
                return Err("a loop body changes the types it carries".into());
            }
        }
        NodeKind::Project { of, index } => {
            let results = match &g.node(*of).kind {
                NodeKind::If { then, .. } => region_outputs(then),
                NodeKind::For { init, .. } | NodeKind::While { init, .. } => tys(init),
                _ => return Err("a projection of a node without results".into()),
            };
            if results.get(*index) != Some(&n.ty) {
                return Err(format!(
                    "projection {index} does not match its node's result"
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

fn bcast_note(g: &Graph, n: &Node, ops: &[(NodeId, &str)]) -> String {
    let out = n.ty.dims();
    let b: Vec<&str> = ops
        .iter()
        .filter(|(o, _)| g.ty(*o).dims() != out)
        .map(|(_, name)| *name)
        .collect();
    if b.is_empty() || out.is_empty() {
        String::new()
    } else {
        format!(" bcast({})", b.join(", "))
    }
}

fn args_list(args: &[(String, NodeId)]) -> String {
    args.iter()
        .map(|(n, a)| format!("{n}={a}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The textual dump:
///
/// ```text
/// graph scaled_sum(a: Tensor[M, N, f32], b: Tensor[M, N, f32]) -> Tensor[M, N, f32]
///   %0 = param a : Tensor[M, N, f32]
///   %2 = const 0.5 : f32
///   %3 = mul %0, %2 bcast(rhs) : Tensor[M, N, f32]
///   return %4
/// ```
pub fn dump(g: &Graph) -> String {
    let mut s = String::new();
    dump_into(g, "", &mut s);
    s
}

fn list(ids: &[NodeId]) -> String {
    ids.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One graph at an indentation: regions print as nested graphs (named
/// `then`, `else`, `cond`, `body`) below their node, their params the leading
/// values and then the captures in order.
fn dump_into(g: &Graph, indent: &str, s: &mut String) {
    let params: Vec<String> = g
        .params
        .iter()
        .map(|p| format!("{}: {}", p.name, p.ty))
        .collect();
    let rets: Vec<String> = g.outputs.iter().map(|o| g.ty(*o).to_string()).collect();
    let _ = writeln!(
        s,
        "{indent}graph {}({}) -> {}",
        g.name,
        params.join(", "),
        match rets.len() {
            1 => rets[0].clone(),
            _ => format!("({})", rets.join(", ")),
        }
    );
    for (i, n) in g.nodes.iter().enumerate() {
        let body = match &n.kind {
            NodeKind::Param(p) => format!("param {}", g.params[*p].name),
            NodeKind::Const(c) => format!("const {}", render_constant(c)),
            NodeKind::Index(d) => format!("index {d}"),
            NodeKind::Unary { op, x } => format!("{} {x}", op.name()),
            NodeKind::Activation { act, x } => format!("{} {x}", format!("{act:?}").to_lowercase()),
            NodeKind::Binary { op, a, b } => format!(
                "{} {a}, {b}{}",
                binary_name(*op),
                bcast_note(g, n, &[(*a, "lhs"), (*b, "rhs")])
            ),
            NodeKind::Select { cond, a, b } => format!(
                "select {cond}, {a}, {b}{}",
                bcast_note(g, n, &[(*cond, "cond"), (*a, "lhs"), (*b, "rhs")])
            ),
            NodeKind::Cast { x, to } => format!("cast {x} to {to}"),
            NodeKind::MatMul { a, b, tf32 } => {
                format!("matmul {a}, {b}{}", if *tf32 { " tf32" } else { "" })
            }
            NodeKind::Softmax { x, axis } => format!("softmax {x}, axis={axis}"),
            NodeKind::LayerNorm {
                x,
                weight,
                bias,
                eps,
            } => format!(
                "layer_norm {x}, weight={}, bias={}, eps={}",
                opt(weight),
                opt(bias),
                opt(eps)
            ),
            NodeKind::RmsNorm { x, weight, eps } => {
                format!("rms_norm {x}, weight={}, eps={}", opt(weight), opt(eps))
            }
            NodeKind::Reduce {
                op,
                x,
                axis,
                keepdims,
            } => format!(
                "{} {x}, axis={}, keepdims={keepdims}",
                format!("{op:?}").to_lowercase(),
                axis.map(|a| a.to_string()).unwrap_or_else(|| "all".into())
            ),
            NodeKind::Transpose { x, a, b } => format!("transpose {x}, {a}, {b}"),
            NodeKind::Slice { x, axes } => {
                let mut k = 0;
                let parts: Vec<String> = axes
                    .iter()
                    .map(|a| match a {
                        SliceAxis::Full => {
                            k += 1;
                            ":".to_string()
                        }
                        SliceAxis::Index(i) => i.to_string(),
                        SliceAxis::Range { start } => {
                            let len = &n.ty.dims()[k];
                            k += 1;
                            format!("{start}:+{len}")
                        }
                    })
                    .collect();
                format!("slice {x}[{}]", parts.join(", "))
            }
            NodeKind::Reshape { x } => format!("reshape {x} to {}", render_dims(n.ty.dims())),
            NodeKind::Fill(fill) => match fill {
                Fill::Zeros => "zeros".to_string(),
                Fill::Ones => "ones".to_string(),
                Fill::Empty => "empty".to_string(),
                Fill::Full(v) => format!("full {v}"),
                Fill::Randn { seed } => format!("randn seed={}", opt(seed)),
                Fill::Data(d) => format!(
                    "data [{}]",
                    d.iter().map(render_constant).collect::<Vec<_>>().join(", ")
                ),
            },
            NodeKind::KernelCall {
                kernel,
                grid,
                args,
                consts,
            } => {
                let grid = match grid {
                    Some(g) => format!(
                        "[{}]",
                        g.iter()
                            .map(|x| x.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None => "[@kernel grid]".to_string(),
                };
                let consts: String = consts.iter().map(|(n, v)| format!(", {n}={v}")).collect();
                format!("launch {kernel}{grid}({}{consts})", args_list(args))
            }
            NodeKind::Call {
                func, args, consts, ..
            } => {
                let consts: String = consts.iter().map(|(n, v)| format!(", {n}={v}")).collect();
                format!("call {func}({}{consts})", args_list(args))
            }
            NodeKind::If {
                cond,
                then,
                otherwise,
            } => format!(
                "if {cond} then({}) else({})",
                list(&then.captures),
                list(&otherwise.captures)
            ),
            NodeKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => format!(
                "for range({lo}, {hi}, {step}) carry({}) body({})",
                list(init),
                list(&body.captures)
            ),
            NodeKind::While { init, cond, body } => format!(
                "while carry({}) cond({}) body({})",
                list(init),
                list(&cond.captures),
                list(&body.captures)
            ),
            NodeKind::Project { of, index } => format!("project {of}.{index}"),
        };
        if n.ty == GType::Unit {
            let _ = writeln!(s, "{indent}  %{i} = {body}");
        } else {
            let _ = writeln!(s, "{indent}  %{i} = {body} : {}", n.ty);
        }
        let inner = format!("{indent}    ");
        for r in regions(&n.kind) {
            dump_into(&r.graph, &inner, s);
        }
    }
    let _ = writeln!(s, "{indent}  return {}", list(&g.outputs));
}

fn opt(x: &Option<NodeId>) -> String {
    x.map(|x| x.to_string()).unwrap_or_else(|| "none".into())
}
