//! Expressions: names, operators with broadcasting and dtype promotion,
//! subscripts (tensor slices, tile axes) and attributes.

use std::sync::Arc;

use super::consts::{fold_binary, fold_unary};
use super::ctx::{Checker, Val};
use super::dims::Dim;
use super::scope::{Entry, ModuleScope};
use super::types::{render_dims, Callee, DType, Ty, Value};
use super::{builtins, suggest};
use crate::diag::Diagnostic;
use crate::syntax::ast::{BinOp, Expr, ExprKind, Ident, Index, UnaryOp};
use crate::syntax::span::Span;

/// Scalar < tile < tensor: the kind of an elementwise result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Scalar,
    Tile,
    Tensor,
}

/// The user's expression as source text, for messages and help lines
/// (`(a + b).to(f32)`): parenthesised unless atomic, so that a method call
/// can follow it. Long or deeply nested expressions are shortened
/// (`matmul(...)`, `(...)`); the walk stops at a small depth.
pub fn describe(e: &Expr) -> String {
    const MAX_LEN: usize = 60;
    let mut s = String::new();
    if unparse_atom(e, 0, &mut s) && s.len() <= MAX_LEN {
        return s;
    }
    let mut short = String::new();
    shortened(e, 0, &mut short);
    short
}

/// Depth past which `describe` gives up on the full text.
const DESCRIBE_DEPTH: u32 = 8;

/// `e` as an operand: composite expressions in parentheses.
fn unparse_atom(e: &Expr, depth: u32, out: &mut String) -> bool {
    if matches!(
        e.kind,
        ExprKind::Unary { .. } | ExprKind::Binary { .. } | ExprKind::IfElse { .. }
    ) {
        out.push('(');
        let ok = unparse(e, depth, out);
        out.push(')');
        ok
    } else {
        unparse(e, depth, out)
    }
}

/// `e` as source text; false where it cannot be written (a parse error) or
/// is nested too deeply.
fn unparse(e: &Expr, depth: u32, out: &mut String) -> bool {
    if depth > DESCRIBE_DEPTH {
        return false;
    }
    let d = depth + 1;
    match &e.kind {
        ExprKind::Int(i) => out.push_str(&i.to_string()),
        ExprKind::Float(x) if x.is_infinite() => {
            out.push_str(if *x > 0.0 { "inf" } else { "-inf" })
        }
        ExprKind::Float(x) if x.fract() == 0.0 && x.abs() < 1e16 => {
            out.push_str(&format!("{x:.1}"))
        }
        ExprKind::Float(x) => out.push_str(&x.to_string()),
        ExprKind::Str(s) => out.push_str(&format!("{s:?}")),
        ExprKind::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
        ExprKind::None => out.push_str("None"),
        ExprKind::Name(id) => out.push_str(&id.name),
        ExprKind::Unary { op, operand } => {
            out.push_str(op.symbol());
            return unparse_atom(operand, d, out);
        }
        ExprKind::Binary { op, lhs, rhs } => {
            let ok = unparse_atom(lhs, d, out);
            out.push_str(&format!(" {} ", op.symbol()));
            return ok && unparse_atom(rhs, d, out);
        }
        ExprKind::IfElse {
            cond,
            then,
            otherwise,
        } => {
            let ok = unparse_atom(then, d, out);
            out.push_str(" if ");
            let ok = ok && unparse_atom(cond, d, out);
            out.push_str(" else ");
            return ok && unparse_atom(otherwise, d, out);
        }
        ExprKind::Call { func, args } => {
            let mut ok = unparse_atom(func, d, out);
            out.push('(');
            for (i, a) in args.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if let Some(n) = &a.name {
                    out.push_str(&n.name);
                    out.push('=');
                }
                ok = ok && unparse(&a.value, d, out);
            }
            out.push(')');
            return ok;
        }
        ExprKind::Subscript { value, indices } => {
            let mut ok = unparse_atom(value, d, out);
            out.push('[');
            for (i, ix) in indices.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                ok = ok
                    && match ix {
                        Index::Expr(x) => unparse(x, d, out),
                        Index::Slice {
                            start, end, step, ..
                        } => {
                            let part = |p: &Option<Expr>, out: &mut String| {
                                p.as_ref().is_none_or(|x| unparse(x, d, out))
                            };
                            let a = part(start, out);
                            out.push_str(if start.is_some() || end.is_some() {
                                " : "
                            } else {
                                ":"
                            });
                            let b = part(end, out);
                            let c = match step {
                                Some(_) => {
                                    out.push_str(" : ");
                                    part(step, out)
                                }
                                None => true,
                            };
                            a && b && c
                        }
                    };
            }
            out.push(']');
            return ok;
        }
        ExprKind::Attribute { value, attr } => {
            let ok = unparse_atom(value, d, out);
            out.push('.');
            out.push_str(&attr.name);
            return ok;
        }
        ExprKind::Tuple(items) | ExprKind::List(items) => {
            let list = matches!(e.kind, ExprKind::List(_));
            out.push(if list { '[' } else { '(' });
            let mut ok = true;
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                ok = ok && unparse(x, d, out);
            }
            if !list && items.len() == 1 {
                out.push(',');
            }
            out.push(if list { ']' } else { ')' });
            return ok;
        }
        ExprKind::Dict(_) | ExprKind::Error => return false,
    }
    true
}

/// The old short form: names, attributes, `f(...)`, `x[...]`, `(...)`.
fn shortened(e: &Expr, depth: u32, out: &mut String) {
    if depth > DESCRIBE_DEPTH {
        out.push_str("(...)");
        return;
    }
    match &e.kind {
        ExprKind::Name(id) => out.push_str(&id.name),
        ExprKind::Int(i) => out.push_str(&i.to_string()),
        ExprKind::Attribute { value, attr } => {
            shortened(value, depth + 1, out);
            out.push('.');
            out.push_str(&attr.name);
        }
        ExprKind::Subscript { value, .. } => {
            shortened(value, depth + 1, out);
            out.push_str("[...]");
        }
        ExprKind::Call { func, .. } => {
            shortened(func, depth + 1, out);
            out.push_str("(...)");
        }
        _ => out.push_str("(...)"),
    }
}

