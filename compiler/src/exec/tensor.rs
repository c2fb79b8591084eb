//! Tensors as run-time values: a shape, a dtype and shared contiguous
//! row-major storage.
//!
//! Storage is shared (`Arc`) so that `b = a` aliases as in Python and a kernel
//! launch writes its tensor arguments in place. Writes go through raw pointers
//! (see [`Storage`]): a launch's programs run on several threads, and two
//! programs storing to the same element race exactly as on the GPU (the value
//! of one of them is kept; which is unspecified). Outside launches a tensor is
//! only touched by the thread that owns the session.

use std::cell::UnsafeCell;
use std::collections::TryReserveError;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use half::{bf16, f16};

use super::f8;
use super::{ExecError, Interrupt, Value};
use crate::check::DType;

mod display;
mod storage;

use storage::*;
pub(crate) use storage::{DeviceBuffer, Storage};

/// The elements of a tensor, one vector type per storage dtype (f8 formats and
/// bool are bytes: f8 encoded, bool 0/1).
#[derive(Clone, Debug)]
pub(crate) enum Data {
    F64(Vec<f64>),
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    I16(Vec<i16>),
    I8(Vec<i8>),
    U32(Vec<u32>),
    /// u8, bool (0/1), f8e4m3 and f8e5m2 (encoded).
    U8(Vec<u8>),
}

/// Element types whose all-zero bit pattern is the value 0 (what
/// [`zeroed`] relies on).
trait ZeroBits: Copy {}
impl ZeroBits for f64 {}
impl ZeroBits for f32 {}
impl ZeroBits for f16 {}
impl ZeroBits for bf16 {}
impl ZeroBits for i64 {}
impl ZeroBits for i32 {}
impl ZeroBits for i16 {}
impl ZeroBits for i8 {}
impl ZeroBits for u32 {}
impl ZeroBits for u8 {}

