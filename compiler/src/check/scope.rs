//! Module scopes: what a module defines and imports, with signatures and const
//! values. A scope holds no spans at all and nothing derived from a body, so it
//! is equal after an edit inside a function (salsa then reuses every other
//! item's check).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::consts::eval_const;
use super::dims::Dim;
use super::generics::{self, TypeEnv};
use super::types::{DType, Ty, Value};
use super::{builtins, suggest};
use crate::diag::Diagnostic;
use crate::syntax::ast::{self, Expr, ExprKind, Item, StmtKind, TypeExpr, TypeExprKind};

/// The names a module defines or imports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModuleScope {
    pub entries: BTreeMap<String, Entry>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    /// `const NAME = value` (value `None` when it could not be evaluated).
    Const {
        ty: Ty,
        value: Option<Value>,
    },
    Function(Arc<FnSig>),
    /// `import std.linalg as la` binds `la` to the module.
    Module(Arc<ModuleScope>),
    /// `import std.linalg` binds `std`, a namespace holding `linalg`.
    Namespace(BTreeMap<String, Entry>),
    /// A variable assigned by a top-level statement (scripts, the REPL), with
    /// the type of its assignments (`Ty::Err` where it is not tracked, as when
    /// they give it different types),
    /// and its value where a type needs it and one assignment gives it: a
    /// dtype (`d = x.dtype`, then `zeros([2], d)`).
    Global(Ty, Option<Value>),
    /// An import that failed; `module_diagnostics` reports it once.
    Broken,
}

/// The signature of a `def` or kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct FnSig {
    pub name: String,
    pub is_kernel: bool,
    pub params: Vec<ParamSig>,
    /// The declared return type (`None`: returns nothing).
    pub ret: Option<Ty>,
    /// `@kernel(grid=...)`: the grid's rank, if the decorator gives one.
    pub grid_rank: Option<usize>,
    /// `def name(params) -> T`, as shown on hover.
    pub rendered: String,
    /// Dtype variables and batch runs (`def f[T: float](x: Tensor["*B", "N", T])`);
    /// `params`/`ret` then hold a representative dtype and `*B` as one dim.
    pub generics: Option<Arc<super::generics::GenericSig>>,
}

impl FnSig {
    /// `def name(params) -> T` on one line, without decorators: for messages.
    pub fn one_line(&self) -> String {
        self.rendered
            .rsplit('\n')
            .next()
            .unwrap_or(&self.rendered)
            .to_string()
    }
}

/// `Eq` (floats in defaults compare by `==`; a NaN default only costs a
/// re-check) lets `Arc<FnSig>` compare by pointer first, so comparing the
/// scope after an edit is cheap for the signatures salsa reused.
impl Eq for FnSig {}

#[derive(Clone, Debug, PartialEq)]
pub struct ParamSig {
    pub name: String,
    /// Tensor, scalar (for consts: the const's dtype if given) or `Err` (untyped).
    pub ty: Ty,
    pub is_const: bool,
    pub has_default: bool,
    pub default: Option<Value>,
}

impl ModuleScope {
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    pub fn const_value(&self, name: &str) -> Option<Value> {
        match self.entries.get(name) {
            Some(Entry::Const { value, .. }) => value.clone(),
            _ => None,
        }
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }
}

/// A resolved type annotation.
#[derive(Clone, Debug, PartialEq)]
pub enum Annot {
    Ty(Ty),
    /// `const` or `const T`.
    Const(Option<DType>),
}

/// Resolves a type annotation; problems are pushed to `diags` (item-relative spans).
pub fn annotation(
    te: &TypeExpr,
    consts: &dyn Fn(&str) -> Option<Value>,
    diags: &mut Vec<Diagnostic>,
) -> Annot {
    annotation_in(te, consts, &TypeEnv::default(), diags)
}

