//! Numerical tests of the generated kernels: a small reference evaluator of
//! Graph IR (f64 values; casts to integer types truncate, every node rounds to
//! its dtype) and the CPU executor running the Schedule IR (`exec::run_function`:
//! generated and stdlib kernels over their whole grid, buffers and views shared
//! as on the device, host steps) must agree on concrete inputs, within the
//! tolerance of the result dtype. That checks the index arithmetic,
//! broadcasting patterns, bounds handling, loops and reductions of the
//! generated code.

use std::collections::HashMap;
use std::sync::Arc;

use crate::check::dims::Dim;
use crate::check::DType;
use crate::db::{self, Database};
use crate::exec;
use crate::ir::graph::{Activation, Fill, GType, Graph, NodeKind, ReduceKind, SliceAxis};
use crate::ir::schedule::{KernelRef, Schedule};
use crate::ir::tile::{BinaryOp, Constant, UnaryOp};

type Env = HashMap<String, i64>;

fn dim(d: &Dim, env: &Env) -> i64 {
    d.substitute(&|s| env.get(s).map(|v| Dim::constant(*v)))
        .and_then(|d| d.as_const())
        .unwrap_or_else(|| panic!("dim {d} not bound"))
}

fn dims(ds: &[Dim], env: &Env) -> Vec<usize> {
    ds.iter().map(|d| dim(d, env) as usize).collect()
}

#[derive(Clone, Debug)]
struct T {
    shape: Vec<usize>,
    data: Vec<f64>,
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

fn strides(s: &[usize]) -> Vec<usize> {
    let mut st = vec![1; s.len()];
    for i in (0..s.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * s[i + 1];
    }
    st
}

fn unravel(mut i: usize, s: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; s.len()];
    for k in (0..s.len()).rev() {
        idx[k] = i % s[k];
        i /= s[k];
    }
    idx
}

/// The element of `t` that numpy broadcasting maps to index `idx` of `out`.
fn bget(t: &T, idx: &[usize]) -> f64 {
    let off = idx.len() - t.shape.len();
    let st = strides(&t.shape);
    let mut flat = 0;
    for (k, &s) in t.shape.iter().enumerate() {
        let i = if s == 1 { 0 } else { idx[off + k] };
        flat += i * st[k];
    }
    t.data[flat]
}

fn cast(x: f64, to: DType) -> f64 {
    if to == DType::Bool {
        (x != 0.0) as i64 as f64
    } else if to.is_int() {
        x.trunc()
    } else {
        exec::round_to(to, x)
    }
}

fn unary(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Not => (x == 0.0) as i64 as f64,
        UnaryOp::Invert => !(x as i64) as f64,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Exp2 => x.exp2(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Log2 => x.log2(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Erf => erf(x),
    }
}

/// Abramowitz-Stegun 7.1.26 is too coarse for equality; use a series/continued
/// form accurate to ~1e-15 in f64 over the range the tests use.
fn erf(x: f64) -> f64 {
    let t = x.abs();
    let v = if t < 3.0 {
        // Maclaurin series.
        let mut sum = t;
        let mut term = t;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -t * t / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        1.0
    };
    v.copysign(x)
}

fn binary(op: BinaryOp, a: f64, b: f64) -> f64 {
    let bool_ = |c: bool| c as i64 as f64;
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::FloorDiv => (a / b).floor(),
        BinaryOp::Mod => a - b * (a / b).floor(),
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::And => ((a as i64) & (b as i64)) as f64,
        BinaryOp::Or => ((a as i64) | (b as i64)) as f64,
        BinaryOp::Xor => ((a as i64) ^ (b as i64)) as f64,
        BinaryOp::Eq => bool_(a == b),
        BinaryOp::Ne => bool_(a != b),
        BinaryOp::Lt => bool_(a < b),
        BinaryOp::Le => bool_(a <= b),
        BinaryOp::Gt => bool_(a > b),
        BinaryOp::Ge => bool_(a >= b),
    }
}

fn elementwise(shape: &[usize], ops: &[&T], f: &dyn Fn(&[f64]) -> f64) -> T {
    let n = numel(shape);
    let data = (0..n)
        .map(|i| {
            let idx = unravel(i, shape);
            let xs: Vec<f64> = ops.iter().map(|t| bget(t, &idx)).collect();
            f(&xs)
        })
        .collect();
    T {
        shape: shape.to_vec(),
        data,
    }
}

/// Reference semantics of a graph on concrete inputs.
/// The graph and schedule of a function of the file under test, by name (for
/// calls that stay in the graph).
type Calls<'a> = dyn Fn(&str) -> (Arc<Graph>, Arc<Schedule>) + 'a;

