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
        // Operands read in place from pipeline stages (or registers) are
        // published by the pipeline's barrier at the top of the loop.
        let staged = abuf.is_some() || bbuf.is_some();
        if staged {
            self.emit(Inst::Barrier);
        }
        // Per-lane row addresses for ldmatrix.
        let tid = Operand::Reg(self.tid);
        let lane = self.bin(BinOp::And, RegTy::U32, tid, Operand::Int(31));
        let l15 = self.bin(BinOp::And, RegTy::U32, lane, Operand::Int(15));
        let hi = self.bin(BinOp::Shr, RegTy::U32, lane, Operand::Int(4));
        let (warp_m, warp_n) = self.warp_coords(warps);
        // Swizzled address of 16-byte chunk `chunk + c` of row `r + dr`,
        // where `r` and `chunk` are this lane's and `dr`, `c` constants, and
        // `chunk` never has a bit of `lane_mask` clear where `c` has one set
        // (`chunk + c` is `chunk ^ c`). The swizzle's phase repeats every 8
        // rows (`Swizzle::for_rows`), so a `dr` of a multiple of 8 is a
        // constant offset; and as the phase only flips chunk bits within the
        // swizzle's span `m` (128 bytes, or the row if shorter), the chunk
        // offset `16 c` is an XOR of its bits below `m` into the lane's
        // address of chunk `chunk` plus the rest added: one lane address per
        // operand, and per fragment an `xor` and an immediate offset (the
        // base, a multiple of 128 bytes, and rows of `row_bytes` keep every
        // bit below `m` of the row's address clear).
        let mut lane_addrs: Vec<((Reg, Operand, Operand, u32), Reg)> = Vec::new();
        let mut addr_of = |l: &mut Self,
                           base: Reg,
                           sw: Swizzle,
                           (r, dr): (Operand, u32),
                           (chunk, c): (Operand, u32),
                           lane_mask: u32| {
            let (r, dr) = match dr % (sw.per_phase * sw.max_phase) {
                0 => (r, dr),
                _ => (l.bin(BinOp::Add, RegTy::U32, r, Operand::Int(dr as i64)), 0),
            };
            let disjoint = c & lane_mask == 0;
            let key = (base, r, chunk, if disjoint { 0 } else { c });
            let at = match lane_addrs.iter().find(|(k, _)| *k == key) {
                Some(&(_, a)) => a,
                None => {
                    let ph = l.swizzle_phase(sw, r);
                    let ch = l.bin(BinOp::Add, RegTy::U32, chunk, Operand::Int(key.3 as i64));
                    let ch = l.bin(BinOp::Xor, RegTy::U32, ch, ph);
                    let ch = l.bin(BinOp::Shl, RegTy::U32, ch, Operand::Int(4));
                    let ra = l.bin(BinOp::Mul, RegTy::U32, r, Operand::Int(sw.row_bytes as i64));
                    // The lane's offset first, then the base: the offset is
                    // loop-invariant where the base (a pipeline stage) is not.
                    let off = l.bin(BinOp::Add, RegTy::U32, ra, ch);
                    let a = l.bin(BinOp::Add, RegTy::U32, Operand::Reg(base), off);
                    let a = l.materialize(RegTy::U32, a).reg().expect("reg");
                    lane_addrs.push((key, a));
                    a
                }
            };
            let span = sw.row_bytes.min(128);
            let (flip, add) = match disjoint {
                true => ((16 * c) % span, (16 * c) / span * span),
                false => (0, 0),
            };
            let a = l.bin(
                BinOp::Xor,
                RegTy::U32,
                Operand::Reg(at),
                Operand::Int(flip as i64),
            );
            let a = l.bin(
                BinOp::Add,
                RegTy::U32,
                a,
                Operand::Int((add + dr * sw.row_bytes) as i64),
            );
            l.materialize(RegTy::U32, a).reg().expect("reg")
        };
        let arow0 = self.bin(BinOp::Mul, RegTy::U32, warp_m, Operand::Int(tm as i64));
        let arow0 = self.bin(BinOp::Add, RegTy::U32, arow0, l15);
        let bcol0 = self.bin(BinOp::Mul, RegTy::U32, warp_n, Operand::Int(tn as i64 / 8));
        let n_tiles = tn / 8;
        let b_x4 = n_tiles % 2 == 0;
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
        let (brow_nk, bchunk_nk) = match b_nk {
            true => {
                let l7 = self.bin(BinOp::And, RegTy::U32, lane, Operand::Int(7));
                let r = self.bin(BinOp::Mul, RegTy::U32, warp_n, Operand::Int(tn as i64));
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
        for kk in 0..k / 16 {
            // A fragments: one x4 per 16-row tile.
            // (Packed from registers as they are used, so that each f32
            // value dies at its pack.)
            let mut afrag = match a_regs {
                true => self.a_fragments_from_registers(av, kk, tm),
                false => Vec::new(),
            };
            if let Some((abase, asw, ..)) = a_smem {
                for im in 0..tm / 16 {
                    let addr = addr_of(self, abase, asw, (arow0, 16 * im), (hi, 2 * kk), 1);
                    let dst: Vec<Reg> = (0..4).map(|_| self.new_reg(RegTy::B32)).collect();
                    self.emit(Inst::LdMatrix {
                        dst: dst.clone(),
                        addr,
                        trans: false,
                    });
                    afrag.push(dst);
                }
            }
            // B fragments (transposed loads of the row-major [k, n] tile).
            let mut bfrag: Vec<Vec<Reg>> = Vec::new();
            let step = if b_x4 { 2 } else { 1 };
            for jn in (0..n_tiles).step_by(step) {
                let addr = if b_nk {
                    addr_of(self, bbase, bsw, (brow_nk, 8 * jn), (bchunk_nk, 2 * kk), 1)
                } else {
                    addr_of(
                        self,
                        bbase,
                        bsw,
                        (l15, 16 * kk),
                        (bchunk0, jn),
                        bchunk0_mask,
                    )
                };
                let cnt = if b_x4 { 4 } else { 2 };
                let dst: Vec<Reg> = (0..cnt).map(|_| self.new_reg(RegTy::B32)).collect();
                self.emit(Inst::LdMatrix {
                    dst: dst.clone(),
                    addr,
                    trans: !b_nk,
                });
                bfrag.push(dst[..2].to_vec());
                if b_x4 {
                    bfrag.push(dst[2..].to_vec());
                }
            }
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
        Ok(match staged {
            true => self.mma_result(layout, cur),
            false => self.mma_result_in(layout, cur),
        })
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
    fn a_fragments_from_registers(&mut self, av: &TV, kk: u32, tm: u32) -> Vec<Vec<Reg>> {
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
