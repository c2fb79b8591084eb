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
//!
//! # Layout of this module
//!
//! One context struct, `Lower`, with its `impl` spread over files by
//! concern (each file has `impl Lower { ... }` for its part; the struct, the
//! value table and the entry point stay here):
//!
//! | file | lowers |
//! |------|--------|
//! | `emit.rs` | scalar instruction helpers (`bin`, `cmp`, `select`, `cvt`, ...) |
//! | `layouts.rs` | default layouts, per-thread base coordinates, layout exchange through shared memory |
//! | `params.rs` | the parameter list and the prologue (pointers, dims, strides, divisibility checks) |
//! | `ops.rs` | the per-op dispatch over a Tile IR region |
//! | `elementwise.rs` | unary/binary ops, casts, broadcasts, narrow-dtype rounding |
//! | `memory.rs` | global loads, stores and atomics: access plans, vectorisation, bounds predicates |
//! | `fast_path.rs` | the uniform whole-tile bounds check and the unpredicated access it branches to |
//! | `packed.rs` | bf16 vectors moved as packed 32-bit words (16-byte accesses) |
//! | `reduce.rs` | reductions (thread, lanes, warps) |
//! | `dot_fma.rs` | `dot`'s choice of unit, and the FMA path |
//! | `async_copy.rs` | loads deferred to `cp.async` into swizzled operand buffers |
//! | `mma/` | tensor-core dots: `mma16816.rs` (with the rotated mainloop), `tf32.rs`, `mma884.rs`, `wgmma.rs` (sm_90a), `amd.rs`, and `staging.rs` for their operands |
//! | `pipeline.rs` | the asynchronous-copy decisions as a printable `PipelinePlan` (see `lower_with_plan`), and carrying them out: loop-invariant operands, software pipelines of `for` loops |
//! | `tma.rs` | the wgmma loops' pipelines on TMA copies and transaction barriers (sm_90a) |
//! | `across.rs` | such a pipeline run across the iterations of the loop around it (a persistent GEMM's tiles) |
//! | `staged_store.rs` | 16-bit accumulator tiles stored through shared memory: by TMA (sm_90a) or 16-byte stores |
//! | `control.rs` | `for`, `while`, `if` and their carried values |
//!
//! A method is `pub(super)` only where a sibling file calls it.

mod across;
mod async_copy;
mod control;
mod dot_fma;
mod elementwise;
mod emit;
mod f64_math;
mod fast_path;
mod layouts;
mod memory;
mod mma;
mod ops;
mod packed;
mod params;
mod pipeline;
mod reduce;
mod staged_store;
mod tma;

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use self::pipeline::Pipeline;
use super::layout::{Layout, Term, WarpOrder};
use super::{Inst, Kernel, MemTy, Operand, Param, Reg, RegTy, SmemBuffer, Special, TensorMap};
use crate::check::DType;
use crate::ir::tile::{self, Constant, Value};
use crate::syntax::span::Span;
use crate::target::{Arch, Features};

/// Why a kernel was not lowered: a construct the code generator cannot lower
/// yet (the front door reports it as E0512, "not supported yet"), or a kernel
/// over [`MAX_KERNEL_INSTS`] (E0119, with a help line). The span is the Tile
/// IR op's (item-relative).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    pub span: Span,
    pub message: String,
    /// `Some` for a kernel over the size limit: the help line.
    pub too_large: Option<String>,
}

/// The most Target IR instructions one kernel may have. The largest kernels
/// of the examples, the standard library and the tests have under 30,000;
/// without a bound, a kernel whose source is small but expands per element
/// (say, thousands of integer `**` on a tile) grows Target IR and PTX into
/// gigabytes. Lowering stops as soon as a kernel passes it, so the limit
/// also bounds the time spent finding out (about 0.2 s per target at this
/// size, release): the fuzzer met a mutant whose check, emit and report took
/// over 20 s at a limit of 500,000.
pub const MAX_KERNEL_INSTS: usize = 200_000;

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Unsupported {}

