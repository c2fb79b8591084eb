//! The stack the threads that run compiler queries get.
//!
//! Passes recurse through expressions and blocks, up to
//! `syntax::MAX_DEPTH` levels (enforced right after parsing); this is the stack
//! that depth is sized to. The binaries run their work on such a thread, and
//! the language server gives it to its runtime's threads. A thread only
//! commits the pages it touches, so an idle large stack costs address space,
//! not memory.

/// Stack size for threads that run queries: 256 MiB.
pub const STACK_SIZE: usize = 256 << 20;

/// Runs `f` on a new thread with a `STACK_SIZE` stack and waits for it; a panic
/// in `f` continues on the calling thread. Fails only when the system refuses
/// the thread.
pub fn with_stack<T: Send>(f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    std::thread::scope(|s| {
        let name = std::thread::current()
            .name()
            .unwrap_or("tessera")
            .to_string();
        let handle = std::thread::Builder::new()
            .name(name)
            .stack_size(STACK_SIZE)
            .spawn_scoped(s, f)?;
        match handle.join() {
            Ok(v) => Ok(v),
            Err(payload) => std::panic::resume_unwind(payload),
        }
    })
}
