//! The order in which a kernel's programs start, two rules.
//!
//! **Grouped order.** A kernel whose loop feeds a `dot` one operand
//! chosen by `program_id(0)` and the other by `program_id(1)` (a GEMM's
//! `A[m0 : m0 + BM, k]` and `B[k, n0 : n0 + BN]`) runs its programs in
//! groups of [`GROUP`] along axis 0, as Triton's matmul tutorial orders them
//! by hand. The GPU starts blocks in launch order (axis 0 fastest): in the
//! plain order a wave of blocks walks a whole column of `A` panels, which for
//! an 8192³ bf16 GEMM is more than the L2 holds, so every wave reads `A`
//! from DRAM again; grouped, a wave covers [`GROUP`] `A` panels and a few
//! dozen `B` panels.
//!
//! The rewrite relabels programs: the block launched `lin`-th (`lin = x + y
//! * nx`) runs program `(px, py)` of the grouped order, and every
//! `program_id` of the kernel reads the relabelled id. It is a bijection of
//! the grid's first two axes (axis 2 is left alone), so every program runs
//! once with the ids it always had and the results are those of the plain
//! order; only the order in which programs start changes, which the
//! language leaves unspecified. Grids of 2^31 blocks or more (where `lin`
//! would not fit an `i32`) keep the plain order.
//!
//! **Heaviest first.** A loop whose trip count grows with `program_id(a)`
//! (a causal attention's `range(0, min(S, m0 + BM), BN)`) gives programs of
//! higher ids more work; started last, they make the last wave of blocks
//! long while most SMs idle. Such an axis is walked backwards (`n - 1 -
//! id`), which also keeps the programs that share data (the query blocks of
//! one head) starting together. The same relabelling argument applies.

use std::collections::HashMap;

use super::builder::Builder;
use super::*;

/// Programs along axis 0 per group: 8 rows of 128-row `A` panels stay in L2
/// while a wave of blocks walks the `B` panels.
pub const GROUP: i64 = 8;

impl Kernel {
    /// Relabels programs: in grouped order where a loop's `dot` reads one
    /// operand chosen by each of `program_id(0)` and `program_id(1)`, and
    /// along an axis backwards where a loop's trip count grows with that
    /// axis's program id (heaviest programs first). Returns whether it did;
    /// the program ids it replaced are then dead code.
    pub fn order_programs(&mut self) -> bool {
        let grouped = reuses_both_axes(self);
        let heavy = [0, 1].map(|a| trips_grow_with(self, a));
        if !grouped && !heavy.contains(&true) {
            return false;
        }
        let mut e = Builder::new();
        e.types = std::mem::take(&mut self.types);
        let i32s = DType::I32;
        let x = push(&mut e, OpKind::ProgramId(0), i32s);
        let y = push(&mut e, OpKind::ProgramId(1), i32s);
        let nx = push(&mut e, OpKind::NumPrograms(0), i32s);
        let ny = push(&mut e, OpKind::NumPrograms(1), i32s);
        let (mut px, mut py) = if grouped {
            grouped_ids(&mut e, x, y, nx, ny)
        } else {
            (x, y)
        };
        let one = int(&mut e, 1, i32s);
        for (p, n, reverse) in [(&mut px, nx, heavy[0]), (&mut py, ny, heavy[1])] {
            if reverse {
                let last = bin(&mut e, BinaryOp::Sub, n, one);
                *p = bin(&mut e, BinaryOp::Sub, last, *p);
            }
        }
        let (prologue, types) = e.finish();
        self.types = types;
        // Every other program id reads the relabelled one.
        let mut map = HashMap::new();
        relabel(&self.body, px, py, &mut map);
        substitute(&mut self.body, &map);
        self.body.ops.splice(0..0, prologue.ops);
        true
    }
}

/// The program the block launched `x + y * nx`-th runs in grouped order.
fn grouped_ids(e: &mut Builder, x: Value, y: Value, nx: Value, ny: Value) -> (Value, Value) {
    let i32s = DType::I32;
    // Whether `nx * ny` fits an i32; where not, the arithmetic below
    // runs on a 1 x 1 grid (no overflow) and its result is discarded.
    let nx64 = push(
        e,
        OpKind::Cast {
            x: nx,
            to: DType::I64,
        },
        DType::I64,
    );
    let ny64 = push(
        e,
        OpKind::Cast {
            x: ny,
            to: DType::I64,
        },
        DType::I64,
    );
    let blocks = bin(e, BinaryOp::Mul, nx64, ny64);
    let limit = int(e, 1 << 31, DType::I64);
    let fits = bin(e, BinaryOp::Lt, blocks, limit);
    let (zero, one) = (int(e, 0, i32s), int(e, 1, i32s));
    let sx = select(e, fits, x, zero);
    let sy = select(e, fits, y, zero);
    let snx = select(e, fits, nx, one);
    let sny = select(e, fits, ny, one);
    let group = int(e, GROUP, i32s);
    let row = bin(e, BinaryOp::Mul, sy, snx);
    let lin = bin(e, BinaryOp::Add, sx, row);
    let width = bin(e, BinaryOp::Mul, sny, group);
    let g = bin(e, BinaryOp::FloorDiv, lin, width);
    let first = bin(e, BinaryOp::Mul, g, group);
    let left = bin(e, BinaryOp::Sub, snx, first);
    let size = bin(e, BinaryOp::Min, left, group);
    let start = bin(e, BinaryOp::Mul, g, width);
    let r = bin(e, BinaryOp::Sub, lin, start);
    let py = bin(e, BinaryOp::FloorDiv, r, size);
    let back = bin(e, BinaryOp::Mul, py, size);
    let rx = bin(e, BinaryOp::Sub, r, back);
    let px = bin(e, BinaryOp::Add, first, rx);
    (select(e, fits, px, x), select(e, fits, py, y))
}

