//! Snapshot and behaviour tests of Graph IR and Schedule IR (whole-tensor functions).

use crate::db::{self, Database};
use crate::diag::Diagnostic;
use crate::ir::graph::{self, NodeKind};
use crate::ir::schedule::{self, KernelRef};
use crate::syntax::ast;

/// Why `emit_graph`/`emit_schedule` produced nothing. These dumps by function
/// name exist for these tests; `tsrc --emit` goes through `cli::emit_with`.
#[derive(Clone, Debug, PartialEq)]
enum EmitError {
    /// The file has errors (absolute spans).
    Diagnostics(Vec<Diagnostic>),
    /// No function of that name in the file.
    NoFunction(String),
    /// A kernel was named: kernels have Tile IR, not Graph/Schedule IR.
    IsKernel(String),
    /// A construct the lowering does not handle yet (absolute span).
    Unsupported(crate::ir::graph::LowerError),
}

impl std::fmt::Display for EmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmitError::Diagnostics(d) => write!(f, "the file has {} error(s)", d.len()),
            EmitError::NoFunction(n) => write!(f, "no function `{n}` in this file"),
            EmitError::IsKernel(n) => write!(
                f,
                "`{n}` is a kernel: Graph and Schedule IR exist for whole-tensor functions (use --emit tile-ir)"
            ),
            EmitError::Unsupported(e) => e.fmt(f),
        }
    }
}

fn emit_ir(
    db: &Database,
    file: db::SourceFile,
    name: &str,
    render: &dyn Fn(&Database, db::ItemSource<'_>) -> Result<String, crate::ir::graph::LowerError>,
) -> Result<String, EmitError> {
    let errors: Vec<Diagnostic> = db
        .diagnostics(file)
        .iter()
        .filter(|d| d.is_error())
        .cloned()
        .collect();
    if !errors.is_empty() {
        return Err(EmitError::Diagnostics(errors));
    }
    let (item, offset) =
        db::function_item(db, file, name).ok_or_else(|| EmitError::NoFunction(name.to_string()))?;
    if let Some(ast::Item::Function(f)) = db::parse_item(db, item).item.as_deref() {
        if f.is_kernel() {
            return Err(EmitError::IsKernel(name.to_string()));
        }
    }
    render(db, item).map_err(|e| EmitError::Unsupported(e.shifted(offset)))
}

/// The Graph IR dump of the whole-tensor function `name` of `file`.
fn emit_graph(db: &Database, file: db::SourceFile, name: &str) -> Result<String, EmitError> {
    emit_ir(db, file, name, &|db, item| {
        db::graph_ir(db, item, db.options())
            .as_ref()
            .map(|g| crate::ir::graph::dump(g))
            .map_err(Clone::clone)
    })
}

/// The Schedule IR dump (with its generated kernels) of the function `name` of `file`.
fn emit_schedule(db: &Database, file: db::SourceFile, name: &str) -> Result<String, EmitError> {
    emit_ir(db, file, name, &|db, item| {
        db::schedule_ir(db, item, db.options())
            .as_ref()
            .map(|s| crate::ir::schedule::dump(s))
            .map_err(Clone::clone)
    })
}

fn db_with(src: &str) -> (Database, db::SourceFile) {
    let mut db = Database::new();
    let file = db.set_source("/t/test.tsr", src.to_string());
    (db, file)
}

fn both(src: &str, name: &str) -> String {
    let (db, file) = db_with(src);
    let g = emit_graph(&db, file, name).unwrap_or_else(|e| panic!("{e}: {e:?}"));
    let s = emit_schedule(&db, file, name).unwrap_or_else(|e| panic!("{e}: {e:?}"));
    format!("{g}\n{s}")
}

fn std_both(module: &str, name: &str) -> String {
    let src = crate::stdlib::source(module).expect("a stdlib module");
    let mut db = Database::new();
    let file = db.set_source(format!("<{module}>"), src.to_string());
    let g = emit_graph(&db, file, name).unwrap_or_else(|e| panic!("{e}: {e:?}"));
    let s = emit_schedule(&db, file, name).unwrap_or_else(|e| panic!("{e}: {e:?}"));
    format!("{g}\n{s}")
}

fn schedule_of(src: &str, name: &str) -> std::sync::Arc<schedule::Schedule> {
    let (db, file) = db_with(src);
    let (item, _) = db::function_item(&db, file, name).expect("the function");
    db::schedule_ir(&db, item, db.options())
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn unsupported(src: &str, name: &str) -> String {
    let (db, file) = db_with(src);
    match emit_schedule(&db, file, name) {
        Err(EmitError::Unsupported(e)) => {
            assert!(e.span.end as usize <= src.len(), "span inside the file");
            e.to_string()
        }
        other => panic!("expected not-supported, got {other:?}"),
    }
}

const SCALED_SUM: &str = r#"def scaled_sum(a: Tensor["M", "N", f32], b: Tensor["M", "N", f32]) -> Tensor["M", "N", f32]:
    return a * 0.5 + b
"#;

const ATTENTION: &str = r#"def attention(q: Tensor["B", "H", "S", "D", bf16], k: Tensor["B", "H", "S", "D", bf16],
              v: Tensor["B", "H", "S", "D", bf16]) -> Tensor["B", "H", "S", "D", bf16]:
    return matmul(softmax(matmul(q, transpose(k, -2, -1)) * rsqrt(D), dim=-1), v)
"#;

#[test]
fn scaled_sum() {
    insta::assert_snapshot!(both(SCALED_SUM, "scaled_sum"));
    let s = schedule_of(SCALED_SUM, "scaled_sum");
    assert_eq!(s.launches().count(), 1, "one fused kernel");
}

#[test]
fn attention_lowers_to_flash_attn() {
    insta::assert_snapshot!(both(ATTENTION, "attention"));
    let s = schedule_of(ATTENTION, "attention");
    assert_eq!(s.launches().count(), 1);
    assert_eq!(
        s.launches().next().unwrap().kernel,
        KernelRef::Std {
            module: "std.attention",
            name: "flash_attn"
        }
    );
    assert_eq!(
        s.launches().next().unwrap().nodes.len(),
        5,
        "transpose, matmul, mul, softmax, matmul"
    );
}

#[test]
fn attention_with_at_operator_and_division() {
    let src = r#"def attn(q: Tensor["B", "H", "S", "D", bf16], k: Tensor["B", "H", "S", "D", bf16],
         v: Tensor["B", "H", "S", "D", bf16], s: f32) -> Tensor["B", "H", "S", "D", bf16]:
    return softmax((q @ transpose(k, 2, 3)) / s, dim=-1) @ v
"#;
    let s = schedule_of(src, "attn");
    assert_eq!(s.launches().count(), 1, "{}", schedule::dump(&s));
    assert!(
        schedule::dump(&s).contains("scale=div(1.0, s)"),
        "{}",
        schedule::dump(&s)
    );
}

