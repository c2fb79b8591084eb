//! Validation against NVIDIA's assembler: PTX goes through `ptxas -v` (the one
//! named by `TESSERA_PTXAS`; `scripts/test.sh` fetches it with
//! `scripts/fetch-ptxas.sh`) for sm_70, sm_80, sm_90 and sm_90a, and what it
//! reports is read back. Without `TESSERA_PTXAS` the test is skipped with a
//! note, except under CI (`CI` set), where that is a failure.
//!
//! The register estimate is compared with ptxas's count on three sets, each
//! printed with its median, 90th percentile and worst error per arch:
//!
//! * the corpus (stdlib/, tests/ui/valid/, examples/), which the model's
//!   rules were tuned on;
//! * tests/estimate/, kernels written afterwards and never tuned against;
//! * generated kernels ([`generate`]), seeds `0..200` by default or
//!   `TESSERA_GEN_SEEDS=a..b` (a held-out range, to measure without tuning
//!   on it); every one must check clean, compile and assemble;
//! * the in-bounds fast path (`tests/ptxas/fast_path.tsr`: bf16 row kernels
//!   with and without `-D N%16`), held to the goal like the corpus;
//! * the kernels generated for the whole-tensor functions of
//!   `tests/ptxas/whole.tsr` (row kernels short and long, fused chains,
//!   reductions, transposes), held where they stand (`WHOLE_BOUNDS`);
//! * GEMM mainloops with pipelined loads (`tests/ptxas/pipelined.tsr` with
//!   `-D K%16 -D N%16`: the rotated mma.sync loop, wgmma on sm_90a), held to
//!   the goal like the corpus;
//! * wgmma mainloops whose B is given as `[N, K]` (`tests/ptxas/kmajor.tsr`
//!   on sm_90a with `-D K%16`: bf16, and f8 with its promoted sums), held to
//!   the goal like the corpus.
//!
//! Where ptxas fills every register a thread of the block can have (255, or
//! 64 in a block of 1024 threads), the comparison is at that limit.
//!
//! `TESSERA_PTXAS_ONLY=corpus,fresh,generated,fast_path,whole,pipelined,kmajor` runs only the named sets (and
//! none of the probes of the model's constants). So
//! `TESSERA_PTXAS_ONLY=generated TESSERA_GEN_SEEDS=1000..1200 cargo test -p
//! tessera-compiler --test ptxas` measures a held-out range, and
//! `TESSERA_ESTIMATE_DUMP=dir` writes every measured kernel's PTX and counts
//! to `dir` (see `dump`).

mod common;
#[path = "ptxas/generate.rs"]
mod generate;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tessera::backend::occupancy::max_regs_in_block;
use tessera::backend::ptxas::{self, PtxasError};
use tessera::backend::resources::{self, estimate_regs, Node};
use tessera::db::{file_functions, file_kernels, schedule_ir, tile_ir, Database};
use tessera::ir::tile::Specialization;
use tessera::target::ptxas::{LOAD_WINDOW_WORDS, PTXAS_OVERHEAD, SLOW_DIV_REGS, SLOW_SQRT_REGS};
use tessera::target::Arch;

use common::corpus::{root, specializations, tsr_files};

const ARCHS: [Arch; 4] = [Arch::Sm70, Arch::Sm80, Arch::Sm90, Arch::Sm90a];

/// A hand-written module (one bounds-checked elementwise kernel with a static
/// shared buffer, one empty kernel), to check the fetch/run/parse path.
const SAMPLE: &str = include_str!("ptxas_sample.ptx");

fn main() -> ExitCode {
    let ptxas = match common::tool_or_exit(ptxas::configured(), "ptxas validation") {
        Ok(p) => p,
        Err(code) => return code,
    };
    let mut failures = Vec::new();
    // `TESSERA_PTXAS_ONLY=corpus,fresh,generated,fast_path,whole,big_blocks` (any of them) runs only
    // those comparisons, to measure the estimate without the rest.
    let only = std::env::var("TESSERA_PTXAS_ONLY").ok();
    let part = |name: &str| common::runs(only.as_deref(), name);
    if only.is_none() {
        model_checks(&ptxas, &mut failures);
    }
    if part("corpus") {
        corpus(&ptxas, &mut failures);
    }
    if part("fresh") {
        fresh(&ptxas, &mut failures);
    }
    if part("generated") {
        generated(&ptxas, &mut failures);
    }
    if part("fast_path") {
        fast_path(&ptxas, &mut failures);
    }
    if part("whole") {
        whole(&ptxas, &mut failures);
    }
    if part("kmajor") {
        kmajor(&ptxas, &mut failures);
    }
    if part("pipelined") {
        pipelined(&ptxas, &mut failures);
    }
    if part("big_blocks") {
        big_blocks(&ptxas, &mut failures);
    }
    common::finish(&failures)
}