/// `n` zeros from the allocator's zeroed memory; `None` when it has none.
fn zeroed<T: ZeroBits>(n: usize) -> Option<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout's size is not zero.
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` is the global allocator's, with the layout of `n` `T`s
    // (what `Vec` frees it with), and all `n` are initialised: zero bits
    // are the value 0 of every `ZeroBits` type.
    Some(unsafe { Vec::from_raw_parts(p, n, n) })
}

/// Rounds `x` to the nearest value of `dtype` (floats), or converts it the way
/// a float-to-integer cast does (toward zero, saturating at the dtype's range,
/// NaN to 0; bool is `x != 0`).
pub fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        DType::F8E4M3 => f8::e4m3_to_f32(f8::e4m3_from_f32(x as f32)) as f64,
        DType::F8E5M2 => f8::e5m2_to_f32(f8::e5m2_from_f32(x as f32)) as f64,
        DType::Bool => (x != 0.0) as i64 as f64,
        _ => float_to_int(dtype, x) as f64,
    }
}

/// Float to integer as a cast: toward zero, NaN to 0, saturating at i64.
pub(crate) fn float_to_i64(x: f64) -> i64 {
    x as i64
}

/// Float to the integer dtype `dtype` as a cast: toward zero, saturating at
/// the dtype's range, NaN to 0 — what PTX's `cvt.rzi` gives, so the CPU and
/// the GPU agree (a wrapped `1e10` would be a plausible-looking wrong number).
pub fn float_to_int(dtype: DType, x: f64) -> i64 {
    let (lo, hi): (i64, i64) = match dtype {
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::U32 => (0, u32::MAX.into()),
        DType::U8 => (0, u8::MAX.into()),
        DType::Bool => return (x != 0.0) as i64,
        // `as` saturates at i64's range and maps NaN to 0.
        _ => return x as i64,
    };
    if x.is_nan() {
        0
    } else {
        (x as i64).clamp(lo, hi)
    }
}

/// Wraps `x` to the width of the integer dtype (two's complement).
pub fn wrap_int(dtype: DType, x: i64) -> i64 {
    match dtype {
        DType::I32 => x as i32 as i64,
        DType::I16 => x as i16 as i64,
        DType::I8 => x as i8 as i64,
        DType::U32 => x as u32 as i64,
        DType::U8 => x as u8 as i64,
        DType::Bool => (x != 0) as i64,
        _ => x,
    }
}

/// Tensors of at least this many bytes are compared with the memory the
/// system has available before they are allocated (smaller ones are not worth
/// reading `/proc/meminfo` for).
const ASK_SYSTEM_FROM: usize = 64 << 20;

/// The element count of `shape`, checked: E0712 when it, or its size in bytes
/// as `dtype`, does not fit the address space (`isize::MAX` bytes, as for any
/// Rust allocation). Every tensor's storage holds exactly this many elements.
pub fn checked_numel(shape: &[usize], dtype: DType) -> Result<usize, ExecError> {
    if shape.contains(&0) {
        return Ok(0);
    }
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|n| {
            n.checked_mul(dtype.bytes() as usize)
                .is_some_and(|b| b <= isize::MAX as usize)
        })
        .ok_or_else(|| too_large(shape, dtype))
}

/// E0712: a shape whose element count or byte size overflows.
pub(crate) fn too_large(shape: &[usize], dtype: DType) -> ExecError {
    let count = shape
        .iter()
        .try_fold(1u128, |acc, &d| acc.checked_mul(d as u128));
    let why = match count {
        Some(n) if n <= u64::MAX as u128 => format!(
            "{n} elements of {} bytes are {} bytes",
            dtype.bytes(),
            n * dtype.bytes() as u128
        ),
        _ => "the product of its dims does not fit 64 bits".to_string(),
    };
    ExecError::new(
        "E0712",
        format!("a tensor of shape {shape:?} {dtype} is too large: {why}"),
    )
    .with_help(format!(
        "a tensor holds at most {} bytes (2^63 - 1, the address space): the product of the dims times the element size",
        isize::MAX
    ))
}

/// The memory the system can give without swapping, in bytes: `MemAvailable`
/// of `/proc/meminfo` (Linux); `None` where it is unknown.
pub fn memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line
        .trim_start_matches("MemAvailable:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

/// `bytes` with a binary unit (`3.6 GiB`).
pub(crate) fn human_bytes(bytes: u64) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut x = bytes as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < units.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{x:.1} {}", units[u])
    }
}

/// E0713: the memory for a tensor cannot be had. The message is the request
/// (stable); the help says what is available (it varies from run to run).
pub(crate) fn out_of_memory(
    shape: &[usize],
    dtype: DType,
    bytes: usize,
    available: Option<u64>,
) -> ExecError {
    let help = match available {
        Some(a) if bytes as u64 > a => format!(
            "only {} of memory is available (MemAvailable in /proc/meminfo): a tensor larger than that is refused rather than left to swap; use smaller tensors",
            human_bytes(a)
        ),
        Some(a) => format!(
            "the allocator refused the request ({} of memory is available, MemAvailable in /proc/meminfo); use smaller tensors",
            human_bytes(a)
        ),
        None => "the allocator refused the request (the memory available is unknown on this system); use smaller tensors".to_string(),
    };
    ExecError::new(
        "E0713",
        format!(
            "cannot allocate {bytes} bytes ({}) for a tensor of shape {shape:?} {dtype}",
            human_bytes(bytes as u64)
        ),
    )
    .with_help(help)
}

impl Data {
    /// Empty storage of `dtype`'s type with room for `n` elements; `Err` when
    /// the allocator refuses (the memory is reserved first, so a failure is an
    /// error, not an abort).
    fn try_reserved(dtype: DType, n: usize) -> Result<Data, TryReserveError> {
        fn room<T>(n: usize) -> Result<Vec<T>, TryReserveError> {
            let mut v = Vec::new();
            v.try_reserve_exact(n)?;
            Ok(v)
        }
        Ok(match dtype {
            DType::F64 => Data::F64(room(n)?),
            DType::F32 => Data::F32(room(n)?),
            DType::F16 => Data::F16(room(n)?),
            DType::BF16 => Data::BF16(room(n)?),
            DType::I64 => Data::I64(room(n)?),
            DType::I32 => Data::I32(room(n)?),
            DType::I16 => Data::I16(room(n)?),
            DType::I8 => Data::I8(room(n)?),
            DType::U32 => Data::U32(room(n)?),
            DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2 => Data::U8(room(n)?),
        })
    }

    /// Appends zeros up to `len` elements (within the reserved room).
    fn grow_zeroed(&mut self, len: usize) {
        match self {
            Data::F64(v) => v.resize(len, 0.0),
            Data::F32(v) => v.resize(len, 0.0),
            Data::F16(v) => v.resize(len, f16::ZERO),
            Data::BF16(v) => v.resize(len, bf16::ZERO),
            Data::I64(v) => v.resize(len, 0),
            Data::I32(v) => v.resize(len, 0),
            Data::I16(v) => v.resize(len, 0),
            Data::I8(v) => v.resize(len, 0),
            Data::U32(v) => v.resize(len, 0),
            Data::U8(v) => v.resize(len, 0),
        }
    }

    /// Zeroed storage straight from the allocator's zeroed memory
    /// (`calloc`: a large buffer's pages are mapped when first touched), for
    /// tests of huge shapes that touch no element. E0712/E0713 as
    /// [`Data::alloc`].
    #[cfg(test)]
    pub(crate) fn lazy_zeros(shape: &[usize], dtype: DType) -> Result<Data, ExecError> {
        let n = checked_numel(shape, dtype)?;
        Data::empty(dtype)
            .zeroed_like(n)
            .map_err(|_| out_of_memory(shape, dtype, n * dtype.bytes() as usize, None))
    }

    /// Zeroed storage for a tensor of `shape` and `dtype`: the element count
    /// and byte size checked (E0712), the memory asked of the allocator without
    /// aborting (E0713), zeroed a chunk at a time so that `interrupt` stops a
    /// large one (E0706).
    pub(crate) fn alloc(
        shape: &[usize],
        dtype: DType,
        interrupt: &Interrupt,
    ) -> Result<Data, ExecError> {
        let n = checked_numel(shape, dtype)?;
        let bytes = n * dtype.bytes() as usize;
        let available = if bytes >= ASK_SYSTEM_FROM {
            memory_available()
        } else {
            None
        };
        if available.is_some_and(|a| bytes as u64 > a) {
            return Err(out_of_memory(shape, dtype, bytes, available));
        }
        let mut d = Data::try_reserved(dtype, n)
            .map_err(|_| out_of_memory(shape, dtype, bytes, available))?;
        interrupt.chunks(n, |r| d.grow_zeroed(r.end))?;
        Ok(d)
    }

    /// Copies elements `r` of `src` (the same storage type) into `self`.
    fn copy_range(&mut self, src: &Data, r: Range<usize>) {
        macro_rules! go {
            ($($v:ident),*) => {
                match (self, src) {
                    $((Data::$v(d), Data::$v(s)) => d[r.clone()].copy_from_slice(&s[r]),)*
                    _ => unreachable!("same storage type"),
                }
            };
        }
        go!(F64, F32, F16, BF16, I64, I32, I16, I8, U32, U8)
    }

    /// Copies `len` elements of `src` (the same storage type) from `from`
    /// into `self` at `to`.
    fn copy_run(&mut self, to: usize, src: &Data, from: usize, len: usize) {
        macro_rules! go {
            ($($v:ident),*) => {
                match (self, src) {
                    $((Data::$v(d), Data::$v(s)) => d[to..to + len].copy_from_slice(&s[from..from + len]),)*
                    _ => unreachable!("same storage type"),
                }
            };
        }
        go!(F64, F32, F16, BF16, I64, I32, I16, I8, U32, U8)
    }

    /// The size of one stored element in bytes.
    pub(crate) fn elem_bytes(&self) -> usize {
        match self {
            Data::F64(_) | Data::I64(_) => 8,
            Data::F32(_) | Data::I32(_) | Data::U32(_) => 4,
            Data::F16(_) | Data::BF16(_) | Data::I16(_) => 2,
            Data::I8(_) | Data::U8(_) => 1,
        }
    }

    /// No elements, of `dtype`'s representation.
    fn empty(dtype: DType) -> Data {
        match dtype {
            DType::F64 => Data::F64(Vec::new()),
            DType::F32 => Data::F32(Vec::new()),
            DType::F16 => Data::F16(Vec::new()),
            DType::BF16 => Data::BF16(Vec::new()),
            DType::I64 => Data::I64(Vec::new()),
            DType::I32 => Data::I32(Vec::new()),
            DType::I16 => Data::I16(Vec::new()),
            DType::I8 => Data::I8(Vec::new()),
            DType::U32 => Data::U32(Vec::new()),
            DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2 => Data::U8(Vec::new()),
        }
    }

    /// `n` zeros of this data's representation; the layout the allocator
    /// refused otherwise.
    fn zeroed_like(&self, n: usize) -> Result<Data, std::alloc::Layout> {
        fn z<T: ZeroBits>(n: usize) -> Result<Vec<T>, std::alloc::Layout> {
            zeroed(n).ok_or_else(|| {
                std::alloc::Layout::array::<T>(n).unwrap_or(std::alloc::Layout::new::<T>())
            })
        }
        Ok(match self {
            Data::F64(_) => Data::F64(z(n)?),
            Data::F32(_) => Data::F32(z(n)?),
            Data::F16(_) => Data::F16(z(n)?),
            Data::BF16(_) => Data::BF16(z(n)?),
            Data::I64(_) => Data::I64(z(n)?),
            Data::I32(_) => Data::I32(z(n)?),
            Data::I16(_) => Data::I16(z(n)?),
            Data::I8(_) => Data::I8(z(n)?),
            Data::U32(_) => Data::U32(z(n)?),
            Data::U8(_) => Data::U8(z(n)?),
        })
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Data::F64(v) => v.len(),
            Data::F32(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::BF16(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::I16(v) => v.len(),
            Data::I8(v) => v.len(),
            Data::U32(v) => v.len(),
            Data::U8(v) => v.len(),
        }
    }

    /// Element `i` as f64 (`dtype` decodes the bytes of f8 and bool).
    pub(crate) fn get(&self, dtype: DType, i: usize) -> f64 {
        match self {
            Data::F64(v) => v[i],
            Data::F32(v) => v[i] as f64,
            Data::F16(v) => v[i].to_f64(),
            Data::BF16(v) => v[i].to_f64(),
            Data::I64(v) => v[i] as f64,
            Data::I32(v) => v[i] as f64,
            Data::I16(v) => v[i] as f64,
            Data::I8(v) => v[i] as f64,
            Data::U32(v) => v[i] as f64,
            Data::U8(v) => decode_byte(dtype, v[i]),
        }
    }

    /// Sets element `i` to `x` converted to `dtype` (see [`round_to`]).
    pub(crate) fn set(&mut self, dtype: DType, i: usize, x: f64) {
        match self {
            Data::F64(v) => v[i] = x,
            Data::F32(v) => v[i] = x as f32,
            Data::F16(v) => v[i] = f16::from_f64(x),
            Data::BF16(v) => v[i] = bf16::from_f64(x),
            Data::I64(v) => v[i] = float_to_i64(x),
            Data::I32(v) => v[i] = float_to_int(DType::I32, x) as i32,
            Data::I16(v) => v[i] = float_to_int(DType::I16, x) as i16,
            Data::I8(v) => v[i] = float_to_int(DType::I8, x) as i8,
            Data::U32(v) => v[i] = float_to_int(DType::U32, x) as u32,
            Data::U8(v) => v[i] = encode_byte(dtype, x),
        }
    }
}

impl Data {
    /// Sets every element from `f(start, out)`, which writes the values of
    /// elements `start..start + out.len()`; blocks of elements are filled in
    /// parallel, each converted to `dtype` as [`Data::set`] converts, with
    /// `interrupt` polled per block (E0706).
    pub(crate) fn par_fill(
        &mut self,
        dtype: DType,
        interrupt: &Interrupt,
        f: impl Fn(usize, &mut [f64]) + Sync,
    ) -> Result<(), ExecError> {
        use rayon::prelude::*;
        // Even, so that a block holds whole pairs of a pairwise generator.
        const BLOCK: usize = 1 << 13;
        fn fill<T: Send>(
            v: &mut [T],
            interrupt: &Interrupt,
            f: &(impl Fn(usize, &mut [f64]) + Sync),
            conv: impl Fn(f64) -> T + Sync,
        ) -> Result<(), ExecError> {
            v.par_chunks_mut(BLOCK)
                .enumerate()
                .try_for_each_init(Vec::new, |buf, (k, out)| {
                    interrupt.check()?;
                    buf.clear();
                    buf.resize(out.len(), 0.0);
                    f(k * BLOCK, buf);
                    for (o, x) in out.iter_mut().zip(buf.iter()) {
                        *o = conv(*x);
                    }
                    Ok(())
                })
        }
        match self {
            Data::F64(v) => fill(v, interrupt, &f, |x| x),
            Data::F32(v) => fill(v, interrupt, &f, |x| x as f32),
            Data::F16(v) => fill(v, interrupt, &f, f16::from_f64),
            Data::BF16(v) => fill(v, interrupt, &f, bf16::from_f64),
            Data::I64(v) => fill(v, interrupt, &f, float_to_i64),
            Data::I32(v) => fill(v, interrupt, &f, |x| float_to_int(DType::I32, x) as i32),
            Data::I16(v) => fill(v, interrupt, &f, |x| float_to_int(DType::I16, x) as i16),
            Data::I8(v) => fill(v, interrupt, &f, |x| float_to_int(DType::I8, x) as i8),
            Data::U32(v) => fill(v, interrupt, &f, |x| float_to_int(DType::U32, x) as u32),
            Data::U8(v) => fill(v, interrupt, &f, |x| encode_byte(dtype, x)),
        }
    }

    /// Element `i` of integer storage as an i64, exactly (`dtype` tells bool
    /// and u8 bytes apart from f8 ones, which are read as their value).
    pub(crate) fn get_int(&self, dtype: DType, i: usize) -> i64 {
        match self {
            Data::I64(v) => v[i],
            Data::I32(v) => v[i].into(),
            Data::I16(v) => v[i].into(),
            Data::I8(v) => v[i].into(),
            Data::U32(v) => v[i].into(),
            Data::U8(v) if !dtype.is_float() => v[i].into(),
            _ => self.get(dtype, i) as i64,
        }
    }

    /// Sets element `i` of an integer tensor to `x` wrapped to `dtype`'s width
    /// (as an integer cast), without going through f64.
    pub(crate) fn set_int(&mut self, dtype: DType, i: usize, x: i64) {
        let w = wrap_int(dtype, x);
        match self {
            Data::I64(v) => v[i] = w,
            Data::I32(v) => v[i] = w as i32,
            Data::I16(v) => v[i] = w as i16,
            Data::I8(v) => v[i] = w as i8,
            Data::U32(v) => v[i] = w as u32,
            Data::U8(v) if !dtype.is_float() => v[i] = w as u8,
            _ => self.set(dtype, i, x as f64),
        }
    }
}

pub(crate) fn decode_byte(dtype: DType, b: u8) -> f64 {
    match dtype {
        DType::F8E4M3 => f8::e4m3_to_f32(b) as f64,
        DType::F8E5M2 => f8::e5m2_to_f32(b) as f64,
        DType::Bool => (b != 0) as i64 as f64,
        _ => b as f64,
    }
}

pub(crate) fn encode_byte(dtype: DType, x: f64) -> u8 {
    match dtype {
        DType::F8E4M3 => f8::e4m3_from_f32(x as f32),
        DType::F8E5M2 => f8::e5m2_from_f32(x as f32),
        DType::Bool => (x != 0.0) as u8,
        _ => float_to_int(DType::U8, x) as u8,
    }
}

/// A tensor value: shape, dtype and shared storage (clones alias).
#[derive(Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    dtype: DType,
    pub(crate) storage: Arc<Storage>,
}

/// One position of `t[...]`.
#[derive(Clone, Debug, PartialEq)]
pub enum IndexItem {
    /// An integer (negative counts from the end); drops the axis.
    Int(i64),
    /// `start:stop:step`, each optional as in Python.
    Slice {
        start: Option<i64>,
        stop: Option<i64>,
        step: Option<i64>,
    },
    /// `None`: a new axis of size 1.
    NewAxis,
}

impl IndexItem {
    /// `:`.
    pub fn full() -> IndexItem {
        IndexItem::Slice {
            start: None,
            stop: None,
            step: None,
        }
    }
}

impl Tensor {
    /// The tensor of `shape` over `data`, which holds exactly the shape's
    /// element count (the invariant launches rely on: see `cpu::Mem`).
    pub(crate) fn from_data(shape: &[usize], dtype: DType, data: Data) -> Tensor {
        assert_eq!(
            Some(data.len()),
            checked_numel(shape, dtype).ok(),
            "Tensor::from_data: the storage does not hold the shape's elements"
        );
        Tensor {
            shape: shape.to_vec(),
            dtype,
            storage: Storage::new(data),
        }
    }

    /// The same memory seen with another shape of the same element count
    /// (Schedule IR views, `reshape`); `None` when the counts differ (or the
    /// new shape's overflows).
    pub fn view(&self, shape: &[usize]) -> Option<Tensor> {
        (checked_numel(shape, self.dtype).ok() == Some(self.numel())).then(|| Tensor {
            shape: shape.to_vec(),
            dtype: self.dtype,
            storage: self.storage.clone(),
        })
    }

    /// Zeros; E0712 when the shape's size overflows, E0713 when the memory
    /// cannot be had, E0706 when `interrupt` stops it. Every host loop over
    /// elements below polls `interrupt` every `POLL_EVERY` elements.
    pub fn try_zeros(
        shape: &[usize],
        dtype: DType,
        interrupt: &Interrupt,
    ) -> Result<Tensor, ExecError> {
        Ok(Tensor::from_data(
            shape,
            dtype,
            Data::alloc(shape, dtype, interrupt)?,
        ))
    }

    /// Every element `value` (converted to `dtype` as a cast does); errors as
    /// [`Tensor::try_zeros`].
    pub fn try_full(
        shape: &[usize],
        dtype: DType,
        value: f64,
        interrupt: &Interrupt,
    ) -> Result<Tensor, ExecError> {
        let mut d = Data::alloc(shape, dtype, interrupt)?;
        let x = round_to(dtype, value);
        interrupt.chunks(d.len(), |r| {
            for i in r {
                d.set(dtype, i, x);
            }
        })?;
        Ok(Tensor::from_data(shape, dtype, d))
    }

    /// `[start, end)` with step 1, as a 1-D tensor; errors as [`Tensor::try_zeros`].
    pub fn try_arange(
        start: i64,
        end: i64,
        dtype: DType,
        interrupt: &Interrupt,
    ) -> Result<Tensor, ExecError> {
        // `end - start` may not fit an i64 (`arange(-2**63, 2**63 - 1)`).
        let n = (end as i128 - start as i128).max(0);
        let n = usize::try_from(n).map_err(|_| too_large(&[usize::MAX], dtype))?;
        let mut d = Data::alloc(&[n], dtype, interrupt)?;
        interrupt.chunks(n, |r| {
            for i in r {
                d.set(dtype, i, (start + i as i64) as f64);
            }
        })?;
        Ok(Tensor::from_data(&[n], dtype, d))
    }

    /// A tensor of `shape` holding `data` (row-major) converted to `dtype`;
    /// E0713 when the memory cannot be had. Panics when the lengths differ (a
    /// caller bug, not a user error).
    pub fn try_from_f64(
        shape: &[usize],
        dtype: DType,
        data: &[f64],
        interrupt: &Interrupt,
    ) -> Result<Tensor, ExecError> {
        assert_eq!(
            checked_numel(shape, dtype).ok(),
            Some(data.len()),
            "Tensor::from_f64: shape and data length differ"
        );
        let mut d = Data::alloc(shape, dtype, interrupt)?;
        interrupt.chunks(data.len(), |r| {
            for i in r {
                d.set(dtype, i, data[i]);
            }
        })?;
        Ok(Tensor::from_data(shape, dtype, d))
    }

    // The constructors below are for tests and for sizes the caller has
    // already allocated once: they panic where the `try_` ones return an error.

    pub fn zeros(shape: &[usize], dtype: DType) -> Tensor {
        Tensor::try_zeros(shape, dtype, &Interrupt::new()).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn ones(shape: &[usize], dtype: DType) -> Tensor {
        Tensor::full(shape, dtype, 1.0)
    }

    pub fn full(shape: &[usize], dtype: DType, value: f64) -> Tensor {
        Tensor::try_full(shape, dtype, value, &Interrupt::new()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Uninitialised as far as the language goes; the CPU zero-fills it.
    pub fn empty(shape: &[usize], dtype: DType) -> Tensor {
        Tensor::zeros(shape, dtype)
    }

    pub fn arange(start: i64, end: i64, dtype: DType) -> Tensor {
        Tensor::try_arange(start, end, dtype, &Interrupt::new()).unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn from_f64(shape: &[usize], dtype: DType, data: &[f64]) -> Tensor {
        Tensor::try_from_f64(shape, dtype, data, &Interrupt::new())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn to_f64_vec(&self) -> Vec<f64> {
        let d = self.storage.data();
        (0..self.numel()).map(|i| d.get(self.dtype, i)).collect()
    }

    /// Element `i` (row-major) of an integer or bool tensor, exactly: an i64
    /// above 2^53 does not survive the f64 of [`Tensor::to_f64_vec`]. `None`
    /// for float dtypes.
    pub fn int_at(&self, i: usize) -> Option<i64> {
        (!self.dtype.is_float()).then(|| self.storage.data().get_int(self.dtype, i))
    }

    /// A tensor of `shape` holding the integers `data` (row-major) wrapped to
    /// the integer dtype `dtype`, exactly (no f64 on the way); errors as
    /// [`Tensor::try_from_f64`].
    pub fn try_from_ints(
        shape: &[usize],
        dtype: DType,
        data: &[i64],
        interrupt: &Interrupt,
    ) -> Result<Tensor, ExecError> {
        assert_eq!(
            checked_numel(shape, dtype).ok(),
            Some(data.len()),
            "Tensor::from_ints: shape and data length differ"
        );
        let mut d = Data::alloc(shape, dtype, interrupt)?;
        interrupt.chunks(data.len(), |r| {
            for i in r {
                d.set_int(dtype, i, data[i]);
            }
        })?;
        Ok(Tensor::from_data(shape, dtype, d))
    }

    /// The f32 elements, without a round trip through f64 when stored as f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self.storage.data() {
            Data::F32(v) => v.clone(),
            _ => self.to_f64_vec().iter().map(|x| *x as f32).collect(),
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Zeros on both sides: lazily zeroed host memory and a zeroed device
    /// `buf` (neither is copied to the other).
    pub(crate) fn zeros_on_device(
        shape: &[usize],
        dtype: DType,
        alloc: impl FnOnce(usize) -> Result<Box<dyn DeviceBuffer>, ExecError>,
    ) -> Result<Tensor, ExecError> {
        // The GPU first: its refusal is the common one, and cheap.
        let bytes = checked_numel(shape, dtype)? * dtype.bytes() as usize;
        let buf = alloc(bytes)?;
        // The host copy is not touched until read, but it must fit when it
        // is (a read-back may not fail): refused as `Data::alloc` refuses.
        if bytes >= ASK_SYSTEM_FROM {
            if let Some(a) = memory_available().filter(|a| bytes as u64 > *a) {
                return Err(out_of_memory(shape, dtype, bytes, Some(a)));
            }
        }
        buf.zero()?;
        Ok(Tensor::on_device(
            shape,
            dtype,
            Mirror {
                buf,
                current: Current::Both,
            },
        ))
    }

    /// A tensor whose elements a GPU is about to write into `buf` (a block
    /// of `shape`'s bytes, contents undefined): the device copy is the
    /// current one, the host's (lazily zeroed) is read back when the host
    /// reads the tensor. No byte is written here.
    pub(crate) fn written_on_device(
        shape: &[usize],
        dtype: DType,
        buf: Box<dyn DeviceBuffer>,
    ) -> Result<Tensor, ExecError> {
        let bytes = checked_numel(shape, dtype)? * dtype.bytes() as usize;
        // Refused as `zeros_on_device` refuses: a read-back may not fail.
        if bytes >= ASK_SYSTEM_FROM {
            if let Some(a) = memory_available().filter(|a| bytes as u64 > *a) {
                return Err(out_of_memory(shape, dtype, bytes, Some(a)));
            }
        }
        Ok(Tensor::on_device(
            shape,
            dtype,
            Mirror {
                buf,
                current: Current::Device,
            },
        ))
    }

    /// A tensor whose elements are in `mirror` (its host copy made at the
    /// first host access); the shape's size was checked by the caller.
    fn on_device(shape: &[usize], dtype: DType, mirror: Mirror) -> Tensor {
        let numel = shape.iter().product();
        Tensor {
            shape: shape.to_vec(),
            dtype,
            storage: Storage::on_device(Data::empty(dtype), numel, mirror),
        }
    }

    /// The GPU context that holds a copy of the elements, if one does.
    pub fn device_owner(&self) -> Option<u64> {
        self.storage.device_owner()
    }

    /// Brings the elements to the host and frees their GPU copy (every
    /// alias moves with it).
    pub fn to_host(&self) {
        self.storage.to_host()
    }

    /// Drops the copy on GPU context `owner` without reading it (the context
    /// died); true when only that copy held the current elements.
    pub fn forget_device(&self, owner: u64) -> bool {
        self.storage.forget_device(owner)
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether two tensors share memory (`b = a`).
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// A copy converted to `dtype` (floats round to nearest, float to integer
    /// truncates toward zero and saturates with NaN to 0, integers wrap, bool
    /// is `x != 0`).
    pub fn to(&self, dtype: DType) -> Tensor {
        self.try_to(dtype, &Interrupt::new())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Tensor::to`]; E0713 when the memory for the copy cannot be had.
    pub fn try_to(&self, dtype: DType, interrupt: &Interrupt) -> Result<Tensor, ExecError> {
        if dtype == self.dtype {
            return self.try_deep_clone(interrupt);
        }
        let mut d = Data::alloc(&self.shape, dtype, interrupt)?;
        let src = self.storage.data();
        // Integer to integer wraps (as a cast in C); everything else goes
        // through `Data::set`, which saturates floats into integers.
        let wrap = self.dtype.is_int() && dtype.is_int();
        interrupt.chunks(d.len(), |r| {
            for i in r {
                if wrap {
                    d.set_int(dtype, i, src.get_int(self.dtype, i));
                } else {
                    d.set(dtype, i, src.get(self.dtype, i));
                }
            }
        })?;
        Ok(Tensor::from_data(&self.shape, dtype, d))
    }

    /// Overwrites every element with `src`'s (same element count and dtype),
    /// visible through every alias; E0706 when `interrupt` stops it part way.
    pub fn assign(&self, src: &Tensor, interrupt: &Interrupt) -> Result<(), ExecError> {
        assert_eq!(self.numel(), src.numel(), "Tensor::assign: sizes differ");
        assert_eq!(self.dtype, src.dtype, "Tensor::assign: dtypes differ");
        if self.same_storage(src) {
            return Ok(());
        }
        let from = src.storage.data();
        // Synced first: an interrupted copy leaves the rest as it was.
        self.storage.sync_host();
        self.storage.host_written();
        // SAFETY: no launch is running (see the module docs); the vector keeps
        // its length, so pointers taken for later launches stay valid.
        let dst = unsafe { self.storage.host_slot() };
        interrupt.chunks(from.len(), |r| dst.copy_range(from, r))
    }

    /// `assign` from a tensor current on the same GPU as this one's device
    /// copy, device to device; false (nothing done) when either is not there.
    pub(crate) fn assign_on_device(&self, src: &Tensor) -> Result<bool, ExecError> {
        if self.same_storage(src) || self.numel() != src.numel() || self.dtype != src.dtype {
            return Ok(false);
        }
        let from = src.storage.mirror();
        let mut to = self.storage.mirror();
        let (Some(f), Some(t)) = (from.as_ref(), to.as_mut()) else {
            return Ok(false);
        };
        if f.buf.owner() != t.buf.owner() || f.current == Current::Host {
            return Ok(false);
        }
        t.buf.copy_from_device(&*f.buf)?;
        t.current = Current::Device;
        Ok(true)
    }

    /// Elements `start..start + len` of `axis` (a copy): the rows of one
    /// shard. The caller keeps the range within the axis.
    pub fn narrow(
        &self,
        axis: usize,
        start: usize,
        len: usize,
        interrupt: &Interrupt,
    ) -> Result<Tensor, ExecError> {
        let dim = self.shape[axis];
        debug_assert!(start + len <= dim);
        let inner: usize = self.shape[axis + 1..].iter().product();
        let outer: usize = self.shape[..axis].iter().product();
        let mut shape = self.shape.clone();
        shape[axis] = len;
        let src = self.storage.data();
        let mut d = Data::alloc(&shape, self.dtype, interrupt)?;
        let run = len * inner;
        for o in 0..outer {
            interrupt.check()?;
            d.copy_run(o * run, src, (o * dim + start) * inner, run);
        }
        Ok(Tensor::from_data(&shape, self.dtype, d))
    }

    /// `parts` one after the other along `axis` (same dtype; the other dims
    /// equal, which the caller guarantees).
    pub fn concat(
        parts: &[&Tensor],
        axis: usize,
        interrupt: &Interrupt,
    ) -> Result<Tensor, ExecError> {
        let first = parts.first().expect("concat of no tensors");
        let mut shape = first.shape.clone();
        shape[axis] = parts.iter().map(|p| p.shape[axis]).sum();
        let dim = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let outer: usize = shape[..axis].iter().product();
        let mut d = Data::alloc(&shape, first.dtype, interrupt)?;
        let mut start = 0;
        for p in parts {
            debug_assert_eq!(p.dtype, first.dtype);
            let src = p.storage.data();
            let run = p.shape[axis] * inner;
            for o in 0..outer {
                interrupt.check()?;
                d.copy_run((o * dim + start) * inner, src, o * run, run);
            }
            start += p.shape[axis];
        }
        Ok(Tensor::from_data(&shape, first.dtype, d))
    }

    /// The elementwise combination of same-shape, same-dtype tensors by
    /// `f` over their f64 values (integers exactly, through i64, by `int`),
    /// rounded once to the dtype.
    pub(crate) fn combine(
        parts: &[&Tensor],
        float: impl Fn(&[f64]) -> f64,
        int: impl Fn(&[i64]) -> i64,
        interrupt: &Interrupt,
    ) -> Result<Tensor, ExecError> {
        let first = parts.first().expect("combine of no tensors");
        let (shape, dtype) = (first.shape.clone(), first.dtype);
        let datas: Vec<&Data> = parts.iter().map(|p| p.storage.data()).collect();
        let mut d = Data::alloc(&shape, dtype, interrupt)?;
        let exact_int = !dtype.is_float() && dtype != DType::Bool;
        let mut fs = vec![0.0; parts.len()];
        let mut is = vec![0i64; parts.len()];
        interrupt.chunks(d.len(), |r| {
            for i in r {
                if exact_int {
                    for (x, s) in is.iter_mut().zip(&datas) {
                        *x = s.get_int(dtype, i);
                    }
                    d.set_int(dtype, i, int(&is));
                } else {
                    for (x, s) in fs.iter_mut().zip(&datas) {
                        *x = s.get(dtype, i);
                    }
                    d.set(dtype, i, float(&fs));
                }
            }
        })?;
        Ok(Tensor::from_data(&shape, dtype, d))
    }

    /// A copy with its own storage.
    pub fn deep_clone(&self) -> Tensor {
        self.try_deep_clone(&Interrupt::new())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Tensor::deep_clone`]; E0713 when the memory for the copy cannot be had.
    pub fn try_deep_clone(&self, interrupt: &Interrupt) -> Result<Tensor, ExecError> {
        let mut data = Data::alloc(&self.shape, self.dtype, interrupt)?;
        let src = self.storage.data();
        interrupt.chunks(src.len(), |r| data.copy_range(src, r))?;
        Ok(Tensor::from_data(&self.shape, self.dtype, data))
    }

    /// `t[idx]`: integers (negative from the end), slices `a:b:step` (steps may
    /// be negative, bounds clamp as in Python), `None` (new axis); axes not
    /// named are taken whole. Returns a copy.
    pub fn index(&self, idx: &[IndexItem], interrupt: &Interrupt) -> Result<Tensor, ExecError> {
        let (offsets, out_shape) = self.select(idx, interrupt)?;
        let src = self.storage.data();
        let mut d = Data::alloc(&out_shape, self.dtype, interrupt)?;
        interrupt.chunks(offsets.len(), |r| {
            copy_elements(src, &offsets[r.clone()], &mut d, r.start)
        })?;
        Ok(Tensor::from_data(&out_shape, self.dtype, d))
    }

    /// `t[idx] = value`: writes `value` (a number, or a tensor that broadcasts
    /// to the indexed part's shape and whose dtype widens to `t`'s) into the
    /// elements `idx` selects. Copy-on-write: when other values share `t`'s
    /// storage (`b = t` earlier), `t` gets its own copy first, so they keep the
    /// old elements.
    pub fn set_index(
        &mut self,
        idx: &[IndexItem],
        value: &Value,
        interrupt: &Interrupt,
    ) -> Result<(), ExecError> {
        let (offsets, part) = self.select(idx, interrupt)?;
        let dtype = self.dtype;
        // Integers stored into an integer tensor stay integers: an i64 above
        // 2^53 does not survive a round trip through f64.
        let mut ints: Option<Vec<i64>> = None;
        let elements: Vec<f64> = match value {
            Value::Int(_) | Value::Float(_) | Value::Bool(_) => {
                let (x, kind) = match value {
                    Value::Int(i) => (*i as f64, "int"),
                    Value::Float(x) => (*x, "float"),
                    Value::Bool(b) => (*b as i64 as f64, "bool"),
                    _ => unreachable!(),
                };
                let fits = match value {
                    Value::Float(_) => dtype.is_float(),
                    Value::Bool(_) => dtype == DType::Bool,
                    // Integers must be representable exactly (no silent wrap).
                    _ => dtype != DType::Bool && (dtype.is_float() || round_to(dtype, x) == x),
                };
                if !fits {
                    return Err(ExecError::new(
                        "E0727",
                        format!("cannot store the {kind} {value} in a tensor of dtype {dtype}"),
                    )
                    .with_help(match (kind, dtype.is_float()) {
                        ("int", false) if dtype != DType::Bool => {
                            format!("{value} is out of the range of {dtype}")
                        }
                        _ => "store a value of the tensor's kind, or convert the tensor first with `.to(...)`".to_string(),
                    }));
                }
                if let (Value::Int(i), true) = (value, dtype.is_int()) {
                    ints = Some(vec![*i]);
                }
                vec![x]
            }
            Value::Tensor(v) => {
                if !v.dtype.widens_to(dtype) {
                    return Err(ExecError::new(
                        "E0727",
                        format!(
                            "cannot store {} in a tensor of dtype {dtype}: {} does not widen to {dtype}",
                            crate::diag::with_article(&format!("{} tensor", v.dtype)),
                            v.dtype
                        ),
                    )
                    .with_help(format!("convert the value first: `value.to({dtype})`")));
                }
                let Some(map) = broadcast_offsets(v.shape(), &part, interrupt)? else {
                    return Err(ExecError::new(
                        "E0726",
                        format!(
                            "a value of shape {:?} does not fit the indexed part of shape {part:?}",
                            v.shape()
                        ),
                    )
                    .with_help(
                        "the value's shape must equal the part's, or broadcast to it (dims of size 1 stretch)",
                    ));
                };
                let src = v.storage.data();
                let mut out = Vec::new();
                out.try_reserve_exact(map.len()).map_err(|_| {
                    out_of_memory(&part, DType::F64, map.len() * 8, memory_available())
                })?;
                if dtype.is_int() && v.dtype.is_int() {
                    let mut is = Vec::new();
                    interrupt.chunks(map.len(), |r| {
                        is.extend(map[r].iter().map(|i| src.get_int(v.dtype, *i)))
                    })?;
                    ints = Some(is);
                } else {
                    interrupt.chunks(map.len(), |r| {
                        out.extend(map[r].iter().map(|i| src.get(v.dtype, *i)))
                    })?;
                }
                out
            }
            other => {
                return Err(ExecError::new(
                    "E0727",
                    format!("cannot store {} in a tensor", other.describe()),
                )
                .with_help("store a number or a tensor"))
            }
        };
        if Arc::get_mut(&mut self.storage).is_none() {
            self.storage = self.try_deep_clone(interrupt)?.storage;
        }
        let storage = Arc::get_mut(&mut self.storage).expect("storage was just made unique");
        // Part of the elements change: the rest must be current on the host.
        storage.sync_host();
        storage.host_written();
        // SAFETY: the storage is unique (`get_mut` above): no other
        // reference to its elements exists.
        let data = unsafe { storage.host_slot() };
        interrupt.chunks(offsets.len(), |r| {
            for k in r {
                match &ints {
                    Some(is) => {
                        data.set_int(dtype, offsets[k], is[if is.len() == 1 { 0 } else { k }])
                    }
                    None => {
                        let x = if elements.len() == 1 {
                            elements[0]
                        } else {
                            elements[k]
                        };
                        data.set(dtype, offsets[k], x);
                    }
                }
            }
        })
    }

    /// The storage offsets `idx` selects, in row-major order of the result,
    /// and the result's shape.
    fn select(
        &self,
        idx: &[IndexItem],
        interrupt: &Interrupt,
    ) -> Result<(Vec<usize>, Vec<usize>), ExecError> {
        let named = idx
            .iter()
            .filter(|i| !matches!(i, IndexItem::NewAxis))
            .count();
        if named > self.shape.len() {
            // The checker's code for the same mistake.
            return Err(ExecError::new(
                "E0410",
                format!(
                    "too many indices: {named} for a tensor of rank {}",
                    self.shape.len()
                ),
            )
            .with_help("index at most one position per axis"));
        }
        // Per source axis: the source positions taken (None: the axis is dropped).
        let mut picks: Vec<(Vec<usize>, bool)> = Vec::new();
        let mut out_shape = Vec::new();
        let mut axis = 0;
        for it in idx {
            match it {
                IndexItem::NewAxis => out_shape.push(1),
                IndexItem::Int(i) => {
                    let n = self.shape[axis] as i64;
                    let j = if *i < 0 { i + n } else { *i };
                    if j < 0 || j >= n {
                        return Err(ExecError::new(
                            "E0705",
                            format!("index {i} is out of bounds for axis {axis} of size {n}"),
                        )
                        .with_help(format!("valid indices are -{n} to {}", n - 1)));
                    }
                    picks.push((vec![j as usize], false));
                    axis += 1;
                }
                IndexItem::Slice { start, stop, step } => {
                    let n = self.shape[axis] as i64;
                    let step = step.unwrap_or(1);
                    if step == 0 {
                        return Err(ExecError::new("E0705", "slice step cannot be zero")
                            .with_help("use a positive or negative step"));
                    }
                    let clamp = |v: i64, lo: i64, hi: i64| v.clamp(lo, hi);
                    let norm = |v: i64| if v < 0 { v + n } else { v };
                    // `count` positions `a, a + step, ...` (within the axis).
                    let (a, count) = if step > 0 {
                        let a = start.map_or(0, |s| clamp(norm(s), 0, n));
                        let b = stop.map_or(n, |s| clamp(norm(s), 0, n));
                        (a, ((b - a).max(0) as u64).div_ceil(step as u64))
                    } else {
                        let a = start.map_or(n - 1, |s| clamp(norm(s), -1, n - 1));
                        let b = stop.map_or(-1, |s| clamp(norm(s), -1, n - 1));
                        (a, ((a - b).max(0) as u64).div_ceil(step.unsigned_abs()))
                    };
                    let pos = positions(a, step, count as usize, interrupt)?;
                    out_shape.push(pos.len());
                    picks.push((pos, true));
                    axis += 1;
                }
            }
        }
        while axis < self.shape.len() {
            out_shape.push(self.shape[axis]);
            picks.push((positions(0, 1, self.shape[axis], interrupt)?, true));
            axis += 1;
        }
        let strides = strides(&self.shape);
        let mut offsets = vec![0usize];
        for (a, (pos, _)) in picks.iter().enumerate() {
            // At most the tensor's element count (each axis picks positions of
            // its own), but 8 bytes each: asked for without aborting.
            let mut next = Vec::new();
            next.try_reserve_exact(offsets.len() * pos.len())
                .map_err(|_| {
                    // The table of offsets is an i64 tensor of the result's shape.
                    let bytes = offsets.len() * pos.len() * 8;
                    out_of_memory(&out_shape, DType::I64, bytes, memory_available())
                })?;
            interrupt.chunks(offsets.len(), |r| {
                for o in &offsets[r] {
                    for p in pos {
                        next.push(o + p * strides[a]);
                    }
                }
            })?;
            offsets = next;
        }
        Ok((offsets, out_shape))
    }
}

/// `count` positions `first, first + step, ...` of one axis (within it), asked
/// for without aborting and filled a chunk at a time (`interrupt`).
fn positions(
    first: i64,
    step: i64,
    count: usize,
    interrupt: &Interrupt,
) -> Result<Vec<usize>, ExecError> {
    let mut v = Vec::new();
    v.try_reserve_exact(count)
        .map_err(|_| out_of_memory(&[count], DType::I64, count * 8, memory_available()))?;
    interrupt.chunks(count, |r| {
        v.extend(r.map(|j| (first + j as i64 * step) as usize));
    })?;
    Ok(v)
}

/// For each element of `to` (row-major), the element of a value of shape
/// `from` that broadcasts to it; `None` when `from` does not broadcast to `to`.
fn broadcast_offsets(
    from: &[usize],
    to: &[usize],
    interrupt: &Interrupt,
) -> Result<Option<Vec<usize>>, ExecError> {
    if from.len() > to.len() {
        // Leading dims of size 1 may be dropped (`x[0:1, :]` into a row).
        let extra = from.len() - to.len();
        if from[..extra].iter().any(|d| *d != 1) {
            return Ok(None);
        }
        return broadcast_offsets(&from[extra..], to, interrupt);
    }
    let lead = to.len() - from.len();
    let fs = strides(from);
    // The source stride of each target axis (0 where it broadcasts).
    let mut st = vec![0usize; to.len()];
    for (i, d) in from.iter().enumerate() {
        match (*d, to[lead + i]) {
            (a, b) if a == b => st[lead + i] = fs[i],
            (1, _) => {}
            _ => return Ok(None),
        }
    }
    let n: usize = to.iter().product();
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| out_of_memory(to, DType::I64, n * 8, memory_available()))?;
    let ts = strides(to);
    interrupt.chunks(n, |r| {
        for k in r {
            let mut o = 0;
            for a in 0..to.len() {
                o += (k / ts[a]) % to[a] * st[a];
            }
            out.push(o);
        }
    })?;
    Ok(Some(out))
}

/// `dst[at + i] = src[offsets[i]]` for one storage type (no conversion).
fn copy_elements(src: &Data, offsets: &[usize], dst: &mut Data, at: usize) {
    macro_rules! go {
        ($($v:ident),*) => {
            match (src, dst) {
                $((Data::$v(s), Data::$v(d)) => {
                    for (x, o) in d[at..].iter_mut().zip(offsets) {
                        *x = s[*o];
                    }
                })*
                _ => unreachable!("same dtype"),
            }
        };
    }
    go!(F64, F32, F16, BF16, I64, I32, I16, I8, U32, U8)
}

pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

#[cfg(test)]
mod tests;
