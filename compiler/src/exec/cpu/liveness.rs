//! Where each value of a kernel is used for the last time, so that a program
//! can drop a tile as soon as it is dead: the memory is freed early and an op
//! whose input dies with it (a `dot`'s accumulator in a K loop) can reuse that
//! input's buffer instead of copying it.

use std::collections::HashMap;

use crate::ir::tile::{Kernel, Op, Region, Value};

/// Per op (by address, stable for the launch), the values of its own region
/// that are not read after it: by a later op of the region, or a nested one.
pub(super) struct Liveness {
    dying: HashMap<usize, Vec<Value>>,
}

impl Liveness {
    pub(super) fn of(kernel: &Kernel) -> Liveness {
        let mut l = Liveness {
            dying: HashMap::new(),
        };
        l.region(&kernel.body);
        l
    }

    /// The values dead once `op` has run.
    pub(super) fn dying(&self, op: &Op) -> &[Value] {
        self.dying
            .get(&(op as *const Op as usize))
            .map_or(&[], |v| v.as_slice())
    }

    fn region(&mut self, r: &Region) {
        // Last op (index) reading each value, nested regions included.
        let mut last: HashMap<Value, usize> = HashMap::new();
        for (i, op) in r.ops.iter().enumerate() {
            deep_uses(op, &mut |v| {
                last.insert(v, i);
            });
            for nested in op.kind.regions() {
                self.region(nested);
            }
        }
        // Only values defined by this region die in it: one defined outside a
        // loop body is read again by the next iteration.
        let defined = r
            .args
            .iter()
            .copied()
            .chain(r.ops.iter().flat_map(|op| op.results.iter().copied()));
        for v in defined {
            if let Some(&i) = last.get(&v) {
                self.dying
                    .entry(&r.ops[i] as *const Op as usize)
                    .or_default()
                    .push(v);
            }
        }
    }
}

fn deep_uses(op: &Op, f: &mut impl FnMut(Value)) {
    for v in op.kind.operands() {
        f(v);
    }
    for r in op.kind.regions() {
        for inner in &r.ops {
            deep_uses(inner, f);
        }
    }
}
