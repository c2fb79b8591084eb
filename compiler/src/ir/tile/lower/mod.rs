//! Lowering a checked kernel to Tile IR.
//!
//! The input is a kernel the checker accepted (its AST, its module's scope) and a
//! [`Specialization`]: values for const parameters (defaults apply otherwise) and
//! for the tensor dims the kernel is specialised on. Every dim named in the
//! specialization becomes `Dim::Static` and a compile-time value inside the body;
//! the other dims stay run-time `i32`s (`TensorDim`).
//!
//! Typing is the checker's: dtype promotion goes through `Checker::promote`,
//! broadcasting through `check::expr::broadcast`, compile-time folding through
//! `check::consts`, builtin arguments through the builtin table. What the
//! lowering adds is making it all explicit: scalars splat, ranks expand and dims
//! broadcast before an elementwise op, dtypes convert with `Cast`, literals take
//! the dtype of the operand they meet.
//!
//! Run-time integers carry a symbolic value (`check::dims::Dim` over fresh
//! symbols), so `m0 : m0 + BM` has the compile-time length `BM` exactly as the
//! checker computed it. Constants, tensor dims and scalar parameters are defined
//! once at the top of the kernel body (so they dominate every use).
//!
//! Control flow is SSA: a `for`/`while` carries the variables its body assigns
//! that exist before the loop and are read later (in the body or after the
//! loop); an `if` (statement or expression) yields the variables assigned in a
//! branch that are read after it. Conditions known at compile time (const
//! parameters such as `causal`) select one branch and emit no `If`.
//! `break`/`continue` guard the rest of the body with a `continuing` flag; a
//! `for` with `break` becomes a `While` over `(iv, broken, carried...)`; an
//! early `return` guards the rest of the kernel, and inside loops it also
//! breaks out of each of them through a carried `returned` flag.
//!
//! What a lowered kernel looks like (beyond what `verify` checks):
//! * constants, `TensorDim`s and `ScalarParam`s are defined once at the top of
//!   the body; values are numbered densely in definition order (`renumber`) and
//!   pure ops whose results are unused are removed;
//! * integer scalars are `i32` (an `i64` only where the source says so); `For`
//!   bounds and induction variables are `i32`;
//! * `mean` is `Reduce(Sum)` times a constant `1/n`; a reduction over several
//!   axes is one `Reduce` per axis, highest axis first;
//! * `dot` operands have one dtype; the accumulator is f32 of the result shape;
//! * `Load::other` is a `Float` for float tensors, an `Int` for integer ones;
//!   a run-time `other=` is a load with 0 and a `Select` on an explicit
//!   in-bounds mask (`Arange` compared with the dims).
//!
//! # Layout of this module
//!
//! One context struct, `Lowerer`, with its `impl` spread over files by
//! concern (each file has `impl Lowerer { ... }` for its part; the struct, the
//! lowered-value type `LV`, the entry points, the diagnostic helpers and the
//! work counter stay here):
//!
//! | file | holds |
//! |------|-------|
//! | `spec.rs` | [`Specialization`] and [`Define`]: the values a kernel is lowered with |
//! | `reads.rs` | liveness: where each name is read, the names read after a point |
//! | `jumps.rs` | `break`/`continue`/`return`: their flags and which blocks hold them |
//! | `kernel.rs` | the kernel: parameters, dims, options, the body; hoisted definitions |
//! | `values.rs` | dtypes, shapes, promotion, materialising and coercing values |
//! | `stmt.rs` | statements, conditions, `if` chains and their merged values |
//! | `loops.rs` | `for` and `while` with their carried values and jump flags |
//! | `expr.rs` | literals, names, unary and binary operators |
//! | `subscript.rs` | tensor slices, gathers, list indexing, index values |
//! | `calls.rs` | argument binding, `.to`, the builtins |
//! | `bounds.rs` | the in-bounds masks of tensor accesses |
//! | `dot_reduce.rs` | `dot` and reductions |
//!
//! A method or item is `pub(super)` only where a sibling file uses it.

mod bounds;
mod calls;
mod dot_reduce;
mod expr;
mod jumps;
mod kernel;
mod loops;
mod reads;
mod spec;
mod stmt;
mod subscript;
mod values;

use std::collections::{BTreeMap, HashMap, HashSet};

