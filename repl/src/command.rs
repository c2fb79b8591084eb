//! The session commands: `:help`, `:load FILE`, `:reload`, `:type EXPR`,
//! `:emit KIND NAME [ARCH]`, `:resources NAME [ARCH]`, `:time EXPR`,
//! `:device [cpu|cuda]`, `:quit`. Usage errors are E0722 diagnostics about the
//! command line; they never end the session.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use tessera::backend::resources::Resources;
use tessera::cli::{emit_with, EmitContext, EmitError, EmitKind};
use tessera::db::kernel_resources;
use tessera::diag::Diagnostic;
use tessera::exec::cuda::{cache_row, measured_row};
use tessera::ir::tile::Specialization;
use tessera::syntax::span::Span;
use tessera::target::Arch;

use crate::session::{device_unavailable, LastLaunch, LoadError, Session};

/// Every command with its one-line description (for `:help` and completion).
pub const COMMANDS: &[(&str, &str)] = &[
    (":help", "this list"),
    (
        ":load FILE",
        "add the definitions of a .tsr file, then run its top-level statements",
    ),
    (":reload", "read the loaded files again"),
    (":type EXPR", "the type of an expression: dtype and shape"),
    (
        ":emit KIND NAME [ARCH] [-D N=V]",
        "print graph-ir, schedule-ir, tile-ir, target-ir, ptx or hip of a function or kernel",
    ),
    (
        ":resources NAME [ARCH] [-D N=V]",
        "threads, registers, shared memory and occupancy of a kernel",
    ),
    (
        ":time EXPR",
        "run a statement several times; print the median time",
    ),
    (
        ":device [cpu|cuda] [N]",
        "show or set where computations run (N: how many devices `shard` uses)",
    ),
    (
        ":devices",
        "every device this machine has: the CPU and each GPU",
    ),
    (
        ":autotune NAME",
        "the configurations an @autotune kernel was timed with on the GPU, and the best",
    ),
    (":quit", "leave the session (also Ctrl-D)"),
];

/// What the shell does after a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    Continue,
    Quit,
}

/// The default architecture of `:emit` and `:resources` where the session
/// runs on the CPU; on a GPU, the arch its kernels compile for.
const DEFAULT_ARCH: Arch = Arch::Sm90;

fn usage(span: Span, message: impl Into<String>, help: impl Into<String>) -> Diagnostic {
    Diagnostic::new("E0722", span, message.into()).with_help(help.into())
}

/// Whether `line` is a session command (starts with `:`).
pub fn is_command(line: &str) -> bool {
    line.trim_start().starts_with(':')
}

