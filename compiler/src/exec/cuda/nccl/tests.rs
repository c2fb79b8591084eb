//! Tests of the collectives. The layouts, the library's loading and the
//! argument checks run on every machine; the collectives themselves run on
//! one GPU (no NCCL: a copy) and on sets of two or more GPUs when the
//! machine has them and NCCL, and are skipped otherwise (saying why). On a
//! multi-GPU machine:
//! `NCCL_NVLS_ENABLE=0 TESSERA_NCCL_TEST_GPUS=4 cargo test --release -p
//! tessera-compiler --lib exec::cuda::nccl -- --nocapture`, where
//! `TESSERA_NCCL_TEST_GPUS` turns the skips of sets of up to that many GPUs
//! into failures (a machine without the GPUs or the NCCL the run is for).

use super::per_gpu::TIMINGS_CAP;
use super::*;
use crate::exec::cuda::tests::ONE_AT_A_TIME;

// ---------------------------------------------------------------------------
// Host helpers

/// `numpy.array_split`'s sizes: the first `len % n` blocks one longer.
fn array_split(len: usize, n: usize) -> Vec<usize> {
    (0..n).map(|i| len / n + usize::from(i < len % n)).collect()
}

/// Elements `start..start + len` along `axis` of a row-major `shape`.
fn slice_axis<T: Copy>(
    data: &[T],
    shape: &[usize],
    axis: usize,
    start: usize,
    len: usize,
) -> Vec<T> {
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        let row = o * shape[axis] * inner;
        out.extend_from_slice(&data[row + start * inner..row + (start + len) * inner]);
    }
    out
}

/// Applies `c` between a whole layout and a block-major one (host bytes).
fn apply(c: &Strided, whole: &mut [u8], block: &mut [u8], to_block: bool) {
    for row in 0..c.height {
        let w = c.whole + row * c.whole_pitch;
        let b = c.block + row * c.block_pitch;
        if to_block {
            block[b..b + c.width].copy_from_slice(&whole[w..w + c.width]);
        } else {
            whole[w..w + c.width].copy_from_slice(&block[b..b + c.width]);
        }
    }
}

/// The layouts' copies, applied on the host, pack every block of every
/// shape along every axis into its own contiguous tensor and put them back.
#[test]
fn strided_copies_pack_and_place_every_block() {
    let shapes: [&[usize]; 7] = [
        &[7],
        &[5, 3],
        &[2, 7, 3],
        &[3, 4, 2],
        &[3, 0, 2],
        &[0, 5],
        &[4, 1, 5],
    ];
    // Three-byte elements: an offset off by one byte shows.
    let elem = 3;
    for shape in shapes {
        let numel: usize = shape.iter().product();
        let elems: Vec<[u8; 3]> = (0..numel)
            .map(|i| [i as u8, (i >> 8) as u8, 0xa5])
            .collect();
        let whole: Vec<u8> = elems.iter().flatten().copied().collect();
        for axis in 0..shape.len() {
            for n in 1..=4 {
                let sizes = array_split(shape[axis], n);
                let split = Split::new(shape, axis, sizes.clone(), elem);
                let what = format!("{shape:?} along {axis} into {sizes:?}");
                assert_eq!(split.total(), shape[axis], "{what}");
                assert_eq!(
                    split.contiguous(),
                    shape[..axis].iter().product::<usize>() <= 1
                );
                assert_eq!(
                    split.equal(),
                    sizes.iter().all(|&s| s == sizes[0]),
                    "{what}"
                );
                // The blocks tile the staging buffer in order.
                let mut at = 0;
                for r in 0..n {
                    assert_eq!(split.block_offset(r), at, "{what}");
                    at += split.block_bytes(r);
                }
                assert_eq!(at, whole.len(), "{what}");
                let mut packed = vec![0u8; whole.len()];
                let mut src = whole.clone();
                for c in split.copies() {
                    apply(&c, &mut src, &mut packed, true);
                }
                for r in 0..n {
                    let want: Vec<u8> = slice_axis(&elems, shape, axis, split.prefix(r), sizes[r])
                        .into_iter()
                        .flatten()
                        .collect();
                    let got = &packed[split.block_offset(r)..][..split.block_bytes(r)];
                    assert_eq!(got, &want[..], "{what}: block {r}");
                }
                let mut placed = vec![0u8; whole.len()];
                for c in split.copies() {
                    apply(&c, &mut placed, &mut packed, false);
                }
                assert_eq!(placed, whole, "{what}");
            }
        }
    }
}

#[test]
fn shards_that_do_not_fit_are_e0707() {
    let e = gather_split("all_gather", &[&[2, 3], &[2, 4]], 0, 4).unwrap_err();
    assert_eq!(e.code, "E0707");
    assert!(
        e.message.contains("[2, 3]") && e.message.contains("[2, 4]"),
        "{}",
        e.message
    );
    assert_eq!(
        gather_split("all_gather", &[&[2, 3]], 2, 4)
            .unwrap_err()
            .code,
        "E0707"
    );
    assert_eq!(
        gather_split("all_gather", &[&[2, 3], &[2]], 0, 4)
            .unwrap_err()
            .code,
        "E0707"
    );
    let (whole, split) = gather_split("all_gather", &[&[2, 3], &[2, 2]], 1, 4).unwrap();
    assert_eq!(whole, vec![2, 5]);
    assert_eq!(split.sizes, vec![3, 2]);
    assert_eq!((split.outer, split.unit), (2, 4));
    // Sizes that are not one per rank, or do not sum to the axis.
    assert_eq!(
        scatter_split("rs", &[5, 2], 2, 0, &[3, 3], 4)
            .unwrap_err()
            .code,
        "E0707"
    );
    assert_eq!(
        scatter_split("rs", &[5, 2], 2, 0, &[5], 4)
            .unwrap_err()
            .code,
        "E0707"
    );
    assert_eq!(
        scatter_split("rs", &[5, 2], 2, 2, &[1, 1], 4)
            .unwrap_err()
            .code,
        "E0707"
    );
    assert!(scatter_split("rs", &[5, 2], 2, 0, &[3, 2], 4).is_ok());
    let e = same_shapes("all_reduce", &[&[2], &[2], &[3]]).unwrap_err();
    assert_eq!(e.code, "E0707");
    assert!(same_shapes("all_reduce", &[&[2], &[2]]).is_ok());
}

