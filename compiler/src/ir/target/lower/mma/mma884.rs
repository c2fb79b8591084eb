//! f16 `dot` on sm_70's tensor cores (`mma.sync.m8n8k4`, f32 accumulate).
//!
//! sm_70 has no `ldmatrix`: `a` is staged row-major (`[m, k]`) and `b`
//! transposed (`[n, k]`) in swizzled shared memory, so both fragments are
//! pairs of consecutive-k halves read with ordinary `ld.shared.v2.u32`. Each
//! warp instruction covers a 16x16 tile (four quad-pairs, each an 8x8
//! product) and a k step of 4.

use std::rc::Rc;

use super::WarpTiling;
use crate::ir::target::layout::Layout;
use crate::ir::target::lower::{Lower, R, TV};
use crate::ir::target::{BinOp, Inst, MemTy, Operand, Reg, RegTy, Space};
use crate::ir::tile::Value;
use crate::target::MmaKind;

impl<'a> Lower<'a> {
    /// `dot` of f16 tiles on sm_70 with `mma.sync.m8n8k4` (f32 accumulate): `a`
    /// is staged row-major (`[m, k]`) and `b` transposed (`[n, k]`) in swizzled
    /// shared memory, so both fragments are pairs of consecutive-k halves read
    /// with ordinary `ld.shared.v2.u32`. Each warp instruction covers a 16x16
    /// tile (four quad-pairs, each an 8x8 product) and a k step of 4.
    pub(in crate::ir::target::lower) fn dot_mma884(
        &mut self,
        av: &TV,
        bv: &TV,
        acc: Option<Value>,
        layout: Rc<Layout>,
        k: u32,
    ) -> R<TV> {
        let WarpTiling {
            m,
            n,
            warps,
            tile: [tm, tn],
        } = WarpTiling::of(&layout);
        self.emit(Inst::Comment(format!(
            "dot [{m},{k}] x [{k},{n}] f16 on tensor cores (m8n8k4), {layout}"
        )));
        let mut cur = self.mma_accumulators(acc, &layout)?;
        let (ai, asw) = self.stage_16bit(av, "a", None)?;
        let bt = TV {
            layout: Rc::new(bv.layout.transpose()),
            ops: bv.ops.clone(),
            ty: bv.ty,
            dtype: bv.dtype,
        };
        let (bi, bsw) = self.stage_16bit(&bt, "b", Some(ai))?;
        self.emit(Inst::Barrier);
        let abase = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr {
            dst: abase,
            buffer: ai,
        });
        let bbase = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr {
            dst: bbase,
            buffer: bi,
        });
        // Fragment rows of a (and columns of b): lane % 4, + 4 for the upper
        // half-warp, + 8 for the quad-pair's half of the 16x16 warp tile.
        let tid = Operand::Reg(self.tid);
        let lane = self.bin(BinOp::And, RegTy::U32, tid, Operand::Int(31));
        let l3 = self.bin(BinOp::And, RegTy::U32, lane, Operand::Int(3));
        let hi = self.bin(BinOp::Shr, RegTy::U32, lane, Operand::Int(2));
        let hi = self.bin(BinOp::And, RegTy::U32, hi, Operand::Int(4));
        let quad = self.bin(BinOp::Add, RegTy::U32, l3, hi);
        let qa = self.bin(BinOp::Shl, RegTy::U32, lane, Operand::Int(1));
        let qa = self.bin(BinOp::And, RegTy::U32, qa, Operand::Int(8));
        let qb = self.bin(BinOp::And, RegTy::U32, lane, Operand::Int(8));
        let (warp_m, warp_n) = self.warp_coords(warps);
        let arow = self.bin(BinOp::Mul, RegTy::U32, warp_m, Operand::Int(tm as i64));
        let arow = self.bin(BinOp::Add, RegTy::U32, arow, quad);
        let arow = self.bin(BinOp::Add, RegTy::U32, arow, qa);
        let bcol = self.bin(BinOp::Mul, RegTy::U32, warp_n, Operand::Int(tn as i64));
        let bcol = self.bin(BinOp::Add, RegTy::U32, bcol, quad);
        let bcol = self.bin(BinOp::Add, RegTy::U32, bcol, qb);
        let (mt, nt) = ((tm / 16) as usize, (tn / 16) as usize);
        for k16 in 0..k / 16 {
            // Row addresses of this 16-wide k slab (two 16-byte chunks).
            let mut rows = Vec::new();
            for (base, sw, r0, tiles) in [(abase, asw, arow, mt), (bbase, bsw, bcol, nt)] {
                let mut v = Vec::new();
                for t in 0..tiles {
                    let r = self.bin(BinOp::Add, RegTy::U32, r0, Operand::Int(16 * t as i64));
                    let lo = self.swizzled(base, sw, r, Operand::Int(16 * k16 as i64));
                    let hi = self.swizzled(base, sw, r, Operand::Int(16 * k16 as i64 + 8));
                    v.push([lo, hi]);
                }
                rows.push(v);
            }
            for k4 in 0..4usize {
                let mut frags: Vec<Vec<Vec<Reg>>> = Vec::new();
                for v in &rows {
                    let mut f = Vec::new();
                    for addrs in v {
                        let dst: Vec<Reg> = (0..2).map(|_| self.new_reg(RegTy::B32)).collect();
                        self.emit(Inst::Ld {
                            stream: false,
                            space: Space::Shared,
                            mem: MemTy::U32,
                            dst: dst.clone(),
                            addr: addrs[k4 / 2],
                            offset: (k4 % 2) as i64 * 8,
                            pred: None,
                        });
                        f.push(dst);
                    }
                    frags.push(f);
                }
                cur = self.mma_step(&cur, &frags[0], &frags[1], 8, |l, a, b, c, d| {
                    l.emit(Inst::Mma {
                        kind: MmaKind::MmaSync,
                        m: 8,
                        n: 8,
                        k: 4,
                        input: MemTy::F16,
                        d: d.to_vec(),
                        a: a.to_vec(),
                        b: b.to_vec(),
                        c,
                    });
                });
            }
        }
        Ok(self.mma_result(layout, cur))
    }
}
