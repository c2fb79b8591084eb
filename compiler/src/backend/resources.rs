//! Resource report: what one kernel costs on one arch.
//!
//! * threads per block: `num_warps * warp_size`;
//! * registers per thread: the peak of 32-bit register pressure of the per-thread
//!   program ([`max_pressure`]), from liveness over a structured program
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
//!   iterations ([`unroll_short_loops`]), branches on what is then constant
//!   folded, as ptxas unrolls it there (SASS of `row_sum4` on sm_90: the
//!   loads of its live iterations issued together, 23 registers; 16 on
//!   sm_80, which keeps the loop);
//! * a loop of at most [`UNROLL_BY_FOUR_MAX_INSTS`] instructions, none of
//!   them a loop, store, barrier or mma, whose trips are known only at run
//!   time (or are constant, at least 4 and too many to unroll completely),
//!   repeats its body four times a trip ([`unrolled_by_four`]), as ptxas
//!   unrolls it by 4 on every arch so that the loads of four iterations are
//!   issued together (generated row reductions over a runtime `K`: 31 or 32
//!   registers, 17 to 23 with `.pragma "nounroll"`);
//! * loads are issued early ([`hoist_loads`]): within a stretch of a block
//!   between stores, barriers, atomics, async copies and nested regions, the
//!   global loads (with the pure instructions computing their addresses and
//!   masks) move to the start of the stretch, as ptxas batches loads to cover
//!   their latency, up to [`LOAD_WINDOW_WORDS`] loaded words (all of them where
//!   the stretch has an mma; `convert` on sm_90: 34 registers, 49 estimated
//!   without the window, 37 with it) (SASS: the `w` and `b` loads of a layer norm's last statement are
//!   issued before its multiplies, 64 registers on every arch). Shared loads
//!   move too where the stretch feeds `mma.m8n8k4` (sm_70): the operand
//!   fragments of the whole k-step are resident before the first HMMA (gemm
//!   on sm_70: 198 registers, 132 estimated without this); so do the
//!   `ldmatrix` loads of a stretch with an mma (sm_75+; SASS of `gemm_tuned`
//!   on sm_80: the 10 LDSM of both k-steps before the first HMMA; gemm on
//!   sm_80: 155 registers, 123 estimated without this, 150 with it). In a
//!   stretch without an mma, shared loads move too, up to
//!   [`SHARED_LOAD_WINDOW_WORDS`] words of their own (the cross-warp step
//!   of a reduction over axis 0: a 16 x 128 tile on 8 warps reads 32 words
//!   after the barrier, ptxas 38 registers, 21 estimated with them in place);
//! * instructions that neither touch memory nor synchronise are moved down to
//!   their first reader in their block ([`sink`]), as ptxas's scheduler does
//!   to shorten live ranges (Target IR emits, e.g., all the address arithmetic
//!   of a tile access first), except one that writes a value and frees more
//!   words than it writes (the last reads of two values in a select, a loaded
//!   value added into a carried accumulator): ptxas runs it where its
//!   operands are ready (SASS of gelu: each erf's select right after it; of a
//!   row mean: the accumulation right after the loads);
//! * where that order needs more than [`CHAIN_MIN_REGS`] registers and the
//!   kernel calls no slow path (an IEEE f32 division, reciprocal or square
//!   root), instructions also sink along chains: each goes right before its
//!   first reader wherever that reader goes ([`sink`]'s `chains`), so the
//!   per-element chains of an elementwise computation over a tile run one
//!   element after another, as ptxas interleaves them when pressure is high;
//!   the estimate is then the lower of the two orders, at least
//!   [`CHAIN_MIN_REGS`] (generated kernels: a 16 x 256 tile, 2 warps, three
//!   statements, then a column max: ptxas 48 to 53, 133 estimated statement
//!   by statement, 72 by chains; a 32 x 1024 tile, 8 warps: 32, 262, 136).
//!   With a slow-path call ptxas keeps the statement order (two divisions
//!   over 32 elements a thread: 139 registers, 79 by chains), and at 70
//!   estimated it does not reorder (ptxas 83).
//!
//! Below [`FULL_OCCUPANCY_REGS`] (32: the registers a thread can have with
//! 2,048 threads resident, on every arch) registers cost no occupancy, and
//! ptxas spends some on latency: it issues loads and their address
//! arithmetic early and interleaves independent per-element chains (f8
//! conversions of four loaded bytes side by side; SASS of runtime-trip loops
//! unrolled by 4 with the loads of all four iterations first, 31 or 32
//! registers against 17 with `.pragma "nounroll"`). So the program is also
//! put in a latency order ([`ilp_order`]: a list scheduler that issues the
//! ready instruction with the longest latency-weighted path first), and the
//! estimate moves `1 / `[`LATENCY_SHARE`] of the way from the order above to
//! that one's count, up to [`FULL_OCCUPANCY_REGS`]. The whole latency order
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
//! ([`SLOW_DIV_REGS`], [`SLOW_SQRT_REGS`]) on top of the values live there.
//! The estimate is the peak, plus the registers ptxas keeps for itself
//! ([`PTXAS_OVERHEAD`]), at least [`MIN_REGS`].
//!
//! Tried and left out, each making the corpus worse on its own (median and
//! count above 25%, with ptxas 12.9): merging repeated pure instructions
//! (ptxas does CSE the index and bound computations Target IR repeats per
//! access), hoisting loop invariants in front of loops, sinking chains of
//! instructions transitively everywhere (above [`CHAIN_MIN_REGS`] it is
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
//!   corpus worse, and above 64 registers rather than [`CHAIN_MIN_REGS`] the
//!   generated kernels too;
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
//! one running set and copies sets only at jump targets ([`max_pressure`]),
//! [`sink`] finds first readers by binary search in per-register index
//! lists, and [`hoist_loads`] decides what is blocked in one forward pass;
//! [`ilp_order`] is a list scheduler with a binary heap (n log n), and
//! [`unrolled_by_four`] repeats only bodies of at most
//! [`UNROLL_BY_FOUR_MAX_INSTS`] instructions. Every pass calls
//! `cancel::checkpoint` once per instruction or position, so that the
//! language server can cancel an estimate whose input changed.
//! Liveness repeats its sweep (loop nesting depth + 2 times), and the
//! conversion from Target IR recurses over nested regions, so both also
//! grow with loop and branch nesting depth. Under `cfg(test)` the estimate
//! counts its steps (`work`), and a test checks that twice the length costs
//! about twice the steps (about 34 a Target IR instruction).

use std::fmt::Write as _;

use rustc_hash::{FxHashMap, FxHashSet};
use serde_json::json;

use super::occupancy::{occupancy, BlockUsage, Carveout, Limiter, Occupancy};
use crate::diag::Diagnostic;
use crate::syntax::span::Span;
use crate::target::Arch;

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

use crate::target::ptxas::{
    CHAIN_MIN_REGS, FULL_OCCUPANCY_REGS, LATENCY_SHARE, LOAD_WINDOW_WORDS, MIN_REGS,
    PTXAS_OVERHEAD, SHARED_LOAD_WINDOW_WORDS, SLOW_DIV_REGS, SLOW_SQRT_REGS,
    UNROLL_BY_FOUR_MAX_INSTS,
};

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

/// The control-flow graph of a program: per position, what it writes and reads
/// and where control goes next.
#[derive(Default)]
struct Cfg {
    defs: Vec<Vec<u32>>,
    uses: Vec<Vec<u32>>,
    succ: Vec<Vec<usize>>,
    /// Exits (test positions) of each loop being built, innermost last.
    exits: Vec<Vec<usize>>,
}

impl Cfg {
    fn position(&mut self, defs: &[u32], uses: &[u32]) -> usize {
        self.defs.push(defs.to_vec());
        self.uses.push(uses.to_vec());
        self.succ.push(Vec::new());
        self.defs.len() - 1
    }

    fn link(&mut self, from: &[usize], to: usize) {
        for &f in from {
            self.succ[f].push(to);
        }
    }

    /// Builds `nodes` in sequence; returns the first position (if any) and the
    /// positions whose successor is whatever follows.
    fn seq(&mut self, nodes: &[Node]) -> (Option<usize>, Vec<usize>) {
        let mut first = None;
        let mut open: Vec<usize> = Vec::new();
        for n in nodes {
            let (entry, out) = self.node(n);
            if first.is_none() {
                first = Some(entry);
            } else {
                self.link(&open, entry);
            }
            open = out;
        }
        (first, open)
    }

    fn node(&mut self, n: &Node) -> (usize, Vec<usize>) {
        match n {
            Node::Inst { defs, uses } => {
                let p = self.position(defs, uses);
                (p, vec![p])
            }
            Node::Test { uses } => {
                let p = self.position(&[], uses);
                if let Some(exits) = self.exits.last_mut() {
                    exits.push(p);
                }
                (p, vec![p])
            }
            Node::Loop { entry, body } => {
                let (e, mut out) = self.node(entry);
                self.exits.push(Vec::new());
                let (start, end) = self.seq(body);
                let exits = self.exits.pop().unwrap_or_default();
                if let Some(start) = start {
                    self.link(&out, start);
                    self.link(&end, start);
                }
                // Skipped after the entry, or left at a test.
                out.extend(exits);
                (e, out)
            }
            Node::Branch {
                cond,
                then,
                otherwise,
            } => {
                let p = self.position(&[], cond);
                let mut out = Vec::new();
                for arm in [then, otherwise] {
                    match self.seq(arm) {
                        (Some(first), end) => {
                            self.link(&[p], first);
                            out.extend(end);
                        }
                        (None, _) => out.push(p),
                    }
                }
                (p, out)
            }
        }
    }
}

/// A set of registers as bits, with the total width of its members and the
/// words of the bit array it has touched since it was last cleared (so that
/// clearing costs what was inserted, not the size of the register file).
struct LiveSet {
    bits: Vec<u64>,
    touched: Vec<usize>,
    weight: u64,
}

impl LiveSet {
    fn new(nregs: usize) -> Self {
        LiveSet {
            bits: vec![0; nregs.div_ceil(64)],
            touched: Vec::new(),
            weight: 0,
        }
    }
    fn insert(&mut self, r: u32, words: &dyn Fn(u32) -> u32) {
        let w = &mut self.bits[r as usize / 64];
        if *w & (1 << (r % 64)) == 0 {
            if *w == 0 {
                self.touched.push(r as usize / 64);
            }
            *w |= 1 << (r % 64);
            self.weight += u64::from(words(r));
        }
    }
    fn remove(&mut self, r: u32, words: &dyn Fn(u32) -> u32) {
        let w = &mut self.bits[r as usize / 64];
        if *w & (1 << (r % 64)) != 0 {
            *w &= !(1 << (r % 64));
            self.weight -= u64::from(words(r));
        }
    }
    fn clear(&mut self) {
        work(self.touched.len());
        for i in self.touched.drain(..) {
            self.bits[i] = 0;
        }
        self.weight = 0;
    }
    /// The members, ascending.
    fn members(&mut self) -> Vec<u32> {
        work(self.touched.len());
        self.touched.sort_unstable();
        self.touched.dedup();
        self.touched.retain(|&i| self.bits[i] != 0);
        let mut out = Vec::new();
        for &i in &self.touched {
            let mut rest = self.bits[i];
            while rest != 0 {
                work(1);
                out.push((i * 64) as u32 + rest.trailing_zeros());
                rest &= rest - 1;
            }
        }
        out
    }
}

