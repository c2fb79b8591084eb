//! Target IR: one kernel on one architecture, as the program one thread runs.
//!
//! Lowering (`lower`) turns every Tile IR tile into per-thread registers using a
//! [`Layout`] (which thread holds which elements, see `layout.rs`) and every tile
//! op into scalar instructions over those registers: global loads/stores guarded
//! by per-element predicates, warp shuffles and shared-memory exchanges for
//! reductions and layout conversions, barriers, and structured control flow.
//! The instruction set is vendor-neutral (no PTX spelling); `backend::ptx` prints
//! it, and a HIP printer can print the same program.
//!
//! # Resource facts (for the estimator)
//!
//! * Threads per block: [`Kernel::num_threads`].
//! * Shared memory: [`Kernel::smem`], each [`SmemBuffer`] a region (offset, byte
//!   size) of one arena; [`Kernel::smem_bytes`] is the arena's size (static
//!   shared memory).
//! * Registers: every virtual register is a [`Reg`] with a [`RegTy`] in
//!   [`Kernel::regs`]; [`RegTy::words`] is its cost in 32-bit registers (pred: 0,
//!   64-bit: 2). Instructions are in [`Kernel::body`] (the prologue first, then the
//!   kernel's statements); [`Inst::defs`] and [`Inst::uses`] give the registers an
//!   instruction writes and reads, and loops (`For`, `While`) keep registers live
//!   across their back edge: a register read in a loop body and defined before the
//!   loop is live through the whole loop, and loop-carried registers (the `iv` and
//!   the registers a body writes with `Mov` that were defined before the loop) are
//!   live through the whole loop too. Registers are written once except those
//!   carried around loops and merged after `If` (written by `Mov` in each branch).
//!
//! # Conventions
//!
//! * Element values are held at a compute type: f16 and bf16 tiles live in `F32`
//!   registers (values rounded to the storage type at casts, converted at loads and
//!   stores), i8/i16/u8 in 32-bit integer registers, bool in predicates.
//! * Global addresses are 64-bit; element offsets are computed in 32 bits (a tensor
//!   holds fewer than 2^31 elements), scaled by the element size with a widening
//!   multiply. Tensor pointers are assumed 16-byte aligned (as every CUDA
//!   allocator returns).

pub mod layout;
pub mod lower;
pub mod verify;

mod coalesce;
mod dce;

mod dump;

pub(crate) use dump::reg_name;

use crate::target::{Arch, MmaKind};
pub use layout::{Layout, LayoutKind, Term};
pub use lower::{lower, Unsupported, MAX_KERNEL_INSTS};

/// A virtual register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reg(pub u32);

/// The type of a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegTy {
    Pred,
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
    /// 16 raw bits (an f16 or bf16 in memory format, on its way to or from memory).
    B16,
    /// Two packed halves (tensor-core operands).
    B32,
}

impl RegTy {
    /// The cost in 32-bit registers.
    pub fn words(self) -> u32 {
        match self {
            RegTy::Pred => 0,
            RegTy::I64 | RegTy::U64 | RegTy::F64 => 2,
            _ => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, RegTy::F32 | RegTy::F64)
    }

    pub fn name(self) -> &'static str {
        match self {
            RegTy::Pred => "pred",
            RegTy::I32 => "i32",
            RegTy::U32 => "u32",
            RegTy::I64 => "i64",
            RegTy::U64 => "u64",
            RegTy::F32 => "f32",
            RegTy::F64 => "f64",
            RegTy::B16 => "b16",
            RegTy::B32 => "b32",
        }
    }
}

/// An instruction operand: a register or an immediate (of the other operand's type).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Operand {
    Reg(Reg),
    Int(i64),
    Float(f64),
}

impl Operand {
    pub fn reg(self) -> Option<Reg> {
        match self {
            Operand::Reg(r) => Some(r),
            _ => None,
        }
    }
}

impl From<Reg> for Operand {
    fn from(r: Reg) -> Self {
        Operand::Reg(r)
    }
}

/// Special per-thread values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Special {
    ThreadId,
    BlockId(u8),
    NumBlocks(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    Neg,
    /// Bitwise not (integers) or logical not (pred).
    Not,
    Abs,
    /// 2^x, approximate (fast math); subnormal results are kept.
    Exp2Approx,
    /// 2^x, approximate, with subnormal inputs and results flushed to zero:
    /// `exp`'s meaning on f32 (the CPU executor's `exp` flushes results
    /// below 2^-126 alike), and the functions whose results a flushed
    /// subnormal cannot change (`1 + t` or `1 - t` rounds to 1 either way).
    /// On NVIDIA one SFU instruction, where `Exp2Approx` takes three more
    /// (a compare and two multiplications that scale a subnormal result).
    Exp2ApproxFtz,
    /// log2(x), approximate.
    Log2Approx,
    /// 1/sqrt(x), approximate.
    RsqrtApprox,
    /// tanh(x), approximate (needs `Features::fast_tanh` of `crate::target`).
    TanhApprox,
    /// sqrt(x), correctly rounded.
    Sqrt,
    /// 1/x, correctly rounded.
    Rcp,
    /// Round toward negative infinity (floats).
    Floor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    /// Float: correctly rounded division. Integer: truncating division.
    Div,
    /// Integer remainder of truncating division (sign of the dividend).
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    /// Arithmetic for signed, logical for unsigned.
    Shr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    /// Not equal (unordered for floats: NaN != x).
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// The type of an element in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemTy {
    F64,
    F32,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U32,
    U16,
    U8,
    /// 8-bit floats (OCP FP8): 4 exponent bits / 3 mantissa bits, and 5 / 2.
    F8E4M3,
    F8E5M2,
}

