//! Name occurrences of an item and where each name is defined: the ground of
//! go-to-definition, find-references, hover on names and completion of locals.
//!
//! Scoping follows the checker: a name assigned anywhere in a function body is
//! local throughout it (Python's rule); parameters and the dims named in
//! parameter annotations (`Tensor["M", "K", f16]` binds `M` and `K`) are locals
//! too; everything else is a module-level name (a `def`, a `const`, a top-level
//! assignment or an import), and an imported name is defined where its module
//! defines it (stdlib modules included).

use crate::check::builtins;
use crate::check::DType;
use crate::db::{file_items, parse_item, Db, ItemSource, SourceFile};
use crate::syntax::ast::{
    self, Expr, ExprKind, Index, Item, Stmt, StmtKind, TypeExpr, TypeExprKind,
};
use crate::syntax::span::Span;
use std::collections::HashMap;

/// How an occurrence binds or refers to its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OccKind {
    /// A parameter of the enclosing function.
    Param,
    /// A dim named in a parameter's annotation.
    Dim,
    /// An assignment target or loop variable (a write).
    Assign,
    /// The name of a `def`, `const`, or an import binding at module level.
    Item,
    /// A read.
    Use,
}

/// One occurrence of a name in an item (item-relative span). `qualifier` is the
/// dotted chain before it (`la.softmax`: `["la"]`; `from std.nn import relu`:
/// `["std", "nn"]` for `relu`) — such an occurrence names a module member.
#[derive(Clone, Debug, PartialEq)]
pub struct Occurrence {
    pub name: String,
    pub span: Span,
    pub kind: OccKind,
    pub qualifier: Vec<String>,
}

/// Every name occurrence of `item`, in source order.
pub fn occurrences(item: &Item, text: &str) -> Vec<Occurrence> {
    let mut w = Walker {
        out: Vec::new(),
        text,
    };
    match item {
        Item::Import(i) => {
            let path: Vec<String> = i.path.iter().map(|p| p.name.clone()).collect();
            for (k, p) in i.path.iter().enumerate() {
                w.push(&p.name, p.span, OccKind::Use, path[..k].to_vec());
            }
            if let Some(a) = &i.alias {
                w.push(&a.name, a.span, OccKind::Item, Vec::new());
            }
        }
        Item::FromImport(i) => {
            let path: Vec<String> = i.module.iter().map(|p| p.name.clone()).collect();
            for (k, p) in i.module.iter().enumerate() {
                w.push(&p.name, p.span, OccKind::Use, path[..k].to_vec());
            }
            for n in &i.names {
                w.push(&n.name.name, n.name.span, OccKind::Use, path.clone());
                if let Some(a) = &n.alias {
                    w.push(&a.name, a.span, OccKind::Item, Vec::new());
                }
            }
        }
        Item::Const(c) => {
            w.push(&c.name.name, c.name.span, OccKind::Item, Vec::new());
            if let Some(t) = &c.ty {
                w.ty(t, false);
            }
            w.expr(&c.value);
        }
        Item::Function(f) => {
            for d in &f.decorators {
                for a in d.args.iter().flatten() {
                    w.expr(&a.value);
                }
            }
            w.push(&f.name.name, f.name.span, OccKind::Item, Vec::new());
            for p in &f.params {
                w.push(&p.name.name, p.name.span, OccKind::Param, Vec::new());
                if let Some(t) = &p.ty {
                    w.ty(t, true);
                }
                if let Some(d) = &p.default {
                    w.expr(d);
                }
            }
            if let Some(t) = &f.ret {
                w.ty(t, false);
            }
            w.block(&f.body);
        }
        Item::Stmt(s) => w.block(std::slice::from_ref(s)),
    }
    w.out.sort_by_key(|o| (o.span.start, o.span.end));
    w.out
}

struct Walker<'t> {
    out: Vec<Occurrence>,
    text: &'t str,
}

