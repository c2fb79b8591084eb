//! Dot operands in shared memory for the tensor-core paths: where an operand
//! already is (a pipeline stage, a deferred async copy issued now) or storing
//! it from registers into a new swizzled, row-major 16-bit buffer.
//!
//! Invariant: the `a` and `b` buffers of one dot never overlap (`b` is placed
//! after `a`); transient buffers may overlap those of other dots.

use std::collections::HashMap;

use crate::check::DType;
use crate::ir::target::layout::Layout;
use crate::ir::target::lower::{Lower, R, TV};
use crate::ir::target::{BinOp, Inst, LayoutKind, MemTy, Operand, Reg, RegTy, Space, Swizzle};
use crate::ir::tile::Value;

impl<'a> Lower<'a> {
    /// Where a dot operand is in shared memory: the base register of its
    /// swizzled tile, the swizzle, whether it is stored transposed, and the
    /// transient buffer it got (if any). Pipelined operands are in the current
    /// stage of their loop's buffer; deferred ones are copied now (`issued`);
    /// others are stored from registers.
    pub(super) fn operand_source(
        &mut self,
        v: Value,
        tv: &TV,
        what: &str,
        after: Option<usize>,
        issued: &mut bool,
    ) -> R<(Reg, Swizzle, bool, Option<usize>)> {
        if let Some((pi, trans)) = self.pipeline.pipelined.get(&v).copied() {
            let stage = Operand::Reg(self.pipeline.pipes[pi].stage);
            let (base, sw) = self.stage_base(pi, stage);
            return Ok((base, sw, trans, None));
        }
        let (index, sw, trans) = match self.pipeline.deferred.get(&v).cloned() {
            Some((d, trans)) => {
                *issued = true;
                let (i, sw) = self.stage_async(&d, what, after);
                (i, sw, trans)
            }
            None => {
                let (i, sw) = self.stage_16bit(tv, what, after)?;
                (i, sw, false)
            }
        };
        let base = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr {
            dst: base,
            buffer: index,
        });
        Ok((base, sw, trans, Some(index)))
    }

    /// Stages a `[rows, cols]` tile (values of a 16-bit dtype held in f32) in a new
    /// swizzled shared buffer, row-major; returns the buffer index and swizzle.
    pub(super) fn stage_16bit(
        &mut self,
        v: &TV,
        what: &str,
        after: Option<usize>,
    ) -> R<(usize, Swizzle)> {
        let (rows, cols) = (v.layout.shape[0], v.layout.shape[1]);
        let (index, sw) = self.operand_buffer(rows, cols, what, after);
        let mem = if v.dtype == DType::BF16 {
            MemTy::U16
        } else {
            MemTy::F16
        };
        let buf = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr {
            dst: buf,
            buffer: index,
        });
        let br = self.base(&v.layout.terms[0].clone());
        let bc = self.base(&v.layout.terms[1].clone());
        let mut rows_cache: HashMap<u32, (Operand, Operand)> = HashMap::new();
        let mut cols_cache: HashMap<u32, (Operand, Operand)> = HashMap::new();
        for group in Self::vector_groups(&v.layout, store_run(&v.layout)) {
            let s0 = v.layout.slots[group[0]].clone();
            let (rowaddr, phase) = match rows_cache.get(&s0[0]) {
                Some(x) => *x,
                None => {
                    let r = self.bin(BinOp::Add, RegTy::I32, br, Operand::Int(s0[0] as i64));
                    let ra = self.bin(BinOp::Mul, RegTy::I32, r, Operand::Int(sw.row_bytes as i64));
                    let ra = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(buf), ra);
                    let ph = self.swizzle_phase(sw, r);
                    rows_cache.insert(s0[0], (ra, ph));
                    (ra, ph)
                }
            };
            let (chunk, within) = match cols_cache.get(&s0[1]) {
                Some(x) => *x,
                None => {
                    let c = self.bin(BinOp::Add, RegTy::I32, bc, Operand::Int(s0[1] as i64));
                    let ch = self.bin(BinOp::Shr, RegTy::U32, c, Operand::Int(3));
                    let w = self.bin(BinOp::And, RegTy::U32, c, Operand::Int(7));
                    let w = self.bin(BinOp::Shl, RegTy::U32, w, Operand::Int(1));
                    cols_cache.insert(s0[1], (ch, w));
                    (ch, w)
                }
            };
            let swz = self.bin(BinOp::Xor, RegTy::U32, chunk, phase);
            let swz = self.bin(BinOp::Shl, RegTy::U32, swz, Operand::Int(4));
            let a = self.bin(BinOp::Add, RegTy::U32, rowaddr, swz);
            let a = self.bin(BinOp::Add, RegTy::U32, a, within);
            let addr = self.materialize(RegTy::U32, a).reg().expect("reg");
            let mut srcs = Vec::new();
            let mut store_mem = mem;
            if mem == MemTy::U16 && group.len() > 1 {
                // bf16 pairs as 32-bit words (one conversion each where the
                // arch packs bf16 pairs).
                store_mem = MemTy::U32;
                for pair in group.chunks(2) {
                    srcs.push(self.pack_bf16(v.ops[pair[0]], v.ops[pair[1]]));
                }
            } else {
                for &slot in &group {
                    let x = self.materialize(RegTy::F32, v.ops[slot]);
                    srcs.push(if mem == MemTy::F16 {
                        self.cvt(RegTy::B16, x, None)
                    } else {
                        let u = self.new_reg(RegTy::U32);
                        self.emit(Inst::Mov { dst: u, src: x });
                        self.bin(BinOp::Shr, RegTy::U32, Operand::Reg(u), Operand::Int(16))
                    });
                }
            }
            self.emit(Inst::St {
                stream: false,
                space: Space::Shared,
                mem: store_mem,
                src: srcs,
                addr,
                offset: 0,
                pred: None,
            });
        }
        Ok((index, sw))
    }
}

