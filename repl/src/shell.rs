//! The front ends of a session: the interactive shell (rustyline: prompt,
//! continuation lines, history, completion, bracket highlighting, Ctrl-C and
//! Ctrl-D) and the piped mode that reads statements from a non-terminal stdin.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustyline::completion::{Completer, FilenameCompleter, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::{CmdKind, Highlighter, MatchingBracketHighlighter};
use rustyline::history::DefaultHistory;
use rustyline::{Context, Editor, Helper, Hinter, Validator};

use crate::chunk::{needs_more, Chunk, Chunker};
use crate::command::{self, Next, COMMANDS};
use crate::session::Session;

pub const PROMPT: &str = "tessera> ";
pub const CONTINUATION: &str = "...     ";

/// The environment variable that overrides the history file (tests use it).
pub const HISTORY_ENV: &str = "TESSERA_HISTORY";

/// Exit statuses of `tessera repl`.
pub const EXIT_OK: u8 = 0;
/// Piped mode: at least one statement or command failed.
pub const EXIT_ERRORS: u8 = 1;

/// Where history persists: `$TESSERA_HISTORY`, else `<data dir>/tessera/history`.
pub fn history_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(HISTORY_ENV) {
        return (!p.is_empty()).then(|| PathBuf::from(p));
    }
    dirs::data_dir().map(|d| d.join("tessera").join("history"))
}

/// Installs the Ctrl-C handler once: while a computation runs (`running`), it
/// asks the session to stop; otherwise (piped mode waiting for input) it exits
/// with status 130. At the interactive prompt rustyline reads Ctrl-C as a key.
fn install_interrupt(session: &Session, running: Arc<AtomicBool>) {
    let flag = session.interrupt().clone();
    let _ = ctrlc::set_handler(move || {
        if running.load(Ordering::SeqCst) {
            flag.trigger();
        } else {
            std::process::exit(130);
        }
    });
}

/// Runs `f` with the interrupt handler armed.
fn running<T>(flag: &AtomicBool, f: impl FnOnce() -> T) -> T {
    flag.store(true, Ordering::SeqCst);
    let r = f();
    flag.store(false, Ordering::SeqCst);
    r
}

/// Executes one complete input (a command or statements); false on error.
fn execute(
    session: &mut Session,
    input: &str,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> (Next, bool) {
    if command::is_command(input) {
        command::run(session, input, out, err)
    } else if input.trim().is_empty() {
        (Next::Continue, true)
    } else {
        (Next::Continue, session.execute(input, out, err))
    }
}

/// The interactive shell; returns the exit status (0 on Ctrl-D or `:quit`).
pub fn interactive(mut session: Session, color: bool) -> u8 {
    let flag = Arc::new(AtomicBool::new(false));
    // rustyline keeps 100 entries by default; a session of kernels and
    // tensors runs past that in an afternoon (bash keeps 500 to 1000).
    let config = rustyline::Config::builder()
        .max_history_size(1000)
        .unwrap_or_else(|_| rustyline::Config::builder())
        .auto_add_history(false)
        // Tab completes the common prefix, a second Tab lists the candidates
        // (bash's way; cycling showed one candidate at a time).
        .completion_type(rustyline::CompletionType::List)
        .color_mode(if color {
            rustyline::ColorMode::Enabled
        } else {
            rustyline::ColorMode::Disabled
        })
        .build();
    let mut editor: Editor<ReplHelper, DefaultHistory> = match Editor::with_config(config) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: cannot start the line editor: {e}");
            return EXIT_ERRORS;
        }
    };
    // After the editor: rustyline installs a SIGINT handler of its own when it
    // opens the terminal, which ours replaces (at the prompt the terminal is in
    // raw mode and Ctrl-C arrives as a key anyway).
    install_interrupt(&session, flag.clone());
    let names = Rc::new(RefCell::new(session.names()));
    let members = Rc::new(RefCell::new(session.members()));
    editor.set_helper(Some(ReplHelper::new(names.clone(), members.clone(), color)));
    let history = history_path();
    if let Some(h) = &history {
        let _ = editor.load_history(h);
        if let Some(dir) = h.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
    }
    // Each entry is appended to the history file as it is entered, so that a
    // crash or a kill loses none of the session's history.
    let remember = |editor: &mut Editor<ReplHelper, DefaultHistory>, entry: &str| {
        let _ = editor.add_history_entry(entry);
        if let Some(h) = &history {
            let _ = editor.append_history(h);
        }
    };
    let place = match session.gpu_info() {
        Some(info) => format!("on the GPU {info}"),
        None => "on the CPU".to_string(),
    };
    println!(
        "Tessera {} — statements run {place}. `:help` lists the commands, Ctrl-D leaves.",
        env!("CARGO_PKG_VERSION")
    );
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() {
            PROMPT
        } else {
            CONTINUATION
        };
        match editor.readline(prompt) {
            Ok(line) => {
                if buffer.is_empty() && command::is_command(&line) {
                    remember(&mut editor, line.as_str());
                    let (next, _) = running(&flag, || {
                        execute(
                            &mut session,
                            &line,
                            &mut std::io::stdout(),
                            &mut std::io::stderr(),
                        )
                    });
                    *names.borrow_mut() = session.names();
                    *members.borrow_mut() = session.members();
                    if next == Next::Quit {
                        break;
                    }
                    continue;
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if needs_more(&buffer) {
                    continue;
                }
                let input = std::mem::take(&mut buffer);
                let entry = input.trim_end_matches('\n');
                if !entry.trim().is_empty() {
                    remember(&mut editor, entry);
                }
                running(&flag, || {
                    execute(
                        &mut session,
                        &input,
                        &mut std::io::stdout(),
                        &mut std::io::stderr(),
                    )
                });
                *names.borrow_mut() = session.names();
                *members.borrow_mut() = session.members();
            }
            Err(ReadlineError::Interrupted) => {
                // Ctrl-C at the prompt: drop what was typed.
                buffer.clear();
            }
            Err(ReadlineError::Eof) => {
                if buffer.is_empty() {
                    break;
                }
                // Ctrl-D inside a block: run what was typed, then leave.
                let input = std::mem::take(&mut buffer);
                running(&flag, || {
                    execute(
                        &mut session,
                        &input,
                        &mut std::io::stdout(),
                        &mut std::io::stderr(),
                    )
                });
                break;
            }
            Err(e) => {
                eprintln!("error: cannot read the terminal: {e}");
                break;
            }
        }
    }
    EXIT_OK
}

