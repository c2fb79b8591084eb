//! Numerical tests of the generated kernels: a small reference evaluator of
//! Graph IR and an interpreter of the Schedule IR (its generated Tile IR
//! kernels run over their whole grid, buffers and views shared as on the
//! device) must agree on concrete inputs. Values are f64 (casts to float types
//! are exact, casts to integer types truncate), so the comparison checks the
//! index arithmetic, broadcasting patterns, bounds handling, loops and
//! reductions of the generated code, not rounding.

use std::collections::HashMap;

use crate::check::dims::Dim;
use crate::check::DType;
use crate::db::{self, Database};
use crate::ir::graph::{Activation, Fill, GType, Graph, NodeKind, ReduceKind, SliceAxis};
use crate::ir::schedule::{Arg, BufKind, KernelRef, ScalarExpr, Schedule, Step};
use crate::ir::tile::{
    self, Access, BinaryOp, Constant, Kernel, OpKind, ParamKind, Region, UnaryOp, Value,
};

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
        x
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

/// A test stand-in for `randn`'s numbers (the executor's generator is not
/// this module's): any deterministic function of the seed and the index lets
/// the reference and the schedule agree, so that what is tested is which
/// buffer a host `randn` step fills, with which seed, and how its users read it.
fn stand_in_randn(seed: i64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((seed * 7919 + i as i64 * 31) % 97) as f64 / 48.0 - 1.0)
        .collect()
}

/// Reference semantics of a graph on concrete inputs.
fn eval_graph(g: &Graph, env: &Env, inputs: &[T]) -> Vec<T> {
    let mut vals: Vec<T> = Vec::new();
    for n in &g.nodes {
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
            NodeKind::Fill(Fill::Randn { seed }) => T {
                data: stand_in_randn(seed.map_or(0.0, |s| v(&s).data[0]) as i64, numel(&shape)),
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
            NodeKind::MatMul { a, b } => {
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
            other => panic!("no reference semantics for {other:?}"),
        };
        vals.push(t);
    }
    g.outputs
        .iter()
        .map(|o| vals[o.0 as usize].clone())
        .collect()
}

fn scalar(e: &ScalarExpr, env: &Env, params: &HashMap<String, f64>) -> f64 {
    match e {
        ScalarExpr::Param(p) => params[p],
        ScalarExpr::Index(d) => dim(d, env) as f64,
        ScalarExpr::Const(c) => match c {
            Constant::Int(i) => *i as f64,
            Constant::Float(x) => *x,
            Constant::Bool(b) => *b as i64 as f64,
        },
        ScalarExpr::Unary(op, x) => unary(*op, scalar(x, env, params)),
        ScalarExpr::Binary(op, a, b) => binary(*op, scalar(a, env, params), scalar(b, env, params)),
        ScalarExpr::Cast(x, d) => cast(scalar(x, env, params), *d),
        ScalarExpr::CDiv(x, k) => (scalar(x, env, params) / *k as f64).ceil(),
    }
}

#[derive(Clone, Debug)]
enum V {
    S(f64),
    T(Vec<u32>, Vec<f64>),
}

impl V {
    fn data(&self) -> (Vec<u32>, Vec<f64>) {
        match self {
            V::S(x) => (vec![], vec![*x]),
            V::T(s, d) => (s.clone(), d.clone()),
        }
    }
}

struct Run<'a> {
    k: &'a Kernel,
    /// Per parameter: (base buffer index, concrete dims of the view) or a scalar.
    tensors: Vec<Option<(usize, Vec<usize>)>>,
    scalars: Vec<f64>,
    pid: [i64; 3],
    grid: [i64; 3],
}

fn tile_of(shape: &[u32], data: Vec<f64>) -> V {
    if shape.is_empty() {
        V::S(data[0])
    } else {
        V::T(shape.to_vec(), data)
    }
}

