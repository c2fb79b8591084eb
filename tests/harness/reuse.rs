//! Salsa reuse: an edit inside one function's body re-parses and re-checks only
//! that function, even when the edit moves every later function in the file; an
//! edit to one kernel recomputes only that kernel's Tile IR, Target IR and PTX.
//! Read from the database's event log (`query(Id(..))` per executed query).

use salsa::plumbing::AsId;
use tessera::db::{file_items, Database, SourceFile};
use tessera::ir::tile::Specialization;

const PROGRAM: &str = r#"const BLOCK = 1024

@kernel(grid=(cdiv(N, BLOCK),), num_warps=4)
def vadd(x: Tensor["N", f32], y: Tensor["N", f32], out: Tensor["N", f32]):
    i = program_id(0) * BLOCK
    store(out[i : i + BLOCK], load(x[i : i + BLOCK]) + load(y[i : i + BLOCK]))

def scaled_sum(a: Tensor["M", "N", f32], b: Tensor["M", "N", f32]) -> Tensor["M", "N", f32]:
    return a * 0.5 + b

def twice(a: Tensor["M", "N", f32]) -> Tensor["M", "N", f32]:
    return scaled_sum(a, a)

def broken(a: Tensor["M", f32]) -> Tensor["M", f32]:
    return a + missing_name
"#;

fn executed<'a>(log: &'a [String], query: &str) -> Vec<&'a str> {
    let prefix = format!("{query}(");
    log.iter()
        .filter(|e| e.starts_with(&prefix))
        .map(String::as_str)
        .collect()
}

/// The `parse_item(Id(..))` log entry of the item whose text contains `needle`.
fn parse_key_of(db: &Database, file: SourceFile, needle: &str) -> String {
    let items = &file_items(db, file).items;
    let matching: Vec<_> = items
        .iter()
        .filter(|(s, _)| s.text(db).contains(needle))
        .collect();
    assert_eq!(matching.len(), 1, "exactly one item contains {needle:?}");
    format!("parse_item({:?})", matching[0].0.as_id())
}

fn fresh_diagnostics(text: &str) -> Vec<tessera::diag::Diagnostic> {
    let mut db = Database::with_event_log();
    let file = db.set_source("reuse.tsr", text.to_string());
    db.diagnostics(file).to_vec()
}

/// Applies `from → to` (which must occur once), recomputes, and checks that
/// exactly one item was re-parsed and re-checked: the one now containing `to`.
fn edit_and_check(db: &mut Database, file: SourceFile, text: &mut String, from: &str, to: &str) {
    assert_eq!(text.matches(from).count(), 1, "{from:?} occurs once");
    *text = text.replace(from, to);
    db.start_event_log();
    db.set_source("reuse.tsr", text.clone());
    let diags = db.diagnostics(file).to_vec();
    let log = db.take_event_log();

    let parsed = executed(&log, "parse_item");
    let checked = executed(&log, "check_item");
    assert_eq!(
        parsed.len(),
        1,
        "one item re-parsed after {from:?} -> {to:?}; log: {log:#?}"
    );
    assert_eq!(
        checked.len(),
        1,
        "one item re-checked after {from:?} -> {to:?}; log: {log:#?}"
    );
    assert_eq!(
        parsed[0],
        parse_key_of(db, file, to),
        "the edited item is the one re-parsed"
    );

    // Reused results, shifted, equal a from-scratch check of the new text.
    assert_eq!(
        diags,
        fresh_diagnostics(text),
        "incremental diagnostics equal fresh ones"
    );
}

#[test]
fn an_edit_inside_one_body_rechecks_only_that_item() {
    let mut db = Database::with_event_log();
    let mut text = PROGRAM.to_string();
    db.start_event_log();
    let file = db.set_source("reuse.tsr", text.clone());
    let first = db.diagnostics(file).to_vec();
    let log = db.take_event_log();
    let items = file_items(&db, file).items.len();
    assert!(items >= 5, "the file splits into its 5 items, got {items}");
    assert_eq!(
        executed(&log, "check_item").len(),
        items,
        "cold: every item checked once"
    );
    assert!(
        first.iter().any(|d| d.code == "E0201"),
        "the program's one error (unknown name) is reported: {first:#?}"
    );
    let old_checks: Vec<String> = executed(&log, "check_item")
        .iter()
        .map(|s| s.to_string())
        .collect();

    // Same length: nothing moves.
    edit_and_check(&mut db, file, &mut text, "a * 0.5 + b", "a * 0.7 + b");
    // One byte longer: `twice` and `broken` move by one byte but are reused.
    edit_and_check(&mut db, file, &mut text, "a * 0.7 + b", "a * 0.75 + b");
    // In the first function: everything after it moves.
    edit_and_check(
        &mut db,
        file,
        &mut text,
        "i = program_id(0) * BLOCK\n",
        "i = program_id(0) * BLOCK * 1\n",
    );

    // The broken function's diagnostic moved with it.
    let now = db.diagnostics(file);
    let e0201 = now
        .iter()
        .find(|d| d.code == "E0201")
        .expect("still reported");
    assert_eq!(&text[e0201.span.range()], "missing_name");

    // An edit elsewhere never re-ran the old per-item checks either.
    db.start_event_log();
    db.set_source("reuse.tsr", text.clone());
    let _ = db.diagnostics(file);
    let log = db.take_event_log();
    assert!(
        executed(&log, "check_item").is_empty(),
        "no edit, no work: {log:#?}"
    );
    assert!(!old_checks.is_empty());
}

