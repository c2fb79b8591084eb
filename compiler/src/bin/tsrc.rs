//! `tsrc`, the Tessera compiler driver: `tsrc check`, `tsrc emit`, `tsrc report`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera::cli::{self, CheckArgs, EmitArgs, ReportArgs};

#[derive(Parser)]
#[command(name = "tsrc", version, about = "The Tessera compiler")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check .tsr files: syntax, names, types, shapes and target limits.
    Check(CheckArgs),
    /// Print an IR level or PTX for a .tsr file (after checking it); HIP is not built yet.
    Emit(EmitArgs),
    /// Per kernel: threads, registers, shared memory and occupancy on a target.
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