/// numpy broadcasting of two shapes (right-aligned; 1 stretches).
pub fn broadcast(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let x = (i + a.len()).checked_sub(n).map(|j| &a[j]);
        let y = (i + b.len()).checked_sub(n).map(|j| &b[j]);
        out.push(match (x, y) {
            (Some(x), Some(y)) if x == y => x.clone(),
            (Some(x), Some(y)) if x.is_one() => y.clone(),
            (Some(x), Some(y)) if y.is_one() => x.clone(),
            (Some(_), Some(_)) => return None,
            (Some(x), None) => x.clone(),
            (None, Some(y)) => y.clone(),
            (None, None) => unreachable!("i < max rank"),
        });
    }
    Some(out)
}

fn same_category(a: DType, b: DType) -> bool {
    (a.is_float() && b.is_float()) || (a.is_int() && b.is_int())
}

impl Checker<'_> {
    pub fn expr(&mut self, e: &Expr) -> Val {
        crate::cancel::checkpoint();
        let callee = std::mem::take(&mut self.callee);
        let mut v = self.expr_inner(e);
        if let Ty::Tile { dims, .. } | Ty::Tensor { dims, .. } = &v.ty {
            if dims.len() > super::types::MAX_RANK {
                let what = if matches!(v.ty, Ty::Tile { .. }) {
                    "tile"
                } else {
                    "tensor"
                };
                self.report(super::types::rank_limit(e.span, what, dims.len()));
                v = Val::err();
            }
        }
        if !callee {
            if let Ty::Callable(c) = &v.ty {
                self.report(not_a_value(c, e));
                v = Val::err();
            }
        }
        if let Some(vals) = &mut self.expr_vals {
            vals.push((e.span, v.clone()));
        }
        // Every expression but literals has its type recorded, for hover.
        if matches!(
            e.kind,
            ExprKind::Name(_)
                | ExprKind::Call { .. }
                | ExprKind::Subscript { .. }
                | ExprKind::Attribute { .. }
                | ExprKind::Binary { .. }
                | ExprKind::Unary { .. }
                | ExprKind::IfElse { .. }
        ) {
            self.record(e.span, &v.ty);
        }
        if self.in_kernel {
            if let Ty::Tile { dims, dtype } = &v.ty {
                self.usage.note_tile(dims, *dtype, e.span);
            }
        }
        v
    }

    fn expr_inner(&mut self, e: &Expr) -> Val {
        match &e.kind {
            ExprKind::Int(i) => Val::with(Ty::weak(DType::I32), Some(Value::int(*i))),
            ExprKind::Float(x) => Val::with(Ty::weak(DType::F32), Some(Value::Float(*x))),
            ExprKind::Str(s) => Val::with(Ty::Str, Some(Value::Str(s.clone()))),
            ExprKind::Bool(b) => Val::with(Ty::weak(DType::Bool), Some(Value::Bool(*b))),
            ExprKind::None => Val::with(Ty::NoneV, Some(Value::None)),
            ExprKind::Name(id) => self.name(id),
            ExprKind::Unary { op, operand } => self.unary(*op, operand),
            ExprKind::Binary { op, lhs, rhs } => {
                let l = self.expr(lhs);
                let r = self.expr(rhs);
                self.binary(*op, &l, &r, e.span, lhs, rhs)
            }
            ExprKind::IfElse {
                cond,
                then,
                otherwise,
            } => {
                let c = self.expr(cond);
                self.condition(&c, cond);
                let t = self.expr(then);
                let o = self.expr(otherwise);
                self.merge_values(&t, &o, then, otherwise)
            }
            ExprKind::Call { func, args } => self.call(e, func, args),
            ExprKind::Subscript { value, indices } => {
                let v = self.expr(value);
                self.subscript(v, value, indices)
            }
            ExprKind::Attribute { value, attr } => self.attribute(value, attr),
            ExprKind::Tuple(items) | ExprKind::List(items) => {
                let vals: Vec<Val> = items.iter().map(|i| self.expr(i)).collect();
                let value = vals
                    .iter()
                    .map(|v| v.value.clone())
                    .collect::<Option<Vec<_>>>()
                    .map(Value::Tuple);
                let tys = vals.into_iter().map(|v| v.ty).collect();
                let ty = if matches!(e.kind, ExprKind::Tuple(_)) {
                    Ty::Tuple(tys)
                } else {
                    Ty::List(tys)
                };
                Val::with(ty, value)
            }
            ExprKind::Dict(pairs) => {
                for (k, v) in pairs {
                    self.expr(k);
                    self.expr(v);
                }
                Val::of(Ty::Dict)
            }
            ExprKind::Error => Val::err(),
        }
    }

    /// The value of a module-level entry.
    pub fn entry_val(&mut self, entry: &Entry) -> Val {
        match entry {
            Entry::Const { ty, value } => Val::with(ty.clone(), value.clone()),
            Entry::Function(sig) => Val::of(Ty::Callable(Callee::Function(sig.clone()))),
            Entry::Module(m) => Val::of(Ty::Module(m.clone())),
            Entry::Namespace(map) => Val::of(Ty::Module(Arc::new(ModuleScope {
                entries: map.clone(),
            }))),
            Entry::Global(ty, value) => Val::with(ty.clone(), value.clone()),
            Entry::Broken => Val::err(),
        }
    }

    pub fn name(&mut self, id: &Ident) -> Val {
        if let Some(b) = self.env.get(&id.name) {
            let (ty, value, maybe, span) = (b.ty.clone(), b.value.clone(), b.maybe_unbound, b.span);
            self.reads.insert(id.name.clone());
            if maybe {
                self.report(
                    Diagnostic::new(
                        "E0209",
                        id.span,
                        format!("`{}` may be used before it is assigned", id.name),
                    )
                    .with_label(
                        span,
                        "assigned here, but not on every path that reaches the use",
                    )
                    .with_help(format!(
                        "assign `{}` before the `if`/loop, on every path",
                        id.name
                    )),
                );
                if let Some(b) = self.env_mut(&id.name) {
                    b.maybe_unbound = false;
                }
            }
            return Val::with(ty, value);
        }
        if self.fn_locals.contains(&id.name) {
            self.report(
                Diagnostic::new(
                    "E0209",
                    id.span,
                    format!("`{}` is used before it is assigned", id.name),
                )
                .with_help(format!(
                    "`{}` is assigned later in this function; assign it before this use",
                    id.name
                )),
            );
            return Val::err();
        }
        if let Some(entry) = self.scope.get(&id.name) {
            self.uses.insert(id.name.clone());
            let entry = entry.clone();
            return self.entry_val(&entry);
        }
        if let Some(b) = builtins::lookup(&id.name) {
            return Val::of(Ty::Callable(Callee::Builtin(b.id)));
        }
        if let Some(d) = DType::from_name(&id.name) {
            return Val::with(Ty::DTypeV, Some(Value::DType(d)));
        }
        match id.name.as_str() {
            "inf" => return Val::with(Ty::weak(DType::F32), Some(Value::Float(f64::INFINITY))),
            "True" | "False" => {
                return Val::with(Ty::weak(DType::Bool), Some(Value::Bool(id.name == "True")))
            }
            _ => {}
        }
        let mut d = Diagnostic::new("E0201", id.span, format!("unknown name `{}`", id.name))
            .with_help("define it before this line: an assignment, a parameter, a `def` or a `from std... import`");
        let scope = self.scope;
        let candidates: Vec<String> = self
            .env
            .keys()
            .cloned()
            .chain(scope.names().map(String::from))
            .chain(builtins::names().map(String::from))
            .chain(DType::ALL.iter().map(|d| d.name().to_string()))
            .collect();
        if let Some(s) = suggest(&id.name, candidates.iter().map(String::as_str)) {
            d = d.with_help(format!("did you mean `{s}`?"));
            // The user probably meant the local: do not also call it unused.
            self.reads.insert(s.to_string());
        }
        self.report(d);
        Val::err()
    }

    /// An `if`/`while`/conditional-expression condition must be a scalar.
    pub fn condition(&mut self, c: &Val, e: &Expr) {
        match &c.ty {
            Ty::Scalar { .. } | Ty::Err => {}
            // A session evaluates its top-level statements on the host, where a
            // one-element tensor is read as its number (numpy's `bool(t)`).
            Ty::Tensor { dims, .. } if self.top_level && !self.in_kernel && dims.iter().all(Dim::is_one) => {}
            Ty::Tile { .. } => self.report(
                Diagnostic::new("E0308", e.span, format!("condition is a tile (`{}`), not a scalar", c.ty))
                    .with_help("reduce it to a scalar (e.g. `max(t) > 0`), or select elementwise with `where(cond, a, b)`"),
            ),
            other => self.report(Diagnostic::new(
                "E0308",
                e.span,
                format!("condition is a {} (`{other}`), not a scalar", other.kind_name()),
            )
            .with_help(
                "a condition is one number or bool, e.g. `if n > 0:`; reduce a tensor first, e.g. `sum(t) > 0`",
            )),
        }
    }

    /// The classification of an elementwise operand.
    pub fn operand(&mut self, v: &Val, e: &Expr) -> Option<(Kind, Vec<Dim>)> {
        match &v.ty {
            Ty::Scalar { .. } => Some((Kind::Scalar, Vec::new())),
            Ty::Tile { dims, .. } => Some((Kind::Tile, dims.clone())),
            Ty::Tensor { dims, .. } if !self.in_kernel => Some((Kind::Tensor, dims.clone())),
            Ty::Tensor { .. } | Ty::Ref { .. } => {
                self.report(
                    Diagnostic::new(
                        "E0313",
                        e.span,
                        format!("`{}` is a tensor in global memory (`{}`); load it before computing with it", describe(e), v.ty),
                    )
                    .with_primary_label("tensor used as a tile")
                    .with_help(match &e.kind {
                        ExprKind::Subscript { .. } => format!("load a tile first: `load({})`", describe(e)),
                        _ => format!("load a tile first: `load({}[...])`", describe(e)),
                    }),
                );
                None
            }
            Ty::Err => None,
            other => {
                self.report(Diagnostic::new(
                    "E0302",
                    e.span,
                    format!(
                        "expected a number, tile or tensor, found {} `{other}`",
                        other.kind_name()
                    ),
                )
                .with_help(
                    "arithmetic takes numbers, tiles and tensors: index a shape or tuple first (`x.shape[0]`), or make a tensor with `tensor([...])`",
                ));
                None
            }
        }
    }

    /// The dtype of `l op r`, with the promotion rules: literals adapt; strong
    /// dtypes only widen (f16 + f32 -> f32); a scalar takes the dtype of the
    /// tile/tensor it meets when both are floats (or both integers).
    #[allow(clippy::too_many_arguments)]
    pub fn promote(
        &mut self,
        l: &Ty,
        r: &Ty,
        lk: Kind,
        rk: Kind,
        what: &str,
        span: Span,
        le: &Expr,
        re: &Expr,
    ) -> Option<(DType, bool)> {
        let (a, b) = (l.dtype()?, r.dtype()?);
        let (aw, bw) = (l.is_weak(), r.is_weak());
        if aw && bw {
            let d = if a == DType::Bool && b == DType::Bool {
                DType::Bool
            } else if a.is_float() || b.is_float() {
                DType::F32
            } else {
                DType::I32
            };
            return Some((d, true));
        }
        if aw || bw {
            let (w, s) = if aw { (a, b) } else { (b, a) };
            if w.is_float() && s.is_int() {
                return Some((DType::F32, false));
            }
            let ok = match w {
                DType::Bool => s == DType::Bool,
                _ => s != DType::Bool,
            };
            if ok {
                return Some((s, false));
            }
        } else if same_category(a, b) && (lk == Kind::Scalar) != (rk == Kind::Scalar) {
            return Some((if lk == Kind::Scalar { b } else { a }, false));
        } else if lk == Kind::Scalar && a.is_int() && b.is_float() {
            // An integer scalar (a dim, a loop index, an `i32` parameter) is weak
            // against floats, as in Triton and numpy: `sum(v) / N`.
            return Some((b, false));
        } else if rk == Kind::Scalar && b.is_int() && a.is_float() {
            return Some((a, false));
        } else if let Some(d) = DType::join(a, b) {
            return Some((d, false));
        }
        let target = if a.is_float() && !b.is_float() {
            (re, a)
        } else if b.is_float() && !a.is_float() {
            (le, b)
        } else if a.widens_to(DType::F32) && b.widens_to(DType::F32) {
            (le, DType::F32)
        } else {
            (re, a)
        };
        let mut d = Diagnostic::new(
            "E0301",
            span,
            format!("mismatched dtypes in {what}: `{a}` and `{b}`"),
        )
        .with_label(le.span, format!("this is `{l}`"))
        .with_label(re.span, format!("this is `{r}`"))
        .with_help(format!(
            "dtypes never narrow implicitly; convert explicitly, e.g. `{}.to({})`",
            describe(target.0),
            target.1
        ));
        if a.widens_to(DType::F32) && b.widens_to(DType::F32) && a.is_float() && b.is_float() {
            d = d.with_help(format!(
                "`{a}` and `{b}` do not widen to each other; convert one side explicitly, e.g. `{}.to(f32)`",
                describe(le)
            ));
        }
        self.report(d);
        None
    }

    pub fn binary(&mut self, op: BinOp, l: &Val, r: &Val, span: Span, le: &Expr, re: &Expr) -> Val {
        if l.ty.is_err() || r.ty.is_err() {
            return Val::err();
        }
        if matches!(op, BinOp::And | BinOp::Or) {
            for (v, e) in [(l, le), (r, re)] {
                if !v.ty.is_scalar() {
                    self.report(
                        Diagnostic::new(
                            "E0302",
                            e.span,
                            format!("`{}` takes scalars, found `{}`", op.symbol(), v.ty),
                        )
                        .with_help(format!(
                            "use `{}` for elementwise logic on tiles",
                            if op == BinOp::And { "&" } else { "|" }
                        )),
                    );
                    return Val::err();
                }
            }
            let value = match (&l.value, &r.value) {
                (Some(a), Some(b)) => fold_binary(op, a, b).ok().flatten(),
                _ => None,
            };
            return Val::with(
                Ty::Scalar {
                    dtype: DType::Bool,
                    weak: l.ty.is_weak() && r.ty.is_weak(),
                },
                value,
            );
        }
        if op == BinOp::MatMul {
            return if self.in_kernel {
                self.dot_op(l, r, None, None, span, le, re)
            } else {
                self.matmul_op(l, r, span, le, re)
            };
        }
        let Some((lk, ld)) = self.operand(l, le) else {
            return Val::err();
        };
        let Some((rk, rd)) = self.operand(r, re) else {
            return Val::err();
        };
        let Some(dims) = broadcast(&ld, &rd) else {
            self.report(
                Diagnostic::new(
                    "E0402",
                    span,
                    format!("shapes {} and {} do not broadcast in `{}`", render_dims(&ld), render_dims(&rd), op.symbol()),
                )
                .with_label(le.span, format!("this is `{}`", l.ty))
                .with_label(re.span, format!("this is `{}`", r.ty))
                .with_help("broadcasting matches dims from the right; each pair must be equal or 1 (add an axis with `[:, None]`)"),
            );
            return Val::err();
        };
        let kind = lk.max(rk);
        let Some((dt, weak)) = self.promote(
            &l.ty,
            &r.ty,
            lk,
            rk,
            &format!("`{}`", op.symbol()),
            span,
            le,
            re,
        ) else {
            return Val::err();
        };
        // A literal or host integer (64-bit) meeting an integer dtype takes that
        // dtype: its value must be one of the dtype's (numpy 2's rule), never wrap.
        if !weak && dt.is_int() {
            for (v, e) in [(l, le), (r, re)] {
                let Some(i) = v
                    .value
                    .as_ref()
                    .filter(|_| v.ty.is_weak())
                    .and_then(Value::as_int)
                else {
                    continue;
                };
                if !crate::check::stmt::int_fits(dt, i) {
                    self.report(
                        Diagnostic::new(
                            "E0324",
                            e.span,
                            format!("the integer {i} is out of range for `{dt}`"),
                        )
                        .with_primary_label(format!("this meets an operand of `{dt}`"))
                        .with_help(
                            "convert the other operand to a wider dtype first, e.g. `.to(i64)`",
                        ),
                    );
                    return Val::err();
                }
            }
        }
        use BinOp::*;
        let dt = match op {
            Eq | Ne | Lt | Le | Gt | Ge => DType::Bool,
            BitAnd | BitOr | BitXor => {
                if !(dt.is_int() || dt == DType::Bool) {
                    self.report(
                        Diagnostic::new(
                            "E0314",
                            span,
                            format!(
                                "`{}` needs integer or bool operands, found `{dt}`",
                                op.symbol()
                            ),
                        )
                        .with_label(le.span, format!("this is `{}`", l.ty))
                        .with_label(re.span, format!("this is `{}`", r.ty))
                        .with_help(
                            "bitwise operators work on integers and bools: convert with `.to(i32)`, or compare first (`(x > 0) & (y > 0)`)",
                        ),
                    );
                    return Val::err();
                }
                dt
            }
            Div if !dt.is_float() && dt != DType::Bool => DType::F32,
            // The code generator has no f64 exp2/log2 (PTX approximates f32 only).
            Pow if dt == DType::F64 && self.in_kernel => {
                self.report(
                    Diagnostic::new("E0311", span, "`**` on f64 is not supported in kernels")
                        .with_help(
                            "compute it in f32 (`.to(f32)`), or multiply for a small integer power",
                        ),
                );
                return Val::err();
            }
            _ if dt == DType::Bool => {
                self.report(
                    Diagnostic::new(
                        "E0311",
                        span,
                        format!("`{}` is not defined on `bool` values", op.symbol()),
                    )
                    .with_help("convert first, e.g. `.to(i32)`, or use `&`, `|`, `~` for logic"),
                );
                return Val::err();
            }
            _ => dt,
        };
        let mut value = None;
        if kind == Kind::Scalar {
            if let (Some(a), Some(b)) = (&l.value, &r.value) {
                match fold_binary(op, a, b) {
                    Ok(v) => value = v,
                    Err(msg) => self.report(
                        Diagnostic::new(
                            "E0315",
                            span,
                            format!("constant evaluation failed: {msg}"),
                        )
                        .with_help(super::consts::failure_help(&msg)),
                    ),
                }
            }
        }
        let ty = match kind {
            Kind::Scalar => Ty::Scalar { dtype: dt, weak },
            Kind::Tile => Ty::tile(dims, dt),
            Kind::Tensor => Ty::Tensor { dims, dtype: dt },
        };
        Val::with(ty, value)
    }

    fn unary(&mut self, op: UnaryOp, operand: &Expr) -> Val {
        let v = self.expr(operand);
        if v.ty.is_err() {
            return v;
        }
        let Some((kind, _)) = self.operand(&v, operand) else {
            return Val::err();
        };
        let dt = v.ty.dtype().unwrap_or(DType::F32);
        match op {
            UnaryOp::Neg | UnaryOp::Pos if dt == DType::Bool => {
                let help = if op == UnaryOp::Neg {
                    "negate a bool with `not b` (a scalar) or `~m` (a mask); for arithmetic convert first: `.to(i32)`"
                } else {
                    "drop the `+`, or convert first for arithmetic: `.to(i32)`"
                };
                self.report(
                    Diagnostic::new(
                        "E0311",
                        operand.span,
                        format!("`{}` is not defined on `bool` values", op.symbol().trim()),
                    )
                    .with_help(help),
                );
                return Val::err();
            }
            UnaryOp::Not if kind != Kind::Scalar => {
                self.report(
                    Diagnostic::new(
                        "E0302",
                        operand.span,
                        format!("`not` takes a scalar, found `{}`", v.ty),
                    )
                    .with_help("use `~` for elementwise negation of a bool tile"),
                );
                return Val::err();
            }
            UnaryOp::Not => {
                return Val::with(
                    Ty::Scalar {
                        dtype: DType::Bool,
                        weak: v.ty.is_weak(),
                    },
                    v.value.as_ref().and_then(|x| fold_unary(op, x)),
                )
            }
            UnaryOp::Invert if !(dt.is_int() || dt == DType::Bool) => {
                self.report(Diagnostic::new(
                    "E0314",
                    operand.span,
                    format!("`~` needs integer or bool operands, found `{dt}`"),
                )
                .with_help(
                    "`~` inverts integers and bools; for a float write `-x`, or invert a comparison: `~(x > 0)`",
                ));
                return Val::err();
            }
            _ => {}
        }
        let value = v.value.as_ref().and_then(|x| fold_unary(op, x));
        Val::with(v.ty, value)
    }

    /// Whether two types may meet at a merge point (branches, loop back-edges).
    pub fn compatible(a: &Ty, b: &Ty) -> bool {
        match (a, b) {
            (Ty::Err, _) | (_, Ty::Err) => true,
            (Ty::Scalar { dtype: x, weak: xw }, Ty::Scalar { dtype: y, weak: yw }) => {
                x == y
                    || ((*xw || *yw)
                        && (same_category(*x, *y)
                            || (*xw && y.is_float() && x.is_int())
                            || (*yw && x.is_float() && y.is_int())))
            }
            (Ty::Scalar { .. }, _) | (_, Ty::Scalar { .. }) => false,
            _ => a == b,
        }
    }

    /// The merge of two values of a conditional expression.
    fn merge_values(&mut self, t: &Val, o: &Val, te: &Expr, oe: &Expr) -> Val {
        if t.ty.is_err() || o.ty.is_err() {
            return Val::err();
        }
        if !Self::compatible(&t.ty, &o.ty) {
            self.report(
                Diagnostic::new(
                    "E0407",
                    te.span.to(oe.span),
                    format!(
                        "the two branches have different types: `{}` and `{}`",
                        t.ty, o.ty
                    ),
                )
                .with_label(te.span, format!("this is `{}`", t.ty))
                .with_label(oe.span, format!("this is `{}`", o.ty))
                .with_help(
                    "give both branches the same type: convert one with `.to(...)`, or make their shapes equal",
                ),
            );
            return Val::err();
        }
        let ty = match (&t.ty, &o.ty) {
            (Ty::Scalar { weak: true, .. }, x) => x.clone(),
            (x, _) => x.clone(),
        };
        let value = if t.value == o.value {
            t.value.clone()
        } else {
            None
        };
        Val::with(ty, value)
    }

    /// An index that must be an integer scalar; returns its value if known.
    fn int_index(&mut self, v: &Val, e: &Expr) -> Result<Option<Value>, ()> {
        match &v.ty {
            Ty::Scalar { dtype, .. } if dtype.is_int() => Ok(v.value.clone()),
            Ty::Err => Err(()),
            other => {
                self.report(
                    Diagnostic::new(
                        "E0302",
                        e.span,
                        format!("an index must be an integer, found `{other}`"),
                    )
                    .with_help(
                        "index with an integer, e.g. `t[i]`; convert a float first with `.to(i32)`",
                    ),
                );
                Err(())
            }
        }
    }

    pub fn subscript(&mut self, v: Val, value_expr: &Expr, indices: &[Index]) -> Val {
        match v.ty.clone() {
            Ty::Tensor { dims, dtype } => {
                self.index_tensor(&dims, dtype, indices, value_expr, &v.ty)
            }
            Ty::Tile { dims, dtype } => self.index_tile(&dims, dtype, indices, &v.ty),
            Ty::Shape(_) | Ty::Tuple(_) | Ty::List(_) if indices.len() == 1 => {
                let dims: Vec<Dim> = match &v.ty {
                    Ty::Shape(d) => d.clone(),
                    _ => Vec::new(),
                };
                let Index::Expr(ie) = &indices[0] else {
                    self.report(
                        Diagnostic::new(
                            "E0302",
                            indices[0].span(),
                            "slices of shapes and tuples are not supported",
                        )
                        .with_help("index one item at a time, e.g. `x.shape[0]`"),
                    );
                    return Val::err();
                };
                let iv = self.expr(ie);
                let Ok(Some(i)) = self.int_index(&iv, ie).map(|x| x.and_then(|x| x.as_int()))
                else {
                    if !iv.ty.is_err() {
                        self.report(Diagnostic::new(
                            "E0310",
                            ie.span,
                            "this index must be a compile-time constant",
                        )
                        .with_help(
                            "index a shape or tuple with a literal or a `const`, e.g. `x.shape[0]`",
                        ));
                    }
                    return Val::err();
                };
                let len = match &v.ty {
                    Ty::Shape(_) => dims.len(),
                    Ty::Tuple(t) | Ty::List(t) => t.len(),
                    _ => 0,
                };
                let j = if i < 0 {
                    i.saturating_add(len as i64)
                } else {
                    i
                };
                if j < 0 || j >= len as i64 {
                    self.report(
                        Diagnostic::new(
                            "E0413",
                            ie.span,
                            format!("index {i} is out of range for `{}` of length {len}", v.ty),
                        )
                        .with_help(if len == 0 {
                            "it has no items".to_string()
                        } else {
                            format!(
                                "its indices are 0 to {} (or -{len} to -1, counting from the end)",
                                len - 1
                            )
                        }),
                    );
                    return Val::err();
                }
                let j = j as usize;
                match &v.ty {
                    Ty::Shape(_) => {
                        Val::with(Ty::scalar(DType::I32), Some(Value::Int(dims[j].clone())))
                    }
                    Ty::Tuple(t) | Ty::List(t) => {
                        let value = match &v.value {
                            Some(Value::Tuple(vs)) => vs.get(j).cloned(),
                            _ => None,
                        };
                        Val::with(t[j].clone(), value)
                    }
                    _ => Val::err(),
                }
            }
            Ty::Err => {
                self.index_exprs(indices);
                Val::err()
            }
            other => {
                self.index_exprs(indices);
                self.report(
                    Diagnostic::new(
                        "E0302",
                        value_expr.span,
                        format!("a {} (`{other}`) cannot be indexed", other.kind_name()),
                    )
                    .with_help("only tensors, tiles, shapes, tuples and lists can be indexed"),
                );
                Val::err()
            }
        }
    }

    fn index_exprs(&mut self, indices: &[Index]) {
        for i in indices {
            match i {
                Index::Expr(e) => {
                    self.expr(e);
                }
                Index::Slice {
                    start, end, step, ..
                } => {
                    for e in [start, end, step].into_iter().flatten() {
                        self.expr(e);
                    }
                }
            }
        }
    }

    fn too_many_indices(&mut self, indices: &[Index], ty: &Ty, rank: usize) -> bool {
        let n = indices
            .iter()
            .filter(|i| {
                !matches!(
                    i,
                    Index::Expr(Expr {
                        kind: ExprKind::None,
                        ..
                    })
                )
            })
            .count();
        if n > rank {
            let span = indices[rank.min(indices.len() - 1)]
                .span()
                .to(indices[indices.len() - 1].span());
            self.report(
                Diagnostic::new(
                    "E0410",
                    span,
                    format!(
                        "{n} indices for `{ty}`, which has {rank} dim{}",
                        if rank == 1 { "" } else { "s" }
                    ),
                )
                .with_primary_label("extra index")
                .with_help(
                    format!("remove the extra index: `{ty}` takes at most {rank} (a `None`, which adds an axis, does not count)"),
                ),
            );
            self.index_exprs(indices);
            return true;
        }
        false
    }

    fn index_tensor(
        &mut self,
        dims: &[Dim],
        dtype: DType,
        indices: &[Index],
        value_expr: &Expr,
        ty: &Ty,
    ) -> Val {
        if self.too_many_indices(indices, ty, dims.len()) {
            return Val::err();
        }
        let mut out = Vec::with_capacity(dims.len());
        let mut d = 0;
        let mut failed = false;
        for idx in indices {
            match idx {
                Index::Expr(Expr {
                    kind: ExprKind::None,
                    ..
                }) => out.push(Dim::constant(1)),
                Index::Expr(e) => {
                    let v = self.expr(e);
                    match &v.ty {
                        // Outside kernels a gather has no lowering: rejected
                        // here, so that check, emit and run agree. (A top-level
                        // statement reads a rank-0 index tensor on the host.)
                        Ty::Tensor { dims: td, dtype }
                            if dtype.is_int()
                                && !self.in_kernel
                                && !(self.top_level && td.is_empty()) =>
                        {
                            self.report(
                                Diagnostic::new(
                                    "E0512",
                                    e.span,
                                    "indexing a tensor with an integer tensor (a gather) is not supported in whole-tensor code yet",
                                )
                                .with_help("gather in a `@kernel` with `load(x[idx])` and launch it from the function"),
                            );
                            failed = true;
                        }
                        Ty::Tile { dims: td, dtype } | Ty::Tensor { dims: td, dtype }
                            if dtype.is_int() =>
                        {
                            out.extend(td.iter().cloned());
                        }
                        _ => match self.int_index(&v, e) {
                            Ok(Some(Value::Int(i))) => {
                                if let (Some(i), Some(n)) = (i.as_const(), dims[d].as_const()) {
                                    if i >= n || i < n.saturating_neg() {
                                        self.report(
                                            Diagnostic::new("E0413", e.span, format!("index {i} is out of range for dim {d} of `{ty}` (size {n})"))
                                                .with_label(value_expr.span, format!("this is `{ty}`"))
                                                .with_help(
                                                    format!("dim {d} has indices 0 to {} (or -{n} to -1, counting from the end)", n - 1),
                                                ),
                                        );
                                    }
                                }
                            }
                            Ok(_) => {}
                            Err(()) => failed = true,
                        },
                    }
                    d += 1;
                }
                Index::Slice {
                    start,
                    end,
                    step,
                    span,
                } => {
                    let full = dims[d].clone();
                    d += 1;
                    let part =
                        |c: &mut Self, e: &Option<Expr>| -> Result<Option<Option<Dim>>, ()> {
                            let Some(e) = e else { return Ok(None) };
                            let v = c.expr(e);
                            match c.int_index(&v, e)? {
                                Some(Value::Int(x)) => Ok(Some(Some(x))),
                                _ => Ok(Some(None)),
                            }
                        };
                    let (Ok(s), Ok(en)) = (part(self, start), part(self, end)) else {
                        failed = true;
                        continue;
                    };
                    // Top-level statements run on the host, which takes any step
                    // (`Some(None)`: not known here).
                    let mut stepped: Option<Option<i64>> = None;
                    if let Some(st) = step {
                        let sv = self.expr(st);
                        let k = sv.value.as_ref().and_then(Value::as_int);
                        if k != Some(1) && !sv.ty.is_err() {
                            if self.top_level && !self.in_kernel {
                                if k == Some(0) {
                                    self.report(
                                        Diagnostic::new(
                                            "E0302",
                                            st.span,
                                            "a slice step cannot be zero",
                                        )
                                        .with_help("use a step other than zero, e.g. `t[::2]`"),
                                    );
                                    failed = true;
                                    continue;
                                }
                                stepped = Some(k);
                            } else {
                                self.report(
                                    Diagnostic::new(
                                        "E0302",
                                        st.span,
                                        "slices with a step are not supported",
                                    )
                                    .with_help(if self.in_kernel {
                                        "in a kernel, gather the elements through a strided index tile: `load(x[arange(0, n) * 2])`"
                                    } else {
                                        "steps are supported in top-level statements only (the host indexes the tensor)"
                                    }),
                                );
                                // The slice's shape is unknown: nothing downstream is
                                // checked against the stepless one.
                                failed = true;
                                continue;
                            }
                        }
                    }
                    let whole = start.is_none() && end.is_none();
                    let zero = Dim::constant(0);
                    // In whole-tensor functions bounds are Python's: a negative
                    // constant counts from the end, and constant bounds clamp to
                    // the axis (kernel slices are windows of memory: kept as written).
                    let (s, en) = if self.in_kernel {
                        (s, en)
                    } else {
                        let norm =
                            |b: Option<Option<Dim>>| b.map(|b| b.map(|b| python_bound(&b, &full)));
                        (norm(s), norm(en))
                    };
                    let len = match (s, en) {
                        (None, None) => Some(full),
                        (Some(Some(a)), None) => full.checked_sub(&a),
                        (None, Some(Some(b))) => b.checked_sub(&zero),
                        (Some(Some(a)), Some(Some(b))) => b.checked_sub(&a),
                        _ => None,
                    };
                    let len = match len.as_ref().and_then(Dim::as_const) {
                        Some(n) if n < 0 && !self.in_kernel => Some(zero),
                        _ => len,
                    };
                    // With a step: ceil(len / step) when the step is positive (or
                    // the slice is the whole axis), else known at run time only.
                    let len = match (stepped, len.as_ref().and_then(Dim::as_const)) {
                        (None, _) => len,
                        (Some(Some(k)), Some(n)) if k > 0 || whole => {
                            Some(Dim::constant((n + k.abs() - 1) / k.abs()))
                        }
                        (Some(_), _) => Some(Dim::symbol("?")),
                    };
                    match len {
                        Some(len) => {
                            if self.in_kernel {
                                if let Some(sym) = self.runtime_symbol(&len) {
                                    self.report(
                                        Diagnostic::new(
                                            "E0405",
                                            *span,
                                            format!("this slice has length `{len}`, which is not a compile-time constant: `{sym}` is a run-time value; it would need to be a `const` or a tensor dim the kernel is specialised on"),
                                        )
                                        .with_help(format!(
                                            "write `start : start + SIZE` with a constant SIZE (e.g. `i : i + BLOCK`), or make `{sym}` a `const` parameter or a tensor dim the kernel is specialised on"
                                        )),
                                    );
                                    failed = true;
                                    continue;
                                }
                                if len.as_const().is_some_and(|n| n <= 0) {
                                    self.report(Diagnostic::new("E0405", *span, format!("this slice has length {len}; slices in kernels must be non-empty"))
                                        .with_help(
                                            "make the end greater than the start: `start : start + SIZE` with SIZE at least 1",
                                        ));
                                    failed = true;
                                    continue;
                                }
                            }
                            out.push(len);
                        }
                        None if self.in_kernel => {
                            self.report(
                                Diagnostic::new("E0405", *span, "the length of this slice is not a compile-time constant")
                                    .with_help("write `start : start + SIZE` with a constant SIZE (e.g. `i : i + BLOCK`)"),
                            );
                            failed = true;
                        }
                        None => failed = true,
                    }
                }
            }
        }
        if failed {
            return Val::err();
        }
        out.extend(dims[d..].iter().cloned());
        if self.in_kernel {
            Val::of(Ty::Ref { dims: out, dtype })
        } else {
            Val::of(Ty::Tensor { dims: out, dtype })
        }
    }

    fn index_tile(&mut self, dims: &[Dim], dtype: DType, indices: &[Index], ty: &Ty) -> Val {
        if self.too_many_indices(indices, ty, dims.len()) {
            return Val::err();
        }
        let mut out = Vec::with_capacity(dims.len() + 1);
        let mut d = 0;
        for idx in indices {
            match idx {
                Index::Expr(Expr {
                    kind: ExprKind::None,
                    ..
                }) => out.push(Dim::constant(1)),
                Index::Expr(e) => {
                    let v = self.expr(e);
                    match self.int_index(&v, e) {
                        Ok(Some(Value::Int(i))) if self.runtime_symbol(&i).is_none() => {
                            if let (Some(i), Some(n)) = (i.as_const(), dims[d].as_const()) {
                                if i >= n || i < n.saturating_neg() {
                                    self.report(Diagnostic::new("E0413", e.span, format!("index {i} is out of range for dim {d} of `{ty}` (size {n})"))
                                        .with_help(
                                            format!("dim {d} has indices 0 to {} (or -{n} to -1, counting from the end)", n - 1),
                                        ));
                                    return Val::err();
                                }
                            }
                        }
                        Ok(_) => {
                            self.report(
                                Diagnostic::new("E0302", e.span, "tiles are indexed with constants, `:` and `None` only")
                                    .with_help("select elements with `where(mask, a, b)` or load the data you need"),
                            );
                            return Val::err();
                        }
                        Err(()) => return Val::err(),
                    }
                    d += 1;
                }
                Index::Slice {
                    start: None,
                    end: None,
                    step: None,
                    ..
                } => {
                    out.push(dims[d].clone());
                    d += 1;
                }
                Index::Slice { step: Some(st), .. } => {
                    self.report(
                        Diagnostic::new("E0302", st.span, "slices of tiles with a step are not supported")
                            .with_help("load the elements you need with a strided index tile: `load(x[arange(0, n) * 2])`"),
                    );
                    return Val::err();
                }
                Index::Slice {
                    start, end, span, ..
                } => {
                    let s = start.as_ref().map(|e| self.expr(e).value);
                    let en = end.as_ref().map(|e| self.expr(e).value);
                    let a = match s {
                        None => Some(Dim::constant(0)),
                        Some(Some(Value::Int(a))) => Some(a),
                        _ => None,
                    };
                    let b = match en {
                        None => Some(dims[d].clone()),
                        Some(Some(Value::Int(b))) => Some(b),
                        _ => None,
                    };
                    // Python's bounds: a negative constant counts from the end,
                    // constant bounds clamp to the dim.
                    let full = dims[d].clone();
                    let bound = |x: Option<Dim>| {
                        x.filter(|x| self.runtime_symbol(x).is_none())
                            .map(|x| python_bound(&x, &full))
                    };
                    match (bound(a), bound(b)) {
                        (Some(a), Some(b))
                            if b.checked_sub(&a)
                                .is_some_and(|l| l.as_const().is_some_and(|n| n > 0)) =>
                        {
                            out.push(b.checked_sub(&a).unwrap_or_default());
                        }
                        _ => {
                            self.report(
                                Diagnostic::new(
                                    "E0405",
                                    *span,
                                    "a slice of a tile needs compile-time bounds that make it non-empty",
                                )
                                .with_help("slice a tile with constants (`t[0 : 8]`, `t[-4:]`); to pick run-time positions, load them from memory or select with `where(mask, a, b)`"),
                            );
                            return Val::err();
                        }
                    }
                    d += 1;
                }
            }
        }
        out.extend(dims[d..].iter().cloned());
        Val::of(Ty::tile(out, dtype))
    }

    fn attribute(&mut self, value: &Expr, attr: &Ident) -> Val {
        let v = self.expr(value);
        let name = attr.name.as_str();
        match (&v.ty, name) {
            (Ty::Err, _) => Val::err(),
            (Ty::Module(m), _) => match m.get(name) {
                Some(entry) => {
                    let entry = entry.clone();
                    self.entry_val(&entry)
                }
                None => {
                    let mut d = Diagnostic::new(
                        "E0203",
                        attr.span,
                        format!("`{name}` is not defined in module `{}`", describe(value)),
                    );
                    d = d.with_help(super::scope::names_help(name, m.names()));
                    self.report(d);
                    Val::err()
                }
            },
            (Ty::Tensor { .. }, "T") if self.in_kernel => {
                self.operand(&v, value);
                Val::err()
            }
            (Ty::Tile { dims, dtype } | Ty::Tensor { dims, dtype }, "T") => {
                if dims.len() != 2 {
                    self.report(
                        Diagnostic::new(
                            "E0411",
                            attr.span,
                            format!(
                                "`.T` transposes 2-D values; `{}` has rank {}",
                                v.ty,
                                dims.len()
                            ),
                        )
                        .with_help("use `transpose(x, a, b)` for other ranks"),
                    );
                    return Val::err();
                }
                let t = vec![dims[1].clone(), dims[0].clone()];
                Val::of(if matches!(v.ty, Ty::Tile { .. }) {
                    Ty::tile(t, *dtype)
                } else {
                    Ty::Tensor {
                        dims: t,
                        dtype: *dtype,
                    }
                })
            }
            (Ty::Tile { dims, .. } | Ty::Tensor { dims, .. } | Ty::Ref { dims, .. }, "shape") => {
                Val::of(Ty::Shape(dims.clone()))
            }
            (Ty::Scalar { .. }, "shape") => Val::of(Ty::Shape(Vec::new())),
            (
                Ty::Tile { dtype, .. }
                | Ty::Tensor { dtype, .. }
                | Ty::Ref { dtype, .. }
                | Ty::Scalar { dtype, .. },
                "dtype",
            ) => Val::with(Ty::DTypeV, Some(Value::DType(*dtype))),
            (Ty::Tile { .. } | Ty::Tensor { .. } | Ty::Scalar { .. } | Ty::Ref { .. }, "to") => {
                Val::of(Ty::Callable(Callee::Method {
                    recv: Box::new(v.ty.clone()),
                    name: "to",
                }))
            }
            (other, _) => {
                let mut d = Diagnostic::new(
                    "E0303",
                    attr.span,
                    format!("no attribute `{name}` on {} `{other}`", other.kind_name()),
                );
                if builtins::is_builtin(name) {
                    // `x.reshape([3, 4])`, `x.sum()`: a builtin written as a method.
                    d = d.with_help(format!(
                        "`{name}` is a function, not a method: `{name}({}, ...)`",
                        describe(value)
                    ));
                } else if let Some(s) = suggest(name, VALUE_MEMBERS.iter().copied()) {
                    d = d.with_help(format!("did you mean `{s}`?"));
                } else {
                    d = d.with_help(match other {
                        Ty::Tile { .. }
                        | Ty::Tensor { .. }
                        | Ty::Scalar { .. }
                        | Ty::Ref { .. } => {
                            "the attributes are `.shape`, `.dtype`, `.T` and `.to(dtype)`"
                        }
                        _ => "only tensors, tiles, numbers and modules have attributes",
                    });
                }
                self.report(d);
                Val::err()
            }
        }
    }
}

