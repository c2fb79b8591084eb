//! A small reference interpreter of Tile IR (test-only, f64 arithmetic, no
//! low-precision rounding), used to check that lowered kernels compute what
//! their source says: the brief's kernels and the stdlib's against direct
//! computations, and the control-flow lowering (break/continue, merges).

use std::collections::HashMap;
use std::sync::Arc;

use super::*;
use crate::db::{file_kernels, tile_ir, Database};

#[derive(Clone, Debug)]
struct Arr {
    shape: Vec<usize>,
    data: Vec<f64>,
}

impl Arr {
    fn scalar(x: f64) -> Arr {
        Arr {
            shape: vec![],
            data: vec![x],
        }
    }

    fn get(&self) -> f64 {
        self.data[0]
    }
}

/// A launch argument.
#[derive(Clone, Debug)]
enum ArgV {
    Tensor { dims: Vec<usize>, data: Vec<f64> },
    Scalar(f64),
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

fn fix(d: DType, x: f64) -> f64 {
    if d == DType::Bool {
        (x != 0.0) as i64 as f64
    } else if d.is_int() {
        x.trunc()
    } else {
        x
    }
}

struct Interp<'a> {
    k: &'a Kernel,
    args: &'a mut [ArgV],
    pid: [usize; 3],
    grid: [usize; 3],
    vals: HashMap<Value, Arr>,
}

