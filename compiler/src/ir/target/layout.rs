//! Layouts: how the elements of a tile are spread over the threads of a block.
//!
//! Every layout here has one form. Along each axis `d`, the coordinate of the
//! element a thread holds in register slot `s` is
//!
//! ```text
//! coord[d] = sum over terms t of axis d: ((tid >> t.shift) & (2^t.bits - 1)) * t.mul
//!          + slots[s][d]
//! ```
//!
//! so a thread computes one base register per axis once and every slot is a
//! compile-time offset from it. Thread-id bits that appear in no term are
//! *replication* bits: threads that differ only there hold the same elements.
//! Blocked layouts (elementwise ops, loads, stores), their slices (reduction
//! results) and expanded/transposed forms are all of this form, and so are the
//! accumulator fragments of tensor-core instructions.

use std::fmt;

/// One bit field of the thread id, scaled: `((tid >> shift) & (2^bits - 1)) * mul`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Term {
    pub shift: u8,
    pub bits: u8,
    pub mul: u32,
}

/// How a layout was built (for dumps; the mapping is `terms` + `slots`).
/// How a matrix instruction's accumulator layout spreads warps over a dot's
/// result (see `Layout::warp_grid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WarpOrder {
    /// Warps along the rows first: each warp holds whole rows where the
    /// shape allows, for row reductions and chained dots.
    RowsFirst,
    /// The squarest warp tile: the least operand traffic per instruction.
    Square,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LayoutKind {
    /// A scalar: every thread holds the one value.
    Scalar,
    /// Each thread owns `size_per_thread` contiguous elements along each axis,
    /// lanes then warps tile the shape, the rest repeats.
    Blocked {
        size_per_thread: Vec<u32>,
        threads_per_warp: Vec<u32>,
        warps_per_block: Vec<u32>,
    },
    /// A layout with `axis` reduced away (kept as size 1 when `keepdims`).
    Slice { axis: usize, keepdims: bool },
    /// An axis of size 1 inserted.
    Expanded { axis: usize },
    /// The two axes of a 2-D layout swapped.
    Transposed,
    /// The accumulator of warp-level `m x n` matrix instructions: warps tile the
    /// shape `warps[0] x warps[1]`, each warp owning a contiguous block of
    /// `m`-by-`n` instruction tiles.
    Mma { warps: [u32; 2], instr: [u32; 2] },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub kind: LayoutKind,
    pub shape: Vec<u32>,
    /// Per axis, the thread-id terms of the base coordinate.
    pub terms: Vec<Vec<Term>>,
    /// Per register slot, the offset along each axis.
    pub slots: Vec<Vec<u32>>,
}

/// log2 of a power of two.
/// A thread-id term: `bits` bits from `shift`, times `mul`.
fn term(shift: u8, bits: u8, mul: u32) -> Term {
    Term { shift, bits, mul }
}

fn log2(n: u32) -> u8 {
    debug_assert!(n.is_power_of_two());
    n.trailing_zeros() as u8
}

/// The largest power of two dividing `n` that is at most `cap` (`n > 0`).
fn pow2_divisor(n: u32, cap: u32) -> u32 {
    let p = 1u32 << n.trailing_zeros().min(31);
    p.min(cap)
}

impl Layout {
    pub fn scalar() -> Layout {
        Layout {
            kind: LayoutKind::Scalar,
            shape: vec![],
            terms: vec![],
            slots: vec![vec![]],
        }
    }

