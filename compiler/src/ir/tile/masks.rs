//! Masks that a loop's iteration decides: a `where(mask, a, b)` in the body of
//! a `for` loop whose mask compares affine index tiles (`rows >= cols` with
//! `rows = m0 + arange(BM)`, `cols = n0 + arange(BN)`, `n0` the loop variable)
//! is, per iteration, either all-true, all-false or mixed, and which one is a
//! scalar test on the loop variable. The causal mask of attention is the
//! example: all-true below the diagonal, mixed on it, all-false past it.
//!
//! This runs on Tile IR, after lowering: loops, their bounds and the masks are
//! all visible there, every consumer (Target IR, the CPU interpreter) sees the
//! result, and nothing is specific to a kernel or a spelling. Two rewrites:
//!
//! * **Unmasking.** A select whose mask varies with the loop variable becomes
//!   uniform branches: `if <mask all-true this iteration> { a } else if
//!   <all-false> { b } else { the mask and the select }` (a test left out
//!   where its iterations were cut from the loop, see below). The mask's index
//!   tiles, compare and select (and, on a GPU, their layout conversions) run
//!   only on the mixed iterations. A branch rather than a split loop: the body is not duplicated
//!   (the kernel's code stays the size it was), and the branch is uniform (a
//!   scalar of the loop variable and program-wide values).
//! * **Skipping.** Iterations where a mask is all-false (or all-true, for a
//!   `where(mask, -inf, s)` spelling) are dropped when the body then provably
//!   leaves every carried value unchanged: the loop's upper bound is clamped
//!   (`min(hi, B)`) where those iterations are a suffix, its lower bound raised
//!   where they are a prefix (a sliding window). A body with a store or an
//!   atomic is never skipped.
//!
//! # When skipping is sound
//!
//! The body is evaluated abstractly with the mask fixed: each value is known
//! to be -inf, 0 or 1 everywhere, equal to a carried value (or a structural
//! function of such values), or unknown. The iteration is an identity when
//! every yielded value is its carried value. The rules are exact IEEE
//! identities (`max(x, -inf) = x`, `exp(-inf) = 0`, `exp(0) = 1`, `x * 1 = x`,
//! `x + 0 = x` up to the sign of a zero, `reduce(max)` of an all -inf tile) plus
//! three that hold for finite operands only: `x - x = 0`, `x * 0 = 0` and
//! `dot(0, B) = 0`, and `-inf - x = -inf`. So skipping assumes the data and
//! the carried values the skipped iterations would have combined are finite,
//! the assumption every flash-attention kernel makes: with an infinite or NaN
//! value of `v` past the diagonal, or a row whose running maximum is still
//! -inf (every score so far masked), the unskipped loop produces NaN there and
//! the skipped one keeps the state it had. Online softmax (`m = max(m, max(s))`,
//! `p = exp(s - m)`, `l = l * exp(m_old - m) + sum(p)`,
//! `acc = acc * alpha + dot(p, v)`) with `s` masked to -inf is an identity
//! under these rules; a body that stores, or whose carried values change for a
//! masked tile in any other way, is not.
//!
//! # What is recognised
//!
//! Integer tiles are affine when built from the loop variable, constants,
//! program ids, tensor dims, scalar parameters and values defined before the
//! loop by `arange`, `splat`, `broadcast`, `expand_dims`, `transpose`, `add`,
//! `sub`, multiplication by a constant and widening casts. A mask is a
//! comparison (`<`, `<=`, `>`, `>=`) of two affine tiles, or `&`, `|`, `~` of
//! masks. Only selects in the loop body itself (not in a nested `if` or loop)
//! and masks that depend on the loop variable are rewritten; skipping needs a
//! constant positive step.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::*;
use crate::syntax::span::Span;

/// A term of an affine form other than the loop variable.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Sym {
    /// A scalar defined before the loop.
    Value(Value),
    ProgramId(u8),
    NumPrograms(u8),
    Dim(usize, usize),
    Param(usize),
}

/// `c + iv * iv_coef + sum(sym * coef) + sum over axes (index * idx[axis])`.
#[derive(Clone, Debug, PartialEq)]
struct Affine {
    c: i64,
    iv: i64,
    syms: BTreeMap<Sym, i64>,
    /// Per axis of the tile (0 on axes of size 1).
    idx: Vec<i64>,
}

impl Affine {
    fn constant(c: i64, rank: usize) -> Affine {
        Affine {
            c,
            iv: 0,
            syms: BTreeMap::new(),
            idx: vec![0; rank],
        }
    }

    /// `self + other * k`, `None` on overflow.
    fn add_scaled(&self, other: &Affine, k: i64) -> Option<Affine> {
        let mut r = self.clone();
        r.c = r.c.checked_add(other.c.checked_mul(k)?)?;
        r.iv = r.iv.checked_add(other.iv.checked_mul(k)?)?;
        for (s, c) in &other.syms {
            let e = r.syms.entry(s.clone()).or_insert(0);
            *e = e.checked_add(c.checked_mul(k)?)?;
        }
        r.syms.retain(|_, c| *c != 0);
        if r.idx.len() != other.idx.len() {
            return None;
        }
        for (a, b) in r.idx.iter_mut().zip(&other.idx) {
            *a = a.checked_add(b.checked_mul(k)?)?;
        }
        Some(r)
    }

