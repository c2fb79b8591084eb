//! Function items: parameters, decorators (`@kernel` options, `@autotune`
//! spaces), the body walk, and the per-function warnings.

use std::collections::{HashMap, HashSet};

use super::ctx::{BindKind, Binding, Checker};
use super::dims::Dim;
use super::scope::{annotation_in, autotune_archs, Annot, ModuleScope, AUTOTUNE_ARCH_KEY};
use super::suggest;
use super::types::{DType, Ty, Value};
use super::ItemCheck;
use crate::diag::Diagnostic;
use crate::syntax::ast::{Decorator, Expr, ExprKind, Function};
use crate::target::{check_num_stages, check_num_warps, Arch, MAX_GRID};

pub(crate) const NUM_WARPS_HELP: &str =
    "num_warps is 1, 2, 4, 8, 16 or 32 (at most 1024 threads per block)";
pub(crate) const NUM_STAGES_HELP: &str = "num_stages is 1 (no pipelining) to 8; 2 to 4 is typical";

impl Checker<'_> {
    /// Binds a parameter whose type was rejected, so later uses report nothing more.
    fn bind_bad_param(&mut self, name: &crate::syntax::ast::Ident) {
        self.env_insert(
            name.name.clone(),
            Binding {
                ty: Ty::Err,
                value: None,
                kind: BindKind::Param,
                span: name.span,
                maybe_unbound: false,
            },
        );
    }

    fn params(&mut self, f: &Function) {
        let mut seen: HashSet<&str> = HashSet::new();
        let scope: &ModuleScope = self.scope;
        for p in &f.params {
            if !seen.insert(&p.name.name) {
                self.report(
                    Diagnostic::new(
                        "E0206",
                        p.name.span,
                        format!("duplicate parameter `{}`", p.name.name),
                    )
                    .with_help("give each parameter its own name"),
                );
                continue;
            }
            let annot = match &p.ty {
                Some(t) => annotation_in(t, &|n| scope.const_value(n), &self.tenv, &mut self.diags),
                None => {
                    if self.in_kernel {
                        self.report(
                            Diagnostic::new("E0510", p.name.span, format!("kernel parameter `{}` needs a type", p.name.name))
                                .with_help("kernel parameters are `Tensor[...]`, scalars (`n: i32`) or `const`"),
                        );
                    }
                    Annot::Ty(Ty::Err)
                }
            };
            let default = p.default.as_ref().map(|d| (self.expr(d), d));
            let tspan = p.ty.as_ref().map(|t| t.span).unwrap_or(p.name.span);
            match annot {
                Annot::Ty(Ty::Tensor { dims, dtype }) => {
                    if let Some((_, d)) = &default {
                        self.report(
                            Diagnostic::new(
                                "E0510",
                                d.span,
                                "tensor parameters cannot have defaults",
                            )
                            .with_help(
                                "remove the default: a tensor argument is passed at every launch",
                            ),
                        );
                    }
                    for d in &dims {
                        for s in d.symbols() {
                            if !self.env.contains_key(s) && !seen.contains(s) {
                                self.env_insert(
                                    s.to_string(),
                                    Binding {
                                        ty: Ty::scalar(super::types::DType::I32),
                                        value: Some(Value::Int(Dim::symbol(s))),
                                        kind: BindKind::Dim,
                                        span: tspan,
                                        maybe_unbound: false,
                                    },
                                );
                            }
                        }
                    }
                    let ty = Ty::Tensor { dims, dtype };
                    self.record(p.name.span, &ty);
                    self.env_insert(
                        p.name.name.clone(),
                        Binding {
                            ty,
                            value: None,
                            kind: BindKind::Param,
                            span: p.name.span,
                            maybe_unbound: false,
                        },
                    );
                }
                Annot::Ty(Ty::Scalar {
                    dtype: dt @ (DType::F8E4M3 | DType::F8E5M2),
                    ..
                }) if self.in_kernel => {
                    self.report(
                        Diagnostic::new(
                            "E0510",
                            tspan,
                            format!(
                                "kernel parameter `{}` cannot be an {dt} scalar",
                                p.name.name
                            ),
                        )
                        .with_help(
                            "pass it as f16 or f32 and convert with `.to(...)` where needed",
                        ),
                    );
                    self.bind_bad_param(&p.name);
                }
                Annot::Ty(Ty::Tile { .. }) => {
                    self.report(
                        Diagnostic::new(
                            "E0510",
                            tspan,
                            format!(
                                "parameter `{}` cannot be a `Tile`: tiles live inside kernels",
                                p.name.name
                            ),
                        )
                        .with_help("take a `Tensor[...]` and `load` tiles from it"),
                    );
                    self.bind_bad_param(&p.name);
                }
                Annot::Ty(ty) => {
                    let value = match &ty {
                        Ty::Scalar { dtype, .. } if dtype.is_int() => {
                            Some(Value::Int(self.fresh_runtime(&p.name.name)))
                        }
                        _ => None,
                    };
                    if let (Ty::Scalar { dtype, .. }, Some((dv, de))) = (&ty, &default) {
                        match &dv.ty {
                            Ty::Scalar { dtype: vd, weak } => {
                                let ok = if *weak {
                                    !vd.is_float() || dtype.is_float()
                                } else {
                                    vd.widens_to(*dtype)
                                };
                                if !ok {
                                    self.report(Diagnostic::new(
                                        "E0301",
                                        de.span,
                                        format!("the default `{}` does not fit `{dtype}`", dv.ty),
                                    )
                                    .with_help(
                                        format!("give a default that `{dtype}` holds (an integer for an integer parameter), or change the parameter's dtype"),
                                    ));
                                }
                            }
                            Ty::Err => {}
                            other => self.report(
                                Diagnostic::new(
                                    "E0302",
                                    de.span,
                                    format!(
                                    "the default of {} parameter must be a scalar, found `{other}`",
                                    crate::diag::a_code(dtype)
                                ),
                                )
                                .with_help(format!(
                                    "give one number, e.g. `= {}`",
                                    if dtype.is_float() { "0.0" } else { "0" }
                                )),
                            ),
                        }
                    }
                    self.record(p.name.span, &ty);
                    self.env_insert(
                        p.name.name.clone(),
                        Binding {
                            ty,
                            value,
                            kind: BindKind::Param,
                            span: p.name.span,
                            maybe_unbound: false,
                        },
                    );
                }
                Annot::Const(dt) => {
                    let (ty, value) = match &default {
                        Some((dv, de)) => {
                            if !dv.ty.is_err() && !self.is_compile_time(&dv.value) {
                                self.report(
                                    Diagnostic::new("E0505", de.span, format!("the default of const parameter `{}` is not a compile-time value", p.name.name))
                                        .with_help("use a literal or a module `const`"),
                                );
                            }
                            let ty = match (dt, &dv.ty) {
                                (Some(d), _) => Ty::weak(d),
                                (None, Ty::Scalar { dtype, .. }) => Ty::weak(*dtype),
                                (None, Ty::DTypeV) => Ty::DTypeV,
                                (None, Ty::Str) => Ty::Str,
                                (None, _) => Ty::Err,
                            };
                            if let (Some(d), Ty::Scalar { dtype: vd, .. }) = (dt, &dv.ty) {
                                if (vd.is_float() && !d.is_float())
                                    || ((*vd == super::types::DType::Bool)
                                        != (d == super::types::DType::Bool))
                                {
                                    self.report(Diagnostic::new(
                                        "E0301",
                                        de.span,
                                        format!("the default `{}` does not fit `const {d}`", dv.ty),
                                    )
                                    .with_help(
                                        format!("give a default that `{d}` holds, or drop the dtype: `{}: const = ...`", p.name.name),
                                    ));
                                }
                            }
                            (ty, dv.value.clone())
                        }
                        None => (
                            Ty::weak(dt.unwrap_or(super::types::DType::I32)),
                            Some(Value::Int(Dim::symbol(p.name.name.clone()))),
                        ),
                    };
                    self.record(p.name.span, &ty);
                    self.env_insert(
                        p.name.name.clone(),
                        Binding {
                            ty,
                            value,
                            kind: BindKind::ConstParam,
                            span: p.name.span,
                            maybe_unbound: false,
                        },
                    );
                }
            }
        }
    }

    fn decorators(&mut self, f: &Function) {
        for (i, d) in f.decorators.iter().enumerate() {
            match d.name.name.as_str() {
                "kernel" => self.kernel_options(d),
                "autotune" => {
                    if !f.decorators[i + 1..]
                        .iter()
                        .any(|x| x.name.name == "kernel")
                    {
                        self.report(
                            Diagnostic::new("E0207", d.name.span, "`@autotune` must be placed above `@kernel`")
                                .with_help("autotuning searches the options of a kernel: add `@kernel(...)` below it"),
                        );
                    }
                    self.autotune(d, f);
                }
                other => {
                    let mut diag = Diagnostic::new(
                        "E0207",
                        d.name.span,
                        format!("unknown decorator `@{other}`"),
                    );
                    diag = match suggest(other, ["kernel", "autotune"].into_iter()) {
                        Some(s) => diag.with_help(format!("did you mean `@{s}`?")),
                        None => {
                            diag.with_help("the decorators are `@kernel(...)` and `@autotune(...)`")
                        }
                    };
                    self.report(diag);
                }
            }
        }
    }

    fn option_int(&mut self, e: &Expr) -> Option<i64> {
        let v = self.expr(e);
        if v.ty.is_err() {
            return None;
        }
        match v.value.as_ref().and_then(Value::as_int) {
            Some(i) if self.is_compile_time(&v.value) => Some(i),
            _ => {
                self.report(
                    Diagnostic::new(
                        "E0506",
                        e.span,
                        format!(
                            "this option must be a compile-time integer, found `{}`",
                            v.ty
                        ),
                    )
                    .with_help("write an integer literal or a `const`, e.g. `num_warps=4`"),
                );
                None
            }
        }
    }

    fn kernel_options(&mut self, d: &Decorator) {
        let Some(args) = &d.args else { return };
        for a in args {
            let Some(name) = &a.name else {
                self.expr(&a.value);
                self.report(
                    Diagnostic::new("E0207", a.span, "`@kernel` options are given by name")
                        .with_help("write `@kernel(grid=(...), num_warps=4, num_stages=2)`"),
                );
                continue;
            };
            match name.name.as_str() {
                "grid" => self.grid_option(&a.value),
                "num_warps" => {
                    if let Some(n) = self.option_int(&a.value) {
                        if let Err(m) = check_num_warps(n) {
                            self.report(
                                Diagnostic::new("E0607", a.value.span, m).with_help(NUM_WARPS_HELP),
                            );
                        } else {
                            self.kernel.num_warps =
                                Some(self.kernel.num_warps.unwrap_or(0).max(n as u64));
                            self.check_threads(n as u64, a.value.span);
                        }
                    }
                }
                "num_stages" => {
                    if let Some(n) = self.option_int(&a.value) {
                        if let Err(m) = check_num_stages(n) {
                            self.report(
                                Diagnostic::new("E0608", a.value.span, m)
                                    .with_help(NUM_STAGES_HELP),
                            );
                        } else {
                            self.kernel.num_stages = Some(n as u64);
                        }
                    }
                }
                other => {
                    self.expr(&a.value);
                    let mut diag = Diagnostic::new(
                        "E0207",
                        name.span,
                        format!("unknown option `{other}` of `@kernel`"),
                    );
                    diag = match suggest(other, ["grid", "num_warps", "num_stages"].into_iter()) {
                        Some(s) => diag.with_help(format!("did you mean `{s}`?")),
                        None => diag.with_help("`@kernel` takes grid=, num_warps= and num_stages="),
                    };
                    self.report(diag);
                }
            }
        }
    }

    fn check_threads(&mut self, warps: u64, span: crate::syntax::span::Span) {
        let info = self.arch.info();
        let threads = warps.saturating_mul(info.warp_size as u64);
        if threads > info.max_threads_per_block as u64 {
            self.report(
                Diagnostic::new(
                    "E0604",
                    span,
                    format!(
                        "{warps} warps are {threads} threads per block, more than the {} {} allows",
                        info.max_threads_per_block, info.name
                    ),
                )
                .with_help(format!(
                    "use at most {} warps",
                    info.max_threads_per_block / info.warp_size
                )),
            );
        }
    }

    fn grid_option(&mut self, e: &Expr) {
        let items: Vec<&Expr> = match &e.kind {
            ExprKind::Tuple(v) | ExprKind::List(v) => v.iter().collect(),
            _ => vec![e],
        };
        if items.is_empty() || items.len() > 3 {
            self.report(
                Diagnostic::new(
                    "E0502",
                    e.span,
                    format!("a grid has 1 to 3 axes; this one has {}", items.len()),
                )
                .with_help("e.g. `grid=(cdiv(M, BM), cdiv(N, BN))`"),
            );
            return;
        }
        let mut ok = true;
        for (axis, it) in items.iter().enumerate() {
            let v = self.expr(it);
            match &v.ty {
                Ty::Scalar { dtype, .. } if dtype.is_int() => {
                    // A size known here is held to the launch limits now.
                    let known = v
                        .value
                        .as_ref()
                        .filter(|_| self.is_compile_time(&v.value))
                        .and_then(Value::as_int);
                    let max = MAX_GRID[axis];
                    // 0 is a launch of no programs, as at run time.
                    if let Some(n) = known.filter(|n| *n < 0 || *n > max) {
                        self.report(
                            Diagnostic::new(
                                "E0609",
                                it.span,
                                format!("grid dim {axis} is {n}; it must be from 0 to {max}"),
                            )
                            .with_help("grids are at most (2147483647, 65535, 65535) programs (CUDA's limits): use bigger blocks, or loop inside the kernel"),
                        );
                    }
                }
                Ty::Err => ok = false,
                other => {
                    ok = false;
                    self.report(
                        Diagnostic::new(
                            "E0502",
                            it.span,
                            format!("grid sizes must be integers, found `{other}`"),
                        )
                        .with_help("e.g. `cdiv(N, BLOCK)`"),
                    );
                }
            }
        }
        if ok {
            self.kernel.grid_rank = Some(items.len());
        }
    }

    fn autotune(&mut self, d: &Decorator, f: &Function) {
        let Some(args) = &d.args else {
            self.report(
                Diagnostic::new("E0509", d.span, "`@autotune` needs a search space")
                    .with_help("write `@autotune(space={\"BM\": [64, 128]}, key=[\"M\"])`"),
            );
            return;
        };
        let const_params: Vec<&str> = f
            .params
            .iter()
            .filter(|p| {
                matches!(
                    p.ty.as_ref().map(|t| &t.kind),
                    Some(crate::syntax::ast::TypeExprKind::Const(_))
                )
            })
            .map(|p| p.name.name.as_str())
            .collect();
        let mut has_space = false;
        let mut bad_option = false;
        for a in args {
            let name = a.name.as_ref().map(|n| n.name.as_str());
            match name {
                Some("space") => {
                    has_space = true;
                    match &a.value.kind {
                        ExprKind::Dict(pairs) => {
                            for (k, v) in pairs {
                                if matches!(&k.kind, ExprKind::Str(s) if s == AUTOTUNE_ARCH_KEY) {
                                    self.report(
                                        Diagnostic::new(
                                            "E0509",
                                            k.span,
                                            "`arch` names the targets of one configuration, in a list of configurations",
                                        )
                                        .with_help("write the space as a list of dicts, e.g. `space=[{\"BK\": 32, \"arch\": [\"sm_80\", \"sm_90\"]}, {\"BK\": 64, \"arch\": \"sm_90a\"}]`"),
                                    );
                                    continue;
                                }
                                let Some(key) = self.autotune_name(k, f, &const_params) else {
                                    continue;
                                };
                                let vals = self.expr(v);
                                let ints: Option<Vec<i64>> = match (&v.kind, &vals.value) {
                                    (
                                        ExprKind::List(_) | ExprKind::Tuple(_),
                                        Some(Value::Tuple(items)),
                                    ) if !items.is_empty() => {
                                        items.iter().map(Value::as_int).collect()
                                    }
                                    _ => None,
                                };
                                match ints {
                                    None => self.report(
                                        Diagnostic::new(
                                            "E0509",
                                            v.span,
                                            format!(
                                            "the values of `{key}` must be a non-empty list of constants"
                                        ),
                                        )
                                        .with_help(format!(
                                            "write a list of constants, e.g. `\"{key}\": [64, 128]`"
                                        )),
                                    ),
                                    Some(vs) => self.autotune_values(key, &vs, v.span),
                                }
                            }
                        }
                        ExprKind::List(items) | ExprKind::Tuple(items) if !items.is_empty() => {
                            for it in items {
                                let ExprKind::Dict(pairs) = &it.kind else {
                                    self.report(
                                        Diagnostic::new(
                                            "E0509",
                                            it.span,
                                            "each configuration of an autotune space list must be a dict of option name to value",
                                        )
                                        .with_help(SPACE_LIST_HELP),
                                    );
                                    continue;
                                };
                                for (k, v) in pairs {
                                    if matches!(&k.kind, ExprKind::Str(s) if s == AUTOTUNE_ARCH_KEY)
                                    {
                                        self.autotune_arch(v);
                                        continue;
                                    }
                                    let Some(key) = self.autotune_name(k, f, &const_params) else {
                                        continue;
                                    };
                                    match self.expr(v).value.as_ref().and_then(Value::as_int) {
                                        None => self.report(
                                            Diagnostic::new(
                                                "E0509",
                                                v.span,
                                                format!("the value of `{key}` must be a constant"),
                                            )
                                            .with_help(SPACE_LIST_HELP),
                                        ),
                                        Some(n) => self.autotune_values(key, &[n], v.span),
                                    }
                                }
                            }
                        }
                        _ => self.report(
                            Diagnostic::new(
                                "E0509",
                                a.value.span,
                                "the autotune space must be a dict of option name to a list of values, or a non-empty list of configurations",
                            )
                            .with_help(
                                "write a dict of lists, `space={\"BM\": [64, 128], \"num_warps\": [4, 8]}` (every combination), or a list of dicts, `space=[{\"BM\": 128, \"BN\": 64}, {\"BM\": 64, \"BN\": 128}]` (these configurations)",
                            ),
                        ),
                    }
                }
                Some("key") => {
                    let dims: Vec<String> = self
                        .env
                        .iter()
                        .filter(|(_, b)| b.kind == BindKind::Dim)
                        .map(|(n, _)| n.clone())
                        .collect();
                    let items: Vec<&Expr> = match &a.value.kind {
                        ExprKind::List(v) | ExprKind::Tuple(v) => v.iter().collect(),
                        _ => {
                            self.report(
                                Diagnostic::new(
                                    "E0509",
                                    a.value.span,
                                    "the autotune key must be a list of dim or parameter names",
                                )
                                .with_help(
                                    "write a list of names in quotes, e.g. `key=[\"M\", \"N\"]`",
                                ),
                            );
                            continue;
                        }
                    };
                    for it in items {
                        match &it.kind {
                            ExprKind::Str(s)
                                if dims.contains(s)
                                    || f.params.iter().any(|p| &p.name.name == s) => {}
                            _ => {
                                let shown = match &it.kind {
                                    ExprKind::Str(s) => format!("`{s}`"),
                                    _ => "this".to_string(),
                                };
                                let mut diag = Diagnostic::new(
                                    "E0509",
                                    it.span,
                                    format!(
                                        "{shown} is not a dim or parameter of `{}`",
                                        f.name.name
                                    ),
                                );
                                let sug = match &it.kind {
                                    ExprKind::Str(s) => suggest(s, dims.iter().map(String::as_str)),
                                    _ => None,
                                };
                                diag = match sug {
                                    Some(sug) => diag.with_help(format!("did you mean `{sug}`?")),
                                    None => diag.with_help(
                                        "name a dim or parameter of the kernel in quotes, e.g. `key=[\"N\"]`",
                                    ),
                                };
                                self.report(diag);
                            }
                        }
                    }
                }
                _ => {
                    bad_option = true;
                    let msg = match name {
                        Some(n) => format!("unknown option `{n}` of `@autotune`"),
                        None => "`@autotune` options are given by name".to_string(),
                    };
                    let help = match name.and_then(|n| suggest(n, ["space", "key"].into_iter())) {
                        Some(s) => format!("did you mean `{s}`?"),
                        None => {
                            "write `@autotune(space={\"BM\": [64, 128]}, key=[\"M\"])`".to_string()
                        }
                    };
                    self.report(Diagnostic::new("E0207", a.span, msg).with_help(help));
                }
            }
        }
        if !has_space && !bad_option {
            self.report(
                Diagnostic::new("E0509", d.span, "`@autotune` needs `space=`")
                    .with_help("add the search space, e.g. `@autotune(space={\"BM\": [64, 128]})`"),
            );
        }
    }
}

