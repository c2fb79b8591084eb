//! The Tessera language server: tower-lsp over `tessera::db::Database`, the
//! same salsa database `tsrc` uses, so the editor never disagrees with the
//! compiler. `tessera lsp` runs [`run_stdio`].
//!
//! * `server` — the protocol handlers, snapshots, cancellation and panics;
//! * `position` — byte offsets ↔ UTF-16 positions;
//! * `paths` — URIs ↔ database paths, the stdlib's read-only copies;
//! * `emit` — the `tessera/emit` request;
//! * `actions` — quick fixes.
//!
//! The editor queries themselves (hover, definitions, completion, ...) live in
//! `tessera::ide`, over the checker's results.

pub mod actions;
pub mod emit;
pub mod paths;
pub mod position;
pub mod server;

use tokio::io::{AsyncRead, AsyncWrite};
use tower_lsp::{LspService, Server};

/// Serves one client over `input`/`output` until it exits.
pub async fn serve<I, O>(input: I, output: O)
where
    I: AsyncRead + Unpin,
    O: AsyncWrite,
{
    let (service, socket) = LspService::build(server::Backend::new)
        .custom_method("tessera/emit", server::Backend::emit)
        .finish();
    Server::new(input, output, socket).serve(service).await;
}

/// `tessera lsp`: serves over stdin/stdout.
pub fn run_stdio() -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(serve(tokio::io::stdin(), tokio::io::stdout()));
    // Tokio reads stdin on a blocking thread that never returns while the
    // client keeps the pipe open: do not wait for it after `exit`.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    Ok(())
}