    fn scale(&self, k: i64) -> Option<Affine> {
        Affine::constant(0, self.idx.len()).add_scaled(self, k)
    }

    /// The scalar part (no element index).
    fn scalar(&self) -> Affine {
        Affine {
            idx: Vec::new(),
            ..self.clone()
        }
    }
}

/// A condition on the loop variable, true only where a mask is uniform.
#[derive(Clone, Debug, PartialEq)]
enum Cond {
    /// `iv * a + g >= 0`, `g` free of the loop variable and of element
    /// indices, computed in `dtype`.
    Atom {
        a: i64,
        g: Affine,
        dtype: DType,
    },
    All(Vec<Cond>),
    Any(Vec<Cond>),
}

impl Cond {
    fn uses_iv(&self) -> bool {
        match self {
            Cond::Atom { a, .. } => *a != 0,
            Cond::All(cs) | Cond::Any(cs) => cs.iter().any(Cond::uses_iv),
        }
    }

    fn all(a: Option<Cond>, b: Option<Cond>) -> Option<Cond> {
        Some(Cond::All(vec![a?, b?]))
    }

    fn any(a: Option<Cond>, b: Option<Cond>) -> Option<Cond> {
        match (a, b) {
            (Some(a), Some(b)) => Some(Cond::Any(vec![a, b])),
            (a, b) => a.or(b),
        }
    }
}

/// When a bool tile is all-true and when it is all-false (sufficient conditions).
#[derive(Clone, Debug, Default)]
struct Uniform {
    all_true: Option<Cond>,
    all_false: Option<Cond>,
}

impl Kernel {
    /// Unmasks loop iterations where a mask is all-true and skips those where
    /// it makes the body an identity (see the module docs).
    pub fn specialise_masks(&mut self) {
        let mut defs = HashMap::new();
        collect_defs(&self.body, &mut defs);
        let mut body = std::mem::take(&mut self.body);
        let mut pass = Pass {
            types: &mut self.types,
            params: &self.params,
            defs,
        };
        pass.region(&mut body);
        self.body = body;
    }
}

fn collect_defs(r: &Region, defs: &mut HashMap<Value, OpKind>) {
    for op in &r.ops {
        let regions = op.kind.regions();
        if regions.is_empty() {
            for v in &op.results {
                defs.insert(*v, op.kind.clone());
            }
        }
        for sub in regions {
            collect_defs(sub, defs);
        }
    }
}

fn collect_inside(r: &Region, out: &mut HashSet<Value>) {
    out.extend(r.args.iter().copied());
    for op in &r.ops {
        out.extend(op.results.iter().copied());
        for sub in op.kind.regions() {
            collect_inside(sub, out);
        }
    }
}

fn has_effects(r: &Region) -> bool {
    r.ops.iter().any(|op| {
        matches!(op.kind, OpKind::Store { .. } | OpKind::AtomicAdd { .. })
            || op.kind.regions().into_iter().any(has_effects)
    })
}

struct Pass<'a> {
    types: &'a mut Vec<Type>,
    params: &'a [Param],
    /// The defining op of every value defined by an op without regions.
    defs: HashMap<Value, OpKind>,
}

/// One loop under analysis.
struct Loop<'a> {
    types: &'a Vec<Type>,
    defs: &'a HashMap<Value, OpKind>,
    iv: Value,
    inside: HashSet<Value>,
    memo: HashMap<Value, Option<Affine>>,
    /// A value defined before the loop for each term met there (so the
    /// rewritten code reuses it instead of reading it again).
    reps: HashMap<Sym, Value>,
}

