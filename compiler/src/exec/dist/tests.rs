//! Tests of the distributed tensors: sharding, gathering and the host collectives.

use super::*;

fn t(shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n).map(|i| i as f64).collect();
    Tensor::from_f64(shape, dtype, &data)
}

#[test]
fn split_sizes_are_numpy_array_split() {
    assert_eq!(split_sizes(10, 4).unwrap(), vec![3, 3, 2, 2]);
    assert_eq!(split_sizes(8, 4).unwrap(), vec![2, 2, 2, 2]);
    assert_eq!(split_sizes(3, 3).unwrap(), vec![1, 1, 1]);
    let e = split_sizes(2, 3).unwrap_err();
    assert_eq!(e.code, "E0737");
    assert!(
        e.message
            .contains("2 elements cannot be split over 3 devices"),
        "{e}"
    );
}

#[test]
fn shard_then_gather_is_the_tensor_on_every_axis() {
    let i = Interrupt::new();
    for dtype in [DType::F32, DType::BF16, DType::I64] {
        let x = t(&[5, 3, 4], dtype);
        for axis in 0..3 {
            let d = shard(&x, axis, &[0, 1, 2], &i).unwrap();
            assert_eq!(
                d.shard_sizes().unwrap().iter().sum::<usize>(),
                x.shape()[axis]
            );
            assert_eq!(
                d.gather(&i).unwrap().to_f64_vec(),
                x.to_f64_vec(),
                "{dtype} axis {axis}"
            );
        }
    }
}

#[test]
fn collectives_act_on_the_parts_as_nccl_does() {
    let i = Interrupt::new();
    let x = t(&[4, 2], DType::F32); // rows [0,1] [2,3] [4,5] [6,7]
    let d = shard(&x, 0, &[0, 1], &i).unwrap();
    let r = all_reduce(&d, ReduceOp::Sum, Site::Host, &i).unwrap();
    assert_eq!(r.placement(), Placement::Sharded { axis: 0 });
    // each shard is rows 0-1 plus rows 2-3
    assert_eq!(
        r.gather(&i).unwrap().to_f64_vec(),
        vec![4., 6., 8., 10., 4., 6., 8., 10.]
    );
    let m = all_reduce(&d, ReduceOp::Max, Site::Host, &i).unwrap();
    assert_eq!(m.parts()[1].tensor.to_f64_vec(), vec![4., 5., 6., 7.]);
    let mean = all_reduce(&d, ReduceOp::Mean, Site::Host, &i).unwrap();
    assert_eq!(mean.parts()[0].tensor.to_f64_vec(), vec![2., 3., 4., 5.]);

    let g = all_gather(&d, Site::Host, &i).unwrap();
    assert_eq!(g.placement(), Placement::Replicated);
    for p in g.parts() {
        assert_eq!(p.tensor.to_f64_vec(), x.to_f64_vec());
    }
    assert_eq!(all_gather(&g, Site::Host, &i).unwrap_err().code, "E0737");

    let rs = reduce_scatter(&g, ReduceOp::Sum, 1, Site::Host, &i).unwrap();
    assert_eq!(rs.placement(), Placement::Sharded { axis: 1 });
    assert_eq!(rs.parts()[0].tensor.to_f64_vec(), vec![0., 4., 8., 12.]);
    assert_eq!(rs.parts()[1].tensor.to_f64_vec(), vec![2., 6., 10., 14.]);
    assert_eq!(
        reduce_scatter(&d, ReduceOp::Sum, 0, Site::Host, &i)
            .unwrap_err()
            .code,
        "E0737"
    );

    let b = broadcast(&d, 1, Site::Host, &i).unwrap();
    assert_eq!(b.parts()[0].tensor.to_f64_vec(), vec![4., 5., 6., 7.]);
    assert_eq!(broadcast(&d, 2, Site::Host, &i).unwrap_err().code, "E0737");
}

#[test]
fn uneven_shards_are_refused_by_elementwise_collectives() {
    let i = Interrupt::new();
    let d = shard(&t(&[5, 2], DType::F32), 0, &[0, 1], &i).unwrap();
    let e = all_reduce(&d, ReduceOp::Sum, Site::Host, &i).unwrap_err();
    assert_eq!(e.code, "E0737");
    assert!(e.message.contains("(3, 2)"), "{e}");
}

