//! How the warps of a kernel's tensor-core dots split their results
//! ([`WarpOrder`]): rows first where a dot's result reaches an op that wants
//! each warp to hold whole rows (a reduction, another dot's operand, a
//! reshaping op), else the squarest warp tiles, which read the least operand
//! data per matrix instruction (a GEMM whose result is only scaled, biased,
//! activated and stored).
//!
//! One order for the whole kernel, so that dots that share a row count share
//! their row distribution too.

use std::collections::HashSet;

use crate::ir::target::layout::WarpOrder;
use crate::ir::tile::{OpKind, Region, Value};

/// The warp order of the dots in `body`.
pub(in crate::ir::target::lower) fn warp_order(body: &Region) -> WarpOrder {
    let mut from_dot = HashSet::new();
    // Carried values flow back into loop bodies: iterate to a fixed point
    // (each round only adds values, so this ends).
    loop {
        let before = from_dot.len();
        if needs_rows(body, &mut from_dot) {
            return WarpOrder::RowsFirst;
        }
        if from_dot.len() == before {
            return WarpOrder::Square;
        }
    }
}

/// Marks the values of `r` computed from a dot's result; true where one
/// reaches an op that wants whole rows in a warp.
fn needs_rows(r: &Region, from_dot: &mut HashSet<Value>) -> bool {
    for op in &r.ops {
        let marked = |v: &Value, s: &HashSet<Value>| s.contains(v);
        match &op.kind {
            OpKind::Dot { a, b, .. } => {
                if marked(a, from_dot) || marked(b, from_dot) {
                    return true;
                }
                from_dot.extend(op.results.iter().copied());
            }
            // Elementwise: the result takes a dot operand's layout.
            OpKind::Unary { .. }
            | OpKind::Cast { .. }
            | OpKind::Binary { .. }
            | OpKind::Select { .. } => {
                if op.kind.operands().iter().any(|v| marked(v, from_dot)) {
                    from_dot.extend(op.results.iter().copied());
                }
            }
            // A stored or accumulated value may have any layout; a load's
            // mask too.
            OpKind::Store { .. }
            | OpKind::AtomicAdd { .. }
            | OpKind::Load { .. }
            | OpKind::Yield(_) => {}
            OpKind::For { init, body, .. } => {
                let carried = body.args.get(1..).unwrap_or_default();
                carry(init, carried, from_dot);
                if needs_rows(body, from_dot) {
                    return true;
                }
                let ys = yields(body);
                carry(ys, carried, from_dot);
                carry(ys, &op.results, from_dot);
            }
            OpKind::While { init, cond, body } => {
                carry(init, &cond.args, from_dot);
                carry(init, &body.args, from_dot);
                if needs_rows(cond, from_dot) || needs_rows(body, from_dot) {
                    return true;
                }
                let ys = yields(body);
                carry(ys, &cond.args, from_dot);
                carry(ys, &body.args, from_dot);
                carry(ys, &op.results, from_dot);
            }
            OpKind::If {
                then, otherwise, ..
            } => {
                for r in [then, otherwise] {
                    if needs_rows(r, from_dot) {
                        return true;
                    }
                    carry(yields(r), &op.results, from_dot);
                }
            }
            // Reductions, reshapes and the rest: whole rows, if they read a
            // dot's result.
            kind => {
                if kind.operands().iter().any(|v| marked(v, from_dot)) {
                    return true;
                }
            }
        }
    }
    false
}

fn yields(r: &Region) -> &[Value] {
    match r.ops.last().map(|o| &o.kind) {
        Some(OpKind::Yield(ys)) => ys,
        _ => &[],
    }
}

/// Marks `to[i]` where `from[i]` is marked.
fn carry(from: &[Value], to: &[Value], from_dot: &mut HashSet<Value>) {
    for (f, t) in from.iter().zip(to) {
        if from_dot.contains(f) {
            from_dot.insert(*t);
        }
    }
}
