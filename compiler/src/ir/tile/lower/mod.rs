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

use std::collections::{BTreeMap, HashMap, HashSet};

use super::env::ScopedEnv;
use super::*;
use crate::check::builtins::{Builtin, Builtin as B};
use crate::check::consts::{eval_const, fold_binary, fold_call, fold_unary};
use crate::check::ctx::Checker;
use crate::check::dims::Dim as SymDim;
use crate::check::expr::{broadcast, Kind};
use crate::check::scope::{annotation, Annot, Entry, ModuleScope};
use crate::check::stmt::assigned_names;
use crate::check::{Ty, Value as CValue};
use crate::diag::Diagnostic;
use crate::syntax::ast::{self, Arg, BinOp, Expr, ExprKind, Function, Index, Stmt, StmtKind};
use crate::target::{check_num_stages, check_num_warps, Arch};

/// The compile-time values a kernel is lowered with: const parameters (by
/// name; bools as 0/1) and specialised tensor dims. Names that are neither are
/// ignored, so one specialization can serve every kernel of a file.
///
/// `divisors` are divisibility assumptions (`-D K%8`): a run-time tensor dim or
/// integer scalar parameter is promised to be a multiple of a power of two
/// without fixing its value. The kernel records them (`Kernel::divisibility`),
/// the code generator uses them in alignment proofs (vector loads, `cp.async`)
/// and checks them at kernel entry (a launch that breaks one traps). A divisor
/// of a name that is fixed (`-D K=64`, a const parameter) must divide its value
/// (E0513).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Specialization {
    pub values: BTreeMap<String, i64>,
    pub divisors: BTreeMap<String, u64>,
    /// Float const parameters given at a launch (`s=3.0`), as `f64` bit
    /// patterns so that the specialization stays a hashable query key.
    pub floats: BTreeMap<String, u64>,
}

/// One `-D` argument: `NAME=VALUE` fixes a value, `NAME%DIVISOR` assumes a
/// power-of-two divisor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Define {
    Value(String, i64),
    Divisor(String, u64),
}

impl Define {
    pub fn name(&self) -> &str {
        match self {
            Define::Value(n, _) | Define::Divisor(n, _) => n,
        }
    }
}

fn check_define_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        || name.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!("`{name}` is not a name"));
    }
    Ok(())
}

impl Specialization {
    pub fn new() -> Self {
        Specialization::default()
    }

    pub fn with(mut self, name: impl Into<String>, value: i64) -> Self {
        self.values.insert(name.into(), value);
        self
    }

    pub fn get(&self, name: &str) -> Option<i64> {
        self.values.get(name).copied()
    }

    pub fn with_divisor(mut self, name: impl Into<String>, divisor: u64) -> Self {
        self.divisors.insert(name.into(), divisor);
        self
    }

    /// Adds one `-D` argument (the last of several for one name wins).
    pub fn add(&mut self, d: &Define) {
        match d {
            Define::Value(n, v) => {
                self.values.insert(n.clone(), *v);
            }
            Define::Divisor(n, k) => {
                self.divisors.insert(n.clone(), *k);
            }
        }
    }

    /// Parses one `-D` argument: `NAME=VALUE` (see `parse_define`) or
    /// `NAME%DIVISOR`, a power of two from 2 to 2^30 (`K%8`: K is a multiple of 8).
    pub fn parse_define_arg(text: &str) -> Result<Define, String> {
        match (text.split_once('%'), text.contains('=')) {
            (Some((name, k)), false) => {
                let name = name.trim();
                check_define_name(name)?;
                let k = k.trim().replace('_', "");
                match k.parse::<i64>() {
                    Ok(n) if (2..=1 << 30).contains(&n) && n.count_ones() == 1 => {
                        Ok(Define::Divisor(name.to_string(), n as u64))
                    }
                    Ok(_) => Err(format!(
                        "`{text}`: the divisor must be a power of two from 2 to 2^30 (e.g. `{name}%8`)"
                    )),
                    Err(_) => Err(format!(
                        "`{text}`: `{}` is not an integer divisor (NAME%DIVISOR, e.g. `{name}%8`)",
                        k
                    )),
                }
            }
            _ => Self::parse_define(text).map(|(n, v)| Define::Value(n, v)),
        }
    }

    /// Sets a float const parameter.
    pub fn with_float(mut self, name: impl Into<String>, value: f64) -> Self {
        self.floats.insert(name.into(), value.to_bits());
        self
    }

    /// The float given for a const parameter.
    pub fn float(&self, name: &str) -> Option<f64> {
        self.floats.get(name).map(|b| f64::from_bits(*b))
    }

    /// Parses `NAME=VALUE` (`-D` on the command line): an integer (`128`,
    /// `0x80`, `1_024`, `-1`) or a bool (`True`/`False`, `true`/`false`).
    pub fn parse_define(text: &str) -> Result<(String, i64), String> {
        let Some((name, value)) = text.split_once('=') else {
            return Err(format!("`{text}` is not NAME=VALUE or NAME%DIVISOR"));
        };
        let name = name.trim();
        check_define_name(name)?;
        let v = value.trim().replace('_', "");
        let parsed = match v.as_str() {
            "True" | "true" => Some(1),
            "False" | "false" => Some(0),
            _ => {
                let (neg, digits) = match v.strip_prefix('-') {
                    Some(d) => (true, d),
                    None => (false, v.as_str()),
                };
                let n = match digits
                    .strip_prefix("0x")
                    .or_else(|| digits.strip_prefix("0X"))
                {
                    Some(hex) => i64::from_str_radix(hex, 16).ok(),
                    None => digits.parse::<i64>().ok(),
                };
                n.map(|n| if neg { -n } else { n })
            }
        };
        match parsed {
            Some(n) => Ok((name.to_string(), n)),
            None => Err(format!(
                "`{}` is not an integer or a bool (for `{name}`)",
                value.trim()
            )),
        }
    }
}

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
                l.diags.push(Diagnostic::new(
                    "E0512",
                    f.name.span,
                    format!("kernel `{}` could not be lowered", f.name.name),
                ));
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

/// The items of a constant tuple or list, as lowering values.
fn const_items(items: &[CValue]) -> Vec<LV> {
    items
        .iter()
        .map(|v| match v {
            CValue::Int(_) => LV::Const {
                c: v.clone(),
                dtype: DType::I32,
                weak: true,
            },
            CValue::Float(_) => LV::Const {
                c: v.clone(),
                dtype: DType::F32,
                weak: true,
            },
            CValue::Bool(_) => LV::Const {
                c: v.clone(),
                dtype: DType::Bool,
                weak: true,
            },
            CValue::Str(s) => LV::Str(s.clone()),
            CValue::DType(d) => LV::DType(*d),
            CValue::Tuple(t) => LV::List(const_items(t)),
            CValue::None => LV::NoneV,
        })
        .collect()
}

fn tile_type(shape: Vec<u32>, dtype: DType) -> Type {
    if shape.is_empty() {
        Type::Scalar(dtype)
    } else {
        Type::Tile { shape, dtype }
    }
}

fn const_bits(c: Constant) -> u64 {
    match c {
        Constant::Int(i) => i as u64,
        Constant::Float(x) => x.to_bits(),
        Constant::Bool(b) => b as u64,
    }
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

/// Every name read by an expression.
fn expr_reads(e: &Expr, out: &mut HashSet<String>) {
    work(1);
    match &e.kind {
        ExprKind::Name(id) => {
            out.insert(id.name.clone());
        }
        ExprKind::Unary { operand, .. } => expr_reads(operand, out),
        ExprKind::Binary { lhs, rhs, .. } => {
            expr_reads(lhs, out);
            expr_reads(rhs, out);
        }
        ExprKind::IfElse {
            cond,
            then,
            otherwise,
        } => {
            expr_reads(cond, out);
            expr_reads(then, out);
            expr_reads(otherwise, out);
        }
        ExprKind::Call { func, args } => {
            expr_reads(func, out);
            for a in args {
                expr_reads(&a.value, out);
            }
        }
        ExprKind::Subscript { value, indices } => {
            expr_reads(value, out);
            for i in indices {
                match i {
                    Index::Expr(e) => expr_reads(e, out),
                    Index::Slice {
                        start, end, step, ..
                    } => {
                        for e in [start, end, step].into_iter().flatten() {
                            expr_reads(e, out);
                        }
                    }
                }
            }
        }
        ExprKind::Attribute { value, .. } => expr_reads(value, out),
        ExprKind::Tuple(v) | ExprKind::List(v) => v.iter().for_each(|x| expr_reads(x, out)),
        ExprKind::Dict(v) => v.iter().for_each(|(a, b)| {
            expr_reads(a, out);
            expr_reads(b, out);
        }),
        _ => {}
    }
}

/// The names a statement reads itself, its nested blocks left out (targets of
/// plain assignments are not reads).
fn own_reads(s: &Stmt, out: &mut HashSet<String>) {
    match &s.kind {
        StmtKind::Expr(e) | StmtKind::Return(Some(e)) => expr_reads(e, out),
        StmtKind::Assign { target, value, .. } => {
            expr_reads(value, out);
            if !matches!(target.kind, ExprKind::Name(_) | ExprKind::Tuple(_)) {
                expr_reads(target, out);
            }
        }
        StmtKind::AugAssign { target, value, .. } => {
            expr_reads(target, out);
            expr_reads(value, out);
        }
        StmtKind::If { branches, .. } => {
            for (c, _) in branches {
                expr_reads(c, out);
            }
        }
        StmtKind::For { iter, .. } => expr_reads(iter, out),
        StmtKind::While { cond, .. } => expr_reads(cond, out),
        _ => {}
    }
}

/// The blocks nested in a statement, in source order.
fn nested_blocks(s: &Stmt) -> Vec<&[Stmt]> {
    match &s.kind {
        StmtKind::If { branches, orelse } => branches
            .iter()
            .map(|(_, b)| b.as_slice())
            .chain(orelse.as_deref())
            .collect(),
        StmtKind::For { body, .. } | StmtKind::While { body, .. } => vec![body],
        _ => Vec::new(),
    }
}

/// Which names a kernel reads where, built once so that liveness is a lookup.
/// Statements are numbered in source order, each before the statements nested
/// in it; then the rest of any block, and a whole loop body, is one range of
/// positions, and a name is read there if one of its positions is in it.
/// (Asking each statement for the reads of the rest of its block would cost
/// the square of a long kernel's length.)
#[derive(Default)]
struct Reads {
    /// A statement's address: its position and the end of its nested ones.
    at: HashMap<usize, (u32, u32)>,
    /// Each name: the positions of the statements reading it, ascending.
    by_name: HashMap<String, Vec<u32>>,
}

impl Reads {
    fn new(body: &[Stmt]) -> Reads {
        let mut r = Reads::default();
        let mut next = 0;
        // An explicit stack: nesting may be thousands of blocks deep.
        let mut stack: Vec<(&Stmt, bool)> = body.iter().rev().map(|s| (s, false)).collect();
        let mut names = HashSet::new();
        while let Some((s, done)) = stack.pop() {
            work(1);
            let key = s as *const Stmt as usize;
            if done {
                if let Some(e) = r.at.get_mut(&key) {
                    e.1 = next;
                }
                continue;
            }
            own_reads(s, &mut names);
            for n in names.drain() {
                r.by_name.entry(n).or_default().push(next);
            }
            r.at.insert(key, (next, next));
            next += 1;
            stack.push((s, true));
            for b in nested_blocks(s).into_iter().rev() {
                stack.extend(b.iter().rev().map(|s| (s, false)));
            }
        }
        r
    }

    /// The positions of `stmts` (consecutive statements of one block).
    fn span_of(&self, stmts: &[Stmt]) -> (u32, u32) {
        match (stmts.first(), stmts.last()) {
            (Some(a), Some(b)) => (
                self.at[&(a as *const Stmt as usize)].0,
                self.at[&(b as *const Stmt as usize)].1,
            ),
            _ => (0, 0),
        }
    }

    fn position(&self, s: &Stmt) -> u32 {
        self.at[&(s as *const Stmt as usize)].0
    }

    /// Whether `name` is read at a position in `from..to`.
    fn read_in(&self, name: &str, from: u32, to: u32) -> bool {
        self.by_name.get(name).is_some_and(|ps| {
            let i = ps.partition_point(|&p| p < from);
            ps.get(i).is_some_and(|&p| p < to)
        })
    }
}

/// The names read after a point of the kernel: the positions (see [`Reads`])
/// of the rest of its block, then those of each enclosing block's rest and
/// loop body, outwards.
#[derive(Clone, Copy)]
struct Live<'a> {
    from: u32,
    to: u32,
    outer: Option<&'a Live<'a>>,
}

impl<'a> Live<'a> {
    const NONE: Live<'static> = Live {
        from: 0,
        to: 0,
        outer: None,
    };

    fn within(outer: &'a Live<'a>, (from, to): (u32, u32)) -> Live<'a> {
        Live {
            from,
            to,
            outer: Some(outer),
        }
    }

    fn contains(&self, name: &str, reads: &Reads) -> bool {
        let mut at = Some(self);
        while let Some(l) = at {
            work(1);
            if reads.read_in(name, l.from, l.to) {
                return true;
            }
            at = l.outer;
        }
        false
    }
}

/// Synthetic variables of a loop with `break`/`continue`: whether the current
/// iteration still runs, and whether the loop was broken.
const CONT: &str = "%continuing";
const BRK: &str = "%broken";
/// Whether the kernel executed a `return` (inside a loop: carried out of it).
const RET: &str = "%returned";

fn flag(b: bool) -> LV {
    LV::Const {
        c: CValue::Bool(b),
        dtype: DType::Bool,
        weak: false,
    }
}

/// The `break`s and `continue`s of a block that belong to the enclosing loop
/// (nested loops own theirs).
#[derive(Clone, Copy, Default)]
struct Jumps {
    brk: bool,
    cont: bool,
    /// An early `return` (outside loops it guards the rest of the kernel).
    ret: bool,
}

impl Jumps {
    fn any(self) -> bool {
        self.brk || self.cont || self.ret
    }
}

/// Each statement's `Jumps` and whether a `return` is anywhere in it,
/// computed once per kernel, so asking about a block costs its length rather
/// than a walk of everything nested in it (loops ask at every level).
#[derive(Default)]
struct JumpTable(HashMap<*const Stmt, (Jumps, bool)>);

impl JumpTable {
    fn new(body: &[Stmt]) -> JumpTable {
        let mut t = JumpTable::default();
        t.fill(body);
        t
    }