/// Piped mode: statements from `input` (a block ends with a blank line or
/// at the next line that starts at column 0), no prompts; diagnostics on
/// stderr. Every statement runs even after an error; the exit status is 1 when
/// any failed.
pub fn piped(mut session: Session, input: impl BufRead) -> u8 {
    let flag = Arc::new(AtomicBool::new(false));
    install_interrupt(&session, flag.clone());
    let mut failed = false;
    let mut chunker = Chunker::new();
    let mut run = |chunk: Chunk, session: &mut Session| -> Next {
        let (next, ok) = running(&flag, || {
            execute(
                session,
                &chunk.text,
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            )
        });
        failed |= !ok;
        next
    };
    'lines: for line in input.lines() {
        let Ok(line) = line else { break };
        // `lines` ends lines at `\n` and `\r\n`; a lone `\r` ends one too
        for part in line.split('\r') {
            for chunk in chunker.push_line(part) {
                if run(chunk, &mut session) == Next::Quit {
                    break 'lines;
                }
            }
        }
    }
    if let Some(chunk) = chunker.finish() {
        run(chunk, &mut session);
    }
    if failed {
        EXIT_ERRORS
    } else {
        EXIT_OK
    }
}

/// Completion (session names, builtins, stdlib modules and members,
/// `:commands`, file names after `:load`) and bracket highlighting.
#[derive(Helper, Hinter, Validator)]
pub struct ReplHelper {
    names: Rc<RefCell<Vec<String>>>,
    /// What may follow `NAME.` (see `Session::members`).
    members: Rc<RefCell<BTreeMap<String, Vec<String>>>>,
    files: FilenameCompleter,
    brackets: MatchingBracketHighlighter,
    color: bool,
}

impl ReplHelper {
    fn new(
        names: Rc<RefCell<Vec<String>>>,
        members: Rc<RefCell<BTreeMap<String, Vec<String>>>>,
        color: bool,
    ) -> Self {
        ReplHelper {
            names,
            members,
            files: FilenameCompleter::new(),
            brackets: MatchingBracketHighlighter::new(),
            color,
        }
    }
}

