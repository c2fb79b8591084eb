//! `.npy` files (NumPy format versions 1.0, 2.0 and 3.0 read; 1.0 written, or
//! 2.0 when the header needs it): C order, little-endian.
//!
//! Dtypes map one to one (`<f8 <f4 <f2 <i8 <i4 <i2 |i1 <u4 |u1 |b1`), except
//! the formats numpy has no dtype for: bf16 and the f8 formats are saved as
//! `<f4` (exactly: every value of theirs is an f32), so loading gives f32.
//! Fortran-order files are refused with an error.

use std::path::Path;

use half::f16;

use super::tensor::{checked_numel, Data, Tensor};
use super::{ExecError, Interrupt};
use crate::check::DType;

const MAGIC: &[u8] = b"\x93NUMPY";

fn err(path: &Path, msg: impl Into<String>) -> ExecError {
    ExecError::new(
        "E0708",
        format!("cannot read `{}`: {}", path.display(), msg.into()),
    )
    .with_help(
        "load_npy reads C-order .npy files of numeric or bool dtype, as numpy.save writes them",
    )
}

fn descr(d: DType) -> &'static str {
    match d {
        DType::F64 => "<f8",
        DType::F32 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => "<f4",
        DType::F16 => "<f2",
        DType::I64 => "<i8",
        DType::I32 => "<i4",
        DType::I16 => "<i2",
        DType::I8 => "|i1",
        DType::U32 => "<u4",
        DType::U8 => "|u1",
        DType::Bool => "|b1",
    }
}

