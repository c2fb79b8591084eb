//! f32 `dot` with `precision="tf32"` on tensor cores (`mma.m16n8k8.tf32`,
//! sm_80+).
//!
//! Both operands are staged in the scratch region as f32 with padded rows (A:
//! K + 4 words, B: N + 8), so the per-element fragment reads are free of bank
//! conflicts; each fragment element is rounded with `cvt.rna.tf32.f32`.

use std::rc::Rc;

use super::WarpTiling;
use crate::ir::target::layout::Layout;
use crate::ir::target::lower::{Lower, R, TV};
use crate::ir::target::{BinOp, Inst, MemTy, Operand, Reg, RegTy, Space};
use crate::ir::tile::Value;
use crate::target::MmaKind;

impl<'a> Lower<'a> {
    /// `dot` of f32 tiles rounded to tf32 on tensor cores: both operands staged
    /// in shared memory as f32 with padded rows (A: K + 4, B: N + 8 words, so the
    /// fragment reads are conflict-free), fragments read per element and rounded
    /// with `cvt.rna.tf32.f32`, `mma.m16n8k8` per 16x8 tile and k step of 8.
    pub(in crate::ir::target::lower) fn dot_tf32(
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
        let (sa, sb) = (k + 4, n + 8);
        self.emit(Inst::Comment(format!(
            "dot [{m},{k}] x [{k},{n}] tf32 on tensor cores, {layout}"
        )));
        let mut cur = self.mma_accumulators(acc, &layout)?;
        let b_off = (m * sa * 4).div_ceil(128) * 128;
        self.reserve_scratch(b_off + k * sb * 4);
        let smem = self.scratch_addr();
        for (tv, off, stride) in [(av, 0u32, sa), (bv, b_off, sb)] {
            let br = self.base(&tv.layout.terms[0].clone());
            let bc = self.base(&tv.layout.terms[1].clone());
            let lin = self.bin(BinOp::Mul, RegTy::I32, br, Operand::Int(stride as i64));
            let lin = self.bin(BinOp::Add, RegTy::I32, lin, bc);
            let lin = self.bin(BinOp::Mul, RegTy::I32, lin, Operand::Int(4));
            let addr = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), lin);
            let addr = self.materialize(RegTy::U32, addr).reg().expect("reg");
            for (s, &o) in tv.layout.slots.iter().zip(&tv.ops) {
                self.emit(Inst::St {
                    stream: false,
                    space: Space::Shared,
                    mem: MemTy::F32,
                    src: vec![o],
                    addr,
                    offset: off as i64 + (s[0] as i64 * stride as i64 + s[1] as i64) * 4,
                    pred: None,
                });
            }
        }
        self.emit(Inst::Barrier);
        let tid = Operand::Reg(self.tid);
        let lane = self.bin(BinOp::And, RegTy::U32, tid, Operand::Int(31));
        let g = self.bin(BinOp::Shr, RegTy::U32, lane, Operand::Int(2));
        let t = self.bin(BinOp::And, RegTy::U32, lane, Operand::Int(3));
        let (warp_m, warp_n) = self.warp_coords(warps);
        // A: row warp_m * tm + g, column t; B: row t, column warp_n * tn + g.
        let ar = self.bin(BinOp::Mul, RegTy::U32, warp_m, Operand::Int(tm as i64));
        let ar = self.bin(BinOp::Add, RegTy::U32, ar, g);
        let ar = self.bin(BinOp::Mul, RegTy::U32, ar, Operand::Int(sa as i64));
        let ar = self.bin(BinOp::Add, RegTy::U32, ar, t);
        let ar = self.bin(BinOp::Mul, RegTy::U32, ar, Operand::Int(4));
        let abase = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), ar);
        let abase = self.materialize(RegTy::U32, abase).reg().expect("reg");
        let bc = self.bin(BinOp::Mul, RegTy::U32, warp_n, Operand::Int(tn as i64));
        let bc = self.bin(BinOp::Add, RegTy::U32, bc, g);
        let br = self.bin(BinOp::Mul, RegTy::U32, t, Operand::Int(sb as i64));
        let bl = self.bin(BinOp::Add, RegTy::U32, br, bc);
        let bl = self.bin(BinOp::Mul, RegTy::U32, bl, Operand::Int(4));
        let bbase = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), bl);
        let bbase = self.materialize(RegTy::U32, bbase).reg().expect("reg");
        let frag = |l: &mut Self, addr: Reg, offset: i64| {
            let f = l.new_reg(RegTy::F32);
            l.emit(Inst::Ld {
                stream: false,
                space: Space::Shared,
                mem: MemTy::F32,
                dst: vec![f],
                addr,
                offset,
                pred: None,
            });
            let r = l.new_reg(RegTy::B32);
            l.emit(Inst::Cvt {
                dst: r,
                src: f,
                narrow: None,
            });
            r
        };
        let n_tiles = (tn / 8) as usize;
        for kk in 0..(k / 8) as i64 {
            let mut afrag = Vec::new();
            for im in 0..(tm / 16) as i64 {
                let base = (16 * im * sa as i64 + 8 * kk) * 4;
                let row8 = 8 * sa as i64 * 4;
                afrag.push(vec![
                    frag(self, abase, base),
                    frag(self, abase, base + row8),
                    frag(self, abase, base + 16),
                    frag(self, abase, base + row8 + 16),
                ]);
            }
            let mut bfrag = Vec::new();
            for jn in 0..n_tiles as i64 {
                let base = b_off as i64 + (8 * kk * sb as i64 + 8 * jn) * 4;
                bfrag.push(vec![
                    frag(self, bbase, base),
                    frag(self, bbase, base + 4 * sb as i64 * 4),
                ]);
            }
            cur = self.mma_step(&cur, &afrag, &bfrag, 4, |l, a, b, c, d| {
                l.emit(Inst::Mma {
                    kind: MmaKind::MmaSync,
                    m: 16,
                    n: 8,
                    k: 8,
                    input: MemTy::F32,
                    d: d.to_vec(),
                    a: a.to_vec(),
                    b: b.to_vec(),
                    c,
                });
            });
        }
        Ok(self.mma_result(layout, cur))
    }
}