#[test]
fn partial_values_gather_to_their_combination() {
    let i = Interrupt::new();
    let parts = vec![
        Part {
            device: 0,
            tensor: Tensor::from_f64(&[2], DType::I32, &[1., -5.]),
        },
        Part {
            device: 1,
            tensor: Tensor::from_f64(&[2], DType::I32, &[2., 3.]),
        },
    ];
    let d = DistTensor::from_parts(
        vec![2],
        DType::I32,
        Placement::Partial(ReduceOp::Sum),
        parts,
    );
    assert_eq!(d.gather(&i).unwrap().to_f64_vec(), vec![3., -2.]);
    let r = all_reduce(&d, ReduceOp::Mean, Site::Host, &i).unwrap();
    // integer mean truncates toward zero
    assert_eq!(r.parts()[0].tensor.to_f64_vec(), vec![1., -1.]);
}

/// The inlined Graph IR of function `f` in `src`.
fn graph(src: &str) -> std::sync::Arc<crate::ir::graph::Graph> {
    use crate::db::{self, Database};
    let mut db = Database::new();
    let file = db.set_source("/t/dist.tsr", src.to_string());
    let (item, _) = db::function_item(&db, file, "f").expect("a function `f`");
    db::graph_ir(&db, item, db.options())
        .clone()
        .expect("lowers")
}

const ROWS: Placement = Placement::Sharded { axis: 0 };
const REP: Placement = Placement::Replicated;

#[test]
fn placements_follow_the_ops() {
    use infer::infer;
    // Rows of x with a whole w: rows of the result; the bias broadcasts.
    let g = graph("def f(x: Tensor[8, 4, f32], w: Tensor[4, 3, f32], b: Tensor[3, f32]) -> Tensor[8, 3, f32]:\n    return relu(matmul(x, w) + b)\n");
    let r = infer(&g, &[ROWS, REP, REP]).unwrap();
    assert_eq!(r.outputs, vec![ROWS]);
    assert_eq!(r.params, vec![ROWS, REP, REP]);
    // A whole operand with the sharded axis is demanded sharded.
    let g = graph("def f(x: Tensor[8, 4, f32], y: Tensor[8, 4, f32]) -> Tensor[8, 4, f32]:\n    return x * y\n");
    let r = infer(&g, &[ROWS, REP]).unwrap();
    assert_eq!(r.params, vec![ROWS, ROWS]);
    // The contraction axis of both: a partial sum, made whole by all_reduce.
    let g = graph("def f(a: Tensor[4, 8, f32], b: Tensor[8, 3, f32]) -> Tensor[4, 3, f32]:\n    return matmul(a, b)\n");
    let r = infer(&g, &[Placement::Sharded { axis: 1 }, REP]).unwrap();
    assert_eq!(r.params[1], ROWS, "b is split along its contraction axis");
    assert_eq!(r.outputs, vec![Placement::Partial(ReduceOp::Sum)]);
    let g = graph("def f(a: Tensor[4, 8, f32], b: Tensor[8, 3, f32]) -> Tensor[4, 3, f32]:\n    return all_reduce(matmul(a, b)) * 2.0\n");
    assert_eq!(
        infer(&g, &[Placement::Sharded { axis: 1 }, ROWS])
            .unwrap()
            .outputs,
        vec![REP]
    );
    // Reductions: along another axis stay sharded, along the sharded one partial.
    let g = graph("def f(x: Tensor[8, 4, f32]) -> Tensor[8, f32]:\n    return sum(x, axis=1)\n");
    assert_eq!(infer(&g, &[ROWS]).unwrap().outputs, vec![ROWS]);
    let g = graph("def f(x: Tensor[8, 4, f32]) -> Tensor[4, f32]:\n    return max(x, axis=0)\n");
    assert_eq!(
        infer(&g, &[ROWS]).unwrap().outputs,
        vec![Placement::Partial(ReduceOp::Max)]
    );
    // Transpose moves the axis.
    let g =
        graph("def f(x: Tensor[8, 4, f32]) -> Tensor[4, 8, f32]:\n    return transpose(x, 0, 1)\n");
    assert_eq!(
        infer(&g, &[ROWS]).unwrap().outputs,
        vec![Placement::Sharded { axis: 1 }]
    );
}

