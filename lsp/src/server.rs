//! The language server: protocol handlers over one salsa database.
//!
//! Concurrency: the database lives behind a mutex. An edit locks it and sets
//! the new text — salsa then cancels every snapshot still computing and waits
//! for them to unwind — and each request or diagnostics run works on its own
//! snapshot (`Database::clone`) on a blocking thread. A snapshot cancelled by a
//! newer edit (at a salsa query, or at a pass's `tessera::cancel::checkpoint`
//! inside a long query) answers `ContentModified`; a panic in a handler is
//! caught, logged and answered with an internal error, and the server keeps
//! serving.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tessera::db::{Database, Options, SourceFile};
use tessera::ide;
use tessera::ir::tile::Specialization;
use tessera::target::Arch;
use tower_lsp::jsonrpc::{Error, ErrorCode, Result};
use tower_lsp::lsp_types::*;
use tower_lsp::{Client, LanguageServer};

use crate::carry::KernelWarnings;
use crate::diagnostics::default_docs_url;
use crate::paths::Paths;
use crate::position::LineIndex;

/// LSP's `ContentModified`: the answer would be about a text that is gone.
const CONTENT_MODIFIED: i64 = -32801;
/// LSP's `RequestFailed`: a valid request the compiler could not satisfy.
pub(crate) const REQUEST_FAILED: i64 = -32803;

pub(crate) struct Doc {
    pub(crate) text: String,
    pub(crate) version: i32,
    pub(crate) path: PathBuf,
    /// The diagnostics last published for it.
    pub(crate) published: Option<Vec<Diagnostic>>,
    /// Its kernels' last resource diagnostics (see `crate::carry`).
    pub(crate) warnings: KernelWarnings,
}

pub(crate) struct State {
    pub(crate) db: Mutex<Database>,
    pub(crate) docs: Mutex<HashMap<Url, Doc>>,
    /// Counts document changes, to run `refresh_others` once edits pause.
    pub(crate) edits: AtomicU64,
    /// `.tsr` files of the workspace folders (database paths).
    pub(crate) workspace: Mutex<Vec<PathBuf>>,
    /// Bad `initializationOptions`, shown once the client is initialized.
    pub(crate) startup_problems: Mutex<Vec<String>>,
    /// True once `initialized` has loaded the workspace files.
    pub(crate) workspace_loaded: tokio::sync::watch::Sender<bool>,
    pub(crate) roots: Mutex<Vec<PathBuf>>,
    /// Options for archs other than the configured one (`tessera/emit` with `arch`).
    pub(crate) options: Mutex<HashMap<Arch, Options>>,
    /// Base URL of `docs/diagnostics.md` for `codeDescription` links.
    pub(crate) docs_url: Mutex<Option<Url>>,
    /// `tessera.defines`: the values of `tsrc report -D NAME=VALUE` that
    /// every estimate (and `tessera/emit` without its own) is made with.
    pub(crate) defines: Mutex<Specialization>,
    pub(crate) paths: Paths,
}

#[derive(Clone)]
pub struct Backend {
    pub(crate) client: Client,
    pub(crate) state: Arc<State>,
}

fn internal(message: impl Into<String>) -> Error {
    Error {
        code: ErrorCode::InternalError,
        message: message.into().into(),
        data: None,
    }
}

pub(crate) fn content_modified() -> Error {
    Error {
        code: ErrorCode::ServerError(CONTENT_MODIFIED),
        message: "content modified".into(),
        data: None,
    }
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Runs a handler: a salsa cancellation (a newer edit) becomes
/// `ContentModified`; any other panic an internal error, with a message to log.
pub(crate) fn caught<T>(what: &str, f: impl FnOnce() -> Result<T>) -> (Result<T>, Option<String>) {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => (r, None),
        Err(payload) if payload.downcast_ref::<salsa::Cancelled>().is_some() => {
            (Err(content_modified()), None)
        }
        Err(payload) => {
            let msg = format!("{what}: internal error: {}", panic_message(&*payload));
            (Err(internal(msg.clone())), Some(msg))
        }
    }
}

/// What a handler running on a snapshot sees.
pub struct Snapshot {
    pub db: Database,
    pub options: Options,
    /// `tessera.defines` when the snapshot was taken.
    pub spec: Specialization,
    pub(crate) paths: Arc<State>,
}

impl Snapshot {
    pub(crate) fn file(&self, uri: &Url) -> Option<SourceFile> {
        let path = self.paths.paths.db_path(uri)?;
        self.db.file(&path)
    }

    pub(crate) fn uri(&self, file: SourceFile) -> Option<Url> {
        self.paths.paths.uri(file.path(&self.db))
    }

    pub(crate) fn location(&self, loc: ide::Location) -> Option<Location> {
        let uri = self.uri(loc.file)?;
        let ix = LineIndex::new(loc.file.text(&self.db));
        Some(Location::new(uri, ix.range(loc.span.start, loc.span.end)))
    }
}