impl Loop<'_> {
    fn shape(&self, v: Value) -> &[u32] {
        self.types[v.0 as usize].shape()
    }

    fn affine(&mut self, v: Value) -> Option<Affine> {
        if let Some(a) = self.memo.get(&v) {
            return a.clone();
        }
        let a = self.affine_of(v);
        self.memo.insert(v, a.clone());
        a
    }

    fn affine_of(&mut self, v: Value) -> Option<Affine> {
        let ty = &self.types[v.0 as usize];
        if !matches!(ty.dtype(), DType::I32 | DType::I64) {
            return None;
        }
        let rank = ty.shape().len();
        let sym = |s: Sym| {
            let mut a = Affine::constant(0, rank);
            a.syms.insert(s, 1);
            Some(a)
        };
        if v == self.iv {
            let mut a = Affine::constant(0, 0);
            a.iv = 1;
            return Some(a);
        }
        let Some(kind) = self.defs.get(&v).cloned() else {
            // A region argument or a loop's result: a term when it is
            // defined before the loop.
            return (rank == 0 && !self.inside.contains(&v))
                .then(|| sym(Sym::Value(v)))
                .flatten();
        };
        if !self.inside.contains(&v) {
            let leaf = match kind {
                OpKind::ProgramId(d) => Some(Sym::ProgramId(d)),
                OpKind::NumPrograms(d) => Some(Sym::NumPrograms(d)),
                OpKind::TensorDim { param, axis } => Some(Sym::Dim(param, axis)),
                OpKind::ScalarParam(p) => Some(Sym::Param(p)),
                _ => None,
            };
            if let Some(s) = leaf {
                self.reps.entry(s).or_insert(v);
            }
        }
        let mut a = match kind {
            OpKind::Const(Constant::Int(c)) => Some(Affine::constant(c, rank)),
            OpKind::ProgramId(d) => sym(Sym::ProgramId(d)),
            OpKind::NumPrograms(d) => sym(Sym::NumPrograms(d)),
            OpKind::TensorDim { param, axis } => sym(Sym::Dim(param, axis)),
            OpKind::ScalarParam(p) => sym(Sym::Param(p)),
            OpKind::Arange { start, len } => {
                let mut a = self.affine(start)?;
                a.idx = vec![if len > 1 { 1 } else { 0 }];
                Some(a)
            }
            OpKind::Splat { x, .. } => {
                let mut a = self.affine(x)?;
                a.idx = vec![0; rank];
                Some(a)
            }
            OpKind::Broadcast { x, .. } => {
                let a = self.affine(x)?;
                (a.idx.len() == rank).then_some(a)
            }
            OpKind::ExpandDims { x, axis } => {
                let mut a = self.affine(x)?;
                (axis <= a.idx.len()).then(|| {
                    a.idx.insert(axis, 0);
                    a
                })
            }
            OpKind::Transpose { x } => {
                let mut a = self.affine(x)?;
                a.idx.reverse();
                Some(a)
            }
            OpKind::Cast { x, .. } => {
                // Widening (or same-width) integer casts keep the value.
                let from = self.types[x.0 as usize].dtype();
                let ok = matches!(
                    (from, ty.dtype()),
                    (DType::I32, DType::I32 | DType::I64) | (DType::I64, DType::I64)
                );
                if ok {
                    self.affine(x)
                } else {
                    None
                }
            }
            OpKind::Binary { op, a, b } => match op {
                BinaryOp::Add | BinaryOp::Sub => {
                    let (x, y) = (self.affine(a)?, self.affine(b)?);
                    x.add_scaled(&y, if op == BinaryOp::Add { 1 } else { -1 })
                }
                BinaryOp::Mul => {
                    let (x, y) = (self.affine(a)?, self.affine(b)?);
                    let is_const = |t: &Affine| {
                        t.iv == 0 && t.syms.is_empty() && t.idx.iter().all(|c| *c == 0)
                    };
                    if is_const(&y) {
                        x.scale(y.c)
                    } else if is_const(&x) {
                        y.scale(x.c)
                    } else {
                        None
                    }
                }
                _ => None,
            },
            _ => None,
        };
        if a.is_none() && rank == 0 && !self.inside.contains(&v) {
            // Any other scalar computed before the loop is a term.
            a = sym(Sym::Value(v));
        }
        // Every element of an axis of size 1 has index 0.
        let shape = ty.shape().to_vec();
        a.map(|mut a| {
            for (c, n) in a.idx.iter_mut().zip(&shape) {
                if *n <= 1 {
                    *c = 0;
                }
            }
            a
        })
    }

    /// When the bool tile `v` is all-true and when all-false.
    fn uniform(&mut self, v: Value) -> Uniform {
        let Some(kind) = self.defs.get(&v).cloned() else {
            return Uniform::default();
        };
        match kind {
            OpKind::Binary { op, a, b } if self.types[a.0 as usize].dtype() != DType::Bool => {
                let (x, y, shift) = match op {
                    BinaryOp::Ge => (a, b, 0),
                    BinaryOp::Gt => (a, b, 1),
                    BinaryOp::Le => (b, a, 0),
                    BinaryOp::Lt => (b, a, 1),
                    _ => return Uniform::default(),
                };
                let dtype = self.types[a.0 as usize].dtype();
                let shape = self.shape(a).to_vec();
                let e = match (self.affine(x), self.affine(y)) {
                    (Some(x), Some(y)) => x.add_scaled(&y, -1),
                    _ => None,
                };
                let Some(mut e) = e else {
                    return Uniform::default();
                };
                // Each element tests `e >= 0`; `e` ranges over
                // [e.c + lo, e.c + hi] as the indices vary.
                let Some(c) = e.c.checked_sub(shift) else {
                    return Uniform::default();
                };
                e.c = c;
                let (mut lo, mut hi) = (0i64, 0i64);
                for (k, n) in e.idx.iter().zip(&shape) {
                    let Some(span) = k.checked_mul(*n as i64 - 1) else {
                        return Uniform::default();
                    };
                    if span < 0 {
                        lo += span;
                    } else {
                        hi += span;
                    }
                }
                let base = e.scalar();
                let all_true = base.c.checked_add(lo).map(|c| Cond::Atom {
                    a: base.iv,
                    g: Affine {
                        c,
                        iv: 0,
                        ..base.clone()
                    },
                    dtype,
                });
                // max(e) < 0, i.e. -(iv * a + g + hi) - 1 >= 0.
                let all_false = base
                    .c
                    .checked_add(hi)
                    .and_then(|c| c.checked_add(1))
                    .and_then(|c| {
                        let g = Affine {
                            c,
                            iv: 0,
                            ..base.clone()
                        };
                        Some(Cond::Atom {
                            a: base.iv.checked_neg()?,
                            g: g.scale(-1)?,
                            dtype,
                        })
                    });
                Uniform {
                    all_true,
                    all_false,
                }
            }
            OpKind::Binary {
                op: op @ (BinaryOp::And | BinaryOp::Or),
                a,
                b,
            } => {
                let (x, y) = (self.uniform(a), self.uniform(b));
                if op == BinaryOp::And {
                    Uniform {
                        all_true: Cond::all(x.all_true, y.all_true),
                        all_false: Cond::any(x.all_false, y.all_false),
                    }
                } else {
                    Uniform {
                        all_true: Cond::any(x.all_true, y.all_true),
                        all_false: Cond::all(x.all_false, y.all_false),
                    }
                }
            }
            OpKind::Unary {
                op: UnaryOp::Not,
                x,
            } => {
                let u = self.uniform(x);
                Uniform {
                    all_true: u.all_false,
                    all_false: u.all_true,
                }
            }
            OpKind::Broadcast { x, .. }
            | OpKind::ExpandDims { x, .. }
            | OpKind::Transpose { x }
            | OpKind::Splat { x, .. } => self.uniform(x),
            _ => Uniform::default(),
        }
    }
}

