//! Elementwise, reduction, broadcast and dot arithmetic on tile buffers, with
//! the rounding and wrapping of each dtype.

use super::*;

pub(crate) fn erf64(x: f64) -> f64 {
    // Abramowitz-Stegun 7.1.26 is too coarse; W. J. Cody's rational
    // approximations via libm-quality erfc is not in std, so a series for
    // small |x| and a continued-fraction tail (accurate to ~1e-15 / 1e-12).
    if x.abs() < 2.5 {
        let mut sum = x;
        let mut term = x;
        for n in 1..80 {
            term *= -x * x / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(x) = exp(-x^2)/(x sqrt(pi)) * 1/(1+ 1/(2x^2)/(1+2/(2x^2)/(1+...))) (Lentz).
        let a = x.abs();
        let mut f = 0.0;
        for n in (1..60).rev() {
            f = (n as f64 / 2.0) / (a + f);
        }
        let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f);
        if x > 0.0 {
            1.0 - erfc
        } else {
            erfc - 1.0
        }
    }
}

/// Calls `$name` in the variant compiled for the widest vector unit the
/// machine has (AVX-512 or AVX2, detected at run time; the build targets
/// baseline x86-64, SSE2). No fast-math: results are bit-identical on every
/// path.
macro_rules! widest {
    ($avx512:ident, $avx2:ident, $base:ident, $($a:expr),*) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the feature was detected.
                return unsafe { $avx512($($a),*) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the feature was detected.
                return unsafe { $avx2($($a),*) };
            }
        }
        $base($($a),*)
    }};
}

/// The element loops, inlined into each variant (a plain loop, not `collect`,
/// which would be an out-of-line call compiled for the baseline).
#[inline(always)]
pub(super) fn map1_loop<X: Copy, Y>(p: &[X], f: &impl Fn(X) -> Y) -> Vec<Y> {
    let mut out = Vec::with_capacity(p.len());
    for (o, a) in out.spare_capacity_mut().iter_mut().zip(p) {
        o.write(f(*a));
    }
    // SAFETY: every element up to `p.len()` was written.
    unsafe { out.set_len(p.len()) };
    out
}

#[inline(always)]
pub(super) fn zip_map_loop<X: Copy, Y>(p: &[X], q: &[X], f: &impl Fn(X, X) -> Y) -> Vec<Y> {
    let n = p.len().min(q.len());
    let mut out = Vec::with_capacity(n);
    for ((o, a), b) in out.spare_capacity_mut().iter_mut().zip(p).zip(q) {
        o.write(f(*a, *b));
    }
    // SAFETY: every element up to `n` was written.
    unsafe { out.set_len(n) };
    out
}

/// # Safety
/// The CPU must have the feature (only safe code runs inside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn map1_avx512<X: Copy, Y>(p: &[X], f: &impl Fn(X) -> Y) -> Vec<Y> {
    map1_loop(p, f)
}

/// # Safety
/// The CPU must have the feature (only safe code runs inside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn map1_avx2<X: Copy, Y>(p: &[X], f: &impl Fn(X) -> Y) -> Vec<Y> {
    map1_loop(p, f)
}

/// # Safety
/// The CPU must have the feature (only safe code runs inside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn zip_map_avx512<X: Copy, Y>(
    p: &[X],
    q: &[X],
    f: &impl Fn(X, X) -> Y,
) -> Vec<Y> {
    zip_map_loop(p, q, f)
}

/// # Safety
/// The CPU must have the feature (only safe code runs inside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn zip_map_avx2<X: Copy, Y>(p: &[X], q: &[X], f: &impl Fn(X, X) -> Y) -> Vec<Y> {
    zip_map_loop(p, q, f)
}

pub(super) fn map1<X: Copy, Y>(p: &[X], f: impl Fn(X) -> Y) -> Vec<Y> {
    widest!(map1_avx512, map1_avx2, map1_loop, p, &f)
}

pub(super) fn zip_map<X: Copy, Y>(p: &[X], q: &[X], f: impl Fn(X, X) -> Y) -> Vec<Y> {
    widest!(zip_map_avx512, zip_map_avx2, zip_map_loop, p, q, &f)
}

