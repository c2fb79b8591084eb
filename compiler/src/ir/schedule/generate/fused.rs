//! A fused elementwise group as one kernel over the flat `[R, C]` view of its
//! shape: each input loaded as a full tile, a row, a column or one element.
//! Groups whose inputs broadcast along leading axes go to `fused_nd`.

use std::collections::HashMap;

use super::{next_pow2, Group, KernelBuilder};
use crate::check::dims::Dim;
use crate::check::DType;
use crate::ir::graph::{Activation, Fill, Graph, NodeId, NodeKind};
use crate::ir::schedule::{cdiv, zero_of, Arg, BufId, KernelRef, Launch, Lower, Pattern, R};
use crate::ir::tile::{
    self, Access, BinaryOp, Constant, Kernel, Op, OpKind, ParamKind, Region, Type, UnaryOp, Value,
};

/// Computes the members of a fused group on `shape` tiles, after its leaves
/// (in `vals` and `scalars`).
pub(super) fn eval_members(
    kb: &mut KernelBuilder,
    g: &Graph,
    grp: &Group,
    order: &[NodeId],
    vals: &mut HashMap<NodeId, Value>,
    scalars: &HashMap<NodeId, Value>,
    shape: &[u32],
) {
    // An operand as a [BR, BC] tile of dtype `want`.
    fn operand(
        kb: &mut KernelBuilder,
        g: &Graph,
        vals: &HashMap<NodeId, Value>,
        scalars: &HashMap<NodeId, Value>,
        x: NodeId,
        want: DType,
        shape: &[u32],
    ) -> Value {
        if let Some(v) = vals.get(&x) {
            return kb.cast(*v, want);
        }
        let s = match (&g.node(x).kind, scalars.get(&x)) {
            (_, Some(v)) => kb.cast(*v, want),
            (NodeKind::Const(c), None) => kb.cnst(*c, want),
            _ => unreachable!("every operand is a leaf or an earlier member"),
        };
        kb.splat(s, shape)
    }
    let is_const = |x: NodeId| matches!(g.node(x).kind, NodeKind::Const(_));
    for &m in order {
        if grp.copy {
            break;
        }
        let node = g.node(m);
        let dt = node.ty.dtype().unwrap_or(DType::F32);
        let v = match &node.kind {
            NodeKind::Unary { op, x } => {
                let x = operand(kb, g, vals, scalars, *x, dt, shape);
                kb.unary(*op, x)
            }
            NodeKind::Activation { act, x } => {
                let x = operand(kb, g, vals, scalars, *x, dt, shape);
                match act {
                    Activation::Relu => {
                        let z = kb.cnst(Constant::Int(0), dt);
                        let z = kb.splat(z, shape);
                        kb.binary(BinaryOp::Max, x, z)
                    }
                    Activation::Silu => {
                        let s = kb.unary(UnaryOp::Sigmoid, x);
                        kb.binary(BinaryOp::Mul, x, s)
                    }
                    Activation::Gelu => {
                        let k = kb.cnst(Constant::Float(std::f64::consts::FRAC_1_SQRT_2), dt);
                        let k = kb.splat(k, shape);
                        let t = kb.binary(BinaryOp::Mul, x, k);
                        let t = kb.unary(UnaryOp::Erf, t);
                        let one = kb.cnst(Constant::Float(1.0), dt);
                        let one = kb.splat(one, shape);
                        let t = kb.binary(BinaryOp::Add, one, t);
                        let h = kb.cnst(Constant::Float(0.5), dt);
                        let h = kb.splat(h, shape);
                        let hx = kb.binary(BinaryOp::Mul, h, x);
                        kb.binary(BinaryOp::Mul, hx, t)
                    }
                }
            }
            NodeKind::Binary { op, a, b } => {
                let want = if op.is_comparison() {
                    let (ta, tb) = (g.ty(*a).dtype(), g.ty(*b).dtype());
                    match (ta, tb) {
                        (Some(x), Some(y)) if is_const(*b) => {
                            let _ = y;
                            x
                        }
                        (Some(_), Some(y)) if is_const(*a) => y,
                        (Some(x), Some(y)) => DType::join(x, y).unwrap_or(x),
                        _ => dt,
                    }
                } else {
                    dt
                };
                let a = operand(kb, g, vals, scalars, *a, want, shape);
                let b = operand(kb, g, vals, scalars, *b, want, shape);
                kb.binary(*op, a, b)
            }
            NodeKind::Select { cond, a, b } => {
                let cv = operand(kb, g, vals, scalars, *cond, DType::Bool, shape);
                let a = operand(kb, g, vals, scalars, *a, dt, shape);
                let b = operand(kb, g, vals, scalars, *b, dt, shape);
                kb.emit(
                    OpKind::Select { cond: cv, a, b },
                    KernelBuilder::tile_ty(shape, dt),
                )
            }
            NodeKind::Cast { x, to } => {
                let xd = g.ty(*x).dtype().unwrap_or(*to);
                let x = operand(kb, g, vals, scalars, *x, xd, shape);
                kb.cast(x, *to)
            }
            NodeKind::Fill(Fill::Zeros) => {
                let z = kb.cnst(Constant::Int(0), dt);
                kb.splat(z, shape)
            }
            NodeKind::Fill(Fill::Ones) => {
                let z = kb.cnst(Constant::Int(1), dt);
                kb.splat(z, shape)
            }
            NodeKind::Fill(Fill::Full(v)) => operand(kb, g, vals, scalars, *v, dt, shape),
            _ => unreachable!("only elementwise nodes are fused"),
        };
        vals.insert(m, v);
    }
}

