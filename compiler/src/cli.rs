//! Command implementations shared by the `tsrc` and `tessera` binaries, so that
//! `tsrc check` and `tessera check` are one piece of code.
//!
//! Exit codes: 0 when no file has an error (warnings allowed), 1 when any file
//! has an error, 2 on a usage error (clap) or when a file cannot be read.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use crate::db::Database;
use crate::diag::render::{self, LineIndex};
use crate::diag::Severity;
use crate::target::Arch;

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
    /// The `.tsr` files to check (`-`: standard input, shown as `<stdin>`).
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
/// The compiler commands shared by `tsrc` and `tessera` (which adds its own later).
#[derive(Clone, Debug, clap::Subcommand)]
pub enum CompilerCommand {
    /// Check .tsr files: syntax, names, types, shapes and target limits.
    Check(CheckArgs),
    /// Print an IR level, PTX (NVIDIA) or HIP (AMD) for a .tsr file (after checking it).
    Emit(EmitArgs),
    /// Per kernel: threads, registers, shared memory and occupancy on a target.
    Report(ReportArgs),
}

impl CompilerCommand {
    /// Runs the command; the result is the process exit status.
    pub fn run(&self) -> u8 {
        match self {
            CompilerCommand::Check(args) => check(args),
            CompilerCommand::Emit(args) => emit(args),
            CompilerCommand::Report(args) => report(args),
        }
    }
}

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
        let shown = shown_path(path);
        let file = match load_source(&mut db, path) {
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
                Severity::Note => {}
            }
        }
        match args.message_format {
            MessageFormat::Human => {
                let rendered =
                    render::render_human_capped(&shown, text, diags, color, render::MAX_SHOWN);
                let _ = err.write_all(rendered.as_bytes());
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

/// How a file argument is shown in messages: `-` (standard input) as `<stdin>`.
pub fn shown_path(path: &std::path::Path) -> String {
    if path.as_os_str() == "-" {
        STDIN_NAME.to_string()
    } else {
        path.display().to_string()
    }
}

/// The name standard input has in diagnostics.
pub const STDIN_NAME: &str = "<stdin>";

/// The text of a file argument: `-` reads standard input to its end.
pub fn read_source(path: &std::path::Path) -> std::io::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut text)?;
        Ok(text)
    } else {
        std::fs::read_to_string(path)
    }
}

/// Loads a file argument into `db` (`-`: standard input, as `<stdin>`).
fn load_source(
    db: &mut Database,
    path: &std::path::Path,
) -> std::io::Result<crate::db::SourceFile> {
    if path.as_os_str() == "-" {
        let text = read_source(path)?;
        Ok(db.set_source(STDIN_NAME, text))
    } else {
        db.load_file(path)
    }
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

// ---- `emit` ----

/// What `emit` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EmitKind {
    /// Whole-tensor functions as a dataflow graph.
    GraphIr,
    /// Launch plans of whole-tensor functions.
    ScheduleIr,
    /// Each kernel specialised: tiles with concrete shapes, SSA control flow.
    TileIr,
    /// Each kernel for one target architecture.
    TargetIr,
    /// PTX assembly for NVIDIA targets.
    Ptx,
    /// HIP C++ for AMD targets (one self-contained translation unit).
    Hip,
}

impl EmitKind {
    pub fn flag(self) -> &'static str {
        match self {
            EmitKind::GraphIr => "graph-ir",
            EmitKind::ScheduleIr => "schedule-ir",
            EmitKind::TileIr => "tile-ir",
            EmitKind::TargetIr => "target-ir",
            EmitKind::Ptx => "ptx",
            EmitKind::Hip => "hip",
        }
    }
}

fn parse_define(s: &str) -> Result<Define, String> {
    crate::ir::tile::Specialization::parse_define_arg(s)
}

pub use crate::ir::tile::Define;

/// `emit FILE --emit KIND [--arch ARCH] [--kernel NAME] [-D NAME=VALUE]... [-o OUT]`
#[derive(Clone, Debug, clap::Args)]
pub struct EmitArgs {
    /// The `.tsr` file (`-`: standard input, shown as `<stdin>`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// What to print: graph-ir, schedule-ir, tile-ir, target-ir or ptx.
    #[arg(long, value_enum)]
    pub emit: EmitKind,
    /// Target architecture: sm_70 sm_75 sm_80 sm_86 sm_89 sm_90 sm_90a gfx90a gfx942 gfx1100.
    #[arg(long, default_value = "sm_90", value_parser = clap::value_parser!(Arch))]
    pub arch: Arch,
    /// Only this kernel (default: every kernel of the file, in source order).
    #[arg(long, value_name = "NAME")]
    pub kernel: Option<String>,
    /// Fixes a const parameter or specialises a tensor dim: `-D D=128`, `-D causal=True`;
    /// or assumes a run-time dim (or integer scalar) is a multiple of a power of two:
    /// `-D K%8` (checked at kernel entry; used for vector loads and cp.async).
    #[arg(short = 'D', value_name = "NAME=VALUE|NAME%DIVISOR", value_parser = parse_define)]
    pub define: Vec<Define>,
    /// Write to this file instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: Option<PathBuf>,
}

