//! Calls of user functions and kernel launches: argument binding, dim
//! unification, const arguments, grids and the result type.

use super::*;

impl Checker<'_> {
    pub(super) fn launch_grid(&mut self, indices: &[Index], span: Span) -> Option<usize> {
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
                    )
                    .with_help(
                        "write each grid entry as a number of programs, not a slice: `k[(cdiv(N, BLOCK),)](...)`",
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
            let cargs: Vec<crate::check::generics::CallArg<'_>> = slots
                .iter()
                .enumerate()
                .filter_map(|(j, s)| {
                    s.map(|i| crate::check::generics::CallArg {
                        param: j,
                        ty: &args[i].val.ty,
                        span: args[i].span,
                    })
                })
                .collect();
            match crate::check::generics::bind_call_shown(sig, &cargs) {
                Ok((env, shown)) => {
                    self.instances.push((span, shown));
                    instance = Arc::new(crate::check::generics::instantiate(sig, &env));
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
                                )
                                .with_help(
                                    format!("pass a tensor of rank {} (e.g. `reshape({}, [...])`), or change the parameter's type", pd.len(), describe(a.expr)),
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
                            Diagnostic::new("E0302", a.span, format!("argument `{}` of `{}` must be a tensor (`{}`), found {} `{other}`", p.name, sig.name, p.ty, other.kind_name()))
                                .with_help(
                                    format!("pass a tensor for `{}`, e.g. one made by `tensor([...])` or `zeros([...], f32)`", p.name),
                                ),
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
                    )
                    .with_help(
                        format!("pass one number for `{}`; read one element of a tensor by indexing it, e.g. `t[0]`", p.name),
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
                d = d.with_help(format!(
                    "pass a tensor whose dim is {expected}, or slice `{}` to that size",
                    describe(a.expr)
                ));
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

    pub(super) fn call_result(
        &mut self,
        sig: &FnSig,
        binds: &HashMap<String, (Dim, Span, String)>,
    ) -> Val {
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
