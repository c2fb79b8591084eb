//! Launches of standard-library kernels: `matmul` as a `std.linalg` gemm,
//! softmax, norms and reductions as `std.nn`/`std.reduce` row kernels, and the
//! attention pattern matched and launched as `std.attention` `flash_attn`.

use std::collections::HashMap;

use super::{
    generate, product, Arg, Attention, BufId, KernelRef, Launch, Lower, ScalarExpr, R, ROW_BLOCK,
};
use crate::check::dims::Dim;
use crate::check::DType;
use crate::ir::graph::{GType, NodeId, NodeKind, ReduceKind};
use crate::ir::tile::{BinaryOp, Constant};

impl<'g> Lower<'g> {
    /// Matches `matmul(softmax(matmul(q, transpose(k, -2, -1)) * s, dim=-1), v)`:
    /// returns (q, k, v, scale, absorbed nodes).
    fn attention(&self, n: NodeId) -> Option<Attention> {
        let g = self.g;
        let single = |x: NodeId| self.uses[x.0 as usize] == 1;
        let NodeKind::MatMul { a: sm, b: v, .. } = g.node(n).kind else {
            return None;
        };
        let NodeKind::Softmax { x: scaled, axis } = g.node(sm).kind else {
            return None;
        };
        if axis != 3 || !single(sm) {
            return None;
        }
        let (scores, scale) = match g.node(scaled).kind {
            NodeKind::Binary {
                op: BinaryOp::Mul,
                a,
                b,
            } if g.ty(b).is_scalar() => (a, self.scalar(b).ok()?),
            NodeKind::Binary {
                op: BinaryOp::Mul,
                a,
                b,
            } if g.ty(a).is_scalar() => (b, self.scalar(a).ok()?),
            NodeKind::Binary {
                op: BinaryOp::Div,
                a,
                b,
            } if g.ty(b).is_scalar() => (
                a,
                ScalarExpr::Binary(
                    BinaryOp::Div,
                    Box::new(ScalarExpr::Const(Constant::Float(1.0))),
                    Box::new(self.scalar(b).ok()?),
                ),
            ),
            _ => return None,
        };
        if !single(scaled) || !single(scores) {
            return None;
        }
        let NodeKind::MatMul { a: q, b: kt, .. } = g.node(scores).kind else {
            return None;
        };
        let (NodeKind::Transpose { x: k, a: 2, b: 3 } | NodeKind::Transpose { x: k, a: 3, b: 2 }) =
            g.node(kt).kind
        else {
            return None;
        };
        if !single(kt) {
            return None;
        }
        let qt = g.ty(q);
        let bf16_4d = |t: &GType| t.dtype() == Some(DType::BF16) && t.dims().len() == 4;
        if !bf16_4d(qt) || g.ty(k) != qt || g.ty(v) != qt || g.ty(n) != qt {
            return None;
        }
        if g.ty(scaled).dtype() != Some(DType::BF16) {
            return None;
        }
        Some((q, k, v, scale, vec![kt, scores, scaled, sm]))
    }

    fn arg_buf(&self, buf: BufId, dims: Vec<Dim>) -> Arg {
        Arg::Buffer { buf, dims }
    }

