//! Matrix instructions as data: for each arch the instructions a `dot` can
//! run on, with their shapes and operand dtypes, and [`select_mma`], the one
//! function that matches a `dot` to one. The checker asks it whether a dot's
//! dtype reaches the tensor cores (then M, N and K must be multiples of 16,
//! E0605); Target IR lowering asks it which instruction to emit. A dot no row
//! matches runs on FMA units.
//!
//! NVIDIA rows are the `mma.sync` instructions the PTX generator emits (PTX
//! ISA, "Warp-level matrix multiply-accumulate instructions"), each with f32
//! accumulation. The f8 (`m16n8k32.e4m3`/`e5m2`, sm_89+, PTX 8.4) and integer
//! forms exist in hardware but are not generated, so they have no row: f8 and
//! i8 dots run on FMA units on every NVIDIA arch. AMD rows (CDNA2/CDNA3 ISA
//! guides, "MFMA"; RDNA3 ISA guide, "WMMA") are the instructions the Target IR
//! lowering emits for AMD arches (`ir::target::lower::mma::amd`), each with
//! f32 accumulation. Room is left for `wgmma` (sm_90a) as another [`MmaKind`]
//! and [`MmaFeed`].

/// An operand dtype a matrix instruction can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    F16,
    Bf16,
    F32,
    F8E4M3,
    F8E5M2,
}

/// How a `dot` asks its f32 inputs to be multiplied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Inputs at their own precision (f16/bf16/f8 on tensor cores, or full f32).
    Ieee,
    /// f32 inputs rounded to tf32 on tensor cores.
    Tf32,
}

/// The family of a matrix instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaKind {
    /// NVIDIA `mma.sync.aligned` (one warp).
    MmaSync,
    /// AMD CDNA `v_mfma_*` (one wavefront, accumulators in AGPRs).
    Mfma,
    /// AMD RDNA3 `v_wmma_*` (one wave32).
    Wmma,
}

/// How an instruction's operands reach its registers; each is one staging
/// scheme in the code generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaFeed {
    /// Operands staged in shared memory and read with `ldmatrix.x4`, 16 of K
    /// per read.
    Ldmatrix,
    /// f32 operands staged in shared memory with padded rows, read per element
    /// and rounded with `cvt.rna.tf32.f32`.
    Tf32Fragments,
    /// sm_70's `m8n8k4`: `a` row-major and `b` transposed in swizzled shared
    /// memory, read as pairs of consecutive-k halves (no `ldmatrix`).
    SharedPairs,
    /// Operands staged in LDS (`a` row-major, `b` transposed), each lane
    /// reading its own runs of consecutive k into registers (the AMD
    /// instructions).
    Registers,
}

/// One matrix instruction: `[m, k] x [k, n] + [m, n]` with operands of `elem`
/// and an f32 accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmaInst {
    pub kind: MmaKind,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub elem: Elem,
    /// Used only when the `dot` asks for tf32 (f32 operands rounded to tf32).
    pub tf32: bool,
    pub feed: MmaFeed,
    /// A dot's K must be a multiple of this for the code generator to use the
    /// instruction (its k loop's step).
    pub k_step: u32,
}

use Elem::*;
use MmaFeed::*;
use MmaKind::*;

const fn inst(
    kind: MmaKind,
    [m, n, k]: [u32; 3],
    elem: Elem,
    tf32: bool,
    feed: MmaFeed,
    k_step: u32,
) -> MmaInst {
    MmaInst {
        kind,
        m,
        n,
        k,
        elem,
        tf32,
        feed,
        k_step,
    }
}

// sm_75 has `m16n8k8` only: the generator issues two per 16 of K that one
// `ldmatrix.x4` reads. sm_80 adds `m16n8k16` (f16, bf16) and the tf32 `m16n8k8`.
#[rustfmt::skip]
pub(super) const SM70: &[MmaInst] = &[
    //    kind     m   n   k     elem    tf32   feed          k_step
    inst(MmaSync, [8,  8,  4],  F16,    false, SharedPairs,   16),
];
#[rustfmt::skip]
pub(super) const SM75: &[MmaInst] = &[
    inst(MmaSync, [16, 8,  8],  F16,    false, Ldmatrix,      16),
];
#[rustfmt::skip]
pub(super) const SM80: &[MmaInst] = &[
    inst(MmaSync, [16, 8,  16], F16,    false, Ldmatrix,      16),
    inst(MmaSync, [16, 8,  16], Bf16,   false, Ldmatrix,      16),
    inst(MmaSync, [16, 8,  8],  F32,    true,  Tf32Fragments, 8),
];
// `v_mfma_f32_32x32x8{f16,bf16_1k}`, `v_mfma_f32_32x32x2f32` (full f32, so
// used for ieee and tf32 dots alike); CDNA3 adds `v_mfma_f32_32x32x16_{fp8,bf8}`.
// The 16x16 forms (`v_mfma_f32_16x16x16{f16,bf16_1k}`, `16x16x4f32`,
// `16x16x32_{fp8,bf8}`) come after: they take the dots whose waves cannot
// tile the result in 32x32 blocks.
#[rustfmt::skip]
pub(super) const CDNA2: &[MmaInst] = &[
    inst(Mfma,    [32, 32, 8],  F16,    false, Registers,     8),
    inst(Mfma,    [32, 32, 8],  Bf16,   false, Registers,     8),
    inst(Mfma,    [32, 32, 2],  F32,    false, Registers,     2),
    inst(Mfma,    [16, 16, 16], F16,    false, Registers,     16),
    inst(Mfma,    [16, 16, 16], Bf16,   false, Registers,     16),
    inst(Mfma,    [16, 16, 4],  F32,    false, Registers,     4),
];
#[rustfmt::skip]
pub(super) const CDNA3: &[MmaInst] = &[
    inst(Mfma,    [32, 32, 8],  F16,    false, Registers,     8),
    inst(Mfma,    [32, 32, 8],  Bf16,   false, Registers,     8),
    inst(Mfma,    [32, 32, 2],  F32,    false, Registers,     2),
    inst(Mfma,    [32, 32, 16], F8E4M3, false, Registers,     16),
    inst(Mfma,    [32, 32, 16], F8E5M2, false, Registers,     16),
    inst(Mfma,    [16, 16, 16], F16,    false, Registers,     16),
    inst(Mfma,    [16, 16, 16], Bf16,   false, Registers,     16),
    inst(Mfma,    [16, 16, 4],  F32,    false, Registers,     4),
    inst(Mfma,    [16, 16, 32], F8E4M3, false, Registers,     32),
    inst(Mfma,    [16, 16, 32], F8E5M2, false, Registers,     32),
];
// `v_wmma_f32_16x16x16_{f16,bf16}`.
#[rustfmt::skip]
pub(super) const RDNA3: &[MmaInst] = &[
    inst(Wmma,    [16, 16, 16], F16,    false, Registers,     16),
    inst(Wmma,    [16, 16, 16], Bf16,   false, Registers,     16),
];

