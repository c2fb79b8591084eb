//! Tests of the register estimate: liveness on hand-built programs, the
//! modelled orders, unrolling, the cost of the estimate, and the report.

use super::liveness::Cfg;
use super::program::Remat;
use super::unroll::unroll_short_loops;
use super::*;
use crate::syntax::span::Span;
use crate::target::ptxas::MIN_REGS;
use crate::target::Arch;

fn inst(defs: &[u32], uses: &[u32]) -> Node {
    Node::Inst {
        defs: defs.to_vec(),
        uses: uses.to_vec(),
    }
}

fn one(_: u32) -> u32 {
    1
}

#[test]
fn straight_line_results_reuse_dead_operands() {
    // r0, r1 params; r2 = r0 + r1; r3 = r2 * r2; store r3.
    let p = [
        inst(&[0], &[]),
        inst(&[1], &[]),
        inst(&[2], &[0, 1]),
        inst(&[3], &[2, 2]),
        inst(&[], &[3]),
    ];
    assert_eq!(max_pressure(&p, &one), 2);
    // A value never read still needs a register where it is written.
    assert_eq!(max_pressure(&[inst(&[0], &[])], &one), 1);
    assert_eq!(max_pressure(&[], &one), 0);
}

#[test]
fn widths_count_words_and_predicates_are_free() {
    // r0: 64-bit address, r1: pred, r2: f32 loaded under r1.
    let p = [
        inst(&[0], &[]),
        inst(&[1], &[]),
        inst(&[2], &[0, 1]),
        inst(&[], &[0, 2]),
    ];
    let words = |r: u32| [2, 0, 1][r as usize];
    assert_eq!(max_pressure(&p, &words), 3);
}

fn test(uses: &[u32]) -> Node {
    Node::Test {
        uses: uses.to_vec(),
    }
}

#[test]
fn values_read_in_a_loop_live_through_it() {
    // r0 defined before the loop and read at the start of the body: it must
    // survive the whole body (the next iteration reads it again), so it
    // overlaps the temporaries made at the end of the body.
    let p = [
        inst(&[0], &[]),
        Node::Loop {
            entry: Box::new(inst(&[1], &[])),
            body: vec![
                inst(&[2], &[0, 1]),
                inst(&[], &[2]),
                inst(&[3], &[]),
                inst(&[4], &[]),
                inst(&[5], &[3, 4]),
                inst(&[], &[5]),
                inst(&[1], &[1]),
                test(&[1]),
            ],
        },
    ];
    // At r4's definition: r0, r1 (the induction variable), r3, r4.
    assert_eq!(max_pressure(&p, &one), 4);
    // Without the loop the same instructions need two registers less: r0
    // and r1 die at their reads.
    let flat = [
        inst(&[0], &[]),
        inst(&[1], &[]),
        inst(&[2], &[0, 1]),
        inst(&[], &[2]),
        inst(&[3], &[]),
        inst(&[4], &[]),
        inst(&[5], &[3, 4]),
        inst(&[], &[5]),
    ];
    assert_eq!(max_pressure(&flat, &one), 2);
}

#[test]
fn loop_exits_and_carried_values() {
    // r1 is written late in the body and read after the loop. Each
    // iteration overwrites it before any read, so it is dead early in the
    // body (where r2, r3 live) ...
    let body = vec![
        inst(&[2], &[0]),
        inst(&[3], &[2]),
        inst(&[4], &[3]),
        inst(&[], &[4, 3]),
        inst(&[1], &[0]),
        inst(&[0], &[0]),
        test(&[0]),
    ];
    let p = [
        inst(&[1], &[]),
        Node::Loop {
            entry: Box::new(inst(&[0], &[])),
            body: body.clone(),
        },
        inst(&[], &[1]),
    ];
    // ... peak: r0, r3, r4.
    assert_eq!(max_pressure(&p, &one), 3);
    // Left at a test after r4's definition and before r1's write, the old
    // r1 may be read after the loop, so it is live there: r0, r1, r3, r4.
    let mut early = body;
    early.insert(3, test(&[0]));
    let q = [
        inst(&[1], &[]),
        Node::Loop {
            entry: Box::new(inst(&[0], &[])),
            body: early,
        },
        inst(&[], &[1]),
    ];
    assert_eq!(max_pressure(&q, &one), 4);
    // A copied accumulator (Target IR copies carried values into fresh
    // registers and back): the copy and the original never overlap.
    let acc = [
        inst(&[0], &[]),
        Node::Loop {
            entry: Box::new(inst(&[1], &[])),
            body: vec![
                inst(&[5], &[0]),
                inst(&[2], &[1]),
                inst(&[3], &[5, 2]),
                inst(&[0], &[3]),
                inst(&[1], &[1]),
                test(&[1]),
            ],
        },
        inst(&[], &[0]),
    ];
    // r1, r5 and r2 at r2's definition.
    assert_eq!(max_pressure(&acc, &one), 3);
}

/// A set of registers as bits.
#[derive(Clone, PartialEq)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn insert(&mut self, r: u32) {
        self.0[r as usize / 64] |= 1 << (r % 64);
    }
    fn remove(&mut self, r: u32) {
        self.0[r as usize / 64] &= !(1 << (r % 64));
    }
    fn union(&mut self, other: &Bits) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a |= b;
        }
    }
    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &w)| {
            let mut rest = w;
            std::iter::from_fn(move || {
                (rest != 0).then(|| {
                    let b = rest.trailing_zeros();
                    rest &= rest - 1;
                    (i * 64) as u32 + b
                })
            })
        })
    }
}

