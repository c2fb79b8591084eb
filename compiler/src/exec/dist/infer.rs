//! How a whole-tensor function runs when some arguments are distributed.
//!
//! Every device runs the same function on its own parts (SPMD). That gives the
//! right value only where each op is local under the placements: [`infer`]
//! walks the function's Graph IR from the arguments' placements and gives each
//! node a placement by the op's rule (below), or an error naming the op that
//! would need data of another device. A whole (replicated) tensor argument that
//! meets a sharded one along the sharded axis is *demanded* sharded the same
//! way: the caller splits it before the call, so `xs + b` works with a host `b`.
//!
//! | op | rule |
//! |----|------|
//! | unary, cast, activation | the operand's placement |
//! | elementwise (broadcasting) | sharded operands on the same output axis; a whole operand with that axis is split (a parameter) or an error |
//! | matmul | rows of `a` sharded: rows of the result; columns of `b`: columns; the contraction axis of both: a partial sum; a batch axis: that axis |
//! | softmax, layer_norm, rms_norm | local unless they normalise along the sharded axis (error) |
//! | sum/max/min | along another axis: sharded; along the sharded axis (or all axes): partial |
//! | mean along the sharded axis | an error (the devices' counts differ): `sum(...) / n` |
//! | transpose, slices keeping the axis whole, reshapes keeping the dims up to it | the axis moves with them |
//! | creation ops | replicated (every device makes its own) |
//! | kernel launches, run-time control flow | only on replicated values |
//!
//! A partial value may only be returned, negated, or scaled by a whole scalar
//! (for a partial sum); anything else needs the `all_reduce` that makes it whole.
//!
//! [`localize`] then makes the graph each device runs: every sharded value's
//! sharded axis becomes a symbol each device binds to its part's length, while
//! every other size (and every size the program reads, `x.shape[0]`) stays the
//! whole tensor's.

use super::{Placement, ReduceOp};
use crate::check::dims::Dim;
use crate::ir::graph::{Collective, Graph, NodeId, NodeKind, ReduceKind, SliceAxis};
use crate::ir::tile::{BinaryOp, UnaryOp};
use crate::syntax::span::Span;

/// The code of a program that cannot run per device.
pub const E_PLACEMENT: &str = "E0738";

/// An op that cannot run on the devices' parts; `span` is item-relative.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacementError {
    pub message: String,
    pub help: String,
    pub span: Span,
}

/// What [`infer`] decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Inferred {
    /// Each parameter's placement: the argument's, or `Sharded` where a whole
    /// tensor argument must be split before the call.
    pub params: Vec<Placement>,
    /// Each output's placement.
    pub outputs: Vec<Placement>,
    /// Each node's placement (for [`localize`]).
    pub nodes: Vec<Placement>,
}

fn err(span: Span, message: impl Into<String>, help: impl Into<String>) -> PlacementError {
    PlacementError {
        message: message.into(),
        help: help.into(),
        span,
    }
}

const REDUCE_FIRST: &str =
    "`all_reduce` the partial value first (or `gather` it), then use the whole value";

/// The placements of `graph`'s nodes and outputs when its parameters are
/// placed as `params` (scalars and whole tensors: `Replicated`).
pub fn infer(graph: &Graph, params: &[Placement]) -> Result<Inferred, PlacementError> {
    let mut params = params.to_vec();
    // Each round either finishes or demands one more parameter be split.
    for _ in 0..=params.len() {
        match walk(graph, &params)? {
            Walk::Done(nodes) => {
                let outputs = graph.outputs.iter().map(|o| nodes[o.0 as usize]).collect();
                return Ok(Inferred {
                    params,
                    outputs,
                    nodes,
                });
            }
            Walk::Demand(p, axis) => params[p] = Placement::Sharded { axis },
        }
    }
    Err(err(
        graph.nodes.first().map(|n| n.span).unwrap_or_default(),
        "the placements of this function's arguments do not settle",
        "gather the distributed arguments, or shard them all along one axis",
    ))
}

enum Walk {
    Done(Vec<Placement>),
    /// Parameter `.0` must be sharded along `.1`.
    Demand(usize, usize),
}

