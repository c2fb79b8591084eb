//! Tensor memory seen through a load, store or atomic: the elements an access
//! touches, masks, runs of contiguous elements and atomic read-modify-writes.

use super::*;

/// The elements an access touches.
pub(super) enum Placed {
    /// A window: per tensor axis, `(start, Some(len))` for a range or
    /// `(index, None)` for a point.
    Window {
        shape: Vec<usize>,
        starts: Vec<(i64, Option<usize>)>,
    },
    /// A gather: each element's tensor offset, `None` when out of bounds.
    Gathered {
        shape: Vec<usize>,
        offsets: Vec<Option<usize>>,
    },
}

impl Placed {
    pub(super) fn shape(&self) -> &[usize] {
        match self {
            Placed::Window { shape, .. } | Placed::Gathered { shape, .. } => shape,
        }
    }

    /// Calls `f(tile_offset, tensor_offset, len)` for every in-bounds run.
    pub(super) fn for_each_run(&self, m: &Mem, mut f: impl FnMut(usize, usize, usize)) {
        match self {
            Placed::Window { shape, starts } => for_each_run(m, shape, starts, f),
            Placed::Gathered { offsets, .. } => {
                for (e, off) in offsets.iter().enumerate() {
                    if let Some(off) = off {
                        f(e, *off, 1);
                    }
                }
            }
        }
    }
}

/// A `dot` operand for [`gemm::sdot`]: the view of a deferred load, or an
/// f32-represented tile.
pub(super) fn source(t: &Tile, view: Option<View>) -> Option<Source<'_>> {
    match (&t.buf, view) {
        (_, Some(view)) => Some(Source::Mem(view)),
        (Buf::F(f), None) => Some(Source::Dense(f)),
        _ => None,
    }
}

pub(super) fn access_poisoned(access: &[Access], any: &dyn Fn(Value) -> bool) -> bool {
    access.iter().any(|a| any(a.value()))
}

/// The row-major indices into a tile of `shape` of elements `start ..
/// start + len` of `axis`, in order.
pub(super) fn extract_index(shape: &[usize], axis: usize, start: usize, len: usize) -> Vec<usize> {
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let mut idx = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        for a in start..start + len {
            let base = (o * shape[axis] + a) * inner;
            idx.extend(base..base + inner);
        }
    }
    idx
}

pub(super) fn select<X: Copy>(c: &[i64], a: &[X], b: &[X]) -> Vec<X> {
    c.iter()
        .zip(a.iter().zip(b))
        .map(|(c, (a, b))| if *c != 0 { *a } else { *b })
        .collect()
}

pub(super) fn apply_mask(buf: &mut Buf, fill: &Buf, mask: &[i64]) {
    match (buf, fill) {
        (Buf::F(v), Buf::F(f)) => v.iter_mut().zip(mask).for_each(|(x, m)| {
            if *m == 0 {
                *x = f[0]
            }
        }),
        (Buf::D(v), Buf::D(f)) => v.iter_mut().zip(mask).for_each(|(x, m)| {
            if *m == 0 {
                *x = f[0]
            }
        }),
        (Buf::I(v), Buf::I(f)) => v.iter_mut().zip(mask).for_each(|(x, m)| {
            if *m == 0 {
                *x = f[0]
            }
        }),
        _ => unreachable!("same representation"),
    }
}

/// Calls `f(tile_offset, tensor_offset, len)` for every in-bounds run of
/// consecutive elements of an access (the innermost axis is contiguous in the
/// tile; it is contiguous in memory when it is the tensor's last axis).
///
/// This is what the unsafe reads and writes of a launch rely on: every
/// position passed on is clipped to `0..dims[axis]` on every axis (in
/// saturating arithmetic, whatever the kernel computed for its starts), so
/// `tensor_offset + len` is at most the tensor's element count, which its
/// storage holds (see `run_grid_with`).
pub(super) fn for_each_run(
    m: &Mem,
    shape: &[usize],
    starts: &[(i64, Option<usize>)],
    mut f: impl FnMut(usize, usize, usize),
) {
    let rank = starts.len();
    // A point out of bounds: nothing is in bounds.
    for (axis, (s, len)) in starts.iter().enumerate() {
        if len.is_none() && (*s < 0 || *s >= m.dims[axis]) {
            return;
        }
    }
    if rank == 0 {
        f(0, 0, 1);
        return;
    }
    let (last_start, last_len) = starts[rank - 1];
    // The innermost run: the last axis' valid window (a point: one element).
    let (lo, hi) = match last_len {
        Some(len) => {
            let lo = last_start.saturating_neg().clamp(0, len as i64);
            let hi = m.dims[rank - 1]
                .saturating_sub(last_start)
                .clamp(lo, len as i64);
            (lo as usize, hi as usize)
        }
        None => (0, 1),
    };
    if lo >= hi {
        return;
    }
    let inner_tile = last_len.unwrap_or(1);
    // The outer range axes, odometer style.
    let outer: Vec<usize> = (0..rank - 1).filter(|&a| starts[a].1.is_some()).collect();
    let counts: Vec<usize> = outer.iter().map(|&a| starts[a].1.unwrap()).collect();
    let total: usize = counts.iter().product();
    let _ = shape;
    let mut idx = vec![0usize; outer.len()];
    for t in 0..total {
        if t > 0 {
            let mut j = outer.len();
            while j > 0 {
                j -= 1;
                idx[j] += 1;
                if idx[j] < counts[j] {
                    break;
                }
                idx[j] = 0;
            }
        }
        let mut off = 0i64;
        let mut ok = true;
        let mut oi = 0;
        for (axis, (s, len)) in starts.iter().enumerate().take(rank - 1) {
            let pos = if len.is_some() {
                oi += 1;
                s.saturating_add(idx[oi - 1] as i64)
            } else {
                *s
            };
            if pos < 0 || pos >= m.dims[axis] {
                ok = false;
                break;
            }
            off += pos * m.strides[axis];
        }
        if !ok {
            continue;
        }
        let last_pos = last_start + lo as i64;
        off += last_pos * m.strides[rank - 1];
        f(t * inner_tile + lo, off as usize, hi - lo);
    }
}

