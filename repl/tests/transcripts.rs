//! Replays REPL transcripts through a real pseudo-terminal (expectrl): every
//! `tests/repl/*.transcript` file, and the ```repl blocks of `docs/repl.md`.
//!
//! # Transcript format
//!
//! * `tessera> INPUT` — a line typed at the prompt; `...     INPUT` — a
//!   continuation line (`...` alone is an empty continuation line, which ends a
//!   block).
//! * `<ctrl-c>` — Ctrl-C: at a prompt it clears the line; right after an input it
//!   interrupts the computation that input started.
//! * `tessera> TEXT<ctrl-c>` — TEXT typed, then Ctrl-C instead of Enter.
//! * `tessera> :quit` ends the session (status 0).
//! * `<ctrl-d>` — Ctrl-D at the prompt: the session must end with status 0.
//! * Any other line is expected output of the input before it (stdout and
//!   stderr as the terminal shows them, without colour). `[...]` matches any
//!   number of lines. The output must match exactly otherwise.
//! * In `.transcript` files, `#` lines before the first prompt are comments.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use expectrl::{Eof, Session, WaitStatus};

const PROMPT: &str = "tessera> ";
const CONTINUATION: &str = "...     ";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// Lines typed (the first at the prompt, the others as continuations) and
    /// the expected output.
    Input {
        lines: Vec<String>,
        expected: Vec<String>,
        interrupt: bool,
    },
    CtrlC,
    CtrlD,
}

/// Parses a transcript (see the module docs).
fn parse(text: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut started = false;
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(input) = line.strip_prefix(PROMPT.trim_end()) {
            started = true;
            let input = input.strip_prefix(' ').unwrap_or(input);
            steps.push(Step::Input {
                lines: vec![input.to_string()],
                expected: Vec::new(),
                interrupt: false,
            });
        } else if line == "..." || line.starts_with(CONTINUATION) {
            let Some(Step::Input { lines, .. }) = steps.last_mut() else {
                panic!("continuation line without an input: {line:?}");
            };
            lines.push(line.get(CONTINUATION.len()..).unwrap_or("").to_string());
        } else if line == "<ctrl-c>" {
            match steps.last_mut() {
                Some(Step::Input {
                    expected,
                    interrupt,
                    ..
                }) if expected.is_empty() && !*interrupt => *interrupt = true,
                _ => steps.push(Step::CtrlC),
            }
        } else if line == "<ctrl-d>" {
            steps.push(Step::CtrlD);
        } else if !started {
            assert!(
                line.is_empty() || line.starts_with('#'),
                "text before the first prompt: {line:?}"
            );
        } else {
            match steps.last_mut() {
                Some(Step::Input { expected, .. }) => expected.push(line.to_string()),
                _ => panic!("output after a control key: {line:?}"),
            }
        }
    }
    steps
}

/// The text a terminal shows: escape sequences removed, carriage returns
/// resolved (what follows the last `\r` of a line wins).
fn clean(raw: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ params final; other escapes: ESC + one char.
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if ('@'..='~').contains(&d) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    out.split('\n')
        .map(|l| {
            let l = l.strip_suffix('\r').unwrap_or(l);
            l.rsplit('\r').next().unwrap_or("").trim_end().to_string()
        })
        .collect()
}

/// Whether `got` matches `expected` (`[...]` matches any run of lines).
fn matches(expected: &[String], got: &[String]) -> bool {
    match expected.split_first() {
        None => got.is_empty(),
        Some((e, rest)) if e == "[...]" => (0..=got.len()).any(|i| matches(rest, &got[i..])),
        Some((e, rest)) => got.first() == Some(e) && matches(rest, &got[1..]),
    }
}

fn history_file() -> PathBuf {
    std::env::temp_dir().join(format!("tessera-history-{}", std::process::id()))
}

fn spawn_with_history(history: &Path) -> Session {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    // On the CPU, with GPUs hidden: transcripts read the same on every machine.
    cmd.args(["repl", "--device", "cpu"])
        .current_dir(root())
        .env("CUDA_VISIBLE_DEVICES", "")
        .env("NO_COLOR", "1")
        .env("TERM", "xterm")
        .env("TESSERA_HISTORY", history);
    let mut p = Session::spawn(cmd).expect("spawn tessera repl in a pty");
    // Wide enough that no typed line wraps: rustyline redraws a wrapping line
    // with its prompt, which would look like the next prompt.
    p.get_process_mut()
        .set_window_size(1000, 50)
        .expect("set the pty size");
    p.set_expect_timeout(Some(Duration::from_secs(60)));
    p
}

