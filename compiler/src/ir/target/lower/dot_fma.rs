//! `dot`: the entry point that picks the unit (`mma::*` where a tensor-core
//! layout fits, in the order m16n8k16/m16n8k8, tf32, m8n8k4), and the FMA path
//! for every other dot (f32, f64, bf16 before sm_80, shapes the warps cannot
//! tile).
//!
//! The FMA path stages both operands in shared memory (A row-major `[m, k]`,
//! B `[k, n]`) and accumulates per k step in the blocked layout of the result;
//! a tf32 dot without tf32 tensor cores rounds its operands to tf32 first, so
//! it means the same on every target.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::rc::Rc;

use super::layouts::row_major;
use super::{Lower, R, TV};
use crate::check::DType;
use crate::ir::target::layout::Layout;
use crate::ir::target::{BinOp, Inst, MemTy, Operand, Reg, RegTy, Space};
use crate::ir::tile::{self, Value};
use crate::target::MmaFeed;

impl<'a> Lower<'a> {
    pub(super) fn dot(
        &mut self,
        res: Value,
        a: Value,
        b: Value,
        acc: Option<Value>,
        precision: tile::Precision,
    ) -> R<TV> {
        let shape = self.tk.ty(res).shape().to_vec();
        let (m, n) = (shape[0], shape[1]);
        let k = self.tk.ty(a).shape()[1];
        if let Some(i) = self.wgmma.iter().position(|w| w.a == a && w.b == b) {
            self.wgmma.remove(i);
            let dtype = self.tk.ty(a).dtype();
            return self.dot_wgmma(a, b, acc, [m, n, k], dtype);
        }
        if let Some(d) = self
            .wgmma_waited
            .iter()
            .find(|w| w.a == a && w.b == b)
            .copied()
        {
            let dtype = self.tk.ty(a).dtype();
            return self.dot_wgmma_waited(d, acc, [m, n, k], dtype);
        }
        let layout = self.blocked(&shape);
        let av = self.val(a);
        let bv = self.val(b);
        // f64 tiles take the FMA path in f64 (`fma.rn.f64`): f64 precision
        // is what they are for, and the FMA units hold it exactly.
        let f64_dot = av.ty == RegTy::F64 && bv.ty == RegTy::F64;
        if !f64_dot && (av.ty != RegTy::F32 || bv.ty != RegTy::F32) {
            return self.unsupported(format!("`dot` on {}", av.dtype.name()));
        }
        let (rt, mt, es, out_dt) = if f64_dot {
            (RegTy::F64, MemTy::F64, 8u32, DType::F64)
        } else {
            (RegTy::F32, MemTy::F32, 4u32, DType::F32)
        };
        if let Some((inst, acc_layout)) = self.mma_plan(av.dtype, bv.dtype, [m, n, k], precision) {
            return match inst.feed {
                MmaFeed::Ldmatrix => self.dot_mma(a, b, &av, &bv, acc, acc_layout, k, inst),
                MmaFeed::Tf32Fragments => self.dot_tf32(&av, &bv, acc, acc_layout, k),
                MmaFeed::SharedPairs => self.dot_mma884(&av, &bv, acc, acc_layout, k),
                MmaFeed::Registers => {
                    self.dot_amd([a, b], &av, &bv, acc, acc_layout, k, inst, precision)
                }
            };
        }
        // f8 dots reach the tensor cores only on wgmma's terms: say so where
        // one misses them on a target that has them.
        if self.feat.wgmma && av.dtype.bytes() == 1 && av.dtype.is_float() {
            self.notes.push(super::super::Note {
                code: "W0008",
                span: self.span,
                label: "f8 dot on FMA units",
                message: format!(
                    "this {} `dot` runs on FMA units: on {} f8 dots take the tensor cores (wgmma) only in a pipelined loop",
                    av.dtype.name(),
                    self.arch
                ),
                help: "make it the only `dot` of a `for` loop over K (num_stages >= 3, BM = 16, 32, 48 or 64 x num_warps, BN a multiple of 64 up to 256, BK 64 or 128) with `a` loaded as `A[m0 : m0 + BM, k : k + BK]` and `b` given as [N, K], `load(Bt[n0 : n0 + BN, k : k + BK]).T`, each row's start 16-byte aligned (`-D K%16`, or the launch's run-time facts)".to_string(),
            });
        }
        self.emit(Inst::Comment(format!(
            "dot [{m},{k}] x [{k},{n}] with FMAs, {layout}"
        )));
        // Accumulator registers (written by every k step).
        let init = self.acc_operands(acc, &layout)?;
        let accs: Vec<Reg> = init
            .iter()
            .map(|&o| {
                let dst = self.new_reg(rt);
                self.emit(Inst::Mov { dst, src: o });
                dst
            })
            .collect();
        // Stage A ([m,k], row-major) and B ([k,n]) in shared memory.
        let tf32_fma = precision == tile::Precision::Tf32 && !f64_dot;
        let a_bytes = m * k * es;
        self.reserve_scratch(a_bytes + k * n * es);
        let smem = self.scratch_addr();
        for (tv, base) in [(&av, 0u32), (&bv, a_bytes)] {
            let strides = row_major(&tv.layout.shape);
            let lb = self.linear_base(&tv.layout.clone());
            let off = self.bin(BinOp::Mul, RegTy::I32, lb, Operand::Int(es as i64));
            let addr = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), off);
            let addr = self.materialize(RegTy::U32, addr).reg().expect("reg");
            for (s, &o) in tv.layout.slots.iter().zip(&tv.ops) {
                let lin: u64 = s.iter().zip(&strides).map(|(&o, &st)| o as u64 * st).sum();
                // A tf32 `dot` without tf32 tensor cores (sm_70/75, or a shape
                // they do not take) still multiplies tf32 operands, as the CPU
                // executor does: one meaning on every target.
                let o = if tf32_fma { self.round_tf32(o) } else { o };
                self.emit(Inst::St {
                    stream: false,
                    space: Space::Shared,
                    mem: mt,
                    src: vec![o],
                    addr,
                    offset: base as i64 + lin as i64 * es as i64,
                    pred: None,
                });
            }
        }
        self.emit(Inst::Barrier);
        // Row and column base addresses of this thread's accumulator slots.
        let bm = self.base(&layout.terms[0].clone());
        let bn = self.base(&layout.terms[1].clone());
        let arow = self.bin(
            BinOp::Mul,
            RegTy::I32,
            bm,
            Operand::Int(k as i64 * es as i64),
        );
        let arow = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), arow);
        let bcol = self.bin(BinOp::Mul, RegTy::I32, bn, Operand::Int(es as i64));
        let bcol = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), bcol);
        let arow = self.materialize(RegTy::U32, arow);
        let bcol = self.materialize(RegTy::U32, bcol);
        let iv = self.new_reg(RegTy::I32);
        self.blocks.push(Vec::new());
        let ka = self.bin(
            BinOp::Mul,
            RegTy::I32,
            Operand::Reg(iv),
            Operand::Int(es as i64),
        );
        let pa = self.bin(BinOp::Add, RegTy::U32, arow, ka);
        let pa = self.materialize(RegTy::U32, pa).reg().expect("reg");
        let kb = self.bin(
            BinOp::Mul,
            RegTy::I32,
            Operand::Reg(iv),
            Operand::Int(n as i64 * es as i64),
        );
        let pb = self.bin(BinOp::Add, RegTy::U32, bcol, kb);
        let pb = self.materialize(RegTy::U32, pb).reg().expect("reg");
        // One shared load per row of A and per column of B the slots touch.
        let load_once = |l: &mut Self, map: &mut HashMap<u32, Reg>, at: u32, addr, offset| {
            if let Entry::Vacant(e) = map.entry(at) {
                let dst = l.new_reg(rt);
                e.insert(dst);
                l.emit(Inst::Ld {
                    stream: false,
                    space: Space::Shared,
                    mem: mt,
                    dst: vec![dst],
                    addr,
                    offset,
                    pred: None,
                });
            }
        };
        let mut rows: HashMap<u32, Reg> = HashMap::new();
        let mut cols: HashMap<u32, Reg> = HashMap::new();
        for s in layout.slots.clone() {
            let row_offset = s[0] as i64 * k as i64 * es as i64;
            load_once(self, &mut rows, s[0], pa, row_offset);
            let col_offset = a_bytes as i64 + s[1] as i64 * es as i64;
            load_once(self, &mut cols, s[1], pb, col_offset);
        }
        for (i, s) in layout.slots.clone().iter().enumerate() {
            self.emit(Inst::Fma {
                dst: accs[i],
                a: Operand::Reg(rows[&s[0]]),
                b: Operand::Reg(cols[&s[1]]),
                c: Operand::Reg(accs[i]),
            });
        }
        let body = self.blocks.pop().unwrap_or_default();
        self.emit(Inst::For {
            iv,
            lo: Operand::Int(0),
            hi: Operand::Int(k as i64),
            step: Operand::Int(1),
            body,
        });
        self.emit(Inst::Barrier);
        Ok(TV {
            layout,
            ops: accs.into_iter().map(Operand::Reg).collect(),
            ty: rt,
            dtype: out_dt,
        })
    }

    /// The starting values of a `dot`'s accumulator in `layout`: `acc`
    /// converted to it, or zeros.
    pub(super) fn acc_operands(
        &mut self,
        acc: Option<Value>,
        layout: &Rc<Layout>,
    ) -> R<Vec<Operand>> {
        Ok(match acc {
            Some(c) => {
                let c = self.val(c);
                self.convert(&c, layout)?.ops
            }
            None => vec![Operand::Float(0.0); layout.num_slots()],
        })
    }
}
