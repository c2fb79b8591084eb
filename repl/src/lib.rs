//! The `tessera` front end: the interactive session (`tessera repl`), piped
//! sessions and `tessera run FILE`. The evaluator lives in [`session`]; the
//! `:` commands in [`command`]; the line editor and piped input in [`shell`].

// Errors here are diagnostics, returned once per failed statement or command
// (a cold path); boxing every one would only add noise.
#![allow(clippy::result_large_err)]

pub mod chunk;
pub mod command;
pub mod restart;
pub mod run;
pub mod session;
pub mod shell;
