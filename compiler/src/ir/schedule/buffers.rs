//! Buffers and host scalars of graph nodes: new buffers and temporaries, a
//! node's buffer as a given dtype (a cast kernel when it differs) or as f32,
//! a scalar node's host expression, views and their base buffers.

use super::generate::Group;
use super::{constant_of, product, BufId, BufKind, Buffer, Lower, ScalarExpr, R};
use crate::check::dims::Dim;
use crate::check::DType;
use crate::ir::graph::{Activation, LowerError, NodeId, NodeKind};
use crate::ir::tile::{BinaryOp, Constant, UnaryOp};
use crate::syntax::span::Span;

impl<'g> Lower<'g> {
    fn span(&self, n: NodeId) -> Span {
        self.g.node(n).span
    }

    pub(super) fn unsupported(&self, n: NodeId, what: impl Into<String>) -> LowerError {
        LowerError::new(self.span(n), what)
    }

    pub(super) fn add_buffer(
        &mut self,
        name: String,
        kind: BufKind,
        dims: Vec<Dim>,
        dtype: DType,
    ) -> BufId {
        let id = BufId(self.buffers.len() as u32);
        self.buffers.push(Buffer {
            name,
            kind,
            dims,
            dtype,
            alloc: false,
        });
        id
    }

    pub(super) fn temp(&mut self, dims: Vec<Dim>, dtype: DType) -> BufId {
        let name = format!("t{}", self.temps);
        self.temps += 1;
        self.add_buffer(name, BufKind::Temp, dims, dtype)
    }

    /// A buffer holding a tensor node's value in the node's dtype: a matmul's f32
    /// result for a narrower matmul is cast by a copy kernel (once per node).
    pub(super) fn buf_as(&mut self, n: NodeId, user: NodeId) -> R<BufId> {
        let b = self.buf(n, user)?;
        let want = self.g.ty(n).dtype();
        if Some(self.buffers[b.0 as usize].dtype) == want {
            return Ok(b);
        }
        if let Some(c) = self.cast_of.get(&n) {
            return Ok(*c);
        }
        let t = self.temp(self.g.ty(n).dims().to_vec(), want.unwrap_or(DType::F32));
        self.fused(
            &Group {
                members: vec![],
                root: n,
                copy: true,
            },
            t,
        )?;
        self.cast_of.insert(n, t);
        Ok(t)
    }

    /// A buffer holding a float node's value as f32: a copy when its dtype is
    /// narrower (one kernel, also when the value sits in an f32 buffer: the copy
    /// rounds it to the node's dtype first, as the program says).
    pub(super) fn buf_f32(&mut self, n: NodeId, user: NodeId) -> R<BufId> {
        let b = self.buf(n, user)?;
        if self.buffers[b.0 as usize].dtype == DType::F32
            && self.g.ty(n).dtype() == Some(DType::F32)
        {
            return Ok(b);
        }
        if let Some(c) = self.f32_of.get(&n) {
            return Ok(*c);
        }
        let t = self.temp(self.g.ty(n).dims().to_vec(), DType::F32);
        self.fused(
            &Group {
                members: vec![],
                root: n,
                copy: true,
            },
            t,
        )?;
        self.f32_of.insert(n, t);
        Ok(t)
    }

    /// The buffer holding a tensor node's value.
    pub(super) fn buf(&self, n: NodeId, user: NodeId) -> R<BufId> {
        self.buf_of.get(&n).copied().ok_or_else(|| {
            self.unsupported(user, "an operand that is not materialised in a buffer")
        })
    }

