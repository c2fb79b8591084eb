//! Tensor-core `dot`s, one file per MMA generation, plus the operand staging
//! they share:
//!
//! - `mma16816`: f16/bf16 with `mma.sync` m16n8k16 (sm_80+) or two m16n8k8
//!   (sm_75), fragments read with `ldmatrix`;
//! - `tf32`: f32 with `precision="tf32"` on `mma.m16n8k8.tf32` (sm_80+);
//! - `mma884`: f16 on sm_70's `mma.m8n8k4`, fragments read with plain shared
//!   loads (no `ldmatrix`);
//! - `staging`: where a dot operand is in shared memory (pipelined, deferred,
//!   or stored from registers into a swizzled buffer).
//!
//! Each `*_layout` function decides whether its unit takes a dot (dtypes,
//! shape, arch) and returns the accumulator layout; the result of the dot
//! stays in that layout, so a loop-carried accumulator never moves.

mod mma16816;
mod mma884;
mod staging;
mod tf32;

use std::rc::Rc;

use crate::check::DType;
use crate::ir::target::layout::Layout;
use crate::ir::target::lower::Lower;

impl<'a> Lower<'a> {
    /// The accumulator layout of a tensor-core `dot` of these operand dtypes and
    /// shape on this arch, if one fits (else the FMA path is used).
    pub(super) fn mma_layout(
        &self,
        a: DType,
        b: DType,
        m: u32,
        n: u32,
        k: u32,
    ) -> Option<Rc<Layout>> {
        if a != b || !self.arch.has_ldmatrix() || !k.is_multiple_of(16) {
            return None;
        }
        self.arch
            .mma_shapes()
            .iter()
            .find(|s| s.input == a.name())?;
        Layout::mma_accumulator(m, n, self.num_warps).map(Rc::new)
    }
}