/// The completions of `word` given the session's names and what may follow
/// `NAME.` for each (sorted, unique).
pub fn complete_word(
    word: &str,
    session_names: &[String],
    members: &BTreeMap<String, Vec<String>>,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Some((head, member)) = word
        .rsplit_once('.')
        .filter(|(head, _)| members.contains_key(*head))
    {
        // `x.sh` → `x.shape`; `nn.so` → `nn.softmax` (after `import std.nn as nn`).
        out.extend(
            members[head]
                .iter()
                .filter(|m| m.starts_with(member))
                .map(|m| format!("{head}.{m}")),
        );
    } else if word.starts_with(':') {
        out.extend(
            COMMANDS
                .iter()
                .map(|(c, _)| c.split_whitespace().next().expect("name").to_string())
                .filter(|c| c.starts_with(word)),
        );
    } else if let Some((module, member)) = word.rsplit_once('.') {
        // `std.nn.so` → members of std.nn; `std.n` → modules.
        for m in tessera::stdlib::modules() {
            if m.starts_with(word) {
                out.push(m.to_string());
            }
        }
        if let Some(src) = tessera::stdlib::source(module) {
            let (items, _) = tessera::syntax::parse_file(src);
            for (item, _) in items {
                let name = match item {
                    tessera::syntax::ast::Item::Function(f) => f.name.name,
                    tessera::syntax::ast::Item::Const(c) => c.name.name,
                    _ => continue,
                };
                if name.starts_with(member) {
                    out.push(format!("{module}.{name}"));
                }
            }
        }
    } else {
        let builtins = tessera::check::builtins::names()
            .chain(["std", "f32", "f16", "bf16", "f64", "i32", "i64", "bool"]);
        out.extend(
            session_names
                .iter()
                .filter(|n| n.starts_with(word))
                .cloned(),
        );
        out.extend(builtins.filter(|n| n.starts_with(word)).map(String::from));
        for kw in [
            "def", "const", "import", "from", "for", "while", "if", "else", "elif", "return",
            "print",
        ] {
            if kw.starts_with(word) {
                out.push(kw.to_string());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

impl Completer for ReplHelper {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        let before = &line[..pos];
        if before.trim_start().starts_with(":load ") || before.trim_start().starts_with(":l ") {
            return self.files.complete(line, pos, ctx);
        }
        let start = before
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.' || c == ':'))
            .map_or(0, |i| i + 1);
        let word = &before[start..];
        if word.is_empty() {
            return Ok((pos, Vec::new()));
        }
        let names = self.names.borrow();
        let members = self.members.borrow();
        let pairs = complete_word(word, &names, &members)
            .into_iter()
            .map(|c| Pair {
                display: c.clone(),
                replacement: c,
            })
            .collect();
        Ok((start, pairs))
    }
}

impl Highlighter for ReplHelper {
    fn highlight<'l>(&self, line: &'l str, pos: usize) -> Cow<'l, str> {
        if self.color {
            self.brackets.highlight(line, pos)
        } else {
            Cow::Borrowed(line)
        }
    }

    fn highlight_char(&self, line: &str, pos: usize, kind: CmdKind) -> bool {
        self.color && self.brackets.highlight_char(line, pos, kind)
    }
}

#[cfg(test)]
mod tests {
    use super::complete_word;
    use std::collections::BTreeMap;

    #[test]
    fn completion_after_a_dot_offers_members() {
        let names = vec!["x".to_string(), "nn".to_string()];
        let mut members = BTreeMap::new();
        let of = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        members.insert("x".to_string(), of(tessera::check::expr::VALUE_MEMBERS));
        members.insert("nn".to_string(), of(&["gelu", "softmax"]));
        assert_eq!(
            complete_word("x.", &names, &members),
            ["x.T", "x.dtype", "x.shape", "x.to"]
        );
        assert_eq!(complete_word("x.s", &names, &members), ["x.shape"]);
        assert_eq!(complete_word("nn.so", &names, &members), ["nn.softmax"]);
        // `std.` without an import still lists the standard modules.
        assert!(complete_word("std.", &names, &members).contains(&"std.nn".to_string()));
    }

    #[test]
    fn completion_of_names_commands_and_stdlib() {
        let names = vec!["xs".to_string(), "softmax_rows".to_string()];
        let complete_word = |w: &str, n: &[String]| complete_word(w, n, &BTreeMap::new());
        let got = complete_word("soft", &names);
        assert!(
            got.contains(&"softmax".to_string()) && got.contains(&"softmax_rows".to_string()),
            "{got:?}"
        );
        assert_eq!(complete_word(":re", &names), [":reload", ":resources"]);
        assert!(complete_word("std.", &names).contains(&"std.nn".to_string()));
        let members = complete_word("std.nn.", &names);
        assert!(
            !members.is_empty() && members.iter().all(|m| m.starts_with("std.nn.")),
            "{members:?}"
        );
        assert!(complete_word("ran", &names).contains(&"randn".to_string()));
    }
}
