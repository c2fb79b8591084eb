//! Checker tests: the UI cases of `tests/ui/check` (and the stdlib and valid
//! programs when present) run through the database with the inline annotation
//! format of the UI harness, plus salsa reuse.

use std::path::{Path, PathBuf};

use crate::db::Database;
use crate::diag::Diagnostic;
use crate::target::Arch;

struct Expect {
    line: usize,
    code: String,
    needles: Vec<String>,
}

fn expectations(text: &str) -> Vec<Expect> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(pos) = rest.find("#~") {
            rest = &rest[pos + 2..];
            let ups = rest.chars().take_while(|c| *c == '^').count();
            rest = &rest[ups..];
            let end = rest.find("#~").unwrap_or(rest.len());
            let spec = rest[..end].trim();
            let code = spec.split_whitespace().next().unwrap_or("").to_string();
            let mut needles = Vec::new();
            let mut s = &spec[code.len()..];
            while let Some(a) = s.find('"') {
                let Some(b) = s[a + 1..].find('"') else { break };
                needles.push(s[a + 1..a + 1 + b].to_string());
                s = &s[a + b + 2..];
            }
            out.push(Expect {
                line: i + 1 - ups,
                code,
                needles,
            });
            rest = &rest[end..];
        }
    }
    out
}

fn line_of(text: &str, offset: u32) -> usize {
    text[..(offset as usize).min(text.len())]
        .matches('\n')
        .count()
        + 1
}

/// Checks one file; returns a description of every mismatch.
fn run_case(path: &Path, text: &str) -> Vec<String> {
    let mut db = Database::new();
    if let Some(arch) = text.lines().next().and_then(|l| l.strip_prefix("# arch:")) {
        db.set_arch(arch.trim().parse::<Arch>().expect("valid arch"));
    }
    let file = db.set_source(path.to_path_buf(), text.to_string());
    let diags: Vec<Diagnostic> = db.diagnostics(file).to_vec();
    let mut expects = expectations(text);
    let mut problems = Vec::new();
    for d in &diags {
        let line = line_of(text, d.span.start);
        let found = expects.iter().position(|e| {
            e.line == line
                && e.code == d.code
                && e.needles.iter().all(|n| d.message.contains(n.as_str()))
        });
        match found {
            Some(i) => {
                expects.remove(i);
            }
            None => problems.push(format!(
                "{}:{line}: unexpected {} {}",
                path.display(),
                d.code,
                d.message
            )),
        }
    }
    for e in expects {
        problems.push(format!(
            "{}:{}: expected {} {:?} not produced",
            path.display(),
            e.line,
            e.code,
            e.needles
        ));
    }
    problems
}

