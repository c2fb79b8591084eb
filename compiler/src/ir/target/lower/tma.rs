//! A software pipeline fed by TMA and transaction barriers (sm_90a): the
//! loops whose dot runs on wgmma (`LoopPlan::wgmma`) copy their operand
//! stages with `cp.async.bulk.tensor` instead of `cp.async`.
//!
//! One thread (thread 0) issues each stage's copies: a box of a tensor map
//! per operand (per 128-byte panel for `b`), landing in the stage in the
//! swizzle wgmma reads (TMA's and wgmma's swizzles are one pattern of the
//! shared address bits, so a 1024-byte aligned stage is laid out as
//! `Swizzle::offset` says). Two `mbarrier`s a stage order the rest:
//!
//! * `full[s]`: thread 0 arrives once with the stage's byte count
//!   (`expect_tx`); it completes when the copies have landed. Every thread
//!   waits on it before the stage's wgmma: no `cp.async.wait_group`, no
//!   block-wide barrier an iteration, and no proxy fence (TMA writes
//!   through the asynchronous proxy that wgmma reads through).
//! * `empty[s]`: one thread of each warpgroup arrives once its wgmma group
//!   reading the stage is complete (the wait for all but the newest group,
//!   one iteration later); thread 0 waits on it before copying into the
//!   stage again. So the copies go `num_stages - 1` iterations ahead, where
//!   the `cp.async` pipeline of a wgmma loop goes `num_stages - 2` (it cannot
//!   know when the other warpgroup's group is done).
//!
//! Phases: iteration `i` reads stage `i % S` in the phase of parity
//! `(i / S) % 2` of `full`, the loop's `phase` register (flipped when the
//! stage wraps). The copies of iteration `j = i + S - 1` wait for the
//! `j / S`-th completion of `empty[j % S]`, of parity `phase ^ (stage == 0)`
//! of the reader's, and for `j < S` that parity is 1, which a freshly
//! initialised barrier counts as complete. Copies are issued only for
//! iterations that run, so none is in flight when the loop ends.

use super::across::{Across, Crossing, OuterLoop};
use super::pipeline::{LoopPipe, LoopPlan};
use super::{Lower, R};
use crate::check::DType;
use crate::ir::target::{BinOp, CmpOp, Inst, Operand, Reg, RegTy, SmemBuffer, Swizzle, TensorMap};
use crate::ir::tile::{self, Access, Constant, Value};

/// The largest box extent TMA takes in a dim.
const MAX_BOX: u32 = 256;

/// A loop's transaction barriers and tensor maps (part of [`LoopPipe`]).
pub(super) struct TmaPipe {
    /// Shared buffers of `stages` 8-byte barriers each.
    pub(super) full: usize,
    pub(super) empty: usize,
    /// Per pipelined load (in `LoopPipe::loads` order): its map's address
    /// register, the elements of its box's innermost dim, and the boxes a
    /// stage takes (the 128-byte panels of `b`), `panel_bytes` apart.
    maps: Vec<(Reg, u32, u32, u32)>,
    /// Bytes a stage receives (every box whole: TMA counts out-of-bounds
    /// elements, which it fills with zeros, as landed).
    bytes: u32,
    /// `(i / S) % 2` of the iteration `i` being run.
    pub(super) phase: Reg,
    /// Where the pipeline runs across the iterations of the loop around
    /// its loop (`across.rs`).
    pub(super) across: Option<Across>,
}

/// A loop-invariant `dot` operand that TMA copies once, before its loop
/// ([`Lower::invariant_tma`]).
pub(super) struct InvariantCopy {
    value: Value,
    map: TensorMap,
    access: Vec<Access>,
    /// Where the box's row coordinate is in `access` reversed (innermost first).
    row_dim: usize,
    /// Each box: its first column and row in the tile, and its byte offset
    /// in the buffer.
    boxes: Vec<(u32, u32, u32)>,
    bytes: u32,
}

