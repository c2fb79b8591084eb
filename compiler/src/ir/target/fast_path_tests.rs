//! Target IR snapshots of memory-bound kernels over bf16 rows: 16-byte
//! vector accesses (bf16 pairs packed in 32-bit words) and the in-bounds
//! fast path (one uniform check, unpredicated accesses; the predicated
//! accesses only in the other branch), and how bf16 results are rounded
//! and packed per arch.

use std::collections::HashMap;

use crate::ir::target::tests::lower_source;
use crate::ir::target::verify::verify;
use crate::ir::target::{Inst, Kernel, MemTy, Operand, Reg, Space};
use crate::ir::tile::Specialization;
use crate::target::Arch;

fn lowered(src: &str, spec: Specialization) -> Kernel {
    lower_source(src, Arch::default(), spec)
}

// One warp, 1024 elements: 32 a thread, the fewest that take the fast path.
const COPY: &str = "@kernel(grid=(cdiv(N, 1024),), num_warps=1)
def copy(x: Tensor[\"N\", bf16], y: Tensor[\"N\", bf16]):
    i = program_id(0) * 1024
    store(y[i : i + 1024], load(x[i : i + 1024]))
";

const SOFTMAX: &str = "@kernel(grid=(M,), num_warps=1)
def softmax_rows(x: Tensor[\"M\", \"N\", bf16], out: Tensor[\"M\", \"N\", bf16]):
    row = program_id(0)
    v = load(x[row, 0 : 1024], other=-inf).to(f32)
    e = exp(v - max(v, axis=0))
    store(out[row, 0 : 1024], (e / sum(e, axis=0)).to(bf16))
";

/// The global accesses of `k` as (load?, vector length in words or
/// elements, predicated?, inside a branch?), in program order.
fn global_accesses(k: &Kernel) -> Vec<(bool, usize, bool, bool)> {
    fn go(insts: &[Inst], nested: bool, out: &mut Vec<(bool, usize, bool, bool)>) {
        for i in insts {
            match i {
                Inst::Ld {
                    space: Space::Global,
                    dst,
                    pred,
                    ..
                } => out.push((true, dst.len(), pred.is_some(), nested)),
                Inst::St {
                    space: Space::Global,
                    src,
                    pred,
                    ..
                } => out.push((false, src.len(), pred.is_some(), nested)),
                _ => {}
            }
            for r in i.regions() {
                go(r, true, out);
            }
        }
    }
    let mut out = Vec::new();
    go(&k.body, false, &mut out);
    out
}

#[test]
fn copy_kernel_has_an_unpredicated_16_byte_fast_path() {
    let k = lowered(COPY, Specialization::new());
    insta::assert_snapshot!("copy_bf16", k.to_string());
    let acc = global_accesses(&k);
    // The fast path: four unpredicated v4 word loads and stores; the other
    // branch (the ragged last program, N unknown) one predicated access per
    // element.
    assert_eq!(
        acc.iter().filter(|a| *a == &(true, 4, false, true)).count(),
        4
    );
    assert_eq!(
        acc.iter()
            .filter(|a| *a == &(false, 4, false, true))
            .count(),
        4
    );
    assert_eq!(acc.iter().filter(|a| a.2).count(), 64);
    assert!(
        acc.iter().all(|a| a.3),
        "every access is under the bounds branch"
    );
}

#[test]
fn softmax_row_with_aligned_rows_moves_16_byte_vectors_in_both_paths() {
    let k = lowered(SOFTMAX, Specialization::new().with_divisor("N", 16));
    insta::assert_snapshot!("softmax_rows_bf16_n16", k.to_string());
    let mut words = 0;
    k.walk(&mut |i| {
        if let Inst::Ld {
            space: Space::Global,
            mem,
            dst,
            ..
        } = i
        {
            assert_eq!((*mem, dst.len()), (MemTy::U32, 4), "only 16-byte loads");
            words += 1;
        }
    });
    assert_eq!(
        words, 8,
        "the fast path's four loads and the predicated four"
    );
    let acc = global_accesses(&k);
    let (fast_ld, slow_ld) = ((true, 4, false, true), (true, 4, true, true));
    let (fast_st, slow_st) = ((false, 4, false, true), (false, 4, true, true));
    let expected: Vec<_> = [fast_ld, slow_ld, fast_st, slow_st]
        .into_iter()
        .flat_map(|a| [a; 4])
        .collect();
    assert_eq!(acc, expected);
}

/// `SOFTMAX` lowered for `arch`.
fn softmax_for(arch: Arch) -> Kernel {
    lower_source(SOFTMAX, arch, Specialization::new().with_divisor("N", 16))
}

#[test]
fn bf16_results_round_and_pack_with_one_conversion_where_the_arch_has_it() {
    // sm_80 and later: every bf16 word stored is one conversion of two
    // values before rounding (the rounded copies are left unread).
    let k = softmax_for(Arch::Sm80);
    verify(&k).unwrap();
    let packs: HashMap<Reg, (Operand, Operand)> = {
        let mut m = HashMap::new();
        k.walk(&mut |i| {
            if let Inst::PackBf16 { dst, hi, lo } = i {
                m.insert(*dst, (*hi, *lo));
            }
        });
        m
    };
    let mut stored = 0;
    k.walk(&mut |i| {
        if let Inst::St {
            space: Space::Global,
            src,
            ..
        } = i
        {
            for w in src {
                let (hi, lo) = packs[&w.reg().expect("a register")];
                assert!(hi.reg().is_some() && lo.reg().is_some(), "{hi:?} {lo:?}");
                stored += 1;
            }
        }
    });
    assert!(stored > 0);
    // sm_75 and AMD have no such conversion: integer rounding, and the
    // verifier refuses the instruction there.
    for arch in [Arch::Sm75, Arch::Gfx942] {
        let mut old = softmax_for(arch);
        verify(&old).unwrap();
        let mut n = 0;
        old.walk(&mut |i| n += matches!(i, Inst::PackBf16 { .. }) as usize);
        assert_eq!(n, 0, "{arch}");
        old.body.push(Inst::PackBf16 {
            dst: Reg(0),
            hi: Operand::Float(1.0),
            lo: Operand::Float(0.0),
        });
        let err = verify(&old).unwrap_err();
        assert!(err.contains("has no bf16 conversion"), "{err}");
    }
}
