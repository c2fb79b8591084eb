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
//!
//! A store's data are VGPRs even where wave-uniform ([`stored_in_vgprs`]).
//! Where a loop's MFMAs accumulate in AGPRs, LLVM keeps a VGPR copy of the
//! accumulators from the loop's head to its first MFMA when each tile takes
//! enough k steps a trip ([`accumulator_copies`]).
//!
//! LLVM's scheduler spends the VGPRs that the occupancy the other resources
//! allow leaves free ([`vgpr_budget`]: LDS, workgroup size) on latency, which
//! the statement order does not show. Two parts of that are modelled, each
//! within the budget: the MMA operand fragments of more k steps read from
//! LDS ahead of the MMAs, as many steps as fit ([`fragments_ahead`]:
//! clang-19 on gfx1100 holds 2 to 4 steps' fragments of a WMMA GEMM, 116 to
//! 245 VGPRs, where one step's gave 75 to 141), and a share
//! ([`LATENCY_SHARE`]) of the way to a latency order of every block
//! ([`ilp_order`](super::order::ilp_order): loads and independent chains
//! early). On the corpus (`compiler/tests/clang_amdgpu.rs`) they took the
//! kernels over 35% from 35 / 32 / 48 to 22 / 22 / 26 on gfx90a / gfx942 /
//! gfx1100, the median errors from 14.6% / 14.3% / 12.5% to 11.1% / 10.0% /
//! 9.4%, and the kernels whose VGPRs allocate as clang's from 114 / 132 /
//! 140 to 130 / 160 / 157.
//!
//! What the model misses (the corpus's kernels over 35%, printed by
//! `compiler/tests/clang_amdgpu.rs`): the rest of the latency order in
//! transcendental-heavy straight-line code (exp/log and tanh
//! approximations: clang 33 to 53 VGPRs, 12 to 14 estimated), packing of 8-
//! and 16-bit integers, which instructions of a small kernel clang
//! reorders (kernels of 2 to 9 VGPRs, a few off), SGPRs spilled into VGPR
//! lanes past the SGPR limit, kernels past the register file, which LLVM
//! reschedules or spills (estimated 195 to 387, clang 79 to 157), and the
//! accumulator copy of a loop that reads one operand from a loop-invariant
//! tile (`keys` of tests/codegen/pipeline/loop_extent_unpredicated.tsr on
//! CDNA: clang 33, 57 estimated with the copy). Tried against the corpus
//! and not kept: the division and square-root scratch multiplied by the
//! expansions of a block (LLVM interleaves `un`'s square roots but not a
//! softmax's divisions: 9 kernels came within 35%, 25 went past it);
//! unmasked loads sunk with their arithmetic into a masked store's branch
//! as a nested block (4 in, 15 out, and values in that branch no longer
//! wave-uniform: SGPR median error 12.5% to 46%); no accumulator copy
//! where an MFMA reads a fragment from before the loop, or where the loop
//! has no masked load (`keys` has both; no kernel moved); the 64-bit byte
//! offset an address addition reads in one VGPR, as the address is (the
//! `saddr` form's 32-bit offset: small copies came within 35%, kernels
//! already under clang's count went further under it; 20 / 20 / 25 kernels
//! over 35% became 25 / 22 / 25, gfx1100's median 9.0% → 7.7%).

