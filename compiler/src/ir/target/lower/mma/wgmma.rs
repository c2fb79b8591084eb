//! f16/bf16, f8 (e4m3, e5m2) and tf32 `dot` on sm_90a's warpgroup MMA
//! (`wgmma.mma_async`), operands read by the tensor cores straight from the
//! pipeline's shared-memory stages.
//!
//! Taken by a pipelined loop's only dot whose operands are both pipelined
//! loads (`Lower::wgmma_operands` decides, before the loop's code): `a`
//! `[m, k]` row-major (k-major, rows of 64 or 128 bytes, swizzled as wgmma's
//! 64- or 128-byte modes), `b` either `[k, n]` row-major (n-major, stored in
//! 128-byte panels: `Swizzle::panels`) or the transpose of an `[n, k]`
//! row-major load (k-major, stored as `a` is). Each warpgroup (4 warps)
//! computes 64 rows per 16-row tile a warp holds (`wgmma_tiles`, up to 4):
//! one `m64nNk16` (16-bit), `m64nNk32` (8-bit) or `m64nNk8` (tf32) a tile
//! and k step of 32 bytes, both operands described by 64-bit matrix
//! descriptors. Where a
//! warp holds more than one tile, the accumulator layout interleaves them
//! (`Layout::wgmma_accumulator`: warp `w`'s tile `j` at rows `64 j + 16 w`
//! of its warpgroup's block), so the warpgroup's `j`-th instruction reads
//! rows `64 j ..` of `a`'s stage as it was copied, in one TMA box.
//! wgmma transposes only 16-bit operands, so an 8-bit `b` must be k-major
//! (the layout `torch._scaled_mm` asks for too). A tf32 stage is rounded to
//! tf32 in shared memory before its group (`round_stage_to_tf32`); an
//! n-major tf32 `b`'s stage is rounded into a transposed, k-major copy in
//! the stage's second half instead (`transpose_stage_to_tf32`). The
//! accumulator layout is
//! `mma.m16n8`'s with the warps along the rows (`WarpOrder::RowsFirst`, the
//! tiles interleaved as above where a warp holds several), and the
//! loop-carried accumulator registers are
//! updated in place (8-bit dots: through registers of their own, see
//! `dot_wgmma`).
//!
//! Synchronisation: the loop's wait for its stage is followed by a proxy
//! fence (the copies' writes become visible to the tensor cores' reads) and
//! the loop's barrier; the dot fences its accumulator registers, issues its k
//! steps as one group and waits for it, so every warpgroup has finished
//! reading the stage before the next iteration's barrier, after which the
//! copies ahead may rewrite it.

use std::rc::Rc;

use crate::check::DType;
use crate::ir::target::layout::{Layout, WarpOrder};
use crate::ir::target::lower::pipeline::WaitedWgmma;
use crate::ir::target::lower::{Lower, R, TV};
use crate::ir::target::{BinOp, CmpOp, Inst, MemTy, Operand, Reg, RegTy, Space, Swizzle, WgmmaA};
use crate::ir::tile::{Precision, Value};

/// A dot the loop plan put on `wgmma` (its two operands), until it is lowered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(in crate::ir::target::lower) struct WgmmaDot {
    pub a: Value,
    pub b: Value,
}

/// An f8 wgmma dot's group in flight in its loop (see `dot_wgmma`): the
/// accumulator's registers and those the group sums into, added at the end
/// of the iteration.
#[derive(Clone, Debug)]
pub(in crate::ir::target::lower) struct Promotion {
    pub acc: Vec<Reg>,
    pub sums: Vec<Reg>,
}

/// The descriptors a dot has built, by base and constant bits:
/// `(base, bits, offset, descriptor)` (`Lower::descriptor_in`).
#[derive(Default)]
struct Descriptors(Vec<(Operand, i64, u32, Reg)>);

/// wgmma's swizzle modes (the descriptor's bits 62-63) by row bytes.
fn swizzle_mode(row_bytes: u32) -> Option<u64> {
    match row_bytes {
        128 => Some(1),
        64 => Some(2),
        32 => Some(3),
        _ => None,
    }
}