#[test]
fn attention_whose_scores_are_reused_is_not_flash() {
    // The scores are used twice: they must be materialised, so no flash kernel;
    // the bf16 rank-4 matmuls are generated gemms (gemm_batched is f16 only).
    let src = r#"def attn2(q: Tensor["B", "H", "S", "D", bf16], k: Tensor["B", "H", "S", "D", bf16],
          v: Tensor["B", "H", "S", "D", bf16]) -> Tensor["B", "H", "S", "D", bf16]:
    s = matmul(q, transpose(k, -2, -1))
    p = softmax(s * 0.125, dim=-1)
    return matmul(p, v) + matmul(s, v)
"#;
    let s = schedule_of(src, "attn2");
    let names = kernel_names(&s);
    assert!(!names.iter().any(|n| n == "flash_attn"), "{names:?}");
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("attn2_matmul"))
            .count(),
        3,
        "{names:?}"
    );
}

#[test]
fn elementwise_chain_is_one_kernel() {
    let src = r#"def chain(x: Tensor["M", "N", f32], y: Tensor["M", "N", f32], bias: Tensor["N", f32]) -> Tensor["M", "N", f16]:
    t = exp(x - y) * 2.0
    u = relu(t + bias)
    return where(u > 1.0, 1.0, sigmoid(u)).to(f16)
"#;
    let s = schedule_of(src, "chain");
    assert_eq!(
        s.launches().count(),
        1,
        "u has two uses, both inside the group: {}",
        schedule::dump(&s)
    );
    // A value also used outside the chain (here: by a reduction) is materialised.
    let src2 = r#"def two(x: Tensor["M", "N", f32]) -> Tensor["M", "N", f32]:
    t = exp(x)
    return t * sigmoid(t) + sum(t, dim=-1, keepdims=True)
"#;
    let s = schedule_of(src2, "two");
    assert_eq!(
        kernel_names(&s),
        ["two_fused0", "sum_rows", "two_fused1"],
        "{}",
        schedule::dump(&s)
    );
    let src1 = r#"def chain1(x: Tensor["M", "N", f32], y: Tensor["M", "N", f32], bias: Tensor["N", f32]) -> Tensor["M", "N", f16]:
    t = exp(x - y) * 2.0
    return silu(gelu(relu(t + bias)) - 1.0).to(f16)
"#;
    insta::assert_snapshot!(both(src1, "chain1"));
    let s = schedule_of(src1, "chain1");
    assert_eq!(s.launches().count(), 1);
    assert_eq!(s.kernels.len(), 1);
    assert_eq!(
        s.launches().next().unwrap().nodes.len(),
        9,
        "every elementwise node in one group"
    );
}

