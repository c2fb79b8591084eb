//! Running clang on printed HIP: the validation that every emitted unit
//! compiles for its AMD arch, with the resource remarks LLVM's AMDGPU back
//! end prints (`-Rpass-analysis=kernel-resource-usage`: VGPRs, AGPRs, SGPRs,
//! LDS, occupancy per kernel) for the estimate comparison to read.
//!
//! clang is found through `TESSERA_CLANG` (the path of a `clang++` with the
//! AMDGPU target; the test command installs Debian's `clang-19` and `lld-19`
//! and exports it), else `clang++-19` on `PATH`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::target::Arch;

/// The environment variable naming the `clang++` binary.
pub const CLANG_ENV: &str = "TESSERA_CLANG";

/// The `clang++` to compile HIP with: `TESSERA_CLANG`, else `clang++-19` on
/// `PATH`; `None` when neither runs.
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(CLANG_ENV) {
        return Some(PathBuf::from(p));
    }
    let p = PathBuf::from("clang++-19");
    let runs = Command::new(&p)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    runs.then_some(p)
}

/// The arguments that compile a HIP unit for `arch` into a code object
/// (`.hsaco`, loadable with `hipModuleLoadData`), with resource remarks. No
/// ROCm headers or device library: the printed unit needs neither. Without
/// `--no-gpu-bundle-output` clang would wrap the object in an offload bundle
/// (and need `clang-offload-bundler`, which Debian's clang lacks).
pub fn args(arch: Arch, source: &Path, object: &Path) -> Vec<String> {
    vec![
        "-x".into(),
        "hip".into(),
        format!("--offload-arch={}", arch.name()),
        "--cuda-device-only".into(),
        "-nogpulib".into(),
        "-nogpuinc".into(),
        "-O3".into(),
        "-Rpass-analysis=kernel-resource-usage".into(),
        "--no-gpu-bundle-output".into(),
        "-c".into(),
        source.display().to_string(),
        "-o".into(),
        object.display().to_string(),
    ]
}

/// One unit compiled by clang.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub arch: Arch,
    /// The code object (present when `ok`).
    pub object: PathBuf,
    /// Whether clang exited successfully.
    pub ok: bool,
    /// Everything clang printed: errors, warnings and the resource remarks.
    pub stderr: String,
}

impl Compiled {
    /// clang's warnings and errors (remarks aside), one per line as printed.
    pub fn problems(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.contains("warning:") || l.contains("error:"))
            .collect()
    }
}

/// Compiles `source` for `arch` with `clang`, writing `STEM.hip` and
/// `STEM.hsaco` in `dir`. `Err` when clang cannot be run at all.
pub fn compile(
    clang: &Path,
    arch: Arch,
    source: &str,
    dir: &Path,
    stem: &str,
) -> Result<Compiled, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let src = dir.join(format!("{stem}.hip"));
    let object = dir.join(format!("{stem}.hsaco"));
    std::fs::write(&src, source).map_err(|e| format!("{}: {e}", src.display()))?;
    let out = Command::new(clang)
        .args(args(arch, &src, &object))
        .output()
        .map_err(|e| format!("cannot run {}: {e}", clang.display()))?;
    Ok(Compiled {
        arch,
        object,
        ok: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// [`compile`] for many units at once, on as many threads as the machine
/// has cores; results in the order of `units` (`(arch, stem, source)`).
pub fn compile_all(
    clang: &Path,
    dir: &Path,
    units: &[(Arch, String, String)],
) -> Vec<Result<Compiled, String>> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(units.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<Option<Result<Compiled, String>>> = vec![None; units.len()];
    let slots = std::sync::Mutex::new(&mut results);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((arch, stem, source)) = units.get(i) else {
                    break;
                };
                let r = compile(clang, *arch, source, dir, stem);
                slots.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
            });
        }
    });
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("not compiled".to_string())))
        .collect()
}
