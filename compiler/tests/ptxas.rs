//! Validation against NVIDIA's assembler: PTX goes through `ptxas -v` (the one
//! named by `TESSERA_PTXAS`; `scripts/test.sh` fetches it with
//! `scripts/fetch-ptxas.sh`) for sm_70, sm_80, sm_90 and sm_90a, and what it
//! reports is read back. Without `TESSERA_PTXAS` the test is skipped with a
//! note, except under CI (`CI` set), where that is a failure.

use std::process::ExitCode;

use tessera::backend::arch::Arch;
use tessera::backend::ptxas::{self, PtxasError};

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

    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            println!("FAIL {f}");
        }
        ExitCode::FAILURE
    }
}
