//! `workspace/didChangeWatchedFiles`: a `.tsr` file changed on disk that is
//! not open is read again (and kept in the workspace list), so its importers
//! see the new text.

use std::path::PathBuf;

use tower_lsp::lsp_types::{DidChangeWatchedFilesParams, FileChangeType, MessageType};

use crate::paths::Paths;
use crate::server::Backend;

impl Backend {
    /// Files changed on disk (the VS Code extension watches `**/*.tsr`): a
    /// file that is not open is read again, so its importers see the new text.
    pub(crate) async fn handle_did_change_watched_files(
        &self,
        params: DidChangeWatchedFilesParams,
    ) {
        let open: Vec<PathBuf> = self
            .state
            .docs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|d| d.path.clone())
            .collect();
        let mut reloaded = None;
        for change in params.changes {
            let Some(path) = self.state.paths.db_path(&change.uri) else {
                continue;
            };
            if Paths::is_stdlib(&path)
                || open.contains(&path)
                || path.extension().is_none_or(|x| x != "tsr")
            {
                continue;
            }
            let text = if change.typ == FileChangeType::DELETED {
                None
            } else {
                std::fs::read_to_string(&path).ok()
            };
            {
                let mut workspace = self
                    .state
                    .workspace
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                workspace.retain(|p| *p != path);
                if text.is_some() {
                    workspace.push(path.clone());
                }
            }
            // A deleted file: the database cannot forget it, so importers
            // keep its last text.
            let Some(text) = text else {
                continue;
            };
            if let Err(e) = self.set_text(&path, text) {
                self.client
                    .log_message(MessageType::ERROR, format!("didChangeWatchedFiles: {e}"))
                    .await;
            }
            reloaded = Some(change.uri);
        }
        if let Some(uri) = reloaded {
            self.refresh_others(uri);
        }
    }
}
