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
/// `corpus_units`) that the estimate says can run prints as HIP that clang
/// compiles for gfx90a, gfx942 and gfx1100 with no error and no warning. Without clang (`TESSERA_CLANG`, or
/// `clang++-19` on `PATH`) it fails under CI (`CI=true`) and only prints the
/// units elsewhere. `TESSERA_HIP_DIR` keeps the units and objects.
#[test]
fn corpus_kernels_compile_with_clang() {
    let started = std::time::Instant::now();
    let dir = match std::env::var_os("TESSERA_HIP_DIR") {
        Some(d) => std::path::PathBuf::from(d),
        None => std::env::temp_dir().join(format!("tessera-hip-{}", std::process::id())),
    };
    let Some(compiled) = compile_corpus(&dir) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "clang not found: set {} or install clang-19 and lld-19 (scripts/test.sh does)",
            super::clang::CLANG_ENV
        );
        eprintln!("notice: clang++-19 not found (set TESSERA_CLANG); HIP printed, not compiled");
        return;
    };
    assert!(compiled.len() >= 3 * 160, "{}", compiled.len());
    let mut failures = Vec::new();
    for (u, r) in &compiled {
        match r {
            Ok(c) if c.ok && c.problems().is_empty() => {}
            Ok(c) => failures.push(format!(
                "{} {}: {}:\n{}",
                u.arch,
                u.path,
                u.kernel,
                c.problems().join("\n")
            )),
            Err(e) => failures.push(e.clone()),
        }
    }
    if std::env::var_os("TESSERA_HIP_DIR").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!(
        "{} HIP units compiled in {:.1} s",
        compiled.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Every kernel of the corpus (see `corpus_units`) for each AMD arch, with
/// what clang made of its unit (its stderr holds the resource remarks of
/// `-Rpass-analysis=kernel-resource-usage`, its object is in `dir`); `None`
/// without clang. Many files share kernels (the examples' copies in
/// tests/): each distinct unit compiles once, largest first so that the
/// long ones overlap the rest, and its result is given to each of its units.
pub(crate) fn compile_corpus(
    dir: &std::path::Path,
) -> Option<Vec<(Unit, Result<super::clang::Compiled, String>)>> {
    let clang = super::clang::find()?;
    let units = corpus_units();
    let mut first: std::collections::HashMap<(Arch, &str), usize> = Default::default();
    let mut distinct: Vec<usize> = Vec::new();
    for (i, u) in units.iter().enumerate() {
        first.entry((u.arch, u.source.as_str())).or_insert_with(|| {
            distinct.push(i);
            i
        });
    }
    distinct.sort_by_key(|&i| std::cmp::Reverse(units[i].source.len()));
    let jobs: Vec<_> = distinct
        .iter()
        .map(|&i| {
            (
                units[i].arch,
                units[i].stem.clone(),
                units[i].source.clone(),
            )
        })
        .collect();
    let results: std::collections::HashMap<usize, Result<super::clang::Compiled, String>> =
        distinct
            .iter()
            .copied()
            .zip(super::clang::compile_all(&clang, dir, &jobs))
            .collect();
    let of: Vec<usize> = units
        .iter()
        .map(|u| first[&(u.arch, u.source.as_str())])
        .collect();
    Some(
        units
            .into_iter()
            .zip(of)
            .map(|(u, i)| {
                let r = results[&i].clone();
                (u, r)
            })
            .collect(),
    )
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
                    // One the estimate says cannot run (more LDS than a
                    // workgroup has: E0603) is one clang must refuse, which
                    // tests/clang_amdgpu.rs checks.
                    let launches =
                        crate::db::kernel_resources(db, k.item, k.offset, db.options(), &k.spec)
                            .map_or(true, |(r, _)| !r.occupancy.cannot_launch());
                    if !launches {
                        continue;
                    }
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

/// Every definition the printer can put in a unit (helpers, memory types)
/// is valid C++ for clang, including those no corpus kernel uses: a unit
/// naming all of them (a name in a comment is enough to pull in its
/// definition, and clang checks the body of an unused inline function too).
#[test]
fn every_definition_compiles() {
    let mut names: Vec<String> = [
        "div_i32",
        "rem_i32",
        "div_u32",
        "rem_u32",
        "div_i64",
        "rem_i64",
        "div_u64",
        "rem_u64",
        "shl_i32",
        "shl_u32",
        "shl_i64",
        "shl_u64",
        "shr_i32",
        "shr_u32",
        "shr_i64",
        "shr_u64",
        "tf32",
        "num_groups",
    ]
    .iter()
    .map(|n| format!("tsr_{n}"))
    .collect();
    for to in ["i32", "u32", "i64", "u64"] {
        for from in ["f32", "f64"] {
            names.push(format!("tsr_cvt_{to}_{from}"));
        }
    }
    for m in ["f64", "f32", "u16", "i64", "i32", "i16", "i8", "u32", "u8"] {
        names.push(format!("tsr_{m}"));
        for n in [2, 4, 8] {
            names.push(format!("tsr_{m}x{n}"));
        }
    }
    for n in &names {
        assert!(super::definition(n).is_some(), "{n}");
    }
    let kernel = format!(
        "extern \"C\" __global__ __launch_bounds__(64) void k() {{\n  // {}\n}}\n",
        names.join(" ")
    );
    let unit = super::module_of(Arch::Gfx942, std::slice::from_ref(&kernel)).unwrap();
    for n in &names {
        assert!(
            unit.contains(&format!("{n}(")) || unit.contains(&format!("{n};")),
            "{n}"
        );
    }
    let Some(clang) = super::clang::find() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("tessera-hip-defs-{}", std::process::id()));
    for arch in [Arch::Gfx90a, Arch::Gfx1100] {
        let unit = super::module_of(arch, std::slice::from_ref(&kernel)).unwrap();
        let c = super::clang::compile(&clang, arch, &unit, &dir, &format!("defs-{arch}")).unwrap();
        assert!(c.ok && c.problems().is_empty(), "{arch}:\n{}", c.stderr);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A kernel or parameter named like a C++ keyword or like the printer's own
/// names still compiles: the kernel keeps its name as its symbol (an asm
/// label), parameters get a suffix.
#[test]
fn names_that_clash_with_cpp() {
    use crate::db::{file_kernels, hip_module, Database};
    let text = "@kernel(grid=(1,))\ndef new(x: Tensor[64, f32], r12: f32, tsr_smem: i32, float: i32):\n    store(x[0 : 64], load(x[0 : 64]) * r12)\n";
    let dir = std::env::temp_dir().join(format!("tessera-hip-names-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("names.tsr");
    std::fs::write(&path, text).unwrap();
    let mut db = Database::new();
    db.set_arch(Arch::Gfx942);
    let file = db.load_file(&path).unwrap();
    let kernels = file_kernels(&db, file);
    let spec = crate::ir::tile::Specialization::new();
    let unit = hip_module(&db, &kernels, db.options(), &spec).unwrap();
    assert!(
        unit.contains("void tsr_kernel_new(void *x, float r12_arg, int tsr_smem_arg, int float_arg) __asm__(\"new\");"),
        "{unit}"
    );
    if let Some(clang) = super::clang::find() {
        let c = super::clang::compile(&clang, Arch::Gfx942, &unit, &dir, "names").unwrap();
        assert!(c.ok && c.problems().is_empty(), "{}", c.stderr);
        assert!(c.stderr.contains("Function Name: new"), "{}", c.stderr);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
