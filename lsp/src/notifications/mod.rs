//! Notification handlers: document sync, the workspace's files on disk and
//! settings, each an inherent method of `Backend` that the `LanguageServer`
//! impl in `server` delegates to.

pub mod configuration;
pub mod document_sync;
pub mod initialized;
pub mod watched_files;
