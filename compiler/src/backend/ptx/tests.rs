//! PTX tests that need more than one file's `tsrc emit`: assembly with NVIDIA's
//! ptxas of every hand-built kernel, of the corpus and of the kernels
//! whole-tensor functions generate. What the PTX of a kernel must look like
//! (vector accesses, cp.async pipelines, mma shapes per arch, ...) is stated by
//! the codegen filetests, `tests/codegen/` (`docs/testing.md`).
//!
//! ptxas is found through `TESSERA_PTXAS` (the path of the binary; CI sets it),
//! else at `/work/ptxas/nvidia/cuda_nvcc/bin/ptxas`; without either the
//! assembly tests print a notice and check only the printer's own output.

use std::path::PathBuf;
use std::process::Command;

use super::module;
use crate::ir::target::{lower, tests::all_kernels};
use crate::target::{select_mma, Arch};

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
        let ptx = module(arch, &kernels).unwrap();
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

/// Every kernel of the stdlib, the examples, the brief and the UI cases that
/// checks cleanly and lowers to Tile IR (with its defaults, or with every tensor
/// dim and const without default specialised to 64) lowers to Target IR (none
/// is "not supported yet") and assembles with ptxas, for sm_70, sm_80, sm_90,
/// sm_90a.
#[test]
fn corpus_kernels_assemble_with_ptxas() {
    use crate::backend::corpus;
    use crate::db::{ptx_module, target_ir};
    let files = corpus::files(&[
        "stdlib",
        "examples",
        "tests/ui",
        "compiler/src/ir/tile/testdata",
    ]);
    let ptxas = find_ptxas();
    if ptxas.is_none() {
        eprintln!("notice: ptxas not found (set TESSERA_PTXAS); lowering only");
    }
    let (mut lowered, mut assembled) = (0usize, 0usize);
    let mut unsupported = Vec::new();
    let mut failures = Vec::new();
    for arch in [Arch::Sm70, Arch::Sm80, Arch::Sm90, Arch::Sm90a] {
        for path in &files {
            let text = std::fs::read_to_string(path).unwrap();
            if text.starts_with("# arch:") {
                continue;
            }
            corpus::with_kernels(path, arch, &mut |db, kernels| {
                let mut ok = Vec::new();
                for k in kernels {
                    let where_ = format!("{} {}: {}", arch, path.display(), k.name);
                    match target_ir(db, k.item, db.options(), k.spec.clone()) {
                        Ok(t) => {
                            if let Err(e) = crate::ir::target::verify::verify(t) {
                                failures.push(format!("{where_}: verify: {e}"));
                            }
                            lowered += 1;
                            ok.push(k);
                        }
                        // Over the size limit on purpose (its UI test): nothing to assemble.
                        Err(d) if d.iter().all(|d| d.code == "E0119") => {}
                        Err(d) if d.iter().all(|d| d.code == "E0512") => {
                            unsupported.push(format!("{where_}: {}", d[0].message))
                        }
                        Err(d) => failures.push(format!("{where_}: {d:?}")),
                    }
                }
                let Some(ptxas) = &ptxas else { return };
                for k in ok {
                    let name = &k.name;
                    let ptx = ptx_module(
                        db,
                        &[(name.clone(), k.item, k.offset)],
                        db.options(),
                        &k.spec,
                    )
                    .expect("lowered above");
                    let tag = format!("corpus-{name}");
                    if let Some(dir) = std::env::var_os("TESSERA_PTX_DIR") {
                        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
                        std::fs::write(
                            PathBuf::from(dir).join(format!("corpus-{arch}-{stem}-{name}.ptx")),
                            &ptx,
                        )
                        .expect("write TESSERA_PTX_DIR");
                    }
                    match assemble(ptxas, &ptx, arch, &tag) {
                        Ok(_) => assembled += 1,
                        Err(e) => failures.push(format!("{arch} {}: {name}: {e}", path.display())),
                    }
                }
            });
        }
    }
    println!("{lowered} kernel lowerings, {assembled} assembled; unsupported: {unsupported:#?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(unsupported.is_empty(), "{unsupported:#?}");
    assert!(lowered >= 4 * 66, "{lowered}");
}

/// Divisors of names the kernel does not have change nothing. (`tsrc emit`
/// rejects such a `-D`, so no codegen filetest can say this: the
/// specialization is built here directly. The rules of divisors that do apply
/// are filetests: tests/codegen/pipeline/ and tests/codegen/memory/.)
#[test]
fn divisors_of_unknown_names_change_nothing() {
    use crate::db::{file_kernels, ptx_module, Database};
    use crate::ir::tile::Specialization;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut db = Database::new();
    db.set_arch(Arch::Sm80);
    let file = db.load_file(&root.join("examples/gemm.tsr")).unwrap();
    let kernels = file_kernels(&db, file);
    let ptx = |spec: &Specialization| ptx_module(&db, &kernels, db.options(), spec).unwrap();
    let plain = ptx(&Specialization::new());
    assert!(!plain.contains("assume"), "{plain}");
    assert_eq!(ptx(&Specialization::new().with_divisor("Q", 16)), plain);
}

/// The kernels whole-tensor functions generate for the semantics decisions
/// lower and assemble: f32 `matmul` at ieee (FMA `dot`) and at tf32, f64
/// `matmul` (an f64 FMA `dot` with an f64 accumulator), and float-to-integer
/// casts that saturate (`cvt.rzi`, then a clamp for 8/16-bit integers).
#[test]
fn generated_matmuls_and_casts_assemble() {
    use crate::db::{function_item, schedule_ir, Database};
    let src = r#"def mm32(a: Tensor["M", "K", f32], b: Tensor["K", "N", f32]) -> Tensor["M", "N", f32]:
    return matmul(a, b)

def mm_tf32(a: Tensor["M", "K", f32], c: Tensor["Z", "K", "N", f32]) -> Tensor["Z", "M", "N", f32]:
    return matmul(a, c, precision="tf32")

def mm64(a: Tensor["Z", "M", "K", f64], b: Tensor["Z", "K", "N", f64]) -> Tensor["Z", "M", "N", f64]:
    return matmul(a, b)

def casts(x: Tensor["N", f32]) -> Tensor["N", i8]:
    return x.to(i8) + x.to(u8).to(i8) + x.to(i16).to(i8)
"#;
    let mut db = Database::new();
    let file = db.set_source("/t/gen.tsr", src.to_string());
    let mut kernels = Vec::new();
    for f in ["mm32", "mm_tf32", "mm64", "casts"] {
        let (item, _) = function_item(&db, file, f).expect("the function");
        let s = schedule_ir(&db, item, db.options())
            .clone()
            .unwrap_or_else(|e| panic!("{f}: {e}"));
        kernels.extend(s.kernels.iter().cloned());
    }
    assert!(kernels.len() >= 4, "{}", kernels.len());
    let ptxas = find_ptxas();
    for arch in [Arch::Sm70, Arch::Sm80, Arch::Sm90] {
        let lowered: Vec<_> = kernels
            .iter()
            .map(|k| lower(k, arch).unwrap_or_else(|e| panic!("{}: {e:?}", k.name)))
            .collect();
        let ptx = module(arch, &lowered).unwrap();
        let f64_dot = ptx.contains("fma.rn.f64");
        assert!(f64_dot, "{arch}: the f64 matmul multiplies with f64 FMAs");
        assert!(ptx.contains("max.s32"), "{arch}: narrow casts clamp");
        let f32 = crate::target::Elem::F32;
        let tf32 = crate::target::Precision::Tf32;
        if select_mma(&arch.features(), f32, f32, None, tf32).is_some() {
            assert!(ptx.contains(".tf32"), "{arch}: tf32 was asked for");
        }
        if let Some(p) = &ptxas {
            assemble(p, &ptx, arch, "generated-semantics")
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
        }
    }
}

/// Every kind of kernel whole-tensor functions generate (fused flat and
/// every-axis, reductions, transpose, permute and slice copies, copy, softmax,
/// layer norm, batched and integer gemms, kernels inside control-flow regions)
/// goes through Target IR, verifies, and prints into one PTX module per
/// function on the three PTX families; with ptxas, each module assembles.
#[test]
fn generated_kernels_lower_to_target_ir_and_ptx() {
    use crate::db::{function_item, schedule_ir, Database};
    let srcs = [
        (
            r#"def scaled_sum(a: Tensor["M", "N", f32], b: Tensor["M", "N", f32]) -> Tensor["M", "N", f32]:
    return a * 0.5 + b
"#,
            "scaled_sum",
        ),
        (
            r#"def f(x: Tensor["B", "H", "N", "M", f32], mask: Tensor["N", "M", f32], s: f32) -> Tensor["B", "H", "N", "M", f32]:
    return (x + mask) * s
"#,
            "f",
        ),
        (
            r#"def red(x: Tensor["B", "M", "N", f16], i: Tensor["M", "N", i32]) -> Tensor["B", "N", f32]:
    return sum(x, dim=1).to(f32) + min(x, dim=1).to(f32) * mean(i)
"#,
            "red",
        ),
        (
            r#"def abt(a: Tensor["M", "K", f16], b: Tensor["N", "K", f16]) -> Tensor["M", "N", f32]:
    return matmul(a, b.T).to(f32)
"#,
            "abt",
        ),
        (
            r#"def sa(x: Tensor["A", "K", "C", f32], y: Tensor["A", "K", bf16]) -> Tensor["A", "K", "C", f32]:
    return softmax(x, dim=1) + layer_norm(y, None, None).to(f32)[:, :, None]
"#,
            "sa",
        ),
        (
            r#"def bm(a: Tensor["B", "H", "S", "D", bf16], b: Tensor["H", "D", "T", bf16]) -> Tensor["B", "H", "S", "T", f32]:
    return (a @ b).to(f32)
"#,
            "bm",
        ),
        (
            r#"def pk(x: Tensor["B", "M", "N", f16], i: i32) -> Tensor["N", "M", f32]:
    return transpose(x, 0, 2)[:, :, 1].to(f32) + x[i, :, -1][None, :].to(f32) + x[0, 0, 0].to(f32)
"#,
            "pk",
        ),
        (
            r#"def im(a: Tensor["B", "M", "K", i8], b: Tensor["K", "N", i8]) -> Tensor["B", "M", "N", i32]:
    return matmul(a, b).to(i32)
"#,
            "im",
        ),
        // Rows in one register tile (4096), ragged (3000), and walked in
        // chunks (65536; 70000 with a ragged last chunk).
        (
            r#"def rows(x: Tensor[64, 4096, bf16], w: Tensor[4096, bf16], b: Tensor[4096, bf16]) -> Tensor[64, 4096, bf16]:
    return softmax(x, dim=-1) + layer_norm(x, w, b) + rms_norm(x, w)
"#,
            "rows",
        ),
        (
            r#"def ragged(x: Tensor[5, 3000, f16], w: Tensor[3000, f16]) -> Tensor[5, 3000, f16]:
    return softmax(x, dim=-1) + layer_norm(x, w, None) + rms_norm(x, w)
"#,
            "ragged",
        ),
        (
            r#"def long(x: Tensor[4, 65536, bf16], y: Tensor[3, 70000, f32], w: Tensor[70000, f32]) -> Tensor[3, 70000, f32]:
    return softmax(x, dim=-1)[:3, :1].to(f32) + softmax(y, dim=-1) + layer_norm(y, w, w) + rms_norm(y, w)
"#,
            "long",
        ),
        (
            r#"def lp(x: Tensor["M", "N", f32], n: i32) -> Tensor["M", "N", f32]:
    for i in range(n):
        if i % 2 == 0:
            x = x * 2.0
    return x
"#,
            "lp",
        ),
    ];
    let ptxas = find_ptxas();
    for (src, name) in srcs {
        let mut db = Database::new();
        let file = db.set_source("/t/gen.tsr", src.to_string());
        let (item, _) = function_item(&db, file, name).expect("the function");
        let s = schedule_ir(&db, item, db.options())
            .clone()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for arch in [Arch::Sm70, Arch::Sm80, Arch::Sm90] {
            let mut lowered = Vec::new();
            for k in &s.kernels {
                let tk =
                    lower(k, arch).unwrap_or_else(|u| panic!("{arch} {}: {}", k.name, u.message));
                assert_eq!(crate::ir::target::verify::verify(&tk), Ok(()), "{}", k.name);
                lowered.push(tk);
            }
            let ptx = module(arch, &lowered).unwrap();
            if let Some(dir) = std::env::var_os("TESSERA_PTX_DIR") {
                std::fs::write(
                    PathBuf::from(dir).join(format!("generated-{arch}-{name}.ptx")),
                    &ptx,
                )
                .expect("write TESSERA_PTX_DIR");
            }
            for k in &s.kernels {
                assert!(
                    ptx.contains(&format!(".entry {}(", k.name)),
                    "{arch} {name}: {}",
                    k.name
                );
            }
            if let Some(p) = &ptxas {
                assemble(p, &ptx, arch, &format!("generated-{name}"))
                    .unwrap_or_else(|e| panic!("{arch} {name}: {e}"));
            }
        }
    }
}