impl MemTy {
    pub fn bytes(self) -> u32 {
        match self {
            MemTy::F64 | MemTy::I64 => 8,
            MemTy::F32 | MemTy::I32 | MemTy::U32 => 4,
            MemTy::F16 | MemTy::BF16 | MemTy::I16 | MemTy::U16 => 2,
            MemTy::I8 | MemTy::U8 | MemTy::F8E4M3 | MemTy::F8E5M2 => 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MemTy::F64 => "f64",
            MemTy::F32 => "f32",
            MemTy::F16 => "f16",
            MemTy::BF16 => "bf16",
            MemTy::I64 => "i64",
            MemTy::I32 => "i32",
            MemTy::I16 => "i16",
            MemTy::I8 => "i8",
            MemTy::U32 => "u32",
            MemTy::U16 => "u16",
            MemTy::U8 => "u8",
            MemTy::F8E4M3 => "f8e4m3",
            MemTy::F8E5M2 => "f8e5m2",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Space {
    Global,
    Shared,
}

impl Space {
    /// The space's name (`global`, `shared`), as the dump and PTX spell it.
    pub fn name(self) -> &'static str {
        match self {
            Space::Global => "global",
            Space::Shared => "shared",
        }
    }
}

/// One instruction of the per-thread program.
#[derive(Clone, Debug, PartialEq)]
pub enum Inst {
    /// A kernel parameter (`index` into `Kernel::params`).
    Param {
        dst: Reg,
        index: usize,
    },
    Special {
        dst: Reg,
        which: Special,
    },
    /// The shared-memory address of a buffer (`index` into `Kernel::smem`).
    SmemAddr {
        dst: Reg,
        buffer: usize,
    },
    Mov {
        dst: Reg,
        src: Operand,
    },
    Unary {
        op: UnOp,
        dst: Reg,
        x: Operand,
    },
    /// Both operands have `dst`'s type.
    Binary {
        op: BinOp,
        dst: Reg,
        a: Operand,
        b: Operand,
    },
    /// `dst = a * b + c`.
    Fma {
        dst: Reg,
        a: Operand,
        b: Operand,
        c: Operand,
    },
    /// `dst = a * b` with a 64-bit result from 32-bit operands (`dst` is 64-bit).
    MulWide {
        dst: Reg,
        a: Operand,
        b: Operand,
    },
    /// `dst` (32 bits) = f32 `hi` and `lo` each rounded to the nearest bf16
    /// (ties to even), `hi`'s in the high half and `lo`'s in the low half
    /// (`cvt.rn.bf16x2.f32`; needs `Features::cvt_bf16` of `crate::target`).
    PackBf16 {
        dst: Reg,
        hi: Operand,
        lo: Operand,
    },
    /// `dst` (pred) = `a op b`; `ty` is the operands' type.
    Cmp {
        op: CmpOp,
        ty: RegTy,
        dst: Reg,
        a: Operand,
        b: Operand,
    },
    /// `dst = cond ? a : b`.
    Select {
        dst: Reg,
        cond: Reg,
        a: Operand,
        b: Operand,
    },
    /// Convert `src` to `dst`'s type: float→int rounds toward zero, int→float and
    /// narrowing float conversions round to nearest even, `B16` is an f16.
    /// `narrow` (integer registers only) truncates to an 8- or 16-bit type and
    /// extends back (sign-extends for signed types). `F32` to `B32` rounds to
    /// tf32 (nearest, ties away: a tensor-core operand).
    Cvt {
        dst: Reg,
        src: Reg,
        narrow: Option<MemTy>,
    },
    /// Load `dst.len()` consecutive elements (a vector access when > 1) from
    /// `addr + offset` bytes, when `pred` (if any) holds; else `dst` keep their values.
    /// `stream`: the kernel does not read these bytes again (PTX's `.cs`,
    /// evict first), so they leave the caches before data it does re-read.
    Ld {
        stream: bool,
        space: Space,
        mem: MemTy,
        dst: Vec<Reg>,
        addr: Reg,
        offset: i64,
        pred: Option<Reg>,
    },
    /// Store `src` to `addr + offset` bytes when `pred` (if any) holds;
    /// `stream` as for `Ld` (the kernel never reads what it writes there).
    St {
        stream: bool,
        space: Space,
        mem: MemTy,
        src: Vec<Operand>,
        addr: Reg,
        offset: i64,
        pred: Option<Reg>,
    },
    /// Atomic add to global memory (result discarded).
    AtomAdd {
        mem: MemTy,
        src: Operand,
        addr: Reg,
        offset: i64,
        pred: Option<Reg>,
    },
    /// Block-wide barrier.
    Barrier,
    /// Aborts the kernel (the launch fails with an error) where `pred` holds:
    /// the entry check of a divisibility assumption (`-D K%8`).
    Trap {
        pred: Reg,
    },
    /// Asynchronous copy of `bytes` (4, 8 or 16) from global `src + src_offset`
    /// to shared `dst`; `src_size` (a register holding `bytes` or 0) zero-fills
    /// the copy where it is 0 (out-of-bounds chunks). Completes at `CpAsyncWait`.
    CpAsync {
        dst: Reg,
        /// Bytes added to `dst` (the chunks of one swizzle phase share a
        /// register, `Swizzle::shift`).
        dst_offset: i64,
        src: Reg,
        src_offset: i64,
        bytes: u32,
        src_size: Option<Reg>,
    },
    /// Closes the group of async copies issued since the last commit.
    CpAsyncCommit,
    /// Waits until at most `pending` committed groups are still in flight.
    CpAsyncWait {
        pending: u32,
    },
    /// Warp-wide load of `dst.len()` (1, 2 or 4) 8x8 matrices of 16-bit elements
    /// from shared memory; each lane gives the address of one 16-byte row (lanes
    /// 8i..8i+7 the rows of matrix i) and receives, per matrix, the two elements
    /// of row `lane / 4`, columns `2 (lane % 4)` and `+1` (packed in one `B32`),
    /// or of the transposed matrix when `trans`.
    LdMatrix {
        dst: Vec<Reg>,
        addr: Reg,
        trans: bool,
    },
    /// Warp-wide `d = a x b + c` on the matrix units: `[m, k] x [k, n]`, f32
    /// accumulators `c`/`d`. `kind` is the instruction family, which fixes
    /// the operand layouts over the lanes (`layout.rs` has the maps):
    ///
    /// * `MmaSync` (NVIDIA `mma.sync`, 32 lanes): inputs of `input` packed two
    ///   per `B32` register (`F32` means tf32, one per register); fragment
    ///   layouts of the PTX ISA's `mma.m16n8k16`/`m16n8k8`/`m8n8k4`.
    /// * `Mfma` (AMD CDNA `v_mfma_f32_*`, 64 lanes): `m * k / 64` inputs per
    ///   lane, packed in `B32` registers (two 16-bit or four 8-bit values each)
    ///   or one `F32` register per f32 input; `m * n / 64` accumulators.
    /// * `Wmma` (AMD RDNA3 `v_wmma_f32_16x16x16_*`, wave32): each lane holds a
    ///   whole row of A and column of B (16 values in eight `B32`; lanes
    ///   16-31 repeat lanes 0-15), and eight accumulators.
    Mma {
        kind: MmaKind,
        m: u32,
        n: u32,
        k: u32,
        input: MemTy,
        d: Vec<Reg>,
        a: Vec<Reg>,
        b: Vec<Reg>,
        c: Vec<Reg>,
    },
    /// Warpgroup-wide (4 warps, sm_90a) `acc += a x b` of `[64, k] x [k, n]`
    /// 16-bit `input` on the tensor cores (`wgmma.mma_async`), `b` in shared
    /// memory described by a 64-bit matrix descriptor (a `U64` register:
    /// start address, leading and stride byte offsets, swizzle), `a` by one
    /// too or in registers ([`WgmmaA`]). `trans_b`: b is stored n-major (a
    /// row-major `[k, n]` tile), else k-major (a row-major `[n, k]` tile).
    /// `acc` holds `n / 2` f32 a thread, laid out as `mma.m16n8`'s
    /// accumulators of each warp's 16 rows over the `n / 8` column tiles, and
    /// is read and written in place (`acc += a b`), or only written where
    /// `accumulate` is false (`acc = a b`: a dot's first k step onto zeros,
    /// which then need no registers zeroed). Asynchronous: issued after a
    /// `WgmmaFence`, closed by `WgmmaCommit`, complete (`acc` readable) after
    /// a `WgmmaWait`.
    Wgmma {
        n: u32,
        input: MemTy,
        acc: Vec<Reg>,
        a: WgmmaA,
        b_desc: Reg,
        trans_b: bool,
        accumulate: bool,
    },
    /// Orders the accumulator registers' earlier writes before the
    /// warpgroup's next `Wgmma`s.
    WgmmaFence,
    /// Closes the group of `Wgmma`s issued since the last commit.
    WgmmaCommit,
    /// Waits until at most `pending` committed `Wgmma` groups are in flight.
    WgmmaWait {
        pending: u32,
    },
    /// Makes this thread's completed shared-memory writes (stores, finished
    /// `cp.async`) visible to the asynchronous proxy that `Wgmma` reads through.
    FenceProxyAsync,
    /// `dst` (`U64`) = the generic address of the kernel's tensor map
    /// `map` (an index into `Kernel::tensor_maps`; a by-value parameter).
    TensorMapAddr {
        dst: Reg,
        map: usize,
    },
    /// Starts fetching tensor map `map` (`U64`, from `TensorMapAddr`) into
    /// the TMA unit's cache, so that the first copy through it does not wait
    /// for the descriptor.
    PrefetchTensorMap {
        map: Reg,
    },
    /// Initialises the shared-memory barrier at `bar` (8 bytes, `U32`
    /// shared address) to expect `count` arrivals a phase, in phase 0.
    MbarInit {
        bar: Reg,
        count: u32,
    },
    /// Makes this thread's `MbarInit`s visible to other threads and to the
    /// asynchronous proxy (before the barrier that publishes them).
    FenceMbarInit,
    /// One arrival at `bar`, after which its current phase also waits for
    /// `bytes` more of asynchronous copies (`TmaLoad`s naming it).
    MbarExpectTx {
        bar: Reg,
        bytes: u32,
    },
    /// One arrival at `bar`.
    MbarArrive {
        bar: Reg,
    },
    /// Ends the barrier at `bar` (before it is initialised again: a loop
    /// entered anew).
    MbarInval {
        bar: Reg,
    },
    /// Waits until the phase of `bar` with parity `parity` (0 or 1) has
    /// completed (a freshly initialised barrier counts its phase of parity
    /// 1 as completed).
    MbarWait {
        bar: Reg,
        parity: Operand,
    },
    /// A TMA copy of one box of tensor map `map` (`U64`, from
    /// `TensorMapAddr`) at element coordinates `coords` (innermost first,
    /// `I32`; out-of-bounds elements read as zero) into shared memory at
    /// `dst + dst_offset`, laid out as the map's swizzle says. Counts its
    /// bytes against `bar`'s expected transactions when it lands.
    TmaLoad {
        dst: Reg,
        dst_offset: i64,
        map: Reg,
        coords: Vec<Operand>,
        bar: Reg,
    },
    /// A TMA copy of one box from shared memory at `src + src_offset`
    /// (laid out as tensor map `map`'s swizzle says) to the tensor at
    /// element coordinates `coords` (innermost first, `I32`); elements out
    /// of the tensor's bounds are not written. Joins the thread's open bulk
    /// group (`BulkCommit`).
    TmaStore {
        src: Reg,
        src_offset: i64,
        map: Reg,
        coords: Vec<Operand>,
    },
    /// Closes this thread's bulk group of `TmaStore`s.
    BulkCommit,
    /// Waits until at most `pending` of this thread's bulk groups are still
    /// reading their shared memory (their global writes may still be under
    /// way: shared memory may be written again, and the block may exit).
    BulkWaitRead {
        pending: u32,
    },
    /// `dst` = `src` of the lane `lane ^ lane_mask` (butterfly shuffle, whole
    /// warp); a 64-bit register moves as two 32-bit halves.
    ShflXor {
        dst: Reg,
        src: Reg,
        lane_mask: u32,
    },
    /// `for iv = lo; iv < hi (step > 0) or iv > hi (step < 0); iv += step`.
    /// `iv` is written by the loop; the body may write loop-carried registers.
    For {
        iv: Reg,
        lo: Operand,
        hi: Operand,
        step: Operand,
        body: Vec<Inst>,
    },
    /// Runs `cond`, then `body` while `pred` holds.
    While {
        cond: Vec<Inst>,
        pred: Reg,
        body: Vec<Inst>,
    },
    If {
        cond: Reg,
        then: Vec<Inst>,
        otherwise: Vec<Inst>,
    },
    /// A comment carried into the printed code (the Tile IR op it came from).
    Comment(String),
}

impl Inst {
    /// Registers this instruction writes (not counting nested regions).
    pub fn defs(&self) -> Vec<Reg> {
        match self {
            Inst::Param { dst, .. }
            | Inst::Special { dst, .. }
            | Inst::SmemAddr { dst, .. }
            | Inst::Mov { dst, .. }
            | Inst::TensorMapAddr { dst, .. }
            | Inst::Unary { dst, .. }
            | Inst::Binary { dst, .. }
            | Inst::Fma { dst, .. }
            | Inst::MulWide { dst, .. }
            | Inst::PackBf16 { dst, .. }
            | Inst::Cmp { dst, .. }
            | Inst::Select { dst, .. }
            | Inst::Cvt { dst, .. }
            | Inst::ShflXor { dst, .. } => vec![*dst],
            Inst::Ld { dst, .. } | Inst::LdMatrix { dst, .. } => dst.clone(),
            Inst::Mma { d, .. } => d.clone(),
            Inst::Wgmma { acc, .. } => acc.clone(),
            Inst::For { iv, .. } => vec![*iv],
            Inst::St { .. }
            | Inst::AtomAdd { .. }
            | Inst::CpAsync { .. }
            | Inst::CpAsyncCommit
            | Inst::CpAsyncWait { .. }
            | Inst::WgmmaFence
            | Inst::WgmmaCommit
            | Inst::WgmmaWait { .. }
            | Inst::FenceProxyAsync
            | Inst::MbarInit { .. }
            | Inst::FenceMbarInit
            | Inst::MbarExpectTx { .. }
            | Inst::MbarArrive { .. }
            | Inst::MbarInval { .. }
            | Inst::PrefetchTensorMap { .. }
            | Inst::MbarWait { .. }
            | Inst::TmaLoad { .. }
            | Inst::TmaStore { .. }
            | Inst::BulkCommit
            | Inst::BulkWaitRead { .. }
            | Inst::Barrier
            | Inst::Trap { .. }
            | Inst::While { .. }
            | Inst::If { .. }
            | Inst::Comment(_) => vec![],
        }
    }

    /// Registers this instruction reads (not counting nested regions). A
    /// predicated load also reads its destinations (they keep their values where
    /// the predicate is false).
    pub fn uses(&self) -> Vec<Reg> {
        let ops = |v: &[Operand]| v.iter().filter_map(|o| o.reg()).collect::<Vec<_>>();
        match self {
            Inst::Param { .. }
            | Inst::Special { .. }
            | Inst::SmemAddr { .. }
            | Inst::Barrier
            | Inst::CpAsyncCommit
            | Inst::CpAsyncWait { .. }
            | Inst::WgmmaFence
            | Inst::WgmmaCommit
            | Inst::WgmmaWait { .. }
            | Inst::FenceProxyAsync
            | Inst::TensorMapAddr { .. }
            | Inst::FenceMbarInit
            | Inst::BulkCommit
            | Inst::BulkWaitRead { .. }
            | Inst::Comment(_) => vec![],
            Inst::MbarInit { bar, .. }
            | Inst::MbarExpectTx { bar, .. }
            | Inst::MbarArrive { bar }
            | Inst::MbarInval { bar } => vec![*bar],
            Inst::PrefetchTensorMap { map } => vec![*map],
            Inst::MbarWait { bar, parity } => {
                let mut v = vec![*bar];
                v.extend(parity.reg());
                v
            }
            Inst::TmaLoad {
                dst,
                map,
                coords,
                bar,
                ..
            } => {
                let mut v = vec![*dst, *map, *bar];
                v.extend(ops(coords));
                v
            }
            Inst::TmaStore {
                src, map, coords, ..
            } => {
                let mut v = vec![*src, *map];
                v.extend(ops(coords));
                v
            }
            Inst::Wgmma {
                acc,
                a,
                b_desc,
                accumulate,
                ..
            } => {
                let mut v = if *accumulate { acc.clone() } else { Vec::new() };
                v.extend(a.regs());
                v.push(*b_desc);
                v
            }
            Inst::CpAsync {
                dst, src, src_size, ..
            } => {
                let mut v = vec![*dst, *src];
                v.extend(src_size.iter().copied());
                v
            }
            Inst::Mov { src, .. } => ops(&[*src]),
            Inst::Trap { pred } => vec![*pred],
            Inst::Unary { x, .. } => ops(&[*x]),
            Inst::Binary { a, b, .. } | Inst::MulWide { a, b, .. } | Inst::Cmp { a, b, .. } => {
                ops(&[*a, *b])
            }
            Inst::PackBf16 { hi, lo, .. } => ops(&[*hi, *lo]),
            Inst::Fma { a, b, c, .. } => ops(&[*a, *b, *c]),
            Inst::Select { cond, a, b, .. } => {
                let mut v = vec![*cond];
                v.extend(ops(&[*a, *b]));
                v
            }
            Inst::Cvt { src, .. } => vec![*src],
            Inst::LdMatrix { addr, .. } => vec![*addr],
            Inst::Mma { a, b, c, .. } => a.iter().chain(b).chain(c).copied().collect(),
            Inst::ShflXor { src, .. } => vec![*src],
            Inst::Ld {
                dst, addr, pred, ..
            } => {
                let mut v = vec![*addr];
                if let Some(p) = pred {
                    v.push(*p);
                    v.extend(dst.iter().copied());
                }
                v
            }
            Inst::St {
                src, addr, pred, ..
            } => {
                let mut v = ops(src);
                v.push(*addr);
                v.extend(pred.iter().copied());
                v
            }
            Inst::AtomAdd {
                src, addr, pred, ..
            } => {
                let mut v = ops(&[*src]);
                v.push(*addr);
                v.extend(pred.iter().copied());
                v
            }
            Inst::For { lo, hi, step, .. } => ops(&[*lo, *hi, *step]),
            // The condition register is defined by the `cond` region.
            Inst::While { .. } => vec![],
            Inst::If { cond, .. } => vec![*cond],
        }
    }

    /// Whether the instruction synchronises threads or works with the
    /// asynchronous units: barriers, async copies and their waits, wgmma and
    /// its groups, proxy fences, transaction barriers, TMA copies. Nothing
    /// that reorders instructions moves an access across one.
    pub fn is_sync_or_async(&self) -> bool {
        matches!(
            self,
            Inst::Barrier
                | Inst::CpAsync { .. }
                | Inst::CpAsyncCommit
                | Inst::CpAsyncWait { .. }
                | Inst::Wgmma { .. }
                | Inst::WgmmaFence
                | Inst::WgmmaCommit
                | Inst::WgmmaWait { .. }
                | Inst::FenceProxyAsync
                | Inst::MbarInit { .. }
                | Inst::FenceMbarInit
                | Inst::MbarExpectTx { .. }
                | Inst::MbarArrive { .. }
                | Inst::MbarInval { .. }
                | Inst::PrefetchTensorMap { .. }
                | Inst::MbarWait { .. }
                | Inst::TmaLoad { .. }
                | Inst::TmaStore { .. }
                | Inst::BulkCommit
                | Inst::BulkWaitRead { .. }
        )
    }

    /// Whether the instruction only computes registers from registers (no
    /// memory, synchronisation, control flow or trap), so a scheduler may move it.
    pub fn is_pure(&self) -> bool {
        matches!(
            self,
            Inst::Param { .. }
                | Inst::Special { .. }
                | Inst::SmemAddr { .. }
                | Inst::TensorMapAddr { .. }
                | Inst::Mov { .. }
                | Inst::Unary { .. }
                | Inst::Binary { .. }
                | Inst::Fma { .. }
                | Inst::MulWide { .. }
                | Inst::PackBf16 { .. }
                | Inst::Cmp { .. }
                | Inst::Select { .. }
                | Inst::Cvt { .. }
        )
    }

    /// Applies `uses` to every register the instruction reads and `defs` to every one it
    /// writes (a predicated load's destinations count as written only), for
    /// instructions without nested regions.
    pub fn map_regs(&mut self, uses: &mut dyn FnMut(&mut Reg), defs: &mut dyn FnMut(&mut Reg)) {
        let op = |o: &mut Operand, uses: &mut dyn FnMut(&mut Reg)| {
            if let Operand::Reg(r) = o {
                uses(r)
            }
        };
        match self {
            Inst::Param { dst, .. }
            | Inst::Special { dst, .. }
            | Inst::SmemAddr { dst, .. }
            | Inst::TensorMapAddr { dst, .. } => defs(dst),
            Inst::MbarInit { bar, .. }
            | Inst::MbarExpectTx { bar, .. }
            | Inst::MbarArrive { bar }
            | Inst::MbarInval { bar }
            | Inst::PrefetchTensorMap { map: bar } => uses(bar),
            Inst::MbarWait { bar, parity } => {
                uses(bar);
                op(parity, uses)
            }
            Inst::TmaLoad {
                dst,
                map,
                coords,
                bar,
                ..
            } => {
                uses(dst);
                uses(map);
                uses(bar);
                coords.iter_mut().for_each(|o| op(o, uses))
            }
            Inst::TmaStore {
                src, map, coords, ..
            } => {
                uses(src);
                uses(map);
                coords.iter_mut().for_each(|o| op(o, uses))
            }
            Inst::Mov { dst, src } | Inst::Unary { dst, x: src, .. } => {
                op(src, uses);
                defs(dst)
            }
            Inst::Binary { dst, a, b, .. }
            | Inst::MulWide { dst, a, b }
            | Inst::PackBf16 { dst, hi: a, lo: b }
            | Inst::Cmp { dst, a, b, .. } => {
                op(a, uses);
                op(b, uses);
                defs(dst)
            }
            Inst::Fma { dst, a, b, c } => {
                op(a, uses);
                op(b, uses);
                op(c, uses);
                defs(dst)
            }
            Inst::Select { dst, cond, a, b } => {
                uses(cond);
                op(a, uses);
                op(b, uses);
                defs(dst)
            }
            Inst::Cvt { dst, src, .. } | Inst::ShflXor { dst, src, .. } => {
                uses(src);
                defs(dst)
            }
            Inst::Ld {
                dst, addr, pred, ..
            } => {
                uses(addr);
                pred.iter_mut().for_each(&mut *uses);
                dst.iter_mut().for_each(defs)
            }
            Inst::St {
                src, addr, pred, ..
            } => {
                src.iter_mut().for_each(|o| op(o, uses));
                uses(addr);
                pred.iter_mut().for_each(uses)
            }
            Inst::AtomAdd {
                src, addr, pred, ..
            } => {
                op(src, uses);
                uses(addr);
                pred.iter_mut().for_each(uses)
            }
            Inst::CpAsync {
                dst, src, src_size, ..
            } => {
                uses(dst);
                uses(src);
                src_size.iter_mut().for_each(uses)
            }
            Inst::LdMatrix { dst, addr, .. } => {
                uses(addr);
                dst.iter_mut().for_each(defs)
            }
            Inst::Mma { d, a, b, c, .. } => {
                a.iter_mut().chain(b).chain(c).for_each(&mut *uses);
                d.iter_mut().for_each(defs)
            }
            Inst::Wgmma {
                acc,
                a,
                b_desc,
                accumulate,
                ..
            } => {
                a.regs_mut().iter_mut().for_each(&mut *uses);
                uses(b_desc);
                if *accumulate {
                    acc.iter_mut().for_each(&mut *uses);
                }
                acc.iter_mut().for_each(defs)
            }
            Inst::Trap { pred } => uses(pred),
            Inst::For { .. }
            | Inst::While { .. }
            | Inst::If { .. }
            | Inst::Barrier
            | Inst::CpAsyncCommit
            | Inst::CpAsyncWait { .. }
            | Inst::WgmmaFence
            | Inst::WgmmaCommit
            | Inst::WgmmaWait { .. }
            | Inst::BulkCommit
            | Inst::BulkWaitRead { .. }
            | Inst::FenceProxyAsync
            | Inst::FenceMbarInit
            | Inst::Comment(_) => {}
        }
    }

    /// The nested instruction lists (loop bodies, branches).
    pub fn regions(&self) -> Vec<&Vec<Inst>> {
        match self {
            Inst::For { body, .. } => vec![body],
            Inst::While { cond, body, .. } => vec![cond, body],
            Inst::If {
                then, otherwise, ..
            } => vec![then, otherwise],
            _ => vec![],
        }
    }
}

/// A kernel parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub ty: RegTy,
}

/// A TMA tensor map (the driver's 128-byte `CUtensorMap`), a by-value
/// kernel parameter after the dims. The executor encodes it at launch from
/// tensor argument `tensor`: its device address, its shape (row-major, the
/// element type its dtype), `box_dims` and `swizzle`; out-of-bounds
/// elements read as zero. Valid where the address is 16-byte aligned and
/// every stride but the innermost a multiple of 16 bytes: the alignment
/// `cp.async` needs too, which the lowering proved before choosing it.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorMap {
    /// The Tile IR parameter index of the tensor.
    pub tensor: usize,
    /// The tensor parameter's name (for dumps and messages).
    pub name: String,
    /// Elements of one box per dim, innermost first (one entry per dim of
    /// the tensor; 1 where the box takes one index).
    pub box_dims: Vec<u32>,
    /// The shared-memory swizzle span in bytes: 32, 64 or 128 (the box's
    /// innermost dim spans at most that), or 0 for none.
    pub swizzle: u32,
}

