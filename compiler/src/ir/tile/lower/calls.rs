//! Calls: binding arguments to a builtin's parameters, `.to` casts, and the
//! builtins a kernel may call, one arm each (`dot`, reductions and access
//! bounds have their own files).

use super::values::tile_type;
use super::{Lowerer, LV, R};
use crate::check::builtins::{Builtin, Builtin as B};
use crate::check::consts::fold_call;
use crate::check::{DType, Value as CValue};
use crate::diag::Diagnostic;
use crate::ir::tile::{BinaryOp, Constant, OpKind, Precision, Type, Value};
use crate::syntax::ast::{Arg, BinOp, Expr};
use crate::syntax::span::Span;

/// Bound call arguments: one slot per builtin parameter.
struct Args<'e> {
    slots: Vec<Option<&'e Arg>>,
    positional: Vec<&'e Arg>,
}

impl<'a> Lowerer<'a> {
    fn bind<'e>(&mut self, id: Builtin, args: &'e [Arg], span: Span) -> R<Args<'e>> {
        let (name, params) = (id.name(), id.info().params);
        let mut slots: Vec<Option<&Arg>> = vec![None; params.len()];
        let mut positional = Vec::new();
        for a in args {
            match &a.name {
                None => {
                    if positional.len() < slots.len() {
                        slots[positional.len()] = Some(a);
                    }
                    positional.push(a);
                }
                Some(n) => {
                    let key = n.name.as_str();
                    match params.iter().position(|p| {
                        *p == key
                            || (key == "dim" && *p == "axis")
                            || (key == "axis" && *p == "dim")
                    }) {
                        Some(j) => slots[j] = Some(a),
                        None => {
                            self.internal(span, format!("`{name}` has no parameter `{key}`"));
                            return Err(());
                        }
                    }
                }
            }
        }
        Ok(Args { slots, positional })
    }

    pub(super) fn call(&mut self, e: &Expr, func: &Expr, args: &[Arg]) -> R<LV> {
        let f = self.expr(func)?;
        match f {
            LV::Builtin(id) => self.builtin(id, args, e.span),
            LV::ToMethod(recv) => {
                let [a] = args else {
                    self.internal(e.span, "`.to` takes one dtype");
                    return Err(());
                };
                let LV::DType(to) = self.expr(&a.value)? else {
                    self.internal(a.span, "`.to` takes a dtype");
                    return Err(());
                };
                match *recv {
                    LV::Const { c, .. } => {
                        let c = match (&c, to) {
                            (CValue::Float(x), d) if d.is_int() => CValue::int(*x as i64),
                            (CValue::Int(_), d) if d.is_float() => {
                                CValue::Float(c.as_int().unwrap_or(0) as f64)
                            }
                            (_, DType::Bool) => CValue::Bool(
                                c.as_int()
                                    .map(|i| i != 0)
                                    .unwrap_or(matches!(c, CValue::Float(x) if x != 0.0)),
                            ),
                            _ => c.clone(),
                        };
                        Ok(LV::Const {
                            c,
                            dtype: to,
                            weak: false,
                        })
                    }
                    recv => {
                        let v = self.materialize(&recv, to, e.span)?;
                        Ok(self.val(v, false))
                    }
                }
            }
            other => {
                self.unsupported(
                    func.span,
                    format!("calling a {} inside a kernel", other.describe()),
                );
                Err(())
            }
        }
    }

    fn arg_lv(&mut self, a: Option<&Arg>) -> R<Option<LV>> {
        match a {
            Some(a) => Ok(Some(self.expr(&a.value)?)),
            None => Ok(None),
        }
    }

    fn builtin(&mut self, id: Builtin, args: &[Arg], span: Span) -> R<LV> {
        let name = id.name();
        let bound = self.bind(id, args, span)?;
        let slot = |i: usize| bound.slots.get(i).copied().flatten();
        let req = |this: &mut Self, i: usize| -> R<&Arg> {
            match slot(i) {
                Some(a) => Ok(a),
                None => {
                    this.internal(span, format!("`{name}` is missing an argument"));
                    Err(())
                }
            }
        };
        match id {
            B::ProgramId | B::NumPrograms => {
                let a = req(self, 0)?;
                let lv = self.expr(&a.value)?;
                let axis = self.const_int(&lv, a.value.span, "the axis")?;
                if !(0..3).contains(&axis) {
                    self.internal(a.value.span, "a program axis out of range");
                    return Err(());
                }
                let kind = if id == B::ProgramId {
                    OpKind::ProgramId(axis as u8)
                } else {
                    OpKind::NumPrograms(axis as u8)
                };
                let v = self.b.push1(kind, Type::Scalar(DType::I32));
                Ok(self.val(v, false))
            }
            B::Cdiv => {
                let a = req(self, 0)?;
                let b = req(self, 1)?;
                let x = self.expr(&a.value)?;
                let y = self.expr(&b.value)?;
                if let (LV::Const { c: cx, .. }, LV::Const { c: cy, .. }) = (&x, &y) {
                    if let Ok(Some(c)) = fold_call(B::Cdiv, &[cx.clone(), cy.clone()]) {
                        let (dt, weak) = self.promote(&x, &y, &a.value, &b.value, "`cdiv`")?;
                        return Ok(LV::Const { c, dtype: dt, weak });
                    }
                }
                // (a + b - 1) // b
                let one = LV::Const {
                    c: CValue::int(1),
                    dtype: DType::I32,
                    weak: true,
                };
                let s = self.binary(BinOp::Add, x, y.clone(), span, &a.value, &b.value)?;
                let s = self.binary(BinOp::Sub, s, one, span, &a.value, &b.value)?;
                self.binary(BinOp::FloorDiv, s, y, span, &a.value, &b.value)
            }
            B::Min | B::Max | B::Sum | B::Mean => {
                // As the checker reads them: two or more positional arguments
                // are an elementwise min/max (`max(a, b, 0.0)`), else a reduction.
                let is_reduce = matches!(id, B::Sum | B::Mean) || bound.positional.len() < 2;
                if !is_reduce {
                    let op = if id == B::Min {
                        BinaryOp::Min
                    } else {
                        BinaryOp::Max
                    };
                    let mut acc: Option<(LV, &Expr)> = None;
                    for a in &bound.positional {
                        let v = self.expr(&a.value)?;
                        acc = Some(match acc {
                            None => (v, &a.value),
                            Some((prev, pe)) => {
                                let folded = match (&prev, &v) {
                                    (LV::Const { c: p, .. }, LV::Const { c: q, .. }) => Some(id)
                                        .and_then(|b| {
                                            fold_call(b, &[p.clone(), q.clone()]).ok().flatten()
                                        }),
                                    _ => None,
                                };
                                let (dt, weak) =
                                    self.promote(&prev, &v, pe, &a.value, &format!("`{name}`"))?;
                                match folded {
                                    Some(c) => (LV::Const { c, dtype: dt, weak }, &a.value),
                                    None => (
                                        self.elementwise2(op, (&prev, pe), (&v, &a.value), span)?,
                                        &a.value,
                                    ),
                                }
                            }
                        });
                    }
                    return acc.map(|(v, _)| v).ok_or(());
                }
                let x_arg = req(self, 0)?;
                let x = self.expr(&x_arg.value)?;
                let axis = match self.arg_lv(slot(1))? {
                    None | Some(LV::NoneV) => None,
                    Some(lv) => Some(self.const_int(&lv, span, "the reduction axis")?),
                };
                let keep = match self.arg_lv(slot(2))? {
                    None => false,
                    Some(LV::Const { c, .. }) => c.as_int().is_some_and(|i| i != 0),
                    Some(_) => {
                        self.internal(span, "`keepdims` must be a constant");
                        return Err(());
                    }
                };
                self.reduce(id, &x, axis, keep, x_arg.value.span)
            }
            B::Exp
            | B::Exp2
            | B::Log
            | B::Log2
            | B::Sqrt
            | B::Rsqrt
            | B::Abs
            | B::Sigmoid
            | B::Tanh
            | B::Erf => {
                let a = req(self, 0)?;
                let x = self.expr(&a.value)?;
                if id == B::Abs {
                    if let LV::Const { c, dtype, weak } = &x {
                        if let Ok(Some(r)) = fold_call(B::Abs, std::slice::from_ref(c)) {
                            return Ok(LV::Const {
                                c: r,
                                dtype: *dtype,
                                weak: *weak,
                            });
                        }
                    }
                }
                let (d, weak, _) = self.info(&x, a.value.span)?;
                let rd = if id == B::Abs || d.is_float() {
                    d
                } else {
                    DType::F32
                };
                let v = self.materialize(&x, rd, a.value.span)?;
                let t = self.b.ty(v).clone();
                let op = crate::ir::tile::unary_op(id).ok_or(())?;
                let r = self.b.push1(OpKind::Unary { op, x: v }, t);
                Ok(self.val(r, weak))
            }
            B::Maximum | B::Minimum => {
                let a = req(self, 0)?;
                let b = req(self, 1)?;
                let x = self.expr(&a.value)?;
                let y = self.expr(&b.value)?;
                let op = if id == B::Maximum {
                    BinaryOp::Max
                } else {
                    BinaryOp::Min
                };
                self.elementwise2(op, (&x, &a.value), (&y, &b.value), span)
            }
            B::Where => {
                let c = req(self, 0)?;
                let a = req(self, 1)?;
                let b = req(self, 2)?;
                let cv = self.expr(&c.value)?;
                let av = self.expr(&a.value)?;
                let bv = self.expr(&b.value)?;
                let (dt, weak) = self.promote(&av, &bv, &a.value, &b.value, "`where`")?;
                let sc = self.shape_of(&cv, c.value.span)?;
                let sa = self.shape_of(&av, a.value.span)?;
                let sb = self.shape_of(&bv, b.value.span)?;
                let s = self.broadcast_shapes(&sa, &sb, span)?;
                let s = self.broadcast_shapes(&sc, &s, span)?;
                let cond = self.coerce(&cv, DType::Bool, &s, c.value.span)?;
                let x = self.coerce(&av, dt, &s, a.value.span)?;
                let y = self.coerce(&bv, dt, &s, b.value.span)?;
                let r = self
                    .b
                    .push1(OpKind::Select { cond, a: x, b: y }, tile_type(s, dt));
                Ok(self.val(r, weak))
            }
            B::Arange => {
                let a = req(self, 0)?;
                let b = req(self, 1)?;
                let x = self.expr(&a.value)?;
                let y = self.expr(&b.value)?;
                let len = match (self.sym_of(&x), self.sym_of(&y)) {
                    (Some(p), Some(q)) => q.checked_sub(&p),
                    _ => None,
                };
                let len = match len {
                    Some(d) => match d.as_const() {
                        Some(n) if n > u32::MAX as i64 => {
                            self.internal(span, format!("an `arange` of length {n}"));
                            return Err(());
                        }
                        Some(n) if n > 0 => n as u32,
                        _ => {
                            let lv = LV::Val {
                                v: Value(0),
                                weak: false,
                                sym: Some(d),
                            };
                            self.needs_const(span, &lv, "the length of this `arange`");
                            return Err(());
                        }
                    },
                    None => {
                        self.internal(span, "the length of this `arange` is not known");
                        return Err(());
                    }
                };
                let start = self.materialize(&x, DType::I32, a.value.span)?;
                let r = self.b.push1(
                    OpKind::Arange { start, len },
                    tile_type(vec![len], DType::I32),
                );
                Ok(self.val(r, false))
            }
            B::Zeros | B::Full => {
                let shape_arg = req(self, 0)?;
                let shape_lv = self.expr(&shape_arg.value)?;
                let items = match shape_lv {
                    LV::List(v) => v,
                    single @ (LV::Const { .. } | LV::Val { .. }) => vec![single],
                    _ => {
                        self.internal(shape_arg.span, "a shape must be a list");
                        return Err(());
                    }
                };
                let mut shape = Vec::new();
                for it in &items {
                    let n = self.const_int(it, shape_arg.value.span, "a tile dim")?;
                    if n <= 0 {
                        self.diags.push(
                            Diagnostic::new(
                                "E0406",
                                shape_arg.value.span,
                                format!("a tile dim is {n} once the kernel is specialised; tile dims must be positive"),
                            )
                            .with_help("give the const parameters that size this tile positive values"),
                        );
                        return Err(());
                    }
                    let Ok(n) = u32::try_from(n) else {
                        self.internal(shape_arg.value.span, format!("a tile dim of {n}"));
                        return Err(());
                    };
                    shape.push(n);
                }
                let (value, dt_slot) = if id == B::Zeros {
                    (
                        LV::Const {
                            c: CValue::int(0),
                            dtype: DType::I32,
                            weak: true,
                        },
                        slot(1),
                    )
                } else {
                    let v = req(self, 1)?;
                    (self.expr(&v.value)?, slot(2))
                };
                let dt = match self.arg_lv(dt_slot)? {
                    Some(LV::DType(d)) => d,
                    None => DType::F32,
                    Some(_) => {
                        self.internal(span, "the dtype argument is not a dtype");
                        return Err(());
                    }
                };
                let v = self.coerce(&value, dt, &shape, span)?;
                Ok(self.val(v, false))
            }
            B::Load => {
                let p = req(self, 0)?;
                let (tensor, access, shape) = self.tensor_ref(&p.value, "load")?;
                let dtype = self.tensor_dtype(tensor);
                let mask = match self.arg_lv(slot(1))? {
                    None | Some(LV::NoneV) => None,
                    Some(m) => Some(self.coerce(&m, DType::Bool, &shape, span)?),
                };
                let other_lv = self.arg_lv(slot(2))?;
                let mut runtime_other = None;
                let other = match other_lv {
                    None | Some(LV::NoneV) => {
                        if dtype.is_float() {
                            Constant::Float(0.0)
                        } else if dtype == DType::Bool {
                            Constant::Bool(false)
                        } else {
                            Constant::Int(0)
                        }
                    }
                    Some(LV::Const { c, .. }) => match (&c, dtype) {
                        (CValue::Bool(b), DType::Bool) => Constant::Bool(*b),
                        (CValue::Float(x), d) if d.is_float() => Constant::Float(*x),
                        (CValue::Int(_), d) if d.is_float() => {
                            Constant::Float(c.as_int().unwrap_or(0) as f64)
                        }
                        (CValue::Int(_), d) if d.is_int() => Constant::Int(c.as_int().unwrap_or(0)),
                        (CValue::Int(_), DType::Bool) => Constant::Bool(c.as_int() != Some(0)),
                        _ => {
                            self.internal(span, format!("`other={c}` for a {dtype} tensor"));
                            return Err(());
                        }
                    },
                    Some(lv @ LV::Val { .. }) => {
                        // A run-time `other=`: load with 0, then select it where
                        // the element is out of bounds or masked off.
                        let sp = slot(2).map(|a| a.value.span).unwrap_or(span);
                        runtime_other = Some(self.coerce(&lv, dtype, &shape, sp)?);
                        if dtype.is_float() {
                            Constant::Float(0.0)
                        } else if dtype == DType::Bool {
                            Constant::Bool(false)
                        } else {
                            Constant::Int(0)
                        }
                    }
                    Some(other) => {
                        self.internal(span, format!("`other=` is a {}", other.describe()));
                        return Err(());
                    }
                };
                let select_access = runtime_other.map(|o| (o, access.clone()));
                let mut v = self.b.push1(
                    OpKind::Load {
                        tensor,
                        access,
                        mask,
                        other,
                    },
                    tile_type(shape.clone(), dtype),
                );
                if let Some((o, access)) = select_access {
                    let mut keep = self.in_bounds(tensor, &access, &shape, span)?;
                    if let Some(m) = mask {
                        keep = self.b.push1(
                            OpKind::Binary {
                                op: BinaryOp::And,
                                a: keep,
                                b: m,
                            },
                            tile_type(shape.clone(), DType::Bool),
                        );
                    }
                    v = self.b.push1(
                        OpKind::Select {
                            cond: keep,
                            a: v,
                            b: o,
                        },
                        tile_type(shape, dtype),
                    );
                }
                Ok(self.val(v, false))
            }
            B::Store | B::AtomicAdd => {
                let p = req(self, 0)?;
                let (tensor, access, shape) = self.tensor_ref(&p.value, name)?;
                let dtype = self.tensor_dtype(tensor);
                let va = req(self, 1)?;
                let value_lv = self.expr(&va.value)?;
                let value = self.coerce(&value_lv, dtype, &shape, va.value.span)?;
                let mask = match self.arg_lv(slot(2))? {
                    None | Some(LV::NoneV) => None,
                    Some(m) => Some(self.coerce(&m, DType::Bool, &shape, span)?),
                };
                let kind = if id == B::Store {
                    OpKind::Store {
                        tensor,
                        access,
                        value,
                        mask,
                    }
                } else {
                    OpKind::AtomicAdd {
                        tensor,
                        access,
                        value,
                        mask,
                    }
                };
                self.b.push(kind, vec![]);
                Ok(LV::NoneV)
            }
            B::Dot => {
                let a = req(self, 0)?;
                let b = req(self, 1)?;
                let x = self.expr(&a.value)?;
                let y = self.expr(&b.value)?;
                let acc = match self.arg_lv(slot(2))? {
                    None | Some(LV::NoneV) => None,
                    Some(lv) => Some((lv, slot(2).map(|s| s.value.span).unwrap_or(span))),
                };
                let precision = match self.arg_lv(slot(3))? {
                    None | Some(LV::NoneV) => Precision::Ieee,
                    Some(LV::Str(s)) if s == "tf32" => Precision::Tf32,
                    Some(LV::Str(s)) if s == "ieee" => Precision::Ieee,
                    Some(_) => {
                        self.unsupported(span, "this `precision=`");
                        return Err(());
                    }
                };
                self.dot(&x, &y, acc, precision, span, &a.value, &b.value)
            }
            // Whole-tensor and session builtins: the checker rejects them in
            // kernels (E0508, E0725), and `range` only lowers as a `for` loop
            // (E0512 elsewhere).
            B::Range
            | B::Matmul
            | B::Softmax
            | B::LayerNorm
            | B::RmsNorm
            | B::Relu
            | B::Gelu
            | B::Silu
            | B::Transpose
            | B::Reshape
            | B::Empty
            | B::Ones
            | B::Randn
            | B::Tensor
            | B::Print
            | B::Len
            | B::LoadNpy
            | B::SaveNpy
            | B::SetFloat32MatmulPrecision
            | B::AllReduce
            | B::Broadcast
            | B::Shard
            | B::Gather
            | B::AllGather
            | B::ReduceScatter => {
                self.unsupported(span, format!("`{name}` inside a kernel"));
                Err(())
            }
        }
    }
}
