//! Property tests: whatever text arrives (arbitrary unicode, random token
//! sequences, mutated real programs), lexing, parsing and checking never panic,
//! every diagnostic span lies inside the text on character boundaries, every
//! code is in the catalogue, rendering never panics, and an incremental re-check
//! after an edit equals a check from scratch. Programs that check cleanly
//! also lower to Tile IR without a panic, and the IR verifies.

use proptest::prelude::*;
use tessera::db::Database;
use tessera::diag::Diagnostic;
use tessera_tests::fuzzing::exec::assert_well_formed;
use tessera_tests::fuzzing::inputs::collect_tsr;

static SEEDS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Compiler queries run on a `tessera::stack` thread, as in the binaries and the
/// language server: the corpus holds programs nested up to the depth limit,
/// which the test harness's 2 MiB threads cannot walk.
fn check(text: &str) -> Vec<Diagnostic> {
    tessera::stack::with_stack(|| check_here(text)).expect("a query thread")
}

fn check_here(text: &str) -> Vec<Diagnostic> {
    let mut db = Database::new();
    let file = db.set_source("fuzz.tsr", text.to_string());
    let diags = db.diagnostics(file).to_vec();
    assert_well_formed(text, &diags);
    diags
}

/// The language's vocabulary, plus some things that are not in it.
const VOCAB: &[&str] = &[
    "def",
    "return",
    "if",
    "elif",
    "else",
    "for",
    "in",
    "while",
    "break",
    "continue",
    "pass",
    "import",
    "from",
    "as",
    "and",
    "or",
    "not",
    "const",
    "True",
    "False",
    "None",
    "inf",
    "@kernel",
    "@autotune",
    "kernel",
    "grid",
    "num_warps",
    "Tensor",
    "Tile",
    "f32",
    "f16",
    "bf16",
    "i32",
    "bool",
    "f8e4m3",
    "u8",
    "load",
    "store",
    "dot",
    "zeros",
    "full",
    "arange",
    "program_id",
    "cdiv",
    "range",
    "sum",
    "max",
    "exp",
    "where",
    "matmul",
    "softmax",
    "std",
    "std.nn",
    ".T",
    ".to",
    ".shape",
    "x",
    "y",
    "BM",
    "K",
    "\"M\"",
    "\"N\"",
    "\"4*D\"",
    "\"M+1\"",
    "\"",
    "'",
    "0",
    "1",
    "128",
    "0x80",
    "1_024",
    "1.0",
    "1e-5",
    "0.125",
    "1e",
    "0x",
    "+",
    "-",
    "*",
    "/",
    "//",
    "%",
    "**",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    "&",
    "|",
    "~",
    "=",
    "+=",
    "-=",
    "*=",
    "->",
    ":",
    ",",
    ".",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    "@",
    "#",
    "# comment",
    "\\",
    "$",
    "?",
    "é",
    "→",
];

const SEPARATORS: &[&str] = &[
    " ",
    " ",
    " ",
    "",
    "\n",
    "\n    ",
    "\n        ",
    "\n  ",
    "\t",
    "\n\t",
    "\r\n",
    "\r",
    "\r    ",
];

fn token_text() -> impl Strategy<Value = String> {
    prop::collection::vec((0..VOCAB.len(), 0..SEPARATORS.len()), 0..80).prop_map(|toks| {
        let mut s = String::new();
        for (t, sep) in toks {
            s.push_str(VOCAB[t]);
            s.push_str(SEPARATORS[sep]);
        }
        s
    })
}

fn unicode_text() -> impl Strategy<Value = String> {
    let structural = prop::sample::select(vec![
        '\n', '\t', ' ', ' ', '(', ')', '[', ':', '#', '"', '\r', '\\',
    ]);
    prop::collection::vec(prop_oneof![3 => any::<char>(), 2 => structural], 0..200)
        .prop_map(|cs| cs.into_iter().collect())
}

/// Real programs to mutate: the embedded stdlib, `examples/` and every UI case
/// (valid programs and programs with each kind of error).
fn seeds() -> Vec<String> {
    let mut out: Vec<String> = tessera::stdlib::modules()
        .filter_map(tessera::stdlib::source)
        .map(str::to_string)
        .collect();
    let root = tessera_tests::workspace_root();
    let mut paths = Vec::new();
    collect_tsr(&root.join("examples"), &mut paths);
    collect_tsr(&root.join("tests").join("ui"), &mut paths);
    paths.sort();
    for p in paths {
        out.push(std::fs::read_to_string(p).unwrap());
    }
    assert!(out.len() > 10, "there are seed programs");
    out
}

