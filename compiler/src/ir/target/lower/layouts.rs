//! Layout assignment and layout exchange: the default blocked layout of a
//! shape, the per-thread base coordinates of a layout's terms (computed once,
//! in the prologue, and cached), and moving a tile between layouts.
//!
//! A conversion that keeps every element in the thread that holds it only
//! re-indexes registers; one that moves data between threads goes through the
//! shared scratch region (store, barrier, load, barrier). The scratch region is
//! one buffer at offset 0 of the arena, grown to the largest request of any
//! user (exchanges, cross-warp reductions, FMA and tf32 dot operands).

use std::rc::Rc;

use super::{Lower, R, TV};
use crate::ir::target::layout::{Layout, Term};
use crate::ir::target::{BinOp, CmpOp, Inst, MemTy, Operand, Reg, RegTy, SmemBuffer, Space};
use crate::ir::tile;

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
        if !v.ops.is_empty() && v.ops.iter().all(|o| *o == v.ops[0]) && v.layout.shape == to.shape {
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
        let (ety, bytes) = match v.ty {
            RegTy::Pred | RegTy::I32 | RegTy::U32 | RegTy::B32 => (RegTy::U32, 4u32),
            RegTy::F32 => (RegTy::F32, 4),
            RegTy::I64 | RegTy::U64 => (RegTy::U64, 8),
            RegTy::F64 => (RegTy::F64, 8),
            RegTy::B16 => return self.unsupported("a layout conversion of raw 16-bit values"),
        };
        let mem = match ety {
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

pub(super) fn row_major(shape: &[u32]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1] as u64;
    }
    s
}
