//! Collectives over tensors on several GPUs of this process, through NCCL.
//!
//! NCCL (`libnccl.so.2`) is loaded when the first collective over two or
//! more GPUs runs, never at build time: every build and every test runs
//! without it. `TESSERA_NCCL` ([`LIBRARY_ENV`]) names the file to load
//! instead (the `libnccl.so.2` a Python environment ships, say). A missing
//! library, one without NCCL's functions or one older than 2.10 is E0721
//! naming it, never a panic. A collective over one GPU needs no NCCL (it is
//! a copy on that GPU). The library is loaded here (libloading), not by
//! cudarc's NCCL module: cudarc looks for other file names than the
//! soname `libnccl.so.2` that NCCL's runtime packages install, and panics
//! at the first call when it finds none.
//!
//! # The collectives
//!
//! Each takes `parts`: one `(GPU, tensor)` per rank, in rank order, every
//! GPU once. Inputs are never written; each output is a new tensor whose
//! current elements are on its rank's GPU (the host reads them back when it
//! reads the tensor).
//!
//! * [`all_reduce`]: every output is the elementwise reduction of the
//!   inputs (same shape and dtype).
//! * [`all_gather`]: `parts[i]` is shard `i` along `axis` (the shards' sizes
//!   along it may differ, as `numpy.array_split` makes them); every output
//!   is their concatenation along `axis`.
//! * [`reduce_scatter`]: the inputs have one shape; output `i` is block `i`
//!   (`sizes[i]` long along `axis`, the blocks in order) of their
//!   elementwise reduction.
//! * [`broadcast`]: every output is a copy of `parts[src]`'s tensor; the
//!   other tensors only give the shape (and are not copied to their GPU).
//!
//! Reductions ([`ReduceOp`]) are NCCL's: sum, max, min and mean (`ncclAvg`;
//! on integers the sum divided by the rank count, truncated toward zero).
//! The order in which NCCL adds is its own (a ring or a tree), so float
//! sums differ from a sequential sum by rounding. Reductions take f64, f32,
//! f16, bf16, i64, i32, u32, i8 and u8 tensors, bool with max and min (any
//! and all), f8e4m3 and f8e5m2 with NCCL 2.24 or later on GPUs of compute
//! capability 9.0 or later; i16 and the other cases are E0721 ("not
//! supported by NCCL"). Gathers and broadcasts move bytes: every dtype.
//!
//! NCCL's all-gather and reduce-scatter need equal blocks in the leading
//! dimension; they are used when the sizes along `axis` are equal. Uneven
//! sizes use one `ncclBroadcast` (gather) or `ncclReduce` (scatter) per
//! rank, grouped. Along an axis with dims before it (`outer` > 1) the
//! blocks are not contiguous in the whole tensor: they go through a staging
//! buffer in block order, packed (reduce-scatter) on the compute streams
//! before the collective or placed (all-gather) there at the join, with
//! strided copies (`cuMemcpy2DAsync`: `outer` rows, a block's row is its
//! size along `axis` times the dims after it).
//!
//! # Streams, and overlapping a collective with kernels
//!
//! Each GPU gets a communication stream of its own beside the compute
//! stream its kernels and copies use, in the same context: the device's
//! primary one, where NCCL launches its kernels (and where the executor
//! runs so that the two streams' kernels can run at once; a GPU takes turns
//! between contexts). A collective records an event on
//! each compute stream (the inputs are ready), makes the communication
//! stream wait for it, issues NCCL's calls there and records an event after
//! them. Each GPU's part is issued by a thread of its own (`issuer`), all
//! at once, as NCCL's users with a process per GPU do: one thread issuing
//! every GPU's part in turn left the first GPU's kernel waiting for the
//! last one's launch. The caller returns when every part is queued; the
//! host does not wait for the GPUs. A collective over one GPU is a copy on
//! its compute stream.
//!
//! The `*_async` functions return a [`Pending`]: the collective is running
//! and kernels on the compute streams go on meanwhile. [`Pending::join`]
//! makes each compute stream wait for its GPU's part (`cuStreamWaitEvent`,
//! the host still does not wait) and gives the outputs: kernels launched
//! after it see them. So a whole-tensor function can issue a collective,
//! launch the kernels that do not need its result, and join before the
//! first that does. Until `join`, the inputs must not be written (nor moved
//! to another device). A `Pending` dropped without `join` still orders the
//! compute streams after the collective. The plain functions join at once.
//!
//! # Communicators
//!
//! One communicator set per ordered set of GPU contexts ([`Gpu::owner`]),
//! made at the first collective over it (`ncclCommInitAll`: about a second)
//! and kept. A GPU whose context was remade after a sticky error is a new
//! owner, so it gets new communicators; those of contexts that are gone or
//! broken are aborted at the next collective.
//!
//! # Time
//!
//! [`Gpu::collective_time`] is the collectives' summed time on each GPU
//! (events: from the moment the inputs were ready on the compute stream, or
//! the GPU's previous collective ended if that is later, to the end of its
//! part on the communication stream), the sibling of [`Gpu::kernel_time`];
//! [`Gpu::collectives`] counts them.
//!
//! # Errors
//!
//! An NCCL error is E0730 naming the collective, its GPUs and NCCL's name
//! and text for the error (the communicators of that set are aborted and
//! made afresh at the next use); a driver error is E0730 as for launches; a
//! GPU whose context a sticky error broke is E0730 naming it. Arguments that
//! do not fit the collective (shapes, axis, sizes, a GPU twice) are E0707:
//! the callers check them first.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use cudarc::driver::sys::{self as cu, CUevent_flags, CUresult};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError};

