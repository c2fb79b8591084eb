//! Per-arch limits as data: the register file and its allocation units,
//! resident warps and blocks, shared memory per SM (CU) with the sizes its
//! carveout can take, and what one block may use. One row per arch, each
//! number with its source; `backend::occupancy` is the calculation over them,
//! the checker and the lowering read the per-block limits.
//!
//! NVIDIA rows: the CUDA C Programming Guide's "Technical Specifications per
//! Compute Capability" table, and the "GPU Data" sheet of NVIDIA's CUDA
//! Occupancy Calculator (allocation units and granularities, which the guide
//! does not list), as `cuda_occupancy.h` also encodes them. AMD rows: the
//! CDNA2/CDNA3/RDNA3 ISA guides and LLVM AMDGPU's allocation granules.

use super::Arch;

/// Which vendor's resource model a row follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// Registers per warp over the SM's sub-partitions, shared memory with a
    /// carveout (NVIDIA's occupancy calculator).
    Nvidia,
    /// VGPRs per wave on each SIMD of a CU, LDS per CU.
    Amd,
}

/// Per-target limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchInfo {
    pub name: &'static str,
    pub vendor: Vendor,
    /// Threads per warp (NVIDIA) or wavefront (AMD).
    pub warp_size: u32,
    pub max_threads_per_block: u32,
    /// 32-bit registers per SM (NVIDIA) or VGPRs per SIMD lane × lanes (AMD: per CU).
    pub regs_per_sm: u32,
    /// Most 32-bit registers one thread may use (beyond this the compiler spills).
    pub max_regs_per_thread: u32,
    /// Shared memory (LDS) one block may use, with the opt-in carveout.
    pub max_smem_per_block: u32,
    /// Shared memory per SM (CU).
    pub smem_per_sm: u32,
    pub max_warps_per_sm: u32,
    pub max_blocks_per_sm: u32,
    /// Registers one block may use (NVIDIA `regsPerBlock`).
    pub regs_per_block: u32,
    /// Registers are allocated to a warp in units of this many (NVIDIA: 256 per
    /// warp); on AMD, VGPRs are allocated to a wave in units of this many per lane.
    pub reg_alloc_unit: u32,
    /// Warps are given registers in groups of this many: the SM's sub-partitions
    /// (NVIDIA: 4, the calculator's "warp allocation granularity"); on AMD, the
    /// SIMDs of a CU (WGP), each with its own register file.
    pub warp_alloc_granularity: u32,
    /// Shared memory (LDS) is allocated per block in units of this many bytes.
    pub smem_alloc_unit: u32,
    /// Shared memory the driver reserves for every block (1 KiB on sm_80 and later).
    pub smem_reserved_per_block: u32,
    /// The shared-memory sizes per SM that the L1/shared split can be set to,
    /// in bytes, ascending; the last is `smem_per_sm`.
    pub smem_carveouts: &'static [u32],
}

impl ArchInfo {
    /// The most bytes one tile may occupy on this target: everything a block
    /// can hold at once, its whole register file plus its shared memory. A
    /// bigger tile cannot exist on the chip however it is laid out or spilled
    /// to shared memory, whatever `num_warps` is.
    pub fn max_tile_bytes(&self) -> u64 {
        self.regs_per_block as u64 * 4 + self.max_smem_per_block as u64
    }

    /// The smallest shared-memory size per SM the carveout can take that holds
    /// `bytes`, or `None` when none does (cuda_occupancy.h,
    /// `cudaOccAlignUpShmemSizeVoltaPlus`).
    pub fn carveout_holding(&self, bytes: u64) -> Option<u32> {
        self.smem_carveouts
            .iter()
            .copied()
            .find(|&c| c as u64 >= bytes)
    }
}

const KB: u32 = 1024;

/// Shared-memory sizes per SM the carveout can select (cuda_occupancy.h,
/// `cudaOccAlignUpShmemSizeVoltaPlus`; CUDA C Programming Guide, compute
/// capability sections; Hopper tuning guide).
const CARVEOUT_70: &[u32] = &[0, 8 * KB, 16 * KB, 32 * KB, 64 * KB, 96 * KB];
const CARVEOUT_75: &[u32] = &[32 * KB, 64 * KB];
const CARVEOUT_80: &[u32] = &[
    0,
    8 * KB,
    16 * KB,
    32 * KB,
    64 * KB,
    100 * KB,
    132 * KB,
    164 * KB,
];
const CARVEOUT_86: &[u32] = &[0, 8 * KB, 16 * KB, 32 * KB, 64 * KB, 100 * KB];
const CARVEOUT_90: &[u32] = &[
    0,
    8 * KB,
    16 * KB,
    32 * KB,
    64 * KB,
    100 * KB,
    132 * KB,
    164 * KB,
    196 * KB,
    228 * KB,
];
const LDS_64K: &[u32] = &[64 * KB];

/// What every NVIDIA arch here shares (programming guide table; calculator
/// "GPU Data"): 32-thread warps, 1024 threads a block, 64K 32-bit registers
/// per SM and per block, at most 255 a thread, allocated in units of 256 per
/// warp over 4 sub-partitions. Rows override the rest.
const NVIDIA: ArchInfo = ArchInfo {
    name: "",
    vendor: Vendor::Nvidia,
    warp_size: 32,
    max_threads_per_block: 1024,
    regs_per_sm: 65536,
    max_regs_per_thread: 255,
    max_smem_per_block: 0,
    smem_per_sm: 0,
    max_warps_per_sm: 0,
    max_blocks_per_sm: 0,
    regs_per_block: 65536,
    reg_alloc_unit: 256,
    warp_alloc_granularity: 4,
    smem_alloc_unit: 0,
    smem_reserved_per_block: 0,
    smem_carveouts: &[],
};

