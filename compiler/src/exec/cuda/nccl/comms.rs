//! NCCL communicators: one set per ordered set of GPU contexts, kept, and
//! aborted when a context is gone or broken.

use super::*;

/// One rank's `ncclComm_t`, aborted when dropped.
pub(super) struct RawComm {
    pub(super) comm: Comm,
    pub(super) lib: &'static Nccl,
}

// SAFETY: an NCCL communicator may be used from any thread, one at a time
// (every use is under `COMMS`'s lock).
unsafe impl Send for RawComm {}

impl Drop for RawComm {
    fn drop(&mut self) {
        // SAFETY: `comm` came from `ncclCommInitAll` and is aborted once;
        // aborting also stops what it may still be running (a failed
        // group). The result is not needed: the communicator is gone.
        let _ = unsafe { (self.lib.comm_abort)(self.comm) };
    }
}

/// The communicators of one ordered set of GPU contexts.
pub(super) struct CommSet {
    pub(super) owners: Vec<u64>,
    pub(super) gpus: Vec<Weak<Gpu>>,
    pub(super) comms: Vec<RawComm>,
}

impl CommSet {
    /// Its GPUs are all alive and usable.
    pub(super) fn usable(&self) -> bool {
        self.gpus
            .iter()
            .all(|g| g.upgrade().is_some_and(|g| !g.is_broken()))
    }
}

/// Every communicator set made so far (held while a collective is issued:
/// NCCL's groups are per thread, and one collective at a time uses them).
pub(super) static COMMS: Mutex<Vec<CommSet>> = Mutex::new(Vec::new());

/// How many communicator sets were made (for tests).
pub(super) static COMM_INITS: AtomicU64 = AtomicU64::new(0);

/// Puts back the thread's current context when dropped: NCCL makes the
/// devices' primary contexts current as it works.
pub(super) struct KeepCurrent(Option<cu::CUcontext>);

impl KeepCurrent {
    pub(super) fn new() -> KeepCurrent {
        KeepCurrent(cudarc::driver::result::ctx::get_current().ok().flatten())
    }
}

impl Drop for KeepCurrent {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            // SAFETY: `c` was current on this thread when saved (so it was
            // alive then) and is alive now: a context is destroyed only
            // when its `Gpu` drops (a primary one when its last holder lets
            // go), and nothing between the save and this drops a `Gpu`
            // (the callers hold theirs, the collective its own clones).
            let _ = unsafe { cudarc::driver::result::ctx::set_current(c) };
        }
    }
}

/// The index in `cache` of the communicators of `gpus` (in rank order),
/// made when there are none.
pub(super) fn comms_for(
    lib: &'static Nccl,
    cache: &mut Vec<CommSet>,
    gpus: &[Arc<Gpu>],
    what: &str,
) -> Result<usize, ExecError> {
    cache.retain(CommSet::usable);
    let owners: Vec<u64> = gpus.iter().map(|g| g.owner()).collect();
    if let Some(i) = cache.iter().position(|c| c.owners == owners) {
        return Ok(i);
    }
    let ordinals: Vec<c_int> = gpus.iter().map(|g| g.info.ordinal as c_int).collect();
    let mut raw: Vec<Comm> = vec![std::ptr::null_mut(); gpus.len()];
    let _current = KeepCurrent::new();
    // SAFETY: `raw` has room for one communicator per device of `ordinals`
    // (distinct, existing GPUs: checked by the caller); NCCL fills it.
    let res =
        unsafe { (lib.comm_init_all)(raw.as_mut_ptr(), gpus.len() as c_int, ordinals.as_ptr()) };
    if res != 0 {
        return Err(nccl_error(
            lib,
            &format!("making NCCL's communicators for {what}"),
            res,
        ));
    }
    COMM_INITS.fetch_add(1, Ordering::Relaxed);
    cache.push(CommSet {
        owners,
        gpus: gpus.iter().map(Arc::downgrade).collect(),
        comms: raw.into_iter().map(|comm| RawComm { comm, lib }).collect(),
    });
    Ok(cache.len() - 1)
}
