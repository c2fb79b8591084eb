//! NCCL itself: the library loaded at run time, its functions, its error
//! texts, and the reductions and element types it has.

use super::*;

/// NCCL's `ncclRedOp_t` for `op`.
pub(super) fn nccl_op(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Mean => 4,
    }
}

/// `ncclComm_t`.
pub(super) type Comm = *mut c_void;
/// `cudaStream_t`: the driver's `CUstream`.
pub(super) type Stream = *mut c_void;
/// `ncclResult_t` (a C enum: an int; read as one, never as a Rust enum, so
/// a code this file does not know is still a value).
pub(super) type Res = c_int;

pub(super) type AllReduceFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res;
pub(super) type BroadcastFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> Res;
pub(super) type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    Comm,
    Stream,
) -> Res;
pub(super) type AllGatherFn =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> Res;

/// NCCL's functions that Tessera calls, from the loaded library (which is
/// kept: the pointers live as long as it does).
pub(super) struct Nccl {
    pub(super) file: String,
    pub(super) version: (u32, u32, u32),
    pub(super) get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    /// NCCL 2.13 and later.
    pub(super) get_last_error: Option<unsafe extern "C" fn(Comm) -> *const c_char>,
    pub(super) comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Res,
    pub(super) comm_abort: unsafe extern "C" fn(Comm) -> Res,
    pub(super) group_start: unsafe extern "C" fn() -> Res,
    pub(super) group_end: unsafe extern "C" fn() -> Res,
    pub(super) all_reduce: AllReduceFn,
    pub(super) reduce_scatter: AllReduceFn,
    pub(super) broadcast: BroadcastFn,
    pub(super) reduce: ReduceFn,
    pub(super) all_gather: AllGatherFn,
    pub(super) _lib: libloading::Library,
}

/// The functions a library must have to be used (`ncclGetLastError` is
/// optional).
pub(super) const SYMBOLS: [&str; 11] = [
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
pub(super) fn candidates() -> Vec<String> {
    match std::env::var(LIBRARY_ENV) {
        Ok(f) if !f.is_empty() => vec![f],
        _ => vec!["libnccl.so.2".to_string(), "libnccl.so".to_string()],
    }
}

/// E0721 for a library that cannot be used, `why` in the message.
pub(super) fn unusable(why: String) -> ExecError {
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
pub(super) unsafe fn symbol<T: Copy>(
    lib: &libloading::Library,
    name: &str,
) -> Result<T, ExecError> {
    // SAFETY: the caller's contract: `T` is the symbol's type.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|_| unusable(format!("NCCL's `{name}` is missing")))
}

/// `ncclGetVersion`'s code as (major, minor, patch): `MAJOR * 10000 +
/// MINOR * 100 + PATCH` from 2.9, `MAJOR * 1000 + MINOR * 100 + PATCH`
/// before.
pub(super) fn version_of(code: c_int) -> (u32, u32, u32) {
    let v = code.max(0) as u32;
    if v >= 10000 {
        (v / 10000, (v % 10000) / 100, v % 100)
    } else {
        (v / 1000, (v % 1000) / 100, v % 100)
    }
}

/// NCCL from the first of `names` that loads: E0721 when none does, or it
/// lacks NCCL's functions, or it is older than 2.10.
pub(super) fn load(names: &[String]) -> Result<Nccl, ExecError> {
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
pub(super) fn library() -> Result<&'static Nccl, ExecError> {
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
pub(super) fn result_name(code: Res) -> String {
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
pub(super) fn c_text(p: *const c_char) -> Option<String> {
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
pub(super) fn nccl_error(lib: &Nccl, what: &str, code: Res) -> ExecError {
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

/// NCCL's `ncclDataType_t` for reducing `dtype` with `op`; E0721 for what
/// NCCL cannot reduce (f8 is checked against the library and the GPUs by
/// [`check_f8`]).
pub(super) fn reduce_type(dtype: DType, op: ReduceOp) -> Result<c_int, ExecError> {
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
pub(super) fn check_f8(
    lib: &Nccl,
    gpus: &[Arc<Gpu>],
    dtype: DType,
    op: ReduceOp,
) -> Result<(), ExecError> {
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
