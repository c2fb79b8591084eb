//! Execution on NVIDIA GPUs through the CUDA driver API (cudarc, with
//! `libcuda` loaded at run time, so every build runs without CUDA or a GPU).
//!
//! * [`Gpu::open`] makes a context on one device and picks the arch to
//!   compile for from its compute capability
//!   ([`Arch::for_compute_capability`]).
//! * [`Gpu::launch`] runs a specialised Tile IR kernel: Target IR for the
//!   device's arch, PTX, a cubin (loaded modules are kept by their PTX; a
//!   cubin comes from the disk cache, [`disk_cache`], else from the driver's
//!   JIT, [`jit`], and is stored there), then the kernel runs on the tensors'
//!   device copies. A tensor's elements are copied to the GPU at its first
//!   launch there and stay; they are copied back only when the host reads
//!   them (see `exec::tensor::Storage`). Arguments that share storage share
//!   the device copy, as they share memory on the CPU.
//! * [`Gpu::measured`] gives the driver's account of the variant of a kernel
//!   that last ran: registers, local memory, spills and occupancy.
//!
//! Kernel parameters are Target IR's (`ir::target::lower`'s `params`): the
//! Tile IR parameters in order (a tensor is its base pointer; tensors are
//! contiguous and row-major), then the run-time dims as 32-bit integers.
//!
//! Device memory comes from a caching allocator (`memory`). Every device
//! copy is a whole allocation, so tensor base pointers are always 256-byte
//! aligned (what the kernels' vector accesses assume).

pub mod disk_cache;
mod gate;
pub mod jit;
mod memory;
pub mod nccl;
mod tensor_map;
pub use memory::MemoryStats;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUfunction_attribute, CUresult};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream, DriverError, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::autotune::Tuned;
use super::cpu::Arg;
use super::tensor::DeviceBuffer;
use super::{ExecError, Interrupt};
use crate::backend::ptxas;
use crate::check::DType;
use crate::ir::target::{Param as TargetParam, RegTy};
use crate::ir::tile::{Dim, Kernel, ParamKind};
use crate::target::Arch;

/// The kernels the driver compiled for this device, by their PTX.
type Modules = HashMap<String, Arc<Loaded>>;

/// Loaded kernels by the address of the Tile IR they came from, each held
/// (so its address is not reused while it is a key): a launch of a kernel
/// launched before neither lowers it nor prints its PTX again, nor compares
/// kernels.
type Recent = HashMap<usize, (Arc<Kernel>, Arc<Loaded>)>;

/// Cubins compiled ahead of their first launch, by PTX text, with ptxas's
/// report ([`Gpu::compile_ahead`]).
type Ahead = HashMap<String, (Vec<u8>, Vec<ptxas::FunctionInfo>)>;

/// Target IR and PTX lowered ahead of a launch ([`Gpu::compile_ahead`]), by
/// the address of the Tile IR kernel they came from, which each holds (so
/// the address is not reused while it is a key): the launch takes them
/// instead of lowering the kernel again.
type Lowered = HashMap<usize, (Arc<Kernel>, crate::ir::target::Kernel, String)>;

/// Beyond this many kernels, [`Recent`] starts afresh.
const RECENT_CAP: usize = 256;

/// One NVIDIA GPU with a context and a stream of its own.
pub struct Gpu {
    info: GpuInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: Mutex<Modules>,
    recent: Mutex<Recent>,
    /// This session's autotuning choices: kernel name, tuning identity and
    /// result (see `exec::autotune`).
    tuned: Mutex<Vec<(String, String, Tuned)>>,
    pool: Arc<memory::Pool>,
    /// A sticky error left the context unusable (see [`Gpu::reopen`]).
    broken: AtomicBool,
    /// The kernels' summed run time, in nanoseconds (CUDA events around each
    /// launch): what `:time` shows as the time on the GPU.
    kernel_ns: AtomicU64,
    /// How many kernels were launched.
    launch_count: AtomicU64,
    /// The events around each launch and the gate that holds the stream
    /// while a launch is queued (made at the first launch).
    events: Mutex<Option<Timing>>,
    /// The module (`Loaded::id`) of each kernel's variant that last ran, by
    /// the kernel's name.
    last_run: Mutex<HashMap<String, u64>>,
    /// Where cubins are kept between processes (`None`: memory only).
    cache_dir: Option<PathBuf>,
    /// Cubins ptxas made ahead of their first launch ([`Gpu::compile_ahead`]),
    /// by PTX text, with ptxas's report.
    ahead: Mutex<Ahead>,
    /// Kernels those were lowered from, until launched.
    lowered: Mutex<Lowered>,
    /// `TESSERA_GPU_TRAP`: the kernel whose launches trap (see [`TRAP_ENV`]).
    trap_kernel: Option<String>,
    /// The driver's version, part of the disk cache's key.
    driver_version: i32,
    /// The occupancy's denominator.
    max_threads_per_sm: u32,
    counters: Counters,
    /// The communication stream and the collectives' timings (`nccl`).
    comm: nccl::PerGpu,
}

/// The events around each launch and the stream's gate (see [`gate`]).
struct Timing {
    started: CudaEvent,
    done: CudaEvent,
    gate: Option<gate::Gate>,
}

/// Device copies of the tensors a kernel writes (see [`Gpu::save_written`]).
pub(crate) struct SavedTensors(Vec<(super::Tensor, Box<dyn DeviceBuffer>)>);

/// Numbers the contexts made in this process (tensors' device copies name
/// the one that holds them).
static CONTEXTS: AtomicU64 = AtomicU64::new(1);

/// How loads of kernels were served, for tests and `:device`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Launches whose kernel was already loaded in this process.
    pub memory_hits: u64,
    /// Kernels loaded from a cubin in the disk cache.
    pub disk_hits: u64,
    /// Kernels the driver's JIT compiled.
    pub compiles: u64,
}

#[derive(Default)]
struct Counters {
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    compiles: AtomicU64,
}

/// What the driver says about a loaded kernel, at the block size and
/// dynamic shared memory its launches use.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub kernel: String,
    /// Registers per thread (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
    pub regs: u32,
    /// Local memory per thread, bytes: the stack frame, spills included.
    pub local_bytes: u32,
    /// Static shared memory per block, bytes.
    pub static_smem_bytes: u32,
    /// Dynamic shared memory per block at launch, bytes.
    pub dynamic_smem_bytes: u32,
    /// The most threads a block of this kernel may have.
    pub max_threads_per_block: u32,
    /// Threads per block at launch.
    pub threads: u32,
    /// Blocks that fit on one SM at once
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
    pub blocks_per_sm: u32,
    pub max_threads_per_sm: u32,
    /// Bytes of spill stores and loads per thread, as ptxas reported them
    /// when the cubin was compiled (`None`: the JIT did not say).
    pub spill_stores: Option<u64>,
    pub spill_loads: Option<u64>,
}

impl Measured {
    /// The fraction of the SM's threads the resident blocks fill.
    pub fn occupancy(&self) -> f64 {
        if self.max_threads_per_sm == 0 {
            return 0.0;
        }
        (self.blocks_per_sm as f64 * self.threads as f64 / self.max_threads_per_sm as f64).min(1.0)
    }
}