/// The TMA swizzle span (bytes) for a buffer of `cols`-element rows of
/// `elem` bytes laid out as `sw`, and the box's innermost extent in
/// elements: rows of 32, 64 or 128 bytes with the XOR period TMA's
/// 32/64/128-byte swizzles have, or 128-byte panels (one box a panel).
fn tma_swizzle(sw: Swizzle, cols: u32, elem: u32) -> Option<(u32, u32)> {
    if sw.panel_rows > 0 {
        let inner = 128 / elem;
        return (sw.per_phase == 1 && sw.max_phase == 8 && cols.is_multiple_of(inner))
            .then_some((128, inner));
    }
    let rb = sw.row_bytes;
    (matches!(rb, 32 | 64 | 128) && sw.per_phase * rb == 128 && sw.max_phase * 16 == rb)
        .then_some((rb, cols))
}

impl<'a> Lower<'a> {
    /// The tensor maps a wgmma loop's pipelined loads would take on TMA, or
    /// `None` where one does not fit (the `cp.async` pipeline then stays):
    /// every index an i32, the load's two ranges in the tensor's order with
    /// at most `MAX_BOX` elements each, at most 5 dims, and a swizzle TMA
    /// has. A positive constant step is needed too: the copies ahead are
    /// issued only while `iv + ahead * step < hi`. The loop is the GEMM
    /// mainloop (`LoopPlan::wgmma`) or one whose dots are all waited wgmma
    /// dots (`LoopPlan::wgmma_waited`, attention's), whose stages are plain
    /// 128-byte panels (TMA cannot store rows in warpgroup order).
    pub(super) fn tma_maps(&self, plan: &LoopPlan, step: Operand) -> Option<Vec<TensorMap>> {
        if plan.wgmma.is_none() && plan.wgmma_waited.is_empty() {
            return None;
        }
        if !self.feat.tma || !matches!(step, Operand::Int(s) if s > 0) {
            return None;
        }
        let mut maps = Vec::new();
        for load in &plan.pipelined {
            let (rows, cols) = (load.shape[0], load.shape[1]);
            let elem = self.elem_bytes(load.value);
            let sw = self.wgmma_stage_swizzle(plan, load)?;
            if plan.wgmma.is_none() && sw != Swizzle::panels(cols * 2, rows) {
                return None;
            }
            let (swizzle, inner) = tma_swizzle(sw, cols, elem)?;
            let box_dims = self.tma_box_dims(&load.access, rows, cols, inner)?;
            maps.push(TensorMap {
                tensor: load.tensor,
                name: load.name.clone(),
                box_dims,
                swizzle,
            });
        }
        Some(maps)
    }

    /// How TMA copies a loop's invariant operands (`LoopPlan::invariant`),
    /// or `None` where it cannot copy one of them (they then take
    /// `cp.async`): the loop's stages come by TMA, and each operand is a
    /// 16-bit tile read by wgmma as 128-byte panels (the layout TMA's 128-byte
    /// swizzle writes), loaded in the tensor's order with zeros where out of
    /// bounds. Rows in warpgroup order move in 16-row tiles, so those come a
    /// box a 16-row tile and panel; other tiles a box a panel.
    pub(super) fn invariant_tma(&self, plan: &LoopPlan) -> Option<Vec<InvariantCopy>> {
        if !plan.tma || plan.invariant.is_empty() {
            return None;
        }
        let mut copies = Vec::new();
        for &v in &plan.invariant {
            if self
                .pipeline
                .deferred
                .get(&v)
                .is_none_or(|(_, trans)| *trans)
            {
                return None;
            }
            let load = self
                .pipeline
                .plan
                .candidates
                .iter()
                .find(|l| l.value == v)?;
            if !matches!(load.other, Constant::Int(0))
                && !matches!(load.other, Constant::Float(x) if x == 0.0)
            {
                return None;
            }
            let [rows, cols] = load.shape[..] else {
                return None;
            };
            let elem = self.elem_bytes(v);
            let sw = plan.waited_swizzle(v, rows, cols)?;
            if elem != 2 || sw.panel_rows == 0 {
                return None;
            }
            let in_order = Swizzle {
                warpgroup_tiles: 0,
                ..sw
            };
            let (swizzle, inner) = tma_swizzle(in_order, cols, elem)?;
            let mut box_dims = self.tma_box_dims(&load.access, rows, cols, inner)?;
            let box_rows = if sw.warpgroup_tiles >= 2 { 16 } else { rows };
            let row_dim = load
                .access
                .iter()
                .rev()
                .enumerate()
                .filter(|(_, a)| matches!(a, Access::Range { .. }))
                .nth(1)?
                .0;
            box_dims[row_dim] = box_rows;
            let mut boxes = Vec::new();
            for c in (0..cols).step_by(inner as usize) {
                for r in (0..rows).step_by(box_rows as usize) {
                    boxes.push((c, r, sw.offset(r, c, elem)));
                }
            }
            copies.push(InvariantCopy {
                value: v,
                map: TensorMap {
                    tensor: load.tensor,
                    name: load.name.clone(),
                    box_dims,
                    swizzle,
                },
                access: load.access.clone(),
                row_dim,
                boxes,
                bytes: rows * cols * elem,
            });
        }
        Some(copies)
    }

