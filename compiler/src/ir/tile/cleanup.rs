//! Clean-ups run on freshly lowered kernels: dead-code elimination of pure ops
//! (slice ends only needed for their compile-time length, unused dims) and
//! renumbering of values in definition order, so dumps read top to bottom.

use std::collections::HashMap;

use super::*;

impl OpKind {
    /// The values this op reads (not those of its nested regions).
    pub fn operands(&self) -> Vec<Value> {
        let acc = |access: &[Access]| -> Vec<Value> { access.iter().map(Access::value).collect() };
        match self {
            OpKind::Const(_)
            | OpKind::ProgramId(_)
            | OpKind::NumPrograms(_)
            | OpKind::TensorDim { .. }
            | OpKind::ScalarParam(_) => vec![],
            OpKind::Unary { x, .. }
            | OpKind::Cast { x, .. }
            | OpKind::Splat { x, .. }
            | OpKind::Broadcast { x, .. }
            | OpKind::ExpandDims { x, .. }
            | OpKind::Transpose { x }
            | OpKind::Extract { x, .. }
            | OpKind::Reduce { x, .. } => vec![*x],
            OpKind::Arange { start, .. } => vec![*start],
            OpKind::Binary { a, b, .. } => vec![*a, *b],
            OpKind::Select { cond, a, b } => vec![*cond, *a, *b],
            OpKind::Load { access, mask, .. } => {
                let mut v = acc(access);
                v.extend(mask);
                v
            }
            OpKind::Store {
                access,
                value,
                mask,
                ..
            }
            | OpKind::AtomicAdd {
                access,
                value,
                mask,
                ..
            } => {
                let mut v = acc(access);
                v.push(*value);
                v.extend(mask);
                v
            }
            OpKind::Dot { a, b, acc, .. } => {
                let mut v = vec![*a, *b];
                v.extend(acc);
                v
            }
            OpKind::For {
                lo, hi, step, init, ..
            } => {
                let mut v = vec![*lo, *hi, *step];
                v.extend(init);
                v
            }
            OpKind::While { init, .. } => init.clone(),
            OpKind::If { cond, .. } => vec![*cond],
            OpKind::Yield(vs) => vs.clone(),
        }
    }

    /// The nested regions, in order.
    pub fn regions(&self) -> Vec<&Region> {
        match self {
            OpKind::For { body, .. } => vec![body],
            OpKind::While { cond, body, .. } => vec![cond, body],
            OpKind::If {
                then, otherwise, ..
            } => vec![then, otherwise],
            _ => vec![],
        }
    }

    pub(crate) fn regions_mut(&mut self) -> Vec<&mut Region> {
        match self {
            OpKind::For { body, .. } => vec![body],
            OpKind::While { cond, body, .. } => vec![cond, body],
            OpKind::If {
                then, otherwise, ..
            } => vec![then, otherwise],
            _ => vec![],
        }
    }

    /// Whether the op only computes its results (removable when they are unused).
    pub fn is_pure(&self) -> bool {
        !matches!(
            self,
            OpKind::Store { .. }
                | OpKind::AtomicAdd { .. }
                | OpKind::For { .. }
                | OpKind::While { .. }
                | OpKind::If { .. }
                | OpKind::Yield(_)
        )
    }

    pub(super) fn map_values(&mut self, f: &mut dyn FnMut(Value) -> Value) {
        let acc = |access: &mut Vec<Access>, f: &mut dyn FnMut(Value) -> Value| {
            for a in access {
                let v = a.value_mut();
                *v = f(*v);
            }
        };
        match self {
            OpKind::Const(_)
            | OpKind::ProgramId(_)
            | OpKind::NumPrograms(_)
            | OpKind::TensorDim { .. }
            | OpKind::ScalarParam(_) => {}
            OpKind::Unary { x, .. }
            | OpKind::Cast { x, .. }
            | OpKind::Splat { x, .. }
            | OpKind::Broadcast { x, .. }
            | OpKind::ExpandDims { x, .. }
            | OpKind::Transpose { x }
            | OpKind::Extract { x, .. }
            | OpKind::Reduce { x, .. } => *x = f(*x),
            OpKind::Arange { start, .. } => *start = f(*start),
            OpKind::Binary { a, b, .. } => {
                *a = f(*a);
                *b = f(*b);
            }
            OpKind::Select { cond, a, b } => {
                *cond = f(*cond);
                *a = f(*a);
                *b = f(*b);
            }
            OpKind::Load { access, mask, .. } => {
                acc(access, f);
                if let Some(m) = mask {
                    *m = f(*m);
                }
            }
            OpKind::Store {
                access,
                value,
                mask,
                ..
            }
            | OpKind::AtomicAdd {
                access,
                value,
                mask,
                ..
            } => {
                acc(access, f);
                *value = f(*value);
                if let Some(m) = mask {
                    *m = f(*m);
                }
            }
            OpKind::Dot { a, b, acc, .. } => {
                *a = f(*a);
                *b = f(*b);
                if let Some(c) = acc {
                    *c = f(*c);
                }
            }
            OpKind::For {
                lo, hi, step, init, ..
            } => {
                *lo = f(*lo);
                *hi = f(*hi);
                *step = f(*step);
                init.iter_mut().for_each(|v| *v = f(*v));
            }
            OpKind::While { init, .. } => init.iter_mut().for_each(|v| *v = f(*v)),
            OpKind::If { cond, .. } => *cond = f(*cond),
            OpKind::Yield(vs) => vs.iter_mut().for_each(|v| *v = f(*v)),
        }
    }
}