/// The dims of a callee bound to the shapes of its tensor arguments.
fn callee_env(callee: &Graph, args: &[(String, Vec<usize>)]) -> Env {
    let mut env = Env::new();
    for p in &callee.params {
        if let Some((_, shape)) = args.iter().find(|(n, _)| *n == p.name) {
            for (d, v) in p.ty.dims().iter().zip(shape) {
                if let Some(sym) = d.as_symbol() {
                    env.insert(sym.to_string(), *v as i64);
                }
            }
        }
    }
    env
}

fn eval_graph(g: &Graph, env: &Env, inputs: &[T], calls: &Calls) -> Vec<T> {
    let mut vals: Vec<T> = Vec::new();
    // The results of control-flow nodes, by node index.
    let mut results: HashMap<usize, Vec<T>> = HashMap::new();
    let scalar_t = |x: f64| T {
        shape: vec![],
        data: vec![x],
    };
    for (ni, n) in g.nodes.iter().enumerate() {
        let shape = dims(n.ty.dims(), env);
        let dt = n.ty.dtype().unwrap_or(DType::F32);
        let v = |i: &crate::ir::graph::NodeId| &vals[i.0 as usize];
        let t = match &n.kind {
            NodeKind::Param(p) => inputs[*p].clone(),
            NodeKind::Const(c) => T {
                shape: vec![],
                data: vec![match c {
                    Constant::Int(i) => *i as f64,
                    Constant::Float(x) => *x,
                    Constant::Bool(b) => *b as i64 as f64,
                }],
            },
            NodeKind::Index(d) => T {
                shape: vec![],
                data: vec![dim(d, env) as f64],
            },
            NodeKind::Unary { op, x } => {
                elementwise(&shape, &[v(x)], &|a| cast(unary(*op, a[0]), dt))
            }
            NodeKind::Activation { act, x } => elementwise(&shape, &[v(x)], &|a| {
                let x = a[0];
                match act {
                    Activation::Relu => x.max(0.0),
                    Activation::Silu => x / (1.0 + (-x).exp()),
                    Activation::Gelu => 0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2)),
                }
            }),
            NodeKind::Binary { op, a, b } => elementwise(&shape, &[v(a), v(b)], &|x| {
                cast(binary(*op, x[0], x[1]), dt)
            }),
            NodeKind::Select { cond, a, b } => elementwise(&shape, &[v(cond), v(a), v(b)], &|x| {
                if x[0] != 0.0 {
                    x[1]
                } else {
                    x[2]
                }
            }),
            NodeKind::Cast { x, to } => elementwise(&shape, &[v(x)], &|a| cast(a[0], *to)),
            NodeKind::Fill(Fill::Zeros) => elementwise(&shape, &[], &|_| 0.0),
            NodeKind::Fill(Fill::Ones) => elementwise(&shape, &[], &|_| 1.0),
            NodeKind::Fill(Fill::Full(x)) => elementwise(&shape, &[v(x)], &|a| cast(a[0], dt)),
            NodeKind::Fill(Fill::Data(values)) => T {
                data: values
                    .iter()
                    .map(|c| match c {
                        Constant::Int(i) => *i as f64,
                        Constant::Float(x) => *x,
                        Constant::Bool(b) => *b as i64 as f64,
                    })
                    .collect(),
                shape,
            },
            NodeKind::Fill(Fill::Randn { seed }) => T {
                data: exec::rng::randn(
                    &shape,
                    dt,
                    seed.map_or(0.0, |s| v(&s).data[0]) as i64 as u64,
                )
                .to_f64_vec(),
                shape,
            },
            NodeKind::Slice { x, axes } => {
                let src = v(x);
                let st = strides(&src.shape);
                let data = (0..numel(&shape))
                    .map(|i| {
                        let idx = unravel(i, &shape);
                        let mut k = 0;
                        let mut flat = 0;
                        for (j, a) in axes.iter().enumerate() {
                            let n = src.shape[j] as i64;
                            let at = match a {
                                SliceAxis::Full => {
                                    k += 1;
                                    idx[k - 1] as i64
                                }
                                SliceAxis::Range { start } => {
                                    k += 1;
                                    dim(start, env) + idx[k - 1] as i64
                                }
                                SliceAxis::Index(ix) => {
                                    let i = v(ix).data[0] as i64;
                                    if i < 0 {
                                        i + n
                                    } else {
                                        i
                                    }
                                }
                            };
                            assert!((0..n).contains(&at), "index {at} of an axis of {n}");
                            flat += at as usize * st[j];
                        }
                        src.data[flat]
                    })
                    .collect();
                T { shape, data }
            }
            NodeKind::Reshape { x } => T {
                shape,
                data: v(x).data.clone(),
            },
            NodeKind::Transpose { x, a, b } => {
                let src = v(x);
                let st = strides(&src.shape);
                let data = (0..numel(&shape))
                    .map(|i| {
                        let mut idx = unravel(i, &shape);
                        idx.swap(*a, *b);
                        src.data[idx.iter().zip(&st).map(|(i, s)| i * s).sum::<usize>()]
                    })
                    .collect();
                T { shape, data }
            }
            NodeKind::Reduce { op, x, axis, .. } => {
                let src = v(x);
                let axes: Vec<usize> = match axis {
                    Some(a) => vec![*a],
                    None => (0..src.shape.len()).collect(),
                };
                let mut acc: HashMap<Vec<usize>, (f64, usize)> = HashMap::new();
                for i in 0..src.data.len() {
                    let mut idx = unravel(i, &src.shape);
                    for a in &axes {
                        idx[*a] = 0;
                    }
                    let x = src.data[i];
                    let e = acc.entry(idx).or_insert((
                        match op {
                            ReduceKind::Max => f64::NEG_INFINITY,
                            ReduceKind::Min => f64::INFINITY,
                            _ => 0.0,
                        },
                        0,
                    ));
                    e.0 = match op {
                        ReduceKind::Sum | ReduceKind::Mean => e.0 + x,
                        ReduceKind::Max => e.0.max(x),
                        ReduceKind::Min => e.0.min(x),
                    };
                    e.1 += 1;
                }
                let mut keys: Vec<&Vec<usize>> = acc.keys().collect();
                keys.sort();
                let data = keys
                    .iter()
                    .map(|k| {
                        let (s, c) = acc[*k];
                        let r = if *op == ReduceKind::Mean {
                            s / c as f64
                        } else {
                            s
                        };
                        cast(r, dt)
                    })
                    .collect();
                T { shape, data }
            }
            NodeKind::Softmax { x, axis } => {
                let src = v(x);
                let mut out = src.clone();
                let st = strides(&src.shape);
                for i in 0..src.data.len() {
                    let idx = unravel(i, &src.shape);
                    if idx[*axis] != 0 {
                        continue;
                    }
                    let lane: Vec<usize> =
                        (0..src.shape[*axis]).map(|j| i + j * st[*axis]).collect();
                    let m = lane
                        .iter()
                        .map(|&j| src.data[j])
                        .fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = lane.iter().map(|&j| (src.data[j] - m).exp()).sum();
                    for &j in &lane {
                        out.data[j] = (src.data[j] - m).exp() / sum;
                    }
                }
                out
            }
            NodeKind::MatMul { a, b, .. } => {
                let (ta, tb) = (v(a), v(b));
                let mut sa = ta.shape.clone();
                if sa.len() == 1 {
                    sa.insert(0, 1);
                }
                let mut sb = tb.shape.clone();
                if sb.len() == 1 {
                    sb.push(1);
                }
                let (m, kk, nn) = (sa[sa.len() - 2], sa[sa.len() - 1], sb[sb.len() - 1]);
                let (ba, bb) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
                let nb = ba.len().max(bb.len());
                let batch: Vec<usize> = (0..nb)
                    .map(|i| {
                        let x = (i + ba.len()).checked_sub(nb).map(|j| ba[j]).unwrap_or(1);
                        let y = (i + bb.len()).checked_sub(nb).map(|j| bb[j]).unwrap_or(1);
                        x.max(y)
                    })
                    .collect();
                let flat = |bs: &[usize], idx: &[usize]| -> usize {
                    let off = idx.len() - bs.len();
                    let st = strides(bs);
                    bs.iter()
                        .enumerate()
                        .map(|(k, &s)| if s == 1 { 0 } else { idx[off + k] * st[k] })
                        .sum()
                };
                let mut data = Vec::new();
                for bi in 0..numel(&batch) {
                    let idx = unravel(bi, &batch);
                    let (oa, ob) = (flat(ba, &idx) * m * kk, flat(bb, &idx) * kk * nn);
                    for i in 0..m {
                        for j in 0..nn {
                            data.push(
                                (0..kk)
                                    .map(|t| ta.data[oa + i * kk + t] * tb.data[ob + t * nn + j])
                                    .sum(),
                            );
                        }
                    }
                }
                T { shape, data }
            }
            NodeKind::LayerNorm {
                x,
                weight,
                bias,
                eps,
            } => {
                let src = v(x);
                let c = *src.shape.last().unwrap();
                let eps = eps.map(|e| v(&e).data[0]).unwrap_or(1e-5);
                let mut data = Vec::new();
                for row in src.data.chunks(c) {
                    let mean = row.iter().sum::<f64>() / c as f64;
                    let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / c as f64;
                    for (j, x) in row.iter().enumerate() {
                        let w = weight.map(|w| v(&w).data[j]).unwrap_or(1.0);
                        let b = bias.map(|b| v(&b).data[j]).unwrap_or(0.0);
                        data.push((x - mean) / (var + eps).sqrt() * w + b);
                    }
                }
                T { shape, data }
            }
            NodeKind::RmsNorm { x, weight, eps } => {
                let src = v(x);
                let c = *src.shape.last().unwrap();
                let eps = eps.map(|e| v(&e).data[0]).unwrap_or(1e-6);
                let mut data = Vec::new();
                for row in src.data.chunks(c) {
                    let ms = row.iter().map(|x| x * x).sum::<f64>() / c as f64;
                    for (j, x) in row.iter().enumerate() {
                        let w = weight.map(|w| v(&w).data[j]).unwrap_or(1.0);
                        data.push(x / (ms + eps).sqrt() * w);
                    }
                }
                T { shape, data }
            }
            NodeKind::If {
                cond,
                then,
                otherwise,
            } => {
                let r = if v(cond).data[0] != 0.0 {
                    then
                } else {
                    otherwise
                };
                let ins: Vec<T> = r.captures.iter().map(|c| v(c).clone()).collect();
                results.insert(ni, eval_graph(&r.graph, env, &ins, calls));
                scalar_t(0.0)
            }
            NodeKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let (lo, hi, st) = (
                    v(lo).data[0] as i64,
                    v(hi).data[0] as i64,
                    v(step).data[0] as i64,
                );
                let mut carried: Vec<T> = init.iter().map(|i| v(i).clone()).collect();
                let caps: Vec<T> = body.captures.iter().map(|c| v(c).clone()).collect();
                let mut i = lo;
                while (st > 0 && i < hi) || (st < 0 && i > hi) {
                    let mut ins = vec![scalar_t(i as f64)];
                    ins.extend(carried.iter().cloned());
                    ins.extend(caps.iter().cloned());
                    carried = eval_graph(&body.graph, env, &ins, calls);
                    i += st;
                }
                results.insert(ni, carried);
                scalar_t(0.0)
            }
            NodeKind::While { init, cond, body } => {
                let mut carried: Vec<T> = init.iter().map(|i| v(i).clone()).collect();
                let with = |carried: &[T], caps: &[crate::ir::graph::NodeId]| -> Vec<T> {
                    carried
                        .iter()
                        .cloned()
                        .chain(caps.iter().map(|c| v(c).clone()))
                        .collect()
                };
                while eval_graph(&cond.graph, env, &with(&carried, &cond.captures), calls)[0].data
                    [0]
                    != 0.0
                {
                    carried = eval_graph(&body.graph, env, &with(&carried, &body.captures), calls);
                }
                results.insert(ni, carried);
                scalar_t(0.0)
            }
            NodeKind::Project { of, index } => results[&(of.0 as usize)][*index].clone(),
            NodeKind::Call { func, args, .. } => {
                let (callee, _) = calls(func);
                let shapes: Vec<(String, Vec<usize>)> = args
                    .iter()
                    .map(|(n, a)| (n.clone(), v(a).shape.clone()))
                    .collect();
                let ins: Vec<T> = callee
                    .params
                    .iter()
                    .map(|p| v(&args.iter().find(|(n, _)| *n == p.name).unwrap().1).clone())
                    .collect();
                eval_graph(&callee, &callee_env(&callee, &shapes), &ins, calls).remove(0)
            }
            other => panic!("no reference semantics for {other:?}"),
        };
        let mut t = t;
        if dt.is_float() && dt != DType::F64 {
            // Stored in its dtype, as the executor's buffers and tiles are.
            t.data.iter_mut().for_each(|x| *x = exec::round_to(dt, *x));
        }
        vals.push(t);
    }
    g.outputs
        .iter()
        .map(|o| vals[o.0 as usize].clone())
        .collect()
}

