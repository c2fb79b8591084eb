//! Matrix instructions in HIP: each Target IR matrix instruction printed as
//! the `__builtin_amdgcn_*` builtin of the arch's matrix cores. NVIDIA's
//! `mma.sync` is not an AMD instruction: lowering for an AMD arch never
//! emits it, and the printer refuses it.

use super::{HipError, Printer};
use crate::ir::target::Inst;

/// The lines of C that run matrix instruction `i` (of `p`'s kernel).
pub(super) fn print(p: &Printer<'_>, i: &Inst) -> Result<Vec<String>, HipError> {
    match i {
        Inst::Mma { m, n, k, .. } => p.inexpressible(format!(
            "`mma.sync` m{m}n{n}k{k} (NVIDIA's tensor-core instruction, not an AMD instruction)"
        )),
        other => p.inexpressible(format!("{other:?} (not a matrix instruction)")),
    }
}
