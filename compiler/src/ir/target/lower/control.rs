//! Structured control flow: `for`, `while` and `if`, with their carried and
//! merged values.
//!
//! Loop-carried values live in fresh registers moved in before the loop and
//! assigned at the end of each iteration as a parallel copy; each takes the
//! layout the body will yield it in where that is predictable (from `dot`s
//! and what is computed from them), so the back edge needs no conversion. An
//! `if` merges into fresh registers in the then-branch's layouts. A `for`
//! loop is where `pipeline` plans and copies invariant dot operands and sets up the
//! software pipeline.

use std::collections::HashMap;
use std::rc::Rc;

use super::across::{Crossing, OuterLoop};
use super::mma::WgmmaDot;
use super::pipeline::{only_dot, Decision, Rotation};
use super::{gcd, Lower, R, TV};
use crate::check::DType;
use crate::ir::target::layout::Layout;
use crate::ir::target::{Inst, Operand, Reg, RegTy};
use crate::ir::tile::{self, OpKind, Value};

impl<'a> Lower<'a> {
    /// Fresh registers to carry `init` around a loop (moved in now).
    /// `hint` gives, per carried value, the layout the loop body will yield it
    /// in where known; a uniform initial value (a splat) takes that layout, so
    /// the loop needs no conversion on its back edge, and so does the value
    /// at `converted` (a wgmma dot's accumulator, updated in place), once,
    /// before the loop.
    fn carried(
        &mut self,
        init: &[Value],
        hint: &[Option<Rc<Layout>>],
        converted: Option<usize>,
    ) -> R<Vec<TV>> {
        init.iter()
            .enumerate()
            .map(|(i, v)| {
                let mut t = self.val(*v);
                if let Some(Some(l)) = hint.get(i) {
                    let uniform = self.is_splat(&t);
                    if uniform && l.shape == t.layout.shape && *l != t.layout {
                        t = TV {
                            ops: vec![t.ops[0]; l.num_slots()],
                            layout: l.clone(),
                            ..t
                        };
                    } else if converted == Some(i) && *l != t.layout {
                        t = self.convert(&t, l)?;
                    }
                }
                let ops = t
                    .ops
                    .iter()
                    .map(|&o| {
                        let dst = self.new_reg(t.ty);
                        self.emit(Inst::Mov { dst, src: o });
                        Operand::Reg(dst)
                    })
                    .collect();
                Ok(TV { ops, ..t })
            })
            .collect()
    }

    /// The layouts a loop body will yield its values in, where the ops that
    /// compute them decide it: a `dot` result, its reductions, and elementwise
    /// ops over those (an elementwise op keeps its first operand's layout; when
    /// that operand is the carried value itself, the other operand decides).
    /// A carried value whose initial value is not uniform keeps that value's
    /// layout (`args`: the body's arguments, `init`: their initial values).
    fn yield_layouts(
        &self,
        body: &tile::Region,
        args: &[Value],
        init: &[Value],
    ) -> Vec<Option<Rc<Layout>>> {
        let Some(OpKind::Yield(ys)) = body.ops.last().map(|o| &o.kind) else {
            return vec![];
        };
        let known: HashMap<Value, Rc<Layout>> = args
            .iter()
            .zip(init)
            .filter_map(|(a, i)| {
                let t = self.vals.get(i)?;
                (!self.is_splat(t)).then(|| (*a, t.layout.clone()))
            })
            .collect();
        ys.iter()
            .map(|y| self.predict(body, &known, *y, 8))
            .collect()
    }