impl Checker<'_> {
    /// The option an autotune space names with `k` (a const parameter of `f`,
    /// `num_warps` or `num_stages`); E0509 otherwise.
    fn autotune_name<'k>(
        &mut self,
        k: &'k Expr,
        f: &Function,
        const_params: &[&str],
    ) -> Option<&'k str> {
        let key = match &k.kind {
            ExprKind::Str(s) => s.as_str(),
            _ => {
                self.report(
                    Diagnostic::new(
                        "E0509",
                        k.span,
                        "autotune space keys are strings naming const parameters or kernel options",
                    )
                    .with_help("quote the name: `space={\"BM\": [64, 128]}`"),
                );
                return None;
            }
        };
        if const_params.contains(&key) || key == "num_warps" || key == "num_stages" {
            return Some(key);
        }
        let cands = const_params
            .iter()
            .copied()
            .chain(["num_warps", "num_stages"]);
        let mut diag = Diagnostic::new(
            "E0509",
            k.span,
            format!(
                "`{key}` is not a const parameter of `{}` nor a kernel option",
                f.name.name
            ),
        );
        diag = match suggest(key, cands) {
            Some(s) => diag.with_help(format!("did you mean `{s}`?")),
            None => diag.with_help(
                "autotune the kernel's `const` parameters, `num_warps` and `num_stages`",
            ),
        };
        self.report(diag);
        None
    }

    /// Checks a configuration's `"arch"`: an arch name or a list of them.
    fn autotune_arch(&mut self, v: &Expr) {
        let value = self.expr(v).value;
        let bad = match value.as_ref().map(autotune_archs) {
            Some(Ok(_)) => return,
            Some(Err(what)) => format!("{what} is not an arch"),
            None => "the value of `arch` must be a constant".to_string(),
        };
        let names: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        // A misspelt name: the nearest arch.
        let near = bad
            .strip_prefix('"')
            .and_then(|b| b.split('"').next())
            .and_then(|b| suggest(b, names.iter().copied()));
        self.report(
            Diagnostic::new(
                "E0509",
                v.span,
                format!("{bad}: `arch` takes an arch name or a list of them"),
            )
            .with_help(match near {
                Some(n) => format!("did you mean `{n}`? the archs are {}", names.join(", ")),
                None => format!(
                    "write e.g. `\"arch\": [\"sm_80\", \"sm_90\"]`; the archs are {}",
                    names.join(", ")
                ),
            }),
        );
    }

    /// Checks the values an autotune space gives option `key` (at `span`).
    fn autotune_values(&mut self, key: &str, vs: &[i64], span: crate::syntax::span::Span) {
        match key {
            "num_stages" => {
                for &n in vs {
                    if let Err(m) = check_num_stages(n) {
                        self.report(Diagnostic::new("E0608", span, m).with_help(NUM_STAGES_HELP));
                    }
                }
            }
            "num_warps" => {
                for &n in vs {
                    if let Err(m) = check_num_warps(n) {
                        self.report(Diagnostic::new("E0607", span, m).with_help(NUM_WARPS_HELP));
                    } else {
                        self.check_threads(n as u64, span);
                        self.kernel.num_warps =
                            Some(self.kernel.num_warps.unwrap_or(0).max(n as u64));
                    }
                }
            }
            _ => {}
        }
    }
}