/// A region of the kernel's shared-memory arena. Transient regions may
/// overlap: every transient use of shared memory (a layout conversion, a
/// cross-warp reduction, the operands of one `dot`) starts after a barrier that
/// ends the previous use and ends with a barrier, so uses never overlap in
/// time; only the regions of one use (a dot's `a` and `b`) are disjoint.
/// Regions that live through a loop (`pipe*`: the `num_stages` stages of a
/// software-pipelined operand; `invariant*`: a loop-invariant operand) are
/// placed after all transient ones and overlap nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct SmemBuffer {
    pub name: String,
    /// Byte offset in the arena.
    pub offset: u32,
    pub bytes: u32,
    pub align: u32,
    /// Why the buffer exists (layout conversions, reductions, dot operands).
    pub purpose: String,
    /// How a row-major 2-D tile of 16-bit elements is laid out to avoid bank
    /// conflicts, if it is.
    pub swizzle: Option<Swizzle>,
}

/// The XOR swizzle of a row-major tile in shared memory: element `(r, c)` of a
/// tile with `row_bytes` per row lives in 16-byte chunk
/// `(c * elem / 16) ^ ((r / per_phase) % max_phase)` of its row. Eight lanes
/// reading the same column of eight consecutive rows (as `ldmatrix` does) then
/// touch eight different chunks: no bank conflicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Swizzle {
    pub row_bytes: u32,
    pub per_phase: u32,
    pub max_phase: u32,
    /// 0: rows are stored whole, one after another. Else the tile's row
    /// count: its rows are cut into 128-byte panels, each panel stored as
    /// its own `[rows, 128 B]` block (Hopper's n-major operand layout, in
    /// which 8 rows of 128 bytes are one contiguous swizzle atom).
    pub panel_rows: u32,
    /// 0 or 1: rows in order. Else `t` >= 2, the 16-row tiles a warp holds of
    /// a wgmma operand read by one warpgroup (4 warps) as `t` m64
    /// instructions: within each block of `64 t` rows, row `16 (w t + j) + r`
    /// (warp `w`'s tile `j`) is stored at row `16 (4 j + w) + r`, so the
    /// warpgroup's `j`-th instruction, which gives warp `w` rows `16 w ..`
    /// of the 64 it reads, gives it its `j`-th tile ([`Swizzle::stored_row`]).
    pub warpgroup_tiles: u32,
}