#[test]
fn matmul_bias_relu_is_gemm_and_one_kernel() {
    let src = r#"def linear(x: Tensor["M", "K", f16], w: Tensor["K", "N", f16], b: Tensor["N", f16]) -> Tensor["M", "N", f16]:
    return relu(matmul(x, w) + b)
"#;
    insta::assert_snapshot!(both(src, "linear"));
    let s = schedule_of(src, "linear");
    assert_eq!(s.launches().count(), 2);
    assert_eq!(
        s.launches().next().unwrap().kernel,
        KernelRef::Std {
            module: "std.linalg",
            name: "gemm"
        }
    );
    assert!(matches!(
        s.launches().nth(1).unwrap().kernel,
        KernelRef::Generated(_)
    ));
}

#[test]
fn softmax_of_scaled_matmul() {
    let src = r#"def scores(q: Tensor["M", "K", f32], k: Tensor["K", 512, f32], scale: f32) -> Tensor["M", 512, f32]:
    return softmax(matmul(q, k) * scale, dim=-1)
"#;
    insta::assert_snapshot!(both(src, "scores"));
    let s = schedule_of(src, "scores");
    let names: Vec<String> = s
        .launches()
        .map(|l| match &l.kernel {
            KernelRef::Std { name, .. } => name.to_string(),
            KernelRef::Generated(_) => "generated".into(),
            KernelRef::User(n) => n.clone(),
        })
        .collect();
    // f32 multiplies in full f32 (a generated gemm of ieee `dot`s) unless
    // tf32 is asked for.
    assert_eq!(names, ["generated", "generated", "softmax_rows"]);
    let tf32 = r#"def scores(q: Tensor["M", "K", f32], k: Tensor["K", 512, f32]) -> Tensor["M", 512, f32]:
    return matmul(q, k, precision="tf32")
"#;
    let s = schedule_of(tf32, "scores");
    let first = s.launches().next().expect("a launch");
    assert!(
        matches!(
            first.kernel,
            KernelRef::Std {
                name: "gemm_tf32",
                ..
            }
        ),
        "{:?}",
        first.kernel
    );
    // The session's default (`set_float32_matmul_precision("high")`) too.
    let (mut db, file) = db_with(&tf32.replace(", precision=\"tf32\"", ""));
    db.set_matmul_tf32(true);
    let (item, _) = db::function_item(&db, file, "scores").expect("the function");
    let s = db::schedule_ir(&db, item, db.options())
        .clone()
        .expect("lowers");
    let first = s.launches().next().expect("a launch");
    assert!(
        matches!(
            first.kernel,
            KernelRef::Std {
                name: "gemm_tf32",
                ..
            }
        ),
        "{:?}",
        first.kernel
    );
}

fn kernel_names(s: &schedule::Schedule) -> Vec<String> {
    s.launches()
        .map(|l| match &l.kernel {
            KernelRef::Std { name, .. } => name.to_string(),
            KernelRef::Generated(k) => s.kernels[*k].name.clone(),
            KernelRef::User(n) => n.clone(),
        })
        .collect()
}

#[test]
fn narrow_matmul_results_are_cast_before_reuse() {
    let src = r#"def mm3(a: Tensor["M", "K", f16], b: Tensor["K", "N", f16], c: Tensor["N", "P", f16]) -> Tensor["M", "P", f16]:
    return (a @ b) @ c
"#;
    let s = schedule_of(src, "mm3");
    assert_eq!(
        kernel_names(&s),
        ["gemm", "mm3_copy0", "gemm", "mm3_copy1"],
        "{}",
        schedule::dump(&s)
    );
    // The first copy narrows the f32 accumulator to the f16 operand of the second gemm.
    let k = &s.kernels[0];
    assert!(k.body.ops.iter().any(|o| matches!(
        o.kind,
        crate::ir::tile::OpKind::Cast {
            to: crate::check::DType::F16,
            ..
        }
    )));
}

#[test]
fn transposed_operand_is_a_transpose_kernel_then_gemm() {
    let src = r#"def abt(a: Tensor["M", "K", f16], b: Tensor["N", "K", f16]) -> Tensor["M", "N", f32]:
    return matmul(a, b.T).to(f32)
"#;
    insta::assert_snapshot!(both(src, "abt"));
    let s = schedule_of(src, "abt");
    assert_eq!(kernel_names(&s), ["abt_transpose0", "gemm", "abt_fused1"]);
}