/// The attributes and methods of tiles, tensors and scalars (`x.T`,
/// `x.shape`, `x.dtype`, `x.to(...)`), for suggestions and completion.
pub const VALUE_MEMBERS: &[&str] = &["T", "dtype", "shape", "to"];

/// A slice bound as Python reads it on an axis of size `full`: a negative
/// constant counts from the end, and constants clamp to `[0, full]` when `full`
/// is a constant too.
pub fn python_bound(b: &Dim, full: &Dim) -> Dim {
    match (b.as_const(), full.as_const()) {
        (Some(c), Some(n)) => Dim::constant(if c < 0 { (c + n).max(0) } else { c.min(n) }),
        (Some(c), None) if c < 0 => full.checked_add(b).unwrap_or_else(|| b.clone()),
        _ => b.clone(),
    }
}

/// E0316: a function, kernel, builtin or method used as a value. Functions are
/// not first-class (a kernel is compiled per call site and a session builtin
/// runs on the host), so only a call may name one.
fn not_a_value(c: &Callee, e: &Expr) -> Diagnostic {
    let what = match c {
        Callee::Builtin(n) => format!("the builtin `{n}`"),
        Callee::Function(sig) if sig.is_kernel => format!("the kernel `{}`", sig.name),
        Callee::Function(sig) => format!("the function `{}`", sig.name),
        Callee::Method { name, .. } => format!("the method `{name}`"),
    };
    Diagnostic::new(
        "E0316",
        e.span,
        format!("{what} is not a value; functions can only be called"),
    )
    .with_primary_label("used as a value")
    .with_help(format!(
        "call it: `{}(...)` (functions are not first-class values)",
        describe(e)
    ))
}
