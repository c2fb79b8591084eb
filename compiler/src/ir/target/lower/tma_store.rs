//! A tile stored by TMA (sm_90a): the threads write it into shared memory
//! in the boxes of a tensor map, and one thread copies the boxes out with
//! `cp.async.bulk.tensor` (a GEMM's epilogue).
//!
//! Why: a wgmma GEMM runs one block an SM, and its plain stores keep the
//! tensor cores idle until the tile's last write leaves the SM (at 8192³
//! the f32 store of a 128 x 256 tile cost 14% of the kernel on an H100).
//! A bf16 accumulator tile is stored as 4-byte words a lane, half of a
//! 32-byte sector a quad; written to shared memory instead, the tile is
//! read out by the TMA unit in whole lines, and the block waits only for
//! those reads, not for the global writes, before it exits and the next
//! block's loads start. TMA also drops the elements past the tensor's
//! edge, so the store needs no bounds checks.
//!
//! When: a store without a mask of a 2-D tile whose warps would write
//! rows in runs shorter than a 32-byte sector (a 16-bit matrix
//! accumulator: 16 bytes a quad of lanes) to two ranges of a tensor,
//! the innermost of them its last dim, with `i32` indices, strides that are
//! multiples of 16 bytes, rows a multiple of 8 (at most 256) and rows of a
//! multiple of 128 bytes; and where the shared memory is free: no loop's
//! buffers are live (the store is outside every loop that has any) and the
//! tile is no larger than the arena the kernel already needs, which it
//! overlays. Otherwise the plain store stays.
//!
//! Layout: boxes of 128 bytes a row (32 f32 or 64 bf16 elements) by the
//! tile's rows, in the 128-byte swizzle (16-byte chunk `c` of row `r` at
//! chunk `c ^ (r % 8)`), so that the threads of a warp write distinct banks.
//! A thread's base row and column come from its layout's thread-id terms
//! and each register slot adds constants, so a slot's shared address is one
//! of a few registers (one per distinct chunk offset and row phase) plus a
//! constant.

use std::collections::HashMap;

use super::{Lower, R, TV};
use crate::ir::target::layout::Term;
use crate::ir::target::{BinOp, Inst, MemTy, Operand, RegTy, SmemBuffer, Space, TensorMap};
use crate::ir::tile::Access;

/// Bytes of a box row: the 128-byte swizzle's span.
const BOX_ROW_BYTES: u32 = 128;

/// Where a group of slots lands: the byte offset of its chunk's 16 bytes
/// that is not a whole chunk (`rr`), its whole chunks (`rc`) and its row
/// modulo 8 (the XOR phase) — what a register of its address depends on.
type AddrKey = (u32, u32, u32);

/// What a TMA store of one tile takes (see [`Lower::tma_store_plan`]).
struct StorePlan {
    /// Elements of a box row.
    inner: u32,
    boxes: u32,
    box_bytes: u32,
    /// The tensor map's box, innermost first.
    box_dims: Vec<u32>,
    /// Slot groups stored by one access each, with their address register's
    /// key and their constant offset from it.
    groups: Vec<(Vec<usize>, AddrKey, i64)>,
    /// The column terms split: a whole number of boxes (scaled to box
    /// bytes), and the rest (scaled to bytes).
    box_terms: Vec<Term>,
    byte_terms: Vec<Term>,
}

