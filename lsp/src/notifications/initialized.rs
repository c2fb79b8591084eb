//! `initialized`: shows the startup problems kept by `initialize`, loads the
//! workspace folders' `.tsr` files into the database (skipping open
//! documents, whose editor text wins), then checks `tessera.defines` names.

use std::path::PathBuf;

use tower_lsp::lsp_types::{InitializedParams, MessageType};

use crate::server::Backend;

impl Backend {
    pub(crate) async fn handle_initialized(&self, _: InitializedParams) {
        let problems = std::mem::take(
            &mut *self
                .state
                .startup_problems
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for p in problems {
            self.client.show_message(MessageType::ERROR, p).await;
        }
        // Load the workspace's `.tsr` files so imports and references between them resolve.
        let state = self.state.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let roots = state
                .roots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let mut files = Vec::new();
            for root in roots {
                files.extend(crate::paths::workspace_files(&root));
            }
            let mut db = state.db.lock().unwrap_or_else(|e| e.into_inner());
            let open: Vec<PathBuf> = state
                .docs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .map(|d| d.path.clone())
                .collect();
            for f in &files {
                if !open.contains(f) {
                    let _ = db.load_file(f);
                }
            }
            let n = files.len();
            *state.workspace.lock().unwrap_or_else(|e| e.into_inner()) = files;
            state.workspace_loaded.send_replace(true);
            n
        })
        .await
        .unwrap_or(0);
        self.check_define_names().await;
        self.client
            .log_message(
                MessageType::INFO,
                format!("tessera: loaded {loaded} workspace file(s)"),
            )
            .await;
    }
}
