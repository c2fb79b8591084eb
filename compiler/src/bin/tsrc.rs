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
    let cli = Cli::parse();
    // passes recurse as deep as the nesting limit allows: run them on a stack
    // sized for it
    match tessera::stack::with_stack(move || cli.command.run()) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: cannot start the compiler's thread: {e}");
            ExitCode::from(2)
        }
    }
}