/// `measured on cuda:0 NVIDIA H100 80GB HBM3 (sm_90a): 128 regs, 0 B spilled,
/// 0 B local, occupancy 25% (2 blocks/SM)`: the line `:resources` prints
/// under its estimate.
pub fn measured_row(gpu: &GpuInfo, m: &Measured) -> String {
    let spilled = match m.spill_stores {
        Some(n) => format!("{n} B spilled"),
        None => "spills not reported".to_string(),
    };
    let percent = m.occupancy() * 100.0;
    format!(
        "measured on cuda:{} {} ({}): {} regs, {spilled}, {} B local, occupancy {}% ({} block{}/SM)",
        gpu.ordinal,
        gpu.name,
        gpu.arch,
        m.regs,
        m.local_bytes,
        if (percent - percent.round()).abs() < 0.05 {
            format!("{}", percent.round() as i64)
        } else {
            format!("{percent:.1}")
        },
        m.blocks_per_sm,
        if m.blocks_per_sm == 1 { "" } else { "s" }
    )
}

/// `kernel cache: ~/.cache/tessera/kernels: 2 compiled, 1 from disk, 40 reused`:
/// where compiled kernels are kept and how the launches so far got theirs
/// (`:device` prints it on a GPU).
pub fn cache_row(dir: Option<&Path>, stats: CacheStats) -> String {
    let place = match dir {
        Some(d) => d.display().to_string(),
        None => "in memory only (no cache folder; set TESSERA_CACHE_DIR)".to_string(),
    };
    format!(
        "kernel cache: {place}: {} compiled, {} from disk, {} reused",
        stats.compiles, stats.disk_hits, stats.memory_hits
    )
}

/// What the session shows of a GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    pub memory_bytes: usize,
    /// The arch kernels are compiled for.
    pub arch: Arch,
    /// The GPU's own arch where [`ARCH_ENV`] chose another for `arch`.
    pub own_arch: Option<Arch>,
}

impl std::fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ma, mi) = self.compute_capability;
        write!(
            f,
            "cuda:{} {} ({:.0} GiB, compute capability {ma}.{mi}, compiling for {}{})",
            self.ordinal,
            self.name,
            self.memory_bytes as f64 / (1u64 << 30) as f64,
            self.arch,
            match self.own_arch {
                Some(own) => format!(" as {ARCH_ENV} asks; its own is {own}"),
                None => String::new(),
            }
        )
    }
}

/// A kernel the driver loaded, with what its launches need.
struct Loaded {
    func: CudaFunction,
    params: Vec<TargetParam>,
    /// TMA tensor maps, encoded at each launch (after the dims).
    tensor_maps: Vec<crate::ir::target::TensorMap>,
    threads: u32,
    smem_bytes: u32,
    /// Tells loaded modules apart (their order of loading).
    id: u64,
    /// The Tile IR parameters the kernel writes (see `Kernel::written_params`).
    written: Vec<usize>,
    /// `None` when the driver would not say (the kernel still runs).
    measured: Option<Measured>,
}

/// Whether the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries to open the shared library (and
    // closes it); it calls nothing in it.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// E0721: no GPU to run on, with the reason in the help line (the message
/// is the same whatever the reason, as scripts and transcripts see it).
/// Every GPU the driver sees, described without making a context (which
/// would take a tenth of a second and memory on each): a GPU older than
/// sm_70 is a line saying so. E0721 without a driver.
pub fn list_gpus() -> Result<Vec<Result<GpuInfo, String>>, ExecError> {
    use cudarc::driver::result;
    if !driver_present() {
        return Err(unavailable("the CUDA driver (`libcuda`) cannot be loaded"));
    }
    let count = match result::init().and_then(|()| result::device::get_count()) {
        Ok(n) => n.max(0) as usize,
        // What `cuInit` and the count say when no GPU is visible.
        Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => 0,
        Err(e) => return Err(driver_error("counting the GPUs", e)),
    };
    let mut out = Vec::with_capacity(count);
    for ordinal in 0..count {
        let what = |e: DriverError| driver_error(&format!("describing GPU cuda:{ordinal}"), e);
        let dev = result::device::get(ordinal as i32).map_err(what)?;
        let name = result::device::get_name(dev).map_err(what)?;
        // SAFETY: `dev` is a device handle the driver just gave for an
        // ordinal below its count; these calls only read its attributes.
        let (memory_bytes, major, minor) = unsafe {
            (
                result::device::total_mem(dev).map_err(what)?,
                result::device::get_attribute(
                    dev,
                    CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                )
                .map_err(what)?,
                result::device::get_attribute(
                    dev,
                    CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                )
                .map_err(what)?,
            )
        };
        out.push(match arch_for(&name, (major, minor)) {
            Ok((arch, own_arch)) => Ok(GpuInfo {
                ordinal,
                name,
                compute_capability: (major, minor),
                memory_bytes,
                arch,
                own_arch,
            }),
            Err(why) => Err(format!("cuda:{ordinal} {name} ({why})")),
        });
    }
    Ok(out)
}

fn unavailable(reason: impl Into<String>) -> ExecError {
    ExecError::new("E0721", "no CUDA GPU is available").with_help(format!(
        "{}; run on the CPU: `--device cpu` or `:device cpu`",
        reason.into()
    ))
}

/// The driver's name for an error (`CUDA_ERROR_OUT_OF_MEMORY`).
fn error_name(e: &DriverError) -> String {
    e.error_name()
        .ok()
        .and_then(|n| n.to_str().ok().map(str::to_string))
        .unwrap_or_else(|| format!("{:?}", e.0))
}

/// A driver error as a diagnostic: E0730 naming what failed, with the
/// driver's name for the error.
fn driver_error(what: &str, e: DriverError) -> ExecError {
    let name = error_name(&e);
    let text = e
        .error_string()
        .ok()
        .and_then(|n| n.to_str().ok().map(str::to_string))
        .unwrap_or_default();
    let help = match e.0 {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            "the GPU's memory is full: free tensors, or use smaller shapes".to_string()
        }
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS | CUresult::CUDA_ERROR_LAUNCH_FAILED => {
            "the kernel accessed memory outside its tensors; run it with `--device cpu` to see \
             which access (the CPU executor checks bounds)"
                .to_string()
        }
        _ => "see the CUDA driver's documentation of this error".to_string(),
    };
    ExecError::new(
        "E0730",
        format!("{what} failed on the GPU: {name}{}", {
            if text.is_empty() {
                String::new()
            } else {
                format!(" ({text})")
            }
        }),
    )
    .with_help(help)
}

/// A failed compile as E0730, with the JIT's error log in the help line.
/// E0730 for PTX that ptxas refused, with its first lines of message.
fn ptxas_error(kernel: &str, message: &str) -> ExecError {
    let log: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(4)
        .collect();
    ExecError::new(
        "E0730",
        format!("compiling kernel `{kernel}` with ptxas failed"),
    )
    .with_help(format!(
        "ptxas says: {}; the PTX Tessera emitted does not compile: this is a compiler bug, \
         please report it with the kernel; meanwhile run on the CPU: `--device cpu`",
        log.join(" | ")
    ))
}

