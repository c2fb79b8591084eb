//! Device memory: a caching allocator in the manner of PyTorch's. Freed
//! blocks go to per-size free lists and the next allocation of that size
//! takes one, so a loop of launches that makes same-shaped tensors calls
//! `cuMemAlloc` only in its first round. Sizes are rounded up (to 512 bytes,
//! and to 2 MiB from 1 MiB on) so that nearby sizes share blocks. When the
//! driver is out of memory, the cached blocks are freed and the allocation
//! is tried once more.
//!
//! Every block belongs to one context (the pool's `owner`) and holds its
//! pool weakly: tensors do not keep a context alive. When the context goes
//! (the session let go of its GPU, or a sticky error made it replace the
//! context), its memory goes with it, and a block that outlives it is
//! forgotten when dropped; reading it is an error.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use cudarc::driver::sys::{self, CUdeviceptr, CUresult};
use cudarc::driver::{result, CudaContext, CudaStream, DriverError};

use super::driver_error;
use crate::exec::tensor::DeviceBuffer;
use crate::exec::ExecError;

/// What the allocator has done, for `:device` and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Blocks the driver allocated (`cuMemAlloc`).
    pub driver_allocs: u64,
    /// Allocations served from a cached block.
    pub reuses: u64,
    /// Bytes in blocks tensors hold.
    pub bytes_in_use: u64,
    /// Bytes in freed blocks kept for reuse.
    pub bytes_cached: u64,
    /// The most `bytes_in_use` has been.
    pub peak_bytes_in_use: u64,
}

/// A context's device memory.
pub(crate) struct Pool {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    owner: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Free blocks by their (rounded) size.
    free: BTreeMap<usize, Vec<CUdeviceptr>>,
    stats: MemoryStats,
    /// The context died: blocks are not freed or reused.
    dead: bool,
}

/// The size of the block that holds `bytes` (at least 1: the driver
/// refuses empty allocations).
pub(crate) fn block_size(bytes: usize) -> Option<usize> {
    const SMALL: usize = 512;
    const LARGE: usize = 2 << 20;
    let unit = if bytes < (1 << 20) { SMALL } else { LARGE };
    bytes.max(1).checked_next_multiple_of(unit)
}

impl Pool {
    pub(crate) fn new(ctx: Arc<CudaContext>, stream: Arc<CudaStream>, owner: u64) -> Arc<Pool> {
        Arc::new(Pool {
            ctx,
            stream,
            owner,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        self.state().stats
    }

    /// The context died: nothing of it is freed or reused from now on.
    pub(crate) fn mark_dead(&self) {
        let mut s = self.state();
        s.dead = true;
        s.free.clear();
        s.stats.bytes_cached = 0;
    }

    /// A block of at least `bytes` bytes (contents undefined).
    pub(crate) fn alloc(
        self: &Arc<Self>,
        bytes: usize,
    ) -> Result<Box<dyn DeviceBuffer>, ExecError> {
        let size = block_size(bytes).ok_or_else(|| {
            ExecError::new("E0713", format!("{bytes} bytes cannot be allocated"))
                .with_help("use smaller shapes")
        })?;
        let mut s = self.state();
        let cached = s.free.get_mut(&size).and_then(Vec::pop);
        let ptr = match cached {
            Some(p) => {
                s.stats.reuses += 1;
                s.stats.bytes_cached -= size as u64;
                p
            }
            None => {
                let what = || format!("allocating {bytes} bytes");
                let p = match self.driver_alloc(size) {
                    Err(e) if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                        // Give the cached blocks back and try once more.
                        self.release_cached(&mut s);
                        self.driver_alloc(size)
                    }
                    other => other,
                }
                .map_err(|e| driver_error(&what(), e))?;
                s.stats.driver_allocs += 1;
                p
            }
        };
        s.stats.bytes_in_use += size as u64;
        s.stats.peak_bytes_in_use = s.stats.peak_bytes_in_use.max(s.stats.bytes_in_use);
        Ok(Box::new(Block {
            pool: Arc::downgrade(self),
            owner: self.owner,
            ptr,
            len: bytes,
            size,
        }))
    }

    fn driver_alloc(&self, size: usize) -> Result<CUdeviceptr, DriverError> {
        self.ctx.bind_to_thread()?;
        // SAFETY: the context is current on this thread; the block is
        // written before it is read (see `Storage::device_address`).
        unsafe { result::malloc_sync(size) }
    }

    /// Frees every cached block.
    fn release_cached(&self, s: &mut State) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        for (_, ptrs) in std::mem::take(&mut s.free) {
            for p in ptrs {
                // SAFETY: `p` came from `malloc_sync` on this context and is
                // in no other list nor held by a block.
                let _ = unsafe { result::free_sync(p) };
            }
        }
        s.stats.bytes_cached = 0;
    }

    /// Frees the cached blocks (`:device` after a large computation).
    pub(crate) fn empty_cache(&self) {
        let mut s = self.state();
        if !s.dead {
            self.release_cached(&mut s);
        }
    }