/// [`annotation`] inside a generic function: dtype variables and batch runs
/// (`"*B"`) stand for what `env` says (a run not in `env` is one opaque dim).
/// Misplaced runs are reported by `generics::check_decl`, not here.
pub fn annotation_in(
    te: &TypeExpr,
    consts: &dyn Fn(&str) -> Option<Value>,
    env: &TypeEnv,
    diags: &mut Vec<Diagnostic>,
) -> Annot {
    match &te.kind {
        TypeExprKind::Name(id) => {
            if let Some(d) = DType::from_name(&id.name).or_else(|| env.dtype(&id.name)) {
                return Annot::Ty(Ty::scalar(d));
            }
            if id.name == "Tensor" || id.name == "Tile" {
                diags.push(
                    Diagnostic::new(
                        "E0306",
                        te.span,
                        format!("`{}` needs dims and a dtype", id.name),
                    )
                    .with_help(format!("write e.g. `{}[\"N\", f32]`", id.name)),
                );
            } else {
                diags.push(unknown_type(id));
            }
            Annot::Ty(Ty::Err)
        }
        TypeExprKind::Const(inner) => match inner {
            None => Annot::Const(None),
            Some(t) => match annotation_in(t, consts, env, diags) {
                Annot::Ty(Ty::Scalar { dtype, .. }) => Annot::Const(Some(dtype)),
                Annot::Ty(Ty::Err) => Annot::Const(None),
                _ => {
                    diags.push(
                        Diagnostic::new(
                            "E0306",
                            t.span,
                            "a `const` parameter takes a scalar dtype",
                        )
                        .with_help("write `const`, `const i32` or `const bool`"),
                    );
                    Annot::Const(None)
                }
            },
        },
        TypeExprKind::Generic { base, args } => {
            let is_tensor = base.name == "Tensor";
            if !is_tensor && base.name != "Tile" {
                let mut d =
                    Diagnostic::new("E0305", base.span, format!("unknown type `{}`", base.name));
                d = match suggest(&base.name, ["Tensor", "Tile"].into_iter()) {
                    Some(s) => d.with_help(format!("did you mean `{s}`?")),
                    None => d.with_help(
                        "the generic types are `Tensor[dims..., dtype]` and `Tile[dims..., dtype]`",
                    ),
                };
                diags.push(d);
                return Annot::Ty(Ty::Err);
            }
            let Some((last, dim_args)) = args.split_last() else {
                diags.push(
                    Diagnostic::new(
                        "E0306",
                        te.span,
                        format!("`{}[...]` needs dims and a dtype", base.name),
                    )
                    .with_help(format!("write e.g. `{}[\"N\", f32]`", base.name)),
                );
                return Annot::Ty(Ty::Err);
            };
            let mut ok = true;
            let dtype = match &last.kind {
                ExprKind::Name(id) => {
                    match DType::from_name(&id.name).or_else(|| env.dtype(&id.name)) {
                        Some(d) => Some(d),
                        None => {
                            if consts(&id.name).is_some() {
                                diags.push(missing_dtype(base, last.span));
                            } else if id.name.len() == 1
                                && id.name.chars().all(|c| c.is_ascii_uppercase())
                            {
                                diags.push(missing_dtype(base, last.span).with_help(format!(
                                "add the element type, `{}[..., f32]`, or declare `{}` as a dtype variable bound at each call: `def f[{}: float](...)`",
                                base.name, id.name, id.name
                            )));
                            } else {
                                diags.push(unknown_type(id));
                            }
                            None
                        }
                    }
                }
                _ => {
                    diags.push(missing_dtype(base, last.span));
                    None
                }
            };
            let mut dims = Vec::with_capacity(dim_args.len());
            for a in dim_args {
                if let Some(r) = generics::run_name(a) {
                    dims.extend(env.run_dims(r));
                    continue;
                }
                match dim_of(a, consts) {
                    Ok(d) => dims.push(d),
                    Err(d) => {
                        ok = false;
                        diags.push(d);
                    }
                }
            }
            if ok && dims.len() > super::types::MAX_RANK {
                let what = if is_tensor { "tensor" } else { "tile" };
                diags.push(super::types::rank_limit(te.span, what, dims.len()));
                ok = false;
            }
            match dtype {
                Some(dtype) if ok => Annot::Ty(if is_tensor {
                    Ty::Tensor { dims, dtype }
                } else {
                    Ty::Tile { dims, dtype }
                }),
                _ => Annot::Ty(Ty::Err),
            }
        }
    }
}