/// Float unary ops; each arm is its own monomorphic loop (vectorisable, no
/// call per element).
macro_rules! float_unary {
    ($u:expr, $v:expr, $t:ty) => {{
        let v = $v;
        match $u {
            UnaryOp::Neg => map1(v, |x: $t| -x),
            UnaryOp::Exp => map1(v, |x: $t| x.exp()),
            UnaryOp::Exp2 => map1(v, |x: $t| x.exp2()),
            UnaryOp::Log => map1(v, |x: $t| x.ln()),
            UnaryOp::Log2 => map1(v, |x: $t| x.log2()),
            UnaryOp::Sqrt => map1(v, |x: $t| x.sqrt()),
            UnaryOp::Rsqrt => map1(v, |x: $t| 1.0 / x.sqrt()),
            UnaryOp::Abs => map1(v, |x: $t| x.abs()),
            UnaryOp::Sigmoid => map1(v, |x: $t| 1.0 / (1.0 + (-x).exp())),
            UnaryOp::Tanh => map1(v, |x: $t| x.tanh()),
            UnaryOp::Erf => map1(v, |x: $t| erf64(x as f64) as $t),
            UnaryOp::Not => map1(v, |x: $t| if x == 0.0 { 1.0 } else { 0.0 }),
            UnaryOp::Invert => v.to_vec(),
        }
    }};
}

/// `e^x` in f32 without a call per element (vectorisable): Cephes' expf
/// polynomial after range reduction by ln 2, within 2 ulp of the exact value
/// for normal results; results below the smallest normal f32 flush to 0.
#[inline(always)]
pub(super) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    let xc = x.clamp(-87.5, 88.75);
    // Round to nearest with the 1.5 * 2^23 trick: `floor` is a libm call on
    // baseline x86-64 (no SSE4.1), which would stop vectorisation.
    const MAGIC: f32 = 12_582_912.0;
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_2e-4f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // 2^n as two factors, each within the normal exponent range.
    // `n` as an integer, read from the mantissa of `t` (an `as` cast
    // saturates, which does not vectorise).
    let ni = t.to_bits() as i32 - MAGIC.to_bits() as i32;
    let h = ni >> 1;
    let s1 = f32::from_bits(((h + 127) as u32) << 23);
    let s2 = f32::from_bits(((ni - h + 127) as u32) << 23);
    let y = e * s1 * s2;
    if x.is_nan() {
        x
    } else if x < -87.33 {
        0.0
    } else if x > 88.72 {
        f32::INFINITY
    } else {
        y
    }
}

pub(super) fn unary(u: UnaryOp, d: DType, x: &Buf) -> Buf {
    match x {
        Buf::F(v) if u == UnaryOp::Exp => normalise(d, Buf::F(map1(v, exp_f32))),
        Buf::F(v) => normalise(d, Buf::F(float_unary!(u, v, f32))),
        Buf::D(v) => Buf::D(float_unary!(u, v, f64)),
        Buf::I(v) => {
            let out = match u {
                UnaryOp::Neg => map1(v, |x: i64| x.wrapping_neg()),
                UnaryOp::Not => map1(v, |x: i64| (x == 0) as i64),
                UnaryOp::Invert => map1(v, |x: i64| !x),
                UnaryOp::Abs => map1(v, |x: i64| x.wrapping_abs()),
                // Float functions of integers are cast first by lowering.
                _ => v.to_vec(),
            };
            normalise(d, Buf::I(out))
        }
    }
}

macro_rules! compare {
    ($op:expr, $p:expr, $q:expr, $t:ty) => {{
        let (p, q) = ($p, $q);
        match $op {
            BinaryOp::Eq => zip_map(p, q, |a: $t, b: $t| (a == b) as i64),
            BinaryOp::Ne => zip_map(p, q, |a: $t, b: $t| (a != b) as i64),
            BinaryOp::Lt => zip_map(p, q, |a: $t, b: $t| (a < b) as i64),
            BinaryOp::Le => zip_map(p, q, |a: $t, b: $t| (a <= b) as i64),
            BinaryOp::Gt => zip_map(p, q, |a: $t, b: $t| (a > b) as i64),
            _ => zip_map(p, q, |a: $t, b: $t| (a >= b) as i64),
        }
    }};
}