use super::Gpu;
use crate::check::DType;
use crate::exec::tensor::DeviceBuffer;
use crate::exec::{ExecError, Interrupt, Tensor};

mod comms;
mod issuer;
mod layouts;
mod library;
mod per_gpu;

use comms::*;
use issuer::Latch;
use layouts::*;
pub use library::version;
use library::*;
pub(crate) use per_gpu::PerGpu;

/// The environment variable naming the NCCL library to load (a path, or a
/// file name the dynamic loader looks for), instead of `libnccl.so.2`.
pub const LIBRARY_ENV: &str = "TESSERA_NCCL";

/// The oldest NCCL with bf16 and `ncclAvg`.
const MIN_VERSION: (u32, u32) = (2, 10);

/// The first NCCL with the f8 types.
const F8_VERSION: (u32, u32) = (2, 24);

/// The reductions: the executor's one enum (`exec::dist`).
pub use crate::exec::dist::ReduceOp;

// ---------------------------------------------------------------------------
// Issuing

/// A collective whose work is on the GPUs' communication streams (see the
/// module docs): [`Pending::join`] orders each GPU's compute stream after
/// it and gives the outputs. Dropped without a join, it still orders them.
#[must_use = "join it to get the outputs (dropping it still orders the GPUs' kernels after it)"]
pub struct Pending {
    ranks: Vec<RankPending>,
}

impl Pending {
    /// Makes each GPU's compute stream wait for the collective's part on
    /// that GPU (the host does not wait) and gives the outputs, one per
    /// rank: kernels and copies on those GPUs from now on see them.
    pub fn join(self) -> Result<Vec<Tensor>, ExecError> {
        // After an error the parts not joined yet order their GPUs as
        // they drop.
        self.ranks.into_iter().map(RankPending::join).collect()
    }

    /// One part per rank, each joined on its own (by the thread that runs
    /// that GPU's work), so that a rank's kernels that do not need the
    /// result run while the collective does.
    pub fn into_ranks(self) -> Vec<RankPending> {
        self.ranks
    }
}

/// What a collective reads and stages, kept until every rank's part is
/// joined. A block of GPU `r` is used only by GPU `r`'s streams, and
/// rank `r`'s join orders GPU `r`'s compute stream after the collective,
/// so once every part is joined no later work on any GPU can reuse a block
/// the collective still uses.
struct Keep {
    _inputs: Vec<Tensor>,
    _staging: Vec<Box<dyn DeviceBuffer>>,
}

/// One rank's part of a [`Pending`] collective.
#[must_use = "join it to get the output (dropping it still orders the GPU's kernels after it)"]
pub struct RankPending {
    what: String,
    gpu: Arc<Gpu>,
    end: Arc<CudaEvent>,
    output: Option<Tensor>,
    place: Option<(Vec<Strided>, u64, u64)>,
    _keep: Arc<Keep>,
}

impl RankPending {
    /// Makes this rank's compute stream wait for its part of the
    /// collective (the host does not wait) and gives its output.
    pub fn join(mut self) -> Result<Tensor, ExecError> {
        self.order(true)?;
        Ok(self.output.take().expect("joined once"))
    }

    fn order(&mut self, place: bool) -> Result<(), ExecError> {
        if self.output.is_none() {
            return Ok(());
        }
        let g = &self.gpu;
        if let Err(e) = g.stream.wait(&self.end) {
            // The memory held for the collective must not be reused while
            // it runs: wait on the host instead.
            let _ = self.end.synchronize();
            return Err(g.failed(&self.what, e));
        }
        if place {
            if let Some((copies, out, staging)) = self.place.take() {
                for c in &copies {
                    copy_strided(&g.stream, c, out, staging, false)
                        .map_err(|e| g.failed(&self.what, e))?;
                }
            }
        }
        Ok(())
    }
}

