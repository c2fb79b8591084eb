//! End-to-end tests of `tessera lsp`: the real binary, spoken to over stdio
//! with JSON-RPC, on the documents of `tests/lsp/` (copied to a scratch
//! workspace) and on every stdlib module typed keystroke by keystroke.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A scratch workspace, removed at the end of a test that passes (kept for a
/// look after one that fails).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("tessera-lsp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

fn write_message(stdin: &Mutex<ChildStdin>, msg: &Value) {
    let body = msg.to_string();
    let mut w = stdin.lock().unwrap();
    write!(w, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    w.flush().unwrap();
}

/// A minimal LSP client: a reader thread answers the server's requests with
/// `null` and queues everything else.
struct Client {
    child: Child,
    stdin: Arc<Mutex<ChildStdin>>,
    rx: Receiver<Value>,
    next_id: i64,
    /// Notifications received while waiting for something else.
    queued: Vec<Value>,
}

impl Client {
    fn start(root: &Path, init_options: Value) -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("lsp")
            .env("XDG_CACHE_HOME", root.join(".cache"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start tessera lsp");
        let stdin = Arc::new(Mutex::new(child.stdin.take().unwrap()));
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        let answer = stdin.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut len = 0usize;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some(v) = line.strip_prefix("Content-Length: ") {
                        len = v.parse().unwrap();
                    }
                }
                let mut body = vec![0; len];
                if r.read_exact(&mut body).is_err() {
                    return;
                }
                let msg: Value = serde_json::from_slice(&body).unwrap();
                if msg.get("method").is_some() && msg.get("id").is_some() {
                    write_message(
                        &answer,
                        &json!({"jsonrpc": "2.0", "id": msg["id"], "result": null}),
                    );
                    continue;
                }
                if tx.send(msg).is_err() {
                    return;
                }
            }
        });
        let mut c = Client {
            child,
            stdin,
            rx,
            next_id: 0,
            queued: Vec::new(),
        };
        let uri = url(root);
        let init = c.request(
            "initialize",
            json!({
                "processId": null,
                "rootUri": uri,
                "capabilities": {},
                "initializationOptions": init_options,
            }),
        );
        let caps = &init.expect("initialize")["capabilities"];
        assert_eq!(caps["textDocumentSync"], json!(2), "incremental sync");
        c.notify("initialized", json!({}));
        c
    }

    fn recv(&mut self) -> Value {
        match self.rx.recv_timeout(TIMEOUT) {
            Ok(v) => v,
            Err(RecvTimeoutError::Timeout) => panic!("no message from the server in {TIMEOUT:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("the server closed its output"),
        }
    }

    fn notify(&mut self, method: &str, params: Value) {
        let mut msg = json!({"jsonrpc": "2.0", "method": method});
        if !params.is_null() {
            msg["params"] = params;
        }
        write_message(&self.stdin, &msg);
    }

    /// The result, or the error object.
    fn request(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if !params.is_null() {
            msg["params"] = params;
        }
        write_message(&self.stdin, &msg);
        loop {
            let msg = self.recv();
            if msg.get("method").is_none() && msg["id"] == json!(id) {
                return match msg.get("error") {
                    Some(e) => Err(e.clone()),
                    None => Ok(msg["result"].clone()),
                };
            }
            self.queued.push(msg);
        }
    }

    /// The diagnostics published for `uri` at `version` (the first such).
    fn diagnostics(&mut self, uri: &str, version: i64) -> Vec<Value> {
        let is_it = |m: &Value| {
            m["method"] == "textDocument/publishDiagnostics"
                && m["params"]["uri"] == uri
                && m["params"]["version"] == json!(version)
        };
        if let Some(i) = self.queued.iter().position(is_it) {
            let m = self.queued.remove(i);
            return m["params"]["diagnostics"].as_array().unwrap().clone();
        }
        loop {
            let m = self.recv();
            if is_it(&m) {
                return m["params"]["diagnostics"].as_array().unwrap().clone();
            }
            // Keep only what a later wait may ask for.
            if m["method"] == "textDocument/publishDiagnostics" {
                self.queued.push(m);
            }
        }
    }

    fn open(&mut self, uri: &str, text: &str, version: i64) {
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri, "languageId": "tessera", "version": version, "text": text}}),
        );
    }

    fn change(&mut self, uri: &str, version: i64, range: Value, text: &str) {
        self.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": uri, "version": version},
                   "contentChanges": [{"range": range, "text": text}]}),
        );
    }

    fn at(&mut self, method: &str, uri: &str, line: u32, character: u32) -> Value {
        self.request(
            method,
            json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}),
        )
        .unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    fn stop(mut self) {
        self.request("shutdown", Value::Null).expect("shutdown");
        self.notify("exit", Value::Null);
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "server exit status {status}");
                return;
            }
            assert!(start.elapsed() < TIMEOUT, "server did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn url(path: &Path) -> String {
    format!("file://{}", path.display())
}

fn range(l0: u32, c0: u32, l1: u32, c1: u32) -> Value {
    json!({"start": {"line": l0, "character": c0}, "end": {"line": l1, "character": c1}})
}

