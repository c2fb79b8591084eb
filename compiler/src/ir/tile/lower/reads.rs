//! Liveness: which names the kernel reads where ([`Reads`], built once per
//! kernel) and the names read after a point of it ([`Live`]), so that loops
//! carry, and `if`s merge, only the variables read later.

use std::collections::{HashMap, HashSet};

use super::work;
use crate::syntax::ast::{Expr, ExprKind, Index, Stmt, StmtKind};

/// Every name read by an expression.
fn expr_reads(e: &Expr, out: &mut HashSet<String>) {
    work(1);
    match &e.kind {
        ExprKind::Name(id) => {
            out.insert(id.name.clone());
        }
        ExprKind::Unary { operand, .. } => expr_reads(operand, out),
        ExprKind::Binary { lhs, rhs, .. } => {
            expr_reads(lhs, out);
            expr_reads(rhs, out);
        }
        ExprKind::IfElse {
            cond,
            then,
            otherwise,
        } => {
            expr_reads(cond, out);
            expr_reads(then, out);
            expr_reads(otherwise, out);
        }
        ExprKind::Call { func, args } => {
            expr_reads(func, out);
            for a in args {
                expr_reads(&a.value, out);
            }
        }
        ExprKind::Subscript { value, indices } => {
            expr_reads(value, out);
            for i in indices {
                match i {
                    Index::Expr(e) => expr_reads(e, out),
                    Index::Slice {
                        start, end, step, ..
                    } => {
                        for e in [start, end, step].into_iter().flatten() {
                            expr_reads(e, out);
                        }
                    }
                }
            }
        }
        ExprKind::Attribute { value, .. } => expr_reads(value, out),
        ExprKind::Tuple(v) | ExprKind::List(v) => v.iter().for_each(|x| expr_reads(x, out)),
        ExprKind::Dict(v) => v.iter().for_each(|(a, b)| {
            expr_reads(a, out);
            expr_reads(b, out);
        }),
        _ => {}
    }
}

/// The names a statement reads itself, its nested blocks left out (targets of
/// plain assignments are not reads).
fn own_reads(s: &Stmt, out: &mut HashSet<String>) {
    match &s.kind {
        StmtKind::Expr(e) | StmtKind::Return(Some(e)) => expr_reads(e, out),
        StmtKind::Assign { target, value, .. } => {
            expr_reads(value, out);
            if !matches!(target.kind, ExprKind::Name(_) | ExprKind::Tuple(_)) {
                expr_reads(target, out);
            }
        }
        StmtKind::AugAssign { target, value, .. } => {
            expr_reads(target, out);
            expr_reads(value, out);
        }
        StmtKind::If { branches, .. } => {
            for (c, _) in branches {
                expr_reads(c, out);
            }
        }
        StmtKind::For { iter, .. } => expr_reads(iter, out),
        StmtKind::While { cond, .. } => expr_reads(cond, out),
        _ => {}
    }
}

/// The blocks nested in a statement, in source order.
fn nested_blocks(s: &Stmt) -> Vec<&[Stmt]> {
    match &s.kind {
        StmtKind::If { branches, orelse } => branches
            .iter()
            .map(|(_, b)| b.as_slice())
            .chain(orelse.as_deref())
            .collect(),
        StmtKind::For { body, .. } | StmtKind::While { body, .. } => vec![body],
        _ => Vec::new(),
    }
}

/// Which names a kernel reads where, built once so that liveness is a lookup.
/// Statements are numbered in source order, each before the statements nested
/// in it; then the rest of any block, and a whole loop body, is one range of
/// positions, and a name is read there if one of its positions is in it.
/// (Asking each statement for the reads of the rest of its block would cost
/// the square of a long kernel's length.)
#[derive(Default)]
pub(super) struct Reads {
    /// A statement's address: its position and the end of its nested ones.
    at: HashMap<usize, (u32, u32)>,
    /// Each name: the positions of the statements reading it, ascending.
    by_name: HashMap<String, Vec<u32>>,
}

impl Reads {
    pub(super) fn new(body: &[Stmt]) -> Reads {
        let mut r = Reads::default();
        let mut next = 0;
        // An explicit stack: nesting may be thousands of blocks deep.
        let mut stack: Vec<(&Stmt, bool)> = body.iter().rev().map(|s| (s, false)).collect();
        let mut names = HashSet::new();
        while let Some((s, done)) = stack.pop() {
            work(1);
            let key = s as *const Stmt as usize;
            if done {
                if let Some(e) = r.at.get_mut(&key) {
                    e.1 = next;
                }
                continue;
            }
            own_reads(s, &mut names);
            for n in names.drain() {
                r.by_name.entry(n).or_default().push(next);
            }
            r.at.insert(key, (next, next));
            next += 1;
            stack.push((s, true));
            for b in nested_blocks(s).into_iter().rev() {
                stack.extend(b.iter().rev().map(|s| (s, false)));
            }
        }
        r
    }

    /// The positions of `stmts` (consecutive statements of one block).
    pub(super) fn span_of(&self, stmts: &[Stmt]) -> (u32, u32) {
        match (stmts.first(), stmts.last()) {
            (Some(a), Some(b)) => (
                self.at[&(a as *const Stmt as usize)].0,
                self.at[&(b as *const Stmt as usize)].1,
            ),
            _ => (0, 0),
        }
    }

    pub(super) fn position(&self, s: &Stmt) -> u32 {
        self.at[&(s as *const Stmt as usize)].0
    }

    /// Whether `name` is read at a position in `from..to`.
    fn read_in(&self, name: &str, from: u32, to: u32) -> bool {
        self.by_name.get(name).is_some_and(|ps| {
            let i = ps.partition_point(|&p| p < from);
            ps.get(i).is_some_and(|&p| p < to)
        })
    }
}

/// The names read after a point of the kernel: the positions (see [`Reads`])
/// of the rest of its block, then those of each enclosing block's rest and
/// loop body, outwards.
#[derive(Clone, Copy)]
pub(super) struct Live<'a> {
    from: u32,
    to: u32,
    outer: Option<&'a Live<'a>>,
}

impl<'a> Live<'a> {
    pub(super) const NONE: Live<'static> = Live {
        from: 0,
        to: 0,
        outer: None,
    };

    pub(super) fn within(outer: &'a Live<'a>, (from, to): (u32, u32)) -> Live<'a> {
        Live {
            from,
            to,
            outer: Some(outer),
        }
    }

    pub(super) fn contains(&self, name: &str, reads: &Reads) -> bool {
        let mut at = Some(self);
        while let Some(l) = at {
            work(1);
            if reads.read_in(name, l.from, l.to) {
                return true;
            }
            at = l.outer;
        }
        false
    }
}
