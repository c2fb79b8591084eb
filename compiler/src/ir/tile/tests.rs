//! Verifier and dump tests on hand-built kernels.

use super::*;

fn t(shape: &[u32], d: DType) -> Type {
    Type::Tile {
        shape: shape.to_vec(),
        dtype: d,
    }
}

fn s(d: DType) -> Type {
    Type::Scalar(d)
}

fn kernel(b: Builder, params: Vec<Param>) -> Kernel {
    let (body, types) = b.finish();
    Kernel {
        name: "k".into(),
        specialization: vec![("BM".into(), 16)],
        divisibility: vec![],
        divisibility_trusted: false,
        params,
        num_warps: 4,
        num_stages: 1,
        body,
        types,
    }
}

fn tensor(name: &str, dims: &[Dim], dtype: DType) -> Param {
    Param {
        name: name.into(),
        kind: ParamKind::Tensor {
            dims: dims.to_vec(),
            dtype,
        },
    }
}

fn c_i32(b: &mut Builder, i: i64) -> Value {
    b.push1(OpKind::Const(Constant::Int(i)), s(DType::I32))
}

/// A small GEMM: acc = sum over k of A[m0:+16, k:+16] @ B[k:+16, 0:+16].
fn gemm() -> Kernel {
    let mut b = Builder::new();
    let pid = b.push1(OpKind::ProgramId(0), s(DType::I32));
    let c16 = c_i32(&mut b, 16);
    let m0 = b.push1(
        OpKind::Binary {
            op: BinaryOp::Mul,
            a: pid,
            b: c16,
        },
        s(DType::I32),
    );
    let zero = b.push1(OpKind::Const(Constant::Float(0.0)), s(DType::F32));
    let acc0 = b.push1(
        OpKind::Splat {
            x: zero,
            shape: vec![16, 16],
        },
        t(&[16, 16], DType::F32),
    );
    let lo = c_i32(&mut b, 0);
    let hi = b.push1(OpKind::TensorDim { param: 0, axis: 1 }, s(DType::I32));
    let iv = b.value(s(DType::I32));
    let acc = b.value(t(&[16, 16], DType::F32));
    b.begin();
    let x = b.push1(
        OpKind::Load {
            tensor: 0,
            access: vec![
                Access::Range { start: m0, len: 16 },
                Access::Range { start: iv, len: 16 },
            ],
            mask: None,
            other: Constant::Float(0.0),
        },
        t(&[16, 16], DType::F16),
    );
    let y = b.push1(
        OpKind::Load {
            tensor: 1,
            access: vec![
                Access::Range { start: iv, len: 16 },
                Access::Range { start: lo, len: 16 },
            ],
            mask: None,
            other: Constant::Float(0.0),
        },
        t(&[16, 16], DType::F16),
    );
    let next = b.push1(
        OpKind::Dot {
            a: x,
            b: y,
            acc: Some(acc),
            precision: Precision::Ieee,
        },
        t(&[16, 16], DType::F32),
    );
    b.push(OpKind::Yield(vec![next]), vec![]);
    let body = b.end(vec![iv, acc]);
    let out = b.push(
        OpKind::For {
            lo,
            hi,
            step: c16,
            init: vec![acc0],
            body,
        },
        vec![t(&[16, 16], DType::F32)],
    )[0];
    b.push(
        OpKind::Store {
            tensor: 2,
            access: vec![
                Access::Range { start: m0, len: 16 },
                Access::Range { start: lo, len: 16 },
            ],
            value: out,
            mask: None,
        },
        vec![],
    );
    let m = Dim::Dynamic("M".into());
    let kd = Dim::Dynamic("K".into());
    let n = Dim::Static(16);
    kernel(
        b,
        vec![
            tensor("A", &[m.clone(), kd.clone()], DType::F16),
            tensor("B", &[kd, n.clone()], DType::F16),
            tensor("C", &[m, n], DType::F32),
        ],
    )
}

#[test]
fn valid_gemm_verifies_and_dumps() {
    let k = gemm();
    assert_eq!(verify(&k), Vec::<String>::new());
    let expected = "\
kernel @k(%A: tensor<M x K x f16>, %B: tensor<K x 16 x f16>, %C: tensor<M x 16 x f32>)
    specialization {BM = 16} num_warps = 4 num_stages = 1 {
  %0 = program_id 0 : i32
  %1 = const 16 : i32
  %2 = mul %0, %1 : i32
  %3 = const 0.0 : f32
  %4 = splat %3 : f32 -> tile<16x16xf32>
  %5 = const 0 : i32
  %6 = dim %A, 1 : i32
  %12 = for %7 = %5 to %6 step %1 : i32 iter_args(%8 = %4) -> (tile<16x16xf32>) {
    %9 = load %A[%2 : +16, %7 : +16] other 0.0 : tile<16x16xf16>
    %10 = load %B[%7 : +16, %5 : +16] other 0.0 : tile<16x16xf16>
    %11 = dot %9, %10, %8 precision ieee : tile<16x16xf16>, tile<16x16xf16> -> tile<16x16xf32>
    yield %11 : tile<16x16xf32>
  }
  store %C[%2 : +16, %5 : +16], %12 : tile<16x16xf32>
}
";
    assert_eq!(k.dump(), expected);
}