#[test]
fn narrow_floats_use_generated_row_kernels() {
    // bf16 softmax and rms_norm: generated kernels (f32 arithmetic, bf16 results),
    // no f32 copies for the f32-only stdlib row kernels.
    let src = r#"def sm16(x: Tensor["M", 256, bf16], w: Tensor[256, bf16]) -> Tensor["M", 256, bf16]:
    return rms_norm(softmax(x, dim=-1), w) * 2.0
"#;
    insta::assert_snapshot!(both(src, "sm16"));
    let s = schedule_of(src, "sm16");
    assert_eq!(
        kernel_names(&s),
        ["sm16_softmax0", "sm16_rms_norm1", "sm16_fused2"],
        "{}",
        schedule::dump(&s)
    );
}

#[test]
fn reductions_without_a_stdlib_kernel_are_generated() {
    let src = r#"def red(x: Tensor["B", "M", "N", f16], i: Tensor["M", "N", i32]) -> Tensor["B", "N", f32]:
    return sum(x, dim=1).to(f32) + min(x, dim=1).to(f32) * mean(i)
"#;
    insta::assert_snapshot!(both(src, "red"));
    let s = schedule_of(src, "red");
    assert_eq!(
        kernel_names(&s),
        ["red_reduce0", "red_reduce1", "red_reduce2", "red_fused3"],
        "{}",
        schedule::dump(&s)
    );
}

#[test]
fn batched_activations_and_vectors_use_plain_gemm() {
    let src = r#"def lin(x: Tensor["B", "T", "C", f16], w: Tensor["C", "F", f16], v: Tensor["F", f16]) -> Tensor["B", "T", f16]:
    return matmul(x @ w, v)
"#;
    let s = schedule_of(src, "lin");
    let d = schedule::dump(&s);
    assert_eq!(
        kernel_names(&s),
        ["gemm", "lin_copy0", "gemm", "lin_copy1"],
        "{d}"
    );
    assert!(
        d.contains("(A=x as [B*T, C], B=w, C=t0 as [B*T, F])"),
        "{d}"
    );
    assert!(d.contains("B=v as [F, 1]"), "{d}");
}

#[test]
fn long_or_unknown_rows_use_the_online_softmax() {
    let src = r#"def sm(x: Tensor["M", "N", f32]) -> Tensor["M", "N", f32]:
    return softmax(x, dim=1)
"#;
    let s = schedule_of(src, "sm");
    assert_eq!(
        s.launches().next().unwrap().kernel,
        KernelRef::Std {
            module: "std.nn",
            name: "softmax_rows_online"
        }
    );
}

#[test]
fn norms_and_reductions() {
    let src = r#"def norms(x: Tensor["B", "T", "C", f32], w: Tensor["C", f32], b: Tensor["C", f32]) -> Tensor["B", "T", "C", f32]:
    y = layer_norm(x, w, b, 1e-5)
    z = rms_norm(y, w)
    return z - mean(z, dim=-1, keepdims=True)
"#;
    insta::assert_snapshot!(both(src, "norms"));
}

#[test]
fn kernel_calls_reshape_and_creation() {
    let src = r#"const BLOCK = 1024

@kernel(grid=(cdiv(N, BLOCK),), num_warps=4)
def vadd(x: Tensor["N", f32], y: Tensor["N", f32], out: Tensor["N", f32]):
    i = program_id(0) * BLOCK
    store(out[i : i + BLOCK], load(x[i : i + BLOCK]) + load(y[i : i + BLOCK]))

def add_flat(a: Tensor["M", "N", f32], b: Tensor["M", "N", f32]) -> Tensor["M", "N", f32]:
    out = empty([M * N], f32)
    vadd[(cdiv(M * N, 256),)](reshape(a, [M * N]), reshape(b, [M * N]), out)
    return reshape(out, [M, N]) + ones([M, N], f32)
"#;
    insta::assert_snapshot!(both(src, "add_flat"));
}

#[test]
fn returning_a_parameter_copies_it() {
    let src = r#"def ident(a: Tensor["M", "N", f16]) -> Tensor["M", "N", f16]:
    return a
"#;
    let s = schedule_of(src, "ident");
    assert_eq!(s.kernels.len(), 1);
    assert!(s.kernels[0].name.contains("copy"));
}