fn count_uses(r: &Region, uses: &mut HashMap<Value, u32>) {
    super::lower::work(r.ops.len());
    for op in &r.ops {
        for v in op.kind.operands() {
            *uses.entry(v).or_default() += 1;
        }
        for sub in op.kind.regions() {
            count_uses(sub, uses);
        }
    }
}

/// Forgets the uses of `op` (its nested regions' included), being removed.
fn drop_uses(op: &Op, uses: &mut HashMap<Value, u32>) {
    for v in op.kind.operands() {
        if let Some(n) = uses.get_mut(&v) {
            *n = n.saturating_sub(1);
        }
    }
    for sub in op.kind.regions() {
        for op in &sub.ops {
            drop_uses(op, uses);
        }
    }
}

/// Removes pure ops whose results are unused, last op first, so a dead chain
/// goes in one pass: every use of a value comes after its definition (or in
/// a later op's region), so its users have been decided when it is reached.
fn remove_dead(r: &mut Region, uses: &mut HashMap<Value, u32>) -> bool {
    super::lower::work(r.ops.len());
    let mut keep = vec![true; r.ops.len()];
    let mut changed = false;
    for (i, op) in r.ops.iter_mut().enumerate().rev() {
        if op.kind.is_pure()
            && op
                .results
                .iter()
                .all(|v| uses.get(v).is_none_or(|n| *n == 0))
        {
            drop_uses(op, uses);
            keep[i] = false;
            continue;
        }
        for sub in op.kind.regions_mut() {
            changed |= remove_dead(sub, uses);
        }
    }
    let before = r.ops.len();
    let mut k = keep.iter();
    r.ops.retain(|_| k.next().copied().unwrap_or(true));
    changed || r.ops.len() != before
}

fn renumber_region(
    r: &mut Region,
    map: &mut HashMap<Value, Value>,
    old: &[Type],
    types: &mut Vec<Type>,
) {
    let def = |v: &mut Value, map: &mut HashMap<Value, Value>, types: &mut Vec<Type>| {
        let n = Value(types.len() as u32);
        types.push(old[v.0 as usize].clone());
        map.insert(*v, n);
        *v = n;
    };
    for a in &mut r.args {
        def(a, map, types);
    }
    for op in &mut r.ops {
        op.kind
            .map_values(&mut |v| map.get(&v).copied().unwrap_or(v));
        for sub in op.kind.regions_mut() {
            renumber_region(sub, map, old, types);
        }
        for res in &mut op.results {
            def(res, map, types);
        }
    }
}

impl Kernel {
    /// Removes pure ops whose results are unused (to a fixpoint).
    pub fn remove_dead_code(&mut self) {
        // One pass reaches the fixpoint on well-formed IR; the loop checks it.
        loop {
            let mut uses = HashMap::new();
            count_uses(&self.body, &mut uses);
            if !remove_dead(&mut self.body, &mut uses) {
                break;
            }
        }
    }

    /// Renumbers values in definition order (region arguments before the
    /// region's ops; an op's results after its nested regions).
    pub fn renumber(&mut self) {
        let old = std::mem::take(&mut self.types);
        let mut types = Vec::with_capacity(old.len());
        let mut map = HashMap::new();
        renumber_region(&mut self.body, &mut map, &old, &mut types);
        self.types = types;
    }
}
