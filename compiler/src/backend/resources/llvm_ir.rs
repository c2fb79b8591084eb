//! The Target IR of a kernel as LLVM's scalar optimisations leave the HIP
//! printed from it, for the AMD register estimate (`amd.rs`): the printer
//! writes one statement per Target IR instruction, and clang's `-O3`
//! pipeline removes what repeats or is never read before the AMDGPU
//! backend allocates registers. Two of its passes change the registers a
//! kernel holds, so the estimate applies them first:
//!
//! * common subexpressions (EarlyCSE/GVN): a pure instruction that repeats
//!   one computed earlier on a path to it, from the same operands, reads
//!   that result instead (a store's address and bounds computed again from
//!   the values its load used: `scale` on gfx90a, clang 8 VGPRs, 11
//!   estimated without this);
//! * dead code: pure instructions and loads whose results are never read
//!   are dropped (a fuzz kernel computing a chain it never stores);
//! * arithmetic on a masked load's result with constants is folded into
//!   the load's branch (InstCombine's `foldOpIntoPhi`: `v = 0; if (p) v =
//!   load; w = v + 1` becomes `w = 1; if (p) w = load + 1`), so it is
//!   computed where the load is, not where `w` is read (four masked loads
//!   plus one stored after a lane test: clang 5 VGPRs, 2 estimated with
//!   the additions sunk to their stores);
//! * a value read only by a masked store or load (a statement of its own
//!   under `if (p)` in the HIP) is computed in that branch (InstCombine
//!   sinks an instruction into the block of all its users), and so are the
//!   values read only to compute it (four sums of scalar loads stored by one lane: clang 2
//!   VGPRs, 6 estimated with the sums held for the stores).

use std::collections::HashMap;

use crate::ir::target::{Inst, Kernel, Operand, Reg};

/// `kernel` after common-subexpression and dead-code elimination (module
/// docs), and the registers that took over a folded operation's result
/// (the operation is gone from the program, but its ALU still writes them).
pub(super) fn as_llvm_leaves_it(kernel: &Kernel) -> (Kernel, Vec<Reg>) {
    let mut k = kernel.clone();
    let mut def_count = vec![0u32; k.regs.len()];
    count_defs(&k.body, &mut def_count);
    let mut cse = Cse {
        def_count: &def_count,
        scopes: vec![HashMap::new()],
        replaced: HashMap::new(),
    };
    cse.region(&mut k.body);
    let folded = fold_into_masked_loads(&mut k);
    let mut def_count = vec![0u32; k.regs.len()];
    count_defs(&k.body, &mut def_count);
    let mut reads = vec![0u32; k.regs.len()];
    count_reads(&k.body, &mut reads);
    sink_into_masked(&mut k.body, &def_count, &reads);
    // Dead code: drop what nothing reads, until nothing more goes.
    loop {
        let mut reads = vec![0u32; k.regs.len()];
        count_reads(&k.body, &mut reads);
        if !drop_unread(&mut k.body, &reads) {
            break;
        }
    }
    (k, folded)
}

fn count_defs(insts: &[Inst], out: &mut [u32]) {
    for i in insts {
        for d in i.defs() {
            if let Some(c) = out.get_mut(d.0 as usize) {
                *c += 1;
            }
        }
        for r in i.regions() {
            count_defs(r, out);
        }
    }
}

/// Value numbering over the structured program: a result computed in a
/// region is available in the rest of it and in the regions nested in it
/// (the places it dominates), never after the region ends.
struct Cse<'a> {
    def_count: &'a [u32],
    /// The available computations per open region, innermost last.
    scopes: Vec<HashMap<String, Reg>>,
    /// Registers replaced by an earlier one with the same value.
    replaced: HashMap<u32, Reg>,
}

