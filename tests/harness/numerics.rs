//! Numerics of the CPU executor (`cargo test -p tessera-tests --test numerics`):
//! every stdlib kernel (launched with `exec::launch_kernel`) and every tensor
//! builtin (the wrappers of `tests/numerics/builtins.tsr`, run with
//! `exec::run_function`) against f64 references written here, never by the
//! executor. Sizes are deliberately not multiples of the tiles, so masking is
//! exercised. Tolerances follow the dtype: f32 arithmetic 1e-5, tf32 products
//! (the f32 matmul runs at tf32 as on the GPU) 5e-3, f16 5e-3, bf16 3e-2, all
//! relative to `1 + |reference|`. Inputs are rounded to the tensor dtype before
//! the reference sees them.
//!
//! Also here: the run-time error codes (E07xx, which no UI case can produce:
//! each is triggered through the API and its code and help line checked), and `.npy` round
//! trips plus files written by numpy (`tests/numerics/npy/`).

use std::path::PathBuf;

use tessera::check::DType;
use tessera::db::{Database, SourceFile};
use tessera::exec::{
    launch_kernel, npy, rng, round_to, run_function, ExecError, IndexItem, Interrupt, Tensor, Value,
};

fn root() -> PathBuf {
    tessera_tests::workspace_root()
}

fn builtins() -> (Database, SourceFile) {
    let mut db = Database::new();
    let path = root().join("tests/numerics/builtins.tsr");
    let file = db.load_file(&path).expect("builtins.tsr");
    let errors: Vec<_> = db
        .diagnostics(file)
        .iter()
        .filter(|d| d.is_error())
        .cloned()
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    (db, file)
}

/// Deterministic inputs in [-1, 1), rounded to `d`.
fn data(n: usize, seed: u64, d: DType) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            round_to(d, ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0)
        })
        .collect()
}

fn t(shape: &[usize], d: DType, v: &[f64]) -> Value {
    Value::Tensor(Tensor::from_f64(shape, d, v))
}

fn tensor(v: &Value) -> &Tensor {
    match v {
        Value::Tensor(t) => t,
        other => panic!("not a tensor: {other:?}"),
    }
}

#[track_caller]
fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan());
        assert!(
            ok,
            "{what}: element {i}: got {g}, reference {w} (tol {tol})"
        );
    }
}

const F32: f64 = 1e-5;
const TF32: f64 = 5e-3;
const HALF: f64 = 5e-3;
const BF16: f64 = 3e-2;

fn call(db: &Database, file: SourceFile, f: &str, args: &[Value]) -> Vec<f64> {
    let v = run_function(
        db,
        file,
        f,
        args,
        &[],
        &tessera::exec::Device::Cpu,
        &Interrupt::new(),
    )
    .unwrap_or_else(|e| panic!("{f}: {e}"));
    tensor(&v).to_f64_vec()
}

fn map2(a: &[f64], b: &[f64], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| f(*x, *y)).collect()
}

fn erf(x: f64) -> f64 {
    // Series / continued fraction, ~1e-13: independent of the executor's.
    if x.abs() < 3.0 {
        let (mut sum, mut term) = (x, x);
        for n in 1..100 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        x.signum()
    }
}

fn matmul_ref(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for l in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + l] * b[l * n + j];
            }
        }
    }
    c
}

fn rows(x: &[f64], m: usize, n: usize) -> Vec<&[f64]> {
    (0..m).map(|r| &x[r * n..(r + 1) * n]).collect()
}

fn softmax_ref(x: &[f64], m: usize, n: usize) -> Vec<f64> {
    rows(x, m, n)
        .into_iter()
        .flat_map(|row| {
            let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = row.iter().map(|v| (v - mx).exp()).sum();
            row.iter()
                .map(move |v| (v - mx).exp() / z)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn transpose_ref(x: &[f64], m: usize, n: usize) -> Vec<f64> {
    (0..n)
        .flat_map(|j| (0..m).map(move |i| x[i * n + j]))
        .collect()
}

fn layer_norm_ref(
    x: &[f64],
    w: &[f64],
    b: Option<&[f64]>,
    m: usize,
    n: usize,
    eps: f64,
) -> Vec<f64> {
    let mut out = Vec::new();
    for row in rows(x, m, n) {
        let (mean, var) = match b {
            Some(_) => {
                let mean = row.iter().sum::<f64>() / n as f64;
                (
                    mean,
                    row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64,
                )
            }
            None => (0.0, row.iter().map(|v| v * v).sum::<f64>() / n as f64),
        };
        for c in 0..n {
            let y = (row[c] - mean) / (var + eps).sqrt() * w[c];
            out.push(y + b.map_or(0.0, |b| b[c]));
        }
    }
    out
}

fn gelu_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / 2f64.sqrt()))
}

fn silu_ref(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
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
    masked_attention_ref(q, k, v, bh, s, d, scale, |i, j| !causal || j <= i)
}

/// Attention where query `i` sees key `j` only when `keep(i, j)`.
#[allow(clippy::too_many_arguments)]
fn masked_attention_ref(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    bh: usize,
    s: usize,
    d: usize,
    scale: f64,
    keep: impl Fn(usize, usize) -> bool,
) -> Vec<f64> {
    let mut o = vec![0.0; bh * s * d];
    for h in 0..bh {
        let base = h * s * d;
        for i in 0..s {
            let sc: Vec<f64> = (0..s)
                .map(|j| {
                    if !keep(i, j) {
                        f64::NEG_INFINITY
                    } else {
                        (0..d)
                            .map(|t| q[base + i * d + t] * k[base + j * d + t])
                            .sum::<f64>()
                            * scale
                    }
                })
                .collect();
            let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = w.iter().sum();
            for t in 0..d {
                o[base + i * d + t] = (0..s).map(|j| w[j] * v[base + j * d + t]).sum::<f64>() / z;
            }
        }
    }
    o
}

// ---- tensor builtins through run_function ----

