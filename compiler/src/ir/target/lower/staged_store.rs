//! A tile stored through shared memory (NVIDIA): the threads write it in
//! 128-byte-swizzled boxes, then either one thread copies the boxes out by
//! TMA (`cp.async.bulk.tensor`, sm_90a) or every thread reads back 16-byte
//! runs and stores those (a GEMM's or attention's epilogue).
//!
//! Why: a 16-bit accumulator tile (a bf16 C) leaves a thread as 4-byte
//! words, so a quad of lanes writes 16 bytes of a row, half a 32-byte
//! sector, and a warp needs twice the store instructions of a 16-byte-run
//! layout. Through shared memory the writes become whole lines. By TMA, the
//! block waits only for the copies' reads of shared memory, not for the
//! global writes, before it exits and the next block's loads start; TMA
//! also drops the elements past the tensor's edge, so that store needs no
//! bounds checks. Without TMA the read-back tile is in the default blocked
//! layout (8 bf16 a thread) and takes the plain store's bounds checks and
//! fast path. (At 8192³ on an H100 the f32 store of a 128 x 256 wgmma tile
//! cost 14% of the GEMM; bf16 half-sector stores cost more: the bf16 GEMM
//! was 5-28% faster by TMA.)
//!
//! When: a store without a mask of a 2-D tile whose warps would write rows
//! in runs shorter than a 32-byte sector, with rows a multiple of 8 and rows
//! of a multiple of 128 bytes; and where the shared memory is free: no
//! loop's buffers are live (the store is outside every loop that has any)
//! and the tile is no larger than the arena the kernel already needs, which
//! it overlays. By TMA, further: two ranges of the tensor, the innermost
//! its last dim, `i32` indices, strides that are multiples of 16 bytes and
//! at most 256 rows; read back (bf16 only, moved as packed words), any
//! access the plain store takes. Otherwise the plain store stays: an f32
//! accumulator (a quad writes 32 bytes) was no faster by TMA on an H100, 7%
//! slower at M = N = 8192, K = 1024.
//!
//! Layout: boxes of 128 bytes a row (32 f32 or 64 bf16 elements) by the
//! tile's rows, in the 128-byte swizzle (16-byte chunk `c` of row `r` at
//! chunk `c ^ (r % 8)`), so that the threads of a warp write distinct banks
//! (and read them back so). A thread's base row and column come from its
//! layout's thread-id terms and each register slot adds constants, so a
//! slot's shared address is one of a few registers (one per distinct chunk
//! offset and row phase) plus a constant.

use std::collections::HashMap;
use std::rc::Rc;

use super::{Lower, R, TV};
use crate::ir::target::layout::{Layout, Term};
use crate::ir::target::{BinOp, Inst, MemTy, Operand, Reg, RegTy, SmemBuffer, Space, TensorMap};
use crate::ir::tile::Access;

/// Bytes of a box row: the 128-byte swizzle's span.
const BOX_ROW_BYTES: u32 = 128;

/// Where a group of slots lands: the byte offset of its chunk's 16 bytes
/// that is not a whole chunk (`rr`), its whole chunks (`rc`) and its row
/// modulo 8 (the XOR phase) — what a register of its address depends on.
type AddrKey = (u32, u32, u32);

/// A layout's slots placed in the boxes: groups accessed at once, each with
/// its address register's key and its constant offset from it, and the
/// thread-id terms of the column split into whole boxes (scaled to box
/// bytes) and bytes within a box row.
struct BoxAccess {
    groups: Vec<(Vec<usize>, AddrKey, i64)>,
    box_terms: Vec<Term>,
    byte_terms: Vec<Term>,
}

/// How a tile is staged (see [`Lower::staging_plan`]).
struct StagingPlan {
    /// Elements of a box row.
    inner: u32,
    boxes: u32,
    box_bytes: u32,
    write: BoxAccess,
    out: Out,
}

enum Out {
    /// One thread copies the boxes by TMA; the tensor map's box, innermost
    /// first.
    Tma { box_dims: Vec<u32> },
    /// Every thread reads back 16-byte runs in this layout.
    ReadBack { layout: Rc<Layout>, read: BoxAccess },
}

