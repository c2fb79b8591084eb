//! Target facts as data, in one place below everything that reads them: the
//! checker, the IRs and the backends ask here and this module imports none of
//! them. Each fact is a row with the source of its number:
//!
//! * [`ArchInfo`] (this file): the limits the checker, the occupancy
//!   calculator and the resource estimator need (CUDA C Programming Guide,
//!   compute capability tables; cuda_occupancy.h; AMD's CDNA2/CDNA3/RDNA3 ISA
//!   guides and LLVM AMDGPU).
//! * [`Features`] ([`features`]): what an arch's instruction set has (PTX ISA
//!   version, `ldmatrix`, `cp.async`, fast `tanh`) and its matrix
//!   instructions.
//! * [`mma`]: the matrix-instruction table (shapes, operand dtypes, how
//!   operands are fed) and [`select_mma`], the one place a `dot` is matched to
//!   an instruction — by the checker (E0605) and by code generation alike.
//! * [`ptxas`]: the calibrated behaviour of ptxas that the register estimate
//!   relies on.
//!
//! Code asks for a feature or selects an instruction; it never compares arches
//! (`Arch` has no order, so `arch >= Arch::Sm80` does not compile). A new
//! target is a new `Arch` variant and its rows in each table.

pub mod features;
pub mod mma;
pub mod ptxas;

pub use features::Features;
pub use mma::{select_mma, Elem, MmaFeed, MmaInst, MmaKind, Precision};

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
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

/// The largest launch grid, per axis: CUDA's limits (x at most 2^31 - 1, y and
/// z at most 65535), applied to every target so that a launch that runs on one
/// runs on all (AMD's are larger). Their product is below 2^63, so a program's
/// linear index always fits an i64.
pub const MAX_GRID: [i64; 3] = [(1 << 31) - 1, 65535, 65535];

/// `num_warps` is a power of two from 1 to this: 32 warps of 32 threads are
/// CUDA's 1024 threads per block (a target with fewer, or with 64-wide
/// wavefronts, is held to its own limit by E0604).
pub const MAX_NUM_WARPS: i64 = 32;

/// `num_stages` is from 1 to this. Each stage is a copy of a loop's dot
/// operands in shared memory; at 8 stages the copies of the smallest tensor-
/// core tiles (16x16x16 f16) already cover the loads in flight that any
/// supported target can keep, so deeper pipelines only cost memory.
pub const MAX_NUM_STAGES: i64 = 8;

/// Whether `n` is a valid `num_warps`; the message says why not.
pub fn check_num_warps(n: i64) -> Result<(), String> {
    if (1..=MAX_NUM_WARPS).contains(&n) && n.count_ones() == 1 {
        Ok(())
    } else {
        Err(format!(
            "`num_warps` must be a power of two from 1 to {MAX_NUM_WARPS}, found {n}"
        ))
    }
}

/// Whether `n` is a valid `num_stages`; the message says why not.
pub fn check_num_stages(n: i64) -> Result<(), String> {
    if (1..=MAX_NUM_STAGES).contains(&n) {
        Ok(())
    } else {
        Err(format!(
            "`num_stages` must be from 1 to {MAX_NUM_STAGES}, found {n}"
        ))
    }
}

impl ArchInfo {
    /// The most bytes one tile may occupy on this target: everything a block
    /// can hold at once, its whole register file plus its shared memory. A
    /// bigger tile cannot exist on the chip however it is laid out or spilled
    /// to shared memory, whatever `num_warps` is.
    pub fn max_tile_bytes(&self) -> u64 {
        self.regs_per_block as u64 * 4 + self.max_smem_per_block as u64
    }
}

