//! The UI test runner (`cargo test -p tessera-tests --test ui [-- FILTER...]`).
//!
//! * Every `tests/ui/**/*.tsr` is checked through the database (honouring a
//!   first line `# arch: ...`) and its diagnostics must match its `#~`
//!   annotations exactly (see `tessera_tests`).
//! * Session scripts (`# run`) must also agree with `tsrc check` of the same
//!   statements: the lines the session rejects are the lines the checker
//!   rejects (a line failing with a run-time code only excepted).
//! * Every error diagnostic a case (or a `docs/diagnostics.md` example)
//!   produces has a help line: the house rule that an error says what to
//!   write instead. A case producing one without fails, listing the file,
//!   line, code and message.
//! * `tests/ui/render/*.tsr` additionally compare the human, colourless rendering
//!   of their diagnostics with the `.stderr` file next to them;
//!   `TESSERA_BLESS=1` writes those files instead.
//! * Without a filter, two more checks run: every code of the catalogue is
//!   expected by some UI case, and `docs/diagnostics.md` has a section with a
//!   `tsr` example for every code, each example producing its code. Run-time
//!   codes (E07xx) are the exception: no static check produces them, so their
//!   examples must check cleanly and `tests/harness/numerics.rs` triggers each
//!   one through the executor.
//!
//! Prints a failure report per failing case and ends with `N passed, M failed`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tessera::diag::codes::CATALOGUE;
use tessera::diag::render;
use tessera::target::Arch;
use tessera_tests::{
    check_file, check_text, has_run_header, match_all, parse_annotations, parse_arch_header,
    parse_diagnostics_doc, workspace_root, Produced,
};

struct Outcome {
    name: String,
    failure: Option<String>,
}