    /// The default layout of a tile of `shape` over `num_warps` warps of `warp_size`
    /// lanes: up to `vec` contiguous elements per thread along the vector axis
    /// ([`Layout::vector_axis`]: the last, not counting trailing size-1 axes),
    /// lanes fill the axes from the last, warps from the first. Only powers of
    /// two that divide the dim are used, so any shape works (odd dims just
    /// repeat more).
    pub fn blocked(shape: &[u32], num_warps: u32, warp_size: u32, vec: u32) -> Layout {
        let rank = shape.len();
        if rank == 0 {
            return Layout::scalar();
        }
        let mut spt = vec![1u32; rank];
        let mut tpw = vec![1u32; rank];
        let mut wpb = vec![1u32; rank];
        let vd = Self::vector_axis_of(shape);
        spt[vd] = pow2_divisor(shape[vd].max(1), vec);
        let mut lanes = warp_size;
        for d in (0..rank).rev() {
            let t = pow2_divisor((shape[d].max(1)) / spt[d], lanes);
            tpw[d] = t;
            lanes /= t;
        }
        let mut warps = num_warps;
        for d in 0..rank {
            let w = pow2_divisor((shape[d].max(1)) / (spt[d] * tpw[d]), warps);
            wpb[d] = w;
            warps /= w;
        }
        // Thread-id bits: lanes from the last axis up, warps from the first axis.
        let mut terms = vec![Vec::new(); rank];
        let mut lane_bit = 0u8;
        for d in (0..rank).rev() {
            if tpw[d] > 1 {
                terms[d].push(Term {
                    shift: lane_bit,
                    bits: log2(tpw[d]),
                    mul: spt[d],
                });
                lane_bit += log2(tpw[d]);
            }
        }
        let mut warp_bit = log2(warp_size);
        for d in 0..rank {
            if wpb[d] > 1 {
                terms[d].push(Term {
                    shift: warp_bit,
                    bits: log2(wpb[d]),
                    mul: spt[d] * tpw[d],
                });
                warp_bit += log2(wpb[d]);
            }
        }
        // Slots: per axis the offsets rep * coverage + s, row-major over axes.
        let per_axis: Vec<Vec<u32>> = (0..rank)
            .map(|d| {
                let cov = spt[d] * tpw[d] * wpb[d];
                let reps = shape[d].max(1) / cov;
                (0..reps)
                    .flat_map(|r| (0..spt[d]).map(move |s| r * cov + s))
                    .collect()
            })
            .collect();
        let mut slots = vec![vec![]];
        for offs in &per_axis {
            let mut next = Vec::with_capacity(slots.len() * offs.len());
            for prefix in &slots {
                for &o in offs {
                    let mut s: Vec<u32> = prefix.clone();
                    s.push(o);
                    next.push(s);
                }
            }
            slots = next;
        }
        Layout {
            kind: LayoutKind::Blocked {
                size_per_thread: spt,
                threads_per_warp: tpw,
                warps_per_block: wpb,
            },
            shape: shape.to_vec(),
            terms,
            slots,
        }
    }

    /// The accumulator layout of `m16n8` matrix instructions over `num_warps`
    /// warps for a `[rows, cols]` result, if the shape tiles evenly: lane `l`
    /// holds rows `l / 4 (+8)` and columns `2 (l % 4) (+1)` of each 16x8 tile.
    pub fn mma_accumulator(
        rows: u32,
        cols: u32,
        num_warps: u32,
        order: WarpOrder,
    ) -> Option<Layout> {
        let lane = [vec![term(2, 3, 1)], vec![term(0, 2, 2)]];
        let tile = [(0, 0), (0, 1), (8, 0), (8, 1)];
        Self::warp_tiled([16, 8], [rows, cols], num_warps, order, 5, lane, &tile)
    }

    /// The accumulator layout of a wgmma GEMM whose warps hold `t` > 1
    /// 16-row tiles each (`rows` = 16 t `num_warps`, a multiple of 4 warps):
    /// `mma.m16n8`'s registers, but warp `w` of a warpgroup holds rows
    /// `64 j + 16 w ..` of its warpgroup's block of `64 t` rows in tile `j`,
    /// the rows the warpgroup's `j`-th m64 instruction gives it, so that
    /// instruction reads `a`'s rows `64 j ..` as they were copied. Its kind
    /// is `Mma` with the warps along the rows, but unlike
    /// [`Self::mma_accumulator`]'s a warp's rows are not contiguous (with one
    /// tile a warp the two map alike).
    pub fn wgmma_accumulator(rows: u32, cols: u32, num_warps: u32) -> Option<Layout> {
        if !num_warps.is_multiple_of(4)
            || !rows.is_multiple_of(16 * num_warps)
            || rows == 0
            || !cols.is_multiple_of(8)
            || cols == 0
        {
            return None;
        }
        let t = rows / (16 * num_warps);
        let mut t0 = vec![term(2, 3, 1), term(5, 2, 16)];
        if num_warps > 4 {
            t0.push(term(7, log2(num_warps / 4), 64 * t));
        }
        let t1 = vec![term(0, 2, 2)];
        let tile = [(0, 0), (0, 1), (8, 0), (8, 1)];
        let mut slots = Vec::new();
        for j in 0..t {
            for c in 0..cols / 8 {
                for &(dr, dc) in &tile {
                    slots.push(vec![64 * j + dr, 8 * c + dc]);
                }
            }
        }
        Some(Layout {
            kind: LayoutKind::Mma {
                warps: [num_warps, 1],
                instr: [16, 8],
            },
            shape: vec![rows, cols],
            terms: vec![t0, t1],
            slots,
        })
    }

