//! Editor queries over the checker's results: hover, inlay hints, definitions
//! and references, completion, signature help, symbols and semantic tokens.
//!
//! Everything here works in absolute byte offsets of one file's text; the
//! language server converts to its protocol's positions. Nothing here knows
//! about LSP. Answers come from the same salsa queries as `tsrc` (`check_item`,
//! `kernel_resources`), so the editor never disagrees with the compiler.

pub mod complete;
pub mod names;
pub mod tokens;

use crate::backend::resources::Resources;
use crate::check::{builtins, Entry};
use crate::db::{
    check_item, file_kernels, kernel_resources, module_scope, parse_item, Db, ItemSource, Options,
    SourceFile,
};
use crate::ir::tile::Specialization;
use crate::syntax::ast::{Expr, ExprKind, Item, Stmt, StmtKind};
use crate::syntax::span::Span;

pub use names::{definition, item_at, references, Location, Target};

/// A hover: the span it describes and Markdown text.
#[derive(Clone, Debug, PartialEq)]
pub struct Hover {
    pub span: Span,
    pub markdown: String,
}

/// An inline hint: shown after `offset`.
#[derive(Clone, Debug, PartialEq)]
pub struct InlayHint {
    pub offset: u32,
    pub label: String,
    /// A type hint (after a binding) rather than a note (after a kernel's header).
    pub is_type: bool,
}

fn code_block(text: &str) -> String {
    format!("```tsr\n{text}\n```")
}

/// The innermost recorded type at an item-relative offset, with its span.
fn type_at(types: &[(Span, String)], rel: u32) -> Option<(Span, &str)> {
    types
        .iter()
        .filter(|(s, _)| s.contains(rel) || s.end == rel)
        .min_by_key(|(s, _)| (!s.contains(rel), s.len()))
        .map(|(s, t)| (*s, t.as_str()))
}

/// Why a kernel has no estimate: the first lowering error, and the names it
/// still needs a value for (const parameters, specialised dims) — what
/// `tsrc report -D NAME=VALUE` (or the editor's `tessera.defines`) gives.
#[derive(Clone, Debug, PartialEq)]
pub struct NoEstimate {
    pub reason: String,
    pub needs: Vec<String>,
}

/// The resources of a kernel item under `spec` (const parameters without a
/// value at their defaults), exactly as `tsrc report -D ...` computes them, or
/// why there are none.
pub fn kernel_estimate(
    db: &dyn Db,
    item: ItemSource<'_>,
    offset: u32,
    options: Options,
    spec: &Specialization,
) -> Result<Resources, NoEstimate> {
    match kernel_resources(db, item, offset, options, spec) {
        Ok((r, _)) => Ok(r),
        Err(d) => {
            let mut needs: Vec<String> = Vec::new();
            for name in d
                .iter()
                .filter(|d| d.code == "E0511")
                .filter_map(needed_name)
            {
                if !needs.contains(&name) {
                    needs.push(name);
                }
            }
            Err(NoEstimate {
                reason: d
                    .first()
                    .map(|d| format!("{}: {}", d.code, d.message))
                    .unwrap_or_else(|| "the kernel does not compile".to_string()),
                needs,
            })
        }
    }
}

/// The name an E0511 asks a value for: every E0511's help line reads
/// `... -D NAME=...` (see `ir::tile::lower`).
fn needed_name(d: &crate::diag::Diagnostic) -> Option<String> {
    let help = d.help.as_deref()?;
    let rest = &help[help.find("-D ")? + 3..];
    let name = &rest[..rest.find('=')?];
    is_name(name).then(|| name.to_string())
}

