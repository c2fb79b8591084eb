//! `tessera run` on every `tests/run/*.tsr`: each file is copied into a scratch
//! directory and run there (so relative paths such as `save_npy(x, "x.npy")`
//! stay inside it, and diagnostics name the bare file). Its stdout must equal
//! `NAME.stdout`; with a `NAME.stderr` the run must exit 1 and its stderr
//! (trailing spaces removed) match that file, where a `[...]` line matches any
//! run of lines; without one it must exit 0 with an empty stderr.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn matches(expected: &[&str], got: &[&str]) -> bool {
    match expected.split_first() {
        None => got.is_empty(),
        Some((&"[...]", rest)) => (0..=got.len()).any(|i| matches(rest, &got[i..])),
        Some((e, rest)) => got.first() == Some(e) && matches(rest, &got[1..]),
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-run-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("run tessera");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn run_files() {
    run_files_on("cpu");
}

/// The files of `tests/run` on the GPU, when there is one, give what they
/// give on the CPU (their `.stdout` and `.stderr`).
#[test]
fn run_files_on_cuda() {
    if let Err(e) = tessera::exec::cuda::Gpu::open(0) {
        eprintln!("run_files_on_cuda: skipped, no GPU ({e})");
        return;
    }
    run_files_on("cuda");
}

/// Whether two outputs are the same text with numbers that agree within
/// f32 tolerance: the GPU contracts `a * b + c` into one FMA and has its own
/// `exp` and `log`, where the CPU executor rounds every operation
/// (scripts/gpu/same_output.py compares the same way on the GPU machine).
fn numbers_agree(got: &str, want: &str) -> bool {
    fn split(text: &str) -> (String, Vec<f64>) {
        let mut shape = String::new();
        let mut nums = Vec::new();
        let b = text.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let sign =
                (b[i] == b'-' || b[i] == b'+') && b.get(i + 1).is_some_and(u8::is_ascii_digit);
            if b[i].is_ascii_digit() || sign {
                let start = i;
                i += 1;
                while i < b.len()
                    && (b[i].is_ascii_digit()
                        || b[i] == b'.'
                        || ((b[i] == b'e' || b[i] == b'E')
                            && b.get(i + 1)
                                .is_some_and(|c| c.is_ascii_digit() || *c == b'-' || *c == b'+'))
                        || ((b[i] == b'-' || b[i] == b'+') && matches!(b[i - 1], b'e' | b'E')))
                {
                    i += 1;
                }
                match text[start..i].parse::<f64>() {
                    Ok(x) => {
                        nums.push(x);
                        shape.push('#');
                    }
                    Err(_) => shape.push_str(&text[start..i]),
                }
            } else {
                shape.push(b[i] as char);
                i += 1;
            }
        }
        (shape, nums)
    }
    let (gs, gn) = split(got);
    let (ws, wn) = split(want);
    gs == ws
        && gn.len() == wn.len()
        && gn
            .iter()
            .zip(&wn)
            .all(|(a, b)| (a - b).abs() <= 1e-5 + 1e-3 * b.abs())
}

#[test]
fn numbers_agree_within_tolerance_only() {
    assert!(numbers_agree(
        "300 tensor(4.7684e-7, f32)\n",
        "300 tensor(0.0000, f32)\n"
    ));
    assert!(numbers_agree(
        "tensor([-0.7072, 2.6867], f32)",
        "tensor([-0.7071, 2.6867], f32)"
    ));
    assert!(!numbers_agree(
        "tensor([-0.7172], f32)",
        "tensor([-0.7071], f32)"
    ));
    assert!(!numbers_agree(
        "301 tensor(0.0, f32)",
        "300 tensor(0.0, f32)"
    ));
    assert!(!numbers_agree("tensor([1.0], f16)", "tensor([1.0], f32)"));
    assert!(!numbers_agree(
        "tensor([1.0, 2.0], f32)",
        "tensor([1.0], f32)"
    ));
}

/// The `.tsr` files of `tests/FOLDER`, sorted.
fn tsr_files(folder: &str) -> Vec<PathBuf> {
    let dir = root().join("tests").join(folder);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tsr"))
        .collect();
    files.sort();
    files
}

