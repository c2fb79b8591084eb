//! The f32 `dot` of the CPU executor: `acc += a @ b` on whole tiles.
//!
//! Both operands are packed into register-blocked panels (converted to f32 and
//! rounded to tf32 on the way, when asked), then a micro-kernel multiplies an
//! `MR x K` panel of `a` by a `K x NR` panel of `b` into the accumulator in
//! place, one fused multiply-add per product in `k` order. An operand is
//! either a materialised tile or a [`View`] of tensor memory (a load that the
//! interpreter left to the dot, see `super::deferred`): both are packed by the
//! same code into the same panels, so the result does not depend on which one
//! a program had.
//!
//! The micro-kernel is picked at run time, as the elementwise loops are:
//! AVX-512F intrinsics, AVX2 + FMA intrinsics, or a plain loop for the baseline (which rounds the
//! product and the sum separately where the FMA kernel rounds once).

use std::cell::RefCell;
use std::sync::Arc;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::packed::{aligned, Key, PackCache, Packed, Side};
use crate::check::DType;

/// A tile of tensor memory standing for a load that was not materialised.
#[derive(Clone, Copy, Debug)]
pub(super) struct View {
    /// The tensor's first element.
    pub ptr: *const u8,
    /// The tensor's dtype: f32, f16 or bf16.
    pub dtype: DType,
    /// Element offset of tile element `(0, 0)`; it may lie outside the
    /// tensor when the in-bounds window starts later.
    pub off: i64,
    /// Element strides of the tile's rows and columns in the tensor.
    pub rs: i64,
    pub cs: i64,
    /// The tile rows and columns (`lo..hi`) that are in bounds; the other
    /// elements read as `fill`.
    pub rows: (usize, usize),
    pub cols: (usize, usize),
    /// The load's `other=`, already rounded to the load's dtype.
    pub fill: f32,
    /// No program of the launch writes the tensor (its packed copies may be
    /// kept, see `super::packed`).
    pub read_only: bool,
}

impl View {
    /// Row `i` of the tile, columns `0..len`, into `out` (as f32).
    ///
    /// # Safety
    /// The in-bounds window must address elements of the live tensor.
    unsafe fn read_row(&self, i: usize, out: &mut [f32]) {
        let (c0, c1) = self.cols;
        if i < self.rows.0 || i >= self.rows.1 || c0 >= c1 {
            out.fill(self.fill);
            return;
        }
        out[..c0].fill(self.fill);
        out[c1..].fill(self.fill);
        let base = self.off + i as i64 * self.rs + c0 as i64 * self.cs;
        let dst = &mut out[c0..c1];
        macro_rules! conv {
            ($t:ty, $f:expr) => {{
                let p = self.ptr as *const $t;
                for (j, o) in dst.iter_mut().enumerate() {
                    *o = $f(*p.offset((base + j as i64 * self.cs) as isize));
                }
            }};
        }
        match self.dtype {
            DType::F32 if self.cs == 1 => {
                let p = (self.ptr as *const f32).offset(base as isize);
                dst.copy_from_slice(std::slice::from_raw_parts(p, dst.len()));
            }
            DType::F32 => conv!(f32, |x: f32| x),
            DType::F16 if self.cs == 1 => {
                let p = (self.ptr as *const f16).offset(base as isize);
                std::slice::from_raw_parts(p, dst.len()).convert_to_f32_slice(dst);
            }
            DType::BF16 if self.cs == 1 => {
                let p = (self.ptr as *const bf16).offset(base as isize);
                std::slice::from_raw_parts(p, dst.len()).convert_to_f32_slice(dst);
            }
            DType::F16 => conv!(f16, |x: f16| x.to_f32()),
            DType::BF16 => conv!(bf16, |x: bf16| x.to_f32()),
            d => unreachable!("a {d} view"),
        }
    }

