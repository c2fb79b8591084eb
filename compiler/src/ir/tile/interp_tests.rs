//! The brief's kernels and the stdlib's run by the CPU executor
//! (`exec::cpu`) against direct f64 computations: lowering and execution
//! together compute what the source says, including the control-flow lowering
//! (break/continue, merges). Tolerances are those of f32 arithmetic.

use std::sync::Arc;

use super::*;
use crate::db::{file_kernels, tile_ir, Database};
use crate::exec::{cpu, Interrupt, Tensor};

/// A launch argument.
#[derive(Clone, Debug)]
enum ArgV {
    Tensor { dims: Vec<usize>, data: Vec<f64> },
    Scalar(f64),
}

/// Runs `k` over `grid` on `args` with the CPU executor (tensors are updated
/// in place, converted to and from the parameters' dtypes).
fn launch(k: &Kernel, grid: [usize; 3], args: &mut [ArgV]) {
    assert!(verify(k).is_empty(), "{:?}", verify(k));
    let tensors: Vec<cpu::Arg> = k
        .params
        .iter()
        .zip(args.iter())
        .map(|(p, a)| match (&p.kind, a) {
            (ParamKind::Tensor { dtype, .. }, ArgV::Tensor { dims, data }) => {
                cpu::Arg::Tensor(Tensor::from_f64(dims, *dtype, data))
            }
            (ParamKind::Scalar(d), ArgV::Scalar(x)) if d.is_float() => cpu::Arg::Float(*x),
            (ParamKind::Scalar(_), ArgV::Scalar(x)) => cpu::Arg::Int(*x as i64),
            _ => panic!("argument kinds"),
        })
        .collect();
    let g = grid.map(|x| x as i64);
    cpu::run_grid(k, &tensors, g, &Interrupt::new()).unwrap();
    for (a, t) in args.iter_mut().zip(&tensors) {
        if let (ArgV::Tensor { data, .. }, cpu::Arg::Tensor(t)) = (a, t) {
            *data = t.to_f64_vec();
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

/// `v` rounded to `d` (what a tensor of that dtype holds).
fn q(d: DType, v: Vec<f64>) -> Vec<f64> {
    v.into_iter().map(|x| crate::exec::round_to(d, x)).collect()
}

fn bf(v: Vec<f64>) -> Vec<f64> {
    q(DType::BF16, v)
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
    close(out(&args[2]), &want, 1e-6);
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
    close(out(&args[1]), &want, 1e-5);
    // Rows longer than one block: BLOCK = 256 over N = 700.
    let k = std_kernel(
        "nn",
        "softmax_rows_online",
        &Specialization::new().with("BLOCK", 256),
    );
    let mut args = [tensor(&[m, n], x), tensor(&[m, n], vec![0.0; m * n])];
    launch(&k, [m, 1, 1], &mut args);
    close(out(&args[1]), &want, 1e-5);
}

#[test]
fn gemm_with_partial_tiles() {
    let spec = Specialization::new()
        .with("BM", 16)
        .with("BN", 32)
        .with("BK", 16);
    let k = kernel(BRIEF, "gemm", &spec);
    let (m, kk, n) = (37, 50, 45);
    let (a, b) = (
        q(DType::F16, data(m * kk, 4)),
        q(DType::F16, data(kk * n, 5)),
    );
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
    close(out(&args[2]), &want, 1e-5);
}

/// A GEMM's programs run in grouped order (`program_order`): each program
/// still computes and writes its own tile, with the ids it always had,
/// over a grid with a partial group (5 x 3, groups of 8 along axis 0) and one
/// with several groups (19 x 2); attention's operands (both chosen by axis 1)
/// are left in grouping alone, and only its causal form is reordered.
#[test]
fn grouped_program_order_relabels_every_program_once() {
    const SRC: &str = r#"
@kernel(grid=(cdiv(M, 16), cdiv(N, 16)), num_warps=1)
def ids(A: Tensor["M", "K", f32], B: Tensor["K", "N", f32], C: Tensor["M", "N", f32],
        P: Tensor["M", "N", f32]):
    m0 = program_id(0) * 16
    n0 = program_id(1) * 16
    acc = zeros([16, 16], f32)
    for k in range(0, K, 16):
        acc = dot(load(A[m0 : m0 + 16, k : k + 16]), load(B[k : k + 16, n0 : n0 + 16]), acc)
    store(C[m0 : m0 + 16, n0 : n0 + 16], acc)
    store(P[m0 : m0 + 16, n0 : n0 + 16], full([16, 16], (program_id(0) * 1000 + program_id(1)).to(f32), f32))
"#;
    let k = kernel(SRC, "ids", &Specialization::new());
    assert!(
        k.body
            .ops
            .iter()
            .any(|op| matches!(op.kind, OpKind::NumPrograms(1))),
        "grouped:\n{}",
        k.dump()
    );
    for (gm, gn) in [(5, 3), (19, 2)] {
        let (m, kk, n) = (16 * gm, 32, 16 * gn);
        let (a, b) = (data(m * kk, 6), data(kk * n, 7));
        let mut args = [
            tensor(&[m, kk], a.clone()),
            tensor(&[kk, n], b.clone()),
            tensor(&[m, n], vec![0.0; m * n]),
            tensor(&[m, n], vec![-1.0; m * n]),
        ];
        launch(&k, [gm, gn, 1], &mut args);
        let mut want = vec![0.0; m * n];
        let mut ids = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = (0..kk).map(|l| a[i * kk + l] * b[l * n + j]).sum();
                ids[i * n + j] = ((i / 16) * 1000 + j / 16) as f64;
            }
        }
        close(out(&args[2]), &want, 1e-5);
        assert_eq!(out(&args[3]), &ids[..], "grid {gm} x {gn}");
    }
    let attn = std_kernel(
        "attention",
        "flash_attn",
        &Specialization::new().with("D", 16),
    );
    assert!(
        !attn
            .body
            .ops
            .iter()
            .any(|op| matches!(op.kind, OpKind::NumPrograms(_))),
        "{}",
        attn.dump()
    );
    // Causal: the query blocks' trip counts grow with axis 0, walked
    // backwards (its numerics: `flash_attention_matches_the_definition`).
    let spec = Specialization::new().with("D", 16).with("causal", 1);
    let causal = std_kernel("attention", "flash_attn", &spec);
    let reversed = causal
        .body
        .ops
        .iter()
        .any(|op| matches!(op.kind, OpKind::NumPrograms(0)));
    assert!(reversed, "{}", causal.dump());
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
    let (q, kk, v) = (bf(data(n, 6)), bf(data(n, 7)), bf(data(n, 8)));
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
        close(out(&args[3]), &want, 2e-2);
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
    close(out(&args[3]), &want, 1e-5);
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
        close(out(&args[1]), &want, 1e-5);
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
    let (q, kk, v) = (bf(data(n, 12)), bf(data(n, 13)), bf(data(n, 14)));
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
        close(out(&args[3]), &want, 2e-2);
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
    let x = q(DType::F16, data(size, 15));
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
                let mut acc = crate::exec::round_to(DType::F16, t + 1.5); // `t + 1.5` is f16
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
        close(out(&args[1]), &want, 1e-5);
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
    let x = q(DType::F32, data(m * n, 16));
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

/// Gathers with a run-time fill, an affine (range) index, a 2-D outer-product
/// gather with a masked-off row, and an i64 index tile with values past i32.
#[test]
fn gathers_read_each_element_at_its_index() {
    let src = "@kernel(grid=(cdiv(K, 16),))\ndef gather(x: Tensor[\"N\", \"C\", f32], rows: Tensor[\"K\", i64], out: Tensor[\"K\", 8, f32], fill: f32):\n    k0 = program_id(0) * 16\n    j = k0 + arange(0, 16)\n    r = load(rows[j], mask=j < K, other=-1)\n    cols = arange(0, 8) * 2 + 1\n    t = load(x[r, cols], mask=(arange(0, 16) != 5)[:, None], other=fill)\n    store(out[j, 0 : 8], t)\n";
    let k = kernel(src, "gather", &Specialization::new());
    let text = k.dump();
    // `j` is `arange + scalar`: a range; `r` and `cols` are gathers.
    assert!(text.contains("load %rows[%"), "{text}");
    assert!(text.contains(" : +16]"), "{text}");
    assert!(text.contains("load %x[each %"), "{text}");
    let (n, c, kk) = (9, 20, 37);
    let x = q(DType::F32, data(n * c, 21));
    let rows: Vec<f64> = (0..kk)
        .map(|i| match i % 7 {
            0 => -1.0,
            1 => n as f64,
            2 => 4294967296.0 + 2.0, // 2^32 + 2: must not wrap to row 2
            _ => ((i * 5) % n) as f64,
        })
        .collect();
    let mut args = [
        tensor(&[n, c], x.clone()),
        tensor(&[kk], rows.clone()),
        tensor(&[kk, 8], vec![0.0; kk * 8]),
        ArgV::Scalar(-3.0),
    ];
    launch(&k, [kk.div_ceil(16), 1, 1], &mut args);
    let mut want = vec![0.0; kk * 8];
    for i in 0..kk {
        for j in 0..8 {
            let col = 2 * j + 1;
            let r = rows[i];
            want[i * 8 + j] = if i % 16 != 5 && r >= 0.0 && r < n as f64 {
                x[r as usize * c + col]
            } else {
                -3.0
            };
        }
    }
    close(out(&args[2]), &want, 0.0);
}

/// A scatter through a permutation and an atomic histogram whose values
/// include ones outside it (never written) and masked-off lanes.
#[test]
fn scatters_write_each_element_at_its_index() {
    let src = "@kernel(grid=(1,))\ndef permute_rows(x: Tensor[8, 4, f32], p: Tensor[8, i32], out: Tensor[8, 4, f32]):\n    store(out[load(p[0 : 8]), 0 : 4], load(x[0 : 8, 0 : 4]))\n\n@kernel(grid=(cdiv(N, 32),))\ndef histogram(v: Tensor[\"N\", i32], hist: Tensor[6, f32]):\n    offs = program_id(0) * 32 + arange(0, 32)\n    atomic_add(hist[load(v[offs])], 0.5, mask=offs < N)\n";
    let k = kernel(src, "permute_rows", &Specialization::new());
    let x = q(DType::F32, data(32, 5));
    let p = [3.0, 7.0, 0.0, 5.0, 1.0, 6.0, 2.0, 4.0];
    let mut args = [
        tensor(&[8, 4], x.clone()),
        tensor(&[8], p.to_vec()),
        tensor(&[8, 4], vec![0.0; 32]),
    ];
    launch(&k, [1, 1, 1], &mut args);
    let mut want = vec![0.0; 32];
    for i in 0..8 {
        for j in 0..4 {
            want[p[i] as usize * 4 + j] = x[i * 4 + j];
        }
    }
    close(out(&args[2]), &want, 0.0);

    let k = kernel(src, "histogram", &Specialization::new());
    let n = 75;
    let v: Vec<f64> = (0..n).map(|i| ((i * 7) % 9) as f64 - 1.0).collect();
    let mut args = [tensor(&[n], v.clone()), tensor(&[6], vec![0.0; 6])];
    launch(&k, [n.div_ceil(32), 1, 1], &mut args);
    let mut want = vec![0.0; 6];
    for &b in &v {
        if (0.0..6.0).contains(&b) {
            want[b as usize] += 0.5;
        }
    }
    close(out(&args[1]), &want, 0.0);
}

/// Tile slices and indices: negative bounds count from the end, an index
/// drops its axis.
#[test]
fn tile_slices_and_indices() {
    let src = "@kernel(grid=(1,))\ndef pieces(x: Tensor[8, 8, f32], a: Tensor[4, 4, f32], b: Tensor[8, f32], c: Tensor[2, f32]):\n    t = load(x[:, :])\n    store(a[:, :], t[2:6, -4:] * 2.0)\n    store(b[:], t[:, 5])\n    store(c[0], t[-1, 0])\n    store(c[1], t[3][7])\n";
    let k = kernel(src, "pieces", &Specialization::new());
    let x = q(DType::F32, data(64, 9));
    let mut args = [
        tensor(&[8, 8], x.clone()),
        tensor(&[4, 4], vec![0.0; 16]),
        tensor(&[8], vec![0.0; 8]),
        tensor(&[2], vec![0.0; 2]),
    ];
    launch(&k, [1, 1, 1], &mut args);
    let want_a: Vec<f64> = (0..16)
        .map(|i| 2.0 * x[(2 + i / 4) * 8 + 4 + i % 4])
        .collect();
    let want_b: Vec<f64> = (0..8).map(|r| x[r * 8 + 5]).collect();
    close(out(&args[1]), &want_a, 0.0);
    close(out(&args[2]), &want_b, 0.0);
    close(out(&args[3]), &[x[56], x[31]], 0.0);
}

/// `**` on f32 and integer tiles (tests/ui/valid/powers.tsr) against f64
/// `powf` and wrapping integer powers.
#[test]
fn powers_follow_powf_and_wrap_on_integers() {
    let src = include_str!("../../../../tests/ui/valid/powers.tsr");
    let k = kernel(src, "powers", &Specialization::new());
    let mut x = q(DType::F32, data(16, 31).iter().map(|v| 2.0 * v).collect());
    x[0] = 0.0;
    x[1] = -1.5;
    let e: Vec<f64> = (0..16).map(|i| ((i * 5) % 9) as f64).collect();
    let mut args = [
        tensor(&[16], x.clone()),
        tensor(&[16], e.clone()),
        tensor(&[5, 16], vec![0.0; 80]),
        tensor(&[3, 16], vec![0.0; 48]),
        ArgV::Scalar(0.75),
    ];
    launch(&k, [1, 1, 1], &mut args);
    let powf = |a: f64, b: f64| (a as f32).powf(b as f32) as f64;
    let mut want = Vec::new();
    for f in [
        &(|a: f64, _: f64| a * a) as &dyn Fn(f64, f64) -> f64,
        &|a, _| a * a * a,
        &|a, _| powf(a, 0.75),
        &|a, _| powf(a, -2.0),
        &|a, k| powf(a, k - 3.0),
    ] {
        want.extend(x.iter().zip(&e).map(|(&a, &k)| f(a, k)));
    }
    let got = out(&args[2]);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "element {i}: {g} vs {w}"
        );
    }
    assert!(got[32 + 1].is_nan(), "(-1.5) ** 0.75 is NaN");
    let ipow = |a: i64, b: i64| -> f64 {
        if b < 0 {
            match a {
                1 => 1.0,
                -1 if b % 2 == 0 => 1.0,
                -1 => -1.0,
                _ => 0.0,
            }
        } else {
            a.wrapping_pow(b as u32) as i32 as f64
        }
    };
    let mut iwant = Vec::new();
    iwant.extend(e.iter().map(|&k| ipow(k as i64, 3)));
    iwant.extend(e.iter().map(|&k| ipow(k as i64, k as i64)));
    iwant.extend(e.iter().map(|&k| ipow(k as i64 - 2, k as i64 - 5)));
    close(out(&args[3]), &iwant, 0.0);
}