/// The fetch/run/parse path on a sample, and the calibrated constants of
/// the ptxas model on probes built for each.
fn model_checks(ptxas: &Path, failures: &mut Vec<String>) {
    for arch in ARCHS {
        match ptxas::assemble(ptxas, SAMPLE, arch) {
            Ok(funcs) => {
                let names: Vec<&str> = funcs.iter().map(|f| f.name.as_str()).collect();
                let add = funcs.iter().find(|f| f.name == "add_one");
                match add {
                    Some(f)
                        if f.entry
                            && f.arch == arch.name()
                            && f.smem_bytes == 1024
                            && (2..=255).contains(&f.regs)
                            && f.spill_stores == 0 => {}
                    _ => failures.push(format!("{arch}: unexpected ptxas report {funcs:?}")),
                }
                if names != ["empty", "add_one"] {
                    failures.push(format!("{arch}: functions {names:?}"));
                }
                println!(
                    "ok   sample on {arch}: add_one uses {} registers",
                    add.map_or(0, |f| f.regs)
                );
            }
            Err(e) => failures.push(format!("{arch}: {e}")),
        }
    }

    // Broken PTX must come back as a rejection carrying ptxas's message.
    match ptxas::assemble(ptxas, ".version 8.0\n.target sm_80\n.bogus\n", Arch::Sm80) {
        Err(PtxasError::Rejected { stderr, .. }) if !stderr.is_empty() => {
            println!("ok   broken PTX is rejected")
        }
        other => failures.push(format!("broken PTX: expected a rejection, got {other:?}")),
    }

    // The register model on straight-line code: `n` values loaded through one
    // 64-bit address, all live at once, then multiplied together.
    for arch in ARCHS {
        let mut row = Vec::new();
        for n in [3u32, 4, 8, 12, 16, 20, 24] {
            let (ptx, program) = live_values(n, arch);
            let words = |r: u32| if r < 2 { 2 } else { 1 };
            let estimate = estimate_regs(&program, &words);
            match ptxas::assemble(ptxas, &ptx, arch) {
                Ok(f) if f.len() == 1 => {
                    row.push(format!("{n}:{}/{estimate}", f[0].regs));
                    if f[0].regs != estimate {
                        failures.push(format!(
                            "{arch}: {n} live values: ptxas uses {} registers, the estimate is {estimate}",
                            f[0].regs
                        ));
                    }
                }
                other => failures.push(format!("{arch}: {n} live values: {other:?}")),
            }
        }
        println!("ok   {arch} live values n:ptxas/estimate {}", row.join(" "));
    }

    // The slow-path subroutine of IEEE f32 division, reciprocal and square
    // root: its registers come on top of the values live across it.
    for arch in ARCHS {
        let mut row = Vec::new();
        for (op, scratch) in [
            ("div", SLOW_DIV_REGS),
            ("rcp", SLOW_DIV_REGS),
            ("sqrt", SLOW_SQRT_REGS),
        ] {
            for n in [4u32, 8, 16] {
                let (ptx, program) = slow_path(op, n, arch);
                let words = |r: u32| match r {
                    0 | 1 => 2,
                    r if r == 4 + n => scratch,
                    _ => 1,
                };
                let estimate = estimate_regs(&program, &words);
                match ptxas::assemble(ptxas, &ptx, arch) {
                    Ok(f) if f.len() == 1 => {
                        row.push(format!("{op}{n}:{}/{estimate}", f[0].regs));
                        // Within 2: sm_90 needs up to 2 fewer, sm_70/80 up to
                        // 1 more for a division.
                        if f[0].regs.abs_diff(estimate) > 2 {
                            failures.push(format!(
                                "{arch}: {op} with {n} live values: ptxas uses {} registers, the estimate is {estimate}",
                                f[0].regs
                            ));
                        }
                    }
                    other => failures.push(format!("{arch}: {op} with {n} live values: {other:?}")),
                }
            }
        }
        println!(
            "ok   {arch} slow paths op n:ptxas/estimate {}",
            row.join(" ")
        );
    }

    // The load window: `n` f32 loads summed in order. ptxas issues loads
    // ahead of the additions until LOAD_WINDOW_WORDS of them are in flight.
    for arch in ARCHS {
        let mut row = Vec::new();
        for n in [8u32, 16, 24, 32, 48, 64] {
            let expected = n.min(LOAD_WINDOW_WORDS) + 2 + PTXAS_OVERHEAD;
            match ptxas::assemble(ptxas, &loads_summed(n, arch), arch) {
                Ok(f) if f.len() == 1 => {
                    row.push(format!("{n}:{}/{expected}", f[0].regs));
                    // Within 1: past the window ptxas uses 30 or 31.
                    if f[0].regs.abs_diff(expected) > 1 {
                        failures.push(format!(
                            "{arch}: {n} loads summed: ptxas uses {} registers, the window model {expected}",
                            f[0].regs
                        ));
                    }
                }
                other => failures.push(format!("{arch}: {n} loads summed: {other:?}")),
            }
        }
        println!("ok   {arch} load window n:ptxas/model {}", row.join(" "));
    }

    // Parameters read inside a loop: a grid-stride loop over `k` inputs. On
    // sm_70 and sm_80 ptxas reads the pointers, `alpha` and `N` from the
    // constant bank in the loop; on sm_90 it holds them in registers.
    for arch in ARCHS {
        let mut row = Vec::new();
        for k in 1..=3 {
            let (estimate, ptx) = compile_one(&grid_stride_inputs(k), arch);
            match ptxas::assemble(ptxas, &ptx, arch) {
                Ok(f) if f.len() == 1 => {
                    row.push(format!("{k}:{}/{estimate}", f[0].regs));
                    // Holding the parameters: +28% to +30% on sm_70/sm_80.
                    if f[0].regs.abs_diff(estimate) as f64 > 0.1 * f[0].regs as f64 {
                        failures.push(format!(
                            "{arch}: grid-stride loop over {k} inputs: ptxas uses {} registers, the estimate is {estimate}",
                            f[0].regs
                        ));
                    }
                }
                other => failures.push(format!(
                    "{arch}: grid-stride loop over {k} inputs: {other:?}"
                )),
            }
        }
        println!(
            "ok   {arch} loop parameters k:ptxas/estimate {}",
            row.join(" ")
        );
    }
}

