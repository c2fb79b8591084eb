//! `dot` on AMD's matrix units: CDNA's MFMA (`v_mfma_f32_32x32x8{f16,bf16_1k}`,
//! `v_mfma_f32_32x32x2f32`, and on CDNA3 `v_mfma_f32_32x32x16_{fp8,bf8}`,
//! 64-lane waves) and RDNA3's WMMA (`v_wmma_f32_16x16x16_{f16,bf16}`, wave32).
//!
//! Both families read their operands the same way, which [`OperandMap`]
//! states: lane `l` holds one row of the A tile (one column of B) and a run
//! of consecutive k values of it. So `a` is staged row-major (`[m, k]`) and
//! `b` transposed (`[n, k]`) in LDS (the scratch region), rows padded so
//! that the lanes reading one k run of consecutive rows hit every bank once
//! (`row_stride`), and each lane reads its runs with 4- to 16-byte LDS loads. The
//! accumulator stays in the instruction's output layout
//! (`Layout::mfma_accumulator`, `Layout::wmma_accumulator`), f32 throughout.
//!
//! CDNA3's fp8 instructions take the FNUZ encodings (exponent bias 8 and 16,
//! one NaN at 0x80, no infinities, no negative zero), not the OCP ones a
//! Tessera `f8e4m3`/`f8e5m2` holds. An OCP code read as FNUZ is half the OCP
//! value, exactly (for E4M3, whose largest value 448 FNUZ cannot hold, too),
//! so operands are staged as their OCP codes with negative zero made positive
//! and NaN (and E5M2's infinities) made the FNUZ NaN, the accumulators are
//! quartered before the products are added and multiplied by 4 after: exact
//! scalings by powers of two, so the sum is the OCP operands' sum.

use std::rc::Rc;

use super::staging::pow2_run;
use super::WarpTiling;
use crate::check::DType;
use crate::ir::target::layout::Layout;
use crate::ir::target::lower::{Lower, R, TV};
use crate::ir::target::{BinOp, CmpOp, Inst, MemTy, Operand, Reg, RegTy, SmemBuffer, Space};
use crate::ir::tile::{self, OpKind, Precision, Value};
use crate::target::{MmaFeed, MmaInst, MmaKind};

/// Which elements of an instruction's A tile (and, the same way, of its B
/// tile's transpose) each lane's operand registers hold: lane `l` holds row
/// `l % rows` and the `run` consecutive k values from
/// `k0 = (l / rows) * run % k` (so on RDNA3 lanes 16-31 repeat lanes 0-15).
/// Register value `i` (in order, packed low half first) is k value `k0 + i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OperandMap {
    pub rows: u32,
    pub run: u32,
    pub k: u32,
}

impl OperandMap {
    /// The map of an AMD matrix instruction (CDNA3 ISA guide, "Dependent
    /// Register Layouts" of MFMA; RDNA3 ISA guide, WMMA operand layout).
    pub fn of(inst: &MmaInst, wave: u32) -> OperandMap {
        match inst.kind {
            // 64 lanes over 32 rows: two runs of k / 2.
            MmaKind::Mfma => OperandMap {
                rows: inst.m,
                run: inst.m * inst.k / wave,
                k: inst.k,
            },
            // WMMA: the whole k of a row in every lane.
            _ => OperandMap {
                rows: inst.m,
                run: inst.k,
                k: inst.k,
            },
        }
    }

    /// `(row, k)` of value `i` of lane `lane`.
    #[cfg(test)]
    pub fn elem(&self, lane: u32, i: u32) -> (u32, u32) {
        (lane % self.rows, (lane / self.rows) * self.run % self.k + i)
    }
}

/// The operand memory type of an AMD matrix-core dot of `d`.
fn amd_input(d: DType) -> Option<MemTy> {
    Some(match d {
        DType::F16 => MemTy::F16,
        DType::BF16 => MemTy::BF16,
        DType::F32 => MemTy::F32,
        DType::F8E4M3 => MemTy::F8E4M3,
        DType::F8E5M2 => MemTy::F8E5M2,
        _ => return None,
    })
}

/// The byte stride of the staged operand rows of `k` elements of `es`
/// bytes, read by each lane in runs of `run_bytes`: the least above the row
/// whose length in 32-bit banks is an odd multiple of the words one LDS load
/// moves (`w` = 1, 2 or 4). The lanes of one pass of such a load read
/// consecutive rows at one k offset, so they start `W r mod 32` banks apart,
/// `W / w` odd: the `32 / w` lanes of a pass cover all 32 banks once.
fn row_stride(k: u32, es: u32, run_bytes: u32) -> u32 {
    let w = (run_bytes / 4).clamp(1, 4);
    let mut words = (k * es).div_ceil(4);
    while words % (2 * w) != w {
        words += 1;
    }
    4 * words
}

