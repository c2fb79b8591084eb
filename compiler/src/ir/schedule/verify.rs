//! The Schedule IR verifier: buffers and views, write-before-read through
//! regions, host variables set before they are read, arguments against the
//! kernels' parameters, and the Tile IR verifier on every generated kernel.

use super::{product, Arg, BufKind, KernelRef, ScalarExpr, Schedule, Step};
use crate::check::dims::Dim;
use crate::ir::tile::{self, Access, Constant, Kernel, OpKind, ParamKind, Region, Type, Value};

/// Checks the plan: arguments name existing buffers with the right element
/// count, every buffer a launch reads was written (or is an input or an
/// allocation) before, every output is written, and generated kernels are
/// well-formed Tile IR with one argument per parameter.
pub fn verify(s: &Schedule) -> Result<(), String> {
    let err = |m: String| Err(format!("schedule `{}`: {m}", s.name));
    let count = |d: &[Dim]| product(d);
    for (i, b) in s.buffers.iter().enumerate() {
        if let BufKind::View(of) = b.kind {
            if of.0 as usize >= i {
                return err(format!("view `{}` of a later buffer", b.name));
            }
            if count(&b.dims) != count(&s.buffer(of).dims) {
                return err(format!("view `{}` changes the element count", b.name));
            }
        }
    }
    let mut written: Vec<bool> = s
        .buffers
        .iter()
        .map(|b| b.alloc || matches!(b.kind, BufKind::Input(_)))
        .collect();
    let mut vars = Vec::new();
    if let Err(m) = verify_steps(s, &s.steps, &mut written, &mut vars) {
        return err(m);
    }
    for o in &s.outputs {
        if !written[s.base(*o).0 as usize] {
            return err(format!("output `{}` is never written", s.buffer(*o).name));
        }
    }
    Ok(())
}

/// The host variables an expression reads.
fn vars_of(e: &ScalarExpr, out: &mut Vec<String>) {
    match e {
        ScalarExpr::Var(v) => out.push(v.clone()),
        ScalarExpr::Unary(_, x) | ScalarExpr::Cast(x, _) | ScalarExpr::CDiv(x, _) => {
            vars_of(x, out)
        }
        ScalarExpr::Binary(_, a, b) => {
            vars_of(a, out);
            vars_of(b, out);
        }
        ScalarExpr::Param(_) | ScalarExpr::Index(_) | ScalarExpr::Const(_) => {}
    }
}