const SPACE_LIST_HELP: &str = "write a list of dicts, one a configuration: `space=[{\"BM\": 128, \"BN\": 64}, {\"BM\": 64, \"BN\": 128}]`";

/// Checks one function or kernel item.
pub fn check_function(f: &Function, scope: &ModuleScope, arch: Arch) -> ItemCheck {
    check_function_with(f, scope, arch, false).0
}

/// Checks a function and also returns the value of every checked expression
/// (item-relative span, type and compile-time value, in walk order): what the
/// lowering to Graph IR reads instead of re-deriving shapes.
pub fn check_function_typed(
    f: &Function,
    scope: &ModuleScope,
    arch: Arch,
) -> (ItemCheck, Vec<(crate::syntax::span::Span, super::ctx::Val)>) {
    check_function_with(f, scope, arch, true)
}

/// Checks a generic function's body once per dtype its variables allow (the
/// representative's check gives the types and values; the first other
/// instance with errors adds those, saying which instance it is), or one
/// instance only when `env` fixes it (lowering a call's instance).
fn check_function_with(
    f: &Function,
    scope: &ModuleScope,
    arch: Arch,
    keep_vals: bool,
) -> (ItemCheck, Vec<(crate::syntax::span::Span, super::ctx::Val)>) {
    let mut decl = Vec::new();
    super::generics::check_decl(f, &mut decl);
    if super::generics::generic_sig(f).is_none() {
        let (mut check, vals) = check_function_in(f, scope, arch, keep_vals, Default::default());
        if !decl.is_empty() {
            check.diagnostics.extend(decl);
            check
                .diagnostics
                .sort_by_key(|d| (d.span.start, d.span.end));
        }
        return (check, vals);
    }
    // A kernel cannot be generic (E0323): its body is checked once.
    let envs = if f.is_kernel() {
        vec![super::generics::representative(f)]
    } else {
        super::generics::body_envs(f, 16)
    };
    let mut first = None;
    for env in envs {
        let shown = env.describe();
        let (check, vals) = check_function_in(f, scope, arch, keep_vals, env);
        let Some((c0, _)) = &mut first else {
            first = Some((check, vals));
            continue;
        };
        let c0: &mut ItemCheck = c0;
        if c0.diagnostics.iter().any(|d| d.is_error()) {
            break;
        }
        let errors: Vec<_> = check
            .diagnostics
            .into_iter()
            .filter(|d| d.is_error())
            .map(|mut d| {
                // Kept after the error's own help, which says how to fix it.
                let note = format!("this error is in the instance {shown}");
                d.help = Some(match d.help.take() {
                    Some(h) => format!("{h} ({note})"),
                    None => note,
                });
                d
            })
            .collect();
        if !errors.is_empty() {
            c0.diagnostics.extend(errors);
            break;
        }
    }
    let (mut check, vals) = first.unwrap_or_default();
    if !f.type_params.is_empty() && !f.is_kernel() {
        // Hover and inlay hints show the body's types with the variables
        // (`Tensor[*B, N, T]`), not at the representative dtype.
        let (a, b) = super::generics::naming_envs(f);
        let in_a = check_function_in(f, scope, arch, false, a.clone()).0.types;
        let in_b = check_function_in(f, scope, arch, false, b.clone()).0.types;
        let named: HashMap<crate::syntax::span::Span, String> = in_a
            .iter()
            .zip(&in_b)
            .filter(|((sa, ta), (sb, tb))| sa == sb && ta != tb)
            .filter_map(|((sa, ta), (_, tb))| {
                super::generics::name_dtype_vars(ta, tb, &a, &b).map(|t| (*sa, t))
            })
            .collect();
        for (span, ty) in &mut check.types {
            if let Some(t) = named.get(span) {
                ty.clone_from(t);
            }
        }
    }
    check.diagnostics.extend(decl);
    check
        .diagnostics
        .sort_by_key(|d| (d.span.start, d.span.end));
    (check, vals)
}