/// What [`Lower::staged_store`] did.
pub(super) enum Staged {
    /// The plain store runs on `v` as it is.
    No,
    /// Stored (by TMA).
    Done,
    /// The plain store runs on this tile, read back in a blocked layout.
    ReadBack(TV),
}

impl<'a> Lower<'a> {
    /// Stages `v`, stored to `tensor` at `access`, through shared memory
    /// where it fits (see the module docs).
    pub(super) fn staged_store(&mut self, tensor: usize, access: &[Access], v: &TV) -> R<Staged> {
        let Some(plan) = self.staging_plan(tensor, access, v)? else {
            return Ok(Staged::No);
        };
        let (mem, dtype) = {
            let t = self.tensor(tensor)?;
            (t.mem, t.dtype)
        };
        let buffer = self.buffers.len();
        let overlay = self.across_live == 0;
        self.buffers.push(SmemBuffer {
            name: format!("staged{}", self.overlays.len()),
            offset: 0,
            bytes: plan.box_bytes * plan.boxes,
            align: 1024,
            purpose: format!(
                "a {} x {} tile stored through shared memory ({})",
                v.layout.shape[0],
                v.layout.shape[1],
                if overlay {
                    "over the whole arena: no loop's buffers are live"
                } else {
                    "beside the stages of the pipeline running across its loop"
                }
            ),
            swizzle: None,
        });
        if overlay {
            self.overlays.push(buffer);
            // Earlier uses of the arena (a loop's stages, its barriers) are over.
        } else {
            // Its own region, which only this store writes: the previous
            // iteration's copies out by TMA must have read it (waited here,
            // not after them, so that they overlap the next tile's math).
            self.pipeline.persistent.push(buffer);
            let first = self.thread_zero();
            self.when(first, |l| l.emit(Inst::BulkWaitRead { pending: 0 }));
        }
        self.emit(Inst::Barrier);
        let buf = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr { dst: buf, buffer });
        let addrs = self.box_addresses(buf, &v.layout, &plan.write);
        for (group, key, offset) in &plan.write.groups {
            let (smem, src) = self.store_sources(mem, dtype, v, group, true);
            self.emit(Inst::St {
                stream: false,
                space: Space::Shared,
                mem: smem,
                src,
                addr: addrs[key],
                offset: *offset,
                pred: None,
            });
        }
        match &plan.out {
            Out::Tma { box_dims } => {
                self.tma_copy_out(tensor, access, buf, box_dims.clone(), &plan, !overlay);
                Ok(Staged::Done)
            }
            Out::ReadBack { layout, read } => {
                self.emit(Inst::Barrier);
                let addrs = self.box_addresses(buf, layout, read);
                let mut ops = vec![Operand::Int(0); layout.num_slots()];
                for (group, key, offset) in &read.groups {
                    let words: Vec<Reg> = (0..group.len() / 2)
                        .map(|_| self.new_reg(RegTy::U32))
                        .collect();
                    self.emit(Inst::Ld {
                        stream: false,
                        space: Space::Shared,
                        mem: MemTy::U32,
                        dst: words.clone(),
                        addr: addrs[key],
                        offset: *offset,
                        pred: None,
                    });
                    for (k, &slot) in group.iter().enumerate() {
                        ops[slot] = self.unpack_bf16(words[k / 2], k % 2 == 1);
                    }
                }
                // The next use of the arena waits for every read.
                self.emit(Inst::Barrier);
                Ok(Staged::ReadBack(TV {
                    layout: layout.clone(),
                    ops,
                    ty: v.ty,
                    dtype: v.dtype,
                }))
            }
        }
    }

    /// The written boxes to the tensor by TMA: the writes fenced for the
    /// asynchronous proxy, then thread 0's copies. `deferred`: the wait for
    /// the copies' reads is left to the next write of the buffer (and the
    /// end of the loop a pipeline runs across).
    fn tma_copy_out(
        &mut self,
        tensor: usize,
        access: &[Access],
        buf: Reg,
        box_dims: Vec<u32>,
        plan: &StagingPlan,
        deferred: bool,
    ) {
        self.emit(Inst::FenceProxyAsync);
        self.emit(Inst::Barrier);
        let map = TensorMap {
            tensor,
            name: self.tk.params[tensor].name.clone(),
            box_dims,
            swizzle: BOX_ROW_BYTES,
        };
        let index = self.tensor_map_index(map);
        let first = self.thread_zero();
        self.when(first, |l| {
            let coords = l.tma_coords(access);
            let m = l.new_reg(RegTy::U64);
            l.emit(Inst::TensorMapAddr { dst: m, map: index });
            for b in 0..plan.boxes {
                let mut c = coords.clone();
                let x = l.bin(
                    BinOp::Add,
                    RegTy::I32,
                    c[0],
                    Operand::Int(i64::from(b * plan.inner)),
                );
                c[0] = l.materialize(RegTy::I32, x);
                l.emit(Inst::TmaStore {
                    src: buf,
                    src_offset: i64::from(b * plan.box_bytes),
                    map: m,
                    coords: c,
                });
            }
            l.emit(Inst::BulkCommit);
            // Shared memory is free again (and the block may exit) once the
            // copies have read it; their global writes finish on their own.
            if !deferred {
                l.emit(Inst::BulkWaitRead { pending: 0 });
            }
        });
        if !deferred {
            self.emit(Inst::Barrier);
        }
    }

    /// The address registers of a [`BoxAccess`] of `layout` in the boxes
    /// at `buf`, by key.
    fn box_addresses(
        &mut self,
        buf: Reg,
        layout: &Layout,
        access: &BoxAccess,
    ) -> HashMap<AddrKey, Reg> {
        let row_terms = layout.terms[0].clone();
        let scaled: Vec<Term> = row_terms
            .iter()
            .map(|t| Term {
                mul: t.mul * BOX_ROW_BYTES,
                ..*t
            })
            .collect();
        // The thread's part of every address: its box, row and column.
        let row_bytes = self.base(&scaled);
        let box_at = self.base(&access.box_terms);
        let a = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(buf), row_bytes);
        let a = self.bin(BinOp::Add, RegTy::U32, a, box_at);
        let col_bytes = self.base(&access.byte_terms);
        let base_row = self.base(&row_terms);
        let mut addrs = HashMap::new();
        for (_, key, _) in &access.groups {
            if addrs.contains_key(key) {
                continue;
            }
            let (rr, rc, phase) = *key;
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
        }
        addrs
    }

    /// How `v` is staged, or `None` where it is not (see the module docs).
    fn staging_plan(&mut self, tensor: usize, access: &[Access], v: &TV) -> R<Option<StagingPlan>> {
        // Free where no loop's buffers are live, or only those of a
        // pipeline running across the loop this store is in (the tile then
        // takes a region of its own beside them: see `overlays`).
        if !self.arch.is_nvidia() || self.buffered_loops > self.across_live {
            return Ok(None);
        }
        let t = self.tensor(tensor)?;
        let mem = t.mem;
        let esize: u32 = match mem {
            MemTy::F32 | MemTy::I32 | MemTy::U32 => 4,
            MemTy::BF16 | MemTy::F16 => 2,
            _ => return Ok(None),
        };
        let layout = &v.layout;
        if layout.shape.len() != 2 {
            return Ok(None);
        }
        let (rows, cols) = (layout.shape[0], layout.shape[1]);
        let inner = BOX_ROW_BYTES / esize;
        if rows % 8 != 0 || cols % inner != 0 || cols / inner > 32 {
            return Ok(None);
        }
        let box_bytes = rows * BOX_ROW_BYTES;
        let tile_bytes = box_bytes * (cols / inner);
        let fits = if self.across_live == 0 {
            tile_bytes <= self.arena_bytes()
        } else {
            u64::from(tile_bytes) + u64::from(self.arena_bytes())
                <= u64::from(self.arch.info().max_smem_per_block)
        };
        if !fits {
            return Ok(None);
        }
        // The widest vector every slot group fills (16 bytes at most).
        let mut vec = 16 / esize;
        while vec > 1
            && !Self::vector_groups(layout, vec)
                .iter()
                .all(|g| g.len() == vec as usize)
        {
            vec /= 2;
        }
        // The bytes of a row a warp's store instruction writes contiguously:
        // a thread's run, then the lanes that continue it. A run of a whole
        // 32-byte sector or more needs nothing better than the plain store.
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
        let Some(write) = box_access(layout, esize, vec, box_bytes) else {
            return Ok(None);
        };
        let out = match self.tma_box(tensor, access, esize, rows, cols)? {
            Some(box_dims) => Out::Tma { box_dims },
            None if mem == MemTy::BF16 => {
                let layout = Rc::new(Layout::blocked(
                    &[rows, cols],
                    self.num_warps,
                    self.warp_size,
                    8,
                ));
                match box_access(&layout, esize, 8, box_bytes) {
                    Some(read) => Out::ReadBack { layout, read },
                    None => return Ok(None),
                }
            }
            None => return Ok(None),
        };
        Ok(Some(StagingPlan {
            inner,
            boxes: cols / inner,
            box_bytes,
            write,
            out,
        }))
    }

    /// The box of the tensor map a TMA store of a `[rows, cols]` tile at
    /// `access` takes, innermost first, or `None` where TMA cannot store it.
    fn tma_box(
        &self,
        tensor: usize,
        access: &[Access],
        esize: u32,
        rows: u32,
        cols: u32,
    ) -> R<Option<Vec<u32>>> {
        if !self.feat.tma || access.is_empty() {
            return Ok(None);
        }
        // Strides of whole 16-byte units (TMA's), every dim but the last.
        let rank = access.len();
        let t = self.tensor(tensor)?;
        if t.stride_div[..rank - 1]
            .iter()
            .any(|d| !(d * u64::from(esize)).is_multiple_of(16))
        {
            return Ok(None);
        }
        if !matches!(access.last(), Some(Access::Range { .. })) {
            return Ok(None);
        }
        Ok(self.tma_box_dims(access, rows, cols, BOX_ROW_BYTES / esize))
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

/// Where the slots of `layout` (groups of `vec` elements of `esize` bytes)
/// land in boxes of `box_bytes` (128-byte rows), or `None` where a group
/// would straddle a box or a 16-byte chunk, or an address would not be one
/// of a few registers plus a constant.
fn box_access(layout: &Layout, esize: u32, vec: u32, box_bytes: u32) -> Option<BoxAccess> {
    let gb = vec * esize;
    // Column terms: whole boxes, or bytes within a box row; a term spanning
    // both (lanes along 256 columns) is split at the box.
    let (mut box_terms, mut byte_terms) = (Vec::new(), Vec::new());
    let mut byte_max = 0u32;
    for t in &layout.terms[1] {
        let b = t.mul * esize;
        if !b.is_power_of_two() {
            return None;
        }
        let mut t = *t;
        if b < BOX_ROW_BYTES {
            let within = (BOX_ROW_BYTES / b).trailing_zeros().min(u32::from(t.bits)) as u8;
            if within > 0 {
                if !b.is_multiple_of(gb) {
                    return None;
                }
                byte_max += ((1u32 << within) - 1) * b;
                byte_terms.push(Term {
                    shift: t.shift,
                    bits: within,
                    mul: b,
                });
            }
            if within == t.bits {
                continue;
            }
            t = Term {
                shift: t.shift + within,
                bits: t.bits - within,
                mul: t.mul << within,
            };
        }
        box_terms.push(Term {
            mul: t.mul * esize / BOX_ROW_BYTES * box_bytes,
            ..t
        });
    }
    let mut groups = Vec::new();
    for g in Lower::vector_groups(layout, vec) {
        if g.len() != vec as usize {
            return None;
        }
        let s = &layout.slots[g[0]];
        let (dr, dc) = (s[0], s[1]);
        let cb = dc * esize;
        let rb = cb % BOX_ROW_BYTES;
        let (rr, rc) = (rb % 16, rb / 16);
        // The group stays in one box and, aligned, in one 16-byte chunk.
        if byte_max + rb + gb > BOX_ROW_BYTES || rr % gb != 0 {
            return None;
        }
        let offset = i64::from(cb / BOX_ROW_BYTES * box_bytes + dr * BOX_ROW_BYTES);
        groups.push((g, (rr, rc, dr % 8), offset));
    }
    Some(BoxAccess {
        groups,
        box_terms,
        byte_terms,
    })
}
