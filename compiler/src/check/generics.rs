//! Dtype variables and leading batch runs of generic whole-tensor functions:
//! `def softmax[T: float](x: Tensor["*B", "N", T]) -> Tensor["*B", "N", T]`.
//!
//! A generic signature keeps, per parameter and for the result, which dtype
//! variable names its dtype and which batch run (`"*B"`) leads its dims
//! ([`GenericSig`]). Its [`FnSig`] types hold a representative dtype and the run
//! as one opaque dim `*B`. A call binds every variable and run from its
//! arguments ([`bind_call`]) and then checks against the signature instantiated
//! with them ([`instantiate`]): the dtype substituted and each run expanded to
//! fresh dims `*B#0`, `*B#1`, ... (shown as `*B`), which bind like any dim. The
//! body is checked once per dtype the bound allows (errors that only some
//! dtypes have are found at the definition) with the run opaque; lowering
//! re-checks it per instance (a call's dtypes and run lengths).

use std::collections::HashMap;

use super::dims::Dim;
use super::scope::{FnSig, ParamSig};
use super::types::{DType, Ty};
use crate::diag::Diagnostic;
use crate::syntax::ast::{self, ExprKind, TypeExpr, TypeExprKind};
use crate::syntax::span::Span;

/// What a dtype variable may stand for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    Any,
    Float,
    Int,
}

impl Bound {
    pub fn from_name(s: &str) -> Option<Bound> {
        match s {
            "float" => Some(Bound::Float),
            "int" => Some(Bound::Int),
            _ => None,
        }
    }

    /// The dtypes the bound admits, the body's representative first. The f8
    /// formats are storage types (no arithmetic of their own), so not `float`.
    pub fn dtypes(self) -> &'static [DType] {
        use DType::*;
        match self {
            Bound::Float => &[F32, F16, BF16, F64],
            Bound::Int => &[I32, I64, I16, I8, U32, U8],
            Bound::Any => &DType::ALL,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Bound::Float => "float (f16, bf16, f32, f64)",
            Bound::Int => "int (i8, i16, i32, i64, u8, u32)",
            Bound::Any => "any dtype",
        }
    }
}

/// Which generic names one parameter (or the result) uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    /// The dtype variable that is its dtype.
    pub dtype: Option<String>,
    /// The batch run leading its dims, and how many fixed dims follow it.
    pub run: Option<(String, usize)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GenericSig {
    pub vars: Vec<(String, Bound)>,
    pub params: Vec<Slot>,
    pub ret: Slot,
}

impl GenericSig {
    pub fn bound(&self, var: &str) -> Bound {
        self.vars
            .iter()
            .find(|(n, _)| n == var)
            .map_or(Bound::Any, |v| v.1)
    }
}

/// The types generic names stand for while checking: dtype variables bound to
/// a dtype, runs expanded to a number of dims (a run left out stays opaque).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct TypeEnv {
    pub dtypes: Vec<(String, DType)>,
    pub runs: Vec<(String, usize)>,
}

impl TypeEnv {
    pub fn dtype(&self, name: &str) -> Option<DType> {
        self.dtypes.iter().find(|(n, _)| n == name).map(|v| v.1)
    }

    /// The dims a run `*name` stands for.
    pub fn run_dims(&self, name: &str) -> Vec<Dim> {
        match self.runs.iter().find(|(n, _)| n == name) {
            // `B.0`, `B.1`: no dim name has a dot, so these never meet a user's.
            Some((_, k)) => (0..*k)
                .map(|i| Dim::symbol(format!("{name}.{i}")))
                .collect(),
            None => vec![Dim::symbol(format!("*{name}"))],
        }
    }

    /// Renders an instance for messages: `T = bf16, *B of 2 dims`.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .dtypes
            .iter()
            .map(|(n, d)| format!("{n} = {d}"))
            .collect();
        for (n, k) in &self.runs {
            parts.push(format!("*{n} of {k} dim{}", if *k == 1 { "" } else { "s" }));
        }
        parts.join(", ")
    }
}

/// The run name of a dim string `"*B"`, if it is one.
pub fn run_name(e: &ast::Expr) -> Option<&str> {
    match &e.kind {
        ExprKind::Str(s) => s.trim().strip_prefix('*').map(str::trim),
        _ => None,
    }
}

