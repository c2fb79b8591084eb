//! Asynchronous copies and the software pipeline of `for` loops (sm_80+).
//!
//! The decisions come first and are data: which loads may skip registers
//! (`candidates`, found once before lowering by `find_deferrable`), whether
//! each such load outside a pipelined loop is deferred to its dot, and per
//! `for` loop (`plan_loop`, before any of its code is emitted) the deferred
//! loads from outside it that its dots read (attention's q: copied once,
//! before it) and the loads in its body that are pipelined. Together they are
//! the kernel's [`PipelinePlan`], printable one decision per line; the code
//! below only carries it out.
//!
//! A pipelined load feeds only tensor-core dots, is indexed by the induction
//! variable (other indices from outside the loop), and is provably 16-byte
//! aligned; it gets `num_stages` swizzled buffers. The copies for the first
//! `num_stages - 1` iterations are issued before the loop, and each iteration
//! waits for its own stage, passes one barrier, and issues the copies
//! `num_stages - 1` iterations ahead after its first dot.
//!
//! Invariant: pipeline and loop-invariant buffers live through the whole
//! loop, so `lower` places them after every transient region of the arena
//! (`Pipeline::persistent`).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::rc::Rc;

use super::across::OuterLoop;
use super::async_copy::Deferred;
use super::control::has_dot;
use super::tma::TmaPipe;
use super::{Lower, R};
use crate::check::DType;
use crate::ir::target::layout::{Layout, WarpOrder};
use crate::ir::target::{
    BinOp, CmpOp, Inst, LayoutKind, Operand, Reg, RegTy, SmemBuffer, Swizzle, TensorMap,
};
use crate::ir::tile::{self, Access, Constant, OpKind, Value};
use crate::target::{Arch, MmaFeed};

/// The state of asynchronous copies and software pipelines while one kernel
/// is lowered (part of `Lower`).
pub(super) struct Pipeline {
    /// Loads whose only uses are tensor-core `dot` operands (possibly through a
    /// transpose), found before lowering (sm_80+).
    pub(super) defer_ok: HashSet<Value>,
    /// Deferred loads: copied with `cp.async` straight into the dot's staging
    /// buffer when the dot runs; `bool` is whether the value is transposed.
    pub(super) deferred: HashMap<Value, (Rc<Deferred>, bool)>,
    /// Software-pipelined loads (`num_stages` >= 2) and loop-invariant
    /// operands copied once: the pipe and whether the value is transposed.
    pub(super) pipelined: HashMap<Value, (usize, bool)>,
    /// Loads of the loop body being lowered that are pipelined (value → pipe).
    pub(super) pipelined_pending: HashMap<Value, usize>,
    pub(super) pipes: Vec<Pipe>,
    /// Buffers live across a whole loop (pipeline stages): placed after every
    /// other region of the arena.
    pub(super) persistent: Vec<usize>,
    /// Values standing for others while planning a future iteration's loads.
    pub(super) overrides: HashMap<Value, Operand>,
    /// The decisions made so far.
    pub(super) plan: PipelinePlan,
}

/// The asynchronous-copy decisions of one kernel, in the order they were
/// made. `Display` prints one per line, e.g.
///
/// ```text
/// cp.async on sm_80, num_stages = 3
/// candidates: %5 a[128, 32], %9 b[32, 128]
/// loop %3: pipelined over 3 stages, copied 2 iterations ahead: %5 a[128, 32], %9 b[32, 128]
/// ```
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PipelinePlan {
    pub(crate) arch: Arch,
    /// Whether the arch has `cp.async`; without it nothing else is planned.
    pub(crate) cp_async: bool,
    pub(crate) num_stages: u32,
    /// The loads of 16-bit tiles used only as tensor-core `dot` operands, of
    /// tensors the kernel never writes, in program order.
    pub(crate) candidates: Vec<PlannedLoad>,
    pub(crate) decisions: Vec<Decision>,
}

impl Pipeline {
    pub(super) fn new(arch: Arch, num_stages: u32) -> Self {
        Pipeline {
            defer_ok: HashSet::new(),
            deferred: HashMap::new(),
            pipelined: HashMap::new(),
            pipelined_pending: HashMap::new(),
            pipes: Vec::new(),
            persistent: Vec::new(),
            overrides: HashMap::new(),
            plan: PipelinePlan {
                arch,
                cp_async: arch.features().cp_async,
                num_stages,
                candidates: Vec::new(),
                decisions: Vec::new(),
            },
        }
    }
}

/// A load of a tensor tile, as the plan names it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PlannedLoad {
    pub(crate) value: Value,
    /// The tensor parameter's index and name.
    pub(crate) tensor: usize,
    pub(crate) name: String,
    pub(crate) shape: Vec<u32>,
    pub(crate) access: Vec<Access>,
    pub(crate) other: Constant,
}

/// One decision of a [`PipelinePlan`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Decision {
    /// A candidate copied with `cp.async` into its dot's operand buffer
    /// (every 16-byte chunk provably aligned).
    Deferred(PlannedLoad),
    /// A candidate loaded into registers: masked, or its 16-byte chunks not
    /// provably aligned.
    InRegisters(PlannedLoad),
    /// A `for` loop with something to copy asynchronously.
    Loop(LoopPlan),
}