/// Volta (compute capability 7.0): 64 warps, 32 blocks, 96 KiB per SM and per
/// block (opt-in); shared memory in 256-byte units, nothing reserved.
const SM70: ArchInfo = ArchInfo {
    name: "sm_70",
    max_smem_per_block: 96 * KB,
    smem_per_sm: 96 * KB,
    max_warps_per_sm: 64,
    max_blocks_per_sm: 32,
    smem_alloc_unit: 256,
    smem_carveouts: CARVEOUT_70,
    ..NVIDIA
};

/// Turing (7.5): 32 warps, 16 blocks, 64 KiB per SM and per block.
const SM75: ArchInfo = ArchInfo {
    name: "sm_75",
    max_smem_per_block: 64 * KB,
    smem_per_sm: 64 * KB,
    max_warps_per_sm: 32,
    max_blocks_per_sm: 16,
    smem_alloc_unit: 256,
    smem_carveouts: CARVEOUT_75,
    ..NVIDIA
};

/// Ampere A100 (8.0): 64 warps, 32 blocks, 164 KiB per SM, 163 KiB a block
/// (opt-in); from 8.0 shared memory comes in 128-byte units and the driver
/// reserves 1 KiB of it per block.
const SM80: ArchInfo = ArchInfo {
    name: "sm_80",
    max_smem_per_block: 163 * KB,
    smem_per_sm: 164 * KB,
    max_warps_per_sm: 64,
    max_blocks_per_sm: 32,
    smem_alloc_unit: 128,
    smem_reserved_per_block: 1024,
    smem_carveouts: CARVEOUT_80,
    ..NVIDIA
};

/// Ampere GA10x (8.6): 48 warps, 16 blocks, 100 KiB per SM, 99 KiB a block.
const SM86: ArchInfo = ArchInfo {
    name: "sm_86",
    max_smem_per_block: 99 * KB,
    smem_per_sm: 100 * KB,
    max_warps_per_sm: 48,
    max_blocks_per_sm: 16,
    smem_alloc_unit: 128,
    smem_reserved_per_block: 1024,
    smem_carveouts: CARVEOUT_86,
    ..NVIDIA
};

/// Ada (8.9): as 8.6 but 24 resident blocks.
const SM89: ArchInfo = ArchInfo {
    name: "sm_89",
    max_blocks_per_sm: 24,
    ..SM86
};

/// Hopper (9.0): 64 warps, 32 blocks, 228 KiB per SM, 227 KiB a block.
const SM90: ArchInfo = ArchInfo {
    name: "sm_90",
    max_smem_per_block: 227 * KB,
    smem_per_sm: 228 * KB,
    max_warps_per_sm: 64,
    max_blocks_per_sm: 32,
    smem_alloc_unit: 128,
    smem_reserved_per_block: 1024,
    smem_carveouts: CARVEOUT_90,
    ..NVIDIA
};

/// sm_90a is sm_90 with its arch-specific instructions: the same machine.
const SM90A: ArchInfo = ArchInfo {
    name: "sm_90a",
    ..SM90
};

/// CDNA2 (gfx90a), CDNA3 (gfx942): 64-wide waves; a CU has 4 SIMDs of 8 waves,
/// each lane 512 VGPRs (256 arch + 256 acc), allocated in granules of 8 (LLVM
/// AMDGPU, `getVGPRAllocGranule`); 64 KiB of LDS, whose size is encoded in
/// units of 128 dwords.
const GFX90A: ArchInfo = ArchInfo {
    name: "gfx90a",
    vendor: Vendor::Amd,
    warp_size: 64,
    max_threads_per_block: 1024,
    regs_per_sm: 4 * 64 * 512,
    max_regs_per_thread: 512,
    max_smem_per_block: 65_536,
    smem_per_sm: 65_536,
    max_warps_per_sm: 32,
    max_blocks_per_sm: 32,
    regs_per_block: 4 * 64 * 512,
    reg_alloc_unit: 8,
    warp_alloc_granularity: 4,
    smem_alloc_unit: 512,
    smem_reserved_per_block: 0,
    smem_carveouts: LDS_64K,
};

const GFX942: ArchInfo = ArchInfo {
    name: "gfx942",
    ..GFX90A
};

/// RDNA3 (gfx1100) in CU mode, which the resource model assumes (a WGP pairs
/// two CUs and 128 KiB): 2 SIMD32s of 16 waves, 1536 VGPRs a lane (256 at
/// most a thread) allocated to wave32s in granules of 24; 64 KiB of LDS.
const GFX1100: ArchInfo = ArchInfo {
    name: "gfx1100",
    vendor: Vendor::Amd,
    warp_size: 32,
    max_threads_per_block: 1024,
    regs_per_sm: 2 * 32 * 1536,
    max_regs_per_thread: 256,
    max_smem_per_block: 65_536,
    smem_per_sm: 65_536,
    max_warps_per_sm: 32,
    max_blocks_per_sm: 32,
    regs_per_block: 2 * 32 * 1536,
    reg_alloc_unit: 24,
    warp_alloc_granularity: 2,
    smem_alloc_unit: 512,
    smem_reserved_per_block: 0,
    smem_carveouts: LDS_64K,
};

impl Arch {
    /// This arch's row of limits.
    pub fn info(self) -> ArchInfo {
        match self {
            Arch::Sm70 => SM70,
            Arch::Sm75 => SM75,
            Arch::Sm80 => SM80,
            Arch::Sm86 => SM86,
            Arch::Sm89 => SM89,
            Arch::Sm90 => SM90,
            Arch::Sm90a => SM90A,
            Arch::Gfx90a => GFX90A,
            Arch::Gfx942 => GFX942,
            Arch::Gfx1100 => GFX1100,
        }
    }
}
