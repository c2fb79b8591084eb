//! Global memory: loads and stores (and atomic adds) of tiles through an
//! access plan — per layout slot an address register, a byte offset and an
//! in-bounds predicate — with vector accesses where alignment and contiguity
//! are proven.
//!
//! Alignment is proven from static dims, the kernel's divisibility
//! assumptions (checked in the prologue, see `params`) and the known divisors
//! of integer scalars; a masked access is never vectorised. A gather computes
//! each slot's address where it is accessed, so they are not all live at once.
//! Loads that feed only tensor-core dots are not loaded here but handed to
//! `async_copy` (deferred) or `pipeline` (pipelined).

use std::collections::HashMap;
use std::rc::Rc;

use super::packed::packed_words;
use super::pipeline::Decision;
use super::{const_operand, round_const, Lower, R, TV};
use crate::check::DType;
use crate::ir::target::layout::Layout;
use crate::ir::target::{BinOp, CmpOp, Inst, MemTy, Operand, Reg, RegTy, Space};
use crate::ir::tile::{Access, Constant, Value};

impl<'a> Lower<'a> {
    /// What a loop's extent proves of a slice `[start, start + len)` along a
    /// tensor axis of size `dim`, where `start` is the variable of a loop
    /// with a `LoopExtent` (`len` at most its step, its bound at most `dim`):
    /// `Some(None)`, in bounds in every iteration; in a pipeline's copy for
    /// an iteration ahead (`start` overridden), `Some(Some(p))`, in bounds
    /// where that iteration runs (`p`, one uniform predicate for the whole
    /// slice instead of one a row). `None` where nothing is proven.
    fn loop_bound(&mut self, start: Value, len: u32, dim: Operand) -> Option<Option<Operand>> {
        let e = *self.extents.get(&start)?;
        if i64::from(len) > e.step || !self.at_most(e.hi, dim) {
            return None;
        }
        match self.pipeline.overrides.get(&start).copied() {
            None => Some(None),
            Some(ahead) => {
                let hi = self.scalar(e.hi);
                Some(Some(self.cmp(CmpOp::Lt, RegTy::I32, ahead, hi)))
            }
        }
    }