    fn fill(&mut self, stmts: &[Stmt]) -> (Jumps, bool) {
        let mut all = (Jumps::default(), false);
        for s in stmts {
            work(1);
            let own = match &s.kind {
                StmtKind::Break => (
                    Jumps {
                        brk: true,
                        ..Jumps::default()
                    },
                    false,
                ),
                StmtKind::Continue => (
                    Jumps {
                        cont: true,
                        ..Jumps::default()
                    },
                    false,
                ),
                StmtKind::Return(_) => (
                    Jumps {
                        ret: true,
                        ..Jumps::default()
                    },
                    true,
                ),
                StmtKind::For { body, .. } | StmtKind::While { body, .. } => {
                    // A `return` in a nested loop leaves this loop too; the
                    // nested loop owns its `break`s and `continue`s.
                    let (_, ret) = self.fill(body);
                    (
                        Jumps {
                            ret,
                            ..Jumps::default()
                        },
                        ret,
                    )
                }
                StmtKind::If { branches, orelse } => {
                    let mut x = (Jumps::default(), false);
                    for b in branches
                        .iter()
                        .map(|(_, b)| b.as_slice())
                        .chain(orelse.as_deref())
                    {
                        x = or(x, self.fill(b));
                    }
                    x
                }
                _ => (Jumps::default(), false),
            };
            self.0.insert(s as *const Stmt, own);
            all = or(all, own);
        }
        all
    }

    /// The jumps of a block of this kernel.
    fn jumps(&self, stmts: &[Stmt]) -> Jumps {
        let mut j = Jumps::default();
        for s in stmts {
            work(1);
            let own = match self.0.get(&(s as *const Stmt)) {
                Some(own) => own.0,
                None => JumpTable::default().fill(std::slice::from_ref(s)).0,
            };
            j = or((j, false), (own, false)).0;
        }
        j
    }
}

fn or(a: (Jumps, bool), b: (Jumps, bool)) -> (Jumps, bool) {
    (
        Jumps {
            brk: a.0.brk || b.0.brk,
            cont: a.0.cont || b.0.cont,
            ret: a.0.ret || b.0.ret,
        },
        a.1 || b.1,
    )
}

fn contains_loop_return(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| match &s.kind {
        StmtKind::Return(_) => true,
        StmtKind::For { body, .. } | StmtKind::While { body, .. } => contains_loop_return(body),
        StmtKind::If { branches, orelse } => {
            branches.iter().any(|(_, b)| contains_loop_return(b))
                || orelse.as_deref().is_some_and(contains_loop_return)
        }
        _ => false,
    })
}