/// What a `for` loop copies asynchronously (decided before its code).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LoopPlan {
    /// The loop's induction variable (names the loop).
    pub(crate) iv: Value,
    /// Deferred loads from outside the loop used as dot operands in its body:
    /// copied once, before it.
    pub(crate) invariant: Vec<Value>,
    /// Loads in the body pipelined over `stages` buffers (empty when none).
    pub(crate) pipelined: Vec<PlannedLoad>,
    pub(crate) stages: u32,
    /// Whether the loop's one dot reads its first k step's fragments of the
    /// next stage at the end of each iteration (see [`Rotation`]).
    pub(crate) rotated: bool,
    /// The loop's one dot on `wgmma` (sm_90a): its operands, both pipelined.
    pub(crate) wgmma: Option<(Value, Value)>,
    /// Whether the wgmma loop's stages are copied by TMA (`tma.rs`), not
    /// `cp.async`.
    pub(crate) tma: bool,
    /// Whether the invariant operands are copied by TMA too
    /// ([`Lower::invariant_tma`]), not `cp.async`.
    pub(crate) invariant_tma: bool,
    /// The loop's dots on `wgmma`, each waited for where it is issued
    /// (sm_90a; [`Lower::waited_wgmma_dots`]): every dot of a loop that is
    /// not the GEMM mainloop of `wgmma` above, or none.
    pub(crate) wgmma_waited: Vec<WaitedWgmma>,
    /// The outer loop (its variable) the TMA pipeline runs across
    /// (`across.rs`).
    pub(crate) across: Option<Value>,
}

/// A dot a loop plan put on `wgmma`, waited for where it is issued: its
/// operands and the 16-row tiles each warp holds of its result (`tiles`,
/// the m64 instructions each warpgroup issues per k step of 16).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct WaitedWgmma {
    pub(crate) a: Value,
    pub(crate) b: Value,
    pub(crate) tiles: u32,
    /// The carried value (body argument) whose registers the dot updates in
    /// place and leaves in flight, waited for by the next iteration's first
    /// dot (or after the loop) instead of where it is issued
    /// ([`in_flight_carry`]): attention's `acc`.
    pub(crate) in_flight: Option<Value>,
}

impl LoopPlan {
    /// How many iterations ahead of its use a pipelined load is copied:
    /// `stages - 1`, or `stages - 2` where the dot runs on wgmma with
    /// `cp.async`, one iteration's group of which stays in flight (still
    /// reading its stage) while the next iteration's copies are issued. With
    /// TMA a barrier tells when that group is done (`tma.rs`).
    pub(crate) fn prefetch_distance(&self) -> u32 {
        match self.wgmma {
            Some(_) if !self.tma => self.stages - 2,
            _ => self.stages - 1,
        }
    }
}

impl LoopPlan {
    /// The swizzle of a `[rows, cols]` tile of load `v` (pipelined or copied
    /// once) that the plan's waited wgmma dots read: 128-byte panels, rows in
    /// warpgroup order where it is an `a` of more than one 16-row tile a
    /// warp. `None` where no such dot reads it.
    pub(crate) fn waited_swizzle(&self, v: Value, rows: u32, cols: u32) -> Option<Swizzle> {
        let panels = Swizzle::panels(cols * 2, rows);
        if let Some(d) = self.wgmma_waited.iter().find(|d| d.a == v) {
            return Some(panels.in_warpgroup_order(d.tiles));
        }
        (!self.wgmma_waited.is_empty()).then_some(panels)
    }
}

impl fmt::Display for PlannedLoad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        write!(f, "{} {}[{}]", self.value, self.name, dims.join(", "))
    }
}

fn list<T: fmt::Display>(xs: &[T]) -> String {
    xs.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for PipelinePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.cp_async {
            return writeln!(
                f,
                "no cp.async on {}: every load goes through registers",
                self.arch
            );
        }
        writeln!(
            f,
            "cp.async on {}, num_stages = {}",
            self.arch, self.num_stages
        )?;
        if self.candidates.is_empty() {
            return writeln!(f, "candidates: none");
        }
        writeln!(f, "candidates: {}", list(&self.candidates))?;
        for d in &self.decisions {
            match d {
                Decision::Deferred(l) => writeln!(f, "load {l}: deferred to its dot")?,
                Decision::InRegisters(l) => writeln!(f, "load {l}: in registers")?,
                Decision::Loop(p) => {
                    write!(f, "loop {}:", p.iv)?;
                    if !p.invariant.is_empty() {
                        write!(f, " copied once before it: {}", list(&p.invariant))?;
                        if p.invariant_tma {
                            write!(f, " by TMA")?;
                        }
                        if !p.pipelined.is_empty() {
                            write!(f, ";")?;
                        }
                    }
                    if !p.pipelined.is_empty() {
                        let ahead = p.prefetch_distance();
                        let its = if ahead == 1 {
                            "iteration"
                        } else {
                            "iterations"
                        };
                        write!(
                            f,
                            " pipelined over {} stages, copied {ahead} {its} ahead: {}",
                            p.stages,
                            list(&p.pipelined)
                        )?;
                        if p.rotated {
                            write!(f, "; the dot's first k step read an iteration early")?;
                        }
                        if p.wgmma.is_some() {
                            write!(f, "; the dot on wgmma")?;
                        }
                        if !p.wgmma_waited.is_empty() {
                            write!(f, "; the dots on wgmma")?;
                        }
                        if p.tma {
                            write!(f, ", the copies by TMA")?;
                        }
                        if let Some(o) = p.across {
                            write!(f, " across the iterations of loop {o}")?;
                        }
                    }
                    writeln!(f)?;
                }
            }
        }
        Ok(())
    }
}

