//! Matrix instructions in HIP: AMD's MFMA (CDNA) and WMMA (RDNA3) as
//! clang's `__builtin_amdgcn_mfma_f32_*` and
//! `__builtin_amdgcn_wmma_f32_16x16x16_*_w32`. One Target IR instruction is
//! one block: its packed operand registers gathered into a vector of 32-bit
//! words and bit-cast to the builtin's operand type (`_Float16`s, `short`s
//! for bf16, a `long` of eight fp8 codes; an f32 operand is one `float`), its
//! accumulators gathered into a `float` vector, and the result's elements
//! copied to the destination registers. Clang keeps all of it in registers
//! (on CDNA the accumulators in AGPRs or VGPRs, as it chooses). NVIDIA's
//! `mma.sync` is not an AMD instruction: lowering for an AMD arch never
//! emits it, and the printer refuses it.

use std::fmt::Write;

use super::{HipError, Printer};
use crate::ir::target::{Inst, MemTy};
use crate::target::MmaKind;

/// The builtin of an AMD matrix instruction and the element type of its A
/// and B operand vectors (`None`: one `float` each).
fn builtin(
    kind: MmaKind,
    [m, n, k]: [u32; 3],
    input: MemTy,
) -> Option<(&'static str, Option<&'static str>)> {
    use MemTy::*;
    let half = Some("_Float16");
    // The `_1k` bf16 builtins take their operands as `short` vectors.
    let bf = Some("short");
    // Eight fp8 codes in one 64-bit `long`.
    let fp8 = Some("long");
    Some(match (kind, m, n, k, input) {
        (MmaKind::Mfma, 32, 32, 8, F16) => ("__builtin_amdgcn_mfma_f32_32x32x8f16", half),
        (MmaKind::Mfma, 32, 32, 8, BF16) => ("__builtin_amdgcn_mfma_f32_32x32x8bf16_1k", bf),
        (MmaKind::Mfma, 32, 32, 2, F32) => ("__builtin_amdgcn_mfma_f32_32x32x2f32", None),
        (MmaKind::Mfma, 32, 32, 16, F8E4M3) => ("__builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8", fp8),
        (MmaKind::Mfma, 32, 32, 16, F8E5M2) => ("__builtin_amdgcn_mfma_f32_32x32x16_bf8_bf8", fp8),
        (MmaKind::Mfma, 16, 16, 16, F16) => ("__builtin_amdgcn_mfma_f32_16x16x16f16", half),
        (MmaKind::Mfma, 16, 16, 16, BF16) => ("__builtin_amdgcn_mfma_f32_16x16x16bf16_1k", bf),
        (MmaKind::Mfma, 16, 16, 4, F32) => ("__builtin_amdgcn_mfma_f32_16x16x4f32", None),
        (MmaKind::Mfma, 16, 16, 32, F8E4M3) => ("__builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8", fp8),
        (MmaKind::Mfma, 16, 16, 32, F8E5M2) => ("__builtin_amdgcn_mfma_f32_16x16x32_bf8_bf8", fp8),
        (MmaKind::Wmma, 16, 16, 16, F16) => ("__builtin_amdgcn_wmma_f32_16x16x16_f16_w32", half),
        (MmaKind::Wmma, 16, 16, 16, BF16) => ("__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32", bf),
        _ => return None,
    })
}