impl Drop for RankPending {
    fn drop(&mut self) {
        if self.output.is_some() {
            let _ = self.order(false);
        }
    }
}

/// What a collective does.
#[derive(Clone, Debug)]
enum Kind {
    AllReduce(ReduceOp),
    AllGather(Split),
    ReduceScatter(ReduceOp, Split),
    Broadcast(usize),
}

/// One rank's buffers: device addresses (0: none).
#[derive(Clone, Copy, Default)]
struct Bufs {
    send: u64,
    recv: u64,
    staging: u64,
}

/// The NCCL pointer of a device address (null for 0).
fn ptr(addr: u64) -> *mut c_void {
    addr as usize as *mut c_void
}

/// Copies `c` on `stream` from the whole layout at `whole` to the
/// block-major one at `block` (`to_block`), or back.
fn copy_strided(
    stream: &CudaStream,
    c: &Strided,
    whole: u64,
    block: u64,
    to_block: bool,
) -> Result<(), DriverError> {
    let (src, spitch, dst, dpitch) = if to_block {
        (
            whole + c.whole as u64,
            c.whole_pitch,
            block + c.block as u64,
            c.block_pitch,
        )
    } else {
        (
            block + c.block as u64,
            c.block_pitch,
            whole + c.whole as u64,
            c.whole_pitch,
        )
    };
    copy_2d(
        stream, dst, dpitch, src, spitch, c.width, c.height, MAX_PITCH,
    )
}

/// The largest pitch `cuMemcpy2D` takes on every GPU.
const MAX_PITCH: usize = i32::MAX as usize;

/// `height` rows of `width` bytes from `src` (rows `spitch` apart) to
/// `dst` (rows `dpitch` apart), device to device on `stream` (a GPU's
/// compute stream, whose context holds the blocks). Pitches past
/// `max_pitch` are copied a row at a time.
#[allow(clippy::too_many_arguments)]
fn copy_2d(
    stream: &CudaStream,
    dst: u64,
    dpitch: usize,
    src: u64,
    spitch: usize,
    width: usize,
    height: usize,
    max_pitch: usize,
) -> Result<(), DriverError> {
    use cudarc::driver::result::memcpy_dtod_async;
    if width == 0 || height == 0 {
        return Ok(());
    }
    stream.context().bind_to_thread()?;
    let s = stream.cu_stream();
    if height == 1 || (width == spitch && width == dpitch) {
        // SAFETY: `src` and `dst` are live device blocks (held by the
        // collective's `Pending`) holding `height` rows of their pitch (the
        // caller's layouts), so both hold the `width * height` bytes when
        // the rows are packed; the stream's context is current.
        return unsafe { memcpy_dtod_async(dst, src, width * height, s) };
    }
    if spitch > max_pitch || dpitch > max_pitch {
        for row in 0..height {
            // SAFETY: row `row` of each layout lies within its block (as
            // above), `width` bytes from the row's start.
            unsafe {
                memcpy_dtod_async(
                    dst + (row * dpitch) as u64,
                    src + (row * spitch) as u64,
                    width,
                    s,
                )
            }?;
        }
        return Ok(());
    }
    let copy = cu::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_UNIFIED,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: spitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_UNIFIED,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dpitch,
        WidthInBytes: width,
        Height: height,
    };
    // SAFETY: the descriptor names two live device blocks (as above) that
    // hold `height` rows of their pitches, each row `width` bytes wide
    // (`width` <= both pitches <= the driver's limit); the stream's context
    // is current and `copy` outlives the call (the driver reads it then).
    unsafe { cu::cuMemcpy2DAsync_v2(&copy, s) }.result()
}

