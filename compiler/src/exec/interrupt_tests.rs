//! Every long host operation stops at the run interrupt (E0706): creation,
//! conversion, copies, indexing, `.npy` files and whole-tensor functions.
//! Work-bounded, not timed: each operation is given a triggered interrupt and
//! must return E0706 where, without polling, it would run to completion.

use super::*;
use crate::check::DType;
use crate::db::Database;

fn stopped() -> Interrupt {
    let i = Interrupt::new();
    i.trigger();
    i
}

#[track_caller]
fn interrupted<T: std::fmt::Debug>(r: Result<T, ExecError>) {
    match r {
        Err(e) => assert_eq!(e.code, "E0706", "{e}"),
        Ok(v) => panic!("ran to completion despite the interrupt: {v:?}"),
    }
}

#[test]
fn host_loops_poll_every_chunk() {
    let stop = Interrupt::new();
    let mut seen = 0;
    let r = stop.chunks(10 * POLL_EVERY + 1, |r| {
        assert!(r.len() <= POLL_EVERY);
        seen += 1;
        if seen == 3 {
            stop.trigger();
        }
    });
    interrupted(r);
    assert_eq!(seen, 3, "the chunk after the trigger must not run");
    let mut covered = 0;
    Interrupt::new()
        .chunks(2 * POLL_EVERY + 5, |r| covered += r.len())
        .unwrap();
    assert_eq!(covered, 2 * POLL_EVERY + 5);
}

/// 16M elements: seconds of host work in a debug build without polling.
const BIG: usize = 1 << 24;

#[test]
fn creation_stops_when_interrupted() {
    let stop = &stopped();
    for dtype in [DType::F8E4M3, DType::F32, DType::I64] {
        interrupted(Tensor::try_zeros(&[BIG], dtype, stop));
        interrupted(Tensor::try_full(&[BIG], dtype, 1.0, stop));
        interrupted(Tensor::try_arange(0, BIG as i64, dtype, stop));
        interrupted(Tensor::try_from_f64(&[4, 4], dtype, &[1.0; 16], stop));
    }
    interrupted(rng::try_randn(&[BIG], DType::F32, 0, stop));
    // The same calls run when not interrupted.
    let go = &Interrupt::new();
    assert_eq!(
        Tensor::try_arange(0, 5, DType::F8E4M3, go).unwrap().numel(),
        5
    );
    assert_eq!(
        Tensor::try_from_f64(&[4, 4], DType::I64, &[1.0; 16], go)
            .unwrap()
            .numel(),
        16
    );
}

#[test]
fn conversions_copies_and_indexing_stop_when_interrupted() {
    let go = &Interrupt::new();
    let stop = &stopped();
    let t = Tensor::try_arange(0, 1 << 20, DType::F32, go).unwrap();
    interrupted(t.try_to(DType::F8E4M3, stop));
    interrupted(t.try_to(DType::F32, stop));
    interrupted(t.try_deep_clone(stop));
    interrupted(t.index(&[IndexItem::full()], stop));
    let mut w = t.view(&[1 << 10, 1 << 10]).unwrap();
    interrupted(w.set_index(&[IndexItem::full()], &Value::Float(2.0), stop));
    let u = Tensor::try_zeros(&[1 << 20], DType::F32, go).unwrap();
    interrupted(u.assign(&t, stop));
    // Not interrupted, they finish (the assertions above are not vacuous).
    assert_eq!(t.try_to(DType::F16, go).unwrap().numel(), 1 << 20);
    u.assign(&t, go).unwrap();
    assert_eq!(
        u.index(&[IndexItem::Int(7)], go).unwrap().to_f64_vec(),
        vec![7.0]
    );
}

#[test]
fn npy_files_stop_when_interrupted() {
    let go = &Interrupt::new();
    let dir = std::env::temp_dir().join(format!("tessera-interrupt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("t.npy");
    let t = Tensor::try_arange(0, 1 << 20, DType::F32, go).unwrap();
    interrupted(npy::save_npy(&t, &p, &stopped()));
    npy::save_npy(&t, &p, go).unwrap();
    interrupted(npy::load_npy(&p, &stopped()));
    assert_eq!(npy::load_npy(&p, go).unwrap().numel(), 1 << 20);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn whole_tensor_operations_stop_when_interrupted() {
    let mut db = Database::new();
    let file = db.set_source(
        "/interrupt.tsr",
        "def ew(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return x % 92.0\n\
         def red(x: Tensor[\"M\", \"N\", f32]) -> Tensor[\"M\", f32]:\n    return sum(x, axis=1)\n\
         def mm(a: Tensor[\"M\", \"K\", f32], b: Tensor[\"K\", \"N\", f32]) -> Tensor[\"M\", \"N\", f32]:\n    return matmul(a, b)\n\
         def tr(x: Tensor[\"M\", \"N\", f32]) -> Tensor[\"N\", \"M\", f32]:\n    return x.T\n\
         def rs(x: Tensor[\"M\", \"N\", f32]) -> Tensor[\"N\", \"M\", f32]:\n    return reshape(x, [N, M])\n"
            .into(),
    );
    let go = &Interrupt::new();
    let v = |s: &[usize]| Value::Tensor(Tensor::try_full(s, DType::F32, 1.0, go).unwrap());
    let calls: Vec<(&str, Vec<Value>)> = vec![
        ("ew", vec![v(&[1 << 16])]),
        ("red", vec![v(&[64, 1024])]),
        ("mm", vec![v(&[64, 64]), v(&[64, 64])]),
        ("tr", vec![v(&[64, 1024])]),
        ("rs", vec![v(&[64, 1024])]),
    ];
    for (f, args) in &calls {
        interrupted(run_function(
            &db,
            file,
            f,
            args,
            &[],
            &crate::exec::Device::Cpu,
            &stopped(),
        ));
        assert!(
            run_function(&db, file, f, args, &[], &crate::exec::Device::Cpu, go).is_ok(),
            "{f}"
        );
    }
}
