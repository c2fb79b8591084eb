//! The driver's linker (`cuLink*`) and ptxas's report. The linker compiles
//! PTX as relocatable code (`-rdc`), slower than a whole-program compile, so
//! the executor runs what `ptxas` or the driver's JIT make (see `ptxas` and
//! `Gpu::module`) and links only to read the linker's error log, which
//! explains a compile the driver's JIT refused. [`parse_info_log`] reads
//! ptxas's verbose report of registers and spills.

use std::ffi::{c_void, CString};

use cudarc::driver::sys::{self, CUjitInputType, CUjit_option, CUlinkState, CUresult};
use cudarc::driver::{CudaContext, DriverError};

/// What ptxas reported about one kernel (the JIT's verbose info log).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JitInfo {
    pub regs: Option<u32>,
    /// Bytes each thread stores to and loads from local memory for spilled
    /// registers.
    pub spill_stores: Option<u64>,
    pub spill_loads: Option<u64>,
    pub stack_bytes: Option<u64>,
}

impl From<&crate::backend::ptxas::FunctionInfo> for JitInfo {
    fn from(f: &crate::backend::ptxas::FunctionInfo) -> JitInfo {
        JitInfo {
            regs: Some(f.regs),
            spill_stores: Some(f.spill_stores.into()),
            spill_loads: Some(f.spill_loads.into()),
            stack_bytes: Some(f.stack_bytes.into()),
        }
    }
}

/// The numbers ptxas reports for `kernel` in `log`: the lines after its
/// "Compiling entry function 'K'" or "Function properties for K", up to the
/// next kernel's. Lines may carry a `ptxas info    :` or `info    :` prefix
/// (ptxas's own log and the driver's JIT differ in it). Fields the log does
/// not give are `None` (the driver's own JIT cache can serve a kernel without
/// compiling it, and then says nothing).
// ptxas's own `-v` report is read by `backend::ptxas`; this reads the
// driver's JIT logs (other prefixes and layouts), which only the test that
// compares the linker's report with the driver's attributes reads now.
#[cfg_attr(not(test), allow(dead_code))]
pub fn parse_info_log(log: &str, kernel: &str) -> JitInfo {
    let mut info = JitInfo::default();
    // Whether the lines read belong to `kernel`; a log without kernel names
    // (one kernel per module) counts as `kernel`'s.
    let mut mine = true;
    for line in log.lines() {
        let text = line.trim();
        if let Some(name) = kernel_named(text) {
            mine = name == kernel;
            continue;
        }
        if !mine {
            continue;
        }
        let lower = text.to_ascii_lowercase();
        if let Some(n) = number_before(&lower, " registers") {
            info.regs = u32::try_from(n).ok();
        }
        if let Some(n) = number_before(&lower, " bytes spill stores") {
            info.spill_stores = Some(n);
        }
        if let Some(n) = number_before(&lower, " bytes spill loads") {
            info.spill_loads = Some(n);
        }
        if let Some(n) = number_before(&lower, " bytes stack frame") {
            info.stack_bytes = Some(n);
        }
    }
    info
}

/// The kernel a log line starts the report of, if it does.
fn kernel_named(text: &str) -> Option<&str> {
    for marker in ["Compiling entry function ", "Function properties for "] {
        if let Some(i) = text.find(marker) {
            let rest = &text[i + marker.len()..];
            let rest = rest.trim_start_matches('\'');
            let end = rest.find(['\'', ':', ' ']).unwrap_or(rest.len());
            return Some(&rest[..end]);
        }
    }
    None
}

/// The decimal number right before `what` in `text` ("0 bytes spill stores").
fn number_before(text: &str, what: &str) -> Option<u64> {
    let end = text.find(what)?;
    let digits = text[..end]
        .bytes()
        .rev()
        .take_while(u8::is_ascii_digit)
        .count();
    text[end - digits..end].parse().ok()
}