fn ui_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(ui_files(&p));
        } else if p.extension().is_some_and(|x| x == "tsr") {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn ui_check_cases() {
    let mut problems = Vec::new();
    let mut n = 0;
    let mut dirs: Vec<PathBuf> = ["tests/ui/check", "tests/ui/valid"]
        .iter()
        .map(|d| root().join(d))
        .collect();
    if let Ok(extra) = std::env::var("TSR_UI_EXTRA") {
        dirs.push(PathBuf::from(extra));
    }
    for dir in dirs {
        for p in ui_files(&dir) {
            let text = std::fs::read_to_string(&p).unwrap();
            problems.extend(run_case(&p, &text));
            n += 1;
        }
    }
    assert!(n > 0, "no UI cases found");
    assert!(
        problems.is_empty(),
        "{} problem(s) in {n} cases:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn stdlib_checks_clean() {
    let mut problems = Vec::new();
    for m in crate::stdlib::modules() {
        let text = crate::stdlib::source(m).unwrap();
        problems.extend(run_case(Path::new(&format!("<{m}>")), text));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_checker_code_has_a_case() {
    let mut text = String::new();
    // Emit-time codes (E0511, E0512) have their cases in tests/ui/emit.
    let emit = ui_files(&root().join("tests/ui/emit"));
    for p in ui_files(&root().join("tests/ui/check"))
        .into_iter()
        .chain(emit)
    {
        text.push_str(&std::fs::read_to_string(&p).unwrap());
    }
    let missing: Vec<&str> = crate::diag::codes::CATALOGUE
        .iter()
        .map(|c| c.code)
        .filter(|c| {
            c.starts_with("E03")
                || c.starts_with("E04")
                || c.starts_with("E05")
                || c.starts_with("E06")
                || c.starts_with('W')
        })
        // Produced by compilation, not by the checker: E0511/E0512 under
        // `emit` (tests/ui/emit), W0003/W0004/W0006/W0007/W0008 under `report` (tests/ui/report).
        .filter(|c| {
            ![
                "E0511", "E0512", "W0003", "W0004", "W0006", "W0007", "W0008",
            ]
            .contains(c)
        })
        .filter(|c| !text.contains(&format!(" {c}")))
        .collect();
    assert!(
        missing.is_empty(),
        "codes without a tests/ui/check case: {missing:?}"
    );
}

/// Timing of a cold check of a 10,000-line file and of a re-check after a
/// one-character edit (run with `--release --ignored --nocapture`).

#[test]
fn hover_types_and_signatures() {
    let text = std::fs::read_to_string(root().join("tests/ui/valid/flash_attn.tsr")).unwrap();
    let items = crate::syntax::split_items(&text);
    let item_text = items
        .iter()
        .map(|r| &text[r.start as usize..r.end as usize])
        .find(|t| t.contains("def flash_attn"))
        .expect("flash_attn item");
    let item = crate::syntax::parse_item(item_text).item.expect("parses");
    let scope = super::build_module_scope(&[std::sync::Arc::new(item.clone())], &|_| None);
    let checked = super::check_item(&item, &scope, Arch::Sm90);
    assert!(checked.diagnostics.is_empty(), "{:?}", checked.diagnostics);
    let at = |needle: &str| {
        let off = item_text
            .find(needle)
            .unwrap_or_else(|| panic!("{needle} in the item")) as u32;
        checked.type_at(off).map(str::to_string)
    };
    assert_eq!(at("qt = ").as_deref(), Some("Tile[128, D, bf16]"));
    assert_eq!(at("acc = zeros").as_deref(), Some("Tile[128, D, f32]"));
    assert_eq!(at("s = dot").as_deref(), Some("Tile[128, 64, f32]"));
    assert_eq!(at("m_new = ").as_deref(), Some("Tile[128, f32]"));
    let sig = checked.signature.expect("signature");
    assert!(
        sig.rendered
            .contains("def flash_attn(q: Tensor[B, H, S, D, bf16]"),
        "{}",
        sig.rendered
    );
    assert!(sig.rendered.contains("BM: const = 128"), "{}", sig.rendered);
}

/// Help lines quote the user's own expression (parenthesised before a
/// method call), not a stand-in.
#[test]
fn help_lines_quote_the_expression_as_written() {
    let mut db = crate::db::Database::new();
    let src = "def f(a: Tensor[\"N\", f16], b: Tensor[\"N\", bf16]) -> Tensor[\"N\", f32]:\n    return (a + a[0 : N]) * b\n";
    let file = db.set_source("/t/describe.tsr", src.to_string());
    let helps: Vec<String> = db
        .diagnostics(file)
        .iter()
        .filter_map(|d| d.help.clone())
        .collect();
    assert!(
        helps.iter().any(|h| h.contains("`(a + a[0 : N]).to(f32)`")),
        "{helps:?}"
    );
    // Deep or long expressions fall back to a short form (bounded work).
    let deep = format!("x{}", ".T".repeat(50));
    let src = format!("def g(x: Tensor[\"N\", \"N\", f16], y: Tensor[\"N\", \"N\", bf16]) -> Tensor[\"N\", \"N\", f32]:\n    return {deep} + y\n");
    let file = db.set_source("/t/deep.tsr", src);
    let helps: Vec<String> = db
        .diagnostics(file)
        .iter()
        .filter_map(|d| d.help.clone())
        .collect();
    assert!(
        helps
            .iter()
            .any(|h| h.contains("(...)") || h.contains(".T.T")),
        "{helps:?}"
    );
}

/// A builtin written as a method (`x.reshape(...)`) is pointed at the
/// function, not at a similarly spelled attribute.
#[test]
fn builtins_written_as_methods_point_at_the_function() {
    let mut db = crate::db::Database::new();
    let src = "def f(x: Tensor[12, f32]) -> Tensor[3, 4, f32]:\n    return x.reshape([3, 4])\n";
    let file = db.set_source("/t/method.tsr", src.to_string());
    let d = db
        .diagnostics(file)
        .iter()
        .find(|d| d.code == "E0303")
        .cloned()
        .expect("E0303");
    assert_eq!(
        d.help.as_deref(),
        Some("`reshape` is a function, not a method: `reshape(x, ...)`")
    );
}

/// Where a builtin's example call is checked.
#[derive(Clone, Copy, Debug)]
enum Place {
    Kernel,
    Tensor,
    Session,
}

/// A well-typed call of each builtin (exhaustive: a new builtin needs one).
fn builtin_example(b: super::builtins::Builtin) -> (Place, &'static str) {
    use super::builtins::Builtin as B;
    use Place::*;
    match b {
        B::ProgramId => (Kernel, "program_id(0)"),
        B::NumPrograms => (Kernel, "num_programs(0)"),
        B::Arange => (Kernel, "arange(0, 64)"),
        B::Load => (Kernel, "load(x[0:64])"),
        B::Store => (Kernel, "store(y[0:64], t)"),
        B::AtomicAdd => (Kernel, "atomic_add(y[0:64], t)"),
        B::Dot => (Kernel, "dot(m, m)"),
        B::Cdiv => (Kernel, "cdiv(n, 16)"),
        B::Min => (Kernel, "min(t, axis=0)"),
        B::Max => (Tensor, "max(x, dim=0)"),
        B::Sum => (Kernel, "sum(t)"),
        B::Mean => (Tensor, "mean(x, dim=1)"),
        B::Exp => (Kernel, "exp(t)"),
        B::Exp2 => (Kernel, "exp2(t)"),
        B::Log => (Tensor, "log(x)"),
        B::Log2 => (Tensor, "log2(x)"),
        B::Sqrt => (Kernel, "sqrt(t)"),
        B::Rsqrt => (Kernel, "rsqrt(t)"),
        B::Abs => (Tensor, "abs(x)"),
        B::Sigmoid => (Kernel, "sigmoid(t)"),
        B::Tanh => (Kernel, "tanh(t)"),
        B::Erf => (Tensor, "erf(x)"),
        B::Maximum => (Kernel, "maximum(t, 0.0)"),
        B::Minimum => (Tensor, "minimum(x, 1.0)"),
        B::Where => (Kernel, "where(t > 0.0, t, 0.0)"),
        B::Zeros => (Kernel, "zeros([16, 16], f32)"),
        B::Full => (Tensor, "full([4, 8], 2.0)"),
        B::Range => (Kernel, "range(0, 4)"),
        B::Matmul => (Tensor, "matmul(x, w)"),
        B::Softmax => (Tensor, "softmax(x, dim=-1)"),
        B::LayerNorm => (Tensor, "layer_norm(x)"),
        B::RmsNorm => (Tensor, "rms_norm(x)"),
        B::Relu => (Tensor, "relu(x)"),
        B::Gelu => (Tensor, "gelu(x)"),
        B::Silu => (Tensor, "silu(x)"),
        B::Transpose => (Tensor, "transpose(x, 0, 1)"),
        B::Reshape => (Tensor, "reshape(x, [8, 4])"),
        B::Empty => (Tensor, "empty([4, 8])"),
        B::Ones => (Tensor, "ones([4, 8], f16)"),
        B::Randn => (Tensor, "randn([4, 8], seed=1)"),
        B::Tensor => (Tensor, "tensor([[1.0, 2.0], [3.0, 4.0]])"),
        B::Print => (Session, "print(1, \"a\", sep=\", \")"),
        B::Len => (Session, "len((1, 2, 3))"),
        B::LoadNpy => (Session, "load_npy(\"x.npy\")"),
        B::SaveNpy => (Session, "save_npy(zeros([2]), \"x.npy\")"),
        B::SetFloat32MatmulPrecision => (Session, "set_float32_matmul_precision(\"high\")"),
        B::AllReduce => (Tensor, "all_reduce(x, op=\"max\")"),
        B::Broadcast => (Tensor, "broadcast(x, src=0)"),
        B::Shard => (Tensor, "shard(x, axis=0)"),
        B::Gather => (Tensor, "gather(x)"),
        B::AllGather => (Tensor, "all_gather(x)"),
        B::ReduceScatter => (Tensor, "reduce_scatter(x, axis=1, op=\"sum\")"),
    }
}

/// The item that holds `stmt` in `place`, with the names examples use.
fn example_item(place: Place, stmt: &str) -> String {
    match place {
        Place::Kernel => format!(
            "@kernel(grid=(4,))\ndef k(x: Tensor[64, f32], y: Tensor[64, f32], n: i32):\n    t = load(x[0:64])\n    m = zeros([16, 16], f16)\n    {stmt}\n"
        ),
        Place::Tensor => format!(
            "def f(x: Tensor[4, 8, f32], w: Tensor[8, 2, f32]) -> Tensor[4, 8, f32]:\n    {stmt}\n    return x\n"
        ),
        Place::Session => format!("{stmt}\n"),
    }
}

/// Every builtin has a typing rule: a well-typed call of it checks without a
/// diagnostic and has a type (not the poison type, which renders as `?`).
#[test]
fn every_builtin_has_a_typing_rule() {
    use super::builtins::Builtin;
    for b in Builtin::ALL {
        let (place, call) = builtin_example(b);
        assert!(
            call.starts_with(&format!("{}(", b.name())),
            "the example of `{b}` calls something else: {call}"
        );
        let item_text = example_item(place, &format!("r = {call}"));
        let item = crate::syntax::parse_item(&item_text)
            .item
            .unwrap_or_else(|| panic!("`{b}`'s example parses:\n{item_text}"));
        let scope = super::build_module_scope(&[std::sync::Arc::new(item.clone())], &|_| None);
        let checked = super::check_item(&item, &scope, Arch::Sm90);
        // Unused-variable warnings aside: the example binds more than it uses.
        let errors: Vec<_> = checked
            .diagnostics
            .iter()
            .filter(|d| d.severity == crate::diag::Severity::Error)
            .collect();
        assert!(errors.is_empty(), "`{b}`:\n{item_text}{errors:?}");
        let paren = item_text.find(&format!("r = {call}")).unwrap() + 4 + b.name().len();
        let ty = checked.type_at(paren as u32);
        assert!(
            ty.is_some_and(|t| t != "?"),
            "`{b}` has no type:\n{item_text}{ty:?}"
        );
    }
}

/// Every kernel and whole-tensor builtin has a lowering rule: its example
/// lowers to Tile IR (in a kernel) or Graph IR (in a function). The session
/// builtins run on the host (the session evaluator's match; the REPL
/// transcripts run them).
#[test]
fn every_builtin_lowers_where_it_checks() {
    use super::builtins::Builtin;
    for b in Builtin::ALL {
        let (place, call) = builtin_example(b);
        // `range` makes loop bounds: it lowers as a `for` loop.
        let stmt = match b {
            Builtin::Range => format!("for i in {call}:\n        pass"),
            _ => format!("r = {call}"),
        };
        let text = example_item(place, &stmt);
        let mut db = Database::new();
        let file = db.set_source("/t/builtin.tsr", text.clone());
        let lowered = match place {
            Place::Kernel => {
                let (item, _) = crate::db::function_item(&db, file, "k").expect("the kernel");
                let spec = crate::ir::tile::Specialization::default();
                crate::db::tile_ir(&db, item, db.options(), spec)
                    .as_ref()
                    .map(|_| ())
                    .map_err(|d| format!("{d:?}"))
            }
            Place::Tensor => {
                let (item, _) = crate::db::function_item(&db, file, "f").expect("the function");
                crate::db::graph_ir(&db, item, db.options())
                    .as_ref()
                    .map(|_| ())
                    .map_err(|e| format!("{e}: {e:?}"))
            }
            Place::Session => continue,
        };
        if let Err(e) = lowered {
            panic!("`{b}` does not lower:\n{text}{e}");
        }
    }
}

/// Many distinct names with an `if` after each: the `if`s' environment work
/// grows with the kernel, not with the kernel times the names in scope.
#[test]
fn if_environment_work_grows_linearly_with_names_and_ifs() {
    let work = |n: usize| {
        let mut s = String::from(
            "@kernel(grid=(cdiv(N, 1024),), num_warps=1)\ndef chain(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    i = program_id(0) * 1024\n    v = load(x[i : i + 1024])\n    a0 = v\n",
        );
        for k in 0..n {
            s += &format!(
                "    a{} = a{k} * v + {k}.5\n    if i > {k}:\n        a{} = a{} + 1.0\n",
                k + 1,
                k + 1,
                k + 1
            );
        }
        s += &format!("    store(out[i : i + 1024], a{n})\n");
        let before = super::stmt::ENV_WORK.with(|w| w.get());
        let problems = run_case(Path::new("names_ifs.tsr"), &s);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        super::stmt::ENV_WORK.with(|w| w.get()) - before
    };
    let (small, large) = (work(100), work(400));
    assert!(small > 0, "the ifs did no environment work");
    assert!(
        large <= small * 5,
        "4x the names and ifs cost {large} against {small}"
    );
}

/// A nest of `n` loops (`for` and `while` in turn), each with its own
/// variable and each changing a value bound before the nest: the loops'
/// environment work grows with the depth, not with the depth squared.
#[test]
fn loop_environment_work_grows_linearly_with_nesting_depth() {
    let work = |n: usize| {
        let mut s = String::from(
            "@kernel(grid=(cdiv(N, 1024),), num_warps=1)\ndef nest(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    i = program_id(0) * 1024\n    a = load(x[i : i + 1024])\n    c = 0\n",
        );
        for k in 0..n {
            let ind = " ".repeat(k + 4);
            if k % 2 == 0 {
                s += &format!("{ind}for j{k} in range(4):\n");
            } else {
                s += &format!("{ind}while c < {k}:\n{ind} c = c + 1\n");
            }
            s += &format!("{ind} b{k} = a + 1.0\n{ind} a = b{k}\n");
        }
        s += "    store(out[i : i + 1024], a)\n";
        let before = super::stmt::ENV_WORK.with(|w| w.get());
        let problems = run_case(Path::new("nest.tsr"), &s);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
        super::stmt::ENV_WORK.with(|w| w.get()) - before
    };
    // Deep nests recurse deeper than a test thread's stack holds.
    let (small, large) =
        crate::stack::with_stack(move || (work(100), work(400))).expect("a thread");
    assert!(small > 0, "the loops did no environment work");
    let ratio = large as f64 / small as f64;
    assert!(
        ratio < 4.8,
        "100 nested loops took {small} steps, 400 took {large} ({ratio:.2}x)"
    );
}