/// The lines of C that run matrix instruction `i` (of `p`'s kernel).
pub(super) fn print(p: &Printer<'_>, i: &Inst) -> Result<Vec<String>, HipError> {
    let Inst::Mma {
        kind,
        m,
        n,
        k,
        input,
        d,
        a,
        b,
        c,
    } = i
    else {
        return p.inexpressible(format!("{i:?} (not a matrix instruction)"));
    };
    if *kind == MmaKind::MmaSync {
        return p.inexpressible(format!(
            "`mma.sync` m{m}n{n}k{k} (NVIDIA's tensor-core instruction, not an AMD instruction)"
        ));
    }
    let Some((name, elem)) = builtin(*kind, [*m, *n, *k], *input) else {
        return p.inexpressible(format!(
            "a {kind:?} {m}x{n}x{k} on {} (no such instruction)",
            input.name()
        ));
    };
    let list = |regs: &[crate::ir::target::Reg]| {
        regs.iter().map(|&x| p.r(x)).collect::<Vec<_>>().join(", ")
    };
    let mut lines = vec!["{".to_string()];
    if let Some(e) = elem {
        lines.push(format!(
            "  typedef unsigned tsr_words __attribute__((ext_vector_type({})));",
            a.len()
        ));
        if e != "long" {
            lines.push(format!(
                "  typedef {e} tsr_operand __attribute__((ext_vector_type({})));",
                2 * a.len()
            ));
        }
    }
    lines.push(format!(
        "  typedef float tsr_acc __attribute__((ext_vector_type({})));",
        c.len()
    ));
    let operand = |regs: &[crate::ir::target::Reg]| match elem {
        None => p.r(regs[0]).to_string(),
        Some("long") => format!("__builtin_bit_cast(long, tsr_words{{{}}})", list(regs)),
        Some(_) => format!(
            "__builtin_bit_cast(tsr_operand, tsr_words{{{}}})",
            list(regs)
        ),
    };
    // MFMA's cbsz, abid and blgp: no broadcast between lane groups.
    let modifiers = if *kind == MmaKind::Mfma {
        ", 0, 0, 0"
    } else {
        ""
    };
    lines.push(format!(
        "  tsr_acc tsr_d = {name}({}, {}, tsr_acc{{{}}}{modifiers});",
        operand(a),
        operand(b),
        list(c)
    ));
    let mut copy = String::from(" ");
    for (j, &x) in d.iter().enumerate() {
        let _ = write!(copy, " {} = tsr_d[{j}];", p.r(x));
    }
    lines.push(copy);
    lines.push("}".to_string());
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::builtin;
    use crate::check::DType;
    use crate::ir::target::tests::gemm;
    use crate::ir::target::{lower, MemTy};
    use crate::target::{Arch, Elem, MmaKind};

    /// Every matrix instruction of the AMD arches' tables is the one a
    /// one-wave gemm of its tile shape runs on, prints as its builtin, and
    /// (with clang at hand, see `clang::find`) compiles without a warning.
    #[test]
    fn every_amd_matrix_instruction_prints_and_compiles() {
        let clang = super::super::clang::find();
        let dir = std::env::temp_dir().join(format!("tessera-hip-mma-{}", std::process::id()));
        let mut failures = Vec::new();
        for arch in [Arch::Gfx90a, Arch::Gfx942, Arch::Gfx1100] {
            for inst in arch.features().mma {
                let (dtype, mem) = match inst.elem {
                    Elem::F16 => (DType::F16, MemTy::F16),
                    Elem::Bf16 => (DType::BF16, MemTy::BF16),
                    Elem::F32 => (DType::F32, MemTy::F32),
                    Elem::F8E4M3 => (DType::F8E4M3, MemTy::F8E4M3),
                    Elem::F8E5M2 => (DType::F8E5M2, MemTy::F8E5M2),
                };
                let k = lower(&gemm(inst.m, inst.n, 32, 1, dtype), arch).unwrap();
                let family = if inst.kind == MmaKind::Mfma {
                    "mfma"
                } else {
                    "wmma"
                };
                let op = format!(
                    "= {family}.{}x{}x{}.{} ",
                    inst.m,
                    inst.n,
                    inst.k,
                    mem.name()
                );
                assert!(k.to_string().contains(&op), "{arch}: {op}\n{k}");
                let (name, _) = builtin(inst.kind, [inst.m, inst.n, inst.k], mem).unwrap();
                let text = super::super::module(arch, std::slice::from_ref(&k)).unwrap();
                assert!(text.contains(&format!("{name}(")), "{arch}: {name}\n{text}");
                let Some(clang) = &clang else { continue };
                let stem = format!("{arch}-{}", k.name);
                match super::super::clang::compile(clang, arch, &text, &dir, &stem) {
                    Ok(c) if c.ok && c.problems().is_empty() => {}
                    Ok(c) => failures.push(format!("{stem}:\n{}", c.stderr)),
                    Err(e) => failures.push(e),
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }
}