    /// Thread 0 copies the invariant operands into their buffers (`buffers`,
    /// from [`Lower::invariant_buffers`]) by TMA, announced on a barrier of
    /// their own, which it initialises first; returns that barrier's buffer.
    /// The threads wait on it (parity 0) after a block-wide barrier, which
    /// publishes the initialisation, and thread 0 ends it after the loop
    /// (`Lower::tma_invariant_done`).
    pub(super) fn tma_copy_invariant(
        &mut self,
        copies: &[InvariantCopy],
        buffers: &[(Value, usize)],
    ) -> usize {
        let bar_buffer = self.buffers.len();
        self.buffers.push(SmemBuffer {
            name: format!("mbar_invariant{}", self.pipeline.pipes.len()),
            offset: 0,
            bytes: 8,
            align: 8,
            purpose: "a transaction barrier: the loop-invariant operands landed".into(),
            swizzle: None,
        });
        self.pipeline.persistent.push(bar_buffer);
        self.emit(Inst::Comment(format!(
            "{} loop-invariant dot operands copied once by TMA",
            copies.len()
        )));
        let first = self.thread_zero();
        self.when(first, |l| {
            let bar = l.barrier_addr(bar_buffer, Operand::Int(0));
            l.emit(Inst::MbarInit { bar, count: 1 });
            l.emit(Inst::FenceMbarInit);
            l.emit(Inst::MbarExpectTx {
                bar,
                bytes: copies.iter().map(|c| c.bytes).sum(),
            });
            for c in copies {
                let Some(&(_, buffer)) = buffers.iter().find(|(v, _)| *v == c.value) else {
                    unreachable!("every invariant operand has a buffer");
                };
                let index = l.tensor_map_index(c.map.clone());
                let map = l.new_reg(RegTy::U64);
                l.emit(Inst::TensorMapAddr {
                    dst: map,
                    map: index,
                });
                let base = l.new_reg(RegTy::U32);
                l.emit(Inst::SmemAddr { dst: base, buffer });
                let coords = l.tma_coords(&c.access);
                for &(col, row, offset) in &c.boxes {
                    let shift = [(0, col), (c.row_dim, row)];
                    l.tma_box_load((base, offset), map, &coords, &shift, bar);
                }
            }
        });
        bar_buffer
    }

    /// Every thread waits for the invariant operands' copies (after the
    /// block-wide barrier that follows [`Lower::tma_copy_invariant`]).
    pub(super) fn tma_invariant_wait(&mut self, bar_buffer: usize) {
        let bar = self.barrier_addr(bar_buffer, Operand::Int(0));
        self.emit(Inst::MbarWait {
            bar,
            parity: Operand::Int(0),
        });
    }