fn walk(graph: &Graph, params: &[Placement]) -> Result<Walk, PlacementError> {
    let mut at: Vec<Placement> = Vec::with_capacity(graph.nodes.len());
    for (i, node) in graph.nodes.iter().enumerate() {
        let p = |id: &NodeId| at[id.0 as usize];
        let rank = |id: &NodeId| graph.ty(*id).dims().len();
        let span = node.span;
        let placed = match &node.kind {
            NodeKind::Param(k) => params.get(*k).copied().unwrap_or(Placement::Replicated),
            NodeKind::Const(_) | NodeKind::Index(_) | NodeKind::Fill(_) => Placement::Replicated,
            NodeKind::Unary { op, x } => match p(x) {
                Placement::Partial(ReduceOp::Sum) if *op == UnaryOp::Neg => p(x),
                Placement::Partial(op) => return Err(partial(span, op)),
                other => other,
            },
            NodeKind::Activation { x, .. } | NodeKind::Cast { x, .. } => match p(x) {
                Placement::Partial(op) => return Err(partial(span, op)),
                other => other,
            },
            NodeKind::Binary { op, a, b } => {
                // A partial sum scaled by a whole scalar stays a partial sum.
                let scalar = |id: &NodeId| graph.ty(*id).dims().is_empty() && p(id) == Placement::Replicated;
                match (p(a), p(b)) {
                    (Placement::Partial(ReduceOp::Sum), _)
                        if matches!(op, BinaryOp::Mul | BinaryOp::Div) && scalar(b) =>
                    {
                        Placement::Partial(ReduceOp::Sum)
                    }
                    (_, Placement::Partial(ReduceOp::Sum)) if *op == BinaryOp::Mul && scalar(a) => {
                        Placement::Partial(ReduceOp::Sum)
                    }
                    _ => match elementwise(graph, &at, node.ty.dims().len(), &[*a, *b], span)? {
                        Ok(pl) => pl,
                        Err(demand) => return Ok(demand),
                    },
                }
            }
            NodeKind::Select { cond, a, b } => {
                match elementwise(graph, &at, node.ty.dims().len(), &[*cond, *a, *b], span)? {
                    Ok(pl) => pl,
                    Err(demand) => return Ok(demand),
                }
            }
            NodeKind::MatMul { a, b, .. } => match matmul(graph, &at, *a, *b, node.ty.dims().len(), span)? {
                Ok(pl) => pl,
                Err(demand) => return Ok(demand),
            },
            NodeKind::Softmax { x, axis } => match p(x) {
                Placement::Sharded { axis: s } if s == *axis => {
                    return Err(err(
                        span,
                        format!("softmax along axis {axis}, the axis the tensor is sharded on, needs every device's part"),
                        "shard another axis (softmax is then per device), or `gather` the tensor first",
                    ))
                }
                Placement::Partial(op) => return Err(partial(span, op)),
                other => other,
            },
            NodeKind::LayerNorm { x, weight, bias, .. } => {
                norm(&at, *x, weight.iter().chain(bias.iter()), rank(x), "layer_norm", span)?
            }
            NodeKind::RmsNorm { x, weight, .. } => norm(&at, *x, weight.iter(), rank(x), "rms_norm", span)?,
            NodeKind::Reduce {
                op,
                x,
                axis,
                keepdims,
            } => match (p(x), axis) {
                (Placement::Partial(op), _) => return Err(partial(span, op)),
                (Placement::Sharded { axis: s }, a) if a.is_none_or(|a| a == s) => match op {
                    ReduceKind::Sum => Placement::Partial(ReduceOp::Sum),
                    ReduceKind::Max => Placement::Partial(ReduceOp::Max),
                    ReduceKind::Min => Placement::Partial(ReduceOp::Min),
                    ReduceKind::Mean => {
                        return Err(err(
                            span,
                            format!("mean along axis {s}, the axis the tensor is sharded on: each device holds a different number of its elements"),
                            "write it as `sum(...)` divided by the axis's length (a partial sum), then `all_reduce` it",
                        ))
                    }
                },
                (Placement::Sharded { axis: s }, Some(a)) => Placement::Sharded {
                    axis: if !keepdims && *a < s { s - 1 } else { s },
                },
                (other, _) => other,
            },
            // As the host collectives (`super::all_reduce`, `super::broadcast`)
            // place their results.
            NodeKind::Collective { op, x } => match (op, p(x)) {
                (Collective::AllReduce(_) | Collective::Broadcast { .. }, Placement::Sharded { axis }) => {
                    Placement::Sharded { axis }
                }
                (Collective::AllReduce(_) | Collective::Broadcast { .. }, _) => Placement::Replicated,
                (Collective::Shard { axis }, Placement::Replicated) => Placement::Sharded { axis: *axis },
                (Collective::Shard { .. }, _) => {
                    return Err(err(
                        span,
                        "`shard` takes a whole tensor; this one is already distributed",
                        "`all_gather` it first to shard it another way",
                    ))
                }
                (Collective::AllGather { .. }, Placement::Partial(op)) => return Err(partial(span, op)),
                (Collective::AllGather { .. }, _) => Placement::Replicated,
                (Collective::ReduceScatter { axis, .. }, Placement::Replicated | Placement::Partial(_)) => {
                    Placement::Sharded { axis: *axis }
                }
                (Collective::ReduceScatter { .. }, Placement::Sharded { .. }) => {
                    return Err(err(
                        span,
                        "`reduce_scatter` takes a tensor every device holds whole (partial or replicated); this one is sharded",
                        "`all_reduce` combines equal shards; `all_gather` first to reduce-scatter the whole",
                    ))
                }
            },
            NodeKind::Transpose { x, a, b } => match p(x) {
                Placement::Sharded { axis } if axis == *a => Placement::Sharded { axis: *b },
                Placement::Sharded { axis } if axis == *b => Placement::Sharded { axis: *a },
                Placement::Partial(op) => return Err(partial(span, op)),
                other => other,
            },
            NodeKind::Slice { x, axes } => match p(x) {
                Placement::Sharded { axis } => {
                    if !matches!(axes.get(axis), Some(SliceAxis::Full) | None) {
                        return Err(err(
                            span,
                            format!("this subscript indexes or slices axis {axis}, the axis the tensor is sharded on"),
                            "take the sharded axis whole (`:`) here, or `gather` the tensor first",
                        ));
                    }
                    let dropped = axes[..axis].iter().filter(|a| matches!(a, SliceAxis::Index(_))).count();
                    Placement::Sharded { axis: axis - dropped }
                }
                Placement::Partial(op) => return Err(partial(span, op)),
                Placement::Replicated => Placement::Replicated,
            },
            NodeKind::Reshape { x } => match p(x) {
                Placement::Sharded { axis } => {
                    let (from, to) = (graph.ty(*x).dims(), node.ty.dims());
                    if to.len() <= axis || from[..=axis] != to[..=axis] {
                        return Err(err(
                            span,
                            format!("this reshape changes the axes up to axis {axis}, the axis the tensor is sharded on"),
                            "reshape only the axes after the sharded one, or `gather` the tensor first",
                        ));
                    }
                    Placement::Sharded { axis }
                }
                Placement::Partial(op) => return Err(partial(span, op)),
                Placement::Replicated => Placement::Replicated,
            },
            kind @ (NodeKind::KernelCall { .. }
            | NodeKind::If { .. }
            | NodeKind::For { .. }
            | NodeKind::While { .. }
            | NodeKind::Project { .. }
            | NodeKind::Call { .. }) => {
                let mut reads = crate::ir::graph::operands(kind);
                for r in crate::ir::graph::regions(kind) {
                    reads.extend(r.captures.iter().copied());
                }
                if reads.iter().any(|r| p(r) != Placement::Replicated) {
                    let what = match kind {
                        NodeKind::KernelCall { kernel, .. } => format!("the launch of `{kernel}`"),
                        NodeKind::Call { func, .. } => format!("the call of `{func}`"),
                        _ => "run-time control flow (`if`, `for`, `while` on values known only when it runs)".to_string(),
                    };
                    return Err(err(
                        span,
                        format!("{what} is given a distributed tensor: that does not run per device yet"),
                        "`gather` the tensor and run this on one device, or keep it out of the function",
                    ));
                }
                Placement::Replicated
            }
        };
        debug_assert_eq!(at.len(), i);
        at.push(placed);
    }
    Ok(Walk::Done(at))
}

