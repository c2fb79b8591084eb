//! Transcendentals on f64, which no GPU instruction computes: `exp`, `exp2`,
//! `log`, `log2`, `sigmoid`, `tanh` and `erf` from f64 multiplications, FMAs and
//! integer operations on the bits, to within a few ulps of the CPU
//! executor's (the f64 reference), infinities, NaN, signed zeros and
//! subnormals included.
//!
//! * `e^x`: `x = k ln 2 + r` with `k` the nearest integer to `x log2(e)` and
//!   `|r| <= ln(2) / 2` (`ln 2` in two parts, so that `k ln 2` is exact),
//!   `e^r` by its Taylor series to `r^13 / 13!` (the first term left out is
//!   under 2^-56 of the sum), times `2^k` built in the exponent bits as two
//!   factors (`2^(k/2) 2^(k - k/2)`, each a normal number), so that results
//!   past the largest f64 are infinite and those below the smallest normal
//!   are rounded once into the subnormals. `x` is clamped to +-1100 first
//!   (every result there is 0 or infinite already) and a NaN passes through.
//! * `2^x`: the same with `k` the nearest integer to `x` and `r = (x - k) ln 2`.
//! * `ln x`: `x = 2^e m` with `m` in `[sqrt(2)/2, sqrt(2))` (a subnormal `x`
//!   scaled by 2^54 first), `f = m - 1`, `s = f / (2 + f)`, and
//!   `ln(1 + f) = 2 atanh(s) = f - f^2/2 + s (f^2/2 + R(s^2))` with `R` the
//!   series of `2 atanh(s) / s - 2` to `s^22` (`|s| < 0.172`: the first term
//!   left out is under 2^-60 of the result); `e ln 2` added in two parts.
//!   `log2 x = e + ln(m) log2(e)`.
//! * `sigmoid(x) = 1 / (1 + e^-x)`, correctly rounded division.
//! * `tanh(x) = -t / (2 + t)` with `t = e^(-2|x|) - 1` (for small `|x|`
//!   from the series of `(e^r - 1) / r`, so that no cancellation loses the
//!   result's low bits), the sign of `x` put back.
//! * `erf(x)`: for `|x| < 2` its Taylor series, `2/sqrt(pi) sum (-1)^n
//!   x^(2n+1) / (n! (2n+1))` to `n = 35` (the first term left out is under
//!   2^-60 of the result; the alternating sum loses at most a few ulps to
//!   cancellation near 2); for `2 <= |x| < 6`, `1 - e^(-x^2) g(x)` with `g(x)
//!   = erfc(x) e^(x^2)` as a degree-24 Chebyshev series on `[2, 6]`
//!   ([`ERFC_SCALED`]); past 6, +-1 (erfc(6) is under half an ulp of 1).

use super::Lower;
use crate::ir::target::{BinOp, CmpOp, Inst, Operand, RegTy, UnOp};
use crate::ir::tile::UnaryOp;

const F: RegTy = RegTy::F64;
const LOG2E: f64 = std::f64::consts::LOG2_E;
/// `ln 2` in two parts: the high one with 32 significant bits, so that its
/// product with any `k` of the clamped range (11 bits) is exact.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
/// `ln 2 - LN2_HI` to the nearest f64 (1.9082149292705877e-10).
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// Past this, `e^x` and `2^x` are infinite or 0 already.
const CLAMP: f64 = 1100.0;
/// Chebyshev coefficients (first kind, `c0` first) of `erfc(x) e^(x^2)` on
/// `[2, 6]` in `t = x/2 - 2`: a least-squares fit at 4,000 Chebyshev nodes
/// of `math.erfc(x) * math.exp(x * x)` in Python's doubles (numpy's
/// `chebfit`), whose largest relative error against those values on 20,001
/// points is 4.7e-15 (the reference's own rounding); `1 - e^(-x^2) g(x)` is
/// within 1.2e-16 of `math.erf` there.
const ERFC_SCALED: [f64; 25] = [
    0.1545489325441142,
    -0.07674006034821483,
    0.018494874169702,
    -0.0043372335955141565,
    0.00099168390772379,
    -0.00022144890703086956,
    4.836760032123829e-05,
    -1.0346098326636566e-05,
    2.1698719431986726e-06,
    -4.466493754696016e-07,
    9.031674384576143e-08,
    -1.795533948427017e-08,
    3.5120800553049704e-09,
    -6.76353229221481e-10,
    1.2831846561907566e-10,
    -2.3997019302753587e-11,
    4.4259356702154225e-12,
    -8.054731012259971e-13,
    1.4470939832693677e-13,
    -2.5674368212883293e-14,
    4.490904283224316e-15,
    -7.944109290391272e-16,
    1.2412670766236366e-16,
    -3.4755478145461817e-17,
    -9.930136612989092e-18,
];