impl Interp<'_> {
    fn v(&self, v: Value) -> &Arr {
        &self.vals[&v]
    }

    fn region(&mut self, r: &Region) -> Vec<Arr> {
        for op in &r.ops {
            if let OpKind::Yield(vs) = &op.kind {
                return vs.iter().map(|v| self.v(*v).clone()).collect();
            }
            let out = self.op(op);
            for (res, a) in op.results.iter().zip(out) {
                self.vals.insert(*res, a);
            }
        }
        Vec::new()
    }

    fn run_region(&mut self, r: &Region, args: Vec<Arr>) -> Vec<Arr> {
        for (a, x) in r.args.iter().zip(args) {
            self.vals.insert(*a, x);
        }
        self.region(r)
    }

    /// Element offsets of an access and whether each is in bounds.
    fn elements(&self, tensor: usize, access: &[Access]) -> (Vec<usize>, Vec<(usize, bool)>) {
        let ArgV::Tensor { dims, .. } = &self.args[tensor] else {
            panic!("not a tensor")
        };
        let st = strides(dims);
        let mut starts = Vec::new();
        let mut shape = Vec::new();
        for a in access {
            match a {
                Access::Point(v) => starts.push((self.v(*v).get() as i64, None)),
                Access::Range { start, len } => {
                    starts.push((self.v(*start).get() as i64, Some(*len as usize)));
                    shape.push(*len as usize);
                }
            }
        }
        let n: usize = shape.iter().product();
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let idx = unravel(i, &shape);
            let mut j = 0;
            let mut off = 0i64;
            let mut ok = true;
            for (axis, (s, len)) in starts.iter().enumerate() {
                let pos = match len {
                    Some(_) => {
                        j += 1;
                        s + idx[j - 1] as i64
                    }
                    None => *s,
                };
                ok &= pos >= 0 && pos < dims[axis] as i64;
                off += pos * st[axis] as i64;
            }
            out.push((off.max(0) as usize, ok));
        }
        (shape, out)
    }

    fn op(&mut self, op: &Op) -> Vec<Arr> {
        let k = self.k;
        let rty = |i: usize| k.ty(op.results[i]).clone();
        let one = |a: Arr| vec![a];
        match &op.kind {
            OpKind::Const(c) => one(Arr::scalar(match c {
                Constant::Int(i) => *i as f64,
                Constant::Float(x) => *x,
                Constant::Bool(b) => *b as i64 as f64,
            })),
            OpKind::ProgramId(a) => one(Arr::scalar(self.pid[*a as usize] as f64)),
            OpKind::NumPrograms(a) => one(Arr::scalar(self.grid[*a as usize] as f64)),
            OpKind::TensorDim { param, axis } => match &self.args[*param] {
                ArgV::Tensor { dims, .. } => one(Arr::scalar(dims[*axis] as f64)),
                ArgV::Scalar(_) => panic!("dim of a scalar"),
            },
            OpKind::ScalarParam(i) => match &self.args[*i] {
                ArgV::Scalar(x) => one(Arr::scalar(*x)),
                ArgV::Tensor { .. } => panic!("scalar param is a tensor"),
            },
            OpKind::Unary { op: u, x } => {
                let a = self.v(*x).clone();
                let d = rty(0).dtype();
                let f = |x: f64| -> f64 {
                    match u {
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
                };
                one(Arr {
                    shape: a.shape,
                    data: a.data.iter().map(|x| fix(d, f(*x))).collect(),
                })
            }
            OpKind::Binary { op: b, a, b: bv } => {
                let (x, y) = (self.v(*a).clone(), self.v(*bv).clone());
                let d = k.ty(*a).dtype();
                let int = d.is_int();
                let f = |p: f64, q: f64| -> f64 {
                    let t = |c: bool| c as i64 as f64;
                    match b {
                        BinaryOp::Add => p + q,
                        BinaryOp::Sub => p - q,
                        BinaryOp::Mul => p * q,
                        BinaryOp::Div => p / q,
                        BinaryOp::FloorDiv => (p / q).floor(),
                        BinaryOp::Mod => p - q * (p / q).floor(),
                        BinaryOp::Pow => p.powf(q),
                        BinaryOp::Max => p.max(q),
                        BinaryOp::Min => p.min(q),
                        BinaryOp::And if int => ((p as i64) & (q as i64)) as f64,
                        BinaryOp::Or if int => ((p as i64) | (q as i64)) as f64,
                        BinaryOp::Xor if int => ((p as i64) ^ (q as i64)) as f64,
                        BinaryOp::And => t(p != 0.0 && q != 0.0),
                        BinaryOp::Or => t(p != 0.0 || q != 0.0),
                        BinaryOp::Xor => t((p != 0.0) != (q != 0.0)),
                        BinaryOp::Eq => t(p == q),
                        BinaryOp::Ne => t(p != q),
                        BinaryOp::Lt => t(p < q),
                        BinaryOp::Le => t(p <= q),
                        BinaryOp::Gt => t(p > q),
                        BinaryOp::Ge => t(p >= q),
                    }
                };
                let rd = rty(0).dtype();
                one(Arr {
                    shape: x.shape,
                    data: x
                        .data
                        .iter()
                        .zip(&y.data)
                        .map(|(p, q)| fix(rd, f(*p, *q)))
                        .collect(),
                })
            }
            OpKind::Select { cond, a, b } => {
                let (c, x, y) = (self.v(*cond), self.v(*a), self.v(*b));
                one(Arr {
                    shape: x.shape.clone(),
                    data: c
                        .data
                        .iter()
                        .zip(x.data.iter().zip(&y.data))
                        .map(|(c, (x, y))| if *c != 0.0 { *x } else { *y })
                        .collect(),
                })
            }
            OpKind::Cast { x, to } => {
                let a = self.v(*x).clone();
                one(Arr {
                    shape: a.shape,
                    data: a.data.iter().map(|x| fix(*to, *x)).collect(),
                })
            }
            OpKind::Splat { x, shape } => {
                let n: usize = shape.iter().map(|&s| s as usize).product();
                one(Arr {
                    shape: shape.iter().map(|&s| s as usize).collect(),
                    data: vec![self.v(*x).get(); n],
                })
            }
            OpKind::Broadcast { x, shape } => {
                let a = self.v(*x);
                let to: Vec<usize> = shape.iter().map(|&s| s as usize).collect();
                let st = strides(&a.shape);
                let n: usize = to.iter().product();
                let data = (0..n)
                    .map(|i| {
                        let idx = unravel(i, &to);
                        let off: usize = idx
                            .iter()
                            .enumerate()
                            .map(|(d, &j)| if a.shape[d] == 1 { 0 } else { j * st[d] })
                            .sum();
                        a.data[off]
                    })
                    .collect();
                one(Arr { shape: to, data })
            }
            OpKind::ExpandDims { x, axis } => {
                let mut a = self.v(*x).clone();
                a.shape.insert(*axis, 1);
                one(a)
            }
            OpKind::Transpose { x } => {
                let a = self.v(*x);
                let (r, c) = (a.shape[0], a.shape[1]);
                let mut data = vec![0.0; r * c];
                for i in 0..r {
                    for j in 0..c {
                        data[j * r + i] = a.data[i * c + j];
                    }
                }
                one(Arr {
                    shape: vec![c, r],
                    data,
                })
            }
            OpKind::Arange { start, len } => {
                let s = self.v(*start).get();
                one(Arr {
                    shape: vec![*len as usize],
                    data: (0..*len).map(|i| s + i as f64).collect(),
                })
            }
            OpKind::Load {
                tensor,
                access,
                mask,
                other,
            } => {
                let (shape, els) = self.elements(*tensor, access);
                let other = match other {
                    Constant::Int(i) => *i as f64,
                    Constant::Float(x) => *x,
                    Constant::Bool(b) => *b as i64 as f64,
                };
                let m = mask.map(|m| self.v(m).data.clone());
                let ArgV::Tensor { data, .. } = &self.args[*tensor] else {
                    unreachable!()
                };
                let out = els
                    .iter()
                    .enumerate()
                    .map(|(i, (off, ok))| {
                        let on = *ok && m.as_ref().is_none_or(|m| m[i] != 0.0);
                        if on {
                            data[*off]
                        } else {
                            other
                        }
                    })
                    .collect();
                one(Arr { shape, data: out })
            }
            OpKind::Store {
                tensor,
                access,
                value,
                mask,
            }
            | OpKind::AtomicAdd {
                tensor,
                access,
                value,
                mask,
            } => {
                let add = matches!(op.kind, OpKind::AtomicAdd { .. });
                let (_, els) = self.elements(*tensor, access);
                let v = self.v(*value).data.clone();
                let m = mask.map(|m| self.v(m).data.clone());
                let ArgV::Tensor { data, .. } = &mut self.args[*tensor] else {
                    unreachable!()
                };
                for (i, (off, ok)) in els.iter().enumerate() {
                    if *ok && m.as_ref().is_none_or(|m| m[i] != 0.0) {
                        if add {
                            data[*off] += v[i];
                        } else {
                            data[*off] = v[i];
                        }
                    }
                }
                vec![]
            }
            OpKind::Dot { a, b, acc, .. } => {
                let (x, y) = (self.v(*a), self.v(*b));
                let (m, kk, n) = (x.shape[0], x.shape[1], y.shape[1]);
                let mut data = match acc {
                    Some(c) => self.v(*c).data.clone(),
                    None => vec![0.0; m * n],
                };
                for i in 0..m {
                    for j in 0..n {
                        let mut s = 0.0;
                        for l in 0..kk {
                            s += x.data[i * kk + l] * y.data[l * n + j];
                        }
                        data[i * n + j] += s;
                    }
                }
                one(Arr {
                    shape: vec![m, n],
                    data,
                })
            }
            OpKind::Reduce {
                op: r,
                x,
                axis,
                keepdims,
            } => {
                let a = self.v(*x);
                let mut shape = a.shape.clone();
                shape[*axis] = 1;
                let n: usize = shape.iter().product();
                let st = strides(&a.shape);
                let data = (0..n)
                    .map(|i| {
                        let idx = unravel(i, &shape);
                        let base: usize = idx.iter().zip(&st).map(|(j, s)| j * s).sum();
                        let items = (0..a.shape[*axis]).map(|j| a.data[base + j * st[*axis]]);
                        match r {
                            ReduceOp::Sum => items.sum(),
                            ReduceOp::Max => items.fold(f64::NEG_INFINITY, f64::max),
                            ReduceOp::Min => items.fold(f64::INFINITY, f64::min),
                        }
                    })
                    .collect();
                if !keepdims {
                    shape.remove(*axis);
                }
                one(Arr { shape, data })
            }
            OpKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let (mut i, h, s) = (self.v(*lo).get(), self.v(*hi).get(), self.v(*step).get());
                let mut carried: Vec<Arr> = init.iter().map(|v| self.v(*v).clone()).collect();
                while (s > 0.0 && i < h) || (s < 0.0 && i > h) {
                    let mut args = vec![Arr::scalar(i)];
                    args.extend(carried);
                    carried = self.run_region(body, args);
                    i += s;
                }
                carried
            }
            OpKind::While { init, cond, body } => {
                let mut carried: Vec<Arr> = init.iter().map(|v| self.v(*v).clone()).collect();
                let mut guard = 0;
                while self.run_region(cond, carried.clone())[0].get() != 0.0 {
                    carried = self.run_region(body, carried);
                    guard += 1;
                    assert!(guard < 1_000_000, "runaway while");
                }
                carried
            }
            OpKind::If {
                cond,
                then,
                otherwise,
            } => {
                if self.v(*cond).get() != 0.0 {
                    self.run_region(then, vec![])
                } else {
                    self.run_region(otherwise, vec![])
                }
            }
            OpKind::Yield(_) => unreachable!("handled by region"),
        }
    }
}