#[test]
fn what_nccl_cannot_reduce_is_e0721() {
    for (dtype, op) in [
        (DType::I16, ReduceOp::Sum),
        (DType::Bool, ReduceOp::Sum),
        (DType::Bool, ReduceOp::Mean),
    ] {
        let e = reduce_type(dtype, op).unwrap_err();
        assert_eq!(e.code, "E0721", "{dtype:?}");
        assert!(e.message.contains("not supported by NCCL"), "{}", e.message);
        assert!(e.help.is_some());
    }
    assert_eq!(reduce_type(DType::Bool, ReduceOp::Max), Ok(1));
    assert_eq!(reduce_type(DType::BF16, ReduceOp::Mean), Ok(9));
    assert_eq!(reduce_type(DType::F32, ReduceOp::Sum), Ok(7));
    assert_eq!(reduce_type(DType::F8E5M2, ReduceOp::Sum), Ok(11));
}

#[test]
fn ops_have_names_and_nccl_codes() {
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean] {
        assert_eq!(ReduceOp::parse(op.name()), Some(op));
    }
    assert_eq!(ReduceOp::parse("prod"), None);
    // ncclSum, ncclMax, ncclMin, ncclAvg.
    let codes: Vec<c_int> = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean]
        .into_iter()
        .map(nccl_op)
        .collect();
    assert_eq!(codes, vec![0, 2, 3, 4]);
}

#[test]
fn versions_are_read_in_both_encodings() {
    assert_eq!(version_of(22803), (2, 28, 3));
    assert_eq!(version_of(21003), (2, 10, 3));
    assert_eq!(version_of(2804), (2, 8, 4));
    assert_eq!(version_of(-1), (0, 0, 0));
}

/// A library file that is not there is E0721 naming what was looked for,
/// with the help saying how to get NCCL (no panic).
#[test]
fn a_missing_library_is_e0721() {
    let Err(e) = load(&["/nonexistent/libnccl.so.2".to_string()]) else {
        panic!("a missing file loaded")
    };
    assert_eq!(e.code, "E0721");
    assert!(
        e.message.contains("NCCL (libnccl.so.2) was not found"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("/nonexistent/libnccl.so.2"),
        "{}",
        e.message
    );
    let help = e.help.unwrap();
    assert!(
        help.contains("libnccl2") && help.contains(LIBRARY_ENV),
        "{help}"
    );
}

/// A library without NCCL's functions (the C library) is E0721 listing
/// what it lacks, not cudarc's panic at the first call.
#[cfg(target_os = "linux")]
#[test]
fn a_library_without_nccl_is_e0721() {
    let Err(e) = load(&["libc.so.6".to_string()]) else {
        panic!("the C library passed for NCCL")
    };
    assert_eq!(e.code, "E0721");
    assert!(e.message.contains("is not a usable NCCL"), "{}", e.message);
    assert!(e.message.contains("ncclAllReduce"), "{}", e.message);
}

/// The first file that loads is the one used, even when it is not NCCL.
#[cfg(target_os = "linux")]
#[test]
fn the_first_file_that_loads_is_used() {
    let Err(e) = load(&[
        "/nonexistent/libnccl.so.2".to_string(),
        "libc.so.6".to_string(),
    ]) else {
        panic!("the C library passed for NCCL")
    };
    assert!(
        e.message.contains("`libc.so.6` is not a usable NCCL"),
        "{}",
        e.message
    );
}

/// A pending collective may be handed to another thread (a session's
/// worker) and joined there.
#[test]
fn pending_collectives_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Pending>();
}

/// This machine's NCCL loads, or is E0721 (every machine without it), the
/// same at every call.
#[test]
fn this_machines_nccl_loads_or_is_e0721() {
    match version() {
        Ok((file, (major, minor, _))) => {
            assert!(!file.is_empty());
            assert!((major, minor) >= MIN_VERSION);
            eprintln!("NCCL {major}.{minor} from {file}");
        }
        Err(e) => {
            assert_eq!(e.code, "E0721", "{e:?}");
            assert!(e.message.contains("NCCL"), "{}", e.message);
            assert_eq!(version().unwrap_err(), e);
        }
    }
}

// ---------------------------------------------------------------------------
// On GPUs

/// How many GPUs (with NCCL) a run must have: its GPU tests fail instead
/// of being skipped on sets of up to that many GPUs.
const REQUIRED_ENV: &str = "TESSERA_NCCL_TEST_GPUS";