/// Runs the function through the CPU executor (`exec::run_function`: its
/// Schedule IR, generated and stdlib kernels, host steps) on the inputs.
fn run_schedule(
    db: &Database,
    file: db::SourceFile,
    g: &Graph,
    name: &str,
    inputs: &[T],
) -> Vec<T> {
    let args: Vec<exec::Value> = g
        .params
        .iter()
        .zip(inputs)
        .map(|(p, t)| match &p.ty {
            GType::Tensor { .. } => exec::Value::Tensor(exec::Tensor::from_f64(
                &t.shape,
                p.ty.dtype().unwrap(),
                &t.data,
            )),
            ty if ty.dtype().is_some_and(|d| d.is_float()) => exec::Value::Float(t.data[0]),
            _ => exec::Value::Int(t.data[0] as i64),
        })
        .collect();
    let out = exec::run_function(
        db,
        file,
        name,
        &args,
        &[],
        &exec::Device::Cpu,
        &exec::Interrupt::new(),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    let outs = match out {
        exec::Value::Tuple(v) => v,
        v => vec![v],
    };
    outs.iter()
        .map(|v| match v {
            exec::Value::Tensor(t) => T {
                shape: t.shape().to_vec(),
                data: t.to_f64_vec(),
            },
            other => panic!("{name}: a non-tensor result {other}"),
        })
        .collect()
}

/// Deterministic inputs in [-2, 2) (integers and bools for those dtypes).
fn input(t: &GType, env: &Env, seed: u64) -> T {
    let shape = dims(t.dims(), env);
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let dt = t.dtype().unwrap();
    let data = (0..numel(&shape))
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (x >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0;
            cast(if dt.is_int() { (u * 4.0).floor() } else { u }, dt)
        })
        .collect();
    T { shape, data }
}