    fn predict(
        &self,
        body: &tile::Region,
        known: &HashMap<Value, Rc<Layout>>,
        v: Value,
        depth: u32,
    ) -> Option<Rc<Layout>> {
        if depth == 0 {
            return None;
        }
        if let Some(l) = known.get(&v) {
            return Some(l.clone());
        }
        let op = body.ops.iter().find(|o| o.results.contains(&v))?;
        let p = |x: Value| self.predict(body, known, x, depth - 1);
        match &op.kind {
            OpKind::Dot {
                a, b, precision, ..
            } => {
                let (ta, tb) = (self.tk.ty(*a), self.tk.ty(*b));
                let (m, k, n) = (ta.shape()[0], ta.shape()[1], tb.shape()[1]);
                if self.wgmma.contains(&WgmmaDot { a: *a, b: *b }) {
                    return self.wgmma_layout(m, n);
                }
                Some(
                    self.mma_plan(ta.dtype(), tb.dtype(), [m, n, k], *precision)
                        .map(|(_, layout)| layout)
                        .unwrap_or_else(|| self.blocked(&[m, n])),
                )
            }
            OpKind::Reduce {
                x, axis, keepdims, ..
            } => p(*x).map(|l| Rc::new(l.slice(*axis, *keepdims))),
            // A load takes the default layout of its shape.
            OpKind::Load { .. } => Some(self.blocked(self.tk.ty(v).shape())),
            OpKind::Unary { x, .. } | OpKind::Cast { x, .. } => p(*x),
            OpKind::Binary { a, b, .. } | OpKind::Select { a, b, .. } => p(*a).or_else(|| p(*b)),
            // An `if` merges in its then-branch's layouts; a branch may yield
            // a value of the enclosing body (a select skipped where its mask
            // is all-true yields the unmasked tile).
            OpKind::If {
                then, otherwise, ..
            } => {
                let i = op.results.iter().position(|r| *r == v)?;
                [then, otherwise].into_iter().find_map(|r| {
                    let Some(OpKind::Yield(ys)) = r.ops.last().map(|o| &o.kind) else {
                        return None;
                    };
                    let y = *ys.get(i)?;
                    self.predict(r, known, y, depth - 1).or_else(|| p(y))
                })
            }
            _ => None,
        }
    }

    /// Moves `vals` into the registers of `into` (converting layouts), as a
    /// parallel copy: a source that is itself one of the registers written
    /// (a carried value yielded again, or swapped) is read into a temporary
    /// first; every other source is moved directly.
    fn assign(&mut self, into: &[TV], vals: &[TV]) -> R<()> {
        let mut pairs = Vec::new();
        for (dst, v) in into.iter().zip(vals) {
            let v = self.convert(v, &dst.layout)?;
            for (&d, &o) in dst.ops.iter().zip(&v.ops) {
                let d = d.reg().expect("carried registers");
                pairs.push((d, o, dst.ty));
            }
        }
        let written: std::collections::HashSet<Reg> = pairs.iter().map(|p| p.0).collect();
        for (d, o, ty) in pairs.iter_mut() {
            if let Operand::Reg(r) = *o {
                if r != *d && written.contains(&r) {
                    let t = self.new_reg(*ty);
                    self.emit(Inst::Mov { dst: t, src: *o });
                    *o = Operand::Reg(t);
                }
            }
        }
        for (d, o, _) in pairs {
            if o != Operand::Reg(d) {
                self.emit(Inst::Mov { dst: d, src: o });
            }
        }
        Ok(())
    }

