//! Editor queries on small files (the language server's end-to-end test in
//! repl/tests/lsp.rs covers the protocol side).

use super::complete::{completions, open_call, signature_help, CompletionKind};
use super::tokens::{comments, semantic_tokens, TokenType};
use super::*;
use crate::db::Database;

const KERNEL: &str = "# tiles\nconst B = 64\n\n@kernel(grid=(cdiv(N, BLOCK),))\ndef k(x: Tensor[\"N\", f32], BLOCK: const = 128):\n    i = program_id(0) * BLOCK\n    t = load(x[i : i + BLOCK])\n    store(x[i : i + BLOCK], t * 2.0 + t)\n";

fn db_with(text: &str) -> (Database, SourceFile) {
    let mut db = Database::new();
    let file = db.set_source("/v/k.tsr", text.to_string());
    (db, file)
}

fn at(text: &str, needle: &str) -> u32 {
    text.find(needle).unwrap_or_else(|| panic!("{needle:?}")) as u32
}

#[test]
fn hover_shows_concrete_tile_shapes_and_operators() {
    let (db, file) = db_with(KERNEL);
    let h = hover(
        &db,
        file,
        db.options(),
        &Specialization::new(),
        at(KERNEL, "t = load"),
    )
    .unwrap();
    assert!(h.markdown.contains("t: Tile[128, f32]"), "{}", h.markdown);
    // An operator: the type of the whole binary expression.
    let h = hover(
        &db,
        file,
        db.options(),
        &Specialization::new(),
        at(KERNEL, "* 2.0"),
    )
    .unwrap();
    assert!(h.markdown.contains("Tile[128, f32]"), "{}", h.markdown);
    // A dim in scope.
    let h = hover(
        &db,
        file,
        db.options(),
        &Specialization::new(),
        at(KERNEL, "cdiv(N") + 5,
    )
    .unwrap();
    assert!(h.markdown.contains("N:"), "{}", h.markdown);
}

#[test]
fn definitions_of_locals_dims_and_consts() {
    let (db, file) = db_with(KERNEL);
    let use_of_block = at(KERNEL, "* BLOCK") + 2;
    let (_, t) = definition(&db, file, use_of_block).unwrap();
    assert_eq!(
        t,
        Target::At(Location {
            file,
            span: Span::new(at(KERNEL, "BLOCK: const"), at(KERNEL, "BLOCK: const") + 5)
        })
    );
    let n = at(KERNEL, "\"N\"") + 1;
    let (_, t) = definition(&db, file, at(KERNEL, "cdiv(N") + 5).unwrap();
    assert_eq!(
        t,
        Target::At(Location {
            file,
            span: Span::new(n, n + 1)
        })
    );
    let refs = references(&db, file, at(KERNEL, "t = load"), &[file]);
    assert_eq!(refs.len(), 3, "{refs:?}");
}

#[test]
fn completion_contexts() {
    let text = format!("{KERNEL}\nimport std.nn as nn\n\ndef f(a: Tensor[\"M\", f32]) -> Tensor[\"M\", f32]:\n    return nn.\n");
    let (db, file) = db_with(&text);
    let off = at(&text, "return nn.") + "return nn.".len() as u32;
    let items = completions(&db, file, db.options(), off);
    assert!(
        items
            .iter()
            .any(|c| c.label == "softmax" && c.kind == CompletionKind::Function),
        "{items:?}"
    );
    let off = at(&text, "    t = load");
    let items = completions(&db, file, db.options(), off + 4);
    for (label, kind) in [
        ("i", CompletionKind::Local),
        ("N", CompletionKind::Dim),
        ("x", CompletionKind::Param),
        ("program_id", CompletionKind::Builtin),
        ("bf16", CompletionKind::Type),
    ] {
        assert!(
            items.iter().any(|c| c.label == label && c.kind == kind),
            "{label}: {items:?}"
        );
    }
    // `t` is bound below the cursor.
    assert!(!items.iter().any(|c| c.label == "t"));
    let deco = "@kernel(num";
    let (db, file) = db_with(deco);
    let items = completions(&db, file, db.options(), deco.len() as u32);
    assert!(items.iter().any(|c| c.label == "num_warps="), "{items:?}");
}