    /// The accumulator layout of sm_70's `mma.m8n8k4` (f32 accumulators) for a
    /// `[rows, cols]` result, if the shape tiles evenly. Each instruction is four
    /// independent 8x8x4 products, one per quad-pair (lanes `4q..4q+3` and
    /// `4q+16..4q+19`); quad-pair bit 0 (lane bit 2) picks the row half and bit 1
    /// (lane bit 3) the column half of a 16x16 warp tile. Within a quad-pair's
    /// 8x8 tile (PTX ISA, "Matrix Fragments for mma.m8n8k4"), register `i` of
    /// lane `l` holds row `(l & 1) + (i & 2) + 4 (l >> 4 & 1)` and column
    /// `(l & 2) + (i & 1) + (i & 4)`.
    pub fn mma884_accumulator(
        rows: u32,
        cols: u32,
        num_warps: u32,
        order: WarpOrder,
    ) -> Option<Layout> {
        let lane = [
            vec![term(0, 1, 1), term(2, 1, 8), term(4, 1, 4)],
            vec![term(1, 1, 2), term(3, 1, 8)],
        ];
        let tile: Vec<(u32, u32)> = (0..8).map(|i| (i & 2, (i & 1) + (i & 4))).collect();
        Self::warp_tiled([16, 16], [rows, cols], num_warps, order, 5, lane, &tile)
    }

    /// The warp grid `[wm, wn]` over which `num_warps` warps tile a `[rows,
    /// cols]` result in `[im, in_]` instruction tiles, if it tiles evenly.
    /// [`WarpOrder::RowsFirst`] puts the warps along the rows first (as far
    /// as the tiles allow): every dot with the same row count then shares its
    /// row distribution, so row reductions and row broadcasts (softmax,
    /// attention) stay in registers. [`WarpOrder::Square`] gives each warp
    /// the squarest tile (least `tm + tn`, the operand rows and columns a
    /// warp reads per k step; ties go to more warps along the rows).
    fn warp_grid(
        rows: u32,
        cols: u32,
        [im, in_]: [u32; 2],
        num_warps: u32,
        order: WarpOrder,
    ) -> Option<[u32; 2]> {
        if !rows.is_multiple_of(im) || !cols.is_multiple_of(in_) || !num_warps.is_power_of_two() {
            return None;
        }
        let fits = |wm: u32, wn: u32| {
            (rows / wm).is_multiple_of(im)
                && rows / wm >= im
                && (cols / wn).is_multiple_of(in_)
                && cols / wn >= in_
        };
        match order {
            WarpOrder::RowsFirst => {
                let (mut wm, mut wn) = (1u32, 1u32);
                while wm * wn < num_warps {
                    if fits(wm * 2, wn) {
                        wm *= 2;
                    } else if fits(wm, wn * 2) {
                        wn *= 2;
                    } else {
                        return None;
                    }
                }
                Some([wm, wn])
            }
            WarpOrder::Square => (0..=num_warps.trailing_zeros())
                .rev()
                .map(|b| [1u32 << b, num_warps >> b])
                .filter(|&[wm, wn]| fits(wm, wn))
                .min_by_key(|&[wm, wn]| rows / wm + cols / wn),
        }
    }

    /// The `Mma` layout of `instr` tiles over `num_warps` warps of `1 <<
    /// lane_bits` lanes for a `[rows, cols]` result, if the shape tiles
    /// evenly (the warp grid `[wm, wn]` of [`Self::warp_grid`]): `lane` holds
    /// the row and column terms of a warp's lanes, the warp id (the thread
    /// id's bits from `lane_bits`) steps a warp tile `[rows / wm, cols / wn]`
    /// along the rows, then the columns, and a thread holds, in each
    /// instruction tile of its warp tile (row-major), the elements at offsets
    /// `tile` from the tile's origin plus its lane terms, in order.
    fn warp_tiled(
        instr: [u32; 2],
        [rows, cols]: [u32; 2],
        num_warps: u32,
        order: WarpOrder,
        lane_bits: u8,
        [mut t0, mut t1]: [Vec<Term>; 2],
        tile: &[(u32, u32)],
    ) -> Option<Layout> {
        let [wm, wn] = Self::warp_grid(rows, cols, instr, num_warps, order)?;
        let (tm, tn) = (rows / wm, cols / wn);
        if wm > 1 {
            t0.push(term(lane_bits, log2(wm), tm));
        }
        if wn > 1 {
            t1.push(term(lane_bits + log2(wm), log2(wn), tn));
        }
        let [im_, in_] = instr;
        let mut slots = Vec::new();
        for im in 0..tm / im_ {
            for jn in 0..tn / in_ {
                for &(dr, dc) in tile {
                    slots.push(vec![im_ * im + dr, in_ * jn + dc]);
                }
            }
        }
        Some(Layout {
            kind: LayoutKind::Mma {
                warps: [wm, wn],
                instr,
            },
            shape: vec![rows, cols],
            terms: vec![t0, t1],
            slots,
        })
    }

