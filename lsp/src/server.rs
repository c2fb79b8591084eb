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
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value as Json;
use tessera::db::{Database, Options, SourceFile};
use tessera::ide;
use tessera::ir::tile::Specialization;
use tessera::target::Arch;
use tower_lsp::jsonrpc::{Error, ErrorCode, Result};
use tower_lsp::lsp_types::*;
use tower_lsp::{Client, LanguageServer};

use crate::carry::KernelWarnings;
use crate::emit::{EmitFailure, EmitParams, EmitResult};
use crate::paths::Paths;
use crate::position::LineIndex;

/// LSP's `ContentModified`: the answer would be about a text that is gone.
const CONTENT_MODIFIED: i64 = -32801;
/// LSP's `RequestFailed`: a valid request the compiler could not satisfy.
const REQUEST_FAILED: i64 = -32803;
/// How long the text must stay unchanged before kernels are lowered for
/// their resource diagnostics.
const RESOURCES_DELAY: std::time::Duration = std::time::Duration::from_millis(150);

struct Doc {
    text: String,
    version: i32,
    path: PathBuf,
    /// The diagnostics last published for it.
    published: Option<Vec<Diagnostic>>,
    /// Its kernels' last resource diagnostics (see `crate::carry`).
    warnings: KernelWarnings,
}

/// What one publication of a document's diagnostics holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// The checker's diagnostics (and the resource diagnostics of the
    /// kernels unchanged since the last estimate), published always.
    Checker,
    /// With the kernels' resource diagnostics; published if they differ
    /// from the last publication.
    Estimates,
}

struct State {
    db: Mutex<Database>,
    docs: Mutex<HashMap<Url, Doc>>,
    /// Counts document changes, to run `refresh_others` once edits pause.
    edits: AtomicU64,
    /// `.tsr` files of the workspace folders (database paths).
    workspace: Mutex<Vec<PathBuf>>,
    /// Bad `initializationOptions`, shown once the client is initialized.
    startup_problems: Mutex<Vec<String>>,
    /// True once `initialized` has loaded the workspace files.
    workspace_loaded: tokio::sync::watch::Sender<bool>,
    roots: Mutex<Vec<PathBuf>>,
    /// Options for archs other than the configured one (`tessera/emit` with `arch`).
    options: Mutex<HashMap<Arch, Options>>,
    /// Base URL of `docs/diagnostics.md` for `codeDescription` links.
    docs_url: Mutex<Option<Url>>,
    /// `tessera.defines`: the values of `tsrc report -D NAME=VALUE` that
    /// every estimate (and `tessera/emit` without its own) is made with.
    defines: Mutex<Specialization>,
    paths: Paths,
}

#[derive(Clone)]
pub struct Backend {
    client: Client,
    state: Arc<State>,
}

/// The default `codeDescription` base: `docs/diagnostics.md` of the source
/// tree this binary was built from, when it is still there.
fn default_docs_url() -> Option<Url> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/diagnostics.md");
    let path = path.canonicalize().ok()?;
    Url::from_file_path(path).ok()
}