impl Lower<'_> {
    /// `u` of f64 `x`, or `None` where f64 has no lowering of it.
    pub(super) fn unary_f64(&mut self, u: UnaryOp, x: Operand) -> Option<Operand> {
        let x = self.materialize(F, x);
        Some(match u {
            UnaryOp::Exp => self.exp_f64(x, false),
            UnaryOp::Exp2 => self.exp_f64(x, true),
            UnaryOp::Log => self.log_f64(x, false),
            UnaryOp::Log2 => self.log_f64(x, true),
            UnaryOp::Sigmoid => {
                let nx = self.un(UnOp::Neg, F, x);
                let e = self.exp_f64(nx, false);
                let d = self.bin(BinOp::Add, F, e, Operand::Float(1.0));
                self.bin(BinOp::Div, F, Operand::Float(1.0), d)
            }
            UnaryOp::Tanh => {
                let a = self.un(UnOp::Abs, F, x);
                let y = self.bin(BinOp::Mul, F, a, Operand::Float(-2.0));
                let t = self.expm1_f64(y);
                let nt = self.un(UnOp::Neg, F, t);
                let d = self.bin(BinOp::Add, F, t, Operand::Float(2.0));
                let q = self.bin(BinOp::Div, F, nt, d);
                self.odd(x, q)
            }
            UnaryOp::Erf => self.erf_f64(x),
            _ => return None,
        })
    }

    /// `erf(x)` (module docs). Each range's series runs only where it is
    /// needed (a branch, not a select of both): ptxas interleaved the two
    /// series of a thread's elements into 72 registers where one takes 40.
    fn erf_f64(&mut self, x: Operand) -> Operand {
        let a = self.un(UnOp::Abs, F, x);
        let y = self.new_reg(F);
        self.emit(Inst::Mov {
            dst: y,
            src: Operand::Float(1.0),
        });
        // |x| < 2: the Taylor series.
        let small = self.cmp(CmpOp::Lt, F, a, Operand::Float(2.0));
        let small = self.pred_reg(Some(small)).expect("a predicate");
        self.when(small, |l| {
            let z = l.bin(BinOp::Mul, F, a, a);
            // (-1)^n / (n! (2n + 1)), n = 35 down to 0, rounded once.
            let c: Vec<f64> = (0..=35i32)
                .rev()
                .map(|n| {
                    let fact: f64 = (1..=n).map(f64::from).product();
                    let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
                    sign / (fact * f64::from(2 * n + 1))
                })
                .collect();
            let p = l.horner(z, &c);
            let ap = l.bin(BinOp::Mul, F, a, p);
            let v = l.bin(
                BinOp::Mul,
                F,
                ap,
                Operand::Float(std::f64::consts::FRAC_2_SQRT_PI),
            );
            l.emit(Inst::Mov { dst: y, src: v });
        });
        // 2 <= |x| < 6: 1 - e^(-x^2) g(x), g by Clenshaw's recurrence.
        let ge = self.cmp(CmpOp::Ge, F, a, Operand::Float(2.0));
        let lt = self.cmp(CmpOp::Lt, F, a, Operand::Float(6.0));
        let mid = self.bin(BinOp::And, RegTy::Pred, ge, lt);
        let mid = self.pred_reg(Some(mid)).expect("a predicate");
        self.when(mid, |l| {
            let t = l.fma(F, a, Operand::Float(0.5), Operand::Float(-2.0));
            let t2 = l.bin(BinOp::Mul, F, t, Operand::Float(2.0));
            let (mut b1, mut b2) = (Operand::Float(0.0), Operand::Float(0.0));
            for &ck in ERFC_SCALED[1..].iter().rev() {
                let d = l.bin(BinOp::Sub, F, Operand::Float(ck), b2);
                let b0 = l.fma(F, t2, b1, d);
                b2 = b1;
                b1 = b0;
            }
            let d = l.bin(BinOp::Sub, F, Operand::Float(ERFC_SCALED[0]), b2);
            let g = l.fma(F, t, b1, d);
            let z = l.bin(BinOp::Mul, F, a, a);
            let nz = l.un(UnOp::Neg, F, z);
            let e = l.exp_f64(nz, false);
            let erfc = l.bin(BinOp::Mul, F, e, g);
            let v = l.bin(BinOp::Sub, F, Operand::Float(1.0), erfc);
            l.emit(Inst::Mov { dst: y, src: v });
        });
        self.odd(x, Operand::Reg(y))
    }

    /// An odd function's value at `x` from its value `y` at `|x|`: `-y`
    /// where `x < 0`, `x` itself where it is +-0 (f(+-0) = +-0) or NaN.
    fn odd(&mut self, x: Operand, y: Operand) -> Operand {
        let neg = self.cmp(CmpOp::Lt, F, x, Operand::Float(0.0));
        let ny = self.un(UnOp::Neg, F, y);
        let y = self.select(F, neg, ny, y);
        let zero = self.cmp(CmpOp::Eq, F, x, Operand::Float(0.0));
        let y = self.select(F, zero, x, y);
        self.keep_nan(x, y)
    }

    /// A NaN `x` gives itself, else `y` (the clamps drop NaN).
    fn keep_nan(&mut self, x: Operand, y: Operand) -> Operand {
        let nan = self.cmp(CmpOp::Ne, F, x, x);
        self.select(F, nan, x, y)
    }

    /// For `x` clamped to `+-CLAMP`: `k`, the nearest integer to `x log2(e)`
    /// (`x` for `base2`), as an i32, and `r`, with `x = k ln 2 + r` (`x = k +
    /// r / ln 2` for `base2`).
    fn reduce_ln2(&mut self, x: Operand, base2: bool) -> (Operand, Operand) {
        let lo = self.bin(BinOp::Max, F, x, Operand::Float(-CLAMP));
        let xc = self.bin(BinOp::Min, F, lo, Operand::Float(CLAMP));
        let half = if base2 {
            self.bin(BinOp::Add, F, xc, Operand::Float(0.5))
        } else {
            self.fma(F, xc, Operand::Float(LOG2E), Operand::Float(0.5))
        };
        let kf = self.un(UnOp::Floor, F, half);
        let r = if base2 {
            let d = self.bin(BinOp::Sub, F, xc, kf);
            self.bin(BinOp::Mul, F, d, Operand::Float(std::f64::consts::LN_2))
        } else {
            let r = self.fma(F, kf, Operand::Float(-LN2_HI), xc);
            self.fma(F, kf, Operand::Float(-LN2_LO), r)
        };
        // k's two's complement in the low bits of kf + 1.5 * 2^52 (exact: |k|
        // is under 2^11): an integer move, where a float-to-integer
        // conversion saturates (a compare and branches in HIP).
        let t = self.bin(BinOp::Add, F, kf, Operand::Float(6_755_399_441_055_744.0));
        let bits = self.new_reg(RegTy::U64);
        self.emit(Inst::Mov { dst: bits, src: t });
        let k = self.cvt(RegTy::I32, Operand::Reg(bits), None);
        (k, r)
    }

    /// `2^k` for an i32 `k` in `[-1022, 1023]`, from its exponent bits.
    fn pow2(&mut self, k: Operand) -> Operand {
        let e = self.bin(BinOp::Add, RegTy::I32, k, Operand::Int(1023));
        let e = self.cvt(RegTy::U64, e, None);
        let bits = self.bin(BinOp::Shl, RegTy::U64, e, Operand::Int(52));
        let f = self.new_reg(F);
        self.emit(Inst::Mov { dst: f, src: bits });
        Operand::Reg(f)
    }

    /// `p 2^k` for `|k| <= 2044`: two normal factors, one rounding.
    fn scale(&mut self, p: Operand, k: Operand) -> Operand {
        let k1 = self.bin(BinOp::Shr, RegTy::I32, k, Operand::Int(1));
        let k2 = self.bin(BinOp::Sub, RegTy::I32, k, k1);
        let s1 = self.pow2(k1);
        let s2 = self.pow2(k2);
        let p = self.bin(BinOp::Mul, F, p, s1);
        self.bin(BinOp::Mul, F, p, s2)
    }

    /// `sum c[i] r^i`, highest first in `c`.
    fn horner(&mut self, r: Operand, c: &[f64]) -> Operand {
        let mut acc = Operand::Float(c[0]);
        for &ci in &c[1..] {
            acc = self.fma(F, acc, r, Operand::Float(ci));
        }
        acc
    }

    /// `1 / n!` for `n = hi` down to `lo`.
    fn inverse_factorials(lo: u32, hi: u32) -> Vec<f64> {
        (lo..=hi)
            .rev()
            .map(|n| 1.0 / (1..=n).map(f64::from).product::<f64>())
            .collect()
    }

    /// `e^x` (`2^x` for `base2`).
    fn exp_f64(&mut self, x: Operand, base2: bool) -> Operand {
        let (k, r) = self.reduce_ln2(x, base2);
        let p = self.horner(r, &Self::inverse_factorials(0, 13));
        let y = self.scale(p, k);
        self.keep_nan(x, y)
    }

    /// `e^y - 1` for `y <= 0` (tanh's), without cancellation near 0:
    /// `2^k (1 + q) - 1 = 2^k q + (2^k - 1)` with `q = e^r - 1 = r (1 + r/2! +
    /// ...)`; `2^k - 1` is exact for the `k` where it matters.
    fn expm1_f64(&mut self, y: Operand) -> Operand {
        let (k, r) = self.reduce_ln2(y, false);
        // (e^r - 1) / r = sum r^n / (n + 1)!, n = 0..=12.
        let c = Self::inverse_factorials(1, 13);
        let poly = self.horner(r, &c);
        let q = self.bin(BinOp::Mul, F, poly, r);
        let s = self.scale(Operand::Float(1.0), k);
        let sm1 = self.bin(BinOp::Sub, F, s, Operand::Float(1.0));
        self.fma(F, s, q, sm1)
    }

    /// `ln x` (`log2 x` for `base2`).
    fn log_f64(&mut self, x: Operand, base2: bool) -> Operand {
        let u = RegTy::U64;
        // Subnormals scaled into the normals first.
        let tiny = self.cmp(CmpOp::Lt, F, x, Operand::Float(f64::MIN_POSITIVE));
        let scaled = self.bin(BinOp::Mul, F, x, Operand::Float(2f64.powi(54)));
        let xs = self.select(F, tiny, scaled, x);
        let adj = self.select(RegTy::I32, tiny, Operand::Int(-54), Operand::Int(0));
        let bits = self.new_reg(u);
        self.emit(Inst::Mov { dst: bits, src: xs });
        let bits = Operand::Reg(bits);
        // e = biased exponent - 1023; m = the mantissa with exponent 0.
        let ebits = self.bin(BinOp::Shr, u, bits, Operand::Int(52));
        let ebits = self.bin(BinOp::And, u, ebits, Operand::Int(0x7ff));
        let e = self.cvt(RegTy::I32, ebits, None);
        let e = self.bin(BinOp::Sub, RegTy::I32, e, Operand::Int(1023));
        let e = self.bin(BinOp::Add, RegTy::I32, e, adj);
        let mbits = self.bin(BinOp::And, u, bits, Operand::Int(0x000f_ffff_ffff_ffff));
        let mbits = self.bin(BinOp::Or, u, mbits, Operand::Int(0x3ff0_0000_0000_0000));
        let m = self.new_reg(F);
        self.emit(Inst::Mov { dst: m, src: mbits });
        // m in [sqrt(2)/2, sqrt(2)).
        let big = self.cmp(
            CmpOp::Gt,
            F,
            Operand::Reg(m),
            Operand::Float(std::f64::consts::SQRT_2),
        );
        let mh = self.bin(BinOp::Mul, F, Operand::Reg(m), Operand::Float(0.5));
        let m = self.select(F, big, mh, Operand::Reg(m));
        let e1 = self.bin(BinOp::Add, RegTy::I32, e, Operand::Int(1));
        let e = self.select(RegTy::I32, big, e1, e);
        let dk = self.cvt(F, e, None);
        let f = self.bin(BinOp::Sub, F, m, Operand::Float(1.0));
        let d = self.bin(BinOp::Add, F, f, Operand::Float(2.0));
        let s = self.bin(BinOp::Div, F, f, d);
        let z = self.bin(BinOp::Mul, F, s, s);
        // R(z) = sum 2 z^n / (2n + 1), n = 1..=11: 2 atanh(s)/s - 2.
        let c: Vec<f64> = (1..=11u32)
            .rev()
            .map(|n| 2.0 / f64::from(2 * n + 1))
            .collect();
        let poly = self.horner(z, &c);
        let rr = self.bin(BinOp::Mul, F, poly, z);
        let hf = self.bin(BinOp::Mul, F, f, f);
        let hfsq = self.bin(BinOp::Mul, F, hf, Operand::Float(0.5));
        let t = self.bin(BinOp::Add, F, hfsq, rr);
        let st = self.bin(BinOp::Mul, F, s, t);
        // ln(m) = f - (hfsq - s (hfsq + R)).
        let inner = self.bin(BinOp::Sub, F, hfsq, st);
        let lm = self.bin(BinOp::Sub, F, f, inner);
        let y = if base2 {
            self.fma(F, lm, Operand::Float(LOG2E), dk)
        } else {
            let lo = self.fma(F, dk, Operand::Float(LN2_LO), lm);
            self.fma(F, dk, Operand::Float(LN2_HI), lo)
        };
        // ln 0 = -inf, ln of a negative number NaN, ln inf = inf.
        let zero = self.cmp(CmpOp::Eq, F, x, Operand::Float(0.0));
        let y = self.select(F, zero, Operand::Float(f64::NEG_INFINITY), y);
        let neg = self.cmp(CmpOp::Lt, F, x, Operand::Float(0.0));
        let y = self.select(F, neg, Operand::Float(f64::NAN), y);
        let inf = self.cmp(CmpOp::Eq, F, x, Operand::Float(f64::INFINITY));
        let y = self.select(F, inf, x, y);
        self.keep_nan(x, y)
    }
}