/// Tolerance of the executor against the f64 reference: by result dtype, and
/// looser where a matmul runs at tf32 (f32 gemm) or inputs round to 16 bits.
fn tolerance(d: DType, s: &Schedule) -> f64 {
    let tf32 = s.launches().any(|l| {
        matches!(
            l.kernel,
            KernelRef::Std {
                name: "gemm_tf32",
                ..
            }
        )
    });
    match d {
        DType::F64 => 1e-9,
        DType::F32 if tf32 => 5e-3,
        DType::F32 => 1e-4,
        DType::F16 => 1e-2,
        DType::BF16 => 5e-2,
        DType::F8E4M3 | DType::F8E5M2 => 0.13,
        _ => 0.0,
    }
}

fn check(src: &str, name: &str, env: &[(&str, i64)], scalars: &[(&str, f64)]) {
    let mut db = Database::new();
    let file = db.set_source("/t/eval.tsr", src.to_string());
    let (item, _) = db::function_item(&db, file, name).expect("the function");
    let g = db::graph_ir(&db, item, db.options()).clone().unwrap();
    let s = db::schedule_ir(&db, item, db.options())
        .clone()
        .unwrap_or_else(|e| panic!("{e}"));
    let env: Env = env.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let sc: HashMap<String, f64> = scalars.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let inputs: Vec<T> = g
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| match &p.ty {
            GType::Tensor { .. } => input(&p.ty, &env, i as u64 + 1),
            _ => T {
                shape: vec![],
                data: vec![sc[&p.name]],
            },
        })
        .collect();
    let calls = |f: &str| {
        let (item, _) = db::function_item(&db, file, f).expect("the callee");
        (
            db::graph_ir(&db, item, db.options()).clone().unwrap(),
            db::schedule_ir(&db, item, db.options()).clone().unwrap(),
        )
    };
    let want = eval_graph(&g, &env, &inputs, &calls);
    let got = run_schedule(&db, file, &g, name, &inputs);
    for ((w, g_), o) in want.iter().zip(&got).zip(&g.outputs) {
        assert_eq!(w.data.len(), g_.data.len());
        let tol = tolerance(g.node(*o).ty.dtype().unwrap_or(DType::F32), &s);
        for (i, (a, b)) in w.data.iter().zip(&g_.data).enumerate() {
            let ok = (a - b).abs() <= tol * (1.0 + a.abs()) || (a.is_nan() && b.is_nan());
            assert!(
                ok,
                "{name}: element {i}: reference {a}, schedule {b}\n{}",
                crate::ir::schedule::dump(&s)
            );
        }
    }
}