    /// The accumulator layout of AMD CDNA's MFMA instructions of one block
    /// of `instr` = 32x32 (`v_mfma_f32_32x32x{8,2,16}*`) or 16x16
    /// (`v_mfma_f32_16x16x{16,4,32}*`), 64-lane waves, for a `[rows, cols]`
    /// result over `num_warps` waves, if the shape tiles evenly. Per the CDNA3
    /// ISA guide's MFMA output maps, lane `l` holds column `l % 32` and, in
    /// accumulator `i`, row `8 (i / 4) + 4 (l / 32) + i % 4` of each 32x32
    /// tile; or column `l % 16` and row `4 (l / 16) + i` of each 16x16 tile.
    pub fn mfma_accumulator(
        instr: [u32; 2],
        rows: u32,
        cols: u32,
        num_warps: u32,
        order: WarpOrder,
    ) -> Option<Layout> {
        let (lane, tile): (_, Vec<(u32, u32)>) = if instr == [32, 32] {
            let lane = [vec![term(5, 1, 4)], vec![term(0, 5, 1)]];
            (lane, (0..16).map(|i| (8 * (i / 4) + i % 4, 0)).collect())
        } else {
            let lane = [vec![term(4, 2, 4)], vec![term(0, 4, 1)]];
            (lane, (0..4).map(|i| (i, 0)).collect())
        };
        Self::warp_tiled(instr, [rows, cols], num_warps, order, 6, lane, &tile)
    }

