//! A TMA pipeline that runs across the iterations of the loop around it
//! (sm_90a): a persistent GEMM's `for t in range(...)` over output tiles,
//! whose body computes the tile's offsets, runs the k loop and stores the
//! tile.
//!
//! Without this, every tile initialises its k loop's barriers, waits for its
//! first stages to land and ends the barriers again, and nothing is copied
//! while the tile's epilogue runs: at one block an SM the tensor cores idle
//! through each tile's fill and store (an H100 GEMM at M = N = 8192, K =
//! 1024 spent a sixth of its time so). Here the k loop's pipeline belongs to
//! the outer loop: its barriers are initialised once, before it, and its
//! stage and phase registers count the k iterations of every tile in turn
//! (iteration `u * n_k + r` is tile `u`'s `r`-th, `n_k` iterations a tile),
//! so that the copies `ahead` iterations on, which run past the end of a
//! tile's k loop, are the next tile's first ones: they land while the
//! epilogue stores. The prologue before the outer loop copies the first
//! `ahead` iterations of the sequence (of whichever tiles they belong to).
//!
//! A copy for another tile needs that tile's offsets: the scalar ops of the
//! outer body that the loads' indices depend on (the `slice`: `m0 = (t %
//! tiles_m) * BM` and the like) are lowered again with the outer variable
//! bound to the other tile's, where the copy is issued (by thread 0 only).
//!
//! When: the inner loop is a TMA pipeline without loop-invariant operands,
//! directly in the body of a `for` with a positive constant step, its bounds
//! defined before that loop and its step a positive constant; the loads'
//! indices depend on the outer body only through scalar ops at its top
//! level, before the inner loop; and it is the only such loop there.

use std::collections::HashSet;

use super::{Lower, R, TV};
use crate::check::DType;
use crate::ir::target::{BinOp, CmpOp, Inst, Operand, Reg, RegTy};
use crate::ir::tile::{self, Access, OpKind, Type, Value};

/// A `for` loop whose body is being lowered, as a loop a TMA pipeline in it
/// may run across (`Lower::outer`).
pub(super) struct OuterLoop {
    pub(super) iv: Value,
    ity: RegTy,
    idt: DType,
    /// `lo`, `hi`, `step` (a positive constant).
    bounds: [Operand; 3],
    /// `blocks.len()` while its body is lowered at its top level.
    depth: usize,
    /// Values its body defines, at any depth (region arguments included).
    defined: HashSet<Value>,
    /// Its body's top-level ops with scalar results (slice candidates).
    scalar_ops: Vec<tile::Op>,
    /// The pipeline that runs across it, once an inner loop has set it up:
    /// what ends after the outer loop.
    pub(super) crossing: Option<Crossing>,
}

/// The barriers of the pipeline that ran across an outer loop, which it
/// ends after it.
pub(super) struct Crossing {
    pub(super) full: usize,
    pub(super) empty: usize,
    pub(super) stages: u32,
}

/// The part of a TMA pipeline that runs across an outer loop's iterations.
#[derive(Clone)]
pub(super) struct Across {
    outer_iv: Value,
    ity: RegTy,
    idt: DType,
    outer: [Operand; 3],
    /// The inner loop's `lo` and (positive constant) `step`.
    inner_lo: Operand,
    inner_step: i64,
    /// k iterations a tile: `cdiv(hi - lo, step)`, 0 when empty.
    n_k: Reg,
    /// 0 until the first k iteration (of any tile) has ended.
    pub(super) started: Reg,
    /// The outer body's scalar ops the loads' indices depend on, in order.
    slice: Vec<tile::Op>,
}

impl OuterLoop {
    pub(super) fn depth(&self) -> usize {
        self.depth
    }