/// What the abstract evaluation knows of a value (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fact {
    NegInf,
    Zero,
    One,
    True,
    False,
    /// A value of the loop's start state or a structural function of such
    /// values (interned: equal numbers are equal values).
    Sym(u32),
    Unknown,
}

impl Fact {
    fn of_const(c: &Constant) -> Option<Fact> {
        Some(match *c {
            Constant::Float(x) if x == f64::NEG_INFINITY => Fact::NegInf,
            Constant::Float(0.0) => Fact::Zero,
            Constant::Float(1.0) => Fact::One,
            Constant::Int(0) => Fact::Zero,
            Constant::Int(1) => Fact::One,
            Constant::Bool(true) => Fact::True,
            Constant::Bool(false) => Fact::False,
            _ => return None,
        })
    }

    fn uniform(self) -> bool {
        !matches!(self, Fact::Sym(_) | Fact::Unknown)
    }
}

/// Whether one iteration of `body` yields its carried values unchanged when
/// the bool tile `mask` is `all` everywhere.
fn is_identity(
    body: &Region,
    mask: Value,
    all: bool,
    types: &[Type],
    defs: &HashMap<Value, OpKind>,
    inside: &HashSet<Value>,
) -> bool {
    if has_effects(body) {
        return false;
    }
    let mut intern: HashMap<String, u32> = HashMap::new();
    let mut sym = |key: String| {
        let n = intern.len() as u32;
        Fact::Sym(*intern.entry(key).or_insert(n))
    };
    let mut facts: HashMap<Value, Fact> = HashMap::new();
    facts.insert(body.args[0], sym("iv".into()));
    for (i, a) in body.args[1..].iter().enumerate() {
        facts.insert(*a, sym(format!("carried {i}")));
    }
    let carried: Vec<Fact> = body.args[1..].iter().map(|a| facts[a]).collect();
    fn outside(v: Value, defs: &HashMap<Value, OpKind>) -> Option<Fact> {
        match defs.get(&v)? {
            OpKind::Const(c) => Fact::of_const(c),
            OpKind::Splat { x, .. }
            | OpKind::Broadcast { x, .. }
            | OpKind::ExpandDims { x, .. } => outside(*x, defs),
            _ => None,
        }
    }
    for op in &body.ops {
        if let OpKind::Yield(ys) = &op.kind {
            return ys.len() == carried.len()
                && ys
                    .iter()
                    .zip(&carried)
                    .all(|(y, c)| facts.get(y) == Some(c));
        }
        let ops = op.kind.operands();
        let f: Vec<Fact> = ops
            .iter()
            .map(|v| match facts.get(v) {
                Some(f) => *f,
                None if !inside.contains(v) => {
                    outside(*v, defs).unwrap_or_else(|| sym(format!("outer {}", v.0)))
                }
                None => Fact::Unknown,
            })
            .collect();
        let is_float = |v: &Value| types[v.0 as usize].dtype().is_float();
        let fact = if op.results.first() == Some(&mask) {
            if all {
                Fact::True
            } else {
                Fact::False
            }
        } else if !op.kind.regions().is_empty() || op.results.len() != 1 {
            Fact::Unknown
        } else {
            let known = match &op.kind {
                OpKind::Const(c) => Fact::of_const(c),
                OpKind::Select { .. } => match (f[0], f[1], f[2]) {
                    (Fact::True, a, _) => Some(a),
                    (Fact::False, _, b) => Some(b),
                    (_, a, b) if a == b && a != Fact::Unknown => Some(a),
                    _ => None,
                },
                OpKind::Unary { op: u, .. } => match (u, f[0]) {
                    (UnaryOp::Exp | UnaryOp::Exp2, Fact::NegInf) => Some(Fact::Zero),
                    (UnaryOp::Exp | UnaryOp::Exp2, Fact::Zero) => Some(Fact::One),
                    (UnaryOp::Not, Fact::True) => Some(Fact::False),
                    (UnaryOp::Not, Fact::False) => Some(Fact::True),
                    _ => None,
                },
                OpKind::Binary { op: b, a, .. } => {
                    let (x, y) = (f[0], f[1]);
                    match b {
                        BinaryOp::Max if x == Fact::NegInf => Some(y),
                        BinaryOp::Max if y == Fact::NegInf => Some(x),
                        BinaryOp::Max | BinaryOp::Min if x == y && x != Fact::Unknown => Some(x),
                        BinaryOp::Add if x == Fact::Zero => Some(y),
                        BinaryOp::Add | BinaryOp::Sub if y == Fact::Zero => Some(x),
                        BinaryOp::Add
                            if is_float(a) && (x == Fact::NegInf || y == Fact::NegInf) =>
                        {
                            Some(Fact::NegInf)
                        }
                        BinaryOp::Sub if is_float(a) && x == Fact::NegInf && y != Fact::NegInf => {
                            Some(Fact::NegInf)
                        }
                        BinaryOp::Sub if x == y && x != Fact::Unknown && x != Fact::NegInf => {
                            Some(Fact::Zero)
                        }
                        BinaryOp::Mul | BinaryOp::Div if y == Fact::One => Some(x),
                        BinaryOp::Mul if x == Fact::One => Some(y),
                        BinaryOp::Mul
                            if (x == Fact::Zero && y != Fact::NegInf)
                                || (y == Fact::Zero && x != Fact::NegInf) =>
                        {
                            Some(Fact::Zero)
                        }
                        BinaryOp::And if x == Fact::False || y == Fact::False => Some(Fact::False),
                        BinaryOp::And if x == Fact::True => Some(y),
                        BinaryOp::And if y == Fact::True => Some(x),
                        BinaryOp::Or if x == Fact::True || y == Fact::True => Some(Fact::True),
                        BinaryOp::Or if x == Fact::False => Some(y),
                        BinaryOp::Or if y == Fact::False => Some(x),
                        _ => None,
                    }
                }
                OpKind::Reduce { op: r, .. } => match (r, f[0]) {
                    (ReduceOp::Max | ReduceOp::Min, x) if x.uniform() => Some(x),
                    (ReduceOp::Sum, Fact::Zero) => Some(Fact::Zero),
                    _ => None,
                },
                OpKind::Dot { .. } => {
                    let zero = (f[0] == Fact::Zero && f[1] != Fact::NegInf)
                        || (f[1] == Fact::Zero && f[0] != Fact::NegInf);
                    zero.then(|| f.get(2).copied().unwrap_or(Fact::Zero))
                }
                OpKind::Cast { to, .. } => match f[0] {
                    Fact::Zero | Fact::One if to.is_float() || to.is_int() => Some(f[0]),
                    Fact::NegInf if to.is_float() => Some(Fact::NegInf),
                    Fact::True | Fact::False if *to == DType::Bool => Some(f[0]),
                    _ => None,
                },
                OpKind::Splat { .. }
                | OpKind::Broadcast { .. }
                | OpKind::ExpandDims { .. }
                | OpKind::Transpose { .. }
                | OpKind::Extract { .. }
                    if f[0].uniform() =>
                {
                    Some(f[0])
                }
                _ => None,
            };
            match known {
                Some(k) => k,
                // A pure function of known values is a known value; a load
                // reads memory, so two of them are not known equal.
                None if op.kind.is_pure()
                    && !matches!(op.kind, OpKind::Load { .. })
                    && f.iter().all(|x| *x != Fact::Unknown) =>
                {
                    let mut shape = op.kind.clone();
                    shape.map_values(&mut |_| Value(0));
                    sym(format!("{shape:?} {f:?}"))
                }
                None => Fact::Unknown,
            }
        };
        for r in &op.results {
            facts.insert(*r, fact);
        }
    }
    false
}

