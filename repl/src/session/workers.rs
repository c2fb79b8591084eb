//! The threads that run a distributed call's devices at once, kept between
//! calls: starting a thread (with the compiler's deep stack) for every device
//! of every call cost more than a small call's work.
//!
//! Worker `i` runs device `i`'s part of each call; a call's jobs all run at
//! once (a collective inside one waits for the others), and the caller waits
//! for every result. A panic in a job is resumed on the caller's thread.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::mpsc;

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
pub(crate) struct Workers {
    senders: Vec<mpsc::Sender<Job>>,
}

impl Workers {
    /// Runs `jobs[i]` on worker `i` (started when first needed) and returns
    /// their results in order; fails only when the system refuses a thread.
    pub(crate) fn run<T: Send + 'static>(
        &mut self,
        jobs: Vec<Box<dyn FnOnce() -> T + Send + 'static>>,
    ) -> std::io::Result<Vec<T>> {
        let n = jobs.len();
        let (tx, rx) = mpsc::channel();
        for (i, job) in jobs.into_iter().enumerate() {
            let tx = tx.clone();
            let wrapped: Job = Box::new(move || {
                let r = catch_unwind(AssertUnwindSafe(job));
                let _ = tx.send((i, r));
            });
            if i >= self.senders.len() {
                self.senders.push(spawn(i)?);
            }
            // A worker whose thread is gone (only a panic outside a job could
            // end it) is started afresh.
            if let Err(mpsc::SendError(back)) = self.senders[i].send(wrapped) {
                self.senders[i] = spawn(i)?;
                self.senders[i].send(back).map_err(|_| {
                    std::io::Error::other("a device's worker thread stopped at once")
                })?;
            }
        }
        drop(tx);
        let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
        for _ in 0..n {
            let (i, r) = rx.recv().expect("every job sends its result");
            match r {
                Ok(v) => out[i] = Some(v),
                Err(payload) => resume_unwind(payload),
            }
        }
        Ok(out
            .into_iter()
            .map(|v| v.expect("a result per job"))
            .collect())
    }
}

/// Worker `i`: runs the jobs it is sent until the session drops its sender.
fn spawn(i: usize) -> std::io::Result<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name(format!("tessera-device-{i}"))
        .stack_size(tessera::stack::STACK_SIZE)
        .spawn(move || {
            while let Ok(job) = rx.recv() {
                job();
            }
        })?;
    Ok(tx)
}