impl Run<'_> {
    fn region(&self, r: &Region, vals: &mut HashMap<Value, V>, mem: &mut [Vec<f64>]) -> Vec<V> {
        for op in &r.ops {
            let get = |v: &Value, vals: &HashMap<Value, V>| vals[v].clone();
            let res: Vec<V> = match &op.kind {
                OpKind::Const(c) => vec![V::S(match c {
                    Constant::Int(i) => *i as f64,
                    Constant::Float(x) => *x,
                    Constant::Bool(b) => *b as i64 as f64,
                })],
                OpKind::ProgramId(a) => vec![V::S(self.pid[*a as usize] as f64)],
                OpKind::TensorDim { param, axis } => {
                    vec![V::S(self.tensors[*param].as_ref().unwrap().1[*axis] as f64)]
                }
                OpKind::ScalarParam(p) => vec![V::S(self.scalars[*p])],
                OpKind::Unary { op: u, x } => {
                    let (s, d) = get(x, vals).data();
                    vec![tile_of(&s, d.into_iter().map(|x| unary(*u, x)).collect())]
                }
                OpKind::Binary { op: b, a, b: bb } => {
                    let (s, da) = get(a, vals).data();
                    let (_, db) = get(bb, vals).data();
                    let dt = self.k.ty(op.results[0]).dtype();
                    vec![tile_of(
                        &s,
                        da.iter()
                            .zip(&db)
                            .map(|(x, y)| cast(binary(*b, *x, *y), dt))
                            .collect(),
                    )]
                }
                OpKind::Select { cond, a, b } => {
                    let (s, dc) = get(cond, vals).data();
                    let (_, da) = get(a, vals).data();
                    let (_, db) = get(b, vals).data();
                    vec![tile_of(
                        &s,
                        (0..dc.len())
                            .map(|i| if dc[i] != 0.0 { da[i] } else { db[i] })
                            .collect(),
                    )]
                }
                OpKind::Cast { x, to } => {
                    let (s, d) = get(x, vals).data();
                    vec![tile_of(&s, d.into_iter().map(|x| cast(x, *to)).collect())]
                }
                OpKind::Splat { x, shape } => {
                    let (_, d) = get(x, vals).data();
                    let n = shape.iter().product::<u32>() as usize;
                    vec![V::T(shape.clone(), vec![d[0]; n])]
                }
                OpKind::ExpandDims { x, axis } => {
                    let (mut s, d) = get(x, vals).data();
                    s.insert(*axis, 1);
                    vec![V::T(s, d)]
                }
                OpKind::Broadcast { x, shape } => {
                    let (s, d) = get(x, vals).data();
                    let src = T {
                        shape: s.iter().map(|x| *x as usize).collect(),
                        data: d,
                    };
                    let out: Vec<usize> = shape.iter().map(|x| *x as usize).collect();
                    let t = elementwise(&out, &[&src], &|a| a[0]);
                    vec![V::T(shape.clone(), t.data)]
                }
                OpKind::Transpose { x } => {
                    let (s, d) = get(x, vals).data();
                    let (r, c) = (s[0] as usize, s[1] as usize);
                    let mut o = vec![0.0; r * c];
                    for i in 0..r {
                        for j in 0..c {
                            o[j * r + i] = d[i * c + j];
                        }
                    }
                    vec![V::T(vec![s[1], s[0]], o)]
                }
                OpKind::Reduce {
                    op: rop,
                    x,
                    axis,
                    keepdims,
                } => {
                    let (s, d) = get(x, vals).data();
                    let shape: Vec<usize> = s.iter().map(|x| *x as usize).collect();
                    let mut oshape = s.clone();
                    oshape[*axis] = 1;
                    let os: Vec<usize> = oshape.iter().map(|x| *x as usize).collect();
                    let init = match rop {
                        tile::ReduceOp::Sum => 0.0,
                        tile::ReduceOp::Max => f64::NEG_INFINITY,
                        tile::ReduceOp::Min => f64::INFINITY,
                    };
                    let mut out = vec![init; numel(&os)];
                    let ost = strides(&os);
                    for (i, x) in d.iter().enumerate() {
                        let mut idx = unravel(i, &shape);
                        idx[*axis] = 0;
                        let f: usize = idx.iter().zip(&ost).map(|(i, s)| i * s).sum();
                        out[f] = match rop {
                            tile::ReduceOp::Sum => out[f] + x,
                            tile::ReduceOp::Max => out[f].max(*x),
                            tile::ReduceOp::Min => out[f].min(*x),
                        };
                    }
                    if !*keepdims {
                        oshape.remove(*axis);
                    }
                    vec![tile_of(&oshape, out)]
                }
                OpKind::Dot { a, b, acc, .. } => {
                    let (sa, da) = get(a, vals).data();
                    let (sb, db) = get(b, vals).data();
                    let (m, kk, n) = (sa[0] as usize, sa[1] as usize, sb[1] as usize);
                    let mut out = match acc {
                        Some(c) => get(c, vals).data().1,
                        None => vec![0.0; m * n],
                    };
                    for i in 0..m {
                        for j in 0..n {
                            for t in 0..kk {
                                out[i * n + j] += da[i * kk + t] * db[t * n + j];
                            }
                        }
                    }
                    vec![V::T(vec![sa[0], sb[1]], out)]
                }
                OpKind::Arange { start, len } => {
                    let s0 = get(start, vals).data().1[0];
                    vec![V::T(vec![*len], (0..*len).map(|i| s0 + i as f64).collect())]
                }
                OpKind::NumPrograms(a) => vec![V::S(self.grid[*a as usize] as f64)],
                OpKind::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    let c = get(cond, vals).data().1[0] != 0.0;
                    self.region(if c { then } else { otherwise }, vals, mem)
                }
                OpKind::Load {
                    tensor,
                    access,
                    other,
                    mask,
                } => {
                    let (buf, vd) = self.tensors[*tensor].clone().unwrap();
                    let (shape, starts) = self.access(access, vals);
                    let mask = mask.map(|m| get(&m, vals).data().1);
                    let other = match other {
                        Constant::Int(i) => *i as f64,
                        Constant::Float(x) => *x,
                        Constant::Bool(b) => *b as i64 as f64,
                    };
                    let st = strides(&vd);
                    let n = shape.iter().product::<u32>() as usize;
                    let data = (0..n)
                        .map(|i| match self.locate(i, &shape, &starts, &vd, &st) {
                            Some(f) if mask.as_ref().is_none_or(|m| m[i] != 0.0) => mem[buf][f],
                            _ => other,
                        })
                        .collect();
                    vec![tile_of(&shape, data)]
                }
                OpKind::Store {
                    tensor,
                    access,
                    value,
                    mask,
                } => {
                    let (buf, vd) = self.tensors[*tensor].clone().unwrap();
                    let (shape, starts) = self.access(access, vals);
                    let mask = mask.map(|m| get(&m, vals).data().1);
                    let (_, d) = get(value, vals).data();
                    let st = strides(&vd);
                    for (i, x) in d.iter().enumerate() {
                        if mask.as_ref().is_some_and(|m| m[i] == 0.0) {
                            continue;
                        }
                        if let Some(f) = self.locate(i, &shape, &starts, &vd, &st) {
                            mem[buf][f] = *x;
                        }
                    }
                    vec![]
                }
                OpKind::For {
                    lo,
                    hi,
                    step,
                    init,
                    body,
                } => {
                    let (lo, hi, step) = (
                        get(lo, vals).data().1[0] as i64,
                        get(hi, vals).data().1[0] as i64,
                        get(step, vals).data().1[0] as i64,
                    );
                    let mut carried: Vec<V> = init.iter().map(|v| get(v, vals)).collect();
                    let mut iv = lo;
                    while iv < hi {
                        vals.insert(body.args[0], V::S(iv as f64));
                        for (a, c) in body.args[1..].iter().zip(&carried) {
                            vals.insert(*a, c.clone());
                        }
                        carried = self.region(body, vals, mem);
                        iv += step;
                    }
                    carried
                }
                OpKind::Yield(vs) => return vs.iter().map(|v| get(v, vals)).collect(),
                other => panic!("the test interpreter has no {other:?}"),
            };
            for (r, v) in op.results.iter().zip(res) {
                vals.insert(*r, v);
            }
        }
        vec![]
    }

    /// The tile shape and, per tensor axis, (start, is a range).
    fn access(&self, access: &[Access], vals: &HashMap<Value, V>) -> (Vec<u32>, Vec<(i64, bool)>) {
        let mut shape = Vec::new();
        let mut starts = Vec::new();
        for a in access {
            match a {
                Access::Point(v) => starts.push((vals[v].data().1[0] as i64, false)),
                Access::Range { start, len } => {
                    shape.push(*len);
                    starts.push((vals[start].data().1[0] as i64, true));
                }
            }
        }
        (shape, starts)
    }

    /// The flat offset of tile element `i`, or `None` out of bounds.
    fn locate(
        &self,
        i: usize,
        shape: &[u32],
        starts: &[(i64, bool)],
        vd: &[usize],
        st: &[usize],
    ) -> Option<usize> {
        let ts: Vec<usize> = shape.iter().map(|x| *x as usize).collect();
        let ti = unravel(i, &ts);
        let mut k = 0;
        let mut flat = 0;
        for (axis, (start, range)) in starts.iter().enumerate() {
            let pos = if *range {
                k += 1;
                start + ti[k - 1] as i64
            } else {
                *start
            };
            if pos < 0 || pos >= vd[axis] as i64 {
                return None;
            }
            flat += pos as usize * st[axis];
        }
        Some(flat)
    }
}

