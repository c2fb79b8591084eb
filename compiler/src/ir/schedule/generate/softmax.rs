//! Generated softmax over any axis and float dtype: the axis in one register
//! tile where it fits (one read of the input), else two passes over chunks
//! (an online max and sum per lane, then the normalised values).

use super::{
    chunk_loop, long_plan, neutral, next_pow2, row_warps, split_len, split_passes, ChunkLoad,
    KernelBuilder, LONG_WARPS, PIECE, ROW_TILE,
};
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
    /// of `C`. Where `K` is known and the `[K, C]` block fits `ROW_TILE`, it is
    /// loaded once and stays in registers: max, `e = exp(x - max)`, sum,
    /// `e * (1 / sum)`. Otherwise a first loop over `K` keeps running
    /// statistics, a max `m` and a sum `l` rescaled by `exp(m - m')` when the
    /// max grows (as flash attention does), combined after the loop, and a
    /// second loop writes the normalised values: per piece of 16 elements
    /// where `K` is a last axis of known length that 16 divides (see
    /// `PIECE`), else per lane. f32 arithmetic; out-of-bounds
    /// lanes read -inf, which adds nothing and is never stored. (`e * (1 /
    /// sum)`: within 2 ulp of f32 of `e / sum`, and one division a column
    /// instead of one an element.)
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
        let whole = k
            .as_const()
            .map(|kc| next_pow2(kc.max(1)))
            .filter(|&kp| kp * bc <= ROW_TILE);
        // A long last axis split into pieces: `x` viewed as `[R, K / PIECE, PIECE]`.
        let split = (whole.is_none() && b.as_const() == Some(1))
            .then(|| split_len(&k))
            .flatten();
        let (k, b, bc) = match split {
            Some(kc) => (Dim::constant(kc), Dim::constant(PIECE), PIECE),
            None => (k, b, bc),
        };
        let (bk, num_warps) = match (whole, split) {
            (Some(kp), _) => (kp, row_warps(kp * bc)),
            (None, Some(_)) => (split_passes(0)[0].0 as i64, LONG_WARPS),
            (None, None) => ((long_plan(2, bdt).0 / bc).max(1), LONG_WARPS),
        };
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
        // The `[bk, bc]` block at `iv` along K (of x or the output).
        let block_at = |iv: Value, rows: u32| {
            vec![
                Access::Point(pid0),
                Access::Range {
                    start: iv,
                    len: rows,
                },
                Access::Range {
                    start: c0,
                    len: bc32,
                },
            ]
        };
        // That block of x as stored, and in f32.
        let load_rows = |kb: &mut KernelBuilder, iv: Value, rows: u32| {
            kb.emit(
                OpKind::Load {
                    tensor: 0,
                    access: block_at(iv, rows),
                    mask: None,
                    other: neutral(ReduceKind::Max, bdt),
                },
                KernelBuilder::tile_ty(&[rows, bc32], bdt),
            )
        };
        let load_raw = |kb: &mut KernelBuilder, iv: Value| load_rows(kb, iv, bk32);
        let widen = |kb: &mut KernelBuilder, ld: Value| {
            let v = kb.cast(ld, xdt);
            kb.cast(v, f)
        };
        let store_y = |kb: &mut KernelBuilder, iv: Value, y: Value| {
            let rows = kb.ty(y).shape()[0];
            let y = kb.cast(y, ndt);
            let y = kb.cast(y, odt);
            kb.ops.push(Op {
                results: vec![],
                kind: OpKind::Store {
                    tensor: 1,
                    access: block_at(iv, rows),
                    value: y,
                    mask: None,
                },
                span: kb.span,
            });
        };
        let reduce = |kb: &mut KernelBuilder, op: tile::ReduceOp, x: Value| {
            kb.emit(
                OpKind::Reduce {
                    op,
                    x,
                    axis: 0,
                    keepdims: false,
                },
                KernelBuilder::tile_ty(&[bc32], f),
            )
        };
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
        let ninf = kb.emit(
            OpKind::Const(Constant::Float(f64::NEG_INFINITY)),
            Type::Scalar(f),
        );
        let zero = kb.cnst(Constant::Float(0.0), f);
        let one = kb.cnst(Constant::Float(1.0), f);
        // `1 / s` per column.
        let recip = |kb: &mut KernelBuilder, s: Value| {
            let o = kb.splat(one, &[bc32]);
            kb.binary(BinaryOp::Div, o, s)
        };
        // Reduces each thread's pieces of a split chunk (axis 1).
        let reduce1 = |kb: &mut KernelBuilder, op: tile::ReduceOp, x: Value| {
            let rows = kb.ty(x).shape()[0];
            kb.emit(
                OpKind::Reduce {
                    op,
                    x,
                    axis: 1,
                    keepdims: false,
                },
                KernelBuilder::tile_ty(&[rows], f),
            )
        };
        let bcast1 = |kb: &mut KernelBuilder, row: Value| {
            let rows = kb.ty(row).shape()[0];
            let e = kb.emit(
                OpKind::ExpandDims { x: row, axis: 1 },
                KernelBuilder::tile_ty(&[rows, 1], f),
            );
            kb.emit(
                OpKind::Broadcast {
                    x: e,
                    shape: vec![rows, bc32],
                },
                KernelBuilder::tile_ty(&[rows, bc32], f),
            )
        };
        let all = |kb: &mut KernelBuilder, op: tile::ReduceOp, x: Value| {
            kb.emit(
                OpKind::Reduce {
                    op,
                    x,
                    axis: 0,
                    keepdims: false,
                },
                Type::Scalar(f),
            )
        };
        if split.is_some() {
            // Per piece: its max `c`, the running max `m' = max(m, c)`, and
            // `l' = l exp(m - m') + sum(exp(x - m'))`: one exp an element (a
            // piece that has seen only -inf subtracts 0, keeping l = 0).
            let [(t1, pf1), (t2, pf2)] = split_passes(0);
            let piece = [t1];
            let m0 = kb.splat(ninf, &piece);
            let l0 = kb.splat(zero, &piece);
            let step1 = kb.cnst(Constant::Int(t1 as i64), DType::I32);
            let step2 = kb.cnst(Constant::Int(t2 as i64), DType::I32);
            let load1 = |kb: &mut KernelBuilder, iv: Value| load_rows(kb, iv, t1);
            let load2 = |kb: &mut KernelBuilder, iv: Value| load_rows(kb, iv, t2);
            let bounds = (lo, hi, step1);
            let chunks = (&load1 as &ChunkLoad, &widen as &ChunkLoad, pf1);
            let ml = chunk_loop(&mut kb, bounds, chunks, vec![m0, l0], &mut |kb, _, v, c| {
                let (m, l) = (c[0], c[1]);
                let cm = reduce1(kb, tile::ReduceOp::Max, v);
                let mn = kb.binary(BinaryOp::Max, m, cm);
                let ni = kb.splat(ninf, &piece);
                let empty = kb.binary(BinaryOp::Eq, mn, ni);
                let z = kb.splat(zero, &piece);
                let safe = kb.emit(
                    OpKind::Select {
                        cond: empty,
                        a: z,
                        b: mn,
                    },
                    KernelBuilder::tile_ty(&piece, f),
                );
                let sb = bcast1(kb, safe);
                let d = kb.binary(BinaryOp::Sub, v, sb);
                let p = kb.unary(UnaryOp::Exp, d);
                let s = reduce1(kb, tile::ReduceOp::Sum, p);
                let dm = kb.binary(BinaryOp::Sub, m, safe);
                let alpha = kb.unary(UnaryOp::Exp, dm);
                let la = kb.binary(BinaryOp::Mul, l, alpha);
                vec![mn, kb.binary(BinaryOp::Add, la, s)]
            });
            let mx = all(&mut kb, tile::ReduceOp::Max, ml[0]);
            let mxb = kb.splat(mx, &piece);
            let dm = kb.binary(BinaryOp::Sub, ml[0], mxb);
            let scale = kb.unary(UnaryOp::Exp, dm);
            let w = kb.binary(BinaryOp::Mul, ml[1], scale);
            let s = all(&mut kb, tile::ReduceOp::Sum, w);
            let inv = kb.binary(BinaryOp::Div, one, s);
            let tile = [t2, bc32];
            let bounds = (lo, hi, step2);
            let chunks = (&load2 as &ChunkLoad, &widen as &ChunkLoad, pf2);
            chunk_loop(&mut kb, bounds, chunks, vec![], &mut |kb, iv, v, _| {
                let mb = kb.splat(mx, &tile);
                let d = kb.binary(BinaryOp::Sub, v, mb);
                let e = kb.unary(UnaryOp::Exp, d);
                let ib = kb.splat(inv, &tile);
                let y = kb.binary(BinaryOp::Mul, e, ib);
                store_y(kb, iv, y);
                vec![]
            });
        } else if whole.is_some() {
            let raw = load_raw(&mut kb, lo);
            let v = widen(&mut kb, raw);
            let m = reduce(&mut kb, tile::ReduceOp::Max, v);
            let mb = bcast(&mut kb, m);
            let d = kb.binary(BinaryOp::Sub, v, mb);
            let e = kb.unary(UnaryOp::Exp, d);
            let s = reduce(&mut kb, tile::ReduceOp::Sum, e);
            let inv = recip(&mut kb, s);
            let ib = bcast(&mut kb, inv);
            let y = kb.binary(BinaryOp::Mul, e, ib);
            store_y(&mut kb, lo, y);
        } else {
            // Per lane, one exp an element: with e = exp(-|x - m|), the new
            // element either raises the max (l' = l e + 1) or not
            // (l' = l + e). The max starts at the lowest finite f32, so that
            // a lane that has seen only -inf adds exp(-inf) = 0 and no
            // exp(-inf + inf) arises.
            let lowest = kb.emit(
                OpKind::Const(Constant::Float(f32::MIN as f64)),
                Type::Scalar(f),
            );
            let m0 = kb.splat(lowest, &tile2);
            let l0 = kb.splat(zero, &tile2);
            let bounds = (lo, hi, step);
            let chunks = (
                &load_raw as &ChunkLoad,
                &widen as &ChunkLoad,
                long_plan(2, bdt).1,
            );
            let ml = chunk_loop(&mut kb, bounds, chunks, vec![m0, l0], &mut |kb, _, v, c| {
                let (m, l) = (c[0], c[1]);
                let mn = kb.binary(BinaryOp::Max, m, v);
                let d = kb.binary(BinaryOp::Sub, v, m);
                let a = kb.unary(UnaryOp::Abs, d);
                let na = kb.unary(UnaryOp::Neg, a);
                let e = kb.unary(UnaryOp::Exp, na);
                let gt = kb.binary(BinaryOp::Gt, v, m);
                let le = kb.binary(BinaryOp::Mul, l, e);
                let o = kb.splat(one, &tile2);
                let up = kb.binary(BinaryOp::Add, le, o);
                let keep = kb.binary(BinaryOp::Add, l, e);
                let l2 = kb.emit(
                    OpKind::Select {
                        cond: gt,
                        a: up,
                        b: keep,
                    },
                    KernelBuilder::tile_ty(&tile2, f),
                );
                vec![mn, l2]
            });
            let mx = reduce(&mut kb, tile::ReduceOp::Max, ml[0]);
            let mxb = bcast(&mut kb, mx);
            let dm = kb.binary(BinaryOp::Sub, ml[0], mxb);
            let scale = kb.unary(UnaryOp::Exp, dm);
            let w = kb.binary(BinaryOp::Mul, ml[1], scale);
            let s = reduce(&mut kb, tile::ReduceOp::Sum, w);
            let inv = recip(&mut kb, s);
            chunk_loop(&mut kb, bounds, chunks, vec![], &mut |kb, iv, v, _| {
                let mb = bcast(kb, mx);
                let d = kb.binary(BinaryOp::Sub, v, mb);
                let e = kb.unary(UnaryOp::Exp, d);
                let ib = bcast(kb, inv);
                let y = kb.binary(BinaryOp::Mul, e, ib);
                store_y(kb, iv, y);
                vec![]
            });
        }
        let name = format!("{}_softmax{}", g.name, self.kernels.len());
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