/// Fresh contexts on GPUs `ordinals` (rank order) and the lock of the GPU
/// tests, or `None` (the test is skipped, saying why) when the machine has
/// no such GPUs or, for two or more, no NCCL.
fn open_set(
    test: &str,
    ordinals: &[usize],
) -> Option<(std::sync::MutexGuard<'static, ()>, Vec<Arc<Gpu>>)> {
    let lock = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let required = std::env::var(REQUIRED_ENV)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let skip = |why: String| {
        assert!(
            ordinals.len() > required,
            "{test} on {ordinals:?} cannot run ({why}), and {REQUIRED_ENV}={required}"
        );
        eprintln!("{test}: skipped on {ordinals:?}: {why}");
        None
    };
    let count = match super::super::list_gpus() {
        Ok(v) => v.len(),
        Err(e) => return skip(format!("no GPU ({e})")),
    };
    if ordinals.iter().any(|&o| o >= count) {
        return skip(format!("the machine has {count} GPUs"));
    }
    if ordinals.len() > 1 {
        if let Err(e) = library() {
            assert_eq!(e.code, "E0721", "{e:?}");
            return skip(format!("no NCCL ({})", e.message));
        }
    }
    let mut out = Vec::new();
    for &o in ordinals {
        match Gpu::open(o) {
            Ok(g) => out.push(Arc::new(g)),
            Err(e) => return skip(format!("cuda:{o} does not open ({e})")),
        }
    }
    Some((lock, out))
}

/// The GPU sets every collective runs on: one GPU, two in both orders,
/// and every GPU (up to 8) when there are more than two.
fn sets() -> Vec<Vec<usize>> {
    let count = super::super::list_gpus().map_or(0, |v| v.len());
    if count == 0 {
        // Skipped once, saying why.
        return vec![vec![0]];
    }
    let mut s = vec![vec![0], vec![0, 1], vec![1, 0]];
    if count > 2 {
        s.push((0..count.min(8)).collect());
    }
    s
}

/// Deterministic values of `dtype` (exactly representable): floats in
/// [-4, 4] in steps of 1/8, integers small enough that 8 ranks' sums fit.
fn values(seed: u64, n: usize, dtype: DType) -> Vec<f64> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let k = (x >> 33) as i64;
            match dtype {
                DType::Bool => (k & 1) as f64,
                DType::U8 => (k % 30) as f64,
                DType::I8 => (k % 31 - 15) as f64,
                d if d.is_int() => (k % 2001 - 1000) as f64,
                // Quarters in [-1, 1]: exact in both f8 formats.
                DType::F8E4M3 | DType::F8E5M2 => (k % 9 - 4) as f64 / 4.0,
                _ => (k % 65 - 32) as f64 / 8.0,
            }
        })
        .collect()
}

/// A tensor of `values(seed, ..)`, on `gpu` unless `on_host`.
fn tensor(shape: &[usize], dtype: DType, seed: u64, gpu: &Gpu, on_host: bool) -> Tensor {
    let n = shape.iter().product();
    let t = Tensor::from_f64(shape, dtype, &values(seed, n, dtype));
    if !on_host {
        gpu.to_device(&t).unwrap();
    }
    t
}

/// The unit roundoff of `dtype`'s arithmetic (0 for integers: exact).
fn roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 2f64.powi(-53),
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F8E4M3 => 2f64.powi(-4),
        DType::F8E5M2 => 2f64.powi(-3),
        _ => 0.0,
    }
}

/// The elementwise `op` of `inputs` in f64 and each element's tolerance:
/// exact for max, min and integers (whose mean truncates toward zero);
/// float sums within `(n + 3) u sum |x|` (NCCL adds in its own order,
/// rounding each step; the mean pre-multiplies by a rounded `1/n`).
fn reduce_on_host(inputs: &[Vec<f64>], op: ReduceOp, dtype: DType) -> (Vec<f64>, Vec<f64>) {
    let n = inputs.len() as f64;
    let u = roundoff(dtype);
    (0..inputs[0].len())
        .map(|i| {
            let xs = inputs.iter().map(|v| v[i]);
            let sum: f64 = xs.clone().sum();
            let abs: f64 = xs.clone().map(f64::abs).sum();
            let tol = (n + 3.0) * u * abs;
            match op {
                ReduceOp::Sum => (sum, tol),
                ReduceOp::Max => (xs.fold(f64::MIN, f64::max), 0.0),
                ReduceOp::Min => (xs.fold(f64::MAX, f64::min), 0.0),
                ReduceOp::Mean if dtype.is_float() => (sum / n, tol),
                ReduceOp::Mean => ((sum / n).trunc(), 0.0),
            }
        })
        .unzip()
}

fn assert_close(got: &[f64], want: &[f64], tol: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, ((g, w), t)) in got.iter().zip(want).zip(tol).enumerate() {
        assert!(
            (g - w).abs() <= *t,
            "{what}: element {i} is {g}, want {w} (tolerance {t})"
        );
    }
}

/// Each output is a new tensor of `shape`, current on its rank's GPU.
fn check_placed(outputs: &[Tensor], gpus: &[Arc<Gpu>], shapes: &[Vec<usize>], what: &str) {
    assert_eq!(outputs.len(), gpus.len(), "{what}");
    for ((o, g), s) in outputs.iter().zip(gpus).zip(shapes) {
        assert_eq!(o.shape(), &s[..], "{what}");
        assert_eq!(
            o.device_owner(),
            Some(g.owner()),
            "{what}: not on cuda:{}",
            g.info.ordinal
        );
    }
}

fn parts_of(gpus: &[Arc<Gpu>], ts: &[Tensor]) -> Vec<(Arc<Gpu>, Tensor)> {
    gpus.iter().cloned().zip(ts.iter().cloned()).collect()
}