/// The shared-memory element type of wgmma's operands of `dtype` at
/// `precision`, where it takes them: 16-bit floats and both f8 formats
/// (ieee: f32 products), and f32 rounded to tf32 (`MemTy::F32`).
pub(in crate::ir::target::lower) fn wgmma_input(
    dtype: DType,
    precision: Precision,
) -> Option<MemTy> {
    match (dtype, precision) {
        (DType::BF16, Precision::Ieee) => Some(MemTy::BF16),
        (DType::F16, Precision::Ieee) => Some(MemTy::F16),
        (DType::F8E4M3, Precision::Ieee) => Some(MemTy::F8E4M3),
        (DType::F8E5M2, Precision::Ieee) => Some(MemTy::F8E5M2),
        (DType::F32, Precision::Tf32) => Some(MemTy::F32),
        _ => None,
    }
}

/// The constant bits of a matrix descriptor: leading and stride byte offsets
/// (bits 16-29 and 32-45, in 16-byte units) and the swizzle mode (bits
/// 62-63); the start address (bits 0-13) is added per use.
fn descriptor_bits(lbo: u32, sbo: u32, mode: u64) -> i64 {
    let bits =
        (u64::from(lbo >> 4) & 0x3fff) << 16 | (u64::from(sbo >> 4) & 0x3fff) << 32 | mode << 62;
    bits as i64
}

impl<'a> Lower<'a> {
    /// The accumulator layout of a wgmma dot of a `[m, n]` result: each warp
    /// `wgmma_tiles` 16-row tiles of `mma.m16n8` accumulators over all `n`
    /// columns (one: `mma_accumulator`'s; more: interleaved,
    /// `Layout::wgmma_accumulator`).
    pub(in crate::ir::target::lower) fn wgmma_layout(&self, m: u32, n: u32) -> Option<Rc<Layout>> {
        match self.wgmma_tiles(m) {
            Some(t) if t > 1 => Layout::wgmma_accumulator(m, n, self.num_warps).map(Rc::new),
            _ => Layout::mma_accumulator(m, n, self.num_warps, WarpOrder::RowsFirst).map(Rc::new),
        }
    }

    /// The 16-row tiles each warp holds of a wgmma GEMM's `m` rows (each
    /// warpgroup issues that many m64 instructions a k step), where the
    /// rows split so: 1 to 4.
    pub(in crate::ir::target::lower) fn wgmma_tiles(&self, m: u32) -> Option<u32> {
        let per = 16 * self.num_warps;
        (self.num_warps.is_multiple_of(4) && m.is_multiple_of(per) && (1..=4).contains(&(m / per)))
            .then_some(m / per)
    }

    /// Whether the loop plan's dot `(a, b)` of `[m, k] x [k, n]` fits wgmma:
    /// operands it takes ([`wgmma_input`]), a warpgroup (4 warps) for each
    /// 64, 128, 192 or 256 rows ([`Self::wgmma_tiles`]), `n` a multiple of
    /// 64 up to 256, rows of `k` 64 or 128 bytes. (Whether `b` must be
    /// k-major is the caller's to check.)
    pub(in crate::ir::target::lower) fn wgmma_fits(
        &self,
        dtype: DType,
        precision: Precision,
        [m, n, k]: [u32; 3],
    ) -> bool {
        self.feat.wgmma
            && wgmma_input(dtype, precision).is_some()
            && self.wgmma_tiles(m).is_some()
            && n.is_multiple_of(64)
            && n <= 256
            && matches!(u64::from(k) * dtype.bytes(), 64 | 128)
    }

    /// The swizzle a pipelined wgmma operand of `rows` rows of `row_bytes`
    /// is stored with: k-major rows (`a`, or a transposed `b`), or 128-byte
    /// panels for an n-major `b` (`[k, n]`).
    pub(in crate::ir::target::lower) fn wgmma_swizzle(
        n_major: bool,
        rows: u32,
        row_bytes: u32,
    ) -> Swizzle {
        match n_major {
            true => Swizzle::panels(row_bytes, rows),
            false => Swizzle::for_rows(row_bytes),
        }
    }