#[test]
fn elementwise_builtins() {
    let (db, file) = builtins();
    let (m, n) = (37, 45);
    let x = data(m * n, 1, DType::F32);
    let y = data(m * n, 2, DType::F32);
    let got = call(
        &db,
        file,
        "ew_f32",
        &[t(&[m, n], DType::F32, &x), t(&[m, n], DType::F32, &y)],
    );
    let want = map2(&x, &y, |x, y| {
        x.exp() * y - x.abs() / (1.0 + y * y)
            + y.abs().sqrt()
            + x.tanh()
            + 1.0 / (1.0 + (-y).exp())
            + erf(x)
    });
    close("ew_f32", &got, &want, F32);

    let got = call(&db, file, "ew_more", &[t(&[m, n], DType::F32, &x)]);
    let want: Vec<f64> = x
        .iter()
        .map(|&x| {
            (x.abs() + 1.0).ln() + (x.abs() + 2.0).log2() + x.exp2() + 1.0 / (x.abs() + 0.5).sqrt()
                - x.max(0.25)
                + x.min(-0.25)
        })
        .collect();
    close("ew_more", &got, &want, F32);

    let row = data(n, 3, DType::F32);
    let col = data(m, 4, DType::F32);
    let got = call(
        &db,
        file,
        "ew_broadcast",
        &[
            t(&[m, n], DType::F32, &x),
            t(&[n], DType::F32, &row),
            t(&[m, 1], DType::F32, &col),
            Value::Float(0.5),
        ],
    );
    let want: Vec<f64> = (0..m * n)
        .map(|i| (x[i] + row[i % n]) * col[i / n] - 0.5)
        .collect();
    close("ew_broadcast", &got, &want, F32);

    let xh = data(m * n, 5, DType::F16);
    let yh = data(m * n, 6, DType::F16);
    let got = call(
        &db,
        file,
        "ew_f16",
        &[t(&[m, n], DType::F16, &xh), t(&[m, n], DType::F16, &yh)],
    );
    close("ew_f16", &got, &map2(&xh, &yh, |x, y| x * y + x), HALF);

    let xi: Vec<f64> = (0..300).map(|i| (i as f64 * 7.0) % 61.0 - 30.0).collect();
    let yi: Vec<f64> = (0..300)
        .map(|i| {
            if i % 2 == 0 {
                1.0 + (i % 9) as f64
            } else {
                -1.0 - (i % 5) as f64
            }
        })
        .collect();
    let got = call(
        &db,
        file,
        "ew_int",
        &[t(&[300], DType::I32, &xi), t(&[300], DType::I32, &yi)],
    );
    let want = map2(&xi, &yi, |x, y| {
        (x / y).floor() + (x - y * (x / y).floor()) + x * 3.0 - y
    });
    close("ew_int (floor division, Python modulo)", &got, &want, 0.0);

    let got = call(
        &db,
        file,
        "ew_where",
        &[t(&[1000], DType::F32, &data(1000, 7, DType::F32))],
    );
    let want: Vec<f64> = data(1000, 7, DType::F32)
        .iter()
        .map(|&x| if x > 0.0 { x } else { x * 0.5 })
        .collect();
    close("ew_where", &got, &want, F32);
}

#[test]
fn activations() {
    let (db, file) = builtins();
    let (m, n) = (19, 131);
    let x: Vec<f64> = data(m * n, 8, DType::F32).iter().map(|v| v * 4.0).collect();
    let xt = t(&[m, n], DType::F32, &x);
    close(
        "relu",
        &call(&db, file, "act_relu", std::slice::from_ref(&xt)),
        &x.iter().map(|v| v.max(0.0)).collect::<Vec<_>>(),
        F32,
    );
    close(
        "gelu",
        &call(&db, file, "act_gelu", std::slice::from_ref(&xt)),
        &x.iter().map(|v| gelu_ref(*v)).collect::<Vec<_>>(),
        F32,
    );
    close(
        "silu",
        &call(&db, file, "act_silu", &[xt]),
        &x.iter().map(|v| silu_ref(*v)).collect::<Vec<_>>(),
        F32,
    );
}

#[test]
fn matmuls() {
    let (db, file) = builtins();
    let (m, k, n) = (70, 50, 45);
    for (f, d, tol) in [
        ("mm_f32", DType::F32, F32),
        ("mm_op", DType::F32, F32),
        ("mm_f32_tf32", DType::F32, TF32),
        ("mm_f16", DType::F16, HALF),
        ("mm_bf16", DType::BF16, BF16),
    ] {
        let a = data(m * k, 9, d);
        let b = data(k * n, 10, d);
        let got = call(&db, file, f, &[t(&[m, k], d, &a), t(&[k, n], d, &b)]);
        close(f, &got, &matmul_ref(&a, &b, m, k, n), tol);
    }
    let z = 3;
    let a = data(z * m * k, 11, DType::F16);
    let b = data(z * k * n, 12, DType::F16);
    let got = call(
        &db,
        file,
        "mm_batched",
        &[t(&[z, m, k], DType::F16, &a), t(&[z, k, n], DType::F16, &b)],
    );
    let want: Vec<f64> = (0..z)
        .flat_map(|i| {
            matmul_ref(
                &a[i * m * k..(i + 1) * m * k],
                &b[i * k * n..(i + 1) * k * n],
                m,
                k,
                n,
            )
        })
        .collect();
    close("mm_batched", &got, &want, HALF);
}

/// `sum(a[i] * b[i])` with twice the working precision (Ogita, Rump and
/// Oishi's Dot2: error-free products and sums), the reference for f64
/// products, whose plain f64 evaluation would be as wrong as the result.
fn dot2(a: impl Iterator<Item = f64>, b: impl Iterator<Item = f64>) -> f64 {
    let two_sum = |x: f64, y: f64| {
        let s = x + y;
        let z = s - x;
        (s, (x - (s - z)) + (y - z))
    };
    let (mut s, mut c) = (0.0f64, 0.0f64);
    for (x, y) in a.zip(b) {
        let p = x * y;
        let e = x.mul_add(y, -p);
        let (t, q) = two_sum(s, p);
        s = t;
        c += q + e;
    }
    s + c
}

fn matmul_ref2(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    (0..m * n)
        .map(|ij| {
            let (i, j) = (ij / n, ij % n);
            dot2(
                a[i * k..(i + 1) * k].iter().copied(),
                (0..k).map(|l| b[l * n + j]),
            )
        })
        .collect()
}

fn max_abs_err(got: &[f64], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f64::max)
}