use super::liveness::max_pressure;
use super::llvm_ir::as_llvm_leaves_it;
use super::program::{program_with_origin, Hoist};
use super::report::{AmdRegs, Resources};
use crate::ir::target::{Inst, Kernel, Operand, Reg, Space, Special};
use crate::target::amdgpu::{sgpr_base, ADDRESS_VGPRS, LATENCY_SHARE, MIN_VGPRS, VGPR_OVERHEAD};
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
/// gfx90a, 9 estimated with its loads in VGPRs), where it moves a dword or
/// more: a uniform load of an i8 or a 16-bit element is a vector load (a
/// 1,023-element i8 tile every lane holds whole, tests/fuzz's
/// `report_odd_tile_slow`: clang 256 VGPRs, 2 estimated with its loads in
/// SGPRs).
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
                // Scalar loads move whole dwords on gfx9 and gfx11: a
                // uniform load of fewer bytes (an i8 or bf16 element) is a
                // vector load into VGPRs.
                Inst::Ld {
                    space: Space::Global,
                    mem,
                    dst,
                    ..
                } => all_uses && !*clobbered && mem.bytes() as usize * dst.len() >= 4,
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
    let (mut kernel, folded) = as_llvm_leaves_it(kernel);
    let mut valu = vector_alu_regs(&kernel, &folded);
    let mut uniform = uniform_regs(&kernel);
    stored_in_vgprs(&mut kernel, &mut uniform, &mut valu);
    let kernel = &kernel;
    // A kernel that writes no memory is deleted whole by LLVM (an empty
    // kernel, or one whose stores are unreachable: clang 0 VGPRs).
    let (mut writes, mut mma) = (false, false);
    kernel.walk(&mut |i| {
        writes |= matches!(
            i,
            Inst::St { .. } | Inst::AtomAdd { .. } | Inst::CpAsync { .. } | Inst::Trap { .. }
        );
        mma |= matches!(i, Inst::Mma { .. });
    });
    let classes = Classes {
        uniform,
        valu,
        acc: agpr_accumulators(kernel),
        writes,
    };
    let count = |hoist: Hoist, ilp: bool, vgprs_only: bool| -> (u32, u32, u32) {
        let (mut program, mut words, mut origin) =
            program_with_origin(kernel, hoist, false, ilp, false);
        accumulator_copies(&mut program, &mut words, &mut origin, &classes.acc);
        pressures(kernel, &program, &words, &origin, &classes, vgprs_only)
    };
    let (mut vgprs, sgprs, agprs) = count(Hoist::All, false, false);
    // LLVM's scheduler spends what the occupancy leaves free on latency:
    // more k steps' fragments ahead of the MMAs, and part of the way to a
    // latency order (module docs).
    let budget = vgpr_budget(kernel, agprs);
    if mma {
        vgprs = vgprs.max(fragments_ahead(vgprs, budget, |n| {
            count(Hoist::SharedSteps(n), false, true).0
        }));
    }
    if vgprs < budget {
        let latency = count(Hoist::All, true, true).0.min(budget);
        if latency > vgprs {
            vgprs += (latency - vgprs + LATENCY_SHARE / 2) / LATENCY_SHARE;
        }
    }
    Resources::amd(
        kernel.name.clone(),
        kernel.arch,
        kernel.num_threads,
        vgprs,
        AmdRegs { agprs, sgprs },
        kernel.smem_bytes(),
    )
}

/// What the estimate knows of each register of a kernel as LLVM leaves it.
struct Classes {
    /// Wave-uniform ([`uniform_regs`]).
    uniform: Vec<bool>,
    /// Computed by the vector ALU ([`vector_alu_regs`]).
    valu: Vec<bool>,
    /// In AGPRs ([`agpr_accumulators`]).
    acc: Vec<bool>,
    /// Whether the kernel writes memory at all.
    writes: bool,
}

/// Peak VGPRs, SGPRs and AGPRs of `program` (of `kernel` as LLVM leaves
/// it); the VGPRs alone (0 for the others) where `vgprs_only`.
fn pressures(
    kernel: &Kernel,
    program: &[super::Node],
    words: &[u32],
    origin: &[u32],
    classes: &Classes,
    vgprs_only: bool,
) -> (u32, u32, u32) {
    let Classes {
        uniform,
        valu,
        acc,
        writes,
    } = classes;
    let writes = *writes;
    let wave = kernel.arch.info().warp_size;
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
    let vgprs = if writes {
        (max_pressure(program, &vgpr_words) + VGPR_OVERHEAD).max(MIN_VGPRS)
    } else {
        0
    };
    if vgprs_only {
        return (vgprs, 0, 0);
    }
    let sgprs = max_pressure(program, &sgpr_words) + sgpr_base(kernel.arch);
    let agpr_words = |r: u32| if in_agprs(r) { word(r) } else { 0 };
    let agprs = if writes {
        max_pressure(program, &agpr_words)
    } else {
        0
    };
    (vgprs, sgprs, agprs)
}

/// VGPRs a wave may use without lowering the waves per SIMD that the
/// kernel's other resources (workgroup size, LDS, barriers) allow: LLVM's
/// scheduler spends up to this on latency.
pub(super) fn vgpr_budget(kernel: &Kernel, agprs: u32) -> u32 {
    let Some(amd) = kernel.arch.info().amd else {
        return 0;
    };
    let usage = crate::backend::occupancy::AmdUsage {
        threads: kernel.num_threads,
        vgprs: 0,
        agprs: 0,
        sgprs: 0,
        lds_bytes: kernel.smem_bytes(),
    };
    let waves = crate::backend::occupancy::amd_occupancy(kernel.arch, usage)
        .waves_per_simd
        .unwrap_or(0)
        .max(1);
    let per_wave = (amd.vgprs_per_lane / waves) / amd.vgpr_granule * amd.vgpr_granule;
    let total = per_wave.min(amd.addressable_vgprs);
    let total = if agprs > 0 {
        total.saturating_sub(agprs) / 4 * 4
    } else {
        total
    };
    total.min(amd.arch_vgprs)
}

