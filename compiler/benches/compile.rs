//! `cargo bench -p tessera-compiler --bench compile`
//!
//! The whole pipeline, text to PTX, for the brief's kernels: gemm
//! (examples/gemm.tsr) and flash attention (examples/flash_attn.tsr, `-D D=64`
//! and `-D D=128`), for sm_70, sm_80 and sm_90.
//!
//! * `cold`: a new database; `set_source`, check, Tile IR, Target IR, PTX.
//! * `warm`: the same database after one compile: every query (check, Tile IR,
//!   Target IR, PTX) answers from salsa's cache.
//!
//! Every iteration verifies it produced a PTX `.entry`, so a pipeline that
//! stops early cannot pass for a fast one.

use tessera::db::{ptx, Database, SourceFile};
use tessera::ir::tile::Specialization;
use tessera::target::Arch;

const GEMM: &str = include_str!("../../examples/gemm.tsr");
const FLASH: &str = include_str!("../../examples/flash_attn.tsr");

fn main() {
    divan::main();
}

/// `(name, text, D)` of each benchmarked kernel.
const CASES: [(&str, &str, Option<i64>); 3] = [
    ("gemm", GEMM, None),
    ("flash_attn_d64", FLASH, Some(64)),
    ("flash_attn_d128", FLASH, Some(128)),
];

const ARCHS: [Arch; 3] = [Arch::Sm70, Arch::Sm80, Arch::Sm90];

fn spec(d: Option<i64>) -> Specialization {
    match d {
        Some(d) => Specialization::new().with("D", d),
        None => Specialization::new(),
    }
}

/// Check, Tile IR, Target IR and PTX of every kernel of `file` (the `db::ptx`
/// query); the PTX text.
fn compile(db: &Database, file: SourceFile, spec: &Specialization) -> String {
    assert!(
        !db.diagnostics(file).iter().any(|d| d.is_error()),
        "the benchmarked file has errors"
    );
    let ptx = ptx(db, file, db.options(), spec.clone())
        .as_ref()
        .unwrap_or_else(|d| panic!("no PTX: {d:?}"))
        .clone();
    assert!(ptx.contains(".entry"), "no kernel in the PTX");
    ptx
}

fn args() -> Vec<(usize, Arch)> {
    (0..CASES.len())
        .flat_map(|c| ARCHS.map(|a| (c, a)))
        .collect()
}

struct Case(usize, Arch);

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", CASES[self.0].0, self.1)
    }
}

#[divan::bench(args = args().into_iter().map(|(c, a)| Case(c, a)), sample_count = 30)]
fn cold(bencher: divan::Bencher, case: &Case) {
    let (_, text, d) = CASES[case.0];
    let spec = spec(d);
    bencher.bench_local(|| {
        let mut db = Database::new();
        db.set_arch(case.1);
        let file = db.set_source("bench.tsr", text.to_string());
        compile(&db, file, &spec).len()
    });
}

#[divan::bench(args = args().into_iter().map(|(c, a)| Case(c, a)), sample_count = 100)]
fn warm(bencher: divan::Bencher, case: &Case) {
    let (_, text, d) = CASES[case.0];
    let spec = spec(d);
    let mut db = Database::new();
    db.set_arch(case.1);
    let file = db.set_source("bench.tsr", text.to_string());
    compile(&db, file, &spec);
    bencher.bench_local(|| compile(&db, file, &spec).len());
}
