//! HIP printer tests: the printed unit of hand-built kernels (snapshots),
//! and refusals.

use super::{kernel_text, module, HipError};
use crate::check::DType;
use crate::ir::target::tests::{gemm, softmax_block_f16, softmax_rows, vadd};
use crate::ir::target::{lower, tests::all_kernels};
use crate::target::Arch;

fn hip(k: &crate::ir::tile::Kernel, arch: Arch) -> String {
    module(arch, &[lower(k, arch).unwrap()]).unwrap()
}

/// A copy (vector add: predicated loads and stores), a row reduction and
/// softmax on 32-lane waves (`ds_swizzle` butterflies, the cross-wave step
/// through LDS), an f16 softmax on 64-lane waves (`ds_bpermute` across the
/// wave's halves), and a GEMM on FMAs (operands staged in LDS).
#[test]
fn snapshots() {
    insta::assert_snapshot!("vadd_gfx942", hip(&vadd(), Arch::Gfx942));
    insta::assert_snapshot!("softmax_rows_gfx1100", hip(&softmax_rows(), Arch::Gfx1100));
    insta::assert_snapshot!(
        "softmax_f16_gfx942",
        hip(&softmax_block_f16(), Arch::Gfx942)
    );
    insta::assert_snapshot!(
        "gemm_f16_gfx90a",
        hip(&gemm(16, 16, 16, 4, DType::F16), Arch::Gfx90a)
    );
}

#[test]
fn nvidia_kernels_have_no_hip() {
    let k = lower(&all_kernels()[0], Arch::Sm90).unwrap();
    assert_eq!(kernel_text(&k), Err(HipError::NotAmd(Arch::Sm90)));
    assert!(module(Arch::Sm80, &[]).is_err());
}

#[test]
fn every_test_kernel_prints_for_every_amd_arch() {
    for arch in [Arch::Gfx90a, Arch::Gfx942, Arch::Gfx1100] {
        let kernels: Vec<_> = all_kernels()
            .iter()
            .map(|k| lower(k, arch).unwrap())
            .collect();
        let text = module(arch, &kernels).unwrap();
        for k in &kernels {
            assert!(
                text.contains(&format!("void {}(", k.name)),
                "{arch}: {}",
                k.name
            );
        }
    }
}

/// Every kernel of the standard library, the examples and the tests (see
/// `corpus_units`) prints as HIP that clang compiles for
/// gfx90a, gfx942 and gfx1100 with no error and no warning. Without clang
/// (`TESSERA_CLANG`, or `clang++-19` on `PATH`) it fails under CI and only
/// prints the units elsewhere. `TESSERA_HIP_DIR` keeps the units and objects.
#[test]
fn corpus_kernels_compile_with_clang() {
    let started = std::time::Instant::now();
    let clang = super::clang::find();
    if clang.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "clang not found: set {} or install clang-19 and lld-19 (scripts/test.sh does)",
            super::clang::CLANG_ENV
        );
        eprintln!("notice: clang++-19 not found (set TESSERA_CLANG); HIP printed, not compiled");
    }
    let units = corpus_units();
    assert!(units.len() >= 3 * 160, "{}", units.len());
    let Some(clang) = clang else { return };
    let dir = match std::env::var_os("TESSERA_HIP_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => std::env::temp_dir().join(format!("tessera-hip-{}", std::process::id())),
    };
    // Many files share kernels (the examples' copies in tests/): each
    // distinct unit compiles once, largest first so that the long ones
    // overlap the rest.
    let mut distinct: Vec<&Unit> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for u in &units {
        if seen.insert((u.arch, u.source.as_str())) {
            distinct.push(u);
        }
    }
    distinct.sort_by_key(|u| std::cmp::Reverse(u.source.len()));
    let jobs: Vec<_> = distinct
        .iter()
        .map(|u| (u.arch, u.stem.clone(), u.source.clone()))
        .collect();
    let mut failures = Vec::new();
    for (u, r) in distinct
        .iter()
        .zip(super::clang::compile_all(&clang, &dir, &jobs))
    {
        match r {
            Ok(c) if c.ok && c.problems().is_empty() => {}
            Ok(c) => failures.push(format!(
                "{} {}: {}:\n{}",
                u.arch,
                u.path,
                u.kernel,
                c.problems().join("\n")
            )),
            Err(e) => failures.push(e),
        }
    }
    if std::env::var_os("TESSERA_HIP_DIR").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!(
        "{} HIP units ({} distinct) compiled by {} in {:.1} s",
        units.len(),
        distinct.len(),
        clang.display(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// One kernel of the corpus printed as a HIP unit for one arch.
pub(crate) struct Unit {
    pub arch: Arch,
    /// The file, relative to the repository root.
    pub path: String,
    pub kernel: String,
    /// A file name for the unit: arch, file stem and kernel.
    pub stem: String,
    pub source: String,
}

/// The HIP unit of every kernel of the corpus (stdlib/, examples/, tests/
/// but tests/fuzz/) for each AMD arch. A kernel that lowers but does not
/// print is a failure. The fuzz cases reproduce compiler hangs and crashes
/// (their Target IR is verified with the rest); one of them, a 1,023-slot
/// i8 tile per thread, takes clang 40 s per arch.
pub(crate) fn corpus_units() -> Vec<Unit> {
    use crate::backend::corpus;
    let root = corpus::root();
    let mut units = Vec::new();
    let mut failures = Vec::new();
    for arch in [Arch::Gfx90a, Arch::Gfx942, Arch::Gfx1100] {
        for path in corpus::files(&["stdlib", "examples", "tests"]) {
            if path.starts_with(root.join("tests/fuzz")) {
                continue;
            }
            let rel = path
                .strip_prefix(&root)
                .unwrap_or(&path)
                .display()
                .to_string();
            corpus::with_kernels(&path, arch, &mut |db, kernels| {
                for k in kernels {
                    let one = [(k.name.clone(), k.item, k.offset)];
                    match crate::db::hip_module(db, &one, db.options(), &k.spec) {
                        Ok(source) => units.push(Unit {
                            arch,
                            stem: format!("{arch}-{}-{}", rel.replace(['/', '.'], "_"), k.name),
                            path: rel.clone(),
                            kernel: k.name,
                            source,
                        }),
                        // Over the size limit on purpose (their UI and fuzz cases).
                        Err(d) if !d.is_empty() && d.iter().all(|d| d.code == "E0119") => {}
                        Err(d) => failures.push(format!("{arch} {rel}: {}: {d:?}", k.name)),
                    }
                }
            });
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    units
}