    /// Row `i` in memory when it can be read in place (f32, contiguous, all
    /// in bounds).
    ///
    /// # Safety
    /// As [`View::read_row`]; the slice lives as long as the tensor.
    #[inline(always)]
    unsafe fn row_in_place<'a>(&self, i: usize, len: usize) -> Option<&'a [f32]> {
        let whole = self.cols == (0, len) && i >= self.rows.0 && i < self.rows.1;
        if self.dtype == DType::F32 && self.cs == 1 && whole {
            let p = (self.ptr as *const f32).offset((self.off + i as i64 * self.rs) as isize);
            Some(std::slice::from_raw_parts(p, len))
        } else {
            None
        }
    }

    /// Asks the cache for the in-bounds rows of this view moved by `delta`
    /// elements: a load that moved by `delta` since its last run (a K loop)
    /// is likely to move by as much again, and its rows lie on different
    /// pages, where the hardware's prefetchers do not follow. Prefetches are
    /// hints: addresses outside the tensor do not fault.
    pub fn prefetch_moved(&self, delta: i64) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
            if self.cs != 1 || self.cols.0 >= self.cols.1 {
                return;
            }
            let size = match self.dtype {
                DType::F32 => 4,
                _ => 2,
            };
            let bytes = (self.cols.1 - self.cols.0) as i64 * size;
            for i in self.rows.0..self.rows.1 {
                let at = (self.off + delta + i as i64 * self.rs + self.cols.0 as i64) * size;
                let p = self.ptr.wrapping_offset(at as isize);
                let mut line = 0;
                while line < bytes + 63 {
                    // SAFETY: a prefetch never faults.
                    unsafe {
                        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_offset(line as isize) as *const i8)
                    };
                    line += 64;
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = delta;
    }

    /// The whole `m x k` tile in memory as f32 rows `rs` apart, when it can
    /// be read in place.
    fn in_place(&self, m: usize, k: usize) -> Option<(*const f32, usize)> {
        let whole = self.rows == (0, m) && self.cols == (0, k);
        if self.dtype == DType::F32 && self.cs == 1 && self.rs >= 0 && whole {
            // SAFETY: element (0, 0) is in bounds (the window is the tile).
            Some((
                unsafe { (self.ptr as *const f32).offset(self.off as isize) },
                self.rs as usize,
            ))
        } else {
            None
        }
    }
}

/// Where a `dot` operand's elements come from.
#[derive(Clone, Copy)]
pub(super) enum Source<'a> {
    /// A materialised row-major tile.
    Dense(&'a [f32]),
    /// Tensor memory (a deferred load).
    Mem(View),
}

impl Source<'_> {
    /// Row `i` (`len` elements), read in place where possible, else through
    /// `tmp`.
    #[inline(always)]
    fn row<'s>(&'s self, i: usize, len: usize, tmp: &'s mut [f32]) -> &'s [f32] {
        match self {
            Source::Dense(v) => &v[i * len..(i + 1) * len],
            // SAFETY: a view addresses the launch's live tensor (its window was
            // checked against the tensor's dims when the load ran).
            Source::Mem(view) => unsafe {
                match view.row_in_place(i, len) {
                    Some(r) => r,
                    None => {
                        view.read_row(i, &mut tmp[..len]);
                        &tmp[..len]
                    }
                }
            },
        }
    }
}

/// Rounds an f32 to tf32 (10 explicit mantissa bits, nearest, ties away), as
/// `cvt.rna.tf32.f32`; infinities and NaN pass. Branch-free (vectorisable).
#[inline(always)]
pub(super) fn tf32(x: f32) -> f32 {
    let b = x.to_bits();
    let r = b.wrapping_add(0x1000) & 0xffff_e000;
    f32::from_bits(if b & 0x7f80_0000 == 0x7f80_0000 { b } else { r })
}