/// PTX that loads `n` floats through one pointer (volatile, so none is
/// reordered past another) and multiplies them, and the same program as a
/// [`Node`] list: registers 0 and 1 are the 64-bit parameter and global
/// address, 2.. the floats, `2 + n` the product.
fn live_values(n: u32, arch: Arch) -> (String, Vec<Node>) {
    let inst = |defs: &[u32], uses: &[u32]| Node::Inst {
        defs: defs.to_vec(),
        uses: uses.to_vec(),
    };
    let mut ptx = format!(
        ".version 8.0\n.target {arch}\n.address_size 64\n.visible .entry k(.param .u64 p)\n{{\n\
         .reg .f32 %f<{}>;\n.reg .b64 %rd<3>;\nld.param.u64 %rd1, [p];\ncvta.to.global.u64 %rd2, %rd1;\n",
        n + 1
    );
    let mut program = vec![inst(&[0], &[]), inst(&[1], &[0])];
    for i in 0..n {
        ptx += &format!("ld.volatile.global.f32 %f{i}, [%rd2+{}];\n", 4 * i);
        program.push(inst(&[2 + i], &[1]));
    }
    ptx += &format!("mov.f32 %f{n}, %f0;\n");
    program.push(inst(&[2 + n], &[2]));
    for i in 1..n {
        ptx += &format!("mul.f32 %f{n}, %f{n}, %f{i};\n");
        program.push(inst(&[2 + n], &[2 + n, 2 + i]));
    }
    ptx += &format!("st.global.f32 [%rd2], %f{n};\nret;\n}}\n");
    program.push(inst(&[], &[1, 2 + n]));
    (ptx, program)
}

/// `n` f32 loads from one address (128 floats apart), summed in load order
/// and the sum stored.
fn loads_summed(n: u32, arch: Arch) -> String {
    let mut ptx = format!(
        ".version 8.0\n.target {arch}\n.address_size 64\n.visible .entry k(.param .u64 p)\n{{\n\
         .reg .f32 %f<{}>;\n.reg .b64 %rd<3>;\nld.param.u64 %rd1, [p];\ncvta.to.global.u64 %rd2, %rd1;\n",
        2 * n + 1
    );
    for i in 0..n {
        ptx += &format!("ld.global.f32 %f{i}, [%rd2+{}];\n", 512 * i);
    }
    ptx += &format!("mov.f32 %f{n}, %f0;\n");
    for i in 1..n {
        ptx += &format!("add.f32 %f{}, %f{}, %f{i};\n", n + i, n + i - 1);
    }
    ptx += &format!("st.global.f32 [%rd2], %f{};\nret;\n}}\n", 2 * n - 1);
    ptx
}

/// [`live_values`] with an IEEE f32 `op` (`div`, `rcp` or `sqrt`) of the first
/// value (and the second, for `div`) in front of the product: registers 0, 1
/// the addresses, 2.. the `n` floats, `2 + n` the product, `3 + n` the
/// result of `op`, `4 + n` the registers of its slow path.
fn slow_path(op: &str, n: u32, arch: Arch) -> (String, Vec<Node>) {
    let inst = |defs: &[u32], uses: &[u32]| Node::Inst {
        defs: defs.to_vec(),
        uses: uses.to_vec(),
    };
    let mut ptx = format!(
        ".version 8.0\n.target {arch}\n.address_size 64\n.visible .entry k(.param .u64 p)\n{{\n\
         .reg .f32 %f<{}>;\n.reg .b64 %rd<3>;\nld.param.u64 %rd1, [p];\ncvta.to.global.u64 %rd2, %rd1;\n",
        n + 2
    );
    let mut program = vec![inst(&[0], &[]), inst(&[1], &[0])];
    for i in 0..n {
        ptx += &format!("ld.volatile.global.f32 %f{i}, [%rd2+{}];\n", 4 * i);
        program.push(inst(&[2 + i], &[1]));
    }
    let r = n + 1;
    match op {
        "div" => {
            ptx += &format!("div.rn.f32 %f{r}, %f0, %f1;\n");
            program.push(inst(&[3 + n, 4 + n], &[2, 3]));
        }
        _ => {
            ptx += &format!("{op}.rn.f32 %f{r}, %f0;\n");
            program.push(inst(&[3 + n, 4 + n], &[2]));
        }
    }
    ptx += &format!("mov.f32 %f{n}, %f{r};\n");
    program.push(inst(&[2 + n], &[3 + n]));
    for i in 1..n {
        ptx += &format!("mul.f32 %f{n}, %f{n}, %f{i};\n");
        program.push(inst(&[2 + n], &[2 + n, 2 + i]));
    }
    ptx += &format!("st.global.f32 [%rd2], %f{n};\nret;\n}}\n");
    program.push(inst(&[], &[1, 2 + n]));
    (ptx, program)
}