/// Writes `t` to `path` as `.npy` (bf16 and f8 as f32; see the module docs).
pub fn save_npy(t: &Tensor, path: &Path, interrupt: &Interrupt) -> Result<(), ExecError> {
    let shape = match t.shape() {
        [] => "()".to_string(),
        [n] => format!("({n},)"),
        s => format!(
            "({})",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr(t.dtype())
    );
    // The header (after the magic, version and length) is padded with spaces
    // and a newline to a multiple of 64 bytes in total.
    let mut out = MAGIC.to_vec();
    let v1 = dict.len() + 1 + 10 <= 65535 + 10;
    let prefix = if v1 { 10 } else { 12 };
    let total = (prefix + dict.len() + 1).div_ceil(64) * 64;
    let hlen = total - prefix;
    if v1 {
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(hlen as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&[2, 0]);
        out.extend_from_slice(&(hlen as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    let data = t.storage.data();
    let dtype = t.dtype();
    macro_rules! le {
        ($v:expr, $r:expr) => {
            $v[$r]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()))
        };
    }
    // Encoded a chunk at a time, so that `interrupt` stops a large one.
    interrupt.chunks(data.len(), |r| match data {
        Data::F64(v) => le!(v, r),
        Data::F32(v) => le!(v, r),
        Data::F16(v) => le!(v, r),
        Data::I64(v) => le!(v, r),
        Data::I32(v) => le!(v, r),
        Data::I16(v) => le!(v, r),
        Data::I8(v) => le!(v, r),
        Data::U32(v) => le!(v, r),
        Data::BF16(_) | Data::U8(_)
            if matches!(dtype, DType::BF16 | DType::F8E4M3 | DType::F8E5M2) =>
        {
            r.for_each(|i| out.extend_from_slice(&(data.get(dtype, i) as f32).to_le_bytes()))
        }
        Data::U8(v) => out.extend_from_slice(&v[r]),
        Data::BF16(_) => unreachable!("bf16 storage has dtype bf16"),
    })?;
    std::fs::write(path, out).map_err(|e| {
        ExecError::new("E0708", format!("cannot write `{}`: {e}", path.display()))
            .with_help("check that the directory exists and is writable")
    })
}

/// Reads a `.npy` file written by numpy (or `save_npy`).
pub fn load_npy(path: &Path, interrupt: &Interrupt) -> Result<Tensor, ExecError> {
    let bytes = std::fs::read(path).map_err(|e| {
        let msg = e.to_string();
        let msg = msg.find(" (os error").map_or(msg.as_str(), |i| &msg[..i]);
        ExecError::new("E0708", format!("cannot read `{}`: {msg}", path.display()))
            .with_help("paths are relative to the directory `tessera` started in")
    })?;
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(err(path, "not a .npy file (no \\x93NUMPY magic)"));
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(err(path, format!("unknown .npy version {v}"))),
    };
    let header = bytes
        .get(start..start + hlen)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(|| err(path, "truncated or unreadable header"))?;
    let field = |key: &str| -> Option<&str> {
        let i = header.find(&format!("'{key}'"))? + key.len() + 2;
        let rest = header[i..].trim_start().strip_prefix(':')?.trim_start();
        Some(rest)
    };
    let descr = field("descr")
        .and_then(|r| r.strip_prefix('\''))
        .and_then(|r| r.split('\'').next())
        .ok_or_else(|| err(path, "the header has no 'descr'"))?;
    let fortran = field("fortran_order").ok_or_else(|| err(path, "no 'fortran_order'"))?;
    if fortran.starts_with("True") {
        return Err(err(
            path,
            "the array is in Fortran order; save it with np.ascontiguousarray(a) first",
        ));
    }
    let shape_text = field("shape")
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| err(path, "the header has no 'shape'"))?;
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| err(path, format!("bad shape ({shape_text})")))?;
    let body = &bytes[start + hlen..];
    let (dtype, size) = match descr {
        "<f8" => (DType::F64, 8),
        "<f4" => (DType::F32, 4),
        "<f2" => (DType::F16, 2),
        "<i8" => (DType::I64, 8),
        "<i4" => (DType::I32, 4),
        "<i2" => (DType::I16, 2),
        "|i1" | "<i1" => (DType::I8, 1),
        "<u4" => (DType::U32, 4),
        "|u1" | "<u1" => (DType::U8, 1),
        "|b1" => (DType::Bool, 1),
        d => {
            return Err(err(
                path,
                format!("dtype '{d}' is not supported (big-endian, complex, strings, objects and u16/u64 are not)"),
            ))
        }
    };
    // The header's shape against the file's length, in checked arithmetic: a
    // short file claiming a huge shape is an error, never an empty tensor.
    let n = checked_numel(&shape, dtype).map_err(|e| {
        err(
            path,
            format!("the header's shape does not fit: {}", e.message),
        )
    })?;
    let want = n * size;
    if body.len() < want {
        return Err(err(
            path,
            format!(
                "the header's shape {shape:?} needs {want} bytes of data, the file has {}",
                body.len()
            ),
        ));
    }
    let b = &body[..want];
    // No bigger than the file already read, but still asked for without
    // aborting; filled in place.
    let mut data = Data::alloc(&shape, dtype, interrupt)?;
    // Decoded a chunk at a time, so that `interrupt` stops a large one.
    macro_rules! read {
        ($v:expr, $r:expr, $t:ty, $k:expr) => {
            for (o, c) in $v[$r.clone()]
                .iter_mut()
                .zip(b[$r.start * $k..$r.end * $k].chunks_exact($k))
            {
                *o = <$t>::from_le_bytes(c.try_into().expect("chunks of the type's size"));
            }
        };
    }
    let n = data.len();
    interrupt.chunks(n, |r| match &mut data {
        Data::F64(v) => read!(v, r, f64, 8),
        Data::F32(v) => read!(v, r, f32, 4),
        Data::F16(v) => read!(v, r, f16, 2),
        Data::I64(v) => read!(v, r, i64, 8),
        Data::I32(v) => read!(v, r, i32, 4),
        Data::I16(v) => read!(v, r, i16, 2),
        Data::I8(v) => read!(v, r, i8, 1),
        Data::U32(v) => read!(v, r, u32, 4),
        Data::U8(v) if dtype == DType::Bool => {
            for (o, x) in v[r.clone()].iter_mut().zip(&b[r]) {
                *o = (*x != 0) as u8;
            }
        }
        Data::U8(v) => v[r.clone()].copy_from_slice(&b[r]),
        Data::BF16(_) => unreachable!("no .npy dtype loads as bf16"),
    })?;
    Ok(Tensor::from_data(&shape, dtype, data))
}