/// Abramowitz-Stegun 7.1.26 is too coarse for comparisons; a series/continued
/// fraction pair accurate to ~1e-12 is plenty here.
fn erf(x: f64) -> f64 {
    if x.abs() < 2.5 {
        let mut sum = x;
        let mut term = x;
        for n in 1..60 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        let t = 1.0 / (1.0 + 0.5 * x.abs());
        let y = t
            * (-x * x - 1.26551223
                + t * (1.00002368
                    + t * (0.37409196
                        + t * (0.09678418
                            + t * (-0.18628806
                                + t * (0.27886807
                                    + t * (-1.13520398
                                        + t * (1.48851587
                                            + t * (-0.82215223 + t * 0.17087277)))))))))
                .exp();
        if x >= 0.0 {
            1.0 - y
        } else {
            y - 1.0
        }
    }
}

/// Runs `k` over `grid` on `args` (tensors are updated in place).
fn launch(k: &Kernel, grid: [usize; 3], args: &mut [ArgV]) {
    assert!(verify(k).is_empty(), "{:?}", verify(k));
    for z in 0..grid[2] {
        for y in 0..grid[1] {
            for x in 0..grid[0] {
                let mut it = Interp {
                    k,
                    args,
                    pid: [x, y, z],
                    grid,
                    vals: HashMap::new(),
                };
                it.region(&k.body);
            }
        }
    }
}

