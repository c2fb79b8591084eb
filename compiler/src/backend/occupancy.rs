//! Occupancy: how many blocks of a kernel are resident on one SM at a time.
//!
//! This file is the calculation only: every number it uses (register file,
//! allocation units and granularities, resident warps and blocks, shared
//! memory per SM, its carveouts and the driver's reserve) is a row of the
//! target table, [`crate::target::limits`].
//!
//! For NVIDIA targets this is the calculation of NVIDIA's occupancy calculator
//! (`CUDA_Occupancy_Calculator.xls`, and `cuda_occupancy.h`, which implements
//! `cudaOccupancyMaxActiveBlocksPerMultiprocessor`), step for step:
//!
//! * **warps**: a block takes `ceil(threads / 32)` warp slots; blocks by warps =
//!   `max_warps_per_sm / warps_per_block` (0 when the block exceeds
//!   `max_threads_per_block`).
//! * **registers**: a warp is given `regs * 32` registers rounded up to the
//!   allocation unit (256); the register file is split over 4 sub-partitions, so
//!   warps by registers = `(regs_per_sm / 4 / regs_per_warp) * 4` and blocks =
//!   that `/ warps_per_block`. A block is refused (0) when its registers, with its
//!   warps rounded up to a multiple of 4 (the hardware check), exceed
//!   `regs_per_block`, or when a thread uses more than 255 registers.
//! * **shared memory**: a block is given its shared memory plus the driver's
//!   reserved 1 KiB (sm_80 and later), rounded up to the allocation unit (256 bytes
//!   before sm_80, 128 from sm_80). The SM's shared memory is the carveout the
//!   kernel prefers (by default the largest), aligned up to a size the hardware
//!   offers; when one block does not fit the preference, the carveout grows to the
//!   smallest size that holds one block. Blocks = carveout / per-block allocation;
//!   0 when the allocation exceeds the per-block limit (the opt-in limit plus the
//!   reserved KiB: a kernel that needs more than 48 KiB is assumed to opt in, as
//!   generated launchers do).
//! * **blocks**: the arch's maximum resident blocks per SM.
//!
//! The resident blocks are the minimum of the four; every factor that attains it
//! is a limiter. Occupancy is `blocks * warps_per_block / max_warps_per_sm`.
//!
//! For AMD targets it is the occupancy LLVM's AMDGPU backend computes and
//! clang reports (`-Rpass-analysis=kernel-resource-usage`, "Occupancy
//! [waves/SIMD]"; `GCNSubtarget::computeOccupancy`), in waves per SIMD: the
//! least of
//!
//! * **waves**: the SIMD's wave slots (`getMaxWavesPerEU`);
//! * **registers** (VGPRs): a wave using `v` VGPRs and `a` AGPRs takes
//!   `align(v, 4) + a` of the unified file where it uses AGPRs (else `v`),
//!   rounded up to the granule; waves = `VGPRs a lane / that`, at least 1
//!   (`getNumWavesPerEUWithNumVGPRs`);
//! * **sgprs**: the arch's SGPR steps (`getOccupancyWithNumSGPRs`; none from
//!   gfx10);
//! * **shared memory** (LDS) and **blocks** (workgroups): a CU (WGP) holds
//!   `LDS / bytes` workgroups by LDS and at most its barriers' worth of
//!   workgroups of more than one wave (its wave slots' worth of single-wave
//!   ones) (`getMaxWorkGroupsPerCU`); `n` workgroups of `w` waves give
//!   `ceil(n * w / SIMDs)` waves a SIMD (`getOccupancyWithLocalMemSize`,
//!   which takes the least of the two `n`; here they are two limiters).
//!
//! The workgroup size is the kernel's block size: the HIP printer declares it
//! as the launch bound, which clang reads as the flat workgroup size. Every
//! resource at the least is a limiter; `blocks_per_sm` is the workgroups a CU
//! (WGP) then holds, `waves * SIMDs / waves per workgroup`. A block that
//! cannot launch (over 1024 threads, more VGPRs than a wave may address,
//! more LDS than a workgroup may use) has 0 waves.

use std::fmt;

use crate::target::{Arch, Vendor};

/// The L1/shared-memory split a kernel asks for
/// (`cudaFuncAttributePreferredSharedMemoryCarveout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Carveout {
    /// No preference: the calculator assumes the largest shared memory.
    #[default]
    Default,
    /// A percentage (0-100) of the maximum shared memory per SM, aligned up to a
    /// size the hardware offers.
    Percent(u8),
}

/// What one block of a kernel uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockUsage {
    pub threads: u32,
    pub regs_per_thread: u32,
    /// Static plus dynamic shared memory, in bytes (without the driver's reserve).
    pub smem_bytes: u32,
}

/// A resource that bounds the number of resident blocks (AMD: waves per SIMD).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Limiter {
    /// Warp (thread) slots of the SM (AMD: wave slots of a SIMD), or a block
    /// larger than the arch allows.
    Warps,
    /// Registers (AMD: VGPRs, AGPRs included).
    Registers,
    /// AMD's scalar registers (never on NVIDIA).
    ScalarRegisters,
    SharedMemory,
    /// The maximum number of resident blocks (AMD: workgroups a CU's
    /// barriers allow).
    Blocks,
}

impl Limiter {
    pub const ALL: [Limiter; 5] = [
        Limiter::Warps,
        Limiter::Registers,
        Limiter::ScalarRegisters,
        Limiter::SharedMemory,
        Limiter::Blocks,
    ];

    /// The name used in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Limiter::Warps => "warps",
            Limiter::Registers => "registers",
            Limiter::ScalarRegisters => "sgprs",
            Limiter::SharedMemory => "shared_memory",
            Limiter::Blocks => "blocks",
        }
    }
}

