//! Lowering tests: the brief's reference kernels and every stdlib kernel lower
//! and verify; snapshots of their Tile IR.

use std::sync::Arc;

use super::*;
use crate::db::{file_kernels, tile_ir, Database};

type Lowered = Result<Arc<Kernel>, Vec<crate::diag::Diagnostic>>;

const BRIEF: &str = include_str!("testdata/brief.tsr");

/// Lowers every kernel of `src` (which must check cleanly) and verifies it.
fn lower_file(path: &str, src: &str, spec: &Specialization) -> Vec<(String, Lowered)> {
    let mut db = Database::new();
    let file = db.set_source(path, src.to_string());
    let errors: Vec<_> = db
        .diagnostics(file)
        .iter()
        .filter(|d| d.is_error())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    file_kernels(&db, file)
        .into_iter()
        .map(|(name, item, _)| {
            let r = tile_ir(&db, item, db.options(), spec.clone()).clone();
            if let Ok(k) = &r {
                let errs = verify(k);
                assert!(errs.is_empty(), "{name}: {errs:#?}\n{}", k.dump());
            }
            (name, r)
        })
        .collect()
}

fn lowered(path: &str, src: &str, spec: &Specialization, name: &str) -> Arc<Kernel> {
    let all = lower_file(path, src, spec);
    let (_, r) = all
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no kernel {name}"));
    r.unwrap_or_else(|d| panic!("{name}: {d:#?}"))
}

fn brief(spec: &Specialization, name: &str) -> Arc<Kernel> {
    lowered("/t/brief.tsr", BRIEF, spec, name)
}

#[test]
fn brief_vadd_softmax_gemm() {
    let spec = Specialization::new();
    insta::assert_snapshot!("vadd", brief(&spec, "vadd").dump());
    insta::assert_snapshot!("softmax_rows", brief(&spec, "softmax_rows").dump());
    insta::assert_snapshot!("gemm", brief(&spec, "gemm").dump());
}

#[test]
fn brief_flash_attn_specialisations() {
    for d in [64, 128] {
        for causal in [0, 1] {
            let spec = Specialization::new().with("D", d).with("causal", causal);
            let k = brief(&spec, "flash_attn");
            insta::assert_snapshot!(format!("flash_attn_d{d}_causal{causal}"), k.dump());
            let text = k.dump();
            assert!(text.contains(&format!("tile<128x{d}xf32>")), "{text}");
            // The causal mask is a select inside the loop, only when causal,
            // and only on the iterations where it is not all-true: a uniform
            // branch on the loop variable skips it below the diagonal.
            assert_eq!(text.contains("select"), causal == 1, "{text}");
            assert_eq!(text.contains("if %"), causal == 1, "{text}");
            // `end = min(S, m0 + BM) if causal else S` folds on the const,
            // and already stops at the diagonal: no second clamp.
            assert_eq!(text.matches(" min ").count(), causal as usize, "{text}");
        }
    }
}

#[test]
fn const_parameters_can_be_given() {
    let spec = Specialization::new().with("BM", 64).with("BK", 16);
    let k = brief(&spec, "gemm");
    assert_eq!(
        k.specialization,
        vec![("BK".into(), 16), ("BM".into(), 64), ("BN".into(), 128)]
    );
    let text = k.dump();
    assert!(
        text.contains(" : +64, %") && text.contains(": tile<64x16xf16>"),
        "{text}"
    );
    assert!(text.contains(": tile<16x128xf16>"), "{text}");
}

#[test]
fn missing_specialised_dim_is_e0511() {
    let all = lower_file("/t/brief.tsr", BRIEF, &Specialization::new());
    let (_, r) = all.into_iter().find(|(n, _)| n == "flash_attn").unwrap();
    let d = r.unwrap_err();
    assert_eq!(d.len(), 1, "{d:#?}");
    assert_eq!(d[0].code, "E0511");
    assert!(d[0].message.contains("`D`"), "{}", d[0].message);
}