    /// E0730 for a block of a context that died (its address may belong
    /// to the fresh context's memory now).
    fn check_alive(&self) -> Result<(), ExecError> {
        if self.state().dead {
            return Err(lost());
        }
        Ok(())
    }

    fn give_back(&self, ptr: CUdeviceptr, size: usize) {
        let mut s = self.state();
        s.stats.bytes_in_use -= size as u64;
        if s.dead {
            return;
        }
        s.stats.bytes_cached += size as u64;
        s.free.entry(size).or_default().push(ptr);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !s.dead {
            self.release_cached(&mut s);
        }
    }
}

/// A block of device memory holding a tensor's elements.
struct Block {
    pool: Weak<Pool>,
    owner: u64,
    ptr: CUdeviceptr,
    /// The tensor's bytes (the block may be larger).
    len: usize,
    size: usize,
}

impl Block {
    /// Runs `op` on the pool's stream with its context current (nothing
    /// for an empty block); a driver error is E0730 about `what`.
    fn on_stream(
        &self,
        what: &str,
        op: impl FnOnce(sys::CUstream) -> Result<(), DriverError>,
    ) -> Result<(), ExecError> {
        let pool = self.pool.upgrade().ok_or_else(lost)?;
        pool.check_alive()?;
        if self.len == 0 {
            return Ok(());
        }
        pool.ctx
            .bind_to_thread()
            .and_then(|()| op(pool.stream.cu_stream()))
            .map_err(|e| driver_error(what, e))
    }
}

/// E0730 for a block whose context is gone (its address may belong to a
/// fresh context's memory now).
fn lost() -> ExecError {
    ExecError::new(
        "E0730",
        "this tensor's GPU memory was lost with its context",
    )
    .with_help("compute it again")
}

impl DeviceBuffer for Block {
    fn read(&self, host: &mut [u8]) -> Result<(), ExecError> {
        debug_assert_eq!(host.len(), self.len);
        let what = format!("copying {} bytes from the GPU", self.len);
        // SAFETY: the block holds at least `len` bytes on this context and
        // `host` is `len` bytes the caller lends exclusively; the stream is
        // synchronised before `host` is given back.
        self.on_stream(&what, |s| unsafe {
            result::memcpy_dtoh_async(host, self.ptr, s)
                .and_then(|()| result::stream::synchronize(s))
        })
    }

    fn write(&self, host: &[u8]) -> Result<(), ExecError> {
        debug_assert_eq!(host.len(), self.len);
        let what = format!("copying {} bytes to the GPU", self.len);
        // SAFETY: as in `read`; the copy finishes before `host` is given back
        // (pageable host memory, and the stream is synchronised).
        self.on_stream(&what, |s| unsafe {
            result::memcpy_htod_async(self.ptr, host, s)
                .and_then(|()| result::stream::synchronize(s))
        })
    }

    fn zero(&self) -> Result<(), ExecError> {
        // SAFETY: the block holds at least `len` bytes on this context; the
        // stream orders the memset before every later launch and copy.
        self.on_stream("zeroing GPU memory", |s| unsafe {
            result::memset_d8_async(self.ptr, 0, self.len, s)
        })
    }

    fn copy_from_device(&self, src: &dyn DeviceBuffer) -> Result<(), ExecError> {
        let what = format!("copying {} bytes between GPUs", self.len);
        // This stream is not ordered after the other GPU's (a collective
        // may still be writing the source there).
        src.settle()?;
        // SAFETY: both blocks hold `len` bytes (the caller's tensor's) and are
        // alive for the call; with unified addressing (every 64-bit CUDA
        // platform) a device-to-device copy may name another GPU's memory.
        // The source's writers have finished (settled above), and this
        // stream is synchronised before the block is used.
        self.on_stream(&what, |s| unsafe {
            result::memcpy_dtod_async(self.ptr, src.address(), self.len, s)
                .and_then(|()| result::stream::synchronize(s))
        })
    }

    fn address(&self) -> u64 {
        self.ptr
    }

    fn settle(&self) -> Result<(), ExecError> {
        // The compute stream: a collective's result is waited for there
        // (see `nccl::Pending::join`).
        // SAFETY: the stream belongs to the block's context, made current
        // by `on_stream`; synchronising only waits.
        self.on_stream("waiting for the GPU's work", |s| unsafe {
            result::stream::synchronize(s)
        })
    }

    fn owner(&self) -> u64 {
        self.owner
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(self.ptr, self.size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::block_size;

    #[test]
    fn block_sizes_round_up() {
        assert_eq!(block_size(0), Some(512));
        assert_eq!(block_size(1), Some(512));
        assert_eq!(block_size(512), Some(512));
        assert_eq!(block_size(513), Some(1024));
        assert_eq!(block_size((1 << 20) - 1), Some(1 << 20));
        assert_eq!(block_size(1 << 20), Some(2 << 20));
        assert_eq!(block_size((2 << 20) + 1), Some(4 << 20));
        assert_eq!(block_size(usize::MAX), None);
    }
}
