//! Layout assignment and layout exchange: the default blocked layout of a
//! shape, the per-thread base coordinates of a layout's terms (computed once,
//! in the prologue, and cached), and moving a tile between layouts.
//!
//! A conversion that keeps every element in the thread that holds it only
//! re-indexes registers; one that moves data between threads goes through the
//! shared scratch region (store, barrier, load, barrier). The scratch region is
//! one buffer at offset 0 of the arena, grown to the largest request of any
//! user (exchanges, cross-warp reductions, FMA and tf32 dot operands).

use std::collections::HashMap;
use std::rc::Rc;

use super::{Lower, R, TV};
use crate::check::DType;
use crate::ir::target::layout::{Layout, Term};
use crate::ir::target::{BinOp, CmpOp, Inst, MemTy, Operand, Reg, RegTy, SmemBuffer, Space};
use crate::ir::tile::{self, OpKind};

impl<'a> Lower<'a> {
    pub(super) fn blocked(&self, shape: &[u32]) -> Rc<Layout> {
        // A tile too small to give every thread a whole run keeps runs of 4
        // rather than leave more threads idle.
        let numel: u64 = shape.iter().map(|&d| d as u64).product();
        let threads = (self.num_warps * self.warp_size) as u64;
        let vec = if numel >= threads * self.vec_elems as u64 {
            self.vec_elems
        } else {
            self.vec_elems.min(4)
        };
        Rc::new(Layout::blocked(shape, self.num_warps, self.warp_size, vec))
    }

    /// The run of contiguous elements a thread gets in the default layout of
    /// a large tile: 16 bytes of the kernel's bf16 tensors (8 elements, one
    /// vector access per run), else 4 elements (16 bytes of f32). Kernels
    /// with a `dot` keep 4: their operand layouts are built around it.
    pub(super) fn default_vector_elems(&self) -> u32 {
        fn has_dot(r: &tile::Region) -> bool {
            r.ops.iter().any(|op| {
                matches!(op.kind, tile::OpKind::Dot { .. })
                    || op.kind.regions().into_iter().any(has_dot)
            })
        }
        let bf16 = self.tensors.iter().flatten().any(|t| t.mem == MemTy::BF16);
        if bf16 && !has_dot(&self.tk.body) {
            8
        } else {
            4
        }
    }

    /// The per-thread base coordinate for a list of terms (computed once, in the prologue).
    pub(super) fn base(&mut self, terms: &[Term]) -> Operand {
        if terms.is_empty() {
            return Operand::Int(0);
        }
        if let Some(r) = self.base_cache.get(terms) {
            return Operand::Reg(*r);
        }
        let saved = std::mem::replace(&mut self.blocks, vec![Vec::new()]);
        let mut acc = Operand::Int(0);
        for t in terms {
            let mut v = Operand::Reg(self.tid);
            if t.shift > 0 {
                v = self.bin(BinOp::Shr, RegTy::I32, v, Operand::Int(t.shift as i64));
            }
            let mask = (1i64 << t.bits) - 1;
            if t.shift as u32 + t.bits as u32 != self.tid_bits as u32 {
                v = self.bin(BinOp::And, RegTy::I32, v, Operand::Int(mask));
            }
            if t.mul > 1 {
                v = if t.mul.is_power_of_two() {
                    self.bin(
                        BinOp::Shl,
                        RegTy::I32,
                        v,
                        Operand::Int(t.mul.trailing_zeros() as i64),
                    )
                } else {
                    self.bin(BinOp::Mul, RegTy::I32, v, Operand::Int(t.mul as i64))
                };
            }
            acc = self.bin(BinOp::Add, RegTy::I32, acc, v);
        }
        let acc = self.materialize(RegTy::I32, acc);
        let code = std::mem::replace(&mut self.blocks, saved)
            .pop()
            .unwrap_or_default();
        self.prologue.extend(code);
        if let Operand::Reg(r) = acc {
            self.base_cache.insert(terms.to_vec(), r);
        }
        acc
    }