/// Issues `kind` over `parts`, whose shapes and dtype (`dtype`) were
/// checked: `out_shapes` are the outputs'.
fn issue(
    kind: Kind,
    parts: &[(Arc<Gpu>, Tensor)],
    what: String,
    dtype: DType,
    out_shapes: Vec<Vec<usize>>,
    into: Option<&[Tensor]>,
) -> Result<Pending, ExecError> {
    let n = parts.len();
    let gpus: Vec<Arc<Gpu>> = parts.iter().map(|(g, _)| g.clone()).collect();
    let _current = KeepCurrent::new();
    // The GPUs: distinct devices, none broken.
    for (i, g) in gpus.iter().enumerate() {
        if gpus[..i].iter().any(|h| h.info.ordinal == g.info.ordinal) {
            return Err(bad_args(format!(
                "{what}: cuda:{} is in the set twice",
                g.info.ordinal
            )));
        }
        if g.is_broken() {
            return Err(ExecError::new(
                "E0730",
                format!(
                    "{what}: cuda:{}'s context was left unusable by an earlier error",
                    g.info.ordinal
                ),
            )
            .with_help(
                "the tensors only on that GPU are lost; the session makes a fresh context",
            ));
        }
    }
    // NCCL, and the element type its reductions read.
    let lib = if n > 1 { Some(library()?) } else { None };
    let reduce = match &kind {
        Kind::AllReduce(op) | Kind::ReduceScatter(op, _) => {
            let ty = reduce_type(dtype, *op)?;
            if let Some(lib) = lib {
                check_f8(lib, &gpus, dtype, *op)?;
            }
            Some((ty, nccl_op(*op)))
        }
        _ => None,
    };
    let elem = dtype.bytes() as usize;
    // The inputs on their GPUs (copied there if they are elsewhere). A
    // storage given twice gets a private copy for each later GPU: a
    // storage has one device copy at a time.
    let reads = |r: usize| !matches!(kind, Kind::Broadcast(src) if src != r);
    let mut inputs: Vec<Tensor> = Vec::with_capacity(n);
    let mut bufs = vec![Bufs::default(); n];
    for (r, (g, t)) in parts.iter().enumerate() {
        if !reads(r) {
            continue;
        }
        let t = if inputs.iter().any(|s| s.same_storage(t)) {
            t.try_deep_clone(&Interrupt::new())?
        } else {
            t.clone()
        };
        bufs[r].send = g.device_address(&t)?;
        inputs.push(t);
    }
    // Outputs, and staging where blocks are strided.
    let mut outputs = Vec::with_capacity(n);
    let mut staging = Vec::new();
    if let Some(into) = into {
        check_into(&what, into, &out_shapes, dtype)?;
    }
    for (r, g) in gpus.iter().enumerate() {
        let shape = &out_shapes[r];
        let bytes = shape.iter().product::<usize>() * elem;
        match into {
            // The caller's tensor, written in place on its GPU.
            Some(into) => {
                let t = &into[r];
                if inputs.iter().any(|i| i.same_storage(t)) {
                    return Err(bad_args(format!("{what}: an output is also an input")));
                }
                bufs[r].recv = g.device_address(t)?;
                outputs.push(t.clone());
            }
            None => {
                let buf = g.alloc_for(shape, dtype, bytes)?;
                bufs[r].recv = buf.address();
                outputs.push(Tensor::written_on_device(shape, dtype, buf)?);
            }
        }
        let strided = match &kind {
            Kind::AllGather(s) | Kind::ReduceScatter(_, s) => !s.contiguous() && n > 1,
            _ => false,
        };
        if strided {
            let whole = match &kind {
                Kind::ReduceScatter(..) => parts[r].1.shape(),
                _ => shape,
            };
            let b = g.alloc_for(whole, dtype, whole.iter().product::<usize>() * elem)?;
            bufs[r].staging = b.address();
            staging.push(b);
        }
    }
    // Events and streams, made before any work is queued. One GPU's
    // collective is a copy on its compute stream.
    let what_failed = |g: &Gpu, e: DriverError| g.failed(&what, e);
    let mut streams = Vec::with_capacity(n);
    let mut starts: Vec<CudaEvent> = Vec::with_capacity(n);
    let mut ends = Vec::with_capacity(n);
    for g in &gpus {
        let stream = match lib {
            Some(_) => g.comm.stream(&g.ctx).map_err(|e| what_failed(g, e))?,
            None => g.stream.clone(),
        };
        // In the stream's context, where they are recorded.
        let timed = || g.comm.timing_event(&stream);
        starts.push(timed().map_err(|e| what_failed(g, e))?);
        ends.push(Arc::new(timed().map_err(|e| what_failed(g, e))?));
        streams.push(stream);
    }
    // Strided blocks are packed block-major on the compute streams (in
    // the executor's context, as every copy of its tensors), and placed
    // from the staging there at the join.
    let mut place = Vec::new();
    match &kind {
        Kind::ReduceScatter(_, split) if bufs[0].staging != 0 => {
            for (g, b) in gpus.iter().zip(&bufs) {
                for c in split.copies() {
                    copy_strided(&g.stream, &c, b.send, b.staging, true)
                        .map_err(|e| what_failed(g, e))?;
                }
            }
        }
        Kind::AllGather(split) if bufs[0].staging != 0 => {
            place = bufs
                .iter()
                .map(|b| (split.copies(), b.recv, b.staging))
                .collect();
        }
        _ => {}
    }
    // The inputs and the staging are kept until every rank is joined.
    let keep = Arc::new(Keep {
        _inputs: inputs,
        _staging: staging,
    });
    let mut place = place.into_iter();
    let pending = Pending {
        ranks: outputs
            .into_iter()
            .zip(gpus.iter().cloned())
            .zip(ends)
            .map(|((output, gpu), end)| RankPending {
                what: what.clone(),
                gpu,
                end,
                output: Some(output),
                place: place.next(),
                _keep: keep.clone(),
            })
            .collect(),
    };
    let out_bytes: Vec<usize> = out_shapes
        .iter()
        .map(|s| s.iter().product::<usize>() * elem)
        .collect();
    let ends: Vec<Arc<CudaEvent>> = pending.ranks.iter().map(|r| r.end.clone()).collect();
    let queued = match lib {
        Some(lib) => queue(
            &kind, lib, reduce, &gpus, &streams, starts, &ends, &bufs, &out_bytes, elem, &what,
        ),
        // Whatever the collective, one GPU's output is its input: a copy on
        // the compute stream, timed as a collective.
        None => {
            let (g, s, start, end) = (&gpus[0], &streams[0], starts.pop(), &ends[0]);
            let start = start.expect("one start event per rank");
            let copied = start
                .record(s)
                .and_then(|()| {
                    copy_2d(
                        s,
                        bufs[0].recv,
                        0,
                        bufs[0].send,
                        0,
                        out_bytes[0],
                        1,
                        MAX_PITCH,
                    )
                })
                .map_err(|e| what_failed(g, e));
            // Recorded even after a failure, so that dropping `pending`
            // orders the compute stream after whatever was queued.
            let recorded = end.record(s).map_err(|e| what_failed(g, e));
            let done = copied.and(recorded);
            if done.is_ok() {
                g.comm.note(start, end.clone());
            }
            done
        }
    };
    // Given outputs are current on their GPUs from now on (a host read
    // waits on the compute stream, which the join orders after the
    // collective).
    for t in pending.ranks.iter().filter_map(|r| r.output.as_ref()) {
        t.storage.device_written();
    }
    queued?;
    Ok(pending)
}

