//! Kernel parameters: the PTX parameter list (tensor pointers, scalars, then
//! one i32 per distinct dynamic dim name) and, in the prologue, each tensor's
//! pointer, dims and row-major strides (`TensorInfo`).
//!
//! Invariant: the kernel's divisibility assumptions (`-D name%k`) are checked
//! in the prologue with a `trap`, so the alignment proofs of `memory` and
//! `async_copy`, which read `TensorInfo::dim_div` and `stride_div`, hold in all
//! code after it. Facts a launch derived from its own values
//! (`Kernel::divisibility_trusted`) hold by construction and are not checked.

use std::collections::HashMap;

use super::{mem_ty, Lower, TensorInfo, R};
use crate::check::DType;
use crate::ir::target::{BinOp, CmpOp, Inst, Operand, Param, Reg, RegTy};
use crate::ir::tile::{Dim, ParamKind};

impl<'a> Lower<'a> {
    pub(super) fn params(&mut self) -> R<()> {
        let tk = self.tk;
        let mut dyn_dims: Vec<String> = Vec::new();
        for p in &tk.params {
            if let ParamKind::Tensor { dims, .. } = &p.kind {
                for d in dims {
                    if let Dim::Dynamic(n) = d {
                        if !dyn_dims.contains(n) {
                            dyn_dims.push(n.clone());
                        }
                    }
                }
            }
        }
        for p in &tk.params {
            match &p.kind {
                ParamKind::Tensor { .. } => {
                    self.params.push(Param {
                        name: p.name.clone(),
                        ty: RegTy::U64,
                    });
                    self.tensors.push(None);
                    self.scalars.push(None);
                }
                ParamKind::Scalar(d) => {
                    let ty = match d {
                        DType::F64 => RegTy::F64,
                        DType::F32 => RegTy::F32,
                        DType::F16 | DType::BF16 => RegTy::B16,
                        DType::I64 => RegTy::I64,
                        DType::U32 | DType::U8 | DType::Bool => RegTy::U32,
                        DType::I32 | DType::I16 | DType::I8 => RegTy::I32,
                        DType::F8E4M3 | DType::F8E5M2 => {
                            return self.unsupported(crate::diag::with_article(&format!(
                                "{} scalar parameter",
                                d.name()
                            )))
                        }
                    };
                    self.params.push(Param {
                        name: p.name.clone(),
                        ty,
                    });
                    self.tensors.push(None);
                    self.scalars.push(None);
                }
            }
        }
        let first_dim = self.params.len();
        for n in &dyn_dims {
            self.params.push(Param {
                name: n.clone(),
                ty: RegTy::I32,
            });
        }
        let assumed = |n: &str| {
            tk.divisibility
                .iter()
                .find(|(x, _)| x == n)
                .map(|&(_, d)| d)
        };
        // Load what is used: all parameters, in the prologue (ptxas drops the unused).
        let mut dim_regs: HashMap<String, Reg> = HashMap::new();
        for (i, n) in dyn_dims.iter().enumerate() {
            let dst = self.new_reg(RegTy::I32);
            self.prologue.push(Inst::Param {
                dst,
                index: first_dim + i,
            });
            dim_regs.insert(n.clone(), dst);
        }
        for (i, p) in tk.params.iter().enumerate() {
            match &p.kind {
                ParamKind::Tensor { dims, dtype } => {
                    let Some(mem) = mem_ty(*dtype) else { continue };
                    let ptr = self.new_reg(RegTy::U64);
                    self.prologue.push(Inst::Param { dst: ptr, index: i });
                    let dim_ops: Vec<Operand> = dims
                        .iter()
                        .map(|d| match d {
                            Dim::Static(n) => Operand::Int(*n as i64),
                            Dim::Dynamic(n) => Operand::Reg(dim_regs[n]),
                        })
                        .collect();
                    let static_dims: Vec<Option<u64>> = dims
                        .iter()
                        .map(|d| match d {
                            Dim::Static(n) => Some(*n),
                            Dim::Dynamic(_) => None,
                        })
                        .collect();
                    // Strides, computed in the prologue.
                    let saved = std::mem::replace(&mut self.blocks, vec![Vec::new()]);
                    let mut strides = vec![Operand::Int(1); dims.len()];
                    for a in (0..dims.len().saturating_sub(1)).rev() {
                        strides[a] =
                            self.bin(BinOp::Mul, RegTy::I32, strides[a + 1], dim_ops[a + 1]);
                    }
                    let code = std::mem::replace(&mut self.blocks, saved)
                        .pop()
                        .unwrap_or_default();
                    self.prologue.extend(code);
                    let dim_div: Vec<u64> = dims
                        .iter()
                        .map(|d| match d {
                            Dim::Static(n) => *n,
                            Dim::Dynamic(n) => assumed(n).unwrap_or(1),
                        })
                        .collect();
                    let stride_div = (0..dims.len())
                        .map(|a| {
                            dim_div[a + 1..]
                                .iter()
                                .fold(1u64, |p, &d| p.saturating_mul(d.max(1)).min(1 << 30))
                        })
                        .collect();
                    self.tensors[i] = Some(TensorInfo {
                        stride_div,
                        dim_div,
                        ptr,
                        dims: dim_ops,
                        static_dims,
                        strides,
                        mem,
                        dtype: *dtype,
                    });
                }
                ParamKind::Scalar(d) => {
                    let ty = self.params[i].ty;
                    let raw = self.new_reg(ty);
                    self.prologue.push(Inst::Param { dst: raw, index: i });
                    let reg = match d {
                        DType::F16 => {
                            let dst = self.new_reg(RegTy::F32);
                            self.prologue.push(Inst::Cvt {
                                dst,
                                src: raw,
                                narrow: None,
                            });
                            dst
                        }
                        DType::BF16 => {
                            // The parameter holds the bf16 bits in the low half.
                            let bits = self.new_reg(RegTy::U32);
                            self.prologue.push(Inst::Cvt {
                                dst: bits,
                                src: raw,
                                narrow: None,
                            });
                            let sh = self.new_reg(RegTy::U32);
                            self.prologue.push(Inst::Binary {
                                op: BinOp::Shl,
                                dst: sh,
                                a: Operand::Reg(bits),
                                b: Operand::Int(16),
                            });
                            let f = self.new_reg(RegTy::F32);
                            self.prologue.push(Inst::Mov {
                                dst: f,
                                src: Operand::Reg(sh),
                            });
                            f
                        }
                        DType::Bool => {
                            let p = self.new_reg(RegTy::Pred);
                            self.prologue.push(Inst::Cmp {
                                op: CmpOp::Ne,
                                ty: RegTy::U32,
                                dst: p,
                                a: Operand::Reg(raw),
                                b: Operand::Int(0),
                            });
                            p
                        }
                        _ => raw,
                    };
                    self.scalars[i] = Some((reg, *d));
                }
            }
        }
        // Divisibility assumptions hold or the kernel traps: code below relies on
        // them for alignment (vector loads, 16-byte async copies).
        for (name, k) in &tk.divisibility {
            let reg = match dim_regs.get(name) {
                Some(r) => Some(*r),
                None => tk
                    .params
                    .iter()
                    .position(|p| &p.name == name)
                    .and_then(|i| self.scalars[i])
                    .filter(|(_, d)| d.is_int())
                    .map(|(r, _)| r),
            };
            let Some(reg) = reg else { continue };
            if tk.divisibility_trusted {
                // The launch derived it from the value it passes.
                self.prologue.push(Inst::Comment(format!(
                    "{name} % {k} == 0: a fact of the launch's own value (not checked)"
                )));
                continue;
            }
            let ty = self.regs[reg.0 as usize];
            self.prologue.push(Inst::Comment(format!(
                "assume {name} % {k} == 0 (-D {name}%{k}); trap otherwise"
            )));
            let low = self.new_reg(ty);
            self.prologue.push(Inst::Binary {
                op: BinOp::And,
                dst: low,
                a: Operand::Reg(reg),
                b: Operand::Int(*k as i64 - 1),
            });
            let bad = self.new_reg(RegTy::Pred);
            self.prologue.push(Inst::Cmp {
                op: CmpOp::Ne,
                ty,
                dst: bad,
                a: Operand::Reg(low),
                b: Operand::Int(0),
            });
            self.prologue.push(Inst::Trap { pred: bad });
        }
        Ok(())
    }

    pub(super) fn tensor(&self, i: usize) -> R<&TensorInfo> {
        match self.tensors.get(i).and_then(|t| t.as_ref()) {
            Some(t) => Ok(t),
            None => {
                let d = match &self.tk.params.get(i).map(|p| &p.kind) {
                    Some(ParamKind::Tensor { dtype, .. }) => dtype.name(),
                    _ => "?",
                };
                self.unsupported(crate::diag::with_article(&format!("{d} tensor")))
            }
        }
    }
}