    /// The row-major linear index of a thread's base element within `shape`.
    pub(super) fn linear_base(&mut self, layout: &Layout) -> Operand {
        let strides = row_major(&layout.shape);
        let mut acc = Operand::Int(0);
        for (terms, stride) in layout.terms.iter().zip(strides) {
            let b = self.base(terms);
            let t = self.bin(BinOp::Mul, RegTy::I32, b, Operand::Int(stride as i64));
            acc = self.bin(BinOp::Add, RegTy::I32, acc, t);
        }
        acc
    }

    pub(super) fn reserve_scratch(&mut self, bytes: u32) {
        match self.scratch {
            Some(i) => self.buffers[i].bytes = self.buffers[i].bytes.max(bytes),
            None => {
                self.scratch = Some(self.buffers.len());
                self.buffers.push(SmemBuffer {
                    name: "scratch".into(),
                    offset: 0,
                    bytes,
                    align: 16,
                    purpose: "layout conversions, cross-warp reductions, FMA dot operands".into(),
                    swizzle: None,
                });
            }
        }
    }

    pub(super) fn scratch_addr(&mut self) -> Reg {
        let dst = self.new_reg(RegTy::U32);
        let buffer = self.scratch.expect("reserve_scratch first");
        self.emit(Inst::SmemAddr { dst, buffer });
        dst
    }

    /// Moves a tile into layout `to` (same shape), through shared memory when
    /// threads must exchange elements.
    pub(super) fn convert(&mut self, v: &TV, to: &Rc<Layout>) -> R<TV> {
        if *v.layout == **to {
            return Ok(v.clone());
        }
        // A uniform tile (a splat) is the same value in every slot of any layout.
        if self.is_splat(v) && v.layout.shape == to.shape {
            return Ok(TV {
                layout: to.clone(),
                ops: vec![v.ops[0]; to.num_slots()],
                ty: v.ty,
                dtype: v.dtype,
            });
        }
        if let Some(map) = v.layout.register_map_to(to) {
            if v.layout.shape == to.shape {
                return Ok(TV {
                    layout: to.clone(),
                    ops: map.iter().map(|&i| v.ops[i]).collect(),
                    ty: v.ty,
                    dtype: v.dtype,
                });
            }
        }
        self.emit(Inst::Comment(format!(
            "convert layout {} -> {}",
            v.layout, to
        )));
        let rank = to.rank();
        self.exchange(v, to, &(0..rank).collect::<Vec<_>>(), &vec![0; rank])
    }

