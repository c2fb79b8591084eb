//! Dead-code elimination on Target IR: instructions that only compute
//! registers (arithmetic, moves, conversions, loads, `ldmatrix`, matrix
//! instructions, shuffles) and whose registers nothing reads are dropped, to
//! a fixed point. Lowering emits some freely: a value rounded to bf16 whose
//! every use packs it from the unrounded original (`Lower::pack_bf16`), an
//! index computed for a layout no one converts to. ptxas would drop them
//! too, but each costs PTX text and driver JIT time.

use std::collections::HashSet;

use super::{Inst, Reg};

/// Removes dead instructions from `body` (and the regions nested in it).
pub fn eliminate_dead_code(body: &mut Vec<Inst>) {
    // Each round removes the ends of dead chains; a chain is as long as
    // the lowering of one op, so few rounds suffice. The bound only caps
    // the work: stopping early leaves dead code, never wrong code.
    for _ in 0..32 {
        let mut used = HashSet::new();
        uses(body, &mut used);
        if remove(body, &used) == 0 {
            break;
        }
    }
}

/// Whether `i` may be removed when nothing reads what it writes: it has no
/// effect besides its registers (a kernel parameter is kept, as it names
/// the ABI).
fn removable(i: &Inst) -> bool {
    match i {
        Inst::Param { .. } => false,
        Inst::Ld { .. } | Inst::LdMatrix { .. } | Inst::Mma { .. } | Inst::ShflXor { .. } => true,
        _ => i.is_pure(),
    }
}

fn uses(insts: &[Inst], used: &mut HashSet<Reg>) {
    for i in insts {
        used.extend(i.uses());
        if let Inst::While { pred, .. } = i {
            used.insert(*pred);
        }
        for r in i.regions() {
            uses(r, used);
        }
    }
}

/// Drops the dead instructions of `insts`; returns how many.
fn remove(insts: &mut Vec<Inst>, used: &HashSet<Reg>) -> usize {
    let before = insts.len();
    insts.retain(|i| {
        let defs = i.defs();
        !(removable(i) && !defs.is_empty() && defs.iter().all(|d| !used.contains(d)))
    });
    let mut n = before - insts.len();
    for i in insts.iter_mut() {
        match i {
            Inst::For { body, .. } => n += remove(body, used),
            Inst::While { cond, body, .. } => n += remove(cond, used) + remove(body, used),
            Inst::If {
                then, otherwise, ..
            } => n += remove(then, used) + remove(otherwise, used),
            _ => {}
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::target::{BinOp, Operand};

    fn add(dst: u32, a: u32) -> Inst {
        Inst::Binary {
            op: BinOp::Add,
            dst: Reg(dst),
            a: Operand::Reg(Reg(a)),
            b: Operand::Int(1),
        }
    }

    #[test]
    fn dead_chains_go_and_live_values_stay() {
        // r1 <- r0; r2 <- r1 (dead chain); r3 <- r0 read by a loop bound.
        let mut body = vec![
            add(1, 0),
            add(2, 1),
            add(3, 0),
            Inst::For {
                iv: Reg(4),
                lo: Operand::Int(0),
                hi: Operand::Reg(Reg(3)),
                step: Operand::Int(1),
                body: vec![add(5, 4), Inst::Barrier],
            },
        ];
        eliminate_dead_code(&mut body);
        assert_eq!(body.len(), 2);
        assert_eq!(body[0], add(3, 0));
        let Inst::For { body: inner, .. } = &body[1] else {
            panic!("the loop stays")
        };
        assert_eq!(inner, &vec![Inst::Barrier]);
    }

    #[test]
    fn a_while_condition_stays() {
        let mut body = vec![Inst::While {
            cond: vec![add(1, 0)],
            pred: Reg(1),
            body: vec![],
        }];
        eliminate_dead_code(&mut body);
        let Inst::While { cond, .. } = &body[0] else {
            panic!()
        };
        assert_eq!(cond.len(), 1);
    }
}