fn kernel(src: &str, name: &str, spec: &Specialization) -> Arc<Kernel> {
    let mut db = Database::new();
    let file = db.set_source("/t/interp.tsr", src.to_string());
    let errors: Vec<_> = db
        .diagnostics(file)
        .iter()
        .filter(|d| d.is_error())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    let (_, item, _) = file_kernels(&db, file)
        .into_iter()
        .find(|(n, _, _)| n == name)
        .unwrap_or_else(|| panic!("no kernel {name}"));
    tile_ir(&db, item, db.options(), spec.clone())
        .clone()
        .unwrap_or_else(|d| panic!("{d:?}"))
}

fn std_kernel(module: &str, name: &str, spec: &Specialization) -> Arc<Kernel> {
    kernel(
        crate::stdlib::source(&format!("std.{module}")).unwrap(),
        name,
        spec,
    )
}

/// Deterministic pseudo-random data in [-1, 1).
fn data(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

fn tensor(dims: &[usize], data: Vec<f64>) -> ArgV {
    ArgV::Tensor {
        dims: dims.to_vec(),
        data,
    }
}

fn out(a: &ArgV) -> &[f64] {
    match a {
        ArgV::Tensor { data, .. } => data,
        ArgV::Scalar(_) => panic!("not a tensor"),
    }
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: {g} vs {w}"
        );
    }
}

const BRIEF: &str = include_str!("testdata/brief.tsr");

#[test]
fn vadd_over_a_ragged_length() {
    let k = kernel(BRIEF, "vadd", &Specialization::new());
    let n = 2500;
    let (x, y) = (data(n, 1), data(n, 2));
    let mut args = [
        tensor(&[n], x.clone()),
        tensor(&[n], y.clone()),
        tensor(&[n], vec![0.0; n]),
    ];
    launch(&k, [n.div_ceil(1024), 1, 1], &mut args);
    let want: Vec<f64> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    close(out(&args[2]), &want, 0.0);
}

fn softmax_ref(x: &[f64], m: usize, n: usize) -> Vec<f64> {
    let mut o = vec![0.0; m * n];
    for r in 0..m {
        let row = &x[r * n..(r + 1) * n];
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - mx).exp()).sum();
        for c in 0..n {
            o[r * n + c] = (row[c] - mx).exp() / s;
        }
    }
    o
}

