//! Inlining calls to other whole-tensor functions: the callee's graph with its
//! dims substituted for the call's, its nodes taking the call's span.

use std::collections::HashMap;

use super::{map_operands, regions_mut, GParam, GType, Graph, Node, NodeId, NodeKind, SliceAxis};
use crate::check::dims::Dim;
use crate::check::generics::{bind_call, CallArg, TypeEnv};
use crate::check::scope::FnSig;
use crate::check::{Ty, Value};
use crate::ir::tile::Constant;
use crate::syntax::span::Span;

fn subst_type(t: &GType, env: &dyn Fn(&str) -> Option<Dim>) -> Option<GType> {
    Some(match t {
        GType::Tensor { dims, dtype } => GType::Tensor {
            dims: dims
                .iter()
                .map(|d| d.substitute(env))
                .collect::<Option<Vec<_>>>()?,
            dtype: *dtype,
        },
        other => other.clone(),
    })
}

/// Inlines calls to other whole-tensor functions. `resolve` gives the (already
/// inlined) graph of a callee for the const arguments of the call, or `None` to
/// keep the call (callee not found, a recursive call, const arguments it cannot
/// specialise on). A call whose dims do not bind is kept too. Inlined nodes take
/// the call's span.
/// A generic callee's instance (its dtype variables and batch runs as the
/// call's arguments bind them) is passed too; it is empty for other callees.
pub type Resolver<'a> =
    dyn FnMut(&FnSig, &[(String, Value)], &TypeEnv) -> Option<std::sync::Arc<Graph>> + 'a;

/// The instance of a generic callee that a call's argument types bind
/// (`None` when they do not bind, which the checker has reported).
fn call_env(
    sig: &FnSig,
    args: &[(String, NodeId)],
    ty: &dyn Fn(NodeId) -> GType,
) -> Option<TypeEnv> {
    if sig.generics.is_none() {
        return Some(TypeEnv::default());
    }
    let tys: Vec<(usize, Ty)> = args
        .iter()
        .filter_map(|(name, a)| {
            let j = sig.params.iter().position(|p| p.name == *name)?;
            let t = match ty(*a) {
                GType::Tensor { dims, dtype } => Ty::Tensor { dims, dtype },
                GType::Scalar(dtype) => Ty::scalar(dtype),
                GType::Unit => return None,
            };
            Some((j, t))
        })
        .collect();
    let cargs: Vec<CallArg<'_>> = tys
        .iter()
        .map(|(j, t)| CallArg {
            param: *j,
            ty: t,
            span: Span::new(0, 0),
        })
        .collect();
    bind_call(sig, &cargs).ok()
}

pub fn inline(g: &Graph, resolve: &mut Resolver<'_>) -> Graph {
    let mut nodes: Vec<Node> = Vec::new();
    let mut map: Vec<NodeId> = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        let remap = |x: NodeId| map[x.0 as usize];
        if let NodeKind::Call {
            sig, args, consts, ..
        } = &n.kind
        {
            let env = call_env(sig, args, &|a| nodes[remap(a).0 as usize].ty.clone());
            if let Some(callee) = env.and_then(|env| resolve(sig, consts, &env)) {
                if let Some(out) = inline_one(&mut nodes, &callee, args, &remap, n.span) {
                    map.push(out);
                    continue;
                }
            }
        }
        let mut kind = map_operands(&n.kind, &remap);
        for r in regions_mut(&mut kind) {
            r.graph = std::sync::Arc::new(inline(&r.graph, resolve));
        }
        map.push(NodeId(nodes.len() as u32));
        nodes.push(Node {
            kind,
            ty: n.ty.clone(),
            span: n.span,
        });
    }
    Graph {
        name: g.name.clone(),
        params: g.params.clone(),
        nodes,
        outputs: g.outputs.iter().map(|o| map[o.0 as usize]).collect(),
    }
}

