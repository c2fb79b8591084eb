//! CPU executor throughput: gemm (f32, 1024³, the stdlib's `gemm_tf32`
//! launched through `exec::launch_kernel`) in GFLOP/s and row softmax
//! (4096 x 4096 f32, `softmax_rows_online`) in GB/s (one read and one write of
//! the matrix). Prints the median and the best of several runs; `bench/cpu.sh`
//! runs numpy on the same sizes in alternation with it. Sizes can be
//! overridden: `cargo bench --bench exec -- GEMM_N SOFTMAX_N`.

use std::time::Instant;

use tessera::check::DType;
use tessera::db::Database;
use tessera::exec::{launch_kernel, rng, Interrupt, Tensor, Value};

/// The median and the best of `runs` timed runs (seconds), after a warm-up.
fn time(runs: usize, mut f: impl FnMut()) -> (f64, f64) {
    f(); // warm-up (and specialisation)
    let mut v: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0])
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = args.first().copied().unwrap_or(1024);
    let s = args.get(1).copied().unwrap_or(4096);
    let mut db = Database::new();
    let file = db.set_source(
        "/bench/exec.tsr",
        "from std.linalg import gemm_tf32\nfrom std.nn import softmax_rows_online\n".into(),
    );
    let stop = Interrupt::new();

    let a = rng::randn(&[n, n], DType::F32, 1);
    let b = rng::randn(&[n, n], DType::F32, 2);
    let c = Tensor::zeros(&[n, n], DType::F32);
    let args = [Value::Tensor(a), Value::Tensor(b), Value::Tensor(c)];
    let t = time(5, || {
        launch_kernel(
            &db,
            file,
            "gemm_tf32",
            None,
            &args,
            &[],
            &tessera::exec::Device::Cpu,
            &stop,
        )
        .unwrap();
    });
    let gflops = |t: f64| 2.0 * (n as f64).powi(3) / t / 1e9;
    println!(
        "tessera gemm_tf32 f32 {n}x{n}x{n}: median {:.2} ms {:.1} GFLOP/s, best {:.2} ms {:.1} GFLOP/s",
        t.0 * 1e3,
        gflops(t.0),
        t.1 * 1e3,
        gflops(t.1)
    );

    let x = rng::randn(&[s, s], DType::F32, 3);
    let y = Tensor::zeros(&[s, s], DType::F32);
    let args = [Value::Tensor(x), Value::Tensor(y)];
    let t = time(5, || {
        launch_kernel(
            &db,
            file,
            "softmax_rows_online",
            None,
            &args,
            &[],
            &tessera::exec::Device::Cpu,
            &stop,
        )
        .unwrap();
    });
    let gbs = |t: f64| 2.0 * 4.0 * (s * s) as f64 / t / 1e9;
    println!(
        "tessera softmax_rows_online f32 {s}x{s}: median {:.2} ms {:.2} GB/s, best {:.2} ms {:.2} GB/s",
        t.0 * 1e3,
        gbs(t.0),
        t.1 * 1e3,
        gbs(t.1)
    );
}
