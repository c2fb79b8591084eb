//! The resources of a kernel on an AMD arch, from its Target IR.
//!
//! clang's `-O3` pipeline first removes what the printed HIP repeats or
//! never reads; the estimate does the same to the Target IR
//! ([`super::llvm_ir`]). LLVM's AMDGPU backend then keeps a value that is
//! the same in every lane of a wave (wave-uniform: kernel arguments,
//! workgroup ids, shared buffer addresses, loop counters with uniform
//! bounds, scalar loads, and whatever integer value is computed from those
//! alone) in scalar registers (SGPRs), once per wave, and every other value
//! in vector registers (VGPRs), one per lane; floating-point arithmetic is
//! vector-ALU work, so its results are VGPRs even where uniform. A 64-bit
//! value takes two of either. A lane mask (a divergent compare's result)
//! takes an SGPR per 32 lanes. So the liveness of the per-thread program
//! (the same program and order as the NVIDIA estimate, see the module docs
//! of `backend/resources`) is run twice: over the VGPR values, and over the
//! SGPR values and the lane masks, each plus what clang adds beyond the
//! program's values ([`crate::target::amdgpu`]). Where LLVM differs from
//! ptxas the program follows LLVM: every load of a stretch is issued early
//! (no window), a divergent 64-bit address takes one VGPR (a 32-bit offset
//! from a base in SGPRs), and IEEE division and square root are expanded
//! inline. Matrix-core accumulators on gfx90a and gfx942 are AGPRs where
//! LLVM selects MFMA's AGPR form, in a workgroup of at most four waves of 64
//! (one wave a SIMD may then use more than 256 registers: flash attention
//! with D = 128, 248 VGPRs and 64 AGPRs), and VGPRs otherwise
//! ([`agpr_accumulators`]); AGPRs taken as room for values once the VGPRs
//! run out are not modelled.
//!
//! What the model misses (the corpus's kernels over 35%, printed by
//! `compiler/tests/clang_amdgpu.rs`): LLVM's scheduler spends the VGPRs an
//! occupancy target leaves free on latency (transcendental-heavy and
//! attention kernels on gfx1100 take two to four times the values they
//! hold), packs 8- and 16-bit integers, spills SGPRs into VGPR lanes past
//! the SGPR limit, and reschedules a kernel past its VGPR budget to fit it.

use super::liveness::max_pressure;
use super::llvm_ir::as_llvm_leaves_it;
use super::program::{program_with_origin, Hoist};
use super::report::{AmdRegs, Resources};
use crate::ir::target::{Inst, Kernel, Operand, Reg, Space, Special};
use crate::target::amdgpu::{sgpr_base, ADDRESS_VGPRS, MIN_VGPRS, VGPR_OVERHEAD};
use crate::target::mma::MmaKind;

/// Per register of `kernel`, whether it is wave-uniform: written only by
/// instructions whose inputs are all uniform (kernel parameters, workgroup
/// ids and counts, shared buffer addresses, constants), never under a branch
/// or in a loop whose condition is divergent. Thread ids, shuffles, atomics,
/// matrix instructions and most loads give divergent values. A global load
/// from a uniform address that no store or atomic of the kernel can have
/// written before it is a scalar load (`s_load`) into SGPRs: LLVM's
/// `AMDGPUAnnotateUniformValues` marks it `amdgpu.noclobber` (a `BLOCK = 4`
/// kernel whose every lane adds the same four pairs: clang 2 VGPRs on
/// gfx90a, 9 estimated with its loads in VGPRs).
pub fn uniform_regs(kernel: &Kernel) -> Vec<bool> {
    let mut uniform = vec![true; kernel.regs.len()];
    // Divergence only grows: repeat until no register changes (registers
    // carried around loops are written more than once).
    loop {
        let mut changed = false;
        let mut clobbered = false;
        walk(
            &kernel.body,
            false,
            &mut clobbered,
            &mut uniform,
            &mut changed,
        );
        if !changed {
            return uniform;
        }
    }
}

/// Whether `insts` write global memory (a store or an atomic, nested ones
/// included).
fn writes_global(insts: &[Inst]) -> bool {
    insts.iter().any(|i| {
        matches!(
            i,
            Inst::St {
                space: Space::Global,
                ..
            } | Inst::AtomAdd { .. }
        ) || i.regions().into_iter().any(|r| writes_global(r))
    })
}