/// One register block: `c[i * ldc + j] += sum_l a[i * lda + l] * b[l * NR + j]`
/// for an `MR x NR` block of the accumulator, `a` being `MR` rows of `k`
/// elements `lda` apart and `b` a packed panel.
///
/// # Safety
/// `a` must address `MR` rows of `k` readable elements, `lda` apart; `c` must
/// address `MR` rows of `NR` writable elements, `ldc` apart, not aliasing `a`
/// or `b`; `b` holds at least `k * NR` elements (asserted by the vector
/// kernels); a vector kernel needs its CPU features (picked by
/// [`micro_kernel`] from the detected ones).
type MicroKernel = unsafe fn(usize, *const f32, usize, &[f32], *mut f32, usize);

/// The portable block (the baseline's; `FMA` for tests of the rounding).
///
/// # Safety
/// As [`MicroKernel`].
#[inline(always)]
unsafe fn micro_loop<const MR: usize, const NR: usize, const FMA: bool>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: &[f32],
    c: *mut f32,
    ldc: usize,
) {
    let mut r = [[0f32; NR]; MR];
    for (i, row) in r.iter_mut().enumerate() {
        std::ptr::copy_nonoverlapping(c.add(i * ldc), row.as_mut_ptr(), NR);
    }
    for (l, bk) in b.chunks_exact(NR).take(k).enumerate() {
        let bk: &[f32; NR] = bk.try_into().unwrap();
        for (i, row) in r.iter_mut().enumerate() {
            let x = *a.add(i * lda + l);
            for (acc, y) in row.iter_mut().zip(bk) {
                *acc = if FMA {
                    x.mul_add(*y, *acc)
                } else {
                    x * y + *acc
                };
            }
        }
    }
    for (i, row) in r.iter().enumerate() {
        std::ptr::copy_nonoverlapping(row.as_ptr(), c.add(i * ldc), NR);
    }
}

/// The AVX2 + FMA block, 6 x 16: twelve accumulator registers, two of `b`
/// and one broadcast of `a` per step (the 16 ymm registers). Written with
/// intrinsics: the compiler's vectorisation of [`micro_loop`] spills.
///
/// # Safety
/// As [`MicroKernel`], on a CPU with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn micro_avx2(k: usize, a: *const f32, lda: usize, b: &[f32], c: *mut f32, ldc: usize) {
    use std::arch::x86_64::*;
    const MR: usize = 6;
    const NR: usize = 16;
    assert!(b.len() >= k * NR);
    let rows: [*const f32; MR] = std::array::from_fn(|i| a.add(i * lda));
    let mut r = [[_mm256_setzero_ps(); 2]; MR];
    for (i, row) in r.iter_mut().enumerate() {
        row[0] = _mm256_loadu_ps(c.add(i * ldc));
        row[1] = _mm256_loadu_ps(c.add(i * ldc + 8));
    }
    let bp = b.as_ptr();
    for l in 0..k {
        let b0 = _mm256_loadu_ps(bp.add(l * NR));
        let b1 = _mm256_loadu_ps(bp.add(l * NR + 8));
        for (row, a_row) in r.iter_mut().zip(rows) {
            let x = _mm256_broadcast_ss(&*a_row.add(l));
            row[0] = _mm256_fmadd_ps(x, b0, row[0]);
            row[1] = _mm256_fmadd_ps(x, b1, row[1]);
        }
    }
    for (i, row) in r.iter().enumerate() {
        _mm256_storeu_ps(c.add(i * ldc), row[0]);
        _mm256_storeu_ps(c.add(i * ldc + 8), row[1]);
    }
}