/// f32 `matmul` is ieee unless tf32 is asked for, f64 `matmul` accumulates in
/// f64: measured against references with K = 1000 (prints the max errors;
/// `cargo test -p tessera-tests --test numerics matmul_precision -- --nocapture`).
#[test]
fn matmul_precision() {
    let (db, file) = builtins();
    let (m, k, n) = (40, 1000, 36);
    let a = data(m * k, 31, DType::F32);
    let b = data(k * n, 32, DType::F32);
    let args = [t(&[m, k], DType::F32, &a), t(&[k, n], DType::F32, &b)];
    let want = matmul_ref2(&a, &b, m, k, n);
    let ieee = max_abs_err(&call(&db, file, "mm_f32", &args), &want);
    let tf32 = max_abs_err(&call(&db, file, "mm_f32_tf32", &args), &want);
    eprintln!("f32 matmul {m}x{k}x{n}: max error ieee {ieee:.3e}, tf32 {tf32:.3e}");
    // f32 rounding of K sums of magnitude ~10 (~1e-6 each) stays under
    // 1e-4; tf32's 10-bit operands are off by ~1e-3 per product.
    assert!(ieee < 1e-4, "ieee f32 matmul error {ieee}");
    assert!(tf32 > 1e-3, "tf32 was asked for, error {tf32}");

    for (m, k, n) in [(64, 64, 64), (33, 1000, 29)] {
        let a = data(m * k, 33, DType::F64);
        let b = data(k * n, 34, DType::F64);
        let got = call(
            &db,
            file,
            "mm_f64",
            &[t(&[m, k], DType::F64, &a), t(&[k, n], DType::F64, &b)],
        );
        let err = max_abs_err(&got, &matmul_ref2(&a, &b, m, k, n));
        eprintln!("f64 matmul {m}x{k}x{n}: max error {err:.3e}");
        // f64 accumulation (an f32 temporary gives ~1e-6).
        assert!(err < 1e-13, "f64 matmul error {err}");
    }
    let (z, m, k, n) = (2, 9, 300, 7);
    let a = data(z * m * k, 35, DType::F64);
    let b = data(z * k * n, 36, DType::F64);
    let got = call(
        &db,
        file,
        "mm_f64_batched",
        &[t(&[z, m, k], DType::F64, &a), t(&[z, k, n], DType::F64, &b)],
    );
    let want: Vec<f64> = (0..z)
        .flat_map(|i| {
            matmul_ref2(
                &a[i * m * k..(i + 1) * m * k],
                &b[i * k * n..(i + 1) * k * n],
                m,
                k,
                n,
            )
        })
        .collect();
    let err = max_abs_err(&got, &want);
    assert!(err < 1e-13, "batched f64 matmul error {err}");
}

/// Float to integer truncates and saturates with NaN to 0, in generated
/// kernels as in tensor casts; `max` of an empty row is E0317.
#[test]
fn conversions_and_empty_reductions() {
    let (db, file) = builtins();
    let x = [1e10, -1e10, 3.7, -3.7, 200.0, -200.0, f64::NAN, 0.5];
    let sat = |lo: f64, hi: f64| -> Vec<f64> {
        x.iter()
            .map(|v| {
                if v.is_nan() {
                    0.0
                } else {
                    v.trunc().clamp(lo, hi)
                }
            })
            .collect()
    };
    let xf = Tensor::from_f64(&[x.len()], DType::F32, &x);
    let i32s = sat(i32::MIN as f64, i32::MAX as f64);
    close(
        "cast_i32",
        &call(&db, file, "cast_i32", &[Value::Tensor(xf.clone())]),
        &i32s,
        0.0,
    );
    close("to(i32)", &xf.to(DType::I32).to_f64_vec(), &i32s, 0.0);
    let xd = Tensor::from_f64(&[x.len()], DType::F64, &x);
    let i8s = sat(-128.0, 127.0);
    close(
        "cast_i8",
        &call(&db, file, "cast_i8", &[Value::Tensor(xd.clone())]),
        &i8s,
        0.0,
    );
    close("to(i8)", &xd.to(DType::I8).to_f64_vec(), &i8s, 0.0);
    let u8s = sat(0.0, 255.0);
    close(
        "cast_u8",
        &call(&db, file, "cast_u8", &[Value::Tensor(xf.clone())]),
        &u8s,
        0.0,
    );
    close("to(u8)", &xf.to(DType::U8).to_f64_vec(), &u8s, 0.0);
    // Integers wrap.
    let big = Tensor::from_f64(&[2], DType::I32, &[300.0, -129.0]);
    close(
        "i32 to i8",
        &big.to(DType::I8).to_f64_vec(),
        &[44.0, 127.0],
        0.0,
    );

    let e = err_of(run_function(
        &db,
        file,
        "max_last",
        &[Value::Tensor(Tensor::zeros(&[3, 0], DType::F32))],
        &[],
        &tessera::exec::Device::Cpu,
        &Interrupt::new(),
    ));
    assert_eq!(e.code, "E0317", "{e}");
    let got = call(
        &db,
        file,
        "max_last",
        &[t(&[2, 3], DType::F32, &[1.0, 5.0, 2.0, -1.0, -3.0, -2.0])],
    );
    close("max_last", &got, &[5.0, -1.0], 0.0);
}

/// The generated row kernels of known lengths: one register tile (3000, lanes
/// past the row masked) and two passes over chunks: per piece of 16 elements
/// (20000, 40000, 65536: a piece's max and exp sum, mean and M2, sum of
/// squares, merged by Chan's rule; the last chunk ragged but at 65536) and per
/// lane (20001: online max and sum, Welford, sum of squares). Rows offset by
/// 40 so that a one-pass variance (E[x^2] - mean^2) would lose digits that
/// Welford and Chan keep. Softmax's rows also hold -inf: one whole piece, one
/// element of another, and the first chunk's last piece.
#[test]
fn generated_row_kernels_whole_and_chunked() {
    let (db, file) = builtins();
    let m = 3;
    for n in [3000, 20000, 20001, 40000, 65536] {
        let x: Vec<f64> = data(m * n, 31, DType::F32)
            .iter()
            .map(|v| round_to(DType::F32, v * 4.0 + 40.0))
            .collect();
        let xt = t(&[m, n], DType::F32, &x);
        let w = data(n, 32, DType::F32);
        let b = data(n, 33, DType::F32);
        let (wt, bt) = (t(&[n], DType::F32, &w), t(&[n], DType::F32, &b));
        let mut xs = x.clone();
        for i in (16..32).chain([40, 32768 - 16]).filter(|&i| i < n) {
            xs[n + i] = f64::NEG_INFINITY;
        }
        close(
            &format!("softmax {m}x{n}"),
            &call(
                &db,
                file,
                &format!("sm_{n}"),
                &[t(&[m, n], DType::F32, &xs)],
            ),
            &softmax_ref(&xs, m, n),
            F32,
        );
        close(
            &format!("layer_norm {m}x{n}"),
            &call(&db, file, &format!("ln_{n}"), &[xt.clone(), wt.clone(), bt]),
            &layer_norm_ref(&x, &w, Some(&b), m, n, 1e-5),
            1e-4,
        );
        close(
            &format!("rms_norm {m}x{n}"),
            &call(&db, file, &format!("rms_{n}"), &[xt.clone(), wt]),
            &layer_norm_ref(&x, &w, None, m, n, 1e-6),
            1e-4,
        );
    }
}