/// One pass of [`uniform_regs`] over `insts`; `clobbered`: whether global
/// memory may have been written on a path to here.
fn walk(
    insts: &[Inst],
    divergent_ctl: bool,
    clobbered: &mut bool,
    uniform: &mut [bool],
    changed: &mut bool,
) {
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
                | Inst::PackBf16 { .. }
                | Inst::Cmp { .. }
                | Inst::Select { .. }
                | Inst::Cvt { .. } => all_uses,
                Inst::Ld {
                    space: Space::Global,
                    ..
                } => all_uses && !*clobbered,
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
                // A store late in the body comes before the next trip's loads.
                *clobbered |= writes_global(body);
                walk(body, ctl, clobbered, uniform, changed);
            }
            Inst::While { cond, pred, body } => {
                // The loop's trip count is uniform only if its predicate is,
                // which depends on the body: walk with the predicate as it
                // stands; the fixpoint catches it turning divergent.
                let ctl = divergent_ctl || !uniform[pred.0 as usize];
                *clobbered |= writes_global(cond) || writes_global(body);
                walk(cond, ctl, clobbered, uniform, changed);
                walk(body, ctl, clobbered, uniform, changed);
            }
            Inst::If {
                cond,
                then,
                otherwise,
            } => {
                let ctl = divergent_ctl || !uniform[cond.0 as usize];
                let mut in_other = *clobbered;
                walk(then, ctl, clobbered, uniform, changed);
                walk(otherwise, ctl, &mut in_other, uniform, changed);
                *clobbered |= in_other;
            }
            _ => {
                *clobbered |= writes_global(std::slice::from_ref(inst));
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

/// Per register of `kernel`, whether some instruction computes it with
/// floating-point arithmetic or a conversion to or from a float. The scalar
/// ALU of gfx9 and gfx11 has no floating-point instructions, so such a value
/// is in VGPRs even where it is the same in every lane (four scalar-loaded
/// floats plus one: clang `v_add_f32 v3, s6, 1.0`, 5 VGPRs with the lane id).
fn vector_alu_regs(kernel: &Kernel, folded: &[Reg]) -> Vec<bool> {
    let mut valu = vec![false; kernel.regs.len()];
    // A float operation folded into a load's branch still runs there.
    for r in folded {
        if let Some(v) = valu.get_mut(r.0 as usize) {
            *v = kernel.regs[r.0 as usize].is_float();
        }
    }
    let float =
        |r: &crate::ir::target::Reg| kernel.regs.get(r.0 as usize).is_some_and(|t| t.is_float());
    kernel.walk(&mut |inst| {
        let computed = match inst {
            Inst::Unary { dst, .. } | Inst::Binary { dst, .. } | Inst::Fma { dst, .. } => {
                float(dst)
            }
            Inst::Cvt { dst, src, .. } => float(dst) || float(src),
            _ => false,
        };
        if computed {
            for d in inst.defs() {
                if let Some(v) = valu.get_mut(d.0 as usize) {
                    *v = true;
                }
            }
        }
    });
    valu
}

/// Per register of `kernel`, whether LLVM keeps it in AGPRs: the
/// accumulators (`c` and `d`) of MFMA instructions, where the workgroup is
/// small enough that one wave may use more registers than the 256
/// architectural VGPRs. LLVM then selects MFMA's AGPR form
/// (`SIMachineFunctionInfo::MayNeedAGPRs` stays set when
/// `getMaxNumVGPRs` exceeds 256); with two or more waves a SIMD it selects
/// the VGPR form. `gemm_bf16` at 4 waves of 64 lanes: clang 67 VGPRs and 64
/// AGPRs (its 128 x 128 f32 accumulator); at 8 waves, 68 VGPRs and none.
fn agpr_accumulators(kernel: &Kernel) -> Vec<bool> {
    let mut acc = vec![false; kernel.regs.len()];
    let Some(amd) = kernel.arch.info().amd.filter(|a| a.agprs > 0) else {
        return acc;
    };
    let wave = kernel.arch.info().warp_size.max(1);
    let waves = kernel.num_threads.div_ceil(wave).max(1);
    let min_waves_per_simd = waves.div_ceil(amd.simds.max(1));
    let most = (amd.vgprs_per_lane / min_waves_per_simd).min(amd.addressable_vgprs);
    if most <= amd.arch_vgprs {
        return acc;
    }
    kernel.walk(&mut |inst| {
        if let Inst::Mma {
            kind: MmaKind::Mfma,
            c,
            d,
            ..
        } = inst
        {
            for r in c.iter().chain(d) {
                if let Some(a) = acc.get_mut(r.0 as usize) {
                    *a = true;
                }
            }
        }
    });
    acc
}

/// The resources of a Target IR kernel on an AMD arch (module docs).
pub fn of_target(kernel: &Kernel) -> Resources {
    let (kernel, folded) = as_llvm_leaves_it(kernel);
    let kernel = &kernel;
    let valu = vector_alu_regs(kernel, &folded);
    let uniform = uniform_regs(kernel);
    let wave = kernel.arch.info().warp_size;
    let (program, words, origin) = program_with_origin(kernel, Hoist::All, false, false, false);
    let is_uniform = |r: u32| {
        origin.get(r as usize).is_some_and(|&o| {
            uniform.get(o as usize).copied().unwrap_or(false)
                && !valu.get(o as usize).copied().unwrap_or(false)
        })
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
    let acc = agpr_accumulators(kernel);
    let in_agprs = |r: u32| {
        origin
            .get(r as usize)
            .is_some_and(|&o| acc.get(o as usize).copied().unwrap_or(false))
    };
    let vgpr_words = |r: u32| {
        if is_uniform(r) || in_agprs(r) {
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
    // A kernel that writes no memory is deleted whole by LLVM (an empty
    // kernel, or one whose stores are unreachable: clang 0 VGPRs).
    let mut writes = false;
    kernel.walk(&mut |i| {
        writes |= matches!(
            i,
            Inst::St { .. } | Inst::AtomAdd { .. } | Inst::CpAsync { .. } | Inst::Trap { .. }
        )
    });
    let vgprs = if writes {
        (max_pressure(&program, &vgpr_words) + VGPR_OVERHEAD).max(MIN_VGPRS)
    } else {
        0
    };
    let sgprs = max_pressure(&program, &sgpr_words) + sgpr_base(kernel.arch);
    let agpr_words = |r: u32| if in_agprs(r) { word(r) } else { 0 };
    let agprs = if writes {
        max_pressure(&program, &agpr_words)
    } else {
        0
    };
    Resources::amd(
        kernel.name.clone(),
        kernel.arch,
        kernel.num_threads,
        vgprs,
        AmdRegs { agprs, sgprs },
        kernel.smem_bytes(),
    )
}