#[test]
fn open_calls_and_signatures() {
    let c = open_call("    y = max(x, axis=").unwrap();
    assert_eq!(
        (c.callee.as_str(), c.arg_index, c.keyword.as_deref()),
        ("max", 1, Some("axis"))
    );
    let c = open_call("k[(4,)](a, f(b, c), ").unwrap();
    assert_eq!((c.callee.as_str(), c.arg_index), ("k", 2));
    assert!(open_call("x = (1 + 2)").is_none());
    // A call continues over line breaks of any kind; a blank line ends the scan.
    for brk in ["\n", "\r\n", "\r"] {
        let c = open_call(&format!("y = max(x,{brk}    axis=")).unwrap();
        assert_eq!((c.callee.as_str(), c.arg_index), ("max", 1));
        assert_eq!(
            open_call(&format!("y = max(x,{brk}{brk}z = g("))
                .unwrap()
                .callee,
            "g"
        );
        assert!(open_call(&format!("y = max(x,{brk}{brk}z = 1")).is_none());
    }
    let text =
        "def f(a: Tensor[\"M\", f32], n: const = 4) -> Tensor[\"M\", f32]:\n    return f(a, ";
    let (db, file) = db_with(text);
    let s = signature_help(&db, file, text.len() as u32).unwrap();
    assert_eq!(
        s.label,
        "f(a: Tensor[M, f32], n: const = 4) -> Tensor[M, f32]"
    );
    assert_eq!(s.active, 1);
    assert_eq!(&s.label[s.params[1].0..s.params[1].1], "n: const = 4");
}

#[test]
fn semantic_tokens_and_comments() {
    let (db, file) = db_with(KERNEL);
    let toks = semantic_tokens(&db, file);
    let kind_at = |needle: &str| {
        toks.iter()
            .find(|t| t.span.start == at(KERNEL, needle))
            .map(|t| t.ty)
    };
    assert_eq!(kind_at("# tiles"), Some(TokenType::Comment));
    assert_eq!(kind_at("kernel"), Some(TokenType::Decorator));
    assert_eq!(kind_at("k(x"), Some(TokenType::Function));
    assert_eq!(kind_at("f32"), Some(TokenType::Type));
    assert_eq!(kind_at("program_id"), Some(TokenType::Function));
    assert_eq!(kind_at("x[i"), Some(TokenType::Parameter));
    assert!(toks.windows(2).all(|w| w[0].span.end <= w[1].span.start));
    assert_eq!(comments("x = \"#\"  # real\n"), vec![Span::new(9, 15)]);
}

#[test]
fn inlay_hints_repeat_the_report() {
    let (db, file) = db_with(KERNEL);
    let hints = inlay_hints(
        &db,
        file,
        db.options(),
        &Specialization::new(),
        0,
        KERNEL.len() as u32,
    );
    let (_, item, start) = file_kernels(&db, file)[0].clone();
    let r = kernel_estimate(&db, item, start, db.options(), &Specialization::new()).unwrap();
    let estimate = hints.iter().find(|h| !h.is_type).unwrap();
    assert_eq!(estimate.label, estimate_line(&r));
    assert!(
        estimate.label.starts_with(&format!("≈ {} regs · ", r.regs))
            && estimate.label.ends_with("(sm_90)")
    );
    assert!(hints.iter().any(|h| h.is_type
        && h.label == ": Tile[128, f32]"
        && h.offset == at(KERNEL, "t = load") + 1));
    assert_eq!(format_bytes(49152), "48 KiB");
    assert_eq!(format_bytes(1536), "1.5 KiB");
    assert_eq!(format_bytes(0), "0 B");
}

/// A kernel specialised on a tensor dim (`:` over `D`): without a value its
/// hint says what it needs; with one, the estimate of `tsrc report -D`.
#[test]
fn a_kernel_that_needs_a_define_says_so() {
    const SPECIALISED: &str = "@kernel(grid=(1,))\ndef rows(x: Tensor[\"M\", \"D\", f32]):\n    t = load(x[0:16, :])\n    store(x[0:16, :], t * 2.0)\n";
    let (db, file) = db_with(SPECIALISED);
    let len = SPECIALISED.len() as u32;
    let none = Specialization::new();
    let hints = inlay_hints(&db, file, db.options(), &none, 0, len);
    let note = hints.iter().find(|h| !h.is_type).unwrap();
    assert_eq!(note.label, "≈ needs D (tessera.defines)");
    let h = hover(&db, file, db.options(), &none, at(SPECIALISED, "rows")).unwrap();
    assert!(
        h.markdown.contains("No resource estimate: E0511")
            && h.markdown.contains("`tessera.defines`"),
        "{}",
        h.markdown
    );
    let d64 = Specialization::new().with("D", 64);
    let hints = inlay_hints(&db, file, db.options(), &d64, 0, len);
    let (_, item, start) = file_kernels(&db, file)[0].clone();
    let r = kernel_estimate(&db, item, start, db.options(), &d64).unwrap();
    let note = hints.iter().find(|h| !h.is_type).unwrap();
    assert_eq!(note.label, estimate_line(&r));
    let h = hover(&db, file, db.options(), &d64, at(SPECIALISED, "rows")).unwrap();
    assert!(
        h.markdown.contains("as `tsrc report -D D=64`"),
        "{}",
        h.markdown
    );
}