    pub(super) fn for_loop(
        &mut self,
        op: &tile::Op,
        lo: Value,
        hi: Value,
        step: Value,
        init: &[Value],
        body: &tile::Region,
    ) -> R<()> {
        let (lo_o, hi_o, step_o) = (self.scalar(lo), self.scalar(hi), self.scalar(step));
        if step_o == Operand::Int(0) {
            return self.unsupported("a `range` with step 0");
        }
        // The loop around this one, as one a pipeline here may run across.
        let mut enclosing = self.outer.take();
        // The loop variable has the bounds' type (i32, or i64 over i64 bounds).
        let idt = self.tk.ty(body.args[0]).dtype();
        let ity = if idt == DType::I64 {
            RegTy::I64
        } else {
            RegTy::I32
        };
        let iv = self.new_reg(ity);
        let d = gcd(self.divisor(lo), self.divisor(step));
        self.div.insert(body.args[0], d);
        if let (Operand::Int(l), Operand::Int(s)) = (lo_o, step_o) {
            if l >= 0
                && s > 0
                && l % s == 0
                && self.divisor_or_constant(hi).is_multiple_of(s as u64)
            {
                self.extents
                    .insert(body.args[0], super::LoopExtent { hi, step: s });
            }
        }
        self.vals
            .insert(body.args[0], self.scalar_tv(Operand::Reg(iv), ity, idt));
        // The plan first: a dot on wgmma decides the accumulator's layout.
        let mut plan = self.plan_loop(body);
        let maps = self.tma_maps(&plan, step_o);
        plan.tma = maps.is_some();
        let invariant_copies = self.invariant_tma(&plan);
        plan.invariant_tma = invariant_copies.is_some();
        if !plan.tma {
            self.drop_tma_only_loads(&mut plan);
        }
        if let Some((a, b)) = plan.wgmma {
            self.wgmma.push(WgmmaDot { a, b });
        }
        self.wgmma_waited.extend(plan.wgmma_waited.iter().copied());
        let hint = self.yield_layouts(body, &body.args[1..], init);
        // A wgmma dot's accumulator, if a carried value (its index).
        let wgmma_acc = plan.wgmma.and_then(|_| match &only_dot(body)?.kind {
            OpKind::Dot { acc: Some(c), .. } => body.args[1..].iter().position(|v| v == c),
            _ => None,
        });
        let carried = self.carried(init, &hint, wgmma_acc)?;
        for (a, c) in body.args[1..].iter().zip(&carried) {
            self.define(*a, c.clone());
        }
        let outer_promotion = self.promotion.take();
        let decision = self.pipeline.plan.decisions.len();
        if !plan.invariant.is_empty() || !plan.pipelined.is_empty() {
            let decision = Decision::Loop(plan.clone());
            self.pipeline.plan.decisions.push(decision);
        }
        let across = match enclosing.as_mut() {
            Some(o) if maps.is_some() && plan.invariant.is_empty() => {
                let accesses: Vec<&[tile::Access]> =
                    plan.pipelined.iter().map(|l| l.access.as_slice()).collect();
                self.across_slice(o, body.args[0], [lo, hi, step], step_o, &accesses)
                    .map(|slice| (o, slice))
            }
            _ => None,
        };
        let outer_iv = across.as_ref().map(|(o, _)| o.iv);
        // TMA's first stages go out before the invariant copies, which the
        // threads issue while those land (its set-up has a barrier first).
        let tma = maps.is_some();
        let invariant = self.invariant_buffers(&plan);
        if !tma {
            self.copy_invariant_operands(&invariant);
        }
        let amd_staged = self.stage_invariant_amd_operands(body)?;
        let bounds = [lo_o, hi_o, step_o];
        let pipe = self.pipeline_prologue(body, &plan, maps, bounds, across)?;
        let across = pipe
            .as_ref()
            .and_then(|p| p.tma.as_ref())
            .and_then(|t| t.across.clone());
        if across.is_some() {
            if let Some(Decision::Loop(d)) = self.pipeline.plan.decisions.get_mut(decision) {
                d.across = outer_iv;
            }
        }
        let buffered = !invariant.is_empty() || !amd_staged.is_empty() || pipe.is_some();
        self.buffered_loops += u32::from(buffered);
        let invariant_bar = match &invariant_copies {
            Some(c) => Some(self.tma_copy_invariant(c, &invariant)),
            None => {
                if tma {
                    self.copy_invariant_operands(&invariant);
                }
                None
            }
        };
        // The invariant copies complete before the loop where no `cp.async`
        // wait in it counts their group (no pipeline, or TMA's), visible to
        // wgmma's asynchronous proxy where its dots read them (TMA writes
        // through that proxy).
        if !plan.invariant.is_empty() && pipe.as_ref().is_none_or(|p| p.tma.is_some()) {
            if invariant_bar.is_none() {
                self.emit(Inst::CpAsyncWait { pending: 0 });
                if !plan.wgmma_waited.is_empty() {
                    self.emit(Inst::FenceProxyAsync);
                }
            }
            self.emit(Inst::Barrier);
            if let Some(b) = invariant_bar {
                self.tma_invariant_wait(b);
            }
        }
        self.outer = OuterLoop::new(self, body, ity, idt, bounds);
        self.blocks.push(Vec::new());
        let yields = match &pipe {
            Some(p) if plan.rotated => {
                // The dot issues the copies ahead and the wait and barrier
                // for the next stage before its last k step (`Rotation`).
                self.blocks.push(Vec::new());
                self.pipeline_issue_ahead(body, p, Operand::Reg(iv), bounds)?;
                let ahead = self.blocks.pop().unwrap_or_default();
                let (a, b) = match only_dot(body).map(|o| &o.kind) {
                    Some(OpKind::Dot { a, b, .. }) => (*a, *b),
                    _ => return self.unsupported("a rotated loop without its dot"),
                };
                self.rotation = Some(Rotation {
                    a,
                    b,
                    stages: p.stages,
                    pending: p.ahead - 1,
                    stage: p.stage,
                    ahead,
                });
                let yields = self.region_ops(&body.ops)?;
                if self.rotation.take().is_some() {
                    return self.unsupported("a rotated dot that took another path");
                }
                yields
            }
            Some(p) => {
                self.pipeline_wait(p);
                // The copies ahead go after the first op that runs a dot
                // (at the body's top level, so that every iteration issues
                // them once).
                let split = body
                    .ops
                    .iter()
                    .position(|o| has_dot(std::slice::from_ref(o)))
                    .map_or(0, |i| i + 1);
                self.region_ops(&body.ops[..split])?;
                self.pipeline_issue_ahead(body, p, Operand::Reg(iv), bounds)?;
                self.region_ops(&body.ops[split..])?
            }
            None => self.region_ops(&body.ops)?,
        }
        .unwrap_or_default();
        // An f8 dot's group, in flight through the copies ahead.
        if let Some(p) = std::mem::replace(&mut self.promotion, outer_promotion) {
            self.emit(Inst::WgmmaWait { pending: 0 });
            self.add_sums(&p.acc, &p.sums);
        }
        self.assign(&carried, &yields)?;
        if let Some(p) = &pipe {
            let n = self.next_stage(p.stage, p.stages);
            self.emit(Inst::Mov {
                dst: p.stage,
                src: n,
            });
            if let Some(t) = &p.tma {
                self.tma_next_phase(p, t);
            }
            if let Some(a) = &across {
                self.emit(Inst::Mov {
                    dst: a.started,
                    src: Operand::Int(1),
                });
            }
        }
        let code = self.blocks.pop().unwrap_or_default();
        let inner = std::mem::replace(&mut self.outer, enclosing);
        self.span = op.span;
        self.emit(Inst::For {
            iv,
            lo: lo_o,
            hi: hi_o,
            step: step_o,
            body: code,
        });
        if let Some(c) = inner.and_then(|o| o.crossing) {
            // The pipeline that ran across this loop: nothing is in flight
            // (copies go only to iterations that run).
            self.tma_epilogue(&c, true);
            self.buffered_loops -= 1;
            self.across_live -= 1;
        }
        if let Some((a, b)) = plan.wgmma {
            if self.wgmma.contains(&WgmmaDot { a, b }) {
                return self.unsupported("a wgmma dot that took another path");
            }
        }
        for v in &plan.invariant {
            self.pipeline.pipelined.remove(v);
        }
        self.wgmma_waited.retain(|d| !plan.wgmma_waited.contains(d));
        for key in &amd_staged {
            self.amd_invariant.remove(key);
        }
        if plan.wgmma.is_some() || plan.wgmma_waited.iter().any(|d| d.in_flight.is_some()) {
            // The last iteration's wgmma group, before its result is read.
            self.emit(Inst::WgmmaWait { pending: 0 });
        }
        if let Some(p) = pipe {
            // Copies for iterations that did not run; and the last
            // iteration's dots read their stages after the loop's last
            // barrier, so one more retires those reads for what follows.
            // (TMA copies only for iterations that run, all waited for.)
            if p.tma.is_none() {
                self.emit(Inst::CpAsyncWait { pending: 0 });
            }
            self.emit(Inst::Barrier);
            if let Some(t) = p.tma.as_ref().filter(|t| t.across.is_none()) {
                self.tma_epilogue(
                    &Crossing {
                        full: t.full,
                        empty: t.empty,
                        stages: p.stages,
                    },
                    false,
                );
            }
            for (load, _) in &p.loads {
                self.pipeline.pipelined_pending.remove(&load.value);
            }
        }
        if let Some(b) = invariant_bar {
            self.tma_invariant_done(b);
        }
        self.buffered_loops -= u32::from(buffered);
        for (r, c) in op.results.iter().zip(carried) {
            self.define(*r, c);
        }
        Ok(())
    }

