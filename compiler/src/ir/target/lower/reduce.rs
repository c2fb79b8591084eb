//! Reductions along one axis: combined within a thread, then across lanes
//! with butterfly shuffles, then across warps through the shared scratch
//! region.
//!
//! Every thread ends up with the result (an all-reduce), so a reduced scalar
//! is uniform and control flow on it never diverges. Bools reduce as 0/1
//! (`max` is any, `min` is all).

use std::rc::Rc;

use super::layouts::row_major;
use super::{Lower, R, TV};
use crate::ir::target::layout::Term;
use crate::ir::target::{BinOp, CmpOp, Inst, MemTy, Operand, RegTy, Space};
use crate::ir::tile::ReduceOp;

impl<'a> Lower<'a> {
    fn combine(&mut self, r: ReduceOp, ty: RegTy, a: Operand, b: Operand) -> Operand {
        let op = match r {
            ReduceOp::Sum => BinOp::Add,
            ReduceOp::Max => BinOp::Max,
            ReduceOp::Min => BinOp::Min,
        };
        self.bin(op, ty, a, b)
    }

    pub(super) fn reduce(&mut self, r: ReduceOp, x: &TV, axis: usize, keepdims: bool) -> R<TV> {
        if x.ty == RegTy::Pred {
            // Bools reduce as 0/1 (max: any, min: all).
            let ops = x
                .ops
                .iter()
                .map(|&o| self.select(RegTy::U32, o, Operand::Int(1), Operand::Int(0)))
                .collect();
            let xi = TV {
                ops,
                ty: RegTy::U32,
                ..x.clone()
            };
            let red = self.reduce(r, &xi, axis, keepdims)?;
            let ops = red
                .ops
                .iter()
                .map(|&o| self.cmp(CmpOp::Ne, RegTy::U32, o, Operand::Int(0)))
                .collect();
            return Ok(TV {
                ops,
                ty: RegTy::Pred,
                ..red
            });
        }
        if !matches!(
            x.ty,
            RegTy::F32 | RegTy::I32 | RegTy::U32 | RegTy::F64 | RegTy::I64 | RegTy::U64
        ) {
            return self.unsupported(format!("a reduction over {}", x.dtype.name()));
        }
        let ty = x.ty;
        // Bytes per partial in shared memory.
        let eb: i64 = if ty.words() == 2 { 8 } else { 4 };
        self.emit(Inst::Comment(format!("reduce axis {axis} of {}", x.layout)));
        let out = Rc::new(x.layout.slice(axis, keepdims));
        // 1. Within the thread.
        let mut partial: Vec<Option<Operand>> = vec![None; out.num_slots()];
        for (s, &o) in x.layout.slots.iter().zip(&x.ops) {
            let mut key = s.clone();
            if keepdims {
                key[axis] = 0;
            } else {
                key.remove(axis);
            }
            let j = out.find_slot(&key).expect("slice slot");
            partial[j] = Some(match partial[j] {
                None => o,
                Some(p) => self.combine(r, ty, p, o),
            });
        }
        let mut partial: Vec<Operand> = partial.into_iter().map(|p| p.expect("slot")).collect();
        // 2. Across lanes.
        let warp_bits = self.warp_size.trailing_zeros() as u8;
        let terms = x.layout.terms[axis].clone();
        for t in terms.iter().filter(|t| t.shift < warp_bits) {
            for bit in t.shift..t.shift + t.bits {
                for p in partial.iter_mut() {
                    let src = match self.materialize(ty, *p) {
                        Operand::Reg(r) => r,
                        _ => unreachable!(),
                    };
                    let dst = self.new_reg(ty);
                    self.emit(Inst::ShflXor {
                        dst,
                        src,
                        lane_mask: 1 << bit,
                    });
                    *p = self.combine(r, ty, Operand::Reg(src), Operand::Reg(dst));
                }
            }
        }
        // 3. Across warps, through shared memory.
        let wterms: Vec<Term> = terms
            .iter()
            .filter(|t| t.shift >= warp_bits)
            .copied()
            .collect();
        if !wterms.is_empty() {
            let nw: u32 = wterms.iter().map(|t| 1u32 << t.bits).product();
            let n_out: u64 = out.shape.iter().map(|&d| d as u64).product();
            self.reserve_scratch((n_out * nw as u64 * eb as u64) as u32);
            // The warp's index along the axis.
            let mut widx = Operand::Int(0);
            let mut acc_bits = 0u8;
            for t in &wterms {
                let mut v = self.bin(
                    BinOp::Shr,
                    RegTy::I32,
                    Operand::Reg(self.tid),
                    Operand::Int(t.shift as i64),
                );
                v = self.bin(BinOp::And, RegTy::I32, v, Operand::Int((1 << t.bits) - 1));
                if acc_bits > 0 {
                    v = self.bin(BinOp::Shl, RegTy::I32, v, Operand::Int(acc_bits as i64));
                }
                widx = self.bin(BinOp::Add, RegTy::I32, widx, v);
                acc_bits += t.bits;
            }
            let smem = self.scratch_addr();
            let lb = self.linear_base(&out.clone());
            let row = self.bin(BinOp::Mul, RegTy::I32, lb, Operand::Int(nw as i64 * eb));
            let rbase = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), row);
            let rbase = self.materialize(RegTy::U32, rbase);
            let wo = self.bin(BinOp::Mul, RegTy::I32, widx, Operand::Int(eb));
            let waddr = self.bin(BinOp::Add, RegTy::U32, rbase, wo);
            let waddr = self.materialize(RegTy::U32, waddr).reg().expect("reg");
            let rbase = rbase.reg().expect("reg");
            let strides = row_major(&out.shape);
            let mem = match ty {
                RegTy::F32 => MemTy::F32,
                RegTy::F64 => MemTy::F64,
                RegTy::I64 | RegTy::U64 => MemTy::I64,
                _ => MemTy::U32,
            };
            let lins: Vec<i64> = out
                .slots
                .iter()
                .map(|s| {
                    s.iter()
                        .zip(&strides)
                        .map(|(&o, &st)| o as i64 * st as i64)
                        .sum()
                })
                .collect();
            for (j, p) in partial.iter().enumerate() {
                self.emit(Inst::St {
                    stream: false,
                    space: Space::Shared,
                    mem,
                    src: vec![*p],
                    addr: waddr,
                    offset: lins[j] * nw as i64 * eb,
                    pred: None,
                });
            }
            self.emit(Inst::Barrier);
            for (j, p) in partial.iter_mut().enumerate() {
                let mut acc: Option<Operand> = None;
                for w in 0..nw as i64 {
                    let dst = self.new_reg(ty);
                    self.emit(Inst::Ld {
                        stream: false,
                        space: Space::Shared,
                        mem,
                        dst: vec![dst],
                        addr: rbase,
                        offset: lins[j] * nw as i64 * eb + w * eb,
                        pred: None,
                    });
                    acc = Some(match acc {
                        None => Operand::Reg(dst),
                        Some(a) => self.combine(r, ty, a, Operand::Reg(dst)),
                    });
                }
                *p = acc.expect("nw >= 1");
            }
            self.emit(Inst::Barrier);
        }
        Ok(TV {
            layout: out,
            ops: partial,
            ty,
            dtype: x.dtype,
        })
    }
}
