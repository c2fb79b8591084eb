//! Tile IR → Target IR.
//!
//! Every tile gets a [`Layout`]; elementwise ops keep their first operand's
//! layout (other operands are converted), loads/splats/aranges use the default
//! blocked layout of their shape, reductions produce slices, `ExpandDims` and
//! `Transpose` only re-label a layout, a broadcast goes into the newest layout
//! of its shape it fits, and loop-carried values take the layout their body
//! will yield them in (predicted from `dot`s and what is computed from them).
//! A conversion that moves data between threads goes through the shared
//! scratch region (store, barrier, load, barrier). Reductions combine within a
//! thread, then across lanes with butterfly shuffles, then across warps through
//! shared memory; every thread ends up with the result (an all-reduce), so
//! scalars stay uniform and control flow on them never diverges.
//!
//! `dot` of f16/bf16 runs on tensor cores where the arch has them (`mma.sync`
//! m16n8k16 on sm_80+, m16n8k8 f16 on sm_75): operands are staged in XOR-swizzled
//! shared memory and read with `ldmatrix`; the accumulator stays in the mma
//! layout. Operand loads that feed only such dots are not loaded into registers:
//! on sm_80+, when 16-byte alignment is provable (from static dims, or from the
//! kernel's divisibility assumptions, which the prologue checks with a `trap`
//! so that they hold in the code after it), they are copied with
//! `cp.async` straight into the swizzled buffers — at the dot, once before a
//! loop for loop-invariant operands, or software-pipelined over `num_stages`
//! for loads indexed by a loop's induction variable. On sm_70 (no `ldmatrix`)
//! f16 dots use `mma.m8n8k4` with fragments read by plain shared loads (see
//! `dot_mma884`). Other dots (f32 without tf32, bf16 before sm_80, shapes the
//! warps cannot tile) use FMAs over operands staged in shared memory.

use std::collections::HashMap;
use std::rc::Rc;

use super::layout::{Layout, Term};
use super::{
    ArchFeatures, BinOp, CmpOp, Inst, Kernel, MemTy, Operand, Param, Reg, RegTy, SmemBuffer, Space,
    Special, UnOp,
};
use crate::backend::arch::Arch;
use crate::check::DType;
use crate::ir::tile::{
    self, Access, BinaryOp, Constant, Dim, OpKind, ParamKind, ReduceOp, UnaryOp, Value,
};
use crate::syntax::span::Span;

/// A construct the code generator cannot lower yet (no catalogue code: the
/// front door reports it as "not supported yet"). The span is the Tile IR op's
/// (item-relative).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    pub span: Span,
    pub message: String,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Unsupported {}

/// Lowers one Tile IR kernel for `arch`.
pub fn lower(tk: &tile::Kernel, arch: Arch) -> Result<Kernel, Unsupported> {
    let info = arch.info();
    if !arch.is_nvidia() {
        return Err(Unsupported {
            span: Span::default(),
            message: format!(
                "no code generator for {} yet (only NVIDIA targets have one)",
                info.name
            ),
        });
    }
    let num_threads = tk.num_warps * info.warp_size;
    let mut l = Lower {
        tk,
        arch,
        feat: ArchFeatures::of(arch),
        warp_size: info.warp_size,
        num_warps: tk.num_warps,
        tid_bits: num_threads.trailing_zeros() as u8,
        regs: Vec::new(),
        prologue: Vec::new(),
        blocks: vec![Vec::new()],
        vals: HashMap::new(),
        div: HashMap::new(),
        tid: Reg(0),
        base_cache: HashMap::new(),
        params: Vec::new(),
        tensors: Vec::new(),
        scalars: Vec::new(),
        scratch: None,
        defer_ok: Default::default(),
        deferred: HashMap::new(),
        pipelined: HashMap::new(),
        pipelined_pending: HashMap::new(),
        pipes: Vec::new(),
        persistent: Vec::new(),
        overrides: HashMap::new(),
        seen: Vec::new(),
        buffers: Vec::new(),
        layouts: Vec::new(),
        span: Span::default(),
    };
    l.tid = l.new_reg(RegTy::I32);
    let tid = l.tid;
    l.prologue.push(Inst::Special {
        dst: tid,
        which: Special::ThreadId,
    });
    l.params()?;
    if arch.has_cp_async() {
        l.defer_ok = l.find_deferrable();
    }
    let body = &tk.body;
    l.region_ops(&body.ops)?;
    let mut insts = std::mem::take(&mut l.prologue);
    insts.extend(l.blocks.pop().unwrap_or_default());
    let mut smem = std::mem::take(&mut l.buffers);
    // Pipeline stages live through their loop: after every transient region.
    let transient_end = smem
        .iter()
        .enumerate()
        .filter(|(i, _)| !l.persistent.contains(i))
        .map(|(_, b)| b.offset + b.bytes)
        .max()
        .unwrap_or(0);
    let mut offset = transient_end.div_ceil(128) * 128;
    for &i in &l.persistent {
        smem[i].offset = offset;
        offset = (offset + smem[i].bytes).div_ceil(128) * 128;
    }
    Ok(Kernel {
        name: tk.name.clone(),
        arch,
        num_threads,
        params: l.params,
        smem,
        regs: l.regs,
        body: insts,
        layouts: l.layouts,
    })
}

/// A lowered Tile IR value: one operand per layout slot.
#[derive(Clone, Debug)]
struct TV {
    layout: Rc<Layout>,
    ops: Vec<Operand>,
    ty: RegTy,
    dtype: DType,
}

struct TensorInfo {
    /// A known divisor of each axis' stride (the product of the known divisors
    /// of the dims after it).
    stride_div: Vec<u64>,
    /// A known divisor of each dim: its value when static, else its assumed
    /// divisor (`Kernel::divisibility`) or 1.
    dim_div: Vec<u64>,
    ptr: Reg,
    dims: Vec<Operand>,
    static_dims: Vec<Option<u64>>,
    strides: Vec<Operand>,
    mem: MemTy,
    dtype: DType,
}

struct Lower<'a> {
    tk: &'a tile::Kernel,
    arch: Arch,
    feat: ArchFeatures,
    warp_size: u32,
    num_warps: u32,
    tid_bits: u8,
    regs: Vec<RegTy>,
    prologue: Vec<Inst>,
    blocks: Vec<Vec<Inst>>,
    vals: HashMap<Value, TV>,
    /// A known divisor of integer scalars (for alignment proofs).
    div: HashMap<Value, u64>,
    tid: Reg,
    base_cache: HashMap<Vec<Term>, Reg>,
    params: Vec<Param>,
    tensors: Vec<Option<TensorInfo>>,
    scalars: Vec<Option<(Reg, DType)>>,
    /// Loads whose only uses are tensor-core `dot` operands (possibly through a
    /// transpose), found before lowering (sm_80+).
    defer_ok: std::collections::HashSet<Value>,
    /// Deferred loads: copied with `cp.async` straight into the dot's staging
    /// buffer when the dot runs; `bool` is whether the value is transposed.
    deferred: HashMap<Value, (Rc<Deferred>, bool)>,
    /// Software-pipelined loads (`num_stages` >= 2): the pipe and whether the
    /// value is transposed.
    pipelined: HashMap<Value, (usize, bool)>,
    /// Loads of the loop body being lowered that are pipelined (value → pipe).
    pipelined_pending: HashMap<Value, usize>,
    pipes: Vec<Pipe>,
    /// Buffers live across a whole loop (pipeline stages): placed after every
    /// other region of the arena.
    persistent: Vec<usize>,
    /// Values standing for others while planning a future iteration's loads.
    overrides: HashMap<Value, Operand>,
    /// Layouts of 2-D+ tiles made so far, newest last (broadcast targets).
    seen: Vec<Rc<Layout>>,
    /// The index of the scratch buffer in `buffers`, once used.
    scratch: Option<usize>,
    /// Shared-memory buffers, all at offsets in one arena; see `SmemBuffer`.
    /// (0 is the scratch buffer).
    buffers: Vec<SmemBuffer>,
    layouts: Vec<(u32, Layout)>,
    span: Span,
}

const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The register type a dtype is computed in.
fn compute_ty(d: DType) -> Option<RegTy> {
    Some(match d {
        DType::F64 => RegTy::F64,
        DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => RegTy::F32,
        DType::I64 => RegTy::I64,
        DType::I32 | DType::I16 | DType::I8 => RegTy::I32,
        DType::U32 | DType::U8 => RegTy::U32,
        DType::Bool => RegTy::Pred,
    })
}

fn mem_ty(d: DType) -> Option<MemTy> {
    Some(match d {
        DType::F64 => MemTy::F64,
        DType::F32 => MemTy::F32,
        DType::F16 => MemTy::F16,
        DType::BF16 => MemTy::BF16,
        DType::I64 => MemTy::I64,
        DType::I32 => MemTy::I32,
        DType::I16 => MemTy::I16,
        DType::I8 => MemTy::I8,
        DType::U32 => MemTy::U32,
        DType::U8 | DType::Bool => MemTy::U8,
        DType::F8E4M3 => MemTy::F8E4M3,
        DType::F8E5M2 => MemTy::F8E5M2,
    })
}

/// The register a value of `mem` is loaded into (before conversion).
fn raw_ty(mem: MemTy) -> RegTy {
    match mem {
        MemTy::F64 => RegTy::F64,
        MemTy::F32 => RegTy::F32,
        MemTy::F16 => RegTy::B16,
        MemTy::I64 => RegTy::I64,
        MemTy::I32 | MemTy::I16 | MemTy::I8 => RegTy::I32,
        MemTy::BF16 | MemTy::U32 | MemTy::U16 | MemTy::U8 | MemTy::F8E4M3 | MemTy::F8E5M2 => {
            RegTy::U32
        }
    }
}

fn const_operand(c: Constant, d: DType) -> Operand {
    let float = d.is_float();
    match c {
        Constant::Int(i) if float => Operand::Float(i as f64),
        Constant::Int(i) => Operand::Int(i),
        Constant::Float(f) if float => Operand::Float(f),
        Constant::Float(f) => Operand::Int(f as i64),
        Constant::Bool(b) if float => Operand::Float(if b { 1.0 } else { 0.0 }),
        Constant::Bool(b) => Operand::Int(b as i64),
    }
}

/// Rounds an f32 value to the nearest bf16 / f16 value (for constants).
fn round_const(f: f64, d: DType) -> f64 {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => {
            let x = f as f32;
            if d == DType::BF16 && x.is_finite() {
                let u = x.to_bits();
                let r = (u.wrapping_add(0x7fff + ((u >> 16) & 1))) & 0xffff_0000;
                f32::from_bits(r) as f64
            } else {
                // f16 constants are rounded by the hardware at the next cast; the
                // f32 value is what the f32 compute type holds.
                x as f64
            }
        }
        _ => f,
    }
}

type R<T> = Result<T, Unsupported>;

impl<'a> Lower<'a> {
    fn unsupported<T>(&self, what: impl Into<String>) -> R<T> {
        Err(Unsupported {
            span: self.span,
            message: format!(
                "{} is not supported by the {} code generator yet",
                what.into(),
                self.arch
            ),
        })
    }

    fn new_reg(&mut self, ty: RegTy) -> Reg {
        self.regs.push(ty);
        Reg(self.regs.len() as u32 - 1)
    }

    fn emit(&mut self, i: Inst) {
        self.blocks.last_mut().expect("a block").push(i);
    }

    fn reg_ty(&self, o: Operand) -> Option<RegTy> {
        o.reg().map(|r| self.regs[r.0 as usize])
    }

    // ---- scalar instruction helpers -------------------------------------

    fn bin(&mut self, op: BinOp, ty: RegTy, a: Operand, b: Operand) -> Operand {
        // Fold the identities the address arithmetic produces a lot of.
        match (op, a, b) {
            (BinOp::Add, x, Operand::Int(0)) | (BinOp::Add, Operand::Int(0), x) => return x,
            (BinOp::Mul, x, Operand::Int(1)) | (BinOp::Mul, Operand::Int(1), x) => return x,
            // Wrapping, as the instruction would: a tensor type's static dims
            // may multiply past 64 bits in the addresses of masked-off lanes.
            (BinOp::Add, Operand::Int(x), Operand::Int(y)) if !ty.is_float() => {
                return Operand::Int(x.wrapping_add(y))
            }
            (BinOp::Mul, Operand::Int(x), Operand::Int(y)) if !ty.is_float() => {
                return Operand::Int(x.wrapping_mul(y))
            }
            _ => {}
        }
        let (a, b) = if matches!(a, Operand::Reg(_)) || matches!(b, Operand::Reg(_)) {
            (a, b)
        } else {
            (self.materialize(ty, a), b)
        };
        let dst = self.new_reg(ty);
        self.emit(Inst::Binary { op, dst, a, b });
        Operand::Reg(dst)
    }

    fn un(&mut self, op: UnOp, ty: RegTy, x: Operand) -> Operand {
        let dst = self.new_reg(ty);
        self.emit(Inst::Unary { op, dst, x });
        Operand::Reg(dst)
    }

    fn materialize(&mut self, ty: RegTy, x: Operand) -> Operand {
        if let Operand::Reg(_) = x {
            return x;
        }
        let dst = self.new_reg(ty);
        self.emit(Inst::Mov { dst, src: x });
        Operand::Reg(dst)
    }

    fn cmp(&mut self, op: CmpOp, ty: RegTy, a: Operand, b: Operand) -> Operand {
        let a = self.materialize(ty, a);
        let dst = self.new_reg(RegTy::Pred);
        self.emit(Inst::Cmp { op, ty, dst, a, b });
        Operand::Reg(dst)
    }

    fn select(&mut self, ty: RegTy, cond: Operand, a: Operand, b: Operand) -> Operand {
        let cond = match cond {
            Operand::Reg(r) => r,
            Operand::Int(0) => return b,
            _ => return a,
        };
        if ty == RegTy::Pred {
            let a = self.materialize(ty, a);
            let b = self.materialize(ty, b);
            let t = self.bin(BinOp::And, ty, Operand::Reg(cond), a);
            let nc = self.un(UnOp::Not, ty, Operand::Reg(cond));
            let e = self.bin(BinOp::And, ty, nc, b);
            return self.bin(BinOp::Or, ty, t, e);
        }
        let dst = self.new_reg(ty);
        self.emit(Inst::Select { dst, cond, a, b });
        Operand::Reg(dst)
    }

    fn cvt(&mut self, to: RegTy, src: Operand, narrow: Option<MemTy>) -> Operand {
        let from = self.reg_ty(src).unwrap_or(RegTy::I32);
        let src = match src {
            Operand::Reg(r) => r,
            other => match self.materialize(from, other) {
                Operand::Reg(r) => r,
                _ => unreachable!("materialize gives a register"),
            },
        };
        let dst = self.new_reg(to);
        self.emit(Inst::Cvt { dst, src, narrow });
        Operand::Reg(dst)
    }

    fn and_preds(&mut self, preds: &[Operand]) -> Option<Operand> {
        let mut acc: Option<Operand> = None;
        for &p in preds {
            acc = Some(match acc {
                None => p,
                Some(a) => self.bin(BinOp::And, RegTy::Pred, a, p),
            });
        }
        acc
    }

    fn pred_reg(&mut self, p: Option<Operand>) -> Option<Reg> {
        p.map(|p| match self.materialize(RegTy::Pred, p) {
            Operand::Reg(r) => r,
            _ => unreachable!(),
        })
    }

    // ---- layouts -----------------------------------------------------------

    fn blocked(&self, shape: &[u32]) -> Rc<Layout> {
        Rc::new(Layout::blocked(shape, self.num_warps, self.warp_size, 4))
    }

