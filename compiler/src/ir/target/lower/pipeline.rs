//! The software pipeline of a `for` loop (sm_80+, `num_stages` >= 2): the
//! loads at the top of its body that feed only tensor-core dots and are
//! indexed by the induction variable get `num_stages` swizzled buffers; the
//! copies for the first `num_stages - 1` iterations are issued before the
//! loop, and each iteration issues those `num_stages - 1` iterations ahead,
//! then waits for its own stage. Deferred loads from outside the loop that
//! its dots read (attention's q) are copied once, before it.
//!
//! Invariant: pipeline buffers live through the whole loop, so `lower` places
//! them after every transient region of the arena (`Lower::persistent`).

use super::{Lower, R};
use crate::ir::target::{BinOp, CmpOp, Inst, Operand, Reg, RegTy, SmemBuffer, Swizzle};
use crate::ir::tile::{self, Access, Constant, OpKind, Value};

impl<'a> Lower<'a> {
    /// Deferred loads from outside a loop used as dot operands in its body
    /// (attention's q): copied once, before the loop, into a buffer that lives
    /// through it, instead of at every iteration's dot. Returns them.
    pub(super) fn hoist_invariant_operands(&mut self, body: &tile::Region) -> Vec<Value> {
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
            let sw = Swizzle::for_rows(cols * 2);
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
    pub(super) fn pipeline_prologue(
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
            let sw = Swizzle::for_rows(cols * 2);
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
    pub(super) fn pipeline_prefetch(
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
}

/// The software pipeline of one loop: its loads (value, tensor, access,
/// other, shape, pipe) and the stage register.
pub(super) struct LoopPipe {
    #[allow(clippy::type_complexity)]
    pub(super) loads: Vec<(Value, usize, Vec<Access>, Constant, Vec<u32>, usize)>,
    pub(super) stage: Reg,
    pub(super) stages: u32,
}

/// A software pipeline of one load in a loop: `stages` copies of its tile in
/// `buffer`, the loop's current stage in register `stage`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pipe {
    pub(super) buffer: usize,
    pub(super) sw: Swizzle,
    pub(super) stage_bytes: u32,
    pub(super) stage: Reg,
}
