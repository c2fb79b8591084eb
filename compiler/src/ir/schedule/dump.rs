//! The textual dump of a schedule (its format is in the module doc of
//! `schedule`).

use std::fmt::Write;

use super::{Arg, BufKind, KernelRef, Schedule, Step};
use crate::ir::graph::{render_constant, GType};

fn arg_str(s: &Schedule, a: &Arg) -> String {
    match a {
        Arg::Buffer { buf, dims } => {
            let b = s.buffer(*buf);
            if *dims == b.dims {
                b.name.clone()
            } else {
                format!("{} as {}", b.name, crate::check::types::render_dims(dims))
            }
        }
        Arg::Scalar(e) => e.to_string(),
    }
}

/// Steps at an indentation; regions nest three spaces deeper.
fn dump_steps(s: &Schedule, steps: &[Step], ind: &str, out: &mut String) {
    let inner = format!("{ind}   ");
    for (i, step) in steps.iter().enumerate() {
        let l = match step {
            Step::Launch(l) => l,
            Step::HostRandn { buf, seed, node } => {
                let _ = writeln!(
                    out,
                    "{ind}{i}: randn {} seed={seed} nodes=[{node}] (host)",
                    s.buffer(*buf).name
                );
                continue;
            }
            Step::SetVar { var, value } => {
                let _ = writeln!(out, "{ind}{i}: set ${var} = {value}");
                continue;
            }
            Step::HostData { buf, values, node } => {
                let v: Vec<String> = values.iter().map(render_constant).collect();
                let _ = writeln!(
                    out,
                    "{ind}{i}: data {} [{}] nodes=[{node}] (host)",
                    s.buffer(*buf).name,
                    v.join(", ")
                );
                continue;
            }
            Step::Collective {
                op,
                input,
                output,
                node,
            } => {
                let what = match op.to_string().split_once(' ') {
                    Some((name, rest)) => format!("{name} {} {rest}", s.buffer(*input).name),
                    None => format!("{op} {}", s.buffer(*input).name),
                };
                let _ = writeln!(
                    out,
                    "{ind}{i}: {what} -> {} nodes=[{node}]",
                    s.buffer(*output).name
                );
                continue;
            }
            Step::Call {
                func,
                node,
                args,
                out: o,
            } => {
                let args: Vec<String> = args
                    .iter()
                    .map(|(n, a)| format!("{n}={}", arg_str(s, a)))
                    .collect();
                let _ = writeln!(
                    out,
                    "{ind}{i}: call {func}({}) -> {} nodes=[{node}]",
                    args.join(", "),
                    s.buffer(*o).name
                );
                continue;
            }
            Step::If {
                cond,
                then,
                otherwise,
            } => {
                let _ = writeln!(out, "{ind}{i}: if {cond}");
                dump_steps(s, then, &inner, out);
                let _ = writeln!(out, "{ind}   else");
                dump_steps(s, otherwise, &inner, out);
                continue;
            }
            Step::For {
                var,
                lo,
                hi,
                step,
                body,
            } => {
                let _ = writeln!(out, "{ind}{i}: for ${var} in range({lo}, {hi}, {step})");
                dump_steps(s, body, &inner, out);
                continue;
            }
            Step::While { cond, test, body } => {
                let _ = writeln!(out, "{ind}{i}: while");
                dump_steps(s, cond, &inner, out);
                let _ = writeln!(out, "{ind}   test {test}, then");
                dump_steps(s, body, &inner, out);
                continue;
            }
        };
        let kname = match &l.kernel {
            KernelRef::Std { module, name } => format!("{module}.{name}"),
            KernelRef::User(n) => n.clone(),
            KernelRef::Generated(k) => format!("{} (generated)", s.kernels[*k].name),
        };
        let grid = match &l.grid {
            Some(g) => format!(
                "({}{})",
                g.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                if g.len() == 1 { "," } else { "" }
            ),
            None => "@kernel".into(),
        };
        let nodes: Vec<String> = l.nodes.iter().map(|n| n.to_string()).collect();
        let _ = writeln!(
            out,
            "{ind}{i}: {kname} grid={grid} nodes=[{}]",
            nodes.join(", ")
        );
        let args: Vec<String> = l
            .args
            .iter()
            .map(|(n, a)| format!("{n}={}", arg_str(s, a)))
            .chain(l.consts.iter().map(|(n, v)| format!("{n}={v}")))
            .collect();
        let _ = writeln!(out, "{ind}     ({})", args.join(", "));
        for r in &l.requires {
            let _ = writeln!(out, "{ind}     requires {r}");
        }
    }
}

/// The textual dump: buffers, launches in order, outputs, then the generated kernels.
pub fn dump(s: &Schedule) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "schedule {}", s.name);
    let _ = writeln!(out, "buffers:");
    for b in &s.buffers {
        let kind = match &b.kind {
            BufKind::Input(_) => "input".to_string(),
            BufKind::Output(_) => "output".to_string(),
            BufKind::Temp => "temp".to_string(),
            BufKind::View(of) => format!("view of {}", s.buffer(*of).name),
        };
        let kind = if b.alloc {
            format!("{kind} (empty)")
        } else {
            kind
        };
        let t = GType::Tensor {
            dims: b.dims.clone(),
            dtype: b.dtype,
        };
        let _ = writeln!(out, "  {}: {t} {kind}", b.name);
    }
    let _ = writeln!(out, "steps:");
    dump_steps(s, &s.steps, "  ", &mut out);
    let outs: Vec<String> = s
        .outputs
        .iter()
        .zip(&s.scalar_outputs)
        .map(|(o, &scalar)| {
            let name = &s.buffer(*o).name;
            if scalar {
                format!("{name} (scalar)")
            } else {
                name.clone()
            }
        })
        .collect();
    let _ = writeln!(out, "outputs: {}", outs.join(", "));
    for k in &s.kernels {
        out.push('\n');
        out.push_str(&k.dump());
    }
    out
}
