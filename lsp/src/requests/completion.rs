//! Completion items for the protocol: `tessera::ide::complete` finds the
//! candidates; this module keeps only those valid where the cursor is and
//! gives module paths a replace range.
//!
//! * Builtins by context (`check::builtins::Ctx`): inside a kernel no
//!   whole-tensor or session builtins (E0508, E0725), inside a whole-tensor
//!   function no kernel or session builtins (E0503, E0725), in top-level
//!   statements no kernel builtins (E0503). A kernel cannot call functions or
//!   kernels either (E0508).
//! * In `x.to(|`: the dtypes only.
//! * In `import std.|` / `from std.|`: the dotted path typed so far is
//!   replaced by the module's full name, so clients whose words stop at `.`
//!   do not insert `std.std.nn`.
//!
//! `textDocument/completion` answers with [`items`] on a snapshot.

use tessera::check::builtins::{self, Ctx};
use tessera::db::{Database, Options, SourceFile};
use tessera::ide;
use tessera::ide::complete::{Completion, CompletionKind as K};
use tower_lsp::lsp_types::{
    CompletionItem, CompletionItemKind, CompletionTextEdit, Documentation, MarkupContent,
    MarkupKind, TextEdit,
};

use crate::position::LineIndex;
use tower_lsp::jsonrpc::Result;
use tower_lsp::lsp_types::{CompletionParams, CompletionResponse};

use crate::server::{offset_of, Backend};

/// Where the cursor is, for what may be called there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Kernel,
    Function,
    TopLevel,
}

/// The kind of code around `offset`: top level on an unindented line, else
/// the parsed item when it parses, else its text (a `def` being typed often
/// does not parse yet).
pub fn place(db: &Database, file: SourceFile, offset: u32) -> Place {
    let text = file.text(db);
    let before = &text[..(offset as usize).min(text.len())];
    let line = &before[tessera::syntax::lines::line_start(before, before.len())..];
    if !line.starts_with([' ', '\t']) {
        return Place::TopLevel;
    }
    let parsed = ide::enclosing_function(db, file, offset)
        .or_else(|| ide::enclosing_function(db, file, offset.checked_sub(1)?));
    if let Some((_, is_kernel)) = parsed {
        return if is_kernel {
            Place::Kernel
        } else {
            Place::Function
        };
    }
    let item =
        ide::item_at(db, file, offset).or_else(|| ide::item_at(db, file, offset.checked_sub(1)?));
    let Some((item, _)) = item else {
        return Place::TopLevel;
    };
    let mut kernel = false;
    for line in item.text(db).lines().map(str::trim_start) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with("@kernel") {
            kernel = true;
        } else if line.starts_with("def ") || line.starts_with("def\t") {
            return if kernel {
                Place::Kernel
            } else {
                Place::Function
            };
        } else if !line.starts_with('@') {
            break;
        }
    }
    Place::TopLevel
}

/// Whether a builtin may be called at `place`.
fn builtin_allowed(ctx: Ctx, place: Place) -> bool {
    match place {
        Place::Kernel => matches!(ctx, Ctx::Kernel | Ctx::Both),
        Place::Function => matches!(ctx, Ctx::Tensor | Ctx::Both),
        Place::TopLevel => !matches!(ctx, Ctx::Kernel),
    }
}

/// Keeps the candidates that are valid at `place` (see the module doc).
pub fn filter(items: Vec<Completion>, place: Place) -> Vec<Completion> {
    items
        .into_iter()
        .filter(|c| match c.kind {
            K::Builtin => builtins::lookup(&c.label).is_none_or(|b| builtin_allowed(b.ctx, place)),
            K::Function | K::Kernel => place != Place::Kernel,
            _ => true,
        })
        .collect()
}

/// The completion items at `offset` of `file`.
pub fn items(
    db: &Database,
    options: Options,
    file: SourceFile,
    offset: u32,
) -> Vec<CompletionItem> {
    let text = file.text(db);
    let offset = (offset as usize).min(text.len()) as u32;
    let before = &text[..offset as usize];
    let mut candidates = ide::complete::completions(db, file, options, offset);
    let dotted_call = ide::complete::open_call(before);
    let in_to = dotted_call
        .as_ref()
        .is_some_and(|c| c.callee.ends_with(".to") && c.keyword.is_none() && c.arg_index == 0);
    if in_to {
        candidates.retain(|c| c.kind == K::Type && c.detail.as_deref() == Some("dtype"));
    } else {
        candidates = filter(candidates, place(db, file, offset));
    }
    let ix = LineIndex::new(text);
    let path_edit = module_path_before(before).map(|path| {
        let start = offset - path.len() as u32;
        ix.range(start, offset)
    });
    candidates
        .into_iter()
        .map(|c| {
            let text_edit = match (&path_edit, c.kind) {
                (Some(range), K::Module) => Some(CompletionTextEdit::Edit(TextEdit::new(
                    *range,
                    c.insert.clone().unwrap_or_else(|| c.label.clone()),
                ))),
                _ => None,
            };
            CompletionItem {
                kind: Some(kind(c.kind)),
                detail: c.detail,
                documentation: c.doc.map(|d| {
                    Documentation::MarkupContent(MarkupContent {
                        kind: MarkupKind::Markdown,
                        value: d,
                    })
                }),
                filter_text: text_edit.as_ref().map(|_| c.label.clone()),
                insert_text: if text_edit.is_some() { None } else { c.insert },
                text_edit,
                label: c.label,
                ..Default::default()
            }
        })
        .collect()
}

