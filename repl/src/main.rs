//! `tessera`, the user-facing binary. Today it has `tessera check`,
//! `tessera emit` and `tessera report` (the same commands as `tsrc`) and
//! `tessera lsp` (the language server over stdio); the REPL and `run`
//! subcommands come with their issues.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera::cli::CompilerCommand;

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
    #[command(flatten)]
    Compiler(CompilerCommand),
    /// Run the language server on stdin/stdout (for editors).
    Lsp,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Compiler(c) => ExitCode::from(c.run()),
        Command::Lsp => match tessera_lsp::run_stdio() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: tessera lsp: {e}");
                ExitCode::from(2)
            }
        },
    }
}
