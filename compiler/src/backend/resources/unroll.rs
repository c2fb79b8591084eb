//! Loops ptxas unrolls: completely where the trips are few and constant, by
//! four where the body is short.

use super::program::Remat;
use crate::target::ptxas::UNROLL_BY_FOUR_MAX_INSTS;

/// The trips of a loop ptxas unrolls completely on the kernel's arch (see
/// [`crate::target::ptxas::PtxasModel::full_unroll_max_trips`]): a `For` with constant
/// bounds and no loop inside.
pub(super) fn unrolled_trips(inst: &crate::ir::target::Inst, max: u32) -> Option<Vec<i64>> {
    use crate::ir::target::{Inst, Operand};
    fn has_loop(insts: &[Inst]) -> bool {
        insts.iter().any(|i| {
            matches!(i, Inst::For { .. } | Inst::While { .. })
                || i.regions().into_iter().any(|r| has_loop(r))
        })
    }
    let Inst::For {
        lo: Operand::Int(lo),
        hi: Operand::Int(hi),
        step: Operand::Int(step),
        body,
        ..
    } = inst
    else {
        return None;
    };
    if *step == 0 || has_loop(body) {
        return None;
    }
    let mut trips = Vec::new();
    let mut v = *lo;
    while (*step > 0 && v < *hi) || (*step < 0 && v > *hi) {
        if trips.len() as u32 == max {
            return None;
        }
        trips.push(v);
        v += step;
    }
    (!trips.is_empty()).then_some(trips)
}

/// Whether ptxas 12.9 unrolls `inst` by 4: a `For` loop whose trip count is
/// known only at run time, with no loop inside and a body of at most
/// [`UNROLL_BY_FOUR_MAX_INSTS`] instructions that neither stores, nor
/// synchronises, nor issues MMAs. On every arch the loads of the four
/// iterations are then issued together (`.pragma "nounroll"` on such loops
/// of generated kernels: 17 to 23 registers instead of 31 or 32; loops of 52
/// instructions and more are kept rolled).
///
/// `runtime`: whether loops whose trips are known only at run time are
/// unrolled. LLVM's AMDGPU target leaves them rolled (its unrolling
/// preferences enable partial, not runtime, unrolling): a runtime-`K` int8
/// row dot of 4 values a lane, 22 VGPRs from clang on gfx90a, 18 on
/// gfx1100; modelled unrolled by 4, 40.
pub(super) fn unrolled_by_four(
    inst: &crate::ir::target::Inst,
    max_full_trips: u32,
    runtime: bool,
) -> bool {
    use crate::ir::target::{Inst, Operand};
    fn size(insts: &[Inst]) -> Option<usize> {
        let mut n = 0;
        for i in insts {
            match i {
                Inst::Comment(_) => {}
                i if i.is_sync_or_async() => return None,
                Inst::For { .. }
                | Inst::While { .. }
                | Inst::St { .. }
                | Inst::AtomAdd { .. }
                | Inst::Trap { .. }
                | Inst::Mma { .. } => return None,
                _ => {
                    n += 1;
                    for region in i.regions() {
                        n += size(region)?;
                    }
                }
            }
        }
        Some(n)
    }
    let Inst::For {
        lo, hi, step, body, ..
    } = inst
    else {
        return false;
    };
    // Constant trips: at least 4, and more than ptxas unrolls completely.
    let trips = match (lo, hi, step) {
        (Operand::Int(lo), Operand::Int(hi), Operand::Int(step)) if *step > 0 => {
            Some(hi.saturating_sub(*lo).max(0).saturating_add(step - 1) / step)
        }
        (Operand::Int(_), Operand::Int(_), Operand::Int(_)) => Some(0),
        _ => None,
    };
    let long = match trips {
        None => runtime,
        Some(t) => t >= 4 && t > i64::from(max_full_trips),
    };
    long && size(body).is_some_and(|n| n <= UNROLL_BY_FOUR_MAX_INSTS)
}

