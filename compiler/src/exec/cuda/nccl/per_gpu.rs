//! A GPU's collective state: its communication stream, the events that
//! order it after the compute stream and time the collectives, and the
//! thread that issues them.

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
    /// The end of the last collective whose time was summed: the next one
    /// may have waited for it (see `sum`).
    pub(super) last_end: Mutex<Option<Arc<CudaEvent>>>,
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
    /// GPU's compute stream, of the same context) is done: `start`, the
    /// collective's timing start, is recorded there and waited for (one
    /// event both orders and times, one driver call fewer per collective).
    pub(super) fn order_after(
        start: &CudaEvent,
        comm: &CudaStream,
        compute: &CudaStream,
    ) -> Result<(), DriverError> {
        start.record(compute)?;
        comm.wait(start)
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
    ///
    /// A collective's time runs from its start (its inputs ready on the
    /// compute stream) to its end, less the part of it spent waiting for the
    /// GPU's previous collective (queued behind it on the communication
    /// stream, and counted there): every moment is counted once.
    pub(super) fn sum(&self, wait: bool) {
        // Reading the events makes their context current.
        let _current = KeepCurrent::new();
        let mut t = self.timings.lock().unwrap_or_else(|p| p.into_inner());
        let mut last = self.last_end.lock().unwrap_or_else(|p| p.into_inner());
        let mut freed = Vec::new();
        let mut timings = std::mem::take(&mut *t).into_iter();
        while let Some((start, end)) = timings.next() {
            if !wait {
                // SAFETY: the event is alive (held here) and was recorded on
                // this GPU's streams; querying only reads it.
                let done = unsafe { cudarc::driver::result::event::query(end.cu_event()) };
                if done == Err(DriverError(CUresult::CUDA_ERROR_NOT_READY)) {
                    // The later ones are queued behind it.
                    t.push((start, end));
                    t.extend(timings);
                    break;
                }
            }
            // Waits for both events; an error (a broken context) drops the
            // timing and its events: the error surfaces where the results
            // are used.
            if let Ok(ms) = start.elapsed_ms(&end) {
                let queued = last
                    .as_ref()
                    .and_then(|prev| start.elapsed_ms(prev).ok())
                    .unwrap_or(0.0)
                    .max(0.0);
                let ms = (ms - queued).max(0.0) as f64;
                self.nanos.fetch_add((ms * 1e6) as u64, Ordering::Relaxed);
                freed.push(start);
                // An end event is spare once no pending collective holds it.
                if let Some(Ok(prev)) = last.replace(end).map(Arc::try_unwrap) {
                    freed.push(prev);
                }
            }
        }
        drop((t, last));
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