    pub(super) fn scalar(&self, n: NodeId) -> R<ScalarExpr> {
        if let Some(e) = self.scalar_of.get(&n) {
            return Ok(e.clone());
        }
        let node = self.g.node(n);
        if !node.ty.is_scalar() {
            return Err(self.unsupported(n, "a tensor where a scalar is needed"));
        }
        Ok(match &node.kind {
            NodeKind::Param(p) => ScalarExpr::Param(self.g.params[*p].name.clone()),
            NodeKind::Const(c) => ScalarExpr::Const(*c),
            NodeKind::Index(d) => ScalarExpr::Index(d.clone()),
            NodeKind::Unary { op, x } => {
                ScalarExpr::Unary(*op, Box::new(self.scalar_as(*x, node.ty.dtype())?))
            }
            NodeKind::Binary { op, a, b } => {
                // Operands in one dtype: the result's, or for comparisons the
                // wider of the two.
                let (da, db) = (self.g.ty(*a).dtype(), self.g.ty(*b).dtype());
                let want = if op.is_comparison() {
                    match (da, db) {
                        (Some(x), Some(y)) => DType::join(x, y).or(Some(x)),
                        _ => da,
                    }
                } else {
                    node.ty.dtype()
                };
                ScalarExpr::Binary(
                    *op,
                    Box::new(self.scalar_as(*a, want)?),
                    Box::new(self.scalar_as(*b, want)?),
                )
            }
            NodeKind::Cast { x, to } => ScalarExpr::Cast(Box::new(self.scalar(*x)?), *to),
            // As the fused kernels compute them, on one value.
            NodeKind::Activation { act, x } => {
                let x = self.scalar_as(*x, node.ty.dtype())?;
                let f = |v: f64| Box::new(ScalarExpr::Const(Constant::Float(v)));
                let bin = |op, a: Box<ScalarExpr>, b: Box<ScalarExpr>| {
                    Box::new(ScalarExpr::Binary(op, a, b))
                };
                let x = Box::new(x);
                match act {
                    Activation::Relu => ScalarExpr::Binary(BinaryOp::Max, x, f(0.0)),
                    Activation::Silu => {
                        let s = Box::new(ScalarExpr::Unary(UnaryOp::Sigmoid, x.clone()));
                        ScalarExpr::Binary(BinaryOp::Mul, x, s)
                    }
                    Activation::Gelu => {
                        let t = bin(BinaryOp::Mul, x.clone(), f(std::f64::consts::FRAC_1_SQRT_2));
                        let e = bin(
                            BinaryOp::Add,
                            f(1.0),
                            Box::new(ScalarExpr::Unary(UnaryOp::Erf, t)),
                        );
                        ScalarExpr::Binary(BinaryOp::Mul, bin(BinaryOp::Mul, f(0.5), x), e)
                    }
                }
            }
            _ => return Err(self.unsupported(n, "this scalar operation on the host")),
        })
    }

    /// A host scalar converted to `want` when its own dtype differs, so that
    /// every host operation has operands of one dtype (`rsqrt(f32(D))`).
    pub(super) fn scalar_as(&self, n: NodeId, want: Option<DType>) -> R<ScalarExpr> {
        let e = self.scalar(n)?;
        Ok(match (want, self.g.ty(n).dtype()) {
            (Some(w), Some(d)) if w != d => match e {
                ScalarExpr::Const(c) => ScalarExpr::Const(constant_of(w, &c)),
                e => ScalarExpr::Cast(Box::new(e), w),
            },
            _ => e,
        })
    }

    /// `[R, C]`: the product of the leading dims and the last dim (`[1, 1]`
    /// for a rank-0 tensor: one row of one element).
    pub(super) fn rows_cols(&self, dims: &[Dim], n: NodeId) -> R<(Dim, Dim)> {
        let Some((last, lead)) = dims.split_last() else {
            return Ok((Dim::constant(1), Dim::constant(1)));
        };
        let r = product(lead).ok_or_else(|| self.unsupported(n, "a dim product that overflows"))?;
        Ok((r, last.clone()))
    }
}

impl Lower<'_> {
    /// The buffer owning the memory of `b` (through views).
    pub(super) fn base(&self, mut b: BufId) -> BufId {
        while let BufKind::View(of) = self.buffers[b.0 as usize].kind {
            b = of;
        }
        b
    }
}