impl<'a> Lower<'a> {
    /// What the `for` loop with body `body` copies asynchronously, decided
    /// before any of its code is emitted: the deferred loads from outside it
    /// that its dots read (copied once, before it, instead of at every
    /// iteration's dot), and, with `cp.async` and `num_stages` >= 2, the loads
    /// in its body that feed only tensor-core dots, are indexed by the
    /// induction variable or values from outside the loop, and are provably
    /// aligned (pipelined).
    pub(super) fn plan_loop(&self, body: &tile::Region) -> LoopPlan {
        let mut invariant = Vec::new();
        for op in &body.ops {
            let cands: Vec<Value> = match &op.kind {
                OpKind::Dot { a, b, .. } => vec![*a, *b],
                OpKind::Transpose { x } => vec![*x],
                _ => vec![],
            };
            for v in cands {
                if self.pipeline.deferred.contains_key(&v)
                    && !self.pipeline.pipelined.contains_key(&v)
                    && !invariant.contains(&v)
                {
                    invariant.push(v);
                }
            }
        }
        let stages = self.tk.num_stages;
        let iv = body.args[0];
        let mut pipelined = Vec::new();
        if self.feat.cp_async && stages >= 2 {
            let outside = |l: &Self, v: &Value| !body.args.contains(v) && l.vals.contains_key(v);
            let offsets = self.iv_offsets(body);
            for op in &body.ops {
                let OpKind::Load {
                    tensor,
                    access,
                    mask: None,
                    other,
                } = &op.kind
                else {
                    continue;
                };
                let v = op.results[0];
                let by_iv = |x: &Value| *x == iv || offsets.contains_key(x);
                let uses_iv = access
                    .iter()
                    .any(|a| matches!(a, Access::Range { start, .. } if by_iv(start)));
                let indices_ok = access.iter().all(|a| match a {
                    Access::Point(x) => outside(self, x),
                    Access::Range { start, .. } => by_iv(start) || outside(self, start),
                    Access::Gather(_) => false,
                });
                let shape = self.tk.ty(v).shape().to_vec();
                if self.pipeline.defer_ok.contains(&v)
                    && uses_iv
                    && indices_ok
                    && self.can_defer(*tensor, access, *other, &shape)
                {
                    pipelined.push(self.planned_load(v, *tensor, access, *other));
                }
            }
        }
        let wgmma = (stages >= 3)
            .then(|| self.wgmma_operands(body, &pipelined, stages))
            .flatten();
        let wgmma_waited = match wgmma {
            None => self.waited_wgmma_dots(body, &pipelined, &invariant),
            Some(_) => Vec::new(),
        };
        let rotated =
            wgmma.is_none() && wgmma_waited.is_empty() && self.rotatable(body, &pipelined, stages);
        LoopPlan {
            iv,
            invariant,
            pipelined,
            stages,
            rotated,
            wgmma,
            tma: false,
            invariant_tma: false,
            wgmma_waited,
            across: None,
        }
    }

    /// The body's scalars `iv + c` and `iv - c` (`iv` its loop variable, `c`
    /// from outside the loop), by value: a pipelined load may start at one
    /// (attention's `v[n0 - BN : n0]`, the block before the keys'), and
    /// the copies for another iteration compute it from that iteration's
    /// variable ([`Self::bind_iv`]).
    pub(super) fn iv_offsets(&self, body: &tile::Region) -> HashMap<Value, (BinOp, Value)> {
        let iv = body.args[0];
        let outside = |v: &Value| !body.args.contains(v) && self.vals.contains_key(v);
        body.ops
            .iter()
            .filter_map(|o| {
                let OpKind::Binary { op, a, b } = &o.kind else {
                    return None;
                };
                let (op, c) = match op {
                    tile::BinaryOp::Add if *a == iv => (BinOp::Add, *b),
                    tile::BinaryOp::Add if *b == iv => (BinOp::Add, *a),
                    tile::BinaryOp::Sub if *a == iv => (BinOp::Sub, *b),
                    _ => return None,
                };
                outside(&c).then_some((o.results[0], (op, c)))
            })
            .filter(|(v, _)| self.tk.ty(*v).dtype() == DType::I32)
            .collect()
    }

    /// Binds the loop variable of `body` to `ivv` for the copies of another
    /// iteration: it and the body's `iv ± c` scalars (`iv_offsets`) stand for
    /// that iteration's (in `overrides`, cleared after the copies).
    pub(super) fn bind_iv(&mut self, body: &tile::Region, p: &LoopPipe, ivv: Operand) {
        self.pipeline.overrides.insert(body.args[0], ivv);
        for &(v, (op, c)) in &p.offsets {
            let c = self.scalar(c);
            let x = self.bin(op, RegTy::I32, ivv, c);
            let x = self.materialize(RegTy::I32, x);
            self.pipeline.overrides.insert(v, x);
        }
    }

