//! Execution on NVIDIA GPUs through the CUDA driver API (cudarc, with
//! `libcuda` loaded at run time, so every build runs without CUDA or a GPU).
//!
//! * [`Gpu::open`] makes a context on one device and picks the arch to
//!   compile for from its compute capability
//!   ([`Arch::for_compute_capability`]).
//! * [`Gpu::launch`] runs a specialised Tile IR kernel: Target IR for the
//!   device's arch, PTX, the driver's JIT (once per specialisation: loaded
//!   modules are kept by their PTX), then the kernel runs on the tensors'
//!   device copies. A tensor's elements are copied to the GPU at its first
//!   launch there and stay; they are copied back only when the host reads
//!   them (see `exec::tensor::Storage`). Arguments that share storage share
//!   the device copy, as they share memory on the CPU.
//!
//! Kernel parameters are Target IR's (`ir::target::lower`'s `params`): the
//! Tile IR parameters in order (a tensor is its base pointer; tensors are
//! contiguous and row-major), then the run-time dims as 32-bit integers.
//!
//! Device memory comes from a caching allocator (`memory`). Every device
//! copy is a whole allocation, so tensor base pointers are always 256-byte
//! aligned (what the kernels' vector accesses assume).

mod memory;
pub use memory::MemoryStats;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUevent_flags, CUfunction_attribute, CUresult};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};

use super::cpu::Arg;
use super::{ExecError, Interrupt};
use crate::check::DType;
use crate::ir::target::{Param as TargetParam, RegTy};
use crate::ir::tile::{Dim, Kernel, ParamKind};
use crate::target::Arch;

/// The kernels the driver compiled for this device, by their PTX.
type Modules = HashMap<String, Loaded>;

/// What a launch needs of a loaded kernel: the function, the Target IR
/// parameters, threads a block and shared memory bytes.
type Launchable = (CudaFunction, Vec<TargetParam>, u32, u32);

/// Loaded kernels by the address of the Tile IR they came from (with a copy
/// of it, compared on each hit, as the address may be reused): a launch of
/// a kernel launched before neither lowers it nor prints its PTX again.
type Recent = HashMap<usize, (Kernel, Launchable)>;

/// Beyond this many kernels, [`Recent`] starts afresh.
const RECENT_CAP: usize = 256;

/// One NVIDIA GPU with a context and a stream of its own.
pub struct Gpu {
    info: GpuInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: Mutex<Modules>,
    recent: Mutex<Recent>,
    pool: Arc<memory::Pool>,
    /// A sticky error left the context unusable (see [`Gpu::reopen`]).
    broken: AtomicBool,
    /// The kernels' summed run time, in nanoseconds (CUDA events around each
    /// launch): what `:time` shows as the time on the GPU.
    kernel_ns: AtomicU64,
    /// How many kernels were launched.
    launch_count: AtomicU64,
}

/// Numbers the contexts made in this process (tensors' device copies name
/// the one that holds them).
static CONTEXTS: AtomicU64 = AtomicU64::new(1);

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
}

impl std::fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ma, mi) = self.compute_capability;
        write!(
            f,
            "cuda:{} {} ({:.0} GiB, compute capability {ma}.{mi}, compiling for {})",
            self.ordinal,
            self.name,
            self.memory_bytes as f64 / (1u64 << 30) as f64,
            self.arch
        )
    }
}

/// A kernel the driver loaded, with what its launches need.
struct Loaded {
    func: CudaFunction,
    params: Vec<TargetParam>,
    threads: u32,
    smem_bytes: u32,
}

/// Whether the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries to open the shared library (and
    // closes it); it calls nothing in it.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// E0721: no GPU to run on, with the reason in the help line (the message
