//! Lowered values made concrete: their dtype, weakness and shape, promotion
//! and broadcasting as the checker types them, materialising compile-time
//! values, coercing to a dtype and shape, and reading compile-time integers
//! (E0511 where one depends on a dim the kernel is not specialised on).

use super::{Lowerer, LV, R};
use crate::check::ctx::Checker;
use crate::check::dims::Dim as SymDim;
use crate::check::expr::{broadcast, Kind};
use crate::check::{DType, Ty, Value as CValue};
use crate::diag::Diagnostic;
use crate::ir::tile::{Constant, Dim, OpKind, ParamKind, Type, Value};
use crate::syntax::ast::Expr;
use crate::syntax::span::Span;
use crate::target::Arch;

/// The items of a constant tuple or list, as lowering values.
pub(super) fn const_items(items: &[CValue]) -> Vec<LV> {
    items
        .iter()
        .map(|v| match v {
            CValue::Int(_) => LV::Const {
                c: v.clone(),
                dtype: DType::I32,
                weak: true,
            },
            CValue::Float(_) => LV::Const {
                c: v.clone(),
                dtype: DType::F32,
                weak: true,
            },
            CValue::Bool(_) => LV::Const {
                c: v.clone(),
                dtype: DType::Bool,
                weak: true,
            },
            CValue::Str(s) => LV::Str(s.clone()),
            CValue::DType(d) => LV::DType(*d),
            CValue::Tuple(t) => LV::List(const_items(t)),
            CValue::None => LV::NoneV,
        })
        .collect()
}

pub(super) fn tile_type(shape: Vec<u32>, dtype: DType) -> Type {
    if shape.is_empty() {
        Type::Scalar(dtype)
    } else {
        Type::Tile { shape, dtype }
    }
}

pub(super) fn const_bits(c: Constant) -> u64 {
    match c {
        Constant::Int(i) => i as u64,
        Constant::Float(x) => x.to_bits(),
        Constant::Bool(b) => b as u64,
    }
}

impl<'a> Lowerer<'a> {
    /// (dtype, weak, shape) of a scalar or tile.
    pub(super) fn info(&mut self, lv: &LV, span: Span) -> R<(DType, bool, Vec<u32>)> {
        match lv {
            LV::Val { v, weak, .. } => {
                let t = self.b.ty(*v);
                Ok((t.dtype(), *weak, t.shape().to_vec()))
            }
            LV::Const { dtype, weak, .. } => Ok((*dtype, *weak, Vec::new())),
            other => {
                self.internal(
                    span,
                    format!("expected a number or tile, found a {}", other.describe()),
                );
                Err(())
            }
        }
    }

    fn check_ty(&mut self, lv: &LV, span: Span) -> R<(Ty, Kind)> {
        let (d, weak, shape) = self.info(lv, span)?;
        if shape.is_empty() {
            Ok((Ty::Scalar { dtype: d, weak }, Kind::Scalar))
        } else {
            Ok((
                Ty::Tile {
                    dims: shape.iter().map(|&s| SymDim::constant(s as i64)).collect(),
                    dtype: d,
                },
                Kind::Tile,
            ))
        }
    }

    /// The checker's dtype promotion of two operands.
    pub(super) fn promote(
        &mut self,
        l: &LV,
        r: &LV,
        le: &Expr,
        re: &Expr,
        what: &str,
    ) -> R<(DType, bool)> {
        let (lt, lk) = self.check_ty(l, le.span)?;
        let (rt, rk) = self.check_ty(r, re.span)?;
        let mut ch = Checker::new(self.scope, Arch::default());
        ch.in_kernel = true;
        match ch.promote(&lt, &rt, lk, rk, what, le.span.to(re.span), le, re) {
            Some(x) => Ok(x),
            None => {
                self.diags.extend(ch.diags);
                Err(())
            }
        }
    }

    pub(super) fn shape_of(&mut self, lv: &LV, span: Span) -> R<Vec<u32>> {
        Ok(self.info(lv, span)?.2)
    }

    pub(super) fn broadcast_shapes(&mut self, a: &[u32], b: &[u32], span: Span) -> R<Vec<u32>> {
        let to =
            |s: &[u32]| -> Vec<SymDim> { s.iter().map(|&x| SymDim::constant(x as i64)).collect() };
        match broadcast(&to(a), &to(b)) {
            Some(d) => Ok(d.iter().map(|x| x.as_const().unwrap_or(0) as u32).collect()),
            None => {
                self.internal(span, format!("shapes {a:?} and {b:?} do not broadcast"));
                Err(())
            }
        }
    }

