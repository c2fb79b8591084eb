//! Resource report: what one kernel costs on one arch.
//!
//! * threads per block: `num_warps * warp_size`;
//! * registers per thread: the peak of 32-bit register pressure of the per-thread
//!   program ([`max_pressure`](liveness::max_pressure)), from liveness over a structured program
//!   ([`Node`]: instructions, loops, two-way branches), which Target IR is;
//! * shared memory per block in bytes (Target IR's arena, which the printer
//!   declares statically or, past 48 KiB, as dynamic shared memory);
//! * occupancy and its limiting factor, by [`super::occupancy`].
//!
//! # Register estimate
//!
//! Every virtual register has a width in 32-bit words (predicates: 0, 64-bit: 2).
//! The structured program becomes a control-flow graph of instruction positions
//! (a loop's body follows its entry and jumps back to its start; it is left at
//! its [`Node::Test`]s, or skipped from the entry; a branch goes to either arm),
//! and backward dataflow liveness runs over it to a fixpoint. So a register is
//! live exactly where some path from there reads it before writing it: a loop
//! keeps a value read in its body alive around the back edge, while a carried
//! register that the body rewrites is dead between its last read and the
//! rewrite (where ptxas coalesces the copy of a loop-carried value). At each
//! instruction the pressure is the words of the registers live after it plus
//! those it writes (a result may reuse the register of an operand read for the
//! last time), or of those live before it if more. Before that, each block is
//! put in the order ptxas's scheduler is modelled to run it:
//!
//! * a loop with constant bounds, no loop inside and at most
//!   [`crate::target::ptxas::PtxasModel::full_unroll_max_trips`] trips (sm_90: 4) is replaced by its
//!   iterations ([`unroll_short_loops`](unroll::unroll_short_loops)), branches on what is then constant
//!   folded, as ptxas unrolls it there (SASS of `row_sum4` on sm_90: the
//!   loads of its live iterations issued together, 23 registers; 16 on
//!   sm_80, which keeps the loop);
//! * a loop of at most [`UNROLL_BY_FOUR_MAX_INSTS`](crate::target::ptxas::UNROLL_BY_FOUR_MAX_INSTS) instructions, none of
//!   them a loop, store, barrier or mma, whose trips are known only at run
//!   time (or are constant, at least 4 and too many to unroll completely),
//!   repeats its body four times a trip ([`unrolled_by_four`](unroll::unrolled_by_four)), as ptxas
//!   unrolls it by 4 on every arch so that the loads of four iterations are
//!   issued together (generated row reductions over a runtime `K`: 31 or 32
//!   registers, 17 to 23 with `.pragma "nounroll"`); on AMD only where the
//!   trips are constant, as LLVM's AMDGPU target does not unroll loops of
//!   run-time trips;
//! * loads are issued early ([`hoist_loads`](order::hoist_loads)): within a stretch of a block
//!   between stores, barriers, atomics, async copies and nested regions, the
//!   global loads (with the pure instructions computing their addresses and
//!   masks) move to the start of the stretch, as ptxas batches loads to cover
//!   their latency, up to [`LOAD_WINDOW_WORDS`](crate::target::ptxas::LOAD_WINDOW_WORDS) loaded words (all of them where
//!   the stretch has an mma; `convert` on sm_90: 34 registers, 49 estimated
//!   without the window, 37 with it) (SASS: the `w` and `b` loads of a layer norm's last statement are
//!   issued before its multiplies, 64 registers on every arch). Shared loads
//!   move too where the stretch feeds `mma.m8n8k4` (sm_70): the operand
//!   fragments of the whole k-step are resident before the first HMMA (gemm
//!   on sm_70: 198 registers, 132 estimated without this); so do the
//!   `ldmatrix` loads of a stretch with an mma (sm_75+; SASS of `gemm_tuned`
//!   on sm_80: the 10 LDSM of both k-steps before the first HMMA; gemm on
//!   sm_80: 155 registers, 123 estimated without this, 150 with it), but
//!   where that needs more than
//!   [`LDMATRIX_ALL_STEPS_MAX_REGS`](crate::target::ptxas::LDMATRIX_ALL_STEPS_MAX_REGS),
//!   only the first k step's (SASS of flash attention at D = 64 on sm_90:
//!   11 of the 24 LDSM of q @ k.T before its first HMMA). In a
//!   stretch without an mma, shared loads move too, up to
//!   [`SHARED_LOAD_WINDOW_WORDS`](crate::target::ptxas::SHARED_LOAD_WINDOW_WORDS) words of their own (the cross-warp step
//!   of a reduction over axis 0: a 16 x 128 tile on 8 warps reads 32 words
//!   after the barrier, ptxas 38 registers, 21 estimated with them in place);
//!   and where the block is large, not past a budget of its registers
//!   ([`HOIST_BUDGET_DIVISOR`](crate::target::ptxas::HOIST_BUDGET_DIVISOR):
//!   half of what a thread of the block can have, 32 in a 1,024-thread
//!   block): in a kernel without an MMA, the estimate is then at most the
//!   budget or the count with the loads in place, whichever is more
//!   (generated row kernels of 1,024 threads: ptxas 32 to 55, estimated 42
//!   to 64 with the loads early, 32 to 58 now; a softmax over 4096-element
//!   rows written as a 32-warp user kernel: ptxas 32, 45 and 32);
//! * instructions that neither touch memory nor synchronise are moved down to
//!   their first reader in their block ([`sink`](order::sink)), as ptxas's scheduler does
//!   to shorten live ranges, but not past a branch, which ends ptxas's
//!   scheduling block (the in-bounds fast path's `If` around each tile
//!   access: a bf16 layer norm of 4096-element rows held its products
//!   across the next load's branch, 105 estimated, ptxas 77; 77 now) (Target IR emits, e.g., all the address arithmetic
//!   of a tile access first), except one that writes a value and frees more
//!   words than it writes (the last reads of two values in a select, a loaded
//!   value added into a carried accumulator): ptxas runs it where its
//!   operands are ready (SASS of gelu: each erf's select right after it; of a
//!   row mean: the accumulation right after the loads);
//! * above [`FULL_OCCUPANCY_REGS`](crate::target::ptxas::FULL_OCCUPANCY_REGS), in a block that sinks more
//!   compares than a thread has predicate registers
//!   ([`PREDICATE_REGS`](crate::target::ptxas::PREDICATE_REGS)), an index read only by compares goes
//!   where its first compare goes, next to the masked access ([`sink`](order::sink)'s
//!   `compares`): ptxas cannot hold the predicates, so it computes each
//!   with its index there (the masked stores of a 4096-element bf16 tile in
//!   the fast path's boundary arm: 72 estimated with the 32 indices held,
//!   ptxas 42, 43 now). Below full occupancy the indices stay early: ptxas
//!   spends registers there (the corpus's small masked kernels fall under
//!   ptxas otherwise; generated seeds 0..200: pairs above 25% 39 to 49);
//! * where that order needs more than [`CHAIN_MIN_REGS`](crate::target::ptxas::CHAIN_MIN_REGS) registers and the
//!   kernel calls no slow path (an IEEE f32 division, reciprocal or square
//!   root), instructions also sink along chains: each goes right before its
//!   first reader wherever that reader goes ([`sink`](order::sink)'s `chains`), so the
//!   per-element chains of an elementwise computation over a tile run one
//!   element after another, as ptxas interleaves them when pressure is high;
//!   the estimate is then the lower of the two orders, at least
//!   [`CHAIN_MIN_REGS`](crate::target::ptxas::CHAIN_MIN_REGS) (generated kernels: a 16 x 256 tile, 2 warps, three
//!   statements, then a column max: ptxas 48 to 53, 133 estimated statement
//!   by statement, 72 by chains; a 32 x 1024 tile, 8 warps: 32, 262, 136).
//!   With a slow-path call ptxas keeps the statement order (two divisions
//!   over 32 elements a thread: 139 registers, 79 by chains), and at 70
//!   estimated it does not reorder (ptxas 83).
//!
//! Below [`FULL_OCCUPANCY_REGS`](crate::target::ptxas::FULL_OCCUPANCY_REGS) (32: the registers a thread can have with
//! 2,048 threads resident, on every arch) registers cost no occupancy, and
//! ptxas spends some on latency: it issues loads and their address
//! arithmetic early and interleaves independent per-element chains (f8
//! conversions of four loaded bytes side by side; SASS of runtime-trip loops
//! unrolled by 4 with the loads of all four iterations first, 31 or 32
//! registers against 17 with `.pragma "nounroll"`). So the program is also
//! put in a latency order ([`ilp_order`](order::ilp_order): a list scheduler that issues the
//! ready instruction with the longest latency-weighted path first), and the
//! estimate moves `1 / `[`LATENCY_SHARE`](crate::target::ptxas::LATENCY_SHARE) of the way from the order above to
//! that one's count, up to [`FULL_OCCUPANCY_REGS`](crate::target::ptxas::FULL_OCCUPANCY_REGS). The whole latency order
//! overshoots (ptxas balances it against pressure, which the list scheduler
//! does not model): when this was added, on the generated seeds 0..200 it
//! alone gave a median error of 18%, the order above 10.8%, a quarter of
//! the way between them 9.1% (pairs over 25%: 73 to 58), with the corpus
//! within 25%.
//!
//! Thread/block ids and shared buffer addresses are rematerialised: each use
//! reads a fresh copy made right before it, as ptxas re-reads them instead of
//! holding them live. So are kernel parameters read inside a loop where
//! ptxas takes them from the constant bank there
//! ([`crate::target::ptxas::PtxasModel::loop_params_from_constant_bank`]: sm_70 to sm_89), so that they
//! are not held across the loop (`scale_all`'s grid-stride loop on sm_80: 18
//! registers, 23 estimated holding its 6 words of parameters, 19 without).
//! Outside loops ptxas reads them from the bank too, but treating them so
//! there makes the corpus worse (median 6.2%, 6 pairs above 25%, with the
//! rest of the model as it is): the straight-line kernels it shrinks are
//! those already under-estimated, where ptxas spreads values over more
//! registers than are live. An IEEE f32 division, reciprocal or square root also
//! needs the registers of the slow-path subroutine ptxas calls for it
//! ([`SLOW_DIV_REGS`](crate::target::ptxas::SLOW_DIV_REGS), [`SLOW_SQRT_REGS`](crate::target::ptxas::SLOW_SQRT_REGS)) on top of the values live there.
//! The estimate is the peak, plus the registers ptxas keeps for itself
//! ([`PTXAS_OVERHEAD`](crate::target::ptxas::PTXAS_OVERHEAD)), at least [`MIN_REGS`](crate::target::ptxas::MIN_REGS).
//!
//! Tried and left out, each making the corpus worse on its own (median and
//! count above 25%, with ptxas 12.9): merging repeated pure instructions
//! (ptxas does CSE the index and bound computations Target IR repeats per
//! access), hoisting loop invariants in front of loops, sinking chains of
//! instructions transitively everywhere (above [`CHAIN_MIN_REGS`](crate::target::ptxas::CHAIN_MIN_REGS) it is
//! kept), and keeping in place every instruction that
//! frees at least what it writes (predicate compares included: index
//! registers then die early and low-pressure kernels fall under ptxas, which
//! spreads values over more registers there). Also tried: hoisting shared
//! loads everywhere (gemm_tf32 on sm_80: 131 against 79; ptxas interleaves
//! them with the mma of the ldmatrix-less tf32 path), and stopping a load
//! at instructions that consume earlier loads of its stretch (then sm_70
//! gemm falls 39% short and the median grows to 7.4%), and issuing the
//! global loads past the window right before their first readers instead of
//! where Target IR puts them (corpus median 5.3% to 5.6%; on the kernels of
//! `tests/estimate/` worst 34.4% to 37.5%; on generated seeds 0..200 median
//! 10.9% to 12.5%). SASS (nvdisasm) shows why a pressure model
//! alone falls short: at low pressure ptxas spreads values over fresh
//! registers (relu: 22 registers touched for ~14 live), and on sm_90 it
//! unrolls longer constant loops by 4 (not modelled; run-time trip loops
//! such as `scale_all`'s it keeps rolled), holds the parameters a loop
//! reads in registers, and keeps uniform values (a grid-stride step) in
//! uniform registers, which `ptxas -v` does not count (not modelled).
//!
//! What the model misses most on kernels it was not tuned to (the
//! generated kernels of `compiler/tests/ptxas.rs`; ptxas 12.9, median error
//! 8.3% on the tuning seeds 0..200, 7.6% and 8.3% on the held-out seeds
//! 1000..1200 and 5000..5200, with 40, 59 and 67 of 600 pairs above 25%):
//!
//! * over-counts where Target IR computes an elementwise chain over a tile
//!   statement by statement, each statement for every element a thread
//!   holds, so a value read by several statements is live across all of
//!   them, while ptxas runs independent per-element chains element by
//!   element (a 32 x 1024 f32 tile, 8 warps, three statements then a row
//!   sum: 32 registers, 262 estimated by statements, 136 by chains, which
//!   still hold the loaded tile). Sinking along chains everywhere makes the
//!   corpus worse, and above 64 registers rather than [`CHAIN_MIN_REGS`](crate::target::ptxas::CHAIN_MIN_REGS) the
//!   generated kernels too. A register-pressure-aware list scheduler does
//!   not tell these kernels apart either (tried: the latency order while
//!   the words live in a stretch stay within a budget; past it, the
//!   available instruction adding the fewest words, continuing the chains
//!   it has started; arithmetic free to cross stores). Its count at any one
//!   budget from 8 to 192 words alone gives a median error of 13.6% to 18%
//!   on the tuning seeds (150 to 203 of 600 pairs above 25%); the lower of
//!   it (40 words) and the estimate, for kernels without an mma or a slow
//!   path, cuts the worst error on the held-out seeds 1000..1200 from 325%
//!   to 48% but moves the pairs above 25% from 40 to 53 on the tuning
//!   seeds and from 59 to 72 and 67 to 64 on the held-out ones. What ptxas
//!   aims for follows neither the pressure profile nor the launch bounds:
//!   the same 16 x 1024 tile on 8 warps (64 elements a thread) reduced
//!   along rows takes 73 registers loaded as 8-bit floats and 32 as bf16,
//!   where the scheduler's counts are alike (36 and 35 at 32 words, 67 and
//!   67 at 64).
//!   Counting the two 16-bit elements of a vector load as one register (a
//!   vector of four bf16 is 64 bits) changes little (tuning seeds: pairs
//!   above 25% 40 to 43, as small kernels fall lower; the bf16 tile above:
//!   72 to 70);
//! * under-counts at low pressure, where ptxas spreads values over more
//!   registers than are live (an axis-0 reduction of a 2 x 128 tile: 23
//!   registers, 14 estimated), and at high pressure in long elementwise
//!   kernels (64 bf16 elements a thread: 131 registers, 73 estimated). The
//!   latency order overshoots both ways; ptxas's own balance of latency
//!   against pressure is not modelled beyond the blend below 32;
//! * gathers: ptxas folds the per-element 64-bit addresses of a gathered row
//!   into one and immediate offsets (an embedding of 128-wide rows: 32
//!   registers, 43 estimated), where the estimate keeps one per element.
//!   Merging repeated pure instructions everywhere made the corpus worse;
//!   folding only addresses that differ by a constant into load offsets
//!   made the generated kernels worse (tuning seeds: median 8.3% to 8.8%,
//!   pairs above 25% 40 to 50) and left that embedding at 43, whose peak is
//!   elsewhere.

