//! Elementwise arithmetic per layout slot: unary and binary ops, casts,
//! broadcasts, and the rounding that keeps narrow dtypes bit-identical with
//! the CPU executor.
//!
//! Values narrower than f32 are computed in f32 (or i32) registers and
//! rounded back to their dtype after every op (`round_to_storage`), as the CPU
//! executor does; f8 is encoded and decoded with integer ops, on every arch.
//! Transcendentals on f32 are built on the `.approx` `ex2`/`lg2`
//! instructions scaled by `LOG2E` / `LN2`; on f64 from FMAs and the bits
//! (`f64_math.rs`).

use std::collections::HashMap;
use std::rc::Rc;

use super::{mem_ty, Lower, R, TV};
use crate::check::DType;
use crate::ir::target::layout::Layout;
use crate::ir::target::{BinOp, CmpOp, Inst, MemTy, Operand, Reg, RegTy, UnOp};
use crate::ir::tile::{BinaryOp, UnaryOp};

impl<'a> Lower<'a> {
    pub(super) fn unary(&mut self, u: UnaryOp, ty: RegTy, d: DType, x: Operand) -> R<Operand> {
        let f32 = ty == RegTy::F32;
        let float = ty.is_float();
        let unsigned = matches!(ty, RegTy::U32 | RegTy::U64);
        Ok(match u {
            // PTX has no unsigned neg/abs: -x wraps as 0 - x, |x| is x.
            UnaryOp::Neg if unsigned => self.bin(BinOp::Sub, ty, Operand::Int(0), x),
            UnaryOp::Abs if unsigned => x,
            UnaryOp::Neg => self.un(UnOp::Neg, ty, x),
            UnaryOp::Not | UnaryOp::Invert => {
                let x = self.materialize(ty, x);
                self.un(UnOp::Not, ty, x)
            }
            UnaryOp::Abs => self.un(UnOp::Abs, ty, x),
            UnaryOp::Sqrt if float => self.un(UnOp::Sqrt, ty, x),
            UnaryOp::Rsqrt if float => self.un(UnOp::RsqrtApprox, ty, x),
            _ if ty == RegTy::F64 => match self.unary_f64(u, x) {
                Some(y) => y,
                None => return self.unsupported(format!("`{}` on {}", unary_name(u), d.name())),
            },
            _ if !f32 => return self.unsupported(format!("`{}` on {}", unary_name(u), d.name())),
            // `exp` flushes results below 2^-126 to zero, as the CPU
            // executor's does; `exp2` keeps subnormals, as the CPU's does.
            UnaryOp::Exp => {
                let t = self.bin(BinOp::Mul, ty, x, Operand::Float(LOG2E));
                self.un(UnOp::Exp2ApproxFtz, ty, t)
            }
            UnaryOp::Exp2 => self.un(UnOp::Exp2Approx, ty, x),
            UnaryOp::Log => {
                let t = self.un(UnOp::Log2Approx, ty, x);
                self.bin(BinOp::Mul, ty, t, Operand::Float(LN2))
            }
            UnaryOp::Log2 => self.un(UnOp::Log2Approx, ty, x),
            UnaryOp::Sigmoid => {
                // A subnormal e cannot change 1 + e: flushed, it costs less.
                let t = self.bin(BinOp::Mul, ty, x, Operand::Float(-LOG2E));
                let e = self.un(UnOp::Exp2ApproxFtz, ty, t);
                let d = self.bin(BinOp::Add, ty, e, Operand::Float(1.0));
                self.un(UnOp::Rcp, ty, d)
            }
            UnaryOp::Tanh if self.feat.fast_tanh => self.un(UnOp::TanhApprox, ty, x),
            UnaryOp::Tanh => {
                // tanh(x) = sign(x) (1 - t) / (1 + t), t = e^(-2|x|).
                let a = self.un(UnOp::Abs, ty, x);
                let s = self.bin(BinOp::Mul, ty, a, Operand::Float(-2.0 * LOG2E));
                let t = self.un(UnOp::Exp2ApproxFtz, ty, s);
                let n = self.bin(BinOp::Sub, ty, Operand::Float(1.0), t);
                let dd = self.bin(BinOp::Add, ty, t, Operand::Float(1.0));
                let q = self.bin(BinOp::Div, ty, n, dd);
                self.copysign(q, x)
            }
            UnaryOp::Erf => {
                // Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7).
                let a = self.un(UnOp::Abs, ty, x);
                let p = self.fma(ty, a, Operand::Float(0.327_591_1), Operand::Float(1.0));
                let t = self.un(UnOp::Rcp, ty, p);
                let mut poly = Operand::Float(1.061_405_429);
                for c in [-1.453_152_027, 1.421_413_741, -0.284_496_736, 0.254_829_592] {
                    poly = self.fma(ty, poly, t, Operand::Float(c));
                }
                let poly = self.bin(BinOp::Mul, ty, poly, t);
                let a2 = self.bin(BinOp::Mul, ty, a, a);
                let s = self.bin(BinOp::Mul, ty, a2, Operand::Float(-LOG2E));
                let e = self.un(UnOp::Exp2ApproxFtz, ty, s);
                let np = self.un(UnOp::Neg, ty, poly);
                let y = self.fma(ty, np, e, Operand::Float(1.0));
                self.copysign(y, x)
            }
            UnaryOp::Sqrt | UnaryOp::Rsqrt => unreachable!("handled above"),
        })
    }