/// `-D D=64 -D BM=128` for a hover's header; empty without values.
fn defines_text(spec: &Specialization) -> String {
    spec.values
        .iter()
        .map(|(k, v)| format!("-D {k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The short `def` hint of a kernel without an estimate: what it needs, where
/// to set it (the full reason is in the hover).
pub fn no_estimate_line(why: &NoEstimate) -> String {
    if why.needs.is_empty() {
        let code = why.reason.split(':').next().unwrap_or("error");
        format!("≈ no estimate ({code})")
    } else {
        format!("≈ needs {} (tessera.defines)", why.needs.join(", "))
    }
}

/// `48 KiB`, `1.5 KiB`, `512 B`.
pub fn format_bytes(bytes: u32) -> String {
    if bytes < 1024 {
        format!("{bytes} B")
    } else if bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        let kib = format!("{:.1}", bytes as f64 / 1024.0);
        format!("{} KiB", kib.trim_end_matches(".0"))
    }
}

/// The occupancy as `tsrc report` prints it (`{:.1}%`), without a `.0`.
pub fn format_occupancy(r: &Resources) -> String {
    let s = format!("{:.1}", r.occupancy.occupancy() * 100.0);
    format!("{}%", s.trim_end_matches(".0"))
}

/// The one-line estimate of a kernel's `def` hint: `≈ 96 regs · 48 KiB smem · occ 50% (sm_90)`;
/// on AMD `≈ 96 VGPRs · 24 SGPRs · 48 KiB LDS · 4 waves/SIMD (gfx942)`, with
/// the AGPRs where a CDNA kernel uses some.
pub fn estimate_line(r: &Resources) -> String {
    if let (Some(amd), Some(waves)) = (r.amd, r.occupancy.waves_per_simd) {
        let agprs = if amd.agprs > 0 {
            format!(" · {} AGPRs", amd.agprs)
        } else {
            String::new()
        };
        return format!(
            "≈ {} VGPRs{agprs} · {} SGPRs · {} LDS · {waves} waves/SIMD ({})",
            r.regs,
            amd.sgprs,
            format_bytes(r.smem_bytes),
            r.arch.name()
        );
    }
    format!(
        "≈ {} regs · {} smem · occ {} ({})",
        r.regs,
        format_bytes(r.smem_bytes),
        format_occupancy(r),
        r.arch.name()
    )
}

fn estimate_markdown(r: &Resources, spec: &Specialization) -> String {
    let limiters: Vec<&str> = r.occupancy.limiters().iter().map(|l| l.name()).collect();
    let how = match defines_text(spec) {
        d if d.is_empty() => "as `tsrc report`, const parameters at their defaults".to_string(),
        d => format!("as `tsrc report {d}`"),
    };
    if let (Some(amd), Some(waves)) = (r.amd, r.occupancy.waves_per_simd) {
        return format!(
            "**Estimate for {}** ({how})\n\n\
             | threads | VGPRs | AGPRs | SGPRs | LDS | occupancy | waves/SIMD | workgroups/CU | limiter |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---|\n\
             | {} | ≈ {} | {} | ≈ {} | {} ({} bytes) | {} | {waves} | {} | {} |",
            r.arch.name(),
            r.threads,
            r.regs,
            amd.agprs,
            amd.sgprs,
            format_bytes(r.smem_bytes),
            r.smem_bytes,
            format_occupancy(r),
            r.occupancy.blocks_per_sm,
            limiters.join("+"),
        );
    }
    format!(
        "**Estimate for {}** ({how})\n\n\
         | threads | registers | shared memory | occupancy | blocks/SM | limiter |\n\
         |---:|---:|---:|---:|---:|---|\n\
         | {} | ≈ {} | {} ({} bytes) | {} | {} | {} |",
        r.arch.name(),
        r.threads,
        r.regs,
        format_bytes(r.smem_bytes),
        r.smem_bytes,
        format_occupancy(r),
        r.occupancy.blocks_per_sm,
        limiters.join("+"),
    )
}

/// Hover at `offset`: the type of the expression (shape included), a function's
/// signature and docstring, and for a kernel its resource estimate.
/// Kernel estimates use `spec` (the editor's `tessera.defines`).
pub fn hover(
    db: &dyn Db,
    file: SourceFile,
    options: Options,
    spec: &Specialization,
    offset: u32,
) -> Option<Hover> {
    let (item, start) = item_at(db, file, offset)?;
    let rel = offset - start;
    let occs = names::item_occurrences(db, item);
    if let Some(occ) = names::occurrence_at(&occs, rel) {
        let span = occ.span.shift(start);
        match names::resolve(db, file, item, start, &occs, occ) {
            Target::Builtin(b) => {
                return Some(Hover {
                    span,
                    markdown: format!("{}\n\nbuiltin ({})", code_block(b.doc), ctx_name(b.ctx)),
                })
            }
            Target::At(loc) => {
                if let Some(mut md) = definition_markdown(db, options, spec, loc) {
                    // On the callee of a generic function's call: what this
                    // call binds its dtype variables and batch runs to.
                    let text = item.text(db);
                    if text
                        .get(occ.span.end as usize..)
                        .is_some_and(|t| t.starts_with('('))
                    {
                        let checked = check_item(db, item, options);
                        if let Some((_, shown)) = checked
                            .instances
                            .iter()
                            .filter(|(s, _)| s.start <= occ.span.start && occ.span.end < s.end)
                            .min_by_key(|(s, _)| s.len())
                        {
                            md.push_str(&format!("\n\n---\n\nThis call binds `{shown}`"));
                        }
                    }
                    return Some(Hover { span, markdown: md });
                }
            }
            Target::Unknown => {}
        }
    }
    let checked = check_item(db, item, options);
    let (span, ty) = type_at(&checked.types, rel)?;
    let text = item.text(db).get(span.range()).unwrap_or("");
    let shown = if is_name(text) {
        format!("{text}: {ty}")
    } else {
        ty.to_string()
    };
    Some(Hover {
        span: span.shift(start),
        markdown: code_block(&shown),
    })
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| c.is_alphanumeric() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

fn ctx_name(c: builtins::Ctx) -> &'static str {
    match c {
        builtins::Ctx::Kernel => "in kernels",
        builtins::Ctx::Tensor => "in whole-tensor code",
        builtins::Ctx::Both => "in kernels and whole-tensor code",
        builtins::Ctx::Session => "in top-level statements (`tessera run`, `tessera repl`)",
    }
}

/// Markdown for a module-level definition (function, kernel, const); `None` for
/// locals (their hover is their type).
fn definition_markdown(
    db: &dyn Db,
    options: Options,
    spec: &Specialization,
    loc: Location,
) -> Option<String> {
    let (item, start) = item_at(db, loc.file, loc.span.start)?;
    let parsed = parse_item(db, item).item.clone()?;
    match &*parsed {
        Item::Function(f) if f.name.span.shift(start) == loc.span => {
            let checked = check_item(db, item, options);
            let rendered = checked
                .signature
                .as_ref()
                .map(|s| s.rendered.clone())
                .unwrap_or_else(|| format!("def {}(...)", f.name.name));
            let header = if f.is_kernel() && !rendered.starts_with('@') {
                format!("@kernel\n{rendered}")
            } else {
                rendered
            };
            let mut md = code_block(&header);
            if let Some(doc) = &f.docstring {
                md.push_str("\n\n");
                md.push_str(doc.trim());
            }
            if f.is_kernel() {
                md.push_str("\n\n");
                match kernel_estimate(db, item, start, options, spec) {
                    Ok(r) => md.push_str(&estimate_markdown(&r, spec)),
                    Err(why) => {
                        md.push_str(&format!("No resource estimate: {}", why.reason));
                        if !why.needs.is_empty() {
                            let example: Vec<String> =
                                why.needs.iter().map(|n| format!("\"{n}\": 128")).collect();
                            md.push_str(&format!(
                                "\n\nSet the setting `tessera.defines` (like `tsrc report -D`), e.g. `{{ {} }}`.",
                                example.join(", ")
                            ));
                        }
                    }
                }
            }
            Some(md)
        }
        Item::Const(c) if c.name.span.shift(start) == loc.span => {
            let value = match module_scope(db, loc.file).get(&c.name.name) {
                Some(Entry::Const { ty, value: Some(v) }) => {
                    format!("const {}: {ty} = {v}", c.name.name)
                }
                Some(Entry::Const { ty, value: None }) => format!("const {}: {ty}", c.name.name),
                _ => format!("const {}", c.name.name),
            };
            Some(code_block(&value))
        }
        _ if loc.span.is_empty() && loc.span.start == 0 => {
            // A module.
            let path = loc.file.path(db).display().to_string();
            Some(format!(
                "module `{}`",
                path.trim_start_matches('<').trim_end_matches('>')
            ))
        }
        _ => None,
    }
}

/// Inlay hints of `file` within `[from, to)`: each kernel's estimate under
/// `spec` after its header (or what it needs for one), and the shape of each
/// tile bound by an assignment.
pub fn inlay_hints(
    db: &dyn Db,
    file: SourceFile,
    options: Options,
    spec: &Specialization,
    from: u32,
    to: u32,
) -> Vec<InlayHint> {
    let mut out = Vec::new();
    let errors: Vec<(u32, u32)> = crate::db::file_diagnostics(db, file, options)
        .iter()
        .filter(|d| d.is_error())
        .map(|d| (d.span.start, d.span.end))
        .collect();
    for (_, item, start) in file_kernels(db, file) {
        let end = start + item.text(db).len() as u32;
        if end < from || start > to {
            continue;
        }
        let Some(Item::Function(f)) = parse_item(db, item).item.as_deref() else {
            continue;
        };
        // A kernel with an error of its own has no estimate; one whose file
        // has errors elsewhere keeps it (or says which value it needs: any
        // other failure may come from those errors).
        let own_error = errors.iter().any(|&(s, e)| s < end && e >= start);
        let label = if own_error {
            None
        } else {
            match kernel_estimate(db, item, start, options, spec) {
                Ok(r) => Some(estimate_line(&r)),
                Err(why) if errors.is_empty() || !why.needs.is_empty() => {
                    Some(no_estimate_line(&why))
                }
                Err(_) => None,
            }
        };
        if let Some(label) = label {
            out.push(InlayHint {
                offset: f.header_span.end + start,
                label,
                is_type: false,
            });
        }
        let checked = check_item(db, item, options);
        let mut targets = Vec::new();
        assignment_targets(&f.body, &mut targets);
        for span in targets {
            let ty = checked
                .types
                .iter()
                .find(|(s, _)| *s == span)
                .map(|(_, t)| t);
            if let Some(ty) = ty.filter(|t| t.starts_with("Tile[")) {
                let offset = span.end + start;
                if offset >= from && offset <= to {
                    out.push(InlayHint {
                        offset,
                        label: format!(": {ty}"),
                        is_type: true,
                    });
                }
            }
        }
    }
    out.sort_by_key(|h| h.offset);
    out
}

fn assignment_targets(block: &[Stmt], out: &mut Vec<Span>) {
    for s in block {
        match &s.kind {
            StmtKind::Assign {
                target, ty: None, ..
            } => names_of(target, out),
            StmtKind::If { branches, orelse } => {
                for (_, b) in branches {
                    assignment_targets(b, out);
                }
                if let Some(b) = orelse {
                    assignment_targets(b, out);
                }
            }
            StmtKind::For { body, .. } | StmtKind::While { body, .. } => {
                assignment_targets(body, out)
            }
            _ => {}
        }
    }
}

fn names_of(e: &Expr, out: &mut Vec<Span>) {
    match &e.kind {
        ExprKind::Name(n) => out.push(n.span),
        ExprKind::Tuple(items) | ExprKind::List(items) => {
            for i in items {
                names_of(i, out);
            }
        }
        _ => {}
    }
}

/// A symbol of the document outline.
#[derive(Clone, Debug, PartialEq)]
pub struct Symbol {
    pub name: String,
    pub kind: SymbolKind,
    pub detail: Option<String>,
    pub span: Span,
    pub name_span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymbolKind {
    Kernel,
    Function,
    Const,
    Module,
    Variable,
}

/// The outline of a file: functions, kernels, consts, imports, script variables.
pub fn document_symbols(db: &dyn Db, file: SourceFile, options: Options) -> Vec<Symbol> {
    let mut out = Vec::new();
    for (item, start) in names::items_of(db, file) {
        let span = item.span().shift(start);
        match &*item {
            Item::Function(f) => {
                let source = item_at(db, file, start).map(|(s, _)| s);
                let detail = source.and_then(|s| {
                    check_item(db, s, options)
                        .signature
                        .as_ref()
                        .map(|s| s.rendered.clone())
                });
                out.push(Symbol {
                    name: f.name.name.clone(),
                    kind: if f.is_kernel() {
                        SymbolKind::Kernel
                    } else {
                        SymbolKind::Function
                    },
                    detail,
                    span,
                    name_span: f.name.span.shift(start),
                });
            }
            Item::Const(c) => out.push(Symbol {
                name: c.name.name.clone(),
                kind: SymbolKind::Const,
                detail: None,
                span,
                name_span: c.name.span.shift(start),
            }),
            Item::Import(i) => {
                let last = i.alias.as_ref().or(i.path.last());
                if let Some(n) = last {
                    out.push(Symbol {
                        name: i
                            .path
                            .iter()
                            .map(|p| p.name.as_str())
                            .collect::<Vec<_>>()
                            .join("."),
                        kind: SymbolKind::Module,
                        detail: i.alias.as_ref().map(|a| format!("as {}", a.name)),
                        span,
                        name_span: n.span.shift(start),
                    });
                }
            }
            Item::FromImport(i) => {
                for n in &i.names {
                    let local = n.alias.as_ref().unwrap_or(&n.name);
                    out.push(Symbol {
                        name: local.name.clone(),
                        kind: SymbolKind::Module,
                        detail: Some(format!(
                            "from {}",
                            i.module
                                .iter()
                                .map(|p| p.name.as_str())
                                .collect::<Vec<_>>()
                                .join(".")
                        )),
                        span,
                        name_span: local.span.shift(start),
                    });
                }
            }
            Item::Stmt(s) => {
                if let StmtKind::Assign { target, .. } = &s.kind {
                    let mut spans = Vec::new();
                    names_of(target, &mut spans);
                    let text = file.text(db);
                    for sp in spans {
                        let sp = sp.shift(start);
                        out.push(Symbol {
                            name: text.get(sp.range()).unwrap_or("").to_string(),
                            kind: SymbolKind::Variable,
                            detail: None,
                            span,
                            name_span: sp,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The kernel or function whose item covers `offset`.
pub fn enclosing_function(db: &dyn Db, file: SourceFile, offset: u32) -> Option<(String, bool)> {
    let (item, _) = item_at(db, file, offset)?;
    match parse_item(db, item).item.as_deref() {
        Some(Item::Function(f)) => Some((f.name.name.clone(), f.is_kernel())),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
