//! The in-bounds fast path of a global access: when a tile's bounds cannot be
//! decided at compile time, one uniform check — the tile's index on every
//! point axis below its dim, its range `[start, start + len)` within the dim
//! on every range axis — branches to an access without any per-element
//! predicate (and with vectors that need no divisor of the dim, since none
//! can straddle the end); only a tile that reaches past the end (the last
//! program of a ragged shape) takes the predicated access, which keeps its
//! masks exact.
//!
//! The operands of the check are scalars, uniform over the block, so the
//! branch never diverges. A gather, a user mask or an atomic keeps the
//! predicated access alone, and so does a tile whose only run-time bounds
//! are point indices (one uniform predicate for all its elements), or a
//! tile that gives a thread few elements (see `MIN_SLOTS`).

use super::{Lower, R};
use crate::ir::target::layout::Layout;
use crate::ir::target::{BinOp, CmpOp, Inst, Operand, Reg, RegTy};
use crate::ir::tile::Access;

use super::memory::AccessPlan;

/// The fewest elements a thread must access for a tile to take the fast
/// path (four 16-byte vectors of bf16, eight of f32): a row of 4096 over
/// 128 threads. Below it the predicates cost little, and the branch costs
/// more than it saves: in a `for` body it makes a short body too long for
/// ptxas to unroll by four (four iterations' loads in flight,
/// `UNROLL_BY_FOUR_MAX_INSTS`), and the register estimate does not follow
/// ptxas on small tiles with it (an f32 ReLU of 8 elements a thread: ptxas
/// 17 registers, estimated 23; a 1024-element f16 tile on 2 warps: 25, 39).
const MIN_SLOTS: usize = 32;

impl<'a> Lower<'a> {
    /// The predicate "the whole tile is in bounds", or `None` where no
    /// branch is wanted: the bounds are decided statically (every element in
    /// bounds, so the plan has no predicates; or some element provably out,
    /// so the check would always fail), the access is a gather, or a thread
    /// accesses fewer than `MIN_SLOTS` elements.
    fn in_bounds_check(
        &mut self,
        tensor: usize,
        access: &[Access],
        layout: &Layout,
    ) -> R<Option<Reg>> {
        if Access::is_gather(access) || layout.num_slots() < MIN_SLOTS {
            return Ok(None);
        }
        let t = self.tensor(tensor)?;
        let (dims, static_dims) = (t.dims.clone(), t.static_dims.clone());
        // (tensor axis, index or start, length): the axes to check at run time.
        let mut checks = Vec::new();
        for (a, acc) in access.iter().enumerate() {
            let (idx, len) = match acc {
                Access::Point(v) => (self.scalar(*v), 1u64),
                Access::Range { start, len } => (self.scalar(*start), *len as u64),
                Access::Gather(_) => return Ok(None),
            };
            match (idx, static_dims[a]) {
                (Operand::Int(i), Some(n)) if i >= 0 && i as u64 + len <= n => {}
                (Operand::Int(i), Some(n)) if i < 0 || i as u64 + len > n => return Ok(None),
                _ => checks.push((a, idx, len as i64, matches!(acc, Access::Range { .. }))),
            }
        }
        // Points alone give every element of the tile the same predicate: one
        // uniform predicate already, and vectors of full width.
        if !checks.iter().any(|c| c.3) {
            return Ok(None);
        }
        let mut preds = Vec::new();
        for (a, idx, len, _) in checks {
            // Signed: 0 <= idx and idx <= dim - len (dims are below 2^31).
            if !matches!(idx, Operand::Int(i) if i >= 0) {
                preds.push(self.cmp(CmpOp::Ge, RegTy::I32, idx, Operand::Int(0)));
            }
            let limit = match dims[a] {
                Operand::Int(n) => Operand::Int(n - len),
                dim => self.bin(BinOp::Sub, RegTy::I32, dim, Operand::Int(len)),
            };
            let idx = self.materialize(RegTy::I32, idx);
            preds.push(self.cmp(CmpOp::Le, RegTy::I32, idx, limit));
        }
        let p = self.and_preds(&preds);
        Ok(self.pred_reg(p))
    }

    /// Runs `access` (which emits an access by the plan it is given and
    /// returns its values, of type `ty`) once: on a plan with bounds
    /// predicates where they are decided statically, else twice under a
    /// branch on `in_bounds_check` — unpredicated in the fast path,
    /// predicated in the other — with the values merged after it.
    pub(super) fn in_bounds_or_not(
        &mut self,
        tensor: usize,
        access: &[Access],
        layout: &Layout,
        ty: RegTy,
        mut emit: impl FnMut(&mut Self, &AccessPlan) -> R<Vec<Operand>>,
    ) -> R<Vec<Operand>> {
        let Some(cond) = self.in_bounds_check(tensor, access, layout)? else {
            let plan = self.plan_access(tensor, access, layout, false, true)?;
            return emit(self, &plan);
        };
        let mut merged: Vec<Reg> = Vec::new();
        let mut branches = Vec::new();
        for in_bounds in [true, false] {
            self.blocks.push(Vec::new());
            let plan = self.plan_access(tensor, access, layout, in_bounds, true)?;
            let vals = emit(self, &plan)?;
            if merged.is_empty() {
                merged = vals.iter().map(|_| self.new_reg(ty)).collect();
            }
            for (&m, &v) in merged.iter().zip(&vals) {
                self.emit(Inst::Mov { dst: m, src: v });
            }
            branches.push(self.blocks.pop().unwrap_or_default());
        }
        let otherwise = branches.pop().unwrap_or_default();
        let then = branches.pop().unwrap_or_default();
        self.emit(Inst::If {
            cond,
            then,
            otherwise,
        });
        Ok(merged.into_iter().map(Operand::Reg).collect())
    }
}
