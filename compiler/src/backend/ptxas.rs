//! Running NVIDIA's `ptxas` (the PTX assembler) and reading what `ptxas -v`
//! says about each function: the real register count, spills and shared memory.
//! Used by the validation test that compares [`super::resources`] estimates with
//! the real toolchain (`scripts/fetch-ptxas.sh` installs a `ptxas` and the test
//! command exports its path as `TESSERA_PTXAS`), and by the CUDA executor,
//! which compiles its cubins with it ([`compile`], [`find`]).

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::target::Arch;

/// The environment variable naming the `ptxas` binary.
pub const PTXAS_ENV: &str = "TESSERA_PTXAS";

/// What `ptxas -v` reports for one function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionInfo {
    pub name: String,
    /// The target ptxas compiled for, e.g. `sm_80`.
    pub arch: String,
    /// `true` for `.entry` functions (kernels).
    pub entry: bool,
    pub regs: u32,
    pub stack_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    /// Static shared memory (`N bytes smem`; 0 when not printed).
    pub smem_bytes: u32,
    pub barriers: u32,
}

/// Why assembling failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PtxasError {
    /// `TESSERA_PTXAS` is not set (run `scripts/fetch-ptxas.sh`).
    NotConfigured,
    /// The binary could not be started.
    Spawn(String),
    /// ptxas rejected the PTX: its exit status and messages.
    Rejected { status: Option<i32>, stderr: String },
    /// ptxas succeeded but its `-v` output could not be read.
    Parse(String),
}

impl fmt::Display for PtxasError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PtxasError::NotConfigured => write!(
                f,
                "{PTXAS_ENV} is not set (scripts/fetch-ptxas.sh installs ptxas and prints its path)"
            ),
            PtxasError::Spawn(e) => write!(f, "cannot run ptxas: {e}"),
            PtxasError::Rejected { status, stderr } => {
                write!(f, "ptxas rejected the PTX (exit {status:?}):\n{stderr}")
            }
            PtxasError::Parse(e) => write!(f, "cannot read ptxas -v output: {e}"),
        }
    }
}

impl std::error::Error for PtxasError {}

/// The `ptxas` named by `TESSERA_PTXAS`.
pub fn configured() -> Result<PathBuf, PtxasError> {
    std::env::var_os(PTXAS_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .ok_or(PtxasError::NotConfigured)
}

fn number_before(text: &str, suffix: &str) -> Option<u32> {
    let at = text.find(suffix)?;
    text[..at].split_whitespace().last()?.parse().ok()
}

/// Parses the `ptxas info` lines of `ptxas -v` output. Lines are:
///
/// ```text
/// ptxas info    : Compiling entry function 'k' for 'sm_80'
/// ptxas info    : Function properties for k
///     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
/// ptxas info    : Used 8 registers, used 0 barriers, 1024 bytes smem, 364 bytes cmem[0]
/// ```
///
/// (`Compiling function` for non-entry functions; older versions print
/// `Used N registers, 1024 bytes smem, ...` without the barriers.)
pub fn parse_verbose(text: &str) -> Result<Vec<FunctionInfo>, String> {
    let mut out: Vec<FunctionInfo> = Vec::new();
    let mut current: Option<usize> = None;
    for line in text.lines() {
        let body = match line.split_once("ptxas info") {
            Some((_, rest)) => rest.trim_start().trim_start_matches(':').trim(),
            None => line.trim(),
        };
        if let Some(rest) = body
            .strip_prefix("Compiling entry function ")
            .map(|r| (true, r))
            .or_else(|| body.strip_prefix("Compiling function ").map(|r| (false, r)))
        {
            let (entry, rest) = rest;
            let mut quoted = rest.split('\'').skip(1).step_by(2);
            let name = quoted
                .next()
                .ok_or_else(|| format!("no function name in `{line}`"))?;
            let arch = quoted.next().unwrap_or("").to_string();
            out.push(FunctionInfo {
                name: name.to_string(),
                arch,
                entry,
                ..FunctionInfo::default()
            });
            current = Some(out.len() - 1);
        } else if let Some(name) = body.strip_prefix("Function properties for ") {
            // Properties come after "Compiling"; find the function by name.
            current = out.iter().rposition(|f| f.name == name.trim());
            if current.is_none() {
                return Err(format!("properties of an unknown function `{name}`"));
            }
        } else if body.contains("bytes stack frame") {
            let f = &mut out[current.ok_or_else(|| format!("`{line}` outside a function"))?];
            f.stack_bytes = number_before(body, "bytes stack frame").unwrap_or(0);
            f.spill_stores = number_before(body, "bytes spill stores").unwrap_or(0);
            f.spill_loads = number_before(body, "bytes spill loads").unwrap_or(0);
        } else if body.starts_with("Used ") {
            let f = &mut out[current.ok_or_else(|| format!("`{line}` outside a function"))?];
            f.regs = number_before(body, "registers")
                .ok_or_else(|| format!("no register count in `{line}`"))?;
            f.barriers = number_before(body, "barriers").unwrap_or(0);
            f.smem_bytes = number_before(body, "bytes smem").unwrap_or(0);
        }
    }
    Ok(out)
}

/// Assembles `ptx` for `arch` with `ptxas -v` and returns what it reports for
/// each function. The output object is discarded.
pub fn assemble(ptxas: &Path, ptx: &str, arch: Arch) -> Result<Vec<FunctionInfo>, PtxasError> {
    run(ptxas, ptx, arch.name(), false).map(|(_, info)| info)
}

/// Compiles `ptx` with `ptxas -O3 -v` for the target its `.target` names (a
/// whole-program compile): the cubin and what ptxas reports for each
/// function.
pub fn compile(ptxas: &Path, ptx: &str) -> Result<(Vec<u8>, Vec<FunctionInfo>), PtxasError> {
    let arch = target_of(ptx).ok_or_else(|| PtxasError::Rejected {
        status: None,
        stderr: "the PTX names no .target".to_string(),
    })?;
    let (cubin, info) = run(ptxas, ptx, arch, true)?;
    Ok((cubin.unwrap_or_default(), info))
}

/// The `.target` of a PTX module (`sm_90a`).
pub fn target_of(ptx: &str) -> Option<&str> {
    ptx.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(".target "))
        .and_then(|t| t.split([',', ' ']).next())
        .filter(|t| !t.is_empty())
}