/// Peak 32-bit register pressure of a program whose register `r` is
/// `words(r)` words wide (see the module docs for the model).
///
/// Liveness runs backward over the positions with one running set: a
/// position whose only successor is the next one takes that one's live-in
/// set as it stands, so only jump targets (loop starts, the first position of
/// a branch's second arm, the positions after loops and branches) keep a copy
/// of their live-in set between sweeps. Sweeps repeat until those copies stop
/// changing (loop nesting depth + 2 sweeps for structured code), and each
/// sweep costs the program's length plus the sizes of the sets it copies, not
/// positions times registers.
pub fn max_pressure(program: &[Node], words: &dyn Fn(u32) -> u32) -> u32 {
    let mut cfg = Cfg::default();
    cfg.seq(program);
    let n = cfg.defs.len();
    let nregs = cfg
        .defs
        .iter()
        .chain(&cfg.uses)
        .flatten()
        .map(|&r| r as usize + 1)
        .max()
        .unwrap_or(0);
    // Positions reached other than by falling through from the one before.
    let mut target = vec![false; n];
    for (p, succ) in cfg.succ.iter().enumerate() {
        for &s in succ {
            if s != p + 1 {
                target[s] = true;
            }
        }
    }
    let mut saved: Vec<Option<Vec<u32>>> = vec![None; n];
    let mut live = LiveSet::new(nregs);
    loop {
        let mut changed = false;
        let mut peak = 0u64;
        live.clear();
        for p in (0..n).rev() {
            crate::cancel::checkpoint();
            work(1 + cfg.succ[p].len() + cfg.defs[p].len() + cfg.uses[p].len());
            // `live` is the live-in set of p + 1: make it p's live-out set.
            if !cfg.succ[p].contains(&(p + 1)) {
                live.clear();
            }
            for &s in &cfg.succ[p] {
                if s != p + 1 {
                    work(saved[s].as_ref().map_or(0, Vec::len));
                    for &r in saved[s].iter().flatten() {
                        live.insert(r, words);
                    }
                }
            }
            for &d in &cfg.defs[p] {
                live.insert(d, words);
            }
            let with_defs = live.weight;
            for &d in &cfg.defs[p] {
                live.remove(d, words);
            }
            for &u in &cfg.uses[p] {
                live.insert(u, words);
            }
            peak = peak.max(with_defs).max(live.weight);
            if target[p] {
                let members = live.members();
                if saved[p].as_ref() != Some(&members) {
                    saved[p] = Some(members);
                    changed = true;
                }
            }
        }
        if !changed {
            return u32::try_from(peak).unwrap_or(u32::MAX);
        }
    }
}

/// The register estimate reported for a program: peak pressure plus ptxas's
/// overhead, at least [`MIN_REGS`].
pub fn estimate_regs(program: &[Node], words: &dyn Fn(u32) -> u32) -> u32 {
    (max_pressure(program, words) + PTXAS_OVERHEAD).max(MIN_REGS)
}

/// What one kernel costs on one arch.
#[derive(Clone, Debug, PartialEq)]
pub struct Resources {
    pub kernel: String,
    pub arch: Arch,
    pub threads: u32,
    /// Estimated registers per thread (may exceed the arch's maximum: a spill).
    pub regs: u32,
    /// Shared memory per block in bytes (static and dynamic).
    pub smem_bytes: u32,
    /// Occupancy at `min(regs, max_regs_per_thread)`: beyond the maximum ptxas
    /// spills rather than refusing the kernel.
    pub occupancy: Occupancy,
}

impl Resources {
    pub fn new(
        kernel: impl Into<String>,
        arch: Arch,
        threads: u32,
        regs: u32,
        smem_bytes: u32,
    ) -> Self {
        let max = arch.info().max_regs_per_thread;
        let occupancy = occupancy(
            arch,
            BlockUsage {
                threads,
                regs_per_thread: regs.min(max),
                smem_bytes,
            },
            Carveout::Default,
        );
        Resources {
            kernel: kernel.into(),
            arch,
            threads,
            regs,
            smem_bytes,
            occupancy,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "kernel": self.kernel,
            "arch": self.arch.name(),
            "threads": self.threads,
            "regs": self.regs,
            "smem_bytes": self.smem_bytes,
            "occupancy": self.occupancy.occupancy(),
            "blocks_per_sm": self.occupancy.blocks_per_sm,
            "limiter": self.occupancy.limiter().name(),
        })
    }

    /// W0003 (likely spill), W0004 (occupancy under 25%) and, when not one block
    /// fits on an SM, the E06xx error of the resource that does not fit. `span`
    /// is where to point (the kernel's name).
    pub fn diagnostics(&self, span: Span) -> Vec<Diagnostic> {
        self.diagnostics_hiding(span, false)
    }

    /// [`Resources::diagnostics`] of a kernel that does or does not hide
    /// memory latency within a warp (`target::Kernel::hides_latency`): low
    /// occupancy is W0004 (a warning) where nothing else hides latency, and
    /// the note W0006 where tensor cores or pipelined copies do, since such
    /// kernels are fast at low occupancy and a warning there would teach
    /// users to ignore W0004.
    pub fn diagnostics_hiding(&self, span: Span, hides_latency: bool) -> Vec<Diagnostic> {
        let info = self.arch.info();
        let mut out = Vec::new();
        let occ = &self.occupancy;
        if self.regs > info.max_regs_per_thread {
            out.push(
                Diagnostic::new(
                    "W0003",
                    span,
                    format!(
                        "kernel `{}` likely spills registers on {}: an estimated {} registers per thread, more than the {} a thread can have",
                        self.kernel, info.name, self.regs, info.max_regs_per_thread
                    ),
                )
                .with_help("use smaller tiles or more warps (`num_warps=`) so that each thread holds fewer elements"),
            );
        }
        if occ.blocks_per_sm == 0 {
            let limiter = occ.limiter();
            let (code, what) = match limiter {
                Limiter::Warps | Limiter::Blocks => (
                    "E0604",
                    format!("{} threads per block, more than the {} of {}", self.threads, info.max_threads_per_block, info.name),
                ),
                Limiter::Registers => (
                    "E0602",
                    format!(
                        "{} registers per block ({} threads x {} registers, allocated per warp), more than the {} of {}",
                        occ.regs_per_block,
                        self.threads,
                        self.regs.min(info.max_regs_per_thread),
                        info.regs_per_block,
                        info.name
                    ),
                ),
                Limiter::SharedMemory => (
                    "E0603",
                    format!(
                        "{} bytes of shared memory per block (with the driver's reserve), more than the {} a block can use on {}",
                        occ.smem_per_block,
                        info.max_smem_per_block + info.smem_reserved_per_block,
                        info.name
                    ),
                ),
            };
            out.push(
                Diagnostic::new(
                    code,
                    span,
                    format!(
                        "kernel `{}` cannot run on {}: {what}",
                        self.kernel, info.name
                    ),
                )
                .with_help(
                    "use smaller tiles, fewer pipeline stages (`num_stages=`) or fewer warps",
                ),
            );
        } else if occ.occupancy() < 0.25 && hides_latency {
            out.push(
                Diagnostic::new(
                    "W0006",
                    span,
                    format!(
                        "kernel `{}` has {:.1}% occupancy on {} ({} warps of {} per SM), limited by {}; its tensor-core or pipelined loop hides memory latency",
                        self.kernel,
                        occ.occupancy() * 100.0,
                        info.name,
                        occ.active_warps,
                        occ.max_warps_per_sm,
                        occ.limiter().name().replace('_', " ")
                    ),
                )
                .with_primary_label("low occupancy, latency hidden")
                .with_help("no action needed: tensor-core and software-pipelined kernels (cuBLAS's GEMMs too) run well at 12-25%; measure before trading tile size for occupancy"),
            );
        } else if occ.occupancy() < 0.25 {
            out.push(
                Diagnostic::new(
                    "W0004",
                    span,
                    format!(
                        "kernel `{}` has {:.1}% occupancy on {} ({} warps of {} per SM), limited by {}",
                        self.kernel,
                        occ.occupancy() * 100.0,
                        info.name,
                        occ.active_warps,
                        occ.max_warps_per_sm,
                        occ.limiter().name().replace('_', " ")
                    ),
                )
                .with_help(match occ.limiter() {
                    Limiter::Registers => "fewer live values per thread (smaller tiles, or more warps) raise occupancy",
                    Limiter::SharedMemory => "smaller dot tiles or fewer pipeline stages (`num_stages=`) use less shared memory",
                    Limiter::Warps | Limiter::Blocks => "more warps per block (`num_warps=`) raise occupancy",
                }),
            );
        }
        out
    }
}

/// The report as a table: one row per kernel.
pub fn render_table(rows: &[Resources]) -> String {
    let header = [
        "kernel",
        "arch",
        "threads",
        "regs",
        "smem_bytes",
        "occupancy",
        "blocks/SM",
        "limiter",
    ];
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.kernel.clone(),
                r.arch.name().to_string(),
                r.threads.to_string(),
                r.regs.to_string(),
                r.smem_bytes.to_string(),
                format!("{:.1}%", r.occupancy.occupancy() * 100.0),
                r.occupancy.blocks_per_sm.to_string(),
                r.occupancy
                    .limiters()
                    .iter()
                    .map(|l| l.name())
                    .collect::<Vec<_>>()
                    .join("+"),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, row: &[&str]| {
        for (i, (c, w)) in row.iter().zip(widths).enumerate() {
            // Text left-aligned, numbers right-aligned.
            if i + 1 == row.len() {
                let _ = writeln!(out, "{c}");
            } else if i < 2 {
                let _ = write!(out, "{c:<w$}  ");
            } else {
                let _ = write!(out, "{c:>w$}  ");
            }
        }
    };
    line(&mut out, &header);
    for row in &cells {
        let r: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&mut out, &r);
    }
    out
}

/// The report as JSON: an array of objects.
pub fn render_json(rows: &[Resources]) -> String {
    let v: Vec<serde_json::Value> = rows.iter().map(Resources::to_json).collect();
    serde_json::to_string_pretty(&v).expect("JSON of plain values")
}

// ---- From Target IR ----

/// Registers whose value ptxas re-creates wherever it is needed instead of
/// holding it: special registers (thread and block ids, re-read with `S2R`
/// next to each use rather than kept live across a loop or a long stretch of
/// code) and shared-memory buffer addresses (immediates). Only
/// single-definition registers qualify. Kernel parameters are too, inside
/// loops only, on archs where ptxas reads them from the constant bank there
/// (see the module docs).
struct Remat {
    /// Per register: whether it is rematerialised.
    remat: Vec<bool>,
    /// Words of every register, the fresh ones (one per use) included.
    words: Vec<u32>,
    /// The types of the kernel's registers (and of the fresh ones).
    tys: Vec<crate::ir::target::RegTy>,
    /// Per register of the kernel: how many instructions write it.
    def_count: Vec<u32>,
    /// Registers written once, by a move of an integer immediate.
    consts: std::collections::HashMap<u32, i64>,
    /// The most trips of a loop ptxas unrolls completely on the kernel's arch.
    max_unroll_trips: u32,
    /// Per register: whether it is a kernel parameter (written once) that
    /// ptxas reads from the constant bank inside loops on the kernel's arch
    /// (see [`crate::target::ptxas::PtxasModel::loop_params_from_constant_bank`]).
    bank_param: Vec<bool>,
    /// How many loops enclose the instructions being converted.
    loop_depth: u32,
    /// Whether loads are issued early ([`hoist_loads`]).
    hoist: bool,
    /// Whether pure instructions sink along chains ([`sink`]'s `chains`).
    chains: bool,
    /// Whether blocks run in [`ilp_order`] instead.
    ilp: bool,
}

impl Remat {
    fn new(kernel: &crate::ir::target::Kernel) -> Self {
        use crate::ir::target::Inst;
        use crate::ir::target::Operand;
        fn walk(
            insts: &[Inst],
            defs: &mut [u32],
            cheap: &mut [bool],
            imm: &mut std::collections::HashMap<u32, i64>,
            param: &mut [bool],
        ) {
            for i in insts {
                for r in i.defs() {
                    defs[r.0 as usize] += 1;
                    if matches!(i, Inst::Special { .. } | Inst::SmemAddr { .. }) {
                        cheap[r.0 as usize] = true;
                    }
                    if matches!(i, Inst::Param { .. }) {
                        param[r.0 as usize] = true;
                    }
                }
                if let Inst::Mov {
                    dst,
                    src: Operand::Int(v),
                } = i
                {
                    imm.insert(dst.0, *v);
                }
                for region in i.regions() {
                    walk(region, defs, cheap, imm, param);
                }
            }
        }
        let n = kernel.regs.len();
        let mut defs = vec![0; n];
        let mut cheap = vec![false; n];
        let mut imm = std::collections::HashMap::new();
        let mut param = vec![false; n];
        walk(&kernel.body, &mut defs, &mut cheap, &mut imm, &mut param);
        imm.retain(|r, _| defs[*r as usize] == 1);
        let bank = kernel.arch.ptxas().loop_params_from_constant_bank;
        Remat {
            remat: (0..n).map(|r| cheap[r] && defs[r] == 1).collect(),
            bank_param: (0..n).map(|r| bank && param[r] && defs[r] == 1).collect(),
            words: kernel.regs.iter().map(|t| t.words()).collect(),
            tys: kernel.regs.clone(),
            def_count: defs,
            consts: imm,
            max_unroll_trips: kernel.arch.ptxas().full_unroll_max_trips,
            loop_depth: 0,
            hoist: true,
            chains: false,
            ilp: false,
        }
    }

    /// A new register of `r`'s type.
    fn fresh_like(&mut self, r: u32) -> u32 {
        self.tys.push(self.tys[r as usize]);
        self.fresh(self.words[r as usize])
    }

