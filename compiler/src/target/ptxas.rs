//! The calibrated behaviour of ptxas (12.9) that the register estimate in
//! `backend/resources/` relies on: constants measured or fitted on ptxas's
//! output, and one row per arch of what differs between arches. Each says how
//! it was measured; `compiler/tests/ptxas.rs` re-measures those it names.

use super::Arch;

/// Registers `ptxas -v` counts beyond the program's own values. Calibrated with
/// ptxas 12.9 on straight-line kernels holding `n` loaded values and a 64-bit
/// address live at once: it reports `n + 2 + 3` registers on sm_70, sm_80 and
/// sm_90 for every `n` from 3 to 24 (`compiler/tests/ptxas.rs` re-checks this).
pub const PTXAS_OVERHEAD: u32 = 3;
/// Registers ptxas's called slow path of an IEEE f32 division or reciprocal
/// (`div.rn`, `rcp.rn`) adds to those live across it (see `slow_path_scratch` in `backend/resources/program.rs`).
pub const SLOW_DIV_REGS: u32 = 9;
/// The same for an IEEE f32 square root (`sqrt.rn`).
pub const SLOW_SQRT_REGS: u32 = 4;
/// The most words of global loads ptxas 12.9 issues ahead of their uses in
/// one stretch (see `hoist_loads` in `backend/resources/order.rs`): `n` f32 loads from one address summed in
/// order take `n + 2 + 3` registers up to `n = 24` and 30 or 31 from `n = 25`
/// on, on sm_70, sm_80 and sm_90 (`compiler/tests/ptxas.rs` re-checks this).
pub const LOAD_WINDOW_WORDS: u32 = 25;
/// The same for shared-memory loads in a stretch without an MMA.
pub const SHARED_LOAD_WINDOW_WORDS: u32 = 32;
/// Above this estimate (every k step's `ldmatrix` fragments of a stretch's
/// MMAs issued before the first), ptxas keeps only one k step's ahead (see
/// `of_target` in `backend/resources/mod.rs`; the GEMM mainloops of the
/// `pipelined` set, 137 to 212 estimated, hold all of theirs).
pub const LDMATRIX_ALL_STEPS_MAX_REGS: u32 = 220;
/// The predicate registers a thread has (`P0` to `P6` in SASS on sm_70 to
/// sm_90; `PT` is the constant true): a block whose masked accesses need
/// more predicates than this at once cannot hold them all, and ptxas
/// computes each compare next to the access it guards (see `sink` in
/// `backend/resources/order.rs`).
pub const PREDICATE_REGS: usize = 7;
/// The fewest registers ptxas 12.9 reports for a kernel that touches global
/// memory (an empty kernel gets 4).
pub const MIN_REGS: u32 = 8;
/// Above this many registers (estimated in statement order), ptxas
/// interleaves the per-element chains of an elementwise computation, down to
/// about this many, where no slow-path call splits them (see the
/// docs of `backend/resources/mod.rs`). Tuned on the generated seeds 0..200: at 70 estimated ptxas keeps the
/// order (83 registers).
pub const CHAIN_MIN_REGS: u32 = 72;
/// Registers a thread can have with every arch's full 2,048 threads per SM
/// resident (65,536 registers): below this ptxas's scheduler spends
/// registers on latency hiding without costing occupancy.
pub const FULL_OCCUPANCY_REGS: u32 = 32;
/// ptxas issues global loads ahead of their uses only while a thread's
/// registers stay within `1 / HOIST_BUDGET_DIVISOR` of the most a thread of
/// the block can have: 32 for a 1,024-thread block (64 at most), where the
/// kernels the compiler generates for long rows need 32 to 40 registers with
/// their loads in place and ptxas gives them 32 to 64 (with every load of a
/// stretch early the estimate was 42 to 98, `compiler/tests/ptxas.rs`'s whole-tensor
/// set); 64 for a 512-thread block. `n` f32 loads summed in order on sm_70,
/// sm_80 and sm_90 under `.maxntid 768` (80 registers at most) take 37 or 38
/// registers from `n = 32` on, where smaller blocks take 30 or 31 (the
/// [`LOAD_WINDOW_WORDS`] of the other blocks binds first there).
pub const HOIST_BUDGET_DIVISOR: u32 = 2;
/// The longest body (in Target IR instructions) of a loop that ptxas 12.9
/// unrolls by 4 (`unrolled_by_four` in `backend/resources/unroll.rs`): generated kernels' reduction loops
/// of 38 to 46 instructions are unrolled, those of 52 to 61 are not.
pub const UNROLL_BY_FOUR_MAX_INSTS: usize = 48;
/// Below [`FULL_OCCUPANCY_REGS`], the estimate moves `1 / LATENCY_SHARE` of
/// the way from the pressure-minded order's count to the latency order's
/// (`ilp_order` in `backend/resources/order.rs`), rounded down. Fitted on the generated seeds 0..200 with
/// the corpus held within the goal (see the docs of `backend/resources/mod.rs`).
pub const LATENCY_SHARE: u32 = 4;

/// What ptxas does differently per arch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtxasModel {
    /// The most iterations of a loop with constant bounds (and no loop inside)
    /// that ptxas 12.9 unrolls completely, issuing the loads of all iterations
    /// together; 0 where it keeps such loops rolled. Measured on `row_sum4`'s
    /// PTX with the trip count varied: on sm_90 ptxas uses 8, 12, 17 and 23
    /// registers for 1 to 4 trips (the loaded values of every live iteration
    /// at once) and 29 to 30 from 5 trips on (unrolled by 4, not modelled); on
    /// sm_80 16 registers for every trip count.
    pub full_unroll_max_trips: u32,
    /// Whether ptxas 12.9 feeds kernel parameters used inside a loop to the
    /// loop's instructions straight from the constant bank (`c[0x0][..]`
    /// operands of IMAD.WIDE, ISETP, FMUL, ...) instead of holding them in
    /// registers across it. SASS of `scale_all` (a grid-stride loop reading
    /// the `x` and `out` pointers, `alpha` and `N`): so on sm_70 and sm_80,
    /// 18 registers; on sm_90 it loads them before the loop (`LDC.64` into
    /// registers, `ULDC` into uniform ones), 24 registers.
    pub loop_params_from_constant_bank: bool,
}

impl Arch {
    /// ptxas's per-arch behaviour (AMD targets: no ptxas, nothing modelled).
    #[rustfmt::skip]
    pub fn ptxas(self) -> PtxasModel {
        use Arch::*;
        let row = |full_unroll_max_trips, loop_params_from_constant_bank| PtxasModel {
            full_unroll_max_trips,
            loop_params_from_constant_bank,
        };
        match self {
            //                full_unroll_max_trips  loop_params_from_constant_bank
            Sm70    => row(0,                      true),
            Sm75    => row(0,                      true),
            Sm80    => row(0,                      true),
            Sm86    => row(0,                      true),
            Sm89    => row(0,                      true),
            Sm90    => row(4,                      false),
            Sm90a   => row(4,                      false),
            Gfx90a  => row(0,                      false),
            Gfx942  => row(0,                      false),
            Gfx1100 => row(0,                      false),
        }
    }
}
