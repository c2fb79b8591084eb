//! Expressions: names, unary and binary operators, conditional expressions on
//! compile-time conditions, `.T`, and subscripts (views, slices, indices).

use super::{gtype, Builder, R};
use crate::check::dims::Dim;
use crate::check::{DType, Ty, Value};
use crate::ir::graph::{GType, LowerError, NodeId, NodeKind, SliceAxis};
use crate::ir::tile::{BinaryOp, UnaryOp};
use crate::syntax::ast::{self, Expr, ExprKind};

impl<'a> Builder<'a> {
    pub(super) fn expr(&mut self, e: &Expr) -> R<NodeId> {
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
}
