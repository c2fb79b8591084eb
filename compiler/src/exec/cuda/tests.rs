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

/// `vadd` of `examples/vadd.tsr` over `n` elements, prepared for a launch.
fn vadd(n: usize) -> (crate::exec::launch::Prepared, crate::exec::Tensor) {
    use crate::db::Database;
    use crate::exec::{Tensor, Value};
    let mut db = Database::new();
    let file = db.set_source(
        "/cuda_tests.tsr",
        include_str!("../../../../examples/vadd.tsr").into(),
    );
    let x = Tensor::arange(0, n as i64, DType::F32);
    let y = Tensor::full(&[n], DType::F32, 0.5);
    let out = Tensor::zeros(&[n], DType::F32);
    let args = [
        Value::Tensor(x),
        Value::Tensor(y),
        Value::Tensor(out.clone()),
    ];
    (crate::exec::launch::prepared(&db, file, "vadd", &args), out)
}

#[test]
fn tensors_past_32_bit_offsets_are_refused_before_any_launch() {
    use crate::db::Database;
    use crate::exec::{Tensor, Value};
    let mut db = Database::new();
    let file = db.set_source(
        "/big.tsr",
        "@kernel(grid=(1,))\ndef poke(x: Tensor[\"M\", \"K\", u8]):\n    store(x[0, 0 : 32], full([32], 7, u8))\n".into(),
    );
    // 2^31 elements (lazily zeroed: no page is touched), one past i32::MAX.
    let lazy = |shape: &[usize]| {
        let data = crate::exec::tensor::Data::lazy_zeros(shape, DType::U8).unwrap();
        Tensor::from_data(shape, DType::U8, data)
    };
    let big = lazy(&[65536, 32768]);
    let (k, args, _) = crate::exec::launch::prepared(&db, file, "poke", &[Value::Tensor(big)]);
    let e = super::fits_32_bit_offsets(&k, &args).unwrap_err();
    assert_eq!(e.code, "E0711");
    assert!(e.message.contains("2147483648 elements"), "{}", e.message);
    let small = lazy(&[65535, 32768]);
    let (k, args, _) = crate::exec::launch::prepared(&db, file, "poke", &[Value::Tensor(small)]);
    assert!(super::fits_32_bit_offsets(&k, &args).is_ok());
}

const VADD: &str = "const BLOCK = 1024\n\
@kernel(grid=(cdiv(N, BLOCK),), num_warps=4)\n\
def vadd(x: Tensor[\"N\", f32], y: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    \
i = program_id(0) * BLOCK\n    \
store(out[i : i + BLOCK], load(x[i : i + BLOCK]) + load(y[i : i + BLOCK]))\n";

/// GPU tests run one at a time: one of them breaks the (shared, primary)
/// context on purpose.
pub(super) static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

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

/// A second `Gpu` (a fresh memory cache, as a second process has) with the
/// same cache folder loads the cubin from disk instead of compiling it, and
/// the kernel it loads computes the same.
#[test]
fn a_second_gpu_loads_the_kernel_from_the_disk_cache() {
    let Some((_one, _)) = gpu_or_skip("a_second_gpu_loads_the_kernel_from_the_disk_cache") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kernels = dir.path().join("kernels");
    let first = Gpu::open(0).unwrap().with_cache_dir(Some(kernels.clone()));
    let ((k, args, grid), out) = vadd(1001);
    first.launch(&k, &args, grid, &Interrupt::new()).unwrap();
    assert_eq!(
        first.cache_stats(),
        CacheStats {
            memory_hits: 0,
            disk_hits: 0,
            compiles: 1
        }
    );
    first.launch(&k, &args, grid, &Interrupt::new()).unwrap();
    assert_eq!(first.cache_stats().memory_hits, 1);
    assert_eq!(std::fs::read_dir(&kernels).unwrap().count(), 1);
    let want: Vec<f32> = (0..1001).map(|i| i as f32 + 0.5).collect();
    assert_eq!(out.to_f32_vec(), want);

    let second = Gpu::open(0).unwrap().with_cache_dir(Some(kernels.clone()));
    let ((k, args, grid), out) = vadd(1001);
    let start = Instant::now();
    second.launch(&k, &args, grid, &Interrupt::new()).unwrap();
    let took = start.elapsed();
    assert_eq!(
        second.cache_stats(),
        CacheStats {
            memory_hits: 0,
            disk_hits: 1,
            compiles: 0
        }
    );
    assert_eq!(out.to_f32_vec(), want);
    eprintln!("first launch from the disk cache: {took:?}");

    // A damaged entry is compiled again and replaced.
    let entry = std::fs::read_dir(&kernels)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(&entry, b"damaged").unwrap();
    let third = Gpu::open(0).unwrap().with_cache_dir(Some(kernels.clone()));
    third.launch(&k, &args, grid, &Interrupt::new()).unwrap();
    assert_eq!(third.cache_stats().compiles, 1);
    let fourth = Gpu::open(0).unwrap().with_cache_dir(Some(kernels));
    fourth.launch(&k, &args, grid, &Interrupt::new()).unwrap();
    assert_eq!(fourth.cache_stats().disk_hits, 1);
}