    fn is_remat(&self, r: u32) -> bool {
        self.remat.get(r as usize).copied().unwrap_or(false)
    }

    /// A new register of `words` words.
    fn fresh(&mut self, words: u32) -> u32 {
        self.words.push(words);
        self.words.len() as u32 - 1
    }

    /// Whether a use of `r` here reads a copy made for it rather than `r`
    /// itself: `r` is rematerialised, or is a parameter read from the
    /// constant bank inside a loop.
    fn fresh_at_use(&self, r: u32) -> bool {
        self.is_remat(r)
            || (self.loop_depth > 0 && self.bank_param.get(r as usize).copied().unwrap_or(false))
    }

    /// `uses` with every register read from a copy ([`Remat::fresh_at_use`])
    /// replaced by a fresh one that `out` defines right before (live only up
    /// to this use).
    fn uses(&mut self, uses: Vec<u32>, out: &mut Vec<Node>) -> Vec<u32> {
        uses.into_iter()
            .map(|r| {
                if !self.fresh_at_use(r) {
                    return r;
                }
                let fresh = self.words.len() as u32;
                self.words.push(self.words[r as usize]);
                out.push(Node::Inst {
                    defs: vec![fresh],
                    uses: vec![],
                });
                fresh
            })
            .collect()
    }
}

/// The structured program of a Target IR kernel, for [`max_pressure`], and the
/// width in words of each of its registers. A `For`
/// loop's entry writes the induction variable from its bounds; the increment
/// and the test at the end of every iteration read it with the bound and step,
/// so registers holding those stay live through the loop. A `While` loop
/// repeats its condition, the test of its predicate (where it is left), and its
/// body. Each block is first put in [`hoist_loads`] and [`sink`] order. Thread/block ids and shared
/// buffer addresses are not held: each use reads a fresh copy defined right
/// before it (see `Remat`).
pub fn program_of(kernel: &crate::ir::target::Kernel) -> (Vec<Node>, Vec<u32>) {
    program_with(kernel, true, false, false)
}

/// [`program_of`], with loads issued early (`hoist`) or left where Target IR
/// puts them.
fn program_with(
    kernel: &crate::ir::target::Kernel,
    hoist: bool,
    chains: bool,
    ilp: bool,
) -> (Vec<Node>, Vec<u32>) {
    fn convert(insts: &[crate::ir::target::Inst], rm: &mut Remat) -> Vec<Node> {
        use crate::ir::target::Inst;
        let mut out = Vec::with_capacity(insts.len());
        let insts = unroll_short_loops(insts, rm);
        let order = if rm.ilp {
            ilp_order(&insts)
        } else if rm.hoist {
            sink(&hoist_loads(&insts), &rm.tys, rm.chains)
        } else {
            sink(&insts.iter().collect::<Vec<_>>(), &rm.tys, rm.chains)
        };
        for inst in order {
            crate::cancel::checkpoint();
            work(1);
            let regs =
                |v: Vec<crate::ir::target::Reg>| v.into_iter().map(|r| r.0).collect::<Vec<_>>();
            if inst.defs().iter().any(|r| rm.is_remat(r.0)) {
                continue;
            }
            match inst {
                Inst::Comment(_) => {}
                Inst::For { iv, body, .. } => {
                    let bounds = regs(inst.uses());
                    rm.loop_depth += 1;
                    let mut b = convert(body, rm);
                    let mut step_uses = rm.uses(bounds.clone(), &mut b);
                    rm.loop_depth -= 1;
                    step_uses.push(iv.0);
                    b.push(Node::Inst {
                        defs: vec![iv.0],
                        uses: step_uses.clone(),
                    });
                    b.push(Node::Test { uses: step_uses });
                    let entry_uses = rm.uses(bounds, &mut out);
                    out.push(Node::Loop {
                        entry: Box::new(Node::Inst {
                            defs: vec![iv.0],
                            uses: entry_uses,
                        }),
                        body: b,
                    });
                }
                Inst::While { cond, pred, body } => {
                    rm.loop_depth += 1;
                    let mut b = convert(cond, rm);
                    b.push(Node::Test { uses: vec![pred.0] });
                    b.extend(convert(body, rm));
                    rm.loop_depth -= 1;
                    out.push(Node::Loop {
                        entry: Box::new(Node::Inst {
                            defs: vec![],
                            uses: vec![],
                        }),
                        body: b,
                    });
                }
                Inst::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    let cond = rm.uses(vec![cond.0], &mut out);
                    let then = convert(then, rm);
                    let otherwise = convert(otherwise, rm);
                    out.push(Node::Branch {
                        cond,
                        then,
                        otherwise,
                    })
                }
                other => {
                    let uses = rm.uses(regs(other.uses()), &mut out);
                    let mut defs = regs(other.defs());
                    let scratch = slow_path_scratch(other, &rm.tys);
                    if scratch > 0 {
                        // The subroutine's own registers: a value written
                        // here and never read.
                        defs.push(rm.fresh(scratch));
                    }
                    out.push(Node::Inst { defs, uses })
                }
            }
        }
        out
    }
    let mut rm = Remat::new(kernel);
    rm.hoist = hoist;
    rm.chains = chains;
    rm.ilp = ilp;
    let program = convert(&kernel.body, &mut rm);
    (program, rm.words)
}

/// The trips of a loop ptxas unrolls completely on the kernel's arch (see
/// [`crate::target::ptxas::PtxasModel::full_unroll_max_trips`]): a `For` with constant
/// bounds and no loop inside.
fn unrolled_trips(inst: &crate::ir::target::Inst, max: u32) -> Option<Vec<i64>> {
    use crate::ir::target::{Inst, Operand};
    fn has_loop(insts: &[Inst]) -> bool {
        insts.iter().any(|i| {
            matches!(i, Inst::For { .. } | Inst::While { .. })
                || i.regions().into_iter().any(|r| has_loop(r))
        })
    }
    let Inst::For {
        lo: Operand::Int(lo),
        hi: Operand::Int(hi),
        step: Operand::Int(step),
        body,
        ..
    } = inst
    else {
        return None;
    };
    if *step == 0 || has_loop(body) {
        return None;
    }
    let mut trips = Vec::new();
    let mut v = *lo;
    while (*step > 0 && v < *hi) || (*step < 0 && v > *hi) {
        if trips.len() as u32 == max {
            return None;
        }
        trips.push(v);
        v += step;
    }
    (!trips.is_empty()).then_some(trips)
}

/// Whether ptxas 12.9 unrolls `inst` by 4: a `For` loop whose trip count is
/// known only at run time, with no loop inside and a body of at most
/// [`UNROLL_BY_FOUR_MAX_INSTS`] instructions that neither stores, nor
/// synchronises, nor issues MMAs. On every arch the loads of the four
/// iterations are then issued together (`.pragma "nounroll"` on such loops
/// of generated kernels: 17 to 23 registers instead of 31 or 32; loops of 52
/// instructions and more are kept rolled).
fn unrolled_by_four(inst: &crate::ir::target::Inst, max_full_trips: u32) -> bool {
    use crate::ir::target::{Inst, Operand};
    fn size(insts: &[Inst]) -> Option<usize> {
        let mut n = 0;
        for i in insts {
            match i {
                Inst::Comment(_) => {}
                Inst::For { .. }
                | Inst::While { .. }
                | Inst::St { .. }
                | Inst::AtomAdd { .. }
                | Inst::Barrier
                | Inst::Trap { .. }
                | Inst::CpAsync { .. }
                | Inst::CpAsyncCommit
                | Inst::CpAsyncWait { .. }
                | Inst::Mma { .. } => return None,
                _ => {
                    n += 1;
                    for region in i.regions() {
                        n += size(region)?;
                    }
                }
            }
        }
        Some(n)
    }
    let Inst::For {
        lo, hi, step, body, ..
    } = inst
    else {
        return false;
    };
    // Constant trips: at least 4, and more than ptxas unrolls completely.
    let trips = match (lo, hi, step) {
        (Operand::Int(lo), Operand::Int(hi), Operand::Int(step)) if *step > 0 => {
            Some(hi.saturating_sub(*lo).max(0).saturating_add(step - 1) / step)
        }
        (Operand::Int(_), Operand::Int(_), Operand::Int(_)) => Some(0),
        _ => None,
    };
    let long = trips.is_none_or(|t| t >= 4 && t > i64::from(max_full_trips));
    long && size(body).is_some_and(|n| n <= UNROLL_BY_FOUR_MAX_INSTS)
}

