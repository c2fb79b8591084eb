//! Layer and RMS norms: whether the std.nn row kernel fits, and the generated
//! kernel (one program per row looping over it) when it does not.

use super::{next_pow2, KernelBuilder, LoopBody};
use crate::check::dims::Dim;
use crate::check::DType;
use crate::ir::graph::{NodeId, NodeKind};
use crate::ir::schedule::{
    zero_of, Arg, BufId, KernelRef, Launch, Lower, ScalarExpr, R, ROW_BLOCK,
};
use crate::ir::tile::{
    self, Access, BinaryOp, Constant, Kernel, Op, OpKind, ParamKind, Region, Type, UnaryOp, Value,
};

impl Lower<'_> {
    /// Whether a norm can run as its std.nn row kernel: f32 input, result and
    /// weights in f32 buffers, the weights it takes present, and a row that is not
    /// known to exceed the kernel's 1024.
    pub(in crate::ir::schedule) fn norm_fits_std(&self, n: NodeId) -> bool {
        let g = self.g;
        let (x, ws): (NodeId, Vec<Option<NodeId>>) = match g.node(n).kind {
            NodeKind::LayerNorm {
                x, weight, bias, ..
            } => (x, vec![weight, bias]),
            NodeKind::RmsNorm { x, weight, .. } => (x, vec![weight]),
            _ => return false,
        };
        let f32_buf = |v: NodeId| {
            g.ty(v).dtype() == Some(DType::F32)
                && self
                    .buf_of
                    .get(&v)
                    .is_some_and(|b| self.buffers[b.0 as usize].dtype == DType::F32)
        };
        let last = g.ty(x).dims().last().cloned();
        g.ty(n).dtype() == Some(DType::F32)
            && f32_buf(x)
            && ws.iter().all(|w| w.is_some_and(f32_buf))
            && ws.iter().flatten().all(|w| g.ty(*w).dims().len() == 1)
            && last.is_some_and(|c| c.as_const().is_none_or(|c| c <= ROW_BLOCK))
    }

    /// A generated layer norm or RMS norm over the last axis, any float dtype,
    /// any row length, weights optional: one program per row loops over the row
    /// in chunks (layer norm: mean, then the variance of the in-bounds lanes,
    /// then normalise; RMS norm: the mean square, then normalise), in f32.
    pub(in crate::ir::schedule) fn norm_generated(&mut self, n: NodeId, out: BufId) -> R<()> {
        let g = self.g;
        let (x, weight, bias, eps, layer) = match g.node(n).kind {
            NodeKind::LayerNorm {
                x,
                weight,
                bias,
                eps,
            } => (x, weight, bias, eps, true),
            NodeKind::RmsNorm { x, weight, eps } => (x, weight, None, eps, false),
            _ => unreachable!("a norm"),
        };
        let xd = g.ty(x).dims().to_vec();
        let (r, c) = self.rows_cols(&xd, n)?;
        for w in [weight, bias].into_iter().flatten() {
            if g.ty(w).dims().len() != 1 {
                return Err(self.unsupported(
                    w,
                    format!(
                        "a norm weight of shape `{}` (a vector over the last axis is)",
                        g.ty(w)
                    ),
                ));
            }
        }
        let bx = self.buf(x, n)?;
        let bdt = self.buffers[bx.0 as usize].dtype;
        let odt = self.buffers[out.0 as usize].dtype;
        let xdt = g.ty(x).dtype().unwrap_or(bdt);
        let ndt = g.ty(n).dtype().unwrap_or(odt);
        let f = DType::F32;
        let bk = c.as_const().map(|c| next_pow2(c).min(1024)).unwrap_or(1024);
        let bk32 = bk as u32;
        let dim_of = |d: &Dim, name: &str| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name.to_string()),
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![tile::Param {
                name: "x0".into(),
                kind: ParamKind::Tensor {
                    dims: vec![dim_of(&r, "R"), dim_of(&c, "C")],
                    dtype: bdt,
                },
            }],
            span: g.node(n).span,
        };
        let mut args = vec![(
            "x0".to_string(),
            Arg::Buffer {
                buf: bx,
                dims: vec![r.clone(), c.clone()],
            },
        )];
        let mut vec_params = Vec::new();
        for (name, w) in [("weight", weight), ("bias", bias)] {
            let Some(w) = w else { continue };
            let bw = self.buf(w, n)?;
            let wdt = self.buffers[bw.0 as usize].dtype;
            vec_params.push((kb.params.len(), wdt, g.ty(w).dtype().unwrap_or(wdt)));
            kb.params.push(tile::Param {
                name: name.into(),
                kind: ParamKind::Tensor {
                    dims: vec![dim_of(&c, "C")],
                    dtype: wdt,
                },
            });
            args.push((
                name.to_string(),
                Arg::Buffer {
                    buf: bw,
                    dims: vec![c.clone()],
                },
            ));
        }
        let out_idx = kb.params.len();
        kb.params.push(tile::Param {
            name: "out".into(),
            kind: ParamKind::Tensor {
                dims: vec![dim_of(&r, "R"), dim_of(&c, "C")],
                dtype: odt,
            },
        });
        args.push((
            "out".to_string(),
            Arg::Buffer {
                buf: out,
                dims: vec![r.clone(), c.clone()],
            },
        ));
        let eps_idx = kb.params.len();
        kb.params.push(tile::Param {
            name: "eps".into(),
            kind: ParamKind::Scalar(f),
        });
        args.push((
            "eps".to_string(),
            Arg::Scalar(match eps {
                Some(e) => self.scalar_as(e, Some(f))?,
                None => ScalarExpr::Const(Constant::Float(if layer { 1e-5 } else { 1e-6 })),
            }),
        ));
        let row = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let lo = kb.cnst(Constant::Int(0), DType::I32);
        let hi = match c.as_const() {
            Some(cc) => kb.cnst(Constant::Int(cc), DType::I32),
            None => kb.emit(
                OpKind::TensorDim { param: 0, axis: 1 },
                Type::Scalar(DType::I32),
            ),
        };
        let step = kb.cnst(Constant::Int(bk), DType::I32);
        let count = kb.cast(hi, f);
        let eps_v = kb.emit(OpKind::ScalarParam(eps_idx), Type::Scalar(f));
        let tile1 = [bk32];
        // One loop over the row: `body(kb, iv, x chunk in f32, carried)`.
        let looped = |kb: &mut KernelBuilder, init: Vec<Value>, body: &mut LoopBody<'_>| {
            let iv = kb.fresh(Type::Scalar(DType::I32));
            let carried: Vec<Value> = init
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
                        Access::Point(row),
                        Access::Range {
                            start: iv,
                            len: bk32,
                        },
                    ],
                    mask: None,
                    other: zero_of(bdt),
                },
                KernelBuilder::tile_ty(&tile1, bdt),
            );
            let v = kb.cast(ld, xdt);
            let v = kb.cast(v, f);
            let y = body(kb, iv, v, &carried);
            kb.ops.push(Op {
                results: vec![],
                kind: OpKind::Yield(y),
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
            region_args.extend(carried);
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
        let reduce_sum = |kb: &mut KernelBuilder, v: Value| {
            kb.emit(
                OpKind::Reduce {
                    op: tile::ReduceOp::Sum,
                    x: v,
                    axis: 0,
                    keepdims: false,
                },
                Type::Scalar(f),
            )
        };
        let zero = kb.cnst(Constant::Float(0.0), f);
        // Layer norm: the mean first (out-of-bounds lanes read 0 and add nothing).
        let mean = if layer {
            let s = looped(&mut kb, vec![zero], &mut |kb, _, v, c| {
                let t = reduce_sum(kb, v);
                vec![kb.binary(BinaryOp::Add, c[0], t)]
            })[0];
            Some(kb.binary(BinaryOp::Div, s, count))
        } else {
            None
        };
        // The mean square of `x - mean` over the in-bounds lanes.
        let ss = looped(&mut kb, vec![zero], &mut |kb, iv, v, c| {
            let d = match mean {
                Some(m) => {
                    let mb = kb.splat(m, &tile1);
                    let d = kb.binary(BinaryOp::Sub, v, mb);
                    let idx = kb.emit(
                        OpKind::Arange {
                            start: iv,
                            len: bk32,
                        },
                        KernelBuilder::tile_ty(&tile1, DType::I32),
                    );
                    let cb = kb.splat(hi, &tile1);
                    let inb = kb.binary(BinaryOp::Lt, idx, cb);
                    let z = kb.splat(zero, &tile1);
                    kb.emit(
                        OpKind::Select {
                            cond: inb,
                            a: d,
                            b: z,
                        },
                        KernelBuilder::tile_ty(&tile1, f),
                    )
                }
                None => v,
            };
            let sq = kb.binary(BinaryOp::Mul, d, d);
            let t = reduce_sum(kb, sq);
            vec![kb.binary(BinaryOp::Add, c[0], t)]
        })[0];
        let ms = kb.binary(BinaryOp::Div, ss, count);
        let ms = kb.binary(BinaryOp::Add, ms, eps_v);
        let rstd = kb.unary(UnaryOp::Rsqrt, ms);
        looped(&mut kb, vec![], &mut |kb, iv, v, _| {
            let mut y = match mean {
                Some(m) => {
                    let mb = kb.splat(m, &tile1);
                    kb.binary(BinaryOp::Sub, v, mb)
                }
                None => v,
            };
            let rb = kb.splat(rstd, &tile1);
            y = kb.binary(BinaryOp::Mul, y, rb);
            for (i, &(p, wdt, wnode)) in vec_params.iter().enumerate() {
                let w = kb.emit(
                    OpKind::Load {
                        tensor: p,
                        access: vec![Access::Range {
                            start: iv,
                            len: bk32,
                        }],
                        mask: None,
                        other: zero_of(wdt),
                    },
                    KernelBuilder::tile_ty(&tile1, wdt),
                );
                let w = kb.cast(w, wnode);
                let w = kb.cast(w, f);
                let is_bias = weight.is_none() || i == 1;
                y = kb.binary(
                    if is_bias {
                        BinaryOp::Add
                    } else {
                        BinaryOp::Mul
                    },
                    y,
                    w,
                );
            }
            let y = kb.cast(y, ndt);
            let y = kb.cast(y, odt);
            kb.ops.push(Op {
                results: vec![],
                kind: OpKind::Store {
                    tensor: out_idx,
                    access: vec![
                        Access::Point(row),
                        Access::Range {
                            start: iv,
                            len: bk32,
                        },
                    ],
                    value: y,
                    mask: None,
                },
                span: kb.span,
            });
            vec![]
        });
        let name = format!(
            "{}_{}{}",
            g.name,
            if layer { "layer_norm" } else { "rms_norm" },
            self.kernels.len()
        );
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
            grid: Some(vec![ScalarExpr::Index(r)]),
            args,
            consts: vec![],
            requires: vec![],
            writes: vec![out],
        });
        Ok(())
    }
}