/// Runs the command `line`; returns whether to go on and whether it succeeded.
pub fn run(
    session: &mut Session,
    line: &str,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> (Next, bool) {
    let line = line.trim_end_matches(['\n', '\r']);
    let base = session.note_command(line);
    // A ` #` starts a comment, as in code.
    let line = match line.find(" #") {
        Some(i) => line[..i].trim_end(),
        None => line,
    };
    let lead = (line.len() - line.trim_start().len()) as u32;
    // Words with their spans in `line`.
    let mut words: Vec<(&str, Span)> = Vec::new();
    let mut offset = 0;
    for w in line.split_whitespace() {
        let start = offset + line[offset..].find(w).expect("word of the line");
        words.push((w, Span::new(start as u32, (start + w.len()) as u32)));
        offset = start + w.len();
    }
    let (cmd, cmd_span) = words[0];
    let rest_start = (cmd_span.end as usize).min(line.len());
    let rest = line[rest_start..].trim();
    let rest_offset =
        (rest_start + line[rest_start..].len() - line[rest_start..].trim_start().len()) as u32;
    let whole = Span::new(lead, line.len() as u32);
    // A top-level statement of a loaded file failed (rendered against the file).
    let mut statement_failed = false;
    let result: Result<Next, Diagnostic> = match cmd {
        ":help" | ":h" | ":?" => {
            let _ = writeln!(out, "{}", help_text());
            Ok(Next::Continue)
        }
        ":quit" | ":q" | ":exit" => Ok(Next::Quit),
        ":load" | ":l" => {
            if rest.is_empty() {
                Err(usage(
                    whole,
                    "`:load` needs a file",
                    "`:load examples/gemm.tsr`",
                ))
            } else {
                load(
                    session,
                    &PathBuf::from(rest),
                    Span::new(rest_offset, line.len() as u32),
                    out,
                    err,
                )
                .map(|ok| {
                    statement_failed |= !ok;
                    Next::Continue
                })
            }
        }
        ":reload" | ":r" => {
            let files: Vec<PathBuf> = session.loaded_files().to_vec();
            if files.is_empty() {
                let _ = writeln!(out, "no files loaded");
            }
            let mut result = Ok(Next::Continue);
            for f in files {
                match load(session, &f, whole, out, err) {
                    Ok(ok) => statement_failed |= !ok,
                    Err(d) => {
                        result = Err(d);
                        break;
                    }
                }
            }
            result
        }
        ":type" | ":t" => {
            if rest.is_empty() {
                Err(usage(
                    whole,
                    "`:type` needs an expression",
                    "`:type x * 2.0`",
                ))
            } else {
                match session.type_of(rest, base + rest_offset) {
                    Ok(t) => {
                        let _ = writeln!(out, "{t}");
                        Ok(Next::Continue)
                    }
                    Err(diags) => {
                        session.render(&diags, err);
                        return (Next::Continue, false);
                    }
                }
            }
        }
        ":time" => {
            if rest.is_empty() {
                Err(usage(
                    whole,
                    "`:time` needs a statement",
                    "`:time softmax(x, dim=-1)`",
                ))
            } else {
                time(session, rest, base + rest_offset, out, err)
            }
        }
        ":autotune" => match words.as_slice() {
            [_, (name, _)] => {
                autotune_table(session, name, out);
                Ok(Next::Continue)
            }
            _ => Err(usage(
                whole,
                "`:autotune` takes the name of a kernel",
                "`:autotune gemm_tuned`",
            )),
        },
        ":devices" if words.len() == 1 => {
            devices(session, out);
            Ok(Next::Continue)
        }
        ":devices" => Err(usage(whole, "`:devices` takes no arguments", "`:devices`")),
        ":device" => match words.get(1) {
            None => {
                match (session.gpu_info(), session.gpu()) {
                    (Some(info), Some(gpu)) => {
                        let m = gpu.memory_stats();
                        writeln!(
                            out,
                            "{info}\nmemory: {} in use by tensors (peak {}), {} cached for reuse; {} blocks from the driver, {} reused",
                            mib(m.bytes_in_use),
                            mib(m.peak_bytes_in_use),
                            mib(m.bytes_cached),
                            m.driver_allocs,
                            m.reuses
                        )
                        .and_then(|()| {
                            writeln!(out, "{}", cache_row(gpu.cache_dir(), gpu.cache_stats()))
                        })
                    }
                    _ => writeln!(out, "{}", session.device().name()),
                }
                .ok();
                if session.device_count() > 1 {
                    let _ = writeln!(
                        out,
                        "{} devices for `shard`: {kind}:0 to {kind}:{}",
                        session.device_count(),
                        session.device_count() - 1,
                        kind = session.device().name()
                    );
                }
                Ok(Next::Continue)
            }
            Some(("cpu", _)) => device_count(&words, whole).map(|n| {
                session.use_cpu();
                if let Some((n, span)) = n {
                    session
                        .set_device_count(n, span)
                        .expect("any count of CPU devices in range opens");
                }
                Next::Continue
            }),
            Some(("cuda", span)) => device_count(&words, whole).and_then(|n| {
                let info = session
                    .use_cuda()
                    .map_err(|e| device_unavailable(&e, *span))?;
                let _ = writeln!(out, "{info}");
                if let Some((n, span)) = n {
                    session.set_device_count(n, span)?;
                }
                Ok(Next::Continue)
            }),
            Some((other, span)) => Err(usage(
                *span,
                format!("unknown device `{other}`"),
                "`:device cpu` or `:device cuda`",
            )),
        },
        ":emit" => split_defines(&words)
            .and_then(|(words, defines)| emit(session, &words, &defines, whole, out, err)),
        ":resources" => split_defines(&words)
            .and_then(|(words, defines)| resources(session, &words, &defines, whole, out, err)),
        other => {
            let names: Vec<&str> = COMMANDS
                .iter()
                .map(|(c, _)| c.split_whitespace().next().expect("command name"))
                .collect();
            let mut d = usage(
                cmd_span,
                format!("unknown command `{other}`"),
                "`:help` lists the commands",
            );
            if let Some(s) = tessera::check::suggest(other, names.iter().copied()) {
                d = d.with_help(format!("did you mean `{s}`? (`:help` lists the commands)"));
            }
            Err(d)
        }
    };
    match result {
        Ok(next) => (next, !statement_failed),
        Err(d) => {
            session.render(&[d.shifted(base)], err);
            (Next::Continue, false)
        }
    }
}

fn help_text() -> String {
    let width = COMMANDS.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    let mut s = String::from(
        "Type statements and definitions; an expression prints its value. A block\n\
         (def, @kernel, if, for, while) ends with a blank line.\n\n",
    );
    for (c, d) in COMMANDS {
        s.push_str(&format!("  {c:width$}  {d}\n"));
    }
    s.push_str("\nCtrl-C stops a running computation (or clears the line); Ctrl-D leaves.");
    s
}

/// `:load` (and each file of `:reload`): `Ok(false)` when the definitions were
/// added but a top-level statement of the file failed (already rendered).
fn load(
    session: &mut Session,
    path: &std::path::Path,
    span: Span,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<bool, Diagnostic> {
    match session.load(path, out, err) {
        Ok(_) => Ok(true),
        Err(LoadError::StatementFailed { .. }) => Ok(false),
        Err(LoadError::Unreadable(m)) => Err(Diagnostic::new(
            "E0723",
            span,
            format!("cannot read `{}`: {}", path.display(), strip_os_error(&m)),
        )
        .with_help("paths are relative to the directory the session started in")),
        // Rendered already; nothing was added.
        Err(LoadError::Errors) => Err(usage(
            span,
            format!("`{}` has errors; nothing was loaded", path.display()),
            "fix the errors above and `:load` it again (or `:reload`)",
        )),
    }
}

fn strip_os_error(m: &str) -> &str {
    m.find(" (os error").map_or(m, |i| &m[..i])
}

fn arch_arg(session: &Session, words: &[(&str, Span)], i: usize) -> Result<Arch, Diagnostic> {
    match words.get(i) {
        None => Ok(session.gpu_info().map_or(DEFAULT_ARCH, |g| g.arch)),
        Some((w, span)) => w
            .parse::<Arch>()
            .map_err(|e| usage(*span, format!("unknown architecture `{w}`"), e.to_string())),
    }
}

/// A `-D` of a command line: `-D NAME=VALUE`, `-D NAME%DIVISOR` or `-DNAME=VALUE`.
type DefineArg = (tessera::cli::Define, Span);

/// A word of a command line with its span.
type Word<'a> = (&'a str, Span);

/// The words of a command without its `-D` arguments, and those parsed.
fn split_defines<'a>(words: &[Word<'a>]) -> Result<(Vec<Word<'a>>, Vec<DefineArg>), Diagnostic> {
    let help =
        "`-D NAME=VALUE` fixes a const parameter or dim; `-D NAME%DIVISOR` assumes a divisor";
    let mut rest = Vec::new();
    let mut defines = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let (w, span) = words[i];
        let (text, span) = if w == "-D" {
            let Some(&(v, vspan)) = words.get(i + 1) else {
                return Err(usage(span, "`-D` needs NAME=VALUE", help));
            };
            i += 1;
            (v, Span::new(span.start, vspan.end))
        } else if let Some(v) = w.strip_prefix("-D") {
            (v, span)
        } else {
            rest.push((w, span));
            i += 1;
            continue;
        };
        let d = Specialization::parse_define_arg(text)
            .map_err(|e| usage(span, format!("bad `-D {text}`: {e}"), help))?;
        defines.push((d, span));
        i += 1;
    }
    Ok((rest, defines))
}

