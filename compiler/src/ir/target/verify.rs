//! The Target IR verifier: every register is defined before it is read (on every
//! path: a register written in both branches of an `If` is defined after it; one
//! written only inside a loop body is not defined after the loop), operand types
//! agree with the instruction, indices are in range.

use std::collections::HashSet;

use super::{Inst, Kernel, MemTy, Operand, Reg, RegTy, Space, WgmmaA};
use crate::target::{Elem, MmaKind};

/// Checks `k`; the error lists every problem found.
pub fn verify(k: &Kernel) -> Result<(), String> {
    let mut v = Verifier {
        k,
        errors: Vec::new(),
    };
    let mut defined = HashSet::new();
    v.block(&k.body, &mut defined, &mut Vec::new());
    if !k.num_threads.is_power_of_two() || k.num_threads == 0 {
        v.errors.push(format!(
            "num_threads {} is not a power of two",
            k.num_threads
        ));
    }
    if v.errors.is_empty() {
        Ok(())
    } else {
        Err(v.errors.join("\n"))
    }
}

struct Verifier<'a> {
    k: &'a Kernel,
    errors: Vec<String>,
}

/// Adds `r` to `defined`, noting it in `added` if it is new there.
fn define(defined: &mut HashSet<Reg>, added: &mut Vec<Reg>, r: Reg) {
    if defined.insert(r) {
        added.push(r);
    }
}

/// Takes the registers a nested region defined back out of `defined`.
fn undo(defined: &mut HashSet<Reg>, added: &[Reg]) {
    for r in added {
        defined.remove(r);
    }
}

/// Types that share a register class (and so may be mixed freely).
fn class(t: RegTy) -> u8 {
    match t {
        RegTy::Pred => 0,
        RegTy::I32 | RegTy::U32 | RegTy::B32 => 1,
        RegTy::I64 | RegTy::U64 => 2,
        RegTy::F32 => 3,
        RegTy::F64 => 4,
        RegTy::B16 => 5,
    }
}

