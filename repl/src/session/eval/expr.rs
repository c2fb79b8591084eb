//! Expressions: names, session `const`s, operators and attributes on the
//! host, and which expressions the host evaluates without running anything.

use tessera::check::builtins::{self, Builtin, Builtin as B};
use tessera::check::DType;
use tessera::diag::{with_article, Diagnostic};
use tessera::exec::Value;
use tessera::syntax::ast::{Expr, ExprKind, Index, UnaryOp};
use tessera::syntax::span::Span;

use super::super::Session;
use super::num::*;
use super::*;

impl Session {
    pub(super) fn lookup(&self, name: &str, span: Span) -> R<Val> {
        if let Some(v) = self.vars.get(name) {
            return Ok(v.clone());
        }
        if let Some(d) = DType::from_name(name) {
            return Ok(Val::DType(d));
        }
        if builtins::is_builtin(name) {
            // Reached only where a value is expected: calls dispatch first.
            return Err(Diagnostic::new(
                "E0316",
                span,
                format!("the builtin `{name}` is not a value; functions can only be called"),
            )
            .with_primary_label("used as a value")
            .with_help(format!(
                "call it: `{name}(...)` (functions are not first-class values)"
            )));
        }
        let mut d = Diagnostic::new("E0201", span, format!("unknown name `{name}`"))
            .with_primary_label("unknown name")
            .with_help("define it first: `x = ...`, a `def`, or `from std... import ...`");
        let mut known = self.names();
        known.extend(builtins::names().map(String::from));
        let suggestion =
            tessera::check::suggest(name, known.iter().map(String::as_str)).map(str::to_string);
        if let Some(s) = suggestion {
            d = d.with_help(format!("did you mean `{s}`?"));
        }
        Err(d)
    }

