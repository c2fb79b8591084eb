//! Loads deferred to `cp.async` (sm_80+): which loads may skip registers,
//! whether a load can be planned as aligned 16-byte chunks, and the async
//! copies that put such a load straight into a dot's swizzled operand buffer.
//!
//! A load is deferrable when its 16-bit tile feeds only tensor-core dots
//! (possibly through a transpose) and its tensor is never written by the
//! kernel; it is deferred only when every chunk is provably 16-byte aligned
//! and wholly in or out of bounds (out-of-bounds chunks copy 0 bytes, which
//! zero-fills). Operand buffers are XOR-swizzled (`Swizzle`) so that
//! `ldmatrix` reads are free of bank conflicts.
//!
//! 8-bit (f8) tiles are candidates too where wgmma could read them, but
//! only a TMA pipeline copies them (`Lower::drop_tma_only_loads`):
//! `defer_load`, the `cp.async` chunks, takes 16-bit tiles only.

use std::collections::HashMap;

use super::memory::SlotAccess;
use super::pipeline::PlannedLoad;
use super::{Lower, R};
use crate::check::DType;
use crate::ir::target::layout::Layout;
use crate::ir::target::{BinOp, CmpOp, Inst, Operand, Reg, RegTy, SmemBuffer, Swizzle};
use crate::ir::tile::{self, Access, Constant, OpKind, Value};
use crate::target::MmaFeed;

impl<'a> Lower<'a> {
    /// The loads of 16-bit tiles used only as tensor-core `dot` operands (`a` or
    /// `b` as loaded, or `b` transposed) of tensors the kernel never writes,
    /// in program order: the candidates of the pipeline plan.
    pub(super) fn find_deferrable(&self) -> Vec<PlannedLoad> {
        /// How a tile is used; `DotB(n_major, k_major)` says whether the dot
        /// can read it as loaded (`[k, n]`) and as a transpose (`[n, k]`).
        #[derive(Clone, Copy)]
        enum Use {
            DotA(bool),
            DotB(bool, bool),
            Transpose(Value),
            Other,
        }
        fn walk(
            l: &Lower,
            r: &tile::Region,
            uses: &mut HashMap<Value, Vec<Use>>,
            loads: &mut Vec<PlannedLoad>,
            written: &mut Vec<usize>,
        ) {
            for op in &r.ops {
                match &op.kind {
                    OpKind::Dot {
                        a,
                        b,
                        acc,
                        precision,
                    } => {
                        let (ta, tb) = (l.tk.ty(*a), l.tk.ty(*b));
                        let (m, k, n) = (ta.shape()[0], ta.shape()[1], tb.shape()[1]);
                        // Operands `ldmatrix` reads from a swizzled buffer,
                        // or 8-bit and tf32 ones wgmma may read from TMA's
                        // stages (a `b` k-major, or for tf32 n-major too:
                        // `Lower::wgmma_operands`).
                        let (ok, n_major) = match ta.dtype().bytes() {
                            b @ (1 | 4) => {
                                let ok = l.feat.tma
                                    && ta.dtype() == tb.dtype()
                                    && l.wgmma_fits(ta.dtype(), *precision, [m, n, k]);
                                (ok, ok && b == 4)
                            }
                            _ => {
                                let ok = l
                                    .mma_plan(ta.dtype(), tb.dtype(), [m, n, k], *precision)
                                    .is_some_and(|(i, _)| i.feed == MmaFeed::Ldmatrix);
                                (ok, ok)
                            }
                        };
                        uses.entry(*a).or_default().push(Use::DotA(ok));
                        uses.entry(*b).or_default().push(Use::DotB(n_major, ok));
                        if let Some(c) = acc {
                            uses.entry(*c).or_default().push(Use::Other);
                        }
                    }
                    OpKind::Transpose { x } => uses
                        .entry(*x)
                        .or_default()
                        .push(Use::Transpose(op.results[0])),
                    kind => {
                        for v in kind.operands() {
                            uses.entry(v).or_default().push(Use::Other);
                        }
                    }
                }
                match &op.kind {
                    OpKind::Load {
                        tensor,
                        access,
                        other,
                        ..
                    } => {
                        let d = l.tk.ty(op.results[0]).dtype();
                        if matches!(
                            d,
                            DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 | DType::F32
                        ) {
                            loads.push(l.planned_load(op.results[0], *tensor, access, *other));
                        }
                    }
                    OpKind::Store { tensor, .. } | OpKind::AtomicAdd { tensor, .. } => {
                        written.push(*tensor)
                    }
                    _ => {}
                }
                for region in op.kind.regions() {
                    walk(l, region, uses, loads, written);
                }
            }
        }
        let mut uses = HashMap::new();
        let (mut loads, mut written) = (Vec::new(), Vec::new());
        walk(self, &self.tk.body, &mut uses, &mut loads, &mut written);
        let none = Vec::new();
        loads
            .into_iter()
            .filter(|load| {
                let us = uses.get(&load.value).unwrap_or(&none);
                !written.contains(&load.tensor)
                    && !us.is_empty()
                    && us.iter().all(|u| match u {
                        Use::DotA(ok) | Use::DotB(ok, _) => *ok,
                        Use::Transpose(t) => {
                            let ts = uses.get(t).unwrap_or(&none);
                            !ts.is_empty() && ts.iter().all(|u| matches!(u, Use::DotB(_, true)))
                        }
                        Use::Other => false,
                    })
            })
            .collect()
    }

