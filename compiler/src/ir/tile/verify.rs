//! The Tile IR verifier: structural and typing invariants every producer
//! (lowering, generated fused kernels) must keep and every consumer (Target IR,
//! the CPU interpreter) may rely on.
//!
//! * every value has a type, is defined once (op result or region argument),
//!   and is used only where its definition dominates (earlier in the same region
//!   or in an enclosing one);
//! * the kernel body has no arguments and no `Yield`; the regions of `For`,
//!   `While` and `If` end with exactly one `Yield`, consistent with the op's
//!   init values, region arguments and results;
//! * each op's operand and result types follow the rules documented on `OpKind`.

use std::collections::HashSet;

use super::*;

/// Checks `k`; returns one message per violation (empty when valid).
pub fn verify(k: &Kernel) -> Vec<String> {
    let mut v = Verifier {
        k,
        defined: HashSet::new(),
        scopes: vec![HashSet::new()],
        errors: Vec::new(),
    };
    if !k.body.args.is_empty() {
        v.err("the kernel body takes no arguments".to_string());
    }
    v.region_ops(&k.body, None);
    v.errors
}

struct Verifier<'a> {
    k: &'a Kernel,
    /// Every value defined so far (to catch a second definition).
    defined: HashSet<Value>,
    /// The values visible at the current point: one set per open region.
    scopes: Vec<HashSet<Value>>,
    errors: Vec<String>,
}

fn op_name(kind: &OpKind) -> &'static str {
    match kind {
        OpKind::Const(_) => "const",
        OpKind::ProgramId(_) => "program_id",
        OpKind::NumPrograms(_) => "num_programs",
        OpKind::TensorDim { .. } => "dim",
        OpKind::ScalarParam(_) => "param",
        OpKind::Unary { .. } => "unary",
        OpKind::Binary { .. } => "binary",
        OpKind::Select { .. } => "select",
        OpKind::Cast { .. } => "cast",
        OpKind::Splat { .. } => "splat",
        OpKind::Broadcast { .. } => "broadcast",
        OpKind::ExpandDims { .. } => "expand_dims",
        OpKind::Transpose { .. } => "transpose",
        OpKind::Extract { .. } => "extract",
        OpKind::Arange { .. } => "arange",
        OpKind::Load { .. } => "load",
        OpKind::Store { .. } => "store",
        OpKind::AtomicAdd { .. } => "atomic_add",
        OpKind::Dot { .. } => "dot",
        OpKind::Reduce { .. } => "reduce",
        OpKind::For { .. } => "for",
        OpKind::While { .. } => "while",
        OpKind::If { .. } => "if",
        OpKind::Yield(_) => "yield",
    }
}

fn tile_or_scalar(shape: Vec<u32>, dtype: DType) -> Type {
    if shape.is_empty() {
        Type::Scalar(dtype)
    } else {
        Type::Tile { shape, dtype }
    }
}

