//! Statements: assignments, branches and loops (with the merge rules for
//! branch-merged and loop-carried values), returns, unreachable code.

use super::ctx::{BindKind, Binding, Checker, Val};
use super::fxhash::{FxHashMap, FxHashSet};
use super::scope::{annotation_in, Annot, Entry};
use super::types::{render_dims, DType, Ty, Value};
use super::{builtins, expr::describe};
use crate::diag::Diagnostic;
use crate::syntax::ast::{Block, Expr, ExprKind, Ident, Stmt, StmtKind, TypeExpr};
use crate::syntax::span::Span;

/// Names assigned anywhere in a block (loop pre-scan).
pub fn assigned_names(body: &[Stmt], out: &mut Vec<String>) {
    fn targets(e: &Expr, out: &mut Vec<String>) {
        match &e.kind {
            ExprKind::Name(id) => out.push(id.name.clone()),
            ExprKind::Tuple(v) | ExprKind::List(v) => v.iter().for_each(|x| targets(x, out)),
            _ => {}
        }
    }
    for s in body {
        match &s.kind {
            StmtKind::Assign { target, .. } | StmtKind::AugAssign { target, .. } => {
                targets(target, out)
            }
            StmtKind::If { branches, orelse } => {
                for (_, b) in branches {
                    assigned_names(b, out);
                }
                if let Some(b) = orelse {
                    assigned_names(b, out);
                }
            }
            StmtKind::For { target, body, .. } => {
                out.push(target.name.clone());
                assigned_names(body, out);
            }
            StmtKind::While { body, .. } => assigned_names(body, out),
            _ => {}
        }
    }
}

/// For the loop whose body is `body` and every loop nested in it: the names
/// its body assigns (as `assigned_names` finds them) that may be bound when
/// the loop starts, sorted, keyed by the body's address. `env` is the
/// environment as the outer loop starts. A name qualifies for a loop if it is
/// bound now or assigned before the loop's body in source order; each (loop,
/// name) pair is found once, so a nest costs its size plus its answer rather
/// than each loop's walk of everything inside it.
pub fn loop_candidates(
    body: &[Stmt],
    env: &FxHashMap<String, Binding>,
    out: &mut FxHashMap<*const Stmt, Vec<String>>,
) {
    struct Walk<'s> {
        /// The next statement's position (pre-order).
        pos: u32,
        /// The loops around the statement, outermost first: body address and
        /// the position of the body's first statement.
        chain: Vec<(*const Stmt, u32)>,
        /// Each name's first assignment so far.
        first: FxHashMap<&'s str, u32>,
        found: FxHashMap<*const Stmt, FxHashSet<&'s str>>,
        env: &'s FxHashMap<String, Binding>,
    }
    impl<'s> Walk<'s> {
        fn assign(&mut self, name: &'s str, at: u32) {
            let first = *self.first.entry(name).or_insert(at);
            let outside = self.env.contains_key(name);
            // Outward from the innermost loop: once a loop starts before the
            // name's first assignment (and it is not bound outside), so do
            // all around it; once a loop has the name, so do all around it.
            for &(key, start) in self.chain.iter().rev() {
                if !(outside || first < start) {
                    break;
                }
                if !self.found.entry(key).or_default().insert(name) {
                    break;
                }
            }
        }
        fn targets(&mut self, e: &'s Expr, at: u32) {
            match &e.kind {
                ExprKind::Name(id) => self.assign(&id.name, at),
                ExprKind::Tuple(v) | ExprKind::List(v) => {
                    v.iter().for_each(|x| self.targets(x, at))
                }
                _ => {}
            }
        }
        fn block(&mut self, body: &'s [Stmt]) {
            for s in body {
                let at = self.pos;
                self.pos += 1;
                match &s.kind {
                    StmtKind::Assign { target, .. } | StmtKind::AugAssign { target, .. } => {
                        self.targets(target, at)
                    }
                    StmtKind::If { branches, orelse } => {
                        for (_, b) in branches {
                            self.block(b);
                        }
                        if let Some(b) = orelse {
                            self.block(b);
                        }
                    }
                    StmtKind::For { target, body, .. } => {
                        self.assign(&target.name, at);
                        self.loop_body(body);
                    }
                    StmtKind::While { body, .. } => self.loop_body(body),
                    _ => {}
                }
            }
        }
        fn loop_body(&mut self, body: &'s [Stmt]) {
            let key = body.as_ptr();
            self.found.entry(key).or_default();
            self.chain.push((key, self.pos));
            self.block(body);
            self.chain.pop();
        }
    }
    let mut w = Walk {
        pos: 0,
        chain: Vec::new(),
        first: FxHashMap::default(),
        found: FxHashMap::default(),
        env,
    };
    w.loop_body(body);
    ENV_WORK.with(|c| c.set(c.get() + u64::from(w.pos)));
    for (key, names) in w.found {
        let mut names: Vec<String> = names.into_iter().map(str::to_string).collect();
        names.sort();
        out.insert(key, names);
    }
}

