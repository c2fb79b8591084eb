//! The front ends of a session: the interactive shell (rustyline: prompt,
//! continuation lines, history, completion, bracket highlighting, Ctrl-C and
//! Ctrl-D) and the piped mode that reads statements from a non-terminal stdin.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
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
use crate::session::{Session, ShellState};

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
pub(crate) fn execute(
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

/// After an input: when a sticky error left the GPU unusable and no fresh
/// context can be made in this process, restarts the process with the
/// session and `shell` (see `crate::restart`); where that fails, the session
/// goes on on the CPU.
fn restart_if_stuck(session: &mut Session, shell: impl FnOnce() -> ShellState) {
    if let Some(sticky) = session.take_sticky() {
        let why = crate::restart::restart(session, &sticky, &shell());
        session.sticky_on_cpu(&sticky, Some(&why), &mut std::io::stderr());
    }
}

/// The interactive shell; returns the exit status (0 on Ctrl-D or `:quit`).
/// `resumed`: the session was restored after a restart (a short greeting).
pub fn interactive(mut session: Session, color: bool, resumed: bool) -> u8 {
    // The restart replaces the process (exec): elsewhere the session goes
    // on on the CPU after a sticky error, as it did before.
    session.allow_restart(cfg!(unix));
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
    let n = session.device_count();
    let place = match (session.gpu_info(), n) {
        (Some(info), 1) => format!("on the GPU {info}"),
        (Some(info), n) => format!(
            "on {n} GPUs (`shard` spreads tensors over cuda:0 to cuda:{}), the first {info}",
            n - 1
        ),
        (None, 1) => "on the CPU".to_string(),
        (None, n) => format!(
            "on the CPU, with {n} virtual devices for `shard` (cpu:0 to cpu:{})",
            n - 1
        ),
    };
    if resumed {
        println!("Tessera: the session goes on; statements run {place}.");
    } else {
        println!(
            "Tessera {} — statements run {place}. `:help` lists the commands, Ctrl-D leaves.",
            env!("CARGO_PKG_VERSION")
        );
    }
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
                    restart_if_stuck(&mut session, ShellState::default);
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
                restart_if_stuck(&mut session, ShellState::default);
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
/// any failed (or `failed`: one failed before a restart).
pub fn piped(mut session: Session, input: impl BufRead, failed: bool) -> u8 {
    let flag = Arc::new(AtomicBool::new(false));
    install_interrupt(&session, flag.clone());
    session.allow_restart(cfg!(unix));
    let mut failed = failed;
    each_input(input, |chunk, unexecuted| {
        let (next, ok) = running(&flag, || {
            execute(
                &mut session,
                &chunk.text,
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            )
        });
        failed |= !ok;
        restart_if_stuck(&mut session, || ShellState {
            failed,
            input: unexecuted(),
        });
        next
    });
    if failed {
        EXIT_ERRORS
    } else {
        EXIT_OK
    }
}

/// Hands each input of `input` to `run` in order, with a function that
/// gives the input read but not executed after it; stops at `Next::Quit`.
fn each_input(input: impl BufRead, mut run: impl FnMut(Chunk, &dyn Fn() -> Vec<u8>) -> Next) {
    let mut chunker = Chunker::new();
    let mut lines = Lines::new(input);
    // Inputs complete but not run yet (a line may complete two).
    let mut ready: VecDeque<Chunk> = VecDeque::new();
    loop {
        let Some(chunk) = ready.pop_front() else {
            match lines.next_line() {
                Some(line) => ready.extend(chunker.push_line(&line)),
                None => match chunker.finish() {
                    Some(chunk) => ready.push_back(chunk),
                    None => break,
                },
            }
            continue;
        };
        let unexecuted = || unexecuted(&ready, &chunker, lines.rest());
        if run(chunk, &unexecuted) == Next::Quit {
            break;
        }
    }
}

/// The input read but not executed, as text to read again: the complete
/// inputs not run yet, the lines of the open one, then the bytes not yet
/// split into lines.
fn unexecuted(ready: &VecDeque<Chunk>, chunker: &Chunker, rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in ready {
        out.extend_from_slice(c.text.as_bytes());
        // A command's text has no line break.
        if !c.text.ends_with('\n') {
            out.push(b'\n');
        }
    }
    out.extend_from_slice(chunker.pending().as_bytes());
    out.extend_from_slice(rest);
    out
}

/// The lines of piped input, read through a buffer of our own, so that the
/// bytes read but not yet used are known (a restart hands them on).
struct Lines<R> {
    input: R,
    buf: Vec<u8>,
    /// Where the unused bytes of `buf` start.
    start: usize,
    eof: bool,
}

impl<R: BufRead> Lines<R> {
    fn new(input: R) -> Self {
        Lines {
            input,
            buf: Vec::new(),
            start: 0,
            eof: false,
        }
    }

    /// The next line without its break (`\n`, `\r\n` or a lone `\r`);
    /// `None` at the end of the input, or at a read error or a line that is
    /// not UTF-8.
    fn next_line(&mut self) -> Option<String> {
        loop {
            let pending = &self.buf[self.start..];
            let found = pending.iter().position(|b| *b == b'\n' || *b == b'\r');
            // A `\r` last in what was read may start a `\r\n`: read on first.
            let complete =
                found.filter(|&i| pending[i] == b'\n' || i + 1 < pending.len() || self.eof);
            if let Some(i) = complete {
                let brk = if pending[i..].starts_with(b"\r\n") {
                    2
                } else {
                    1
                };
                let line = String::from_utf8(pending[..i].to_vec()).ok()?;
                self.start += i + brk;
                return Some(line);
            }
            if self.eof {
                if pending.is_empty() {
                    return None;
                }
                let line = String::from_utf8(pending.to_vec()).ok()?;
                self.start = self.buf.len();
                return Some(line);
            }
            self.fill();
        }
    }

    /// Reads what the input has ready into `buf`.
    fn fill(&mut self) {
        self.buf.drain(..self.start);
        self.start = 0;
        loop {
            match self.input.fill_buf() {
                Ok([]) => self.eof = true,
                Ok(bytes) => {
                    let n = bytes.len();
                    self.buf.extend_from_slice(bytes);
                    self.input.consume(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => self.eof = true,
            }
            return;
        }
    }

    /// The bytes read but not yet returned as lines.
    fn rest(&self) -> &[u8] {
        &self.buf[self.start..]
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
    use super::{complete_word, each_input, Next};
    use std::collections::BTreeMap;

    /// Every input of `input`, as piped mode runs them.
    fn inputs(input: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        each_input(input, |c, _| {
            out.push(c.text);
            Next::Continue
        });
        out
    }

    #[test]
    fn the_input_handed_to_a_restart_is_what_was_not_run() {
        let text = "x = 1\n:type x\nfor i in range(2):\n    x += i\nprint(x)\n\n\n@kernel(grid=(1,))\ndef k(a: Tensor[4, f32]):\n    pass\n\ny = (1 +\n2)\r\n:load f.tsr\rz = 3\r\rif z > 1:\n    w = 4\nelse:\n    w = 5";
        let all = inputs(text.as_bytes());
        assert_eq!(all.len(), 9, "{all:?}");
        assert_eq!(all[2], "for i in range(2):\n    x += i\n");
        assert_eq!(all[1], ":type x");
        // After each input, read through buffers of every size (so that the
        // remainder is partly lines, partly bytes not split yet).
        for k in 0..all.len() {
            for cap in [1, 2, 5, 16, 4096] {
                // What the process never read stays in the input (fd 0
                // survives the restart): `source` after the run.
                let mut source = text.as_bytes();
                let reader = std::io::BufReader::with_capacity(cap, &mut source);
                let mut seen = 0;
                let mut rest = None;
                each_input(reader, |_, unexecuted| {
                    seen += 1;
                    if seen == k + 1 {
                        rest = Some(unexecuted());
                        return Next::Quit;
                    }
                    Next::Continue
                });
                let mut rest = rest.expect("the k-th input ran");
                rest.extend_from_slice(source);
                assert_eq!(
                    inputs(&rest),
                    all[k + 1..],
                    "after input {k}, buffer {cap}: {}",
                    String::from_utf8_lossy(&rest)
                );
            }
        }
    }

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