impl fmt::Display for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The calculator's result.
#[derive(Clone, Debug, PartialEq)]
pub struct Occupancy {
    /// Resident blocks per SM (CU); 0 when the block cannot launch at all.
    pub blocks_per_sm: u32,
    pub warps_per_block: u32,
    /// Resident warps per SM: `blocks_per_sm * warps_per_block`.
    pub active_warps: u32,
    pub max_warps_per_sm: u32,
    /// Blocks per SM (AMD: waves per SIMD) allowed by each resource, in
    /// [`Limiter::ALL`] order (`u32::MAX` where the resource is not used at all).
    pub limits: [u32; 5],
    /// AMD: waves per SIMD, as LLVM computes it (`None` on NVIDIA).
    pub waves_per_simd: Option<u32>,
    /// Registers allocated to one block (per-warp rounding included).
    pub regs_per_block: u32,
    /// Shared memory allocated to one block (reserve and rounding included).
    pub smem_per_block: u32,
    /// The shared memory per SM the launch runs with (the carveout).
    pub smem_per_sm: u32,
}

impl Occupancy {
    /// Active warps over the maximum, 0 to 1 (AMD: waves per SIMD over the
    /// most a SIMD holds).
    pub fn occupancy(&self) -> f64 {
        self.active_warps as f64 / self.max_warps_per_sm as f64
    }

    pub fn limit(&self, l: Limiter) -> u32 {
        self.limits[l as usize]
    }

    /// Whether not one block can be resident (it cannot launch).
    pub fn cannot_launch(&self) -> bool {
        self.blocks_per_sm == 0
    }

    /// Every resource that attains the minimum, in [`Limiter::ALL`] order.
    pub fn limiters(&self) -> Vec<Limiter> {
        let bound = self.waves_per_simd.unwrap_or(self.blocks_per_sm);
        Limiter::ALL
            .into_iter()
            .filter(|&l| self.limit(l) == bound)
            .collect()
    }

    /// The first limiting resource (ties are broken in [`Limiter::ALL`] order,
    /// the order of the calculator's `cudaOccLimitingFactor` bits).
    pub fn limiter(&self) -> Limiter {
        self.limiters()[0]
    }
}

fn round_up(x: u64, unit: u64) -> u64 {
    if unit == 0 {
        x
    } else {
        x.div_ceil(unit) * unit
    }
}

/// Resident blocks per SM of a kernel whose blocks use `usage`, with the
/// limiting resource; on AMD, [`amd_occupancy`] with no AGPRs or SGPRs.
/// The most registers a thread can have in a block of `threads` on `arch`:
/// on NVIDIA, what lets one block's warps fit the register file (a 1024-thread
/// block: 64), at most the arch's per-thread maximum. ptxas keeps a kernel
/// declared with `.maxntid` within it, spilling past it rather than making a
/// block that cannot launch. On AMD, the arch's maximum (LLVM's own limits
/// are in `amd_occupancy`).
pub fn max_regs_in_block(arch: Arch, threads: u32) -> u32 {
    let info = arch.info();
    if info.vendor == Vendor::Amd {
        return info.max_regs_per_thread;
    }
    let warps = round_up(
        threads.div_ceil(info.warp_size).max(1) as u64,
        info.warp_alloc_granularity as u64,
    );
    let unit = info.reg_alloc_unit as u64;
    let per_warp = info.regs_per_block as u64 / warps / unit * unit;
    (per_warp / info.warp_size as u64).min(info.max_regs_per_thread as u64) as u32
}

pub fn occupancy(arch: Arch, usage: BlockUsage, carveout: Carveout) -> Occupancy {
    if arch.info().vendor == Vendor::Amd {
        return amd_occupancy(
            arch,
            AmdUsage {
                threads: usage.threads,
                vgprs: usage.regs_per_thread,
                agprs: 0,
                sgprs: 0,
                lds_bytes: usage.smem_bytes,
            },
        );
    }
    let info = arch.info();
    let warp = info.warp_size as u64;
    let threads = usage.threads as u64;
    let regs = usage.regs_per_thread as u64;
    let max_warps = info.max_warps_per_sm as u64;
    let granularity = info.warp_alloc_granularity as u64;
    let warps_per_block = threads.div_ceil(warp).max(1);

    // Warps.
    let by_warps = if threads > info.max_threads_per_block as u64 || threads == 0 {
        0
    } else {
        max_warps / warps_per_block
    };

    // Registers.
    let (by_regs, regs_per_block) = {
        let per_warp = round_up(regs * warp, info.reg_alloc_unit as u64);
        let per_block = per_warp * warps_per_block;
        let assumed = per_warp * round_up(warps_per_block, granularity);
        let limit = if assumed > info.regs_per_block as u64
            || per_block > info.regs_per_block as u64
            || regs > info.max_regs_per_thread as u64
        {
            0
        } else {
            let per_partition = info.regs_per_sm as u64 / granularity;
            per_partition
                .checked_div(per_warp)
                .map_or(u32::MAX as u64, |w| w * granularity / warps_per_block)
        };
        (limit, per_block)
    };

    // Shared memory.
    let smem_per_block = round_up(
        usage.smem_bytes as u64 + info.smem_reserved_per_block as u64,
        info.smem_alloc_unit as u64,
    );
    let block_smem_limit = info.max_smem_per_block as u64 + info.smem_reserved_per_block as u64;
    let preference = match carveout {
        Carveout::Default => info.smem_per_sm as u64,
        Carveout::Percent(p) => {
            // The percentage applies to the largest carveout; the calculator
            // rejects values above 100, we clamp.
            info.carveout_holding(p.min(100) as u64 * info.smem_per_sm as u64 / 100)
                .unwrap_or(info.smem_per_sm) as u64
        }
    };
    let (by_smem, smem_per_sm) = if smem_per_block > block_smem_limit {
        (0, preference)
    } else {
        let sm = if preference >= smem_per_block {
            preference
        } else {
            info.carveout_holding(smem_per_block)
                .map(u64::from)
                .unwrap_or(info.smem_per_sm as u64)
        };
        (
            sm.checked_div(smem_per_block).unwrap_or(u32::MAX as u64),
            sm,
        )
    };

    let limits = [
        by_warps,
        by_regs,
        u32::MAX as u64,
        by_smem,
        info.max_blocks_per_sm as u64,
    ]
    .map(|l| l.min(u32::MAX as u64) as u32);
    let blocks = *limits.iter().min().expect("five limits");
    Occupancy {
        blocks_per_sm: blocks,
        warps_per_block: warps_per_block as u32,
        active_warps: (blocks as u64 * warps_per_block) as u32,
        max_warps_per_sm: info.max_warps_per_sm,
        limits,
        regs_per_block: regs_per_block.min(u32::MAX as u64) as u32,
        smem_per_block: smem_per_block.min(u32::MAX as u64) as u32,
        smem_per_sm: smem_per_sm as u32,
        waves_per_simd: None,
    }
}