    /// `dot(a, b, acc)` on wgmma (see the module doc).
    pub(in crate::ir::target::lower) fn dot_wgmma(
        &mut self,
        a: Value,
        b: Value,
        acc: Option<Value>,
        [m, n, k]: [u32; 3],
        dtype: DType,
    ) -> R<TV> {
        let Some(layout) = self.wgmma_layout(m, n) else {
            return self.unsupported("a wgmma dot whose rows do not tile the warps");
        };
        self.emit(Inst::Comment(format!(
            "dot [{m},{k}] x [{k},{n}] {} on wgmma, {layout}",
            dtype.name()
        )));
        // The accumulators, updated in place: the loop-carried registers
        // where `acc` is them in this layout, else fresh ones.
        let in_place = acc.is_some_and(|v| *self.val(v).layout == *layout);
        let init = self.acc_operands(acc, &layout)?;
        let mut regs: Vec<Reg> = Vec::with_capacity(init.len());
        let mut moved = false;
        for o in init {
            match o {
                Operand::Reg(r) if self.regs[r.0 as usize] == RegTy::F32 && !regs.contains(&r) => {
                    regs.push(r)
                }
                o => {
                    let r = self.new_reg(RegTy::F32);
                    self.emit(Inst::Mov { dst: r, src: o });
                    regs.push(r);
                    moved = true;
                }
            }
        }
        // In flight past the dot only where the result is the carried
        // registers themselves: the loop's end then moves nothing out of them
        // (otherwise it would read them before the group completes).
        let in_flight = in_place && !moved;
        let (a_base, a_sw) = self.current_stage(a);
        let (mut b_base, mut b_sw) = self.current_stage(b);
        let mut b_kmajor = self.pipeline.pipelined[&b].1;
        // An f32 operand reaches wgmma only as a tf32 dot's (`wgmma_operands`).
        let precision = match dtype {
            DType::F32 => Precision::Tf32,
            _ => Precision::Ieee,
        };
        let Some(input) = wgmma_input(dtype, precision) else {
            return self.unsupported(format!("a wgmma dot of {}", dtype.name()));
        };
        if input == MemTy::F32 {
            self.round_stage_to_tf32(a_base, m * k * 4);
            if b_kmajor {
                self.round_stage_to_tf32(b_base, k * n * 4);
            } else {
                // The stage's second half takes the rounded transpose, read
                // k-major (see `Lower::tf32_transposed`).
                let t = self.bin(
                    BinOp::Add,
                    RegTy::U32,
                    Operand::Reg(b_base),
                    Operand::Int(i64::from(k * n * 4)),
                );
                let t = self.materialize(RegTy::U32, t).reg().expect("reg");
                let t_sw = Swizzle::for_rows(k * 4);
                self.transpose_stage_to_tf32(b_base, b_sw, t, t_sw, [k, n]);
                (b_base, b_sw, b_kmajor) = (t, t_sw, true);
            }
            self.emit(Inst::FenceProxyAsync);
            self.emit(Inst::Barrier);
        }
        let b_mode = match b_kmajor {
            true => swizzle_mode(b_sw.row_bytes),
            false => Some(1),
        };
        let (Some(a_mode), Some(b_mode)) = (swizzle_mode(a_sw.row_bytes), b_mode) else {
            return self.unsupported("a wgmma operand of unsupported row length");
        };
        // This warpgroup's `64 tiles` rows of `a`: instruction `j` reads rows
        // `64 j ..` of the block, each warp's `j`-th tile (the layout's).
        let tiles = self.wgmma_tiles(m).unwrap_or(1);
        let a_wg = self.warpgroup_block(a_base, 64 * tiles * a_sw.row_bytes);
        // k-major: 8-row groups at 8 rows' bytes, the leading offset unused.
        let a_bits = descriptor_bits(16, 8 * a_sw.row_bytes, a_mode);
        // b: k-major as `a` (all `n` rows), or n-major panels of 64 columns
        // `k * 128` bytes apart, 8-row groups 1024 bytes apart.
        let b_bits = match b_kmajor {
            true => descriptor_bits(16, 8 * b_sw.row_bytes, b_mode),
            false => descriptor_bits(b_sw.panel_rows * 128, 1024, b_mode),
        };
        // 8-bit products are summed by the tensor cores at about 14 bits,
        // aligned to the largest addend, the accumulator included: over a
        // long K the f32 accumulator would lose its low bits at every step.
        // So a dot's k steps (at most 4, 128 of K) go into registers of
        // their own, added to the accumulator on the FMA units (CUTLASS's
        // and cuBLAS's FP8 "promotion", torch._scaled_mm's default).
        let promoted = dtype.bytes() == 1;
        let sums: Vec<Reg> = match promoted {
            true => regs.iter().map(|_| self.new_reg(RegTy::F32)).collect(),
            false => regs.clone(),
        };
        // The registers of each warp tile: the layout's slots go tile by
        // tile, each in wgmma's order (per 8 columns (g, 2t), (g, 2t + 1),
        // (g + 8, 2t), (g + 8, 2t + 1)).
        let per_tile = sums.len() / tiles as usize;
        self.emit(Inst::WgmmaFence);
        let mut descs = Descriptors::default();
        for kk in 0..k * dtype.bytes() as u32 / 32 {
            // k step `kk`: 32 bytes along k-major rows, or 16 rows (2048
            // bytes) of an n-major b.
            let a_descs: Vec<Reg> = (0..tiles)
                .map(|j| {
                    let offset = 64 * j * a_sw.row_bytes + 32 * kk;
                    self.descriptor_in(&mut descs, a_wg, offset, a_bits)
                })
                .collect();
            let b_step = if b_kmajor { 32 * kk } else { 2048 * kk };
            let b_desc = self.descriptor_in(&mut descs, Operand::Reg(b_base), b_step, b_bits);
            for (acc, &a_desc) in sums.chunks(per_tile).zip(&a_descs) {
                self.emit(Inst::Wgmma {
                    n,
                    input,
                    acc: acc.to_vec(),
                    a: WgmmaA::Desc(a_desc),
                    b_desc,
                    trans_b: !b_kmajor,
                    accumulate: !promoted || kk > 0,
                });
            }
        }
        // One group stays in flight (the loop waits for it after its end):
        // the tensor cores run it while the warps pass the next iteration's
        // wait and barrier; the one before, which read the stage the copies
        // ahead are about to rewrite, is complete.
        self.emit(Inst::WgmmaCommit);
        if !promoted {
            self.emit(Inst::WgmmaWait {
                pending: u32::from(in_flight),
            });
        } else if in_flight && self.promotion.is_none() {
            // A promoted group in its loop is waited for and added at the
            // end of the iteration (`for_loop`), after the copies ahead are
            // issued; nothing reads the accumulator before.
            self.promotion = Some(Promotion {
                acc: regs.clone(),
                sums,
            });
        } else {
            self.emit(Inst::WgmmaWait { pending: 0 });
            self.add_sums(&regs, &sums);
        }
        Ok(TV {
            layout,
            ops: regs.into_iter().map(Operand::Reg).collect(),
            ty: RegTy::F32,
            dtype: DType::F32,
        })
    }

