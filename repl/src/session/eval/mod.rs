//! Statements and expressions run on the host: scalars, creation builtins,
//! indexing, `.shape`/`.dtype`/`.to()`, kernel launches, calls of `print`,
//! `load_npy`/`save_npy`, and `if`/`for`/`while` on host values. Anything else
//! that computes on tensors is compiled as a synthetic whole-tensor function
//! (see `synth`) and run by the executor.

use std::fmt;
use std::io::Write;

use tessera::check::builtins::{self, Builtin, Builtin as B};
use tessera::check::calls::out_of_range;
use tessera::check::scope::Entry;
use tessera::check::stmt::int_fits;
use tessera::check::DType;
use tessera::diag::{with_article, Diagnostic};
use tessera::exec::{self, IndexItem, Tensor, Value};
use tessera::syntax::ast::{Arg, BinOp, Expr, ExprKind, Index, Stmt, StmtKind, UnaryOp};
use tessera::syntax::span::Span;

use super::Session;

/// A session value: what the executor computes, plus host-only values.
#[derive(Clone, Debug)]
pub enum Val {
    Run(Value),
    Str(String),
    DType(DType),
    List(Vec<Val>),
}

impl Val {
    fn tensor(&self) -> Option<&Tensor> {
        match self {
            Val::Run(Value::Tensor(t)) => Some(t),
            _ => None,
        }
    }

    /// A short description for messages (`tensor[4, 8] f32`, `int`).
    pub fn describe(&self) -> String {
        match self {
            Val::Run(v) => v.describe(),
            Val::Str(_) => "str".into(),
            Val::DType(_) => "dtype".into(),
            Val::List(v) => format!("list of {}", v.len()),
        }
    }

    /// The value as the executor takes it (lists become tuples).
    fn to_value(&self) -> Option<Value> {
        match self {
            Val::Run(v) => Some(v.clone()),
            Val::List(items) => items
                .iter()
                .map(Val::to_value)
                .collect::<Option<Vec<_>>>()
                .map(Value::Tuple),
            Val::Str(_) | Val::DType(_) => None,
        }
    }
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Run(v) => write!(f, "{v}"),
            Val::Str(s) => write!(f, "{s}"),
            Val::DType(d) => write!(f, "{d}"),
            Val::List(items) => {
                f.write_str("[")?;
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    match x {
                        Val::Str(s) => write!(f, "{s:?}")?,
                        _ => write!(f, "{x}")?,
                    }
                }
                f.write_str("]")
            }
        }
    }
}

/// How a block ended.
pub(crate) enum Flow {
    Normal,
    Break,
    Continue,
}

type R<T> = Result<T, Diagnostic>;

/// A host scalar, for arithmetic.
#[derive(Clone, Copy, Debug)]
enum Num {
    I(i64),
    F(f64),
}

fn num(v: &Val) -> Option<Num> {
    match v {
        Val::Run(Value::Int(i)) => Some(Num::I(*i)),
        Val::Run(Value::Bool(b)) => Some(Num::I(*b as i64)),
        Val::Run(Value::Float(x)) => Some(Num::F(*x)),
        _ => None,
    }
}

impl Num {
    fn f(self) -> f64 {
        match self {
            Num::I(i) => i as f64,
            Num::F(x) => x,
        }
    }
}

/// A number, or the element of a rank-0 tensor as a number of its kind.
fn element(v: &Val) -> Option<Num> {
    match v {
        Val::Run(Value::Tensor(t)) if t.shape().is_empty() => Some(match t.int_at(0) {
            Some(i) => Num::I(i),
            None => Num::F(t.to_f64_vec()[0]),
        }),
        _ => num(v),
    }
}

fn int(i: i64) -> Val {
    Val::Run(Value::Int(i))
}

fn float(x: f64) -> Val {
    Val::Run(Value::Float(x))
}

fn boolean(b: bool) -> Val {
    Val::Run(Value::Bool(b))
}

/// An unsupported session construct (E0720).
pub(crate) fn unsupported(span: Span, what: impl Into<String>, help: &str) -> Diagnostic {
    Diagnostic::new("E0720", span, what.into()).with_help(help.to_string())
}

/// A value of the wrong kind (E0302), with a help line that shows the kind
/// expected.
fn wrong_kind(span: Span, message: impl Into<String>, help: &str) -> Diagnostic {
    Diagnostic::new("E0302", span, message.into()).with_help(help.to_string())
}

impl Session {
    /// Runs one top-level statement; `text` is its item's text (spans are relative to it).
    pub(crate) fn run_statement(
        &mut self,
        s: &Stmt,
        text: &str,
        print_values: bool,
        out: &mut dyn Write,
    ) -> R<()> {
        self.interrupt.reset();
        self.stmt(s, text, print_values, out).map(|_| ())
    }

    fn block(&mut self, body: &[Stmt], text: &str, out: &mut dyn Write) -> R<Flow> {
        for s in body {
            match self.stmt(s, text, false, out)? {
                Flow::Normal => {}
                flow => return Ok(flow),
            }
        }
        Ok(Flow::Normal)
    }

    fn check_interrupt(&self, span: Span) -> R<()> {
        self.interrupt.check().map_err(|e| e.to_diagnostic(span))
    }

    fn stmt(&mut self, s: &Stmt, text: &str, print_value: bool, out: &mut dyn Write) -> R<Flow> {
        let result = self.stmt_inner(s, text, print_value, out);
        // `print` output, in order, also when the statement failed after it.
        // Each entry carries its own terminator (`print`'s `end=`).
        for text in std::mem::take(&mut self.pending_print) {
            let _ = write!(out, "{text}");
        }
        let _ = out.flush();
        result
    }