/// The liveness the estimate had first: a live-in bit set per position,
/// iterated to a fixpoint (positions times registers in time and memory).
/// [`max_pressure`] must agree with it.
fn reference_pressure(program: &[Node], words: &dyn Fn(u32) -> u32) -> u32 {
    let mut cfg = Cfg::default();
    cfg.seq(program);
    let n = cfg.defs.len();
    let nregs = cfg
        .defs
        .iter()
        .chain(&cfg.uses)
        .flatten()
        .map(|&r| r as usize + 1)
        .max()
        .unwrap_or(0);
    let mut live_in = vec![Bits::new(nregs); n];
    let live_out_of = |p: usize, live_in: &[Bits], out: &mut Bits| {
        out.0.iter_mut().for_each(|w| *w = 0);
        for &s in &cfg.succ[p] {
            out.union(&live_in[s]);
        }
    };
    // Backward dataflow to a fixpoint; positions are mostly in program order,
    // so sweeping them in reverse converges in a few passes.
    let mut out = Bits::new(nregs);
    loop {
        let mut changed = false;
        for p in (0..n).rev() {
            live_out_of(p, &live_in, &mut out);
            for &d in &cfg.defs[p] {
                out.remove(d);
            }
            for &u in &cfg.uses[p] {
                out.insert(u);
            }
            if out != live_in[p] {
                std::mem::swap(&mut live_in[p], &mut out);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let weight = |b: &Bits| b.iter().map(words).sum::<u32>();
    let mut peak = 0;
    for p in 0..n {
        live_out_of(p, &live_in, &mut out);
        for &d in &cfg.defs[p] {
            out.insert(d);
        }
        peak = peak.max(weight(&out)).max(weight(&live_in[p]));
    }
    peak
}

#[test]
fn linear_liveness_agrees_with_the_per_position_fixpoint() {
    // Random structured programs (nested loops with tests, branches, 64-bit
    // and predicate registers) from a fixed xorshift sequence.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n) as u32
    };
    fn block(next: &mut dyn FnMut(u64) -> u32, depth: u32, in_loop: bool) -> Vec<Node> {
        let len = next(8) + 1;
        (0..len)
            .map(|_| match next(10) {
                0 if depth < 3 => Node::Loop {
                    entry: Box::new(inst(&[next(24)], &[next(24)])),
                    body: block(next, depth + 1, true),
                },
                1 if depth < 3 => Node::Branch {
                    cond: vec![next(24)],
                    then: block(next, depth + 1, in_loop),
                    otherwise: block(next, depth + 1, in_loop),
                },
                2 if in_loop => test(&[next(24)]),
                _ => {
                    let defs: Vec<u32> = (0..next(3)).map(|_| next(24)).collect();
                    let uses: Vec<u32> = (0..next(4)).map(|_| next(24)).collect();
                    inst(&defs, &uses)
                }
            })
            .collect()
    }
    let words = |r: u32| r % 3;
    for _ in 0..500 {
        let p = block(&mut next, 0, false);
        assert_eq!(
            max_pressure(&p, &words),
            reference_pressure(&p, &words),
            "{p:?}"
        );
    }
}

/// The Target IR of the first kernel of `src`, for `arch` (else the
/// database's default).
fn target_kernel(
    path: &str,
    src: String,
    arch: Option<Arch>,
) -> std::sync::Arc<crate::ir::target::Kernel> {
    use crate::db::{file_kernels, target_ir, Database};
    let mut db = Database::new();
    if let Some(arch) = arch {
        db.set_arch(arch);
    }
    let file = db.set_source(path, src);
    let (_, item, _) = file_kernels(&db, file).into_iter().next().unwrap();
    target_ir(
        &db,
        item,
        db.options(),
        crate::ir::tile::Specialization::new(),
    )
    .clone()
    .unwrap()
}

/// Instructions of a Target IR block, nested regions included.
fn count_insts(insts: &[crate::ir::target::Inst]) -> usize {
    insts
        .iter()
        .map(|i| {
            1 + i
                .regions()
                .into_iter()
                .map(|r| count_insts(r))
                .sum::<usize>()
        })
        .sum()
}

/// The work ([`super::work`] steps) of the estimate of a kernel of
/// `statements` dependent elementwise statements (each a few instructions
/// per element, `width / 32` elements a thread), in a loop or not, and
/// its length in Target IR instructions.
fn estimate_work(statements: usize, in_loop: bool, width: usize) -> (u64, usize) {
    let indent = if in_loop { "        " } else { "    " };
    let mut src = format!(
        "@kernel(grid=(cdiv(N, {width}),), num_warps=1)\n\
             def chain(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    \
             i = program_id(0) * {width}\n    v = load(x[i : i + {width}])\n    a = v\n",
    );
    if in_loop {
        src += "    for k in range(0, N, 7):\n";
    }
    for k in 0..statements {
        src += &format!("{indent}a = a * v + {k}.5\n");
    }
    src += &format!("    store(out[i : i + {width}], a)\n");
    let kernel = target_kernel("/t/chain.tsr", src, None);
    let before = super::WORK.with(|w| w.get());
    let regs = std::hint::black_box(of_target(&kernel)).regs;
    if width <= 128 {
        assert!(regs < FULL_OCCUPANCY_REGS, "{regs} registers");
    }
    (
        super::WORK.with(|w| w.get()) - before,
        count_insts(&kernel.body),
    )
}

#[test]
fn estimate_work_grows_linearly_with_kernel_length() {
    // Counted steps, not time: a shared machine makes timings noisy. 100
    // statements are ~6,500 Target IR instructions; twice the length may
    // cost a little more than twice the work (the sort of a block).
    // 4 elements a thread: under 32 registers, so the latency order
    // ([`ilp_order`]) is computed too. 32 elements a thread: above it, the
    // orders with compares next to their accesses and with chains are.
    for (in_loop, width) in [(false, 1024), (true, 1024), (false, 128), (true, 128)] {
        let (small, small_len) = estimate_work(100, in_loop, width);
        let (large, large_len) = estimate_work(200, in_loop, width);
        assert!(10 * large_len >= 19 * small_len, "{small_len} {large_len}");
        assert!(
            (small as usize) < 150 * small_len,
            "{small} steps for {small_len} instructions"
        );
        let ratio = large as f64 / small as f64;
        assert!(
            ratio < 2.5,
            "estimate of 100 statements (in a loop: {in_loop}, {small_len} \
                 instructions): {small} steps, of 200 ({large_len}): {large} ({ratio:.2}x)"
        );
    }
}

/// The work of the estimate of a kernel whose address or branch
/// condition is a right-associated chain of `terms` integer powers
/// (each ~160 straight-line Target IR instructions per element), and its
/// length in Target IR instructions: in a store index, or in an `if`
/// inside a `while`.
fn pow_chain_work(terms: usize, in_branch: bool) -> (u64, usize) {
    let src = if in_branch {
        let chain = vec!["c"; terms].join(" ** ");
        format!(
            "@kernel(grid=(M,), num_warps=8)\n\
                 def k(x: Tensor[\"M\", \"N\", bf16], out: Tensor[\"M\", bf16], limit: i32):\n    \
                 row = program_id(0)\n    acc = zeros([8], bf16)\n    c = 0\n    \
                 while c < N:\n        v = load(x[row, c : c + 8])\n        \
                 if ({chain}) > limit:\n            break\n        \
                 acc = acc + v\n        c += 8\n    \
                 store(out[row : row + 1], max(acc, axis=0, keepdims=True))\n"
        )
    } else {
        let chain = vec!["cols"; terms].join(" ** ");
        format!(
            "@kernel(grid=(M,), num_warps=8)\n\
                 def k(x: Tensor[\"M\", \"N\", f32], out: Tensor[\"M\", \"N\", f32]):\n    \
                 row = program_id(0)\n    cols = arange(0, 128)\n    m = cols < N\n    \
                 v = load(x[row, cols], mask=m, other=0)\n    \
                 store(out[row, ({chain})], v - sum(v, axis=0), mask=m)\n"
        )
    };
    let kernel = target_kernel("/t/pow.tsr", src, None);
    let before = super::WORK.with(|w| w.get());
    std::hint::black_box(of_target(&kernel));
    (
        super::WORK.with(|w| w.get()) - before,
        count_insts(&kernel.body),
    )
}

#[test]
fn estimate_work_grows_linearly_with_integer_power_chains() {
    // Long `**` chains were reported slow to estimate (fuzzing: 5,000
    // terms). Counted steps, not time; twice the terms must cost about
    // twice the work, in straight-line code and in a branch in a loop.
    for (in_branch, terms) in [(false, 20), (true, 50)] {
        let (small, small_len) = pow_chain_work(terms, in_branch);
        let (large, large_len) = pow_chain_work(2 * terms, in_branch);
        assert!(10 * large_len >= 19 * small_len, "{small_len} {large_len}");
        assert!(
            (small as usize) < 100 * small_len,
            "{small} steps for {small_len} instructions"
        );
        let ratio = large as f64 / small as f64;
        assert!(
            ratio < 2.3,
            "estimate of {terms} powers (in a branch: {in_branch}, {small_len} \
                 instructions): {small} steps, of {} ({large_len}): {large} ({ratio:.2}x)",
            2 * terms
        );
    }
}

#[test]
fn short_runtime_loops_are_unrolled_by_four() {
    use crate::db::{file_kernels, target_ir, Database};
    use crate::ir::target::Inst;
    // A row sum over a runtime `K` (ptxas: 31 or 32 registers, 17 to 23
    // with the loop kept rolled), and the same loop storing each tile.
    let kernel = |body: &str| {
        let mut db = Database::new();
        let src = format!(
            "@kernel(grid=(M,), num_warps=2)\n\
                 def k(x: Tensor[\"M\", \"K\", bf16], out: Tensor[\"M\", f32]):\n    \
                 r0 = program_id(0)\n    acc = zeros([1, 256], f32)\n    \
                 for k in range(0, K, 256):\n{body}    \
                 store(out[r0 : r0 + 1], sum(acc, axis=1))\n"
        );
        let file = db.set_source("/t/k.tsr", src);
        let (_, item, _) = file_kernels(&db, file).into_iter().next().unwrap();
        target_ir(
            &db,
            item,
            db.options(),
            crate::ir::tile::Specialization::new(),
        )
        .clone()
        .unwrap()
    };
    let loads = |insts: &[Inst]| {
        insts
            .iter()
            .filter(|i| matches!(i, Inst::Ld { .. }))
            .count()
    };
    let loop_loads = |k: &crate::ir::target::Kernel| {
        let mut rm = Remat::new(k);
        let body = unroll_short_loops(&k.body, &mut rm);
        let inner = |insts: &[Inst]| {
            insts
                .iter()
                .find_map(|i| match i {
                    Inst::For { body, .. } => Some(loads(body)),
                    _ => None,
                })
                .unwrap()
        };
        (inner(&k.body), inner(&body))
    };
    let sums = kernel("        acc = acc + load(x[r0 : r0 + 1, k : k + 256]).to(f32)\n");
    let (rolled, unrolled) = loop_loads(&sums);
    assert!(rolled > 0);
    assert_eq!(unrolled, 4 * rolled);
    let stores = kernel(
        "        t = load(x[r0 : r0 + 1, k : k + 256]).to(f32)\n        \
             acc = acc + t\n        store(out[r0 : r0 + 1], sum(t, axis=1))\n",
    );
    let (rolled, unrolled) = loop_loads(&stores);
    assert_eq!(unrolled, rolled, "a loop that stores stays rolled");
}

#[test]
fn a_stale_database_cancels_the_estimate() {
    use crate::db::{file_kernels, target_ir, Database};
    let mut db = Database::new();
    let file = db.set_source(
        "/t/k.tsr",
        "@kernel(grid=(cdiv(N, 256),), num_warps=4)\n\
             def k(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    \
             offs = program_id(0) * 256 + arange(0, 256)\n    \
             store(out[offs], load(x[offs], mask=offs < N, other=0.0) * 2.0, mask=offs < N)\n"
            .to_string(),
    );
    let (_, item, _) = file_kernels(&db, file).into_iter().next().unwrap();
    let kernel = target_ir(
        &db,
        item,
        db.options(),
        crate::ir::tile::Specialization::new(),
    )
    .clone()
    .unwrap();
    let mut main = crate::cancel::Generation::default();
    let snapshot = main.clone();
    // A current handle computes the estimate; a stale one unwinds.
    let fresh = crate::cancel::scope(snapshot.clone(), || of_target(&kernel));
    assert_eq!(fresh, of_target(&kernel));
    main.advance();
    let stale = std::panic::catch_unwind(|| crate::cancel::scope(snapshot, || of_target(&kernel)));
    let payload = stale.expect_err("a stale handle cancels the estimate");
    assert!(payload.downcast_ref::<salsa::Cancelled>().is_some());
}

#[test]
fn branch_arms_do_not_add_up() {
    let arm = |base: u32| {
        vec![
            inst(&[base], &[]),
            inst(&[base + 1], &[]),
            inst(&[base + 2], &[]),
            inst(&[], &[base, base + 1, base + 2]),
        ]
    };
    let p = [
        inst(&[0], &[]),
        Node::Branch {
            cond: vec![0],
            then: arm(1),
            otherwise: arm(4),
        },
    ];
    assert_eq!(max_pressure(&p, &one), 3);
    // A value live across the branch adds to both arms.
    let mut q = p.to_vec();
    q.push(inst(&[], &[0]));
    assert_eq!(max_pressure(&q, &one), 4);
}

mod schedule {
    use super::super::order::{hoist_loads, sink};
    use crate::ir::target::{BinOp, Inst, MemTy, Operand, Reg, RegTy, Space};

    fn ld(space: Space, dst: u32, addr: u32) -> Inst {
        Inst::Ld {
            stream: false,
            space,
            mem: MemTy::F32,
            dst: vec![Reg(dst)],
            addr: Reg(addr),
            offset: 0,
            pred: None,
        }
    }
    fn add(dst: u32, a: u32, b: u32) -> Inst {
        Inst::Binary {
            op: BinOp::Add,
            dst: Reg(dst),
            a: Operand::Reg(Reg(a)),
            b: Operand::Reg(Reg(b)),
        }
    }
    fn st(src: u32, addr: u32) -> Inst {
        Inst::St {
            stream: false,
            space: Space::Global,
            mem: MemTy::F32,
            src: vec![Operand::Reg(Reg(src))],
            addr: Reg(addr),
            offset: 0,
            pred: None,
        }
    }
    /// The order of `insts` after scheduling, as indices into `insts`.
    fn order(insts: &[Inst], tys: &[RegTy]) -> Vec<usize> {
        sink(
            &hoist_loads(insts, crate::target::ptxas::LOAD_WINDOW_WORDS, u32::MAX, 0),
            tys,
            false,
            false,
            true,
        )
        .into_iter()
        .map(|i| insts.iter().position(|j| std::ptr::eq(i, j)).unwrap())
        .collect()
    }

    #[test]
    fn the_latency_order_issues_loads_first_and_interleaves_chains() {
        // Element 1: f2 = f1 + f1, f3 = f2 + f2; element 2 the same on
        // f5, loaded after element 1's chain; both stored.
        let insts = [
            ld(Space::Global, 1, 0),
            add(2, 1, 1),
            add(3, 2, 2),
            ld(Space::Global, 5, 0),
            add(6, 5, 5),
            add(7, 6, 6),
            st(3, 0),
            st(7, 0),
        ];
        let order: Vec<usize> = super::super::order::ilp_order(&insts)
            .into_iter()
            .map(|i| insts.iter().position(|j| std::ptr::eq(i, j)).unwrap())
            .collect();
        // Both loads, then the chains step by step side by side; the
        // stores keep their order.
        assert_eq!(order, [0, 3, 1, 4, 2, 5, 6, 7]);
    }

    #[test]
    fn chains_run_element_after_element() {
        // Two statements over two elements (f1, f2), each element stored.
        let insts = [
            add(3, 1, 1),
            add(4, 2, 2),
            add(5, 3, 3),
            add(6, 4, 4),
            st(5, 0),
            st(6, 0),
        ];
        let mut tys = vec![RegTy::F32; 7];
        tys[0] = RegTy::U32;
        let refs: Vec<&Inst> = insts.iter().collect();
        let order = |chains| {
            sink(&refs, &tys, chains, false, true)
                .into_iter()
                .map(|i| insts.iter().position(|j| std::ptr::eq(i, j)).unwrap())
                .collect::<Vec<_>>()
        };
        // Each instruction before its first reader where Target IR put
        // that reader: both first statements stay live together.
        assert_eq!(order(false), [0, 1, 2, 4, 3, 5]);
        // Along chains: one element's statements and store, then the next.
        assert_eq!(order(true), [0, 2, 4, 1, 3, 5]);
    }

    #[test]
    fn global_loads_and_their_addresses_move_up_to_the_last_store() {
        // r0: address; f1 loaded, f2 = f1 + f1; r3 = r0 + r0 (address of
        // the second load), f4 loaded from it; stored, then a load after
        // the store stays behind it.
        let insts = [
            ld(Space::Global, 1, 0),
            add(2, 1, 1),
            add(3, 0, 0),
            ld(Space::Global, 4, 3),
            st(2, 0),
            ld(Space::Global, 5, 0),
            st(5, 4),
        ];
        let tys = [
            RegTy::U32,
            RegTy::F32,
            RegTy::F32,
            RegTy::U32,
            RegTy::F32,
            RegTy::F32,
        ];
        assert_eq!(order(&insts, &tys), [0, 2, 3, 1, 4, 5, 6]);
        // A global load passes a shuffle (which keeps its place), and so
        // does a shared one in a stretch without an mma.
        let across = |space| {
            [
                ld(space, 1, 0),
                Inst::ShflXor {
                    dst: Reg(2),
                    src: Reg(1),
                    lane_mask: 1,
                },
                ld(space, 4, 0),
                st(4, 0),
                st(2, 0),
            ]
        };
        assert_eq!(order(&across(Space::Global), &tys), [0, 2, 1, 3, 4]);
        assert_eq!(order(&across(Space::Shared), &tys), [0, 2, 1, 3, 4]);
    }

    #[test]
    fn ldmatrix_fragments_move_before_the_first_mma() {
        // Two k-steps: ldmatrix b1..b4 from r0, mma into f6..f9, then
        // ldmatrix b10..b13 and a second mma. With the mma in the stretch
        // both ldmatrix loads come first; a stretch without one keeps them.
        let ldm = |d: u32| Inst::LdMatrix {
            dst: (d..d + 4).map(Reg).collect(),
            addr: Reg(0),
            trans: false,
        };
        let mma = |a: u32, c: u32| Inst::Mma {
            kind: crate::target::MmaKind::MmaSync,
            m: 16,
            n: 8,
            k: 16,
            input: MemTy::F16,
            d: (c..c + 4).map(Reg).collect(),
            a: (a..a + 4).map(Reg).collect(),
            b: vec![Reg(a), Reg(a + 1)],
            c: (c..c + 4).map(Reg).collect(),
        };
        let tys = vec![RegTy::U32; 14];
        let insts = [ldm(1), mma(1, 6), ldm(10), mma(10, 6)];
        assert_eq!(order(&insts, &tys), [0, 2, 1, 3]);
        let no_mma = [ldm(1), st(1, 0), ldm(10)];
        assert_eq!(order(&no_mma, &tys), [0, 1, 2]);
    }

    #[test]
    fn global_loads_move_up_to_the_load_window() {
        use crate::target::ptxas::LOAD_WINDOW_WORDS;
        // Loads each followed by an addition of its value: the first
        // LOAD_WINDOW_WORDS loads move to the top, the rest stay in place.
        let n = LOAD_WINDOW_WORDS + 3;
        let mut insts = Vec::new();
        for i in 0..n {
            insts.push(ld(Space::Global, 1 + 2 * i, 0));
            insts.push(add(2 + 2 * i, 1 + 2 * i, 1 + 2 * i));
        }
        let hoisted: Vec<*const Inst> = hoist_loads(&insts, LOAD_WINDOW_WORDS, u32::MAX, 0)
            .into_iter()
            .map(|i| i as *const Inst)
            .collect();
        let w = LOAD_WINDOW_WORDS as usize;
        for (k, p) in hoisted.iter().enumerate().take(w) {
            assert!(std::ptr::eq(*p, &insts[2 * k]), "load {k} first");
        }
        // After the window: the additions of the hoisted loads, then each
        // remaining load before its addition.
        assert!(std::ptr::eq(hoisted[w], &insts[1]));
        assert!(std::ptr::eq(hoisted[2 * w], &insts[2 * w]));
        assert!(std::ptr::eq(hoisted[2 * w + 1], &insts[2 * w + 1]));
    }

    #[test]
    fn instructions_that_free_more_than_they_write_are_not_sunk() {
        // f2 = f0 + f1 reads the last uses of two loaded values: it frees
        // two words for one and stays after the loads, where its
        // operands are ready, rather than sinking past the store of f3
        // (f3 = f5 + f5, of a value from outside the block, sinks).
        let insts = [
            ld(Space::Global, 0, 9),
            ld(Space::Global, 1, 9),
            add(2, 0, 1),
            add(3, 5, 5),
            st(3, 9),
            st(2, 9),
        ];
        let mut tys = vec![RegTy::F32; 9];
        tys.push(RegTy::U64);
        assert_eq!(order(&insts, &tys), [0, 1, 2, 3, 4, 5]);
        // With one operand from outside it frees one word for one: it
        // sinks to its reader.
        let mut one = insts.clone();
        one[2] = add(2, 0, 6);
        assert_eq!(order(&one, &tys), [0, 1, 3, 4, 2, 5]);
    }
}

#[test]
fn loop_parameters_come_from_the_constant_bank_before_sm_90() {
    use crate::ir::target::{BinOp, Inst, Kernel, Operand, Param, Reg, RegTy};
    use crate::target::Arch;
    // r0 = param n; r1 = param p (64-bit); f2 = param a; for r3 in
    // range(0, r0, 1) { f4 = f2 + f2; r5 = r1 + r1 }.
    let param = |dst: u32, index: usize| Inst::Param {
        dst: Reg(dst),
        index,
    };
    let add = |dst: u32, a: u32| Inst::Binary {
        op: BinOp::Add,
        dst: Reg(dst),
        a: Operand::Reg(Reg(a)),
        b: Operand::Reg(Reg(a)),
    };
    let kernel = |arch| Kernel {
        name: "k".into(),
        arch,
        num_threads: 32,
        params: [("n", RegTy::I32), ("p", RegTy::U64), ("a", RegTy::F32)]
            .map(|(name, ty)| Param {
                name: name.into(),
                ty,
            })
            .to_vec(),
        smem: vec![],
        regs: vec![
            RegTy::I32,
            RegTy::U64,
            RegTy::F32,
            RegTy::I32,
            RegTy::F32,
            RegTy::U64,
        ],
        body: vec![
            param(0, 0),
            param(1, 1),
            param(2, 2),
            Inst::For {
                iv: Reg(3),
                lo: Operand::Int(0),
                hi: Operand::Reg(Reg(0)),
                step: Operand::Int(1),
                body: vec![add(4, 2), add(5, 1)],
            },
        ],
        layouts: vec![],
        notes: vec![],
        tensor_maps: vec![],
    };
    let peak = |arch| {
        let (program, words) = program_of(&kernel(arch));
        max_pressure(&program, &|r| words[r as usize])
    };
    // sm_90 holds n, p and a across the loop with the induction variable
    // (5 words) and r5 (2); on sm_80 each use in the loop reads a copy:
    // the peak is r3, p's copy and r5.
    assert_eq!(peak(Arch::Sm90), 7);
    assert_eq!(peak(Arch::Sm80), 5);
    assert_eq!(peak(Arch::Sm70), 5);
}

#[test]
fn ldmatrix_fragments_are_issued_early_one_k_step_ahead_where_registers_run_short() {
    use crate::ir::target::{Inst, Kernel, MemTy, Operand, Reg, RegTy, Space};
    use crate::target::Arch;
    // `n` k-steps, each an ldmatrix of 4 registers into one mma on the
    // accumulators r1..r4 (r0: the address): in order a few registers
    // are live; with every ldmatrix first, 4n.
    let kernel = |n: u32| {
        let mut body = Vec::new();
        for i in 0..n {
            let a: Vec<Reg> = (0..4).map(|j| Reg(5 + 4 * i + j)).collect();
            body.push(Inst::LdMatrix {
                dst: a.clone(),
                addr: Reg(0),
                trans: false,
            });
            body.push(Inst::Mma {
                kind: crate::target::MmaKind::MmaSync,
                m: 16,
                n: 8,
                k: 16,
                input: MemTy::F16,
                d: (1..5).map(Reg).collect(),
                a: a.clone(),
                b: a[..2].to_vec(),
                c: (1..5).map(Reg).collect(),
            });
        }
        body.push(Inst::St {
            stream: false,
            space: Space::Shared,
            mem: MemTy::F32,
            src: (1..5).map(|r| Operand::Reg(Reg(r))).collect(),
            addr: Reg(0),
            offset: 0,
            pred: None,
        });
        Kernel {
            name: "k".into(),
            arch: Arch::Sm80,
            num_threads: 32,
            params: vec![],
            smem: vec![],
            regs: vec![RegTy::U32; 5 + 4 * n as usize],
            body,
            layouts: vec![],
            notes: vec![],
            tensor_maps: vec![],
        }
    };
    // 30 k-steps fit (120 words early); 70 do not (280): past
    // `LDMATRIX_ALL_STEPS_MAX_REGS` only the next k step's fragments are
    // early, as ptxas keeps them where registers run short.
    assert!((120..=130).contains(&of_target(&kernel(30)).regs));
    let one_step = of_target(&kernel(70)).regs;
    assert!(
        one_step < crate::target::ptxas::LDMATRIX_ALL_STEPS_MAX_REGS,
        "{one_step}"
    );
}

#[test]
fn short_constant_loops_are_unrolled_where_the_arch_does() {
    use super::program::Remat;
    use super::unroll::unroll_short_loops;
    use crate::ir::target::{BinOp, CmpOp, Inst, MemTy, Operand, Reg, RegTy, Space};
    // for r0 in range(0, 3, 1) { p1 = r0 == 0; if p1 {} else { f2 = ld [r4];
    // f3 = f3 + f2 } }, f3 written before the loop (carried).
    let body = vec![
        Inst::Cmp {
            op: CmpOp::Eq,
            ty: RegTy::I32,
            dst: Reg(1),
            a: Operand::Reg(Reg(0)),
            b: Operand::Int(0),
        },
        Inst::If {
            cond: Reg(1),
            then: vec![],
            otherwise: vec![
                Inst::Ld {
                    stream: false,
                    space: Space::Global,
                    mem: MemTy::F32,
                    dst: vec![Reg(2)],
                    addr: Reg(4),
                    offset: 0,
                    pred: None,
                },
                Inst::Binary {
                    op: BinOp::Add,
                    dst: Reg(3),
                    a: Operand::Reg(Reg(3)),
                    b: Operand::Reg(Reg(2)),
                },
            ],
        },
    ];
    let insts = [Inst::For {
        iv: Reg(0),
        lo: Operand::Int(0),
        hi: Operand::Int(3),
        step: Operand::Int(1),
        body,
    }];
    let tys = vec![RegTy::I32, RegTy::Pred, RegTy::F32, RegTy::F32, RegTy::U64];
    let remat = |max| Remat {
        remat: vec![false; 5],
        words: tys.iter().map(|t| t.words()).collect(),
        origin: (0..5).collect(),
        tys: tys.clone(),
        def_count: vec![1, 1, 1, 2, 1],
        consts: Default::default(),
        max_unroll_trips: max,
        runtime_unroll: true,
        bank_param: vec![false; 5],
        loop_depth: 0,
        hoist: true,
        ldmatrix_steps: u32::MAX,
        shared_steps: 0,
        load_window: crate::target::ptxas::LOAD_WINDOW_WORDS,
        chains: false,
        ilp: false,
        compares: false,
        vendor: crate::target::Vendor::Nvidia,
    };
    // Three trips are more than two: the loop stays.
    assert_eq!(&*unroll_short_loops(&insts, &mut remat(2)), &insts);
    let mut rm = remat(4);
    let out = unroll_short_loops(&insts, &mut rm).into_owned();
    // The first iteration's branch folds to the empty arm, the others to
    // their loads, which write different registers; the last iteration
    // writes the original f2 and f3 and reads the second one's f3.
    assert!(out
        .iter()
        .all(|i| !matches!(i, Inst::For { .. } | Inst::If { .. })));
    let loads: Vec<Vec<Reg>> = out
        .iter()
        .filter_map(|i| match i {
            Inst::Ld { dst, .. } => Some(dst.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(loads.len(), 2);
    assert_ne!(loads[0], loads[1]);
    assert_eq!(loads[1], [Reg(2)]);
    match out.last() {
        Some(Inst::Binary {
            dst: Reg(3),
            a: Operand::Reg(Reg(a)),
            b: Operand::Reg(Reg(2)),
            ..
        }) => assert!(*a >= 5, "reads the previous iteration's sum"),
        other => panic!("unexpected last instruction {other:?}"),
    }
}

#[test]
fn estimate_has_a_floor() {
    assert_eq!(estimate_regs(&[inst(&[0], &[])], &one), MIN_REGS);
}

fn usage(threads: u32, regs: u32, smem: u32) -> Resources {
    Resources::new("k", Arch::Sm90, threads, regs, smem)
}

#[test]
fn warnings_and_errors() {
    let span = Span::new(4, 5);
    let codes = |r: &Resources| {
        r.diagnostics(span)
            .iter()
            .map(|d| d.code)
            .collect::<Vec<_>>()
    };
    // 128 threads, 32 regs: 16 blocks, 100%.
    assert!(codes(&usage(128, 32, 0)).is_empty());
    // 300 registers: a spill; occupancy is computed at 255 (2 blocks of 4
    // warps = 12.5%), so W0004 as well.
    let r = usage(128, 300, 0);
    assert_eq!(r.occupancy.blocks_per_sm, 2);
    assert_eq!(codes(&r), ["W0003", "W0004"]);
    // 1024 threads and 101 registers: ptxas keeps a thread of the block
    // within 64 (`.maxntid`) and spills the rest, so the block runs (one an
    // SM, 50%): W0003 at 64, no E0602.
    let r = usage(1024, 101, 128);
    assert_eq!(r.occupancy.blocks_per_sm, 1);
    assert_eq!(codes(&r), ["W0003"]);
    let d = r.diagnostics(span);
    assert!(
        d[0].message
            .contains("more than the 64 a thread of a 1024-thread block can have"),
        "{d:?}"
    );
    // 64 registers fit such a block: no warning.
    assert!(codes(&usage(1024, 64, 128)).is_empty());
    // 200 KiB of shared memory: 1 block of 4 warps (6.25%), limited by it.
    let r = usage(128, 32, 200 * 1024);
    assert_eq!(codes(&r), ["W0004"]);
    assert!(
        r.diagnostics(span)[0].message.contains("shared memory"),
        "{:?}",
        r.diagnostics(span)
    );
    assert_eq!(codes(&usage(128, 32, 230 * 1024)), ["E0603"]);
    assert_eq!(codes(&usage(2048, 16, 0)), ["E0604"]);
    // Exactly 25% is not under 25%: 16 warps of 64 (4 blocks x 4 warps).
    let r = usage(128, 32, 48 * 1024);
    assert_eq!(r.occupancy.occupancy(), 0.25);
    assert!(codes(&r).is_empty());
}

#[test]
fn json_and_table() {
    let rows = [
        usage(128, 40, 16384),
        Resources::new("flash_attn", Arch::Sm80, 256, 168, 49152),
    ];
    let v: serde_json::Value = serde_json::from_str(&render_json(&rows)).unwrap();
    let a = v.as_array().unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!(a[1]["kernel"], "flash_attn");
    assert_eq!(a[1]["arch"], "sm_80");
    assert_eq!(a[1]["threads"], 256);
    assert_eq!(a[1]["regs"], 168);
    assert_eq!(a[1]["smem_bytes"], 49152);
    // 168 regs: 5376 a warp; 16384 / 5376 = 3 warps a sub-partition, 12 an
    // SM, 1 block of 8 warps: 12.5%.
    assert_eq!(a[1]["blocks_per_sm"], 1);
    assert_eq!(a[1]["occupancy"], 0.125);
    assert_eq!(a[1]["limiter"], "registers");
    let t = render_table(&rows);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0].starts_with("kernel"));
    assert!(lines[2].starts_with("flash_attn  sm_80"), "{t}");
    assert!(lines[2].ends_with("registers"), "{t}");
}

/// Wave-uniform registers: parameters, block ids and what is computed from
/// them alone, a loop counter with uniform bounds, and a load from a uniform
/// address that nothing was stored to before (a scalar load), are uniform; a
/// thread id and anything written under a branch on a divergent value are
/// not, nor is a register carried around a loop that a divergent value
/// reaches on a later trip.
#[test]
fn amd_uniform_registers() {
    use crate::ir::target::{
        BinOp, CmpOp, Inst, Kernel, MemTy, Operand, Param, Reg, RegTy, Space, Special,
    };
    let r = |i: u32| Operand::Reg(Reg(i));
    let add = |dst: u32, a: Operand, b: Operand| Inst::Binary {
        op: BinOp::Add,
        dst: Reg(dst),
        a,
        b,
    };
    // r0 = param n; r1 = block id; r2 = thread id; r3 = r0 + r1 (uniform);
    // r4 = r3 + r2 (divergent); r5 = p (64-bit); f6 = load [r5] (uniform:
    // no store comes before it);
    // p7 = r4 < r0 (divergent); if p7 { r8 = r0 + r0 } (divergent: merged
    // under a divergent branch); for r9 in 0..r0 { r10 = r10 + r9 } with
    // r10 = 0 before it (uniform); for r11 in 0..r0 { r12 = r12 + r13;
    // r13 = r2 } (r12 becomes divergent on the second trip); store them.
    let kernel = Kernel {
        name: "k".into(),
        arch: Arch::Gfx942,
        num_threads: 256,
        params: vec![
            Param {
                name: "n".into(),
                ty: RegTy::I32,
            },
            Param {
                name: "p".into(),
                ty: RegTy::U64,
            },
        ],
        smem: vec![],
        regs: vec![
            RegTy::I32,
            RegTy::I32,
            RegTy::I32,
            RegTy::I32,
            RegTy::I32,
            RegTy::U64,
            RegTy::F32,
            RegTy::Pred,
            RegTy::I32,
            RegTy::I32,
            RegTy::I32,
            RegTy::I32,
            RegTy::I32,
            RegTy::I32,
        ],
        body: vec![
            Inst::Param {
                dst: Reg(0),
                index: 0,
            },
            Inst::Special {
                dst: Reg(1),
                which: Special::BlockId(0),
            },
            Inst::Special {
                dst: Reg(2),
                which: Special::ThreadId,
            },
            add(3, r(0), r(1)),
            add(4, r(3), r(2)),
            Inst::Param {
                dst: Reg(5),
                index: 1,
            },
            Inst::Ld {
                stream: false,
                space: Space::Global,
                mem: MemTy::F32,
                dst: vec![Reg(6)],
                addr: Reg(5),
                offset: 0,
                pred: None,
            },
            Inst::Cmp {
                op: CmpOp::Lt,
                ty: RegTy::I32,
                dst: Reg(7),
                a: r(4),
                b: r(0),
            },
            Inst::If {
                cond: Reg(7),
                then: vec![add(8, r(0), r(0))],
                otherwise: vec![],
            },
            Inst::Mov {
                dst: Reg(10),
                src: Operand::Int(0),
            },
            Inst::For {
                iv: Reg(9),
                lo: Operand::Int(0),
                hi: r(0),
                step: Operand::Int(1),
                body: vec![add(10, r(10), r(9))],
            },
            Inst::Mov {
                dst: Reg(12),
                src: Operand::Int(0),
            },
            Inst::Mov {
                dst: Reg(13),
                src: Operand::Int(0),
            },
            Inst::For {
                iv: Reg(11),
                lo: Operand::Int(0),
                hi: r(0),
                step: Operand::Int(1),
                body: vec![
                    add(12, r(12), r(13)),
                    Inst::Mov {
                        dst: Reg(13),
                        src: r(2),
                    },
                ],
            },
            // Every value stored, so that none is dead code.
            Inst::St {
                stream: false,
                space: Space::Global,
                mem: MemTy::I32,
                src: vec![r(4), r(8), r(10), r(12)],
                addr: Reg(5),
                offset: 0,
                pred: None,
            },
        ],
        layouts: vec![],
        notes: vec![],
        tensor_maps: vec![],
    };
    // Without the store the kernel writes nothing: LLVM deletes its body.
    let mut silent = kernel.clone();
    silent.body.pop();
    assert_eq!(of_target(&silent).regs, 0);
    let u = amd::uniform_regs(&kernel);
    let uniform: Vec<u32> = (0..u.len() as u32).filter(|&i| u[i as usize]).collect();
    assert_eq!(uniform, [0, 1, 3, 5, 6, 9, 10, 11]);
    // Scalar loads move whole dwords: the same load of an i8 or a bf16 is a
    // vector load, its value in a VGPR; two bf16s (a dword) stay scalar.
    for (mem, n, scalar) in [
        (MemTy::I8, 1, false),
        (MemTy::BF16, 1, false),
        (MemTy::BF16, 2, true),
    ] {
        let mut narrow = kernel.clone();
        narrow.regs.push(RegTy::F32);
        let Inst::Ld { mem: m, dst, .. } = &mut narrow.body[6] else {
            panic!("the load")
        };
        *m = mem;
        *dst = (0..n).map(|i| Reg([6, 14][i])).collect();
        assert_eq!(amd::uniform_regs(&narrow)[6], scalar, "{mem:?} x{n}");
    }
    // The estimate: VGPRs from the divergent values only, SGPRs from the
    // uniform ones with the arch's base; the report carries both.
    let res = of_target(&kernel);
    let amd = res.amd.expect("AMD registers");
    assert!(res.regs >= crate::target::amdgpu::MIN_VGPRS, "{res:?}");
    assert!(
        amd.sgprs > crate::target::amdgpu::sgpr_base(Arch::Gfx942),
        "{res:?}"
    );
    assert_eq!(amd.agprs, 0);
    assert_eq!(res.occupancy.waves_per_simd, Some(8), "{res:?}");
    let json = res.to_json();
    assert_eq!(json["waves_per_simd"], 8);
    assert_eq!(json["sgprs"], amd.sgprs);
    assert_eq!(json["agprs"], 0);
    assert_eq!(json["regs"], res.regs);
}

/// What LLVM does to the printed HIP before the AMD estimate counts it: a
/// repeated computation reads the first one's result, what nothing reads is
/// dropped, a uniform load after a store is a vector load, and float
/// arithmetic on uniform values takes VGPRs (no scalar float ALU).
#[test]
fn amd_middle_end_and_scalar_loads() {
    use crate::ir::target::{BinOp, Inst, Kernel, MemTy, Operand, Param, Reg, RegTy, Space};
    let r = |i: u32| Operand::Reg(Reg(i));
    let bin = |op: BinOp, dst: u32, a: Operand, b: Operand| Inst::Binary {
        op,
        dst: Reg(dst),
        a,
        b,
    };
    let ld = |dst: u32, offset: i64| Inst::Ld {
        stream: false,
        space: Space::Global,
        mem: MemTy::F32,
        dst: vec![Reg(dst)],
        addr: Reg(0),
        offset,
        pred: None,
    };
    let st = |src: &[u32], offset: i64| Inst::St {
        stream: false,
        space: Space::Global,
        mem: MemTy::F32,
        src: src.iter().map(|&x| r(x)).collect(),
        addr: Reg(0),
        offset,
        pred: None,
    };
    // r0 = p; f1 = load [r0]; f2 = f1 + 1.0; f3 = f1 + 1.0 (repeats f2);
    // f4 = f2 * f3; f5 = f4 * 3.0 (never read); f6 = load [r0 + 8] (never
    // read); store [r0 + 4] = f4; f7 = load [r0 + 12] (after the store);
    // store [r0 + 16] = (f7, f2).
    let kernel = Kernel {
        name: "k".into(),
        arch: Arch::Gfx90a,
        num_threads: 64,
        params: vec![Param {
            name: "p".into(),
            ty: RegTy::U64,
        }],
        smem: vec![],
        regs: vec![
            RegTy::U64,
            RegTy::F32,
            RegTy::F32,
            RegTy::F32,
            RegTy::F32,
            RegTy::F32,
            RegTy::F32,
            RegTy::F32,
        ],
        body: vec![
            Inst::Param {
                dst: Reg(0),
                index: 0,
            },
            ld(1, 0),
            bin(BinOp::Add, 2, r(1), Operand::Float(1.0)),
            bin(BinOp::Add, 3, r(1), Operand::Float(1.0)),
            bin(BinOp::Mul, 4, r(2), r(3)),
            bin(BinOp::Mul, 5, r(4), Operand::Float(3.0)),
            ld(6, 8),
            st(&[4], 4),
            ld(7, 12),
            st(&[7, 2], 16),
        ],
        layouts: vec![],
        notes: vec![],
        tensor_maps: vec![],
    };
    let (after, _) = super::llvm_ir::as_llvm_leaves_it(&kernel);
    assert_eq!(
        after.body,
        vec![
            kernel.body[0].clone(),
            kernel.body[1].clone(),
            kernel.body[2].clone(),
            bin(BinOp::Mul, 4, r(2), r(2)),
            kernel.body[7].clone(),
            kernel.body[8].clone(),
            kernel.body[9].clone(),
        ]
    );
    let u = amd::uniform_regs(&kernel);
    let uniform: Vec<u32> = (0..u.len() as u32).filter(|&i| u[i as usize]).collect();
    assert_eq!(uniform, [0, 1, 2, 3, 4, 5, 6]);
    // VGPRs: f2 (float arithmetic on a scalar load) held beside f4, then
    // beside f7 (a vector load), plus what clang adds.
    let res = of_target(&kernel);
    assert_eq!(
        res.regs,
        (2 + crate::target::amdgpu::VGPR_OVERHEAD).max(crate::target::amdgpu::MIN_VGPRS),
        "{res:?}"
    );
}

/// Arithmetic with constants on a masked load's result is folded into the
/// load (its result takes the load over), and a value read only by a masked
/// store moves, with what only it reads, to right before that store.
#[test]
fn amd_folds_into_masked_loads_and_sinks_into_masked_stores() {
    use crate::ir::target::{BinOp, Inst, Kernel, MemTy, Operand, Param, Reg, RegTy, Space};
    let r = |i: u32| Operand::Reg(Reg(i));
    let bin = |op: BinOp, dst: u32, a: Operand, b: Operand| Inst::Binary {
        op,
        dst: Reg(dst),
        a,
        b,
    };
    // r0 = p; p1 = param (pred stands in); f2 = 0; f2 = load [r0] if p1;
    // f3 = f2 + 1 (folded: f3 = 0; f3 = load if p1); f4 = load [r0 + 4];
    // f5 = f4 * f4; f6 = f5 + f3; f7 = f4 + 2 (read after the store);
    // store [r0] = f6 if p1 (f5 and f6 move to it); store [r0 + 8] = f7.
    let ld = |dst: u32, offset: i64, pred: Option<u32>| Inst::Ld {
        stream: false,
        space: Space::Global,
        mem: MemTy::F32,
        dst: vec![Reg(dst)],
        addr: Reg(0),
        offset,
        pred: pred.map(Reg),
    };
    let st = |src: u32, offset: i64, pred: Option<u32>| Inst::St {
        stream: false,
        space: Space::Global,
        mem: MemTy::F32,
        src: vec![r(src)],
        addr: Reg(0),
        offset,
        pred: pred.map(Reg),
    };
    let mov0 = |dst: u32| Inst::Mov {
        dst: Reg(dst),
        src: Operand::Float(0.0),
    };
    let kernel = Kernel {
        name: "k".into(),
        arch: Arch::Gfx942,
        num_threads: 64,
        params: vec![
            Param {
                name: "p".into(),
                ty: RegTy::U64,
            },
            Param {
                name: "m".into(),
                ty: RegTy::Pred,
            },
        ],
        smem: vec![],
        regs: vec![
            RegTy::U64,
            RegTy::Pred,
            RegTy::F32,
            RegTy::F32,
            RegTy::F32,
            RegTy::F32,
            RegTy::F32,
            RegTy::F32,
        ],
        body: vec![
            Inst::Param {
                dst: Reg(0),
                index: 0,
            },
            Inst::Param {
                dst: Reg(1),
                index: 1,
            },
            mov0(2),
            ld(2, 0, Some(1)),
            bin(BinOp::Add, 3, r(2), Operand::Float(1.0)),
            ld(4, 4, None),
            bin(BinOp::Mul, 5, r(4), r(4)),
            bin(BinOp::Add, 6, r(5), r(3)),
            bin(BinOp::Add, 7, r(4), Operand::Float(2.0)),
            st(6, 0, Some(1)),
            st(7, 8, None),
        ],
        layouts: vec![],
        notes: vec![],
        tensor_maps: vec![],
    };
    let (after, folded) = super::llvm_ir::as_llvm_leaves_it(&kernel);
    assert_eq!(folded, [Reg(3)]);
    assert_eq!(
        after.body,
        vec![
            kernel.body[0].clone(),
            kernel.body[1].clone(),
            mov0(3),
            ld(3, 0, Some(1)),
            kernel.body[5].clone(),
            kernel.body[8].clone(),
            kernel.body[6].clone(),
            kernel.body[7].clone(),
            kernel.body[9].clone(),
            kernel.body[10].clone(),
        ]
    );
}

/// AMD rows in the report: W0004 counts waves per SIMD, W0007 flags SGPRs
/// past the addressable ones, and the table adds the AMD columns.
#[test]
fn amd_warnings_and_table() {
    let span = Span::new(4, 5);
    let row = |vgprs, sgprs, lds| {
        Resources::amd(
            "k",
            Arch::Gfx90a,
            256,
            vgprs,
            AmdRegs { agprs: 0, sgprs },
            lds,
        )
    };
    let codes = |r: &Resources| {
        r.diagnostics(span)
            .iter()
            .map(|d| d.code)
            .collect::<Vec<_>>()
    };
    assert!(codes(&row(64, 20, 0)).is_empty());
    // 256 VGPRs: 2 waves of 8, 25%: not under it.
    assert!(codes(&row(256, 20, 0)).is_empty());
    // 300 VGPRs: past the 256 architectural ones, LLVM moves the rest into
    // AGPRs (304 + 44 -> 352 of the unified file: 1 wave, 12.5%).
    let r = row(300, 20, 0);
    assert_eq!(r.occupancy.waves_per_simd, Some(1));
    let d = r.diagnostics(span);
    assert_eq!(codes(&r), ["W0004"]);
    assert!(d[0].message.contains("1 wave of 8 per SIMD"), "{d:?}");
    assert!(d[0].message.contains("VGPRs"), "{d:?}");
    // 600 VGPRs: more than a wave can hold, a spill.
    assert_eq!(codes(&row(600, 20, 0)), ["W0003", "W0004"]);
    assert_eq!(codes(&row(64, 110, 0)), ["W0007"]);
    assert_eq!(codes(&row(64, 20, 70_000)), ["E0603"]);
    let t = render_table(&[row(64, 20, 0), usage(128, 32, 0)]);
    let lines: Vec<&str> = t.lines().collect();
    assert!(
        lines[0].contains("sgprs") && lines[0].contains("waves/SIMD"),
        "{t}"
    );
    assert!(lines[1].starts_with("k       gfx90a"), "{t}");
}

/// On CDNA, MFMA accumulators are AGPRs where the workgroup has at most four
/// waves (one wave a SIMD may then use more than 256 registers, and LLVM
/// selects MFMA's AGPR form), and VGPRs in a larger workgroup; RDNA has no
/// AGPRs.
#[test]
fn amd_mfma_accumulators_are_agprs_in_workgroups_of_four_waves() {
    let of = |warps: u32, arch: Arch| {
        let src = format!(
            r#"
@kernel(grid=(cdiv(M, 64), cdiv(N, 64)), num_warps={warps})
def mm(A: Tensor["M", 64, bf16], B: Tensor[64, "N", bf16], C: Tensor["M", "N", f32]):
    m0 = program_id(0) * 64
    n0 = program_id(1) * 64
    acc = zeros([64, 64], f32)
    for k in range(0, 64, 32):
        acc = dot(load(A[m0 : m0 + 64, k : k + 32]), load(B[k : k + 32, n0 : n0 + 64]), acc)
    store(C[m0 : m0 + 64, n0 : n0 + 64], acc)
"#
        );
        amd_of_source(&src, arch)
    };
    // 64 x 64 f32 over 4 waves of 64 lanes: 16 accumulators a lane.
    let small = of(4, Arch::Gfx90a);
    assert_eq!(small.amd.map(|a| a.agprs), Some(16), "{small:?}");
    let large = of(8, Arch::Gfx942);
    assert_eq!(large.amd.map(|a| a.agprs), Some(0), "{large:?}");
    let rdna = of(4, Arch::Gfx1100);
    assert_eq!(rdna.amd.map(|a| a.agprs), Some(0), "{rdna:?}");
}

/// The estimate of a kernel written as a user would, compiled for `arch`.
fn amd_of_source(src: &str, arch: Arch) -> Resources {
    use crate::db::{file_kernels, target_ir, Database};
    let mut db = Database::new();
    db.set_arch(arch);
    let file = db.set_source("/t/k.tsr", src.to_string());
    let (_, item, _) = file_kernels(&db, file).into_iter().next().unwrap();
    let spec = crate::ir::tile::Specialization::new();
    let k = target_ir(&db, item, db.options(), spec).clone().unwrap();
    of_target(&k)
}

/// A store's data are VGPRs even where the value is the same in every lane:
/// four stored zeros take four (clang-19: 5 VGPRs with the offset; 3 were
/// estimated with the zeros in SGPRs).
#[test]
fn amd_stored_values_are_vgprs() {
    let src = r#"
@kernel(grid=(1,))
def zero(out: Tensor[64, f32]):
    store(out[0 : 64], zeros([64], f32))
"#;
    for arch in [Arch::Gfx90a, Arch::Gfx942, Arch::Gfx1100] {
        let res = amd_of_source(src, arch);
        assert!(res.regs >= 5, "{arch:?}: {res:?}");
    }
}

/// The fragments of as many k steps as the budget allows: the most count
/// within it, the count without any where one step's exceed it, and no
/// more tries than there are steps.
#[test]
fn amd_fragments_ahead_within_the_budget() {
    let tries = std::cell::Cell::new(0);
    // 40 VGPRs with one step's fragments, 16 more a step, 4 steps.
    let at = |n: u32| {
        tries.set(tries.get() + 1);
        40 + 16 * (n.min(4) - 1)
    };
    assert_eq!(amd::fragments_ahead(30, 256, at), 88);
    assert_eq!(amd::fragments_ahead(30, 80, at), 72);
    assert_eq!(amd::fragments_ahead(30, 39, at), 30);
    // Where every step's fragments are no more than the base: the base.
    assert_eq!(amd::fragments_ahead(100, 256, at), 100);
    tries.set(0);
    amd::fragments_ahead(30, 1000, at);
    assert_eq!(tries.get(), 4, "the all-steps count and steps 1, 2 and 4");
    // Within a budget of 3 steps' fragments: 1, 2, 4 (over), then 3.
    tries.set(0);
    assert_eq!(amd::fragments_ahead(30, 75, at), 72);
    assert_eq!(tries.get(), 5);
}

/// On gfx1100 a WMMA GEMM whose LDS leaves VGPRs free holds the fragments
/// of both k steps of its 64 x 64 x 32 tile (clang-19: 116 VGPRs; 75 with
/// one step's).
#[test]
fn amd_wmma_fragments_of_every_k_step_where_the_occupancy_allows() {
    let src = r#"
@kernel(grid=(cdiv(M, 64), cdiv(N, 64)), num_warps=4)
def mm(A: Tensor["M", "K", bf16], B: Tensor["K", "N", bf16], C: Tensor["M", "N", f32]):
    m0 = program_id(0) * 64
    n0 = program_id(1) * 64
    acc = zeros([64, 64], f32)
    for k in range(0, K, 32):
        acc = dot(load(A[m0 : m0 + 64, k : k + 32]), load(B[k : k + 32, n0 : n0 + 64]), acc)
    store(C[m0 : m0 + 64, n0 : n0 + 64], acc)
"#;
    let res = amd_of_source(src, Arch::Gfx1100);
    assert!((95..=130).contains(&res.regs), "{res:?}");
}

/// A loop whose MFMAs take eight k steps a trip on each AGPR accumulator
/// tile keeps a VGPR copy of the accumulators from the loop's head to its
/// first MFMA; with four a trip, only where arithmetic reads the result
/// after the loop (one tile's); never where the loop reads them first.
#[test]
fn amd_accumulator_copies_across_the_loop_head() {
    use super::Node;
    // Registers 0..4: the carried accumulator tile (two words a register);
    // each MFMA writes four fresh ones; 100: a fragment; 101: arithmetic.
    let program = |mfmas: u32, read_first: bool, scaled_after: bool| {
        let mut body = vec![Node::Inst {
            defs: vec![100],
            uses: vec![],
        }];
        if read_first {
            body.push(Node::Inst {
                defs: vec![101],
                uses: vec![0],
            });
        }
        let mut c: Vec<u32> = (0..4).collect();
        for m in 0..mfmas {
            let d: Vec<u32> = (0..4).map(|i| 4 + 4 * m + i).collect();
            let mut uses = c.clone();
            uses.push(100);
            body.push(Node::Inst {
                defs: d.clone(),
                uses,
            });
            c = d;
        }
        let after = Node::Inst {
            defs: if scaled_after { vec![101] } else { vec![] },
            uses: c,
        };
        vec![
            Node::Loop {
                entry: Box::new(Node::Inst {
                    defs: vec![],
                    uses: vec![],
                }),
                body,
            },
            after,
        ]
    };
    let run = |mfmas, read_first, scaled_after| {
        let mut p = program(mfmas, read_first, scaled_after);
        let mut words = vec![2u32; 102];
        let mut origin: Vec<u32> = (0..102).collect();
        let acc: Vec<bool> = (0..102).map(|r| r < 100).collect();
        amd::accumulator_copies(&mut p, &mut words, &mut origin, &acc);
        let Node::Loop { body, .. } = &p[0] else {
            unreachable!()
        };
        match &body[0] {
            Node::Inst { defs, uses } if defs[0] >= 102 && uses.is_empty() => {
                let copy = defs[0];
                let first_mfma = body
                    .iter()
                    .position(|n| matches!(n, Node::Inst { defs, .. } if defs.len() > 1))
                    .unwrap();
                let Node::Inst { uses, .. } = &body[first_mfma] else {
                    unreachable!()
                };
                assert!(uses.contains(&copy));
                words[copy as usize]
            }
            _ => 0,
        }
    };
    assert_eq!(run(8, false, false), 8);
    assert_eq!(run(4, false, false), 0);
    assert_eq!(run(4, false, true), 8);
    assert_eq!(run(2, false, true), 0);
    assert_eq!(run(8, true, false), 0);
}

/// A loop ptxas unrolls whose wgmma reads and writes its accumulators in one
/// operand (an f8 GEMM over a static K of 256: four iterations, each summing
/// into registers of its own that are then added to the accumulator) is
/// unrolled with each iteration's registers renamed from the kernel's own
/// (renaming the already renamed names once panicked), and both sets of
/// accumulators count.
#[test]
fn unrolled_wgmma_accumulators_are_renamed_from_the_kernels_registers() {
    use crate::ir::target::Inst;
    let src = "@kernel(grid=(cdiv(M, BM), cdiv(N, BN)), num_warps=4, num_stages=3)
def nt(A: Tensor[\"M\", 256, f8e4m3], Bt: Tensor[\"N\", 256, f8e4m3], C: Tensor[\"M\", \"N\", f32],
       BM: const = 64, BN: const = 64, BK: const = 64):
    m0 = program_id(0) * BM
    n0 = program_id(1) * BN
    acc = zeros([BM, BN], f32)
    for k in range(0, 256, BK):
        acc = dot(load(A[m0 : m0 + BM, k : k + BK]), load(Bt[n0 : n0 + BN, k : k + BK]).T, acc)
    store(C[m0 : m0 + BM, n0 : n0 + BN], acc)
";
    let k = target_kernel("nt.tsr", src.to_string(), Some(Arch::Sm90a));
    assert!(k.any_in_loop(|i| matches!(i, Inst::Wgmma { .. })));
    // 32 accumulators a thread and 32 sums.
    let r = super::of_target(&k);
    assert!((64..160).contains(&r.regs), "{}", r.regs);
}