/// An unusable cache folder only means no disk cache.
#[test]
fn an_unwritable_cache_folder_still_runs() {
    let Some((_one, _)) = gpu_or_skip("an_unwritable_cache_folder_still_runs") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let gpu = Gpu::open(0)
        .unwrap()
        .with_cache_dir(Some(file.join("kernels")));
    let ((k, args, grid), out) = vadd(10);
    gpu.launch(&k, &args, grid, &Interrupt::new()).unwrap();
    assert_eq!(gpu.cache_stats().compiles, 1);
    assert_eq!(out.to_f32_vec()[9], 9.5);
}

/// The driver's measurements of the variant that ran: registers, the
/// ptxas report kept beside the cubin, and an occupancy in (0, 1].
#[test]
fn measured_resources_of_the_variant_that_ran() {
    let Some((_one, _)) = gpu_or_skip("measured_resources_of_the_variant_that_ran") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let gpu = Gpu::open(0)
        .unwrap()
        .with_cache_dir(Some(dir.path().to_path_buf()));
    let ((k, args, grid), _) = vadd(100);
    assert_eq!(gpu.measured(&k), None, "not run yet");
    gpu.launch(&k, &args, grid, &Interrupt::new()).unwrap();
    let m = gpu
        .measured(&k)
        .expect("the driver measures a loaded kernel");
    assert!(m.regs > 0 && m.regs <= 255, "{m:?}");
    assert_eq!(m.threads, 128, "vadd has num_warps=4");
    assert!(m.blocks_per_sm > 0, "{m:?}");
    assert!(m.occupancy() > 0.0 && m.occupancy() <= 1.0, "{m:?}");
    // No report when the driver's own JIT cache served the compile.
    assert!(matches!(m.spill_stores, None | Some(0)), "{m:?}");
    eprintln!("{}", measured_row(gpu.info(), &m));
    // The same numbers from the cubin on disk, in a fresh memory cache.
    let again = Gpu::open(0)
        .unwrap()
        .with_cache_dir(Some(dir.path().to_path_buf()));
    again.launch(&k, &args, grid, &Interrupt::new()).unwrap();
    assert_eq!(again.cache_stats().disk_hits, 1);
    assert_eq!(again.measured(&k), Some(m));
    // Another kernel of the same name is not the one measured.
    let mut other = (*k).clone();
    other.num_warps = 8;
    assert_eq!(gpu.measured(&other), None);
}