/// A kernel with a grid-stride loop that sums `k` f32 inputs (4 per thread),
/// scales the sum by a parameter and stores it.
fn grid_stride_inputs(k: u32) -> String {
    let inputs: Vec<String> = (0..k)
        .map(|j| format!("x{j}: Tensor[\"N\", f32]"))
        .collect();
    let loads: Vec<String> = (0..k)
        .map(|j| format!("load(x{j}[i : i + BLOCK])"))
        .collect();
    format!(
        "@kernel(grid=(132,), num_warps=8)\n\
         def probe({}, out: Tensor[\"N\", f32], alpha: f32, BLOCK: const = 1024):\n    \
         step = num_programs(0) * BLOCK\n    \
         for i in range(program_id(0) * BLOCK, N, step):\n        \
         store(out[i : i + BLOCK], ({}) * alpha)\n",
        inputs.join(", "),
        loads.join(" + ")
    )
}

/// The register estimate and the PTX of the one kernel of `source` on `arch`.
fn compile_one(source: &str, arch: Arch) -> (u32, String) {
    let mut db = Database::new();
    db.set_arch(arch);
    let file = db.set_source("probe.tsr", source.to_string());
    let diags = db.diagnostics(file);
    assert!(!diags.iter().any(|d| d.is_error()), "{diags:?}");
    let (_, item, _) = file_kernels(&db, file)
        .into_iter()
        .next()
        .expect("one kernel");
    let tk = tile_ir(&db, item, db.options(), Specialization::new())
        .as_ref()
        .expect("Tile IR")
        .clone();
    let target = tessera::ir::target::lower(&tk, arch).expect("Target IR");
    let estimate = resources::of_target(&target).regs;
    let ptx = tessera::backend::ptx::module(arch, std::slice::from_ref(&target)).unwrap();
    (estimate, ptx)
}

/// The `.tsr` files of the corpus: stdlib/, tests/ui/valid/, examples/ (not
/// examples/errors/), sorted.
fn corpus_files() -> Vec<PathBuf> {
    tsr_files(&[
        ("stdlib", true),
        ("tests/ui/valid", true),
        ("examples", false),
    ])
}

struct Row {
    kernel: String,
    arch: Arch,
    estimate: u32,
    ptxas: u32,
    /// ptxas spilled: it stopped at its register limit.
    spills: bool,
    /// ptxas used every register a thread of the block can have (with or
    /// without spills; 64 in a block of 1024 threads):
    /// its true demand is at least that, so it bounds the comparison.
    at_limit: bool,
}

impl Row {
    /// The relative error of the estimate. Where ptxas spills, or uses every
    /// register a thread can have (it then rematerialises and reschedules to
    /// fit), it reports its limit, not the kernel's demand; an estimate above
    /// the limit predicted that (W0003), so the comparison is at the limit.
    /// An estimate under it is compared as is.
    fn error(&self) -> f64 {
        let estimate = if self.at_limit {
            self.estimate.min(self.ptxas)
        } else {
            self.estimate
        };
        (estimate as f64 - self.ptxas as f64) / self.ptxas.max(1) as f64
    }
}

/// Whether ptxas's `regs` fill, in its allocation unit (8 a thread), every
/// register a thread of a block of `threads` can have.
fn at_cap(arch: Arch, regs: u32, threads: u32) -> bool {
    let info = arch.info();
    let unit = info.reg_alloc_unit / info.warp_size;
    regs.div_ceil(unit) * unit >= max_regs_in_block(arch, threads)
}

/// The goal for the register estimate: a median error within 10%.
const MEDIAN_BOUND: f64 = 0.10;
/// The goal for the worst error.
const WORST_BOUND: f64 = 0.25;

/// Every kernel of `file` on `arch` (under each of its
/// [`specializations`]): Tile IR, Target IR, PTX, `ptxas -v`, and the
/// register estimate beside ptxas's count. A PTX module ptxas rejects is a
/// failure; kernels that do not lower are listed in `skipped` (or, where
/// `strict`, are failures too).
#[allow(clippy::too_many_arguments)]
fn measure_file(
    ptxas: &Path,
    db: &Database,
    file: tessera::db::SourceFile,
    shown: &str,
    arch: Arch,
    strict: bool,
    divisors: &[(&str, u64)],
    rows: &mut Vec<Row>,
    skipped: &mut Vec<String>,
    failures: &mut Vec<String>,
) {
    let mut missed = Vec::new();
    let mut not_compiled = |what: String| missed.push(what);
    let errors: Vec<String> = db
        .diagnostics(file)
        .iter()
        .filter(|d| d.is_error())
        .map(|d| format!("{} {}", d.code, d.message))
        .collect();
    if !errors.is_empty() {
        not_compiled(format!("{shown} ({arch}): check errors {errors:?}"));
    } else {
        measure_kernels(
            ptxas,
            db,
            file,
            shown,
            arch,
            divisors,
            rows,
            &mut not_compiled,
            failures,
        );
    }
    if strict {
        failures.extend(missed);
    } else {
        skipped.extend(missed);
    }
}

