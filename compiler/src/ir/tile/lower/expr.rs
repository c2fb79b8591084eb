//! Expressions: literals, names, attributes, conditional expressions, tuples
//! and lists, unary and binary operators. Before an elementwise op, scalars
//! splat, ranks expand, dims broadcast and dtypes convert.

use super::values::{const_items, tile_type};
use super::{Lowerer, LV, R};
use crate::check::builtins::Builtin;
use crate::check::consts::{fold_binary, fold_unary};
use crate::check::dims::Dim as SymDim;
use crate::check::scope::Entry;
use crate::check::{DType, Ty, Value as CValue};
use crate::ir::tile::{BinaryOp, Dim, OpKind, ParamKind, Precision, UnaryOp};
use crate::syntax::ast::{self, BinOp, Expr, ExprKind};
use crate::syntax::span::Span;

impl<'a> Lowerer<'a> {
    pub(super) fn expr(&mut self, e: &Expr) -> R<LV> {
        crate::cancel::checkpoint();
        let saved_span = self.b.span;
        self.b.span = e.span;
        let r = self.expr_inner(e);
        self.b.span = saved_span;
        r
    }

    fn expr_inner(&mut self, e: &Expr) -> R<LV> {
        match &e.kind {
            ExprKind::Int(i) => Ok(LV::Const {
                c: CValue::int(*i),
                dtype: DType::I32,
                weak: true,
            }),
            ExprKind::Float(x) => Ok(LV::Const {
                c: CValue::Float(*x),
                dtype: DType::F32,
                weak: true,
            }),
            ExprKind::Bool(b) => Ok(LV::Const {
                c: CValue::Bool(*b),
                dtype: DType::Bool,
                weak: true,
            }),
            ExprKind::Str(s) => Ok(LV::Str(s.clone())),
            ExprKind::None => Ok(LV::NoneV),
            ExprKind::Name(id) => self.name(id),
            ExprKind::Unary { op, operand } => {
                let v = self.expr(operand)?;
                self.unary(*op, v, operand.span)
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let l = self.expr(lhs)?;
                let r = self.expr(rhs)?;
                self.binary(*op, l, r, e.span, lhs, rhs)
            }
            ExprKind::IfElse {
                cond,
                then,
                otherwise,
            } => match self.condition(cond)? {
                Ok(true) => self.expr(then),
                Ok(false) => self.expr(otherwise),
                Err(c) => {
                    let before = self.env.open();
                    self.b.begin();
                    let t = self.expr(then)?;
                    let then_r = self.b.end(vec![]);
                    self.b.begin();
                    let o = self.expr(otherwise)?;
                    let else_r = self.b.end(vec![]);
                    let tmp = "%ifexp".to_string();
                    self.emit_if(c, then_r, else_r, vec![(tmp.clone(), t, o)], e.span)?;
                    let r = self.env.remove(&tmp);
                    self.env.rollback(&before);
                    self.env.close(before);
                    r.ok_or(())
                }
            },
            ExprKind::Call { func, args } => self.call(e, func, args),
            ExprKind::Subscript { value, indices } => {
                let v = self.expr(value)?;
                self.subscript(v, indices, e.span)
            }
            ExprKind::Attribute { value, attr } => {
                let v = self.expr(value)?;
                match (attr.name.as_str(), &v) {
                    ("T", LV::Val { v: x, .. }) => {
                        let x = *x;
                        let t = self.b.ty(x).clone();
                        let s = t.shape();
                        if s.len() != 2 {
                            self.internal(e.span, "`.T` of a value that is not 2-D");
                            return Err(());
                        }
                        let r = self.b.push1(
                            OpKind::Transpose { x },
                            tile_type(vec![s[1], s[0]], t.dtype()),
                        );
                        Ok(self.val(r, false))
                    }
                    ("to", LV::Val { .. } | LV::Const { .. }) => Ok(LV::ToMethod(Box::new(v))),
                    ("shape", LV::Val { .. } | LV::Const { .. } | LV::Ref { .. }) => {
                        let shape = match &v {
                            LV::Ref { shape, .. } => shape.clone(),
                            _ => self.shape_of(&v, e.span)?,
                        };
                        Ok(LV::List(
                            shape
                                .into_iter()
                                .map(|n| LV::Const {
                                    c: CValue::int(n as i64),
                                    dtype: DType::I32,
                                    weak: false,
                                })
                                .collect(),
                        ))
                    }
                    ("shape", LV::Tensor(t)) => {
                        let t = *t;
                        let ParamKind::Tensor { dims, .. } = self.params[t].kind.clone() else {
                            return Err(());
                        };
                        let mut items = Vec::new();
                        for (axis, d) in dims.iter().enumerate() {
                            items.push(match d {
                                Dim::Static(n) => LV::Const {
                                    c: CValue::int(*n as i64),
                                    dtype: DType::I32,
                                    weak: false,
                                },
                                Dim::Dynamic(name) => {
                                    let sym = match SymDim::parse(name) {
                                        Ok(d) => d,
                                        Err(_) => self.fresh_sym(),
                                    };
                                    LV::Val {
                                        v: self.tensor_dim(t, axis),
                                        weak: false,
                                        sym: Some(sym),
                                    }
                                }
                            });
                        }
                        Ok(LV::List(items))
                    }
                    ("dtype", LV::Tensor(t)) => Ok(LV::DType(self.tensor_dtype(*t))),
                    ("dtype", LV::Ref { tensor, .. }) => Ok(LV::DType(self.tensor_dtype(*tensor))),
                    ("dtype", _) => {
                        let (d, _, _) = self.info(&v, e.span)?;
                        Ok(LV::DType(d))
                    }
                    _ => {
                        self.unsupported(attr.span, format!("the attribute `.{}` here", attr.name));
                        Err(())
                    }
                }
            }
            ExprKind::Tuple(items) | ExprKind::List(items) => {
                let mut vs = Vec::new();
                for i in items {
                    vs.push(self.expr(i)?);
                }
                Ok(LV::List(vs))
            }
            ExprKind::Dict(_) => Ok(LV::Host),
            ExprKind::Error => {
                self.internal(e.span, "an expression with a syntax error");
                Err(())
            }
        }
    }

