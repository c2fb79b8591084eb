//! The per-op dispatch: lowers a Tile IR region op by op, defining each
//! result value (`define`) before the next op reads it. Ops that only
//! re-label a layout (`ExpandDims`, `Transpose`) or replicate a value
//! (`Splat`) emit no instructions; everything else is handed to the file of
//! its concern (`elementwise`, `memory`, `reduce`, `dot_fma`, `control`).
//!
//! Integer scalars carry a known divisor (`Lower::div`) through constants,
//! `+`, `-`, `*` and casts: the alignment proofs for vector loads and async
//! copies start from it.

use std::collections::HashMap;
use std::rc::Rc;

use super::{const_operand, gcd, round_const, Lower, R, TV};
use crate::check::DType;
use crate::ir::target::{BinOp, Inst, Operand, RegTy, Special};
use crate::ir::tile::{self, BinaryOp, Constant, OpKind, ReduceOp, UnaryOp};

impl<'a> Lower<'a> {
    pub(super) fn region_ops(&mut self, ops: &[tile::Op]) -> R<Option<Vec<TV>>> {
        self.differences.clear();
        let yielded = self.straight_line_ops(ops);
        self.differences.clear();
        yielded
    }

    fn straight_line_ops(&mut self, ops: &[tile::Op]) -> R<Option<Vec<TV>>> {
        for op in ops {
            self.span = op.span;
            if let OpKind::Yield(vs) = &op.kind {
                return Ok(Some(vs.iter().map(|v| self.val(*v)).collect()));
            }
            self.op(op)?;
            self.check_size()?;
        }
        Ok(None)
    }

