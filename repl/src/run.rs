//! `tessera run FILE.tsr [--device cpu|cuda]`: the file's definitions, then its
//! top-level statements in order, through the same evaluator as the REPL.

use std::io::Write;
use std::path::Path;

use crate::session::{device_unavailable, Device, Session};
use tessera::syntax::span::Span;

/// Exit statuses of `tessera run`.
pub const EXIT_OK: u8 = 0;
/// A diagnostic stopped the file.
pub const EXIT_ERRORS: u8 = 1;
/// The file cannot be read.
pub const EXIT_USAGE: u8 = 2;

/// Runs `path` on `device`; output on `out`, diagnostics on `err`.
pub fn run_file(
    path: &Path,
    device: Device,
    color: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    run_file_on(path, device, 1, color, out, err)
}

/// [`run_file`] with `devices` devices for `shard` (`--devices`).
pub fn run_file_on(
    path: &Path,
    device: Device,
    devices: usize,
    color: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let shown = tessera::cli::shown_path(path);
    let text = match tessera::cli::read_source(path) {
        Ok(t) => t,
        Err(e) => {
            let m = e.to_string();
            let m = m
                .find(" (os error")
                .map_or(m.as_str(), |i| &m[..i])
                .to_string();
            let _ = writeln!(err, "error[E0723]: cannot read `{shown}`: {m}");
            return EXIT_USAGE;
        }
    };
    let mut session = Session::new(&shown, color);
    if let Err(e) = select_device(&mut session, device) {
        // Nothing runs: name the device problem against the file's first line.
        let first = tessera::syntax::lines::lines(&text)
            .next()
            .map_or(0, str::len) as u32;
        session.render_against(&text, &[device_unavailable(&e, Span::new(0, first))], err);
        return EXIT_USAGE;
    }
    if let Err(mut d) = session.set_device_count(devices, Span::new(0, 0)) {
        let option = format!("--devices {devices}");
        d.span = Span::new(0, option.len() as u32);
        session.render_against(&option, &[d], err);
        return EXIT_USAGE;
    }
    if session.run_file(&text, out, err) {
        EXIT_OK
    } else {
        EXIT_ERRORS
    }
}

/// Puts `session` on `device`: `Auto` takes the GPU when there is one, else
/// the CPU; `Cuda` is E0721 without a driver or a GPU.
pub fn select_device(
    session: &mut Session,
    device: Device,
) -> Result<(), tessera::exec::ExecError> {
    match device {
        Device::Cpu => session.use_cpu(),
        Device::Cuda => {
            session.use_cuda()?;
        }
        Device::Auto => {
            if session.use_cuda().is_err() {
                session.use_cpu();
            }
        }
    }
    Ok(())
}
