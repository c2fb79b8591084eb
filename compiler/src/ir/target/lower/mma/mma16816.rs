//! f16/bf16 `dot` with `mma.sync` m16n8k16 (sm_80+) or two m16n8k8 per k
//! step of 16 (sm_75), fragments loaded from swizzled shared memory with
//! `ldmatrix`.
//!
//! The operands come from `staging` (pipelined, deferred or stored from
//! registers); async copies issued for this dot are waited for before the
//! barrier that precedes the fragment loads. The accumulator stays in the
//! mma layout (`Layout::mma_accumulator`).

use std::rc::Rc;

use super::WarpTiling;
use crate::check::DType;
use crate::ir::target::layout::{Layout, WarpOrder};
use crate::ir::target::lower::pipeline::Rotation;
use crate::ir::target::lower::{Lower, R, TV};
use crate::ir::target::{BinOp, Inst, LayoutKind, MemTy, Operand, Reg, RegTy, Swizzle};
use crate::ir::tile::Value;
use crate::target::{MmaInst, MmaKind};

impl<'a> Lower<'a> {
    /// `dot` with `mma.sync` (m16n8k16 on sm_80+, two m16n8k8 on sm_75): operands
    /// staged in swizzled shared memory, fragments loaded with `ldmatrix`.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::ir::target::lower) fn dot_mma(
        &mut self,
        a: Value,
        b: Value,
        av: &TV,
        bv: &TV,
        acc: Option<Value>,
        layout: Rc<Layout>,
        k: u32,
        inst: &MmaInst,
    ) -> R<TV> {
        let WarpTiling {
            m,
            n,
            warps,
            tile: [tm, tn],
        } = WarpTiling::of(&layout);
        let input = if av.dtype == DType::BF16 {
            MemTy::BF16
        } else {
            MemTy::F16
        };
        // m16n8k16, or two m16n8k8 per 16 of K that one `ldmatrix.x4` reads.
        let k16 = inst.k == 16;
        self.emit(Inst::Comment(format!(
            "dot [{m},{k}] x [{k},{n}] {} on tensor cores, {layout}",
            av.dtype.name()
        )));
        let mut cur = self.mma_accumulators(acc, &layout)?;
        let mut issued = false;
        // `a` straight from registers where it is an accumulator of this
        // dot's rows (FA2's P), else from shared memory.
        let a_regs = k16 && self.a_in_registers(av, &layout, k);
        let a_smem = match a_regs {
            true => None,
            false => Some(self.operand_source(a, av, "a", None, &mut issued)?),
        };
        let abuf = a_smem.and_then(|(_, _, _, buf)| buf);
        // `b_nk`: b is stored as its transpose ([n, k] row-major).
        let (bbase, bsw, b_nk, bbuf) = self.operand_source(b, bv, "b", abuf, &mut issued)?;
        if issued {
            self.emit(Inst::CpAsyncCommit);
            self.emit(Inst::CpAsyncWait { pending: 0 });
        }
        // A dot whose first k step's fragments come from the previous
        // iteration (`Rotation`): they are read here only before the loop.
        let rot = self.rotation.take_if(|r| r.a == a && r.b == b);
        // Operands read in place from pipeline stages (or registers) are
        // published by the pipeline's barrier at the top of the loop (for a
        // rotated dot, the ones before the loop and before its last k step).
        let staged = abuf.is_some() || bbuf.is_some();
        if staged {
            self.emit(Inst::Barrier);
        }
        let asrc = a_smem.map(|(base, sw, ..)| SmemTile { base, sw });
        let bsrc = SmemTile {
            base: bbase,
            sw: bsw,
        };
        let shape = TileShape {
            warps,
            tm,
            tn,
            b_nk,
        };
        let mut lanes = self.fragment_lanes(&shape);
        let first = match &rot {
            Some(r) => Some(self.rotated_prologue(r, a, b, &shape)?),
            None => None,
        };
        let nk = k / 16;
        for kk in 0..nk {
            // A fragments from registers are packed as they are used, so
            // that each f32 value dies at its pack.
            let a_packed = match a_regs {
                true => Some(self.a_fragments_from_registers(av, kk, tm)),
                false => None,
            };
            let frags = match (&first, kk) {
                (Some(f), 0) => f.clone(),
                _ => self.load_fragments(&mut lanes, asrc, bsrc, kk, None),
            };
            if let (Some(r), Some(f)) = (&rot, &first) {
                if kk == nk - 1 {
                    self.rotate_to_next_stage(r, a, b, &mut lanes, f)?;
                }
            }
            let bfrag = frags.b_pairs();
            let afrag = a_packed.unwrap_or(frags.a);
            cur = self.mma_step(&cur, &afrag, &bfrag, 4, |l, a, b, c, d| {
                if k16 {
                    l.emit(Inst::Mma {
                        kind: MmaKind::MmaSync,
                        m: 16,
                        n: 8,
                        k: 16,
                        input,
                        d: d.to_vec(),
                        a: a.to_vec(),
                        b: b.to_vec(),
                        c,
                    });
                } else {
                    let mid: Vec<Reg> = (0..4).map(|_| l.new_reg(RegTy::F32)).collect();
                    l.emit(Inst::Mma {
                        kind: MmaKind::MmaSync,
                        m: 16,
                        n: 8,
                        k: 8,
                        input,
                        d: mid.clone(),
                        a: a[..2].to_vec(),
                        b: b[..1].to_vec(),
                        c,
                    });
                    l.emit(Inst::Mma {
                        kind: MmaKind::MmaSync,
                        m: 16,
                        n: 8,
                        k: 8,
                        input,
                        d: d.to_vec(),
                        a: a[2..].to_vec(),
                        b: b[1..].to_vec(),
                        c: mid,
                    });
                }
            });
        }
        if rot.is_some() {
            // The loop's barriers retire this dot's reads (see `Rotation`).
            return Ok(self.mma_result_in(layout, cur));
        }
        Ok(match staged {
            true => self.mma_result(layout, cur),
            false => self.mma_result_in(layout, cur),
        })
    }

    /// This lane's row and chunk indices in a dot's operand tiles, for
    /// `ldmatrix` (emitted once where fragments are loaded from).
    fn fragment_lanes(&mut self, s: &TileShape) -> FragmentLanes {
        let tid = Operand::Reg(self.tid);
        let lane = self.bin(BinOp::And, RegTy::U32, tid, Operand::Int(31));
        let l15 = self.bin(BinOp::And, RegTy::U32, lane, Operand::Int(15));
        let hi = self.bin(BinOp::Shr, RegTy::U32, lane, Operand::Int(4));
        let (warp_m, warp_n) = self.warp_coords(s.warps);
        let arow0 = self.bin(BinOp::Mul, RegTy::U32, warp_m, Operand::Int(s.tm as i64));
        let arow0 = self.bin(BinOp::Add, RegTy::U32, arow0, l15);
        let n_tiles = s.tn / 8;
        let bcol0 = self.bin(BinOp::Mul, RegTy::U32, warp_n, Operand::Int(n_tiles as i64));
        let b_x4 = n_tiles.is_multiple_of(2);
        // The bits `bchunk0` may have: those of `bcol0` (multiples of
        // `n_tiles`, where that is a power of two) and `hi`.
        let bchunk0_mask = match n_tiles.is_power_of_two() {
            true => !(n_tiles - 1) | u32::from(b_x4),
            false => u32::MAX,
        };
        let bchunk0 = if b_x4 {
            self.bin(BinOp::Add, RegTy::U32, bcol0, hi)
        } else {
            bcol0
        };
        // b stored as [n, k]: lanes 0-7 / 8-15 read k chunks 0 / 1 of the
        // first n tile, lanes 16-31 the same of the second.
        let (brow_nk, bchunk_nk) = match s.b_nk {
            true => {
                let l7 = self.bin(BinOp::And, RegTy::U32, lane, Operand::Int(7));
                let r = self.bin(BinOp::Mul, RegTy::U32, warp_n, Operand::Int(s.tn as i64));
                let mut r = self.bin(BinOp::Add, RegTy::U32, r, l7);
                if b_x4 {
                    let h8 = self.bin(BinOp::Shl, RegTy::U32, hi, Operand::Int(3));
                    r = self.bin(BinOp::Add, RegTy::U32, r, h8);
                }
                let c = self.bin(BinOp::Shr, RegTy::U32, lane, Operand::Int(3));
                (r, self.bin(BinOp::And, RegTy::U32, c, Operand::Int(1)))
            }
            false => (Operand::Int(0), Operand::Int(0)),
        };
        FragmentLanes {
            arow0,
            l15,
            hi,
            bchunk0,
            bchunk0_mask,
            brow_nk,
            bchunk_nk,
            tm: s.tm,
            n_tiles,
            b_x4,
            b_nk: s.b_nk,
            addrs: Vec::new(),
        }
    }

    /// The swizzled address of 16-byte chunk `chunk + c` of row `r + dr`,
    /// where `r` and `chunk` are this lane's and `dr`, `c` constants, and
    /// `chunk` never has a bit of `lane_mask` clear where `c` has one set
    /// (`chunk + c` is `chunk ^ c`). The swizzle's phase repeats every 8 rows
    /// (`Swizzle::for_rows`), so a `dr` of a multiple of 8 is a constant
    /// offset; and as the phase only flips chunk bits within the swizzle's
    /// span `m` (128 bytes, or the row if shorter), the chunk offset `16 c` is
    /// an XOR of its bits below `m` into the lane's address of chunk `chunk`
    /// plus the rest added: one lane address per operand tile, and per
    /// fragment an `xor` and an immediate offset (the base, a multiple of 128
    /// bytes, and rows of `row_bytes` keep every bit below `m` of the row's
    /// address clear).
    fn lane_address(
        &mut self,
        lanes: &mut FragmentLanes,
        t: SmemTile,
        (r, dr): (Operand, u32),
        (chunk, c): (Operand, u32),
        lane_mask: u32,
    ) -> Reg {
        let sw = t.sw;
        let (r, dr) = match dr % (sw.per_phase * sw.max_phase) {
            0 => (r, dr),
            _ => (
                self.bin(BinOp::Add, RegTy::U32, r, Operand::Int(dr as i64)),
                0,
            ),
        };
        let disjoint = c & lane_mask == 0;
        let key = (t.base, r, chunk, if disjoint { 0 } else { c });
        let at = match lanes.addrs.iter().find(|(k, _)| *k == key) {
            Some(&(_, a)) => a,
            None => {
                let ph = self.swizzle_phase(sw, r);
                let ch = self.bin(BinOp::Add, RegTy::U32, chunk, Operand::Int(key.3 as i64));
                let ch = self.bin(BinOp::Xor, RegTy::U32, ch, ph);
                let ch = self.bin(BinOp::Shl, RegTy::U32, ch, Operand::Int(4));
                let ra = self.bin(BinOp::Mul, RegTy::U32, r, Operand::Int(sw.row_bytes as i64));
                // The lane's offset first, then the base: the offset is
                // loop-invariant where the base (a pipeline stage) is not.
                let off = self.bin(BinOp::Add, RegTy::U32, ra, ch);
                let a = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(t.base), off);
                let a = self.materialize(RegTy::U32, a).reg().expect("reg");
                lanes.addrs.push((key, a));
                a
            }
        };
        let span = sw.row_bytes.min(128);
        let (flip, add) = match disjoint {
            true => ((16 * c) % span, (16 * c) / span * span),
            false => (0, 0),
        };
        let a = self.bin(
            BinOp::Xor,
            RegTy::U32,
            Operand::Reg(at),
            Operand::Int(flip as i64),
        );
        let a = self.bin(
            BinOp::Add,
            RegTy::U32,
            a,
            Operand::Int((add + dr * sw.row_bytes) as i64),
        );
        self.materialize(RegTy::U32, a).reg().expect("reg")
    }

    /// The `ldmatrix` fragments of k step `kk` (16 of k): `a`'s (none where
    /// `a` is not in shared memory) one x4 per 16-row tile, `b`'s one x4 per
    /// two 8-column tiles (x2 per tile where the warp has an odd number),
    /// written into `into`'s registers where given.
    fn load_fragments(
        &mut self,
        lanes: &mut FragmentLanes,
        a: Option<SmemTile>,
        b: SmemTile,
        kk: u32,
        into: Option<&Fragments>,
    ) -> Fragments {
        let mut out = Fragments {
            a: Vec::new(),
            b: Vec::new(),
            b_x4: lanes.b_x4,
        };
        let ldmatrix = |l: &mut Self, addr: Reg, trans: bool, dst: Vec<Reg>| {
            l.emit(Inst::LdMatrix {
                dst: dst.clone(),
                addr,
                trans,
            });
            dst
        };
        let fresh = |l: &mut Self, given: Option<&Vec<Reg>>, n: usize| match given {
            Some(d) => d.clone(),
            None => (0..n).map(|_| l.new_reg(RegTy::B32)).collect(),
        };
        if let Some(at) = a {
            for im in 0..lanes.tm / 16 {
                let (r, hi) = (lanes.arow0, lanes.hi);
                let addr = self.lane_address(lanes, at, (r, 16 * im), (hi, 2 * kk), 1);
                let dst = fresh(self, into.map(|f| &f.a[im as usize]), 4);
                out.a.push(ldmatrix(self, addr, false, dst));
            }
        }
        let step = if lanes.b_x4 { 2 } else { 1 };
        for (i, jn) in (0..lanes.n_tiles).step_by(step).enumerate() {
            let addr = if lanes.b_nk {
                let (r, c) = (lanes.brow_nk, lanes.bchunk_nk);
                self.lane_address(lanes, b, (r, 8 * jn), (c, 2 * kk), 1)
            } else {
                let (r, c, mask) = (lanes.l15, lanes.bchunk0, lanes.bchunk0_mask);
                self.lane_address(lanes, b, (r, 16 * kk), (c, jn), mask)
            };
            let dst = fresh(self, into.map(|f| &f.b[i]), 2 * step);
            out.b.push(ldmatrix(self, addr, !lanes.b_nk, dst));
        }
        out
    }

    /// Before the loop of a rotated dot: the wait and barrier for its first
    /// stage, and the fragments of its first k step read from that stage.
    fn rotated_prologue(
        &mut self,
        r: &Rotation,
        a: Value,
        b: Value,
        shape: &TileShape,
    ) -> R<Fragments> {
        let Some(body) = self.blocks.pop() else {
            return self.unsupported("a rotated dot outside a loop");
        };
        self.emit(Inst::Comment(
            "the first k step's fragments of the pipeline's first stage".into(),
        ));
        self.emit(Inst::CpAsyncWait { pending: r.pending });
        self.emit(Inst::Barrier);
        let mut lanes = self.fragment_lanes(shape);
        let at = self.stage_tile(a, Operand::Int(0));
        let bt = self.stage_tile(b, Operand::Int(0));
        let first = self.load_fragments(&mut lanes, Some(at), bt, 0, None);
        self.blocks.push(body);
        Ok(first)
    }

    /// Before a rotated dot's last k step: the copies `num_stages - 1`
    /// iterations ahead, the wait and barrier for the next stage, and the
    /// next iteration's first k step read from it into `first`.
    fn rotate_to_next_stage(
        &mut self,
        r: &Rotation,
        a: Value,
        b: Value,
        lanes: &mut FragmentLanes,
        first: &Fragments,
    ) -> R<()> {
        self.emit(Inst::Comment(
            "the copies ahead, then the next stage's first k step".into(),
        ));
        for i in r.ahead.clone() {
            self.emit(i);
        }
        self.emit(Inst::CpAsyncWait { pending: r.pending });
        self.emit(Inst::Barrier);
        let next = self.next_stage(r.stage, r.stages);
        let next = self.materialize(RegTy::U32, next);
        let at = self.stage_tile(a, next);
        let bt = self.stage_tile(b, next);
        self.load_fragments(lanes, Some(at), bt, 0, Some(first));
        Ok(())
    }

    /// Stage `stage` of the pipeline of operand `v` (a pipelined load, or
    /// its transpose).
    fn stage_tile(&mut self, v: Value, stage: Operand) -> SmemTile {
        let (pi, _) = self.pipeline.pipelined[&v];
        let (base, sw) = self.stage_base(pi, stage);
        SmemTile { base, sw }
    }

    /// Whether the m16n8k16 `a` fragments of `av` can be made from its
    /// registers with no shared memory (FlashAttention-2's P): where `av`
    /// is a bf16 value in the accumulator layout of an m16n8 dot whose warps
    /// own whole rows, as this dot's (`out`) do. A thread then holds, of rows
    /// g and g + 8 of each tile, columns 2t, 2t + 1 and 8 more: exactly its
    /// `a` fragment (PTX ISA, "Matrix Fragments for mma.m16n8k16"), two
    /// values a register.
    fn a_in_registers(&self, av: &TV, out: &Layout, k: u32) -> bool {
        if !self.feat.cvt_bf16 || av.dtype != DType::BF16 {
            return false;
        }
        let own = WarpTiling::of(out);
        let Some(same) = Layout::mma_accumulator(own.m, k, self.num_warps, WarpOrder::RowsFirst)
        else {
            return false;
        };
        *av.layout == same
            && matches!(same.kind, LayoutKind::Mma { warps, .. } if warps == [own.warps[0], 1])
            && own.warps[1] == 1
    }

    /// The `a` fragments of k step `kk` (16 of k), one per 16-row tile of
    /// the warp's `tm` rows, packed from `av`'s registers (see
    /// [`Self::a_in_registers`]).
    pub(super) fn a_fragments_from_registers(
        &mut self,
        av: &TV,
        kk: u32,
        tm: u32,
    ) -> Vec<Vec<Reg>> {
        let slot = |r: u32, c: u32| {
            av.layout
                .find_slot(&[r, c])
                .expect("an accumulator layout holds its whole warp tile")
        };
        let mut frags = Vec::new();
        for im in 0..tm / 16 {
            let mut regs = Vec::new();
            for (dr, dc) in [(0, 0), (8, 0), (0, 8), (8, 8)] {
                let (r, c) = (16 * im + dr, 16 * kk + dc);
                let w = self.pack_bf16(av.ops[slot(r, c)], av.ops[slot(r, c + 1)]);
                let b = self.new_reg(RegTy::B32);
                self.emit(Inst::Mov { dst: b, src: w });
                regs.push(b);
            }
            frags.push(regs);
        }
        frags
    }
}

