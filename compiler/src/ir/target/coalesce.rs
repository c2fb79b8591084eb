//! Copy coalescing on Target IR: register moves that only hand a value from
//! one register to another are removed by giving both the same register.
//!
//! Lowering writes an `if`'s results into fresh registers with a `Mov` at the
//! end of each branch, and a loop's carried values with a `Mov` at the end of
//! its body. Where the moved value has no other life (a masked tile's
//! `selp`s in one branch, the unmasked tile in the other: flash attention's
//! diagonal blocks) the moves are pure text: 64 a branch there, 256 an
//! iteration of its loop body; a `mma.sync` GEMM's accumulators moved back
//! after every k step. ptxas coalesces them too, so this is for the size of
//! the PTX and the driver's JIT time: the PTX printer prints the kernel after
//! it (`Kernel::simplified`); the register estimate reads it as lowered.
//!
//! Two rules, both positional on the structured program (no liveness sets):
//!
//! * **Into the destination.** `mov D, x` where `x` is written once, by a
//!   plain instruction earlier in the same list, and every reference to `x`
//!   lies between that write and the move, and `D` is not referenced between
//!   them (the writing instruction may read it): `x` becomes `D` there and the
//!   move goes. `D` so takes its value earlier, where no one looks at it.
//! * **Into the source, across an `if`.** One branch ends its result `R` with
//!   `mov R, s`, the other writes `R` once at its top level; `s` is not
//!   referenced after the `if`, nor in the other branch after that write; `R`
//!   is referenced nowhere but the branches and after the `if`: `R` becomes
//!   `s` (the other branch then updates `s` in place) and the move goes.
//!
//! A register changes only where it and its partner are untouched in the
//! round; rounds repeat (each may enable the next: the second rule needs the
//! first's in-place write) up to a bound that caps the work, never
//! correctness.

use std::collections::{HashMap, HashSet};

use super::{Inst, Operand, Reg, RegTy};

/// Rounds at most; stopping early only leaves moves.
const MAX_ROUNDS: usize = 8;

/// Removes the moves the two rules allow from `body`; `tys` gives each
/// register's type (a move coalesces only registers of one type).
pub fn coalesce_copies(body: &mut Vec<Inst>, tys: &[RegTy]) {
    for _ in 0..MAX_ROUNDS {
        let (mut refs, mut defs) = (HashMap::new(), HashMap::new());
        count_refs(body, &mut refs);
        count_defs(body, &mut defs);
        let mut round = Round {
            refs,
            defs,
            tys,
            touched: HashSet::new(),
            removed: 0,
        };
        round.block(body);
        if round.removed == 0 {
            break;
        }
    }
}

/// The registers `i` references itself (not its nested regions): what it
/// reads and writes, and a control instruction's bounds, induction variable,
/// condition or loop predicate. Each once.
fn own_regs(i: &Inst) -> Vec<Reg> {
    let mut v = i.defs();
    v.extend(i.uses());
    if let Inst::For { lo, hi, step, .. } = i {
        v.extend([lo, hi, step].iter().filter_map(|o| o.reg()));
    }
    if let Inst::While { pred, .. } = i {
        v.push(*pred);
    }
    v.sort_by_key(|r| r.0);
    v.dedup();
    v
}

/// Instructions referencing each register, nested ones included.
fn count_refs(insts: &[Inst], refs: &mut HashMap<Reg, usize>) {
    for i in insts {
        for r in own_regs(i) {
            *refs.entry(r).or_default() += 1;
        }
        for region in i.regions() {
            count_refs(region, refs);
        }
    }
}

/// Writes of each register, nested ones included.
fn count_defs(insts: &[Inst], defs: &mut HashMap<Reg, usize>) {
    for i in insts {
        for r in i.defs() {
            *defs.entry(r).or_default() += 1;
        }
        for region in i.regions() {
            count_defs(region, defs);
        }
    }
}

