//! The resources of a kernel on an AMD arch, from its Target IR.
//!
//! LLVM's AMDGPU backend keeps a value that is the same in every lane of a
//! wave (wave-uniform: kernel arguments, workgroup ids, shared buffer
//! addresses, loop counters with uniform bounds, and whatever is computed
//! from those alone) in scalar registers (SGPRs), once per wave, and every
//! other value in vector registers (VGPRs), one per lane; a 64-bit value
//! takes two of either. A lane mask (a divergent compare's result) takes an
//! SGPR per 32 lanes. So the liveness of the per-thread program (the same
//! program and order as the NVIDIA estimate, see the module docs of
//! `backend/resources`) is run twice: over the divergent registers for the
//! VGPRs, over the uniform ones and the lane masks for the SGPRs, each plus
//! what clang adds beyond the program's values
//! ([`crate::target::amdgpu`]). Where LLVM differs from ptxas the program
//! follows LLVM: every load of a stretch is issued early (no window), and a
//! divergent 64-bit address takes one VGPR (a 32-bit offset from a base in
//! SGPRs). AGPRs hold CDNA's matrix-core accumulators;
//! Target IR has no AMD matrix instruction here, so a kernel uses none.

use super::liveness::max_pressure;
use super::program::program_with_origin;
use super::report::{AmdRegs, Resources};
use crate::ir::target::{Inst, Kernel, Operand, Special};
use crate::target::amdgpu::{sgpr_base, ADDRESS_VGPRS, MIN_VGPRS, VGPR_OVERHEAD};

/// Per register of `kernel`, whether it is wave-uniform: written only by
/// instructions whose inputs are all uniform (kernel parameters, workgroup
/// ids and counts, shared buffer addresses, constants), never under a branch
/// or in a loop whose condition is divergent. Thread ids, loads, shuffles,
/// atomics and matrix instructions give divergent values (a uniform load is
/// a scalar load only from constant memory, which Target IR does not use).
pub fn uniform_regs(kernel: &Kernel) -> Vec<bool> {
    let mut uniform = vec![true; kernel.regs.len()];
    // Divergence only grows: repeat until no register changes (registers
    // carried around loops are written more than once).
    loop {
        let mut changed = false;
        walk(&kernel.body, false, &mut uniform, &mut changed);
        if !changed {
            return uniform;
        }
    }
}

fn walk(insts: &[Inst], divergent_ctl: bool, uniform: &mut [bool], changed: &mut bool) {
    let is_uniform = |u: &[bool], o: &Operand| match o {
        Operand::Reg(r) => u[r.0 as usize],
        _ => true,
    };
    for inst in insts {
        let all_uses = inst.uses().iter().all(|r| uniform[r.0 as usize]);
        let value_uniform = !divergent_ctl
            && match inst {
                Inst::Param { .. } | Inst::SmemAddr { .. } => true,
                Inst::Special { which, .. } => !matches!(which, Special::ThreadId),
                Inst::Mov { .. }
                | Inst::Unary { .. }
                | Inst::Binary { .. }
                | Inst::Fma { .. }
                | Inst::MulWide { .. }
                | Inst::Cmp { .. }
                | Inst::Select { .. }
                | Inst::Cvt { .. } => all_uses,
                _ => false,
            };
        match inst {
            Inst::For {
                iv,
                lo,
                hi,
                step,
                body,
            } => {
                let bounds = [lo, hi, step].iter().all(|o| is_uniform(uniform, o));
                let ctl = divergent_ctl || !bounds;
                mark(uniform, iv.0, !ctl, changed);
                walk(body, ctl, uniform, changed);
            }
            Inst::While { cond, pred, body } => {
                // The loop's trip count is uniform only if its predicate is,
                // which depends on the body: walk with the predicate as it
                // stands; the fixpoint catches it turning divergent.
                let ctl = divergent_ctl || !uniform[pred.0 as usize];
                walk(cond, ctl, uniform, changed);
                walk(body, ctl, uniform, changed);
            }
            Inst::If {
                cond,
                then,
                otherwise,
            } => {
                let ctl = divergent_ctl || !uniform[cond.0 as usize];
                walk(then, ctl, uniform, changed);
                walk(otherwise, ctl, uniform, changed);
            }
            _ => {
                for d in inst.defs() {
                    mark(uniform, d.0, value_uniform, changed);
                }
            }
        }
    }
}

fn mark(uniform: &mut [bool], r: u32, value_uniform: bool, changed: &mut bool) {
    if !value_uniform && uniform[r as usize] {
        uniform[r as usize] = false;
        *changed = true;
    }
}

/// The resources of a Target IR kernel on an AMD arch (module docs).
pub fn of_target(kernel: &Kernel) -> Resources {
    let uniform = uniform_regs(kernel);
    let wave = kernel.arch.info().warp_size;
    let (program, words, origin) = program_with_origin(kernel, true, false, false, false);
    let is_uniform = |r: u32| {
        origin
            .get(r as usize)
            .and_then(|&o| uniform.get(o as usize))
            .copied()
            .unwrap_or(false)
    };
    let is_pred = |r: u32| {
        origin
            .get(r as usize)
            .and_then(|&o| kernel.regs.get(o as usize))
            .is_some_and(|t| *t == crate::ir::target::RegTy::Pred)
    };
    let word = |r: u32| words.get(r as usize).copied().unwrap_or(1);
    // Target IR's addresses are `U64` (64-bit integer data is `I64`).
    let is_u64 = |r: u32| {
        origin
            .get(r as usize)
            .and_then(|&o| kernel.regs.get(o as usize))
            .is_some_and(|t| *t == crate::ir::target::RegTy::U64)
    };
    let vgpr_words = |r: u32| {
        if is_uniform(r) {
            0
        } else if is_u64(r) {
            ADDRESS_VGPRS
        } else {
            word(r)
        }
    };
    let sgpr_words = |r: u32| {
        if is_pred(r) {
            // A uniform compare sets SCC, read at once; a divergent one is
            // a lane mask of a bit per lane.
            if is_uniform(r) {
                0
            } else {
                wave / 32
            }
        } else if is_uniform(r) {
            word(r)
        } else {
            0
        }
    };
    let vgprs = (max_pressure(&program, &vgpr_words) + VGPR_OVERHEAD).max(MIN_VGPRS);
    let sgprs = max_pressure(&program, &sgpr_words) + sgpr_base(kernel.arch);
    Resources::amd(
        kernel.name.clone(),
        kernel.arch,
        kernel.num_threads,
        vgprs,
        AmdRegs { agprs: 0, sgprs },
        kernel.smem_bytes(),
    )
}