/// The elements of `t` exactly as stored, little-endian: bf16 as its 16
/// bits, f8 formats encoded, bool as 0/1 (what `.npy` cannot hold for bf16
/// and the f8 formats; a session's saved state uses it).
pub fn raw_bytes(t: &Tensor) -> Vec<u8> {
    let data = t.storage.data();
    let mut out = Vec::with_capacity(data.len() * data.elem_bytes());
    macro_rules! le {
        ($v:expr) => {
            $v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()))
        };
    }
    match data {
        Data::F64(v) => le!(v),
        Data::F32(v) => le!(v),
        Data::F16(v) => le!(v),
        Data::BF16(v) => le!(v),
        Data::I64(v) => le!(v),
        Data::I32(v) => le!(v),
        Data::I16(v) => le!(v),
        Data::I8(v) => le!(v),
        Data::U32(v) => le!(v),
        Data::U8(v) => out.extend_from_slice(v),
    }
    out
}

/// The tensor of `shape` and `dtype` whose elements are `bytes` as
/// [`raw_bytes`] wrote them; an error when the length does not match the
/// shape (or a bool byte is not 0 or 1).
pub fn from_raw_bytes(
    shape: &[usize],
    dtype: DType,
    bytes: &[u8],
    interrupt: &Interrupt,
) -> Result<Tensor, ExecError> {
    let n = checked_numel(shape, dtype)?;
    let size = dtype.bytes() as usize;
    if bytes.len() != n * size {
        return Err(ExecError::new(
            "E0708",
            format!(
                "{n} elements of {dtype} need {} bytes, not {}",
                n * size,
                bytes.len()
            ),
        ));
    }
    if dtype == DType::Bool && bytes.iter().any(|b| *b > 1) {
        return Err(ExecError::new("E0708", "a bool element is neither 0 nor 1"));
    }
    let mut data = Data::alloc(shape, dtype, interrupt)?;
    macro_rules! read {
        ($v:expr, $t:ty) => {
            for (o, c) in $v.iter_mut().zip(bytes.chunks_exact(size)) {
                *o = <$t>::from_le_bytes(c.try_into().expect("chunks of the type's size"));
            }
        };
    }
    match &mut data {
        Data::F64(v) => read!(v, f64),
        Data::F32(v) => read!(v, f32),
        Data::F16(v) => read!(v, f16),
        Data::BF16(v) => read!(v, half::bf16),
        Data::I64(v) => read!(v, i64),
        Data::I32(v) => read!(v, i32),
        Data::I16(v) => read!(v, i16),
        Data::I8(v) => read!(v, i8),
        Data::U32(v) => read!(v, u32),
        Data::U8(v) => v.copy_from_slice(bytes),
    }
    Ok(Tensor::from_data(shape, dtype, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_bytes_round_trip_every_dtype_exactly() {
        let interrupt = Interrupt::new();
        for dtype in DType::ALL {
            let size = dtype.bytes() as usize;
            // Every byte pattern a bool may not hold is left out for bool.
            let bytes: Vec<u8> = (0..6 * size)
                .map(|i| {
                    if dtype == DType::Bool {
                        (i % 2) as u8
                    } else {
                        (i * 37 + 250) as u8
                    }
                })
                .collect();
            let t = from_raw_bytes(&[2, 3], dtype, &bytes, &interrupt).unwrap();
            assert_eq!((t.dtype(), t.shape()), (dtype, &[2usize, 3][..]));
            assert_eq!(raw_bytes(&t), bytes, "{dtype}");
        }
    }

    #[test]
    fn raw_bytes_of_the_wrong_length_or_a_bad_bool_are_refused() {
        let interrupt = Interrupt::new();
        let e = from_raw_bytes(&[3], DType::F32, &[0; 11], &interrupt).unwrap_err();
        assert!(e.message.contains("need 12 bytes, not 11"), "{e}");
        let e = from_raw_bytes(&[2], DType::Bool, &[1, 2], &interrupt).unwrap_err();
        assert!(e.message.contains("neither 0 nor 1"), "{e}");
    }
}
