//! Cancelling long computations when their input changes.
//!
//! The language server computes on snapshots of the database (clones) while
//! edits arrive. Salsa cancels a snapshot only when it next enters a query, and
//! a write waits for every snapshot to finish; one long query (checking or
//! lowering a large kernel) would hold up the edit and every request behind it.
//! So each `Database` carries a `Generation`: every write to the database
//! advances it, and a computation running in `scope` of a snapshot's
//! generation unwinds with `salsa::Cancelled` at its next `checkpoint` once a
//! write has happened — the same unwinding salsa uses, which the server answers
//! with `ContentModified`. Passes call `checkpoint` once per statement,
//! expression or instruction; outside a `scope` (the command-line tools, the
//! REPL) it does nothing.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The number of writes to a database (shared by its clones), and the one a
/// handle was taken at.
#[derive(Clone, Debug, Default)]
pub struct Generation {
    writes: Arc<AtomicU64>,
    seen: u64,
}

impl Generation {
    /// Records a write: computations on older handles are now stale.
    pub fn advance(&mut self) {
        self.seen = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
    }

    /// Whether a write happened since this handle was taken.
    pub fn is_stale(&self) -> bool {
        self.writes.load(Ordering::Relaxed) != self.seen
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Generation>> = const { RefCell::new(None) };
}

/// Runs `f` with `generation` as this thread's: `checkpoint`s in `f` unwind
/// once it is stale.
pub fn scope<R>(generation: Generation, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Generation>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = previous);
        }
    }
    let previous = CURRENT.with(|c| c.borrow_mut().replace(generation));
    let _restore = Restore(previous);
    f()
}

/// Unwinds with `salsa::Cancelled` if this thread computes for a database
/// handle that a write has made stale.
pub fn checkpoint() {
    let stale = CURRENT.with(|c| c.borrow().as_ref().is_some_and(Generation::is_stale));
    if stale {
        std::panic::resume_unwind(Box::new(salsa::Cancelled::PendingWrite));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_cancels_computations_on_older_handles_only() {
        let mut main = Generation::default();
        let snapshot = main.clone();
        // no scope: nothing to cancel
        checkpoint();
        scope(snapshot.clone(), checkpoint);
        main.advance();
        let unwound = std::panic::catch_unwind(|| scope(snapshot, checkpoint));
        let payload = unwound.expect_err("a stale handle unwinds");
        assert!(payload.downcast_ref::<salsa::Cancelled>().is_some());
        // the scope was left on unwinding; a fresh handle computes on
        checkpoint();
        scope(main.clone(), checkpoint);
    }
}
