//! A GPU's collective state: its communication stream, the events that
//! order it after the compute stream, and the collectives' timings.

use super::*;

/// A GPU's communication stream and the timings of its collectives.
#[derive(Default)]
pub(crate) struct PerGpu {
    pub(super) stream: Mutex<Option<Arc<CudaStream>>>,
    /// Events around each collective whose time is not summed yet.
    pub(super) timings: Mutex<Vec<(CudaEvent, Arc<CudaEvent>)>>,
    /// Timing events whose collective was summed, for the next ones
    /// (making and destroying events costs host time at every call).
    pub(super) spare: Mutex<Vec<CudaEvent>>,
    /// Recorded on the compute stream before each collective (the inputs
    /// are ready) for the communication stream to wait on: a wait takes
    /// the event's state when it is queued, so one event serves every call.
    pub(super) ready: Mutex<Option<CudaEvent>>,
    /// The thread that issues this GPU's part of each collective.
    pub(super) issuer: super::issuer::Issuer,
    pub(super) nanos: AtomicU64,
    pub(super) count: AtomicU64,
}

/// The most spare events a GPU keeps.
pub(super) const SPARE_CAP: usize = 16;

/// Beyond this many unsummed timings, the finished ones are summed.
pub(super) const TIMINGS_CAP: usize = 64;

impl PerGpu {
    /// The communication stream of a GPU whose context is `ctx` (made at
    /// the first collective): non-blocking, so that the compute stream (the
    /// context's legacy default stream) does not wait for it, nor it for
    /// the compute stream, but through events.
    pub(super) fn stream(&self, ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>, DriverError> {
        let mut s = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = s.as_ref() {
            return Ok(s.clone());
        }
        let made = ctx.new_stream()?;
        *s = Some(made.clone());
        Ok(made)
    }

    /// A timing event of `stream`'s context: a spare one, or a new one.
    pub(super) fn timing_event(&self, stream: &CudaStream) -> Result<CudaEvent, DriverError> {
        let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match spare {
            Some(e) => Ok(e),
            None => stream
                .context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)),
        }
    }

    /// Makes `comm` wait until the work queued so far on `compute` (the
    /// GPU's compute stream, of the same context) is done.
    pub(super) fn order_after(
        &self,
        comm: &CudaStream,
        compute: &CudaStream,
    ) -> Result<(), DriverError> {
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        if ready.is_none() {
            *ready = Some(
                compute
                    .context()
                    .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?,
            );
        }
        let ready = ready.as_ref().expect("made above");
        ready.record(compute)?;
        comm.wait(ready)
    }

    pub(super) fn note(&self, start: CudaEvent, end: Arc<CudaEvent>) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let long = {
            let mut t = self.timings.lock().unwrap_or_else(|p| p.into_inner());
            t.push((start, end));
            t.len() > TIMINGS_CAP
        };
        if long {
            self.sum(false);
        }
    }

    /// Adds the finished collectives' times (all of them, waiting for the
    /// unfinished, when `wait`); their events become spares.
    pub(super) fn sum(&self, wait: bool) {
        // Reading the events makes their context current.
        let _current = KeepCurrent::new();
        let mut t = self.timings.lock().unwrap_or_else(|p| p.into_inner());
        let mut freed = Vec::new();
        for (start, end) in std::mem::take(&mut *t) {
            if !wait {
                // SAFETY: the event is alive (held here) and was recorded on
                // this GPU's communication stream; querying only reads it.
                let done = unsafe { cudarc::driver::result::event::query(end.cu_event()) };
                if done == Err(DriverError(CUresult::CUDA_ERROR_NOT_READY)) {
                    t.push((start, end));
                    continue;
                }
            }
            // Waits for both events; an error (a broken context) drops the
            // timing and its events: the error surfaces where the results
            // are used.
            if let Ok(ms) = start.elapsed_ms(&end) {
                self.nanos
                    .fetch_add((ms as f64 * 1e6) as u64, Ordering::Relaxed);
                freed.push(start);
                // The end event is spare once no pending collective holds it.
                if let Ok(end) = Arc::try_unwrap(end) {
                    freed.push(end);
                }
            }
        }
        drop(t);
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        for e in freed {
            if spare.len() < SPARE_CAP {
                spare.push(e);
            }
        }
    }

    /// Waits for the collectives still running (the last one's end: they
    /// run in order on the communication stream), without summing their
    /// times: reading two events' elapsed time costs host time that a
    /// caller timing the collective on the host should not count.
    pub(crate) fn wait(&self) {
        let last = {
            let t = self.timings.lock().unwrap_or_else(|p| p.into_inner());
            t.last().map(|(_, end)| end.clone())
        };
        if let Some(end) = last {
            // Synchronizing makes the event's context current.
            let _current = KeepCurrent::new();
            // An error (a broken context) surfaces where the results are
            // used, as in `sum`.
            let _ = end.synchronize();
        }
    }

    /// Waits for the collectives still running and sums their times.
    pub(crate) fn settle(&self) {
        self.sum(true);
    }

    pub(crate) fn time(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}