/// GitHub's anchor of a heading `## E0401: title` (`#e0401-title`).
fn anchor(code: &str) -> String {
    let title = tessera::diag::codes::lookup(code).map_or("", |c| c.title);
    let heading = format!("{code}: {title}").to_lowercase();
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn internal(message: impl Into<String>) -> Error {
    Error {
        code: ErrorCode::InternalError,
        message: message.into().into(),
        data: None,
    }
}

fn content_modified() -> Error {
    Error {
        code: ErrorCode::ServerError(CONTENT_MODIFIED),
        message: "content modified".into(),
        data: None,
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Runs a handler: a salsa cancellation (a newer edit) becomes
/// `ContentModified`; any other panic an internal error, with a message to log.
fn caught<T>(what: &str, f: impl FnOnce() -> Result<T>) -> (Result<T>, Option<String>) {
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
    paths: Arc<State>,
}

impl Snapshot {
    fn file(&self, uri: &Url) -> Option<SourceFile> {
        let path = self.paths.paths.db_path(uri)?;
        self.db.file(&path)
    }

    fn uri(&self, file: SourceFile) -> Option<Url> {
        self.paths.paths.uri(file.path(&self.db))
    }

    fn location(&self, loc: ide::Location) -> Option<Location> {
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

    fn snapshot(&self, arch: Option<Arch>) -> Snapshot {
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
    async fn on_snapshot<T: Send + 'static>(
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

    /// Computes and publishes the diagnostics of `uri` at `version`: the
    /// checker's at once, then — once the text has been still for a moment,
    /// since lowering every kernel costs more than checking — again with the
    /// resource warnings of the kernels (W0003, W0004, E06xx).
    async fn publish(&self, uri: Url, version: i32) {
        if self.publish_once(&uri, version, Pass::Checker).await {
            let this = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(RESOURCES_DELAY).await;
                this.publish_once(&uri, version, Pass::Estimates).await;
            });
        }
    }

    /// After a change to `changed`, the other open documents: one that imports
    /// it (or is imported by it) may have new diagnostics. Once the edits
    /// pause; each is published only if its diagnostics changed.
    /// The open documents and their versions, but `except`.
    fn open_versions(&self, except: Option<&Url>) -> Vec<(Url, i32)> {
        self.state
            .docs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(u, _)| Some(*u) != except)
            .map(|(u, d)| (u.clone(), d.version))
            .collect()
    }

    fn refresh_others(&self, changed: Url) {
        let generation = self.state.edits.fetch_add(1, Ordering::SeqCst) + 1;
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(RESOURCES_DELAY).await;
            if this.state.edits.load(Ordering::SeqCst) != generation {
                return;
            }
            let open = this.open_versions(Some(&changed));
            for (u, v) in open {
                this.publish_once(&u, v, Pass::Estimates).await;
            }
        });
    }

    /// One publication; false when the version is stale or was cancelled.
    async fn publish_once(&self, uri: &Url, version: i32, pass: Pass) -> bool {
        let (carried, expected) = {
            let docs = self.state.docs.lock().unwrap_or_else(|e| e.into_inner());
            match docs.get(uri) {
                Some(d) if d.version == version => (
                    d.warnings.clone(),
                    (!Paths::is_stdlib(&d.path)).then(|| d.text.clone()),
                ),
                _ => return false,
            }
        };
        let u = uri.clone();
        let r = self
            .on_snapshot("diagnostics", None, move |s| {
                let Some(file) = s.file(&u) else {
                    return Ok(None);
                };
                // `didChange` records the version before it sets the text: a
                // snapshot taken in between has the previous text.
                if expected.is_some_and(|t| t != *file.text(&s.db)) {
                    return Err(content_modified());
                }
                let mut diags: Vec<tessera::diag::Diagnostic> = s.db.diagnostics(file).to_vec();
                let arch = s.options.arch(&s.db);
                if pass == Pass::Checker {
                    diags.extend(carried.carried(&s.db, file, arch, &s.spec));
                    return Ok(Some((self_convert(s, &u, file, &diags), None)));
                }
                let (_, extra) = tessera::db::file_resources(&s.db, file, s.options, &s.spec);
                // Only what an estimate says: a kernel that does not lower
                // (say, a const parameter without a default) is not an error
                // of the file.
                let extra: Vec<_> = extra
                    .into_iter()
                    .filter(|d| d.code.starts_with("W000") || d.code.starts_with("E060"))
                    .collect();
                let warnings = KernelWarnings::record(&s.db, file, arch, &s.spec, &extra);
                diags.extend(extra);
                Ok(Some((self_convert(s, &u, file, &diags), Some(warnings))))
            })
            .await;
        match r {
            Ok(Some((diags, warnings))) => {
                {
                    let mut docs = self.state.docs.lock().unwrap_or_else(|e| e.into_inner());
                    let Some(doc) = docs.get_mut(uri).filter(|d| d.version == version) else {
                        return false;
                    };
                    if let Some(w) = warnings {
                        doc.warnings = w;
                    }
                    // The checker's publication is the answer to an edit and
                    // always goes out; the later ones only when they add something.
                    if pass != Pass::Checker && doc.published.as_ref() == Some(&diags) {
                        return true;
                    }
                    doc.published = Some(diags.clone());
                }
                self.client
                    .publish_diagnostics(uri.clone(), diags, Some(version))
                    .await;
                true
            }
            Ok(None) => self.current_version(uri) == Some(version),
            _ => false,
        }
    }

    fn current_version(&self, uri: &Url) -> Option<i32> {
        self.state
            .docs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uri)
            .map(|d| d.version)
    }

    /// Sets a document's text in the database (not for stdlib copies).
    fn set_text(&self, path: &Path, text: String) -> std::result::Result<(), String> {
        if Paths::is_stdlib(path) {
            return Ok(());
        }
        let mut db = self.state.db.lock().unwrap_or_else(|e| e.into_inner());
        catch_unwind(AssertUnwindSafe(|| {
            db.set_source(path.to_path_buf(), text);
        }))
        .map_err(|p| panic_message(&*p))
    }

    async fn set_arch(&self, arch: &str) {
        let parsed: std::result::Result<Arch, _> = arch.parse();
        match parsed {
            Ok(a) => {
                {
                    let mut db = self.state.db.lock().unwrap_or_else(|e| e.into_inner());
                    db.set_arch(a);
                }
                self.republish().await;
            }
            Err(_) => {
                self.client
                    .show_message(
                        MessageType::ERROR,
                        format!(
                            "tessera.arch: unknown arch `{arch}` (one of: {})",
                            Arch::ALL.map(|a| a.name()).join(", ")
                        ),
                    )
                    .await
            }
        }
    }

    /// Re-publishes the diagnostics of every open document and asks the
    /// client to refresh its inlay hints: after a change of arch or defines.
    async fn republish(&self) {
        let open = self.open_versions(None);
        for (u, v) in open {
            self.publish(u, v).await;
        }
        let _ = self.client.inlay_hint_refresh().await;
    }

    /// Applies `docsUrl` and `defines`; returns the `arch` to set, whether the
    /// defines changed, and the errors of bad `defines` entries (those are skipped).
    fn apply_settings(&self, v: &Json) -> Settings {
        if let Some(url) = v.get("docsUrl").and_then(Json::as_str) {
            *self
                .state
                .docs_url
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Url::parse(url).ok();
        }
        let mut out = Settings {
            arch: v.get("arch").and_then(Json::as_str).map(String::from),
            defines_changed: false,
            errors: Vec::new(),
        };
        if let Some(d) = v.get("defines") {
            let (spec, errors) = parse_defines(d);
            out.errors = errors;
            let mut current = self.state.defines.lock().unwrap_or_else(|e| e.into_inner());
            out.defines_changed = *current != spec;
            *current = spec;
        }
        out
    }

    /// Reports the `tessera.defines` names that no kernel of the workspace
    /// has, each as `-D NAME` reports it (the entry still applies: a kernel
    /// added later may have it). Runs once the workspace is loaded.
    async fn check_define_names(&self) {
        if !*self.state.workspace_loaded.borrow() {
            return;
        }
        let mut paths = self
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
        let errors = self
            .on_snapshot("tessera.defines", None, move |s| {
                Ok(unknown_defines(&s.db, &paths, &s.spec))
            })
            .await
            .unwrap_or_default();
        self.report_setting_errors(&errors).await;
    }

    async fn report_setting_errors(&self, errors: &[String]) {
        for e in errors {
            self.client
                .show_message(MessageType::ERROR, format!("tessera.defines: {e}"))
                .await;
        }
    }
}

