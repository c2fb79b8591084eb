//! Calls: argument binding, calls to other whole-tensor functions (`call`
//! nodes; std.nn's definitions of builtins are the builtin), kernel launches and
//! the builtins.

use super::{flatten_literal, Builder, R};
use crate::check::builtins::{Builtin, Builtin as B};
use crate::check::scope::FnSig;
use crate::check::types::Callee;
use crate::check::{DType, Ty, Value};
use crate::ir::graph::{
    Activation, Collective, Fill, GType, LowerError, NodeId, NodeKind, ReduceKind,
};
use crate::ir::tile::{unary_op, BinaryOp, Constant};
use crate::syntax::ast::{self, Expr, ExprKind};
use crate::syntax::span::Span;

impl<'a> Builder<'a> {
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
}

impl<'a> Builder<'a> {
    fn opt(&mut self, e: Option<&Expr>) -> R<Option<NodeId>> {
        match e {
            Some(e) if matches!(e.kind, ExprKind::None) => Ok(None),
            Some(e) => self.expr(e).map(Some),
            None => Ok(None),
        }
    }
}

impl<'a> Builder<'a> {
    pub(super) fn call(
        &mut self,
        e: &Expr,
        func: &Expr,
        args: &[ast::Arg],
        ty: GType,
    ) -> R<NodeId> {
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
            B::Shard => {
                if arg(2).is_some() {
                    return Err(LowerError::new(
                        e.span,
                        "`shard(..., devices=...)` inside a function (the function runs on the devices of its call)",
                    ));
                }
                let x = self.expr(need(0)?)?;
                let axis = self.axis_or(arg(1), self.ty_of(x).dims().len(), 0)?;
                NodeKind::Collective {
                    op: Collective::Shard { axis },
                    x,
                }
            }
            B::Gather | B::AllGather => NodeKind::Collective {
                op: Collective::AllGather { axis: None },
                x: self.expr(need(0)?)?,
            },
            B::ReduceScatter => {
                let x = self.expr(need(0)?)?;
                let axis = self.axis_or(arg(1), self.ty_of(x).dims().len(), 0)?;
                NodeKind::Collective {
                    op: Collective::ReduceScatter {
                        op: reduce_kind(arg(2), e.span)?,
                        axis,
                    },
                    x,
                }
            }
            B::AllReduce => {
                let op = reduce_kind(arg(1), e.span)?;
                NodeKind::Collective {
                    op: Collective::AllReduce(op),
                    x: self.expr(need(0)?)?,
                }
            }
            B::Broadcast => {
                let src = match arg(1) {
                    Some(a) => usize::try_from(self.const_int(a)?)
                        .map_err(|_| LowerError::new(a.span, "a negative source part"))?,
                    None => 0,
                };
                NodeKind::Collective {
                    op: Collective::Broadcast { src },
                    x: self.expr(need(0)?)?,
                }
            }
            B::Softmax => {
                let x = self.expr(need(0)?)?;
                let rank = self.ty_of(x).dims().len();
                let axis = self.axis_or(arg(1), rank, rank - 1)?;
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
}

/// The reduction of a collective's `op=` (a string literal; `"sum"` without).
fn reduce_kind(arg: Option<&Expr>, span: Span) -> R<ReduceKind> {
    Ok(match arg.map(|a| &a.kind) {
        None => ReduceKind::Sum,
        Some(ExprKind::Str(s)) => match s.as_str() {
            "sum" => ReduceKind::Sum,
            "max" => ReduceKind::Max,
            "min" => ReduceKind::Min,
            "mean" => ReduceKind::Mean,
            other => return Err(LowerError::new(span, format!("the reduction `{other}`"))),
        },
        Some(_) => {
            return Err(LowerError::new(
                span,
                "a reduction that is not a string literal",
            ))
        }
    })
}