    /// Moves `vals` into the fresh registers of `into` (an `if`'s merged
    /// results): no value of the branch reads them, so each is written
    /// directly, without the temporaries of a parallel copy.
    fn merge(&mut self, into: &[TV], vals: &[TV]) -> R<()> {
        for (dst, v) in into.iter().zip(vals) {
            let v = self.convert(v, &dst.layout)?;
            for (&d, &o) in dst.ops.iter().zip(&v.ops) {
                let r = d.reg().expect("merged registers");
                self.emit(Inst::Mov { dst: r, src: o });
            }
        }
        Ok(())
    }

    pub(super) fn while_loop(
        &mut self,
        op: &tile::Op,
        init: &[Value],
        cond: &tile::Region,
        body: &tile::Region,
    ) -> R<()> {
        let hint = self.yield_layouts(body, &[], init);
        let carried = self.carried(init, &hint, None)?;
        for (a, c) in cond.args.iter().zip(&carried) {
            self.define(*a, c.clone());
        }
        self.blocks.push(Vec::new());
        let y = self.region_ops(&cond.ops)?.unwrap_or_default();
        let p = match y.first() {
            Some(t) => self.materialize(RegTy::Pred, t.ops[0]),
            None => return self.unsupported("a `while` condition without a value"),
        };
        let cond_code = self.blocks.pop().unwrap_or_default();
        for (a, c) in body.args.iter().zip(&carried) {
            self.define(*a, c.clone());
        }
        self.blocks.push(Vec::new());
        let yields = self.region_ops(&body.ops)?.unwrap_or_default();
        self.assign(&carried, &yields)?;
        let body_code = self.blocks.pop().unwrap_or_default();
        self.span = op.span;
        self.emit(Inst::While {
            cond: cond_code,
            pred: p.reg().expect("reg"),
            body: body_code,
        });
        for (r, c) in op.results.iter().zip(carried) {
            self.define(*r, c);
        }
        Ok(())
    }