/// Checks a list of steps: buffers written before they are read, host
/// variables set before they are read; regions see the state before them,
/// and after an `if` a buffer counts as written when both branches write it
/// (after a loop, when it was before: a loop may run no trip).
fn verify_steps(
    s: &Schedule,
    steps: &[Step],
    written: &mut Vec<bool>,
    vars: &mut Vec<String>,
) -> Result<(), String> {
    let err = |m: String| Err(m);
    let count = |d: &[Dim]| product(d);
    let defined = |e: &ScalarExpr, vars: &Vec<String>, li: usize| -> Result<(), String> {
        let mut used = Vec::new();
        vars_of(e, &mut used);
        match used.iter().find(|v| !vars.contains(v)) {
            Some(v) => Err(format!(
                "step {li}: host variable `${v}` read before it is set"
            )),
            None => Ok(()),
        }
    };
    // A region's steps from the state before them; gives the state after.
    let scope = |body: &[Step], written: &Vec<bool>, vars: &Vec<String>, extra: Option<&String>| {
        let (mut w, mut v) = (written.clone(), vars.clone());
        v.extend(extra.cloned());
        verify_steps(s, body, &mut w, &mut v).map(|_| (w, v))
    };
    for (li, step) in steps.iter().enumerate() {
        let l = match step {
            Step::Launch(l) => l,
            Step::SetVar { var, value } => {
                defined(value, vars, li)?;
                vars.push(var.clone());
                continue;
            }
            Step::HostData { buf, values, .. } => {
                let Some(b) = s.buffers.get(buf.0 as usize) else {
                    return err(format!("step {li}: `data` names no buffer"));
                };
                if count(&b.dims).and_then(|d| d.as_const()) != Some(values.len() as i64) {
                    return err(format!(
                        "step {li}: {} values for `{}`",
                        values.len(),
                        b.name
                    ));
                }
                written[s.base(*buf).0 as usize] = true;
                continue;
            }
            Step::Collective { input, output, .. } => {
                if input.0 as usize >= s.buffers.len() || !written[s.base(*input).0 as usize] {
                    return err(format!(
                        "step {li}: the collective reads a buffer not written before"
                    ));
                }
                match s.buffers.get(output.0 as usize) {
                    Some(b) if !matches!(b.kind, BufKind::Input(_)) => {}
                    _ => return err(format!("step {li}: the collective writes no buffer")),
                }
                written[s.base(*output).0 as usize] = true;
                continue;
            }
            Step::Call {
                func, args, out, ..
            } => {
                for (name, a) in args {
                    match a {
                        Arg::Scalar(e) => defined(e, vars, li)?,
                        Arg::Buffer { buf, .. } => {
                            if buf.0 as usize >= s.buffers.len()
                                || !written[s.base(*buf).0 as usize]
                            {
                                return err(format!(
                                    "step {li}: `{name}` of the call to `{func}` is not a written buffer"
                                ));
                            }
                        }
                    }
                }
                match s.buffers.get(out.0 as usize) {
                    Some(b) if !matches!(b.kind, BufKind::Input(_)) => {}
                    _ => return err(format!("step {li}: the call to `{func}` writes no buffer")),
                }
                written[s.base(*out).0 as usize] = true;
                continue;
            }
            Step::If {
                cond,
                then,
                otherwise,
            } => {
                defined(cond, vars, li)?;
                let (a, va) = scope(then, written, vars, None)?;
                let (b, vb) = scope(otherwise, written, vars, None)?;
                // What both branches write or set stays so.
                for v in va {
                    if vb.contains(&v) && !vars.contains(&v) {
                        vars.push(v);
                    }
                }
                for (w, (x, y)) in written.iter_mut().zip(a.iter().zip(&b)) {
                    *w |= *x && *y;
                }
                continue;
            }
            Step::For {
                var,
                lo,
                hi,
                step,
                body,
            } => {
                for e in [lo, hi, step] {
                    defined(e, vars, li)?;
                }
                scope(body, written, vars, Some(var))?;
                continue;
            }
            Step::While { cond, test, body } => {
                // The condition runs at least once, the body maybe never.
                verify_steps(s, cond, written, vars)?;
                defined(test, vars, li)?;
                scope(body, written, vars, None)?;
                continue;
            }
            Step::HostRandn { buf, seed, .. } => {
                let Some(b) = s.buffers.get(buf.0 as usize) else {
                    return err(format!("step {li}: `randn` names no buffer"));
                };
                if !b.dtype.is_float() {
                    return err(format!("step {li}: `randn` into a `{}` buffer", b.dtype));
                }
                if matches!(b.kind, BufKind::Input(_)) {
                    return err(format!("step {li}: `randn` overwrites input `{}`", b.name));
                }
                if matches!(
                    seed,
                    ScalarExpr::Const(Constant::Float(_) | Constant::Bool(_))
                ) {
                    return err(format!("step {li}: a `randn` seed that is not an integer"));
                }
                defined(seed, vars, li)?;
                written[s.base(*buf).0 as usize] = true;
                continue;
            }
        };
        for e in l.grid.iter().flatten() {
            defined(e, vars, li)?;
        }
        for (name, a) in &l.args {
            if let Arg::Scalar(e) = a {
                defined(e, vars, li)?;
            }
            if let Arg::Buffer { buf, dims } = a {
                if buf.0 as usize >= s.buffers.len() {
                    return err(format!("step {li}: `{name}` names no buffer"));
                }
                if count(dims) != count(&s.buffer(*buf).dims) {
                    return err(format!(
                        "step {li}: `{name}` is viewed with another element count"
                    ));
                }
                let base = s.base(*buf);
                if !l.writes.contains(buf) && !written[base.0 as usize] {
                    return err(format!(
                        "step {li}: `{name}` reads `{}` before it is written",
                        s.buffer(*buf).name
                    ));
                }
            }
        }
        for w in &l.writes {
            written[s.base(*w).0 as usize] = true;
        }
        if let Some(g) = &l.grid {
            if g.is_empty() || g.len() > 3 {
                return err(format!("step {li}: a grid of rank {}", g.len()));
            }
        }
        if let KernelRef::Generated(k) = l.kernel {
            let Some(kernel) = s.kernels.get(k) else {
                return err(format!("step {li}: no generated kernel {k}"));
            };
            if kernel.params.len() != l.args.len()
                || kernel.params.iter().zip(&l.args).any(|(p, (n, a))| {
                    p.name != *n
                        || match (&p.kind, a) {
                            (ParamKind::Tensor { dims, dtype }, Arg::Buffer { buf, dims: ad }) => {
                                dims.len() != ad.len() || *dtype != s.buffer(*buf).dtype
                            }
                            (ParamKind::Scalar(_), Arg::Scalar(_)) => false,
                            _ => true,
                        }
                })
            {
                return err(format!(
                    "step {li}: arguments do not match `{}`'s parameters",
                    kernel.name
                ));
            }
            verify_kernel(kernel)?;
            let errors = tile::verify(kernel);
            if !errors.is_empty() {
                return err(format!(
                    "generated kernel `{}`: {}",
                    kernel.name,
                    errors.join("; ")
                ));
            }
        }
    }
    Ok(())
}

