//! Every pass on a program nested exactly as deep as the language allows
//! (`MAX_DEPTH`, flat chains of `+` in a kernel, a whole-tensor function and a
//! top-level statement), through the binaries, which run passes on the stack
//! they give their threads: checking, each IR dump, the estimate, `run` on the
//! CPU and the REPL's evaluation. One level deeper is E0116, not a crash.
//! (The language server's queries on such a file: `lsp.rs`.)

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use tessera::syntax::MAX_DEPTH;

/// A kernel, a whole-tensor function and top-level statements, each holding a
/// chain of `terms` terms; `terms = MAX_DEPTH - 1` reaches the limit exactly in
/// the function bodies (the statement counts one level).
pub fn program(terms: usize) -> String {
    let chain = |t: &str| vec![t; terms].join(" + ");
    format!(
        "const BLOCK = 128\n\n\
         @kernel(grid=(cdiv(N, BLOCK),), num_warps=4)\n\
         def chain(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    \
             i = program_id(0) * BLOCK\n    \
             a = load(x[i : i + BLOCK])\n    \
             b = {k}\n    \
             store(out[i : i + BLOCK], b)\n\n\
         def h(a: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    \
             b = {k}\n    \
             return b\n\n\
         x = ones([256], f32)\n\
         o = zeros([256], f32)\n\
         chain(x, o)\n\
         print(o[1])\n\
         print(h(x)[0])\n\
         c = {s}\n\
         print(c)\n",
        k = chain("a"),
        s = chain("1.0"),
    )
}

fn scratch(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-depth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn tessera(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tessera");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_pass_handles_the_limit() {
    let terms = MAX_DEPTH - 1;
    let file = scratch("limit.tsr", &program(terms));
    let f = file.to_str().unwrap();
    let expected = format!("{terms}.0");

    let (code, _, err) = tessera(&["check", f], None);
    assert_eq!(code, 0, "{err}");
    for level in ["graph-ir", "schedule-ir", "tile-ir", "target-ir", "ptx"] {
        let (code, out, err) = tessera(&["emit", "--emit", level, "-D", "N=1024", f], None);
        assert_eq!(code, 0, "{level}: {err}");
        assert!(out.len() > 10 * terms, "{level}: {} bytes", out.len());
    }
    let (code, out, err) = tessera(&["report", "-D", "N=1024", f], None);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("chain"), "{out}");
    let (code, out, err) = tessera(&["run", f], None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches(expected.as_str()).count(), 3, "{out}");
    // the REPL evaluates what it reads on its own stack
    let (code, out, err) = tessera(&["repl"], Some(&program(terms)));
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches(expected.as_str()).count(), 3, "{out}");
}

#[test]
fn one_level_deeper_is_refused() {
    let file = scratch("deeper.tsr", &program(MAX_DEPTH));
    let f = file.to_str().unwrap();
    for args in [
        vec!["check", f],
        vec!["emit", "--emit", "ptx", "-D", "N=1024", f],
        vec!["run", f],
    ] {
        let (code, _, err) = tessera(&args, None);
        assert_eq!(code, 1, "{args:?}: {err}");
        // the kernel's and the function's chains; the top-level one is a
        // level shallower and fits
        assert_eq!(err.matches("error[E0116]").count(), 2, "{args:?}");
        assert!(!err.contains("overflow") && !err.contains("panicked"));
    }
    let (code, _, err) = tessera(&["repl"], Some(&program(MAX_DEPTH)));
    assert_eq!(code, 1);
    assert!(err.contains("E0116"), "{err}");
}