/// Reads `len` elements at `off` of `m` into `dst[at..]`, converting.
///
/// # Safety
/// `off + len` must be within the tensor.
pub(super) unsafe fn read_run(m: &Mem, off: usize, dst: &mut Buf, at: usize, len: usize) {
    macro_rules! rd {
        ($t:ty, $v:expr, $conv:expr) => {{
            let p = (m.ptr as *const $t).add(off);
            let src = std::slice::from_raw_parts(p, len);
            for (o, x) in $v[at..at + len].iter_mut().zip(src) {
                *o = $conv(*x);
            }
        }};
    }
    match (m.dtype, dst) {
        (DType::F32, Buf::F(v)) => {
            let p = (m.ptr as *const f32).add(off);
            v[at..at + len].copy_from_slice(std::slice::from_raw_parts(p, len));
        }
        (DType::F16, Buf::F(v)) => rd!(f16, v, |x: f16| x.to_f32()),
        (DType::BF16, Buf::F(v)) => rd!(bf16, v, |x: bf16| x.to_f32()),
        (DType::F8E4M3 | DType::F8E5M2, Buf::F(v)) => {
            rd!(u8, v, |x: u8| decode_byte(m.dtype, x) as f32)
        }
        (DType::F64, Buf::D(v)) => rd!(f64, v, |x: f64| x),
        (DType::I64, Buf::I(v)) => rd!(i64, v, |x: i64| x),
        (DType::I32, Buf::I(v)) => rd!(i32, v, |x: i32| x as i64),
        (DType::I16, Buf::I(v)) => rd!(i16, v, |x: i16| x as i64),
        (DType::I8, Buf::I(v)) => rd!(i8, v, |x: i8| x as i64),
        (DType::U32, Buf::I(v)) => rd!(u32, v, |x: u32| x as i64),
        (DType::U8, Buf::I(v)) => rd!(u8, v, |x: u8| x as i64),
        (DType::Bool, Buf::I(v)) => rd!(u8, v, |x: u8| (x != 0) as i64),
        (d, b) => unreachable!("Tile IR: a {d} load into a {b:?} tile"),
    }
}

/// Writes (or atomically adds) `src[at..at + len]` to `m` at `off`, where the
/// mask (if any) is set.
///
/// # Safety
/// `off + len` must be within the tensor.
pub(super) unsafe fn write_run(
    m: &Mem,
    off: usize,
    src: &Buf,
    at: usize,
    len: usize,
    mask: Option<&[i64]>,
    add: bool,
) {
    let on = |j: usize| mask.is_none_or(|mk| mk[at + j] != 0);
    // A scalar value stored to a range (or a tile to a point) is not produced
    // by lowering; a one-element source repeats.
    let val = |j: usize| -> f64 {
        let i = if src.len() == 1 { 0 } else { at + j };
        src.get(i)
    };
    if add {
        for j in 0..len {
            if on(j) {
                atomic_add(m, off + j, val(j), src, at + j);
            }
        }
        return;
    }
    match (m.dtype, src) {
        (DType::F32, Buf::F(v)) if mask.is_none() && v.len() >= at + len => {
            let p = (m.ptr as *mut f32).add(off);
            std::ptr::copy_nonoverlapping(v[at..].as_ptr(), p, len);
        }
        (DType::F32, Buf::F(v)) if v.len() >= at + len => {
            let p = (m.ptr as *mut f32).add(off);
            for j in 0..len {
                if on(j) {
                    p.add(j).write(v[at + j]);
                }
            }
        }
        (DType::F16, Buf::F(v)) if v.len() >= at + len => {
            let p = (m.ptr as *mut f16).add(off);
            for j in 0..len {
                if on(j) {
                    p.add(j).write(f16::from_f32(v[at + j]));
                }
            }
        }
        (DType::BF16, Buf::F(v)) if v.len() >= at + len => {
            let p = (m.ptr as *mut bf16).add(off);
            for j in 0..len {
                if on(j) {
                    p.add(j).write(bf16::from_f32(v[at + j]));
                }
            }
        }
        _ => {
            for j in 0..len {
                if on(j) {
                    write_one(m, off + j, val(j), src, at + j);
                }
            }
        }
    }
}