impl Swizzle {
    /// The swizzle for rows of `row_bytes` (a multiple of 16).
    pub fn for_rows(row_bytes: u32) -> Swizzle {
        let chunks = row_bytes / 16;
        Swizzle {
            row_bytes,
            per_phase: (128 / row_bytes).max(1),
            max_phase: chunks.clamp(1, 8),
            panel_rows: 0,
            warpgroup_tiles: 0,
        }
    }

    /// This swizzle with its rows in warpgroup order for `tiles` 16-row
    /// tiles a warp (see [`Swizzle::warpgroup_tiles`]; 1 changes nothing).
    pub fn in_warpgroup_order(self, tiles: u32) -> Swizzle {
        Swizzle {
            warpgroup_tiles: tiles,
            ..self
        }
    }

    /// Where logical row `r` is stored (see [`Swizzle::warpgroup_tiles`]).
    /// Rows move in whole 16-row tiles, so `r % 16` (and the XOR phase,
    /// `r % 8`) is kept.
    pub fn stored_row(&self, r: u32) -> u32 {
        let t = self.warpgroup_tiles;
        if t < 2 {
            return r;
        }
        let (block, l) = (r / (64 * t) * 64 * t, r % (64 * t));
        let (w, j) = (l / 16 / t, l / 16 % t);
        block + (4 * j + w) * 16 + l % 16
    }

