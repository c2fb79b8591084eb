//! Validation against NVIDIA's assembler: PTX goes through `ptxas -v` (the one
//! named by `TESSERA_PTXAS`; `scripts/test.sh` fetches it with
//! `scripts/fetch-ptxas.sh`) for sm_70, sm_80, sm_90 and sm_90a, and what it
//! reports is read back. Without `TESSERA_PTXAS` the test is skipped with a
//! note, except under CI (`CI` set), where that is a failure.

use std::process::ExitCode;

use tessera::backend::arch::Arch;
use tessera::backend::ptxas::{self, PtxasError};
use tessera::backend::resources::{estimate_regs, Node};

const ARCHS: [Arch; 4] = [Arch::Sm70, Arch::Sm80, Arch::Sm90, Arch::Sm90a];

/// A hand-written module (one bounds-checked elementwise kernel with a static
/// shared buffer, one empty kernel), to check the fetch/run/parse path.
const SAMPLE: &str = include_str!("ptxas_sample.ptx");

fn main() -> ExitCode {
    let ptxas = match ptxas::configured() {
        Ok(p) => p,
        Err(e) if std::env::var_os("CI").is_none() => {
            println!("SKIPPED ptxas validation: {e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            println!("FAIL ptxas validation: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut failures = Vec::new();

    for arch in ARCHS {
        match ptxas::assemble(&ptxas, SAMPLE, arch) {
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
    match ptxas::assemble(&ptxas, ".version 8.0\n.target sm_80\n.bogus\n", Arch::Sm80) {
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
            match ptxas::assemble(&ptxas, &ptx, arch) {
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

    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            println!("FAIL {f}");
        }
        ExitCode::FAILURE
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