#[test]
fn every_missing_specialised_dim_is_reported_at_once() {
    // `D` and `E` each size a tile; lowering stops at the first, yet both are named.
    let src = "@kernel(grid=(1,))\ndef k(x: Tensor[\"D\", f32], y: Tensor[\"E\", f32]):\n    a = load(x[:])\n    b = load(y[:])\n    store(x[0 : 1], zeros([1], f32) + sum(a) + sum(b))\n";
    let all = lower_file("/t/two.tsr", src, &Specialization::new());
    let d = all[0].1.clone().unwrap_err();
    let codes: Vec<&str> = d.iter().map(|d| d.code).collect();
    assert_eq!(codes, ["E0511", "E0511"], "{d:#?}");
    assert!(d[0].message.contains("`D`"), "{}", d[0].message);
    assert!(d[1].message.contains("`E`"), "{}", d[1].message);
    // With one given, only the other is missing.
    let all = lower_file("/t/two.tsr", src, &Specialization::new().with("D", 32));
    let d = all[0].1.clone().unwrap_err();
    assert_eq!(d.len(), 1, "{d:#?}");
    assert!(d[0].message.contains("`E`"), "{}", d[0].message);
}

#[test]
fn const_without_default_is_e0511() {
    let src = "@kernel(grid=(1,))\ndef k(x: Tensor[\"N\", f32], B: const):\n    store(x[0 : B], zeros([B], f32))\n";
    let all = lower_file("/t/k.tsr", src, &Specialization::new());
    let d = all[0].1.clone().unwrap_err();
    assert_eq!(d[0].code, "E0511");
    assert!(d[0].message.contains("`B`"), "{}", d[0].message);
    let all = lower_file("/t/k.tsr", src, &Specialization::new().with("B", 32));
    let k = all[0].1.clone().unwrap();
    assert!(
        k.dump().contains("store %x[%0 : +32], %2 : tile<32xf32>"),
        "{}",
        k.dump()
    );
}

/// Every kernel of the standard library lowers and verifies.
#[test]
fn stdlib_kernels() {
    let mut count = 0;
    for module in ["attention", "linalg", "nn", "reduce"] {
        let src = crate::stdlib::source(&format!("std.{module}")).expect("stdlib module");
        for (name, r) in lower_file(
            &format!("/t/{module}.tsr"),
            src,
            &Specialization::new().with("D", 64),
        ) {
            let k = r.unwrap_or_else(|d| panic!("{name}: {d:#?}"));
            insta::assert_snapshot!(format!("std_{module}_{name}"), k.dump());
            count += 1;
        }
    }
    assert!(count >= 15, "{count} kernels");
}

const FEATURES: &str = include_str!("testdata/features.tsr");

/// Run-time `if`/`elif`/`else` merging, `while`, a run-time conditional
/// expression, masks, promotions, reductions without an axis, atomics.
#[test]
fn control_flow_and_promotion() {
    let k = lowered(
        "/t/features.tsr",
        FEATURES,
        &Specialization::new(),
        "control",
    );
    let text = k.dump();
    insta::assert_snapshot!("features_control", text);
    // `k` and `acc` merge out of the if/elif/else; `acc` and `j` are carried by the while.
    assert!(text.contains("= if %"), "{text}");
    assert!(text.contains("while ("), "{text}");
    // f16 + 1.5: the literal takes f16; `.to(f32)` and `/ lim` (i32 -> f32) are casts.
    assert!(text.contains("const 1.5 : f16"), "{text}");
    assert!(text.contains("to f32"), "{text}");
    assert!(text.contains("load %x[%"), "{text}");
    assert!(text.contains(" mask %"), "{text}");
    assert!(text.contains("atomic_add %hist["), "{text}");
    let ifs = text.matches(" if %").count();
    assert!(ifs >= 3, "if, elif and the conditional expression: {text}");
}