    /// `rows` rows of `row_bytes` (a multiple of 128) stored as 128-byte
    /// panels, each swizzled as 128-byte rows are (chunk `c ^ (r % 8)`).
    pub fn panels(row_bytes: u32, rows: u32) -> Swizzle {
        Swizzle {
            panel_rows: rows,
            ..Swizzle::for_rows(128).with_row_bytes(row_bytes)
        }
    }

    /// The bytes between element `(r, c)` and `(r + dr, c + dc)` where that
    /// is the same for every `(r, c)` with `c` a multiple of 8 (a 16-byte
    /// chunk's first element, 16-bit elements): `dr` a whole number of
    /// swizzle periods (the XOR phase repeats) and `dc` a whole number of
    /// the chunks the phase flips (so the XOR and the addition commute).
    pub fn shift(&self, dr: u32, dc: u32) -> Option<u32> {
        let (period, span) = match self.panel_rows {
            0 => (self.per_phase * self.max_phase, self.max_phase),
            _ => (self.max_phase, 8),
        };
        // Rows in warpgroup order move apart but for whole blocks.
        let period = match self.warpgroup_tiles {
            t if t >= 2 => period.max(64 * t),
            _ => period,
        };
        if !dr.is_multiple_of(period) || !dc.is_multiple_of(8 * span) {
            return None;
        }
        let chunks = dc / 8;
        Some(match self.panel_rows {
            0 => dr * self.row_bytes + chunks * 16,
            rows => dr * 128 + chunks / 8 * rows * 128,
        })
    }