/// is the same whatever the reason, as scripts and transcripts see it).
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
        // A context of our own, not the device's primary one: a sticky
        // error leaves a context unusable until it is destroyed, and a
        // fresh one can then be made beside it (`reopen`).
        let ctx = CudaContext::new_non_primary(ordinal, 0).map_err(|e| match e.0 {
            // What the driver answers in a process where a kernel faulted:
            // no new context, however long one waits, until the process ends
            // (checked on driver 580 with an H200: a fresh context, one made
            // on another thread and a reset of the primary one all fail).
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
        let arch = Arch::for_compute_capability(cc.0, cc.1).ok_or_else(|| {
            unavailable(format!(
                "{name} has compute capability {}.{}; Tessera compiles for sm_70 and later",
                cc.0, cc.1
            ))
        })?;
        // SAFETY: every launch and copy of this `Gpu` goes to its one stream,
        // which orders them: cudarc's per-buffer events (for several streams)
        // are not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
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
            },
            ctx,
            stream,
            modules: Mutex::new(HashMap::new()),
            recent: Mutex::new(HashMap::new()),
            pool,
            broken: AtomicBool::new(false),
            kernel_ns: AtomicU64::new(0),
            launch_count: AtomicU64::new(0),
        })
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

    /// A fresh context on the same GPU, after a sticky error. `old` must be
    /// the last holder of its `Gpu` (tensors hold their blocks' pool
    /// weakly): the broken context is destroyed with it, its memory with
    /// it, before a fresh one is asked for. After a kernel's fault the driver
    /// makes none in this process (E0721 says so: see `open`); after other
    /// sticky errors it may.
    pub fn reopen(old: Arc<Gpu>) -> Result<Gpu, ExecError> {
        old.pool.mark_dead();
        let ordinal = old.info.ordinal;
        if Arc::strong_count(&old) > 1 {
            return Err(
                ExecError::new("E0730", "the GPU's broken context is still in use")
                    .with_help(CHECKED),
            );
        }
        drop(old);
        Gpu::open(ordinal)
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

    /// What the caching allocator has done.
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
        let pool = &self.pool;
        super::Tensor::zeros_on_device(shape, dtype, |bytes| pool.alloc(bytes))
    }

    /// Copies `t`'s elements to this GPU (if they are not there already),
    /// where its next launches find them.
    pub fn to_device(&self, t: &super::Tensor) -> Result<(), ExecError> {
        self.device_address(t).map(|_| ())
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
    fn launchable(&self, kernel: &Kernel) -> Result<Launchable, ExecError> {
        let key = kernel as *const Kernel as usize;
        if let Some((k, l)) = self.recent().get(&key) {
            if k == kernel {
                return Ok(l.clone());
            }
        }
        let l = self.loaded(kernel)?;
        let mut r = self.recent();
        if r.len() >= RECENT_CAP {
            r.clear();
        }
        r.insert(key, (kernel.clone(), l.clone()));
        Ok(l)
    }

    /// The loaded kernel for `kernel` (compiled and loaded on first use).
    fn loaded(&self, kernel: &Kernel) -> Result<Launchable, ExecError> {
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
        let ptx = crate::backend::ptx::module_of(
            self.info.arch,
            &[crate::backend::ptx::kernel_text(&target)],
        );
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = modules.get(&ptx) {
            return Ok((l.func.clone(), l.params.clone(), l.threads, l.smem_bytes));
        }
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx.clone()))
            .map_err(|e| {
                driver_error(
                    &format!("compiling kernel `{}` (the driver's JIT)", kernel.name),
                    e,
                )
            })?;
        let func = module
            .load_function(&target.name)
            .map_err(|e| driver_error(&format!("loading kernel `{}`", kernel.name), e))?;
        let smem_bytes = target.smem_bytes();
        if smem_bytes > crate::backend::ptx::MAX_STATIC_SMEM {
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
        }
        let entry = Loaded {
            func: func.clone(),
            params: target.params.clone(),
            threads: target.num_threads,
            smem_bytes,
        };
        let out = (func, entry.params.clone(), entry.threads, smem_bytes);
        modules.insert(ptx, entry);
        Ok(out)
    }

    /// Runs every program of `grid` of `kernel` on `args` (Tile IR parameter
    /// order) on this GPU; tensor arguments are written in place.
    pub fn launch(
        &self,
        kernel: &Kernel,
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
        // Within `MAX_GRID`, so each dim fits a u32.
        let grid_dim = (grid[0] as u32, grid[1] as u32, grid[2] as u32);
        let (func, params, threads, smem_bytes) = self.launchable(kernel)?;
        let mut values: Vec<ParamValue> = Vec::with_capacity(params.len());
        let mut dims: HashMap<&str, i64> = HashMap::new();
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
                            dims.entry(name.as_str()).or_insert(n as i64);
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
            let n = dims.get(p.name.as_str()).copied().ok_or_else(|| {
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
        let started = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| self.failed(&what(), e))?;
        {
            let mut b = self.stream.launch_builder(&func);
            for v in &values {
                match v {
                    ParamValue::I32(x) => b.arg(x),
                    ParamValue::I64(x) => b.arg(x),
                    ParamValue::U64(x) => b.arg(x),
                    ParamValue::U32(x) => b.arg(x),
                    ParamValue::U16(x) => b.arg(x),
                    ParamValue::F32(x) => b.arg(x),
                    ParamValue::F64(x) => b.arg(x),
                };
            }
            // SAFETY: the arguments are, in order, the values of the kernel's
            // PTX parameters with their PTX types (`values` follows Target
            // IR's `params`: a device pointer per tensor, scalars by dtype,
            // then the 32-bit dims); each device address is a live block of
            // this context holding its tensor's elements, the extent the
            // kernel's bounds checks allow it to touch (the tensors are held
            // by `args` until the launch has finished).
            unsafe { b.launch(cfg) }.map_err(|e| self.failed(&what(), e))?;
        }
        // Marked before the wait: an interrupted kernel still runs to its end.
        for i in kernel.written_params() {
            if let Some(Arg::Tensor(t)) = args.get(i) {
                t.storage.device_written();
            }
        }
        self.launch_count.fetch_add(1, Ordering::Relaxed);
        let done = self.wait(interrupt, &what())?;
        if let Ok(ms) = started.elapsed_ms(&done) {
            self.kernel_ns
                .fetch_add((ms as f64 * 1e6) as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Waits for the stream's work, looking at `interrupt` while it runs:
    /// E0706 returns to the caller while the kernel finishes on its own.
    /// Returns the (timed) event recorded after that work.
    fn wait(&self, interrupt: &Interrupt, what: &str) -> Result<CudaEvent, ExecError> {
        let done = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| self.failed(what, e))?;
        let start = Instant::now();
        loop {
            // SAFETY: the event is alive (held by `done`) and was recorded on
            // this context's stream.
            match unsafe { cudarc::driver::result::event::query(done.cu_event()) } {
                Ok(()) => return Ok(done),
                Err(DriverError(CUresult::CUDA_ERROR_NOT_READY)) => {}
                Err(e) => return Err(self.failed(what, e)),
            }
            interrupt.check()?;
            // Spin briefly for short kernels, then sleep.
            if start.elapsed() > Duration::from_micros(200) {
                std::thread::sleep(Duration::from_micros(100));
            } else {
                std::hint::spin_loop();
            }
        }
    }
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