    pub(super) fn op(&mut self, op: &tile::Op) -> R<()> {
        crate::cancel::checkpoint();
        let tk = self.tk;
        let res = |i: usize| op.results[i];
        self.stream_access = match &op.kind {
            OpKind::Load { .. } => self.streaming.loads.contains(&res(0)),
            OpKind::Store { tensor, .. } => self.streaming.stores.contains(tensor),
            _ => false,
        };
        match &op.kind {
            OpKind::Arange { .. } | OpKind::ExpandDims { .. } | OpKind::Broadcast { .. } => {
                self.index_ops.insert(res(0), op.kind.clone());
            }
            OpKind::Binary { .. }
                if tk.ty(res(0)).dtype().is_int() || tk.ty(res(0)).dtype() == DType::Bool =>
            {
                self.index_ops.insert(res(0), op.kind.clone());
            }
            _ => {}
        }
        match &op.kind {
            OpKind::Const(c) => {
                let d = tk.ty(res(0)).dtype();
                let ty = self.cty(d)?;
                let mut o = const_operand(*c, d);
                if let Operand::Float(f) = o {
                    o = Operand::Float(round_const(f, d));
                }
                if let (Constant::Int(n), true) = (c, d.is_int()) {
                    self.div
                        .insert(res(0), if *n == 0 { 1 << 30 } else { n.unsigned_abs() });
                }
                let o = if ty == RegTy::Pred {
                    self.materialize(ty, o)
                } else {
                    o
                };
                let tv = self.scalar_tv(o, ty, d);
                self.define(res(0), tv);
            }
            OpKind::ProgramId(a) | OpKind::NumPrograms(a) => {
                let dst = self.new_reg(RegTy::I32);
                let which = if matches!(op.kind, OpKind::ProgramId(_)) {
                    Special::BlockId(*a)
                } else {
                    Special::NumBlocks(*a)
                };
                self.emit(Inst::Special { dst, which });
                let tv = self.scalar_tv(Operand::Reg(dst), RegTy::I32, DType::I32);
                self.define(res(0), tv);
            }
            OpKind::TensorDim { param, axis } => {
                let t = self.tensor(*param)?;
                let o = t.dims[*axis];
                self.div.insert(res(0), t.dim_div[*axis].max(1));
                let tv = self.scalar_tv(o, RegTy::I32, DType::I32);
                self.define(res(0), tv);
            }
            OpKind::ScalarParam(i) => {
                let Some((r, d)) = self.scalars.get(*i).copied().flatten() else {
                    return self.unsupported("this scalar parameter");
                };
                let ty = self.cty(d)?;
                let name = &tk.params[*i].name;
                if let Some(&(_, k)) = tk.divisibility.iter().find(|(n, _)| n == name) {
                    if d.is_int() {
                        self.div.insert(res(0), k);
                    }
                }
                let tv = self.scalar_tv(Operand::Reg(r), ty, d);
                self.define(res(0), tv);
            }
            OpKind::Unary { op: u, x } => {
                let x = self.val(*x);
                if *u == UnaryOp::Exp {
                    if let Some(ops) = self.exp_of_differences(&x) {
                        let tv = TV { ops, ..x };
                        self.define(res(0), tv);
                        return Ok(());
                    }
                }
                let mut ops = Vec::with_capacity(x.ops.len());
                let mut seen = SlotMemo::default();
                for &o in &x.ops {
                    ops.push(seen.get_or_insert_with(&[o], || {
                        let v = self.unary(*u, x.ty, x.dtype, o)?;
                        Ok(self.round_to_storage(v, x.dtype))
                    })?);
                }
                let tv = TV { ops, ..x };
                self.define(res(0), tv);
            }
            OpKind::Binary {
                op: b,
                a: av,
                b: bv,
            } => {
                // In `b`'s layout when `a` is a splat (free in any layout)
                // and `b` is not: `1.0 / row_sum` needs no exchange.
                let (a, bt) = match (self.val(*av), self.val(*bv)) {
                    (a, b) if self.is_splat(&a) && !self.is_splat(&b) => {
                        (self.convert(&a, &b.layout)?, b)
                    }
                    (a, _) => {
                        let bt = self.val_in(*bv, &a.layout)?;
                        (a, bt)
                    }
                };
                let mut ops = Vec::with_capacity(a.ops.len());
                let difference = *b == BinaryOp::Sub && a.dtype == DType::F32;
                let mut seen = SlotMemo::default();
                for (&x, &y) in a.ops.iter().zip(&bt.ops) {
                    ops.push(seen.get_or_insert_with(&[x, y], || {
                        let v = self.binary(*b, a.ty, a.dtype, x, y)?;
                        if let (true, Operand::Reg(r)) = (difference, v) {
                            self.differences.insert(r, (x, y));
                        }
                        Ok(if b.is_comparison() {
                            v
                        } else {
                            self.round_to_storage(v, a.dtype)
                        })
                    })?);
                }
                if a.layout.shape.is_empty() && a.dtype.is_int() {
                    let (da, db) = (self.divisor_or_constant(*av), self.divisor_or_constant(*bv));
                    let d = match b {
                        BinaryOp::Mul => da.saturating_mul(db).min(1 << 30),
                        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Min | BinaryOp::Max => {
                            gcd(da, db)
                        }
                        _ => 1,
                    };
                    self.div.insert(res(0), d);
                    if *b == BinaryOp::Min {
                        self.mins.insert(res(0), (*av, *bv));
                    }
                }
                let ty = if b.is_comparison() { RegTy::Pred } else { a.ty };
                let dtype = tk.ty(res(0)).dtype();
                let tv = TV {
                    layout: a.layout.clone(),
                    ops,
                    ty,
                    dtype,
                };
                self.define(res(0), tv);
            }
            OpKind::Select { cond, a, b } => {
                // In the layout of the first operand that is not a splat
                // (a splat is free in any layout).
                let layout = [*a, *b, *cond]
                    .into_iter()
                    .map(|v| self.val(v))
                    .find(|t| !self.is_splat(t))
                    .map(|t| t.layout);
                let a = match layout {
                    Some(l) => self.val_in(*a, &l)?,
                    None => self.val(*a),
                };
                let c = self.val_in(*cond, &a.layout)?;
                let bt = self.val_in(*b, &a.layout)?;
                let mut ops = Vec::new();
                let mut seen = SlotMemo::default();
                for i in 0..a.ops.len() {
                    let [cond, x, y] = [c.ops[i], a.ops[i], bt.ops[i]];
                    ops.push(seen.get_or_insert_with(&[cond, x, y], || {
                        R::Ok(self.select(a.ty, cond, x, y))
                    })?);
                }
                let tv = TV { ops, ..a };
                self.define(res(0), tv);
            }
            OpKind::Cast { x: xv, to } => {
                let x = self.val(*xv);
                let ty = self.cty(*to)?;
                let mut ops = Vec::new();
                for &o in &x.ops {
                    ops.push(self.cast(o, x.ty, x.dtype, ty, *to)?);
                }
                if x.layout.shape.is_empty() && x.dtype.is_int() && to.is_int() {
                    let d = self.divisor(*xv);
                    self.div.insert(res(0), d);
                }
                let tv = TV {
                    layout: x.layout,
                    ops,
                    ty,
                    dtype: *to,
                };
                self.define(res(0), tv);
            }
            OpKind::Splat { x, shape } => {
                let x = self.val(*x);
                let layout = self.blocked(shape);
                let tv = TV {
                    ops: vec![x.ops[0]; layout.num_slots()],
                    layout,
                    ty: x.ty,
                    dtype: x.dtype,
                };
                self.define(res(0), tv);
            }
            OpKind::Broadcast { x, shape } => {
                let x = self.val(*x);
                // Into the newest layout of that shape the tile already fits
                // (e.g. a row statistic back into the mma layout it came from).
                let to = self
                    .seen
                    .iter()
                    .rev()
                    .find(|l| l.shape == *shape && x.layout.register_map_to(l).is_some())
                    .cloned()
                    .unwrap_or_else(|| self.blocked(shape));
                let tv = self.broadcast(&x, &to)?;
                self.define(res(0), tv);
            }
            OpKind::ExpandDims { x, axis } => {
                let x = self.val(*x);
                let tv = TV {
                    layout: Rc::new(x.layout.expand(*axis)),
                    ..x
                };
                self.define(res(0), tv);
            }
            OpKind::Transpose { x } => {
                if let Some((d, t)) = self.pipeline.deferred.get(x).cloned() {
                    self.pipeline.deferred.insert(res(0), (d, !t));
                }
                if let Some((p, t)) = self.pipeline.pipelined.get(x).copied() {
                    self.pipeline.pipelined.insert(res(0), (p, !t));
                }
                let x = self.val(*x);
                let tv = TV {
                    layout: Rc::new(x.layout.transpose()),
                    ..x
                };
                self.define(res(0), tv);
            }
            OpKind::Extract {
                x,
                axis,
                start,
                len,
                drop,
            } => {
                let xv = self.val(*x);
                let shape = self.tk.ty(res(0)).shape().to_vec();
                let to = self.blocked(&shape);
                let src_axis: Vec<usize> = (0..shape.len())
                    .map(|r| if *drop && r >= *axis { r + 1 } else { r })
                    .collect();
                let mut offset = vec![0; xv.layout.rank()];
                offset[*axis] = *start;
                // A uniform tile (a splat) stays one value.
                if self.is_splat(&xv) {
                    let tv = TV {
                        ops: vec![xv.ops[0]; to.num_slots()],
                        layout: to,
                        ..xv
                    };
                    self.define(res(0), tv);
                    return Ok(());
                }
                self.emit(Inst::Comment(format!(
                    "extract axis {axis} {start} : +{len} {} -> {}",
                    xv.layout, to
                )));
                let tv = self.exchange(&xv, &to, &src_axis, &offset)?;
                self.define(res(0), tv);
            }
            OpKind::Arange { start, len } => {
                let s = self.scalar(*start);
                let layout = self.blocked(&[*len]);
                let b = self.base(&layout.terms[0].clone());
                let sb = self.bin(BinOp::Add, RegTy::I32, s, b);
                let sb = self.materialize(RegTy::I32, sb);
                let mut ops = Vec::new();
                for slot in layout.slots.clone() {
                    ops.push(self.bin(BinOp::Add, RegTy::I32, sb, Operand::Int(slot[0] as i64)));
                }
                let tv = TV {
                    layout,
                    ops,
                    ty: RegTy::I32,
                    dtype: DType::I32,
                };
                self.define(res(0), tv);
            }
            OpKind::Load {
                tensor,
                access,
                mask,
                other,
            } => {
                let tv = self.load(res(0), *tensor, access, *mask, *other)?;
                self.define(res(0), tv);
            }
            OpKind::Store {
                tensor,
                access,
                value,
                mask,
            } => self.store(*tensor, access, *value, *mask, false)?,
            OpKind::AtomicAdd {
                tensor,
                access,
                value,
                mask,
            } => self.store(*tensor, access, *value, *mask, true)?,
            OpKind::Dot {
                a,
                b,
                acc,
                precision,
            } => {
                let tv = self.dot(res(0), *a, *b, *acc, *precision)?;
                self.define(res(0), tv);
            }
            OpKind::Reduce {
                op: r,
                x,
                axis,
                keepdims,
            } => {
                let x = self.val(*x);
                let mut tv = self.reduce(*r, &x, *axis, *keepdims)?;
                if *r == ReduceOp::Sum {
                    let ops = std::mem::take(&mut tv.ops);
                    tv.ops = ops
                        .into_iter()
                        .map(|v| self.round_to_storage(v, x.dtype))
                        .collect();
                }
                self.define(res(0), tv);
            }
            OpKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => self.for_loop(op, *lo, *hi, *step, init, body)?,
            OpKind::While { init, cond, body } => self.while_loop(op, init, cond, body)?,
            OpKind::If {
                cond,
                then,
                otherwise,
            } => self.if_op(op, *cond, then, otherwise)?,
            OpKind::Yield(_) => unreachable!("handled by region_ops"),
        }
        Ok(())
    }
}

/// The results of an elementwise op by its operands, within one tile: slots
/// whose operands are the same registers or constants (a splat, a column
/// mask's compare repeated for each row a thread holds) share one result
/// register instead of computing it again. Slots may share registers (a
/// splat's do), and nothing writes a tile's registers in place.
#[derive(Default)]
pub(super) struct SlotMemo(HashMap<Vec<(u8, u64)>, Operand>);

impl SlotMemo {
    fn key(ops: &[Operand]) -> Vec<(u8, u64)> {
        ops.iter()
            .map(|o| match *o {
                Operand::Reg(r) => (0, r.0 as u64),
                Operand::Int(i) => (1, i as u64),
                Operand::Float(f) => (2, f.to_bits()),
            })
            .collect()
    }

    /// The result for `ops`: the one computed for an earlier slot, else
    /// `compute`'s, kept for the slots after.
    pub(super) fn get_or_insert_with<E>(
        &mut self,
        ops: &[Operand],
        compute: impl FnOnce() -> Result<Operand, E>,
    ) -> Result<Operand, E> {
        let key = Self::key(ops);
        if let Some(&v) = self.0.get(&key) {
            return Ok(v);
        }
        let v = compute()?;
        self.0.insert(key, v);
        Ok(v)
    }
}