fn unknown_type(id: &ast::Ident) -> Diagnostic {
    let mut d = Diagnostic::new(
        "E0305",
        id.span,
        format!("unknown type or dtype `{}`", id.name),
    );
    let cands = DType::ALL
        .iter()
        .map(|d| d.name())
        .chain(["Tensor", "Tile"]);
    if let Some(s) = suggest(&id.name, cands) {
        d = d.with_help(format!("did you mean `{s}`?"));
    } else {
        d = d.with_help("dtypes are f64 f32 f16 bf16 f8e4m3 f8e5m2 i64 i32 i16 i8 u32 u8 bool");
    }
    d
}

fn missing_dtype(base: &ast::Ident, span: crate::syntax::span::Span) -> Diagnostic {
    Diagnostic::new(
        "E0306",
        span,
        format!("the last argument of `{}[...]` must be a dtype", base.name),
    )
    .with_help(format!("add the element type: `{}[..., f32]`", base.name))
}

/// One dim of a `Tensor[...]`/`Tile[...]` annotation.
#[allow(clippy::result_large_err)]
fn dim_of(a: &Expr, consts: &dyn Fn(&str) -> Option<Value>) -> Result<Dim, Diagnostic> {
    let lookup = |n: &str| consts(n).or_else(|| Some(Value::Int(Dim::symbol(n))));
    let bad = |span| {
        Diagnostic::new(
            "E0306",
            span,
            "a dim must be a name string (\"N\"), an integer or a dim expression (\"4*D\")",
        )
        .with_help("e.g. `Tensor[\"N\", 64, f32]` or `Tensor[\"4*D\", f32]`")
    };
    match eval_const(a, &lookup) {
        // A size: a negative one would make every stride and byte count that
        // multiplies it meaningless (and overflow in code generation).
        Ok(Value::Int(d)) if d.as_const().is_some_and(|c| c < 0) => Err(Diagnostic::new(
            "E0111",
            a.span,
            format!("a dim is {}; dims are sizes, 0 or more", d),
        )
        .with_help("write the size of the axis, e.g. `Tensor[64, 80, f32]`")),
        Ok(Value::Int(d)) => Ok(d),
        Ok(Value::Str(s)) => Dim::parse_affine(&s).map_err(|m| {
            Diagnostic::new("E0111", a.span, format!("invalid dim expression \"{s}\": {m}"))
                .with_help("dims are names and integers combined with `+`, `-` and `*`, e.g. \"4*D\" or \"M+1\"")
        }),
        _ => Err(bad(a.span)),
    }
}

type Resolver<'a> = &'a dyn Fn(&[String]) -> Option<ModuleScope>;

fn path_of(ids: &[ast::Ident]) -> Vec<String> {
    ids.iter().map(|i| i.name.clone()).collect()
}

/// The key of a configuration in a list space that names the targets it is
/// tried on (language change 45), not a const parameter.
pub const AUTOTUNE_ARCH_KEY: &str = "arch";

/// One configuration of an `@autotune` space: a value per name, and the
/// targets it is for (`None`: every target).
#[derive(Clone, Debug, PartialEq)]
pub struct AutotuneConfig {
    pub values: Vec<(String, Value)>,
    pub archs: Option<Vec<crate::target::Arch>>,
}

impl AutotuneConfig {
    /// Whether the configuration is tried on `arch`.
    pub fn admits(&self, arch: crate::target::Arch) -> bool {
        self.archs.as_ref().is_none_or(|a| a.contains(&arch))
    }
}

/// The archs an `"arch"` value names: a string or a list of strings, each
/// an arch's name; `Err` with the first text that is not one.
pub fn autotune_archs(v: &Value) -> Result<Vec<crate::target::Arch>, String> {
    let one = |v: &Value| match v {
        Value::Str(s) => s.parse().map_err(|_| format!("\"{s}\"")),
        other => Err(format!("`{other}`")),
    };
    match v {
        Value::Tuple(items) if !items.is_empty() => items.iter().map(one).collect(),
        Value::Tuple(_) => Err("an empty list".to_string()),
        v => one(v).map(|a| vec![a]),
    }
}

