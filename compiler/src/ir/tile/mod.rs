//! Tile IR: one kernel, specialised.
//!
//! Every const parameter and every specialised tensor dim has a value, so every
//! tile has a concrete shape. Values are SSA (`Value`), defined once by an `Op`
//! (or as a region argument) and used only where that definition dominates.
//! Operands of elementwise ops have identical types: broadcasting and dtype
//! promotion are explicit (`Splat`, `Broadcast`, `ExpandDims`, `Cast`), which
//! keeps every later stage (Target IR, the CPU interpreter) free of typing rules.
//!
//! Tensors are contiguous and row-major; a tensor dim that is not specialised is a
//! run-time `i32` (`TensorDim`). Loads and stores are bounds-safe by construction:
//! each `Access` carries its start, and an element is in bounds when
//! `0 <= start + i < dim` on every axis; out-of-bounds lanes read `other` and are
//! never written.

use crate::check::DType;
use crate::syntax::span::Span;

/// An SSA value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(pub u32);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    Scalar(DType),
    Tile { shape: Vec<u32>, dtype: DType },
}

impl Type {
    pub fn dtype(&self) -> DType {
        match self {
            Type::Scalar(d) | Type::Tile { dtype: d, .. } => *d,
        }
    }

    /// The shape; empty for a scalar.
    pub fn shape(&self) -> &[u32] {
        match self {
            Type::Scalar(_) => &[],
            Type::Tile { shape, .. } => shape,
        }
    }

    /// The element count, saturating (a shape of several large dims may not
    /// fit 64 bits; such a tile is refused by `check_tile_sizes`).
    pub fn num_elements(&self) -> u64 {
        self.shape()
            .iter()
            .fold(1u64, |acc, &d| acc.saturating_mul(d as u64))
    }
}

/// The size of one dim of a tensor parameter.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// Known when the kernel is compiled (a literal dim or a specialised one).
    Static(u64),
    /// Passed at launch as an `i32` argument; the name is the signature's.
    Dynamic(String),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// A pointer to global memory, contiguous row-major.
    Tensor { dims: Vec<Dim>, dtype: DType },
    /// A scalar passed by value.
    Scalar(DType),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Param {
    pub name: String,
    pub kind: ParamKind,
}

/// A specialised kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The source kernel's name (generated kernels get a readable generated name).
    pub name: String,
    /// The values fixed at compile time: const parameters and specialised dims, sorted by name.
    pub specialization: Vec<(String, i64)>,
    /// Divisibility assumptions on run-time tensor dims and integer scalar
    /// parameters (`-D K%8`: `K` is a multiple of 8), sorted by name. The code
    /// generator uses them to prove alignment and checks them at kernel entry
    /// unless `divisibility_trusted`.
    pub divisibility: Vec<(String, u64)>,
    /// The divisibility facts came from the launch's own values (see
    /// `Specialization::trusted`): no entry check.
    pub divisibility_trusted: bool,
    /// Run-time parameters in launch order (const parameters are not among them).
    pub params: Vec<Param>,
    pub num_warps: u32,
    pub num_stages: u32,
    pub body: Region,
    /// The type of every value, indexed by `Value.0`.
    pub types: Vec<Type>,
}

impl Kernel {
    pub fn ty(&self, v: Value) -> &Type {
        &self.types[v.0 as usize]
    }

