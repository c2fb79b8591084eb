//! Building the Graph IR of a checked whole-tensor function from its AST.
//!
//! `Builder` walks the function's body with the values the checker recorded for
//! each expression; its `impl` is spread over files by concern (the struct, the
//! value look-ups, the entry point `build` and the helpers of more than one file
//! stay here):
//!
//! | file | holds |
//! |------|-------|
//! | `expr.rs` | names, operators, conditional expressions, `.T`, subscripts |
//! | `calls.rs` | argument binding, calls to functions and kernels, the builtins |
//! | `stmt.rs` | statements, compile-time and run-time `if`/`for`/`while` and their regions |
//!
//! A method or item is `pub(super)` only where a sibling file uses it.

mod calls;
mod expr;
mod stmt;

use std::collections::HashMap;

use super::{map_operands, GParam, GType, Graph, LowerError, Node, NodeId, NodeKind};
use crate::check::ctx::Val;
use crate::check::dims::Dim;
use crate::check::scope::FnSig;
use crate::check::{DType, Ty, Value};
use crate::ir::tile::Constant;
use crate::syntax::ast::{self, Expr, ExprKind, Function, StmtKind};
use crate::syntax::span::Span;

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

    /// The axis `e` names, or `default` without one.
    fn axis_or(&self, e: Option<&Expr>, rank: usize, default: usize) -> R<usize> {
        match e {
            Some(e) => self.axis(e, rank),
            None => Ok(default),
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