#[test]
fn static_shapes_tf32_and_full_reductions() {
    let k = lowered("/t/features.tsr", FEATURES, &Specialization::new(), "small");
    let text = k.dump();
    insta::assert_snapshot!("features_small", text);
    assert!(text.contains("precision tf32"), "{text}");
    assert!(text.contains("%a: tensor<16 x 32 x f32>"), "{text}");
    // max(z) reduces both axes to a scalar.
    assert!(text.contains("-> f32"), "{text}");
    assert!(text.contains("keepdims"), "{text}");
}

/// Every kernel of every UI case and example that checks without errors
/// lowers and verifies: with its defaults, or (E0511) with every tensor dim
/// specialised to 64; none is E0512 (not supported yet). Files with an
/// `# emit:` header expect lowering diagnostics: the UI harness checks them.
#[test]
fn corpus_kernels_lower_and_verify() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    let mut stack = vec![root.join("tests/ui"), root.join("examples")];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "tsr") {
                files.push(p);
            }
        }
    }
    files.sort();
    let (mut lowered_n, mut unsupported) = (0, Vec::new());
    let mut failures = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        if text.contains("# emit:") {
            continue;
        }
        let mut db = Database::new();
        let file = db.load_file(&path).unwrap();
        if db.diagnostics(file).iter().any(|d| d.is_error()) {
            continue;
        }
        for (name, item, _) in file_kernels(&db, file) {
            let mut r = tile_ir(&db, item, db.options(), Specialization::new()).clone();
            if matches!(&r, Err(d) if d.iter().any(|d| d.code == "E0511")) {
                let mut spec = Specialization::new();
                if let Some(sig) = crate::db::item_signature(&db, item) {
                    for p in &sig.params {
                        if let crate::check::Ty::Tensor { dims, .. } = &p.ty {
                            for d in dims {
                                for s in d.symbols() {
                                    spec.values.insert(s.to_string(), 64);
                                }
                            }
                        }
                        if p.is_const && !p.has_default {
                            spec.values.insert(p.name.clone(), 64);
                        }
                    }
                }
                r = tile_ir(&db, item, db.options(), spec).clone();
            }
            let where_ = format!("{}: {name}", path.display());
            match r {
                Ok(k) => {
                    let errs = verify(&k);
                    if !errs.is_empty() {
                        failures.push(format!("{where_}: verify: {errs:?}\n{}", k.dump()));
                    }
                    lowered_n += 1;
                }
                Err(d) if d.iter().all(|d| d.code == "E0512") => {
                    unsupported.push(format!("{where_}: {}", d[0].message));
                }
                Err(d) => failures.push(format!("{where_}: {d:?}")),
            }
        }
    }
    println!("{lowered_n} kernels lowered; unsupported: {unsupported:#?}");
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(unsupported.is_empty(), "{unsupported:#?}");
    assert!(lowered_n >= 37, "{lowered_n}");
}

#[test]
fn break_and_continue() {
    let src = "@kernel(grid=(M,), num_warps=4)\ndef partial_row_sum(x: Tensor[\"M\", \"N\", f32], out: Tensor[\"M\", f32], limit: i32, BLOCK: const = 128):\n    row = program_id(0)\n    acc = zeros([BLOCK], f32)\n    for c in range(0, N, BLOCK):\n        if c >= limit:\n            break\n        if c % (2 * BLOCK) != 0:\n            continue\n        acc += load(x[row, c : c + BLOCK])\n    store(out[row : row + 1], sum(acc, axis=0, keepdims=True))\n\n@kernel(grid=(1,))\ndef count(x: Tensor[16, i32], n: i32):\n    i = 0\n    s = 0\n    while i < n:\n        i += 1\n        if i % 3 == 0:\n            continue\n        s += i\n        if s > 100:\n            break\n    store(x[0 : 1], zeros([1], i32) + s)\n";
    let k = lowered(
        "/t/jumps.tsr",
        src,
        &Specialization::new(),
        "partial_row_sum",
    );
    let text = k.dump();
    insta::assert_snapshot!("break_continue_for", text);
    // A `for` with `break` becomes a `while` carrying (iv, broken, acc).
    assert!(text.contains("while ("), "{text}");
    assert!(!text.contains(" for "), "{text}");
    let k = lowered("/t/jumps.tsr", src, &Specialization::new(), "count");
    insta::assert_snapshot!("break_continue_while", k.dump());
}