    fn name(&mut self, id: &ast::Ident) -> R<LV> {
        if let Some(v) = self.env.get(&id.name) {
            return Ok(v.clone());
        }
        match self.scope.get(&id.name) {
            Some(Entry::Const { ty, value: Some(v) }) => {
                let (dtype, weak) = match ty {
                    Ty::Scalar { dtype, weak } => (*dtype, *weak),
                    _ => match v {
                        CValue::Int(_) => (DType::I32, true),
                        CValue::Float(_) => (DType::F32, true),
                        CValue::Bool(_) => (DType::Bool, true),
                        CValue::DType(d) => return Ok(LV::DType(*d)),
                        CValue::Str(s) => return Ok(LV::Str(s.clone())),
                        CValue::None => return Ok(LV::NoneV),
                        // A list or tuple: its items (indexed with constants).
                        CValue::Tuple(items) => return Ok(LV::List(const_items(items))),
                    },
                };
                return Ok(LV::Const {
                    c: v.clone(),
                    dtype,
                    weak,
                });
            }
            Some(_) => return Ok(LV::Host),
            None => {}
        }
        if let Some(b) = Builtin::from_name(&id.name) {
            return Ok(LV::Builtin(b));
        }
        if let Some(d) = DType::from_name(&id.name) {
            return Ok(LV::DType(d));
        }
        match id.name.as_str() {
            "inf" => Ok(LV::Const {
                c: CValue::Float(f64::INFINITY),
                dtype: DType::F32,
                weak: true,
            }),
            "True" | "False" => Ok(LV::Const {
                c: CValue::Bool(id.name == "True"),
                dtype: DType::Bool,
                weak: true,
            }),
            _ => {
                self.internal(id.span, format!("unknown name `{}`", id.name));
                Err(())
            }
        }
    }