/// The JIT's info log of a real compile reports registers as the driver's
/// attribute does.
#[test]
fn the_jit_log_agrees_with_the_driver() {
    let Some((_one, gpu)) = gpu_or_skip("the_jit_log_agrees_with_the_driver") else {
        return;
    };
    let ((k, _, _), _) = vadd(100);
    let target = crate::ir::target::lower(&k, gpu.info().arch).unwrap();
    let ptx = crate::backend::ptx::module_of(
        gpu.info().arch,
        &[crate::backend::ptx::kernel_text(&target).unwrap()],
    )
    .unwrap();
    let linked = match jit::link_ptx(&gpu.ctx, &ptx) {
        Ok(l) => l,
        Err(e) => panic!("{:?}: {}", e.error, e.log),
    };
    assert!(!linked.cubin.is_empty());
    let info = jit::parse_info_log(&linked.info_log, &target.name);
    eprintln!("the JIT's info log:\n{}", linked.info_log);
    let module = gpu.ctx.load_module(Ptx::from_binary(linked.cubin)).unwrap();
    let f = module.load_function(&target.name).unwrap();
    if let Some(regs) = info.regs {
        assert_eq!(regs as i32, f.num_regs().unwrap(), "{}", linked.info_log);
    }
    // Bad PTX: the error log explains it, and E0730 carries it.
    let bad = ptx.replacen('{', "{\n\tbogus.instruction;", 1);
    let e = jit::link_ptx(&gpu.ctx, &bad)
        .err()
        .expect("bad PTX does not compile");
    assert!(!e.log.is_empty(), "the JIT gives an error log");
    let err = jit_error("vadd", e);
    assert_eq!(err.code, "E0730");
    assert!(err.help.unwrap().contains("the driver's JIT says:"));
}

#[test]
fn an_older_arch_can_be_asked_for() {
    let h100 = "NVIDIA H100";
    assert_eq!(arch_asked(h100, (9, 0), ""), Ok((Arch::Sm90a, None)));
    assert_eq!(arch_asked(h100, (9, 0), "sm_90a"), Ok((Arch::Sm90a, None)));
    assert_eq!(
        arch_asked(h100, (9, 0), " sm_80 "),
        Ok((Arch::Sm80, Some(Arch::Sm90a)))
    );
    let newer = arch_asked("NVIDIA A100", (8, 0), "sm_90").unwrap_err();
    assert!(
        newer.contains("cannot run code for it; it runs sm_80"),
        "{newer}"
    );
    let amd = arch_asked(h100, (9, 0), "gfx942").unwrap_err();
    assert!(amd.contains("cannot run code for it"), "{amd}");
    let typo = arch_asked(h100, (9, 0), "sm90").unwrap_err();
    assert!(
        typo.contains("is not an arch (expected one of: sm_70"),
        "{typo}"
    );
    assert!(arch_asked("old", (6, 1), "")
        .unwrap_err()
        .contains("sm_70 and later"));
}

#[test]
fn the_measured_row() {
    let info = GpuInfo {
        ordinal: 0,
        name: "NVIDIA H100 80GB HBM3".into(),
        compute_capability: (9, 0),
        memory_bytes: 80 << 30,
        arch: Arch::Sm90,
        own_arch: None,
    };
    let mut m = Measured {
        kernel: "gemm".into(),
        regs: 128,
        local_bytes: 0,
        static_smem_bytes: 0,
        dynamic_smem_bytes: 98304,
        max_threads_per_block: 512,
        threads: 256,
        blocks_per_sm: 2,
        max_threads_per_sm: 2048,
        spill_stores: Some(0),
        spill_loads: Some(0),
    };
    assert_eq!(
        measured_row(&info, &m),
        "measured on cuda:0 NVIDIA H100 80GB HBM3 (sm_90): 128 regs, 0 B spilled, 0 B local, \
         occupancy 25% (2 blocks/SM)"
    );
    m.blocks_per_sm = 1;
    m.threads = 96;
    m.spill_stores = None;
    m.local_bytes = 160;
    assert_eq!(
        measured_row(&info, &m),
        "measured on cuda:0 NVIDIA H100 80GB HBM3 (sm_90): 128 regs, spills not reported, \
         160 B local, occupancy 4.7% (1 block/SM)"
    );
    m.max_threads_per_sm = 0;
    assert_eq!(m.occupancy(), 0.0);
}

