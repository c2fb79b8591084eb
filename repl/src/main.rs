//! `tessera`, the user-facing binary: `tessera repl` (the interactive session,
//! or statements from a piped stdin), `tessera run FILE`, and the compiler
//! commands shared with `tsrc` (`check`, `emit`, `report`), and `tessera lsp`
//! (the language server over stdio, for editors).

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera::cli::{stderr_wants_color, CompilerCommand};
use tessera::syntax::span::Span;
use tessera_repl::session::{device_unavailable, Device, Session};
use tessera_repl::{run, shell};

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Tessera: a shape-typed GPU kernel language"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum DeviceArg {
    /// An NVIDIA GPU when a CUDA driver and a GPU are present, else the CPU.
    Auto,
    /// The CPU executor (always available).
    Cpu,
    /// NVIDIA GPU 0 through the CUDA driver (exit 2 without one).
    Cuda,
}

impl From<DeviceArg> for Device {
    fn from(d: DeviceArg) -> Device {
        match d {
            DeviceArg::Auto => Device::Auto,
            DeviceArg::Cpu => Device::Cpu,
            DeviceArg::Cuda => Device::Cuda,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// An interactive session; reads statements from stdin when it is not a terminal
    /// (then exits 1 if any statement failed).
    Repl {
        /// Where statements run.
        #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
        device: DeviceArg,
        /// How many devices `shard` spreads tensors over: virtual devices on
        /// the CPU, the first N GPUs on CUDA (docs/multi-gpu.md).
        #[arg(long, value_name = "N", default_value_t = 1)]
        devices: usize,
        /// The folder of a session saved by tessera itself, restarting its
        /// process after a GPU error left the GPU unusable in it.
        #[arg(long, value_name = "DIR", hide = true)]
        resume: Option<PathBuf>,
    },
    /// Execute a .tsr file's top-level statements (after its definitions).
    Run {
        /// The `.tsr` file (`-`: standard input, shown as `<stdin>`).
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// Where statements run.
        #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
        device: DeviceArg,
        /// How many devices `shard` spreads tensors over (as for `repl`).
        #[arg(long, value_name = "N", default_value_t = 1)]
        devices: usize,
    },
    /// Run the language server on stdin/stdout (for editors).
    Lsp {
        /// Accepted and ignored: stdio is the only transport, and some
        /// clients pass the flag by themselves.
        #[arg(long, hide = true)]
        stdio: bool,
    },
    #[command(flatten)]
    Compiler(CompilerCommand),
}

fn main() -> ExitCode {
    let command = Cli::parse().command;
    // passes recurse as deep as the nesting limit allows: run them (and the
    // REPL's evaluation) on a stack sized for it
    match tessera::stack::with_stack(move || dispatch(command)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: cannot start tessera's thread: {e}");
            ExitCode::from(2)
        }
    }
}

fn dispatch(command: Command) -> u8 {
    match command {
        Command::Compiler(c) => c.run(),
        Command::Run {
            file,
            device,
            devices,
        } => run::run_file_on(
            &file,
            device.into(),
            devices,
            stderr_wants_color(),
            &mut std::io::stdout(),
            &mut std::io::stderr(),
        ),
        Command::Repl {
            device,
            devices,
            resume,
        } => repl(device.into(), devices, resume),
        Command::Lsp { .. } => match tessera_lsp::run_stdio() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: tessera lsp: {e}");
                2
            }
        },
    }
}

fn repl(device: Device, devices: usize, resume: Option<PathBuf>) -> u8 {
    let color = stderr_wants_color();
    let mut session = Session::new("<repl>", color);
    if let Some(dir) = resume {
        // The saved state says which device; the input goes on where the
        // old process stopped (its unexecuted part first).
        let shell = tessera_repl::restart::resume(&mut session, &dir, &mut std::io::stderr());
        return if std::io::stdin().is_terminal() {
            shell::interactive(session, color, true)
        } else {
            let saved = std::io::Cursor::new(shell.input);
            shell::piped(session, saved.chain(std::io::stdin().lock()), shell.failed)
        };
    }
    if let Err(e) = tessera_repl::run::select_device(&mut session, device) {
        // No session without the device asked for: say why (against the
        // option itself) and stop, as for any other bad usage.
        let option = "--device cuda";
        let d = device_unavailable(&e, Span::new(0, option.len() as u32));
        session.render_against(option, &[d], &mut std::io::stderr());
        return tessera_repl::run::EXIT_USAGE;
    }
    if let Err(mut d) = session.set_device_count(devices, Span::new(0, 0)) {
        let option = format!("--devices {devices}");
        d.span = Span::new(0, option.len() as u32);
        session.render_against(&option, &[d], &mut std::io::stderr());
        return tessera_repl::run::EXIT_USAGE;
    }
    if std::io::stdin().is_terminal() {
        shell::interactive(session, color, false)
    } else {
        shell::piped(session, std::io::stdin().lock(), false)
    }
}
