//! Statements and control flow: compile-time `if` and unrolled `for` over
//! `range`, and run-time `if`/`for`/`while` as nodes holding regions (nested
//! graphs with their carried values and captures).

use std::collections::HashMap;

use super::{assigned_names, prune_captures, Builder, R};
use crate::check::{DType, Ty, Value};
use crate::ir::graph::verify::{is_condition, region_outputs};
use crate::ir::graph::{GParam, GType, Graph, LowerError, NodeId, NodeKind, Region};
use crate::ir::tile::{BinaryOp, Constant};
use crate::syntax::ast::{self, Expr, ExprKind, StmtKind};
use crate::syntax::span::Span;

impl<'a> Builder<'a> {
    /// The values of `range(a)`, `range(a, b)` or `range(a, b, step)` with
    /// compile-time integer arguments (at most 64 of them).
    fn const_range(&self, iter: &Expr) -> R<Vec<i64>> {
        let not_const = || {
            LowerError::new(
                iter.span,
                "a `for` loop over anything but `range` of compile-time integers",
            )
        };
        let ExprKind::Call { func, args } = &iter.kind else {
            return Err(not_const());
        };
        if !matches!(&func.kind, ExprKind::Name(n) if n.name == "range")
            || args.iter().any(|a| a.name.is_some())
        {
            return Err(not_const());
        }
        let v: Vec<i64> = args
            .iter()
            .map(|a| self.const_int(&a.value).map_err(|_| not_const()))
            .collect::<R<_>>()?;
        let (lo, hi, step) = match v[..] {
            [b] => (0, b, 1),
            [a, b] => (a, b, 1),
            [a, b, c] if c != 0 => (a, b, c),
            _ => return Err(not_const()),
        };
        let mut out = Vec::new();
        let mut i = lo;
        while (step > 0 && i < hi) || (step < 0 && i > hi) {
            out.push(i);
            if out.len() > 64 {
                return Err(LowerError::new(
                    iter.span,
                    "a `for` loop of more than 64 trips in a whole-tensor function (loops are unrolled)",
                ));
            }
            i += step;
        }
        Ok(out)
    }
}

