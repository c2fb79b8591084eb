//! Hover: `tessera::ide::hover`, plus the type of the call when the cursor is
//! on the name of a called builtin or function, and the options of `@kernel`
//! and `@autotune` (described as completion describes them).
//!
//! On a callee's name `ide::hover` describes the callee (signature, doc); what
//! the call returns here — `matmul(q, k.T)` is `Tensor[B, H, S, S, bf16]` —
//! is the hover of the call expression, found at its closing parenthesis.
//!
//! `textDocument/hover` answers it on a snapshot, as Markdown.

use tessera::db::{Database, Options, SourceFile};
use tessera::ide::{self, Hover};
use tessera::ir::tile::Specialization;
use tower_lsp::jsonrpc::Result;
use tower_lsp::lsp_types::{self as lsp, HoverContents, HoverParams, MarkupContent, MarkupKind};

use crate::position::LineIndex;
use crate::server::{offset_of, Backend};

/// The byte offset of the `)` closing the call whose `(` is at `open`.
fn closing_paren(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote = None;
    for (i, c) in text[open..].char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return (c == ')').then_some(open + i);
                }
            }
            (None, '#') => return None,
            _ => {}
        }
    }
    None
}

/// A decorator option under the cursor (`num_warps` in `@kernel(num_warps=4)`):
/// the text completion offers for it.
fn decorator_option(
    db: &Database,
    file: SourceFile,
    options: Options,
    offset: u32,
) -> Option<Hover> {
    let text = file.text(db);
    let offset = (offset as usize).min(text.len());
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let start = text[..offset]
        .char_indices()
        .rev()
        .take_while(|(_, c)| is_word(*c))
        .last()
        .map_or(offset, |(i, _)| i);
    let end = offset
        + text[offset..]
            .find(|c: char| !is_word(c))
            .unwrap_or(text.len() - offset);
    let word = &text[start..end];
    if word.is_empty() || !text[end..].trim_start().starts_with('=') {
        return None;
    }
    let call = ide::complete::open_call(&text[..start])?;
    if !matches!(call.callee.as_str(), "@kernel" | "@autotune") {
        return None;
    }
    let label = format!("{word}=");
    let doc = ide::complete::completions(db, file, options, start as u32)
        .into_iter()
        .find(|c| c.label == label)?
        .detail?;
    Some(Hover {
        span: tessera::syntax::span::Span::new(start as u32, end as u32),
        markdown: format!("```tsr\n{}({label}...)\n```\n\n{doc}", call.callee),
    })
}

/// The hover at `offset`, with the call's type when it is on a callee.
pub fn hover(
    db: &Database,
    file: SourceFile,
    options: Options,
    spec: &Specialization,
    offset: u32,
) -> Option<Hover> {
    let Some(mut h) = ide::hover(db, file, options, spec, offset) else {
        return decorator_option(db, file, options, offset);
    };
    let text = file.text(db);
    let after = h.span.end as usize;
    if text[after..].starts_with('(') {
        if let Some(close) = closing_paren(text, after) {
            let call = ide::hover(db, file, options, spec, close as u32);
            if let Some(call) =
                call.filter(|c| c.span.end as usize == close + 1 && c.span.start <= h.span.start)
            {
                if let Some(ty) = call
                    .markdown
                    .strip_prefix("```tsr\n")
                    .and_then(|t| t.strip_suffix("\n```"))
                {
                    let mut shown = text[call.span.start as usize..=close]
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ");
                    if shown.chars().count() > 60 {
                        shown = format!("{}(…)", &text[call.span.start as usize..after]);
                    }
                    h.markdown
                        .push_str(&format!("\n\n---\n\nThis call: `{shown}` → `{ty}`"));
                }
            }
        }
    }
    Some(h)
}

impl Backend {
    pub(crate) async fn handle_hover(&self, params: HoverParams) -> Result<Option<lsp::Hover>> {
        let p = params.text_document_position_params;
        self.on_snapshot("hover", None, move |s| {
            let Some(file) = s.file(&p.text_document.uri) else {
                return Ok(None);
            };
            let off = offset_of(s, file, p.position);
            let Some(h) = hover(&s.db, file, s.options, &s.spec, off) else {
                return Ok(None);
            };
            let ix = LineIndex::new(file.text(&s.db));
            Ok(Some(lsp::Hover {
                contents: HoverContents::Markup(MarkupContent {
                    kind: MarkupKind::Markdown,
                    value: h.markdown,
                }),
                range: Some(ix.range(h.span.start, h.span.end)),
            }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callee_shows_what_its_call_returns() {
        let text = "def attention(q: Tensor[\"S\", \"D\", f32], k: Tensor[\"S\", \"D\", f32]) -> Tensor[\"S\", \"S\", f32]:\n    return softmax(matmul(q, transpose(k, -2, -1)), dim=-1)\n";
        let mut db = Database::new();
        let file = db.set_source("/t/hover.tsr", text.to_string());
        let options = db.options();
        let spec = Specialization::new();
        let at = |needle: &str| text.find(needle).unwrap() as u32 + 1;
        let md = hover(&db, file, options, &spec, at("matmul"))
            .unwrap()
            .markdown;
        assert!(md.contains("batched matrix product"), "{md}");
        assert!(
            md.contains("This call: `matmul(q, transpose(k, -2, -1))` → `Tensor[S, S, f32]`"),
            "{md}"
        );
        let md = hover(&db, file, options, &spec, at("transpose"))
            .unwrap()
            .markdown;
        assert!(md.contains("→ `Tensor[D, S, f32]`"), "{md}");
        // Not on a callee: as `ide::hover` says.
        let md = hover(&db, file, options, &spec, at("q, t") - 1)
            .unwrap()
            .markdown;
        assert!(!md.contains("This call"), "{md}");
        let long = "def f(a: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return maximum(a * 2.0 + a * 3.0 + a * 4.0 + a * 5.0 + a * 6.0 + a, 0.0)\n";
        let file = db.set_source("/t/long.tsr", long.to_string());
        let md = hover(
            &db,
            file,
            options,
            &spec,
            long.find("maximum").unwrap() as u32,
        )
        .unwrap()
        .markdown;
        assert!(
            md.contains("This call: `maximum(…)` → `Tensor[N, f32]`"),
            "{md}"
        );
        assert_eq!(closing_paren("f(a, \")\", g(b)) + 1", 1), Some(14));

        let kernel = "@kernel(grid=(cdiv(N, 256),), num_warps=4, num_stages=2)\ndef k(x: Tensor[\"N\", f32]):\n    pass\n";
        let file = db.set_source("/t/deco.tsr", kernel.to_string());
        let h = hover(
            &db,
            file,
            options,
            &spec,
            kernel.find("num_warps").unwrap() as u32 + 3,
        )
        .unwrap();
        assert!(h.markdown.contains("warps per program"), "{}", h.markdown);
        assert_eq!(
            &kernel[h.span.start as usize..h.span.end as usize],
            "num_warps"
        );
        let h = hover(
            &db,
            file,
            options,
            &spec,
            kernel.find("num_stages").unwrap() as u32,
        )
        .unwrap();
        assert!(h.markdown.contains("software-pipeline"), "{}", h.markdown);
        assert_eq!(closing_paren("f(a, # x\n", 1), None);
    }
}