impl Cse<'_> {
    fn once(&self, r: Reg) -> bool {
        self.def_count.get(r.0 as usize) == Some(&1)
    }

    fn region(&mut self, insts: &mut Vec<Inst>) {
        let mut kept = Vec::with_capacity(insts.len());
        for mut inst in insts.drain(..) {
            crate::cancel::checkpoint();
            let replaced = &self.replaced;
            let mut rename = |r: &mut Reg| {
                if let Some(n) = replaced.get(&r.0) {
                    *r = *n;
                }
            };
            match &mut inst {
                Inst::For {
                    lo, hi, step, body, ..
                } => {
                    for o in [lo, hi, step] {
                        if let Operand::Reg(r) = o {
                            rename(r);
                        }
                    }
                    self.nested(body);
                }
                Inst::While { cond, body, .. } => {
                    self.nested(cond);
                    self.nested(body);
                }
                Inst::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    rename(cond);
                    self.nested(then);
                    self.nested(otherwise);
                }
                other => other.map_regs(&mut rename, &mut |_| {}),
            }
            if let Some((key, dst)) = self.key(&inst) {
                let found = self.scopes.iter().rev().find_map(|s| s.get(&key)).copied();
                match found {
                    Some(earlier) => {
                        self.replaced.insert(dst.0, earlier);
                        continue;
                    }
                    None => {
                        self.scopes
                            .last_mut()
                            .expect("a scope is open")
                            .insert(key, dst);
                    }
                }
            }
            kept.push(inst);
        }
        *insts = kept;
    }

    fn nested(&mut self, insts: &mut Vec<Inst>) {
        self.scopes.push(HashMap::new());
        self.region(insts);
        self.scopes.pop();
    }

    /// The computation `inst` performs, without its destination, where two
    /// equal ones give the same value: pure, written once, from registers
    /// written once (the thread id and kernel parameters included).
    fn key(&self, inst: &Inst) -> Option<(String, Reg)> {
        if !inst.is_pure() || matches!(inst, Inst::Mov { .. }) {
            return None;
        }
        let [dst] = inst.defs()[..] else {
            return None;
        };
        if !self.once(dst) || !inst.uses().iter().all(|&r| self.once(r)) {
            return None;
        }
        let mut shape = inst.clone();
        shape.map_regs(&mut |_| {}, &mut |d| *d = Reg(u32::MAX));
        Some((format!("{shape:?}"), dst))
    }
}

/// Drops the pure instructions and loads none of whose results is read;
/// whether any went.
fn drop_unread(insts: &mut Vec<Inst>, read: &[u32]) -> bool {
    let mut dropped = false;
    insts.retain_mut(|i| {
        match i {
            Inst::For { body, .. } => dropped |= drop_unread(body, read),
            Inst::While { cond, body, .. } => {
                dropped |= drop_unread(cond, read);
                dropped |= drop_unread(body, read);
            }
            Inst::If {
                then, otherwise, ..
            } => {
                dropped |= drop_unread(then, read);
                dropped |= drop_unread(otherwise, read);
            }
            _ => {}
        }
        let removable = i.is_pure() || matches!(i, Inst::Ld { .. } | Inst::Comment(_));
        let defs = i.defs();
        let unread = !defs.is_empty() && defs.iter().all(|d| read.get(d.0 as usize) == Some(&0));
        if removable && unread {
            dropped = true;
            false
        } else {
            true
        }
    });
    dropped
}

/// Counts, per register, the instructions reading it (nested ones too; a
/// masked load's own destinations, which it "reads" to keep where the
/// predicate is false, do not count: nothing else needs them).
fn count_reads(insts: &[Inst], out: &mut [u32]) {
    for i in insts {
        let uses = match i {
            Inst::Ld { addr, pred, .. } => {
                let mut v = vec![*addr];
                v.extend(pred.iter().copied());
                v
            }
            Inst::While { pred, .. } => vec![*pred],
            other => other.uses(),
        };
        for r in uses {
            if let Some(c) = out.get_mut(r.0 as usize) {
                *c += 1;
            }
        }
        for r in i.regions() {
            count_reads(r, out);
        }
    }
}