thread_local! {
    /// Bindings undone and merged for `if`s, and names a loop's start and end
    /// look at, on this thread: the work the tests count to show an `if` or a
    /// loop costs what it changes.
    pub(crate) static ENV_WORK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl Checker<'_> {
    /// Checks a block; returns whether it always ends in return/break/continue.
    pub fn block(&mut self, stmts: &[Stmt]) -> bool {
        let mut terminated = false;
        let mut warned = false;
        for s in stmts {
            if terminated && !warned {
                self.report(
                    Diagnostic::new("W0005", s.span, "unreachable code").with_help(
                        "it follows a `return`, `break` or `continue`; remove it or move it before",
                    ),
                );
                warned = true;
            }
            terminated |= self.stmt(s);
        }
        terminated
    }

    fn stmt(&mut self, s: &Stmt) -> bool {
        crate::cancel::checkpoint();
        match &s.kind {
            StmtKind::Expr(e) => {
                self.expr(e);
                false
            }
            StmtKind::Assign { target, ty, value } => {
                let v = self.expr(value);
                let v = match ty {
                    Some(t) => self.annotated(v, t, value),
                    None => v,
                };
                self.assign(target, v);
                false
            }
            StmtKind::AugAssign { target, op, value } => {
                let cur = self.expr(target);
                let r = self.expr(value);
                let res = self.binary(*op, &cur, &r, s.span, target, value);
                self.assign(target, res);
                false
            }
            StmtKind::If { branches, orelse } => self.if_stmt(branches, orelse.as_ref()),
            StmtKind::For { target, iter, body } => {
                let it = self.expr(iter);
                if !matches!(it.ty, Ty::Range | Ty::Err) {
                    self.report(
                        Diagnostic::new(
                            "E0302",
                            iter.span,
                            format!("`for` loops iterate over `range(...)`, found `{}`", it.ty),
                        )
                        .with_help("write `for i in range(start, end, step):`"),
                    );
                }
                self.loop_body(Some(target), body);
                false
            }
            StmtKind::While { cond, body } => {
                let c = self.expr(cond);
                self.condition(&c, cond);
                self.loop_body(None, body);
                false
            }
            StmtKind::Return(e) => {
                self.return_stmt(e.as_ref(), s.span);
                true
            }
            StmtKind::Break | StmtKind::Continue => true,
            StmtKind::Pass | StmtKind::Error => false,
        }
    }

    /// `x: T = value`: the value must fit the annotation.
    fn annotated(&mut self, v: Val, te: &TypeExpr, value: &Expr) -> Val {
        let scope = self.scope;
        let Annot::Ty(t) =
            annotation_in(te, &|n| scope.const_value(n), &self.tenv, &mut self.diags)
        else {
            return v;
        };
        if v.ty.is_err() || t.is_err() {
            return Val::with(if t.is_err() { v.ty } else { t }, v.value);
        }
        let fits = match (&t, &v.ty) {
            (Ty::Scalar { dtype: d, .. }, Ty::Scalar { dtype: vd, weak }) => {
                if *weak {
                    !vd.is_float() || d.is_float()
                } else {
                    vd.widens_to(*d)
                }
            }
            (
                Ty::Tile { dims, dtype },
                Ty::Tile {
                    dims: vd,
                    dtype: vdt,
                },
            )
            | (
                Ty::Tensor { dims, dtype },
                Ty::Tensor {
                    dims: vd,
                    dtype: vdt,
                },
            ) => {
                if dims != vd {
                    self.report(
                        Diagnostic::new(
                            "E0409",
                            value.span,
                            format!(
                                "this value is `{}`, but the annotation declares shape {}",
                                v.ty,
                                render_dims(dims)
                            ),
                        )
                        .with_label(te.span, format!("declared `{t}`"))
                        .with_help(
                            "make the annotation's shape the value's, or reshape the value: `reshape(x, [...])`",
                        ),
                    );
                    return Val::with(t, None);
                }
                vdt.widens_to(*dtype)
            }
            _ => {
                self.report(
                    Diagnostic::new(
                        "E0302",
                        value.span,
                        format!(
                            "this is a {} (`{}`), but the annotation declares `{t}`",
                            v.ty.kind_name(),
                            v.ty
                        ),
                    )
                    .with_label(te.span, "declared here")
                    .with_help(format!("annotate it as `{}`, or drop the annotation", v.ty)),
                );
                return Val::with(t, None);
            }
        };
        if !fits {
            let dt = t.dtype().unwrap_or(DType::F32);
            self.report(
                Diagnostic::new(
                    "E0301",
                    value.span,
                    format!("`{}` does not convert implicitly to `{t}`", v.ty),
                )
                .with_label(te.span, format!("declared `{t}`"))
                .with_help(format!(
                    "convert explicitly: `{}.to({dt})`",
                    describe(value)
                )),
            );
        }
        Val::with(t, v.value)
    }

    pub fn assign(&mut self, target: &Expr, v: Val) {
        match &target.kind {
            ExprKind::Name(id) => self.assign_name(id, v),
            ExprKind::Tuple(items) | ExprKind::List(items) => {
                let parts: Vec<Val> = match &v.ty {
                    Ty::Tuple(tys) if tys.len() == items.len() => {
                        let vals = match &v.value {
                            Some(Value::Tuple(vs)) if vs.len() == tys.len() => {
                                vs.iter().cloned().map(Some).collect()
                            }
                            _ => vec![None; tys.len()],
                        };
                        tys.iter()
                            .cloned()
                            .zip(vals)
                            .map(|(t, v)| Val::with(t, v))
                            .collect()
                    }
                    // `m, n = x.shape`: one i32 dim each.
                    Ty::Shape(dims) if dims.len() == items.len() => dims
                        .iter()
                        .map(|d| Val::with(Ty::scalar(DType::I32), Some(Value::Int(d.clone()))))
                        .collect(),
                    Ty::Err => vec![Val::err(); items.len()],
                    other => {
                        self.report(
                            Diagnostic::new(
                                "E0302",
                                target.span,
                                format!("cannot unpack `{other}` into {} names", items.len()),
                            )
                            .with_help(format!(
                                "unpack a tuple or shape of {} items, e.g. `m, n = x.shape`",
                                items.len()
                            )),
                        );
                        vec![Val::err(); items.len()]
                    }
                };
                for (t, p) in items.iter().zip(parts) {
                    self.assign(t, p);
                }
            }
            ExprKind::Subscript { value, indices } => {
                let base = self.expr(value);
                if self.in_kernel {
                    self.report(
                        Diagnostic::new("E0302", target.span, "tiles and tensors cannot be assigned element-wise inside a kernel")
                            .with_help("write to memory with `store(T[slices], tile)`, or build a new tile with `where(...)`"),
                    );
                    return;
                }
                let slot = self.subscript(base, value, indices);
                if let Some(dt) = slot.ty.dtype().filter(|_| !v.ty.is_err()) {
                    self.assigned_dtype_fits(dt, &v, target.span);
                }
                if let (Some(sd), Some(vd)) = (slot.ty.dims(), v.ty.dims()) {
                    if super::expr::broadcast(vd, sd).as_deref() != Some(sd) {
                        self.report(
                            Diagnostic::new(
                                "E0402",
                                target.span,
                                format!(
                                    "a value of shape {} cannot be assigned to a slice of shape {}",
                                    render_dims(vd),
                                    render_dims(sd)
                                ),
                            )
                            .with_help(format!(
                                "assign one number or a value that broadcasts to {}",
                                render_dims(sd)
                            )),
                        );
                    }
                }
            }
            _ => {
                self.expr(target);
                self.report(Diagnostic::new(
                    "E0302",
                    target.span,
                    "this cannot be assigned to",
                )
                .with_help(
                    "assign to a name (`x = ...`) or to an element or slice of a tensor (`t[i] = ...`)",
                ));
            }
        }
    }

    /// `t[idx] = v`: `v` must widen to `t`'s dtype, as the session checks when
    /// it stores (E0727 there, for values whose dtype is known only then): a
    /// float never goes into an integer tensor, a number into a bool one, an
    /// integer literal must fit.
    fn assigned_dtype_fits(&mut self, dt: DType, v: &Val, span: Span) {
        let fits = match &v.ty {
            Ty::Scalar { dtype, weak: true } => match (&v.value, dtype) {
                (_, DType::Bool) => dt == DType::Bool,
                (Some(Value::Int(d)), _) if dt != DType::Bool && !dt.is_float() => {
                    d.as_const().is_none_or(|i| int_fits(dt, i))
                }
                (_, d) if d.is_float() => dt.is_float(),
                _ => dt != DType::Bool,
            },
            Ty::Scalar { dtype, .. } | Ty::Tensor { dtype, .. } => dtype.widens_to(dt),
            Ty::Str => false,
            _ => true,
        };
        if !fits {
            self.report(
                Diagnostic::new(
                    "E0301",
                    span,
                    format!("cannot store `{}` in a tensor of dtype `{dt}`", v.ty),
                )
                .with_help(format!(
                    "dtypes never narrow when stored; convert the value first: `.to({dt})`"
                )),
            );
        }
    }

    fn assign_name(&mut self, id: &Ident, v: Val) {
        let name = id.name.as_str();
        if let Some(b) = self.env.get(name) {
            let why = match b.kind {
                BindKind::Dim => Some("a dim of a tensor parameter"),
                BindKind::ConstParam => Some("a `const` parameter"),
                _ => None,
            };
            if let Some(why) = why {
                self.report(
                    Diagnostic::new(
                        "E0208",
                        id.span,
                        format!("cannot assign to `{name}`: it is {why}"),
                    )
                    .with_label(b.span, "defined here")
                    .with_help("use a new name for the new value"),
                );
                return;
            }
        } else if matches!(self.scope.get(name), Some(Entry::Const { .. })) {
            self.report(
                Diagnostic::new(
                    "E0208",
                    id.span,
                    format!("cannot assign to `{name}`: it is a module constant"),
                )
                .with_help("use a new name for the new value"),
            );
            return;
        } else if builtins::is_builtin(name) || DType::from_name(name).is_some() {
            self.report(
                Diagnostic::new(
                    "E0208",
                    id.span,
                    format!("cannot assign to `{name}`: it is a builtin"),
                )
                .with_help(format!("choose another name, e.g. `{name}_`")),
            );
            return;
        }
        self.bind_local(name, v, id.span);
    }

    fn if_stmt(&mut self, branches: &[(Expr, Block)], orelse: Option<&Block>) -> bool {
        // Each branch runs on the environment in place and is then undone
        // through the undo log; only the names some branch changed are merged,
        // so an `if` costs what its branches change, not the whole environment.
        let mark = self.env_undo.len();
        self.env_branches += 1;
        let mut outs: Vec<FxHashMap<String, Binding>> = Vec::new();
        let mut changed: Vec<String> = Vec::new();
        let mut all_term = true;
        let mut run = |this: &mut Self, cond: Option<&Expr>, body: &Block| {
            if let Some(cond) = cond {
                let c = this.expr(cond);
                this.condition(&c, cond);
            }
            let t = this.block(body);
            let delta = this.undo_branch(mark, &mut changed);
            if !t {
                outs.push(delta);
            }
            t
        };
        for (cond, body) in branches {
            all_term &= run(self, Some(cond), body);
        }
        match orelse {
            Some(b) => all_term &= run(self, None, b),
            None => {
                outs.push(FxHashMap::default());
                all_term = false;
            }
        }
        self.env_branches -= 1;
        if outs.is_empty() {
            return all_term;
        }
        changed.sort();
        changed.dedup();
        // Every path's bindings of the changed names: its own where it changed
        // them, the ones before the `if` otherwise.
        let full = |delta: FxHashMap<String, Binding>, env: &FxHashMap<String, Binding>| {
            let mut m = delta;
            for n in &changed {
                if !m.contains_key(n) {
                    if let Some(b) = env.get(n) {
                        m.insert(n.clone(), b.clone());
                    }
                }
            }
            m
        };
        ENV_WORK.with(|w| w.set(w.get() + (changed.len() * outs.len()) as u64));
        let mut it = outs.into_iter();
        let mut merged = full(it.next().unwrap_or_default(), &self.env);
        for other in it {
            let other = full(other, &self.env);
            merged = self.merge_envs(merged, other);
        }
        for (name, b) in merged {
            self.env_insert(name, b);
        }
        all_term
    }

    /// Undoes the environment changes logged since `mark`, returning the
    /// changed names' bindings as the branch left them and adding the names
    /// to `changed`.
    fn undo_branch(
        &mut self,
        mark: usize,
        changed: &mut Vec<String>,
    ) -> FxHashMap<String, Binding> {
        let mut delta = FxHashMap::default();
        ENV_WORK.with(|w| w.set(w.get() + (self.env_undo.len() - mark) as u64));
        while self.env_undo.len() > mark {
            let Some((name, old)) = self.env_undo.pop() else {
                break;
            };
            if !delta.contains_key(&name) {
                if let Some(b) = self.env.get(&name) {
                    delta.insert(name.clone(), b.clone());
                }
                changed.push(name.clone());
            }
            match old {
                Some(b) => {
                    self.env.insert(name, b);
                }
                None => {
                    self.env.remove(&name);
                }
            }
        }
        delta
    }

    fn merge_envs(
        &mut self,
        mut a: FxHashMap<String, Binding>,
        b: FxHashMap<String, Binding>,
    ) -> FxHashMap<String, Binding> {
        let mut names: Vec<&String> = a.keys().collect();
        names.sort();
        let names: Vec<String> = names.into_iter().cloned().collect();
        for name in names {
            let Some(x) = a.get(&name).cloned() else {
                continue;
            };
            match b.get(&name) {
                None => {
                    if let Some(x) = a.get_mut(&name) {
                        x.maybe_unbound = true;
                    }
                }
                Some(y) => {
                    if !Self::compatible(&x.ty, &y.ty) {
                        let (later, earlier, lt, et) = if x.span.start >= y.span.start {
                            (x.span, y.span, &x.ty, &y.ty)
                        } else {
                            (y.span, x.span, &y.ty, &x.ty)
                        };
                        self.report(
                            Diagnostic::new("E0407", later, format!("`{name}` is `{lt}` here but `{et}` on another path into the same point"))
                                .with_label(earlier, format!("`{name}` is `{et}` here"))
                                .with_help("a value assigned in branches must keep one shape and dtype; cast with `.to()` or make the shapes agree"),
                        );
                    }
                    let mut m = x.clone();
                    if matches!(m.ty, Ty::Scalar { weak: true, .. }) || m.ty.is_err() {
                        m.ty = y.ty.clone();
                    }
                    if x.value != y.value {
                        m.value = None;
                        if let Ty::Scalar { dtype, .. } = &m.ty {
                            if dtype.is_int() {
                                m.value = Some(Value::Int(self.fresh_runtime(&name)));
                            }
                        }
                    }
                    m.maybe_unbound |= y.maybe_unbound;
                    a.insert(name, m);
                }
            }
        }
        for (name, y) in b {
            a.entry(name).or_insert_with(|| Binding {
                maybe_unbound: true,
                ..y
            });
        }
        a
    }

    fn loop_body(&mut self, target: Option<&Ident>, body: &[Stmt]) {
        // The names the body assigns that may be bound now, sorted: computed
        // for a whole nest at its outermost loop, so each loop costs what it
        // assigns to names bound before it, not a walk of everything inside.
        let key = body.as_ptr();
        let root = !self.loop_names.contains_key(&key);
        if root {
            loop_candidates(body, &self.env, &mut self.loop_names);
        }
        let assigned = self.loop_names.remove(&key).unwrap_or_default();
        for n in &assigned {
            let is_int = matches!(self.env.get(n), Some(Binding { ty: Ty::Scalar { dtype, .. }, kind: BindKind::Local | BindKind::LoopVar | BindKind::Param, .. }) if dtype.is_int());
            if is_int {
                let sym = self.fresh_runtime(n);
                if let Some(b) = self.env_mut(n) {
                    b.value = Some(Value::Int(sym));
                }
            } else if let Some(b) = self.env_mut(n) {
                // Any other value a loop assigns is not known inside or after it
                // (`s = s + 1.0` runs a number of times the checker does not count).
                if matches!(b.kind, BindKind::Local | BindKind::Param) {
                    b.value = None;
                }
            }
        }
        // From here the loop's frame records what the body changes.
        self.loop_stamp += 1;
        let stamp = self.loop_stamp;
        self.loops.push(super::ctx::LoopFrame {
            stamp,
            ..Default::default()
        });
        if let Some(t) = target {
            let sym = self.fresh_runtime(&t.name);
            let ty = Ty::scalar(DType::I32);
            self.record(t.span, &ty);
            if matches!(
                self.env.get(&t.name).map(|b| b.kind),
                Some(BindKind::Dim | BindKind::ConstParam)
            ) {
                self.report(
                    Diagnostic::new(
                        "E0208",
                        t.span,
                        format!(
                            "cannot use `{}` as a loop variable: it is a dim or `const` parameter",
                            t.name
                        ),
                    )
                    .with_help(format!(
                        "name the loop variable differently, e.g. `for i in range({})`",
                        t.name
                    )),
                );
            }
            self.env_insert(
                t.name.clone(),
                Binding {
                    ty,
                    value: Some(Value::Int(sym)),
                    kind: BindKind::LoopVar,
                    span: t.span,
                    maybe_unbound: false,
                },
            );
        }
        self.loop_depth += 1;
        self.block(body);
        self.loop_depth -= 1;
        let frame = self.loops.pop().unwrap_or_default();
        let done = assigned.len() + frame.changed.len() + frame.new_names.len();
        ENV_WORK.with(|w| w.set(w.get() + done as u64));
        // The enclosing loop's body changed what this one changed.
        if let Some(outer) = self.loops.last().map(|f| f.stamp) {
            for (name, b0) in &frame.changed {
                if self.bound_before(name, outer) {
                    if let Some(f) = self.loops.last_mut() {
                        if !f.changed.contains_key(name) {
                            f.changed.insert(name.clone(), b0.clone());
                        }
                    }
                } else if let Some(f) = self.loops.last_mut() {
                    f.new_names.push(name.clone());
                }
            }
        }
        let mut names: Vec<&String> = frame.changed.keys().collect();
        names.sort();
        for name in names {
            let b0 = &frame.changed[name];
            let Some(b1) = self.env.get(name) else {
                continue;
            };
            if b1.span != b0.span && !Self::compatible(&b0.ty, &b1.ty) {
                let (s1, t1) = (b1.span, b1.ty.clone());
                if let Some(b) = self.env_mut(name) {
                    b.ty = b0.ty.clone();
                }
                self.report(
                    Diagnostic::new("E0407", s1, format!("`{name}` is carried around the loop but changes from `{}` to `{t1}`", b0.ty))
                        .with_label(b0.span, format!("before the loop, `{name}` is `{}`", b0.ty))
                        .with_help("a value carried around a loop must keep its shape and dtype; cast with `.to()` or make the shapes agree"),
                );
            }
        }
        let fresh: Vec<&String> = assigned
            .iter()
            .filter(|n| self.env.contains_key(*n) && self.bound_before(n, stamp))
            .collect();
        for n in fresh {
            let is_int = matches!(self.env.get(n), Some(Binding { ty: Ty::Scalar { dtype, .. }, .. }) if dtype.is_int());
            if is_int {
                let sym = self.fresh_runtime(n);
                if let Some(b) = self.env_mut(n) {
                    b.value = Some(Value::Int(sym));
                }
            }
        }
        // Names first bound in the loop may be unbound after it. Inner loops
        // marked their own; the undo log needs no entry (an `if` branch that
        // bound the name removes it whole).
        for name in &frame.new_names {
            if self.bound_before(name, stamp) {
                continue;
            }
            if let Some(b) = self.env.get_mut(name) {
                b.maybe_unbound = true;
            }
        }
        if self.loops.is_empty() && root {
            self.loop_names.clear();
        }
    }

    fn return_stmt(&mut self, e: Option<&Expr>, span: Span) {
        if self.in_kernel {
            if let Some(e) = e {
                self.expr(e);
                self.report(
                    Diagnostic::new("E0504", e.span, "a kernel cannot return a value").with_help(
                        "write results to an output tensor with `store(out[...], tile)`",
                    ),
                );
            }
            return;
        }
        let v = e.map(|e| self.expr(e));
        if self.top_level {
            return;
        }
        let name = self.fn_name.clone();
        match (self.ret.clone(), v, e) {
            (Some((rt, rspan)), None, _) if !rt.is_err() => self.report(
                Diagnostic::new("E0307", span, format!("`{name}` must return `{rt}`"))
                    .with_label(rspan, "declared here")
                    .with_help(format!("end `{name}` with `return` and a `{rt}` value")),
            ),
            (Some((rt, rspan)), Some(v), Some(e)) => self.check_return(&rt, rspan, &v, e),
            // Callers see the declared type only: an undeclared result would
            // reach them untyped, accepted here and unrunnable.
            (None, Some(v), Some(e))
                if !matches!(v.ty, Ty::Err | Ty::NoneV)
                    && !name.starts_with(SESSION_EVAL_PREFIX) =>
            {
                self.report(
                    Diagnostic::new(
                        "E0307",
                        e.span,
                        format!("`{name}` returns `{}` but declares no return type", v.ty),
                    )
                    .with_help(format!("declare it: `def {name}(...) -> {}:`", v.ty)),
                )
            }
            _ => {}
        }
    }

    fn check_return(&mut self, rt: &Ty, rspan: Span, v: &Val, e: &Expr) {
        let name = self.fn_name.clone();
        match (rt, &v.ty) {
            (Ty::Err, _) | (_, Ty::Err) => {}
            (
                Ty::Tensor {
                    dims: rd,
                    dtype: rdt,
                },
                Ty::Tensor {
                    dims: vd,
                    dtype: vdt,
                },
            ) => {
                if rd.len() != vd.len() {
                    self.report(
                        Diagnostic::new(
                            "E0409",
                            e.span,
                            format!(
                                "`{name}` returns `{}` (rank {}) but declares `{rt}` (rank {})",
                                v.ty,
                                vd.len(),
                                rd.len()
                            ),
                        )
                        .with_label(rspan, "declared here")
                        .with_help(format!(
                            "return a value of rank {}, or declare the return type `{}`",
                            rd.len(),
                            v.ty
                        )),
                    );
                } else if let Some(i) = (0..rd.len()).find(|&i| rd[i] != vd[i]) {
                    self.report(
                        Diagnostic::new(
                            "E0409",
                            e.span,
                            format!("`{name}` returns `{}` but declares `{rt}`: dim {i} is `{}`, declared `{}`", v.ty, vd[i], rd[i]),
                        )
                        .with_label(rspan, "declared here")
                        .with_help("distinct dim names are distinct sizes: a function declared for all sizes may not assume two of them are equal"),
                    );
                } else if vdt != rdt {
                    self.report(
                        Diagnostic::new(
                            "E0307",
                            e.span,
                            format!(
                                "`{name}` returns {} tensor but declares `{rt}`",
                                crate::diag::a_code(vdt)
                            ),
                        )
                        .with_label(rspan, "declared here")
                        .with_help(format!("convert explicitly: `{}.to({rdt})`", describe(e))),
                    );
                }
            }
            (Ty::Scalar { dtype: rdt, .. }, Ty::Scalar { dtype: vdt, weak }) => {
                let ok = if *weak {
                    !vdt.is_float() || rdt.is_float()
                } else {
                    vdt.widens_to(*rdt)
                };
                if !ok {
                    self.report(
                        Diagnostic::new(
                            "E0307",
                            e.span,
                            format!("`{name}` returns `{}` but declares `{rt}`", v.ty),
                        )
                        .with_label(rspan, "declared here")
                        .with_help(format!("convert explicitly: `.to({rdt})`")),
                    );
                }
            }
            _ => self.report(
                Diagnostic::new(
                    "E0307",
                    e.span,
                    format!(
                        "`{name}` returns a {} (`{}`) but declares `{rt}`",
                        v.ty.kind_name(),
                        v.ty
                    ),
                )
                .with_label(rspan, "declared here")
                .with_help(format!(
                    "return a `{rt}`, or declare the return type `{}`",
                    v.ty
                )),
            ),
        }
    }
}

/// The name prefix of the functions a session synthesises around one
/// expression: they are run, never called, so their result needs no `->`.
pub const SESSION_EVAL_PREFIX: &str = "__repl_eval_";

/// Whether the integer `i` is a value of the integer dtype `dt`.
pub fn int_fits(dt: DType, i: i64) -> bool {
    let (lo, hi): (i64, i64) = match dt {
        DType::I8 => (i8::MIN.into(), i8::MAX.into()),
        DType::I16 => (i16::MIN.into(), i16::MAX.into()),
        DType::I32 => (i32::MIN.into(), i32::MAX.into()),
        DType::U8 => (0, u8::MAX.into()),
        DType::U32 => (0, u32::MAX.into()),
        _ => (i64::MIN, i64::MAX),
    };
    (lo..=hi).contains(&i)
}
