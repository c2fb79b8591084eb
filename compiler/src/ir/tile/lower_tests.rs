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
            // The causal mask is a select inside the loop, only when causal.
            assert_eq!(text.contains("select"), causal == 1, "{text}");
            // `end = min(S, m0 + BM) if causal else S` folds on the const.
            assert_eq!(text.contains(" min "), causal == 1, "{text}");
            assert!(!text.contains("if %"), "{text}");
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
