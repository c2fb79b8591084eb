//! Tests of the CUDA executor that run on every machine: without a driver or
//! a GPU, opening one is E0721 (no panic); with one, `vadd` runs there and
//! agrees with the CPU executor.

use super::*;

#[test]
fn opening_a_gpu_is_a_diagnostic_or_a_gpu() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    match Gpu::open(0) {
        Ok(gpu) => {
            let info = gpu.info();
            assert!(info.memory_bytes > 0 && !info.name.is_empty(), "{info:?}");
            assert!(info.arch.is_nvidia());
        }
        Err(e) => {
            assert_eq!(e.code, "E0721", "{e}");
            assert!(e.help.is_some());
        }
    }
    // An ordinal past every GPU is E0721 in any case.
    let e = Gpu::open(1 << 20).err().expect("no machine has 2^20 GPUs");
    assert_eq!(e.code, "E0721", "{e}");
}

const VADD: &str = "const BLOCK = 1024\n\
@kernel(grid=(cdiv(N, BLOCK),), num_warps=4)\n\
def vadd(x: Tensor[\"N\", f32], y: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    \
i = program_id(0) * BLOCK\n    \
store(out[i : i + BLOCK], load(x[i : i + BLOCK]) + load(y[i : i + BLOCK]))\n";

/// GPU tests run one at a time: one of them breaks the (shared, primary)
/// context on purpose.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The GPU (and the lock that keeps the other GPU tests waiting), or `None`
/// with a message saying why the test is skipped.
fn gpu_or_skip(test: &str) -> Option<(std::sync::MutexGuard<'static, ()>, Arc<Gpu>)> {
    let lock = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    match Gpu::open(0) {
        Ok(g) => Some((lock, Arc::new(g))),
        Err(e) => {
            eprintln!("{test}: skipped, no GPU ({e})");
            None
        }
    }
}

fn vadd_db() -> (crate::db::Database, crate::db::SourceFile) {
    let mut db = crate::db::Database::new();
    let file = db.set_source("/vadd.tsr", VADD.into());
    (db, file)
}

fn launch_vadd(
    db: &crate::db::Database,
    file: crate::db::SourceFile,
    device: &crate::exec::Device,
    args: &[crate::exec::Value],
) -> Result<(), ExecError> {
    crate::exec::launch_kernel(db, file, "vadd", None, args, &[], device, &Interrupt::new())
}

#[test]
fn tensors_stay_on_the_gpu_between_launches() {
    use crate::exec::{Device, Tensor, Value};
    let Some((_one, gpu)) = gpu_or_skip("tensors_stay_on_the_gpu_between_launches") else {
        return;
    };
    let (db, file) = vadd_db();
    let n = 1001;
    let x = Tensor::arange(0, n, DType::F32);
    let out = Tensor::zeros(&[n as usize], DType::F32);
    let args = [
        Value::Tensor(x.clone()),
        Value::Tensor(x.clone()),
        Value::Tensor(out.clone()),
    ];
    let device = Device::Cuda(gpu.clone());
    launch_vadd(&db, file, &device, &args).unwrap();
    let after_first = gpu.memory_stats();
    assert_eq!(after_first.driver_allocs, 2, "x and out: {after_first:?}");
    assert_eq!(out.device_owner(), Some(gpu.owner()));
    // `out = out + out` three times on the device: nothing is copied or
    // allocated, and the host sees the result when it reads it.
    let twice = [
        Value::Tensor(out.clone()),
        Value::Tensor(out.clone()),
        Value::Tensor(out.clone()),
    ];
    for _ in 0..3 {
        launch_vadd(&db, file, &device, &twice).unwrap();
    }
    assert_eq!(gpu.memory_stats().driver_allocs, 2);
    let got = out.to_f64_vec();
    assert!(
        got.iter().enumerate().all(|(i, v)| *v == 16.0 * i as f64),
        "{:?}",
        &got[..4]
    );
    // A CPU launch on the same tensors uses (and updates) the host copy; the
    // next GPU launch sees it.
    launch_vadd(&db, file, &Device::Cpu, &twice).unwrap();
    launch_vadd(&db, file, &device, &twice).unwrap();
    assert_eq!(out.to_f64_vec()[3], 3.0 * 64.0);
    // Temporaries of the same size reuse freed blocks.
    for _ in 0..5 {
        let t = Tensor::zeros(&[n as usize], DType::F32);
        let a = [
            Value::Tensor(x.clone()),
            Value::Tensor(x.clone()),
            Value::Tensor(t),
        ];
        launch_vadd(&db, file, &device, &a).unwrap();
    }
    let s = gpu.memory_stats();
    assert_eq!(s.driver_allocs, 3, "{s:?}");
    assert!(s.reuses >= 4, "{s:?}");
    // Moving to the host frees the device copy.
    out.to_host();
    assert_eq!(out.device_owner(), None);
    assert_eq!(out.to_f64_vec()[3], 3.0 * 64.0);
}