/// `emit` writing to the process's stdout and stderr; returns the exit status.
pub fn emit(args: &EmitArgs) -> u8 {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let color = stderr_wants_color();
    emit_to(args, &mut stdout.lock(), &mut stderr.lock(), color)
}

/// What the arm of one `--emit` kind works on: a file that checked without errors.
pub struct EmitContext<'a> {
    pub db: &'a Database,
    pub file: crate::db::SourceFile,
    /// The selected kernels (`--kernel`, or all) in source order: name, item, offset.
    pub kernels: Vec<(String, crate::db::ItemSource<'a>, u32)>,
    pub spec: crate::ir::tile::Specialization,
    pub arch: Arch,
    /// graph-ir and schedule-ir: the function `--kernel` names (default: all).
    pub function: Option<String>,
}

/// Why an `--emit` arm produced no text.
pub enum EmitError {
    /// Diagnostics with absolute spans (exit 1).
    Diagnostics(Vec<crate::diag::Diagnostic>),
    /// A usage error or an unavailable kind (exit 2).
    Usage(String),
}

/// `emit` with explicit output streams (used by tests); returns the exit status.
pub fn emit_to(args: &EmitArgs, out: &mut dyn Write, err: &mut dyn Write, color: bool) -> u8 {
    let code = run_emit(args, out, err, color);
    let _ = out.flush();
    let _ = err.flush();
    code
}

/// Loads `path` and checks it for `arch`, as `emit` and `report` do first: the
/// diagnostics go to `err` (warnings included); an unreadable file is a usage
/// error, and check errors stop the command with `outcome` ("nothing emitted").
fn load_and_check(
    db: &mut Database,
    arch: Arch,
    path: &std::path::Path,
    err: &mut dyn Write,
    color: bool,
    outcome: &str,
) -> Result<crate::db::SourceFile, u8> {
    db.set_arch(arch);
    let shown = shown_path(path);
    let file = load_source(db, path).map_err(|e| {
        let _ = writeln!(err, "error: cannot read `{shown}`: {}", io_message(&e));
        EXIT_USAGE
    })?;
    let diags = db.diagnostics(file);
    if !diags.is_empty() {
        let text = file.text(db);
        let _ = err.write_all(
            render::render_human_capped(&shown, text, diags, color, render::MAX_SHOWN).as_bytes(),
        );
    }
    let errors = diags.iter().filter(|d| d.is_error()).count();
    if errors > 0 {
        let _ = writeln!(
            err,
            "error: {} in `{shown}`; {outcome}",
            plural(errors, "error")
        );
        return Err(EXIT_ERRORS);
    }
    Ok(file)
}