impl Verifier<'_> {
    fn ty(&self, r: Reg) -> Option<RegTy> {
        self.k.regs.get(r.0 as usize).copied()
    }

    /// Checks `insts` with `defined` the registers defined before them; adds
    /// what they define to `defined`, and each register it was missing to `added`.
    /// A nested region adds to the same set and takes its own additions back
    /// out afterwards: cloning the set for each region would cost the square of
    /// a long kernel with many `if`s.
    fn block(&mut self, insts: &[Inst], defined: &mut HashSet<Reg>, added: &mut Vec<Reg>) {
        for (n, i) in insts.iter().enumerate() {
            for u in i.uses() {
                if self.ty(u).is_none() {
                    self.errors
                        .push(format!("inst {n} ({i:?}): register {} has no type", u.0));
                } else if !defined.contains(&u) {
                    self.errors.push(format!(
                        "inst {n} ({i:?}): register {} read before it is defined",
                        u.0
                    ));
                }
            }
            self.types(i);
            match i {
                Inst::For { iv, body, .. } => {
                    let mut inner = Vec::new();
                    define(defined, &mut inner, *iv);
                    self.block(body, defined, &mut inner);
                    undo(defined, &inner);
                }
                Inst::While { cond, pred, body } => {
                    let mut inner = Vec::new();
                    self.block(cond, defined, &mut inner);
                    if !defined.contains(pred) {
                        self.errors.push(format!(
                            "while condition {} is not defined by its region",
                            pred.0
                        ));
                    }
                    self.block(body, defined, &mut inner);
                    undo(defined, &inner);
                }
                Inst::If {
                    then, otherwise, ..
                } => {
                    let mut a = Vec::new();
                    self.block(then, defined, &mut a);
                    undo(defined, &a);
                    let mut b = Vec::new();
                    self.block(otherwise, defined, &mut b);
                    undo(defined, &b);
                    // Defined after the `If`: what both branches define.
                    let a: HashSet<Reg> = a.into_iter().collect();
                    for r in b {
                        if a.contains(&r) {
                            define(defined, added, r);
                        }
                    }
                }
                _ => {}
            }
            for d in i.defs() {
                if self.ty(d).is_none() {
                    self.errors
                        .push(format!("inst {n}: register {} has no type", d.0));
                }
                define(defined, added, d);
            }
        }
    }

    fn expect(&mut self, i: &Inst, o: &Operand, want: RegTy) {
        if let Operand::Reg(r) = o {
            if let Some(t) = self.ty(*r) {
                if class(t) != class(want) {
                    self.errors.push(format!(
                        "{i:?}: operand {} is {} where {} is expected",
                        r.0,
                        t.name(),
                        want.name()
                    ));
                }
            }
        }
    }

    fn types(&mut self, i: &Inst) {
        let k = self.k;
        let ty = |r: &Reg| k.regs.get(r.0 as usize).copied().unwrap_or(RegTy::Pred);
        match i {
            Inst::Param { dst, index } => match k.params.get(*index) {
                Some(p) if class(p.ty) == class(ty(dst)) => {}
                _ => self.errors.push(format!("{i:?}: bad parameter")),
            },
            Inst::SmemAddr { buffer, .. } if *buffer >= k.smem.len() => {
                self.errors.push(format!("{i:?}: no such shared buffer"))
            }
            Inst::Unary { dst, x, .. } => self.expect(i, x, ty(dst)),
            Inst::Binary { dst, a, b, .. } => {
                self.expect(i, a, ty(dst));
                self.expect(i, b, ty(dst));
            }
            Inst::Fma { dst, a, b, c } => {
                for x in [a, b, c] {
                    self.expect(i, x, ty(dst));
                }
            }
            Inst::PackBf16 { dst, hi, lo } => {
                self.expect(i, hi, RegTy::F32);
                self.expect(i, lo, RegTy::F32);
                if !matches!(ty(dst), RegTy::U32 | RegTy::B32) {
                    self.errors
                        .push(format!("{i:?}: a bf16 pair is a 32-bit integer register"));
                }
                if !k.arch.features().cvt_bf16 {
                    self.errors
                        .push(format!("{i:?}: {} has no bf16 conversion", k.arch));
                }
            }
            Inst::Cmp {
                ty: t, dst, a, b, ..
            } => {
                self.expect(i, a, *t);
                self.expect(i, b, *t);
                if ty(dst) != RegTy::Pred {
                    self.errors
                        .push(format!("{i:?}: comparison result is not a pred"));
                }
            }
            Inst::Select { dst, cond, a, b } => {
                self.expect(i, a, ty(dst));
                self.expect(i, b, ty(dst));
                if ty(cond) != RegTy::Pred || ty(dst) == RegTy::Pred {
                    self.errors.push(format!("{i:?}: bad select types"));
                }
            }
            Inst::Ld {
                space,
                mem,
                dst,
                addr,
                pred,
                ..
            } => {
                self.mem_access(i, *space, *addr, pred);
                if !matches!(dst.len(), 1 | 2 | 4) {
                    self.errors
                        .push(format!("{i:?}: vector width {}", dst.len()));
                }
                for d in dst {
                    self.data(i, *mem, ty(d));
                }
            }
            Inst::St {
                space,
                mem,
                src,
                addr,
                pred,
                ..
            } => {
                self.mem_access(i, *space, *addr, pred);
                if !matches!(src.len(), 1 | 2 | 4) {
                    self.errors
                        .push(format!("{i:?}: vector width {}", src.len()));
                }
                for s in src {
                    if let Operand::Reg(r) = s {
                        self.data(i, *mem, ty(r));
                    }
                }
            }
            Inst::AtomAdd {
                mem,
                src,
                addr,
                pred,
                ..
            } => {
                self.mem_access(i, Space::Global, *addr, pred);
                if let Operand::Reg(r) = src {
                    self.data(i, *mem, ty(r));
                }
            }
            Inst::ShflXor { dst, src, .. } if ty(dst) != ty(src) || ty(dst) == RegTy::Pred => {
                self.errors.push(format!(
                    "{i:?}: shuffles move one register (32 or 64 bits) of one type"
                ));
            }
            Inst::ShflXor { lane_mask, .. } if *lane_mask >= k.arch.info().warp_size => {
                self.errors.push(format!(
                    "{i:?}: the lane mask leaves {}'s {}-lane warp",
                    k.arch,
                    k.arch.info().warp_size
                ));
            }
            Inst::CpAsync {
                dst,
                src,
                bytes,
                src_size,
                ..
            } => {
                self.mem_access(i, Space::Shared, *dst, &None);
                self.mem_access(i, Space::Global, *src, &None);
                if !matches!(bytes, 4 | 8 | 16) || src_size.is_some_and(|r| class(ty(&r)) != 1) {
                    self.errors.push(format!("{i:?}: bad async copy"));
                }
                if !k.arch.features().cp_async {
                    self.errors
                        .push(format!("{i:?}: {} has no async copies", k.arch));
                }
            }
            Inst::LdMatrix { dst, addr, .. } => {
                self.mem_access(i, Space::Shared, *addr, &None);
                if !matches!(dst.len(), 1 | 2 | 4) || dst.iter().any(|d| ty(d) != RegTy::B32) {
                    self.errors
                        .push(format!("{i:?}: load_matrix gives 1, 2 or 4 b32 registers"));
                }
                if !k.arch.features().ldmatrix {
                    self.errors
                        .push(format!("{i:?}: {} has no ldmatrix", k.arch));
                }
            }
            Inst::Mma {
                kind,
                m,
                n,
                k: kk,
                input,
                d,
                a,
                b,
                c,
            } => {
                let row = mma_elem(*input).and_then(|e| {
                    k.arch.features().mma.iter().find(|r| {
                        r.kind == *kind && [r.m, r.n, r.k] == [*m, *n, *kk] && r.elem == e
                    })
                });
                if row.is_none() {
                    self.errors.push(format!(
                        "{i:?}: {} has no {kind:?} {m}x{n}x{kk} on {}",
                        k.arch,
                        input.name()
                    ));
                }
                // (a registers, b registers, accumulators, operand register type)
                let want = match kind {
                    // 32 lanes; 16-bit inputs pack two per register, tf32 one.
                    // m8n8k4 (sm_70) is four independent products, one per quad-pair.
                    MmaKind::MmaSync => {
                        let per = if *input == MemTy::F32 { 32 } else { 64 };
                        let times = if (*m, *n, *kk) == (8, 8, 4) { 4 } else { 1 };
                        (
                            times * m * kk / per,
                            times * kk * n / per,
                            times * m * n / 32,
                            RegTy::B32,
                        )
                    }
                    // 64 lanes; an f32 input per F32 register, narrower ones
                    // packed in B32 registers.
                    MmaKind::Mfma => {
                        let (per, t) = if *input == MemTy::F32 {
                            (1, RegTy::F32)
                        } else {
                            (4 / input.bytes(), RegTy::B32)
                        };
                        (m * kk / 64 / per, kk * n / 64 / per, m * n / 64, t)
                    }
                    // 32 lanes, each holding a whole row of A and column of B
                    // (16-bit values, two per register).
                    MmaKind::Wmma => (kk / 2, kk / 2, m * n / 32, RegTy::B32),
                };
                let ok = a.len() == want.0 as usize
                    && b.len() == want.1 as usize
                    && c.len() == want.2 as usize
                    && d.len() == c.len()
                    && a.iter().chain(b).all(|r| ty(r) == want.3)
                    && c.iter().chain(d).all(|r| ty(r) == RegTy::F32);
                if !ok {
                    self.errors
                        .push(format!("{i:?}: mma fragment counts or types"));
                }
            }
            Inst::Wgmma {
                n,
                input,
                acc,
                a,
                b_desc,
                trans_b,
                ..
            } => {
                if !k.arch.features().wgmma {
                    self.errors.push(format!("{i:?}: {} has no wgmma", k.arch));
                }
                // 8-bit and tf32 (`F32`) operands: both k-major in shared
                // memory (wgmma transposes 16-bit ones only).
                let k_major_only = matches!(input, MemTy::F8E4M3 | MemTy::F8E5M2 | MemTy::F32);
                let ok = (matches!(input, MemTy::BF16 | MemTy::F16)
                    || k_major_only && !*trans_b && matches!(a, WgmmaA::Desc(_)))
                    && *n >= 8
                    && *n <= 256
                    && n % 8 == 0
                    && acc.len() == (*n / 2) as usize
                    && acc.iter().all(|r| ty(r) == RegTy::F32)
                    && match a {
                        WgmmaA::Desc(d) => ty(d) == RegTy::U64,
                        WgmmaA::Regs(rs) => rs.len() == 4 && rs.iter().all(|r| ty(r) == RegTy::B32),
                    }
                    && ty(b_desc) == RegTy::U64;
                if !ok {
                    self.errors
                        .push(format!("{i:?}: wgmma shape, accumulators or descriptors"));
                }
            }
            Inst::TensorMapAddr { dst, map } => {
                if *map >= k.tensor_maps.len() || ty(dst) != RegTy::U64 {
                    self.errors.push(format!("{i:?}: bad tensor map"));
                }
                if !k.arch.features().tma {
                    self.errors.push(format!("{i:?}: {} has no TMA", k.arch));
                }
            }
            Inst::PrefetchTensorMap { map } if ty(map) != RegTy::U64 || !k.arch.features().tma => {
                self.errors
                    .push(format!("{i:?}: a tensor map address on a TMA arch"));
            }
            Inst::MbarInit { bar, .. }
            | Inst::MbarExpectTx { bar, .. }
            | Inst::MbarArrive { bar }
            | Inst::MbarInval { bar }
            | Inst::MbarWait { bar, .. } => {
                self.mem_access(i, Space::Shared, *bar, &None);
                if let Inst::MbarWait { parity, .. } = i {
                    self.expect(i, parity, RegTy::U32);
                }
                if !k.arch.features().tma {
                    self.errors
                        .push(format!("{i:?}: {} has no transaction barriers", k.arch));
                }
            }
            Inst::TmaLoad {
                dst,
                map,
                coords,
                bar,
                ..
            } => {
                self.mem_access(i, Space::Shared, *dst, &None);
                self.mem_access(i, Space::Shared, *bar, &None);
                if ty(map) != RegTy::U64 || coords.is_empty() || coords.len() > 5 {
                    self.errors
                        .push(format!("{i:?}: bad tensor map or coordinates"));
                }
                for c in coords {
                    self.expect(i, c, RegTy::I32);
                }
                if !k.arch.features().tma {
                    self.errors.push(format!("{i:?}: {} has no TMA", k.arch));
                }
            }
            Inst::TmaStore {
                src, map, coords, ..
            } => {
                self.mem_access(i, Space::Shared, *src, &None);
                if ty(map) != RegTy::U64 || coords.is_empty() || coords.len() > 5 {
                    self.errors
                        .push(format!("{i:?}: bad tensor map or coordinates"));
                }
                for c in coords {
                    self.expect(i, c, RegTy::I32);
                }
                if !k.arch.features().tma {
                    self.errors.push(format!("{i:?}: {} has no TMA", k.arch));
                }
            }
            Inst::BulkCommit | Inst::BulkWaitRead { .. } if !k.arch.features().tma => {
                self.errors
                    .push(format!("{i:?}: {} has no bulk copies", k.arch));
            }
            Inst::For {
                iv, lo, hi, step, ..
            } => {
                for x in [lo, hi, step] {
                    self.expect(i, x, ty(iv));
                }
            }
            Inst::If { cond, .. } | Inst::While { pred: cond, .. } | Inst::Trap { pred: cond }
                if ty(cond) != RegTy::Pred =>
            {
                self.errors.push(format!("{i:?}: condition is not a pred"));
            }
            _ => {}
        }
    }

    fn mem_access(&mut self, i: &Inst, space: Space, addr: Reg, pred: &Option<Reg>) {
        let want = match space {
            Space::Global => 2,
            Space::Shared => 1,
        };
        if self.ty(addr).map(class) != Some(want) {
            self.errors
                .push(format!("{i:?}: address register of the wrong size"));
        }
        if let Some(p) = pred {
            if self.ty(*p) != Some(RegTy::Pred) {
                self.errors.push(format!("{i:?}: guard is not a pred"));
            }
        }
    }

    /// The register a memory access of `mem` moves.
    fn data(&mut self, i: &Inst, mem: MemTy, t: RegTy) {
        let ok = match mem {
            MemTy::F64 => t == RegTy::F64,
            MemTy::F32 => t == RegTy::F32,
            MemTy::F16 => t == RegTy::B16,
            MemTy::I64 => class(t) == 2,
            _ => class(t) == 1,
        };
        if !ok {
            self.errors.push(format!(
                "{i:?}: a {} access moves a {} register",
                mem.name(),
                t.name()
            ));
        }
    }
}

