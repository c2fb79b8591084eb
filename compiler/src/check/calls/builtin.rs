//! Builtin calls and their typing rules: creation, elementwise math,
//! reductions, `print`, `.to()` casts.

use super::*;

impl Checker<'_> {
    pub(super) fn builtin(&mut self, id: Builtin, args: &[ArgV], span: Span) -> Val {
        let b = id.info();
        match b.ctx {
            Ctx::Session if !self.top_level => {
                let place = if self.in_kernel {
                    "a kernel"
                } else {
                    "a function"
                };
                self.report(
                    Diagnostic::new(
                        "E0725",
                        span,
                        format!("`{}` is a session builtin and cannot be used inside {place}", b.name),
                    )
                    .with_help(format!(
                        "{} only run in top-level statements (`tessera run`, `tessera repl`); return the value and use it there",
                        builtins::session_builtins()
                    )),
                );
                return Val::err();
            }
            Ctx::Session if id == B::Print => return self.print(args, span),
            // `arange(n)` at top level makes a tensor on the host.
            Ctx::Kernel if !self.in_kernel && self.top_level && id == B::Arange => {
                return self.session_arange(args, span)
            }
            Ctx::Kernel if !self.in_kernel => {
                self.report(
                    Diagnostic::new("E0503", span, format!("`{}` can only be used inside a `@kernel`", b.name))
                        .with_help("mark the function `@kernel(...)`, or use whole-tensor operations here (matmul, softmax, reductions with dim=)"),
                );
                return Val::err();
            }
            Ctx::Tensor if self.in_kernel => {
                self.report(
                    Diagnostic::new(
                        "E0508",
                        span,
                        format!(
                            "`{}` is a whole-tensor operation and cannot be used inside a kernel",
                            b.name
                        ),
                    )
                    .with_help(tensor_only_help(id)),
                );
                return Val::err();
            }
            _ => {}
        }
        let positional = args.iter().filter(|a| a.name.is_none()).count();
        if matches!(id, B::Min | B::Max) && positional >= 2 {
            return self.minmax(id, args, span);
        }
        let required: Vec<bool> = (0..b.params.len()).map(|i| i < b.required).collect();
        let Some(slots) = self.bind_args(b.name, b.params, &required, args, span) else {
            return Val::err();
        };
        let arg = |j: usize| slots.get(j).copied().flatten().map(|i| &args[i]);
        let Some(a0) = arg(0) else { return Val::err() };
        // A poisoned argument poisons the call, except where the call has no
        // value to poison (a store) or is a session operation that still checks
        // its other arguments.
        if args.iter().any(|a| a.val.ty.is_err())
            && !matches!(id, B::Store | B::AtomicAdd)
            && b.ctx != Ctx::Session
        {
            return Val::err();
        }
        match id {
            B::ProgramId | B::NumPrograms => {
                if let Some(axis) = self.const_int(a0, "the program axis") {
                    let rank = self.kernel.grid_rank;
                    if !(0..3).contains(&axis) || rank.is_some_and(|r| axis as usize >= r) {
                        let why = match rank {
                            Some(r) if (0..3).contains(&axis) => format!(
                                "the kernel's grid has {r} ax{}",
                                if r == 1 { "is" } else { "es" }
                            ),
                            _ => "grids have at most 3 axes (0, 1, 2)".to_string(),
                        };
                        self.report(
                            Diagnostic::new(
                                "E0507",
                                a0.expr.span,
                                format!("program axis {axis} is out of range: {why}"),
                            )
                            .with_help("use an axis of the grid, or give the grid more axes"),
                        );
                    }
                }
                Val::of(Ty::scalar(DType::I32))
            }
            B::Cdiv => {
                let Some(a1) = arg(1) else { return Val::err() };
                for a in [a0, a1] {
                    if !matches!(a.val.ty, Ty::Scalar { dtype, .. } if dtype.is_int()) {
                        self.report(Diagnostic::new(
                            "E0302",
                            a.expr.span,
                            format!("`cdiv` takes integers, found `{}`", a.val.ty),
                        )
                        .with_help(
                            "`cdiv(a, b)` divides integers rounding up, e.g. `cdiv(N, BLOCK)`; convert a float first with `.to(i32)`",
                        ));
                        return Val::err();
                    }
                }
                let weak = a0.val.ty.is_weak() && a1.val.ty.is_weak();
                let value = match (&a0.val.value, &a1.val.value) {
                    (Some(x), Some(y)) => match fold_call(B::Cdiv, &[x.clone(), y.clone()]) {
                        Ok(v) => v,
                        Err(m) => {
                            self.report(
                                Diagnostic::new(
                                    "E0315",
                                    span,
                                    format!("constant evaluation failed: {m}"),
                                )
                                .with_help(crate::check::consts::failure_help(&m)),
                            );
                            None
                        }
                    },
                    _ => None,
                };
                Val::with(
                    Ty::Scalar {
                        dtype: DType::I32,
                        weak,
                    },
                    value,
                )
            }
            B::Min | B::Max | B::Sum | B::Mean => self.reduce(id, a0, arg(1), arg(2)),
            B::Exp
            | B::Exp2
            | B::Log
            | B::Log2
            | B::Sqrt
            | B::Rsqrt
            | B::Abs
            | B::Sigmoid
            | B::Tanh
            | B::Erf
            | B::Relu
            | B::Gelu
            | B::Silu => {
                let Some((k, dims, dt)) = self.array(a0) else {
                    return Val::err();
                };
                if dt == DType::Bool {
                    self.report(
                        Diagnostic::new(
                            "E0311",
                            a0.expr.span,
                            format!(
                                "`{}` needs a numeric operand, found `{}`",
                                b.name, a0.val.ty
                            ),
                        )
                        .with_help(format!(
                            "convert the bools first: `{}({}.to(f32))`",
                            b.name,
                            describe(a0.expr)
                        )),
                    );
                    return Val::err();
                }
                let rdt = if id == B::Abs || dt.is_float() {
                    dt
                } else {
                    DType::F32
                };
                let weak = a0.val.ty.is_weak();
                let value = if id == B::Abs {
                    a0.val
                        .value
                        .as_ref()
                        .and_then(|v| fold_call(B::Abs, std::slice::from_ref(v)).ok().flatten())
                } else {
                    None
                };
                Val::with(make(k, dims, rdt, weak), value)
            }
            B::Maximum | B::Minimum => {
                let Some(a1) = arg(1) else { return Val::err() };
                match self.elementwise(&format!("`{}`", b.name), a0, a1, span) {
                    Some((k, dims, dt, weak)) => Val::of(make(k, dims, dt, weak)),
                    None => Val::err(),
                }
            }
            B::Where => {
                let (Some(a1), Some(a2)) = (arg(1), arg(2)) else {
                    return Val::err();
                };
                let Some((ck, cd, cdt)) = self.array(a0) else {
                    return Val::err();
                };
                if cdt != DType::Bool {
                    self.report(
                        Diagnostic::new(
                            "E0301",
                            a0.expr.span,
                            format!(
                                "the condition of `where` must be bool, found `{}`",
                                a0.val.ty
                            ),
                        )
                        .with_help("compare to get a bool tile, e.g. `x > 0`"),
                    );
                    return Val::err();
                }
                let Some((k, dims, dt, weak)) = self.elementwise("`where`", a1, a2, span) else {
                    return Val::err();
                };
                let Some(all) = broadcast(&cd, &dims) else {
                    self.report(
                        Diagnostic::new(
                            "E0402",
                            span,
                            format!(
                                "shapes {} and {} do not broadcast in `where`",
                                render_dims(&cd),
                                render_dims(&dims)
                            ),
                        )
                        .with_label(a0.span, format!("the condition is `{}`", a0.val.ty))
                        .with_help(
                            "the condition and both values must broadcast to one shape: trailing dims equal or 1 (add an axis with `x[:, None]`)",
                        ),
                    );
                    return Val::err();
                };
                Val::of(make(k.max(ck), all, dt, weak))
            }
            B::Zeros | B::Empty | B::Ones | B::Randn | B::Full => {
                let Some(dims) = self.shape_arg(a0) else {
                    return Val::err();
                };
                let (dtype_slot, value_slot) = if id == B::Full {
                    (2, Some(1))
                } else {
                    (1, None)
                };
                let dt = match arg(dtype_slot) {
                    Some(a) => match self.dtype_arg(a) {
                        Some(d) => d,
                        None => return Val::err(),
                    },
                    None => DType::F32,
                };
                if id == B::Randn && !dt.is_float() {
                    // Normal samples are not integers; rounding them would be a
                    // second, undocumented distribution.
                    self.report(
                        Diagnostic::new(
                            "E0311",
                            arg(dtype_slot).map_or(span, |a| a.expr.span),
                            format!("`randn` makes floats; `{dt}` is not a float dtype"),
                        )
                        .with_help("sample floats and convert: `randn(shape, f32).to(i32)`"),
                    );
                    return Val::err();
                }
                if let Some(v) = value_slot.and_then(arg) {
                    if let Some(i) = v.val.value.as_ref().and_then(Value::as_int) {
                        if dt.is_int() && !crate::check::stmt::int_fits(dt, i) {
                            self.report(out_of_range(i, dt, v.expr.span));
                            return Val::err();
                        }
                    }
                    match &v.val.ty {
                        Ty::Scalar { dtype, weak } => {
                            if (dtype.is_float() && !dt.is_float())
                                || (!*weak && !dtype.widens_to(dt))
                            {
                                self.report(
                                    Diagnostic::new(
                                        "E0301",
                                        v.expr.span,
                                        format!(
                                            "{} fill value for {} {}",
                                            crate::diag::a_code(&v.val.ty),
                                            crate::diag::a_code(dt),
                                            if self.in_kernel { "tile" } else { "tensor" }
                                        ),
                                    )
                                    .with_help(format!(
                                        "convert the value: `{}.to({dt})`",
                                        describe(v.expr)
                                    )),
                                );
                            }
                        }
                        other => {
                            self.report(
                                Diagnostic::new(
                                    "E0302",
                                    v.expr.span,
                                    format!("the fill value must be a scalar, found `{other}`"),
                                )
                                .with_help("fill with one number, e.g. `full([BM, BN], 0.0)`"),
                            );
                        }
                    }
                }
                if let Some(seed) = arg(2).filter(|_| id == B::Randn) {
                    if !matches!(seed.val.ty, Ty::Scalar { dtype, .. } if dtype.is_int()) {
                        self.report(
                            Diagnostic::new(
                                "E0302",
                                seed.expr.span,
                                format!("the seed must be an integer, found `{}`", seed.val.ty),
                            )
                            .with_help("the seed is an integer, e.g. `randn([M, N], f32, seed=0)`"),
                        );
                    }
                }
                Val::of(if self.in_kernel {
                    Ty::tile(dims, dt)
                } else {
                    Ty::Tensor { dims, dtype: dt }
                })
            }
            B::Range => {
                for j in 0..3 {
                    if let Some(a) = arg(j) {
                        if !matches!(a.val.ty, Ty::Scalar { dtype, .. } if dtype.is_int()) {
                            self.report(Diagnostic::new(
                                "E0302",
                                a.expr.span,
                                format!("`range` takes integers, found `{}`", a.val.ty),
                            )
                            .with_help(
                                "`range(start, stop, step)` counts in integers; convert a float bound first with `.to(i32)`",
                            ));
                            return Val::err();
                        }
                    }
                }
                if let Some(step) = arg(2) {
                    if step.val.value.as_ref().and_then(Value::as_int) == Some(0) {
                        self.report(Diagnostic::new(
                            "E0315",
                            step.expr.span,
                            "`range` step cannot be zero",
                        )
                        .with_help(
                            "count up with a positive step or down with a negative one, e.g. `range(N - 1, -1, -1)`",
                        ));
                    }
                }
                Val::of(Ty::Range)
            }
            B::Arange => {
                let Some(a1) = arg(1) else { return Val::err() };
                for a in [a0, a1] {
                    if !matches!(a.val.ty, Ty::Scalar { dtype, .. } if dtype.is_int()) {
                        self.report(Diagnostic::new(
                            "E0302",
                            a.expr.span,
                            format!("`arange` takes integers, found `{}`", a.val.ty),
                        )
                        .with_help(
                            "`arange(start, end)` takes integer bounds, e.g. `arange(0, BLOCK)`",
                        ));
                        return Val::err();
                    }
                }
                let len = match (&a0.val.value, &a1.val.value) {
                    (Some(Value::Int(s)), Some(Value::Int(e))) => e.checked_sub(s),
                    _ => None,
                };
                let Some(len) = len else {
                    self.report(
                        Diagnostic::new(
                            "E0406",
                            span,
                            "the length of this `arange` is not known at compile time",
                        )
                        .with_help("write `arange(start, start + SIZE)` with a constant SIZE"),
                    );
                    return Val::err();
                };
                if let Some(sym) = self.runtime_symbol(&len) {
                    self.report(
                        Diagnostic::new("E0406", span, format!("`arange` has length `{len}`, which is not known at compile time: `{sym}` is a run-time value; it would need to be a `const` or a tensor dim the kernel is specialised on"))
                            .with_help(format!("write `arange(start, start + SIZE)` with a constant SIZE, or make `{sym}` a `const` parameter or a tensor dim")),
                    );
                    return Val::err();
                }
                if len.as_const().is_some_and(|n| n <= 0) {
                    self.report(Diagnostic::new(
                        "E0406",
                        span,
                        format!("`arange` has length {len}; it must be positive"),
                    )
                    .with_help(
                        "the end must be greater than the start: `arange(start, start + SIZE)` with SIZE at least 1",
                    ));
                    return Val::err();
                }
                Val::of(Ty::tile(vec![len], DType::I32))
            }
            B::Load | B::Store | B::AtomicAdd => self.memory(id, a0, arg(1), arg(2)),
            B::Dot => {
                let Some(a1) = arg(1) else { return Val::err() };
                let acc = arg(2).map(|a| (&a.val, a.expr));
                let prec = arg(3).map(|a| (&a.val, a.expr));
                self.dot_op(&a0.val, &a1.val, acc, prec, span, a0.expr, a1.expr)
            }
            B::Matmul => {
                let Some(a1) = arg(1) else { return Val::err() };
                if let Some(p) = arg(2) {
                    // A literal: the graph lowering reads it from the source.
                    let ok =
                        matches!(p.expr.kind, ExprKind::Str(ref s) if s == "ieee" || s == "tf32");
                    if !ok && !p.val.ty.is_err() {
                        self.report(
                            Diagnostic::new(
                                "E0302",
                                p.expr.span,
                                "`precision=` must be the string \"ieee\" or \"tf32\"",
                            )
                            .with_help("`matmul(a, b, precision=\"tf32\")` rounds f32 operands to tf32; \"ieee\" (the default) multiplies in full f32"),
                        );
                    }
                }
                self.matmul_op(&a0.val, &a1.val, span, a0.expr, a1.expr)
            }
            B::Softmax => {
                let Some((k, dims, dt)) = self.array(a0) else {
                    return Val::err();
                };
                if !dt.is_float() {
                    self.report(
                        Diagnostic::new(
                            "E0311",
                            a0.expr.span,
                            format!("`softmax` needs a float tensor, found `{}`", a0.val.ty),
                        )
                        .with_help("convert it first: `.to(f32)`"),
                    );
                    return Val::err();
                }
                let axis = match arg(1) {
                    Some(a) => match self.const_int(a, "`dim`") {
                        Some(x) => x,
                        None => return Val::err(),
                    },
                    None => -1,
                };
                let at = arg(1).map(|a| a.expr.span).unwrap_or(span);
                if self.norm_axis(axis, dims.len(), &a0.val.ty, at).is_none() {
                    return Val::err();
                }
                Val::of(make(k, dims, dt, false))
            }
            B::LayerNorm | B::RmsNorm => {
                let Some((k, dims, dt)) = self.array(a0) else {
                    return Val::err();
                };
                if !dt.is_float() {
                    self.report(
                        Diagnostic::new(
                            "E0311",
                            a0.expr.span,
                            format!("`{}` needs a float tensor, found `{}`", b.name, a0.val.ty),
                        )
                        .with_help(format!(
                            "convert it first: `{}({}.to(f32))`",
                            b.name,
                            describe(a0.expr)
                        )),
                    );
                    return Val::err();
                }
                let n_affine = if id == B::LayerNorm { 2 } else { 1 };
                for j in 1..=n_affine {
                    let Some(w) = arg(j) else { continue };
                    if matches!(w.val.ty, Ty::NoneV) {
                        continue;
                    }
                    if let Some((_, wd, wdt)) = self.array(w) {
                        if broadcast(&wd, &dims).as_deref() != Some(&dims[..]) {
                            self.report(
                                Diagnostic::new(
                                    "E0402",
                                    w.expr.span,
                                    format!(
                                        "`{}` does not broadcast to the input's shape {}",
                                        w.val.ty,
                                        render_dims(&dims)
                                    ),
                                )
                                .with_label(a0.span, format!("the input is `{}`", a0.val.ty))
                                .with_help(
                                    format!("give a weight or bias whose dims match the input's trailing dims (or are 1): it must broadcast to {}", render_dims(&dims)),
                                ),
                            );
                        } else if wdt != dt {
                            self.report(
                                Diagnostic::new(
                                    "E0301",
                                    w.expr.span,
                                    format!(
                                        "`{}` has dtype `{wdt}` but the input is `{dt}`",
                                        w.val.ty
                                    ),
                                )
                                .with_help(format!("convert it: `{}.to({dt})`", describe(w.expr))),
                            );
                        }
                    }
                }
                if let Some(eps) = arg(n_affine + 1) {
                    if !matches!(eps.val.ty, Ty::Scalar { .. }) {
                        self.report(
                            Diagnostic::new(
                                "E0302",
                                eps.expr.span,
                                format!("`eps` must be a scalar, found `{}`", eps.val.ty),
                            )
                            .with_help("`eps` is one small number, e.g. `eps=1e-5`"),
                        );
                    }
                }
                Val::of(make(k, dims, dt, false))
            }
            B::Transpose => {
                let (Some(a1), Some(a2)) = (arg(1), arg(2)) else {
                    return Val::err();
                };
                let Some((k, mut dims, dt)) = self.array(a0) else {
                    return Val::err();
                };
                let (Some(x), Some(y)) = (
                    self.const_int(a1, "a transpose axis"),
                    self.const_int(a2, "a transpose axis"),
                ) else {
                    return Val::err();
                };
                let (Some(x), Some(y)) = (
                    self.norm_axis(x, dims.len(), &a0.val.ty, a1.expr.span),
                    self.norm_axis(y, dims.len(), &a0.val.ty, a2.expr.span),
                ) else {
                    return Val::err();
                };
                dims.swap(x, y);
                Val::of(make(k, dims, dt, false))
            }
            B::Reshape => {
                let Some(a1) = arg(1) else { return Val::err() };
                let Some((k, dims, dt)) = self.array(a0) else {
                    return Val::err();
                };
                self.allow_infer_dim = true;
                let new = self.shape_arg(a1);
                self.allow_infer_dim = false;
                let Some(mut new) = new else {
                    return Val::err();
                };
                let prod = |ds: &[Dim]| {
                    ds.iter()
                        .try_fold(Dim::constant(1), |acc, d| acc.checked_mul(d))
                };
                let inferred: Vec<usize> = (0..new.len())
                    .filter(|&i| new[i].as_const() == Some(-1))
                    .collect();
                if inferred.len() > 1 {
                    self.report(
                        Diagnostic::new(
                            "E0412",
                            a1.expr.span,
                            "`reshape` can infer at most one dim (-1)",
                        )
                        .with_help("write every dim but one out, e.g. `reshape(x, [4, -1])`"),
                    );
                    return Val::err();
                }
                if let Some(&i) = inferred.first() {
                    let known: Vec<Dim> = new
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| *j != i)
                        .map(|(_, d)| d.clone())
                        .collect();
                    let dim = match (prod(&dims), prod(&known).and_then(|k| k.as_const())) {
                        (Some(total), Some(k)) if k > 0 => total.exact_div(k),
                        _ => None,
                    };
                    match dim {
                        Some(d) => new[i] = d,
                        None => {
                            self.report(
                                Diagnostic::new("E0412", a1.expr.span, format!("cannot infer the -1 dim of reshaping {} to {}", render_dims(&dims), render_dims(&new)))
                                    .with_help("the other dims must divide the number of elements exactly; write the dim out"),
                            );
                            return Val::err();
                        }
                    }
                }
                let unknown = new.iter().any(|d| d.as_symbol() == Some("?"));
                if !unknown {
                    if let (Some(p), Some(q)) = (prod(&dims), prod(&new)) {
                        if p != q {
                            self.report(
                                Diagnostic::new("E0412", a1.expr.span, format!("reshape from {} ({p} elements) to {} ({q} elements) changes the number of elements", render_dims(&dims), render_dims(&new)))
                                    .with_label(a0.span, format!("this is `{}`", a0.val.ty))
                                    .with_help(
                                        format!("give a shape of {p} elements, or use -1 for the one dim to infer: `reshape(x, [4, -1])`"),
                                    ),
                            );
                            return Val::err();
                        }
                    }
                }
                Val::of(make(k, new, dt, false))
            }
            B::Tensor => {
                fn shape_of(t: &Ty) -> Option<(Vec<Dim>, bool)> {
                    match t {
                        Ty::Scalar { dtype, .. } => Some((Vec::new(), dtype.is_float())),
                        Ty::List(items) | Ty::Tuple(items) => {
                            let mut inner: Option<(Vec<Dim>, bool)> = None;
                            for i in items {
                                let s = shape_of(i)?;
                                inner = match inner {
                                    None => Some(s),
                                    Some((d, f)) if d == s.0 => Some((d, f || s.1)),
                                    Some(_) => return None,
                                };
                            }
                            let (mut d, f) = inner.unwrap_or((Vec::new(), false));
                            d.insert(0, Dim::constant(items.len() as i64));
                            Some((d, f))
                        }
                        _ => None,
                    }
                }
                let Some((dims, is_float)) = shape_of(&a0.val.ty) else {
                    self.report(Diagnostic::new(
                        "E0302",
                        a0.expr.span,
                        "`tensor` takes nested lists of numbers with a rectangular shape",
                    )
                    .with_help(
                        "write a list of numbers, or of equal-length lists: `tensor([[1.0, 2.0], [3.0, 4.0]])`",
                    ));
                    return Val::err();
                };
                let dt = match arg(1) {
                    Some(a) => match self.dtype_arg(a) {
                        Some(d) => d,
                        None => return Val::err(),
                    },
                    None if is_float => DType::F32,
                    None => DType::I32,
                };
                // Known integers must be values of an integer dtype (no wrap).
                fn first_outside(v: &Value, dt: DType) -> Option<i64> {
                    match v {
                        Value::Tuple(items) => items.iter().find_map(|x| first_outside(x, dt)),
                        Value::Int(_) => {
                            v.as_int().filter(|i| !crate::check::stmt::int_fits(dt, *i))
                        }
                        _ => None,
                    }
                }
                if dt.is_int() {
                    if let Some(i) = a0.val.value.as_ref().and_then(|v| first_outside(v, dt)) {
                        self.report(out_of_range(i, dt, a0.expr.span));
                        return Val::err();
                    }
                }
                Val::of(Ty::Tensor { dims, dtype: dt })
            }
            // Typed by `print` above, before binding: it takes any number of values.
            B::Print => Val::of(Ty::NoneV),
            // Session builtins: top-level statements only (E0725 above).
            B::Len => {
                let n = match &a0.val.ty {
                    Ty::Err => return Val::err(),
                    Ty::Tensor { dims, .. } if !dims.is_empty() => {
                        Some(dims[0].clone()).filter(|d| d.as_symbol() != Some("?"))
                    }
                    Ty::Tuple(v) | Ty::List(v) => Some(Dim::constant(v.len() as i64)),
                    Ty::Shape(d) => Some(Dim::constant(d.len() as i64)),
                    Ty::Str => None,
                    other => {
                        self.report(Diagnostic::new(
                            "E0302",
                            a0.expr.span,
                            format!("a {} (`{other}`) has no length", other.kind_name()),
                        ).with_help("`len` takes a tensor of rank 1 or more, a tuple, a list or a string"));
                        return Val::err();
                    }
                };
                Val::with(Ty::weak(DType::I32), n.map(Value::Int))
            }
            B::SetFloat32MatmulPrecision => {
                let ok = match &a0.val.value {
                    Some(Value::Str(s)) => builtins::matmul_precision(s).is_some(),
                    _ => a0.val.ty.is_err(),
                };
                if !ok {
                    self.report(
                        Diagnostic::new(
                            "E0302",
                            a0.expr.span,
                            "the matmul precision is \"highest\" (full f32) or \"high\" (tf32)",
                        )
                        .with_help("`set_float32_matmul_precision(\"high\")` (PyTorch's \"medium\", bf16, is not offered)"),
                    );
                }
                Val::of(Ty::NoneV)
            }
            B::LoadNpy => {
                self.path_ok(a0);
                // The file decides shape and dtype: untracked here (uses are
                // checked when the statement runs).
                self.types.push((
                    span,
                    "Tensor (shape and dtype read from the file at run time)".into(),
                ));
                Val::err()
            }
            B::AllReduce
            | B::Broadcast
            | B::Shard
            | B::Gather
            | B::AllGather
            | B::ReduceScatter => {
                let rank = match &a0.val.ty {
                    Ty::Tensor { dims, .. } => dims.len(),
                    Ty::Err => return Val::err(),
                    other => {
                        self.report(
                            Diagnostic::new(
                                "E0302",
                                a0.expr.span,
                                format!("`{}` takes a tensor, found `{other}`", b.name),
                            )
                            .with_help(format!("`{}` acts on a tensor spread over the session's devices (docs/multi-gpu.md)", b.name)),
                        );
                        return Val::err();
                    }
                };
                let named = |p: &str| b.params.iter().position(|q| *q == p).and_then(arg);
                if let Some(op) = named("op") {
                    match &op.val.value {
                        Some(Value::Str(s)) if builtins::REDUCE_OPS.contains(&s.as_str()) => {}
                        _ if op.val.ty.is_err() => {}
                        other => {
                            let found = match other {
                                Some(Value::Str(s)) => format!("`\"{s}\"`"),
                                _ => format!("`{}`", op.val.ty),
                            };
                            self.report(
                                Diagnostic::new(
                                    "E0302",
                                    op.expr.span,
                                    format!(
                                        "the reduction of `{}` is one of {}, found {found}",
                                        b.name,
                                        builtins::REDUCE_OPS.map(|n| format!("\"{n}\"")).join(", ")
                                    ),
                                )
                                .with_help(format!("e.g. `{}(x, op=\"sum\")`", b.name)),
                            );
                        }
                    }
                }
                if let Some(ax) = named("axis") {
                    if let Some(a) = self.const_int(ax, "the axis") {
                        self.norm_axis(a, rank, &a0.val.ty, ax.expr.span);
                    }
                }
                if let Some(src) = named("src") {
                    if let Some(v) = self.const_int(src, "the source part") {
                        if v < 0 {
                            self.report(
                                Diagnostic::new(
                                    "E0302",
                                    src.expr.span,
                                    format!("`src` is the number of a part, not {v}"),
                                )
                                .with_help("parts are numbered from 0, in the order of the tensor's devices"),
                            );
                        }
                    }
                }
                // The logical shape is kept: see docs/multi-gpu.md.
                Val::of(a0.val.ty.clone())
            }
            B::SaveNpy => {
                if !matches!(a0.val.ty, Ty::Tensor { .. } | Ty::Err) {
                    self.report(Diagnostic::new(
                        "E0302",
                        a0.expr.span,
                        format!("`save_npy` saves a tensor, found `{}`", a0.val.ty),
                    )
                    .with_help(
                        "`save_npy(t, \"out.npy\")` writes one tensor; wrap a number first: `tensor([x])`",
                    ));
                }
                if let Some(a1) = arg(1) {
                    self.path_ok(a1);
                }
                Val::of(Ty::NoneV)
            }
        }
    }

    /// `print(a, b, ..., sep=, end=)`: any number of values, so its arguments
    /// are checked here rather than bound to the parameter list.
    pub(super) fn print(&mut self, args: &[ArgV], span: Span) -> Val {
        // Python's `sep=` and `end=` (strings); `file=` and `flush=` have
        // no meaning in a session.
        for a in args {
            match a.name.map(|n| n.name.as_str()) {
                None => {}
                Some("sep" | "end") if matches!(a.val.ty, Ty::Str | Ty::Err) => {}
                Some("sep" | "end") => {
                    self.report(
                        Diagnostic::new(
                            "E0302",
                            a.expr.span,
                            format!("`print`'s separators are strings, found `{}`", a.val.ty),
                        )
                        .with_help(
                            "`sep=` and `end=` take strings, e.g. `print(a, b, sep=\", \")`",
                        ),
                    );
                }
                Some(other) => self.report(
                    Diagnostic::new(
                        "E0205",
                        a.span,
                        format!("`print` has no keyword argument `{other}`"),
                    )
                    .with_primary_label("unknown keyword argument")
                    .with_help("`print(a, b, ..., sep=\" \", end=\"\\n\")`"),
                ),
            }
        }
        if let Some(twice) = ["sep", "end"].into_iter().find(|k| {
            args.iter()
                .filter(|a| a.name.is_some_and(|n| n.name == *k))
                .count()
                > 1
        }) {
            self.report(
                Diagnostic::new("E0206", span, format!("`{twice}=` is given twice"))
                    .with_help(format!("give `{twice}=` once")),
            );
        }
        Val::of(Ty::NoneV)
    }

    /// Whether a path argument is a string (E0302 otherwise).
    pub(super) fn path_ok(&mut self, a: &ArgV) -> bool {
        if matches!(a.val.ty, Ty::Str | Ty::Err) {
            return true;
        }
        self.report(
            Diagnostic::new(
                "E0302",
                a.expr.span,
                format!("a path is a string, found `{}`", a.val.ty),
            )
            .with_help("write the path as a string, e.g. `\"out.npy\"`"),
        );
        false
    }

    /// `arange(n)`, `arange(start, end)`, `dtype=` in a top-level statement: a
    /// 1-D tensor made on the host.
    pub(super) fn session_arange(&mut self, args: &[ArgV], span: Span) -> Val {
        let params = ["start", "end", "dtype"];
        let Some(slots) = self.bind_args("arange", &params, &[true, false, false], args, span)
        else {
            return Val::err();
        };
        let arg = |j: usize| slots.get(j).copied().flatten().map(|i| &args[i]);
        let bounds: Vec<&ArgV> = [arg(0), arg(1)].into_iter().flatten().collect();
        for a in &bounds {
            if a.val.ty.is_err() {
                return Val::err();
            }
            if !matches!(a.val.ty, Ty::Scalar { dtype, .. } if dtype.is_int()) {
                self.report(Diagnostic::new(
                    "E0302",
                    a.expr.span,
                    format!("`arange` takes integers, found `{}`", a.val.ty),
                )
                .with_help(
                    "`arange(start, end)` takes integer bounds, e.g. `arange(0, 10)`; convert a float first with `.to(i32)`",
                ));
                return Val::err();
            }
        }
        let dtype = match arg(2) {
            Some(a) => match self.dtype_arg(a) {
                Some(d) => d,
                None => return Val::err(),
            },
            None => DType::I32,
        };
        let value = |a: &ArgV| match &a.val.value {
            Some(Value::Int(d)) => d.as_const(),
            _ => None,
        };
        // In i128: `end - start` of two i64 bounds may not fit an i64. A
        // length past i64 stays unknown here; creating it is E0712 at run time.
        let len = match bounds[..] {
            [end] => value(end).map(i128::from),
            [start, end] => value(end)
                .zip(value(start))
                .map(|(e, s)| i128::from(e) - i128::from(s)),
            _ => None,
        };
        let dim = match len.map(|n| i64::try_from(n.max(0))) {
            Some(Ok(n)) => Dim::constant(n),
            _ => Dim::symbol("?"),
        };
        Val::of(Ty::Tensor {
            dims: vec![dim],
            dtype,
        })
    }

    pub(super) fn minmax(&mut self, name: Builtin, args: &[ArgV], span: Span) -> Val {
        if let Some(a) = args.iter().find(|a| a.name.is_some()) {
            self.report(
                Diagnostic::new(
                    "E0205",
                    a.span,
                    format!("`{name}` of several values takes no keyword arguments"),
                )
                .with_help(format!("reduce one value with `{name}(t, axis=k)`")),
            );
            return Val::err();
        }
        if args.iter().any(|a| a.val.ty.is_err()) {
            return Val::err();
        }
        let mut acc = (Kind::Scalar, Vec::new(), DType::I32, true);
        let mut first = true;
        for w in args.windows(2) {
            let Some(r) = self.elementwise(&format!("`{name}`"), &w[0], &w[1], span) else {
                return Val::err();
            };
            if first {
                acc = r;
                first = false;
            } else {
                acc.0 = acc.0.max(r.0);
                acc.1 = broadcast(&acc.1, &r.1).unwrap_or(r.1);
                acc.3 &= r.3;
            }
        }
        let value = args
            .iter()
            .map(|a| a.val.value.clone())
            .collect::<Option<Vec<_>>>()
            .and_then(|vs| fold_call(name, &vs).ok().flatten());
        Val::with(
            make(acc.0, acc.1, acc.2, acc.3),
            if acc.0 == Kind::Scalar { value } else { None },
        )
    }

    pub(super) fn reduce(
        &mut self,
        name: Builtin,
        x: &ArgV,
        axis: Option<&ArgV>,
        keepdims: Option<&ArgV>,
    ) -> Val {
        let Some((k, dims, dt)) = self.array(x) else {
            return Val::err();
        };
        if k == Kind::Scalar {
            self.report(
                Diagnostic::new(
                    "E0411",
                    x.expr.span,
                    format!(
                        "`{name}` reduces a tile or tensor, found the scalar `{}`",
                        x.val.ty
                    ),
                )
                .with_help(format!("for two scalars write `{name}(a, b)`")),
            );
            return Val::err();
        }
        let keep = match keepdims {
            Some(a) => match self.const_bool(a, "`keepdims`") {
                Some(b) => b,
                None => return Val::err(),
            },
            None => false,
        };
        let axis = match axis {
            Some(a) if !matches!(a.val.value, Some(Value::None)) => {
                match self.const_int(a, "the reduction axis") {
                    Some(ax) => match self.norm_axis(ax, dims.len(), &x.val.ty, a.expr.span) {
                        Some(j) => Some(j),
                        None => return Val::err(),
                    },
                    None => return Val::err(),
                }
            }
            _ => None,
        };
        // Only `sum` has an identity; the maximum, minimum or mean of nothing
        // is an error (as in numpy), here where the extent is known to be 0
        // and at run time otherwise.
        let reduced: Vec<&Dim> = match axis {
            Some(j) => vec![&dims[j]],
            None => dims.iter().collect(),
        };
        if name != B::Sum && reduced.iter().any(|d| d.as_const() == Some(0)) {
            self.report(
                Diagnostic::new(
                    "E0317",
                    x.expr.span,
                    format!(
                        "`{name}` of an empty {} has no value",
                        if axis.is_some() { "axis" } else { "tensor" }
                    ),
                )
                .with_label(x.expr.span, format!("this is `{}`", x.val.ty))
                .with_help("only `sum` of nothing is defined (0); reduce a non-empty axis"),
            );
            return Val::err();
        }
        let out: Vec<Dim> = match axis {
            None if keep => vec![Dim::constant(1); dims.len()],
            None => Vec::new(),
            Some(j) => dims
                .iter()
                .enumerate()
                .filter_map(|(i, d)| {
                    if i == j {
                        keep.then(|| Dim::constant(1))
                    } else {
                        Some(d.clone())
                    }
                })
                .collect(),
        };
        let rdt = match (name, dt) {
            (B::Mean, d) if !d.is_float() => DType::F32,
            (B::Sum, DType::Bool) => DType::I32,
            (_, d) => d,
        };
        Val::of(match k {
            Kind::Tensor => Ty::Tensor {
                dims: out,
                dtype: rdt,
            },
            _ => Ty::tile(out, rdt),
        })
    }

    pub(super) fn cast(&mut self, recv: &Ty, args: &[ArgV], span: Span, func: &Expr) -> Val {
        let Some(slots) = self.bind_args("to", &["dtype"], &[true], args, span) else {
            return Val::err();
        };
        let Some(a) = slots[0].map(|i| &args[i]) else {
            return Val::err();
        };
        let dt = match &a.val.value {
            Some(Value::DType(d)) => *d,
            // A device (`x.to("cuda")`): where a tensor's elements live, not
            // its type; the session moves them (elsewhere it is the value).
            Some(Value::Str(s))
                if crate::check::builtins::place_named(s).is_some()
                    && matches!(recv, Ty::Tensor { .. })
                    && !self.in_kernel =>
            {
                return Val::of(recv.clone())
            }
            _ if a.val.ty.is_err() => return Val::err(),
            _ => {
                let mut d = Diagnostic::new(
                    "E0312",
                    a.expr.span,
                    format!("`.to()` takes a dtype, found `{}`", a.val.ty),
                );
                d = match &a.val.value {
                    Some(Value::Str(s)) if DType::from_name(s).is_some() => {
                        d.with_help(format!("write the dtype without quotes: `.to({s})`"))
                    }
                    _ => d.with_help(
                        "e.g. `.to(f32)` or `.to(bf16)`; a tensor also moves to a device: `x.to(\"cuda\")`",
                    ),
                };
                self.report(d);
                return Val::err();
            }
        };
        match recv {
            Ty::Scalar { .. } => Val::of(Ty::scalar(dt)),
            Ty::Tile { dims, .. } => Val::of(Ty::tile(dims.clone(), dt)),
            Ty::Tensor { dims, .. } if !self.in_kernel => Val::of(Ty::Tensor {
                dims: dims.clone(),
                dtype: dt,
            }),
            _ => {
                let base = match &func.kind {
                    ExprKind::Attribute { value, .. } => value,
                    _ => func,
                };
                self.operand(&Val::of(recv.clone()), base);
                Val::err()
            }
        }
    }
}