/// Per register, the positions of `insts` whose code (nested included)
/// references it, each with how many of its instructions do.
fn positions(insts: &[Inst]) -> HashMap<Reg, Vec<(usize, usize)>> {
    let mut out: HashMap<Reg, Vec<(usize, usize)>> = HashMap::new();
    for (p, i) in insts.iter().enumerate() {
        let mut here = HashMap::new();
        count_refs(std::slice::from_ref(i), &mut here);
        for (r, n) in here {
            out.entry(r).or_default().push((p, n));
        }
    }
    for v in out.values_mut() {
        v.sort_unstable();
    }
    out
}

/// Replaces `from` by `to` everywhere in `insts`, nested regions included.
fn rename(insts: &mut [Inst], from: Reg, to: Reg) {
    let mut f = |r: &mut Reg| {
        if *r == from {
            *r = to
        }
    };
    for i in insts {
        match i {
            Inst::For {
                iv,
                lo,
                hi,
                step,
                body,
            } => {
                f(iv);
                for o in [lo, hi, step] {
                    if let Operand::Reg(r) = o {
                        f(r)
                    }
                }
                rename(body, from, to);
            }
            Inst::While { cond, pred, body } => {
                f(pred);
                rename(cond, from, to);
                rename(body, from, to);
            }
            Inst::If {
                cond,
                then,
                otherwise,
            } => {
                f(cond);
                rename(then, from, to);
                rename(otherwise, from, to);
            }
            other => other.map_regs(&mut f, &mut |r| {
                if *r == from {
                    *r = to
                }
            }),
        }
    }
}

/// Whether `i`, which writes `r`, may write `to` instead: it has no nested
/// code, writes `r` once and does not write `to` as well (reading `to` is
/// fine: an instruction reads its operands before it writes), and does not
/// read what it writes (a predicated load keeps its destinations where the
/// predicate fails; wgmma accumulates into its registers). A matrix
/// instruction's or vector load's one destination among several may move
/// (`mma.sync` then accumulates in place, as `d == c` allows).
fn plain_def(i: &Inst, r: Reg, to: Reg) -> bool {
    let defs = i.defs();
    let ok = i.is_pure()
        || matches!(
            i,
            Inst::ShflXor { .. } | Inst::Mma { .. } | Inst::LdMatrix { .. }
        )
        || matches!(i, Inst::Ld { pred: None, .. });
    ok && defs.iter().filter(|&&d| d == r).count() == 1 && !defs.contains(&to)
}

struct Round<'a> {
    /// Instructions referencing each register at the start of the round.
    refs: HashMap<Reg, usize>,
    /// Writes of each register at the start of the round.
    defs: HashMap<Reg, usize>,
    tys: &'a [RegTy],
    /// Registers renamed or renamed into this round: their counts are stale.
    touched: HashSet<Reg>,
    removed: usize,
}