/// The specialization of a `:emit`/`:resources` of kernel `name`: the `-D`
/// arguments, checked as `tsrc emit` checks them; without any, the one the
/// kernel last ran with in the session (then a note says so).
fn command_spec(
    session: &Session,
    kernels: &[(String, tessera::db::ItemSource<'_>, u32)],
    name: &str,
    defines: &[DefineArg],
    whole: Span,
    err: &mut dyn Write,
) -> Result<Specialization, Diagnostic> {
    if defines.is_empty() {
        return Ok(match session.last_launch(name) {
            // Specialised on nothing: the same as without a launch.
            Some(LastLaunch { spec, .. })
                if spec.values.is_empty() && spec.floats.is_empty() && spec.divisors.is_empty() =>
            {
                spec
            }
            Some(LastLaunch { spec, ran_with }) => {
                let mut shown: Vec<String> = spec
                    .values
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                shown.extend(
                    spec.floats
                        .iter()
                        .map(|(k, v)| format!("{k}={}", f64::from_bits(*v))),
                );
                // The run-time facts the variant assumes (`-D S%16`).
                shown.extend(spec.divisors.iter().map(|(k, d)| format!("{k}%{d}")));
                // A tuning configuration chosen for another target gives
                // way to this one's first (`Session::last_launch`).
                let how = match ran_with {
                    Some(config) => {
                        let arch = session.database().options().arch(session.database());
                        format!(
                            "at its last launch's shapes, with the configuration {arch} takes first (it ran with {config})"
                        )
                    }
                    None => "as it last ran".to_string(),
                };
                let _ = writeln!(
                    err,
                    "note: `{name}` {how}: {} (other values: `-D NAME=VALUE`)",
                    shown.join(", ")
                );
                spec
            }
            None => Specialization::new(),
        });
    }
    let list: Vec<tessera::cli::Define> = defines.iter().map(|(d, _)| d.clone()).collect();
    tessera::cli::specialization(session.database(), kernels, &list).map_err(|m| {
        let span = m
            .split('`')
            .nth(1)
            .and_then(|bad| {
                defines
                    .iter()
                    .find(|(d, _)| format!("-D {}", d.name()) == bad)
            })
            .map_or(whole, |(_, s)| *s);
        usage(
            span,
            m,
            "`-D` names a const parameter, a tensor dim, num_warps or num_stages",
        )
    })
}

fn emit(
    session: &mut Session,
    words: &[(&str, Span)],
    defines: &[DefineArg],
    whole: Span,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Next, Diagnostic> {
    let help = "`:emit KIND NAME [ARCH] [-D NAME=VALUE]...`, KIND one of graph-ir, schedule-ir, tile-ir, target-ir, ptx (NVIDIA arches), hip (AMD arches)";
    if words.len() < 3 || words.len() > 4 {
        return Err(usage(
            whole,
            "`:emit` takes a kind, a name, an optional architecture and `-D NAME=VALUE`s",
            help,
        ));
    }
    let (kind_word, kind_span) = words[1];
    let kind = EmitKind::from_str(kind_word, true)
        .map_err(|_| usage(kind_span, format!("unknown IR kind `{kind_word}`"), help))?;
    let (name, name_span) = words[2];
    let arch = arch_arg(session, words, 3)?;
    let previous = session.database().options().arch(session.database());
    session.set_arch(arch);
    let db = session.database();
    let file = session.source_file();
    let whole_tensor = matches!(kind, EmitKind::GraphIr | EmitKind::ScheduleIr);
    let mut kernels = tessera::db::file_kernels(db, file);
    let result = if whole_tensor {
        if !tessera::db::file_functions(db, file)
            .iter()
            .any(|f| f.0 == name)
        {
            Err(not_defined(
                name,
                name_span,
                "whole-tensor function",
                kernels.iter().any(|k| k.0 == name),
            ))
        } else {
            Ok(())
        }
    } else {
        kernels = tessera::db::kernels_named(db, file, name);
        if kernels.is_empty() {
            let is_fn = tessera::db::file_functions(db, file)
                .iter()
                .any(|f| f.0 == name);
            Err(not_defined(name, name_span, "kernel", is_fn))
        } else {
            Ok(())
        }
    };
    let result = result.and_then(|()| {
        let spec = if whole_tensor {
            Specialization::new()
        } else {
            command_spec(session, &kernels, name, defines, whole, err)?
        };
        let cx = EmitContext {
            db,
            file,
            kernels,
            spec,
            arch,
            function: whole_tensor.then(|| name.to_string()),
        };
        match emit_with(&cx, kind) {
            Ok(text) => {
                let _ = out.write_all(text.as_bytes());
                if !text.ends_with('\n') {
                    let _ = writeln!(out);
                }
                Ok(Next::Continue)
            }
            Err(EmitError::Usage(m)) => Err(usage(whole, m, help)),
            Err(EmitError::Diagnostics(diags)) => Err(kernel_error(name, name_span, diags)
                .unwrap_or_else(|| usage(whole, "nothing to emit", help))),
        }
    });
    session.set_arch(previous);
    result
}

/// The error of a kernel that does not compile, at its name on the command
/// line: its first error, or, when it needs values for several dims or const
/// parameters (E0511), one error naming all of them.
fn kernel_error(name: &str, span: Span, diags: Vec<Diagnostic>) -> Option<Diagnostic> {
    let errors: Vec<Diagnostic> = diags.into_iter().filter(|d| d.is_error()).collect();
    let first = errors.first()?.clone();
    // Every E0511's help reads `... -D NAME=...`.
    let mut needs: Vec<&str> = Vec::new();
    for d in errors.iter().filter(|d| d.code == "E0511") {
        let Some(help) = d.help.as_deref() else {
            continue;
        };
        let Some(at) = help.find("-D ") else {
            continue;
        };
        let rest = &help[at + 3..];
        let n = &rest[..rest.find(['=', '`', ' ']).unwrap_or(rest.len())];
        if !needs.contains(&n) {
            needs.push(n);
        }
    }
    let (message, help) = if needs.len() > 1 {
        let names: Vec<String> = needs.iter().map(|n| format!("`{n}`")).collect();
        let defines: Vec<String> = needs.iter().map(|n| format!("-D {n}=128")).collect();
        (
            format!(
                "`{name}` needs compile-time values for {}",
                names.join(", ")
            ),
            Some(format!("give them all, e.g. `{}`", defines.join(" "))),
        )
    } else {
        (format!("`{name}`: {}", first.message), first.help.clone())
    };
    Some(Diagnostic {
        span,
        labels: Vec::new(),
        message,
        help,
        ..first
    })
}

fn not_defined(name: &str, span: Span, what: &str, other_kind: bool) -> Diagnostic {
    let help = if other_kind {
        if what == "kernel" {
            "it is a whole-tensor function: `:emit graph-ir NAME` or `:emit schedule-ir NAME`"
        } else {
            "it is a kernel: `:emit tile-ir NAME`, `target-ir`, `ptx` or `hip`"
        }
    } else {
        "define it in the session or `:load` a file that does"
    };
    Diagnostic::new(
        "E0201",
        span,
        format!("no {what} named `{name}` in this session"),
    )
    .with_primary_label("unknown name")
    .with_help(help)
}

fn resources(
    session: &mut Session,
    words: &[(&str, Span)],
    defines: &[DefineArg],
    whole: Span,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Next, Diagnostic> {
    if words.len() < 2 || words.len() > 3 {
        return Err(usage(
            whole,
            "`:resources` takes a kernel name, an optional architecture and `-D NAME=VALUE`s",
            "`:resources gemm sm_90`",
        ));
    }
    let (name, name_span) = words[1];
    let arch = arch_arg(session, words, 2)?;
    let previous = session.database().options().arch(session.database());
    session.set_arch(arch);
    let db = session.database();
    let file = session.source_file();
    let kernels = tessera::db::kernels_named(db, file, name);
    let kernel = kernels.first().cloned();
    let result = match kernel {
        None => Err(not_defined(
            name,
            name_span,
            "kernel",
            tessera::db::file_functions(db, file)
                .iter()
                .any(|f| f.0 == name),
        )),
        Some((_, item, offset)) => command_spec(session, &kernels, name, defines, whole, err)
            .and_then(
                |spec| match kernel_resources(db, item, offset, db.options(), &spec) {
                    Ok((r, diags)) => {
                        let _ = writeln!(out, "{}", resources_row(&r));
                        // The driver's numbers, for the variant that ran here
                        // (not for one `-D` or another arch asks about).
                        let on_gpu = session.gpu_info().is_some();
                        if let (true, true, 2) = (on_gpu, defines.is_empty(), words.len()) {
                            if let Ok(k) =
                                tessera::db::tile_ir(db, item, db.options(), spec.clone()).as_ref()
                            {
                                // Each GPU it ran on (a tensor moved to `cuda:1` takes
                                // its launches there).
                                for gpu in session.open_gpus() {
                                    if let Some(m) = gpu.measured(k) {
                                        let _ = writeln!(out, "{}", measured_row(gpu.info(), &m));
                                    }
                                }
                            }
                        }
                        // W0003/W0004 about the kernel: their text, without spans into the session source.
                        for d in diags {
                            let _ =
                                writeln!(err, "{}[{}]: {}", d.severity.as_str(), d.code, d.message);
                        }
                        Ok(Next::Continue)
                    }
                    Err(diags) => Err(kernel_error(name, name_span, diags).unwrap_or_else(|| {
                        usage(whole, "no resources", "`:resources gemm sm_90`")
                    })),
                },
            ),
    };
    session.set_arch(previous);
    result
}

/// `gemm  sm_90  256 threads  ~128 regs  49152 B smem  occupancy 25% (2 blocks/SM, limited by registers)`;
/// on AMD `gemm  gfx942  256 threads  ~128 VGPRs  ~20 SGPRs  49152 B LDS  occupancy 50% (4 waves/SIMD, 1 workgroup/CU, limited by registers)`.
pub fn resources_row(r: &Resources) -> String {
    let limiters: Vec<&str> = r
        .occupancy
        .limiters()
        .iter()
        .map(|l| match l.name() {
            "shared_memory" => "shared memory",
            n => n,
        })
        .collect();
    let blocks = r.occupancy.blocks_per_sm;
    if let (Some(amd), Some(waves)) = (r.amd, r.occupancy.waves_per_simd) {
        let agprs = if amd.agprs > 0 {
            format!("  ~{} AGPRs", amd.agprs)
        } else {
            String::new()
        };
        return format!(
            "{}  {}  {} threads  ~{} VGPRs{agprs}  ~{} SGPRs  {} B LDS  occupancy {}% ({waves} waves/SIMD, {} workgroup{}/CU, limited by {})",
            r.kernel,
            r.arch.name(),
            r.threads,
            r.regs,
            amd.sgprs,
            r.smem_bytes,
            format_percent(r.occupancy.occupancy() * 100.0),
            blocks,
            if blocks == 1 { "" } else { "s" },
            limiters.join(" and ")
        );
    }
    format!(
        "{}  {}  {} threads  ~{} regs  {} B smem  occupancy {}% ({} block{}/SM, limited by {})",
        r.kernel,
        r.arch.name(),
        r.threads,
        r.regs,
        r.smem_bytes,
        format_percent(r.occupancy.occupancy() * 100.0),
        blocks,
        if blocks == 1 { "" } else { "s" },
        limiters.join(" and ")
    )
}

/// `:autotune NAME`: each tuning of the kernel in this session (one per
/// value of its key), every configuration with its time, the best marked.
fn autotune_table(session: &Session, name: &str, out: &mut dyn Write) {
    use tessera::exec::autotune::{config_text, space_of};
    // What the space holds for the device: `BK=32; BM=256, BN=128`.
    let space = |arch| {
        space_of(session.database(), session.source_file(), name, arch).map(|cs| {
            cs.iter()
                .map(|c| config_text(c))
                .collect::<Vec<_>>()
                .join("; ")
        })
    };
    let Some(gpu) = session.gpu() else {
        let first = match space(None) {
            Some(s) => format!(
                ": `{name}` would run {}",
                s.split("; ").next().unwrap_or("")
            ),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "no GPU is open: `@autotune` times configurations on a GPU (on the CPU a launch uses the first configuration of the space{first})"
        );
        return;
    };
    let results = gpu.tuned_of(name);
    if results.is_empty() {
        let arch = gpu.info().arch;
        let tries = match space(Some(arch)) {
            Some(s) => format!("; on {arch} its space tries {s}"),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "`{name}` has not been tuned in this session: a launch of an `@autotune` kernel on the GPU tunes it{tries}"
        );
        return;
    }
    for t in results {
        let key = if t.key.is_empty() {
            "no key".to_string()
        } else {
            format!("key {}", config_text(&t.key))
        };
        let how = if t.from_disk {
            "the choice of an earlier session, from the disk cache".to_string()
        } else {
            use tessera::exec::autotune::{ROUNDS, TIMED_RUNS};
            format!(
                "timed in this session: median of {TIMED_RUNS} launches on the GPU, in {ROUNDS} turns"
            )
        };
        let _ = writeln!(out, "{name}, {key} ({how}):");
        let width = t
            .trials
            .iter()
            .map(|(c, _)| config_text(c).len())
            .max()
            .unwrap_or(0);
        for (i, (c, r)) in t.trials.iter().enumerate() {
            let mark = if i == t.best { "*" } else { " " };
            let result = match r {
                Ok(ms) => format!("{ms:.3} ms"),
                Err(e) => format!("skipped: {e}"),
            };
            let _ = writeln!(out, "{mark} {:width$}  {result}", config_text(c));
        }
    }
}

/// Bytes in MiB with one decimal (`12.5 MiB`).
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn format_percent(p: f64) -> String {
    if (p - p.round()).abs() < 0.05 {
        format!("{}", p.round() as i64)
    } else {
        format!("{p:.1}")
    }
}

fn time(
    session: &mut Session,
    stmt: &str,
    at: u32,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Next, Diagnostic> {
    // At least 3 runs, more while the total stays under about a second (at most 50).
    let mut times = Vec::new();
    // On a GPU: each run's summed kernel and collective (NCCL) time, on
    // every GPU of the session, measured there with events (and how many
    // launches and collectives a run made).
    let mut gpu_times = Vec::new();
    let (mut launches, mut collectives) = (0, 0);
    let started = Instant::now();
    let mut sink = Vec::new();
    while times.len() < 3 || (started.elapsed().as_secs_f64() < 1.0 && times.len() < 50) {
        // Not held across the run: after a sticky error the session
        // replaces its GPU, which needs the last hold on the old one.
        let on_gpu = |s: &Session| {
            s.gpu_info().map(|_| {
                s.open_gpus().fold((Duration::ZERO, 0, 0), |(k, n, c), g| {
                    (
                        k + g.kernel_time() + g.collective_time(),
                        n + g.launches(),
                        c + g.collectives(),
                    )
                })
            })
        };
        let before = on_gpu(session);
        let t0 = Instant::now();
        sink.clear();
        if !session.execute_quiet(stmt, at, &mut sink, err) {
            return Ok(Next::Continue);
        }
        // A launch waits for its kernel, but a collective returns before it
        // ends (the host has no need to wait): its end is part of the run
        // (reading its GPU time, below, is not).
        for g in session.open_gpus() {
            g.wait_collectives();
        }
        times.push(t0.elapsed().as_secs_f64());
        if let (Some((k1, n1, c1)), Some((k0, n0, c0))) = (on_gpu(session), before) {
            gpu_times.push(k1.saturating_sub(k0).as_secs_f64());
            launches = n1.saturating_sub(n0);
            collectives = c1.saturating_sub(c0);
        }
    }
    times.sort_by(|a, b| a.total_cmp(b));
    gpu_times.sort_by(|a, b| a.total_cmp(b));
    let median = times[times.len() / 2];
    let gpu_part = match gpu_times.get(gpu_times.len() / 2) {
        Some(g) if launches + collectives > 0 => format!(
            "; on the GPU: median {} in {launches} launch{}{}",
            format_seconds(*g),
            if launches == 1 { "" } else { "es" },
            match collectives {
                0 => String::new(),
                1 => " and 1 collective".to_string(),
                c => format!(" and {c} collectives"),
            }
        ),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "median {} over {} runs{gpu_part}",
        format_seconds(median),
        times.len()
    );
    Ok(Next::Continue)
}

/// `:devices`: the CPU and every GPU the driver sees (without opening
/// them), the session's own marked with `*`.
fn devices(session: &Session, out: &mut dyn Write) {
    let here = session.gpu_info().map(|g| g.ordinal);
    let mark = |on: bool| if on { "*" } else { " " };
    let _ = writeln!(out, "{} cpu  the CPU executor", mark(here.is_none()));
    match tessera::exec::cuda::list_gpus() {
        Ok(gpus) if gpus.is_empty() => {
            let _ = writeln!(out, "  no GPU: the CUDA driver finds none");
        }
        Ok(gpus) => {
            for g in gpus {
                let _ = match g {
                    Ok(info) => {
                        // What the session did there, once it opened it.
                        let used = session
                            .open_gpus()
                            .find(|g| g.info().ordinal == info.ordinal)
                            .map_or(String::new(), |g| {
                                let m = g.memory_stats();
                                let n = g.launches();
                                format!(
                                    "; in this session: {n} launch{}, {} in use by tensors",
                                    if n == 1 { "" } else { "es" },
                                    mib(m.bytes_in_use)
                                )
                            });
                        writeln!(out, "{} {info}{used}", mark(here == Some(info.ordinal)))
                    }
                    Err(unusable) => writeln!(out, "  {unusable}"),
                };
            }
        }
        Err(e) => {
            let why = e.help.as_deref().unwrap_or(&e.message);
            let why = why.split(';').next().unwrap_or(why);
            let _ = writeln!(out, "  no GPU: {why}");
        }
    }
}

fn format_seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// The `N` of `:device cpu N` / `:device cuda N`: a count in range, with its span.
fn device_count(words: &[(&str, Span)], whole: Span) -> Result<Option<(usize, Span)>, Diagnostic> {
    match words {
        [_, _] => Ok(None),
        [_, _, (n, span)] => match n.parse::<usize>() {
            Ok(k) if (1..=crate::session::MAX_DEVICES).contains(&k) => Ok(Some((k, *span))),
            _ => Err(usage(
                *span,
                format!(
                    "`{n}` is not a device count (1 to {})",
                    crate::session::MAX_DEVICES
                ),
                "`:device cpu 4` runs on four virtual CPU devices",
            )),
        },
        _ => Err(usage(
            whole,
            "`:device` takes a device and a count",
            "`:device cpu 4` or `:device cuda 2`",
        )),
    }
}