/// One instance of a generic stdlib function: its dtype variable `T` and its
/// batch run `*B` (of `run` dims) fixed.
fn std_instance(module: &str, name: &str, dtype: crate::check::DType, run: usize) -> String {
    let src = crate::stdlib::source(module).expect("a stdlib module");
    let mut db = Database::new();
    let file = db.set_source(format!("<{module}>"), src.to_string());
    let (item, _) = db::function_item(&db, file, name).unwrap();
    let env = crate::check::generics::TypeEnv {
        dtypes: vec![("T".into(), dtype)],
        runs: vec![("B".into(), run)],
    };
    let (g, s) = db::instance_schedule(&db, item, db.options(), &env)
        .unwrap_or_else(|e| panic!("{name}: {}", e.message));
    format!("{}\n{}", graph::dump(&g), schedule::dump(&s))
}

#[test]
fn stdlib_nn_functions() {
    use crate::check::DType;
    insta::assert_snapshot!(
        "std_nn_softmax",
        std_instance("std.nn", "softmax", DType::F32, 1)
    );
    insta::assert_snapshot!(
        "std_nn_layer_norm",
        std_instance("std.nn", "layer_norm", DType::F32, 1)
    );
    insta::assert_snapshot!(
        "std_nn_rms_norm",
        std_instance("std.nn", "rms_norm", DType::F32, 1)
    );
    insta::assert_snapshot!("std_nn_gelu", std_instance("std.nn", "gelu", DType::F32, 2));
    insta::assert_snapshot!(
        "std_nn_layer_norm_bf16_rank3",
        std_instance("std.nn", "layer_norm", DType::BF16, 2)
    );
    // A generic function has no graph of its own: it is lowered per call.
    let src = crate::stdlib::source("std.nn").unwrap();
    let mut db = Database::new();
    let file = db.set_source("<std.nn>", src.to_string());
    assert!(emit_graph(&db, file, "softmax").is_err());
}

#[test]
fn stdlib_linalg_and_attention_wrappers() {
    insta::assert_snapshot!("std_linalg_mm", std_both("std.linalg", "mm"));
    insta::assert_snapshot!(
        "std_attention_attention",
        std_both("std.attention", "attention")
    );
    insta::assert_snapshot!(
        "std_attention_flash_attention",
        std_both("std.attention", "flash_attention")
    );
}

#[test]
fn std_nn_imports_act_as_the_builtins() {
    let src = r#"from std.nn import softmax, gelu

def f(x: Tensor["M", 256, f32]) -> Tensor["M", 256, f32]:
    return softmax(gelu(x))
"#;
    let (db, file) = db_with(src);
    let (item, _) = db::function_item(&db, file, "f").unwrap();
    let g = db::graph_ir(&db, item, db.options()).clone().unwrap();
    assert!(g
        .nodes
        .iter()
        .any(|n| matches!(n.kind, NodeKind::Softmax { .. })));
    assert!(g
        .nodes
        .iter()
        .all(|n| !matches!(n.kind, NodeKind::Call { .. })));
    let s = schedule_of(src, "f");
    assert_eq!(s.launches().count(), 2, "{}", schedule::dump(&s));
}

#[test]
fn randn_is_a_host_step() {
    let src = r#"def noisy(x: Tensor["M", "N", f32], s: i32) -> Tensor["M", "N", f32]:
    return x + randn([M, N], f32, seed=s) * 0.1

def fresh(x: Tensor["M", "N", bf16]) -> Tensor["M", "N", bf16]:
    return randn(x.shape, bf16)
"#;
    insta::assert_snapshot!(format!("{}\n{}", both(src, "noisy"), both(src, "fresh")));
    let s = schedule_of(src, "fresh");
    assert!(
        matches!(&s.steps[..], [schedule::Step::HostRandn { buf, seed: schedule::ScalarExpr::Const(zero), .. }]
            if *buf == s.outputs[0] && *zero == crate::ir::tile::Constant::Int(0)),
        "randn writes the output directly, default seed 0: {}",
        schedule::dump(&s)
    );
    // A read of a randn buffer before its step is a verifier error.
    let mut s = (*schedule_of(src, "noisy")).clone();
    s.steps.swap(0, 1);
    assert!(schedule::verify(&s)
        .unwrap_err()
        .contains("before it is written"));
}

#[test]
fn subscripts_and_permutes_are_gather_copies() {
    let src = r#"def pick(x: Tensor["B", "M", "N", f32], i: i32) -> Tensor["M", 3, f32]:
    return x[i, :, 2:5] + x[-1, :, -3:] + transpose(x, 0, 2)[1:4, :, 0].T
"#;
    insta::assert_snapshot!(both(src, "pick"));
    assert_eq!(
        kernel_names(&schedule_of(src, "pick")),
        [
            "pick_slice0",
            "pick_slice1",
            "pick_permute2",
            "pick_slice3",
            "pick_transpose4",
            "pick_fused5"
        ]
    );
}