/// The caller's outputs fit the collective's: one per rank, each of its
/// rank's shape and of `dtype`.
fn check_into(
    what: &str,
    into: &[Tensor],
    shapes: &[Vec<usize>],
    dtype: DType,
) -> Result<(), ExecError> {
    if into.len() != shapes.len() {
        return Err(bad_args(format!(
            "{what}: {} outputs for {} ranks",
            into.len(),
            shapes.len()
        )));
    }
    for (r, (t, shape)) in into.iter().zip(shapes).enumerate() {
        if t.shape() != shape.as_slice() || t.dtype() != dtype {
            return Err(bad_args(format!(
                "{what}: rank {r}'s output is {:?} {}, the result is {shape:?} {dtype}",
                t.shape(),
                t.dtype()
            )));
        }
    }
    Ok(())
}

/// `ncclUint8`: gathers and broadcasts move bytes.
const BYTES: c_int = 1;

/// One NCCL call of one rank: device addresses (0: null), counts in
/// elements of `ty`.
#[derive(Clone, Copy, Debug)]
enum Call {
    AllReduce {
        send: u64,
        recv: u64,
        count: usize,
        ty: c_int,
        op: c_int,
    },
    Broadcast {
        send: u64,
        recv: u64,
        count: usize,
        ty: c_int,
        root: c_int,
    },
    AllGather {
        send: u64,
        recv: u64,
        count: usize,
        ty: c_int,
    },
    ReduceScatter {
        send: u64,
        recv: u64,
        count: usize,
        ty: c_int,
        op: c_int,
    },
    Reduce {
        send: u64,
        recv: u64,
        count: usize,
        ty: c_int,
        op: c_int,
        root: c_int,
    },
}