/// The line and UTF-16 column of the first `needle` on the line containing `line_has`.
fn find(text: &str, line_has: &str, needle: &str) -> (u32, u32) {
    for (i, l) in text.lines().enumerate() {
        if l.contains(line_has) {
            let b = l
                .find(needle)
                .unwrap_or_else(|| panic!("{needle:?} in {l:?}"));
            return (i as u32, l[..b].encode_utf16().count() as u32);
        }
    }
    panic!("no line with {line_has:?}");
}

/// `tessera report` as JSON: the estimate the hints must repeat.
fn report(file: &Path, arch: &str) -> Value {
    report_with(file, arch, &[])
}

/// `tessera report` as JSON with `-D` values (`"D=64"`).
fn report_with(file: &Path, arch: &str, defines: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["report", "--format", "json", "--arch", arch])
        .args(defines.iter().flat_map(|d| ["-D", d]))
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout).unwrap()[0].clone()
}

fn expected_hint(row: &Value) -> String {
    let smem = row["smem_bytes"].as_u64().unwrap();
    let smem = if smem < 1024 {
        format!("{smem} B")
    } else if smem.is_multiple_of(1024) {
        format!("{} KiB", smem / 1024)
    } else {
        format!("{:.1} KiB", smem as f64 / 1024.0).replace(".0 ", " ")
    };
    let occ = format!("{:.1}", row["occupancy"].as_f64().unwrap() * 100.0);
    format!(
        "≈ {} regs · {smem} smem · occ {}% ({})",
        row["regs"],
        occ.trim_end_matches(".0"),
        row["arch"].as_str().unwrap()
    )
}

/// The labels of a completion answer.
fn labels_of(items: &Value) -> Vec<&str> {
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["label"].as_str().unwrap())
        .collect()
}