    /// The accumulator layout of RDNA3's `v_wmma_f32_16x16x16_*` (wave32) for
    /// a `[rows, cols]` result over `num_warps` waves, if the shape tiles
    /// evenly. Per the RDNA3 ISA guide, accumulator `i` of lane `l` holds
    /// column `l % 16` and row `2 i + l / 16` of each 16x16 tile.
    pub fn wmma_accumulator(
        rows: u32,
        cols: u32,
        num_warps: u32,
        order: WarpOrder,
    ) -> Option<Layout> {
        let lane = [vec![term(4, 1, 1)], vec![term(0, 4, 1)]];
        let tile: Vec<(u32, u32)> = (0..8).map(|i| (2 * i, 0)).collect();
        Self::warp_tiled([16, 16], [rows, cols], num_warps, order, 5, lane, &tile)
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The axis along which a thread's elements are contiguous in a row-major
    /// tensor: the last one of size above 1 (a `[K, 1]` tile, as whole-tensor
    /// functions make for a reduced axis, is contiguous along `K`), or the
    /// last axis when every axis has size 1. `None` for a scalar.
    pub fn vector_axis(&self) -> Option<usize> {
        (self.rank() > 0).then(|| Self::vector_axis_of(&self.shape))
    }

    fn vector_axis_of(shape: &[u32]) -> usize {
        shape
            .iter()
            .rposition(|&d| d > 1)
            .unwrap_or(shape.len().saturating_sub(1))
    }

    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// The mask of thread-id bits (below `2^tid_bits`) that no term uses.
    pub fn replication_mask(&self, tid_bits: u8) -> u32 {
        let mut used = 0u32;
        for t in self.terms.iter().flatten() {
            used |= ((1u32 << t.bits) - 1) << t.shift;
        }
        let all = if tid_bits >= 32 {
            u32::MAX
        } else {
            (1u32 << tid_bits) - 1
        };
        all & !used
    }

    /// The index of the slot with these offsets.
    pub fn find_slot(&self, offsets: &[u32]) -> Option<usize> {
        self.slots.iter().position(|s| s == offsets)
    }

    /// `axis` reduced away (or kept as size 1).
    pub fn slice(&self, axis: usize, keepdims: bool) -> Layout {
        let mut shape = self.shape.clone();
        let mut terms = self.terms.clone();
        let mut slots: Vec<Vec<u32>> = Vec::new();
        for s in &self.slots {
            let mut s = s.clone();
            if keepdims {
                s[axis] = 0;
            } else {
                s.remove(axis);
            }
            if !slots.contains(&s) {
                slots.push(s);
            }
        }
        if keepdims {
            shape[axis] = 1;
            terms[axis].clear();
        } else {
            shape.remove(axis);
            terms.remove(axis);
        }
        Layout {
            kind: if shape.is_empty() {
                LayoutKind::Scalar
            } else {
                LayoutKind::Slice { axis, keepdims }
            },
            shape,
            terms,
            slots,
        }
    }

    /// A size-1 axis inserted at `axis`.
    pub fn expand(&self, axis: usize) -> Layout {
        let mut shape = self.shape.clone();
        let mut terms = self.terms.clone();
        shape.insert(axis, 1);
        terms.insert(axis, Vec::new());
        let slots = self
            .slots
            .iter()
            .map(|s| {
                let mut s = s.clone();
                s.insert(axis, 0);
                s
            })
            .collect();
        Layout {
            kind: LayoutKind::Expanded { axis },
            shape,
            terms,
            slots,
        }
    }

    /// The two axes of a 2-D layout swapped.
    pub fn transpose(&self) -> Layout {
        let mut shape = self.shape.clone();
        shape.swap(0, 1);
        let mut terms = self.terms.clone();
        terms.swap(0, 1);
        let slots = self
            .slots
            .iter()
            .map(|s| vec![s[1], s[0]])
            .collect::<Vec<_>>();
        Layout {
            kind: LayoutKind::Transposed,
            shape,
            terms,
            slots,
        }
    }

    /// This layout with the axes listed in `collapse` (size > 1 here) reduced to
    /// size 1 — the layout a size-1 tile must have so that broadcasting it to this
    /// layout needs no data movement.
    pub fn collapsed(&self, collapse: &[usize]) -> Layout {
        let mut l = self.clone();
        for &a in collapse {
            l = l.slice(a, true);
        }
        l
    }

    /// Whether a tile in layout `self` can be broadcast (size-1 axes repeated, or
    /// a plain re-indexing) into `to` without moving data between threads; if so,
    /// the source slot for each target slot.
    pub fn register_map_to(&self, to: &Layout) -> Option<Vec<usize>> {
        if self.rank() != to.rank() {
            return None;
        }
        for d in 0..self.rank() {
            if self.shape[d] == to.shape[d] {
                if self.terms[d] != to.terms[d] {
                    return None;
                }
            } else if self.shape[d] != 1 || !self.terms[d].is_empty() {
                return None;
            }
        }
        to.slots
            .iter()
            .map(|s| {
                let src: Vec<u32> = s
                    .iter()
                    .enumerate()
                    .map(|(d, &o)| if self.shape[d] == 1 { 0 } else { o })
                    .collect();
                self.find_slot(&src)
            })
            .collect()
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[u32]| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        match &self.kind {
            LayoutKind::Scalar => return write!(f, "scalar"),
            LayoutKind::Blocked {
                size_per_thread,
                threads_per_warp,
                warps_per_block,
            } => write!(
                f,
                "blocked<spt=[{}] tpw=[{}] wpb=[{}]>",
                list(size_per_thread),
                list(threads_per_warp),
                list(warps_per_block)
            )?,
            LayoutKind::Slice { axis, keepdims } => write!(
                f,
                "slice<axis={axis}{}>",
                if *keepdims { " keepdims" } else { "" }
            )?,
            LayoutKind::Expanded { axis } => write!(f, "expanded<axis={axis}>")?,
            LayoutKind::Transposed => write!(f, "transposed")?,
            LayoutKind::Mma { warps, instr } => write!(
                f,
                "mma<warps={}x{} instr={}x{}>",
                warps[0], warps[1], instr[0], instr[1]
            )?,
        }
        write!(f, "[{}] {{", list(&self.shape))?;
        for (d, ts) in self.terms.iter().enumerate() {
            if d > 0 {
                write!(f, "; ")?;
            }
            let parts: Vec<String> = ts
                .iter()
                .map(|t| format!("tid[{}+{}]*{}", t.shift, t.bits, t.mul))
                .collect();
            write!(
                f,
                "{}",
                if parts.is_empty() {
                    "0".to_string()
                } else {
                    parts.join("+")
                }
            )?;
        }
        write!(f, "}} x{} slots", self.slots.len())
    }
}