#[derive(Clone, Debug)]
enum Mutation {
    Insert(usize, u8),
    Delete(usize, usize),
    Replace(usize, u8),
    InsertToken(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let byte = prop_oneof![
        4 => prop::sample::select(b" \n\t()[]:,.=#\"'0123456789+-*/@abcxyzMNK_".to_vec()),
        1 => any::<u8>(),
    ];
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(p, b)| Mutation::Insert(p, b)),
        (any::<usize>(), 1usize..12).prop_map(|(p, n)| Mutation::Delete(p, n)),
        (any::<usize>(), byte).prop_map(|(p, b)| Mutation::Replace(p, b)),
        (any::<usize>(), 0..VOCAB.len()).prop_map(|(p, t)| Mutation::InsertToken(p, t)),
    ]
}

fn mutate(seed: &str, muts: &[Mutation]) -> String {
    let mut bytes = seed.as_bytes().to_vec();
    for m in muts {
        let len = bytes.len();
        match *m {
            Mutation::Insert(p, b) => bytes.insert(p % (len + 1), b),
            Mutation::Delete(p, n) if len > 0 => {
                let at = p % len;
                bytes.drain(at..(at + n).min(len));
            }
            Mutation::Delete(..) => {}
            Mutation::Replace(p, b) if len > 0 => bytes[p % len] = b,
            Mutation::Replace(..) => {}
            Mutation::InsertToken(p, t) => {
                let at = p % (len + 1);
                bytes.splice(at..at, VOCAB[t].bytes());
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn arbitrary_unicode_never_panics(text in unicode_text()) {
        check(&text);
    }

    #[test]
    fn token_soup_never_panics(text in token_text()) {
        check(&text);
    }
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn mutated_programs_never_panic_and_recheck_incrementally(
        pick in any::<prop::sample::Index>(),
        muts in prop::collection::vec(mutation(), 1..6),
    ) {
        let seeds = SEEDS.get_or_init(seeds);
        let seed = &seeds[pick.index(seeds.len())];
        let text = mutate(seed, &muts);
        let fresh = check(&text);

        // The same text reached by an edit of an already-checked file.
        let incremental = tessera::stack::with_stack(|| {
            let mut db = Database::new();
            let file = db.set_source("fuzz.tsr", seed.clone());
            let _ = db.diagnostics(file);
            db.set_source("fuzz.tsr", text.clone());
            db.diagnostics(file).to_vec()
        })
        .expect("a query thread");
        prop_assert_eq!(incremental, fresh);
    }
}

#[test]
fn seed_programs_check_without_panic() {
    // Not a property: the seeds themselves must check without a panic.
    for seed in seeds() {
        check(&seed);
    }
}

/// Lowers every kernel of a text that checks without errors, once with the
/// defaults and once with every tensor dim and default-less const set to 64:
/// lowering never panics, its only errors are E0511/E0512 with spans inside
/// the text, and every kernel it produces passes the Tile IR verifier.
fn lower_all(text: &str) -> usize {
    tessera::stack::with_stack(|| lower_all_here(text)).expect("a query thread")
}

fn lower_all_here(text: &str) -> usize {
    use tessera::ir::tile::{verify, Specialization};
    let mut db = Database::new();
    let file = db.set_source("fuzz.tsr", text.to_string());
    if db.diagnostics(file).iter().any(|d| d.is_error()) {
        return 0;
    }
    let mut lowered = 0;
    for (name, item, offset) in tessera::db::file_kernels(&db, file) {
        let mut all64 = Specialization::new();
        if let Some(sig) = tessera::db::item_signature(&db, item) {
            for p in &sig.params {
                if let tessera::check::Ty::Tensor { dims, .. } = &p.ty {
                    for d in dims {
                        for s in d.symbols() {
                            all64.values.insert(s.to_string(), 64);
                        }
                    }
                }
                if p.is_const && !p.has_default {
                    all64.values.insert(p.name.clone(), 64);
                }
            }
        }
        for spec in [Specialization::new(), all64] {
            match tessera::db::tile_ir(&db, item, db.options(), spec) {
                Ok(k) => {
                    let errs = verify(k);
                    assert!(errs.is_empty(), "{name}: {errs:#?}\n{}\n{text}", k.dump());
                    lowered += 1;
                }
                Err(diags) => {
                    let shifted: Vec<Diagnostic> =
                        diags.iter().cloned().map(|d| d.shifted(offset)).collect();
                    assert_well_formed(text, &shifted);
                    for d in &shifted {
                        assert!(
                            // Missing values, unsupported constructs, and tile
                            // bounds that only the specialised sizes rule out.
                            matches!(
                                d.code,
                                "E0511" | "E0512" | "E0405" | "E0406" | "E0413" | "E0315"
                            ),
                            "{name}: lowering error {} {}\n{text}",
                            d.code,
                            d.message
                        );
                    }
                }
            }
        }
    }
    lowered
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn mutated_programs_that_check_lower_and_verify(
        pick in any::<prop::sample::Index>(),
        muts in prop::collection::vec(mutation(), 1..3),
    ) {
        let seeds = SEEDS.get_or_init(seeds);
        let seed = &seeds[pick.index(seeds.len())];
        lower_all(&mutate(seed, &muts));
    }
}

#[test]
fn seed_programs_lower_and_verify() {
    let lowered: usize = seeds().iter().map(|s| lower_all(s)).sum();
    assert!(
        lowered > 40,
        "only {lowered} kernels lowered from the seeds"
    );
}

// ---- The grammar-aware fuzzer (tests/harness/fuzzing, docs/fuzzing.md) ----

use tessera_tests::fuzzing::{driver, exec, gen, inputs, lsp_replay, rng::Rng};

/// The seed of this test run: `TESSERA_FUZZ_SEED`, else the clock (printed,
/// so a failure can be replayed).
fn fuzz_seed() -> u64 {
    std::env::var("TESSERA_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(driver::now_ms)
}

#[test]
fn generated_programs_check_cleanly() {
    let seed = fuzz_seed();
    println!("seed {seed} (TESSERA_FUZZ_SEED={seed} replays it)");
    let n = 150;
    let mut clean = 0;
    let mut first_bad = None;
    for i in 0..n {
        let text = gen::program(&mut Rng::for_input(seed, i));
        let diags = check(&text);
        if diags.iter().any(|d| d.is_error()) {
            first_bad.get_or_insert((text, diags));
        } else {
            clean += 1;
        }
    }
    // The generator writes valid programs so that emission and execution see
    // real ones; a few percent may meet a limit it does not model.
    assert!(
        clean * 100 >= n * 90,
        "only {clean} of {n} generated programs check cleanly (seed {seed}); first:\n{:#?}",
        first_bad
    );
}

/// Every finding of the fuzzer that was fixed is replayed through every stage;
/// every finding still pending names the signature a bounded run matches it by.
#[test]
fn fuzz_regressions_replay() {
    let dir = tessera_tests::workspace_root().join("tests").join("fuzz");
    let tsr = |d: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(d)
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        v.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|e| e == "tsr"));
        v.sort();
        v
    };
    for p in tsr(&dir) {
        let text = std::fs::read_to_string(&p).unwrap();
        let mut counts = exec::Counts::default();
        let r = exec::execute(&text, &exec::Limits::default(), &mut counts, &mut |_| {});
        assert!(r.is_ok(), "{}: {:?}", p.display(), r.err());
    }
    let pending = tsr(&dir.join("pending"));
    let known = driver::known_signatures(&dir.join("pending"));
    assert_eq!(
        known.len(),
        pending.len(),
        "each file of tests/fuzz/pending has one `# fuzz: SIGNATURE` line"
    );
    for k in known {
        let kind = k.split(" in ").next().unwrap_or("");
        assert!(
            ["panic", "stack-overflow", "abort", "out-of-memory", "hang"].contains(&kind)
                || kind.starts_with("signal ")
                || kind.starts_with("exit "),
            "unknown kind in `# fuzz: {k}`"
        );
    }
}

/// The language server's queries on prefixes of every corpus file (every
/// `stride`-th character here; `fuzz --lsp-replay` does every prefix).
#[test]
fn lsp_prefix_replay_sample() {
    let corpus = inputs::Corpus::load(&tessera_tests::workspace_root());
    let mut r = lsp_replay::Replay::default();
    for (name, text) in &corpus.files {
        // About 12 prefixes a file, at offsets that differ from run to run of
        // the file list (sizes differ), all ending at the whole text.
        let stride = (text.chars().count() / 12).max(1);
        if let Err((at, f)) = lsp_replay::replay(text, stride, &mut r) {
            panic!("{name}: prefix of {at} bytes: {}", f.message);
        }
    }
    println!("lsp replay: {} prefixes, {} queries", r.prefixes, r.queries);
    assert!(r.prefixes > 500);
}

/// The fuzzer for a bounded time, two worker processes, every stage; a
/// failure not among the routed findings (tests/fuzz/pending) fails the test.
/// `TESSERA_FUZZ_SECONDS` sets the time (default 40).
#[test]
fn bounded_fuzz_run() {
    let seed = fuzz_seed();
    let seconds: u64 = std::env::var("TESSERA_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let out = std::env::temp_dir().join(format!("tessera-fuzz-test-{}-{seed}", std::process::id()));
    println!(
        "fuzz seed {seed} for {seconds} s (TESSERA_FUZZ_SEED={seed} replays it), findings in {}",
        out.display()
    );
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_fuzz"))
        .args([
            "--seconds",
            &seconds.to_string(),
            "--jobs",
            "2",
            "--seed",
            &seed.to_string(),
        ])
        .args(["--minimize-seconds", "15", "--hang-seconds", "30"])
        .arg("--out")
        .arg(&out)
        .status()
        .expect("the fuzz binary runs");
    assert!(
        status.success(),
        "the fuzzer found new failures (seed {seed}); minimized inputs in {}",
        out.join("crashes").display()
    );
}

/// An input that loops forever ends at its run budget (the executor's
/// interrupt, E0706), on the host and inside a kernel, and is counted.
#[test]
fn run_budget_interrupts_endless_loops() {
    let limits = exec::Limits {
        run_budget: std::time::Duration::from_millis(200),
        ..exec::Limits::default()
    };
    for text in [
        "n = 0\nwhile True:\n    n += 1\n",
        "@kernel(grid=(1,))\ndef spin(x: Tensor[4, f32]):\n    i = 0\n    while i < 1:\n        i = i * 1\n    store(x[0 : 4], load(x[0 : 4]))\n\nx = zeros([4], f32)\nspin(x)\n",
    ] {
        let mut counts = exec::Counts::default();
        let start = std::time::Instant::now();
        exec::execute(text, &limits, &mut counts, &mut |_| {}).unwrap();
        assert_eq!(counts.interrupted, 1, "{text}");
        assert!(start.elapsed() < std::time::Duration::from_secs(20));
    }
}

/// The driver regenerates the input that killed a worker from the seed and
/// its index, so inputs must be a pure function of the two; minimization
/// keeps what makes an input fail.
#[test]
fn inputs_replay_and_minimize() {
    let corpus = inputs::Corpus::load(&tessera_tests::workspace_root());
    for i in 0..40 {
        assert_eq!(inputs::input(7, i, &corpus), inputs::input(7, i, &corpus));
    }
    assert_ne!(
        inputs::input(7, 0, &corpus).0,
        inputs::input(8, 0, &corpus).0
    );
    let text = "x = 1\ny = [0][0][0]\nz = 2\n@kernel\n";
    let small = tessera_tests::fuzzing::minimize::minimize(
        text,
        &mut |t| t.contains("[0][0]"),
        std::time::Duration::from_secs(10),
    );
    assert_eq!(small, "[0][0]");
}

/// A run cut into slices (`--resume`) covers each input once: the second
/// slice starts every worker where the first stopped, and the state adds
/// the slices' counts.
#[test]
fn a_resumed_run_continues_its_input_stream() {
    use tessera_tests::fuzzing::state::RunState;
    let out = std::env::temp_dir().join(format!("tessera-fuzz-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let slice = |extra: &[&str], max: u64| {
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_fuzz"))
            .args(["--seconds", "300", "--jobs", "2", "--seed", "11"])
            .args(["--max-inputs", &max.to_string()])
            .args(extra)
            .arg("--out")
            .arg(&out)
            .status()
            .expect("the fuzz binary runs");
        assert!(status.success());
        RunState::decode(&std::fs::read_to_string(RunState::path(&out)).unwrap()).unwrap()
    };
    let first = slice(&[], 2);
    assert_eq!((first.slices, first.next.clone()), (1, vec![4, 5]));
    assert_eq!(first.counts.inputs, 4);
    let second = slice(&["--resume"], 3);
    assert_eq!((second.slices, second.next.clone()), (2, vec![6, 7]));
    assert_eq!(second.counts.inputs, 6);
    assert_eq!(
        second.counts.runs[0], 6,
        "every input is checked exactly once"
    );
    // A resume with another seed is refused: it would be another run.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_fuzz"))
        .args(["--seconds", "5", "--seed", "12", "--resume", "--out"])
        .arg(&out)
        .output()
        .expect("the fuzz binary runs");
    assert!(!status.status.success());
    assert!(String::from_utf8_lossy(&status.stderr).contains("seed 11"));
    let _ = std::fs::remove_dir_all(&out);
}