/// The type parameters of `f` with their bounds (unknown bounds are reported
/// by [`check_decl`] and taken as `Any`).
pub fn vars_of(f: &ast::Function) -> Vec<(String, Bound)> {
    f.type_params
        .iter()
        .map(|tp| {
            let b = tp
                .bound
                .as_ref()
                .and_then(|b| Bound::from_name(&b.name))
                .unwrap_or(Bound::Any);
            (tp.name.name.clone(), b)
        })
        .collect()
}

/// The slot of one annotation.
fn slot_of(t: Option<&TypeExpr>, vars: &[(String, Bound)]) -> Slot {
    let mut slot = Slot::default();
    let Some(t) = t else { return slot };
    match &t.kind {
        TypeExprKind::Generic { args, .. } => {
            if let Some((last, dims)) = args.split_last() {
                if let ExprKind::Name(id) = &last.kind {
                    if vars.iter().any(|(n, _)| *n == id.name) {
                        slot.dtype = Some(id.name.clone());
                    }
                }
                if let Some(first) = dims.first() {
                    if let Some(r) = run_name(first) {
                        slot.run = Some((r.to_string(), dims.len() - 1));
                    }
                }
            }
        }
        TypeExprKind::Name(id) => {
            if vars.iter().any(|(n, _)| *n == id.name) {
                slot.dtype = Some(id.name.clone());
            }
        }
        TypeExprKind::Const(_) => {}
    }
    slot
}

/// The generic part of `f`'s signature, or `None` for a function with no
/// type parameters and no batch run.
pub fn generic_sig(f: &ast::Function) -> Option<GenericSig> {
    let vars = vars_of(f);
    let params: Vec<Slot> = f
        .params
        .iter()
        .map(|p| slot_of(p.ty.as_ref(), &vars))
        .collect();
    let ret = slot_of(f.ret.as_ref(), &vars);
    let any_run = params.iter().chain([&ret]).any(|s| s.run.is_some());
    (!vars.is_empty() || any_run).then_some(GenericSig { vars, params, ret })
}

/// The environment the body of a generic function is checked in first: each
/// variable at its bound's representative dtype, runs opaque.
pub fn representative(f: &ast::Function) -> TypeEnv {
    TypeEnv {
        dtypes: vars_of(f)
            .into_iter()
            .map(|(n, b)| (n, b.dtypes()[0]))
            .collect(),
        runs: Vec::new(),
    }
}

/// Every environment the body is checked in: the product of the bounds'
/// dtypes (the first variable varies fastest, runs opaque), at most `cap` of
/// them, then the representative dtypes with every run of 0 and of 2 dims
/// (what only some ranks break: a positive axis, an index into the run).
pub fn body_envs(f: &ast::Function, cap: usize) -> Vec<TypeEnv> {
    let mut out = dtype_envs(f, cap);
    let mut runs: Vec<String> = Vec::new();
    if let Some(g) = generic_sig(f) {
        for s in g.params.iter() {
            if let Some((r, _)) = &s.run {
                if !runs.contains(r) {
                    runs.push(r.clone());
                }
            }
        }
    }
    if !runs.is_empty() {
        for k in [0, 2] {
            let mut e = representative(f);
            e.runs = runs.iter().map(|r| (r.clone(), k)).collect();
            out.push(e);
        }
    }
    out
}

/// Two environments that tell the dtype variables apart in rendered types:
/// variable `i` is at its bound's `i`-th dtype in the first and the next one in
/// the second (cyclically), so no two variables of one bound move alike, and a
/// dtype that moves with a variable between the two checks is that variable.
pub fn naming_envs(f: &ast::Function) -> (TypeEnv, TypeEnv) {
    let (mut a, mut b) = (TypeEnv::default(), TypeEnv::default());
    for (i, (n, bound)) in vars_of(f).into_iter().enumerate() {
        let ds = bound.dtypes();
        a.dtypes.push((n.clone(), ds[i % ds.len()]));
        b.dtypes.push((n, ds[(i + 1) % ds.len()]));
    }
    (a, b)
}

