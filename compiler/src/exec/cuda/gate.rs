//! The launch gate: a word of page-locked host memory that the stream waits
//! on (`cuStreamWaitValue32`) before each launch's start event, released by
//! the host once the kernel and its end event are queued.
//!
//! Without it, the events around a launch on an idle stream time the host's
//! submission too: the start event is stamped as soon as it is queued, and
//! the kernel only starts once `cuLaunchKernel` has returned, microseconds
//! later (about 4 of the 6-7 us `:time` showed for a 16-element `vadd` on an
//! H200; peers timed back to back hide it). Held
//! until everything is queued, the stream runs the start event, the kernel
//! and the end event without a gap, so the events bracket the kernel alone
//! (nvbench's blocking kernel does the same with a spinning kernel).

use std::sync::atomic::{fence, Ordering};

use cudarc::driver::sys::{self, CUdeviceptr, CUresult, CUstream, CUstreamWaitValue_flags};
use cudarc::driver::{result, DriverError};

/// The gate's word: its host address (written by the host) and the device
/// address the stream waits on. Each hold waits for a new value (`epoch`), so
/// a release is one store and never has to be undone.
pub(super) struct Gate {
    host: *mut u32,
    device: CUdeviceptr,
    epoch: u32,
    /// Cleared when the driver refuses the wait: launches go ungated.
    usable: bool,
}

// SAFETY: `host` is page-locked memory owned by the gate alone (allocated in
// `new`, freed in `drop`); it is only written through `&mut self` or by a
// `Held` that borrows the gate mutably, so moving the gate to another thread
// or sharing `&Gate` (which reads nothing through the pointer) is sound.
unsafe impl Send for Gate {}
// SAFETY: see `Send`: `&Gate` gives no access to the word.
unsafe impl Sync for Gate {}

impl Gate {
    /// A gate in the current context (the caller binds it), or the driver's
    /// error where it cannot make one (no page-locked memory, no mapping).
    pub(super) fn new() -> Result<Gate, DriverError> {
        // SAFETY: allocates 4 bytes of page-locked, device-mapped host memory
        // in the current context; the pointer is checked before use and
        // freed once, in `drop`.
        let host = unsafe { result::malloc_host(4, sys::CU_MEMHOSTALLOC_DEVICEMAP) }? as *mut u32;
        // SAFETY: `host` is the 4-byte, 4-aligned (page-aligned) allocation above.
        unsafe { host.write_volatile(0) };
        let mut device: CUdeviceptr = 0;
        // SAFETY: `host` was allocated with CU_MEMHOSTALLOC_DEVICEMAP, so it
        // has a device address; the flags argument must be 0.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) };
        let gate = Gate {
            host,
            device,
            epoch: 0,
            usable: true,
        };
        match r {
            CUresult::CUDA_SUCCESS => Ok(gate),
            e => Err(DriverError(e)), // `gate` drops: the memory is freed
        }
    }

    /// Holds `stream` at this point until the returned guard is dropped:
    /// work queued after this call waits for it. `None` where the driver
    /// refuses the wait (no stream memory operations): then, and at every
    /// later launch, the events time without a gate.
    pub(super) fn hold(&mut self, stream: CUstream) -> Option<Held<'_>> {
        if !self.usable {
            return None;
        }
        let next = self.epoch.wrapping_add(1);
        // SAFETY: `stream` is a live stream of the current context and
        // `device` the device address of this gate's word, which outlives
        // the wait: the guard releases it before the gate can be dropped.
        // GEQ compares as a signed difference, so the epoch may wrap.
        let r = unsafe {
            sys::cuStreamWaitValue32_v2(
                stream,
                self.device,
                next,
                CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        };
        if r != CUresult::CUDA_SUCCESS {
            self.usable = false;
            return None;
        }
        self.epoch = next;
        Some(Held { gate: self })
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // SAFETY: `host` came from `malloc_host` and is freed once; no wait
        // on it is pending (every `Held` released it). An error (the context
        // already destroyed with the process's end) leaves 4 bytes behind.
        let _ = unsafe { result::free_host(self.host.cast()) };
    }
}

/// The stream held at a gate: dropping it (on every path, errors included)
/// lets the stream go on, so a failed launch never leaves the stream stuck.
pub(super) struct Held<'a> {
    gate: &'a mut Gate,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // SAFETY: `host` is the gate's live page-locked word; the store is
        // volatile and fenced so that it leaves this core for the GPU's
        // polling of the mapped page.
        unsafe { self.gate.host.write_volatile(self.gate.epoch) };
        fence(Ordering::SeqCst);
    }
}
