//! The walk over a graph's nodes: elementwise nodes join fusion groups, then
//! each node (or group) in program order becomes its steps: a library or
//! generated kernel launch, a view, a host step, control flow, a call.

use std::collections::HashMap;

use super::control::{region_types, Slot};
use super::generate::{Group, SrcAxis};
use super::{
    is_elementwise, product, Arg, Attention, BufId, BufKind, KernelRef, Launch, Lower, ScalarExpr,
    Step, R,
};
use crate::check::DType;
use crate::ir::graph::{Fill, NodeId, NodeKind, ReduceKind, SliceAxis};
use crate::ir::tile::Constant;

impl<'g> Lower<'g> {
    /// Lowers every node (params already bound): fusion groups, then one or
    /// more steps per node in program order. `out_for` names the buffers some
    /// results are written to directly.
    pub(super) fn run(
        &mut self,
        out_for: &HashMap<NodeId, BufId>,
        mut attention: HashMap<usize, Attention>,
        absorbed: Vec<bool>,
    ) -> R<()> {
        let l = self;
        let g = l.g;
        let n = g.nodes.len();
        // Fusion: an elementwise node whose users are all elementwise and already in
        // one group, with no kernel call between it and them, joins that group (so a
        // value used twice inside one chain, as in `t * sigmoid(t)`, is computed once
        // in registers); results and other nodes root their own group.
        let is_output = |x: usize| g.outputs.contains(&NodeId(x as u32));
        let mut root_of: Vec<NodeId> = (0..n).map(|i| NodeId(i as u32)).collect();
        for i in (0..n).rev() {
            let id = NodeId(i as u32);
            let users = &l.consumers[i];
            if !is_elementwise(g, id) || is_output(i) || users.is_empty() {
                continue;
            }
            let root = root_of[users[0].0 as usize];
            let last = users.iter().map(|u| u.0 as usize).max().unwrap_or(i);
            let effect_between = g.nodes[i + 1..last].iter().any(|x| {
                matches!(
                    x.kind,
                    NodeKind::KernelCall { .. }
                        | NodeKind::If { .. }
                        | NodeKind::For { .. }
                        | NodeKind::While { .. }
                )
            });
            if !effect_between
                && users
                    .iter()
                    .all(|u| is_elementwise(g, *u) && root_of[u.0 as usize] == root)
            {
                root_of[i] = root;
            }
        }
        for i in 0..n {
            let id = NodeId(i as u32);
            let node = g.node(id);
            if absorbed[i] || node.ty.is_scalar() || matches!(node.kind, NodeKind::Param(_)) {
                continue;
            }
            let out = out_for.get(&id).copied();
            if is_elementwise(g, id) {
                if root_of[i] != id {
                    continue;
                }
                let members: Vec<NodeId> = (0..=i)
                    .map(|j| NodeId(j as u32))
                    .filter(|&j| root_of[j.0 as usize] == id && is_elementwise(g, j))
                    .collect();
                let dims = node.ty.dims().to_vec();
                let b = match out {
                    Some(b) => b,
                    None => l.temp(dims, node.ty.dtype().unwrap_or(DType::F32)),
                };
                l.fused(
                    &Group {
                        members,
                        root: id,
                        copy: false,
                    },
                    b,
                )?;
                l.buf_of.insert(id, b);
                continue;
            }
            match &node.kind {
            NodeKind::MatMul { .. } => match attention.remove(&i) {
                Some(m) => l.lower_attention(id, m, out)?,
                None => l.lower_matmul(id, out)?,
            },
            NodeKind::Reduce { op, x, axis, .. }
                if !(*op != ReduceKind::Min
                    && *axis == Some(g.ty(*x).dims().len().saturating_sub(1))
                    && g.ty(*x).dtype() == Some(DType::F32)
                    && l.buf(*x, id)
                        .is_ok_and(|b| l.buffers[b.0 as usize].dtype == DType::F32)) =>
            {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.reduce_generated(id, b)?;
                l.buf_of.insert(id, b);
            }
            NodeKind::LayerNorm { .. } | NodeKind::RmsNorm { .. } if !l.norm_fits_std(id) => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.norm_generated(id, b)?;
                l.buf_of.insert(id, b);
            }
            NodeKind::Softmax { x, axis }
                if !(*axis + 1 == g.ty(*x).dims().len()
                    && g.ty(*x).dtype() == Some(DType::F32)
                    && l.buf(*x, id)
                        .is_ok_and(|b| l.buffers[b.0 as usize].dtype == DType::F32)) =>
            {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.softmax_generated(id, b)?;
                l.buf_of.insert(id, b);
            }
            NodeKind::Softmax { .. }
            | NodeKind::LayerNorm { .. }
            | NodeKind::RmsNorm { .. }
            | NodeKind::Reduce { .. } => l.lower_rows(id, out)?,
            NodeKind::Reshape { x } => {
                let base = l.buf(*x, id)?;
                let name = format!("v{}", l.buffers.len());
                let dtype = l.buffers[base.0 as usize].dtype;
                let v = l.add_buffer(name, BufKind::View(base), node.ty.dims().to_vec(), dtype);
                l.buf_of.insert(id, v);
            }
            NodeKind::Fill(Fill::Empty) => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.buffers[b.0 as usize].alloc = true;
                l.buf_of.insert(id, b);
            }
            NodeKind::KernelCall {
                kernel,
                grid,
                args,
                consts,
            } => {
                let mut largs = Vec::new();
                let mut writes = Vec::new();
                for (name, a) in args {
                    if g.ty(*a).is_scalar() {
                        largs.push((name.clone(), Arg::Scalar(l.scalar(*a)?)));
                    } else {
                        let b = l.buf_as(*a, id)?;
                        writes.push(b);
                        largs.push((
                            name.clone(),
                            Arg::Buffer {
                                buf: b,
                                dims: g.ty(*a).dims().to_vec(),
                            },
                        ));
                    }
                }
                let grid = match grid {
                    Some(gr) => Some(gr.iter().map(|x| l.scalar(*x)).collect::<R<Vec<_>>>()?),
                    None => None,
                };
                l.launch(Launch {
                    kernel: KernelRef::User(kernel.clone()),
                    nodes: vec![id],
                    grid,
                    args: largs,
                    consts: consts
                        .iter()
                        .map(|(n, v)| (n.clone(), v.to_string()))
                        .collect(),
                    requires: vec![],
                    writes,
                });
            }
            NodeKind::Transpose { .. } => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.transpose(id, b)?;
                l.buf_of.insert(id, b);
            }
            // Bound when their control-flow node was lowered.
            NodeKind::Project { .. } => {}
            NodeKind::If {
                cond,
                then,
                otherwise,
            } => {
                let c = l.host_condition(*cond, id)?;
                let slots = l.result_slots(&region_types(then), "r");
                let then = l.lower_region(then, &[], &slots)?;
                let otherwise = l.lower_region(otherwise, &[], &slots)?;
                l.steps.push(Step::If {
                    cond: c,
                    then,
                    otherwise,
                });
                l.bind_results(id, &slots);
            }
            NodeKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let (lo, hi, step) = (
                    l.scalar_as(*lo, Some(DType::I32))?,
                    l.scalar_as(*hi, Some(DType::I32))?,
                    l.scalar_as(*step, Some(DType::I32))?,
                );
                let slots = l.carried_slots(init)?;
                let var = l.fresh_var("i");
                let mut leading = vec![Slot::Scalar(ScalarExpr::Var(var.clone()))];
                leading.extend(slots.iter().cloned());
                let body = l.lower_region(body, &leading, &slots)?;
                l.steps.push(Step::For {
                    var,
                    lo,
                    hi,
                    step,
                    body,
                });
                l.bind_results(id, &slots);
            }
            NodeKind::While { init, cond, body } => {
                let slots = l.carried_slots(init)?;
                let test = l.fresh_var("c");
                let cond = l.lower_region(cond, &slots, &[Slot::Scalar(ScalarExpr::Var(test.clone()))])?;
                let body = l.lower_region(body, &slots, &slots)?;
                l.steps.push(Step::While {
                    cond,
                    test: ScalarExpr::Var(test),
                    body,
                });
                l.bind_results(id, &slots);
            }
            NodeKind::Slice { x, axes } => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                let zero = || ScalarExpr::Const(Constant::Int(0));
                let mut src = Vec::with_capacity(axes.len());
                let mut k = 0;
                for a in axes {
                    src.push(match a {
                        SliceAxis::Index(i) => SrcAxis::Fixed(l.scalar_as(*i, Some(DType::I32))?),
                        SliceAxis::Full => SrcAxis::Out {
                            k,
                            offset: zero(),
                            wrap: false,
                        },
                        SliceAxis::Range { start } => SrcAxis::Out {
                            k,
                            offset: ScalarExpr::Index(start.clone()),
                            wrap: false,
                        },
                    });
                    if !matches!(a, SliceAxis::Index(_)) {
                        k += 1;
                    }
                }
                l.gather_copy(id, *x, src, b)?;
                l.buf_of.insert(id, b);
            }
            NodeKind::Fill(Fill::Data(values)) => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.steps.push(Step::HostData {
                    buf: b,
                    values: values.clone(),
                    node: id,
                });
                l.buf_of.insert(id, b);
            }
            NodeKind::Fill(Fill::Randn { seed }) => {
                if !node.ty.dtype().is_some_and(DType::is_float) {
                    return Err(l.unsupported(
                        id,
                        format!("`randn` of `{}` (normal samples are floats)", node.ty),
                    ));
                }
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                let seed = match seed {
                    Some(s) => l.scalar_as(*s, Some(DType::I64))?,
                    None => ScalarExpr::Const(Constant::Int(0)),
                };
                l.steps.push(Step::HostRandn {
                    buf: b,
                    seed,
                    node: id,
                });
                l.buf_of.insert(id, b);
            }
            NodeKind::Call {
                func, args, consts, ..
            } if consts.is_empty() && node.ty.is_tensor() => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                let mut cargs = Vec::new();
                for (name, a) in args {
                    cargs.push((
                        name.clone(),
                        if g.ty(*a).is_scalar() {
                            Arg::Scalar(l.scalar(*a)?)
                        } else {
                            Arg::Buffer {
                                buf: l.buf_as(*a, id)?,
                                dims: g.ty(*a).dims().to_vec(),
                            }
                        },
                    ));
                }
                l.steps.push(Step::Call {
                    func: func.clone(),
                    node: id,
                    args: cargs,
                    out: b,
                });
                l.buf_of.insert(id, b);
            }
            NodeKind::Collective { op, x } => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                let input = l.buf_as(*x, id)?;
                l.steps.push(Step::Collective {
                    op: *op,
                    input,
                    output: b,
                    node: id,
                });
                l.buf_of.insert(id, b);
            }
            NodeKind::Call { func, .. } => {
                return Err(l.unsupported(
                    id,
                    format!("the call to `{func}`: its definition cannot be found, its dims do not bind, it takes const arguments or it returns no tensor"),
                ))
            }
            other => return Err(l.unsupported(id, format!("{other:?}"))),
        }
            // The maximum, minimum or mean of nothing has no value: checked at
            // run time unless the extent is known to be positive (E0317).
            if let NodeKind::Reduce { op, x, axis, .. } = &node.kind {
                let xd = g.ty(*x).dims();
                let reduced = match axis {
                    Some(j) => xd.get(*j).cloned(),
                    None => product(xd),
                };
                // A constant 0 reaches here from a function specialised on
                // the sizes it is called with.
                let unproven = reduced.filter(|d| d.as_const().is_none_or(|c| c <= 0));
                if let (false, Some(extent)) = (*op == ReduceKind::Sum, unproven) {
                    if let Some(Step::Launch(last)) = l.steps.last_mut() {
                        let name = format!("{op:?}").to_lowercase();
                        last.requires.push(format!("nonempty {name}: {extent}"));
                    }
                }
            }
        }
        Ok(())
    }
}