/// The NCCL calls of rank `r` of an `n`-rank collective (every rank makes
/// the same calls in the same order, as NCCL requires).
fn calls_of(
    kind: &Kind,
    r: usize,
    n: usize,
    (ty, op): (c_int, c_int),
    b: &Bufs,
    out_bytes: usize,
    elem: usize,
) -> Vec<Call> {
    match kind {
        Kind::AllReduce(_) | Kind::Broadcast(_) if out_bytes == 0 => vec![],
        Kind::AllReduce(_) => vec![Call::AllReduce {
            send: b.send,
            recv: b.recv,
            count: out_bytes / elem,
            ty,
            op,
        }],
        Kind::Broadcast(src) => vec![Call::Broadcast {
            send: if r == *src { b.send } else { 0 },
            recv: b.recv,
            count: out_bytes,
            ty: BYTES,
            root: *src as c_int,
        }],
        Kind::AllGather(split) => {
            let into = if split.contiguous() {
                b.recv
            } else {
                b.staging
            };
            if split.equal() {
                let count = split.block_bytes(0);
                (count > 0)
                    .then_some(Call::AllGather {
                        send: b.send,
                        recv: into,
                        count,
                        ty: BYTES,
                    })
                    .into_iter()
                    .collect()
            } else {
                (0..n)
                    .filter(|&q| split.block_bytes(q) > 0)
                    .map(|q| Call::Broadcast {
                        send: b.send,
                        recv: into + split.block_offset(q) as u64,
                        count: split.block_bytes(q),
                        ty: BYTES,
                        root: q as c_int,
                    })
                    .collect()
            }
        }
        Kind::ReduceScatter(_, split) => {
            let from = if split.contiguous() {
                b.send
            } else {
                b.staging
            };
            if split.equal() {
                let count = split.block_bytes(0) / elem;
                (count > 0)
                    .then_some(Call::ReduceScatter {
                        send: from,
                        recv: b.recv,
                        count,
                        ty,
                        op,
                    })
                    .into_iter()
                    .collect()
            } else {
                (0..n)
                    .filter(|&q| split.block_bytes(q) > 0)
                    .map(|q| Call::Reduce {
                        send: from + split.block_offset(q) as u64,
                        recv: if q == r { b.recv } else { 0 },
                        count: split.block_bytes(q) / elem,
                        ty,
                        op,
                        root: q as c_int,
                    })
                    .collect()
            }
        }
    }
}

/// Makes `calls` on `comm` and stream `s`, grouped when there are several;
/// the first failure's code.
///
/// # Safety
/// `comm` is a live communicator of this rank, `s` a live stream of its
/// GPU's primary context, and every call's addresses are live device
/// memory of that GPU holding at least the bytes the call reads or writes.
unsafe fn make_calls(lib: &Nccl, comm: Comm, s: Stream, calls: &[Call]) -> Option<Res> {
    let grouped = calls.len() > 1;
    // SAFETY: a group only defers the calls below to its end.
    if grouped {
        let res = unsafe { (lib.group_start)() };
        if res != 0 {
            return Some(res);
        }
    }
    let mut first_error = None;
    for call in calls {
        // SAFETY (every call): the function's contract.
        let res = unsafe {
            match *call {
                Call::AllReduce {
                    send,
                    recv,
                    count,
                    ty,
                    op,
                } => (lib.all_reduce)(ptr(send), ptr(recv), count, ty, op, comm, s),
                Call::Broadcast {
                    send,
                    recv,
                    count,
                    ty,
                    root,
                } => (lib.broadcast)(ptr(send), ptr(recv), count, ty, root, comm, s),
                Call::AllGather {
                    send,
                    recv,
                    count,
                    ty,
                } => (lib.all_gather)(ptr(send), ptr(recv), count, ty, comm, s),
                Call::ReduceScatter {
                    send,
                    recv,
                    count,
                    ty,
                    op,
                } => (lib.reduce_scatter)(ptr(send), ptr(recv), count, ty, op, comm, s),
                Call::Reduce {
                    send,
                    recv,
                    count,
                    ty,
                    op,
                    root,
                } => (lib.reduce)(ptr(send), ptr(recv), count, ty, op, root, comm, s),
            }
        };
        if res != 0 {
            first_error.get_or_insert(res);
        }
    }
    if grouped {
        // SAFETY: ends the group started above (always, even after a
        // failed call, as NCCL requires).
        let end = unsafe { (lib.group_end)() };
        if end != 0 {
            first_error.get_or_insert(end);
        }
    }
    first_error
}

/// How one rank's part went.
#[derive(Default)]
struct Outcome {
    /// Made on the issuing thread: NCCL's last error is per thread.
    nccl: Option<ExecError>,
    driver: Option<DriverError>,
}

/// A communicator as a value a job may carry to its GPU's issuing thread.
#[derive(Clone, Copy)]
struct SendComm(Comm);

// SAFETY: an NCCL communicator may be used from any thread, one thread at
// a time: the job that carries it is the only user while it runs (the
// caller holds `COMMS` until every job is done).
unsafe impl Send for SendComm {}

