//! Tests of the CPU executor.

mod fast_exp {
    use crate::exec::cpu::exp_f32;

    #[test]
    fn fast_exp_is_within_two_ulp() {
        let mut x = -87.0f32;
        while x < 88.5 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            assert!(
                ((got - want) / want).abs() < 2.5e-7,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-100.0), 0.0);
    }
}

/// Loads left to their dots ([`deferred`]) against the same launches with
/// every load materialised: the results must be bit-identical.
mod deferred_tests {
    use crate::db::Database;
    use crate::exec::cpu::chain::ChainedLoops;
    use crate::exec::cpu::deferred::DeferredLoads;
    use crate::exec::cpu::*;
    use crate::exec::launch::prepared;
    use crate::exec::{rng, Value as V};

    const SRC: &str = r#"
from std.linalg import gemm, gemm_tf32, gemm_bf16

@kernel(grid=(1,))
def rewrites_a(A: Tensor["M", "K", f32], B: Tensor["K", "N", f32], C: Tensor["M", "N", f32],
               BM: const = 16, BN: const = 16, BK: const = 16):
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        acc = dot(load(A[0 : BM, k : k + BK]), load(B[k : k + BK, 0 : BN]), acc, precision="tf32")
    store(A[0 : BM, 0 : BN], acc)
    again = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        again = dot(load(A[0 : BM, k : k + BK]), load(B[k : k + BK, 0 : BN]), again, precision="tf32")
    store(C[0 : BM, 0 : BN], again)

@kernel(grid=(cdiv(M, BM), cdiv(N, BN)))
def strided(A: Tensor["M", "K", "Z", f32], B: Tensor["K", "N", f32], C: Tensor["M", "N", f32],
            BM: const = 32, BN: const = 32, BK: const = 16):
    m0 = program_id(0) * BM
    n0 = program_id(1) * BN
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        a = load(A[m0 : m0 + BM, k : k + BK, 1], other=0.5)
        acc = dot(a, load(B[k : k + BK, n0 : n0 + BN], other=-2.0), acc)
    store(C[m0 : m0 + BM, n0 : n0 + BN], acc)

@kernel(grid=(cdiv(M, BM), cdiv(N, BN)))
def masked(A: Tensor["M", "K", f16], B: Tensor["K", "N", f16], C: Tensor["M", "N", f32],
           BM: const = 32, BN: const = 32, BK: const = 16):
    m0 = program_id(0) * BM
    n0 = program_id(1) * BN
    rows = arange(0, BM) + m0
    cols = arange(0, BK)
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        keep = (rows[:, None] < 40) & (cols[None, :] + k < K)
        a = load(A[m0 : m0 + BM, k : k + BK], mask=keep, other=1.5)
        acc = dot(a, load(B[k : k + BK, n0 : n0 + BN]), acc)
    store(C[m0 : m0 + BM, n0 : n0 + BN], acc)

@kernel(grid=(cdiv(M, BM), cdiv(N, BN)))
def reused(A: Tensor["M", "K", f32], B: Tensor["K", "N", f32], C: Tensor["M", "N", f32],
           BM: const = 32, BN: const = 32, BK: const = 32):
    m0 = program_id(0) * BM
    n0 = program_id(1) * BN
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        a = load(A[m0 : m0 + BM, k : k + BK])
        b = load(B[k : k + BK, n0 : n0 + BN])
        acc = dot(a, b, acc) + dot(a * 2.0, b)
    store(C[m0 : m0 + BM, n0 : n0 + BN], acc)
"#;

    /// Runs `kernel` on copies of `args` with loads deferred and K loops
    /// chained, with loads deferred only, and with neither; checks that the
    /// first two give the same bits and returns tensor argument `out` of the
    /// first and last runs, how many loads the kernel may defer and how many
    /// loops it may chain.
    fn both(kernel: &str, args: &[V], out: usize) -> (Vec<f32>, Vec<f32>, usize, usize) {
        let mut db = Database::new();
        let file = db.set_source("/deferred_tests.tsr", SRC.into());
        let mut results = Vec::new();
        let (mut deferrable, mut chainable) = (0, 0);
        for mode in 0..3 {
            let args: Vec<V> = args
                .iter()
                .map(|a| match a {
                    V::Tensor(t) => V::Tensor(t.deep_clone()),
                    other => other.clone(),
                })
                .collect();
            let (k, a, grid) = prepared(&db, file, kernel, &args);
            let loads = if mode < 2 {
                DeferredLoads::of(&k)
            } else {
                DeferredLoads::none()
            };
            let loops = if mode == 0 {
                ChainedLoops::of(&k, &loads)
            } else {
                ChainedLoops::none()
            };
            if mode == 0 {
                deferrable = loads.len();
                chainable = loops.len();
            }
            run_grid_with(&k, &a, grid, &Interrupt::new(), &loads, &loops).unwrap();
            let V::Tensor(t) = &args[out] else {
                unreachable!()
            };
            results.push(t.to_f32_vec());
        }
        let none = results.pop().unwrap();
        let unchained = results.pop().unwrap();
        let chained = results.pop().unwrap();
        same_bits(&chained, &unchained);
        (chained, none, deferrable, chainable)
    }

