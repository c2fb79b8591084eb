//! `fuzz`: the grammar-aware fuzzer's long-run driver (see docs/fuzzing.md).
//!
//! ```text
//! fuzz [--seconds N] [--jobs J] [--seed S] [--out DIR] [--run-budget-ms M]
//!      [--hang-seconds H] [--minimize-seconds T] [--memory-mb MB] [--max-inputs N]
//!      [--known DIR] [--resume]  (--resume: continue the run whose state is in --out)
//! fuzz --seed S --print INDEX        the input INDEX of the run seeded S
//! fuzz --exec-one FILE               every stage on one file (exit 3 on a panic)
//! fuzz --measure N [--seed S]        how many of N generated programs check cleanly
//! fuzz --lsp-replay [--stride K]     the language server's every-prefix replay
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tessera_tests::fuzzing::driver::{self, now_ms, Options};
use tessera_tests::fuzzing::exec::{Limits, Stage};
use tessera_tests::fuzzing::inputs::{input, Corpus, Origin};
use tessera_tests::fuzzing::{gen, lsp_replay, rng::Rng};

struct Args(Vec<String>);

impl Args {
    fn flag(&self, name: &str) -> bool {
        self.0.iter().any(|a| a == name)
    }

    fn value(&self, name: &str) -> Option<&str> {
        let i = self.0.iter().position(|a| a == name)?;
        self.0.get(i + 1).map(String::as_str)
    }

    fn num(&self, name: &str, default: u64) -> u64 {
        match self.value(name) {
            Some(v) => v.parse().unwrap_or_else(|_| {
                eprintln!("error: {name} takes a number, not `{v}`");
                std::process::exit(2)
            }),
            None => default,
        }
    }
}