/// What a settings object asked for.
struct Settings {
    arch: Option<String>,
    defines_changed: bool,
    errors: Vec<String>,
}

/// Each define of `spec` that no kernel of the files at `paths` has, with the
/// message `-D NAME` gets (`tessera::cli::specialization`).
fn unknown_defines(db: &Database, paths: &[PathBuf], spec: &Specialization) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut kernels = Vec::new();
    for p in paths {
        if let Some(f) = db.file(p) {
            if seen.insert(p.clone()) {
                kernels.extend(tessera::db::file_kernels(db, f));
            }
        }
    }
    spec.values
        .iter()
        .filter_map(|(n, v)| {
            let d = [tessera::ir::tile::Define::Value(n.clone(), *v)];
            tessera::cli::specialization_among(db, &kernels, &d, "no kernel in the workspace").err()
        })
        .collect()
}

/// `tessera.defines` (`{"D": 64, "causal": true}`) → the specialization
/// `tsrc report -D D=64 -D causal=True` makes: each entry goes through the
/// parser of `-D`, so names and values mean exactly what they mean there.
/// `null` (a cleared setting) is no defines; bad entries come back as errors.
fn parse_defines(v: &Json) -> (Specialization, Vec<String>) {
    let mut spec = Specialization::new();
    let mut errors = Vec::new();
    let Some(map) = v.as_object() else {
        if !v.is_null() {
            errors.push(format!("expected an object NAME → integer, got `{v}`"));
        }
        return (spec, errors);
    };
    for (name, value) in map {
        let text = match value {
            Json::String(s) => s.clone(),
            Json::Number(_) | Json::Bool(_) => value.to_string(),
            _ => {
                errors.push(format!("`{name}`: `{value}` is not an integer"));
                continue;
            }
        };
        // num_warps and num_stages are held to their ranges here too, so a bad
        // value is one message rather than an error on every kernel.
        let range = |n: &str, x: i64| match n {
            "num_warps" => tessera::target::check_num_warps(x),
            "num_stages" => tessera::target::check_num_stages(x),
            _ => Ok(()),
        };
        match Specialization::parse_define(&format!("{name}={text}")) {
            Ok((n, x)) => match range(&n, x) {
                Ok(()) => {
                    spec.values.insert(n, x);
                }
                Err(e) => errors.push(e),
            },
            Err(e) => errors.push(e),
        }
    }
    (spec, errors)
}