#[test]
fn diagnostics_hover_hints_definition_completion_emit() {
    let root = scratch("e2e");
    for f in ["main.tsr", "helpers.tsr"] {
        std::fs::copy(repo().join("tests/lsp").join(f), root.join(f)).unwrap();
    }
    let main_path = root.join("main.tsr");
    let good = std::fs::read_to_string(&main_path).unwrap();
    let main = url(&main_path);
    let mut c = Client::start(&root, json!({}));

    // A shape error: the second load's slice is twice as wide.
    let bad = good.replacen(
        "n0 : n0 + BN])\n    store",
        "n0 : n0 + 2 * BN])\n    store",
        1,
    );
    assert_ne!(bad, good);
    c.open(&main, &bad, 1);
    let diags = c.diagnostics(&main, 1);
    assert_eq!(diags.len(), 1, "{diags:#?}");
    let d = &diags[0];
    assert_eq!(d["code"], "E0402", "{d:#}");
    let (line, col) = find(&bad, "store(out", "a + b");
    assert_eq!(d["range"], range(line, col, line, col + 5), "{d:#}");
    assert_eq!(d["severity"], 1);
    assert!(
        d["codeDescription"]["href"]
            .as_str()
            .is_some_and(|h| h.contains("diagnostics.md#e0402-shapes-do-not-broadcast")),
        "{d:#}"
    );
    let related = d["relatedInformation"]
        .as_array()
        .expect("related information");
    assert!(
        related.iter().any(|r| r["message"]
            .as_str()
            .unwrap()
            .contains("Tile[128, 128, bf16]")),
        "{d:#}"
    );

    // Fix it with an incremental edit: the diagnostic is cleared.
    let (l, c0) = find(&bad, "load(y[", "2 * BN");
    c.change(&main, 2, range(l, c0, l, c0 + 6), "BN");
    assert_eq!(c.diagnostics(&main, 2), Vec::<Value>::new());

    // Hover: a tile's concrete shape, a kernel's estimate, a builtin's doc.
    let (l, col) = find(&good, "store(out", "a + b");
    let h = c.at("textDocument/hover", &main, l, col);
    let text = h["contents"]["value"].as_str().unwrap();
    assert!(text.contains("a: Tile[128, 64, bf16]"), "{text}");
    let (l, col) = find(&good, "def tile_add", "tile_add");
    let h = c.at("textDocument/hover", &main, l, col + 2);
    let text = h["contents"]["value"].as_str().unwrap().to_string();
    let row = report(&main_path, "sm_90");
    for needle in [
        "Adds two matrices tile by tile.".to_string(),
        "sm_90".into(),
        format!("| {} |", row["threads"]),
        format!("≈ {}", row["regs"]),
        row["limiter"].as_str().unwrap().to_string(),
    ] {
        assert!(text.contains(&needle), "{needle:?} in {text}");
    }
    let (l, col) = find(&good, "m0 = program_id", "program_id");
    let h = c.at("textDocument/hover", &main, l, col);
    let text = h["contents"]["value"].as_str().unwrap();
    assert!(text.contains("program_id(axis)"), "{text}");
    assert!(
        text.contains("This call: `program_id(0)` → `i32`"),
        "{text}"
    );
    let (l, col) = find(&good, "b = load", "load");
    let h = c.at("textDocument/hover", &main, l, col + 1);
    let text = h["contents"]["value"].as_str().unwrap();
    assert!(text.contains("→ `Tile[128, 64, bf16]`"), "{text}");

    // Inlay hints: the estimate after the kernel's header, shapes after tiles.
    let hints = c
        .request(
            "textDocument/inlayHint",
            json!({"textDocument": {"uri": main}, "range": range(0, 0, 100, 0)}),
        )
        .unwrap();
    let hints = hints.as_array().unwrap();
    let (header_line, _) = find(&good, "BM: const = 128", "BM");
    let estimate: Vec<&Value> = hints
        .iter()
        .filter(|h| h["label"].as_str().unwrap().starts_with('≈'))
        .collect();
    assert_eq!(estimate.len(), 1, "{hints:#?}");
    assert_eq!(estimate[0]["label"], expected_hint(&row));
    assert_eq!(estimate[0]["position"]["line"], header_line);
    let (l, col) = find(&good, "a = load", "a");
    assert!(
        hints.iter().any(|h| h["label"] == ": Tile[128, 64, bf16]"
            && h["position"] == json!({"line": l, "character": col + 1})),
        "{hints:#?}"
    );

    // Definition: a local, an imported function, a stdlib function.
    let (l, col) = find(&good, "m0 = program_id", "BM");
    let d = c.at("textDocument/definition", &main, l, col);
    let (pl, pc) = find(&good, "BM: const = 128", "BM");
    assert_eq!(d["uri"], main);
    assert_eq!(d["range"], range(pl, pc, pl, pc + 2));
    let (l, col) = find(&good, "return scale(", "scale");
    let d = c.at("textDocument/definition", &main, l, col);
    let helpers = std::fs::read_to_string(root.join("helpers.tsr")).unwrap();
    let (hl, hc) = find(&helpers, "def scale", "scale");
    assert_eq!(d["uri"], url(&root.join("helpers.tsr")));
    assert_eq!(d["range"], range(hl, hc, hl, hc + 5));
    let (l, col) = find(&good, "return scale(", "relu");
    let d = c.at("textDocument/definition", &main, l, col);
    let std_uri = d["uri"].as_str().unwrap();
    assert!(std_uri.ends_with("/std/nn.tsr"), "{d:#}");
    let std_text = std::fs::read_to_string(std_uri.strip_prefix("file://").unwrap()).unwrap();
    let (sl, _) = find(&std_text, "def relu", "relu");
    assert_eq!(d["range"]["start"]["line"], sl);

    // References of `scale`: its definition, the import and the call.
    let refs = c
        .request(
            "textDocument/references",
            json!({"textDocument": {"uri": main}, "position": {"line": l, "character": col - 5},
                   "context": {"includeDeclaration": true}}),
        )
        .unwrap();
    let refs = refs.as_array().unwrap();
    assert_eq!(refs.len(), 3, "{refs:#?}");
    assert!(refs
        .iter()
        .any(|r| r["uri"] == url(&root.join("helpers.tsr"))));

    // Completion: locals, dims, builtins with signatures, dtypes; module members.
    let (l, col) = find(&good, "store(out", "a + b");
    let items = c.at("textDocument/completion", &main, l, col);
    let labels = labels_of(&items);
    for want in ["m0", "n0", "BM", "M", "x", "load", "bf16", "nn"] {
        assert!(labels.contains(&want), "{want} in {labels:?}");
    }
    // Nothing a kernel may not call: functions (E0508), whole-tensor and
    // session builtins (E0508, E0725).
    for absent in ["scale", "twice", "matmul", "print", "load_npy"] {
        assert!(!labels.contains(&absent), "{absent} in {labels:?}");
    }
    let load = items
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["label"] == "load")
        .unwrap();
    assert!(
        load["detail"].as_str().unwrap().starts_with("load("),
        "{load}"
    );
    let (l, col) = find(&good, "return scale(", "relu");
    let items = c.at("textDocument/completion", &main, l, col);
    let labels = labels_of(&items);
    assert!(
        labels.contains(&"relu") && labels.contains(&"softmax"),
        "{labels:?}"
    );
    // In a whole-tensor function: functions and tensor builtins, no kernel
    // builtins (E0503) or session builtins (E0725).
    let (l, col) = find(&good, "return scale(", "scale");
    let items = c.at("textDocument/completion", &main, l, col);
    let labels = labels_of(&items);
    for want in ["scale", "tile_add", "matmul", "a"] {
        assert!(labels.contains(&want), "{want} in {labels:?}");
    }
    for absent in ["load", "program_id", "print", "save_npy"] {
        assert!(!labels.contains(&absent), "{absent} in {labels:?}");
    }

    // Signature help inside `load(`.
    let (l, col) = find(&good, "a = load", "x[");
    let s = c.at("textDocument/signatureHelp", &main, l, col);
    assert!(
        s["signatures"][0]["label"]
            .as_str()
            .unwrap()
            .starts_with("load("),
        "{s}"
    );
    assert_eq!(s["activeParameter"], 0);

    // Symbols and semantic tokens.
    let syms = c
        .request(
            "textDocument/documentSymbol",
            json!({"textDocument": {"uri": main}}),
        )
        .unwrap();
    let names: Vec<&str> = syms
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"tile_add") && names.contains(&"twice"),
        "{names:?}"
    );
    let toks = c
        .request(
            "textDocument/semanticTokens/full",
            json!({"textDocument": {"uri": main}}),
        )
        .unwrap();
    let data = toks["data"].as_array().unwrap();
    assert!(data.len() > 50 && data.len().is_multiple_of(5));

    // tessera/emit: Tile IR by name, PTX of the kernel around a position,
    // Graph IR of a function, and an error for a file with a shape error.
    let r = c
        .request(
            "tessera/emit",
            json!({"uri": main, "kind": "tile-ir", "kernel": "tile_add"}),
        )
        .unwrap();
    assert_eq!(r["name"], "tile_add");
    assert!(r["text"].as_str().unwrap().contains("tile_add"));
    let (l, col) = find(&good, "a = load", "load");
    let r = c
        .request(
            "tessera/emit",
            json!({"uri": main, "kind": "ptx", "arch": "sm_80", "position": {"line": l, "character": col}}),
        )
        .unwrap();
    assert_eq!(r["name"], "tile_add");
    let ptx = r["text"].as_str().unwrap();
    assert!(
        ptx.contains(".target sm_80") && ptx.contains(".entry tile_add"),
        "{ptx}"
    );
    let r = c
        .request(
            "tessera/emit",
            json!({"uri": main, "kind": "graph-ir", "kernel": "twice"}),
        )
        .unwrap();
    assert_eq!(r["name"], "twice");
    // Every level: the same text as `tessera emit` prints for it.
    for (kind, name) in [
        ("graph-ir", "twice"),
        ("schedule-ir", "twice"),
        ("tile-ir", "tile_add"),
        ("target-ir", "tile_add"),
        ("ptx", "tile_add"),
    ] {
        let r = c
            .request(
                "tessera/emit",
                json!({"uri": main, "kind": kind, "kernel": name}),
            )
            .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["emit", "--emit", kind, "--kernel", name])
            .arg(&main_path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            r["text"].as_str().unwrap().trim_end(),
            String::from_utf8_lossy(&out.stdout).trim_end(),
            "{kind} of {name}"
        );
    }
    let (l, c0) = find(&good, "load(y[", "BN])");
    c.change(&main, 3, range(l, c0, l, c0 + 2), "2 * BN");
    assert_eq!(c.diagnostics(&main, 3).len(), 1);
    let e = c
        .request(
            "tessera/emit",
            json!({"uri": main, "kind": "target-ir", "kernel": "tile_add"}),
        )
        .unwrap_err();
    assert_eq!(e["code"], -32803);
    assert!(e["message"].as_str().unwrap().contains("E0402"), "{e}");
    let e = c
        .request(
            "tessera/emit",
            json!({"uri": main, "kind": "sass", "kernel": "tile_add"}),
        )
        .unwrap_err();
    assert_eq!(e["code"], -32602);
    // HIP for an AMD arch, PTX for an NVIDIA one; the other way round is
    // refused with a message naming the right kind.
    for (kind, arch, says) in [
        ("hip", "sm_80", "HIP needs an AMD target"),
        ("ptx", "gfx90a", "PTX needs an NVIDIA target"),
    ] {
        let e = c
            .request(
                "tessera/emit",
                json!({"uri": main, "kind": kind, "arch": arch, "kernel": "tile_add"}),
            )
            .unwrap_err();
        assert_eq!(e["code"], -32803, "{e}");
        assert!(e["message"].as_str().unwrap().contains(says), "{e}");
    }
    c.change(&main, 4, range(l, c0, l, c0 + 6), "BN");
    assert!(c.diagnostics(&main, 4).is_empty());
    let hip = c
        .request(
            "tessera/emit",
            json!({"uri": main, "kind": "hip", "arch": "gfx942", "kernel": "tile_add"}),
        )
        .unwrap();
    let text = hip["text"].as_str().unwrap();
    assert!(text.contains("for gfx942 (64-lane waves)"), "{text}");
    assert!(text.contains("extern \"C\" __global__"), "{text}");
    assert!(text.contains("void tile_add("), "{text}");

    // A quick fix for a misspelt builtin.
    let (l, col) = find(&good, "b = load", "load");
    c.change(&main, 5, range(l, col, l, col + 4), "laod");
    let diags = c.diagnostics(&main, 5);
    let d = diags
        .iter()
        .find(|d| d["message"].as_str().unwrap().contains("did you mean"))
        .expect("did you mean");
    let actions = c
        .request(
            "textDocument/codeAction",
            json!({"textDocument": {"uri": main}, "range": d["range"], "context": {"diagnostics": [d]}}),
        )
        .unwrap();
    let edit = &actions[0]["edit"]["changes"][&main][0];
    assert_eq!(edit["newText"], "load");
    assert_eq!(edit["range"], range(l, col, l, col + 4));
    c.change(&main, 6, range(l, col, l, col + 4), "load");
    assert!(c.diagnostics(&main, 6).is_empty());

    // A quick fix that converts: an f32 sum stored into a bf16 tensor.
    let (l, col) = find(&good, "store(out", "a + b");
    c.change(&main, 7, range(l, col, l, col + 5), "a + b.to(f32)");
    let diags = c.diagnostics(&main, 7);
    let d = diags
        .iter()
        .find(|d| d["code"] == "E0301")
        .unwrap_or_else(|| panic!("E0301 in {diags:#?}"));
    let actions = c
        .request(
            "textDocument/codeAction",
            json!({"textDocument": {"uri": main}, "range": d["range"], "context": {"diagnostics": [d]}}),
        )
        .unwrap();
    let edit = &actions[0]["edit"]["changes"][&main][0];
    assert_eq!(edit["newText"], "(a + b.to(f32)).to(bf16)", "{actions:#}");
    assert_eq!(edit["range"], range(l, col, l, col + 13));
    c.change(&main, 8, range(l, col, l, col + 13), "a + b");
    assert!(c.diagnostics(&main, 8).is_empty());

    // A document not saved anywhere (VS Code's untitled editors) is checked too.
    // Just the kernel: there is no folder to import `helpers` from.
    let kernel = &bad[bad.find("@kernel").unwrap()..bad.find("\n\n\ndef twice").unwrap()];
    let untitled = "untitled:Untitled-1";
    c.open(untitled, kernel, 1);
    let diags = c.diagnostics(untitled, 1);
    assert_eq!(diags.len(), 1, "{diags:#?}");
    assert_eq!(diags[0]["code"], "E0402");
    let (l, col) = find(kernel, "store(out", "a + b");
    let h = c.at("textDocument/hover", untitled, l, col);
    assert!(h["contents"]["value"]
        .as_str()
        .unwrap()
        .contains("Tile[128, 64, bf16]"));

    // The arch setting changes the estimate (and re-publishes diagnostics).
    c.notify(
        "workspace/didChangeConfiguration",
        json!({"settings": {"tessera": {"arch": "sm_80"}}}),
    );
    assert!(c.diagnostics(&main, 8).is_empty());
    let hints = c
        .request(
            "textDocument/inlayHint",
            json!({"textDocument": {"uri": main}, "range": range(0, 0, 100, 0)}),
        )
        .unwrap();
    let row80 = report(&main_path, "sm_80");
    assert!(
        hints
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["label"] == expected_hint(&row80)),
        "{hints:#?} vs {row80}"
    );
    c.stop();
}

