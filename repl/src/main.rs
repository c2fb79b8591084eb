//! `tessera`, the user-facing binary. Today it has `tessera check`,
//! `tessera emit` and `tessera report` (the same commands as `tsrc`); the REPL,
//! `run` and `lsp` subcommands come with their issues.

use std::process::ExitCode;

use clap::Parser;
use tessera::cli::CompilerCommand;

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Tessera: a shape-typed GPU kernel language"
)]
struct Cli {
    #[command(subcommand)]
    command: CompilerCommand,
}

fn main() -> ExitCode {
    ExitCode::from(Cli::parse().command.run())
}