/// Builds scalar ops into a list.
struct Emit<'a> {
    types: &'a mut Vec<Type>,
    params: &'a [Param],
    ops: Vec<Op>,
    span: Span,
    /// Values defined before the loop for terms, reused.
    reps: HashMap<Sym, Value>,
}

impl Emit<'_> {
    fn push(&mut self, kind: OpKind, ty: Type) -> Value {
        self.types.push(ty);
        let v = Value(self.types.len() as u32 - 1);
        self.ops.push(Op {
            results: vec![v],
            kind,
            span: self.span,
        });
        v
    }

    fn int(&mut self, c: i64, d: DType) -> Value {
        self.push(OpKind::Const(Constant::Int(c)), Type::Scalar(d))
    }

    fn bin(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        let ty = if op.is_comparison() {
            Type::Scalar(DType::Bool)
        } else {
            self.types[a.0 as usize].clone()
        };
        self.push(OpKind::Binary { op, a, b }, ty)
    }

    fn cast_to(&mut self, v: Value, d: DType) -> Value {
        if self.types[v.0 as usize].dtype() == d {
            v
        } else {
            self.push(OpKind::Cast { x: v, to: d }, Type::Scalar(d))
        }
    }

    fn sym(&mut self, s: &Sym, d: DType) -> Value {
        let v = match s {
            s if self.reps.contains_key(s) => self.reps[s],
            Sym::Value(v) => *v,
            Sym::ProgramId(a) => self.push(OpKind::ProgramId(*a), Type::Scalar(DType::I32)),
            Sym::NumPrograms(a) => self.push(OpKind::NumPrograms(*a), Type::Scalar(DType::I32)),
            Sym::Dim(p, a) => self.push(
                OpKind::TensorDim {
                    param: *p,
                    axis: *a,
                },
                Type::Scalar(DType::I32),
            ),
            Sym::Param(p) => {
                let pd = match &self.params[*p].kind {
                    ParamKind::Scalar(pd) => *pd,
                    ParamKind::Tensor { .. } => DType::I32,
                };
                self.push(OpKind::ScalarParam(*p), Type::Scalar(pd))
            }
        };
        self.cast_to(v, d)
    }

    /// The scalar value of `a` (its loop-variable and index terms ignored).
    fn affine(&mut self, a: &Affine, d: DType) -> Value {
        let mut acc: Option<Value> = None;
        for (s, &c) in &a.syms {
            let t = self.sym(s, d);
            acc = Some(match (acc, c) {
                (None, 1) => t,
                (Some(x), 1) => self.bin(BinaryOp::Add, x, t),
                (Some(x), -1) => self.bin(BinaryOp::Sub, x, t),
                (x, c) => {
                    let k = self.int(c, d);
                    let t = self.bin(BinaryOp::Mul, t, k);
                    match x {
                        Some(x) => self.bin(BinaryOp::Add, x, t),
                        None => t,
                    }
                }
            });
        }
        match acc {
            None => self.int(a.c, d),
            Some(x) if a.c == 0 => x,
            Some(x) if a.c > 0 => {
                let k = self.int(a.c, d);
                self.bin(BinaryOp::Add, x, k)
            }
            Some(x) => {
                let k = self.int(a.c.saturating_neg(), d);
                self.bin(BinaryOp::Sub, x, k)
            }
        }
    }
}

