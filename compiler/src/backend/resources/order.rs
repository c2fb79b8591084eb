//! The orders ptxas's scheduler is modelled to run a block in: loads issued
//! early, pure instructions sunk to their readers, and the latency order of
//! a list scheduler.

use rustc_hash::{FxHashMap, FxHashSet};

use super::work;
use crate::target::ptxas::{PREDICATE_REGS, SHARED_LOAD_WINDOW_WORDS};

/// The instructions of one block in the order ptxas's scheduler is modelled to
/// run them: an instruction without side effects that reads no memory (moves,
/// arithmetic, compares, conversions, special registers) is placed right
/// before the first instruction of the block that reads one of its results
/// (nested regions included), or before the block's next branch if that
/// comes first, so a value is not held while unrelated work runs, unless it writes a value and frees more words than it writes (the
/// block's last reads of values the block defines). Memory accesses, barriers,
/// shuffles and control flow keep their order (given by [`hoist_loads`]).
/// With `chains`, each goes before its first reader wherever that reader is
/// placed in turn (a depth-first walk), not where Target IR put it. With
/// `compares`, an index read only by compares follows them (see below).
/// With `unpacks` (ptxas, for which a move between a float and an integer
/// register is free), such a move is placed like a pure instruction, and the
/// shift or mask of a packed word that only it reads goes with it.
pub(super) fn sink<'a>(
    insts: &[&'a crate::ir::target::Inst],
    tys: &[crate::ir::target::RegTy],
    chains: bool,
    compares: bool,
    unpacks: bool,
) -> Vec<&'a crate::ir::target::Inst> {
    use crate::ir::target::Inst;
    fn reads(inst: &Inst, out: &mut Vec<u32>) {
        work(1);
        out.extend(inst.uses().into_iter().map(|r| r.0));
        for region in inst.regions() {
            for i in region {
                reads(i, out);
            }
        }
    }
    // Pure and not a copy: copies stay where Target IR put them. A move
    // between a float and an integer register (a bf16 unpacked into an f32)
    // is no copy but a reinterpretation, free in SASS, so it moves with the
    // instruction that computed its source.
    let float = |r: crate::ir::target::Reg| {
        matches!(
            tys.get(r.0 as usize),
            Some(crate::ir::target::RegTy::F32 | crate::ir::target::RegTy::F64)
        )
    };
    let reinterprets = |i: &Inst| {
        unpacks
            && matches!(i, Inst::Mov { dst, src: crate::ir::target::Operand::Reg(s) } if float(*dst) != float(*s))
    };
    let movable = |i: &Inst| i.is_pure() && (!matches!(i, Inst::Mov { .. }) || reinterprets(i));
    // Address arithmetic (64-bit) does not move past a global load: ptxas
    // computes the addresses of a batch of loads (a gather's) before issuing
    // them back to back.
    let address = |i: &Inst| {
        matches!(i, Inst::MulWide { .. })
            || matches!(i, Inst::Binary { dst, .. } if tys.get(dst.0 as usize) == Some(&crate::ir::target::RegTy::U64))
    };
    let global_load = |i: &Inst| {
        matches!(
            i,
            Inst::Ld {
                space: crate::ir::target::Space::Global,
                ..
            }
        )
    };
    // Each instruction's reads (nested regions included), without repeats:
    // a sorted list costs less to build than a set per instruction.
    let reads_of: Vec<Vec<u32>> = insts
        .iter()
        .map(|i| {
            let mut s = Vec::new();
            reads(i, &mut s);
            work(s.len());
            s.sort_unstable();
            s.dedup();
            s
        })
        .collect();
    // For each instruction, the index it is placed before.
    let n = insts.len();
    let mut place: Vec<(usize, usize)> = Vec::with_capacity(n);
    // Per register: the last index of the block reading it, and whether the
    // block defines it.
    let mut last_read = FxHashMap::default();
    let mut defined_here = FxHashSet::default();
    for (j, i) in insts.iter().enumerate() {
        for &r in &reads_of[j] {
            last_read.insert(r, j);
        }
        for r in i.defs() {
            defined_here.insert(r.0);
        }
    }
    // Per register, the indices (ascending) that read it and that write it,
    // and per index the first global load at or after it: each instruction's
    // placement is then a few binary searches, not a scan of the block.
    let mut readers: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
    let mut writers: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
    for (j, i) in insts.iter().enumerate() {
        for &r in &reads_of[j] {
            readers.entry(r).or_default().push(j);
        }
        for r in i.defs() {
            writers.entry(r.0).or_default().push(j);
        }
    }
    let next_after = |lists: &FxHashMap<u32, Vec<usize>>, r: u32, k: usize| {
        lists.get(&r).and_then(|v| {
            work(1 + v.len().max(1).ilog2() as usize);
            let at = v.partition_point(|&j| j <= k);
            v.get(at).copied()
        })
    };
    let mut next_global_load = vec![n; n + 1];
    for j in (0..n).rev() {
        next_global_load[j] = if global_load(insts[j]) {
            j
        } else {
            next_global_load[j + 1]
        };
    }
    let word = |r: u32| tys.get(r as usize).map_or(1, |t| t.words());
    // Per index the first branch (`If`) at or after it: the block ends there
    // for ptxas's scheduler, which moves nothing from one side of a branch
    // to the other (the in-bounds fast path puts an `If` around each tile
    // access: a product sunk past the `If` of the next load stayed live
    // beside that load's values).
    let mut next_branch = vec![n; n + 1];
    for j in (0..n).rev() {
        next_branch[j] = if matches!(insts[j], Inst::If { .. }) {
            j
        } else {
            next_branch[j + 1]
        };
    }
    for (k, inst) in insts.iter().enumerate() {
        crate::cancel::checkpoint();
        work(1 + reads_of[k].len());
        // Writes a value and frees more words than it writes: the block's
        // last reads of values it defines (a select of two computed values,
        // an accumulation of a loaded value into a carried one).
        let freeing = || {
            let dying: u32 = reads_of[k]
                .iter()
                .filter(|r| defined_here.contains(r) && last_read.get(r) == Some(&k))
                .map(|&r| word(r))
                .sum();
            let made: u32 = inst.defs().iter().map(|r| word(r.0)).sum();
            made > 0 && dying > made
        };
        if movable(inst) && !freeing() {
            // The first later instruction that reads what this one writes,
            // or writes what it writes or reads: a later write pins it, so
            // only single-definition values move.
            let first_use = inst
                .defs()
                .into_iter()
                .flat_map(|d| [next_after(&readers, d.0, k), next_after(&writers, d.0, k)])
                .chain(reads_of[k].iter().map(|&r| next_after(&writers, r, k)))
                .flatten()
                .min();
            let mut at = first_use.map_or(k, |j| j.max(k));
            if address(inst) && next_global_load[k + 1] < at {
                at = next_global_load[k + 1];
            }
            at = at.min(next_branch[k + 1]);
            if at > k {
                // Placed just before `at`, after everything originally before it.
                place.push((at, k));
                continue;
            }
        }
        place.push((k, k));
    }
    // A value read only by reinterpreting moves goes where they go: the two
    // halves of a bf16 unpack (a shift, then a move into a float register)
    // stay together, so the packed word, not the shifted one, is held
    // until the float is read.
    for k in (0..n).rev().filter(|_| unpacks) {
        let defs = insts[k].defs();
        // An integer computed from one register (a shift or mask of a packed
        // word): moving it holds that register instead.
        if !movable(insts[k])
            || defs.is_empty()
            || defs.iter().any(|d| float(*d))
            || reads_of[k].len() != 1
        {
            continue;
        }
        let mut to = usize::MAX;
        let only_moves = defs.iter().all(|d| {
            readers.get(&d.0).is_some_and(|rs| {
                rs.iter().all(|&j| {
                    to = to.min(place[j].0);
                    j > k && reinterprets(insts[j])
                })
            }) && writers.get(&d.0).is_some_and(|w| w.len() == 1)
        });
        let to = to.min(next_branch[k + 1]);
        if only_moves && to != usize::MAX && to > place[k].0 {
            place[k] = (to, k);
        }
    }
    // With `compares`, a value read only by compares goes where its first
    // compare goes, where the block sinks more compares than a thread has
    // predicate registers ([`PREDICATE_REGS`]): ptxas cannot hold them all,
    // so each compare runs next to the masked access that reads it, with
    // the index it compares (the per-element bounds of the masked stores of
    // a 4096-element bf16 tile: 32 indices held across the stores
    // otherwise, 72 estimated against ptxas's 42).
    let is_predicate_only = |i: &Inst| {
        let defs = i.defs();
        !defs.is_empty()
            && defs
                .iter()
                .all(|r| tys.get(r.0 as usize) == Some(&crate::ir::target::RegTy::Pred))
    };
    let sunk_compares = (0..n)
        .filter(|&k| place[k].0 != k && is_predicate_only(insts[k]))
        .count();
    if compares && sunk_compares > PREDICATE_REGS {
        for k in (0..n).rev() {
            let at = place[k].0;
            // Read by compares only, and reading nothing for the last time
            // (moving it would hold its operands longer).
            let only_compares = insts[k].defs().iter().all(|d| {
                readers
                    .get(&d.0)
                    .is_some_and(|v| v.iter().all(|&j| j > k && is_predicate_only(insts[j])))
            });
            let frees = reads_of[k].iter().any(|r| last_read.get(r) == Some(&k));
            if at != k
                && at < n
                && only_compares
                && !frees
                && is_predicate_only(insts[at])
                && place[at].0 != at
            {
                place[k].0 = place[at].0;
            }
        }
    }
    if chains {
        // Each sunk instruction goes right before its first reader wherever
        // that reader itself goes: a depth-first walk from the instructions
        // that stay, each preceded by those sunk to it (in their order).
        let mut sunk_to: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (k, &(at, orig)) in place.iter().enumerate() {
            if at != orig {
                sunk_to[at].push(k);
            }
        }
        let mut out = Vec::with_capacity(n);
        // (index, how many of its sunk instructions are emitted)
        let mut stack: Vec<(usize, usize)> = Vec::new();
        for root in (0..n).filter(|&k| place[k].0 == k) {
            stack.push((root, 0));
            while let Some(top) = stack.last_mut() {
                work(1);
                let (k, done) = *top;
                if let Some(&child) = sunk_to[k].get(done) {
                    top.1 += 1;
                    stack.push((child, 0));
                } else {
                    stack.pop();
                    out.push(insts[k]);
                }
            }
        }
        return out;
    }
    // Stable: by target slot, sunk instructions before the one they precede
    // (they come from earlier indices).
    let mut order: Vec<usize> = (0..n).collect();
    work(n * (1 + n.max(1).ilog2() as usize));
    order.sort_by_key(|&k| {
        let (at, orig) = place[k];
        (at, if at == orig { 1 } else { 0 }, orig)
    });
    order.into_iter().map(|k| insts[k]).collect()
}

