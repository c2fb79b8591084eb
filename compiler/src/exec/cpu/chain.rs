//! K loops whose `dot` is multiplied over several iterations at once.
//!
//! In `for k ...: acc = dot(load(A[.., k..]), load(B[k.., ..]), acc)` each
//! iteration's dot is one `BK`-deep slice, so the accumulator tile makes a
//! round trip through memory per iteration and every slice pays the dot's
//! fixed costs. When the loop body writes no memory, the dot's operands are
//! loads left to it as views ([`super::deferred`]), its accumulator is a
//! carried f32 value read by nothing else and its result is only yielded, a
//! program can instead collect the operand views of several iterations and
//! multiply them in one go ([`super::gemm::sdot_chain`]): the same products
//! added in the same order, so the same bits. The memory the views address
//! is unchanged until then, because nothing in the loop writes memory.
//! Whether an iteration actually joins the chain is decided when it runs
//! (both operands must have been left as views); otherwise the chain is
//! multiplied first and the dot runs as usual.

use std::collections::HashMap;

use super::deferred::{writes_memory, DeferredLoads};
use crate::check::DType;
use crate::ir::tile::{Kernel, Op, OpKind, Region, Value};

/// The dot of a chained loop.
#[derive(Clone, Copy, Debug)]
pub(super) struct ChainedDot {
    /// Its index in the loop body's ops.
    pub dot: usize,
    /// The position of its accumulator among the carried values.
    pub carried: usize,
}

pub(super) struct ChainedLoops {
    /// `for` ops (by address, stable for the launch) and their dot.
    loops: HashMap<usize, ChainedDot>,
}

impl ChainedLoops {
    pub(super) fn of(kernel: &Kernel, deferred: &DeferredLoads) -> ChainedLoops {
        let mut c = ChainedLoops {
            loops: HashMap::new(),
        };
        c.region(kernel, &kernel.body, deferred);
        c
    }

    /// No loop chained (the reference behaviour, for tests).
    #[cfg(test)]
    pub(super) fn none() -> ChainedLoops {
        ChainedLoops {
            loops: HashMap::new(),
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.loops.len()
    }

    pub(super) fn get(&self, op: &Op) -> Option<ChainedDot> {
        self.loops.get(&(op as *const Op as usize)).copied()
    }

    fn region(&mut self, k: &Kernel, r: &Region, deferred: &DeferredLoads) {
        for op in &r.ops {
            for nested in op.kind.regions() {
                self.region(k, nested, deferred);
            }
            if let OpKind::For { body, .. } = &op.kind {
                if let Some(c) = chained_dot(k, body, deferred) {
                    self.loops.insert(op as *const Op as usize, c);
                }
            }
        }
    }
}

fn chained_dot(k: &Kernel, body: &Region, deferred: &DeferredLoads) -> Option<ChainedDot> {
    if body.ops.iter().any(writes_memory) {
        return None;
    }
    let Some(OpKind::Yield(yielded)) = body.ops.last().map(|o| &o.kind) else {
        return None;
    };
    let defined_by = |v: Value| body.ops.iter().find(|o| o.results.contains(&v));
    let is_view_load = |v: Value| {
        defined_by(v).is_some_and(|o| matches!(o.kind, OpKind::Load { .. }) && deferred.contains(o))
    };
    let mut found = None;
    for (i, op) in body.ops.iter().enumerate() {
        let OpKind::Dot {
            a,
            b,
            acc: Some(acc),
            ..
        } = &op.kind
        else {
            continue;
        };
        // The carried value (arg 0 is the induction variable).
        let Some(j) = body.args.iter().skip(1).position(|x| x == acc) else {
            continue;
        };
        let res = op.results[0];
        let f32_tile = |v: Value| k.ty(v).dtype() == DType::F32;
        if yielded.get(j) == Some(&res)
            && uses(body, *acc) == 1
            && uses(body, res) == 1
            && f32_tile(res)
            && f32_tile(*acc)
            && is_view_load(*a)
            && is_view_load(*b)
        {
            if found.is_some() {
                // Two chainable dots: keep it simple, chain neither.
                return None;
            }
            found = Some(ChainedDot { dot: i, carried: j });
        }
    }
    found
}

/// Reads of `v` in `r`, nested regions included.
fn uses(r: &Region, v: Value) -> usize {
    r.ops
        .iter()
        .map(|o| {
            o.kind.operands().iter().filter(|x| **x == v).count()
                + o.kind.regions().iter().map(|n| uses(n, v)).sum::<usize>()
        })
        .sum()
}
