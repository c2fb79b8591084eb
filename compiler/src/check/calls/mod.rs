//! Calls: builtins (with their typing rules), user functions and kernel
//! launches (argument binding, dim unification, const arguments, grids), and
//! `.to()` casts.

use std::collections::HashMap;
use std::sync::Arc;

use super::builtins::{self, Builtin, Builtin as B, Ctx};
use super::consts::fold_call;
use super::ctx::{Checker, Val};
use super::dims::Dim;
use super::expr::{broadcast, describe, Kind};
use super::scope::FnSig;
use super::suggest;
use super::types::{render_dims, Callee, DType, Ty, Value};
use crate::diag::Diagnostic;
use crate::syntax::ast::{Arg, Expr, ExprKind, Ident, Index};
use crate::syntax::span::Span;

mod builtin;
mod linalg;
mod memory;
mod user;

/// A checked call argument.
pub struct ArgV<'e> {
    pub name: Option<&'e Ident>,
    pub val: Val,
    pub expr: &'e Expr,
    pub span: Span,
}

fn make(kind: Kind, dims: Vec<Dim>, dtype: DType, weak: bool) -> Ty {
    match kind {
        Kind::Scalar => Ty::Scalar { dtype, weak },
        Kind::Tile => Ty::tile(dims, dtype),
        Kind::Tensor => Ty::Tensor { dims, dtype },
    }
}

pub(crate) fn certainly_differ(a: &Dim, b: &Dim) -> bool {
    a.checked_sub(b)
        .and_then(|d| d.as_const())
        .is_some_and(|c| c != 0)
}

fn tensor_only_help(b: Builtin) -> &'static str {
    match b {
        B::Matmul => "inside a kernel, multiply loaded tiles with `dot(a, b)`",
        B::Softmax => "inside a kernel, compute it from `exp`, `max` and `sum` on tiles",
        B::Empty | B::Ones | B::Randn | B::Tensor => "inside a kernel, make tiles with `zeros([..], dtype)` or `full([..], value, dtype)`",
        B::Transpose => "inside a kernel, transpose a 2-D tile with `.T`",
        B::Relu => "inside a kernel, use `maximum(t, 0.0)`",
        _ => "call it from a whole-tensor function (a plain `def`), or spell it out with tile operations",
    }
}

