//! Request handlers, one file per request, each an inherent method of
//! `Backend` that the `LanguageServer` impl in `server` delegates to. A
//! handler reads a snapshot (`Backend::on_snapshot`), so a newer edit answers
//! `ContentModified` and a panic an internal error.

pub mod code_actions;
pub mod completion;
pub mod definition;
pub mod document_symbols;
pub mod emit;
pub mod hover;
pub mod initialize;
pub mod inlay_hints;
pub mod references;
pub mod semantic_tokens;
pub mod signature_help;