/// How a scalar moves as one program id grows (the others fixed).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mono {
    Const,
    Inc,
    Dec,
    Unknown,
}

impl Mono {
    fn neg(self) -> Mono {
        match self {
            Mono::Inc => Mono::Dec,
            Mono::Dec => Mono::Inc,
            m => m,
        }
    }

    /// Of a sum, a minimum or a maximum of two such scalars.
    fn join(self, other: Mono) -> Mono {
        match (self, other) {
            (Mono::Const, m) | (m, Mono::Const) => m,
            (a, b) if a == b => a,
            _ => Mono::Unknown,
        }
    }
}

/// Whether the trip count of a loop of the kernel's top level grows with
/// `program_id(axis)` (a causal attention's `range(0, min(S, m0 + BM), BN)`):
/// the programs of higher ids have more work, and starting them first keeps
/// the last wave of blocks short.
fn trips_grow_with(k: &Kernel, axis: u8) -> bool {
    let mut mono: HashMap<Value, Mono> = HashMap::new();
    let mut consts: HashMap<Value, i64> = HashMap::new();
    let get = |mono: &HashMap<Value, Mono>, v: &Value| *mono.get(v).unwrap_or(&Mono::Unknown);
    for op in &k.body.ops {
        let m = match &op.kind {
            OpKind::ProgramId(a) if *a == axis => Mono::Inc,
            OpKind::Const(c) => {
                if let Constant::Int(n) = c {
                    consts.insert(op.results[0], *n);
                }
                Mono::Const
            }
            OpKind::ProgramId(_)
            | OpKind::NumPrograms(_)
            | OpKind::TensorDim { .. }
            | OpKind::ScalarParam(_) => Mono::Const,
            OpKind::Cast { x, .. } => get(&mono, x),
            OpKind::Binary { op: b, a, b: c } => {
                let (ma, mc) = (get(&mono, a), get(&mono, c));
                match b {
                    BinaryOp::Add | BinaryOp::Min | BinaryOp::Max => ma.join(mc),
                    BinaryOp::Sub => ma.join(mc.neg()),
                    BinaryOp::Mul => match (consts.get(a), consts.get(c)) {
                        (_, Some(&n)) if n > 0 => ma,
                        (Some(&n), _) if n > 0 => mc,
                        _ if ma == Mono::Const && mc == Mono::Const => Mono::Const,
                        _ => Mono::Unknown,
                    },
                    BinaryOp::FloorDiv => match consts.get(c) {
                        Some(&n) if n > 0 => ma,
                        _ if ma == Mono::Const && mc == Mono::Const => Mono::Const,
                        _ => Mono::Unknown,
                    },
                    _ if ma == Mono::Const && mc == Mono::Const => Mono::Const,
                    _ => Mono::Unknown,
                }
            }
            OpKind::Select { cond, a, b } if get(&mono, cond) == Mono::Const => {
                get(&mono, a).join(get(&mono, b))
            }
            OpKind::For { lo, hi, step, .. } => {
                let trips = get(&mono, hi).join(get(&mono, lo).neg());
                if trips == Mono::Inc && get(&mono, step) == Mono::Const {
                    return true;
                }
                Mono::Unknown
            }
            _ => Mono::Unknown,
        };
        for r in &op.results {
            mono.insert(*r, m);
        }
    }
    false
}

/// Whether a `dot` in a loop reads one operand that depends on
/// `program_id(0)` and not `program_id(1)`, and one the other way round.
fn reuses_both_axes(k: &Kernel) -> bool {
    // Bit `a` of a value's mask: it depends on `program_id(a)`. Masks only
    // grow, so a loop's carried values reach a fixpoint.
    let mut dep: HashMap<Value, u8> = HashMap::new();
    loop {
        let before = dep.clone();
        depend(&k.body, 0, &mut dep);
        if dep == before {
            break;
        }
    }
    let mask = |v: &Value| dep.get(v).copied().unwrap_or(0) & 3;
    let mut found = false;
    find_dots(&k.body, false, &mut |a, b| {
        found |= matches!((mask(&a), mask(&b)), (1, 2) | (2, 1));
    });
    found
}