/// tests/ui/emit/kernel_dtypes.tsr: i64 loop bounds and indices, unsigned
/// negation, bool reductions and ordering, f64/i64 reductions, f16 and i64
/// atomics, a `for` with `break` over a run-time step.
#[test]
fn less_common_dtypes_and_forms() {
    let src = include_str!("../../../../tests/ui/emit/kernel_dtypes.tsr");
    let spec = Specialization::new();
    // i64 bounds: out[s : s + 16] = 2 * sum_{i in [s, t)} x[i : i + 16].
    let k = kernel(src, "i64_indices", &spec);
    let n = 40;
    let x = q(DType::F32, data(n, 41));
    let (s, t) = (3usize, 7usize);
    let mut args = [
        tensor(&[n], x.clone()),
        tensor(&[n], vec![0.0; n]),
        ArgV::Scalar(s as f64),
        ArgV::Scalar(t as f64),
    ];
    launch(&k, [1, 1, 1], &mut args);
    let mut want = vec![0.0; n];
    for j in 0..16 {
        want[s + j] = 2.0 * (s..t).map(|i| x[i + j]).sum::<f64>();
    }
    close(out(&args[1]), &want, 1e-5);
    // Unsigned negation wraps; bools order False < True.
    let k = kernel(src, "small_ints", &spec);
    let a: Vec<f64> = (0..64).map(|i| (i * 7 % 256) as f64).collect();
    let b: Vec<f64> = (0..64).map(|i| (i * 1_000_003) as f64).collect();
    let f: Vec<f64> = (0..64).map(|i| (i % 3 == 0) as u8 as f64).collect();
    let mut args = [
        tensor(&[64], a.clone()),
        tensor(&[64], b.clone()),
        tensor(&[64], f.clone()),
        tensor(&[64], vec![0.0; 64]),
        tensor(&[2], vec![0.0; 2]),
    ];
    launch(&k, [1, 1, 1], &mut args);
    let want: Vec<f64> = (0..64)
        .map(|i| {
            let (x, y) = (a[i] as u32 as u8, b[i] as u32);
            let negx = (x.wrapping_neg()) as u32;
            y.wrapping_neg().wrapping_add(y).wrapping_add(negx) as f64
        })
        .collect();
    close(out(&args[3]), &want, 0.0);
    let g0 = a[0] > 3.0;
    let any = f.iter().any(|&v| v != 0.0) | (!(f[0] != 0.0) & g0);
    let all = (0..64).all(|i| f[i] != 0.0 || a[i] > 3.0);
    close(out(&args[4]), &[any as u8 as f64, all as u8 as f64], 0.0);
    // A run-time step with a break.
    let k = kernel(src, "strided_until", &spec);
    let n = 50;
    let x: Vec<f64> = (0..n).map(|i| i as f64 * 0.25).collect();
    for (step, limit) in [(3i64, 6.0), (7, 100.0), (-1, 0.0)] {
        let mut args = [
            tensor(&[n], x.clone()),
            tensor(&[1], vec![0.0]),
            ArgV::Scalar(step as f64),
            ArgV::Scalar(limit),
        ];
        launch(&k, [1, 1, 1], &mut args);
        let mut acc = 0.0;
        let mut i = 0i64;
        while (step > 0 && i < n as i64) || (step < 0 && i > n as i64) {
            if x[i as usize] > limit {
                break;
            }
            acc += x[i as usize];
            i += step;
        }
        close(out(&args[1]), &[acc], 1e-6);
    }
}
