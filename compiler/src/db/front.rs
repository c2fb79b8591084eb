//! Front-end queries: a file cut into items, each item parsed, the module
//! scopes that cross items, and type, shape and resource checking.

use std::sync::Arc;

use super::*;

/// Where each item of a file starts, in file order.
#[derive(Clone, Debug, PartialEq, Eq, salsa::SalsaValue)]
pub struct FileItems<'db> {
    pub items: Vec<(ItemSource<'db>, u32)>,
}

/// The parse of one item: its AST (item-relative spans) and syntax diagnostics.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedItem {
    pub item: Option<Arc<ast::Item>>,
    pub diagnostics: Vec<Diagnostic>,
}

#[salsa::tracked(returns(ref))]
pub fn file_items(db: &dyn salsa::Database, file: SourceFile) -> FileItems<'_> {
    let text = file.text(db);
    let items = syntax::split_items(text)
        .into_iter()
        .map(|r| {
            let source = ItemSource::new(db, file, &text[r.start as usize..r.end as usize]);
            (source, r.start)
        })
        .collect();
    FileItems { items }
}

#[salsa::tracked(returns(ref))]
pub fn parse_item<'db>(db: &'db dyn salsa::Database, item: ItemSource<'db>) -> ParsedItem {
    let parsed = syntax::parse_item(item.text(db));
    ParsedItem {
        item: parsed.item.map(Arc::new),
        diagnostics: parsed.diagnostics,
    }
}

/// What a module offers to the modules importing it: its own definitions
/// (consts, functions, script variables), not the names it imports itself.
/// Depending on no other module, it cannot take part in an import cycle
/// (`a` imports `b` imports `a`, or a module importing itself).
#[salsa::tracked(returns(ref))]
pub fn module_exports(db: &dyn Db, file: SourceFile) -> check::ModuleScope {
    let items: Vec<Arc<ast::Item>> = file_items(db, file)
        .items
        .iter()
        .filter_map(|(source, _)| parse_item(db, *source).item.clone())
        .filter(|i| !matches!(**i, ast::Item::Import(_) | ast::Item::FromImport(_)))
        .collect();
    check::build_module_scope(&items, &|_| None)
}

/// Whether an item's text may hold an import or a const (its first token, after
/// blank and comment lines, is `import`, `from` or `const`): saves parsing the
/// other items' cached results when looking for the module's constants.
fn may_import_or_define_const(text: &str) -> bool {
    for line in text.lines() {
        let t = line.trim_start();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        return ["import", "from", "const"].iter().any(|k| {
            t.strip_prefix(k)
                .is_some_and(|r| r.starts_with(|c: char| c.is_whitespace()))
        });
    }
    false
}

/// The imports and constants of a file (what signatures may refer to).
#[salsa::tracked(returns(ref))]
pub fn module_consts(db: &dyn Db, file: SourceFile) -> check::ModuleScope {
    let items: Vec<Arc<ast::Item>> = file_items(db, file)
        .items
        .iter()
        .filter(|(source, _)| may_import_or_define_const(source.text(db)))
        .filter_map(|(source, _)| parse_item(db, *source).item.clone())
        .filter(|i| {
            matches!(
                **i,
                ast::Item::Import(_) | ast::Item::FromImport(_) | ast::Item::Const(_)
            )
        })
        .collect();
    check::build_module_scope(&items, &|path: &[String]| {
        db.resolve_module(file, path)
            .map(|m| module_exports(db, m).clone())
    })
}

/// The signature of a function item, cached per item text: rebuilding the
/// module scope after an edit reuses every other item's signature.
#[salsa::tracked(returns(ref))]
pub fn item_signature<'db>(db: &'db dyn Db, item: ItemSource<'db>) -> Option<Arc<check::FnSig>> {
    let parsed = parse_item(db, item);
    let ast::Item::Function(f) = parsed.item.as_deref()? else {
        return None;
    };
    let consts = module_consts(db, item.file(db));
    Some(Arc::new(check::scope::signature(f, &|n| {
        consts.const_value(n)
    })))
}

/// The names a file defines and imports, with their signatures and const values.
/// Holds no absolute spans, so it is equal (backdated) after an edit inside a body.
#[salsa::tracked(returns(ref))]
pub fn module_scope(db: &dyn Db, file: SourceFile) -> check::ModuleScope {
    let mut items = Vec::new();
    for (source, _) in &file_items(db, file).items {
        if let Some(sig) = item_signature(db, *source) {
            items.push(check::ScopeItem::Function(sig.clone()));
        } else if let Some(item) = parse_item(db, *source).item.clone() {
            items.push(check::ScopeItem::Item(item));
        }
    }
    check::build_module_scope_with(&items, &|path: &[String]| {
        db.resolve_module(file, path)
            .map(|m| module_exports(db, m).clone())
    })
}

/// Diagnostics about the file as a whole (duplicate definitions, unresolved
/// imports), with absolute spans.
#[salsa::tracked(returns(ref))]
pub fn module_diagnostics(db: &dyn Db, file: SourceFile) -> Vec<Diagnostic> {
    let items: Vec<(Arc<ast::Item>, u32)> = file_items(db, file)
        .items
        .iter()
        .filter_map(|(source, offset)| parse_item(db, *source).item.clone().map(|i| (i, *offset)))
        .collect();
    check::module_diagnostics(&items, &|path: &[String]| {
        db.resolve_module(file, path)
            .map(|m| module_exports(db, m).clone())
    })
}

/// Type, shape and resource checking of one item against its module's scope.
#[salsa::tracked(returns(ref))]
pub fn check_item<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
) -> check::ItemCheck {
    let parsed = parse_item(db, item);
    let Some(ast) = &parsed.item else {
        return check::ItemCheck::default();
    };
    let scope = module_scope(db, item.file(db));
    let mut checked = check::check_item(ast, scope, options.arch(db));
    // The parser recovered from a syntax error in this item: what the checker
    // would say about the recovered tree is mostly noise, so only the syntax
    // errors are reported (types, signature and uses are still kept).
    if parsed.diagnostics.iter().any(|d| d.is_error()) {
        checked.diagnostics.clear();
    }
    checked
}

/// Every diagnostic of a file, with absolute spans, sorted by position.
#[salsa::tracked(returns(ref))]
pub fn file_diagnostics(db: &dyn Db, file: SourceFile, options: Options) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let mut imports = Vec::new();
    let mut used = std::collections::HashSet::new();
    for (source, offset) in &file_items(db, file).items {
        let parsed = parse_item(db, *source);
        out.extend(
            parsed
                .diagnostics
                .iter()
                .cloned()
                .map(|d| d.shifted(*offset)),
        );
        if let Some(item) = &parsed.item {
            if matches!(**item, ast::Item::Import(_) | ast::Item::FromImport(_)) {
                imports.push((item.clone(), *offset));
            }
        }
        let checked = check_item(db, *source, options);
        out.extend(
            checked
                .diagnostics
                .iter()
                .cloned()
                .map(|d| d.shifted(*offset)),
        );
        used.extend(checked.uses.iter().map(String::as_str));
    }
    out.extend(module_diagnostics(db, file).iter().cloned());
    out.extend(check::unused_imports(
        &imports,
        &used,
        module_scope(db, file),
    ));
    out.sort_by(|a, b| (a.span.start, a.span.end, a.code).cmp(&(b.span.start, b.span.end, b.code)));
    out.dedup();
    out
}