/// Runs `f` on the valid kernel and expects an error containing `needle`.
fn expect_error(f: impl FnOnce(&mut Kernel), needle: &str) {
    let mut k = gemm();
    f(&mut k);
    let errs = verify(&k);
    assert!(
        errs.iter().any(|e| e.contains(needle)),
        "expected an error containing {needle:?}, got {errs:#?}\n{}",
        k.dump()
    );
}

fn for_body(k: &mut Kernel) -> &mut Region {
    for op in &mut k.body.ops {
        if let OpKind::For { body, .. } = &mut op.kind {
            return body;
        }
    }
    panic!("no for")
}

#[test]
fn use_before_definition() {
    expect_error(
        |k| {
            // `mul %0, %1` moved before `const 16`.
            k.body.ops.swap(1, 2);
        },
        "%1 is used by `binary` defining %2 before it is defined",
    );
}

#[test]
fn defined_twice() {
    expect_error(
        |k| {
            k.body.ops[3].results = vec![Value(1)];
        },
        "%1 is defined more than once",
    );
}

#[test]
fn value_escaping_its_region() {
    expect_error(
        |k| {
            // Store the loop's loaded tile %9 after the loop.
            let last = k.body.ops.len() - 1;
            if let OpKind::Store { value, .. } = &mut k.body.ops[last].kind {
                *value = Value(11);
            }
        },
        "%11 is used by `store` where its definition does not dominate",
    );
}

#[test]
fn binary_operand_types_differ() {
    expect_error(
        |k| {
            push(
                k,
                OpKind::Binary {
                    op: BinaryOp::Mul,
                    a: Value(0),
                    b: Value(3),
                },
                Some(s(DType::I32)),
            );
        },
        "operand types differ: i32 and f32",
    );
}

#[test]
fn load_result_shape_is_the_range_lens() {
    expect_error(
        |k| {
            k.types[9] = t(&[16, 32], DType::F16);
        },
        "result %9 has type tile<16x32xf16>, expected tile<16x16xf16>",
    );
}

#[test]
fn load_rank_mismatch() {
    expect_error(
        |k| {
            if let OpKind::Load { access, .. } = &mut for_body(k).ops[0].kind {
                access.push(Access::Point(Value(5)));
            }
        },
        "3 indices for a tensor of rank 2",
    );
}

#[test]
fn dot_inner_dims() {
    expect_error(
        |k| {
            k.types[10] = t(&[32, 16], DType::F16);
            if let OpKind::Load { access, .. } = &mut for_body(k).ops[1].kind {
                access[0] = Access::Range {
                    start: Value(7),
                    len: 32,
                };
            }
        },
        "inner dims differ",
    );
}

#[test]
fn dot_result_is_f32() {
    expect_error(
        |k| {
            k.types[11] = t(&[16, 16], DType::F16);
        },
        "result %11 has type tile<16x16xf16>, expected tile<16x16xf32>",
    );
}

#[test]
fn for_yield_must_match_the_carried_types() {
    expect_error(
        |k| {
            let body = for_body(k);
            let last = body.ops.len() - 1;
            body.ops[last].kind = OpKind::Yield(vec![Value(9)]);
        },
        "yields (tile<16x16xf16>), expected (tile<16x16xf32>)",
    );
}

#[test]
fn region_must_end_with_yield() {
    expect_error(
        |k| {
            for_body(k).ops.pop();
        },
        "does not end with `yield`",
    );
}

#[test]
fn yield_in_kernel_body() {
    expect_error(
        |k| {
            k.body.ops.push(Op {
                results: vec![],
                kind: OpKind::Yield(vec![]),
                span: Span::default(),
            });
        },
        "`yield` in the kernel body",
    );
}

#[test]
fn for_region_args() {
    expect_error(
        |k| {
            for_body(k).args.pop();
        },
        "has 1 arguments, expected 2",
    );
}

fn push(k: &mut Kernel, kind: OpKind, ty: Option<Type>) -> Option<Value> {
    let r = ty.map(|ty| {
        k.types.push(ty);
        Value(k.types.len() as u32 - 1)
    });
    let last = k.body.ops.len() - 1;
    k.body.ops.insert(
        last,
        Op {
            results: r.into_iter().collect(),
            kind,
            span: Span::default(),
        },
    );
    r
}

#[test]
fn reduce_axis_in_range() {
    expect_error(
        |k| {
            push(
                k,
                OpKind::Reduce {
                    op: ReduceOp::Sum,
                    x: Value(12),
                    axis: 2,
                    keepdims: false,
                },
                Some(t(&[16], DType::F32)),
            );
        },
        "axis 2 out of range for tile<16x16xf32>",
    );
}