    /// The per-thread base coordinate for a list of terms (computed once, in the prologue).
    fn base(&mut self, terms: &[Term]) -> Operand {
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
    fn linear_base(&mut self, layout: &Layout) -> Operand {
        let strides = row_major(&layout.shape);
        let mut acc = Operand::Int(0);
        for (terms, stride) in layout.terms.iter().zip(strides) {
            let b = self.base(terms);
            let t = self.bin(BinOp::Mul, RegTy::I32, b, Operand::Int(stride as i64));
            acc = self.bin(BinOp::Add, RegTy::I32, acc, t);
        }
        acc
    }

    fn reserve_scratch(&mut self, bytes: u32) {
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

    fn scratch_addr(&mut self) -> Reg {
        let dst = self.new_reg(RegTy::U32);
        let buffer = self.scratch.expect("reserve_scratch first");
        self.emit(Inst::SmemAddr { dst, buffer });
        dst
    }

    /// Moves a tile into layout `to` (same shape), through shared memory when
    /// threads must exchange elements.
    fn convert(&mut self, v: &TV, to: &Rc<Layout>) -> R<TV> {
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
    fn exchange(&mut self, v: &TV, to: &Rc<Layout>, src_axis: &[usize], offset: &[u32]) -> R<TV> {
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

    // ---- parameters ---------------------------------------------------------

    fn params(&mut self) -> R<()> {
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

    fn tensor(&self, i: usize) -> R<&TensorInfo> {
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

    // ---- values ---------------------------------------------------------------

    fn val(&self, v: Value) -> TV {
        self.vals
            .get(&v)
            .cloned()
            .unwrap_or_else(|| panic!("Tile IR value %{} used before its definition", v.0))
    }

    fn scalar(&self, v: Value) -> Operand {
        if let Some(o) = self.overrides.get(&v) {
            return *o;
        }
        let t = self.val(v);
        debug_assert_eq!(t.ops.len(), 1);
        t.ops[0]
    }

    fn divisor(&self, v: Value) -> u64 {
        self.div.get(&v).copied().unwrap_or(1)
    }

    fn define(&mut self, v: Value, tv: TV) {
        if tv.layout.rank() >= 2
            && tv.layout.shape.iter().all(|&d| d > 1)
            && !self.seen.contains(&tv.layout)
        {
            self.seen.push(tv.layout.clone());
        }
        if !tv.layout.shape.is_empty() {
            self.layouts.push((v.0, (*tv.layout).clone()));
        }
        self.vals.insert(v, tv);
    }

    fn scalar_tv(&self, op: Operand, ty: RegTy, dtype: DType) -> TV {
        TV {
            layout: Rc::new(Layout::scalar()),
            ops: vec![op],
            ty,
            dtype,
        }
    }

    fn cty(&self, d: DType) -> R<RegTy> {
        match compute_ty(d) {
            Some(t) => Ok(t),
            None => self.unsupported(format!("arithmetic on {}", d.name())),
        }
    }

    // ---- ops --------------------------------------------------------------------

    fn region_ops(&mut self, ops: &[tile::Op]) -> R<Option<Vec<TV>>> {
        for op in ops {
            self.span = op.span;
            if let OpKind::Yield(vs) = &op.kind {
                return Ok(Some(vs.iter().map(|v| self.val(*v)).collect()));
            }
            self.op(op)?;
        }
        Ok(None)
    }

    fn op(&mut self, op: &tile::Op) -> R<()> {
        crate::cancel::checkpoint();
        let tk = self.tk;
        let res = |i: usize| op.results[i];
        match &op.kind {
            OpKind::Const(c) => {
                let d = tk.ty(res(0)).dtype();
                let ty = self.cty(d)?;
                let mut o = const_operand(*c, d);
                if let Operand::Float(f) = o {
                    o = Operand::Float(round_const(f, d));
                }
                if let (Constant::Int(n), true) = (c, d.is_int()) {
                    self.div
                        .insert(res(0), if *n == 0 { 1 << 30 } else { n.unsigned_abs() });
                }
                let o = if ty == RegTy::Pred {
                    self.materialize(ty, o)
                } else {
                    o
                };
                let tv = self.scalar_tv(o, ty, d);
                self.define(res(0), tv);
            }
            OpKind::ProgramId(a) | OpKind::NumPrograms(a) => {
                let dst = self.new_reg(RegTy::I32);
                let which = if matches!(op.kind, OpKind::ProgramId(_)) {
                    Special::BlockId(*a)
                } else {
                    Special::NumBlocks(*a)
                };
                self.emit(Inst::Special { dst, which });
                let tv = self.scalar_tv(Operand::Reg(dst), RegTy::I32, DType::I32);
                self.define(res(0), tv);
            }
            OpKind::TensorDim { param, axis } => {
                let t = self.tensor(*param)?;
                let o = t.dims[*axis];
                self.div.insert(res(0), t.dim_div[*axis].max(1));
                let tv = self.scalar_tv(o, RegTy::I32, DType::I32);
                self.define(res(0), tv);
            }
            OpKind::ScalarParam(i) => {
                let Some((r, d)) = self.scalars.get(*i).copied().flatten() else {
                    return self.unsupported("this scalar parameter");
                };
                let ty = self.cty(d)?;
                let name = &tk.params[*i].name;
                if let Some(&(_, k)) = tk.divisibility.iter().find(|(n, _)| n == name) {
                    if d.is_int() {
                        self.div.insert(res(0), k);
                    }
                }
                let tv = self.scalar_tv(Operand::Reg(r), ty, d);
                self.define(res(0), tv);
            }
            OpKind::Unary { op: u, x } => {
                let x = self.val(*x);
                let mut ops = Vec::with_capacity(x.ops.len());
                for &o in &x.ops {
                    let v = self.unary(*u, x.ty, x.dtype, o)?;
                    ops.push(self.round_to_storage(v, x.dtype));
                }
                let tv = TV { ops, ..x };
                self.define(res(0), tv);
            }
            OpKind::Binary {
                op: b,
                a: av,
                b: bv,
            } => {
                let a = self.val(*av);
                let bt = self.val(*bv);
                let bt = self.convert(&bt, &a.layout)?;
                let mut ops = Vec::with_capacity(a.ops.len());
                for (&x, &y) in a.ops.iter().zip(&bt.ops) {
                    let v = self.binary(*b, a.ty, a.dtype, x, y)?;
                    ops.push(if b.is_comparison() {
                        v
                    } else {
                        self.round_to_storage(v, a.dtype)
                    });
                }
                if a.layout.shape.is_empty() && a.dtype.is_int() {
                    let (da, db) = (self.divisor(*av), self.divisor(*bv));
                    let d = match b {
                        BinaryOp::Mul => da.saturating_mul(db).min(1 << 30),
                        BinaryOp::Add | BinaryOp::Sub => gcd(da, db),
                        _ => 1,
                    };
                    self.div.insert(res(0), d);
                }
                let ty = if b.is_comparison() { RegTy::Pred } else { a.ty };
                let dtype = tk.ty(res(0)).dtype();
                let tv = TV {
                    layout: a.layout.clone(),
                    ops,
                    ty,
                    dtype,
                };
                self.define(res(0), tv);
            }
            OpKind::Select { cond, a, b } => {
                let a = self.val(*a);
                let c = self.val(*cond);
                let c = self.convert(&c, &a.layout)?;
                let bt = self.val(*b);
                let bt = self.convert(&bt, &a.layout)?;
                let mut ops = Vec::new();
                for i in 0..a.ops.len() {
                    ops.push(self.select(a.ty, c.ops[i], a.ops[i], bt.ops[i]));
                }
                let tv = TV { ops, ..a };
                self.define(res(0), tv);
            }
            OpKind::Cast { x: xv, to } => {
                let x = self.val(*xv);
                let ty = self.cty(*to)?;
                let mut ops = Vec::new();
                for &o in &x.ops {
                    ops.push(self.cast(o, x.ty, x.dtype, ty, *to)?);
                }
                if x.layout.shape.is_empty() && x.dtype.is_int() && to.is_int() {
                    let d = self.divisor(*xv);
                    self.div.insert(res(0), d);
                }
                let tv = TV {
                    layout: x.layout,
                    ops,
                    ty,
                    dtype: *to,
                };
                self.define(res(0), tv);
            }
            OpKind::Splat { x, shape } => {
                let x = self.val(*x);
                let layout = self.blocked(shape);
                let tv = TV {
                    ops: vec![x.ops[0]; layout.num_slots()],
                    layout,
                    ty: x.ty,
                    dtype: x.dtype,
                };
                self.define(res(0), tv);
            }
            OpKind::Broadcast { x, shape } => {
                let x = self.val(*x);
                // Into the newest layout of that shape the tile already fits
                // (e.g. a row statistic back into the mma layout it came from).
                let to = self
                    .seen
                    .iter()
                    .rev()
                    .find(|l| l.shape == *shape && x.layout.register_map_to(l).is_some())
                    .cloned()
                    .unwrap_or_else(|| self.blocked(shape));
                let tv = self.broadcast(&x, &to)?;
                self.define(res(0), tv);
            }
            OpKind::ExpandDims { x, axis } => {
                let x = self.val(*x);
                let tv = TV {
                    layout: Rc::new(x.layout.expand(*axis)),
                    ..x
                };
                self.define(res(0), tv);
            }
            OpKind::Transpose { x } => {
                if let Some((d, t)) = self.deferred.get(x).cloned() {
                    self.deferred.insert(res(0), (d, !t));
                }
                if let Some((p, t)) = self.pipelined.get(x).copied() {
                    self.pipelined.insert(res(0), (p, !t));
                }
                let x = self.val(*x);
                let tv = TV {
                    layout: Rc::new(x.layout.transpose()),
                    ..x
                };
                self.define(res(0), tv);
            }
            OpKind::Extract {
                x,
                axis,
                start,
                len,
                drop,
            } => {
                let xv = self.val(*x);
                let shape = self.tk.ty(res(0)).shape().to_vec();
                let to = self.blocked(&shape);
                let src_axis: Vec<usize> = (0..shape.len())
                    .map(|r| if *drop && r >= *axis { r + 1 } else { r })
                    .collect();
                let mut offset = vec![0; xv.layout.rank()];
                offset[*axis] = *start;
                // A uniform tile (a splat) stays one value.
                if !xv.ops.is_empty() && xv.ops.iter().all(|o| *o == xv.ops[0]) {
                    let tv = TV {
                        ops: vec![xv.ops[0]; to.num_slots()],
                        layout: to,
                        ..xv
                    };
                    self.define(res(0), tv);
                    return Ok(());
                }
                self.emit(Inst::Comment(format!(
                    "extract axis {axis} {start} : +{len} {} -> {}",
                    xv.layout, to
                )));
                let tv = self.exchange(&xv, &to, &src_axis, &offset)?;
                self.define(res(0), tv);
            }
            OpKind::Arange { start, len } => {
                let s = self.scalar(*start);
                let layout = self.blocked(&[*len]);
                let b = self.base(&layout.terms[0].clone());
                let sb = self.bin(BinOp::Add, RegTy::I32, s, b);
                let sb = self.materialize(RegTy::I32, sb);
                let mut ops = Vec::new();
                for slot in layout.slots.clone() {
                    ops.push(self.bin(BinOp::Add, RegTy::I32, sb, Operand::Int(slot[0] as i64)));
                }
                let tv = TV {
                    layout,
                    ops,
                    ty: RegTy::I32,
                    dtype: DType::I32,
                };
                self.define(res(0), tv);
            }
            OpKind::Load {
                tensor,
                access,
                mask,
                other,
            } => {
                let tv = self.load(res(0), *tensor, access, *mask, *other)?;
                self.define(res(0), tv);
            }
            OpKind::Store {
                tensor,
                access,
                value,
                mask,
            } => self.store(*tensor, access, *value, *mask, false)?,
            OpKind::AtomicAdd {
                tensor,
                access,
                value,
                mask,
            } => self.store(*tensor, access, *value, *mask, true)?,
            OpKind::Dot {
                a,
                b,
                acc,
                precision,
            } => {
                let tv = self.dot(res(0), *a, *b, *acc, *precision)?;
                self.define(res(0), tv);
            }
            OpKind::Reduce {
                op: r,
                x,
                axis,
                keepdims,
            } => {
                let x = self.val(*x);
                let mut tv = self.reduce(*r, &x, *axis, *keepdims)?;
                if *r == ReduceOp::Sum {
                    let ops = std::mem::take(&mut tv.ops);
                    tv.ops = ops
                        .into_iter()
                        .map(|v| self.round_to_storage(v, x.dtype))
                        .collect();
                }
                self.define(res(0), tv);
            }
            OpKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => self.for_loop(op, *lo, *hi, *step, init, body)?,
            OpKind::While { init, cond, body } => self.while_loop(op, init, cond, body)?,
            OpKind::If {
                cond,
                then,
                otherwise,
            } => self.if_op(op, *cond, then, otherwise)?,
            OpKind::Yield(_) => unreachable!("handled by region_ops"),
        }
        Ok(())
    }

    fn unary(&mut self, u: UnaryOp, ty: RegTy, d: DType, x: Operand) -> R<Operand> {
        let f32 = ty == RegTy::F32;
        let float = ty.is_float();
        let unsigned = matches!(ty, RegTy::U32 | RegTy::U64);
        Ok(match u {
            // PTX has no unsigned neg/abs: -x wraps as 0 - x, |x| is x.
            UnaryOp::Neg if unsigned => self.bin(BinOp::Sub, ty, Operand::Int(0), x),
            UnaryOp::Abs if unsigned => x,
            UnaryOp::Neg => self.un(UnOp::Neg, ty, x),
            UnaryOp::Not | UnaryOp::Invert => {
                let x = self.materialize(ty, x);
                self.un(UnOp::Not, ty, x)
            }
            UnaryOp::Abs => self.un(UnOp::Abs, ty, x),
            UnaryOp::Sqrt if float => self.un(UnOp::Sqrt, ty, x),
            UnaryOp::Rsqrt if float => self.un(UnOp::RsqrtApprox, ty, x),
            _ if !f32 => return self.unsupported(format!("`{}` on {}", unary_name(u), d.name())),
            UnaryOp::Exp => {
                let t = self.bin(BinOp::Mul, ty, x, Operand::Float(LOG2E));
                self.un(UnOp::Exp2Approx, ty, t)
            }
            UnaryOp::Exp2 => self.un(UnOp::Exp2Approx, ty, x),
            UnaryOp::Log => {
                let t = self.un(UnOp::Log2Approx, ty, x);
                self.bin(BinOp::Mul, ty, t, Operand::Float(LN2))
            }
            UnaryOp::Log2 => self.un(UnOp::Log2Approx, ty, x),
            UnaryOp::Sigmoid => {
                let t = self.bin(BinOp::Mul, ty, x, Operand::Float(-LOG2E));
                let e = self.un(UnOp::Exp2Approx, ty, t);
                let d = self.bin(BinOp::Add, ty, e, Operand::Float(1.0));
                self.un(UnOp::Rcp, ty, d)
            }
            UnaryOp::Tanh if self.feat.fast_tanh => self.un(UnOp::TanhApprox, ty, x),
            UnaryOp::Tanh => {
                // tanh(x) = sign(x) (1 - t) / (1 + t), t = e^(-2|x|).
                let a = self.un(UnOp::Abs, ty, x);
                let s = self.bin(BinOp::Mul, ty, a, Operand::Float(-2.0 * LOG2E));
                let t = self.un(UnOp::Exp2Approx, ty, s);
                let n = self.bin(BinOp::Sub, ty, Operand::Float(1.0), t);
                let dd = self.bin(BinOp::Add, ty, t, Operand::Float(1.0));
                let q = self.bin(BinOp::Div, ty, n, dd);
                self.copysign(q, x)
            }
            UnaryOp::Erf => {
                // Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7).
                let a = self.un(UnOp::Abs, ty, x);
                let p = self.fma(ty, a, Operand::Float(0.327_591_1), Operand::Float(1.0));
                let t = self.un(UnOp::Rcp, ty, p);
                let mut poly = Operand::Float(1.061_405_429);
                for c in [-1.453_152_027, 1.421_413_741, -0.284_496_736, 0.254_829_592] {
                    poly = self.fma(ty, poly, t, Operand::Float(c));
                }
                let poly = self.bin(BinOp::Mul, ty, poly, t);
                let a2 = self.bin(BinOp::Mul, ty, a, a);
                let s = self.bin(BinOp::Mul, ty, a2, Operand::Float(-LOG2E));
                let e = self.un(UnOp::Exp2Approx, ty, s);
                let np = self.un(UnOp::Neg, ty, poly);
                let y = self.fma(ty, np, e, Operand::Float(1.0));
                self.copysign(y, x)
            }
            UnaryOp::Sqrt | UnaryOp::Rsqrt => unreachable!("handled above"),
        })
    }

    fn fma(&mut self, ty: RegTy, a: Operand, b: Operand, c: Operand) -> Operand {
        let a = self.materialize(ty, a);
        let dst = self.new_reg(ty);
        self.emit(Inst::Fma { dst, a, b, c });
        Operand::Reg(dst)
    }

    /// `x ** n` for a small integer constant `n`: square and multiply.
    fn pow_const(&mut self, ty: RegTy, x: Operand, n: u32) -> Operand {
        let one = if ty.is_float() {
            Operand::Float(1.0)
        } else {
            Operand::Int(1)
        };
        let (mut acc, mut base, mut k) = (None, x, n);
        while k > 0 {
            if k & 1 == 1 {
                acc = Some(match acc {
                    None => base,
                    Some(a) => self.bin(BinOp::Mul, ty, a, base),
                });
            }
            k >>= 1;
            if k > 0 {
                base = self.bin(BinOp::Mul, ty, base, base);
            }
        }
        acc.unwrap_or(one)
    }

    /// `x ** y` on f32 as the CPU's `powf` computes it: an integer constant
    /// exponent multiplies; otherwise `2^(y log2 |x|)` with the sign of a
    /// negative base raised to an odd integer, NaN for a negative base and a
    /// non-integer exponent, and `x ** 0 = 1`.
    fn pow_f32(&mut self, x: Operand, y: Operand) -> Operand {
        let f = RegTy::F32;
        if let Operand::Float(c) = y {
            if c == c.trunc() && c.abs() <= 64.0 {
                let r = self.pow_const(f, x, c.abs() as u32);
                return if c < 0.0 {
                    self.bin(BinOp::Div, f, Operand::Float(1.0), r)
                } else {
                    r
                };
            }
        }
        let ax = self.un(UnOp::Abs, f, x);
        let l = self.un(UnOp::Log2Approx, f, ax);
        let m = self.bin(BinOp::Mul, f, l, y);
        let r = self.un(UnOp::Exp2Approx, f, m);
        let fy = self.un(UnOp::Floor, f, y);
        let int = self.cmp(CmpOp::Eq, f, fy, y);
        let half = self.bin(BinOp::Mul, f, y, Operand::Float(0.5));
        let fh = self.un(UnOp::Floor, f, half);
        let odd_half = self.cmp(CmpOp::Ne, f, fh, half);
        let odd = self.bin(BinOp::And, RegTy::Pred, int, odd_half);
        let nr = self.un(UnOp::Neg, f, r);
        let signed = self.select(f, odd, nr, r);
        let neg_base = self.select(f, int, signed, Operand::Float(f64::NAN));
        let neg = self.cmp(CmpOp::Lt, f, x, Operand::Float(0.0));
        let res = self.select(f, neg, neg_base, r);
        let y0 = self.cmp(CmpOp::Eq, f, y, Operand::Float(0.0));
        self.select(f, y0, Operand::Float(1.0), res)
    }

    /// `x ** y` on integers as the CPU computes it: wrapping square and
    /// multiply over the exponent's bits; a negative exponent gives `1 / x`
    /// truncated (1 for 1, +-1 for -1, else 0).
    fn pow_int(&mut self, ty: RegTy, x: Operand, y: Operand) -> Operand {
        if let Operand::Int(c) = y {
            if (0..=64).contains(&c) {
                return self.pow_const(ty, x, c as u32);
            }
        }
        let bits = if ty.words() == 2 { 63 } else { 31 };
        let (mut acc, mut base) = (Operand::Int(1), x);
        for i in 0..bits {
            let bit = self.bin(BinOp::And, ty, y, Operand::Int(1i64 << i));
            let on = self.cmp(CmpOp::Ne, ty, bit, Operand::Int(0));
            let prod = self.bin(BinOp::Mul, ty, acc, base);
            acc = self.select(ty, on, prod, acc);
            if i + 1 < bits {
                base = self.bin(BinOp::Mul, ty, base, base);
            }
        }
        if !matches!(ty, RegTy::I32 | RegTy::I64) {
            return acc;
        }
        // Negative exponents: 1 / x truncated.
        let odd = self.bin(BinOp::And, ty, y, Operand::Int(1));
        let is_odd = self.cmp(CmpOp::Ne, ty, odd, Operand::Int(0));
        let minus = self.select(ty, is_odd, Operand::Int(-1), Operand::Int(1));
        let is_one = self.cmp(CmpOp::Eq, ty, x, Operand::Int(1));
        let is_minus = self.cmp(CmpOp::Eq, ty, x, Operand::Int(-1));
        let m = self.select(ty, is_minus, minus, Operand::Int(0));
        let inv = self.select(ty, is_one, Operand::Int(1), m);
        let neg = self.cmp(CmpOp::Lt, ty, y, Operand::Int(0));
        self.select(ty, neg, inv, acc)
    }

    /// `|y|` with the sign of `x` (y >= 0).
    fn copysign(&mut self, y: Operand, x: Operand) -> Operand {
        let neg = self.cmp(CmpOp::Lt, RegTy::F32, x, Operand::Float(0.0));
        let ny = self.un(UnOp::Neg, RegTy::F32, y);
        self.select(RegTy::F32, neg, ny, y)
    }

    fn binary(&mut self, b: BinaryOp, ty: RegTy, d: DType, x: Operand, y: Operand) -> R<Operand> {
        let float = ty.is_float();
        let signed = matches!(ty, RegTy::I32 | RegTy::I64);
        let cmp = |b| match b {
            BinaryOp::Eq => CmpOp::Eq,
            BinaryOp::Ne => CmpOp::Ne,
            BinaryOp::Lt => CmpOp::Lt,
            BinaryOp::Le => CmpOp::Le,
            BinaryOp::Gt => CmpOp::Gt,
            _ => CmpOp::Ge,
        };
        let pred = ty == RegTy::Pred;
        Ok(match b {
            // Bools order False < True: max is or, min is and.
            BinaryOp::Max if pred => self.bin(BinOp::Or, ty, x, y),
            BinaryOp::Min if pred => self.bin(BinOp::And, ty, x, y),
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge if pred => {
                let (x, y) = if matches!(b, BinaryOp::Gt | BinaryOp::Ge) {
                    (y, x)
                } else {
                    (x, y)
                };
                let x = self.materialize(ty, x);
                let nx = self.un(UnOp::Not, ty, x);
                // x < y: !x & y;  x <= y: !x | y.
                let op = if matches!(b, BinaryOp::Lt | BinaryOp::Gt) {
                    BinOp::And
                } else {
                    BinOp::Or
                };
                self.bin(op, ty, nx, y)
            }
            BinaryOp::Add => self.bin(BinOp::Add, ty, x, y),
            BinaryOp::Sub => self.bin(BinOp::Sub, ty, x, y),
            BinaryOp::Mul => self.bin(BinOp::Mul, ty, x, y),
            BinaryOp::Max => self.bin(BinOp::Max, ty, x, y),
            BinaryOp::Min => self.bin(BinOp::Min, ty, x, y),
            BinaryOp::And => self.bin(BinOp::And, ty, x, y),
            BinaryOp::Or => self.bin(BinOp::Or, ty, x, y),
            BinaryOp::Xor => self.bin(BinOp::Xor, ty, x, y),
            BinaryOp::Div if float => self.bin(BinOp::Div, ty, x, y),
            BinaryOp::Div => self.bin(BinOp::Div, ty, x, y),
            BinaryOp::FloorDiv if float => {
                let q = self.bin(BinOp::Div, ty, x, y);
                self.un(UnOp::Floor, ty, q)
            }
            BinaryOp::Mod if float => {
                let q = self.bin(BinOp::Div, ty, x, y);
                let f = self.un(UnOp::Floor, ty, q);
                let m = self.bin(BinOp::Mul, ty, f, y);
                self.bin(BinOp::Sub, ty, x, m)
            }
            BinaryOp::FloorDiv | BinaryOp::Mod if !signed => {
                let op = if b == BinaryOp::Mod {
                    BinOp::Rem
                } else {
                    BinOp::Div
                };
                self.bin(op, ty, x, y)
            }
            BinaryOp::FloorDiv | BinaryOp::Mod => {
                // Python semantics: round the quotient toward -inf; the remainder
                // takes the divisor's sign.
                let r = self.bin(BinOp::Rem, ty, x, y);
                let sx = self.bin(BinOp::Xor, ty, r, y);
                let p1 = self.cmp(CmpOp::Ne, ty, r, Operand::Int(0));
                let p2 = self.cmp(CmpOp::Lt, ty, sx, Operand::Int(0));
                let fix = self.bin(BinOp::And, RegTy::Pred, p1, p2);
                if b == BinaryOp::Mod {
                    let ry = self.bin(BinOp::Add, ty, r, y);
                    self.select(ty, fix, ry, r)
                } else {
                    let q = self.bin(BinOp::Div, ty, x, y);
                    let q1 = self.bin(BinOp::Sub, ty, q, Operand::Int(1));
                    self.select(ty, fix, q1, q)
                }
            }
            BinaryOp::Pow if ty == RegTy::F32 => self.pow_f32(x, y),
            BinaryOp::Pow if !float => self.pow_int(ty, x, y),
            BinaryOp::Pow => return self.unsupported(format!("`**` on {}", d.name())),
            _ if ty == RegTy::Pred => {
                // Eq / Ne on bools.
                let x = self.materialize(ty, x);
                let ne = self.bin(BinOp::Xor, ty, x, y);
                if b == BinaryOp::Ne {
                    ne
                } else if b == BinaryOp::Eq {
                    self.un(UnOp::Not, ty, ne)
                } else {
                    return self.unsupported("ordering comparisons of bools");
                }
            }
            _ => self.cmp(cmp(b), ty, x, y),
        })
    }

    fn cast(&mut self, x: Operand, fty: RegTy, from: DType, tty: RegTy, to: DType) -> R<Operand> {
        if from == to {
            return Ok(x);
        }
        if to == DType::Bool {
            let zero = if fty.is_float() {
                Operand::Float(0.0)
            } else {
                Operand::Int(0)
            };
            return Ok(self.cmp(CmpOp::Ne, fty, x, zero));
        }
        if from == DType::Bool {
            let (one, zero) = if tty.is_float() {
                (Operand::Float(1.0), Operand::Float(0.0))
            } else {
                (Operand::Int(1), Operand::Int(0))
            };
            return Ok(self.select(tty, x, one, zero));
        }
        let x = self.materialize(fty, x);
        let mut v = if fty == tty {
            x
        } else {
            self.cvt(tty, x, None)
        };
        // `cvt.rzi` saturates at the 32-bit range (NaN to 0); a narrower
        // integer saturates at its own range too, as on the CPU, rather than
        // wrapping when the 32 bits are truncated.
        if fty.is_float() {
            let range = match to {
                DType::I8 => Some((i8::MIN as i64, i8::MAX as i64)),
                DType::I16 => Some((i16::MIN as i64, i16::MAX as i64)),
                DType::U8 => Some((0, u8::MAX as i64)),
                _ => None,
            };
            if let Some((lo, hi)) = range {
                v = self.bin(BinOp::Min, tty, v, Operand::Int(hi));
                v = self.bin(BinOp::Max, tty, v, Operand::Int(lo));
            }
        }
        Ok(self.round_to_storage(v, to))
    }

    /// A computed value rounded (or wrapped) to `d` where `d` is narrower
    /// than its compute type (f16, bf16, f8, i8, i16, u8), as the CPU
    /// executor rounds every result: a chain of bf16 operations then gives
    /// the same bits on both, and a bf16 store (which keeps the high half)
    /// stores a rounded value.
    fn round_to_storage(&mut self, v: Operand, to: DType) -> Operand {
        match to {
            DType::F16 => {
                let h = self.cvt(RegTy::B16, v, None);
                self.cvt(RegTy::F32, h, None)
            }
            DType::BF16 => self.round_bf16(v),
            DType::I8 => self.cvt(RegTy::I32, v, Some(MemTy::I8)),
            DType::I16 => self.cvt(RegTy::I32, v, Some(MemTy::I16)),
            DType::U8 => self.cvt(RegTy::U32, v, Some(MemTy::U8)),
            DType::F8E4M3 | DType::F8E5M2 => {
                let m = mem_ty(to).expect("f8");
                let c = self.encode_f8(v, m);
                self.decode_f8(c, m)
            }
            _ => v,
        }
    }

    /// (exponent bits, mantissa bits, bias) of an 8-bit float.
    fn f8_format(mem: MemTy) -> (u32, u32, i64) {
        match mem {
            MemTy::F8E4M3 => (4, 3, 7),
            _ => (5, 2, 15),
        }
    }

    /// The f32 value of an 8-bit float code (in a U32 register): sign,
    /// normals by moving exponent and mantissa into place, subnormals by a
    /// multiply; e4m3's 0x7f is NaN (no infinities), e5m2's 0x7c inf, above NaN.
    fn decode_f8(&mut self, raw: Operand, mem: MemTy) -> Operand {
        let (_, mb, bias) = Self::f8_format(mem);
        let u = RegTy::U32;
        let c = self.bin(BinOp::And, u, raw, Operand::Int(0x7f));
        let normal = self.bin(BinOp::Shl, u, c, Operand::Int(23 - mb as i64));
        let normal = self.bin(BinOp::Add, u, normal, Operand::Int((127 - bias) << 23));
        let special = if mem == MemTy::F8E4M3 {
            let nan = self.cmp(CmpOp::Eq, u, c, Operand::Int(0x7f));
            self.select(u, nan, Operand::Int(0x7fc0_0000), normal)
        } else {
            let big = self.cmp(CmpOp::Ge, u, c, Operand::Int(0x7c));
            let m = self.bin(BinOp::And, u, c, Operand::Int(3));
            let m = self.bin(BinOp::Shl, u, m, Operand::Int(21));
            let infnan = self.bin(BinOp::Or, u, m, Operand::Int(0x7f80_0000));
            self.select(u, big, infnan, normal)
        };
        let fbits = self.new_reg(RegTy::F32);
        self.emit(Inst::Mov {
            dst: fbits,
            src: special,
        });
        let cf = self.cvt(RegTy::F32, c, None);
        let sub = self.bin(
            BinOp::Mul,
            RegTy::F32,
            cf,
            Operand::Float(2f64.powi(1 - bias as i32 - mb as i32)),
        );
        let is_sub = self.cmp(CmpOp::Lt, u, c, Operand::Int(1 << mb));
        let mag = self.select(RegTy::F32, is_sub, sub, Operand::Reg(fbits));
        let s = self.bin(BinOp::And, u, raw, Operand::Int(0x80));
        let neg = self.cmp(CmpOp::Ne, u, s, Operand::Int(0));
        let nmag = self.un(UnOp::Neg, RegTy::F32, mag);
        self.select(RegTy::F32, neg, nmag, mag)
    }

    /// The 8-bit float code (U32) nearest to an f32 (ties to even, one
    /// rounding from f32): e4m3 saturates to ±448 (as `cvt.satfinite`), e5m2
    /// overflows to infinity; NaN gives 0x7f.
    fn encode_f8(&mut self, x: Operand, mem: MemTy) -> Operand {
        let (_, mb, bias) = Self::f8_format(mem);
        let u = RegTy::U32;
        let x = self.materialize(RegTy::F32, x);
        let bits = self.new_reg(u);
        self.emit(Inst::Mov { dst: bits, src: x });
        let bits = Operand::Reg(bits);
        let a = self.bin(BinOp::And, u, bits, Operand::Int(0x7fff_ffff));
        let sbit = self.bin(BinOp::Shr, u, bits, Operand::Int(24));
        let sbit = self.bin(BinOp::And, u, sbit, Operand::Int(0x80));
        // Normals: round the f32 mantissa to `mb` bits, rebias the exponent.
        let drop = 23 - mb as i64;
        let lsb = self.bin(BinOp::Shr, u, a, Operand::Int(drop));
        let lsb = self.bin(BinOp::And, u, lsb, Operand::Int(1));
        let r = self.bin(BinOp::Add, u, a, Operand::Int((1 << (drop - 1)) - 1));
        let r = self.bin(BinOp::Add, u, r, lsb);
        let r = self.bin(BinOp::Shr, u, r, Operand::Int(drop));
        let normal = self.bin(BinOp::Sub, u, r, Operand::Int((127 - bias) << mb));
        // Subnormals: |x| / 2^(1 - bias - mb) rounded to an integer (ties to
        // even, by adding 2^23).
        let af = self.new_reg(RegTy::F32);
        self.emit(Inst::Mov { dst: af, src: a });
        let scaled = self.bin(
            BinOp::Mul,
            RegTy::F32,
            Operand::Reg(af),
            Operand::Float(2f64.powi(bias as i32 - 1 + mb as i32)),
        );
        let magic = self.bin(BinOp::Add, RegTy::F32, scaled, Operand::Float(8_388_608.0));
        let mbits = self.new_reg(u);
        self.emit(Inst::Mov {
            dst: mbits,
            src: magic,
        });
        let sub = self.bin(
            BinOp::Sub,
            u,
            Operand::Reg(mbits),
            Operand::Int(0x4b00_0000),
        );
        let is_sub = self.cmp(CmpOp::Lt, u, a, Operand::Int((128 - bias) << 23));
        let code = self.select(u, is_sub, sub, normal);
        let max = if mem == MemTy::F8E4M3 { 0x7e } else { 0x7c };
        let code = self.bin(BinOp::Min, u, code, Operand::Int(max));
        let nan = self.cmp(CmpOp::Gt, u, a, Operand::Int(0x7f80_0000));
        let code = self.select(u, nan, Operand::Int(0x7f), code);
        self.bin(BinOp::Or, u, code, sbit)
    }

    /// Rounds an f32 register to the nearest bf16 value (ties to even; NaN payloads
    /// are not preserved), keeping it in f32.
    /// An f32 rounded to tf32 (10 mantissa bits, nearest, ties away from
    /// zero), bit for bit as `cvt.rna.tf32.f32` and the CPU executor's
    /// `tf32()`: add half an ulp of tf32 to the bits and clear the low 13;
    /// infinities and NaN pass unchanged. Integer ops, so any arch has it.
    fn round_tf32(&mut self, v: Operand) -> Operand {
        let v = self.materialize(RegTy::F32, v);
        let u = self.new_reg(RegTy::U32);
        self.emit(Inst::Mov { dst: u, src: v });
        let u = Operand::Reg(u);
        let a = self.bin(BinOp::Add, RegTy::U32, u, Operand::Int(0x1000));
        let r = self.bin(BinOp::And, RegTy::U32, a, Operand::Int(0xffff_e000));
        let e = self.bin(BinOp::And, RegTy::U32, u, Operand::Int(0x7f80_0000));
        let special = self.cmp(CmpOp::Eq, RegTy::U32, e, Operand::Int(0x7f80_0000));
        let bits = self.select(RegTy::U32, special, u, r);
        let f = self.new_reg(RegTy::F32);
        self.emit(Inst::Mov { dst: f, src: bits });
        Operand::Reg(f)
    }

    fn round_bf16(&mut self, v: Operand) -> Operand {
        let u = self.new_reg(RegTy::U32);
        self.emit(Inst::Mov { dst: u, src: v });
        let u = Operand::Reg(u);
        let lsb = self.bin(BinOp::Shr, RegTy::U32, u, Operand::Int(16));
        let lsb = self.bin(BinOp::And, RegTy::U32, lsb, Operand::Int(1));
        let a = self.bin(BinOp::Add, RegTy::U32, u, Operand::Int(0x7fff));
        let a = self.bin(BinOp::Add, RegTy::U32, a, lsb);
        let m = self.bin(BinOp::And, RegTy::U32, a, Operand::Int(0xffff_0000));
        let f = self.new_reg(RegTy::F32);
        self.emit(Inst::Mov { dst: f, src: m });
        Operand::Reg(f)
    }

    fn broadcast(&mut self, x: &TV, to: &Rc<Layout>) -> R<TV> {
        if let Some(map) = x.layout.register_map_to(to) {
            return Ok(TV {
                layout: to.clone(),
                ops: map.iter().map(|&i| x.ops[i]).collect(),
                ty: x.ty,
                dtype: x.dtype,
            });
        }
        let collapse: Vec<usize> = (0..to.rank())
            .filter(|&d| x.layout.shape[d] == 1 && to.shape[d] != 1)
            .collect();
        let c = Rc::new(to.collapsed(&collapse));
        let xc = self.convert(x, &c)?;
        match c.register_map_to(to) {
            Some(map) => Ok(TV {
                layout: to.clone(),
                ops: map.iter().map(|&i| xc.ops[i]).collect(),
                ty: x.ty,
                dtype: x.dtype,
            }),
            None => self.unsupported("this broadcast"),
        }
    }

    // ---- memory -------------------------------------------------------------------

    /// Per slot: the address register, byte offset and in-bounds predicate of an
    /// access of `layout`'s elements; plus the vector width that is proven safe.
    fn plan_access(&mut self, tensor: usize, access: &[Access], layout: &Layout) -> R<AccessPlan> {
        if Access::is_gather(access) {
            return self.plan_gather(access, layout);
        }
        let t = self.tensor(tensor)?;
        let (ptr, dims, static_dims, strides, mem, stride_div, dim_div) = (
            t.ptr,
            t.dims.clone(),
            t.static_dims.clone(),
            t.strides.clone(),
            t.mem,
            t.stride_div.clone(),
            t.dim_div.clone(),
        );
        let bytes = mem.bytes() as i64;
        let mut thread_off = Operand::Int(0);
        let mut point_preds = Vec::new();
        // For each tile axis: (tensor axis, start + base, upper bound check needed).
        let mut axes = Vec::new();
        let mut d = 0usize;
        for (a, acc) in access.iter().enumerate() {
            match acc {
                Access::Point(v) => {
                    let idx = self.scalar(*v);
                    let safe = matches!((idx, static_dims[a]), (Operand::Int(i), Some(n)) if i >= 0 && (i as u64) < n);
                    if !safe {
                        point_preds.push(self.cmp(CmpOp::Lt, RegTy::U32, idx, dims[a]));
                    }
                    let t = self.bin(BinOp::Mul, RegTy::I32, idx, strides[a]);
                    thread_off = self.bin(BinOp::Add, RegTy::I32, thread_off, t);
                }
                Access::Range { start, len: _ } => {
                    let s = self.scalar(*start);
                    let b = self.base(&layout.terms[d].clone());
                    let sb = self.bin(BinOp::Add, RegTy::I32, s, b);
                    let sb = self.materialize(RegTy::I32, sb);
                    let t = self.bin(BinOp::Mul, RegTy::I32, sb, strides[a]);
                    thread_off = self.bin(BinOp::Add, RegTy::I32, thread_off, t);
                    let max_base: u64 = layout.terms[d]
                        .iter()
                        .map(|t| ((1u64 << t.bits) - 1) * t.mul as u64)
                        .sum();
                    axes.push((a, sb, *start, max_base, s));
                    d += 1;
                }
                // The verifier keeps gathers from mixing with points and ranges.
                Access::Gather(_) => {
                    return self.unsupported("a gather mixed with a point or range")
                }
            }
        }
        let off64 = self.new_reg(RegTy::I64);
        let thread_off = self.materialize(RegTy::I32, thread_off);
        self.emit(Inst::MulWide {
            dst: off64,
            a: thread_off,
            b: Operand::Int(bytes),
        });
        let base_addr = self.new_reg(RegTy::U64);
        self.emit(Inst::Binary {
            op: BinOp::Add,
            dst: base_addr,
            a: Operand::Reg(ptr),
            b: Operand::Reg(off64),
        });
        // Per (tile axis, offset): the bounds predicate (None when provably in bounds).
        let mut pred_cache: HashMap<(usize, u32), Option<Operand>> = HashMap::new();
        let mut addr_cache: HashMap<Vec<(usize, u32)>, Reg> = HashMap::new();
        let mut combined: HashMap<Vec<Option<Reg>>, Option<Reg>> = HashMap::new();
        let mut slots = Vec::new();
        for slot in &layout.slots {
            let mut preds = point_preds.clone();
            let mut static_off = 0i64;
            let mut dyn_key = Vec::new();
            for (d, &(a, sb, _, max_base, s)) in axes.iter().enumerate() {
                let o = slot[d];
                let p = match pred_cache.get(&(d, o)) {
                    Some(p) => *p,
                    None => {
                        let safe = matches!((s, static_dims[a]), (Operand::Int(st), Some(n))
                            if st >= 0 && (st as u64 + max_base + o as u64) < n);
                        let p = if safe {
                            None
                        } else {
                            let idx = self.bin(BinOp::Add, RegTy::I32, sb, Operand::Int(o as i64));
                            Some(self.cmp(CmpOp::Lt, RegTy::U32, idx, dims[a]))
                        };
                        pred_cache.insert((d, o), p);
                        p
                    }
                };
                preds.extend(p);
                match strides[a] {
                    // Wrapping: only in-bounds lanes (predicated) use the address.
                    Operand::Int(st) => {
                        static_off =
                            static_off.wrapping_add((o as i64).wrapping_mul(st).wrapping_mul(bytes))
                    }
                    _ if o == 0 => {}
                    _ => dyn_key.push((a, o)),
                }
            }
            let addr = if dyn_key.is_empty() {
                base_addr
            } else if let Some(r) = addr_cache.get(&dyn_key) {
                *r
            } else {
                let mut e = Operand::Int(0);
                for &(a, o) in &dyn_key {
                    let t = self.bin(BinOp::Mul, RegTy::I32, strides[a], Operand::Int(o as i64));
                    e = self.bin(BinOp::Add, RegTy::I32, e, t);
                }
                let e = self.materialize(RegTy::I32, e);
                let w = self.new_reg(RegTy::I64);
                self.emit(Inst::MulWide {
                    dst: w,
                    a: e,
                    b: Operand::Int(bytes),
                });
                let r = self.new_reg(RegTy::U64);
                self.emit(Inst::Binary {
                    op: BinOp::Add,
                    dst: r,
                    a: Operand::Reg(base_addr),
                    b: Operand::Reg(w),
                });
                addr_cache.insert(dyn_key, r);
                r
            };
            let key: Vec<Option<Reg>> = preds.iter().map(|p| p.reg()).collect();
            let pred = match combined.get(&key) {
                Some(p) => *p,
                None => {
                    let p = self.and_preds(&preds);
                    let p = self.pred_reg(p);
                    combined.insert(key, p);
                    p
                }
            };
            slots.push(SlotAccess {
                addr,
                offset: static_off,
                pred,
            });
        }
        // Vector width: contiguous runs along the last tile axis when it is the
        // tensor's last axis, with alignment and uniform bounds proven.
        let mut vec = 1u32;
        if let Some(&(a, _, start, max_base, s)) = axes.last() {
            let last = access.len() - 1;
            let rank = layout.rank();
            if a == last {
                let mut v = (16 / mem.bytes()).min(4);
                let terms_ok = |v: u32| layout.terms[rank - 1].iter().all(|t| t.mul % v == 0);
                let start_div = match s {
                    Operand::Int(0) => 1 << 30,
                    Operand::Int(i) => i.unsigned_abs(),
                    _ => self.divisor(start),
                };
                let strides_ok = |v: u32| {
                    stride_div[..last]
                        .iter()
                        .all(|s| s.is_multiple_of(v as u64))
                };
                // Every vector wholly in or out of bounds.
                let dim_ok = |v: u32| dim_div[a].is_multiple_of(v as u64);
                let _ = max_base;
                while v > 1 {
                    if terms_ok(v) && start_div % v as u64 == 0 && strides_ok(v) && dim_ok(v) {
                        break;
                    }
                    v /= 2;
                }
                vec = v;
            }
        }
        Ok(AccessPlan {
            slots,
            vec,
            gather: None,
        })
    }

    /// `plan_access` of a gather: the index tiles converted to `layout`, one
    /// element per access; each slot's address and bounds predicate are
    /// computed where it is accessed (`slot`), so they are not all live at once.
    fn plan_gather(&mut self, access: &[Access], layout: &Layout) -> R<AccessPlan> {
        let rc = Rc::new(layout.clone());
        let mut gather = vec![Vec::with_capacity(access.len()); layout.num_slots()];
        for acc in access {
            let idx = self.val(acc.value());
            let idx = self.convert(&idx, &rc)?;
            for (slot, g) in gather.iter_mut().enumerate() {
                g.push(idx.ops[slot]);
            }
        }
        Ok(AccessPlan {
            slots: vec![],
            vec: 1,
            gather: Some(gather),
        })
    }

    /// The address, offset and bounds predicate of slot `i` of a plan.
    fn slot(&mut self, tensor: usize, plan: &AccessPlan, i: usize) -> R<SlotAccess> {
        let Some(gather) = &plan.gather else {
            return Ok(plan.slots[i]);
        };
        let t = self.tensor(tensor)?;
        let (ptr, dims, static_dims, strides, bytes) = (
            t.ptr,
            t.dims.clone(),
            t.static_dims.clone(),
            t.strides.clone(),
            t.mem.bytes() as i64,
        );
        let mut off = Operand::Int(0);
        let mut preds = Vec::new();
        for (a, &i) in gather[i].iter().enumerate() {
            let safe = matches!((i, static_dims[a]), (Operand::Int(x), Some(d)) if x >= 0 && (x as u64) < d);
            if !safe {
                // Unsigned: a negative index is huge, so one compare checks both ends.
                preds.push(self.cmp(CmpOp::Lt, RegTy::U32, i, dims[a]));
            }
            let t = self.bin(BinOp::Mul, RegTy::I32, i, strides[a]);
            off = self.bin(BinOp::Add, RegTy::I32, off, t);
        }
        let (addr, offset) = match off {
            Operand::Int(k) => (ptr, k.wrapping_mul(bytes)),
            off => {
                let wide = self.new_reg(RegTy::I64);
                self.emit(Inst::MulWide {
                    dst: wide,
                    a: off,
                    b: Operand::Int(bytes),
                });
                let addr = self.new_reg(RegTy::U64);
                self.emit(Inst::Binary {
                    op: BinOp::Add,
                    dst: addr,
                    a: Operand::Reg(ptr),
                    b: Operand::Reg(wide),
                });
                (addr, 0)
            }
        };
        let p = self.and_preds(&preds);
        let pred = self.pred_reg(p);
        Ok(SlotAccess { addr, offset, pred })
    }

    /// Groups of `vec` slots that are contiguous and aligned along the last axis.
    fn vector_groups(layout: &Layout, vec: u32) -> Vec<Vec<usize>> {
        let rank = layout.rank();
        let mut used = vec![false; layout.num_slots()];
        let mut groups = Vec::new();
        for i in 0..layout.num_slots() {
            if used[i] {
                continue;
            }
            let s = &layout.slots[i];
            let mut group = vec![i];
            if vec > 1 && rank > 0 && s[rank - 1].is_multiple_of(vec) {
                let mut all = true;
                let mut members = vec![i];
                for k in 1..vec {
                    let mut t = s.clone();
                    t[rank - 1] += k;
                    match layout.find_slot(&t) {
                        Some(j) if !used[j] => members.push(j),
                        _ => {
                            all = false;
                            break;
                        }
                    }
                }
                if all {
                    group = members;
                }
            }
            for &j in &group {
                used[j] = true;
            }
            groups.push(group);
        }
        groups
    }

    fn load(
        &mut self,
        res: Value,
        tensor: usize,
        access: &[Access],
        mask: Option<Value>,
        other: Constant,
    ) -> R<TV> {
        let ty = self.tk.ty(res).clone();
        let layout = self.blocked(ty.shape());
        if let Some(pi) = self.pipelined_pending.get(&res).copied() {
            self.pipelined.insert(res, (pi, false));
            self.emit(Inst::Comment(format!(
                "load {} pipelined: copied asynchronously {} iterations ahead",
                self.tk.params[tensor].name,
                self.tk.num_stages - 1
            )));
            return Ok(TV {
                layout,
                ops: vec![],
                ty: RegTy::F32,
                dtype: ty.dtype(),
            });
        }
        if self.defer_ok.contains(&res) && mask.is_none() {
            if let Some(d) = self.defer_load(tensor, access, other, ty.shape())? {
                self.deferred.insert(res, (Rc::new(d), false));
                return Ok(TV {
                    layout,
                    ops: vec![],
                    ty: RegTy::F32,
                    dtype: ty.dtype(),
                });
            }
        }
        let t = self.tensor(tensor)?;
        let (mem, dtype) = (t.mem, t.dtype);
        let cty = self.cty(dtype)?;
        self.emit(Inst::Comment(format!(
            "load {}[{}] {}",
            self.tk.params[tensor].name,
            layout
                .shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(","),
            layout
        )));
        let mask = match mask {
            Some(m) => {
                let m = self.val(m);
                Some(self.convert(&m, &layout)?)
            }
            None => None,
        };
        let mut plan = self.plan_access(tensor, access, &layout)?;
        if mask.is_some() {
            plan.vec = 1;
        }
        let rty = raw_ty(mem);
        let direct = rty == cty;
        let other_op = const_operand(other, dtype);
        let other_op = match other_op {
            Operand::Float(f) => Operand::Float(round_const(f, dtype)),
            o => o,
        };
        let mut ops = vec![Operand::Int(0); layout.num_slots()];
        // The addresses of a few accesses first, then their loads: a gather's
        // loads are issued back to back (as ptxas schedules them) rather than
        // each waiting behind its own address arithmetic.
        let groups = Self::vector_groups(&layout, plan.vec);
        for batch in groups.chunks(LOAD_BATCH) {
            let firsts = batch
                .iter()
                .map(|g| self.slot(tensor, &plan, g[0]))
                .collect::<R<Vec<_>>>()?;
            for (group, first) in batch.iter().zip(firsts) {
                let mut pred = first.pred;
                if let Some(m) = &mask {
                    let mut ps: Vec<Operand> = pred.into_iter().map(Operand::Reg).collect();
                    ps.push(m.ops[group[0]]);
                    let p = self.and_preds(&ps);
                    pred = self.pred_reg(p);
                }
                let dsts: Vec<Reg> = group.iter().map(|_| self.new_reg(rty)).collect();
                if pred.is_some() {
                    for &d in &dsts {
                        let init = if direct { other_op } else { Operand::Int(0) };
                        self.emit(Inst::Mov { dst: d, src: init });
                    }
                }
                self.emit(Inst::Ld {
                    space: Space::Global,
                    mem,
                    dst: dsts.clone(),
                    addr: first.addr,
                    offset: first.offset,
                    pred,
                });
                for (k, &slot) in group.iter().enumerate() {
                    let raw = Operand::Reg(dsts[k]);
                    let v = if direct {
                        raw
                    } else {
                        let v = match mem {
                            MemTy::F16 => self.cvt(RegTy::F32, raw, None),
                            MemTy::BF16 => {
                                let sh = self.bin(BinOp::Shl, RegTy::U32, raw, Operand::Int(16));
                                let f = self.new_reg(RegTy::F32);
                                self.emit(Inst::Mov { dst: f, src: sh });
                                Operand::Reg(f)
                            }
                            MemTy::U8 if dtype == DType::Bool => {
                                self.cmp(CmpOp::Ne, RegTy::U32, raw, Operand::Int(0))
                            }
                            MemTy::F8E4M3 | MemTy::F8E5M2 => self.decode_f8(raw, mem),
                            _ => raw,
                        };
                        match pred {
                            Some(p)
                                if other_op != Operand::Int(0)
                                    && other_op != Operand::Float(0.0) =>
                            {
                                self.select(cty, Operand::Reg(p), v, other_op)
                            }
                            Some(p) if cty == RegTy::Pred => {
                                // `other` False: in-bounds and loaded.
                                self.bin(BinOp::And, RegTy::Pred, Operand::Reg(p), v)
                            }
                            _ => v,
                        }
                    };
                    ops[slot] = v;
                }
            }
        }
        Ok(TV {
            layout,
            ops,
            ty: cty,
            dtype,
        })
    }

    fn store(
        &mut self,
        tensor: usize,
        access: &[Access],
        value: Value,
        mask: Option<Value>,
        atomic: bool,
    ) -> R<()> {
        let v = self.val(value);
        let t = self.tensor(tensor)?;
        let mem = t.mem;
        let dtype = t.dtype;
        let layout = v.layout.clone();
        self.emit(Inst::Comment(format!(
            "{} {} {}",
            if atomic { "atomic_add" } else { "store" },
            self.tk.params[tensor].name,
            layout
        )));
        if atomic
            && !matches!(
                mem,
                MemTy::F32 | MemTy::I32 | MemTy::U32 | MemTy::F64 | MemTy::I64 | MemTy::F16
            )
        {
            return self.unsupported(format!("atomic_add on {}", dtype.name()));
        }
        let mask = match mask {
            Some(m) => {
                let m = self.val(m);
                Some(self.convert(&m, &layout)?)
            }
            None => None,
        };
        let mut plan = self.plan_access(tensor, access, &layout)?;
        if mask.is_some() || atomic {
            plan.vec = 1;
        }
        // Replicated threads hold the same elements: only one of them writes.
        let rep = layout.replication_mask(self.tid_bits);
        let owner = if rep != 0 {
            let t = self.bin(
                BinOp::And,
                RegTy::U32,
                Operand::Reg(self.tid),
                Operand::Int(rep as i64),
            );
            Some(self.cmp(CmpOp::Eq, RegTy::U32, t, Operand::Int(0)))
        } else {
            None
        };
        for group in Self::vector_groups(&layout, plan.vec) {
            let first = self.slot(tensor, &plan, group[0])?;
            let mut ps: Vec<Operand> = first.pred.into_iter().map(Operand::Reg).collect();
            ps.extend(owner);
            if let Some(m) = &mask {
                ps.push(m.ops[group[0]]);
            }
            let p = self.and_preds(&ps);
            let pred = self.pred_reg(p);
            let mut srcs = Vec::new();
            for &slot in &group {
                let x = v.ops[slot];
                let s = match mem {
                    MemTy::F16 => {
                        let x = self.materialize(RegTy::F32, x);
                        self.cvt(RegTy::B16, x, None)
                    }
                    MemTy::BF16 => {
                        // The value is already a bf16 value held in f32: take the high half.
                        let x = self.materialize(RegTy::F32, x);
                        let u = self.new_reg(RegTy::U32);
                        self.emit(Inst::Mov { dst: u, src: x });
                        self.bin(BinOp::Shr, RegTy::U32, Operand::Reg(u), Operand::Int(16))
                    }
                    MemTy::U8 if dtype == DType::Bool => {
                        self.select(RegTy::U32, x, Operand::Int(1), Operand::Int(0))
                    }
                    MemTy::F8E4M3 | MemTy::F8E5M2 => self.encode_f8(x, mem),
                    _ => self.materialize(raw_ty(mem), x),
                };
                srcs.push(s);
            }
            if atomic {
                self.emit(Inst::AtomAdd {
                    mem,
                    src: srcs[0],
                    addr: first.addr,
                    offset: first.offset,
                    pred,
                });
            } else {
                self.emit(Inst::St {
                    space: Space::Global,
                    mem,
                    src: srcs,
                    addr: first.addr,
                    offset: first.offset,
                    pred,
                });
            }
        }
        Ok(())
    }

    // ---- reductions -----------------------------------------------------------------

    fn combine(&mut self, r: ReduceOp, ty: RegTy, a: Operand, b: Operand) -> Operand {
        let op = match r {
            ReduceOp::Sum => BinOp::Add,
            ReduceOp::Max => BinOp::Max,
            ReduceOp::Min => BinOp::Min,
        };
        self.bin(op, ty, a, b)
    }

    fn reduce(&mut self, r: ReduceOp, x: &TV, axis: usize, keepdims: bool) -> R<TV> {
        if x.ty == RegTy::Pred {
            // Bools reduce as 0/1 (max: any, min: all).
            let ops = x
                .ops
                .iter()
                .map(|&o| self.select(RegTy::U32, o, Operand::Int(1), Operand::Int(0)))
                .collect();
            let xi = TV {
                ops,
                ty: RegTy::U32,
                ..x.clone()
            };
            let red = self.reduce(r, &xi, axis, keepdims)?;
            let ops = red
                .ops
                .iter()
                .map(|&o| self.cmp(CmpOp::Ne, RegTy::U32, o, Operand::Int(0)))
                .collect();
            return Ok(TV {
                ops,
                ty: RegTy::Pred,
                ..red
            });
        }
        if !matches!(
            x.ty,
            RegTy::F32 | RegTy::I32 | RegTy::U32 | RegTy::F64 | RegTy::I64 | RegTy::U64
        ) {
            return self.unsupported(format!("a reduction over {}", x.dtype.name()));
        }
        let ty = x.ty;
        // Bytes per partial in shared memory.
        let eb: i64 = if ty.words() == 2 { 8 } else { 4 };
        self.emit(Inst::Comment(format!("reduce axis {axis} of {}", x.layout)));
        let out = Rc::new(x.layout.slice(axis, keepdims));
        // 1. Within the thread.
        let mut partial: Vec<Option<Operand>> = vec![None; out.num_slots()];
        for (s, &o) in x.layout.slots.iter().zip(&x.ops) {
            let mut key = s.clone();
            if keepdims {
                key[axis] = 0;
            } else {
                key.remove(axis);
            }
            let j = out.find_slot(&key).expect("slice slot");
            partial[j] = Some(match partial[j] {
                None => o,
                Some(p) => self.combine(r, ty, p, o),
            });
        }
        let mut partial: Vec<Operand> = partial.into_iter().map(|p| p.expect("slot")).collect();
        // 2. Across lanes.
        let warp_bits = self.warp_size.trailing_zeros() as u8;
        let terms = x.layout.terms[axis].clone();
        for t in terms.iter().filter(|t| t.shift < warp_bits) {
            for bit in t.shift..t.shift + t.bits {
                for p in partial.iter_mut() {
                    let src = match self.materialize(ty, *p) {
                        Operand::Reg(r) => r,
                        _ => unreachable!(),
                    };
                    let dst = self.new_reg(ty);
                    self.emit(Inst::ShflXor {
                        dst,
                        src,
                        lane_mask: 1 << bit,
                    });
                    *p = self.combine(r, ty, Operand::Reg(src), Operand::Reg(dst));
                }
            }
        }
        // 3. Across warps, through shared memory.
        let wterms: Vec<Term> = terms
            .iter()
            .filter(|t| t.shift >= warp_bits)
            .copied()
            .collect();
        if !wterms.is_empty() {
            let nw: u32 = wterms.iter().map(|t| 1u32 << t.bits).product();
            let n_out: u64 = out.shape.iter().map(|&d| d as u64).product();
            self.reserve_scratch((n_out * nw as u64 * eb as u64) as u32);
            // The warp's index along the axis.
            let mut widx = Operand::Int(0);
            let mut acc_bits = 0u8;
            for t in &wterms {
                let mut v = self.bin(
                    BinOp::Shr,
                    RegTy::I32,
                    Operand::Reg(self.tid),
                    Operand::Int(t.shift as i64),
                );
                v = self.bin(BinOp::And, RegTy::I32, v, Operand::Int((1 << t.bits) - 1));
                if acc_bits > 0 {
                    v = self.bin(BinOp::Shl, RegTy::I32, v, Operand::Int(acc_bits as i64));
                }
                widx = self.bin(BinOp::Add, RegTy::I32, widx, v);
                acc_bits += t.bits;
            }
            let smem = self.scratch_addr();
            let lb = self.linear_base(&out.clone());
            let row = self.bin(BinOp::Mul, RegTy::I32, lb, Operand::Int(nw as i64 * eb));
            let rbase = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), row);
            let rbase = self.materialize(RegTy::U32, rbase);
            let wo = self.bin(BinOp::Mul, RegTy::I32, widx, Operand::Int(eb));
            let waddr = self.bin(BinOp::Add, RegTy::U32, rbase, wo);
            let waddr = self.materialize(RegTy::U32, waddr).reg().expect("reg");
            let rbase = rbase.reg().expect("reg");
            let strides = row_major(&out.shape);
            let mem = match ty {
                RegTy::F32 => MemTy::F32,
                RegTy::F64 => MemTy::F64,
                RegTy::I64 | RegTy::U64 => MemTy::I64,
                _ => MemTy::U32,
            };
            let lins: Vec<i64> = out
                .slots
                .iter()
                .map(|s| {
                    s.iter()
                        .zip(&strides)
                        .map(|(&o, &st)| o as i64 * st as i64)
                        .sum()
                })
                .collect();
            for (j, p) in partial.iter().enumerate() {
                self.emit(Inst::St {
                    space: Space::Shared,
                    mem,
                    src: vec![*p],
                    addr: waddr,
                    offset: lins[j] * nw as i64 * eb,
                    pred: None,
                });
            }
            self.emit(Inst::Barrier);
            for (j, p) in partial.iter_mut().enumerate() {
                let mut acc: Option<Operand> = None;
                for w in 0..nw as i64 {
                    let dst = self.new_reg(ty);
                    self.emit(Inst::Ld {
                        space: Space::Shared,
                        mem,
                        dst: vec![dst],
                        addr: rbase,
                        offset: lins[j] * nw as i64 * eb + w * eb,
                        pred: None,
                    });
                    acc = Some(match acc {
                        None => Operand::Reg(dst),
                        Some(a) => self.combine(r, ty, a, Operand::Reg(dst)),
                    });
                }
                *p = acc.expect("nw >= 1");
            }
            self.emit(Inst::Barrier);
        }
        Ok(TV {
            layout: out,
            ops: partial,
            ty,
            dtype: x.dtype,
        })
    }

    // ---- dot (FMA path) -------------------------------------------------------------

    fn dot(
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
        if let Some(acc_layout) = self.mma_layout(av.dtype, bv.dtype, m, n, k) {
            return self.dot_mma(a, b, &av, &bv, acc, acc_layout, k);
        }
        if let Some(acc_layout) = self.tf32_layout(av.dtype, bv.dtype, m, n, k, precision) {
            return self.dot_tf32(&av, &bv, acc, acc_layout, k);
        }
        if let Some(acc_layout) = self.mma884_layout(av.dtype, bv.dtype, m, n, k) {
            return self.dot_mma884(&av, &bv, acc, acc_layout, k);
        }
        self.emit(Inst::Comment(format!(
            "dot [{m},{k}] x [{k},{n}] with FMAs, {layout}"
        )));
        // Accumulator registers (written by every k step).
        let init = match acc {
            Some(c) => {
                let c = self.val(c);
                self.convert(&c, &layout)?.ops
            }
            None => vec![Operand::Float(0.0); layout.num_slots()],
        };
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
        let mut rows: HashMap<u32, Reg> = HashMap::new();
        let mut cols: HashMap<u32, Reg> = HashMap::new();
        for s in layout.slots.clone() {
            if let std::collections::hash_map::Entry::Vacant(e) = rows.entry(s[0]) {
                let dst = self.regs.len() as u32;
                self.regs.push(rt);
                e.insert(Reg(dst));
                self.blocks.last_mut().expect("block").push(Inst::Ld {
                    space: Space::Shared,
                    mem: mt,
                    dst: vec![Reg(dst)],
                    addr: pa,
                    offset: s[0] as i64 * k as i64 * es as i64,
                    pred: None,
                });
            }
            if let std::collections::hash_map::Entry::Vacant(e) = cols.entry(s[1]) {
                let dst = self.regs.len() as u32;
                self.regs.push(rt);
                e.insert(Reg(dst));
                self.blocks.last_mut().expect("block").push(Inst::Ld {
                    space: Space::Shared,
                    mem: mt,
                    dst: vec![Reg(dst)],
                    addr: pb,
                    offset: a_bytes as i64 + s[1] as i64 * es as i64,
                    pred: None,
                });
            }
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

    // ---- loads deferred to cp.async --------------------------------------------

    /// The loads of 16-bit tiles used only as tensor-core `dot` operands (`a` or
    /// `b` as loaded, or `b` transposed) of tensors the kernel never writes.
    fn find_deferrable(&self) -> std::collections::HashSet<Value> {
        #[derive(Clone, Copy)]
        enum Use {
            DotA(bool),
            DotB(bool),
            Transpose(Value),
            Other,
        }
        fn walk(
            l: &Lower,
            r: &tile::Region,
            uses: &mut HashMap<Value, Vec<Use>>,
            loads: &mut Vec<(Value, usize)>,
            written: &mut Vec<usize>,
        ) {
            for op in &r.ops {
                match &op.kind {
                    OpKind::Dot { a, b, acc, .. } => {
                        let (ta, tb) = (l.tk.ty(*a), l.tk.ty(*b));
                        let (m, k, n) = (ta.shape()[0], ta.shape()[1], tb.shape()[1]);
                        let ok = l.mma_layout(ta.dtype(), tb.dtype(), m, n, k).is_some();
                        uses.entry(*a).or_default().push(Use::DotA(ok));
                        uses.entry(*b).or_default().push(Use::DotB(ok));
                        if let Some(c) = acc {
                            uses.entry(*c).or_default().push(Use::Other);
                        }
                    }
                    OpKind::Transpose { x } => uses
                        .entry(*x)
                        .or_default()
                        .push(Use::Transpose(op.results[0])),
                    kind => {
                        for v in kind.operands() {
                            uses.entry(v).or_default().push(Use::Other);
                        }
                    }
                }
                match &op.kind {
                    OpKind::Load { tensor, .. } => {
                        let d = l.tk.ty(op.results[0]).dtype();
                        if matches!(d, DType::F16 | DType::BF16) {
                            loads.push((op.results[0], *tensor));
                        }
                    }
                    OpKind::Store { tensor, .. } | OpKind::AtomicAdd { tensor, .. } => {
                        written.push(*tensor)
                    }
                    _ => {}
                }
                for region in op.kind.regions() {
                    walk(l, region, uses, loads, written);
                }
            }
        }
        let mut uses = HashMap::new();
        let (mut loads, mut written) = (Vec::new(), Vec::new());
        walk(self, &self.tk.body, &mut uses, &mut loads, &mut written);
        let none = Vec::new();
        loads
            .into_iter()
            .filter(|(v, t)| {
                let us = uses.get(v).unwrap_or(&none);
                !written.contains(t)
                    && !us.is_empty()
                    && us.iter().all(|u| match u {
                        Use::DotA(ok) | Use::DotB(ok) => *ok,
                        Use::Transpose(t) => {
                            let ts = uses.get(t).unwrap_or(&none);
                            !ts.is_empty() && ts.iter().all(|u| matches!(u, Use::DotB(true)))
                        }
                        Use::Other => false,
                    })
            })
            .map(|(v, _)| v)
            .collect()
    }

    /// Plans a load of a 16-bit `[rows, cols]` tile as 16-byte chunks when every
    /// chunk is provably aligned and wholly in or out of bounds; `None` otherwise.
    /// Whether a load can be planned as aligned 16-byte chunks (see `defer_load`).
    fn can_defer(&self, tensor: usize, access: &[Access], other: Constant, shape: &[u32]) -> bool {
        let Ok(t) = self.tensor(tensor) else {
            return false;
        };
        let last = access.len() - 1;
        let zero =
            matches!(other, Constant::Int(0)) || matches!(other, Constant::Float(f) if f == 0.0);
        let Access::Range { start, len } = &access[last] else {
            return false;
        };
        let start_div = match self.scalar(*start) {
            Operand::Int(0) => 1 << 30,
            Operand::Int(i) => i.unsigned_abs(),
            _ => self.divisor(*start),
        };
        let strides_ok = t.stride_div[..last].iter().all(|s| s.is_multiple_of(8));
        let dim_ok = t.dim_div[last].is_multiple_of(8);
        if shape.len() != 2
            || !zero
            || !len.is_multiple_of(8)
            || !start_div.is_multiple_of(8)
            || !strides_ok
            || !dim_ok
        {
            return false;
        }
        true
    }

    fn defer_load(
        &mut self,
        tensor: usize,
        access: &[Access],
        other: Constant,
        shape: &[u32],
    ) -> R<Option<Deferred>> {
        if !self.can_defer(tensor, access, other, shape) {
            return Ok(None);
        }
        let (rows, cols) = (shape[0], shape[1]);
        self.emit(Inst::Comment(format!(
            "load {}[{rows},{cols}] deferred: copied asynchronously where used",
            self.tk.params[tensor].name
        )));
        let mut layout = Layout::blocked(&[rows, cols / 8], self.num_warps, self.warp_size, 1);
        layout.shape = vec![rows, cols];
        for t in layout.terms[1].iter_mut() {
            t.mul *= 8;
        }
        for s in layout.slots.iter_mut() {
            s[1] *= 8;
        }
        let plan = self.plan_access(tensor, access, &layout)?;
        Ok(Some(Deferred {
            layout,
            slots: plan.slots,
        }))
    }

    /// A new shared buffer for a `[rows, cols]` 16-bit dot operand, row-major
    /// and swizzled.
    /// `after`: the buffer this one must not overlap (the same dot's `a`).
    fn operand_buffer(
        &mut self,
        rows: u32,
        cols: u32,
        what: &str,
        after: Option<usize>,
    ) -> (usize, super::Swizzle) {
        let sw = super::Swizzle::for_rows(cols * 2);
        let index = self.buffers.len();
        let offset = match after {
            Some(a) => {
                let a = &self.buffers[a];
                (a.offset + a.bytes).div_ceil(128) * 128
            }
            None => 0,
        };
        let n = self.buffers.iter().filter(|b| b.swizzle.is_some()).count() / 2;
        self.buffers.push(SmemBuffer {
            name: format!("dot{n}_{what}"),
            offset,
            bytes: rows * cols * 2,
            align: 128,
            purpose: format!("`dot` operand {what} ([{rows}, {cols}] 16-bit, swizzled)"),
            swizzle: Some(sw),
        });
        (index, sw)
    }

    /// The swizzled shared address of element `(r, c)` (`c` a multiple of 8)
    /// of buffer `buf`.
    fn swizzled(&mut self, buf: Reg, sw: super::Swizzle, r: Operand, c: Operand) -> Reg {
        let ra = self.bin(BinOp::Mul, RegTy::I32, r, Operand::Int(sw.row_bytes as i64));
        let ra = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(buf), ra);
        let ph = self.bin(
            BinOp::Shr,
            RegTy::U32,
            r,
            Operand::Int(sw.per_phase.trailing_zeros() as i64),
        );
        let ph = self.bin(
            BinOp::And,
            RegTy::U32,
            ph,
            Operand::Int(sw.max_phase as i64 - 1),
        );
        let ch = self.bin(BinOp::Shr, RegTy::U32, c, Operand::Int(3));
        let swz = self.bin(BinOp::Xor, RegTy::U32, ch, ph);
        let swz = self.bin(BinOp::Shl, RegTy::U32, swz, Operand::Int(4));
        let a = self.bin(BinOp::Add, RegTy::U32, ra, swz);
        self.materialize(RegTy::U32, a).reg().expect("reg")
    }

    /// Issues the async copies of a deferred load into a new operand buffer.
    fn stage_async(
        &mut self,
        d: &Deferred,
        what: &str,
        after: Option<usize>,
    ) -> (usize, super::Swizzle) {
        let (rows, cols) = (d.layout.shape[0], d.layout.shape[1]);
        let (index, sw) = self.operand_buffer(rows, cols, what, after);
        let buf = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr {
            dst: buf,
            buffer: index,
        });
        self.issue_copies(d, buf, sw);
        (index, sw)
    }

    /// The async copies of a deferred load into the swizzled tile at `buf`.
    fn issue_copies(&mut self, d: &Deferred, buf: Reg, sw: super::Swizzle) {
        let br = self.base(&d.layout.terms[0].clone());
        let bc = self.base(&d.layout.terms[1].clone());
        let mut sizes: HashMap<Reg, Reg> = HashMap::new();
        for (s, acc) in d.layout.slots.clone().iter().zip(d.slots.clone()) {
            let r = self.bin(BinOp::Add, RegTy::I32, br, Operand::Int(s[0] as i64));
            let c = self.bin(BinOp::Add, RegTy::I32, bc, Operand::Int(s[1] as i64));
            let dst = self.swizzled(buf, sw, r, c);
            let mut src_size = None;
            if let Some(p) = acc.pred {
                let r = match sizes.get(&p) {
                    Some(r) => *r,
                    None => {
                        let o = self.select(
                            RegTy::U32,
                            Operand::Reg(p),
                            Operand::Int(16),
                            Operand::Int(0),
                        );
                        let r = o.reg().expect("reg");
                        sizes.insert(p, r);
                        r
                    }
                };
                src_size = Some(r);
            }
            self.emit(Inst::CpAsync {
                dst,
                src: acc.addr,
                src_offset: acc.offset,
                bytes: 16,
                src_size,
            });
        }
    }

    // ---- dot on tensor cores ---------------------------------------------------------

    /// The accumulator layout of a tensor-core `dot` of these operand dtypes and
    /// shape on this arch, if one fits (else the FMA path is used).
    fn mma_layout(&self, a: DType, b: DType, m: u32, n: u32, k: u32) -> Option<Rc<Layout>> {
        if a != b || !self.arch.has_ldmatrix() || !k.is_multiple_of(16) {
            return None;
        }
        self.arch
            .mma_shapes()
            .iter()
            .find(|s| s.input == a.name())?;
        Layout::mma_accumulator(m, n, self.num_warps).map(Rc::new)
    }

    /// The accumulator layout of an f32 `dot` with `precision="tf32"` on tensor
    /// cores (`mma.m16n8k8.tf32`, sm_80+), if one fits.
    fn tf32_layout(
        &self,
        a: DType,
        b: DType,
        m: u32,
        n: u32,
        k: u32,
        precision: tile::Precision,
    ) -> Option<Rc<Layout>> {
        if a != DType::F32
            || b != DType::F32
            || precision != tile::Precision::Tf32
            || !self.arch.has_cp_async()
            || !k.is_multiple_of(8)
        {
            return None;
        }
        Layout::mma_accumulator(m, n, self.num_warps).map(Rc::new)
    }

    /// `dot` of f32 tiles rounded to tf32 on tensor cores: both operands staged
    /// in shared memory as f32 with padded rows (A: K + 4, B: N + 8 words, so the
    /// fragment reads are conflict-free), fragments read per element and rounded
    /// with `cvt.rna.tf32.f32`, `mma.m16n8k8` per 16x8 tile and k step of 8.
    fn dot_tf32(
        &mut self,
        av: &TV,
        bv: &TV,
        acc: Option<Value>,
        layout: Rc<Layout>,
        k: u32,
    ) -> R<TV> {
        let (m, n) = (layout.shape[0], layout.shape[1]);
        let (wm, wn) = match layout.kind {
            super::LayoutKind::Mma { warps, .. } => (warps[0], warps[1]),
            _ => unreachable!("mma layout"),
        };
        let (tm, tn) = (m / wm, n / wn);
        let (sa, sb) = (k + 4, n + 8);
        self.emit(Inst::Comment(format!(
            "dot [{m},{k}] x [{k},{n}] tf32 on tensor cores, {layout}"
        )));
        let init = match acc {
            Some(c) => {
                let c = self.val(c);
                self.convert(&c, &layout)?.ops
            }
            None => vec![Operand::Float(0.0); layout.num_slots()],
        };
        let mut cur: Vec<Reg> = Vec::with_capacity(init.len());
        for o in init {
            cur.push(match o {
                Operand::Reg(r) => r,
                o => self.materialize(RegTy::F32, o).reg().expect("reg"),
            });
        }
        let b_off = (m * sa * 4).div_ceil(128) * 128;
        self.reserve_scratch(b_off + k * sb * 4);
        let smem = self.scratch_addr();
        for (tv, off, stride) in [(av, 0u32, sa), (bv, b_off, sb)] {
            let br = self.base(&tv.layout.terms[0].clone());
            let bc = self.base(&tv.layout.terms[1].clone());
            let lin = self.bin(BinOp::Mul, RegTy::I32, br, Operand::Int(stride as i64));
            let lin = self.bin(BinOp::Add, RegTy::I32, lin, bc);
            let lin = self.bin(BinOp::Mul, RegTy::I32, lin, Operand::Int(4));
            let addr = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), lin);
            let addr = self.materialize(RegTy::U32, addr).reg().expect("reg");
            for (s, &o) in tv.layout.slots.iter().zip(&tv.ops) {
                self.emit(Inst::St {
                    space: Space::Shared,
                    mem: MemTy::F32,
                    src: vec![o],
                    addr,
                    offset: off as i64 + (s[0] as i64 * stride as i64 + s[1] as i64) * 4,
                    pred: None,
                });
            }
        }
        self.emit(Inst::Barrier);
        let tid = Operand::Reg(self.tid);
        let lane = self.bin(BinOp::And, RegTy::U32, tid, Operand::Int(31));
        let g = self.bin(BinOp::Shr, RegTy::U32, lane, Operand::Int(2));
        let t = self.bin(BinOp::And, RegTy::U32, lane, Operand::Int(3));
        let warp = self.bin(BinOp::Shr, RegTy::U32, tid, Operand::Int(5));
        let warp_m = self.bin(BinOp::And, RegTy::U32, warp, Operand::Int(wm as i64 - 1));
        let warp_n = self.bin(
            BinOp::Shr,
            RegTy::U32,
            warp,
            Operand::Int(wm.trailing_zeros() as i64),
        );
        let warp_n = self.bin(BinOp::And, RegTy::U32, warp_n, Operand::Int(wn as i64 - 1));
        // A: row warp_m * tm + g, column t; B: row t, column warp_n * tn + g.
        let ar = self.bin(BinOp::Mul, RegTy::U32, warp_m, Operand::Int(tm as i64));
        let ar = self.bin(BinOp::Add, RegTy::U32, ar, g);
        let ar = self.bin(BinOp::Mul, RegTy::U32, ar, Operand::Int(sa as i64));
        let ar = self.bin(BinOp::Add, RegTy::U32, ar, t);
        let ar = self.bin(BinOp::Mul, RegTy::U32, ar, Operand::Int(4));
        let abase = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), ar);
        let abase = self.materialize(RegTy::U32, abase).reg().expect("reg");
        let bc = self.bin(BinOp::Mul, RegTy::U32, warp_n, Operand::Int(tn as i64));
        let bc = self.bin(BinOp::Add, RegTy::U32, bc, g);
        let br = self.bin(BinOp::Mul, RegTy::U32, t, Operand::Int(sb as i64));
        let bl = self.bin(BinOp::Add, RegTy::U32, br, bc);
        let bl = self.bin(BinOp::Mul, RegTy::U32, bl, Operand::Int(4));
        let bbase = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(smem), bl);
        let bbase = self.materialize(RegTy::U32, bbase).reg().expect("reg");
        let frag = |l: &mut Self, addr: Reg, offset: i64| {
            let f = l.new_reg(RegTy::F32);
            l.emit(Inst::Ld {
                space: Space::Shared,
                mem: MemTy::F32,
                dst: vec![f],
                addr,
                offset,
                pred: None,
            });
            let r = l.new_reg(RegTy::B32);
            l.emit(Inst::Cvt {
                dst: r,
                src: f,
                narrow: None,
            });
            r
        };
        let n_tiles = (tn / 8) as usize;
        for kk in 0..(k / 8) as i64 {
            let mut afrag = Vec::new();
            for im in 0..(tm / 16) as i64 {
                let base = (16 * im * sa as i64 + 8 * kk) * 4;
                let row8 = 8 * sa as i64 * 4;
                afrag.push(vec![
                    frag(self, abase, base),
                    frag(self, abase, base + row8),
                    frag(self, abase, base + 16),
                    frag(self, abase, base + row8 + 16),
                ]);
            }
            let mut bfrag = Vec::new();
            for jn in 0..n_tiles as i64 {
                let base = b_off as i64 + (8 * kk * sb as i64 + 8 * jn) * 4;
                bfrag.push(vec![
                    frag(self, bbase, base),
                    frag(self, bbase, base + 4 * sb as i64 * 4),
                ]);
            }
            let mut next = cur.clone();
            for (im, af) in afrag.iter().enumerate() {
                for (jn, bf) in bfrag.iter().enumerate() {
                    let tix = (im * n_tiles + jn) * 4;
                    let d: Vec<Reg> = (0..4).map(|_| self.new_reg(RegTy::F32)).collect();
                    self.emit(Inst::Mma {
                        m: 16,
                        n: 8,
                        k: 8,
                        input: MemTy::F32,
                        d: d.clone(),
                        a: af.clone(),
                        b: bf.clone(),
                        c: cur[tix..tix + 4].to_vec(),
                    });
                    next[tix..tix + 4].copy_from_slice(&d);
                }
            }
            cur = next;
        }
        self.emit(Inst::Barrier);
        Ok(TV {
            layout,
            ops: cur.into_iter().map(Operand::Reg).collect(),
            ty: RegTy::F32,
            dtype: DType::F32,
        })
    }

    /// Where a dot operand is in shared memory: the base register of its
    /// swizzled tile, the swizzle, whether it is stored transposed, and the
    /// transient buffer it got (if any). Pipelined operands are in the current
    /// stage of their loop's buffer; deferred ones are copied now (`issued`);
    /// others are stored from registers.
    fn operand_source(
        &mut self,
        v: Value,
        tv: &TV,
        what: &str,
        after: Option<usize>,
        issued: &mut bool,
    ) -> R<(Reg, super::Swizzle, bool, Option<usize>)> {
        if let Some((pi, trans)) = self.pipelined.get(&v).copied() {
            let p = self.pipes[pi];
            let buf = self.new_reg(RegTy::U32);
            self.emit(Inst::SmemAddr {
                dst: buf,
                buffer: p.buffer,
            });
            if p.stage_bytes == 0 {
                return Ok((buf, p.sw, trans, None));
            }
            let off = self.bin(
                BinOp::Mul,
                RegTy::U32,
                Operand::Reg(p.stage),
                Operand::Int(p.stage_bytes as i64),
            );
            let base = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(buf), off);
            let base = self.materialize(RegTy::U32, base).reg().expect("reg");
            return Ok((base, p.sw, trans, None));
        }
        let (index, sw, trans) = match self.deferred.get(&v).cloned() {
            Some((d, trans)) => {
                *issued = true;
                let (i, sw) = self.stage_async(&d, what, after);
                (i, sw, trans)
            }
            None => {
                let (i, sw) = self.stage_16bit(tv, what, after)?;
                (i, sw, false)
            }
        };
        let base = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr {
            dst: base,
            buffer: index,
        });
        Ok((base, sw, trans, Some(index)))
    }

    /// Stages a `[rows, cols]` tile (values of a 16-bit dtype held in f32) in a new
    /// swizzled shared buffer, row-major; returns the buffer index and swizzle.
    fn stage_16bit(
        &mut self,
        v: &TV,
        what: &str,
        after: Option<usize>,
    ) -> R<(usize, super::Swizzle)> {
        let (rows, cols) = (v.layout.shape[0], v.layout.shape[1]);
        let (index, sw) = self.operand_buffer(rows, cols, what, after);
        let mem = if v.dtype == DType::BF16 {
            MemTy::U16
        } else {
            MemTy::F16
        };
        let buf = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr {
            dst: buf,
            buffer: index,
        });
        let br = self.base(&v.layout.terms[0].clone());
        let bc = self.base(&v.layout.terms[1].clone());
        let lpp = sw.per_phase.trailing_zeros() as i64;
        let mut rows_cache: HashMap<u32, (Operand, Operand)> = HashMap::new();
        let mut cols_cache: HashMap<u32, (Operand, Operand)> = HashMap::new();
        for group in Self::vector_groups(&v.layout, 4.min(pow2_run(&v.layout))) {
            let s0 = v.layout.slots[group[0]].clone();
            let (rowaddr, phase) = match rows_cache.get(&s0[0]) {
                Some(x) => *x,
                None => {
                    let r = self.bin(BinOp::Add, RegTy::I32, br, Operand::Int(s0[0] as i64));
                    let ra = self.bin(BinOp::Mul, RegTy::I32, r, Operand::Int(sw.row_bytes as i64));
                    let ra = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(buf), ra);
                    let ph = self.bin(BinOp::Shr, RegTy::U32, r, Operand::Int(lpp));
                    let ph = self.bin(
                        BinOp::And,
                        RegTy::U32,
                        ph,
                        Operand::Int(sw.max_phase as i64 - 1),
                    );
                    rows_cache.insert(s0[0], (ra, ph));
                    (ra, ph)
                }
            };
            let (chunk, within) = match cols_cache.get(&s0[1]) {
                Some(x) => *x,
                None => {
                    let c = self.bin(BinOp::Add, RegTy::I32, bc, Operand::Int(s0[1] as i64));
                    let ch = self.bin(BinOp::Shr, RegTy::U32, c, Operand::Int(3));
                    let w = self.bin(BinOp::And, RegTy::U32, c, Operand::Int(7));
                    let w = self.bin(BinOp::Shl, RegTy::U32, w, Operand::Int(1));
                    cols_cache.insert(s0[1], (ch, w));
                    (ch, w)
                }
            };
            let swz = self.bin(BinOp::Xor, RegTy::U32, chunk, phase);
            let swz = self.bin(BinOp::Shl, RegTy::U32, swz, Operand::Int(4));
            let a = self.bin(BinOp::Add, RegTy::U32, rowaddr, swz);
            let a = self.bin(BinOp::Add, RegTy::U32, a, within);
            let addr = self.materialize(RegTy::U32, a).reg().expect("reg");
            let mut srcs = Vec::new();
            for &slot in &group {
                let x = self.materialize(RegTy::F32, v.ops[slot]);
                srcs.push(if mem == MemTy::F16 {
                    self.cvt(RegTy::B16, x, None)
                } else {
                    let u = self.new_reg(RegTy::U32);
                    self.emit(Inst::Mov { dst: u, src: x });
                    self.bin(BinOp::Shr, RegTy::U32, Operand::Reg(u), Operand::Int(16))
                });
            }
            self.emit(Inst::St {
                space: Space::Shared,
                mem,
                src: srcs,
                addr,
                offset: 0,
                pred: None,
            });
        }
        Ok((index, sw))
    }

    /// The accumulator layout of an f16 `dot` on sm_70's tensor cores
    /// (`mma.m8n8k4`, which has no `ldmatrix` to feed it), if one fits.
    fn mma884_layout(&self, a: DType, b: DType, m: u32, n: u32, k: u32) -> Option<Rc<Layout>> {
        if a != DType::F16
            || b != DType::F16
            || !self.arch.is_nvidia()
            || self.arch.has_ldmatrix()
            || !k.is_multiple_of(16)
        {
            return None;
        }
        Layout::mma884_accumulator(m, n, self.num_warps).map(Rc::new)
    }

    /// `dot` of f16 tiles on sm_70 with `mma.sync.m8n8k4` (f32 accumulate): `a`
    /// is staged row-major (`[m, k]`) and `b` transposed (`[n, k]`) in swizzled
    /// shared memory, so both fragments are pairs of consecutive-k halves read
    /// with ordinary `ld.shared.v2.u32`. Each warp instruction covers a 16x16
    /// tile (four quad-pairs, each an 8x8 product) and a k step of 4.
    fn dot_mma884(
        &mut self,
        av: &TV,
        bv: &TV,
        acc: Option<Value>,
        layout: Rc<Layout>,
        k: u32,
    ) -> R<TV> {
        let (m, n) = (layout.shape[0], layout.shape[1]);
        let (wm, wn) = match layout.kind {
            super::LayoutKind::Mma { warps, .. } => (warps[0], warps[1]),
            _ => unreachable!("mma layout"),
        };
        let (tm, tn) = (m / wm, n / wn);
        self.emit(Inst::Comment(format!(
            "dot [{m},{k}] x [{k},{n}] f16 on tensor cores (m8n8k4), {layout}"
        )));
        let init = match acc {
            Some(c) => {
                let c = self.val(c);
                self.convert(&c, &layout)?.ops
            }
            None => vec![Operand::Float(0.0); layout.num_slots()],
        };
        let mut cur: Vec<Reg> = Vec::with_capacity(init.len());
        for o in init {
            cur.push(match o {
                Operand::Reg(r) => r,
                o => self.materialize(RegTy::F32, o).reg().expect("reg"),
            });
        }
        let (ai, asw) = self.stage_16bit(av, "a", None)?;
        let bt = TV {
            layout: Rc::new(bv.layout.transpose()),
            ops: bv.ops.clone(),
            ty: bv.ty,
            dtype: bv.dtype,
        };
        let (bi, bsw) = self.stage_16bit(&bt, "b", Some(ai))?;
        self.emit(Inst::Barrier);
        let abase = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr {
            dst: abase,
            buffer: ai,
        });
        let bbase = self.new_reg(RegTy::U32);
        self.emit(Inst::SmemAddr {
            dst: bbase,
            buffer: bi,
        });
        // Fragment rows of a (and columns of b): lane % 4, + 4 for the upper
        // half-warp, + 8 for the quad-pair's half of the 16x16 warp tile.
        let tid = Operand::Reg(self.tid);
        let lane = self.bin(BinOp::And, RegTy::U32, tid, Operand::Int(31));
        let l3 = self.bin(BinOp::And, RegTy::U32, lane, Operand::Int(3));
        let hi = self.bin(BinOp::Shr, RegTy::U32, lane, Operand::Int(2));
        let hi = self.bin(BinOp::And, RegTy::U32, hi, Operand::Int(4));
        let quad = self.bin(BinOp::Add, RegTy::U32, l3, hi);
        let qa = self.bin(BinOp::Shl, RegTy::U32, lane, Operand::Int(1));
        let qa = self.bin(BinOp::And, RegTy::U32, qa, Operand::Int(8));
        let qb = self.bin(BinOp::And, RegTy::U32, lane, Operand::Int(8));
        let warp = self.bin(BinOp::Shr, RegTy::U32, tid, Operand::Int(5));
        let warp_m = self.bin(BinOp::And, RegTy::U32, warp, Operand::Int(wm as i64 - 1));
        let warp_n = self.bin(
            BinOp::Shr,
            RegTy::U32,
            warp,
            Operand::Int(wm.trailing_zeros() as i64),
        );
        let warp_n = self.bin(BinOp::And, RegTy::U32, warp_n, Operand::Int(wn as i64 - 1));
        let arow = self.bin(BinOp::Mul, RegTy::U32, warp_m, Operand::Int(tm as i64));
        let arow = self.bin(BinOp::Add, RegTy::U32, arow, quad);
        let arow = self.bin(BinOp::Add, RegTy::U32, arow, qa);
        let bcol = self.bin(BinOp::Mul, RegTy::U32, warp_n, Operand::Int(tn as i64));
        let bcol = self.bin(BinOp::Add, RegTy::U32, bcol, quad);
        let bcol = self.bin(BinOp::Add, RegTy::U32, bcol, qb);
        let (mt, nt) = ((tm / 16) as usize, (tn / 16) as usize);
        for k16 in 0..k / 16 {
            // Row addresses of this 16-wide k slab (two 16-byte chunks).
            let mut rows = Vec::new();
            for (base, sw, r0, tiles) in [(abase, asw, arow, mt), (bbase, bsw, bcol, nt)] {
                let mut v = Vec::new();
                for t in 0..tiles {
                    let r = self.bin(BinOp::Add, RegTy::U32, r0, Operand::Int(16 * t as i64));
                    let lo = self.swizzled(base, sw, r, Operand::Int(16 * k16 as i64));
                    let hi = self.swizzled(base, sw, r, Operand::Int(16 * k16 as i64 + 8));
                    v.push([lo, hi]);
                }
                rows.push(v);
            }
            for k4 in 0..4usize {
                let mut frags: Vec<Vec<Vec<Reg>>> = Vec::new();
                for v in &rows {
                    let mut f = Vec::new();
                    for addrs in v {
                        let dst: Vec<Reg> = (0..2).map(|_| self.new_reg(RegTy::B32)).collect();
                        self.emit(Inst::Ld {
                            space: Space::Shared,
                            mem: MemTy::U32,
                            dst: dst.clone(),
                            addr: addrs[k4 / 2],
                            offset: (k4 % 2) as i64 * 8,
                            pred: None,
                        });
                        f.push(dst);
                    }
                    frags.push(f);
                }
                let mut next = cur.clone();
                for (im, af) in frags[0].iter().enumerate() {
                    for (jn, bf) in frags[1].iter().enumerate() {
                        let t = (im * nt + jn) * 8;
                        let d: Vec<Reg> = (0..8).map(|_| self.new_reg(RegTy::F32)).collect();
                        self.emit(Inst::Mma {
                            m: 8,
                            n: 8,
                            k: 4,
                            input: MemTy::F16,
                            d: d.clone(),
                            a: af.clone(),
                            b: bf.clone(),
                            c: cur[t..t + 8].to_vec(),
                        });
                        next[t..t + 8].copy_from_slice(&d);
                    }
                }
                cur = next;
            }
        }
        // The buffers are rewritten by the next call (in a loop).
        self.emit(Inst::Barrier);
        Ok(TV {
            layout,
            ops: cur.into_iter().map(Operand::Reg).collect(),
            ty: RegTy::F32,
            dtype: DType::F32,
        })
    }

    /// `dot` with `mma.sync` (m16n8k16 on sm_80+, two m16n8k8 on sm_75): operands
    /// staged in swizzled shared memory, fragments loaded with `ldmatrix`.
    #[allow(clippy::too_many_arguments)]
    fn dot_mma(
        &mut self,
        a: Value,
        b: Value,
        av: &TV,
        bv: &TV,
        acc: Option<Value>,
        layout: Rc<Layout>,
        k: u32,
    ) -> R<TV> {
        let (m, n) = (layout.shape[0], layout.shape[1]);
        let (wm, wn) = match layout.kind {
            super::LayoutKind::Mma { warps, .. } => (warps[0], warps[1]),
            _ => unreachable!("mma layout"),
        };
        let (tm, tn) = (m / wm, n / wn);
        let input = if av.dtype == DType::BF16 {
            MemTy::BF16
        } else {
            MemTy::F16
        };
        let k16 = self.arch >= Arch::Sm80;
        self.emit(Inst::Comment(format!(
            "dot [{m},{k}] x [{k},{n}] {} on tensor cores, {layout}",
            av.dtype.name()
        )));
        let init = match acc {
            Some(c) => {
                let c = self.val(c);
                self.convert(&c, &layout)?.ops
            }
            None => vec![Operand::Float(0.0); layout.num_slots()],
        };
        let mut accs: Vec<Reg> = Vec::with_capacity(init.len());
        for o in init {
            accs.push(match o {
                Operand::Reg(r) => r,
                o => self.materialize(RegTy::F32, o).reg().expect("reg"),
            });
        }
        let mut issued = false;
        let (abase, asw, _, abuf) = self.operand_source(a, av, "a", None, &mut issued)?;
        // `b_nk`: b is stored as its transpose ([n, k] row-major).
        let (bbase, bsw, b_nk, _) = self.operand_source(b, bv, "b", abuf, &mut issued)?;
        if issued {
            self.emit(Inst::CpAsyncCommit);
            self.emit(Inst::CpAsyncWait { pending: 0 });
        }
        self.emit(Inst::Barrier);
        // Per-lane row addresses for ldmatrix.
        let tid = Operand::Reg(self.tid);
        let lane = self.bin(BinOp::And, RegTy::U32, tid, Operand::Int(31));
        let l15 = self.bin(BinOp::And, RegTy::U32, lane, Operand::Int(15));
        let hi = self.bin(BinOp::Shr, RegTy::U32, lane, Operand::Int(4));
        let warp = self.bin(BinOp::Shr, RegTy::U32, tid, Operand::Int(5));
        let warp_m = self.bin(BinOp::And, RegTy::U32, warp, Operand::Int(wm as i64 - 1));
        let warp_n = self.bin(
            BinOp::Shr,
            RegTy::U32,
            warp,
            Operand::Int(wm.trailing_zeros() as i64),
        );
        let warp_n = self.bin(BinOp::And, RegTy::U32, warp_n, Operand::Int(wn as i64 - 1));
        // Swizzled address of 16-byte chunk `chunk` (+ `hi` when `lane_chunk`) of row `r`.
        let addr_of = |l: &mut Self, base: Reg, sw: super::Swizzle, r: Operand, chunk: Operand| {
            let ra = l.bin(BinOp::Mul, RegTy::U32, r, Operand::Int(sw.row_bytes as i64));
            let ra = l.bin(BinOp::Add, RegTy::U32, Operand::Reg(base), ra);
            let ph = l.bin(
                BinOp::Shr,
                RegTy::U32,
                r,
                Operand::Int(sw.per_phase.trailing_zeros() as i64),
            );
            let ph = l.bin(
                BinOp::And,
                RegTy::U32,
                ph,
                Operand::Int(sw.max_phase as i64 - 1),
            );
            let c = l.bin(BinOp::Xor, RegTy::U32, chunk, ph);
            let c = l.bin(BinOp::Shl, RegTy::U32, c, Operand::Int(4));
            let a = l.bin(BinOp::Add, RegTy::U32, ra, c);
            l.materialize(RegTy::U32, a).reg().expect("reg")
        };
        let arow0 = self.bin(BinOp::Mul, RegTy::U32, warp_m, Operand::Int(tm as i64));
        let arow0 = self.bin(BinOp::Add, RegTy::U32, arow0, l15);
        let bcol0 = self.bin(BinOp::Mul, RegTy::U32, warp_n, Operand::Int(tn as i64 / 8));
        let n_tiles = tn / 8;
        let b_x4 = n_tiles % 2 == 0;
        let bchunk0 = if b_x4 {
            self.bin(BinOp::Add, RegTy::U32, bcol0, hi)
        } else {
            bcol0
        };
        let mut cur = accs;
        for kk in 0..k / 16 {
            // A fragments: one x4 per 16-row tile.
            let mut afrag = Vec::new();
            for im in 0..tm / 16 {
                let r = self.bin(BinOp::Add, RegTy::U32, arow0, Operand::Int(16 * im as i64));
                let ch = self.bin(BinOp::Add, RegTy::U32, hi, Operand::Int(2 * kk as i64));
                let addr = addr_of(self, abase, asw, r, ch);
                let dst: Vec<Reg> = (0..4).map(|_| self.new_reg(RegTy::B32)).collect();
                self.emit(Inst::LdMatrix {
                    dst: dst.clone(),
                    addr,
                    trans: false,
                });
                afrag.push(dst);
            }
            // B fragments (transposed loads of the row-major [k, n] tile).
            let mut bfrag: Vec<Vec<Reg>> = Vec::new();
            let kr = self.bin(BinOp::Add, RegTy::U32, l15, Operand::Int(16 * kk as i64));
            let step = if b_x4 { 2 } else { 1 };
            for jn in (0..n_tiles).step_by(step) {
                let addr = if b_nk {
                    // Rows are n: lanes 0-7 / 8-15 read k chunks 0 / 1 of the
                    // first n tile, lanes 16-31 the same of the second.
                    let l7 = self.bin(BinOp::And, RegTy::U32, lane, Operand::Int(7));
                    let mut r = self.bin(BinOp::Mul, RegTy::U32, warp_n, Operand::Int(tn as i64));
                    r = self.bin(BinOp::Add, RegTy::U32, r, Operand::Int(8 * jn as i64));
                    r = self.bin(BinOp::Add, RegTy::U32, r, l7);
                    if b_x4 {
                        let h8 = self.bin(BinOp::Shl, RegTy::U32, hi, Operand::Int(3));
                        r = self.bin(BinOp::Add, RegTy::U32, r, h8);
                    }
                    let kc = self.bin(BinOp::Shr, RegTy::U32, lane, Operand::Int(3));
                    let kc = self.bin(BinOp::And, RegTy::U32, kc, Operand::Int(1));
                    let kc = self.bin(BinOp::Add, RegTy::U32, kc, Operand::Int(2 * kk as i64));
                    addr_of(self, bbase, bsw, r, kc)
                } else {
                    let ch = self.bin(BinOp::Add, RegTy::U32, bchunk0, Operand::Int(jn as i64));
                    addr_of(self, bbase, bsw, kr, ch)
                };
                let cnt = if b_x4 { 4 } else { 2 };
                let dst: Vec<Reg> = (0..cnt).map(|_| self.new_reg(RegTy::B32)).collect();
                self.emit(Inst::LdMatrix {
                    dst: dst.clone(),
                    addr,
                    trans: !b_nk,
                });
                bfrag.push(dst[..2].to_vec());
                if b_x4 {
                    bfrag.push(dst[2..].to_vec());
                }
            }
            let mut next = cur.clone();
            for (im, af) in afrag.iter().enumerate() {
                for (jn, bf) in bfrag.iter().enumerate() {
                    let t = (im * n_tiles as usize + jn) * 4;
                    let c: Vec<Reg> = cur[t..t + 4].to_vec();
                    let d: Vec<Reg> = (0..4).map(|_| self.new_reg(RegTy::F32)).collect();
                    if k16 {
                        self.emit(Inst::Mma {
                            m: 16,
                            n: 8,
                            k: 16,
                            input,
                            d: d.clone(),
                            a: af.clone(),
                            b: bf.clone(),
                            c,
                        });
                    } else {
                        let mid: Vec<Reg> = (0..4).map(|_| self.new_reg(RegTy::F32)).collect();
                        self.emit(Inst::Mma {
                            m: 16,
                            n: 8,
                            k: 8,
                            input,
                            d: mid.clone(),
                            a: af[..2].to_vec(),
                            b: bf[..1].to_vec(),
                            c,
                        });
                        self.emit(Inst::Mma {
                            m: 16,
                            n: 8,
                            k: 8,
                            input,
                            d: d.clone(),
                            a: af[2..].to_vec(),
                            b: bf[1..].to_vec(),
                            c: mid,
                        });
                    }
                    next[t..t + 4].copy_from_slice(&d);
                }
            }
            cur = next;
        }
        // The buffers are rewritten by the next call (in a loop).
        self.emit(Inst::Barrier);
        Ok(TV {
            layout,
            ops: cur.into_iter().map(Operand::Reg).collect(),
            ty: RegTy::F32,
            dtype: DType::F32,
        })
    }

    // ---- control flow ---------------------------------------------------------------

    /// Fresh registers to carry `init` around a loop (moved in now).
    /// `hint` gives, per carried value, the layout the loop body will yield it
    /// in where known; a uniform initial value (a splat) takes that layout, so
    /// the loop needs no conversion on its back edge.
    fn carried(&mut self, init: &[Value], hint: &[Option<Rc<Layout>>]) -> Vec<TV> {
        init.iter()
            .enumerate()
            .map(|(i, v)| {
                let mut t = self.val(*v);
                if let Some(Some(l)) = hint.get(i) {
                    let uniform = t.ops.iter().all(|o| *o == t.ops[0]);
                    if uniform && l.shape == t.layout.shape && *l != t.layout {
                        t = TV {
                            ops: vec![t.ops[0]; l.num_slots()],
                            layout: l.clone(),
                            ..t
                        };
                    }
                }
                let ops = t
                    .ops
                    .iter()
                    .map(|&o| {
                        let dst = self.new_reg(t.ty);
                        self.emit(Inst::Mov { dst, src: o });
                        Operand::Reg(dst)
                    })
                    .collect();
                TV { ops, ..t }
            })
            .collect()
    }

    /// Deferred loads from outside a loop used as dot operands in its body
    /// (attention's q): copied once, before the loop, into a buffer that lives
    /// through it, instead of at every iteration's dot. Returns them.
    fn hoist_invariant_operands(&mut self, body: &tile::Region) -> Vec<Value> {
        let mut found = Vec::new();
        for op in &body.ops {
            let cands: Vec<Value> = match &op.kind {
                OpKind::Dot { a, b, .. } => vec![*a, *b],
                OpKind::Transpose { x } => vec![*x],
                _ => vec![],
            };
            for v in cands {
                if self.deferred.contains_key(&v)
                    && !self.pipelined.contains_key(&v)
                    && !found.contains(&v)
                {
                    found.push(v);
                }
            }
        }
        if found.is_empty() {
            return found;
        }
        self.emit(Inst::Comment(format!(
            "{} loop-invariant dot operands copied once",
            found.len()
        )));
        for &v in &found {
            let (d, trans) = self.deferred[&v].clone();
            let (rows, cols) = (d.layout.shape[0], d.layout.shape[1]);
            let sw = super::Swizzle::for_rows(cols * 2);
            let buffer = self.buffers.len();
            self.buffers.push(SmemBuffer {
                name: format!("invariant{}", self.pipes.len()),
                offset: 0,
                bytes: rows * cols * 2,
                align: 128,
                purpose: format!(
                    "a loop-invariant `dot` operand ([{rows}, {cols}] 16-bit, swizzled)"
                ),
                swizzle: Some(sw),
            });
            self.persistent.push(buffer);
            let buf = self.new_reg(RegTy::U32);
            self.emit(Inst::SmemAddr { dst: buf, buffer });
            self.issue_copies(&d, buf, sw);
            self.pipes.push(Pipe {
                buffer,
                sw,
                stage_bytes: 0,
                stage: self.tid,
            });
            self.pipelined.insert(v, (self.pipes.len() - 1, trans));
        }
        self.emit(Inst::CpAsyncCommit);
        found
    }

    /// Sets up software pipelining of a `for` loop (`num_stages` >= 2, sm_80+):
    /// the loads at the top of its body that feed only tensor-core dots, whose
    /// indices are the induction variable or values from outside the loop, get
    /// `num_stages` buffers; the copies of the first `num_stages - 1`
    /// iterations are issued now, one commit group per iteration.
    fn pipeline_prologue(
        &mut self,
        body: &tile::Region,
        lo: Operand,
        step: Operand,
    ) -> R<Option<LoopPipe>> {
        let stages = self.tk.num_stages;
        if !self.arch.has_cp_async() || stages < 2 {
            return Ok(None);
        }
        let iv = body.args[0];
        let outside = |l: &Self, v: &Value| !body.args.contains(v) && l.vals.contains_key(v);
        let mut loads = Vec::new();
        for op in &body.ops {
            let OpKind::Load {
                tensor,
                access,
                mask: None,
                other,
            } = &op.kind
            else {
                continue;
            };
            let v = op.results[0];
            let uses_iv = access
                .iter()
                .any(|a| matches!(a, Access::Range { start, .. } if *start == iv));
            let indices_ok = access.iter().all(|a| match a {
                Access::Point(x) => outside(self, x),
                Access::Range { start, .. } => *start == iv || outside(self, start),
                Access::Gather(_) => false,
            });
            let shape = self.tk.ty(v).shape().to_vec();
            if self.defer_ok.contains(&v)
                && uses_iv
                && indices_ok
                && self.can_defer(*tensor, access, *other, &shape)
            {
                loads.push((v, *tensor, access.clone(), *other, shape));
            }
        }
        if loads.is_empty() {
            return Ok(None);
        }
        self.emit(Inst::Comment(format!(
            "software pipeline: {} loads, {stages} stages",
            loads.len()
        )));
        let stage = self.new_reg(RegTy::U32);
        self.emit(Inst::Mov {
            dst: stage,
            src: Operand::Int(0),
        });
        let mut pipes = Vec::new();
        for (v, tensor, _, _, shape) in &loads {
            let (rows, cols) = (shape[0], shape[1]);
            let stage_bytes = rows * cols * 2;
            let sw = super::Swizzle::for_rows(cols * 2);
            let buffer = self.buffers.len();
            self.buffers.push(SmemBuffer {
                name: format!("pipe{}_{}", self.pipes.len(), self.tk.params[*tensor].name),
                offset: 0,
                bytes: stage_bytes * stages,
                align: 128,
                purpose: format!("{stages} stages of a pipelined `dot` operand ([{rows}, {cols}] 16-bit, swizzled)"),
                swizzle: Some(sw),
            });
            self.persistent.push(buffer);
            self.pipes.push(Pipe {
                buffer,
                sw,
                stage_bytes,
                stage,
            });
            let pi = self.pipes.len() - 1;
            self.pipelined_pending.insert(*v, pi);
            pipes.push(pi);
        }
        let p = LoopPipe {
            loads: loads
                .into_iter()
                .zip(pipes)
                .map(|((v, t, a, o, sh), pi)| (v, t, a, o, sh, pi))
                .collect(),
            stage,
            stages,
        };
        for s in 0..stages - 1 {
            let off = self.bin(BinOp::Mul, RegTy::I32, step, Operand::Int(s as i64));
            let ivs = self.bin(BinOp::Add, RegTy::I32, lo, off);
            self.issue_stage(body, &p, ivs, Operand::Int(s as i64))?;
            self.emit(Inst::CpAsyncCommit);
        }
        Ok(Some(p))
    }

    /// At the top of the loop body: the copies for `num_stages - 1` iterations
    /// ahead (into the stage the previous iteration finished with), then a wait
    /// for this iteration's stage.
    fn pipeline_prefetch(
        &mut self,
        body: &tile::Region,
        p: &LoopPipe,
        iv: Operand,
        step: Operand,
    ) -> R<()> {
        let ahead = p.stages as i64 - 1;
        let t = self.bin(
            BinOp::Add,
            RegTy::U32,
            Operand::Reg(p.stage),
            Operand::Int(ahead),
        );
        let wrap = self.cmp(CmpOp::Ge, RegTy::U32, t, Operand::Int(p.stages as i64));
        let u = self.bin(BinOp::Sub, RegTy::U32, t, Operand::Int(p.stages as i64));
        let next = self.select(RegTy::U32, wrap, u, t);
        let off = self.bin(BinOp::Mul, RegTy::I32, step, Operand::Int(ahead));
        let ivn = self.bin(BinOp::Add, RegTy::I32, iv, off);
        self.issue_stage(body, p, ivn, next)?;
        self.emit(Inst::CpAsyncCommit);
        self.emit(Inst::CpAsyncWait {
            pending: p.stages - 1,
        });
        self.emit(Inst::Barrier);
        Ok(())
    }

    /// The copies of every pipelined load for the iteration whose induction
    /// variable is `ivv`, into stage `stage`.
    fn issue_stage(
        &mut self,
        body: &tile::Region,
        p: &LoopPipe,
        ivv: Operand,
        stage: Operand,
    ) -> R<()> {
        let ivv = self.materialize(RegTy::I32, ivv);
        self.overrides.insert(body.args[0], ivv);
        for (_, tensor, access, other, shape, pi) in &p.loads {
            let Some(d) = self.defer_load(*tensor, access, *other, shape)? else {
                self.overrides.clear();
                return self.unsupported("a pipelined load whose alignment changed");
            };
            let pipe = self.pipes[*pi];
            let buf = self.new_reg(RegTy::U32);
            self.emit(Inst::SmemAddr {
                dst: buf,
                buffer: pipe.buffer,
            });
            let off = self.bin(
                BinOp::Mul,
                RegTy::U32,
                stage,
                Operand::Int(pipe.stage_bytes as i64),
            );
            let base = self.bin(BinOp::Add, RegTy::U32, Operand::Reg(buf), off);
            let base = self.materialize(RegTy::U32, base).reg().expect("reg");
            self.issue_copies(&d, base, pipe.sw);
        }
        self.overrides.clear();
        Ok(())
    }

    /// The layouts a loop body will yield its values in, where the ops that
    /// compute them decide it: a `dot` result, its reductions, and elementwise
    /// ops over those (an elementwise op keeps its first operand's layout; when
    /// that operand is the carried value itself, the other operand decides).
    fn yield_layouts(&self, body: &tile::Region) -> Vec<Option<Rc<Layout>>> {
        let Some(OpKind::Yield(ys)) = body.ops.last().map(|o| &o.kind) else {
            return vec![];
        };
        ys.iter().map(|y| self.predict(body, *y, 8)).collect()
    }

    fn predict(&self, body: &tile::Region, v: Value, depth: u32) -> Option<Rc<Layout>> {
        if depth == 0 {
            return None;
        }
        let op = body.ops.iter().find(|o| o.results.contains(&v))?;
        let p = |x: Value| self.predict(body, x, depth - 1);
        match &op.kind {
            OpKind::Dot {
                a, b, precision, ..
            } => {
                let (ta, tb) = (self.tk.ty(*a), self.tk.ty(*b));
                let (m, k, n) = (ta.shape()[0], ta.shape()[1], tb.shape()[1]);
                Some(
                    self.mma_layout(ta.dtype(), tb.dtype(), m, n, k)
                        .or_else(|| self.tf32_layout(ta.dtype(), tb.dtype(), m, n, k, *precision))
                        .or_else(|| self.mma884_layout(ta.dtype(), tb.dtype(), m, n, k))
                        .unwrap_or_else(|| self.blocked(&[m, n])),
                )
            }
            OpKind::Reduce {
                x, axis, keepdims, ..
            } => p(*x).map(|l| Rc::new(l.slice(*axis, *keepdims))),
            OpKind::Unary { x, .. } | OpKind::Cast { x, .. } => p(*x),
            OpKind::Binary { a, b, .. } | OpKind::Select { a, b, .. } => p(*a).or_else(|| p(*b)),
            _ => None,
        }
    }

    /// Moves `vals` into the registers of `into` (converting layouts), as a
    /// parallel copy.
    fn assign(&mut self, into: &[TV], vals: &[TV]) -> R<()> {
        let mut temps = Vec::new();
        for (dst, v) in into.iter().zip(vals) {
            let v = self.convert(v, &dst.layout)?;
            for &o in &v.ops {
                let t = self.new_reg(dst.ty);
                self.emit(Inst::Mov { dst: t, src: o });
                temps.push(t);
            }
        }
        let mut k = 0;
        for dst in into {
            for &o in &dst.ops {
                let r = o.reg().expect("carried registers");
                self.emit(Inst::Mov {
                    dst: r,
                    src: Operand::Reg(temps[k]),
                });
                k += 1;
            }
        }
        Ok(())
    }

    fn for_loop(
        &mut self,
        op: &tile::Op,
        lo: Value,
        hi: Value,
        step: Value,
        init: &[Value],
        body: &tile::Region,
    ) -> R<()> {
        let (lo_o, hi_o, step_o) = (self.scalar(lo), self.scalar(hi), self.scalar(step));
        if step_o == Operand::Int(0) {
            return self.unsupported("a `range` with step 0");
        }
        let hint = self.yield_layouts(body);
        let carried = self.carried(init, &hint);
        // The loop variable has the bounds' type (i32, or i64 over i64 bounds).
        let idt = self.tk.ty(body.args[0]).dtype();
        let ity = if idt == DType::I64 {
            RegTy::I64
        } else {
            RegTy::I32
        };
        let iv = self.new_reg(ity);
        let d = gcd(self.divisor(lo), self.divisor(step));
        self.div.insert(body.args[0], d);
        self.vals
            .insert(body.args[0], self.scalar_tv(Operand::Reg(iv), ity, idt));
        for (a, c) in body.args[1..].iter().zip(&carried) {
            self.define(*a, c.clone());
        }
        let hoisted = self.hoist_invariant_operands(body);
        let pipe = self.pipeline_prologue(body, lo_o, step_o)?;
        if pipe.is_none() && !hoisted.is_empty() {
            self.emit(Inst::CpAsyncWait { pending: 0 });
            self.emit(Inst::Barrier);
        }
        self.blocks.push(Vec::new());
        if let Some(p) = &pipe {
            self.pipeline_prefetch(body, p, Operand::Reg(iv), step_o)?;
        }
        let yields = self.region_ops(&body.ops)?.unwrap_or_default();
        self.assign(&carried, &yields)?;
        if let Some(p) = &pipe {
            // Next stage, cyclically.
            let t = self.bin(
                BinOp::Add,
                RegTy::U32,
                Operand::Reg(p.stage),
                Operand::Int(1),
            );
            let wrap = self.cmp(CmpOp::Eq, RegTy::U32, t, Operand::Int(p.stages as i64));
            let n = self.select(RegTy::U32, wrap, Operand::Int(0), t);
            self.emit(Inst::Mov {
                dst: p.stage,
                src: n,
            });
        }
        let code = self.blocks.pop().unwrap_or_default();
        self.span = op.span;
        self.emit(Inst::For {
            iv,
            lo: lo_o,
            hi: hi_o,
            step: step_o,
            body: code,
        });
        for v in hoisted {
            self.pipelined.remove(&v);
        }
        if let Some(p) = pipe {
            // Copies for iterations that did not run.
            self.emit(Inst::CpAsyncWait { pending: 0 });
            for v in p.loads.iter().map(|l| l.0) {
                self.pipelined_pending.remove(&v);
            }
        }
        for (r, c) in op.results.iter().zip(carried) {
            self.define(*r, c);
        }
        Ok(())
    }

    fn while_loop(
        &mut self,
        op: &tile::Op,
        init: &[Value],
        cond: &tile::Region,
        body: &tile::Region,
    ) -> R<()> {
        let hint = self.yield_layouts(body);
        let carried = self.carried(init, &hint);
        for (a, c) in cond.args.iter().zip(&carried) {
            self.define(*a, c.clone());
        }
        self.blocks.push(Vec::new());
        let y = self.region_ops(&cond.ops)?.unwrap_or_default();
        let p = match y.first() {
            Some(t) => self.materialize(RegTy::Pred, t.ops[0]),
            None => return self.unsupported("a `while` condition without a value"),
        };
        let cond_code = self.blocks.pop().unwrap_or_default();
        for (a, c) in body.args.iter().zip(&carried) {
            self.define(*a, c.clone());
        }
        self.blocks.push(Vec::new());
        let yields = self.region_ops(&body.ops)?.unwrap_or_default();
        self.assign(&carried, &yields)?;
        let body_code = self.blocks.pop().unwrap_or_default();
        self.span = op.span;
        self.emit(Inst::While {
            cond: cond_code,
            pred: p.reg().expect("reg"),
            body: body_code,
        });
        for (r, c) in op.results.iter().zip(carried) {
            self.define(*r, c);
        }
        Ok(())
    }

    fn if_op(
        &mut self,
        op: &tile::Op,
        cond: Value,
        then: &tile::Region,
        otherwise: &tile::Region,
    ) -> R<()> {
        let c = self.scalar(cond);
        let c = self.materialize(RegTy::Pred, c).reg().expect("reg");
        self.blocks.push(Vec::new());
        let ty_then = self.region_ops(&then.ops)?.unwrap_or_default();
        // The merged results: fresh registers in the then-branch's layouts.
        let results: Vec<TV> = ty_then
            .iter()
            .map(|t| TV {
                ops: t
                    .ops
                    .iter()
                    .map(|_| Operand::Reg(self.new_reg(t.ty)))
                    .collect(),
                ..t.clone()
            })
            .collect();
        self.assign(&results, &ty_then)?;
        let then_code = self.blocks.pop().unwrap_or_default();
        self.blocks.push(Vec::new());
        let ty_else = self.region_ops(&otherwise.ops)?.unwrap_or_default();
        self.assign(&results, &ty_else)?;
        let else_code = self.blocks.pop().unwrap_or_default();
        self.span = op.span;
        self.emit(Inst::If {
            cond: c,
            then: then_code,
            otherwise: else_code,
        });
        for (r, t) in op.results.iter().zip(results) {
            self.define(*r, t);
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
struct SlotAccess {
    addr: Reg,
    offset: i64,
    pred: Option<Reg>,
}

/// The software pipeline of one loop: its loads (value, tensor, access,
/// other, shape, pipe) and the stage register.
struct LoopPipe {
    #[allow(clippy::type_complexity)]
    loads: Vec<(Value, usize, Vec<Access>, Constant, Vec<u32>, usize)>,
    stage: Reg,
    stages: u32,
}

/// A software pipeline of one load in a loop: `stages` copies of its tile in
/// `buffer`, the loop's current stage in register `stage`.
#[derive(Clone, Copy, Debug)]
struct Pipe {
    buffer: usize,
    sw: super::Swizzle,
    stage_bytes: u32,
    stage: Reg,
}

/// A load of a 16-bit tile planned as 16-byte chunks (one per slot of
/// `layout`, whose slots are the chunks' first elements), issued later as
/// async copies.
#[derive(Debug)]
struct Deferred {
    layout: Layout,
    slots: Vec<SlotAccess>,
}

/// How many accesses of a load have their addresses computed before the
/// first of them is issued (see `load`).
const LOAD_BATCH: usize = 4;

struct AccessPlan {
    slots: Vec<SlotAccess>,
    vec: u32,
    /// For a gather: per slot, its index on each tensor axis (`slots` is empty).
    gather: Option<Vec<Vec<Operand>>>,
}

/// The length of the contiguous runs along the last axis of a layout's slots
/// (its size per thread there), a power of two.
fn pow2_run(l: &Layout) -> u32 {
    match &l.kind {
        super::LayoutKind::Blocked {
            size_per_thread, ..
        } => *size_per_thread.last().unwrap_or(&1),
        _ => 1,
    }
}

fn row_major(shape: &[u32]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1] as u64;
    }
    s
}

fn unary_name(u: UnaryOp) -> &'static str {
    match u {
        UnaryOp::Neg => "-",
        UnaryOp::Not => "not",
        UnaryOp::Invert => "~",
        UnaryOp::Exp => "exp",
        UnaryOp::Exp2 => "exp2",
        UnaryOp::Log => "log",
        UnaryOp::Log2 => "log2",
        UnaryOp::Sqrt => "sqrt",
        UnaryOp::Rsqrt => "rsqrt",
        UnaryOp::Abs => "abs",
        UnaryOp::Sigmoid => "sigmoid",
        UnaryOp::Tanh => "tanh",
        UnaryOp::Erf => "erf",
    }
}