/// Lowers one Tile IR kernel for `arch`.
pub fn lower(tk: &tile::Kernel, arch: Arch) -> Result<Kernel, Unsupported> {
    lower_with_plan(tk, arch).map(|(k, _)| k)
}

/// `lower`, also returning the asynchronous-copy decisions it made (printable).
pub(crate) fn lower_with_plan(
    tk: &tile::Kernel,
    arch: Arch,
) -> Result<(Kernel, pipeline::PipelinePlan), Unsupported> {
    let (k, plan, hoisted) = lower_once(tk, arch, true)?;
    // Operands staged once before their loop (AMD) hold LDS through it; where
    // that overflows the block's LDS, they are staged at each dot instead.
    if hoisted && k.smem_bytes() > arch.info().max_smem_per_block {
        let (k, plan, _) = lower_once(tk, arch, false)?;
        return Ok((k, plan));
    }
    Ok((k, plan))
}

/// One lowering; `hoist_amd`: whether AMD matrix-core dots in a loop may read
/// operands staged before it (`mma::amd`). Also says whether any did.
fn lower_once(
    tk: &tile::Kernel,
    arch: Arch,
    hoist_amd: bool,
) -> Result<(Kernel, pipeline::PipelinePlan, bool), Unsupported> {
    let info = arch.info();
    let num_threads = tk.num_warps * info.warp_size;
    let mut l = Lower {
        tk,
        arch,
        feat: arch.features(),
        warp_size: info.warp_size,
        num_warps: tk.num_warps,
        warp_order: mma::warp_order(&tk.body),
        tid_bits: num_threads.trailing_zeros() as u8,
        regs: Vec::new(),
        defs: Vec::new(),
        rounded_bf16: HashMap::new(),
        unpacked: HashMap::new(),
        index_ops: HashMap::new(),
        uniform_regs: HashSet::new(),
        differences: HashMap::new(),
        streaming: tk.streaming(),
        stream_access: false,
        prologue: Vec::new(),
        blocks: vec![Vec::new()],
        vals: HashMap::new(),
        div: HashMap::new(),
        extents: HashMap::new(),
        mins: HashMap::new(),
        tid: Reg(0),
        base_cache: HashMap::new(),
        params: Vec::new(),
        tensor_maps: Vec::new(),
        tensors: Vec::new(),
        scalars: Vec::new(),
        scratch: None,
        pipeline: Pipeline::new(arch, tk.num_stages),
        seen: Vec::new(),
        buffers: Vec::new(),
        overlays: Vec::new(),
        buffered_loops: 0,
        layouts: Vec::new(),
        span: Span::default(),
        emitted: 0,
        vec_elems: 4,
        amd_invariant: HashMap::new(),
        rotation: None,
        wgmma: Vec::new(),
        wgmma_waited: Vec::new(),
        promotion: None,
        notes: Vec::new(),
        hoist_amd,
        hoisted_amd: false,
        outer: None,
        across_live: 0,
    };
    l.tid = l.new_reg(RegTy::I32);
    let tid = l.tid;
    l.prologue.push(Inst::Special {
        dst: tid,
        which: Special::ThreadId,
    });
    l.params()?;
    l.vec_elems = l.default_vector_elems();
    if l.feat.cp_async {
        let candidates = l.find_deferrable();
        l.pipeline.defer_ok = candidates.iter().map(|c| c.value).collect();
        l.pipeline.plan.candidates = candidates;
    }
    let body = &tk.body;
    l.region_ops(&body.ops)?;
    let mut insts = std::mem::take(&mut l.prologue);
    insts.extend(l.blocks.pop().unwrap_or_default());
    super::dce::eliminate_dead_code(&mut insts);
    let mut smem = std::mem::take(&mut l.buffers);
    place_buffers(&mut smem, &l.pipeline.persistent, &l.overlays);
    let kernel = Kernel {
        name: tk.name.clone(),
        arch,
        num_threads,
        params: l.params,
        tensor_maps: l.tensor_maps,
        smem,
        regs: l.regs,
        body: insts,
        layouts: l.layouts,
        notes: l.notes,
    };
    Ok((kernel, l.pipeline.plan, l.hoisted_amd))
}

