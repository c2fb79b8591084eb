//! PTX to cubin with NVIDIA's `ptxas`, as Triton compiles: a whole-program
//! compile (the driver's linker, the other way to get a cubin, compiles PTX
//! as relocatable code, which ran gemm_bf16 23% slower), whose cubin the
//! disk cache keeps and whose `-v` report gives the registers and spills of
//! the code that runs. Without a `ptxas` the driver's JIT compiles (and
//! keeps its results in its own cache).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A `ptxas` to compile with, and its version line (part of the disk
/// cache's key: another ptxas makes other code).
#[derive(Clone, Debug)]
pub struct Ptxas {
    pub path: PathBuf,
    pub version: String,
}

/// The `ptxas` to use: `TESSERA_PTXAS` (empty: none), else the one on
/// `PATH`, else CUDA's default install; `None` when there is none that
/// answers `--version`.
pub fn find() -> Option<Ptxas> {
    let candidates: Vec<PathBuf> = match std::env::var_os("TESSERA_PTXAS") {
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
            out.status.success().then_some(Ptxas { path, version })
        })
}

/// What a compile made: the cubin and ptxas's `-v` report.
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub report: String,
}

/// The `.target` of a PTX module (`sm_90a`), which ptxas's `-arch` must name.
pub fn target_of(ptx: &str) -> Option<&str> {
    ptx.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(".target "))
        .and_then(|t| t.split([',', ' ']).next())
        .filter(|t| !t.is_empty())
}

impl Ptxas {
    /// Compiles `ptx` (in a temporary folder); `Err` with ptxas's message.
    pub fn compile(&self, ptx: &str) -> Result<Compiled, String> {
        let arch = target_of(ptx).ok_or("the PTX names no .target")?;
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary folder: {e}"))?;
        let src = dir.path().join("kernel.ptx");
        let out = dir.path().join("kernel.cubin");
        std::fs::write(&src, ptx).map_err(|e| format!("writing the PTX: {e}"))?;
        let run = Command::new(&self.path)
            .arg(format!("-arch={arch}"))
            .args(["-O3", "-v", "-o"])
            .arg(&out)
            .arg(&src)
            .output()
            .map_err(|e| format!("running {}: {e}", self.path.display()))?;
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
        if !run.status.success() {
            return Err(text(&run.stderr));
        }
        let cubin = std::fs::read(&out).map_err(|e| format!("reading the cubin: {e}"))?;
        // `-v` writes its report to stderr (some versions to stdout).
        let report = format!("{}\n{}", text(&run.stderr), text(&run.stdout));
        Ok(Compiled { cubin, report })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    /// and a report the log parser reads; bad PTX gives ptxas's message.
    #[test]
    fn ptxas_compiles_and_reports() {
        let Some(p) = find() else {
            eprintln!("ptxas_compiles_and_reports: skipped, no ptxas (set TESSERA_PTXAS)");
            return;
        };
        let ptx = ".version 7.8\n.target sm_80\n.address_size 64\n\
                   .visible .entry k(.param .u64 p)\n{\n\t.reg .b64 %rd<2>;\n\
                   \tld.param.u64 %rd1, [p];\n\tret;\n}\n";
        let c = p.compile(ptx).unwrap();
        assert!(c.cubin.starts_with(b"\x7fELF"), "a cubin is an ELF file");
        let info = super::super::jit::parse_info_log(&c.report, "k");
        assert!(info.regs.is_some(), "{}", c.report);
        assert_eq!(info.spill_stores, Some(0), "{}", c.report);
        let e = p
            .compile(&ptx.replace("ret;", "bogus;"))
            .err()
            .expect("bad PTX");
        assert!(e.contains("bogus") || e.contains("error"), "{e}");
    }
}