/// Runs `ptxas -v` on `ptx` for `arch`; the cubin too when `keep`.
///
/// The PTX goes through a file of our own, not stdin: ptxas copies stdin to
/// `/tmp/tmpxft_<pid>_...`, and under parallel runs sharing `/tmp` it then
/// sometimes read an empty copy ("Missing .version directive").
fn run(
    ptxas: &Path,
    ptx: &str,
    arch: &str,
    keep: bool,
) -> Result<(Option<Vec<u8>>, Vec<FunctionInfo>), PtxasError> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stem = std::env::temp_dir().join(format!("tessera-ptxas-{}-{n}", std::process::id()));
    let path = stem.with_extension("ptx");
    let cubin = stem.with_extension("cubin");
    std::fs::write(&path, ptx)
        .map_err(|e| PtxasError::Spawn(format!("writing PTX to {}: {e}", path.display())))?;
    let mut cmd = Command::new(ptxas);
    cmd.args(["-v", "-arch", arch]);
    if keep {
        cmd.arg("-O3").arg("-o").arg(&cubin);
    } else {
        cmd.args(["-o", "/dev/null"]);
    }
    let out = cmd.arg(&path).stdin(Stdio::null()).output();
    let _ = std::fs::remove_file(&path);
    let object = keep.then(|| std::fs::read(&cubin));
    let _ = std::fs::remove_file(&cubin);
    let out = out.map_err(|e| PtxasError::Spawn(format!("{}: {e}", ptxas.display())))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(PtxasError::Rejected {
            status: out.status.code(),
            stderr: text,
        });
    }
    let object = object
        .transpose()
        .map_err(|e| PtxasError::Spawn(format!("reading the cubin: {e}")))?;
    Ok((object, parse_verbose(&text).map_err(PtxasError::Parse)?))
}

/// A `ptxas` found on this machine, with its version line.
#[derive(Clone, Debug)]
pub struct Installed {
    pub path: PathBuf,
    pub version: String,
}