/// [`measure_file`] for a file without check errors.
#[allow(clippy::too_many_arguments)]
fn measure_kernels(
    ptxas: &Path,
    db: &Database,
    file: tessera::db::SourceFile,
    shown: &str,
    arch: Arch,
    divisors: &[(&str, u64)],
    rows: &mut Vec<Row>,
    not_compiled: &mut dyn FnMut(String),
    failures: &mut Vec<String>,
) {
    for (name, item, _) in file_kernels(db, file) {
        let mut specs = specializations(db, item);
        // Each also with every divisibility fact of `divisors` (`-D N%16`),
        // and, where there are several, with all of them at once.
        for (tag, spec) in specs.clone() {
            for &(name, divisor) in divisors {
                specs.push((
                    format!("{tag}[{name}%{divisor}]"),
                    spec.clone().with_divisor(name, divisor),
                ));
            }
            if divisors.len() > 1 {
                let all: Vec<String> = divisors.iter().map(|(n, d)| format!("{n}%{d}")).collect();
                let spec = divisors
                    .iter()
                    .fold(spec.clone(), |s, &(n, d)| s.with_divisor(n, d));
                specs.push((format!("{tag}[{}]", all.join(",")), spec));
            }
        }
        for (tag, spec) in specs {
            let label = format!("{shown}:{name}{tag}");
            let tk = match tile_ir(db, item, db.options(), spec) {
                Ok(k) => k.clone(),
                Err(d) => {
                    let codes: Vec<String> = d
                        .iter()
                        .map(|d| format!("{} {}", d.code, d.message))
                        .collect();
                    not_compiled(format!("{label} ({arch}): Tile IR {codes:?}"));
                    continue;
                }
            };
            let target = match tessera::ir::target::lower(&tk, arch) {
                Ok(t) => t,
                Err(e) => {
                    not_compiled(format!("{label} ({arch}): Target IR: {e:?}"));
                    continue;
                }
            };
            let estimate = resources::of_target(&target);
            let ptx = tessera::backend::ptx::module(arch, std::slice::from_ref(&target)).unwrap();
            match ptxas::assemble(ptxas, &ptx, arch) {
                Ok(funcs) => match funcs.iter().find(|f| f.entry) {
                    Some(f) => {
                        dump(
                            &label,
                            arch,
                            &ptx,
                            estimate.regs,
                            f.regs,
                            resources::order_estimates(&target),
                        );
                        rows.push(Row {
                            kernel: label,
                            arch,
                            estimate: estimate.regs,
                            ptxas: f.regs,
                            spills: f.spill_stores > 0,
                            at_limit: f.spill_stores > 0
                                || at_cap(arch, f.regs, target.num_threads),
                        })
                    }
                    None => failures.push(format!("{label} ({arch}): no entry in ptxas's report")),
                },
                Err(e) => failures.push(format!("{label} ({arch}): {e}")),
            }
        }
    }
}

/// With `TESSERA_ESTIMATE_DUMP=dir`, writes each measured kernel's PTX to
/// `dir` and a line (file, label, arch, ptxas, estimate, and the counts of
/// `resources::order_estimates`) to `dir/rows.tsv`, to study
/// the estimate's misses outside the test.
fn dump(label: &str, arch: Arch, ptx: &str, estimate: u32, ptxas: u32, orders: [u32; 3]) {
    let Some(dir) = std::env::var_os("TESSERA_ESTIMATE_DUMP") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let name: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let file = format!("{name}.{arch}.ptx");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(&file), ptx);
    let [statements, chains, latency] = orders;
    let line = format!(
        "{file}\t{label}\t{arch}\t{ptxas}\t{estimate}\t{statements}\t{chains}\t{latency}\n"
    );
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("rows.tsv"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
}

