//! The codegen filetest runner (`cargo test -p tessera-tests --test codegen
//! [-- FILTER...]`): every `tests/codegen/**/*.tsr` states a code-generation
//! rule as data (format: `docs/testing.md`).
//!
//! * Leading comment lines `# codegen: ARGS` are runs: ARGS are `tsrc emit`'s
//!   options (`--emit ptx|target-ir|tile-ir|...`, `--arch`, `--kernel`, `-D`),
//!   so a run is exactly `tsrc emit FILE ARGS`, plus the harness's own
//!   `--check-prefix P` / `--check-prefixes P,Q` (default `CHECK`) and
//!   `--implicit-check-not PATTERN` (a pattern without spaces that must occur
//!   nowhere in the output).
//! * A run is checked by the file's `#P:` directives (`tessera_tests::filecheck`)
//!   or, when the file has none of its prefixes, compared with the whole
//!   expected output beside it: `NAME.ptx` (`.tir` for Target IR, `.tile` for
//!   Tile IR), `NAME.p.ptx` for a run whose first prefix is `P` (lower-cased)
//!   and not `CHECK`. `TESSERA_BLESS=1` writes those files.
//! * With `TESSERA_PTXAS` set, the PTX of every `--emit ptx` run must also
//!   assemble with that ptxas for the run's arch.
//! * Without a filter, a file beside the tests that no run compares with is a
//!   failure (a stale expectation).
//!
//! Prints a failure report per failing case and ends with `N passed, M failed`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use tessera::cli::{emit_to, EmitArgs, EmitKind};
use tessera_tests::filecheck::{check, implicit_not, parse_directives};
use tessera_tests::workspace_root;

/// One `# codegen:` line.
struct Run {
    /// The line in the test file.
    line: u32,
    /// The ARGS as written (for the report's reproduction command).
    args_text: String,
    args: EmitArgs,
    prefixes: Vec<String>,
    /// `--implicit-check-not PATTERN`: never anywhere in the output.
    implicit: Vec<tessera_tests::filecheck::Directive>,
}

/// `tsrc emit`'s options, parsed by the driver's own definition.
#[derive(Parser)]
#[command(name = "codegen", no_binary_name = true)]
struct Header {
    #[command(flatten)]
    args: EmitArgs,
}

fn main() -> ExitCode {
    let args = tessera_tests::SuiteArgs::from_env();
    let bless = args.bless;
    let root = workspace_root();
    let dir = root.join("tests").join("codegen");

    let mut files = Vec::new();
    collect(&dir, &mut files);
    files.sort();

    let mut tests = Vec::new();
    let mut others = Vec::new();
    for path in &files {
        let name = rel(&root, path);
        if path.extension().is_none_or(|e| e != "tsr") {
            others.push(path.clone());
        } else if args.selects(&name) {
            tests.push((name, path.clone()));
        }
    }
    // Files run in parallel, on threads with the compiler's stack; the report
    // keeps file order.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(vec![None; tests.len()]);
    let claimed = std::sync::Mutex::new(BTreeSet::new());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers.min(tests.len()) {
            std::thread::Builder::new()
                .stack_size(tessera::stack::STACK_SIZE)
                .spawn_scoped(scope, || loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((_, path)) = tests.get(i) else {
                        break;
                    };
                    let failure = run_guarded(&root, path, bless, &claimed);
                    results.lock().expect("no worker panics holding it")[i] = Some(failure);
                })
                .expect("spawn a filetest worker");
        }
    });
    let claimed = claimed.into_inner().expect("workers are done");
    let mut outcomes: Vec<(String, Option<String>)> = tests
        .into_iter()
        .zip(results.into_inner().expect("workers are done"))
        .map(|((name, _), r)| (name, r.expect("every file ran")))
        .collect();
    if args.filters.is_empty() {
        let stale: Vec<String> = others
            .iter()
            .filter(|p| !claimed.contains(*p))
            .map(|p| rel(&root, p))
            .collect();
        outcomes.push((
            "every expected-output file belongs to a run".to_string(),
            (!stale.is_empty()).then(|| {
                format!(
                    "no run compares with these files (delete them, or add the run):\n  {}",
                    stale.join("\n  ")
                )
            }),
        ));
    }

    let failed = outcomes.iter().filter(|o| o.1.is_some()).count();
    for (name, failure) in &outcomes {
        println!("{} {name}", if failure.is_some() { "FAIL" } else { "ok  " });
    }
    for (name, failure) in &outcomes {
        if let Some(f) = failure {
            println!("\n==== FAIL {name} ====\n{f}");
        }
    }
    println!("\n{} passed, {failed} failed", outcomes.len() - failed);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `run_file`, with a compiler panic failing this case, not the run.