use self::jumps::JumpTable;
use self::reads::Reads;
use crate::check::builtins::Builtin;
use crate::check::dims::Dim as SymDim;
use crate::check::scope::ModuleScope;
use crate::check::{DType, Value as CValue};
use crate::diag::Diagnostic;
use crate::ir::tile::env::ScopedEnv;
use crate::ir::tile::{Access, Builder, Kernel, Param, Value};
use crate::syntax::ast::Function;
use crate::syntax::span::Span;

pub use self::spec::{Define, Specialization};

/// Lowers the kernel `f` (which must have passed the checker) to Tile IR.
/// Errors: E0511 when a const parameter without a default (or a dim a tile
/// shape depends on) has no value; E0512 for constructs lowering does not
/// support yet. Spans are item-relative, like the checker's.
pub fn lower_kernel(
    f: &Function,
    scope: &ModuleScope,
    spec: &Specialization,
) -> Result<Kernel, Vec<Diagnostic>> {
    let (mut diags, mut missing) = match lower_inner(f, scope, spec) {
        Ok(k) => return Ok(k),
        Err(e) => e,
    };
    // Lowering stops at the first dim it needs a value for. Lowering again
    // with a stand-in value for each one found finds the next, so one run
    // names every dim the kernel must be specialised on. Only those E0511s
    // are kept: other errors of a trial may come from the stand-in. Each
    // round fixes at least one more dim of the signature, so this ends.
    const STAND_IN: i64 = 64;
    let mut trial = spec.clone();
    loop {
        let new: Vec<String> = missing
            .into_iter()
            .filter(|m| !trial.values.contains_key(m))
            .collect();
        if new.is_empty() {
            break;
        }
        trial.values.extend(new.into_iter().map(|m| (m, STAND_IN)));
        match lower_inner(f, scope, &trial) {
            Ok(_) => break,
            Err((more, m)) => {
                for d in more.into_iter().filter(|d| d.code == "E0511") {
                    if !diags
                        .iter()
                        .any(|x| x.span == d.span && x.message == d.message)
                    {
                        diags.push(d);
                    }
                }
                missing = m;
            }
        }
    }
    Err(diags)
}

/// Like [`lower_kernel`], given the sizes of the dims known where the kernel is
/// launched (`known`): the kernel is specialised on those of them a tile shape
/// needs, and on no other (so `flash_attn` gets a static `D` and keeps `S`, `B`
/// and `H` run-time values).
pub fn lower_kernel_with_dims(
    f: &Function,
    scope: &ModuleScope,
    spec: &Specialization,
    known: &BTreeMap<String, i64>,
) -> Result<Kernel, Vec<Diagnostic>> {
    let mut spec = spec.clone();
    loop {
        match lower_inner(f, scope, &spec) {
            Ok(k) => return Ok(k),
            Err((diags, missing)) => {
                let add: Vec<(String, i64)> = missing
                    .into_iter()
                    .filter(|m| !spec.values.contains_key(m))
                    .filter_map(|m| known.get(&m).map(|v| (m, *v)))
                    .collect();
                if add.is_empty() {
                    return Err(diags);
                }
                spec.values.extend(add);
            }
        }
    }
}

/// Lowering's errors and the dims it found missing (for `lower_kernel_with_dims`).
fn lower_inner(
    f: &Function,
    scope: &ModuleScope,
    spec: &Specialization,
) -> Result<Kernel, (Vec<Diagnostic>, Vec<String>)> {
    let mut l = Lowerer {
        scope,
        f,
        b: Builder::new(),
        prologue: 0,
        consts: HashMap::new(),
        dims: HashMap::new(),
        scalar_params: HashMap::new(),
        env: ScopedEnv::new(),
        params: Vec::new(),
        specialization: BTreeMap::new(),
        divisibility: BTreeMap::new(),
        divisors_checked: HashSet::new(),
        next_sym: 0,
        loop_depth: 0,
        missing_dims: Vec::new(),
        reads: Reads::default(),
        jumps: JumpTable::default(),
        diags: Vec::new(),
    };
    match l.kernel(spec) {
        Ok(k) => Ok(k),
        Err(()) => {
            if l.diags.is_empty() {
                l.diags.push(
                    Diagnostic::new(
                        "E0512",
                        f.name.span,
                        format!("kernel `{}` could not be lowered", f.name.name),
                    )
                    .with_help("this is a compiler bug: please report it with the kernel's source"),
                );
            }
            Err((l.diags, l.missing_dims))
        }
    }
}

