//! The salsa database every front door queries.
//!
//! Incrementality comes from how a file is cut up: `file_items` splits a file into
//! top-level items and interns each item's *text* (`ItemSource`). Every per-item
//! query (`parse_item`, `check_item`) is keyed by that interned text, so its spans
//! are relative to the item and an edit elsewhere in the file — even one that moves
//! this item — leaves its key, and so its cached results, untouched. Cross-item
//! facts (signatures, consts, imports) flow through `module_scope`, which carries no
//! absolute spans and is therefore backdated when an edit changes only a body.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use file_map::FileMap;

use crate::check;
use crate::diag::Diagnostic;
use crate::syntax::{self, ast};
use crate::target::Arch;

/// One source file: a path (real or virtual, e.g. `<repl>`) and its text.
#[salsa::input(debug)]
pub struct SourceFile {
    #[returns(ref)]
    pub path: PathBuf,
    #[returns(ref)]
    pub text: String,
}

/// Compilation options shared by every query.
#[salsa::input(debug)]
pub struct Options {
    #[returns(copy)]
    pub arch: Arch,
    /// f32 `matmul` without `precision=` multiplies at tf32 (the session's
    /// `set_float32_matmul_precision("high")`); ieee otherwise.
    #[returns(copy)]
    pub matmul_tf32: bool,
}

/// The text of one top-level item of one file.
#[salsa::interned(debug)]
pub struct ItemSource<'db> {
    #[returns(copy)]
    pub file: SourceFile,
    #[returns(ref)]
    pub text: String,
}

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

// ---- Tile IR (issue 3, lowering) ----

/// The Tile IR of one kernel item under a specialization (const parameter
/// values and specialised dims; see `ir::tile::Specialization`). The kernel is
/// checked first: its error diagnostics (item-relative spans) are returned
/// instead of lowering. Lowering errors (E0511, E0512) are item-relative too.
/// An item that is not a kernel gives an empty error list.
#[salsa::tracked(returns(ref))]
pub fn tile_ir<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
    spec: crate::ir::tile::Specialization,
) -> Result<Arc<crate::ir::tile::Kernel>, Vec<Diagnostic>> {
    let parsed = parse_item(db, item);
    let Some(ast::Item::Function(f)) = parsed.item.as_deref() else {
        return Err(Vec::new());
    };
    if !f.is_kernel() {
        return Err(Vec::new());
    }
    let errors: Vec<Diagnostic> = parsed
        .diagnostics
        .iter()
        .chain(check_item(db, item, options).diagnostics.iter())
        .filter(|d| d.is_error())
        .cloned()
        .collect();
    if !errors.is_empty() {
        return Err(errors);
    }
    let k = crate::ir::tile::lower_kernel(f, module_scope(db, item.file(db)), &spec)?;
    crate::ir::tile::check_tile_sizes(&k, options.arch(db))?;
    Ok(Arc::new(k))
}

/// The lowering diagnostics (E0511, E0512) of every kernel of `file` under
/// `spec`, with absolute spans, in source order. Empty when the file has
/// check errors: those are what `file_diagnostics` reports.
pub fn tile_ir_diagnostics(
    db: &dyn Db,
    file: SourceFile,
    options: Options,
    spec: &crate::ir::tile::Specialization,
) -> Vec<Diagnostic> {
    if file_diagnostics(db, file, options)
        .iter()
        .any(|d| d.is_error())
    {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (_, item, offset) in file_kernels(db, file) {
        if let Err(diags) = tile_ir(db, item, options, spec.clone()) {
            out.extend(diags.iter().cloned().map(|d| d.shifted(offset)));
        }
    }
    out
}

/// The kernel items of a file in source order, with their names and offsets.
pub fn file_kernels<'db>(db: &'db dyn Db, file: SourceFile) -> Vec<(String, ItemSource<'db>, u32)> {
    file_items(db, file)
        .items
        .iter()
        .filter_map(
            |(source, offset)| match parse_item(db, *source).item.as_deref() {
                Some(ast::Item::Function(f)) if f.is_kernel() => {
                    Some((f.name.name.clone(), *source, *offset))
                }
                _ => None,
            },
        )
        .collect()
}

// ---- Target IR and PTX (issue 3, ptx backend) ----

