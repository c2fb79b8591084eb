//! `textDocument/references`: every use of the name under the cursor in the
//! workspace's files and the open documents (`tessera::ide::references`);
//! waits for the workspace to be loaded so unopened files are searched too.

use std::path::PathBuf;

use tessera::db::SourceFile;
use tessera::ide;
use tower_lsp::jsonrpc::Result;
use tower_lsp::lsp_types::{Location, ReferenceParams};

use crate::server::{offset_of, Backend};

impl Backend {
    pub(crate) async fn handle_references(
        &self,
        params: ReferenceParams,
    ) -> Result<Option<Vec<Location>>> {
        // References in files not opened yet need the workspace loaded (a
        // client that never sends `initialized` gets the open files after 10 s).
        let mut loaded = self.state.workspace_loaded.subscribe();
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            loaded.wait_for(|done| *done),
        )
        .await;
        let p = params.text_document_position;
        let include_decl = params.context.include_declaration;
        let mut paths: Vec<PathBuf> = self
            .state
            .workspace
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        paths.extend(
            self.state
                .docs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .map(|d| d.path.clone()),
        );
        self.on_snapshot("references", None, move |s| {
            let Some(file) = s.file(&p.text_document.uri) else {
                return Ok(None);
            };
            let off = offset_of(s, file, p.position);
            let files: Vec<SourceFile> = paths.iter().filter_map(|p| s.db.file(p)).collect();
            let def = match ide::definition(&s.db, file, off) {
                Some((_, ide::Target::At(l))) => Some(l),
                _ => None,
            };
            let locs = ide::references(&s.db, file, off, &files);
            Ok(Some(
                locs.into_iter()
                    .filter(|l| include_decl || Some(*l) != def)
                    .filter_map(|l| s.location(l))
                    .collect(),
            ))
        })
        .await
    }
}