/// A compiled module: the cubin and the JIT's info log.
// The executor reads only a link's error; its cubin and report are read by
// the test that compares the linker's report with the driver's attributes.
#[cfg_attr(not(test), allow(dead_code))]
pub(super) struct Linked {
    pub cubin: Vec<u8>,
    pub info_log: String,
}

/// A failed compile: the driver's error and the JIT's error log.
pub(super) struct LinkError {
    pub error: DriverError,
    pub log: String,
}

/// The size of each log buffer: ptxas's report of one kernel is a few lines,
/// its errors rarely more than a few hundred.
const LOG_BYTES: usize = 1 << 16;

/// Compiles `ptx` to a cubin for `ctx`'s device with the driver's linker.
pub(super) fn link_ptx(ctx: &CudaContext, ptx: &str) -> Result<Linked, LinkError> {
    let fail = |error: DriverError| LinkError {
        error,
        log: String::new(),
    };
    ctx.bind_to_thread().map_err(fail)?;
    // Our PTX is text without NUL bytes; the driver reads it NUL-terminated.
    let src = CString::new(ptx).map_err(|_| fail(DriverError(CUresult::CUDA_ERROR_INVALID_PTX)))?;
    let mut info = vec![0u8; LOG_BYTES];
    let mut errors = vec![0u8; LOG_BYTES];
    let mut options: [CUjit_option; 5] = [
        CUjit_option::CU_JIT_INFO_LOG_BUFFER,
        CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        CUjit_option::CU_JIT_LOG_VERBOSE,
    ];
    // The driver's convention: each value is a pointer, or an integer cast
    // to one.
    let mut values: [*mut c_void; 5] = [
        info.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(LOG_BYTES),
        errors.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(LOG_BYTES),
        std::ptr::without_provenance_mut(1),
    ];
    let mut state: CUlinkState = std::ptr::null_mut();
    // SAFETY: `options` and `values` have 5 entries each, of the types the
    // options take; the log buffers hold `LOG_BYTES` bytes each, and they and
    // both arrays outlive the link state (destroyed by `guard` below, which is
    // dropped before them). The context is current (bound above).
    unsafe {
        sys::cuLinkCreate_v2(
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
            &mut state,
        )
    }
    .result()
    .map_err(fail)?;
    let guard = LinkState(state);
    let name = c"kernel.ptx";
    let text = src.as_bytes_with_nul();
    // SAFETY: `state` is a live link state; `text` is `text.len()` readable
    // bytes (the driver does not write through the pointer despite its
    // type) and `name` a NUL-terminated string, both alive for the call; no
    // per-input options are passed.
    let added = unsafe {
        sys::cuLinkAddData_v2(
            guard.0,
            CUjitInputType::CU_JIT_INPUT_PTX,
            text.as_ptr() as *mut c_void,
            text.len(),
            name.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
    .result();
    let linked = added.and_then(|()| {
        let mut cubin: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: `state` is live and has its one input; the out-pointers
        // are valid for writes.
        unsafe { sys::cuLinkComplete(guard.0, &mut cubin, &mut size) }.result()?;
        // SAFETY: the driver's cubin is `size` bytes owned by the link state,
        // alive until `guard` destroys it; it is copied out before that.
        Ok(unsafe { std::slice::from_raw_parts(cubin as *const u8, size) }.to_vec())
    });
    drop(guard);
    match linked {
        Ok(cubin) => Ok(Linked {
            cubin,
            info_log: log_text(&info),
        }),
        Err(error) => Err(LinkError {
            error,
            log: log_text(&errors),
        }),
    }
}

/// A link state, destroyed when dropped.
struct LinkState(CUlinkState);

impl Drop for LinkState {
    fn drop(&mut self) {
        // SAFETY: the state came from a successful `cuLinkCreate` and is
        // destroyed only here, once. A failure cannot be acted on.
        let _ = unsafe { sys::cuLinkDestroy(self.0) };
    }
}

/// The NUL-terminated text the driver wrote into a log buffer.
fn log_text(buffer: &[u8]) -> String {
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).trim().to_string()
}

/// The driver's version (`cuDriverGetVersion`: 12080 is CUDA 12.8), part of
/// the cache key since its JIT compiles the cubins.
pub(super) fn driver_version() -> Result<i32, DriverError> {
    let mut v = 0;
    // SAFETY: the out-pointer is valid for a write; the call needs no context.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ptxas 12.9's `-v` report of `examples/vadd.tsr` for sm_90a.
    const VADD: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'vadd' for 'sm_90a'
ptxas info    : Function properties for vadd
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 26 registers, used 0 barriers
ptxas info    : Compile time = 40.274 ms
";

    /// ptxas 12.9's report of `examples/flash_attn.tsr` with `-D D=128`
    /// for sm_90a, which spills.
    const FLASH: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'flash_attn' for 'sm_90a'
ptxas info    : Function properties for flash_attn
    160 bytes stack frame, 320 bytes spill stores, 320 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 160 bytes cumulative stack size
ptxas info    : Compile time = 685.988 ms
";

    #[test]
    fn reads_registers_and_spills() {
        assert_eq!(
            parse_info_log(VADD, "vadd"),
            JitInfo {
                regs: Some(26),
                spill_stores: Some(0),
                spill_loads: Some(0),
                stack_bytes: Some(0),
            }
        );
        assert_eq!(
            parse_info_log(FLASH, "flash_attn"),
            JitInfo {
                regs: Some(255),
                spill_stores: Some(320),
                spill_loads: Some(320),
                stack_bytes: Some(160),
            }
        );
    }

    #[test]
    fn reads_only_the_named_kernel() {
        let both = format!("{VADD}{FLASH}");
        assert_eq!(parse_info_log(&both, "vadd").regs, Some(26));
        assert_eq!(parse_info_log(&both, "flash_attn").spill_stores, Some(320));
        assert_eq!(parse_info_log(&both, "other"), JitInfo::default());
    }

    /// The driver's JIT and nvJitLink print `info    :` without `ptxas`,
    /// quote the name and may leave out the "Compiling" line; a kernel its
    /// cache served gets no report.
    #[test]
    fn reads_the_drivers_prefixes() {
        let log = "info    : 0 bytes gmem\n\
                   info    : Function properties for 'k':\n\
                   info    : used 40 registers, 0 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n";
        assert_eq!(
            parse_info_log(log, "k"),
            JitInfo {
                regs: Some(40),
                spill_stores: Some(8),
                spill_loads: Some(12),
                stack_bytes: Some(0),
            }
        );
        assert_eq!(
            parse_info_log("info    : 16 bytes gmem\n", "k"),
            JitInfo::default()
        );
        assert_eq!(parse_info_log("", "k"), JitInfo::default());
    }

    /// nvJitLink's info log as quoted in NVIDIA/cuda-python issue 950
    /// (`ptxas         .` continuation lines, no "Used" line).
    #[test]
    fn reads_nvjitlinks_log() {
        let log = "ptxas info    : 0 bytes gmem\nptxas info    : Function properties for add\n\
                   ptxas         .     24 bytes stack frame, 16 bytes spill stores, 16 bytes spill loads\n\
                   ptxas info    : Compile time = 2.002 ms\ninfo    : 16 bytes gmem\n";
        assert_eq!(
            parse_info_log(log, "add"),
            JitInfo {
                regs: None,
                spill_stores: Some(16),
                spill_loads: Some(16),
                stack_bytes: Some(24),
            }
        );
    }

    #[test]
    fn log_text_stops_at_the_nul() {
        let mut buffer = b"ptxas error : bad\n".to_vec();
        buffer.extend([0, b'x', b'y']);
        assert_eq!(log_text(&buffer), "ptxas error : bad");
        assert_eq!(log_text(&[0; 8]), "");
    }
}