    /// Rounds the `bytes` of f32 at shared address `base` (a pipeline stage
    /// as TMA copied it) to tf32 in place, 16 bytes a thread at a time: the
    /// tensor cores read a tf32 operand's f32 bits as they are in shared
    /// memory, and a tf32 `dot` rounds its operands to nearest (ties away, as
    /// `cvt.rna.tf32.f32`, the CPU executor and the `mma.sync` path do).
    /// Rounding is elementwise, so the stage's swizzle does not matter; the
    /// caller publishes the writes to wgmma (proxy fence, barrier).
    fn round_stage_to_tf32(&mut self, base: Reg, bytes: u32) {
        let threads = self.num_warps * 32;
        let chunks = bytes / 16;
        let off = self.bin(
            BinOp::Mul,
            RegTy::U32,
            Operand::Reg(self.tid),
            Operand::Int(16),
        );
        let addr = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(base), off);
        let addr = self.materialize(RegTy::U32, addr).reg().expect("reg");
        for j in 0..chunks.div_ceil(threads) {
            // Past a last partial round, the threads beyond the chunks idle.
            let pred = (!chunks.is_multiple_of(threads) && (j + 1) * threads > chunks).then(|| {
                let c = self.cmp(
                    CmpOp::Lt,
                    RegTy::U32,
                    Operand::Reg(self.tid),
                    Operand::Int(i64::from(chunks - j * threads)),
                );
                self.materialize(RegTy::Pred, c).reg().expect("reg")
            });
            let offset = i64::from(j * threads * 16);
            let vals: Vec<Reg> = (0..4).map(|_| self.new_reg(RegTy::F32)).collect();
            self.emit(Inst::Ld {
                stream: false,
                space: Space::Shared,
                mem: MemTy::F32,
                dst: vals.clone(),
                addr,
                offset,
                pred,
            });
            let rounded: Vec<Operand> = vals
                .into_iter()
                .map(|f| {
                    let r = self.new_reg(RegTy::B32);
                    self.emit(Inst::Cvt {
                        dst: r,
                        src: f,
                        narrow: None,
                    });
                    Operand::Reg(r)
                })
                .collect();
            self.emit(Inst::St {
                stream: false,
                space: Space::Shared,
                mem: MemTy::U32,
                src: rounded,
                addr,
                offset,
                pred,
            });
        }
    }

    /// Rounds the `[k, n]` f32 stage at `src` (n-major 128-byte panels,
    /// `src_sw`, as TMA lands them) to tf32 and writes its transpose, `[n,
    /// k]` with rows swizzled as `dst_sw`, at `dst`: the k-major layout in
    /// which wgmma reads a tf32 `b` (it transposes 16-bit operands only).
    /// Thread `t` reads 16 bytes (four columns) of row `t % k` a step, so a
    /// warp's stores fill whole rows of the transpose (32 banks apart). The
    /// caller publishes the writes to wgmma (proxy fence, barrier).
    fn transpose_stage_to_tf32(
        &mut self,
        src: Reg,
        src_sw: Swizzle,
        dst: Reg,
        dst_sw: Swizzle,
        [k, n]: [u32; 2],
    ) {
        let threads = self.num_warps * 32;
        let items = k * n / 4;
        let tid = Operand::Reg(self.tid);
        // The addresses of step 0, and where a later step's are a constant
        // distance away (the swizzles repeat: `Swizzle::shift`), that distance.
        let mut first: Option<(Reg, Vec<Reg>)> = None;
        for j in 0..items.div_ceil(threads) {
            // Item `i = t + j threads`: row `i % k`, columns `4 (i / k) ..`.
            let i = self.bin(
                BinOp::Add,
                RegTy::U32,
                tid,
                Operand::Int(i64::from(j * threads)),
            );
            let pred = (!items.is_multiple_of(threads) && (j + 1) * threads > items).then(|| {
                let c = self.cmp(CmpOp::Lt, RegTy::U32, i, Operand::Int(i64::from(items)));
                self.materialize(RegTy::Pred, c).reg().expect("reg")
            });
            // A step moves `threads / k` groups of four columns: as many
            // 16-bit elements along a panel row times 8, as many rows times 4
            // down the transpose.
            let cols = j * threads / k * 4;
            let shifted = first.as_ref().and_then(|(from, to)| {
                let s = src_sw.shift(0, 2 * cols)?;
                let d = dst_sw.shift(cols, 0)?;
                Some((*from, to.clone(), s, d))
            });
            let (from, to, s_off, d_off) = match shifted {
                Some(x) => x,
                None => {
                    // `k` is 16 or 32 (rows of 64 or 128 bytes).
                    let row = self.bin(BinOp::And, RegTy::U32, i, Operand::Int(i64::from(k - 1)));
                    let quad = self.bin(
                        BinOp::Shr,
                        RegTy::U32,
                        i,
                        Operand::Int(i64::from(k.trailing_zeros())),
                    );
                    let col = self.bin(BinOp::Shl, RegTy::U32, quad, Operand::Int(2));
                    // `swizzled` counts columns in 16-bit elements.
                    let col16 = self.bin(BinOp::Shl, RegTy::U32, col, Operand::Int(1));
                    let from = self.swizzled(src, src_sw, row, col16);
                    // Element (row, col + e) goes to row `col + e`, column
                    // `row` of the transpose: chunk `row / 4`, word `row % 4`.
                    let chunk = self.bin(BinOp::And, RegTy::U32, row, Operand::Int(!3));
                    let chunk16 = self.bin(BinOp::Shl, RegTy::U32, chunk, Operand::Int(1));
                    let word = self.bin(BinOp::And, RegTy::U32, row, Operand::Int(3));
                    let word = self.bin(BinOp::Shl, RegTy::U32, word, Operand::Int(2));
                    let to: Vec<Reg> = (0..4)
                        .map(|e| {
                            let r = self.bin(BinOp::Add, RegTy::U32, col, Operand::Int(e));
                            let to = self.swizzled(dst, dst_sw, r, chunk16);
                            let to = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(to), word);
                            self.materialize(RegTy::U32, to).reg().expect("reg")
                        })
                        .collect();
                    if j == 0 {
                        first = Some((from, to.clone()));
                    }
                    (from, to, 0, 0)
                }
            };
            let vals: Vec<Reg> = (0..4).map(|_| self.new_reg(RegTy::F32)).collect();
            self.emit(Inst::Ld {
                stream: false,
                space: Space::Shared,
                mem: MemTy::F32,
                dst: vals.clone(),
                addr: from,
                offset: i64::from(s_off),
                pred,
            });
            for (f, to) in vals.into_iter().zip(to) {
                let rounded = self.new_reg(RegTy::B32);
                self.emit(Inst::Cvt {
                    dst: rounded,
                    src: f,
                    narrow: None,
                });
                self.emit(Inst::St {
                    stream: false,
                    space: Space::Shared,
                    mem: MemTy::U32,
                    src: vec![Operand::Reg(rounded)],
                    addr: to,
                    offset: i64::from(d_off),
                    pred,
                });
            }
        }
    }

    /// `acc[i] += sums[i]` in f32 (a promotion's add).
    pub(in crate::ir::target::lower) fn add_sums(&mut self, acc: &[Reg], sums: &[Reg]) {
        for (&r, &s) in acc.iter().zip(sums) {
            self.emit(Inst::Binary {
                op: BinOp::Add,
                dst: r,
                a: Operand::Reg(r),
                b: Operand::Reg(s),
            });
        }
    }

    /// A dot on wgmma waited for where it is issued (`LoopPlan::wgmma_waited`,
    /// whose doc says which operands it takes). Each warpgroup issues
    /// `tiles` m64 instructions a k step of 16: the `j`-th gives each warp
    /// its `j`-th 16-row tile of the `mma.sync` accumulator layout (an `a`
    /// in shared memory has its rows stored in that order; one in registers
    /// is packed per tile). The operand stages were published to wgmma's
    /// reads by the loop's wait (proxy fence, barrier); the group is waited
    /// for at once, so the result is in registers and the stages are read
    /// when the dot ends.
    pub(in crate::ir::target::lower) fn dot_wgmma_waited(
        &mut self,
        d: WaitedWgmma,
        acc: Option<Value>,
        [m, n, k]: [u32; 3],
        dtype: DType,
    ) -> R<TV> {
        let nw = self.num_warps;
        let Some(layout) = Layout::mma_accumulator(m, n, nw, WarpOrder::RowsFirst).map(Rc::new)
        else {
            return self.unsupported("a wgmma dot whose rows do not tile the warps");
        };
        self.emit(Inst::Comment(format!(
            "dot [{m},{k}] x [{k},{n}] {} on wgmma, {layout}",
            dtype.name()
        )));
        // The accumulators, which wgmma reads and writes in place: a carried
        // value's registers where the group stays in flight (the plan saw
        // that nothing reads them until the next iteration's first dot has
        // waited), else fresh ones.
        let carried = d
            .in_flight
            .map(|c| self.val(c))
            .filter(|c| *c.layout == *layout && c.ty == RegTy::F32);
        // A dot without an accumulator writes fresh ones at its first k step
        // (wgmma's scale-d false) instead of adding onto zeroed registers.
        let fresh = acc.is_none() && carried.is_none();
        let mut regs = Vec::new();
        for (i, o) in self.acc_operands(acc, &layout)?.into_iter().enumerate() {
            let r = match &carried {
                Some(c) => c.ops[i].reg().expect("carried registers"),
                None => self.new_reg(RegTy::F32),
            };
            if o != Operand::Reg(r) && !fresh {
                self.emit(Inst::Mov { dst: r, src: o });
            }
            regs.push(r);
        }
        let slot = |r: u32, c: u32| {
            layout
                .find_slot(&[r, c])
                .expect("an accumulator layout holds its whole warp tile")
        };
        // The registers of warp tile `j` in wgmma's order: per 8 columns,
        // (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
        let tile_regs = |j: u32| -> Vec<Reg> {
            (0..n / 8)
                .flat_map(|c| [(0, 0), (0, 1), (8, 0), (8, 1)].map(|(dr, dc)| (c, dr, dc)))
                .map(|(c, dr, dc)| regs[slot(16 * j + dr, 8 * c + dc)])
                .collect()
        };
        let Some(input) =
            wgmma_input(dtype, Precision::Ieee).filter(|m| matches!(m, MemTy::BF16 | MemTy::F16))
        else {
            return self.unsupported(format!("a waited wgmma dot of {}", dtype.name()));
        };
        // `b`: a pipeline stage, k-major where it is a transposed load.
        let Some(&(bp, b_kmajor)) = self.pipeline.pipelined.get(&d.b) else {
            return self.unsupported("a wgmma operand that is not in a pipeline stage");
        };
        let b_stage = Operand::Reg(self.pipeline.pipes[bp].stage);
        let (b_base, b_sw) = self.stage_base(bp, b_stage);
        // `a`: a stage or the loop-invariant copy (this warpgroup's block of
        // `64 tiles` rows), or registers in the accumulator layout of this
        // dot's rows over `k`.
        let a_smem = match self.pipeline.pipelined.get(&d.a).copied() {
            Some((ap, false)) => {
                let stage = Operand::Reg(self.pipeline.pipes[ap].stage);
                let (base, sw) = self.stage_base(ap, stage);
                let at = self.warpgroup_block(base, 64 * d.tiles * 128);
                Some((self.materialize(RegTy::U32, at), sw))
            }
            Some((_, true)) => return self.unsupported("a transposed wgmma `a` operand"),
            None => None,
        };
        let a_regs = match a_smem {
            Some(_) => None,
            None => {
                let want = Layout::mma_accumulator(m, k, nw, WarpOrder::RowsFirst).map(Rc::new);
                let Some(want) = want else {
                    return self.unsupported("a wgmma `a` whose rows do not tile the warps");
                };
                let av = self.val(d.a);
                Some(self.convert(&av, &want)?)
            }
        };
        // k-major operands (128-byte swizzled rows in panels of 64 columns):
        // a k step of 16 is 32 bytes along the row, 8-row groups 1024 bytes
        // apart. n-major `b`: 16 rows (2048 bytes) a step, panels of 64
        // columns `panel_rows * 128` bytes apart.
        let kmajor_bits = descriptor_bits(16, 1024, 1);
        let kmajor_offset = |sw: Swizzle, kk: u32| kk / 4 * sw.panel_rows * 128 + kk % 4 * 32;
        // Fragments in registers are packed before the fence: registers
        // wgmma reads must not be written between the fence and the group's
        // wait (ptxas would insert a warpgroup arrive before each use).
        let frags: Vec<Vec<Vec<Reg>>> = match &a_regs {
            Some(av) => (0..k / 16)
                .map(|kk| self.a_fragments_from_registers(av, kk, 16 * d.tiles))
                .collect(),
            None => Vec::new(),
        };
        self.emit(Inst::WgmmaFence);
        let mut descs = Descriptors::default();
        for kk in 0..k / 16 {
            let (b_offset, b_bits) = match b_kmajor {
                true => (kmajor_offset(b_sw, kk), kmajor_bits),
                false => (2048 * kk, descriptor_bits(b_sw.panel_rows * 128, 1024, 1)),
            };
            let b_desc = self.descriptor_in(&mut descs, Operand::Reg(b_base), b_offset, b_bits);
            for j in 0..d.tiles {
                let a = match a_smem {
                    Some((base, sw)) => WgmmaA::Desc(self.descriptor_in(
                        &mut descs,
                        base,
                        kmajor_offset(sw, kk) + 64 * j * 128,
                        kmajor_bits,
                    )),
                    None => WgmmaA::Regs(frags[kk as usize][j as usize].clone()),
                };
                self.emit(Inst::Wgmma {
                    n,
                    input,
                    acc: tile_regs(j),
                    a,
                    b_desc,
                    trans_b: !b_kmajor,
                    accumulate: kk > 0 || !fresh,
                });
            }
        }
        self.emit(Inst::WgmmaCommit);
        if carried.is_none() {
            self.emit(Inst::WgmmaWait { pending: 0 });
        }
        Ok(self.mma_result_in(layout, regs))
    }

    /// This thread's warpgroup's block of `block_bytes` from `base`. One
    /// warpgroup reads from the base itself: an address the same in every
    /// thread, as wgmma's descriptors must be (ptxas keeps them in uniform
    /// registers).
    fn warpgroup_block(&mut self, base: Reg, block_bytes: u32) -> Operand {
        if self.num_warps == 4 {
            return Operand::Reg(base);
        }
        let wg = self.bin(
            BinOp::Shr,
            RegTy::U32,
            Operand::Reg(self.tid),
            Operand::Int(self.warp_size.trailing_zeros() as i64 + 2),
        );
        let rows = self.bin(
            BinOp::Mul,
            RegTy::U32,
            wg,
            Operand::Int(i64::from(block_bytes)),
        );
        self.bin(BinOp::Add, RegTy::U32, Operand::Reg(base), rows)
    }

    /// The base register and swizzle of pipelined operand `v`'s current stage.
    fn current_stage(&mut self, v: Value) -> (Reg, Swizzle) {
        let (pi, _) = self.pipeline.pipelined[&v];
        let stage = Operand::Reg(self.pipeline.pipes[pi].stage);
        self.stage_base(pi, stage)
    }

    /// The descriptor of `base + offset` with `bits`: the first one of a
    /// `base` and `bits` in `descs` is built from the address, each later one
    /// by adding its distance from that one to the start-address field (one
    /// addition where building takes five, and ptxas redoes neither: the
    /// operands of a dot take 8-16 descriptors an iteration). Exact: the
    /// field holds bits 4-17 of the address, the offset within the CTA's
    /// shared window (bits 24 and up name the CTA of the cluster), and every
    /// operand lies within the window's first 228 KiB + 1 KiB, below 2^18, so
    /// the sum of a 16-byte multiple never carries out of the field.
    fn descriptor_in(
        &mut self,
        descs: &mut Descriptors,
        base: Operand,
        offset: u32,
        bits: i64,
    ) -> Reg {
        let earlier = descs.0.iter().find(|&&(b, bi, o, _)| {
            b == base && bi == bits && o <= offset && (offset - o).is_multiple_of(16)
        });
        if let Some(&(_, _, o, d)) = earlier {
            let sum = self.bin(
                BinOp::Add,
                RegTy::U64,
                Operand::Reg(d),
                Operand::Int(i64::from((offset - o) / 16)),
            );
            return self.materialize(RegTy::U64, sum).reg().expect("reg");
        }
        let d = self.descriptor(base, offset, bits);
        descs.0.push((base, bits, offset, d));
        d
    }

    /// A matrix descriptor (`B64`): `bits` with the start address `base +
    /// offset` (shared-window bytes, in 16-byte units, 14 bits).
    fn descriptor(&mut self, base: Operand, offset: u32, bits: i64) -> Reg {
        let addr = self.bin(BinOp::Add, RegTy::U32, base, Operand::Int(offset as i64));
        let addr = self.bin(BinOp::Shr, RegTy::U32, addr, Operand::Int(4));
        let addr = self.bin(BinOp::And, RegTy::U32, addr, Operand::Int(0x3fff));
        let wide = self.cvt(RegTy::U64, addr, None);
        let d = self.bin(BinOp::Or, RegTy::U64, wide, Operand::Int(bits));
        self.materialize(RegTy::U64, d).reg().expect("reg")
    }
}

#[cfg(test)]
mod tests {
    use super::descriptor_bits;

    #[test]
    fn descriptor_fields_sit_where_the_ptx_isa_puts_them() {
        // 128-byte swizzle, leading offset 4096, stride offset 1024.
        let d = descriptor_bits(4096, 1024, 1) as u64;
        assert_eq!(d >> 62, 1);
        assert_eq!((d >> 32) & 0x3fff, 1024 >> 4);
        assert_eq!((d >> 16) & 0x3fff, 4096 >> 4);
        assert_eq!(d & 0xffff, 0);
        // 64-byte swizzle sets bit 63.
        assert_eq!(descriptor_bits(16, 512, 2) as u64 >> 62, 2);
    }
}