fn main() -> ExitCode {
    // Session cases see no GPU on any machine (`:device cuda` is E0721), as on
    // CI: set before anything in this process could load the CUDA driver.
    std::env::set_var("CUDA_VISIBLE_DEVICES", "");
    let args = tessera_tests::SuiteArgs::from_env();
    let bless = args.bless;
    let root = workspace_root();
    let ui = root.join("tests").join("ui");

    let mut files = Vec::new();
    collect_tsr(&ui, &mut files);
    files.sort();

    let mut outcomes = Vec::new();
    let mut expected_codes = BTreeSet::new();
    for path in &files {
        let name = rel(&root, path);
        if !args.selects(&name) {
            continue;
        }
        let failure = run_case(&root, path, bless, &mut expected_codes).err();
        outcomes.push(Outcome { name, failure });
    }

    if args.filters.is_empty() {
        let missing: Vec<&str> = CATALOGUE
            .iter()
            .map(|c| c.code)
            .filter(|c| !expected_codes.contains(*c) && !is_run_time(c))
            .collect();
        outcomes.push(Outcome {
            name: "catalogue coverage (every code expected by a UI case)".to_string(),
            failure: (!missing.is_empty()).then(|| {
                format!(
                    "{} of {} codes are not expected by any tests/ui case: {}",
                    missing.len(),
                    CATALOGUE.len(),
                    missing.join(" ")
                )
            }),
        });
        docs_checks(&root, &mut outcomes);
    }

    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.failure.is_some()).collect();
    for o in &outcomes {
        println!(
            "{} {}",
            if o.failure.is_some() { "FAIL" } else { "ok  " },
            o.name
        );
    }
    for o in &failed {
        println!(
            "\n==== FAIL {} ====\n{}",
            o.name,
            o.failure.as_deref().unwrap_or("")
        );
    }
    let passed = outcomes.len() - failed.len();
    println!("\n{passed} passed, {} failed", failed.len());
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn collect_tsr(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_tsr(&path, out);
        } else if path.extension().is_some_and(|e| e == "tsr") {
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

/// Checks one UI file; `Err` holds the failure report.
fn run_case(
    root: &Path,
    path: &Path,
    bless: bool,
    codes: &mut BTreeSet<String>,
) -> Result<(), String> {
    let name = rel(root, path);
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    let expected = parse_annotations(&text).map_err(|e| format!("bad annotation: {e}"))?;
    codes.extend(expected.iter().map(|e| e.code.clone()));
    let arch = parse_arch_header(&text)
        .map_err(|e| format!("bad arch header: {e}"))?
        .unwrap_or_default();
    for e in &expected {
        if tessera::diag::codes::lookup(&e.code).is_none() {
            return Err(format!(
                "annotation {e}: `{}` is not in the catalogue",
                e.code
            ));
        }
    }
    let (text, diags) = check_file(path, arch).map_err(|e| format!("cannot load: {e}"))?;
    let produced = Produced::from_diagnostics(&text, &diags);
    let mismatch = match_all(&expected, &produced);
    let rendered_all = render::render_human_all(&name, &text, &diags, false);

    let mut report = String::new();
    if !mismatch.is_empty() {
        report.push_str(&format!("arch {arch}\nexpected (#~ annotations):\n"));
        list(&mut report, expected.iter().map(|e| e.to_string()));
        report.push_str("produced:\n");
        list(&mut report, produced.iter().map(|p| p.to_string()));
        if !mismatch.missing.is_empty() {
            report.push_str("expected but not produced:\n");
            list(
                &mut report,
                mismatch.missing.iter().map(|i| expected[*i].to_string()),
            );
        }
        if !mismatch.unexpected.is_empty() {
            report.push_str("produced but not expected:\n");
            for i in &mismatch.unexpected {
                report.push_str(&format!("  {}\n", produced[*i]));
                let one = render::render_human(&name, &text, &diags[*i], false);
                for line in one.lines() {
                    report.push_str(&format!("    | {line}\n"));
                }
            }
        }
        if !mismatch.missing.is_empty() && !diags.is_empty() {
            report.push_str("all diagnostics, rendered:\n");
            for line in rendered_all.lines() {
                report.push_str(&format!("    | {line}\n"));
            }
        }
    }

    report.push_str(&errors_without_help(&name, &text, &diags));

    if has_run_header(&text) {
        report.push_str(&check_agrees_with_session(&name, &text, &expected, arch));
    }

    let is_render_case = path
        .parent()
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == "render");
    if is_render_case {
        let stderr_path = path.with_extension("stderr");
        if bless && mismatch.is_empty() {
            std::fs::write(&stderr_path, &rendered_all)
                .map_err(|e| format!("cannot write .stderr: {e}"))?;
        } else if !bless {
            match std::fs::read_to_string(&stderr_path) {
                Ok(want) if want == rendered_all => {}
                Ok(want) => {
                    report.push_str(&format!(
                        "rendering differs from {} (TESSERA_BLESS=1 rewrites it)\n--- expected\n{want}--- actual\n{rendered_all}",
                        rel(root, &stderr_path)
                    ));
                }
                Err(_) => report.push_str(&format!(
                    "missing {} (run with TESSERA_BLESS=1 to write it); actual rendering:\n{rendered_all}",
                    rel(root, &stderr_path)
                )),
            }
        }
    }

    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

/// A session script (`# run`) and `tsrc check` of the same statements reject
/// the same lines: the session's errors are its annotations, the checker sees
/// the text with the REPL's `:commands` blanked (codes may differ where the
/// session finds at run time what the checker finds statically, E0727 against
/// E0301, and a line failing with a run-time code only may pass the checker).
/// Empty when they agree, else the report.
fn check_agrees_with_session(
    name: &str,
    text: &str,
    expected: &[tessera_tests::Expectation],
    arch: Arch,
) -> String {
    let blanked: String = tessera::syntax::lines::lines(text)
        .map(|l| if l.starts_with(':') { "" } else { l })
        .collect::<Vec<_>>()
        .join("\n");
    let mut db = tessera::db::Database::new();
    db.set_arch(arch);
    let file = db.set_source(format!("/checked/{name}"), blanked.clone());
    let checker: BTreeSet<u32> = Produced::from_diagnostics(&blanked, db.diagnostics(file))
        .iter()
        .filter(|p| p.code.starts_with('E'))
        .map(|p| p.line)
        .collect();
    let commands: BTreeSet<u32> = (1..)
        .zip(tessera::syntax::lines::lines(text))
        .filter(|(_, l)| l.starts_with(':'))
        .map(|(i, _)| i)
        .collect();
    let errors = || {
        expected
            .iter()
            .filter(|e| e.code.starts_with('E') && !commands.contains(&e.line))
    };
    // Lines the session rejects with a static code; run-time codes (E07xx:
    // host integer overflow, ...) alone need not be foreseen by the checker.
    let session: BTreeSet<u32> = errors().map(|e| e.line).collect();
    let static_: BTreeSet<u32> = errors()
        .filter(|e| !is_run_time(&e.code))
        .map(|e| e.line)
        .collect();
    let missed: Vec<_> = static_.difference(&checker).collect();
    let extra: Vec<_> = checker.difference(&session).collect();
    if missed.is_empty() && extra.is_empty() {
        return String::new();
    }
    format!(
        "tsrc check and the session disagree: the checker accepts lines {missed:?} that the session rejects, and rejects lines {extra:?} that the session runs\n"
    )
}

/// The house rule that every error says what to write instead: a report
/// listing each error of `diags` that has no help line (empty if none).
fn errors_without_help(name: &str, text: &str, diags: &[tessera::diag::Diagnostic]) -> String {
    let helpless: Vec<String> = diags
        .iter()
        .zip(Produced::from_diagnostics(text, diags))
        .filter(|(d, _)| d.is_error() && d.help.is_none())
        .map(|(_, p)| format!("{name}:{}: {} {}", p.line, p.code, p.message))
        .collect();
    if helpless.is_empty() {
        return String::new();
    }
    let mut report = "errors without a help line (every error needs one):\n".to_string();
    list(&mut report, helpless.into_iter());
    report
}

fn list(report: &mut String, items: impl Iterator<Item = String>) {
    let mut any = false;
    for item in items {
        report.push_str(&format!("  {item}\n"));
        any = true;
    }
    if !any {
        report.push_str("  (nothing)\n");
    }
}

/// `docs/diagnostics.md`: a section for every code, each with an example that
/// produces its code.
/// Execution errors (E07xx) come from running a program, so no UI case (a
/// static check) can produce them; `tests/harness/numerics.rs` (and the REPL's
/// tests) trigger each one through the executor instead.
fn is_run_time(code: &str) -> bool {
    code.starts_with("E07")
}

fn docs_checks(root: &Path, outcomes: &mut Vec<Outcome>) {
    let doc_path = root.join("docs").join("diagnostics.md");
    let md = match std::fs::read_to_string(&doc_path) {
        Ok(md) => md,
        Err(e) => {
            outcomes.push(Outcome {
                name: "docs/diagnostics.md".to_string(),
                failure: Some(format!("cannot read {}: {e}", doc_path.display())),
            });
            return;
        }
    };
    let entries = parse_diagnostics_doc(&md);
    let documented: BTreeSet<&str> = entries.iter().map(|e| e.code.as_str()).collect();
    let missing: Vec<&str> = CATALOGUE
        .iter()
        .map(|c| c.code)
        .filter(|c| !documented.contains(c))
        .collect();
    let unknown: Vec<&str> = entries
        .iter()
        .map(|e| e.code.as_str())
        .filter(|c| tessera::diag::codes::lookup(c).is_none())
        .collect();
    let mut failure = String::new();
    if !missing.is_empty() {
        failure += &format!(
            "no `## CODE: title` section for {} codes: {}\n",
            missing.len(),
            missing.join(" ")
        );
    }
    if !unknown.is_empty() {
        failure += &format!(
            "sections for codes not in the catalogue: {}\n",
            unknown.join(" ")
        );
    }
    outcomes.push(Outcome {
        name: "docs/diagnostics.md has a section for every code".to_string(),
        failure: (!failure.is_empty()).then_some(failure),
    });

    for entry in &entries {
        let name = format!(
            "docs/diagnostics.md:{} example for {}",
            entry.line, entry.code
        );
        let failure = match &entry.example {
            None => Some("the section has no ```tsr example".to_string()),
            Some(example) => match parse_arch_header(example) {
                Err(e) => Some(format!("bad arch header: {e}")),
                Ok(arch) => {
                    let arch = arch.unwrap_or(Arch::default());
                    let virtual_path = format!("docs/diagnostics/{}.tsr", entry.code);
                    let diags = check_text(&virtual_path, example, arch);
                    let helpless = errors_without_help(&virtual_path, example, &diags);
                    if !helpless.is_empty() {
                        Some(helpless)
                    } else if is_run_time(&entry.code) && !has_run_header(example) {
                        // The program is fine; running it fails.
                        let errors: Vec<String> = Produced::from_diagnostics(example, &diags)
                            .iter()
                            .map(|p| format!("  {p}"))
                            .collect();
                        (!errors.is_empty()).then(|| {
                            format!(
                                "the example of a run-time code must check cleanly; it produces:\n{}",
                                errors.join("\n")
                            )
                        })
                    } else if diags.iter().any(|d| d.code == entry.code) {
                        None
                    } else {
                        let produced: Vec<String> = Produced::from_diagnostics(example, &diags)
                            .iter()
                            .map(|p| format!("  {p}"))
                            .collect();
                        Some(format!(
                            "the example (arch {arch}) does not produce {}; it produces:\n{}\nexample:\n{example}",
                            entry.code,
                            if produced.is_empty() { "  (nothing)".to_string() } else { produced.join("\n") }
                        ))
                    }
                }
            },
        };
        outcomes.push(Outcome { name, failure });
    }
}