    /// Moves elements of `v` through shared memory into layout `to`: element
    /// `c` of the result is element `e` of `v`, where `e[src_axis[r]] = c[r] +
    /// offset[src_axis[r]]` for each axis `r` of the result and `e[a] =
    /// offset[a]` on the axes of `v` no result axis maps to.
    pub(super) fn exchange(
        &mut self,
        v: &TV,
        to: &Rc<Layout>,
        src_axis: &[usize],
        offset: &[u32],
    ) -> R<TV> {
        // A predicate moves as a byte: the scratch buffer is sized by the
        // largest exchange, and a mask's is then a quarter.
        let (ety, bytes) = match v.ty {
            RegTy::Pred => (RegTy::U32, 1u32),
            RegTy::I32 | RegTy::U32 | RegTy::B32 => (RegTy::U32, 4),
            RegTy::F32 => (RegTy::F32, 4),
            RegTy::I64 | RegTy::U64 => (RegTy::U64, 8),
            RegTy::F64 => (RegTy::F64, 8),
            RegTy::B16 => return self.unsupported("a layout conversion of raw 16-bit values"),
        };
        let mem = match ety {
            RegTy::U32 if bytes == 1 => MemTy::U8,
            RegTy::U32 => MemTy::U32,
            RegTy::F32 => MemTy::F32,
            RegTy::U64 => MemTy::I64,
            _ => MemTy::F64,
        };
        let n: u64 = v.layout.shape.iter().map(|&d| d as u64).product();
        self.reserve_scratch((n * bytes as u64) as u32);
        let strides = row_major(&v.layout.shape);
        let smem = self.scratch_addr();
        // Store every slot at its element.
        let lb = self.linear_base(&v.layout.clone());
        let off = self.bin(BinOp::Mul, RegTy::I32, lb, Operand::Int(bytes as i64));
        let addr = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), off);
        let addr = self.materialize(RegTy::U32, addr).reg().expect("reg");
        for (s, op) in v.layout.slots.clone().iter().zip(v.ops.clone()) {
            let lin: u64 = s.iter().zip(&strides).map(|(&o, &st)| o as u64 * st).sum();
            let src = if v.ty == RegTy::Pred {
                self.select(RegTy::U32, op, Operand::Int(1), Operand::Int(0))
            } else {
                op
            };
            self.emit(Inst::St {
                stream: false,
                space: Space::Shared,
                mem,
                src: vec![src],
                addr,
                offset: (lin * bytes as u64) as i64,
                pred: None,
            });
        }
        self.emit(Inst::Barrier);
        // The thread's base element of `to`, as a linear index into `v`.
        let mut lb = Operand::Int(0);
        for (r, terms) in to.terms.clone().iter().enumerate() {
            let b = self.base(terms);
            let t = self.bin(
                BinOp::Mul,
                RegTy::I32,
                b,
                Operand::Int(strides[src_axis[r]] as i64),
            );
            lb = self.bin(BinOp::Add, RegTy::I32, lb, t);
        }
        let fixed: u64 = offset
            .iter()
            .zip(&strides)
            .map(|(&o, &st)| o as u64 * st)
            .sum();
        let off = self.bin(BinOp::Mul, RegTy::I32, lb, Operand::Int(bytes as i64));
        let addr = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), off);
        let addr = self.materialize(RegTy::U32, addr).reg().expect("reg");
        let mut ops = Vec::new();
        for s in to.slots.clone() {
            let lin: u64 = fixed
                + s.iter()
                    .enumerate()
                    .map(|(r, &o)| o as u64 * strides[src_axis[r]])
                    .sum::<u64>();
            let dst = self.new_reg(ety);
            self.emit(Inst::Ld {
                stream: false,
                space: Space::Shared,
                mem,
                dst: vec![dst],
                addr,
                offset: (lin * bytes as u64) as i64,
                pred: None,
            });
            let r = if v.ty == RegTy::Pred {
                self.cmp(CmpOp::Ne, RegTy::U32, Operand::Reg(dst), Operand::Int(0))
            } else if v.ty != ety {
                let d2 = self.new_reg(v.ty);
                self.emit(Inst::Mov {
                    dst: d2,
                    src: Operand::Reg(dst),
                });
                Operand::Reg(d2)
            } else {
                Operand::Reg(dst)
            };
            ops.push(r);
        }
        self.emit(Inst::Barrier);
        Ok(TV {
            layout: to.clone(),
            ops,
            ty: v.ty,
            dtype: v.dtype,
        })
    }
}

/// How deep `remat` follows the operands of index arithmetic.
const REMAT_DEPTH: u32 = 8;

/// Index arithmetic recomputed in another layout: an `arange` holds
/// `start + c` at coordinate `c`, which any layout can compute from its own
/// thread terms and slots; expansions and broadcasts only map coordinates,
/// and integer ops and comparisons over such values (or over splats) follow
/// (Triton rematerialises such slices too). A causal or bounds mask then
/// costs arithmetic in the layout of the tile it masks, not a round trip
/// through shared memory.
impl<'a> Lower<'a> {
    /// `v` in layout `to`: recomputed where it is index arithmetic, else
    /// converted.
    pub(super) fn val_in(&mut self, v: tile::Value, to: &Rc<Layout>) -> R<TV> {
        let tv = self.val(v);
        if *tv.layout != **to && tv.layout.shape == to.shape && self.can_remat(v, 0) {
            let axes: Vec<Option<usize>> = (0..to.rank()).map(Some).collect();
            let mut offsets = HashMap::new();
            if let Some(ops) = self.remat(v, to, &axes, &mut offsets) {
                return Ok(TV {
                    layout: to.clone(),
                    ops,
                    ty: tv.ty,
                    dtype: tv.dtype,
                });
            }
        }
        // A broadcast tile is broadcast again from its source into `to`:
        // only the source's elements move (a bias row, not the whole tile
        // of its copies through shared memory).
        if let Some(OpKind::Broadcast { x, .. }) = self.index_ops.get(&v).cloned() {
            let src = self.val(x);
            if *tv.layout != **to
                && super::elementwise::broadcast_source_layout(&src.layout, to).is_some()
            {
                return self.broadcast(&src, to);
            }
        }
        self.convert(&tv, to)
    }