#[test]
fn early_return_guards_the_rest() {
    let src = "@kernel(grid=(M,))\ndef rows(x: Tensor[\"M\", 64, f32], limit: i32):\n    row = program_id(0)\n    if row >= limit:\n        return\n    v = load(x[row, 0 : 64])\n    store(x[row, 0 : 64], v * 2.0)\n    return\n";
    let k = lowered("/t/ret.tsr", src, &Specialization::new(), "rows");
    let text = k.dump();
    insta::assert_snapshot!("early_return", text);
    // The load and store run only where the kernel did not return.
    let guard = text.find("if %").expect("a guard");
    assert!(text.find("load %x").unwrap() > guard, "{text}");
}

#[test]
fn shapes_scalar_loads_and_logic() {
    let src = "@kernel(grid=(M,))\ndef k(x: Tensor[\"M\", 32, f32], y: Tensor[\"M\", f32], n: i32):\n    row = program_id(0)\n    t = load(x[row, :])\n    z = zeros(t.shape, f32) + t\n    w = x.shape[1]\n    first = load(y[row])\n    if row < M and not (n == 0 or n > 5):\n        first = first * -abs(first) ** 2.0\n    store(x[row, 0 : w], z // 2.0 + first)\n    store(y[row], first)\n";
    let k = lowered("/t/shape.tsr", src, &Specialization::new(), "k");
    let text = k.dump();
    insta::assert_snapshot!("shapes_scalars_logic", text);
    // `load(y[row])` is a scalar load; `x.shape[1]` is the constant 32.
    assert!(
        text.contains("load %y[%") && text.contains("] other 0.0 : f32"),
        "{text}"
    );
    assert!(
        text.contains("store %x[%") && text.contains(" : +32], %"),
        "{text}"
    );
    assert!(text.contains("pow "), "{text}");
}

#[test]
fn autotune_first_configuration_and_overrides() {
    let src = "@autotune(space={\"BM\": [64, 128], \"num_warps\": [2, 8]}, key=[\"N\"])\n@kernel(grid=(cdiv(N, BM),), num_warps=4, num_stages=2)\ndef k(x: Tensor[\"N\", f32], BM: const = 256):\n    i = program_id(0) * BM\n    store(x[i : i + BM], load(x[i : i + BM]) + 1.0)\n";
    let k = lowered("/t/tune.tsr", src, &Specialization::new(), "k");
    assert_eq!(k.specialization, vec![("BM".into(), 64)]);
    assert_eq!((k.num_warps, k.num_stages), (2, 2));
    let spec = Specialization::new().with("BM", 32).with("num_warps", 1);
    let k = lowered("/t/tune.tsr", src, &spec, "k");
    assert_eq!(k.specialization, vec![("BM".into(), 32)]);
    assert_eq!(k.num_warps, 1);
    assert!(k.dump().contains("tile<32xf32>"), "{}", k.dump());
}

#[test]
fn negative_constant_indices_count_from_the_end() {
    let src = "@kernel(grid=(1,))\ndef k(x: Tensor[\"M\", 8, f32], y: Tensor[4, f32]):\n    store(y[0 : 4], load(x[-1, 0 : 4]) + load(y[-2]))\n";
    let k = lowered("/t/neg.tsr", src, &Specialization::new(), "k");
    let text = k.dump();
    // x[-1] is row M - 1 (a run-time dim); y[-2] is the constant 2.
    assert!(text.contains("dim %x, 0"), "{text}");
    assert!(text.contains("const 2 : i32"), "{text}");
    assert!(!text.contains("const -2"), "{text}");
}