/// Replays `steps`; returns the mismatches.
fn replay(name: &str, steps: &[Step], history: &Path) -> Vec<String> {
    let mut failures = Vec::new();
    let mut p = spawn_with_history(history);
    p.expect(PROMPT).expect("first prompt");
    for step in steps {
        match step {
            Step::Input {
                lines,
                expected,
                interrupt,
            } => {
                if let Some(typed) = lines[0].strip_suffix("<ctrl-c>") {
                    // Typed, then Ctrl-C instead of Enter: the line is dropped.
                    p.send(typed).unwrap();
                    p.send("\x03").unwrap();
                    p.expect(PROMPT).expect("prompt after Ctrl-C");
                    continue;
                }
                if lines[0] == ":quit" {
                    p.send(":quit\r").unwrap();
                    p.expect(Eof).expect("the session ends on :quit");
                    let status = p.get_process().wait().unwrap();
                    assert!(
                        matches!(status, WaitStatus::Exited(_, 0)),
                        "{name}: :quit exit status {status:?}"
                    );
                    return failures;
                }
                for (i, line) in lines.iter().enumerate() {
                    p.send(format!("{line}\r")).unwrap();
                    if i + 1 < lines.len() {
                        p.expect(CONTINUATION).unwrap_or_else(|e| {
                            panic!("{name}: no continuation prompt after {line:?}: {e}")
                        });
                    }
                }
                if *interrupt {
                    // Let the computation start, then interrupt it.
                    std::thread::sleep(Duration::from_millis(500));
                    p.send("\x03").unwrap();
                }
                let got = p
                    .expect(PROMPT)
                    .unwrap_or_else(|e| panic!("{name}: no prompt after {lines:?}: {e}"));
                let mut got = clean(got.before());
                // The first line is the echo of the last line typed.
                got.remove(0);
                while got.last().is_some_and(String::is_empty) {
                    got.pop();
                }
                if !matches(expected, &got) {
                    failures.push(format!(
                        "{name}: after {lines:?}\n--- expected\n{}\n--- got\n{}",
                        expected.join("\n"),
                        got.join("\n")
                    ));
                }
            }
            Step::CtrlC => {
                p.send("\x03").unwrap();
                p.expect(PROMPT).expect("prompt after Ctrl-C");
            }
            Step::CtrlD => {
                p.send("\x04").unwrap();
                p.expect(Eof).expect("the session ends on Ctrl-D");
                let status = p.get_process().wait().unwrap();
                assert!(
                    matches!(status, WaitStatus::Exited(_, 0)),
                    "{name}: Ctrl-D exit status {status:?}"
                );
                return failures;
            }
        }
    }
    failures
}

/// The ```repl blocks of a Markdown file, in order.
fn doc_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match &mut current {
            None if line.trim() == "```repl" => current = Some(String::new()),
            Some(b) if line.trim() == "```" => {
                blocks.push(std::mem::take(b));
                current = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None => {}
        }
    }
    blocks
}