impl Checker<'_> {
    pub fn call(&mut self, e: &Expr, func: &Expr, args: &[Arg]) -> Val {
        let mut grid = None;
        let fval = match &func.kind {
            ExprKind::Subscript { value, indices } => {
                self.callee = true;
                let v = self.expr(value);
                match &v.ty {
                    Ty::Callable(Callee::Function(sig)) if sig.is_kernel => {
                        grid = Some(self.launch_grid(indices, func.span));
                        v
                    }
                    _ => {
                        let r = self.subscript(v, value, indices);
                        self.record(func.span, &r.ty);
                        r
                    }
                }
            }
            _ => {
                self.callee = true;
                self.expr(func)
            }
        };
        let argv: Vec<ArgV> = args
            .iter()
            .map(|a| ArgV {
                name: a.name.as_ref(),
                val: self.expr(&a.value),
                expr: &a.value,
                span: a.span,
            })
            .collect();
        match &fval.ty {
            Ty::Callable(Callee::Builtin(b)) => self.builtin(*b, &argv, e.span),
            Ty::Callable(Callee::Function(sig)) => {
                let sig = sig.clone();
                self.call_fn(&sig, grid, &argv, e.span, func)
            }
            Ty::Callable(Callee::Method { recv, .. }) => {
                let recv = (**recv).clone();
                self.cast(&recv, &argv, e.span, func)
            }
            Ty::Err => Val::err(),
            other => {
                self.report(
                    Diagnostic::new(
                        "E0309",
                        func.span,
                        format!(
                            "`{}` is a {} (`{other}`), not a function",
                            describe(func),
                            other.kind_name()
                        ),
                    )
                    .with_primary_label("called here")
                    .with_help(
                        format!("use `{}` without `(...)`, or rename it if it hides a function of the same name", describe(func)),
                    ),
                );
                Val::err()
            }
        }
    }

    /// Binds arguments to parameters by position and name (`dim=` is `axis=`).
    pub fn bind_args(
        &mut self,
        fname: &str,
        params: &[&str],
        required: &[bool],
        args: &[ArgV],
        span: Span,
    ) -> Option<Vec<Option<usize>>> {
        let mut slots: Vec<Option<usize>> = vec![None; params.len()];
        let mut ok = true;
        let mut pos = 0;
        for (i, a) in args.iter().enumerate() {
            match a.name {
                None => {
                    if pos < params.len() {
                        slots[pos] = Some(i);
                        pos += 1;
                    } else {
                        let positional = args.iter().filter(|a| a.name.is_none()).count();
                        self.report(
                            Diagnostic::new(
                                "E0304",
                                a.span,
                                format!(
                                    "`{fname}` takes at most {} argument{}, {positional} given",
                                    params.len(),
                                    if params.len() == 1 { "" } else { "s" }
                                ),
                            )
                            .with_primary_label("unexpected argument")
                            .with_help(format!("`{fname}` takes ({})", params.join(", "))),
                        );
                        ok = false;
                    }
                }
                Some(n) => {
                    let key = n.name.as_str();
                    let j = params.iter().position(|p| {
                        *p == key
                            || (key == "dim" && *p == "axis")
                            || (key == "axis" && *p == "dim")
                    });
                    match j {
                        Some(j) => {
                            if let Some(prev) = slots[j] {
                                self.report(
                                    Diagnostic::new(
                                        "E0206",
                                        a.span,
                                        format!("argument `{key}` of `{fname}` is given twice"),
                                    )
                                    .with_label(args[prev].span, "first given here")
                                    .with_help(format!(
                                        "give `{key}` once: remove this argument or the first one"
                                    )),
                                );
                                ok = false;
                            } else {
                                slots[j] = Some(i);
                            }
                        }
                        None => {
                            let mut d = Diagnostic::new(
                                "E0205",
                                n.span,
                                format!("`{fname}` has no parameter named `{key}`"),
                            );
                            if let Some(s) = suggest(key, params.iter().copied()) {
                                d = d.with_help(format!("did you mean `{s}`?"));
                            } else {
                                d = d.with_help(format!("`{fname}` takes ({})", params.join(", ")));
                            }
                            self.report(d);
                            ok = false;
                        }
                    }
                }
            }
        }
        let missing: Vec<&str> = params
            .iter()
            .zip(required)
            .zip(&slots)
            .filter(|((_, r), s)| **r && s.is_none())
            .map(|((p, _), _)| *p)
            .collect();
        if !missing.is_empty() && ok {
            self.report(
                Diagnostic::new(
                    "E0304",
                    span,
                    format!(
                        "`{fname}` is missing argument{} {}",
                        if missing.len() == 1 { "" } else { "s" },
                        missing
                            .iter()
                            .map(|m| format!("`{m}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
                .with_help(format!("`{fname}` takes ({})", params.join(", "))),
            );
            ok = false;
        }
        ok.then_some(slots)
    }

    fn const_int(&mut self, a: &ArgV, what: &str) -> Option<i64> {
        if a.val.ty.is_err() {
            return None;
        }
        match a.val.value.as_ref().and_then(Value::as_int) {
            Some(i) if matches!(a.val.value, Some(Value::Int(_))) => Some(i),
            _ => {
                self.report(
                    Diagnostic::new(
                        "E0310",
                        a.expr.span,
                        format!("{what} must be a compile-time integer"),
                    )
                    .with_help("use an integer literal, a module `const` or a `const` parameter"),
                );
                None
            }
        }
    }

    fn const_bool(&mut self, a: &ArgV, what: &str) -> Option<bool> {
        match &a.val.value {
            Some(Value::Bool(b)) => Some(*b),
            Some(Value::Int(d)) if d.as_const().is_some() => d.as_const().map(|i| i != 0),
            _ if a.val.ty.is_err() => None,
            _ => {
                self.report(
                    Diagnostic::new(
                        "E0310",
                        a.expr.span,
                        format!("{what} must be a compile-time `True` or `False`"),
                    )
                    .with_help("write `True` or `False`, or a `const` parameter"),
                );
                None
            }
        }
    }

    fn dtype_arg(&mut self, a: &ArgV) -> Option<DType> {
        match &a.val.value {
            Some(Value::DType(d)) => Some(*d),
            _ if a.val.ty.is_err() => None,
            _ => {
                let mut d = Diagnostic::new(
                    "E0302",
                    a.expr.span,
                    format!("expected a dtype (e.g. `f32`), found `{}`", a.val.ty),
                );
                d = match &a.val.value {
                    Some(Value::Str(s)) if DType::from_name(s).is_some() => {
                        d.with_help(format!("write the dtype without quotes: `{s}`"))
                    }
                    _ => d.with_help("write a dtype name, e.g. `f32`, `bf16` or `i32`"),
                };
                self.report(d);
                None
            }
        }
    }

    /// A shape argument (`[BM, BN]` or a single int). In kernels every dim must
    /// be known at compile time (E0406).
    fn shape_arg(&mut self, a: &ArgV) -> Option<Vec<Dim>> {
        let items: Vec<(Option<Value>, Span)> = match (&a.val.ty, &a.expr.kind) {
            (Ty::Err, _) => return None,
            (Ty::Tuple(_) | Ty::List(_), ExprKind::Tuple(es) | ExprKind::List(es)) => {
                let vals = match &a.val.value {
                    Some(Value::Tuple(v)) => v.iter().cloned().map(Some).collect(),
                    _ => vec![None; es.len()],
                };
                vals.into_iter().zip(es.iter().map(|e| e.span)).collect()
            }
            (Ty::Shape(dims), _) => return Some(dims.clone()),
            (Ty::Scalar { dtype, .. }, _) if dtype.is_int() => {
                vec![(a.val.value.clone(), a.expr.span)]
            }
            (other, _) => {
                self.report(
                    Diagnostic::new(
                        "E0302",
                        a.expr.span,
                        format!("expected a shape like `[BM, BN]`, found `{other}`"),
                    )
                    .with_help("write the dims as a list, e.g. `[BM, BN]` or `[128]`"),
                );
                return None;
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for (k, (v, span)) in items.into_iter().enumerate() {
            match v {
                Some(Value::Int(d)) => {
                    if self.in_kernel {
                        if let Some(sym) = self.runtime_symbol(&d) {
                            self.report(
                                Diagnostic::new("E0406", span, format!("tile dim `{d}` is not known at compile time: `{sym}` is a run-time value; it would need to be a `const` or a tensor dim the kernel is specialised on"))
                                    .with_help(format!("make `{sym}` a `const` parameter (e.g. `{sym}: const = 64`), or use a tensor dim the kernel is specialised on")),
                            );
                            return None;
                        }
                    }
                    if d.as_const().is_some_and(|n| n < 0)
                        && !(self.allow_infer_dim && d.as_const() == Some(-1))
                    {
                        self.report(
                            Diagnostic::new(
                                "E0406",
                                span,
                                format!("a dim cannot be negative ({d})"),
                            )
                            .with_help("a dim is a size: write 0 or more"),
                        );
                        return None;
                    }
                    out.push(d);
                }
                _ => {
                    let elem = match &a.val.ty {
                        Ty::Tuple(t) | Ty::List(t) => t.get(k).cloned().unwrap_or(Ty::Err),
                        t => t.clone(),
                    };
                    if elem.is_err() {
                        return None;
                    }
                    let ty_ok = matches!(elem, Ty::Scalar { dtype, .. } if dtype.is_int());
                    if self.in_kernel {
                        self.report(
                            Diagnostic::new("E0406", span, "this tile dim is not known at compile time")
                                .with_help("tile dims are integers, `const`s, or tensor dims the kernel is specialised on"),
                        );
                    } else if !ty_ok {
                        self.report(
                            Diagnostic::new("E0302", span, "a dim must be an integer")
                                .with_help("write an integer size, e.g. `[4, N]`"),
                        );
                    } else {
                        out.push(Dim::symbol("?"));
                        continue;
                    }
                    return None;
                }
            }
        }
        Some(out)
    }

    fn norm_axis(&mut self, axis: i64, rank: usize, ty: &Ty, span: Span) -> Option<usize> {
        let r = rank as i64;
        if axis >= r || axis < -r {
            let range = if rank == 0 {
                "none (it is a scalar)".to_string()
            } else {
                format!("{} to {}", -r, r - 1)
            };
            self.report(
                Diagnostic::new(
                    "E0404",
                    span,
                    format!("axis {axis} is out of range for `{ty}` (rank {rank})"),
                )
                .with_help(format!("valid axes are {range}")),
            );
            return None;
        }
        Some(if axis < 0 {
            (axis + r) as usize
        } else {
            axis as usize
        })
    }

    fn array(&mut self, a: &ArgV) -> Option<(Kind, Vec<Dim>, DType)> {
        let (k, dims) = self.operand(&a.val, a.expr)?;
        Some((k, dims, a.val.ty.dtype()?))
    }

    /// `l` and `r` combined elementwise: shape, dtype, weakness.
    fn elementwise(
        &mut self,
        what: &str,
        l: &ArgV,
        r: &ArgV,
        span: Span,
    ) -> Option<(Kind, Vec<Dim>, DType, bool)> {
        let (lk, ld) = self.operand(&l.val, l.expr)?;
        let (rk, rd) = self.operand(&r.val, r.expr)?;
        let Some(dims) = broadcast(&ld, &rd) else {
            self.report(
                Diagnostic::new("E0402", span, format!("shapes {} and {} do not broadcast in {what}", render_dims(&ld), render_dims(&rd)))
                    .with_label(l.span, format!("this is `{}`", l.val.ty))
                    .with_label(r.span, format!("this is `{}`", r.val.ty))
                    .with_help("broadcasting matches dims from the right; each pair must be equal or 1 (add an axis with `[:, None]`)"),
            );
            return None;
        };
        let (dt, weak) = self.promote(&l.val.ty, &r.val.ty, lk, rk, what, span, l.expr, r.expr)?;
        Some((lk.max(rk), dims, dt, weak))
    }
}

/// E0324: a known integer that is not a value of the integer dtype it becomes.
pub fn out_of_range(i: i64, dt: DType, span: Span) -> Diagnostic {
    Diagnostic::new(
        "E0324",
        span,
        format!("the integer {i} is out of range for `{dt}`"),
    )
    .with_primary_label(format!("this becomes `{dt}`"))
    .with_help("use a wider dtype, or convert the other operand first, e.g. `.to(i64)`")
}