#[test]
fn dims_named_by_const_parameters_and_not_on_ints() {
    let src = "@kernel(grid=(M,))\ndef k(x: Tensor[\"M\", \"BN\", f32], n: i32, BN: const = 32):\n    row = program_id(0)\n    v = load(x[row, :])\n    if not n:\n        v = v * 0.0\n    store(x[row, :], v)\n";
    let k = lowered("/t/cdim.tsr", src, &Specialization::new(), "k");
    let text = k.dump();
    assert!(text.contains("%x: tensor<M x 32 x f32>"), "{text}");
    assert!(text.contains("cmp eq %"), "{text}");
    let k = lowered(
        "/t/cdim.tsr",
        src,
        &Specialization::new().with("BN", 16),
        "k",
    );
    assert!(k.dump().contains("tile<16xf32>"), "{}", k.dump());
}

#[test]
fn specialise_only_the_dims_a_kernel_needs() {
    let mut db = Database::new();
    let file = db.set_source("/t/brief.tsr", BRIEF.to_string());
    let scope = crate::db::module_scope(&db, file).clone();
    let (_, item, _) = file_kernels(&db, file)
        .into_iter()
        .find(|(n, _, _)| n == "flash_attn")
        .unwrap();
    let parsed = crate::db::parse_item(&db, item).item.clone().unwrap();
    let crate::syntax::ast::Item::Function(f) = &*parsed else {
        panic!("not a function")
    };
    let known: std::collections::BTreeMap<String, i64> =
        [("B", 2), ("H", 8), ("S", 1000), ("D", 128)]
            .into_iter()
            .map(|(n, v)| (n.to_string(), v))
            .collect();
    let k = lower_kernel_with_dims(f, &scope, &Specialization::new(), &known).unwrap();
    assert!(verify(&k).is_empty());
    assert_eq!(
        k.specialization,
        vec![
            ("BM".into(), 128),
            ("BN".into(), 64),
            ("D".into(), 128),
            ("causal".into(), 0)
        ]
    );
    assert!(k.dump().contains("%q: tensor<B x H x S x 128 x bf16>"));
    // Without D among the known dims it is still E0511.
    let mut no_d = known.clone();
    no_d.remove("D");
    let d = lower_kernel_with_dims(f, &scope, &Specialization::new(), &no_d).unwrap_err();
    assert_eq!(d[0].code, "E0511");
}

const GATHER: &str = include_str!("../../../../tests/ui/valid/gather.tsr");
const TILE_SLICES: &str = include_str!("../../../../tests/ui/emit/tile_slices.tsr");

/// Tensors indexed with tiles: affine index tiles become ranges, others
/// gathers of the whole shape; tile slices and indices are `extract`s.
#[test]
fn gathers_scatters_and_tile_slices() {
    let mut text = String::new();
    for (name, r) in lower_file("/t/gather.tsr", GATHER, &Specialization::new()) {
        let k = r.unwrap_or_else(|d| panic!("{name}: {d:#?}"));
        text.push_str(&k.dump());
        text.push('\n');
    }
    insta::assert_snapshot!("gathers", text);
    assert!(
        text.contains("load %x[%"),
        "vadd_offsets reads a range: {text}"
    );
    assert!(text.contains("atomic_add %hist[each %"), "{text}");
    let spec = Specialization::new().with("K", 20);
    let mut text = String::new();
    for (name, r) in lower_file("/t/tile_slices.tsr", TILE_SLICES, &spec) {
        match (name.as_str(), r) {
            ("past_the_end", Err(d)) => assert_eq!(d[0].code, "E0413", "{d:?}"),
            ("emptied", Err(d)) => assert_eq!(d[0].code, "E0405", "{d:?}"),
            (_, Ok(k)) => {
                text.push_str(&k.dump());
                text.push('\n');
            }
            (name, Err(d)) => panic!("{name}: {d:#?}"),
        }
    }
    insta::assert_snapshot!("tile_slices", text);
}