/// Applies `op` to the values in turn.
fn fold(e: &mut Emit, op: BinaryOp, vs: Vec<Value>) -> Option<Value> {
    vs.into_iter().reduce(|a, b| e.bin(op, a, b))
}

/// `cond` as a bool scalar: its loop-invariant parts go to `e.ops` (before
/// the loop), the test of the loop variable `iv` to `here` (with span `at`).
fn test(cond: &Cond, iv: Value, e: &mut Emit, here: &mut Vec<Op>, at: Span) -> Value {
    // Runs `f` with `e` emitting into `here`.
    fn inside<T>(e: &mut Emit, here: &mut Vec<Op>, at: Span, f: impl FnOnce(&mut Emit) -> T) -> T {
        std::mem::swap(&mut e.ops, here);
        let span = std::mem::replace(&mut e.span, at);
        let t = f(e);
        e.span = span;
        std::mem::swap(&mut e.ops, here);
        t
    }
    match cond {
        Cond::Atom { a, g, dtype } => {
            let d = *dtype;
            match (*a, g.scale(-1)) {
                (1, Some(neg)) => {
                    let bound = e.affine(&neg, d);
                    inside(e, here, at, |e| {
                        let ivd = e.cast_to(iv, d);
                        e.bin(BinaryOp::Ge, ivd, bound)
                    })
                }
                (-1, _) => {
                    let gv = e.affine(g, d);
                    inside(e, here, at, |e| {
                        let ivd = e.cast_to(iv, d);
                        e.bin(BinaryOp::Le, ivd, gv)
                    })
                }
                (a, _) => {
                    let gv = e.affine(g, d);
                    inside(e, here, at, |e| {
                        let ivd = e.cast_to(iv, d);
                        let k = e.int(a, d);
                        let t = e.bin(BinaryOp::Mul, ivd, k);
                        let t = e.bin(BinaryOp::Add, t, gv);
                        let z = e.int(0, d);
                        e.bin(BinaryOp::Ge, t, z)
                    })
                }
            }
        }
        Cond::All(cs) | Cond::Any(cs) => {
            let vs: Vec<Value> = cs.iter().map(|c| test(c, iv, e, here, at)).collect();
            let op = if matches!(cond, Cond::All(_)) {
                BinaryOp::And
            } else {
                BinaryOp::Or
            };
            inside(e, here, at, |e| fold(e, op, vs)).expect("a condition of at least one atom")
        }
    }
}

/// The least `B` such that `cond` holds for every loop variable `>= B`, in `d`.
fn suffix(cond: &Cond, d: DType, e: &mut Emit) -> Option<Value> {
    match cond {
        Cond::Atom { a, g, dtype } if *a > 0 && *dtype == d => {
            // iv >= ceil(-g / a) = -floor(g / a).
            if *a == 1 {
                return Some(e.affine(&g.scale(-1)?, d));
            }
            let gv = e.affine(g, d);
            let k = e.int(*a, d);
            let q = e.bin(BinaryOp::FloorDiv, gv, k);
            let z = e.int(0, d);
            Some(e.bin(BinaryOp::Sub, z, q))
        }
        Cond::Atom { .. } => None,
        Cond::All(cs) => {
            let vs = cs
                .iter()
                .map(|c| suffix(c, d, e))
                .collect::<Option<Vec<_>>>()?;
            fold(e, BinaryOp::Max, vs)
        }
        Cond::Any(cs) => {
            let vs = cs.iter().filter_map(|c| suffix(c, d, e)).collect();
            fold(e, BinaryOp::Min, vs)
        }
    }
}