#[test]
fn ops_that_need_another_devices_part_are_refused() {
    use infer::infer;
    let refused = |src: &str, params: &[Placement], says: &str| {
        let e = infer(&graph(src), params).unwrap_err();
        assert!(e.message.contains(says), "{src}: {}", e.message);
        assert!(!e.help.is_empty());
    };
    refused(
        "def f(x: Tensor[8, 4, f32]) -> Tensor[8, 4, f32]:\n    return softmax(x, dim=0)\n",
        &[ROWS],
        "softmax along axis 0",
    );
    refused(
        "def f(x: Tensor[8, 4, f32]) -> Tensor[8, 4, f32]:\n    return layer_norm(x)\n",
        &[Placement::Sharded { axis: 1 }],
        "layer_norm normalises",
    );
    refused(
        "def f(x: Tensor[8, 4, f32]) -> Tensor[4, f32]:\n    return mean(x, dim=0)\n",
        &[ROWS],
        "mean along axis 0",
    );
    refused(
        "def f(x: Tensor[8, 4, f32]) -> Tensor[4, f32]:\n    return sum(x, axis=0) + 1.0\n",
        &[ROWS],
        "partial value",
    );
    refused("def f(x: Tensor[8, 8, f32], y: Tensor[8, 8, f32]) -> Tensor[8, 8, f32]:\n    return x + y\n", &[ROWS, Placement::Sharded { axis: 1 }], "different axes");
    refused(
        "def f(x: Tensor[8, 4, f32]) -> Tensor[32, f32]:\n    return reshape(x, [32])\n",
        &[ROWS],
        "reshape",
    );
    refused(
        "def f(x: Tensor[8, 4, f32]) -> Tensor[4, 4, f32]:\n    return x[0:4, :]\n",
        &[ROWS],
        "slices axis 0",
    );
}

#[test]
fn a_group_meets_at_every_collective_and_an_abort_frees_the_others() {
    use crate::ir::graph::{Collective, ReduceKind};
    let group = Group::new(3);
    let members = group.members();
    let i = Interrupt::new();
    // Three rounds, each member giving rank + round: every member gets the sum.
    let sums: Vec<Vec<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = members
            .iter()
            .map(|m| {
                let i = &i;
                s.spawn(move || {
                    (0..3)
                        .map(|round| {
                            let part =
                                Tensor::from_f64(&[1], DType::F32, &[(m.rank + round) as f64]);
                            let r = m.group.collective(
                                m.rank,
                                Collective::AllReduce(ReduceKind::Sum),
                                &part,
                                &crate::exec::Device::Cpu,
                                i,
                            );
                            r.unwrap().to_f64_vec()[0]
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for s in &sums {
        assert_eq!(s, &vec![3.0, 6.0, 9.0]);
    }
    // One member fails before the collective: the others get an error, not a hang.
    let group = Group::new(2);
    let m = group.members();
    let waiting = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let part = Tensor::from_f64(&[1], DType::F32, &[1.0]);
            m[0].group.collective(
                0,
                Collective::Broadcast { src: 0 },
                &part,
                &crate::exec::Device::Cpu,
                &i,
            )
        });
        std::thread::sleep(std::time::Duration::from_millis(20));
        group.abort(&ExecError::new("E0705", "index out of bounds"));
        h.join().unwrap()
    });
    let e = waiting.unwrap_err();
    assert!(e.message.contains("another device stopped"), "{e}");
}

#[test]
fn localize_names_the_sharded_axes_and_keeps_every_other_size() {
    use crate::ir::graph::{Collective, NodeKind};
    let g = graph("def f(x: Tensor[12, 8, f32], w: Tensor[8, 5, f32]) -> Tensor[12, 5, f32]:\n    xs = shard(x, axis=0)\n    y = matmul(xs, w) * xs.shape[0]\n    return all_gather(y)\n");
    let inferred = infer::infer(&g, &[REP, REP]).unwrap();
    let (local, symbols) = infer::localize(&g, &inferred).unwrap();
    assert_eq!(symbols, vec![("__shard0".to_string(), 12)]);
    crate::ir::graph::verify(&local).unwrap();
    let dump = crate::ir::graph::dump(&local);
    assert!(
        dump.contains("shard %0, axis=0 : Tensor[__shard0, 8, f32]"),
        "{dump}"
    );
    assert!(
        dump.contains("const 12 : i32"),
        "x.shape[0] stays the whole length:\n{dump}"
    );
    assert!(dump.contains("all_gather %"), "{dump}");
    // The gather knows its axis, and gives the whole tensor back.
    let gather = local
        .nodes
        .iter()
        .find_map(|n| match &n.kind {
            NodeKind::Collective {
                op: Collective::AllGather { axis },
                ..
            } => Some((*axis, n.ty.dims().to_vec())),
            _ => None,
        })
        .unwrap();
    assert_eq!(gather.0, Some(0));
    assert_eq!(gather.1[0].as_const(), Some(12));
}