/// The verifier keeps a gather's indices whole: i32 tiles of one shape, with
/// no point or range beside them.
#[test]
fn verifier_checks_gathers() {
    let k = lowered("/t/gather.tsr", GATHER, &Specialization::new(), "embedding");
    let at = k
        .body
        .ops
        .iter()
        .position(|op| matches!(&op.kind, OpKind::Load { access, .. } if Access::is_gather(access)))
        .expect("a gather");
    let scalar = k
        .body
        .ops
        .iter()
        .find(|op| {
            k.ty(op.results.first().copied().unwrap_or(Value(0))) == &Type::Scalar(DType::I32)
        })
        .map(|op| op.results[0])
        .expect("an i32 scalar");
    let tile = |k: &Kernel| match &k.body.ops[at].kind {
        OpKind::Load { access, .. } => access[0].value(),
        _ => unreachable!(),
    };
    let mutate = |f: &dyn Fn(&mut Vec<Access>, Value)| {
        let mut m = (*k).clone();
        let t = tile(&m);
        if let OpKind::Load { access, .. } = &mut m.body.ops[at].kind {
            f(access, t);
        }
        verify(&m).join("\n")
    };
    assert!(verify(&k).is_empty());
    let e = mutate(&|a, _| {
        a[1] = Access::Range {
            start: scalar,
            len: 64,
        }
    });
    assert!(e.contains("mixes a point or range with gathers"), "{e}");
    let e = mutate(&|a, _| a[1] = Access::Gather(scalar));
    assert!(e.contains("not an i32 tile"), "{e}");
    let tokens = k
        .body
        .ops
        .iter()
        .find(|op| matches!(k.ty(op.results.first().copied().unwrap_or(Value(0))), Type::Tile { shape, .. } if shape == &[32]))
        .map(|op| op.results[0])
        .expect("the token tile");
    let e = mutate(&|a, _| a[1] = Access::Gather(tokens));
    assert!(e.contains("has shape [32]"), "{e}");
}

/// The counted steps of lowering the first kernel of `src` to Tile IR.
fn counted_lowering_work(path: &str, src: String) -> u64 {
    let mut db = Database::new();
    let file = db.set_source(path, src);
    let (_, item, _) = file_kernels(&db, file).into_iter().next().unwrap();
    let before = lower::WORK.with(|w| w.get());
    tile_ir(&db, item, db.options(), Specialization::new())
        .clone()
        .unwrap_or_else(|d| panic!("{d:?}"));
    lower::WORK.with(|w| w.get()) - before
}

/// The work (`lower::WORK` steps) of lowering a kernel of `n` statements
/// `a = a * v + k.5` over a 1024-element tile: at the top level, each under
/// an `if`, or in a loop that carries `a`.
fn lowering_work(n: usize, shape: &str) -> u64 {
    let mut src = String::from(
        "@kernel(grid=(cdiv(N, 1024),), num_warps=1)\n\
         def chain(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    \
         i = program_id(0) * 1024\n    v = load(x[i : i + 1024])\n    a = v\n",
    );
    if shape == "loop" {
        src += "    for k in range(0, N, 7):\n";
    }
    for k in 0..n {
        match shape {
            "flat" => src += &format!("    a = a * v + {k}.5\n"),
            "if" => src += &format!("    if i > {k}:\n        a = a * v + {k}.5\n"),
            _ => src += &format!("        a = a * v + {k}.5\n"),
        }
    }
    src += "    store(out[i : i + 1024], a)\n";
    counted_lowering_work("/t/chain.tsr", src)
}