/// Bound call arguments: one slot per builtin parameter.
struct Args<'e> {
    slots: Vec<Option<&'e Arg>>,
    positional: Vec<&'e Arg>,
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
        self.diags.push(Diagnostic::new(
            "E0512",
            span,
            format!("cannot lower this: {}", what.into()),
        ));
    }

    fn fresh_sym(&mut self) -> SymDim {
        self.next_sym += 1;
        SymDim::symbol(format!("%rt{}", self.next_sym))
    }

    // ---- the kernel ----

    /// E0513 when `name`, fixed to `value`, has an assumed divisor that does
    /// not divide it (`-D K=60 -D K%8`).
    fn check_divisor(&mut self, spec: &Specialization, name: &str, value: i64, span: Span) {
        let Some(&k) = spec.divisors.get(name) else {
            return;
        };
        if !self.divisors_checked.insert(name.to_string()) {
            return;
        }
        if value.rem_euclid(k as i64) != 0 {
            self.diags.push(
                Diagnostic::new(
                    "E0513",
                    span,
                    format!(
                        "`{name}` is {value} in kernel `{}`, which is not a multiple of {k} as `-D {name}%{k}` assumes",
                        self.f.name.name
                    ),
                )
                .with_help(format!(
                    "drop `-D {name}%{k}`, or give `{name}` a value that is a multiple of {k}"
                )),
            );
        }
    }

    fn kernel(&mut self, spec: &Specialization) -> R<Kernel> {
        let f = self.f;
        let scope = self.scope;
        // Autotune: the first configuration of each space entry applies unless specialised.
        let mut tuned: HashMap<String, i64> = HashMap::new();
        if let Some(Some(args)) = f.decorator("autotune").map(|d| &d.args) {
            for a in args {
                if a.name.as_ref().map(|n| n.name.as_str()) != Some("space") {
                    continue;
                }
                if let ExprKind::Dict(pairs) = &a.value.kind {
                    for (k, v) in pairs {
                        if let (
                            ExprKind::Str(name),
                            ExprKind::List(items) | ExprKind::Tuple(items),
                        ) = (&k.kind, &v.kind)
                        {
                            if let Some(first) = items.first() {
                                if let Ok(c) = eval_const(first, &|n| scope.const_value(n)) {
                                    if let Some(i) = c.as_int() {
                                        tuned.insert(name.clone(), i);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        let mut const_vals: HashMap<String, CValue> = HashMap::new();
        // Const parameters first: a tensor dim may name one (`Tensor["M", "BM", f32]`).
        let annots: Vec<(&ast::Param, Annot)> = f
            .params
            .iter()
            .map(|p| {
                let annot = match &p.ty {
                    Some(t) => annotation(t, &|n| scope.const_value(n), &mut Vec::new()),
                    None => Annot::Ty(Ty::Err),
                };
                (p, annot)
            })
            .collect();
        let (consts, others): (Vec<_>, Vec<_>) = annots
            .into_iter()
            .partition(|(_, a)| matches!(a, Annot::Const(_)));
        let ordered = consts.into_iter().chain(others);
        for (p, annot) in ordered {
            let name = &p.name.name;
            match annot {
                Annot::Const(dt) => {
                    let given = spec.get(name).or_else(|| tuned.get(name).copied());
                    let default = p.default.as_ref().and_then(|d| {
                        eval_const(d, &|n| {
                            const_vals.get(n).cloned().or_else(|| scope.const_value(n))
                        })
                        .ok()
                    });
                    let is_bool = dt == Some(DType::Bool)
                        || (dt.is_none() && matches!(default, Some(CValue::Bool(_))));
                    let value = match (given, default) {
                        _ if spec.float(name).is_some() => {
                            CValue::Float(spec.float(name).expect("checked"))
                        }
                        (Some(i), _) if is_bool => CValue::Bool(i != 0),
                        (Some(i), _) => CValue::int(i),
                        (None, Some(v)) => v,
                        (None, None) => {
                            self.diags.push(
                                Diagnostic::new(
                                    "E0511",
                                    p.name.span,
                                    format!(
                                        "kernel `{}` needs a value for const parameter `{name}`, which has no default",
                                        f.name.name
                                    ),
                                )
                                .with_help(format!(
                                    "give it when compiling, e.g. `tsrc emit ... -D {name}=VALUE`, or add a default"
                                )),
                            );
                            continue;
                        }
                    };
                    let (dtype, weak) = match (&value, dt) {
                        (_, Some(d)) => (d, true),
                        (CValue::Int(_), None) => (DType::I32, true),
                        (CValue::Float(_), None) => (DType::F32, true),
                        (CValue::Bool(_), None) => (DType::Bool, true),
                        _ => {
                            // A dtype or string const parameter.
                            const_vals.insert(name.clone(), value.clone());
                            let lv = match value {
                                CValue::DType(d) => LV::DType(d),
                                CValue::Str(s) => LV::Str(s),
                                _ => LV::NoneV,
                            };
                            self.env.insert(name.clone(), lv);
                            continue;
                        }
                    };
                    if let Some(i) = value.as_int() {
                        self.specialization.insert(name.clone(), i);
                        self.check_divisor(spec, name, i, p.name.span);
                    }
                    const_vals.insert(name.clone(), value.clone());
                    self.env.insert(
                        name.clone(),
                        LV::Const {
                            c: value,
                            dtype,
                            weak,
                        },
                    );
                }
                Annot::Ty(Ty::Tensor { dims, dtype }) => {
                    let idx = self.params.len();
                    let mut pdims = Vec::new();
                    for (axis, d) in dims.iter().enumerate() {
                        let pd = if let Some(c) = d.as_const() {
                            Dim::Static(c as u64)
                        } else if let Some(sym) = d.as_symbol() {
                            let given = spec
                                .get(sym)
                                .or_else(|| const_vals.get(sym).and_then(CValue::as_int));
                            match given {
                                Some(v) => {
                                    self.specialization.insert(sym.to_string(), v);
                                    self.check_divisor(spec, sym, v, p.name.span);
                                    Dim::Static(v as u64)
                                }
                                None => {
                                    if let Some(&k) = spec.divisors.get(sym) {
                                        self.divisibility.insert(sym.to_string(), k);
                                    }
                                    Dim::Dynamic(sym.to_string())
                                }
                            }
                        } else {
                            // An affine dim ("4*D"): specialised when all its symbols are.
                            let sub = d.substitute(&|s| {
                                spec.get(s)
                                    .or_else(|| const_vals.get(s).and_then(CValue::as_int))
                                    .map(SymDim::constant)
                            });
                            match sub.and_then(|x| x.as_const()) {
                                Some(v) => {
                                    for s in d.symbols() {
                                        if let Some(x) = spec
                                            .get(s)
                                            .or_else(|| const_vals.get(s).and_then(CValue::as_int))
                                        {
                                            self.specialization.insert(s.to_string(), x);
                                        }
                                    }
                                    Dim::Static(v as u64)
                                }
                                None => Dim::Dynamic(d.to_string()),
                            }
                        };
                        // Dim names are in scope as i32 scalars (first binding wins).
                        if let Some(sym) = d.as_symbol() {
                            if !self.env.contains_key(sym) {
                                let lv = match &pd {
                                    Dim::Static(v) => LV::Const {
                                        c: CValue::int(*v as i64),
                                        dtype: DType::I32,
                                        weak: false,
                                    },
                                    Dim::Dynamic(_) => LV::Val {
                                        v: self.tensor_dim(idx, axis),
                                        weak: false,
                                        sym: Some(SymDim::symbol(sym)),
                                    },
                                };
                                self.env.insert(sym.to_string(), lv);
                            }
                        }
                        pdims.push(pd);
                    }
                    self.params.push(Param {
                        name: name.clone(),
                        kind: ParamKind::Tensor { dims: pdims, dtype },
                    });
                    self.env.insert(name.clone(), LV::Tensor(idx));
                }
                Annot::Ty(Ty::Scalar { dtype, .. }) => {
                    let idx = self.params.len();
                    self.params.push(Param {
                        name: name.clone(),
                        kind: ParamKind::Scalar(dtype),
                    });
                    let v = self.scalar_param(idx, dtype);
                    if let (Some(&k), true) = (spec.divisors.get(name), dtype.is_int()) {
                        self.divisibility.insert(name.clone(), k);
                    }
                    let sym = dtype.is_int().then(|| SymDim::symbol(name.clone()));
                    self.env.insert(
                        name.clone(),
                        LV::Val {
                            v,
                            weak: false,
                            sym,
                        },
                    );
                }
                _ => {
                    self.internal(
                        p.name.span,
                        format!("parameter `{name}` has no usable type"),
                    );
                    return Err(());
                }
            }
        }
        if !self.diags.is_empty() {
            return Err(());
        }
        let mut num_warps = tuned.get("num_warps").copied().unwrap_or(4);
        let mut num_stages = tuned.get("num_stages").copied().unwrap_or(1);
        if let Some(Some(args)) = f.decorator("kernel").map(|d| &d.args) {
            for a in args {
                let which = a.name.as_ref().map(|n| n.name.as_str());
                if !matches!(which, Some("num_warps" | "num_stages")) {
                    continue;
                }
                let v = eval_const(&a.value, &|n| {
                    const_vals.get(n).cloned().or_else(|| scope.const_value(n))
                })
                .ok()
                .and_then(|v| v.as_int());
                let Some(v) = v else {
                    self.internal(a.value.span, "the option is not a constant");
                    return Err(());
                };
                match which {
                    Some("num_warps") if !tuned.contains_key("num_warps") => num_warps = v,
                    Some("num_stages") if !tuned.contains_key("num_stages") => num_stages = v,
                    _ => {}
                }
            }
        }
        for (k, v) in [
            ("num_warps", &mut num_warps),
            ("num_stages", &mut num_stages),
        ] {
            if let Some(x) = spec.get(k) {
                *v = x;
            }
        }
        // Whichever way they came (decorator, autotune space, `-D`, a session
        // or an editor's defines), the options are checked here, where they
        // become the kernel's: the layouts divide by `num_warps`.
        let bad_warps = check_num_warps(num_warps).err().map(|m| ("E0607", m));
        let bad_stages = check_num_stages(num_stages).err().map(|m| ("E0608", m));
        if let Some((code, message)) = bad_warps.or(bad_stages) {
            self.diags.push(
                Diagnostic::new(
                    code,
                    f.name.span,
                    format!("kernel `{}`: {message}", f.name.name),
                )
                .with_help(if code == "E0607" {
                    crate::check::kernel::NUM_WARPS_HELP
                } else {
                    crate::check::kernel::NUM_STAGES_HELP
                }),
            );
            return Err(());
        }
        // A final bare `return` ends the kernel as falling off its end does.
        let body = match f.body.split_last() {
            Some((last, init)) if matches!(last.kind, StmtKind::Return(None)) => init,
            _ => &f.body[..],
        };
        self.jumps = JumpTable::new(body);
        if contains_loop_return(body) {
            // `if row >= M: return` guards the rest of the kernel; a `return`
            // in a loop breaks out of every loop and sets `returned`.
            self.env.insert(CONT.to_string(), flag(true));
            self.env.insert(RET.to_string(), flag(false));
        }
        self.reads = Reads::new(body);
        self.block(body, &Live::NONE)?;
        let b = std::mem::take(&mut self.b);
        let (body, types) = b.finish();
        let mut k = Kernel {
            name: f.name.name.clone(),
            specialization: self.specialization.clone().into_iter().collect(),
            divisibility: self.divisibility.clone().into_iter().collect(),
            params: std::mem::take(&mut self.params),
            num_warps: num_warps as u32,
            num_stages: num_stages as u32,
            body,
            types,
        };
        k.remove_dead_code();
        k.renumber();
        Ok(k)
    }

    // ---- hoisted definitions ----

    fn hoist(&mut self, kind: OpKind, ty: Type) -> Value {
        let v = self.b.value(ty);
        self.b.insert_entry(
            self.prologue,
            Op {
                results: vec![v],
                kind,
                span: Span::default(),
            },
        );
        self.prologue += 1;
        v
    }

    fn tensor_dim(&mut self, param: usize, axis: usize) -> Value {
        if let Some(v) = self.dims.get(&(param, axis)) {
            return *v;
        }
        let v = self.hoist(OpKind::TensorDim { param, axis }, Type::Scalar(DType::I32));
        self.dims.insert((param, axis), v);
        v
    }

    fn scalar_param(&mut self, idx: usize, dtype: DType) -> Value {
        if let Some(v) = self.scalar_params.get(&idx) {
            return *v;
        }
        let v = self.hoist(OpKind::ScalarParam(idx), Type::Scalar(dtype));
        self.scalar_params.insert(idx, v);
        v
    }

    fn constant(&mut self, c: Constant, dtype: DType) -> Value {
        let key = (dtype, const_bits(c));
        if let Some(v) = self.consts.get(&key) {
            return *v;
        }
        let v = self.hoist(OpKind::Const(c), Type::Scalar(dtype));
        self.consts.insert(key, v);
        v
    }

    /// A compile-time value as a constant of `dtype`.
    fn const_of(&mut self, c: &CValue, dtype: DType, span: Span) -> R<Value> {
        let k = match (c, dtype) {
            (CValue::Bool(b), DType::Bool) => Constant::Bool(*b),
            (CValue::Bool(b), d) if d.is_int() => Constant::Int(*b as i64),
            (CValue::Bool(b), d) if d.is_float() => Constant::Float(*b as i64 as f64),
            (CValue::Int(_), DType::Bool) => Constant::Bool(c.as_int() != Some(0)),
            (CValue::Int(_), d) if d.is_int() => match c.as_int() {
                Some(i) => Constant::Int(i),
                None => {
                    self.internal(span, format!("`{c}` is not a constant"));
                    return Err(());
                }
            },
            (CValue::Int(_), _) => match c.as_int() {
                Some(i) => Constant::Float(i as f64),
                None => {
                    self.internal(span, format!("`{c}` is not a constant"));
                    return Err(());
                }
            },
            (CValue::Float(x), d) if d.is_float() => Constant::Float(*x),
            (CValue::Float(x), d) if d.is_int() => Constant::Int(*x as i64),
            (CValue::Float(x), _) => Constant::Bool(*x != 0.0),
            _ => {
                self.internal(span, format!("`{c}` is not a number"));
                return Err(());
            }
        };
        Ok(self.constant(k, dtype))
    }

    // ---- values ----

    /// (dtype, weak, shape) of a scalar or tile.
    fn info(&mut self, lv: &LV, span: Span) -> R<(DType, bool, Vec<u32>)> {
        match lv {
            LV::Val { v, weak, .. } => {
                let t = self.b.ty(*v);
                Ok((t.dtype(), *weak, t.shape().to_vec()))
            }
            LV::Const { dtype, weak, .. } => Ok((*dtype, *weak, Vec::new())),
            other => {
                self.internal(
                    span,
                    format!("expected a number or tile, found a {}", other.describe()),
                );
                Err(())
            }
        }
    }

    fn check_ty(&mut self, lv: &LV, span: Span) -> R<(Ty, Kind)> {
        let (d, weak, shape) = self.info(lv, span)?;
        if shape.is_empty() {
            Ok((Ty::Scalar { dtype: d, weak }, Kind::Scalar))
        } else {
            Ok((
                Ty::Tile {
                    dims: shape.iter().map(|&s| SymDim::constant(s as i64)).collect(),
                    dtype: d,
                },
                Kind::Tile,
            ))
        }
    }

    /// The checker's dtype promotion of two operands.
    fn promote(&mut self, l: &LV, r: &LV, le: &Expr, re: &Expr, what: &str) -> R<(DType, bool)> {
        let (lt, lk) = self.check_ty(l, le.span)?;
        let (rt, rk) = self.check_ty(r, re.span)?;
        let mut ch = Checker::new(self.scope, Arch::default());
        ch.in_kernel = true;
        match ch.promote(&lt, &rt, lk, rk, what, le.span.to(re.span), le, re) {
            Some(x) => Ok(x),
            None => {
                self.diags.extend(ch.diags);
                Err(())
            }
        }
    }

    fn shape_of(&mut self, lv: &LV, span: Span) -> R<Vec<u32>> {
        Ok(self.info(lv, span)?.2)
    }

    fn broadcast_shapes(&mut self, a: &[u32], b: &[u32], span: Span) -> R<Vec<u32>> {
        let to =
            |s: &[u32]| -> Vec<SymDim> { s.iter().map(|&x| SymDim::constant(x as i64)).collect() };
        match broadcast(&to(a), &to(b)) {
            Some(d) => Ok(d.iter().map(|x| x.as_const().unwrap_or(0) as u32).collect()),
            None => {
                self.internal(span, format!("shapes {a:?} and {b:?} do not broadcast"));
                Err(())
            }
        }
    }

    /// `lv` as a value of `dtype` (cast if needed).
    fn materialize(&mut self, lv: &LV, dtype: DType, span: Span) -> R<Value> {
        match lv {
            LV::Const { c, .. } => self.const_of(c, dtype, span),
            LV::Val { v, .. } => {
                let v = *v;
                let t = self.b.ty(v).clone();
                if t.dtype() == dtype {
                    Ok(v)
                } else {
                    Ok(self.b.push1(
                        OpKind::Cast { x: v, to: dtype },
                        tile_type(t.shape().to_vec(), dtype),
                    ))
                }
            }
            other => {
                self.internal(
                    span,
                    format!("expected a number or tile, found a {}", other.describe()),
                );
                Err(())
            }
        }
    }

    /// `lv` converted to `dtype` and broadcast to `shape` (numpy rules).
    fn coerce(&mut self, lv: &LV, dtype: DType, shape: &[u32], span: Span) -> R<Value> {
        let mut v = self.materialize(lv, dtype, span)?;
        let mut s = self.b.ty(v).shape().to_vec();
        if s == shape {
            return Ok(v);
        }
        if s.is_empty() {
            return Ok(self.b.push1(
                OpKind::Splat {
                    x: v,
                    shape: shape.to_vec(),
                },
                tile_type(shape.to_vec(), dtype),
            ));
        }
        if s.len() > shape.len() {
            self.internal(span, format!("cannot broadcast {s:?} to {shape:?}"));
            return Err(());
        }
        while s.len() < shape.len() {
            s.insert(0, 1);
            v = self.b.push1(
                OpKind::ExpandDims { x: v, axis: 0 },
                tile_type(s.clone(), dtype),
            );
        }
        if s != shape {
            if s.iter().zip(shape).any(|(a, b)| a != b && *a != 1) {
                self.internal(span, format!("cannot broadcast {s:?} to {shape:?}"));
                return Err(());
            }
            v = self.b.push1(
                OpKind::Broadcast {
                    x: v,
                    shape: shape.to_vec(),
                },
                tile_type(shape.to_vec(), dtype),
            );
        }
        Ok(v)
    }

    /// A run-time value of `ty`, with a symbolic value when it is an int scalar.
    fn val(&mut self, v: Value, weak: bool) -> LV {
        let t = self.b.ty(v);
        let sym = (t.shape().is_empty() && t.dtype().is_int()).then(|| self.fresh_sym());
        LV::Val { v, weak, sym }
    }

    /// The symbolic integer value of a scalar (for slice lengths).
    fn sym_of(&self, lv: &LV) -> Option<SymDim> {
        match lv {
            LV::Const {
                c: CValue::Int(d), ..
            } => Some(d.clone()),
            LV::Val { sym, .. } => sym.clone(),
            _ => None,
        }
    }

    /// A compile-time integer.
    fn const_int(&mut self, lv: &LV, span: Span, what: &str) -> R<i64> {
        match lv {
            LV::Const { c, .. } => match c.as_int() {
                Some(i) => Ok(i),
                None => {
                    self.internal(span, format!("{what} must be an integer constant"));
                    Err(())
                }
            },
            _ => match self.sym_of(lv).and_then(|d| d.as_const()) {
                Some(i) => Ok(i),
                None => {
                    self.needs_const(span, lv, what);
                    Err(())
                }
            },
        }
    }

    /// E0511 when a size depends on an unspecialised tensor dim; otherwise internal.
    fn needs_const(&mut self, span: Span, lv: &LV, what: &str) {
        let sym = self.sym_of(lv);
        let dim = sym.as_ref().and_then(|d| {
            d.symbols()
                .into_iter()
                .find(|s| !s.starts_with('%'))
                .map(str::to_string)
        });
        match dim {
            Some(name) if self.is_dim(&name) => {
                self.missing_dims.push(name.clone());
                self.diags.push(
                Diagnostic::new(
                    "E0511",
                    span,
                    format!(
                        "{what} depends on the tensor dim `{name}`: kernel `{}` must be specialised on it",
                        self.f.name.name
                    ),
                )
                .with_help(format!("give it a value when compiling, e.g. `-D {name}=128`")),
                )
            }
            _ => self.internal(span, format!("{what} is not known at compile time")),
        }
    }

    fn is_dim(&self, name: &str) -> bool {
        self.params.iter().any(|p| match &p.kind {
            ParamKind::Tensor { dims, .. } => dims.iter().any(|d| match d {
                Dim::Dynamic(s) => {
                    s == name || SymDim::parse(s).is_ok_and(|d| d.symbols().contains(&name))
                }
                Dim::Static(_) => false,
            }),
            _ => false,
        })
    }

    // ---- statements ----

    fn block(&mut self, stmts: &[Stmt], live_after: &Live<'_>) -> R<()> {
        for (i, s) in stmts.iter().enumerate() {
            let live = Live::within(live_after, self.reads.span_of(&stmts[i + 1..]));
            self.stmt(s, &live)?;
            let rest = &stmts[i + 1..];
            if rest.is_empty() || !self.jumps.jumps(std::slice::from_ref(s)).any() {
                continue;
            }
            // After a `break`/`continue` that may have run, the rest is guarded.
            match self.env.get(CONT).cloned() {
                Some(LV::Const {
                    c: CValue::Bool(false),
                    ..
                }) => return Ok(()),
                Some(LV::Val { v, .. }) => return self.guarded(v, rest, live_after, s.span),
                _ => {}
            }
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt, live_after: &Live<'_>) -> R<()> {
        crate::cancel::checkpoint();
        work(1);
        self.b.span = s.span;
        match &s.kind {
            StmtKind::Expr(e) => {
                if matches!(e.kind, ExprKind::Str(_)) {
                    return Ok(()); // a docstring
                }
                self.expr(e)?;
                Ok(())
            }
            StmtKind::Pass => Ok(()),
            StmtKind::Return(Some(_)) => {
                self.internal(s.span, "a kernel returns a value");
                Err(())
            }
            StmtKind::Return(None) if self.env.contains_key(RET) => {
                self.env.insert(CONT.to_string(), flag(false));
                // Outside loops `continuing` guards everything after; inside, the
                // loops exit (`broken`) and `returned` tells the code after them.
                if self.loop_depth > 0 {
                    self.env.insert(RET.to_string(), flag(true));
                    self.env.insert(BRK.to_string(), flag(true));
                }
                Ok(())
            }
            StmtKind::Return(None) => {
                self.internal(s.span, "a `return` the lowering did not expect");
                Err(())
            }
            StmtKind::Break | StmtKind::Continue => {
                if !self.env.contains_key(CONT) {
                    self.internal(s.span, "`break`/`continue` outside a loop");
                    return Err(());
                }
                self.env.insert(CONT.to_string(), flag(false));
                if matches!(s.kind, StmtKind::Break) {
                    self.env.insert(BRK.to_string(), flag(true));
                }
                Ok(())
            }
            StmtKind::Error => {
                self.internal(s.span, "a statement with a syntax error");
                Err(())
            }
            StmtKind::Assign { target, value, .. } => {
                let v = self.expr(value)?;
                self.assign(target, v)
            }
            StmtKind::AugAssign { target, op, value } => {
                let l = self.expr(target)?;
                let r = self.expr(value)?;
                let v = self.binary(*op, l, r, s.span, target, value)?;
                self.assign(target, v)
            }
            StmtKind::If { branches, orelse } => {
                self.if_chain(branches, orelse.as_deref(), live_after)
            }
            StmtKind::For { target, iter, body } => self.for_loop(target, iter, body, live_after),
            StmtKind::While { cond, body } => self.while_loop(s, cond, body, live_after),
        }
    }

    fn assign(&mut self, target: &Expr, v: LV) -> R<()> {
        match (&target.kind, v) {
            (ExprKind::Name(id), v) => {
                // A run-time int bound to a name gets its own symbol only if it has none.
                self.env.insert(id.name.clone(), v);
                Ok(())
            }
            (ExprKind::Tuple(ts), LV::List(vs)) if ts.len() == vs.len() => {
                for (t, v) in ts.iter().zip(vs) {
                    self.assign(t, v)?;
                }
                Ok(())
            }
            _ => {
                self.unsupported(target.span, "this assignment target");
                Err(())
            }
        }
    }

    /// A condition: a compile-time bool, or a bool scalar value.
    fn condition(&mut self, c: &Expr) -> R<Result<bool, Value>> {
        let lv = self.expr(c)?;
        match &lv {
            LV::Const { c: cv, .. } => match cv {
                CValue::Bool(b) => Ok(Ok(*b)),
                CValue::Float(x) => Ok(Ok(*x != 0.0)),
                _ => match cv.as_int() {
                    Some(i) => Ok(Ok(i != 0)),
                    None => {
                        self.internal(c.span, "a condition that is not a number");
                        Err(())
                    }
                },
            },
            LV::NoneV => Ok(Ok(false)),
            LV::Val { v, .. } => {
                let v = *v;
                let t = self.b.ty(v).clone();
                if !t.shape().is_empty() {
                    self.internal(c.span, "a tile condition");
                    return Err(());
                }
                if t.dtype() == DType::Bool {
                    return Ok(Err(v));
                }
                let zero = self.const_of(&CValue::int(0), t.dtype(), c.span)?;
                Ok(Err(self.b.push1(
                    OpKind::Binary {
                        op: BinaryOp::Ne,
                        a: v,
                        b: zero,
                    },
                    Type::Scalar(DType::Bool),
                )))
            }
            other => {
                self.internal(c.span, format!("a {} as a condition", other.describe()));
                Err(())
            }
        }
    }

    /// The type two values merge at (branches of an `if`), and its weakness.
    fn merge_type(&mut self, a: &LV, b: &LV, span: Span) -> R<(DType, bool, Vec<u32>)> {
        let (da, wa, sa) = self.info(a, span)?;
        let (db, wb, sb) = self.info(b, span)?;
        let shape = if sa.len() >= sb.len() { sa } else { sb };
        let dtype = match (wa, wb) {
            (true, false) => db,
            (false, true) => da,
            _ => DType::join(da, db).unwrap_or(da),
        };
        Ok((dtype, wa && wb, shape))
    }

    fn if_chain(
        &mut self,
        branches: &[(Expr, ast::Block)],
        orelse: Option<&[Stmt]>,
        live_after: &Live<'_>,
    ) -> R<()> {
        let Some(((cond, then), rest)) = branches.split_first() else {
            return match orelse {
                Some(b) => self.block(b, live_after),
                None => Ok(()),
            };
        };
        let span = cond.span;
        match self.condition(cond)? {
            Ok(true) => self.block(then, live_after),
            Ok(false) => self.if_chain(rest, orelse, live_after),
            Err(c) => {
                // Each branch runs on the environment in place and is rolled
                // back; only what the branches changed is kept for the merge.
                let frame = self.env.open();
                self.b.begin();
                self.block(then, live_after)?;
                let then_env = self.env.rollback(&frame);
                let then_r = self.b.end(vec![]);
                self.b.begin();
                self.if_chain(rest, orelse, live_after)?;
                let else_env = self.env.rollback(&frame);
                self.env.close(frame);
                let else_r = self.b.end(vec![]);
                let mut assigned = Vec::new();
                assigned_names(then, &mut assigned);
                for (_, b) in rest {
                    assigned_names(b, &mut assigned);
                }
                if let Some(b) = orelse {
                    assigned_names(b, &mut assigned);
                }
                let merged = self.merged(assigned, live_after, &then_env, &else_env);
                self.emit_if(c, then_r, else_r, merged, span)
            }
        }
    }

    /// The variables an `if` must yield: assigned in a branch (or the loop
    /// flags), live after, bound on both paths and different. Variables equal on
    /// both paths are bound directly. A path's bindings are its changes
    /// (`then_env`, `else_env`) over the environment before the `if`, which
    /// the environment holds again.
    fn merged(
        &mut self,
        mut assigned: Vec<String>,
        live_after: &Live<'_>,
        then_env: &HashMap<String, Option<LV>>,
        else_env: &HashMap<String, Option<LV>>,
    ) -> Vec<(String, LV, LV)> {
        assigned.extend([CONT.to_string(), BRK.to_string(), RET.to_string()]);
        assigned.sort();
        assigned.dedup();
        let mut merged = Vec::new();
        for name in assigned {
            let on = |changes: &HashMap<String, Option<LV>>| match changes.get(&name) {
                Some(v) => v.clone(),
                None => self.env.get(&name).cloned(),
            };
            let (Some(t), Some(o)) = (on(then_env), on(else_env)) else {
                continue;
            };
            let (t, o) = (&t, &o);
            if !live_after.contains(&name, &self.reads)
                && name != CONT
                && name != BRK
                && name != RET
            {
                continue;
            }
            if let (LV::Const { c: a, .. }, LV::Const { c: b, .. }) = (t, o) {
                if a == b {
                    self.env.insert(name, t.clone());
                    continue;
                }
            }
            if let (LV::Val { v: a, .. }, LV::Val { v: b, .. }) = (t, o) {
                if a == b {
                    self.env.insert(name, t.clone());
                    continue;
                }
            }
            merged.push((name, t.clone(), o.clone()));
        }
        merged
    }

    /// Lowers `rest` only where `cond` holds (the statements after a
    /// `break`/`continue` that may have happened).
    fn guarded(&mut self, cond: Value, rest: &[Stmt], live_after: &Live<'_>, span: Span) -> R<()> {
        let frame = self.env.open();
        self.b.begin();
        self.block(rest, live_after)?;
        let then_env = self.env.rollback(&frame);
        self.env.close(frame);
        let then_r = self.b.end(vec![]);
        self.b.begin();
        let else_r = self.b.end(vec![]);
        let mut assigned = Vec::new();
        assigned_names(rest, &mut assigned);
        let merged = self.merged(assigned, live_after, &then_env, &HashMap::new());
        self.emit_if(cond, then_r, else_r, merged, span)
    }

    /// Emits an `If` yielding the merged `(name, then, else)` values and binds the results.
    fn emit_if(
        &mut self,
        c: Value,
        then_r: Region,
        else_r: Region,
        merged: Vec<(String, LV, LV)>,
        span: Span,
    ) -> R<()> {
        let mut types = Vec::new();
        let mut weak = Vec::new();
        for (_, t, o) in &merged {
            let (d, w, s) = self.merge_type(t, o, span)?;
            types.push((d, s));
            weak.push(w);
        }
        let yields =
            |this: &mut Self, r: Region, pick: &dyn Fn(&(String, LV, LV)) -> LV| -> R<Region> {
                this.b.resume(r.ops);
                let mut vs = Vec::new();
                for (m, (d, s)) in merged.iter().zip(&types) {
                    vs.push(this.coerce(&pick(m), *d, s, span)?);
                }
                this.b.push(OpKind::Yield(vs), vec![]);
                Ok(this.b.end(r.args))
            };
        let then = yields(self, then_r, &|m| m.1.clone())?;
        let otherwise = yields(self, else_r, &|m| m.2.clone())?;
        let results = self.b.push(
            OpKind::If {
                cond: c,
                then,
                otherwise,
            },
            types
                .iter()
                .map(|(d, s)| tile_type(s.clone(), *d))
                .collect(),
        );
        for ((name, _, _), (r, w)) in merged.into_iter().zip(results.into_iter().zip(weak)) {
            let lv = self.val(r, w);
            self.env.insert(name, lv);
        }
        Ok(())
    }

    /// The variables a loop carries: assigned in `body`, bound before, read later.
    fn carried(&self, body: &[Stmt], live: &Live<'_>, exclude: &str) -> Vec<String> {
        let mut assigned = Vec::new();
        assigned_names(body, &mut assigned);
        assigned.sort();
        assigned.dedup();
        let mut names: Vec<String> = assigned
            .into_iter()
            .filter(|n| {
                // The cheap tests first: a name bound only inside the loop (say,
                // an inner loop's variable) needs no search of the liveness chain.
                n != exclude
                    && matches!(self.env.get(n), Some(LV::Val { .. } | LV::Const { .. }))
                    && live.contains(n, &self.reads)
            })
            .collect();
        if self.jumps.jumps(body).ret && self.env.contains_key(RET) {
            names.push(RET.to_string());
        }
        names
    }

    /// After a loop that may have returned: the enclosing code continues only
    /// if it did not (and an enclosing loop breaks).
    fn after_loop_return(&mut self, span: Span) -> R<()> {
        let ret = self.env[RET].clone();
        let r = self.materialize(&ret, DType::Bool, span)?;
        let not_r = self.b.push1(
            OpKind::Unary {
                op: UnaryOp::Not,
                x: r,
            },
            Type::Scalar(DType::Bool),
        );
        if let Some(c) = self.env.get(CONT).cloned() {
            let c = self.materialize(&c, DType::Bool, span)?;
            let v = self.b.push1(
                OpKind::Binary {
                    op: BinaryOp::And,
                    a: c,
                    b: not_r,
                },
                Type::Scalar(DType::Bool),
            );
            self.env.insert(
                CONT.to_string(),
                LV::Val {
                    v,
                    weak: false,
                    sym: None,
                },
            );
        }
        if let Some(bk) = self.env.get(BRK).cloned() {
            let bk = self.materialize(&bk, DType::Bool, span)?;
            let v = self.b.push1(
                OpKind::Binary {
                    op: BinaryOp::Or,
                    a: bk,
                    b: r,
                },
                Type::Scalar(DType::Bool),
            );
            self.env.insert(
                BRK.to_string(),
                LV::Val {
                    v,
                    weak: false,
                    sym: None,
                },
            );
        }
        Ok(())
    }

    /// Initial values of carried variables: (value, weak).
    fn carried_init(&mut self, names: &[String], span: Span) -> R<Vec<(Value, bool)>> {
        let mut out = Vec::new();
        for n in names {
            let lv = self.env[n].clone();
            let (d, w, _) = self.info(&lv, span)?;
            out.push((self.materialize(&lv, d, span)?, w));
        }
        Ok(out)
    }

    /// Binds carried names to fresh region arguments; returns the arguments.
    fn bind_args(&mut self, names: &[String], init: &[(Value, bool)]) -> Vec<Value> {
        let mut args = Vec::new();
        for (n, (v, w)) in names.iter().zip(init) {
            let t = self.b.ty(*v).clone();
            let a = self.b.value(t);
            let lv = self.val(a, *w);
            self.env.insert(n.clone(), lv);
            args.push(a);
        }
        args
    }

    /// The values of carried names at the end of a body, in their carried types.
    fn carried_values(
        &mut self,
        names: &[String],
        init: &[(Value, bool)],
        span: Span,
    ) -> R<Vec<Value>> {
        let mut vs = Vec::new();
        for (n, (v, _)) in names.iter().zip(init) {
            let t = self.b.ty(*v).clone();
            let lv = self.env[n].clone();
            vs.push(self.coerce(&lv, t.dtype(), t.shape(), span)?);
        }
        Ok(vs)
    }

    fn for_loop(
        &mut self,
        target: &ast::Ident,
        iter: &Expr,
        body: &[Stmt],
        live_after: &Live<'_>,
    ) -> R<()> {
        let span = iter.span;
        let bounds = match &iter.kind {
            ExprKind::Call { func, args }
                if matches!(&func.kind, ExprKind::Name(n) if n.name == "range"
                    && !self.env.contains_key("range"))
                    && (1..=3).contains(&args.len())
                    && args.iter().all(|a| a.name.is_none()) =>
            {
                let mut vs = Vec::new();
                for a in args {
                    vs.push((self.expr(&a.value)?, a.value.span));
                }
                vs
            }
            _ => {
                self.unsupported(span, "a `for` loop over anything but `range(...)`");
                return Err(());
            }
        };
        let zero = LV::Const {
            c: CValue::int(0),
            dtype: DType::I32,
            weak: true,
        };
        let one = LV::Const {
            c: CValue::int(1),
            dtype: DType::I32,
            weak: true,
        };
        let (lo, hi, step) = match bounds.len() {
            1 => ((zero, span), bounds[0].clone(), (one, span)),
            2 => (bounds[0].clone(), bounds[1].clone(), (one, span)),
            _ => (bounds[0].clone(), bounds[1].clone(), bounds[2].clone()),
        };
        let mut dt = DType::I32;
        for (lv, sp) in [&lo, &hi, &step] {
            let (d, w, _) = self.info(lv, *sp)?;
            if !w && d == DType::I64 {
                dt = DType::I64;
            }
        }
        if self.sym_of(&step.0).and_then(|d| d.as_const()) == Some(0) {
            self.diags.push(
                Diagnostic::new(
                    "E0315",
                    step.1,
                    "`range` has step 0 once the kernel is specialised",
                )
                .with_help("give the step a non-zero value"),
            );
            return Err(());
        }
        let lo_v = self.materialize(&lo.0, dt, lo.1)?;
        let hi_v = self.materialize(&hi.0, dt, hi.1)?;
        let step_v = self.materialize(&step.0, dt, step.1)?;

        let live = Live::within(live_after, self.reads.span_of(body));
        let names = self.carried(body, &live, &target.name);
        let init = self.carried_init(&names, span)?;
        let mut j = self.jumps.jumps(body);
        // A `return` leaves the loop like a `break`.
        j.brk |= j.ret;
        let saved = self.env.open();
        if j.brk {
            // `for` with `break`: a `while` over (iv, broken, carried...).
            let step_c = self.sym_of(&step.0).and_then(|d| d.as_const());
            let false_v = self.constant(Constant::Bool(false), DType::Bool);
            let zero_v = self.constant(Constant::Int(0), dt);
            // The condition: iv before hi (in the step's direction) and not broken.
            let iv_c = self.b.value(Type::Scalar(dt));
            let brk_c = self.b.value(Type::Scalar(DType::Bool));
            let mut cargs = vec![iv_c, brk_c];
            cargs.extend(self.bind_args(&names, &init));
            self.b.begin();
            let bool_t = Type::Scalar(DType::Bool);
            let more = match step_c {
                Some(c) => self.b.push1(
                    OpKind::Binary {
                        op: if c > 0 { BinaryOp::Lt } else { BinaryOp::Gt },
                        a: iv_c,
                        b: hi_v,
                    },
                    bool_t.clone(),
                ),
                None => {
                    // A run-time step: (step > 0 and iv < hi) or (step < 0 and iv > hi).
                    let bin = |this: &mut Self, op, a, b| {
                        this.b.push1(OpKind::Binary { op, a, b }, bool_t.clone())
                    };
                    let up = bin(self, BinaryOp::Gt, step_v, zero_v);
                    let down = bin(self, BinaryOp::Lt, step_v, zero_v);
                    let lt = bin(self, BinaryOp::Lt, iv_c, hi_v);
                    let gt = bin(self, BinaryOp::Gt, iv_c, hi_v);
                    let a = bin(self, BinaryOp::And, up, lt);
                    let b = bin(self, BinaryOp::And, down, gt);
                    bin(self, BinaryOp::Or, a, b)
                }
            };
            let not_broken = self.b.push1(
                OpKind::Unary {
                    op: UnaryOp::Not,
                    x: brk_c,
                },
                Type::Scalar(DType::Bool),
            );
            let c = self.b.push1(
                OpKind::Binary {
                    op: BinaryOp::And,
                    a: more,
                    b: not_broken,
                },
                Type::Scalar(DType::Bool),
            );
            self.b.push(OpKind::Yield(vec![c]), vec![]);
            let cond_r = self.b.end(cargs);
            self.env.rollback(&saved);
            // The body, then iv += step.
            let iv_b = self.b.value(Type::Scalar(dt));
            let brk_b = self.b.value(Type::Scalar(DType::Bool));
            let iv_lv = self.val(iv_b, false);
            self.env.insert(target.name.clone(), iv_lv);
            self.enter_loop_body(j);
            self.env.insert(
                BRK.to_string(),
                LV::Val {
                    v: brk_b,
                    weak: false,
                    sym: None,
                },
            );
            let mut bargs = vec![iv_b, brk_b];
            bargs.extend(self.bind_args(&names, &init));
            self.b.begin();
            self.loop_depth += 1;
            self.block(body, &live)?;
            self.loop_depth -= 1;
            let next = self.b.push1(
                OpKind::Binary {
                    op: BinaryOp::Add,
                    a: iv_b,
                    b: step_v,
                },
                Type::Scalar(dt),
            );
            let brk_lv = self.env[BRK].clone();
            let brk_now = self.materialize(&brk_lv, DType::Bool, span)?;
            let mut vs = vec![next, brk_now];
            vs.extend(self.carried_values(&names, &init, span)?);
            self.b.push(OpKind::Yield(vs), vec![]);
            let body_r = self.b.end(bargs);
            self.env.rollback(&saved);
            self.env.close(saved);
            let mut all_init = vec![lo_v, false_v];
            all_init.extend(init.iter().map(|(v, _)| *v));
            let types: Vec<Type> = all_init.iter().map(|v| self.b.ty(*v).clone()).collect();
            let results = self.b.push(
                OpKind::While {
                    init: all_init,
                    cond: cond_r,
                    body: body_r,
                },
                types,
            );
            for ((n, (_, w)), r) in names.iter().zip(&init).zip(&results[2..]) {
                let lv = self.val(*r, *w);
                self.env.insert(n.clone(), lv);
            }
            if j.ret {
                self.after_loop_return(span)?;
            }
            return Ok(());
        }
        let iv = self.b.value(Type::Scalar(dt));
        let iv_lv = self.val(iv, false);
        self.env.insert(target.name.clone(), iv_lv);
        self.enter_loop_body(j);
        let mut args = vec![iv];
        args.extend(self.bind_args(&names, &init));
        self.b.begin();
        self.loop_depth += 1;
        self.block(body, &live)?;
        self.loop_depth -= 1;
        let vs = self.carried_values(&names, &init, span)?;
        self.b.push(OpKind::Yield(vs), vec![]);
        let region = self.b.end(args);
        self.env.rollback(&saved);
        self.env.close(saved);
        let results = self.b.push(
            OpKind::For {
                lo: lo_v,
                hi: hi_v,
                step: step_v,
                init: init.iter().map(|(v, _)| *v).collect(),
                body: region,
            },
            init.iter().map(|(v, _)| self.b.ty(*v).clone()).collect(),
        );
        for ((n, (_, w)), r) in names.iter().zip(&init).zip(results) {
            let lv = self.val(r, *w);
            self.env.insert(n.clone(), lv);
        }
        Ok(())
    }

    /// The loop flags at the start of a body: this loop's own, never an outer one's.
    fn enter_loop_body(&mut self, j: Jumps) {
        self.env.remove(CONT);
        self.env.remove(BRK);
        if j.any() {
            self.env.insert(CONT.to_string(), flag(true));
        }
        if j.brk {
            self.env.insert(BRK.to_string(), flag(false));
        }
    }

    fn while_loop(&mut self, s: &Stmt, cond: &Expr, body: &[Stmt], live_after: &Live<'_>) -> R<()> {
        let span = cond.span;
        // The `while` statement's own position holds its condition's reads.
        let (_, end) = self.reads.span_of(std::slice::from_ref(s));
        let live = Live::within(live_after, (self.reads.position(s), end));
        let names = self.carried(body, &live, "");
        let init = self.carried_init(&names, span)?;
        let mut j = self.jumps.jumps(body);
        // A `return` leaves the loop like a `break`.
        j.brk |= j.ret;
        let saved = self.env.open();
        // With `break`, a `broken` flag is carried first.
        let mut all_init: Vec<(Value, bool)> = Vec::new();
        if j.brk {
            all_init.push((self.constant(Constant::Bool(false), DType::Bool), false));
        }
        all_init.extend(init.iter().copied());
        let flag_arg = |this: &mut Self| -> Option<Value> {
            j.brk.then(|| this.b.value(Type::Scalar(DType::Bool)))
        };
        // The condition region.
        let brk_c = flag_arg(self);
        let mut cargs: Vec<Value> = brk_c.into_iter().collect();
        cargs.extend(self.bind_args(&names, &init));
        self.b.begin();
        let mut c = match self.condition(cond)? {
            Ok(b) => self.constant(Constant::Bool(b), DType::Bool),
            Err(v) => v,
        };
        if let Some(brk) = brk_c {
            let not_broken = self.b.push1(
                OpKind::Unary {
                    op: UnaryOp::Not,
                    x: brk,
                },
                Type::Scalar(DType::Bool),
            );
            c = self.b.push1(
                OpKind::Binary {
                    op: BinaryOp::And,
                    a: c,
                    b: not_broken,
                },
                Type::Scalar(DType::Bool),
            );
        }
        self.b.push(OpKind::Yield(vec![c]), vec![]);
        let cond_r = self.b.end(cargs);
        self.env.rollback(&saved);
        // The body region.
        let brk_b = flag_arg(self);
        self.enter_loop_body(j);
        if let Some(v) = brk_b {
            self.env.insert(
                BRK.to_string(),
                LV::Val {
                    v,
                    weak: false,
                    sym: None,
                },
            );
        }
        let mut bargs: Vec<Value> = brk_b.into_iter().collect();
        bargs.extend(self.bind_args(&names, &init));
        self.b.begin();
        self.loop_depth += 1;
        self.block(body, &live)?;
        self.loop_depth -= 1;
        let mut vs = Vec::new();
        if j.brk {
            let brk_lv = self.env[BRK].clone();
            vs.push(self.materialize(&brk_lv, DType::Bool, span)?);
        }
        vs.extend(self.carried_values(&names, &init, span)?);
        self.b.push(OpKind::Yield(vs), vec![]);
        let body_r = self.b.end(bargs);
        self.env.rollback(&saved);
        self.env.close(saved);
        let types: Vec<Type> = all_init
            .iter()
            .map(|(v, _)| self.b.ty(*v).clone())
            .collect();
        let results = self.b.push(
            OpKind::While {
                init: all_init.iter().map(|(v, _)| *v).collect(),
                cond: cond_r,
                body: body_r,
            },
            types,
        );
        let skip = usize::from(j.brk);
        for ((n, (_, w)), r) in names.iter().zip(&init).zip(&results[skip..]) {
            let lv = self.val(*r, *w);
            self.env.insert(n.clone(), lv);
        }
        if j.ret {
            self.after_loop_return(span)?;
        }
        Ok(())
    }

    // ---- expressions ----

    fn expr(&mut self, e: &Expr) -> R<LV> {
        crate::cancel::checkpoint();
        let saved_span = self.b.span;
        self.b.span = e.span;
        let r = self.expr_inner(e);
        self.b.span = saved_span;
        r
    }

    fn expr_inner(&mut self, e: &Expr) -> R<LV> {
        match &e.kind {
            ExprKind::Int(i) => Ok(LV::Const {
                c: CValue::int(*i),
                dtype: DType::I32,
                weak: true,
            }),
            ExprKind::Float(x) => Ok(LV::Const {
                c: CValue::Float(*x),
                dtype: DType::F32,
                weak: true,
            }),
            ExprKind::Bool(b) => Ok(LV::Const {
                c: CValue::Bool(*b),
                dtype: DType::Bool,
                weak: true,
            }),
            ExprKind::Str(s) => Ok(LV::Str(s.clone())),
            ExprKind::None => Ok(LV::NoneV),
            ExprKind::Name(id) => self.name(id),
            ExprKind::Unary { op, operand } => {
                let v = self.expr(operand)?;
                self.unary(*op, v, operand.span)
            }
            ExprKind::Binary { op, lhs, rhs } => {
                let l = self.expr(lhs)?;
                let r = self.expr(rhs)?;
                self.binary(*op, l, r, e.span, lhs, rhs)
            }
            ExprKind::IfElse {
                cond,
                then,
                otherwise,
            } => match self.condition(cond)? {
                Ok(true) => self.expr(then),
                Ok(false) => self.expr(otherwise),
                Err(c) => {
                    let before = self.env.open();
                    self.b.begin();
                    let t = self.expr(then)?;
                    let then_r = self.b.end(vec![]);
                    self.b.begin();
                    let o = self.expr(otherwise)?;
                    let else_r = self.b.end(vec![]);
                    let tmp = "%ifexp".to_string();
                    self.emit_if(c, then_r, else_r, vec![(tmp.clone(), t, o)], e.span)?;
                    let r = self.env.remove(&tmp);
                    self.env.rollback(&before);
                    self.env.close(before);
                    r.ok_or(())
                }
            },
            ExprKind::Call { func, args } => self.call(e, func, args),
            ExprKind::Subscript { value, indices } => {
                let v = self.expr(value)?;
                self.subscript(v, indices, e.span)
            }
            ExprKind::Attribute { value, attr } => {
                let v = self.expr(value)?;
                match (attr.name.as_str(), &v) {
                    ("T", LV::Val { v: x, .. }) => {
                        let x = *x;
                        let t = self.b.ty(x).clone();
                        let s = t.shape();
                        if s.len() != 2 {
                            self.internal(e.span, "`.T` of a value that is not 2-D");
                            return Err(());
                        }
                        let r = self.b.push1(
                            OpKind::Transpose { x },
                            tile_type(vec![s[1], s[0]], t.dtype()),
                        );
                        Ok(self.val(r, false))
                    }
                    ("to", LV::Val { .. } | LV::Const { .. }) => Ok(LV::ToMethod(Box::new(v))),
                    ("shape", LV::Val { .. } | LV::Const { .. } | LV::Ref { .. }) => {
                        let shape = match &v {
                            LV::Ref { shape, .. } => shape.clone(),
                            _ => self.shape_of(&v, e.span)?,
                        };
                        Ok(LV::List(
                            shape
                                .into_iter()
                                .map(|n| LV::Const {
                                    c: CValue::int(n as i64),
                                    dtype: DType::I32,
                                    weak: false,
                                })
                                .collect(),
                        ))
                    }
                    ("shape", LV::Tensor(t)) => {
                        let t = *t;
                        let ParamKind::Tensor { dims, .. } = self.params[t].kind.clone() else {
                            return Err(());
                        };
                        let mut items = Vec::new();
                        for (axis, d) in dims.iter().enumerate() {
                            items.push(match d {
                                Dim::Static(n) => LV::Const {
                                    c: CValue::int(*n as i64),
                                    dtype: DType::I32,
                                    weak: false,
                                },
                                Dim::Dynamic(name) => {
                                    let sym = match SymDim::parse(name) {
                                        Ok(d) => d,
                                        Err(_) => self.fresh_sym(),
                                    };
                                    LV::Val {
                                        v: self.tensor_dim(t, axis),
                                        weak: false,
                                        sym: Some(sym),
                                    }
                                }
                            });
                        }
                        Ok(LV::List(items))
                    }
                    ("dtype", LV::Tensor(t)) => Ok(LV::DType(self.tensor_dtype(*t))),
                    ("dtype", LV::Ref { tensor, .. }) => Ok(LV::DType(self.tensor_dtype(*tensor))),
                    ("dtype", _) => {
                        let (d, _, _) = self.info(&v, e.span)?;
                        Ok(LV::DType(d))
                    }
                    _ => {
                        self.unsupported(attr.span, format!("the attribute `.{}` here", attr.name));
                        Err(())
                    }
                }
            }
            ExprKind::Tuple(items) | ExprKind::List(items) => {
                let mut vs = Vec::new();
                for i in items {
                    vs.push(self.expr(i)?);
                }
                Ok(LV::List(vs))
            }
            ExprKind::Dict(_) => Ok(LV::Host),
            ExprKind::Error => {
                self.internal(e.span, "an expression with a syntax error");
                Err(())
            }
        }
    }

    fn name(&mut self, id: &ast::Ident) -> R<LV> {
        if let Some(v) = self.env.get(&id.name) {
            return Ok(v.clone());
        }
        match self.scope.get(&id.name) {
            Some(Entry::Const { ty, value: Some(v) }) => {
                let (dtype, weak) = match ty {
                    Ty::Scalar { dtype, weak } => (*dtype, *weak),
                    _ => match v {
                        CValue::Int(_) => (DType::I32, true),
                        CValue::Float(_) => (DType::F32, true),
                        CValue::Bool(_) => (DType::Bool, true),
                        CValue::DType(d) => return Ok(LV::DType(*d)),
                        CValue::Str(s) => return Ok(LV::Str(s.clone())),
                        CValue::None => return Ok(LV::NoneV),
                        // A list or tuple: its items (indexed with constants).
                        CValue::Tuple(items) => return Ok(LV::List(const_items(items))),
                    },
                };
                return Ok(LV::Const {
                    c: v.clone(),
                    dtype,
                    weak,
                });
            }
            Some(_) => return Ok(LV::Host),
            None => {}
        }
        if let Some(b) = Builtin::from_name(&id.name) {
            return Ok(LV::Builtin(b));
        }
        if let Some(d) = DType::from_name(&id.name) {
            return Ok(LV::DType(d));
        }
        match id.name.as_str() {
            "inf" => Ok(LV::Const {
                c: CValue::Float(f64::INFINITY),
                dtype: DType::F32,
                weak: true,
            }),
            "True" | "False" => Ok(LV::Const {
                c: CValue::Bool(id.name == "True"),
                dtype: DType::Bool,
                weak: true,
            }),
            _ => {
                self.internal(id.span, format!("unknown name `{}`", id.name));
                Err(())
            }
        }
    }

    fn unary(&mut self, op: ast::UnaryOp, v: LV, span: Span) -> R<LV> {
        if let LV::Const { c, dtype, weak } = &v {
            if let Some(r) = fold_unary(op, c) {
                let dtype = if op == ast::UnaryOp::Not {
                    DType::Bool
                } else {
                    *dtype
                };
                return Ok(LV::Const {
                    c: r,
                    dtype,
                    weak: *weak,
                });
            }
        }
        let (d, weak, _) = self.info(&v, span)?;
        if op == ast::UnaryOp::Not && d != DType::Bool {
            // `not n`: n == 0.
            let zero = LV::Const {
                c: CValue::int(0),
                dtype: d,
                weak: true,
            };
            let e = Expr::new(ExprKind::None, span);
            return self.binary(BinOp::Eq, v, zero, span, &e, &e);
        }
        let x = self.materialize(&v, d, span)?;
        let t = self.b.ty(x).clone();
        let uop = match op {
            ast::UnaryOp::Pos => return Ok(v),
            ast::UnaryOp::Neg => UnaryOp::Neg,
            ast::UnaryOp::Not => UnaryOp::Not,
            ast::UnaryOp::Invert if d == DType::Bool => UnaryOp::Not,
            ast::UnaryOp::Invert => UnaryOp::Invert,
        };
        let r = self.b.push1(OpKind::Unary { op: uop, x }, t);
        let mut out = self.val(r, weak);
        if let (LV::Val { sym: Some(s), .. }, LV::Val { sym: os, .. }) = (&v, &mut out) {
            if op == ast::UnaryOp::Neg {
                *os = s.checked_neg().or(os.take());
            }
        }
        Ok(out)
    }

    fn binary(&mut self, op: BinOp, l: LV, r: LV, span: Span, le: &Expr, re: &Expr) -> R<LV> {
        if op == BinOp::MatMul {
            return self.dot(&l, &r, None, Precision::Ieee, span, le, re);
        }
        let Some(bop) = BinaryOp::from_ast(op) else {
            self.internal(span, "an unknown operator");
            return Err(());
        };
        // Compile-time folding (the checker's rules).
        if let (LV::Const { c: a, .. }, LV::Const { c: b, .. }) = (&l, &r) {
            let (dt, weak) = self.promote(&l, &r, le, re, &format!("`{}`", op.symbol()))?;
            if let Ok(Some(c)) = fold_binary(op, a, b) {
                let dtype = match &c {
                    CValue::Bool(_) => DType::Bool,
                    CValue::Float(_) if !dt.is_float() => DType::F32,
                    _ => dt,
                };
                return Ok(LV::Const { c, dtype, weak });
            }
        }
        let (dt, weak) = if matches!(op, BinOp::And | BinOp::Or) {
            (DType::Bool, false)
        } else {
            self.promote(&l, &r, le, re, &format!("`{}`", op.symbol()))?
        };
        let ls = self.shape_of(&l, le.span)?;
        let rs = self.shape_of(&r, re.span)?;
        let shape = self.broadcast_shapes(&ls, &rs, span)?;
        let opdt = if op == BinOp::Div && !dt.is_float() {
            DType::F32
        } else {
            dt
        };
        let a = self.coerce(&l, opdt, &shape, le.span)?;
        let b = self.coerce(&r, opdt, &shape, re.span)?;
        let rdt = if bop.is_comparison() {
            DType::Bool
        } else {
            opdt
        };
        let v = self
            .b
            .push1(OpKind::Binary { op: bop, a, b }, tile_type(shape, rdt));
        let mut out = self.val(v, weak);
        // Symbolic tracking of run-time integers (slice bounds).
        if let (Some(sa), Some(sb)) = (self.sym_of(&l), self.sym_of(&r)) {
            if let Ok(Some(CValue::Int(d))) = fold_binary(op, &CValue::Int(sa), &CValue::Int(sb)) {
                if let LV::Val { sym, .. } = &mut out {
                    if sym.is_some() {
                        *sym = Some(d);
                    }
                }
            }
        }
        Ok(out)
    }

    /// An elementwise op of two operands with broadcasting and promotion.
    fn elementwise2(
        &mut self,
        op: BinaryOp,
        a: (&LV, &Expr),
        b: (&LV, &Expr),
        span: Span,
    ) -> R<LV> {
        let (dt, weak) = self.promote(a.0, b.0, a.1, b.1, &format!("`{}`", op.name()))?;
        let sa = self.shape_of(a.0, a.1.span)?;
        let sb = self.shape_of(b.0, b.1.span)?;
        let shape = self.broadcast_shapes(&sa, &sb, span)?;
        let x = self.coerce(a.0, dt, &shape, a.1.span)?;
        let y = self.coerce(b.0, dt, &shape, b.1.span)?;
        let v = self
            .b
            .push1(OpKind::Binary { op, a: x, b: y }, tile_type(shape, dt));
        Ok(self.val(v, weak))
    }

    fn subscript(&mut self, v: LV, indices: &[Index], span: Span) -> R<LV> {
        match v {
            LV::Tensor(t) => self.tensor_slice(t, indices, span),
            LV::List(items) => {
                let [Index::Expr(ie)] = indices else {
                    self.internal(span, "a list takes one constant index");
                    return Err(());
                };
                let iv = self.expr(ie)?;
                let i = self.const_int(&iv, ie.span, "the index")?;
                let j = if i < 0 { i + items.len() as i64 } else { i };
                match usize::try_from(j).ok().and_then(|j| items.get(j)) {
                    Some(x) => Ok(x.clone()),
                    None => {
                        self.internal(ie.span, format!("index {i} is out of range"));
                        Err(())
                    }
                }
            }
            LV::Val { v: x, weak, .. } => {
                // Tiles take compile-time indices and slices, `:` and `None`.
                let t = self.b.ty(x).clone();
                let mut cur = x;
                let mut shape = t.shape().to_vec();
                let mut axis = 0;
                for idx in indices {
                    if axis >= shape.len()
                        && !matches!(
                            idx,
                            Index::Expr(Expr {
                                kind: ExprKind::None,
                                ..
                            })
                        )
                    {
                        self.internal(idx.span(), "too many indices for the tile");
                        return Err(());
                    }
                    match idx {
                        Index::Expr(Expr {
                            kind: ExprKind::None,
                            ..
                        }) => {
                            shape.insert(axis, 1);
                            cur = self.b.push1(
                                OpKind::ExpandDims { x: cur, axis },
                                tile_type(shape.clone(), t.dtype()),
                            );
                            axis += 1;
                        }
                        Index::Slice {
                            start: None,
                            end: None,
                            step: None,
                            ..
                        } => axis += 1,
                        Index::Expr(e) => {
                            let n = shape[axis] as i64;
                            let iv = self.expr(e)?;
                            let i = self.const_int(&iv, e.span, "a tile index")?;
                            let j = if i < 0 { i + n } else { i };
                            if !(0..n).contains(&j) {
                                self.diags.push(Diagnostic::new(
                                    "E0413",
                                    e.span,
                                    format!("index {i} is out of range for axis {axis} of the tile (size {n})"),
                                ).with_help(format!("index a tile of size {n} with 0 to {}, or -{n} to -1", n - 1)));
                                return Err(());
                            }
                            shape.remove(axis);
                            cur = self.b.push1(
                                OpKind::Extract {
                                    x: cur,
                                    axis,
                                    start: j as u32,
                                    len: 1,
                                    drop: true,
                                },
                                tile_type(shape.clone(), t.dtype()),
                            );
                        }
                        Index::Slice {
                            start: a,
                            end: b,
                            step: None,
                            span: sp,
                        } => {
                            let n = shape[axis] as i64;
                            // Python's bounds: negative counts from the end, clamped.
                            let bound = |this: &mut Self, e: &Option<Expr>, dflt: i64| -> R<i64> {
                                let Some(e) = e else { return Ok(dflt) };
                                let lv = this.expr(e)?;
                                let c = this.const_int(&lv, e.span, "a tile slice bound")?;
                                Ok(if c < 0 { (c + n).max(0) } else { c.min(n) })
                            };
                            let lo = bound(self, a, 0)?;
                            let hi = bound(self, b, n)?;
                            if hi <= lo {
                                self.diags.push(
                                    Diagnostic::new(
                                        "E0405",
                                        *sp,
                                        format!("this slice of a tile of size {n} is empty ({lo} : {hi})"),
                                    )
                                    .with_help("slices of tiles must keep at least one element"),
                                );
                                return Err(());
                            }
                            if (lo, hi) != (0, n) {
                                shape[axis] = (hi - lo) as u32;
                                cur = self.b.push1(
                                    OpKind::Extract {
                                        x: cur,
                                        axis,
                                        start: lo as u32,
                                        len: (hi - lo) as u32,
                                        drop: false,
                                    },
                                    tile_type(shape.clone(), t.dtype()),
                                );
                            }
                            axis += 1;
                        }
                        other => {
                            self.unsupported(other.span(), "a slice of a tile with a step");
                            return Err(());
                        }
                    }
                }
                Ok(self.val(cur, weak))
            }
            other => {
                self.internal(span, format!("subscript of a {}", other.describe()));
                Err(())
            }
        }
    }

    fn tensor_slice(&mut self, t: usize, indices: &[Index], span: Span) -> R<LV> {
        let ParamKind::Tensor { dims, .. } = self.params[t].kind.clone() else {
            self.internal(span, "subscript of a scalar parameter");
            return Err(());
        };
        if indices.len() > dims.len() {
            self.internal(span, "too many indices");
            return Err(());
        }
        let mut access = Vec::new();
        let mut shape = Vec::new();
        // The axes indexed by a tile, with the (not yet normalised) index tile.
        let mut gathers: Vec<(usize, Value)> = Vec::new();
        let zero = LV::Const {
            c: CValue::int(0),
            dtype: DType::I32,
            weak: true,
        };
        for (axis, d) in dims.iter().enumerate() {
            let idx = indices.get(axis);
            let full_len = |this: &mut Self, sp: Span| -> R<u32> {
                match d {
                    Dim::Static(n) => Ok(*n as u32),
                    Dim::Dynamic(name) => {
                        let name = name.clone();
                        match SymDim::parse(&name) {
                            Ok(d) => this
                                .missing_dims
                                .extend(d.symbols().into_iter().map(String::from)),
                            Err(_) => this.missing_dims.push(name.clone()),
                        }
                        this.diags.push(
                            Diagnostic::new(
                                "E0511",
                                sp,
                                format!(
                                    "`:` over the tensor dim `{name}` needs its size at compile time: kernel `{}` must be specialised on `{name}`",
                                    this.f.name.name
                                ),
                            )
                            .with_help(format!("give it a value when compiling, e.g. `-D {name}=128`")),
                        );
                        Err(())
                    }
                }
            };
            match idx {
                None => {
                    let n = full_len(self, span)?;
                    let s = self.const_of(&CValue::int(0), DType::I32, span)?;
                    access.push(Access::Range { start: s, len: n });
                    shape.push(n);
                }
                Some(Index::Expr(e)) => {
                    let v = self.expr(e)?;
                    let (idt, _, s) = self.info(&v, e.span)?;
                    if !idt.is_int() {
                        self.internal(e.span, format!("an index of type {idt}"));
                        return Err(());
                    }
                    if !s.is_empty() {
                        // An index tile: its dims join the slice's shape.
                        let LV::Val { v, .. } = v else {
                            self.internal(e.span, "an index tile that is not a value");
                            return Err(());
                        };
                        gathers.push((access.len(), v));
                        access.push(Access::Gather(v));
                        shape.extend(s);
                        continue;
                    }
                    // A negative constant index counts from the end (Python).
                    let v = match (&v, self.sym_of(&v).and_then(|d| d.as_const())) {
                        (LV::Const { .. }, Some(i)) if i < 0 => match d {
                            Dim::Static(n) => LV::Const {
                                c: CValue::int(*n as i64 + i),
                                dtype: DType::I32,
                                weak: true,
                            },
                            Dim::Dynamic(_) => {
                                let n = LV::Val {
                                    v: self.tensor_dim(t, axis),
                                    weak: false,
                                    sym: None,
                                };
                                self.binary(BinOp::Add, n, v.clone(), e.span, e, e)?
                            }
                        },
                        _ => v,
                    };
                    let iv = self.index_value(&v, e.span)?;
                    access.push(Access::Point(iv));
                }
                Some(Index::Slice {
                    start,
                    end,
                    step,
                    span: sp,
                }) => {
                    if step.is_some() {
                        self.internal(*sp, "a slice with a step");
                        return Err(());
                    }
                    let a = match start {
                        Some(e) => (self.expr(e)?, e.span),
                        None => (zero.clone(), *sp),
                    };
                    let len = match end {
                        None => {
                            let n = full_len(self, *sp)? as i64;
                            match self.sym_of(&a.0).and_then(|s| s.as_const()) {
                                Some(s0) => n - s0,
                                None => {
                                    self.internal(*sp, "a slice `a:` with a run-time start");
                                    return Err(());
                                }
                            }
                        }
                        Some(e) => {
                            let b = self.expr(e)?;
                            let diff = match (self.sym_of(&a.0), self.sym_of(&b)) {
                                (Some(x), Some(y)) => y.checked_sub(&x),
                                _ => None,
                            };
                            match diff {
                                Some(dd) => match dd.as_const() {
                                    Some(n) => n,
                                    None => {
                                        let lv = LV::Val {
                                            v: Value(0),
                                            weak: false,
                                            sym: Some(dd),
                                        };
                                        self.needs_const(*sp, &lv, "the length of this slice");
                                        return Err(());
                                    }
                                },
                                None => {
                                    self.internal(*sp, "a slice length that is not known");
                                    return Err(());
                                }
                            }
                        }
                    };
                    if len <= 0 || len > u32::MAX as i64 {
                        self.internal(*sp, format!("a slice of length {len}"));
                        return Err(());
                    }
                    let s = self.index_value(&a.0, a.1)?;
                    access.push(Access::Range {
                        start: s,
                        len: len as u32,
                    });
                    shape.push(len as u32);
                }
            }
        }
        if !gathers.is_empty() {
            access = self.gather_access(access, &shape, span)?;
        }
        Ok(LV::Ref {
            tensor: t,
            access,
            shape,
        })
    }

    /// An access with index tiles (each `Access::Gather` holding the source
    /// index tile, its dims in place in `shape`) in the form Tile IR takes:
    /// 1-D tiles that are `arange(s, s + n) + x` become the range `s + x : +n`
    /// (contiguous, vectorisable); otherwise every axis becomes a gather of
    /// the whole shape (`i32`, indices past `i32` clamped to stay out of bounds).
    fn gather_access(&mut self, access: Vec<Access>, shape: &[u32], span: Span) -> R<Vec<Access>> {
        let mut ranges = Vec::new();
        for a in &access {
            if let Access::Gather(v) = a {
                let t = self.b.ty(*v).clone();
                match self.affine_start(*v) {
                    Some(start) if t.shape().len() == 1 => ranges.push(Access::Range {
                        start,
                        len: t.shape()[0],
                    }),
                    _ => break,
                }
            }
        }
        if ranges.len()
            == access
                .iter()
                .filter(|a| matches!(a, Access::Gather(_)))
                .count()
        {
            let mut ranges = ranges.into_iter();
            return Ok(access
                .into_iter()
                .map(|a| match a {
                    Access::Gather(_) => ranges.next().expect("one range per gather"),
                    a => a,
                })
                .collect());
        }
        let mut out = Vec::with_capacity(access.len());
        let mut pos = 0;
        for a in access {
            let (v, at) = match a {
                Access::Point(v) => (v, pos),
                Access::Range { start, len } => {
                    let start = self.index_i32(start);
                    let ar = self.b.push1(
                        OpKind::Arange { start, len },
                        tile_type(vec![len], DType::I32),
                    );
                    pos += 1;
                    (ar, pos - 1)
                }
                Access::Gather(v) => {
                    let r = self.b.ty(v).shape().len();
                    pos += r;
                    (v, pos - r)
                }
            };
            let v = self.index_i32(v);
            let g = self.place_axes(v, at, shape, span)?;
            out.push(Access::Gather(g));
        }
        Ok(out)
    }

    /// `v` as `arange(s, s + n) + x` (`x` scalars, added or subtracted, all
    /// `i32`): the scalar `s + x`, emitted; `None` for any other tile.
    fn affine_start(&mut self, v: Value) -> Option<Value> {
        if self.b.ty(v).dtype() != DType::I32 {
            return None;
        }
        let scalar_of = |b: &Builder, t: Value| match b.def(t) {
            Some(OpKind::Splat { x, .. }) => Some(*x),
            _ => None,
        };
        let (base, x, op) = match self.b.def(v)?.clone() {
            OpKind::Arange { start, .. } => return Some(start),
            // `arange(0, n) + x`: the start is `x` itself.
            OpKind::Binary {
                op: BinaryOp::Add,
                a,
                b,
            } if self.zero_arange(a) || self.zero_arange(b) => {
                let other = if self.zero_arange(a) { b } else { a };
                return scalar_of(&self.b, other);
            }
            OpKind::Binary {
                op: BinaryOp::Add,
                a,
                b,
            } => match (scalar_of(&self.b, a), scalar_of(&self.b, b)) {
                (_, Some(x)) => (a, x, BinaryOp::Add),
                (Some(x), _) => (b, x, BinaryOp::Add),
                _ => return None,
            },
            OpKind::Binary {
                op: BinaryOp::Sub,
                a,
                b,
            } => (a, scalar_of(&self.b, b)?, BinaryOp::Sub),
            _ => return None,
        };
        let s = self.affine_start(base)?;
        Some(
            self.b
                .push1(OpKind::Binary { op, a: s, b: x }, Type::Scalar(DType::I32)),
        )
    }

    /// Whether `v` is `arange(0, n)`.
    fn zero_arange(&self, v: Value) -> bool {
        match self.b.def(v) {
            Some(OpKind::Arange { start, .. }) => {
                matches!(self.b.def(*start), Some(OpKind::Const(Constant::Int(0))))
            }
            _ => false,
        }
    }

    /// An integer index (scalar or tile) as `i32`. Wider indices are clamped
    /// to the `i32` range first, so one past it stays out of bounds instead
    /// of wrapping into them.
    fn index_i32(&mut self, v: Value) -> Value {
        let t = self.b.ty(v).clone();
        let d = t.dtype();
        if d == DType::I32 {
            return v;
        }
        let mut v = v;
        if matches!(d, DType::I64 | DType::U32) {
            let shape = t.shape().to_vec();
            let bound = |this: &mut Self, op: BinaryOp, x: Value, c: i64| {
                let mut k = this.constant(Constant::Int(c), d);
                if !shape.is_empty() {
                    k = this.b.push1(
                        OpKind::Splat {
                            x: k,
                            shape: shape.clone(),
                        },
                        tile_type(shape.clone(), d),
                    );
                }
                this.b.push1(
                    OpKind::Binary { op, a: x, b: k },
                    tile_type(shape.clone(), d),
                )
            };
            if d == DType::I64 {
                v = bound(self, BinaryOp::Max, v, i32::MIN as i64);
            }
            v = bound(self, BinaryOp::Min, v, i32::MAX as i64);
        }
        self.b.push1(
            OpKind::Cast {
                x: v,
                to: DType::I32,
            },
            tile_type(t.shape().to_vec(), DType::I32),
        )
    }

    /// A tile (or scalar) whose axes are dims `at..` of `shape`, broadcast to
    /// `shape`: `[n]` at 1 of `[a, n, b]` is `[1, n, 1]` repeated.
    fn place_axes(&mut self, v: Value, at: usize, shape: &[u32], span: Span) -> R<Value> {
        let t = self.b.ty(v).clone();
        let d = t.dtype();
        let mut cur = t.shape().to_vec();
        let mut v = v;
        if !cur.is_empty() {
            for _ in 0..at {
                cur.insert(0, 1);
                v = self.b.push1(
                    OpKind::ExpandDims { x: v, axis: 0 },
                    tile_type(cur.clone(), d),
                );
            }
            while cur.len() < shape.len() {
                let axis = cur.len();
                cur.push(1);
                v = self
                    .b
                    .push1(OpKind::ExpandDims { x: v, axis }, tile_type(cur.clone(), d));
            }
        }
        let lv = LV::Val {
            v,
            weak: false,
            sym: None,
        };
        self.coerce(&lv, d, shape, span)
    }

    /// An integer index as an `i32` value (a wider one clamped to the `i32`
    /// range, which stays out of bounds: tensor dims are below 2^31).
    fn index_value(&mut self, lv: &LV, span: Span) -> R<Value> {
        let (d, weak, _) = self.info(lv, span)?;
        let d = if weak || !d.is_int() { DType::I32 } else { d };
        let v = self.materialize(lv, d, span)?;
        Ok(self.index_i32(v))
    }

    // ---- calls ----

    fn bind<'e>(&mut self, id: Builtin, args: &'e [Arg], span: Span) -> R<Args<'e>> {
        let (name, params) = (id.name(), id.info().params);
        let mut slots: Vec<Option<&Arg>> = vec![None; params.len()];
        let mut positional = Vec::new();
        for a in args {
            match &a.name {
                None => {
                    if positional.len() < slots.len() {
                        slots[positional.len()] = Some(a);
                    }
                    positional.push(a);
                }
                Some(n) => {
                    let key = n.name.as_str();
                    match params.iter().position(|p| {
                        *p == key
                            || (key == "dim" && *p == "axis")
                            || (key == "axis" && *p == "dim")
                    }) {
                        Some(j) => slots[j] = Some(a),
                        None => {
                            self.internal(span, format!("`{name}` has no parameter `{key}`"));
                            return Err(());
                        }
                    }
                }
            }
        }
        Ok(Args { slots, positional })
    }

    fn call(&mut self, e: &Expr, func: &Expr, args: &[Arg]) -> R<LV> {
        let f = self.expr(func)?;
        match f {
            LV::Builtin(id) => self.builtin(id, args, e.span),
            LV::ToMethod(recv) => {
                let [a] = args else {
                    self.internal(e.span, "`.to` takes one dtype");
                    return Err(());
                };
                let LV::DType(to) = self.expr(&a.value)? else {
                    self.internal(a.span, "`.to` takes a dtype");
                    return Err(());
                };
                match *recv {
                    LV::Const { c, .. } => {
                        let c = match (&c, to) {
                            (CValue::Float(x), d) if d.is_int() => CValue::int(*x as i64),
                            (CValue::Int(_), d) if d.is_float() => {
                                CValue::Float(c.as_int().unwrap_or(0) as f64)
                            }
                            (_, DType::Bool) => CValue::Bool(
                                c.as_int()
                                    .map(|i| i != 0)
                                    .unwrap_or(matches!(c, CValue::Float(x) if x != 0.0)),
                            ),
                            _ => c.clone(),
                        };
                        Ok(LV::Const {
                            c,
                            dtype: to,
                            weak: false,
                        })
                    }
                    recv => {
                        let v = self.materialize(&recv, to, e.span)?;
                        Ok(self.val(v, false))
                    }
                }
            }
            other => {
                self.unsupported(
                    func.span,
                    format!("calling a {} inside a kernel", other.describe()),
                );
                Err(())
            }
        }
    }

    fn arg_lv(&mut self, a: Option<&Arg>) -> R<Option<LV>> {
        match a {
            Some(a) => Ok(Some(self.expr(&a.value)?)),
            None => Ok(None),
        }
    }

    fn builtin(&mut self, id: Builtin, args: &[Arg], span: Span) -> R<LV> {
        let name = id.name();
        let bound = self.bind(id, args, span)?;
        let slot = |i: usize| bound.slots.get(i).copied().flatten();
        let req = |this: &mut Self, i: usize| -> R<&Arg> {
            match slot(i) {
                Some(a) => Ok(a),
                None => {
                    this.internal(span, format!("`{name}` is missing an argument"));
                    Err(())
                }
            }
        };
        match id {
            B::ProgramId | B::NumPrograms => {
                let a = req(self, 0)?;
                let lv = self.expr(&a.value)?;
                let axis = self.const_int(&lv, a.value.span, "the axis")?;
                if !(0..3).contains(&axis) {
                    self.internal(a.value.span, "a program axis out of range");
                    return Err(());
                }
                let kind = if id == B::ProgramId {
                    OpKind::ProgramId(axis as u8)
                } else {
                    OpKind::NumPrograms(axis as u8)
                };
                let v = self.b.push1(kind, Type::Scalar(DType::I32));
                Ok(self.val(v, false))
            }
            B::Cdiv => {
                let a = req(self, 0)?;
                let b = req(self, 1)?;
                let x = self.expr(&a.value)?;
                let y = self.expr(&b.value)?;
                if let (LV::Const { c: cx, .. }, LV::Const { c: cy, .. }) = (&x, &y) {
                    if let Ok(Some(c)) = fold_call(B::Cdiv, &[cx.clone(), cy.clone()]) {
                        let (dt, weak) = self.promote(&x, &y, &a.value, &b.value, "`cdiv`")?;
                        return Ok(LV::Const { c, dtype: dt, weak });
                    }
                }
                // (a + b - 1) // b
                let one = LV::Const {
                    c: CValue::int(1),
                    dtype: DType::I32,
                    weak: true,
                };
                let s = self.binary(BinOp::Add, x, y.clone(), span, &a.value, &b.value)?;
                let s = self.binary(BinOp::Sub, s, one, span, &a.value, &b.value)?;
                self.binary(BinOp::FloorDiv, s, y, span, &a.value, &b.value)
            }
            B::Min | B::Max | B::Sum | B::Mean => {
                // As the checker reads them: two or more positional arguments
                // are an elementwise min/max (`max(a, b, 0.0)`), else a reduction.
                let is_reduce = matches!(id, B::Sum | B::Mean) || bound.positional.len() < 2;
                if !is_reduce {
                    let op = if id == B::Min {
                        BinaryOp::Min
                    } else {
                        BinaryOp::Max
                    };
                    let mut acc: Option<(LV, &Expr)> = None;
                    for a in &bound.positional {
                        let v = self.expr(&a.value)?;
                        acc = Some(match acc {
                            None => (v, &a.value),
                            Some((prev, pe)) => {
                                let folded = match (&prev, &v) {
                                    (LV::Const { c: p, .. }, LV::Const { c: q, .. }) => Some(id)
                                        .and_then(|b| {
                                            fold_call(b, &[p.clone(), q.clone()]).ok().flatten()
                                        }),
                                    _ => None,
                                };
                                let (dt, weak) =
                                    self.promote(&prev, &v, pe, &a.value, &format!("`{name}`"))?;
                                match folded {
                                    Some(c) => (LV::Const { c, dtype: dt, weak }, &a.value),
                                    None => (
                                        self.elementwise2(op, (&prev, pe), (&v, &a.value), span)?,
                                        &a.value,
                                    ),
                                }
                            }
                        });
                    }
                    return acc.map(|(v, _)| v).ok_or(());
                }
                let x_arg = req(self, 0)?;
                let x = self.expr(&x_arg.value)?;
                let axis = match self.arg_lv(slot(1))? {
                    None | Some(LV::NoneV) => None,
                    Some(lv) => Some(self.const_int(&lv, span, "the reduction axis")?),
                };
                let keep = match self.arg_lv(slot(2))? {
                    None => false,
                    Some(LV::Const { c, .. }) => c.as_int().is_some_and(|i| i != 0),
                    Some(_) => {
                        self.internal(span, "`keepdims` must be a constant");
                        return Err(());
                    }
                };
                self.reduce(id, &x, axis, keep, x_arg.value.span)
            }
            B::Exp
            | B::Exp2
            | B::Log
            | B::Log2
            | B::Sqrt
            | B::Rsqrt
            | B::Abs
            | B::Sigmoid
            | B::Tanh
            | B::Erf => {
                let a = req(self, 0)?;
                let x = self.expr(&a.value)?;
                if id == B::Abs {
                    if let LV::Const { c, dtype, weak } = &x {
                        if let Ok(Some(r)) = fold_call(B::Abs, std::slice::from_ref(c)) {
                            return Ok(LV::Const {
                                c: r,
                                dtype: *dtype,
                                weak: *weak,
                            });
                        }
                    }
                }
                let (d, weak, _) = self.info(&x, a.value.span)?;
                let rd = if id == B::Abs || d.is_float() {
                    d
                } else {
                    DType::F32
                };
                let v = self.materialize(&x, rd, a.value.span)?;
                let t = self.b.ty(v).clone();
                let op = crate::ir::tile::unary_op(id).ok_or(())?;
                let r = self.b.push1(OpKind::Unary { op, x: v }, t);
                Ok(self.val(r, weak))
            }
            B::Maximum | B::Minimum => {
                let a = req(self, 0)?;
                let b = req(self, 1)?;
                let x = self.expr(&a.value)?;
                let y = self.expr(&b.value)?;
                let op = if id == B::Maximum {
                    BinaryOp::Max
                } else {
                    BinaryOp::Min
                };
                self.elementwise2(op, (&x, &a.value), (&y, &b.value), span)
            }
            B::Where => {
                let c = req(self, 0)?;
                let a = req(self, 1)?;
                let b = req(self, 2)?;
                let cv = self.expr(&c.value)?;
                let av = self.expr(&a.value)?;
                let bv = self.expr(&b.value)?;
                let (dt, weak) = self.promote(&av, &bv, &a.value, &b.value, "`where`")?;
                let sc = self.shape_of(&cv, c.value.span)?;
                let sa = self.shape_of(&av, a.value.span)?;
                let sb = self.shape_of(&bv, b.value.span)?;
                let s = self.broadcast_shapes(&sa, &sb, span)?;
                let s = self.broadcast_shapes(&sc, &s, span)?;
                let cond = self.coerce(&cv, DType::Bool, &s, c.value.span)?;
                let x = self.coerce(&av, dt, &s, a.value.span)?;
                let y = self.coerce(&bv, dt, &s, b.value.span)?;
                let r = self
                    .b
                    .push1(OpKind::Select { cond, a: x, b: y }, tile_type(s, dt));
                Ok(self.val(r, weak))
            }
            B::Arange => {
                let a = req(self, 0)?;
                let b = req(self, 1)?;
                let x = self.expr(&a.value)?;
                let y = self.expr(&b.value)?;
                let len = match (self.sym_of(&x), self.sym_of(&y)) {
                    (Some(p), Some(q)) => q.checked_sub(&p),
                    _ => None,
                };
                let len = match len {
                    Some(d) => match d.as_const() {
                        Some(n) if n > u32::MAX as i64 => {
                            self.internal(span, format!("an `arange` of length {n}"));
                            return Err(());
                        }
                        Some(n) if n > 0 => n as u32,
                        _ => {
                            let lv = LV::Val {
                                v: Value(0),
                                weak: false,
                                sym: Some(d),
                            };
                            self.needs_const(span, &lv, "the length of this `arange`");
                            return Err(());
                        }
                    },
                    None => {
                        self.internal(span, "the length of this `arange` is not known");
                        return Err(());
                    }
                };
                let start = self.materialize(&x, DType::I32, a.value.span)?;
                let r = self.b.push1(
                    OpKind::Arange { start, len },
                    tile_type(vec![len], DType::I32),
                );
                Ok(self.val(r, false))
            }
            B::Zeros | B::Full => {
                let shape_arg = req(self, 0)?;
                let shape_lv = self.expr(&shape_arg.value)?;
                let items = match shape_lv {
                    LV::List(v) => v,
                    single @ (LV::Const { .. } | LV::Val { .. }) => vec![single],
                    _ => {
                        self.internal(shape_arg.span, "a shape must be a list");
                        return Err(());
                    }
                };
                let mut shape = Vec::new();
                for it in &items {
                    let n = self.const_int(it, shape_arg.value.span, "a tile dim")?;
                    if n <= 0 {
                        self.diags.push(
                            Diagnostic::new(
                                "E0406",
                                shape_arg.value.span,
                                format!("a tile dim is {n} once the kernel is specialised; tile dims must be positive"),
                            )
                            .with_help("give the const parameters that size this tile positive values"),
                        );
                        return Err(());
                    }
                    let Ok(n) = u32::try_from(n) else {
                        self.internal(shape_arg.value.span, format!("a tile dim of {n}"));
                        return Err(());
                    };
                    shape.push(n);
                }
                let (value, dt_slot) = if id == B::Zeros {
                    (
                        LV::Const {
                            c: CValue::int(0),
                            dtype: DType::I32,
                            weak: true,
                        },
                        slot(1),
                    )
                } else {
                    let v = req(self, 1)?;
                    (self.expr(&v.value)?, slot(2))
                };
                let dt = match self.arg_lv(dt_slot)? {
                    Some(LV::DType(d)) => d,
                    None => DType::F32,
                    Some(_) => {
                        self.internal(span, "the dtype argument is not a dtype");
                        return Err(());
                    }
                };
                let v = self.coerce(&value, dt, &shape, span)?;
                Ok(self.val(v, false))
            }
            B::Load => {
                let p = req(self, 0)?;
                let LV::Ref {
                    tensor,
                    access,
                    shape,
                } = self.expr(&p.value)?
                else {
                    self.internal(p.span, "`load` takes a tensor slice");
                    return Err(());
                };
                let dtype = self.tensor_dtype(tensor);
                let mask = match self.arg_lv(slot(1))? {
                    None | Some(LV::NoneV) => None,
                    Some(m) => Some(self.coerce(&m, DType::Bool, &shape, span)?),
                };
                let other_lv = self.arg_lv(slot(2))?;
                let mut runtime_other = None;
                let other = match other_lv {
                    None | Some(LV::NoneV) => {
                        if dtype.is_float() {
                            Constant::Float(0.0)
                        } else if dtype == DType::Bool {
                            Constant::Bool(false)
                        } else {
                            Constant::Int(0)
                        }
                    }
                    Some(LV::Const { c, .. }) => match (&c, dtype) {
                        (CValue::Bool(b), DType::Bool) => Constant::Bool(*b),
                        (CValue::Float(x), d) if d.is_float() => Constant::Float(*x),
                        (CValue::Int(_), d) if d.is_float() => {
                            Constant::Float(c.as_int().unwrap_or(0) as f64)
                        }
                        (CValue::Int(_), d) if d.is_int() => Constant::Int(c.as_int().unwrap_or(0)),
                        (CValue::Int(_), DType::Bool) => Constant::Bool(c.as_int() != Some(0)),
                        _ => {
                            self.internal(span, format!("`other={c}` for a {dtype} tensor"));
                            return Err(());
                        }
                    },
                    Some(lv @ LV::Val { .. }) => {
                        // A run-time `other=`: load with 0, then select it where
                        // the element is out of bounds or masked off.
                        let sp = slot(2).map(|a| a.value.span).unwrap_or(span);
                        runtime_other = Some(self.coerce(&lv, dtype, &shape, sp)?);
                        if dtype.is_float() {
                            Constant::Float(0.0)
                        } else if dtype == DType::Bool {
                            Constant::Bool(false)
                        } else {
                            Constant::Int(0)
                        }
                    }
                    Some(other) => {
                        self.internal(span, format!("`other=` is a {}", other.describe()));
                        return Err(());
                    }
                };
                let select_access = runtime_other.map(|o| (o, access.clone()));
                let mut v = self.b.push1(
                    OpKind::Load {
                        tensor,
                        access,
                        mask,
                        other,
                    },
                    tile_type(shape.clone(), dtype),
                );
                if let Some((o, access)) = select_access {
                    let mut keep = self.in_bounds(tensor, &access, &shape, span)?;
                    if let Some(m) = mask {
                        keep = self.b.push1(
                            OpKind::Binary {
                                op: BinaryOp::And,
                                a: keep,
                                b: m,
                            },
                            tile_type(shape.clone(), DType::Bool),
                        );
                    }
                    v = self.b.push1(
                        OpKind::Select {
                            cond: keep,
                            a: v,
                            b: o,
                        },
                        tile_type(shape, dtype),
                    );
                }
                Ok(self.val(v, false))
            }
            B::Store | B::AtomicAdd => {
                let p = req(self, 0)?;
                let LV::Ref {
                    tensor,
                    access,
                    shape,
                } = self.expr(&p.value)?
                else {
                    self.internal(p.span, format!("`{name}` takes a tensor slice"));
                    return Err(());
                };
                let dtype = self.tensor_dtype(tensor);
                let va = req(self, 1)?;
                let value_lv = self.expr(&va.value)?;
                let value = self.coerce(&value_lv, dtype, &shape, va.value.span)?;
                let mask = match self.arg_lv(slot(2))? {
                    None | Some(LV::NoneV) => None,
                    Some(m) => Some(self.coerce(&m, DType::Bool, &shape, span)?),
                };
                let kind = if id == B::Store {
                    OpKind::Store {
                        tensor,
                        access,
                        value,
                        mask,
                    }
                } else {
                    OpKind::AtomicAdd {
                        tensor,
                        access,
                        value,
                        mask,
                    }
                };
                self.b.push(kind, vec![]);
                Ok(LV::NoneV)
            }
            B::Dot => {
                let a = req(self, 0)?;
                let b = req(self, 1)?;
                let x = self.expr(&a.value)?;
                let y = self.expr(&b.value)?;
                let acc = match self.arg_lv(slot(2))? {
                    None | Some(LV::NoneV) => None,
                    Some(lv) => Some((lv, slot(2).map(|s| s.value.span).unwrap_or(span))),
                };
                let precision = match self.arg_lv(slot(3))? {
                    None | Some(LV::NoneV) => Precision::Ieee,
                    Some(LV::Str(s)) if s == "tf32" => Precision::Tf32,
                    Some(LV::Str(s)) if s == "ieee" => Precision::Ieee,
                    Some(_) => {
                        self.unsupported(span, "this `precision=`");
                        return Err(());
                    }
                };
                self.dot(&x, &y, acc, precision, span, &a.value, &b.value)
            }
            // Whole-tensor and session builtins: the checker rejects them in
            // kernels (E0508, E0725), and `range` only lowers as a `for` loop
            // (E0512 elsewhere).
            B::Range
            | B::Matmul
            | B::Softmax
            | B::LayerNorm
            | B::RmsNorm
            | B::Relu
            | B::Gelu
            | B::Silu
            | B::Transpose
            | B::Reshape
            | B::Empty
            | B::Ones
            | B::Randn
            | B::Tensor
            | B::Print
            | B::Len
            | B::LoadNpy
            | B::SaveNpy
            | B::SetFloat32MatmulPrecision => {
                self.unsupported(span, format!("`{name}` inside a kernel"));
                Err(())
            }
        }
    }

    /// A bool tile of the access's shape: whether each element lies inside the tensor.
    fn in_bounds(
        &mut self,
        tensor: usize,
        access: &[Access],
        shape: &[u32],
        span: Span,
    ) -> R<Value> {
        let ParamKind::Tensor { dims, .. } = self.params[tensor].kind.clone() else {
            self.internal(span, "not a tensor");
            return Err(());
        };
        let bool_t = |s: Vec<u32>| tile_type(s, DType::Bool);
        let zero = self.constant(Constant::Int(0), DType::I32);
        let mut acc: Option<Value> = None;
        let mut pos = 0;
        for (axis, a) in access.iter().enumerate() {
            let n = match &dims[axis] {
                Dim::Static(n) => self.constant(Constant::Int(*n as i64), DType::I32),
                Dim::Dynamic(_) => self.tensor_dim(tensor, axis),
            };
            let (x, s) = match a {
                Access::Point(v) => {
                    let v = self.materialize(
                        &LV::Val {
                            v: *v,
                            weak: false,
                            sym: None,
                        },
                        DType::I32,
                        span,
                    )?;
                    (v, vec![])
                }
                Access::Range { start, len } => {
                    let start = self.materialize(
                        &LV::Val {
                            v: *start,
                            weak: false,
                            sym: None,
                        },
                        DType::I32,
                        span,
                    )?;
                    let ar = self.b.push1(
                        OpKind::Arange { start, len: *len },
                        tile_type(vec![*len], DType::I32),
                    );
                    (ar, vec![*len])
                }
                // Already of the whole shape: nothing to place.
                Access::Gather(v) => (*v, shape.to_vec()),
            };
            let lo = self.coerce(
                &LV::Val {
                    v: zero,
                    weak: false,
                    sym: None,
                },
                DType::I32,
                &s,
                span,
            )?;
            let hi = self.coerce(
                &LV::Val {
                    v: n,
                    weak: false,
                    sym: None,
                },
                DType::I32,
                &s,
                span,
            )?;
            let ge = self.b.push1(
                OpKind::Binary {
                    op: BinaryOp::Ge,
                    a: x,
                    b: lo,
                },
                bool_t(s.clone()),
            );
            let lt = self.b.push1(
                OpKind::Binary {
                    op: BinaryOp::Lt,
                    a: x,
                    b: hi,
                },
                bool_t(s.clone()),
            );
            let mut ok = self.b.push1(
                OpKind::Binary {
                    op: BinaryOp::And,
                    a: ge,
                    b: lt,
                },
                bool_t(s.clone()),
            );
            // Place the axis in the result shape: [len] -> [1, .., len, .., 1].
            if matches!(a, Access::Range { .. }) {
                let mut cur = s;
                for _ in 0..pos {
                    cur.insert(0, 1);
                    ok = self
                        .b
                        .push1(OpKind::ExpandDims { x: ok, axis: 0 }, bool_t(cur.clone()));
                }
                while cur.len() < shape.len() {
                    let at = cur.len();
                    cur.push(1);
                    ok = self
                        .b
                        .push1(OpKind::ExpandDims { x: ok, axis: at }, bool_t(cur.clone()));
                }
                pos += 1;
            }
            let okv = LV::Val {
                v: ok,
                weak: false,
                sym: None,
            };
            let ok = self.coerce(&okv, DType::Bool, shape, span)?;
            acc = Some(match acc {
                None => ok,
                Some(prev) => self.b.push1(
                    OpKind::Binary {
                        op: BinaryOp::And,
                        a: prev,
                        b: ok,
                    },
                    bool_t(shape.to_vec()),
                ),
            });
        }
        match acc {
            Some(v) => Ok(v),
            None => Ok(self.constant(Constant::Bool(true), DType::Bool)),
        }
    }

    fn tensor_dtype(&self, t: usize) -> DType {
        match &self.params[t].kind {
            ParamKind::Tensor { dtype, .. } | ParamKind::Scalar(dtype) => *dtype,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn dot(
        &mut self,
        a: &LV,
        b: &LV,
        acc: Option<(LV, Span)>,
        precision: Precision,
        span: Span,
        ae: &Expr,
        be: &Expr,
    ) -> R<LV> {
        let (da, _, sa) = self.info(a, ae.span)?;
        let (db, _, sb) = self.info(b, be.span)?;
        if sa.len() != 2 || sb.len() != 2 {
            self.internal(span, "`dot` of tiles that are not 2-D");
            return Err(());
        }
        let d = DType::join(da, db).unwrap_or(da);
        let x = self.materialize(a, d, ae.span)?;
        let y = self.materialize(b, d, be.span)?;
        let out = vec![sa[0], sb[1]];
        // f64 accumulates in f64, every narrower float in f32.
        let od = if d == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let acc = match acc {
            Some((lv, sp)) => Some(self.coerce(&lv, od, &out, sp)?),
            None => None,
        };
        let r = self.b.push1(
            OpKind::Dot {
                a: x,
                b: y,
                acc,
                precision,
            },
            tile_type(out, od),
        );
        Ok(self.val(r, false))
    }

    fn reduce(&mut self, id: Builtin, x: &LV, axis: Option<i64>, keep: bool, span: Span) -> R<LV> {
        let (d, _, shape) = self.info(x, span)?;
        if shape.is_empty() {
            // A reduction of a scalar is the scalar (mean: as a float).
            return match id {
                B::Mean if !d.is_float() => {
                    let v = self.materialize(x, DType::F32, span)?;
                    Ok(self.val(v, false))
                }
                _ => Ok(x.clone()),
            };
        }
        let (op, rd) = match (id, d) {
            (B::Sum, DType::Bool) => (ReduceOp::Sum, DType::I32),
            (B::Sum, d) => (ReduceOp::Sum, d),
            (B::Mean, d) if !d.is_float() => (ReduceOp::Sum, DType::F32),
            (B::Mean, d) => (ReduceOp::Sum, d),
            (B::Max, d) => (ReduceOp::Max, d),
            (B::Min, d) => (ReduceOp::Min, d),
            (other, _) => {
                self.internal(span, format!("`{other}` is not a reduction"));
                return Err(());
            }
        };
        let mut v = self.materialize(x, rd, span)?;
        let rank = shape.len() as i64;
        let axes: Vec<usize> = match axis {
            Some(a) => {
                let a = if a < 0 { a + rank } else { a };
                if !(0..rank).contains(&a) {
                    self.internal(span, "a reduction axis out of range");
                    return Err(());
                }
                vec![a as usize]
            }
            None => (0..shape.len()).collect(),
        };
        let mut cur = shape.clone();
        let mut count: u64 = 1;
        // Reduce the highest axis first so lower indices stay valid without keepdims.
        for &ax in axes.iter().rev() {
            count *= shape[ax] as u64;
            if keep {
                cur[ax] = 1;
            } else {
                cur.remove(ax);
            }
            v = self.b.push1(
                OpKind::Reduce {
                    op,
                    x: v,
                    axis: ax,
                    keepdims: keep,
                },
                tile_type(cur.clone(), rd),
            );
        }
        if id == B::Mean {
            let inv = self.constant(Constant::Float(1.0 / count as f64), rd);
            let t = self.b.ty(v).clone();
            let inv = if t.shape().is_empty() {
                inv
            } else {
                self.b.push1(
                    OpKind::Splat {
                        x: inv,
                        shape: t.shape().to_vec(),
                    },
                    t.clone(),
                )
            };
            v = self.b.push1(
                OpKind::Binary {
                    op: BinaryOp::Mul,
                    a: v,
                    b: inv,
                },
                t,
            );
        }
        Ok(self.val(v, false))
    }
}
