//! The calibrated behaviour of clang-19's AMDGPU backend that the AMD
//! register estimate in `backend/resources/amd.rs` relies on: what clang's
//! resource-usage remarks count beyond the program's live values. Each
//! constant says how it was measured (`compiler/tests/clang_amdgpu.rs`
//! re-measures the estimate against clang on every kernel of the corpus).

use super::Arch;

/// VGPRs clang counts beyond the most divergent words live at once.
/// Measured with clang-19 (`-O3`) on the emitted HIP of the corpus: the
/// median of `VGPRs - peak` over its kernels (see the test), which LLVM
/// spends on the lane's own id and address arithmetic in 64-bit pairs.
pub const VGPR_OVERHEAD: u32 = 2;

/// The fewest VGPRs clang reports for a kernel that touches global memory
/// (a store of a constant: its address offset and value).
pub const MIN_VGPRS: u32 = 2;

/// SGPRs clang counts beyond the most uniform words live at once: the
/// kernel-argument segment pointer and the workgroup id it is given (2 + 1),
/// VCC (2), and on gfx9 the XNACK mask (2, gfx90a) and flat scratch
/// registers LLVM reserves (`getNumExtraSGPRs`), measured as clang's SGPRs of
/// a kernel storing a constant through its one pointer argument (gfx90a 10,
/// gfx942 8, gfx1100 2: from gfx10 the remark counts only the SGPRs the
/// code names, the kernel's inputs are not reserved, and VCC is an SGPR
/// pair only where used) less that pointer's 2 words.
pub fn sgpr_base(arch: Arch) -> u32 {
    match arch {
        Arch::Gfx90a => 8,
        Arch::Gfx942 => 6,
        Arch::Gfx1100 => 0,
        _ => 0,
    }
}