/// The matrix instruction a `dot` of `a` x `b` operands with inner dim `k`
/// runs on, given the target's `features`: the first row that takes the
/// operands (both of one dtype) at `precision` and whose k step divides `k`.
/// `k: None` asks only whether the dtype reaches the tensor cores at all.
/// `None`: the dot runs on FMA units.
pub fn select_mma(
    features: &super::Features,
    a: Elem,
    b: Elem,
    k: Option<u32>,
    precision: Precision,
) -> Option<&'static MmaInst> {
    mma_candidates(features, a, b, k, precision).next()
}

/// Every row [`select_mma`] could pick, in the table's order (the code
/// generator takes the first whose tiles the block's warps can cover).
pub fn mma_candidates(
    features: &super::Features,
    a: Elem,
    b: Elem,
    k: Option<u32>,
    precision: Precision,
) -> impl Iterator<Item = &'static MmaInst> {
    let table: &'static [MmaInst] = if a == b { features.mma } else { &[] };
    table.iter().filter(move |i| {
        i.elem == a
            && (!i.tf32 || precision == Precision::Tf32)
            && k.is_none_or(|k| k.is_multiple_of(i.k_step))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Arch;

    fn reaches(arch: Arch, e: Elem, p: Precision) -> bool {
        select_mma(&arch.features(), e, e, None, p).is_some()
    }

    /// The dtypes that reach the tensor cores per arch, as the language
    /// reference lists them for E0605.
    #[test]
    fn tensor_core_dtypes_per_arch() {
        use Precision::*;
        #[rustfmt::skip]
        let rows: &[(Arch, &[(Elem, Precision)])] = &[
            (Arch::Sm70,    &[(F16, Ieee)]),
            (Arch::Sm75,    &[(F16, Ieee)]),
            (Arch::Sm80,    &[(F16, Ieee), (Bf16, Ieee), (F32, Tf32)]),
            (Arch::Sm86,    &[(F16, Ieee), (Bf16, Ieee), (F32, Tf32)]),
            (Arch::Sm89,    &[(F16, Ieee), (Bf16, Ieee), (F32, Tf32)]),
            (Arch::Sm90,    &[(F16, Ieee), (Bf16, Ieee), (F32, Tf32)]),
            (Arch::Sm90a,   &[(F16, Ieee), (Bf16, Ieee), (F32, Tf32)]),
            (Arch::Gfx90a,  &[(F16, Ieee), (Bf16, Ieee), (F32, Ieee), (F32, Tf32)]),
            (Arch::Gfx942,  &[(F16, Ieee), (Bf16, Ieee), (F32, Ieee), (F32, Tf32),
                              (F8E4M3, Ieee), (F8E5M2, Ieee)]),
            (Arch::Gfx1100, &[(F16, Ieee), (Bf16, Ieee)]),
        ];
        for (arch, yes) in rows {
            for e in [F16, Bf16, F32, F8E4M3, F8E5M2] {
                for p in [Precision::Ieee, Precision::Tf32] {
                    // tf32 is asked only of f32 operands (E0311 otherwise).
                    if p == Precision::Tf32 && e != F32 {
                        continue;
                    }
                    assert_eq!(
                        reaches(*arch, e, p),
                        yes.contains(&(e, p)),
                        "{arch} {e:?} {p:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn mixed_operands_and_k_step() {
        let f = Arch::Sm80.features();
        assert!(select_mma(&f, F16, Bf16, None, Precision::Ieee).is_none());
        assert_eq!(
            select_mma(&f, F16, F16, Some(32), Precision::Ieee).map(|i| i.k),
            Some(16)
        );
        assert!(select_mma(&f, F16, F16, Some(8), Precision::Ieee).is_none());
        assert_eq!(
            select_mma(&f, F32, F32, Some(8), Precision::Tf32).map(|i| i.feed),
            Some(Tf32Fragments)
        );
        let sm70 = Arch::Sm70.features();
        assert_eq!(
            select_mma(&sm70, F16, F16, Some(16), Precision::Ieee).map(|i| i.feed),
            Some(SharedPairs)
        );
    }
}
