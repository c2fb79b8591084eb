//! Statements: blocks, assignments, conditions (known at compile time or not),
//! and `if` chains with the variables their branches merge; the rest of a block
//! after a jump is guarded by its flag.

use std::collections::HashMap;

use super::jumps::{flag, BRK, CONT, RET};
use super::reads::Live;
use super::values::tile_type;
use super::{work, Lowerer, LV, R};
use crate::check::stmt::assigned_names;
use crate::check::{DType, Value as CValue};
use crate::ir::tile::{BinaryOp, OpKind, Region, Type, Value};
use crate::syntax::ast::{self, Expr, ExprKind, Stmt, StmtKind};
use crate::syntax::span::Span;

impl<'a> Lowerer<'a> {
    pub(super) fn block(&mut self, stmts: &[Stmt], live_after: &Live<'_>) -> R<()> {
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
    pub(super) fn condition(&mut self, c: &Expr) -> R<Result<bool, Value>> {
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
    pub(super) fn emit_if(
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
}
