//! The Tessera language server: tower-lsp over `tessera::db::Database`, the
//! same salsa database `tsrc` uses, so the editor never disagrees with the
//! compiler. `tessera lsp` runs [`run_stdio`].
//!
//! * `server` — the state, snapshots, cancellation and panics, and the
//!   `LanguageServer` impl: one line per method, delegating to
//! * `requests` — one file per request (`hover`, `definition`, `references`,
//!   `completion`, `code_actions`, `emit` for `tessera/emit`, ...), and
//! * `notifications` — document sync, watched files, configuration;
//! * `diagnostics` — publishing diagnostics after edits;
//! * `carry` — resource warnings kept across edits of other kernels;
//! * `position` — byte offsets ↔ UTF-16 positions;
//! * `paths` — URIs ↔ database paths, the stdlib's read-only copies;
//! * `framing` — the base protocol's frames; malformed messages are answered
//!   (parse error, invalid request) instead of ending the server.
//!
//! The editor queries themselves (hover, definitions, completion, ...) live in
//! `tessera::ide`, over the checker's results.

pub mod carry;
pub mod diagnostics;
pub mod framing;
pub mod notifications;
pub mod paths;
pub mod position;
pub mod requests;
pub mod server;

use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tower::Service;
use tower_lsp::jsonrpc::Request;
use tower_lsp::{LspService, Server};

/// Serves one client over `input`/`output` until it sends `exit` or closes
/// its end.
pub async fn serve<I, O>(input: I, output: O)
where
    I: AsyncRead + Unpin,
    O: AsyncWrite + Unpin,
{
    let (service, socket) = LspService::build(server::Backend::new)
        .custom_method("tessera/emit", server::Backend::emit)
        .finish();
    let exited = Arc::new(Notify::new());
    let service = ExitWatch {
        inner: service,
        exited: exited.clone(),
    };
    // tower-lsp talks to `framing` through in-memory pipes: `framing` reads
    // the client's frames (answering malformed ones itself) and writes
    // every message to the client.
    let (to_server, server_in) = tokio::io::duplex(1 << 16);
    let (server_out, from_server) = tokio::io::duplex(1 << 16);
    let (messages, outgoing) = tokio::sync::mpsc::unbounded_channel();
    let all = async {
        tokio::join!(
            Server::new(server_in, server_out, socket).serve(service),
            framing::read_input(input, to_server, messages.clone()),
            framing::pump_output(from_server, messages),
            framing::write_output(output, outgoing),
        )
    };
    // tower-lsp's loop only ends at the end of the input (or at the next
    // message after `exit`); the protocol asks the server to exit at `exit`.
    tokio::select! {
        _ = all => {}
        _ = exited.notified() => {}
    }
}

/// Passes requests through and signals when the client sends `exit`.
struct ExitWatch<S> {
    inner: S,
    exited: Arc<Notify>,
}

impl<S: Service<Request>> Service<Request> for ExitWatch<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let exit = req.method() == "exit";
        let fut = self.inner.call(req);
        if exit {
            self.exited.notify_one();
        }
        fut
    }
}

/// `tessera lsp`: serves over stdin/stdout.
pub fn run_stdio() -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // handlers and diagnostics runs (on blocking threads) recurse as deep
        // as the nesting limit allows
        .thread_stack_size(tessera::stack::STACK_SIZE)
        .enable_all()
        .build()?;
    runtime.block_on(serve(tokio::io::stdin(), tokio::io::stdout()));
    // Tokio reads stdin on a blocking thread that never returns while the
    // client keeps the pipe open: do not wait for it after `exit`.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    Ok(())
}