/// A stdlib kernel lowered for a launch: const arguments and the dims its tile
/// shapes need (from the argument views) fixed.
fn lower_std(module: &str, name: &str, l: &crate::ir::schedule::Launch, env: &Env) -> Kernel {
    let mut db = Database::new();
    let file = db.set_source(
        format!("<{module}>"),
        crate::stdlib::source(module).unwrap().to_string(),
    );
    let (item, _) = db::function_item(&db, file, name).unwrap();
    let parsed = db::parse_item(&db, item);
    let Some(crate::syntax::ast::Item::Function(f)) = parsed.item.as_deref() else {
        unreachable!("a kernel")
    };
    let sig = db::item_signature(&db, item).clone().unwrap();
    let mut known = std::collections::BTreeMap::new();
    for p in &sig.params {
        if let (
            crate::check::Ty::Tensor { dims: pd, .. },
            Some((_, Arg::Buffer { dims: vd, .. })),
        ) = (&p.ty, l.args.iter().find(|(n, _)| *n == p.name))
        {
            for (d, v) in pd.iter().zip(vd) {
                if let Some(s) = d.as_symbol() {
                    known.insert(s.to_string(), dim(v, env));
                }
            }
        }
    }
    let mut spec = tile::Specialization::new();
    for (n, v) in &l.consts {
        let v = match v.as_str() {
            "True" => 1,
            "False" => 0,
            v => v.parse().unwrap(),
        };
        spec.values.insert(n.clone(), v);
    }
    tile::lower::lower_kernel_with_dims(f, db::module_scope(&db, file), &spec, &known)
        .unwrap_or_else(|d| panic!("{d:?}"))
}