/// The greatest `P` such that `cond` holds for every loop variable `<= P`.
fn prefix(cond: &Cond, d: DType, e: &mut Emit) -> Option<Value> {
    match cond {
        Cond::Atom { a, g, dtype } if *a < 0 && *dtype == d => {
            // iv <= floor(g / -a).
            let gv = e.affine(g, d);
            if *a == -1 {
                return Some(gv);
            }
            let k = e.int(a.checked_neg()?, d);
            Some(e.bin(BinaryOp::FloorDiv, gv, k))
        }
        Cond::Atom { .. } => None,
        Cond::All(cs) => {
            let vs = cs
                .iter()
                .map(|c| prefix(c, d, e))
                .collect::<Option<Vec<_>>>()?;
            fold(e, BinaryOp::Min, vs)
        }
        Cond::Any(cs) => {
            let vs = cs.iter().filter_map(|c| prefix(c, d, e)).collect();
            fold(e, BinaryOp::Max, vs)
        }
    }
}

/// Whether a loop bound `hi` is already at most the suffix bound of `cond`
/// (a `min` with that bound among its operands), so clamping adds nothing.
fn already_clamped(l: &mut Loop, hi: Value, cond: &Cond) -> bool {
    let Cond::Atom { a: 1, g, .. } = cond else {
        return false;
    };
    let Some(bound) = g.scale(-1) else {
        return false;
    };
    let mut stack = vec![hi];
    while let Some(v) = stack.pop() {
        if l.affine(v).map(|a| a.scalar()) == Some(bound.clone()) {
            return true;
        }
        if let Some(OpKind::Binary {
            op: BinaryOp::Min,
            a,
            b,
        }) = l.defs.get(&v)
        {
            stack.extend([*a, *b]);
        }
    }
    false
}

impl Pass<'_> {
    fn region(&mut self, r: &mut Region) {
        let ops = std::mem::take(&mut r.ops);
        let mut out = Vec::with_capacity(ops.len());
        for mut op in ops {
            for sub in op.kind.regions_mut() {
                self.region(sub);
            }
            if matches!(op.kind, OpKind::For { .. }) {
                let pre = self.for_loop(&mut op);
                out.extend(pre);
            }
            out.push(op);
        }
        r.ops = out;
    }

    /// Rewrites one `for` op; returns the ops to put before it.
    fn for_loop(&mut self, op: &mut Op) -> Vec<Op> {
        let span = op.span;
        let OpKind::For {
            lo, hi, step, body, ..
        } = &mut op.kind
        else {
            return Vec::new();
        };
        if !body
            .ops
            .iter()
            .any(|o| matches!(o.kind, OpKind::Select { .. }))
        {
            return Vec::new();
        }
        let iv = body.args[0];
        let ivd = self.types[iv.0 as usize].dtype();
        let step_c = match self.defs.get(step) {
            Some(OpKind::Const(Constant::Int(s))) if *s > 0 => Some(*s),
            _ => None,
        };
        let mut inside = HashSet::new();
        collect_inside(body, &mut inside);
        let mut l = Loop {
            types: self.types,
            defs: &self.defs,
            iv,
            inside,
            memo: HashMap::new(),
            reps: HashMap::new(),
        };
        // The masks of the body's selects that vary with the loop variable.
        let mut masks: Vec<(Value, Uniform)> = Vec::new();
        for o in &body.ops {
            if let OpKind::Select { cond, .. } = o.kind {
                if masks.iter().any(|(m, _)| *m == cond) {
                    continue;
                }
                let u = l.uniform(cond);
                let varies = |c: &Option<Cond>| c.as_ref().is_some_and(Cond::uses_iv);
                if varies(&u.all_true) || varies(&u.all_false) {
                    masks.push((cond, u));
                }
            }
        }
        if masks.is_empty() {
            return Vec::new();
        }
        // Skipping (a positive step only: the bounds below assume the loop
        // variable grows): the conditions under which a mask makes the body
        // an identity, and whether the upper bound already stops there.
        let mut skips: Vec<(Cond, bool)> = Vec::new();
        let mut skipped: HashSet<(Value, bool)> = HashSet::new();
        if step_c.is_some() {
            for (mask, u) in &masks {
                for (all, cond) in [(false, &u.all_false), (true, &u.all_true)] {
                    let Some(cond) = cond else { continue };
                    if cond.uses_iv()
                        && is_identity(body, *mask, all, l.types, &self.defs, &l.inside)
                    {
                        skips.push((cond.clone(), already_clamped(&mut l, *hi, cond)));
                        skipped.insert((*mask, all));
                    }
                }
            }
        }
        let reps = std::mem::take(&mut l.reps);
        let mut pre = Emit {
            types: self.types,
            params: self.params,
            ops: Vec::new(),
            span,
            reps,
        };
        let mut new_hi = *hi;
        let mut new_lo = *lo;
        for (cond, clamped) in &skips {
            if !clamped {
                if let Some(b) = suffix(cond, ivd, &mut pre) {
                    new_hi = pre.bin(BinaryOp::Min, new_hi, b);
                }
            }
            if let (Some(p), Some(s)) = (prefix(cond, ivd, &mut pre), step_c) {
                // The first iteration past `p`: lo + max(0, (p - lo) // s + 1) * s.
                let d = pre.bin(BinaryOp::Sub, p, *lo);
                let sv = pre.int(s, ivd);
                let q = pre.bin(BinaryOp::FloorDiv, d, sv);
                let one = pre.int(1, ivd);
                let q = pre.bin(BinaryOp::Add, q, one);
                let z = pre.int(0, ivd);
                let q = pre.bin(BinaryOp::Max, q, z);
                let off = pre.bin(BinaryOp::Mul, q, sv);
                let first = pre.bin(BinaryOp::Add, *lo, off);
                new_lo = pre.bin(BinaryOp::Max, new_lo, first);
            }
        }
        *hi = new_hi;
        *lo = new_lo;
        // Unmasking: each select of a mask that is uniform on some iterations
        // becomes uniform branches: `if all-true { a } else if all-false { b }
        // else { mask; select }`, leaving out a test whose iterations were cut
        // from the loop above.
        let ops = std::mem::take(&mut body.ops);
        let index: HashMap<Value, usize> = ops
            .iter()
            .enumerate()
            .flat_map(|(i, o)| o.results.iter().map(move |r| (*r, i)))
            .collect();
        let mut out = Vec::with_capacity(ops.len());
        for o in &ops {
            let OpKind::Select { cond, a, b } = o.kind else {
                out.push(o.clone());
                continue;
            };
            let Some((_, u)) = masks.iter().find(|(m, _)| *m == cond) else {
                out.push(o.clone());
                continue;
            };
            let live = |c: &Option<Cond>, all: bool| {
                c.clone()
                    .filter(|c| c.uses_iv() && !skipped.contains(&(cond, all)))
            };
            let (all_true, all_false) = (live(&u.all_true, true), live(&u.all_false, false));
            if all_true.is_none() && all_false.is_none() {
                out.push(o.clone());
                continue;
            }
            let Some(cone) = mask_cone(&ops, &index, cond) else {
                out.push(o.clone());
                continue;
            };
            // The mask, recomputed in the branch that needs it.
            let mut map: HashMap<Value, Value> = HashMap::new();
            let mut masked = Vec::new();
            for &i in &cone {
                let mut c = ops[i].clone();
                c.kind
                    .map_values(&mut |v| map.get(&v).copied().unwrap_or(v));
                for r in &mut c.results {
                    pre.types.push(pre.types[r.0 as usize].clone());
                    let n = Value(pre.types.len() as u32 - 1);
                    map.insert(*r, n);
                    *r = n;
                }
                masked.push(c);
            }
            let res = o.results[0];
            let ty = pre.types[res.0 as usize].clone();
            let fresh = |types: &mut Vec<Type>| {
                types.push(ty.clone());
                Value(types.len() as u32 - 1)
            };
            let sel = fresh(pre.types);
            masked.push(Op {
                results: vec![sel],
                kind: OpKind::Select {
                    cond: map.get(&cond).copied().unwrap_or(cond),
                    a,
                    b,
                },
                span: o.span,
            });
            masked.push(Op {
                results: vec![],
                kind: OpKind::Yield(vec![sel]),
                span: o.span,
            });
            let yield_of = |v: Value| Region {
                args: vec![],
                ops: vec![Op {
                    results: vec![],
                    kind: OpKind::Yield(vec![v]),
                    span: o.span,
                }],
            };
            // `if <uniform> { v } else { rest }`, as the ops of a region
            // yielding its result into `into`.
            let branch = |cond_: &Cond, v: Value, rest: Vec<Op>, into: Value, pre: &mut Emit| {
                let mut here = Vec::new();
                let t = test(cond_, iv, pre, &mut here, o.span);
                here.push(Op {
                    results: vec![into],
                    kind: OpKind::If {
                        cond: t,
                        then: yield_of(v),
                        otherwise: Region {
                            args: vec![],
                            ops: rest,
                        },
                    },
                    span: o.span,
                });
                here
            };
            let rest = match &all_false {
                Some(f) if all_true.is_some() => {
                    let r = fresh(pre.types);
                    let mut ops = branch(f, b, masked, r, &mut pre);
                    ops.push(Op {
                        results: vec![],
                        kind: OpKind::Yield(vec![r]),
                        span: o.span,
                    });
                    ops
                }
                Some(f) => {
                    out.extend(branch(f, b, masked, res, &mut pre));
                    continue;
                }
                None => masked,
            };
            let t = all_true.expect("one of the two conditions");
            out.extend(branch(&t, a, rest, res, &mut pre));
        }
        body.ops = out;
        pre.ops
    }
}