#[test]
fn run_time_control_flow_is_regions_of_steps() {
    let src = r#"def cf(x: Tensor["M", "N", f32], b: Tensor["N", f32], k: i32, n: i32) -> Tensor["M", "N", f32]:
    s = 0.0
    if k > M:
        x = x + 1.0
        s = 2.0
    for i in range(k, n):
        x = x * 0.5 + b * i.to(f32)
    while n > 0:
        x, b = x + b, b * 2.0
        n -= 1
    return x + s
"#;
    insta::assert_snapshot!(both(src, "cf"));
    let s = schedule_of(src, "cf");
    assert!(
        s.steps
            .iter()
            .any(|st| matches!(st, schedule::Step::If { .. }))
            && s.steps
                .iter()
                .any(|st| matches!(st, schedule::Step::For { .. }))
            && s.steps
                .iter()
                .any(|st| matches!(st, schedule::Step::While { .. })),
        "{}",
        schedule::dump(&s)
    );
    // A recursive call is a call step running the callee's schedule.
    let rec = r#"def rec(x: Tensor["M", "N", f32], n: i32) -> Tensor["M", "N", f32]:
    if n > 0:
        x = rec(x, n - 1) + x
    return x
"#;
    let dump = schedule::dump(&schedule_of(rec, "rec"));
    assert!(
        dump.contains("0: call rec(x=x, n=sub(n, 1)) -> t1 nodes=[%4]"),
        "{dump}"
    );
    // A host variable read before it is set is a verifier error.
    let mut broken = (*s).clone();
    broken
        .steps
        .retain(|st| !matches!(st, schedule::Step::SetVar { .. }));
    assert!(schedule::verify(&broken)
        .unwrap_err()
        .contains("read before it is set"));
}

#[test]
fn unsupported_constructs_say_so() {
    let e = unsupported(
        r#"def f(x: Tensor["B", "M", "N", f32], n: i32) -> Tensor["B", "M", "N", f32]:
    while n > 0:
        x = x * 2.0
        if n > 10:
            break
        n = n - 1
    return x
"#,
        "f",
    );
    assert!(e.contains("`break`"), "{e}");
    let e = unsupported(
        r#"def early(x: Tensor["N", f32], k: i32) -> Tensor["N", f32]:
    if k > 0:
        return x
    return x + 1.0
"#,
        "early",
    );
    assert!(e.contains("a `return` inside an `if`"), "{e}");
    // A gather (`x[i]`) is the checker's E0512 now (tests/ui/session/
    // constant_and_gather_agree.tsr), not a lowering error.
    let (db, file) = db_with(SCALED_SUM);
    assert_eq!(
        emit_graph(&db, file, "nope"),
        Err(EmitError::NoFunction("nope".into()))
    );
}

#[test]
fn errors_in_the_file_are_diagnostics() {
    let (db, file) = db_with(
        r#"def bad(a: Tensor["M", f32], b: Tensor["N", f16]) -> Tensor["M", f32]:
    return a + b
"#,
    );
    assert!(matches!(
        emit_graph(&db, file, "bad"),
        Err(EmitError::Diagnostics(d)) if !d.is_empty()
    ));
}

#[test]
fn kernels_have_no_graph() {
    let src = crate::stdlib::source("std.nn").unwrap();
    let mut db = Database::new();
    let file = db.set_source("<std.nn>", src.to_string());
    assert_eq!(
        emit_graph(&db, file, "softmax_rows"),
        Err(EmitError::IsKernel("softmax_rows".into()))
    );
}

#[test]
fn calls_to_functions_are_inlined() {
    let src = r#"import std.linalg as la

def g(x: Tensor["M", "N", f32], s: f32) -> Tensor["M", "N", f32]:
    return x * s

def h(a: Tensor[64, "K", f32], b: Tensor[64, "K", f32]) -> Tensor[64, "K", f32]:
    return exp(g(a, 2.0)) + g(b, 3.0)

def k(a: Tensor["P", "Q", f16], b: Tensor["Q", "R", f16]) -> Tensor["P", "R", f32]:
    return la.mm(a, b) * 2.0

def scaled(x: Tensor["N", f32], s: f32 = 0.25) -> Tensor["N", f32]:
    return x * s

def uses_default(y: Tensor["N", f32]) -> Tensor["N", f32]:
    return scaled(y) + 1.0
"#;
    insta::assert_snapshot!(both(src, "h"));
    let s = schedule_of(src, "h");
    assert_eq!(
        s.launches().count(),
        1,
        "both inlined bodies fuse with the add"
    );
    let (db, file) = db_with(src);
    let (item, _) = db::function_item(&db, file, "k").unwrap();
    let g = db::graph_ir(&db, item, db.options()).clone().unwrap();
    assert!(
        graph::dump(&g).contains("launch gemm[@kernel grid](A=%0, B=%1, C=%2)"),
        "{}",
        graph::dump(&g)
    );
    assert!(
        graph::dump(&g).contains("empty : Tensor[P, R, f32]"),
        "dims substituted: {}",
        graph::dump(&g)
    );
    let (item, _) = db::function_item(&db, file, "uses_default").unwrap();
    let g = db::graph_ir(&db, item, db.options()).clone().unwrap();
    assert!(
        graph::dump(&g).contains("const 0.25 : f32"),
        "{}",
        graph::dump(&g)
    );
    let names: Vec<String> = db::file_functions(&db, file)
        .into_iter()
        .map(|f| f.0)
        .collect();
    assert_eq!(names, ["g", "h", "k", "scaled", "uses_default"]);
}

