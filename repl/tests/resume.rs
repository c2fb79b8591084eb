//! `tessera repl --resume DIR`: the process a session restarts into after a
//! sticky GPU error. A state saved by the library (as the old process saves
//! it) is resumed by the real binary with piped input: the values and
//! definitions are back, the saved unexecuted input runs before stdin, the
//! exit status carries over, the folder is deleted; a bad state is E0735.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tessera_repl::session::{Device, Session, ShellState};

/// Runs `tessera repl --resume DIR` with `stdin`, GPUs hidden (the state's
/// device is then refused, deterministically): exit code, stdout, stderr.
fn resume(dir: &Path, stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["repl", "--resume"])
        .arg(dir)
        .env("NO_COLOR", "1")
        .env("CUDA_VISIBLE_DEVICES", "")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tessera");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn execute(s: &mut Session, input: &str) -> bool {
    s.execute(input, &mut std::io::sink(), &mut std::io::sink())
}

/// A saved session: a kernel, a function, host values (three lines of
/// transcript before the one that "failed" on the GPU).
fn saved(device: Device, failed: bool, input: &str) -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    let mut s = Session::new("<repl>", false);
    assert!(execute(
        &mut s,
        "@kernel(grid=(cdiv(N, 4),))\ndef scale(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):\n    i = program_id(0) * 4\n    store(out[i : i + 4], load(x[i : i + 4]) * 2.0)\n\n"
    ));
    assert!(execute(
        &mut s,
        "x = arange(0, 4, bf16)\nh = zeros([4], f32)\nscale(arange(0, 4, f32), h)\nn = 3\n"
    ));
    let shell = ShellState {
        failed,
        input: input.as_bytes().to_vec(),
    };
    s.save_state(&dir, device, &["y".to_string()], &shell)
        .unwrap();
    (root, dir)
}

#[test]
fn a_resumed_session_has_its_values_and_runs_the_saved_input_first() {
    let (_root, dir) = saved(
        Device::Cpu,
        true,
        "print(\"saved\", n)\nh2 = h + 1.0\n:type x\n",
    );
    let (code, out, err) = resume(&dir, "print(\"stdin\")\nh2\nscale(h2, h)\nh\nx\n");
    assert_eq!(
        out,
        "saved 3\nTensor[4, bf16]\nstdin\ntensor([1.0000, 3.0000, 5.0000, 7.0000], f32)\n\
         tensor([ 2.0000,  6.0000, 10.0000, 14.0000], f32)\n\
         tensor([0.0000, 1.0000, 2.0000, 3.0000], bf16)\n",
        "{err}"
    );
    assert_eq!(
        err,
        "note: the GPU's context was unusable after that error; the session restarted its process to make a fresh one (lost, as their values were only on the GPU: `y`); definitions and the other values are kept\n"
    );
    // A statement failed before the restart: piped mode still exits 1.
    assert_eq!(code, 1);
    assert!(!dir.exists(), "the state folder is deleted");
}

#[test]
fn the_exit_status_and_diagnostic_lines_carry_over() {
    let (_root, dir) = saved(Device::Cpu, false, "");
    let (code, out, err) = resume(&dir, "print(n)\n");
    assert_eq!((code, out.as_str()), (0, "3\n"), "{err}");
    // Lines go on from the old session's transcript (9 lines), then the
    // saved input's and stdin's.
    let (_root, dir) = saved(Device::Cpu, false, "m = 1\n");
    let (code, _, err) = resume(&dir, "print(n)\nundefined_name\n");
    assert_eq!(code, 1);
    assert!(err.contains("<repl>:12:1"), "{err}");
}

#[test]
fn a_session_whose_gpu_cannot_be_opened_again_goes_on_on_the_cpu() {
    let (_root, dir) = saved(Device::Cuda, false, "");
    let (code, out, err) = resume(&dir, "print(n)\n:device\n");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "3\ncpu\n");
    assert!(
        err.starts_with("note: the GPU's context was unusable after that error; the session restarted its process, but the GPU cannot be opened: ")
            && err.contains("; the session runs on the CPU now (lost, as their values were only on the GPU: `y`)"),
        "{err}"
    );
}

#[test]
fn a_missing_or_corrupt_state_is_e0735_and_the_session_starts_empty() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("missing");
    let (code, out, err) = resume(&missing, "print(1 + 1)\n");
    assert_eq!((code, out.as_str()), (1, "2\n"));
    assert!(
        err.contains("error[E0735]: cannot resume the session from")
            && err.contains("`session.json` is missing")
            && err.contains("the session starts empty"),
        "{err}"
    );
    let (_root, dir) = saved(Device::Cpu, false, "");
    std::fs::write(
        dir.join("session.json"),
        "{\"format\": \"tessera-session-1\"",
    )
    .unwrap();
    let (code, out, err) = resume(&dir, "print(1 + 1)\nn\n");
    assert_eq!((code, out.as_str()), (1, "2\n"));
    assert!(
        err.contains("error[E0735]") && err.contains("is corrupt"),
        "{err}"
    );
    // The session is empty: `n` is not defined.
    assert!(err.contains("E0201"), "{err}");
    assert!(!dir.exists(), "the state's files are deleted");
}

#[test]
fn a_folder_that_is_not_a_state_keeps_its_files() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("notes.txt"), "mine").unwrap();
    let (code, _, err) = resume(root.path(), "");
    assert_eq!(code, 1);
    assert!(err.contains("E0735"), "{err}");
    assert_eq!(
        std::fs::read_to_string(root.path().join("notes.txt")).unwrap(),
        "mine"
    );
}