fn partial(span: Span, op: ReduceOp) -> PlacementError {
    err(
        span,
        format!(
            "this uses a partial value (each device holds a part; the value is their {}) as if it were whole",
            op.name()
        ),
        REDUCE_FIRST,
    )
}

/// The placement of an elementwise op of rank `out_rank` over `operands`
/// (numpy broadcasting aligns axes from the right), or the demand that a
/// whole parameter be split.
fn elementwise(
    graph: &Graph,
    at: &[Placement],
    out_rank: usize,
    operands: &[NodeId],
    span: Span,
) -> Result<Result<Placement, Walk>, PlacementError> {
    let mut sharded: Option<usize> = None;
    for o in operands {
        let rank = graph.ty(*o).dims().len();
        match at[o.0 as usize] {
            Placement::Partial(op) => return Err(partial(span, op)),
            Placement::Sharded { axis } => {
                let out = axis + (out_rank - rank);
                if sharded.is_some_and(|s| s != out) {
                    return Err(err(
                        span,
                        "the operands are sharded on different axes",
                        "shard both along the same axis (or `gather` one of them)",
                    ));
                }
                sharded = Some(out);
            }
            Placement::Replicated => {}
        }
    }
    let Some(out) = sharded else {
        return Ok(Ok(Placement::Replicated));
    };
    for o in operands {
        if at[o.0 as usize] != Placement::Replicated {
            continue;
        }
        let dims = graph.ty(*o).dims();
        let lead = out_rank - dims.len();
        if out < lead || dims[out - lead].is_one() {
            continue; // broadcast along the sharded axis: every device uses it whole
        }
        let axis = out - lead;
        return match graph.node(*o).kind {
            NodeKind::Param(p) => Ok(Err(Walk::Demand(p, axis))),
            _ => Err(err(
                graph.node(*o).span,
                format!("this whole tensor meets a tensor sharded on axis {out}, along that axis"),
                "shard it too (`shard(..., axis=...)` before the call), or compute it from sharded values",
            )),
        };
    }
    Ok(Ok(Placement::Sharded { axis: out }))
}