/// The `ptxas` this process compiles with (looked for once).
fn process_ptxas() -> Option<&'static ptxas::Installed> {
    static FOUND: std::sync::OnceLock<Option<ptxas::Installed>> = std::sync::OnceLock::new();
    FOUND.get_or_init(ptxas::find).as_ref()
}

fn jit_error(kernel: &str, e: jit::LinkError) -> ExecError {
    let advice = match e.error.0 {
        CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => {
            "the NVIDIA driver is older than the PTX Tessera emits: update the driver, or run \
             on the CPU: `--device cpu`"
        }
        _ => {
            "the PTX Tessera emitted does not compile: this is a compiler bug, please report \
             it with the kernel; meanwhile run on the CPU: `--device cpu`"
        }
    };
    // The log's first lines, on the help's one line.
    let log: Vec<&str> = e
        .log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(4)
        .collect();
    let help = if log.is_empty() {
        advice.to_string()
    } else {
        format!("the driver's JIT says: {}; {advice}", log.join(" | "))
    };
    driver_error(
        &format!("compiling kernel `{kernel}` (the driver's JIT)"),
        e.error,
    )
    .with_help(help)
}

impl Gpu {
    /// A context on GPU `ordinal`; E0721 when there is no driver, no such
    /// GPU, or one older than sm_70.
    pub fn open(ordinal: usize) -> Result<Gpu, ExecError> {
        if !driver_present() {
            return Err(unavailable("the CUDA driver (`libcuda`) cannot be loaded"));
        }
        let count = CudaContext::device_count().map_err(|e| {
            unavailable(match e.0 {
                // What `cuInit` says when no GPU is visible (none, or all
                // hidden by `CUDA_VISIBLE_DEVICES`).
                CUresult::CUDA_ERROR_NO_DEVICE => {
                    "the CUDA driver finds no GPU (`CUDA_VISIBLE_DEVICES` may hide them)"
                        .to_string()
                }
                _ => format!("the CUDA driver cannot list its GPUs ({})", error_name(&e)),
            })
        })?;
        if ordinal >= count.max(0) as usize {
            return Err(unavailable(if count <= 0 {
                "the CUDA driver finds no GPU".to_string()
            } else {
                format!("there is no GPU cuda:{ordinal}: the driver finds {count}")
            }));
        }
        // The device's primary context: NCCL launches its kernels there (it
        // knows no other), and kernels of two contexts on one GPU take turns
        // instead of running at once, so a collective could not overlap the
        // executor's kernels from a context of our own. A sticky error in
        // it is answered by a new process (see `reopen`).
        let ctx = CudaContext::new(ordinal)
            .and_then(|ctx| {
                // A context left unusable by an earlier fault answers this
                // with its error.
                // SAFETY: `new` made the context current on this thread.
                match unsafe { cudarc::driver::sys::cuCtxSynchronize() } {
                    CUresult::CUDA_SUCCESS => Ok(ctx),
                    e => Err(DriverError(e)),
                }
            })
            .map_err(|e| match e.0 {
                // What the driver answers in a process where a kernel
                // faulted: no usable context, however long one waits, until
                // the process ends (checked on driver 580 with an H200: a
                // fresh context, one made on another thread and a reset of
                // the primary one all fail).
                CUresult::CUDA_ERROR_LAUNCH_FAILED
                | CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
                | CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
                | CUresult::CUDA_ERROR_MISALIGNED_ADDRESS
                | CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR
                | CUresult::CUDA_ERROR_INVALID_PC
                | CUresult::CUDA_ERROR_ASSERT => unavailable(format!(
                    "a kernel's fault ({}) left the CUDA driver unusable in this process; \
                     restart tessera to use the GPU again",
                    error_name(&e)
                )),
                _ => driver_error("making a context", e),
            })?;
        let name = ctx.name().map_err(|e| driver_error("naming the GPU", e))?;
        let cc = ctx
            .compute_capability()
            .map_err(|e| driver_error("reading the compute capability", e))?;
        let memory_bytes = ctx
            .total_mem()
            .map_err(|e| driver_error("reading the memory size", e))?;
        let (arch, own_arch) =
            arch_for(&name, cc).map_err(|why| unavailable(format!("{name}: {why}")))?;
        // SAFETY: every launch and copy of this `Gpu` goes to its one stream,
        // which orders them: cudarc's per-buffer events (for several streams)
        // are not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let driver_version =
            jit::driver_version().map_err(|e| driver_error("reading the driver's version", e))?;
        let max_threads_per_sm = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
            .map_err(|e| driver_error("reading the threads an SM holds", e))?
            .max(0) as u32;
        let pool = memory::Pool::new(
            ctx.clone(),
            stream.clone(),
            CONTEXTS.fetch_add(1, Ordering::Relaxed),
        );
        Ok(Gpu {
            info: GpuInfo {
                ordinal,
                name,
                compute_capability: cc,
                memory_bytes,
                arch,
                own_arch,
            },
            ctx,
            stream,
            modules: Mutex::new(HashMap::new()),
            recent: Mutex::new(HashMap::new()),
            ahead: Mutex::new(HashMap::new()),
            lowered: Mutex::new(HashMap::new()),
            tuned: Mutex::new(Vec::new()),
            pool,
            broken: AtomicBool::new(false),
            kernel_ns: AtomicU64::new(0),
            launch_count: AtomicU64::new(0),
            events: Mutex::new(None),
            last_run: Mutex::new(HashMap::new()),
            cache_dir: disk_cache::default_dir(),
            trap_kernel: std::env::var(TRAP_ENV).ok().filter(|k| !k.is_empty()),
            driver_version,
            max_threads_per_sm,
            counters: Counters::default(),
            comm: nccl::PerGpu::default(),
        })
    }

    /// This GPU keeping cubins in `dir` (`None`: in memory only) instead of
    /// [`disk_cache::default_dir`].
    pub fn with_cache_dir(mut self, dir: Option<PathBuf>) -> Gpu {
        self.cache_dir = dir;
        self
    }

    /// The summed run time of every kernel launched so far, measured on the
    /// GPU (CUDA events around each launch): host work and copies excluded.
    pub fn kernel_time(&self) -> Duration {
        Duration::from_nanos(self.kernel_ns.load(Ordering::Relaxed))
    }

    /// How many kernels were launched so far.
    pub fn launches(&self) -> u64 {
        self.launch_count.load(Ordering::Relaxed)
    }

    /// The summed run time of the collectives issued on this GPU so far
    /// (`nccl`), measured on the GPU (events, each from the moment its inputs
    /// were ready or the previous collective ended): the sibling of
    /// [`Gpu::kernel_time`], which does not include them. Waits for the
    /// collectives still running.
    pub fn collective_time(&self) -> Duration {
        self.comm.settle();
        self.comm.time()
    }

    /// Waits for the collectives issued on this GPU that are still running
    /// (their time is summed at the next [`Gpu::collective_time`]).
    pub fn wait_collectives(&self) {
        self.comm.wait();
    }