fn main() -> ExitCode {
    let args = Args(std::env::args().skip(1).collect());
    if args.flag("--help") || args.flag("-h") {
        println!(
            "{}",
            include_str!("fuzz.rs")
                .lines()
                .skip(2)
                .take(9)
                .map(|l| l.trim_start_matches("//! "))
                .collect::<Vec<_>>()
                .join("\n")
        );
        return ExitCode::SUCCESS;
    }
    let root = args
        .value("--root")
        .map(PathBuf::from)
        .unwrap_or_else(tessera_tests::workspace_root);
    let mut limits = Limits {
        run_budget: Duration::from_millis(args.num("--run-budget-ms", 2000)),
        ..Limits::default()
    };
    if let Some(st) = args.value("--stages") {
        limits.stages = st.split(',').filter_map(Stage::parse).collect();
    }
    // A resumed run keeps the seed and job count of its state unless told.
    let resumed = match (args.flag("--resume"), args.value("--out")) {
        (false, _) => None,
        (true, None) => {
            eprintln!("error: --resume continues the run in --out DIR; name the directory");
            return ExitCode::from(2);
        }
        (true, Some(out)) => {
            let path = driver::state_path(&PathBuf::from(out));
            std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| tessera_tests::fuzzing::state::RunState::decode(&t).ok())
        }
    };
    let seed = args.num("--seed", resumed.as_ref().map_or_else(now_ms, |s| s.seed));
    if args.flag("--worker") {
        driver::worker(
            seed,
            args.num("--from", 0),
            args.num("--jobs", 1).max(1),
            args.num("--until-ms", u64::MAX),
            args.value("--max-inputs").and_then(|v| v.parse().ok()),
            &limits,
            &root,
        );
        return ExitCode::SUCCESS;
    }
    if let Some(file) = args.value("--exec-one") {
        return ExitCode::from(driver::exec_one(&PathBuf::from(file), &limits));
    }
    if let Some(i) = args.value("--print") {
        let corpus = Corpus::load(&root);
        let index = i.parse().unwrap_or(0);
        let (text, origin) = input(seed, index, &corpus);
        eprintln!("# seed {seed} index {index}: {}", origin.name());
        print!("{text}");
        return ExitCode::SUCCESS;
    }
    if let Some(n) = args.value("--measure") {
        // The compiler's query stack, as the binaries use.
        let n = n.parse().unwrap_or(1000);
        return tessera::stack::with_stack(move || measure(seed, n, &root))
            .unwrap_or(ExitCode::FAILURE);
    }
    if args.flag("--lsp-replay") {
        return lsp(&root, args.num("--stride", 1) as usize);
    }
    let out = args
        .value("--out")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("tessera-fuzz-{seed}")));
    let opts = Options {
        seconds: args.num("--seconds", 60),
        jobs: args
            .num("--jobs", resumed.as_ref().map_or(1, |s| s.jobs))
            .max(1),
        seed,
        out: out.clone(),
        run_budget: limits.run_budget,
        hang: Duration::from_secs(args.num("--hang-seconds", 20)),
        minimize: Duration::from_secs(args.num("--minimize-seconds", 60)),
        memory_mb: args.num("--memory-mb", 2048),
        max_inputs: args.value("--max-inputs").and_then(|v| v.parse().ok()),
        known: Some(
            args.value("--known")
                .map(PathBuf::from)
                .unwrap_or_else(|| root.join("tests/fuzz/pending")),
        ),
        root,
        resume: args.flag("--resume"),
    };
    if let Some(st) = &resumed {
        eprintln!(
            "fuzz: resuming after {} slice(s), {} executions, {} failure(s)",
            st.slices,
            st.counts.total_runs(),
            st.failure_count()
        );
    }
    eprintln!(
        "fuzz: seed {seed}, {} s, {} job(s), findings in {} (replay an input: fuzz --seed {seed} --print INDEX)",
        opts.seconds,
        opts.jobs,
        out.join("crashes").display()
    );
    match driver::run(&opts) {
        Ok((_, new, known)) => {
            eprintln!(
                "fuzz: {} new failure(s), {} known (seed {seed})",
                new.len(),
                known.len()
            );
            if new.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Checks `n` inputs of each origin and prints the fraction that checks
/// cleanly and the most frequent error codes of the generated ones.
fn measure(seed: u64, n: u64, root: &std::path::Path) -> ExitCode {
    tessera_tests::fuzzing::exec::quiet_panics(true);
    let corpus = Corpus::load(root);
    let mut by_origin: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut codes: BTreeMap<String, u64> = BTreeMap::new();
    let mut example: BTreeMap<String, String> = BTreeMap::new();
    let start = Instant::now();
    let mut ran = (0u64, 0u64);
    let mut emitted = (0u64, 0u64);
    let mut run_errors: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..n {
        let (text, origin) = if i % 2 == 0 {
            (
                gen::program(&mut Rng::for_input(seed, i)),
                Origin::Generated,
            )
        } else {
            input(seed, i, &corpus)
        };
        let mut db = tessera::db::Database::new();
        let f = db.set_source("fuzz.tsr", text.clone());
        let errs: Vec<_> = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            db.diagnostics(f)
                .iter()
                .filter(|d| d.is_error())
                .map(|d| (d.code.to_string(), d.message.clone()))
                .collect::<Vec<_>>()
        }))
        .unwrap_or_else(|_| vec![("panic".to_string(), String::new())]);
        if origin == Origin::Generated && errs.is_empty() && i % 10 == 0 {
            // One in five generated programs also runs: how many run to the end.
            let mut session = tessera_repl::session::Session::new("fuzz.tsr", false);
            let mut err = Vec::new();
            let ok = session.run_file(&text, &mut std::io::sink(), &mut err);
            let mut db = tessera::db::Database::new();
            db.set_arch(tessera::target::Arch::Sm80);
            let f = db.set_source("fuzz.tsr", text.clone());
            let cx = tessera::cli::EmitContext {
                db: &db,
                file: f,
                kernels: tessera::db::file_kernels(&db, f),
                spec: tessera::ir::tile::Specialization::new(),
                arch: tessera::target::Arch::Sm80,
                function: None,
            };
            for kind in [
                tessera::cli::EmitKind::ScheduleIr,
                tessera::cli::EmitKind::Ptx,
            ] {
                emitted.0 += 1;
                match tessera::cli::emit_with(&cx, kind) {
                    Ok(_) => emitted.1 += 1,
                    Err(tessera::cli::EmitError::Diagnostics(d)) => {
                        *run_errors
                            .entry(format!("emit {}: {}", d[0].code, d[0].message))
                            .or_default() += 1;
                    }
                    Err(tessera::cli::EmitError::Usage(u)) => {
                        *run_errors.entry(format!("emit: {u}")).or_default() += 1;
                    }
                }
            }
            ran.0 += 1;
            ran.1 += u64::from(ok);
            if !ok {
                let e = String::from_utf8_lossy(&err);
                let code = e.find("error[").map_or("?".to_string(), |i| {
                    e[i..].lines().next().unwrap_or("").to_string()
                });
                *run_errors.entry(code).or_default() += 1;
            }
        }
        let e = by_origin.entry(origin.name()).or_default();
        e.0 += 1;
        e.1 += u64::from(errs.is_empty());
        if origin == Origin::Generated {
            for (c, m) in errs {
                *codes.entry(c.clone()).or_default() += 1;
                example.entry(c).or_insert(m);
            }
        }
    }
    println!(
        "seed {seed}: {n} inputs checked in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    for (o, (total, clean)) in &by_origin {
        println!(
            "  {o:<18} {total:>7} inputs, {:>5.1}% check cleanly",
            100.0 * *clean as f64 / (*total).max(1) as f64
        );
    }
    println!(
        "  generated and run:  {:>7} programs, {:>5.1}% run to the end",
        ran.0,
        100.0 * ran.1 as f64 / ran.0.max(1) as f64
    );
    println!(
        "  generated, emitted: {:>7} schedule-ir/ptx emissions, {:>5.1}% without errors",
        emitted.0,
        100.0 * emitted.1 as f64 / emitted.0.max(1) as f64
    );
    for (e, k) in &run_errors {
        println!("  run error x{k}: {e}");
    }
    let mut codes: Vec<_> = codes.into_iter().collect();
    codes.sort_by_key(|c| std::cmp::Reverse(c.1));
    for (c, k) in codes.iter().take(12) {
        println!("  generated: {c} x{k}: {}", example[c]);
    }
    ExitCode::SUCCESS
}

fn lsp(root: &std::path::Path, stride: usize) -> ExitCode {
    tessera_tests::fuzzing::exec::quiet_panics(true);
    let corpus = Corpus::load(root);
    let mut r = lsp_replay::Replay::default();
    let start = Instant::now();
    let mut failures = 0;
    for (name, text) in &corpus.files {
        if let Err((at, f)) = lsp_replay::replay(text, stride, &mut r) {
            failures += 1;
            println!("FAIL {name}: prefix of {at} bytes: {}", f.message);
        }
    }
    println!(
        "lsp replay: {} files, {} prefixes, {} queries in {:.1} s, {failures} failures",
        corpus.files.len(),
        r.prefixes,
        r.queries,
        start.elapsed().as_secs_f64()
    );
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
