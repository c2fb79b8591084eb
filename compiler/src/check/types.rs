//! Element types, the types of values the checker tracks, and compile-time values.

use std::fmt;
use std::sync::Arc;

use super::dims::Dim;
use super::scope::{FnSig, ModuleScope};
use crate::target::Elem;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F64,
    F32,
    F16,
    BF16,
    F8E4M3,
    F8E5M2,
    I64,
    I32,
    I16,
    I8,
    U32,
    U8,
    Bool,
}

impl DType {
    pub const ALL: [DType; 13] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U32,
        DType::U8,
        DType::Bool,
    ];

    /// The operand dtype a matrix instruction could take for this dtype
    /// (whether one does is [`crate::target::select_mma`]'s to say).
    pub fn mma_elem(self) -> Option<Elem> {
        match self {
            DType::F16 => Some(Elem::F16),
            DType::BF16 => Some(Elem::Bf16),
            DType::F32 => Some(Elem::F32),
            DType::F8E4M3 => Some(Elem::F8E4M3),
            DType::F8E5M2 => Some(Elem::F8E5M2),
            DType::F64
            | DType::I64
            | DType::I32
            | DType::I16
            | DType::I8
            | DType::U32
            | DType::U8
            | DType::Bool => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U32 => "u32",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    pub fn bytes(self) -> u64 {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F64 | DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
        )
    }

    /// Signed or unsigned integers (not bool).
    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U32 | DType::U8
        )
    }

    /// Float widths in a chain: f8 < f16/bf16 < f32 < f64.
    fn float_rank(self) -> u8 {
        match self {
            DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 3,
            DType::F64 => 4,
            _ => 0,
        }
    }

    /// Whether a value of `self` converts to `to` without losing anything
    /// (the only conversions done implicitly).
    pub fn widens_to(self, to: DType) -> bool {
        use DType::*;
        if self == to {
            return true;
        }
        if self.is_float() && to.is_float() {
            // f16 and bf16 are not ordered; f8 formats widen to both 16-bit ones.
            return self.float_rank() < to.float_rank();
        }
        matches!(
            (self, to),
            (I8, I16 | I32 | I64)
                | (I16, I32 | I64)
                | (I32, I64)
                | (U8, U32 | I16 | I32 | I64)
                | (U32, I64)
        )
    }

    /// The common dtype of two strongly typed operands, if one widens to the other.
    pub fn join(a: DType, b: DType) -> Option<DType> {
        if a.widens_to(b) {
            Some(b)
        } else if b.widens_to(a) {
            Some(a)
        } else {
            None
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A compile-time value (`Int` may be symbolic: `m0 + 128`).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(Dim),
    Float(f64),
    Bool(bool),
    Str(String),
    DType(DType),
    Tuple(Vec<Value>),
    None,
}

impl Value {
    pub fn int(i: i64) -> Value {
        Value::Int(Dim::constant(i))
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(d) => d.as_const(),
            Value::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    /// Whether the value has no symbols at all.
    pub fn is_concrete(&self) -> bool {
        match self {
            Value::Int(d) => d.as_const().is_some(),
            Value::Tuple(v) => v.iter().all(Value::is_concrete),
            _ => true,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(d) => write!(f, "{d}"),
            Value::Float(x) if x.is_infinite() => {
                f.write_str(if *x > 0.0 { "inf" } else { "-inf" })
            }
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::DType(d) => write!(f, "{d}"),
            Value::Tuple(v) => {
                f.write_str("(")?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{x}")?;
                }
                if v.len() == 1 {
                    f.write_str(",")?;
                }
                f.write_str(")")
            }
            Value::None => f.write_str("None"),
        }
    }
}

/// What a callable value is.
#[derive(Clone, Debug, PartialEq)]
pub enum Callee {
    Builtin(super::builtins::Builtin),
    /// A user (or imported) `def` or kernel.
    Function(Arc<FnSig>),
    /// `x.to` — a method bound to its receiver.
    Method {
        recv: Box<Ty>,
        name: &'static str,
    },
}

/// The type of a value.
#[derive(Clone, Debug, PartialEq)]
pub enum Ty {
    /// Unknown: an error was already reported (or the type is not tracked);
    /// everything is accepted, nothing more is reported.
    Err,
    /// A scalar; `weak` marks literals (and consts built from literals), which
    /// adapt to the dtype of the other operand.
    Scalar {
        dtype: DType,
        weak: bool,
    },
    /// An on-chip value inside a kernel.
    Tile {
        dims: Vec<Dim>,
        dtype: DType,
    },
    /// A tensor in global memory.
    Tensor {
        dims: Vec<Dim>,
        dtype: DType,
    },
    /// `T[slices]` of a tensor inside a kernel: what `load`/`store`/`atomic_add` take.
    Ref {
        dims: Vec<Dim>,
        dtype: DType,
    },
    /// A dtype used as a value (`f32` in `zeros([BM], f32)`).
    DTypeV,
    Str,
    NoneV,
    Tuple(Vec<Ty>),
    List(Vec<Ty>),
    Dict,
    Range,
    /// `x.shape`
    Shape(Vec<Dim>),
    Callable(Callee),
    Module(Arc<ModuleScope>),
}

impl Ty {
    pub fn scalar(dtype: DType) -> Ty {
        Ty::Scalar { dtype, weak: false }
    }

    pub fn weak(dtype: DType) -> Ty {
        Ty::Scalar { dtype, weak: true }
    }

    pub fn tile(dims: Vec<Dim>, dtype: DType) -> Ty {
        if dims.is_empty() {
            Ty::scalar(dtype)
        } else {
            Ty::Tile { dims, dtype }
        }
    }

    pub fn dtype(&self) -> Option<DType> {
        match self {
            Ty::Scalar { dtype, .. }
            | Ty::Tile { dtype, .. }
            | Ty::Tensor { dtype, .. }
            | Ty::Ref { dtype, .. } => Some(*dtype),
            _ => None,
        }
    }

    /// The dims of a tile, tensor, ref or scalar (`[]`).
    pub fn dims(&self) -> Option<&[Dim]> {
        match self {
            Ty::Tile { dims, .. } | Ty::Tensor { dims, .. } | Ty::Ref { dims, .. } => Some(dims),
            Ty::Scalar { .. } => Some(&[]),
            _ => None,
        }
    }

    pub fn is_err(&self) -> bool {
        matches!(self, Ty::Err)
    }

    pub fn is_scalar(&self) -> bool {
        matches!(self, Ty::Scalar { .. })
    }

    pub fn is_weak(&self) -> bool {
        matches!(self, Ty::Scalar { weak: true, .. })
    }

    /// A short description of the kind of value, for messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Ty::Err => "value",
            Ty::Scalar { .. } => "scalar",
            Ty::Tile { .. } => "tile",
            Ty::Tensor { .. } => "tensor",
            Ty::Ref { .. } => "tensor slice",
            Ty::DTypeV => "dtype",
            Ty::Str => "string",
            Ty::NoneV => "None",
            Ty::Tuple(_) => "tuple",
            Ty::List(_) => "list",
            Ty::Dict => "dict",
            Ty::Range => "range",
            Ty::Shape(_) => "shape",
            Ty::Callable(Callee::Function(f)) if f.is_kernel => "kernel",
            Ty::Callable(_) => "function",
            Ty::Module(_) => "module",
        }
    }
}