#[test]
fn fused_elementwise_kernels_compute_the_graph() {
    let src = r#"def f(x: Tensor["M", "N", f32], y: Tensor["M", "N", f32], b: Tensor["N", f32], c: Tensor["M", 1, f32], s: f32) -> Tensor["M", "N", f32]:
    t = exp(x - y) * s
    u = silu(gelu(relu(t + b)) - c)
    return where(u > 0.1, u, sigmoid(u) * 2.0) + ones([M, N], f32) - abs(x) ** 2.0
"#;
    // Rows and columns that are not multiples of the tile (8 x 128), and one that is.
    for (m, n) in [(5, 37), (9, 300), (16, 128), (1, 1)] {
        check(src, "f", &[("M", m), ("N", n)], &[("s", 0.75)]);
    }
}

#[test]
fn transposes_reductions_views_and_copies_compute_the_graph() {
    let src = r#"def g(x: Tensor["B", "M", "N", f32], i: Tensor["M", "N", i32]) -> Tensor["B", "N", "M", f32]:
    t = transpose(x, -2, -1)
    s = sum(x, dim=1, keepdims=True)
    m = min(t, dim=2, keepdims=True)
    r = reshape(t, [B, N, M])
    return r * 0.5 + transpose(s, 1, 2) + m - mean(i) + max(i.to(f32))
"#;
    for (b, m, n) in [(2, 5, 37), (3, 33, 40), (1, 1, 1)] {
        check(src, "g", &[("B", b), ("M", m), ("N", n)], &[]);
    }
}