    fn with_row_bytes(self, row_bytes: u32) -> Swizzle {
        Swizzle { row_bytes, ..self }
    }

    /// The byte offset of element `(r, c)` of `elem_bytes` each.
    pub fn offset(&self, r: u32, c: u32, elem_bytes: u32) -> u32 {
        let byte = c * elem_bytes;
        let chunk = (byte / 16) ^ ((r / self.per_phase) % self.max_phase);
        let r = self.stored_row(r);
        if self.panel_rows > 0 {
            let (panel, chunk) = (chunk / 8, chunk % 8);
            return panel * self.panel_rows * 128 + r * 128 + chunk * 16 + byte % 16;
        }
        r * self.row_bytes + chunk * 16 + byte % 16
    }
}

/// Where a [`Inst::Wgmma`]'s `a` operand is.
#[derive(Clone, Debug, PartialEq)]
pub enum WgmmaA {
    /// A matrix descriptor (`U64`) of a k-major tile in shared memory.
    Desc(Reg),
    /// Four `B32` registers a thread (packed pairs of 16-bit values):
    /// `mma.m16n8k16`'s `a` fragment of the warp's 16 rows of the 64.
    Regs(Vec<Reg>),
}

impl WgmmaA {
    pub fn regs(&self) -> &[Reg] {
        match self {
            WgmmaA::Desc(r) => std::slice::from_ref(r),
            WgmmaA::Regs(rs) => rs,
        }
    }