/// Two kernels and a constant: edits to one kernel, or to the constant's
/// comment and blank lines, must leave the other kernels' code untouched.
const KERNELS: &str = r#"const BLOCK = 256

@kernel(grid=(cdiv(N, BLOCK),), num_warps=4)
def vadd(x: Tensor["N", f32], y: Tensor["N", f32], out: Tensor["N", f32]):
    i = program_id(0) * BLOCK
    store(out[i : i + BLOCK], load(x[i : i + BLOCK]) + load(y[i : i + BLOCK]))

@kernel(grid=(cdiv(N, BLOCK),), num_warps=4)
def vscale(x: Tensor["N", f32], out: Tensor["N", f32]):
    i = program_id(0) * BLOCK
    store(out[i : i + BLOCK], load(x[i : i + BLOCK]) * 2.0)
"#;

/// The PTX of every kernel of the file (Tile IR, Target IR and each kernel's
/// PTX through their queries).
fn file_ptx(db: &Database, file: SourceFile) -> String {
    tessera::db::ptx(db, file, db.options(), Specialization::new())
        .clone()
        .unwrap_or_else(|d| panic!("no PTX: {d:#?}"))
}

/// How many times each kernel query ran while `text` replaced the file.
fn kernel_queries_after(db: &mut Database, file: SourceFile, text: &str) -> [usize; 3] {
    db.start_event_log();
    db.set_source("kernels.tsr", text.to_string());
    let incremental = file_ptx(db, file);
    let log = db.take_event_log();
    let mut fresh = Database::new();
    let fresh_file = fresh.set_source("kernels.tsr", text.to_string());
    assert_eq!(
        incremental,
        file_ptx(&fresh, fresh_file),
        "incremental PTX equals a fresh compile"
    );
    ["tile_ir", "target_ir", "kernel_ptx"].map(|q| executed(&log, q).len())
}

#[test]
fn an_edit_to_one_kernel_recompiles_only_that_kernel() {
    let mut db = Database::with_event_log();
    db.start_event_log();
    let file = db.set_source("kernels.tsr", KERNELS.to_string());
    let cold = file_ptx(&db, file);
    let log = db.take_event_log();
    assert!(cold.contains(".entry vadd(") && cold.contains(".entry vscale("));
    for q in ["tile_ir", "target_ir", "kernel_ptx"] {
        assert_eq!(executed(&log, q).len(), 2, "cold: {q} once per kernel");
    }

    // The edited kernel's item text is a new key, so the one run of each query
    // is that kernel's: `vadd`'s Tile IR, Target IR and PTX are reused.
    let text = KERNELS.replace("* 2.0)", "* 3.0)");
    assert_eq!(
        kernel_queries_after(&mut db, file, &text),
        [1, 1, 1],
        "only vscale is recompiled"
    );
    // Longer: `vscale` moves, the edit is in `vadd`.
    let text = text.replace(
        "program_id(0) * BLOCK\n    store(out[i : i + BLOCK], load(x[i : i + BLOCK]) +",
        "program_id(0) * BLOCK * 1\n    store(out[i : i + BLOCK], load(x[i : i + BLOCK]) +",
    );
    assert_eq!(
        kernel_queries_after(&mut db, file, &text),
        [1, 1, 1],
        "only vadd is recompiled"
    );
    // A comment and blank lines (they belong to the constant's item) move both
    // kernels but change neither, nor the module's scope.
    let text = text.replace(
        "const BLOCK = 256\n",
        "const BLOCK = 256  # one tile per block\n\n\n# Two kernels follow.\n",
    );
    assert_eq!(
        kernel_queries_after(&mut db, file, &text),
        [0, 0, 0],
        "a comment recompiles no kernel"
    );
    // The constant's value is a different scope: both kernels are recompiled.
    let text = text.replace("const BLOCK = 256", "const BLOCK = 128");
    assert_eq!(
        kernel_queries_after(&mut db, file, &text),
        [2, 2, 2],
        "a constant both kernels use recompiles both"
    );
}