/// The table of `rows` (all of them, or only those over `only_over`), then
/// the median, 90th percentile and worst error per arch and over all.
/// Returns the median and worst over all.
fn summarise(title: &str, rows: &[Row], only_over: Option<f64>) -> Option<(f64, f64)> {
    println!(
        "\n{title}: register estimate vs ptxas -v ({} kernel x arch pairs)",
        rows.len()
    );
    println!(
        "{:<60} {:>7} {:>6} {:>8} {:>7}",
        "kernel", "arch", "ptxas", "estimate", "error"
    );
    for r in rows {
        let err = r.error();
        if only_over.is_some_and(|b| err.abs() <= b) {
            continue;
        }
        println!(
            "{:<60} {:>7} {:>6} {:>8} {:>+6.1}%{}",
            r.kernel,
            r.arch.name(),
            r.ptxas,
            r.estimate,
            err * 100.0,
            if r.spills {
                "  (ptxas spills)"
            } else if r.at_limit {
                "  (ptxas at its limit)"
            } else {
                ""
            }
        );
    }
    let stats = |errors: &mut Vec<f64>| -> Option<(f64, f64, f64)> {
        if errors.is_empty() {
            return None;
        }
        errors.sort_by(f64::total_cmp);
        let n = errors.len();
        let median = if n % 2 == 1 {
            errors[n / 2]
        } else {
            (errors[n / 2 - 1] + errors[n / 2]) / 2.0
        };
        let p90 = errors[((n as f64 * 0.9).ceil() as usize).clamp(1, n) - 1];
        Some((median, p90, errors[n - 1]))
    };
    let mut archs: Vec<Arch> = rows.iter().map(|r| r.arch).collect();
    archs.dedup();
    archs.sort_by_key(|a| a.name());
    archs.dedup();
    for arch in archs {
        let mut e: Vec<f64> = rows
            .iter()
            .filter(|r| r.arch == arch)
            .map(|r| r.error().abs())
            .collect();
        if let Some((median, p90, worst)) = stats(&mut e) {
            println!(
                "{title} {:<6}: {:>4} pairs, median {:>5.1}%, p90 {:>5.1}%, worst {:>5.1}%",
                arch.name(),
                e.len(),
                median * 100.0,
                p90 * 100.0,
                worst * 100.0
            );
        }
    }
    let mut all: Vec<f64> = rows.iter().map(|r| r.error().abs()).collect();
    let (median, p90, worst) = stats(&mut all)?;
    let over = all.iter().filter(|&&e| e > WORST_BOUND).count();
    println!(
        "{title} all   : {:>4} pairs, median {:>5.1}%, p90 {:>5.1}%, worst {:>5.1}%, {over} above {:.0}%",
        all.len(),
        median * 100.0,
        p90 * 100.0,
        worst * 100.0,
        WORST_BOUND * 100.0
    );
    Some((median, worst))
}

/// Where the estimate stands on kernels it was not tuned to (the fresh ten
/// and the generated tuning seeds 0..200, ptxas 12.9.86, November 2026):
/// fresh median 12.5%, worst 34.4%; generated median 8.3%, worst 53.3% (a
/// gather through a 512-element i64 index tile: ptxas 15, 23 estimated); on the
/// held-out seeds 1000..1200, median 7.6%, worst 325% (a 32 x 1024 tile
/// whose elementwise chain ptxas runs element by element in 32 registers).
/// The goal ([`MEDIAN_BOUND`], [`WORST_BOUND`]) is not met there
/// yet; these bounds keep the estimate from getting worse until it is, and
/// `TESSERA_ESTIMATE_GOAL=1` holds those comparisons to the goal instead.
const FRESH_BOUNDS: (f64, f64) = (0.13, 0.35);
/// See [`FRESH_BOUNDS`].
const GENERATED_BOUNDS: (f64, f64) = (0.10, 0.55);
/// The kernels generated for whole-tensor functions (`tests/ptxas/whole.tsr`,
/// ptxas 12.9.86, November 2026): median 7.4%, worst 50%, three pairs over
/// 25%: a softmax over a column of 300 (1,024 threads: ptxas 32 to 38, 47 or
/// 48 estimated; its loop's second trip reads rows 256 to 511 of 300, and
/// ptxas, knowing the thread ids' range, drops half of its loads), and an
/// rms norm of 65536-element bf16 rows on sm_70 (54, 40). Before the budget of
/// early loads in large blocks (`HOIST_BUDGET_DIVISOR`): median 10.9%, worst
/// 78.1%, ten pairs over 25%. See [`FRESH_BOUNDS`].
const WHOLE_BOUNDS: (f64, f64) = (0.08, 0.55);
/// The kernels of `tests/ptxas/big_blocks.tsr` (ptxas 12.9.86, November
/// 2026). See [`FRESH_BOUNDS`].
const BIG_BLOCKS_BOUNDS: (f64, f64) = (0.15, 0.70);

/// Fails unless the median and worst error of `title`'s rows are within
/// `bounds` (median, worst), or, where they are looser than the goal and
/// `TESSERA_ESTIMATE_GOAL` is set, within the goal.
fn check_goal(
    title: &str,
    summary: Option<(f64, f64)>,
    bounds: (f64, f64),
    failures: &mut Vec<String>,
) {
    let Some((median, worst)) = summary else {
        failures.push(format!("{title}: no kernel was compared with ptxas"));
        return;
    };
    let goal = (MEDIAN_BOUND, WORST_BOUND);
    let met = median <= goal.0 && worst <= goal.1;
    println!(
        "{title}: the goal (median within {:.0}%, none over {:.0}%) is {}",
        goal.0 * 100.0,
        goal.1 * 100.0,
        if met { "met" } else { "NOT met" }
    );
    let (median_bound, worst_bound) = if std::env::var_os("TESSERA_ESTIMATE_GOAL").is_some() {
        goal
    } else {
        bounds
    };
    if median > median_bound {
        failures.push(format!(
            "{title}: median register estimate error {:.1}% is above {:.0}%",
            median * 100.0,
            median_bound * 100.0
        ));
    }
    if worst > worst_bound {
        failures.push(format!(
            "{title}: worst register estimate error {:.1}% is above {:.0}%",
            worst * 100.0,
            worst_bound * 100.0
        ));
    }
}