#[test]
fn the_cache_row() {
    let stats = CacheStats {
        memory_hits: 40,
        disk_hits: 1,
        compiles: 2,
    };
    assert_eq!(
        cache_row(Some(Path::new("/home/u/.cache/tessera/kernels")), stats),
        "kernel cache: /home/u/.cache/tessera/kernels: 2 compiled, 1 from disk, 40 reused"
    );
    assert_eq!(
        cache_row(None, CacheStats::default()),
        "kernel cache: in memory only (no cache folder; set TESSERA_CACHE_DIR): 0 compiled, \
         0 from disk, 0 reused"
    );
}

/// The variant an autotuned launch ran is found again with its chosen
/// launch options (`num_warps` is the kernel's field, not a specialised value).
#[test]
fn a_tuned_launch_keeps_its_launch_options() {
    use crate::db::Database;
    use crate::exec::{compiled_specialization, launch_specialization, Tensor, Value};
    let mut db = Database::new();
    let src = "@autotune(space={\"BLOCK\": [128, 1024], \"num_warps\": [2, 4]}, key=[\"N\"])\n\
@kernel(grid=(cdiv(N, BLOCK),))\n\
def acc(x: Tensor[\"N\", f32], BLOCK: const):\n    \
i = program_id(0) * BLOCK\n    \
store(x[i : i + BLOCK], load(x[i : i + BLOCK]) + 1.0)\n";
    let file = db.set_source("/tuned.tsr", src.into());
    let x = Value::Tensor(Tensor::zeros(&[1000], DType::F32));
    let named = [("BLOCK".to_string(), Value::Int(1024))];
    let mut launch = launch_specialization(&db, file, "acc", &[x], &named).unwrap();
    // What `launch_kernel` records when tuning chose the second `num_warps`.
    launch.consts.values.insert("num_warps".into(), 4);
    let spec = compiled_specialization(&db, file, "acc", &launch).unwrap();
    assert_eq!(spec.values.get("num_warps"), Some(&4));
    assert_eq!(spec.values.get("BLOCK"), Some(&1024));
    let item = crate::db::kernels_named(&db, file, "acc")[0].1;
    let k = crate::db::tile_ir(&db, item, db.options(), spec)
        .clone()
        .unwrap();
    assert_eq!(k.num_warps, 4);
}

/// A launch's own facts (`N % 16` of a 4096-element launch) are assumed
/// without an entry check; the same fact given with `-D` is checked.
#[test]
fn launch_facts_are_not_checked_at_entry_but_defines_are() {
    use crate::db::Database;
    use crate::exec::{compiled_specialization, launch_specialization, Tensor, Value};
    let mut db = Database::new();
    db.set_arch(Arch::Sm90a);
    let file = db.set_source("/facts.tsr", VADD.into());
    let n = |k: usize| Value::Tensor(Tensor::zeros(&[k], DType::F32));
    let launch =
        launch_specialization(&db, file, "vadd", &[n(4096), n(4096), n(4096)], &[]).unwrap();
    let spec = compiled_specialization(&db, file, "vadd", &launch).unwrap();
    assert!(spec.trusted);
    assert_eq!(spec.divisors.get("N"), Some(&16));
    let ptx = |spec: crate::ir::tile::Specialization| {
        let item = crate::db::kernels_named(&db, file, "vadd")[0].1;
        let k = crate::db::target_ir(&db, item, db.options(), spec)
            .clone()
            .unwrap();
        crate::backend::ptx::kernel_text(&k).unwrap()
    };
    let trusted = ptx(spec);
    assert!(trusted.contains("N % 16 == 0: a fact of the launch's own value (not checked)"));
    assert!(!trusted.contains("trap"), "{trusted}");
    let defined = ptx(crate::ir::tile::Specialization::new().with_divisor("N", 16));
    assert!(defined.contains("assume N % 16 == 0 (-D N%16); trap otherwise"));
    assert!(defined.contains("trap;"));
}