fn matmul(
    graph: &Graph,
    at: &[Placement],
    a: NodeId,
    b: NodeId,
    out_rank: usize,
    span: Span,
) -> Result<Result<Placement, Walk>, PlacementError> {
    let (ra, rb) = (graph.ty(a).dims().len(), graph.ty(b).dims().len());
    let (pa, pb) = (at[a.0 as usize], at[b.0 as usize]);
    for pl in [pa, pb] {
        if let Placement::Partial(op) = pl {
            return Err(partial(span, op));
        }
    }
    let demand = |id: NodeId, axis: usize| -> Result<Result<Placement, Walk>, PlacementError> {
        match graph.node(id).kind {
            NodeKind::Param(p) => Ok(Err(Walk::Demand(p, axis))),
            _ => Err(err(
                graph.node(id).span,
                "this whole operand of a matmul whose other operand is sharded along the contraction axis must be sharded along it too",
                "shard it along its contraction axis before the call",
            )),
        }
    };
    let unsupported = || {
        err(
            span,
            "this matmul's operands are sharded in a way that needs another device's data",
            "shard `a` by rows, `b` by columns, or both along the contraction axis (a partial sum)",
        )
    };
    if ra < 2 || rb < 2 {
        return if pa == Placement::Replicated && pb == Placement::Replicated {
            Ok(Ok(Placement::Replicated))
        } else {
            Err(unsupported())
        };
    }
    match (pa, pb) {
        (Placement::Replicated, Placement::Replicated) => Ok(Ok(Placement::Replicated)),
        (Placement::Sharded { axis }, Placement::Replicated) if axis == ra - 2 => {
            Ok(Ok(Placement::Sharded { axis: out_rank - 2 }))
        }
        (Placement::Replicated, Placement::Sharded { axis }) if axis == rb - 1 => {
            Ok(Ok(Placement::Sharded { axis: out_rank - 1 }))
        }
        (Placement::Sharded { axis }, Placement::Replicated) if axis == ra - 1 => demand(b, rb - 2),
        (Placement::Replicated, Placement::Sharded { axis }) if axis == rb - 2 => demand(a, ra - 1),
        (Placement::Sharded { axis: x }, Placement::Sharded { axis: y })
            if x == ra - 1 && y == rb - 2 =>
        {
            Ok(Ok(Placement::Partial(ReduceOp::Sum)))
        }
        // Batch axes: aligned from the right of the batch dims.
        (Placement::Sharded { axis }, other) if axis < ra - 2 => {
            batch(graph, axis + (out_rank - ra), other, b, out_rank, span)
        }
        (other, Placement::Sharded { axis }) if axis < rb - 2 => {
            batch(graph, axis + (out_rank - rb), other, a, out_rank, span)
        }
        _ => Err(unsupported()),
    }
}