impl Walker<'_> {
    fn push(&mut self, name: &str, span: Span, kind: OccKind, qualifier: Vec<String>) {
        self.out.push(Occurrence {
            name: name.to_string(),
            span,
            kind,
            qualifier,
        });
    }

    /// Dims in annotations: identifiers inside string args (`"4*D"`) and bare
    /// names that are not dtypes. In a parameter annotation they bind the dim.
    fn ty(&mut self, t: &TypeExpr, binds: bool) {
        match &t.kind {
            TypeExprKind::Name(_) => {}
            TypeExprKind::Const(inner) => {
                if let Some(i) = inner {
                    self.ty(i, binds);
                }
            }
            TypeExprKind::Generic { args, .. } => {
                let kind = if binds { OccKind::Dim } else { OccKind::Use };
                for a in args {
                    match &a.kind {
                        ExprKind::Str(_) => {
                            let raw = self.text.get(a.span.range()).unwrap_or("");
                            for (off, id) in identifiers(raw) {
                                let start = a.span.start + off as u32;
                                self.push(
                                    id,
                                    Span::new(start, start + id.len() as u32),
                                    kind,
                                    Vec::new(),
                                );
                            }
                        }
                        ExprKind::Name(n) if DType::from_name(&n.name).is_some() => {}
                        ExprKind::Name(n) => self.push(&n.name, n.span, kind, Vec::new()),
                        _ => self.expr(a),
                    }
                }
            }
        }
    }

    fn block(&mut self, b: &[Stmt]) {
        for s in b {
            self.stmt(s);
        }
    }

    fn stmt(&mut self, s: &Stmt) {
        match &s.kind {
            StmtKind::Expr(e) => self.expr(e),
            StmtKind::Assign { target, ty, value } => {
                self.target(target);
                if let Some(t) = ty {
                    self.ty(t, false);
                }
                self.expr(value);
            }
            StmtKind::AugAssign { target, value, .. } => {
                self.target(target);
                self.expr(value);
            }
            StmtKind::If { branches, orelse } => {
                for (c, b) in branches {
                    self.expr(c);
                    self.block(b);
                }
                if let Some(b) = orelse {
                    self.block(b);
                }
            }
            StmtKind::For { target, iter, body } => {
                self.push(&target.name, target.span, OccKind::Assign, Vec::new());
                self.expr(iter);
                self.block(body);
            }
            StmtKind::While { cond, body } => {
                self.expr(cond);
                self.block(body);
            }
            StmtKind::Return(Some(e)) => self.expr(e),
            StmtKind::Return(None)
            | StmtKind::Break
            | StmtKind::Continue
            | StmtKind::Pass
            | StmtKind::Error => {}
        }
    }

    fn target(&mut self, t: &Expr) {
        match &t.kind {
            ExprKind::Name(n) => self.push(&n.name, n.span, OccKind::Assign, Vec::new()),
            ExprKind::Tuple(items) | ExprKind::List(items) => {
                for i in items {
                    self.target(i);
                }
            }
            _ => self.expr(t),
        }
    }

    fn expr(&mut self, e: &Expr) {
        match &e.kind {
            ExprKind::Int(_)
            | ExprKind::Float(_)
            | ExprKind::Str(_)
            | ExprKind::Bool(_)
            | ExprKind::None
            | ExprKind::Error => {}
            ExprKind::Name(n) => self.push(&n.name, n.span, OccKind::Use, Vec::new()),
            ExprKind::Unary { operand, .. } => self.expr(operand),
            ExprKind::Binary { lhs, rhs, .. } => {
                self.expr(lhs);
                self.expr(rhs);
            }
            ExprKind::IfElse {
                cond,
                then,
                otherwise,
            } => {
                self.expr(cond);
                self.expr(then);
                self.expr(otherwise);
            }
            ExprKind::Call { func, args } => {
                self.expr(func);
                for a in args {
                    self.expr(&a.value);
                }
            }
            ExprKind::Subscript { value, indices } => {
                self.expr(value);
                for i in indices {
                    match i {
                        Index::Expr(e) => self.expr(e),
                        Index::Slice {
                            start, end, step, ..
                        } => {
                            for p in [start, end, step].into_iter().flatten() {
                                self.expr(p);
                            }
                        }
                    }
                }
            }
            ExprKind::Attribute { value, attr } => {
                match dotted(value) {
                    // `la.softmax`, `std.nn.relu`: the chain's first name is a
                    // use; each later part is a member of what precedes it.
                    Some(chain) => {
                        let mut parts = Vec::new();
                        collect_chain(value, &mut parts);
                        for (k, (name, span)) in parts.iter().enumerate() {
                            let q: Vec<String> = parts[..k].iter().map(|p| p.0.clone()).collect();
                            self.push(name, *span, OccKind::Use, q);
                        }
                        self.push(&attr.name, attr.span, OccKind::Use, chain);
                    }
                    None => self.expr(value),
                }
            }
            ExprKind::Tuple(items) | ExprKind::List(items) => {
                for i in items {
                    self.expr(i);
                }
            }
            ExprKind::Dict(kv) => {
                for (k, v) in kv {
                    self.expr(k);
                    self.expr(v);
                }
            }
        }
    }
}