/// The AVX-512F block, 8 x 32: sixteen zmm accumulators, two of `b` and one
/// broadcast of `a` per step; eight rows keep the row pointers in general
/// registers and divide the usual 64- and 128-row tiles. Same products in
/// the same `k` order as [`micro_avx2`], so the same bits.
///
/// # Safety
/// As [`MicroKernel`], on a CPU with AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn micro_avx512(k: usize, a: *const f32, lda: usize, b: &[f32], c: *mut f32, ldc: usize) {
    use std::arch::x86_64::*;
    const MR: usize = 8;
    const NR: usize = 32;
    assert!(b.len() >= k * NR);
    let rows: [*const f32; MR] = std::array::from_fn(|i| a.add(i * lda));
    let mut r = [[_mm512_setzero_ps(); 2]; MR];
    for (i, row) in r.iter_mut().enumerate() {
        row[0] = _mm512_loadu_ps(c.add(i * ldc));
        row[1] = _mm512_loadu_ps(c.add(i * ldc + 16));
    }
    let bp = b.as_ptr();
    for l in 0..k {
        let b0 = _mm512_loadu_ps(bp.add(l * NR));
        let b1 = _mm512_loadu_ps(bp.add(l * NR + 16));
        for (row, a_row) in r.iter_mut().zip(rows) {
            let x = _mm512_set1_ps(*a_row.add(l));
            row[0] = _mm512_fmadd_ps(x, b0, row[0]);
            row[1] = _mm512_fmadd_ps(x, b1, row[1]);
        }
    }
    for (i, row) in r.iter().enumerate() {
        _mm512_storeu_ps(c.add(i * ldc), row[0]);
        _mm512_storeu_ps(c.add(i * ldc + 16), row[1]);
    }
}

/// The portable 4 x 8 block.
///
/// # Safety
/// As [`MicroKernel`].
unsafe fn micro_base(k: usize, a: *const f32, lda: usize, b: &[f32], c: *mut f32, ldc: usize) {
    micro_loop::<4, 8, false>(k, a, lda, b, c, ldc)
}

/// The micro-kernel for this machine and its block (`MR`, `NR`).
fn micro_kernel() -> (MicroKernel, usize, usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") {
            if has!("avx512f") {
                return (micro_avx512, 8, 32);
            }
            return (micro_avx2, 6, 16);
        }
    }
    (micro_base, 4, 8)
}

thread_local! {
    /// Buffers reused across dots: `a` as f32 rows, the panels of `b`, one
    /// row read through, one edge block of `a`.
    static SCRATCH: RefCell<[Vec<f32>; 4]> = const {
        RefCell::new([Vec::new(), Vec::new(), Vec::new(), Vec::new()])
    };
}

/// One `dot` of a chain: `a` is `m x k`, `b` is `k x n` (`m` and `n` are
/// the chain's).
#[derive(Clone, Copy)]
pub(super) struct Part<'a> {
    pub a: Source<'a>,
    pub b: Source<'a>,
    pub k: usize,
}

/// The parts' `a` side by side as f32 rows of `kt` (the parts' summed `k`),
/// converted by `conv`, into `out`.
#[inline(always)]
fn rows_of(
    parts: &[Part],
    kt: usize,
    conv: impl Fn(f32) -> f32,
    out: &mut [f32],
    tmp: &mut Vec<f32>,
) {
    tmp.resize(parts.iter().map(|p| p.k).max().unwrap_or(0), 0.0);
    // Row by row: the parts of a row often lie side by side in memory.
    for (r, dst) in out.chunks_exact_mut(kt).enumerate() {
        let mut k0 = 0;
        for p in parts {
            let row = p.a.row(r, p.k, tmp);
            for (o, x) in dst[k0..k0 + p.k].iter_mut().zip(row) {
                *o = conv(*x);
            }
            k0 += p.k;
        }
    }
}

/// Packs the parts' `b` stacked along `k` (`kt x n`) into `NR`-column panels:
/// panel `q` holds `b[l][q * NR + j]` at `(q * kt + l) * NR + j`; columns
/// past `n` are zero.
#[inline(always)]
fn pack_b(
    parts: &[Part],
    (kt, n, nr): (usize, usize, usize),
    conv: impl Fn(f32) -> f32,
    out: &mut [f32],
    tmp: &mut Vec<f32>,
) {
    tmp.resize(n, 0.0);
    let mut l = 0;
    for p in parts {
        for lp in 0..p.k {
            let row = p.b.row(lp, n, tmp);
            for (q, chunk) in row.chunks(nr).enumerate() {
                let at = (q * kt + l) * nr;
                for (o, x) in out[at..at + chunk.len()].iter_mut().zip(chunk) {
                    *o = conv(*x);
                }
            }
            l += 1;
        }
    }
}