#[test]
fn calls_with_const_arguments_inline_a_specialised_callee() {
    let src = r#"from std.attention import flash_attention

def sm(x: Tensor["M", "N", f32], axis: const i32 = 0) -> Tensor["M", "N", f32]:
    return exp(x - max(x, dim=axis, keepdims=True))

def user(q: Tensor["B", "H", "S", 64, bf16], x: Tensor["M", "N", f32]) -> Tensor["B", "H", "S", 64, bf16]:
    y = sm(x, axis=1) + sm(x)
    return flash_attention(q, q, q, causal=True) * sum(y).to(bf16)
"#;
    let (db, file) = db_with(src);
    let (item, _) = db::function_item(&db, file, "user").unwrap();
    let g = db::graph_ir(&db, item, db.options()).clone().unwrap();
    let dump = graph::dump(&g);
    assert!(dump.contains("causal=True"), "{dump}");
    assert!(
        dump.contains("max %1, axis=1") && dump.contains("max %1, axis=0"),
        "{dump}"
    );
    assert!(!dump.contains("call "), "{dump}");
}

#[test]
fn verifiers_reject_broken_ir() {
    let (db, file) = db_with(SCALED_SUM);
    let (item, _) = db::function_item(&db, file, "scaled_sum").unwrap();
    let mut g = (**db::graph_ir(&db, item, db.options()).as_ref().unwrap()).clone();
    assert!(graph::verify(&g).is_ok());
    // An operand used before its definition.
    g.nodes.swap(2, 3);
    assert!(graph::verify(&g).is_err());
    let mut s = (*schedule_of(SCALED_SUM, "scaled_sum")).clone();
    assert!(schedule::verify(&s).is_ok());
    s.steps.clear();
    assert!(schedule::verify(&s).unwrap_err().contains("never written"));
    let mut s = (*schedule_of(SCALED_SUM, "scaled_sum")).clone();
    // `r0 = pid0 * BR` before `pid0`.
    std::sync::Arc::make_mut(&mut s.kernels[0])
        .body
        .ops
        .swap(0, 4);
    assert!(schedule::verify(&s).is_err());
}

#[test]
fn graph_ir_is_reused_after_an_unrelated_edit() {
    let mut db = Database::with_event_log();
    let text = format!("{SCALED_SUM}\ndef other(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return x * 2.0\n");
    let file = db.set_source("/t/r.tsr", text.clone());
    emit_schedule(&db, file, "scaled_sum").unwrap();
    db.start_event_log();
    db.set_source("/t/r.tsr", text.replace("x * 2.0", "x * 3.0"));
    emit_schedule(&db, file, "scaled_sum").unwrap();
    let log = db.take_event_log();
    assert!(
        !log.iter()
            .any(|e| e.starts_with("graph_ir(") || e.starts_with("schedule_ir(")),
        "{log:?}"
    );
}

/// Every whole-tensor function of the UI cases and the stdlib that checks
/// without errors lowers to verified IR or to a "not supported yet" error,
/// never a verifier failure or a panic.
#[test]
fn every_checked_function_lowers_or_says_not_supported() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ui");
    let mut files = Vec::new();
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "tsr") {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut sources: Vec<(String, String)> = files
        .iter()
        .map(|p| (p.display().to_string(), std::fs::read_to_string(p).unwrap()))
        .collect();
    for m in ["std.nn", "std.linalg", "std.attention", "std.reduce"] {
        sources.push((
            format!("<{m}>"),
            crate::stdlib::source(m).unwrap().to_string(),
        ));
    }
    let (mut lowered, mut unsupported, mut functions) = (0, 0, 0);
    for (path, text) in &sources {
        let mut db = Database::new();
        if let Some(arch) = text.strip_prefix("# arch: ").and_then(|r| r.lines().next()) {
            if let Ok(a) = arch.trim().parse() {
                db.set_arch(a);
            }
        }
        let file = db.set_source(path.clone(), text.clone());
        if db.diagnostics(file).iter().any(|d| d.is_error()) {
            continue;
        }
        for (name, _, _) in db::file_functions(&db, file) {
            functions += 1;
            let g = emit_graph(&db, file, &name);
            let s = emit_schedule(&db, file, &name);
            match (&g, &s) {
                (Ok(_), Ok(_)) => lowered += 1,
                (_, Err(EmitError::Unsupported(e))) => {
                    eprintln!("{path}: `{name}`: {e}");
                    unsupported += 1
                }
                other => panic!("{path}: `{name}`: {other:?}"),
            }
        }
    }
    eprintln!("{functions} functions: {lowered} lowered, {unsupported} not supported yet");
    assert!(lowered > 0 && functions == lowered + unsupported);
}