macro_rules! float_binary {
    ($op:expr, $p:expr, $q:expr, $t:ty) => {{
        let (p, q) = ($p, $q);
        match $op {
            BinaryOp::Add => zip_map(p, q, |a: $t, b: $t| a + b),
            BinaryOp::Sub => zip_map(p, q, |a: $t, b: $t| a - b),
            BinaryOp::Mul => zip_map(p, q, |a: $t, b: $t| a * b),
            BinaryOp::Div => zip_map(p, q, |a: $t, b: $t| a / b),
            BinaryOp::FloorDiv => zip_map(p, q, |a: $t, b: $t| (a / b).floor()),
            BinaryOp::Mod => zip_map(p, q, |a: $t, b: $t| {
                let r = a % b;
                if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
                    r + b
                } else {
                    r
                }
            }),
            BinaryOp::Pow => zip_map(p, q, |a: $t, b: $t| a.powf(b)),
            // NaN propagates, as in the device's max/min of the language.
            BinaryOp::Max => zip_map(p, q, |a: $t, b: $t| {
                if a.is_nan() || b.is_nan() {
                    <$t>::NAN
                } else {
                    a.max(b)
                }
            }),
            BinaryOp::Min => zip_map(p, q, |a: $t, b: $t| {
                if a.is_nan() || b.is_nan() {
                    <$t>::NAN
                } else {
                    a.min(b)
                }
            }),
            BinaryOp::And => zip_map(p, q, |a: $t, b: $t| ((a != 0.0) && (b != 0.0)) as i64 as $t),
            BinaryOp::Or => zip_map(p, q, |a: $t, b: $t| ((a != 0.0) || (b != 0.0)) as i64 as $t),
            _ => zip_map(p, q, |a: $t, b: $t| ((a != 0.0) != (b != 0.0)) as i64 as $t),
        }
    }};
}