/// `a.b.c` as `["a", "b", "c"]`, if `e` is such a chain of names.
pub fn dotted(e: &Expr) -> Option<Vec<String>> {
    match &e.kind {
        ExprKind::Name(n) => Some(vec![n.name.clone()]),
        ExprKind::Attribute { value, attr } => {
            let mut v = dotted(value)?;
            v.push(attr.name.clone());
            Some(v)
        }
        _ => None,
    }
}

fn collect_chain(e: &Expr, out: &mut Vec<(String, Span)>) {
    match &e.kind {
        ExprKind::Name(n) => out.push((n.name.clone(), n.span)),
        ExprKind::Attribute { value, attr } => {
            collect_chain(value, out);
            out.push((attr.name.clone(), attr.span));
        }
        _ => {}
    }
}

/// The identifiers of a dim expression string (`"4*D"` → `D` at 3), byte offsets.
pub fn identifiers(raw: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let bytes = raw.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            out.push((start, &raw[start..i]));
        } else if c.is_ascii_digit() {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// A place in a file: absolute byte span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub file: SourceFile,
    pub span: Span,
}

/// What a name occurrence refers to.
#[derive(Clone, Debug)]
pub enum Target {
    /// A definition in source (a local's first binding, a module item, a module's start).
    At(Location),
    /// A builtin function.
    Builtin(&'static builtins::BuiltinInfo),
    /// Nothing known (an unbound name, a dtype, a member of a tile).
    Unknown,
}

impl PartialEq for Target {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Target::At(a), Target::At(b)) => a == b,
            (Target::Builtin(a), Target::Builtin(b)) => a.id == b.id,
            (Target::Unknown, Target::Unknown) => true,
            _ => false,
        }
    }
}

/// The item of `file` covering `offset`, with the item's start offset.
pub fn item_at<'db>(
    db: &'db dyn Db,
    file: SourceFile,
    offset: u32,
) -> Option<(ItemSource<'db>, u32)> {
    let items = &file_items(db, file).items;
    let mut found = None;
    for (source, start) in items {
        if *start <= offset {
            found = Some((*source, *start));
        } else {
            break;
        }
    }
    found.filter(|(s, start)| offset <= start + s.text(db).len() as u32)
}

/// The occurrences of an item (cached parse, fresh walk).
pub fn item_occurrences(db: &dyn Db, item: ItemSource<'_>) -> Vec<Occurrence> {
    match parse_item(db, item).item.as_deref() {
        Some(ast) => occurrences(ast, item.text(db)),
        None => Vec::new(),
    }
}

/// The occurrence touching `offset` (inside it, or just after its last character).
pub fn occurrence_at(occs: &[Occurrence], rel: u32) -> Option<&Occurrence> {
    occs.iter()
        .find(|o| o.span.start <= rel && rel < o.span.end)
        .or_else(|| occs.iter().find(|o| o.span.end == rel))
}

/// What `occ` (an occurrence in `item`, at `offset` in `file`) refers to.
pub fn resolve(
    db: &dyn Db,
    file: SourceFile,
    item: ItemSource<'_>,
    offset: u32,
    occs: &[Occurrence],
    occ: &Occurrence,
) -> Target {
    if !occ.qualifier.is_empty() {
        return resolve_qualified(db, file, &occ.qualifier, &occ.name);
    }
    let is_function = matches!(
        parse_item(db, item).item.as_deref(),
        Some(Item::Function(_))
    );
    // Locals: parameters, dims and assigned names of the enclosing function.
    if is_function && occ.kind != OccKind::Item {
        let first = occs
            .iter()
            .filter(|o| o.name == occ.name && o.qualifier.is_empty())
            .filter(|o| matches!(o.kind, OccKind::Param | OccKind::Dim | OccKind::Assign))
            .min_by_key(|o| {
                (
                    o.kind != OccKind::Param,
                    o.kind != OccKind::Dim,
                    o.span.start,
                )
            });
        if let Some(def) = first {
            return Target::At(Location {
                file,
                span: def.span.shift(offset),
            });
        }
    }
    resolve_module_name(db, file, &occ.name, 0)
}