impl Client {
    /// Waits for a publication of `uri`'s diagnostics (any version) whose
    /// codes are `codes` (sorted); earlier ones are skipped.
    fn diagnostics_become(&mut self, uri: &str, codes: &[&str]) {
        let matches = |m: &Value| {
            if m["method"] != "textDocument/publishDiagnostics" || m["params"]["uri"] != uri {
                return false;
            }
            let mut got: Vec<&str> = m["params"]["diagnostics"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["code"].as_str().unwrap())
                .collect();
            got.sort();
            got == codes
        };
        if let Some(i) = self.queued.iter().position(matches) {
            self.queued.drain(..=i);
            return;
        }
        loop {
            let m = self.recv();
            if matches(&m) {
                return;
            }
            self.queued.push(m);
        }
    }
}

/// Workspace files are known before they are opened, and diagnostics follow
/// edits of other files: an open importer is re-published when an imported
/// file changes in the editor or, closed, on disk.
#[test]
fn editing_an_imported_file_updates_its_importers() {
    let root = scratch("importers");
    for f in ["main.tsr", "helpers.tsr"] {
        std::fs::copy(repo().join("tests/lsp").join(f), root.join(f)).unwrap();
    }
    let main_text = std::fs::read_to_string(root.join("main.tsr")).unwrap();
    let helpers_text = std::fs::read_to_string(root.join("helpers.tsr")).unwrap();
    let (main, helpers) = (url(&root.join("main.tsr")), url(&root.join("helpers.tsr")));
    let mut c = Client::start(&root, json!({}));
    c.open(&helpers, &helpers_text, 1);
    assert!(c.diagnostics(&helpers, 1).is_empty());
    // main.tsr is not open: the server loaded it with the workspace, so the
    // references of `scale` include its import and call.
    let (l, col) = find(&helpers_text, "def scale", "scale");
    let refs = c
        .request(
            "textDocument/references",
            json!({"textDocument": {"uri": helpers}, "position": {"line": l, "character": col},
                   "context": {"includeDeclaration": false}}),
        )
        .unwrap();
    let in_main = refs
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["uri"] == main)
        .count();
    assert_eq!(in_main, 2, "{refs:#}");
    c.open(&main, &main_text, 1);
    assert!(c.diagnostics(&main, 1).is_empty());

    // Rename `scale` in helpers.tsr: main.tsr's import of it breaks.
    c.change(&helpers, 2, range(l, col, l, col + 5), "scaled");
    c.diagnostics_become(&main, &["E0203"]);
    c.change(&helpers, 3, range(l, col, l, col + 6), "scale");
    c.diagnostics_become(&main, &[]);

    // Closed, then changed on disk (the client's file watcher reports it).
    c.notify(
        "textDocument/didClose",
        json!({"textDocument": {"uri": helpers}}),
    );
    std::fs::write(
        root.join("helpers.tsr"),
        helpers_text.replace("def scale", "def scaled"),
    )
    .unwrap();
    c.notify(
        "workspace/didChangeWatchedFiles",
        json!({"changes": [{"uri": helpers, "type": 2}]}),
    );
    c.diagnostics_become(&main, &["E0203"]);
    c.stop();
}