/// Element `i` of an integer tile exactly (i64 values do not survive f64).
pub(super) fn int_of(src: &Buf, i: usize) -> Option<i64> {
    match src {
        Buf::I(v) => Some(v[if v.len() == 1 { 0 } else { i }]),
        _ => None,
    }
}

/// Writes `x` (or the integer `src[si]` exactly) to element `at` of `m`.
///
/// # Safety
/// `at` must be within the tensor.
pub(super) unsafe fn write_one(m: &Mem, at: usize, x: f64, src: &Buf, si: usize) {
    let int = int_of(src, si).unwrap_or_else(|| float_to_int(m.dtype, x));
    match m.dtype {
        DType::F64 => (m.ptr as *mut f64).add(at).write(x),
        DType::F32 => (m.ptr as *mut f32).add(at).write(x as f32),
        DType::F16 => (m.ptr as *mut f16).add(at).write(f16::from_f64(x)),
        DType::BF16 => (m.ptr as *mut bf16).add(at).write(bf16::from_f64(x)),
        DType::I64 => (m.ptr as *mut i64).add(at).write(int),
        DType::I32 => (m.ptr as *mut i32).add(at).write(int as i32),
        DType::I16 => (m.ptr as *mut i16).add(at).write(int as i16),
        DType::I8 => (m.ptr as *mut i8).add(at).write(int as i8),
        DType::U32 => (m.ptr as *mut u32).add(at).write(int as u32),
        DType::U8 => m.ptr.add(at).write(int as u8),
        DType::Bool => m.ptr.add(at).write((int != 0) as u8),
        DType::F8E4M3 | DType::F8E5M2 => m.ptr.add(at).write(encode_byte(m.dtype, x)),
    }
}

/// `m[at] += x` as one atomic read-modify-write.
///
/// # Safety
/// `at` must be within the tensor (whose elements are aligned for their
/// type, as the storage vector is).
pub(super) unsafe fn atomic_add(m: &Mem, at: usize, x: f64, src: &Buf, si: usize) {
    let int = int_of(src, si).unwrap_or_else(|| float_to_i64(x));
    macro_rules! cas {
        ($atomic:ty, $bits:ty, $from:expr, $to:expr) => {{
            let a = <$atomic>::from_ptr((m.ptr as *mut $bits).add(at));
            let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some($to($from(old)))
            });
        }};
    }
    macro_rules! int_add {
        ($atomic:ty, $t:ty) => {{
            let a = <$atomic>::from_ptr((m.ptr as *mut $t).add(at));
            a.fetch_add(int as $t, Ordering::Relaxed);
        }};
    }
    match m.dtype {
        DType::F64 => cas!(AtomicU64, u64, f64::from_bits, |v: f64| (v + x).to_bits()),
        DType::F32 => cas!(AtomicU32, u32, f32::from_bits, |v: f32| (v + x as f32)
            .to_bits()),
        DType::F16 => cas!(AtomicU16, u16, f16::from_bits, |v: f16| f16::from_f32(
            v.to_f32() + x as f32
        )
        .to_bits()),
        DType::BF16 => cas!(AtomicU16, u16, bf16::from_bits, |v: bf16| bf16::from_f32(
            v.to_f32() + x as f32
        )
        .to_bits()),
        DType::F8E4M3 | DType::F8E5M2 => {
            cas!(AtomicU8, u8, |b: u8| decode_byte(m.dtype, b), |v: f64| {
                encode_byte(m.dtype, v + x)
            })
        }
        DType::I64 => int_add!(AtomicI64, i64),
        DType::I32 => int_add!(AtomicI32, i32),
        DType::I16 => int_add!(AtomicI16, i16),
        DType::I8 => int_add!(AtomicI8, i8),
        DType::U32 => int_add!(AtomicU32, u32),
        DType::U8 => int_add!(AtomicU8, u8),
        DType::Bool => cas!(AtomicU8, u8, |b: u8| b as i64, |v: i64| ((v + int) != 0)
            as u8),
    }
}