/// VGPRs with the MMA operand fragments of as many k steps loaded ahead of
/// the MMAs as `budget` allows: the most of `at(1)`, `at(2)`, ... within it
/// (`at(n)`: the VGPRs with `n` steps' fragments early, growing with `n`),
/// `base` where even one step's exceed it. Steps double until one is over
/// the budget or holds every fragment, then bisect: a few liveness runs
/// however many k steps the kernel has.
pub(super) fn fragments_ahead(base: u32, budget: u32, at: impl Fn(u32) -> u32) -> u32 {
    let all = at(u32::MAX);
    if all <= base {
        return base;
    }
    let mut best = base;
    // `fits`: the most steps known within the budget; `over`: the fewest
    // known past it.
    let (mut fits, mut over) = (0, None);
    let mut n = 1;
    while n <= MAX_STEPS_AHEAD {
        let v = at(n);
        if v > budget {
            over = Some(n);
            break;
        }
        best = best.max(v);
        if v >= all {
            return best;
        }
        fits = n;
        n *= 2;
    }
    let Some(mut over) = over else {
        return best;
    };
    while over - fits > 1 {
        let mid = fits + (over - fits) / 2;
        let v = at(mid);
        if v > budget {
            over = mid;
        } else {
            best = best.max(v);
            fits = mid;
        }
    }
    best
}

/// The most k steps of fragments [`fragments_ahead`] tries: each try is a
/// liveness run over the kernel.
const MAX_STEPS_AHEAD: u32 = 16;

/// Where a loop's MFMAs accumulate in AGPRs, the VGPR copy of the
/// accumulators LLVM keeps across the loop's head (the register allocator
/// splits their live range: `v_accvgpr_read` of every accumulator at the
/// head, the next tiles' loads and LDS stores, `v_accvgpr_write` back just
/// before the first MFMA; clang-19, 64 x 128 x 64 bf16 GEMMs on 4 waves of
/// gfx90a and gfx942: 32 VGPRs). It does so where each accumulator tile
/// takes at least [`COPY_ALL_MFMAS`] MFMAs a trip, and of one tile where it
/// takes at least [`COPY_ONE_MFMAS`] and a result is read after the loop by
/// arithmetic (a scale, a conversion), not only stored; and not where the
/// loop reads the accumulators before its first MFMA (attention's rescale).
/// Modelled as a value of those words written at the top of the loop body
/// and read by its first MFMA.
pub(super) fn accumulator_copies(
    program: &mut [super::Node],
    words: &mut Vec<u32>,
    origin: &mut Vec<u32>,
    acc: &[bool],
) {
    use super::Node;
    if !acc.iter().any(|&a| a) {
        return;
    }
    let in_agprs = |origin: &[u32], r: u32| {
        origin
            .get(r as usize)
            .is_some_and(|&o| acc.get(o as usize).copied().unwrap_or(false))
    };
    // An MFMA: an instruction writing several accumulators (not a move of
    // one), from accumulators.
    let is_mfma = |origin: &[u32], n: &Node| match n {
        Node::Inst { defs, uses } => {
            defs.len() > 1
                && defs.iter().all(|&d| in_agprs(origin, d))
                && uses.iter().any(|&u| in_agprs(origin, u))
        }
        _ => false,
    };
    for i in 0..program.len() {
        // What follows the loop first reads of the accumulators: arithmetic
        // (it writes something other than accumulators) or not.
        let read_after = program[i + 1..].iter().find_map(|n| match n {
            Node::Inst { defs, uses } if uses.iter().any(|&u| in_agprs(origin, u)) => {
                Some(!defs.is_empty() && !defs.iter().all(|&d| in_agprs(origin, d)))
            }
            _ => None,
        });
        let Node::Loop { body, .. } = &mut program[i] else {
            continue;
        };
        accumulator_copies(body, words, origin, acc);
        let mut written = rustc_hash::FxHashSet::default();
        let mut mfmas = 0u32;
        let mut heads = Vec::new();
        let mut carried_words = 0u32;
        let mut read_first = false;
        for (j, n) in body.iter().enumerate() {
            let Node::Inst { defs, uses } = n else {
                continue;
            };
            // Accumulators read before the body writes them: carried.
            let carried: Vec<u32> = uses
                .iter()
                .copied()
                .filter(|&u| in_agprs(origin, u) && !written.contains(&u))
                .collect();
            if is_mfma(origin, n) {
                mfmas += 1;
                if !carried.is_empty() {
                    heads.push(j);
                    carried_words += carried
                        .iter()
                        .map(|&u| words.get(u as usize).copied().unwrap_or(1))
                        .sum::<u32>();
                }
            } else if !carried.is_empty() && heads.is_empty() {
                read_first = true;
            }
            written.extend(defs.iter().copied());
        }
        let Some(&first) = heads.first() else {
            continue;
        };
        if read_first {
            continue;
        }
        let per_tile = mfmas / heads.len() as u32;
        let copy = if per_tile >= COPY_ALL_MFMAS {
            carried_words
        } else if per_tile >= COPY_ONE_MFMAS && read_after == Some(true) {
            carried_words / heads.len() as u32
        } else {
            0
        };
        if copy == 0 {
            continue;
        }
        let r = words.len() as u32;
        words.push(copy);
        origin.push(u32::MAX);
        if let Node::Inst { uses, .. } = &mut body[first] {
            uses.push(r);
        }
        body.insert(
            0,
            Node::Inst {
                defs: vec![r],
                uses: vec![],
            },
        );
    }
}