/// Whether `inst` prints as a statement under `if (p)`: a masked memory
/// access.
fn masked(inst: &Inst) -> bool {
    matches!(
        inst,
        Inst::Ld { pred: Some(_), .. }
            | Inst::St { pred: Some(_), .. }
            | Inst::AtomAdd { pred: Some(_), .. }
    )
}

/// `v = c; v = load if p; w = op(v, constants)` with `v` read only by the
/// op becomes `w = c; w = load if p` (module docs): `w` is then written
/// where the load is. Only where `v` and `w` take as many words. Returns
/// the operations' results (`w`s) that take loads over.
fn fold_into_masked_loads(k: &mut Kernel) -> Vec<Reg> {
    let mut def_count = vec![0u32; k.regs.len()];
    count_defs(&k.body, &mut def_count);
    let mut reads = vec![0u32; k.regs.len()];
    count_reads(&k.body, &mut reads);
    let words = |r: Reg| k.regs.get(r.0 as usize).map(|t| t.words());
    // (v, w) pairs, found first, then renamed.
    let mut folds: HashMap<u32, Reg> = HashMap::new();
    let mut folded_ops: Vec<Reg> = Vec::new();
    k.walk(&mut |inst| {
        let (dst, operand) = match inst {
            Inst::Unary { dst, x, .. } => (*dst, x.reg()),
            Inst::Binary { dst, a, b, .. } => match (a.reg(), b.reg()) {
                (Some(v), None) | (None, Some(v)) => (*dst, Some(v)),
                _ => return,
            },
            Inst::Cvt { dst, src, .. } => (*dst, Some(*src)),
            _ => return,
        };
        let Some(v) = operand else { return };
        let once = |r: Reg| def_count.get(r.0 as usize) == Some(&1);
        if def_count.get(v.0 as usize) == Some(&2)
            && reads.get(v.0 as usize) == Some(&1)
            && once(dst)
            && words(v) == words(dst)
            && !folds.contains_key(&v.0)
        {
            folds.insert(v.0, dst);
            folded_ops.push(dst);
        }
    });
    if folds.is_empty() {
        return Vec::new();
    }
    // Keep only the `v`s written by a constant and a masked load.
    let mut shape: HashMap<u32, (bool, bool)> = HashMap::new();
    k.walk(&mut |inst| match inst {
        Inst::Mov {
            dst,
            src: Operand::Int(_) | Operand::Float(_),
        } if folds.contains_key(&dst.0) => shape.entry(dst.0).or_default().0 = true,
        Inst::Ld {
            dst, pred: Some(_), ..
        } => {
            for d in dst {
                if folds.contains_key(&d.0) {
                    shape.entry(d.0).or_default().1 = true;
                }
            }
        }
        _ => {}
    });
    folds.retain(|v, _| shape.get(v) == Some(&(true, true)));
    let dead: std::collections::HashSet<u32> = folds.values().map(|w| w.0).collect();
    rewrite_folds(&mut k.body, &folds, &dead);
    folded_ops.retain(|w| dead.contains(&w.0));
    folded_ops
}

fn rewrite_folds(
    insts: &mut Vec<Inst>,
    folds: &HashMap<u32, Reg>,
    dead: &std::collections::HashSet<u32>,
) {
    insts.retain_mut(|inst| {
        match inst {
            Inst::Mov { dst, .. } => {
                if let Some(w) = folds.get(&dst.0) {
                    *dst = *w;
                }
            }
            Inst::Ld { dst, .. } => {
                for d in dst.iter_mut() {
                    if let Some(w) = folds.get(&d.0) {
                        *d = *w;
                    }
                }
            }
            Inst::For { body, .. } => rewrite_folds(body, folds, dead),
            Inst::While { cond, body, .. } => {
                rewrite_folds(cond, folds, dead);
                rewrite_folds(body, folds, dead);
            }
            Inst::If {
                then, otherwise, ..
            } => {
                rewrite_folds(then, folds, dead);
                rewrite_folds(otherwise, folds, dead);
            }
            other => {
                // The folded op itself goes: its result is now the load's.
                let defs = other.defs();
                if defs.len() == 1
                    && dead.contains(&defs[0].0)
                    && other
                        .uses()
                        .iter()
                        .any(|u| folds.get(&u.0) == Some(&defs[0]))
                {
                    return false;
                }
            }
        }
        true
    });
}

