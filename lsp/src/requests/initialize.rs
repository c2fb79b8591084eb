//! `initialize`: applies `initializationOptions` (bad settings are kept to be
//! shown at `initialized`, never fatal), records the workspace roots and
//! answers the server's capabilities.

use std::path::PathBuf;

use tessera::target::Arch;
use tower_lsp::jsonrpc::Result;
use tower_lsp::lsp_types::*;

use crate::requests::semantic_tokens::legend;
use crate::server::Backend;

impl Backend {
    pub(crate) async fn handle_initialize(
        &self,
        params: InitializeParams,
    ) -> Result<InitializeResult> {
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
}
