//! The textual dump of a graph (its format is in the module doc of `graph`).

use std::fmt::Write;

use super::{
    binary_name, regions, render_constant, Fill, GType, Graph, Node, NodeId, NodeKind, SliceAxis,
};
use crate::check::types::render_dims;

fn bcast_note(g: &Graph, n: &Node, ops: &[(NodeId, &str)]) -> String {
    let out = n.ty.dims();
    let b: Vec<&str> = ops
        .iter()
        .filter(|(o, _)| g.ty(*o).dims() != out)
        .map(|(_, name)| *name)
        .collect();
    if b.is_empty() || out.is_empty() {
        String::new()
    } else {
        format!(" bcast({})", b.join(", "))
    }
}

fn args_list(args: &[(String, NodeId)]) -> String {
    args.iter()
        .map(|(n, a)| format!("{n}={a}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The textual dump:
///
/// ```text
/// graph scaled_sum(a: Tensor[M, N, f32], b: Tensor[M, N, f32]) -> Tensor[M, N, f32]
///   %0 = param a : Tensor[M, N, f32]
///   %2 = const 0.5 : f32
///   %3 = mul %0, %2 bcast(rhs) : Tensor[M, N, f32]
///   return %4
/// ```
pub fn dump(g: &Graph) -> String {
    let mut s = String::new();
    dump_into(g, "", &mut s);
    s
}

fn list(ids: &[NodeId]) -> String {
    ids.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One graph at an indentation: regions print as nested graphs (named
/// `then`, `else`, `cond`, `body`) below their node, their params the leading
/// values and then the captures in order.
fn dump_into(g: &Graph, indent: &str, s: &mut String) {
    let params: Vec<String> = g
        .params
        .iter()
        .map(|p| format!("{}: {}", p.name, p.ty))
        .collect();
    let rets: Vec<String> = g.outputs.iter().map(|o| g.ty(*o).to_string()).collect();
    let _ = writeln!(
        s,
        "{indent}graph {}({}) -> {}",
        g.name,
        params.join(", "),
        match rets.len() {
            1 => rets[0].clone(),
            _ => format!("({})", rets.join(", ")),
        }
    );
    for (i, n) in g.nodes.iter().enumerate() {
        let body = match &n.kind {
            NodeKind::Param(p) => format!("param {}", g.params[*p].name),
            NodeKind::Const(c) => format!("const {}", render_constant(c)),
            NodeKind::Index(d) => format!("index {d}"),
            NodeKind::Unary { op, x } => format!("{} {x}", op.name()),
            NodeKind::Activation { act, x } => format!("{} {x}", format!("{act:?}").to_lowercase()),
            NodeKind::Binary { op, a, b } => format!(
                "{} {a}, {b}{}",
                binary_name(*op),
                bcast_note(g, n, &[(*a, "lhs"), (*b, "rhs")])
            ),
            NodeKind::Select { cond, a, b } => format!(
                "select {cond}, {a}, {b}{}",
                bcast_note(g, n, &[(*cond, "cond"), (*a, "lhs"), (*b, "rhs")])
            ),
            NodeKind::Cast { x, to } => format!("cast {x} to {to}"),
            NodeKind::MatMul { a, b, tf32 } => {
                format!("matmul {a}, {b}{}", if *tf32 { " tf32" } else { "" })
            }
            NodeKind::Softmax { x, axis } => format!("softmax {x}, axis={axis}"),
            NodeKind::Collective { op, x } => {
                let op = op.to_string();
                match op.split_once(' ') {
                    Some((name, rest)) => format!("{name} {x}, {}", rest.replace(' ', ", ")),
                    None => format!("{op} {x}"),
                }
            }
            NodeKind::LayerNorm {
                x,
                weight,
                bias,
                eps,
            } => format!(
                "layer_norm {x}, weight={}, bias={}, eps={}",
                opt(weight),
                opt(bias),
                opt(eps)
            ),
            NodeKind::RmsNorm { x, weight, eps } => {
                format!("rms_norm {x}, weight={}, eps={}", opt(weight), opt(eps))
            }
            NodeKind::Reduce {
                op,
                x,
                axis,
                keepdims,
            } => format!(
                "{} {x}, axis={}, keepdims={keepdims}",
                format!("{op:?}").to_lowercase(),
                axis.map(|a| a.to_string()).unwrap_or_else(|| "all".into())
            ),
            NodeKind::Transpose { x, a, b } => format!("transpose {x}, {a}, {b}"),
            NodeKind::Slice { x, axes } => {
                let mut k = 0;
                let parts: Vec<String> = axes
                    .iter()
                    .map(|a| match a {
                        SliceAxis::Full => {
                            k += 1;
                            ":".to_string()
                        }
                        SliceAxis::Index(i) => i.to_string(),
                        SliceAxis::Range { start } => {
                            let len = &n.ty.dims()[k];
                            k += 1;
                            format!("{start}:+{len}")
                        }
                    })
                    .collect();
                format!("slice {x}[{}]", parts.join(", "))
            }
            NodeKind::Reshape { x } => format!("reshape {x} to {}", render_dims(n.ty.dims())),
            NodeKind::Fill(fill) => match fill {
                Fill::Zeros => "zeros".to_string(),
                Fill::Ones => "ones".to_string(),
                Fill::Empty => "empty".to_string(),
                Fill::Full(v) => format!("full {v}"),
                Fill::Randn { seed } => format!("randn seed={}", opt(seed)),
                Fill::Data(d) => format!(
                    "data [{}]",
                    d.iter().map(render_constant).collect::<Vec<_>>().join(", ")
                ),
            },
            NodeKind::KernelCall {
                kernel,
                grid,
                args,
                consts,
            } => {
                let grid = match grid {
                    Some(g) => format!(
                        "[{}]",
                        g.iter()
                            .map(|x| x.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None => "[@kernel grid]".to_string(),
                };
                let consts: String = consts.iter().map(|(n, v)| format!(", {n}={v}")).collect();
                format!("launch {kernel}{grid}({}{consts})", args_list(args))
            }
            NodeKind::Call {
                func, args, consts, ..
            } => {
                let consts: String = consts.iter().map(|(n, v)| format!(", {n}={v}")).collect();
                format!("call {func}({}{consts})", args_list(args))
            }
            NodeKind::If {
                cond,
                then,
                otherwise,
            } => format!(
                "if {cond} then({}) else({})",
                list(&then.captures),
                list(&otherwise.captures)
            ),
            NodeKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => format!(
                "for range({lo}, {hi}, {step}) carry({}) body({})",
                list(init),
                list(&body.captures)
            ),
            NodeKind::While { init, cond, body } => format!(
                "while carry({}) cond({}) body({})",
                list(init),
                list(&cond.captures),
                list(&body.captures)
            ),
            NodeKind::Project { of, index } => format!("project {of}.{index}"),
        };
        if n.ty == GType::Unit {
            let _ = writeln!(s, "{indent}  %{i} = {body}");
        } else {
            let _ = writeln!(s, "{indent}  %{i} = {body} : {}", n.ty);
        }
        let inner = format!("{indent}    ");
        for r in regions(&n.kind) {
            dump_into(&r.graph, &inner, s);
        }
    }
    let _ = writeln!(s, "{indent}  return {}", list(&g.outputs));
}

fn opt(x: &Option<NodeId>) -> String {
    x.map(|x| x.to_string()).unwrap_or_else(|| "none".into())
}
