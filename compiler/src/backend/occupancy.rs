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
//! AMD targets get the analogous model at wave granularity (documented on
//! [`occupancy`]): waves per SIMD from VGPRs, blocks per CU from LDS and wave
//! slots. It is a first-order model, not a vendor calculator.

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

/// A resource that bounds the number of resident blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Limiter {
    /// Warp (thread) slots of the SM, or a block larger than the arch allows.
    Warps,
    Registers,
    SharedMemory,
    /// The maximum number of resident blocks.
    Blocks,
}

impl Limiter {
    pub const ALL: [Limiter; 4] = [
        Limiter::Warps,
        Limiter::Registers,
        Limiter::SharedMemory,
        Limiter::Blocks,
    ];

    /// The name used in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Limiter::Warps => "warps",
            Limiter::Registers => "registers",
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
    /// Blocks per SM allowed by each resource, in [`Limiter::ALL`] order
    /// (`u32::MAX` where the resource is not used at all).
    pub limits: [u32; 4],
    /// Registers allocated to one block (per-warp rounding included).
    pub regs_per_block: u32,
    /// Shared memory allocated to one block (reserve and rounding included).
    pub smem_per_block: u32,
    /// The shared memory per SM the launch runs with (the carveout).
    pub smem_per_sm: u32,
}

impl Occupancy {
    /// Active warps over the maximum, 0 to 1.
    pub fn occupancy(&self) -> f64 {
        self.active_warps as f64 / self.max_warps_per_sm as f64
    }

    pub fn limit(&self, l: Limiter) -> u32 {
        self.limits[l as usize]
    }

    /// Every resource that attains the minimum, in [`Limiter::ALL`] order.
    pub fn limiters(&self) -> Vec<Limiter> {
        Limiter::ALL
            .into_iter()
            .filter(|&l| self.limit(l) == self.blocks_per_sm)
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

/// Resident blocks per SM (CU) of a kernel whose blocks use `usage`, with the
/// limiting resource.
///
/// AMD model (the rows give, e.g., gfx90a 4 SIMDs per CU, 8 waves per SIMD, 512
/// VGPRs per lane, granule 8): a wave takes `round_up(vgprs, granule)` VGPRs per lane on
/// its SIMD, so a SIMD holds `min(waves per SIMD, VGPRs per lane / that)` waves;
/// the waves of a block are spread over the SIMDs, so blocks by VGPRs =
/// `SIMDs * waves per SIMD / waves per block`. LDS is allocated in 512-byte
/// units out of 64 KiB per CU. Scalar registers and the workgroup-to-SIMD
/// placement rules are not modelled.
pub fn occupancy(arch: Arch, usage: BlockUsage, carveout: Carveout) -> Occupancy {
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
    let (by_regs, regs_per_block) = match info.vendor {
        Vendor::Nvidia => {
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
        }
        Vendor::Amd => {
            // VGPRs per lane of one SIMD, and waves one SIMD can hold.
            let vgprs_per_lane = info.regs_per_sm as u64 / (granularity * warp);
            let waves_per_simd = max_warps / granularity;
            let per_wave = round_up(regs, info.reg_alloc_unit as u64);
            let limit = if regs > info.max_regs_per_thread as u64 {
                0
            } else {
                vgprs_per_lane
                    .checked_div(per_wave)
                    .map_or(u32::MAX as u64, |waves| {
                        waves.min(waves_per_simd) * granularity / warps_per_block
                    })
            };
            (limit, per_wave * warp * warps_per_block)
        }
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

    let limits = [by_warps, by_regs, by_smem, info.max_blocks_per_sm as u64]
        .map(|l| l.min(u32::MAX as u64) as u32);
    let blocks = *limits.iter().min().expect("four limits");
    Occupancy {
        blocks_per_sm: blocks,
        warps_per_block: warps_per_block as u32,
        active_warps: (blocks as u64 * warps_per_block) as u32,
        max_warps_per_sm: info.max_warps_per_sm,
        limits,
        regs_per_block: regs_per_block.min(u32::MAX as u64) as u32,
        smem_per_block: smem_per_block.min(u32::MAX as u64) as u32,
        smem_per_sm: smem_per_sm as u32,
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
        // AMD model (see `occupancy`): gfx90a/gfx942 4 SIMDs x 8 waves, 512 VGPRs
        (Arch::Gfx90a, 256, 128, 0, Carveout::Default, 4, &[Registers]),
        (Arch::Gfx90a, 64, 32, 16 * KB, Carveout::Default, 4, &[SharedMemory]),
        (Arch::Gfx90a, 1024, 16, 0, Carveout::Default, 2, &[Warps, Registers]),
        (Arch::Gfx942, 256, 100, 0, Carveout::Default, 4, &[Registers]),
        (Arch::Gfx942, 64, 20, 0, Carveout::Default, 32, &[Warps, Registers, Blocks]),
        // gfx1100 (CU mode): 2 SIMD32s x 16 waves, 1536 VGPRs, granule 24
        (Arch::Gfx1100, 256, 128, 0, Carveout::Default, 2, &[Registers]),
        (Arch::Gfx1100, 256, 24, 0, Carveout::Default, 4, &[Warps, Registers]),
        (Arch::Gfx1100, 64, 24, 20 * KB, Carveout::Default, 3, &[SharedMemory]),
    ];

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