impl<'a> Builder<'a> {
    pub(super) fn block(&mut self, body: &[ast::Stmt], outputs: &mut Vec<NodeId>) -> R<bool> {
        for s in body {
            match &s.kind {
                StmtKind::Expr(Expr {
                    kind: ExprKind::Str(_),
                    ..
                })
                | StmtKind::Pass => {}
                StmtKind::Expr(x) => {
                    self.expr(x)?;
                }
                StmtKind::Assign { target, value, .. } => match (&target.kind, &value.kind) {
                    // `s = x.shape`, `m, n = x.shape`, `d = x.dtype`: compile-time
                    // values, read from the checker's values where they are used.
                    _ if matches!(self.val(value)?.ty, Ty::Shape(_) | Ty::DTypeV) => {}
                    (ExprKind::Name(id), _) => {
                        let v = self.expr(value)?;
                        self.env.insert(id.name.clone(), v);
                    }
                    // `a, b = x, y`: every value first, then the names.
                    (ExprKind::Tuple(ts), ExprKind::Tuple(vs))
                        if ts.len() == vs.len()
                            && ts.iter().all(|t| matches!(t.kind, ExprKind::Name(_))) =>
                    {
                        let vals: Vec<NodeId> =
                            vs.iter().map(|v| self.expr(v)).collect::<R<_>>()?;
                        for (t, v) in ts.iter().zip(vals) {
                            if let ExprKind::Name(id) = &t.kind {
                                self.env.insert(id.name.clone(), v);
                            }
                        }
                    }
                    _ => return Err(LowerError::new(target.span, "assignment to this target")),
                },
                StmtKind::AugAssign { target, op, value } => {
                    let ExprKind::Name(id) = &target.kind else {
                        return Err(LowerError::new(target.span, "assignment to this target"));
                    };
                    let a = *self.env.get(&id.name).ok_or_else(|| {
                        LowerError::new(target.span, format!("the run-time value of `{}`", id.name))
                    })?;
                    let b = self.expr(value)?;
                    let ty = self.ty_of(a).clone();
                    let kind = match BinaryOp::from_ast(*op) {
                        Some(op) => NodeKind::Binary { op, a, b },
                        None => NodeKind::MatMul {
                            a,
                            b,
                            tf32: self.default_tf32,
                        },
                    };
                    let n = self.push(kind, ty, s.span);
                    self.env.insert(id.name.clone(), n);
                }
                StmtKind::Return(Some(x)) => {
                    match &x.kind {
                        ExprKind::Tuple(items) => {
                            for i in items {
                                outputs.push(self.expr(i)?);
                            }
                        }
                        _ => {
                            // `return k(...)` of a kernel launch returns None:
                            // the launch runs, and nothing is returned.
                            let n = self.expr(x)?;
                            if !matches!(self.ty_of(n), GType::Unit) {
                                outputs.push(n);
                            }
                        }
                    }
                    return Ok(true);
                }
                StmtKind::Return(None) => return Ok(true),
                StmtKind::If { branches, orelse } => {
                    if self.if_chain(branches, orelse.as_deref(), outputs)? {
                        return Ok(true);
                    }
                }
                StmtKind::While { cond, body } => {
                    if self.val(cond)?.value != Some(Value::Bool(false)) {
                        self.runtime_while(cond, body)?;
                    }
                }
                StmtKind::For { target, iter, body } if self.const_range(iter).is_err() => {
                    self.runtime_for(target, iter, body)?;
                }
                StmtKind::For { target, iter, body } => {
                    // Unrolled: `range(...)` with compile-time bounds, at most 64 trips.
                    let trips = self.const_range(iter)?;
                    for i in trips {
                        let c = self.push(
                            NodeKind::Const(Constant::Int(i)),
                            GType::Scalar(DType::I32),
                            target.span,
                        );
                        self.env.insert(target.name.clone(), c);
                        if self.block(body, outputs)? {
                            return Ok(true);
                        }
                    }
                }
                _ => {
                    return Err(LowerError::new(
                        s.span,
                        "`break` and `continue` in a whole-tensor function",
                    ))
                }
            }
        }
        Ok(false)
    }

    /// `if`/`elif`/`else`: branches on compile-time conditions are taken or
    /// dropped; the first run-time condition makes an `If` node whose else
    /// region holds the rest of the chain. Returns whether the block returned.
    fn if_chain(
        &mut self,
        branches: &[(Expr, ast::Block)],
        orelse: Option<&[ast::Stmt]>,
        outputs: &mut Vec<NodeId>,
    ) -> R<bool> {
        for (j, (cond, body)) in branches.iter().enumerate() {
            match self.val(cond)?.value {
                Some(Value::Bool(true)) => return self.block(body, outputs),
                Some(Value::Bool(false)) => {}
                _ => {
                    self.runtime_if(cond, body, &branches[j + 1..], orelse)?;
                    return Ok(false);
                }
            }
        }
        match orelse {
            Some(b) => self.block(b, outputs),
            None => Ok(false),
        }
    }