/// The configurations of `f`'s `@autotune(space=...)`, in order: the product
/// of a dict of lists (the first name varying slowest), or the dicts of a
/// list as written (language change 44), each with the archs its `"arch"`
/// names (change 45). Values that are not constants are left out (the
/// checker reports them, E0509); without a space, one empty configuration.
pub fn autotune_configs(
    f: &ast::Function,
    consts: &dyn Fn(&str) -> Option<Value>,
) -> Vec<AutotuneConfig> {
    let space = f
        .decorator("autotune")
        .and_then(|d| d.args.as_ref())
        .and_then(|args| {
            args.iter()
                .find(|a| a.name.as_ref().is_some_and(|n| n.name == "space"))
        });
    let named = |pairs: &[(Expr, Expr)], one: &mut dyn FnMut(&str, &Expr)| {
        for (k, v) in pairs {
            if let ExprKind::Str(name) = &k.kind {
                one(name, v);
            }
        }
    };
    let unrestricted = |values| AutotuneConfig {
        values,
        archs: None,
    };
    let mut out: Vec<Vec<(String, Value)>> = vec![Vec::new()];
    match space.map(|a| &a.value.kind) {
        Some(ExprKind::Dict(pairs)) => named(pairs, &mut |name, v| {
            let values: Vec<Value> = match &v.kind {
                ExprKind::List(items) | ExprKind::Tuple(items) => items
                    .iter()
                    .filter_map(|e| eval_const(e, consts).ok())
                    .collect(),
                _ => Vec::new(),
            };
            if values.is_empty() {
                return;
            }
            out = std::mem::take(&mut out)
                .into_iter()
                .flat_map(|c| {
                    values.iter().map(move |x| {
                        let mut c = c.clone();
                        c.push((name.to_string(), x.clone()));
                        c
                    })
                })
                .collect();
        }),
        Some(ExprKind::List(items) | ExprKind::Tuple(items)) => {
            let listed: Vec<AutotuneConfig> = items
                .iter()
                .filter_map(|it| match &it.kind {
                    ExprKind::Dict(pairs) => {
                        let mut c = unrestricted(Vec::new());
                        named(pairs, &mut |name, v| {
                            let Ok(x) = eval_const(v, consts) else {
                                return;
                            };
                            if name == AUTOTUNE_ARCH_KEY {
                                c.archs = autotune_archs(&x).ok();
                            } else {
                                c.values.push((name.to_string(), x));
                            }
                        });
                        Some(c)
                    }
                    _ => None,
                })
                .collect();
            if !listed.is_empty() {
                return listed;
            }
        }
        _ => {}
    }
    out.into_iter().map(unrestricted).collect()
}

/// The configurations of `f`'s space tried on `arch` (`None`, the CPU:
/// all), in order; the space's first alone where none names `arch`.
pub fn autotune_configs_for(
    f: &ast::Function,
    consts: &dyn Fn(&str) -> Option<Value>,
    arch: Option<crate::target::Arch>,
) -> Vec<AutotuneConfig> {
    let all = autotune_configs(f, consts);
    match arch {
        Some(a) if all.iter().any(|c| c.admits(a)) => {
            all.into_iter().filter(|c| c.admits(a)).collect()
        }
        Some(_) => all.into_iter().take(1).collect(),
        None => all,
    }
}

/// The configuration a kernel takes where nothing tunes it: the first of
/// its space tried on `arch` (the target compiled for; `None` on the CPU),
/// or the space's first where none is (or no arch is known).
pub fn autotune_default(
    f: &ast::Function,
    consts: &dyn Fn(&str) -> Option<Value>,
    arch: Option<crate::target::Arch>,
) -> Vec<(String, Value)> {
    autotune_configs_for(f, consts, arch)
        .into_iter()
        .next()
        .map(|c| c.values)
        .unwrap_or_default()
}

/// The first configuration of `f`'s `@autotune` space, by name.
fn autotune_first(
    f: &ast::Function,
    consts: &dyn Fn(&str) -> Option<Value>,
) -> std::collections::HashMap<String, Value> {
    autotune_default(f, consts, None).into_iter().collect()
}

