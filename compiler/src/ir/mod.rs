//! The intermediate representations between checked source and target code:
//! Graph IR (whole-tensor functions), Schedule IR (launch plans), Tile IR (one
//! specialised kernel) and Target IR (one kernel on one arch).

pub mod graph;
pub mod schedule;
pub mod target;
pub mod tile;

#[cfg(test)]
mod eval_tests;
#[cfg(test)]
mod lower_tests;