    /// The dots of a loop that run on `wgmma`, each waited for where it is
    /// issued (sm_90a): all of the body's dots, or none. Each has 16-bit
    /// operands and f32 accumulators in the accumulator layout `mma.sync`
    /// would give it with every warp along the rows (a warpgroup per `64
    /// tiles` rows, so the rest of the loop is the same code), and reads
    /// * `b` from a pipeline stage: the load (n-major, `n` a multiple of 64)
    ///   or its transpose (k-major, `k` a multiple of 64), in 128-byte panels;
    /// * `a` from a pipeline stage or the loop-invariant copy of a load
    ///   (k-major, `k` a multiple of 64, rows in warpgroup order:
    ///   [`Swizzle::warpgroup_tiles`]), or from registers (bf16, packed
    ///   into fragments as FA2's P is: attention's second dot).
    pub(super) fn waited_wgmma_dots(
        &self,
        body: &tile::Region,
        pipelined: &[PlannedLoad],
        invariant: &[Value],
    ) -> Vec<WaitedWgmma> {
        fn dots<'r>(ops: &'r [tile::Op], out: &mut Vec<&'r tile::Op>) {
            for o in ops {
                if matches!(o.kind, OpKind::Dot { .. }) {
                    out.push(o);
                }
                for r in o.kind.regions() {
                    dots(&r.ops, out);
                }
            }
        }
        fn transposes(ops: &[tile::Op], v: Value) -> Option<Value> {
            ops.iter().find_map(|o| match &o.kind {
                OpKind::Transpose { x } if o.results[0] == v => Some(*x),
                kind => kind.regions().iter().find_map(|r| transposes(&r.ops, v)),
            })
        }
        if !self.feat.wgmma || pipelined.is_empty() {
            return Vec::new();
        }
        let mut found = Vec::new();
        dots(&body.ops, &mut found);
        let loaded = |v: Value| pipelined.iter().any(|l| l.value == v);
        let nw = self.num_warps;
        let mut out = Vec::new();
        for op in &found {
            let OpKind::Dot {
                a,
                b,
                precision: tile::Precision::Ieee,
                ..
            } = op.kind
            else {
                return Vec::new();
            };
            let (ta, tb) = (self.tk.ty(a), self.tk.ty(b));
            let (Some(&[m, k]), Some(&[_, n])) = (ta.shape().get(..2), tb.shape().get(..2)) else {
                return Vec::new();
            };
            let dtype = ta.dtype();
            if dtype != tb.dtype()
                || !matches!(dtype, DType::BF16 | DType::F16)
                || !nw.is_multiple_of(4)
                || !m.is_multiple_of(16 * nw)
                || !(m / (16 * nw)).is_power_of_two()
                || !k.is_multiple_of(16)
                || !n.is_multiple_of(8)
                || n > 256
            {
                return Vec::new();
            }
            // The accumulator layout `mma.sync` would take (so every other
            // op of the loop is lowered as it would be without wgmma).
            let rows_first = Layout::mma_accumulator(m, n, nw, WarpOrder::RowsFirst);
            let same = self
                .mma_plan(dtype, dtype, [m, n, k], tile::Precision::Ieee)
                .is_some_and(|(_, l)| Some(&*l) == rows_first.as_ref());
            let along_rows = matches!(
                rows_first.as_ref().map(|l| &l.kind),
                Some(LayoutKind::Mma { warps, .. }) if warps[..] == [nw, 1]
            );
            if !same || !along_rows {
                return Vec::new();
            }
            let b_ok = match transposes(&body.ops, b) {
                Some(x) => loaded(x) && k.is_multiple_of(64),
                None => loaded(b) && n.is_multiple_of(64),
            };
            let copied = |v: Value| {
                loaded(v)
                    || invariant.contains(&v)
                        && self.pipeline.deferred.get(&v).is_some_and(|(_, t)| !t)
            };
            let a_ok = match copied(a) {
                true => k.is_multiple_of(64),
                // In registers: bf16 (packed as FA2's P), not a load that
                // skips registers, nor a transpose of one.
                false => {
                    dtype == DType::BF16
                        && self.feat.cvt_bf16
                        && !self.pipeline.defer_ok.contains(&a)
                        && !self.pipeline.deferred.contains_key(&a)
                        && transposes(&body.ops, a).is_none()
                }
            };
            if !a_ok || !b_ok {
                return Vec::new();
            }
            out.push(WaitedWgmma {
                a,
                b,
                tiles: m / (16 * nw),
                in_flight: match nw {
                    4 => in_flight_carry(body, op),
                    _ => None,
                },
            });
        }
        // A tile in warpgroup order is read as an `a` only.
        let b_sources: Vec<Value> = out
            .iter()
            .map(|d| transposes(&body.ops, d.b).unwrap_or(d.b))
            .collect();
        if out.iter().any(|d| d.tiles > 1 && b_sources.contains(&d.a)) {
            return Vec::new();
        }
        out
    }

    /// The operands of a pipelined loop's dot that runs on `wgmma` (sm_90a):
    /// the body's only dot, at its top level, whose `a` is a pipelined load
    /// of the loop and whose `b` is one or the transpose of one (k-major,
    /// which an 8-bit or tf32 `b` must be), whose accumulator is a loop-carried
    /// value read by nothing else in the body (it is updated in place), and
    /// whose shape and dtype fit ([`Lower::wgmma_fits`]).
    fn wgmma_operands(
        &self,
        body: &tile::Region,
        pipelined: &[PlannedLoad],
        stages: u32,
    ) -> Option<(Value, Value)> {
        if !self.feat.wgmma {
            return None;
        }
        let op = only_dot(body)?;
        let OpKind::Dot {
            a,
            b,
            acc: Some(acc),
            precision,
        } = &op.kind
        else {
            return None;
        };
        let loaded = |v: &Value| pipelined.iter().any(|l| l.value == *v);
        let b_kmajor = !loaded(b);
        let b_source = match b_kmajor {
            true => body.ops.iter().find_map(|o| match o.kind {
                OpKind::Transpose { x } if o.results[0] == *b => Some(x),
                _ => None,
            })?,
            false => *b,
        };
        if !loaded(a) || !loaded(&b_source) || !body.args[1..].contains(acc) {
            return None;
        }
        // wgmma transposes 16-bit operands only: an 8-bit `b` must be
        // k-major; an n-major tf32 one is transposed in shared memory as it
        // is rounded (`Lower::transpose_stage_to_tf32`).
        if !b_kmajor && !matches!(self.tk.ty(*b).dtype().bytes(), 2 | 4) {
            return None;
        }
        let readers = body.ops.iter().filter(|o| op_reads(o, *acc)).count();
        // The result is only carried to the next iteration: its group stays
        // in flight while the loop goes on (waited for after the loop).
        let result = op.results[0];
        let yielded_only = body
            .ops
            .iter()
            .all(|o| matches!(o.kind, OpKind::Yield(_)) || !op_reads(o, result));
        if readers != 1 || !yielded_only {
            return None;
        }
        let (ta, tb) = (self.tk.ty(*a), self.tk.ty(*b));
        let [m, k] = ta.shape()[..] else { return None };
        let n = tb.shape()[1];
        // An n-major tf32 `b`'s stages hold its transpose too: where that
        // overflows shared memory, the loop stays on `mma.sync`.
        let bytes = |t: &tile::Type| t.shape().iter().product::<u32>() as u64 * t.dtype().bytes();
        let transposed = !b_kmajor && tb.dtype().bytes() == 4;
        if transposed
            && u64::from(stages) * (bytes(ta) + 2 * bytes(tb))
                > u64::from(self.arch.info().max_smem_per_block)
        {
            return None;
        }
        (ta.dtype() == tb.dtype() && self.wgmma_fits(ta.dtype(), *precision, [m, n, k]))
            .then_some((*a, *b))
    }

    /// Whether a pipelined loop's dot can be rotated ([`Rotation`]): the
    /// body's only dot, at its top level, both operands pipelined loads of
    /// the loop (or their transposes), on `mma.sync` m16n8k16 with at least
    /// two k steps (the next stage's first one is loaded over the last's
    /// registers otherwise), and at least three stages (the copies ahead are
    /// issued right before the wait for the next stage, which so still has
    /// an iteration to arrive).
    fn rotatable(&self, body: &tile::Region, pipelined: &[PlannedLoad], stages: u32) -> bool {
        if stages < 3 {
            return false;
        }
        let Some(op) = only_dot(body) else {
            return false;
        };
        let OpKind::Dot {
            a, b, precision, ..
        } = &op.kind
        else {
            return false;
        };
        let loaded = |v: &Value| pipelined.iter().any(|l| l.value == *v);
        let piped = |v: &Value| {
            loaded(v)
                || body.ops.iter().any(|o| {
                    matches!(&o.kind, OpKind::Transpose { x } if o.results[0] == *v && loaded(x))
                })
        };
        if !piped(a) || !piped(b) {
            return false;
        }
        let (ta, tb) = (self.tk.ty(*a), self.tk.ty(*b));
        let [m, k] = ta.shape()[..] else { return false };
        let n = tb.shape()[1];
        let plan = self.mma_plan(ta.dtype(), tb.dtype(), [m, n, k], *precision);
        matches!(plan, Some((inst, _)) if inst.feed == MmaFeed::Ldmatrix && inst.k == 16)
            && k / 16 >= 2
    }

    /// Drops a plan's pipelined 8-bit and f32 loads (tf32 operands), and the
    /// wgmma dot reading them, where no TMA pipeline copies them (`cp.async`
    /// chunks are 16-bit only): those loads go to registers, their dot to the
    /// FMA units (8-bit) or `mma.sync` (tf32).
    pub(super) fn drop_tma_only_loads(&self, plan: &mut LoopPlan) {
        let tma_only = |l: &PlannedLoad| self.elem_bytes(l.value) != 2;
        if plan.pipelined.iter().any(tma_only) {
            plan.pipelined.retain(|l| !tma_only(l));
            plan.wgmma = None;
        }
    }

    /// The swizzle a pipelined load's stages are stored with where a wgmma
    /// dot of the plan reads them (the mainloop's operands, or the waited
    /// dots' panels), `None` where `ldmatrix` does.
    pub(super) fn wgmma_stage_swizzle(
        &self,
        plan: &LoopPlan,
        load: &PlannedLoad,
    ) -> Option<Swizzle> {
        let (rows, cols) = (load.shape[0], load.shape[1]);
        match plan.wgmma {
            Some((_, b)) => Some(Self::wgmma_swizzle(
                b == load.value,
                rows,
                cols * self.elem_bytes(load.value),
            )),
            None => plan.waited_swizzle(load.value, rows, cols),
        }
    }

    /// Whether a pipelined load is the n-major `b` of a tf32 wgmma dot:
    /// wgmma reads tf32 operands k-major only, so its stages are transposed
    /// in shared memory ([`Lower::transpose_stage_to_tf32`]) into the second
    /// half of each stage.
    pub(super) fn tf32_transposed(&self, plan: &LoopPlan, load: &PlannedLoad) -> bool {
        matches!(plan.wgmma, Some((_, b)) if b == load.value) && self.elem_bytes(load.value) == 4
    }

    /// The bytes of an element of tile `v`.
    pub(super) fn elem_bytes(&self, v: Value) -> u32 {
        self.tk.ty(v).dtype().bytes() as u32
    }

    /// A load as the plan names it.
    pub(super) fn planned_load(
        &self,
        value: Value,
        tensor: usize,
        access: &[Access],
        other: Constant,
    ) -> PlannedLoad {
        PlannedLoad {
            value,
            tensor,
            name: self.tk.params[tensor].name.clone(),
            shape: self.tk.ty(value).shape().to_vec(),
            access: access.to_vec(),
            other,
        }
    }

    /// The buffers of a loop's invariant dot operands (`LoopPlan::invariant`),
    /// which live through it, each with its pipe; [`Self::copy_invariant_operands`]
    /// copies them.
    pub(super) fn invariant_buffers(&mut self, plan: &LoopPlan) -> Vec<(Value, usize)> {
        let mut out = Vec::new();
        for &v in &plan.invariant {
            let (d, trans) = self.pipeline.deferred[&v].clone();
            let (rows, cols) = (d.layout.shape[0], d.layout.shape[1]);
            // Read by wgmma (its canonical layouts, 1024-byte swizzle atoms)
            // or by `ldmatrix`.
            let (sw, align) = match plan.waited_swizzle(v, rows, cols) {
                Some(sw) => (sw, 1024),
                None => (Swizzle::for_rows(cols * 2), 128),
            };
            let buffer = self.buffers.len();
            self.buffers.push(SmemBuffer {
                name: format!("invariant{}", self.pipeline.pipes.len()),
                offset: 0,
                bytes: rows * cols * 2,
                align,
                purpose: format!(
                    "a loop-invariant `dot` operand ([{rows}, {cols}] 16-bit, swizzled)"
                ),
                swizzle: Some(sw),
            });
            self.pipeline.persistent.push(buffer);
            self.pipeline.pipes.push(Pipe {
                buffer,
                sw,
                stage_bytes: 0,
                stage: self.tid,
            });
            self.pipeline
                .pipelined
                .insert(v, (self.pipeline.pipes.len() - 1, trans));
            out.push((v, buffer));
        }
        out
    }

    /// Copies a loop's invariant dot operands once, before it, into their
    /// [`Self::invariant_buffers`].
    pub(super) fn copy_invariant_operands(&mut self, buffers: &[(Value, usize)]) {
        if buffers.is_empty() {
            return;
        }
        self.emit(Inst::Comment(format!(
            "{} loop-invariant dot operands copied once",
            buffers.len()
        )));
        for &(v, buffer) in buffers {
            let (d, _) = self.pipeline.deferred[&v].clone();
            let sw = self.buffers[buffer].swizzle.expect("a swizzled buffer");
            let buf = self.new_reg(RegTy::U32);
            self.emit(Inst::SmemAddr { dst: buf, buffer });
            self.issue_copies(&d, buf, sw);
        }
        self.emit(Inst::CpAsyncCommit);
    }

    /// Sets up the software pipeline a loop's plan asks for (none when it
    /// pipelines no load): `num_stages` buffers per pipelined load, and the
    /// copies of the first `num_stages - 1` iterations, issued now, one commit
    /// group per iteration.
    pub(super) fn pipeline_prologue(
        &mut self,
        body: &tile::Region,
        plan: &LoopPlan,
        maps: Option<Vec<TensorMap>>,
        [lo, hi, step]: [Operand; 3],
        across: Option<(&mut OuterLoop, Vec<tile::Op>)>,
    ) -> R<Option<LoopPipe>> {
        let (loads, stages) = (&plan.pipelined, plan.stages);
        if loads.is_empty() {
            return Ok(None);
        }
        let across = across.filter(|_| maps.is_some());
        // The stage register counts every tile's iterations where the
        // pipeline runs across an outer loop: set before that loop.
        let start = |l: &mut Self| {
            l.emit(Inst::Comment(format!(
                "software pipeline: {} loads, {stages} stages{}",
                loads.len(),
                if across.is_some() {
                    ", across the loop around"
                } else {
                    ""
                }
            )));
            let stage = l.new_reg(RegTy::U32);
            l.emit(Inst::Mov {
                dst: stage,
                src: Operand::Int(0),
            });
            stage
        };
        let stage = match &across {
            Some((outer, _)) => self.before_outer(outer.depth(), start),
            None => start(self),
        };
        let mut pipes = Vec::new();
        for load in loads {
            let (rows, cols) = (load.shape[0], load.shape[1]);
            let row_bytes = cols * self.elem_bytes(load.value);
            // An n-major tf32 `b` of wgmma: each stage holds the landed
            // panels and, after them, their transpose (`Self::tf32_transposed`).
            let copies = match self.tf32_transposed(plan, load) {
                true => 2,
                false => 1,
            };
            let stage_bytes = copies * rows * row_bytes;
            // wgmma's operands in its canonical layouts, whose swizzle atoms
            // (up to 1024 bytes) must start at multiples of their size.
            let (sw, align) = match self.wgmma_stage_swizzle(plan, load) {
                Some(sw) => (sw, 1024),
                None => (Swizzle::for_rows(cols * 2), 128),
            };
            let buffer = self.buffers.len();
            self.buffers.push(SmemBuffer {
                name: format!("pipe{}_{}", self.pipeline.pipes.len(), load.name),
                offset: 0,
                bytes: stage_bytes * stages,
                align,
                purpose: format!(
                    "{stages} stages of a pipelined `dot` operand ([{rows}, {cols}] {}-bit, swizzled)",
                    8 * row_bytes / cols
                ),
                swizzle: Some(sw),
            });
            self.pipeline.persistent.push(buffer);
            self.pipeline.pipes.push(Pipe {
                buffer,
                sw,
                stage_bytes,
                stage,
            });
            let pi = self.pipeline.pipes.len() - 1;
            self.pipeline.pipelined_pending.insert(load.value, pi);
            pipes.push(pi);
        }
        let offsets = self.iv_offsets(body);
        let offsets = offsets
            .into_iter()
            .filter(|(v, _)| {
                loads.iter().any(|l| {
                    l.access
                        .iter()
                        .any(|a| matches!(a, Access::Range { start, .. } if start == v))
                })
            })
            .collect();
        let mut p = LoopPipe {
            offsets,
            loads: loads.iter().cloned().zip(pipes).collect(),
            stage,
            stages,
            ahead: plan.prefetch_distance(),
            wgmma: plan.wgmma.is_some() || !plan.wgmma_waited.is_empty(),
            tma: None,
        };
        if let Some(maps) = maps {
            p.tma = Some(self.tma_prologue(body, &p, maps, lo, hi, step, across)?);
            return Ok(Some(p));
        }
        for s in 0..p.ahead {
            let off = self.bin(BinOp::Mul, RegTy::I32, step, Operand::Int(s as i64));
            let ivs = self.bin(BinOp::Add, RegTy::I32, lo, off);
            self.issue_stage(body, &p, ivs, Operand::Int(s as i64))?;
            self.emit(Inst::CpAsyncCommit);
        }
        Ok(Some(p))
    }

    /// At the top of the loop body: a wait for this iteration's stage and a
    /// barrier. The barrier both publishes this iteration's stage and retires
    /// every thread's reads of the previous one, so a dot that reads only
    /// pipeline stages needs no barrier of its own, before or after (one
    /// barrier an iteration, as CUTLASS's multistage mainloop has), and the
    /// copies `num_stages - 1` iterations ahead may go into the stage the
    /// previous iteration read anywhere after it ([`Self::pipeline_issue_ahead`]).
    pub(super) fn pipeline_wait(&mut self, p: &LoopPipe) {
        if let Some(t) = &p.tma {
            return self.tma_wait(p, t);
        }
        // Committed so far: the `ahead` groups of the prologue and one an
        // iteration; this iteration's is complete when at most `ahead - 1`
        // are pending.
        self.emit(Inst::CpAsyncWait {
            pending: p.ahead - 1,
        });
        if p.wgmma {
            // The stage's copies, complete for this thread, become visible
            // to wgmma's reads (the asynchronous proxy) before the barrier.
            self.emit(Inst::FenceProxyAsync);
        }
        self.emit(Inst::Barrier);
    }

    /// The copies for `num_stages - 1` iterations ahead, into the stage the
    /// previous iteration read, as one commit group. `for_loop` issues them
    /// after the body's first dot: its operand reads (`ldmatrix`) then start
    /// right after the barrier, and its matrix instructions overlap the
    /// copies' address arithmetic.
    pub(super) fn pipeline_issue_ahead(
        &mut self,
        body: &tile::Region,
        p: &LoopPipe,
        iv: Operand,
        [lo, hi, step]: [Operand; 3],
    ) -> R<()> {
        if let Some(t) = &p.tma {
            return self.tma_issue_ahead(body, p, t, iv, lo, hi, step);
        }
        let ahead = i64::from(p.ahead);
        let t = self.bin(
            BinOp::Add,
            RegTy::U32,
            Operand::Reg(p.stage),
            Operand::Int(ahead),
        );
        let wrap = self.cmp(CmpOp::Ge, RegTy::U32, t, Operand::Int(p.stages as i64));
        let u = self.bin(BinOp::Sub, RegTy::U32, t, Operand::Int(p.stages as i64));
        let next = self.select(RegTy::U32, wrap, u, t);
        let off = self.bin(BinOp::Mul, RegTy::I32, step, Operand::Int(ahead));
        let ivn = self.bin(BinOp::Add, RegTy::I32, iv, off);
        self.issue_stage(body, p, ivn, next)?;
        self.emit(Inst::CpAsyncCommit);
        Ok(())
    }

    /// The base address of stage `stage` of pipe `pi` (its buffer's plus
    /// `stage` stages; a loop-invariant operand's buffer is its one stage)
    /// and the pipe's swizzle.
    pub(super) fn stage_base(&mut self, pi: usize, stage: Operand) -> (Reg, Swizzle) {
        let p = self.pipeline.pipes[pi];
        let buf = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr {
            dst: buf,
            buffer: p.buffer,
        });
        if p.stage_bytes == 0 {
            return (buf, p.sw);
        }
        let off = self.bin(
            BinOp::Mul,
            RegTy::U32,
            stage,
            Operand::Int(p.stage_bytes as i64),
        );
        let base = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(buf), off);
        (self.materialize(RegTy::U32, base).reg().expect("reg"), p.sw)
    }

    /// The stage after `stage` in a pipeline of `stages`, cyclically.
    pub(super) fn next_stage(&mut self, stage: Reg, stages: u32) -> Operand {
        let t = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(stage), Operand::Int(1));
        let wrap = self.cmp(CmpOp::Eq, RegTy::U32, t, Operand::Int(stages as i64));
        self.select(RegTy::U32, wrap, Operand::Int(0), t)
    }

    /// The copies of every pipelined load for the iteration whose induction
    /// variable is `ivv`, into stage `stage`.
    fn issue_stage(
        &mut self,
        body: &tile::Region,
        p: &LoopPipe,
        ivv: Operand,
        stage: Operand,
    ) -> R<()> {
        let ivv = self.materialize(RegTy::I32, ivv);
        self.bind_iv(body, p, ivv);
        for (load, pi) in &p.loads {
            let Some(d) = self.defer_load(load.tensor, &load.access, load.other, &load.shape)?
            else {
                self.pipeline.overrides.clear();
                return self.unsupported("a pipelined load whose alignment changed");
            };
            let (base, sw) = self.stage_base(*pi, stage);
            self.issue_copies(&d, base, sw);
        }
        self.pipeline.overrides.clear();
        Ok(())
    }
}

