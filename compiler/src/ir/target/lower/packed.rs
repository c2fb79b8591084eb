//! bf16 vectors as packed 32-bit words: a thread's run of 2, 4 or 8
//! contiguous bf16 elements moves as 1, 2 or 4 `u32` words (one 4-, 8- or
//! 16-byte access; PTX has no vector of eight 16-bit elements), element `2w`
//! in the low half of word `w` and `2w + 1` in the high half (little-endian).
//!
//! A bf16 value is the high half of an f32, so unpacking is a shift (low
//! element) or a mask (high element) and a move, and packing — of values
//! already rounded to bf16, as every bf16 tile is — takes the high halves.

use super::Lower;
use crate::ir::target::{BinOp, Inst, MemTy, Operand, Reg, RegTy};

/// The number of 32-bit words a group of `elems` elements of `mem` moves as,
/// when it moves packed (bf16 runs of 2, 4 or 8).
pub(super) fn packed_words(mem: MemTy, elems: usize) -> Option<usize> {
    (mem == MemTy::BF16 && matches!(elems, 2 | 4 | 8)).then_some(elems / 2)
}

impl<'a> Lower<'a> {
    /// The f32 value of the low (`high` false) or high bf16 of a loaded word.
    pub(super) fn unpack_bf16(&mut self, word: Reg, high: bool) -> Operand {
        let w = Operand::Reg(word);
        let bits = if high {
            self.bin(BinOp::And, RegTy::U32, w, Operand::Int(0xffff_0000))
        } else {
            self.bin(BinOp::Shl, RegTy::U32, w, Operand::Int(16))
        };
        let f = self.new_reg(RegTy::F32);
        self.emit(Inst::Mov { dst: f, src: bits });
        self.unpacked.insert(f, (word, high));
        Operand::Reg(f)
    }

    /// The word holding bf16 values `lo` and `hi` (f32 registers or constants
    /// holding bf16 values).
    pub(super) fn pack_bf16(&mut self, lo: Operand, hi: Operand) -> Operand {
        // The two halves of one word, unpacked and packed again in order
        // (a tile read as words and stored as words): the word itself.
        let half = |l: &Self, x: Operand| {
            let f = x.reg()?;
            l.defined_once(f).then(|| l.unpacked.get(&f).copied())?
        };
        if let (Some((w, false)), Some((v, true))) = (half(self, lo), half(self, hi)) {
            if w == v && self.defined_once(w) {
                return Operand::Reg(w);
            }
        }
        if self.feat.cvt_bf16 {
            // Two values rounded by conversions: one conversion of the
            // values they rounded rounds and packs both (else the integer
            // packing below takes the high halves of the rounded values).
            let source = |l: &Self, x: Operand| {
                let f = x.reg()?;
                let src = *l.rounded_bf16.get(&f)?;
                (l.defined_once(f) && l.defined_once(src)).then_some(Operand::Reg(src))
            };
            if let (Some(lo), Some(hi)) = (source(self, lo), source(self, hi)) {
                let w = self.new_reg(RegTy::U32);
                self.emit(Inst::PackBf16 { dst: w, hi, lo });
                return Operand::Reg(w);
            }
        }
        let bits = |l: &mut Self, x: Operand| {
            let x = l.materialize(RegTy::F32, x);
            let u = l.new_reg(RegTy::U32);
            l.emit(Inst::Mov { dst: u, src: x });
            Operand::Reg(u)
        };
        let (lo, hi) = (bits(self, lo), bits(self, hi));
        let lo = self.bin(BinOp::Shr, RegTy::U32, lo, Operand::Int(16));
        let hi = self.bin(BinOp::And, RegTy::U32, hi, Operand::Int(0xffff_0000));
        let w = self.bin(BinOp::Or, RegTy::U32, lo, hi);
        self.materialize(RegTy::U32, w)
    }
}