pub(super) fn floor_div(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let q = a.wrapping_div(b);
    if (a.wrapping_rem(b) != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

pub(super) fn py_mod(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let r = a.wrapping_rem(b);
    if r != 0 && ((r < 0) != (b < 0)) {
        r + b
    } else {
        r
    }
}

pub(super) fn int_pow(a: i64, b: i64) -> i64 {
    if b < 0 {
        // Python gives a float; integer powers are non-negative in checked
        // code, so this is 1/a truncated.
        match a {
            1 => 1,
            -1 if b % 2 == 0 => 1,
            -1 => -1,
            _ => 0,
        }
    } else {
        a.wrapping_pow(b.min(u32::MAX as i64) as u32)
    }
}

/// An elementwise binary op. Integer division by zero gives 0 in that lane and
/// marks it in the returned poison lanes.
pub(super) fn binary(op: BinaryOp, rd: DType, x: &Buf, y: &Buf) -> (Buf, Option<Vec<bool>>) {
    use BinaryOp::*;
    let buf = match (x, y) {
        (Buf::F(p), Buf::F(q)) if op.is_comparison() => Buf::I(compare!(op, p, q, f32)),
        (Buf::D(p), Buf::D(q)) if op.is_comparison() => Buf::I(compare!(op, p, q, f64)),
        (Buf::I(p), Buf::I(q)) if op.is_comparison() => Buf::I(compare!(op, p, q, i64)),
        (Buf::F(p), Buf::F(q)) => normalise(rd, Buf::F(float_binary!(op, p, q, f32))),
        (Buf::D(p), Buf::D(q)) => Buf::D(float_binary!(op, p, q, f64)),
        (Buf::I(p), Buf::I(q)) => {
            let poison = (matches!(op, Div | FloorDiv | Mod) && q.contains(&0))
                .then(|| q.iter().map(|b| *b == 0).collect::<Vec<bool>>());
            let out = match op {
                Add => zip_map(p, q, |a: i64, b: i64| a.wrapping_add(b)),
                Sub => zip_map(p, q, |a: i64, b: i64| a.wrapping_sub(b)),
                Mul => zip_map(p, q, |a: i64, b: i64| a.wrapping_mul(b)),
                // Integer true division is not produced by lowering (it casts
                // to float); floor division keeps integers exact.
                Div | FloorDiv => zip_map(p, q, floor_div),
                Mod => zip_map(p, q, py_mod),
                Pow => zip_map(p, q, int_pow),
                Max => zip_map(p, q, |a: i64, b: i64| a.max(b)),
                Min => zip_map(p, q, |a: i64, b: i64| a.min(b)),
                And => zip_map(p, q, |a: i64, b: i64| a & b),
                Or => zip_map(p, q, |a: i64, b: i64| a | b),
                _ => zip_map(p, q, |a: i64, b: i64| a ^ b),
            };
            return (normalise(rd, Buf::I(out)), poison);
        }
        _ => unreachable!("Tile IR: binary operands of one type"),
    };
    (buf, None)
}

pub(super) fn cast(x: &Buf, to: DType) -> Buf {
    let b = match (x, repr(to)) {
        (Buf::F(v), Repr::F) => Buf::F(v.clone()),
        (Buf::F(v), Repr::D) => Buf::D(v.iter().map(|x| *x as f64).collect()),
        (Buf::D(v), Repr::F) => Buf::F(v.iter().map(|x| round_to(to, *x) as f32).collect()),
        (Buf::D(v), Repr::D) => Buf::D(v.clone()),
        (Buf::I(v), Repr::F) => Buf::F(v.iter().map(|x| *x as f32).collect()),
        (Buf::I(v), Repr::D) => Buf::D(v.iter().map(|x| *x as f64).collect()),
        (Buf::I(v), Repr::I) => Buf::I(v.clone()),
        (Buf::F(v), Repr::I) => Buf::I(v.iter().map(|x| float_to_int(to, *x as f64)).collect()),
        (Buf::D(v), Repr::I) => Buf::I(v.iter().map(|x| float_to_int(to, *x)).collect()),
    };
    normalise(to, b)
}

pub(super) fn broadcast(a: &Tile, to: &[usize]) -> Tile {
    let n: usize = to.iter().product();
    if a.buf.len() == 1 {
        let buf = match &a.buf {
            Buf::F(v) => Buf::F(vec![v[0]; n]),
            Buf::D(v) => Buf::D(vec![v[0]; n]),
            Buf::I(v) => Buf::I(vec![v[0]; n]),
        };
        return Tile {
            shape: to.to_vec(),
            buf,
            poison: None,
        };
    }
    // Source strides, 0 along broadcast axes.
    let mut st = vec![0usize; to.len()];
    let mut s = 1;
    for i in (0..to.len()).rev() {
        st[i] = if a.shape[i] == 1 { 0 } else { s };
        s *= a.shape[i];
    }
    let mut idx = Vec::with_capacity(n);
    let mut cur = vec![0usize; to.len()];
    for _ in 0..n {
        idx.push(cur.iter().zip(&st).map(|(c, s)| c * s).sum());
        let mut j = to.len();
        while j > 0 {
            j -= 1;
            cur[j] += 1;
            if cur[j] < to[j] {
                break;
            }
            cur[j] = 0;
        }
    }
    Tile {
        shape: to.to_vec(),
        buf: a.buf.gather(&idx),
        poison: None,
    }
}

/// `dot` of f64 and integer tiles (f32-represented ones go through
/// [`gemm::sdot`]).
pub(super) fn dot(
    a: &Buf,
    b: &Buf,
    acc: Option<Buf>,
    m: usize,
    k: usize,
    n: usize,
    rd: DType,
) -> Buf {
    match (a, b) {
        (Buf::D(x), Buf::D(y)) => {
            let mut c = match acc {
                Some(Buf::D(c)) => c,
                Some(other) => cast(&other, DType::F64).get_d(),
                None => vec![0.0f64; m * n],
            };
            assert!(
                x.len() == m * k && y.len() == k * n && c.len() == m * n,
                "Tile IR: dot operands of their shapes"
            );
            // SAFETY: row-major slices of the stated sizes (asserted above).
            unsafe {
                matrixmultiply::dgemm(
                    m,
                    k,
                    n,
                    1.0,
                    x.as_ptr(),
                    k as isize,
                    1,
                    y.as_ptr(),
                    n as isize,
                    1,
                    1.0,
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
            cast(&Buf::D(c), rd)
        }
        (Buf::I(x), Buf::I(y)) => {
            let mut c: Vec<i64> = match acc {
                Some(t) => cast(&t, DType::I64).i().to_vec(),
                None => vec![0; m * n],
            };
            for i in 0..m {
                for l in 0..k {
                    let xv = x[i * k + l];
                    for j in 0..n {
                        c[i * n + j] = c[i * n + j].wrapping_add(xv.wrapping_mul(y[l * n + j]));
                    }
                }
            }
            cast(&Buf::I(c), rd)
        }
        _ => unreachable!("Tile IR: dot operands of one type"),
    }
}

// NaN propagates (b is NaN: b != b).
#[allow(clippy::eq_op)]
pub(super) fn fmax<X: PartialOrd + Copy>(a: X, b: X) -> X {
    if b > a || b != b {
        b
    } else {
        a
    }
}

#[allow(clippy::eq_op)]
pub(super) fn fmin<X: PartialOrd + Copy>(a: X, b: X) -> X {
    if b < a || b != b {
        b
    } else {
        a
    }
}
/// Folds `row` with `f` in eight interleaved lanes, then the lanes together.
#[inline(always)]
pub(super) fn lanes8(row: &[f32], init: f32, f: &impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] = f(acc[i], c[i]);
        }
    }
    for (i, x) in chunks.remainder().iter().enumerate() {
        acc[i] = f(acc[i], *x);
    }
    acc.into_iter().fold(init, f)
}

#[inline(always)]
pub(super) fn rows_fold_loop(
    v: &[f32],
    len: usize,
    init: f32,
    f: &impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(v.len() / len.max(1));
    for row in v.chunks(len) {
        out.push(lanes8(row, init, f));
    }
    out
}

/// # Safety
/// The CPU must have the feature (only safe code runs inside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn rows_fold_avx512(
    v: &[f32],
    len: usize,
    init: f32,
    f: &impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    rows_fold_loop(v, len, init, f)
}