    pub(super) fn if_op(
        &mut self,
        op: &tile::Op,
        cond: Value,
        then: &tile::Region,
        otherwise: &tile::Region,
    ) -> R<()> {
        let c = self.scalar(cond);
        let c = self.materialize(RegTy::Pred, c).reg().expect("reg");
        self.blocks.push(Vec::new());
        let ty_then = self.region_ops(&then.ops)?.unwrap_or_default();
        let then_code = self.blocks.pop().unwrap_or_default();
        self.blocks.push(Vec::new());
        let ty_else = self.region_ops(&otherwise.ops)?.unwrap_or_default();
        let else_code = self.blocks.pop().unwrap_or_default();
        // The merged results: fresh registers in the then-branch's layouts,
        // or the else-branch's where the then-branch yields a splat (free in
        // any layout; a masked tile's all-masked branch yields one), so that
        // the other branch's tile is not moved through shared memory.
        let results: Vec<TV> = ty_then
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let from = match ty_else.get(i) {
                    Some(e) if self.is_splat(t) && !self.is_splat(e) => e,
                    _ => t,
                };
                TV {
                    ops: from
                        .ops
                        .iter()
                        .map(|_| Operand::Reg(self.new_reg(from.ty)))
                        .collect(),
                    ..from.clone()
                }
            })
            .collect();
        // The moves into them end each branch.
        self.blocks.push(then_code);
        self.merge(&results, &ty_then)?;
        let then_code = self.blocks.pop().unwrap_or_default();
        self.blocks.push(else_code);
        self.merge(&results, &ty_else)?;
        let else_code = self.blocks.pop().unwrap_or_default();
        self.span = op.span;
        self.emit(Inst::If {
            cond: c,
            then: then_code,
            otherwise: else_code,
        });
        for (r, t) in op.results.iter().zip(results) {
            self.define(*r, t);
        }
        Ok(())
    }
}

/// Whether `ops` (or a region nested in them) has a `dot`.
pub(super) fn has_dot(ops: &[tile::Op]) -> bool {
    ops.iter().any(|o| match &o.kind {
        OpKind::Dot { .. } => true,
        kind => kind.regions().iter().any(|r| has_dot(&r.ops)),
    })
}
