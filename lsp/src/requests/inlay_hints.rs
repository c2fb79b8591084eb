//! `textDocument/inlayHint`: the types and kernel estimates of
//! `tessera::ide::inlay_hints` in the requested range, made with the
//! configured arch and `tessera.defines` (kernel estimates survive errors
//! elsewhere in the file).

use tower_lsp::jsonrpc::Result;
use tower_lsp::lsp_types::{InlayHint, InlayHintKind, InlayHintLabel, InlayHintParams};

use crate::position::LineIndex;
use crate::server::Backend;

impl Backend {
    pub(crate) async fn handle_inlay_hint(
        &self,
        params: InlayHintParams,
    ) -> Result<Option<Vec<InlayHint>>> {
        self.on_snapshot("inlayHint", None, move |s| {
            let Some(file) = s.file(&params.text_document.uri) else {
                return Ok(None);
            };
            let ix = LineIndex::new(file.text(&s.db));
            let from = ix.offset(params.range.start);
            let to = ix.offset(params.range.end);
            let hints = tessera::ide::inlay_hints(&s.db, file, s.options, &s.spec, from, to);
            Ok(Some(
                hints
                    .into_iter()
                    .map(|h| InlayHint {
                        position: ix.position(h.offset),
                        label: InlayHintLabel::String(h.label),
                        kind: h.is_type.then_some(InlayHintKind::TYPE),
                        text_edits: None,
                        tooltip: None,
                        padding_left: Some(!h.is_type),
                        padding_right: None,
                        data: None,
                    })
                    .collect(),
            ))
        })
        .await
    }
}