#[test]
fn softmax_rows_and_the_online_variant() {
    let (m, n) = (3, 700);
    let x = data(m * n, 3);
    let want = softmax_ref(&x, m, n);
    let k = kernel(BRIEF, "softmax_rows", &Specialization::new());
    let mut args = [
        tensor(&[m, n], x.clone()),
        tensor(&[m, n], vec![0.0; m * n]),
    ];
    launch(&k, [m, 1, 1], &mut args);
    close(out(&args[1]), &want, 1e-12);
    // Rows longer than one block: BLOCK = 256 over N = 700.
    let k = std_kernel(
        "nn",
        "softmax_rows_online",
        &Specialization::new().with("BLOCK", 256),
    );
    let mut args = [tensor(&[m, n], x), tensor(&[m, n], vec![0.0; m * n])];
    launch(&k, [m, 1, 1], &mut args);
    close(out(&args[1]), &want, 1e-12);
}

#[test]
fn gemm_with_partial_tiles() {
    let spec = Specialization::new()
        .with("BM", 16)
        .with("BN", 32)
        .with("BK", 16);
    let k = kernel(BRIEF, "gemm", &spec);
    let (m, kk, n) = (37, 50, 45);
    let (a, b) = (data(m * kk, 4), data(kk * n, 5));
    let mut args = [
        tensor(&[m, kk], a.clone()),
        tensor(&[kk, n], b.clone()),
        tensor(&[m, n], vec![0.0; m * n]),
    ];
    launch(&k, [m.div_ceil(16), n.div_ceil(32), 1], &mut args);
    let mut want = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..kk).map(|l| a[i * kk + l] * b[l * n + j]).sum();
        }
    }
    close(out(&args[2]), &want, 1e-12);
}

#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    bh: usize,
    s: usize,
    d: usize,
    scale: f64,
    causal: bool,
) -> Vec<f64> {
    let mut o = vec![0.0; bh * s * d];
    for h in 0..bh {
        let base = h * s * d;
        for i in 0..s {
            let scores: Vec<f64> = (0..s)
                .map(|j| {
                    if causal && j > i {
                        f64::NEG_INFINITY
                    } else {
                        (0..d)
                            .map(|t| q[base + i * d + t] * k[base + j * d + t])
                            .sum::<f64>()
                            * scale
                    }
                })
                .collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = w.iter().sum();
            for t in 0..d {
                o[base + i * d + t] = (0..s).map(|j| w[j] * v[base + j * d + t]).sum::<f64>() / z;
            }
        }
    }
    o
}

/// The stdlib's flash attention (keys past S masked), causal and not, with S
/// not a multiple of the tile sizes, against the direct softmax(q k^T) v.
#[test]
fn flash_attention_matches_the_definition() {
    let (b, h, s, d) = (1, 2, 45, 16);
    let scale = 0.25;
    let n = b * h * s * d;
    let (q, kk, v) = (data(n, 6), data(n, 7), data(n, 8));
    for causal in [false, true] {
        let spec = Specialization::new()
            .with("D", d as i64)
            .with("BM", 16)
            .with("BN", 16)
            .with("causal", causal as i64);
        let k = std_kernel("attention", "flash_attn", &spec);
        let dims = [b, h, s, d];
        let mut args = [
            tensor(&dims, q.clone()),
            tensor(&dims, kk.clone()),
            tensor(&dims, v.clone()),
            tensor(&dims, vec![0.0; n]),
            ArgV::Scalar(scale),
        ];
        launch(&k, [s.div_ceil(16), b * h, 1], &mut args);
        let want = attention_ref(&q, &kk, &v, b * h, s, d, scale, causal);
        close(out(&args[3]), &want, 1e-9);
    }
}

#[test]
fn layer_norm_and_reductions() {
    let (m, n) = (2, 300);
    let x = data(m * n, 9);
    let (w, bias) = (data(n, 10), data(n, 11));
    let k = std_kernel(
        "nn",
        "layer_norm_rows",
        &Specialization::new().with("BLOCK", 512),
    );
    let mut args = [
        tensor(&[m, n], x.clone()),
        tensor(&[n], w.clone()),
        tensor(&[n], bias.clone()),
        tensor(&[m, n], vec![0.0; m * n]),
        ArgV::Scalar(1e-5),
    ];
    launch(&k, [m, 1, 1], &mut args);
    let mut want = vec![0.0; m * n];
    for r in 0..m {
        let row = &x[r * n..(r + 1) * n];
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        for c in 0..n {
            want[r * n + c] = (row[c] - mean) / (var + 1e-5).sqrt() * w[c] + bias[c];
        }
    }
    close(out(&args[3]), &want, 1e-9);
    for (name, f) in [
        (
            "sum_rows",
            (|r: &[f64]| r.iter().sum::<f64>()) as fn(&[f64]) -> f64,
        ),
        ("max_rows", |r: &[f64]| {
            r.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
        }),
        ("mean_rows", |r: &[f64]| {
            r.iter().sum::<f64>() / r.len() as f64
        }),
    ] {
        let k = std_kernel("reduce", name, &Specialization::new().with("BLOCK", 128));
        let mut args = [tensor(&[m, n], x.clone()), tensor(&[m], vec![0.0; m])];
        launch(&k, [m, 1, 1], &mut args);
        let want: Vec<f64> = (0..m).map(|r| f(&x[r * n..(r + 1) * n])).collect();
        close(out(&args[1]), &want, 1e-12);
    }
}