/// How many elements along the last axis each store of `stage_16bit` writes
/// (at most 4: 8 bytes, within a 16-byte chunk of the swizzle): the
/// contiguous run of a blocked layout; 2 for the matrix accumulators, whose
/// threads hold pairs of adjacent columns from an even column; else 1.
fn store_run(l: &Layout) -> u32 {
    let run = pow2_run(l);
    if run > 1 || !matches!(l.kind, LayoutKind::Mma { .. }) {
        return 4.min(run);
    }
    let Some(vd) = l.vector_axis() else { return 1 };
    let even_base = l.terms[vd].iter().all(|t| t.mul % 2 == 0);
    let pairs = Lower::vector_groups(l, 2).iter().all(|g| g.len() == 2);
    if even_base && pairs {
        2
    } else {
        1
    }
}

/// The length of the contiguous runs along the last axis of a layout's slots
/// (its size per thread there), a power of two.
pub(super) fn pow2_run(l: &Layout) -> u32 {
    match &l.kind {
        LayoutKind::Blocked {
            size_per_thread, ..
        } => *size_per_thread.last().unwrap_or(&1),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::target::tests::{lower_source, stores};
    use crate::ir::target::{MemTy, Space};
    use crate::ir::tile::Specialization;
    use crate::target::Arch;

    // P = exp(Q Kᵀ) in the accumulator layout, staged as a DT operand.
    const PV: &str = "@kernel(grid=(1,), num_warps=4)
def pv(q: Tensor[64, 64, DT], k: Tensor[64, 64, DT], v: Tensor[64, 64, DT], o: Tensor[64, 64, f32]):
    p = exp(dot(load(q[0:64, :]), load(k[0:64, :]).T))
    store(o[0:64, :], dot(p.to(DT), load(v[0:64, :])))
";

    /// The shared-memory stores of `PV` of `dtype` lowered for `arch`.
    fn shared_stores(arch: Arch, dtype: &str) -> Vec<(MemTy, usize)> {
        let k = lower_source(&PV.replace("DT", dtype), arch, Specialization::new());
        stores(&k, Space::Shared)
    }

    #[test]
    fn accumulator_tiles_are_staged_a_pair_of_columns_a_store() {
        // P through shared memory: a thread of the m16n8 accumulator holds
        // columns 2c and 2c + 1, so each pair is one store (the 64x64 tile
        // over 128 threads is 16 pairs a thread): f16 pairs as two values,
        // bf16 as one 32-bit word.
        assert_eq!(shared_stores(Arch::Sm80, "f16"), vec![(MemTy::F16, 2); 16]);
        // (sm_75 also stores q and k, having no async copies.)
        let sm75 = shared_stores(Arch::Sm75, "f16");
        assert_eq!(sm75.iter().filter(|s| **s == (MemTy::F16, 2)).count(), 16);
        // bf16 from sm_80 on: m16n8k16 takes P from registers, no store.
        for arch in [Arch::Sm80, Arch::Sm90] {
            assert_eq!(shared_stores(arch, "bf16"), vec![], "{arch}");
        }
    }
}
