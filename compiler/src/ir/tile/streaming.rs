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

use super::{Kernel, OpKind, Region, Value};

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
        let mut candidates = read.clone();
        // An atomic add reads what it writes: its tensor's stores stay plain.
        atomics_in(&self.body, &mut |t| {
            read.insert(t);
        });
        let mut s = Streaming::default();
        candidates.retain(|t| read.contains(t));
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
            stores_in(&self.body, &mut |t| {
                if !read.contains(&t) {
                    s.stores.insert(t);
                }
            });
        }
        s
    }
}

/// Whether `op` (or an op nested in it) loads `tensor`.
fn reads(op: &super::Op, tensor: usize) -> bool {
    if let OpKind::Load { tensor: t, .. } = op.kind {
        return t == tensor;
    }
    let mut found = false;
    for region in op.kind.regions() {
        loads_in(region, &mut |t, _| found |= t == tensor);
    }
    found
}

/// Calls `f(tensor, result)` for every load in `region`, nested ones too.
fn loads_in(region: &Region, f: &mut impl FnMut(usize, Value)) {
    for op in &region.ops {
        if let OpKind::Load { tensor, .. } = op.kind {
            f(tensor, op.results[0]);
        }
        for nested in op.kind.regions() {
            loads_in(nested, f);
        }
    }
}

/// Calls `f(tensor)` for every store in `region`, nested ones too.
fn stores_in(region: &Region, f: &mut impl FnMut(usize)) {
    for op in &region.ops {
        if let OpKind::Store { tensor, .. } = op.kind {
            f(tensor);
        }
        for nested in op.kind.regions() {
            stores_in(nested, f);
        }
    }
}

/// Calls `f(tensor)` for every atomic add in `region`, nested ones too.
fn atomics_in(region: &Region, f: &mut impl FnMut(usize)) {
    for op in &region.ops {
        if let OpKind::AtomicAdd { tensor, .. } = op.kind {
            f(tensor);
        }
        for nested in op.kind.regions() {
            atomics_in(nested, f);
        }
    }
}
