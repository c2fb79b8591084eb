//! A fresh process for a session whose GPU context a sticky error broke.
//!
//! After a kernel's fault the CUDA driver makes no new context in the
//! process, so `tessera repl` saves the session to a private temporary
//! folder (see `session::snapshot`) and replaces its process with
//! `tessera repl ARGS --resume DIR` (same executable, same arguments, the
//! same stdin: piped input not executed yet is saved in the folder and read
//! first). The new process restores the session, deletes the folder, says
//! what was lost and goes on.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;

use tessera::diag::Diagnostic;
use tessera::syntax::span::Span;

use crate::session::{is_state_file, lost_text, Device, Session, ShellState, Sticky, MANIFEST};

/// Counts the restarts in a chain of processes, so that a fault right after
/// each start cannot restart forever.
pub const RESTARTS_ENV: &str = "TESSERA_REPL_RESTARTS";
/// The most restarts in a chain.
pub const MAX_RESTARTS: u32 = 8;

/// The process's arguments without a `--resume DIR` of an earlier restart.
pub fn without_resume(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        if a == "--resume" {
            args.next();
        } else if !a.to_string_lossy().starts_with("--resume=") {
            out.push(a);
        }
    }
    out
}

/// How many restarts led to this process.
fn restarts_so_far() -> u32 {
    std::env::var(RESTARTS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Saves `session` and replaces the process with a fresh `tessera repl`
/// that resumes it. Returns only when that fails: why.
pub fn restart(session: &Session, sticky: &Sticky, shell: &ShellState) -> String {
    match try_restart(session, sticky, shell) {
        Err(why) => why,
        Ok(never) => match never {},
    }
}

#[cfg(not(unix))]
fn try_restart(
    _session: &Session,
    _sticky: &Sticky,
    _shell: &ShellState,
) -> Result<std::convert::Infallible, String> {
    Err("a restart needs a unix system".to_string())
}

#[cfg(unix)]
fn try_restart(
    session: &Session,
    sticky: &Sticky,
    shell: &ShellState,
) -> Result<std::convert::Infallible, String> {
    use std::os::unix::process::CommandExt;
    let count = restarts_so_far();
    if count >= MAX_RESTARTS {
        return Err(format!("it restarted {count} times already"));
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find tessera's executable: {e}"))?;
    // Readable by the user only (tempfile makes the folder with mode 0700).
    let dir = tempfile::Builder::new()
        .prefix("tessera-session-")
        .tempdir()
        .map_err(|e| format!("cannot make a folder for the session: {e}"))?;
    session
        .save_state(dir.path(), sticky.device, &sticky.lost, shell)
        .map_err(|e| format!("cannot save the session: {e}"))?;
    let dir = dir.keep();
    let mut args = without_resume(std::env::args_os().skip(1));
    args.push("--resume".into());
    args.push(dir.clone().into_os_string());
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let e = std::process::Command::new(&exe)
        .args(args)
        .env(RESTARTS_ENV, (count + 1).to_string())
        .exec();
    remove_state(&dir);
    Err(format!("cannot run `{}`: {e}", exe.display()))
}

/// Deletes a state folder: only the files a state has, then the folder if
/// that emptied it (`--resume` may name any folder).
pub fn remove_state(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.to_str().is_some_and(is_state_file) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Restores the session saved in `dir` into `session` (a new, empty one),
/// puts it on its device, deletes the folder and notes on `err` what the
/// restart kept. A state that cannot be read is E0735 (the session stays
/// empty and on the CPU, and piped mode's exit status 1). Returns the front
/// end's saved part.
pub fn resume(session: &mut Session, dir: &Path, err: &mut dyn Write) -> ShellState {
    let restored = session.restore_state(dir);
    remove_state(dir);
    let restored = match restored {
        Ok(r) => r,
        Err(why) => {
            let option = format!("--resume {}", dir.display());
            let d = Diagnostic::new(
                "E0735",
                Span::new(0, option.len() as u32),
                format!("cannot resume the session from `{}`: {why}", dir.display()),
            )
            .with_help(format!(
                "the session starts empty; `--resume` is for tessera's own restart after a GPU error, \
                 and reads a folder with a complete `{MANIFEST}`"
            ));
            session.render_against(&option, &[d], err);
            session.use_cpu();
            // Piped mode then exits 1: the old session's state is gone.
            return ShellState {
                failed: true,
                input: Vec::new(),
            };
        }
    };
    let lost = lost_text(&restored.lost);
    let gpu = match restored.device {
        Device::Cuda => session.use_cuda().err(),
        _ => {
            session.use_cpu();
            None
        }
    };
    match gpu {
        None => {
            let _ = writeln!(
                err,
                "note: the GPU's context was unusable after that error; the session restarted its process to make a fresh one ({lost}); definitions and the other values are kept"
            );
        }
        Some(e) => {
            session.use_cpu();
            let why = e.help.as_deref().unwrap_or(&e.message);
            let _ = writeln!(
                err,
                "note: the GPU's context was unusable after that error; the session restarted its process, but the GPU cannot be opened: {why}; the session runs on the CPU now ({lost}); definitions and the other values are kept"
            );
        }
    }
    restored.shell
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_passes_the_arguments_on_without_an_earlier_resume() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            without_resume(args(&["repl", "--device", "cuda"])),
            args(&["repl", "--device", "cuda"])
        );
        assert_eq!(
            without_resume(args(&["repl", "--resume", "/tmp/a", "--device", "cuda"])),
            args(&["repl", "--device", "cuda"])
        );
        assert_eq!(
            without_resume(args(&["repl", "--resume=/tmp/a"])),
            args(&["repl"])
        );
    }

    #[test]
    fn removing_a_state_leaves_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        for f in [MANIFEST, "input", "t0.npy", "t1.bin"] {
            std::fs::write(state.join(f), "x").unwrap();
        }
        remove_state(&state);
        assert!(!state.exists());
        std::fs::create_dir(&state).unwrap();
        std::fs::write(state.join(MANIFEST), "x").unwrap();
        std::fs::write(state.join("notes.txt"), "mine").unwrap();
        remove_state(&state);
        assert!(!state.join(MANIFEST).exists());
        assert_eq!(
            std::fs::read_to_string(state.join("notes.txt")).unwrap(),
            "mine"
        );
    }
}
