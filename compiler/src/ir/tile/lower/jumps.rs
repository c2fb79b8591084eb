//! `break`, `continue` and early `return`: the synthetic flags that guard the
//! rest of a loop body or of the kernel, and which jumps each block holds
//! ([`JumpTable`], computed once per kernel).

use std::collections::HashMap;

use super::{work, LV};
use crate::check::{DType, Value as CValue};
use crate::syntax::ast::{Stmt, StmtKind};

/// Synthetic variables of a loop with `break`/`continue`: whether the current
/// iteration still runs, and whether the loop was broken.
pub(super) const CONT: &str = "%continuing";
pub(super) const BRK: &str = "%broken";
/// Whether the kernel executed a `return` (inside a loop: carried out of it).
pub(super) const RET: &str = "%returned";

pub(super) fn flag(b: bool) -> LV {
    LV::Const {
        c: CValue::Bool(b),
        dtype: DType::Bool,
        weak: false,
    }
}

/// The `break`s and `continue`s of a block that belong to the enclosing loop
/// (nested loops own theirs).
#[derive(Clone, Copy, Default)]
pub(super) struct Jumps {
    pub(super) brk: bool,
    cont: bool,
    /// An early `return` (outside loops it guards the rest of the kernel).
    pub(super) ret: bool,
}

impl Jumps {
    pub(super) fn any(self) -> bool {
        self.brk || self.cont || self.ret
    }
}

/// Each statement's `Jumps` and whether a `return` is anywhere in it,
/// computed once per kernel, so asking about a block costs its length rather
/// than a walk of everything nested in it (loops ask at every level).
#[derive(Default)]
pub(super) struct JumpTable(HashMap<*const Stmt, (Jumps, bool)>);

impl JumpTable {
    pub(super) fn new(body: &[Stmt]) -> JumpTable {
        let mut t = JumpTable::default();
        t.fill(body);
        t
    }

    fn fill(&mut self, stmts: &[Stmt]) -> (Jumps, bool) {
        let mut all = (Jumps::default(), false);
        for s in stmts {
            work(1);
            let own = match &s.kind {
                StmtKind::Break => (
                    Jumps {
                        brk: true,
                        ..Jumps::default()
                    },
                    false,
                ),
                StmtKind::Continue => (
                    Jumps {
                        cont: true,
                        ..Jumps::default()
                    },
                    false,
                ),
                StmtKind::Return(_) => (
                    Jumps {
                        ret: true,
                        ..Jumps::default()
                    },
                    true,
                ),
                StmtKind::For { body, .. } | StmtKind::While { body, .. } => {
                    // A `return` in a nested loop leaves this loop too; the
                    // nested loop owns its `break`s and `continue`s.
                    let (_, ret) = self.fill(body);
                    (
                        Jumps {
                            ret,
                            ..Jumps::default()
                        },
                        ret,
                    )
                }
                StmtKind::If { branches, orelse } => {
                    let mut x = (Jumps::default(), false);
                    for b in branches
                        .iter()
                        .map(|(_, b)| b.as_slice())
                        .chain(orelse.as_deref())
                    {
                        x = or(x, self.fill(b));
                    }
                    x
                }
                _ => (Jumps::default(), false),
            };
            self.0.insert(s as *const Stmt, own);
            all = or(all, own);
        }
        all
    }

    /// The jumps of a block of this kernel.
    pub(super) fn jumps(&self, stmts: &[Stmt]) -> Jumps {
        let mut j = Jumps::default();
        for s in stmts {
            work(1);
            let own = match self.0.get(&(s as *const Stmt)) {
                Some(own) => own.0,
                None => JumpTable::default().fill(std::slice::from_ref(s)).0,
            };
            j = or((j, false), (own, false)).0;
        }
        j
    }
}

fn or(a: (Jumps, bool), b: (Jumps, bool)) -> (Jumps, bool) {
    (
        Jumps {
            brk: a.0.brk || b.0.brk,
            cont: a.0.cont || b.0.cont,
            ret: a.0.ret || b.0.ret,
        },
        a.1 || b.1,
    )
}

pub(super) fn contains_loop_return(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| match &s.kind {
        StmtKind::Return(_) => true,
        StmtKind::For { body, .. } | StmtKind::While { body, .. } => contains_loop_return(body),
        StmtKind::If { branches, orelse } => {
            branches.iter().any(|(_, b)| contains_loop_return(b))
                || orelse.as_deref().is_some_and(contains_loop_return)
        }
        _ => false,
    })
}