/// An error in one kernel hides only that kernel's estimate.
#[test]
fn a_kernel_keeps_its_estimate_while_another_has_an_error() {
    const GOOD: &str = "@kernel(grid=(cdiv(N, 256),), num_warps=4)
def good(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):
    i = program_id(0) * 256
    store(out[i : i + 256], load(x[i : i + 256]) * 2.0)
";
    let estimates = |text: &str| -> Vec<(u32, String)> {
        let (db, file) = db_with(text);
        let none = Specialization::new();
        inlay_hints(&db, file, db.options(), &none, 0, text.len() as u32)
            .into_iter()
            .filter(|h| !h.is_type)
            .map(|h| (h.offset, h.label))
            .collect()
    };
    let clean = estimates(GOOD);
    assert_eq!(clean.len(), 1, "{clean:?}");
    assert!(clean[0].1.starts_with("≈ ") && clean[0].1.contains("regs"));
    let broken = "\n\n@kernel(grid=(1,), num_warps=4)
def broken(x: Tensor[\"N\", f32]):
    v = laod(x[0 : 128])
";
    // The same estimate at the same place; none for the broken kernel.
    assert_eq!(estimates(&format!("{GOOD}{broken}")), clean);
    // An error in the kernel itself: no estimate.
    assert_eq!(estimates(&GOOD.replace("load(x", "laod(x")), vec![]);
}

#[test]
fn hover_on_a_generic_call_shows_its_bound_dtype_and_run() {
    let src = r#"def scale[T: float](x: Tensor["*B", "N", T], k: f32) -> Tensor["*B", "N", T]:
    return x * k

def f(a: Tensor["Z", "M", "N", bf16]) -> Tensor["Z", "M", "N", bf16]:
    y = scale(a, 2.0)
    return y
"#;
    let (db, file) = db_with(src);
    let spec = Specialization::new();
    let h = hover(&db, file, db.options(), &spec, at(src, "scale(a")).unwrap();
    assert!(
        h.markdown
            .contains("def scale[T: float](x: Tensor[*B, N, T], k: f32) -> Tensor[*B, N, T]"),
        "{}",
        h.markdown
    );
    assert!(
        h.markdown
            .contains("This call binds `T = bf16, *B = [Z, M]`"),
        "{}",
        h.markdown
    );
    // The binding's type is the instance's.
    let h = hover(&db, file, db.options(), &spec, at(src, "y = scale")).unwrap();
    assert!(
        h.markdown.contains("y: Tensor[Z, M, N, bf16]"),
        "{}",
        h.markdown
    );
    // In the body, the run stays opaque and the dtype is the variable `T`.
    let h = hover(&db, file, db.options(), &spec, at(src, "x * k")).unwrap();
    assert!(h.markdown.contains("x: Tensor[*B, N, T]"), "{}", h.markdown);
}

#[test]
fn types_in_a_generic_body_name_the_dtype_variables() {
    let src = r#"def g[T: float, U: float, I: int](x: Tensor["*B", "N", T], y: Tensor["N", U], n: Tensor["N", I]) -> Tensor["*B", "N", T]:
    a = x * 2.0
    b = y.to(f32)
    c = y + y
    d = sum(n)
    e = x.to(f32) * 1.0
    return a
"#;
    let (db, file) = db_with(src);
    let spec = Specialization::new();
    let shown = |needle: &str| {
        hover(&db, file, db.options(), &spec, at(src, needle))
            .unwrap()
            .markdown
    };
    for (needle, ty) in [
        ("a = x", "a: Tensor[*B, N, T]"),
        // a conversion to a written dtype keeps it, whichever `U` is
        ("b = y", "b: Tensor[N, f32]"),
        ("c = y", "c: Tensor[N, U]"),
        ("d = sum", "d: Tensor[I]"),
        ("e = x", "e: Tensor[*B, N, f32]"),
    ] {
        let h = shown(needle);
        assert!(h.contains(ty), "{needle}: {h}");
    }
}