    /// Plans a load of a 16-bit `[rows, cols]` tile as 16-byte chunks when every
    /// chunk is provably aligned and wholly in or out of bounds; `None` otherwise.
    /// Whether a load can be planned as aligned 16-byte chunks (see `defer_load`).
    pub(super) fn can_defer(
        &self,
        tensor: usize,
        access: &[Access],
        other: Constant,
        shape: &[u32],
    ) -> bool {
        let Ok(t) = self.tensor(tensor) else {
            return false;
        };
        let last = access.len() - 1;
        let zero =
            matches!(other, Constant::Int(0)) || matches!(other, Constant::Float(f) if f == 0.0);
        let Access::Range { start, len } = &access[last] else {
            return false;
        };
        // Elements a 16-byte chunk holds.
        let chunk = 16 / t.dtype.bytes();
        let start_div = self.divisor_or_constant(*start);
        let strides_ok = t.stride_div[..last].iter().all(|s| s.is_multiple_of(chunk));
        let dim_ok = t.dim_div[last].is_multiple_of(chunk);
        if shape.len() != 2
            || !zero
            || !u64::from(*len).is_multiple_of(chunk)
            || !start_div.is_multiple_of(chunk)
            || !strides_ok
            || !dim_ok
        {
            return false;
        }
        true
    }

    pub(super) fn defer_load(
        &mut self,
        tensor: usize,
        access: &[Access],
        other: Constant,
        shape: &[u32],
    ) -> R<Option<Deferred>> {
        let wide = self.tensor(tensor).is_ok_and(|t| t.dtype.bytes() == 2);
        if !wide || !self.can_defer(tensor, access, other, shape) {
            return Ok(None);
        }
        let (rows, cols) = (shape[0], shape[1]);
        self.emit(Inst::Comment(format!(
            "load {}[{rows},{cols}] deferred: copied asynchronously where used",
            self.tk.params[tensor].name
        )));
        let mut layout = Layout::blocked(&[rows, cols / 8], self.num_warps, self.warp_size, 1);
        layout.shape = vec![rows, cols];
        for t in layout.terms[1].iter_mut() {
            t.mul *= 8;
        }
        for s in layout.slots.iter_mut() {
            s[1] *= 8;
        }
        let plan = self.plan_access(tensor, access, &layout, false, false)?;
        Ok(Some(Deferred {
            layout,
            slots: plan.slots,
        }))
    }

    /// A new shared buffer for a `[rows, cols]` 16-bit dot operand, row-major
    /// and swizzled.
    /// `after`: the buffer this one must not overlap (the same dot's `a`).
    pub(super) fn operand_buffer(
        &mut self,
        rows: u32,
        cols: u32,
        what: &str,
        after: Option<usize>,
    ) -> (usize, Swizzle) {
        let sw = Swizzle::for_rows(cols * 2);
        let index = self.buffers.len();
        let offset = match after {
            Some(a) => {
                let a = &self.buffers[a];
                (a.offset + a.bytes).div_ceil(128) * 128
            }
            None => 0,
        };
        let n = self.buffers.iter().filter(|b| b.swizzle.is_some()).count() / 2;
        self.buffers.push(SmemBuffer {
            name: format!("dot{n}_{what}"),
            offset,
            bytes: rows * cols * 2,
            align: 128,
            purpose: format!("`dot` operand {what} ([{rows}, {cols}] 16-bit, swizzled)"),
            swizzle: Some(sw),
        });
        (index, sw)
    }

