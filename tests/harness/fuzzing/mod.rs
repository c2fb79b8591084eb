//! The fuzzer: generation of valid programs ([`gen`]), mutation ([`mutate`]),
//! the inputs of a run ([`inputs`]), one input through every stage in process
//! ([`exec`]), the long-run driver with worker processes ([`driver`]),
//! minimization ([`minimize`]), a long run's state between slices
//! ([`state`]) and the language server's every-prefix replay
//! ([`lsp_replay`]). `docs/fuzzing.md` says how to run it.

pub mod driver;
pub mod exec;
pub mod gen;
pub mod inputs;
pub mod lsp_replay;
pub mod minimize;
pub mod mutate;
pub mod rng;
pub mod state;
