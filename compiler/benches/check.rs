//! `cargo bench -p tessera-compiler --bench check`
//!
//! * `cold`: a new database, `set_source` of a generated 10,000-line file, and
//!   every diagnostic of it (parse + check of every item).
//! * `edit`: the same file already checked; one character changes inside one
//!   function's body, then every diagnostic again. Two texts alternate so that
//!   every iteration is a real edit.

use tessera::db::Database;

fn main() {
    let text = generate(10_000);
    let mut db = Database::new();
    let file = db.set_source("bench.tsr", text.clone());
    let diags = db.diagnostics(file);
    let errors = diags.iter().filter(|d| d.is_error()).count();
    eprintln!(
        "generated file: {} lines, {} bytes, {} items, {} diagnostics ({} errors)",
        text.lines().count(),
        text.len(),
        tessera::db::file_items(&db, file).items.len(),
        diags.len(),
        errors
    );
    if let Some(d) = diags.first() {
        eprintln!("first diagnostic: {} {} at {:?}", d.code, d.message, d.span);
    }
    divan::main();
}

/// One group of items, numbered `i`: a const, three kernels in the style of the
/// brief's reference programs, and whole-tensor functions calling them.
fn group(i: usize) -> String {
    let bm = [64, 128][i % 2];
    let bn = [64, 128, 256][i % 3];
    let warps = [4, 8][i % 2];
    let block = [256, 512, 1024][i % 3];
    format!(
        r#"const BLOCK_{i} = {block}

@kernel(grid=(cdiv(N, BLOCK_{i}),), num_warps={warps})
def vadd_{i}(x: Tensor["N", f32], y: Tensor["N", f32], out: Tensor["N", f32]):
    i = program_id(0) * BLOCK_{i}
    store(out[i : i + BLOCK_{i}], load(x[i : i + BLOCK_{i}]) + load(y[i : i + BLOCK_{i}]))

@kernel(grid=(M,), num_warps={warps})
def softmax_rows_{i}(x: Tensor["M", "N", f32], out: Tensor["M", "N", f32], BLOCK: const = {block}):
    row = program_id(0)
    v = load(x[row, 0 : BLOCK], other=-inf)
    e = exp(v - max(v, axis=0))
    store(out[row, 0 : BLOCK], e / sum(e, axis=0))

@kernel(grid=(cdiv(M, BM), cdiv(N, BN)), num_warps=8, num_stages=3)
def gemm_{i}(A: Tensor["M", "K", f16], B: Tensor["K", "N", f16], C: Tensor["M", "N", f32],
         BM: const = {bm}, BN: const = {bn}, BK: const = 32):
    m0 = program_id(0) * BM
    n0 = program_id(1) * BN
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        acc = dot(load(A[m0 : m0 + BM, k : k + BK]), load(B[k : k + BK, n0 : n0 + BN]), acc)
    store(C[m0 : m0 + BM, n0 : n0 + BN], acc)

def scaled_sum_{i}(a: Tensor["M", "N", f32], b: Tensor["M", "N", f32]) -> Tensor["M", "N", f32]:
    return a * 0.5 + b

def mlp_{i}(x: Tensor["B", "D", f32], w: Tensor["D", "H", f32]) -> Tensor["B", "H", f32]:
    h = matmul(x, w)
    return softmax(h, dim=-1) * 0.5

def launch_{i}(x: Tensor["N", f32], y: Tensor["N", f32], out: Tensor["N", f32]):
    vadd_{i}(x, y, out)

def pipeline_{i}(a: Tensor["M", "K", f16], b: Tensor["K", "N", f16], c: Tensor["M", "N", f32]):
    gemm_{i}(a, b, c)

"#
    )
}

/// A file of at least `lines` lines made of numbered groups.
fn generate(lines: usize) -> String {
    let mut text = String::from("# generated for the check benchmark\n\n");
    let mut i = 0;
    while text.lines().count() < lines {
        text.push_str(&group(i));
        i += 1;
    }
    text
}

/// The file, and the same file with one character changed inside the body of
/// the `scaled_sum` in the middle of it.
fn edit_pair() -> (String, String) {
    let text = generate(10_000);
    let groups = text.matches("def scaled_sum_").count();
    let marker = format!("def scaled_sum_{}(", groups / 2);
    let at = text.find(&marker).expect("middle function")
        + text[text.find(&marker).unwrap()..].find("0.5").unwrap();
    let mut edited = text.clone();
    edited.replace_range(at..at + 3, "0.7");
    (text, edited)
}

#[divan::bench(sample_count = 20)]
fn cold(bencher: divan::Bencher) {
    let text = generate(10_000);
    bencher
        .with_inputs(|| text.clone())
        .bench_local_values(|text| {
            let mut db = Database::new();
            let file = db.set_source("bench.tsr", text);
            let n = db.diagnostics(file).len();
            (n, db)
        });
}

#[divan::bench(sample_count = 100)]
fn edit(bencher: divan::Bencher) {
    let (a, b) = edit_pair();
    let mut db = Database::new();
    let file = db.set_source("bench.tsr", a.clone());
    let _ = db.diagnostics(file);
    let mut flip = false;
    bencher
        .with_inputs(|| {
            flip = !flip;
            if flip {
                b.clone()
            } else {
                a.clone()
            }
        })
        .bench_local_values(|text| {
            db.set_source("bench.tsr", text);
            db.diagnostics(file).len()
        });
}