    /// `exp(a - b)` of an f32 tile whose `b` is broadcast (at most one
    /// distinct register for every two slots, as a row statistic is over its
    /// row's slots): `2^(a log2(e) - b log2(e))`, one FMA a slot and one
    /// multiplication a distinct `b`, where `2^((a - b) log2(e))` takes a
    /// subtraction and a multiplication a slot (the subtraction is left dead
    /// unless something else reads it). Online softmax's `exp(s - m[:, None])`
    /// is the case, as FlashAttention computes it. The rounding error of the
    /// exponent is then relative to |b| instead of |a - b| (both within the
    /// `.approx` instruction's own error for |b| up to ~100); infinities give
    /// what the unfused form gives (-inf scores 0, a -inf `b` NaN or inf).
    pub(super) fn exp_of_differences(&mut self, x: &TV) -> Option<Vec<Operand>> {
        if x.dtype != DType::F32 || x.ty != RegTy::F32 || x.ops.len() < 2 {
            return None;
        }
        // Each distinct `b` by first appearance, and its index for each slot
        // (a map: a slot count is bounded only by the kernel-size limit).
        let mut distinct: Vec<Reg> = Vec::new();
        let mut index: HashMap<Reg, usize> = HashMap::new();
        let mut pairs = Vec::with_capacity(x.ops.len());
        for o in &x.ops {
            let (a, b) = *self.differences.get(&o.reg()?)?;
            let b = b.reg()?;
            let i = *index.entry(b).or_insert_with(|| {
                distinct.push(b);
                distinct.len() - 1
            });
            if 2 * distinct.len() > x.ops.len() {
                return None;
            }
            pairs.push((a, i));
        }
        let scaled: Vec<Operand> = distinct
            .iter()
            .map(|&b| {
                self.bin(
                    BinOp::Mul,
                    RegTy::F32,
                    Operand::Reg(b),
                    Operand::Float(-LOG2E),
                )
            })
            .collect();
        let ops = pairs
            .into_iter()
            .map(|(a, i)| {
                let t = self.fma(RegTy::F32, a, Operand::Float(LOG2E), scaled[i]);
                self.un(UnOp::Exp2ApproxFtz, RegTy::F32, t)
            })
            .collect();
        Some(ops)
    }

    pub(super) fn fma(&mut self, ty: RegTy, a: Operand, b: Operand, c: Operand) -> Operand {
        let a = self.materialize(ty, a);
        let dst = self.new_reg(ty);
        self.emit(Inst::Fma { dst, a, b, c });
        Operand::Reg(dst)
    }

