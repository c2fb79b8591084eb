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
//! stream wait for it, issues NCCL's calls there (grouped:
//! `ncclGroupStart`/`ncclGroupEnd`, so one thread drives every GPU) and
//! records an event after them. The host does not wait. A collective over
//! one GPU is a copy on its compute stream.
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
//! (events on its communication stream, from the moment the inputs were
//! ready to the end of its part), the sibling of [`Gpu::kernel_time`];
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

/// The environment variable naming the NCCL library to load (a path, or a
/// file name the dynamic loader looks for), instead of `libnccl.so.2`.
pub const LIBRARY_ENV: &str = "TESSERA_NCCL";

/// The oldest NCCL with bf16 and `ncclAvg`.
const MIN_VERSION: (u32, u32) = (2, 10);

/// The first NCCL with the f8 types.
const F8_VERSION: (u32, u32) = (2, 24);

/// The reductions: the executor's one enum (`exec::dist`).
pub use crate::exec::dist::ReduceOp;

/// NCCL's `ncclRedOp_t` for `op`.
fn nccl_op(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Mean => 4,
    }
}

// ---------------------------------------------------------------------------
// The library

/// `ncclComm_t`.
type Comm = *mut c_void;
/// `cudaStream_t`: the driver's `CUstream`.
type Stream = *mut c_void;
/// `ncclResult_t` (a C enum: an int; read as one, never as a Rust enum, so
/// a code this file does not know is still a value).
type Res = c_int;

type AllReduceFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res;
type BroadcastFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res;
type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    Comm,
    Stream,
) -> Res;
type AllGatherFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> Res;

/// NCCL's functions that Tessera calls, from the loaded library (which is
/// kept: the pointers live as long as it does).
struct Nccl {
    file: String,
    version: (u32, u32, u32),
    get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    /// NCCL 2.13 and later.
    get_last_error: Option<unsafe extern "C" fn(Comm) -> *const c_char>,
    comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Res,
    comm_abort: unsafe extern "C" fn(Comm) -> Res,
    group_start: unsafe extern "C" fn() -> Res,
    group_end: unsafe extern "C" fn() -> Res,
    all_reduce: AllReduceFn,
    reduce_scatter: AllReduceFn,
    broadcast: BroadcastFn,
    reduce: ReduceFn,
    all_gather: AllGatherFn,
    _lib: libloading::Library,
}

/// The functions a library must have to be used (`ncclGetLastError` is
/// optional).
const SYMBOLS: [&str; 11] = [
    "ncclGetVersion",
    "ncclGetErrorString",
    "ncclCommInitAll",
    "ncclCommAbort",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclAllReduce",
    "ncclReduceScatter",
    "ncclBroadcast",
    "ncclReduce",
    "ncclAllGather",
];

/// The file names tried, in order: [`LIBRARY_ENV`]'s, else the soname, then
/// the development link.
fn candidates() -> Vec<String> {
    match std::env::var(LIBRARY_ENV) {
        Ok(f) if !f.is_empty() => vec![f],
        _ => vec!["libnccl.so.2".to_string(), "libnccl.so".to_string()],
    }
}

/// E0721 for a library that cannot be used, `why` in the message.
fn unusable(why: String) -> ExecError {
    ExecError::new("E0721", why).with_help(format!(
        "collectives over several GPUs need NVIDIA's NCCL: install it (`apt install libnccl2`, \
         or `pip install nvidia-nccl-cu12` and put its `lib` folder on LD_LIBRARY_PATH), or set \
         {LIBRARY_ENV} to the path of a libnccl.so.2; tensors on one GPU need no NCCL"
    ))
}

/// A symbol of `lib` as a value of type `T`.
///
/// # Safety
/// `T` must be the type of the C function `name` as nccl.h declares it.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, ExecError> {
    // SAFETY: the caller's contract: `T` is the symbol's type.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|_| unusable(format!("NCCL's `{name}` is missing")))
}

