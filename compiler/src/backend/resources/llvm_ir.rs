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
//!   are dropped (a fuzz kernel computing a chain it never stores).

use std::collections::HashMap;

use super::unroll::rename_regs;
use crate::ir::target::{Inst, Kernel, Operand, Reg};

/// `kernel` after common-subexpression and dead-code elimination (module docs).
pub(super) fn as_llvm_leaves_it(kernel: &Kernel) -> Kernel {
    let mut k = kernel.clone();
    let mut def_count = vec![0u32; k.regs.len()];
    count_defs(&k.body, &mut def_count);
    let mut cse = Cse {
        def_count: &def_count,
        scopes: vec![HashMap::new()],
        replaced: HashMap::new(),
    };
    cse.region(&mut k.body);
    // Dead code: drop what nothing reads, until nothing more goes.
    loop {
        let mut read = vec![false; k.regs.len()];
        mark_reads(&k.body, &mut read);
        if !drop_unread(&mut k.body, &read) {
            break;
        }
    }
    k
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
                other => rename_regs(other, &mut rename, &mut |_| {}),
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
        rename_regs(&mut shape, &mut |_| {}, &mut |d| *d = Reg(u32::MAX));
        Some((format!("{shape:?}"), dst))
    }
}

/// Marks every register some instruction reads (a predicated load's own
/// destinations, which it "reads" to keep where the predicate is false, do
/// not count: nothing else needs them).
fn mark_reads(insts: &[Inst], read: &mut [bool]) {
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
            if let Some(x) = read.get_mut(r.0 as usize) {
                *x = true;
            }
        }
        for r in i.regions() {
            mark_reads(r, read);
        }
    }
}

/// Drops the pure instructions and loads none of whose results is read;
/// whether any went.
fn drop_unread(insts: &mut Vec<Inst>, read: &[bool]) -> bool {
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
        let unread = !defs.is_empty()
            && defs
                .iter()
                .all(|d| !read.get(d.0 as usize).copied().unwrap_or(true));
        if removable && unread {
            dropped = true;
            false
        } else {
            true
        }
    });
    dropped
}