    /// The tensor parameters (indices into `params`) that a store or an
    /// atomic writes, sorted: a launch's other tensors are only read.
    pub fn written_params(&self) -> Vec<usize> {
        fn walk(r: &Region, out: &mut Vec<usize>) {
            for op in &r.ops {
                if let OpKind::Store { tensor, .. } | OpKind::AtomicAdd { tensor, .. } = &op.kind {
                    out.push(*tensor);
                }
                for nested in op.kind.regions() {
                    walk(nested, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.body, &mut out);
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// A list of ops with arguments (loop induction variables and carried values).
/// Regions of `For`, `While` and `If` end with a `Yield`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Region {
    pub args: Vec<Value>,
    pub ops: Vec<Op>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    pub results: Vec<Value>,
    pub kind: OpKind,
    /// Item-relative source span, for dumps and debug info.
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Constant {
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// The elementwise math builtins' Tile IR operation (shared by Graph IR).
pub fn unary_op(b: crate::check::builtins::Builtin) -> Option<UnaryOp> {
    use crate::check::builtins::Builtin as B;
    Some(match b {
        B::Exp => UnaryOp::Exp,
        B::Exp2 => UnaryOp::Exp2,
        B::Log => UnaryOp::Log,
        B::Log2 => UnaryOp::Log2,
        B::Sqrt => UnaryOp::Sqrt,
        B::Rsqrt => UnaryOp::Rsqrt,
        B::Abs => UnaryOp::Abs,
        B::Sigmoid => UnaryOp::Sigmoid,
        B::Tanh => UnaryOp::Tanh,
        B::Erf => UnaryOp::Erf,
        _ => return None,
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    /// Logical not (bool).
    Not,
    /// Bitwise not (integers).
    Invert,
    Exp,
    Exp2,
    Log,
    Log2,
    Sqrt,
    Rsqrt,
    Abs,
    Sigmoid,
    Tanh,
    Erf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// True division (floats).
    Div,
    /// Floor division (integers: rounds toward negative infinity; floats: floor(a / b)).
    FloorDiv,
    /// Python modulo: the result has the sign of the divisor.
    Mod,
    Pow,
    Max,
    Min,
    /// Bitwise on integers, logical on bool.
    And,
    Or,
    Xor,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl BinaryOp {
    /// The Tile IR op of a source operator; `@` (matmul) has none.
    pub fn from_ast(op: crate::syntax::ast::BinOp) -> Option<BinaryOp> {
        use crate::syntax::ast::BinOp;
        Some(match op {
            BinOp::Add => BinaryOp::Add,
            BinOp::Sub => BinaryOp::Sub,
            BinOp::Mul => BinaryOp::Mul,
            BinOp::Div => BinaryOp::Div,
            BinOp::FloorDiv => BinaryOp::FloorDiv,
            BinOp::Mod => BinaryOp::Mod,
            BinOp::Pow => BinaryOp::Pow,
            BinOp::BitAnd | BinOp::And => BinaryOp::And,
            BinOp::BitOr | BinOp::Or => BinaryOp::Or,
            BinOp::BitXor => BinaryOp::Xor,
            BinOp::Eq => BinaryOp::Eq,
            BinOp::Ne => BinaryOp::Ne,
            BinOp::Lt => BinaryOp::Lt,
            BinOp::Le => BinaryOp::Le,
            BinOp::Gt => BinaryOp::Gt,
            BinOp::Ge => BinaryOp::Ge,
            BinOp::MatMul => return None,
        })
    }

    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// A `dot`'s precision: the target's, which selects its matrix instruction.
pub use crate::target::Precision;

/// How one axis of a tensor is accessed by a load or store.
#[derive(Clone, Debug, PartialEq)]
pub enum Access {
    /// An integer index: the axis is dropped from the tile.
    Point(Value),
    /// `start : start + len`, `len` known at compile time.
    Range { start: Value, len: u32 },
    /// An `i32` tile of the access's whole shape: element `e` of the tile is
    /// at index `idx[e]` on this axis (a gather or scatter). An access with a
    /// gather has gathers only (a point or range on another axis is spelled as
    /// a gather of the whole shape), so each element's address is its own;
    /// elements whose index falls outside an axis are out of bounds.
    Gather(Value),
}

impl Access {
    /// The value the access reads (index, start or index tile).
    pub fn value(&self) -> Value {
        match self {
            Access::Point(v) | Access::Range { start: v, .. } | Access::Gather(v) => *v,
        }
    }

    pub fn value_mut(&mut self) -> &mut Value {
        match self {
            Access::Point(v) | Access::Range { start: v, .. } | Access::Gather(v) => v,
        }
    }

    /// Whether an access list is a gather (then every axis is a `Gather`).
    pub fn is_gather(access: &[Access]) -> bool {
        access.iter().any(|a| matches!(a, Access::Gather(_)))
    }

    /// The shape of the tile an access list reads or writes: the lengths of
    /// its ranges, or the shape of its gather tiles.
    pub fn shape(access: &[Access], types: &[Type]) -> Vec<u32> {
        match access.iter().find(|a| matches!(a, Access::Gather(_))) {
            Some(g) => types[g.value().0 as usize].shape().to_vec(),
            None => access
                .iter()
                .filter_map(|a| match a {
                    Access::Range { len, .. } => Some(*len),
                    _ => None,
                })
                .collect(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    /// A scalar constant of the result's dtype.
    Const(Constant),
    ProgramId(u8),
    NumPrograms(u8),
    /// The run-time size of axis `axis` of tensor parameter `param` (i32).
    TensorDim {
        param: usize,
        axis: usize,
    },
    /// The value of scalar parameter `param`.
    ScalarParam(usize),
    Unary {
        op: UnaryOp,
        x: Value,
    },
    /// Operands have equal types; comparisons give bool of the same shape.
    Binary {
        op: BinaryOp,
        a: Value,
        b: Value,
    },
    /// `where(cond, a, b)`: cond is bool of the same shape as `a` and `b`.
    Select {
        cond: Value,
        a: Value,
        b: Value,
    },
    Cast {
        x: Value,
        to: DType,
    },
    /// A scalar repeated over a tile shape.
    Splat {
        x: Value,
        shape: Vec<u32>,
    },
    /// Size-1 dims of `x` repeated to `shape` (same rank).
    Broadcast {
        x: Value,
        shape: Vec<u32>,
    },
    /// A new size-1 axis at `axis`.
    ExpandDims {
        x: Value,
        axis: usize,
    },
    /// Swap the two axes of a 2-D tile.
    Transpose {
        x: Value,
    },
    /// Elements `start .. start + len` of axis `axis` of `x` (`t[a : b]`);
    /// an index (`t[i]`, `len` 1) drops the axis when `drop`.
    Extract {
        x: Value,
        axis: usize,
        start: u32,
        len: u32,
        drop: bool,
    },
    /// `[start, start + len)` as an `i32` tile.
    Arange {
        start: Value,
        len: u32,
    },
    /// A tile read from tensor parameter `tensor`; the tile's shape is the `len`
    /// of each `Range` access, in order (or the shape of the `Gather` tiles). `mask` (bool, the tile's shape) further
    /// restricts which elements are read; others read `other`.
    Load {
        tensor: usize,
        access: Vec<Access>,
        mask: Option<Value>,
        other: Constant,
    },
    Store {
        tensor: usize,
        access: Vec<Access>,
        value: Value,
        mask: Option<Value>,
    },
    AtomicAdd {
        tensor: usize,
        access: Vec<Access>,
        value: Value,
        mask: Option<Value>,
    },
    /// `[M, K] x [K, N] (+ acc [M, N] f32) -> [M, N] f32`.
    Dot {
        a: Value,
        b: Value,
        acc: Option<Value>,
        precision: Precision,
    },
    /// Reduces `axis`; the result keeps it as size 1 when `keepdims`.
    Reduce {
        op: ReduceOp,
        x: Value,
        axis: usize,
        keepdims: bool,
    },
    /// `for iv in range(lo, hi, step)`: `body.args` are `[iv, carried...]`, the body
    /// yields the next carried values, and the op's results are the final ones.
    For {
        lo: Value,
        hi: Value,
        step: Value,
        init: Vec<Value>,
        body: Region,
    },
    /// `cond.args` and `body.args` are the carried values; `cond` yields one bool
    /// scalar (then nothing else), `body` yields the next carried values.
    While {
        init: Vec<Value>,
        cond: Region,
        body: Region,
    },
    /// Both regions yield the op's results.
    If {
        cond: Value,
        then: Region,
        otherwise: Region,
    },
    /// Ends a region with its values.
    Yield(Vec<Value>),
}

mod builder;
mod cleanup;
mod dot_acc;
mod dump;
mod env;
mod limits;
pub mod lower;
mod masks;
pub mod program_order;
pub mod streaming;
mod verify;

#[cfg(test)]
mod interp_tests;
#[cfg(test)]
mod lower_tests;
#[cfg(test)]
mod tests;

pub use builder::Builder;
pub use limits::check_tile_sizes;
pub use lower::{lower_kernel, lower_kernel_with_dims, Define, Specialization};
pub use verify::verify;