    /// `body` of a `for` loop as a loop a pipeline may run across, or `None`
    /// where none may: no TMA, a step that is not a positive constant, or no
    /// `for` at its top level.
    pub(super) fn new(
        l: &Lower<'_>,
        body: &tile::Region,
        ity: RegTy,
        idt: DType,
        bounds: [Operand; 3],
    ) -> Option<OuterLoop> {
        // An i32 variable: the other tile's is computed with the k loop's
        // i32 arithmetic.
        if !l.feat.tma || ity != RegTy::I32 || !matches!(bounds[2], Operand::Int(s) if s > 0) {
            return None;
        }
        if !body
            .ops
            .iter()
            .any(|o| matches!(o.kind, OpKind::For { .. }))
        {
            return None;
        }
        let mut defined = HashSet::new();
        collect_defined(body, &mut defined);
        let scalar_ops = body
            .ops
            .iter()
            .take_while(|o| !matches!(o.kind, OpKind::For { .. }))
            .filter(|o| {
                o.results.len() == 1
                    && matches!(l.tk.ty(o.results[0]), Type::Scalar(_))
                    && matches!(
                        o.kind,
                        OpKind::Const(_)
                            | OpKind::Unary { .. }
                            | OpKind::Binary { .. }
                            | OpKind::Select { .. }
                            | OpKind::Cast { .. }
                    )
            })
            .cloned()
            .collect();
        Some(OuterLoop {
            iv: body.args[0],
            ity,
            idt,
            bounds,
            depth: l.blocks.len() + 1,
            defined,
            scalar_ops,
            crossing: None,
        })
    }
}

fn collect_defined(r: &tile::Region, out: &mut HashSet<Value>) {
    out.extend(r.args.iter().copied());
    for o in &r.ops {
        out.extend(o.results.iter().copied());
        for nested in o.kind.regions() {
            collect_defined(nested, out);
        }
    }
}

impl Across {
    pub(super) fn outer_iv(&self) -> Value {
        self.outer_iv
    }
}

impl<'a> Lower<'a> {
    /// The outer body's ops that the indices of `accesses` depend on (the
    /// inner loop variable `inner_iv` aside), if the pipeline of the inner
    /// loop with `bounds` (lo, hi, step values) may run across `outer`: see
    /// the module docs.
    pub(super) fn across_slice(
        &self,
        outer: &OuterLoop,
        inner_iv: Value,
        bounds: [Value; 3],
        step: Operand,
        accesses: &[&[Access]],
    ) -> Option<Vec<tile::Op>> {
        if outer.crossing.is_some()
            || self.blocks.len() != outer.depth
            || !matches!(step, Operand::Int(s) if s > 0)
            || bounds.iter().any(|b| outer.defined.contains(b))
        {
            return None;
        }
        let mut work: Vec<Value> = accesses
            .iter()
            .flat_map(|a| a.iter())
            .filter_map(|a| match a {
                Access::Range { start, .. } => Some(*start),
                Access::Point(x) => Some(*x),
                Access::Gather(_) => None,
            })
            .collect();
        let mut needed = HashSet::new();
        while let Some(v) = work.pop() {
            if v == inner_iv || v == outer.iv || !outer.defined.contains(&v) {
                continue;
            }
            if !needed.insert(v) {
                continue;
            }
            let op = outer.scalar_ops.iter().find(|o| o.results[0] == v)?;
            work.extend(op.kind.operands());
        }
        Some(
            outer
                .scalar_ops
                .iter()
                .filter(|o| needed.contains(&o.results[0]))
                .cloned()
                .collect(),
        )
    }

    /// Emits what `f` emits just before the outer loop (in the block around
    /// it), as though its body were not being lowered yet.
    pub(super) fn before_outer<T>(&mut self, depth: usize, f: impl FnOnce(&mut Self) -> T) -> T {
        let inner = self.blocks.split_off(depth - 1);
        let out = f(self);
        self.blocks.extend(inner);
        out
    }

    /// The registers of a pipeline across `outer`, set before it (in the
    /// block `before_outer` emits into): the k iterations a tile and the
    /// `started` flag.
    pub(super) fn across_setup(
        &mut self,
        outer: &OuterLoop,
        slice: Vec<tile::Op>,
        [lo, hi, step]: [Operand; 3],
    ) -> Across {
        let inner_step = match step {
            Operand::Int(s) => s,
            _ => unreachable!("checked by across_slice"),
        };
        // cdiv(max(hi - lo, 0), step)
        let span = self.bin(BinOp::Sub, RegTy::I32, hi, lo);
        let span = self.bin(BinOp::Max, RegTy::I32, span, Operand::Int(0));
        let span = self.bin(BinOp::Add, RegTy::I32, span, Operand::Int(inner_step - 1));
        let n_k = self.bin(BinOp::Div, RegTy::I32, span, Operand::Int(inner_step));
        let n_k = self.materialize(RegTy::I32, n_k).reg().expect("reg");
        let started = self.new_reg(RegTy::U32);
        self.emit(Inst::Mov {
            dst: started,
            src: Operand::Int(0),
        });
        Across {
            outer_iv: outer.iv,
            ity: outer.ity,
            idt: outer.idt,
            outer: outer.bounds,
            inner_lo: lo,
            inner_step,
            n_k,
            started,
            slice,
        }
    }