/// The signature of a function item, using `consts` for module constants.
pub fn signature(f: &ast::Function, consts: &dyn Fn(&str) -> Option<Value>) -> FnSig {
    let mut sink = Vec::new();
    let mut params = Vec::with_capacity(f.params.len());
    let mut rendered_params = Vec::with_capacity(f.params.len());
    let generics = generics::generic_sig(f);
    let env = generics::representative(f);
    let tuned = autotune_first(f, consts);
    // A generic parameter is shown as written (`Tensor[*B, N, T]`), not at
    // the representative dtype its type holds.
    let shown = |t: &TypeExpr, ty: &Ty| -> String {
        if generics.is_none() {
            return ty.to_string();
        }
        match &t.kind {
            TypeExprKind::Generic { base, args } if !matches!(ty, Ty::Err) => {
                let parts: Vec<String> = args
                    .iter()
                    .map(|a| match &a.kind {
                        ExprKind::Str(s) => s.trim().to_string(),
                        ExprKind::Name(id) => id.name.clone(),
                        ExprKind::Int(i) => i.to_string(),
                        _ => "?".to_string(),
                    })
                    .collect();
                format!("{}[{}]", base.name, parts.join(", "))
            }
            TypeExprKind::Name(id) if env.dtype(&id.name).is_some() => id.name.clone(),
            _ => ty.to_string(),
        }
    };
    for p in &f.params {
        let annot =
            p.ty.as_ref()
                .map(|t| annotation_in(t, consts, &env, &mut sink));
        let (ty, is_const) = match annot {
            Some(Annot::Ty(t)) => (t, false),
            Some(Annot::Const(dt)) => (dt.map(Ty::scalar).unwrap_or(Ty::Err), true),
            None => (Ty::Err, false),
        };
        // A const parameter in an `@autotune` space need not be passed: the
        // tuned value (on the CPU, the space's first) is its default.
        let tuned_default = if is_const {
            tuned.get(&p.name.name).cloned()
        } else {
            None
        };
        let default = p
            .default
            .as_ref()
            .and_then(|d| eval_const(d, consts).ok())
            .or_else(|| tuned_default.clone());
        let mut r = p.name.name.clone();
        if let Some(te) = &p.ty {
            r.push_str(": ");
            r.push_str(&match (&ty, is_const) {
                (Ty::Err, true) => "const".to_string(),
                (t, true) => format!("const {t}"),
                (t, false) => shown(te, t),
            });
        }
        if p.default.is_some() {
            r.push_str(" = ");
            r.push_str(
                &default
                    .as_ref()
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "...".into()),
            );
        }
        rendered_params.push(r);
        params.push(ParamSig {
            name: p.name.name.clone(),
            ty,
            is_const,
            has_default: p.default.is_some() || tuned_default.is_some(),
            default,
        });
    }
    let ret = f
        .ret
        .as_ref()
        .map(|t| match annotation_in(t, consts, &env, &mut sink) {
            Annot::Ty(t) => t,
            Annot::Const(dt) => dt.map(Ty::scalar).unwrap_or(Ty::Err),
        });
    let grid_rank = f
        .decorator("kernel")
        .and_then(|d| d.args.as_ref())
        .and_then(|args| {
            args.iter()
                .find(|a| a.name.as_ref().is_some_and(|n| n.name == "grid"))
                .map(|a| match &a.value.kind {
                    ExprKind::Tuple(v) | ExprKind::List(v) => v.len(),
                    _ => 1,
                })
        });
    let mut rendered = String::new();
    for d in &f.decorators {
        rendered.push('@');
        rendered.push_str(&d.name.name);
        rendered.push('\n');
    }
    let tparams = if f.type_params.is_empty() {
        String::new()
    } else {
        let v: Vec<String> = f
            .type_params
            .iter()
            .map(|tp| match &tp.bound {
                Some(b) => format!("{}: {}", tp.name.name, b.name),
                None => tp.name.name.clone(),
            })
            .collect();
        format!("[{}]", v.join(", "))
    };
    rendered.push_str(&format!(
        "def {}{tparams}({})",
        f.name.name,
        rendered_params.join(", ")
    ));
    if let (Some(r), Some(te)) = (&ret, &f.ret) {
        rendered.push_str(&format!(" -> {}", shown(te, r)));
    }
    FnSig {
        name: f.name.name.clone(),
        is_kernel: f.is_kernel(),
        params,
        ret,
        grid_rank,
        rendered,
        generics: generics.map(Arc::new),
    }
}