impl SendComm {
    /// The communicator (a method, so that a closure captures the whole
    /// `SendComm`, not its raw field).
    fn get(self) -> Comm {
        self.0
    }
}

/// Queues the collective's work on the communication streams, each rank's
/// by its GPU's issuing thread (see `issuer`), all at once: `start` is
/// recorded on the compute stream after its work so far (the inputs'
/// copies, the kernels that wrote them, the packing) and the communication
/// stream waits for it, the NCCL calls are made (rank `r` reads `bufs[r].send` and writes
/// `out_bytes[r]` bytes at `bufs[r].recv`), and `end` is recorded, even
/// after a failure, so that dropping the `Pending` orders the compute
/// streams after whatever was queued. Returns when every rank is queued.
#[allow(clippy::too_many_arguments)]
fn queue(
    kind: &Kind,
    lib: &'static Nccl,
    reduce: Option<(c_int, c_int)>,
    gpus: &[Arc<Gpu>],
    streams: &[Arc<CudaStream>],
    starts: Vec<CudaEvent>,
    ends: &[Arc<CudaEvent>],
    bufs: &[Bufs],
    out_bytes: &[usize],
    elem: usize,
    what: &str,
) -> Result<(), ExecError> {
    let n = gpus.len();
    let reduce = reduce.unwrap_or((BYTES, 0));
    let mut cache = COMMS.lock().unwrap_or_else(|p| p.into_inner());
    let set = comms_for(lib, &mut cache, gpus, what)?;
    let outcomes: Arc<Vec<Mutex<Outcome>>> =
        Arc::new((0..n).map(|_| Mutex::new(Outcome::default())).collect());
    let latch = Latch::new(n);
    for (r, start) in starts.into_iter().enumerate() {
        let calls = calls_of(kind, r, n, reduce, &bufs[r], out_bytes[r], elem);
        let comm = SendComm(cache[set].comms[r].comm);
        let (g, stream, end) = (gpus[r].clone(), streams[r].clone(), ends[r].clone());
        let (outcomes, token, what) = (outcomes.clone(), latch.token(), what.to_string());
        let job = move || {
            let _token = token;
            let mut out = Outcome::default();
            let ordered = PerGpu::order_after(&start, &stream, &g.stream);
            match ordered {
                Err(e) => out.driver = Some(e),
                // SAFETY: `comm` is rank `r`'s communicator of this set of
                // GPUs (alive: the caller holds `COMMS` until this job is
                // done) and `stream` rank `r`'s communication stream, in its
                // GPU's primary context, which NCCL uses; each address is a
                // live block of the executor's context on that GPU (`issue`
                // allocated or located it, and `Pending` holds it until the
                // compute streams are ordered after the stream) holding at
                // least the bytes the call reads or writes: `send` the input
                // (the whole tensor, or shard `r`: block `r`), `recv` the
                // output (`out_bytes[r]`), `staging` the whole tensor's bytes
                // in block-major order, a block `q` at `block_offset(q)` for
                // `block_bytes(q)` bytes.
                Ok(()) => {
                    let s = stream.cu_stream() as Stream;
                    out.nccl = unsafe { make_calls(lib, comm.get(), s, &calls) }
                        .map(|code| nccl_error(lib, &what, code));
                }
            }
            if let Err(e) = end.record(&stream) {
                out.driver.get_or_insert(e);
            }
            if out.nccl.is_none() && out.driver.is_none() {
                g.comm.note(start, end);
            }
            *outcomes[r].lock().unwrap_or_else(|p| p.into_inner()) = out;
        };
        let name = format!("tessera-nccl-{}", gpus[r].info.ordinal);
        gpus[r].comm.issuer.run(&name, Box::new(job));
    }
    latch.wait();
    let mut failed = None;
    for (r, o) in outcomes.iter().enumerate() {
        let mut o = o.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = o.nccl.take() {
            failed.get_or_insert(e);
        }
        if let Some(e) = o.driver.take() {
            failed.get_or_insert(gpus[r].failed(what, e));
        }
    }
    match failed {
        Some(e) => {
            // Aborted (dropped): they may hold half a collective.
            cache.remove(set);
            Err(e)
        }
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------
// The collectives

fn shapes(parts: &[(Arc<Gpu>, Tensor)]) -> Vec<&[usize]> {
    parts.iter().map(|(_, t)| t.shape()).collect()
}

/// `"cuda:0, cuda:1"`.
fn names(parts: &[(Arc<Gpu>, Tensor)]) -> String {
    parts
        .iter()
        .map(|(g, _)| format!("cuda:{}", g.info.ordinal))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Starts an all-reduce (see the module docs); [`all_reduce`] joins it.
/// `into` (one tensor per rank, on its GPU, of the result's shape and
/// dtype) receives the outputs in place of new tensors; the same holds for
/// the other `_async` collectives.
pub fn all_reduce_async(
    parts: &[(Arc<Gpu>, Tensor)],
    op: ReduceOp,
    into: Option<&[Tensor]>,
) -> Result<Pending, ExecError> {
    let dtype = common_dtype("all_reduce", parts)?;
    let what = format!("all_reduce ({}) over {}", op.name(), names(parts));
    let s = shapes(parts);
    same_shapes(&what, &s)?;
    let out = vec![s[0].to_vec(); parts.len()];
    issue(Kind::AllReduce(op), parts, what, dtype, out, into)
}

/// Every output is the elementwise `op` of the inputs (same shape and
/// dtype), current on its GPU.
pub fn all_reduce(parts: &[(Arc<Gpu>, Tensor)], op: ReduceOp) -> Result<Vec<Tensor>, ExecError> {
    all_reduce_async(parts, op, None)?.join()
}

/// Starts an all-gather (see the module docs); [`all_gather`] joins it.
pub fn all_gather_async(
    parts: &[(Arc<Gpu>, Tensor)],
    axis: usize,
    into: Option<&[Tensor]>,
) -> Result<Pending, ExecError> {
    let dtype = common_dtype("all_gather", parts)?;
    let what = format!("all_gather along axis {axis} over {}", names(parts));
    let (whole, split) = gather_split(&what, &shapes(parts), axis, dtype.bytes() as usize)?;
    let out = vec![whole; parts.len()];
    issue(Kind::AllGather(split), parts, what, dtype, out, into)
}

/// `parts[i]` is shard `i` along `axis` (sizes may differ); every GPU gets
/// the whole tensor, their concatenation along `axis`.
pub fn all_gather(parts: &[(Arc<Gpu>, Tensor)], axis: usize) -> Result<Vec<Tensor>, ExecError> {
    all_gather_async(parts, axis, None)?.join()
}

/// Starts a reduce-scatter (see the module docs); [`reduce_scatter`] joins
/// it.
pub fn reduce_scatter_async(
    parts: &[(Arc<Gpu>, Tensor)],
    op: ReduceOp,
    axis: usize,
    sizes: &[usize],
    into: Option<&[Tensor]>,
) -> Result<Pending, ExecError> {
    let dtype = common_dtype("reduce_scatter", parts)?;
    let what = format!(
        "reduce_scatter ({}) along axis {axis} over {}",
        op.name(),
        names(parts)
    );
    let s = shapes(parts);
    same_shapes(&what, &s)?;
    let split = scatter_split(
        &what,
        s[0],
        parts.len(),
        axis,
        sizes,
        dtype.bytes() as usize,
    )?;
    let out = sizes
        .iter()
        .map(|&k| {
            let mut shape = s[0].to_vec();
            shape[axis] = k;
            shape
        })
        .collect();
    issue(
        Kind::ReduceScatter(op, split),
        parts,
        what,
        dtype,
        out,
        into,
    )
}

/// `parts[i]` are same-shape tensors; output `i` is block `i` (`sizes[i]`
/// long along `axis`) of their elementwise `op`.
pub fn reduce_scatter(
    parts: &[(Arc<Gpu>, Tensor)],
    op: ReduceOp,
    axis: usize,
    sizes: &[usize],
) -> Result<Vec<Tensor>, ExecError> {
    reduce_scatter_async(parts, op, axis, sizes, None)?.join()
}

/// Starts a broadcast (see the module docs); [`broadcast`] joins it.
pub fn broadcast_async(
    parts: &[(Arc<Gpu>, Tensor)],
    src: usize,
    into: Option<&[Tensor]>,
) -> Result<Pending, ExecError> {
    let dtype = common_dtype("broadcast", parts)?;
    let what = format!("broadcast from rank {src} over {}", names(parts));
    if src >= parts.len() {
        return Err(bad_args(format!("{what}: there are {} ranks", parts.len())));
    }
    let s = shapes(parts);
    same_shapes(&what, &s)?;
    let out = vec![s[src].to_vec(); parts.len()];
    issue(Kind::Broadcast(src), parts, what, dtype, out, into)
}

/// Every output is a copy of `parts[src]`'s tensor; the other tensors only
/// give the GPUs and the shape.
pub fn broadcast(parts: &[(Arc<Gpu>, Tensor)], src: usize) -> Result<Vec<Tensor>, ExecError> {
    broadcast_async(parts, src, None)?.join()
}

#[cfg(test)]
mod tests;