/// `break`/`continue` lowering against the loop it came from.
#[test]
fn break_and_continue_semantics() {
    let src = "@kernel(grid=(1,))\ndef count(x: Tensor[4, i32], n: i32):\n    i = 0\n    s = 0\n    while i < n:\n        i += 1\n        if i % 3 == 0:\n            continue\n        s += i\n        if s > 40:\n            break\n    t = 0\n    for j in range(0, n, 2):\n        if j == 6:\n            continue\n        if j > 12:\n            break\n        t += j\n    store(x[0 : 4], zeros([4], i32) + s)\n    store(x[1 : 2], zeros([1], i32) + t)\n    if n > 100:\n        return\n    store(x[2 : 3], zeros([1], i32) + i)\n";
    let k = kernel(src, "count", &Specialization::new());
    for n in [0i64, 5, 10, 30, 200] {
        let mut args = [tensor(&[4], vec![-1.0; 4]), ArgV::Scalar(n as f64)];
        launch(&k, [1, 1, 1], &mut args);
        // The same loops, directly.
        let (mut i, mut s) = (0, 0);
        while i < n {
            i += 1;
            if i % 3 == 0 {
                continue;
            }
            s += i;
            if s > 40 {
                break;
            }
        }
        let mut t = 0;
        let mut j = 0;
        while j < n {
            if j == 6 {
                j += 2;
                continue;
            }
            if j > 12 {
                break;
            }
            t += j;
            j += 2;
        }
        // x[2] keeps the first store's `s` when the kernel returned early.
        let third = if n > 100 { s as f64 } else { i as f64 };
        assert_eq!(
            out(&args[0]),
            &[s as f64, t as f64, third, s as f64],
            "n = {n}"
        );
    }
}

/// The brief's flash attention (no key mask) is exact when S is a multiple of BN.
#[test]
fn brief_flash_attention_with_whole_key_tiles() {
    let (b, h, s, d) = (2, 1, 48, 32);
    let n = b * h * s * d;
    let (q, kk, v) = (data(n, 12), data(n, 13), data(n, 14));
    for causal in [false, true] {
        let spec = Specialization::new()
            .with("D", d as i64)
            .with("BM", 32)
            .with("BN", 16)
            .with("causal", causal as i64);
        let k = kernel(BRIEF, "flash_attn", &spec);
        let dims = [b, h, s, d];
        let mut args = [
            tensor(&dims, q.clone()),
            tensor(&dims, kk.clone()),
            tensor(&dims, v.clone()),
            tensor(&dims, vec![0.0; n]),
            ArgV::Scalar(0.125),
        ];
        launch(&k, [s.div_ceil(32), b * h, 1], &mut args);
        let want = attention_ref(&q, &kk, &v, b * h, s, d, 0.125, causal);
        close(out(&args[3]), &want, 1e-9);
    }
}

