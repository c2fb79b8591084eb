//! End-to-end runs of the `tsrc` binary: exit codes, where output goes, formats.

use std::path::PathBuf;
use std::process::{Command, Output};

fn tsrc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tsrc"))
        .args(args)
        .env_remove("NO_COLOR")
        .output()
        .expect("tsrc runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("utf-8 output")
}

/// A scratch file under the target directory's tmp dir.
fn scratch(name: &str, contents: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

fn example(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    root.join("examples").join(name).display().to_string()
}

const BROKEN: &str =
    "def f(a: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return a + undefined_thing\n";

#[test]
fn clean_files_exit_0_with_an_ok_summary() {
    let out = tsrc(&["check", &example("gemm.tsr"), &example("vadd.tsr")]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(out.stdout.is_empty());
    assert!(
        err.ends_with("ok: 0 errors, 0 warnings (2 files checked)\n"),
        "{err}"
    );
    assert!(
        !err.contains('\u{1b}'),
        "no colour when stderr is not a terminal"
    );
}

#[test]
fn errors_exit_1_and_render_on_stderr() {
    let path = scratch("broken.tsr", BROKEN);
    let shown = path.display().to_string();
    let out = tsrc(&["check", &shown]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty());
    assert!(err.contains("error[E0201]"), "{err}");
    assert!(
        err.contains(&format!("{shown}:2:16")),
        "file:line:col in the header: {err}"
    );
    assert!(
        err.lines().last().unwrap().starts_with("error: 1 error"),
        "{err}"
    );
}

#[test]
fn json_goes_to_stdout_one_object_per_line() {
    let path = scratch("broken_json.tsr", BROKEN);
    let shown = path.display().to_string();
    let out = tsrc(&["check", "--message-format", "json", &shown]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(!lines.is_empty());
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).expect("each line is JSON");
        for key in [
            "code",
            "severity",
            "message",
            "file",
            "line",
            "column",
            "end_line",
            "end_column",
            "help",
            "labels",
        ] {
            assert!(v.get(key).is_some(), "{key} missing in {line}");
        }
        assert_eq!(v["file"], shown.as_str());
    }
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(v["code"], "E0201");
    assert_eq!(
        (v["line"].as_u64(), v["column"].as_u64()),
        (Some(2), Some(16))
    );
    assert_eq!(
        (v["end_line"].as_u64(), v["end_column"].as_u64()),
        (Some(2), Some(31))
    );
}

#[test]
fn missing_file_exits_2_without_panicking() {
    let out = tsrc(&["check", "definitely_missing.tsr"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("error: cannot read `definitely_missing.tsr`: No such file or directory\n"),
        "{err}"
    );
    assert!(!err.contains("panicked"));
}

#[test]
fn unknown_arch_exits_2_listing_the_valid_ones() {
    let out = tsrc(&["check", "--arch", "sm_99", &example("gemm.tsr")]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for arch in ["sm_70", "sm_90a", "gfx942", "gfx1100"] {
        assert!(err.contains(arch), "{arch} listed: {err}");
    }
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(tsrc(&["check"]).status.code(), Some(2));
    assert_eq!(tsrc(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(
        tsrc(&["check", "--message-format", "xml", "x.tsr"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(tsrc(&[]).status.code(), Some(2));
}

#[test]
fn every_arch_is_accepted() {
    for arch in [
        "sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "gfx90a", "gfx942",
        "gfx1100",
    ] {
        let out = tsrc(&["check", "--arch", arch, &example("vadd.tsr")]);
        assert_eq!(out.status.code(), Some(0), "{arch}: {}", text(&out.stderr));
    }
}

#[test]
fn emit_tile_ir_to_stdout_and_to_a_file() {
    let out = tsrc(&["emit", &example("gemm.tsr"), "--emit", "tile-ir"]);
    let so = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(so.starts_with("kernel @"), "{so}");
    assert!(so.contains("dot %"), "{so}");
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-tests");
    std::fs::create_dir_all(&target).unwrap();
    let dest = target.join("gemm.tile");
    let out = tsrc(&[
        "emit",
        &example("gemm.tsr"),
        "--emit",
        "tile-ir",
        "-D",
        "BM=64",
        "-o",
        &dest.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    let written = std::fs::read_to_string(&dest).unwrap();
    assert!(written.contains("BM = 64"), "{written}");
}

#[test]
fn emit_exit_codes() {
    // Check errors: 1, nothing on stdout.
    let path = scratch("broken_emit.tsr", BROKEN);
    let out = tsrc(&["emit", &path.display().to_string(), "--emit", "tile-ir"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(text(&out.stderr).contains("error[E0201]"));
    // Unknown kernels, bad -D, unknown levels: usage errors, 2.
    let gemm = example("gemm.tsr");
    for extra in [
        &["--emit", "tile-ir", "--kernel", "nope"][..],
        &["--emit", "tile-ir", "-D", "BM"][..],
        &["--emit", "nonsense"][..],
    ] {
        let mut args = vec!["emit", gemm.as_str()];
        args.extend_from_slice(extra);
        let out = tsrc(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{extra:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{extra:?}");
    }
}
