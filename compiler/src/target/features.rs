//! What each arch's instruction set has, as one row per arch. Lowering and
//! verification ask these flags (as Cranelift's lowering asks `has_bmi1`);
//! nothing outside this module compares arches.
//!
//! Sources: PTX ISA 8.x, "PTX ISA Version Notes" and "Target ISA Notes" (the
//! lowest PTX version that knows each target; `ldmatrix` sm_75+, `cp.async`
//! sm_80+, `tanh.approx.f32` sm_75+, `cvt.rn.bf16x2.f32` sm_80+). AMD targets have no PTX and none of
//! these instructions; their matrix instructions are in [`super::mma`].

use super::mma::{self, MmaInst};
use super::Arch;

/// The instruction-set features of one arch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// The PTX ISA version written for the arch: the lowest that supports it,
    /// and at least 7.0 (accepted by ptxas 11.0 and later). `None` where the
    /// target has no PTX.
    pub ptx_isa: Option<&'static str>,
    /// `ldmatrix` (warp-wide 8x8 16-bit matrix loads from shared memory).
    pub ldmatrix: bool,
    /// `cp.async` (asynchronous global → shared copies).
    pub cp_async: bool,
    /// `tanh.approx.f32`.
    pub fast_tanh: bool,
    /// `cvt.rn.bf16x2.f32`: two f32 rounded to bf16 and packed in one
    /// instruction (else integer arithmetic rounds them).
    pub cvt_bf16: bool,
    /// `wgmma.mma_async` (warpgroup matrix multiply from shared-memory
    /// descriptors, PTX ISA 8.0), which only sm_90a has (not sm_90).
    pub wgmma: bool,
    /// TMA (`cp.async.bulk.tensor`, tensor maps, `mbarrier` transaction
    /// counts; PTX ISA 8.0). sm_90 has it too, but its row writes PTX 7.8,
    /// and the lowering uses TMA only to feed wgmma: sm_90a only.
    pub tma: bool,
    /// The matrix instructions the arch has and the code generator uses (or,
    /// for targets without a code generator yet, will use), best first; pick
    /// one with [`super::select_mma`].
    pub mma: &'static [MmaInst],
}

impl Arch {
    #[rustfmt::skip]
    pub fn features(self) -> Features {
        use Arch::*;
        let row = |ptx_isa, ldmatrix, cp_async, fast_tanh, cvt_bf16, wgmma, mma| Features {
            ptx_isa,
            ldmatrix,
            cp_async,
            fast_tanh,
            cvt_bf16,
            wgmma,
            tma: wgmma,
            mma,
        };
        match self {
            //              ptx_isa      ldmatrix cp_async fast_tanh cvt_bf16 wgmma  mma
            Sm70    => row(Some("7.0"), false,   false,   false,    false,   false, mma::SM70),
            Sm75    => row(Some("7.0"), true,    false,   true,     false,   false, mma::SM75),
            Sm80    => row(Some("7.0"), true,    true,    true,     true,    false, mma::SM80),
            Sm86    => row(Some("7.1"), true,    true,    true,     true,    false, mma::SM80),
            Sm89    => row(Some("7.8"), true,    true,    true,     true,    false, mma::SM80),
            Sm90    => row(Some("7.8"), true,    true,    true,     true,    false, mma::SM80),
            Sm90a   => row(Some("8.0"), true,    true,    true,     true,    true,  mma::SM80),
            Gfx90a  => row(None,        false,   false,   false,    false,   false, mma::CDNA2),
            Gfx942  => row(None,        false,   false,   false,    false,   false, mma::CDNA3),
            Gfx1100 => row(None,        false,   false,   false,    false,   false, mma::RDNA3),
        }
    }
}