fn run_emit(args: &EmitArgs, out: &mut dyn Write, err: &mut dyn Write, color: bool) -> u8 {
    let mut db = Database::new();
    let shown = shown_path(&args.file);
    let file = match load_and_check(
        &mut db,
        args.arch,
        &args.file,
        err,
        color,
        "nothing emitted",
    ) {
        Ok(file) => file,
        Err(code) => return code,
    };
    let db = &db;
    let text = file.text(db);
    let mut kernels = crate::db::file_kernels(db, file);
    // For graph-ir and schedule-ir, `--kernel` names a whole-tensor function
    // (their arm selects it).
    let whole_tensor = matches!(args.emit, EmitKind::GraphIr | EmitKind::ScheduleIr);
    if let Some(name) = args.kernel.as_ref().filter(|_| !whole_tensor) {
        let names: Vec<String> = kernels.iter().map(|k| k.0.clone()).collect();
        kernels.retain(|k| &k.0 == name);
        if kernels.is_empty() {
            let known = if names.is_empty() {
                "it has no kernels".to_string()
            } else {
                format!("its kernels: {}", names.join(", "))
            };
            let _ = writeln!(err, "error: no kernel `{name}` in `{shown}` ({known})");
            return EXIT_USAGE;
        }
    }
    let spec = if matches!(args.emit, EmitKind::GraphIr | EmitKind::ScheduleIr) {
        let mut spec = crate::ir::tile::Specialization::new();
        for d in &args.define {
            spec.add(d);
        }
        spec
    } else {
        match specialization(db, &kernels, &args.define) {
            Ok(spec) => spec,
            Err(message) => {
                let _ = writeln!(err, "error: {message}");
                return EXIT_USAGE;
            }
        }
    };
    if kernels.is_empty() && !whole_tensor {
        // An empty module is the right output, but say why it is empty.
        let _ = writeln!(
            err,
            "note: `{shown}` has no `@kernel` functions, so `--emit {}` prints no kernel; a \
             whole-tensor function's kernels are generated for the shapes it is called with \
             (`--emit schedule-ir` shows them)",
            args.emit.flag()
        );
    }
    let cx = EmitContext {
        db,
        file,
        kernels,
        spec,
        arch: args.arch,
        function: args.kernel.clone().filter(|_| whole_tensor),
    };
    let result = emit_with(&cx, args.emit);
    match result {
        Ok(output) => match &args.output {
            Some(path) => match std::fs::write(path, output) {
                Ok(()) => EXIT_OK,
                Err(e) => {
                    let _ = writeln!(
                        err,
                        "error: cannot write `{}`: {}",
                        path.display(),
                        io_message(&e)
                    );
                    EXIT_USAGE
                }
            },
            None => {
                let _ = out.write_all(output.as_bytes());
                EXIT_OK
            }
        },
        Err(EmitError::Diagnostics(diags)) => {
            let _ = err.write_all(
                render::render_human_capped(&shown, text, &diags, color, render::MAX_SHOWN)
                    .as_bytes(),
            );
            let _ = writeln!(
                err,
                "error: {} in `{shown}`; nothing emitted",
                plural(diags.iter().filter(|d| d.is_error()).count(), "error")
            );
            EXIT_ERRORS
        }
        Err(EmitError::Usage(message)) => {
            let _ = writeln!(err, "error: {message}");
            EXIT_USAGE
        }
    }
}

/// The specialization of `-D` arguments for `kernels`, each checked to name
/// something of one of them: a const parameter, a tensor dim, `num_warps` or
/// `num_stages` (a divisor may also name an integer scalar parameter). Every
/// front end that takes `-D` (`emit`, `report`, the REPL's `:emit` and
/// `:resources`, the language server's `tessera/emit`) goes through this, so
/// one name is accepted or rejected the same way everywhere.
pub fn specialization<'db>(
    db: &'db dyn crate::db::Db,
    kernels: &[(String, crate::db::ItemSource<'db>, u32)],
    defines: &[Define],
) -> Result<crate::ir::tile::Specialization, String> {
    specialization_among(db, kernels, defines, "no emitted kernel")
}

/// [`specialization`], where `among` names the kernels in the message when
/// there are several (`no kernel in the workspace` for the editor's setting).
pub fn specialization_among<'db>(
    db: &'db dyn crate::db::Db,
    kernels: &[(String, crate::db::ItemSource<'db>, u32)],
    defines: &[Define],
    among: &str,
) -> Result<crate::ir::tile::Specialization, String> {
    let mut known: std::collections::BTreeSet<String> =
        ["num_warps", "num_stages"].map(String::from).into();
    let mut int_scalars = std::collections::BTreeSet::new();
    for (_, item, _) in kernels {
        if let Some(sig) = crate::db::item_signature(db, *item) {
            for p in &sig.params {
                if p.is_const {
                    known.insert(p.name.clone());
                }
                match &p.ty {
                    crate::check::Ty::Tensor { dims, .. } => {
                        for d in dims {
                            known.extend(d.symbols().into_iter().map(String::from));
                        }
                    }
                    crate::check::Ty::Scalar { dtype, .. } if dtype.is_int() && !p.is_const => {
                        int_scalars.insert(p.name.clone());
                    }
                    _ => {}
                }
            }
        }
    }
    let mut spec = crate::ir::tile::Specialization::new();
    for d in defines {
        let name = d.name();
        let divisor = matches!(d, Define::Divisor(..));
        if !(known.contains(name) || (divisor && int_scalars.contains(name))) {
            let what = if divisor {
                "tensor dim or integer scalar parameter"
            } else {
                "const parameter or tensor dim"
            };
            let mut names: Vec<&str> = known.iter().map(String::as_str).collect();
            if divisor {
                names.extend(int_scalars.iter().map(String::as_str));
                names.sort_unstable();
            }
            let kernel = match kernels {
                [(k, _, _)] => format!("kernel `{k}` has no"),
                _ => format!("{among} has a"),
            };
            return Err(format!(
                "`-D {name}`: {kernel} {what} named `{name}` (it may set: {})",
                names.join(", ")
            ));
        }
        spec.add(d);
    }
    Ok(spec)
}

/// The text of one `--emit` kind for a checked file (shared with the REPL's `:emit`).
pub fn emit_with(cx: &EmitContext, kind: EmitKind) -> Result<String, EmitError> {
    match kind {
        EmitKind::TileIr => emit_tile_ir(cx),
        EmitKind::GraphIr => emit_whole_tensor(cx, false),
        EmitKind::ScheduleIr => emit_whole_tensor(cx, true),
        EmitKind::TargetIr => emit_target_ir(cx),
        EmitKind::Ptx => emit_ptx(cx),
        EmitKind::Hip => emit_hip(cx),
    }
}

/// The Graph IR (or the Schedule IR, with its generated kernels) of the
/// whole-tensor functions of the file in source order, separated by blank lines;
/// what the lowering does not handle yet is an E0512 diagnostic.
fn emit_whole_tensor(cx: &EmitContext, schedule: bool) -> Result<String, EmitError> {
    let mut functions = crate::db::file_functions(cx.db, cx.file);
    if let Some(name) = &cx.function {
        let names: Vec<String> = functions.iter().map(|f| f.0.clone()).collect();
        functions.retain(|f| &f.0 == name);
        if functions.is_empty() {
            if let Some((item, _)) = crate::db::function_item(cx.db, cx.file, name) {
                if let Some(crate::syntax::ast::Item::Function(f)) =
                    crate::db::parse_item(cx.db, item).item.as_deref()
                {
                    if crate::check::generics::generic_sig(f).is_some() {
                        return Err(EmitError::Usage(format!(
                            "`{name}` is generic (dtype variables or a batch run): it has no IR of its own and is lowered into each caller, for the call's dtypes and ranks"
                        )));
                    }
                }
            }
            let known = if names.is_empty() {
                "it has no whole-tensor functions".to_string()
            } else {
                format!("its whole-tensor functions: {}", names.join(", "))
            };
            return Err(EmitError::Usage(format!(
                "no whole-tensor function `{name}` in this file ({known})"
            )));
        }
    }
    let mut text = String::new();
    let mut diags = Vec::new();
    for (_, item, offset) in functions {
        let dumped = if schedule {
            crate::db::schedule_ir(cx.db, item, cx.db.options())
                .as_ref()
                .map(|s| crate::ir::schedule::dump(s))
        } else {
            crate::db::graph_ir(cx.db, item, cx.db.options())
                .as_ref()
                .map(|g| crate::ir::graph::dump(g))
        };
        match dumped {
            Ok(t) => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&t);
            }
            Err(e) => diags.push(e.clone().shifted(offset).diagnostic()),
        }
    }
    if diags.is_empty() {
        Ok(text)
    } else {
        Err(EmitError::Diagnostics(diags))
    }
}

