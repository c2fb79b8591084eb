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

/// Every kernel of the stdlib, the examples, the brief and the UI cases that
/// checks cleanly and lowers to Tile IR (with its defaults, or with every tensor
/// dim and const without default specialised to 64) lowers to Target IR (none
/// is "not supported yet") and assembles with ptxas, for sm_70, sm_80, sm_90,
/// sm_90a.
#[test]
fn corpus_kernels_assemble_with_ptxas() {
    use crate::db::{file_kernels, ptx_module, target_ir, tile_ir, Database};
    use crate::ir::tile::Specialization;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    let mut stack = vec![
        root.join("stdlib"),
        root.join("examples"),
        root.join("tests/ui"),
        root.join("compiler/src/ir/tile/testdata"),
    ];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "tsr") {
                files.push(p);
            }
        }
    }
    files.sort();
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
            let mut db = Database::new();
            db.set_arch(arch);
            let file = db.load_file(path).unwrap();
            if db.diagnostics(file).iter().any(|d| d.is_error()) {
                continue;
            }
            let mut kernels = Vec::new();
            let mut spec = Specialization::new();
            for (name, item, off) in file_kernels(&db, file) {
                let r = tile_ir(&db, item, db.options(), Specialization::new()).clone();
                if matches!(&r, Err(d) if d.iter().any(|d| d.code == "E0511")) {
                    if let Some(sig) = crate::db::item_signature(&db, item) {
                        for p in &sig.params {
                            if let crate::check::Ty::Tensor { dims, .. } = &p.ty {
                                for d in dims {
                                    for s in d.symbols() {
                                        spec.values.insert(s.to_string(), 64);
                                    }
                                }
                            }
                            if p.is_const && !p.has_default {
                                spec.values.insert(p.name.clone(), 64);
                            }
                        }
                    }
                }
                kernels.push((name, item, off));
            }
            let mut ok = Vec::new();
            for (name, item, off) in kernels {
                let spec_k = match tile_ir(&db, item, db.options(), Specialization::new()) {
                    Ok(_) => Specialization::new(),
                    Err(_) => spec.clone(),
                };
                if tile_ir(&db, item, db.options(), spec_k.clone()).is_err() {
                    continue;
                }
                let where_ = format!("{} {}: {name}", arch, path.display());
                match target_ir(&db, item, db.options(), spec_k.clone()) {
                    Ok(k) => {
                        if let Err(e) = crate::ir::target::verify::verify(k) {
                            failures.push(format!("{where_}: verify: {e}"));
                        }
                        lowered += 1;
                        ok.push((name, item, off, spec_k));
                    }
                    Err(d) if d.iter().all(|d| d.code == "E0512") => {
                        unsupported.push(format!("{where_}: {}", d[0].message))
                    }
                    Err(d) => failures.push(format!("{where_}: {d:?}")),
                }
            }
            let Some(ptxas) = &ptxas else { continue };
            for (name, item, off, spec_k) in ok {
                let ptx = ptx_module(&db, &[(name.clone(), item, off)], db.options(), &spec_k)
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
        }
    }
    println!("{lowered} kernel lowerings, {assembled} assembled; unsupported: {unsupported:#?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(unsupported.is_empty(), "{unsupported:#?}");
    assert!(lowered >= 4 * 66, "{lowered}");
}

/// The brief's flash attention (D specialised): its q, k and v tiles feed only
/// tensor-core dots, so on sm_80+ they are copied with cp.async straight into
/// the swizzled operand buffers (no registers), and ordinary loads elsewhere.
#[test]
fn dot_operands_use_async_copies_where_alignment_is_proven() {
    use crate::db::{file_kernels, target_ir, Database};
    use crate::ir::target::Inst;
    let src = include_str!("../../ir/tile/testdata/brief.tsr");
    let spec = crate::ir::tile::Specialization::new().with("D", 64);
    let count = |arch: Arch, name: &str| {
        let mut db = Database::new();
        db.set_arch(arch);
        let file = db.set_source("/t/brief.tsr", src.to_string());
        let (_, item, _) = file_kernels(&db, file)
            .into_iter()
            .find(|k| k.0 == name)
            .unwrap();
        let k = target_ir(&db, item, db.options(), spec.clone())
            .clone()
            .unwrap();
        let mut n = 0;
        k.walk(&mut |i| {
            if let Inst::CpAsync { bytes: 16, .. } = i {
                n += 1
            }
        });
        n
    };
    // q [128, 64] bf16 = 1024 chunks of 16 bytes over 128 threads (copied at
    // its dot), k and v 512 each, pipelined (num_stages = 2): copied in the
    // prologue and again one iteration ahead in the loop.
    assert_eq!(count(Arch::Sm80, "flash_attn"), 8 + 2 * (4 + 4));
    assert_eq!(count(Arch::Sm90, "flash_attn"), 24);
    assert_eq!(count(Arch::Sm75, "flash_attn"), 0);
    // The brief's gemm has run-time K and N: row alignment is not provable.
    assert_eq!(count(Arch::Sm80, "gemm"), 0);
}

/// The brief's gemm with K and N specialised (rows 16-byte aligned) is
/// software-pipelined over its num_stages = 3: two iterations of copies in
/// flight, three stages of each operand in shared memory.
#[test]
fn gemm_loads_are_pipelined_over_num_stages() {
    use crate::db::{file_kernels, target_ir, Database};
    use crate::ir::target::Inst;
    let src = include_str!("../../ir/tile/testdata/brief.tsr");
    let spec = crate::ir::tile::Specialization::new()
        .with("K", 96)
        .with("N", 160);
    let mut db = Database::new();
    db.set_arch(Arch::Sm80);
    let file = db.set_source("/t/brief.tsr", src.to_string());
    let (_, item, _) = file_kernels(&db, file)
        .into_iter()
        .find(|k| k.0 == "gemm")
        .unwrap();
    let k = target_ir(&db, item, db.options(), spec).clone().unwrap();
    let mut waits = Vec::new();
    k.walk(&mut |i| {
        if let Inst::CpAsyncWait { pending } = i {
            waits.push(*pending)
        }
    });
    // In the loop: wait until at most 2 groups are pending; after it: drain.
    assert_eq!(waits, vec![2, 0]);
    let pipes: Vec<_> = k
        .smem
        .iter()
        .filter(|b| b.name.starts_with("pipe"))
        .collect();
    assert_eq!(pipes.len(), 2);
    // A [128, 32] and B [32, 128] f16, three stages each.
    assert!(pipes.iter().all(|b| b.bytes == 3 * 128 * 32 * 2));
    assert_eq!(k.smem_bytes(), 2 * 3 * 128 * 32 * 2);
}

/// The PTX and Target IR of `kernel` in `path` (relative to the repository)
/// for `arch` under `spec`.
fn source_kernel(
    path: &str,
    kernel: &str,
    arch: Arch,
    spec: &crate::ir::tile::Specialization,
) -> (String, crate::ir::target::Kernel) {
    use crate::db::{file_kernels, ptx_module, target_ir, Database};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut db = Database::new();
    db.set_arch(arch);
    let file = db.load_file(&root.join(path)).unwrap();
    let k = file_kernels(&db, file)
        .into_iter()
        .find(|k| k.0 == kernel)
        .unwrap();
    let ptx = ptx_module(&db, std::slice::from_ref(&k), db.options(), spec).unwrap();
    let t = target_ir(&db, k.1, db.options(), spec.clone())
        .clone()
        .unwrap();
    (ptx, (*t).clone())
}

fn gemm_divisors() -> crate::ir::tile::Specialization {
    crate::ir::tile::Specialization::new()
        .with_divisor("K", 8)
        .with_divisor("N", 8)
}

/// `-D K%8 -D N%8` (f16 rows of A and B 16-byte aligned) on the example gemm,
/// whose M, N and K stay run-time values: its operands are copied with
/// cp.async, software-pipelined over num_stages = 3 as with K and N fixed, the
/// kernel traps at entry when K or N is not a multiple of 8, and ptxas
/// accepts it for sm_80 and sm_90.
#[test]
fn divisibility_specialised_gemm_is_pipelined_and_assembles() {
    use crate::ir::target::Inst;
    let spec = gemm_divisors();
    for arch in [Arch::Sm80, Arch::Sm90] {
        let (ptx, k) = source_kernel("examples/gemm.tsr", "gemm", arch, &spec);
        assert!(ptx.contains("cp.async.cg.shared.global"), "{arch}");
        assert!(ptx.contains("cp.async.wait_group 2;"), "{arch}");
        assert!(ptx.contains("// assume K % 8 == 0 (-D K%8); trap otherwise"));
        assert!(ptx.contains("// assume N % 8 == 0 (-D N%8); trap otherwise"));
        assert_eq!(ptx.matches(" trap;").count(), 2, "{arch}");
        // No scalar operand loads are left: everything A and B goes through cp.async.
        assert!(!ptx.contains("ld.global.b16"), "{arch}");
        // M, N and K are still parameters (nothing was fixed).
        for p in ["gemm_param_M", "gemm_param_N", "gemm_param_K"] {
            assert!(ptx.contains(p), "{arch}: {p}");
        }
        let mut waits = Vec::new();
        k.walk(&mut |i| {
            if let Inst::CpAsyncWait { pending } = i {
                waits.push(*pending)
            }
        });
        assert_eq!(waits, vec![2, 0], "{arch}");
        let pipes = k.smem.iter().filter(|b| b.name.starts_with("pipe")).count();
        assert_eq!(pipes, 2, "{arch}");
        if let Some(ptxas) = find_ptxas() {
            let report = assemble(&ptxas, &ptx, arch, "gemm-div8")
                .unwrap_or_else(|e| panic!("{arch}: ptxas rejected the gemm:\n{e}"));
            assert!(
                report.contains("Compiling entry function 'gemm'"),
                "{report}"
            );
        } else {
            eprintln!("notice: ptxas not found (set TESSERA_PTXAS); PTX not assembled");
        }
    }
    let (ptx, _) = source_kernel("examples/gemm.tsr", "gemm", Arch::Sm80, &spec);
    insta::assert_snapshot!("gemm_div8_sm80_ptx", ptx);
}

/// Without a divisor the gemm keeps its plain predicated scalar loads (16-byte
/// alignment of its rows is not provable), and no entry check; a divisor that
/// does not make rows 16-byte aligned (`K%4` for f16) only adds the check.
#[test]
fn gemm_without_divisors_is_unchanged() {
    let plain = crate::ir::tile::Specialization::new();
    let (ptx, _) = source_kernel("examples/gemm.tsr", "gemm", Arch::Sm80, &plain);
    assert!(!ptx.contains("cp.async"), "{ptx}");
    assert!(!ptx.contains("trap") && !ptx.contains("assume"), "{ptx}");
    assert!(ptx.contains("ld.global.b16"), "{ptx}");
    let four = crate::ir::tile::Specialization::new()
        .with_divisor("K", 4)
        .with_divisor("N", 4);
    let (ptx4, _) = source_kernel("examples/gemm.tsr", "gemm", Arch::Sm80, &four);
    assert!(!ptx4.contains("cp.async"), "{ptx4}");
    assert_eq!(ptx4.matches(" trap;").count(), 2);
    // Divisors of names the kernel does not have change nothing.
    let other = crate::ir::tile::Specialization::new().with_divisor("Q", 16);
    let (same, _) = source_kernel("examples/gemm.tsr", "gemm", Arch::Sm80, &other);
    assert_eq!(same, ptx);
}

/// A divisor of an integer scalar parameter (a row stride) and of a dim
/// proves 16-byte alignment of an f32 row: vector loads and stores, with the
/// stride checked at entry.
#[test]
fn scalar_parameter_divisor_vectorises_rows() {
    use crate::db::{file_kernels, ptx_module, Database};
    let src = "@kernel(grid=(R,), num_warps=1)\n\
def rows(x: Tensor[\"T\", f32], out: Tensor[\"T\", f32], stride: i32, R: i32):\n    \
r = program_id(0) * stride\n    \
store(out[r : r + 128], load(x[r : r + 128]) * 2.0)\n";
    let ptx = |spec: &crate::ir::tile::Specialization| {
        let mut db = Database::new();
        db.set_arch(Arch::Sm80);
        let file = db.set_source("/t/rows.tsr", src.to_string());
        assert!(
            db.diagnostics(file).is_empty(),
            "{:?}",
            db.diagnostics(file)
        );
        ptx_module(&db, &file_kernels(&db, file), db.options(), spec).unwrap()
    };
    let plain = ptx(&crate::ir::tile::Specialization::new());
    assert!(!plain.contains("ld.global.v4"), "{plain}");
    let spec = crate::ir::tile::Specialization::new()
        .with_divisor("stride", 4)
        .with_divisor("T", 4);
    let vec = ptx(&spec);
    assert!(vec.contains("ld.global.v4.f32"), "{vec}");
    assert!(vec.contains("st.global.v4.f32"), "{vec}");
    assert!(
        vec.contains("// assume stride % 4 == 0 (-D stride%4)"),
        "{vec}"
    );
    assert_eq!(vec.matches(" trap;").count(), 2, "{vec}");
    // Only the stride: the bound T may cut a vector, so loads stay scalar.
    let stride_only = ptx(&crate::ir::tile::Specialization::new().with_divisor("stride", 4));
    assert!(!stride_only.contains("ld.global.v4"), "{stride_only}");
    if let Some(ptxas) = find_ptxas() {
        assemble(&ptxas, &vec, Arch::Sm80, "rows-div4").unwrap();
    }
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
        let ptx = module(arch, &lowered);
        let f64_dot = ptx.contains("fma.rn.f64");
        assert!(f64_dot, "{arch}: the f64 matmul multiplies with f64 FMAs");
        assert!(ptx.contains("max.s32"), "{arch}: narrow casts clamp");
        if arch >= Arch::Sm80 {
            assert!(ptx.contains(".tf32"), "{arch}: tf32 was asked for");
        }
        if let Some(p) = &ptxas {
            assemble(p, &ptx, arch, "generated-semantics")
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
        }
    }
}
