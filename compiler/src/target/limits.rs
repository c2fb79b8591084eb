//! Per-arch limits as data: the register file and its allocation units,
//! resident warps and blocks, shared memory per SM (CU) with the sizes its
//! carveout can take, and what one block may use. One row per arch, each
//! number with its source; `backend::occupancy` is the calculation over them,
//! the checker and the lowering read the per-block limits.
//!
//! NVIDIA rows: the CUDA C Programming Guide's "Technical Specifications per
//! Compute Capability" table, and the "GPU Data" sheet of NVIDIA's CUDA
//! Occupancy Calculator (allocation units and granularities, which the guide
//! does not list), as `cuda_occupancy.h` also encodes them. AMD rows: LLVM
//! 19's AMDGPU backend (`AMDGPUBaseInfo.cpp`, `GCNSubtarget`,
//! `AMDGPUSubtarget`), the numbers its occupancy is computed from, each
//! checked against clang-19's resource-usage remarks on probe kernels.

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
    /// AMD's register files and occupancy rules (`None` on NVIDIA).
    pub amd: Option<AmdInfo>,
}

/// What LLVM's AMDGPU backend computes an AMD kernel's occupancy from
/// (sources on each row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmdInfo {
    /// SIMDs (LLVM: EUs) a workgroup's waves are spread over: a CU's, or in
    /// WGP mode a WGP's (`getEUsPerCU`).
    pub simds: u32,
    /// Waves one SIMD holds at most (`getMaxWavesPerEU`).
    pub max_waves_per_simd: u32,
    /// VGPRs a lane of one SIMD has, shared by its waves (`getTotalNumVGPRs`).
    pub vgprs_per_lane: u32,
    /// A wave's VGPRs are allocated in units of this many (`getVGPRAllocGranule`).
    pub vgpr_granule: u32,
    /// Most VGPRs one wave may use, AGPRs included (`getAddressableNumVGPRs`).
    pub addressable_vgprs: u32,
    /// Architectural VGPRs one wave may name (v0-v255).
    pub arch_vgprs: u32,
    /// Accumulation VGPRs (AGPRs, a0-a255) one wave may name; 0 where none.
    pub agprs: u32,
    /// Most SGPRs one wave may use (`getAddressableNumSGPRs`).
    pub addressable_sgprs: u32,
    /// Waves a SIMD by SGPRs (`getOccupancyWithNumSGPRs`): ascending rows of
    /// (most SGPRs, waves); empty where SGPRs never limit waves.
    pub sgpr_waves: &'static [(u32, u32)],
    /// LDS the workgroups on one CU share (`getLocalMemorySize`); in WGP mode
    /// the WGP's, two CUs' worth, as clang-19 counts it.
    pub lds_per_cu: u32,
    /// Workgroups of more than one wave one CU (WGP) holds: its barriers
    /// (`getMaxWorkGroupsPerCU`).
    pub max_barriers: u32,
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
const LDS_128K: &[u32] = &[128 * KB];

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
    amd: None,
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

/// CDNA2 (gfx90a) and CDNA3 (gfx942), as LLVM 19's AMDGPU backend models
/// them (`llvm/lib/Target/AMDGPU/Utils/AMDGPUBaseInfo.cpp`, namespace
/// `IsaInfo`; `GCNSubtarget::getOccupancyWithNumSGPRs`;
/// `AMDGPUSubtarget::getOccupancyWithLocalMemSize`), each number also
/// checked against clang-19's `-Rpass-analysis=kernel-resource-usage` remarks
/// on probe kernels (inline-asm clobbers of `vN`/`aN`/`sN`, static LDS
/// arrays, `amdgpu_flat_work_group_size`):
///
/// * 64-wide waves (`getWavefrontSize`: no `FeatureWavefrontSize32`);
/// * 4 SIMDs a CU share a workgroup's waves (`getEUsPerCU`: 4 before gfx10);
/// * 8 waves a SIMD (`getMaxWavesPerEU`: 8 where `FeatureGFX90AInsts`;
///   probe: 64 VGPRs give 8 waves, 65 give 7);
/// * one unified file of 512 VGPRs a lane (`getTotalNumVGPRs`: 512 with
///   `FeatureGFX90AInsts`), allocated in granules of 8 (`getVGPRAllocGranule`:
///   8 with `FeatureGFX90AInsts`; probe: 101 VGPRs, 104 allocated, 4 waves),
///   256 architectural VGPRs (v0-v255) and 256 AGPRs (a0-a255) of it,
///   a wave using both taking `align(VGPRs, 4) + AGPRs`
///   (`AMDGPU::getTotalNumVGPRs(hasGFX90AInsts, …)`; probe: 65 VGPRs and 64
///   AGPRs, 132 → 136, 3 waves); 512 addressable (`getAddressableNumVGPRs`);
/// * 102 addressable SGPRs (`getAddressableNumSGPRs`: 102 from gfx8), which
///   limit waves only above 100 (`getOccupancyWithNumSGPRs`, from Volcanic
///   Islands: up to 80 → 10, 88 → 9, 100 → 8, else 7; probe: 100 SGPRs 8
///   waves, 101 SGPRs 7);
/// * 64 KiB of LDS a CU and a workgroup (`getLocalMemorySize`:
///   `FeatureLocalMemorySize65536`), whose size is encoded in 128-dword units;
/// * at most 16 workgroups of more than one wave a CU (`getMaxWorkGroupsPerCU`:
///   16 barriers in CU mode; a single-wave workgroup uses none, so up to the
///   CU's 32 wave slots; probe: 576-thread workgroups, 3 a CU, 7 waves).
const GFX90A: ArchInfo = ArchInfo {
    name: "gfx90a",
    vendor: Vendor::Amd,
    warp_size: 64,
    max_threads_per_block: 1024,
    regs_per_sm: 4 * 64 * 512,
    max_regs_per_thread: 512,
    max_smem_per_block: 65_536,
    smem_per_sm: 65_536,
    max_warps_per_sm: 4 * 8,
    max_blocks_per_sm: 4 * 8,
    regs_per_block: 4 * 64 * 512,
    reg_alloc_unit: 8,
    warp_alloc_granularity: 4,
    smem_alloc_unit: 512,
    smem_reserved_per_block: 0,
    smem_carveouts: LDS_64K,
    amd: Some(AmdInfo {
        simds: 4,
        max_waves_per_simd: 8,
        vgprs_per_lane: 512,
        vgpr_granule: 8,
        addressable_vgprs: 512,
        arch_vgprs: 256,
        agprs: 256,
        addressable_sgprs: 102,
        sgpr_waves: SGPR_WAVES_GFX9,
        lds_per_cu: 65_536,
        max_barriers: 16,
    }),
};

