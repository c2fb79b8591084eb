//! `textDocument/semanticTokens/full`: `tessera::ide::tokens` encoded as the
//! protocol's relative token stream, one token per line (a string may span
//! lines), with the token types indexed as in [`legend`], which `initialize`
//! announces.

use tessera::ide;
use tower_lsp::jsonrpc::Result;
use tower_lsp::lsp_types::{
    SemanticToken, SemanticTokenModifier, SemanticTokenType, SemanticTokens, SemanticTokensLegend,
    SemanticTokensParams, SemanticTokensResult,
};

use crate::position::LineIndex;
use crate::server::Backend;

impl Backend {
    pub(crate) async fn handle_semantic_tokens_full(
        &self,
        params: SemanticTokensParams,
    ) -> Result<Option<SemanticTokensResult>> {
        self.on_snapshot("semanticTokens", None, move |s| {
            let Some(file) = s.file(&params.text_document.uri) else {
                return Ok(None);
            };
            let text = file.text(&s.db);
            let ix = LineIndex::new(text);
            let mut data = Vec::new();
            let (mut last_line, mut last_col) = (0u32, 0u32);
            for t in ide::tokens::semantic_tokens(&s.db, file) {
                let ty = ide::tokens::TokenType::ALL
                    .iter()
                    .position(|x| *x == t.ty)
                    .unwrap_or(0) as u32;
                let mods = (t.declaration as u32) | ((t.builtin as u32) << 1);
                // One token per line (a string may span lines).
                let mut start = t.span.start as usize;
                let end = t.span.end as usize;
                while start < end {
                    let line_end = text[start..end]
                        .find(['\n', '\r'])
                        .map_or(end, |i| start + i);
                    if line_end > start {
                        let p = ix.position(start as u32);
                        let len = text[start..line_end].encode_utf16().count() as u32;
                        let delta_line = p.line - last_line;
                        let delta_start = if delta_line == 0 {
                            p.character - last_col
                        } else {
                            p.character
                        };
                        data.push(SemanticToken {
                            delta_line,
                            delta_start,
                            length: len,
                            token_type: ty,
                            token_modifiers_bitset: mods,
                        });
                        last_line = p.line;
                        last_col = p.character;
                    }
                    start = line_end + 1;
                }
            }
            Ok(Some(SemanticTokensResult::Tokens(SemanticTokens {
                result_id: None,
                data,
            })))
        })
        .await
    }
}

pub(crate) fn legend() -> SemanticTokensLegend {
    use tessera::ide::tokens::TokenType as T;
    SemanticTokensLegend {
        token_types: T::ALL
            .iter()
            .map(|t| match t {
                T::Keyword => SemanticTokenType::KEYWORD,
                T::Function => SemanticTokenType::FUNCTION,
                T::Parameter => SemanticTokenType::PARAMETER,
                T::Variable => SemanticTokenType::VARIABLE,
                T::TypeParameter => SemanticTokenType::TYPE_PARAMETER,
                T::Type => SemanticTokenType::TYPE,
                T::Namespace => SemanticTokenType::NAMESPACE,
                T::Number => SemanticTokenType::NUMBER,
                T::String => SemanticTokenType::STRING,
                T::Comment => SemanticTokenType::COMMENT,
                T::Operator => SemanticTokenType::OPERATOR,
                T::Decorator => SemanticTokenType::DECORATOR,
            })
            .collect(),
        token_modifiers: vec![
            SemanticTokenModifier::DECLARATION,
            SemanticTokenModifier::DEFAULT_LIBRARY,
        ],
    }
}