fn bind_import_path(entries: &mut BTreeMap<String, Entry>, path: &[String], leaf: Entry) {
    let (first, rest) = path.split_first().expect("import paths are non-empty");
    if rest.is_empty() {
        entries.insert(first.clone(), leaf);
        return;
    }
    let slot = entries
        .entry(first.clone())
        .or_insert_with(|| Entry::Namespace(BTreeMap::new()));
    if !matches!(slot, Entry::Namespace(_)) {
        *slot = Entry::Namespace(BTreeMap::new());
    }
    if let Entry::Namespace(inner) = slot {
        bind_import_path(inner, rest, leaf);
    }
}

/// Builds the scope of a module from its items (in file order).
pub fn build_module_scope(items: &[Arc<Item>], resolve: Resolver) -> ModuleScope {
    let items: Vec<ScopeItem> = items.iter().cloned().map(ScopeItem::Item).collect();
    build_module_scope_with(&items, resolve)
}

/// An item as `build_module_scope_with` takes it: a function whose signature
/// is already known (the database caches them per item), or any item.
#[derive(Clone, Debug)]
pub enum ScopeItem {
    Function(Arc<FnSig>),
    Item(Arc<Item>),
}

/// Builds the scope of a module from its items (in file order).
pub fn build_module_scope_with(items: &[ScopeItem], resolve: Resolver) -> ModuleScope {
    let mut scope = ModuleScope::default();
    for item in items {
        let item = match item {
            ScopeItem::Function(sig) => {
                if !scope.entries.contains_key(&sig.name) {
                    scope
                        .entries
                        .insert(sig.name.clone(), Entry::Function(sig.clone()));
                }
                continue;
            }
            ScopeItem::Item(item) => item,
        };
        match &**item {
            Item::Import(imp) => {
                let path = path_of(&imp.path);
                let entry = resolve(&path)
                    .map(|m| Entry::Module(Arc::new(m)))
                    .unwrap_or(Entry::Broken);
                match &imp.alias {
                    Some(a) => {
                        scope.entries.entry(a.name.clone()).or_insert(entry);
                    }
                    None => bind_import_path(&mut scope.entries, &path, entry),
                }
            }
            Item::FromImport(imp) => {
                let module = resolve(&path_of(&imp.module));
                for n in &imp.names {
                    let entry = module
                        .as_ref()
                        .and_then(|m| m.get(&n.name.name).cloned())
                        .unwrap_or(Entry::Broken);
                    let bound = n.alias.as_ref().unwrap_or(&n.name);
                    scope.entries.entry(bound.name.clone()).or_insert(entry);
                }
            }
            Item::Const(c) => {
                if scope.entries.contains_key(&c.name.name) {
                    continue;
                }
                let value = {
                    let s = &scope;
                    eval_const(&c.value, &|n| s.const_value(n)).ok()
                };
                let ty = match &value {
                    Some(Value::Int(_)) => Ty::weak(DType::I32),
                    Some(Value::Float(_)) => Ty::weak(DType::F32),
                    Some(Value::Bool(_)) => Ty::weak(DType::Bool),
                    Some(Value::DType(_)) => Ty::DTypeV,
                    Some(Value::Str(_)) => Ty::Str,
                    _ => Ty::Err,
                };
                scope
                    .entries
                    .insert(c.name.name.clone(), Entry::Const { ty, value });
            }
            Item::Function(f) => {
                if scope.entries.contains_key(&f.name.name) {
                    continue;
                }
                let sig = {
                    let s = &scope;
                    Arc::new(signature(f, &|n| s.const_value(n)))
                };
                scope
                    .entries
                    .insert(f.name.name.clone(), Entry::Function(sig));
            }
            Item::Stmt(s) => {
                let mut names = Vec::new();
                match &s.kind {
                    StmtKind::Assign { target, .. } | StmtKind::AugAssign { target, .. } => {
                        target_names(target, &mut names)
                    }
                    StmtKind::For { target, .. } => names.push(target.name.clone()),
                    _ => {}
                }
                // The statement is checked against the scope so far, so that later
                // statements (and functions) see the types of script variables.
                let mut typed = Vec::with_capacity(names.len());
                {
                    let mut ch = super::ctx::Checker::new(&scope, crate::target::Arch::default());
                    ch.top_level = true;
                    ch.block(std::slice::from_ref(s));
                    for n in names {
                        let (ty, value) = match (&s.kind, ch.env.get(&n)) {
                            (StmtKind::Assign { .. }, Some(b)) if matches!(b.ty, Ty::DTypeV) => {
                                (b.ty.clone(), b.value.clone())
                            }
                            (StmtKind::Assign { .. } | StmtKind::AugAssign { .. }, Some(b)) => {
                                (b.ty.clone(), None)
                            }
                            _ => (Ty::Err, None),
                        };
                        typed.push((n, ty, value));
                    }
                }
                for (n, ty, value) in typed {
                    match scope.entries.get(&n) {
                        None => {
                            scope.entries.insert(n, Entry::Global(ty, value));
                        }
                        // Assigned again: the value is not one value any more,
                        // and where the type changes, which one a statement sees
                        // depends on where it stands; an item's check holds for
                        // every place its text appears, so the variable is not
                        // tracked (`x = randn(..)`, `k(x)`, `x = x.to(bf16)`: no
                        // error at `k(x)` for a type `x` only has later).
                        Some(Entry::Global(old, _)) => {
                            let ty = if *old == ty { ty } else { Ty::Err };
                            scope.entries.insert(n, Entry::Global(ty, None));
                        }
                        Some(_) => {}
                    }
                }
            }
        }
    }
    scope
}