fn run_guarded(
    root: &Path,
    path: &Path,
    bless: bool,
    claimed: &std::sync::Mutex<BTreeSet<PathBuf>>,
) -> Option<String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_file(root, path, bless, claimed)
    }))
    .unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("the compiler panicked: {what}"))
    })
    .err()
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn rel(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The `# codegen:` runs among the leading comment lines of `text`.
fn parse_runs(path: &Path, text: &str) -> Result<Vec<Run>, String> {
    let mut runs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some(rest) = line.trim().strip_prefix('#') else {
            if line.trim().is_empty() {
                continue;
            }
            break;
        };
        let Some(args_text) = rest.trim_start().strip_prefix("codegen:") else {
            continue;
        };
        let lineno = i as u32 + 1;
        let mut prefixes = Vec::new();
        let mut implicit = Vec::new();
        let mut words = Vec::new();
        let mut it = args_text.split_whitespace();
        while let Some(w) = it.next() {
            if let Some(p) = match w {
                "--implicit-check-not" => Some(it.next().unwrap_or("")),
                _ => w.strip_prefix("--implicit-check-not="),
            } {
                implicit.push(implicit_not(p, lineno)?);
                continue;
            }
            let list = match w {
                "--check-prefix" | "--check-prefixes" => it.next().unwrap_or(""),
                _ => match w
                    .strip_prefix("--check-prefix=")
                    .or_else(|| w.strip_prefix("--check-prefixes="))
                {
                    Some(v) => v,
                    None => {
                        words.push(w.to_string());
                        continue;
                    }
                },
            };
            for p in list.split(',') {
                let ok = p.starts_with(|c: char| c.is_ascii_uppercase())
                    && p.chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                if !ok {
                    return Err(format!(
                        "line {lineno}: a check prefix is an upper-case word (A-Z, 0-9, _), not `{p}`"
                    ));
                }
                prefixes.push(p.to_string());
            }
        }
        if prefixes.is_empty() {
            prefixes.push("CHECK".to_string());
        }
        words.push(path.display().to_string());
        let header = Header::try_parse_from(&words).map_err(|e| {
            format!(
                "line {lineno}: bad `# codegen:` arguments (they are `tsrc emit`'s):\n{}",
                e.render()
            )
        })?;
        if header.args.output.is_some() {
            return Err(format!(
                "line {lineno}: `-o` has no place in a filetest (the harness reads the output)"
            ));
        }
        runs.push(Run {
            line: lineno,
            args_text: args_text.trim().to_string(),
            args: header.args,
            prefixes,
            implicit,
        });
    }
    if runs.is_empty() {
        return Err(
            "no `# codegen: --emit ptx|hip|target-ir ... ` line among the leading comments"
                .to_string(),
        );
    }
    Ok(runs)
}

fn extension(kind: EmitKind) -> &'static str {
    match kind {
        EmitKind::Ptx => "ptx",
        EmitKind::Hip => "hip",
        EmitKind::TargetIr => "tir",
        EmitKind::TileIr => "tile",
        EmitKind::ScheduleIr => "sched",
        EmitKind::GraphIr => "graph",
    }
}