/// `ncclGetVersion`'s code as (major, minor, patch): `MAJOR * 10000 +
/// MINOR * 100 + PATCH` from 2.9, `MAJOR * 1000 + MINOR * 100 + PATCH`
/// before.
fn version_of(code: c_int) -> (u32, u32, u32) {
    let v = code.max(0) as u32;
    if v >= 10000 {
        (v / 10000, (v % 10000) / 100, v % 100)
    } else {
        (v / 1000, (v % 1000) / 100, v % 100)
    }
}

/// NCCL from the first of `names` that loads: E0721 when none does, or it
/// lacks NCCL's functions, or it is older than 2.10.
fn load(names: &[String]) -> Result<Nccl, ExecError> {
    let mut found = None;
    for name in names {
        // SAFETY: loading a shared library runs its initialisers; NCCL's
        // only set up its own state (the CUDA runtime it links is loaded
        // beside it, as in any process that uses NCCL).
        if let Ok(lib) = unsafe { libloading::Library::new(name) } {
            found = Some((name.clone(), lib));
            break;
        }
    }
    let Some((file, lib)) = found else {
        return Err(unusable(format!(
            "NCCL (libnccl.so.2) was not found (looked for {})",
            names.join(", ")
        )));
    };
    let missing: Vec<&str> = SYMBOLS
        .iter()
        // SAFETY: only the symbol's presence is asked; its address is not
        // used as any type.
        .filter(|s| unsafe { lib.get::<*const c_void>(s.as_bytes()) }.is_err())
        .copied()
        .collect();
    if !missing.is_empty() {
        return Err(unusable(format!(
            "`{file}` is not a usable NCCL: it lacks {}",
            missing.join(", ")
        )));
    }
    // SAFETY: each type is the function's declaration in nccl.h (2.10 to
    // 2.30 declare them alike): `ncclResult_t` and `ncclDataType_t`,
    // `ncclRedOp_t` are C enums (ints), `ncclComm_t` and `cudaStream_t` are
    // pointers, counts are `size_t`.
    let nccl = unsafe {
        let get_version: unsafe extern "C" fn(*mut c_int) -> Res = symbol(&lib, "ncclGetVersion")?;
        let mut code: c_int = 0;
        // SAFETY: `code` is a live int NCCL writes its version into.
        let res = get_version(&mut code);
        if res != 0 {
            return Err(unusable(format!(
                "`{file}` did not say its version (NCCL error {res})"
            )));
        }
        Nccl {
            version: version_of(code),
            get_error_string: symbol(&lib, "ncclGetErrorString")?,
            get_last_error: symbol(&lib, "ncclGetLastError").ok(),
            comm_init_all: symbol(&lib, "ncclCommInitAll")?,
            comm_abort: symbol(&lib, "ncclCommAbort")?,
            group_start: symbol(&lib, "ncclGroupStart")?,
            group_end: symbol(&lib, "ncclGroupEnd")?,
            all_reduce: symbol(&lib, "ncclAllReduce")?,
            reduce_scatter: symbol(&lib, "ncclReduceScatter")?,
            broadcast: symbol(&lib, "ncclBroadcast")?,
            reduce: symbol(&lib, "ncclReduce")?,
            all_gather: symbol(&lib, "ncclAllGather")?,
            file,
            _lib: lib,
        }
    };
    let (major, minor, patch) = nccl.version;
    if (major, minor) < MIN_VERSION {
        return Err(unusable(format!(
            "`{}` is NCCL {major}.{minor}.{patch}; Tessera needs {}.{} or later",
            nccl.file, MIN_VERSION.0, MIN_VERSION.1
        )));
    }
    Ok(nccl)
}

/// This process's NCCL, loaded at the first call.
fn library() -> Result<&'static Nccl, ExecError> {
    static LIB: OnceLock<Result<Nccl, ExecError>> = OnceLock::new();
    LIB.get_or_init(|| load(&candidates()))
        .as_ref()
        .map_err(Clone::clone)
}

/// The loaded NCCL's file and version (major, minor, patch), loading it if
/// it is not yet: E0721 as for a collective when it cannot be used.
pub fn version() -> Result<(String, (u32, u32, u32)), ExecError> {
    library().map(|n| (n.file.clone(), n.version))
}

