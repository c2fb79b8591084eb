//! `tsrc`, the Tessera compiler driver. Today: `tsrc check`; `emit` and `report`
//! arrive with the backend issues.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera::cli::{self, CheckArgs};

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match &cli.command {
        Command::Check(args) => cli::check(args),
    };
    ExitCode::from(code)
}