    pub fn regs_mut(&mut self) -> &mut [Reg] {
        match self {
            WgmmaA::Desc(r) => std::slice::from_mut(r),
            WgmmaA::Regs(rs) => rs,
        }
    }
}

/// One kernel lowered for one arch.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub arch: Arch,
    pub num_threads: u32,
    pub params: Vec<Param>,
    /// TMA tensor maps, by-value parameters after `params`.
    pub tensor_maps: Vec<TensorMap>,
    pub smem: Vec<SmemBuffer>,
    /// The type of every register, indexed by `Reg.0`.
    pub regs: Vec<RegTy>,
    pub body: Vec<Inst>,
    /// The layout chosen for each tile of the Tile IR kernel (by Tile IR value
    /// number), for dumps and tools.
    pub layouts: Vec<(u32, Layout)>,
    /// What the code generator chose that the user can change (W0008).
    pub notes: Vec<Note>,
}

/// A code-generation choice the user may want to change, reported as a
/// diagnostic with the resource estimate (`db::kernel_resources`): a code,
/// the span of the Tile IR op (relative to its item), its label, a message
/// and a help.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub code: &'static str,
    pub span: crate::syntax::span::Span,
    pub label: &'static str,
    pub message: String,
    pub help: String,
}

impl Kernel {
    pub fn reg_ty(&self, r: Reg) -> RegTy {
        self.regs[r.0 as usize]
    }