/// Every kernel of `files` (shown relative to the repository) on every arch
/// of `archs` (see [`measure_file`]); a file that does not load is a failure.
#[allow(clippy::too_many_arguments)]
fn measure_files(
    ptxas: &Path,
    files: &[PathBuf],
    archs: &[Arch],
    strict: bool,
    divisors: &[(&str, u64)],
    rows: &mut Vec<Row>,
    skipped: &mut Vec<String>,
    failures: &mut Vec<String>,
) {
    let root = root();
    for path in files {
        let shown = path
            .strip_prefix(&root)
            .unwrap_or(path)
            .display()
            .to_string();
        for &arch in archs {
            let mut db = Database::new();
            db.set_arch(arch);
            match db.load_file(path) {
                Ok(file) => measure_file(
                    ptxas, &db, file, &shown, arch, strict, divisors, rows, skipped, failures,
                ),
                Err(e) => failures.push(format!("{shown}: {e}")),
            }
        }
    }
}

/// Every kernel of the corpus for every arch (see [`measure_file`]); the
/// median and worst error must stay within the goal.
fn corpus(ptxas: &Path, failures: &mut Vec<String>) {
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let files = corpus_files();
    measure_files(
        ptxas,
        &files,
        &ARCHS,
        false,
        &[],
        &mut rows,
        &mut skipped,
        failures,
    );
    let summary = summarise("corpus", &rows, None);
    for s in &skipped {
        println!("not compiled: {s}");
    }
    check_goal("corpus", summary, (MEDIAN_BOUND, WORST_BOUND), failures);
}

/// The kernels of tests/estimate/ (written after the model was tuned, never
/// tuned against), reported apart from the corpus.
fn fresh(ptxas: &Path, failures: &mut Vec<String>) {
    let root = root();
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("tests/estimate"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|x| x == "tsr"));
    files.sort();
    measure_files(
        ptxas,
        &files,
        &GENERATED_ARCHS,
        true,
        &[],
        &mut rows,
        &mut skipped,
        failures,
    );
    let summary = summarise("fresh", &rows, None);
    check_goal("fresh", summary, FRESH_BOUNDS, failures);
}

/// The kernels of `tests/ptxas/fast_path.tsr` (bf16 rows of 4096 elements,
/// whose accesses take the in-bounds fast path) on every arch, as they are
/// and with `-D N%16`: held to the goal like the corpus.
fn fast_path(ptxas: &Path, failures: &mut Vec<String>) {
    held_to_goal(
        ptxas,
        "fast path",
        "fast_path.tsr",
        &ARCHS,
        &[("N", 16)],
        failures,
    );
}

/// The GEMM mainloops of `tests/ptxas/pipelined.tsr` with `-D K%16 -D N%16`
/// (pipelined loads: the rotated mma.sync loop, and wgmma on sm_90a) on the
/// arches with `cp.async`: held to the goal like the corpus.
fn pipelined(ptxas: &Path, failures: &mut Vec<String>) {
    let archs = [Arch::Sm80, Arch::Sm90, Arch::Sm90a];
    let divisors = [("K", 16), ("N", 16)];
    held_to_goal(
        ptxas,
        "pipelined",
        "pipelined.tsr",
        &archs,
        &divisors,
        failures,
    );
}

/// The wgmma mainloops of `tests/ptxas/kmajor.tsr` (B given as `[N, K]`:
/// bf16, f8 with its promoted sums, and tf32) on sm_90a with `-D K%16`: held to
/// the goal like the corpus.
fn kmajor(ptxas: &Path, failures: &mut Vec<String>) {
    held_to_goal(
        ptxas,
        "kmajor",
        "kmajor.tsr",
        &[Arch::Sm90a],
        &[("K", 16)],
        failures,
    );
}

/// The kernels of `tests/ptxas/big_blocks.tsr` (512 and 1,024 threads a
/// block) on sm_70, sm_80 and sm_90, as they are and with `-D N%16`: the
/// budget of early loads in large blocks.
fn big_blocks(ptxas: &Path, failures: &mut Vec<String>) {
    held_to(
        ptxas,
        "big blocks",
        "big_blocks.tsr",
        &GENERATED_ARCHS,
        &[("N", 16)],
        BIG_BLOCKS_BOUNDS,
        failures,
    );
}

/// The kernels of `compiler/tests/ptxas/FILE` on `archs`, as they are and
/// with `divisors`, every one compiled, held to the corpus's goal.
fn held_to_goal(
    ptxas: &Path,
    title: &str,
    file: &str,
    archs: &[Arch],
    divisors: &[(&str, u64)],
    failures: &mut Vec<String>,
) {
    let goal = (MEDIAN_BOUND, WORST_BOUND);
    held_to(ptxas, title, file, archs, divisors, goal, failures);
}

/// [`held_to_goal`] with `bounds` (median, worst) in place of the goal.
fn held_to(
    ptxas: &Path,
    title: &str,
    file: &str,
    archs: &[Arch],
    divisors: &[(&str, u64)],
    bounds: (f64, f64),
    failures: &mut Vec<String>,
) {
    let path = root().join("compiler/tests/ptxas").join(file);
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    measure_files(
        ptxas,
        &[path],
        archs,
        true,
        divisors,
        &mut rows,
        &mut skipped,
        failures,
    );
    let summary = summarise(title, &rows, None);
    check_goal(title, summary, bounds, failures);
}