/// How a leaf (padded to the group's rank) is read in the flat `[R, C]` view.
fn classify(padded: &[Dim], dims: &[Dim]) -> Option<Pattern> {
    let rank = dims.len();
    let lead_ones = padded[..rank - 1].iter().all(Dim::is_one);
    if padded == dims {
        Some(Pattern::Full)
    } else if lead_ones && padded[rank - 1] == dims[rank - 1] {
        Some(Pattern::Row)
    } else if padded[rank - 1].is_one() && padded[..rank - 1] == dims[..rank - 1] {
        Some(Pattern::Col)
    } else if padded.iter().all(Dim::is_one) {
        Some(Pattern::One)
    } else {
        None
    }
}

impl Lower<'_> {
    /// Generates the fused kernel of a group and launches it, writing `out`.
    pub(in crate::ir::schedule) fn fused(&mut self, grp: &Group, out: BufId) -> R<()> {
        let g = self.g;
        let root = grp.root;
        // A rank-0 group is one element: computed as a `[1]` tensor (its
        // rank-0 operands pad to `[1]` like any lower-rank operand).
        let mut dims = g.ty(root).dims().to_vec();
        if dims.is_empty() {
            dims.push(Dim::constant(1));
        }
        let dtype = self.buffers[out.0 as usize].dtype;
        let in_group = |x: NodeId| grp.members.contains(&x) && !(grp.copy && x == root);
        let order: Vec<NodeId> = if grp.copy {
            vec![root]
        } else {
            grp.members.clone()
        };
        // Leaves first: every operand outside the group, in order of first use.
        let mut leaves: Vec<NodeId> = Vec::new();
        for &m in &order {
            let ops = if grp.copy { vec![m] } else { g.operands(m) };
            for o in ops {
                if !in_group(o) && !leaves.contains(&o) {
                    leaves.push(o);
                }
            }
        }
        let (r, c) = self.rows_cols(&dims, root)?;
        // Every tensor leaf padded to the group's rank.
        let rank = dims.len();
        let mut padded_of: HashMap<NodeId, Vec<Dim>> = HashMap::new();
        for &l in &leaves {
            let ld = g.ty(l).dims();
            if g.ty(l).is_scalar() {
                continue;
            }
            if ld.len() > rank {
                return Err(self.unsupported(l, "an operand of higher rank than its result"));
            }
            let mut padded = vec![Dim::constant(1); rank - ld.len()];
            padded.extend(ld.iter().cloned());
            if padded.iter().zip(&dims).any(|(p, d)| p != d && !p.is_one()) {
                return Err(self.unsupported(
                    l,
                    format!(
                        "broadcasting `{}` to {} in a fused kernel",
                        g.ty(l),
                        crate::check::types::render_dims(&dims)
                    ),
                ));
            }
            padded_of.insert(l, padded);
        }
        // The flat `[R, C]` view serves when every input is full, a row, a
        // column or one element; otherwise the kernel indexes every axis.
        if padded_of.values().any(|p| classify(p, &dims).is_none()) {
            return self.fused_nd(grp, out, &order, &leaves, &padded_of);
        }
        let bc = c.as_const().map(|c| next_pow2(c).min(128)).unwrap_or(128);
        let mut br = (1024 / bc).max(1);
        if let Some(rc) = r.as_const() {
            br = br.min(next_pow2(rc));
        }
        let shape = [br as u32, bc as u32];
        let dim_of = |d: &Dim, name: &str| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name.to_string()),
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![],
            span: g.node(root).span,
        };
        let mut args: Vec<(String, Arg)> = Vec::new();
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let pid1 = kb.emit(OpKind::ProgramId(1), Type::Scalar(DType::I32));
        let kbr = kb.cnst(Constant::Int(br), DType::I32);
        let kbc = kb.cnst(Constant::Int(bc), DType::I32);
        let r0 = kb.binary(BinaryOp::Mul, pid0, kbr);
        let c0 = kb.binary(BinaryOp::Mul, pid1, kbc);
        // Values of nodes already computed in this kernel, at their graph dtype.
        let mut vals: HashMap<NodeId, Value> = HashMap::new();
        let mut loaded: HashMap<(BufId, Pattern), Value> = HashMap::new();
        let mut scalars: HashMap<NodeId, Value> = HashMap::new();
        for &l in &leaves {
            let lt = g.ty(l);
            if lt.is_scalar() {
                if let NodeKind::Const(_) = g.node(l).kind {
                    continue; // built where used, in the dtype it is used at
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
            let pattern = classify(&padded_of[&l], &dims).expect("classified above");
            let tensor = match loaded.get(&(b, pattern)) {
                Some(v) => *v,
                None => {
                    let idx = kb.params.len();
                    let (pdims, view, access, lshape) = match pattern {
                        Pattern::Full => (
                            vec![dim_of(&r, "R"), dim_of(&c, "C")],
                            vec![r.clone(), c.clone()],
                            vec![
                                Access::Range {
                                    start: r0,
                                    len: shape[0],
                                },
                                Access::Range {
                                    start: c0,
                                    len: shape[1],
                                },
                            ],
                            vec![shape[0], shape[1]],
                        ),
                        Pattern::Row => (
                            vec![dim_of(&c, "C")],
                            vec![c.clone()],
                            vec![Access::Range {
                                start: c0,
                                len: shape[1],
                            }],
                            vec![shape[1]],
                        ),
                        Pattern::Col => (
                            vec![dim_of(&r, "R")],
                            vec![r.clone()],
                            vec![Access::Range {
                                start: r0,
                                len: shape[0],
                            }],
                            vec![shape[0]],
                        ),
                        Pattern::One => {
                            let z = kb.cnst(Constant::Int(0), DType::I32);
                            (
                                vec![tile::Dim::Static(1)],
                                vec![Dim::constant(1)],
                                vec![Access::Range { start: z, len: 1 }],
                                vec![1],
                            )
                        }
                    };
                    let name = format!("x{idx}");
                    kb.params.push(tile::Param {
                        name: name.clone(),
                        kind: ParamKind::Tensor {
                            dims: pdims,
                            dtype: bdt,
                        },
                    });
                    args.push((name, Arg::Buffer { buf: b, dims: view }));
                    let mut v = kb.emit(
                        OpKind::Load {
                            tensor: idx,
                            access,
                            mask: None,
                            other: zero_of(bdt),
                        },
                        KernelBuilder::tile_ty(&lshape, bdt),
                    );
                    if pattern != Pattern::Full {
                        let axis = if pattern == Pattern::Col { 1 } else { 0 };
                        let s = if pattern == Pattern::Col {
                            [shape[0], 1]
                        } else {
                            [1, lshape[0]]
                        };
                        v = kb.emit(
                            OpKind::ExpandDims { x: v, axis },
                            KernelBuilder::tile_ty(&s, bdt),
                        );
                        v = kb.emit(
                            OpKind::Broadcast {
                                x: v,
                                shape: shape.to_vec(),
                            },
                            KernelBuilder::tile_ty(&shape, bdt),
                        );
                    }
                    loaded.insert((b, pattern), v);
                    v
                }
            };
            let v = kb.cast(tensor, lt.dtype().unwrap_or(bdt));
            vals.insert(l, v);
        }
        eval_members(&mut kb, g, grp, &order, &mut vals, &scalars, &shape);
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
                dims: vec![dim_of(&r, "R"), dim_of(&c, "C")],
                dtype,
            },
        });
        args.push((
            "out".into(),
            Arg::Buffer {
                buf: out,
                dims: vec![r.clone(), c.clone()],
            },
        ));
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: idx,
                access: vec![
                    Access::Range {
                        start: r0,
                        len: shape[0],
                    },
                    Access::Range {
                        start: c0,
                        len: shape[1],
                    },
                ],
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
        let mut nodes = grp.members.clone();
        if grp.copy {
            nodes = vec![root];
        }
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes,
            grid: Some(vec![cdiv(&r, br), cdiv(&c, bc)]),
            args,
            consts: vec![],
            requires: vec![],
            writes: vec![out],
        });
        Ok(())
    }
}
