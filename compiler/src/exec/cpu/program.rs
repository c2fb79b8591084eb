//! One program of a launch, interpreted op by op on whole tiles.

use super::*;

pub(super) struct Program<'a> {
    pub(super) k: &'a Kernel,
    pub(super) params: &'a [Param],
    pub(super) pid: [i64; 3],
    pub(super) grid: [i64; 3],
    pub(super) vals: Vec<Option<T>>,
    /// Per value, the tensor memory of a load left to its dots; the value
    /// itself is then a tile of the right shape with no elements.
    pub(super) views: Vec<Option<View>>,
    pub(super) interrupt: &'a Interrupt,
    pub(super) live: &'a Liveness,
    pub(super) deferred: &'a DeferredLoads,
    pub(super) chained: &'a ChainedLoops,
    /// Inside a chained loop: its loads are packed a chain at a time, long
    /// after they run, so prefetching for the next load is of no use.
    pub(super) in_chained_loop: bool,
    /// The launch's packed dot operands.
    pub(super) cache: &'a PackCache,
}

/// The dots of a chained loop not multiplied yet (see [`chain`]).
pub(super) struct Pending {
    pub(super) parts: Vec<(View, View, usize)>,
    /// The summed `k` of `parts`.
    pub(super) k: usize,
    pub(super) mn: (usize, usize),
    pub(super) tf32: bool,
}

impl Pending {
    pub(super) fn new() -> Pending {
        Pending {
            parts: Vec::new(),
            k: 0,
            mn: (0, 0),
            tf32: false,
        }
    }

    pub(super) fn is_full(&self) -> bool {
        gemm::chain_is_full(self.mn.0, self.k, self.mn.1)
    }

    /// Multiplies the pending dots into `acc` (an f32 tile, copied first if
    /// it is shared).
    pub(super) fn multiply(&mut self, acc: &mut T, cache: &PackCache) {
        if self.parts.is_empty() {
            return;
        }
        let parts: Vec<Part> = self
            .parts
            .iter()
            .map(|&(a, b, k)| Part {
                a: Source::Mem(a),
                b: Source::Mem(b),
                k,
            })
            .collect();
        let Buf::F(c) = &mut Rc::make_mut(acc).buf else {
            unreachable!("a chained dot accumulates in f32")
        };
        gemm::sdot_chain(&parts, c, self.mn, self.tf32, Some(cache));
        self.parts.clear();
        self.k = 0;
    }
}