    /// `x ** n` for a small integer constant `n`: square and multiply.
    fn pow_const(&mut self, ty: RegTy, x: Operand, n: u32) -> Operand {
        let one = if ty.is_float() {
            Operand::Float(1.0)
        } else {
            Operand::Int(1)
        };
        let (mut acc, mut base, mut k) = (None, x, n);
        while k > 0 {
            if k & 1 == 1 {
                acc = Some(match acc {
                    None => base,
                    Some(a) => self.bin(BinOp::Mul, ty, a, base),
                });
            }
            k >>= 1;
            if k > 0 {
                base = self.bin(BinOp::Mul, ty, base, base);
            }
        }
        acc.unwrap_or(one)
    }

    /// `x ** y` on f32 as the CPU's `powf` computes it: an integer constant
    /// exponent multiplies; otherwise `2^(y log2 |x|)` with the sign of a
    /// negative base raised to an odd integer, NaN for a negative base and a
    /// non-integer exponent, and `x ** 0 = 1`.
    fn pow_f32(&mut self, x: Operand, y: Operand) -> Operand {
        let f = RegTy::F32;
        if let Operand::Float(c) = y {
            if c == c.trunc() && c.abs() <= 64.0 {
                let r = self.pow_const(f, x, c.abs() as u32);
                return if c < 0.0 {
                    self.bin(BinOp::Div, f, Operand::Float(1.0), r)
                } else {
                    r
                };
            }
        }
        let ax = self.un(UnOp::Abs, f, x);
        let l = self.un(UnOp::Log2Approx, f, ax);
        let m = self.bin(BinOp::Mul, f, l, y);
        let r = self.un(UnOp::Exp2Approx, f, m);
        let fy = self.un(UnOp::Floor, f, y);
        let int = self.cmp(CmpOp::Eq, f, fy, y);
        let half = self.bin(BinOp::Mul, f, y, Operand::Float(0.5));
        let fh = self.un(UnOp::Floor, f, half);
        let odd_half = self.cmp(CmpOp::Ne, f, fh, half);
        let odd = self.bin(BinOp::And, RegTy::Pred, int, odd_half);
        let nr = self.un(UnOp::Neg, f, r);
        let signed = self.select(f, odd, nr, r);
        let neg_base = self.select(f, int, signed, Operand::Float(f64::NAN));
        let neg = self.cmp(CmpOp::Lt, f, x, Operand::Float(0.0));
        let res = self.select(f, neg, neg_base, r);
        let y0 = self.cmp(CmpOp::Eq, f, y, Operand::Float(0.0));
        self.select(f, y0, Operand::Float(1.0), res)
    }

    /// `x ** y` on integers as the CPU computes it: wrapping square and
    /// multiply over the exponent's bits; a negative exponent gives `1 / x`
    /// truncated (1 for 1, +-1 for -1, else 0).
    fn pow_int(&mut self, ty: RegTy, x: Operand, y: Operand) -> Operand {
        if let Operand::Int(c) = y {
            if (0..=64).contains(&c) {
                return self.pow_const(ty, x, c as u32);
            }
        }
        let bits = if ty.words() == 2 { 63 } else { 31 };
        let (mut acc, mut base) = (Operand::Int(1), x);
        for i in 0..bits {
            let bit = self.bin(BinOp::And, ty, y, Operand::Int(1i64 << i));
            let on = self.cmp(CmpOp::Ne, ty, bit, Operand::Int(0));
            let prod = self.bin(BinOp::Mul, ty, acc, base);
            acc = self.select(ty, on, prod, acc);
            if i + 1 < bits {
                base = self.bin(BinOp::Mul, ty, base, base);
            }
        }
        if !matches!(ty, RegTy::I32 | RegTy::I64) {
            return acc;
        }
        // Negative exponents: 1 / x truncated.
        let odd = self.bin(BinOp::And, ty, y, Operand::Int(1));
        let is_odd = self.cmp(CmpOp::Ne, ty, odd, Operand::Int(0));
        let minus = self.select(ty, is_odd, Operand::Int(-1), Operand::Int(1));
        let is_one = self.cmp(CmpOp::Eq, ty, x, Operand::Int(1));
        let is_minus = self.cmp(CmpOp::Eq, ty, x, Operand::Int(-1));
        let m = self.select(ty, is_minus, minus, Operand::Int(0));
        let inv = self.select(ty, is_one, Operand::Int(1), m);
        let neg = self.cmp(CmpOp::Lt, ty, y, Operand::Int(0));
        self.select(ty, neg, inv, acc)
    }