/// The Tile IR of the selected kernels, separated by blank lines.
fn emit_tile_ir(cx: &EmitContext) -> Result<String, EmitError> {
    emit_each_kernel(cx, |item| {
        crate::db::tile_ir(cx.db, item, cx.db.options(), cx.spec.clone())
            .as_ref()
            .map(|k| k.dump())
            .map_err(Clone::clone)
    })
}

/// The Target IR of the selected kernels for `--arch`, separated by blank lines.
fn emit_target_ir(cx: &EmitContext) -> Result<String, EmitError> {
    emit_each_kernel(cx, |item| {
        crate::db::target_ir(cx.db, item, cx.db.options(), cx.spec.clone())
            .as_ref()
            .map(|k| k.to_string())
            .map_err(Clone::clone)
    })
}

/// Each selected kernel's text, separated by blank lines, or every kernel's
/// diagnostics (made absolute) when any fails.
fn emit_each_kernel<'db>(
    cx: &EmitContext<'db>,
    text_of: impl Fn(crate::db::ItemSource<'db>) -> Result<String, Vec<crate::diag::Diagnostic>>,
) -> Result<String, EmitError> {
    let mut text = String::new();
    let mut diags = Vec::new();
    for (_, item, offset) in &cx.kernels {
        match text_of(*item) {
            Ok(t) => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&t);
            }
            Err(d) => diags.extend(d.into_iter().map(|d| d.shifted(*offset))),
        }
    }
    if diags.is_empty() {
        Ok(text)
    } else {
        Err(EmitError::Diagnostics(diags))
    }
}

/// One PTX module with the selected kernels for `--arch`.
fn emit_ptx(cx: &EmitContext) -> Result<String, EmitError> {
    if !cx.arch.is_nvidia() {
        return Err(EmitError::Usage(format!(
            "PTX needs an NVIDIA target (sm_70 ... sm_90a), not {} (its output is HIP)",
            cx.arch
        )));
    }
    crate::db::ptx_module(cx.db, &cx.kernels, cx.db.options(), &cx.spec)
        .map_err(EmitError::Diagnostics)
}