/// A node kind with the dims it names substituted (inside regions too), or
/// `None` when a dim does not bind.
fn subst_kind(kind: NodeKind, env: &dyn Fn(&str) -> Option<Dim>, span: Span) -> Option<NodeKind> {
    Some(match kind {
        NodeKind::Index(d) => NodeKind::Index(d.substitute(env)?),
        NodeKind::Slice { x, axes } => NodeKind::Slice {
            x,
            axes: axes
                .into_iter()
                .map(|a| match a {
                    SliceAxis::Range { start } => start
                        .substitute(env)
                        .map(|start| SliceAxis::Range { start }),
                    a => Some(a),
                })
                .collect::<Option<Vec<_>>>()?,
        },
        mut k => {
            for r in regions_mut(&mut k) {
                r.graph = std::sync::Arc::new(subst_graph(&r.graph, env, span)?);
            }
            k
        }
    })
}

/// A region's graph with dims substituted and every span set to `span`.
fn subst_graph(g: &Graph, env: &dyn Fn(&str) -> Option<Dim>, span: Span) -> Option<Graph> {
    Some(Graph {
        name: g.name.clone(),
        params: g
            .params
            .iter()
            .map(|p| {
                Some(GParam {
                    name: p.name.clone(),
                    ty: subst_type(&p.ty, env)?,
                })
            })
            .collect::<Option<Vec<_>>>()?,
        nodes: g
            .nodes
            .iter()
            .map(|n| {
                Some(Node {
                    kind: subst_kind(n.kind.clone(), env, span)?,
                    ty: subst_type(&n.ty, env)?,
                    span,
                })
            })
            .collect::<Option<Vec<_>>>()?,
        outputs: g.outputs.clone(),
    })
}

/// Appends the callee's nodes; returns its result node (or `None`, leaving
/// `nodes` as it was, when the call cannot be inlined).
fn inline_one(
    nodes: &mut Vec<Node>,
    callee: &Graph,
    args: &[(String, NodeId)],
    remap: &dyn Fn(NodeId) -> NodeId,
    span: Span,
) -> Option<NodeId> {
    let [out] = callee.outputs[..] else {
        return None;
    };
    // Bind the callee's dim names to the argument dims.
    let mut dims: HashMap<String, Dim> = HashMap::new();
    let mut bound: HashMap<usize, NodeId> = HashMap::new();
    for (i, p) in callee.params.iter().enumerate() {
        let (_, a) = args.iter().find(|(n, _)| *n == p.name)?;
        let a = remap(*a);
        let at = &nodes[a.0 as usize].ty;
        if let (GType::Tensor { dims: pd, .. }, GType::Tensor { dims: ad, .. }) = (&p.ty, at) {
            if pd.len() != ad.len() {
                return None;
            }
            for (pd, ad) in pd.iter().zip(ad) {
                if let Some(s) = pd.as_symbol() {
                    match dims.get(s) {
                        Some(prev) if prev != ad => return None,
                        _ => {
                            dims.insert(s.to_string(), ad.clone());
                        }
                    }
                }
            }
        }
        // A shape computed from an integer parameter (`zeros([n], f32)`) names
        // the parameter's symbol: bound by a known argument too.
        if matches!(p.ty, GType::Scalar(d) if d.is_int()) && !dims.contains_key(&p.name) {
            match &nodes[a.0 as usize].kind {
                NodeKind::Const(Constant::Int(v)) => {
                    dims.insert(p.name.clone(), Dim::constant(*v));
                }
                NodeKind::Index(d) => {
                    dims.insert(p.name.clone(), d.clone());
                }
                _ => {}
            }
        }
        bound.insert(i, a);
    }
    let env = |s: &str| dims.get(s).cloned();
    let start = nodes.len();
    let mut local: Vec<NodeId> = Vec::with_capacity(callee.nodes.len());
    for n in &callee.nodes {
        if let NodeKind::Param(i) = n.kind {
            local.push(*bound.get(&i)?);
            continue;
        }
        let Some(kind) = subst_kind(map_operands(&n.kind, &|x| local[x.0 as usize]), &env, span)
        else {
            nodes.truncate(start);
            return None;
        };
        let Some(ty) = subst_type(&n.ty, &env) else {
            nodes.truncate(start);
            return None;
        };
        local.push(NodeId(nodes.len() as u32));
        nodes.push(Node { kind, ty, span });
    }
    Some(local[out.0 as usize])
}