/// `:resources` finds the measurements of the variant that ran by its Tile
/// IR, rebuilt from the launch's specialization: the kernel a launch runs and
/// the one `db::tile_ir` gives for its `compiled_specialization` are equal,
/// for run-time dims and their run-time facts, consts (given and defaulted), a
/// dim the kernel needs specialised (`D`, which the launch learns from the
/// tensors) and a standard-library kernel.
#[test]
fn the_kernel_that_ran_is_found_again_from_its_specialization() {
    use crate::db::Database;
    use crate::exec::{compiled_specialization, launch_specialization, Tensor, Value};
    let mut db = Database::new();
    let src = [
        "from std.linalg import gemm_bf16\n",
        include_str!("../../../../examples/vadd.tsr"),
        include_str!("../../../../examples/flash_attn.tsr"),
    ]
    .join("\n");
    let file = db.set_source("/cuda_tests.tsr", src);
    let bf = |shape: &[usize]| Value::Tensor(Tensor::zeros(shape, DType::BF16));
    let f32s = |n: usize| Value::Tensor(Tensor::zeros(&[n], DType::F32));
    let f32s2 = |shape: &[usize]| Value::Tensor(Tensor::zeros(shape, DType::F32));
    let cases: Vec<(&str, Vec<Value>)> = vec![
        ("vadd", vec![f32s(100), f32s(100), f32s(100)]),
        (
            "flash_attn",
            vec![
                bf(&[1, 2, 100, 64]),
                bf(&[1, 2, 100, 64]),
                bf(&[1, 2, 100, 64]),
                bf(&[1, 2, 100, 64]),
                Value::Float(0.125),
            ],
        ),
        // A standard-library kernel, with a dim of 1 fixed.
        (
            "gemm_bf16",
            vec![bf(&[1, 32]), bf(&[32, 48]), f32s2(&[1, 48])],
        ),
        (
            "flash_attn",
            vec![
                bf(&[1, 1, 70, 32]),
                bf(&[1, 1, 70, 32]),
                bf(&[1, 1, 70, 32]),
                bf(&[1, 1, 70, 32]),
                Value::Float(0.5),
                Value::Bool(true),
                Value::Int(64),
            ],
        ),
    ];
    for (name, args) in cases {
        let (ran, _, _) = crate::exec::launch::prepared(&db, file, name, &args);
        let launch = launch_specialization(&db, file, name, &args, &[]).unwrap();
        let spec = compiled_specialization(&db, file, name, &launch).unwrap();
        // As `:resources` finds it.
        let item = crate::db::kernels_named(&db, file, name)[0].1;
        let again = crate::db::tile_ir(&db, item, db.options(), spec)
            .clone()
            .unwrap();
        assert_eq!(*again, *ran, "{name}");
    }
}

/// `add_one` with const `BLOCK = block` on 10 elements, prepared for a launch.
fn add_one(block: i64) -> crate::exec::launch::Prepared {
    use crate::db::Database;
    use crate::exec::{Tensor, Value};
    let mut db = Database::new();
    let file = db.set_source(
        "/cuda_tests.tsr",
        "@kernel(grid=(cdiv(N, BLOCK),))\n\
         def add_one(x: Tensor[\"N\", f32], y: Tensor[\"N\", f32], BLOCK: const = 4):\n    \
         i = program_id(0) * BLOCK\n    \
         store(y[i : i + BLOCK], load(x[i : i + BLOCK]) + 1.0)\n"
            .into(),
    );
    let args = [
        Value::Tensor(Tensor::zeros(&[10], DType::F32)),
        Value::Tensor(Tensor::zeros(&[10], DType::F32)),
        Value::Int(block),
    ];
    crate::exec::launch::prepared(&db, file, "add_one", &args)
}