fn target_names(e: &Expr, out: &mut Vec<String>) {
    match &e.kind {
        ExprKind::Name(id) => out.push(id.name.clone()),
        ExprKind::Tuple(v) | ExprKind::List(v) => v.iter().for_each(|x| target_names(x, out)),
        _ => {}
    }
}

/// The names an item binds at module level, with their (item-relative) spans.
fn defined_names(item: &Item) -> Vec<&ast::Ident> {
    match item {
        Item::Import(i) => vec![i.alias.as_ref().unwrap_or(&i.path[0])],
        Item::FromImport(i) => i
            .names
            .iter()
            .map(|n| n.alias.as_ref().unwrap_or(&n.name))
            .collect(),
        Item::Const(c) => vec![&c.name],
        Item::Function(f) => vec![&f.name],
        Item::Stmt(_) => vec![],
    }
}

/// Diagnostics about the module as a whole (absolute spans): duplicate
/// definitions and imports that do not resolve.
pub fn module_diagnostics(items: &[(Arc<Item>, u32)], resolve: Resolver) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let mut seen: super::fxhash::FxHashMap<&str, crate::syntax::span::Span> = Default::default();
    let mut plain_imports: super::fxhash::FxHashSet<&str> = Default::default();
    for (item, off) in items {
        for id in defined_names(item) {
            let span = id.span.shift(*off);
            // `import std.nn` and `import std.linalg` both bind `std`: not a duplicate.
            if let Item::Import(i) = &**item {
                if i.alias.is_none() {
                    if plain_imports.contains(id.name.as_str()) {
                        continue;
                    }
                    plain_imports.insert(&id.name);
                }
            }
            if builtins::is_builtin(&id.name) && matches!(&**item, Item::Const(_)) {
                out.push(
                    Diagnostic::new(
                        "E0208",
                        span,
                        format!(
                            "`{}` is a builtin and cannot be redefined as a constant",
                            id.name
                        ),
                    )
                    .with_help("choose another name"),
                );
            }
            match seen.get(id.name.as_str()) {
                Some(first) => out.push(
                    Diagnostic::new(
                        "E0204",
                        span,
                        format!("`{}` is defined more than once", id.name),
                    )
                    .with_primary_label("redefined here")
                    .with_label(*first, format!("`{}` first defined here", id.name))
                    .with_help("rename or remove one of the definitions"),
                ),
                None => {
                    seen.insert(&id.name, span);
                }
            }
        }
        match &**item {
            Item::Import(imp) => {
                let path = path_of(&imp.path);
                if resolve(&path).is_none() {
                    out.push(unknown_module(
                        &path,
                        imp.path[0]
                            .span
                            .to(imp.path[imp.path.len() - 1].span)
                            .shift(*off),
                    ));
                }
            }
            Item::FromImport(imp) => {
                let path = path_of(&imp.module);
                let mspan = imp.module[0]
                    .span
                    .to(imp.module[imp.module.len() - 1].span)
                    .shift(*off);
                match resolve(&path) {
                    None => out.push(unknown_module(&path, mspan)),
                    Some(m) => {
                        for n in &imp.names {
                            if m.get(&n.name.name).is_none() {
                                let mut d = Diagnostic::new(
                                    "E0203",
                                    n.name.span.shift(*off),
                                    format!(
                                        "`{}` is not defined in module `{}`",
                                        n.name.name,
                                        path.join(".")
                                    ),
                                )
                                .with_label(mspan, "in this module");
                                d = d.with_help(names_help(&n.name.name, m.names()));
                                out.push(d);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// The help line of a name a module does not define: the closest name it
/// does define, else the names it defines (the first few, sorted).
pub(super) fn names_help<'a>(name: &str, names: impl Iterator<Item = &'a str>) -> String {
    let mut all: Vec<&str> = names.collect();
    if let Some(s) = suggest(name, all.iter().copied()) {
        return format!("did you mean `{s}`?");
    }
    const SHOWN: usize = 12;
    all.sort_unstable();
    if all.is_empty() {
        return "the module defines no names".to_string();
    }
    let more = if all.len() > SHOWN { ", ..." } else { "" };
    let shown: Vec<String> = all.iter().take(SHOWN).map(|n| format!("`{n}`")).collect();
    format!("the module defines {}{more}", shown.join(", "))
}

fn unknown_module(path: &[String], span: crate::syntax::span::Span) -> Diagnostic {
    let dotted = path.join(".");
    let mut d = Diagnostic::new("E0202", span, format!("unknown module `{dotted}`"));
    if path.first().map(String::as_str) == Some("std") {
        if let Some(s) = suggest(&dotted, crate::stdlib::modules()) {
            d = d.with_help(format!("did you mean `{s}`?"));
        } else {
            let all: Vec<&str> = crate::stdlib::modules().collect();
            d = d.with_help(format!("the standard library has: {}", all.join(", ")));
        }
    } else {
        d = d.with_help(format!(
            "user modules are files next to the importing one: `{}.tsr`",
            path.join("/")
        ));
    }
    d
}

/// W0002 for each imported name no item uses (absolute spans).
pub fn unused_imports(
    items: &[(Arc<Item>, u32)],
    used: &HashSet<&str>,
    scope: &ModuleScope,
) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (item, off) in items {
        let names: Vec<(&ast::Ident, crate::syntax::span::Span)> = match &**item {
            Item::Import(i) => {
                let bound = i.alias.as_ref().unwrap_or(&i.path[0]);
                vec![(bound, i.span)]
            }
            Item::FromImport(i) => i
                .names
                .iter()
                .map(|n| {
                    (
                        n.alias.as_ref().unwrap_or(&n.name),
                        n.name.span.to(n.alias.as_ref().unwrap_or(&n.name).span),
                    )
                })
                .collect(),
            _ => continue,
        };
        for (id, span) in names {
            let broken = matches!(scope.get(&id.name), Some(Entry::Broken) | None);
            if !broken && !used.contains(id.name.as_str()) && !id.name.starts_with('_') {
                out.push(
                    Diagnostic::new(
                        "W0002",
                        span.shift(*off),
                        format!("unused import `{}`", id.name),
                    )
                    .with_help("remove the import"),
                );
            }
        }
    }
    out
}