    /// `|y|` with the sign of `x` (y >= 0).
    fn copysign(&mut self, y: Operand, x: Operand) -> Operand {
        let neg = self.cmp(CmpOp::Lt, RegTy::F32, x, Operand::Float(0.0));
        let ny = self.un(UnOp::Neg, RegTy::F32, y);
        self.select(RegTy::F32, neg, ny, y)
    }

    pub(super) fn binary(
        &mut self,
        b: BinaryOp,
        ty: RegTy,
        d: DType,
        x: Operand,
        y: Operand,
    ) -> R<Operand> {
        let float = ty.is_float();
        let signed = matches!(ty, RegTy::I32 | RegTy::I64);
        let cmp = |b| match b {
            BinaryOp::Eq => CmpOp::Eq,
            BinaryOp::Ne => CmpOp::Ne,
            BinaryOp::Lt => CmpOp::Lt,
            BinaryOp::Le => CmpOp::Le,
            BinaryOp::Gt => CmpOp::Gt,
            _ => CmpOp::Ge,
        };
        let pred = ty == RegTy::Pred;
        Ok(match b {
            // Bools order False < True: max is or, min is and.
            BinaryOp::Max if pred => self.bin(BinOp::Or, ty, x, y),
            BinaryOp::Min if pred => self.bin(BinOp::And, ty, x, y),
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge if pred => {
                let (x, y) = if matches!(b, BinaryOp::Gt | BinaryOp::Ge) {
                    (y, x)
                } else {
                    (x, y)
                };
                let x = self.materialize(ty, x);
                let nx = self.un(UnOp::Not, ty, x);
                // x < y: !x & y;  x <= y: !x | y.
                let op = if matches!(b, BinaryOp::Lt | BinaryOp::Gt) {
                    BinOp::And
                } else {
                    BinOp::Or
                };
                self.bin(op, ty, nx, y)
            }
            BinaryOp::Add => self.bin(BinOp::Add, ty, x, y),
            BinaryOp::Sub => self.bin(BinOp::Sub, ty, x, y),
            BinaryOp::Mul => self.bin(BinOp::Mul, ty, x, y),
            BinaryOp::Max => self.bin(BinOp::Max, ty, x, y),
            BinaryOp::Min => self.bin(BinOp::Min, ty, x, y),
            BinaryOp::And => self.bin(BinOp::And, ty, x, y),
            BinaryOp::Or => self.bin(BinOp::Or, ty, x, y),
            BinaryOp::Xor => self.bin(BinOp::Xor, ty, x, y),
            BinaryOp::Div if float => self.bin(BinOp::Div, ty, x, y),
            BinaryOp::Div => self.bin(BinOp::Div, ty, x, y),
            BinaryOp::FloorDiv if float => {
                let q = self.bin(BinOp::Div, ty, x, y);
                self.un(UnOp::Floor, ty, q)
            }
            BinaryOp::Mod if float => {
                let q = self.bin(BinOp::Div, ty, x, y);
                let f = self.un(UnOp::Floor, ty, q);
                let m = self.bin(BinOp::Mul, ty, f, y);
                self.bin(BinOp::Sub, ty, x, m)
            }
            BinaryOp::FloorDiv | BinaryOp::Mod if !signed => {
                let op = if b == BinaryOp::Mod {
                    BinOp::Rem
                } else {
                    BinOp::Div
                };
                self.bin(op, ty, x, y)
            }
            BinaryOp::FloorDiv | BinaryOp::Mod => {
                // Python semantics: round the quotient toward -inf; the remainder
                // takes the divisor's sign.
                let r = self.bin(BinOp::Rem, ty, x, y);
                let sx = self.bin(BinOp::Xor, ty, r, y);
                let p1 = self.cmp(CmpOp::Ne, ty, r, Operand::Int(0));
                let p2 = self.cmp(CmpOp::Lt, ty, sx, Operand::Int(0));
                let fix = self.bin(BinOp::And, RegTy::Pred, p1, p2);
                if b == BinaryOp::Mod {
                    let ry = self.bin(BinOp::Add, ty, r, y);
                    self.select(ty, fix, ry, r)
                } else {
                    let q = self.bin(BinOp::Div, ty, x, y);
                    let q1 = self.bin(BinOp::Sub, ty, q, Operand::Int(1));
                    self.select(ty, fix, q1, q)
                }
            }
            BinaryOp::Pow if ty == RegTy::F32 => self.pow_f32(x, y),
            BinaryOp::Pow if !float => self.pow_int(ty, x, y),
            BinaryOp::Pow => return self.unsupported(format!("`**` on {}", d.name())),
            _ if ty == RegTy::Pred => {
                // Eq / Ne on bools.
                let x = self.materialize(ty, x);
                let ne = self.bin(BinOp::Xor, ty, x, y);
                if b == BinaryOp::Ne {
                    ne
                } else if b == BinaryOp::Eq {
                    self.un(UnOp::Not, ty, ne)
                } else {
                    return self.unsupported("ordering comparisons of bools");
                }
            }
            _ => self.cmp(cmp(b), ty, x, y),
        })
    }