/// `return` inside (nested) loops leaves every loop and skips the rest.
#[test]
fn return_inside_loops() {
    let src = "@kernel(grid=(1,))\ndef find(x: Tensor[8, i32], n: i32, target: i32):\n    s = 0\n    for i in range(0, n):\n        j = 0\n        while j < n:\n            s += 1\n            if i * n + j == target:\n                store(x[0 : 1], zeros([1], i32) + s)\n                return\n            j += 1\n        store(x[1 : 2], zeros([1], i32) + i)\n    store(x[2 : 3], zeros([1], i32) + s)\n";
    let k = kernel(src, "find", &Specialization::new());
    for (n, target) in [(4i64, 6i64), (4, 100), (3, 0), (0, 0)] {
        let mut args = [
            tensor(&[8], vec![-1.0; 8]),
            ArgV::Scalar(n as f64),
            ArgV::Scalar(target as f64),
        ];
        launch(&k, [1, 1, 1], &mut args);
        let mut want = [-1.0; 8];
        let mut s = 0;
        let mut returned = false;
        'outer: for i in 0..n {
            let mut j = 0;
            while j < n {
                s += 1;
                if i * n + j == target {
                    want[0] = s as f64;
                    returned = true;
                    break 'outer;
                }
                j += 1;
            }
            want[1] = i as f64;
        }
        if !returned {
            want[2] = s as f64;
        }
        assert_eq!(out(&args[0]), &want[..], "n = {n}, target = {target}");
    }
}

/// The features kernel (if/elif/else merges, a while, a run-time conditional
/// expression, masks, promotions, full and keepdims reductions, atomics)
/// against the same computation written directly.
#[test]
fn control_kernel_matches_a_direct_computation() {
    let k = kernel(
        include_str!("testdata/features.tsr"),
        "control",
        &Specialization::new(),
    );
    let size = 300;
    let x = data(size, 15);
    let thr = 0.3;
    for n in [2i64, 3, 7, 150] {
        let programs = size.div_ceil(128);
        let mut args = [
            tensor(&[size], x.clone()),
            tensor(&[size], vec![0.0; size]),
            tensor(&[16], vec![0.0; 16]),
            ArgV::Scalar(n as f64),
            ArgV::Scalar(thr),
        ];
        launch(&k, [programs, 1, 1], &mut args);
        let mut want = vec![0.0; size];
        for p in 0..programs {
            let mut w = [0.0f64; 128];
            for (l, wl) in w.iter_mut().enumerate() {
                let idx = p * 128 + l;
                let t = if idx < size { x[idx] } else { 0.0 };
                let mut acc = t + 1.5;
                let kk = if n > 4 {
                    acc *= 2.0;
                    n.div_euclid(2)
                } else if n == 3 {
                    7
                } else {
                    n
                };
                for _ in 0..kk {
                    acc = acc.max(t * thr);
                }
                let lim = if n < 100 { n } else { 100 };
                *wl = (if acc > thr { acc } else { 0.0 }) / lim as f64 + n as f64 / 3.0;
            }
            let total = w.iter().sum::<f64>() + w.iter().sum::<f64>() / 128.0;
            for (l, wl) in w.iter().enumerate() {
                if p * 128 + l < size {
                    want[p * 128 + l] = wl - total;
                }
            }
        }
        close(out(&args[1]), &want, 1e-9);
        let hist: Vec<f64> = (0..16)
            .map(|j| if (j as i64) < n { programs as f64 } else { 0.0 })
            .collect();
        assert_eq!(out(&args[2]), &hist[..], "n = {n}");
    }
}

/// A run-time `other=` fills out-of-bounds and masked-off elements.
#[test]
fn runtime_other_fills_outside_elements() {
    let src = "@kernel(grid=(cdiv(M, 8), 1))\ndef pad(x: Tensor[\"M\", \"N\", f32], out: Tensor[\"M\", 16, f32], fill: f32):\n    r = program_id(0) * 8\n    t = load(x[r : r + 8, 0 : 16], mask=arange(0, 16)[None, :] != 3, other=fill)\n    store(out[r : r + 8, 0 : 16], t)\n    s = load(x[r, 20], other=fill * 2.0)\n    store(out[r, 15], s)\n";
    let k = kernel(src, "pad", &Specialization::new());
    let (m, n) = (11, 13);
    let x = data(m * n, 16);
    let mut args = [
        tensor(&[m, n], x.clone()),
        tensor(&[m, 16], vec![0.0; m * 16]),
        ArgV::Scalar(-7.0),
    ];
    launch(&k, [m.div_ceil(8), 1, 1], &mut args);
    let mut want = vec![0.0; m * 16];
    for r in 0..m {
        for c in 0..16 {
            want[r * 16 + c] = if c < n && c != 3 { x[r * n + c] } else { -7.0 };
        }
    }
    // Each program's first row gets x[r, 20] (out of bounds: fill * 2) at column 15.
    for p in 0..m.div_ceil(8) {
        want[p * 8 * 16 + 15] = -14.0;
    }
    close(out(&args[1]), &want, 0.0);
}