#[test]
fn integer_and_bool_chains_compute_the_graph() {
    let src = r#"def h(a: Tensor["N", i32], b: Tensor["N", i32]) -> Tensor["N", i32]:
    c = (a // 3 + b % 5) * 2
    return where((a > b) & (c != 0), c, a - b) + sum((a > 0).to(i32))
"#;
    for n in [1, 7, 129, 1000] {
        check(src, "h", &[("N", n)], &[]);
    }
}

#[test]
fn broadcasts_along_leading_axes_compute_the_graph() {
    let src = r#"def bb(x: Tensor["B", "H", "N", "M", f32], mask: Tensor["N", "M", f32], bias: Tensor["B", 1, "N", 1, f32], w: Tensor["H", 1, "M", f32], s: f32) -> Tensor["B", "H", "N", "M", f32]:
    return (x + mask) * s - bias + exp(w)
"#;
    for (b, h, n, m) in [(2, 3, 5, 7), (1, 2, 9, 130), (3, 1, 1, 1)] {
        check(
            src,
            "bb",
            &[("B", b), ("H", h), ("N", n), ("M", m)],
            &[("s", -1.5)],
        );
    }
    let mut db = Database::new();
    let file = db.set_source("/t/bb.tsr", src.to_string());
    let (item, _) = db::function_item(&db, file, "bb").unwrap();
    let s = db::schedule_ir(&db, item, db.options()).clone().unwrap();
    assert_eq!(s.launches().count(), 1, "{}", crate::ir::schedule::dump(&s));
}

#[test]
fn unrolled_loops_and_static_ifs_compute_the_graph() {
    let src = r#"const RELU = False

def lp(x: Tensor["M", "N", f32], b: Tensor["N", f32]) -> Tensor["M", "N", f32]:
    for i in range(1, 7, 2):
        x = x * 0.5 + b * i.to(f32)
    if RELU:
        x = relu(x)
    elif 2 > 1:
        x = sigmoid(x)
    else:
        x = x + 1.0
    return x
"#;
    check(src, "lp", &[("M", 3), ("N", 200)], &[]);
    let mut db = Database::new();
    let file = db.set_source("/t/lp.tsr", src.to_string());
    let (item, _) = db::function_item(&db, file, "lp").unwrap();
    let g = db::graph_ir(&db, item, db.options()).clone().unwrap();
    let dump = crate::ir::graph::dump(&g);
    assert_eq!(dump.matches("const 5").count(), 1, "{dump}");
    assert!(dump.contains("sigmoid") && !dump.contains("relu"), "{dump}");
    let s = db::schedule_ir(&db, item, db.options()).clone().unwrap();
    assert_eq!(s.launches().count(), 1, "the unrolled chain is one kernel");
}

#[test]
fn new_axes_and_tuple_assignments_compute_the_graph() {
    let src = r#"def outer(a: Tensor["M", f32], b: Tensor["N", f32]) -> Tensor["M", "N", f32]:
    p, q = a[:, None], b[None, :]
    return p * q + a[:, None]
"#;
    for (m, n) in [(3, 5), (17, 200)] {
        check(src, "outer", &[("M", m), ("N", n)], &[]);
    }
}

#[test]
fn generated_softmax_over_any_axis_computes_the_graph() {
    let src = r#"def sa(x: Tensor["A", "K", "C", f32], y: Tensor["A", "K", f16]) -> Tensor["A", "K", "C", f32]:
    return softmax(x, dim=1) + softmax(x, dim=0) + softmax(y, dim=-1).to(f32)[:, :, None]
"#;
    for (a, k, c) in [(2, 5, 3), (2, 1100, 3), (1, 1, 1)] {
        check(src, "sa", &[("A", a), ("K", k), ("C", c)], &[]);
    }
}

#[test]
fn schedules_with_stdlib_kernels_compute_the_graph() {
    // gemm (+ a fused epilogue), gemm_tf32 then a fused scale and softmax_rows,
    // batched activations on a plain gemm, layer_norm_rows, rms_norm_rows and a
    // row reduction, all run through the stdlib kernels lowered to Tile IR.
    let src = r#"def lin(x: Tensor["B", "T", "C", f16], w: Tensor["C", "F", f16], b: Tensor["F", f16]) -> Tensor["B", "T", "F", f16]:
    return relu(x @ w + b)

def scores(q: Tensor["M", "K", f32], k: Tensor["K", 200, f32], s: f32) -> Tensor["M", 200, f32]:
    return softmax(matmul(q, k) * s, dim=-1)

def norms(x: Tensor["M", "C", f32], g: Tensor["C", f32], b: Tensor["C", f32]) -> Tensor["M", "C", f32]:
    y = rms_norm(layer_norm(x, g, b, 0.001), g)
    return y - mean(y, dim=-1, keepdims=True) + max(x, dim=1, keepdims=True)
"#;
    check(
        src,
        "lin",
        &[("B", 2), ("T", 3), ("C", 40), ("F", 130)],
        &[],
    );
    check(src, "scores", &[("M", 5), ("K", 33)], &[("s", 0.3)]);
    check(src, "norms", &[("M", 3), ("C", 70)], &[]);
}

#[test]
fn attention_through_flash_attn_computes_the_graph() {
    let src = r#"def attention(q: Tensor["B", "H", "S", "D", bf16], k: Tensor["B", "H", "S", "D", bf16],
              v: Tensor["B", "H", "S", "D", bf16]) -> Tensor["B", "H", "S", "D", bf16]:
    return matmul(softmax(matmul(q, transpose(k, -2, -1)) * rsqrt(D), dim=-1), v)
"#;
    check(
        src,
        "attention",
        &[("B", 1), ("H", 2), ("S", 70), ("D", 64)],
        &[],
    );
}

