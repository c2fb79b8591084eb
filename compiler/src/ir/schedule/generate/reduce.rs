//! Generated reductions: `sum`/`max`/`min`/`mean` over any axis or all of
//! them, looping over the reduced extent.

use super::{chunk_loop, neutral, next_pow2, ChunkLoad, KernelBuilder};
use crate::check::dims::Dim;
use crate::check::DType;
use crate::ir::graph::{NodeId, NodeKind, ReduceKind};
use crate::ir::schedule::{cdiv, product, Arg, BufId, KernelRef, Launch, Lower, ScalarExpr, R};
use crate::ir::tile::{
    self, Access, BinaryOp, Constant, Kernel, Op, OpKind, ParamKind, Region, Type, Value,
};

impl Lower<'_> {
    /// A generated reduction of one axis (or of everything): `x` is viewed as
    /// `[R, K, C]` (K the reduced extent, R and C the products of the dims before
    /// and after it), one program reduces `K` for one `r` and a block of `C`, looping over `K` in chunks; out-of-bounds lanes read the
    /// reduction's identity. Accumulates floats in f32.
    pub(in crate::ir::schedule) fn reduce_generated(&mut self, n: NodeId, out: BufId) -> R<()> {
        let g = self.g;
        let NodeKind::Reduce { op, x, axis, .. } = g.node(n).kind else {
            unreachable!("a reduction")
        };
        let xd = g.ty(x).dims().to_vec();
        let overflow = || self.unsupported(n, "a dim product that overflows");
        let (a, k, b) = match axis {
            Some(j) => (
                product(&xd[..j]).ok_or_else(overflow)?,
                xd[j].clone(),
                product(&xd[j + 1..]).ok_or_else(overflow)?,
            ),
            None => (
                Dim::constant(1),
                product(&xd).ok_or_else(overflow)?,
                Dim::constant(1),
            ),
        };
        let bx = self.buf(x, n)?;
        let bdt = self.buffers[bx.0 as usize].dtype;
        let odt = self.buffers[out.0 as usize].dtype;
        let xdt = g.ty(x).dtype().unwrap_or(bdt);
        let ndt = g.ty(n).dtype().unwrap_or(odt);
        let acc = if ndt == DType::F64 {
            DType::F64
        } else if ndt.is_float() {
            DType::F32
        } else {
            ndt
        };
        let bc = b.as_const().map(|b| next_pow2(b).min(32)).unwrap_or(32);
        let mut bk = (1024 / bc).max(1);
        if let Some(kc) = k.as_const() {
            bk = bk.min(next_pow2(kc).max(1));
        }
        let dim_of = |d: &Dim, name: &str| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name.to_string()),
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![
                tile::Param {
                    name: "x0".into(),
                    kind: ParamKind::Tensor {
                        dims: vec![dim_of(&a, "R"), dim_of(&k, "K"), dim_of(&b, "C")],
                        dtype: bdt,
                    },
                },
                tile::Param {
                    name: "out".into(),
                    kind: ParamKind::Tensor {
                        dims: vec![dim_of(&a, "R"), dim_of(&b, "C")],
                        dtype: odt,
                    },
                },
            ],
            span: g.node(n).span,
        };
        let (bc32, bk32) = (bc as u32, bk as u32);
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let pid1 = kb.emit(OpKind::ProgramId(1), Type::Scalar(DType::I32));
        let kbc = kb.cnst(Constant::Int(bc), DType::I32);
        let c0 = kb.binary(BinaryOp::Mul, pid1, kbc);
        let id = kb.emit(OpKind::Const(neutral(op, acc)), Type::Scalar(acc));
        let init = kb.splat(id, &[bc32]);
        let lo = kb.cnst(Constant::Int(0), DType::I32);
        let hi = match k.as_const() {
            Some(kc) => kb.cnst(Constant::Int(kc), DType::I32),
            None => kb.emit(
                OpKind::TensorDim { param: 0, axis: 1 },
                Type::Scalar(DType::I32),
            ),
        };
        let step = kb.cnst(Constant::Int(bk), DType::I32);
        let load = |kb: &mut KernelBuilder, start: Value| {
            kb.emit(
                OpKind::Load {
                    tensor: 0,
                    access: vec![
                        Access::Point(pid0),
                        Access::Range { start, len: bk32 },
                        Access::Range {
                            start: c0,
                            len: bc32,
                        },
                    ],
                    mask: None,
                    other: neutral(op, bdt),
                },
                KernelBuilder::tile_ty(&[bk32, bc32], bdt),
            )
        };
        let widen = |kb: &mut KernelBuilder, ld: Value| {
            let v = kb.cast(ld, xdt);
            kb.cast(v, acc)
        };
        let (rop, bop) = match op {
            ReduceKind::Sum | ReduceKind::Mean => (tile::ReduceOp::Sum, BinaryOp::Add),
            ReduceKind::Max => (tile::ReduceOp::Max, BinaryOp::Max),
            ReduceKind::Min => (tile::ReduceOp::Min, BinaryOp::Min),
        };
        let chunks = (&load as &ChunkLoad, &widen as &ChunkLoad, false);
        let total = chunk_loop(
            &mut kb,
            (lo, hi, step),
            chunks,
            vec![init],
            &mut |kb, _, v, c| {
                let r = kb.emit(
                    OpKind::Reduce {
                        op: rop,
                        x: v,
                        axis: 0,
                        keepdims: false,
                    },
                    KernelBuilder::tile_ty(&[bc32], acc),
                );
                vec![kb.binary(bop, c[0], r)]
            },
        )[0];
        let mut res = total;
        if op == ReduceKind::Mean {
            let kf = kb.cast(hi, acc);
            let kf = kb.splat(kf, &[bc32]);
            res = kb.binary(BinaryOp::Div, res, kf);
        }
        let res = kb.cast(res, ndt);
        let res = kb.cast(res, odt);
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: 1,
                access: vec![
                    Access::Point(pid0),
                    Access::Range {
                        start: c0,
                        len: bc32,
                    },
                ],
                value: res,
                mask: None,
            },
            span: kb.span,
        });
        let name = format!("{}_reduce{}", g.name, self.kernels.len());
        self.kernels.push(Kernel {
            name,
            specialization: vec![],
            divisibility: vec![],
            divisibility_trusted: false,
            params: kb.params,
            num_warps: 4,
            num_stages: 1,
            body: Region {
                args: vec![],
                ops: kb.ops,
            },
            types: kb.types,
        });
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes: vec![n],
            grid: Some(vec![ScalarExpr::Index(a.clone()), cdiv(&b, bc)]),
            args: vec![
                (
                    "x0".into(),
                    Arg::Buffer {
                        buf: bx,
                        dims: vec![a.clone(), k, b.clone()],
                    },
                ),
                (
                    "out".into(),
                    Arg::Buffer {
                        buf: out,
                        dims: vec![a, b],
                    },
                ),
            ],
            consts: vec![],
            requires: vec![],
            writes: vec![out],
        });
        Ok(())
    }
}
