//! Calls: builtins (with their typing rules), user functions and kernel
//! launches (argument binding, dim unification, const arguments, grids), and
//! `.to()` casts.

use std::collections::HashMap;
use std::sync::Arc;

use super::builtins::{self, Builtin, Builtin as B, Ctx};
use super::consts::fold_call;
use super::ctx::{Checker, Val};
use super::dims::Dim;
use super::expr::{broadcast, describe, Kind};
use super::scope::FnSig;
use super::suggest;
use super::types::{render_dims, Callee, DType, Ty, Value};
use crate::diag::Diagnostic;
use crate::syntax::ast::{Arg, Expr, ExprKind, Ident, Index};
use crate::syntax::span::Span;

/// A checked call argument.
pub struct ArgV<'e> {
    pub name: Option<&'e Ident>,
    pub val: Val,
    pub expr: &'e Expr,
    pub span: Span,
}

fn make(kind: Kind, dims: Vec<Dim>, dtype: DType, weak: bool) -> Ty {
    match kind {
        Kind::Scalar => Ty::Scalar { dtype, weak },
        Kind::Tile => Ty::tile(dims, dtype),
        Kind::Tensor => Ty::Tensor { dims, dtype },
    }
}

pub(crate) fn certainly_differ(a: &Dim, b: &Dim) -> bool {
    a.checked_sub(b)
        .and_then(|d| d.as_const())
        .is_some_and(|c| c != 0)
}

fn tensor_only_help(b: Builtin) -> &'static str {
    match b {
        B::Matmul => "inside a kernel, multiply loaded tiles with `dot(a, b)`",
        B::Softmax => "inside a kernel, compute it from `exp`, `max` and `sum` on tiles",
        B::Empty | B::Ones | B::Randn | B::Tensor => "inside a kernel, make tiles with `zeros([..], dtype)` or `full([..], value, dtype)`",
        B::Transpose => "inside a kernel, transpose a 2-D tile with `.T`",
        B::Relu => "inside a kernel, use `maximum(t, 0.0)`",
        _ => "call it from a whole-tensor function (a plain `def`), or spell it out with tile operations",
    }
}