/// Places the arena's regions and returns its bytes. Transient regions
/// start at offset 0 (their uses are separated by barriers); the regions
/// that live through a loop (`persistent`: pipeline stages, loop-invariant
/// operands, transaction barriers) follow every transient one; `overlays`
/// (a tile stored by TMA where no loop's regions are live) start at 0 and
/// may cover the rest.
fn place_buffers(smem: &mut [SmemBuffer], persistent: &[usize], overlays: &[usize]) -> u32 {
    let transient_end = smem
        .iter()
        .enumerate()
        .filter(|(i, _)| !persistent.contains(i) && !overlays.contains(i))
        .map(|(_, b)| b.offset + b.bytes)
        .max()
        .unwrap_or(0);
    let mut offset = transient_end;
    for &i in persistent {
        let align = smem[i].align.max(128);
        offset = offset.div_ceil(align) * align;
        smem[i].offset = offset;
        offset += smem[i].bytes;
    }
    overlays
        .iter()
        .map(|&i| smem[i].offset + smem[i].bytes)
        .fold(offset, u32::max)
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
    feat: Features,
    warp_size: u32,
    num_warps: u32,
    /// How tensor-core dots spread their warps (`mma::warp_order`).
    warp_order: WarpOrder,
    tid_bits: u8,
    regs: Vec<RegTy>,
    /// How many instructions so far write each register (saturating).
    defs: Vec<u8>,
    /// f32 registers holding an f32 rounded to bf16 by a conversion, with
    /// the value rounded: a pack of two of them converts the originals.
    rounded_bf16: HashMap<Reg, Reg>,
    /// f32 registers holding one bf16 half of a 32-bit word (`unpack_bf16`):
    /// the word and whether the high half.
    unpacked: HashMap<Reg, (Reg, bool)>,
    /// The index arithmetic lowered so far (aranges, their expansions and
    /// broadcasts, integer ops and comparisons over them), which a layout
    /// conversion recomputes in the target layout (`layouts::remat`)
    /// instead of moving through shared memory.
    index_ops: HashMap<Value, tile::OpKind>,
    /// Registers that hold the same value on every thread: those of Tile IR
    /// scalars (uniform by the language's semantics; reductions to a scalar
    /// are all-reduces). A tile whose registers are all one such register
    /// (or one immediate) is a splat; equal registers alone do not make one:
    /// a row statistic in a one-slot layout holds a different row per thread.
    uniform_regs: HashSet<Reg>,
    /// f32 registers written by a subtraction in the straight-line code
    /// being lowered, with its operands (`elementwise::exp_of_differences`).
    /// Emptied at every region's start and end: a loop's carried registers
    /// change under a difference taken before it.
    differences: HashMap<Reg, (Operand, Operand)>,
    /// The loads and stores whose bytes the kernel does not touch again
    /// (`ir::tile::streaming`), and whether the op being lowered is one.
    streaming: tile::streaming::Streaming,
    stream_access: bool,
    prologue: Vec<Inst>,
    blocks: Vec<Vec<Inst>>,
    vals: HashMap<Value, TV>,
    /// A known divisor of integer scalars (for alignment proofs).
    div: HashMap<Value, u64>,
    /// `for` loops whose variable `iv` provably keeps `iv + step <= hi`
    /// (see `LoopExtent`), by that variable.
    extents: HashMap<Value, LoopExtent>,
    /// Integer scalars that are the `min` of two others (a loop bound
    /// `min(S, m0 + BM)` is at most `S`).
    mins: HashMap<Value, (Value, Value)>,
    tid: Reg,
    base_cache: HashMap<Vec<Term>, Reg>,
    params: Vec<Param>,
    /// TMA tensor maps the kernel takes (after `params`).
    tensor_maps: Vec<TensorMap>,
    tensors: Vec<Option<TensorInfo>>,
    scalars: Vec<Option<(Reg, DType)>>,
    /// Asynchronous copies and software pipelines.
    pipeline: Pipeline,
    /// Layouts of 2-D+ tiles made so far, newest last (broadcast targets).
    seen: Vec<Rc<Layout>>,
    /// The index of the scratch buffer in `buffers`, once used.
    scratch: Option<usize>,
    /// Shared-memory buffers, all at offsets in one arena; see `SmemBuffer`.
    /// (0 is the scratch buffer).
    buffers: Vec<SmemBuffer>,
    /// Buffers that overlay the whole arena (see `place_buffers`).
    overlays: Vec<usize>,
    /// Loops being lowered whose regions live through them (pipeline
    /// stages, loop-invariant operands): while any is, no overlay is used.
    buffered_loops: u32,
    layouts: Vec<(u32, Layout)>,
    span: Span,
    /// Instructions emitted so far (see `MAX_KERNEL_INSTS`).
    emitted: usize,
    /// Contiguous elements per thread of the default blocked layout (see
    /// `default_vector_elems`).
    vec_elems: u32,
    /// AMD matrix-core dot operands staged once before the loop being
    /// lowered, by (value, staged transposed): their LDS buffer and row
    /// stride (`mma::amd`).
    amd_invariant: HashMap<(Value, bool), (usize, u32)>,
    /// The dot of the loop being lowered whose first k step is loaded an
    /// iteration early, until the dot takes it.
    rotation: Option<pipeline::Rotation>,
    /// Dots of the loop being lowered that its plan put on `wgmma`, until
    /// each is lowered.
    wgmma: Vec<mma::WgmmaDot>,
    /// Dots of the loops being lowered that their plans put on `wgmma`,
    /// each waited for where it is issued (`LoopPlan::wgmma_waited`).
    wgmma_waited: Vec<pipeline::WaitedWgmma>,
    /// The f8 wgmma mainloop being lowered: its carried accumulator and the
    /// registers its group sums into, added to it a group later
    /// (`mma::wgmma`'s promotion).
    promotion: Option<mma::Promotion>,
    /// Choices the user may want to change (`Kernel::notes`).
    notes: Vec<super::Note>,
    /// Whether loops may stage such operands (see `lower_with_plan`), and
    /// whether one did.
    hoist_amd: bool,
    hoisted_amd: bool,
    /// The `for` loop whose body is being lowered, as one a TMA pipeline in
    /// it may run across (`across.rs`); taken by the loops inside it.
    outer: Option<across::OuterLoop>,
    /// How many of `buffered_loops` are outer loops a TMA pipeline runs
    /// across (their bodies may still stage a tile beside its stages).
    across_live: u32,
}

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
            too_large: None,
        })
    }

    /// E0119 once the kernel has more than `MAX_KERNEL_INSTS` instructions,
    /// naming the Tile IR op being lowered when it passed the limit.
    fn check_size(&self) -> R<()> {
        if self.emitted <= MAX_KERNEL_INSTS {
            return Ok(());
        }
        Err(Unsupported {
            span: self.span,
            message: format!(
                "kernel `{}` is too large: its code for {} passed {MAX_KERNEL_INSTS} instructions ({} when lowering stopped, here)",
                self.tk.name, self.arch, self.emitted
            ),
            too_large: Some(
                "split the kernel into smaller kernels, use smaller tiles (a smaller BLOCK) or fewer elements per thread, or compute long expressions (such as chains of integer `**`) in a loop".to_string(),
            ),
        })
    }

    fn new_reg(&mut self, ty: RegTy) -> Reg {
        self.regs.push(ty);
        self.defs.push(0);
        Reg(self.regs.len() as u32 - 1)
    }

    /// Whether `r` is written by exactly one instruction so far (its value
    /// is the same wherever it is read).
    fn defined_once(&self, r: Reg) -> bool {
        self.defs.get(r.0 as usize) == Some(&1)
    }

    fn emit(&mut self, i: Inst) {
        for d in i.defs() {
            if let Some(n) = self.defs.get_mut(d.0 as usize) {
                *n = n.saturating_add(1);
            }
        }
        // Past the limit nothing more is kept: one op can expand a lot, and
        // `region_ops` reports the kernel after the op.
        self.emitted += 1;
        if self.emitted <= MAX_KERNEL_INSTS {
            self.blocks.last_mut().expect("a block").push(i);
        }
    }

    fn reg_ty(&self, o: Operand) -> Option<RegTy> {
        o.reg().map(|r| self.regs[r.0 as usize])
    }

    // ---- values ---------------------------------------------------------------

    fn val(&self, v: Value) -> TV {
        self.vals
            .get(&v)
            .cloned()
            .unwrap_or_else(|| panic!("Tile IR value %{} used before its definition", v.0))
    }

    fn scalar(&self, v: Value) -> Operand {
        if let Some(o) = self.pipeline.overrides.get(&v) {
            return *o;
        }
        let t = self.val(v);
        debug_assert_eq!(t.ops.len(), 1);
        t.ops[0]
    }

    fn divisor(&self, v: Value) -> u64 {
        self.div.get(&v).copied().unwrap_or(1)
    }

    /// [`Self::divisor`], with a constant's own (0: every divisor).
    fn divisor_or_constant(&self, v: Value) -> u64 {
        match self.scalar(v) {
            Operand::Int(0) => 1 << 30,
            Operand::Int(i) => i.unsigned_abs(),
            _ => self.divisor(v),
        }
    }

    /// Whether scalar `v` is at most `bound` (an operand): it is that operand,
    /// or a `min` of which one side is.
    fn at_most(&self, v: Value, bound: Operand) -> bool {
        let mut stack = vec![v];
        let mut steps = 0;
        while let Some(v) = stack.pop() {
            steps += 1;
            if steps > 16 {
                return false;
            }
            if self.scalar(v) == bound {
                return true;
            }
            if let Some(&(a, b)) = self.mins.get(&v) {
                stack.extend([a, b]);
            }
        }
        false
    }

    fn define(&mut self, v: Value, tv: TV) {
        if tv.layout.rank() >= 2
            && tv.layout.shape.iter().all(|&d| d > 1)
            && !self.seen.contains(&tv.layout)
        {
            self.seen.push(tv.layout.clone());
        }
        if tv.layout.shape.is_empty() {
            self.uniform_regs
                .extend(tv.ops.iter().filter_map(|o| o.reg()));
        } else {
            self.layouts.push((v.0, (*tv.layout).clone()));
        }
        self.vals.insert(v, tv);
    }

    /// Whether `tv` is one value on every thread and in every slot (a splat):
    /// its registers are all one immediate or one uniform register.
    fn is_splat(&self, tv: &TV) -> bool {
        let Some(&first) = tv.ops.first() else {
            return false;
        };
        tv.ops.iter().all(|o| *o == first)
            && first.reg().is_none_or(|r| self.uniform_regs.contains(&r))
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
}

/// A `for iv in range(lo, hi, step)` loop with a positive constant step, a
/// constant `lo >= 0`, and `lo` and `hi` multiples of `step`: every
/// iteration has `0 <= iv` and `iv + step <= hi`, so a slice `[iv, iv + len)`
/// with `len <= step` of an axis whose size is at least `hi` is in bounds
/// without a predicate a row (`Lower::plan_access`).
#[derive(Clone, Copy, Debug)]
struct LoopExtent {
    hi: Value,
    step: i64,
}