    /// Whether the checker folds `e` to a constant: literals, session
    /// `const`s and operators on those (a variable is a run-time value).
    /// Iterative: operator chains may be long.
    pub(super) fn is_constant(&self, e: &Expr) -> bool {
        let mut todo = vec![e];
        while let Some(e) = todo.pop() {
            match &e.kind {
                ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) => {}
                ExprKind::Name(id)
                    if !self.vars.contains_key(&id.name)
                        && self.const_value(&id.name).is_some() => {}
                ExprKind::Unary { operand, .. } => todo.push(operand),
                ExprKind::Binary { lhs, rhs, .. } => {
                    todo.push(lhs);
                    todo.push(rhs);
                }
                _ => return false,
            }
        }
        true
    }

    /// The value of a session `const` (folded by the checker).
    fn const_value(&self, name: &str) -> Option<Val> {
        use tessera::check::Value as C;
        fn conv(v: C) -> Option<Val> {
            Some(match v {
                C::Int(d) => int(d.as_const()?),
                C::Float(x) => float(x),
                C::Bool(b) => boolean(b),
                C::Str(s) => Val::Str(s),
                C::DType(d) => Val::DType(d),
                C::Tuple(items) => Val::Run(Value::Tuple(
                    items
                        .into_iter()
                        .map(|x| conv(x).and_then(|v| v.to_value()))
                        .collect::<Option<Vec<_>>>()?,
                )),
                C::None => Val::Run(Value::None),
            })
        }
        if !self.defs.iter().any(|d| d.names.iter().any(|n| n == name)) {
            return None;
        }
        tessera::db::module_consts(&self.db, self.file)
            .const_value(name)
            .and_then(conv)
    }

    /// Evaluates an expression of the item `text`.
    pub(crate) fn eval(&mut self, e: &Expr, text: &str) -> R<Val> {
        self.check_interrupt(e.span)?;
        match &e.kind {
            ExprKind::Int(i) => Ok(int(*i)),
            ExprKind::Float(x) => Ok(float(*x)),
            ExprKind::Bool(b) => Ok(boolean(*b)),
            ExprKind::Str(s) => Ok(Val::Str(s.clone())),
            ExprKind::None => Ok(Val::Run(Value::None)),
            ExprKind::Name(id) => {
                if self.vars.contains_key(&id.name) || DType::from_name(&id.name).is_some() {
                    return self.lookup(&id.name, e.span);
                }
                if let Some(v) = self.const_value(&id.name) {
                    return Ok(v);
                }
                if self.defs.iter().any(|d| d.names.contains(&id.name)) {
                    return self.synth_eval(e, text);
                }
                self.lookup(&id.name, e.span)
            }
            ExprKind::Tuple(items) => {
                let mut vals = Vec::new();
                for x in items {
                    let v = self.eval(x, text)?;
                    vals.push(v.to_value().ok_or_else(|| {
                        wrong_kind(
                            x.span,
                            format!("a tuple cannot hold a {}", v.describe()),
                            "a tuple holds numbers, tensors, bools or tuples",
                        )
                    })?);
                }
                Ok(Val::Run(Value::Tuple(vals)))
            }
            ExprKind::List(items) => {
                let mut vals = Vec::new();
                for x in items {
                    vals.push(self.eval(x, text)?);
                }
                Ok(Val::List(vals))
            }
            ExprKind::IfElse {
                cond,
                then,
                otherwise,
            } => {
                if self.truth(cond, text)? {
                    self.eval(then, text)
                } else {
                    self.eval(otherwise, text)
                }
            }
            ExprKind::Unary { op, operand } if self.is_host_scalar(operand) => {
                let v = self.eval(operand, text)?;
                let n = num(&v).ok_or_else(|| {
                    wrong_kind(
                        operand.span,
                        format!("cannot apply a unary operator to {}", v.describe()),
                        "`-x` and `~x` take a number, `not x` a bool",
                    )
                })?;
                // As the checker: `-` of a bool is E0311, `~` of a bool is `not`.
                if let Val::Run(Value::Bool(b)) = v {
                    match op {
                        UnaryOp::Neg | UnaryOp::Pos => {
                            return Err(Diagnostic::new(
                                "E0311",
                                e.span,
                                format!("`{}` is not defined on `bool` values", op.symbol()),
                            )
                            .with_primary_label("unsupported dtype for this operation")
                            .with_help("convert first, e.g. `.to(i32)`"))
                        }
                        UnaryOp::Not | UnaryOp::Invert => return Ok(boolean(!b)),
                    }
                }
                Ok(match (op, n) {
                    (UnaryOp::Neg, Num::I(i)) => int(-i),
                    (UnaryOp::Neg, Num::F(x)) => float(-x),
                    (UnaryOp::Pos, _) => v,
                    (UnaryOp::Not, n) => boolean(n.f() == 0.0),
                    (UnaryOp::Invert, Num::I(i)) => int(!i),
                    (UnaryOp::Invert, Num::F(_)) => {
                        return Err(Diagnostic::new(
                            "E0314",
                            e.span,
                            "`~` needs an integer or bool operand",
                        )
                        .with_help("`~` inverts integers and bools; for a float write `-x`"))
                    }
                })
            }
            ExprKind::Binary { op, lhs, rhs }
                if self.is_host_scalar(lhs) && self.is_host_scalar(rhs) =>
            {
                let a = self.eval(lhs, text)?;
                let b = self.eval(rhs, text)?;
                let is_bool = |v: &Val| matches!(v, Val::Run(Value::Bool(_)));
                // As the checker: bool with bool has no arithmetic; a bool
                // meeting a number counts as 0 or 1 (numpy's promotion).
                if is_bool(&a) && is_bool(&b) && bool_arith(*op) {
                    return Err(Diagnostic::new(
                        "E0311",
                        e.span,
                        format!("`{}` is not defined on `bool` values", op.symbol()),
                    )
                    .with_primary_label("unsupported dtype for this operation")
                    .with_help("convert first, e.g. `.to(i32)`, or use `&`, `|`, `~` for logic"));
                }
                // An integer operation the checker folds (literals and
                // consts) fails as it does in `tsrc check`: E0315, not the
                // run-time E0704/E0724 of a value only known when it runs.
                if let (Some(Num::I(x)), Some(Num::I(y))) = (num(&a), num(&b)) {
                    use tessera::check::Value as C;
                    if let Err(msg) =
                        tessera::check::consts::fold_binary(*op, &C::int(x), &C::int(y))
                    {
                        if self.is_constant(lhs) && self.is_constant(rhs) {
                            return Err(Diagnostic::new(
                                "E0315",
                                e.span,
                                format!("constant evaluation failed: {msg}"),
                            )
                            .with_help(tessera::check::consts::failure_help(&msg)));
                        }
                    }
                }
                match (num(&a), num(&b)) {
                    (Some(x), Some(y)) => arith(*op, x, y, e.span),
                    _ => self.synth_eval(e, text),
                }
            }
            ExprKind::Attribute { value, attr } if attr.name == "shape" || attr.name == "dtype" => {
                let v = self.eval(value, text)?;
                // A number is a rank-0 value, as the checker types it: no dims,
                // and the dtype the checker gives it.
                if matches!(
                    v,
                    Val::Run(Value::Int(_) | Value::Float(_) | Value::Bool(_))
                ) {
                    if attr.name == "shape" {
                        return Ok(Val::Run(Value::Tuple(Vec::new())));
                    }
                    // The checker types session numbers as weak literals: a
                    // weak int is i32, a weak float f32 (see `check::expr`).
                    let ty = self.static_type(value, text)?;
                    let d = match ty.as_str() {
                        "int" => Some(DType::I32),
                        "float" => Some(DType::F32),
                        other => DType::from_name(other),
                    };
                    if let Some(d) = d {
                        return Ok(Val::DType(d));
                    }
                }
                // A distributed tensor's shape is the whole tensor's.
                if let Val::Dist(d, _) = &v {
                    return Ok(if attr.name == "shape" {
                        Val::Run(Value::Tuple(
                            d.shape().iter().map(|n| Value::Int(*n as i64)).collect(),
                        ))
                    } else {
                        Val::DType(d.dtype())
                    });
                }
                let Some(t) = v.tensor() else {
                    return Err(Diagnostic::new(
                        "E0303",
                        attr.span,
                        format!(
                            "{} has no attribute `{}`",
                            with_article(&v.describe()),
                            attr.name
                        ),
                    )
                    .with_help("`.shape` and `.dtype` are attributes of tensors"));
                };
                Ok(if attr.name == "shape" {
                    Val::Run(Value::Tuple(
                        t.shape().iter().map(|d| Value::Int(*d as i64)).collect(),
                    ))
                } else {
                    Val::DType(t.dtype())
                })
            }
            ExprKind::Subscript { value, indices } if self.host_indices(indices) => {
                let v = self.eval(value, text)?;
                self.index(v, value.span, indices, text, e.span)
            }
            ExprKind::Call { func, args } => self.call(e, func, args, text),
            _ => self.synth_eval(e, text),
        }
    }

    /// Whether `e` is evaluated on the host to a scalar or other non-tensor value
    /// without running anything (names of scalar variables, literals, arithmetic
    /// of those, `.shape` of tensors...).
    pub(crate) fn is_host_scalar(&self, e: &Expr) -> bool {
        match &e.kind {
            ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) | ExprKind::None => true,
            ExprKind::Name(id) => match self.vars.get(&id.name) {
                // A rank-0 tensor (`s = sum(x)`) stays a tensor, as the checker
                // types it: arithmetic on it runs in its dtype and gives a tensor.
                Some(v) => v.tensor().is_none(),
                None => self.const_value(&id.name).is_some(),
            },
            ExprKind::Unary { operand, .. } => self.is_host_scalar(operand),
            ExprKind::Binary { lhs, rhs, .. } => {
                self.is_host_scalar(lhs) && self.is_host_scalar(rhs)
            }
            ExprKind::Subscript { value, indices } => {
                let all_ints = indices.iter().all(|i| {
                    matches!(i, Index::Expr(x) if !matches!(x.kind, ExprKind::None) && self.is_host_scalar(x))
                });
                // An element of a tensor (`x[0]`) is a rank-0 tensor, not a number.
                all_ints && self.is_host_scalar(value)
            }
            ExprKind::Attribute { value, attr } => {
                (attr.name == "shape" || attr.name == "dtype") && self.is_host_tensor(value)
            }
            ExprKind::Call { func, args } => {
                matches!(&func.kind, ExprKind::Name(id) if matches!(Builtin::from_name(&id.name), Some(B::Len | B::Cdiv)))
                    && args
                        .iter()
                        .all(|a| self.is_host_scalar(&a.value) || self.is_host_tensor(&a.value))
            }
            ExprKind::Tuple(items) => items.iter().all(|x| self.is_host_scalar(x)),
            _ => false,
        }
    }

    /// Whether `e` names a session tensor (or makes one on the host).
    fn is_host_tensor(&self, e: &Expr) -> bool {
        match &e.kind {
            ExprKind::Name(id) => self
                .vars
                .get(&id.name)
                .is_some_and(|v| v.tensor().is_some()),
            ExprKind::Call { func, .. } => matches!(&func.kind, ExprKind::Name(id)
                if matches!(Builtin::from_name(&id.name), Some(B::Randn | B::Zeros | B::Ones | B::Empty | B::Full | B::Arange | B::Tensor | B::LoadNpy))),
            ExprKind::Subscript { value, .. } => self.is_host_tensor(value),
            _ => false,
        }
    }

    /// Whether `e` indexes a host tensor with host integers only (`p[0]`,
    /// `p[i, j]`): an element when every axis is indexed.
    fn is_host_element(&self, e: &Expr) -> bool {
        match &e.kind {
            ExprKind::Subscript { value, indices } => {
                self.is_host_tensor(value)
                    && indices
                        .iter()
                        .all(|i| matches!(i, Index::Expr(x) if self.is_host_scalar(x)))
            }
            _ => false,
        }
    }

    /// Whether every index is a host integer, a slice of host integers or `None`
    /// (then the host indexes the tensor, whatever computes it).
    pub(crate) fn host_indices(&self, indices: &[Index]) -> bool {
        let part = |p: &Option<Expr>| p.as_ref().is_none_or(|x| self.is_host_scalar(x));
        indices.iter().all(|i| match i {
            // An element of a host tensor (`x[p[0]]`) is read on the host too,
            // as the checker types a top-level rank-0 index tensor: a scalar.
            Index::Expr(x) => self.is_host_scalar(x) || self.is_host_element(x),
            Index::Slice {
                start, end, step, ..
            } => part(start) && part(end) && part(step),
        })
    }
}