//! # Cost
//!
//! Linear in the kernel's length, up to logarithmic factors: liveness keeps
//! one running set and copies sets only at jump targets ([`max_pressure`](liveness::max_pressure)),
//! [`sink`](order::sink) finds first readers by binary search in per-register index
//! lists, and [`hoist_loads`](order::hoist_loads) decides what is blocked in one forward pass;
//! [`ilp_order`](order::ilp_order) is a list scheduler with a binary heap (n log n), and
//! [`unrolled_by_four`](unroll::unrolled_by_four) repeats only bodies of at most
//! [`UNROLL_BY_FOUR_MAX_INSTS`](crate::target::ptxas::UNROLL_BY_FOUR_MAX_INSTS) instructions. Every pass calls
//! `cancel::checkpoint` once per instruction or position, so that the
//! language server can cancel an estimate whose input changed.
//! Liveness repeats its sweep (loop nesting depth + 2 times), and the
//! conversion from Target IR recurses over nested regions, so both also
//! grow with loop and branch nesting depth. Under `cfg(test)` the estimate
//! counts its steps (`work`), and a test checks that twice the length costs
//! about twice the steps (about 34 a Target IR instruction).

pub mod amd;
mod liveness;
mod llvm_ir;
mod order;
mod program;
mod report;
#[cfg(test)]
mod tests;
mod unroll;

