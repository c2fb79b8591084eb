//! `tsrc`, the Tessera compiler driver: `tsrc check`, `tsrc emit`, `tsrc report`.

use std::process::ExitCode;

use clap::Parser;
use tessera::cli::CompilerCommand;

#[derive(Parser)]
#[command(name = "tsrc", version, about = "The Tessera compiler")]
struct Cli {
    #[command(subcommand)]
    command: CompilerCommand,
}

fn main() -> ExitCode {
    ExitCode::from(Cli::parse().command.run())
}