fn run_files_on(device: &str) {
    let dir = root().join("tests/run");
    let files = tsr_files("run");
    assert!(files.len() >= 5, "too few run files in {}", dir.display());
    let mut failures = Vec::new();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let stem = f.file_stem().unwrap().to_string_lossy().into_owned();
        let work = scratch(&format!("{stem}-{device}"));
        std::fs::copy(f, work.join(&name)).unwrap();
        let (code, out, err) = run(&work, &["run", &name, "--device", device]);
        let expected_out = std::fs::read_to_string(dir.join(format!("{stem}.stdout")))
            .unwrap_or_else(|_| panic!("{stem}.stdout is missing"));
        let same = if device == "cpu" {
            out == expected_out
        } else {
            numbers_agree(&out, &expected_out)
        };
        if !same {
            failures.push(format!(
                "{name}: stdout\n--- expected\n{expected_out}--- got\n{out}"
            ));
        }
        match std::fs::read_to_string(dir.join(format!("{stem}.stderr"))) {
            Ok(expected_err) => {
                let got: Vec<String> = err.lines().map(|l| l.trim_end().to_string()).collect();
                let mut got: Vec<&str> = got.iter().map(String::as_str).collect();
                while got.last() == Some(&"") {
                    got.pop();
                }
                let mut expected: Vec<&str> = expected_err.lines().collect();
                while expected.last() == Some(&"") {
                    expected.pop();
                }
                if code != 1 || !matches(&expected, &got) {
                    failures.push(format!(
                        "{name}: exit {code}, stderr\n--- expected\n{expected_err}--- got\n{err}"
                    ));
                }
            }
            Err(_) => {
                if code != 0 || !err.is_empty() {
                    failures.push(format!("{name}: exit {code}, stderr:\n{err}"));
                }
            }
        }
        let _ = std::fs::remove_dir_all(&work);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The files `tessera run` executes without error also pass the checker (what
/// `tsrc check` and the language server report): session builtins such as
/// `print`, `len`, `load_npy` and `save_npy`, element assignment and `arange(n)`
/// at top level are not reported as errors.
#[test]
fn run_files_check_clean() {
    let dir = root().join("tests/run");
    let mut checked = 0;
    let mut failures = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let f = e.unwrap().path();
        if f.extension().is_none_or(|e| e != "tsr") || f.with_extension("stderr").exists() {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let mut db = tessera::db::Database::new();
        let file = db.set_source(&f, text.clone());
        let errors: Vec<_> = db
            .diagnostics(file)
            .iter()
            .filter(|d| d.is_error())
            .cloned()
            .collect();
        if !errors.is_empty() {
            failures.push(tessera::diag::render::render_human_all(
                &f.display().to_string(),
                &text,
                &errors,
                false,
            ));
        }
        checked += 1;
    }
    assert!(checked >= 5, "too few clean run files");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn run_on_cuda_runs_there_or_is_exit_2() {
    let work = scratch("cuda");
    std::fs::write(work.join("a.tsr"), "x = ones([2], f32)\nprint(x)\n").unwrap();
    let (code, out, err) = run(&work, &["run", "a.tsr", "--device", "cuda"]);
    if tessera::exec::cuda::Gpu::open(0).is_ok() {
        assert_eq!(
            (code, out.as_str()),
            (0, "tensor([1.0000, 1.0000], f32)\n"),
            "{err}"
        );
    } else {
        assert_eq!(code, 2, "{err}");
        assert!(out.is_empty(), "{out}");
        assert!(
            err.contains("error[E0721]: no CUDA GPU is available") && err.contains("--device cpu"),
            "{err}"
        );
    }
    let (code, out, _) = run(&work, &["run", "a.tsr", "--device", "cpu"]);
    assert_eq!(code, 0);
    assert_eq!(out, "tensor([1.0000, 1.0000], f32)\n");
    // Hidden GPUs: `auto` runs on the CPU, `cuda` says why it cannot.
    let hidden = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(args)
            .current_dir(&work)
            .env("NO_COLOR", "1")
            .env("CUDA_VISIBLE_DEVICES", "")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = hidden(&["run", "a.tsr"]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "tensor([1.0000, 1.0000], f32)\n"),
        "{err}"
    );
    let (code, _, err) = hidden(&["run", "a.tsr", "--device", "cuda"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("E0721"), "{err}");
}

#[test]
fn unreadable_file_is_exit_2() {
    let work = scratch("missing");
    let (code, _, err) = run(&work, &["run", "no_such.tsr"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read `no_such.tsr`"), "{err}");
}

#[test]
fn piped_session_runs_every_statement_and_reports_failure() {
    use std::io::Write;
    let work = scratch("piped");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("repl")
        .current_dir(&work)
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"x = 2\nundefined\nfor i in range(3):\n    x = x * 2\nprint(x)\n:type x\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stdout, "16\nint\n");
    assert!(
        stderr.contains("error[E0201]: unknown name `undefined`"),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn repl_on_cuda_without_a_gpu_is_exit_2() {
    use std::io::Write;
    let work = scratch("repl-cuda");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["repl", "--device", "cuda"])
        .current_dir(&work)
        .env("NO_COLOR", "1")
        .env("CUDA_VISIBLE_DEVICES", "")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The REPL may exit (E0721) before it reads its input: a broken pipe
    // here is that, not a failure.
    let _ = child.stdin.take().unwrap().write_all(b"1 + 2\n");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    assert!(
        stderr.contains("error[E0721]: no CUDA GPU is available"),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(2));
}

/// Every `tests/sharded/*.tsr` gives its `NAME.stdout` on 1, 2, 3 and 4 of
/// the CPU's virtual devices (`--devices N`): a sharded program's results do
/// not depend on how many devices hold the parts.
#[test]
fn sharded_files_agree_on_every_device_count() {
    let files = tsr_files("sharded");
    assert!(!files.is_empty(), "no tests/sharded/*.tsr");
    let mut failures = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap().to_str().unwrap();
        let expected = std::fs::read_to_string(file.with_extension("stdout"))
            .unwrap_or_else(|e| panic!("{}: {e}", file.with_extension("stdout").display()));
        for n in 1..=4 {
            let work = scratch(&format!("sharded-{n}-{name}"));
            std::fs::copy(file, work.join(name)).unwrap();
            let count = n.to_string();
            let (code, out, err) = run(
                &work,
                &["run", "--device", "cpu", "--devices", &count, name],
            );
            if code != 0 || !err.is_empty() || out != expected {
                failures.push(format!(
                    "{name} on {n} devices: exit {code}\n--- stderr\n{err}--- stdout\n{out}--- expected\n{expected}"
                ));
            }
            let _ = std::fs::remove_dir_all(&work);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