/// A module-level name of `file`: its definition there, or in the module it is
/// imported from. `depth` bounds chains of re-exports.
pub fn resolve_module_name(db: &dyn Db, file: SourceFile, name: &str, depth: u32) -> Target {
    for (source, start) in &file_items(db, file).items {
        let Some(item) = parse_item(db, *source).item.clone() else {
            continue;
        };
        match &*item {
            Item::Function(f) if f.name.name == name => {
                return at(file, f.name.span.shift(*start));
            }
            Item::Const(c) if c.name.name == name => {
                return at(file, c.name.span.shift(*start));
            }
            Item::Import(i) => {
                let path: Vec<String> = i.path.iter().map(|p| p.name.clone()).collect();
                match &i.alias {
                    Some(a) if a.name == name => {
                        return module_start(db, file, &path)
                            .unwrap_or(at(file, a.span.shift(*start)));
                    }
                    None if path.first().is_some_and(|p| p == name) => {
                        let first = &i.path[0];
                        return module_start(db, file, &path[..1])
                            .unwrap_or(at(file, first.span.shift(*start)));
                    }
                    _ => {}
                }
            }
            Item::FromImport(i) => {
                for n in &i.names {
                    let local = n.alias.as_ref().unwrap_or(&n.name);
                    if local.name == name {
                        let path: Vec<String> = i.module.iter().map(|p| p.name.clone()).collect();
                        if depth < 8 {
                            if let Some(m) = db.resolve_module(file, &path) {
                                if let t @ Target::At(_) =
                                    resolve_module_name(db, m, &n.name.name, depth + 1)
                                {
                                    return t;
                                }
                            }
                        }
                        return at(file, local.span.shift(*start));
                    }
                }
            }
            _ => {}
        }
    }
    // Script variables: the first top-level assignment.
    for (source, start) in &file_items(db, file).items {
        if let Some(Item::Stmt(s)) = parse_item(db, *source).item.as_deref() {
            let occs = occurrences(&Item::Stmt(s.clone()), source.text(db));
            if let Some(o) = occs
                .iter()
                .find(|o| o.kind == OccKind::Assign && o.name == name)
            {
                return at(file, o.span.shift(*start));
            }
        }
    }
    match builtins::lookup(name) {
        Some(b) => Target::Builtin(b),
        None => Target::Unknown,
    }
}

fn at(file: SourceFile, span: Span) -> Target {
    Target::At(Location { file, span })
}

/// The start of the module `path` imported from `file`.
fn module_start(db: &dyn Db, file: SourceFile, path: &[String]) -> Option<Target> {
    db.resolve_module(file, path)
        .map(|m| at(m, Span::new(0, 0)))
}

/// `qualifier.name`: a module member (`la.softmax` with `import std.linalg as
/// la`, `std.nn.relu` with `import std.nn`, `relu` in `from std.nn import relu`),
/// or a module itself (`nn` in `std.nn`).
pub fn resolve_qualified(
    db: &dyn Db,
    file: SourceFile,
    qualifier: &[String],
    name: &str,
) -> Target {
    let mut full: Vec<String> = qualifier.to_vec();
    full.push(name.to_string());
    // `import P as x`: `x.member`.
    let modules = module_paths(db, file);
    for (local, path) in &modules {
        if qualifier.len() == 1 && local.as_deref() == Some(qualifier[0].as_str()) {
            return member(db, file, path, name);
        }
    }
    // `import std.nn` / `from std.nn import ...`: spelled-out paths.
    if let Some(m) = db.resolve_module(file, &full) {
        return at(m, Span::new(0, 0));
    }
    if db.resolve_module(file, qualifier).is_some() {
        return member(db, file, qualifier, name);
    }
    Target::Unknown
}

fn member(db: &dyn Db, file: SourceFile, path: &[String], name: &str) -> Target {
    match db.resolve_module(file, path) {
        Some(m) => match resolve_module_name(db, m, name, 1) {
            Target::Builtin(_) => Target::Unknown,
            t => t,
        },
        None => Target::Unknown,
    }
}

/// The `import` items of a file: the alias (if any) and the dotted path.
pub fn module_paths(db: &dyn Db, file: SourceFile) -> Vec<(Option<String>, Vec<String>)> {
    let mut out = Vec::new();
    for (source, _) in &file_items(db, file).items {
        if let Some(Item::Import(i)) = parse_item(db, *source).item.as_deref() {
            out.push((
                i.alias.as_ref().map(|a| a.name.clone()),
                i.path.iter().map(|p| p.name.clone()).collect(),
            ));
        }
    }
    out
}