/// `insts` with every loop that ptxas unrolls completely (see
/// [`unrolled_trips`]) replaced by its iterations in sequence, so that the
/// loads of different iterations can be issued together ([`hoist_loads`]).
/// Each iteration sets the induction variable to its constant; a branch on a
/// condition that is then constant becomes the arm taken (ptxas folds it:
/// `if c == 0: continue` leaves no branch); the registers an iteration writes
/// get fresh names, except in the last iteration, which writes the original
/// registers that the code after the loop reads.
pub(super) fn unroll_short_loops<'a>(
    insts: &'a [crate::ir::target::Inst],
    rm: &mut Remat,
) -> std::borrow::Cow<'a, [crate::ir::target::Inst]> {
    use crate::ir::target::{Inst, Operand, Reg};
    use std::collections::HashMap;
    let (max, runtime) = (rm.max_unroll_trips, rm.runtime_unroll);
    if !insts
        .iter()
        .any(|i| unrolled_trips(i, max).is_some() || unrolled_by_four(i, max, runtime))
    {
        return std::borrow::Cow::Borrowed(insts);
    }
    /// One iteration being written out.
    struct Iteration<'r> {
        rm: &'r mut Remat,
        /// Current name of each renamed register.
        map: HashMap<u32, u32>,
        /// This iteration's name of each register it writes.
        names: HashMap<u32, u32>,
        /// Registers holding a known integer (or predicate) value.
        consts: HashMap<u32, i64>,
        last: bool,
    }
    impl Iteration<'_> {
        fn name(&mut self, r: u32) -> u32 {
            if self.last || self.rm.is_remat(r) {
                return r;
            }
            if let Some(&n) = self.names.get(&r) {
                return n;
            }
            let n = self.rm.fresh_like(r);
            self.names.insert(r, n);
            n
        }
        fn operand(&self, o: &Operand) -> Option<i64> {
            match o {
                Operand::Int(v) => Some(*v),
                Operand::Reg(r) => self.consts.get(&r.0).copied(),
                Operand::Float(_) => None,
            }
        }
        /// The value `inst` (already renamed) writes, where known.
        fn fold(&self, inst: &Inst) -> Option<i64> {
            use crate::ir::target::{BinOp, CmpOp, RegTy};
            let int = |r: &Reg| {
                !matches!(
                    self.rm.tys[r.0 as usize],
                    RegTy::F32 | RegTy::F64 | RegTy::B16 | RegTy::B32
                )
            };
            match inst {
                Inst::Mov { dst, src } if int(dst) => self.operand(src),
                Inst::Cmp { op, a, b, ty, .. }
                    if !matches!(ty, RegTy::F32 | RegTy::F64 | RegTy::B16 | RegTy::B32) =>
                {
                    let (a, b) = (self.operand(a)?, self.operand(b)?);
                    Some(i64::from(match op {
                        CmpOp::Eq => a == b,
                        CmpOp::Ne => a != b,
                        CmpOp::Lt => a < b,
                        CmpOp::Le => a <= b,
                        CmpOp::Gt => a > b,
                        CmpOp::Ge => a >= b,
                    }))
                }
                Inst::Binary { op, dst, a, b } if int(dst) => {
                    let (a, b) = (self.operand(a)?, self.operand(b)?);
                    match op {
                        BinOp::Add => Some(a.wrapping_add(b)),
                        BinOp::Sub => Some(a.wrapping_sub(b)),
                        BinOp::Mul => Some(a.wrapping_mul(b)),
                        BinOp::And => Some(a & b),
                        BinOp::Or => Some(a | b),
                        BinOp::Xor => Some(a ^ b),
                        _ => None,
                    }
                }
                _ => None,
            }
        }
        fn emit(&mut self, body: &[Inst], out: &mut Vec<Inst>) {
            for inst in body {
                crate::cancel::checkpoint();
                if let Inst::If {
                    cond,
                    then,
                    otherwise,
                } = inst
                {
                    let cond = Reg(*self.map.get(&cond.0).unwrap_or(&cond.0));
                    if let Some(v) = self.consts.get(&cond.0) {
                        self.emit(if *v != 0 { then } else { otherwise }, out);
                        continue;
                    }
                    // A register both arms write gets the same name in both;
                    // one only the first arm writes is local to it.
                    let before = self.map.clone();
                    let mut t = Vec::new();
                    self.emit(then, &mut t);
                    self.map = before;
                    let mut o = Vec::new();
                    self.emit(otherwise, &mut o);
                    out.push(Inst::If {
                        cond,
                        then: t,
                        otherwise: o,
                    });
                    continue;
                }
                // The registers it writes, before the uses are renamed: a
                // wgmma's accumulators are read and written in one operand,
                // which the renaming of uses rewrites.
                let mut written = Vec::new();
                inst.clone()
                    .map_regs(&mut |_| {}, &mut |r| written.push(r.0));
                let mut i = inst.clone();
                i.map_regs(
                    &mut |r| *r = Reg(*self.map.get(&r.0).unwrap_or(&r.0)),
                    &mut |_| {},
                );
                let value = self.fold(&i);
                let mut renamed = Vec::new();
                let mut written = written.into_iter();
                i.map_regs(&mut |_| {}, &mut |r| {
                    let r0 = written.next().unwrap_or(r.0);
                    let n = self.name(r0);
                    renamed.push((r0, n));
                    *r = Reg(n);
                });
                for (r, n) in renamed {
                    self.map.insert(r, n);
                    match value {
                        Some(v) => self.consts.insert(n, v),
                        None => self.consts.remove(&n),
                    };
                }
                out.push(i);
            }
        }
    }
    fn defs_in(insts: &[Inst], out: &mut HashMap<u32, u32>) {
        for i in insts {
            for r in i.defs() {
                *out.entry(r.0).or_default() += 1;
            }
            for region in i.regions() {
                defs_in(region, out);
            }
        }
    }
    let mut out = Vec::new();
    for inst in insts {
        if let (
            true,
            Inst::For {
                iv,
                lo,
                hi,
                step,
                body,
            },
        ) = (unrolled_by_four(inst, max, runtime), inst)
        {
            // Four iterations a trip: the k-th reads `iv + k * step`.
            let mut four = Vec::new();
            let mut map = HashMap::new();
            let mut consts = rm.consts.clone();
            for k in 0..4 {
                let mut it = Iteration {
                    rm: &mut *rm,
                    map,
                    names: HashMap::new(),
                    consts,
                    last: k == 3,
                };
                if k == 0 {
                    it.map.remove(&iv.0);
                } else {
                    let ivn = it.rm.fresh_like(iv.0);
                    four.push(Inst::Binary {
                        op: crate::ir::target::BinOp::Add,
                        dst: Reg(ivn),
                        a: Operand::Reg(*iv),
                        b: *step,
                    });
                    it.map.insert(iv.0, ivn);
                }
                it.emit(body, &mut four);
                map = it.map;
                consts = it.consts;
            }
            out.push(Inst::For {
                iv: *iv,
                lo: *lo,
                hi: *hi,
                step: *step,
                body: four,
            });
            continue;
        }
        let (Some(trips), Inst::For { iv, body, .. }) = (unrolled_trips(inst, max), inst) else {
            out.push(inst.clone());
            continue;
        };
        let mut consts = rm.consts.clone();
        let mut map = HashMap::new();
        for (k, &v) in trips.iter().enumerate() {
            let mut it = Iteration {
                rm: &mut *rm,
                map,
                names: HashMap::new(),
                consts,
                last: k + 1 == trips.len(),
            };
            let ivn = it.name(iv.0);
            out.push(Inst::Mov {
                dst: Reg(ivn),
                src: Operand::Int(v),
            });
            it.map.insert(iv.0, ivn);
            it.consts.insert(ivn, v);
            it.emit(body, &mut out);
            map = it.map;
            consts = it.consts;
        }
        // A carried register (written before the loop too) that the last
        // iteration did not write: the code after the loop reads its copy.
        let mut in_body = HashMap::new();
        defs_in(body, &mut in_body);
        let mut carried: Vec<(u32, u32)> = map
            .into_iter()
            .filter(|&(r, n)| {
                r != n && rm.def_count.get(r as usize).copied().unwrap_or(0) > in_body[&r]
            })
            .collect();
        carried.sort();
        for (r, n) in carried {
            out.push(Inst::Mov {
                dst: Reg(r),
                src: Operand::Reg(Reg(n)),
            });
        }
    }
    std::borrow::Cow::Owned(out)
}
