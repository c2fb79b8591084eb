//! `tessera`, the user-facing binary. Today it has `tessera check` (the same
//! code as `tsrc check`); the REPL, `run` and `lsp` subcommands come with their
//! issues.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera::cli::{self, CheckArgs};

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match &cli.command {
        Command::Check(args) => cli::check(args),
    };
    ExitCode::from(code)
}