    /// How many collectives were issued on this GPU so far.
    pub fn collectives(&self) -> u64 {
        self.comm.count()
    }

    /// Which context this is: tensors' device copies name it.
    pub fn owner(&self) -> u64 {
        self.pool.owner()
    }

    /// Whether a sticky error (an illegal address, a trap) left the context
    /// unusable: every later call on it fails, and the device copies it
    /// held are lost.
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// The GPU again after a sticky error. `old` must be the last holder of
    /// its `Gpu` (tensors hold their blocks' pool weakly). The primary
    /// context stays broken after a kernel's fault (E0721 says to restart:
    /// see `open`); after an error that did not break it, this is a
    /// working `Gpu` with an empty memory pool.
    pub fn reopen(old: Arc<Gpu>) -> Result<Gpu, ExecError> {
        old.pool.mark_dead();
        let ordinal = old.info.ordinal;
        if Arc::strong_count(&old) > 1 {
            return Err(
                ExecError::new("E0730", "the GPU's broken context is still in use")
                    .with_help(CHECKED),
            );
        }
        let cache_dir = old.cache_dir.clone();
        drop(old);
        Gpu::open(ordinal).map(|g| g.with_cache_dir(cache_dir))
    }

    /// A driver error of a launch as a diagnostic; notes a sticky error
    /// (the context answers every later call with an error).
    fn failed(&self, what: &str, e: DriverError) -> ExecError {
        let sticky = self.ctx.bind_to_thread().is_err()
            // SAFETY: the context is current on this thread.
            || unsafe { cudarc::driver::sys::cuCtxSynchronize() } != CUresult::CUDA_SUCCESS;
        let err = driver_error(what, e);
        if sticky {
            self.broken.store(true, Ordering::Relaxed);
            let help = err.help.clone().unwrap_or_default();
            err.with_help(format!(
                "{help}; the error left the GPU's context unusable (the tensors only on the GPU \
                 are lost)"
            ))
        } else {
            err
        }
    }

    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// The folder of the disk cache of compiled kernels, if there is one.
    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    /// How the kernels launched so far were loaded.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            memory_hits: self.counters.memory_hits.load(Ordering::Relaxed),
            disk_hits: self.counters.disk_hits.load(Ordering::Relaxed),
            compiles: self.counters.compiles.load(Ordering::Relaxed),
        }
    }

    /// The driver's measurements of the variant of `kernel` that last ran
    /// on this GPU, when that variant is `kernel` (its run-time facts
    /// included): `None` if it has not run here, another variant or
    /// definition of the same name ran last, or the driver would not say.
    pub fn measured(&self, kernel: &Kernel) -> Option<Measured> {
        let last = *self
            .last_run
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&kernel.name)?;
        // `kernel` is the variant that ran when it compiles to that module.
        let target = crate::ir::target::lower(kernel, self.info.arch).ok()?;
        let ptx = crate::backend::ptx::kernel_text(&target)
            .and_then(|k| crate::backend::ptx::module_of(self.info.arch, &[k]))
            .ok()?;
        let modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        let loaded = modules.get(&ptx).filter(|l| l.id == last)?;
        loaded.measured.clone()
    }

    /// What the caching allocator has done.
    /// The autotuning result of tuning identity `id`, if this session has it.
    pub(crate) fn tuned(&self, id: &str) -> Option<Tuned> {
        let t = self.tuned.lock().unwrap_or_else(|p| p.into_inner());
        t.iter()
            .find(|(_, i, _)| i == id)
            .map(|(_, _, r)| r.clone())
    }

    pub(crate) fn remember_tuned(&self, name: &str, id: &str, result: Tuned) {
        let mut t = self.tuned.lock().unwrap_or_else(|p| p.into_inner());
        t.retain(|(_, i, _)| i != id);
        t.push((name.to_string(), id.to_string(), result));
    }

    /// The autotuning results of kernel `name` in this session, oldest first.
    pub fn tuned_of(&self, name: &str) -> Vec<Tuned> {
        let t = self.tuned.lock().unwrap_or_else(|p| p.into_inner());
        t.iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, _, r)| r.clone())
            .collect()
    }

    /// Device copies of the tensors `kernel` writes, to put back with
    /// [`Gpu::restore_written`] after trial launches.
    pub(crate) fn save_written(
        &self,
        kernel: &Kernel,
        args: &[Arg],
    ) -> Result<SavedTensors, ExecError> {
        let mut saved = Vec::new();
        for i in kernel.written_params() {
            if let Some(Arg::Tensor(t)) = args.get(i) {
                if saved
                    .iter()
                    .any(|(s, _): &(super::Tensor, _)| s.same_storage(t))
                {
                    continue;
                }
                let bytes = t.numel() * t.dtype().bytes() as usize;
                let src = self.device_address(t)?;
                let copy = self.pool.alloc(bytes)?;
                self.copy_on_device(copy.address(), src, bytes)?;
                saved.push((t.clone(), copy));
            }
        }
        Ok(SavedTensors(saved))
    }

    /// Puts back what [`Gpu::save_written`] saved.
    pub(crate) fn restore_written(&self, saved: SavedTensors) -> Result<(), ExecError> {
        for (t, copy) in saved.0 {
            let bytes = t.numel() * t.dtype().bytes() as usize;
            let dst = self.device_address(&t)?;
            self.copy_on_device(dst, copy.address(), bytes)?;
            t.storage.device_written();
        }
        Ok(())
    }

    fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<(), ExecError> {
        if bytes == 0 {
            return Ok(());
        }
        let what = "copying a tensor on the GPU";
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error(what, e))?;
        // SAFETY: both are live blocks of this context of at least `bytes`
        // bytes (a tensor's device copy and a block allocated for it); the
        // stream orders the copy with the launches around it.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream())
        }
        .map_err(|e| self.failed(what, e))
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.pool.stats()
    }

    /// Frees the allocator's cached blocks.
    pub fn empty_cache(&self) {
        self.pool.empty_cache()
    }

    /// A tensor of zeros made on this GPU (the host's copy costs nothing
    /// until the host reads it).
    pub fn zeros(&self, shape: &[usize], dtype: DType) -> Result<super::Tensor, ExecError> {
        super::Tensor::zeros_on_device(shape, dtype, |bytes| self.alloc_for(shape, dtype, bytes))
    }

    /// A block for a tensor of `shape` and `dtype` (`bytes` long): E0713
    /// naming the GPU's memory when it is full.
    fn alloc_for(
        &self,
        shape: &[usize],
        dtype: DType,
        bytes: usize,
    ) -> Result<Box<dyn DeviceBuffer>, ExecError> {
        self.pool.alloc(bytes).map_err(|e| {
            if !e.message.contains("CUDA_ERROR_OUT_OF_MEMORY") {
                return e;
            }
            // E0713 as on the host, naming the GPU's memory.
            let free = self.ctx.mem_get_info().ok();
            let mut err = super::tensor::out_of_memory(shape, dtype, bytes, None);
            err.help = Some(match free {
                Some((free, total)) => format!(
                    "only {} of the GPU's {} is free on the GPU (after giving back the blocks kept for reuse); use smaller tensors, or let go of some",
                    super::tensor::human_bytes(free as u64),
                    super::tensor::human_bytes(total as u64)
                ),
                None => "the GPU's memory is full; use smaller tensors, or let go of some".to_string(),
            });
            err
        })
    }

    /// Copies `t`'s elements to this GPU (if they are not there already),
    /// where its next launches find them.
    pub fn to_device(&self, t: &super::Tensor) -> Result<(), ExecError> {
        self.device_address(t).map(|_| ())
    }

    /// Tensor map `m` of a launch of `kernel` with `args`, encoded over its
    /// tensor argument (E0711 where TMA cannot address the tensor: a row
    /// stride not a multiple of 16 bytes, which the kernel's alignment
    /// facts exclude, so only a kernel launched against its facts meets it).
    fn tensor_map(
        &self,
        kernel: &Kernel,
        m: &crate::ir::target::TensorMap,
        args: &[Arg],
    ) -> Result<tensor_map::Encoded, ExecError> {
        let what = || format!("the tensor map of `{}` in `{}`", m.name, kernel.name);
        let Some(Arg::Tensor(t)) = args.get(m.tensor) else {
            return Err(
                ExecError::new("E0707", format!("{}: no tensor argument", what()))
                    .with_help(CHECKED),
            );
        };
        let tiled = tensor_map::tiled(m, t.shape(), t.dtype()).map_err(|e| {
            ExecError::new("E0711", format!("{}: {e}", what())).with_help(
                "TMA copies need rows whose bytes are a multiple of 16; compile without the alignment facts (`-D`) that promised them",
            )
        })?;
        let addr = self.device_address(t)?;
        if tiled.empty {
            // SAFETY: `addr` is a live block of this context of at least 512
            // bytes (`memory::block_size`) holding no element of the empty
            // tensor; zeroing its first 16 on the launch's stream orders the
            // write before the kernel.
            let r = unsafe {
                cudarc::driver::sys::cuMemsetD8Async(addr, 0, 16, self.stream.cu_stream())
            };
            if r != CUresult::CUDA_SUCCESS {
                return Err(driver_error(&what(), cudarc::driver::DriverError(r)));
            }
        }
        tensor_map::encode(&tiled, addr)
            .map_err(|e| driver_error(&what(), cudarc::driver::DriverError(e)))
    }

    /// The device address of `t`'s up-to-date elements on this GPU.
    fn device_address(&self, t: &super::Tensor) -> Result<u64, ExecError> {
        let pool = &self.pool;
        t.storage
            .device_address(pool.owner(), |bytes| pool.alloc(bytes))
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The loaded kernel for `kernel`, found by its address when it was
    /// launched before.
    fn launchable(&self, kernel: &Arc<Kernel>) -> Result<Arc<Loaded>, ExecError> {
        let key = Arc::as_ptr(kernel) as usize;
        let recent = self.recent().get(&key).map(|(_, l)| l.clone());
        let l = match recent {
            Some(l) => {
                self.counters.memory_hits.fetch_add(1, Ordering::Relaxed);
                l
            }
            None => {
                let l = self.loaded(kernel)?;
                let mut r = self.recent();
                if r.len() >= RECENT_CAP {
                    r.clear();
                }
                r.insert(key, (kernel.clone(), l.clone()));
                l
            }
        };
        self.note_run(kernel, &l);
        Ok(l)
    }

    /// The loaded kernel for `kernel` (compiled and loaded on first use).
    fn loaded(&self, kernel: &Kernel) -> Result<Arc<Loaded>, ExecError> {
        let early = self
            .lowered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(kernel as *const Kernel as usize));
        let (target, ptx) = match early {
            Some((_, target, ptx)) => (target, ptx),
            None => self.ptx_of(kernel)?,
        };
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = modules.get(&ptx) {
            self.counters.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(l.clone());
        }
        let (module, info) = self.module(&kernel.name, &target.name, &ptx)?;
        let func = module
            .load_function(&target.name)
            .map_err(|e| driver_error(&format!("loading kernel `{}`", kernel.name), e))?;
        let smem_bytes = target.smem_bytes();
        let dynamic_smem = if smem_bytes > crate::backend::ptx::MAX_STATIC_SMEM {
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem_bytes as i32,
            )
            .map_err(|e| {
                driver_error(
                    &format!("giving kernel `{}` its shared memory", kernel.name),
                    e,
                )
            })?;
            smem_bytes
        } else {
            0
        };
        let measured = self.measure(&func, &kernel.name, target.num_threads, dynamic_smem, &info);
        let entry = Arc::new(Loaded {
            func,
            params: target.params.clone(),
            tensor_maps: target.tensor_maps.clone(),
            threads: target.num_threads,
            smem_bytes,
            id: modules.len() as u64,
            written: kernel.written_params(),
            measured,
        });
        modules.insert(ptx, entry.clone());
        Ok(entry)
    }

    /// `kernel` lowered for this GPU's arch, and its PTX module.
    fn ptx_of(&self, kernel: &Kernel) -> Result<(crate::ir::target::Kernel, String), ExecError> {
        let target = crate::ir::target::lower(kernel, self.info.arch).map_err(|u| {
            ExecError::new(
                "E0709",
                format!(
                    "kernel `{}` cannot be compiled for {}: {}",
                    kernel.name, self.info.arch, u.message
                ),
            )
            .with_help(
                u.too_large
                    .unwrap_or_else(|| "run it on the CPU: `--device cpu`".to_string()),
            )
        })?;
        // A GPU's arch is an NVIDIA one (`Arch::for_compute_capability`).
        let ptx = crate::backend::ptx::kernel_text(&target)
            .and_then(|k| crate::backend::ptx::module_of(self.info.arch, &[k]))
            .map_err(|e| {
                ExecError::new(
                    "E0709",
                    format!("kernel `{}` cannot be compiled: {e}", kernel.name),
                )
                .with_help("run it on the CPU: `--device cpu`")
            })?;
        Ok((target, ptx))
    }

    /// The module of `ptx` (whose kernel is `entry`), with what ptxas
    /// reported when it compiled it: the cubin from the disk cache, else
    /// compiled by ptxas (see `ptxas`) and stored there; without a ptxas (or
    /// a cubin the driver refuses), the driver's JIT, whose results the
    /// driver keeps in its own cache.
    fn module(
        &self,
        kernel: &str,
        entry: &str,
        ptx: &str,
    ) -> Result<(Arc<CudaModule>, jit::JitInfo), ExecError> {
        let Some(ptxas) = process_ptxas() else {
            return self.driver_jit(kernel, ptx);
        };
        let key = self.cache_key(ptxas, ptx);
        if let Some(dir) = &self.cache_dir {
            if let Some(cached) = disk_cache::load(dir, &key) {
                // A cubin the driver refuses (damaged in a way the digest
                // misses) is compiled again and replaced, as a missing one.
                if let Ok(module) = self.ctx.load_module(Ptx::from_binary(cached.cubin)) {
                    self.counters.disk_hits.fetch_add(1, Ordering::Relaxed);
                    return Ok((module, cached.info));
                }
            }
        }
        let ahead = self.ahead_lock().remove(ptx);
        let (cubin, report) = ahead
            .map_or_else(|| ptxas::compile(&ptxas.path, ptx), Ok)
            .map_err(|e| {
                let message = match e {
                    ptxas::PtxasError::Rejected { stderr, .. } => stderr,
                    other => other.to_string(),
                };
                ptxas_error(kernel, &message)
            })?;
        let Ok(module) = self.ctx.load_module(Ptx::from_binary(cubin.clone())) else {
            // A ptxas newer than the driver, or a GPU newer than the arch.
            return self.driver_jit(kernel, ptx);
        };
        self.counters.compiles.fetch_add(1, Ordering::Relaxed);
        let info = report
            .iter()
            .find(|f| f.entry && f.name == entry)
            .map(jit::JitInfo::from)
            .unwrap_or_default();
        if let Some(dir) = &self.cache_dir {
            // Without a writable cache folder the cubin stays in memory only.
            let _ = disk_cache::store(
                dir,
                &key,
                &disk_cache::Entry {
                    info: info.clone(),
                    cubin,
                },
            );
        }
        Ok((module, info))
    }

    /// The disk cache's key of `ptx`: the device's own compute capability
    /// beside the arch (a cubin runs on its arch only), the ptxas that
    /// compiles and the driver.
    fn cache_key(&self, ptxas: &ptxas::Installed, ptx: &str) -> disk_cache::Key {
        let (major, minor) = self.info.compute_capability;
        let target = format!(
            "{} on sm_{major}{minor} by {}",
            self.info.arch, ptxas.version
        );
        disk_cache::Key::new(ptx, &target, self.driver_version)
    }

    fn ahead_lock(&self) -> std::sync::MutexGuard<'_, Ahead> {
        self.ahead.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Compiles `kernels` with ptxas in parallel, ahead of their first
    /// launches (an autotuning's configurations): each launch then only
    /// loads its cubin. Kernels loaded before, in the disk cache, or that
    /// fail to lower or compile are left to the launch, which reports the
    /// failure; without a ptxas nothing is done (the driver's JIT compiles
    /// at load).
    pub(crate) fn compile_ahead(&self, kernels: &[Arc<Kernel>]) {
        let Some(ptxas) = process_ptxas() else {
            return;
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let todo: Vec<&Arc<Kernel>> = kernels
            .iter()
            .filter(|k| !self.recent().contains_key(&(Arc::as_ptr(k) as usize)))
            .collect();
        if todo.len() < 2 || threads < 2 {
            return;
        }
        for chunk in todo.chunks(threads) {
            std::thread::scope(|s| {
                for k in chunk {
                    s.spawn(move || {
                        let Ok((target, ptx)) = self.ptx_of(k) else {
                            return;
                        };
                        self.lowered
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(Arc::as_ptr(k) as usize, ((*k).clone(), target, ptx.clone()));
                        let loaded = self
                            .modules
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .contains_key(&ptx);
                        let cached = self.cache_dir.as_ref().is_some_and(|dir| {
                            disk_cache::load(dir, &self.cache_key(ptxas, &ptx)).is_some()
                        });
                        if loaded || cached || self.ahead_lock().contains_key(&ptx) {
                            return;
                        }
                        if let Ok(compiled) = ptxas::compile(&ptxas.path, &ptx) {
                            self.ahead_lock().insert(ptx, compiled);
                        }
                    });
                }
            });
        }
    }

    /// The driver's whole-program JIT of `ptx` (`cuModuleLoadData`), which
    /// reports nothing of registers or spills; the linker's error log says
    /// why a compile failed.
    fn driver_jit(
        &self,
        kernel: &str,
        ptx: &str,
    ) -> Result<(Arc<CudaModule>, jit::JitInfo), ExecError> {
        match self.ctx.load_module(Ptx::from_src(ptx)) {
            Ok(module) => {
                self.counters.compiles.fetch_add(1, Ordering::Relaxed);
                Ok((module, jit::JitInfo::default()))
            }
            Err(e) => Err(match jit::link_ptx(&self.ctx, ptx) {
                Err(linked) => jit_error(kernel, linked),
                Ok(_) => driver_error(&format!("loading kernel `{kernel}`"), e),
            }),
        }
    }

    /// What the driver says of `func` launched with `threads` threads and
    /// `dynamic_smem` bytes of dynamic shared memory; `None` if any query
    /// fails (measuring never stops a launch).
    fn measure(
        &self,
        func: &CudaFunction,
        kernel: &str,
        threads: u32,
        dynamic_smem: u32,
        report: &jit::JitInfo,
    ) -> Option<Measured> {
        // `get_attribute` makes the context current, as the occupancy query
        // needs.
        let attr = |a: CUfunction_attribute| func.get_attribute(a).ok().map(|v| v.max(0) as u32);
        let regs = attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)?;
        let local_bytes = attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?;
        let static_smem_bytes = attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
        let max_threads_per_block =
            attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
        let blocks_per_sm = func
            .occupancy_max_active_blocks_per_multiprocessor(threads, dynamic_smem as usize, None)
            .ok()?;
        Some(Measured {
            kernel: kernel.to_string(),
            regs,
            local_bytes,
            static_smem_bytes,
            dynamic_smem_bytes: dynamic_smem,
            max_threads_per_block,
            threads,
            blocks_per_sm,
            max_threads_per_sm: self.max_threads_per_sm,
            // ptxas's report of the code that runs; without one (the
            // driver's JIT), no local memory at all means nothing spilled.
            spill_stores: report.spill_stores.or((local_bytes == 0).then_some(0)),
            spill_loads: report.spill_loads.or((local_bytes == 0).then_some(0)),
        })
    }

    /// Records that `loaded` is the variant of `kernel` that runs now.
    fn note_run(&self, kernel: &Kernel, loaded: &Loaded) {
        let mut last = self.last_run.lock().unwrap_or_else(|p| p.into_inner());
        match last.get_mut(&kernel.name) {
            Some(id) => *id = loaded.id,
            None => {
                last.insert(kernel.name.clone(), loaded.id);
            }
        }
    }

    /// Runs every program of `grid` of `kernel` on `args` (Tile IR parameter
    /// order) on this GPU; tensor arguments are written in place.
    pub fn launch(
        &self,
        kernel: &Arc<Kernel>,
        args: &[Arg],
        grid: [i64; 3],
        interrupt: &Interrupt,
    ) -> Result<(), ExecError> {
        interrupt.check()?;
        if args.len() != kernel.params.len() {
            return Err(ExecError::new(
                "E0707",
                format!(
                    "kernel `{}` takes {} run-time arguments, {} given",
                    kernel.name,
                    kernel.params.len(),
                    args.len()
                ),
            )
            .with_help(CHECKED));
        }
        // The CPU executor's check: E0703 for a grid the device cannot launch
        // (the driver would only say CUDA_ERROR_INVALID_VALUE).
        super::cpu::check_grid(&kernel.name, grid)?;
        if grid.contains(&0) {
            return Ok(());
        }
        fits_32_bit_offsets(kernel, args)?;
        // Within `MAX_GRID`, so each dim fits a u32.
        let grid_dim = (grid[0] as u32, grid[1] as u32, grid[2] as u32);
        if self.trap_kernel.as_deref() == Some(kernel.name.as_str()) {
            return self.trap(
                &launch_what(kernel, args, grid, kernel.num_warps * 32),
                interrupt,
            );
        }
        let loaded = self.launchable(kernel)?;
        let (params, threads, smem_bytes) = (&loaded.params, loaded.threads, loaded.smem_bytes);
        let mut values: Vec<ParamValue> = Vec::with_capacity(params.len());
        // A few dims at most: a list beats a map.
        let mut dims: Vec<(&str, i64)> = Vec::new();
        for (p, a) in kernel.params.iter().zip(args) {
            match (&p.kind, a) {
                (ParamKind::Tensor { dims: pd, dtype }, Arg::Tensor(t)) => {
                    if t.dtype() != *dtype || pd.len() != t.shape().len() {
                        return Err(ExecError::new(
                            "E0702",
                            format!(
                                "argument `{}` of `{}` must be a rank-{} {dtype} tensor, got {}",
                                p.name,
                                kernel.name,
                                pd.len(),
                                super::Value::Tensor(t.clone()).describe()
                            ),
                        )
                        .with_help(CHECKED));
                    }
                    for (d, &n) in pd.iter().zip(t.shape()) {
                        if let Dim::Dynamic(name) = d {
                            if !dims.iter().any(|(d, _)| d == name) {
                                dims.push((name.as_str(), n as i64));
                            }
                        }
                    }
                    values.push(ParamValue::U64(self.device_address(t)?));
                }
                (ParamKind::Scalar(d), Arg::Int(i)) => values.push(scalar(*d, *i as f64, *i)?),
                (ParamKind::Scalar(d), Arg::Float(x)) => {
                    values.push(scalar(*d, *x, super::float_to_int(*d, *x))?)
                }
                _ => {
                    return Err(ExecError::new(
                        "E0707",
                        format!(
                            "argument `{}` of `{}` has the wrong kind",
                            p.name, kernel.name
                        ),
                    )
                    .with_help(CHECKED))
                }
            }
        }
        for p in &params[kernel.params.len()..] {
            let n = dims
                .iter()
                .find(|(d, _)| *d == p.name)
                .map(|(_, n)| *n)
                .ok_or_else(|| {
                    ExecError::new(
                        "E0709",
                        format!("kernel `{}`: no tensor gives dim `{}`", kernel.name, p.name),
                    )
                    .with_help(CHECKED)
                })?;
            let n = i32::try_from(n).map_err(|_| {
                ExecError::new(
                    "E0711",
                    format!(
                        "dim `{}` = {n} of `{}` does not fit the 32-bit dims GPU kernels take",
                        p.name, kernel.name
                    ),
                )
                .with_help("split the tensor, or run on the CPU: `--device cpu`")
            })?;
            debug_assert_eq!(p.ty, RegTy::I32);
            values.push(ParamValue::I32(n));
        }
        for m in &loaded.tensor_maps {
            values.push(ParamValue::TensorMap(self.tensor_map(kernel, m, args)?));
        }
        let cfg = LaunchConfig {
            grid_dim,
            block_dim: (threads, 1, 1),
            shared_mem_bytes: if smem_bytes > crate::backend::ptx::MAX_STATIC_SMEM {
                smem_bytes
            } else {
                0
            },
        };
        let what = || launch_what(kernel, args, grid, threads);
        // Two events of this context, made once: creating them at every
        // launch cost microseconds of each launch.
        let mut timing = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if timing.is_none() {
            let make = || self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
            *timing = Some(Timing {
                started: make().map_err(|e| self.failed(&what(), e))?,
                done: make().map_err(|e| self.failed(&what(), e))?,
                // Where the driver cannot make one, launches are timed
                // without it (their submission included).
                gate: self
                    .ctx
                    .bind_to_thread()
                    .and_then(|()| gate::Gate::new())
                    .ok(),
            });
        }
        let Some(Timing {
            started,
            done,
            gate,
        }) = timing.as_mut()
        else {
            unreachable!("made above")
        };
        // Held until the kernel and the end event are queued, released on
        // every path out (the guard's drop), errors included.
        let held = gate.as_mut().and_then(|g| g.hold(self.stream.cu_stream()));
        started
            .record(&self.stream)
            .map_err(|e| self.failed(&what(), e))?;
        {
            let mut b = self.stream.launch_builder(&loaded.func);
            for v in &values {
                match v {
                    ParamValue::I32(x) => b.arg(x),
                    ParamValue::I64(x) => b.arg(x),
                    ParamValue::U64(x) => b.arg(x),
                    ParamValue::U32(x) => b.arg(x),
                    ParamValue::U16(x) => b.arg(x),
                    ParamValue::F32(x) => b.arg(x),
                    ParamValue::F64(x) => b.arg(x),
                    ParamValue::TensorMap(x) => b.arg(x),
                };
            }
            // SAFETY: the arguments are, in order, the values of the kernel's
            // PTX parameters with their PTX types (`values` follows Target
            // IR's `params`: a device pointer per tensor, scalars by dtype,
            // then the 32-bit dims, then the tensor maps by value, each
            // encoded over its tensor's address); each device address is a
            // live block of this context holding its tensor's elements, the extent the
            // kernel's bounds checks allow it to touch (the tensors are held
            // by `args` until the launch has finished).
            unsafe { b.launch(cfg) }.map_err(|e| self.failed(&what(), e))?;
        }
        // Marked before the wait: an interrupted kernel still runs to its end.
        for &i in &loaded.written {
            if let Some(Arg::Tensor(t)) = args.get(i) {
                t.storage.device_written();
            }
        }
        self.launch_count.fetch_add(1, Ordering::Relaxed);
        done.record(&self.stream)
            .map_err(|e| self.failed(&what(), e))?;
        drop(held);
        self.wait_recorded(done, interrupt, &what())?;
        if let Ok(ms) = started.elapsed_ms(done) {
            self.kernel_ns
                .fetch_add((ms as f64 * 1e6) as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Runs a one-thread kernel that traps, as the launch `what` (see
    /// [`TRAP_ENV`]): the driver reports the fault as it would any kernel's.
    fn trap(&self, what: &str, interrupt: &Interrupt) -> Result<(), ExecError> {
        const PTX: &str = ".version 7.0\n.target sm_70\n.address_size 64\n\
                           .visible .entry tessera_trap()\n{\n\ttrap;\n}\n";
        let module = self
            .ctx
            .load_module(Ptx::from_src(PTX))
            .map_err(|e| driver_error(what, e))?;
        let f = module
            .load_function("tessera_trap")
            .map_err(|e| driver_error(what, e))?;
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel takes no parameters and touches no memory.
        unsafe { self.stream.launch_builder(&f).launch(cfg) }.map_err(|e| self.failed(what, e))?;
        let done = self
            .ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| self.failed(what, e))?;
        self.wait(&done, interrupt, what)
    }

    /// Waits for the stream's work, looking at `interrupt` while it runs:
    /// E0706 returns to the caller while the kernel finishes on its own.
    /// `done` is recorded after that work here.
    fn wait(&self, done: &CudaEvent, interrupt: &Interrupt, what: &str) -> Result<(), ExecError> {
        done.record(&self.stream)
            .map_err(|e| self.failed(what, e))?;
        self.wait_recorded(done, interrupt, what)
    }

    /// [`Gpu::wait`] for an event already recorded after the work.
    fn wait_recorded(
        &self,
        done: &CudaEvent,
        interrupt: &Interrupt,
        what: &str,
    ) -> Result<(), ExecError> {
        let start = Instant::now();
        loop {
            // SAFETY: the event is alive (held by `done`) and was recorded on
            // this context's stream.
            match unsafe { cudarc::driver::result::event::query(done.cu_event()) } {
                Ok(()) => return Ok(()),
                Err(DriverError(CUresult::CUDA_ERROR_NOT_READY)) => {}
                Err(e) => return Err(self.failed(what, e)),
            }
            interrupt.check()?;
            // Spin (yielding), as the CUDA runtime's default wait does, so the
            // wait ends when the kernel does: sleeping oversleeps by tens of
            // microseconds (measured: 84-176 us of a 6-15 ms kernel's wall
            // time on an H100 when the spin ended at 5 ms). Past a second the
            // kernel's own time dwarfs that, and the core is given back.
            if start.elapsed() > Duration::from_secs(1) {
                std::thread::sleep(Duration::from_micros(200));
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// The environment variable naming the arch to compile for instead of the
/// GPU's own: an older NVIDIA arch that the GPU runs (`sm_90` on an H100
/// runs the `mma.sync` code path rather than wgmma's, to compare them).
pub const ARCH_ENV: &str = "TESSERA_CUDA_ARCH";

/// The arch to compile for on GPU `name` of compute capability `cc`, and the
/// GPU's own where [`ARCH_ENV`] picks another; why not, where neither can run.
fn arch_for(name: &str, cc: (i32, i32)) -> Result<(Arch, Option<Arch>), String> {
    arch_asked(name, cc, &std::env::var(ARCH_ENV).unwrap_or_default())
}

/// [`arch_for`] with [`ARCH_ENV`]'s value `asked` (empty: unset).
fn arch_asked(name: &str, cc: (i32, i32), asked: &str) -> Result<(Arch, Option<Arch>), String> {
    let own = Arch::for_compute_capability(cc.0, cc.1).ok_or_else(|| {
        format!(
            "compute capability {}.{}: Tessera compiles for sm_70 and later",
            cc.0, cc.1
        )
    })?;
    let asked = asked.trim();
    if asked.is_empty() {
        return Ok((own, None));
    }
    let arch: Arch = asked
        .parse()
        .map_err(|e| format!("{ARCH_ENV}={asked} is not an arch ({e})"))?;
    if !arch.is_nvidia() || !arch.runs_on(cc.0, cc.1) {
        return Err(format!(
            "{ARCH_ENV}={asked}: {name} (compute capability {}.{}) cannot run code for it; \
             it runs {own} and older NVIDIA arches",
            cc.0, cc.1
        ));
    }
    Ok((arch, (arch != own).then_some(own)))
}

/// The environment variable naming a kernel whose launches run a kernel
/// that traps instead: a real fault, which leaves the context unusable (a
/// sticky error), for testing what a session does after one. Kernels the
/// compiler makes are bounds-checked, so a user's program has no other way
/// to fault.
pub const TRAP_ENV: &str = "TESSERA_GPU_TRAP";

/// Tensor arguments whose element offsets fit the 32-bit index arithmetic of
/// GPU kernels (every in-bounds offset is below the element count): a larger
/// tensor is refused rather than addressed out of bounds.
pub(crate) fn fits_32_bit_offsets(kernel: &Kernel, args: &[Arg]) -> Result<(), ExecError> {
    for (p, a) in kernel.params.iter().zip(args) {
        if let Arg::Tensor(t) = a {
            if t.numel() > i32::MAX as usize {
                return Err(ExecError::new(
                    "E0711",
                    format!(
                        "tensor argument `{}` of `{}` has {} elements; GPU kernels index with \
                         32-bit offsets, which reach {} elements",
                        p.name,
                        kernel.name,
                        t.numel(),
                        i32::MAX
                    ),
                )
                .with_help("split the tensor, or run on the CPU: `--device cpu`"));
            }
        }
    }
    Ok(())
}

/// The help of an error that the launch's own checks (`exec::launch`'s
/// binding of arguments, Target IR's refusals) rule out before this point.
const CHECKED: &str =
    "this is a compiler bug (the launch's arguments were checked before): please report it";

/// A launch as an error names it: kernel, grid, block and arguments.
fn launch_what(kernel: &Kernel, args: &[Arg], grid: [i64; 3], threads: u32) -> String {
    let args: Vec<String> = kernel
        .params
        .iter()
        .zip(args)
        .map(|(p, a)| match a {
            Arg::Tensor(t) => format!("{}: {}{:?}", p.name, t.dtype(), t.shape()),
            Arg::Int(i) => format!("{}={i}", p.name),
            Arg::Float(x) => format!("{}={x}", p.name),
        })
        .collect();
    format!(
        "kernel `{}` (grid ({}, {}, {}), {threads} threads a block; {})",
        kernel.name,
        grid[0],
        grid[1],
        grid[2],
        args.join(", ")
    )
}

/// A kernel parameter's value with its PTX type.
enum ParamValue {
    /// A tensor's device address.
    U64(u64),
    I32(i32),
    I64(i64),
    U32(u32),
    U16(u16),
    F32(f32),
    F64(f64),
    /// A TMA tensor map, by value.
    TensorMap(tensor_map::Encoded),
}

/// The value of a scalar parameter of dtype `d` (as Target IR's `params`
/// types it).
fn scalar(d: DType, x: f64, i: i64) -> Result<ParamValue, ExecError> {
    Ok(match d {
        DType::F64 => ParamValue::F64(x),
        DType::F32 => ParamValue::F32(x as f32),
        DType::F16 => ParamValue::U16(half::f16::from_f64(x).to_bits()),
        DType::BF16 => ParamValue::U16(half::bf16::from_f64(x).to_bits()),
        DType::I64 => ParamValue::I64(i),
        DType::U32 | DType::U8 | DType::Bool => ParamValue::U32(i as u32),
        DType::I32 | DType::I16 | DType::I8 => ParamValue::I32(i as i32),
        // Target IR refuses f8 scalar parameters when the kernel is loaded,
        // before its arguments are read: this is not reached.
        DType::F8E4M3 | DType::F8E5M2 => {
            return Err(ExecError::new(
                "E0709",
                format!(
                    "an {} scalar parameter cannot be passed to a GPU kernel",
                    d.name()
                ),
            )
            .with_help(CHECKED))
        }
    })
}

#[cfg(test)]
mod tests;
