//! Layer and RMS norms: whether the std.nn row kernel fits, and the generated
//! kernel when it does not: the row in one register tile where it fits, else
//! two passes over chunks (per-lane statistics, then the normalised values).

use super::{
    chunk_loop, long_plan, next_pow2, row_warps, split_len, split_passes, ChunkLoad, KernelBuilder,
    LoopBody, LONG_WARPS, PIECE, ROW_TILE,
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
    /// piece of 16 elements (a row of known length that 16 divides, see
    /// `PIECE`), else each lane, keeps its own statistics (layer norm: a
    /// running mean and M2, per lane by Welford's rule with its count, per
    /// piece by Chan's; RMS norm: the sum of squares), merged after the loop
    /// by Chan's rule, then the normalised values are written.
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
        // A long row split into pieces: viewed as `[K / PIECE, PIECE]`.
        let split = whole.is_none().then(|| split_len(&c)).flatten();
        let (bk, num_warps) = match (whole, split) {
            (Some(cp), _) => (cp, row_warps(cp)),
            (None, Some(_)) => (split_passes(0)[0].0 as i64, LONG_WARPS),
            (None, None) => (long_plan(carried, bdt).0, LONG_WARPS),
        };
        let bk32 = bk as u32;
        // The chunk's tile, and the axes a row (or a weight vector) is viewed with.
        let tile1: Vec<u32> = match split {
            Some(_) => vec![bk32, PIECE as u32],
            None => vec![bk32],
        };
        let row_dims = |r: &Dim| -> Vec<Dim> {
            match split {
                Some(kc) => vec![r.clone(), Dim::constant(kc), Dim::constant(PIECE)],
                None => vec![r.clone(), c.clone()],
            }
        };
        let w_dims: Vec<Dim> = row_dims(&Dim::constant(1))[1..].to_vec();
        // A run-time dim is named `R` (rows) or `C` (the row's length).
        let tile_dims = |ds: &[Dim]| -> Vec<tile::Dim> {
            ds.iter()
                .map(|d| match d.as_const() {
                    Some(v) => tile::Dim::Static(v as u64),
                    None => tile::Dim::Dynamic(if *d == r { "R" } else { "C" }.to_string()),
                })
                .collect()
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![tile::Param {
                name: "x0".into(),
                kind: ParamKind::Tensor {
                    dims: tile_dims(&row_dims(&r)),
                    dtype: bdt,
                },
            }],
            span: g.node(n).span,
        };
        let mut args = vec![(
            "x0".to_string(),
            Arg::Buffer {
                buf: bx,
                dims: row_dims(&r),
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
                    dims: tile_dims(&w_dims),
                    dtype: wdt,
                },
            });
            args.push((
                name.to_string(),
                Arg::Buffer {
                    buf: bw,
                    dims: w_dims.clone(),
                },
            ));
        }
        let out_idx = kb.params.len();
        kb.params.push(tile::Param {
            name: "out".into(),
            kind: ParamKind::Tensor {
                dims: tile_dims(&row_dims(&r)),
                dtype: odt,
            },
        });
        args.push((
            "out".to_string(),
            Arg::Buffer {
                buf: out,
                dims: row_dims(&r),
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
        // A split row's loop walks its pieces.
        let hi = match split {
            Some(kc) => kb.cnst(Constant::Int(kc), DType::I32),
            None => hi,
        };
        let eps_v = kb.emit(OpKind::ScalarParam(eps_idx), Type::Scalar(f));
        let i0 = split.map(|_| kb.cnst(Constant::Int(0), DType::I32));
        // The chunk at `iv` of a row (`Some(row)`) or of a weight vector.
        let chunk_at = |row: Option<Value>, iv: Value, rows: u32| -> Vec<Access> {
            let mut a: Vec<Access> = row.map(Access::Point).into_iter().collect();
            a.push(Access::Range {
                start: iv,
                len: rows,
            });
            if let Some(i0) = i0 {
                a.push(Access::Range {
                    start: i0,
                    len: PIECE as u32,
                });
            }
            a
        };
        let zero = kb.cnst(Constant::Float(0.0), f);
        let one = kb.cnst(Constant::Float(1.0), f);
        let inv_n = kb.binary(BinaryOp::Div, one, count);
        // The mean: `sum * (1 / count)` where the count is a power of two
        // known here (the product is exact), else `sum / count`, one
        // correctly rounded division a row. A GPU may contract an inexact
        // product into `x - mean` as one FMA that keeps its error: the
        // deviation of a row of equal values (0 on the CPU, +-1 normalised
        // on the GPU for bf16 rows of -2^64). With the division an exact sum
        // gives the exact mean. Not always: ptxas's called slow path of
        // `div.rn` adds 16 registers where a whole row is live (48 -> 64 for
        // 4096-wide bf16 rows), and the product cannot go wrong there.
        let exact_inv = c
            .as_const()
            .is_some_and(|n| n > 0 && (n as u64).is_power_of_two());
        let mean_of = |kb: &mut KernelBuilder, s: Value| {
            if exact_inv {
                kb.binary(BinaryOp::Mul, s, inv_n)
            } else {
                kb.binary(BinaryOp::Div, s, count)
            }
        };
        // The shape of a chunk of `rows` (lanes, or pieces of a split row).
        let shape_of = |rows: u32| -> Vec<u32> {
            let mut t = tile1.clone();
            t[0] = rows;
            t
        };
        // The row's chunk at `iv` as stored (out-of-bounds lanes read 0), and in f32.
        let load_rows = |kb: &mut KernelBuilder, iv: Value, rows: u32| {
            kb.emit(
                OpKind::Load {
                    tensor: 0,
                    access: chunk_at(Some(row), iv, rows),
                    mask: None,
                    other: zero_of(bdt),
                },
                KernelBuilder::tile_ty(&shape_of(rows), bdt),
            )
        };
        let load_raw = |kb: &mut KernelBuilder, iv: Value| load_rows(kb, iv, bk32);
        let widen = |kb: &mut KernelBuilder, ld: Value| {
            let v = kb.cast(ld, xdt);
            kb.cast(v, f)
        };
        // The weight and bias chunks at `iv` in f32, each with whether it is the bias.
        let load_w = |kb: &mut KernelBuilder, iv: Value, rows: u32| -> Vec<(Value, bool)> {
            vec_params
                .iter()
                .enumerate()
                .map(|(i, &(p, wdt, wnode))| {
                    let w = kb.emit(
                        OpKind::Load {
                            tensor: p,
                            access: chunk_at(None, iv, rows),
                            mask: None,
                            other: zero_of(wdt),
                        },
                        KernelBuilder::tile_ty(&shape_of(rows), wdt),
                    );
                    let w = kb.cast(w, wnode);
                    (kb.cast(w, f), weight.is_none() || i == 1)
                })
                .collect()
        };
        // `(x - mean) * rstd * weight + bias` (RMS norm: `x * rstd * weight`), stored at `iv`.
        let normalise =
            |kb: &mut KernelBuilder, iv: Value, d: Value, rstd: Value, ws: &[(Value, bool)]| {
                let shape = kb.ty(d).shape().to_vec();
                let rows = shape[0];
                let rb = kb.splat(rstd, &shape);
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
                        access: chunk_at(Some(row), iv, rows),
                        value: y,
                        mask: None,
                    },
                    span: kb.span,
                });
            };
        // Whether each lane (each piece of a split row) of the chunk at `iv` is inside the row.
        let in_row = |kb: &mut KernelBuilder, iv: Value, rows: u32| {
            let idx = kb.emit(
                OpKind::Arange {
                    start: iv,
                    len: rows,
                },
                KernelBuilder::tile_ty(&[rows], DType::I32),
            );
            let cb = kb.splat(hi, &[rows]);
            kb.binary(BinaryOp::Lt, idx, cb)
        };
        let select = |kb: &mut KernelBuilder, cond: Value, a: Value, b: Value| {
            let t = kb.ty(a).clone();
            kb.emit(OpKind::Select { cond, a, b }, t)
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
        // Chan's rule over partial statistics (per lane or per piece: their
        // means `lm`, M2s `lm2` and counts `lc`): the row's mean
        // sum(n_i mean_i) / n and its M2 sum(M2_i + n_i (mean_i - mean)^2).
        let chan = |kb: &mut KernelBuilder, lm: Value, lm2: Value, lc: Value| {
            let shape = kb.ty(lm).shape().to_vec();
            let wm = kb.binary(BinaryOp::Mul, lc, lm);
            let s = reduce_sum(kb, wm);
            let mean = mean_of(kb, s);
            let mb = kb.splat(mean, &shape);
            let dm = kb.binary(BinaryOp::Sub, lm, mb);
            // n_i dm dm, not n_i dm^2: an empty lane or piece (n_i = 0,
            // mean_i = 0) has dm = -mean, whose square overflows f32 from
            // 2^64 on (inf * 0 = NaN for rows of -2^64).
            let cdm = kb.binary(BinaryOp::Mul, lc, dm);
            let cdm = kb.binary(BinaryOp::Mul, cdm, dm);
            let tot = kb.binary(BinaryOp::Add, lm2, cdm);
            (Some(mean), reduce_sum(kb, tot))
        };
        let rstd_of = |kb: &mut KernelBuilder, ss: Value| {
            let ms = kb.binary(BinaryOp::Mul, ss, inv_n);
            let ms = kb.binary(BinaryOp::Add, ms, eps_v);
            kb.unary(UnaryOp::Rsqrt, ms)
        };
        if let Some(cp) = whole {
            let raw = load_raw(&mut kb, lo);
            let v = widen(&mut kb, raw);
            let ws = load_w(&mut kb, lo, bk32);
            let d = if layer {
                let s = reduce_sum(&mut kb, v);
                let mean = mean_of(&mut kb, s);
                let mb = kb.splat(mean, &tile1);
                let d = kb.binary(BinaryOp::Sub, v, mb);
                if c.as_const() == Some(cp) {
                    d
                } else {
                    let inb = in_row(&mut kb, lo, bk32);
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
        } else if let Some(kc) = split {
            // Statistics per piece: its sum of squares (RMS norm), or its
            // mean and M2 merged into the piece's running ones by Chan's rule
            // (layer norm). A piece is wholly inside the row or wholly out;
            // one inside at a chunk was inside at every earlier one, so after
            // `k` chunks it has seen `PIECE k` elements: one scalar weight a
            // chunk serves every piece.
            let [(t1, pf1), (t2, pf2)] = split_passes(vec_params.len());
            let piece = [t1];
            let step1 = kb.cnst(Constant::Int(t1 as i64), DType::I32);
            let step2 = kb.cnst(Constant::Int(t2 as i64), DType::I32);
            let load1 = |kb: &mut KernelBuilder, iv: Value| load_rows(kb, iv, t1);
            let load2 = |kb: &mut KernelBuilder, iv: Value| load_rows(kb, iv, t2);
            let bounds = (lo, hi, step1);
            let chunks = (&load1 as &ChunkLoad, &widen as &ChunkLoad, pf1);
            let ragged = kc % t1 as i64 != 0;
            let z = kb.splat(zero, &piece);
            let pieces = |kb: &mut KernelBuilder, v: Value| {
                kb.emit(
                    OpKind::Reduce {
                        op: tile::ReduceOp::Sum,
                        x: v,
                        axis: 1,
                        keepdims: false,
                    },
                    KernelBuilder::tile_ty(&piece, f),
                )
            };
            let (mean, ss) = if layer {
                let inv_piece = kb.cnst(Constant::Float(1.0 / PIECE as f64), f);
                let n_piece = kb.cnst(Constant::Float(PIECE as f64), f);
                let init = vec![z, z, zero];
                let st = chunk_loop(&mut kb, bounds, chunks, init, &mut |kb, iv, v, c| {
                    let (mean, m2, k) = (c[0], c[1], c[2]);
                    let ip = kb.splat(inv_piece, &piece);
                    let s = pieces(kb, v);
                    let cmean = kb.binary(BinaryOp::Mul, s, ip);
                    let e = kb.emit(
                        OpKind::ExpandDims { x: cmean, axis: 1 },
                        KernelBuilder::tile_ty(&[t1, 1], f),
                    );
                    let cb = kb.emit(
                        OpKind::Broadcast {
                            x: e,
                            shape: shape_of(t1),
                        },
                        KernelBuilder::tile_ty(&shape_of(t1), f),
                    );
                    let d = kb.binary(BinaryOp::Sub, v, cb);
                    let dd = kb.binary(BinaryOp::Mul, d, d);
                    let cm2 = pieces(kb, dd);
                    // n_a = PIECE k, n_b = PIECE: mean += delta / (k + 1),
                    // M2 += M2_b + delta^2 PIECE k / (k + 1).
                    let k1 = kb.binary(BinaryOp::Add, k, one);
                    let fr = kb.binary(BinaryOp::Div, one, k1);
                    let nk = kb.binary(BinaryOp::Mul, n_piece, k);
                    let g = kb.binary(BinaryOp::Mul, nk, fr);
                    let delta = kb.binary(BinaryOp::Sub, cmean, mean);
                    let fb = kb.splat(fr, &piece);
                    let step_ = kb.binary(BinaryOp::Mul, delta, fb);
                    let mean2 = kb.binary(BinaryOp::Add, mean, step_);
                    // delta (delta g), not delta^2 g: at the first chunk g
                    // is 0 and delta the chunk's mean, whose square overflows
                    // f32 from 2^64 on (inf * 0 = NaN for a row of -2^64).
                    let gb = kb.splat(g, &piece);
                    let dg = kb.binary(BinaryOp::Mul, delta, gb);
                    let d2g = kb.binary(BinaryOp::Mul, delta, dg);
                    let m2a = kb.binary(BinaryOp::Add, m2, cm2);
                    let m22 = kb.binary(BinaryOp::Add, m2a, d2g);
                    let (mean2, m22) = if ragged {
                        let inb = in_row(kb, iv, t1);
                        (select(kb, inb, mean2, mean), select(kb, inb, m22, m2))
                    } else {
                        (mean2, m22)
                    };
                    vec![mean2, m22, k1]
                });
                // Each piece's count: PIECE a chunk, less one chunk for a
                // piece past the row's end in the last.
                let kt = kb.splat(st[2], &piece);
                let chunks_in = if ragged {
                    let last = kb.cnst(Constant::Int(kc / t1 as i64 * t1 as i64), DType::I32);
                    let inb = in_row(&mut kb, last, t1);
                    let onet = kb.splat(one, &piece);
                    let out = select(&mut kb, inb, z, onet);
                    kb.binary(BinaryOp::Sub, kt, out)
                } else {
                    kt
                };
                let np = kb.splat(n_piece, &piece);
                let lc = kb.binary(BinaryOp::Mul, chunks_in, np);
                chan(&mut kb, st[0], st[1], lc)
            } else {
                let sq = chunk_loop(&mut kb, bounds, chunks, vec![z], &mut |kb, _, v, c| {
                    let p = kb.binary(BinaryOp::Mul, v, v);
                    let s = pieces(kb, p);
                    vec![kb.binary(BinaryOp::Add, c[0], s)]
                })[0];
                (None, reduce_sum(&mut kb, sq))
            };
            let rstd = rstd_of(&mut kb, ss);
            let bounds = (lo, hi, step2);
            let chunks = (&load2 as &ChunkLoad, &widen as &ChunkLoad, pf2);
            chunk_loop(&mut kb, bounds, chunks, vec![], &mut |kb, iv, v, _| {
                let d = match mean {
                    Some(m) => {
                        let mb = kb.splat(m, &shape_of(t2));
                        kb.binary(BinaryOp::Sub, v, mb)
                    }
                    None => v,
                };
                let ws = load_w(kb, iv, t2);
                normalise(kb, iv, d, rstd, &ws);
                vec![]
            });
        } else {
            let bounds = (lo, hi, step);
            let looped = |kb: &mut KernelBuilder, init: Vec<Value>, body: &mut LoopBody<'_>| {
                let chunks = (
                    &load_raw as &ChunkLoad,
                    &widen as &ChunkLoad,
                    long_plan(carried, bdt).1,
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
                        let inb = in_row(kb, iv, bk32);
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
                chan(&mut kb, st[0], st[1], st[2])
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
                let ws = load_w(kb, iv, bk32);
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