    pub(super) fn lower_matmul(&mut self, n: NodeId, out: Option<BufId>) -> R<()> {
        let g = self.g;
        let NodeKind::MatMul { a, b, tf32 } = g.node(n).kind else {
            unreachable!("a matmul")
        };
        let dn = g.ty(n).dims();
        // numpy's 1-D operands: a row `[1, K]` on the left, a column `[K, 1]` on the right.
        let mut da = g.ty(a).dims().to_vec();
        if da.len() == 1 {
            da.insert(0, Dim::constant(1));
        }
        let mut db = g.ty(b).dims().to_vec();
        if db.len() == 1 {
            db.push(Dim::constant(1));
        }
        let (ba, bb) = (self.buf_as(a, n)?, self.buf_as(b, n)?);
        let dt = g.ty(a).dtype().unwrap_or(DType::F32);
        let overflow = || self.unsupported(n, "a dim product that overflows");
        // A right operand without batch dims: the left one's rows are all one `M`
        // (contiguous), so a plain gemm does it.
        let flat = db.len() == 2;
        let m = if flat {
            product(&da[..da.len() - 1]).ok_or_else(overflow)?
        } else {
            da[da.len() - 2].clone()
        };
        let (k, nn) = (da[da.len() - 1].clone(), db[db.len() - 1].clone());
        let acc = generate::acc_dtype(g.ty(n).dtype().unwrap_or(DType::F32));
        let c = match out {
            Some(o) if g.ty(n).dtype() == Some(acc) => o,
            _ => self.temp(dn.to_vec(), acc),
        };
        let (name, batched): (&'static str, bool) = match (dt, flat, da.len(), db.len()) {
            (DType::F16, true, _, _) => ("gemm", false),
            (DType::BF16, true, _, _) => ("gemm_bf16", false),
            // Full f32 unless tf32 was asked for: the generated gemm's `dot`
            // at ieee precision (FMA units), not `gemm_tf32`'s tensor cores.
            (DType::F32, true, _, _) if tf32 => ("gemm_tf32", false),
            (DType::F16, false, ra, rb) if ra == rb && da[..ra - 2] == db[..rb - 2] => {
                ("gemm_batched", true)
            }
            (d, ..)
                if (d.is_float() && g.ty(b).dtype().is_some_and(DType::is_float))
                    || (d.is_int() && g.ty(b).dtype().is_some_and(DType::is_int)) =>
            {
                self.matmul_generated(n, &da, &db, ba, bb, c)?;
                self.buf_of.insert(n, c);
                return Ok(());
            }
            _ => {
                return Err(self.unsupported(
                    n,
                    format!(
                        "matmul of {} x {} (tensor cores multiply floats)",
                        g.ty(a),
                        g.ty(b)
                    ),
                ))
            }
        };
        let args = if batched {
            let z =
                product(&da[..da.len() - 2]).ok_or_else(|| self.unsupported(n, "batch dims"))?;
            vec![
                (
                    "A".to_string(),
                    self.arg_buf(ba, vec![z.clone(), m.clone(), k.clone()]),
                ),
                (
                    "B".to_string(),
                    self.arg_buf(bb, vec![z.clone(), k, nn.clone()]),
                ),
                ("C".to_string(), self.arg_buf(c, vec![z, m, nn])),
            ]
        } else {
            vec![
                (
                    "A".to_string(),
                    self.arg_buf(ba, vec![m.clone(), k.clone()]),
                ),
                ("B".to_string(), self.arg_buf(bb, vec![k, nn.clone()])),
                ("C".to_string(), self.arg_buf(c, vec![m, nn])),
            ]
        };
        self.launch(Launch {
            kernel: KernelRef::Std {
                module: "std.linalg",
                name,
            },
            nodes: vec![n],
            // The kernel's own grid, over the tile its launch runs (tuned).
            grid: None,
            args,
            consts: vec![],
            requires: if name == "gemm_tf32" {
                vec!["f32 inputs multiplied at tf32 precision (tensor cores, sm_80+)".to_string()]
            } else {
                vec![]
            },
            writes: vec![c],
        });
        self.buf_of.insert(n, c);
        Ok(())
    }

