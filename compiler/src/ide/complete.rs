//! Completion and signature help. Both read the text before the cursor (what
//! is being typed rarely parses) and the checker's results of the enclosing item
//! (locals, their types) and module (imports, functions, consts).

use crate::check::{builtins, DType, Entry, ModuleScope};
use crate::db::{check_item, module_exports, module_scope, Db, Options, SourceFile};

use super::names::{self, item_at, OccKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionKind {
    Local,
    Param,
    Dim,
    Function,
    Kernel,
    Builtin,
    Const,
    Module,
    Type,
    Keyword,
    Decorator,
    Option,
    Field,
    Method,
    Variable,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub label: String,
    pub kind: CompletionKind,
    pub detail: Option<String>,
    pub doc: Option<String>,
    /// Text to insert when it differs from the label (`grid=`).
    pub insert: Option<String>,
}

fn item(label: &str, kind: CompletionKind, detail: Option<String>) -> Completion {
    Completion {
        label: label.to_string(),
        kind,
        detail,
        doc: None,
        insert: None,
    }
}

const KEYWORDS: &[&str] = &[
    "def", "return", "if", "elif", "else", "for", "in", "while", "break", "continue", "pass",
    "import", "from", "as", "and", "or", "not", "const", "True", "False", "None",
];

/// Options of `@kernel(...)` and `@autotune(...)`.
const KERNEL_OPTIONS: &[(&str, &str)] = &[
    ("grid", "grid=(programs along axis 0, ...): the launch grid"),
    ("num_warps", "num_warps=4: warps per program (block)"),
    (
        "num_stages",
        "num_stages=2: software-pipeline depth of loads feeding `dot`",
    ),
];
const AUTOTUNE_OPTIONS: &[(&str, &str)] = &[
    (
        "space",
        "space={\"BM\": [64, 128], ...}: the values to search",
    ),
    (
        "key",
        "key=[\"M\", \"N\"]: dims whose values select a tuned configuration",
    ),
];

/// Methods and fields of tiles and tensors.
const MEMBERS: &[(&str, CompletionKind, &str)] = &[
    (
        "to",
        CompletionKind::Method,
        "to(dtype): the value converted to `dtype`",
    ),
    (
        "T",
        CompletionKind::Field,
        "T: the transpose (last two axes)",
    ),
    (
        "shape",
        CompletionKind::Field,
        "shape: the dims, as a tuple",
    ),
    ("dtype", CompletionKind::Field, "dtype: the element type"),
];

/// The identifier chain just before `offset` and the partial word: `la.sof|` →
/// (`["la"]`, `"sof"`).
fn chain_before(text: &str) -> (Vec<String>, String, bool) {
    let bytes = text.as_bytes();
    let mut i = bytes.len();
    while i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
        i -= 1;
    }
    let word = text[i..].to_string();
    let mut parts = Vec::new();
    let mut dotted = false;
    while i > 0 && bytes[i - 1] == b'.' {
        dotted = true;
        let end = i - 1;
        let mut s = end;
        while s > 0 && (bytes[s - 1].is_ascii_alphanumeric() || bytes[s - 1] == b'_') {
            s -= 1;
        }
        parts.insert(0, text[s..end].to_string());
        i = s;
    }
    (parts, word, dotted)
}

/// The open call (or decorator) the cursor is inside on this item: the text
/// before its `(`, the index of the argument being written and its `name=` if any.
pub struct OpenCall {
    pub callee: String,
    pub arg_index: usize,
    pub keyword: Option<String>,
}