/// NCCL's name for an error code.
fn result_name(code: Res) -> String {
    match code {
        1 => "ncclUnhandledCudaError".to_string(),
        2 => "ncclSystemError".to_string(),
        3 => "ncclInternalError".to_string(),
        4 => "ncclInvalidArgument".to_string(),
        5 => "ncclInvalidUsage".to_string(),
        6 => "ncclRemoteError".to_string(),
        7 => "ncclInProgress".to_string(),
        other => format!("NCCL error {other}"),
    }
}

/// A C string NCCL returned (static or owned by NCCL), if any.
fn c_text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: NCCL returns null or a NUL-terminated string it keeps alive
    // (a static table, or its per-thread last-error buffer) until its next
    // call on this thread; it is copied at once.
    let s = unsafe { CStr::from_ptr(p) }
        .to_string_lossy()
        .trim()
        .to_string();
    (!s.is_empty()).then_some(s)
}

/// E0730 for NCCL error `code` while doing `what`.
fn nccl_error(lib: &Nccl, what: &str, code: Res) -> ExecError {
    // SAFETY: `ncclGetErrorString` takes any code and returns a static
    // string; `ncclGetLastError` accepts a null communicator (the thread's
    // last error).
    let text = c_text(unsafe { (lib.get_error_string)(code) });
    let last = lib
        .get_last_error
        .and_then(|f| c_text(unsafe { f(std::ptr::null_mut()) }));
    let mut message = format!("{what} failed: NCCL says {}", result_name(code));
    if let Some(t) = text {
        message.push_str(&format!(" ({t})"));
    }
    if let Some(l) = last {
        message.push_str(&format!(": {l}"));
    }
    let help = match code {
        1 => "a CUDA call inside NCCL failed (a GPU's memory may be full, or its context unusable)",
        2 => "a system call inside NCCL failed (in a container, /dev/shm may be too small)",
        4 | 5 => "NCCL refused Tessera's call: this is a bug, please report it",
        6 => "another GPU of the set failed",
        _ => "NCCL failed",
    };
    ExecError::new("E0730", message).with_help(format!(
        "{help}; run with NCCL_DEBUG=WARN for NCCL's own account"
    ))
}

// ---------------------------------------------------------------------------
// Layouts

/// E0707 for arguments the callers check before calling.
fn bad_args(message: String) -> ExecError {
    ExecError::new("E0707", message).with_help(
        "this is a compiler bug (a collective's arguments are checked before it runs): please \
         report it",
    )
}

/// A tensor cut along one axis into blocks, in bytes: `outer` rows (the
/// product of the dims before the axis), each the concatenation of every
/// block's `sizes[r] * unit` bytes (`unit`: the bytes of one index along the
/// axis, the dims after it times the element's bytes).
///
/// The block-major layout puts each block's `outer` rows together, blocks
/// in order: block `r` is then contiguous, and is the tensor that block is.
#[derive(Clone, Debug, PartialEq)]
struct Split {
    outer: usize,
    unit: usize,
    sizes: Vec<usize>,
}

/// A strided copy of `height` rows of `width` bytes, between the
/// block-major layout (at `block`, rows `block_pitch` apart) and the whole
/// tensor's (at `whole`, rows `whole_pitch` apart).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Strided {
    block: usize,
    block_pitch: usize,
    whole: usize,
    whole_pitch: usize,
    width: usize,
    height: usize,
}

impl Split {
    /// `shape` (the whole tensor's) cut along `axis` into `sizes`, elements
    /// of `elem` bytes.
    fn new(shape: &[usize], axis: usize, sizes: Vec<usize>, elem: usize) -> Split {
        Split {
            outer: shape[..axis].iter().product(),
            unit: shape[axis + 1..].iter().product::<usize>() * elem,
            sizes,
        }
    }

    fn total(&self) -> usize {
        self.sizes.iter().sum()
    }

    fn prefix(&self, r: usize) -> usize {
        self.sizes[..r].iter().sum()
    }

    /// Every block the same size: NCCL's all-gather and reduce-scatter fit.
    fn equal(&self) -> bool {
        self.sizes.windows(2).all(|w| w[0] == w[1])
    }