impl Round<'_> {
    fn free(&self, rs: &[Reg]) -> bool {
        rs.iter().all(|r| !self.touched.contains(r))
    }

    fn same_ty(&self, a: Reg, b: Reg) -> bool {
        self.tys.get(a.0 as usize).is_some()
            && self.tys.get(a.0 as usize) == self.tys.get(b.0 as usize)
    }

    /// Coalesces in `insts` and, first, in the regions nested in it.
    fn block(&mut self, insts: &mut Vec<Inst>) {
        for i in insts.iter_mut() {
            match i {
                Inst::For { body, .. } => self.block(body),
                Inst::While { cond, body, .. } => {
                    self.block(cond);
                    self.block(body);
                }
                Inst::If {
                    then, otherwise, ..
                } => {
                    self.block(then);
                    self.block(otherwise);
                }
                _ => {}
            }
        }
        let mut dead = vec![false; insts.len()];
        let occ = positions(insts);
        for k in 0..insts.len() {
            if let Inst::Mov {
                dst,
                src: Operand::Reg(x),
            } = insts[k]
            {
                if self.coalesce_into_destination(insts, &occ, k, dst, x) {
                    dead[k] = true;
                }
            }
        }
        for p in 0..insts.len() {
            if matches!(insts[p], Inst::If { .. }) {
                self.coalesce_into_source(insts, &occ, p);
            }
        }
        let mut k = 0;
        insts.retain(|_| {
            k += 1;
            !dead[k - 1]
        });
        self.removed += dead.iter().filter(|d| **d).count();
    }

    /// The first rule, for `mov d, x` at `k`; whether it applied.
    fn coalesce_into_destination(
        &mut self,
        insts: &mut [Inst],
        occ: &HashMap<Reg, Vec<(usize, usize)>>,
        k: usize,
        d: Reg,
        x: Reg,
    ) -> bool {
        if d == x || !self.free(&[d, x]) || !self.same_ty(d, x) {
            return false;
        }
        let Some(xs) = occ.get(&x) else { return false };
        let (i, _) = xs[0];
        let here: usize = xs.iter().map(|&(_, n)| n).sum();
        // Every reference to `x` is in this list, from its write at `i` to
        // the move, and that write is its only one.
        if xs.last().map(|&(p, _)| p) != Some(k)
            || here != self.refs.get(&x).copied().unwrap_or(0)
            || i >= k
            || !plain_def(&insts[i], x, d)
            || self.defs.get(&x) != Some(&1)
        {
            return false;
        }
        // `d` unreferenced strictly between, and not written at `i`.
        let ds = occ.get(&d).map(Vec::as_slice).unwrap_or(&[]);
        if ds.iter().any(|&(p, _)| p > i && p < k) {
            return false;
        }
        rename(&mut insts[i..k], x, d);
        self.touched.extend([d, x]);
        true
    }

    /// The second rule, for the `if` at `p`.
    fn coalesce_into_source(
        &mut self,
        insts: &mut [Inst],
        occ: &HashMap<Reg, Vec<(usize, usize)>>,
        p: usize,
    ) {
        for arm in [0, 1] {
            let Inst::If {
                then, otherwise, ..
            } = &insts[p]
            else {
                return;
            };
            let (a, b) = if arm == 0 {
                (then, otherwise)
            } else {
                (otherwise, then)
            };
            // Candidates: (position in `a`, R, s).
            let moves: Vec<(usize, Reg, Reg)> = a
                .iter()
                .enumerate()
                .filter_map(|(q, i)| match i {
                    Inst::Mov {
                        dst,
                        src: Operand::Reg(s),
                    } => Some((q, *dst, *s)),
                    _ => None,
                })
                .collect();
            let (occ_a, occ_b) = (positions(a), positions(b));
            let (mut defs_a, mut defs_b) = (HashMap::new(), HashMap::new());
            count_defs(a, &mut defs_a);
            count_defs(b, &mut defs_b);
            // The first top-level write of each register in `b`.
            let mut first_b: HashMap<Reg, usize> = HashMap::new();
            for (e, i) in b.iter().enumerate() {
                for r in i.defs() {
                    first_b.entry(r).or_insert(e);
                }
            }
            let mut done = Vec::new();
            for (q, r, s) in moves {
                if r == s || !self.free(&[r, s]) || !self.same_ty(r, s) {
                    continue;
                }
                // `R` in `a`: only this move.
                if occ_a
                    .get(&r)
                    .map(|v| v.iter().map(|&(_, n)| n).sum::<usize>())
                    != Some(1)
                {
                    continue;
                }
                // `R` in `b`: written once at its top level, by a plain
                // instruction at `e`; `s` not referenced in `b` after `e`,
                // nor written in either branch.
                let Some(&e) = first_b.get(&r) else {
                    continue;
                };
                if !plain_def(&b[e], r, s)
                    || defs_b.get(&r) != Some(&1)
                    || occ_b.get(&s).is_some_and(|v| v.iter().any(|&(j, _)| j > e))
                    || defs_a.contains_key(&s)
                    || defs_b.contains_key(&s)
                {
                    continue;
                }
                // In the enclosing list: `R` only at the `if` and after it,
                // `s` only up to the `if`, neither anywhere else.
                let within = |reg: Reg| -> Option<(usize, usize, usize)> {
                    let v = occ.get(&reg)?;
                    let n = v.iter().map(|&(_, n)| n).sum();
                    Some((v[0].0, v.last()?.0, n))
                };
                let (Some((r_first, _, r_n)), Some((_, s_last, s_n))) = (within(r), within(s))
                else {
                    continue;
                };
                if r_first != p
                    || s_last != p
                    || r_n != self.refs.get(&r).copied().unwrap_or(0)
                    || s_n != self.refs.get(&s).copied().unwrap_or(0)
                {
                    continue;
                }
                done.push((q, r, s));
                self.touched.extend([r, s]);
            }
            // The moves become `mov s, s`: dropped, last first.
            done.sort_unstable_by_key(|&(q, _, _)| std::cmp::Reverse(q));
            for (q, r, s) in done {
                if let Inst::If {
                    then, otherwise, ..
                } = &mut insts[p]
                {
                    let (a, b) = if arm == 0 {
                        (then, otherwise)
                    } else {
                        (otherwise, then)
                    };
                    a.remove(q);
                    rename(b, r, s);
                }
                rename(&mut insts[p + 1..], r, s);
                self.removed += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::target::{BinOp, CmpOp};

    fn add(dst: u32, a: u32) -> Inst {
        Inst::Binary {
            op: BinOp::Add,
            dst: Reg(dst),
            a: Operand::Reg(Reg(a)),
            b: Operand::Int(1),
        }
    }

    fn mov(dst: u32, src: u32) -> Inst {
        Inst::Mov {
            dst: Reg(dst),
            src: Operand::Reg(Reg(src)),
        }
    }

    fn sel(dst: u32, cond: u32, a: u32) -> Inst {
        Inst::Select {
            dst: Reg(dst),
            cond: Reg(cond),
            a: Operand::Reg(Reg(a)),
            b: Operand::Float(f64::NEG_INFINITY),
        }
    }

    fn store(src: u32) -> Inst {
        Inst::St {
            space: crate::ir::target::Space::Global,
            stream: false,
            mem: crate::ir::target::MemTy::F32,
            addr: Reg(99),
            offset: 0,
            src: vec![Operand::Reg(Reg(src))],
            pred: None,
        }
    }

    fn run(mut body: Vec<Inst>) -> Vec<Inst> {
        let tys = vec![RegTy::F32; 100];
        coalesce_copies(&mut body, &tys);
        body
    }

    #[test]
    fn a_value_moved_once_is_written_where_it_goes() {
        // r1 = r0 + 1; r2 = r1 → r2 = r0 + 1.
        let body = run(vec![add(1, 0), mov(2, 1), store(2)]);
        assert_eq!(body, vec![add(2, 0), store(2)]);
    }

    #[test]
    fn a_destination_read_in_between_keeps_the_move() {
        // r2 is read after r1 is computed and before the move: writing r1's
        // value into r2 early would change what that store sees.
        let body = vec![add(1, 0), store(2), mov(2, 1), store(2)];
        assert_eq!(run(body.clone()), body);
    }

    #[test]
    fn a_source_read_after_the_move_keeps_it() {
        let body = vec![add(1, 0), mov(2, 1), store(1), store(2)];
        assert_eq!(run(body.clone()), body);
    }

    #[test]
    fn a_loop_carried_value_is_updated_in_place() {
        // for: r5 = r4 + 1; r4 = r5  →  r4 = r4 + 1.
        let body = vec![
            add(4, 0),
            Inst::For {
                iv: Reg(9),
                lo: Operand::Int(0),
                hi: Operand::Int(4),
                step: Operand::Int(1),
                body: vec![add(5, 4), mov(4, 5)],
            },
            store(4),
        ];
        let body = run(body);
        let Inst::For { body: inner, .. } = &body[1] else {
            panic!("the loop stays")
        };
        assert_eq!(inner, &vec![add(4, 4)]);
    }

    #[test]
    fn a_carried_accumulator_is_accumulated_in_place() {
        // for: {r10, r11} = mma(a, b, {r4, r5}); r4 = r10; r5 = r11
        //   →  {r4, r5} = mma(a, b, {r4, r5}).
        let mma = |d: [u32; 2], c: [u32; 2]| Inst::Mma {
            kind: crate::target::MmaKind::MmaSync,
            m: 16,
            n: 8,
            k: 16,
            input: crate::ir::target::MemTy::F16,
            d: d.iter().map(|&r| Reg(r)).collect(),
            a: vec![Reg(20)],
            b: vec![Reg(21)],
            c: c.iter().map(|&r| Reg(r)).collect(),
        };
        let body = run(vec![
            add(4, 0),
            add(5, 0),
            Inst::For {
                iv: Reg(9),
                lo: Operand::Int(0),
                hi: Operand::Int(4),
                step: Operand::Int(1),
                body: vec![mma([10, 11], [4, 5]), mov(4, 10), mov(5, 11)],
            },
            store(4),
        ]);
        let Inst::For { body: inner, .. } = &body[2] else {
            panic!("the loop stays")
        };
        assert_eq!(inner, &vec![mma([4, 5], [4, 5])]);
    }

    #[test]
    fn a_carried_value_read_after_its_update_keeps_the_move() {
        // m_new = m + 1; alpha reads m after m_new: the old value is needed.
        let inner = vec![add(5, 4), add(6, 4), mov(4, 5), store(6)];
        let body = vec![
            add(4, 0),
            Inst::For {
                iv: Reg(9),
                lo: Operand::Int(0),
                hi: Operand::Int(4),
                step: Operand::Int(1),
                body: inner.clone(),
            },
        ];
        let body = run(body);
        let Inst::For { body: got, .. } = &body[1] else {
            panic!("the loop stays")
        };
        assert_eq!(got, &inner);
    }

    /// `s = r0 + 1; if c { R = s } else { t = select(c2, s, -inf); R = t }; store R`.
    fn masked_if(read_s_after: bool) -> Vec<Inst> {
        let mut body = vec![
            add(1, 0),
            Inst::Cmp {
                op: CmpOp::Lt,
                ty: RegTy::I32,
                dst: Reg(7),
                a: Operand::Reg(Reg(0)),
                b: Operand::Int(3),
            },
            Inst::If {
                cond: Reg(7),
                then: vec![mov(3, 1)],
                otherwise: vec![sel(2, 8, 1), mov(3, 2)],
            },
            store(3),
        ];
        if read_s_after {
            body.push(store(1));
        }
        body
    }

    #[test]
    fn a_masked_branch_updates_the_tile_in_place() {
        let body = run(masked_if(false));
        assert_eq!(
            body[2],
            Inst::If {
                cond: Reg(7),
                then: vec![],
                otherwise: vec![sel(1, 8, 1)],
            }
        );
        assert_eq!(body[3], store(1));
    }

    #[test]
    fn an_unmasked_tile_read_after_the_if_is_kept() {
        let body = run(masked_if(true));
        // The else branch still writes the merged register directly, but the
        // then branch's move stays: `s` is read after the `if`.
        assert_eq!(
            body[2],
            Inst::If {
                cond: Reg(7),
                then: vec![mov(3, 1)],
                otherwise: vec![sel(3, 8, 1)],
            }
        );
        assert_eq!(body[4], store(1));
    }

    #[test]
    fn registers_of_different_types_are_not_merged() {
        let mut body = vec![add(1, 0), mov(2, 1), store(2)];
        let mut tys = vec![RegTy::F32; 100];
        tys[2] = RegTy::B32;
        coalesce_copies(&mut body, &tys);
        assert_eq!(body.len(), 3);
    }
}