/// Launches of two specialisations of one kernel, in turn: each compiles
/// once, relaunches (by the kernel's address, or by its PTX for another copy
/// of it) are memory hits, and the variant measured is the one that ran last.
#[test]
fn relaunches_are_memory_hits_and_the_last_variant_is_measured() {
    // Both variants lower on the CPU (what the GPU part relies on).
    let (four, eight) = (add_one(4), add_one(8));
    assert_ne!(four.0, eight.0);
    for k in [&four.0, &eight.0] {
        assert!(crate::ir::target::lower(k, Arch::Sm80).is_ok());
    }
    let Some((_one, _)) =
        gpu_or_skip("relaunches_are_memory_hits_and_the_last_variant_is_measured")
    else {
        return;
    };
    let gpu = Gpu::open(0).unwrap().with_cache_dir(None);
    let (k, args, grid) = four;
    let (other, other_args, other_grid) = eight;
    let run = |k: &Arc<Kernel>, args: &[Arg], grid| gpu.launch(k, args, grid, &Interrupt::new());
    run(&k, &args, grid).unwrap();
    run(&other, &other_args, other_grid).unwrap();
    assert!(gpu.measured(&other).is_some());
    assert_eq!(gpu.measured(&k), None, "`other` ran last");
    run(&k, &args, grid).unwrap();
    // Another kernel equal to `k`: found by its PTX.
    let copy = Arc::new((*k).clone());
    run(&copy, &args, grid).unwrap();
    assert_eq!(
        gpu.cache_stats(),
        CacheStats {
            memory_hits: 2,
            disk_hits: 0,
            compiles: 2
        }
    );
    assert!(gpu.measured(&k).is_some());
    assert_eq!(gpu.measured(&other), None);
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
        .map(|_| ())
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

const ACCUMULATE: &str =
    "@autotune(space={\"BLOCK\": [128, 1024], \"num_warps\": [2, 4]}, key=[\"N\"])\n\
@kernel(grid=(cdiv(N, BLOCK),))\n\
def acc(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32], BLOCK: const = 64):\n    \
i = program_id(0) * BLOCK\n    \
store(out[i : i + BLOCK], load(out[i : i + BLOCK]) + load(x[i : i + BLOCK]))\n";

#[test]
fn autotuning_times_every_configuration_and_keeps_the_outputs() {
    use crate::exec::{Device, Tensor, Value};
    let Some((_one, gpu)) =
        gpu_or_skip("autotuning_times_every_configuration_and_keeps_the_outputs")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let gpu = Arc::new(
        Arc::into_inner(gpu)
            .unwrap()
            .with_cache_dir(Some(dir.path().to_path_buf())),
    );
    let mut db = crate::db::Database::new();
    let file = db.set_source("/acc.tsr", ACCUMULATE.into());
    let n = 3000;
    let x = Tensor::arange(0, n, DType::F32);
    let out = Tensor::full(&[n as usize], DType::F32, 1.0);
    let args = [Value::Tensor(x.clone()), Value::Tensor(out.clone())];
    let launch = |g: &Arc<Gpu>| {
        crate::exec::launch_kernel(
            &db,
            file,
            "acc",
            None,
            &args,
            &[],
            &Device::Cuda(g.clone()),
            &Interrupt::new(),
        )
    };
    launch(&gpu).unwrap();
    // The trials ran `acc` 44 times; the output is as after one launch.
    let got = out.to_f64_vec();
    assert!(
        got.iter().enumerate().all(|(i, v)| *v == 1.0 + i as f64),
        "{:?}",
        &got[..4]
    );
    let tuned = gpu.tuned_of("acc");
    assert_eq!(tuned.len(), 1);
    let t = &tuned[0];
    assert_eq!(t.key, [("N".to_string(), 3000)]);
    assert_eq!(t.trials.len(), 4);
    assert!(t.trials.iter().all(|(_, r)| r.is_ok()), "{t:?}");
    assert!(!t.from_disk);
    // The configurations were compiled side by side before the trials
    // (with a ptxas) and each trial loaded its own cubin: none is left.
    assert!(gpu.ahead_lock().is_empty());
    assert_eq!(gpu.cache_stats().compiles, 4);
    // A second launch uses the choice without trials.
    let launches = gpu.launches();
    launch(&gpu).unwrap();
    assert_eq!(gpu.launches(), launches + 1);
    assert_eq!(out.to_f64_vec()[7], 1.0 + 2.0 * 7.0);
    // A fresh context (a later session) finds the choice on disk.
    let best = t.best_config().clone();
    drop(gpu);
    let again = Arc::new(
        Gpu::open(0)
            .unwrap()
            .with_cache_dir(Some(dir.path().to_path_buf())),
    );
    launch(&again).unwrap();
    assert_eq!(again.launches(), 1);
    let t = &again.tuned_of("acc")[0];
    assert!(t.from_disk);
    assert_eq!(t.best_config(), &best);
    assert_eq!(out.to_f64_vec()[7], 1.0 + 3.0 * 7.0);
}

/// Ctrl-C while a long kernel runs: the launch returns E0706 at once (the
/// kernel finishes on its own), and the GPU then runs the next launch right.
#[test]
fn an_interrupted_launch_returns_while_the_kernel_runs_on() {
    use crate::db::Database;
    use crate::exec::{Device, Tensor, Value};
    let Some((_one, gpu)) = gpu_or_skip("an_interrupted_launch_returns_while_the_kernel_runs_on")
    else {
        return;
    };
    let mut db = Database::new();
    // One dependent multiply-add per iteration: about a second at 4e8.
    let file = db.set_source(
        "/spin.tsr",
        "@kernel(grid=(1,))\ndef spin(out: Tensor[\"N\", f32], n: i32):\n    acc = zeros([32], f32)\n    for i in range(0, n):\n        acc = acc * 0.5 + 1.0\n    store(out[0 : 32], acc)\n"
            .into(),
    );
    let device = Device::Cuda(gpu.clone());
    let out = Tensor::zeros(&[32], DType::F32);
    // Compiled first (n = 1 has the run-time facts of an odd n: none), so
    // the interrupt lands while the kernel runs.
    let warm = [Value::Tensor(out.clone()), Value::Int(1)];
    crate::exec::launch_kernel(
        &db,
        file,
        "spin",
        None,
        &warm,
        &[],
        &device,
        &Interrupt::new(),
    )
    .unwrap();
    let args = [Value::Tensor(out.clone()), Value::Int(400_000_001)];
    let stop = Interrupt::new();
    let trigger = stop.clone();
    let started = std::time::Instant::now();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        trigger.trigger();
    });
    let e = crate::exec::launch_kernel(&db, file, "spin", None, &args, &[], &device, &stop)
        .unwrap_err();
    let returned = started.elapsed();
    t.join().unwrap();
    assert_eq!(e.code, "E0706", "{e:?}");
    // The first launch compiles: allow for it, but not for the kernel's run.
    let (db2, vfile) = vadd_db();
    let x = Tensor::arange(0, 1001, DType::F32);
    let o = Tensor::zeros(&[1001], DType::F32);
    let vargs = [
        Value::Tensor(x.clone()),
        Value::Tensor(x),
        Value::Tensor(o.clone()),
    ];
    launch_vadd(&db2, vfile, &device, &vargs).unwrap();
    let all = started.elapsed();
    assert!(o.to_f64_vec()[1000] == 2000.0);
    // The vadd queued behind the spinning kernel, so it ended after it:
    // the interrupted launch returned well before.
    assert!(
        returned + std::time::Duration::from_millis(300) < all,
        "returned after {returned:?}, the next launch ended after {all:?}"
    );
    assert_eq!(out.to_f64_vec()[0], 2.0, "the kernel ran to its end");
}

