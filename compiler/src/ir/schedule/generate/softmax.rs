//! Generated softmax over any axis and float dtype: three loops over the axis
//! (max, sum, normalise).

use super::{neutral, next_pow2, KernelBuilder, LoopBody};
use crate::check::dims::Dim;
use crate::check::DType;
use crate::ir::graph::{NodeId, NodeKind, ReduceKind};
use crate::ir::schedule::{cdiv, product, Arg, BufId, KernelRef, Launch, Lower, ScalarExpr, R};
use crate::ir::tile::{
    self, Access, BinaryOp, Constant, Kernel, Op, OpKind, ParamKind, Region, Type, UnaryOp, Value,
};

impl Lower<'_> {
    /// A generated softmax over any axis and float dtype: `x` viewed as
    /// `[R, K, C]` (K the softmax axis), one program handles one `r` and a block
    /// of `C` in three loops over `K`: the max, the sum of `exp(x - max)`, and the
    /// normalised values (f32 arithmetic; out-of-bounds lanes read -inf, which
    /// adds nothing and is never stored).
    pub(in crate::ir::schedule) fn softmax_generated(&mut self, n: NodeId, out: BufId) -> R<()> {
        let g = self.g;
        let NodeKind::Softmax { x, axis } = g.node(n).kind else {
            unreachable!("a softmax")
        };
        let xd = g.ty(x).dims().to_vec();
        let overflow = || self.unsupported(n, "a dim product that overflows");
        let a = product(&xd[..axis]).ok_or_else(overflow)?;
        let k = xd[axis].clone();
        let b = product(&xd[axis + 1..]).ok_or_else(overflow)?;
        let bx = self.buf(x, n)?;
        let bdt = self.buffers[bx.0 as usize].dtype;
        let odt = self.buffers[out.0 as usize].dtype;
        let xdt = g.ty(x).dtype().unwrap_or(bdt);
        let ndt = g.ty(n).dtype().unwrap_or(odt);
        let f = DType::F32;
        let bc = b.as_const().map(|b| next_pow2(b).min(32)).unwrap_or(32);
        let mut bk = (1024 / bc).max(1);
        if let Some(kc) = k.as_const() {
            bk = bk.min(next_pow2(kc).max(1));
        }
        let (bc32, bk32) = (bc as u32, bk as u32);
        let dim_of = |d: &Dim, name: &str| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name.to_string()),
        };
        let view = |d: &Dim| vec![dim_of(&a, "R"), dim_of(d, "K"), dim_of(&b, "C")];
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![
                tile::Param {
                    name: "x0".into(),
                    kind: ParamKind::Tensor {
                        dims: view(&k),
                        dtype: bdt,
                    },
                },
                tile::Param {
                    name: "out".into(),
                    kind: ParamKind::Tensor {
                        dims: view(&k),
                        dtype: odt,
                    },
                },
            ],
            span: g.node(n).span,
        };
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let pid1 = kb.emit(OpKind::ProgramId(1), Type::Scalar(DType::I32));
        let kbc = kb.cnst(Constant::Int(bc), DType::I32);
        let c0 = kb.binary(BinaryOp::Mul, pid1, kbc);
        let lo = kb.cnst(Constant::Int(0), DType::I32);
        let hi = match k.as_const() {
            Some(kc) => kb.cnst(Constant::Int(kc), DType::I32),
            None => kb.emit(
                OpKind::TensorDim { param: 0, axis: 1 },
                Type::Scalar(DType::I32),
            ),
        };
        let step = kb.cnst(Constant::Int(bk), DType::I32);
        let tile2 = [bk32, bc32];
        // One loop over K: `body(kb, iv, x_tile_f32, carried) -> yielded`.
        let looped =
            |kb: &mut KernelBuilder, init: Vec<Value>, body: &mut LoopBody<'_>| -> Vec<Value> {
                let iv = kb.fresh(Type::Scalar(DType::I32));
                let args: Vec<Value> = init
                    .iter()
                    .map(|v| {
                        let t = kb.ty(*v).clone();
                        kb.fresh(t)
                    })
                    .collect();
                let outer = std::mem::take(&mut kb.ops);
                let ld = kb.emit(
                    OpKind::Load {
                        tensor: 0,
                        access: vec![
                            Access::Point(pid0),
                            Access::Range {
                                start: iv,
                                len: bk32,
                            },
                            Access::Range {
                                start: c0,
                                len: bc32,
                            },
                        ],
                        mask: None,
                        other: neutral(ReduceKind::Max, bdt),
                    },
                    KernelBuilder::tile_ty(&tile2, bdt),
                );
                let v = kb.cast(ld, xdt);
                let v = kb.cast(v, f);
                let yielded = body(kb, iv, v, &args);
                kb.ops.push(Op {
                    results: vec![],
                    kind: OpKind::Yield(yielded),
                    span: kb.span,
                });
                let body_ops = std::mem::replace(&mut kb.ops, outer);
                let results: Vec<Value> = init
                    .iter()
                    .map(|v| {
                        let t = kb.ty(*v).clone();
                        kb.fresh(t)
                    })
                    .collect();
                let mut region_args = vec![iv];
                region_args.extend(args);
                kb.ops.push(Op {
                    results: results.clone(),
                    kind: OpKind::For {
                        lo,
                        hi,
                        step,
                        init,
                        body: Region {
                            args: region_args,
                            ops: body_ops,
                        },
                    },
                    span: kb.span,
                });
                results
            };
        let ninf = kb.emit(
            OpKind::Const(Constant::Float(f64::NEG_INFINITY)),
            Type::Scalar(f),
        );
        let m0 = kb.splat(ninf, &[bc32]);
        let m = looped(&mut kb, vec![m0], &mut |kb, _, v, c| {
            let r = kb.emit(
                OpKind::Reduce {
                    op: tile::ReduceOp::Max,
                    x: v,
                    axis: 0,
                    keepdims: false,
                },
                KernelBuilder::tile_ty(&[bc32], f),
            );
            vec![kb.binary(BinaryOp::Max, c[0], r)]
        })[0];
        let bcast = |kb: &mut KernelBuilder, row: Value| {
            let e = kb.emit(
                OpKind::ExpandDims { x: row, axis: 0 },
                KernelBuilder::tile_ty(&[1, bc32], f),
            );
            kb.emit(
                OpKind::Broadcast {
                    x: e,
                    shape: tile2.to_vec(),
                },
                KernelBuilder::tile_ty(&tile2, f),
            )
        };
        let zero = kb.cnst(Constant::Float(0.0), f);
        let s0 = kb.splat(zero, &[bc32]);
        let s = looped(&mut kb, vec![s0], &mut |kb, _, v, c| {
            let mb = bcast(kb, m);
            let d = kb.binary(BinaryOp::Sub, v, mb);
            let e = kb.unary(UnaryOp::Exp, d);
            let r = kb.emit(
                OpKind::Reduce {
                    op: tile::ReduceOp::Sum,
                    x: e,
                    axis: 0,
                    keepdims: false,
                },
                KernelBuilder::tile_ty(&[bc32], f),
            );
            vec![kb.binary(BinaryOp::Add, c[0], r)]
        })[0];
        looped(&mut kb, vec![], &mut |kb, iv, v, _| {
            let mb = bcast(kb, m);
            let sb = bcast(kb, s);
            let d = kb.binary(BinaryOp::Sub, v, mb);
            let e = kb.unary(UnaryOp::Exp, d);
            let y = kb.binary(BinaryOp::Div, e, sb);
            let y = kb.cast(y, ndt);
            let y = kb.cast(y, odt);
            kb.ops.push(Op {
                results: vec![],
                kind: OpKind::Store {
                    tensor: 1,
                    access: vec![
                        Access::Point(pid0),
                        Access::Range {
                            start: iv,
                            len: bk32,
                        },
                        Access::Range {
                            start: c0,
                            len: bc32,
                        },
                    ],
                    value: y,
                    mask: None,
                },
                span: kb.span,
            });
            vec![]
        });
        let name = format!("{}_softmax{}", g.name, self.kernels.len());
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
        let dims = vec![a.clone(), k, b.clone()];
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes: vec![n],
            grid: Some(vec![ScalarExpr::Index(a), cdiv(&b, bc)]),
            args: vec![
                (
                    "x0".into(),
                    Arg::Buffer {
                        buf: bx,
                        dims: dims.clone(),
                    },
                ),
                ("out".into(), Arg::Buffer { buf: out, dims }),
            ],
            consts: vec![],
            requires: vec![],
            writes: vec![out],
        });
        Ok(())
    }
}