#[test]
fn generated_norms_compute_the_graph() {
    // Rows longer than the row kernels' 1024, missing weights, narrow dtypes.
    let src = r#"def nn(x: Tensor["M", 1500, bf16], w: Tensor[1500, bf16], y: Tensor["M", "C", f32], b: Tensor["C", f32]) -> Tensor["M", 1500, f32]:
    a = layer_norm(x, w).to(f32)
    c = rms_norm(y) + layer_norm(y, None, b, 0.01)
    return a + sum(c, dim=1, keepdims=True)
"#;
    for (m, c) in [(2, 7), (3, 1300)] {
        check(src, "nn", &[("M", m), ("C", c)], &[]);
    }
    let mut db = Database::new();
    let file = db.set_source("/t/nn.tsr", src.to_string());
    let (item, _) = db::function_item(&db, file, "nn").unwrap();
    let s = db::schedule_ir(&db, item, db.options()).clone().unwrap();
    let dump = crate::ir::schedule::dump(&s);
    assert_eq!(
        dump.matches("_layer_norm").count(),
        4,
        "two generated layer norms: {dump}"
    );
    assert!(dump.contains("nn_rms_norm"), "{dump}");
}

#[test]
fn generated_batched_matmuls_compute_the_graph() {
    // bf16 with broadcast batch dims, f32 with equal ones, a 1-D right operand
    // under batch dims: no stdlib gemm, generated ones.
    let src = r#"def bm(a: Tensor["B", "H", "S", "D", bf16], b: Tensor["H", "D", "T", bf16], c: Tensor["H", "S", "D", f32], d: Tensor["H", "D", "T", f32]) -> Tensor["B", "H", "S", "T", f32]:
    return (a @ b).to(f32) + matmul(c, d)
"#;
    for (b, h, s_, d, t) in [(2, 3, 5, 7, 9), (1, 2, 70, 40, 65)] {
        check(
            src,
            "bm",
            &[("B", b), ("H", h), ("S", s_), ("D", d), ("T", t)],
            &[],
        );
    }
}

#[test]
fn host_randn_steps_fill_the_buffers_their_users_read() {
    let src = r#"def rn(x: Tensor["M", "N", f32], s: i32) -> Tensor["M", "N", f32]:
    return x + randn([M, N], f32, seed=s) * 2.0 + randn([N], f32)

def noise(x: Tensor["M", "N", f16], s: i32) -> Tensor["M", "N", f16]:
    return randn(x.shape, f16, seed=s + 1)
"#;
    for (m, n) in [(3, 5), (4, 130)] {
        check(src, "rn", &[("M", m), ("N", n)], &[("s", 7.0)]);
        check(src, "noise", &[("M", m), ("N", n)], &[("s", -2.0)]);
    }
}

#[test]
fn indexing_and_slicing_compute_the_graph() {
    let src = r#"def sl(x: Tensor["B", "M", "N", f32], i: i32) -> Tensor["M", 3, f32]:
    a = x[i]
    b = x[-1, :, 2:5]
    return a[:, 1:4] + b * x[i, 0, -1] + x[1, :, -3:] - x[0][:, None, 0]

def rows(x: Tensor["B", "M", "N", f16], j: i32) -> Tensor["B", 2, "N", f32]:
    return x[:, 1:3].to(f32) + x[:, j, None].to(f32)
"#;
    for (b, m, n) in [(2, 3, 5), (3, 9, 130)] {
        check(src, "sl", &[("B", b), ("M", m), ("N", n)], &[("i", 1.0)]);
        check(src, "sl", &[("B", b), ("M", m), ("N", n)], &[("i", -2.0)]);
    }
    check(src, "rows", &[("B", 2), ("M", 4), ("N", 7)], &[("j", -1.0)]);
    check(
        src,
        "rows",
        &[("B", 3), ("M", 3), ("N", 200)],
        &[("j", 2.0)],
    );
}

#[test]
fn transposes_of_any_axes_compute_the_graph() {
    let src = r#"def tp(x: Tensor["A", "B", "C", f32], y: Tensor["C", "B", "A", bf16]) -> Tensor["C", "B", "A", f32]:
    t = transpose(x, 1, 1)[0].T
    return transpose(x, 0, 2) + transpose(transpose(y, 0, 1), -3, -2).to(f32) + t[:, :, None]
"#;
    for (a, b, c) in [(2, 3, 5), (1, 1, 1), (3, 4, 140)] {
        check(src, "tp", &[("A", a), ("B", b), ("C", c)], &[]);
    }
}

