//! `for` and `while` loops: the variables they carry, `break` and `continue`
//! as carried flags (a `for` with `break` becomes a `While`), and a `return`
//! that leaves every enclosing loop.

use super::jumps::{flag, Jumps, BRK, CONT, RET};
use super::reads::Live;
use super::{Lowerer, LV, R};
use crate::check::stmt::assigned_names;
use crate::check::{DType, Value as CValue};
use crate::diag::Diagnostic;
use crate::ir::tile::{BinaryOp, Constant, OpKind, Type, UnaryOp, Value};
use crate::syntax::ast::{self, Expr, ExprKind, Stmt};
use crate::syntax::span::Span;

impl<'a> Lowerer<'a> {
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

    pub(super) fn for_loop(
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

    pub(super) fn while_loop(
        &mut self,
        s: &Stmt,
        cond: &Expr,
        body: &[Stmt],
        live_after: &Live<'_>,
    ) -> R<()> {
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
}