/// The ops of the loop body (indices, in order) that compute `mask`: index
/// arithmetic only, so recomputing them in a branch is cheap. `None` when the
/// mask needs anything else from the body.
fn mask_cone(ops: &[Op], index: &HashMap<Value, usize>, mask: Value) -> Option<Vec<usize>> {
    let mut seen = HashSet::new();
    let mut stack = vec![mask];
    while let Some(v) = stack.pop() {
        let Some(&i) = index.get(&v) else { continue };
        if !seen.insert(i) {
            continue;
        }
        let k = &ops[i].kind;
        let cheap = matches!(
            k,
            OpKind::Const(_)
                | OpKind::ProgramId(_)
                | OpKind::NumPrograms(_)
                | OpKind::TensorDim { .. }
                | OpKind::ScalarParam(_)
                | OpKind::Unary { .. }
                | OpKind::Binary { .. }
                | OpKind::Cast { .. }
                | OpKind::Splat { .. }
                | OpKind::Broadcast { .. }
                | OpKind::ExpandDims { .. }
                | OpKind::Transpose { .. }
                | OpKind::Arange { .. }
        );
        if !cheap {
            return None;
        }
        stack.extend(k.operands());
    }
    let mut cone: Vec<usize> = seen.into_iter().collect();
    cone.sort_unstable();
    Some(cone)
}