    fn randn(shape: &[usize], d: DType, seed: u64) -> V {
        V::Tensor(rng::randn(shape, d, seed))
    }

    fn zeros(shape: &[usize]) -> V {
        V::Tensor(Tensor::zeros(shape, DType::F32))
    }

    fn same_bits(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert_eq!(x.to_bits(), y.to_bits(), "element {i}: {x} vs {y}");
        }
    }

    #[test]
    fn stdlib_gemms_with_edge_tiles() {
        // Sizes that are not multiples of the tiles: windows on both axes;
        // K = 300 makes chains deeper than one pass of the micro-kernel.
        for ((m, k, n), (kernel, d)) in [(150, 70, 90), (70, 300, 40)].into_iter().flat_map(|s| {
            [
                ("gemm_tf32", DType::F32),
                ("gemm", DType::F16),
                ("gemm_bf16", DType::BF16),
            ]
            .map(|kd| (s, kd))
        }) {
            let args = [randn(&[m, k], d, 1), randn(&[k, n], d, 2), zeros(&[m, n])];
            let (fast, slow, loads, loops) = both(kernel, &args, 2);
            assert_eq!(loads, 2, "{kernel}: both loads deferrable");
            assert_eq!(loops, 1, "{kernel}: the K loop chainable");
            same_bits(&fast, &slow);
            assert!(fast.iter().any(|x| *x != 0.0));
        }
    }

    /// A kernel that writes A between two K loops over it: packed copies of
    /// A must not outlive the store (only B's may be kept).
    #[test]
    fn packed_operands_of_written_tensors_are_not_kept() {
        let args = [
            randn(&[16, 32], DType::F32, 9),
            randn(&[32, 16], DType::F32, 10),
            zeros(&[16, 16]),
        ];
        let (fast, slow, loads, loops) = both("rewrites_a", &args, 2);
        assert_eq!((loads, loops), (4, 2));
        same_bits(&fast, &slow);
        // The second product really read the rewritten A.
        let (mut first, _, _, _) = both("rewrites_a", &args, 0);
        first.truncate(16);
        assert!(fast.iter().any(|x| *x != 0.0) && first.iter().any(|x| *x != 0.0));
    }

    #[test]
    fn non_contiguous_source_and_other() {
        let args = [
            randn(&[45, 37, 3], DType::F32, 3),
            randn(&[37, 50], DType::F32, 4),
            zeros(&[45, 50]),
        ];
        let (fast, slow, loads, loops) = both("strided", &args, 2);
        assert_eq!((loads, loops), (2, 1));
        same_bits(&fast, &slow);
    }

    #[test]
    fn masked_loads_fall_back_where_a_lane_is_off() {
        let args = [
            randn(&[70, 40], DType::F16, 5),
            randn(&[40, 33], DType::F16, 6),
            zeros(&[70, 33]),
        ];
        let (fast, slow, loads, loops) = both("masked", &args, 2);
        assert_eq!((loads, loops), (2, 1));
        same_bits(&fast, &slow);
    }

    #[test]
    fn a_load_read_by_other_ops_is_materialised() {
        let args = [
            randn(&[64, 64], DType::F32, 7),
            randn(&[64, 64], DType::F32, 8),
            zeros(&[64, 64]),
        ];
        let (fast, slow, loads, loops) = both("reused", &args, 2);
        // `a` is also multiplied by 2: only `b` is left to the dots, and
        // neither dot can be chained.
        assert_eq!((loads, loops), (1, 0));
        same_bits(&fast, &slow);
    }
}

/// The invariants the unsafe reads and writes of a launch rely on: accesses are
/// clipped to the tensor whatever the kernel computes, and a tensor's storage
/// holds its shape's elements.
mod bounds_tests {
    use crate::db::Database;
    use crate::exec::cpu::deferred::DeferredLoads;
    use crate::exec::cpu::*;
    use crate::exec::launch::prepared;
    use crate::exec::Value as V;

    const SRC: &str = r#"
@kernel(grid=(3,))
def shifted(x: Tensor["N", f32], y: Tensor["R", "C", i32], shift: i64, BLOCK: const = 8):
    i = program_id(0) * BLOCK + shift
    v = load(x[i : i + BLOCK], other=5.0)
    store(x[i : i + BLOCK], v + 1.0)
    atomic_add(x[i : i + BLOCK], v)
    r = program_id(0) + shift + 4
    t = load(y[r : r + 2, i : i + BLOCK], other=7)
    store(y[r : r + 2, i : i + BLOCK], t + 1)

@kernel(grid=(1,))
def mm(a: Tensor[16, 16, f32], b: Tensor[16, 16, f32], c: Tensor[16, 16, f32], shift: i64):
    x = load(a[shift : shift + 16, 0 : 16])
    y = load(b[0 : 16, shift : shift + 16])
    store(c[0 : 16, 0 : 16], dot(x, y))
"#;

