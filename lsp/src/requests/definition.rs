//! `textDocument/definition`: where the name under the cursor is defined
//! (`tessera::ide::definition`), read from a snapshot.

use tessera::ide;
use tower_lsp::jsonrpc::Result;
use tower_lsp::lsp_types::{GotoDefinitionParams, GotoDefinitionResponse};

use crate::server::{offset_of, Backend};

impl Backend {
    pub(crate) async fn handle_goto_definition(
        &self,
        params: GotoDefinitionParams,
    ) -> Result<Option<GotoDefinitionResponse>> {
        let p = params.text_document_position_params;
        self.on_snapshot("definition", None, move |s| {
            let Some(file) = s.file(&p.text_document.uri) else {
                return Ok(None);
            };
            let off = offset_of(s, file, p.position);
            Ok(match ide::definition(&s.db, file, off) {
                Some((_, ide::Target::At(loc))) => {
                    s.location(loc).map(GotoDefinitionResponse::Scalar)
                }
                _ => None,
            })
        })
        .await
    }
}