/// The Target IR of one kernel item for `options`' arch: its Tile IR (see
/// `tile_ir`; its diagnostics are returned as they are) lowered by
/// `ir::target::lower` and verified. A construct the code generator cannot
/// lower yet is E0512 with the span of the Tile IR op (item-relative).
#[salsa::tracked(returns(ref))]
pub fn target_ir<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
    spec: crate::ir::tile::Specialization,
) -> Result<Arc<crate::ir::target::Kernel>, Vec<Diagnostic>> {
    let tile = tile_ir(db, item, options, spec).clone()?;
    match crate::ir::target::lower(&tile, options.arch(db)) {
        Ok(k) => {
            debug_assert_eq!(crate::ir::target::verify::verify(&k), Ok(()));
            Ok(Arc::new(k))
        }
        Err(u) => Err(vec![Diagnostic::new("E0512", u.span, u.message)]),
    }
}

/// One PTX module holding `kernels` (items with their file offsets, as
/// `file_kernels` gives them) for `options`' arch, or every diagnostic of
/// every kernel that failed (absolute spans).
pub fn ptx_module<'db>(
    db: &'db dyn Db,
    kernels: &[(String, ItemSource<'db>, u32)],
    options: Options,
    spec: &crate::ir::tile::Specialization,
) -> Result<String, Vec<Diagnostic>> {
    let mut lowered = Vec::new();
    let mut diags = Vec::new();
    for (_, item, offset) in kernels {
        match target_ir(db, *item, options, spec.clone()) {
            Ok(k) => lowered.push((**k).clone()),
            Err(d) => diags.extend(d.iter().cloned().map(|d| d.shifted(*offset))),
        }
    }
    if diags.is_empty() {
        Ok(crate::backend::ptx::module(options.arch(db), &lowered))
    } else {
        Err(diags)
    }
}

/// The PTX module of every kernel of `file` (see `ptx_module`).
#[salsa::tracked(returns(ref))]
pub fn ptx(
    db: &dyn Db,
    file: SourceFile,
    options: Options,
    spec: crate::ir::tile::Specialization,
) -> Result<String, Vec<Diagnostic>> {
    ptx_module(db, &file_kernels(db, file), options, &spec)
}

/// What queries need from the database beyond salsa itself: finding modules.
#[salsa::db]
pub trait Db: salsa::Database {
    /// The file for a dotted module path imported from `from`: `std.*` comes from the
    /// embedded stdlib, anything else from `PATH.tsr` next to the importing file.
    fn resolve_module(&self, from: SourceFile, path: &[String]) -> Option<SourceFile>;
}

/// The database behind `tsrc`, the REPL and the language server.
#[salsa::db]
#[derive(Clone)]
pub struct Database {
    storage: salsa::Storage<Self>,
    files: FileMap,
    options: Option<Options>,
    events: Arc<Mutex<Option<Vec<String>>>>,
    /// Created by `with_event_log`: salsa reports executions to `events`.
    logging: bool,
    /// Advanced by every write, so that computations on clones taken before it
    /// stop at their next `cancel::checkpoint`.
    generation: crate::cancel::Generation,
}

impl Default for Database {
    fn default() -> Self {
        Self::new()
    }
}

impl Database {
    /// A database without an event callback: salsa then builds no event for each
    /// memo it validates, which halves the cost of re-checking after an edit.
    pub fn new() -> Self {
        Self::with_storage(salsa::Storage::new(None), Arc::default(), false)
    }

    /// A database that can record which queries execute (`start_event_log`), for
    /// reuse tests and benchmarks.
    pub fn with_event_log() -> Self {
        let events: Arc<Mutex<Option<Vec<String>>>> = Arc::default();
        let log = events.clone();
        let storage = salsa::Storage::new(Some(Box::new(move |event: salsa::Event| {
            if let salsa::EventKind::WillExecute { database_key } = event.kind {
                if let Some(log) = &mut *log.lock().unwrap() {
                    log.push(format!("{database_key:?}"));
                }
            }
        })));
        Self::with_storage(storage, events, true)
    }

    fn with_storage(
        storage: salsa::Storage<Self>,
        events: Arc<Mutex<Option<Vec<String>>>>,
        logging: bool,
    ) -> Self {
        let mut db = Database {
            storage,
            files: FileMap::default(),
            options: None,
            events,
            logging,
            generation: Default::default(),
        };
        db.options = Some(Options::new(&db, Arch::default(), false));
        db
    }

    pub fn options(&self) -> Options {
        self.options.expect("options are set in Database::new")
    }

    /// The precision of f32 `matmul` without `precision=`: tf32 or ieee.
    pub fn set_matmul_tf32(&mut self, tf32: bool) {
        use salsa::Setter;
        let options = self.options();
        if options.matmul_tf32(self) != tf32 {
            self.generation.advance();
            options.set_matmul_tf32(self).to(tf32);
        }
    }

    /// The write count this handle was taken at: computations on a clone run in
    /// `cancel::scope` of it stop once the database is written to.
    pub fn generation(&self) -> crate::cancel::Generation {
        self.generation.clone()
    }

    pub fn set_arch(&mut self, arch: Arch) {
        use salsa::Setter;
        let options = self.options();
        if options.arch(self) != arch {
            self.generation.advance();
            options.set_arch(self).to(arch);
        }
    }

    /// A file with the given text, created or updated (virtual files included).
    pub fn set_source(&mut self, path: impl Into<PathBuf>, text: String) -> SourceFile {
        use salsa::Setter;
        let path = path.into();
        if let Some(file) = self.files.get(&path) {
            if file.text(self) != &text {
                self.generation.advance();
                file.set_text(self).to(text);
            }
            return file;
        }
        let file = SourceFile::new(self, path.clone(), text);
        self.files.insert(path, file);
        file
    }

    /// Reads a file from disk into the database.
    pub fn load_file(&mut self, path: &Path) -> std::io::Result<SourceFile> {
        let text = std::fs::read_to_string(path)?;
        Ok(self.set_source(path.to_path_buf(), text))
    }

    /// The file at `path`, if the database has it.
    pub fn file(&self, path: &Path) -> Option<SourceFile> {
        self.files.get(path)
    }

    /// Every diagnostic of `file` under the current options.
    pub fn diagnostics(&self, file: SourceFile) -> &[Diagnostic] {
        file_diagnostics(self, file, self.options())
    }

    /// Starts recording which queries execute (for reuse tests and benchmarks).
    /// Only a database made by `with_event_log` can record.
    pub fn start_event_log(&self) {
        assert!(
            self.logging,
            "start_event_log needs a database made by Database::with_event_log"
        );
        *self.events.lock().unwrap() = Some(Vec::new());
    }

    /// The queries executed since `start_event_log`, as `query(id)` strings.
    pub fn take_event_log(&self) -> Vec<String> {
        self.events
            .lock()
            .unwrap()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

#[salsa::db]
impl salsa::Database for Database {}

#[salsa::db]
impl Db for Database {
    fn resolve_module(&self, from: SourceFile, path: &[String]) -> Option<SourceFile> {
        if path.first().map(String::as_str) == Some("std") {
            let dotted = path.join(".");
            let key = PathBuf::from(format!("<{dotted}>"));
            if let Some(file) = self.files.get(&key) {
                return Some(file);
            }
            let text = crate::stdlib::source(&dotted)?;
            let file = SourceFile::new(self, key.clone(), text.to_string());
            self.files.insert(key, file);
            return Some(file);
        }
        // User modules live next to the importing file; read on first use, like the
        // lazy inputs of salsa's examples. Later edits arrive through `set_source`.
        let mut candidate = from
            .path(self)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        for part in path {
            candidate.push(part);
        }
        candidate.set_extension("tsr");
        if let Some(file) = self.files.get(&candidate) {
            return Some(file);
        }
        let text = std::fs::read_to_string(&candidate).ok()?;
        let file = SourceFile::new(self, candidate.clone(), text);
        self.files.insert(candidate, file);
        Some(file)
    }
}

/// A small path → file map that is cheap to clone with the database (snapshots).
mod file_map {
    use super::SourceFile;
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, RwLock};

    #[derive(Clone, Default)]
    pub struct FileMap(Arc<RwLock<HashMap<PathBuf, SourceFile>>>);

    impl FileMap {
        pub fn get(&self, path: &Path) -> Option<SourceFile> {
            self.0.read().unwrap().get(path).copied()
        }

        pub fn insert(&self, path: PathBuf, file: SourceFile) {
            self.0.write().unwrap().insert(path, file);
        }
    }
}

// ---------------------------------------------------------------------------
// Graph IR and Schedule IR of whole-tensor functions (issue 3, graph lowering).
// ---------------------------------------------------------------------------

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

/// Why `emit_graph`/`emit_schedule` produced nothing.
#[derive(Clone, Debug, PartialEq)]
pub enum EmitError {
    /// The file has errors (absolute spans).
    Diagnostics(Vec<Diagnostic>),
    /// No function of that name in the file.
    NoFunction(String),
    /// A kernel was named: kernels have Tile IR, not Graph/Schedule IR.
    IsKernel(String),
    /// A construct the lowering does not handle yet (absolute span).
    Unsupported(crate::ir::graph::LowerError),
}

impl std::fmt::Display for EmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmitError::Diagnostics(d) => write!(f, "the file has {} error(s)", d.len()),
            EmitError::NoFunction(n) => write!(f, "no function `{n}` in this file"),
            EmitError::IsKernel(n) => write!(
                f,
                "`{n}` is a kernel: Graph and Schedule IR exist for whole-tensor functions (use --emit tile-ir)"
            ),
            EmitError::Unsupported(e) => e.fmt(f),
        }
    }
}