/// The most dims a tile or tensor may have (numpy's limit). Nothing real comes
/// near it, and without a bound a chain of `[:, None]` grows every later
/// shape with it, so checking and lowering grow with its square.
pub const MAX_RANK: usize = 64;

/// E0416 for a tile or tensor type of more than [`MAX_RANK`] dims.
pub fn rank_limit(
    span: crate::syntax::span::Span,
    ty: &str,
    rank: usize,
) -> crate::diag::Diagnostic {
    crate::diag::Diagnostic::new(
        "E0416",
        span,
        format!("this {ty} has {rank} dims; the limit is {MAX_RANK}"),
    )
    .with_help("merge dims with `reshape`, or index away the ones of size 1")
}

pub fn render_dims(dims: &[Dim]) -> String {
    let v: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", v.join(", "))
}

fn shaped(f: &mut fmt::Formatter<'_>, base: &str, dims: &[Dim], dtype: DType) -> fmt::Result {
    write!(f, "{base}[")?;
    for d in dims {
        write!(f, "{d}, ")?;
    }
    write!(f, "{dtype}]")
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Err => f.write_str("?"),
            Ty::Scalar { dtype, weak: true } if dtype.is_float() => f.write_str("float"),
            Ty::Scalar {
                dtype: DType::Bool,
                weak: true,
            } => f.write_str("bool"),
            Ty::Scalar { weak: true, .. } => f.write_str("int"),
            Ty::Scalar { dtype, .. } => write!(f, "{dtype}"),
            Ty::Tile { dims, dtype } => shaped(f, "Tile", dims, *dtype),
            Ty::Tensor { dims, dtype } => shaped(f, "Tensor", dims, *dtype),
            Ty::Ref { dims, dtype } => shaped(f, "Tensor", dims, *dtype),
            Ty::DTypeV => f.write_str("dtype"),
            Ty::Str => f.write_str("str"),
            Ty::NoneV => f.write_str("None"),
            Ty::Tuple(v) | Ty::List(v) => {
                let open = if matches!(self, Ty::Tuple(_)) {
                    "("
                } else {
                    "["
                };
                let close = if matches!(self, Ty::Tuple(_)) {
                    ")"
                } else {
                    "]"
                };
                f.write_str(open)?;
                for (i, t) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{t}")?;
                }
                f.write_str(close)
            }
            Ty::Dict => f.write_str("dict"),
            Ty::Range => f.write_str("range"),
            Ty::Shape(d) => write!(f, "shape {}", render_dims(d)),
            Ty::Callable(Callee::Builtin(n)) => write!(f, "builtin `{n}`"),
            Ty::Callable(Callee::Function(s)) => f.write_str(&s.one_line()),
            Ty::Callable(Callee::Method { name, .. }) => write!(f, "method `{name}`"),
            Ty::Module(_) => f.write_str("module"),
        }
    }
}
