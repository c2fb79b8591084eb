//! Generated gemms for the matmuls no std.linalg gemm covers (batch dims with
//! bf16 or f32, broadcast batch dims, integers): a loop over K of `dot` into an
//! accumulator of `acc_dtype` (f32 for narrower floats, exact for integers).

use super::{acc_dtype, KernelBuilder};
use crate::check::dims::Dim;
use crate::check::DType;
use crate::ir::graph::{NodeId, NodeKind};
use crate::ir::schedule::{
    cdiv, product, zero_of, Arg, BufId, KernelRef, Launch, Lower, ScalarExpr, R,
};
use crate::ir::tile::{
    self, Access, BinaryOp, Constant, Kernel, Op, OpKind, ParamKind, Region, Type,
};

impl Lower<'_> {
    /// A generated batched gemm for the matmuls no stdlib gemm covers (bf16 or
    /// f32 with batch dims, broadcast batch dims): operands padded to one rank
    /// (`da`, `db`: `[batch.., M, K]`, `[batch.., K, N]`), one program per
    /// `(batch x M tile, N tile)`, a loop over K with `dot` into an f32
    /// accumulator, written to the f32 buffer `c`; a batch axis an operand lacks
    /// (size 1) reads index 0.
    pub(in crate::ir::schedule) fn matmul_generated(
        &mut self,
        n: NodeId,
        da: &[Dim],
        db: &[Dim],
        ba: BufId,
        bb: BufId,
        c: BufId,
    ) -> R<()> {
        let g = self.g;
        let nb = da.len().max(db.len()) - 2;
        let pad = |d: &[Dim]| {
            let mut p = vec![Dim::constant(1); nb + 2 - d.len()];
            p.extend(d.iter().cloned());
            p
        };
        let (pa, pb) = (pad(da), pad(db));
        let batch: Vec<Dim> = (0..nb)
            .map(|k| {
                if pa[k].is_one() {
                    pb[k].clone()
                } else {
                    pa[k].clone()
                }
            })
            .collect();
        let (m, kd, nn) = (pa[nb].clone(), pa[nb + 1].clone(), pb[nb + 1].clone());
        let z = product(&batch).ok_or_else(|| self.unsupported(n, "batch dims"))?;
        let NodeKind::MatMul { a, b, tf32 } = g.node(n).kind else {
            unreachable!("a matmul")
        };
        let dt = g.ty(n).dtype().unwrap_or(DType::F32);
        let (adt, bdt) = (
            self.buffers[ba.0 as usize].dtype,
            self.buffers[bb.0 as usize].dtype,
        );
        // Integers accumulate exactly in their own width (at least i32), one
        // rank-1 update per step of K; floats use `dot` with an f32 accumulator.
        let acc_dt = acc_dtype(dt);
        let int = dt.is_int();
        let (bm, bn, bk) = if int {
            (32i64, 32i64, 1i64)
        } else {
            (64i64, 64i64, 32i64)
        };
        let (bm32, bn32, bk32) = (bm as u32, bn as u32, bk as u32);
        let dim_of = |d: &Dim, name: String| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name),
        };
        let operand_dims = |p: &[Dim], inner: [(&Dim, &str); 2]| -> Vec<tile::Dim> {
            let mut v: Vec<tile::Dim> = (0..nb)
                .map(|k| {
                    if p[k].is_one() {
                        tile::Dim::Static(1)
                    } else {
                        dim_of(&p[k], format!("Z{k}"))
                    }
                })
                .collect();
            v.push(dim_of(inner[0].0, inner[0].1.to_string()));
            v.push(dim_of(inner[1].0, inner[1].1.to_string()));
            v
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![
                tile::Param {
                    name: "A".into(),
                    kind: ParamKind::Tensor {
                        dims: operand_dims(&pa, [(&m, "M"), (&kd, "K")]),
                        dtype: adt,
                    },
                },
                tile::Param {
                    name: "B".into(),
                    kind: ParamKind::Tensor {
                        dims: operand_dims(&pb, [(&kd, "K"), (&nn, "N")]),
                        dtype: bdt,
                    },
                },
                tile::Param {
                    name: "C".into(),
                    kind: ParamKind::Tensor {
                        dims: operand_dims(&batch, [(&m, "M"), (&nn, "N")]),
                        dtype: acc_dt,
                    },
                },
            ],
            span: g.node(n).span,
        };
        let mut args: Vec<(String, Arg)> = vec![
            (
                "A".into(),
                Arg::Buffer {
                    buf: ba,
                    dims: pa.clone(),
                },
            ),
            (
                "B".into(),
                Arg::Buffer {
                    buf: bb,
                    dims: pb.clone(),
                },
            ),
            ("C".into(), {
                let mut d = batch.clone();
                d.push(m.clone());
                d.push(nn.clone());
                Arg::Buffer { buf: c, dims: d }
            }),
        ];
        let value_of = |kb: &mut KernelBuilder,
                        args: &mut Vec<(String, Arg)>,
                        d: &Dim,
                        name: String| match d.as_const() {
            Some(v) => kb.cnst(Constant::Int(v), DType::I32),
            None => {
                let idx = kb.params.len();
                kb.params.push(tile::Param {
                    name: name.clone(),
                    kind: ParamKind::Scalar(DType::I32),
                });
                args.push((name, Arg::Scalar(ScalarExpr::Index(d.clone()))));
                kb.emit(OpKind::ScalarParam(idx), Type::Scalar(DType::I32))
            }
        };
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let pid1 = kb.emit(OpKind::ProgramId(1), Type::Scalar(DType::I32));
        let kbm = kb.cnst(Constant::Int(bm), DType::I32);
        let kbn = kb.cnst(Constant::Int(bn), DType::I32);
        let mv = value_of(&mut kb, &mut args, &m, "m".into());
        let bm1 = kb.cnst(Constant::Int(bm - 1), DType::I32);
        let t = kb.binary(BinaryOp::Add, mv, bm1);
        let m_tiles = kb.binary(BinaryOp::FloorDiv, t, kbm);
        let zi = kb.binary(BinaryOp::FloorDiv, pid0, m_tiles);
        let mt = kb.binary(BinaryOp::Mod, pid0, m_tiles);
        let m0 = kb.binary(BinaryOp::Mul, mt, kbm);
        let n0 = kb.binary(BinaryOp::Mul, pid1, kbn);
        let zero = kb.cnst(Constant::Int(0), DType::I32);
        let mut index = vec![zero; nb];
        let mut rest = zi;
        for k in (0..nb).rev() {
            let dk = value_of(&mut kb, &mut args, &batch[k], format!("z{k}"));
            index[k] = kb.binary(BinaryOp::Mod, rest, dk);
            rest = kb.binary(BinaryOp::FloorDiv, rest, dk);
        }
        let points = |p: &[Dim]| -> Vec<Access> {
            (0..nb)
                .map(|k| Access::Point(if p[k].is_one() { zero } else { index[k] }))
                .collect()
        };
        let f0 = kb.cnst(zero_of(acc_dt), acc_dt);
        let acc0 = kb.splat(f0, &[bm32, bn32]);
        let lo = kb.cnst(Constant::Int(0), DType::I32);
        let hi = value_of(&mut kb, &mut args, &kd, "k".into());
        let step = kb.cnst(Constant::Int(bk), DType::I32);
        let iv = kb.fresh(Type::Scalar(DType::I32));
        let acc_in = kb.fresh(KernelBuilder::tile_ty(&[bm32, bn32], acc_dt));
        let outer = std::mem::take(&mut kb.ops);
        let mut acc_a = points(&pa);
        acc_a.push(Access::Range {
            start: m0,
            len: bm32,
        });
        acc_a.push(Access::Range {
            start: iv,
            len: bk32,
        });
        let ta = kb.emit(
            OpKind::Load {
                tensor: 0,
                access: acc_a,
                mask: None,
                other: zero_of(adt),
            },
            KernelBuilder::tile_ty(&[bm32, bk32], adt),
        );
        let mut acc_b = points(&pb);
        acc_b.push(Access::Range {
            start: iv,
            len: bk32,
        });
        acc_b.push(Access::Range {
            start: n0,
            len: bn32,
        });
        let tb = kb.emit(
            OpKind::Load {
                tensor: 1,
                access: acc_b,
                mask: None,
                other: zero_of(bdt),
            },
            KernelBuilder::tile_ty(&[bk32, bn32], bdt),
        );
        // Operands at their graph dtypes, then both at the product's.
        let ta = kb.cast(ta, g.ty(a).dtype().unwrap_or(adt));
        let ta = kb.cast(ta, dt);
        let tb = kb.cast(tb, g.ty(b).dtype().unwrap_or(bdt));
        let tb = kb.cast(tb, dt);
        let next = if int {
            // acc += a[:, k] * b[k, :], the `[BM, 1]` and `[1, BN]` tiles broadcast.
            let ta = kb.cast(ta, acc_dt);
            let tb = kb.cast(tb, acc_dt);
            let full = KernelBuilder::tile_ty(&[bm32, bn32], acc_dt);
            let ta = kb.emit(
                OpKind::Broadcast {
                    x: ta,
                    shape: vec![bm32, bn32],
                },
                full.clone(),
            );
            let tb = kb.emit(
                OpKind::Broadcast {
                    x: tb,
                    shape: vec![bm32, bn32],
                },
                full,
            );
            let prod = kb.binary(BinaryOp::Mul, ta, tb);
            kb.binary(BinaryOp::Add, acc_in, prod)
        } else {
            kb.emit(
                OpKind::Dot {
                    a: ta,
                    b: tb,
                    acc: Some(acc_in),
                    precision: if tf32 && adt == DType::F32 {
                        tile::Precision::Tf32
                    } else {
                        tile::Precision::Ieee
                    },
                },
                KernelBuilder::tile_ty(&[bm32, bn32], acc_dt),
            )
        };
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Yield(vec![next]),
            span: kb.span,
        });
        let body_ops = std::mem::replace(&mut kb.ops, outer);
        let total = kb.fresh(KernelBuilder::tile_ty(&[bm32, bn32], acc_dt));
        kb.ops.push(Op {
            results: vec![total],
            kind: OpKind::For {
                lo,
                hi,
                step,
                init: vec![acc0],
                body: Region {
                    args: vec![iv, acc_in],
                    ops: body_ops,
                },
            },
            span: kb.span,
        });
        let mut acc_c: Vec<Access> = index.iter().map(|i| Access::Point(*i)).collect();
        acc_c.push(Access::Range {
            start: m0,
            len: bm32,
        });
        acc_c.push(Access::Range {
            start: n0,
            len: bn32,
        });
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: 2,
                access: acc_c,
                value: total,
                mask: None,
            },
            span: kb.span,
        });
        let name = format!("{}_matmul{}", g.name, self.kernels.len());
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
        let rows = match (z.as_const(), m.as_const()) {
            (Some(zc), Some(mc)) => ScalarExpr::Index(Dim::constant(zc * ((mc + bm - 1) / bm))),
            _ => ScalarExpr::Binary(
                BinaryOp::Mul,
                Box::new(ScalarExpr::Index(z)),
                Box::new(cdiv(&m, bm)),
            ),
        };
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes: vec![n],
            grid: Some(vec![rows, cdiv(&nn, bn)]),
            args,
            consts: vec![],
            requires: vec![],
            writes: vec![c],
        });
        Ok(())
    }
}