    /// After the loop (and its block-wide barrier): thread 0 ends the
    /// invariant operands' barrier, so that entering the loop again may
    /// initialise it anew.
    pub(super) fn tma_invariant_done(&mut self, bar_buffer: usize) {
        let first = self.thread_zero();
        self.when(first, |l| {
            let bar = l.barrier_addr(bar_buffer, Operand::Int(0));
            l.emit(Inst::MbarInval { bar });
        });
    }

    /// The box of a TMA copy of a `[rows, cols]` tile at `access` (its two
    /// ranges, `cols` the innermost), innermost first, with `inner`
    /// elements of the innermost range a box; `None` where TMA cannot copy
    /// it: more than five dims, a box over `MAX_BOX`, an index not `i32`, a
    /// gather, or other ranges.
    pub(super) fn tma_box_dims(
        &self,
        access: &[Access],
        rows: u32,
        cols: u32,
        inner: u32,
    ) -> Option<Vec<u32>> {
        if access.len() > 5 || rows > MAX_BOX || inner > MAX_BOX {
            return None;
        }
        let i32_index = |v: &tile::Value| self.tk.ty(*v).dtype() == DType::I32;
        let mut ranges = Vec::new();
        let mut box_dims = Vec::new();
        for a in access.iter().rev() {
            match a {
                Access::Range { start, len } if i32_index(start) => {
                    ranges.push(*len);
                    box_dims.push(if ranges.len() == 1 { inner } else { *len });
                }
                Access::Point(x) if i32_index(x) => box_dims.push(1),
                _ => return None,
            }
        }
        (ranges == [cols, rows]).then_some(box_dims)
    }

    /// The index of tensor map `m` in the kernel's maps, added if new.
    pub(super) fn tensor_map_index(&mut self, m: TensorMap) -> usize {
        match self.tensor_maps.iter().position(|x| *x == m) {
            Some(i) => i,
            None => {
                self.tensor_maps.push(m);
                self.tensor_maps.len() - 1
            }
        }
    }

