//! The calibrated behaviour of clang-19's AMDGPU backend that the AMD
//! register estimate in `backend/resources/amd.rs` relies on: what clang's
//! resource-usage remarks count beyond the program's live values, and how
//! LLVM's scheduler and addressing differ from ptxas's where the estimate
//! models them. Each says how it was measured; `compiler/tests/clang_amdgpu.rs`
//! measures the estimate against clang on every kernel of the corpus (the
//! printed HIP of stdlib/, examples/ and tests/, 184 kernels an arch) and
//! prints the error distribution. The numbers below are the corpus's with
//! the rest of the model as it is (gfx90a / gfx942 / gfx1100 VGPR median
//! error, kernels over 35%).

use super::Arch;

/// VGPRs clang counts beyond the most divergent words live at once. Fitted
/// on the corpus: 2 gives a median error of 18.0% / 16.7% / 12.5%, 1 gives
/// 13.9% / 14.3% / 11.1%, 0 gives 15.4% / 15.4% / 12.3% (v0, the lane's id,
/// is held across the kernel where it is read late). Fitted again once the
/// estimate modelled LLVM's middle end and scalar loads: 0 gives 19.6% /
/// 18.8% / 19.0% with 31 / 31 / 39 kernels over 35%, 1 gives 14.5% / 13.0%
/// / 14.1% with 30 / 32 / 36, 2 gives 11.9% / 10.8% / 13.3% with 33 / 34 /
/// 40: 1 keeps the fewest far off. (Measured from the repository root,
/// with `tests/lsp/main.tsr`'s import found: one kernel more than under
/// `cargo test`, whose 13.2% on gfx942 the test holds.)
pub const VGPR_OVERHEAD: u32 = 1;

/// The fewest VGPRs the estimate gives a kernel that touches memory (a
/// store of a constant: its offset and value, clang: 2).
pub const MIN_VGPRS: u32 = 2;

/// The loaded words a stretch of a block issues ahead of their uses. LLVM's
/// AMDGPU scheduler issues every load of a block ahead, without ptxas's
/// window (a grid-stride loop summing 48 inputs: clang-19 holds all 48
/// loads at once, 203 VGPRs on gfx90a). Unbounded: the corpus's kernels
/// over 35% go from 47 / 43 / 40 with ptxas's window of 25 words to 45 /
/// 43 / 40 (the medians move by under a point).
pub const LOAD_WINDOW_WORDS: u32 = u32::MAX;

/// How far toward a latency order's count the estimate moves, as a
/// divisor: a kernel below the VGPRs its occupancy allows gets `1 /
/// LATENCY_SHARE` of the way (rounded) from the statement order's count to
/// the count of the latency order (`ilp_order` in
/// `backend/resources/order.rs`: loads and independent chains issued
/// early), at most that allowance. LLVM's AMDGPU scheduler spends free
/// VGPRs on latency (four bf16 roundings side by side: clang 17 VGPRs, 8 in
/// statement order, 14 in latency order) but balances it against pressure,
/// which the list scheduler does not (a masked `x * 2.0` over 256 lanes:
/// clang 8, 7 and 11). Measured on the corpus with the fragments ahead and
/// the accumulator copies modelled, before stored values took VGPRs: the
/// whole way gives 36 / 35 / 47 kernels over 35% on gfx90a / gfx942 /
/// gfx1100, half of it 21 / 21 / 29 with gfx90a's median at 15.4%, a third
/// 24 / 24 / 26 with medians of 11.1% / 10.0% / 9.5%, a quarter 27 / 26 /
/// 28 (22 / 22 / 26 with stored values in VGPRs).
pub const LATENCY_SHARE: u32 = 3;

/// VGPRs of a divergent 64-bit address. LLVM addresses global memory as a
/// uniform 64-bit base in SGPRs plus a 32-bit offset in one VGPR (the
/// `saddr` form of `global_load`/`global_store`), where Target IR adds the
/// element offset to the base in 64 bits. One word: the corpus's kernels
/// over 35% go from 53 / 51 / 47 to 50 / 49 / 45 (ptxas's window kept).
pub const ADDRESS_VGPRS: u32 = 1;

/// SGPRs clang counts beyond the most uniform words live at once: the
/// kernel-argument segment pointer and the workgroup id (2 + 1), VCC, and
/// on gfx9 the registers LLVM reserves (`getNumExtraSGPRs`: flat scratch,
/// the XNACK mask on gfx90a). Measured first as clang's SGPRs of a kernel
/// storing a constant through its one pointer argument (gfx90a 10, gfx942
/// 8, gfx1100 2) less that pointer's 2, then moved by the median of
/// clang's count less the estimate over the corpus (gfx90a 0, gfx942 +4,
/// gfx1100 +7: the wave-uniform loop counters and bounds LLVM keeps in
/// SGPRs beside the values the estimate counts).
pub fn sgpr_base(arch: Arch) -> u32 {
    match arch {
        Arch::Gfx90a => 8,
        Arch::Gfx942 => 10,
        Arch::Gfx1100 => 7,
        _ => 0,
    }
}

/// VGPRs an IEEE f32 division or reciprocal takes beyond the values live
/// across it: clang expands it inline (`v_div_scale`, `v_rcp`, a Newton
/// step of FMAs, `v_div_fmas`, `v_div_fixup`), whose temporaries come on top
/// of the caller's values. Measured as clang's VGPRs of a kernel holding 4
/// or 8 loaded values across one division less the same kernel with a
/// multiply in its place: +2 on gfx90a, +5 on gfx1100.
pub const DIV_SCRATCH_VGPRS: u32 = 3;

/// The same for an IEEE f32 square root (`v_sqrt_f32` between a scaling of
/// small inputs and its undoing): +3 on gfx90a, +5 on gfx1100.
pub const SQRT_SCRATCH_VGPRS: u32 = 3;