/// A kernel's fault leaves the driver unusable in the whole process, so the
/// test of it runs in a process of its own (this test binary, asked for the
/// ignored test below).
#[test]
fn a_sticky_error_is_reported_in_a_process_of_its_own() {
    let Some((_one, gpu)) = gpu_or_skip("a_sticky_error_is_reported_in_a_process_of_its_own")
    else {
        return;
    };
    drop(gpu);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "exec::cuda::tests::sticky_error_in_a_process_of_its_own",
            "--nocapture",
        ])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

#[test]
#[ignore = "run by a_sticky_error_is_reported_in_a_process_of_its_own in a process of its own"]
fn sticky_error_in_a_process_of_its_own() {
    use crate::exec::{Device, Tensor, Value};
    let Some((_one, gpu)) = gpu_or_skip("sticky_error_in_a_process_of_its_own") else {
        return;
    };
    let (db, file) = vadd_db();
    // A variant that assumes `N % 16 == 0` traps in its prologue when
    // launched with N = 1001: the context is unusable afterwards.
    let item = crate::db::file_kernels(&db, file)[0].1;
    let mut spec = crate::ir::tile::Specialization::new();
    spec.divisors.insert("N".into(), 16);
    let kernel = crate::db::tile_ir(&db, item, db.options(), spec)
        .clone()
        .unwrap();
    let x = Tensor::arange(0, 1001, DType::F32);
    let kept = Tensor::full(&[4], DType::F32, 2.0);
    gpu.to_device(&kept).unwrap();
    kept.to_f64_vec(); // also on the host: not lost
    let lost = Tensor::zeros(&[4], DType::F32);
    let four = [
        Value::Tensor(kept.clone()),
        Value::Tensor(kept.clone()),
        Value::Tensor(lost.clone()),
    ];
    launch_vadd(&db, file, &Device::Cuda(gpu.clone()), &four).unwrap();
    let args = [
        super::Arg::Tensor(x.clone()),
        super::Arg::Tensor(x.clone()),
        super::Arg::Tensor(x.clone()),
    ];
    let e = gpu
        .launch(&kernel, &args, [1, 1, 1], &Interrupt::new())
        .expect_err("the prologue traps");
    assert_eq!(e.code, "E0730", "{e}");
    assert!(
        e.message.contains("vadd") && e.message.contains("x: f32[1001]"),
        "{e}"
    );
    assert!(gpu.is_broken(), "{e}");
    assert!(!kept.forget_device(gpu.owner()), "kept had a host copy");
    assert!(lost.forget_device(gpu.owner()), "lost was only on the GPU");
    let old_owner = gpu.owner();
    match Gpu::reopen(gpu) {
        // Where the driver allows a fresh context, it works.
        Ok(fresh) => {
            let fresh = Arc::new(fresh);
            assert!(!fresh.is_broken());
            assert_ne!(fresh.owner(), old_owner);
            let out = Tensor::zeros(&[4], DType::F32);
            let again = [
                Value::Tensor(kept.clone()),
                Value::Tensor(kept.clone()),
                Value::Tensor(out.clone()),
            ];
            launch_vadd(&db, file, &Device::Cuda(fresh), &again).unwrap();
            assert_eq!(out.to_f64_vec(), [4.0; 4]);
        }
        // After a trap it does not (driver 580): E0721 says why.
        Err(e) => {
            assert_eq!(e.code, "E0721", "{e}");
            let help = e.help.unwrap_or_default();
            assert!(help.contains("restart tessera"), "{help}");
        }
    }
    // The old context's copy of `x` is gone: reading `x` gives its host
    // elements, as they were before the failed launch.
    assert_eq!(x.to_f64_vec()[1000], 1000.0);
    assert_eq!(kept.to_f64_vec(), [2.0; 4]);
}
