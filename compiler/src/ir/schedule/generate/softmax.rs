//! Generated softmax over any axis and float dtype: the axis in one register
//! tile where it fits (one read of the input), else two passes over chunks
//! (an online max and sum per lane, then the normalised values).

use super::{
    chunk_loop, long_plan, neutral, next_pow2, row_warps, ChunkLoad, KernelBuilder, LONG_WARPS,
    ROW_TILE,
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
    /// `e * (1 / sum)`. Otherwise one loop over `K` keeps each lane's running
    /// max `m` and sum `l` (rescaled by `exp(m - m')` when the max grows, as
    /// flash attention does), combined across lanes after the loop, and a
    /// second loop writes the normalised values. f32 arithmetic; out-of-bounds
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
        let (bk, num_warps) = match whole {
            Some(kp) => (kp, row_warps(kp * bc)),
            None => ((long_plan(2).0 / bc).max(1), LONG_WARPS),
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
        let block_at = |iv: Value| {
            vec![
                Access::Point(pid0),
                Access::Range {
                    start: iv,
                    len: bk32,
                },
                Access::Range {
                    start: c0,
                    len: bc32,
                },
            ]
        };
        // That block of x as stored, and in f32.
        let load_raw = |kb: &mut KernelBuilder, iv: Value| {
            kb.emit(
                OpKind::Load {
                    tensor: 0,
                    access: block_at(iv),
                    mask: None,
                    other: neutral(ReduceKind::Max, bdt),
                },
                KernelBuilder::tile_ty(&tile2, bdt),
            )
        };
        let widen = |kb: &mut KernelBuilder, ld: Value| {
            let v = kb.cast(ld, xdt);
            kb.cast(v, f)
        };
        let store_y = |kb: &mut KernelBuilder, iv: Value, y: Value| {
            let y = kb.cast(y, ndt);
            let y = kb.cast(y, odt);
            kb.ops.push(Op {
                results: vec![],
                kind: OpKind::Store {
                    tensor: 1,
                    access: block_at(iv),
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
        if whole.is_some() {
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
            let m0 = kb.splat(ninf, &tile2);
            let l0 = kb.splat(zero, &tile2);
            let bounds = (lo, hi, step);
            let chunks = (
                &load_raw as &ChunkLoad,
                &widen as &ChunkLoad,
                long_plan(2).1,
            );
            let ml = chunk_loop(&mut kb, bounds, chunks, vec![m0, l0], &mut |kb, _, v, c| {
                let (m, l) = (c[0], c[1]);
                let mn = kb.binary(BinaryOp::Max, m, v);
                // A lane that has seen only -inf keeps l = 0 (not exp(-inf + inf)).
                let ni = kb.splat(ninf, &tile2);
                let empty = kb.binary(BinaryOp::Eq, mn, ni);
                let z = kb.splat(zero, &tile2);
                let safe = kb.emit(
                    OpKind::Select {
                        cond: empty,
                        a: z,
                        b: mn,
                    },
                    KernelBuilder::tile_ty(&tile2, f),
                );
                let dm = kb.binary(BinaryOp::Sub, m, safe);
                let alpha = kb.unary(UnaryOp::Exp, dm);
                let dv = kb.binary(BinaryOp::Sub, v, safe);
                let p = kb.unary(UnaryOp::Exp, dv);
                let la = kb.binary(BinaryOp::Mul, l, alpha);
                vec![mn, kb.binary(BinaryOp::Add, la, p)]
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
