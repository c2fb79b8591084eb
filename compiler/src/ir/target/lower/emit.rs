//! Scalar instruction helpers: one Target IR instruction per call (`bin`,
//! `un`, `cmp`, `select`, `cvt`, predicate conjunction), each returning the
//! operand that holds its result; and `when`, an `If` without an else around
//! what a closure emits (thread 0's copies, barrier set-up).
//!
//! `bin` folds the identities address arithmetic produces (adding 0,
//! multiplying by 1) and never emits an instruction for them, so callers may
//! build addresses from constants freely; every other helper emits exactly
//! what it is asked for.

use super::Lower;
use crate::ir::target::{BinOp, CmpOp, Inst, MemTy, Operand, Reg, RegTy, UnOp};

impl<'a> Lower<'a> {
    pub(super) fn bin(&mut self, op: BinOp, ty: RegTy, a: Operand, b: Operand) -> Operand {
        // Fold the identities the address arithmetic produces a lot of.
        match (op, a, b) {
            (BinOp::Add, x, Operand::Int(0)) | (BinOp::Add, Operand::Int(0), x) => return x,
            (BinOp::Mul, x, Operand::Int(1)) | (BinOp::Mul, Operand::Int(1), x) => return x,
            // Wrapping, as the instruction would: a tensor type's static dims
            // may multiply past 64 bits in the addresses of masked-off lanes.
            (BinOp::Add, Operand::Int(x), Operand::Int(y)) if !ty.is_float() => {
                return Operand::Int(x.wrapping_add(y))
            }
            (BinOp::Mul, Operand::Int(x), Operand::Int(y)) if !ty.is_float() => {
                return Operand::Int(x.wrapping_mul(y))
            }
            (BinOp::Xor | BinOp::Or | BinOp::Shl | BinOp::Shr, x, Operand::Int(0))
                if !ty.is_float() =>
            {
                return x
            }
            (BinOp::Xor | BinOp::Or, Operand::Int(0), x) if !ty.is_float() => return x,
            // Non-negative constants, where every integer type agrees.
            (op, Operand::Int(x), Operand::Int(y)) if !ty.is_float() && x >= 0 && y >= 0 => {
                let folded = match op {
                    BinOp::And => Some(x & y),
                    BinOp::Or => Some(x | y),
                    BinOp::Xor => Some(x ^ y),
                    BinOp::Shr if y < 63 => Some(x >> y),
                    BinOp::Shl if y < 31 && (x << y) <= i64::from(i32::MAX) => Some(x << y),
                    _ => None,
                };
                if let Some(v) = folded {
                    return Operand::Int(v);
                }
            }
            _ => {}
        }
        let (a, b) = if matches!(a, Operand::Reg(_)) || matches!(b, Operand::Reg(_)) {
            (a, b)
        } else {
            (self.materialize(ty, a), b)
        };
        let dst = self.new_reg(ty);
        self.emit(Inst::Binary { op, dst, a, b });
        Operand::Reg(dst)
    }

    pub(super) fn un(&mut self, op: UnOp, ty: RegTy, x: Operand) -> Operand {
        let dst = self.new_reg(ty);
        self.emit(Inst::Unary { op, dst, x });
        Operand::Reg(dst)
    }

    pub(super) fn materialize(&mut self, ty: RegTy, x: Operand) -> Operand {
        if let Operand::Reg(_) = x {
            return x;
        }
        let dst = self.new_reg(ty);
        self.emit(Inst::Mov { dst, src: x });
        Operand::Reg(dst)
    }

    pub(super) fn cmp(&mut self, op: CmpOp, ty: RegTy, a: Operand, b: Operand) -> Operand {
        let a = self.materialize(ty, a);
        let dst = self.new_reg(RegTy::Pred);
        self.emit(Inst::Cmp { op, ty, dst, a, b });
        Operand::Reg(dst)
    }

    pub(super) fn select(&mut self, ty: RegTy, cond: Operand, a: Operand, b: Operand) -> Operand {
        let cond = match cond {
            Operand::Reg(r) => r,
            Operand::Int(0) => return b,
            _ => return a,
        };
        if ty == RegTy::Pred {
            let a = self.materialize(ty, a);
            let b = self.materialize(ty, b);
            let t = self.bin(BinOp::And, ty, Operand::Reg(cond), a);
            let nc = self.un(UnOp::Not, ty, Operand::Reg(cond));
            let e = self.bin(BinOp::And, ty, nc, b);
            return self.bin(BinOp::Or, ty, t, e);
        }
        let dst = self.new_reg(ty);
        self.emit(Inst::Select { dst, cond, a, b });
        Operand::Reg(dst)
    }

    pub(super) fn cvt(&mut self, to: RegTy, src: Operand, narrow: Option<MemTy>) -> Operand {
        let from = self.reg_ty(src).unwrap_or(RegTy::I32);
        let src = match src {
            Operand::Reg(r) => r,
            other => match self.materialize(from, other) {
                Operand::Reg(r) => r,
                _ => unreachable!("materialize gives a register"),
            },
        };
        let dst = self.new_reg(to);
        self.emit(Inst::Cvt { dst, src, narrow });
        Operand::Reg(dst)
    }

    pub(super) fn and_preds(&mut self, preds: &[Operand]) -> Option<Operand> {
        let mut acc: Option<Operand> = None;
        for &p in preds {
            acc = Some(match acc {
                None => p,
                Some(a) => self.bin(BinOp::And, RegTy::Pred, a, p),
            });
        }
        acc
    }

    /// Emits what `then` emits under `cond` (an `If` without an else) and
    /// returns what `then` returned.
    pub(super) fn when<T>(&mut self, cond: Reg, then: impl FnOnce(&mut Self) -> T) -> T {
        self.blocks.push(Vec::new());
        let out = then(self);
        let then = self.blocks.pop().unwrap_or_default();
        self.emit(Inst::If {
            cond,
            then,
            otherwise: Vec::new(),
        });
        out
    }

    pub(super) fn pred_reg(&mut self, p: Option<Operand>) -> Option<Reg> {
        p.map(|p| match self.materialize(RegTy::Pred, p) {
            Operand::Reg(r) => r,
            _ => unreachable!(),
        })
    }
}