/// Bad initialization options do not stop the server: each is shown to the
/// user, and the defaults serve.
#[test]
fn bad_settings_are_shown_and_the_server_runs_on() {
    let root = scratch("settings");
    let path = root.join("main.tsr");
    std::fs::copy(repo().join("tests/lsp/main.tsr"), &path).unwrap();
    std::fs::copy(
        repo().join("tests/lsp/helpers.tsr"),
        root.join("helpers.tsr"),
    )
    .unwrap();
    let mut c = Client::start(&root, json!({"arch": "sm_99", "defines": {"BM": 1.5}}));
    let mut shown = Vec::new();
    while shown.len() < 2 {
        let m = c.recv();
        if m["method"] == "window/showMessage" {
            shown.push(m["params"]["message"].as_str().unwrap().to_string());
        }
    }
    shown.sort();
    assert!(
        shown[0].starts_with("tessera.arch: unknown arch `sm_99`"),
        "{shown:?}"
    );
    assert!(
        shown[1].starts_with("tessera.defines:") && shown[1].contains("`BM`"),
        "{shown:?}"
    );
    let uri = url(&path);
    let text = std::fs::read_to_string(&path).unwrap();
    c.open(&uri, &text, 1);
    assert!(c.diagnostics(&uri, 1).is_empty());
    assert_eq!(
        kernel_hints(&mut c, &uri),
        [expected_hint(&report(&path, "sm_90"))]
    );
    c.stop();
}