#[test]
fn shapes_and_host_scalar_arithmetic_compute_the_graph() {
    let src = r#"def sh(x: Tensor["M", "N", f32], k: i32) -> Tensor["N", f32]:
    m, n = x.shape
    s = x.shape
    t = (k * 2 + s[1]) // 3
    return zeros([s[1]], f32) + x[m - 1] * t.to(f32) + x[0] * n.to(f32) + x.shape[0].to(f32)
"#;
    for (m, n) in [(3, 5), (2, 130)] {
        check(src, "sh", &[("M", m), ("N", n)], &[("k", 4.0)]);
    }
}

#[test]
fn run_time_control_flow_computes_the_graph() {
    let src = r#"def d(x: Tensor["M", "N", f32], k: i32) -> Tensor["M", "N", f32]:
    y = x * 2.0
    if k > 0:
        x = x + 1.0
    elif k < -3:
        x = relu(x)
    else:
        x = y - 1.0
    return x

def lp(x: Tensor["M", "N", f32], b: Tensor["N", f32], n: i32) -> Tensor["M", "N", f32]:
    s = 0.0
    for i in range(1, n, 2):
        x = x * 0.5 + b * i.to(f32)
        s = s + 1.0
    return x + s

def wh(x: Tensor["M", "N", f32], n: i32) -> Tensor["M", "N", f32]:
    y = x[0]
    while n > 0:
        x, y = x * 2.0 + y, x[n % M] - y
        n -= 1
    return x - y

def sw(a: Tensor["M", "N", f32], b: Tensor["M", "N", f32], n: i32) -> Tensor["M", "N", f32]:
    p = 1
    q = 2
    for i in range(n):
        a, b = b, a + 1.0
        p, q = q, p * 3
    return a * 2.0 - b + (p - q).to(f32)
"#;
    for (m, n) in [(3, 5), (2, 130)] {
        let env = [("M", m), ("N", n)];
        for k in [2.0, -5.0, 0.0] {
            check(src, "d", &env, &[("k", k)]);
        }
        for k in [0.0, 1.0, 6.0] {
            check(src, "lp", &env, &[("n", k)]);
            check(src, "wh", &env, &[("n", k)]);
            check(src, "sw", &env, &[("n", k)]);
        }
    }
}

#[test]
fn integer_matmuls_compute_the_graph() {
    // Exact integer accumulation (a generated kernel of rank-1 updates), with
    // batch dims broadcast and a narrow result cast by its consumer.
    let src = r#"def im(a: Tensor["B", "M", "K", i32], b: Tensor["K", "N", i32], c: Tensor["M", "K", i8], d: Tensor["B", "K", "N", i8]) -> Tensor["B", "M", "N", i32]:
    return a @ b + matmul(c, d).to(i32) * 2
"#;
    for (b, m, k, n) in [(2, 3, 5, 7), (1, 40, 3, 33)] {
        check(src, "im", &[("B", b), ("M", m), ("K", k), ("N", n)], &[]);
    }
}

#[test]
fn recursive_calls_run_the_callee_schedule() {
    let src = r#"def halve(x: Tensor["M", "N", f32], n: i32) -> Tensor["M", "N", f32]:
    if n > 0:
        x = halve(x * 0.5, n - 1) + 1.0
    return x

def twice(x: Tensor["N", f32], k: i32) -> Tensor["N", f32]:
    return halve(x[None, :], k)[0] - x
"#;
    for n in [0.0, 1.0, 4.0] {
        check(src, "halve", &[("M", 3), ("N", 130)], &[("n", n)]);
        check(src, "twice", &[("N", 7)], &[("k", n)]);
    }
}

#[test]
fn tensor_literals_are_host_data() {
    let src = r#"def lit(x: Tensor["M", 3, f32]) -> Tensor["M", 3, f32]:
    w = tensor([[1.0, -2.0, 0.5], [3, 4, 5]])
    i = tensor([2, 0, 1])
    return x * w[1] + w[0] - i.to(f32)
"#;
    for m in [1, 5] {
        check(src, "lit", &[("M", m)], &[]);
    }
    let mut db = Database::new();
    let file = db.set_source("/t/lit.tsr", src.to_string());
    let (item, _) = db::function_item(&db, file, "lit").unwrap();
    let s = db::schedule_ir(&db, item, db.options()).clone().unwrap();
    let dump = crate::ir::schedule::dump(&s);
    assert!(
        dump.contains("data t0 [1.0, -2.0, 0.5, 3.0, 4.0, 5.0]"),
        "{dump}"
    );
}
