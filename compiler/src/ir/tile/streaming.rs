//! Accesses whose bytes a multi-pass kernel does not touch again.
//!
//! A kernel that reads a tensor in two loops one after the other (a long
//! row's statistics pass, then its normalising pass) wants the first pass's
//! bytes to be in L2 when the second reads them. Whatever else streams
//! through the caches meanwhile evicts them: the second pass's own reads
//! (their last) and the kernel's stores to tensors it never reads. Those are
//! marked, and Target IR gives them PTX's `.cs` (cache streaming, evict
//! first). Only kernels with such a re-read are touched, and the marks are
//! hints: the results do not change.
//!
//! On an H200 (a long-row softmax, 4096 x 65536 bf16, `.ptx` variants of the
//! generated kernel, ÷ a device copy): 16 elements a thread 0.68 → 0.91
//! with both hints (0.82 with the loads' alone, 0.70-0.74 with the
//! stores'), 32 a thread 0.77-0.81 → 0.79-0.84.

use std::collections::HashSet;

use super::{Kernel, Op, OpKind, Region, Value};

/// The accesses of a kernel whose bytes it does not touch again.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Streaming {
    /// Loads (by result) in the last of two or more top-level loops reading
    /// their tensor, with nothing reading it after that loop.
    pub loads: HashSet<Value>,
    /// Tensor parameters the kernel stores to and never reads (only where
    /// `loads` is not empty).
    pub stores: HashSet<usize>,
}

impl Kernel {
    /// The accesses to mark (module doc).
    pub fn streaming(&self) -> Streaming {
        let mut read = HashSet::new();
        loads_in(&self.body, &mut |t, _| {
            read.insert(t);
        });
        let candidates = read.clone();
        // An atomic add reads what it writes: its tensor's stores stay plain.
        each_op(&self.body, &mut |op| {
            if let OpKind::AtomicAdd { tensor, .. } = op.kind {
                read.insert(tensor);
            }
        });
        let mut s = Streaming::default();
        for &tensor in &candidates {
            // Top-level ops reading `tensor`, and whether each is a loop.
            let readers: Vec<(usize, bool)> = self
                .body
                .ops
                .iter()
                .enumerate()
                .filter(|(_, op)| reads(op, tensor))
                .map(|(i, op)| (i, matches!(op.kind, OpKind::For { .. })))
                .collect();
            let loops = readers.iter().filter(|(_, is_loop)| *is_loop).count();
            let Some(&(last, true)) = readers.last() else {
                continue;
            };
            if loops < 2 {
                continue;
            }
            let op = &self.body.ops[last];
            for region in op.kind.regions() {
                loads_in(region, &mut |t, v| {
                    if t == tensor {
                        s.loads.insert(v);
                    }
                });
            }
        }
        if !s.loads.is_empty() {
            each_op(&self.body, &mut |op| {
                if let OpKind::Store { tensor, .. } = op.kind {
                    if !read.contains(&tensor) {
                        s.stores.insert(tensor);
                    }
                }
            });
        }
        s
    }
}

/// Whether `op` (or an op nested in it) loads `tensor`.
fn reads(op: &Op, tensor: usize) -> bool {
    let mut found = matches!(op.kind, OpKind::Load { tensor: t, .. } if t == tensor);
    for region in op.kind.regions() {
        loads_in(region, &mut |t, _| found |= t == tensor);
    }
    found
}

/// Calls `f(tensor, result)` for every load in `region`, nested ones too.
fn loads_in(region: &Region, f: &mut impl FnMut(usize, Value)) {
    each_op(region, &mut |op| {
        if let OpKind::Load { tensor, .. } = op.kind {
            f(tensor, op.results[0]);
        }
    });
}

/// Calls `f` on every op of `region`, nested ones too.
fn each_op(region: &Region, f: &mut impl FnMut(&Op)) {
    for op in &region.ops {
        f(op);
        for nested in op.kind.regions() {
            each_op(nested, f);
        }
    }
}