/// Checks a function with a fixed meaning of its dtype variables and runs.
pub fn check_function_instance(
    f: &Function,
    scope: &ModuleScope,
    arch: Arch,
    env: super::generics::TypeEnv,
) -> (ItemCheck, Vec<(crate::syntax::span::Span, super::ctx::Val)>) {
    let mut decl = Vec::new();
    super::generics::check_decl(f, &mut decl);
    let (mut check, vals) = check_function_in(f, scope, arch, true, env);
    check.diagnostics.extend(decl);
    (check, vals)
}

fn check_function_in(
    f: &Function,
    scope: &ModuleScope,
    arch: Arch,
    keep_vals: bool,
    env: super::generics::TypeEnv,
) -> (ItemCheck, Vec<(crate::syntax::span::Span, super::ctx::Val)>) {
    let mut c = Checker::new(scope, arch);
    c.tenv = env;
    if keep_vals {
        c.expr_vals = Some(Vec::new());
    }
    c.in_kernel = f.is_kernel();
    c.fn_name = f.name.name.clone();
    c.params(f);
    let mut assigned = Vec::new();
    super::stmt::assigned_names(&f.body, &mut assigned);
    c.fn_locals = assigned
        .into_iter()
        .filter(|n| {
            !c.env.contains_key(n)
                && !matches!(scope.get(n), Some(super::scope::Entry::Const { .. }))
                && !super::builtins::is_builtin(n)
                && super::types::DType::from_name(n).is_none()
        })
        .collect();
    if let Some(rt) = &f.ret {
        let mut ann = Vec::new();
        let a = annotation_in(rt, &|n| scope.const_value(n), &c.tenv, &mut ann);
        c.diags.extend(ann);
        if c.in_kernel {
            c.report(
                Diagnostic::new("E0504", rt.span, "a kernel cannot return a value").with_help(
                    "remove the return type and write results with `store(out[...], tile)`",
                ),
            );
        } else {
            let ty = match a {
                Annot::Ty(t) => t,
                Annot::Const(dt) => dt.map(Ty::scalar).unwrap_or(Ty::Err),
            };
            if matches!(ty, Ty::Tile { .. }) {
                c.report(Diagnostic::new(
                    "E0510",
                    rt.span,
                    "a function cannot return a `Tile`: tiles live inside kernels",
                )
                .with_help(
                    "return a `Tensor[...]`, or write this code inside the kernel that uses the tile",
                ));
                c.ret = Some((Ty::Err, rt.span));
            } else {
                c.ret = Some((ty, rt.span));
            }
        }
    }
    c.decorators(f);
    let terminated = c.block(&f.body);
    if !terminated && !c.in_kernel {
        if let Some((rt, span)) = c.ret.clone() {
            fn any_return(b: &[crate::syntax::ast::Stmt]) -> bool {
                use crate::syntax::ast::StmtKind;
                b.iter().any(|s| match &s.kind {
                    StmtKind::Return(_) => true,
                    StmtKind::If { branches, orelse } => {
                        branches.iter().any(|(_, b)| any_return(b))
                            || orelse.as_deref().is_some_and(any_return)
                    }
                    StmtKind::For { body, .. } | StmtKind::While { body, .. } => any_return(body),
                    _ => false,
                })
            }
            if !rt.is_err() {
                let what = if any_return(&f.body) {
                    "can reach the end of its body without returning a value"
                } else {
                    "never returns a value"
                };
                c.report(
                    Diagnostic::new(
                        "E0307",
                        f.name.span,
                        format!("`{}` declares `-> {rt}` but {what}", f.name.name),
                    )
                    .with_label(span, "declared here")
                    .with_help("add a `return` at the end of the body"),
                );
            }
        }
    }
    if c.in_kernel {
        c.finish_resources();
    }
    let mut defs = std::mem::take(&mut c.local_defs);
    defs.sort_by_key(|(_, s)| s.start);
    for (name, span) in defs {
        if !c.reads.contains(&name) && !name.starts_with('_') {
            c.report(
                Diagnostic::new("W0001", span, format!("unused variable `{name}`")).with_help(
                    format!("remove it, or call it `_{name}` if it is intentional"),
                ),
            );
        }
    }

    let vals = c.expr_vals.take().unwrap_or_default();
    (c.into_check(Some(f)), vals)
}