    /// The blocks are contiguous in the whole tensor (no staging).
    fn contiguous(&self) -> bool {
        self.outer <= 1
    }

    /// Block `r`'s offset in the block-major layout.
    fn block_offset(&self, r: usize) -> usize {
        self.outer * self.prefix(r) * self.unit
    }

    fn block_bytes(&self, r: usize) -> usize {
        self.outer * self.sizes[r] * self.unit
    }

    /// The copies between the block-major layout and the whole tensor's,
    /// one per block.
    fn copies(&self) -> Vec<Strided> {
        let whole_pitch = self.total() * self.unit;
        (0..self.sizes.len())
            .map(|r| Strided {
                block: self.block_offset(r),
                block_pitch: self.sizes[r] * self.unit,
                whole: self.prefix(r) * self.unit,
                whole_pitch,
                width: self.sizes[r] * self.unit,
                height: self.outer,
            })
            .collect()
    }
}

/// The parts' common dtype (E0707 when they differ, or there are none).
fn common_dtype(name: &str, parts: &[(Arc<Gpu>, Tensor)]) -> Result<DType, ExecError> {
    let Some((_, first)) = parts.first() else {
        return Err(bad_args(format!("{name} over no GPU")));
    };
    let dtype = first.dtype();
    if let Some((_, t)) = parts.iter().find(|(_, t)| t.dtype() != dtype) {
        return Err(bad_args(format!(
            "{name} of {dtype} and {} tensors",
            t.dtype()
        )));
    }
    Ok(dtype)
}

/// E0707 unless every shape is `shape`.
fn same_shapes(name: &str, shapes: &[&[usize]]) -> Result<(), ExecError> {
    if let Some(s) = shapes.iter().find(|s| **s != shapes[0]) {
        return Err(bad_args(format!(
            "{name} of tensors of shapes {:?} and {s:?}",
            shapes[0]
        )));
    }
    Ok(())
}

/// The whole shape of shards `shapes` along `axis`, and their split.
fn gather_split(
    name: &str,
    shapes: &[&[usize]],
    axis: usize,
    elem: usize,
) -> Result<(Vec<usize>, Split), ExecError> {
    let first = shapes[0];
    if axis >= first.len() {
        return Err(bad_args(format!(
            "{name} along axis {axis} of a rank-{} tensor",
            first.len()
        )));
    }
    for s in shapes {
        let fits = s.len() == first.len()
            && s.iter()
                .zip(first)
                .enumerate()
                .all(|(i, (a, b))| i == axis || a == b);
        if !fits {
            return Err(bad_args(format!(
                "{name} along axis {axis} of shards of shapes {first:?} and {s:?}"
            )));
        }
    }
    let sizes: Vec<usize> = shapes.iter().map(|s| s[axis]).collect();
    let mut whole = first.to_vec();
    whole[axis] = sizes.iter().sum();
    let split = Split::new(&whole, axis, sizes, elem);
    Ok((whole, split))
}

/// The split of `shape` along `axis` into `sizes` (one per rank, summing to
/// the axis's size).
fn scatter_split(
    name: &str,
    shape: &[usize],
    ranks: usize,
    axis: usize,
    sizes: &[usize],
    elem: usize,
) -> Result<Split, ExecError> {
    if axis >= shape.len() {
        return Err(bad_args(format!(
            "{name} along axis {axis} of a rank-{} tensor",
            shape.len()
        )));
    }
    if sizes.len() != ranks || sizes.iter().sum::<usize>() != shape[axis] {
        return Err(bad_args(format!(
            "{name} of a tensor of shape {shape:?} into blocks {sizes:?} along axis {axis} \
             over {ranks} GPUs"
        )));
    }
    Ok(Split::new(shape, axis, sizes.to_vec(), elem))
}