    /// A row kernel over the `[R, C]` view of `x`: softmax, norms, reductions.
    pub(super) fn lower_rows(&mut self, n: NodeId, out: Option<BufId>) -> R<()> {
        let g = self.g;
        let node = g.node(n);
        let x = match node.kind {
            NodeKind::Softmax { x, .. }
            | NodeKind::LayerNorm { x, .. }
            | NodeKind::RmsNorm { x, .. }
            | NodeKind::Reduce { x, .. } => x,
            _ => unreachable!("a row op"),
        };
        let xdims = g.ty(x).dims().to_vec();
        let (r, c) = self.rows_cols(&xdims, n)?;
        if !g.ty(x).dtype().is_some_and(DType::is_float) {
            return Err(self.unsupported(
                n,
                format!("this op on `{}` (its stdlib row kernel is f32)", g.ty(x)),
            ));
        }
        // The row kernels are f32: other float dtypes go through cast copies, and
        // the result stays in an f32 buffer that its users read with a cast.
        let bx = self.buf_f32(x, n)?;
        let fits = c.as_const().map(|c| c <= ROW_BLOCK);
        let mut requires = Vec::new();
        let last = xdims.len() - 1;
        let (module, name, fits_needed): (&'static str, &'static str, bool) = match &node.kind {
            NodeKind::Softmax { axis, .. } if *axis == last => {
                if fits == Some(true) {
                    ("std.nn", "softmax_rows", true)
                } else {
                    ("std.nn", "softmax_rows_online", false)
                }
            }
            NodeKind::LayerNorm { .. } => ("std.nn", "layer_norm_rows", true),
            NodeKind::RmsNorm { .. } => ("std.nn", "rms_norm_rows", true),
            NodeKind::Reduce {
                op, axis: Some(a), ..
            } if *a == last => match op {
                ReduceKind::Sum => ("std.reduce", "sum_rows", false),
                ReduceKind::Max => ("std.reduce", "max_rows", false),
                ReduceKind::Mean => ("std.reduce", "mean_rows", false),
                ReduceKind::Min => {
                    return Err(self
                        .unsupported(n, "`min` over an axis (std.reduce has sum, max and mean)"))
                }
            },
            NodeKind::Softmax { .. } => {
                return Err(self.unsupported(n, "softmax over an axis other than the last"))
            }
            _ => {
                return Err(self.unsupported(
                    n,
                    "a reduction over all axes or over an axis other than the last",
                ))
            }
        };
        if fits_needed && fits != Some(true) {
            if fits == Some(false) {
                return Err(self.unsupported(
                    n,
                    format!("`{name}` holds a row in {ROW_BLOCK} elements; this row has {c}"),
                ));
            }
            requires.push(format!("{c} <= {ROW_BLOCK}"));
        }
        let reduce = matches!(node.kind, NodeKind::Reduce { .. });
        let ob = match out {
            Some(o) => o,
            None => self.temp(node.ty.dims().to_vec(), DType::F32),
        };
        let out_dims = if reduce {
            vec![r.clone()]
        } else {
            vec![r.clone(), c.clone()]
        };
        let mut args = vec![(
            "x".to_string(),
            self.arg_buf(bx, vec![r.clone(), c.clone()]),
        )];
        let vec_arg = |s: &mut Self, w: NodeId| -> R<Arg> {
            if g.ty(w).dims() != [c.clone()] {
                return Err(s.unsupported(w, format!("a weight `{}` that is not `[{c}]`", g.ty(w))));
            }
            let bw = s.buf_f32(w, n)?;
            if s.buffers[bw.0 as usize].dtype != DType::F32 {
                return Err(
                    s.unsupported(w, format!("a weight `{}` that is not `[{c}]` f32", g.ty(w)))
                );
            }
            Ok(s.arg_buf(bw, vec![c.clone()]))
        };
        let eps_arg = |s: &Self, e: Option<NodeId>, default: f64| -> R<Arg> {
            Ok(Arg::Scalar(match e {
                Some(e) => s.scalar(e)?,
                None => ScalarExpr::Const(Constant::Float(default)),
            }))
        };
        let mut tail = Vec::new();
        match node.kind {
            NodeKind::LayerNorm {
                weight, bias, eps, ..
            } => {
                let (Some(w), Some(b)) = (weight, bias) else {
                    return Err(self.unsupported(
                        n,
                        "layer_norm without weight and bias (layer_norm_rows takes both)",
                    ));
                };
                args.push(("weight".into(), vec_arg(self, w)?));
                args.push(("bias".into(), vec_arg(self, b)?));
                tail.push(("eps".to_string(), eps_arg(self, eps, 1e-5)?));
            }
            NodeKind::RmsNorm { weight, eps, .. } => {
                let Some(w) = weight else {
                    return Err(
                        self.unsupported(n, "rms_norm without weight (rms_norm_rows takes one)")
                    );
                };
                args.push(("weight".into(), vec_arg(self, w)?));
                tail.push(("eps".to_string(), eps_arg(self, eps, 1e-6)?));
            }
            _ => {}
        }
        args.push(("out".to_string(), self.arg_buf(ob, out_dims)));
        args.extend(tail);
        self.launch(Launch {
            kernel: KernelRef::Std { module, name },
            nodes: vec![n],
            grid: Some(vec![ScalarExpr::Index(r)]),
            args,
            consts: vec![],
            requires,
            writes: vec![ob],
        });
        self.buf_of.insert(n, ob);
        Ok(())
    }

    pub(super) fn lower_attention(
        &mut self,
        n: NodeId,
        (q, k, v, scale, absorbed): Attention,
        out: Option<BufId>,
    ) -> R<()> {
        let dims = self.g.ty(n).dims().to_vec();
        let (bq, bk, bv) = (self.buf_as(q, n)?, self.buf_as(k, n)?, self.buf_as(v, n)?);
        let o = match out {
            Some(o) => o,
            None => self.temp(dims.clone(), DType::BF16),
        };
        let mut nodes = absorbed;
        nodes.push(n);
        let full = |b| Arg::Buffer {
            buf: b,
            dims: dims.clone(),
        };
        self.launch(Launch {
            kernel: KernelRef::Std {
                module: "std.attention",
                name: "flash_attn",
            },
            nodes,
            // The kernel's own grid, over the tile its launch runs (tuned).
            grid: None,
            args: vec![
                ("q".into(), full(bq)),
                ("k".into(), full(bk)),
                ("v".into(), full(bv)),
                ("o".into(), full(o)),
                ("scale".into(), Arg::Scalar(scale)),
            ],
            consts: vec![("causal".into(), "False".into())],
            requires: vec![],
            writes: vec![o],
        });
        self.buf_of.insert(n, o);
        Ok(())
    }
}

impl Lower<'_> {
    /// Attention matches: the patterns by final matmul, and the nodes they absorb.
    pub(super) fn attentions(&self) -> (HashMap<usize, Attention>, Vec<bool>) {
        let n = self.g.nodes.len();
        let mut absorbed = vec![false; n];
        let mut attention = HashMap::new();
        for i in 0..n {
            if let Some(m) = self.attention(NodeId(i as u32)) {
                for a in &m.4 {
                    absorbed[a.0 as usize] = true;
                }
                attention.insert(i, m);
            }
        }
        (attention, absorbed)
    }
}