    /// Whether `remat` can recompute `v`.
    fn can_remat(&self, v: tile::Value, depth: u32) -> bool {
        if depth > REMAT_DEPTH {
            return false;
        }
        let tv = self.val(v);
        if self.is_splat(&tv) {
            return true;
        }
        match self.index_ops.get(&v) {
            // (Its start is an SSA value, so the register holding it holds
            // it wherever `v` is used: a loop's registers change only
            // between iterations.)
            Some(OpKind::Arange { .. }) => true,
            Some(OpKind::ExpandDims { x, .. } | OpKind::Broadcast { x, .. }) => {
                self.can_remat(*x, depth + 1)
            }
            Some(OpKind::Binary { a, b, .. }) => {
                matches!(self.tk.ty(v).dtype(), DType::I32 | DType::Bool)
                    && self.can_remat(*a, depth + 1)
                    && self.can_remat(*b, depth + 1)
            }
            _ => false,
        }
    }

    /// `v`'s value at each slot of `to`, where `axes[k]` is the axis of `to`
    /// that gives `v`'s coordinate along its axis `k` (None: always 0).
    /// `offsets` shares `start + coordinate` registers between slots.
    fn remat(
        &mut self,
        v: tile::Value,
        to: &Rc<Layout>,
        axes: &[Option<usize>],
        offsets: &mut HashMap<(tile::Value, Option<usize>, u32), Operand>,
    ) -> Option<Vec<Operand>> {
        let tv = self.val(v);
        if self.is_splat(&tv) {
            return Some(vec![tv.ops[0]; to.num_slots()]);
        }
        match self.index_ops.get(&v).cloned()? {
            OpKind::Arange { start, .. } => {
                let s = self.scalar(start);
                let Some(d) = axes[0] else {
                    return Some(vec![s; to.num_slots()]);
                };
                let b = self.base(&to.terms[d].clone());
                let sb = self.bin(BinOp::Add, RegTy::I32, s, b);
                let sb = self.materialize(RegTy::I32, sb);
                let mut ops = Vec::with_capacity(to.num_slots());
                for slot in to.slots.clone() {
                    let key = (start, Some(d), slot[d]);
                    let o = match offsets.get(&key) {
                        Some(o) => *o,
                        None => {
                            let o =
                                self.bin(BinOp::Add, RegTy::I32, sb, Operand::Int(slot[d] as i64));
                            offsets.insert(key, o);
                            o
                        }
                    };
                    ops.push(o);
                }
                Some(ops)
            }
            OpKind::ExpandDims { x, axis } => {
                let mut inner = axes.to_vec();
                inner.remove(axis);
                self.remat(x, to, &inner, offsets)
            }
            OpKind::Broadcast { x, .. } => {
                let from = self.tk.ty(x).shape().to_vec();
                let own = self.tk.ty(v).shape().to_vec();
                let inner: Vec<Option<usize>> = (0..axes.len())
                    .map(|k| {
                        if from[k] == 1 && own[k] != 1 {
                            None
                        } else {
                            axes[k]
                        }
                    })
                    .collect();
                self.remat(x, to, &inner, offsets)
            }
            OpKind::Binary { op, a, b } => {
                let ra = self.remat(a, to, axes, offsets)?;
                let rb = self.remat(b, to, axes, offsets)?;
                let (ta, da) = (self.val(a).ty, self.val(a).dtype);
                let mut ops = Vec::with_capacity(ra.len());
                let mut seen = super::ops::SlotMemo::default();
                for (&x, &y) in ra.iter().zip(&rb) {
                    let v = seen.get_or_insert_with(&[x, y], || self.binary(op, ta, da, x, y));
                    ops.push(v.ok()?);
                }
                Some(ops)
            }
            _ => None,
        }
    }
}

