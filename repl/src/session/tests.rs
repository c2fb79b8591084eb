//! Session behaviour through its API (the pty tests cover the shell).

use super::*;

/// Executes `input`: whether it succeeded, its stdout and its stderr.
pub(crate) fn run(s: &mut Session, input: &str) -> (bool, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let ok = s.execute(input, &mut out, &mut err);
    (
        ok,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[test]
fn a_definition_with_an_error_is_not_kept_and_the_old_one_stays() {
    let mut s = Session::new("<repl>", false);
    assert!(
        run(
            &mut s,
            "def f(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return x * 2.0\n\n"
        )
        .0
    );
    let (ok, _, err) = run(
        &mut s,
        "def f(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return x * yy\n\n",
    );
    assert!(!ok);
    assert!(err.contains("E0201") && err.contains("<repl>:5"), "{err}");
    assert!(run(&mut s, "a = ones([3], f32)").0);
    let (ok, out, err) = run(&mut s, "f(a)");
    assert!(ok, "{err}");
    assert_eq!(out, "tensor([2.0000, 2.0000, 2.0000], f32)\n");
}

#[test]
fn a_new_definition_replaces_the_old_one() {
    let mut s = Session::new("<repl>", false);
    assert!(run(&mut s, "const K = 2\n").0);
    assert!(
        run(
            &mut s,
            "def f(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return x * 2.0\n\n"
        )
        .0
    );
    assert!(
        run(
            &mut s,
            "def f(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return x + 10.0\n\n"
        )
        .0
    );
    let (ok, out, err) = run(&mut s, "f(ones([2], f32))");
    assert!(ok, "{err}");
    assert_eq!(out, "tensor([11.0000, 11.0000], f32)\n");
    let (ok, out, _) = run(&mut s, "K * 3");
    assert!(ok);
    assert_eq!(out, "6\n");
}

#[test]
fn errors_name_the_session_line_and_keep_variables() {
    let mut s = Session::new("<repl>", false);
    run(&mut s, "x = 1");
    run(&mut s, "y = 2");
    let (ok, _, err) = run(&mut s, "z = x + nope");
    assert!(!ok);
    assert!(err.contains("<repl>:3:9"), "{err}");
    let (_, out, _) = run(&mut s, "x + y");
    assert_eq!(out, "3\n");
}

#[test]
fn load_and_reload_pick_up_changes() {
    let dir = std::env::temp_dir().join(format!("tessera-session-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lib.tsr");
    std::fs::write(
        &path,
        "def g(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return x * 3.0\n",
    )
    .unwrap();
    let mut s = Session::new("<repl>", false);
    let mut err = Vec::new();
    s.load(&path, &mut std::io::sink(), &mut err).unwrap();
    assert_eq!(s.names_from(&path), ["g"]);
    let (_, out, _) = run(&mut s, "g(ones([1], f32))");
    assert_eq!(out, "tensor([3.0000], f32)\n");
    std::fs::write(
        &path,
        "def g(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return x * 4.0\n",
    )
    .unwrap();
    s.load(&path, &mut std::io::sink(), &mut err).unwrap();
    let (_, out, _) = run(&mut s, "g(ones([1], f32))");
    assert_eq!(out, "tensor([4.0000], f32)\n");
    // A file with an error adds nothing; its diagnostics name the file.
    std::fs::write(
        &path,
        "def g(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return q\n",
    )
    .unwrap();
    let mut err = Vec::new();
    assert!(matches!(
        s.load(&path, &mut std::io::sink(), &mut err),
        Err(LoadError::Errors)
    ));
    let err = String::from_utf8(err).unwrap();
    assert!(err.contains("lib.tsr:2"), "{err}");
    let (_, out, _) = run(&mut s, "g(ones([1], f32))");
    assert_eq!(out, "tensor([4.0000], f32)\n");
}

#[test]
fn kernels_write_their_arguments_and_bad_shapes_are_run_time_errors() {
    let mut s = Session::new("<repl>", false);
    let k = "@kernel(grid=(N,))\ndef inc(x: Tensor[\"N\", i32]):\n    i = program_id(0)\n    store(x[i], load(x[i]) + 1)\n\n";
    assert!(run(&mut s, k).0);
    run(&mut s, "v = zeros([3], i32)");
    run(&mut s, "w = v");
    let (ok, _, err) = run(&mut s, "inc(v)");
    assert!(ok, "{err}");
    // `w` is the same tensor.
    let (_, out, _) = run(&mut s, "w");
    assert_eq!(out, "tensor([1, 1, 1], i32)\n");
    let (ok, _, err) = run(&mut s, "inc(zeros([3], f32))");
    assert!(!ok);
    assert!(err.contains("E0702"), "{err}");
}

#[test]
fn type_of_does_not_run() {
    let mut s = Session::new("<repl>", false);
    run(&mut s, "x = ones([2, 3], f16)");
    assert_eq!(s.type_of("x", 0).unwrap(), "Tensor[2, 3, f16]");
    assert_eq!(s.type_of("sum(x, dim=0)", 0).unwrap(), "Tensor[3, f16]");
    assert!(s.type_of("x +", 0).is_err());
}

/// `:devices` lists the CPU (the session's device, marked) and then each
/// GPU, or one line saying why there is none; extra words are E0722.
#[test]
fn devices_lists_the_cpu_first_and_then_the_gpus_or_why_none() {
    let mut s = Session::new("<repl>", false);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (_, ok) = crate::command::run(&mut s, ":devices", &mut out, &mut err);
    assert!(ok);
    let out = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "* cpu  the CPU executor");
    assert!(lines.len() >= 2, "{out}");
    for l in &lines[1..] {
        assert!(
            l.starts_with("  no GPU: ") || l.starts_with("  cuda:"),
            "{out}"
        );
    }
    if !tessera::exec::cuda::driver_present() {
        assert_eq!(
            lines[1],
            "  no GPU: the CUDA driver (`libcuda`) cannot be loaded"
        );
    }
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (_, ok) = crate::command::run(&mut s, ":devices all", &mut out, &mut err);
    assert!(!ok);
    assert!(String::from_utf8(err).unwrap().contains("E0722"));
}