/// A `tessera.defines` name that no kernel of the workspace has gets the
/// message `-D NAME` gets, at startup and when the setting changes.
#[test]
fn defines_setting_names_are_checked_like_dash_d() {
    let root = scratch("defines-names");
    std::fs::copy(
        repo().join("tests/lsp/flash_attn.tsr"),
        root.join("flash_attn.tsr"),
    )
    .unwrap();
    let mut c = Client::start(&root, json!({"defines": {"D": 64, "NOPE": 1}}));
    let shown = |c: &mut Client| loop {
        let m = c.recv();
        if m["method"] == "window/showMessage" {
            return m["params"]["message"].as_str().unwrap().to_string();
        }
    };
    let m = shown(&mut c);
    assert!(
        m.starts_with("tessera.defines: `-D NOPE`: kernel `flash_attn` has no const parameter or tensor dim named `NOPE` (it may set: ")
            && m.contains("D, "),
        "{m}"
    );
    c.notify(
        "workspace/didChangeConfiguration",
        json!({"settings": {"tessera": {"defines": {"D": 64, "BN": 32, "ALSO": 2}}}}),
    );
    let m = shown(&mut c);
    assert!(
        m.starts_with("tessera.defines: `-D ALSO`: kernel `flash_attn` has no"),
        "{m}"
    );
    c.stop();
}

/// The kernel estimate hint of the document (the one that is not a type).
fn kernel_hints(c: &mut Client, uri: &str) -> Vec<String> {
    let hints = c
        .request(
            "textDocument/inlayHint",
            json!({"textDocument": {"uri": uri}, "range": range(0, 0, 100, 0)}),
        )
        .unwrap();
    hints
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["kind"] != json!(1))
        .map(|h| h["label"].as_str().unwrap().to_string())
        .collect()
}

