//! Tensor-core `dot`s, one file per MMA generation, plus the operand staging
//! they share:
//!
//! - `mma16816`: f16/bf16 with `mma.sync` m16n8k16 (sm_80+) or two m16n8k8
//!   (sm_75), fragments read with `ldmatrix`;
//! - `tf32`: f32 with `precision="tf32"` on `mma.m16n8k8.tf32` (sm_80+);
//! - `mma884`: f16 on sm_70's `mma.m8n8k4`, fragments read with plain shared
//!   loads (no `ldmatrix`);
//! - `staging`: where a dot operand is in shared memory (pipelined, deferred,
//!   or stored from registers into a swizzled buffer);
//! - `wgmma`: f16/bf16 on sm_90a's warpgroup MMA, operands read from the
//!   pipeline's stages through matrix descriptors;
//! - `amd`: AMD's MFMA (CDNA: f16, bf16, f32, and fp8 on CDNA3) and WMMA
//!   (RDNA3: f16, bf16), operands read per lane from LDS.
//!
//! Which unit takes a dot is decided once, by [`crate::target::select_mma`]
//! over the target's matrix-instruction rows ([`Lower::mma_plan`]); the
//! instruction's feed names the file that emits it. The result of the dot stays
//! in the accumulator layout, so a loop-carried accumulator never moves.

mod amd;
mod mma16816;
mod mma884;
mod staging;
mod tf32;
mod warp_order;
mod wgmma;

pub(super) use warp_order::warp_order;
pub(super) use wgmma::{Promotion, WgmmaDot};

use std::rc::Rc;

use crate::check::DType;
use crate::ir::target::layout::Layout;
use crate::ir::target::lower::{Lower, R, TV};
use crate::ir::target::{BinOp, Inst, LayoutKind, Operand, Reg, RegTy};
use crate::ir::tile::{Precision, Value};
use crate::target::{mma_candidates, MmaFeed, MmaInst, MmaKind};

/// How an mma accumulator layout splits a dot's `[m, n]` result: the warp
/// grid `[wm, wn]` and each warp's tile `[tm, tn]`.
pub(super) struct WarpTiling {
    pub m: u32,
    pub n: u32,
    pub warps: [u32; 2],
    pub tile: [u32; 2],
}

impl WarpTiling {
    pub fn of(layout: &Layout) -> Self {
        let (m, n) = (layout.shape[0], layout.shape[1]);
        let warps = match layout.kind {
            LayoutKind::Mma { warps, .. } => [warps[0], warps[1]],
            _ => unreachable!("mma layout"),
        };
        WarpTiling {
            m,
            n,
            warps,
            tile: [m / warps[0], n / warps[1]],
        }
    }
}

impl<'a> Lower<'a> {
    /// The matrix instruction a `dot` of these operand dtypes, shape and
    /// precision runs on, with its accumulator layout, if one fits (else the
    /// FMA path is used).
    pub(super) fn mma_plan(
        &self,
        a: DType,
        b: DType,
        [m, n, k]: [u32; 3],
        precision: Precision,
    ) -> Option<(&'static MmaInst, Rc<Layout>)> {
        let (a, b) = (a.mma_elem()?, b.mma_elem()?);
        // The first instruction whose tiles the warps can cover.
        let (inst, layout) =
            mma_candidates(&self.feat, a, b, Some(k), precision).find_map(|inst| {
                let layout = match inst.feed {
                    MmaFeed::Ldmatrix | MmaFeed::Tf32Fragments => {
                        Layout::mma_accumulator(m, n, self.num_warps, self.warp_order)
                    }
                    MmaFeed::SharedPairs => {
                        Layout::mma884_accumulator(m, n, self.num_warps, self.warp_order)
                    }
                    MmaFeed::Registers => match inst.kind {
                        MmaKind::Mfma => Layout::mfma_accumulator(
                            [inst.m, inst.n],
                            m,
                            n,
                            self.num_warps,
                            self.warp_order,
                        ),
                        _ => Layout::wmma_accumulator(m, n, self.num_warps, self.warp_order),
                    },
                }?;
                Some((inst, layout))
            })?;
        Some((inst, Rc::new(layout)))
    }
}