type R<T> = Result<T, ()>;

/// A lowered expression.
#[derive(Clone, Debug)]
enum LV {
    /// A scalar or tile in an SSA value; run-time integers carry a symbolic value.
    Val {
        v: Value,
        weak: bool,
        sym: Option<SymDim>,
    },
    /// A compile-time scalar (`Int` concrete), not yet materialised.
    Const {
        c: CValue,
        dtype: DType,
        weak: bool,
    },
    Tensor(usize),
    /// `T[slices]`: what `load`/`store`/`atomic_add` take.
    Ref {
        tensor: usize,
        access: Vec<Access>,
        shape: Vec<u32>,
    },
    DType(DType),
    Str(String),
    Builtin(Builtin),
    /// `x.to`
    ToMethod(Box<LV>),
    List(Vec<LV>),
    NoneV,
    /// A value only the host has (a function, kernel, module or dict bound
    /// to a name): kernels cannot use it (the checker rejects every use but
    /// binding it), so it lowers to nothing.
    Host,
}

impl LV {
    fn describe(&self) -> &'static str {
        match self {
            LV::Val { .. } | LV::Const { .. } => "value",
            LV::Tensor(_) => "tensor",
            LV::Ref { .. } => "tensor slice",
            LV::DType(_) => "dtype",
            LV::Str(_) => "string",
            LV::Builtin(_) => "builtin",
            LV::ToMethod(_) => "method",
            LV::List(_) => "list",
            LV::NoneV => "None",
            LV::Host => "host value",
        }
    }
}

struct Lowerer<'a> {
    scope: &'a ModuleScope,
    f: &'a Function,
    b: Builder,
    /// How many ops the hoisted prologue (constants, dims, scalar params) has.
    prologue: usize,
    consts: HashMap<(DType, u64), Value>,
    dims: HashMap<(usize, usize), Value>,
    scalar_params: HashMap<usize, Value>,
    env: ScopedEnv<LV>,
    params: Vec<Param>,
    specialization: BTreeMap<String, i64>,
    /// The divisors of `spec.divisors` that name a run-time dim or integer
    /// scalar parameter of this kernel.
    divisibility: BTreeMap<String, u64>,
    /// Fixed names whose assumed divisor was checked (one E0513 per name).
    divisors_checked: HashSet<String>,
    next_sym: u32,
    /// How many loops enclose the statement being lowered.
    loop_depth: u32,
    /// Dims a tile shape needed but the specialization lacked (E0511).
    missing_dims: Vec<String>,
    /// Where the kernel's names are read, for liveness.
    reads: Reads,
    jumps: JumpTable,
    diags: Vec<Diagnostic>,
}

#[cfg(test)]
thread_local! {
    /// Steps of lowering's liveness work on this thread, for tests that check
    /// it grows linearly with the kernel (timings are too noisy to tell).
    pub(super) static WORK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts `steps` units of work: a statement lowered, an expression node or
/// statement visited for its reads, a range of a liveness chain searched.
#[inline]
pub(super) fn work(steps: usize) {
    #[cfg(test)]
    WORK.with(|w| w.set(w.get() + steps as u64));
    #[cfg(not(test))]
    let _ = steps;
}

impl<'a> Lowerer<'a> {
    fn unsupported(&mut self, span: Span, what: impl Into<String>) {
        self.diags.push(
            Diagnostic::new(
                "E0512",
                span,
                format!("{} is not supported by code generation yet", what.into()),
            )
            .with_help("`tsrc check` accepts it; only lowering to Tile IR is missing"),
        );
    }

    /// An internal inconsistency: the checker should have rejected this.
    fn internal(&mut self, span: Span, what: impl Into<String>) {
        self.diags.push(
            Diagnostic::new(
                "E0512",
                span,
                format!("cannot lower this: {}", what.into()),
            )
            .with_help("this is a compiler bug (the checker accepted it): please report it with the kernel's source"),
        );
    }

    fn fresh_sym(&mut self) -> SymDim {
        self.next_sym += 1;
        SymDim::symbol(format!("%rt{}", self.next_sym))
    }
}