impl<'a> Lower<'a> {
    /// Stores `v` to `tensor` at `access` by TMA where it fits (see the
    /// module docs); `false` where the plain store must run.
    pub(super) fn tma_store(&mut self, tensor: usize, access: &[Access], v: &TV) -> R<bool> {
        let Some(plan) = self.tma_store_plan(tensor, access, v)? else {
            return Ok(false);
        };
        let (mem, dtype) = {
            let t = self.tensor(tensor)?;
            (t.mem, t.dtype)
        };
        let bytes = plan.box_bytes * plan.boxes;
        let buffer = self.buffers.len();
        self.buffers.push(SmemBuffer {
            name: format!("tma_store{}", self.overlays.len()),
            offset: 0,
            bytes,
            align: 1024,
            purpose: format!(
                "a {} x {} tile stored by TMA (over the whole arena: no loop's buffers are live)",
                v.layout.shape[0], v.layout.shape[1]
            ),
            swizzle: None,
        });
        self.overlays.push(buffer);
        // Earlier uses of the arena (a loop's stages, its barriers) are over.
        self.emit(Inst::Barrier);
        let buf = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr { dst: buf, buffer });
        let layout = v.layout.clone();
        let row_terms: Vec<Term> = layout.terms[0].clone();
        let scaled = |terms: &[Term], by: u32| -> Vec<Term> {
            terms
                .iter()
                .map(|t| Term {
                    mul: t.mul * by,
                    ..*t
                })
                .collect()
        };
        // The thread's part of every address: its box, row and column.
        let row_bytes = self.base(&scaled(&row_terms, BOX_ROW_BYTES));
        let box_at = self.base(&plan.box_terms);
        let a = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(buf), row_bytes);
        let a = self.bin(BinOp::Add, RegTy::U32, a, box_at);
        let col_bytes = self.base(&plan.byte_terms);
        let base_row = self.base(&row_terms);
        let mut addrs = HashMap::new();
        for (group, key @ (rr, rc, phase), offset) in &plan.groups {
            let addr = match addrs.get(key) {
                Some(&r) => r,
                None => {
                    let (rr, rc, phase) = (*rr, *rc, *phase);
                    let w = self.bin(BinOp::Add, RegTy::U32, col_bytes, Operand::Int(rr.into()));
                    let chunk = self.bin(BinOp::Shr, RegTy::U32, w, Operand::Int(4));
                    let chunk = self.bin(BinOp::Add, RegTy::U32, chunk, Operand::Int(rc.into()));
                    let byte = self.bin(BinOp::And, RegTy::U32, w, Operand::Int(15));
                    let r = self.bin(BinOp::Add, RegTy::U32, base_row, Operand::Int(phase.into()));
                    let r = self.bin(BinOp::And, RegTy::U32, r, Operand::Int(7));
                    let x = self.bin(BinOp::Xor, RegTy::U32, chunk, r);
                    let x = self.bin(BinOp::Shl, RegTy::U32, x, Operand::Int(4));
                    let at = self.bin(BinOp::Add, RegTy::U32, a, x);
                    let at = self.bin(BinOp::Add, RegTy::U32, at, byte);
                    let at = self.materialize(RegTy::U32, at).reg().expect("reg");
                    addrs.insert(*key, at);
                    at
                }
            };
            let (smem, src) = self.store_sources(mem, dtype, v, group, true);
            self.emit(Inst::St {
                space: Space::Shared,
                mem: smem,
                src,
                addr,
                offset: *offset,
                pred: None,
            });
        }
        // The writes, visible to the TMA unit's reads (the asynchronous proxy).
        self.emit(Inst::FenceProxyAsync);
        self.emit(Inst::Barrier);
        let map = TensorMap {
            tensor,
            name: self.tk.params[tensor].name.clone(),
            box_dims: plan.box_dims.clone(),
            swizzle: BOX_ROW_BYTES,
        };
        let index = match self.tensor_maps.iter().position(|m| *m == map) {
            Some(i) => i,
            None => {
                self.tensor_maps.push(map);
                self.tensor_maps.len() - 1
            }
        };
        let first = self.thread_zero();
        self.blocks.push(Vec::new());
        let coords = self.tma_coords(access);
        let m = self.new_reg(RegTy::U64);
        self.emit(Inst::TensorMapAddr { dst: m, map: index });
        for b in 0..plan.boxes {
            let mut c = coords.clone();
            let x = self.bin(
                BinOp::Add,
                RegTy::I32,
                c[0],
                Operand::Int(i64::from(b * plan.inner)),
            );
            c[0] = self.materialize(RegTy::I32, x);
            self.emit(Inst::TmaStore {
                src: buf,
                src_offset: i64::from(b * plan.box_bytes),
                map: m,
                coords: c,
            });
        }
        self.emit(Inst::BulkCommit);
        // Shared memory is free again (and the block may exit) once the
        // copies have read it; their global writes finish on their own.
        self.emit(Inst::BulkWaitRead { pending: 0 });
        let then = self.blocks.pop().unwrap_or_default();
        self.emit(Inst::If {
            cond: first,
            then,
            otherwise: Vec::new(),
        });
        self.emit(Inst::Barrier);
        Ok(true)
    }

    /// The plan of a TMA store of `v`, or `None` where one does not fit.
    fn tma_store_plan(&mut self, tensor: usize, access: &[Access], v: &TV) -> R<Option<StorePlan>> {
        if !self.feat.tma || self.buffered_loops > 0 {
            return Ok(None);
        }
        let t = self.tensor(tensor)?;
        let esize: u32 = match t.mem {
            MemTy::F32 | MemTy::I32 | MemTy::U32 => 4,
            MemTy::BF16 | MemTy::F16 => 2,
            _ => return Ok(None),
        };
        let layout = &v.layout;
        if layout.shape.len() != 2 || access.len() > 5 || access.is_empty() {
            return Ok(None);
        }
        let (rows, cols) = (layout.shape[0], layout.shape[1]);
        let inner = BOX_ROW_BYTES / esize;
        if rows % 8 != 0 || rows > 256 || cols % inner != 0 || cols / inner > 32 {
            return Ok(None);
        }
        // Strides of whole 16-byte units (TMA's), every dim but the last.
        let rank = access.len();
        if t.stride_div[..rank - 1]
            .iter()
            .any(|d| (d * u64::from(esize)) % 16 != 0)
        {
            return Ok(None);
        }
        let i32_index =
            |v: &crate::ir::tile::Value| self.tk.ty(*v).dtype() == crate::check::DType::I32;
        if !matches!(access.last(), Some(Access::Range { .. })) {
            return Ok(None);
        }
        let mut ranges = Vec::new();
        let mut box_dims = Vec::new();
        for a in access.iter().rev() {
            match a {
                Access::Range { start, len } if i32_index(start) => {
                    ranges.push(*len);
                    box_dims.push(if ranges.len() == 1 { inner } else { *len });
                }
                Access::Point(x) if i32_index(x) => box_dims.push(1),
                _ => return Ok(None),
            }
        }
        if ranges != [cols, rows] {
            return Ok(None);
        }
        let box_bytes = rows * BOX_ROW_BYTES;
        let bytes = box_bytes * (cols / inner);
        if bytes > self.arena_bytes() {
            return Ok(None);
        }
        // The widest vector every slot group fills (16 bytes at most).
        let mut vec = 16 / esize;
        let groups = loop {
            let groups = Self::vector_groups(layout, vec);
            if vec == 1 || groups.iter().all(|g| g.len() == vec as usize) {
                break groups;
            }
            vec /= 2;
        };
        let gb = vec * esize;
        // The bytes of a row a warp's store instruction writes contiguously:
        // a thread's run, then the lanes that continue it. A run of a whole
        // 32-byte sector or more needs nothing better than the plain store;
        // measured on an H100, an f32 GEMM tile (a quad of lanes writes a
        // row's 32 bytes) was no faster by TMA, 7% slower at M = N = 8192,
        // K = 1024, where a bf16 one (16 bytes: half sectors) was 5-28%
        // faster.
        let mut run = vec;
        while let Some(t) = layout.terms[1]
            .iter()
            .find(|t| u32::from(t.shift) + u32::from(t.bits) <= 5 && t.mul == run)
        {
            run <<= t.bits;
        }
        if run * esize >= 32 {
            return Ok(None);
        }
        // Column terms: whole boxes, or bytes within a box row.
        let (mut box_terms, mut byte_terms) = (Vec::new(), Vec::new());
        let mut byte_max = 0u32;
        for t in &layout.terms[1] {
            let b = t.mul * esize;
            if b.is_multiple_of(BOX_ROW_BYTES) {
                box_terms.push(Term {
                    mul: b / BOX_ROW_BYTES * box_bytes,
                    ..*t
                });
            } else {
                if !b.is_multiple_of(gb) {
                    return Ok(None);
                }
                byte_max += ((1u32 << t.bits) - 1) * b;
                byte_terms.push(Term { mul: b, ..*t });
            }
        }
        let mut planned = Vec::new();
        for g in groups {
            let s = &layout.slots[g[0]];
            let (dr, dc) = (s[0], s[1]);
            let cb = dc * esize;
            let rb = cb % BOX_ROW_BYTES;
            let (rr, rc) = (rb % 16, rb / 16);
            // The group stays in one box and, aligned, in one 16-byte chunk.
            if byte_max + rb + gb > BOX_ROW_BYTES || rr % gb != 0 {
                return Ok(None);
            }
            let offset = i64::from(cb / BOX_ROW_BYTES * box_bytes + dr * BOX_ROW_BYTES);
            planned.push((g, (rr, rc, dr % 8), offset));
        }
        Ok(Some(StorePlan {
            inner,
            boxes: cols / inner,
            box_bytes,
            box_dims,
            groups: planned,
            box_terms,
            byte_terms,
        }))
    }

    /// The bytes of the arena as placed so far: every transient region
    /// (from offset 0), then the regions that live through loops.
    fn arena_bytes(&self) -> u32 {
        super::place_buffers(
            &mut self.buffers.clone(),
            &self.pipeline.persistent,
            &self.overlays,
        )
    }
}
