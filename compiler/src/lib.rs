//! Tessera compiler core: syntax → check → ir → backend, on one salsa database.

pub mod backend;
pub mod cancel;
pub mod check;
pub mod cli;
pub mod db;
pub mod diag;
pub mod exec;
pub mod ide;
pub mod ir;
pub mod stack;
pub mod stdlib;
pub mod syntax;
pub mod target;