/// The matrix-instruction operand dtype of a memory type, if it is one.
fn mma_elem(m: MemTy) -> Option<Elem> {
    Some(match m {
        MemTy::F16 => Elem::F16,
        MemTy::BF16 => Elem::Bf16,
        MemTy::F32 => Elem::F32,
        MemTy::F8E4M3 => Elem::F8E4M3,
        MemTy::F8E5M2 => Elem::F8E5M2,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Arch;

    /// A kernel of `body` over four i32 registers (0 is defined up front).
    fn check(body: Vec<Inst>) -> Result<(), String> {
        let mut all = vec![Inst::Mov {
            dst: Reg(0),
            src: Operand::Int(1),
        }];
        all.extend(body);
        verify(&Kernel {
            name: "k".into(),
            arch: Arch::Sm90,
            num_threads: 32,
            params: vec![],
            smem: vec![],
            regs: vec![RegTy::Pred, RegTy::I32, RegTy::I32, RegTy::I32],
            body: all,
            layouts: vec![],
            notes: vec![],
            tensor_maps: vec![],
        })
    }

    fn mov(dst: u32) -> Inst {
        Inst::Mov {
            dst: Reg(dst),
            src: Operand::Int(0),
        }
    }

    fn read(r: u32) -> Inst {
        Inst::Mov {
            dst: Reg(3),
            src: Operand::Reg(Reg(r)),
        }
    }

    #[test]
    fn tma_and_transaction_barriers_are_sm_90a_only() {
        // sm_90 here; and no tensor map 0, and an i32 for its address.
        let e = check(vec![Inst::TensorMapAddr {
            dst: Reg(1),
            map: 0,
        }])
        .unwrap_err();
        assert!(
            e.contains("bad tensor map") && e.contains("sm_90 has no TMA"),
            "{e}"
        );
        let e = check(vec![
            mov(1),
            Inst::MbarWait {
                bar: Reg(1),
                parity: Operand::Int(0),
            },
        ])
        .unwrap_err();
        assert!(e.contains("sm_90 has no transaction barriers"), "{e}");
        let e = check(vec![mov(1), Inst::PrefetchTensorMap { map: Reg(1) }]).unwrap_err();
        assert!(e.contains("a tensor map address on a TMA arch"), "{e}");
    }

    /// wgmma's `a` in registers is four packed `B32` pairs a thread; a
    /// descriptor is one `U64`.
    #[test]
    fn wgmma_a_in_registers_is_four_packed_pairs() {
        let kernel = |a: WgmmaA| wgmma_kernel(MemTy::BF16, a, true);
        assert!(kernel(WgmmaA::Regs((0..4).map(Reg).collect())).is_ok());
        for bad in [
            WgmmaA::Regs((0..3).map(Reg).collect()),
            WgmmaA::Desc(Reg(0)),
        ] {
            let e = kernel(bad).unwrap_err();
            assert!(
                e.contains("wgmma shape, accumulators or descriptors"),
                "{e}"
            );
        }
        assert!(kernel(WgmmaA::Desc(Reg(8))).is_ok());
    }

    /// wgmma reads 8-bit and tf32 operands k-major from shared memory only:
    /// no transposed `b`, no `a` in registers.
    #[test]
    fn wgmma_f8_operands_are_k_major_descriptors() {
        for input in [MemTy::F8E4M3, MemTy::F8E5M2, MemTy::F32] {
            assert!(wgmma_kernel(input, WgmmaA::Desc(Reg(8)), false).is_ok());
            for (a, trans_b) in [
                (WgmmaA::Desc(Reg(8)), true),
                (WgmmaA::Regs((0..4).map(Reg).collect()), false),
            ] {
                let e = wgmma_kernel(input, a, trans_b).unwrap_err();
                assert!(
                    e.contains("wgmma shape, accumulators or descriptors"),
                    "{e}"
                );
            }
        }
        assert!(wgmma_kernel(MemTy::F64, WgmmaA::Desc(Reg(8)), false).is_err());
    }

    /// A kernel of one `m64n8` wgmma of `input` (registers 0-3 `B32`, 4-7
    /// the `F32` accumulators, 8 the `U64` descriptor of `b`).
    fn wgmma_kernel(input: MemTy, a: WgmmaA, trans_b: bool) -> Result<(), String> {
        let wgmma = |a: WgmmaA| Inst::Wgmma {
            n: 8,
            input,
            acc: (4..8).map(Reg).collect(),
            a,
            b_desc: Reg(8),
            trans_b,
            accumulate: true,
        };
        let kernel = |a: WgmmaA| {
            let mut regs = vec![RegTy::F32; 4];
            regs.splice(0..0, [RegTy::B32; 4]);
            regs.push(RegTy::U64);
            let mut body: Vec<Inst> = (0..9).map(mov).collect();
            body.push(wgmma(a));
            verify(&Kernel {
                name: "k".into(),
                arch: Arch::Sm90a,
                num_threads: 128,
                params: vec![],
                smem: vec![],
                regs,
                body,
                layouts: vec![],
                notes: vec![],
                tensor_maps: vec![],
            })
        };
        kernel(a)
    }

    #[test]
    fn definitions_follow_the_paths() {
        let branch = |then: Vec<Inst>, otherwise: Vec<Inst>| Inst::If {
            cond: Reg(0),
            then,
            otherwise,
        };
        // Written in both branches: defined after the `If`.
        assert!(check(vec![branch(vec![mov(1)], vec![mov(1)]), read(1)]).is_ok());
        // Written in one branch only: not defined after, nor in the other.
        for body in [
            vec![branch(vec![mov(1)], vec![mov(2)]), read(1)],
            vec![branch(vec![mov(1)], vec![read(1)])],
        ] {
            let e = check(body).unwrap_err();
            assert!(e.contains("register 1 read before it is defined"), "{e}");
        }
        // The body's registers stay in the loop (the induction variable is the
        // loop's own definition).
        let for_loop = Inst::For {
            iv: Reg(1),
            lo: Operand::Int(0),
            hi: Operand::Int(4),
            step: Operand::Int(1),
            body: vec![read(1), mov(2), read(2)],
        };
        assert!(check(vec![for_loop.clone(), read(1)]).is_ok());
        let e = check(vec![for_loop, read(2)]).unwrap_err();
        assert!(e.contains("register 2 read before it is defined"), "{e}");
    }
}
