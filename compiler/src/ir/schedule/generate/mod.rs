//! Generated kernels of the launch plan, built directly as Tile IR: fused
//! elementwise groups (flat `[R, C]` and every-axis variants), copies, transposes,
//! reductions, softmax, layer/RMS norms and batched gemms.

use std::collections::HashMap;

use super::*;

/// The body of a generated loop over K: (builder, induction variable, the loaded
/// tile in f32, carried values) -> the values to carry on.
type LoopBody<'a> = dyn FnMut(&mut KernelBuilder, Value, Value, &[Value]) -> Vec<Value> + 'a;

/// Builds one generated kernel in Tile IR.
struct KernelBuilder {
    ops: Vec<Op>,
    types: Vec<Type>,
    params: Vec<tile::Param>,
    span: Span,
}

impl KernelBuilder {
    fn emit(&mut self, kind: OpKind, ty: Type) -> Value {
        let v = Value(self.types.len() as u32);
        self.types.push(ty);
        self.ops.push(Op {
            results: vec![v],
            kind,
            span: self.span,
        });
        v
    }

    fn ty(&self, v: Value) -> &Type {
        &self.types[v.0 as usize]
    }

    /// A value defined by no op (a region argument, or a result pushed by hand).
    fn fresh(&mut self, ty: Type) -> Value {
        let v = Value(self.types.len() as u32);
        self.types.push(ty);
        v
    }

    fn cnst(&mut self, c: Constant, dtype: DType) -> Value {
        self.emit(OpKind::Const(constant_of(dtype, &c)), Type::Scalar(dtype))
    }

    fn tile_ty(shape: &[u32], dtype: DType) -> Type {
        Type::Tile {
            shape: shape.to_vec(),
            dtype,
        }
    }

    fn cast(&mut self, x: Value, to: DType) -> Value {
        let t = self.ty(x).clone();
        if t.dtype() == to {
            return x;
        }
        let ty = match t {
            Type::Scalar(_) => Type::Scalar(to),
            Type::Tile { shape, .. } => Type::Tile { shape, dtype: to },
        };
        self.emit(OpKind::Cast { x, to }, ty)
    }

    fn splat(&mut self, x: Value, shape: &[u32]) -> Value {
        let dt = self.ty(x).dtype();
        self.emit(
            OpKind::Splat {
                x,
                shape: shape.to_vec(),
            },
            Self::tile_ty(shape, dt),
        )
    }

    fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        let t = self.ty(a).clone();
        let ty = if op.is_comparison() {
            match t {
                Type::Scalar(_) => Type::Scalar(DType::Bool),
                Type::Tile { .. } => Self::tile_ty(t.shape(), DType::Bool),
            }
        } else {
            t
        };
        self.emit(OpKind::Binary { op, a, b }, ty)
    }

    fn unary(&mut self, op: UnaryOp, x: Value) -> Value {
        let t = self.ty(x).clone();
        self.emit(OpKind::Unary { op, x }, t)
    }
}

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

