//! Target architectures as data: the limits the checker and the resource
//! estimator need. Numbers are from NVIDIA's CUDA C Programming Guide (compute
//! capability tables) and AMD's CDNA2/CDNA3/RDNA3 ISA guides.

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Arch {
    Sm70,
    Sm75,
    Sm80,
    Sm86,
    Sm89,
    #[default]
    Sm90,
    Sm90a,
    Gfx90a,
    Gfx942,
    Gfx1100,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Nvidia,
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
    /// Tensor-core input dtypes (by name) the target's matrix instructions accept.
    pub mma_dtypes: &'static [&'static str],
}

const NV_MMA_70: &[&str] = &["f16"];
const NV_MMA_80: &[&str] = &["f16", "bf16", "f32"];
const NV_MMA_89: &[&str] = &["f16", "bf16", "f32", "f8e4m3", "f8e5m2"];
const AMD_MMA_CDNA2: &[&str] = &["f16", "bf16", "f32"];
const AMD_MMA_CDNA3: &[&str] = &["f16", "bf16", "f32", "f8e4m3", "f8e5m2"];
const AMD_MMA_RDNA3: &[&str] = &["f16", "bf16"];

impl Arch {
    pub const ALL: [Arch; 10] = [
        Arch::Sm70,
        Arch::Sm75,
        Arch::Sm80,
        Arch::Sm86,
        Arch::Sm89,
        Arch::Sm90,
        Arch::Sm90a,
        Arch::Gfx90a,
        Arch::Gfx942,
        Arch::Gfx1100,
    ];

    pub fn info(self) -> ArchInfo {
        let nv =
            |name, max_smem_per_block, smem_per_sm, max_warps_per_sm, max_blocks_per_sm, mma| {
                ArchInfo {
                    name,
                    vendor: Vendor::Nvidia,
                    warp_size: 32,
                    max_threads_per_block: 1024,
                    regs_per_sm: 65536,
                    max_regs_per_thread: 255,
                    max_smem_per_block,
                    smem_per_sm,
                    max_warps_per_sm,
                    max_blocks_per_sm,
                    mma_dtypes: mma,
                }
            };
        match self {
            Arch::Sm70 => nv("sm_70", 98_304, 98_304, 64, 32, NV_MMA_70),
            Arch::Sm75 => nv("sm_75", 65_536, 65_536, 32, 16, NV_MMA_70),
            Arch::Sm80 => nv("sm_80", 166_912, 167_936, 64, 32, NV_MMA_80),
            Arch::Sm86 => nv("sm_86", 101_376, 102_400, 48, 16, NV_MMA_80),
            Arch::Sm89 => nv("sm_89", 101_376, 102_400, 48, 24, NV_MMA_89),
            Arch::Sm90 => nv("sm_90", 232_448, 233_472, 64, 32, NV_MMA_89),
            Arch::Sm90a => nv("sm_90a", 232_448, 233_472, 64, 32, NV_MMA_89),
            Arch::Gfx90a | Arch::Gfx942 => ArchInfo {
                name: if self == Arch::Gfx90a {
                    "gfx90a"
                } else {
                    "gfx942"
                },
                vendor: Vendor::Amd,
                warp_size: 64,
                max_threads_per_block: 1024,
                // 4 SIMDs × 64 lanes × 512 VGPRs (256 arch + 256 acc).
                regs_per_sm: 4 * 64 * 512,
                max_regs_per_thread: 512,
                max_smem_per_block: 65_536,
                smem_per_sm: 65_536,
                max_warps_per_sm: 32,
                max_blocks_per_sm: 32,
                mma_dtypes: if self == Arch::Gfx90a {
                    AMD_MMA_CDNA2
                } else {
                    AMD_MMA_CDNA3
                },
            },
            Arch::Gfx1100 => ArchInfo {
                name: "gfx1100",
                vendor: Vendor::Amd,
                warp_size: 32,
                max_threads_per_block: 1024,
                // 2 SIMDs × 32 lanes × 1536 VGPRs per WGP half; 256 per lane max.
                regs_per_sm: 2 * 32 * 1536,
                max_regs_per_thread: 256,
                max_smem_per_block: 65_536,
                smem_per_sm: 131_072,
                max_warps_per_sm: 32,
                max_blocks_per_sm: 32,
                mma_dtypes: AMD_MMA_RDNA3,
            },
        }
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }

    pub fn is_nvidia(self) -> bool {
        self.info().vendor == Vendor::Nvidia
    }

    /// The tensor-core (matrix) instructions the code generator uses on this
    /// target, best first. NVIDIA: `mma.sync` shapes with f32 accumulation
    /// (PTX ISA, "Warp-level matrix multiply-accumulate"); sm_70's `m8n8k4` and
    /// the AMD MFMA/WMMA shapes are not used yet.
    pub fn mma_shapes(self) -> &'static [MmaShape] {
        const SM75: &[MmaShape] = &[MmaShape {
            m: 16,
            n: 8,
            k: 8,
            input: "f16",
        }];
        const SM80: &[MmaShape] = &[
            MmaShape {
                m: 16,
                n: 8,
                k: 16,
                input: "f16",
            },
            MmaShape {
                m: 16,
                n: 8,
                k: 16,
                input: "bf16",
            },
        ];
        match self {
            Arch::Sm75 => SM75,
            Arch::Sm80 | Arch::Sm86 | Arch::Sm89 | Arch::Sm90 | Arch::Sm90a => SM80,
            _ => &[],
        }
    }

    /// `ldmatrix` (warp-wide 8x8 16-bit matrix loads from shared memory), sm_75+.
    pub fn has_ldmatrix(self) -> bool {
        self.is_nvidia() && self >= Arch::Sm75
    }

    /// `cp.async` (asynchronous global → shared copies), sm_80+.
    pub fn has_cp_async(self) -> bool {
        self.is_nvidia() && self >= Arch::Sm80
    }

    /// `tanh.approx.f32`, sm_75+.
    pub fn has_fast_tanh(self) -> bool {
        self.is_nvidia() && self >= Arch::Sm75
    }
}

/// One warp-level matrix instruction: `[m, k] x [k, n] + [m, n]`, inputs of
/// dtype `input` (by name), f32 accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub input: &'static str,
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownArch(pub String);

impl fmt::Display for UnknownArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        write!(
            f,
            "unknown architecture `{}` (expected one of: {})",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownArch {}

impl FromStr for Arch {
    type Err = UnknownArch;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| UnknownArch(s.to_string()))
    }
}