/// One HIP translation unit with the selected kernels for `--arch`.
fn emit_hip(cx: &EmitContext) -> Result<String, EmitError> {
    if cx.arch.is_nvidia() {
        return Err(EmitError::Usage(format!(
            "HIP needs an AMD target (gfx90a, gfx942, gfx1100), not {} (its output is PTX)",
            cx.arch
        )));
    }
    crate::db::hip_module(cx.db, &cx.kernels, cx.db.options(), &cx.spec)
        .map_err(EmitError::Diagnostics)
}

#[cfg(test)]
mod emit_tests {
    use super::*;

    const KERNELS: &str = "@kernel(grid=(cdiv(N, BLOCK),))\ndef scale(x: Tensor[\"N\", f32], BLOCK: const = 256):\n    i = program_id(0) * BLOCK\n    store(x[i : i + BLOCK], load(x[i : i + BLOCK]) * 2.0)\n\n@kernel(grid=(S,))\ndef rows(x: Tensor[\"S\", \"D\", f32]):\n    r = program_id(0)\n    store(x[r, :], load(x[r, :]) + 1.0)\n";

    fn write(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tsrc-emit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn args(file: PathBuf, emit: EmitKind) -> EmitArgs {
        EmitArgs {
            file,
            emit,
            arch: Arch::default(),
            kernel: None,
            define: Vec::new(),
            output: None,
        }
    }

    fn run(a: &EmitArgs) -> (u8, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = emit_to(a, &mut out, &mut err, false);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn tile_ir_of_every_kernel_in_source_order() {
        let mut a = args(write("k1.tsr", KERNELS), EmitKind::TileIr);
        a.define = vec![
            Define::Value("D".into(), 64),
            Define::Value("BLOCK".into(), 128),
        ];
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_OK, "{err}");
        let scale = out.find("kernel @scale(").expect("scale");
        let rows = out.find("kernel @rows(").expect("rows");
        assert!(scale < rows, "{out}");
        assert!(out.contains("specialization {BLOCK = 128}"), "{out}");
        assert!(out.contains("%x: tensor<S x 64 x f32>"), "{out}");
        assert!(err.is_empty(), "{err}");
    }

    #[test]
    fn kernel_filter_and_output_file() {
        let mut a = args(write("k2.tsr", KERNELS), EmitKind::TileIr);
        a.kernel = Some("scale".into());
        let out_path = write("k2.tile", "");
        a.output = Some(out_path.clone());
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_OK, "{err}");
        assert!(out.is_empty());
        let written = std::fs::read_to_string(&out_path).unwrap();
        assert!(written.starts_with("kernel @scale("), "{written}");
        assert!(!written.contains("@rows"), "{written}");
        a.kernel = Some("nope".into());
        let (code, _, err) = run(&a);
        assert_eq!(code, EXIT_USAGE);
        assert!(
            err.contains("no kernel `nope`") && err.contains("scale, rows"),
            "{err}"
        );
    }