    fn unary(&mut self, op: ast::UnaryOp, v: LV, span: Span) -> R<LV> {
        if let LV::Const { c, dtype, weak } = &v {
            if let Some(r) = fold_unary(op, c) {
                let dtype = if op == ast::UnaryOp::Not {
                    DType::Bool
                } else {
                    *dtype
                };
                return Ok(LV::Const {
                    c: r,
                    dtype,
                    weak: *weak,
                });
            }
        }
        let (d, weak, _) = self.info(&v, span)?;
        if op == ast::UnaryOp::Not && d != DType::Bool {
            // `not n`: n == 0.
            let zero = LV::Const {
                c: CValue::int(0),
                dtype: d,
                weak: true,
            };
            let e = Expr::new(ExprKind::None, span);
            return self.binary(BinOp::Eq, v, zero, span, &e, &e);
        }
        let x = self.materialize(&v, d, span)?;
        let t = self.b.ty(x).clone();
        let uop = match op {
            ast::UnaryOp::Pos => return Ok(v),
            ast::UnaryOp::Neg => UnaryOp::Neg,
            ast::UnaryOp::Not => UnaryOp::Not,
            ast::UnaryOp::Invert if d == DType::Bool => UnaryOp::Not,
            ast::UnaryOp::Invert => UnaryOp::Invert,
        };
        let r = self.b.push1(OpKind::Unary { op: uop, x }, t);
        let mut out = self.val(r, weak);
        if let (LV::Val { sym: Some(s), .. }, LV::Val { sym: os, .. }) = (&v, &mut out) {
            if op == ast::UnaryOp::Neg {
                *os = s.checked_neg().or(os.take());
            }
        }
        Ok(out)
    }

    pub(super) fn binary(
        &mut self,
        op: BinOp,
        l: LV,
        r: LV,
        span: Span,
        le: &Expr,
        re: &Expr,
    ) -> R<LV> {
        if op == BinOp::MatMul {
            return self.dot(&l, &r, None, Precision::Ieee, span, le, re);
        }
        let Some(bop) = BinaryOp::from_ast(op) else {
            self.internal(span, "an unknown operator");
            return Err(());
        };
        // Compile-time folding (the checker's rules).
        if let (LV::Const { c: a, .. }, LV::Const { c: b, .. }) = (&l, &r) {
            let (dt, weak) = self.promote(&l, &r, le, re, &format!("`{}`", op.symbol()))?;
            if let Ok(Some(c)) = fold_binary(op, a, b) {
                let dtype = match &c {
                    CValue::Bool(_) => DType::Bool,
                    CValue::Float(_) if !dt.is_float() => DType::F32,
                    _ => dt,
                };
                return Ok(LV::Const { c, dtype, weak });
            }
        }
        let (dt, weak) = if matches!(op, BinOp::And | BinOp::Or) {
            (DType::Bool, false)
        } else {
            self.promote(&l, &r, le, re, &format!("`{}`", op.symbol()))?
        };
        let ls = self.shape_of(&l, le.span)?;
        let rs = self.shape_of(&r, re.span)?;
        let shape = self.broadcast_shapes(&ls, &rs, span)?;
        let opdt = if op == BinOp::Div && !dt.is_float() {
            DType::F32
        } else {
            dt
        };
        let a = self.coerce(&l, opdt, &shape, le.span)?;
        let b = self.coerce(&r, opdt, &shape, re.span)?;
        let rdt = if bop.is_comparison() {
            DType::Bool
        } else {
            opdt
        };
        let v = self
            .b
            .push1(OpKind::Binary { op: bop, a, b }, tile_type(shape, rdt));
        let mut out = self.val(v, weak);
        // Symbolic tracking of run-time integers (slice bounds).
        if let (Some(sa), Some(sb)) = (self.sym_of(&l), self.sym_of(&r)) {
            if let Ok(Some(CValue::Int(d))) = fold_binary(op, &CValue::Int(sa), &CValue::Int(sb)) {
                if let LV::Val { sym, .. } = &mut out {
                    if sym.is_some() {
                        *sym = Some(d);
                    }
                }
            }
        }
        Ok(out)
    }

    /// An elementwise op of two operands with broadcasting and promotion.
    pub(super) fn elementwise2(
        &mut self,
        op: BinaryOp,
        a: (&LV, &Expr),
        b: (&LV, &Expr),
        span: Span,
    ) -> R<LV> {
        let (dt, weak) = self.promote(a.0, b.0, a.1, b.1, &format!("`{}`", op.name()))?;
        let sa = self.shape_of(a.0, a.1.span)?;
        let sb = self.shape_of(b.0, b.1.span)?;
        let shape = self.broadcast_shapes(&sa, &sb, span)?;
        let x = self.coerce(a.0, dt, &shape, a.1.span)?;
        let y = self.coerce(b.0, dt, &shape, b.1.span)?;
        let v = self
            .b
            .push1(OpKind::Binary { op, a: x, b: y }, tile_type(shape, dt));
        Ok(self.val(v, weak))
    }
}