/// An instruction no load or computation is moved across by the estimate's
/// reorderings: memory effects, barriers, async copies and nested regions.
pub(super) fn ordering_point(i: &crate::ir::target::Inst) -> bool {
    use crate::ir::target::Inst;
    i.is_sync_or_async()
        || matches!(
            i,
            Inst::St { .. }
                | Inst::AtomAdd { .. }
                | Inst::For { .. }
                | Inst::While { .. }
                | Inst::If { .. }
        )
}

/// Loads issued early, up to `window` loaded words a stretch (and of the
/// `ldmatrix` fragments of a stretch with an MMA, those of its first
/// `ldmatrix_steps` k steps, and of its fragments loaded from shared memory
/// by plain loads, those of its first `shared_steps`): within each
/// stretch of a block between ordering points
/// (stores, atomics, barriers, async copies, nested regions), every load and
/// the pure instructions it depends on move to the start of the stretch, in
/// their original order, as ptxas's scheduler batches loads to cover their
/// latency. An instruction that cannot pass an earlier one (it reads or writes
/// a register that one writes, or writes one it reads) stays, and so does
/// everything depending on it.
pub(super) fn hoist_loads(
    insts: &[crate::ir::target::Inst],
    window: u32,
    ldmatrix_steps: u32,
    shared_steps: u32,
) -> Vec<&crate::ir::target::Inst> {
    use crate::ir::target::{Inst, Space};
    let barrier = ordering_point;
    let pure = |i: &Inst| i.is_pure();
    let set =
        |v: Vec<crate::ir::target::Reg>| v.into_iter().map(|r| r.0).collect::<FxHashSet<u32>>();
    let defs: Vec<FxHashSet<u32>> = insts.iter().map(|i| set(i.defs())).collect();
    let uses: Vec<FxHashSet<u32>> = insts.iter().map(|i| set(i.uses())).collect();
    let mut out = Vec::with_capacity(insts.len());
    let mut start = 0;
    while start < insts.len() {
        let end = (start..insts.len())
            .find(|&j| barrier(&insts[j]))
            .unwrap_or(insts.len());
        work(1 + end - start);
        // Members: loads and (backwards) the pure instructions they read.
        let mut member = vec![false; end - start];
        let mut needed: FxHashSet<u32> = FxHashSet::default();
        // Shared-memory loads move too where they feed `mma.m8n8k4` (sm_70):
        // ptxas keeps the operand fragments of the whole k-step resident.
        let m8n8k4 = insts[start..end]
            .iter()
            .any(|i| matches!(i, Inst::Mma { k: 4, .. }));
        // The loads that move: the first `window` words of them (ptxas:
        // [`LOAD_WINDOW_WORDS`]; all of them where the stretch feeds an mma:
        // its fragments).
        let any_mma = insts[start..end]
            .iter()
            .any(|i| matches!(i, Inst::Mma { .. }));
        let mut in_window = vec![false; end - start];
        let mut words = 0u32;
        let mut shared_words = 0u32;
        // The k step of each fragment: the depth, in the stretch's chain of
        // MMAs accumulating into one another, of the first MMA reading it.
        let mut step: FxHashMap<u32, u32> = FxHashMap::default();
        if any_mma {
            let mut depth: FxHashMap<u32, u32> = FxHashMap::default();
            for i in &insts[start..end] {
                if let Inst::Mma { d, a, b, c, .. } = i {
                    let k = c
                        .iter()
                        .filter_map(|r| depth.get(&r.0))
                        .max()
                        .map_or(0, |k| k + 1);
                    for r in d {
                        depth.insert(r.0, k);
                    }
                    for r in a.iter().chain(b) {
                        step.entry(r.0).or_insert(k);
                    }
                }
            }
        }
        for j in start..end {
            work(1);
            match &insts[j] {
                Inst::Ld {
                    space, mem, dst, ..
                } if *space == Space::Global || m8n8k4 => {
                    words += dst.len() as u32 * mem.bytes().div_ceil(4);
                    in_window[j - start] = any_mma || words <= window;
                }
                // An MMA's operand fragments loaded from shared memory by
                // plain loads (AMD's LDS reads), those of its first
                // `shared_steps` k steps.
                Inst::Ld { dst, .. } if any_mma && dst.iter().any(|r| step.contains_key(&r.0)) => {
                    in_window[j - start] = dst
                        .iter()
                        .any(|r| step.get(&r.0).is_some_and(|&k| k < shared_steps));
                }
                // Shared loads of a stretch without an MMA (the cross-warp
                // step of a reduction), in a window of their own.
                Inst::Ld { mem, dst, .. } if !any_mma => {
                    shared_words += dst.len() as u32 * mem.bytes().div_ceil(4);
                    in_window[j - start] = shared_words <= SHARED_LOAD_WINDOW_WORDS;
                }
                // The ldmatrix fragments of the stretch's mma: resident
                // before the first one, those of its first `ldmatrix_steps`
                // k steps.
                Inst::LdMatrix { dst, .. } => {
                    in_window[j - start] = any_mma
                        && dst
                            .iter()
                            .any(|r| step.get(&r.0).is_some_and(|&k| k < ldmatrix_steps));
                }
                _ => {}
            }
        }
        for j in (start..end).rev() {
            crate::cancel::checkpoint();
            work(1 + uses[j].len());
            let is_load = in_window[j - start];
            if is_load || (pure(&insts[j]) && defs[j].iter().any(|r| needed.contains(r))) {
                member[j - start] = true;
                needed.extend(uses[j].iter().copied());
            }
        }
        // Drop members that cannot pass an earlier non-member. Only earlier
        // instructions can block one, so a single forward pass, adding each
        // dropped member to the non-members, reaches the fixpoint.
        let mut defined_by_stay: FxHashSet<u32> = FxHashSet::default();
        let mut read_by_stay: FxHashSet<u32> = FxHashSet::default();
        for m in start..end {
            work(1 + defs[m].len() + uses[m].len());
            if member[m - start] {
                let blocked = defs[m]
                    .iter()
                    .any(|r| read_by_stay.contains(r) || defined_by_stay.contains(r))
                    || uses[m].iter().any(|r| defined_by_stay.contains(r));
                if !blocked {
                    continue;
                }
                member[m - start] = false;
            }
            defined_by_stay.extend(defs[m].iter().copied());
            read_by_stay.extend(uses[m].iter().copied());
        }
        out.extend(
            (start..end)
                .filter(|&j| member[j - start])
                .map(|j| &insts[j]),
        );
        out.extend(
            (start..end)
                .filter(|&j| !member[j - start])
                .map(|j| &insts[j]),
        );
        if end < insts.len() {
            out.push(&insts[end]);
        }
        start = end + 1;
    }
    out
}