const WGMMA_GEMM: &str = "@kernel(grid=(cdiv(M, BM), cdiv(N, BN)), num_warps=8, num_stages=4)\n\
def gemm(A: Tensor[\"M\", \"K\", bf16], B: Tensor[\"K\", \"N\", bf16], C: Tensor[\"M\", \"N\", f32],\n         \
BM: const = 128, BN: const = 256, BK: const = 32):\n    \
m0 = program_id(0) * BM\n    \
n0 = program_id(1) * BN\n    \
acc = zeros([BM, BN], f32)\n    \
for k in range(0, K, BK):\n        \
acc = dot(load(A[m0 : m0 + BM, k : k + BK]), load(B[k : k + BK, n0 : n0 + BN]), acc)\n    \
store(C[m0 : m0 + BM, n0 : n0 + BN], acc)\n";

/// On sm_90a the GEMM's stages are copied by TMA, over tensor maps encoded
/// at each launch: ragged M and N (the boxes' out-of-bounds elements read
/// as zeros), K shorter than the stages ahead, and K = 0 (an empty `A`,
/// whose map reads 16 zeroed bytes) give exactly the sums (small integers).
#[test]
fn tma_copies_give_exact_sums_at_ragged_and_empty_shapes() {
    use crate::exec::{Device, Tensor, Value};
    let Some((_one, gpu)) = gpu_or_skip("tma_copies_give_exact_sums_at_ragged_and_empty_shapes")
    else {
        return;
    };
    if gpu.info.arch != Arch::Sm90a {
        eprintln!("tma_copies_give_exact_sums_at_ragged_and_empty_shapes: skipped, not sm_90a");
        return;
    }
    let mut db = crate::db::Database::new();
    let file = db.set_source("/tma.tsr", WGMMA_GEMM.into());
    for (m, k, n) in [(129, 48, 264), (300, 1024, 520), (129, 0, 264)] {
        let a: Vec<f64> = (0..m * k).map(|i| (i % 7) as f64 - 3.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i % 5) as f64 - 2.0).collect();
        let c = Tensor::full(&[m, n], DType::F32, f64::NAN);
        let args = [
            Value::Tensor(Tensor::from_f64(&[m, k], DType::BF16, &a)),
            Value::Tensor(Tensor::from_f64(&[k, n], DType::BF16, &b)),
            Value::Tensor(c.clone()),
        ];
        crate::exec::launch_kernel(
            &db,
            file,
            "gemm",
            None,
            &args,
            &[],
            &Device::Cuda(gpu.clone()),
            &Interrupt::new(),
        )
        .unwrap();
        let got = c.to_f64_vec();
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
                assert_eq!(got[i * n + j], want, "M={m} K={k} N={n} at ({i}, {j})");
            }
        }
    }
    // The launches ran the TMA pipeline: the kernel lowered for this GPU
    // takes tensor maps.
    let (_, item, _) = crate::db::file_kernels(&db, file)
        .into_iter()
        .next()
        .unwrap();
    let spec = crate::ir::tile::Specialization::new()
        .with_divisor("K", 16)
        .with_divisor("N", 8);
    let tk = crate::db::tile_ir(&db, item, db.options(), spec)
        .clone()
        .unwrap();
    let target = crate::ir::target::lower(&tk, Arch::Sm90a).unwrap();
    assert_eq!(target.tensor_maps.len(), 2);
}