impl<'a> Lower<'a> {
    /// `dot` on an AMD matrix instruction (`inst`, MFMA or WMMA): see the
    /// module comment.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::ir::target::lower) fn dot_amd(
        &mut self,
        [a, b]: [Value; 2],
        av: &TV,
        bv: &TV,
        acc: Option<Value>,
        layout: Rc<Layout>,
        k: u32,
        inst: &MmaInst,
        precision: Precision,
    ) -> R<TV> {
        let WarpTiling {
            m,
            n,
            warps,
            tile: [tm, tn],
        } = WarpTiling::of(&layout);
        let Some(input) = amd_input(av.dtype) else {
            return self.unsupported(format!("`dot` on {} matrix units", av.dtype.name()));
        };
        let fp8 = matches!(input, MemTy::F8E4M3 | MemTy::F8E5M2);
        let es = input.bytes();
        let name = match inst.kind {
            MmaKind::Mfma => "MFMA",
            _ => "WMMA",
        };
        self.emit(Inst::Comment(format!(
            "dot [{m},{k}] x [{k},{n}] {} on {name} {}x{}x{}, {layout}",
            av.dtype.name(),
            inst.m,
            inst.n,
            inst.k
        )));
        let mut cur = self.mma_accumulators(acc, &layout)?;
        if fp8 {
            cur = self.scale_all(&cur, 0.25);
        }
        // Stage a as [m, k] and b as [n, k], rows padded, unless the
        // enclosing loop staged them once before it.
        let map = OperandMap::of(inst, self.warp_size);
        let stride = row_stride(k, es, map.run * es);
        // b after a in the scratch region, unless a is staged elsewhere.
        let b_off = if self.amd_invariant.contains_key(&(a, false)) {
            0
        } else {
            (m * stride).div_ceil(128) * 128
        };
        let tf32 = precision == Precision::Tf32 && input == MemTy::F32;
        let mut smem = None;
        let mut bufs = Vec::new();
        for (v, tv, trans) in [(a, av, false), (b, bv, true)] {
            if let Some(&(buffer, st)) = self.amd_invariant.get(&(v, trans)) {
                debug_assert_eq!(st, stride);
                let base = self.new_reg(RegTy::U32);
                self.emit(Inst::SmemAddr { dst: base, buffer });
                bufs.push(base);
                continue;
            }
            let smem = *smem.get_or_insert_with(|| {
                self.reserve_scratch(b_off + n * stride);
                self.scratch_addr()
            });
            let off = if trans { b_off } else { 0 };
            self.stage_amd_operand(tv, trans, input, tf32, stride, smem, off);
            let base = self.bin(
                BinOp::Add,
                RegTy::U32,
                Operand::Reg(smem),
                Operand::Int(off as i64),
            );
            bufs.push(self.materialize(RegTy::U32, base).reg().expect("reg"));
        }
        self.emit(Inst::Barrier);
        // This lane's row and first k of its operand runs.
        let tid = Operand::Reg(self.tid);
        let lane = self.bin(
            BinOp::And,
            RegTy::U32,
            tid,
            Operand::Int(self.warp_size as i64 - 1),
        );
        let row = self.bin(
            BinOp::And,
            RegTy::U32,
            lane,
            Operand::Int(map.rows as i64 - 1),
        );
        let half = self.bin(
            BinOp::Shr,
            RegTy::U32,
            lane,
            Operand::Int(map.rows.trailing_zeros() as i64),
        );
        let k0 = self.bin(BinOp::Mul, RegTy::U32, half, Operand::Int(map.run as i64));
        let k0 = self.bin(BinOp::And, RegTy::U32, k0, Operand::Int(map.k as i64 - 1));
        let k0 = self.bin(BinOp::Mul, RegTy::U32, k0, Operand::Int(es as i64));
        let (warp_m, warp_n) = self.warp_coords(warps);
        let mut bases = Vec::new();
        for (wc, t, buf) in [(warp_m, tm, bufs[0]), (warp_n, tn, bufs[1])] {
            let r = self.bin(BinOp::Mul, RegTy::U32, wc, Operand::Int(t as i64));
            let r = self.bin(BinOp::Add, RegTy::U32, r, row);
            let r = self.bin(BinOp::Mul, RegTy::U32, r, Operand::Int(stride as i64));
            let a = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(buf), r);
            let a = self.bin(BinOp::Add, RegTy::U32, a, k0);
            bases.push(self.materialize(RegTy::U32, a).reg().expect("reg"));
        }
        let per_tile = (inst.m * inst.n / self.warp_size) as usize;
        for ks in 0..k / inst.k {
            let mut frags: Vec<Vec<Vec<Reg>>> = Vec::new();
            for (base, tiles, rows) in [
                (bases[0], tm / inst.m, inst.m),
                (bases[1], tn / inst.n, inst.n),
            ] {
                let mut f = Vec::new();
                for t in 0..tiles {
                    let offset = (t * rows * stride + ks * inst.k * es) as i64;
                    f.push(self.read_run(base, offset, map.run * es, input));
                }
                frags.push(f);
            }
            let kind = inst.kind;
            let [im, in_, ik] = [inst.m, inst.n, inst.k];
            cur = self.mma_step(&cur, &frags[0], &frags[1], per_tile, |l, a, b, c, d| {
                l.emit(Inst::Mma {
                    kind,
                    m: im,
                    n: in_,
                    k: ik,
                    input,
                    d: d.to_vec(),
                    a: a.to_vec(),
                    b: b.to_vec(),
                    c,
                });
            });
        }
        if fp8 {
            cur = self.scale_all(&cur, 4.0);
        }
        Ok(self.mma_result(layout, cur))
    }

    /// Stores operand `tv` in LDS at `buf + off`: row-major `[rows, k]`
    /// rows of `stride` bytes, or (`trans`, for b) its transpose.
    #[allow(clippy::too_many_arguments)]
    fn stage_amd_operand(
        &mut self,
        tv: &TV,
        trans: bool,
        input: MemTy,
        tf32: bool,
        stride: u32,
        buf: Reg,
        off: u32,
    ) {
        let es = input.bytes();
        // (row, k) axes of the staged tile.
        let (ra, ka) = if trans { (1, 0) } else { (0, 1) };
        let br = self.base(&tv.layout.terms[ra].clone());
        let bk = self.base(&tv.layout.terms[ka].clone());
        let lin = self.bin(BinOp::Mul, RegTy::I32, br, Operand::Int(stride as i64));
        let kb = self.bin(BinOp::Mul, RegTy::I32, bk, Operand::Int(es as i64));
        let lin = self.bin(BinOp::Add, RegTy::I32, lin, kb);
        let addr = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(buf), lin);
        let addr = self.materialize(RegTy::U32, addr).reg().expect("reg");
        // Runs of a thread's elements along k are stored as vectors (of up to
        // 8 bytes; fp8 codes one at a time).
        let vec = if tv.layout.vector_axis() == Some(ka) && es > 1 {
            pow2_run(&tv.layout).min(8 / es)
        } else {
            1
        };
        for group in Self::vector_groups(&tv.layout, vec) {
            let s = tv.layout.slots[group[0]].clone();
            let mut srcs = Vec::new();
            let mut mem = MemTy::U8;
            for &slot in &group {
                let (src, m) = self.amd_operand_bits(tv.ops[slot], input, tf32);
                srcs.push(src);
                mem = m;
            }
            self.emit(Inst::St {
                stream: false,
                space: Space::Shared,
                mem,
                src: srcs,
                addr,
                offset: off as i64 + s[ra] as i64 * stride as i64 + (s[ka] * es) as i64,
                pred: None,
            });
        }
    }

    /// Stages, once before a `for` loop, the operands of the loop's AMD
    /// matrix-core dots that are defined before it (attention's `q`), in
    /// LDS buffers that live through the loop; the dots then read them
    /// there. Returns what it staged, for the caller to forget after the
    /// loop.
    pub(in crate::ir::target::lower) fn stage_invariant_amd_operands(
        &mut self,
        body: &tile::Region,
    ) -> R<Vec<(Value, bool)>> {
        let mut staged = Vec::new();
        if !self.hoist_amd {
            return Ok(staged);
        }
        for op in &body.ops {
            let OpKind::Dot {
                a, b, precision, ..
            } = &op.kind
            else {
                continue;
            };
            let (ta, tb) = (self.tk.ty(*a), self.tk.ty(*b));
            let (m, k, n) = (ta.shape()[0], ta.shape()[1], tb.shape()[1]);
            let Some((inst, _)) = self.mma_plan(ta.dtype(), tb.dtype(), [m, n, k], *precision)
            else {
                continue;
            };
            let Some(input) = amd_input(ta.dtype()) else {
                continue;
            };
            if inst.feed != MmaFeed::Registers {
                continue;
            }
            let es = input.bytes();
            let stride = row_stride(k, es, OperandMap::of(inst, self.warp_size).run * es);
            let tf32 = *precision == Precision::Tf32 && input == MemTy::F32;
            for (v, trans, rows) in [(*a, false, m), (*b, true, n)] {
                if body.args.contains(&v)
                    || !self.vals.contains_key(&v)
                    || self.amd_invariant.contains_key(&(v, trans))
                {
                    continue;
                }
                if staged.is_empty() {
                    self.emit(Inst::Comment(
                        "loop-invariant dot operands staged once".to_string(),
                    ));
                }
                let buffer = self.buffers.len();
                self.buffers.push(SmemBuffer {
                    name: format!("invariant{buffer}"),
                    offset: 0,
                    bytes: rows * stride,
                    align: 16,
                    purpose: format!(
                        "a loop-invariant `dot` operand ([{rows}, {k}] {}, rows of {stride} bytes)",
                        input.name()
                    ),
                    swizzle: None,
                });
                self.pipeline.persistent.push(buffer);
                let base = self.new_reg(RegTy::U32);
                self.emit(Inst::SmemAddr { dst: base, buffer });
                let tv = self.val(v);
                self.stage_amd_operand(&tv, trans, input, tf32, stride, base, 0);
                self.amd_invariant.insert((v, trans), (buffer, stride));
                self.hoisted_amd = true;
                staged.push((v, trans));
            }
        }
        if !staged.is_empty() {
            self.emit(Inst::Barrier);
        }
        Ok(staged)
    }

    /// Fresh f32 registers holding `regs` times `by` (a power of two: exact).
    fn scale_all(&mut self, regs: &[Reg], by: f64) -> Vec<Reg> {
        regs.iter()
            .map(|&r| {
                let x = self.bin(BinOp::Mul, RegTy::F32, Operand::Reg(r), Operand::Float(by));
                self.materialize(RegTy::F32, x).reg().expect("reg")
            })
            .collect()
    }

    /// A lane's run of `bytes` operand bytes at `base + offset` in LDS: one
    /// f32 register for an f32 input, else packed `B32` registers read 16
    /// bytes at a time.
    fn read_run(&mut self, base: Reg, offset: i64, bytes: u32, input: MemTy) -> Vec<Reg> {
        if input == MemTy::F32 {
            let dst = self.new_reg(RegTy::F32);
            self.emit(Inst::Ld {
                stream: false,
                space: Space::Shared,
                mem: MemTy::F32,
                dst: vec![dst],
                addr: base,
                offset,
                pred: None,
            });
            return vec![dst];
        }
        let words = bytes / 4;
        let mut regs = Vec::new();
        for w0 in (0..words).step_by(4) {
            let dst: Vec<Reg> = (w0..words.min(w0 + 4))
                .map(|_| self.new_reg(RegTy::B32))
                .collect();
            self.emit(Inst::Ld {
                stream: false,
                space: Space::Shared,
                mem: MemTy::U32,
                dst: dst.clone(),
                addr: base,
                offset: offset + 4 * w0 as i64,
                pred: None,
            });
            regs.extend(dst);
        }
        regs
    }

    /// An operand value (held in f32) as the bits the instruction reads, and
    /// the memory type that stores them: f16 and bf16 halves, f32 (rounded to
    /// tf32 for a tf32 dot, as on every target), fp8 codes made FNUZ (see
    /// the module comment).
    fn amd_operand_bits(&mut self, o: Operand, input: MemTy, tf32: bool) -> (Operand, MemTy) {
        match input {
            MemTy::F16 => {
                let x = self.materialize(RegTy::F32, o);
                (self.cvt(RegTy::B16, x, None), MemTy::F16)
            }
            MemTy::BF16 => {
                // A bf16 value held in f32: its high half.
                let x = self.materialize(RegTy::F32, o);
                let u = self.new_reg(RegTy::U32);
                self.emit(Inst::Mov { dst: u, src: x });
                let h = self.bin(BinOp::Shr, RegTy::U32, Operand::Reg(u), Operand::Int(16));
                (h, MemTy::U16)
            }
            MemTy::F32 if tf32 => (self.round_tf32(o), MemTy::F32),
            MemTy::F32 => (o, MemTy::F32),
            _ => {
                let code = self.encode_f8(o, input);
                // NaN (E4M3: S.1111.111) or, for E5M2, any all-ones exponent.
                let special = if input == MemTy::F8E4M3 { 0x7f } else { 0x7c };
                let e = self.bin(BinOp::And, RegTy::U32, code, Operand::Int(special));
                let nan = self.cmp(CmpOp::Eq, RegTy::U32, e, Operand::Int(special));
                let negz = self.cmp(CmpOp::Eq, RegTy::U32, code, Operand::Int(0x80));
                let c = self.select(RegTy::U32, negz, Operand::Int(0), code);
                (
                    self.select(RegTy::U32, nan, Operand::Int(0x80), c),
                    MemTy::U8,
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::OperandMap;
    use crate::ir::target::layout::{
        Layout,
        WarpOrder::{RowsFirst, Square},
    };
    use crate::target::{Arch, MmaInst, MmaKind};

    /// Where AMD's documentation puts each element of one instruction's
    /// operands and accumulators, written out independently of the lowering:
    /// `(lane, value index)` of `A[i][k]`, of `B[k][j]`, and `(lane,
    /// register)` of `D[i][j]`. CDNA3 ISA guide (MFMA, one block, wave64):
    /// 32x32: `A[i][k]` in lane `i + 32 (k / (K/2))`, value `k % (K/2)`; B
    /// likewise with `j`; `D[i][j]` in lane `j + 32 ((i / 4) % 2)`, register
    /// `4 (i / 8) + i % 4`. 16x16: `A[i][k]` in lane `i + 16 (k / (K/4))`,
    /// value `k % (K/4)`; `D[i][j]` in lane `j + 16 (i / 4)`, register
    /// `i % 4`. RDNA3 ISA guide (WMMA, wave32): `A[i][k]` in lanes
    /// `i` and `i + 16`, value `k`; B likewise with `j`; `D[i][j]` in lane
    /// `j + 16 (i % 2)`, register `i / 2`.
    struct Documented {
        inst: MmaInst,
    }

    impl Documented {
        fn a(&self, i: u32, k: u32) -> Vec<(u32, u32)> {
            let kk = self.inst.k;
            match (self.inst.kind, self.inst.m) {
                (MmaKind::Mfma, 32) => vec![(i + 32 * (k / (kk / 2)), k % (kk / 2))],
                (MmaKind::Mfma, _) => vec![(i + 16 * (k / (kk / 4)), k % (kk / 4))],
                _ => vec![(i, k), (i + 16, k)],
            }
        }

        fn d(&self, i: u32, j: u32) -> (u32, u32) {
            match (self.inst.kind, self.inst.m) {
                (MmaKind::Mfma, 32) => (j + 32 * ((i / 4) % 2), 4 * (i / 8) + i % 4),
                (MmaKind::Mfma, _) => (j + 16 * (i / 4), i % 4),
                _ => (j + 16 * (i % 2), i / 2),
            }
        }

        /// The instruction as the hardware runs it on per-lane registers
        /// (`a[lane][v]`, `b[lane][v]`, `c[lane][r]`): gathers A, B and C
        /// by the documented maps (every copy of a replicated element must
        /// agree), multiplies, and scatters D back.
        fn run(&self, a: &[Vec<f64>], b: &[Vec<f64>], c: &[Vec<f64>]) -> Vec<Vec<f64>> {
            let (m, n, k) = (self.inst.m, self.inst.n, self.inst.k);
            let gather = |regs: &[Vec<f64>], x: u32, kk: u32| {
                let places = self.a(x, kk);
                let v = regs[places[0].0 as usize][places[0].1 as usize];
                for &(l, i) in &places[1..] {
                    assert_eq!(regs[l as usize][i as usize], v, "replicas disagree");
                }
                v
            };
            let mut d = c.to_vec();
            for i in 0..m {
                for j in 0..n {
                    let (l, r) = self.d(i, j);
                    let mut s = c[l as usize][r as usize];
                    for kk in 0..k {
                        s += gather(a, i, kk) * gather(b, j, kk);
                    }
                    d[l as usize][r as usize] = s;
                }
            }
            d
        }
    }

    /// A small integer-valued pseudo-random matrix (exact in every dtype).
    fn matrix(rows: u32, cols: u32, seed: u32) -> Vec<Vec<f64>> {
        (0..rows)
            .map(|r| {
                (0..cols)
                    .map(|c| ((r * 7 + c * 13 + seed * 5) % 9) as f64 - 4.0)
                    .collect()
            })
            .collect()
    }

    /// The `(row, col)` a layout puts in slot `s` of thread `t`.
    fn coord(l: &Layout, t: u32, s: usize) -> (u32, u32) {
        let at = |d: usize| -> u32 {
            l.terms[d]
                .iter()
                .map(|tm| ((t >> tm.shift) & ((1 << tm.bits) - 1)) * tm.mul)
                .sum::<u32>()
                + l.slots[s][d]
        };
        (at(0), at(1))
    }

    /// Every AMD matrix instruction the lowering emits, fed as the lowering
    /// feeds it ([`OperandMap`] for A and for B's transpose, the accumulator
    /// layout for C) and run as AMD documents it, computes `A B + C`.
    #[test]
    fn lane_maps_multiply_as_documented() {
        let mut seen = 0;
        for arch in [Arch::Gfx90a, Arch::Gfx942, Arch::Gfx1100] {
            let wave = arch.info().warp_size;
            for inst in arch.features().mma {
                let map = OperandMap::of(inst, wave);
                let acc = match inst.kind {
                    MmaKind::Mfma => {
                        Layout::mfma_accumulator([inst.m, inst.n], inst.m, inst.n, 1, RowsFirst)
                    }
                    _ => Layout::wmma_accumulator(inst.m, inst.n, 1, RowsFirst),
                }
                .unwrap();
                assert_eq!(acc.num_slots() as u32, inst.m * inst.n / wave);
                let (am, bm, cm) = (
                    matrix(inst.m, inst.k, 1),
                    matrix(inst.k, inst.n, 2),
                    matrix(inst.m, inst.n, 3),
                );
                let lanes = 0..wave;
                // Every lane's `n` registers, register `i` of lane `l` holding `at(l, i)`.
                let regs = |n: usize, at: &dyn Fn(u32, usize) -> f64| -> Vec<Vec<f64>> {
                    lanes
                        .clone()
                        .map(|l| (0..n).map(|i| at(l, i)).collect())
                        .collect()
                };
                let run = map.run as usize;
                let a = regs(run, &|l, v| {
                    let (r, k) = map.elem(l, v as u32);
                    am[r as usize][k as usize]
                });
                let b = regs(run, &|l, v| {
                    let (c, k) = map.elem(l, v as u32);
                    bm[k as usize][c as usize]
                });
                let c = regs(acc.num_slots(), &|l, s| {
                    let (r, c) = coord(&acc, l, s);
                    cm[r as usize][c as usize]
                });
                let d = Documented { inst: *inst }.run(&a, &b, &c);
                for (l, got) in lanes.zip(&d) {
                    for (s, &got) in got.iter().enumerate() {
                        let (r, col) = coord(&acc, l, s);
                        let want: f64 = cm[r as usize][col as usize]
                            + (0..inst.k)
                                .map(|k| am[r as usize][k as usize] * bm[k as usize][col as usize])
                                .sum::<f64>();
                        assert_eq!(
                            got, want,
                            "{arch} {:?} {}x{}x{} {:?}: lane {l} slot {s}",
                            inst.kind, inst.m, inst.n, inst.k, inst.elem
                        );
                    }
                }
                seen += 1;
            }
        }
        assert_eq!(seen, 6 + 10 + 2);
    }

    /// The accumulator layouts over several waves hold every element of the
    /// result exactly once.
    #[test]
    fn amd_accumulators_cover_the_result_once() {
        // (rows, cols, waves, the instruction: 32 or 16 for MFMA, 0 for WMMA)
        for (rows, cols, waves, instr) in [
            (32u32, 32u32, 1u32, 32u32),
            (128, 128, 8, 32),
            (64, 128, 4, 32),
            (128, 32, 4, 32),
            (16, 16, 1, 16),
            (64, 64, 4, 16),
            (16, 128, 8, 16),
            (16, 16, 1, 0),
            (128, 128, 8, 0),
            (64, 64, 4, 0),
            (16, 128, 8, 0),
        ] {
            for order in [RowsFirst, Square] {
                let (l, wave) = if instr == 0 {
                    (
                        Layout::wmma_accumulator(rows, cols, waves, order).unwrap(),
                        32,
                    )
                } else {
                    let l = Layout::mfma_accumulator([instr, instr], rows, cols, waves, order);
                    (l.unwrap(), 64)
                };
                let mut count = vec![0u32; (rows * cols) as usize];
                for t in 0..waves * wave {
                    for s in 0..l.num_slots() {
                        let (r, c) = coord(&l, t, s);
                        assert!(r < rows && c < cols, "{rows}x{cols}/{waves}");
                        count[(r * cols + c) as usize] += 1;
                    }
                }
                assert!(
                    count.iter().all(|&c| c == 1),
                    "{rows}x{cols}/{waves} instr {instr} {order:?}"
                );
            }
        }
        // Shapes the instructions do not tile.
        assert!(Layout::mfma_accumulator([32, 32], 16, 32, 1, RowsFirst).is_none());
        assert!(Layout::mfma_accumulator([32, 32], 32, 32, 4, RowsFirst).is_none());
        assert!(Layout::mfma_accumulator([16, 16], 16, 16, 2, Square).is_none());
        assert!(Layout::wmma_accumulator(16, 8, 1, RowsFirst).is_none());
    }

    /// The verifier takes an MFMA or WMMA only where the arch has it, with
    /// the fragment counts and register types of its kind.
    #[test]
    fn verifier_checks_amd_matrix_instructions() {
        use crate::ir::target::verify::verify;
        use crate::ir::target::{Inst, Kernel, MemTy, Operand, Reg, RegTy};
        // `na` a registers and `nb` b registers of `t`, `nc` f32 accumulators.
        let check =
            |arch: Arch, kind: MmaKind, mnk: [u32; 3], input: MemTy, t: RegTy, na: u32, nc: u32| {
                let mut regs = Vec::new();
                let mut body = Vec::new();
                let mut fresh = |ty: RegTy, body: &mut Vec<Inst>, def: bool| {
                    regs.push(ty);
                    let r = Reg(regs.len() as u32 - 1);
                    if def {
                        let src = if ty == RegTy::F32 {
                            Operand::Float(0.0)
                        } else {
                            Operand::Int(0)
                        };
                        body.push(Inst::Mov { dst: r, src });
                    }
                    r
                };
                let a: Vec<Reg> = (0..na).map(|_| fresh(t, &mut body, true)).collect();
                let b: Vec<Reg> = (0..na).map(|_| fresh(t, &mut body, true)).collect();
                let c: Vec<Reg> = (0..nc)
                    .map(|_| fresh(RegTy::F32, &mut body, true))
                    .collect();
                let d: Vec<Reg> = (0..nc)
                    .map(|_| fresh(RegTy::F32, &mut body, false))
                    .collect();
                body.push(Inst::Mma {
                    kind,
                    m: mnk[0],
                    n: mnk[1],
                    k: mnk[2],
                    input,
                    d,
                    a,
                    b,
                    c,
                });
                verify(&Kernel {
                    name: "k".into(),
                    arch,
                    num_threads: 64,
                    params: vec![],
                    smem: vec![],
                    regs,
                    body,
                    layouts: vec![],
                    notes: vec![],
                    tensor_maps: vec![],
                })
            };
        use MmaKind::*;
        let (b32, f32) = (RegTy::B32, RegTy::F32);
        // What the lowering emits.
        check(Arch::Gfx942, Mfma, [32, 32, 8], MemTy::F16, b32, 2, 16).unwrap();
        check(Arch::Gfx90a, Mfma, [32, 32, 8], MemTy::BF16, b32, 2, 16).unwrap();
        check(Arch::Gfx90a, Mfma, [32, 32, 2], MemTy::F32, f32, 1, 16).unwrap();
        check(Arch::Gfx942, Mfma, [32, 32, 16], MemTy::F8E4M3, b32, 2, 16).unwrap();
        check(Arch::Gfx1100, Wmma, [16, 16, 16], MemTy::F16, b32, 8, 8).unwrap();
        // An instruction the arch lacks.
        for (arch, kind, mnk, input, t, na, nc) in [
            (Arch::Gfx90a, Mfma, [32, 32, 16], MemTy::F8E4M3, b32, 2, 16),
            (Arch::Sm80, Mfma, [32, 32, 8], MemTy::F16, b32, 2, 16),
            (Arch::Gfx942, Wmma, [16, 16, 16], MemTy::F16, b32, 8, 8),
            (Arch::Gfx1100, MmaSync, [16, 8, 16], MemTy::F16, b32, 4, 4),
        ] {
            let e = check(arch, kind, mnk, input, t, na, nc).unwrap_err();
            assert!(e.contains(&format!("{arch} has no {kind:?}")), "{e}");
        }
        // Wrong fragment counts or register types.
        for (arch, kind, mnk, input, t, na, nc) in [
            (Arch::Gfx942, Mfma, [32, 32, 8], MemTy::F16, b32, 4, 16),
            (Arch::Gfx942, Mfma, [32, 32, 8], MemTy::F16, b32, 2, 8),
            (Arch::Gfx942, Mfma, [32, 32, 2], MemTy::F32, b32, 1, 16),
            (Arch::Gfx1100, Wmma, [16, 16, 16], MemTy::BF16, b32, 4, 8),
        ] {
            let e = check(arch, kind, mnk, input, t, na, nc).unwrap_err();
            assert!(e.contains("mma fragment counts or types"), "{e}");
        }
    }

    /// The Target IR of a gemm tile loop on each AMD matrix unit: f16 on
    /// CDNA3's MFMA 32x32x8 (2x2 waves), bf16 on RDNA3's WMMA (4x1 wave32s).
    #[test]
    fn gemm_tile_loops() {
        use crate::check::DType;
        use crate::ir::target::tests::gemm;
        use crate::ir::target::{lower, verify::verify};
        for (arch, dtype) in [(Arch::Gfx942, DType::F16), (Arch::Gfx1100, DType::BF16)] {
            let k = lower(&gemm(64, 64, 32, 4, dtype), arch).unwrap();
            verify(&k).unwrap();
            insta::assert_snapshot!(format!("{}_{arch}", k.name), k.to_string());
        }
    }

    /// An fp8 gemm on CDNA3: each k step of 16 is one MFMA 32x32x16 per
    /// wave tile, its accumulators quartered before the instructions and
    /// multiplied by 4 after (the operands are staged as FNUZ codes of half
    /// their values); on CDNA2 (no fp8 MFMA) and RDNA3 the dot runs on FMAs.
    #[test]
    fn fp8_gemm_on_cdna3_rescales_its_accumulators() {
        use crate::check::DType;
        use crate::ir::target::tests::gemm;
        use crate::ir::target::{lower, verify::verify};
        for dtype in [DType::F8E4M3, DType::F8E5M2] {
            let k = lower(&gemm(32, 32, 32, 1, dtype), Arch::Gfx942).unwrap();
            verify(&k).unwrap();
            let text = k.to_string();
            let op = format!("= mfma.32x32x16.{} ", dtype.name());
            assert_eq!(text.matches(&op).count(), 2, "{text}");
            // 16 accumulators in, 16 out.
            let scaled = |by: &str| {
                text.lines()
                    .filter(|l| l.contains(":f32 = mul f") && l.ends_with(by))
                    .count()
            };
            assert_eq!((scaled(", 0.25"), scaled(", 4.0")), (16, 16), "{text}");
            for arch in [Arch::Gfx90a, Arch::Gfx1100] {
                let k = lower(&gemm(32, 32, 32, 1, dtype), arch).unwrap();
                let text = k.to_string();
                assert!(
                    text.contains("with FMAs") && !text.contains("mfma."),
                    "{text}"
                );
            }
        }
    }

    /// The staged rows make each pass of the lanes' LDS loads conflict-free:
    /// the lanes of a pass (32 banks / words per load) read consecutive rows
    /// at one k offset, and their bank ranges are disjoint.
    #[test]
    fn staged_operand_reads_are_bank_conflict_free() {
        use super::row_stride;
        for (k, es, run_bytes) in [
            (32u32, 2u32, 8u32),
            (64, 2, 8),
            (16, 2, 8),
            (32, 4, 4),
            (8, 4, 4),
            (64, 1, 8),
            (32, 2, 32),
            (64, 2, 32),
            (16, 2, 32),
        ] {
            let stride = row_stride(k, es, run_bytes);
            assert!(stride >= k * es, "{k} {es} {run_bytes}");
            let w = (run_bytes / 4).clamp(1, 4);
            assert_eq!(stride % (4 * w), 0, "aligned rows");
            let lanes = 32 / w;
            let mut banks = [false; 32];
            for r in 0..lanes {
                for j in 0..w {
                    let b = ((r * stride / 4 + j) % 32) as usize;
                    assert!(!banks[b], "{k} {es} {run_bytes}: bank {b} twice");
                    banks[b] = true;
                }
            }
        }
    }

    /// Flash attention's `q`, loaded before the key loop, is staged in LDS
    /// once before the loop (a buffer that lives through it); inside the
    /// loop only the keys and values are staged, each iteration. Where that
    /// buffer would overflow the LDS, q is staged at each dot.
    #[test]
    fn loop_invariant_operands_are_staged_once() {
        use crate::db::{file_kernels, tile_ir, Database};
        use crate::ir::target::{lower, verify::verify, Inst, Space};
        use crate::ir::tile::Specialization;
        let src = include_str!("../../../tile/testdata/brief.tsr");
        for arch in [Arch::Gfx942, Arch::Gfx1100] {
            let mut db = Database::new();
            db.set_arch(arch);
            let file = db.set_source("/t/brief.tsr", src.to_string());
            let (_, item, _) = file_kernels(&db, file)
                .into_iter()
                .find(|k| k.0 == "flash_attn")
                .unwrap();
            let spec = Specialization::new().with("D", 64);
            let tk = tile_ir(&db, item, db.options(), spec).clone().unwrap();
            let k = lower(&tk, arch).unwrap();
            verify(&k).unwrap();
            let q = k
                .smem
                .iter()
                .position(|b| b.name.starts_with("invariant"))
                .unwrap();
            // q is [128, 64] bf16, in padded rows.
            let bf = crate::target::Elem::Bf16;
            let ieee = crate::target::Precision::Ieee;
            let inst = crate::target::select_mma(&arch.features(), bf, bf, Some(64), ieee).unwrap();
            let run = OperandMap::of(inst, arch.info().warp_size).run;
            let want = 128 * super::row_stride(64, 2, run * 2);
            assert_eq!(k.smem[q].bytes, want, "{arch}");
            // Shared stores before the loop (q) and in it (k and v, and the
            // probabilities p), and the loop's reads of q's buffer.
            let (mut before, mut inside, mut q_reads) = (0, 0, 0);
            for i in &k.body {
                match i {
                    Inst::St {
                        space: Space::Shared,
                        ..
                    } => before += 1,
                    Inst::For { body, .. } => {
                        for j in body {
                            match j {
                                Inst::St {
                                    space: Space::Shared,
                                    ..
                                } => inside += 1,
                                Inst::SmemAddr { buffer, .. } if *buffer == q => q_reads += 1,
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
            assert!(before > 0 && inside > 0, "{arch}: {before} {inside}");
            assert_eq!(q_reads, 1, "{arch}");
            // With D = 128 the staged q would take the block's LDS past its
            // limit: it is staged at each dot instead, and the kernel fits.
            let spec = Specialization::new().with("D", 128);
            let tk = tile_ir(&db, item, db.options(), spec).clone().unwrap();
            let k = lower(&tk, arch).unwrap();
            assert!(
                k.smem.iter().all(|b| !b.name.starts_with("invariant")),
                "{k}"
            );
            assert!(k.smem_bytes() <= arch.info().max_smem_per_block, "{arch}");
        }
    }
}