/// The steps every tensor-core emitter shares: the accumulator registers it
/// starts from, this thread's warp in the warp grid, one k step of
/// instructions over the warp's tiles, and the result.
impl<'a> Lower<'a> {
    /// The accumulator registers of a tensor-core `dot`: `acc` converted to
    /// the mma layout, or zeros, each in an f32 register.
    pub(super) fn mma_accumulators(
        &mut self,
        acc: Option<Value>,
        layout: &Rc<Layout>,
    ) -> R<Vec<Reg>> {
        let init = self.acc_operands(acc, layout)?;
        let mut regs = Vec::with_capacity(init.len());
        // One register per constant (zeros): the first k step reads them and
        // writes fresh accumulators, so they may be shared.
        let mut consts: Vec<(Operand, Reg)> = Vec::new();
        for o in init {
            regs.push(match o {
                Operand::Reg(r) => r,
                o => match consts.iter().find(|(c, _)| *c == o) {
                    Some(&(_, r)) => r,
                    None => {
                        let r = self.materialize(RegTy::F32, o).reg().expect("reg");
                        consts.push((o, r));
                        r
                    }
                },
            });
        }
        Ok(regs)
    }

    /// This thread's warp's (wave's) row and column in a `[wm, wn]` warp grid
    /// (warps numbered along m first).
    pub(super) fn warp_coords(&mut self, [wm, wn]: [u32; 2]) -> (Operand, Operand) {
        let tid = Operand::Reg(self.tid);
        let warp = self.bin(
            BinOp::Shr,
            RegTy::U32,
            tid,
            Operand::Int(self.warp_size.trailing_zeros() as i64),
        );
        let warp_m = self.bin(BinOp::And, RegTy::U32, warp, Operand::Int(wm as i64 - 1));
        let warp_n = self.bin(
            BinOp::Shr,
            RegTy::U32,
            warp,
            Operand::Int(wm.trailing_zeros() as i64),
        );
        let warp_n = self.bin(BinOp::And, RegTy::U32, warp_n, Operand::Int(wn as i64 - 1));
        (warp_m, warp_n)
    }

    /// One k step over a warp's tiles: for every pair of an `a` fragment (a
    /// row of tiles) and a `b` fragment (a column), `issue` emits the
    /// instructions that add their product to the tile's `per_tile`
    /// accumulator registers `c`, writing the fresh registers `d`. Returns the
    /// accumulators after the step.
    pub(super) fn mma_step(
        &mut self,
        cur: &[Reg],
        afrag: &[Vec<Reg>],
        bfrag: &[Vec<Reg>],
        per_tile: usize,
        mut issue: impl FnMut(&mut Self, &[Reg], &[Reg], Vec<Reg>, &[Reg]),
    ) -> Vec<Reg> {
        let mut next = cur.to_vec();
        for (im, af) in afrag.iter().enumerate() {
            for (jn, bf) in bfrag.iter().enumerate() {
                let t = (im * bfrag.len() + jn) * per_tile;
                let d: Vec<Reg> = (0..per_tile).map(|_| self.new_reg(RegTy::F32)).collect();
                issue(self, af, bf, cur[t..t + per_tile].to_vec(), &d);
                next[t..t + per_tile].copy_from_slice(&d);
            }
        }
        next
    }

    /// The result of a tensor-core `dot`, after the barrier that lets the next
    /// call (in a loop) rewrite the operand buffers.
    pub(super) fn mma_result(&mut self, layout: Rc<Layout>, acc: Vec<Reg>) -> TV {
        self.emit(Inst::Barrier);
        self.mma_result_in(layout, acc)
    }

    /// The result of a tensor-core `dot` that wrote no shared memory (its
    /// operands were pipeline stages or registers): no barrier, as the
    /// pipeline's own retires the reads before a stage is rewritten.
    pub(super) fn mma_result_in(&self, layout: Rc<Layout>, acc: Vec<Reg>) -> TV {
        TV {
            layout,
            ops: acc.into_iter().map(Operand::Reg).collect(),
            ty: RegTy::F32,
            dtype: DType::F32,
        }
    }
}