    /// Per slot: the address register, byte offset and in-bounds predicate of an
    /// access of `layout`'s elements; plus the vector width that is proven safe.
    /// `in_bounds`: the tile is known to lie wholly in bounds (the fast path of
    /// `in_bounds_check`), so no slot gets a predicate and a vector needs no
    /// divisor of the dim (no vector can straddle the end). `vector`: whether
    /// the access may use vectors (not under a mask, not atomic); only the
    /// first slot of each vector then gets a bounds predicate.
    pub(super) fn plan_access(
        &mut self,
        tensor: usize,
        access: &[Access],
        layout: &Layout,
        in_bounds: bool,
        vector: bool,
    ) -> R<AccessPlan> {
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
        // Per range axis, what a loop's extent proves (`Lower::loop_bound`).
        let mut proofs = Vec::new();
        let mut d = 0usize;
        for (a, acc) in access.iter().enumerate() {
            match acc {
                Access::Point(v) => {
                    let idx = self.scalar(*v);
                    let safe = in_bounds
                        || matches!((idx, static_dims[a]), (Operand::Int(i), Some(n)) if i >= 0 && (i as u64) < n);
                    if !safe {
                        point_preds.push(self.cmp(CmpOp::Lt, RegTy::U32, idx, dims[a]));
                    }
                    let t = self.bin(BinOp::Mul, RegTy::I32, idx, strides[a]);
                    thread_off = self.bin(BinOp::Add, RegTy::I32, thread_off, t);
                }
                Access::Range { start, len } => {
                    proofs.push(self.loop_bound(*start, *len, dims[a]));
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
        // Vector width: contiguous runs along the layout's vector axis when it
        // is the tensor's innermost axis (every later axis of size 1), with
        // alignment and uniform bounds proven.
        let mut vec = 1u32;
        let vd = layout.vector_axis();
        let vector_axis = vd.filter(|_| vector).and_then(|vd| axes.get(vd));
        if let Some(&(a, _, start, _, _)) = vector_axis {
            let vd = vd.expect("a vector axis");
            if static_dims[a + 1..].iter().all(|d| *d == Some(1)) {
                // bf16 vectors move as packed 32-bit words (see `packed`), so
                // eight of them make one 16-byte access; other types of
                // under 4 bytes stop at four elements (the PTX vector limit).
                let mut v = (16 / mem.bytes()).min(if mem == MemTy::BF16 { 8 } else { 4 });
                let terms_ok = |v: u32| layout.terms[vd].iter().all(|t| t.mul % v == 0);
                let start_div = self.divisor_or_constant(start);
                let strides_ok =
                    |v: u32| stride_div[..a].iter().all(|s| s.is_multiple_of(v as u64));
                // Every vector wholly in or out of bounds.
                let dim_ok = |v: u32| in_bounds || dim_div[a].is_multiple_of(v as u64);
                while v > 1 {
                    if terms_ok(v)
                        && start_div.is_multiple_of(v as u64)
                        && strides_ok(v)
                        && dim_ok(v)
                    {
                        break;
                    }
                    v /= 2;
                }
                vec = v;
            }
        }
        // Only the first slot of a vector reads its predicate.
        let mut leads = vec![true; layout.num_slots()];
        for g in Self::vector_groups(layout, vec) {
            for &j in &g[1..] {
                leads[j] = false;
            }
        }
        let base_addr = self.element_address(ptr, |l| l.materialize(RegTy::I32, thread_off), bytes);
        // Per (tile axis, offset): the bounds predicate (None when provably in bounds).
        let mut pred_cache: HashMap<(usize, u32), Option<Operand>> = HashMap::new();
        let mut addr_cache: HashMap<Vec<(usize, u32)>, Reg> = HashMap::new();
        let mut combined: HashMap<Vec<Option<Reg>>, Option<Reg>> = HashMap::new();
        let mut slots = Vec::new();
        for (i, slot) in layout.slots.iter().enumerate() {
            let mut preds = if leads[i] {
                point_preds.clone()
            } else {
                vec![]
            };
            let mut static_off = 0i64;
            let mut dyn_key = Vec::new();
            for (d, &(a, sb, _, max_base, s)) in axes.iter().enumerate() {
                let o = slot[d];
                let p = match pred_cache.get(&(d, o)) {
                    // The vector's first slot carries its predicate.
                    _ if !leads[i] => None,
                    Some(p) => *p,
                    None => {
                        let safe = in_bounds
                            || matches!(proofs[d], Some(None))
                            || matches!((s, static_dims[a]), (Operand::Int(st), Some(n))
                            if st >= 0 && (st as u64 + max_base + o as u64) < n);
                        let p = if safe {
                            None
                        } else if let Some(Some(uniform)) = proofs[d] {
                            Some(uniform)
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
                let r = self.element_address(base_addr, |_| e, bytes);
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
            off => (self.element_address(ptr, |_| off, bytes), 0),
        };
        let p = self.and_preds(&preds);
        let pred = self.pred_reg(p);
        Ok(SlotAccess { addr, offset, pred })
    }

    /// The 64-bit address `base + index * bytes` (`index` a 32-bit offset in
    /// elements, widened as it is multiplied). `index` is asked for after the
    /// wide register is taken, so an index computed here numbers its
    /// registers after it.
    fn element_address(
        &mut self,
        base: Reg,
        index: impl FnOnce(&mut Self) -> Operand,
        bytes: i64,
    ) -> Reg {
        let wide = self.new_reg(RegTy::I64);
        let index = index(self);
        self.emit(Inst::MulWide {
            dst: wide,
            a: index,
            b: Operand::Int(bytes),
        });
        let addr = self.new_reg(RegTy::U64);
        self.emit(Inst::Binary {
            op: BinOp::Add,
            dst: addr,
            a: Operand::Reg(base),
            b: Operand::Reg(wide),
        });
        addr
    }

    /// Groups of `vec` slots that are contiguous and aligned along the vector axis.
    pub(super) fn vector_groups(layout: &Layout, vec: u32) -> Vec<Vec<usize>> {
        let vd = layout.vector_axis();
        let mut used = vec![false; layout.num_slots()];
        let mut groups = Vec::new();
        for i in 0..layout.num_slots() {
            if used[i] {
                continue;
            }
            let s = &layout.slots[i];
            let mut group = vec![i];
            if let Some(vd) = vd.filter(|&vd| vec > 1 && s[vd].is_multiple_of(vec)) {
                let mut all = true;
                let mut members = vec![i];
                for k in 1..vec {
                    let mut t = s.clone();
                    t[vd] += k;
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

    pub(super) fn load(
        &mut self,
        res: Value,
        tensor: usize,
        access: &[Access],
        mask: Option<Value>,
        other: Constant,
    ) -> R<TV> {
        let ty = self.tk.ty(res).clone();
        let layout = self.blocked(ty.shape());
        if let Some(pi) = self.pipeline.pipelined_pending.get(&res).copied() {
            self.pipeline.pipelined.insert(res, (pi, false));
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
        if self.pipeline.defer_ok.contains(&res) {
            let deferred = match mask {
                None => self.defer_load(tensor, access, other, ty.shape())?,
                Some(_) => None,
            };
            let planned = self.planned_load(res, tensor, access, other);
            match deferred {
                Some(d) => {
                    self.pipeline
                        .plan
                        .decisions
                        .push(Decision::Deferred(planned));
                    self.pipeline.deferred.insert(res, (Rc::new(d), false));
                    return Ok(TV {
                        layout,
                        ops: vec![],
                        ty: RegTy::F32,
                        dtype: ty.dtype(),
                    });
                }
                None => {
                    let decision = Decision::InRegisters(planned);
                    self.pipeline.plan.decisions.push(decision);
                }
            }
        }
        let t = self.tensor(tensor)?;
        let dtype = t.dtype;
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
        let other_op = const_operand(other, dtype);
        let other_op = match other_op {
            Operand::Float(f) => Operand::Float(round_const(f, dtype)),
            o => o,
        };
        let ops = match mask {
            Some(m) => {
                let plan = self.plan_access(tensor, access, &layout, false, false)?;
                self.load_slots(tensor, &plan, &layout, Some(&m), other_op, dtype, cty)?
            }
            None => self.in_bounds_or_not(tensor, access, &layout, cty, |l, plan| {
                l.load_slots(tensor, plan, &layout, None, other_op, dtype, cty)
            })?,
        };
        Ok(TV {
            layout,
            ops,
            ty: cty,
            dtype,
        })
    }

    /// The loads of a plan's slots (vector groups, bf16 pairs packed in
    /// 32-bit words), all issued before the first of them is converted, so
    /// that a thread has all its bytes in flight at once; a gather issues
    /// them `LOAD_BATCH` at a time (each address computed where used). The
    /// values, one per slot, at `cty`.
    #[allow(clippy::too_many_arguments)]
    fn load_slots(
        &mut self,
        tensor: usize,
        plan: &AccessPlan,
        layout: &Layout,
        mask: Option<&TV>,
        other_op: Operand,
        dtype: DType,
        cty: RegTy,
    ) -> R<Vec<Operand>> {
        let mem = self.tensor(tensor)?.mem;
        let rty = raw_ty(mem);
        let direct = rty == cty;
        let mut ops = vec![Operand::Int(0); layout.num_slots()];
        let groups = Self::vector_groups(layout, plan.vec);
        let batch = if plan.gather.is_some() {
            LOAD_BATCH
        } else {
            groups.len().max(1)
        };
        for batch in groups.chunks(batch) {
            let firsts = batch
                .iter()
                .map(|g| self.slot(tensor, plan, g[0]))
                .collect::<R<Vec<_>>>()?;
            let mut loaded = Vec::with_capacity(batch.len());
            for (group, first) in batch.iter().zip(firsts) {
                let mut pred = first.pred;
                if let Some(m) = mask {
                    let mut ps: Vec<Operand> = pred.into_iter().map(Operand::Reg).collect();
                    ps.push(m.ops[group[0]]);
                    let p = self.and_preds(&ps);
                    pred = self.pred_reg(p);
                }
                let packed = packed_words(mem, group.len());
                let (ld_mem, n, ty) = match packed {
                    Some(words) => (MemTy::U32, words, RegTy::U32),
                    None => (mem, group.len(), rty),
                };
                let dsts: Vec<Reg> = (0..n).map(|_| self.new_reg(ty)).collect();
                if pred.is_some() {
                    for &d in &dsts {
                        let init = if direct { other_op } else { Operand::Int(0) };
                        self.emit(Inst::Mov { dst: d, src: init });
                    }
                }
                self.emit(Inst::Ld {
                    stream: self.stream_access,
                    space: Space::Global,
                    mem: ld_mem,
                    dst: dsts.clone(),
                    addr: first.addr,
                    offset: first.offset,
                    pred,
                });
                loaded.push((group, pred, packed.is_some(), dsts));
            }
            for (group, pred, packed, dsts) in loaded {
                for (k, &slot) in group.iter().enumerate() {
                    let v = if packed {
                        self.unpack_bf16(dsts[k / 2], k % 2 == 1)
                    } else if direct {
                        Operand::Reg(dsts[k])
                    } else {
                        let raw = Operand::Reg(dsts[k]);
                        match mem {
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
                        }
                    };
                    ops[slot] = if direct {
                        v
                    } else {
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
                }
            }
        }
        Ok(ops)
    }

    pub(super) fn store(
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
        if mask.is_some() || atomic {
            let plan = self.plan_access(tensor, access, &layout, false, false)?;
            let owner = self.owner_pred(&layout);
            return self.store_slots(tensor, &plan, &v, mask.as_ref(), owner, atomic);
        }
        let v = match self.staged_store(tensor, access, &v)? {
            super::staged_store::Staged::No => v,
            super::staged_store::Staged::Done => return Ok(()),
            super::staged_store::Staged::ReadBack(t) => t,
        };
        let layout = v.layout.clone();
        self.in_bounds_or_not(tensor, access, &layout, RegTy::Pred, |l, plan| {
            let owner = l.owner_pred(&layout);
            l.store_slots(tensor, plan, &v, None, owner, false)?;
            Ok(vec![])
        })?;
        Ok(())
    }

    /// Replicated threads hold the same elements: the predicate of the one
    /// of them that writes (`None` when no thread is replicated).
    fn owner_pred(&mut self, layout: &Layout) -> Option<Operand> {
        let rep = layout.replication_mask(self.tid_bits);
        (rep != 0).then(|| {
            let t = self.bin(
                BinOp::And,
                RegTy::U32,
                Operand::Reg(self.tid),
                Operand::Int(rep as i64),
            );
            self.cmp(CmpOp::Eq, RegTy::U32, t, Operand::Int(0))
        })
    }

    /// The stores (or atomic adds) of `v`'s slots by a plan: vector groups,
    /// bf16 pairs packed in 32-bit words.
    fn store_slots(
        &mut self,
        tensor: usize,
        plan: &AccessPlan,
        v: &TV,
        mask: Option<&TV>,
        owner: Option<Operand>,
        atomic: bool,
    ) -> R<()> {
        let t = self.tensor(tensor)?;
        let (mem, dtype) = (t.mem, t.dtype);
        for group in Self::vector_groups(&v.layout, plan.vec) {
            let first = self.slot(tensor, plan, group[0])?;
            let mut ps: Vec<Operand> = first.pred.into_iter().map(Operand::Reg).collect();
            ps.extend(owner);
            if let Some(m) = mask {
                ps.push(m.ops[group[0]]);
            }
            let p = self.and_preds(&ps);
            let pred = self.pred_reg(p);
            let (mem, srcs) = self.store_sources(mem, dtype, v, &group, !atomic);
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
                    stream: self.stream_access,
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

    /// The access type and source operands that store the slots `group` of
    /// `v` to memory of `mem`: bf16 runs packed in 32-bit words where
    /// `packed` allows (not for atomics), else one converted operand a slot.
    pub(super) fn store_sources(
        &mut self,
        mem: MemTy,
        dtype: DType,
        v: &TV,
        group: &[usize],
        packed: bool,
    ) -> (MemTy, Vec<Operand>) {
        if let Some(words) = packed_words(mem, group.len()).filter(|_| packed) {
            let srcs = (0..words)
                .map(|w| self.pack_bf16(v.ops[group[2 * w]], v.ops[group[2 * w + 1]]))
                .collect();
            return (MemTy::U32, srcs);
        }
        let mut srcs = Vec::new();
        for &slot in group {
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
        (mem, srcs)
    }
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

#[derive(Clone, Copy, Debug)]
pub(super) struct SlotAccess {
    pub(super) addr: Reg,
    pub(super) offset: i64,
    pub(super) pred: Option<Reg>,
}

/// How many accesses of a load have their addresses computed before the
/// first of them is issued (see `load`).
const LOAD_BATCH: usize = 4;

pub(super) struct AccessPlan {
    pub(super) slots: Vec<SlotAccess>,
    pub(super) vec: u32,
    /// For a gather: per slot, its index on each tensor axis (`slots` is empty).
    pub(super) gather: Option<Vec<Vec<Operand>>>,
}