#[test]
fn all_reduce_matches_the_host() {
    for set in sets() {
        let Some((_one, gpus)) = open_set("all_reduce_matches_the_host", &set) else {
            continue;
        };
        let n = gpus.len();
        let cases: Vec<(DType, Vec<ReduceOp>, Vec<usize>)> = {
            let all = vec![ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean];
            vec![
                (DType::F32, all.clone(), vec![1000]),
                (DType::F32, all.clone(), vec![3, 70]),
                (DType::BF16, all.clone(), vec![1000]),
                (DType::BF16, all.clone(), vec![5, 3, 7]),
                (DType::F32, vec![ReduceOp::Sum], vec![]),
                (DType::F32, vec![ReduceOp::Sum], vec![0, 4]),
                (DType::F64, vec![ReduceOp::Sum], vec![33]),
                (DType::F16, vec![ReduceOp::Sum, ReduceOp::Mean], vec![65]),
                (DType::I32, all.clone(), vec![129]),
                (DType::I8, vec![ReduceOp::Sum, ReduceOp::Min], vec![17]),
                (DType::U8, vec![ReduceOp::Sum, ReduceOp::Max], vec![17]),
                (DType::Bool, vec![ReduceOp::Max, ReduceOp::Min], vec![40]),
            ]
        };
        for (dtype, ops, shape) in cases {
            let numel: usize = shape.iter().product();
            for op in ops {
                let what = format!("all_reduce {} of {dtype:?}{shape:?} on {set:?}", op.name());
                // Odd ranks' inputs start on the host (copied in first).
                let ins: Vec<Tensor> = (0..n)
                    .map(|r| tensor(&shape, dtype, r as u64 * 7 + 1, &gpus[r], r % 2 == 1))
                    .collect();
                let data: Vec<Vec<f64>> = ins.iter().map(Tensor::to_f64_vec).collect();
                let out = all_reduce(&parts_of(&gpus, &ins), op)
                    .unwrap_or_else(|e| panic!("{what}: {e:?}"));
                check_placed(&out, &gpus, &vec![shape.clone(); n], &what);
                let (want, tol) = reduce_on_host(&data, op, dtype);
                for (r, o) in out.iter().enumerate() {
                    assert_close(&o.to_f64_vec(), &want, &tol, &format!("{what}, rank {r}"));
                }
                // The inputs are unchanged.
                for (t, d) in ins.iter().zip(&data) {
                    assert_eq!(&t.to_f64_vec(), d, "{what}: an input changed");
                }
                assert_eq!(want.len(), numel);
            }
        }
    }
}