    pub(super) fn cast(
        &mut self,
        x: Operand,
        fty: RegTy,
        from: DType,
        tty: RegTy,
        to: DType,
    ) -> R<Operand> {
        if from == to {
            return Ok(x);
        }
        if to == DType::Bool {
            let zero = if fty.is_float() {
                Operand::Float(0.0)
            } else {
                Operand::Int(0)
            };
            return Ok(self.cmp(CmpOp::Ne, fty, x, zero));
        }
        if from == DType::Bool {
            let (one, zero) = if tty.is_float() {
                (Operand::Float(1.0), Operand::Float(0.0))
            } else {
                (Operand::Int(1), Operand::Int(0))
            };
            return Ok(self.select(tty, x, one, zero));
        }
        let x = self.materialize(fty, x);
        let mut v = if fty == tty {
            x
        } else {
            self.cvt(tty, x, None)
        };
        // `cvt.rzi` saturates at the 32-bit range (NaN to 0); a narrower
        // integer saturates at its own range too, as on the CPU, rather than
        // wrapping when the 32 bits are truncated.
        if fty.is_float() {
            let range = match to {
                DType::I8 => Some((i8::MIN as i64, i8::MAX as i64)),
                DType::I16 => Some((i16::MIN as i64, i16::MAX as i64)),
                DType::U8 => Some((0, u8::MAX as i64)),
                _ => None,
            };
            if let Some((lo, hi)) = range {
                v = self.bin(BinOp::Min, tty, v, Operand::Int(hi));
                v = self.bin(BinOp::Max, tty, v, Operand::Int(lo));
            }
        }
        Ok(self.round_to_storage(v, to))
    }