/// Packs one operand of a chain into `out` (zeroed): `a` as rows, `b` in
/// panels, rounded to tf32 when asked.
#[inline(always)]
fn pack(
    parts: &[Part],
    side: Side,
    (kt, n): (usize, usize),
    round_tf32: bool,
    out: &mut [f32],
    tmp: &mut Vec<f32>,
) {
    match (side, round_tf32) {
        (Side::Rows, true) => rows_of(parts, kt, tf32, out, tmp),
        (Side::Rows, false) => rows_of(parts, kt, |x| x, out, tmp),
        (Side::Panels(nr), true) => pack_b(parts, (kt, n, nr), tf32, out, tmp),
        (Side::Panels(nr), false) => pack_b(parts, (kt, n, nr), |x| x, out, tmp),
    }
}

/// [`pack`] compiled with a vector extension enabled (a `#[target_feature]`
/// function cannot be generic over the feature).
macro_rules! pack_with {
    ($name:ident, $feature:literal) => {
        /// # Safety
        /// The CPU must have the feature (only safe code runs inside).
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        unsafe fn $name(
            parts: &[Part],
            side: Side,
            dims: (usize, usize),
            round_tf32: bool,
            out: &mut [f32],
            tmp: &mut Vec<f32>,
        ) {
            pack(parts, side, dims, round_tf32, out, tmp)
        }
    };
}
pack_with!(pack_avx512, "avx512f");
pack_with!(pack_avx2, "avx2");

/// [`pack`] compiled for the vector width of the micro-kernel picked
/// (`nr` columns).
fn pack_for(
    nr: usize,
    parts: &[Part],
    side: Side,
    dims: (usize, usize),
    round_tf32: bool,
    out: &mut [f32],
    tmp: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if nr >= 32 {
            // SAFETY: the 32-wide micro-kernel is picked on AVX-512F only.
            return unsafe { pack_avx512(parts, side, dims, round_tf32, out, tmp) };
        }
        if nr >= 16 {
            // SAFETY: the 16-wide micro-kernel is picked on AVX2 only.
            return unsafe { pack_avx2(parts, side, dims, round_tf32, out, tmp) };
        }
    }
    let _ = nr;
    pack(parts, side, dims, round_tf32, out, tmp)
}

/// One packed operand: kept by the launch's cache, or in a scratch buffer.
enum Operand<'s> {
    Kept(Arc<Packed>),
    Scratch(&'s [f32]),
}

impl Operand<'_> {
    fn as_slice(&self) -> &[f32] {
        match self {
            Operand::Kept(p) => p.as_slice(),
            Operand::Scratch(s) => s,
        }
    }
}

/// Packs the `side` operand of `parts` (`len` f32), through the launch's
/// cache when its memory may be kept, else into `scratch`.
#[allow(clippy::too_many_arguments)]
fn packed<'s>(
    parts: &[Part],
    side: Side,
    (kt, n, nr, len): (usize, usize, usize, usize),
    round_tf32: bool,
    cache: Option<&PackCache>,
    scratch: &'s mut Vec<f32>,
    tmp: &mut Vec<f32>,
) -> Operand<'s> {
    let views = parts.iter().map(|p| match (side, p.a, p.b) {
        (Side::Rows, Source::Mem(v), _) | (Side::Panels(_), _, Source::Mem(v)) => Some((v, p.k)),
        _ => None,
    });
    let key = cache.and_then(|_| Key::of(views, side, round_tf32));
    if let (Some(cache), Some(key)) = (cache, key) {
        let kept = cache.get_or_pack(key, len, |out| {
            pack_for(nr, parts, side, (kt, n), round_tf32, out, tmp)
        });
        if let Some(p) = kept {
            return Operand::Kept(p);
        }
    }
    let at = aligned(scratch, len);
    let out = &mut scratch[at..at + len];
    pack_for(nr, parts, side, (kt, n), round_tf32, out, tmp);
    Operand::Scratch(out)
}