/// A warp's share of a dot: the warp grid, each warp's `[tm, tn]` tile, and
/// whether `b` is stored transposed (`[n, k]` row-major).
struct TileShape {
    warps: [u32; 2],
    tm: u32,
    tn: u32,
    b_nk: bool,
}

/// A dot operand's swizzled tile in shared memory.
#[derive(Clone, Copy)]
struct SmemTile {
    base: Reg,
    sw: Swizzle,
}

/// This lane's indices for `ldmatrix` in a dot's operand tiles
/// (`Lower::fragment_lanes`) and the lane addresses made from them so far
/// (`Lower::lane_address`), by base, row, chunk and chunk offset.
struct FragmentLanes {
    arow0: Operand,
    l15: Operand,
    hi: Operand,
    bchunk0: Operand,
    bchunk0_mask: u32,
    brow_nk: Operand,
    bchunk_nk: Operand,
    tm: u32,
    n_tiles: u32,
    b_x4: bool,
    b_nk: bool,
    addrs: Vec<((Reg, Operand, Operand, u32), Reg)>,
}

/// The `ldmatrix` results of one k step: `a`'s per 16-row tile, `b`'s per
/// instruction (x4: two 8-column tiles, x2: one).
#[derive(Clone)]
struct Fragments {
    a: Vec<Vec<Reg>>,
    b: Vec<Vec<Reg>>,
    b_x4: bool,
}

impl Fragments {
    /// `b`'s fragments per 8-column tile (two registers each).
    fn b_pairs(&self) -> Vec<Vec<Reg>> {
        match self.b_x4 {
            true => self
                .b
                .iter()
                .flat_map(|d| [d[..2].to_vec(), d[2..].to_vec()])
                .collect(),
            false => self.b.clone(),
        }
    }
}
