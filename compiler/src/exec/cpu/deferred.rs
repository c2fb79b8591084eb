//! Loads that a `dot` can read from tensor memory itself.
//!
//! A K loop `acc = dot(load(A[...]), load(B[...]), acc)` would otherwise copy
//! both tiles into buffers, only for the dot to copy them again into its
//! packed panels. A load whose result is read by nothing but the `a`/`b`
//! operands of `dot` ops later in the same region, with no store or atomic
//! (of any tensor, nested regions included) in between, can instead be kept
//! as a view of the tensor and packed by the dot straight from memory: the
//! memory it would have read is unchanged by then, so the values are the same.
//! Whether a load is actually deferred is decided when it runs (see
//! `Program::deferred_load`): the view must be an f32/f16/bf16 2-d tile whose
//! mask, if any, is all set.

use std::collections::{HashMap, HashSet};

use crate::ir::tile::{Access, Kernel, Op, OpKind, Region, Value};

pub(super) struct DeferredLoads {
    /// The load ops (by address, stable for the launch).
    ops: HashSet<usize>,
}

impl DeferredLoads {
    pub(super) fn of(kernel: &Kernel) -> DeferredLoads {
        let mut uses = HashMap::new();
        count_uses(&kernel.body, &mut uses);
        let mut d = DeferredLoads {
            ops: HashSet::new(),
        };
        d.region(&kernel.body, &uses);
        d
    }

    /// No load deferred (the reference behaviour, for tests).
    #[cfg(test)]
    pub(super) fn none() -> DeferredLoads {
        DeferredLoads {
            ops: HashSet::new(),
        }
    }

    /// How many loads may be deferred.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.ops.len()
    }

    pub(super) fn contains(&self, op: &Op) -> bool {
        self.ops.contains(&(op as *const Op as usize))
    }

    fn region(&mut self, r: &Region, uses: &HashMap<Value, usize>) {
        for (i, op) in r.ops.iter().enumerate() {
            for nested in op.kind.regions() {
                self.region(nested, uses);
            }
            // A gather is read element by element: never a view.
            let window =
                matches!(&op.kind, OpKind::Load { access, .. } if !Access::is_gather(access));
            if !window || op.results.len() != 1 {
                continue;
            }
            let v = op.results[0];
            let total = uses.get(&v).copied().unwrap_or(0);
            if total == 0 {
                continue;
            }
            // Walk forward until every use is accounted for by a dot operand.
            let mut seen = 0;
            for later in &r.ops[i + 1..] {
                if writes_memory(later) {
                    break;
                }
                let (dot_uses, other_use) = match &later.kind {
                    OpKind::Dot { a, b, acc, .. } => {
                        ((*a == v) as usize + (*b == v) as usize, *acc == Some(v))
                    }
                    k => (0, k.operands().contains(&v)),
                };
                if other_use || reads_in_nested(later, v) {
                    // Read by something other than a dot's `a`/`b`.
                    break;
                }
                seen += dot_uses;
                if seen == total {
                    self.ops.insert(op as *const Op as usize);
                    break;
                }
            }
        }
    }
}

fn count_uses(r: &Region, uses: &mut HashMap<Value, usize>) {
    for op in &r.ops {
        for v in op.kind.operands() {
            *uses.entry(v).or_default() += 1;
        }
        for nested in op.kind.regions() {
            count_uses(nested, uses);
        }
    }
}

pub(super) fn writes_memory(op: &Op) -> bool {
    matches!(op.kind, OpKind::Store { .. } | OpKind::AtomicAdd { .. })
        || op
            .kind
            .regions()
            .iter()
            .any(|r| r.ops.iter().any(writes_memory))
}

fn reads_in_nested(op: &Op, v: Value) -> bool {
    op.kind.regions().iter().any(|r| {
        r.ops
            .iter()
            .any(|o| o.kind.operands().contains(&v) || reads_in_nested(o, v))
    })
}