/// Checks one filetest; `Err` holds the failure report.
fn run_file(
    root: &Path,
    path: &Path,
    bless: bool,
    claimed: &std::sync::Mutex<BTreeSet<PathBuf>>,
) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    let runs = parse_runs(path, &text)?;
    let known: Vec<String> = runs
        .iter()
        .flat_map(|r| r.prefixes.iter().cloned())
        .collect();
    let mut report = String::new();
    for run in &runs {
        let repro = format!("tsrc emit {} {}", rel(root, path), run.args_text);
        let directives = parse_directives(&text, &run.prefixes, &known)?;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let status = emit_to(&run.args, &mut out, &mut err, false);
        let out = String::from_utf8_lossy(&out);
        if status != 0 {
            report.push_str(&format!(
                "run of line {} (`{repro}`) exits with status {status}:\n{}\n",
                run.line,
                String::from_utf8_lossy(&err)
            ));
            continue;
        }
        if run.args.emit == EmitKind::Ptx {
            if let Err(e) = assemble(path, run, &out) {
                report.push_str(&format!(
                    "run of line {} (`{repro}`): ptxas rejects the PTX:\n{e}\n",
                    run.line
                ));
                continue;
            }
        }
        if !directives.is_empty() || !run.implicit.is_empty() {
            if let Err(e) = check(&directives, &run.implicit, &out) {
                report.push_str(&format!(
                    "run of line {} (`{repro}`, prefixes {}):\n{e}\n",
                    run.line,
                    run.prefixes.join(",")
                ));
            }
            continue;
        }
        let stem = path.with_extension("");
        let first = &run.prefixes[0];
        let expected = if first == "CHECK" {
            stem.with_extension(extension(run.args.emit))
        } else {
            PathBuf::from(format!(
                "{}.{}.{}",
                stem.display(),
                first.to_lowercase(),
                extension(run.args.emit)
            ))
        };
        if !claimed
            .lock()
            .expect("no worker panics holding it")
            .insert(expected.clone())
        {
            return Err(format!(
                "run of line {}: another run already compares with {} (give it a --check-prefix)",
                run.line,
                rel(root, &expected)
            ));
        }
        if bless {
            if std::fs::read_to_string(&expected).ok().as_deref() != Some(&out) {
                std::fs::write(&expected, out.as_bytes())
                    .map_err(|e| format!("cannot write {}: {e}", expected.display()))?;
                println!("blessed {}", rel(root, &expected));
            }
            continue;
        }
        match std::fs::read_to_string(&expected) {
            Ok(want) if want == out => {}
            Ok(want) => report.push_str(&format!(
                "run of line {} (`{repro}`): the output differs from {} (TESSERA_BLESS=1 rewrites it)\n{}",
                run.line,
                rel(root, &expected),
                diff(&want, &out)
            )),
            Err(_) => report.push_str(&format!(
                "run of line {} (`{repro}`) has no directives and no {} (TESSERA_BLESS=1 writes it)\n",
                run.line,
                rel(root, &expected)
            )),
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

/// With `TESSERA_PTXAS` set (the path of NVIDIA's ptxas), a run's PTX must
/// assemble for its arch, so what a filetest states is also code the GPU
/// accepts; without it, nothing is assembled.
fn assemble(path: &Path, run: &Run, ptx: &str) -> Result<(), String> {
    let Some(ptxas) = std::env::var_os("TESSERA_PTXAS") else {
        return Ok(());
    };
    // One directory per assembly: runs assemble in parallel.
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tessera-codegen-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let file = dir.join(format!("{stem}-{}.ptx", run.line));
    std::fs::write(&file, ptx).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    let out = std::process::Command::new(&ptxas)
        .arg(format!("-arch={}", run.args.arch.name()))
        .arg(&file)
        .arg("-o")
        .arg(file.with_extension("cubin"))
        .output()
        .map_err(|e| format!("cannot run {}: {e}", PathBuf::from(&ptxas).display()))?;
    let result = if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    };
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The first differing line of two texts, with a few lines of each around it.
fn diff(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let at = w
        .iter()
        .zip(&g)
        .position(|(a, b)| a != b)
        .unwrap_or(w.len().min(g.len()));
    let from = at.saturating_sub(2);
    let show = |lines: &[&str]| -> String {
        lines
            .iter()
            .enumerate()
            .skip(from)
            .take(8)
            .map(|(i, l)| format!("  {}{:>5} | {l}\n", if i == at { '>' } else { ' ' }, i + 1))
            .collect()
    };
    format!(
        "first difference at line {} ({} expected lines, {} produced)\n--- expected\n{}--- produced\n{}",
        at + 1,
        w.len(),
        g.len(),
        show(&w),
        show(&g)
    )
}