/// How deep (`k`) one pass of the micro-kernel goes: a packed panel of `b`
/// (`k x NR` f32) then fills half of a 32 KiB L1 data cache, where it is read
/// once per row block.
fn pass_depth(nr: usize) -> usize {
    (16 * 1024 / (4 * nr)).max(32)
}

/// Whether a chain of dots with `m x n` results and summed depth `k` is as
/// deep as it should grow before it is multiplied: its packed operands then
/// fill about half of a 1 MiB L2 cache. Deep chains read each row of `a` in
/// one long run (streamed by the hardware's prefetchers) instead of one
/// short run per dot.
pub(super) fn chain_is_full(m: usize, k: usize, n: usize) -> bool {
    (m + n) * k * 4 >= 512 * 1024
}

/// `c += a @ b` for an `m x k` `a`, a `k x n` `b` and a row-major `m x n` `c`;
/// with `tf32` the inputs are rounded to tf32 first.
#[cfg(test)]
pub(super) fn sdot(
    a: Source,
    b: Source,
    c: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    round_tf32: bool,
) {
    if let Source::Dense(v) = a {
        assert_eq!(v.len(), m * k, "dot operand of its shape");
    }
    sdot_chain(&[Part { a, b, k }], c, (m, n), round_tf32, None);
}

