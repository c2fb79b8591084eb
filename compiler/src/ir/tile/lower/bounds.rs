//! The bounds of tensor accesses: which elements of a slice or gather lie
//! inside the tensor (the mask of a load, store or atomic).

use super::values::tile_type;
use super::{Lowerer, LV, R};
use crate::check::DType;
use crate::ir::tile::{Access, BinaryOp, Constant, Dim, OpKind, ParamKind, Value};
use crate::syntax::span::Span;

impl<'a> Lowerer<'a> {
    /// A bool tile of the access's shape: whether each element lies inside the tensor.
    pub(super) fn in_bounds(
        &mut self,
        tensor: usize,
        access: &[Access],
        shape: &[u32],
        span: Span,
    ) -> R<Value> {
        let ParamKind::Tensor { dims, .. } = self.params[tensor].kind.clone() else {
            self.internal(span, "not a tensor");
            return Err(());
        };
        let bool_t = |s: Vec<u32>| tile_type(s, DType::Bool);
        let zero = self.constant(Constant::Int(0), DType::I32);
        let mut acc: Option<Value> = None;
        let mut pos = 0;
        for (axis, a) in access.iter().enumerate() {
            let n = match &dims[axis] {
                Dim::Static(n) => self.constant(Constant::Int(*n as i64), DType::I32),
                Dim::Dynamic(_) => self.tensor_dim(tensor, axis),
            };
            let (x, s) = match a {
                Access::Point(v) => {
                    let v = self.materialize(
                        &LV::Val {
                            v: *v,
                            weak: false,
                            sym: None,
                        },
                        DType::I32,
                        span,
                    )?;
                    (v, vec![])
                }
                Access::Range { start, len } => {
                    let start = self.materialize(
                        &LV::Val {
                            v: *start,
                            weak: false,
                            sym: None,
                        },
                        DType::I32,
                        span,
                    )?;
                    let ar = self.b.push1(
                        OpKind::Arange { start, len: *len },
                        tile_type(vec![*len], DType::I32),
                    );
                    (ar, vec![*len])
                }
                // Already of the whole shape: nothing to place.
                Access::Gather(v) => (*v, shape.to_vec()),
            };
            let lo = self.coerce(
                &LV::Val {
                    v: zero,
                    weak: false,
                    sym: None,
                },
                DType::I32,
                &s,
                span,
            )?;
            let hi = self.coerce(
                &LV::Val {
                    v: n,
                    weak: false,
                    sym: None,
                },
                DType::I32,
                &s,
                span,
            )?;
            let ge = self.b.push1(
                OpKind::Binary {
                    op: BinaryOp::Ge,
                    a: x,
                    b: lo,
                },
                bool_t(s.clone()),
            );
            let lt = self.b.push1(
                OpKind::Binary {
                    op: BinaryOp::Lt,
                    a: x,
                    b: hi,
                },
                bool_t(s.clone()),
            );
            let mut ok = self.b.push1(
                OpKind::Binary {
                    op: BinaryOp::And,
                    a: ge,
                    b: lt,
                },
                bool_t(s.clone()),
            );
            // Place the axis in the result shape: [len] -> [1, .., len, .., 1].
            if matches!(a, Access::Range { .. }) {
                let mut cur = s;
                for _ in 0..pos {
                    cur.insert(0, 1);
                    ok = self
                        .b
                        .push1(OpKind::ExpandDims { x: ok, axis: 0 }, bool_t(cur.clone()));
                }
                while cur.len() < shape.len() {
                    let at = cur.len();
                    cur.push(1);
                    ok = self
                        .b
                        .push1(OpKind::ExpandDims { x: ok, axis: at }, bool_t(cur.clone()));
                }
                pos += 1;
            }
            let okv = LV::Val {
                v: ok,
                weak: false,
                sym: None,
            };
            let ok = self.coerce(&okv, DType::Bool, shape, span)?;
            acc = Some(match acc {
                None => ok,
                Some(prev) => self.b.push1(
                    OpKind::Binary {
                        op: BinaryOp::And,
                        a: prev,
                        b: ok,
                    },
                    bool_t(shape.to_vec()),
                ),
            });
        }
        match acc {
            Some(v) => Ok(v),
            None => Ok(self.constant(Constant::Bool(true), DType::Bool)),
        }
    }

    pub(super) fn tensor_dtype(&self, t: usize) -> DType {
        match &self.params[t].kind {
            ParamKind::Tensor { dtype, .. } | ParamKind::Scalar(dtype) => *dtype,
        }
    }
}