/// Computes the members of a fused group on `shape` tiles, after its leaves
/// (in `vals` and `scalars`).
fn eval_members(
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

pub(super) struct Group {
    pub(super) members: Vec<NodeId>,
    pub(super) root: NodeId,
    /// The root is a leaf (a copy kernel: load, cast, store).
    pub(super) copy: bool,
}

fn next_pow2(x: i64) -> i64 {
    let mut p = 1;
    while p < x && p < (1 << 20) {
        p *= 2;
    }
    p
}

impl Lower<'_> {
    /// Generates the fused kernel of a group and launches it, writing `out`.
    pub(super) fn fused(&mut self, grp: &Group, out: BufId) -> R<()> {
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

impl Lower<'_> {
    /// A generated kernel swapping the last two axes: one program writes a
    /// `[32, 32]` tile of `out[z]` from the transposed `[32, 32]` tile of `x[z]`.
    /// Every tile of every batch is one program of grid axis 0 (split back in
    /// the kernel): axes 1 and 2 allow only 65535 programs, which a tensor of
    /// more than about 2M rows or columns (or 65535 batches) would pass.
    pub(super) fn transpose(&mut self, n: NodeId, out: BufId) -> R<()> {
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

/// Where one axis of a gather copy's source comes from.
pub(super) enum SrcAxis {
    /// Out axis `k`, shifted by `offset` (an integer host scalar; when `wrap`, a
    /// negative offset counts from the end of the source axis).
    Out {
        k: usize,
        offset: ScalarExpr,
        wrap: bool,
    },
    /// One index (an integer host scalar, negative counts from the end).
    Fixed(ScalarExpr),
}

impl Lower<'_> {
    /// A copy `out[i..] = x[f(i..)]` where every source axis is an out axis
    /// shifted by an offset or a fixed index: permutations (`transpose` of any
    /// axes) and subscripts (`x[i]`, `x[a:b, 2]`). The out's leading axes are
    /// flattened onto grid axis 0 and split back per program; a program copies a
    /// `[BC]` run of the out's last axis, read from whichever source axis it maps
    /// to. A rank-0 result is copied as `[1]`. Loads are bounds-safe: an index
    /// out of range at run time reads zeros.
    pub(super) fn gather_copy(
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

/// The accumulator dtype of a matmul producing `dt`: f64 for f64, f32 for
/// other floats, the integer's own width for integers (at least i32), i32
/// for bool.
pub(super) fn acc_dtype(dt: DType) -> DType {
    match dt {
        DType::F64 => DType::F64,
        DType::I64 => DType::I64,
        DType::U32 => DType::U32,
        d if d.is_int() || d == DType::Bool => DType::I32,
        _ => DType::F32,
    }
}

/// The identity of a reduction, as a constant of `dtype`.
fn neutral(op: ReduceKind, dtype: DType) -> Constant {
    let (lo, hi): (i64, i64) = match dtype {
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::I16 => (i16::MIN as i64, i16::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::I64 => (i64::MIN, i64::MAX),
        DType::U8 => (0, u8::MAX as i64),
        DType::U32 => (0, u32::MAX as i64),
        _ => (0, 1),
    };
    match (op, dtype) {
        (ReduceKind::Sum | ReduceKind::Mean, d) => zero_of(d),
        (ReduceKind::Max, DType::Bool) => Constant::Bool(false),
        (ReduceKind::Min, DType::Bool) => Constant::Bool(true),
        (ReduceKind::Max, d) if d.is_float() => Constant::Float(f64::NEG_INFINITY),
        (ReduceKind::Min, d) if d.is_float() => Constant::Float(f64::INFINITY),
        (ReduceKind::Max, _) => Constant::Int(lo),
        (ReduceKind::Min, _) => Constant::Int(hi),
    }
}

impl Lower<'_> {
    /// A generated reduction of one axis (or of everything): `x` is viewed as
    /// `[R, K, C]` (K the reduced extent, R and C the products of the dims before
    /// and after it), one program reduces `K` for one `r` and a block of `C`, looping over `K` in chunks; out-of-bounds lanes read the
    /// reduction's identity. Accumulates floats in f32.
    pub(super) fn reduce_generated(&mut self, n: NodeId, out: BufId) -> R<()> {
        let g = self.g;
        let NodeKind::Reduce { op, x, axis, .. } = g.node(n).kind else {
            unreachable!("a reduction")
        };
        let xd = g.ty(x).dims().to_vec();
        let overflow = || self.unsupported(n, "a dim product that overflows");
        let (a, k, b) = match axis {
            Some(j) => (
                product(&xd[..j]).ok_or_else(overflow)?,
                xd[j].clone(),
                product(&xd[j + 1..]).ok_or_else(overflow)?,
            ),
            None => (
                Dim::constant(1),
                product(&xd).ok_or_else(overflow)?,
                Dim::constant(1),
            ),
        };
        let bx = self.buf(x, n)?;
        let bdt = self.buffers[bx.0 as usize].dtype;
        let odt = self.buffers[out.0 as usize].dtype;
        let xdt = g.ty(x).dtype().unwrap_or(bdt);
        let ndt = g.ty(n).dtype().unwrap_or(odt);
        let acc = if ndt == DType::F64 {
            DType::F64
        } else if ndt.is_float() {
            DType::F32
        } else {
            ndt
        };
        let bc = b.as_const().map(|b| next_pow2(b).min(32)).unwrap_or(32);
        let mut bk = (1024 / bc).max(1);
        if let Some(kc) = k.as_const() {
            bk = bk.min(next_pow2(kc).max(1));
        }
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
                        dims: vec![dim_of(&a, "R"), dim_of(&k, "K"), dim_of(&b, "C")],
                        dtype: bdt,
                    },
                },
                tile::Param {
                    name: "out".into(),
                    kind: ParamKind::Tensor {
                        dims: vec![dim_of(&a, "R"), dim_of(&b, "C")],
                        dtype: odt,
                    },
                },
            ],
            span: g.node(n).span,
        };
        let (bc32, bk32) = (bc as u32, bk as u32);
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let pid1 = kb.emit(OpKind::ProgramId(1), Type::Scalar(DType::I32));
        let kbc = kb.cnst(Constant::Int(bc), DType::I32);
        let c0 = kb.binary(BinaryOp::Mul, pid1, kbc);
        let id = kb.emit(OpKind::Const(neutral(op, acc)), Type::Scalar(acc));
        let init = kb.splat(id, &[bc32]);
        let lo = kb.cnst(Constant::Int(0), DType::I32);
        let hi = match k.as_const() {
            Some(kc) => kb.cnst(Constant::Int(kc), DType::I32),
            None => kb.emit(
                OpKind::TensorDim { param: 0, axis: 1 },
                Type::Scalar(DType::I32),
            ),
        };
        let step = kb.cnst(Constant::Int(bk), DType::I32);
        let iv = kb.fresh(Type::Scalar(DType::I32));
        let acc_in = kb.fresh(KernelBuilder::tile_ty(&[bc32], acc));
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
                other: neutral(op, bdt),
            },
            KernelBuilder::tile_ty(&[bk32, bc32], bdt),
        );
        let v = kb.cast(ld, xdt);
        let v = kb.cast(v, acc);
        let (rop, bop) = match op {
            ReduceKind::Sum | ReduceKind::Mean => (tile::ReduceOp::Sum, BinaryOp::Add),
            ReduceKind::Max => (tile::ReduceOp::Max, BinaryOp::Max),
            ReduceKind::Min => (tile::ReduceOp::Min, BinaryOp::Min),
        };
        let r = kb.emit(
            OpKind::Reduce {
                op: rop,
                x: v,
                axis: 0,
                keepdims: false,
            },
            KernelBuilder::tile_ty(&[bc32], acc),
        );
        let next = kb.binary(bop, acc_in, r);
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Yield(vec![next]),
            span: kb.span,
        });
        let body_ops = std::mem::replace(&mut kb.ops, outer);
        let total = kb.fresh(KernelBuilder::tile_ty(&[bc32], acc));
        kb.ops.push(Op {
            results: vec![total],
            kind: OpKind::For {
                lo,
                hi,
                step,
                init: vec![init],
                body: Region {
                    args: vec![iv, acc_in],
                    ops: body_ops,
                },
            },
            span: kb.span,
        });
        let mut res = total;
        if op == ReduceKind::Mean {
            let kf = kb.cast(hi, acc);
            let kf = kb.splat(kf, &[bc32]);
            res = kb.binary(BinaryOp::Div, res, kf);
        }
        let res = kb.cast(res, ndt);
        let res = kb.cast(res, odt);
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: 1,
                access: vec![
                    Access::Point(pid0),
                    Access::Range {
                        start: c0,
                        len: bc32,
                    },
                ],
                value: res,
                mask: None,
            },
            span: kb.span,
        });
        let name = format!("{}_reduce{}", g.name, self.kernels.len());
        self.kernels.push(Kernel {
            name,
            specialization: vec![],
            divisibility: vec![],
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
            grid: Some(vec![ScalarExpr::Index(a.clone()), cdiv(&b, bc)]),
            args: vec![
                (
                    "x0".into(),
                    Arg::Buffer {
                        buf: bx,
                        dims: vec![a.clone(), k, b.clone()],
                    },
                ),
                (
                    "out".into(),
                    Arg::Buffer {
                        buf: out,
                        dims: vec![a, b],
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

impl Lower<'_> {
    /// A generated softmax over any axis and float dtype: `x` viewed as
    /// `[R, K, C]` (K the softmax axis), one program handles one `r` and a block
    /// of `C` in three loops over `K`: the max, the sum of `exp(x - max)`, and the
    /// normalised values (f32 arithmetic; out-of-bounds lanes read -inf, which
    /// adds nothing and is never stored).
    pub(super) fn softmax_generated(&mut self, n: NodeId, out: BufId) -> R<()> {
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

impl Lower<'_> {
    /// Whether a norm can run as its std.nn row kernel: f32 input, result and
    /// weights in f32 buffers, the weights it takes present, and a row that is not
    /// known to exceed the kernel's 1024.
    pub(super) fn norm_fits_std(&self, n: NodeId) -> bool {
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
    pub(super) fn norm_generated(&mut self, n: NodeId, out: BufId) -> R<()> {
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

impl Lower<'_> {
    /// A generated batched gemm for the matmuls no stdlib gemm covers (bf16 or
    /// f32 with batch dims, broadcast batch dims): operands padded to one rank
    /// (`da`, `db`: `[batch.., M, K]`, `[batch.., K, N]`), one program per
    /// `(batch x M tile, N tile)`, a loop over K with `dot` into an f32
    /// accumulator, written to the f32 buffer `c`; a batch axis an operand lacks
    /// (size 1) reads index 0.
    pub(super) fn matmul_generated(
        &mut self,
        n: NodeId,
        da: &[Dim],
        db: &[Dim],
        ba: BufId,
        bb: BufId,
        c: BufId,
    ) -> R<()> {
        let g = self.g;
        let nb = da.len().max(db.len()) - 2;
        let pad = |d: &[Dim]| {
            let mut p = vec![Dim::constant(1); nb + 2 - d.len()];
            p.extend(d.iter().cloned());
            p
        };
        let (pa, pb) = (pad(da), pad(db));
        let batch: Vec<Dim> = (0..nb)
            .map(|k| {
                if pa[k].is_one() {
                    pb[k].clone()
                } else {
                    pa[k].clone()
                }
            })
            .collect();
        let (m, kd, nn) = (pa[nb].clone(), pa[nb + 1].clone(), pb[nb + 1].clone());
        let z = product(&batch).ok_or_else(|| self.unsupported(n, "batch dims"))?;
        let NodeKind::MatMul { a, b, tf32 } = g.node(n).kind else {
            unreachable!("a matmul")
        };
        let dt = g.ty(n).dtype().unwrap_or(DType::F32);
        let (adt, bdt) = (
            self.buffers[ba.0 as usize].dtype,
            self.buffers[bb.0 as usize].dtype,
        );
        // Integers accumulate exactly in their own width (at least i32), one
        // rank-1 update per step of K; floats use `dot` with an f32 accumulator.
        let acc_dt = acc_dtype(dt);
        let int = dt.is_int();
        let (bm, bn, bk) = if int {
            (32i64, 32i64, 1i64)
        } else {
            (64i64, 64i64, 32i64)
        };
        let (bm32, bn32, bk32) = (bm as u32, bn as u32, bk as u32);
        let dim_of = |d: &Dim, name: String| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name),
        };
        let operand_dims = |p: &[Dim], inner: [(&Dim, &str); 2]| -> Vec<tile::Dim> {
            let mut v: Vec<tile::Dim> = (0..nb)
                .map(|k| {
                    if p[k].is_one() {
                        tile::Dim::Static(1)
                    } else {
                        dim_of(&p[k], format!("Z{k}"))
                    }
                })
                .collect();
            v.push(dim_of(inner[0].0, inner[0].1.to_string()));
            v.push(dim_of(inner[1].0, inner[1].1.to_string()));
            v
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![
                tile::Param {
                    name: "A".into(),
                    kind: ParamKind::Tensor {
                        dims: operand_dims(&pa, [(&m, "M"), (&kd, "K")]),
                        dtype: adt,
                    },
                },
                tile::Param {
                    name: "B".into(),
                    kind: ParamKind::Tensor {
                        dims: operand_dims(&pb, [(&kd, "K"), (&nn, "N")]),
                        dtype: bdt,
                    },
                },
                tile::Param {
                    name: "C".into(),
                    kind: ParamKind::Tensor {
                        dims: operand_dims(&batch, [(&m, "M"), (&nn, "N")]),
                        dtype: acc_dt,
                    },
                },
            ],
            span: g.node(n).span,
        };
        let mut args: Vec<(String, Arg)> = vec![
            (
                "A".into(),
                Arg::Buffer {
                    buf: ba,
                    dims: pa.clone(),
                },
            ),
            (
                "B".into(),
                Arg::Buffer {
                    buf: bb,
                    dims: pb.clone(),
                },
            ),
            ("C".into(), {
                let mut d = batch.clone();
                d.push(m.clone());
                d.push(nn.clone());
                Arg::Buffer { buf: c, dims: d }
            }),
        ];
        let value_of = |kb: &mut KernelBuilder,
                        args: &mut Vec<(String, Arg)>,
                        d: &Dim,
                        name: String| match d.as_const() {
            Some(v) => kb.cnst(Constant::Int(v), DType::I32),
            None => {
                let idx = kb.params.len();
                kb.params.push(tile::Param {
                    name: name.clone(),
                    kind: ParamKind::Scalar(DType::I32),
                });
                args.push((name, Arg::Scalar(ScalarExpr::Index(d.clone()))));
                kb.emit(OpKind::ScalarParam(idx), Type::Scalar(DType::I32))
            }
        };
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let pid1 = kb.emit(OpKind::ProgramId(1), Type::Scalar(DType::I32));
        let kbm = kb.cnst(Constant::Int(bm), DType::I32);
        let kbn = kb.cnst(Constant::Int(bn), DType::I32);
        let mv = value_of(&mut kb, &mut args, &m, "m".into());
        let bm1 = kb.cnst(Constant::Int(bm - 1), DType::I32);
        let t = kb.binary(BinaryOp::Add, mv, bm1);
        let m_tiles = kb.binary(BinaryOp::FloorDiv, t, kbm);
        let zi = kb.binary(BinaryOp::FloorDiv, pid0, m_tiles);
        let mt = kb.binary(BinaryOp::Mod, pid0, m_tiles);
        let m0 = kb.binary(BinaryOp::Mul, mt, kbm);
        let n0 = kb.binary(BinaryOp::Mul, pid1, kbn);
        let zero = kb.cnst(Constant::Int(0), DType::I32);
        let mut index = vec![zero; nb];
        let mut rest = zi;
        for k in (0..nb).rev() {
            let dk = value_of(&mut kb, &mut args, &batch[k], format!("z{k}"));
            index[k] = kb.binary(BinaryOp::Mod, rest, dk);
            rest = kb.binary(BinaryOp::FloorDiv, rest, dk);
        }
        let points = |p: &[Dim]| -> Vec<Access> {
            (0..nb)
                .map(|k| Access::Point(if p[k].is_one() { zero } else { index[k] }))
                .collect()
        };
        let f0 = kb.cnst(zero_of(acc_dt), acc_dt);
        let acc0 = kb.splat(f0, &[bm32, bn32]);
        let lo = kb.cnst(Constant::Int(0), DType::I32);
        let hi = value_of(&mut kb, &mut args, &kd, "k".into());
        let step = kb.cnst(Constant::Int(bk), DType::I32);
        let iv = kb.fresh(Type::Scalar(DType::I32));
        let acc_in = kb.fresh(KernelBuilder::tile_ty(&[bm32, bn32], acc_dt));
        let outer = std::mem::take(&mut kb.ops);
        let mut acc_a = points(&pa);
        acc_a.push(Access::Range {
            start: m0,
            len: bm32,
        });
        acc_a.push(Access::Range {
            start: iv,
            len: bk32,
        });
        let ta = kb.emit(
            OpKind::Load {
                tensor: 0,
                access: acc_a,
                mask: None,
                other: zero_of(adt),
            },
            KernelBuilder::tile_ty(&[bm32, bk32], adt),
        );
        let mut acc_b = points(&pb);
        acc_b.push(Access::Range {
            start: iv,
            len: bk32,
        });
        acc_b.push(Access::Range {
            start: n0,
            len: bn32,
        });
        let tb = kb.emit(
            OpKind::Load {
                tensor: 1,
                access: acc_b,
                mask: None,
                other: zero_of(bdt),
            },
            KernelBuilder::tile_ty(&[bk32, bn32], bdt),
        );
        // Operands at their graph dtypes, then both at the product's.
        let ta = kb.cast(ta, g.ty(a).dtype().unwrap_or(adt));
        let ta = kb.cast(ta, dt);
        let tb = kb.cast(tb, g.ty(b).dtype().unwrap_or(bdt));
        let tb = kb.cast(tb, dt);
        let next = if int {
            // acc += a[:, k] * b[k, :], the `[BM, 1]` and `[1, BN]` tiles broadcast.
            let ta = kb.cast(ta, acc_dt);
            let tb = kb.cast(tb, acc_dt);
            let full = KernelBuilder::tile_ty(&[bm32, bn32], acc_dt);
            let ta = kb.emit(
                OpKind::Broadcast {
                    x: ta,
                    shape: vec![bm32, bn32],
                },
                full.clone(),
            );
            let tb = kb.emit(
                OpKind::Broadcast {
                    x: tb,
                    shape: vec![bm32, bn32],
                },
                full,
            );
            let prod = kb.binary(BinaryOp::Mul, ta, tb);
            kb.binary(BinaryOp::Add, acc_in, prod)
        } else {
            kb.emit(
                OpKind::Dot {
                    a: ta,
                    b: tb,
                    acc: Some(acc_in),
                    precision: if tf32 && adt == DType::F32 {
                        tile::Precision::Tf32
                    } else {
                        tile::Precision::Ieee
                    },
                },
                KernelBuilder::tile_ty(&[bm32, bn32], acc_dt),
            )
        };
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Yield(vec![next]),
            span: kb.span,
        });
        let body_ops = std::mem::replace(&mut kb.ops, outer);
        let total = kb.fresh(KernelBuilder::tile_ty(&[bm32, bn32], acc_dt));
        kb.ops.push(Op {
            results: vec![total],
            kind: OpKind::For {
                lo,
                hi,
                step,
                init: vec![acc0],
                body: Region {
                    args: vec![iv, acc_in],
                    ops: body_ops,
                },
            },
            span: kb.span,
        });
        let mut acc_c: Vec<Access> = index.iter().map(|i| Access::Point(*i)).collect();
        acc_c.push(Access::Range {
            start: m0,
            len: bm32,
        });
        acc_c.push(Access::Range {
            start: n0,
            len: bn32,
        });
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: 2,
                access: acc_c,
                value: total,
                mask: None,
            },
            span: kb.span,
        });
        let name = format!("{}_matmul{}", g.name, self.kernels.len());
        self.kernels.push(Kernel {
            name,
            specialization: vec![],
            divisibility: vec![],
            params: kb.params,
            num_warps: 4,
            num_stages: 1,
            body: Region {
                args: vec![],
                ops: kb.ops,
            },
            types: kb.types,
        });
        let rows = match (z.as_const(), m.as_const()) {
            (Some(zc), Some(mc)) => ScalarExpr::Index(Dim::constant(zc * ((mc + bm - 1) / bm))),
            _ => ScalarExpr::Binary(
                BinaryOp::Mul,
                Box::new(ScalarExpr::Index(z)),
                Box::new(cdiv(&m, bm)),
            ),
        };
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes: vec![n],
            grid: Some(vec![rows, cdiv(&nn, bn)]),
            args,
            consts: vec![],
            requires: vec![],
            writes: vec![c],
        });
        Ok(())
    }
}