impl Backend {
    pub fn new(client: Client) -> Self {
        Backend {
            client,
            state: Arc::new(State {
                db: Mutex::new(Database::new()),
                docs: Mutex::new(HashMap::new()),
                edits: AtomicU64::new(0),
                workspace: Mutex::new(Vec::new()),
                startup_problems: Mutex::new(Vec::new()),
                workspace_loaded: tokio::sync::watch::Sender::new(false),
                roots: Mutex::new(Vec::new()),
                options: Mutex::new(HashMap::new()),
                docs_url: Mutex::new(default_docs_url()),
                defines: Mutex::new(Specialization::new()),
                paths: Paths::new(),
            }),
        }
    }

    pub(crate) fn snapshot(&self, arch: Option<Arch>) -> Snapshot {
        let db = self.state.db.lock().unwrap_or_else(|e| e.into_inner());
        let options = match arch {
            Some(a) if a != db.options().arch(&*db) => *self
                .state
                .options
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(a)
                .or_insert_with(|| Options::new(&*db, a, false)),
            _ => db.options(),
        };
        let spec = self
            .state
            .defines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Snapshot {
            db: db.clone(),
            options,
            spec,
            paths: self.state.clone(),
        }
    }

    /// Runs `f` on a snapshot on a blocking thread: cancellation becomes
    /// `ContentModified`, a panic an internal error (logged).
    pub(crate) async fn on_snapshot<T: Send + 'static>(
        &self,
        what: &'static str,
        arch: Option<Arch>,
        f: impl FnOnce(&Snapshot) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let snap = self.snapshot(arch);
        let joined = tokio::task::spawn_blocking(move || {
            // a newer edit stops this at the passes' next checkpoint
            let generation = snap.db.generation();
            let r = caught(what, || tessera::cancel::scope(generation, || f(&snap)));
            drop(snap);
            r
        })
        .await;
        match joined {
            Ok((r, None)) => r,
            Ok((r, Some(log))) => {
                self.client.log_message(MessageType::ERROR, log).await;
                r
            }
            Err(e) => Err(internal(format!("{what}: {e}"))),
        }
    }
}

pub(crate) fn offset_of(s: &Snapshot, file: SourceFile, pos: Position) -> u32 {
    LineIndex::new(file.text(&s.db)).offset(pos)
}

#[tower_lsp::async_trait]
impl LanguageServer for Backend {
    async fn initialize(&self, params: InitializeParams) -> Result<InitializeResult> {
        self.handle_initialize(params).await
    }

    async fn initialized(&self, params: InitializedParams) {
        self.handle_initialized(params).await
    }

    async fn shutdown(&self) -> Result<()> {
        Ok(())
    }

    async fn did_open(&self, params: DidOpenTextDocumentParams) {
        self.handle_did_open(params).await
    }

    async fn did_change(&self, params: DidChangeTextDocumentParams) {
        self.handle_did_change(params).await
    }

    async fn did_close(&self, params: DidCloseTextDocumentParams) {
        self.handle_did_close(params).await
    }

    async fn did_change_watched_files(&self, params: DidChangeWatchedFilesParams) {
        self.handle_did_change_watched_files(params).await
    }

    async fn did_change_configuration(&self, params: DidChangeConfigurationParams) {
        self.handle_did_change_configuration(params).await
    }

    async fn hover(&self, params: HoverParams) -> Result<Option<Hover>> {
        self.handle_hover(params).await
    }

    async fn goto_definition(
        &self,
        params: GotoDefinitionParams,
    ) -> Result<Option<GotoDefinitionResponse>> {
        self.handle_goto_definition(params).await
    }

    async fn references(&self, params: ReferenceParams) -> Result<Option<Vec<Location>>> {
        self.handle_references(params).await
    }

    async fn inlay_hint(&self, params: InlayHintParams) -> Result<Option<Vec<InlayHint>>> {
        self.handle_inlay_hint(params).await
    }

    async fn completion(&self, params: CompletionParams) -> Result<Option<CompletionResponse>> {
        self.handle_completion(params).await
    }

    async fn signature_help(&self, params: SignatureHelpParams) -> Result<Option<SignatureHelp>> {
        self.handle_signature_help(params).await
    }

    async fn document_symbol(
        &self,
        params: DocumentSymbolParams,
    ) -> Result<Option<DocumentSymbolResponse>> {
        self.handle_document_symbol(params).await
    }

    async fn semantic_tokens_full(
        &self,
        params: SemanticTokensParams,
    ) -> Result<Option<SemanticTokensResult>> {
        self.handle_semantic_tokens_full(params).await
    }

    async fn code_action(&self, params: CodeActionParams) -> Result<Option<CodeActionResponse>> {
        self.handle_code_action(params).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_and_cancellation_become_errors() {
        let (r, log) = caught("hover", || -> Result<()> { panic!("boom") });
        let e = r.unwrap_err();
        assert_eq!(e.code, ErrorCode::InternalError);
        assert!(e.message.contains("boom") && log.unwrap().contains("hover"));
        let (r, log) = caught("hover", || -> Result<()> {
            std::panic::resume_unwind(Box::new(salsa::Cancelled::PendingWrite))
        });
        assert_eq!(
            r.unwrap_err().code,
            ErrorCode::ServerError(CONTENT_MODIFIED)
        );
        assert!(log.is_none());
        let (r, _) = caught("hover", || Ok(7));
        assert_eq!(r.unwrap(), 7);
    }
}