    fn stmt_inner(
        &mut self,
        s: &Stmt,
        text: &str,
        print_value: bool,
        out: &mut dyn Write,
    ) -> R<Flow> {
        match &s.kind {
            StmtKind::Expr(e) => {
                let v = self.eval(e, text)?;
                if print_value && !matches!(v, Val::Run(Value::None)) {
                    self.pending_print.push(format!("{v}\n"));
                }
            }
            StmtKind::Assign { target, value, .. } => {
                let v = self.eval(value, text)?;
                self.assign(target, v, text)?;
            }
            StmtKind::AugAssign { target, op, value } => {
                if let ExprKind::Subscript {
                    value: base,
                    indices,
                } = &target.kind
                {
                    // `t[idx] op= v`: read the part, compute, write it back.
                    let lhs = self.eval(target, text)?;
                    let rhs = self.eval(value, text)?;
                    // One element (`t[i] += 1`): computed on the host.
                    let v = match (element(&lhs), element(&rhs)) {
                        (Some(a), Some(b)) => arith(*op, a, b, s.span)?,
                        _ => self.synth_binary(
                            *op,
                            (&lhs, target.span),
                            (&rhs, value.span),
                            s.span,
                            text,
                        )?,
                    };
                    self.assign_part(target, base, indices, v, text)?;
                    return Ok(Flow::Normal);
                }
                let ExprKind::Name(id) = &target.kind else {
                    return Err(unsupported(
                        target.span,
                        "only a variable or part of a tensor can be updated with `op=` in a session",
                        "write `x = x + y` or `t[i] += y`",
                    ));
                };
                let lhs = self.lookup(&id.name, target.span)?;
                let rhs = self.eval(value, text)?;
                let v = match (num(&lhs), num(&rhs)) {
                    (Some(a), Some(b)) => arith(*op, a, b, s.span)?,
                    _ => self.synth_binary(
                        *op,
                        (&lhs, target.span),
                        (&rhs, value.span),
                        s.span,
                        text,
                    )?,
                };
                self.vars.insert(id.name.clone(), v);
            }
            StmtKind::If { branches, orelse } => {
                for (cond, body) in branches {
                    if self.truth(cond, text)? {
                        return self.block(body, text, out);
                    }
                }
                if let Some(body) = orelse {
                    return self.block(body, text, out);
                }
            }
            StmtKind::For { target, iter, body } => {
                let (start, end, step) = self.range_of(iter, text)?;
                let mut i = start;
                while (step > 0 && i < end) || (step < 0 && i > end) {
                    self.check_interrupt(s.span)?;
                    self.vars.insert(target.name.clone(), int(i));
                    if let Flow::Break = self.block(body, text, out)? {
                        break;
                    }
                    i += step;
                }
            }
            StmtKind::While { cond, body } => loop {
                self.check_interrupt(s.span)?;
                if !self.truth(cond, text)? {
                    break;
                }
                if let Flow::Break = self.block(body, text, out)? {
                    break;
                }
            },
            StmtKind::Break => return Ok(Flow::Break),
            StmtKind::Continue => return Ok(Flow::Continue),
            StmtKind::Pass | StmtKind::Error => {}
            StmtKind::Return(_) => {
                return Err(unsupported(
                    s.span,
                    "`return` outside a function",
                    "define a function with `def` to return a value",
                ))
            }
        }
        Ok(Flow::Normal)
    }

    fn assign(&mut self, target: &Expr, v: Val, text: &str) -> R<()> {
        match &target.kind {
            ExprKind::Name(id) => {
                if self.defs.iter().any(|d| d.names.contains(&id.name)) {
                    return Err(unsupported(
                        target.span,
                        format!("`{}` is a definition of this session", id.name),
                        "choose another variable name (definitions and variables share one namespace)",
                    ));
                }
                self.vars.insert(id.name.clone(), v);
                Ok(())
            }
            ExprKind::Tuple(targets) | ExprKind::List(targets) => {
                let items: Vec<Val> =
                    match v {
                        Val::Run(Value::Tuple(items)) => items.into_iter().map(Val::Run).collect(),
                        Val::List(items) => items,
                        other => return Err(wrong_kind(
                            target.span,
                            format!(
                                "cannot unpack {} into {} names",
                                with_article(&other.describe()),
                                targets.len()
                            ),
                            "unpack a tuple or list with as many items as names: `a, b = (1, 2)`",
                        )),
                    };
                if items.len() != targets.len() {
                    return Err(Diagnostic::new(
                        "E0304",
                        target.span,
                        format!(
                            "{} values to unpack into {} names",
                            items.len(),
                            targets.len()
                        ),
                    )
                    .with_help("give as many names as there are values: `a, b = (1, 2)`"));
                }
                for (t, v) in targets.iter().zip(items) {
                    self.assign(t, v, text)?;
                }
                Ok(())
            }
            ExprKind::Subscript { value, indices } => {
                self.assign_part(target, value, indices, v, text)
            }
            _ => Err(unsupported(
                target.span,
                "only names, tuples of names and `t[...]` can be assigned in a session",
                "write `x = ...`, `a, b = ...` or `t[i] = ...`",
            )),
        }
    }