#[test]
fn reduce_result_shape() {
    let mut k = gemm();
    push(
        &mut k,
        OpKind::Reduce {
            op: ReduceOp::Max,
            x: Value(12),
            axis: 1,
            keepdims: true,
        },
        Some(t(&[16, 1], DType::F32)),
    );
    assert_eq!(verify(&k), Vec::<String>::new());
    expect_error(
        |k| {
            push(
                k,
                OpKind::Reduce {
                    op: ReduceOp::Max,
                    x: Value(12),
                    axis: 1,
                    keepdims: false,
                },
                Some(t(&[16, 1], DType::F32)),
            );
        },
        "expected tile<16xf32>",
    );
}

#[test]
fn broadcast_only_from_size_one() {
    let mut k = gemm();
    let col = push(
        &mut k,
        OpKind::Reduce {
            op: ReduceOp::Max,
            x: Value(12),
            axis: 1,
            keepdims: true,
        },
        Some(t(&[16, 1], DType::F32)),
    )
    .unwrap();
    push(
        &mut k,
        OpKind::Broadcast {
            x: col,
            shape: vec![16, 64],
        },
        Some(t(&[16, 64], DType::F32)),
    );
    assert_eq!(verify(&k), Vec::<String>::new());
    expect_error(
        |k| {
            push(
                k,
                OpKind::Broadcast {
                    x: Value(12),
                    shape: vec![16, 64],
                },
                Some(t(&[16, 64], DType::F32)),
            );
        },
        "axis 1 of tile<16x16xf32> has size 16, broadcast only from size 1",
    );
}

#[test]
fn select_and_store_types() {
    expect_error(
        |k| {
            push(
                k,
                OpKind::Select {
                    cond: Value(12),
                    a: Value(12),
                    b: Value(12),
                },
                Some(t(&[16, 16], DType::F32)),
            );
        },
        "condition is tile<16x16xf32>, expected tile<16x16xbool>",
    );
    expect_error(
        |k| {
            let last = k.body.ops.len() - 1;
            if let OpKind::Store { value, .. } = &mut k.body.ops[last].kind {
                *value = Value(4);
            }
            if let OpKind::Store { access, .. } = &mut k.body.ops[last].kind {
                access[1] = Access::Range {
                    start: Value(5),
                    len: 32,
                };
            }
        },
        "stored value is tile<16x16xf32>, expected tile<16x32xf32>",
    );
}

#[test]
fn if_branches_and_while() {
    // if %c { yield %4 } else { yield %4 } -> tile; then a while counting up.
    let mut b = Builder::new();
    let zero = c_i32(&mut b, 0);
    let one = c_i32(&mut b, 1);
    let c = b.push1(
        OpKind::Binary {
            op: BinaryOp::Lt,
            a: zero,
            b: one,
        },
        s(DType::Bool),
    );
    b.begin();
    b.push(OpKind::Yield(vec![one]), vec![]);
    let then = b.end(vec![]);
    b.begin();
    b.push(OpKind::Yield(vec![zero]), vec![]);
    let otherwise = b.end(vec![]);
    let r = b.push1(
        OpKind::If {
            cond: c,
            then,
            otherwise,
        },
        s(DType::I32),
    );
    let ca = b.value(s(DType::I32));
    b.begin();
    let lt = b.push1(
        OpKind::Binary {
            op: BinaryOp::Lt,
            a: ca,
            b: one,
        },
        s(DType::Bool),
    );
    b.push(OpKind::Yield(vec![lt]), vec![]);
    let cond = b.end(vec![ca]);
    let ba = b.value(s(DType::I32));
    b.begin();
    let nx = b.push1(
        OpKind::Binary {
            op: BinaryOp::Add,
            a: ba,
            b: one,
        },
        s(DType::I32),
    );
    b.push(OpKind::Yield(vec![nx]), vec![]);
    let body = b.end(vec![ba]);
    b.push(
        OpKind::While {
            init: vec![r],
            cond,
            body,
        },
        vec![s(DType::I32)],
    );
    let k = kernel(b, vec![]);
    assert_eq!(verify(&k), Vec::<String>::new(), "{}", k.dump());
    assert!(k
        .dump()
        .contains("if %2 -> (i32) {\n    yield %1 : i32\n  } else {"));
    assert!(k.dump().contains("while (%4 = %3) -> (i32) {"));

    // A branch yielding a different type.
    let mut bad = k.clone();
    bad.types[0] = s(DType::I64);
    bad.body.ops[1].kind = OpKind::Const(Constant::Int(1));
    let errs = verify(&bad);
    assert!(
        errs.iter()
            .any(|e| e.contains("the else-region of `if` defining %3 yields (i64), expected (i32)")),
        "{errs:#?}"
    );
    // A while condition yielding an int.
    let mut bad = k.clone();
    if let OpKind::While { cond, .. } = &mut bad.body.ops[4].kind {
        cond.ops[1].kind = OpKind::Yield(vec![Value(4)]);
    }
    let errs = verify(&bad);
    assert!(
        errs.iter()
            .any(|e| e.contains("yields (i32), expected (bool)")),
        "{errs:#?}"
    );
}
