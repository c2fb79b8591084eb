//! Edit-to-diagnostics latency of the language server on a 2,000-line file,
//! and the time to first diagnostics on open. The server runs in-process over
//! an in-memory pipe and is driven with real LSP messages, as an editor would:
//! each edit is an incremental `didChange`, and its latency runs from sending
//! it to receiving the `publishDiagnostics` of its version.
//!
//!   cargo bench -p tessera-lsp --bench latency [-- EDITS]
//!
//! Prints p50/p95/max for edits inside kernels and for a line typed above
//! every item. The goal is p95 ≤ 20 ms (typing must feel instant) on the 2-core CI machine.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// A file of about `lines` lines: kernels (tiles, loads, dots) and
/// whole-tensor functions, each named apart.
fn big_file(lines: usize) -> String {
    let mut out = String::from("# Latency benchmark input.\nconst BLOCK = 1024\n\n");
    let mut i = 0;
    while out.lines().count() < lines {
        out.push_str(&format!(
            "@kernel(grid=(cdiv(M, BM), cdiv(N, BN)), num_warps=8)
def add_{i}(x: Tensor[\"M\", \"N\", bf16], y: Tensor[\"M\", \"N\", bf16], out: Tensor[\"M\", \"N\", bf16],
            BM: const = 64, BN: const = 64):
    \"Adds two matrices tile by tile.\"
    m0 = program_id(0) * BM
    n0 = program_id(1) * BN
    a = load(x[m0 : m0 + BM, n0 : n0 + BN])
    b = load(y[m0 : m0 + BM, n0 : n0 + BN])
    c = a + b * 2.0
    store(out[m0 : m0 + BM, n0 : n0 + BN], c)


@kernel(grid=(cdiv(N, BLOCK),), num_warps=4)
def scale_{i}(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):
    j = program_id(0) * BLOCK
    v = load(x[j : j + BLOCK])
    store(out[j : j + BLOCK], v * 0.5 + 1.0)


def mix_{i}(a: Tensor[\"M\", \"N\", f32], b: Tensor[\"M\", \"N\", f32]) -> Tensor[\"M\", \"N\", f32]:
    return a * 0.5 + b


"
        ));
        i += 1;
    }
    out
}

struct Client {
    tx: mpsc::UnboundedSender<Value>,
    rx: mpsc::UnboundedReceiver<Value>,
}

impl Client {
    fn send(&self, msg: Value) {
        self.tx.send(msg).unwrap();
    }

    async fn wait(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(120), self.rx.recv())
                .await
                .expect("the server answers within 2 minutes")
                .expect("the server is running");
            if pred(&m) {
                return m;
            }
        }
    }

    async fn diagnostics(&mut self, uri: &str, version: i64) -> Value {
        self.wait(|m| {
            m["method"] == "textDocument/publishDiagnostics"
                && m["params"]["uri"] == uri
                && m["params"]["version"] == json!(version)
        })
        .await
    }
}

fn start() -> Client {
    let (client_io, server_io) = tokio::io::duplex(1 << 22);
    let (sr, sw) = tokio::io::split(server_io);
    tokio::spawn(tessera_lsp::serve(sr, sw));
    let (cr, mut cw) = tokio::io::split(client_io);
    let (tx, mut out_rx) = mpsc::unbounded_channel::<Value>();
    let (in_tx, rx) = mpsc::unbounded_channel::<Value>();
    tokio::spawn(async move {
        while let Some(msg) = out_rx.recv().await {
            let body = msg.to_string();
            let frame = format!("Content-Length: {}\r\n\r\n{body}", body.len());
            if cw.write_all(frame.as_bytes()).await.is_err() {
                return;
            }
        }
    });
    let answer = tx.clone();
    tokio::spawn(async move {
        let mut r = BufReader::new(cr);
        loop {
            let mut len = 0;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).await.unwrap_or(0) == 0 {
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
            if r.read_exact(&mut body).await.is_err() {
                return;
            }
            let msg: Value = serde_json::from_slice(&body).unwrap();
            if msg.get("method").is_some() && msg.get("id").is_some() {
                let _ = answer.send(json!({"jsonrpc": "2.0", "id": msg["id"], "result": null}));
                continue;
            }
            if in_tx.send(msg).is_err() {
                return;
            }
        }
    });
    Client { tx, rx }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let edits: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let text = big_file(2000);
        let lines: Vec<&str> = text.lines().collect();
        let dir = std::env::temp_dir().join(format!("tessera-lsp-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.tsr");
        std::fs::write(&path, &text).unwrap();
        let uri = format!("file://{}", path.display());
        let mut c = start();
        c.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"processId": null, "rootUri": null, "capabilities": {}}}));
        c.wait(|m| m["id"] == json!(1)).await;
        c.send(json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}));

        let t = Instant::now();
        c.send(json!({"jsonrpc": "2.0", "method": "textDocument/didOpen",
            "params": {"textDocument": {"uri": uri, "languageId": "tessera", "version": 0, "text": text}}}));
        let first = c.diagnostics(&uri, 0).await;
        let open = t.elapsed();
        assert_eq!(first["params"]["diagnostics"], json!([]), "the input checks cleanly");

        // Edits inside kernel bodies across the file: `2.0` ↔ `3.0`.
        let targets: Vec<(usize, usize)> = lines
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.find("b * 2.0").map(|c| (i, c + 4)))
            .collect();
        let mut times = Vec::with_capacity(edits);
        let mut current = vec!['2'; targets.len()];
        for v in 1..=edits {
            let k = (v * 7) % targets.len();
            let (line, col) = targets[k];
            let new = if current[k] == '2' { '3' } else { '2' };
            current[k] = new;
            let t = Instant::now();
            c.send(json!({"jsonrpc": "2.0", "method": "textDocument/didChange",
                "params": {"textDocument": {"uri": uri, "version": v},
                           "contentChanges": [{"range": {"start": {"line": line, "character": col},
                                                         "end": {"line": line, "character": col + 1}},
                                               "text": new.to_string()}]}}));
            let d = c.diagnostics(&uri, v as i64).await;
            times.push(t.elapsed());
            assert_eq!(d["params"]["diagnostics"], json!([]));
        }
        // Edits at the top of the file: a line typed and deleted above every
        // item, which moves all of them (their diagnostics' spans shift).
        let mut top = Vec::with_capacity(edits);
        for v in edits + 1..=2 * edits {
            let change = if v % 2 == 1 {
                json!({"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}},
                       "text": "# x\n"})
            } else {
                json!({"range": {"start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 0}},
                       "text": ""})
            };
            let t = Instant::now();
            c.send(json!({"jsonrpc": "2.0", "method": "textDocument/didChange",
                "params": {"textDocument": {"uri": uri, "version": v},
                           "contentChanges": [change]}}));
            let d = c.diagnostics(&uri, v as i64).await;
            top.push(t.elapsed());
            assert_eq!(d["params"]["diagnostics"], json!([]));
        }
        times.sort();
        top.sort();
        println!(
            "file: {} lines, {} bytes; {} edits of each kind",
            lines.len(),
            text.len(),
            edits
        );
        println!("first diagnostics on open: {}", ms(open));
        println!(
            "edit-to-diagnostics, inside a kernel: p50 {}  p95 {}  max {}",
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.95)),
            ms(*times.last().unwrap())
        );
        println!(
            "edit-to-diagnostics, a line above every item: p50 {}  p95 {}  max {}",
            ms(percentile(&top, 0.5)),
            ms(percentile(&top, 0.95)),
            ms(*top.last().unwrap())
        );
        let _ = std::fs::remove_dir_all(&dir);
    });
}