    /// `t[indices] = v` on a session tensor variable: copy-on-write, so other
    /// names that held `t`'s value keep the old elements.
    fn assign_part(
        &mut self,
        target: &Expr,
        base: &Expr,
        indices: &[Index],
        v: Val,
        text: &str,
    ) -> R<()> {
        let ExprKind::Name(id) = &base.kind else {
            return Err(unsupported(
                base.span,
                "only a tensor variable can be assigned into in a session",
                "index the variable with every position at once: `t[i, j] = x`, not `t[i][j] = x`",
            ));
        };
        let current = self.lookup(&id.name, base.span)?;
        if current.tensor().is_none() {
            return Err(wrong_kind(
                base.span,
                format!(
                    "`{}` is not a tensor (it holds {}); only a tensor can be assigned into",
                    id.name,
                    current.describe()
                ),
                "assign the whole variable instead: `x = ...`",
            ));
        }
        drop(current);
        let items = self.index_items(indices, text)?;
        let value = match v {
            Val::Run(x) => x,
            other => {
                return Err(wrong_kind(
                    target.span,
                    format!(
                        "cannot store {} in a tensor",
                        with_article(&other.describe())
                    ),
                    "store a number or a tensor: `t[0] = 1.0`",
                ))
            }
        };
        // Take the tensor out of the session while writing, so that its storage
        // counts only the other holders (copy-on-write copies only for them).
        let Some(Val::Run(Value::Tensor(mut t))) = self.vars.remove(&id.name) else {
            unreachable!("checked to be a tensor variable");
        };
        let result = t.set_index(&items, &value, &self.interrupt);
        self.vars
            .insert(id.name.clone(), Val::Run(Value::Tensor(t)));
        result.map_err(|e| e.to_diagnostic(target.span))
    }

