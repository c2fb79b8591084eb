//! Statements: assignments (also to parts of tensors), `if`, `for` and
//! `while` on host values, and their conditions and ranges.

use std::io::Write;

use tessera::diag::{with_article, Diagnostic};
use tessera::exec::Value;
use tessera::syntax::ast::{Expr, ExprKind, Index, Stmt, StmtKind};
use tessera::syntax::span::Span;

use super::super::Session;
use super::num::*;
use super::*;

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

    pub(super) fn check_interrupt(&self, span: Span) -> R<()> {
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

    pub(super) fn truth(&mut self, cond: &Expr, text: &str) -> R<bool> {
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
}