    /// A computed value rounded (or wrapped) to `d` where `d` is narrower
    /// than its compute type (f16, bf16, f8, i8, i16, u8), as the CPU
    /// executor rounds every result: a chain of bf16 operations then gives
    /// the same bits on both, and a bf16 store (which keeps the high half)
    /// stores a rounded value.
    pub(super) fn round_to_storage(&mut self, v: Operand, to: DType) -> Operand {
        match to {
            DType::F16 => {
                let h = self.cvt(RegTy::B16, v, None);
                self.cvt(RegTy::F32, h, None)
            }
            DType::BF16 => self.round_bf16(v),
            DType::I8 => self.cvt(RegTy::I32, v, Some(MemTy::I8)),
            DType::I16 => self.cvt(RegTy::I32, v, Some(MemTy::I16)),
            DType::U8 => self.cvt(RegTy::U32, v, Some(MemTy::U8)),
            DType::F8E4M3 | DType::F8E5M2 => {
                let m = mem_ty(to).expect("f8");
                let c = self.encode_f8(v, m);
                self.decode_f8(c, m)
            }
            _ => v,
        }
    }

    /// (exponent bits, mantissa bits, bias) of an 8-bit float.
    fn f8_format(mem: MemTy) -> (u32, u32, i64) {
        match mem {
            MemTy::F8E4M3 => (4, 3, 7),
            _ => (5, 2, 15),
        }
    }

    /// The f32 value of an 8-bit float code (in a U32 register): sign,
    /// normals by moving exponent and mantissa into place, subnormals by a
    /// multiply; e4m3's 0x7f is NaN (no infinities), e5m2's 0x7c inf, above NaN.
    pub(super) fn decode_f8(&mut self, raw: Operand, mem: MemTy) -> Operand {
        let (_, mb, bias) = Self::f8_format(mem);
        let u = RegTy::U32;
        let c = self.bin(BinOp::And, u, raw, Operand::Int(0x7f));
        let normal = self.bin(BinOp::Shl, u, c, Operand::Int(23 - mb as i64));
        let normal = self.bin(BinOp::Add, u, normal, Operand::Int((127 - bias) << 23));
        let special = if mem == MemTy::F8E4M3 {
            let nan = self.cmp(CmpOp::Eq, u, c, Operand::Int(0x7f));
            self.select(u, nan, Operand::Int(0x7fc0_0000), normal)
        } else {
            let big = self.cmp(CmpOp::Ge, u, c, Operand::Int(0x7c));
            let m = self.bin(BinOp::And, u, c, Operand::Int(3));
            let m = self.bin(BinOp::Shl, u, m, Operand::Int(21));
            let infnan = self.bin(BinOp::Or, u, m, Operand::Int(0x7f80_0000));
            self.select(u, big, infnan, normal)
        };
        let fbits = self.new_reg(RegTy::F32);
        self.emit(Inst::Mov {
            dst: fbits,
            src: special,
        });
        let cf = self.cvt(RegTy::F32, c, None);
        let sub = self.bin(
            BinOp::Mul,
            RegTy::F32,
            cf,
            Operand::Float(2f64.powi(1 - bias as i32 - mb as i32)),
        );
        let is_sub = self.cmp(CmpOp::Lt, u, c, Operand::Int(1 << mb));
        let mag = self.select(RegTy::F32, is_sub, sub, Operand::Reg(fbits));
        let s = self.bin(BinOp::And, u, raw, Operand::Int(0x80));
        let neg = self.cmp(CmpOp::Ne, u, s, Operand::Int(0));
        let nmag = self.un(UnOp::Neg, RegTy::F32, mag);
        self.select(RegTy::F32, neg, nmag, mag)
    }