    /// Emits, for thread 0, what `issue` emits for the `j`-th k iteration
    /// counted from the start of the tile whose outer variable is `t` (`j`
    /// may run past that tile: then it is iteration `j % n_k` of the tile
    /// `j / n_k` on), if that tile is one the outer loop runs. `issue` gets
    /// the inner loop variable of that iteration, with the slice's values
    /// bound to that tile's. `j_small`: `j < n_k` is known (no division).
    pub(super) fn issue_across(
        &mut self,
        a: &Across,
        t: Operand,
        j: Operand,
        j_small: bool,
        issue: impl FnOnce(&mut Self, Operand) -> R<()>,
    ) -> R<()> {
        let (tile, r) = if j_small {
            (t, j)
        } else {
            let q = self.bin(BinOp::Div, RegTy::I32, j, Operand::Reg(a.n_k));
            let qn = self.bin(BinOp::Mul, RegTy::I32, q, Operand::Reg(a.n_k));
            let r = self.bin(BinOp::Sub, RegTy::I32, j, qn);
            let dt = self.bin(BinOp::Mul, a.ity, q, a.outer[2]);
            (self.bin(BinOp::Add, a.ity, t, dt), r)
        };
        let tile = self.materialize(a.ity, tile);
        let runs = self.cmp(CmpOp::Lt, a.ity, tile, a.outer[1]);
        let runs = runs.reg().expect("reg");
        self.when(runs, |l| {
            let off = l.bin(BinOp::Mul, RegTy::I32, r, Operand::Int(a.inner_step));
            let iv = l.bin(BinOp::Add, RegTy::I32, a.inner_lo, off);
            let iv = l.materialize(RegTy::I32, iv);
            l.with_tile(a, tile, |l| issue(l, iv))
        })
    }

    /// Runs `f` with the outer variable bound to `tile` and the slice lowered
    /// again under that binding; the values are restored after.
    fn with_tile(
        &mut self,
        a: &Across,
        tile: Operand,
        f: impl FnOnce(&mut Self) -> R<()>,
    ) -> R<()> {
        let saved: Vec<(Value, Option<TV>)> = std::iter::once(a.outer_iv)
            .chain(a.slice.iter().map(|o| o.results[0]))
            .map(|v| (v, self.vals.get(&v).cloned()))
            .collect();
        let tv = self.scalar_tv(tile, a.ity, a.idt);
        self.vals.insert(a.outer_iv, tv);
        let mut out = Ok(());
        for op in &a.slice {
            out = self.op(op);
            if out.is_err() {
                break;
            }
        }
        if out.is_ok() {
            out = f(self);
        }
        for (v, tv) in saved {
            match tv {
                Some(tv) => self.vals.insert(v, tv),
                None => self.vals.remove(&v),
            };
        }
        out
    }

    /// The k iterations of the current tile from the inner loop variable
    /// `iv` on to the one `ahead` iterations on: `(iv - lo) / step + ahead`.
    pub(super) fn across_ahead(&mut self, a: &Across, iv: Operand, ahead: u32) -> Operand {
        let d = self.bin(BinOp::Sub, RegTy::I32, iv, a.inner_lo);
        let k = self.bin(BinOp::Div, RegTy::I32, d, Operand::Int(a.inner_step));
        self.bin(BinOp::Add, RegTy::I32, k, Operand::Int(i64::from(ahead)))
    }

    /// The first `ahead` k iterations of the sequence, before the outer loop
    /// (thread 0, where a tile has any): `issue(l, iv, s)` copies iteration
    /// `s` with inner variable `iv` into stage `s`.
    pub(super) fn across_prologue(
        &mut self,
        a: &Across,
        first: Reg,
        ahead: u32,
        mut issue: impl FnMut(&mut Self, Operand, u32) -> R<()>,
    ) -> R<()> {
        let any = self.cmp(CmpOp::Gt, RegTy::I32, Operand::Reg(a.n_k), Operand::Int(0));
        let any = self.materialize(RegTy::Pred, any);
        let cond = self.bin(BinOp::And, RegTy::Pred, Operand::Reg(first), any);
        let cond = self.materialize(RegTy::Pred, cond).reg().expect("reg");
        let lo_t = a.outer[0];
        self.when(cond, |l| {
            for s in 0..ahead {
                l.issue_across(a, lo_t, Operand::Int(i64::from(s)), s == 0, |l, iv| {
                    issue(l, iv, s)
                })?;
            }
            Ok(())
        })
    }
}