#[test]
fn lowering_work_grows_linearly_with_kernel_length() {
    // Counted steps, not time. Asking each statement for the reads of the
    // rest of its block made 400 statements cost about four times 200. The
    // steps include dead-code removal's passes over the ops (two, each
    // counting and sweeping), hence the bound per statement.
    for shape in ["flat", "if", "loop"] {
        let small = lowering_work(200, shape);
        let large = lowering_work(400, shape);
        assert!(
            small < 200 * 80,
            "{shape}: {small} steps for 200 statements"
        );
        let ratio = large as f64 / small as f64;
        assert!(
            ratio < 2.2,
            "{shape}: lowering 200 statements took {small} steps, 400 took {large} ({ratio:.2}x)"
        );
    }
}

/// The work of lowering a kernel that binds `n` names and then has `n` `if`s,
/// each changing one value.
fn names_and_ifs_work(n: usize) -> u64 {
    let mut src = String::from(
        "@kernel(grid=(cdiv(N, 1024),), num_warps=1)\n\
         def many(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    \
         i = program_id(0) * 1024\n    v = load(x[i : i + 1024])\n    a = v\n",
    );
    for k in 0..n {
        src += &format!("    b{k} = v + {k}.5\n");
    }
    for k in 0..n {
        src += &format!("    if i > {k}:\n        a = a + b{k}\n");
    }
    src += "    store(out[i : i + 1024], a)\n";
    counted_lowering_work("/t/many.tsr", src)
}

/// The work of lowering a kernel with a dead chain of `n` integer `**`, one
/// statement each.
fn dead_chain_work(n: usize) -> u64 {
    let mut src = String::from(
        "@kernel(grid=(1,), num_warps=1)\n\
         def dead(x: Tensor[32, i32], out: Tensor[32, i32]):\n    \
         i = load(x[0 : 32])\n    d = i\n",
    );
    for _ in 0..n {
        src += "    d = d ** i\n";
    }
    src += "    store(out[0 : 32], i)\n";
    counted_lowering_work("/t/dead.tsr", src)
}

#[test]
fn dead_code_removal_work_grows_linearly_with_a_dead_chain() {
    // Removing one dead op per pass to a fixpoint made a dead chain of n ops
    // cost n passes over the kernel: 400 terms about four times 200.
    let small = dead_chain_work(200);
    let large = dead_chain_work(400);
    let ratio = large as f64 / small as f64;
    assert!(
        ratio < 2.3,
        "a dead chain of 200 took {small} steps, 400 took {large} ({ratio:.2}x)"
    );
}

#[test]
fn lowering_work_grows_linearly_with_names_and_ifs() {
    // Counted steps, not time; the environment's work is the bindings it
    // copies or rolls back. Copying every name in scope for each `if` made
    // 400 names and `if`s cost about four times 200.
    let small = names_and_ifs_work(200);
    let large = names_and_ifs_work(400);
    let ratio = large as f64 / small as f64;
    assert!(
        ratio < 2.2,
        "200 names and ifs took {small} steps, 400 took {large} ({ratio:.2}x)"
    );
}

/// The work of lowering a nest of `n` loops (`for` and `while` in turn),
/// each changing a value carried out of the nest.
fn nest_work(n: usize) -> u64 {
    let mut src = String::from(
        "@kernel(grid=(cdiv(N, 1024),), num_warps=1)\n\
         def nest(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    \
         i = program_id(0) * 1024\n    a = load(x[i : i + 1024])\n    c = 0\n",
    );
    for k in 0..n {
        let ind = " ".repeat(k + 4);
        if k % 2 == 0 {
            src += &format!("{ind}for j{k} in range(4):\n");
        } else {
            src += &format!("{ind}while c < {k}:\n{ind} c = c + 1\n");
        }
        src += &format!("{ind} a = a + 1.0\n");
    }
    src += "    store(out[i : i + 1024], a)\n";
    counted_lowering_work("/t/nest.tsr", src)
}