/// Compiler diagnostics → LSP diagnostics of the document `uri`.
fn self_convert(
    s: &Snapshot,
    uri: &Url,
    file: SourceFile,
    diags: &[tessera::diag::Diagnostic],
) -> Vec<Diagnostic> {
    let ix = LineIndex::new(file.text(&s.db));
    let docs = s
        .paths
        .docs_url
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    diags
        .iter()
        .map(|d| {
            let mut message = d.message.clone();
            if !d.primary_label.is_empty() {
                message.push_str(&format!(" ({})", d.primary_label));
            }
            if let Some(h) = &d.help {
                message.push_str(&format!("\nhelp: {h}"));
            }
            let related: Vec<DiagnosticRelatedInformation> = d
                .labels
                .iter()
                .map(|l| DiagnosticRelatedInformation {
                    location: Location::new(uri.clone(), ix.range(l.span.start, l.span.end)),
                    message: l.message.clone(),
                })
                .collect();
            Diagnostic {
                range: ix.range(d.span.start, d.span.end),
                severity: Some(match d.severity {
                    tessera::diag::Severity::Error => DiagnosticSeverity::ERROR,
                    tessera::diag::Severity::Warning => DiagnosticSeverity::WARNING,
                    tessera::diag::Severity::Note => DiagnosticSeverity::INFORMATION,
                }),
                code: Some(NumberOrString::String(d.code.to_string())),
                code_description: docs.as_ref().map(|base| {
                    let mut href = base.clone();
                    href.set_fragment(Some(&anchor(d.code)));
                    CodeDescription { href }
                }),
                source: Some("tessera".into()),
                message,
                related_information: (!related.is_empty()).then_some(related),
                tags: None,
                data: d.help.as_ref().map(|h| serde_json::json!({ "help": h })),
            }
        })
        .collect()
}

fn offset_of(s: &Snapshot, file: SourceFile, pos: Position) -> u32 {
    LineIndex::new(file.text(&s.db)).offset(pos)
}