    /// The swizzle's phase of row `r`: the value its 16-byte chunks are
    /// XORed with.
    pub(super) fn swizzle_phase(&mut self, sw: Swizzle, r: Operand) -> Operand {
        let ph = self.bin(
            BinOp::Shr,
            RegTy::U32,
            r,
            Operand::Int(sw.per_phase.trailing_zeros() as i64),
        );
        self.bin(
            BinOp::And,
            RegTy::U32,
            ph,
            Operand::Int(sw.max_phase as i64 - 1),
        )
    }

    /// Where row `r` of a tile stored with `sw` is ([`Swizzle::stored_row`]).
    fn stored_row(&mut self, sw: Swizzle, r: Operand) -> Operand {
        let t = sw.warpgroup_tiles;
        if t < 2 {
            return r;
        }
        let block = i64::from(64 * t);
        let l = self.bin(BinOp::And, RegTy::U32, r, Operand::Int(block - 1));
        let first = self.bin(BinOp::Sub, RegTy::U32, r, l);
        let tile = self.bin(BinOp::Shr, RegTy::U32, l, Operand::Int(4));
        let w = self.bin(
            BinOp::Shr,
            RegTy::U32,
            tile,
            Operand::Int(t.trailing_zeros() as i64),
        );
        let j = self.bin(BinOp::And, RegTy::U32, tile, Operand::Int(i64::from(t) - 1));
        let j4 = self.bin(BinOp::Shl, RegTy::U32, j, Operand::Int(2));
        let tile = self.bin(BinOp::Add, RegTy::U32, j4, w);
        let at = self.bin(BinOp::Shl, RegTy::U32, tile, Operand::Int(4));
        let within = self.bin(BinOp::And, RegTy::U32, l, Operand::Int(15));
        let at = self.bin(BinOp::Add, RegTy::U32, at, within);
        self.bin(BinOp::Add, RegTy::U32, first, at)
    }

    /// The swizzled shared address of element `(r, c)` (`c` a multiple of 8)
    /// of buffer `buf`.
    pub(super) fn swizzled(&mut self, buf: Reg, sw: Swizzle, r: Operand, c: Operand) -> Reg {
        let ch = self.bin(BinOp::Shr, RegTy::U32, c, Operand::Int(3));
        let logical = r;
        let r = self.stored_row(sw, r);
        // The row's offset and the chunk within it; in panels, row `r` of
        // panel `ch / 8` is at `ch / 8 * rows * 128 + 128 r`, its chunk `ch % 8`.
        let (ra, ch) = match sw.panel_rows {
            0 => (
                self.bin(BinOp::Mul, RegTy::I32, r, Operand::Int(sw.row_bytes as i64)),
                ch,
            ),
            rows => {
                let panel = self.bin(BinOp::Shr, RegTy::U32, ch, Operand::Int(3));
                let pa = self.bin(
                    BinOp::Mul,
                    RegTy::U32,
                    panel,
                    Operand::Int(rows as i64 * 128),
                );
                let ra = self.bin(BinOp::Mul, RegTy::I32, r, Operand::Int(128));
                let ra = self.bin(BinOp::Add, RegTy::U32, ra, pa);
                (ra, self.bin(BinOp::And, RegTy::U32, ch, Operand::Int(7)))
            }
        };
        let ra = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(buf), ra);
        // The XOR phase is the logical row's (`stored_row` keeps `r % 16`).
        let ph = self.swizzle_phase(sw, logical);
        let swz = self.bin(BinOp::Xor, RegTy::U32, ch, ph);
        let swz = self.bin(BinOp::Shl, RegTy::U32, swz, Operand::Int(4));
        let a = self.bin(BinOp::Add, RegTy::U32, ra, swz);
        self.materialize(RegTy::U32, a).reg().expect("reg")
    }

    /// Issues the async copies of a deferred load into a new operand buffer.
    pub(super) fn stage_async(
        &mut self,
        d: &Deferred,
        what: &str,
        after: Option<usize>,
    ) -> (usize, Swizzle) {
        let (rows, cols) = (d.layout.shape[0], d.layout.shape[1]);
        let (index, sw) = self.operand_buffer(rows, cols, what, after);
        let buf = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr {
            dst: buf,
            buffer: index,
        });
        self.issue_copies(d, buf, sw);
        (index, sw)
    }

    /// The async copies of a deferred load into the swizzled tile at `buf`.
    pub(super) fn issue_copies(&mut self, d: &Deferred, buf: Reg, sw: Swizzle) {
        let br = self.base(&d.layout.terms[0].clone());
        let bc = self.base(&d.layout.terms[1].clone());
        // A tile of fewer 16-byte chunks than threads gives several threads
        // the same chunk: only the first of them copies it (two async
        // writes of one address in one phase are a race, same value or
        // not).
        let replicated = d.layout.replication_mask(self.tid_bits);
        if replicated != 0 {
            let r = self.bin(
                BinOp::And,
                RegTy::U32,
                Operand::Reg(self.tid),
                Operand::Int(replicated as i64),
            );
            let first = self.cmp(CmpOp::Eq, RegTy::U32, r, Operand::Int(0));
            let cond = self.materialize(RegTy::Pred, first).reg().expect("reg");
            self.when(cond, |l| {
                l.copy_chunks(d, buf, sw, br, bc);
            });
        } else {
            self.copy_chunks(d, buf, sw, br, bc);
        }
    }

    /// One `cp.async` per chunk of `d` (see [`Self::issue_copies`]). Chunks
    /// a whole swizzle period apart share one address register and differ
    /// by an immediate offset (`Swizzle::shift`): a pipeline's copies keep
    /// one loop-invariant register per phase, not one per chunk.
    fn copy_chunks(&mut self, d: &Deferred, buf: Reg, sw: Swizzle, br: Operand, bc: Operand) {
        let mut sizes: HashMap<Reg, Reg> = HashMap::new();
        let mut shared: Vec<(Reg, [u32; 2])> = Vec::new();
        for (s, acc) in d.layout.slots.clone().iter().zip(d.slots.clone()) {
            let near = shared.iter().find_map(|&(reg, at)| {
                let (dr, dc) = (s[0].checked_sub(at[0])?, s[1].checked_sub(at[1])?);
                Some((reg, sw.shift(dr, dc)?))
            });
            let (dst, dst_offset) = match near {
                Some(found) => found,
                None => {
                    let r = self.bin(BinOp::Add, RegTy::I32, br, Operand::Int(s[0] as i64));
                    let c = self.bin(BinOp::Add, RegTy::I32, bc, Operand::Int(s[1] as i64));
                    let dst = self.swizzled(buf, sw, r, c);
                    shared.push((dst, [s[0], s[1]]));
                    (dst, 0)
                }
            };
            let mut src_size = None;
            if let Some(p) = acc.pred {
                let r = match sizes.get(&p) {
                    Some(r) => *r,
                    None => {
                        let o = self.select(
                            RegTy::U32,
                            Operand::Reg(p),
                            Operand::Int(16),
                            Operand::Int(0),
                        );
                        let r = o.reg().expect("reg");
                        sizes.insert(p, r);
                        r
                    }
                };
                src_size = Some(r);
            }
            self.emit(Inst::CpAsync {
                dst,
                dst_offset: i64::from(dst_offset),
                src: acc.addr,
                src_offset: acc.offset,
                bytes: 16,
                src_size,
            });
        }
    }
}