/// A type rendered in the two [`naming_envs`] (`Tensor[*B, N, f32]` and
/// `Tensor[*B, N, f16]`) as the user wrote it: each dtype that differs between
/// them as the one variable that moves that way (`Tensor[*B, N, T]`). `None`
/// when the two differ otherwise (then no spelling with variables is known).
pub fn name_dtype_vars(in_a: &str, in_b: &str, a: &TypeEnv, b: &TypeEnv) -> Option<String> {
    let (ta, tb) = (words(in_a), words(in_b));
    if ta.len() != tb.len() {
        return None;
    }
    let mut out = String::with_capacity(in_a.len());
    for (x, y) in ta.into_iter().zip(tb) {
        if x == y {
            out.push_str(x);
            continue;
        }
        let mut moving = a
            .dtypes
            .iter()
            .zip(&b.dtypes)
            .filter(|((_, da), (_, db))| da.to_string() == x && db.to_string() == y);
        match (moving.next(), moving.next()) {
            (Some(((name, _), _)), None) => out.push_str(name),
            _ => return None,
        }
    }
    Some(out)
}

/// `s` cut into identifier runs and single other characters.
fn words(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    for (i, c) in s.char_indices() {
        if !ident(c) {
            if start < i {
                out.push(&s[start..i]);
            }
            out.push(&s[i..i + c.len_utf8()]);
            start = i + c.len_utf8();
        }
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

fn dtype_envs(f: &ast::Function, cap: usize) -> Vec<TypeEnv> {
    let vars = vars_of(f);
    let mut out = vec![TypeEnv::default()];
    for (n, b) in &vars {
        let mut next = Vec::new();
        for d in b.dtypes() {
            for e in &out {
                let mut e = e.clone();
                e.dtypes.push((n.clone(), *d));
                next.push(e);
            }
        }
        next.truncate(cap);
        out = next;
    }
    out
}

/// Problems of the declaration itself: unknown bounds, repeated or dtype-named
/// variables, variables no tensor parameter binds, runs in the wrong place.
pub fn check_decl(f: &ast::Function, diags: &mut Vec<Diagnostic>) {
    let is_kernel = f.is_kernel();
    if is_kernel {
        if let (Some(first), Some(last)) = (f.type_params.first(), f.type_params.last()) {
            diags.push(
                Diagnostic::new(
                    "E0323",
                    Span::new(first.span.start, last.span.end),
                    format!("kernel `{}` cannot take dtype variables", f.name.name),
                )
                .with_help("a kernel is compiled for one dtype per parameter: write the dtypes, or make a whole-tensor function (a plain `def`) generic and launch one kernel per dtype from it"),
            );
        }
    }
    let mut seen: Vec<&str> = Vec::new();
    for tp in &f.type_params {
        let n = tp.name.name.as_str();
        if DType::from_name(n).is_some() || seen.contains(&n) {
            let why = if seen.contains(&n) {
                "is declared twice"
            } else {
                "is a dtype's name"
            };
            diags.push(
                Diagnostic::new("E0322", tp.name.span, format!("dtype variable `{n}` {why}"))
                    .with_help("name dtype variables with a capital letter, e.g. `T`"),
            );
        }
        seen.push(n);
        if let Some(b) = &tp.bound {
            if Bound::from_name(&b.name).is_none() {
                diags.push(
                    Diagnostic::new(
                        "E0322",
                        b.span,
                        format!("unknown dtype bound `{}`", b.name),
                    )
                    .with_help("a dtype variable is bound by `float` (f16, bf16, f32, f64) or `int` (i8 to i64, u8, u32), or not at all"),
                );
            }
        }
        let bound_by_tensor = f.params.iter().any(|p| {
            matches!(&p.ty, Some(TypeExpr { kind: TypeExprKind::Generic { args, .. }, .. })
                if matches!(args.last().map(|a| &a.kind), Some(ExprKind::Name(id)) if id.name == n))
        });
        if !bound_by_tensor && !is_kernel {
            diags.push(
                Diagnostic::new(
                    "E0322",
                    tp.name.span,
                    format!("no tensor parameter of `{}` has dtype `{n}`", f.name.name),
                )
                .with_help(format!(
                    "a call binds `{n}` from its tensor arguments: use it as the dtype of a parameter, e.g. `x: Tensor[\"N\", {n}]`"
                )),
            );
        }
    }
    let annots = f
        .params
        .iter()
        .filter_map(|p| p.ty.as_ref())
        .chain(f.ret.as_ref());
    let mut params_runs: Vec<String> = Vec::new();
    for (i, t) in annots.enumerate() {
        let is_ret = i >= f.params.iter().filter(|p| p.ty.is_some()).count();
        let TypeExprKind::Generic { base, args } = &t.kind else {
            continue;
        };
        let dims = args.split_last().map_or(&[][..], |(_, d)| d);
        for (k, a) in dims.iter().enumerate() {
            let Some(r) = run_name(a) else { continue };
            let valid_name = r
                .chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && r.chars().all(|c| c.is_alphanumeric() || c == '_');
            let problem = if is_kernel {
                Some(("E0323", format!("kernel `{}` cannot take a batch run `*{r}`", f.name.name),
                      "a kernel's tensors have a fixed rank: write its dims, e.g. `Tensor[\"B\", \"N\", f32]`".to_string()))
            } else if base.name != "Tensor" {
                Some((
                    "E0415",
                    format!("a batch run `*{r}` is only for `Tensor[...]`"),
                    "tiles have a fixed rank".to_string(),
                ))
            } else if !valid_name {
                Some((
                    "E0415",
                    format!("`\"*{r}\"` is not a batch run"),
                    "write `\"*B\"`: a `*` and a name".to_string(),
                ))
            } else if k != 0 {
                Some((
                    "E0415",
                    format!("batch run `*{r}` is not the first dim"),
                    format!(
                        "a batch run stands for the leading dims: write `Tensor[\"*{r}\", ...]`"
                    ),
                ))
            } else {
                None
            };
            if let Some((code, msg, help)) = problem {
                diags.push(Diagnostic::new(code, a.span, msg).with_help(help));
            } else if is_ret {
                if !params_runs.iter().any(|p| p == r) {
                    diags.push(
                        Diagnostic::new("E0415", a.span, format!("batch run `*{r}` of the result is not bound by a parameter"))
                            .with_help(format!("a call binds `*{r}` from a tensor parameter's leading dims: use `\"*{r}\"` in one")),
                    );
                }
            } else {
                params_runs.push(r.to_string());
            }
        }
    }
}

/// `ty` with the dtype of `slot` and its run replaced as `env` says.
fn subst(ty: &Ty, slot: &Slot, env: &TypeEnv) -> Ty {
    let dtype_of = |d: DType| {
        slot.dtype
            .as_deref()
            .and_then(|v| env.dtype(v))
            .unwrap_or(d)
    };
    match ty {
        Ty::Tensor { dims, dtype } => {
            let dims = match &slot.run {
                Some((r, _)) if !dims.is_empty() => {
                    let mut out = env.run_dims(r);
                    out.extend(dims[1..].iter().cloned());
                    out
                }
                _ => dims.clone(),
            };
            Ty::Tensor {
                dims,
                dtype: dtype_of(*dtype),
            }
        }
        Ty::Scalar { dtype, weak } => Ty::Scalar {
            dtype: dtype_of(*dtype),
            weak: *weak,
        },
        other => other.clone(),
    }
}

/// The signature of one instance: dtypes substituted, runs expanded.
pub fn instantiate(sig: &FnSig, env: &TypeEnv) -> FnSig {
    let Some(g) = &sig.generics else {
        return sig.clone();
    };
    let params = sig
        .params
        .iter()
        .zip(&g.params)
        .map(|(p, slot)| ParamSig {
            ty: subst(&p.ty, slot, env),
            ..p.clone()
        })
        .collect();
    FnSig {
        params,
        ret: sig.ret.as_ref().map(|r| subst(r, &g.ret, env)),
        generics: None,
        ..sig.clone()
    }
}

/// One argument of a call to a generic function, as [`bind_call`] sees it.
pub struct CallArg<'a> {
    /// The parameter's index in the signature.
    pub param: usize,
    pub ty: &'a Ty,
    pub span: Span,
}

/// Binds the dtype variables and runs of `sig` from the arguments of a call.
/// Errors: a variable bound to two dtypes (E0320), a dtype outside the bound
/// (E0321), a run bound to two different runs (E0414).
pub fn bind_call(sig: &FnSig, args: &[CallArg<'_>]) -> Result<TypeEnv, Vec<Diagnostic>> {
    bind_call_shown(sig, args).map(|b| b.0)
}

/// [`bind_call`], with the binding rendered for hover: `T = bf16, *B = [Z, M]`.
pub fn bind_call_shown(
    sig: &FnSig,
    args: &[CallArg<'_>],
) -> Result<(TypeEnv, String), Vec<Diagnostic>> {
    let Some(g) = &sig.generics else {
        return Ok((TypeEnv::default(), String::new()));
    };
    let mut diags = Vec::new();
    let mut dtypes: HashMap<&str, (DType, Span, &str)> = HashMap::new();
    let mut runs: HashMap<&str, (Vec<Dim>, Span, &str)> = HashMap::new();
    let mut env = TypeEnv::default();
    let mut order: Vec<&str> = Vec::new();
    for a in args {
        let (Some(p), Some(slot)) = (sig.params.get(a.param), g.params.get(a.param)) else {
            continue;
        };
        let (adt, strong) = match a.ty {
            Ty::Tensor { dtype, .. } => (*dtype, true),
            Ty::Scalar { dtype, weak } => (*dtype, !weak),
            _ => continue,
        };
        if let Some(v) = slot.dtype.as_deref().filter(|_| strong) {
            let bound = g.bound(v);
            if !bound.dtypes().contains(&adt) {
                diags.push(
                    Diagnostic::new(
                        "E0321",
                        a.span,
                        format!(
                            "argument `{}` of `{}` is `{adt}`, but its dtype `{v}` is bound by `{}`",
                            p.name, sig.name, bound.describe()
                        ),
                    )
                    .with_help(format!("convert it to one of them, e.g. `.to({})`", bound.dtypes()[0])),
                );
            } else {
                match dtypes.get(v) {
                    Some((prev, pspan, pname)) if *prev != adt => diags.push(
                        Diagnostic::new(
                            "E0320",
                            a.span,
                            format!(
                                "dtype `{v}` of `{}` is {prev} in argument `{pname}` but {adt} in argument `{}`",
                                sig.name, p.name
                            ),
                        )
                        .with_primary_label(format!("`{v}` = {adt} here"))
                        .with_label(*pspan, format!("`{v}` = {prev} here"))
                        .with_help(format!("every `{v}` in the signature of `{}` is one dtype: convert one argument, e.g. `.to({prev})`", sig.name)),
                    ),
                    Some(_) => {}
                    None => {
                        dtypes.insert(v, (adt, a.span, &p.name));
                        order.push(v);
                    }
                }
            }
        }
        if let (Some((r, fixed)), Ty::Tensor { dims, .. }) = (&slot.run, a.ty) {
            // A rank below the fixed dims is E0411, reported by the call's check.
            let Some(k) = dims.len().checked_sub(*fixed) else {
                continue;
            };
            let run = dims[..k].to_vec();
            match runs.get(r.as_str()) {
                Some((prev, pspan, pname)) => {
                    let differ = prev.len() != run.len()
                        || prev
                            .iter()
                            .zip(&run)
                            .any(|(x, y)| super::calls::certainly_differ(x, y));
                    if differ {
                        let show = |v: &[Dim]| super::types::render_dims(v);
                        diags.push(
                            Diagnostic::new(
                                "E0414",
                                a.span,
                                format!(
                                    "batch run `*{r}` of `{}` is {} in argument `{pname}` but {} in argument `{}`",
                                    sig.name, show(prev), show(&run), p.name
                                ),
                            )
                            .with_primary_label(format!("`*{r}` = {} here", show(&run)))
                            .with_label(*pspan, format!("`*{r}` = {} here", show(prev)))
                            .with_help(format!("every `*{r}` in the signature of `{}` stands for the same leading dims", sig.name)),
                        );
                    }
                }
                None => {
                    runs.insert(r, (run, a.span, &p.name));
                }
            }
        }
    }
    if !diags.is_empty() {
        return Err(diags);
    }
    for (v, b) in &g.vars {
        let d = dtypes.get(v.as_str()).map_or(b.dtypes()[0], |x| x.0);
        env.dtypes.push((v.clone(), d));
    }
    let mut rs: Vec<(&str, Vec<Dim>)> = runs.into_iter().map(|(r, (v, _, _))| (r, v)).collect();
    rs.sort();
    let mut shown: Vec<String> = env
        .dtypes
        .iter()
        .map(|(n, d)| format!("{n} = {d}"))
        .collect();
    shown.extend(
        rs.iter()
            .map(|(r, v)| format!("*{r} = {}", super::types::render_dims(v))),
    );
    env.runs = rs
        .into_iter()
        .map(|(r, v)| (r.to_string(), v.len()))
        .collect();
    Ok((env, shown.join(", ")))
}
