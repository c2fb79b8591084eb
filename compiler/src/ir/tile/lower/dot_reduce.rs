//! `dot` (operands of one dtype, a float accumulator of the result shape) and
//! reductions (one `Reduce` per axis; `mean` as a sum).

use super::values::tile_type;
use super::{Lowerer, LV, R};
use crate::check::builtins::{Builtin, Builtin as B};
use crate::check::DType;
use crate::ir::tile::{BinaryOp, Constant, OpKind, Precision, ReduceOp};
use crate::syntax::ast::Expr;
use crate::syntax::span::Span;

impl<'a> Lowerer<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dot(
        &mut self,
        a: &LV,
        b: &LV,
        acc: Option<(LV, Span)>,
        precision: Precision,
        span: Span,
        ae: &Expr,
        be: &Expr,
    ) -> R<LV> {
        let (da, _, sa) = self.info(a, ae.span)?;
        let (db, _, sb) = self.info(b, be.span)?;
        if sa.len() != 2 || sb.len() != 2 {
            self.internal(span, "`dot` of tiles that are not 2-D");
            return Err(());
        }
        let d = DType::join(da, db).unwrap_or(da);
        let x = self.materialize(a, d, ae.span)?;
        let y = self.materialize(b, d, be.span)?;
        let out = vec![sa[0], sb[1]];
        // f64 accumulates in f64, every narrower float in f32.
        let od = if d == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let acc = match acc {
            Some((lv, sp)) => Some(self.coerce(&lv, od, &out, sp)?),
            None => None,
        };
        let r = self.b.push1(
            OpKind::Dot {
                a: x,
                b: y,
                acc,
                precision,
            },
            tile_type(out, od),
        );
        Ok(self.val(r, false))
    }

    pub(super) fn reduce(
        &mut self,
        id: Builtin,
        x: &LV,
        axis: Option<i64>,
        keep: bool,
        span: Span,
    ) -> R<LV> {
        let (d, _, shape) = self.info(x, span)?;
        if shape.is_empty() {
            // A reduction of a scalar is the scalar (mean: as a float).
            return match id {
                B::Mean if !d.is_float() => {
                    let v = self.materialize(x, DType::F32, span)?;
                    Ok(self.val(v, false))
                }
                _ => Ok(x.clone()),
            };
        }
        let (op, rd) = match (id, d) {
            (B::Sum, DType::Bool) => (ReduceOp::Sum, DType::I32),
            (B::Sum, d) => (ReduceOp::Sum, d),
            (B::Mean, d) if !d.is_float() => (ReduceOp::Sum, DType::F32),
            (B::Mean, d) => (ReduceOp::Sum, d),
            (B::Max, d) => (ReduceOp::Max, d),
            (B::Min, d) => (ReduceOp::Min, d),
            (other, _) => {
                self.internal(span, format!("`{other}` is not a reduction"));
                return Err(());
            }
        };
        let mut v = self.materialize(x, rd, span)?;
        let rank = shape.len() as i64;
        let axes: Vec<usize> = match axis {
            Some(a) => {
                let a = if a < 0 { a + rank } else { a };
                if !(0..rank).contains(&a) {
                    self.internal(span, "a reduction axis out of range");
                    return Err(());
                }
                vec![a as usize]
            }
            None => (0..shape.len()).collect(),
        };
        let mut cur = shape.clone();
        let mut count: u64 = 1;
        // Reduce the highest axis first so lower indices stay valid without keepdims.
        for &ax in axes.iter().rev() {
            count *= shape[ax] as u64;
            if keep {
                cur[ax] = 1;
            } else {
                cur.remove(ax);
            }
            v = self.b.push1(
                OpKind::Reduce {
                    op,
                    x: v,
                    axis: ax,
                    keepdims: keep,
                },
                tile_type(cur.clone(), rd),
            );
        }
        if id == B::Mean {
            // `sum * (1 / n)` is exact only for n a power of two; otherwise
            // `sum / n`, correctly rounded, so that a GPU contracting the
            // product into a following `x - mean` (one FMA) cannot make the
            // deviation of equal values nonzero where the CPU's is 0.
            let (op, c) = if count.is_power_of_two() {
                (BinaryOp::Mul, 1.0 / count as f64)
            } else {
                (BinaryOp::Div, count as f64)
            };
            let k = self.constant(Constant::Float(c), rd);
            let t = self.b.ty(v).clone();
            let k = if t.shape().is_empty() {
                k
            } else {
                self.b.push1(
                    OpKind::Splat {
                        x: k,
                        shape: t.shape().to_vec(),
                    },
                    t.clone(),
                )
            };
            v = self.b.push1(OpKind::Binary { op, a: v, b: k }, t);
        }
        Ok(self.val(v, false))
    }
}
