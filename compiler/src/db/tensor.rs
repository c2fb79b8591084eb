//! Whole-tensor function queries: Graph IR (calls inlined, const arguments
//! specialised) and Schedule IR, the launch plan with its generated kernels.

use std::sync::Arc;

use super::*;

/// The Graph IR of a whole-tensor function item as written (calls to other
/// functions kept as calls). `Err` for a kernel, an item that is not a function,
/// a function with check errors, or what is not lowered yet.
#[salsa::tracked(returns(ref))]
pub fn graph_ir_uninlined<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
) -> Result<Arc<crate::ir::graph::Graph>, crate::ir::graph::LowerError> {
    use crate::ir::graph::{self, LowerError};
    let parsed = parse_item(db, item);
    let Some(ast::Item::Function(f)) = parsed.item.as_deref() else {
        return Err(LowerError::new(
            crate::syntax::span::Span::new(0, 0),
            "Graph IR of an item that is not a function",
        ));
    };
    if check::generics::generic_sig(f).is_some() {
        return Err(LowerError::new(
            f.name.span,
            format!(
                "`{}` is generic (dtype variables or a batch run): it is lowered at each call, for the call's dtypes and ranks",
                f.name.name
            ),
        ));
    }
    let file = item.file(db);
    let scope = module_scope(db, file);
    let (checked, vals) = check::kernel::check_function_typed(f, scope, options.arch(db));
    if !parsed.diagnostics.is_empty() || checked.diagnostics.iter().any(|d| d.is_error()) {
        return Err(LowerError::new(
            f.name.span,
            format!("`{}` has errors; fix them first", f.name.name),
        ));
    }
    let sig = item_signature(db, item)
        .clone()
        .ok_or_else(|| LowerError::new(f.name.span, "a function without a signature"))?;
    let is_builtin_alias = std_nn_alias(db, file);
    let g = graph::build(f, &sig, &vals, &is_builtin_alias, options.matmul_tf32(db))?;
    if cfg!(debug_assertions) {
        if let Err(e) = graph::verify(&g) {
            panic!("Graph IR verifier: {e}\n{}", graph::dump(&g));
        }
    }
    Ok(Arc::new(g))
}

/// Whether a callee is std.nn's definition of the builtin of the same name.
fn std_nn_alias<'db>(db: &'db dyn Db, file: SourceFile) -> impl Fn(&check::FnSig) -> bool + 'db {
    let std_nn = db
        .resolve_module(file, &["std".to_string(), "nn".to_string()])
        .map(|m| module_exports(db, m));
    move |callee: &check::FnSig| {
        crate::ir::graph::STD_NN_BUILTINS.contains(&callee.name.as_str())
            && matches!(
                std_nn.and_then(|m| m.get(&callee.name)),
                Some(check::Entry::Function(s)) if **s == *callee
            )
    }
}

/// The function item defining `sig`: in `file` itself or in a module it imports.
fn callee_item<'db>(
    db: &'db dyn Db,
    file: SourceFile,
    sig: &check::FnSig,
) -> Option<ItemSource<'db>> {
    let find = |f: SourceFile| {
        file_items(db, f).items.iter().map(|(s, _)| *s).find(|s| {
            item_signature(db, *s)
                .as_deref()
                .is_some_and(|x| x.name == sig.name && *x == *sig)
        })
    };
    if let Some(i) = find(file) {
        return Some(i);
    }
    for (source, _) in &file_items(db, file).items {
        let paths: Vec<Vec<String>> = match parse_item(db, *source).item.as_deref() {
            Some(ast::Item::Import(i)) => vec![i.path.iter().map(|p| p.name.clone()).collect()],
            Some(ast::Item::FromImport(i)) => {
                vec![i.module.iter().map(|p| p.name.clone()).collect()]
            }
            _ => vec![],
        };
        for p in paths {
            if let Some(i) = db.resolve_module(file, &p).and_then(find) {
                return Some(i);
            }
        }
    }
    None
}

fn inlined_graph<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
    stack: &mut Vec<ItemSource<'db>>,
) -> Result<Arc<crate::ir::graph::Graph>, crate::ir::graph::LowerError> {
    let g = graph_ir_uninlined(db, item, options).clone()?;
    Ok(inline_calls(db, item, g, options, stack))
}

/// Inlines the calls of `g` (the graph of `item`, possibly specialised).
fn inline_calls<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    g: Arc<crate::ir::graph::Graph>,
    options: Options,
    stack: &mut Vec<ItemSource<'db>>,
) -> Arc<crate::ir::graph::Graph> {
    if !g
        .nodes
        .iter()
        .any(|n| matches!(n.kind, crate::ir::graph::NodeKind::Call { .. }))
    {
        return g;
    }
    stack.push(item);
    let file = item.file(db);
    let out = crate::ir::graph::inline(&g, &mut |sig, consts, env| {
        let callee = callee_item(db, file, sig)?;
        if stack.contains(&callee) {
            return None;
        }
        if consts.is_empty() && sig.generics.is_none() {
            return inlined_graph(db, callee, options, stack).ok();
        }
        let special = specialized_graph(db, callee, options, consts, env)?;
        Some(inline_calls(db, callee, Arc::new(special), options, stack))
    });
    stack.pop();
    Arc::new(out)
}

/// The graph of a function item checked with some const parameters fixed (a
/// call's const arguments): their defaults are replaced by the values; a
/// generic function is checked and built for the instance `env`. Not
/// cached; `None` when a value is not a literal or the function does not lower.
fn specialized_graph(
    db: &dyn Db,
    item: ItemSource<'_>,
    options: Options,
    consts: &[(String, check::Value)],
    env: &check::generics::TypeEnv,
) -> Option<crate::ir::graph::Graph> {
    specialized_graph_err(db, item, options, consts, env).ok()
}