    #[test]
    fn a_file_without_kernels_emits_an_empty_module_and_says_why() {
        let src = "def f(x: Tensor[4, 8, f32]) -> Tensor[4, 8, f32]:\n    return softmax(x)\n";
        let a = args(write("k0.tsr", src), EmitKind::Ptx);
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_OK, "{err}");
        assert!(out.contains(".target") && !out.contains(".entry"), "{out}");
        assert!(
            err.starts_with("note: ") && err.contains("so `--emit ptx` prints no kernel"),
            "{err}"
        );
        assert!(err.contains("--emit schedule-ir"), "{err}");
    }

    #[test]
    fn missing_specialisation_is_e0511_exit_1() {
        let a = args(write("k3.tsr", KERNELS), EmitKind::TileIr);
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_ERRORS);
        assert!(out.is_empty());
        assert!(err.contains("error[E0511]") && err.contains("`D`"), "{err}");
    }

    #[test]
    fn check_errors_stop_emission() {
        let a = args(
            write(
                "k4.tsr",
                "@kernel(grid=(1,))\ndef k(x: Tensor[\"N\", f32]):\n    store(x[0 : 4], y)\n",
            ),
            EmitKind::TileIr,
        );
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_ERRORS);
        assert!(out.is_empty());
        assert!(
            err.contains("error[E0201]") && err.contains("nothing emitted"),
            "{err}"
        );
    }

    #[test]
    fn usage_errors_exit_2() {
        let mut a = args(write("k5.tsr", KERNELS), EmitKind::ScheduleIr);
        a.kernel = Some("nope".into());
        let (code, _, err) = run(&a);
        assert_eq!(code, EXIT_USAGE);
        assert_eq!(
            err,
            "error: no whole-tensor function `nope` in this file (it has no whole-tensor functions)\n"
        );
        let mut a = args(write("k6.tsr", KERNELS), EmitKind::TileIr);
        a.define = vec![Define::Value("Q".into(), 1)];
        let (code, _, err) = run(&a);
        assert_eq!(code, EXIT_USAGE);
        assert!(err.contains("`-D Q`"), "{err}");
        let a = args(PathBuf::from("/no/such/file.tsr"), EmitKind::TileIr);
        assert_eq!(run(&a).0, EXIT_USAGE);
    }

    #[test]
    fn define_values_and_divisors_parse() {
        assert_eq!(parse_define("K=64"), Ok(Define::Value("K".into(), 64)));
        assert_eq!(parse_define("K%8"), Ok(Define::Divisor("K".into(), 8)));
        assert_eq!(
            parse_define(" N % 16 "),
            Ok(Define::Divisor("N".into(), 16))
        );
        for bad in ["K%0", "K%1", "K%3", "K%12", "K%-8", "K%2147483648"] {
            let e = parse_define(bad).unwrap_err();
            assert!(e.contains("power of two"), "{bad}: {e}");
        }
        let e = parse_define("K%x").unwrap_err();
        assert!(e.contains("not an integer divisor"), "{e}");
        assert!(parse_define("2K%8").unwrap_err().contains("not a name"));
        assert!(parse_define("K").unwrap_err().contains("NAME%DIVISOR"));
        let mut spec = crate::ir::tile::Specialization::new();
        spec.add(&parse_define("K%8").unwrap());
        spec.add(&parse_define("K%16").unwrap());
        assert_eq!(spec.divisors.get("K"), Some(&16), "the last one wins");
    }

    const GEMM: &str = "@kernel(grid=(cdiv(M, 64), cdiv(N, 64)), num_warps=4, num_stages=2)\ndef mm(A: Tensor[\"M\", \"K\", f16], B: Tensor[\"K\", \"N\", f16], C: Tensor[\"M\", \"N\", f32], s: i32, f: f32):\n    m0 = program_id(0) * 64\n    n0 = program_id(1) * 64\n    acc = zeros([64, 64], f32)\n    for k in range(0, K, 32):\n        acc = dot(load(A[m0 : m0 + 64, k : k + 32]), load(B[k : k + 32, n0 : n0 + 64]), acc)\n    store(C[m0 : m0 + 64, n0 : n0 + 64], acc)\n";

    #[test]
    fn divisors_show_in_every_dump() {
        let div = |n: &str, k: u64| Define::Divisor(n.into(), k);
        let mut a = args(write("d1.tsr", GEMM), EmitKind::TileIr);
        a.define = vec![div("K", 8), div("N", 8), div("s", 4)];
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_OK, "{err}");
        assert!(
            out.contains("specialization {} assume {K % 8 == 0, N % 8 == 0, s % 4 == 0}"),
            "{out}"
        );
        a.emit = EmitKind::TargetIr;
        a.arch = Arch::Sm80;
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_OK, "{err}");
        assert!(
            out.contains("// assume K % 8 == 0 (-D K%8); trap otherwise"),
            "{out}"
        );
        assert!(
            out.contains("// assume s % 4 == 0 (-D s%4); trap otherwise"),
            "{out}"
        );
        assert!(
            out.contains("trap if") && out.contains("copy_async.16"),
            "{out}"
        );
        a.emit = EmitKind::Ptx;
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_OK, "{err}");
        assert!(out.contains("cp.async.cg.shared.global"), "{out}");
        assert_eq!(out.matches(" trap;").count(), 3, "{out}");
        // Without divisors: no assumptions anywhere.
        a.define.clear();
        let (_, out, _) = run(&a);
        assert!(!out.contains("cp.async") && !out.contains("trap"), "{out}");
        a.emit = EmitKind::TileIr;
        let (_, out, _) = run(&a);
        assert!(!out.contains("assume"), "{out}");
    }

    #[test]
    fn hip_for_amd_arches_and_ptx_for_nvidia_ones() {
        let mut a = args(write("h1.tsr", GEMM), EmitKind::Hip);
        a.arch = Arch::Gfx942;
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_OK, "{err}");
        // 4 waves of 64 lanes.
        assert!(
            out.contains(
                "__launch_bounds__(256) void mm(void *A, void *B, void *C, int s, float f"
            ),
            "{out}"
        );
        assert!(out.contains("for gfx942 (64-lane waves)"), "{out}");
        a.arch = Arch::Gfx1100;
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_OK, "{err}");
        assert!(out.contains("__launch_bounds__(128) void mm("), "{out}");
        a.arch = Arch::Sm90;
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_USAGE);
        assert!(out.is_empty());
        assert!(err.contains("HIP needs an AMD target"), "{err}");
        a.emit = EmitKind::Ptx;
        a.arch = Arch::Gfx90a;
        let (code, _, err) = run(&a);
        assert_eq!(code, EXIT_USAGE);
        assert!(err.contains("its output is HIP"), "{err}");
    }

    #[test]
    fn divisor_usage_errors() {
        let div = |n: &str, k: u64| Define::Divisor(n.into(), k);
        // A float scalar cannot have a divisor; an int scalar can (above).
        let mut a = args(write("d2.tsr", GEMM), EmitKind::TileIr);
        a.define = vec![div("f", 8)];
        let (code, _, err) = run(&a);
        assert_eq!(code, EXIT_USAGE);
        assert!(
            err.contains("no tensor dim or integer scalar parameter named `f`"),
            "{err}"
        );
        // A fixed dim that contradicts its divisor: E0513, once per name.
        a.define = vec![Define::Value("K".into(), 60), div("K", 8)];
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_ERRORS);
        assert!(out.is_empty());
        assert_eq!(err.matches("error[E0513]").count(), 1, "{err}");
        assert!(err.contains("`K` is 60 in kernel `mm`"), "{err}");
        // One that agrees is fine (and the dim is simply fixed).
        a.define = vec![Define::Value("K".into(), 64), div("K", 8)];
        let (code, out, err) = run(&a);
        assert_eq!(code, EXIT_OK, "{err}");
        assert!(!out.contains("assume"), "{out}");
    }
}