/// `insts` with every loop that ptxas unrolls completely (see
/// [`unrolled_trips`]) replaced by its iterations in sequence, so that the
/// loads of different iterations can be issued together ([`hoist_loads`]).
/// Each iteration sets the induction variable to its constant; a branch on a
/// condition that is then constant becomes the arm taken (ptxas folds it:
/// `if c == 0: continue` leaves no branch); the registers an iteration writes
/// get fresh names, except in the last iteration, which writes the original
/// registers that the code after the loop reads.
fn unroll_short_loops<'a>(
    insts: &'a [crate::ir::target::Inst],
    rm: &mut Remat,
) -> std::borrow::Cow<'a, [crate::ir::target::Inst]> {
    use crate::ir::target::{Inst, Operand, Reg};
    use std::collections::HashMap;
    let max = rm.max_unroll_trips;
    if !insts
        .iter()
        .any(|i| unrolled_trips(i, max).is_some() || unrolled_by_four(i, max))
    {
        return std::borrow::Cow::Borrowed(insts);
    }
    /// One iteration being written out.
    struct Iteration<'r> {
        rm: &'r mut Remat,
        /// Current name of each renamed register.
        map: HashMap<u32, u32>,
        /// This iteration's name of each register it writes.
        names: HashMap<u32, u32>,
        /// Registers holding a known integer (or predicate) value.
        consts: HashMap<u32, i64>,
        last: bool,
    }
    impl Iteration<'_> {
        fn name(&mut self, r: u32) -> u32 {
            if self.last || self.rm.is_remat(r) {
                return r;
            }
            if let Some(&n) = self.names.get(&r) {
                return n;
            }
            let n = self.rm.fresh_like(r);
            self.names.insert(r, n);
            n
        }
        fn operand(&self, o: &Operand) -> Option<i64> {
            match o {
                Operand::Int(v) => Some(*v),
                Operand::Reg(r) => self.consts.get(&r.0).copied(),
                Operand::Float(_) => None,
            }
        }
        /// The value `inst` (already renamed) writes, where known.
        fn fold(&self, inst: &Inst) -> Option<i64> {
            use crate::ir::target::{BinOp, CmpOp, RegTy};
            let int = |r: &Reg| {
                !matches!(
                    self.rm.tys[r.0 as usize],
                    RegTy::F32 | RegTy::F64 | RegTy::B16 | RegTy::B32
                )
            };
            match inst {
                Inst::Mov { dst, src } if int(dst) => self.operand(src),
                Inst::Cmp { op, a, b, ty, .. }
                    if !matches!(ty, RegTy::F32 | RegTy::F64 | RegTy::B16 | RegTy::B32) =>
                {
                    let (a, b) = (self.operand(a)?, self.operand(b)?);
                    Some(i64::from(match op {
                        CmpOp::Eq => a == b,
                        CmpOp::Ne => a != b,
                        CmpOp::Lt => a < b,
                        CmpOp::Le => a <= b,
                        CmpOp::Gt => a > b,
                        CmpOp::Ge => a >= b,
                    }))
                }
                Inst::Binary { op, dst, a, b } if int(dst) => {
                    let (a, b) = (self.operand(a)?, self.operand(b)?);
                    match op {
                        BinOp::Add => Some(a.wrapping_add(b)),
                        BinOp::Sub => Some(a.wrapping_sub(b)),
                        BinOp::Mul => Some(a.wrapping_mul(b)),
                        BinOp::And => Some(a & b),
                        BinOp::Or => Some(a | b),
                        BinOp::Xor => Some(a ^ b),
                        _ => None,
                    }
                }
                _ => None,
            }
        }
        fn emit(&mut self, body: &[Inst], out: &mut Vec<Inst>) {
            for inst in body {
                crate::cancel::checkpoint();
                if let Inst::If {
                    cond,
                    then,
                    otherwise,
                } = inst
                {
                    let cond = Reg(*self.map.get(&cond.0).unwrap_or(&cond.0));
                    if let Some(v) = self.consts.get(&cond.0) {
                        self.emit(if *v != 0 { then } else { otherwise }, out);
                        continue;
                    }
                    // A register both arms write gets the same name in both;
                    // one only the first arm writes is local to it.
                    let before = self.map.clone();
                    let mut t = Vec::new();
                    self.emit(then, &mut t);
                    self.map = before;
                    let mut o = Vec::new();
                    self.emit(otherwise, &mut o);
                    out.push(Inst::If {
                        cond,
                        then: t,
                        otherwise: o,
                    });
                    continue;
                }
                let mut i = inst.clone();
                rename_regs(
                    &mut i,
                    &mut |r| *r = Reg(*self.map.get(&r.0).unwrap_or(&r.0)),
                    &mut |_| {},
                );
                let value = self.fold(&i);
                let mut renamed = Vec::new();
                rename_regs(&mut i, &mut |_| {}, &mut |r| {
                    let n = self.name(r.0);
                    renamed.push((r.0, n));
                    *r = Reg(n);
                });
                for (r, n) in renamed {
                    self.map.insert(r, n);
                    match value {
                        Some(v) => self.consts.insert(n, v),
                        None => self.consts.remove(&n),
                    };
                }
                out.push(i);
            }
        }
    }
    fn defs_in(insts: &[Inst], out: &mut HashMap<u32, u32>) {
        for i in insts {
            for r in i.defs() {
                *out.entry(r.0).or_default() += 1;
            }
            for region in i.regions() {
                defs_in(region, out);
            }
        }
    }
    let mut out = Vec::new();
    for inst in insts {
        if let (
            true,
            Inst::For {
                iv,
                lo,
                hi,
                step,
                body,
            },
        ) = (unrolled_by_four(inst, max), inst)
        {
            // Four iterations a trip: the k-th reads `iv + k * step`.
            let mut four = Vec::new();
            let mut map = HashMap::new();
            let mut consts = rm.consts.clone();
            for k in 0..4 {
                let mut it = Iteration {
                    rm: &mut *rm,
                    map,
                    names: HashMap::new(),
                    consts,
                    last: k == 3,
                };
                if k == 0 {
                    it.map.remove(&iv.0);
                } else {
                    let ivn = it.rm.fresh_like(iv.0);
                    four.push(Inst::Binary {
                        op: crate::ir::target::BinOp::Add,
                        dst: Reg(ivn),
                        a: Operand::Reg(*iv),
                        b: *step,
                    });
                    it.map.insert(iv.0, ivn);
                }
                it.emit(body, &mut four);
                map = it.map;
                consts = it.consts;
            }
            out.push(Inst::For {
                iv: *iv,
                lo: *lo,
                hi: *hi,
                step: *step,
                body: four,
            });
            continue;
        }
        let (Some(trips), Inst::For { iv, body, .. }) = (unrolled_trips(inst, max), inst) else {
            out.push(inst.clone());
            continue;
        };
        let mut consts = rm.consts.clone();
        let mut map = HashMap::new();
        for (k, &v) in trips.iter().enumerate() {
            let mut it = Iteration {
                rm: &mut *rm,
                map,
                names: HashMap::new(),
                consts,
                last: k + 1 == trips.len(),
            };
            let ivn = it.name(iv.0);
            out.push(Inst::Mov {
                dst: Reg(ivn),
                src: Operand::Int(v),
            });
            it.map.insert(iv.0, ivn);
            it.consts.insert(ivn, v);
            it.emit(body, &mut out);
            map = it.map;
            consts = it.consts;
        }
        // A carried register (written before the loop too) that the last
        // iteration did not write: the code after the loop reads its copy.
        let mut in_body = HashMap::new();
        defs_in(body, &mut in_body);
        let mut carried: Vec<(u32, u32)> = map
            .into_iter()
            .filter(|&(r, n)| {
                r != n && rm.def_count.get(r as usize).copied().unwrap_or(0) > in_body[&r]
            })
            .collect();
        carried.sort();
        for (r, n) in carried {
            out.push(Inst::Mov {
                dst: Reg(r),
                src: Operand::Reg(Reg(n)),
            });
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Applies `uses` to every register `inst` reads and `defs` to every one it
/// writes (a predicated load's destinations count as written only), for
/// instructions without nested regions.
fn rename_regs(
    inst: &mut crate::ir::target::Inst,
    uses: &mut dyn FnMut(&mut crate::ir::target::Reg),
    defs: &mut dyn FnMut(&mut crate::ir::target::Reg),
) {
    use crate::ir::target::{Inst, Operand};
    let op = |o: &mut Operand, uses: &mut dyn FnMut(&mut crate::ir::target::Reg)| {
        if let Operand::Reg(r) = o {
            uses(r)
        }
    };
    match inst {
        Inst::Param { dst, .. } | Inst::Special { dst, .. } | Inst::SmemAddr { dst, .. } => {
            defs(dst)
        }
        Inst::Mov { dst, src } | Inst::Unary { dst, x: src, .. } => {
            op(src, uses);
            defs(dst)
        }
        Inst::Binary { dst, a, b, .. }
        | Inst::MulWide { dst, a, b }
        | Inst::Cmp { dst, a, b, .. } => {
            op(a, uses);
            op(b, uses);
            defs(dst)
        }
        Inst::Fma { dst, a, b, c } => {
            op(a, uses);
            op(b, uses);
            op(c, uses);
            defs(dst)
        }
        Inst::Select { dst, cond, a, b } => {
            uses(cond);
            op(a, uses);
            op(b, uses);
            defs(dst)
        }
        Inst::Cvt { dst, src, .. } | Inst::ShflXor { dst, src, .. } => {
            uses(src);
            defs(dst)
        }
        Inst::Ld {
            dst, addr, pred, ..
        } => {
            uses(addr);
            pred.iter_mut().for_each(&mut *uses);
            dst.iter_mut().for_each(defs)
        }
        Inst::St {
            src, addr, pred, ..
        } => {
            src.iter_mut().for_each(|o| op(o, uses));
            uses(addr);
            pred.iter_mut().for_each(uses)
        }
        Inst::AtomAdd {
            src, addr, pred, ..
        } => {
            op(src, uses);
            uses(addr);
            pred.iter_mut().for_each(uses)
        }
        Inst::CpAsync {
            dst, src, src_size, ..
        } => {
            uses(dst);
            uses(src);
            src_size.iter_mut().for_each(uses)
        }
        Inst::LdMatrix { dst, addr, .. } => {
            uses(addr);
            dst.iter_mut().for_each(defs)
        }
        Inst::Mma { d, a, b, c, .. } => {
            a.iter_mut().chain(b).chain(c).for_each(&mut *uses);
            d.iter_mut().for_each(defs)
        }
        Inst::Trap { pred } => uses(pred),
        Inst::For { .. }
        | Inst::While { .. }
        | Inst::If { .. }
        | Inst::Barrier
        | Inst::CpAsyncCommit
        | Inst::CpAsyncWait { .. }
        | Inst::Comment(_) => {}
    }
}

/// Registers that the subroutine behind `inst` needs beyond the values live
/// across it: ptxas expands IEEE-rounded f32 division and reciprocal
/// (`div.rn`, `rcp.rn`) and square root (`sqrt.rn`) into a fast path and a
/// called slow path, whose registers come on top of the caller's. Measured
/// with ptxas 12.9 on straight-line kernels holding 4 to 16 values across one
/// such instruction (`compiler/tests/ptxas.rs` re-checks it): 9 more
/// registers for a division or reciprocal, 4 for a square root, on sm_70,
/// sm_80 and sm_90 (sm_90 needs up to 2 fewer).
fn slow_path_scratch(inst: &crate::ir::target::Inst, tys: &[crate::ir::target::RegTy]) -> u32 {
    use crate::ir::target::{BinOp, Inst, RegTy, UnOp};
    let f32_result = |r: &crate::ir::target::Reg| tys[r.0 as usize] == RegTy::F32;
    match inst {
        Inst::Binary {
            op: BinOp::Div,
            dst,
            ..
        }
        | Inst::Unary {
            op: UnOp::Rcp, dst, ..
        } if f32_result(dst) => SLOW_DIV_REGS,
        Inst::Unary {
            op: UnOp::Sqrt,
            dst,
            ..
        } if f32_result(dst) => SLOW_SQRT_REGS,
        _ => 0,
    }
}

/// The instructions of one block in the order ptxas's scheduler is modelled to
/// run them: an instruction without side effects that reads no memory (moves,
/// arithmetic, compares, conversions, special registers) is placed right
/// before the first instruction of the block that reads one of its results
/// (nested regions included), so a value is not held while unrelated work
/// runs, unless it writes a value and frees more words than it writes (the
/// block's last reads of values the block defines). Memory accesses, barriers,
/// shuffles and control flow keep their order (given by [`hoist_loads`]).
/// With `chains`, each goes before its first reader wherever that reader is
/// placed in turn (a depth-first walk), not where Target IR put it.
fn sink<'a>(
    insts: &[&'a crate::ir::target::Inst],
    tys: &[crate::ir::target::RegTy],
    chains: bool,
) -> Vec<&'a crate::ir::target::Inst> {
    use crate::ir::target::Inst;
    fn reads(inst: &Inst, out: &mut Vec<u32>) {
        work(1);
        out.extend(inst.uses().into_iter().map(|r| r.0));
        for region in inst.regions() {
            for i in region {
                reads(i, out);
            }
        }
    }
    // Pure and not a copy: copies stay where Target IR put them.
    let movable = |i: &Inst| i.is_pure() && !matches!(i, Inst::Mov { .. });
    // Address arithmetic (64-bit) does not move past a global load: ptxas
    // computes the addresses of a batch of loads (a gather's) before issuing
    // them back to back.
    let address = |i: &Inst| {
        matches!(i, Inst::MulWide { .. })
            || matches!(i, Inst::Binary { dst, .. } if tys.get(dst.0 as usize) == Some(&crate::ir::target::RegTy::U64))
    };
    let global_load = |i: &Inst| {
        matches!(
            i,
            Inst::Ld {
                space: crate::ir::target::Space::Global,
                ..
            }
        )
    };
    // Each instruction's reads (nested regions included), without repeats:
    // a sorted list costs less to build than a set per instruction.
    let reads_of: Vec<Vec<u32>> = insts
        .iter()
        .map(|i| {
            let mut s = Vec::new();
            reads(i, &mut s);
            work(s.len());
            s.sort_unstable();
            s.dedup();
            s
        })
        .collect();
    // For each instruction, the index it is placed before.
    let n = insts.len();
    let mut place: Vec<(usize, usize)> = Vec::with_capacity(n);
    // Per register: the last index of the block reading it, and whether the
    // block defines it.
    let mut last_read = FxHashMap::default();
    let mut defined_here = FxHashSet::default();
    for (j, i) in insts.iter().enumerate() {
        for &r in &reads_of[j] {
            last_read.insert(r, j);
        }
        for r in i.defs() {
            defined_here.insert(r.0);
        }
    }
    // Per register, the indices (ascending) that read it and that write it,
    // and per index the first global load at or after it: each instruction's
    // placement is then a few binary searches, not a scan of the block.
    let mut readers: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
    let mut writers: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
    for (j, i) in insts.iter().enumerate() {
        for &r in &reads_of[j] {
            readers.entry(r).or_default().push(j);
        }
        for r in i.defs() {
            writers.entry(r.0).or_default().push(j);
        }
    }
    let next_after = |lists: &FxHashMap<u32, Vec<usize>>, r: u32, k: usize| {
        lists.get(&r).and_then(|v| {
            work(1 + v.len().max(1).ilog2() as usize);
            let at = v.partition_point(|&j| j <= k);
            v.get(at).copied()
        })
    };
    let mut next_global_load = vec![n; n + 1];
    for j in (0..n).rev() {
        next_global_load[j] = if global_load(insts[j]) {
            j
        } else {
            next_global_load[j + 1]
        };
    }
    let word = |r: u32| tys.get(r as usize).map_or(1, |t| t.words());
    for (k, inst) in insts.iter().enumerate() {
        crate::cancel::checkpoint();
        work(1 + reads_of[k].len());
        // Writes a value and frees more words than it writes: the block's
        // last reads of values it defines (a select of two computed values,
        // an accumulation of a loaded value into a carried one).
        let freeing = || {
            let dying: u32 = reads_of[k]
                .iter()
                .filter(|r| defined_here.contains(r) && last_read.get(r) == Some(&k))
                .map(|&r| word(r))
                .sum();
            let made: u32 = inst.defs().iter().map(|r| word(r.0)).sum();
            made > 0 && dying > made
        };
        if movable(inst) && !freeing() {
            // The first later instruction that reads what this one writes,
            // or writes what it writes or reads: a later write pins it, so
            // only single-definition values move.
            let first_use = inst
                .defs()
                .into_iter()
                .flat_map(|d| [next_after(&readers, d.0, k), next_after(&writers, d.0, k)])
                .chain(reads_of[k].iter().map(|&r| next_after(&writers, r, k)))
                .flatten()
                .min();
            let mut at = first_use.map_or(k, |j| j.max(k));
            if address(inst) && next_global_load[k + 1] < at {
                at = next_global_load[k + 1];
            }
            if at > k {
                // Placed just before `at`, after everything originally before it.
                place.push((at, k));
                continue;
            }
        }
        place.push((k, k));
    }
    if chains {
        // Each sunk instruction goes right before its first reader wherever
        // that reader itself goes: a depth-first walk from the instructions
        // that stay, each preceded by those sunk to it (in their order).
        let mut sunk_to: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (k, &(at, orig)) in place.iter().enumerate() {
            if at != orig {
                sunk_to[at].push(k);
            }
        }
        let mut out = Vec::with_capacity(n);
        // (index, how many of its sunk instructions are emitted)
        let mut stack: Vec<(usize, usize)> = Vec::new();
        for root in (0..n).filter(|&k| place[k].0 == k) {
            stack.push((root, 0));
            while let Some(top) = stack.last_mut() {
                work(1);
                let (k, done) = *top;
                if let Some(&child) = sunk_to[k].get(done) {
                    top.1 += 1;
                    stack.push((child, 0));
                } else {
                    stack.pop();
                    out.push(insts[k]);
                }
            }
        }
        return out;
    }
    // Stable: by target slot, sunk instructions before the one they precede
    // (they come from earlier indices).
    let mut order: Vec<usize> = (0..n).collect();
    work(n * (1 + n.max(1).ilog2() as usize));
    order.sort_by_key(|&k| {
        let (at, orig) = place[k];
        (at, if at == orig { 1 } else { 0 }, orig)
    });
    order.into_iter().map(|k| insts[k]).collect()
}

/// An instruction no load or computation is moved across by the estimate's
/// reorderings: memory effects, barriers, async copies and nested regions.
fn ordering_point(i: &crate::ir::target::Inst) -> bool {
    use crate::ir::target::Inst;
    matches!(
        i,
        Inst::St { .. }
            | Inst::AtomAdd { .. }
            | Inst::Barrier
            | Inst::CpAsync { .. }
            | Inst::CpAsyncCommit
            | Inst::CpAsyncWait { .. }
            | Inst::For { .. }
            | Inst::While { .. }
            | Inst::If { .. }
    )
}

/// Loads issued early: within each stretch of a block between ordering points
/// (stores, atomics, barriers, async copies, nested regions), every load and
/// the pure instructions it depends on move to the start of the stretch, in
/// their original order, as ptxas's scheduler batches loads to cover their
/// latency. An instruction that cannot pass an earlier one (it reads or writes
/// a register that one writes, or writes one it reads) stays, and so does
/// everything depending on it.
fn hoist_loads(insts: &[crate::ir::target::Inst]) -> Vec<&crate::ir::target::Inst> {
    use crate::ir::target::{Inst, Space};
    let barrier = ordering_point;
    let pure = |i: &Inst| i.is_pure();
    let set =
        |v: Vec<crate::ir::target::Reg>| v.into_iter().map(|r| r.0).collect::<FxHashSet<u32>>();
    let defs: Vec<FxHashSet<u32>> = insts.iter().map(|i| set(i.defs())).collect();
    let uses: Vec<FxHashSet<u32>> = insts.iter().map(|i| set(i.uses())).collect();
    let mut out = Vec::with_capacity(insts.len());
    let mut start = 0;
    while start < insts.len() {
        let end = (start..insts.len())
            .find(|&j| barrier(&insts[j]))
            .unwrap_or(insts.len());
        work(1 + end - start);
        // Members: loads and (backwards) the pure instructions they read.
        let mut member = vec![false; end - start];
        let mut needed: FxHashSet<u32> = FxHashSet::default();
        // Shared-memory loads move too where they feed `mma.m8n8k4` (sm_70):
        // ptxas keeps the operand fragments of the whole k-step resident.
        let m8n8k4 = insts[start..end]
            .iter()
            .any(|i| matches!(i, Inst::Mma { k: 4, .. }));
        // The loads that move: the first [`LOAD_WINDOW_WORDS`] words of them
        // (all of them where the stretch feeds an mma: its fragments).
        let any_mma = insts[start..end]
            .iter()
            .any(|i| matches!(i, Inst::Mma { .. }));
        let mut in_window = vec![false; end - start];
        let mut words = 0u32;
        let mut shared_words = 0u32;
        for j in start..end {
            work(1);
            match &insts[j] {
                Inst::Ld {
                    space, mem, dst, ..
                } if *space == Space::Global || m8n8k4 => {
                    words += dst.len() as u32 * mem.bytes().div_ceil(4);
                    in_window[j - start] = any_mma || words <= LOAD_WINDOW_WORDS;
                }
                // Shared loads of a stretch without an MMA (the cross-warp
                // step of a reduction), in a window of their own.
                Inst::Ld { mem, dst, .. } if !any_mma => {
                    shared_words += dst.len() as u32 * mem.bytes().div_ceil(4);
                    in_window[j - start] = shared_words <= SHARED_LOAD_WINDOW_WORDS;
                }
                // The ldmatrix fragments of the stretch's mma: all resident
                // before the first one.
                Inst::LdMatrix { .. } => in_window[j - start] = any_mma,
                _ => {}
            }
        }
        for j in (start..end).rev() {
            crate::cancel::checkpoint();
            work(1 + uses[j].len());
            let is_load = in_window[j - start];
            if is_load || (pure(&insts[j]) && defs[j].iter().any(|r| needed.contains(r))) {
                member[j - start] = true;
                needed.extend(uses[j].iter().copied());
            }
        }
        // Drop members that cannot pass an earlier non-member. Only earlier
        // instructions can block one, so a single forward pass, adding each
        // dropped member to the non-members, reaches the fixpoint.
        let mut defined_by_stay: FxHashSet<u32> = FxHashSet::default();
        let mut read_by_stay: FxHashSet<u32> = FxHashSet::default();
        for m in start..end {
            work(1 + defs[m].len() + uses[m].len());
            if member[m - start] {
                let blocked = defs[m]
                    .iter()
                    .any(|r| read_by_stay.contains(r) || defined_by_stay.contains(r))
                    || uses[m].iter().any(|r| defined_by_stay.contains(r));
                if !blocked {
                    continue;
                }
                member[m - start] = false;
            }
            defined_by_stay.extend(defs[m].iter().copied());
            read_by_stay.extend(uses[m].iter().copied());
        }
        out.extend(
            (start..end)
                .filter(|&j| member[j - start])
                .map(|j| &insts[j]),
        );
        out.extend(
            (start..end)
                .filter(|&j| !member[j - start])
                .map(|j| &insts[j]),
        );
        if end < insts.len() {
            out.push(&insts[end]);
        }
        start = end + 1;
    }
    out
}

/// Latency in cycles that [`ilp_order`] gives an instruction's results:
/// loads from memory long, tensor-core and shuffle results medium, the rest
/// one ALU pipeline's depth.
fn latency(inst: &crate::ir::target::Inst) -> u64 {
    use crate::ir::target::{Inst, Space};
    match inst {
        Inst::Ld {
            space: Space::Global,
            ..
        } => 400,
        Inst::Ld { .. } | Inst::LdMatrix { .. } => 30,
        Inst::Mma { .. } | Inst::ShflXor { .. } => 20,
        Inst::Param { .. } => 20,
        _ => 5,
    }
}

/// The order ptxas's scheduler is modelled to run a block in where
/// registers are plentiful: within each stretch between ordering points
/// (stores, atomics, barriers, async copies, traps, nested regions), a list
/// scheduler over the stretch's dependences issues one instruction a cycle,
/// the ready one with the longest latency-weighted path to the stretch's
/// end first. Loads and the arithmetic their addresses need so go first
/// (latency hiding), and independent per-element chains interleave (a
/// chain's next step waits for its operand while the others issue), as in
/// ptxas's SASS at low pressure. O(n log n) in the stretch's length.
fn ilp_order(insts: &[crate::ir::target::Inst]) -> Vec<&crate::ir::target::Inst> {
    use crate::ir::target::Inst;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    // A trap also ends a stretch here: nothing is issued ahead of it.
    let barrier = |i: &Inst| ordering_point(i) || matches!(i, Inst::Trap { .. });
    let mut out = Vec::with_capacity(insts.len());
    let mut start = 0;
    while start < insts.len() {
        let end = (start..insts.len())
            .find(|&j| barrier(&insts[j]))
            .unwrap_or(insts.len());
        let n = end - start;
        // Dependences: a read after the last write, a write after the last
        // write and after the reads since then.
        let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut preds = vec![0usize; n];
        let mut last_write: FxHashMap<u32, usize> = FxHashMap::default();
        let mut reads_since: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
        for j in 0..n {
            crate::cancel::checkpoint();
            let inst = &insts[start + j];
            let uses = inst.uses();
            let defs = inst.defs();
            work(1 + uses.len() + defs.len());
            let mut from: Vec<usize> = Vec::new();
            for r in &uses {
                if let Some(&w) = last_write.get(&r.0) {
                    from.push(w);
                }
            }
            for r in &defs {
                if let Some(&w) = last_write.get(&r.0) {
                    from.push(w);
                }
                if let Some(rs) = reads_since.remove(&r.0) {
                    work(rs.len());
                    from.extend(rs);
                }
            }
            from.sort_unstable();
            from.dedup();
            for f in from {
                if f != j {
                    succs[f].push(j);
                    preds[j] += 1;
                }
            }
            for r in &uses {
                reads_since.entry(r.0).or_default().push(j);
            }
            for r in &defs {
                last_write.insert(r.0, j);
            }
        }
        // Priority: the longest latency-weighted path to the stretch's end.
        let lat: Vec<u64> = insts[start..end].iter().map(latency).collect();
        let mut height = vec![0u64; n];
        for j in (0..n).rev() {
            work(1 + succs[j].len());
            height[j] = lat[j] + succs[j].iter().map(|&s| height[s]).max().unwrap_or(0);
        }
        // Cycle by cycle: the ready instruction of greatest height (then the
        // earliest) issues; its readers are ready `lat` cycles later.
        let mut ready: BinaryHeap<(u64, Reverse<usize>)> = BinaryHeap::new();
        let mut pending: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
        let mut at = vec![0u64; n];
        for (j, &p) in preds.iter().enumerate() {
            if p == 0 {
                ready.push((height[j], Reverse(j)));
            }
        }
        let mut cycle = 0u64;
        let mut issued = 0;
        while issued < n {
            crate::cancel::checkpoint();
            work(1 + n.max(1).ilog2() as usize);
            while let Some(&Reverse((t, j))) = pending.peek() {
                if t > cycle {
                    break;
                }
                pending.pop();
                ready.push((height[j], Reverse(j)));
            }
            let Some((_, Reverse(j))) = ready.pop() else {
                // Nothing ready: wait for the next result.
                if let Some(&Reverse((t, _))) = pending.peek() {
                    cycle = t;
                }
                continue;
            };
            out.push(&insts[start + j]);
            issued += 1;
            for &s in &succs[j] {
                at[s] = at[s].max(cycle + lat[j]);
                preds[s] -= 1;
                if preds[s] == 0 {
                    pending.push(Reverse((at[s], s)));
                }
            }
            cycle += 1;
        }
        if end < insts.len() {
            out.push(&insts[end]);
        }
        start = end + 1;
    }
    out
}

/// The counts of the orders the estimate weighs, for the study of its
/// misses (`compiler/tests/ptxas.rs`'s `TESSERA_ESTIMATE_DUMP`): statement
/// order, chains ([`sink`]'s `chains`), latency order ([`ilp_order`]).
pub fn order_estimates(kernel: &crate::ir::target::Kernel) -> [u32; 3] {
    let estimate = |chains, ilp| {
        let (program, widths) = program_with(kernel, true, chains, ilp);
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
/// estimated with every load early, 237 to 239 with none).
pub fn of_target(kernel: &crate::ir::target::Kernel) -> Resources {
    let estimate = |hoist, chains| {
        let (program, widths) = program_with(kernel, hoist, chains, false);
        let words = |r: u32| widths.get(r as usize).copied().unwrap_or(1);
        estimate_regs(&program, &words)
    };
    let max = kernel.arch.info().max_regs_per_thread;
    let mut regs = estimate(true, false);
    if regs < FULL_OCCUPANCY_REGS {
        // Registers are free up to full occupancy: ptxas trades some of them
        // for latency (see the module docs).
        let (program, widths) = program_with(kernel, true, false, true);
        let words = |r: u32| widths.get(r as usize).copied().unwrap_or(1);
        let latency_order = estimate_regs(&program, &words);
        let toward = latency_order.saturating_sub(regs) / LATENCY_SHARE;
        regs = (regs + toward).min(FULL_OCCUPANCY_REGS);
    }
    fn calls_slow_path(
        insts: &[crate::ir::target::Inst],
        tys: &[crate::ir::target::RegTy],
    ) -> bool {
        insts.iter().any(|i| {
            slow_path_scratch(i, tys) > 0
                || i.regions().into_iter().any(|r| calls_slow_path(r, tys))
        })
    }
    if regs > CHAIN_MIN_REGS && !calls_slow_path(&kernel.body, &kernel.regs) {
        regs = regs.min(estimate(true, true).max(CHAIN_MIN_REGS));
    }
    if regs > max && estimate(false, false) <= max {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(defs: &[u32], uses: &[u32]) -> Node {
        Node::Inst {
            defs: defs.to_vec(),
            uses: uses.to_vec(),
        }
    }

    fn one(_: u32) -> u32 {
        1
    }

    #[test]
    fn straight_line_results_reuse_dead_operands() {
        // r0, r1 params; r2 = r0 + r1; r3 = r2 * r2; store r3.
        let p = [
            inst(&[0], &[]),
            inst(&[1], &[]),
            inst(&[2], &[0, 1]),
            inst(&[3], &[2, 2]),
            inst(&[], &[3]),
        ];
        assert_eq!(max_pressure(&p, &one), 2);
        // A value never read still needs a register where it is written.
        assert_eq!(max_pressure(&[inst(&[0], &[])], &one), 1);
        assert_eq!(max_pressure(&[], &one), 0);
    }

    #[test]
    fn widths_count_words_and_predicates_are_free() {
        // r0: 64-bit address, r1: pred, r2: f32 loaded under r1.
        let p = [
            inst(&[0], &[]),
            inst(&[1], &[]),
            inst(&[2], &[0, 1]),
            inst(&[], &[0, 2]),
        ];
        let words = |r: u32| [2, 0, 1][r as usize];
        assert_eq!(max_pressure(&p, &words), 3);
    }

    fn test(uses: &[u32]) -> Node {
        Node::Test {
            uses: uses.to_vec(),
        }
    }

    #[test]
    fn values_read_in_a_loop_live_through_it() {
        // r0 defined before the loop and read at the start of the body: it must
        // survive the whole body (the next iteration reads it again), so it
        // overlaps the temporaries made at the end of the body.
        let p = [
            inst(&[0], &[]),
            Node::Loop {
                entry: Box::new(inst(&[1], &[])),
                body: vec![
                    inst(&[2], &[0, 1]),
                    inst(&[], &[2]),
                    inst(&[3], &[]),
                    inst(&[4], &[]),
                    inst(&[5], &[3, 4]),
                    inst(&[], &[5]),
                    inst(&[1], &[1]),
                    test(&[1]),
                ],
            },
        ];
        // At r4's definition: r0, r1 (the induction variable), r3, r4.
        assert_eq!(max_pressure(&p, &one), 4);
        // Without the loop the same instructions need two registers less: r0
        // and r1 die at their reads.
        let flat = [
            inst(&[0], &[]),
            inst(&[1], &[]),
            inst(&[2], &[0, 1]),
            inst(&[], &[2]),
            inst(&[3], &[]),
            inst(&[4], &[]),
            inst(&[5], &[3, 4]),
            inst(&[], &[5]),
        ];
        assert_eq!(max_pressure(&flat, &one), 2);
    }

    #[test]
    fn loop_exits_and_carried_values() {
        // r1 is written late in the body and read after the loop. Each
        // iteration overwrites it before any read, so it is dead early in the
        // body (where r2, r3 live) ...
        let body = vec![
            inst(&[2], &[0]),
            inst(&[3], &[2]),
            inst(&[4], &[3]),
            inst(&[], &[4, 3]),
            inst(&[1], &[0]),
            inst(&[0], &[0]),
            test(&[0]),
        ];
        let p = [
            inst(&[1], &[]),
            Node::Loop {
                entry: Box::new(inst(&[0], &[])),
                body: body.clone(),
            },
            inst(&[], &[1]),
        ];
        // ... peak: r0, r3, r4.
        assert_eq!(max_pressure(&p, &one), 3);
        // Left at a test after r4's definition and before r1's write, the old
        // r1 may be read after the loop, so it is live there: r0, r1, r3, r4.
        let mut early = body;
        early.insert(3, test(&[0]));
        let q = [
            inst(&[1], &[]),
            Node::Loop {
                entry: Box::new(inst(&[0], &[])),
                body: early,
            },
            inst(&[], &[1]),
        ];
        assert_eq!(max_pressure(&q, &one), 4);
        // A copied accumulator (Target IR copies carried values into fresh
        // registers and back): the copy and the original never overlap.
        let acc = [
            inst(&[0], &[]),
            Node::Loop {
                entry: Box::new(inst(&[1], &[])),
                body: vec![
                    inst(&[5], &[0]),
                    inst(&[2], &[1]),
                    inst(&[3], &[5, 2]),
                    inst(&[0], &[3]),
                    inst(&[1], &[1]),
                    test(&[1]),
                ],
            },
            inst(&[], &[0]),
        ];
        // r1, r5 and r2 at r2's definition.
        assert_eq!(max_pressure(&acc, &one), 3);
    }

    /// A set of registers as bits.
    #[derive(Clone, PartialEq)]
    struct Bits(Vec<u64>);

    impl Bits {
        fn new(n: usize) -> Self {
            Bits(vec![0; n.div_ceil(64)])
        }
        fn insert(&mut self, r: u32) {
            self.0[r as usize / 64] |= 1 << (r % 64);
        }
        fn remove(&mut self, r: u32) {
            self.0[r as usize / 64] &= !(1 << (r % 64));
        }
        fn union(&mut self, other: &Bits) {
            for (a, b) in self.0.iter_mut().zip(&other.0) {
                *a |= b;
            }
        }
        fn iter(&self) -> impl Iterator<Item = u32> + '_ {
            self.0.iter().enumerate().flat_map(|(i, &w)| {
                let mut rest = w;
                std::iter::from_fn(move || {
                    (rest != 0).then(|| {
                        let b = rest.trailing_zeros();
                        rest &= rest - 1;
                        (i * 64) as u32 + b
                    })
                })
            })
        }
    }

    /// The liveness the estimate had first: a live-in bit set per position,
    /// iterated to a fixpoint (positions times registers in time and memory).
    /// [`max_pressure`] must agree with it.
    fn reference_pressure(program: &[Node], words: &dyn Fn(u32) -> u32) -> u32 {
        let mut cfg = Cfg::default();
        cfg.seq(program);
        let n = cfg.defs.len();
        let nregs = cfg
            .defs
            .iter()
            .chain(&cfg.uses)
            .flatten()
            .map(|&r| r as usize + 1)
            .max()
            .unwrap_or(0);
        let mut live_in = vec![Bits::new(nregs); n];
        let live_out_of = |p: usize, live_in: &[Bits], out: &mut Bits| {
            out.0.iter_mut().for_each(|w| *w = 0);
            for &s in &cfg.succ[p] {
                out.union(&live_in[s]);
            }
        };
        // Backward dataflow to a fixpoint; positions are mostly in program order,
        // so sweeping them in reverse converges in a few passes.
        let mut out = Bits::new(nregs);
        loop {
            let mut changed = false;
            for p in (0..n).rev() {
                live_out_of(p, &live_in, &mut out);
                for &d in &cfg.defs[p] {
                    out.remove(d);
                }
                for &u in &cfg.uses[p] {
                    out.insert(u);
                }
                if out != live_in[p] {
                    std::mem::swap(&mut live_in[p], &mut out);
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        let weight = |b: &Bits| b.iter().map(words).sum::<u32>();
        let mut peak = 0;
        for p in 0..n {
            live_out_of(p, &live_in, &mut out);
            for &d in &cfg.defs[p] {
                out.insert(d);
            }
            peak = peak.max(weight(&out)).max(weight(&live_in[p]));
        }
        peak
    }

    #[test]
    fn linear_liveness_agrees_with_the_per_position_fixpoint() {
        // Random structured programs (nested loops with tests, branches, 64-bit
        // and predicate registers) from a fixed xorshift sequence.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n) as u32
        };
        fn block(next: &mut dyn FnMut(u64) -> u32, depth: u32, in_loop: bool) -> Vec<Node> {
            let len = next(8) + 1;
            (0..len)
                .map(|_| match next(10) {
                    0 if depth < 3 => Node::Loop {
                        entry: Box::new(inst(&[next(24)], &[next(24)])),
                        body: block(next, depth + 1, true),
                    },
                    1 if depth < 3 => Node::Branch {
                        cond: vec![next(24)],
                        then: block(next, depth + 1, in_loop),
                        otherwise: block(next, depth + 1, in_loop),
                    },
                    2 if in_loop => test(&[next(24)]),
                    _ => {
                        let defs: Vec<u32> = (0..next(3)).map(|_| next(24)).collect();
                        let uses: Vec<u32> = (0..next(4)).map(|_| next(24)).collect();
                        inst(&defs, &uses)
                    }
                })
                .collect()
        }
        let words = |r: u32| r % 3;
        for _ in 0..500 {
            let p = block(&mut next, 0, false);
            assert_eq!(
                max_pressure(&p, &words),
                reference_pressure(&p, &words),
                "{p:?}"
            );
        }
    }

    /// The work ([`super::work`] steps) of the estimate of a kernel of
    /// `statements` dependent elementwise statements (each a few instructions
    /// per element, `width / 32` elements a thread), in a loop or not, and
    /// its length in Target IR instructions.
    fn estimate_work(statements: usize, in_loop: bool, width: usize) -> (u64, usize) {
        use crate::db::{file_kernels, target_ir, Database};
        let indent = if in_loop { "        " } else { "    " };
        let mut src = format!(
            "@kernel(grid=(cdiv(N, {width}),), num_warps=1)\n\
             def chain(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    \
             i = program_id(0) * {width}\n    v = load(x[i : i + {width}])\n    a = v\n",
        );
        if in_loop {
            src += "    for k in range(0, N, 7):\n";
        }
        for k in 0..statements {
            src += &format!("{indent}a = a * v + {k}.5\n");
        }
        src += &format!("    store(out[i : i + {width}], a)\n");
        let mut db = Database::new();
        let file = db.set_source("/t/chain.tsr", src);
        let (_, item, _) = file_kernels(&db, file).into_iter().next().unwrap();
        let kernel = target_ir(
            &db,
            item,
            db.options(),
            crate::ir::tile::Specialization::new(),
        )
        .clone()
        .unwrap();
        fn count(insts: &[crate::ir::target::Inst]) -> usize {
            insts
                .iter()
                .map(|i| 1 + i.regions().into_iter().map(|r| count(r)).sum::<usize>())
                .sum()
        }
        let before = super::WORK.with(|w| w.get());
        let regs = std::hint::black_box(of_target(&kernel)).regs;
        if width <= 128 {
            assert!(regs < FULL_OCCUPANCY_REGS, "{regs} registers");
        }
        (super::WORK.with(|w| w.get()) - before, count(&kernel.body))
    }

    #[test]
    fn estimate_work_grows_linearly_with_kernel_length() {
        // Counted steps, not time: a shared machine makes timings noisy. 100
        // statements are ~6,500 Target IR instructions; twice the length may
        // cost a little more than twice the work (the sort of a block).
        // 4 elements a thread: under 32 registers, so the latency order
        // ([`ilp_order`]) is computed too.
        for (in_loop, width) in [(false, 1024), (true, 1024), (false, 128), (true, 128)] {
            let (small, small_len) = estimate_work(100, in_loop, width);
            let (large, large_len) = estimate_work(200, in_loop, width);
            assert!(10 * large_len >= 19 * small_len, "{small_len} {large_len}");
            assert!(
                (small as usize) < 100 * small_len,
                "{small} steps for {small_len} instructions"
            );
            let ratio = large as f64 / small as f64;
            assert!(
                ratio < 2.5,
                "estimate of 100 statements (in a loop: {in_loop}, {small_len} \
                 instructions): {small} steps, of 200 ({large_len}): {large} ({ratio:.2}x)"
            );
        }
    }

    /// The work of the estimate of a kernel whose address or branch
    /// condition is a right-associated chain of `terms` integer powers
    /// (each ~160 straight-line Target IR instructions per element), and its
    /// length in Target IR instructions: in a store index, or in an `if`
    /// inside a `while`.
    fn pow_chain_work(terms: usize, in_branch: bool) -> (u64, usize) {
        use crate::db::{file_kernels, target_ir, Database};
        let src = if in_branch {
            let chain = vec!["c"; terms].join(" ** ");
            format!(
                "@kernel(grid=(M,), num_warps=8)\n\
                 def k(x: Tensor[\"M\", \"N\", bf16], out: Tensor[\"M\", bf16], limit: i32):\n    \
                 row = program_id(0)\n    acc = zeros([8], bf16)\n    c = 0\n    \
                 while c < N:\n        v = load(x[row, c : c + 8])\n        \
                 if ({chain}) > limit:\n            break\n        \
                 acc = acc + v\n        c += 8\n    \
                 store(out[row : row + 1], max(acc, axis=0, keepdims=True))\n"
            )
        } else {
            let chain = vec!["cols"; terms].join(" ** ");
            format!(
                "@kernel(grid=(M,), num_warps=8)\n\
                 def k(x: Tensor[\"M\", \"N\", f32], out: Tensor[\"M\", \"N\", f32]):\n    \
                 row = program_id(0)\n    cols = arange(0, 128)\n    m = cols < N\n    \
                 v = load(x[row, cols], mask=m, other=0)\n    \
                 store(out[row, ({chain})], v - sum(v, axis=0), mask=m)\n"
            )
        };
        let mut db = Database::new();
        let file = db.set_source("/t/pow.tsr", src);
        let (_, item, _) = file_kernels(&db, file).into_iter().next().unwrap();
        let kernel = target_ir(
            &db,
            item,
            db.options(),
            crate::ir::tile::Specialization::new(),
        )
        .clone()
        .unwrap();
        fn count(insts: &[crate::ir::target::Inst]) -> usize {
            insts
                .iter()
                .map(|i| 1 + i.regions().into_iter().map(|r| count(r)).sum::<usize>())
                .sum()
        }
        let before = super::WORK.with(|w| w.get());
        std::hint::black_box(of_target(&kernel));
        (super::WORK.with(|w| w.get()) - before, count(&kernel.body))
    }

    #[test]
    fn estimate_work_grows_linearly_with_integer_power_chains() {
        // Long `**` chains were reported slow to estimate (fuzzing: 5,000
        // terms). Counted steps, not time; twice the terms must cost about
        // twice the work, in straight-line code and in a branch in a loop.
        for (in_branch, terms) in [(false, 20), (true, 50)] {
            let (small, small_len) = pow_chain_work(terms, in_branch);
            let (large, large_len) = pow_chain_work(2 * terms, in_branch);
            assert!(10 * large_len >= 19 * small_len, "{small_len} {large_len}");
            assert!(
                (small as usize) < 100 * small_len,
                "{small} steps for {small_len} instructions"
            );
            let ratio = large as f64 / small as f64;
            assert!(
                ratio < 2.3,
                "estimate of {terms} powers (in a branch: {in_branch}, {small_len} \
                 instructions): {small} steps, of {} ({large_len}): {large} ({ratio:.2}x)",
                2 * terms
            );
        }
    }

    #[test]
    fn short_runtime_loops_are_unrolled_by_four() {
        use crate::db::{file_kernels, target_ir, Database};
        use crate::ir::target::Inst;
        // A row sum over a runtime `K` (ptxas: 31 or 32 registers, 17 to 23
        // with the loop kept rolled), and the same loop storing each tile.
        let kernel = |body: &str| {
            let mut db = Database::new();
            let src = format!(
                "@kernel(grid=(M,), num_warps=2)\n\
                 def k(x: Tensor[\"M\", \"K\", bf16], out: Tensor[\"M\", f32]):\n    \
                 r0 = program_id(0)\n    acc = zeros([1, 256], f32)\n    \
                 for k in range(0, K, 256):\n{body}    \
                 store(out[r0 : r0 + 1], sum(acc, axis=1))\n"
            );
            let file = db.set_source("/t/k.tsr", src);
            let (_, item, _) = file_kernels(&db, file).into_iter().next().unwrap();
            target_ir(
                &db,
                item,
                db.options(),
                crate::ir::tile::Specialization::new(),
            )
            .clone()
            .unwrap()
        };
        let loads = |insts: &[Inst]| {
            insts
                .iter()
                .filter(|i| matches!(i, Inst::Ld { .. }))
                .count()
        };
        let loop_loads = |k: &crate::ir::target::Kernel| {
            let mut rm = Remat::new(k);
            let body = unroll_short_loops(&k.body, &mut rm);
            let inner = |insts: &[Inst]| {
                insts
                    .iter()
                    .find_map(|i| match i {
                        Inst::For { body, .. } => Some(loads(body)),
                        _ => None,
                    })
                    .unwrap()
            };
            (inner(&k.body), inner(&body))
        };
        let sums = kernel("        acc = acc + load(x[r0 : r0 + 1, k : k + 256]).to(f32)\n");
        let (rolled, unrolled) = loop_loads(&sums);
        assert!(rolled > 0);
        assert_eq!(unrolled, 4 * rolled);
        let stores = kernel(
            "        t = load(x[r0 : r0 + 1, k : k + 256]).to(f32)\n        \
             acc = acc + t\n        store(out[r0 : r0 + 1], sum(t, axis=1))\n",
        );
        let (rolled, unrolled) = loop_loads(&stores);
        assert_eq!(unrolled, rolled, "a loop that stores stays rolled");
    }

    #[test]
    fn a_stale_database_cancels_the_estimate() {
        use crate::db::{file_kernels, target_ir, Database};
        let mut db = Database::new();
        let file = db.set_source(
            "/t/k.tsr",
            "@kernel(grid=(cdiv(N, 256),), num_warps=4)\n\
             def k(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    \
             offs = program_id(0) * 256 + arange(0, 256)\n    \
             store(out[offs], load(x[offs], mask=offs < N, other=0.0) * 2.0, mask=offs < N)\n"
                .to_string(),
        );
        let (_, item, _) = file_kernels(&db, file).into_iter().next().unwrap();
        let kernel = target_ir(
            &db,
            item,
            db.options(),
            crate::ir::tile::Specialization::new(),
        )
        .clone()
        .unwrap();
        let mut main = crate::cancel::Generation::default();
        let snapshot = main.clone();
        // A current handle computes the estimate; a stale one unwinds.
        let fresh = crate::cancel::scope(snapshot.clone(), || of_target(&kernel));
        assert_eq!(fresh, of_target(&kernel));
        main.advance();
        let stale =
            std::panic::catch_unwind(|| crate::cancel::scope(snapshot, || of_target(&kernel)));
        let payload = stale.expect_err("a stale handle cancels the estimate");
        assert!(payload.downcast_ref::<salsa::Cancelled>().is_some());
    }

    #[test]
    fn branch_arms_do_not_add_up() {
        let arm = |base: u32| {
            vec![
                inst(&[base], &[]),
                inst(&[base + 1], &[]),
                inst(&[base + 2], &[]),
                inst(&[], &[base, base + 1, base + 2]),
            ]
        };
        let p = [
            inst(&[0], &[]),
            Node::Branch {
                cond: vec![0],
                then: arm(1),
                otherwise: arm(4),
            },
        ];
        assert_eq!(max_pressure(&p, &one), 3);
        // A value live across the branch adds to both arms.
        let mut q = p.to_vec();
        q.push(inst(&[], &[0]));
        assert_eq!(max_pressure(&q, &one), 4);
    }

    mod schedule {
        use super::super::{hoist_loads, sink};
        use crate::ir::target::{BinOp, Inst, MemTy, Operand, Reg, RegTy, Space};

        fn ld(space: Space, dst: u32, addr: u32) -> Inst {
            Inst::Ld {
                space,
                mem: MemTy::F32,
                dst: vec![Reg(dst)],
                addr: Reg(addr),
                offset: 0,
                pred: None,
            }
        }
        fn add(dst: u32, a: u32, b: u32) -> Inst {
            Inst::Binary {
                op: BinOp::Add,
                dst: Reg(dst),
                a: Operand::Reg(Reg(a)),
                b: Operand::Reg(Reg(b)),
            }
        }
        fn st(src: u32, addr: u32) -> Inst {
            Inst::St {
                space: Space::Global,
                mem: MemTy::F32,
                src: vec![Operand::Reg(Reg(src))],
                addr: Reg(addr),
                offset: 0,
                pred: None,
            }
        }
        /// The order of `insts` after scheduling, as indices into `insts`.
        fn order(insts: &[Inst], tys: &[RegTy]) -> Vec<usize> {
            sink(&hoist_loads(insts), tys, false)
                .into_iter()
                .map(|i| insts.iter().position(|j| std::ptr::eq(i, j)).unwrap())
                .collect()
        }

        #[test]
        fn the_latency_order_issues_loads_first_and_interleaves_chains() {
            // Element 1: f2 = f1 + f1, f3 = f2 + f2; element 2 the same on
            // f5, loaded after element 1's chain; both stored.
            let insts = [
                ld(Space::Global, 1, 0),
                add(2, 1, 1),
                add(3, 2, 2),
                ld(Space::Global, 5, 0),
                add(6, 5, 5),
                add(7, 6, 6),
                st(3, 0),
                st(7, 0),
            ];
            let order: Vec<usize> = super::super::ilp_order(&insts)
                .into_iter()
                .map(|i| insts.iter().position(|j| std::ptr::eq(i, j)).unwrap())
                .collect();
            // Both loads, then the chains step by step side by side; the
            // stores keep their order.
            assert_eq!(order, [0, 3, 1, 4, 2, 5, 6, 7]);
        }

        #[test]
        fn chains_run_element_after_element() {
            // Two statements over two elements (f1, f2), each element stored.
            let insts = [
                add(3, 1, 1),
                add(4, 2, 2),
                add(5, 3, 3),
                add(6, 4, 4),
                st(5, 0),
                st(6, 0),
            ];
            let mut tys = vec![RegTy::F32; 7];
            tys[0] = RegTy::U32;
            let refs: Vec<&Inst> = insts.iter().collect();
            let order = |chains| {
                sink(&refs, &tys, chains)
                    .into_iter()
                    .map(|i| insts.iter().position(|j| std::ptr::eq(i, j)).unwrap())
                    .collect::<Vec<_>>()
            };
            // Each instruction before its first reader where Target IR put
            // that reader: both first statements stay live together.
            assert_eq!(order(false), [0, 1, 2, 4, 3, 5]);
            // Along chains: one element's statements and store, then the next.
            assert_eq!(order(true), [0, 2, 4, 1, 3, 5]);
        }

        #[test]
        fn global_loads_and_their_addresses_move_up_to_the_last_store() {
            // r0: address; f1 loaded, f2 = f1 + f1; r3 = r0 + r0 (address of
            // the second load), f4 loaded from it; stored, then a load after
            // the store stays behind it.
            let insts = [
                ld(Space::Global, 1, 0),
                add(2, 1, 1),
                add(3, 0, 0),
                ld(Space::Global, 4, 3),
                st(2, 0),
                ld(Space::Global, 5, 0),
                st(5, 4),
            ];
            let tys = [
                RegTy::U32,
                RegTy::F32,
                RegTy::F32,
                RegTy::U32,
                RegTy::F32,
                RegTy::F32,
            ];
            assert_eq!(order(&insts, &tys), [0, 2, 3, 1, 4, 5, 6]);
            // A global load passes a shuffle (which keeps its place), and so
            // does a shared one in a stretch without an mma.
            let across = |space| {
                [
                    ld(space, 1, 0),
                    Inst::ShflXor {
                        dst: Reg(2),
                        src: Reg(1),
                        lane_mask: 1,
                    },
                    ld(space, 4, 0),
                    st(4, 0),
                    st(2, 0),
                ]
            };
            assert_eq!(order(&across(Space::Global), &tys), [0, 2, 1, 3, 4]);
            assert_eq!(order(&across(Space::Shared), &tys), [0, 2, 1, 3, 4]);
        }

        #[test]
        fn ldmatrix_fragments_move_before_the_first_mma() {
            // Two k-steps: ldmatrix b1..b4 from r0, mma into f6..f9, then
            // ldmatrix b10..b13 and a second mma. With the mma in the stretch
            // both ldmatrix loads come first; a stretch without one keeps them.
            let ldm = |d: u32| Inst::LdMatrix {
                dst: (d..d + 4).map(Reg).collect(),
                addr: Reg(0),
                trans: false,
            };
            let mma = |a: u32, c: u32| Inst::Mma {
                m: 16,
                n: 8,
                k: 16,
                input: MemTy::F16,
                d: (c..c + 4).map(Reg).collect(),
                a: (a..a + 4).map(Reg).collect(),
                b: vec![Reg(a), Reg(a + 1)],
                c: (c..c + 4).map(Reg).collect(),
            };
            let tys = vec![RegTy::U32; 14];
            let insts = [ldm(1), mma(1, 6), ldm(10), mma(10, 6)];
            assert_eq!(order(&insts, &tys), [0, 2, 1, 3]);
            let no_mma = [ldm(1), st(1, 0), ldm(10)];
            assert_eq!(order(&no_mma, &tys), [0, 1, 2]);
        }

        #[test]
        fn global_loads_move_up_to_the_load_window() {
            use super::super::LOAD_WINDOW_WORDS;
            // Loads each followed by an addition of its value: the first
            // LOAD_WINDOW_WORDS loads move to the top, the rest stay in place.
            let n = LOAD_WINDOW_WORDS + 3;
            let mut insts = Vec::new();
            for i in 0..n {
                insts.push(ld(Space::Global, 1 + 2 * i, 0));
                insts.push(add(2 + 2 * i, 1 + 2 * i, 1 + 2 * i));
            }
            let hoisted: Vec<*const Inst> = hoist_loads(&insts)
                .into_iter()
                .map(|i| i as *const Inst)
                .collect();
            let w = LOAD_WINDOW_WORDS as usize;
            for (k, p) in hoisted.iter().enumerate().take(w) {
                assert!(std::ptr::eq(*p, &insts[2 * k]), "load {k} first");
            }
            // After the window: the additions of the hoisted loads, then each
            // remaining load before its addition.
            assert!(std::ptr::eq(hoisted[w], &insts[1]));
            assert!(std::ptr::eq(hoisted[2 * w], &insts[2 * w]));
            assert!(std::ptr::eq(hoisted[2 * w + 1], &insts[2 * w + 1]));
        }

        #[test]
        fn instructions_that_free_more_than_they_write_are_not_sunk() {
            // f2 = f0 + f1 reads the last uses of two loaded values: it frees
            // two words for one and stays after the loads, where its
            // operands are ready, rather than sinking past the store of f3
            // (f3 = f5 + f5, of a value from outside the block, sinks).
            let insts = [
                ld(Space::Global, 0, 9),
                ld(Space::Global, 1, 9),
                add(2, 0, 1),
                add(3, 5, 5),
                st(3, 9),
                st(2, 9),
            ];
            let mut tys = vec![RegTy::F32; 9];
            tys.push(RegTy::U64);
            assert_eq!(order(&insts, &tys), [0, 1, 2, 3, 4, 5]);
            // With one operand from outside it frees one word for one: it
            // sinks to its reader.
            let mut one = insts.clone();
            one[2] = add(2, 0, 6);
            assert_eq!(order(&one, &tys), [0, 1, 3, 4, 2, 5]);
        }
    }

    #[test]
    fn loop_parameters_come_from_the_constant_bank_before_sm_90() {
        use crate::ir::target::{BinOp, Inst, Kernel, Operand, Param, Reg, RegTy};
        use crate::target::Arch;
        // r0 = param n; r1 = param p (64-bit); f2 = param a; for r3 in
        // range(0, r0, 1) { f4 = f2 + f2; r5 = r1 + r1 }.
        let param = |dst: u32, index: usize| Inst::Param {
            dst: Reg(dst),
            index,
        };
        let add = |dst: u32, a: u32| Inst::Binary {
            op: BinOp::Add,
            dst: Reg(dst),
            a: Operand::Reg(Reg(a)),
            b: Operand::Reg(Reg(a)),
        };
        let kernel = |arch| Kernel {
            name: "k".into(),
            arch,
            num_threads: 32,
            params: [("n", RegTy::I32), ("p", RegTy::U64), ("a", RegTy::F32)]
                .map(|(name, ty)| Param {
                    name: name.into(),
                    ty,
                })
                .to_vec(),
            smem: vec![],
            regs: vec![
                RegTy::I32,
                RegTy::U64,
                RegTy::F32,
                RegTy::I32,
                RegTy::F32,
                RegTy::U64,
            ],
            body: vec![
                param(0, 0),
                param(1, 1),
                param(2, 2),
                Inst::For {
                    iv: Reg(3),
                    lo: Operand::Int(0),
                    hi: Operand::Reg(Reg(0)),
                    step: Operand::Int(1),
                    body: vec![add(4, 2), add(5, 1)],
                },
            ],
            layouts: vec![],
        };
        let peak = |arch| {
            let (program, words) = program_of(&kernel(arch));
            max_pressure(&program, &|r| words[r as usize])
        };
        // sm_90 holds n, p and a across the loop with the induction variable
        // (5 words) and r5 (2); on sm_80 each use in the loop reads a copy:
        // the peak is r3, p's copy and r5.
        assert_eq!(peak(Arch::Sm90), 7);
        assert_eq!(peak(Arch::Sm80), 5);
        assert_eq!(peak(Arch::Sm70), 5);
    }

    #[test]
    fn loads_are_issued_early_only_as_far_as_the_register_limit() {
        use crate::ir::target::{Inst, Kernel, MemTy, Operand, Reg, RegTy, Space};
        use crate::target::Arch;
        // `n` k-steps, each an ldmatrix of 4 registers into one mma on the
        // accumulators r1..r4 (r0: the address): in order a few registers
        // are live; with every ldmatrix first, 4n.
        let kernel = |n: u32| {
            let mut body = Vec::new();
            for i in 0..n {
                let a: Vec<Reg> = (0..4).map(|j| Reg(5 + 4 * i + j)).collect();
                body.push(Inst::LdMatrix {
                    dst: a.clone(),
                    addr: Reg(0),
                    trans: false,
                });
                body.push(Inst::Mma {
                    m: 16,
                    n: 8,
                    k: 16,
                    input: MemTy::F16,
                    d: (1..5).map(Reg).collect(),
                    a: a.clone(),
                    b: a[..2].to_vec(),
                    c: (1..5).map(Reg).collect(),
                });
            }
            body.push(Inst::St {
                space: Space::Shared,
                mem: MemTy::F32,
                src: (1..5).map(|r| Operand::Reg(Reg(r))).collect(),
                addr: Reg(0),
                offset: 0,
                pred: None,
            });
            Kernel {
                name: "k".into(),
                arch: Arch::Sm80,
                num_threads: 32,
                params: vec![],
                smem: vec![],
                regs: vec![RegTy::U32; 5 + 4 * n as usize],
                body,
                layouts: vec![],
            }
        };
        // 30 k-steps fit (120 words early); 70 do not (280), but in order
        // they do: ptxas stops at the limit.
        assert!((120..=130).contains(&of_target(&kernel(30)).regs));
        assert_eq!(of_target(&kernel(70)).regs, 255);
    }

    #[test]
    fn short_constant_loops_are_unrolled_where_the_arch_does() {
        use super::{unroll_short_loops, Remat};
        use crate::ir::target::{BinOp, CmpOp, Inst, MemTy, Operand, Reg, RegTy, Space};
        // for r0 in range(0, 3, 1) { p1 = r0 == 0; if p1 {} else { f2 = ld [r4];
        // f3 = f3 + f2 } }, f3 written before the loop (carried).
        let body = vec![
            Inst::Cmp {
                op: CmpOp::Eq,
                ty: RegTy::I32,
                dst: Reg(1),
                a: Operand::Reg(Reg(0)),
                b: Operand::Int(0),
            },
            Inst::If {
                cond: Reg(1),
                then: vec![],
                otherwise: vec![
                    Inst::Ld {
                        space: Space::Global,
                        mem: MemTy::F32,
                        dst: vec![Reg(2)],
                        addr: Reg(4),
                        offset: 0,
                        pred: None,
                    },
                    Inst::Binary {
                        op: BinOp::Add,
                        dst: Reg(3),
                        a: Operand::Reg(Reg(3)),
                        b: Operand::Reg(Reg(2)),
                    },
                ],
            },
        ];
        let insts = [Inst::For {
            iv: Reg(0),
            lo: Operand::Int(0),
            hi: Operand::Int(3),
            step: Operand::Int(1),
            body,
        }];
        let tys = vec![RegTy::I32, RegTy::Pred, RegTy::F32, RegTy::F32, RegTy::U64];
        let remat = |max| Remat {
            remat: vec![false; 5],
            words: tys.iter().map(|t| t.words()).collect(),
            tys: tys.clone(),
            def_count: vec![1, 1, 1, 2, 1],
            consts: Default::default(),
            max_unroll_trips: max,
            bank_param: vec![false; 5],
            loop_depth: 0,
            hoist: true,
            chains: false,
            ilp: false,
        };
        // Three trips are more than two: the loop stays.
        assert_eq!(&*unroll_short_loops(&insts, &mut remat(2)), &insts);
        let mut rm = remat(4);
        let out = unroll_short_loops(&insts, &mut rm).into_owned();
        // The first iteration's branch folds to the empty arm, the others to
        // their loads, which write different registers; the last iteration
        // writes the original f2 and f3 and reads the second one's f3.
        assert!(out
            .iter()
            .all(|i| !matches!(i, Inst::For { .. } | Inst::If { .. })));
        let loads: Vec<Vec<Reg>> = out
            .iter()
            .filter_map(|i| match i {
                Inst::Ld { dst, .. } => Some(dst.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(loads.len(), 2);
        assert_ne!(loads[0], loads[1]);
        assert_eq!(loads[1], [Reg(2)]);
        match out.last() {
            Some(Inst::Binary {
                dst: Reg(3),
                a: Operand::Reg(Reg(a)),
                b: Operand::Reg(Reg(2)),
                ..
            }) => assert!(*a >= 5, "reads the previous iteration's sum"),
            other => panic!("unexpected last instruction {other:?}"),
        }
    }

    #[test]
    fn estimate_has_a_floor() {
        assert_eq!(estimate_regs(&[inst(&[0], &[])], &one), MIN_REGS);
    }

    fn usage(threads: u32, regs: u32, smem: u32) -> Resources {
        Resources::new("k", Arch::Sm90, threads, regs, smem)
    }

    #[test]
    fn warnings_and_errors() {
        let span = Span::new(4, 5);
        let codes = |r: &Resources| {
            r.diagnostics(span)
                .iter()
                .map(|d| d.code)
                .collect::<Vec<_>>()
        };
        // 128 threads, 32 regs: 16 blocks, 100%.
        assert!(codes(&usage(128, 32, 0)).is_empty());
        // 300 registers: a spill; occupancy is computed at 255 (2 blocks of 4
        // warps = 12.5%), so W0004 as well.
        let r = usage(128, 300, 0);
        assert_eq!(r.occupancy.blocks_per_sm, 2);
        assert_eq!(codes(&r), ["W0003", "W0004"]);
        // 200 KiB of shared memory: 1 block of 4 warps (6.25%), limited by it.
        let r = usage(128, 32, 200 * 1024);
        assert_eq!(codes(&r), ["W0004"]);
        assert!(
            r.diagnostics(span)[0].message.contains("shared memory"),
            "{:?}",
            r.diagnostics(span)
        );
        // 1024 threads x 128 registers cannot launch: E0602.
        assert_eq!(codes(&usage(1024, 128, 0)), ["E0602"]);
        assert_eq!(codes(&usage(128, 32, 230 * 1024)), ["E0603"]);
        assert_eq!(codes(&usage(2048, 16, 0)), ["E0604"]);
        // Exactly 25% is not under 25%: 16 warps of 64 (4 blocks x 4 warps).
        let r = usage(128, 32, 48 * 1024);
        assert_eq!(r.occupancy.occupancy(), 0.25);
        assert!(codes(&r).is_empty());
    }

    #[test]
    fn json_and_table() {
        let rows = [
            usage(128, 40, 16384),
            Resources::new("flash_attn", Arch::Sm80, 256, 168, 49152),
        ];
        let v: serde_json::Value = serde_json::from_str(&render_json(&rows)).unwrap();
        let a = v.as_array().unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[1]["kernel"], "flash_attn");
        assert_eq!(a[1]["arch"], "sm_80");
        assert_eq!(a[1]["threads"], 256);
        assert_eq!(a[1]["regs"], 168);
        assert_eq!(a[1]["smem_bytes"], 49152);
        // 168 regs: 5376 a warp; 16384 / 5376 = 3 warps a sub-partition, 12 an
        // SM, 1 block of 8 warps: 12.5%.
        assert_eq!(a[1]["blocks_per_sm"], 1);
        assert_eq!(a[1]["occupancy"], 0.125);
        assert_eq!(a[1]["limiter"], "registers");
        let t = render_table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("kernel"));
        assert!(lines[2].starts_with("flash_attn  sm_80"), "{t}");
        assert!(lines[2].ends_with("registers"), "{t}");
    }
}