/// # Safety
/// The CPU must have the feature (only safe code runs inside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn rows_fold_avx2(
    v: &[f32],
    len: usize,
    init: f32,
    f: &impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    rows_fold_loop(v, len, init, f)
}

/// Every `len`-long row of `v` folded with `f` (see [`lanes8`]).
pub(super) fn rows_fold(
    v: &[f32],
    len: usize,
    init: f32,
    f: &impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    widest!(
        rows_fold_avx512,
        rows_fold_avx2,
        rows_fold_loop,
        v,
        len,
        init,
        f
    )
}

pub(super) fn reduce(op: ReduceOp, x: &Buf, outer: usize, len: usize, inner: usize) -> Buf {
    macro_rules! red {
        ($v:expr, $t:ty, $init:expr, $f:expr) => {{
            let mut out: Vec<$t> = vec![$init; outer * inner];
            for o in 0..outer {
                let acc = &mut out[o * inner..(o + 1) * inner];
                for j in 0..len {
                    let row = &$v[(o * len + j) * inner..(o * len + j + 1) * inner];
                    for (a, x) in acc.iter_mut().zip(row) {
                        *a = $f(*a, *x);
                    }
                }
            }
            out
        }};
    }
    if inner == 1 && len > 0 {
        if let Buf::F(v) = x {
            // Rows reduced along their contiguous axis: eight partial results
            // per row (vectorisable; the GPU's tree order differs as much).
            let rows = &v[..(outer * len).min(v.len())];
            return Buf::F(match op {
                ReduceOp::Sum => rows_fold(rows, len, 0.0, &|a, b| a + b),
                ReduceOp::Max => rows_fold(rows, len, f32::NEG_INFINITY, &fmax),
                ReduceOp::Min => rows_fold(rows, len, f32::INFINITY, &fmin),
            });
        }
    }
    match (x, op) {
        (Buf::F(v), ReduceOp::Sum) => Buf::F(red!(v, f32, 0.0, |a, b| a + b)),
        (Buf::F(v), ReduceOp::Max) => Buf::F(red!(v, f32, f32::NEG_INFINITY, fmax)),
        (Buf::F(v), ReduceOp::Min) => Buf::F(red!(v, f32, f32::INFINITY, fmin)),
        (Buf::D(v), ReduceOp::Sum) => Buf::D(red!(v, f64, 0.0, |a, b| a + b)),
        (Buf::D(v), ReduceOp::Max) => Buf::D(red!(v, f64, f64::NEG_INFINITY, fmax)),
        (Buf::D(v), ReduceOp::Min) => Buf::D(red!(v, f64, f64::INFINITY, fmin)),
        (Buf::I(v), ReduceOp::Sum) => Buf::I(red!(v, i64, 0, |a: i64, b: i64| a.wrapping_add(b))),
        (Buf::I(v), ReduceOp::Max) => Buf::I(red!(v, i64, i64::MIN, |a: i64, b: i64| a.max(b))),
        (Buf::I(v), ReduceOp::Min) => Buf::I(red!(v, i64, i64::MAX, |a: i64, b: i64| a.min(b))),
    }
}
