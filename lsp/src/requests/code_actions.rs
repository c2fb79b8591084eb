//! Quick fixes for diagnostics whose help line names the fix: "did you mean
//! `x`?" (rename) and "`expr.to(dtype)`" (convert). The help travels in the
//! published diagnostic's `data` (`{"help": ...}`).
//!
//! `textDocument/codeAction` reads only the open document's text and the
//! request's diagnostics (no snapshot), under the same panic guard.

use std::collections::HashMap;

use tower_lsp::lsp_types::{
    CodeAction, CodeActionKind, Diagnostic, Range, TextEdit, Url, WorkspaceEdit,
};

use crate::position::LineIndex;
use tower_lsp::jsonrpc::Result;
use tower_lsp::lsp_types::{
    CodeActionOrCommand, CodeActionParams, CodeActionResponse, MessageType,
};

use crate::server::{caught, Backend};

/// The quick fixes of one diagnostic in the document `uri` with text `text`.
pub fn quick_fixes(uri: &Url, text: &str, d: &Diagnostic) -> Vec<CodeAction> {
    let Some(help) = d
        .data
        .as_ref()
        .and_then(|v| v.get("help"))
        .and_then(|h| h.as_str())
    else {
        return Vec::new();
    };
    let ix = LineIndex::new(text);
    let slice = |r: &Range| {
        let (s, e) = (ix.offset(r.start) as usize, ix.offset(r.end) as usize);
        text.get(s..e.max(s)).unwrap_or("")
    };
    let mut out = Vec::new();
    if let Some(name) = between(help, "did you mean `", "`") {
        let current = slice(&d.range);
        let name = if current.starts_with('@') {
            name.to_string()
        } else {
            name.trim_start_matches('@').to_string()
        };
        if !name.is_empty() && name != current {
            out.push(action(
                uri,
                format!("Replace with `{name}`"),
                d,
                vec![TextEdit::new(d.range, name)],
            ));
        }
    }
    if let Some((expr, dtype)) = to_dtype(help) {
        // The stem before an elided part (`load(...)` → `load(`) locates the
        // expression: the primary range, else a related range in this file.
        let stem = expr
            .find("(...)")
            .or_else(|| expr.find("[...]"))
            .map_or(expr, |i| &expr[..i + 1]);
        let stem = if expr == "(...)" { "" } else { stem };
        let mut candidates = vec![d.range];
        for r in d.related_information.iter().flatten() {
            if r.location.uri == *uri {
                candidates.push(r.location.range);
            }
        }
        let target = candidates
            .iter()
            .find(|r| !stem.is_empty() && slice(r).starts_with(stem))
            .copied()
            .unwrap_or(d.range);
        let current = slice(&target);
        if !current.is_empty() {
            let replacement = if is_atomic(current) {
                format!("{current}.to({dtype})")
            } else {
                format!("({current}).to({dtype})")
            };
            out.push(action(
                uri,
                format!("Convert with `.to({dtype})`"),
                d,
                vec![TextEdit::new(target, replacement)],
            ));
        }
    }
    out
}

fn action(uri: &Url, title: String, d: &Diagnostic, edits: Vec<TextEdit>) -> CodeAction {
    CodeAction {
        title,
        kind: Some(CodeActionKind::QUICKFIX),
        diagnostics: Some(vec![d.clone()]),
        edit: Some(WorkspaceEdit {
            changes: Some(HashMap::from([(uri.clone(), edits)])),
            ..Default::default()
        }),
        is_preferred: Some(true),
        ..Default::default()
    }
}

fn between<'a>(s: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = s.find(open)? + open.len();
    let len = s[start..].find(close)?;
    Some(&s[start..start + len])
}

/// `` `x.to(f32)` `` in a help line → (`x`, `f32`).
fn to_dtype(help: &str) -> Option<(&str, &str)> {
    let mut rest = help;
    while let Some(open) = rest.find('`') {
        let after = &rest[open + 1..];
        let close = after.find('`')?;
        let snippet = &after[..close];
        if let Some(i) = snippet.rfind(".to(") {
            let dtype = snippet[i + 4..].strip_suffix(')')?;
            if !dtype.is_empty() && dtype.chars().all(|c| c.is_alphanumeric()) {
                return Some((&snippet[..i], dtype));
            }
        }
        rest = &after[close + 1..];
    }
    None
}

/// Whether `.to()` can follow the text without parentheses.
fn is_atomic(s: &str) -> bool {
    let mut depth = 0i32;
    for c in s.chars() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            c if depth == 0 && !(c.is_alphanumeric() || c == '_' || c == '.') => return false,
            _ => {}
        }
    }
    true
}

impl Backend {
    pub(crate) async fn handle_code_action(
        &self,
        params: CodeActionParams,
    ) -> Result<Option<CodeActionResponse>> {
        let text = self
            .state
            .docs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&params.text_document.uri)
            .map(|d| d.text.clone());
        let Some(text) = text else {
            return Ok(None);
        };
        let uri = params.text_document.uri;
        // No snapshot needed (the text and the diagnostics are all it reads),
        // but the same guard: a panic is logged and answered, never fatal.
        let (r, log) = caught("codeAction", || {
            Ok(Some(
                params
                    .context
                    .diagnostics
                    .iter()
                    .flat_map(|d| quick_fixes(&uri, &text, d))
                    .map(CodeActionOrCommand::CodeAction)
                    .collect(),
            ))
        });
        if let Some(log) = log {
            self.client.log_message(MessageType::ERROR, log).await;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_lsp::lsp_types::Position;

    fn diag(range: Range, help: &str) -> Diagnostic {
        Diagnostic {
            range,
            data: Some(serde_json::json!({ "help": help })),
            ..Default::default()
        }
    }

    #[test]
    fn did_you_mean_and_to_dtype() {
        let uri = Url::parse("file:///a.tsr").unwrap();
        let text = "x = lod(a)\ny = a + b * 2\n";
        let d = diag(
            Range::new(Position::new(0, 4), Position::new(0, 7)),
            "did you mean `load`?",
        );
        let a = quick_fixes(&uri, text, &d);
        let edits = &a[0].edit.as_ref().unwrap().changes.as_ref().unwrap()[&uri];
        assert_eq!(edits[0].new_text, "load");
        let d = diag(
            Range::new(Position::new(1, 4), Position::new(1, 13)),
            "cast explicitly: `(...).to(f16)`",
        );
        let a = quick_fixes(&uri, text, &d);
        let edits = &a[0].edit.as_ref().unwrap().changes.as_ref().unwrap()[&uri];
        assert_eq!(edits[0].new_text, "(a + b * 2).to(f16)");
        assert_eq!(
            to_dtype("convert it: `load(...).to(f32)`"),
            Some(("load(...)", "f32"))
        );
    }
}