/// Moves each pure instruction all of whose readers are one masked access
/// later in the same list, or instructions moved to it, to right before
/// that access (module docs). Its operands are last written before it, so the move
/// does not change what it reads.
fn sink_into_masked(insts: &mut Vec<Inst>, def_count: &[u32], reads: &[u32]) {
    for i in insts.iter_mut() {
        match i {
            Inst::For { body, .. } => sink_into_masked(body, def_count, reads),
            Inst::While { cond, body, .. } => {
                sink_into_masked(cond, def_count, reads);
                sink_into_masked(body, def_count, reads);
            }
            Inst::If {
                then, otherwise, ..
            } => {
                sink_into_masked(then, def_count, reads);
                sink_into_masked(otherwise, def_count, reads);
            }
            _ => {}
        }
    }
    let n = insts.len();
    // Per register written in this list, the last index writing it and how
    // many instructions of the list write it.
    let mut writer: HashMap<u32, usize> = HashMap::new();
    let mut writes: HashMap<u32, u32> = HashMap::new();
    for (j, inst) in insts.iter().enumerate() {
        for d in inst.defs() {
            writer.insert(d.0, j);
            *writes.entry(d.0).or_default() += 1;
        }
    }
    // An operand keeps its value from `i` on: every write of it is in this
    // list, before `i` (a masked load's merge included).
    let settled = |r: Reg, i: usize| {
        writer.get(&r.0).is_some_and(|&w| w < i)
            && writes.get(&r.0).copied() == def_count.get(r.0 as usize).copied()
            || def_count.get(r.0 as usize) == Some(&0)
    };
    // Per register, the instructions of this list reading it.
    let mut readers: HashMap<u32, Vec<usize>> = HashMap::new();
    for (j, inst) in insts.iter().enumerate() {
        for u in inst.uses() {
            readers.entry(u.0).or_default().push(j);
        }
    }
    // target[i] = t: instruction i runs in the branch of the masked access
    // t. Decided from the end, so that every reader's is known: a value all
    // of whose readers run in one branch runs there too.
    let mut target: Vec<Option<usize>> = vec![None; n];
    for i in (0..n).rev() {
        crate::cancel::checkpoint();
        let inst = &insts[i];
        if masked(inst) {
            target[i] = Some(i);
            continue;
        }
        let [d] = inst.defs()[..] else { continue };
        if !inst.is_pure()
            || matches!(
                inst,
                Inst::Param { .. } | Inst::Special { .. } | Inst::SmemAddr { .. }
            )
            || def_count.get(d.0 as usize) != Some(&1)
            || !inst.uses().iter().all(|&r| settled(r, i))
        {
            continue;
        }
        let Some(rs) = readers.get(&d.0) else {
            continue;
        };
        if rs.len() as u32 != reads.get(d.0 as usize).copied().unwrap_or(0) {
            continue; // read in a nested region too
        }
        let t = target[rs[0]];
        if t.is_some() && rs.iter().all(|&r| r > i && target[r] == t) {
            target[i] = t;
        }
    }
    // The moved instructions go, in their order, right before their access.
    let moved = |k: usize| target[k].is_some_and(|t| t != k);
    if !(0..n).any(moved) {
        return;
    }
    let mut before: Vec<Vec<usize>> = vec![Vec::new(); n];
    for k in (0..n).filter(|&k| moved(k)) {
        before[target[k].expect("moved")].push(k);
    }
    let mut order = Vec::with_capacity(n);
    for k in (0..n).filter(|&k| !moved(k)) {
        order.extend(before[k].iter().copied());
        order.push(k);
    }
    let mut slots: Vec<Option<Inst>> = insts.drain(..).map(Some).collect();
    insts.extend(order.into_iter().filter_map(|k| slots[k].take()));
}