/// NCCL's `ncclDataType_t` for reducing `dtype` with `op`; E0721 for what
/// NCCL cannot reduce (f8 is checked against the library and the GPUs by
/// [`check_f8`]).
fn reduce_type(dtype: DType, op: ReduceOp) -> Result<c_int, ExecError> {
    let unsupported = |why: &str| {
        ExecError::new(
            "E0721",
            format!(
                "{} of {} tensors across GPUs is not supported by NCCL",
                op.name(),
                dtype.name()
            ),
        )
        .with_help(why.to_string())
    };
    Ok(match dtype {
        DType::I8 => 0,
        DType::U8 => 1,
        DType::I32 => 2,
        DType::U32 => 3,
        DType::I64 => 4,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
        DType::F8E4M3 => 10,
        DType::F8E5M2 => 11,
        // 0/1 bytes: their max is any, their min all.
        DType::Bool if matches!(op, ReduceOp::Max | ReduceOp::Min) => 1,
        DType::Bool => {
            return Err(unsupported(
                "reduce bool tensors with max (any) or min (all), or convert them to i32 first",
            ))
        }
        DType::I16 => {
            return Err(unsupported(
                "NCCL has no 16-bit integers: convert the tensors to i32 first",
            ))
        }
    })
}

/// E0721 unless NCCL and every GPU can reduce f8 (`dtype` is not f8: no
/// condition).
fn check_f8(lib: &Nccl, gpus: &[Arc<Gpu>], dtype: DType, op: ReduceOp) -> Result<(), ExecError> {
    if !matches!(dtype, DType::F8E4M3 | DType::F8E5M2) {
        return Ok(());
    }
    let err = |why: String| {
        ExecError::new(
            "E0721",
            format!(
                "{} of {} tensors across GPUs is not supported by NCCL here",
                op.name(),
                dtype.name()
            ),
        )
        .with_help(format!("{why}; convert the tensors to bf16 or f32 first"))
    };
    let (major, minor, _) = lib.version;
    if (major, minor) < F8_VERSION {
        return Err(err(format!(
            "NCCL reduces f8 from {}.{}, and this is {major}.{minor}",
            F8_VERSION.0, F8_VERSION.1
        )));
    }
    if let Some(g) = gpus.iter().find(|g| g.info.compute_capability < (9, 0)) {
        let (a, b) = g.info.compute_capability;
        return Err(err(format!(
            "NCCL reduces f8 on GPUs of compute capability 9.0 or later, and cuda:{} is {a}.{b}",
            g.info.ordinal
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Per-GPU state

/// A GPU's communication stream and the timings of its collectives.
#[derive(Default)]
pub(crate) struct PerGpu {
    stream: Mutex<Option<Arc<CudaStream>>>,
    /// Events around each collective whose time is not summed yet.
    timings: Mutex<Vec<(CudaEvent, Arc<CudaEvent>)>>,
    /// Timing events whose collective was summed, for the next ones
    /// (making and destroying events costs host time at every call).
    spare: Mutex<Vec<CudaEvent>>,
    /// Recorded on the compute stream before each collective (the inputs
    /// are ready) for the communication stream to wait on: a wait takes
    /// the event's state when it is queued, so one event serves every call.
    ready: Mutex<Option<CudaEvent>>,
    nanos: AtomicU64,
    count: AtomicU64,
}

/// The most spare events a GPU keeps.
const SPARE_CAP: usize = 16;

/// Beyond this many unsummed timings, the finished ones are summed.
const TIMINGS_CAP: usize = 64;

impl PerGpu {
    /// The communication stream of a GPU whose context is `ctx` (made at
    /// the first collective): non-blocking, so that the compute stream (the
    /// context's legacy default stream) does not wait for it, nor it for
    /// the compute stream, but through events.
    fn stream(&self, ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>, DriverError> {
        let mut s = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = s.as_ref() {
            return Ok(s.clone());
        }
        let made = ctx.new_stream()?;
        *s = Some(made.clone());
        Ok(made)
    }

    /// A timing event of `stream`'s context: a spare one, or a new one.
    fn timing_event(&self, stream: &CudaStream) -> Result<CudaEvent, DriverError> {
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
    fn order_after(&self, comm: &CudaStream, compute: &CudaStream) -> Result<(), DriverError> {
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

    fn note(&self, start: CudaEvent, end: Arc<CudaEvent>) {
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
    fn sum(&self, wait: bool) {
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

// ---------------------------------------------------------------------------
// Communicators

/// One rank's `ncclComm_t`, aborted when dropped.
struct RawComm {
    comm: Comm,
    lib: &'static Nccl,
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
struct CommSet {
    owners: Vec<u64>,
    gpus: Vec<Weak<Gpu>>,
    comms: Vec<RawComm>,
}

impl CommSet {
    /// Its GPUs are all alive and usable.
    fn usable(&self) -> bool {
        self.gpus
            .iter()
            .all(|g| g.upgrade().is_some_and(|g| !g.is_broken()))
    }
}

/// Every communicator set made so far (held while a collective is issued:
/// NCCL's groups are per thread, and one collective at a time uses them).
static COMMS: Mutex<Vec<CommSet>> = Mutex::new(Vec::new());

/// How many communicator sets were made (for tests).
static COMM_INITS: AtomicU64 = AtomicU64::new(0);

/// Puts back the thread's current context when dropped: NCCL makes the
/// devices' primary contexts current as it works.
struct KeepCurrent(Option<cu::CUcontext>);

impl KeepCurrent {
    fn new() -> KeepCurrent {
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
fn comms_for(
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
    let mut starts = Vec::with_capacity(n);
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
    // Each communication stream starts when its compute stream's work so
    // far (the inputs' copies, the kernels that wrote them, the packing)
    // is done.
    for (r, g) in gpus.iter().enumerate() {
        if lib.is_some() {
            g.comm
                .order_after(&streams[r], &g.stream)
                .map_err(|e| what_failed(g, e))?;
        }
        starts[r]
            .record(&streams[r])
            .map_err(|e| what_failed(g, e))?;
    }
    let out_bytes: Vec<usize> = out_shapes
        .iter()
        .map(|s| s.iter().product::<usize>() * elem)
        .collect();
    let queued = match lib {
        Some(lib) => queue(
            &kind, lib, reduce, &gpus, &streams, &bufs, &out_bytes, elem, &what,
        ),
        // Whatever the collective, one GPU's output is its input.
        None => copy_2d(
            &streams[0],
            bufs[0].recv,
            0,
            bufs[0].send,
            0,
            out_bytes[0],
            1,
            MAX_PITCH,
        )
        .map_err(|e| what_failed(&gpus[0], e)),
    };
    // The end events are recorded even after a failure, so that dropping
    // `pending` orders the compute streams after whatever was queued.
    let mut recorded = Ok(());
    for (r, g) in gpus.iter().enumerate() {
        if let Err(e) = pending.ranks[r].end.record(&streams[r]) {
            recorded = recorded.and(Err(what_failed(g, e)));
        }
    }
    // Given outputs are current on their GPUs from now on (a host read
    // waits on the compute stream, which the join orders after the
    // collective).
    for t in pending.ranks.iter().filter_map(|r| r.output.as_ref()) {
        t.storage.device_written();
    }
    queued.and(recorded)?;
    for (g, (start, rank)) in gpus.iter().zip(starts.into_iter().zip(&pending.ranks)) {
        g.comm.note(start, rank.end.clone());
    }
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

/// Queues the collective's work on the communication streams: rank `r`
/// reads `bufs[r].send` and writes `out_bytes[r]` bytes at `bufs[r].recv`.
#[allow(clippy::too_many_arguments)]
fn queue(
    kind: &Kind,
    lib: &'static Nccl,
    reduce: Option<(c_int, c_int)>,
    gpus: &[Arc<Gpu>],
    streams: &[Arc<CudaStream>],
    bufs: &[Bufs],
    out_bytes: &[usize],
    elem: usize,
    what: &str,
) -> Result<(), ExecError> {
    let n = gpus.len();
    let (ty, op) = reduce.unwrap_or((BYTES, 0));
    {
        let mut cache = COMMS.lock().unwrap_or_else(|p| p.into_inner());
        let set = comms_for(lib, &mut cache, gpus, what)?;
        let comms: Vec<Comm> = cache[set].comms.iter().map(|c| c.comm).collect();
        let _current = KeepCurrent::new();
        // SAFETY: a group only defers the calls below to its end.
        let res = unsafe { (lib.group_start)() };
        if res != 0 {
            return Err(nccl_error(lib, what, res));
        }
        let mut first_error: Option<Res> = None;
        let mut call = |res: Res| {
            if res != 0 {
                first_error.get_or_insert(res);
            }
        };
        for (r, b) in bufs.iter().enumerate() {
            let (comm, s) = (comms[r], streams[r].cu_stream() as Stream);
            // SAFETY (every call below): `comm` is rank `r`'s communicator of
            // this set of GPUs and `s` rank `r`'s communication stream (in
            // its GPU's primary context, which NCCL uses); each pointer is a
            // live block of the executor's context on that GPU (`issue`
            // allocated or located it, and `Pending` holds it until the
            // compute streams are ordered after the stream) holding at
            // least the bytes the call reads or writes: `send` the input
            // (the whole tensor, or shard `r`: block `r`), `recv` the output
            // (`out_bytes[r]`), `staging` the whole tensor's bytes in
            // block-major order, a block `q` at `block_offset(q)` for
            // `block_bytes(q)` bytes; counts are in elements of `ty`.
            // Every rank makes the same calls in the same order, inside one
            // group, as NCCL requires of one thread driving several GPUs.
            match kind {
                Kind::AllReduce(_) | Kind::Broadcast(_) if out_bytes[r] == 0 => {}
                Kind::AllReduce(_) => call(unsafe {
                    (lib.all_reduce)(
                        ptr(b.send),
                        ptr(b.recv),
                        out_bytes[r] / elem,
                        ty,
                        op,
                        comm,
                        s,
                    )
                }),
                Kind::Broadcast(src) => call(unsafe {
                    (lib.broadcast)(
                        if r == *src { ptr(b.send) } else { ptr(0) },
                        ptr(b.recv),
                        out_bytes[r],
                        BYTES,
                        *src as c_int,
                        comm,
                        s,
                    )
                }),
                Kind::AllGather(split) => {
                    let into = if split.contiguous() {
                        b.recv
                    } else {
                        b.staging
                    };
                    if split.equal() {
                        if split.block_bytes(0) > 0 {
                            call(unsafe {
                                (lib.all_gather)(
                                    ptr(b.send),
                                    ptr(into),
                                    split.block_bytes(0),
                                    BYTES,
                                    comm,
                                    s,
                                )
                            });
                        }
                    } else {
                        for q in (0..n).filter(|&q| split.block_bytes(q) > 0) {
                            call(unsafe {
                                (lib.broadcast)(
                                    ptr(b.send),
                                    ptr(into + split.block_offset(q) as u64),
                                    split.block_bytes(q),
                                    BYTES,
                                    q as c_int,
                                    comm,
                                    s,
                                )
                            });
                        }
                    }
                }
                Kind::ReduceScatter(_, split) => {
                    let from = if split.contiguous() {
                        b.send
                    } else {
                        b.staging
                    };
                    if split.equal() {
                        if split.block_bytes(0) > 0 {
                            call(unsafe {
                                (lib.reduce_scatter)(
                                    ptr(from),
                                    ptr(b.recv),
                                    split.block_bytes(0) / elem,
                                    ty,
                                    op,
                                    comm,
                                    s,
                                )
                            });
                        }
                    } else {
                        for q in (0..n).filter(|&q| split.block_bytes(q) > 0) {
                            call(unsafe {
                                (lib.reduce)(
                                    ptr(from + split.block_offset(q) as u64),
                                    if q == r { ptr(b.recv) } else { ptr(0) },
                                    split.block_bytes(q) / elem,
                                    ty,
                                    op,
                                    q as c_int,
                                    comm,
                                    s,
                                )
                            });
                        }
                    }
                }
            }
        }
        // SAFETY: ends the group started above (always, even after a
        // failed call, as NCCL requires).
        let end = unsafe { (lib.group_end)() };
        if let Some(code) = first_error.or((end != 0).then_some(end)) {
            // Aborted (dropped): they may hold half a collective.
            cache.remove(set);
            return Err(nccl_error(lib, what, code));
        }
    }
    Ok(())
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