/// The dotted module path being typed after `import` or `from` (before its
/// `import`), if the cursor is in one: `from std.n|` → `std.n`.
fn module_path_before(before: &str) -> Option<&str> {
    let line = &before[tessera::syntax::lines::line_start(before, before.len())..];
    let rest = line
        .trim_start()
        .strip_prefix("import")
        .or_else(|| line.trim_start().strip_prefix("from"))?;
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let path = rest.trim_start();
    path.chars()
        .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
        .then_some(path)
}

fn kind(k: K) -> CompletionItemKind {
    match k {
        K::Local | K::Variable | K::Param => CompletionItemKind::VARIABLE,
        K::Dim => CompletionItemKind::TYPE_PARAMETER,
        K::Function | K::Kernel | K::Builtin => CompletionItemKind::FUNCTION,
        K::Const => CompletionItemKind::CONSTANT,
        K::Module => CompletionItemKind::MODULE,
        K::Type => CompletionItemKind::TYPE_PARAMETER,
        K::Keyword => CompletionItemKind::KEYWORD,
        K::Decorator => CompletionItemKind::FUNCTION,
        K::Option => CompletionItemKind::PROPERTY,
        K::Field => CompletionItemKind::FIELD,
        K::Method => CompletionItemKind::METHOD,
    }
}

impl Backend {
    pub(crate) async fn handle_completion(
        &self,
        params: CompletionParams,
    ) -> Result<Option<CompletionResponse>> {
        let p = params.text_document_position;
        self.on_snapshot("completion", None, move |s| {
            let Some(file) = s.file(&p.text_document.uri) else {
                return Ok(None);
            };
            let off = offset_of(s, file, p.position);
            Ok(Some(CompletionResponse::Array(items(
                &s.db, s.options, file, off,
            ))))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels_at(text: &str, marker: &str) -> Vec<String> {
        let mut db = Database::new();
        let offset = text.find(marker).unwrap() as u32;
        let file = db.set_source("/t/a.tsr", text.replace(marker, ""));
        let options = db.options();
        items(&db, options, file, offset)
            .into_iter()
            .map(|i| i.label)
            .collect()
    }

    const SRC: &str = "def f(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    y = x\n    $F\n    return y\n\n\n@kernel(grid=(1,), num_warps=4)\ndef k(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    v = load(x[0 : 128])\n    $K\n    store(out[0 : 128], v)\n\n\n$T\n";

    fn at(marker: &str) -> Vec<String> {
        let mut text = SRC.to_string();
        for m in ["$F", "$K", "$T"] {
            if m != marker {
                text = text.replace(m, "pass");
            }
        }
        labels_at(&text, marker)
    }

    #[test]
    fn builtins_follow_where_they_may_be_called() {
        let has = |v: &[String], s: &str| v.iter().any(|l| l == s);
        let kernel = at("$K");
        assert!(has(&kernel, "load") && has(&kernel, "exp") && has(&kernel, "v"));
        for absent in ["print", "len", "load_npy", "matmul", "randn", "f", "k"] {
            assert!(!has(&kernel, absent), "{absent} in a kernel: {kernel:?}");
        }
        let function = at("$F");
        assert!(has(&function, "matmul") && has(&function, "exp") && has(&function, "k"));
        for absent in ["print", "save_npy", "load", "program_id"] {
            assert!(
                !has(&function, absent),
                "{absent} in a function: {function:?}"
            );
        }
        let top = at("$T");
        assert!(has(&top, "print") && has(&top, "load_npy") && has(&top, "f") && has(&top, "k"));
        assert!(!has(&top, "program_id") && !has(&top, "store"));
    }

    #[test]
    fn a_def_that_does_not_parse_is_still_a_kernel() {
        let text = "@kernel(grid=(1,))\ndef k(x: Tensor[\"N\", f32]:\n    v = $\n";
        let labels = labels_at(text, "$");
        assert!(labels.iter().any(|l| l == "load"), "{labels:?}");
        assert!(!labels.iter().any(|l| l == "print"), "{labels:?}");
    }

    #[test]
    fn dtypes_in_to_and_module_paths_replace_what_was_typed() {
        let text = "@kernel(grid=(1,))\ndef k(x: Tensor[\"N\", f32], out: Tensor[\"N\", f16]):\n    v = load(x[0 : 128])\n    store(out[0 : 128], v.to($))\n";
        let labels = labels_at(text, "$");
        assert!(labels.contains(&"f16".to_string()), "{labels:?}");
        assert!(!labels.contains(&"load".to_string()), "{labels:?}");

        let mut db = Database::new();
        let file = db.set_source("/t/b.tsr", "import std.n".into());
        let options = db.options();
        let nn = items(&db, options, file, 12)
            .into_iter()
            .find(|i| i.label == "std.nn")
            .expect("std.nn");
        let Some(CompletionTextEdit::Edit(edit)) = nn.text_edit else {
            panic!("{nn:?}")
        };
        assert_eq!(edit.new_text, "std.nn");
        assert_eq!(
            (edit.range.start.character, edit.range.end.character),
            (7, 12)
        );
        assert_eq!(module_path_before("from std.linalg import g"), None);
        assert_eq!(module_path_before("    x = imported"), None);
    }
}