    fn lookup(&self, name: &str, span: Span) -> R<Val> {
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
    fn is_constant(&self, e: &Expr) -> bool {
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

    fn truth(&mut self, cond: &Expr, text: &str) -> R<bool> {
        let v = self.eval(cond, text)?;
        match &v {
            Val::Run(Value::Bool(b)) => Ok(*b),
            Val::Run(Value::Int(i)) => Ok(*i != 0),
            Val::Run(Value::Float(x)) => Ok(*x != 0.0),
            Val::Run(Value::None) => Ok(false),
            Val::Run(Value::Tensor(t)) if t.numel() == 1 => Ok(t.to_f64_vec()[0] != 0.0),
            _ => Err(Diagnostic::new(
                "E0308",
                cond.span,
                format!("a condition must be a scalar, found {}", v.describe()),
            )
            .with_help("reduce the tensor first, e.g. `max(t) > 0`")),
        }
    }

    fn range_of(&mut self, iter: &Expr, text: &str) -> R<(i64, i64, i64)> {
        let ExprKind::Call { func, args } = &iter.kind else {
            return Err(unsupported(
                iter.span,
                "a session `for` loop iterates over `range(...)`",
                "write `for i in range(n):`",
            ));
        };
        if !matches!(&func.kind, ExprKind::Name(id) if id.name == "range") {
            return Err(unsupported(
                iter.span,
                "a session `for` loop iterates over `range(...)`",
                "write `for i in range(n):`",
            ));
        }
        let mut ints = Vec::new();
        for a in args {
            let v = self.eval(&a.value, text)?;
            match num(&v) {
                Some(Num::I(i)) => ints.push(i),
                _ => {
                    return Err(wrong_kind(
                        a.value.span,
                        format!("`range` takes integers, found {}", v.describe()),
                        "`range(0, 10, 2)`",
                    ))
                }
            }
        }
        match ints[..] {
            [end] => Ok((0, end, 1)),
            [start, end] => Ok((start, end, 1)),
            // As the checker, which folds the step: E0315.
            [_, _, 0] => Err(Diagnostic::new(
                "E0315",
                iter.span,
                "`range` step cannot be zero",
            )
            .with_help(
                "count up with a positive step or down with a negative one, e.g. `range(N - 1, -1, -1)`",
            )),
            [start, end, step] => Ok((start, end, step)),
            _ => Err(Diagnostic::new(
                "E0304",
                iter.span,
                format!("`range` takes 1 to 3 arguments, found {}", ints.len()),
            )
            .with_help("`range(stop)`, `range(start, stop)` or `range(start, stop, step)`")),
        }
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

    fn index(&mut self, v: Val, vspan: Span, indices: &[Index], text: &str, span: Span) -> R<Val> {
        let items = self.index_items(indices, text)?;
        match v {
            Val::Run(Value::Tensor(t)) => t
                .index(&items, &self.interrupt)
                .map(|t| Val::Run(Value::Tensor(t)))
                .map_err(|e| e.to_diagnostic(span)),
            Val::Run(Value::Tuple(vals)) => {
                let seq: Vec<Val> = vals.into_iter().map(Val::Run).collect();
                index_seq(seq, &items, span)
            }
            Val::List(seq) => index_seq(seq, &items, span),
            other => Err(wrong_kind(
                vspan,
                format!("{} cannot be indexed", with_article(&other.describe())),
                "index a tensor, a tuple or a list: `t[0]`",
            )),
        }
    }

    fn index_items(&mut self, indices: &[Index], text: &str) -> R<Vec<IndexItem>> {
        let mut items = Vec::new();
        for i in indices {
            items.push(match i {
                Index::Expr(x) if matches!(x.kind, ExprKind::None) => IndexItem::NewAxis,
                Index::Expr(x) => IndexItem::Int(self.index_int(x, text)?),
                Index::Slice {
                    start, end, step, ..
                } => {
                    let mut part = |p: &Option<Expr>| -> R<Option<i64>> {
                        match p {
                            Some(x) => self.int_arg(x, text, "a slice bound").map(Some),
                            None => Ok(None),
                        }
                    };
                    IndexItem::Slice {
                        start: part(start)?,
                        stop: part(end)?,
                        step: part(step)?,
                    }
                }
            });
        }
        Ok(items)
    }

    /// An integer index. An integer tensor of rank 1 or more would be a
    /// gather, which is E0512 as in the checker (a kernel does it).
    fn index_int(&mut self, x: &Expr, text: &str) -> R<i64> {
        let v = self.eval(x, text)?;
        if let Val::Run(Value::Tensor(t)) = &v {
            if !t.shape().is_empty() && !t.dtype().is_float() && t.dtype() != DType::Bool {
                return Err(Diagnostic::new(
                    "E0512",
                    x.span,
                    "indexing a tensor with an integer tensor (a gather) is not supported in whole-tensor code yet",
                )
                .with_help("gather in a `@kernel` with `load(x[idx])` and launch it from the function"));
            }
        }
        self.int_value(v, x.span, "an index")
    }

    fn int_arg(&mut self, x: &Expr, text: &str, what: &str) -> R<i64> {
        let v = self.eval(x, text)?;
        self.int_value(v, x.span, what)
    }

    fn int_value(&self, v: Val, span: Span, what: &str) -> R<i64> {
        match v {
            Val::Run(Value::Int(i)) => Ok(i),
            Val::Run(Value::Tensor(ref t))
                if t.shape().is_empty() && !t.dtype().is_float() && t.dtype() != DType::Bool =>
            {
                Ok(t.int_at(0).expect("an integer tensor"))
            }
            other => Err(wrong_kind(
                span,
                format!("{what} must be an integer, found {}", other.describe()),
                "write an integer (a literal, a dim or an integer variable)",
            )),
        }
    }

    fn call(&mut self, e: &Expr, func: &Expr, args: &[Arg], text: &str) -> R<Val> {
        // `k[grid](...)`: a launch with an explicit grid.
        if let ExprKind::Subscript { value, indices } = &func.kind {
            if let ExprKind::Name(id) = &value.kind {
                if let Some(kernel) = self.kernel_named(&id.name) {
                    let mut grid = Vec::new();
                    for i in indices {
                        let Index::Expr(x) = i else {
                            return Err(wrong_kind(
                                i.span(),
                                "a grid is a tuple of integers",
                                "launch as `k[(cdiv(N, 128),)](...)`",
                            ));
                        };
                        match self.eval(x, text)? {
                            Val::Run(Value::Int(n)) => grid.push(n),
                            Val::Run(Value::Tuple(vs)) => {
                                for v in vs {
                                    match v {
                                        Value::Int(n) => grid.push(n),
                                        other => {
                                            return Err(wrong_kind(
                                                x.span,
                                                format!(
                                                    "a grid dim must be an integer, found {}",
                                                    other.describe()
                                                ),
                                                "launch as `k[(cdiv(N, 128),)](...)`",
                                            ))
                                        }
                                    }
                                }
                            }
                            other => {
                                return Err(wrong_kind(
                                    x.span,
                                    format!(
                                        "a grid is a tuple of integers, found {}",
                                        other.describe()
                                    ),
                                    "launch as `k[(cdiv(N, 128),)](...)`",
                                ))
                            }
                        }
                    }
                    return self.launch(&kernel, Some(grid), args, text, e.span);
                }
            }
        }
        if let ExprKind::Attribute { value, attr } = &func.kind {
            if attr.name == "to" {
                let v = self.eval(value, text)?;
                if let Some(n) = num(&v) {
                    let [a] = args else {
                        return Err(Diagnostic::new("E0304", e.span, "`.to` takes one dtype")
                            .with_help("e.g. `x.to(f32)`"));
                    };
                    let d = self.dtype_arg(&a.value, text)?;
                    return Ok(cast_scalar(n, d));
                }
                let Some(t) = v.tensor().cloned() else {
                    return Err(wrong_kind(
                        value.span,
                        format!("`.to` converts a tensor, not a {}", v.describe()),
                        "`x.to(f16)` converts a tensor `x`",
                    ));
                };
                let [a] = args else {
                    return Err(Diagnostic::new("E0304", e.span, "`.to` takes one dtype")
                        .with_help("e.g. `x.to(f32)`"));
                };
                let d = self.dtype_arg(&a.value, text)?;
                return t
                    .try_to(d, &self.interrupt)
                    .map(|t| Val::Run(Value::Tensor(t)))
                    .map_err(|err| err.to_diagnostic(e.span));
            }
            return self.synth_eval(e, text);
        }
        let ExprKind::Name(id) = &func.kind else {
            return self.synth_eval(e, text);
        };
        let name = id.name.as_str();
        if self.vars.contains_key(name) {
            return Err(Diagnostic::new(
                "E0309",
                func.span,
                format!(
                    "`{name}` is {}, not a function",
                    with_article(&self.vars[name].describe())
                ),
            )
            .with_help(
                format!("use `{name}` without `(...)`, or rename it if it hides a function of the same name"),
            ));
        }
        if let Some(kernel) = self.kernel_named(name) {
            return self.launch(&kernel, None, args, text, e.span);
        }
        let user_defined = self.defs.iter().any(|d| d.names.iter().any(|n| n == name));
        match Builtin::from_name(name) {
            Some(id) if !user_defined => self.host_builtin(id, e, args, text),
            _ => self.synth_eval(e, text),
        }
    }

    /// The kernel `name` launches in the session: one defined in it, or one
    /// imported into it (`from std.linalg import gemm_tf32 as mm` launches
    /// `gemm_tf32`).
    fn kernel_named(&self, name: &str) -> Option<String> {
        match tessera::db::module_scope(&self.db, self.file).get(name) {
            Some(Entry::Function(sig)) if sig.is_kernel => Some(sig.name.clone()),
            _ => None,
        }
    }

    fn launch(
        &mut self,
        name: &str,
        grid: Option<Vec<i64>>,
        args: &[Arg],
        text: &str,
        span: Span,
    ) -> R<Val> {
        let mut positional = Vec::new();
        let mut named = Vec::new();
        for a in args {
            let v = self.eval(&a.value, text)?;
            // A dtype or a string, also inside a list, is no run-time value.
            let Some(v) = v.to_value() else {
                return Err(wrong_kind(
                    a.value.span,
                    format!(
                        "a kernel argument cannot be {}",
                        with_article(&v.describe())
                    ),
                    "pass tensors, numbers or bools",
                ));
            };
            match &a.name {
                Some(n) => named.push((n.name.clone(), v)),
                None => positional.push(v),
            }
        }
        exec::launch_kernel(
            &self.db,
            self.file,
            name,
            grid,
            &positional,
            &named,
            &self.exec_device,
            &self.interrupt,
        )
        .map_err(|e| {
            let extra = e.arg.and_then(|i| {
                let mut positional = args.iter().filter(|a| a.name.is_none());
                let first = positional.nth(i)?.value.span;
                // the first argument too many to the last
                Some(
                    positional
                        .next_back()
                        .map_or(first, |l| first.to(l.value.span)),
                )
            });
            let at = e
                .param
                .as_deref()
                .and_then(|p| self.argument_span(name, p, args))
                .or(extra)
                .unwrap_or(span);
            e.to_diagnostic(at)
        })?;
        if let Ok(spec) =
            exec::launch_specialization(&self.db, self.file, name, &positional, &named)
        {
            self.last_launch.insert(name.to_string(), spec);
        }
        Ok(Val::Run(Value::None))
    }

    /// The span of the argument that kernel `kernel`'s parameter `param` got:
    /// the keyword argument of that name, else the positional one in its place.
    fn argument_span(&self, kernel: &str, param: &str, args: &[Arg]) -> Option<Span> {
        if let Some(a) = args
            .iter()
            .find(|a| a.name.as_ref().is_some_and(|n| n.name == param))
        {
            return Some(a.value.span);
        }
        let sig = match tessera::db::module_scope(&self.db, self.file).get(kernel) {
            Some(Entry::Function(sig)) => sig.clone(),
            _ => return None,
        };
        let index = sig.params.iter().position(|p| p.name == param)?;
        args.iter()
            .filter(|a| a.name.is_none())
            .nth(index)
            .map(|a| a.value.span)
    }

    fn dtype_arg(&mut self, x: &Expr, text: &str) -> R<DType> {
        match self.eval(x, text)? {
            Val::DType(d) => Ok(d),
            other => Err(wrong_kind(
                x.span,
                format!(
                    "expected a dtype (`f32`, `f16`, ...), found {}",
                    other.describe()
                ),
                "name a dtype: `f32`, `f16`, `bf16`, `i32`, ...",
            )),
        }
    }

    fn shape_arg(&mut self, x: &Expr, text: &str) -> R<Vec<usize>> {
        let v = self.eval(x, text)?;
        let items: Vec<Val> = match v {
            Val::List(items) => items,
            Val::Run(Value::Tuple(items)) => items.into_iter().map(Val::Run).collect(),
            Val::Run(Value::Int(n)) => vec![int(n)],
            other => {
                return Err(wrong_kind(
                    x.span,
                    format!("a shape is a list of integers, found {}", other.describe()),
                    "`zeros([4, 8], f32)`",
                ))
            }
        };
        items
            .iter()
            .map(|v| match v {
                Val::Run(Value::Int(n)) if *n >= 0 => Ok(*n as usize),
                other => Err(wrong_kind(
                    x.span,
                    format!("a shape holds sizes ≥ 0, found {other}"),
                    "`zeros([4, 8], f32)`",
                )),
            })
            .collect()
    }

    /// Binds `args` to the parameter names `params` (the first `required` are
    /// required).
    fn bind<'a>(
        name: &str,
        params: &[&str],
        required: usize,
        args: &'a [Arg],
        span: Span,
    ) -> R<Vec<Option<&'a Expr>>> {
        let mut bound: Vec<Option<&Expr>> = vec![None; params.len()];
        let mut next = 0;
        for a in args {
            let i = match &a.name {
                Some(n) => params.iter().position(|p| *p == n.name).ok_or_else(|| {
                    Diagnostic::new(
                        "E0205",
                        n.span,
                        format!("`{name}` has no parameter `{}`", n.name),
                    )
                    .with_help(format!("its parameters: {}", params.join(", ")))
                })?,
                None => {
                    let i = next;
                    next += 1;
                    i
                }
            };
            if i >= params.len() {
                return Err(Diagnostic::new(
                    "E0304",
                    span,
                    format!("`{name}` takes at most {} arguments", params.len()),
                )
                .with_help(format!("`{name}` takes ({})", params.join(", "))));
            }
            if bound[i].is_some() {
                return Err(Diagnostic::new(
                    "E0206",
                    a.span,
                    format!("`{}` is given twice", params[i]),
                )
                .with_help(format!(
                    "give `{}` once: remove this argument or the first one",
                    params[i]
                )));
            }
            bound[i] = Some(&a.value);
        }
        if let Some(missing) = (0..required).find(|i| bound[*i].is_none()) {
            return Err(Diagnostic::new(
                "E0304",
                span,
                format!("`{name}` needs `{}`", params[missing]),
            )
            .with_help(format!("`{name}({})`", params.join(", "))));
        }
        Ok(bound)
    }

    /// A builtin call in a top-level statement: the host evaluates the session
    /// builtins and tensor creation itself, the rest go through a synthetic
    /// function.
    fn host_builtin(&mut self, id: Builtin, e: &Expr, args: &[Arg], text: &str) -> R<Val> {
        let name = id.name();
        // Creation fails without ending the session: a size that overflows
        // (E0712) or memory that cannot be had (E0713).
        let tensor = |t: Result<Tensor, exec::ExecError>| {
            t.map(|t| Val::Run(Value::Tensor(t)))
                .map_err(|err| err.to_diagnostic(e.span))
        };
        match id {
            B::Print => {
                let (mut parts, mut sep, mut end) = (Vec::new(), " ".to_string(), "\n".to_string());
                for a in args {
                    match a.name.as_ref().map(|n| n.name.as_str()) {
                        None => parts.push(self.eval(&a.value, text)?.to_string()),
                        Some(k @ ("sep" | "end")) => {
                            let v = match self.eval(&a.value, text)? {
                                Val::Str(v) => v,
                                other => {
                                    return Err(wrong_kind(
                                        a.value.span,
                                        format!(
                                            "`print`'s separators are strings, found {}",
                                            other.describe()
                                        ),
                                        "`print(x, y, sep=\", \", end=\"\\n\")`",
                                    ))
                                }
                            };
                            if k == "sep" {
                                sep = v;
                            } else {
                                end = v;
                            }
                        }
                        Some(other) => {
                            return Err(Diagnostic::new(
                                "E0205",
                                a.span,
                                format!("`print` has no keyword argument `{other}`"),
                            )
                            .with_primary_label("unknown keyword argument")
                            .with_help("`print(a, b, ..., sep=\" \", end=\"\\n\")`"))
                        }
                    }
                }
                self.pending_print.push(parts.join(&sep) + &end);
                Ok(Val::Run(Value::None))
            }
            B::Range => Err(unsupported(
                e.span,
                "`range` is only used by `for` loops in a session",
                "write `for i in range(n):`",
            )),
            B::Zeros | B::Ones | B::Empty | B::Randn => {
                let params: &[&str] = if id == B::Randn {
                    &["shape", "dtype", "seed"]
                } else {
                    &["shape", "dtype"]
                };
                let b = Self::bind(name, params, 1, args, e.span)?;
                let shape = self.shape_arg(b[0].expect("required"), text)?;
                let dtype = match b[1] {
                    Some(x) => self.dtype_arg(x, text)?,
                    None => DType::F32,
                };
                if id == B::Randn && !dtype.is_float() {
                    let at = b[1].map_or(e.span, |x| x.span);
                    return Err(Diagnostic::new(
                        "E0311",
                        at,
                        format!("`randn` makes floats; `{dtype}` is not a float dtype"),
                    )
                    .with_help("sample floats and convert: `randn(shape, f32).to(i32)`"));
                }
                match id {
                    B::Zeros | B::Empty => {
                        tensor(Tensor::try_zeros(&shape, dtype, &self.interrupt))
                    }
                    B::Ones => tensor(Tensor::try_full(&shape, dtype, 1.0, &self.interrupt)),
                    _ => {
                        let seed = match b.get(2).copied().flatten() {
                            Some(x) => self.int_arg(x, text, "a seed")?,
                            None => 0,
                        };
                        tensor(exec::rng::try_randn(
                            &shape,
                            dtype,
                            seed as u64,
                            &self.interrupt,
                        ))
                    }
                }
            }
            B::Full => {
                let b = Self::bind(name, &["shape", "value", "dtype"], 2, args, e.span)?;
                let shape = self.shape_arg(b[0].expect("required"), text)?;
                let vx = b[1].expect("required");
                let v = self.eval(vx, text)?;
                let value = num(&v).ok_or_else(|| {
                    wrong_kind(
                        vx.span,
                        format!("`full` fills with a number, found {}", v.describe()),
                        "`full([4, 8], 1.5, f32)`",
                    )
                })?;
                // As the checker (and the docs): `full`'s dtype defaults to f32.
                let dtype = match b[2] {
                    Some(x) => self.dtype_arg(x, text)?,
                    None => DType::F32,
                };
                if let Num::I(i) = value {
                    if dtype.is_int() && !int_fits(dtype, i) {
                        return Err(out_of_range(i, dtype, vx.span));
                    }
                }
                // As the checker: a float never fills an integer tensor implicitly.
                if matches!(value, Num::F(_)) && !dtype.is_float() {
                    return Err(Diagnostic::new(
                        "E0301",
                        vx.span,
                        format!(
                            "a `float` fill value for {} tensor",
                            tessera::diag::a_code(dtype)
                        ),
                    )
                    .with_help(format!(
                        "convert the value: `{}.to({dtype})`",
                        &text[vx.span.range()]
                    )));
                }
                tensor(Tensor::try_full(&shape, dtype, value.f(), &self.interrupt))
            }
            B::Arange => {
                let b = Self::bind(name, &["start", "end", "dtype"], 1, args, e.span)?;
                let first = self.int_arg(b[0].expect("required"), text, "`arange` bound")?;
                let (start, end) = match b[1] {
                    Some(x) => (first, self.int_arg(x, text, "`arange` bound")?),
                    None => (0, first),
                };
                let dtype = match b[2] {
                    Some(x) => self.dtype_arg(x, text)?,
                    None => DType::I32,
                };
                tensor(Tensor::try_arange(start, end, dtype, &self.interrupt))
            }
            B::Tensor => {
                let b = Self::bind(name, &["data", "dtype"], 1, args, e.span)?;
                let dx = b[0].expect("required");
                let data = self.eval(dx, text)?;
                let mut shape = Vec::new();
                let mut flat = Vec::new();
                let mut ints = Vec::new();
                let mut any_float = false;
                nested(&data, 0, &mut shape, &mut flat, &mut ints, &mut any_float).map_err(
                    |m| wrong_kind(dx.span, m, "`tensor([[1.0, 2.0], [3.0, 4.0]], f32)`"),
                )?;
                let dtype = match b[1] {
                    Some(x) => self.dtype_arg(x, text)?,
                    None if any_float => DType::F32,
                    None => DType::I32,
                };
                // As the checker: integers must be values of an integer dtype.
                if dtype.is_int() {
                    let outside = flat
                        .iter()
                        .find(|x| x.fract() == 0.0 && !int_fits(dtype, **x as i64));
                    if let Some(x) = outside {
                        return Err(out_of_range(*x as i64, dtype, dx.span));
                    }
                }
                if dtype.is_int() && !any_float {
                    // Exactly: an i64 above 2^53 does not survive f64.
                    return tensor(Tensor::try_from_ints(&shape, dtype, &ints, &self.interrupt));
                }
                tensor(Tensor::try_from_f64(&shape, dtype, &flat, &self.interrupt))
            }
            B::LoadNpy => {
                let b = Self::bind(name, &["path"], 1, args, e.span)?;
                let path = self.str_arg(b[0].expect("required"), text)?;
                exec::npy::load_npy(std::path::Path::new(&path), &self.interrupt)
                    .map(|t| Val::Run(Value::Tensor(t)))
                    .map_err(|err| err.to_diagnostic(e.span))
            }
            B::SaveNpy => {
                let b = Self::bind(name, &["tensor", "path"], 2, args, e.span)?;
                let tx = b[0].expect("required");
                let t = self.eval(tx, text)?;
                let Some(t) = t.tensor().cloned() else {
                    return Err(wrong_kind(
                        tx.span,
                        format!("`save_npy` saves a tensor, found {}", t.describe()),
                        "`save_npy(x, \"x.npy\")`",
                    ));
                };
                let path = self.str_arg(b[1].expect("required"), text)?;
                exec::npy::save_npy(&t, std::path::Path::new(&path), &self.interrupt)
                    .map(|_| Val::Run(Value::None))
                    .map_err(|err| err.to_diagnostic(e.span))
            }
            B::Len => {
                let b = Self::bind(name, &["x"], 1, args, e.span)?;
                let x = b[0].expect("required");
                match self.eval(x, text)? {
                    Val::Run(Value::Tensor(t)) if !t.shape().is_empty() => {
                        Ok(int(t.shape()[0] as i64))
                    }
                    Val::Run(Value::Tuple(v)) => Ok(int(v.len() as i64)),
                    Val::List(v) => Ok(int(v.len() as i64)),
                    Val::Str(s) => Ok(int(s.chars().count() as i64)),
                    other => Err(wrong_kind(
                        x.span,
                        format!(
                            "`len` takes a tensor of rank 1 or more, a tuple, a list or a string, found {}",
                            other.describe()
                        ),
                     "`len(x)` of a tensor is its first dim")),
                }
            }
            B::SetFloat32MatmulPrecision => {
                let b = Self::bind(name, &["precision"], 1, args, e.span)?;
                let px = b[0].expect("required");
                let p = self.str_arg(px, text)?;
                let tf32 = tessera::check::builtins::matmul_precision(&p).ok_or_else(|| {
                    Diagnostic::new(
                        "E0302",
                        px.span,
                        "the matmul precision is \"highest\" (full f32) or \"high\" (tf32)",
                    )
                    .with_help("`set_float32_matmul_precision(\"high\")` (PyTorch's \"medium\", bf16, is not offered)")
                })?;
                self.db.set_matmul_tf32(tf32);
                Ok(Val::Run(Value::None))
            }
            B::Cdiv => {
                let b = Self::bind(name, &["a", "b"], 2, args, e.span)?;
                let (ax, bx) = (b[0].expect("required"), b[1].expect("required"));
                let x = self.int_arg(ax, text, "`cdiv` operand")?;
                let y = self.int_arg(bx, text, "`cdiv` operand")?;
                if y == 0 {
                    // As for `//`: the checker folds a constant `cdiv` (E0315).
                    if self.is_constant(ax) && self.is_constant(bx) {
                        return Err(Diagnostic::new(
                            "E0315",
                            e.span,
                            format!(
                                "constant evaluation failed: division by zero in `cdiv({x}, {y})`"
                            ),
                        )
                        .with_help("the divisor of `cdiv(a, b)` must not be zero"));
                    }
                    return Err(division_by_zero(e.span));
                }
                Ok(int((x + y - 1).div_euclid(y)))
            }
            // Tensor computations: the checker types them, and a synthetic
            // whole-tensor function runs them on the device.
            B::ProgramId
            | B::NumPrograms
            | B::Load
            | B::Store
            | B::AtomicAdd
            | B::Dot
            | B::Min
            | B::Max
            | B::Sum
            | B::Mean
            | B::Exp
            | B::Exp2
            | B::Log
            | B::Log2
            | B::Sqrt
            | B::Rsqrt
            | B::Abs
            | B::Sigmoid
            | B::Tanh
            | B::Erf
            | B::Maximum
            | B::Minimum
            | B::Where
            | B::Matmul
            | B::Softmax
            | B::LayerNorm
            | B::RmsNorm
            | B::Relu
            | B::Gelu
            | B::Silu
            | B::Transpose
            | B::Reshape => self.synth_eval(e, text),
        }
    }

    fn str_arg(&mut self, x: &Expr, text: &str) -> R<String> {
        match self.eval(x, text)? {
            Val::Str(s) => Ok(s),
            other => Err(wrong_kind(
                x.span,
                format!("expected a string (a path), found {}", other.describe()),
                "write the path in quotes: `\"x.npy\"`",
            )),
        }
    }
}

fn nested(
    v: &Val,
    depth: usize,
    shape: &mut Vec<usize>,
    flat: &mut Vec<f64>,
    ints: &mut Vec<i64>,
    any_float: &mut bool,
) -> Result<(), String> {
    let items: Vec<Val> = match v {
        Val::List(items) => items.clone(),
        Val::Run(Value::Tuple(items)) => items.iter().cloned().map(Val::Run).collect(),
        other => {
            if depth < shape.len() {
                return Err("the nested lists of `tensor` are not rectangular".into());
            }
            return match num(other) {
                Some(Num::I(i)) => {
                    flat.push(i as f64);
                    ints.push(i);
                    Ok(())
                }
                Some(Num::F(x)) => {
                    *any_float = true;
                    flat.push(x);
                    Ok(())
                }
                None => Err(format!(
                    "`tensor` takes nested lists of numbers, found {}",
                    other.describe()
                )),
            };
        }
    };
    if depth == shape.len() {
        if !flat.is_empty() {
            return Err("the nested lists of `tensor` are not rectangular".into());
        }
        shape.push(items.len());
    } else if shape[depth] != items.len() {
        return Err("the nested lists of `tensor` are not rectangular".into());
    }
    for x in &items {
        nested(x, depth + 1, shape, flat, ints, any_float)?;
    }
    Ok(())
}

fn index_seq(seq: Vec<Val>, items: &[IndexItem], span: Span) -> R<Val> {
    match items {
        [IndexItem::Int(i)] => {
            let n = seq.len() as i64;
            let j = if *i < 0 { i + n } else { *i };
            if j < 0 || j >= n {
                return Err(Diagnostic::new(
                    "E0413",
                    span,
                    format!("index {i} is out of range for {n} items"),
                )
                .with_help(if n == 0 {
                    "it has no items".to_string()
                } else {
                    format!(
                        "its indices are 0 to {} (or -{n} to -1, counting from the end)",
                        n - 1
                    )
                }));
            }
            Ok(seq[j as usize].clone())
        }
        _ => Err(wrong_kind(
            span,
            "a tuple or list takes one integer index",
            "index with one integer: `t[0]`",
        )),
    }
}

fn overflow(span: Span) -> Diagnostic {
    Diagnostic::new("E0724", span, "integer overflow").with_help("session integers are 64-bit")
}

/// The executor's code for an integer division by zero (E0704).
pub(crate) fn division_by_zero(span: Span) -> Diagnostic {
    exec::ExecError::new("E0704", "integer division by zero")
        .with_help("check the divisor before dividing")
        .to_diagnostic(span)
}

/// Operators the checker rejects on `bool` operands (E0311): arithmetic.
/// Comparisons, `and`/`or` and the bitwise operators take bools.
fn bool_arith(op: BinOp) -> bool {
    use BinOp::*;
    matches!(op, Add | Sub | Mul | Div | FloorDiv | Mod | Pow)
}

/// `x.to(dtype)` of a host scalar, as a cast in a kernel does: floats round,
/// float to integer truncates and saturates (NaN to 0), integers wrap.
fn cast_scalar(n: Num, d: DType) -> Val {
    if d == DType::Bool {
        return boolean(n.f() != 0.0);
    }
    if d.is_float() {
        return float(exec::round_to(d, n.f()));
    }
    int(match n {
        Num::I(i) => exec::wrap_int(d, i),
        Num::F(x) => exec::float_to_int(d, x),
    })
}

fn arith(op: BinOp, a: Num, b: Num, span: Span) -> R<Val> {
    use BinOp::*;
    let both_int = matches!((a, b), (Num::I(_), Num::I(_)));
    Ok(match op {
        Add | Sub | Mul if both_int => {
            let (Num::I(x), Num::I(y)) = (a, b) else {
                unreachable!()
            };
            let r = match op {
                Add => x.checked_add(y),
                Sub => x.checked_sub(y),
                _ => x.checked_mul(y),
            };
            int(r.ok_or_else(|| overflow(span))?)
        }
        Add => float(a.f() + b.f()),
        Sub => float(a.f() - b.f()),
        Mul => float(a.f() * b.f()),
        Div => float(a.f() / b.f()),
        FloorDiv | Mod if both_int => {
            let (Num::I(x), Num::I(y)) = (a, b) else {
                unreachable!()
            };
            if y == 0 {
                return Err(division_by_zero(span));
            }
            // Python semantics: floor division, remainder with the divisor's sign.
            let mut q = x.wrapping_div(y);
            if x.wrapping_rem(y) != 0 && ((x < 0) != (y < 0)) {
                q -= 1;
            }
            if op == FloorDiv {
                int(q)
            } else {
                int(x - q * y)
            }
        }
        FloorDiv => float((a.f() / b.f()).floor()),
        Mod => {
            let (x, y) = (a.f(), b.f());
            float(x - (x / y).floor() * y)
        }
        Pow => match (a, b) {
            (Num::I(x), Num::I(y)) if y >= 0 => {
                int(x.checked_pow(y as u32).ok_or_else(|| overflow(span))?)
            }
            _ => float(a.f().powf(b.f())),
        },
        Lt => boolean(a.f() < b.f()),
        Le => boolean(a.f() <= b.f()),
        Gt => boolean(a.f() > b.f()),
        Ge => boolean(a.f() >= b.f()),
        Eq => boolean(a.f() == b.f()),
        Ne => boolean(a.f() != b.f()),
        And => boolean(a.f() != 0.0 && b.f() != 0.0),
        Or => boolean(a.f() != 0.0 || b.f() != 0.0),
        BitAnd | BitOr | BitXor => {
            let (Num::I(x), Num::I(y)) = (a, b) else {
                return Err(Diagnostic::new(
                    "E0314",
                    span,
                    "bitwise operators need integer operands",
                )
                .with_help(
                    "bitwise operators work on integers and bools: convert with `.to(i32)`",
                ));
            };
            int(match op {
                BitAnd => x & y,
                BitOr => x | y,
                _ => x ^ y,
            })
        }
        MatMul => {
            return Err(unsupported(
                span,
                "this operator is not evaluated on host values",
                "compute it inside a function or kernel",
            ))
        }
    })
}