use crate::target::ptxas::{
    CHAIN_MIN_REGS, FULL_OCCUPANCY_REGS, HOIST_BUDGET_DIVISOR, LATENCY_SHARE,
    LDMATRIX_ALL_STEPS_MAX_REGS, PREDICATE_REGS,
};

pub use liveness::{estimate_regs, max_pressure};
pub use program::program_of;
use program::{program_with, slow_path_scratch, Hoist};
pub use report::{render_json, render_table, AmdRegs, Resources};

/// A structured per-thread program, as far as register liveness is concerned.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// One instruction: the registers it writes and reads.
    Inst { defs: Vec<u32>, uses: Vec<u32> },
    /// Reads `uses` and may leave the innermost enclosing loop (a loop's test).
    Test { uses: Vec<u32> },
    /// A loop: `entry` runs once (e.g. reading the bounds and writing the
    /// induction variable), then `body` repeats until one of its [`Node::Test`]s
    /// leaves it; the loop may also be skipped right after `entry`.
    Loop { entry: Box<Node>, body: Vec<Node> },
    /// A two-way branch on `cond`.
    Branch {
        cond: Vec<u32>,
        then: Vec<Node>,
        otherwise: Vec<Node>,
    },
}

#[cfg(test)]
thread_local! {
    /// Steps of the estimate's work on this thread, for tests that check the
    /// estimate's cost grows linearly (timings are too noisy to tell).
    static WORK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts `steps` units of the estimate's work: an instruction or position
/// visited, a register read or written there, a set member copied, a probe of
/// a binary search.
#[inline]
fn work(steps: usize) {
    #[cfg(test)]
    WORK.with(|w| w.set(w.get() + steps as u64));
    #[cfg(not(test))]
    let _ = steps;
}

/// The counts of the orders the estimate weighs, for the study of its
/// misses (`compiler/tests/ptxas.rs`'s `TESSERA_ESTIMATE_DUMP`): statement
/// order, chains ([`sink`]'s `chains`), latency order ([`ilp_order`]).
pub fn order_estimates(kernel: &crate::ir::target::Kernel) -> [u32; 3] {
    let estimate = |chains, ilp| {
        let (program, widths) = program_with(kernel, Hoist::All, chains, ilp, false);
        let words = |r: u32| widths.get(r as usize).copied().unwrap_or(1);
        estimate_regs(&program, &words)
    };
    [
        estimate(false, false),
        estimate(true, false),
        estimate(false, true),
    ]
}

/// The resources of a Target IR kernel.
///
/// Where the estimate exceeds [`CHAIN_MIN_REGS`] and no slow-path call
/// splits the kernel, it is the lower of the statement order's and the
/// chains' (see the module docs), at least [`CHAIN_MIN_REGS`].
///
/// Loads issued early are latency hiding that ptxas gives up where registers
/// run out: where that order needs more registers than a thread can have but
/// Target IR's own order does not, ptxas issues them only as early as the
/// limit allows, and the estimate is the limit (flash attention with `D = 64`
/// on sm_80 and sm_90: 255 and 254 registers, no spills; 256 to 263
/// estimated with every load early, 237 to 239 with none). In a kernel
/// without an MMA they stop earlier, at half the registers a thread of the
/// block can have ([`HOIST_BUDGET_DIVISOR`]; module docs).
pub fn of_target(kernel: &crate::ir::target::Kernel) -> Resources {
    if kernel.arch.info().amd.is_some() {
        return amd::of_target(kernel);
    }
    let estimate_with = |hoist, chains, compares| {
        let (program, widths) = program_with(kernel, hoist, chains, false, compares);
        let words = |r: u32| widths.get(r as usize).copied().unwrap_or(1);
        estimate_regs(&program, &words)
    };
    let estimate = |hoist, chains| estimate_with(hoist, chains, false);
    let max = crate::backend::occupancy::max_regs_in_block(kernel.arch, kernel.num_threads);
    // Past full occupancy ptxas saves registers: compares run next to the
    // accesses they guard, with their indices (see `sink`'s `compares`).
    // Below it, where ptxas spends registers on latency, the indices stay
    // early (the corpus's small masked kernels: a grid-stride fill, a
    // histogram). Only where a block has more compares than predicate
    // registers can it differ.
    fn many_compares(insts: &[crate::ir::target::Inst]) -> bool {
        insts
            .iter()
            .filter(|i| matches!(i, crate::ir::target::Inst::Cmp { .. }))
            .count()
            > PREDICATE_REGS
            || insts
                .iter()
                .any(|i| i.regions().into_iter().any(|r| many_compares(r)))
    }
    let mut regs = estimate(Hoist::All, false);
    if regs > FULL_OCCUPANCY_REGS && many_compares(&kernel.body) {
        regs = estimate_with(Hoist::All, false, true);
    }
    // Past this many registers ptxas keeps only the next k step's `ldmatrix`
    // fragments ahead of the MMAs, not every step's (flash attention at
    // D = 64, sm_80 / sm_90: 174 registers; 237 estimated with all four k
    // steps' fragments of q @ k.T resident, 188 with one; the GEMM
    // mainloops, under it, hold all of theirs).
    if regs > LDMATRIX_ALL_STEPS_MAX_REGS {
        regs = regs.min(estimate(Hoist::OneKStep, false));
    }
    if regs < FULL_OCCUPANCY_REGS {
        // Registers are free up to full occupancy: ptxas trades some of them
        // for latency (see the module docs).
        let (program, widths) = program_with(kernel, Hoist::All, false, true, false);
        let words = |r: u32| widths.get(r as usize).copied().unwrap_or(1);
        let latency_order = estimate_regs(&program, &words);
        let toward = latency_order.saturating_sub(regs) / LATENCY_SHARE;
        regs = (regs + toward).min(FULL_OCCUPANCY_REGS);
    }
    fn has_mma(insts: &[crate::ir::target::Inst]) -> bool {
        insts.iter().any(|i| {
            matches!(
                i,
                crate::ir::target::Inst::Mma { .. } | crate::ir::target::Inst::Wgmma { .. }
            ) || i.regions().into_iter().any(|r| has_mma(r))
        })
    }
    fn calls_slow_path(
        insts: &[crate::ir::target::Inst],
        tys: &[crate::ir::target::RegTy],
    ) -> bool {
        insts.iter().any(|i| {
            slow_path_scratch(i, tys, crate::target::Vendor::Nvidia) > 0
                || i.regions().into_iter().any(|r| calls_slow_path(r, tys))
        })
    }
    if regs > CHAIN_MIN_REGS && !calls_slow_path(&kernel.body, &kernel.regs) {
        regs = regs.min(estimate(Hoist::All, true).max(CHAIN_MIN_REGS));
    }
    // Early loads stop at a budget of the block's registers (1,024-thread
    // blocks: 32). The MMA operand fragments of a tensor-core loop are
    // another matter (the `ldmatrix` steps above).
    let budget = max / HOIST_BUDGET_DIVISOR;
    if regs > budget && !has_mma(&kernel.body) {
        regs = regs.min(estimate(Hoist::No, false).max(budget));
    }
    if regs > max && estimate(Hoist::No, false) <= max {
        regs = max;
    }
    Resources::new(
        kernel.name.clone(),
        kernel.arch,
        kernel.num_threads,
        regs,
        kernel.smem_bytes(),
    )
}