/// A load of a 16-bit tile planned as 16-byte chunks (one per slot of
/// `layout`, whose slots are the chunks' first elements), issued later as
/// async copies.
#[derive(Debug)]
pub(super) struct Deferred {
    pub(super) layout: Layout,
    pub(super) slots: Vec<SlotAccess>,
}

#[cfg(test)]
mod tests {
    use crate::ir::target::tests::lower_source;
    use crate::ir::target::Inst;
    use crate::ir::tile::Specialization;
    use crate::target::Arch;

    /// Where each `cp.async` of `insts` is: at the top level or in an `if`.
    fn copies(insts: &[Inst], in_if: bool, out: &mut Vec<bool>) {
        for i in insts {
            match i {
                Inst::CpAsync { .. } => out.push(in_if),
                Inst::If { .. } => i.regions().iter().for_each(|r| copies(r, true, out)),
                _ => i.regions().iter().for_each(|r| copies(r, in_if, out)),
            }
        }
    }

    #[test]
    fn a_tile_of_fewer_chunks_than_threads_is_copied_once_a_chunk() {
        // 256 threads; a [64, 32] f16 operand is 256 chunks of 16 bytes (one
        // each), a [32, 16] one 64 chunks: only a quarter of the threads
        // copy it, under a branch.
        let src = "@kernel(grid=(1,), num_warps=8)
def k(a: Tensor[64, 32, f16], b: Tensor[32, 16, f16], o: Tensor[64, 16, f32]):
    store(o[0:64, :], dot(load(a[0:64, :]), load(b[:, 0:16])))
";
        let k = lower_source(src, Arch::Sm80, Specialization::new());
        let mut found = Vec::new();
        copies(&k.body, false, &mut found);
        assert_eq!(found, vec![false, true]);
    }
}
