//! The Tessera language server (tower-lsp over `tessera::db::Database`).
//!
//! Only a skeleton that compiles: the server (diagnostics as you type, hover with
//! shapes, inlay hints with register and occupancy estimates) comes with its own
//! issue. Positions will be mapped with `tessera::diag::render::LineIndex`, the
//! same index the terminal and JSON renderers use.