/// Latency in cycles that [`ilp_order`] gives an instruction's results:
/// loads from memory long, tensor-core and shuffle results medium, the rest
/// one ALU pipeline's depth.
pub(super) fn latency(inst: &crate::ir::target::Inst) -> u64 {
    use crate::ir::target::{Inst, Space};
    match inst {
        Inst::Ld {
            space: Space::Global,
            ..
        } => 400,
        Inst::Ld { .. } | Inst::LdMatrix { .. } => 30,
        Inst::Mma { .. } | Inst::ShflXor { .. } => 20,
        Inst::Param { .. } => 20,
        _ => 5,
    }
}

/// The order ptxas's scheduler is modelled to run a block in where
/// registers are plentiful: within each stretch between ordering points
/// (stores, atomics, barriers, async copies, traps, nested regions), a list
/// scheduler over the stretch's dependences issues one instruction a cycle,
/// the ready one with the longest latency-weighted path to the stretch's
/// end first. Loads and the arithmetic their addresses need so go first
/// (latency hiding), and independent per-element chains interleave (a
/// chain's next step waits for its operand while the others issue), as in
/// ptxas's SASS at low pressure. O(n log n) in the stretch's length.
pub(super) fn ilp_order(insts: &[crate::ir::target::Inst]) -> Vec<&crate::ir::target::Inst> {
    use crate::ir::target::Inst;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    // A trap also ends a stretch here: nothing is issued ahead of it.
    let barrier = |i: &Inst| ordering_point(i) || matches!(i, Inst::Trap { .. });
    let mut out = Vec::with_capacity(insts.len());
    let mut start = 0;
    while start < insts.len() {
        let end = (start..insts.len())
            .find(|&j| barrier(&insts[j]))
            .unwrap_or(insts.len());
        let n = end - start;
        // Dependences: a read after the last write, a write after the last
        // write and after the reads since then.
        let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut preds = vec![0usize; n];
        let mut last_write: FxHashMap<u32, usize> = FxHashMap::default();
        let mut reads_since: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
        for j in 0..n {
            crate::cancel::checkpoint();
            let inst = &insts[start + j];
            let uses = inst.uses();
            let defs = inst.defs();
            work(1 + uses.len() + defs.len());
            let mut from: Vec<usize> = Vec::new();
            for r in &uses {
                if let Some(&w) = last_write.get(&r.0) {
                    from.push(w);
                }
            }
            for r in &defs {
                if let Some(&w) = last_write.get(&r.0) {
                    from.push(w);
                }
                if let Some(rs) = reads_since.remove(&r.0) {
                    work(rs.len());
                    from.extend(rs);
                }
            }
            from.sort_unstable();
            from.dedup();
            for f in from {
                if f != j {
                    succs[f].push(j);
                    preds[j] += 1;
                }
            }
            for r in &uses {
                reads_since.entry(r.0).or_default().push(j);
            }
            for r in &defs {
                last_write.insert(r.0, j);
            }
        }
        // Priority: the longest latency-weighted path to the stretch's end.
        let lat: Vec<u64> = insts[start..end].iter().map(latency).collect();
        let mut height = vec![0u64; n];
        for j in (0..n).rev() {
            work(1 + succs[j].len());
            height[j] = lat[j] + succs[j].iter().map(|&s| height[s]).max().unwrap_or(0);
        }
        // Cycle by cycle: the ready instruction of greatest height (then the
        // earliest) issues; its readers are ready `lat` cycles later.
        let mut ready: BinaryHeap<(u64, Reverse<usize>)> = BinaryHeap::new();
        let mut pending: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
        let mut at = vec![0u64; n];
        for (j, &p) in preds.iter().enumerate() {
            if p == 0 {
                ready.push((height[j], Reverse(j)));
            }
        }
        let mut cycle = 0u64;
        let mut issued = 0;
        while issued < n {
            crate::cancel::checkpoint();
            work(1 + n.max(1).ilog2() as usize);
            while let Some(&Reverse((t, j))) = pending.peek() {
                if t > cycle {
                    break;
                }
                pending.pop();
                ready.push((height[j], Reverse(j)));
            }
            let Some((_, Reverse(j))) = ready.pop() else {
                // Nothing ready: wait for the next result.
                if let Some(&Reverse((t, _))) = pending.peek() {
                    cycle = t;
                }
                continue;
            };
            out.push(&insts[start + j]);
            issued += 1;
            for &s in &succs[j] {
                at[s] = at[s].max(cycle + lat[j]);
                preds[s] -= 1;
                if preds[s] == 0 {
                    pending.push(Reverse((at[s], s)));
                }
            }
            cycle += 1;
        }
        if end < insts.len() {
            out.push(&insts[end]);
        }
        start = end + 1;
    }
    out
}