fn fmt_types(ts: &[Type]) -> String {
    ts.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Verifier<'_> {
    fn err(&mut self, msg: String) {
        self.errors.push(msg);
    }

    fn ty(&self, v: Value) -> Option<&Type> {
        self.k.types.get(v.0 as usize)
    }

    /// Defines `v` in the innermost scope.
    fn define(&mut self, v: Value, what: &str) {
        if self.ty(v).is_none() {
            self.err(format!("{v} ({what}) has no type"));
        }
        if !self.defined.insert(v) {
            self.err(format!("{v} is defined more than once (again by {what})"));
        }
        self.scopes.last_mut().expect("a scope").insert(v);
    }

    /// Checks that `v` is visible here and returns its type.
    fn use_(&mut self, v: Value, what: &str) -> Option<Type> {
        if !self.scopes.iter().any(|s| s.contains(&v)) {
            if self.defined.contains(&v) {
                self.err(format!(
                    "{v} is used by {what} where its definition does not dominate"
                ));
            } else {
                self.err(format!("{v} is used by {what} before it is defined"));
            }
            return None;
        }
        self.ty(v).cloned()
    }

    /// Checks a region's ops. A nested region (`expect_yield` names it) must
    /// end with a `Yield`; the yielded types are returned for the caller's checks.
    fn region_ops(&mut self, r: &Region, expect_yield: Option<&str>) -> Option<Vec<Type>> {
        let mut yielded = None;
        for (i, op) in r.ops.iter().enumerate() {
            let last = i + 1 == r.ops.len();
            if let OpKind::Yield(vs) = &op.kind {
                match expect_yield {
                    None => self.err("`yield` in the kernel body".to_string()),
                    Some(w) if !last => self.err(format!("`yield` before the end of {w}")),
                    Some(_) => {}
                }
                if !op.results.is_empty() {
                    self.err("`yield` defines values".to_string());
                }
                let tys: Vec<Option<Type>> = vs.iter().map(|v| self.use_(*v, "yield")).collect();
                if last {
                    // `None` when an operand was already reported.
                    yielded = tys.into_iter().collect::<Option<Vec<_>>>();
                }
                continue;
            }
            self.op(op);
        }
        if let Some(w) = expect_yield {
            if !matches!(r.ops.last().map(|o| &o.kind), Some(OpKind::Yield(_))) {
                self.err(format!("{w} does not end with `yield`"));
            }
        }
        yielded
    }

    /// A nested region: a new scope with `args` of types `arg_tys` defined.
    fn nested(&mut self, r: &Region, arg_tys: &[Type], what: &str) -> Option<Vec<Type>> {
        self.scopes.push(HashSet::new());
        if r.args.len() != arg_tys.len() {
            self.err(format!(
                "{what} has {} arguments, expected {}",
                r.args.len(),
                arg_tys.len()
            ));
        }
        for (i, a) in r.args.iter().enumerate() {
            self.define(*a, &format!("argument {i} of {what}"));
            if let (Some(t), Some(want)) = (self.ty(*a).cloned(), arg_tys.get(i)) {
                if &t != want {
                    self.err(format!(
                        "argument {a} of {what} has type {t}, expected {want}"
                    ));
                }
            }
        }
        let y = self.region_ops(r, Some(what));
        self.scopes.pop();
        y
    }

    fn check_yield(&mut self, got: Option<Vec<Type>>, want: &[Type], what: &str) {
        if let Some(got) = got {
            if got != want {
                self.err(format!(
                    "{what} yields ({}), expected ({})",
                    fmt_types(&got),
                    fmt_types(want)
                ));
            }
        }
    }

    fn tensor(&mut self, i: usize, what: &str) -> Option<(Vec<Dim>, DType)> {
        match self.k.params.get(i).map(|p| &p.kind) {
            Some(ParamKind::Tensor { dims, dtype }) => Some((dims.clone(), *dtype)),
            Some(ParamKind::Scalar(_)) => {
                self.err(format!("{what}: parameter {i} is not a tensor"));
                None
            }
            None => {
                self.err(format!("{what}: no parameter {i}"));
                None
            }
        }
    }

    /// Checks an access list against tensor `i`; returns the accessed shape
    /// and the tensor's dtype.
    fn access(
        &mut self,
        tensor: usize,
        access: &[Access],
        what: &str,
    ) -> Option<(Vec<u32>, DType)> {
        let mut shape = Vec::new();
        let gather = Access::is_gather(access);
        let mut gather_shape: Option<Vec<u32>> = None;
        for a in access {
            let v = a.value();
            match (a, self.use_(v, what)) {
                (
                    Access::Gather(_),
                    Some(Type::Tile {
                        shape,
                        dtype: DType::I32,
                    }),
                ) => match &gather_shape {
                    Some(s) if *s != shape => self.err(format!(
                        "{what}: gather index {v} has shape {shape:?}, another {s:?}"
                    )),
                    _ => gather_shape = Some(shape),
                },
                (Access::Gather(_), Some(t)) => {
                    self.err(format!("{what}: gather index {v} is {t}, not an i32 tile"))
                }
                (_, Some(t)) if gather => self.err(format!(
                    "{what}: index {v} ({t}) mixes a point or range with gathers"
                )),
                (_, Some(Type::Scalar(d))) if d.is_int() => {}
                (_, Some(t)) => {
                    self.err(format!("{what}: index {v} is {t}, not an integer scalar"))
                }
                (_, None) => {}
            }
            if let Access::Range { len, .. } = a {
                if *len == 0 {
                    self.err(format!("{what}: a range of length 0"));
                }
                shape.push(*len);
            }
        }
        if let Some(s) = gather_shape {
            shape = s;
        }
        let (dims, dtype) = self.tensor(tensor, what)?;
        if dims.len() != access.len() {
            self.err(format!(
                "{what}: {} indices for a tensor of rank {}",
                access.len(),
                dims.len()
            ));
        }
        Some((shape, dtype))
    }

    fn mask(&mut self, mask: Option<Value>, shape: &[u32], what: &str) {
        if let Some(m) = mask {
            if let Some(t) = self.use_(m, what) {
                let want = tile_or_scalar(shape.to_vec(), DType::Bool);
                if t != want {
                    self.err(format!("{what}: mask {m} is {t}, expected {want}"));
                }
            }
        }
    }

    fn op(&mut self, op: &Op) {
        let name = op_name(&op.kind);
        let what = match op.results.first() {
            Some(r) => format!("`{name}` defining {r}"),
            None => format!("`{name}`"),
        };
        // Operands first (they must dominate), then the nested regions, then results.
        let expected: Option<Vec<Type>> = self.op_types(op, &what);
        for r in &op.results {
            self.define(*r, &what);
        }
        if let Some(expected) = expected {
            let got: Vec<Option<Type>> = op.results.iter().map(|r| self.ty(*r).cloned()).collect();
            if got.len() != expected.len() {
                self.err(format!(
                    "{what} has {} results, expected {}",
                    got.len(),
                    expected.len()
                ));
            } else {
                for ((r, g), e) in op.results.iter().zip(got).zip(&expected) {
                    if let Some(g) = g {
                        if &g != e {
                            self.err(format!("{what}: result {r} has type {g}, expected {e}"));
                        }
                    }
                }
            }
        }
    }

    /// Checks the operands (and regions) of `op`; returns the result types it
    /// must have, or `None` when an error already made them unknowable.
    fn op_types(&mut self, op: &Op, what: &str) -> Option<Vec<Type>> {
        let k = self.k;
        match &op.kind {
            OpKind::Const(c) => {
                let t = op.results.first().and_then(|r| self.ty(*r)).cloned();
                let Some(t) = t else {
                    return Some(vec![Type::Scalar(DType::I32)]);
                };
                let d = t.dtype();
                let ok = match c {
                    Constant::Int(_) => d.is_int(),
                    Constant::Float(_) => d.is_float(),
                    Constant::Bool(_) => d == DType::Bool,
                };
                if !ok || !matches!(t, Type::Scalar(_)) {
                    self.err(format!("{what}: constant {c} cannot have type {t}"));
                    return None;
                }
                Some(vec![t])
            }
            OpKind::ProgramId(a) | OpKind::NumPrograms(a) => {
                if *a > 2 {
                    self.err(format!("{what}: axis {a} is not 0, 1 or 2"));
                }
                Some(vec![Type::Scalar(DType::I32)])
            }
            OpKind::TensorDim { param, axis } => {
                let (dims, _) = self.tensor(*param, what)?;
                if *axis >= dims.len() {
                    self.err(format!(
                        "{what}: axis {axis} of a rank-{} tensor",
                        dims.len()
                    ));
                }
                Some(vec![Type::Scalar(DType::I32)])
            }
            OpKind::ScalarParam(i) => match k.params.get(*i).map(|p| &p.kind) {
                Some(ParamKind::Scalar(d)) => Some(vec![Type::Scalar(*d)]),
                _ => {
                    self.err(format!("{what}: parameter {i} is not a scalar parameter"));
                    None
                }
            },
            OpKind::Unary { op: u, x } => {
                let t = self.use_(*x, what)?;
                let d = t.dtype();
                let ok = match u {
                    UnaryOp::Not => d == DType::Bool,
                    UnaryOp::Invert => d.is_int(),
                    UnaryOp::Neg | UnaryOp::Abs => d.is_int() || d.is_float(),
                    _ => d.is_float(),
                };
                if !ok {
                    self.err(format!("{what}: `{}` of {t}", u.name()));
                }
                Some(vec![t])
            }
            OpKind::Binary { op: b, a, b: bv } => {
                let ta = self.use_(*a, what);
                let tb = self.use_(*bv, what);
                let (ta, tb) = (ta?, tb?);
                if ta != tb {
                    self.err(format!("{what}: operand types differ: {ta} and {tb}"));
                    return None;
                }
                let d = ta.dtype();
                let ok = match b {
                    BinaryOp::Div => d.is_float(),
                    BinaryOp::Pow => d.is_float() || d.is_int(),
                    BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => d.is_int() || d == DType::Bool,
                    // Bools order False < True.
                    BinaryOp::Eq
                    | BinaryOp::Ne
                    | BinaryOp::Lt
                    | BinaryOp::Le
                    | BinaryOp::Gt
                    | BinaryOp::Ge
                    | BinaryOp::Max
                    | BinaryOp::Min => true,
                    _ => d.is_int() || d.is_float(),
                };
                if !ok {
                    self.err(format!("{what}: `{}` of {ta}", b.name()));
                }
                if b.is_comparison() {
                    Some(vec![tile_or_scalar(ta.shape().to_vec(), DType::Bool)])
                } else {
                    Some(vec![ta])
                }
            }
            OpKind::Select { cond, a, b } => {
                let tc = self.use_(*cond, what);
                let ta = self.use_(*a, what);
                let tb = self.use_(*b, what);
                let (tc, ta, tb) = (tc?, ta?, tb?);
                if ta != tb {
                    self.err(format!("{what}: operand types differ: {ta} and {tb}"));
                    return None;
                }
                let want = tile_or_scalar(ta.shape().to_vec(), DType::Bool);
                if tc != want {
                    self.err(format!("{what}: condition is {tc}, expected {want}"));
                }
                Some(vec![ta])
            }
            OpKind::Cast { x, to } => {
                let t = self.use_(*x, what)?;
                Some(vec![tile_or_scalar(t.shape().to_vec(), *to)])
            }
            OpKind::Splat { x, shape } => {
                let t = self.use_(*x, what)?;
                if !matches!(t, Type::Scalar(_)) {
                    self.err(format!("{what}: splat of {t}, not a scalar"));
                    return None;
                }
                if shape.is_empty() || shape.contains(&0) {
                    self.err(format!("{what}: bad shape {shape:?}"));
                    return None;
                }
                Some(vec![tile_or_scalar(shape.clone(), t.dtype())])
            }
            OpKind::Broadcast { x, shape } => {
                let t = self.use_(*x, what)?;
                let from = t.shape();
                if from.len() != shape.len() || from.is_empty() {
                    self.err(format!(
                        "{what}: broadcast of {t} to rank {} (ranks must be equal and nonzero)",
                        shape.len()
                    ));
                    return None;
                }
                for (i, (f, s)) in from.iter().zip(shape).enumerate() {
                    if f != s && *f != 1 {
                        self.err(format!(
                            "{what}: axis {i} of {t} has size {f}, broadcast only from size 1 (to {s})"
                        ));
                    }
                }
                Some(vec![tile_or_scalar(shape.clone(), t.dtype())])
            }
            OpKind::ExpandDims { x, axis } => {
                let t = self.use_(*x, what)?;
                let mut s = t.shape().to_vec();
                if *axis > s.len() {
                    self.err(format!("{what}: axis {axis} out of range for {t}"));
                    return None;
                }
                s.insert(*axis, 1);
                Some(vec![tile_or_scalar(s, t.dtype())])
            }
            OpKind::Transpose { x } => {
                let t = self.use_(*x, what)?;
                let s = t.shape();
                if s.len() != 2 {
                    self.err(format!("{what}: transpose of {t}, not a 2-D tile"));
                    return None;
                }
                Some(vec![tile_or_scalar(vec![s[1], s[0]], t.dtype())])
            }
            OpKind::Extract {
                x,
                axis,
                start,
                len,
                drop,
            } => {
                let t = self.use_(*x, what)?;
                let mut s = t.shape().to_vec();
                let n = s.get(*axis).copied();
                match n {
                    Some(n) if *len > 0 && (*start as u64 + *len as u64) <= n as u64 => {}
                    _ => {
                        self.err(format!(
                            "{what}: elements {start} .. {start} + {len} of axis {axis} of {t}"
                        ));
                        return None;
                    }
                }
                if *drop {
                    if *len != 1 {
                        self.err(format!("{what}: drops an axis of length {len}"));
                    }
                    s.remove(*axis);
                } else {
                    s[*axis] = *len;
                }
                Some(vec![tile_or_scalar(s, t.dtype())])
            }
            OpKind::Arange { start, len } => {
                let t = self.use_(*start, what)?;
                if t != Type::Scalar(DType::I32) {
                    self.err(format!("{what}: start is {t}, expected i32"));
                }
                if *len == 0 {
                    self.err(format!("{what}: length 0"));
                    return None;
                }
                Some(vec![tile_or_scalar(vec![*len], DType::I32)])
            }
            OpKind::Load {
                tensor,
                access,
                mask,
                other,
            } => {
                let (shape, dtype) = self.access(*tensor, access, what)?;
                self.mask(*mask, &shape, what);
                let ok = match other {
                    Constant::Int(_) => dtype.is_int() || dtype.is_float(),
                    Constant::Float(_) => dtype.is_float(),
                    Constant::Bool(_) => dtype == DType::Bool,
                };
                if !ok {
                    self.err(format!("{what}: `other` {other} for a {dtype} tensor"));
                }
                Some(vec![tile_or_scalar(shape, dtype)])
            }
            OpKind::Store {
                tensor,
                access,
                value,
                mask,
            }
            | OpKind::AtomicAdd {
                tensor,
                access,
                value,
                mask,
            } => {
                let acc = self.access(*tensor, access, what);
                let tv = self.use_(*value, what);
                let (shape, dtype) = acc?;
                self.mask(*mask, &shape, what);
                let want = tile_or_scalar(shape, dtype);
                if let Some(tv) = tv {
                    if tv != want {
                        self.err(format!("{what}: stored value is {tv}, expected {want}"));
                    }
                }
                if matches!(op.kind, OpKind::AtomicAdd { .. })
                    && !(dtype.is_float() || dtype.is_int())
                {
                    self.err(format!("{what}: atomic add on a {dtype} tensor"));
                }
                Some(vec![])
            }
            OpKind::Dot {
                a,
                b,
                acc,
                precision,
            } => {
                let ta = self.use_(*a, what);
                let tb = self.use_(*b, what);
                let tacc = acc.and_then(|c| self.use_(c, what));
                let (ta, tb) = (ta?, tb?);
                let (sa, sb) = (ta.shape(), tb.shape());
                if sa.len() != 2 || sb.len() != 2 {
                    self.err(format!("{what}: dot of {ta} and {tb} (both must be 2-D)"));
                    return None;
                }
                if sa[1] != sb[0] {
                    self.err(format!("{what}: inner dims differ: {ta} x {tb}"));
                }
                if ta.dtype() != tb.dtype() {
                    self.err(format!("{what}: operand dtypes differ: {ta} x {tb}"));
                }
                if *precision == Precision::Tf32 && ta.dtype() != DType::F32 {
                    self.err(format!("{what}: tf32 precision needs f32 inputs, got {ta}"));
                }
                let od = if ta.dtype() == DType::F64 {
                    DType::F64
                } else {
                    DType::F32
                };
                let out = tile_or_scalar(vec![sa[0], sb[1]], od);
                if let Some(tacc) = tacc {
                    if tacc != out {
                        self.err(format!("{what}: accumulator is {tacc}, expected {out}"));
                    }
                }
                Some(vec![out])
            }
            OpKind::Reduce {
                op: _,
                x,
                axis,
                keepdims,
            } => {
                let t = self.use_(*x, what)?;
                let mut s = t.shape().to_vec();
                if *axis >= s.len() {
                    self.err(format!("{what}: axis {axis} out of range for {t}"));
                    return None;
                }
                if *keepdims {
                    s[*axis] = 1;
                } else {
                    s.remove(*axis);
                }
                Some(vec![tile_or_scalar(s, t.dtype())])
            }
            OpKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let tl = self.use_(*lo, what);
                let th = self.use_(*hi, what);
                let ts = self.use_(*step, what);
                let inits: Vec<Option<Type>> = init.iter().map(|v| self.use_(*v, what)).collect();
                let inits: Option<Vec<Type>> = inits.into_iter().collect();
                let (tl, th, ts, inits) = (tl?, th?, ts?, inits?);
                if !matches!(tl, Type::Scalar(d) if d.is_int()) || th != tl || ts != tl {
                    self.err(format!(
                        "{what}: bounds must be integer scalars of one type, got {tl}, {th}, {ts}"
                    ));
                }
                let mut args = vec![tl];
                args.extend(inits.iter().cloned());
                let y = self.nested(body, &args, &format!("the body of {what}"));
                self.check_yield(y, &inits, &format!("the body of {what}"));
                Some(inits)
            }
            OpKind::While { init, cond, body } => {
                let inits: Vec<Option<Type>> = init.iter().map(|v| self.use_(*v, what)).collect();
                let inits: Vec<Type> = inits.into_iter().collect::<Option<Vec<_>>>()?;
                let y = self.nested(cond, &inits, &format!("the condition of {what}"));
                self.check_yield(
                    y,
                    &[Type::Scalar(DType::Bool)],
                    &format!("the condition of {what}"),
                );
                let y = self.nested(body, &inits, &format!("the body of {what}"));
                self.check_yield(y, &inits, &format!("the body of {what}"));
                Some(inits)
            }
            OpKind::If {
                cond,
                then,
                otherwise,
            } => {
                if let Some(tc) = self.use_(*cond, what) {
                    if tc != Type::Scalar(DType::Bool) {
                        self.err(format!("{what}: condition is {tc}, expected bool"));
                    }
                }
                let results: Option<Vec<Type>> =
                    op.results.iter().map(|r| self.ty(*r).cloned()).collect();
                let yt = self.nested(then, &[], &format!("the then-region of {what}"));
                let yo = self.nested(otherwise, &[], &format!("the else-region of {what}"));
                let results = results?;
                self.check_yield(yt, &results, &format!("the then-region of {what}"));
                self.check_yield(yo, &results, &format!("the else-region of {what}"));
                Some(results)
            }
            OpKind::Yield(_) => unreachable!("yields are handled by region_ops"),
        }
    }
}
