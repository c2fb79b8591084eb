//! A fused elementwise group as a kernel indexing every axis, for inputs
//! broadcast along leading axes (`[N, M]` against `[B, H, N, M]`).

use std::collections::HashMap;

use super::fused::eval_members;
use super::{next_pow2, Group, KernelBuilder};
use crate::check::dims::Dim;
use crate::check::DType;
use crate::ir::graph::{NodeId, NodeKind};
use crate::ir::schedule::{
    cdiv, product, zero_of, Arg, BufId, KernelRef, Launch, Lower, ScalarExpr, R,
};
use crate::ir::tile::{
    self, Access, BinaryOp, Constant, Kernel, Op, OpKind, ParamKind, Region, Type, Value,
};

impl Lower<'_> {
    /// A fused kernel that indexes every axis, for inputs broadcast along leading
    /// axes (`[N, M]` or `[B, 1, N]` against `[B, H, N, M]`). The group's shape is
    /// `[D0, .., R, C]`; program `(p, q)` computes the `[BR, BC]` tile at rows
    /// `(p % cdiv(R, BR)) * BR`, columns `q * BC` of the batch `p / cdiv(R, BR)`,
    /// which is split into one index per leading axis. An input broadcast along
    /// an axis reads index 0 there (a length-1 range on the last two axes, then
    /// broadcast). Symbolic dims the index arithmetic needs are scalar parameters.
    pub(super) fn fused_nd(
        &mut self,
        grp: &Group,
        out: BufId,
        order: &[NodeId],
        leaves: &[NodeId],
        padded_of: &HashMap<NodeId, Vec<Dim>>,
    ) -> R<()> {
        let g = self.g;
        let root = grp.root;
        let dims = g.ty(root).dims().to_vec();
        let n = dims.len();
        if n < 2 {
            return Err(self.unsupported(root, "a broadcast the fused kernels do not cover"));
        }
        let dtype = self.buffers[out.0 as usize].dtype;
        let (r, c) = (dims[n - 2].clone(), dims[n - 1].clone());
        let z = product(&dims[..n - 2]).ok_or_else(|| self.unsupported(root, "batch dims"))?;
        let bc = c.as_const().map(|c| next_pow2(c).min(128)).unwrap_or(128);
        let mut br = (1024 / bc).max(1);
        if let Some(rc) = r.as_const() {
            br = br.min(next_pow2(rc));
        }
        let shape = [br as u32, bc as u32];
        let dim_of = |d: &Dim, k: usize| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(format!("D{k}")),
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![],
            span: g.node(root).span,
        };
        let mut args: Vec<(String, Arg)> = Vec::new();
        // The value of dim `k` in the kernel: a constant or a scalar parameter.
        let dim_value = |kb: &mut KernelBuilder, args: &mut Vec<(String, Arg)>, k: usize| match dims
            [k]
            .as_const()
        {
            Some(v) => kb.cnst(Constant::Int(v), DType::I32),
            None => {
                let idx = kb.params.len();
                let name = format!("d{k}");
                kb.params.push(tile::Param {
                    name: name.clone(),
                    kind: ParamKind::Scalar(DType::I32),
                });
                args.push((name, Arg::Scalar(ScalarExpr::Index(dims[k].clone()))));
                kb.emit(OpKind::ScalarParam(idx), Type::Scalar(DType::I32))
            }
        };
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let pid1 = kb.emit(OpKind::ProgramId(1), Type::Scalar(DType::I32));
        let kbr = kb.cnst(Constant::Int(br), DType::I32);
        let kbc = kb.cnst(Constant::Int(bc), DType::I32);
        let rv = dim_value(&mut kb, &mut args, n - 2);
        let brm1 = kb.cnst(Constant::Int(br - 1), DType::I32);
        let t = kb.binary(BinaryOp::Add, rv, brm1);
        let row_tiles = kb.binary(BinaryOp::FloorDiv, t, kbr);
        let batch = kb.binary(BinaryOp::FloorDiv, pid0, row_tiles);
        let rt = kb.binary(BinaryOp::Mod, pid0, row_tiles);
        let r0 = kb.binary(BinaryOp::Mul, rt, kbr);
        let c0 = kb.binary(BinaryOp::Mul, pid1, kbc);
        let zero = kb.cnst(Constant::Int(0), DType::I32);
        let mut index = vec![zero; n - 2];
        let mut rest = batch;
        for k in (0..n - 2).rev() {
            let dk = dim_value(&mut kb, &mut args, k);
            index[k] = kb.binary(BinaryOp::Mod, rest, dk);
            rest = kb.binary(BinaryOp::FloorDiv, rest, dk);
        }
        let mut vals: HashMap<NodeId, Value> = HashMap::new();
        let mut scalars: HashMap<NodeId, Value> = HashMap::new();
        let mut loaded: HashMap<(BufId, Vec<bool>), Value> = HashMap::new();
        for &l in leaves {
            let lt = g.ty(l);
            if lt.is_scalar() {
                if let NodeKind::Const(_) = g.node(l).kind {
                    continue;
                }
                let idx = kb.params.len();
                let sdt = lt.dtype().unwrap_or(DType::F32);
                kb.params.push(tile::Param {
                    name: format!("s{idx}"),
                    kind: ParamKind::Scalar(sdt),
                });
                args.push((format!("s{idx}"), Arg::Scalar(self.scalar(l)?)));
                let v = kb.emit(OpKind::ScalarParam(idx), Type::Scalar(sdt));
                scalars.insert(l, v);
                continue;
            }
            let b = self.buf(l, root)?;
            let bdt = self.buffers[b.0 as usize].dtype;
            let padded = &padded_of[&l];
            let full: Vec<bool> = padded.iter().zip(&dims).map(|(p, d)| p == d).collect();
            let tensor = match loaded.get(&(b, full.clone())) {
                Some(v) => *v,
                None => {
                    let idx = kb.params.len();
                    let mut access: Vec<Access> = (0..n - 2)
                        .map(|k| Access::Point(if full[k] { index[k] } else { zero }))
                        .collect();
                    let lr = if full[n - 2] { shape[0] } else { 1 };
                    let lc = if full[n - 1] { shape[1] } else { 1 };
                    access.push(Access::Range {
                        start: if full[n - 2] { r0 } else { zero },
                        len: lr,
                    });
                    access.push(Access::Range {
                        start: if full[n - 1] { c0 } else { zero },
                        len: lc,
                    });
                    let pdims = (0..n)
                        .map(|k| {
                            if full[k] {
                                dim_of(&dims[k], k)
                            } else {
                                tile::Dim::Static(1)
                            }
                        })
                        .collect();
                    let name = format!("x{idx}");
                    kb.params.push(tile::Param {
                        name: name.clone(),
                        kind: ParamKind::Tensor {
                            dims: pdims,
                            dtype: bdt,
                        },
                    });
                    args.push((
                        name,
                        Arg::Buffer {
                            buf: b,
                            dims: padded.clone(),
                        },
                    ));
                    let mut v = kb.emit(
                        OpKind::Load {
                            tensor: idx,
                            access,
                            mask: None,
                            other: zero_of(bdt),
                        },
                        KernelBuilder::tile_ty(&[lr, lc], bdt),
                    );
                    if [lr, lc] != shape {
                        v = kb.emit(
                            OpKind::Broadcast {
                                x: v,
                                shape: shape.to_vec(),
                            },
                            KernelBuilder::tile_ty(&shape, bdt),
                        );
                    }
                    loaded.insert((b, full), v);
                    v
                }
            };
            let v = kb.cast(tensor, lt.dtype().unwrap_or(bdt));
            vals.insert(l, v);
        }
        eval_members(&mut kb, g, grp, order, &mut vals, &scalars, &shape);
        // A scalar root (a function's scalar result) is its parameter or constant.
        let root_val = match (vals.get(&root), scalars.get(&root), &g.node(root).kind) {
            (Some(v), ..) => *v,
            (None, Some(s), _) => kb.splat(*s, &shape),
            (None, None, NodeKind::Const(c)) => {
                let c = kb.cnst(*c, dtype);
                kb.splat(c, &shape)
            }
            _ => return Err(self.unsupported(root, "this scalar result")),
        };
        let result = kb.cast(root_val, dtype);
        let idx = kb.params.len();
        kb.params.push(tile::Param {
            name: "out".into(),
            kind: ParamKind::Tensor {
                dims: (0..n).map(|k| dim_of(&dims[k], k)).collect(),
                dtype,
            },
        });
        args.push((
            "out".into(),
            Arg::Buffer {
                buf: out,
                dims: dims.clone(),
            },
        ));
        let mut access: Vec<Access> = index.iter().map(|i| Access::Point(*i)).collect();
        access.push(Access::Range {
            start: r0,
            len: shape[0],
        });
        access.push(Access::Range {
            start: c0,
            len: shape[1],
        });
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: idx,
                access,
                value: result,
                mask: None,
            },
            span: kb.span,
        });
        let kname = format!(
            "{}_{}{}",
            g.name,
            if grp.copy { "copy" } else { "fused" },
            self.kernels.len()
        );
        self.kernels.push(Kernel {
            name: kname,
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
        let rows = match (z.as_const(), r.as_const()) {
            (Some(zc), Some(rc)) => ScalarExpr::Index(Dim::constant(zc * ((rc + br - 1) / br))),
            _ => ScalarExpr::Binary(
                BinaryOp::Mul,
                Box::new(ScalarExpr::Index(z)),
                Box::new(cdiv(&r, br)),
            ),
        };
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes: if grp.copy {
                vec![root]
            } else {
                grp.members.clone()
            },
            grid: Some(vec![rows, cdiv(&c, bc)]),
            args,
            consts: vec![],
            requires: vec![],
            writes: vec![out],
        });
        Ok(())
    }
}