/// Waves a SIMD by SGPRs from gfx8 to gfx9 (`getOccupancyWithNumSGPRs`):
/// each row is the most SGPRs (extra SGPRs such as VCC included) for that
/// many waves; past the last, 7.
const SGPR_WAVES_GFX9: &[(u32, u32)] = &[(80, 10), (88, 9), (100, 8), (u32::MAX, 7)];

/// gfx942 is gfx90a's resource model (`FeatureGFX90AInsts` holds there too:
/// the same granule, file and wave limit; probes give the same waves for the
/// same VGPRs, AGPRs, SGPRs and LDS).
const GFX942: ArchInfo = ArchInfo {
    name: "gfx942",
    ..GFX90A
};

/// RDNA3 (gfx1100), as LLVM 19 models it (sources as for [`GFX90A`]):
///
/// * 32-wide waves (clang's default for gfx11: `FeatureWavefrontSize32`);
/// * WGP mode, clang's default for gfx10+ (no `FeatureCuMode`): a
///   workgroup's waves share the WGP's 4 SIMD32s (`getEUsPerCU`: 4), its
///   128 KiB of LDS (probe: 8 KiB workgroups of 2 waves give 8 waves a SIMD,
///   16 workgroups of 128 KiB), 64 KiB at most a workgroup, and 32 barriers
///   (`getMaxWorkGroupsPerCU`; probe: 544-thread workgroups, 13 waves);
/// * 16 waves a SIMD (`getMaxWavesPerEU`: 16 with `FeatureGFX10_3Insts`);
/// * 1536 VGPRs a lane (`getTotalNumVGPRs`: the 1.5x file,
///   `Feature1_5xVGPRs`, wave32), allocated in granules of 24
///   (`getVGPRAllocGranule`; probe: 101 VGPRs, 120 allocated, 12 waves; 128
///   → 144, 10 waves); 256 addressable (probe: v255 compiles, 5 waves); no
///   AGPRs;
/// * 106 addressable SGPRs (`getAddressableNumSGPRs`: 106 from gfx10), which
///   never limit waves from gfx10 (`getOccupancyWithNumSGPRs`; probe: 106
///   SGPRs, 16 waves).
const GFX1100: ArchInfo = ArchInfo {
    name: "gfx1100",
    vendor: Vendor::Amd,
    warp_size: 32,
    max_threads_per_block: 1024,
    regs_per_sm: 4 * 32 * 1536,
    max_regs_per_thread: 256,
    max_smem_per_block: 65_536,
    smem_per_sm: 131_072,
    max_warps_per_sm: 4 * 16,
    max_blocks_per_sm: 4 * 16,
    regs_per_block: 4 * 32 * 1536,
    reg_alloc_unit: 24,
    warp_alloc_granularity: 4,
    smem_alloc_unit: 512,
    smem_reserved_per_block: 0,
    smem_carveouts: LDS_128K,
    amd: Some(AmdInfo {
        simds: 4,
        max_waves_per_simd: 16,
        vgprs_per_lane: 1536,
        vgpr_granule: 24,
        addressable_vgprs: 256,
        arch_vgprs: 256,
        agprs: 0,
        addressable_sgprs: 106,
        sgpr_waves: &[],
        lds_per_cu: 131_072,
        max_barriers: 32,
    }),
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