    /// Before the loop: the barriers initialised (by thread 0, published by
    /// a block-wide barrier), the maps' addresses, and the copies of the
    /// first `ahead` iterations that run. With `across` (the loop around
    /// this one and the slice of its body the copies' indices need), all of
    /// it goes before that outer loop instead, and the first `ahead`
    /// iterations are those of the sequence of its tiles (`across.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tma_prologue(
        &mut self,
        body: &tile::Region,
        p: &LoopPipe,
        maps: Vec<TensorMap>,
        lo: Operand,
        hi: Operand,
        step: Operand,
        across: Option<(&mut OuterLoop, Vec<tile::Op>)>,
    ) -> R<TmaPipe> {
        let stages = p.stages;
        let mut barriers = [0; 2];
        for (b, what) in barriers.iter_mut().zip(["full", "empty"]) {
            *b = self.buffers.len();
            self.buffers.push(SmemBuffer {
                name: format!("mbar_{what}{}", self.pipeline.pipes.len()),
                offset: 0,
                bytes: 8 * stages,
                align: 8,
                purpose: format!("{stages} transaction barriers: a stage {what}"),
                swizzle: None,
            });
            self.pipeline.persistent.push(*b);
        }
        let [full, empty] = barriers;
        let Some((outer, slice)) = across else {
            let t = self.tma_setup(p, maps, full, empty);
            let first = self.thread_zero();
            for s in 0..p.ahead {
                let off = self.bin(BinOp::Mul, RegTy::I32, step, Operand::Int(s as i64));
                let ivs = self.bin(BinOp::Add, RegTy::I32, lo, off);
                let runs = self.cmp(CmpOp::Lt, RegTy::I32, ivs, hi);
                let cond = self.and_pred(first, runs);
                self.when(cond, |l| {
                    l.tma_stage(body, p, &t, ivs, Operand::Int(s as i64))
                })?;
            }
            return Ok(t);
        };
        let t = self.before_outer(outer.depth(), |l| {
            let mut t = l.tma_setup(p, maps, full, empty);
            t.across = Some(l.across_setup(outer, slice, [lo, hi, step]));
            let first = l.thread_zero();
            let a = t.across.as_ref().expect("set above");
            l.across_prologue(a, first, p.ahead, |l, iv, s| {
                l.tma_stage(body, p, &t, iv, Operand::Int(i64::from(s)))
            })?;
            Ok::<_, super::Unsupported>(t)
        })?;
        outer.crossing = Some(Crossing {
            full,
            empty,
            stages,
        });
        // The stages stay live through the outer loop (its epilogues must
        // not overlay them).
        self.buffered_loops += 1;
        self.across_live += 1;
        Ok(t)
    }

    /// The maps' addresses and the barriers initialised (thread 0), then a
    /// block-wide barrier; phase 0.
    fn tma_setup(
        &mut self,
        p: &LoopPipe,
        maps: Vec<TensorMap>,
        full: usize,
        empty: usize,
    ) -> TmaPipe {
        let mut tmaps = Vec::new();
        let mut bytes = 0;
        for (m, (load, pi)) in maps.into_iter().zip(&p.loads) {
            let inner = m.box_dims[0];
            let index = self.tensor_map_index(m);
            let addr = self.new_reg(RegTy::U64);
            self.emit(Inst::TensorMapAddr {
                dst: addr,
                map: index,
            });
            let (rows, cols) = (load.shape[0], load.shape[1]);
            let panel_bytes = self.pipeline.pipes[*pi].sw.panel_rows * 128;
            tmaps.push((addr, inner, cols / inner, panel_bytes));
            bytes += rows * cols * self.elem_bytes(load.value);
        }
        let warpgroups = self.num_warps / 4;
        let first = self.thread_zero();
        self.when(first, |l| {
            for &(map, ..) in &tmaps {
                l.emit(Inst::PrefetchTensorMap { map });
            }
            for s in 0..p.stages {
                let f = l.barrier_addr(full, Operand::Int(s as i64));
                l.emit(Inst::MbarInit { bar: f, count: 1 });
                let e = l.barrier_addr(empty, Operand::Int(s as i64));
                l.emit(Inst::MbarInit {
                    bar: e,
                    count: warpgroups,
                });
            }
            l.emit(Inst::FenceMbarInit);
        });
        self.emit(Inst::Barrier);
        let phase = self.new_reg(RegTy::U32);
        self.emit(Inst::Mov {
            dst: phase,
            src: Operand::Int(0),
        });
        TmaPipe {
            full,
            empty,
            maps: tmaps,
            bytes,
            phase,
            across: None,
        }
    }

    /// At the top of the body: every thread waits for this iteration's
    /// stage to land.
    pub(super) fn tma_wait(&mut self, p: &LoopPipe, t: &TmaPipe) {
        let bar = self.barrier_addr(t.full, Operand::Reg(p.stage));
        self.emit(Inst::MbarWait {
            bar,
            parity: Operand::Reg(t.phase),
        });
    }

    /// After the body's (first) dot, whose wait leaves no wgmma group of the
    /// previous iteration reading its stage (the GEMM's waits for all but
    /// its own group; a waited dot's for all, the previous iteration's last
    /// dot left in flight included): the previous stage released by each
    /// warpgroup (not in the first iteration), then thread 0 copies the
    /// iteration `ahead` on into it once every warpgroup has released it,
    /// if that iteration runs.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tma_issue_ahead(
        &mut self,
        body: &tile::Region,
        p: &LoopPipe,
        t: &TmaPipe,
        iv: Operand,
        lo: Operand,
        hi: Operand,
        step: Operand,
    ) -> R<()> {
        let stages = i64::from(p.stages);
        let st = Operand::Reg(p.stage);
        // The previous stage, which the copies `stages - 1` ahead reuse.
        let at_zero = self.cmp(CmpOp::Eq, RegTy::U32, st, Operand::Int(0));
        let before = self.bin(BinOp::Sub, RegTy::U32, st, Operand::Int(1));
        let prev = self.select(RegTy::U32, at_zero, Operand::Int(stages - 1), before);
        let prev = self.materialize(RegTy::U32, prev);
        let empty = self.barrier_addr(t.empty, prev);
        let lane0 = self.bin(
            BinOp::And,
            RegTy::U32,
            Operand::Reg(self.tid),
            Operand::Int(127),
        );
        let leader = self.cmp(CmpOp::Eq, RegTy::U32, lane0, Operand::Int(0));
        // Not in the sequence's first iteration: this loop's, or the first
        // of all tiles' where the pipeline runs across an outer loop.
        let later = match &t.across {
            Some(a) => self.cmp(
                CmpOp::Ne,
                RegTy::U32,
                Operand::Reg(a.started),
                Operand::Int(0),
            ),
            None => self.cmp(CmpOp::Ne, RegTy::I32, iv, lo),
        };
        let release = self.and_pred(leader.reg().expect("reg"), later);
        self.emit(Inst::If {
            cond: release,
            then: vec![Inst::MbarArrive { bar: empty }],
            otherwise: Vec::new(),
        });
        let ahead = i64::from(p.ahead);
        let off = self.bin(BinOp::Mul, RegTy::I32, step, Operand::Int(ahead));
        let ivn = self.bin(BinOp::Add, RegTy::I32, iv, off);
        let runs = self.cmp(CmpOp::Lt, RegTy::I32, ivn, hi);
        let first = self.thread_zero();
        // The copies wait until every warpgroup has released the stage.
        let copy = |l: &mut Self, ivv: Operand| {
            let wrapped = l.select(RegTy::U32, at_zero, Operand::Int(1), Operand::Int(0));
            let parity = l.bin(BinOp::Xor, RegTy::U32, Operand::Reg(t.phase), wrapped);
            l.emit(Inst::MbarWait { bar: empty, parity });
            l.tma_stage(body, p, t, ivv, prev)
        };
        let Some(a) = &t.across else {
            let cond = self.and_pred(first, runs);
            return self.when(cond, |l| copy(l, ivn));
        };
        // Past the tile's last iteration, the next tiles' first ones.
        let runs = runs.reg().expect("reg");
        self.when(first, |l| {
            l.blocks.push(Vec::new());
            copy(l, ivn)?;
            let then = l.blocks.pop().unwrap_or_default();
            l.blocks.push(Vec::new());
            let j = l.across_ahead(a, iv, p.ahead);
            let tile = l.scalar(a.outer_iv());
            l.issue_across(a, tile, j, false, copy)?;
            let otherwise = l.blocks.pop().unwrap_or_default();
            l.emit(Inst::If {
                cond: runs,
                then,
                otherwise,
            });
            Ok(())
        })
    }

    /// At the end of the body, after the stage register has moved on: the
    /// phase flips where it wrapped to 0.
    pub(super) fn tma_next_phase(&mut self, p: &LoopPipe, t: &TmaPipe) {
        let wrapped = self.cmp(
            CmpOp::Eq,
            RegTy::U32,
            Operand::Reg(p.stage),
            Operand::Int(0),
        );
        let flip = self.select(RegTy::U32, wrapped, Operand::Int(1), Operand::Int(0));
        let next = self.bin(BinOp::Xor, RegTy::U32, Operand::Reg(t.phase), flip);
        self.emit(Inst::Mov {
            dst: t.phase,
            src: next,
        });
    }

    /// After the loop (and its block-wide barrier): thread 0 ends the
    /// barriers, so that entering the loop again may initialise them anew
    /// (after the outer loop where the pipeline runs across one).
    pub(super) fn tma_epilogue(&mut self, c: &Crossing, across: bool) {
        let first = self.thread_zero();
        self.when(first, |l| {
            if across {
                // Tiles stored by TMA in the loop wait for their copies'
                // reads of shared memory only before the next store
                // (`staged_store`): the last ones before the block exits.
                l.emit(Inst::BulkWaitRead { pending: 0 });
            }
            for s in 0..c.stages {
                for b in [c.full, c.empty] {
                    let bar = l.barrier_addr(b, Operand::Int(s as i64));
                    l.emit(Inst::MbarInval { bar });
                }
            }
        });
    }

    /// Thread 0's copies of the iteration whose induction variable is `ivv`
    /// into stage `stage`: the stage's byte count announced on its `full`
    /// barrier, then a box a load (a panel of `b`).
    fn tma_stage(
        &mut self,
        body: &tile::Region,
        p: &LoopPipe,
        t: &TmaPipe,
        ivv: Operand,
        stage: Operand,
    ) -> R<()> {
        let ivv = self.materialize(RegTy::I32, ivv);
        self.bind_iv(body, p, ivv);
        let bar = self.barrier_addr(t.full, stage);
        self.emit(Inst::MbarExpectTx {
            bar,
            bytes: t.bytes,
        });
        for ((load, pi), &(map, inner, boxes, panel_bytes)) in p.loads.iter().zip(&t.maps) {
            let coords = self.tma_coords(&load.access);
            let (base, _) = self.stage_base(*pi, stage);
            for b in 0..boxes {
                let to = (base, b * panel_bytes);
                self.tma_box_load(to, map, &coords, &[(0, b * inner)], bar);
            }
        }
        self.pipeline.overrides.clear();
        Ok(())
    }

    /// One box of map `map` copied to shared address `to` (a register and a
    /// byte offset), announced on `bar`: its coordinates `coords` moved by
    /// `shift`'s elements along their dims (innermost first).
    fn tma_box_load(
        &mut self,
        to: (Reg, u32),
        map: Reg,
        coords: &[Operand],
        shift: &[(usize, u32)],
        bar: Reg,
    ) {
        let mut at = coords.to_vec();
        for &(d, by) in shift {
            let x = self.bin(BinOp::Add, RegTy::I32, at[d], Operand::Int(i64::from(by)));
            at[d] = self.materialize(RegTy::I32, x);
        }
        self.emit(Inst::TmaLoad {
            dst: to.0,
            dst_offset: i64::from(to.1),
            map,
            coords: at,
            bar,
        });
    }

    /// The box's coordinates of an access (ranges and points, as
    /// `tma_maps` and `tma_box` check), innermost first, in registers.
    pub(super) fn tma_coords(&mut self, access: &[Access]) -> Vec<Operand> {
        access
            .iter()
            .rev()
            .map(|a| {
                let v = match a {
                    Access::Range { start, .. } => *start,
                    Access::Point(x) => *x,
                    Access::Gather(_) => unreachable!("checked by tma_maps and tma_box"),
                };
                let o = self.scalar(v);
                self.materialize(RegTy::I32, o)
            })
            .collect()
    }

    /// The address of barrier `stage` of barrier buffer `buffer`.
    fn barrier_addr(&mut self, buffer: usize, stage: Operand) -> Reg {
        let base = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr { dst: base, buffer });
        let off = self.bin(BinOp::Mul, RegTy::U32, stage, Operand::Int(8));
        let a = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(base), off);
        self.materialize(RegTy::U32, a).reg().expect("reg")
    }

    /// A predicate: this is thread 0.
    pub(super) fn thread_zero(&mut self) -> Reg {
        let p = self.cmp(
            CmpOp::Eq,
            RegTy::U32,
            Operand::Reg(self.tid),
            Operand::Int(0),
        );
        p.reg().expect("reg")
    }

    fn and_pred(&mut self, a: Reg, b: Operand) -> Reg {
        let b = self.materialize(RegTy::Pred, b);
        let c = self.bin(BinOp::And, RegTy::Pred, Operand::Reg(a), b);
        self.materialize(RegTy::Pred, c).reg().expect("reg")
    }
}