const KB: u32 = 1024;
/// Shared-memory capacities per SM the carveout can select (cuda_occupancy.h,
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
        // NVIDIA: the CUDA C Programming Guide's table of technical
        // specifications per compute capability, and the allocation rules of
        // the occupancy calculator (cuda_occupancy.h): registers in units of 256
        // per warp over 4 sub-partitions; shared memory in units of 256 bytes
        // before sm_80 and 128 bytes from sm_80, plus 1 KiB the driver reserves
        // per block from sm_80. `max_smem_per_block` is the opt-in limit
        // (`sharedMemPerBlockOptin`), without the reserved KiB.
        let nv = |name,
                  (max_smem_per_block, smem_per_sm, smem_carveouts): (u32, u32, &'static [u32]),
                  max_warps_per_sm,
                  max_blocks_per_sm| {
            let ampere_or_later = !matches!(name, "sm_70" | "sm_75");
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
                regs_per_block: 65536,
                reg_alloc_unit: 256,
                warp_alloc_granularity: 4,
                smem_alloc_unit: if ampere_or_later { 128 } else { 256 },
                smem_reserved_per_block: if ampere_or_later { 1024 } else { 0 },
                smem_carveouts,
            }
        };
        let smem_70 = (96 * KB, 96 * KB, CARVEOUT_70);
        let smem_75 = (64 * KB, 64 * KB, CARVEOUT_75);
        let smem_80 = (163 * KB, 164 * KB, CARVEOUT_80);
        let smem_86 = (99 * KB, 100 * KB, CARVEOUT_86);
        let smem_90 = (227 * KB, 228 * KB, CARVEOUT_90);
        match self {
            Arch::Sm70 => nv("sm_70", smem_70, 64, 32),
            Arch::Sm75 => nv("sm_75", smem_75, 32, 16),
            Arch::Sm80 => nv("sm_80", smem_80, 64, 32),
            Arch::Sm86 => nv("sm_86", smem_86, 48, 16),
            Arch::Sm89 => nv("sm_89", smem_86, 48, 24),
            Arch::Sm90 => nv("sm_90", smem_90, 64, 32),
            Arch::Sm90a => nv("sm_90a", smem_90, 64, 32),
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
                regs_per_block: 4 * 64 * 512,
                // VGPRs are allocated to a wave in granules of 8 per lane
                // (LLVM AMDGPU, `getVGPRAllocGranule` for gfx90a/gfx942).
                reg_alloc_unit: 8,
                // 4 SIMDs per CU, 8 waves each.
                warp_alloc_granularity: 4,
                // LDS_SIZE is encoded in units of 128 dwords.
                smem_alloc_unit: 512,
                smem_reserved_per_block: 0,
                smem_carveouts: LDS_64K,
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
                // Per CU (CU mode, which the resource model assumes; a WGP pairs
                // two CUs and 128 KiB).
                smem_per_sm: 65_536,
                max_warps_per_sm: 32,
                max_blocks_per_sm: 32,
                regs_per_block: 2 * 32 * 1536,
                // 1536-VGPR parts allocate wave32 VGPRs in granules of 24.
                reg_alloc_unit: 24,
                // The CU's 2 SIMD32s, 16 waves each.
                warp_alloc_granularity: 2,
                smem_alloc_unit: 512,
                smem_reserved_per_block: 0,
                smem_carveouts: LDS_64K,
            },
        }
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }

    pub fn is_nvidia(self) -> bool {
        self.info().vendor == Vendor::Nvidia
    }
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
        // Callers (clap, the REPL) show the text themselves: only the choices here.
        let names: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        write!(f, "expected one of: {}", names.join(", "))
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }

    /// Whether `line` orders an `Arch::…` value against another (`a >= Arch::Sm80`,
    /// `Arch::Sm80 < a`); `=>` and `->` are no comparison.
    fn compares_arch(line: &str) -> bool {
        line.match_indices("Arch::").any(|(at, _)| {
            let before = line[..at].trim_end();
            let after = line[at + "Arch::".len()..]
                .trim_start_matches(|c: char| c.is_alphanumeric() || c == '_')
                .trim_start();
            let op_before = (before.ends_with('<')
                || before.ends_with('>')
                || before.ends_with("<=")
                || before.ends_with(">="))
                && !before.ends_with("=>")
                && !before.ends_with("->");
            op_before || after.starts_with('<') || after.starts_with('>')
        })
    }

    #[test]
    fn the_comparison_scan_sees_what_it_forbids() {
        assert!(compares_arch("let k16 = self.arch >= Arch::Sm80;"));
        assert!(compares_arch("if Arch::Sm75 <= arch {"));
        assert!(compares_arch("self.is_nvidia() && self < Arch::Sm90"));
        assert!(!compares_arch("Arch::Sm80 => nv(\"sm_80\"),"));
        assert!(!compares_arch("fn f() -> Arch::Target {"));
        assert!(!compares_arch("for arch in [Arch::Sm70, Arch::Sm80] {"));
    }

    /// Code asks for features; no arch is ordered against another outside this
    /// module (`Arch` has no order, and the scan keeps one from coming back).
    #[test]
    fn no_arch_comparisons_outside_target() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        for dir in [
            "src",
            "tests",
            "benches",
            "../lsp/src",
            "../repl/src",
            "../tests",
        ] {
            if root.join(dir).is_dir() {
                rust_files(&root.join(dir), &mut files);
            }
        }
        let target = root.join("src/target");
        let mut found = Vec::new();
        for f in files.iter().filter(|f| !f.starts_with(&target)) {
            let text = std::fs::read_to_string(f).unwrap();
            for (n, line) in text.lines().enumerate() {
                if compares_arch(line) {
                    found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
                }
            }
        }
        assert!(files.len() > 100, "scanned only {} files", files.len());
        assert!(
            found.is_empty(),
            "arch comparisons (ask `Arch::features` instead):\n{}",
            found.join("\n")
        );
    }
}