fn specialized_graph_err(
    db: &dyn Db,
    item: ItemSource<'_>,
    options: Options,
    consts: &[(String, check::Value)],
    env: &check::generics::TypeEnv,
) -> Result<crate::ir::graph::Graph, crate::ir::graph::LowerError> {
    use crate::ir::graph::LowerError;
    let nowhere = crate::syntax::span::Span::new(0, 0);
    let not_lowered = || LowerError::new(nowhere, "a call that cannot be specialised");
    let parsed = parse_item(db, item);
    let Some(ast::Item::Function(f)) = parsed.item.as_deref() else {
        return Err(not_lowered());
    };
    let mut f = f.clone();
    for (name, value) in consts {
        let p = f
            .params
            .iter_mut()
            .find(|p| p.name.name == *name)
            .ok_or_else(not_lowered)?;
        let kind = match value {
            check::Value::Bool(b) => ast::ExprKind::Bool(*b),
            check::Value::Float(x) => ast::ExprKind::Float(*x),
            v => ast::ExprKind::Int(v.as_int().ok_or_else(not_lowered)?),
        };
        p.default = Some(ast::Expr::new(kind, p.span));
    }
    let file = item.file(db);
    let scope = module_scope(db, file);
    let generic = check::generics::generic_sig(&f).is_some();
    let (checked, vals) = if generic {
        check::kernel::check_function_instance(&f, scope, options.arch(db), env.clone())
    } else {
        check::kernel::check_function_typed(&f, scope, options.arch(db))
    };
    if let Some(d) = checked.diagnostics.iter().find(|d| d.is_error()) {
        return Err(LowerError::new(
            f.name.span,
            format!(
                "`{}` has errors for {}: {}",
                f.name.name,
                if generic {
                    env.describe()
                } else {
                    "these const arguments".into()
                },
                d.message
            ),
        ));
    }
    let consts_scope = module_consts(db, file);
    let sig = check::scope::signature(&f, &|n| consts_scope.const_value(n));
    let sig = check::generics::instantiate(&sig, env);
    let is_builtin_alias = std_nn_alias(db, file);
    crate::ir::graph::build(&f, &sig, &vals, &is_builtin_alias, options.matmul_tf32(db))
}

/// The Graph IR and Schedule IR of one instance of a generic function (its
/// dtype variables and batch runs fixed by `env`), calls inlined. Not cached:
/// what runs a generic function as an entry point (not through a call) uses it.
pub fn instance_schedule<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
    env: &check::generics::TypeEnv,
) -> Result<
    (
        Arc<crate::ir::graph::Graph>,
        Arc<crate::ir::schedule::Schedule>,
    ),
    crate::ir::graph::LowerError,
> {
    let g = specialized_graph_err(db, item, options, &[], env)?;
    let g = inline_calls(db, item, Arc::new(g), options, &mut Vec::new());
    let s = crate::ir::schedule::lower(&g)?;
    Ok((g, Arc::new(s)))
}

/// The Graph IR of a whole-tensor function item, with calls to other
/// whole-tensor functions inlined (a call giving const arguments inlines the
/// callee specialised on them; recursive calls stay calls), verified.
#[salsa::tracked(returns(ref))]
pub fn graph_ir<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
) -> Result<Arc<crate::ir::graph::Graph>, crate::ir::graph::LowerError> {
    let g = inlined_graph(db, item, options, &mut Vec::new())?;
    if cfg!(debug_assertions) {
        if let Err(e) = crate::ir::graph::verify(&g) {
            panic!("Graph IR verifier: {e}\n{}", crate::ir::graph::dump(&g));
        }
    }
    Ok(g)
}

/// The launch plan of a whole-tensor function item, verified.
#[salsa::tracked(returns(ref))]
pub fn schedule_ir<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
) -> Result<Arc<crate::ir::schedule::Schedule>, crate::ir::graph::LowerError> {
    use crate::ir::schedule;
    let g = graph_ir(db, item, options).clone()?;
    let s = schedule::lower(&g)?;
    if cfg!(debug_assertions) {
        if let Err(e) = schedule::verify(&s) {
            panic!("Schedule IR verifier: {e}\n{}", schedule::dump(&s));
        }
    }
    Ok(Arc::new(s))
}

/// The whole-tensor functions (plain `def`s, not kernels) of `file` in source
/// order: name, item, offset of the item in the file.
pub fn file_functions<'db>(
    db: &'db dyn Db,
    file: SourceFile,
) -> Vec<(String, ItemSource<'db>, u32)> {
    file_items(db, file)
        .items
        .iter()
        .filter_map(
            |(source, offset)| match parse_item(db, *source).item.as_deref() {
                // A generic function has no graph of its own: it is lowered
                // into its callers, one instance per call's dtypes and ranks.
                Some(ast::Item::Function(f))
                    if !f.is_kernel() && check::generics::generic_sig(f).is_none() =>
                {
                    Some((f.name.name.clone(), *source, *offset))
                }
                _ => None,
            },
        )
        .collect()
}

/// The item of `file` defining the function `name`, with its offset in the file.
pub fn function_item<'db>(
    db: &'db dyn Db,
    file: SourceFile,
    name: &str,
) -> Option<(ItemSource<'db>, u32)> {
    file_items(db, file)
        .items
        .iter()
        .copied()
        .find(|(source, _)| {
            matches!(parse_item(db, *source).item.as_deref(),
            Some(ast::Item::Function(f)) if f.name.name == name)
        })
}
