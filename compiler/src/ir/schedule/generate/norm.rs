//! Layer and RMS norms: whether the std.nn row kernel fits, and the generated
//! kernel when it does not: the row in one register tile where it fits, else
//! two passes over chunks (per-lane statistics, then the normalised values).

use super::{
    chunk_loop, long_plan, next_pow2, row_warps, ChunkLoad, KernelBuilder, LoopBody, LONG_WARPS,
    ROW_TILE,
};
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
    /// any row length, weights optional, one program per row, in f32. A known
    /// row of at most `ROW_TILE` is one register tile, read once, its weights
    /// loaded up front: layer norm takes the mean, then the variance of
    /// `x - mean` over the in-bounds lanes (two-pass, as exact as the CPU's);
    /// RMS norm the mean square. A longer row is walked twice in chunks: each
    /// lane keeps its own statistics (layer norm: Welford's running mean and
    /// M2 with its count, merged across lanes after the loop by Chan's rule;
    /// RMS norm: the sum of squares), then the normalised values are written.
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
        let whole = c
            .as_const()
            .map(|cc| next_pow2(cc.max(1)))
            .filter(|&cp| cp <= ROW_TILE);
        // The tiles the statistics loop of a long row carries (Welford's three, or the sum of squares).
        let carried = if layer { 3 } else { 1 };
        let (bk, num_warps) = match whole {
            Some(cp) => (cp, row_warps(cp)),
            None => (long_plan(carried).0, LONG_WARPS),
        };
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
        let zero = kb.cnst(Constant::Float(0.0), f);
        let one = kb.cnst(Constant::Float(1.0), f);
        let inv_n = kb.binary(BinaryOp::Div, one, count);
        // The row's chunk at `iv` as stored (out-of-bounds lanes read 0), and in f32.
        let load_raw = |kb: &mut KernelBuilder, iv: Value| {
            kb.emit(
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
            )
        };
        let widen = |kb: &mut KernelBuilder, ld: Value| {
            let v = kb.cast(ld, xdt);
            kb.cast(v, f)
        };
        // The weight and bias chunks at `iv` in f32, each with whether it is the bias.
        let load_w = |kb: &mut KernelBuilder, iv: Value| -> Vec<(Value, bool)> {
            vec_params
                .iter()
                .enumerate()
                .map(|(i, &(p, wdt, wnode))| {
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
                    (kb.cast(w, f), weight.is_none() || i == 1)
                })
                .collect()
        };
        // `(x - mean) * rstd * weight + bias` (RMS norm: `x * rstd * weight`), stored at `iv`.
        let normalise =
            |kb: &mut KernelBuilder, iv: Value, d: Value, rstd: Value, ws: &[(Value, bool)]| {
                let rb = kb.splat(rstd, &tile1);
                let mut y = kb.binary(BinaryOp::Mul, d, rb);
                for &(w, is_bias) in ws {
                    let op = if is_bias {
                        BinaryOp::Add
                    } else {
                        BinaryOp::Mul
                    };
                    y = kb.binary(op, y, w);
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
            };
        // Whether each lane of the chunk at `iv` is inside the row.
        let in_row = |kb: &mut KernelBuilder, iv: Value| {
            let idx = kb.emit(
                OpKind::Arange {
                    start: iv,
                    len: bk32,
                },
                KernelBuilder::tile_ty(&tile1, DType::I32),
            );
            let cb = kb.splat(hi, &tile1);
            kb.binary(BinaryOp::Lt, idx, cb)
        };
        let select = |kb: &mut KernelBuilder, cond: Value, a: Value, b: Value| {
            kb.emit(
                OpKind::Select { cond, a, b },
                KernelBuilder::tile_ty(&tile1, f),
            )
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
        let rstd_of = |kb: &mut KernelBuilder, ss: Value| {
            let ms = kb.binary(BinaryOp::Mul, ss, inv_n);
            let ms = kb.binary(BinaryOp::Add, ms, eps_v);
            kb.unary(UnaryOp::Rsqrt, ms)
        };
        if let Some(cp) = whole {
            let raw = load_raw(&mut kb, lo);
            let v = widen(&mut kb, raw);
            let ws = load_w(&mut kb, lo);
            let d = if layer {
                let s = reduce_sum(&mut kb, v);
                let mean = kb.binary(BinaryOp::Mul, s, inv_n);
                let mb = kb.splat(mean, &tile1);
                let d = kb.binary(BinaryOp::Sub, v, mb);
                if c.as_const() == Some(cp) {
                    d
                } else {
                    let inb = in_row(&mut kb, lo);
                    let z = kb.splat(zero, &tile1);
                    select(&mut kb, inb, d, z)
                }
            } else {
                v
            };
            let sq = kb.binary(BinaryOp::Mul, d, d);
            let ss = reduce_sum(&mut kb, sq);
            let rstd = rstd_of(&mut kb, ss);
            normalise(&mut kb, lo, d, rstd, &ws);
        } else {
            let bounds = (lo, hi, step);
            let looped = |kb: &mut KernelBuilder, init: Vec<Value>, body: &mut LoopBody<'_>| {
                let chunks = (
                    &load_raw as &ChunkLoad,
                    &widen as &ChunkLoad,
                    long_plan(carried).1,
                );
                chunk_loop(kb, bounds, chunks, init, body)
            };
            let z = kb.splat(zero, &tile1);
            // Every chunk wholly inside the row: no lane to mask.
            let ragged = c.as_const().is_none_or(|cc| cc % bk != 0);
            let (mean, ss) = if layer {
                // Welford per lane. A lane inside the row at a chunk was inside
                // at every earlier one, so its count there is the chunk's
                // number: one scalar reciprocal a chunk serves every lane.
                let st = looped(&mut kb, vec![z, z, z, zero], &mut |kb, iv, v, c| {
                    let (mean, m2, cnt, k) = (c[0], c[1], c[2], c[3]);
                    let k1 = kb.binary(BinaryOp::Add, k, one);
                    let inv = kb.binary(BinaryOp::Div, one, k1);
                    let dv = kb.binary(BinaryOp::Sub, v, mean);
                    let onet = kb.splat(one, &tile1);
                    let (delta, add) = if ragged {
                        let inb = in_row(kb, iv);
                        let zt = kb.splat(zero, &tile1);
                        (select(kb, inb, dv, zt), select(kb, inb, onet, zt))
                    } else {
                        (dv, onet)
                    };
                    let ib = kb.splat(inv, &tile1);
                    let step_ = kb.binary(BinaryOp::Mul, delta, ib);
                    let mean2 = kb.binary(BinaryOp::Add, mean, step_);
                    let d2 = kb.binary(BinaryOp::Sub, v, mean2);
                    let p = kb.binary(BinaryOp::Mul, delta, d2);
                    let m22 = kb.binary(BinaryOp::Add, m2, p);
                    let cnt2 = kb.binary(BinaryOp::Add, cnt, add);
                    vec![mean2, m22, cnt2, k1]
                });
                // Chan: mean = sum(n_i mean_i) / n; M2 = sum(M2_i + n_i (mean_i - mean)^2).
                let (lm, lm2, lc) = (st[0], st[1], st[2]);
                let wm = kb.binary(BinaryOp::Mul, lc, lm);
                let s = reduce_sum(&mut kb, wm);
                let mean = kb.binary(BinaryOp::Mul, s, inv_n);
                let mb = kb.splat(mean, &tile1);
                let dm = kb.binary(BinaryOp::Sub, lm, mb);
                let dm2 = kb.binary(BinaryOp::Mul, dm, dm);
                let cdm = kb.binary(BinaryOp::Mul, lc, dm2);
                let tot = kb.binary(BinaryOp::Add, lm2, cdm);
                (Some(mean), reduce_sum(&mut kb, tot))
            } else {
                let sq = looped(&mut kb, vec![z], &mut |kb, _, v, c| {
                    let p = kb.binary(BinaryOp::Mul, v, v);
                    vec![kb.binary(BinaryOp::Add, c[0], p)]
                })[0];
                (None, reduce_sum(&mut kb, sq))
            };
            let rstd = rstd_of(&mut kb, ss);
            looped(&mut kb, vec![], &mut |kb, iv, v, _| {
                let d = match mean {
                    Some(m) => {
                        let mb = kb.splat(m, &tile1);
                        kb.binary(BinaryOp::Sub, v, mb)
                    }
                    None => v,
                };
                let ws = load_w(kb, iv);
                normalise(kb, iv, d, rstd, &ws);
                vec![]
            });
        }
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
            num_warps,
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