fn legend() -> SemanticTokensLegend {
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

#[tower_lsp::async_trait]
impl LanguageServer for Backend {
    async fn initialize(&self, params: InitializeParams) -> Result<InitializeResult> {
        // A bad setting does not stop the server (the editor would be left
        // without one): it is skipped, and `initialized` says so.
        if let Some(opts) = &params.initialization_options {
            let settings = self.apply_settings(opts);
            let mut problems: Vec<String> = settings
                .errors
                .iter()
                .map(|e| format!("tessera.defines: {e}"))
                .collect();
            if let Some(arch) = settings.arch {
                match arch.parse::<Arch>() {
                    Ok(a) => self
                        .state
                        .db
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .set_arch(a),
                    Err(_) => problems.push(format!(
                        "tessera.arch: unknown arch `{arch}` (one of: {}); using {}",
                        Arch::ALL.map(|a| a.name()).join(", "),
                        Arch::default().name()
                    )),
                }
            }
            *self
                .state
                .startup_problems
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = problems;
        }
        let mut roots: Vec<PathBuf> = params
            .workspace_folders
            .iter()
            .flatten()
            .filter_map(|f| f.uri.to_file_path().ok())
            .collect();
        #[allow(deprecated)]
        if roots.is_empty() {
            if let Some(p) = params.root_uri.as_ref().and_then(|u| u.to_file_path().ok()) {
                roots.push(p);
            }
        }
        *self.state.roots.lock().unwrap_or_else(|e| e.into_inner()) = roots;
        Ok(InitializeResult {
            server_info: Some(ServerInfo {
                name: "tessera".into(),
                version: Some(env!("CARGO_PKG_VERSION").into()),
            }),
            capabilities: ServerCapabilities {
                position_encoding: Some(PositionEncodingKind::UTF16),
                text_document_sync: Some(TextDocumentSyncCapability::Kind(
                    TextDocumentSyncKind::INCREMENTAL,
                )),
                hover_provider: Some(HoverProviderCapability::Simple(true)),
                definition_provider: Some(OneOf::Left(true)),
                references_provider: Some(OneOf::Left(true)),
                document_symbol_provider: Some(OneOf::Left(true)),
                inlay_hint_provider: Some(OneOf::Left(true)),
                completion_provider: Some(CompletionOptions {
                    trigger_characters: Some(vec![".".into(), "@".into(), " ".into()]),
                    ..Default::default()
                }),
                signature_help_provider: Some(SignatureHelpOptions {
                    trigger_characters: Some(vec!["(".into(), ",".into()]),
                    retrigger_characters: None,
                    work_done_progress_options: Default::default(),
                }),
                code_action_provider: Some(CodeActionProviderCapability::Options(
                    CodeActionOptions {
                        code_action_kinds: Some(vec![CodeActionKind::QUICKFIX]),
                        ..Default::default()
                    },
                )),
                semantic_tokens_provider: Some(
                    SemanticTokensServerCapabilities::SemanticTokensOptions(
                        SemanticTokensOptions {
                            legend: legend(),
                            full: Some(SemanticTokensFullOptions::Bool(true)),
                            range: None,
                            work_done_progress_options: Default::default(),
                        },
                    ),
                ),
                ..Default::default()
            },
        })
    }

    async fn initialized(&self, _: InitializedParams) {
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

    async fn shutdown(&self) -> Result<()> {
        Ok(())
    }

    async fn did_open(&self, params: DidOpenTextDocumentParams) {
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

    async fn did_change(&self, params: DidChangeTextDocumentParams) {
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

    async fn did_close(&self, params: DidCloseTextDocumentParams) {
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

    /// Files changed on disk (the VS Code extension watches `**/*.tsr`): a
    /// file that is not open is read again, so its importers see the new text.
    async fn did_change_watched_files(&self, params: DidChangeWatchedFilesParams) {
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

    async fn did_change_configuration(&self, params: DidChangeConfigurationParams) {
        let settings = params
            .settings
            .get("tessera")
            .cloned()
            .unwrap_or(params.settings);
        let settings = self.apply_settings(&settings);
        self.report_setting_errors(&settings.errors).await;
        if settings.defines_changed {
            self.check_define_names().await;
        }
        match settings.arch {
            // set_arch re-publishes.
            Some(arch) => self.set_arch(&arch).await,
            None if settings.defines_changed => self.republish().await,
            None => {}
        }
    }

    async fn hover(&self, params: HoverParams) -> Result<Option<Hover>> {
        let p = params.text_document_position_params;
        self.on_snapshot("hover", None, move |s| {
            let Some(file) = s.file(&p.text_document.uri) else {
                return Ok(None);
            };
            let off = offset_of(s, file, p.position);
            let Some(h) = crate::hover::hover(&s.db, file, s.options, &s.spec, off) else {
                return Ok(None);
            };
            let ix = LineIndex::new(file.text(&s.db));
            Ok(Some(Hover {
                contents: HoverContents::Markup(MarkupContent {
                    kind: MarkupKind::Markdown,
                    value: h.markdown,
                }),
                range: Some(ix.range(h.span.start, h.span.end)),
            }))
        })
        .await
    }

    async fn goto_definition(
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

    async fn references(&self, params: ReferenceParams) -> Result<Option<Vec<Location>>> {
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

    async fn inlay_hint(&self, params: InlayHintParams) -> Result<Option<Vec<InlayHint>>> {
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

    async fn completion(&self, params: CompletionParams) -> Result<Option<CompletionResponse>> {
        let p = params.text_document_position;
        self.on_snapshot("completion", None, move |s| {
            let Some(file) = s.file(&p.text_document.uri) else {
                return Ok(None);
            };
            let off = offset_of(s, file, p.position);
            Ok(Some(CompletionResponse::Array(crate::complete::items(
                &s.db, s.options, file, off,
            ))))
        })
        .await
    }

    async fn signature_help(&self, params: SignatureHelpParams) -> Result<Option<SignatureHelp>> {
        let p = params.text_document_position_params;
        self.on_snapshot("signatureHelp", None, move |s| {
            let Some(file) = s.file(&p.text_document.uri) else {
                return Ok(None);
            };
            let off = offset_of(s, file, p.position);
            let Some(h) = ide::complete::signature_help(&s.db, file, off) else {
                return Ok(None);
            };
            // Parameter labels as UTF-16 offsets into the label.
            let u16 = |b: usize| h.label[..b].encode_utf16().count() as u32;
            Ok(Some(SignatureHelp {
                signatures: vec![SignatureInformation {
                    label: h.label.clone(),
                    documentation: h.doc.clone().map(Documentation::String),
                    parameters: Some(
                        h.params
                            .iter()
                            .map(|(a, b)| ParameterInformation {
                                label: ParameterLabel::LabelOffsets([u16(*a), u16(*b)]),
                                documentation: None,
                            })
                            .collect(),
                    ),
                    active_parameter: Some(h.active as u32),
                }],
                active_signature: Some(0),
                active_parameter: Some(h.active as u32),
            }))
        })
        .await
    }

    async fn document_symbol(
        &self,
        params: DocumentSymbolParams,
    ) -> Result<Option<DocumentSymbolResponse>> {
        self.on_snapshot("documentSymbol", None, move |s| {
            use tessera::ide::SymbolKind as K;
            let Some(file) = s.file(&params.text_document.uri) else {
                return Ok(None);
            };
            let ix = LineIndex::new(file.text(&s.db));
            #[allow(deprecated)]
            let symbols = ide::document_symbols(&s.db, file, s.options)
                .into_iter()
                .map(|sym| DocumentSymbol {
                    name: sym.name,
                    detail: sym
                        .detail
                        .or_else(|| (sym.kind == K::Kernel).then(|| "kernel".into())),
                    kind: match sym.kind {
                        K::Kernel | K::Function => SymbolKind::FUNCTION,
                        K::Const => SymbolKind::CONSTANT,
                        K::Module => SymbolKind::MODULE,
                        K::Variable => SymbolKind::VARIABLE,
                    },
                    tags: None,
                    deprecated: None,
                    range: ix.range(sym.span.start, sym.span.end),
                    selection_range: ix.range(sym.name_span.start, sym.name_span.end),
                    children: None,
                })
                .collect();
            Ok(Some(DocumentSymbolResponse::Nested(symbols)))
        })
        .await
    }

    async fn semantic_tokens_full(
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

    async fn code_action(&self, params: CodeActionParams) -> Result<Option<CodeActionResponse>> {
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
                    .flat_map(|d| crate::actions::quick_fixes(&uri, &text, d))
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

impl Backend {
    /// `tessera/emit`: see `crate::emit`.
    pub async fn emit(&self, params: EmitParams) -> Result<EmitResult> {
        let arch = match &params.arch {
            Some(a) => Some(a.parse::<Arch>().map_err(|_| {
                Error::invalid_params(format!(
                    "unknown arch `{a}` (one of: {})",
                    Arch::ALL.map(|a| a.name()).join(", ")
                ))
            })?),
            None => None,
        };
        self.on_snapshot("tessera/emit", arch, move |s| {
            let Some(file) = s.file(&params.uri) else {
                return Err(Error::invalid_params(format!(
                    "`{}` is not open or in the workspace",
                    params.uri
                )));
            };
            let offset = params.position.map(|p| offset_of(s, file, p));
            // The request's own defines name something of the kernel, as
            // `tsrc emit -D` checks them (the setting's may be for others).
            if matches!(params.kind.as_str(), "tile-ir" | "target-ir" | "ptx")
                && !params.defines.is_empty()
            {
                let mut kernels = tessera::db::file_kernels(&s.db, file);
                if let Some(k) = &params.kernel {
                    kernels.retain(|x| &x.0 == k);
                }
                let own: Vec<tessera::cli::Define> = params
                    .defines
                    .iter()
                    .map(|(n, v)| tessera::cli::Define::Value(n.clone(), *v))
                    .collect();
                if !kernels.is_empty() {
                    tessera::cli::specialization(&s.db, &kernels, &own)
                        .map_err(Error::invalid_params)?;
                }
            }
            // The setting's defines, under the request's own: a request
            // without any is specialised as every estimate is.
            let mut params = params;
            let mut defines = s.spec.values.clone();
            defines.append(&mut params.defines);
            params.defines = defines;
            match crate::emit::emit(&s.db, s.options, file, &params, offset) {
                Ok(r) => Ok(r),
                Err(EmitFailure::Invalid(m)) => Err(Error::invalid_params(m)),
                Err(EmitFailure::Unsupported(m)) => Err(Error {
                    code: ErrorCode::ServerError(REQUEST_FAILED),
                    message: m.into(),
                    data: None,
                }),
                Err(EmitFailure::Diagnostics(m, diags)) => Err(Error {
                    code: ErrorCode::ServerError(REQUEST_FAILED),
                    message: m.into(),
                    data: Some(
                        serde_json::to_value(self_convert(s, &params.uri, file, &diags))
                            .unwrap_or_default(),
                    ),
                }),
            }
        })
        .await
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

    #[test]
    fn defines_parse_like_dash_d() {
        let (spec, errors) =
            parse_defines(&serde_json::json!({"D": 64, "causal": true, "BM": "0x80"}));
        assert!(errors.is_empty(), "{errors:?}");
        let expected = Specialization::new()
            .with("D", 64)
            .with("causal", 1)
            .with("BM", 128);
        assert_eq!(spec, expected);
        let (spec, errors) = parse_defines(&serde_json::json!({"D": 1.5, "2x": 3, "S": 8}));
        assert_eq!(spec, Specialization::new().with("S", 8));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(parse_defines(&Json::Null), (Specialization::new(), vec![]));
        // Out of range: skipped with a message (`num_warps=0` divided by zero).
        let (spec, errors) =
            parse_defines(&serde_json::json!({"num_warps": 0, "num_stages": 9, "BM": 64}));
        assert_eq!(spec, Specialization::new().with("BM", 64));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].contains("found 0") || errors[1].contains("found 0"),
            "{errors:?}"
        );
        let (spec, errors) = parse_defines(&serde_json::json!({"num_warps": 8, "num_stages": 3}));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            spec,
            Specialization::new()
                .with("num_warps", 8)
                .with("num_stages", 3)
        );
    }

    #[test]
    fn anchors_follow_the_docs_headings() {
        let docs = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/diagnostics.md"
        ))
        .unwrap();
        for code in tessera::diag::codes::CATALOGUE.iter().map(|c| c.code) {
            let heading = docs
                .lines()
                .find(|l| l.starts_with(&format!("## {code}:")))
                .unwrap_or_else(|| panic!("no `## {code}:` heading in docs/diagnostics.md"));
            let title = heading.trim_start_matches("## ");
            let slug: String = title
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect();
            assert_eq!(anchor(code), slug);
        }
    }
}