#[test]
fn lowering_work_grows_linearly_with_loop_depth() {
    // Counted steps, not time. Asking every loop level for the jumps of the
    // whole nest inside it made 200 levels cost about eight times 100.
    let (small, large) =
        crate::stack::with_stack(|| (nest_work(100), nest_work(200))).expect("a thread");
    let ratio = large as f64 / small as f64;
    assert!(
        ratio < 2.3,
        "100 nested loops took {small} steps, 200 took {large} ({ratio:.2}x)"
    );
}

/// Masks that a loop iteration decides, in kernels written as a user would
/// (`tests/numerics/attention.tsr`, whose numerics the tests crate checks):
/// the causal loop stops at the diagonal, the window loop starts at the
/// window, each mask runs behind uniform branches (past the cut iterations,
/// the causal mask spelled `where(col > row, -inf, s)` is tested for being
/// all-false), and a loop whose masked blocks still change its result keeps
/// every iteration.
#[test]
fn user_masked_loops() {
    const SRC: &str = include_str!("../../../../tests/numerics/attention.tsr");
    let spec = Specialization::new().with("D", 64);
    for (name, r) in lower_file("/t/attention.tsr", SRC, &spec) {
        let k = r.unwrap_or_else(|d| panic!("{name}: {d:#?}"));
        let text = k.dump();
        insta::assert_snapshot!(format!("masks_{name}"), text);
        let for_line = text
            .lines()
            .find(|l| l.contains(" = for "))
            .expect("a loop");
        // `for %iv = LO to HI step ...`: HI is a clamped bound (not the dim
        // `S`, `%0`) only where blocks are skipped.
        let hi = for_line
            .split(" to ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .expect("a bound");
        let lo = for_line
            .split(" = for ")
            .nth(1)
            .and_then(|t| t.split(" to ").next())
            .and_then(|t| t.split(" = ").nth(1))
            .expect("a start");
        match name.as_str() {
            "causal_attn" => {
                assert_ne!(hi, "%0", "{text}");
                assert_eq!(text.matches("if %").count(), 2, "{text}");
            }
            "window_attn" => {
                assert_ne!(hi, "%0", "{text}");
                assert_ne!(lo, "%4", "{text}");
                assert_eq!(text.matches("if %").count(), 1, "{text}");
            }
            "masked_sum" => {
                // Nothing skipped; a branch for the all-true blocks and one
                // for the all-false ones (the select then yields its `b`).
                assert_eq!(hi, "%0", "{text}");
                assert_eq!(text.matches("if %").count(), 2, "{text}");
            }
            other => panic!("unexpected kernel {other}"),
        }
    }
}

#[test]
fn an_added_dot_accumulates_in_place() {
    // `x + dot(a, b)` (either side) becomes `dot(a, b, x)`; a dot whose
    // result is used twice, or added to a tile of another type, stays.
    let src = "@kernel(grid=(1,), num_warps=4)
def k(a: Tensor[64, 32, f16], b: Tensor[32, 64, f16], x: Tensor[64, 64, f32], o: Tensor[64, 64, f32], p: Tensor[64, 64, f32]):
    t = load(x[0 : 64, 0 : 64]) * 2.0
    d = dot(load(a[0 : 64, 0 : 32]), load(b[0 : 32, 0 : 64]))
    store(o[0 : 64, 0 : 64], dot(load(a[0 : 64, 0 : 32]), load(b[0 : 32, 0 : 64])) + t)
    store(p[0 : 64, 0 : 64], d + d * t)
";
    let k = lowered("/t/acc.tsr", src, &Specialization::new(), "k");
    let dots: Vec<_> = k
        .body
        .ops
        .iter()
        .filter_map(|o| match &o.kind {
            OpKind::Dot { acc, .. } => Some(*acc),
            _ => None,
        })
        .collect();
    assert_eq!(dots.len(), 2, "{}", k.dump());
    assert!(dots.iter().any(Option::is_some), "{}", k.dump());
    assert!(dots.iter().any(Option::is_none), "{}", k.dump());
}