fn emit_ir(
    db: &Database,
    file: SourceFile,
    name: &str,
    render: &dyn Fn(&Database, ItemSource<'_>) -> Result<String, crate::ir::graph::LowerError>,
) -> Result<String, EmitError> {
    let errors: Vec<Diagnostic> = db
        .diagnostics(file)
        .iter()
        .filter(|d| d.is_error())
        .cloned()
        .collect();
    if !errors.is_empty() {
        return Err(EmitError::Diagnostics(errors));
    }
    let (item, offset) =
        function_item(db, file, name).ok_or_else(|| EmitError::NoFunction(name.to_string()))?;
    if let Some(ast::Item::Function(f)) = parse_item(db, item).item.as_deref() {
        if f.is_kernel() {
            return Err(EmitError::IsKernel(name.to_string()));
        }
    }
    render(db, item).map_err(|e| EmitError::Unsupported(e.shifted(offset)))
}

/// The Graph IR dump of the whole-tensor function `name` of `file`.
pub fn emit_graph(db: &Database, file: SourceFile, name: &str) -> Result<String, EmitError> {
    emit_ir(db, file, name, &|db, item| {
        graph_ir(db, item, db.options())
            .as_ref()
            .map(|g| crate::ir::graph::dump(g))
            .map_err(Clone::clone)
    })
}

/// The Schedule IR dump (with its generated kernels) of the function `name` of `file`.
pub fn emit_schedule(db: &Database, file: SourceFile, name: &str) -> Result<String, EmitError> {
    emit_ir(db, file, name, &|db, item| {
        schedule_ir(db, item, db.options())
            .as_ref()
            .map(|s| crate::ir::schedule::dump(s))
            .map_err(Clone::clone)
    })
}

// ---------------------------------------------------------------------------
// End of Graph IR / Schedule IR queries.
// ---------------------------------------------------------------------------

#[cfg(test)]
mod reuse_tests {
    use super::*;

    const TEXT: &str = "const B = 64\n\n@kernel(grid=(cdiv(N, B),))\ndef k(x: Tensor[\"N\", f32]):\n    i = program_id(0) * B\n    store(x[i : i + B], load(x[i : i + B]) * 2.0)\n\ndef f(a: Tensor[\"M\", f32]) -> Tensor[\"M\", f32]:\n    return a * 0.5\n\ndef g(a: Tensor[\"M\", f32]) -> Tensor[\"M\", f32]:\n    return f(a) + a\n";

    #[test]
    fn body_edit_rechecks_only_that_function() {
        let mut db = Database::with_event_log();
        let file = db.set_source("r.tsr", TEXT.to_string());
        assert!(
            db.diagnostics(file).is_empty(),
            "{:?}",
            db.diagnostics(file)
        );
        let scope_before = module_scope(&db, file).clone();
        db.start_event_log();
        db.set_source("r.tsr", TEXT.replace("a * 0.5", "a * 0.25"));
        assert!(db.diagnostics(file).is_empty());
        let log = db.take_event_log();
        let checks: Vec<&String> = log
            .iter()
            .filter(|e| e.starts_with("check_item("))
            .collect();
        assert_eq!(
            checks.len(),
            1,
            "only the edited function is re-checked: {log:?}"
        );
        assert_eq!(
            &scope_before,
            module_scope(&db, file),
            "the module scope is unchanged by a body edit"
        );
        // A signature edit changes the scope and re-checks its users.
        db.start_event_log();
        db.set_source(
            "r.tsr",
            TEXT.replace(
                "def f(a: Tensor[\"M\", f32])",
                "def f(a: Tensor[\"M\", f16])",
            ),
        );
        let diags = db.diagnostics(file).to_vec();
        let log = db.take_event_log();
        assert!(
            log.iter().filter(|e| e.starts_with("check_item(")).count() >= 2,
            "{log:?}"
        );
        assert!(diags.iter().any(|d| d.code == "E0301"), "{diags:?}");
    }

    #[test]
    fn import_cycles_do_not_panic() {
        let mut db = Database::new();
        db.set_source("/v/b.tsr", "from a import f\n\ndef g(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return f(x)\n".to_string());
        let a = db.set_source(
            "/v/a.tsr",
            "import a\nfrom b import g\n\ndef f(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return g(x) + a.f(x)\n".to_string(),
        );
        assert!(db.diagnostics(a).is_empty(), "{:?}", db.diagnostics(a));
    }
}