/// The brief's `flash_attn` is specialised on `D`: without a value its hint
/// says so; `tessera.defines` gives it one, and then hint, hover, resource
/// diagnostics and `tessera/emit` agree with `tessera report -D D=64`.
#[test]
fn defines_setting_specialises_every_estimate() {
    let root = scratch("defines");
    let path = root.join("flash_attn.tsr");
    std::fs::copy(repo().join("tests/lsp/flash_attn.tsr"), &path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let uri = url(&path);
    let mut c = Client::start(&root, json!({}));
    c.open(&uri, &text, 1);
    assert!(c.diagnostics(&uri, 1).is_empty());

    assert_eq!(kernel_hints(&mut c, &uri), ["≈ needs D (tessera.defines)"]);
    let (l, col) = find(&text, "def flash_attn", "flash_attn");
    let h = c.at("textDocument/hover", &uri, l, col + 2);
    let md = h["contents"]["value"].as_str().unwrap().to_string();
    assert!(
        md.contains("No resource estimate: E0511") && md.contains("`tessera.defines`"),
        "{md}"
    );
    let emit = json!({"uri": uri, "kind": "tile-ir", "kernel": "flash_attn"});
    let e = c.request("tessera/emit", emit.clone()).unwrap_err();
    assert!(e["message"].as_str().unwrap().contains("E0511"), "{e}");
    // A define the kernel does not have is refused, as `tsrc emit -D NOPE=1` is.
    let mut bad = emit.clone();
    bad["defines"] = json!({"NOPE": 1});
    let e = c.request("tessera/emit", bad).unwrap_err();
    assert_eq!(e["code"], -32602, "{e}");
    assert!(e["message"].as_str().unwrap().contains("`-D NOPE`"), "{e}");

    c.notify(
        "workspace/didChangeConfiguration",
        json!({"settings": {"tessera": {"defines": {"D": 64}}}}),
    );
    // Re-published with the defines: the resource pass now lowers the kernel
    // and notes its occupancy, as `tessera report -D D=64` does: a note
    // (Information, 3), not a warning, since its tensor-core loop hides latency.
    let mut codes = Vec::new();
    for _ in 0..2 {
        codes = c
            .diagnostics(&uri, 1)
            .iter()
            .map(|d| {
                (
                    d["code"].as_str().unwrap().to_string(),
                    d["severity"].clone(),
                )
            })
            .collect();
        if !codes.is_empty() {
            break;
        }
    }
    assert_eq!(codes, [("W0006".to_string(), json!(3))]);
    let row = report_with(&path, "sm_90", &["D=64"]);
    assert_eq!(kernel_hints(&mut c, &uri), [expected_hint(&row)]);
    let h = c.at("textDocument/hover", &uri, l, col + 2);
    let md = h["contents"]["value"].as_str().unwrap().to_string();
    assert!(
        md.contains("as `tsrc report -D D=64`") && md.contains(&format!("≈ {}", row["regs"])),
        "{md}"
    );
    // `tessera/emit` without its own defines uses the setting's.
    let ir = c.request("tessera/emit", emit).unwrap();
    assert!(ir["text"].as_str().unwrap().contains("D = 64"), "{ir}");

    // An edit outside the kernel: the first publication (the checker's, at
    // once) already repeats the kernel's W0006, one line further down.
    let (wl, _) = find(&text, "def flash_attn", "flash_attn");
    c.change(&uri, 2, range(0, 0, 0, 0), "# attention\n");
    let diags = c.diagnostics(&uri, 2);
    assert_eq!(diags.len(), 1, "{diags:#?}");
    assert_eq!(diags[0]["code"], "W0006");
    assert_eq!(diags[0]["severity"], 3);
    assert_eq!(diags[0]["range"]["start"]["line"], wl + 1);
    c.stop();
}

#[test]
fn typing_every_stdlib_module_keystroke_by_keystroke() {
    let root = scratch("typing");
    let mut c = Client::start(&root, json!({"arch": "sm_80"}));
    let mut modules: Vec<PathBuf> = std::fs::read_dir(repo().join("stdlib/std"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "tsr"))
        .collect();
    modules.sort();
    assert!(!modules.is_empty());
    for module in modules {
        let text = std::fs::read_to_string(&module).unwrap();
        let uri = url(&root.join(module.file_name().unwrap()));
        c.open(&uri, "", 0);
        assert!(c.diagnostics(&uri, 0).is_empty());
        let (mut line, mut col) = (0u32, 0u32);
        let chars: Vec<char> = text.chars().collect();
        let mut last = Vec::new();
        for (i, ch) in chars.iter().enumerate() {
            let version = i as i64 + 1;
            c.change(&uri, version, range(line, col, line, col), &ch.to_string());
            if *ch == '\n' {
                line += 1;
                col = 0;
            } else {
                col += ch.len_utf16() as u32;
            }
            // Every prefix gets its own diagnostics, and they are well-formed.
            last = c.diagnostics(&uri, version);
            for d in &last {
                assert!(d["code"].as_str().is_some_and(|c| c.len() == 5), "{d}");
                assert!(
                    d["range"]["start"]["line"].as_u64().unwrap() <= line as u64,
                    "{d}"
                );
            }
        }
        // The whole module checks cleanly, as `tessera check` says of the stdlib.
        assert!(
            last.iter().all(|d| d["severity"] != 1),
            "{}: {last:#?}",
            module.display()
        );
        c.request(
            "textDocument/documentSymbol",
            json!({"textDocument": {"uri": uri}}),
        )
        .expect("the server still answers");
        c.notify(
            "textDocument/didClose",
            json!({"textDocument": {"uri": uri}}),
        );
    }
    c.stop();
}

/// A `tessera run` script with session builtins (`print`, `len`, `load_npy`,
/// `save_npy`), a float const given at the launch and element assignment:
/// the language server reports no error on it; `print` inside a function is
/// E0725.
#[test]
fn session_script_has_no_false_errors() {
    let root = scratch("session");
    let path = root.join("script.tsr");
    let text = std::fs::read_to_string(repo().join("tests/run/session_builtins.tsr")).unwrap();
    std::fs::write(&path, &text).unwrap();
    let uri = url(&path);
    let mut c = Client::start(&root, json!({}));
    c.open(&uri, &text, 1);
    let errors: Vec<Value> = c
        .diagnostics(&uri, 1)
        .into_iter()
        .filter(|d| d["severity"] == 1)
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let (l, col) = find(&text, "z = load_npy", "load_npy");
    let h = c.at("textDocument/hover", &uri, l, col + 2);
    let md = h["contents"]["value"].as_str().unwrap().to_string();
    assert!(md.contains("known at run time"), "{md}");

    let bad = format!(
        "{text}\ndef f(x: Tensor[N, f32]) -> Tensor[N, f32]:\n    print(x)\n    return x\n"
    );
    let bad_path = root.join("bad.tsr");
    std::fs::write(&bad_path, &bad).unwrap();
    let bad_uri = url(&bad_path);
    c.open(&bad_uri, &bad, 1);
    let codes: Vec<String> = c
        .diagnostics(&bad_uri, 1)
        .iter()
        .filter(|d| d["severity"] == 1)
        .map(|d| d["code"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(codes, ["E0725"]);
    c.stop();
}

impl Client {
    /// Writes raw bytes to the server, in pieces of `piece` bytes.
    fn raw(&self, bytes: &[u8], piece: usize) {
        for part in bytes.chunks(piece.max(1)) {
            let mut w = self.stdin.lock().unwrap();
            w.write_all(part).unwrap();
            w.flush().unwrap();
            drop(w);
            if piece < bytes.len() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// The next response with `id` (`null` for an error about no request).
    fn response(&mut self, id: Value) -> Value {
        loop {
            let m = self.recv();
            if m.get("method").is_none() && m["id"] == id {
                return m;
            }
            self.queued.push(m);
        }
    }
}

fn framed(body: &str) -> Vec<u8> {
    format!("Content-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

#[test]
fn malformed_messages_are_answered_and_the_server_keeps_serving() {
    let root = scratch("malformed");
    let mut c = Client::start(&root, json!({}));
    let code = |m: &Value| m["error"]["code"].as_i64().unwrap();
    // Not JSON: parse error, id null.
    c.raw(&framed(r#"{"jsonrpc":"2.0","id":1,"meth"#), usize::MAX);
    assert_eq!(code(&c.response(Value::Null)), -32700);
    // JSON, but not a JSON-RPC message: invalid request.
    c.raw(&framed("[1, 2]"), usize::MAX);
    assert_eq!(code(&c.response(Value::Null)), -32600);
    // A bad method with a valid id: the answer carries the id.
    c.raw(
        &framed(r#"{"jsonrpc":"2.0","id":77,"method":5}"#),
        usize::MAX,
    );
    assert_eq!(code(&c.response(json!(77))), -32600);
    // Headers without Content-Length: parse error, then the next message is read.
    c.raw(b"Content-Type: text/plain\r\n\r\n", usize::MAX);
    assert_eq!(code(&c.response(Value::Null)), -32700);
    // A valid request split into 3-byte writes, after all that: answered.
    let hover = json!({"jsonrpc": "2.0", "id": 78, "method": "textDocument/hover",
        "params": {"textDocument": {"uri": url(&root.0.join("none.tsr"))},
                   "position": {"line": 0, "character": 0}}});
    c.raw(&framed(&hover.to_string()), 3);
    let r = c.response(json!(78));
    assert!(r.get("result").is_some() || r.get("error").is_some(), "{r}");

    // A lone `\r` ends a line, as the protocol counts lines: the unknown name
    // is on line 3 (0-based), after `# one`, `# two` and the `def` line.
    let uri = url(&root.0.join("cr.tsr"));
    let text = "# one\r# two\ndef f(a: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return b\n";
    c.open(&uri, text, 1);
    let diags = c.diagnostics(&uri, 1);
    assert_eq!(diags.len(), 1, "{diags:#?}");
    assert_eq!(diags[0]["code"], "E0201");
    assert_eq!(diags[0]["range"], range(3, 11, 3, 12));
    // An edit addressed in those lines lands where the editor means it.
    c.change(&uri, 2, range(3, 11, 3, 12), "a");
    assert!(c.diagnostics(&uri, 2).is_empty());
    c.stop();
}

/// A kernel whose estimate takes long: `statements` chains of `MAX_DEPTH - 2`
/// terms (as deep as a statement in a function body may go), each depending on
/// the one before.
fn slow_kernel(statements: usize) -> String {
    let chain = vec!["a"; tessera::syntax::MAX_DEPTH - 2].join(" + ");
    let mut text = String::from(
        "@kernel(grid=(1,), num_warps=4)\n\
         def slow(x: Tensor[128, f32], out: Tensor[128, f32]):\n    \
             a = load(x[0 : 128])\n",
    );
    for _ in 0..statements {
        text += &format!("    a = {chain}\n");
    }
    text += "    store(out[0 : 128], a)\n";
    text
}

/// An edit cancels the estimate still running on the old text (tens of
/// seconds of lowering in a debug build, one long query), so that a request
/// after the edit is answered at once rather than after it; and every query
/// answers on a document nested as deep as the language allows (the server's
/// threads have the stack for it).
#[test]
fn an_edit_cancels_a_long_estimate_and_deep_documents_answer() {
    let root = scratch("slow");
    let path = root.join("slow.tsr");
    let text = slow_kernel(2);
    std::fs::write(&path, &text).unwrap();
    let uri = url(&path);
    let last = text.lines().count() as u32;
    let mut c = Client::start(&root, json!({}));
    c.open(&uri, &text, 1);
    // the checker's diagnostics; the estimate starts a moment later
    assert!(c.diagnostics(&uri, 1).is_empty());
    std::thread::sleep(Duration::from_millis(1000));
    let small = "def f(x: Tensor[4, f32]) -> Tensor[4, f32]:\n    return x * 2.0\n";
    let edited = Instant::now();
    c.change(&uri, 2, range(0, 0, last, 0), small);
    let hover = c.at("textDocument/hover", &uri, 1, 11);
    let waited = edited.elapsed();
    assert!(hover.to_string().contains("f32"), "{hover}");
    assert!(c.diagnostics(&uri, 2).is_empty());
    assert!(
        waited < Duration::from_secs(10),
        "a request after the edit waited {waited:?} for the old text's estimate"
    );

    // back to the deep text: every query answers
    c.change(&uri, 3, range(0, 0, 2, 0), &text);
    assert!(c.diagnostics(&uri, 3).is_empty());
    let hover = c.at("textDocument/hover", &uri, 3, 4);
    assert!(hover.to_string().contains("f32"), "{hover}");
    for (method, params) in [
        (
            "textDocument/inlayHint",
            json!({"textDocument": {"uri": uri}, "range": range(0, 0, last, 0)}),
        ),
        (
            "textDocument/semanticTokens/full",
            json!({"textDocument": {"uri": uri}}),
        ),
        (
            "textDocument/completion",
            json!({"textDocument": {"uri": uri}, "position": {"line": 3, "character": 8}}),
        ),
        (
            "textDocument/references",
            json!({"textDocument": {"uri": uri}, "position": {"line": 2, "character": 4},
                   "context": {"includeDeclaration": true}}),
        ),
    ] {
        let r = c.request(method, params);
        assert!(r.is_ok(), "{method}: {r:?}");
        assert!(!r.unwrap().is_null(), "{method}");
    }
    c.stop();
}
