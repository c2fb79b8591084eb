//! The Graph IR verifier: operands defined before use, types consistent with
//! each op's rule, control-flow regions consistent with their nodes.

use super::{
    operands, regions, Collective, GType, Graph, Node, NodeId, NodeKind, Region, SliceAxis,
};
use crate::check::dims::Dim;
use crate::check::expr::broadcast;
use crate::check::DType;

/// Checks the graph's invariants: operands defined before use, types
/// consistent with each op (broadcasting, matmul inner dims, axes), outputs valued.
pub fn verify(g: &Graph) -> Result<(), String> {
    let err = |i: usize, m: String| Err(format!("graph `{}`: %{i}: {m}", g.name));
    for (i, n) in g.nodes.iter().enumerate() {
        for o in operands(&n.kind) {
            if o.0 as usize >= i {
                return err(i, format!("operand {o} is not defined before its use"));
            }
            if matches!(g.ty(o), GType::Unit) && !matches!(n.kind, NodeKind::Project { .. }) {
                return err(i, format!("operand {o} has no value"));
            }
        }
        if let Err(m) = verify_control(g, n) {
            return err(i, m);
        }
        let dims = |id: NodeId| g.ty(id).dims().to_vec();
        let rank = n.ty.dims().len();
        match &n.kind {
            NodeKind::Param(p) => {
                if g.params.get(*p).map(|p| &p.ty) != Some(&n.ty) {
                    return err(i, format!("param {p} does not match the signature"));
                }
            }
            NodeKind::Const(_) | NodeKind::Index(_) => {
                if !n.ty.is_scalar() {
                    return err(i, "a constant that is not a scalar".into());
                }
            }
            NodeKind::Binary { a, b, .. } => {
                if broadcast(&dims(*a), &dims(*b)).as_deref() != Some(n.ty.dims()) {
                    return err(
                        i,
                        "result shape is not the broadcast of the operands".into(),
                    );
                }
            }
            NodeKind::Select { cond, a, b } => {
                let ab = broadcast(&dims(*a), &dims(*b));
                if ab.and_then(|ab| broadcast(&dims(*cond), &ab)).as_deref() != Some(n.ty.dims()) {
                    return err(
                        i,
                        "result shape is not the broadcast of the operands".into(),
                    );
                }
            }
            NodeKind::Unary { x, .. }
            | NodeKind::Activation { x, .. }
            | NodeKind::Cast { x, .. }
            | NodeKind::Softmax { x, .. }
            | NodeKind::Collective {
                op: Collective::AllReduce(_) | Collective::Broadcast { .. },
                x,
            }
            | NodeKind::LayerNorm { x, .. }
            | NodeKind::RmsNorm { x, .. } => {
                if dims(*x) != n.ty.dims() {
                    return err(i, "an elementwise or row op changes the shape".into());
                }
                if let NodeKind::Softmax { axis, .. } = &n.kind {
                    if *axis >= rank {
                        return err(i, format!("softmax axis {axis} out of range"));
                    }
                }
            }
            // A device's part and the whole differ along one axis only.
            NodeKind::Collective { x, .. } => {
                let (from, to) = (dims(*x), n.ty.dims());
                if from.len() != to.len() || from.iter().zip(to).filter(|(a, b)| a != b).count() > 1
                {
                    return err(i, "a collective changes more than one axis".into());
                }
            }
            NodeKind::MatMul { a, b, .. } => {
                let (mut da, mut db) = (dims(*a), dims(*b));
                if da.is_empty() || db.is_empty() {
                    return err(i, "matmul of a scalar".into());
                }
                if da.len() == 1 {
                    da.insert(0, Dim::constant(1));
                }
                if db.len() == 1 {
                    db.push(Dim::constant(1));
                }
                if da[da.len() - 1] != db[db.len() - 2] {
                    return err(i, "matmul inner dims differ".into());
                }
            }
            NodeKind::Reduce {
                x, axis, keepdims, ..
            } => {
                let xd = dims(*x);
                let expect: Vec<Dim> = match axis {
                    Some(j) if *j >= xd.len() => {
                        return err(i, format!("reduce axis {j} out of range"))
                    }
                    Some(j) => xd
                        .iter()
                        .enumerate()
                        .filter_map(|(k, d)| {
                            if k == *j {
                                keepdims.then(|| Dim::constant(1))
                            } else {
                                Some(d.clone())
                            }
                        })
                        .collect(),
                    None if *keepdims => vec![Dim::constant(1); xd.len()],
                    None => vec![],
                };
                if expect != n.ty.dims() {
                    return err(i, "reduce result shape".into());
                }
            }
            NodeKind::Transpose { x, a, b } => {
                let mut xd = dims(*x);
                if *a >= xd.len() || *b >= xd.len() {
                    return err(i, "transpose axis out of range".into());
                }
                xd.swap(*a, *b);
                if xd != n.ty.dims() {
                    return err(i, "transpose result shape".into());
                }
            }
            NodeKind::Slice { x, axes } => {
                let xd = dims(*x);
                if axes.len() != xd.len() {
                    return err(i, "a subscript without one entry per axis".into());
                }
                let kept = axes
                    .iter()
                    .filter(|a| !matches!(a, SliceAxis::Index(_)))
                    .count();
                if kept != rank {
                    return err(i, "a subscript's result rank".into());
                }
                let mut k = 0;
                for (a, d) in axes.iter().zip(&xd) {
                    match a {
                        SliceAxis::Full if n.ty.dims()[k] != *d => {
                            return err(i, "a `:` axis changes its size".into())
                        }
                        SliceAxis::Index(ix) if !g.ty(*ix).dtype().is_some_and(DType::is_int) => {
                            return err(i, "an index that is not an integer scalar".into())
                        }
                        _ => {}
                    }
                    if !matches!(a, SliceAxis::Index(_)) {
                        k += 1;
                    }
                }
            }
            NodeKind::KernelCall { .. } => {
                if n.ty != GType::Unit {
                    return err(i, "a kernel call has a value".into());
                }
            }
            NodeKind::Reshape { .. }
            | NodeKind::Fill(_)
            | NodeKind::Call { .. }
            | NodeKind::If { .. }
            | NodeKind::For { .. }
            | NodeKind::While { .. }
            | NodeKind::Project { .. } => {}
        }
    }
    for o in &g.outputs {
        if o.0 as usize >= g.nodes.len() || matches!(g.ty(*o), GType::Unit) {
            return Err(format!("graph `{}`: output {o} has no value", g.name));
        }
    }
    Ok(())
}