/// MFMAs a trip on each accumulator tile from which LLVM copies every
/// accumulator to VGPRs across a loop's head ([`accumulator_copies`]).
const COPY_ALL_MFMAS: u32 = 8;

/// MFMAs a trip on each accumulator tile from which LLVM copies one tile's
/// accumulators where a result is read by arithmetic after the loop.
const COPY_ONE_MFMAS: u32 = 4;

/// Gives every wave-uniform value (or immediate) a store writes a VGPR copy
/// of its own right before the store: a store's data are VGPRs
/// (`global_store_dwordx4 v4, v[0:3], s[0:1]` of four zeros: four
/// `v_mov_b32`, clang 5 VGPRs with the offset and the lane id, 3 estimated
/// with the zeros in SGPRs). The copies are marked divergent in `uniform`.
pub(super) fn stored_in_vgprs(kernel: &mut Kernel, uniform: &mut Vec<bool>, valu: &mut Vec<bool>) {
    fn walk(
        insts: &mut Vec<Inst>,
        regs: &mut Vec<crate::ir::target::RegTy>,
        uniform: &mut Vec<bool>,
        valu: &mut Vec<bool>,
    ) {
        let mut out = Vec::with_capacity(insts.len());
        for mut inst in std::mem::take(insts) {
            match &mut inst {
                Inst::For { body, .. } => walk(body, regs, uniform, valu),
                Inst::While { cond, body, .. } => {
                    walk(cond, regs, uniform, valu);
                    walk(body, regs, uniform, valu);
                }
                Inst::If {
                    then, otherwise, ..
                } => {
                    walk(then, regs, uniform, valu);
                    walk(otherwise, regs, uniform, valu);
                }
                Inst::St { mem, src, .. } => {
                    for o in src.iter_mut() {
                        let scalar = match o {
                            Operand::Reg(r) => {
                                uniform.get(r.0 as usize).copied().unwrap_or(false)
                                    && !valu.get(r.0 as usize).copied().unwrap_or(false)
                            }
                            _ => true,
                        };
                        if !scalar {
                            continue;
                        }
                        let ty = match o {
                            Operand::Reg(r) => regs[r.0 as usize],
                            _ if mem.bytes() > 4 => crate::ir::target::RegTy::I64,
                            _ => crate::ir::target::RegTy::I32,
                        };
                        let copy = Reg(regs.len() as u32);
                        regs.push(ty);
                        uniform.push(false);
                        valu.push(false);
                        out.push(Inst::Mov { dst: copy, src: *o });
                        *o = Operand::Reg(copy);
                    }
                }
                _ => {}
            }
            out.push(inst);
        }
        *insts = out;
    }
    let mut body = std::mem::take(&mut kernel.body);
    walk(&mut body, &mut kernel.regs, uniform, valu);
    kernel.body = body;
}