/// `c += a1 @ b1 + a2 @ b2 + ...`: the dots of the parts one after the other,
/// with the same products added in the same order (part by part, `k`
/// ascending), so the same bits; the parts are packed side by side along `k`,
/// so that each accumulator block stays in registers across all of them.
/// Packed operands are kept in `cache` where their memory allows.
pub(super) fn sdot_chain(
    parts: &[Part],
    c: &mut [f32],
    (m, n): (usize, usize),
    round_tf32: bool,
    cache: Option<&PackCache>,
) {
    assert_eq!(c.len(), m * n, "dot accumulator of the result's size");
    let k: usize = parts.iter().map(|p| p.k).sum();
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let (kernel, mr, nr) = micro_kernel();
    SCRATCH.with(|s| {
        let [ra, pb, tmp, edge_a] = &mut *s.borrow_mut();
        let b_len = n.div_ceil(nr) * k * nr;
        let b = packed(
            parts,
            Side::Panels(nr),
            (k, n, nr, b_len),
            round_tf32,
            cache,
            pb,
            tmp,
        );
        // `a` is read in place when it is one f32 tile or view that needs no
        // rounding.
        let in_place = match parts {
            _ if round_tf32 => None,
            [Part {
                a: Source::Dense(v),
                ..
            }] => Some((v.as_ptr(), k)),
            [Part {
                a: Source::Mem(view),
                ..
            }] => view.in_place(m, k),
            _ => None,
        };
        let a = match in_place {
            Some(_) => None,
            None => Some(packed(
                parts,
                Side::Rows,
                (k, n, nr, m * k),
                round_tf32,
                cache,
                ra,
                tmp,
            )),
        };
        let (ap, lda) = in_place.unwrap_or_else(|| (a.as_ref().unwrap().as_slice().as_ptr(), k));
        let pb = b.as_slice();
        let depth = pass_depth(nr);
        // Edge blocks go through a full-size block and back.
        edge_a.clear();
        edge_a.resize(mr * depth.min(k), 0.0);
        let mut edge = [0f32; 8 * 32];
        let edge = &mut edge[..mr * nr];
        // Pass by pass along `k`: every accumulator element still adds its
        // products in `k` order.
        for k0 in (0..k).step_by(depth) {
            let kk = depth.min(k - k0);
            for (q, panel) in pb.chunks_exact(k * nr).enumerate() {
                let bp = &panel[k0 * nr..(k0 + kk) * nr];
                let j0 = q * nr;
                let w = nr.min(n - j0);
                for i0 in (0..m).step_by(mr) {
                    let h = mr.min(m - i0);
                    // SAFETY: rows `i0..i0 + h` of `a` exist (`lda` apart, `k`
                    // long); the kernel matches the detected features.
                    let (a_blk, a_ld) = if h == mr {
                        (unsafe { ap.add(i0 * lda + k0) }, lda)
                    } else {
                        for i in 0..h {
                            // SAFETY: row `i0 + i < m` of `a`, `k0 + kk <= k`
                            // elements of it.
                            let src = unsafe {
                                std::slice::from_raw_parts(ap.add((i0 + i) * lda + k0), kk)
                            };
                            edge_a[i * kk..(i + 1) * kk].copy_from_slice(src);
                        }
                        edge_a[h * kk..mr * kk].fill(0.0);
                        (edge_a.as_ptr(), kk)
                    };
                    if h == mr && w == nr {
                        // SAFETY: the block `i0..i0 + mr` x `j0..j0 + nr` is in `c`.
                        unsafe { kernel(kk, a_blk, a_ld, bp, c.as_mut_ptr().add(i0 * n + j0), n) };
                    } else {
                        for i in 0..h {
                            edge[i * nr..i * nr + w]
                                .copy_from_slice(&c[(i0 + i) * n + j0..(i0 + i) * n + j0 + w]);
                        }
                        // SAFETY: `edge` is one `mr x nr` block; rows of `a`
                        // past `h` are the zero rows of `edge_a` (`a_blk` is
                        // `edge_a` then).
                        unsafe { kernel(kk, a_blk, a_ld, bp, edge.as_mut_ptr(), nr) };
                        for i in 0..h {
                            c[(i0 + i) * n + j0..(i0 + i) * n + j0 + w]
                                .copy_from_slice(&edge[i * nr..i * nr + w]);
                        }
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `c + a @ b` in f64 from the same (optionally tf32-rounded) inputs.
    fn reference(a: &[f32], b: &[f32], c: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out: Vec<f64> = c.iter().map(|x| *x as f64).collect();
        for i in 0..m {
            for j in 0..n {
                for l in 0..k {
                    out[i * n + j] += a[i * k + l] as f64 * b[l * n + j] as f64;
                }
            }
        }
        out
    }

    #[test]
    fn matches_an_f64_reference_at_every_edge_size() {
        let mut seed = 7;
        for (m, k, n) in [
            (1, 1, 1),
            (7, 3, 5),
            (8, 32, 32),
            (13, 17, 50),
            (128, 32, 64),
        ] {
            let a: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
            let b: Vec<f32> = (0..k * n).map(|_| lcg(&mut seed)).collect();
            let c0: Vec<f32> = (0..m * n).map(|_| lcg(&mut seed)).collect();
            for round in [false, true] {
                let mut c = c0.clone();
                sdot(Source::Dense(&a), Source::Dense(&b), &mut c, m, k, n, round);
                let (ar, br): (Vec<f32>, Vec<f32>) = if round {
                    (
                        a.iter().map(|x| tf32(*x)).collect(),
                        b.iter().map(|x| tf32(*x)).collect(),
                    )
                } else {
                    (a.clone(), b.clone())
                };
                let want = reference(&ar, &br, &c0, m, k, n);
                for (g, w) in c.iter().zip(&want) {
                    assert!(
                        (*g as f64 - w).abs() <= 1e-5 * (k as f64 + 1.0),
                        "{m}x{k}x{n} tf32={round}: {g} vs {w}"
                    );
                }
            }
        }
    }

    /// The AVX2 kernel rounds exactly as the portable loop with fused
    /// multiply-adds: one rounding per product-sum, in `k` order.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_kernel_matches_the_portable_fma_loop() {
        if !(std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma"))
        {
            return;
        }
        let mut seed = 11;
        let k = 37;
        let a: Vec<f32> = (0..6 * k).map(|_| lcg(&mut seed)).collect();
        let b: Vec<f32> = (0..k * 16).map(|_| lcg(&mut seed)).collect();
        let c0: Vec<f32> = (0..6 * 20).map(|_| lcg(&mut seed)).collect();
        let (mut c1, mut c2) = (c0.clone(), c0.clone());
        // SAFETY: a 6 x 16 block with row stride 20 in a 6 x 20 buffer.
        unsafe {
            micro_avx2(k, a.as_ptr(), k, &b, c1.as_mut_ptr(), 20);
            micro_loop::<6, 16, true>(k, a.as_ptr(), k, &b, c2.as_mut_ptr(), 20);
        }
        assert_eq!(c1, c2);
    }

    /// The AVX-512 kernel gives the bits of the portable FMA loop (and so of
    /// the AVX2 kernel): same products, same `k` order.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx512_kernel_matches_the_portable_fma_loop() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut seed = 13;
        let k = 37;
        let a: Vec<f32> = (0..8 * k).map(|_| lcg(&mut seed)).collect();
        let b: Vec<f32> = (0..k * 32).map(|_| lcg(&mut seed)).collect();
        let c0: Vec<f32> = (0..8 * 40).map(|_| lcg(&mut seed)).collect();
        let (mut c1, mut c2) = (c0.clone(), c0.clone());
        // SAFETY: an 8 x 32 block with row stride 40 in an 8 x 40 buffer.
        unsafe {
            micro_avx512(k, a.as_ptr(), k, &b, c1.as_mut_ptr(), 40);
            micro_loop::<8, 32, true>(k, a.as_ptr(), k, &b, c2.as_mut_ptr(), 40);
        }
        assert_eq!(c1, c2);
    }

    /// A view with a window, a fill, f16 memory and a column stride gives the
    /// same bits as the materialised tile it stands for.
    #[test]
    fn a_view_packs_like_its_materialised_tile() {
        // An f16 tensor 6 x 10; the tile is its transpose window rows 2..,
        // cols 1.. of shape 5 x 4 (tile rows walk tensor columns).
        let mem: Vec<f16> = (0..60)
            .map(|i| f16::from_f32(i as f32 * 0.37 - 9.0))
            .collect();
        let (m, k) = (5usize, 4usize);
        let view = View {
            ptr: mem.as_ptr() as *const u8,
            dtype: DType::F16,
            off: 10 + 7, // tensor (1, 7) is tile (0, 0)
            rs: 1,
            cs: 10,
            rows: (0, 3), // tensor columns 7, 8, 9 exist
            cols: (0, 4), // tensor rows 1..5
            fill: 0.5,
            read_only: true,
        };
        let mut dense = vec![0f32; m * k];
        for i in 0..m {
            for l in 0..k {
                dense[i * k + l] = if i < 3 {
                    mem[(1 + l) * 10 + 7 + i].to_f32()
                } else {
                    0.5
                };
            }
        }
        let mut seed = 3;
        let n = 9;
        let b: Vec<f32> = (0..k * n).map(|_| lcg(&mut seed)).collect();
        let mut c1 = vec![1.0f32; m * n];
        let mut c2 = c1.clone();
        sdot(
            Source::Mem(view),
            Source::Dense(&b),
            &mut c1,
            m,
            k,
            n,
            false,
        );
        sdot(
            Source::Dense(&dense),
            Source::Dense(&b),
            &mut c2,
            m,
            k,
            n,
            false,
        );
        assert_eq!(c1, c2);
    }
}
