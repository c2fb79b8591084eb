//! Tiles as the interpreter holds them: a flat buffer in the representation of
//! the dtype (f32, f64 or i64), a shape, and the lanes poisoned by a division
//! by zero.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Repr {
    F,
    D,
    I,
}

pub(super) fn repr(d: DType) -> Repr {
    if d == DType::F64 {
        Repr::D
    } else if d.is_float() {
        Repr::F
    } else {
        Repr::I
    }
}

#[derive(Clone, Debug)]
pub(super) enum Buf {
    F(Vec<f32>),
    D(Vec<f64>),
    I(Vec<i64>),
}

impl Buf {
    pub(super) fn len(&self) -> usize {
        match self {
            Buf::F(v) => v.len(),
            Buf::D(v) => v.len(),
            Buf::I(v) => v.len(),
        }
    }

    pub(super) fn filled(r: Repr, n: usize, c: Constant) -> Buf {
        let (x, i) = match c {
            Constant::Int(i) => (i as f64, i),
            Constant::Float(x) => (x, float_to_i64(x)),
            Constant::Bool(b) => (b as i64 as f64, b as i64),
        };
        match r {
            Repr::F => Buf::F(vec![x as f32; n]),
            Repr::D => Buf::D(vec![x; n]),
            Repr::I => Buf::I(vec![i; n]),
        }
    }

    /// A one-element buffer repeated `n` times.
    pub(super) fn repeat(&self, n: usize) -> Buf {
        match self {
            Buf::F(v) => Buf::F(vec![v[0]; n]),
            Buf::D(v) => Buf::D(vec![v[0]; n]),
            Buf::I(v) => Buf::I(vec![v[0]; n]),
        }
    }

    pub(super) fn f(&self) -> &[f32] {
        match self {
            Buf::F(v) => v,
            _ => unreachable!("an f32 tile"),
        }
    }

    pub(super) fn i(&self) -> &[i64] {
        match self {
            Buf::I(v) => v,
            _ => unreachable!("an integer tile"),
        }
    }

    /// Element `i` as f64 (scalars: loop bounds, conditions).
    pub(super) fn get(&self, i: usize) -> f64 {
        match self {
            Buf::F(v) => v[i] as f64,
            Buf::D(v) => v[i],
            Buf::I(v) => v[i] as f64,
        }
    }

    pub(super) fn get_i(&self, i: usize) -> i64 {
        match self {
            Buf::F(v) => v[i] as i64,
            Buf::D(v) => v[i] as i64,
            Buf::I(v) => v[i],
        }
    }

    /// Elements picked by `idx` (gathers for broadcasts and transposes).
    pub(super) fn gather(&self, idx: &[usize]) -> Buf {
        match self {
            Buf::F(v) => Buf::F(idx.iter().map(|&i| v[i]).collect()),
            Buf::D(v) => Buf::D(idx.iter().map(|&i| v[i]).collect()),
            Buf::I(v) => Buf::I(idx.iter().map(|&i| v[i]).collect()),
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Tile {
    pub(super) shape: Vec<usize>,
    pub(super) buf: Buf,
    /// Lanes computed from an integer division by zero (see [`Program::poison`]).
    pub(super) poison: Option<Vec<bool>>,
}

pub(super) type T = Rc<Tile>;

pub(super) fn scalar_tile(buf: Buf) -> T {
    Rc::new(Tile {
        shape: Vec::new(),
        buf,
        poison: None,
    })
}

/// Rounds every element of an f32-represented tile to `d` (f16, bf16, f8).
pub(super) fn round_f32s(d: DType, v: &mut [f32]) {
    match d {
        DType::F16 => v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        DType::BF16 => v.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
        DType::F8E4M3 | DType::F8E5M2 => v
            .iter_mut()
            .for_each(|x| *x = round_to(d, *x as f64) as f32),
        _ => {}
    }
}

pub(super) fn wrap_ints(d: DType, v: &mut [i64]) {
    if d != DType::I64 {
        v.iter_mut().for_each(|x| *x = wrap_int(d, *x));
    }
}

/// Fixes a freshly computed buffer up to dtype `d`.
pub(super) fn normalise(d: DType, mut b: Buf) -> Buf {
    match &mut b {
        Buf::F(v) => round_f32s(d, v),
        Buf::I(v) => wrap_ints(d, v),
        Buf::D(_) => {}
    }
    b
}

pub(super) fn div_by_zero() -> ExecError {
    ExecError::new("E0704", "integer division by zero").with_help(
        "an integer `//` or `%` had a zero divisor; guard it with `where(d != 0, ...)` or use floats",
    )
}

impl Buf {
    pub(super) fn get_d(self) -> Vec<f64> {
        match self {
            Buf::D(v) => v,
            _ => unreachable!("an f64 tile"),
        }
    }
}
