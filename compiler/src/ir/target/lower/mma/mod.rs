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
//! Which unit takes a dot is decided once, by [`crate::target::select_mma`]
//! over the target's matrix-instruction rows ([`Lower::mma_plan`]); the
//! instruction's feed names the file that emits it. The result of the dot stays
//! in the accumulator layout, so a loop-carried accumulator never moves.

mod mma16816;
mod mma884;
mod staging;
mod tf32;

use std::rc::Rc;

use crate::check::DType;
use crate::ir::target::layout::Layout;
use crate::ir::target::lower::Lower;
use crate::ir::tile::Precision;
use crate::target::{select_mma, MmaFeed, MmaInst};

impl<'a> Lower<'a> {
    /// The matrix instruction a `dot` of these operand dtypes, shape and
    /// precision runs on, with its accumulator layout, if one fits (else the
    /// FMA path is used).
    pub(super) fn mma_plan(
        &self,
        a: DType,
        b: DType,
        [m, n, k]: [u32; 3],
        precision: Precision,
    ) -> Option<(&'static MmaInst, Rc<Layout>)> {
        let inst = select_mma(&self.feat, a.mma_elem()?, b.mma_elem()?, Some(k), precision)?;
        let layout = match inst.feed {
            MmaFeed::Ldmatrix | MmaFeed::Tf32Fragments => {
                Layout::mma_accumulator(m, n, self.num_warps)
            }
            MmaFeed::SharedPairs => Layout::mma884_accumulator(m, n, self.num_warps),
            // AMD's matrix units: no code generator yet (`lower` refuses the target).
            MmaFeed::Registers => None,
        }?;
        Some((inst, Rc::new(layout)))
    }
}