/// A structural check of a generated Tile IR kernel: values defined once and
/// before use (region arguments at the region's start), elementwise operands
/// of equal types, loads and stores matching their accesses, loop bounds of one
/// integer type, loop bodies yielding their carried types. (The Tile IR
/// verifier proper checks every typing rule.)
pub fn verify_kernel(k: &Kernel) -> Result<(), String> {
    let mut defined = vec![false; k.types.len()];
    verify_region(k, &k.body, &mut defined, None).map_err(|m| format!("kernel `{}`: {m}", k.name))
}

fn verify_region(
    k: &Kernel,
    r: &Region,
    defined: &mut Vec<bool>,
    carried: Option<&[Value]>,
) -> Result<(), String> {
    let define = |v: Value, defined: &mut Vec<bool>| match defined.get_mut(v.0 as usize) {
        Some(d) if !*d => {
            *d = true;
            Ok(())
        }
        _ => Err(format!("%{} defined twice or without a type", v.0)),
    };
    for a in &r.args {
        define(*a, defined)?;
    }
    for (i, op) in r.ops.iter().enumerate() {
        let access_uses = |a: &[Access]| -> Vec<Value> { a.iter().map(Access::value).collect() };
        let uses: Vec<Value> = match &op.kind {
            OpKind::Unary { x, .. }
            | OpKind::Transpose { x }
            | OpKind::Extract { x, .. }
            | OpKind::Cast { x, .. }
            | OpKind::Splat { x, .. }
            | OpKind::Broadcast { x, .. }
            | OpKind::ExpandDims { x, .. }
            | OpKind::Reduce { x, .. } => vec![*x],
            OpKind::Binary { a, b, .. } => vec![*a, *b],
            OpKind::Select { cond, a, b } => vec![*cond, *a, *b],
            OpKind::Load { access, .. } => access_uses(access),
            OpKind::Store { access, value, .. } => {
                let mut u = access_uses(access);
                u.push(*value);
                u
            }
            OpKind::For {
                lo, hi, step, init, ..
            } => [*lo, *hi, *step]
                .into_iter()
                .chain(init.iter().copied())
                .collect(),
            OpKind::Yield(vs) => vs.clone(),
            _ => vec![],
        };
        for u in &uses {
            if !defined.get(u.0 as usize).copied().unwrap_or(false) {
                return Err(format!("op {i}: %{} used before its definition", u.0));
            }
        }
        match &op.kind {
            OpKind::Binary { a, b, .. } | OpKind::Select { a, b, .. } if k.ty(*a) != k.ty(*b) => {
                return Err(format!("op {i}: operands of different types"))
            }
            OpKind::Load { tensor, access, .. } | OpKind::Store { tensor, access, .. } => {
                let Some(ParamKind::Tensor { dims, .. }) = k.params.get(*tensor).map(|p| &p.kind)
                else {
                    return Err(format!("op {i}: param {tensor} is not a tensor"));
                };
                if dims.len() != access.len() {
                    return Err(format!("op {i}: access rank differs from the tensor's"));
                }
                let lens = Access::shape(access, &k.types);
                let tile = match &op.kind {
                    OpKind::Store { value, .. } => k.ty(*value).shape().to_vec(),
                    _ => k.types[op.results[0].0 as usize].shape().to_vec(),
                };
                if lens != tile {
                    return Err(format!("op {i}: tile shape differs from the access"));
                }
            }
            OpKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let t = k.ty(*lo);
                if !matches!(t, Type::Scalar(d) if d.is_int()) || k.ty(*hi) != t || k.ty(*step) != t
                {
                    return Err(format!(
                        "op {i}: loop bounds of different or non-integer types"
                    ));
                }
                if body.args.len() != init.len() + 1 || op.results.len() != init.len() {
                    return Err(format!("op {i}: loop arity"));
                }
                verify_region(k, body, defined, Some(init))?;
            }
            OpKind::Yield(vs) => {
                let Some(c) = carried else {
                    return Err(format!("op {i}: a yield in the kernel body"));
                };
                if vs.len() != c.len() || vs.iter().zip(c).any(|(v, c)| k.ty(*v) != k.ty(*c)) {
                    return Err(format!(
                        "op {i}: the yield does not match the carried values"
                    ));
                }
            }
            _ => {}
        }
        for res in &op.results {
            define(*res, defined)?;
        }
    }
    if carried.is_some() && !matches!(r.ops.last().map(|o| &o.kind), Some(OpKind::Yield(_))) {
        return Err("a loop body that does not end with a yield".into());
    }
    Ok(())
}