/// A loop body's only op that runs a dot, where that op is the `dot` itself,
/// at the body's top level (the loops the rotated mainloop and wgmma take).
pub(super) fn only_dot(body: &tile::Region) -> Option<&tile::Op> {
    let mut dots = body.ops.iter().filter(|o| has_dot(std::slice::from_ref(o)));
    match (dots.next(), dots.next()) {
        (Some(op), None) if matches!(op.kind, OpKind::Dot { .. }) => Some(op),
        _ => None,
    }
}

/// The carried value a waited wgmma dot `dot` of `body` may accumulate into
/// in place and leave in flight past the end of the iteration (one
/// warpgroup: the next iteration's first dot waits for every group of it,
/// before the copies ahead rewrite the stage this one reads). `dot` is at
/// the top level, the last op to run a dot, its result is only yielded
/// (once, as carried value `c`), nothing after it reads `c`, and nothing
/// reads `c` until the body's first dot (another) has waited.
pub(super) fn in_flight_carry(body: &tile::Region, dot: &tile::Op) -> Option<Value> {
    let at = body.ops.iter().position(|o| std::ptr::eq(o, dot))?;
    let first = body
        .ops
        .iter()
        .position(|o| has_dot(std::slice::from_ref(o)))?;
    if first == at || has_dot(&body.ops[at + 1..]) {
        return None;
    }
    let result = dot.results[0];
    let readers: Vec<&tile::Op> = body.ops.iter().filter(|o| op_reads(o, result)).collect();
    let [OpKind::Yield(ys)] = readers.iter().map(|o| &o.kind).collect::<Vec<_>>()[..] else {
        return None;
    };
    let mut slots = ys.iter().enumerate().filter(|(_, y)| **y == result);
    let (Some((i, _)), None) = (slots.next(), slots.next()) else {
        return None;
    };
    let carried = *body.args.get(1 + i)?;
    let early = body.ops[..=first].iter().chain(&body.ops[at + 1..]);
    (!early.into_iter().any(|o| op_reads(o, carried))).then_some(carried)
}

