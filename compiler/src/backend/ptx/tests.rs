//! PTX printer tests: snapshots, and assembly with NVIDIA's ptxas.
//!
//! ptxas is found through `TESSERA_PTXAS` (the path of the binary; CI sets it),
//! else at `/work/ptxas/nvidia/cuda_nvcc/bin/ptxas`; without either the
//! assembly test prints a notice and checks only the printer's own output.

use std::path::PathBuf;
use std::process::Command;

use super::module;
use crate::backend::arch::Arch;
use crate::ir::target::{lower, tests::all_kernels};

pub(crate) fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TESSERA_PTXAS") {
        let p = PathBuf::from(p);
        assert!(p.exists(), "TESSERA_PTXAS={} does not exist", p.display());
        return Some(p);
    }
    let local = PathBuf::from("/work/ptxas/nvidia/cuda_nvcc/bin/ptxas");
    local.exists().then_some(local)
}

/// Assembles `ptx` for `arch`; returns ptxas's `-v` report or its errors.
pub(crate) fn assemble(
    ptxas: &PathBuf,
    ptx: &str,
    arch: Arch,
    tag: &str,
) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("tessera-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let file = dir.join(format!("{tag}-{arch}.ptx"));
    std::fs::write(&file, ptx).map_err(|e| e.to_string())?;
    let out = Command::new(ptxas)
        .arg(format!("-arch={}", arch.name()))
        .arg("-v")
        .arg(&file)
        .arg("-o")
        .arg(dir.join(format!("{tag}-{arch}.cubin")))
        .output()
        .map_err(|e| format!("cannot run {}: {e}", ptxas.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{}\n(ptx kept at {})", text, file.display()))
    }
}

const ARCHS: [Arch; 7] = [
    Arch::Sm70,
    Arch::Sm75,
    Arch::Sm80,
    Arch::Sm86,
    Arch::Sm89,
    Arch::Sm90,
    Arch::Sm90a,
];

#[test]
fn module_header_and_entries() {
    let kernels: Vec<_> = all_kernels()
        .iter()
        .map(|k| lower(k, Arch::Sm80).unwrap())
        .collect();
    let ptx = module(Arch::Sm80, &kernels);
    assert!(ptx.contains(".version 7.0\n.target sm_80\n.address_size 64\n"));
    assert_eq!(ptx.matches(".visible .entry ").count(), kernels.len());
    let ptx90a = module(Arch::Sm90a, &[]);
    assert!(ptx90a.contains(".version 8.0\n.target sm_90a\n"));
}

#[test]
fn fast_math_per_arch() {
    let k = crate::ir::target::tests::everything();
    let p70 = module(Arch::Sm70, &[lower(&k, Arch::Sm70).unwrap()]);
    let p80 = module(Arch::Sm80, &[lower(&k, Arch::Sm80).unwrap()]);
    assert!(p80.contains("tanh.approx.f32"));
    assert!(!p70.contains("tanh.approx"));
    assert!(
        p70.contains("ex2.approx.f32") && p70.contains("0f3FB8AA3B"),
        "exp scales by log2(e)"
    );
}

#[test]
fn ptx_snapshots() {
    let k = crate::ir::target::tests::vadd();
    insta::assert_snapshot!(
        "vadd_sm80_ptx",
        module(Arch::Sm80, &[lower(&k, Arch::Sm80).unwrap()])
    );
}

/// Every test kernel, in one module per arch, assembles with ptxas.
#[test]
fn ptxas_accepts_every_kernel_for_every_arch() {
    let Some(ptxas) = find_ptxas() else {
        eprintln!("notice: ptxas not found (set TESSERA_PTXAS); PTX not assembled");
        return;
    };
    let mut failures = Vec::new();
    for arch in ARCHS {
        let kernels: Vec<_> = all_kernels()
            .iter()
            .map(|k| lower(k, arch).unwrap())
            .collect();
        let ptx = module(arch, &kernels);
        // For running the kernels on a GPU elsewhere (see the module doc).
        if let Some(dir) = std::env::var_os("TESSERA_PTX_DIR") {
            std::fs::write(PathBuf::from(dir).join(format!("{arch}.ptx")), &ptx)
                .expect("write TESSERA_PTX_DIR");
        }
        match assemble(&ptxas, &ptx, arch, "all") {
            Ok(report) => {
                for k in &kernels {
                    assert!(
                        report.contains(&format!("Compiling entry function '{}'", k.name)),
                        "{arch}: ptxas did not compile {}:\n{report}",
                        k.name
                    );
                }
            }
            Err(e) => failures.push(format!("{arch}:\n{e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