impl Program<'_> {
    /// Integer division by zero: as on the GPU the lane's value is garbage
    /// (0 here), and lowering divides in masked-off lanes too (loads fill them
    /// with `other=0`). So the lane is marked poisoned and the marks follow the
    /// data; E0704 is raised only when a poisoned lane is stored (in bounds and
    /// unmasked), decides control flow or addresses memory.
    pub(super) fn poison(&self, op: &Op, out: &mut [T]) -> Result<(), ExecError> {
        // A value taken by its op (a dying `dot` accumulator) carried its
        // marks over itself.
        let pz = |v: Value| {
            self.vals[v.0 as usize]
                .as_ref()
                .and_then(|t| t.poison.as_ref())
        };
        let any = |v: Value| pz(v).is_some_and(|p| p.iter().any(|b| *b));
        let lanes = |v: Value| -> Option<Vec<bool>> { pz(v).cloned() };
        let or = |a: Option<Vec<bool>>, b: Option<Vec<bool>>| match (a, b) {
            (Some(a), Some(b)) => Some(a.iter().zip(&b).map(|(x, y)| *x || *y).collect()),
            (a, None) => a,
            (None, b) => b,
        };
        let set = |out: &mut [T], p: Option<Vec<bool>>| {
            if let Some(p) = p.filter(|p| p.iter().any(|b| *b)) {
                if let Some(t) = out.first_mut() {
                    Rc::make_mut(t).poison = Some(p);
                }
            }
        };
        let all = |out: &mut [T]| {
            for t in out.iter_mut() {
                let n = t.buf.len();
                Rc::make_mut(t).poison = Some(vec![true; n]);
            }
        };
        match &op.kind {
            OpKind::Unary { x, .. } | OpKind::Cast { x, .. } | OpKind::ExpandDims { x, .. } => {
                set(out, lanes(*x))
            }
            OpKind::Binary { a, b, .. } => {
                let own = out[0].poison.clone();
                set(out, or(own, or(lanes(*a), lanes(*b))))
            }
            OpKind::Select { cond, a, b }
                if pz(*cond).is_some() || pz(*a).is_some() || pz(*b).is_some() =>
            {
                let c = self.v(*cond).buf.i();
                let n = c.len();
                let get = |v: Value, i: usize| pz(v).is_some_and(|p| p[i]);
                let p = (0..n)
                    .map(|i| get(*cond, i) || if c[i] != 0 { get(*a, i) } else { get(*b, i) })
                    .collect();
                set(out, Some(p));
            }
            OpKind::Extract {
                x,
                axis,
                start,
                len,
                ..
            } if any(*x) => {
                let src = self.v(*x);
                let idx = extract_index(&src.shape, *axis, *start as usize, *len as usize);
                let p = src.poison.as_ref().expect("poisoned");
                set(out, Some(idx.iter().map(|&i| p[i]).collect()))
            }
            OpKind::Broadcast { x, .. } | OpKind::Transpose { x } if any(*x) => {
                // The same rearrangement applied to the marks.
                let src = self.v(*x);
                let marks = Tile {
                    shape: src.shape.clone(),
                    buf: Buf::I(
                        src.poison
                            .as_ref()
                            .unwrap()
                            .iter()
                            .map(|b| *b as i64)
                            .collect(),
                    ),
                    poison: None,
                };
                let moved = match &op.kind {
                    OpKind::Broadcast { shape, .. } => {
                        broadcast(
                            &marks,
                            &shape.iter().map(|&s| s as usize).collect::<Vec<_>>(),
                        )
                        .buf
                    }
                    _ => {
                        let (r, c) = (src.shape[0], src.shape[1]);
                        let idx: Vec<usize> = (0..c)
                            .flat_map(|j| (0..r).map(move |i| i * c + j))
                            .collect();
                        marks.buf.gather(&idx)
                    }
                };
                set(out, Some(moved.i().iter().map(|v| *v != 0).collect()))
            }
            OpKind::Splat { x, .. } | OpKind::Reduce { x, .. } if any(*x) => all(out),
            OpKind::Dot { a, b, acc, .. } if any(*a) || any(*b) || acc.is_some_and(any) => all(out),
            OpKind::Load { access, mask, .. } => {
                if access_poisoned(access, &any) {
                    return Err(div_by_zero());
                }
                if let Some(m) = mask {
                    set(out, lanes(*m))
                }
            }
            OpKind::Store { access, mask, .. } | OpKind::AtomicAdd { access, mask, .. }
                if access_poisoned(access, &any) || mask.is_some_and(any) =>
            {
                return Err(div_by_zero());
            }
            OpKind::Arange { start: v, .. } | OpKind::If { cond: v, .. } if any(*v) => {
                return Err(div_by_zero())
            }
            OpKind::For { lo, hi, step, .. } if any(*lo) || any(*hi) || any(*step) => {
                return Err(div_by_zero())
            }
            _ => {}
        }
        Ok(())
    }

    pub(super) fn v(&self, v: Value) -> &T {
        self.vals[v.0 as usize]
            .as_ref()
            .expect("Tile IR: a value used before its definition")
    }

    pub(super) fn dtype(&self, v: Value) -> DType {
        self.k.ty(v).dtype()
    }

    /// Runs the ops of `r`; in the body of a chained loop, its dot joins
    /// `chain` instead of running.
    pub(super) fn region(
        &mut self,
        r: &Region,
        mut chain: Option<(ChainedDot, &mut Pending)>,
    ) -> Result<Vec<T>, ExecError> {
        for (i, op) in r.ops.iter().enumerate() {
            if let OpKind::Yield(vs) = &op.kind {
                let out = vs.iter().map(|v| self.v(*v).clone()).collect();
                self.drop_dead(op);
                return Ok(out);
            }
            let mut out = match &mut chain {
                Some((c, pending)) if c.dot == i => {
                    self.chained_dot(op, r.args[1 + c.carried], pending)?
                }
                _ => self.op(op)?,
            };
            self.poison(op, &mut out)?;
            for (res, t) in op.results.iter().zip(out) {
                self.vals[res.0 as usize] = Some(t);
            }
            self.drop_dead(op);
        }
        Ok(Vec::new())
    }

    /// Forgets the values `op` read for the last time (their buffers are
    /// freed, or reused by whoever holds the only other reference).
    pub(super) fn drop_dead(&mut self, op: &Op) {
        for v in self.live.dying(op) {
            self.vals[v.0 as usize] = None;
        }
    }

    pub(super) fn run_region(&mut self, r: &Region, args: Vec<T>) -> Result<Vec<T>, ExecError> {
        self.run_region_chained(r, args, None)
    }

    pub(super) fn run_region_chained(
        &mut self,
        r: &Region,
        args: Vec<T>,
        chain: Option<(ChainedDot, &mut Pending)>,
    ) -> Result<Vec<T>, ExecError> {
        for (a, x) in r.args.iter().zip(args) {
            self.vals[a.0 as usize] = Some(x);
        }
        self.region(r, chain)
    }

    /// The dot of a chained loop: when both operands were left as views and
    /// nothing is poisoned, it joins `pending` and its result is the
    /// accumulator as it stands (read by nothing but the yield, and
    /// multiplied into when the chain is); otherwise the chain is multiplied
    /// and the dot runs.
    pub(super) fn chained_dot(
        &mut self,
        op: &Op,
        acc: Value,
        pending: &mut Pending,
    ) -> Result<Vec<T>, ExecError> {
        let OpKind::Dot {
            a, b, precision, ..
        } = &op.kind
        else {
            unreachable!("a chained loop's dot")
        };
        let (x, y, c) = (self.v(*a), self.v(*b), self.v(acc));
        let clean = x.poison.is_none() && y.poison.is_none() && c.poison.is_none();
        if let (Some(va), Some(vb), true) =
            (self.views[a.0 as usize], self.views[b.0 as usize], clean)
        {
            let k = x.shape[1];
            pending.mn = (x.shape[0], y.shape[1]);
            pending.tf32 = *precision == Precision::Tf32;
            pending.parts.push((va, vb, k));
            pending.k += k;
            return Ok(vec![c.clone()]);
        }
        let slot = &mut self.vals[acc.0 as usize];
        let mut t = slot
            .take()
            .expect("Tile IR: a value used before its definition");
        pending.multiply(&mut t, self.cache);
        *slot = Some(t);
        self.op(op)
    }

    pub(super) fn mem(&self, i: usize) -> &Mem {
        match &self.params[i] {
            Param::Mem(m) => m,
            Param::Scalar(_) => unreachable!("Tile IR: a scalar parameter used as a tensor"),
        }
    }

    pub(super) fn op(&mut self, op: &Op) -> Result<Vec<T>, ExecError> {
        let k = self.k;
        let rd = |i: usize| k.ty(op.results[i]).dtype();
        let one = |t: Tile| Ok(vec![Rc::new(t)]);
        match &op.kind {
            OpKind::Const(c) => {
                let d = rd(0);
                let b = normalise(d, Buf::filled(repr(d), 1, *c));
                Ok(vec![scalar_tile(b)])
            }
            OpKind::ProgramId(a) => Ok(vec![scalar_tile(Buf::I(vec![self.pid[*a as usize]]))]),
            OpKind::NumPrograms(a) => Ok(vec![scalar_tile(Buf::I(vec![self.grid[*a as usize]]))]),
            OpKind::TensorDim { param, axis } => Ok(vec![scalar_tile(Buf::I(vec![
                self.mem(*param).dims[*axis],
            ]))]),
            OpKind::ScalarParam(i) => {
                let b = match &self.params[*i] {
                    Param::Scalar(Rc0::F(x)) => Buf::F(vec![*x]),
                    Param::Scalar(Rc0::D(x)) => Buf::D(vec![*x]),
                    Param::Scalar(Rc0::I(x)) => Buf::I(vec![*x]),
                    Param::Mem(_) => unreachable!("Tile IR: a tensor parameter used as a scalar"),
                };
                Ok(vec![scalar_tile(b)])
            }
            OpKind::Unary { op: u, x } => {
                let a = self.v(*x);
                let d = rd(0);
                let b = unary(*u, d, &a.buf);
                one(Tile {
                    shape: a.shape.clone(),
                    buf: b,
                    poison: None,
                })
            }
            OpKind::Binary { op: bop, a, b } => {
                let (x, y) = (self.v(*a), self.v(*b));

                let (buf, poison) = binary(*bop, rd(0), &x.buf, &y.buf);
                one(Tile {
                    shape: x.shape.clone(),
                    buf,
                    poison,
                })
            }
            OpKind::Select { cond, a, b } => {
                let (c, x, y) = (self.v(*cond), self.v(*a), self.v(*b));
                let c = c.buf.i();
                let buf = match (&x.buf, &y.buf) {
                    (Buf::F(p), Buf::F(q)) => Buf::F(select(c, p, q)),
                    (Buf::D(p), Buf::D(q)) => Buf::D(select(c, p, q)),
                    (Buf::I(p), Buf::I(q)) => Buf::I(select(c, p, q)),
                    _ => unreachable!("Tile IR: select operands of one type"),
                };
                one(Tile {
                    shape: x.shape.clone(),
                    buf,
                    poison: None,
                })
            }
            OpKind::Cast { x, to } => {
                let a = self.v(*x);
                let buf = cast(&a.buf, *to);
                one(Tile {
                    shape: a.shape.clone(),
                    buf,
                    poison: None,
                })
            }
            OpKind::Splat { x, shape } => {
                let a = self.v(*x);
                let n: usize = shape.iter().map(|&s| s as usize).product();
                let buf = match &a.buf {
                    Buf::F(v) => Buf::F(vec![v[0]; n]),
                    Buf::D(v) => Buf::D(vec![v[0]; n]),
                    Buf::I(v) => Buf::I(vec![v[0]; n]),
                };
                one(Tile {
                    shape: shape.iter().map(|&s| s as usize).collect(),
                    buf,
                    poison: None,
                })
            }
            OpKind::Broadcast { x, shape } => {
                let a = self.v(*x);
                let to: Vec<usize> = shape.iter().map(|&s| s as usize).collect();
                one(broadcast(a, &to))
            }
            OpKind::ExpandDims { x, axis } => {
                let a = self.v(*x);
                let mut shape = a.shape.clone();
                shape.insert(*axis, 1);
                one(Tile {
                    shape,
                    buf: a.buf.clone(),
                    poison: None,
                })
            }
            OpKind::Transpose { x } => {
                let a = self.v(*x);
                let (r, c) = (a.shape[0], a.shape[1]);
                let mut idx = Vec::with_capacity(r * c);
                for j in 0..c {
                    for i in 0..r {
                        idx.push(i * c + j);
                    }
                }
                one(Tile {
                    shape: vec![c, r],
                    buf: a.buf.gather(&idx),
                    poison: None,
                })
            }
            OpKind::Extract {
                x,
                axis,
                start,
                len,
                drop,
            } => {
                let a = self.v(*x);
                let idx = extract_index(&a.shape, *axis, *start as usize, *len as usize);
                let mut shape = a.shape.clone();
                if *drop {
                    shape.remove(*axis);
                } else {
                    shape[*axis] = *len as usize;
                }
                one(Tile {
                    shape,
                    buf: a.buf.gather(&idx),
                    poison: None,
                })
            }
            OpKind::Arange { start, len } => {
                let s = self.v(*start).buf.get_i(0);
                let mut v: Vec<i64> = (0..*len as i64).map(|i| s + i).collect();
                wrap_ints(rd(0), &mut v);
                one(Tile {
                    shape: vec![*len as usize],
                    buf: Buf::I(v),
                    poison: None,
                })
            }
            OpKind::Load {
                tensor,
                access,
                mask,
                other,
            } => {
                let d = rd(0);
                let placed = self.access(*tensor, access);
                let shape = placed.shape().to_vec();
                let res = op.results[0].0 as usize;
                let last = self.views[res].take();
                if let (true, Placed::Window { starts, .. }) = (self.deferred.contains(op), &placed)
                {
                    if let Some(view) =
                        self.deferred_load(*tensor, d, &shape, starts, *mask, *other)
                    {
                        if let Some(last) = last.filter(|l| l.off != view.off) {
                            if !self.in_chained_loop {
                                view.prefetch_moved(view.off - last.off);
                            }
                        }
                        self.views[res] = Some(view);
                        return one(Tile {
                            shape,
                            buf: Buf::F(Vec::new()),
                            poison: None,
                        });
                    }
                }
                let n: usize = shape.iter().product();
                let mut buf = normalise(d, Buf::filled(repr(d), 1, *other)).repeat(n);
                let m = self.mem(*tensor);
                placed.for_each_run(m, |dst, off, len| {
                    // SAFETY: `off..off + len` is in bounds of the tensor.
                    unsafe { read_run(m, off, &mut buf, dst, len) }
                });
                if let Some(mk) = mask {
                    let fill = normalise(d, Buf::filled(repr(d), 1, *other));
                    let mk = self.v(*mk).buf.i().to_vec();
                    apply_mask(&mut buf, &fill, &mk);
                }
                one(Tile {
                    shape,
                    buf,
                    poison: None,
                })
            }
            OpKind::Store {
                tensor,
                access,
                value,
                mask,
            }
            | OpKind::AtomicAdd {
                tensor,
                access,
                value,
                mask,
            } => {
                let add = matches!(op.kind, OpKind::AtomicAdd { .. });
                let placed = self.access(*tensor, access);
                let v = self.v(*value).clone();
                let mk = mask.map(|mk| self.v(mk).clone());
                let mk = mk.as_ref().map(|t| t.buf.i());
                let m = self.mem(*tensor);
                if let Some(p) = &v.poison {
                    let mut bad = false;
                    placed.for_each_run(m, |at, _, len| {
                        bad |= (at..at + len).any(|j| {
                            p[if p.len() == 1 { 0 } else { j }] && mk.is_none_or(|mk| mk[j] != 0)
                        });
                    });
                    if bad {
                        return Err(div_by_zero());
                    }
                }
                placed.for_each_run(m, |src, off, len| {
                    // SAFETY: `off..off + len` is in bounds of the tensor.
                    unsafe { write_run(m, off, &v.buf, src, len, mk, add) }
                });
                Ok(vec![])
            }
            OpKind::Dot {
                a,
                b,
                acc,
                precision,
            } => {
                // An accumulator read for the last time here is taken, so that
                // its buffer is accumulated into in place (no copy per K step).
                let acc = acc.map(|c| {
                    if c != *a && c != *b && self.live.dying(op).contains(&c) {
                        self.vals[c.0 as usize]
                            .take()
                            .expect("Tile IR: a value used before its definition")
                    } else {
                        self.v(c).clone()
                    }
                });
                let acc_poisoned = acc
                    .as_ref()
                    .and_then(|t| t.poison.as_ref())
                    .is_some_and(|p| p.iter().any(|b| *b));
                let acc = acc.map(|t| Rc::try_unwrap(t).map_or_else(|t| t.buf.clone(), |t| t.buf));
                let (x, y) = (self.v(*a), self.v(*b));
                let (m, kk, n) = (x.shape[0], x.shape[1], y.shape[1]);
                let buf = match (
                    source(x, self.views[a.0 as usize]),
                    source(y, self.views[b.0 as usize]),
                ) {
                    (Some(sa), Some(sb)) => {
                        let mut c = match acc {
                            Some(Buf::F(c)) => c,
                            Some(other) => cast(&other, DType::F32).f().to_vec(),
                            None => vec![0.0f32; m * n],
                        };
                        let parts = [Part {
                            a: sa,
                            b: sb,
                            k: kk,
                        }];
                        let tf32 = *precision == Precision::Tf32;
                        gemm::sdot_chain(&parts, &mut c, (m, n), tf32, Some(self.cache));
                        normalise(rd(0), Buf::F(c))
                    }
                    _ => dot(&x.buf, &y.buf, acc, m, kk, n, rd(0)),
                };
                one(Tile {
                    shape: vec![m, n],
                    buf,
                    poison: acc_poisoned.then(|| vec![true; m * n]),
                })
            }
            OpKind::Reduce {
                op: r,
                x,
                axis,
                keepdims,
            } => {
                let a = self.v(*x);
                let d = rd(0);
                let outer: usize = a.shape[..*axis].iter().product();
                let len = a.shape[*axis];
                let inner: usize = a.shape[*axis + 1..].iter().product();
                let buf = normalise(d, reduce(*r, &a.buf, outer, len, inner));
                let mut shape = a.shape.clone();
                if *keepdims {
                    shape[*axis] = 1;
                } else {
                    shape.remove(*axis);
                }
                one(Tile {
                    shape,
                    buf,
                    poison: None,
                })
            }
            OpKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let iv_dtype = self.dtype(body.args[0]);
                let (mut i, h, s) = (
                    self.v(*lo).buf.get_i(0),
                    self.v(*hi).buf.get_i(0),
                    self.v(*step).buf.get_i(0),
                );
                if s == 0 {
                    return Err(ExecError::new("E0703", "`range` step is zero")
                        .with_help("a loop step must be non-zero"));
                }
                let mut carried: Vec<T> = init.iter().map(|v| self.v(*v).clone()).collect();
                let chain = self.chained.get(op);
                let mut pending = Pending::new();
                let outer = self.in_chained_loop;
                self.in_chained_loop |= chain.is_some();
                while (s > 0 && i < h) || (s < 0 && i > h) {
                    self.interrupt.check()?;
                    let mut args = vec![scalar_tile(Buf::I(vec![wrap_int(iv_dtype, i)]))];
                    args.extend(carried);
                    carried =
                        self.run_region_chained(body, args, chain.map(|c| (c, &mut pending)))?;
                    if let Some(c) = chain.filter(|_| pending.is_full()) {
                        pending.multiply(&mut carried[c.carried], self.cache);
                    }
                    i += s;
                }
                self.in_chained_loop = outer;
                if let Some(c) = chain {
                    pending.multiply(&mut carried[c.carried], self.cache);
                }
                Ok(carried)
            }
            OpKind::While { init, cond, body } => {
                let mut carried: Vec<T> = init.iter().map(|v| self.v(*v).clone()).collect();
                loop {
                    self.interrupt.check()?;
                    let c = self.run_region(cond, carried.clone())?;
                    if c[0].poison.is_some() {
                        return Err(div_by_zero());
                    }
                    if c[0].buf.get(0) == 0.0 {
                        break;
                    }
                    carried = self.run_region(body, carried)?;
                }
                Ok(carried)
            }
            OpKind::If {
                cond,
                then,
                otherwise,
            } => {
                if self.v(*cond).buf.get(0) != 0.0 {
                    self.run_region(then, vec![])
                } else {
                    self.run_region(otherwise, vec![])
                }
            }
            OpKind::Yield(_) => unreachable!("handled by region"),
        }
    }

    /// The view a load of a 2-d f32/f16/bf16 tile can be left as (see
    /// [`deferred`]): any access and bounds, a mask only when it is all set.
    pub(super) fn deferred_load(
        &self,
        tensor: usize,
        d: DType,
        shape: &[usize],
        starts: &[(i64, Option<usize>)],
        mask: Option<Value>,
        other: Constant,
    ) -> Option<View> {
        let m = self.mem(tensor);
        if shape.len() != 2 || m.dtype != d || !matches!(d, DType::F32 | DType::F16 | DType::BF16) {
            return None;
        }
        if let Some(mk) = mask {
            if self.v(mk).buf.i().contains(&0) {
                return None;
            }
        }
        let mut off = 0i64;
        let mut ranges = Vec::with_capacity(2);
        for (axis, (s, len)) in starts.iter().enumerate() {
            match len {
                // A point out of bounds: the whole tile is `other`, rare
                // enough to leave to the general load.
                None if *s < 0 || *s >= m.dims[axis] => return None,
                None => {}
                Some(len) => {
                    let len = *len as i64;
                    // A window wholly outside the tensor is left to the general
                    // load (which clips); so the offsets below stay small.
                    if *s < -len || *s > m.dims[axis] {
                        return None;
                    }
                    let lo = (-s).clamp(0, len);
                    let hi = (m.dims[axis] - s).clamp(lo, len);
                    ranges.push((m.strides[axis], (lo as usize, hi as usize)));
                }
            }
            off = off.checked_add(s.checked_mul(m.strides[axis])?)?;
        }
        let fill = normalise(d, Buf::filled(Repr::F, 1, other)).f()[0];
        Some(View {
            ptr: m.ptr,
            dtype: d,
            off,
            rs: ranges[0].0,
            cs: ranges[1].0,
            rows: ranges[0].1,
            cols: ranges[1].1,
            fill,
            read_only: m.read_only,
        })
    }

    /// Where an access of tensor `tensor` reads or writes.
    pub(super) fn access(&self, tensor: usize, access: &[Access]) -> Placed {
        if Access::is_gather(access) {
            let shape: Vec<usize> = Access::shape(access, &self.k.types)
                .iter()
                .map(|&d| d as usize)
                .collect();
            let n = shape.iter().product();
            let m = self.mem(tensor);
            let idx: Vec<&[i64]> = access.iter().map(|a| self.v(a.value()).buf.i()).collect();
            let offsets = (0..n)
                .map(|e| {
                    let mut off = 0i64;
                    for (axis, ix) in idx.iter().enumerate() {
                        let i = ix[if ix.len() == 1 { 0 } else { e }];
                        if i < 0 || i >= m.dims[axis] {
                            return None;
                        }
                        off += i * m.strides[axis];
                    }
                    Some(off as usize)
                })
                .collect();
            return Placed::Gathered { shape, offsets };
        }
        let mut shape = Vec::new();
        let mut starts = Vec::new();
        for a in access {
            match a {
                Access::Point(v) => starts.push((self.v(*v).buf.get_i(0), None)),
                Access::Range { start, len } => {
                    shape.push(*len as usize);
                    starts.push((self.v(*start).buf.get_i(0), Some(*len as usize)));
                }
                Access::Gather(_) => unreachable!("Tile IR: a gather mixed with points or ranges"),
            }
        }
        Placed::Window { shape, starts }
    }
}
