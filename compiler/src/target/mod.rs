//! Target facts as data, in one place below everything that reads them: the
//! checker, the IRs and the backends ask here and this module imports none of
//! them. Each fact is a row with the source of its number:
//!
//! * [`ArchInfo`] ([`limits`]): the limits the checker, the occupancy
//!   calculator and the resource estimator need — register file and its
//!   allocation units, resident warps and blocks, shared memory per SM and its
//!   carveouts — one row per arch (CUDA C Programming Guide, compute
//!   capability tables; NVIDIA's occupancy calculator and cuda_occupancy.h;
//!   AMD's CDNA2/CDNA3/RDNA3 ISA guides and LLVM AMDGPU). The calculation
//!   that reads them is `backend::occupancy`.
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

pub mod amdgpu;
pub mod features;
pub mod limits;
pub mod mma;
pub mod ptxas;

pub use features::Features;
pub use limits::{ArchInfo, Vendor};
pub use mma::{mma_candidates, select_mma, Elem, MmaFeed, MmaInst, MmaKind, Precision};

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

/// The compute capability each NVIDIA arch (but sm_90a) first runs on, newest first.
const NVIDIA_BY_CC: [(i32, i32, Arch); 6] = [
    (9, 0, Arch::Sm90),
    (8, 9, Arch::Sm89),
    (8, 6, Arch::Sm86),
    (8, 0, Arch::Sm80),
    (7, 5, Arch::Sm75),
    (7, 0, Arch::Sm70),
];

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

    pub fn name(self) -> &'static str {
        self.info().name
    }

    pub fn is_nvidia(self) -> bool {
        self.info().vendor == Vendor::Nvidia
    }

    /// The arch to compile for on an NVIDIA GPU of compute capability
    /// `major.minor`: the newest of ours that the device runs (PTX for an
    /// older arch runs on a newer GPU through the driver's JIT). `None` below
    /// sm_70. A compute capability 9.0 GPU gets sm_90a (its wgmma dots; the
    /// code runs on 9.0 only, which is that GPU); a newer one gets sm_90,
    /// whose PTX the driver compiles for it.
    pub fn for_compute_capability(major: i32, minor: i32) -> Option<Arch> {
        if (major, minor) == (9, 0) {
            return Some(Arch::Sm90a);
        }
        NVIDIA_BY_CC
            .iter()
            .find(|&&(ma, mi, _)| (major, minor) >= (ma, mi))
            .map(|&(_, _, a)| a)
    }

    /// Whether code for this arch runs on an NVIDIA GPU of compute capability
    /// `major.minor`: PTX for an arch runs on its capability and newer ones
    /// (the driver compiles it), sm_90a's on 9.0 only; AMD arches never.
    pub fn runs_on(self, major: i32, minor: i32) -> bool {
        match self {
            Arch::Sm90a => (major, minor) == (9, 0),
            _ => NVIDIA_BY_CC
                .iter()
                .find(|r| r.2 == self)
                .is_some_and(|&(ma, mi, _)| (major, minor) >= (ma, mi)),
        }
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

    #[test]
    fn compute_capabilities_pick_the_newest_arch_the_device_runs() {
        use super::Arch;
        let pick = |ma, mi| Arch::for_compute_capability(ma, mi);
        assert_eq!(pick(6, 1), None);
        assert_eq!(pick(7, 0), Some(Arch::Sm70));
        assert_eq!(pick(7, 2), Some(Arch::Sm70));
        assert_eq!(pick(7, 5), Some(Arch::Sm75));
        assert_eq!(pick(8, 0), Some(Arch::Sm80));
        assert_eq!(pick(8, 7), Some(Arch::Sm86));
        assert_eq!(pick(8, 9), Some(Arch::Sm89));
        assert_eq!(pick(9, 0), Some(Arch::Sm90a));
        assert_eq!(pick(10, 0), Some(Arch::Sm90));
        assert_eq!(pick(12, 0), Some(Arch::Sm90));
    }

    #[test]
    fn an_arch_runs_on_its_capability_and_newer_and_sm90a_on_9_0_only() {
        use super::Arch;
        assert!(Arch::Sm90.runs_on(9, 0) && Arch::Sm80.runs_on(9, 0) && Arch::Sm70.runs_on(7, 0));
        assert!(Arch::Sm90a.runs_on(9, 0) && !Arch::Sm90a.runs_on(10, 0));
        assert!(
            !Arch::Sm90.runs_on(8, 9) && !Arch::Sm89.runs_on(8, 6) && !Arch::Sm75.runs_on(7, 2)
        );
        assert!(Arch::Sm86.runs_on(8, 7) && Arch::Sm90.runs_on(12, 0));
        assert!(!Arch::Gfx942.runs_on(9, 0));
        // Every arch the device's own capability picks runs there.
        for (ma, mi) in [(7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0)] {
            assert!(Arch::for_compute_capability(ma, mi)
                .unwrap()
                .runs_on(ma, mi));
        }
    }

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