#[test]
fn editing_a_callee_relowers_its_callers() {
    let text = "def f(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return x * 2.0\n\ndef g(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return f(x) + 1.0\n";
    let mut db = Database::new();
    let file = db.set_source("/t/e.tsr", text.to_string());
    assert!(emit_graph(&db, file, "g").unwrap().contains("const 2.0"));
    db.set_source("/t/e.tsr", text.replace("x * 2.0", "x * 3.0"));
    let g = emit_graph(&db, file, "g").unwrap();
    assert!(g.contains("const 3.0") && !g.contains("const 2.0"), "{g}");
}

#[test]
fn tsrc_emit_graph_and_schedule_ir() {
    use crate::cli::{emit_to, EmitArgs, EmitKind};
    let dir = std::env::temp_dir().join(format!("tsrc-graph-emit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("e.tsr");
    std::fs::write(
        &path,
        format!("{SCALED_SUM}\ndef noisy(x: Tensor[\"M\", f32], n: i32) -> Tensor[\"M\", f32]:\n    while n > 0:\n        break\n    return x\n"),
    )
    .unwrap();
    let run = |emit: EmitKind, kernel: Option<&str>| {
        let args = EmitArgs {
            file: path.clone(),
            emit,
            arch: Default::default(),
            kernel: kernel.map(String::from),
            define: Vec::new(),
            output: None,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = emit_to(&args, &mut out, &mut err, false);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    };
    let (code, out, err) = run(EmitKind::GraphIr, Some("scaled_sum"));
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("graph scaled_sum("), "{out}");
    let (code, out, err) = run(EmitKind::ScheduleIr, Some("scaled_sum"));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("kernel @scaled_sum_fused0("), "{out}");
    // The whole file: `noisy` is not supported yet, an E0512 (exit 1).
    let (code, out, err) = run(EmitKind::ScheduleIr, None);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(
        err.contains("error[E0512]") && err.contains("`break`"),
        "{err}"
    );
    let (code, _, err) = run(EmitKind::GraphIr, Some("nope"));
    assert_eq!(code, 2);
    assert!(err.contains("scaled_sum, noisy"), "{err}");
}

#[test]
fn generic_calls_inline_the_instance_of_each_call() {
    let src = r#"def inner[T: float](x: Tensor["*B", "N", T]) -> Tensor["*B", "N", T]:
    return x - max(x, dim=-1, keepdims=True)

def outer[U: float](x: Tensor["*A", "N", U], w: Tensor["N", U]) -> Tensor["*A", "N", U]:
    return exp(inner(x)) * w

def use(a: Tensor["Z", "M", "N", bf16], w: Tensor["N", bf16], v: Tensor["N", f64]) -> Tensor["Z", "M", "N", bf16]:
    return outer(a, w) + sum(inner(v)).to(bf16)
"#;
    let (db, file) = db_with(src);
    let (item, _) = db::function_item(&db, file, "use").unwrap();
    let g = db::graph_ir(&db, item, db.options()).clone().unwrap();
    let dump = graph::dump(&g);
    assert!(
        g.nodes
            .iter()
            .all(|n| !matches!(n.kind, NodeKind::Call { .. })),
        "{dump}"
    );
    // The rank-3 bf16 instance reduces axis 2; the rank-1 f64 one axis 0.
    assert!(
        dump.contains("max %0, axis=2, keepdims=true : Tensor[Z, M, 1, bf16]"),
        "{dump}"
    );
    assert!(
        dump.contains("axis=0, keepdims=true : Tensor[1, f64]"),
        "{dump}"
    );
    // Generic functions have no graph of their own.
    let names: Vec<String> = db::file_functions(&db, file)
        .into_iter()
        .map(|f| f.0)
        .collect();
    assert_eq!(names, ["use"]);
    schedule_of(src, "use");
}