    fn run(shift: i64) -> (Vec<f64>, Vec<f64>) {
        let mut db = Database::new();
        let file = db.set_source("/bounds_tests.tsr", SRC.into());
        let x = Tensor::zeros(&[10], DType::F32);
        let y = Tensor::zeros(&[3, 10], DType::I32);
        let args = [V::Tensor(x.clone()), V::Tensor(y.clone()), V::Int(shift)];
        let (k, a, grid) = prepared(&db, file, "shifted", &args);
        run_grid(&k, &a, grid, &Interrupt::new()).unwrap();
        (x.to_f64_vec(), y.to_f64_vec())
    }

    /// Windows that start before, straddle or lie far past the tensor (up to
    /// the ends of i64) touch only its elements: the reads and writes outside
    /// are clipped (the kernel's arithmetic wraps, the clipping saturates).
    #[test]
    fn accesses_outside_the_tensor_are_clipped() {
        let (x, y) = run(-4);
        // Programs cover -4..20: elements 0..10 are written once, `2 * 0 + 1`.
        assert_eq!(x, vec![1.0; 10]);
        assert_eq!(y.iter().filter(|&&v| v != 0.0).count(), 20, "{y:?}");
        for shift in [
            i64::MIN,
            i64::MIN + 3,
            -1 << 40,
            1 << 40,
            i64::MAX - 3,
            i64::MAX,
        ] {
            let (x, y) = run(shift);
            assert_eq!(x, vec![0.0; 10], "shift {shift}");
            assert_eq!(y, vec![0.0; 30], "shift {shift}");
        }
    }

    /// Loads read by a `dot` straight from tensor memory (deferred) are
    /// clipped too, wherever their windows start.
    #[test]
    fn deferred_loads_outside_the_tensor_read_their_fill() {
        let mut db = Database::new();
        let file = db.set_source("/bounds_tests.tsr", SRC.into());
        let ones = Tensor::full(&[16, 16], DType::F32, 1.0);
        for shift in [0, 8, -8, 1 << 40, -1 << 40, i64::MIN, i64::MAX - 3] {
            let c = Tensor::zeros(&[16, 16], DType::F32);
            let args = [
                V::Tensor(ones.clone()),
                V::Tensor(ones.clone()),
                V::Tensor(c.clone()),
                V::Int(shift),
            ];
            let (k, a, grid) = prepared(&db, file, "mm", &args);
            assert_eq!(DeferredLoads::of(&k).len(), 2, "both loads are deferred");
            run_grid(&k, &a, grid, &Interrupt::new()).unwrap();
            // c[i, j] is 16 where row i of the `a` window and column j of the
            // `b` window are in the tensor, else 0.
            let inside = |p: i64| (0..16).contains(&(p as i128 + shift as i128));
            let want: Vec<f64> = (0..256)
                .map(|e| {
                    if inside(e / 16) && inside(e % 16) {
                        16.0
                    } else {
                        0.0
                    }
                })
                .collect();
            assert_eq!(c.to_f64_vec(), want, "shift {shift}");
        }
    }

    /// The old segfault: a tensor whose shape claims more elements than its
    /// storage holds cannot be made (the shape's size is checked, a view must
    /// keep the element count), so a launch never addresses past a buffer.
    #[test]
    fn a_shape_bigger_than_its_storage_cannot_be_made() {
        let empty = Tensor::zeros(&[0], DType::F32);
        // 2^32 * 2^32 wraps to 0 in unchecked arithmetic: the count of `empty`.
        assert!(empty.view(&[1 << 32, 1 << 32]).is_none());
        assert_eq!(
            Tensor::try_zeros(&[1 << 32, 1 << 32], DType::F32, &Interrupt::new())
                .unwrap_err()
                .code,
            "E0712"
        );
        let r = std::panic::catch_unwind(|| {
            Tensor::from_data(
                &[1 << 32, 1 << 32],
                DType::F32,
                crate::exec::tensor::Data::F32(vec![]),
            )
        });
        assert!(r.is_err(), "a tensor over storage of another size");
    }

    /// Grids past CUDA's limits are refused before any program runs (a grid
    /// of 2^63 - 1 programs used to run for ever).
    #[test]
    fn grids_are_bounded() {
        let mut db = Database::new();
        let file = db.set_source("/bounds_tests.tsr", SRC.into());
        let x = Tensor::zeros(&[10], DType::F32);
        let y = Tensor::zeros(&[3, 10], DType::I32);
        let args = [V::Tensor(x.clone()), V::Tensor(y), V::Int(0)];
        let (k, a, _) = prepared(&db, file, "shifted", &args);
        for grid in [
            [i64::MAX, 1, 1],
            [1 << 31, 1, 1],
            [1, 65536, 1],
            [1, 1, 65536],
            [-1, 1, 1],
        ] {
            let e = run_grid(&k, &a, grid, &Interrupt::new()).unwrap_err();
            assert_eq!(e.code, "E0703", "{grid:?}: {e}");
        }
        // A 0 dim is a launch of no programs (work on an empty tensor).
        run_grid(&k, &a, [0, 1, 1], &Interrupt::new()).unwrap();
        assert_eq!(x.to_f64_vec(), vec![0.0; 10]);
        run_grid(&k, &a, [1, 1, 65535], &Interrupt::new()).unwrap();
    }
}
