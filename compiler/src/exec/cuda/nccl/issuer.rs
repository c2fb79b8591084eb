//! One thread per GPU that issues that GPU's part of each collective.
//!
//! NCCL lets one thread drive every GPU (a group around all ranks' calls),
//! but then the ranks' host work runs one after another: each rank's
//! enqueue (the stream ordering, the kernel launch, the events) waits for
//! the ranks before it, and the first rank's kernel waits on the GPU for
//! the last one's. On four H100s that serial issue cost a 16 MiB
//! all-reduce half again its time. With a thread per GPU the ranks issue at
//! once, as NCCL's one-process-per-GPU users do.
//!
//! A thread is started at the GPU's first collective and kept: it spins
//! for a short while after each job (the next collective of a loop comes
//! within microseconds, and waking a sleeping thread costs tens of them),
//! then sleeps on its channel. It ends when its GPU is dropped (the
//! channel closes).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A rank's part of a collective, run on its GPU's issuing thread.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// How long a thread (issuing, or waiting for the issuers) spins before it
/// sleeps.
const SPIN: Duration = Duration::from_millis(2);

/// A GPU's issuing thread, started at its first job.
#[derive(Default)]
pub(super) struct Issuer {
    jobs: Mutex<Option<Sender<Job>>>,
}

impl Issuer {
    /// Runs `job` on this GPU's issuing thread (started, or restarted if
    /// it is gone, here). `name` names the thread.
    pub(super) fn run(&self, name: &str, job: Job) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        let job = match jobs.as_ref() {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                // The thread is gone (it should not be: it outlives
                // panics): a new one takes the job.
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (tx, rx) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || serve(rx));
        match spawned {
            Ok(_) => {
                // A fresh channel whose receiver is alive: cannot fail.
                let _ = tx.send(job);
                *jobs = Some(tx);
            }
            // No thread to be had: the caller's thread issues this rank
            // (correct, only not concurrent with the others).
            Err(_) => job(),
        }
    }
}

/// The issuing thread's loop: runs jobs in order until the channel closes.
/// A job that panics is over (its latch token counts down as it unwinds);
/// the thread goes on, so no later job sent to it is lost.
fn serve(rx: Receiver<Job>) {
    let run = |job: Job| {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        Instant::now()
    };
    let mut last = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(job) => last = run(job),
            Err(TryRecvError::Disconnected) => return,
            Err(TryRecvError::Empty) if last.elapsed() < SPIN => std::hint::spin_loop(),
            Err(TryRecvError::Empty) => match rx.recv() {
                Ok(job) => last = run(job),
                Err(_) => return,
            },
        }
    }
}

/// Counts the ranks still issuing; the caller waits for none to be left.
pub(super) struct Latch {
    left: AtomicUsize,
    lock: Mutex<()>,
    zero: Condvar,
}

impl Latch {
    pub(super) fn new(n: usize) -> Arc<Latch> {
        Arc::new(Latch {
            left: AtomicUsize::new(n),
            lock: Mutex::new(()),
            zero: Condvar::new(),
        })
    }

    fn count_down(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Under the lock, so a waiter between its check and its sleep
            // cannot miss the notification.
            let _held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.zero.notify_all();
        }
    }

    /// Returns when every rank has counted down.
    pub(super) fn wait(&self) {
        let start = Instant::now();
        while self.left.load(Ordering::Acquire) > 0 {
            if start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            if self.left.load(Ordering::Acquire) > 0 {
                let _ = self
                    .zero
                    .wait_timeout(held, Duration::from_millis(10))
                    .unwrap_or_else(|p| p.into_inner());
            }
        }
    }

    /// A token that counts down when dropped, so that a job that panics
    /// still lets the caller go on.
    pub(super) fn token(self: &Arc<Latch>) -> CountDown {
        CountDown(self.clone())
    }
}

pub(super) struct CountDown(Arc<Latch>);

impl Drop for CountDown {
    fn drop(&mut self) {
        self.0.count_down();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// Jobs of several issuers run concurrently (each waits for all the
    /// others to start), in order per issuer, and the latch waits for all.
    #[test]
    fn issuers_run_their_jobs_at_once_and_the_latch_waits_for_them() {
        let issuers: Vec<Issuer> = (0..4).map(|_| Issuer::default()).collect();
        for round in 0..50u64 {
            let started = Arc::new(AtomicUsize::new(0));
            let sum = Arc::new(AtomicU64::new(0));
            let latch = Latch::new(issuers.len());
            for (r, issuer) in issuers.iter().enumerate() {
                let (started, sum, token) = (started.clone(), sum.clone(), latch.token());
                issuer.run(
                    "test-issuer",
                    Box::new(move || {
                        let _token = token;
                        started.fetch_add(1, Ordering::SeqCst);
                        // Would never end if the ranks ran one after another.
                        while started.load(Ordering::SeqCst) < 4 {
                            std::thread::yield_now();
                        }
                        sum.fetch_add(round * 10 + r as u64, Ordering::SeqCst);
                    }),
                );
            }
            latch.wait();
            assert_eq!(sum.load(Ordering::SeqCst), 4 * round * 10 + 6);
        }
    }

    /// A job that panics is over: the latch still opens, and the thread
    /// runs the next jobs.
    #[test]
    fn a_panicking_job_leaves_the_issuer_usable() {
        let issuer = Issuer::default();
        let latch = Latch::new(1);
        let token = latch.token();
        issuer.run(
            "test-issuer",
            Box::new(move || {
                let _token = token;
                panic!("a job that fails");
            }),
        );
        latch.wait();
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..20 {
            let latch = Latch::new(1);
            let (token, ran2) = (latch.token(), ran.clone());
            issuer.run(
                "test-issuer",
                Box::new(move || {
                    let _token = token;
                    ran2.fetch_add(1, Ordering::SeqCst);
                }),
            );
            latch.wait();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 20);
    }
}