/// The kernels the compiler generates for the whole-tensor functions of
/// `tests/ptxas/whole.tsr` (Schedule IR: row kernels, fused chains,
/// reductions, transposes) on sm_70, sm_80 and sm_90.
fn whole(ptxas: &Path, failures: &mut Vec<String>) {
    let path = root().join("compiler/tests/ptxas/whole.tsr");
    let source = match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) => {
            failures.push(format!("{}: {e}", path.display()));
            return;
        }
    };
    let mut rows = Vec::new();
    for arch in GENERATED_ARCHS {
        let mut db = Database::new();
        db.set_arch(arch);
        let file = db.set_source("whole.tsr".to_string(), source.clone());
        for (name, item, _) in file_functions(&db, file) {
            let schedule = match schedule_ir(&db, item, db.options()) {
                Ok(s) => s.clone(),
                Err(e) => {
                    failures.push(format!("whole.tsr:{name} ({arch}): Schedule IR: {e}"));
                    continue;
                }
            };
            for tk in &schedule.kernels {
                let label = format!("whole.tsr:{}", tk.name);
                let target = match tessera::ir::target::lower(tk, arch) {
                    Ok(t) => t,
                    Err(e) => {
                        failures.push(format!("{label} ({arch}): Target IR: {e:?}"));
                        continue;
                    }
                };
                let estimate = resources::of_target(&target);
                let ptx =
                    tessera::backend::ptx::module(arch, std::slice::from_ref(&target)).unwrap();
                match ptxas::assemble(ptxas, &ptx, arch) {
                    Ok(funcs) => match funcs.iter().find(|f| f.entry) {
                        Some(f) => rows.push(Row {
                            kernel: {
                                let orders = resources::order_estimates(&target);
                                dump(&label, arch, &ptx, estimate.regs, f.regs, orders);
                                label
                            },
                            arch,
                            estimate: estimate.regs,
                            ptxas: f.regs,
                            spills: f.spill_stores > 0,
                            at_limit: f.spill_stores > 0
                                || at_cap(arch, f.regs, target.num_threads),
                        }),
                        None => {
                            failures.push(format!("{label} ({arch}): no entry in ptxas's report"))
                        }
                    },
                    Err(e) => failures.push(format!("{label} ({arch}): {e}")),
                }
            }
        }
    }
    let summary = summarise("whole-tensor functions", &rows, None);
    check_goal("whole-tensor functions", summary, WHOLE_BOUNDS, failures);
}

/// The archs generated kernels are compared on.
const GENERATED_ARCHS: [Arch; 3] = [Arch::Sm70, Arch::Sm80, Arch::Sm90];

/// The seeds of the generated kernels: `TESSERA_GEN_SEEDS=a..b` or, by
/// default, the tuning range `0..200`.
fn generated_seeds() -> Result<std::ops::Range<u64>, String> {
    match std::env::var("TESSERA_GEN_SEEDS") {
        Err(_) => Ok(0..200),
        Ok(v) => v
            .split_once("..")
            .and_then(|(a, b)| Some(a.trim().parse().ok()?..b.trim().parse().ok()?))
            .ok_or_else(|| format!("TESSERA_GEN_SEEDS={v:?}: expected a range such as 1000..1200")),
    }
}

/// The generated kernels of [`generated_seeds`] on sm_70, sm_80 and sm_90:
/// each must check clean, compile and assemble; the distribution of the
/// error is printed (rows over the goal's worst in full) and must meet the
/// goal.
fn generated(ptxas: &Path, failures: &mut Vec<String>) {
    let seeds = match generated_seeds() {
        Ok(s) => s,
        Err(e) => {
            failures.push(e);
            return;
        }
    };
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for seed in seeds.clone() {
        let source = generate::kernel(seed);
        let shown = format!("seed {seed}");
        let before = failures.len();
        for arch in GENERATED_ARCHS {
            let mut db = Database::new();
            db.set_arch(arch);
            let file = db.set_source(format!("gen{seed}.tsr"), source.clone());
            measure_file(
                ptxas,
                &db,
                file,
                &shown,
                arch,
                true,
                &[],
                &mut rows,
                &mut skipped,
                failures,
            );
        }
        if failures.len() > before {
            println!("generated kernel of seed {seed}:\n{source}");
        }
    }
    let title = format!("generated {}..{}", seeds.start, seeds.end);
    let summary = summarise(&title, &rows, Some(WORST_BOUND));
    let mut over: Vec<u64> = rows
        .iter()
        .filter(|r| r.error().abs() > WORST_BOUND)
        .filter_map(|r| {
            r.kernel
                .strip_prefix("seed ")?
                .split(':')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    over.dedup();
    for seed in over {
        println!(
            "generated kernel of seed {seed}:\n{}",
            generate::kernel(seed)
        );
    }
    check_goal(&title, summary, GENERATED_BOUNDS, failures);
}
