//! Copy kernels: `transpose` of the last two axes in `[32, 32]` tiles, and the
//! gather copy behind other transposes and subscripts (`x[i]`, `x[a:b, 2]`).

use super::{next_pow2, KernelBuilder, SrcAxis};
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
    /// A generated kernel swapping the last two axes: one program writes a
    /// `[32, 32]` tile of `out[z]` from the transposed `[32, 32]` tile of `x[z]`.
    /// Every tile of every batch is one program of grid axis 0 (split back in
    /// the kernel): axes 1 and 2 allow only 65535 programs, which a tensor of
    /// more than about 2M rows or columns (or 65535 batches) would pass.
    pub(in crate::ir::schedule) fn transpose(&mut self, n: NodeId, out: BufId) -> R<()> {
        let g = self.g;
        let NodeKind::Transpose { x, a, b } = g.node(n).kind else {
            unreachable!("a transpose")
        };
        let xd = g.ty(x).dims().to_vec();
        let rank = xd.len();
        if rank < 2 || a.min(b) != rank - 2 || a.max(b) != rank - 1 {
            // Any other permutation: out axis k reads source axis perm(k).
            let src = (0..rank)
                .map(|j| SrcAxis::Out {
                    k: if j == a {
                        b
                    } else if j == b {
                        a
                    } else {
                        j
                    },
                    offset: ScalarExpr::Const(Constant::Int(0)),
                    wrap: false,
                })
                .collect();
            return self.gather_copy(n, x, src, out);
        }
        let z = product(&xd[..rank - 2]).ok_or_else(|| self.unsupported(n, "batch dims"))?;
        let (m, nn) = (xd[rank - 2].clone(), xd[rank - 1].clone());
        let bx = self.buf(x, n)?;
        let (bdt, odt) = (
            self.buffers[bx.0 as usize].dtype,
            self.buffers[out.0 as usize].dtype,
        );
        const T: u32 = 32;
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
                        dims: vec![dim_of(&z, "Z"), dim_of(&m, "M"), dim_of(&nn, "N")],
                        dtype: bdt,
                    },
                },
                tile::Param {
                    name: "out".into(),
                    kind: ParamKind::Tensor {
                        dims: vec![dim_of(&z, "Z"), dim_of(&nn, "N"), dim_of(&m, "M")],
                        dtype: odt,
                    },
                },
            ],
            span: g.node(n).span,
        };
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let kt = kb.cnst(Constant::Int(T as i64), DType::I32);
        let ktm1 = kb.cnst(Constant::Int(T as i64 - 1), DType::I32);
        // Tiles along x's axis `axis` (M or N): a constant or from its run-time size.
        let tiles = |kb: &mut KernelBuilder, axis: usize, d: &Dim| match d.as_const() {
            Some(c) => kb.cnst(Constant::Int((c + T as i64 - 1) / T as i64), DType::I32),
            None => {
                let v = kb.emit(
                    OpKind::TensorDim { param: 0, axis },
                    Type::Scalar(DType::I32),
                );
                let t = kb.binary(BinaryOp::Add, v, ktm1);
                kb.binary(BinaryOp::FloorDiv, t, kt)
            }
        };
        let tn = tiles(&mut kb, 2, &nn);
        let tm = tiles(&mut kb, 1, &m);
        let nt = kb.binary(BinaryOp::Mod, pid0, tn);
        let rest = kb.binary(BinaryOp::FloorDiv, pid0, tn);
        let mt = kb.binary(BinaryOp::Mod, rest, tm);
        let batch = kb.binary(BinaryOp::FloorDiv, rest, tm);
        let pid = [nt, mt, batch];
        let r0 = kb.binary(BinaryOp::Mul, pid[0], kt);
        let c0 = kb.binary(BinaryOp::Mul, pid[1], kt);
        let v = kb.emit(
            OpKind::Load {
                tensor: 0,
                access: vec![
                    Access::Point(pid[2]),
                    Access::Range { start: c0, len: T },
                    Access::Range { start: r0, len: T },
                ],
                mask: None,
                other: zero_of(bdt),
            },
            KernelBuilder::tile_ty(&[T, T], bdt),
        );
        let v = kb.emit(
            OpKind::Transpose { x: v },
            KernelBuilder::tile_ty(&[T, T], bdt),
        );
        let v = kb.cast(v, odt);
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: 1,
                access: vec![
                    Access::Point(pid[2]),
                    Access::Range { start: r0, len: T },
                    Access::Range { start: c0, len: T },
                ],
                value: v,
                mask: None,
            },
            span: kb.span,
        });
        let name = format!("{}_transpose{}", g.name, self.kernels.len());
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
            grid: Some(vec![flat_grid(&[
                cdiv(&nn, T as i64),
                cdiv(&m, T as i64),
                ScalarExpr::Index(z.clone()),
            ])]),
            args: vec![
                (
                    "x0".into(),
                    Arg::Buffer {
                        buf: bx,
                        dims: vec![z.clone(), m.clone(), nn.clone()],
                    },
                ),
                (
                    "out".into(),
                    Arg::Buffer {
                        buf: out,
                        dims: vec![z, nn, m],
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

/// The product of grid sizes, folded where they are constants.
fn flat_grid(parts: &[ScalarExpr]) -> ScalarExpr {
    let konst = |e: &ScalarExpr| match e {
        ScalarExpr::Index(d) => d.as_const(),
        ScalarExpr::Const(Constant::Int(i)) => Some(*i),
        _ => None,
    };
    let mut folded: i64 = 1;
    let mut rest: Option<ScalarExpr> = None;
    for p in parts {
        match konst(p).and_then(|c| folded.checked_mul(c)) {
            Some(f) => folded = f,
            None => {
                rest = Some(match rest {
                    None => p.clone(),
                    Some(r) => ScalarExpr::Binary(BinaryOp::Mul, Box::new(r), Box::new(p.clone())),
                })
            }
        }
    }
    match rest {
        None => ScalarExpr::Index(Dim::constant(folded)),
        Some(r) if folded == 1 => r,
        Some(r) => ScalarExpr::Binary(
            BinaryOp::Mul,
            Box::new(r),
            Box::new(ScalarExpr::Index(Dim::constant(folded))),
        ),
    }
}

impl Lower<'_> {
    /// A copy `out[i..] = x[f(i..)]` where every source axis is an out axis
    /// shifted by an offset or a fixed index: permutations (`transpose` of any
    /// axes) and subscripts (`x[i]`, `x[a:b, 2]`). The out's leading axes are
    /// flattened onto grid axis 0 and split back per program; a program copies a
    /// `[BC]` run of the out's last axis, read from whichever source axis it maps
    /// to. A rank-0 result is copied as `[1]`. Loads are bounds-safe: an index
    /// out of range at run time reads zeros.
    pub(in crate::ir::schedule) fn gather_copy(
        &mut self,
        n: NodeId,
        x: NodeId,
        mut src: Vec<SrcAxis>,
        out: BufId,
    ) -> R<()> {
        let g = self.g;
        let xd = g.ty(x).dims().to_vec();
        let mut od = g.ty(n).dims().to_vec();
        if od.is_empty() {
            // `x[i, j]`: a `[1]` result whose one axis is the first fixed index.
            let j = src
                .iter()
                .position(|a| matches!(a, SrcAxis::Fixed(_)))
                .ok_or_else(|| self.unsupported(n, "a rank-0 copy"))?;
            let SrcAxis::Fixed(e) = std::mem::replace(
                &mut src[j],
                SrcAxis::Fixed(ScalarExpr::Const(Constant::Int(0))),
            ) else {
                unreachable!("a fixed index")
            };
            src[j] = SrcAxis::Out {
                k: 0,
                offset: e,
                wrap: true,
            };
            od.push(Dim::constant(1));
        }
        let r = od.len();
        let bx = self.buf_as(x, n)?;
        let (bdt, odt) = (
            self.buffers[bx.0 as usize].dtype,
            self.buffers[out.0 as usize].dtype,
        );
        let c = od[r - 1].clone();
        let bc = c.as_const().map(|c| next_pow2(c).min(128)).unwrap_or(128) as u32;
        let rows = product(&od[..r - 1]).ok_or_else(|| self.unsupported(n, "batch dims"))?;
        let dim_of = |d: &Dim, name: String| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name),
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![
                tile::Param {
                    name: "x0".into(),
                    kind: ParamKind::Tensor {
                        dims: xd
                            .iter()
                            .enumerate()
                            .map(|(j, d)| dim_of(d, format!("X{j}")))
                            .collect(),
                        dtype: bdt,
                    },
                },
                tile::Param {
                    name: "out".into(),
                    kind: ParamKind::Tensor {
                        dims: od
                            .iter()
                            .enumerate()
                            .map(|(k, d)| dim_of(d, format!("O{k}")))
                            .collect(),
                        dtype: odt,
                    },
                },
            ],
            span: g.node(n).span,
        };
        let mut args: Vec<(String, Arg)> = vec![
            (
                "x0".into(),
                Arg::Buffer {
                    buf: bx,
                    dims: xd.clone(),
                },
            ),
            (
                "out".into(),
                Arg::Buffer {
                    buf: out,
                    dims: od.clone(),
                },
            ),
        ];
        let i32t = Type::Scalar(DType::I32);
        // A dim as an i32 value: a constant or the tensor's run-time size.
        let dim_value =
            |kb: &mut KernelBuilder, param: usize, axis: usize, d: &Dim| match d.as_const() {
                Some(v) => kb.cnst(Constant::Int(v), DType::I32),
                None => kb.emit(OpKind::TensorDim { param, axis }, Type::Scalar(DType::I32)),
            };
        // A host scalar as an i32 value: a constant or a scalar parameter.
        let scalar_value =
            |kb: &mut KernelBuilder, args: &mut Vec<(String, Arg)>, e: ScalarExpr| match e {
                ScalarExpr::Const(Constant::Int(v)) => kb.cnst(Constant::Int(v), DType::I32),
                ScalarExpr::Index(d) if d.as_const().is_some() => {
                    kb.cnst(Constant::Int(d.as_const().unwrap_or(0)), DType::I32)
                }
                e => {
                    let idx = kb.params.len();
                    let name = format!("s{idx}");
                    kb.params.push(tile::Param {
                        name: name.clone(),
                        kind: ParamKind::Scalar(DType::I32),
                    });
                    args.push((name, Arg::Scalar(e)));
                    kb.emit(OpKind::ScalarParam(idx), Type::Scalar(DType::I32))
                }
            };
        let pid0 = kb.emit(OpKind::ProgramId(0), i32t.clone());
        let pid1 = kb.emit(OpKind::ProgramId(1), i32t.clone());
        let kbc = kb.cnst(Constant::Int(bc as i64), DType::I32);
        let c0 = kb.binary(BinaryOp::Mul, pid1, kbc);
        let zero = kb.cnst(Constant::Int(0), DType::I32);
        let mut index = vec![zero; r - 1];
        let mut rest = pid0;
        for k in (0..r - 1).rev() {
            if k == 0 {
                // The grid covers exactly the out's leading axes.
                index[0] = rest;
                break;
            }
            let dk = dim_value(&mut kb, 1, k, &od[k]);
            index[k] = kb.binary(BinaryOp::Mod, rest, dk);
            rest = kb.binary(BinaryOp::FloorDiv, rest, dk);
        }
        let mut access = Vec::with_capacity(xd.len());
        for (j, a) in src.into_iter().enumerate() {
            let (offset, wrap, k) = match a {
                SrcAxis::Out { k, offset, wrap } => (offset, wrap, Some(k)),
                SrcAxis::Fixed(e) => (e, true, None),
            };
            let constant = match &offset {
                ScalarExpr::Const(Constant::Int(v)) => Some(*v),
                ScalarExpr::Index(d) => d.as_const(),
                _ => None,
            };
            let mut off = match constant {
                Some(0) => zero,
                _ => scalar_value(&mut kb, &mut args, offset),
            };
            match constant {
                Some(v) if wrap && v < 0 => {
                    let xj = dim_value(&mut kb, 0, j, &xd[j]);
                    off = kb.binary(BinaryOp::Add, off, xj);
                }
                None if wrap => {
                    // `i < 0 ? i + X : i`
                    let neg = kb.binary(BinaryOp::Lt, off, zero);
                    let xj = dim_value(&mut kb, 0, j, &xd[j]);
                    let up = kb.binary(BinaryOp::Add, off, xj);
                    off = kb.emit(
                        OpKind::Select {
                            cond: neg,
                            a: up,
                            b: off,
                        },
                        i32t.clone(),
                    );
                }
                _ => {}
            }
            access.push(match k {
                Some(k) if k == r - 1 => Access::Range {
                    start: if constant == Some(0) {
                        c0
                    } else {
                        kb.binary(BinaryOp::Add, c0, off)
                    },
                    len: bc,
                },
                Some(k) if constant == Some(0) => Access::Point(index[k]),
                Some(k) => Access::Point(kb.binary(BinaryOp::Add, index[k], off)),
                None => Access::Point(off),
            });
        }
        let v = kb.emit(
            OpKind::Load {
                tensor: 0,
                access,
                mask: None,
                other: zero_of(bdt),
            },
            KernelBuilder::tile_ty(&[bc], bdt),
        );
        let v = kb.cast(v, odt);
        let store: Vec<Access> = index
            .iter()
            .map(|i| Access::Point(*i))
            .chain([Access::Range { start: c0, len: bc }])
            .collect();
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: 1,
                access: store,
                value: v,
                mask: None,
            },
            span: kb.span,
        });
        let what = if matches!(g.node(n).kind, NodeKind::Transpose { .. }) {
            "permute"
        } else {
            "slice"
        };
        let name = format!("{}_{what}{}", g.name, self.kernels.len());
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
            grid: Some(vec![ScalarExpr::Index(rows), cdiv(&c, bc as i64)]),
            args,
            consts: vec![],
            requires: vec![],
            writes: vec![out],
        });
        Ok(())
    }
}
