//! f16 `dot` on sm_70's tensor cores (`mma.sync.m8n8k4`, f32 accumulate).
//!
//! sm_70 has no `ldmatrix`: `a` is staged row-major (`[m, k]`) and `b`
//! transposed (`[n, k]`) in swizzled shared memory, so both fragments are
//! pairs of consecutive-k halves read with ordinary `ld.shared.v2.u32`. Each
//! warp instruction covers a 16x16 tile (four quad-pairs, each an 8x8
//! product) and a k step of 4.

use std::rc::Rc;

use crate::check::DType;
use crate::ir::target::layout::Layout;
use crate::ir::target::lower::{Lower, R, TV};
use crate::ir::target::{BinOp, Inst, LayoutKind, MemTy, Operand, Reg, RegTy, Space};
use crate::ir::tile::Value;

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
        let (m, n) = (layout.shape[0], layout.shape[1]);
        let (wm, wn) = match layout.kind {
            LayoutKind::Mma { warps, .. } => (warps[0], warps[1]),
            _ => unreachable!("mma layout"),
        };
        let (tm, tn) = (m / wm, n / wn);
        self.emit(Inst::Comment(format!(
            "dot [{m},{k}] x [{k},{n}] f16 on tensor cores (m8n8k4), {layout}"
        )));
        let init = match acc {
            Some(c) => {
                let c = self.val(c);
                self.convert(&c, &layout)?.ops
            }
            None => vec![Operand::Float(0.0); layout.num_slots()],
        };
        let mut cur: Vec<Reg> = Vec::with_capacity(init.len());
        for o in init {
            cur.push(match o {
                Operand::Reg(r) => r,
                o => self.materialize(RegTy::F32, o).reg().expect("reg"),
            });
        }
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
        let warp = self.bin(BinOp::Shr, RegTy::U32, tid, Operand::Int(5));
        let warp_m = self.bin(BinOp::And, RegTy::U32, warp, Operand::Int(wm as i64 - 1));
        let warp_n = self.bin(
            BinOp::Shr,
            RegTy::U32,
            warp,
            Operand::Int(wm.trailing_zeros() as i64),
        );
        let warp_n = self.bin(BinOp::And, RegTy::U32, warp_n, Operand::Int(wn as i64 - 1));
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
                let mut next = cur.clone();
                for (im, af) in frags[0].iter().enumerate() {
                    for (jn, bf) in frags[1].iter().enumerate() {
                        let t = (im * nt + jn) * 8;
                        let d: Vec<Reg> = (0..8).map(|_| self.new_reg(RegTy::F32)).collect();
                        self.emit(Inst::Mma {
                            m: 8,
                            n: 8,
                            k: 4,
                            input: MemTy::F16,
                            d: d.clone(),
                            a: af.clone(),
                            b: bf.clone(),
                            c: cur[t..t + 8].to_vec(),
                        });
                        next[t..t + 8].copy_from_slice(&d);
                    }
                }
                cur = next;
            }
        }
        // The buffers are rewritten by the next call (in a loop).
        self.emit(Inst::Barrier);
        Ok(TV {
            layout,
            ops: cur.into_iter().map(Operand::Reg).collect(),
            ty: RegTy::F32,
            dtype: DType::F32,
        })
    }
}