pub(super) fn row_major(shape: &[u32]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1] as u64;
    }
    s
}

#[cfg(test)]
mod tests {
    use crate::ir::target::tests::{lower_source, stores};
    use crate::ir::target::{BinOp, Inst, Kernel, MemTy, Space};
    use crate::ir::tile::Specialization;
    use crate::target::Arch;

    // A mask made in the default layout and read in the dot's: `MASK` is
    // index arithmetic (a bounds mask) or a comparison of loaded data.
    const MASKED: &str = "@kernel(grid=(1,), num_warps=4)
def masked(q: Tensor[64, 64, bf16], k: Tensor[\"N\", 64, bf16], m: Tensor[64, 64, f32], o: Tensor[64, 64, f32]):
    s = dot(load(q[0:64, :]), load(k[0:64, :], other=0.0).T)
    store(o[0:64, :], where(MASK, s, 0.0))
";

    fn lowered(mask: &str) -> Kernel {
        lower_source(
            &MASKED.replace("MASK", mask),
            Arch::default(),
            Specialization::new(),
        )
    }

    /// The memory types of `k`'s shared-memory stores (its layout exchanges).
    fn exchange_stores(k: &Kernel) -> Vec<MemTy> {
        stores(k, Space::Shared)
            .into_iter()
            .map(|(m, _)| m)
            .collect()
    }

    #[test]
    fn index_masks_are_recomputed_in_the_layout_they_are_read_in() {
        let k = lowered("arange(0, 64)[None, :] < N");
        assert!(k.smem.iter().all(|b| b.name != "scratch"), "{:?}", k.smem);
        assert_eq!(exchange_stores(&k), vec![]);
        let k = lowered("arange(0, 64)[:, None] >= arange(0, 64)[None, :] + N");
        assert_eq!(exchange_stores(&k), vec![]);
    }

    /// A [2, 64] tile over one warp puts its rows on lanes 0-15 and 16-31, so a
    /// row sum lives in a one-slot slice layout: equal registers in a thread,
    /// a different row per half-warp. `1.0 / sum` once took it for a splat,
    /// divided in a replicated [2, 1] layout with this thread's row in both
    /// rows' slots and wrote both back (every row got one half-warp's sum on
    /// the GPU). The splat now takes the row sum's layout: one division a
    /// thread, no exchange.
    #[test]
    fn a_splat_and_a_row_statistic_combine_in_the_statistic_layout() {
        let k = lower_source(
            "@kernel(grid=(cdiv(M, 2),), num_warps=1)
def two_rows(x: Tensor[\"M\", 64, f32], out: Tensor[\"M\", 64, f32]):
    r = program_id(0) * 2
    e = exp(load(x[r : r + 2, 0 : 64]))
    store(out[r : r + 2, 0 : 64], e * (1.0 / sum(e, axis=1, keepdims=True)))
",
            Arch::default(),
            Specialization::new(),
        );
        let mut divs = 0;
        k.walk(&mut |i| {
            if matches!(i, Inst::Binary { op: BinOp::Div, .. }) {
                divs += 1;
            }
        });
        assert_eq!(divs, 1);
        assert_eq!(exchange_stores(&k), vec![]);
    }

    #[test]
    fn other_masks_change_layout_a_byte_an_element() {
        let k = lowered("load(m[0:64, :]) > 0.0");
        let scratch = k
            .smem
            .iter()
            .find(|b| b.name == "scratch")
            .expect("an exchange");
        assert_eq!(scratch.bytes, 64 * 64);
        // 64x64 over 128 threads.
        assert_eq!(exchange_stores(&k), vec![MemTy::U8; 32]);
    }
}
