//! `tessera`, the user-facing binary. Today it has `tessera check`,
//! `tessera emit` and `tessera report` (the same code as the `tsrc` ones); the REPL,
//! `run` and `lsp` subcommands come with their issues.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera::cli::{self, CheckArgs, EmitArgs, ReportArgs};

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

#[derive(Subcommand)]
enum Command {
    /// Check .tsr files: syntax, names, types, shapes and target limits.
    Check(CheckArgs),
    /// Print an IR level or PTX for a .tsr file (the same as `tsrc emit`).
    Emit(EmitArgs),
    /// Per kernel: threads, registers, shared memory and occupancy (the same as `tsrc report`).
    Report(ReportArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match &cli.command {
        Command::Check(args) => cli::check(args),
        Command::Emit(args) => cli::emit(args),
        Command::Report(args) => cli::report(args),
    };
    ExitCode::from(code)
}