// ---- `report` (resources) ----

/// How `report` prints its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// An aligned table, one row per kernel.
    Table,
    /// A JSON array of objects: kernel, arch, threads, regs, smem_bytes,
    /// occupancy (0-1), blocks_per_sm, limiter.
    Json,
}

/// `report FILE [--arch ARCH] [--format table|json] [--kernel NAME] [-D NAME=VALUE]...`
#[derive(Clone, Debug, clap::Args)]
pub struct ReportArgs {
    /// The `.tsr` file (`-`: standard input, shown as `<stdin>`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Target architecture: sm_70 sm_75 sm_80 sm_86 sm_89 sm_90 sm_90a gfx90a gfx942 gfx1100.
    #[arg(long, default_value = "sm_90", value_parser = clap::value_parser!(Arch))]
    pub arch: Arch,
    /// How to print the rows.
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    pub format: ReportFormat,
    /// Only this kernel (default: every kernel of the file, in source order).
    #[arg(long, value_name = "NAME")]
    pub kernel: Option<String>,
    /// Fixes a const parameter or specialises a tensor dim: `-D D=128`; or assumes
    /// a divisor of a run-time dim or integer scalar: `-D K%8`.
    #[arg(short = 'D', value_name = "NAME=VALUE|NAME%DIVISOR", value_parser = parse_define)]
    pub define: Vec<Define>,
}

/// `report` writing to the process's stdout and stderr; returns the exit status.
pub fn report(args: &ReportArgs) -> u8 {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let color = stderr_wants_color();
    report_to(args, &mut stdout.lock(), &mut stderr.lock(), color)
}

