//! Document sync: `didOpen`, `didChange` (incremental edits in UTF-16
//! ranges) and `didClose` keep the open documents' text in the state and in
//! the database, then publish diagnostics for the edited document and, once
//! edits pause, for the others.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use tower_lsp::lsp_types::{
    DidChangeTextDocumentParams, DidCloseTextDocumentParams, DidOpenTextDocumentParams, MessageType,
};

use crate::carry::KernelWarnings;
use crate::paths::Paths;
use crate::position::LineIndex;
use crate::server::{panic_message, Backend, Doc};

impl Backend {
    pub(crate) async fn handle_did_open(&self, params: DidOpenTextDocumentParams) {
        let doc = params.text_document;
        let Some(path) = self.state.paths.db_path(&doc.uri) else {
            return;
        };
        // Registered before its text is set: the workspace loader (see
        // `initialized`) skips the open documents, and must not replace an
        // editor's unsaved text with the file on disk.
        self.state
            .docs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                doc.uri.clone(),
                Doc {
                    text: doc.text.clone(),
                    version: doc.version,
                    path: path.clone(),
                    published: None,
                    warnings: KernelWarnings::default(),
                },
            );
        if let Err(e) = self.set_text(&path, doc.text) {
            self.client
                .log_message(MessageType::ERROR, format!("didOpen: {e}"))
                .await;
        }
        self.publish(doc.uri.clone(), doc.version).await;
        self.refresh_others(doc.uri);
    }

    pub(crate) async fn handle_did_change(&self, params: DidChangeTextDocumentParams) {
        let uri = params.text_document.uri;
        let version = params.text_document.version;
        let update = {
            let mut docs = self.state.docs.lock().unwrap_or_else(|e| e.into_inner());
            let Some(doc) = docs.get_mut(&uri) else {
                return;
            };
            for change in params.content_changes {
                match change.range {
                    Some(range) => {
                        let ix = LineIndex::new(&doc.text);
                        let start = ix.offset(range.start) as usize;
                        let end = (ix.offset(range.end) as usize).max(start);
                        doc.text.replace_range(start..end, &change.text);
                    }
                    None => doc.text = change.text,
                }
            }
            doc.version = version;
            (doc.path.clone(), doc.text.clone())
        };
        if let Err(e) = self.set_text(&update.0, update.1) {
            self.client
                .log_message(MessageType::ERROR, format!("didChange: {e}"))
                .await;
        }
        self.publish(uri.clone(), version).await;
        self.refresh_others(uri);
    }

    pub(crate) async fn handle_did_close(&self, params: DidCloseTextDocumentParams) {
        let uri = params.text_document.uri;
        let doc = self
            .state
            .docs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uri);
        if let Some(doc) = doc {
            // The file on disk is what other files import again.
            if let Ok(text) = std::fs::read_to_string(&doc.path) {
                let _ = self.set_text(&doc.path, text);
            }
        }
        self.client
            .publish_diagnostics(uri.clone(), Vec::new(), None)
            .await;
        self.refresh_others(uri);
    }

    /// Sets a document's text in the database (not for stdlib copies).
    pub(crate) fn set_text(&self, path: &Path, text: String) -> std::result::Result<(), String> {
        if Paths::is_stdlib(path) {
            return Ok(());
        }
        let mut db = self.state.db.lock().unwrap_or_else(|e| e.into_inner());
        catch_unwind(AssertUnwindSafe(|| {
            db.set_source(path.to_path_buf(), text);
        }))
        .map_err(|p| panic_message(&*p))
    }
}