    /// The kernel as the PTX printer prints it: register moves coalesced
    /// (`coalesce.rs`: an `if`'s merged results and a loop's carried values
    /// written in place). ptxas coalesces them too; done here it makes the
    /// PTX smaller (flash attention D = 128 causal on sm_90a: 88.8 to 79.8
    /// KB) for the driver's JIT. The register estimate and the HIP printer
    /// read the kernel as lowered (clang coalesces as ptxas does).
    pub fn simplified(&self) -> Kernel {
        let mut k = self.clone();
        coalesce::coalesce_copies(&mut k.body, &k.regs);
        debug_assert_eq!(verify::verify(&k), Ok(()));
        k
    }

    /// Static shared memory in bytes: the size of the arena.
    pub fn smem_bytes(&self) -> u32 {
        self.smem
            .iter()
            .map(|b| b.offset + b.bytes)
            .max()
            .unwrap_or(0)
    }

    /// Calls `f` on every instruction, nested ones included, in program order.
    pub fn walk(&self, f: &mut dyn FnMut(&Inst)) {
        fn go(insts: &[Inst], f: &mut dyn FnMut(&Inst)) {
            for i in insts {
                f(i);
                for r in i.regions() {
                    go(r, f);
                }
            }
        }
        go(&self.body, f);
    }

    /// Whether a loop of the kernel hides memory latency within each warp: it
    /// issues matrix instructions (long runs of independent matrix instructions:
    /// cuBLAS's GEMMs run at 12-19% occupancy), or it waits on asynchronous
    /// copies while later iterations' copies are still in flight (software
    /// pipelining, `num_stages` >= 2). Low occupancy costs such a kernel
    /// little; W0004 is for the others.
    pub fn hides_latency(&self) -> bool {
        self.any_in_loop(|i| match i {
            Inst::Mma { .. } | Inst::Wgmma { .. } => true,
            Inst::CpAsyncWait { pending } => *pending > 0,
            Inst::MbarWait { .. } => true,
            _ => false,
        })
    }

    /// Whether an instruction inside a loop (at any depth, a `while`'s
    /// condition included) satisfies `pred`.
    pub fn any_in_loop(&self, pred: impl Fn(&Inst) -> bool) -> bool {
        // (instructions, whether inside a loop); a stack, not recursion.
        let mut stack: Vec<(&[Inst], bool)> = vec![(&self.body, false)];
        while let Some((insts, in_loop)) = stack.pop() {
            for i in insts {
                if in_loop && pred(i) {
                    return true;
                }
                let looped = in_loop || matches!(i, Inst::For { .. } | Inst::While { .. });
                for r in i.regions() {
                    stack.push((r, looped));
                }
            }
        }
        false
    }
}

#[cfg(test)]
mod fast_path_tests;
#[cfg(test)]
pub(crate) mod tests;