/// The `ptxas` to compile with: `TESSERA_PTXAS` (empty: none), else the one
/// on `PATH`, else CUDA's default install; `None` when none answers
/// `--version`.
pub fn find() -> Option<Installed> {
    let candidates: Vec<PathBuf> = match std::env::var_os(PTXAS_ENV) {
        Some(p) if p.is_empty() => return None,
        Some(p) => vec![PathBuf::from(p)],
        None => std::env::var_os("PATH")
            .map(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join("ptxas"))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
            .into_iter()
            .chain([PathBuf::from("/usr/local/cuda/bin/ptxas")])
            .collect(),
    };
    candidates
        .into_iter()
        .filter(|p| p.is_file())
        .find_map(|path| {
            let out = Command::new(&path).arg("--version").output().ok()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let version = text
                .lines()
                .rfind(|l| !l.trim().is_empty())?
                .trim()
                .to_string();
            out.status.success().then_some(Installed { path, version })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from ptxas 12.9 (nvidia-cuda-nvcc-cu12 12.9.86), `-v -arch=sm_80`.
    const SM80: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'empty' for 'sm_80'
ptxas info    : Function properties for empty
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 4 registers, used 0 barriers, 352 bytes cmem[0]
ptxas info    : Compile time = 9.326 ms
ptxas info    : Compiling entry function 'add_one' for 'sm_80'
ptxas info    : Function properties for add_one
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 1024 bytes smem, 364 bytes cmem[0]
ptxas info    : Compile time = 1.448 ms
";

    /// The same for sm_90 (no cmem line), and a spilling function in the
    /// format of older ptxas versions (no barrier count), with a device function.
    const SM90_SPILL: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'add_one' for 'sm_90'
ptxas info    : Function properties for add_one
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 1024 bytes smem
ptxas info    : Compile time = 1.803 ms
ptxas info    : Compiling function 'helper' for 'sm_90'
ptxas info    : Function properties for helper
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'big' for 'sm_90'
ptxas info    : Function properties for big
    1096 bytes stack frame, 1208 bytes spill stores, 1160 bytes spill loads
ptxas info    : Used 255 registers, 49152 bytes smem, 400 bytes cmem[0]
";

    #[test]
    fn parses_entries_registers_and_smem() {
        let f = parse_verbose(SM80).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(
            f[1],
            FunctionInfo {
                name: "add_one".into(),
                arch: "sm_80".into(),
                entry: true,
                regs: 8,
                smem_bytes: 1024,
                ..FunctionInfo::default()
            }
        );
        assert_eq!(
            (f[0].name.as_str(), f[0].regs, f[0].smem_bytes),
            ("empty", 4, 0)
        );
    }

    #[test]
    fn parses_spills_and_device_functions() {
        let f = parse_verbose(SM90_SPILL).unwrap();
        let names: Vec<_> = f.iter().map(|f| (f.name.as_str(), f.entry)).collect();
        assert_eq!(names, [("add_one", true), ("helper", false), ("big", true)]);
        assert_eq!(f[1].stack_bytes, 8);
        assert_eq!(f[1].regs, 0);
        let big = &f[2];
        assert_eq!(
            (
                big.regs,
                big.smem_bytes,
                big.stack_bytes,
                big.spill_stores,
                big.spill_loads
            ),
            (255, 49152, 1096, 1208, 1160)
        );
        assert_eq!(big.arch, "sm_90");
    }

    #[test]
    fn malformed_output_is_an_error() {
        assert!(parse_verbose("ptxas info    : Function properties for nowhere\n").is_err());
        assert!(parse_verbose("ptxas info    : Used 8 registers\n").is_err());
        assert!(parse_verbose(
            "ptxas info    : Compiling entry function 'k' for 'sm_80'\nptxas info    : Used many registers\n"
        )
        .is_err());
        assert_eq!(parse_verbose("").unwrap(), vec![]);
    }

    #[test]
    fn the_target_is_read_from_the_ptx() {
        assert_eq!(
            target_of(".version 8.0\n.target sm_90a\n.address_size 64\n"),
            Some("sm_90a")
        );
        assert_eq!(target_of(".target sm_80, debug\n"), Some("sm_80"));
        assert_eq!(target_of(".version 8.0\n"), None);
    }

    /// With the ptxas CI installs (`TESSERA_PTXAS`), a compile gives a cubin
    /// and a report; bad PTX gives ptxas's message.
    #[test]
    fn compile_keeps_the_cubin_and_reports() {
        let Some(p) = find() else {
            eprintln!("compile_keeps_the_cubin_and_reports: skipped, no ptxas (set TESSERA_PTXAS)");
            return;
        };
        let ptx = ".version 7.8\n.target sm_80\n.address_size 64\n\
                   .visible .entry k(.param .u64 p)\n{\n\t.reg .b64 %rd<2>;\n\
                   \tld.param.u64 %rd1, [p];\n\tret;\n}\n";
        let (cubin, report) = compile(&p.path, ptx).unwrap();
        assert!(cubin.starts_with(b"\x7fELF"), "a cubin is an ELF file");
        let k = report
            .iter()
            .find(|f| f.name == "k")
            .expect("k is reported");
        assert!(k.entry && k.regs > 0, "{report:?}");
        assert_eq!(k.spill_stores, 0);
        match compile(&p.path, &ptx.replace("ret;", "bogus;")) {
            Err(PtxasError::Rejected { stderr, .. }) => {
                assert!(
                    stderr.contains("bogus") || stderr.contains("error"),
                    "{stderr}"
                )
            }
            other => panic!("bad PTX: {other:?}"),
        }
    }
}
