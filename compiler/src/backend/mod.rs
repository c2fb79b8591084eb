//! The back ends: the PTX and HIP printers, ptxas, occupancy and the register estimate
//! (target facts are in `crate::target`).

#[cfg(test)]
pub(crate) mod corpus;
pub mod hip;
pub mod occupancy;
mod print;
pub mod ptx;
pub mod ptxas;
pub mod resources;