/// Runs a schedule of generated and stdlib kernels; returns its outputs.
fn run_schedule(s: &Schedule, env: &Env, inputs: &[T], scalars: &HashMap<String, f64>) -> Vec<T> {
    let mut mem: Vec<Vec<f64>> = s
        .buffers
        .iter()
        .map(|b| match b.kind {
            BufKind::Input(i) => inputs[i].data.clone(),
            _ => vec![f64::NAN; numel(&dims(&b.dims, env))],
        })
        .collect();
    for step in &s.steps {
        let l = match step {
            Step::Launch(l) => l,
            Step::HostRandn { buf, seed, .. } => {
                let b = s.base(*buf).0 as usize;
                mem[b] = stand_in_randn(scalar(seed, env, scalars) as i64, mem[b].len());
                continue;
            }
        };
        let std_kernel;
        let k: &Kernel = match &l.kernel {
            KernelRef::Generated(ki) => &s.kernels[*ki],
            KernelRef::Std { module, name } => {
                std_kernel = lower_std(module, name, l, env);
                &std_kernel
            }
            KernelRef::User(n) => panic!("the test interpreter does not run user kernel `{n}`"),
        };
        // Arguments in the kernel's parameter order, by name.
        let by_name: HashMap<&str, &Arg> = l.args.iter().map(|(n, a)| (n.as_str(), a)).collect();
        let mut tensors = Vec::new();
        let mut sc = Vec::new();
        for p in &k.params {
            let a = by_name[p.name.as_str()];
            match (a, &p.kind) {
                (Arg::Buffer { buf, dims: vd }, ParamKind::Tensor { dims: pd, .. }) => {
                    let vd = dims(vd, env);
                    for (d, v) in pd.iter().zip(&vd) {
                        if let tile::Dim::Static(c) = d {
                            assert_eq!(*c as usize, *v, "a static dim of `{}`", k.name);
                        }
                    }
                    tensors.push(Some((s.base(*buf).0 as usize, vd)));
                    sc.push(0.0);
                }
                (Arg::Scalar(e), ParamKind::Scalar(_)) => {
                    tensors.push(None);
                    sc.push(scalar(e, env, scalars));
                }
                _ => panic!("argument kinds"),
            }
        }
        let grid: Vec<i64> = l
            .grid
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| scalar(e, env, scalars) as i64)
            .collect();
        let g = |a: usize| grid.get(a).copied().unwrap_or(1);
        for z in 0..g(2) {
            for y in 0..g(1) {
                for x in 0..g(0) {
                    let run = Run {
                        k,
                        tensors: tensors.clone(),
                        scalars: sc.clone(),
                        pid: [x, y, z],
                        grid: [g(0), g(1), g(2)],
                    };
                    run.region(&k.body, &mut HashMap::new(), &mut mem);
                }
            }
        }
    }
    s.outputs
        .iter()
        .map(|o| T {
            shape: dims(&s.buffer(*o).dims, env),
            data: mem[s.base(*o).0 as usize].clone(),
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
    let tensor_inputs: Vec<T> = inputs.clone();
    let want = eval_graph(&g, &env, &inputs);
    let got = run_schedule(&s, &env, &tensor_inputs, &sc);
    for (w, g_) in want.iter().zip(&got) {
        assert_eq!(w.data.len(), g_.data.len());
        for (i, (a, b)) in w.data.iter().zip(&g_.data).enumerate() {
            let ok = (a - b).abs() <= 1e-9 * (1.0 + a.abs()) || (a.is_nan() && b.is_nan());
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
    check(src, "rows", &[("B", 3), ("M", 3), ("N", 200)], &[("j", 2.0)]);
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