/// `report` with explicit output streams: the resources of every kernel that
/// compiles on stdout; diagnostics (W0003, W0004, and errors that stop a kernel)
/// on stderr. Exit 1 when any kernel has an error (the others are still printed).
pub fn report_to(args: &ReportArgs, out: &mut dyn Write, err: &mut dyn Write, color: bool) -> u8 {
    let mut db = Database::new();
    let shown = shown_path(&args.file);
    let file = match load_and_check(&mut db, args.arch, &args.file, err, color, "no report") {
        Ok(file) => file,
        Err(code) => return code,
    };
    let db = &db;
    let text = file.text(db);
    let mut kernels = crate::db::file_kernels(db, file);
    if let Some(name) = &args.kernel {
        let names: Vec<String> = kernels.iter().map(|k| k.0.clone()).collect();
        kernels.retain(|k| &k.0 == name);
        if kernels.is_empty() {
            let _ = writeln!(
                err,
                "error: no kernel `{name}` in `{shown}` (its kernels: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            );
            return EXIT_USAGE;
        }
    }
    let spec = match specialization(db, &kernels, &args.define) {
        Ok(spec) => spec,
        Err(message) => {
            let _ = writeln!(err, "error: {message}");
            return EXIT_USAGE;
        }
    };
    let mut rows = Vec::new();
    let mut diags = Vec::new();
    for (_, item, offset) in &kernels {
        match crate::db::kernel_resources(db, *item, *offset, db.options(), &spec) {
            Ok((r, d)) => {
                rows.push(r);
                diags.extend(d);
            }
            Err(d) => diags.extend(d),
        }
    }
    let text_out = match args.format {
        ReportFormat::Table => crate::backend::resources::render_table(&rows),
        ReportFormat::Json => crate::backend::resources::render_json(&rows) + "\n",
    };
    let _ = out.write_all(text_out.as_bytes());
    if !diags.is_empty() {
        let _ = err.write_all(
            render::render_human_capped(&shown, text, &diags, color, render::MAX_SHOWN).as_bytes(),
        );
    }
    let _ = out.flush();
    let _ = err.flush();
    if diags.iter().any(|d| d.is_error()) {
        EXIT_ERRORS
    } else {
        EXIT_OK
    }
}

#[cfg(test)]
mod report_tests {
    use super::*;

    fn run(text: &str, extra: impl FnOnce(&mut ReportArgs)) -> (u8, String, String) {
        let dir = std::env::temp_dir().join(format!("tessera-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("k{}.tsr", text.len()));
        std::fs::write(&path, text).unwrap();
        let mut args = ReportArgs {
            file: path,
            arch: Arch::Sm80,
            format: ReportFormat::Json,
            kernel: None,
            define: Vec::new(),
        };
        extra(&mut args);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = report_to(&args, &mut out, &mut err, false);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    const TWO: &str = "@kernel(grid=(cdiv(N, BLOCK),), num_warps=4)\ndef scale(x: Tensor[\"N\", f32], BLOCK: const = 128):\n    i = program_id(0) * BLOCK\n    store(x[i : i + BLOCK], load(x[i : i + BLOCK]) * 2.0)\n\n@kernel(grid=(1,), num_warps=1)\ndef wide(x: Tensor[64, 80, f32], out: Tensor[64, 80, f32]):\n    a = load(x[0 : 64, 0 : 80])\n    store(out[0 : 64, 0 : 80], a - max(a, axis=1, keepdims=True))\n";

    #[test]
    fn json_rows_and_warnings() {
        let (code, out, err) = run(TWO, |_| {});
        assert_eq!(code, EXIT_OK, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let rows = v.as_array().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["kernel"], "scale");
        assert_eq!(rows[0]["arch"], "sm_80");
        assert_eq!(rows[0]["threads"], 128);
        assert_eq!(rows[1]["threads"], 32);
        for r in rows {
            for key in [
                "regs",
                "smem_bytes",
                "occupancy",
                "blocks_per_sm",
                "limiter",
            ] {
                assert!(r.get(key).is_some(), "{key} missing in {r}");
            }
        }
        // The one-warp kernel holding 160 values per thread is register-bound.
        assert_eq!(rows[1]["limiter"], "registers");
        assert!(rows[1]["occupancy"].as_f64().unwrap() < 0.25);
        assert!(err.contains("W0004") && err.contains("wide"), "{err}");
        assert!(!err.contains("`scale`"), "{err}");
    }

    #[test]
    fn table_kernel_filter_and_errors() {
        let (code, out, _) = run(TWO, |a| {
            a.format = ReportFormat::Table;
            a.kernel = Some("scale".into());
        });
        assert_eq!(code, EXIT_OK);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(cells[..3], ["scale", "sm_80", "128"], "{out}");
        assert_eq!(cells[5..], ["100.0%", "16", "warps"], "{out}");
        let (code, _, err) = run(TWO, |a| a.kernel = Some("nope".into()));
        assert_eq!(code, EXIT_USAGE);
        assert!(err.contains("scale, wide"), "{err}");
        // A check error: no report.
        let (code, out, err) = run(
            "def f(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return y\n",
            |_| {},
        );
        assert_eq!(code, EXIT_ERRORS);
        assert!(out.is_empty() && err.contains("E0201"), "{err}");
    }

    #[test]
    fn unknown_defines_are_usage_errors_as_in_emit() {
        let (code, out, err) = run(TWO, |a| {
            a.define = vec![Define::Value("NOPE".into(), 1)];
        });
        assert_eq!(code, EXIT_USAGE);
        assert!(out.is_empty(), "{out}");
        assert!(
            err.contains(
                "`-D NOPE`: no emitted kernel has a const parameter or tensor dim named `NOPE`"
            ),
            "{err}"
        );
        // A name of one kernel is accepted, as `emit` accepts it.
        let (code, _, err) = run(TWO, |a| {
            a.define = vec![Define::Value("num_warps".into(), 4)];
        });
        assert_eq!(code, EXIT_OK, "{err}");
    }
}