/// A matmul sharded along batch axis `out` (of the result): the other operand
/// `other_id` (placed `other`) is sharded there too, broadcasts along it, or
/// is a parameter to split.
fn batch(
    graph: &Graph,
    out: usize,
    other: Placement,
    other_id: NodeId,
    out_rank: usize,
    span: Span,
) -> Result<Result<Placement, Walk>, PlacementError> {
    let dims = graph.ty(other_id).dims();
    let lead = out_rank - dims.len();
    match other {
        Placement::Sharded { axis } if axis + lead == out => Ok(Ok(Placement::Sharded { axis: out })),
        Placement::Replicated if out < lead || dims[out - lead].is_one() => {
            Ok(Ok(Placement::Sharded { axis: out }))
        }
        Placement::Replicated => match graph.node(other_id).kind {
            NodeKind::Param(p) => Ok(Err(Walk::Demand(p, out - lead))),
            _ => Err(err(
                span,
                format!("this matmul's batch axis {out} is sharded in one operand and whole in the other"),
                "shard both operands along the batch axis",
            )),
        },
        _ => Err(err(
            span,
            "this matmul's operands are sharded on different axes",
            "shard both operands along the same batch axis",
        )),
    }
}

/// `layer_norm`/`rms_norm` normalise along the last axis: local unless that
/// axis is the sharded one; weight and bias (along the last axis) stay whole.
fn norm<'a>(
    at: &[Placement],
    x: NodeId,
    affine: impl Iterator<Item = &'a NodeId>,
    rank: usize,
    what: &str,
    span: Span,
) -> Result<Placement, PlacementError> {
    let px = at[x.0 as usize];
    match px {
        Placement::Partial(op) => return Err(partial(span, op)),
        Placement::Sharded { axis } if axis + 1 == rank => {
            return Err(err(
                span,
                format!("{what} normalises along the last axis, the axis the tensor is sharded on"),
                "shard another axis (the rows), or `gather` the tensor first",
            ))
        }
        _ => {}
    }
    for w in affine {
        if at[w.0 as usize] != Placement::Replicated {
            return Err(err(
                span,
                format!("the weight or bias of {what} is distributed"),
                "pass the weight and bias whole",
            ));
        }
    }
    Ok(px)
}

/// The graph each device runs: `global` with every sharded value's dim
/// along its sharded axis replaced by a symbol that each device binds to its
/// part's length (`numpy.array_split` of the whole length over the devices),
/// and each `all_gather` told its axis. Returns the graph and each symbol with
/// the whole length it splits. Every other dim, and every value read from a
/// dim (`x.shape[0]`), keeps the whole tensor's size.
pub fn localize(
    global: &Graph,
    inferred: &Inferred,
) -> Result<(Graph, Vec<(String, i64)>), PlacementError> {
    let mut symbols: Vec<(String, i64)> = Vec::new();
    let mut local_dims =
        |dims: &[Dim], placement: Placement, span: Span| -> Result<Vec<Dim>, PlacementError> {
            let Placement::Sharded { axis } = placement else {
                return Ok(dims.to_vec());
            };
            let Some(extent) = dims.get(axis).and_then(Dim::as_const) else {
                return Err(err(
                    span,
                    "the length of this value's sharded axis is not known when the call is made",
                    "give the sharded axis a fixed length, or `gather` the tensor first",
                ));
            };
            let name = match symbols.iter().find(|(_, e)| *e == extent) {
                Some((n, _)) => n.clone(),
                None => {
                    let n = format!("__shard{}", symbols.len());
                    symbols.push((n.clone(), extent));
                    n
                }
            };
            let mut out = dims.to_vec();
            out[axis] = Dim::symbol(name);
            Ok(out)
        };
    let mut g = global.clone();
    let first_span = global.nodes.first().map(|n| n.span).unwrap_or_default();
    for (p, placement) in g.params.iter_mut().zip(&inferred.params) {
        if let crate::ir::graph::GType::Tensor { dims, .. } = &mut p.ty {
            *dims = local_dims(dims, *placement, first_span)?;
        }
    }
    for (i, node) in g.nodes.iter_mut().enumerate() {
        let placement = inferred.nodes[i];
        if let crate::ir::graph::GType::Tensor { dims, .. } = &mut node.ty {
            *dims = local_dims(dims, placement, node.span)?;
        }
        if let NodeKind::Collective { op, x } = &mut node.kind {
            if let Collective::AllGather { axis } = op {
                match inferred.nodes[x.0 as usize] {
                    Placement::Sharded { axis: a } => *axis = Some(a),
                    // Whole already: each device keeps its copy.
                    _ => *op = Collective::Broadcast { src: 0 },
                }
            }
        }
    }
    Ok((g, symbols))
}