    /// A child builder for a region, sharing the checker's values.
    fn child(&self) -> Builder<'a> {
        Builder {
            vals: self.vals.clone(),
            nodes: Vec::new(),
            env: HashMap::new(),
            static_syms: self.static_syms.clone(),
            is_builtin_alias: self.is_builtin_alias,
            default_tf32: self.default_tf32,
        }
    }

    /// Builds a region: params `leading`, then one capture per name bound
    /// here (those the region does not read are dropped); `build` fills it
    /// and gives its outputs.
    fn region(
        &self,
        name: &str,
        leading: &[(String, GType)],
        span: Span,
        build: &mut dyn FnMut(&mut Builder<'a>) -> R<Vec<NodeId>>,
    ) -> R<Region> {
        let mut c = self.child();
        let mut params = Vec::new();
        for (n, ty) in leading {
            let id = c.push(NodeKind::Param(params.len()), ty.clone(), span);
            c.env.insert(n.clone(), id);
            params.push(GParam {
                name: n.clone(),
                ty: ty.clone(),
            });
        }
        let mut names: Vec<&String> = self
            .env
            .keys()
            .filter(|n| !leading.iter().any(|(l, _)| l == *n))
            .collect();
        names.sort();
        let mut captures = Vec::new();
        for n in names {
            let outer = self.env[n];
            let ty = self.ty_of(outer).clone();
            let id = c.push(NodeKind::Param(params.len()), ty.clone(), span);
            c.env.insert(n.clone(), id);
            params.push(GParam {
                name: n.clone(),
                ty,
            });
            captures.push(outer);
        }
        let outputs = build(&mut c)?;
        let g = Graph {
            name: name.to_string(),
            params,
            nodes: c.nodes,
            outputs,
        };
        let (g, kept) = prune_captures(g, leading.len());
        Ok(Region {
            graph: std::sync::Arc::new(g),
            captures: kept.into_iter().map(|k| captures[k]).collect(),
        })
    }

    /// A condition node: a bool scalar or one-element bool tensor.
    fn condition(&mut self, cond: &Expr) -> R<NodeId> {
        let c = self.expr(cond)?;
        if !is_condition(self.ty_of(c)) {
            return Err(LowerError::new(
                cond.span,
                format!("a condition of type `{}`", self.ty_of(c)),
            ));
        }
        Ok(c)
    }

    fn runtime_if(
        &mut self,
        cond: &Expr,
        body: &[ast::Stmt],
        rest: &[(Expr, ast::Block)],
        orelse: Option<&[ast::Stmt]>,
    ) -> R<()> {
        let c = self.condition(cond)?;
        let (mut in_then, mut in_else) = (Vec::new(), Vec::new());
        assigned_names(body, &mut in_then);
        for (_, b) in rest {
            assigned_names(b, &mut in_else);
        }
        if let Some(b) = orelse {
            assigned_names(b, &mut in_else);
        }
        // Results: names bound before and assigned on some path, or assigned on both.
        let mut names: Vec<String> = Vec::new();
        for n in in_then.iter().chain(&in_else) {
            let bound = self.env.contains_key(n) || (in_then.contains(n) && in_else.contains(n));
            if bound && !names.contains(n) {
                names.push(n.clone());
            }
        }
        let span = cond.span;
        let results = |b: &Builder<'a>| -> R<Vec<NodeId>> {
            names
                .iter()
                .map(|n| {
                    b.env.get(n).copied().ok_or_else(|| {
                        LowerError::new(
                            span,
                            format!(
                                "`{n}`, bound on one path of an `if` on a run-time condition only"
                            ),
                        )
                    })
                })
                .collect()
        };
        let returns = || LowerError::new(span, "a `return` inside an `if` on a run-time condition");
        let then = self.region("then", &[], span, &mut |b| {
            if b.block(body, &mut Vec::new())? {
                return Err(returns());
            }
            results(b)
        })?;
        let otherwise = self.region("else", &[], span, &mut |b| {
            if b.if_chain(rest, orelse, &mut Vec::new())? {
                return Err(returns());
            }
            results(b)
        })?;
        let tys = region_outputs(&then);
        if tys != region_outputs(&otherwise) {
            return Err(LowerError::new(
                span,
                "branches that give a name different shapes or dtypes",
            ));
        }
        let node = self.push(
            NodeKind::If {
                cond: c,
                then,
                otherwise,
            },
            GType::Unit,
            span,
        );
        self.project(node, &names, tys, span);
        Ok(())
    }

    /// Binds `names` to the results of a control-flow node.
    fn project(&mut self, node: NodeId, names: &[String], tys: Vec<GType>, span: Span) {
        for (index, (n, ty)) in names.iter().zip(tys).enumerate() {
            let p = self.push(NodeKind::Project { of: node, index }, ty, span);
            self.env.insert(n.clone(), p);
        }
    }

    /// Names a loop body assigns that are bound before it (its carried values),
    /// with their types, as the region's leading params.
    fn carried(&self, body: &[ast::Stmt], skip: Option<&str>) -> Vec<(String, GType)> {
        let mut assigned = Vec::new();
        assigned_names(body, &mut assigned);
        let mut out: Vec<(String, GType)> = Vec::new();
        for n in assigned {
            if Some(n.as_str()) == skip || out.iter().any(|(m, _)| *m == n) {
                continue;
            }
            if let Some(id) = self.env.get(&n) {
                out.push((n, self.ty_of(*id).clone()));
            }
        }
        out
    }

    /// The loop's carried values after its body, which must keep their types.
    fn loop_results(b: &Builder<'a>, carried: &[(String, GType)], span: Span) -> R<Vec<NodeId>> {
        carried
            .iter()
            .map(|(n, ty)| {
                let id = b.env[n];
                if b.ty_of(id) != ty {
                    return Err(LowerError::new(
                        span,
                        format!("a loop that changes `{n}` from `{ty}` to `{}`", b.ty_of(id)),
                    ));
                }
                Ok(id)
            })
            .collect()
    }

    fn runtime_for(&mut self, target: &ast::Ident, iter: &Expr, body: &[ast::Stmt]) -> R<()> {
        let span = iter.span;
        let not_range = || {
            LowerError::new(
                span,
                "a `for` loop over anything but `range(...)` in a whole-tensor function",
            )
        };
        let ExprKind::Call { func, args } = &iter.kind else {
            return Err(not_range());
        };
        if !matches!(&func.kind, ExprKind::Name(n) if n.name == "range")
            || args.iter().any(|a| a.name.is_some())
        {
            return Err(not_range());
        }
        let int = |b: &mut Self, v: i64| {
            b.push(
                NodeKind::Const(Constant::Int(v)),
                GType::Scalar(DType::I32),
                span,
            )
        };
        let (lo, hi, step) = match &args[..] {
            [h] => (int(self, 0), self.expr(&h.value)?, int(self, 1)),
            [l, h] => (self.expr(&l.value)?, self.expr(&h.value)?, int(self, 1)),
            [l, h, st] => (
                self.expr(&l.value)?,
                self.expr(&h.value)?,
                self.expr(&st.value)?,
            ),
            _ => return Err(not_range()),
        };
        let carried = self.carried(body, Some(&target.name));
        let init: Vec<NodeId> = carried.iter().map(|(n, _)| self.env[n]).collect();
        let mut leading = vec![(target.name.clone(), GType::Scalar(DType::I32))];
        leading.extend(carried.iter().cloned());
        let body_r = self.region("body", &leading, span, &mut |b| {
            if b.block(body, &mut Vec::new())? {
                return Err(LowerError::new(span, "a `return` inside a run-time loop"));
            }
            Self::loop_results(b, &carried, span)
        })?;
        let node = self.push(
            NodeKind::For {
                lo,
                hi,
                step,
                init,
                body: body_r,
            },
            GType::Unit,
            span,
        );
        let names: Vec<String> = carried.iter().map(|(n, _)| n.clone()).collect();
        self.project(
            node,
            &names,
            carried.into_iter().map(|(_, t)| t).collect(),
            span,
        );
        // The loop variable is not readable after a run-time loop.
        self.env.remove(&target.name);
        Ok(())
    }

    fn runtime_while(&mut self, cond: &Expr, body: &[ast::Stmt]) -> R<()> {
        let span = cond.span;
        let carried = self.carried(body, None);
        let init: Vec<NodeId> = carried.iter().map(|(n, _)| self.env[n]).collect();
        let cond_r = self.region("cond", &carried, span, &mut |b| {
            Ok(vec![b.condition(cond)?])
        })?;
        let body_r = self.region("body", &carried, span, &mut |b| {
            if b.block(body, &mut Vec::new())? {
                return Err(LowerError::new(span, "a `return` inside a run-time loop"));
            }
            Self::loop_results(b, &carried, span)
        })?;
        let node = self.push(
            NodeKind::While {
                init,
                cond: cond_r,
                body: body_r,
            },
            GType::Unit,
            span,
        );
        let names: Vec<String> = carried.iter().map(|(n, _)| n.clone()).collect();
        self.project(
            node,
            &names,
            carried.into_iter().map(|(_, t)| t).collect(),
            span,
        );
        Ok(())
    }
}
