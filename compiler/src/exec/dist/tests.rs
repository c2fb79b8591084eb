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
    let r = all_reduce(&d, ReduceOp::Sum, &i).unwrap();
    assert_eq!(r.placement(), Placement::Sharded { axis: 0 });
    // each shard is rows 0-1 plus rows 2-3
    assert_eq!(
        r.gather(&i).unwrap().to_f64_vec(),
        vec![4., 6., 8., 10., 4., 6., 8., 10.]
    );
    let m = all_reduce(&d, ReduceOp::Max, &i).unwrap();
    assert_eq!(m.parts()[1].tensor.to_f64_vec(), vec![4., 5., 6., 7.]);
    let mean = all_reduce(&d, ReduceOp::Mean, &i).unwrap();
    assert_eq!(mean.parts()[0].tensor.to_f64_vec(), vec![2., 3., 4., 5.]);

    let g = all_gather(&d, &i).unwrap();
    assert_eq!(g.placement(), Placement::Replicated);
    for p in g.parts() {
        assert_eq!(p.tensor.to_f64_vec(), x.to_f64_vec());
    }
    assert_eq!(all_gather(&g, &i).unwrap_err().code, "E0737");

    let rs = reduce_scatter(&g, ReduceOp::Sum, 1, &i).unwrap();
    assert_eq!(rs.placement(), Placement::Sharded { axis: 1 });
    assert_eq!(rs.parts()[0].tensor.to_f64_vec(), vec![0., 4., 8., 12.]);
    assert_eq!(rs.parts()[1].tensor.to_f64_vec(), vec![2., 6., 10., 14.]);
    assert_eq!(
        reduce_scatter(&d, ReduceOp::Sum, 0, &i).unwrap_err().code,
        "E0737"
    );

    let b = broadcast(&d, 1, &i).unwrap();
    assert_eq!(b.parts()[0].tensor.to_f64_vec(), vec![4., 5., 6., 7.]);
    assert_eq!(broadcast(&d, 2, &i).unwrap_err().code, "E0737");
}

#[test]
fn uneven_shards_are_refused_by_elementwise_collectives() {
    let i = Interrupt::new();
    let d = shard(&t(&[5, 2], DType::F32), 0, &[0, 1], &i).unwrap();
    let e = all_reduce(&d, ReduceOp::Sum, &i).unwrap_err();
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
    let r = all_reduce(&d, ReduceOp::Mean, &i).unwrap();
    // integer mean truncates toward zero
    assert_eq!(r.parts()[0].tensor.to_f64_vec(), vec![1., -1.]);
}