#[test]
fn softmax_norms_and_reductions() {
    let (db, file) = builtins();
    for (m, n) in [(5, 300), (3, 1500)] {
        let x: Vec<f64> = data(m * n, 13, DType::F32)
            .iter()
            .map(|v| round_to(DType::F32, v * 5.0))
            .collect();
        let xt = t(&[m, n], DType::F32, &x);
        close(
            "softmax(dim=-1)",
            &call(&db, file, "sm_last", std::slice::from_ref(&xt)),
            &softmax_ref(&x, m, n),
            F32,
        );
        let want = transpose_ref(&softmax_ref(&transpose_ref(&x, m, n), n, m), n, m);
        close(
            "softmax(dim=0)",
            &call(&db, file, "sm_first", std::slice::from_ref(&xt)),
            &want,
            F32,
        );
        let w = data(n, 14, DType::F32);
        let b = data(n, 15, DType::F32);
        if n > 1024 {
            // The schedule runs layer_norm_rows, which needs a row within 1024.
            let e = err_of(run_function(
                &db,
                file,
                "ln",
                &[xt.clone(), t(&[n], DType::F32, &w), t(&[n], DType::F32, &b)],
                &[],
                &tessera::exec::Device::Cpu,
                &Interrupt::new(),
            ));
            assert_eq!(e.code, "E0711", "{e}");
            continue;
        }
        let got = call(
            &db,
            file,
            "ln",
            &[xt.clone(), t(&[n], DType::F32, &w), t(&[n], DType::F32, &b)],
        );
        close(
            "layer_norm",
            &got,
            &layer_norm_ref(&x, &w, Some(&b), m, n, 1e-5),
            1e-4,
        );
        let got = call(&db, file, "rms", &[xt.clone(), t(&[n], DType::F32, &w)]);
        close(
            "rms_norm",
            &got,
            &layer_norm_ref(&x, &w, None, m, n, 1e-6),
            1e-4,
        );
        let r = rows(&x, m, n);
        let sum: Vec<f64> = r.iter().map(|r| r.iter().sum()).collect();
        close(
            "sum(dim=-1)",
            &call(&db, file, "red_sum_last", std::slice::from_ref(&xt)),
            &sum,
            1e-4,
        );
        let mx: Vec<f64> = r
            .iter()
            .map(|r| r.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
            .collect();
        close(
            "max(dim=-1)",
            &call(&db, file, "red_max_last", std::slice::from_ref(&xt)),
            &mx,
            0.0,
        );
        let mean: Vec<f64> = sum.iter().map(|s| s / n as f64).collect();
        close(
            "mean(dim=-1)",
            &call(&db, file, "red_mean_last", std::slice::from_ref(&xt)),
            &mean,
            F32,
        );
        let cols = transpose_ref(&x, m, n);
        let c = rows(&cols, n, m);
        let mn: Vec<f64> = c
            .iter()
            .map(|c| c.iter().cloned().fold(f64::INFINITY, f64::min))
            .collect();
        close(
            "min(dim=0)",
            &call(&db, file, "red_min_first", std::slice::from_ref(&xt)),
            &mn,
            0.0,
        );
        let cs: Vec<f64> = c.iter().map(|c| c.iter().sum()).collect();
        close(
            "sum(dim=0)",
            &call(&db, file, "red_sum_first", &[xt]),
            &cs,
            1e-4,
        );
    }
}

#[test]
fn layout_builtins_and_fills() {
    let (db, file) = builtins();
    let (m, n) = (33, 70);
    let x = data(m * n, 16, DType::F32);
    let xt = t(&[m, n], DType::F32, &x);
    close(
        "transpose",
        &call(&db, file, "tr", std::slice::from_ref(&xt)),
        &transpose_ref(&x, m, n),
        0.0,
    );
    let want: Vec<f64> = transpose_ref(&x, m, n).iter().map(|v| v + 1.0).collect();
    close(
        "x.T",
        &call(&db, file, "tr_t", std::slice::from_ref(&xt)),
        &want,
        F32,
    );
    let want: Vec<f64> = x.iter().map(|v| v * 2.0).collect();
    close(
        "reshape",
        &call(&db, file, "rs", std::slice::from_ref(&xt)),
        &want,
        0.0,
    );
    let want: Vec<f64> = x.iter().map(|v| v + 3.5).collect();
    close(
        "zeros/ones/full",
        &call(&db, file, "fills", std::slice::from_ref(&xt)),
        &want,
        F32,
    );
    // randn: the same samples as exec::rng (deterministic per seed), added to x.
    let got = call(&db, file, "noise", std::slice::from_ref(&xt));
    let again = call(&db, file, "noise", &[xt]);
    assert_eq!(got, again, "randn is deterministic per seed");
    let noise: Vec<f64> = got.iter().zip(&x).map(|(g, x)| g - x).collect();
    let mean = noise.iter().sum::<f64>() / noise.len() as f64;
    let var = noise.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / noise.len() as f64;
    assert!(
        mean.abs() < 0.1 && (var - 1.0).abs() < 0.15,
        "randn: mean {mean}, variance {var}"
    );
}

#[test]
fn recursion_and_tensor_literals() {
    let (db, file) = builtins();
    let x = data(50, 30, DType::F32);
    for n in [0i64, 1, 4] {
        let got = call(&db, file, "rec", &[t(&[50], DType::F32, &x), Value::Int(n)]);
        let want: Vec<f64> = x.iter().map(|v| v + n as f64).collect();
        close("recursive call", &got, &want, F32);
    }
    let got = call(&db, file, "lit", &[t(&[3], DType::F32, &[2.0, 2.0, -1.0])]);
    close("tensor literal", &got, &[2.0, 4.0, -3.0], 0.0);
}

#[test]
fn attention_pattern_runs_flash_attention() {
    let (db, file) = builtins();
    let (b, h, s, d) = (1, 2, 70, 64);
    let n = b * h * s * d;
    let (q, k, v) = (
        data(n, 17, DType::BF16),
        data(n, 18, DType::BF16),
        data(n, 19, DType::BF16),
    );
    let dims = [b, h, s, d];
    let got = call(
        &db,
        file,
        "attn",
        &[
            t(&dims, DType::BF16, &q),
            t(&dims, DType::BF16, &k),
            t(&dims, DType::BF16, &v),
        ],
    );
    close(
        "attention",
        &got,
        &attention_ref(&q, &k, &v, b * h, s, d, 0.125, false),
        BF16,
    );
}

// ---- stdlib kernels through launch_kernel ----

fn launch(db: &Database, file: SourceFile, k: &str, args: &[Value], named: &[(&str, Value)]) {
    let named: Vec<(String, Value)> = named
        .iter()
        .map(|(n, v)| (n.to_string(), v.clone()))
        .collect();
    launch_kernel(
        db,
        file,
        k,
        None,
        args,
        &named,
        &tessera::exec::Device::Cpu,
        &Interrupt::new(),
    )
    .unwrap_or_else(|e| panic!("{k}: {e}"));
}

fn std_file() -> (Database, SourceFile) {
    let mut db = Database::new();
    let file = db.set_source("/numerics/std.tsr", "import std.linalg\n".into());
    (db, file)
}

#[test]
fn stdlib_gemms() {
    let (db, file) = std_file();
    let (m, k, n) = (150, 70, 90);
    for (name, d, tol) in [
        ("gemm", DType::F16, HALF),
        ("gemm_bf16", DType::BF16, BF16),
        ("gemm_tf32", DType::F32, TF32),
    ] {
        let a = data(m * k, 20, d);
        let b = data(k * n, 21, d);
        let c = Tensor::zeros(&[m, n], DType::F32);
        launch(
            &db,
            file,
            name,
            &[
                t(&[m, k], d, &a),
                t(&[k, n], d, &b),
                Value::Tensor(c.clone()),
            ],
            &[],
        );
        close(name, &c.to_f64_vec(), &matmul_ref(&a, &b, m, k, n), tol);
        // Smaller tiles by name.
        let c = Tensor::zeros(&[m, n], DType::F32);
        launch(
            &db,
            file,
            name,
            &[
                t(&[m, k], d, &a),
                t(&[k, n], d, &b),
                Value::Tensor(c.clone()),
            ],
            &[
                ("BM", Value::Int(32)),
                ("BN", Value::Int(32)),
                ("BK", Value::Int(16)),
            ],
        );
        close(name, &c.to_f64_vec(), &matmul_ref(&a, &b, m, k, n), tol);
    }
    // The bf16 product rounded once into a bf16 C (half a bf16 ulp more).
    let a = data(m * k, 20, DType::BF16);
    let b = data(k * n, 21, DType::BF16);
    let c = Tensor::zeros(&[m, n], DType::BF16);
    launch(
        &db,
        file,
        "gemm_bf16_out",
        &[
            t(&[m, k], DType::BF16, &a),
            t(&[k, n], DType::BF16, &b),
            Value::Tensor(c.clone()),
        ],
        &[],
    );
    close(
        "gemm_bf16_out",
        &c.to_f64_vec(),
        &matmul_ref(&a, &b, m, k, n),
        BF16,
    );
    let z = 2;
    let a = data(z * m * k, 22, DType::F16);
    let b = data(z * k * n, 23, DType::F16);
    let c = Tensor::zeros(&[z, m, n], DType::F32);
    launch(
        &db,
        file,
        "gemm_batched",
        &[
            t(&[z, m, k], DType::F16, &a),
            t(&[z, k, n], DType::F16, &b),
            Value::Tensor(c.clone()),
        ],
        &[],
    );
    let want: Vec<f64> = (0..z)
        .flat_map(|i| {
            matmul_ref(
                &a[i * m * k..(i + 1) * m * k],
                &b[i * k * n..(i + 1) * k * n],
                m,
                k,
                n,
            )
        })
        .collect();
    close("gemm_batched", &c.to_f64_vec(), &want, HALF);
}

#[test]
fn stdlib_rows_kernels() {
    let (db, file) = std_file();
    for (m, n, block) in [(7, 700, 1024), (4, 2500, 1024), (5, 300, 128)] {
        let x: Vec<f64> = data(m * n, 24, DType::F32)
            .iter()
            .map(|v| round_to(DType::F32, v * 3.0))
            .collect();
        let xt = t(&[m, n], DType::F32, &x);
        let w = data(n, 25, DType::F32);
        let b = data(n, 26, DType::F32);
        let fits = n <= block;
        let blk = [("BLOCK", Value::Int(block as i64))];
        let out = || Tensor::zeros(&[m, n], DType::F32);
        for name in ["softmax_rows", "softmax_rows_online"] {
            if name == "softmax_rows" && !fits {
                continue;
            }
            let o = out();
            launch(
                &db,
                file,
                name,
                &[xt.clone(), Value::Tensor(o.clone())],
                &blk,
            );
            close(name, &o.to_f64_vec(), &softmax_ref(&x, m, n), F32);
        }
        for name in ["layer_norm_rows", "layer_norm_rows_online"] {
            if name == "layer_norm_rows" && !fits {
                continue;
            }
            let o = out();
            launch(
                &db,
                file,
                name,
                &[
                    xt.clone(),
                    t(&[n], DType::F32, &w),
                    t(&[n], DType::F32, &b),
                    Value::Tensor(o.clone()),
                    Value::Float(1e-5),
                ],
                &blk,
            );
            close(
                name,
                &o.to_f64_vec(),
                &layer_norm_ref(&x, &w, Some(&b), m, n, 1e-5),
                1e-4,
            );
        }
        for name in ["rms_norm_rows", "rms_norm_rows_online"] {
            if name == "rms_norm_rows" && !fits {
                continue;
            }
            let o = out();
            launch(
                &db,
                file,
                name,
                &[
                    xt.clone(),
                    t(&[n], DType::F32, &w),
                    Value::Tensor(o.clone()),
                    Value::Float(1e-6),
                ],
                &blk,
            );
            close(
                name,
                &o.to_f64_vec(),
                &layer_norm_ref(&x, &w, None, m, n, 1e-6),
                1e-4,
            );
        }
        let r = rows(&x, m, n);
        let sums: Vec<f64> = r.iter().map(|r| r.iter().sum()).collect();
        if fits {
            for (name, want) in [
                ("sum_rows", sums.clone()),
                (
                    "max_rows",
                    r.iter()
                        .map(|r| r.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
                        .collect(),
                ),
                ("mean_rows", sums.iter().map(|s| s / n as f64).collect()),
            ] {
                let o = Tensor::zeros(&[m], DType::F32);
                launch(
                    &db,
                    file,
                    name,
                    &[xt.clone(), Value::Tensor(o.clone())],
                    &blk,
                );
                close(name, &o.to_f64_vec(), &want, 1e-4);
            }
        }
        let cols = transpose_ref(&x, m, n);
        let c = rows(&cols, n, m);
        let csum: Vec<f64> = c.iter().map(|c| c.iter().sum()).collect();
        for (name, want) in [
            ("sum_cols", csum.clone()),
            (
                "max_cols",
                c.iter()
                    .map(|c| c.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
                    .collect(),
            ),
            ("mean_cols", csum.iter().map(|s| s / m as f64).collect()),
        ] {
            let o = Tensor::zeros(&[n], DType::F32);
            launch(
                &db,
                file,
                name,
                &[xt.clone(), Value::Tensor(o.clone())],
                &[("BM", Value::Int(4))],
            );
            close(name, &o.to_f64_vec(), &want, 1e-4);
        }
        let flat = t(&[m * n], DType::F32, &x);
        for (name, f) in [
            ("gelu_kernel", gelu_ref as fn(f64) -> f64),
            ("silu_kernel", silu_ref),
            ("relu_kernel", |v: f64| v.max(0.0)),
        ] {
            let o = Tensor::zeros(&[m * n], DType::F32);
            launch(
                &db,
                file,
                name,
                &[flat.clone(), Value::Tensor(o.clone())],
                &[],
            );
            close(
                name,
                &o.to_f64_vec(),
                &x.iter().map(|v| f(*v)).collect::<Vec<_>>(),
                F32,
            );
        }
    }
}

#[test]
fn stdlib_flash_attention() {
    let (db, file) = std_file();
    for (d, causal, bm, bn, (b, h, s), l2) in [
        (64, false, 32, 32, (1, 2, 100), None),
        (64, true, 32, 32, (1, 2, 100), None),
        (128, false, 32, 32, (1, 2, 100), None),
        (128, true, 32, 32, (1, 2, 100), None),
        // Blocks of other sizes: the diagonal crosses two key blocks, or a
        // key block spans two query blocks.
        (64, true, 64, 16, (1, 2, 100), None),
        (64, true, 16, 64, (1, 2, 100), None),
        // 128-row blocks of a causal kernel run longest first, heads in
        // groups that fit the L2 budget: 6 heads in groups of 4 and 2.
        (64, true, 128, 64, (2, 3, 300), Some(4 * 4 * 300 * 64)),
        (64, true, 128, 64, (2, 3, 300), None),
    ] {
        let n = b * h * s * d;
        let (q, k, v) = (
            data(n, 27, DType::BF16),
            data(n, 28, DType::BF16),
            data(n, 29, DType::BF16),
        );
        let dims = [b, h, s, d];
        let o = Tensor::zeros(&dims, DType::BF16);
        launch(
            &db,
            file,
            "flash_attn",
            &[
                t(&dims, DType::BF16, &q),
                t(&dims, DType::BF16, &k),
                t(&dims, DType::BF16, &v),
                Value::Tensor(o.clone()),
                Value::Float(0.1),
            ],
            &[
                ("causal", Value::Bool(causal)),
                ("BM", Value::Int(bm)),
                ("BN", Value::Int(bn)),
            ]
            .into_iter()
            .chain(l2.map(|l2| ("L2_BUDGET", Value::Int(l2))))
            .collect::<Vec<_>>(),
        );
        close(
            &format!("flash_attn D={d} causal={causal} BM={bm} BN={bn} B={b} H={h} S={s} L2_BUDGET={l2:?}"),
            &o.to_f64_vec(),
            &attention_ref(&q, &k, &v, b * h, s, d, 0.1, causal),
            BF16,
        );
    }
}

/// Attention kernels written as a user would (`tests/numerics/attention.tsr`),
/// visiting every key block: the compiler skips the blocks past the diagonal
/// (or before the window) and masks only the mixed ones; the results match
/// the reference on ragged lengths, with query and key blocks of other sizes.
#[test]
fn user_masked_attention() {
    let mut db = Database::new();
    let file = db
        .load_file(&root().join("tests/numerics/attention.tsr"))
        .expect("attention.tsr");
    for (s, d, bm, bn) in [(100, 64, 32, 16), (77, 32, 16, 32), (40, 16, 64, 16)] {
        let bh = 2;
        let n = bh * s * d;
        let (q, k, v) = (
            data(n, 41, DType::BF16),
            data(n, 42, DType::BF16),
            data(n, 43, DType::BF16),
        );
        let dims = [bh, s, d];
        let args = |o: &Tensor| {
            vec![
                t(&dims, DType::BF16, &q),
                t(&dims, DType::BF16, &k),
                t(&dims, DType::BF16, &v),
                Value::Tensor(o.clone()),
                Value::Float(0.125),
            ]
        };
        let blocks = [("BM", Value::Int(bm)), ("BN", Value::Int(bn))];
        let o = Tensor::zeros(&dims, DType::BF16);
        launch(&db, file, "causal_attn", &args(&o), &blocks);
        close(
            &format!("causal_attn S={s} D={d} BM={bm} BN={bn}"),
            &o.to_f64_vec(),
            &attention_ref(&q, &k, &v, bh, s, d, 0.125, true),
            BF16,
        );
        for w in [1, 20, 1000] {
            let o = Tensor::zeros(&dims, DType::BF16);
            let mut a = args(&o);
            a.push(Value::Int(w));
            launch(&db, file, "window_attn", &a, &blocks);
            let w = w as usize;
            close(
                &format!("window_attn S={s} D={d} W={w} BM={bm} BN={bn}"),
                &o.to_f64_vec(),
                &masked_attention_ref(&q, &k, &v, bh, s, d, 0.125, |i, j| j <= i && i < j + w),
                BF16,
            );
        }
        // A mask whose all-false blocks still change the result: nothing skipped.
        let x = data(bh * s, 44, DType::F32);
        let o = Tensor::zeros(&[bh, s], DType::F32);
        launch(
            &db,
            file,
            "masked_sum",
            &[t(&[bh, s], DType::F32, &x), Value::Tensor(o.clone())],
            &blocks,
        );
        let end = s.div_ceil(bn as usize) * bn as usize;
        let want: Vec<f64> = (0..bh * s)
            .map(|r| {
                let (h, i) = (r / s, r % s);
                (0..=i).map(|j| x[h * s + j]).sum::<f64>() + (end - 1 - i) as f64
            })
            .collect();
        close(
            &format!("masked_sum S={s} BM={bm} BN={bn}"),
            &o.to_f64_vec(),
            &want,
            F32,
        );
    }
}

// ---- run-time errors (E07xx) ----

/// The error of `r`, which (as every error) must have a help line.
#[track_caller]
fn err_of(r: Result<impl std::fmt::Debug, ExecError>) -> ExecError {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => {
            assert!(e.help.is_some(), "an error without a help line: {e}");
            e
        }
    }
}

#[test]
fn run_time_errors_have_their_codes() {
    let (db, file) = builtins();
    let stop = Interrupt::new();
    let f32s = |s: &[usize]| Value::Tensor(Tensor::zeros(s, DType::F32));
    // E0701: a dim that disagrees, naming the parameter, the dim and both values.
    let e = err_of(run_function(
        &db,
        file,
        "ew_f32",
        &[f32s(&[2, 3]), f32s(&[2, 4])],
        &[],
        &tessera::exec::Device::Cpu,
        &stop,
    ));
    assert_eq!(e.code, "E0701", "{e}");
    assert!(
        e.message.contains("`y`") && e.message.contains('3') && e.message.contains('4'),
        "{e}"
    );
    // E0702: a dtype that disagrees.
    let e = err_of(run_function(
        &db,
        file,
        "act_relu",
        &[Value::Tensor(Tensor::zeros(&[2, 2], DType::F16))],
        &[],
        &tessera::exec::Device::Cpu,
        &stop,
    ));
    assert_eq!(e.code, "E0702", "{e}");
    // E0703: a negative grid dim (a 0 dim launches nothing, below).
    let (sdb, sfile) = std_file();
    launch_kernel(
        &sdb,
        sfile,
        "relu_kernel",
        Some(vec![0]),
        &[f32s(&[4]), f32s(&[4])],
        &[],
        &tessera::exec::Device::Cpu,
        &stop,
    )
    .expect("a grid of 0 programs runs nothing");
    let e = err_of(launch_kernel(
        &sdb,
        sfile,
        "relu_kernel",
        Some(vec![-1]),
        &[f32s(&[4]), f32s(&[4])],
        &[],
        &tessera::exec::Device::Cpu,
        &stop,
    ));
    assert_eq!(e.code, "E0703", "{e}");
    // E0704: integer division by zero inside a generated kernel.
    let one = Value::Tensor(Tensor::ones(&[3], DType::I32));
    let zero = Value::Tensor(Tensor::zeros(&[3], DType::I32));
    let e = err_of(run_function(
        &db,
        file,
        "ew_int",
        &[one, zero],
        &[],
        &tessera::exec::Device::Cpu,
        &stop,
    ));
    assert_eq!(e.code, "E0704", "{e}");
    // E0705: an index out of bounds.
    let e = err_of(Tensor::zeros(&[3], DType::F32).index(&[IndexItem::Int(3)], &stop));
    assert_eq!(e.code, "E0705", "{e}");
    // E0706: interrupted.
    let stopped = Interrupt::new();
    stopped.trigger();
    let e = err_of(run_function(
        &db,
        file,
        "act_relu",
        &[f32s(&[2, 2])],
        &[],
        &tessera::exec::Device::Cpu,
        &stopped,
    ));
    assert_eq!(e.code, "E0706", "{e}");
    // E0707: a missing argument.
    let e = err_of(run_function(
        &db,
        file,
        "ew_f32",
        &[f32s(&[2, 3])],
        &[],
        &tessera::exec::Device::Cpu,
        &stop,
    ));
    assert_eq!(e.code, "E0707", "{e}");
    // ... and a const parameter of a whole-tensor function set at run time
    // (the schedule uses the defaults).
    let mut db4 = Database::new();
    let f4 = db4.set_source(
        "/numerics/consts.tsr",
        "def scaled(x: Tensor[\"N\", f32], k: const i32 = 2) -> Tensor[\"N\", f32]:\n    return x * k\n".into(),
    );
    let k = |v: i64| vec![("k".to_string(), Value::Int(v))];
    assert!(run_function(
        &db4,
        f4,
        "scaled",
        &[f32s(&[2])],
        &k(2),
        &tessera::exec::Device::Cpu,
        &stop
    )
    .is_ok());
    let e = err_of(run_function(
        &db4,
        f4,
        "scaled",
        &[f32s(&[2])],
        &k(3),
        &tessera::exec::Device::Cpu,
        &stop,
    ));
    assert_eq!(e.code, "E0707", "{e}");
    assert!(e.message.contains("const parameter `k`"), "{e}");
    // E0708: not a .npy file.
    let e = err_of(npy::load_npy(
        &root().join("tests/numerics/builtins.tsr"),
        &stop,
    ));
    assert_eq!(e.code, "E0708", "{e}");
    // ... and a 128-byte file whose header claims 2^64 elements (an empty
    // tensor before sizes were checked).
    let e = err_of(npy::load_npy(
        &root().join("tests/repl/data/huge_shape.npy"),
        &stop,
    ));
    assert_eq!(e.code, "E0708", "{e}");
    assert!(e.message.contains("does not fit 64 bits"), "{e}");
    // E0712: a shape whose element count overflows, and one whose byte size does.
    let e = err_of(Tensor::try_zeros(&[1 << 32, 1 << 32], DType::F32, &stop));
    assert_eq!(e.code, "E0712", "{e}");
    let e = err_of(tessera::exec::rng::try_randn(
        &[1 << 62],
        DType::F64,
        0,
        &stop,
    ));
    assert_eq!(e.code, "E0712", "{e}");
    // E0713: 4 PiB, more memory than any machine has: refused at once (by the
    // memory available, or by the allocator), never an abort.
    let e = err_of(Tensor::try_full(
        &[1 << 25, 1 << 25],
        DType::F32,
        1.0,
        &stop,
    ));
    assert_eq!(e.code, "E0713", "{e}");
    assert!(e.message.contains("4503599627370496 bytes"), "{e}");
    // E0709: a kernel that cannot be compiled (here: a check error in its body).
    let mut db3 = Database::new();
    let f3 = db3.set_source(
        "/numerics/e0709.tsr",
        "@kernel(grid=(1,))\ndef bad(x: Tensor[4, f32]):\n    store(x[0 : 4], nope)\n".into(),
    );
    let e = err_of(launch_kernel(
        &db3,
        f3,
        "bad",
        None,
        &[f32s(&[4])],
        &[],
        &tessera::exec::Device::Cpu,
        &stop,
    ));
    assert_eq!(e.code, "E0709", "{e}");
    // E0710: a function whose schedule cannot be built (a `return` under a
    // run-time `if`).
    let mut db2 = Database::new();
    let f2 = db2.set_source(
        "/numerics/e0710.tsr",
        "def early(x: Tensor[\"N\", f32], n: i32) -> Tensor[\"N\", f32]:\n    if n <= 0:\n        return x\n    return x + 1.0\n".into(),
    );
    let e = err_of(run_function(
        &db2,
        f2,
        "early",
        &[f32s(&[2]), Value::Int(1)],
        &[],
        &tessera::exec::Device::Cpu,
        &stop,
    ));
    assert_eq!(e.code, "E0710", "{e}");
}

// ---- .npy ----

#[test]
fn npy_round_trips_every_dtype() {
    let dir = std::env::temp_dir().join(format!("tessera-npy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for d in DType::ALL {
        let x = rng::randn(&[3, 5], d, 9);
        let p = dir.join(format!("{d}.npy"));
        npy::save_npy(&x, &p, &Interrupt::new()).unwrap();
        let y = npy::load_npy(&p, &Interrupt::new()).unwrap();
        // bf16 and f8 have no numpy dtype: saved (exactly) as f32.
        let want = if matches!(d, DType::BF16 | DType::F8E4M3 | DType::F8E5M2) {
            DType::F32
        } else {
            d
        };
        assert_eq!(y.dtype(), want, "{d}");
        assert_eq!(y.shape(), &[3, 5], "{d}");
        assert_eq!(y.to_f64_vec(), x.to_f64_vec(), "{d}");
    }
    let s = Tensor::full(&[], DType::F64, 2.5);
    npy::save_npy(&s, &dir.join("scalar.npy"), &Interrupt::new()).unwrap();
    assert_eq!(
        npy::load_npy(&dir.join("scalar.npy"), &Interrupt::new())
            .unwrap()
            .to_f64_vec(),
        vec![2.5]
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Files written by numpy itself (`tests/numerics/npy/make.py` made them).
#[test]
fn npy_files_written_by_numpy() {
    let dir = root().join("tests/numerics/npy");
    let load = |n: &str| {
        npy::load_npy(&dir.join(n), &Interrupt::new()).unwrap_or_else(|e| panic!("{n}: {e}"))
    };
    let a = load("f32_2x3.npy");
    assert_eq!((a.shape(), a.dtype()), (&[2usize, 3][..], DType::F32));
    assert_eq!(a.to_f64_vec(), vec![0.0, 1.5, -2.0, 3.25, 4.0, -5.5]);
    let b = load("f16_4.npy");
    assert_eq!((b.shape(), b.dtype()), (&[4usize][..], DType::F16));
    assert_eq!(b.to_f64_vec(), vec![0.5, -1.0, 2.0, 65504.0]);
    let c = load("i64_2x2.npy");
    assert_eq!((c.shape(), c.dtype()), (&[2usize, 2][..], DType::I64));
    assert_eq!(c.to_f64_vec(), vec![1.0, -2.0, 3.0, 1e12]);
    let d = load("bool_3.npy");
    assert_eq!((d.shape(), d.dtype()), (&[3usize][..], DType::Bool));
    assert_eq!(d.to_f64_vec(), vec![1.0, 0.0, 1.0]);
    let e = load("u8_scalar.npy");
    assert_eq!((e.shape(), e.dtype()), (&[][..], DType::U8));
    assert_eq!(e.to_f64_vec(), vec![200.0]);
    let f =
        npy::load_npy(&dir.join("f64_fortran.npy"), &Interrupt::new()).expect_err("fortran order");
    assert_eq!(f.code, "E0708");
    assert!(f.message.contains("Fortran"), "{f}");
}

/// std.nn's dtype-generic definitions (`stdlib/std/nn.tsr`, run as entry
/// points, so each call runs the instance its argument binds: the bodies as
/// written, not the builtins they stand for) for every float dtype and ranks
/// 1 to 3. They compute in the input dtype, so the tolerance follows it.
#[test]
fn std_nn_generic_definitions_every_dtype_and_rank() {
    let mut db = Database::new();
    let file = db
        .load_file(&root().join("stdlib/std/nn.tsr"))
        .expect("nn.tsr");
    let errors: Vec<_> = db
        .diagnostics(file)
        .iter()
        .filter(|d| d.is_error())
        .cloned()
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    let n = 37;
    let cases: [(DType, f64); 4] = [
        (DType::F64, 1e-12),
        (DType::F32, F32),
        (DType::F16, 1e-2),
        (DType::BF16, 6e-2),
    ];
    for (d, tol) in cases {
        for shape in [vec![n], vec![5, n], vec![2, 3, n]] {
            let rows_n: usize = shape[..shape.len() - 1].iter().product();
            let len = rows_n * n;
            let x: Vec<f64> = data(len, 71, d).iter().map(|v| v * 3.0).collect();
            let x: Vec<f64> = x.iter().map(|v| round_to(d, *v)).collect();
            let w = data(n, 72, d);
            let b = data(n, 73, d);
            let what = |f: &str| format!("std.nn.{f} {d} {shape:?}");
            let xt = t(&shape, d, &x);
            let run = |f: &str, args: &[Value]| {
                let v = run_function(
                    &db,
                    file,
                    f,
                    args,
                    &[],
                    &tessera::exec::Device::Cpu,
                    &Interrupt::new(),
                )
                .unwrap_or_else(|e| panic!("{}: {e}", what(f)));
                let r = tensor(&v);
                assert_eq!(r.dtype(), d, "{}: result dtype", what(f));
                assert_eq!(r.shape(), &shape[..], "{}: result shape", what(f));
                r.to_f64_vec()
            };
            let ew = |f: fn(f64) -> f64| x.iter().map(|v| f(*v)).collect::<Vec<_>>();
            close(
                &what("relu"),
                &run("relu", std::slice::from_ref(&xt)),
                &ew(|v| v.max(0.0)),
                tol,
            );
            close(
                &what("gelu"),
                &run("gelu", std::slice::from_ref(&xt)),
                &ew(gelu_ref),
                tol,
            );
            close(
                &what("silu"),
                &run("silu", std::slice::from_ref(&xt)),
                &ew(silu_ref),
                tol,
            );
            close(
                &what("softmax"),
                &run("softmax", std::slice::from_ref(&xt)),
                &softmax_ref(&x, rows_n, n),
                tol,
            );
            close(
                &what("layer_norm"),
                &run("layer_norm", &[xt.clone(), t(&[n], d, &w), t(&[n], d, &b)]),
                &layer_norm_ref(&x, &w, Some(&b), rows_n, n, 1e-5),
                tol,
            );
            close(
                &what("rms_norm"),
                &run("rms_norm", &[xt.clone(), t(&[n], d, &w)]),
                &layer_norm_ref(&x, &w, None, rows_n, n, 1e-6),
                tol,
            );
        }
    }
    // An integer tensor is outside `T: float`, at run time as in the checker.
    let e = err_of(run_function(
        &db,
        file,
        "gelu",
        &[t(&[4], DType::I32, &[1.0, 2.0, 3.0, 4.0])],
        &[],
        &tessera::exec::Device::Cpu,
        &Interrupt::new(),
    ));
    assert_eq!(e.code, "E0321", "{e}");
}