    /// The 8-bit float code (U32) nearest to an f32 (ties to even, one
    /// rounding from f32): e4m3 saturates to ±448 (as `cvt.satfinite`), e5m2
    /// overflows to infinity; NaN gives 0x7f.
    pub(super) fn encode_f8(&mut self, x: Operand, mem: MemTy) -> Operand {
        let (_, mb, bias) = Self::f8_format(mem);
        let u = RegTy::U32;
        let x = self.materialize(RegTy::F32, x);
        let bits = self.new_reg(u);
        self.emit(Inst::Mov { dst: bits, src: x });
        let bits = Operand::Reg(bits);
        let a = self.bin(BinOp::And, u, bits, Operand::Int(0x7fff_ffff));
        let sbit = self.bin(BinOp::Shr, u, bits, Operand::Int(24));
        let sbit = self.bin(BinOp::And, u, sbit, Operand::Int(0x80));
        // Normals: round the f32 mantissa to `mb` bits, rebias the exponent.
        let drop = 23 - mb as i64;
        let lsb = self.bin(BinOp::Shr, u, a, Operand::Int(drop));
        let lsb = self.bin(BinOp::And, u, lsb, Operand::Int(1));
        let r = self.bin(BinOp::Add, u, a, Operand::Int((1 << (drop - 1)) - 1));
        let r = self.bin(BinOp::Add, u, r, lsb);
        let r = self.bin(BinOp::Shr, u, r, Operand::Int(drop));
        let normal = self.bin(BinOp::Sub, u, r, Operand::Int((127 - bias) << mb));
        // Subnormals: |x| / 2^(1 - bias - mb) rounded to an integer (ties to
        // even, by adding 2^23).
        let af = self.new_reg(RegTy::F32);
        self.emit(Inst::Mov { dst: af, src: a });
        let scaled = self.bin(
            BinOp::Mul,
            RegTy::F32,
            Operand::Reg(af),
            Operand::Float(2f64.powi(bias as i32 - 1 + mb as i32)),
        );
        let magic = self.bin(BinOp::Add, RegTy::F32, scaled, Operand::Float(8_388_608.0));
        let mbits = self.new_reg(u);
        self.emit(Inst::Mov {
            dst: mbits,
            src: magic,
        });
        let sub = self.bin(
            BinOp::Sub,
            u,
            Operand::Reg(mbits),
            Operand::Int(0x4b00_0000),
        );
        let is_sub = self.cmp(CmpOp::Lt, u, a, Operand::Int((128 - bias) << 23));
        let code = self.select(u, is_sub, sub, normal);
        let max = if mem == MemTy::F8E4M3 { 0x7e } else { 0x7c };
        let code = self.bin(BinOp::Min, u, code, Operand::Int(max));
        let nan = self.cmp(CmpOp::Gt, u, a, Operand::Int(0x7f80_0000));
        let code = self.select(u, nan, Operand::Int(0x7f), code);
        self.bin(BinOp::Or, u, code, sbit)
    }

    /// An f32 rounded to tf32 (10 mantissa bits, nearest, ties away from
    /// zero), bit for bit as `cvt.rna.tf32.f32` and the CPU executor's
    /// `tf32()`: add half an ulp of tf32 to the bits and clear the low 13;
    /// infinities and NaN pass unchanged. Integer ops, so any arch has it.
    pub(super) fn round_tf32(&mut self, v: Operand) -> Operand {
        let v = self.materialize(RegTy::F32, v);
        let u = self.new_reg(RegTy::U32);
        self.emit(Inst::Mov { dst: u, src: v });
        let u = Operand::Reg(u);
        let a = self.bin(BinOp::Add, RegTy::U32, u, Operand::Int(0x1000));
        let r = self.bin(BinOp::And, RegTy::U32, a, Operand::Int(0xffff_e000));
        let e = self.bin(BinOp::And, RegTy::U32, u, Operand::Int(0x7f80_0000));
        let special = self.cmp(CmpOp::Eq, RegTy::U32, e, Operand::Int(0x7f80_0000));
        let bits = self.select(RegTy::U32, special, u, r);
        let f = self.new_reg(RegTy::F32);
        self.emit(Inst::Mov { dst: f, src: bits });
        Operand::Reg(f)
    }

