//! Target descriptions (and, in later stages, the PTX and HIP printers).

pub mod arch;
pub mod occupancy;
pub mod ptx;
pub mod ptxas;
pub mod resources;