    /// `lv` as a value of `dtype` (cast if needed).
    pub(super) fn materialize(&mut self, lv: &LV, dtype: DType, span: Span) -> R<Value> {
        match lv {
            LV::Const { c, .. } => self.const_of(c, dtype, span),
            LV::Val { v, .. } => {
                let v = *v;
                let t = self.b.ty(v).clone();
                if t.dtype() == dtype {
                    Ok(v)
                } else {
                    Ok(self.b.push1(
                        OpKind::Cast { x: v, to: dtype },
                        tile_type(t.shape().to_vec(), dtype),
                    ))
                }
            }
            other => {
                self.internal(
                    span,
                    format!("expected a number or tile, found a {}", other.describe()),
                );
                Err(())
            }
        }
    }

    /// `lv` converted to `dtype` and broadcast to `shape` (numpy rules).
    pub(super) fn coerce(&mut self, lv: &LV, dtype: DType, shape: &[u32], span: Span) -> R<Value> {
        let mut v = self.materialize(lv, dtype, span)?;
        let mut s = self.b.ty(v).shape().to_vec();
        if s == shape {
            return Ok(v);
        }
        if s.is_empty() {
            return Ok(self.b.push1(
                OpKind::Splat {
                    x: v,
                    shape: shape.to_vec(),
                },
                tile_type(shape.to_vec(), dtype),
            ));
        }
        if s.len() > shape.len() {
            self.internal(span, format!("cannot broadcast {s:?} to {shape:?}"));
            return Err(());
        }
        while s.len() < shape.len() {
            s.insert(0, 1);
            v = self.b.push1(
                OpKind::ExpandDims { x: v, axis: 0 },
                tile_type(s.clone(), dtype),
            );
        }
        if s != shape {
            if s.iter().zip(shape).any(|(a, b)| a != b && *a != 1) {
                self.internal(span, format!("cannot broadcast {s:?} to {shape:?}"));
                return Err(());
            }
            v = self.b.push1(
                OpKind::Broadcast {
                    x: v,
                    shape: shape.to_vec(),
                },
                tile_type(shape.to_vec(), dtype),
            );
        }
        Ok(v)
    }

    /// A run-time value of `ty`, with a symbolic value when it is an int scalar.
    pub(super) fn val(&mut self, v: Value, weak: bool) -> LV {
        let t = self.b.ty(v);
        let sym = (t.shape().is_empty() && t.dtype().is_int()).then(|| self.fresh_sym());
        LV::Val { v, weak, sym }
    }

    /// The symbolic integer value of a scalar (for slice lengths).
    pub(super) fn sym_of(&self, lv: &LV) -> Option<SymDim> {
        match lv {
            LV::Const {
                c: CValue::Int(d), ..
            } => Some(d.clone()),
            LV::Val { sym, .. } => sym.clone(),
            _ => None,
        }
    }

    /// A compile-time integer.
    pub(super) fn const_int(&mut self, lv: &LV, span: Span, what: &str) -> R<i64> {
        match lv {
            LV::Const { c, .. } => match c.as_int() {
                Some(i) => Ok(i),
                None => {
                    self.internal(span, format!("{what} must be an integer constant"));
                    Err(())
                }
            },
            _ => match self.sym_of(lv).and_then(|d| d.as_const()) {
                Some(i) => Ok(i),
                None => {
                    self.needs_const(span, lv, what);
                    Err(())
                }
            },
        }
    }

    /// E0511 when a size depends on an unspecialised tensor dim; otherwise internal.
    pub(super) fn needs_const(&mut self, span: Span, lv: &LV, what: &str) {
        let sym = self.sym_of(lv);
        let dim = sym.as_ref().and_then(|d| {
            d.symbols()
                .into_iter()
                .find(|s| !s.starts_with('%'))
                .map(str::to_string)
        });
        match dim {
            Some(name) if self.is_dim(&name) => {
                self.missing_dims.push(name.clone());
                self.diags.push(
                Diagnostic::new(
                    "E0511",
                    span,
                    format!(
                        "{what} depends on the tensor dim `{name}`: kernel `{}` must be specialised on it",
                        self.f.name.name
                    ),
                )
                .with_help(format!("give it a value when compiling, e.g. `-D {name}=128`")),
                )
            }
            _ => self.internal(span, format!("{what} is not known at compile time")),
        }
    }

    fn is_dim(&self, name: &str) -> bool {
        self.params.iter().any(|p| match &p.kind {
            ParamKind::Tensor { dims, .. } => dims.iter().any(|d| match d {
                Dim::Dynamic(s) => {
                    s == name || SymDim::parse(s).is_ok_and(|d| d.symbols().contains(&name))
                }
                Dim::Static(_) => false,
            }),
            _ => false,
        })
    }
}