/// What one workgroup of a kernel uses on AMD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmdUsage {
    pub threads: u32,
    /// Architectural VGPRs a lane.
    pub vgprs: u32,
    /// Accumulation VGPRs a lane (CDNA's MFMA accumulators; 0 elsewhere).
    pub agprs: u32,
    /// SGPRs a wave, extra SGPRs (VCC, flat scratch, XNACK mask) included, as
    /// clang reports them; 0 when not known.
    pub sgprs: u32,
    pub lds_bytes: u32,
}

/// The VGPRs a wave takes of the unified file: `align(v, 4) + a` where it
/// uses AGPRs, else `v` (LLVM: `AMDGPU::getTotalNumVGPRs`).
pub fn amd_total_vgprs(vgprs: u32, agprs: u32) -> u32 {
    if agprs > 0 {
        vgprs.next_multiple_of(4) + agprs
    } else {
        vgprs
    }
}

/// Waves per SIMD of an AMD kernel as LLVM's AMDGPU backend computes them
/// (module docs), each resource's limit and the limiters.
pub fn amd_occupancy(arch: Arch, usage: AmdUsage) -> Occupancy {
    let info = arch.info();
    let amd = info
        .amd
        .expect("amd_occupancy is called for AMD arches, whose rows have `amd`");
    let max = amd.max_waves_per_simd as u64;
    let simds = amd.simds as u64;
    let threads = usage.threads as u64;
    let waves_per_group = threads.div_ceil(info.warp_size as u64).max(1);
    // `n` workgroups of this size on a CU: waves per SIMD. Each resource's
    // limit is what it alone allows, not capped at the wave slots (which are
    // a limit of their own), so that only the resources that bind are
    // limiters.
    let waves_of_groups = |n: u64| (n * waves_per_group).div_ceil(simds);

    let by_waves = if threads == 0 || threads > info.max_threads_per_block as u64 {
        0
    } else {
        max
    };
    let vgprs = amd_total_vgprs(usage.vgprs, usage.agprs) as u64;
    let granule = amd.vgpr_granule as u64;
    let per_wave = round_up(vgprs, granule);
    let by_vgprs = if vgprs > amd.addressable_vgprs as u64
        || usage.vgprs > amd.arch_vgprs
        || usage.agprs > amd.agprs
    {
        0
    } else {
        (amd.vgprs_per_lane as u64 / per_wave.max(granule)).max(1)
    };
    let by_sgprs = if usage.sgprs == 0 {
        u32::MAX as u64
    } else {
        amd.sgpr_waves
            .iter()
            .find(|&&(most, _)| usage.sgprs <= most)
            .map_or(u32::MAX as u64, |&(_, waves)| waves as u64)
    };
    let by_lds = if usage.lds_bytes == 0 {
        u32::MAX as u64
    } else if usage.lds_bytes > info.max_smem_per_block {
        0
    } else {
        waves_of_groups(amd.lds_per_cu as u64 / usage.lds_bytes as u64)
    };
    let groups = if waves_per_group == 1 {
        max * simds
    } else {
        (max * simds / waves_per_group).min(amd.max_barriers as u64)
    };
    let by_groups = waves_of_groups(groups);

    let limits =
        [by_waves, by_vgprs, by_sgprs, by_lds, by_groups].map(|l| l.min(u32::MAX as u64) as u32);
    let waves = *limits.iter().min().expect("five limits");
    let blocks = if waves == 0 {
        0
    } else {
        (waves as u64 * simds / waves_per_group).max(1)
    };
    Occupancy {
        blocks_per_sm: blocks as u32,
        warps_per_block: waves_per_group as u32,
        active_warps: (waves as u64 * simds) as u32,
        max_warps_per_sm: (max * simds) as u32,
        limits,
        regs_per_block: (per_wave * info.warp_size as u64 * waves_per_group).min(u32::MAX as u64)
            as u32,
        smem_per_block: usage.lds_bytes,
        smem_per_sm: amd.lds_per_cu,
        waves_per_simd: Some(waves),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Limiter::*;

    const KB: u32 = 1024;

    /// (arch, threads, regs/thread, smem bytes, carveout, blocks/SM, limiters).
    ///
    /// Worked by hand from the calculator's rules (module docs) and checked
    /// against an independent transcription of `cuda_occupancy.h` (CUDA 11.x,
    /// `cudaOccMaxActiveBlocksPerMultiprocessor`, extended with the sm_89/sm_90
    /// values of the programming guide). The sm_70 128-thread 37-register case is
    /// the worked example of the calculator's "Physical Limits" sheet as quoted by
    /// leimao.github.io/blog/CUDA-Occupancy-Calculation (12 blocks, 75%).
    /// Worked examples:
    /// * sm_90, 96 threads, 40 regs, 10000 B: 3 warps; 40 * 32 = 1280 regs a warp;
    ///   16384 / 1280 = 12 warps a sub-partition, 48 an SM, 16 blocks; shared
    ///   memory 10000 + 1024 reserved = 11024 -> 11136 (128 B units),
    ///   233472 / 11136 = 20 blocks; warps 64 / 3 = 21; so 16, registers.
    /// * sm_80, 128 threads, 48 KiB: 49152 + 1024 = 50176 B a block,
    ///   167936 / 50176 = 3 blocks (12 warps, 18.75%).
    /// * sm_86, 25% carveout, 4 KiB: 25% of 100 KiB = 25600 B, aligned up to the
    ///   32 KiB carveout; 4096 + 1024 = 5120 B a block; 32768 / 5120 = 6.
    /// * 1024 threads x 128 regs: 4096 regs a warp x 32 warps = 131072 > 65536
    ///   registers a block: 0 blocks.
    type Case = (Arch, u32, u32, u32, Carveout, u32, &'static [Limiter]);

    #[rustfmt::skip]
    const TABLE: &[Case] = &[
        // sm_70
        (Arch::Sm70, 1024, 16, 0, Carveout::Default, 2, &[Warps]),
        (Arch::Sm70, 256, 128, 0, Carveout::Default, 2, &[Registers]),
        (Arch::Sm70, 128, 37, 0, Carveout::Default, 12, &[Registers]),
        (Arch::Sm70, 128, 255, 0, Carveout::Default, 2, &[Registers]),
        (Arch::Sm70, 1024, 128, 0, Carveout::Default, 0, &[Registers]),
        (Arch::Sm70, 128, 32, 48 * KB, Carveout::Default, 2, &[SharedMemory]),
        (Arch::Sm70, 96, 40, 10000, Carveout::Default, 9, &[SharedMemory]),
        (Arch::Sm70, 128, 32, 4096, Carveout::Percent(25), 8, &[SharedMemory]),
        (Arch::Sm70, 128, 32, 97 * KB, Carveout::Default, 0, &[SharedMemory]),
        (Arch::Sm70, 32, 16, 0, Carveout::Default, 32, &[Blocks]),
        // sm_75
        (Arch::Sm75, 1024, 16, 0, Carveout::Default, 1, &[Warps]),
        (Arch::Sm75, 128, 37, 0, Carveout::Default, 8, &[Warps]),
        (Arch::Sm75, 256, 128, 0, Carveout::Default, 2, &[Registers]),
        (Arch::Sm75, 128, 255, 0, Carveout::Default, 2, &[Registers]),
        (Arch::Sm75, 128, 32, 48 * KB, Carveout::Default, 1, &[SharedMemory]),
        (Arch::Sm75, 64, 64, 20 * KB, Carveout::Default, 3, &[SharedMemory]),
        (Arch::Sm75, 128, 32, 4096, Carveout::Percent(25), 8, &[Warps, SharedMemory]),
        (Arch::Sm75, 32, 16, 0, Carveout::Default, 16, &[Blocks]),
        // sm_80
        (Arch::Sm80, 1024, 16, 0, Carveout::Default, 2, &[Warps]),
        (Arch::Sm80, 256, 128, 0, Carveout::Default, 2, &[Registers]),
        (Arch::Sm80, 128, 37, 0, Carveout::Default, 12, &[Registers]),
        (Arch::Sm80, 1024, 128, 0, Carveout::Default, 0, &[Registers]),
        (Arch::Sm80, 128, 32, 48 * KB, Carveout::Default, 3, &[SharedMemory]),
        (Arch::Sm80, 96, 40, 10000, Carveout::Default, 15, &[SharedMemory]),
        (Arch::Sm80, 64, 64, 20 * KB, Carveout::Default, 7, &[SharedMemory]),
        (Arch::Sm80, 128, 32, 4096, Carveout::Percent(25), 12, &[SharedMemory]),
        (Arch::Sm80, 128, 32, 164 * KB, Carveout::Default, 0, &[SharedMemory]),
        (Arch::Sm80, 32, 16, 0, Carveout::Default, 32, &[Blocks]),
        // sm_86
        (Arch::Sm86, 1024, 16, 0, Carveout::Default, 1, &[Warps]),
        (Arch::Sm86, 128, 37, 0, Carveout::Default, 12, &[Warps, Registers]),
        (Arch::Sm86, 256, 128, 0, Carveout::Default, 2, &[Registers]),
        (Arch::Sm86, 128, 32, 48 * KB, Carveout::Default, 2, &[SharedMemory]),
        (Arch::Sm86, 96, 40, 10000, Carveout::Default, 9, &[SharedMemory]),
        (Arch::Sm86, 128, 32, 4096, Carveout::Percent(25), 6, &[SharedMemory]),
        (Arch::Sm86, 128, 32, 100 * KB, Carveout::Default, 0, &[SharedMemory]),
        (Arch::Sm86, 32, 16, 0, Carveout::Default, 16, &[Blocks]),
        // sm_89: as sm_86 but 24 resident blocks
        (Arch::Sm89, 1024, 16, 0, Carveout::Default, 1, &[Warps]),
        (Arch::Sm89, 128, 37, 0, Carveout::Default, 12, &[Warps, Registers]),
        (Arch::Sm89, 256, 128, 0, Carveout::Default, 2, &[Registers]),
        (Arch::Sm89, 128, 255, 0, Carveout::Default, 2, &[Registers]),
        (Arch::Sm89, 128, 32, 48 * KB, Carveout::Default, 2, &[SharedMemory]),
        (Arch::Sm89, 128, 32, 4096, Carveout::Percent(25), 6, &[SharedMemory]),
        (Arch::Sm89, 32, 16, 0, Carveout::Default, 24, &[Blocks]),
        // sm_90
        (Arch::Sm90, 1024, 16, 0, Carveout::Default, 2, &[Warps]),
        (Arch::Sm90, 256, 128, 0, Carveout::Default, 2, &[Registers]),
        (Arch::Sm90, 96, 40, 10000, Carveout::Default, 16, &[Registers]),
        (Arch::Sm90, 1024, 128, 0, Carveout::Default, 0, &[Registers]),
        (Arch::Sm90, 128, 32, 48 * KB, Carveout::Default, 4, &[SharedMemory]),
        (Arch::Sm90, 64, 64, 20 * KB, Carveout::Default, 10, &[SharedMemory]),
        (Arch::Sm90, 128, 32, 4096, Carveout::Percent(25), 12, &[SharedMemory]),
        (Arch::Sm90, 128, 32, 228 * KB, Carveout::Default, 0, &[SharedMemory]),
        (Arch::Sm90, 32, 16, 0, Carveout::Default, 32, &[Blocks]),
        // sm_90a: the same machine
        (Arch::Sm90a, 96, 40, 10000, Carveout::Default, 16, &[Registers]),
        (Arch::Sm90a, 128, 32, 48 * KB, Carveout::Default, 4, &[SharedMemory]),
    ];

    #[test]
    fn registers_a_thread_of_a_block_can_have() {
        // 65536 registers a block, in units of 256 a warp, warps in groups of 4.
        for (threads, regs) in [
            (1024, 64),
            (768, 80),
            (640, 96),
            (512, 128),
            (256, 255),
            (96, 255),
            (1, 255),
        ] {
            assert_eq!(
                max_regs_in_block(Arch::Sm90, threads),
                regs,
                "{threads} threads"
            );
        }
        assert_eq!(max_regs_in_block(Arch::Sm70, 1024), 64);
        // Every such count fits one block; one more unit does not.
        for threads in [1024, 768, 640, 512] {
            let fits = |regs| {
                occupancy(
                    Arch::Sm80,
                    BlockUsage {
                        threads,
                        regs_per_thread: regs,
                        smem_bytes: 0,
                    },
                    Carveout::Default,
                )
                .blocks_per_sm
            };
            let max = max_regs_in_block(Arch::Sm80, threads);
            assert!(fits(max) >= 1, "{threads} threads, {max} registers");
            assert_eq!(fits(max + 8), 0, "{threads} threads, {} registers", max + 8);
        }
        assert_eq!(
            max_regs_in_block(Arch::Gfx942, 1024),
            Arch::Gfx942.info().max_regs_per_thread
        );
    }

    #[test]
    fn calculator_table() {
        let mut failures = Vec::new();
        for &(arch, threads, regs, smem, carveout, blocks, limiters) in TABLE {
            let usage = BlockUsage {
                threads,
                regs_per_thread: regs,
                smem_bytes: smem,
            };
            let occ = occupancy(arch, usage, carveout);
            if occ.blocks_per_sm != blocks || occ.limiters() != limiters {
                failures.push(format!(
                    "{arch} {threads} threads {regs} regs {smem} B {carveout:?}: got {} blocks {:?} (limits {:?}), want {blocks} {limiters:?}",
                    occ.blocks_per_sm,
                    occ.limiters(),
                    occ.limits
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// (arch, threads, VGPRs, AGPRs, SGPRs, LDS bytes, waves per SIMD, limiters).
    ///
    /// Worked by hand from AMD's rules as LLVM encodes them (module docs;
    /// the rows of `target::limits`), and each the number clang-19 reports
    /// (`Occupancy [waves/SIMD]`) for a probe kernel with those resources
    /// (inline-asm clobbers of `vN`/`aN`/`sN`, a static LDS array,
    /// `amdgpu_flat_work_group_size(1, threads)`). Worked examples:
    /// * gfx90a, 65 VGPRs: 72 allocated (granule 8), 512 / 72 = 7 waves;
    /// * gfx90a, 65 VGPRs and 64 AGPRs: 68 + 64 = 132, 136 allocated, 3;
    /// * gfx90a, 256 threads (4 waves), 20 KiB LDS: 65536 / 20480 = 3
    ///   workgroups a CU, 12 waves over 4 SIMDs: 3;
    /// * gfx90a, 576 threads (9 waves): 32 wave slots / 9 = 3 workgroups,
    ///   27 waves over 4 SIMDs: ceil(6.75) = 7;
    /// * gfx1100, 128 VGPRs: 144 allocated (granule 24), 1536 / 144 = 10;
    /// * gfx1100, 64 threads (2 wave32s), 8 KiB LDS: 131072 / 8192 = 16
    ///   workgroups a WGP, 32 waves over 4 SIMDs: 8;
    /// * gfx1100, 544 threads (17 waves): 64 / 17 = 3 workgroups, 51 waves:
    ///   ceil(12.75) = 13.
    type AmdCase = (Arch, u32, u32, u32, u32, u32, u32, &'static [Limiter]);

    #[rustfmt::skip]
    const AMD_TABLE: &[AmdCase] = &[
        // gfx90a: 8 waves a SIMD, 512 VGPRs a lane in granules of 8
        (Arch::Gfx90a, 256, 32, 0, 10, 0, 8, &[Warps, Blocks]),
        (Arch::Gfx90a, 256, 64, 0, 10, 0, 8, &[Warps, Registers, Blocks]),
        (Arch::Gfx90a, 256, 65, 0, 10, 0, 7, &[Registers]),
        (Arch::Gfx90a, 256, 96, 0, 10, 0, 5, &[Registers]),
        (Arch::Gfx90a, 256, 101, 0, 10, 0, 4, &[Registers]),
        (Arch::Gfx90a, 256, 128, 0, 10, 0, 4, &[Registers]),
        (Arch::Gfx90a, 256, 256, 0, 10, 0, 2, &[Registers]),
        (Arch::Gfx90a, 256, 256, 256, 10, 0, 1, &[Registers]),
        (Arch::Gfx90a, 256, 2, 64, 10, 0, 7, &[Registers]),
        (Arch::Gfx90a, 256, 62, 64, 10, 0, 4, &[Registers]),
        (Arch::Gfx90a, 256, 65, 64, 10, 0, 3, &[Registers]),
        (Arch::Gfx90a, 256, 257, 0, 10, 0, 0, &[Registers]),
        (Arch::Gfx90a, 256, 2, 0, 100, 0, 8, &[Warps, ScalarRegisters, Blocks]),
        (Arch::Gfx90a, 256, 2, 0, 101, 0, 7, &[ScalarRegisters]),
        (Arch::Gfx90a, 64, 3, 0, 10, 4096, 4, &[SharedMemory]),
        (Arch::Gfx90a, 64, 3, 0, 10, 8192, 2, &[SharedMemory]),
        (Arch::Gfx90a, 128, 3, 0, 10, 16 * KB, 2, &[SharedMemory]),
        (Arch::Gfx90a, 256, 3, 0, 10, 16 * KB, 4, &[SharedMemory]),
        (Arch::Gfx90a, 256, 3, 0, 10, 20 * KB, 3, &[SharedMemory]),
        (Arch::Gfx90a, 256, 3, 0, 10, 32 * KB, 2, &[SharedMemory]),
        (Arch::Gfx90a, 256, 3, 0, 10, 64 * KB, 1, &[SharedMemory]),
        (Arch::Gfx90a, 512, 3, 0, 10, 20 * KB, 6, &[SharedMemory]),
        (Arch::Gfx90a, 1024, 3, 0, 10, 64 * KB, 4, &[SharedMemory]),
        (Arch::Gfx90a, 64, 3, 0, 10, 64 * KB + 4, 0, &[SharedMemory]),
        (Arch::Gfx90a, 576, 2, 0, 10, 0, 7, &[Blocks]),
        (Arch::Gfx90a, 704, 2, 0, 10, 0, 6, &[Blocks]),
        (Arch::Gfx90a, 2048, 2, 0, 10, 0, 0, &[Warps]),
        // gfx942: gfx90a's model
        (Arch::Gfx942, 256, 65, 0, 8, 0, 7, &[Registers]),
        (Arch::Gfx942, 256, 65, 64, 8, 0, 3, &[Registers]),
        (Arch::Gfx942, 256, 2, 0, 101, 0, 7, &[ScalarRegisters]),
        (Arch::Gfx942, 256, 3, 0, 8, 20 * KB, 3, &[SharedMemory]),
        (Arch::Gfx942, 576, 2, 0, 8, 0, 7, &[Blocks]),
        // gfx1100 (WGP mode): 16 waves a SIMD32, 1536 VGPRs in granules of 24
        (Arch::Gfx1100, 256, 32, 0, 2, 0, 16, &[Warps, Blocks]),
        (Arch::Gfx1100, 256, 96, 0, 2, 0, 16, &[Warps, Registers, Blocks]),
        (Arch::Gfx1100, 256, 101, 0, 2, 0, 12, &[Registers]),
        (Arch::Gfx1100, 256, 128, 0, 2, 0, 10, &[Registers]),
        (Arch::Gfx1100, 256, 256, 0, 2, 0, 5, &[Registers]),
        (Arch::Gfx1100, 256, 257, 0, 2, 0, 0, &[Registers]),
        (Arch::Gfx1100, 256, 2, 0, 106, 0, 16, &[Warps, Blocks]),
        (Arch::Gfx1100, 64, 3, 0, 2, 4096, 16, &[Warps, SharedMemory, Blocks]),
        (Arch::Gfx1100, 64, 3, 0, 2, 8192, 8, &[SharedMemory]),
        (Arch::Gfx1100, 64, 3, 0, 2, 64 * KB, 1, &[SharedMemory]),
        (Arch::Gfx1100, 128, 3, 0, 2, 64 * KB, 2, &[SharedMemory]),
        (Arch::Gfx1100, 256, 3, 0, 2, 20 * KB, 12, &[SharedMemory]),
        (Arch::Gfx1100, 256, 3, 0, 2, 64 * KB, 4, &[SharedMemory]),
        (Arch::Gfx1100, 1024, 3, 0, 2, 64 * KB, 16, &[Warps, SharedMemory, Blocks]),
        (Arch::Gfx1100, 544, 2, 0, 2, 0, 13, &[Blocks]),
        (Arch::Gfx1100, 704, 2, 0, 2, 0, 11, &[Blocks]),
    ];

    #[test]
    fn amd_table() {
        let mut failures = Vec::new();
        for &(arch, threads, vgprs, agprs, sgprs, lds_bytes, waves, limiters) in AMD_TABLE {
            let occ = amd_occupancy(
                arch,
                AmdUsage {
                    threads,
                    vgprs,
                    agprs,
                    sgprs,
                    lds_bytes,
                },
            );
            if occ.waves_per_simd != Some(waves) || occ.limiters() != limiters {
                failures.push(format!(
                    "{arch} {threads} threads {vgprs} VGPRs {agprs} AGPRs {sgprs} SGPRs {lds_bytes} B: got {:?} waves {:?} (limits {:?}), want {waves} {limiters:?}",
                    occ.waves_per_simd,
                    occ.limiters(),
                    occ.limits
                ));
            }
            assert_eq!(occ.cannot_launch(), waves == 0, "{arch} {threads} {vgprs}");
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// LLVM 19's occupancy (`GCNSubtarget::computeOccupancy`), transcribed
    /// apart from the target table with its own constants: gfx9 with
    /// `FeatureGFX90AInsts` (gfx90a, gfx942) or gfx11 wave32 in WGP mode
    /// (gfx1100).
    fn llvm_occupancy(
        gfx11: bool,
        threads: u64,
        vgprs: u64,
        agprs: u64,
        sgprs: u64,
        lds: u64,
    ) -> u64 {
        let (wave, max_waves, eus, total, granule, lds_size, barriers) = if gfx11 {
            (32, 16, 4, 1536, 24, 131_072, 32)
        } else {
            (64, 8, 4, 512, 8, 65_536, 16)
        };
        // getOccupancyWithLocalMemSize, getMaxWorkGroupsPerCU
        let n = threads.div_ceil(wave);
        let groups_per_cu = if n == 1 {
            max_waves * eus
        } else {
            (max_waves * eus / n).min(barriers)
        };
        let groups = (lds_size / lds.max(1)).min(groups_per_cu);
        let mut occ = if groups == 0 {
            1
        } else {
            (groups * n).div_ceil(eus).min(max_waves)
        };
        // getOccupancyWithNumSGPRs
        if !gfx11 && sgprs > 0 {
            let by_sgprs = match sgprs {
                0..=80 => 10,
                81..=88 => 9,
                89..=100 => 8,
                _ => 7,
            };
            occ = occ.min(by_sgprs);
        }
        // getNumWavesPerEUWithNumVGPRs over AMDGPU::getTotalNumVGPRs
        let v = if agprs > 0 {
            vgprs.div_ceil(4) * 4 + agprs
        } else {
            vgprs
        };
        if v >= granule {
            occ = occ.min((total / (v.div_ceil(granule) * granule)).clamp(1, max_waves));
        }
        occ
    }

    /// The calculation and the AMD rows agree with LLVM's functions over a
    /// sweep of workgroup sizes, VGPRs, AGPRs, SGPRs and LDS, wherever the
    /// workgroup can launch.
    #[test]
    fn agrees_with_llvm() {
        let mut checked = 0;
        for arch in [Arch::Gfx90a, Arch::Gfx942, Arch::Gfx1100] {
            let gfx11 = arch == Arch::Gfx1100;
            for threads in (32..=1024).step_by(32) {
                for vgprs in [
                    1, 8, 23, 24, 25, 32, 40, 64, 65, 96, 100, 128, 129, 168, 200, 256,
                ] {
                    for agprs in if gfx11 {
                        vec![0]
                    } else {
                        vec![0, 1, 16, 64, 128, 256]
                    } {
                        for sgprs in [0, 10, 80, 81, 88, 89, 100, 101, 106] {
                            for lds in [0, 1, 512, 3000, 4096, 8192, 12_345, 20_480, 32_768, 65_536]
                            {
                                let occ = amd_occupancy(
                                    arch,
                                    AmdUsage {
                                        threads: threads as u32,
                                        vgprs,
                                        agprs,
                                        sgprs,
                                        lds_bytes: lds,
                                    },
                                );
                                let want = llvm_occupancy(
                                    gfx11,
                                    threads,
                                    vgprs as u64,
                                    agprs as u64,
                                    sgprs as u64,
                                    lds as u64,
                                );
                                assert_eq!(
                                    occ.waves_per_simd,
                                    Some(want as u32),
                                    "{arch} {threads} threads {vgprs} VGPRs {agprs} AGPRs {sgprs} SGPRs {lds} B"
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 32 * 16 * 9 * 10 * (6 + 6 + 1));
    }

    #[test]
    fn every_nvidia_arch_exercises_every_limiter() {
        for arch in Arch::ALL
            .into_iter()
            .filter(|a| a.is_nvidia() && *a != Arch::Sm90a)
        {
            let rows: Vec<_> = TABLE.iter().filter(|r| r.0 == arch).collect();
            assert!(rows.len() >= 6, "{arch}: {} cases", rows.len());
            for l in [Warps, Registers, SharedMemory, Blocks] {
                assert!(
                    rows.iter().any(|r| r.6.contains(&l)),
                    "{arch}: no case limited by {l}"
                );
            }
        }
    }

    /// A row of the occupancy calculator's "GPU Data" sheet, written down
    /// here apart from the target table so that the table is checked against
    /// it: compute capability 7.0-8.6 as the calculator lists them (warps,
    /// blocks, register file, its 256-register unit and 4-warp granularity,
    /// shared memory per SM and its unit); 8.9 and 9.0 from the programming
    /// guide's compute-capability table, with 8.x's units. `reserved` is the
    /// 1 KiB of shared memory the CUDA runtime takes per block from 8.0,
    /// `max_smem_block` the opt-in shared memory of one block.
    struct CalcRow {
        arch: Arch,
        warps: u64,
        blocks: u64,
        smem_sm: u64,
        smem_unit: u64,
        reserved: u64,
        max_smem_block: u64,
    }

    #[rustfmt::skip]
    const CALC: &[CalcRow] = &[
        CalcRow { arch: Arch::Sm70, warps: 64, blocks: 32, smem_sm: 98304, smem_unit: 256, reserved: 0, max_smem_block: 98304 },
        CalcRow { arch: Arch::Sm75, warps: 32, blocks: 16, smem_sm: 65536, smem_unit: 256, reserved: 0, max_smem_block: 65536 },
        CalcRow { arch: Arch::Sm80, warps: 64, blocks: 32, smem_sm: 167936, smem_unit: 128, reserved: 1024, max_smem_block: 166912 },
        CalcRow { arch: Arch::Sm86, warps: 48, blocks: 16, smem_sm: 102400, smem_unit: 128, reserved: 1024, max_smem_block: 101376 },
        CalcRow { arch: Arch::Sm89, warps: 48, blocks: 24, smem_sm: 102400, smem_unit: 128, reserved: 1024, max_smem_block: 101376 },
        CalcRow { arch: Arch::Sm90, warps: 64, blocks: 32, smem_sm: 233472, smem_unit: 128, reserved: 1024, max_smem_block: 232448 },
    ];

    /// Blocks per SM by the calculator's formulas ("Maximum Thread Blocks Per
    /// Multiprocessor": the least of the warp/block, register and shared
    /// memory limits; a resource a block does not use does not limit), for the
    /// default (largest) carveout. Registers: 65536 per SM and per block, 255
    /// at most a thread, 256 a warp's unit, warps in groups of 4.
    fn calculator_blocks(row: &CalcRow, threads: u64, regs: u64, smem: u64) -> u64 {
        let ceil = |a: u64, b: u64| a.div_ceil(b) * b;
        let floor = |a: u64, b: u64| a / b * b;
        let warps = threads.div_ceil(32);
        let by_warps = row.blocks.min(row.warps / warps);
        let by_regs = if regs > 255 {
            0
        } else if regs > 0 {
            floor(65536 / ceil(regs * 32, 256), 4) / warps
        } else {
            row.blocks
        };
        let smem_block = ceil(smem + row.reserved, row.smem_unit);
        let by_smem = row.smem_sm.checked_div(smem_block).unwrap_or(row.blocks);
        by_warps.min(by_regs).min(by_smem)
    }

    /// The calculation and the target table agree with the calculator's own
    /// formulas and data over a sweep of block sizes, registers and shared
    /// memory on every NVIDIA arch.
    #[test]
    fn agrees_with_the_occupancy_calculator() {
        let mut checked = 0;
        for row in CALC {
            let info = row.arch.info();
            assert_eq!(
                (info.max_warps_per_sm as u64, info.max_blocks_per_sm as u64),
                (row.warps, row.blocks),
                "{}",
                row.arch
            );
            // Sizes just past a unit (3073, 12_345) tell the units apart.
            let smems = [
                0,
                1,
                1000,
                3073,
                4096,
                6000,
                10_000,
                12_345,
                20 * KB as u64,
                48 * KB as u64,
                row.max_smem_block / 3,
                row.max_smem_block,
            ];
            for threads in (32..=1024).step_by(32) {
                for regs in [
                    0, 1, 16, 24, 32, 37, 40, 48, 56, 64, 72, 80, 96, 128, 168, 200, 232, 255,
                ] {
                    for smem in smems {
                        let want = calculator_blocks(row, threads, regs, smem);
                        let usage = BlockUsage {
                            threads: threads as u32,
                            regs_per_thread: regs as u32,
                            smem_bytes: smem as u32,
                        };
                        let got = occupancy(row.arch, usage, Carveout::Default).blocks_per_sm;
                        assert_eq!(
                            got as u64, want,
                            "{} {threads} threads {regs} regs {smem} B",
                            row.arch
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 6 * 32 * 18 * 12);
    }

    #[test]
    fn derived_quantities() {
        // sm_70, 128 threads, 37 registers: 12 blocks x 4 warps = 48 of 64 warps.
        let occ = occupancy(
            Arch::Sm70,
            BlockUsage {
                threads: 128,
                regs_per_thread: 37,
                smem_bytes: 0,
            },
            Carveout::Default,
        );
        assert_eq!(occ.active_warps, 48);
        assert_eq!(occ.occupancy(), 0.75);
        assert_eq!(occ.regs_per_block, 1280 * 4);
        assert_eq!(occ.limiter(), Registers);
        // sm_80: 1 byte of shared memory still takes the reserved KiB plus a unit.
        let occ = occupancy(
            Arch::Sm80,
            BlockUsage {
                threads: 100,
                regs_per_thread: 0,
                smem_bytes: 1,
            },
            Carveout::Percent(0),
        );
        assert_eq!(occ.warps_per_block, 4);
        assert_eq!(occ.smem_per_block, 1024 + 128);
        // A 0% carveout cannot hold the block, so it grows to the 8 KiB size.
        assert_eq!(occ.smem_per_sm, 8 * KB);
        assert_eq!(occ.limit(SharedMemory), 8 * KB / (1024 + 128));
        assert_eq!(occ.limit(Registers), u32::MAX);
    }

    proptest::proptest! {
        #[test]
        fn more_resources_never_raise_occupancy(
            arch_i in 0usize..10,
            threads in 1u32..1025,
            regs in 0u32..256,
            smem in 0u32..240_000,
            dr in 0u32..64,
            ds in 0u32..20_000,
        ) {
            let arch = Arch::ALL[arch_i];
            let at = |regs, smem| occupancy(arch, BlockUsage { threads, regs_per_thread: regs, smem_bytes: smem }, Carveout::Default);
            let base = at(regs, smem);
            proptest::prop_assert!(at((regs + dr).min(255), smem).blocks_per_sm <= base.blocks_per_sm);
            proptest::prop_assert!(at(regs, smem + ds).blocks_per_sm <= base.blocks_per_sm);
            proptest::prop_assert!(base.occupancy() <= 1.0);
        }
    }
}