/// The types of a region's results (its outputs).
pub(super) fn region_outputs(r: &Region) -> Vec<GType> {
    r.graph
        .outputs
        .iter()
        .map(|o| r.graph.ty(*o).clone())
        .collect()
}

/// A host condition: a bool scalar or a one-element bool tensor.
pub(super) fn is_condition(t: &GType) -> bool {
    t.dtype() == Some(DType::Bool) && t.dims().iter().all(|d| d.as_const() == Some(1))
}

/// The rules of control-flow nodes: regions well-formed, params matching the
/// leading values and captures, results agreeing, projections in range.
fn verify_control(g: &Graph, n: &Node) -> Result<(), String> {
    let check_region = |r: &Region, leading: &[GType], what: &str| -> Result<(), String> {
        verify(&r.graph)?;
        let want: Vec<GType> = leading
            .iter()
            .cloned()
            .chain(r.captures.iter().map(|c| g.ty(*c).clone()))
            .collect();
        let have: Vec<GType> = r.graph.params.iter().map(|p| p.ty.clone()).collect();
        if want != have {
            return Err(format!("the {what} region's params do not match"));
        }
        Ok(())
    };
    let int_scalar = |x: NodeId| matches!(g.ty(x), GType::Scalar(d) if d.is_int());
    let tys = |ids: &[NodeId]| ids.iter().map(|x| g.ty(*x).clone()).collect::<Vec<_>>();
    if !regions(&n.kind).is_empty() && n.ty != GType::Unit {
        return Err("a control-flow node has a value".into());
    }
    match &n.kind {
        NodeKind::If {
            cond,
            then,
            otherwise,
        } => {
            if !is_condition(g.ty(*cond)) {
                return Err("an `if` condition that is not bool".into());
            }
            check_region(then, &[], "then")?;
            check_region(otherwise, &[], "else")?;
            if region_outputs(then) != region_outputs(otherwise) {
                return Err("the branches of an `if` give different types".into());
            }
        }
        NodeKind::For {
            lo,
            hi,
            step,
            init,
            body,
        } => {
            if ![*lo, *hi, *step].into_iter().all(int_scalar) {
                return Err("`for` bounds that are not integer scalars".into());
            }
            let mut leading = vec![GType::Scalar(DType::I32)];
            leading.extend(tys(init));
            check_region(body, &leading, "body")?;
            if region_outputs(body) != tys(init) {
                return Err("a loop body changes the types it carries".into());
            }
        }
        NodeKind::While { init, cond, body } => {
            check_region(cond, &tys(init), "cond")?;
            check_region(body, &tys(init), "body")?;
            if !matches!(&region_outputs(cond)[..], [t] if is_condition(t)) {
                return Err("a `while` condition that is not one bool".into());
            }
            if region_outputs(body) != tys(init) {
                return Err("a loop body changes the types it carries".into());
            }
        }
        NodeKind::Project { of, index } => {
            let results = match &g.node(*of).kind {
                NodeKind::If { then, .. } => region_outputs(then),
                NodeKind::For { init, .. } | NodeKind::While { init, .. } => tys(init),
                _ => return Err("a projection of a node without results".into()),
            };
            if results.get(*index) != Some(&n.ty) {
                return Err(format!(
                    "projection {index} does not match its node's result"
                ));
            }
        }
        _ => {}
    }
    Ok(())
}