#[test]
fn all_gather_matches_the_host() {
    for set in sets() {
        let Some((_one, gpus)) = open_set("all_gather_matches_the_host", &set) else {
            continue;
        };
        let n = gpus.len();
        // (whole shape, axis): even and uneven, leading and inner axes.
        let cases: Vec<(Vec<usize>, usize)> = vec![
            (vec![3 * n, 5], 0),
            (vec![2 * n + 1, 5], 0),
            (vec![4, 2 * n], 1),
            (vec![4, 2 * n + 1, 3], 1),
            (vec![3, n * 2, 2], 1),
            (vec![3, 5, 2 * n + 1], 2),
            (vec![n - 1, 3], 0),
        ];
        for dtype in [DType::F32, DType::BF16, DType::I16, DType::F8E4M3] {
            for (shape, axis) in &cases {
                let what = format!("all_gather of {dtype:?}{shape:?} along {axis} on {set:?}");
                let numel: usize = shape.iter().product();
                let whole = Tensor::from_f64(shape, dtype, &values(3, numel, dtype)).to_f64_vec();
                let sizes = array_split(shape[*axis], n);
                let mut start = 0;
                let shards: Vec<Tensor> = sizes
                    .iter()
                    .enumerate()
                    .map(|(r, &k)| {
                        let mut s = shape.clone();
                        s[*axis] = k;
                        let t = Tensor::from_f64(
                            &s,
                            dtype,
                            &slice_axis(&whole, shape, *axis, start, k),
                        );
                        start += k;
                        if r % 2 == 0 {
                            gpus[r].to_device(&t).unwrap();
                        }
                        t
                    })
                    .collect();
                let out = all_gather(&parts_of(&gpus, &shards), *axis)
                    .unwrap_or_else(|e| panic!("{what}: {e:?}"));
                check_placed(&out, &gpus, &vec![shape.clone(); n], &what);
                for (r, o) in out.iter().enumerate() {
                    assert_eq!(o.to_f64_vec(), whole, "{what}, rank {r}");
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_matches_the_host() {
    for set in sets() {
        let Some((_one, gpus)) = open_set("reduce_scatter_matches_the_host", &set) else {
            continue;
        };
        let n = gpus.len();
        let cases: Vec<(Vec<usize>, usize)> = vec![
            (vec![2 * n, 3], 0),
            (vec![2 * n + 1, 6], 0),
            (vec![5, 2 * n + 1], 1),
            (vec![3, 2 * n, 2], 1),
            (vec![2, 3, n + 2], 2),
        ];
        for dtype in [DType::F32, DType::BF16] {
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean] {
                for (shape, axis) in &cases {
                    let what = format!(
                        "reduce_scatter {} of {dtype:?}{shape:?} along {axis} on {set:?}",
                        op.name()
                    );
                    let ins: Vec<Tensor> = (0..n)
                        .map(|r| tensor(shape, dtype, r as u64 + 11, &gpus[r], r == 1))
                        .collect();
                    let data: Vec<Vec<f64>> = ins.iter().map(Tensor::to_f64_vec).collect();
                    let sizes = array_split(shape[*axis], n);
                    let out = reduce_scatter(&parts_of(&gpus, &ins), op, *axis, &sizes)
                        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
                    let shapes: Vec<Vec<usize>> = sizes
                        .iter()
                        .map(|&k| {
                            let mut s = shape.clone();
                            s[*axis] = k;
                            s
                        })
                        .collect();
                    check_placed(&out, &gpus, &shapes, &what);
                    let (want, tol) = reduce_on_host(&data, op, dtype);
                    let mut start = 0;
                    for (r, o) in out.iter().enumerate() {
                        let w = slice_axis(&want, shape, *axis, start, sizes[r]);
                        let t = slice_axis(&tol, shape, *axis, start, sizes[r]);
                        start += sizes[r];
                        assert_close(&o.to_f64_vec(), &w, &t, &format!("{what}, rank {r}"));
                    }
                    for (t, d) in ins.iter().zip(&data) {
                        assert_eq!(&t.to_f64_vec(), d, "{what}: an input changed");
                    }
                }
            }
        }
    }
}

#[test]
fn broadcast_copies_the_source_everywhere() {
    for set in sets() {
        let Some((_one, gpus)) = open_set("broadcast_copies_the_source_everywhere", &set) else {
            continue;
        };
        let n = gpus.len();
        for (dtype, shape) in [
            (DType::F32, vec![257]),
            (DType::BF16, vec![3, 5]),
            (DType::I16, vec![9]),
        ] {
            for src in 0..n {
                let what = format!("broadcast from {src} of {dtype:?}{shape:?} on {set:?}");
                let ins: Vec<Tensor> = (0..n)
                    .map(|r| {
                        if r == src {
                            tensor(&shape, dtype, 5, &gpus[r], false)
                        } else {
                            Tensor::zeros(&shape, dtype)
                        }
                    })
                    .collect();
                let want = ins[src].to_f64_vec();
                let out = broadcast(&parts_of(&gpus, &ins), src)
                    .unwrap_or_else(|e| panic!("{what}: {e:?}"));
                check_placed(&out, &gpus, &vec![shape.clone(); n], &what);
                for (r, o) in out.iter().enumerate() {
                    assert_eq!(o.to_f64_vec(), want, "{what}, rank {r}");
                }
                // The other tensors only gave the shape: not copied anywhere.
                for (r, t) in ins.iter().enumerate().filter(|(r, _)| *r != src) {
                    assert_eq!(t.device_owner(), None, "{what}: rank {r}'s tensor moved");
                }
            }
        }
    }
}

/// A kernel launched between issuing a collective and joining it runs; one
/// launched after the join reads the collective's result (its compute
/// stream waited for the communication stream); a collective dropped
/// without a join leaves the GPUs right; the collectives' time is counted.
#[test]
fn pending_collectives_order_the_kernels_after_them() {
    use crate::db::Database;
    use crate::exec::Value;
    for set in sets().into_iter().take(2) {
        let Some((_one, gpus)) = open_set("pending_collectives_order_the_kernels_after_them", &set)
        else {
            continue;
        };
        let n = gpus.len();
        // Large enough that the collective is still running when the
        // kernels after it are launched, if nothing orders them.
        let len = 1 << 22;
        let ins: Vec<Tensor> = (0..n)
            .map(|r| {
                let t = Tensor::full(&[len], DType::F32, r as f64 + 1.0);
                gpus[r].to_device(&t).unwrap();
                t
            })
            .collect();
        let mut db = Database::new();
        let file = db.set_source(
            "/nccl_tests.tsr",
            include_str!("../../../../../examples/vadd.tsr").into(),
        );
        let vadd = |x: &Tensor, y: &Tensor, g: &Gpu| {
            let out = Tensor::zeros(&[len], DType::F32);
            let args = [
                Value::Tensor(x.clone()),
                Value::Tensor(y.clone()),
                Value::Tensor(out.clone()),
            ];
            let (k, a, grid) = crate::exec::launch::prepared(&db, file, "vadd", &args);
            g.launch(&k, &a, grid, &Interrupt::new()).unwrap();
            out
        };
        let before: Vec<u64> = gpus.iter().map(|g| g.collectives()).collect();
        let pending = all_reduce_async(&parts_of(&gpus, &ins), ReduceOp::Sum, None).unwrap();
        // Meanwhile: a kernel that does not need the result.
        let other = vadd(&ins[0], &ins[0], &gpus[0]);
        let out = pending.join().unwrap();
        let total = (n * (n + 1) / 2) as f32;
        // After the join: kernels reading the result on every GPU.
        let halves = Tensor::full(&[len], DType::F32, 0.5);
        for (r, o) in out.iter().enumerate() {
            let y = halves.deep_clone();
            let sum = vadd(o, &y, &gpus[r]);
            assert!(
                sum.to_f32_vec().iter().all(|&v| v == total + 0.5),
                "rank {r} on {set:?}"
            );
        }
        assert!(other.to_f32_vec().iter().all(|&v| v == 2.0));
        // Dropped without a join: the next collective is still right.
        drop(broadcast_async(&parts_of(&gpus, &ins), 0, None).unwrap());
        let again = all_reduce(&parts_of(&gpus, &ins), ReduceOp::Max).unwrap();
        assert!(again[0].to_f32_vec().iter().all(|&v| v == n as f32));
        // Moved to another GPU right after the join: the copy waits for
        // the collective's writes.
        if n > 1 {
            let fresh = all_reduce(&parts_of(&gpus, &ins), ReduceOp::Sum).unwrap();
            gpus[1].to_device(&fresh[0]).unwrap();
            assert_eq!(fresh[0].device_owner(), Some(gpus[1].owner()));
            assert!(fresh[0].to_f32_vec().iter().all(|&v| v == total));
        }
        for (g, b) in gpus.iter().zip(before) {
            assert_eq!(g.collectives(), b + 3 + u64::from(n > 1));
            assert!(
                g.collective_time() > Duration::ZERO,
                "cuda:{}",
                g.info.ordinal
            );
        }
    }
}

/// A tensor given for two ranks, and one current on another GPU of the set,
/// are read right and left as they were.
#[test]
fn shared_and_moved_inputs_are_read_right() {
    let Some((_one, gpus)) = open_set("shared_and_moved_inputs_are_read_right", &[0, 1]) else {
        return;
    };
    let x = tensor(&[1000], DType::F32, 9, &gpus[0], false);
    let want: Vec<f64> = x.to_f64_vec().iter().map(|v| 2.0 * v).collect();
    let out = all_reduce(
        &[(gpus[0].clone(), x.clone()), (gpus[1].clone(), x.clone())],
        ReduceOp::Sum,
    )
    .unwrap();
    for o in &out {
        assert_eq!(o.to_f64_vec(), want);
    }
    assert_eq!(
        x.to_f64_vec(),
        want.iter().map(|v| v / 2.0).collect::<Vec<_>>()
    );
    // Rank 0's input is current on cuda:1: moved to cuda:0 first.
    let y = tensor(&[1000], DType::F32, 10, &gpus[1], false);
    let z = tensor(&[1000], DType::F32, 11, &gpus[1], false);
    let (yv, zv) = (y.to_f64_vec(), z.to_f64_vec());
    let out = all_reduce(&[(gpus[0].clone(), y), (gpus[1].clone(), z)], ReduceOp::Sum).unwrap();
    let sum: Vec<f64> = yv.iter().zip(&zv).map(|(a, b)| a + b).collect();
    for o in &out {
        assert_eq!(o.to_f64_vec(), sum);
    }
}

/// Communicators are made once per ordered set of contexts, again for a
/// new context of the same GPU.
#[test]
fn communicators_are_made_once_per_set() {
    let Some((one, gpus)) = open_set("communicators_are_made_once_per_set", &[0, 1]) else {
        return;
    };
    let x = |g: &Gpu| tensor(&[64], DType::F32, 1, g, false);
    let run = |gs: &[Arc<Gpu>]| {
        let parts: Vec<(Arc<Gpu>, Tensor)> = gs.iter().map(|g| (g.clone(), x(g))).collect();
        all_reduce(&parts, ReduceOp::Sum).unwrap();
    };
    let made = || COMM_INITS.load(Ordering::Relaxed);
    let start = made();
    run(&gpus);
    assert_eq!(made(), start + 1);
    run(&gpus);
    assert_eq!(made(), start + 1);
    let reversed = vec![gpus[1].clone(), gpus[0].clone()];
    run(&reversed);
    assert_eq!(made(), start + 2);
    run(&reversed);
    assert_eq!(made(), start + 2);
    drop(one);
    let Some((_one, fresh)) = open_set("communicators_are_made_once_per_set", &[0, 1]) else {
        return;
    };
    run(&fresh);
    assert_eq!(made(), start + 3);
    // The sets of contexts that are gone are aborted at the next
    // collective: only the fresh one is left.
    drop((gpus, reversed));
    run(&fresh);
    assert_eq!(made(), start + 3);
    let left: Vec<Vec<u64>> = COMMS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|c| c.owners.clone())
        .collect();
    let owners: Vec<u64> = fresh.iter().map(|g| g.owner()).collect();
    assert_eq!(left, vec![owners]);
}

/// NCCL's error codes become E0730 with NCCL's name and text for them
/// (wherever NCCL loads: no GPU is needed).
#[test]
fn nccl_errors_are_e0730() {
    let Ok(lib) = library() else {
        eprintln!("nccl_errors_are_e0730: skipped, no NCCL");
        return;
    };
    let e = nccl_error(lib, "all_reduce (sum) over cuda:0, cuda:1", 4);
    assert_eq!(e.code, "E0730");
    assert!(
        e.message.starts_with(
            "all_reduce (sum) over cuda:0, cuda:1 failed: NCCL says ncclInvalidArgument"
        ),
        "{}",
        e.message
    );
    assert!(e.help.unwrap().contains("NCCL_DEBUG=WARN"));
    let e = nccl_error(lib, "x", 1);
    assert!(
        e.message.contains("ncclUnhandledCudaError"),
        "{}",
        e.message
    );
}

/// Past `TIMINGS_CAP` collectives, the finished ones' times are summed as
/// new ones come; every one is counted and timed.
#[test]
fn many_collectives_sum_their_times_as_they_go() {
    let Some((_one, gpus)) = open_set("many_collectives_sum_their_times_as_they_go", &[0]) else {
        return;
    };
    let g = &gpus[0];
    let x = tensor(&[1 << 16], DType::F32, 2, g, false);
    for _ in 0..TIMINGS_CAP + 6 {
        let out = all_reduce(&[(g.clone(), x.clone())], ReduceOp::Sum).unwrap();
        // Read: the collective has finished before the next is noted.
        assert_eq!(out[0].to_f64_vec()[1], x.to_f64_vec()[1]);
    }
    assert_eq!(g.collectives(), (TIMINGS_CAP + 6) as u64);
    let pending = g
        .comm
        .timings
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .len();
    assert!(pending <= TIMINGS_CAP + 1, "{pending} timings not summed");
    assert!(g.collective_time() > Duration::ZERO);
    assert!(g
        .comm
        .timings
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_empty());
}

/// `wait_collectives` returns when the collectives have ended, and leaves
/// their times to be summed: the outputs are current, and the time read
/// afterwards counts every one.
#[test]
fn waiting_for_collectives_leaves_their_times_to_sum() {
    let Some((_one, gpus)) = open_set("waiting_for_collectives_leaves_their_times_to_sum", &[0, 1])
    else {
        return;
    };
    let x = tensor(&[1 << 20], DType::F32, 2, &gpus[0], false);
    let y = tensor(&[1 << 20], DType::F32, 3, &gpus[1], false);
    let parts = [(gpus[0].clone(), x.clone()), (gpus[1].clone(), y.clone())];
    let before: Vec<Duration> = gpus.iter().map(|g| g.collective_time()).collect();
    let out = all_reduce(&parts, ReduceOp::Sum).unwrap();
    for g in &gpus {
        g.wait_collectives();
        let unsummed = g
            .comm
            .timings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len();
        assert_eq!(unsummed, 1, "waiting does not sum");
        let end = g.comm.timings.lock().unwrap_or_else(|p| p.into_inner())[0]
            .1
            .clone();
        // SAFETY: the event is alive (held here); querying only reads it.
        let done = unsafe { cudarc::driver::result::event::query(end.cu_event()) };
        assert_eq!(done, Ok(()), "the collective has ended");
    }
    let want = x.to_f64_vec()[7] + y.to_f64_vec()[7];
    assert_eq!(out[1].to_f64_vec()[7], want);
    for (g, b) in gpus.iter().zip(before) {
        assert!(g.collective_time() > b);
    }
}

/// Two collectives queued back to back on the same GPUs: the second waits
/// for the first on the communication stream, and that wait is counted
/// once (in the first), so the summed time fits in the time both took.
#[test]
fn collectives_queued_behind_another_are_counted_once() {
    let Some((_one, gpus)) = open_set(
        "collectives_queued_behind_another_are_counted_once",
        &[0, 1],
    ) else {
        return;
    };
    let x = tensor(&[1 << 24], DType::F32, 2, &gpus[0], false);
    let y = tensor(&[1 << 24], DType::F32, 3, &gpus[1], false);
    let parts = [(gpus[0].clone(), x), (gpus[1].clone(), y)];
    // Warm: the communicators exist, the first call's set-up is not timed.
    drop(all_reduce(&parts, ReduceOp::Sum).unwrap());
    let before: Vec<Duration> = gpus.iter().map(|g| g.collective_time()).collect();
    let t0 = std::time::Instant::now();
    let first = all_reduce_async(&parts, ReduceOp::Sum, None).unwrap();
    let second = all_reduce_async(&parts, ReduceOp::Sum, None).unwrap();
    drop((first.join().unwrap(), second.join().unwrap()));
    for g in &gpus {
        g.wait_collectives();
    }
    let wall = t0.elapsed();
    for (g, b) in gpus.iter().zip(before) {
        let summed = g.collective_time() - b;
        assert!(summed > Duration::ZERO);
        assert!(summed <= wall, "{summed:?} summed on the GPU in {wall:?}");
    }
}

/// A GPU twice, a broken GPU, mismatched shapes and a dtype NCCL cannot
/// reduce are diagnostics naming the collective.
#[test]
fn bad_sets_are_diagnostics() {
    let Some((_one, gpus)) = open_set("bad_sets_are_diagnostics", &[0]) else {
        return;
    };
    let g = &gpus[0];
    let x = tensor(&[8], DType::F32, 1, g, false);
    let twice = Arc::new(Gpu::open(0).unwrap());
    let e = all_reduce(&[(g.clone(), x.clone()), (twice, x.clone())], ReduceOp::Sum).unwrap_err();
    assert_eq!(e.code, "E0707");
    assert!(
        e.message.contains("cuda:0 is in the set twice"),
        "{}",
        e.message
    );
    let e = all_reduce(&[], ReduceOp::Sum).unwrap_err();
    assert_eq!(e.code, "E0707");
    let e = broadcast(&[(g.clone(), x.clone())], 1).unwrap_err();
    assert_eq!(e.code, "E0707");
    let i16s = tensor(&[8], DType::I16, 1, g, false);
    let e = all_reduce(&[(g.clone(), i16s)], ReduceOp::Sum).unwrap_err();
    assert_eq!(e.code, "E0721");
    // A broken context (what a sticky error leaves) is refused, named.
    let broken = Arc::new(Gpu::open(0).unwrap());
    broken.broken.store(true, Ordering::Relaxed);
    let e = all_gather(&[(broken, x)], 0).unwrap_err();
    assert_eq!(e.code, "E0730");
    assert!(
        e.message.contains("all_gather along axis 0 over cuda:0"),
        "{}",
        e.message
    );
}

/// f8 tensors are gathered everywhere; reduced where NCCL and the GPUs
/// can, else E0721.
#[test]
fn f8_is_reduced_or_refused() {
    let Some((_one, gpus)) = open_set("f8_is_reduced_or_refused", &[0, 1]) else {
        return;
    };
    for dtype in [DType::F8E4M3, DType::F8E5M2] {
        let ins: Vec<Tensor> = (0..2)
            .map(|r| tensor(&[64], dtype, r + 3, &gpus[r as usize], false))
            .collect();
        let data: Vec<Vec<f64>> = ins.iter().map(Tensor::to_f64_vec).collect();
        match all_reduce(&parts_of(&gpus, &ins), ReduceOp::Max) {
            Ok(out) => {
                let (want, tol) = reduce_on_host(&data, ReduceOp::Max, dtype);
                for o in &out {
                    assert_close(&o.to_f64_vec(), &want, &tol, &format!("max of {dtype:?}"));
                }
            }
            Err(e) => {
                assert_eq!(e.code, "E0721", "{e:?}");
                assert!(e.message.contains("not supported by NCCL"), "{}", e.message);
            }
        }
    }
}

/// The strided copies on a compute stream, by the driver's 2D copy
/// and row by row (the path of pitches past its limit), and a packed one,
/// move what the host simulation of the same copies moves.
#[test]
fn strided_copies_on_the_gpu_match_the_host() {
    let Some((_one, gpus)) = open_set("strided_copies_on_the_gpu_match_the_host", &[0]) else {
        return;
    };
    let g = &gpus[0];
    let stream = g.stream.clone();
    let shape = [3, 7, 5];
    let split = Split::new(&shape, 1, array_split(7, 3), 2);
    let whole: Vec<u8> = (0..210usize).map(|i| (i * 7 % 251) as u8).collect();
    let mut want = vec![0u8; whole.len()];
    for c in split.copies() {
        apply(&c, &mut whole.clone(), &mut want, true);
    }
    for max_pitch in [MAX_PITCH, 0] {
        let src = g.pool.alloc(whole.len()).unwrap();
        let dst = g.pool.alloc(whole.len()).unwrap();
        src.write(&whole).unwrap();
        for c in split.copies() {
            let (s, d) = (
                src.address() + c.whole as u64,
                dst.address() + c.block as u64,
            );
            copy_2d(
                &stream,
                d,
                c.block_pitch,
                s,
                c.whole_pitch,
                c.width,
                c.height,
                max_pitch,
            )
            .unwrap();
        }
        stream.synchronize().unwrap();
        let mut got = vec![0u8; whole.len()];
        dst.read(&mut got).unwrap();
        assert_eq!(got, want, "max pitch {max_pitch}");
        // Packed rows: one copy.
        let back = g.pool.alloc(whole.len()).unwrap();
        copy_2d(
            &stream,
            back.address(),
            30,
            dst.address(),
            30,
            30,
            7,
            max_pitch,
        )
        .unwrap();
        stream.synchronize().unwrap();
        let mut again = vec![0u8; whole.len()];
        back.read(&mut again).unwrap();
        assert_eq!(again, want, "packed, max pitch {max_pitch}");
    }
}

/// Outputs given by the caller are written in place; each rank's part is
/// joined by its own thread (as the devices of a sharded function join
/// theirs), strided all-gathers placed at that rank's join; outputs of
/// the wrong shape, or an output that is an input, are refused.
#[test]
fn outputs_in_place_join_per_rank() {
    for set in sets() {
        let Some((_one, gpus)) = open_set("outputs_in_place_join_per_rank", &set) else {
            continue;
        };
        let n = gpus.len();
        let what = format!("on {set:?}");
        let ins: Vec<Tensor> = (0..n)
            .map(|r| tensor(&[4, 6], DType::F32, r as u64 + 1, &gpus[r], false))
            .collect();
        let into: Vec<Tensor> = gpus
            .iter()
            .map(|g| g.zeros(&[4, 6], DType::F32).unwrap())
            .collect();
        let (want, tol) = reduce_on_host(
            &ins.iter().map(Tensor::to_f64_vec).collect::<Vec<_>>(),
            ReduceOp::Sum,
            DType::F32,
        );
        let ranks = all_reduce_async(&parts_of(&gpus, &ins), ReduceOp::Sum, Some(&into))
            .unwrap()
            .into_ranks();
        let outs: Vec<Tensor> = std::thread::scope(|s| {
            let hs: Vec<_> = ranks.into_iter().map(|p| s.spawn(|| p.join())).collect();
            hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
        });
        for (r, (o, t)) in outs.iter().zip(&into).enumerate() {
            assert!(
                o.same_storage(t),
                "{what}: rank {r}'s output is not the given one"
            );
            assert_close(&t.to_f64_vec(), &want, &tol, &format!("{what}, rank {r}"));
        }
        // A strided gather (along axis 1 of a [3, 2n, 2] tensor), placed at
        // each rank's own join.
        let whole = values(5, 3 * 2 * n * 2, DType::F32);
        let shards: Vec<Tensor> = (0..n)
            .map(|r| {
                let t = Tensor::from_f64(
                    &[3, 2, 2],
                    DType::F32,
                    &slice_axis(&whole, &[3, 2 * n, 2], 1, 2 * r, 2),
                );
                gpus[r].to_device(&t).unwrap();
                t
            })
            .collect();
        let into: Vec<Tensor> = gpus
            .iter()
            .map(|g| g.zeros(&[3, 2 * n, 2], DType::F32).unwrap())
            .collect();
        let ranks = all_gather_async(&parts_of(&gpus, &shards), 1, Some(&into))
            .unwrap()
            .into_ranks();
        for (r, p) in ranks.into_iter().enumerate().rev() {
            let o = p.join().unwrap();
            assert_eq!(o.to_f64_vec(), whole, "{what}: gather, rank {r}");
        }
        // Refused: a wrong shape, and an output that is an input.
        let e = all_reduce_async(&parts_of(&gpus, &ins), ReduceOp::Sum, Some(&shards))
            .err()
            .expect("wrong output shapes");
        assert!(e.message.contains("rank 0's output"), "{what}: {e:?}");
        let e = all_reduce_async(&parts_of(&gpus, &ins), ReduceOp::Sum, Some(&ins))
            .err()
            .expect("outputs that are inputs");
        assert!(e.message.contains("also an input"), "{what}: {e:?}");
    }
}