/// The definition of the name at `offset` in `file`, with the occurrence's absolute span.
pub fn definition(db: &dyn Db, file: SourceFile, offset: u32) -> Option<(Span, Target)> {
    let (item, start) = item_at(db, file, offset)?;
    let occs = item_occurrences(db, item);
    let occ = occurrence_at(&occs, offset - start)?;
    Some((
        occ.span.shift(start),
        resolve(db, file, item, start, &occs, occ),
    ))
}

/// Every occurrence (absolute spans) in `files` of what the name at `offset`
/// refers to, its definition included. Locals are searched in their function only.
pub fn references(
    db: &dyn Db,
    file: SourceFile,
    offset: u32,
    files: &[SourceFile],
) -> Vec<Location> {
    let Some((item, start)) = item_at(db, file, offset) else {
        return Vec::new();
    };
    let occs = item_occurrences(db, item);
    let Some(occ) = occurrence_at(&occs, offset - start) else {
        return Vec::new();
    };
    let target = resolve(db, file, item, start, &occs, occ);
    let Target::At(def) = target else {
        return Vec::new();
    };
    let name = occ.name.clone();
    // The definition's own spelling (a use through `import ... as` differs).
    let def_name = def
        .file
        .text(db)
        .get(def.span.range())
        .unwrap_or("")
        .to_string();
    let mut out = Vec::new();
    // A local of this item: search the item only.
    let is_local = def.file == file
        && def.span.start >= start
        && def.span.end <= start + item.text(db).len() as u32
        && !matches!(parse_item(db, item).item.as_deref(), Some(Item::Function(f)) if f.name.span.shift(start) == def.span);
    let mut search: Vec<SourceFile> = if is_local { vec![file] } else { files.to_vec() };
    if !search.contains(&file) {
        search.push(file);
    }
    if !is_local && !search.contains(&def.file) {
        search.push(def.file);
    }
    // The definition's name text (an alias may rename it).
    for f in search {
        for (source, s) in &file_items(db, f).items {
            if is_local && *source != item {
                continue;
            }
            let occs = item_occurrences(db, *source);
            // Within an item, what an occurrence resolves to depends only on
            // its name, qualifier and whether it names the item: resolve each
            // such key once, so that an item with many uses stays linear.
            let mut resolved: HashMap<(&str, &[String], bool), bool> = HashMap::new();
            for o in &occs {
                if o.name != name && o.name != def_name {
                    continue;
                }
                let key = (o.name.as_str(), &o.qualifier[..], o.kind == OccKind::Item);
                let hit = *resolved
                    .entry(key)
                    .or_insert_with(|| resolve(db, f, *source, *s, &occs, o) == Target::At(def));
                if hit {
                    out.push(Location {
                        file: f,
                        span: o.span.shift(*s),
                    });
                }
            }
        }
    }
    out.sort_by_key(|l| (l.file.path(db).clone(), l.span.start));
    out.dedup();
    out
}

/// The locals visible in a function item: (name, kind, first span), params first.
pub fn locals(occs: &[Occurrence]) -> Vec<(String, OccKind, Span)> {
    let mut out: Vec<(String, OccKind, Span)> = Vec::new();
    let mut sorted: Vec<&Occurrence> = occs
        .iter()
        .filter(|o| {
            o.qualifier.is_empty()
                && matches!(o.kind, OccKind::Param | OccKind::Dim | OccKind::Assign)
        })
        .collect();
    sorted.sort_by_key(|o| {
        (
            o.kind != OccKind::Param,
            o.kind != OccKind::Dim,
            o.span.start,
        )
    });
    for o in sorted {
        if !out.iter().any(|(n, ..)| *n == o.name) {
            out.push((o.name.clone(), o.kind, o.span));
        }
    }
    out
}

/// The function items of the whole file with their start, for symbol lists.
pub fn items_of(db: &dyn Db, file: SourceFile) -> Vec<(std::sync::Arc<ast::Item>, u32)> {
    file_items(db, file)
        .items
        .iter()
        .filter_map(|(s, start)| parse_item(db, *s).item.clone().map(|i| (i, *start)))
        .collect()
}