#[test]
fn transcripts_replay() {
    let dir = root().join("tests/repl");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/repl")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "transcript"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no transcripts in {}", dir.display());
    let mut failures = Vec::new();
    for f in &files {
        let steps = parse(&std::fs::read_to_string(f).unwrap());
        assert!(!steps.is_empty(), "{} has no steps", f.display());
        failures.extend(replay(
            &f.file_name().unwrap().to_string_lossy(),
            &steps,
            &history_file(),
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // History persists across sessions in the file `TESSERA_HISTORY` names.
    let history = std::fs::read_to_string(history_file()).expect("the history file was written");
    assert!(
        history.contains("x = randn([4, 1000], f32, seed=0)"),
        "{history}"
    );
    assert!(history.contains(":resources gemm sm_90"), "{history}");
}

#[test]
fn the_guide_replays() {
    let text = std::fs::read_to_string(root().join("docs/repl.md")).expect("docs/repl.md");
    let blocks = doc_blocks(&text);
    assert!(!blocks.is_empty(), "docs/repl.md has no ```repl block");
    let mut failures = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        // Its own history file: tests run in parallel.
        let history =
            std::env::temp_dir().join(format!("tessera-history-doc-{}", std::process::id()));
        failures.extend(replay(
            &format!("docs/repl.md block {}", i + 1),
            &parse(b),
            &history,
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn transcript_format() {
    let steps = parse("# c\ntessera> def f():\n...         pass\n...\ntessera> 1 + 1\n2\ntessera> while True:\n...         pass\n...\n<ctrl-c>\nerror\n[...]\n<ctrl-d>\n");
    assert_eq!(steps.len(), 4);
    assert!(
        matches!(&steps[0], Step::Input { lines, .. } if lines == &["def f():", "    pass", ""])
    );
    assert!(
        matches!(&steps[2], Step::Input { interrupt: true, expected, .. } if expected.len() == 2)
    );
    assert_eq!(steps[3], Step::CtrlD);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert!(matches(&s(&["a", "[...]", "d"]), &s(&["a", "b", "c", "d"])));
    assert!(!matches(&s(&["a", "d"]), &s(&["a", "b", "d"])));
    assert_eq!(clean(b"\x1b[1mab\x1b[0m\r\nx\ry\n"), s(&["ab", "y", ""]));
}

#[test]
fn tab_completes_session_names_and_commands() {
    // Its own history file: tests run in parallel.
    let history = std::env::temp_dir().join(format!("tessera-history-tab-{}", std::process::id()));
    let mut p = spawn_with_history(&history);
    p.expect(PROMPT).unwrap();
    p.send("xs_value = 41\r").unwrap();
    p.expect(PROMPT).unwrap();
    // `xs_` + Tab completes to the variable; Enter evaluates `xs_value + 1`.
    p.send("xs_\t").unwrap();
    p.expect("xs_value").unwrap();
    p.send(" + 1\r").unwrap();
    let got = p.expect(PROMPT).unwrap();
    let lines = clean(got.before());
    assert!(lines.iter().any(|l| l == "42"), "{lines:?}");
    // `:dev` + Tab completes to `:device`.
    p.send(":dev\t").unwrap();
    p.expect(":device").unwrap();
    p.send("\r").unwrap();
    let got = p.expect(PROMPT).unwrap();
    assert!(clean(got.before()).iter().any(|l| l == "cpu"));
    p.send("\x04").unwrap();
    p.expect(Eof).unwrap();
}

#[test]
fn tab_lists_candidates_and_completes_members() {
    let history = std::env::temp_dir().join(format!("tessera-history-dot-{}", std::process::id()));
    let mut p = spawn_with_history(&history);
    p.expect(PROMPT).unwrap();
    p.send("x = ones([2], f32)\r").unwrap();
    p.expect(PROMPT).unwrap();
    // `x.` + Tab Tab lists the value's members (list mode, not cycling).
    p.send("x.\t\t").unwrap();
    let got = p.expect("x.to").unwrap();
    let listed = String::from_utf8_lossy(got.before()).to_string();
    for m in ["x.T", "x.dtype", "x.shape"] {
        assert!(listed.contains(m), "{m} in {listed:?}");
    }
    // The line still holds `x.`: `sh` + Tab completes it to `x.shape`.
    p.send("sh\t").unwrap();
    p.expect("x.shape\r").unwrap();
    p.send("\r").unwrap();
    let got = p.expect(PROMPT).unwrap();
    assert!(
        clean(got.before()).iter().any(|l| l == "(2,)"),
        "{:?}",
        clean(got.before())
    );
    p.send("\x04").unwrap();
    p.expect(Eof).unwrap();
    let _ = std::fs::remove_file(&history);
}

#[test]
fn history_survives_a_kill() {
    let history = std::env::temp_dir().join(format!("tessera-history-kill-{}", std::process::id()));
    let _ = std::fs::remove_file(&history);
    let mut p = spawn_with_history(&history);
    p.expect(PROMPT).unwrap();
    p.send("kept_value = 7\r").unwrap();
    p.expect(PROMPT).unwrap();
    p.send(":device\r").unwrap();
    p.expect(PROMPT).unwrap();
    // Killed, not left: only what was written as each entry was entered remains.
    let pid = p.get_process().pid().to_string();
    let status = Command::new("kill").args(["-9", &pid]).status().unwrap();
    assert!(status.success());
    let _ = p.expect(Eof);
    let text = std::fs::read_to_string(&history).unwrap_or_default();
    assert!(
        text.contains("kept_value = 7") && text.contains(":device"),
        "{text:?}"
    );
    let _ = std::fs::remove_file(&history);
}