/// Whether op `o` (its nested regions included) reads `v`.
fn op_reads(o: &tile::Op, v: Value) -> bool {
    o.kind.operands().contains(&v)
        || o.kind
            .regions()
            .iter()
            .any(|r| r.ops.iter().any(|o| op_reads(o, v)))
}

/// A pipelined loop's dot whose first k step of each iteration is loaded at
/// the end of the previous one (CUTLASS's multistage mainloop): before the
/// loop, the wait and barrier for the first stage and that step's `ldmatrix`;
/// in the body, before the last k step's MMAs, the copies ahead, the wait
/// and barrier for the next stage and the next first step's `ldmatrix`, so
/// the tensor cores have the last step's MMAs to run while those reads
/// arrive, where they would otherwise wait at the top of every iteration.
/// The loop's one barrier so moves from the top of the body to before the
/// last k step: a stage's reads (its first step's at the end of the previous
/// iteration, the rest in its own) all precede the barrier of its own
/// iteration, after which the copies ahead rewrite it in the next.
pub(super) struct Rotation {
    /// The dot's operands.
    pub(super) a: Value,
    pub(super) b: Value,
    pub(super) stages: u32,
    /// The wait for a stage: copy groups that may stay pending (as
    /// [`Lower::pipeline_wait`]'s).
    pub(super) pending: u32,
    /// The loop's stage register.
    pub(super) stage: Reg,
    /// The copies `num_stages - 1` iterations ahead, lowered before the body.
    pub(super) ahead: Vec<Inst>,
}

/// The software pipeline of one loop: its loads (each with its pipe) and the
/// stage register.
pub(super) struct LoopPipe {
    pub(super) loads: Vec<(PlannedLoad, usize)>,
    /// The loads' starts that are `iv ± c` ([`Lower::iv_offsets`]).
    pub(super) offsets: Vec<(Value, (BinOp, Value))>,
    pub(super) stage: Reg,
    pub(super) stages: u32,
    /// How many iterations ahead the copies go (`LoopPlan::prefetch_distance`).
    pub(super) ahead: u32,
    /// Whether the loop's dot runs on `wgmma` (its stages are read through
    /// the asynchronous proxy).
    pub(super) wgmma: bool,
    /// The barriers and maps where TMA copies the stages.
    pub(super) tma: Option<TmaPipe>,
}

/// A software pipeline of one load in a loop: `stages` copies of its tile in
/// `buffer`, the loop's current stage in register `stage`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pipe {
    pub(super) buffer: usize,
    pub(super) sw: Swizzle,
    pub(super) stage_bytes: u32,
    pub(super) stage: Reg,
}