/// One pass of the dependence masks over `r`, whose values also depend on
/// `ctl` (the masks of the loop bounds and conditions around it).
fn depend(r: &Region, ctl: u8, dep: &mut HashMap<Value, u8>) {
    let get = |dep: &HashMap<Value, u8>, v: &Value| dep.get(v).copied().unwrap_or(0);
    let or = |dep: &mut HashMap<Value, u8>, v: Value, m: u8| *dep.entry(v).or_default() |= m;
    for op in &r.ops {
        match &op.kind {
            // Per position: the induction variable depends on the bounds, a
            // carried value on its initial and yielded values.
            OpKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let bounds = ctl | get(dep, lo) | get(dep, hi) | get(dep, step);
                or(dep, body.args[0], bounds);
                let yields = yielded(body);
                for (i, a) in body.args[1..].iter().enumerate() {
                    let m = bounds
                        | init.get(i).map_or(0, |v| get(dep, v))
                        | yields.get(i).map_or(0, |v| get(dep, v));
                    or(dep, *a, m);
                    if let Some(res) = op.results.get(i) {
                        or(dep, *res, m);
                    }
                }
                depend(body, bounds, dep);
            }
            // Lumped (conservatively: a value may gain a bit it lacks).
            kind => {
                let mut m = ctl;
                if let OpKind::ProgramId(a) = kind {
                    m |= 1u8.checked_shl(*a as u32).unwrap_or(0);
                }
                for v in kind.operands() {
                    m |= get(dep, &v);
                }
                for sub in kind.regions() {
                    for a in &sub.args {
                        m |= get(dep, a);
                    }
                    for v in yielded(sub) {
                        m |= get(dep, &v);
                    }
                }
                for sub in kind.regions() {
                    for a in &sub.args {
                        or(dep, *a, m);
                    }
                    depend(sub, m, dep);
                }
                for res in &op.results {
                    or(dep, *res, m);
                }
            }
        }
    }
}

/// The values a region's final `yield` passes on.
fn yielded(r: &Region) -> Vec<Value> {
    match r.ops.last().map(|op| &op.kind) {
        Some(OpKind::Yield(vs)) => vs.clone(),
        _ => Vec::new(),
    }
}

/// Calls `f(a, b)` for the operands of every `dot` inside a `for` or
/// `while` loop.
fn find_dots(r: &Region, in_loop: bool, f: &mut dyn FnMut(Value, Value)) {
    for op in &r.ops {
        match &op.kind {
            OpKind::Dot { a, b, .. } if in_loop => f(*a, *b),
            OpKind::For { body, .. } => find_dots(body, true, f),
            OpKind::While { cond, body, .. } => {
                find_dots(cond, true, f);
                find_dots(body, true, f);
            }
            kind => {
                for sub in kind.regions() {
                    find_dots(sub, in_loop, f);
                }
            }
        }
    }
}

/// Maps the result of every `program_id(0)` and `program_id(1)` of `r` to
/// `px` and `py`.
fn relabel(r: &Region, px: Value, py: Value, map: &mut HashMap<Value, Value>) {
    for op in &r.ops {
        match op.kind {
            OpKind::ProgramId(0) => {
                map.insert(op.results[0], px);
            }
            OpKind::ProgramId(1) => {
                map.insert(op.results[0], py);
            }
            _ => {}
        }
        for sub in op.kind.regions() {
            relabel(sub, px, py, map);
        }
    }
}

fn substitute(r: &mut Region, map: &HashMap<Value, Value>) {
    for op in &mut r.ops {
        op.kind
            .map_values(&mut |v| map.get(&v).copied().unwrap_or(v));
        for sub in op.kind.regions_mut() {
            substitute(sub, map);
        }
    }
}

/// Appends a scalar op to the prologue being built.
fn push(e: &mut Builder, kind: OpKind, d: DType) -> Value {
    e.push1(kind, Type::Scalar(d))
}

fn int(e: &mut Builder, c: i64, d: DType) -> Value {
    push(e, OpKind::Const(Constant::Int(c)), d)
}

fn bin(e: &mut Builder, op: BinaryOp, a: Value, b: Value) -> Value {
    let d = if op.is_comparison() {
        DType::Bool
    } else {
        e.ty(a).dtype()
    };
    push(e, OpKind::Binary { op, a, b }, d)
}

fn select(e: &mut Builder, cond: Value, a: Value, b: Value) -> Value {
    let d = e.ty(a).dtype();
    push(e, OpKind::Select { cond, a, b }, d)
}