impl Checker<'_> {
    pub fn call(&mut self, e: &Expr, func: &Expr, args: &[Arg]) -> Val {
        let mut grid = None;
        let fval = match &func.kind {
            ExprKind::Subscript { value, indices } => {
                self.callee = true;
                let v = self.expr(value);
                match &v.ty {
                    Ty::Callable(Callee::Function(sig)) if sig.is_kernel => {
                        grid = Some(self.launch_grid(indices, func.span));
                        v
                    }
                    _ => {
                        let r = self.subscript(v, value, indices);
                        self.record(func.span, &r.ty);
                        r
                    }
                }
            }
            _ => {
                self.callee = true;
                self.expr(func)
            }
        };
        let argv: Vec<ArgV> = args
            .iter()
            .map(|a| ArgV {
                name: a.name.as_ref(),
                val: self.expr(&a.value),
                expr: &a.value,
                span: a.span,
            })
            .collect();
        match &fval.ty {
            Ty::Callable(Callee::Builtin(b)) => self.builtin(*b, &argv, e.span),
            Ty::Callable(Callee::Function(sig)) => {
                let sig = sig.clone();
                self.call_fn(&sig, grid, &argv, e.span, func)
            }
            Ty::Callable(Callee::Method { recv, .. }) => {
                let recv = (**recv).clone();
                self.cast(&recv, &argv, e.span, func)
            }
            Ty::Err => Val::err(),
            other => {
                self.report(
                    Diagnostic::new(
                        "E0309",
                        func.span,
                        format!(
                            "`{}` is a {} (`{other}`), not a function",
                            describe(func),
                            other.kind_name()
                        ),
                    )
                    .with_primary_label("called here"),
                );
                Val::err()
            }
        }
    }

    /// Binds arguments to parameters by position and name (`dim=` is `axis=`).
    pub fn bind_args(
        &mut self,
        fname: &str,
        params: &[&str],
        required: &[bool],
        args: &[ArgV],
        span: Span,
    ) -> Option<Vec<Option<usize>>> {
        let mut slots: Vec<Option<usize>> = vec![None; params.len()];
        let mut ok = true;
        let mut pos = 0;
        for (i, a) in args.iter().enumerate() {
            match a.name {
                None => {
                    if pos < params.len() {
                        slots[pos] = Some(i);
                        pos += 1;
                    } else {
                        let positional = args.iter().filter(|a| a.name.is_none()).count();
                        self.report(
                            Diagnostic::new(
                                "E0304",
                                a.span,
                                format!(
                                    "`{fname}` takes at most {} argument{}, {positional} given",
                                    params.len(),
                                    if params.len() == 1 { "" } else { "s" }
                                ),
                            )
                            .with_primary_label("unexpected argument")
                            .with_help(format!("`{fname}` takes ({})", params.join(", "))),
                        );
                        ok = false;
                    }
                }
                Some(n) => {
                    let key = n.name.as_str();
                    let j = params.iter().position(|p| {
                        *p == key
                            || (key == "dim" && *p == "axis")
                            || (key == "axis" && *p == "dim")
                    });
                    match j {
                        Some(j) => {
                            if let Some(prev) = slots[j] {
                                self.report(
                                    Diagnostic::new(
                                        "E0206",
                                        a.span,
                                        format!("argument `{key}` of `{fname}` is given twice"),
                                    )
                                    .with_label(args[prev].span, "first given here"),
                                );
                                ok = false;
                            } else {
                                slots[j] = Some(i);
                            }
                        }
                        None => {
                            let mut d = Diagnostic::new(
                                "E0205",
                                n.span,
                                format!("`{fname}` has no parameter named `{key}`"),
                            );
                            if let Some(s) = suggest(key, params.iter().copied()) {
                                d = d.with_help(format!("did you mean `{s}`?"));
                            } else {
                                d = d.with_help(format!("`{fname}` takes ({})", params.join(", ")));
                            }
                            self.report(d);
                            ok = false;
                        }
                    }
                }
            }
        }
        let missing: Vec<&str> = params
            .iter()
            .zip(required)
            .zip(&slots)
            .filter(|((_, r), s)| **r && s.is_none())
            .map(|((p, _), _)| *p)
            .collect();
        if !missing.is_empty() && ok {
            self.report(
                Diagnostic::new(
                    "E0304",
                    span,
                    format!(
                        "`{fname}` is missing argument{} {}",
                        if missing.len() == 1 { "" } else { "s" },
                        missing
                            .iter()
                            .map(|m| format!("`{m}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
                .with_help(format!("`{fname}` takes ({})", params.join(", "))),
            );
            ok = false;
        }
        ok.then_some(slots)
    }

    fn const_int(&mut self, a: &ArgV, what: &str) -> Option<i64> {
        if a.val.ty.is_err() {
            return None;
        }
        match a.val.value.as_ref().and_then(Value::as_int) {
            Some(i) if matches!(a.val.value, Some(Value::Int(_))) => Some(i),
            _ => {
                self.report(
                    Diagnostic::new(
                        "E0310",
                        a.expr.span,
                        format!("{what} must be a compile-time integer"),
                    )
                    .with_help("use an integer literal, a module `const` or a `const` parameter"),
                );
                None
            }
        }
    }

    fn const_bool(&mut self, a: &ArgV, what: &str) -> Option<bool> {
        match &a.val.value {
            Some(Value::Bool(b)) => Some(*b),
            Some(Value::Int(d)) if d.as_const().is_some() => d.as_const().map(|i| i != 0),
            _ if a.val.ty.is_err() => None,
            _ => {
                self.report(Diagnostic::new(
                    "E0310",
                    a.expr.span,
                    format!("{what} must be a compile-time `True` or `False`"),
                ));
                None
            }
        }
    }

    fn dtype_arg(&mut self, a: &ArgV) -> Option<DType> {
        match &a.val.value {
            Some(Value::DType(d)) => Some(*d),
            _ if a.val.ty.is_err() => None,
            _ => {
                let mut d = Diagnostic::new(
                    "E0302",
                    a.expr.span,
                    format!("expected a dtype (e.g. `f32`), found `{}`", a.val.ty),
                );
                if let Some(Value::Str(s)) = &a.val.value {
                    if DType::from_name(s).is_some() {
                        d = d.with_help(format!("write the dtype without quotes: `{s}`"));
                    }
                }
                self.report(d);
                None
            }
        }
    }

    /// A shape argument (`[BM, BN]` or a single int). In kernels every dim must
    /// be known at compile time (E0406).
    fn shape_arg(&mut self, a: &ArgV) -> Option<Vec<Dim>> {
        let items: Vec<(Option<Value>, Span)> = match (&a.val.ty, &a.expr.kind) {
            (Ty::Err, _) => return None,
            (Ty::Tuple(_) | Ty::List(_), ExprKind::Tuple(es) | ExprKind::List(es)) => {
                let vals = match &a.val.value {
                    Some(Value::Tuple(v)) => v.iter().cloned().map(Some).collect(),
                    _ => vec![None; es.len()],
                };
                vals.into_iter().zip(es.iter().map(|e| e.span)).collect()
            }
            (Ty::Shape(dims), _) => return Some(dims.clone()),
            (Ty::Scalar { dtype, .. }, _) if dtype.is_int() => {
                vec![(a.val.value.clone(), a.expr.span)]
            }
            (other, _) => {
                self.report(Diagnostic::new(
                    "E0302",
                    a.expr.span,
                    format!("expected a shape like `[BM, BN]`, found `{other}`"),
                ));
                return None;
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for (k, (v, span)) in items.into_iter().enumerate() {
            match v {
                Some(Value::Int(d)) => {
                    if self.in_kernel {
                        if let Some(sym) = self.runtime_symbol(&d) {
                            self.report(
                                Diagnostic::new("E0406", span, format!("tile dim `{d}` is not known at compile time: `{sym}` is a run-time value; it would need to be a `const` or a tensor dim the kernel is specialised on"))
                                    .with_help(format!("make `{sym}` a `const` parameter (e.g. `{sym}: const = 64`), or use a tensor dim the kernel is specialised on")),
                            );
                            return None;
                        }
                    }
                    if d.as_const().is_some_and(|n| n < 0)
                        && !(self.allow_infer_dim && d.as_const() == Some(-1))
                    {
                        self.report(Diagnostic::new(
                            "E0406",
                            span,
                            format!("a dim cannot be negative ({d})"),
                        ));
                        return None;
                    }
                    out.push(d);
                }
                _ => {
                    let elem = match &a.val.ty {
                        Ty::Tuple(t) | Ty::List(t) => t.get(k).cloned().unwrap_or(Ty::Err),
                        t => t.clone(),
                    };
                    if elem.is_err() {
                        return None;
                    }
                    let ty_ok = matches!(elem, Ty::Scalar { dtype, .. } if dtype.is_int());
                    if self.in_kernel {
                        self.report(
                            Diagnostic::new("E0406", span, "this tile dim is not known at compile time")
                                .with_help("tile dims are integers, `const`s, or tensor dims the kernel is specialised on"),
                        );
                    } else if !ty_ok {
                        self.report(Diagnostic::new("E0302", span, "a dim must be an integer"));
                    } else {
                        out.push(Dim::symbol("?"));
                        continue;
                    }
                    return None;
                }
            }
        }
        Some(out)
    }

    fn norm_axis(&mut self, axis: i64, rank: usize, ty: &Ty, span: Span) -> Option<usize> {
        let r = rank as i64;
        if axis >= r || axis < -r {
            let range = if rank == 0 {
                "none (it is a scalar)".to_string()
            } else {
                format!("{} to {}", -r, r - 1)
            };
            self.report(
                Diagnostic::new(
                    "E0404",
                    span,
                    format!("axis {axis} is out of range for `{ty}` (rank {rank})"),
                )
                .with_help(format!("valid axes are {range}")),
            );
            return None;
        }
        Some(if axis < 0 {
            (axis + r) as usize
        } else {
            axis as usize
        })
    }

    fn array(&mut self, a: &ArgV) -> Option<(Kind, Vec<Dim>, DType)> {
        let (k, dims) = self.operand(&a.val, a.expr)?;
        Some((k, dims, a.val.ty.dtype()?))
    }

    /// `l` and `r` combined elementwise: shape, dtype, weakness.
    fn elementwise(
        &mut self,
        what: &str,
        l: &ArgV,
        r: &ArgV,
        span: Span,
    ) -> Option<(Kind, Vec<Dim>, DType, bool)> {
        let (lk, ld) = self.operand(&l.val, l.expr)?;
        let (rk, rd) = self.operand(&r.val, r.expr)?;
        let Some(dims) = broadcast(&ld, &rd) else {
            self.report(
                Diagnostic::new("E0402", span, format!("shapes {} and {} do not broadcast in {what}", render_dims(&ld), render_dims(&rd)))
                    .with_label(l.span, format!("this is `{}`", l.val.ty))
                    .with_label(r.span, format!("this is `{}`", r.val.ty))
                    .with_help("broadcasting matches dims from the right; each pair must be equal or 1 (add an axis with `[:, None]`)"),
            );
            return None;
        };
        let (dt, weak) = self.promote(&l.val.ty, &r.val.ty, lk, rk, what, span, l.expr, r.expr)?;
        Some((lk.max(rk), dims, dt, weak))
    }

    fn builtin(&mut self, id: Builtin, args: &[ArgV], span: Span) -> Val {
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
                        ));
                        return Val::err();
                    }
                }
                let weak = a0.val.ty.is_weak() && a1.val.ty.is_weak();
                let value = match (&a0.val.value, &a1.val.value) {
                    (Some(x), Some(y)) => match fold_call(B::Cdiv, &[x.clone(), y.clone()]) {
                        Ok(v) => v,
                        Err(m) => {
                            self.report(Diagnostic::new(
                                "E0315",
                                span,
                                format!("constant evaluation failed: {m}"),
                            ));
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
                    self.report(Diagnostic::new(
                        "E0311",
                        a0.expr.span,
                        format!(
                            "`{}` needs a numeric operand, found `{}`",
                            b.name, a0.val.ty
                        ),
                    ));
                    return Val::err();
                }
                // Kernels compute transcendentals with f32 approximations.
                if self.in_kernel
                    && dt == DType::F64
                    && !matches!(id, B::Sqrt | B::Rsqrt | B::Abs | B::Relu)
                {
                    self.report(
                        Diagnostic::new(
                            "E0311",
                            a0.expr.span,
                            format!("`{}` on f64 is not supported in kernels", b.name),
                        )
                        .with_help("compute it in f32: `.to(f32)`"),
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
                        .with_label(a0.span, format!("the condition is `{}`", a0.val.ty)),
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
                            self.report(Diagnostic::new(
                                "E0302",
                                v.expr.span,
                                format!("the fill value must be a scalar, found `{other}`"),
                            ));
                        }
                    }
                }
                if let Some(seed) = arg(2).filter(|_| id == B::Randn) {
                    if !matches!(seed.val.ty, Ty::Scalar { dtype, .. } if dtype.is_int()) {
                        self.report(Diagnostic::new(
                            "E0302",
                            seed.expr.span,
                            format!("the seed must be an integer, found `{}`", seed.val.ty),
                        ));
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
                    self.report(Diagnostic::new(
                        "E0311",
                        a0.expr.span,
                        format!("`{}` needs a float tensor, found `{}`", b.name, a0.val.ty),
                    ));
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
                                .with_label(a0.span, format!("the input is `{}`", a0.val.ty)),
                            );
                        } else if wdt != dt {
                            self.report(Diagnostic::new(
                                "E0301",
                                w.expr.span,
                                format!("`{}` has dtype `{wdt}` but the input is `{dt}`", w.val.ty),
                            ));
                        }
                    }
                }
                if let Some(eps) = arg(n_affine + 1) {
                    if !matches!(eps.val.ty, Ty::Scalar { .. }) {
                        self.report(Diagnostic::new(
                            "E0302",
                            eps.expr.span,
                            format!("`eps` must be a scalar, found `{}`", eps.val.ty),
                        ));
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
                    self.report(Diagnostic::new(
                        "E0412",
                        a1.expr.span,
                        "`reshape` can infer at most one dim (-1)",
                    ));
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
                                    .with_label(a0.span, format!("this is `{}`", a0.val.ty)),
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
            B::SaveNpy => {
                if !matches!(a0.val.ty, Ty::Tensor { .. } | Ty::Err) {
                    self.report(Diagnostic::new(
                        "E0302",
                        a0.expr.span,
                        format!("`save_npy` saves a tensor, found `{}`", a0.val.ty),
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
    fn print(&mut self, args: &[ArgV], span: Span) -> Val {
        // Python's `sep=` and `end=` (strings); `file=` and `flush=` have
        // no meaning in a session.
        for a in args {
            match a.name.map(|n| n.name.as_str()) {
                None => {}
                Some("sep" | "end") if matches!(a.val.ty, Ty::Str | Ty::Err) => {}
                Some("sep" | "end") => {
                    self.report(Diagnostic::new(
                        "E0302",
                        a.expr.span,
                        format!("`print`'s separators are strings, found `{}`", a.val.ty),
                    ));
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
            self.report(Diagnostic::new(
                "E0206",
                span,
                format!("`{twice}=` is given twice"),
            ));
        }
        Val::of(Ty::NoneV)
    }

    /// Whether a path argument is a string (E0302 otherwise).
    fn path_ok(&mut self, a: &ArgV) -> bool {
        if matches!(a.val.ty, Ty::Str | Ty::Err) {
            return true;
        }
        self.report(Diagnostic::new(
            "E0302",
            a.expr.span,
            format!("a path is a string, found `{}`", a.val.ty),
        ));
        false
    }

    /// `arange(n)`, `arange(start, end)`, `dtype=` in a top-level statement: a
    /// 1-D tensor made on the host.
    fn session_arange(&mut self, args: &[ArgV], span: Span) -> Val {
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

    fn minmax(&mut self, name: Builtin, args: &[ArgV], span: Span) -> Val {
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

    fn reduce(
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

    fn memory(
        &mut self,
        name: Builtin,
        ptr: &ArgV,
        second: Option<&ArgV>,
        third: Option<&ArgV>,
    ) -> Val {
        let (dims, dtype) = match &ptr.val.ty {
            // The GPU's atomic adds: f32, f64, f16, i32, u32, i64 (others
            // would need compare-and-swap loops, not generated).
            Ty::Ref { dtype, .. }
                if name == B::AtomicAdd
                    && !matches!(
                        dtype,
                        DType::F32 | DType::F64 | DType::F16 | DType::I32 | DType::U32 | DType::I64
                    ) =>
            {
                self.report(
                    Diagnostic::new(
                        "E0311",
                        ptr.expr.span,
                        format!("`atomic_add` on {dtype} tensors is not supported"),
                    )
                    .with_help("accumulate into an f32, f64, f16, i32, u32 or i64 tensor"),
                );
                return Val::of(Ty::NoneV);
            }
            Ty::Ref { dims, dtype } | Ty::Tensor { dims, dtype } => (dims.clone(), *dtype),
            Ty::Err => {
                return if name == B::Load {
                    Val::err()
                } else {
                    Val::of(Ty::NoneV)
                }
            }
            other => {
                self.report(
                    Diagnostic::new(
                        "E0302",
                        ptr.expr.span,
                        format!(
                            "`{name}` takes a slice of a tensor, found {} `{other}`",
                            other.kind_name()
                        ),
                    )
                    .with_help(format!(
                        "write e.g. `{name}(x[i : i + BLOCK]{})`",
                        if name == B::Load { "" } else { ", tile" }
                    )),
                );
                return Val::err();
            }
        };
        let (mask, other, value) = if name == B::Load {
            (second, third, None)
        } else {
            (third, None, second)
        };
        if let Some(m) = mask {
            if let Some((_, md, mdt)) = self.array(m) {
                if mdt != DType::Bool {
                    self.report(
                        Diagnostic::new(
                            "E0301",
                            m.expr.span,
                            format!("`mask=` must be a bool tile, found `{}`", m.val.ty),
                        )
                        .with_help("compare to get a mask, e.g. `offs < N`"),
                    );
                } else if broadcast(&md, &dims).as_deref() != Some(&dims[..]) {
                    self.report(
                        Diagnostic::new(
                            "E0402",
                            m.expr.span,
                            format!(
                                "mask of shape {} does not broadcast to the slice shape {}",
                                render_dims(&md),
                                render_dims(&dims)
                            ),
                        )
                        .with_label(
                            ptr.expr.span,
                            format!("this slice is {}", render_dims(&dims)),
                        ),
                    );
                }
            }
        }
        if let Some(o) = other {
            if let Some((_, od, odt)) = self.array(o) {
                if broadcast(&od, &dims).as_deref() != Some(&dims[..]) {
                    self.report(Diagnostic::new(
                        "E0402",
                        o.expr.span,
                        format!(
                            "`other=` of shape {} does not broadcast to the slice shape {}",
                            render_dims(&od),
                            render_dims(&dims)
                        ),
                    ));
                } else if !(o.val.ty.is_weak() && (dtype.is_float() || !odt.is_float()))
                    && !odt.widens_to(dtype)
                {
                    self.report(
                        Diagnostic::new(
                            "E0301",
                            o.expr.span,
                            format!("`other=` is `{odt}` but the tensor is `{dtype}`"),
                        )
                        .with_help(format!("convert it: `{}.to({dtype})`", describe(o.expr))),
                    );
                }
            }
        }
        if name == B::Load {
            return Val::of(Ty::tile(dims, dtype));
        }
        let Some(v) = value else {
            return Val::of(Ty::NoneV);
        };
        if v.val.ty.is_err() {
            return Val::of(Ty::NoneV);
        }
        let Some((k, vd, vdt)) = self.array(v) else {
            return Val::of(Ty::NoneV);
        };
        if k != Kind::Scalar && vd != dims {
            self.report(
                Diagnostic::new(
                    "E0408",
                    v.expr.span,
                    format!("the {name}d tile `{}` does not match the slice shape {}", v.val.ty, render_dims(&dims)).replace("atomic_addd", "added"),
                )
                .with_label(ptr.expr.span, format!("this slice has shape {}", render_dims(&dims)))
                .with_help("the tile must have exactly the slice's shape (only scalars broadcast); adjust the slice bounds or the tile"),
            );
            return Val::of(Ty::NoneV);
        }
        let weak_ok = v.val.ty.is_weak() && (dtype.is_float() || !vdt.is_float());
        if !weak_ok && !vdt.widens_to(dtype) {
            self.report(
                Diagnostic::new(
                    "E0301",
                    v.expr.span,
                    format!(
                        "storing `{vdt}` values into {} tensor would narrow them",
                        crate::diag::a_code(dtype)
                    ),
                )
                .with_label(
                    ptr.expr.span,
                    format!("this is {} tensor", crate::diag::a_code(dtype)),
                )
                .with_help(format!(
                    "cast explicitly: `{}.to({dtype})`",
                    describe(v.expr)
                )),
            );
        }
        Val::of(Ty::NoneV)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn dot_op(
        &mut self,
        l: &Val,
        r: &Val,
        acc: Option<(&Val, &Expr)>,
        precision: Option<(&Val, &Expr)>,
        span: Span,
        le: &Expr,
        re: &Expr,
    ) -> Val {
        if l.ty.is_err() || r.ty.is_err() {
            return Val::err();
        }
        let Some((_, ld)) = self.operand(l, le) else {
            return Val::err();
        };
        let Some((_, rd)) = self.operand(r, re) else {
            return Val::err();
        };
        for (d, v, e) in [(&ld, l, le), (&rd, r, re)] {
            if d.len() != 2 {
                self.report(
                    Diagnostic::new("E0411", e.span, format!("`dot` takes 2-D tiles; `{}` has rank {}", v.ty, d.len()))
                        .with_help("add an axis with `[:, None]` / `[None, :]`, or reduce with `sum(a * b, axis=k)`"),
                );
                return Val::err();
            }
        }
        // Tensor cores and the FMA path multiply floats only.
        for (v, e) in [(l, le), (r, re)] {
            if let Some(d) = v.ty.dtype().filter(|d| !d.is_float()) {
                self.report(
                    Diagnostic::new(
                        "E0311",
                        e.span,
                        format!("`dot` multiplies float tiles; this one is {d}"),
                    )
                    .with_help("convert the operands first: `.to(f16)` or `.to(f32)`"),
                );
                return Val::err();
            }
        }
        let (m, k1, k2, n) = (&ld[0], &ld[1], &rd[0], &rd[1]);
        if k1 != k2 {
            self.report(
                Diagnostic::new("E0403", span, format!("inner dims of `dot` differ: `{}` has K = {k1} but `{}` has K = {k2}", l.ty, r.ty))
                    .with_label(le.span, format!("this is {m} x {k1}"))
                    .with_label(re.span, format!("this is {k2} x {n}"))
                    .with_help("`dot(a, b)` multiplies M x K by K x N; transpose with `.T` or fix the slice sizes"),
            );
            return Val::err();
        }
        let (a, b) = (
            l.ty.dtype().unwrap_or(DType::F32),
            r.ty.dtype().unwrap_or(DType::F32),
        );
        if a != b {
            let widest = DType::join(a, b).unwrap_or(DType::F16);
            self.report(
                Diagnostic::new(
                    "E0301",
                    span,
                    format!("`dot` operands must have the same dtype: `{a}` and `{b}`"),
                )
                .with_label(le.span, format!("this is `{}`", l.ty))
                .with_label(re.span, format!("this is `{}`", r.ty))
                .with_help(format!(
                    "cast one side, e.g. `{}.to({widest})`",
                    describe(if widest == a { re } else { le })
                )),
            );
            return Val::err();
        }
        if !matches!(
            a,
            DType::F16
                | DType::BF16
                | DType::F8E4M3
                | DType::F8E5M2
                | DType::F32
                | DType::F64
                | DType::I8
        ) {
            self.report(
                Diagnostic::new(
                    "E0311",
                    span,
                    format!("`dot` does not support `{a}` operands"),
                )
                .with_help(
                    "dot takes f16, bf16, f8e4m3, f8e5m2, f32, f64 (or i8); cast with `.to(f16)`",
                ),
            );
            return Val::err();
        }
        let mut tf32 = false;
        if let Some((p, pe)) = precision {
            match &p.value {
                Some(Value::Str(s)) if s == "tf32" && a != DType::F32 => {
                    self.report(
                        Diagnostic::new(
                            "E0311",
                            pe.span,
                            format!("`precision=\"tf32\"` rounds f32 operands; these are `{a}`"),
                        )
                        .with_help("drop `precision=`, or multiply f32 tiles"),
                    );
                }
                Some(Value::Str(s)) if s == "tf32" => tf32 = true,
                Some(Value::Str(s)) if s == "ieee" => {}
                Some(Value::None) => {}
                _ if p.ty.is_err() => {}
                _ => self.report(Diagnostic::new(
                    "E0302",
                    pe.span,
                    "`precision=` must be \"tf32\" or \"ieee\"",
                )),
            }
        }
        // f64 accumulates in f64 (FMA units); every narrower float in f32.
        let out = match a {
            DType::I8 => DType::I32,
            DType::F64 => DType::F64,
            _ => DType::F32,
        };
        let result = vec![m.clone(), n.clone()];
        if let Some((acc, ae)) = acc {
            match &acc.ty {
                Ty::Err | Ty::NoneV => {}
                Ty::Tile { dims, dtype } => {
                    if *dims != result {
                        self.report(
                            Diagnostic::new(
                                "E0402",
                                ae.span,
                                format!(
                                    "the accumulator `{}` does not match the product shape {}",
                                    acc.ty,
                                    render_dims(&result)
                                ),
                            )
                            .with_help(format!(
                                "accumulate into `zeros({}, {out})`",
                                render_dims(&result)
                            )),
                        );
                    } else if *dtype != out {
                        self.report(
                            Diagnostic::new(
                                "E0301",
                                ae.span,
                                format!(
                                    "the accumulator is `{dtype}` but `dot` accumulates in `{out}`"
                                ),
                            )
                            .with_help(format!(
                                "accumulate into {} tile and cast the result afterwards",
                                crate::diag::a_code(out)
                            )),
                        );
                    }
                }
                other => {
                    self.operand(acc, ae);
                    if !matches!(other, Ty::Tensor { .. } | Ty::Ref { .. }) {
                        self.report(Diagnostic::new(
                            "E0302",
                            ae.span,
                            format!("the accumulator must be a tile, found `{other}`"),
                        ));
                    }
                }
            }
        }
        let tensor_cores = matches!(
            a,
            DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 | DType::I8
        ) || tf32;
        if tensor_cores {
            self.check_mma(a, tf32, [m, n, k1], span);
            self.usage.note_dot(&ld, &rd, a, span, self.loop_depth > 0);
        }
        Val::of(Ty::tile(result, out))
    }

    pub fn matmul_op(&mut self, l: &Val, r: &Val, span: Span, le: &Expr, re: &Expr) -> Val {
        if l.ty.is_err() || r.ty.is_err() {
            return Val::err();
        }
        let Some((lk, ld)) = self.operand(l, le) else {
            return Val::err();
        };
        let Some((rk, rd)) = self.operand(r, re) else {
            return Val::err();
        };
        for (d, v, e) in [(&ld, l, le), (&rd, r, re)] {
            if d.is_empty() {
                self.report(
                    Diagnostic::new(
                        "E0411",
                        e.span,
                        format!("`matmul` takes tensors of rank 1 or more, found `{}`", v.ty),
                    )
                    .with_help("multiply by a scalar with `*`"),
                );
                return Val::err();
            }
        }
        let (a1, b1) = (ld.len() == 1, rd.len() == 1);
        let a: Vec<Dim> = if a1 {
            vec![Dim::constant(1), ld[0].clone()]
        } else {
            ld.clone()
        };
        let b: Vec<Dim> = if b1 {
            vec![rd[0].clone(), Dim::constant(1)]
        } else {
            rd.clone()
        };
        let (ka, kb) = (&a[a.len() - 1], &b[b.len() - 2]);
        if ka != kb {
            self.report(
                Diagnostic::new("E0403", span, format!("inner dims of `matmul` differ: `{}` has K = {ka} but `{}` has K = {kb}", l.ty, r.ty))
                    .with_label(le.span, format!("this is `{}`", l.ty))
                    .with_label(re.span, format!("this is `{}`", r.ty))
                    .with_help("the last dim of the left operand must equal the second-to-last dim of the right one (transpose with `transpose(x, -2, -1)`)"),
            );
            return Val::err();
        }
        let Some(mut batch) = broadcast(&a[..a.len() - 2], &b[..b.len() - 2]) else {
            self.report(
                Diagnostic::new(
                    "E0402",
                    span,
                    format!(
                        "batch dims {} and {} of `matmul` do not broadcast",
                        render_dims(&a[..a.len() - 2]),
                        render_dims(&b[..b.len() - 2])
                    ),
                )
                .with_label(le.span, format!("this is `{}`", l.ty))
                .with_label(re.span, format!("this is `{}`", r.ty)),
            );
            return Val::err();
        };
        let (x, y) = (
            l.ty.dtype().unwrap_or(DType::F32),
            r.ty.dtype().unwrap_or(DType::F32),
        );
        if x != y {
            self.report(
                Diagnostic::new(
                    "E0301",
                    span,
                    format!("`matmul` operands must have the same dtype: `{x}` and `{y}`"),
                )
                .with_label(le.span, format!("this is `{}`", l.ty))
                .with_label(re.span, format!("this is `{}`", r.ty))
                .with_help(format!("cast one side, e.g. `{}.to({x})`", describe(re))),
            );
            return Val::err();
        }
        if x == DType::Bool {
            // As arithmetic on bools: no meaning the GPU has (E0311).
            self.report(
                Diagnostic::new("E0311", span, "`matmul` is not defined on `bool` values")
                    .with_label(le.span, format!("this is `{}`", l.ty))
                    .with_help(format!("convert first, e.g. `{}.to(i32)`", describe(le))),
            );
            return Val::err();
        }
        if !a1 {
            batch.push(a[a.len() - 2].clone());
        }
        if !b1 {
            batch.push(b[b.len() - 1].clone());
        }
        Val::of(make(lk.max(rk), batch, x, false))
    }

    fn cast(&mut self, recv: &Ty, args: &[ArgV], span: Span, func: &Expr) -> Val {
        let Some(slots) = self.bind_args("to", &["dtype"], &[true], args, span) else {
            return Val::err();
        };
        let Some(a) = slots[0].map(|i| &args[i]) else {
            return Val::err();
        };
        let dt = match &a.val.value {
            Some(Value::DType(d)) => *d,
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
                    _ => d.with_help("e.g. `.to(f32)` or `.to(bf16)`"),
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

    fn launch_grid(&mut self, indices: &[Index], span: Span) -> Option<usize> {
        let mut exprs: Vec<&Expr> = Vec::new();
        for i in indices {
            match i {
                Index::Expr(Expr {
                    kind: ExprKind::Tuple(items) | ExprKind::List(items),
                    ..
                }) if indices.len() == 1 => exprs.extend(items.iter()),
                Index::Expr(e) => exprs.push(e),
                Index::Slice { span, .. } => {
                    self.report(Diagnostic::new(
                        "E0502",
                        *span,
                        "a launch grid is a tuple of sizes, e.g. `k[(cdiv(N, BLOCK),)](...)`",
                    ));
                    return None;
                }
            }
        }
        if exprs.is_empty() || exprs.len() > 3 {
            self.report(
                Diagnostic::new(
                    "E0502",
                    span,
                    format!("a grid has 1 to 3 axes; this one has {}", exprs.len()),
                )
                .with_help("e.g. `k[(cdiv(M, BM), cdiv(N, BN))](...)`"),
            );
            return None;
        }
        let mut ok = true;
        for e in &exprs {
            let v = self.expr(e);
            match &v.ty {
                Ty::Scalar { dtype, .. } if dtype.is_int() => {}
                Ty::Err => ok = false,
                other => {
                    self.report(
                        Diagnostic::new(
                            "E0502",
                            e.span,
                            format!("grid sizes must be integers, found `{other}`"),
                        )
                        .with_help("e.g. `cdiv(N, BLOCK)`"),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(exprs.len())
    }

    /// A call of a user function or a kernel launch.
    pub fn call_fn(
        &mut self,
        sig: &Arc<FnSig>,
        grid: Option<Option<usize>>,
        args: &[ArgV],
        span: Span,
        func: &Expr,
    ) -> Val {
        let what = if sig.is_kernel { "kernel" } else { "function" };
        if self.in_kernel {
            self.report(
                Diagnostic::new("E0508", span, format!("a kernel cannot call the {what} `{}`", sig.name))
                    .with_help("kernels call builtins only; launch kernels from a whole-tensor function (a plain `def`)"),
            );
            return Val::err();
        }
        if sig.is_kernel && grid.is_none() && sig.grid_rank.is_none() {
            self.report(
                Diagnostic::new("E0501", func.span, format!("kernel `{}` is launched without a grid", sig.name))
                    .with_help(format!("give the grid at the launch, `{}[(g0, g1)](...)`, or in the decorator, `@kernel(grid=(...))`", sig.name)),
            );
        }
        let names: Vec<&str> = sig.params.iter().map(|p| p.name.as_str()).collect();
        let required: Vec<bool> = sig.params.iter().map(|p| !p.has_default).collect();
        let Some(slots) = self.bind_args(&sig.name, &names, &required, args, span) else {
            return if sig.is_kernel {
                Val::of(Ty::NoneV)
            } else {
                Val::err()
            };
        };
        // A generic callee: bind its dtype variables and batch runs, then check
        // the call against that instance of the signature.
        let instance;
        let sig = if sig.generics.is_some() {
            let cargs: Vec<super::generics::CallArg<'_>> = slots
                .iter()
                .enumerate()
                .filter_map(|(j, s)| {
                    s.map(|i| super::generics::CallArg {
                        param: j,
                        ty: &args[i].val.ty,
                        span: args[i].span,
                    })
                })
                .collect();
            match super::generics::bind_call_shown(sig, &cargs) {
                Ok((env, shown)) => {
                    self.instances.push((span, shown));
                    instance = Arc::new(super::generics::instantiate(sig, &env));
                    &instance
                }
                Err(diags) => {
                    for d in diags {
                        self.report(d);
                    }
                    return Val::err();
                }
            }
        } else {
            sig
        };
        let errors_before = self.diags.len();
        let mut binds: HashMap<String, (Dim, Span, String)> = HashMap::new();
        let mut deferred: Vec<(Dim, Dim, usize, usize)> = Vec::new();
        for (j, p) in sig.params.iter().enumerate() {
            let Some(i) = slots[j] else { continue };
            let a = &args[i];
            if a.val.ty.is_err() {
                continue;
            }
            if p.is_const && !self.is_compile_time(&a.val.value) {
                self.report(
                    Diagnostic::new(
                        "E0505",
                        a.span,
                        format!(
                            "`{}` is a const parameter of `{}` and needs a compile-time value",
                            p.name, sig.name
                        ),
                    )
                    .with_help("pass a literal, a module `const` or a `const` parameter"),
                );
                continue;
            }
            match &p.ty {
                Ty::Tensor {
                    dims: pd,
                    dtype: pdt,
                } => {
                    match &a.val.ty {
                        Ty::Tensor {
                            dims: ad,
                            dtype: adt,
                        } => {
                            if pd.len() != ad.len() {
                                self.report(
                                Diagnostic::new(
                                    "E0411",
                                    a.span,
                                    format!("argument `{}` of `{}` has rank {} (`{}`) but the parameter is `{}` (rank {})", p.name, sig.name, ad.len(), a.val.ty, p.ty, pd.len()),
                                ),
                            );
                                continue;
                            }
                            if pdt != adt {
                                self.report(
                                Diagnostic::new("E0301", a.span, format!("argument `{}` of `{}` is {} tensor but the parameter is `{}`", p.name, sig.name, crate::diag::a_code(adt), p.ty))
                                    .with_help(format!("convert it: `{}.to({pdt})`", describe(a.expr))),
                            );
                            }
                            for (k, (pdim, adim)) in pd.iter().zip(ad).enumerate() {
                                match pdim.as_symbol() {
                                    Some(s) => match binds.get(s) {
                                        Some((prev, pspan, pname)) => {
                                            if certainly_differ(prev, adim) {
                                                self.report(
                                                Diagnostic::new(
                                                    "E0401",
                                                    a.span,
                                                    format!("dim `{s}` of `{}` is {prev} in argument `{pname}` but {adim} in argument `{}`", sig.name, p.name),
                                                )
                                                .with_primary_label(format!("`{s}` = {adim} here (`{}`)", a.val.ty))
                                                .with_label(*pspan, format!("`{s}` = {prev} here"))
                                                .with_help(format!("every `{s}` in the signature of `{}` must have the same size", sig.name)),
                                            );
                                            }
                                        }
                                        None => {
                                            binds.insert(
                                                s.to_string(),
                                                (adim.clone(), a.span, p.name.clone()),
                                            );
                                        }
                                    },
                                    None => deferred.push((pdim.clone(), adim.clone(), i, k)),
                                }
                            }
                        }
                        other => {
                            self.report(
                            Diagnostic::new("E0302", a.span, format!("argument `{}` of `{}` must be a tensor (`{}`), found {} `{other}`", p.name, sig.name, p.ty, other.kind_name())),
                        );
                        }
                    }
                }
                Ty::Scalar { dtype: pdt, .. } => match &a.val.ty {
                    Ty::Scalar { dtype: adt, weak } => {
                        let ok = if *weak {
                            !adt.is_float()
                                || pdt.is_float()
                                    && ((*adt == DType::Bool) == (*pdt == DType::Bool))
                        } else {
                            adt.widens_to(*pdt)
                        };
                        if !ok {
                            self.report(
                                Diagnostic::new("E0301", a.span, format!("argument `{}` of `{}` is `{}` but the parameter is `{pdt}`", p.name, sig.name, a.val.ty))
                                    .with_help(format!("convert it: `{}.to({pdt})`", describe(a.expr))),
                            );
                        }
                        // An integer parameter names a dim of the result
                        // (`-> Tensor["n", f32]`): a known argument is its size,
                        // as the executor binds it when the function runs.
                        if let (true, Some(Value::Int(d))) = (pdt.is_int(), &a.val.value) {
                            binds.entry(p.name.clone()).or_insert((
                                d.clone(),
                                a.span,
                                p.name.clone(),
                            ));
                        }
                    }
                    other => self.report(Diagnostic::new(
                        "E0302",
                        a.span,
                        format!(
                            "argument `{}` of `{}` must be {} scalar, found {} `{other}`",
                            p.name,
                            sig.name,
                            crate::diag::a_code(pdt),
                            crate::diag::with_article(other.kind_name())
                        ),
                    )),
                },
                _ => {}
            }
        }
        for (pdim, adim, i, _) in deferred {
            let all_bound = pdim.symbols().iter().all(|s| binds.contains_key(*s));
            if !all_bound {
                continue;
            }
            let Some(expected) = pdim.substitute(&|s| binds.get(s).map(|b| b.0.clone())) else {
                continue;
            };
            if certainly_differ(&expected, &adim) {
                let a = &args[i];
                let mut d = Diagnostic::new(
                    "E0401",
                    a.span,
                    format!(
                        "dim `{pdim}` of `{}` should be {expected} but argument `{}` has {adim}",
                        sig.name,
                        describe(a.expr)
                    ),
                );
                for s in pdim.symbols() {
                    if let Some((v, sp, pname)) = binds.get(s) {
                        d = d.with_label(*sp, format!("`{s}` = {v} from argument `{pname}`"));
                    }
                }
                self.report(d);
            }
        }
        if self.diags[errors_before..].iter().any(|d| d.is_error()) {
            return if sig.is_kernel {
                Val::of(Ty::NoneV)
            } else {
                Val::err()
            };
        }
        self.call_result(sig, &binds)
    }

    fn call_result(&mut self, sig: &FnSig, binds: &HashMap<String, (Dim, Span, String)>) -> Val {
        match (&sig.ret, sig.is_kernel) {
            (_, true) => Val::of(Ty::NoneV),
            // No `->`: the value (if any) is not part of the signature.
            (None, _) => Val::err(),
            (Some(Ty::Tensor { dims, dtype }), _) => {
                let subst = |s: &str| binds.get(s).map(|b| b.0.clone());
                let dims: Option<Vec<Dim>> = dims.iter().map(|d| d.substitute(&subst)).collect();
                match dims {
                    Some(dims) => Val::of(Ty::Tensor {
                        dims,
                        dtype: *dtype,
                    }),
                    None => Val::err(),
                }
            }
            (Some(Ty::Scalar { dtype, .. }), _) => Val::of(Ty::scalar(*dtype)),
            (Some(_), _) => Val::err(),
        }
    }
}

/// E0324: a known integer that is not a value of the integer dtype it becomes.
pub fn out_of_range(i: i64, dt: DType, span: Span) -> Diagnostic {
    Diagnostic::new(
        "E0324",
        span,
        format!("the integer {i} is out of range for `{dt}`"),
    )
    .with_primary_label(format!("this becomes `{dt}`"))
    .with_help("use a wider dtype, or convert the other operand first, e.g. `.to(i64)`")
}