/// The launch gate holds the stream: an event queued behind it does not
/// complete until the guard is dropped, then does; and launches through it
/// compute as before with a kernel time on the GPU.
#[test]
fn the_launch_gate_holds_the_stream_until_released() {
    let Some((_one, gpu)) = gpu_or_skip("the_launch_gate_holds_the_stream_until_released") else {
        return;
    };
    gpu.ctx.bind_to_thread().unwrap();
    let mut g = gate::Gate::new().expect("page-locked, mapped memory");
    let behind = gpu
        .ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .unwrap();
    let query = || {
        // SAFETY: `behind` is alive and was recorded on this context's stream.
        unsafe { cudarc::driver::result::event::query(behind.cu_event()) }
    };
    match g.hold(gpu.stream.cu_stream()) {
        Some(held) => {
            behind.record(&gpu.stream).unwrap();
            std::thread::sleep(Duration::from_millis(50));
            assert_eq!(
                query(),
                Err(DriverError(CUresult::CUDA_ERROR_NOT_READY)),
                "the stream ran past the gate"
            );
            drop(held);
            gpu.stream.synchronize().unwrap();
            assert_eq!(query(), Ok(()));
        }
        None => eprintln!("the driver refuses stream waits: launches are timed without a gate"),
    }
    // Launches (each held and released at the gate) compute and are timed.
    let ((k, args, grid), out) = vadd(1000);
    let before = gpu.kernel_time();
    for _ in 0..3 {
        gpu.launch(&k, &args, grid, &Interrupt::new()).unwrap();
    }
    assert!(gpu.kernel_time() > before);
    let want: Vec<f32> = (0..1000).map(|i| i as f32 + 0.5).collect();
    assert_eq!(out.to_f32_vec(), want);
}