    /// Rounds an f32 register to the nearest bf16 value (ties to even; a NaN
    /// stays a NaN, its payload not kept), keeping it in f32: one conversion
    /// where the arch has it, else integer arithmetic on the bits.
    fn round_bf16(&mut self, v: Operand) -> Operand {
        let bits = if self.feat.cvt_bf16 {
            let v = self.materialize(RegTy::F32, v);
            let u = self.new_reg(RegTy::U32);
            self.emit(Inst::PackBf16 {
                dst: u,
                hi: v,
                lo: Operand::Float(0.0),
            });
            Operand::Reg(u)
        } else {
            let u = self.new_reg(RegTy::U32);
            self.emit(Inst::Mov { dst: u, src: v });
            let u = Operand::Reg(u);
            let lsb = self.bin(BinOp::Shr, RegTy::U32, u, Operand::Int(16));
            let lsb = self.bin(BinOp::And, RegTy::U32, lsb, Operand::Int(1));
            let a = self.bin(BinOp::Add, RegTy::U32, u, Operand::Int(0x7fff));
            let a = self.bin(BinOp::Add, RegTy::U32, a, lsb);
            let m = self.bin(BinOp::And, RegTy::U32, a, Operand::Int(0xffff_0000));
            // A NaN whose payload is all in the low half would round to an
            // infinity: it keeps its high half, made a quiet NaN.
            let mag = self.bin(BinOp::And, RegTy::U32, u, Operand::Int(0x7fff_ffff));
            let nan = self.cmp(CmpOp::Gt, RegTy::U32, mag, Operand::Int(0x7f80_0000));
            let quiet = self.bin(BinOp::Or, RegTy::U32, u, Operand::Int(0x0040_0000));
            let quiet = self.bin(BinOp::And, RegTy::U32, quiet, Operand::Int(0xffff_0000));
            self.select(RegTy::U32, nan, quiet, m)
        };
        let f = self.new_reg(RegTy::F32);
        self.emit(Inst::Mov { dst: f, src: bits });
        if let (true, Some(x)) = (self.feat.cvt_bf16, v.reg()) {
            self.rounded_bf16.insert(f, x);
        }
        Operand::Reg(f)
    }

    pub(super) fn broadcast(&mut self, x: &TV, to: &Rc<Layout>) -> R<TV> {
        if let Some(map) = x.layout.register_map_to(to) {
            return Ok(TV {
                layout: to.clone(),
                ops: map.iter().map(|&i| x.ops[i]).collect(),
                ty: x.ty,
                dtype: x.dtype,
            });
        }
        let Some((c, map)) = broadcast_source_layout(&x.layout, to) else {
            return self.unsupported("this broadcast");
        };
        let xc = self.convert(x, &c)?;
        Ok(TV {
            layout: to.clone(),
            ops: map.iter().map(|&i| xc.ops[i]).collect(),
            ty: x.ty,
            dtype: x.dtype,
        })
    }
}

/// The layout a tile of layout `x` is converted to before it is broadcast
/// into `to` by registers alone (`to` with the axes `x` has of size 1
/// collapsed), and the register map from it onto `to`; `None` where the
/// ranks differ or that layout does not map onto `to`.
pub(super) fn broadcast_source_layout(x: &Layout, to: &Layout) -> Option<(Rc<Layout>, Vec<usize>)> {
    if x.rank() != to.rank() {
        return None;
    }
    let collapse: Vec<usize> = (0..to.rank())
        .filter(|&d| x.shape[d] == 1 && to.shape[d] != 1)
        .collect();
    let c = to.collapsed(&collapse);
    let map = c.register_map_to(to)?;
    Some((Rc::new(c), map))
}

const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;

fn unary_name(u: UnaryOp) -> &'static str {
    match u {
        UnaryOp::Neg => "-",
        UnaryOp::Not => "not",
        UnaryOp::Invert => "~",
        UnaryOp::Exp => "exp",
        UnaryOp::Exp2 => "exp2",
        UnaryOp::Log => "log",
        UnaryOp::Log2 => "log2",
        UnaryOp::Sqrt => "sqrt",
        UnaryOp::Rsqrt => "rsqrt",
        UnaryOp::Abs => "abs",
        UnaryOp::Sigmoid => "sigmoid",
        UnaryOp::Tanh => "tanh",
        UnaryOp::Erf => "erf",
    }
}
