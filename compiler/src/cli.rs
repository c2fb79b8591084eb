//! Command implementations shared by the `tsrc` and `tessera` binaries, so that
//! `tsrc check` and `tessera check` are one piece of code.
//!
//! Exit codes: 0 when no file has an error (warnings allowed), 1 when any file
//! has an error, 2 on a usage error (clap) or when a file cannot be read.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use crate::backend::arch::Arch;
use crate::db::Database;
use crate::diag::render::{self, LineIndex};
use crate::diag::Severity;

/// Exit status: no errors.
pub const EXIT_OK: u8 = 0;
/// Exit status: at least one error diagnostic.
pub const EXIT_ERRORS: u8 = 1;
/// Exit status: bad usage or a file that cannot be read.
pub const EXIT_USAGE: u8 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MessageFormat {
    /// Rendered diagnostics on stderr, then a summary line.
    Human,
    /// One JSON object per diagnostic per line on stdout.
    Json,
}

/// `check [--arch ARCH] [--message-format human|json] FILE...`
#[derive(Clone, Debug, clap::Args)]
pub struct CheckArgs {
    /// Target architecture: sm_70 sm_75 sm_80 sm_86 sm_89 sm_90 sm_90a gfx90a gfx942 gfx1100.
    #[arg(long, default_value = "sm_90", value_parser = clap::value_parser!(Arch))]
    pub arch: Arch,
    /// How to print diagnostics.
    #[arg(long, value_enum, default_value_t = MessageFormat::Human)]
    pub message_format: MessageFormat,
    /// The `.tsr` files to check.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// Whether diagnostics written to stderr should be coloured: only on a terminal,
/// and never when `NO_COLOR` is set to a non-empty value (https://no-color.org).
pub fn stderr_wants_color() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

/// `check` writing to the process's stdout and stderr; returns the exit status.
pub fn check(args: &CheckArgs) -> u8 {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let color = stderr_wants_color();
    check_to(args, &mut stdout.lock(), &mut stderr.lock(), color)
}

/// What a check run found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckSummary {
    pub files_checked: usize,
    pub files_unreadable: usize,
    pub errors: usize,
    pub warnings: usize,
}

impl CheckSummary {
    pub fn exit_code(&self) -> u8 {
        if self.files_unreadable > 0 {
            EXIT_USAGE
        } else if self.errors > 0 {
            EXIT_ERRORS
        } else {
            EXIT_OK
        }
    }

    /// The last line of human output, e.g.
    /// `error: 3 errors, 1 warning (2 files checked)` or
    /// `ok: 0 errors, 0 warnings (1 file checked)`.
    pub fn line(&self) -> String {
        let status = if self.errors > 0 || self.files_unreadable > 0 {
            "error"
        } else {
            "ok"
        };
        let mut files = plural(self.files_checked, "file") + " checked";
        if self.files_unreadable > 0 {
            files += &format!(", {} unreadable", self.files_unreadable);
        }
        format!(
            "{status}: {}, {} ({files})",
            plural(self.errors, "error"),
            plural(self.warnings, "warning")
        )
    }
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// `check` with explicit output streams (used by tests); returns the exit status.
pub fn check_to(args: &CheckArgs, out: &mut dyn Write, err: &mut dyn Write, color: bool) -> u8 {
    let summary = run_check(args, out, err, color);
    if args.message_format == MessageFormat::Human {
        let _ = writeln!(err, "{}", summary.line());
    }
    let _ = out.flush();
    let _ = err.flush();
    summary.exit_code()
}

fn run_check(
    args: &CheckArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
    color: bool,
) -> CheckSummary {
    let mut db = Database::new();
    db.set_arch(args.arch);
    let mut summary = CheckSummary::default();
    for path in &args.files {
        let shown = path.display().to_string();
        let file = match db.load_file(path) {
            Ok(file) => file,
            Err(e) => {
                summary.files_unreadable += 1;
                let _ = writeln!(err, "error: cannot read `{shown}`: {}", io_message(&e));
                continue;
            }
        };
        summary.files_checked += 1;
        let text = file.text(&db);
        let diags = db.diagnostics(file);
        for d in diags {
            match d.severity {
                Severity::Error => summary.errors += 1,
                Severity::Warning => summary.warnings += 1,
            }
        }
        match args.message_format {
            MessageFormat::Human => {
                let _ =
                    err.write_all(render::render_human_all(&shown, text, diags, color).as_bytes());
            }
            MessageFormat::Json => {
                let index = LineIndex::new(text);
                for d in diags {
                    let _ = writeln!(out, "{}", render::render_json(&shown, &index, d));
                }
            }
        }
    }
    summary
}

/// An I/O error's message without the `(os error N)` suffix.
fn io_message(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(files: &[&str], format: MessageFormat) -> CheckArgs {
        CheckArgs {
            arch: Arch::default(),
            message_format: format,
            files: files.iter().map(PathBuf::from).collect(),
        }
    }

    #[test]
    fn missing_file_is_exit_2_with_a_clear_message() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = check_to(
            &args(&["/no/such/x.tsr"], MessageFormat::Human),
            &mut out,
            &mut err,
            false,
        );
        assert_eq!(code, EXIT_USAGE);
        let err = String::from_utf8(err).unwrap();
        assert!(
            err.starts_with("error: cannot read `/no/such/x.tsr`: No such file or directory\n"),
            "{err}"
        );
        assert!(
            err.ends_with("error: 0 errors, 0 warnings (0 files checked, 1 unreadable)\n"),
            "{err}"
        );
        assert!(out.is_empty());
    }

    #[test]
    fn json_mode_prints_no_summary() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = check_to(
            &args(&["/no/such/x.tsr"], MessageFormat::Json),
            &mut out,
            &mut err,
            false,
        );
        assert_eq!(code, EXIT_USAGE);
        assert!(out.is_empty());
        assert_eq!(
            String::from_utf8(err).unwrap(),
            "error: cannot read `/no/such/x.tsr`: No such file or directory\n"
        );
    }

    #[test]
    fn summary_lines() {
        let s = CheckSummary {
            files_checked: 2,
            files_unreadable: 0,
            errors: 3,
            warnings: 1,
        };
        assert_eq!(s.line(), "error: 3 errors, 1 warning (2 files checked)");
        assert_eq!(s.exit_code(), EXIT_ERRORS);
        let s = CheckSummary {
            files_checked: 1,
            warnings: 2,
            ..Default::default()
        };
        assert_eq!(s.line(), "ok: 0 errors, 2 warnings (1 file checked)");
        assert_eq!(s.exit_code(), EXIT_OK);
    }
}