/// Scans back from the end of `before` to the innermost unclosed `(`.
pub fn open_call(before: &str) -> Option<OpenCall> {
    let bytes = before.as_bytes();
    let mut depth = 0i32;
    let mut commas = 0;
    let mut i = bytes.len();
    let mut in_str: Option<u8> = None;
    let mut arg_start = bytes.len();
    while i > 0 {
        i -= 1;
        let c = bytes[i];
        if let Some(q) = in_str {
            if c == q {
                in_str = None;
            }
            continue;
        }
        match c {
            b'"' | b'\'' => in_str = Some(c),
            b')' | b']' | b'}' => depth += 1,
            b'(' | b'[' | b'{' if depth > 0 => depth -= 1,
            b'(' if depth == 0 => {
                // The callee: a dotted name, possibly after a launch grid `k[g]`.
                let mut e = i;
                if e > 0 && bytes[e - 1] == b']' {
                    let mut d = 0;
                    while e > 0 {
                        e -= 1;
                        match bytes[e] {
                            b']' => d += 1,
                            b'[' => {
                                d -= 1;
                                if d == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                    }
                }
                let mut s = e;
                while s > 0
                    && (bytes[s - 1].is_ascii_alphanumeric()
                        || bytes[s - 1] == b'_'
                        || bytes[s - 1] == b'.'
                        || bytes[s - 1] == b'@')
                {
                    s -= 1;
                }
                let callee = before[s..e].to_string();
                if callee.is_empty() {
                    return None;
                }
                let arg = &before[arg_start.min(before.len())..];
                let keyword = arg.split_once('=').and_then(|(k, rest)| {
                    let k = k.trim();
                    (!rest.starts_with('=')
                        && !k.is_empty()
                        && k.chars().all(|c| c.is_alphanumeric() || c == '_'))
                    .then(|| k.to_string())
                });
                return Some(OpenCall {
                    callee,
                    arg_index: commas,
                    keyword,
                });
            }
            b'[' | b'{' => return None,
            b',' if depth == 0 => {
                if commas == 0 {
                    arg_start = i + 1;
                }
                commas += 1;
            }
            // Lines inside an open bracket continue; a blank line stops the scan.
            b'\n' | b'\r' if depth == 0 => {
                // the break ending the line before this one (a `\r\n` is one)
                let end = i - usize::from(bytes[i] == b'\n' && i > 0 && bytes[i - 1] == b'\r');
                if end > 0 && crate::syntax::lines::is_break_byte(bytes[end - 1]) {
                    return None;
                }
            }
            _ => {}
        }
    }
    None
}

fn scope_entry(name: &str, e: &Entry) -> Completion {
    match e {
        Entry::Const { ty, value } => item(
            name,
            CompletionKind::Const,
            Some(match value {
                Some(v) => format!("const {name}: {ty} = {v}"),
                None => format!("const {name}: {ty}"),
            }),
        ),
        Entry::Function(sig) => item(
            name,
            if sig.is_kernel {
                CompletionKind::Kernel
            } else {
                CompletionKind::Function
            },
            Some(sig.rendered.clone()),
        ),
        Entry::Module(_) | Entry::Namespace(_) => {
            item(name, CompletionKind::Module, Some("module".into()))
        }
        Entry::Global(ty, _) => item(name, CompletionKind::Variable, Some(ty.to_string())),
        Entry::Broken => item(name, CompletionKind::Module, None),
    }
}

fn builtin_completion(b: &builtins::BuiltinInfo) -> Completion {
    Completion {
        label: b.name.to_string(),
        kind: CompletionKind::Builtin,
        detail: Some(b.doc.split(':').next().unwrap_or(b.doc).trim().to_string()),
        doc: Some(b.doc.to_string()),
        insert: None,
    }
}

/// Completions at `offset`.
pub fn completions(
    db: &dyn Db,
    file: SourceFile,
    options: Options,
    offset: u32,
) -> Vec<Completion> {
    let text = file.text(db);
    let offset = (offset as usize).min(text.len());
    let before = &text[..offset];
    let line = &before[crate::syntax::lines::line_start(before, before.len())..];
    let trimmed = line.trim_start();
    // `@ker|`
    if trimmed.starts_with('@')
        && trimmed[1..]
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_')
    {
        return ["kernel", "autotune"]
            .iter()
            .map(|d| item(d, CompletionKind::Decorator, Some(format!("@{d}"))))
            .collect();
    }
    // `import std.|`, `from st|`
    let words: Vec<&str> = trimmed.split_whitespace().collect();
    let ends_in_space = line.ends_with(char::is_whitespace);
    let in_module_path = matches!(words.as_slice(), ["import"] | ["from"]) && ends_in_space
        || matches!(words.as_slice(), ["import", _] | ["from", _]) && !ends_in_space;
    if in_module_path {
        return module_names(db, file);
    }
    // `from std.nn import so|`
    if words.first() == Some(&"from") && words.get(2) == Some(&"import") {
        let path: Vec<String> = words[1].split('.').map(String::from).collect();
        return match db.resolve_module(file, &path) {
            Some(m) => module_exports(db, m)
                .entries
                .iter()
                .map(|(n, e)| scope_entry(n, e))
                .collect(),
            None => Vec::new(),
        };
    }
    // Inside `@kernel(` / `@autotune(`: their options.
    if let Some(call) = open_call(before) {
        let opts = match call.callee.as_str() {
            "@kernel" => Some(KERNEL_OPTIONS),
            "@autotune" => Some(AUTOTUNE_OPTIONS),
            _ => None,
        };
        if let (Some(opts), None) = (opts, &call.keyword) {
            return opts
                .iter()
                .map(|(n, doc)| Completion {
                    label: format!("{n}="),
                    kind: CompletionKind::Option,
                    detail: Some(doc.to_string()),
                    doc: None,
                    insert: Some(format!("{n}=")),
                })
                .collect();
        }
    }
    let (chain, _word, dotted) = chain_before(before);
    let scope = module_scope(db, file);
    if dotted {
        return members(db, file, scope, &chain);
    }
    let mut out = Vec::new();
    // Locals of the enclosing function, with their types where known.
    if let Some((src, start)) = item_at(db, file, offset as u32)
        .or_else(|| item_at(db, file, (offset as u32).saturating_sub(1)))
    {
        let occs = names::item_occurrences(db, src);
        let checked = check_item(db, src, options);
        let rel = offset as u32 - start;
        for (name, kind, span) in names::locals(&occs) {
            if kind == OccKind::Assign && span.start >= rel {
                continue;
            }
            let ty = checked
                .types
                .iter()
                .find(|(s, _)| *s == span)
                .map(|(_, t)| t.clone());
            let kind = match kind {
                OccKind::Param => CompletionKind::Param,
                OccKind::Dim => CompletionKind::Dim,
                _ => CompletionKind::Local,
            };
            let detail = match kind {
                CompletionKind::Dim => Some("dim (i32)".to_string()),
                _ => ty,
            };
            out.push(item(&name, kind, detail));
        }
    }
    for (name, e) in &scope.entries {
        if !out.iter().any(|c| c.label == *name) {
            out.push(scope_entry(name, e));
        }
    }
    for b in builtins::BUILTINS {
        if !out.iter().any(|c| c.label == b.name) {
            out.push(builtin_completion(b));
        }
    }
    for d in DType::ALL {
        out.push(item(d.name(), CompletionKind::Type, Some("dtype".into())));
    }
    for t in ["Tensor", "Tile"] {
        out.push(item(
            t,
            CompletionKind::Type,
            Some(format!("{t}[dims..., dtype]")),
        ));
    }
    for k in KEYWORDS {
        out.push(item(k, CompletionKind::Keyword, None));
    }
    out
}

/// Module paths to import: the stdlib and `.tsr` files next to this one.
fn module_names(db: &dyn Db, file: SourceFile) -> Vec<Completion> {
    let mut out: Vec<Completion> = crate::stdlib::modules()
        .map(|m| item(m, CompletionKind::Module, Some("stdlib module".into())))
        .collect();
    if let Some(dir) = file.path(db).parent() {
        if let Ok(entries) = std::fs::read_dir(dir) {
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let p = e.path();
                    (p.extension().is_some_and(|x| x == "tsr") && p != *file.path(db))
                        .then(|| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
                        .flatten()
                })
                .collect();
            names.sort();
            out.extend(
                names
                    .iter()
                    .map(|n| item(n, CompletionKind::Module, Some("module".into()))),
            );
        }
    }
    out
}

/// Members after `chain.`: a module's names, else tile and tensor members.
fn members(
    db: &dyn Db,
    file: SourceFile,
    scope: &ModuleScope,
    chain: &[String],
) -> Vec<Completion> {
    let mut entry = chain.first().and_then(|c| scope.get(c));
    for part in chain.iter().skip(1) {
        entry = match entry {
            Some(Entry::Module(m)) => m.get(part),
            Some(Entry::Namespace(ns)) => ns.get(part),
            _ => None,
        };
    }
    match entry {
        Some(Entry::Module(m)) => m.entries.iter().map(|(n, e)| scope_entry(n, e)).collect(),
        Some(Entry::Namespace(ns)) => ns.iter().map(|(n, e)| scope_entry(n, e)).collect(),
        _ => {
            // `std.` with nothing imported yet: the stdlib modules.
            if chain == ["std"] {
                return crate::stdlib::modules()
                    .filter_map(|m| m.strip_prefix("std."))
                    .map(|m| item(m, CompletionKind::Module, Some("stdlib module".into())))
                    .collect();
            }
            let _ = (db, file);
            MEMBERS
                .iter()
                .map(|(n, k, doc)| item(n, *k, Some(doc.to_string())))
                .collect()
        }
    }
}

/// A signature for signature help: its label and each parameter's byte range in it.
#[derive(Clone, Debug, PartialEq)]
pub struct SignatureHelp {
    pub label: String,
    pub params: Vec<(usize, usize)>,
    pub doc: Option<String>,
    pub active: usize,
}

/// A signature's label, parameter ranges, doc and parameter names.
type SigParts = (String, Vec<(usize, usize)>, Option<String>, Vec<String>);

/// Signature help at `offset`: the call being written and its active parameter.
pub fn signature_help(db: &dyn Db, file: SourceFile, offset: u32) -> Option<SignatureHelp> {
    let text = file.text(db);
    let offset = (offset as usize).min(text.len());
    let call = open_call(&text[..offset])?;
    let callee = call.callee.trim_start_matches('@');
    let name = callee.rsplit('.').next().unwrap_or(callee);
    let (label, params, doc, names): SigParts = if callee.ends_with(".to") {
        let label = "to(dtype)".to_string();
        (
            label,
            vec![(3, 8)],
            Some("the value converted to `dtype`".into()),
            vec!["dtype".into()],
        )
    } else if let Some(sig) = function_sig(db, file, callee) {
        let mut label = format!("{}(", sig.name);
        let mut ranges = Vec::new();
        for (i, p) in sig.params.iter().enumerate() {
            if i > 0 {
                label.push_str(", ");
            }
            let s = label.len();
            label.push_str(&p.name);
            if p.is_const {
                // `const` alone unless a dtype was written (`const i32`).
                label.push_str(": const");
                if let crate::check::Ty::Scalar { dtype, weak: false } = &p.ty {
                    label.push_str(&format!(" {dtype}"));
                }
            } else if !p.ty.is_err() {
                label.push_str(&format!(": {}", p.ty));
            }
            if let Some(d) = &p.default {
                label.push_str(&format!(" = {d}"));
            } else if p.has_default {
                label.push_str(" = ...");
            }
            ranges.push((s, label.len()));
        }
        label.push(')');
        if let Some(r) = &sig.ret {
            label.push_str(&format!(" -> {r}"));
        }
        (
            label,
            ranges,
            None,
            sig.params.iter().map(|p| p.name.clone()).collect(),
        )
    } else if let Some(b) = builtins::lookup(name).filter(|_| !callee.contains('.')) {
        let mut label = format!("{}(", b.name);
        let mut ranges = Vec::new();
        for (i, p) in b.params.iter().enumerate() {
            if i > 0 {
                label.push_str(", ");
            }
            let s = label.len();
            label.push_str(p);
            if i >= b.required {
                label.push('=');
            }
            ranges.push((s, label.len()));
        }
        if b.variadic {
            label.push_str(", ...");
        }
        label.push(')');
        (
            label,
            ranges,
            Some(b.doc.to_string()),
            b.params.iter().map(|p| p.to_string()).collect(),
        )
    } else {
        return None;
    };
    let active = match &call.keyword {
        Some(k) => names
            .iter()
            .position(|n| n == k || (k == "dim" && n == "axis"))
            .unwrap_or(call.arg_index),
        None => call.arg_index,
    };
    Some(SignatureHelp {
        label,
        params,
        doc,
        active: active.min(names.len().saturating_sub(1)),
    })
}

/// The signature of a user or imported function named by a (dotted) callee.
fn function_sig(
    db: &dyn Db,
    file: SourceFile,
    callee: &str,
) -> Option<std::sync::Arc<crate::check::FnSig>> {
    let scope = module_scope(db, file);
    let mut parts = callee.split('.');
    let mut entry = scope.get(parts.next()?)?;
    for p in parts {
        entry = match entry {
            Entry::Module(m) => m.get(p)?,
            Entry::Namespace(ns) => ns.get(p)?,
            _ => return None,
        };
    }
    match entry {
        Entry::Function(sig) => Some(sig.clone()),
        _ => None,
    }
}
