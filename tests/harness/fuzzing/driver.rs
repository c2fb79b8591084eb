//! The long-run driver: worker processes run inputs through every stage
//! (see [`super::exec`]) and tell their parent, line by line on stdout, which
//! input and stage they are in; the parent kills a worker that spends longer
//! than the hang limit on one input, notices a worker that a stack overflow,
//! an abort or a signal ended, records the input (regenerated from the seed
//! and index), restarts the worker after it, and at the end minimizes each
//! distinct failure in child processes and writes it to the output directory.
//!
//! Worker protocol (stdout lines): `B index` an input begins, `S stage` a
//! stage begins, `P index stage message` a caught panic, `T counts` totals.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::exec::{execute, execute_here, process_cpu_ms, quiet_panics, Counts, Limits, Stage};
use super::inputs::{input, Corpus};
use super::minimize::minimize;
use super::state::RunState;

/// Options of a run (the binary's flags).
#[derive(Clone, Debug)]
pub struct Options {
    pub seconds: u64,
    pub jobs: u64,
    pub seed: u64,
    pub out: PathBuf,
    pub run_budget: Duration,
    pub hang: Duration,
    pub minimize: Duration,
    pub memory_mb: u64,
    /// Stop after this many inputs per worker (for reproducible short runs).
    pub max_inputs: Option<u64>,
    /// Directory of known, routed findings (`# fuzz: SIGNATURE` headers).
    pub known: Option<PathBuf>,
    pub root: PathBuf,
    /// Continue the run whose state is in `out` (see [`super::state`]).
    pub resume: bool,
}

/// What went wrong with one input.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Signature {
    /// `panic`, `stack-overflow`, `abort`, `out-of-memory`, `signal N`, `exit N` or `hang`.
    pub kind: String,
    pub stage: String,
    /// For panics: the source file and line of the panic.
    pub location: Option<String>,
}

impl Signature {
    /// The form written in a finding's header and matched against known
    /// findings: the file of a panic but not its line, which moves as code changes.
    pub fn coarse(&self) -> String {
        let mut s = format!("{} in {}", self.kind, self.stage);
        if let Some(l) = &self.location {
            let file = l.rsplit_once(':').map_or(l.as_str(), |(f, _)| f);
            s.push_str(&format!(" at {file}"));
        }
        s
    }

    fn from_panic(stage: &str, message: &str) -> Signature {
        let location = message
            .rsplit_once(" at ")
            .map(|(_, l)| l.trim().to_string());
        Signature {
            kind: "panic".into(),
            stage: stage.into(),
            location,
        }
    }

    fn from_exit(status: ExitStatus, stage: &str, stderr: &str) -> Signature {
        use std::os::unix::process::ExitStatusExt;
        let kind = if stderr.contains("has overflowed its stack") {
            "stack-overflow".to_string()
        } else if stderr.contains("memory allocation of") {
            "out-of-memory".to_string()
        } else if status.signal() == Some(9) {
            // Not the parent's kill (that is a hang): the kernel's OOM killer.
            "out-of-memory".to_string()
        } else if status.signal() == Some(6) {
            "abort".to_string()
        } else if let Some(s) = status.signal() {
            format!("signal {s}")
        } else {
            format!("exit {}", status.code().unwrap_or(-1))
        };
        Signature {
            kind,
            stage: stage.into(),
            location: None,
        }
    }
}

/// A failure seen in a run.
#[derive(Clone, Debug)]
pub struct Found {
    pub sig: Signature,
    pub index: u64,
    pub detail: String,
    pub count: u64,
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

// ---- worker ----

/// A worker: inputs `from`, `from + jobs`, ... until `until_ms` (or
/// `max_inputs` of them); reports on stdout.
pub fn worker(
    seed: u64,
    from: u64,
    jobs: u64,
    until_ms: u64,
    max_inputs: Option<u64>,
    limits: &Limits,
    root: &Path,
) {
    quiet_panics(true);
    tessera::stack::with_stack(|| {
        worker_loop(seed, from, jobs, until_ms, max_inputs, limits, root)
    })
    .expect("the system starts a thread for the worker");
}

fn worker_loop(
    seed: u64,
    from: u64,
    jobs: u64,
    until_ms: u64,
    max_inputs: Option<u64>,
    limits: &Limits,
    root: &Path,
) {
    let corpus = Corpus::load(root);
    let mut counts = Counts::default();
    let mut last_report = Instant::now();
    let mut index = from;
    let mut done = 0;
    let stdout = std::io::stdout();
    loop {
        if now_ms() >= until_ms || max_inputs.is_some_and(|m| done >= m) {
            break;
        }
        let (text, _) = input(seed, index, &corpus);
        {
            let mut o = stdout.lock();
            let _ = writeln!(o, "B {index}");
        }
        let r = execute_here(&text, limits, &mut counts, &mut |s| {
            let _ = writeln!(stdout.lock(), "S {}", s.name());
        });
        if let Err(f) = r {
            let _ = writeln!(
                stdout.lock(),
                "P {index} {} {}",
                f.stage.name(),
                f.message.replace('\n', "\\n")
            );
        }
        if last_report.elapsed() > Duration::from_millis(250) {
            counts.cpu_ms = process_cpu_ms();
            let _ = writeln!(stdout.lock(), "T {}", counts.encode());
            last_report = Instant::now();
        }
        index += jobs;
        done += 1;
    }
    counts.cpu_ms = process_cpu_ms();
    let _ = writeln!(stdout.lock(), "T {}", counts.encode());
}

/// `--exec-one FILE`: the stages on one file, reporting as a worker does.
/// Exit status 3 after a caught panic.
pub fn exec_one(path: &Path, limits: &Limits) -> u8 {
    quiet_panics(true);
    let text = match std::fs::read(path) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", path.display());
            return 2;
        }
    };
    let stdout = std::io::stdout();
    let _ = writeln!(stdout.lock(), "B 0");
    let mut counts = Counts::default();
    let r = execute(&text, limits, &mut counts, &mut |s| {
        let _ = writeln!(stdout.lock(), "S {}", s.name());
    });
    match r {
        Ok(()) => 0,
        Err(f) => {
            let _ = writeln!(
                stdout.lock(),
                "P 0 {} {}",
                f.stage.name(),
                f.message.replace('\n', "\\n")
            );
            3
        }
    }
}

// ---- parent ----

fn record(
    found: &mut BTreeMap<Signature, Found>,
    seed: u64,
    sig: Signature,
    index: u64,
    detail: String,
) {
    if let Some(f) = found.get_mut(&sig) {
        f.count += 1;
        return;
    }
    // Said at once, so a long run's finding can be replayed before it ends.
    eprintln!(
        "failure: {} at input {index} (replay: fuzz --seed {seed} --print {index})",
        sig.coarse()
    );
    found.insert(
        sig.clone(),
        Found {
            sig,
            index,
            detail,
            count: 1,
        },
    );
}

fn spawn(exe: &Path, opts: &Options, args: &[String], cwd: &Path) -> std::io::Result<Child> {
    // The worker runs under an address-space limit, so an input that asks for
    // a huge tensor fails its allocation instead of filling the machine.
    let kb = opts.memory_mb * 1024;
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -v {kb}; exec \"$0\" \"$@\""))
        .arg(exe)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        cmd.env("RAYON_NUM_THREADS", "1");
    }
    cmd.spawn()
}

fn limit_args(opts: &Options) -> Vec<String> {
    vec![
        "--run-budget-ms".into(),
        opts.run_budget.as_millis().to_string(),
        "--root".into(),
        opts.root.display().to_string(),
    ]
}

enum Msg {
    Line(usize, String),
    Closed(usize),
}

struct Slot {
    child: Child,
    stderr: Arc<Mutex<String>>,
    index: Option<u64>,
    /// The index this worker process started at.
    from: u64,
    stage: String,
    began: Instant,
    /// Counts of this worker's earlier processes.
    base: Counts,
    current: Counts,
    closed: bool,
    finished: bool,
    hung: bool,
}

fn attach(id: usize, child: &mut Child, tx: &mpsc::Sender<Msg>) -> Arc<Mutex<String>> {
    let out = child.stdout.take().expect("piped");
    let tx = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(Msg::Line(id, line)).is_err() {
                return;
            }
        }
        let _ = tx.send(Msg::Closed(id));
    });
    let tail = Arc::new(Mutex::new(String::new()));
    let mut err = child.stderr.take().expect("piped");
    let t = tail.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mut s = t.lock().unwrap_or_else(|e| e.into_inner());
            s.push_str(&String::from_utf8_lossy(&buf[..n]));
            if s.len() > 8192 {
                let cut = s.len() - 4096;
                let cut = (cut..s.len()).find(|i| s.is_char_boundary(*i)).unwrap_or(0);
                s.drain(..cut);
            }
        }
    });
    tail
}

/// The outcome of running one file in a child process.
fn run_child(exe: &Path, opts: &Options, file: &Path, cwd: &Path) -> Option<Signature> {
    let mut args = vec!["--exec-one".to_string(), file.display().to_string()];
    args.extend(limit_args(opts));
    let mut child = spawn(exe, opts, &args, cwd).ok()?;
    let (tx, rx) = mpsc::channel();
    let tail = attach(0, &mut child, &tx);
    drop(tx);
    let start = Instant::now();
    let mut stage = String::from("check");
    let mut panic = None;
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(Msg::Line(_, l)) => {
                if let Some(s) = l.strip_prefix("S ") {
                    stage = s.to_string();
                } else if let Some(p) = l.strip_prefix("P ") {
                    let mut parts = p.splitn(3, ' ');
                    let _ = parts.next();
                    let st = parts.next().unwrap_or("");
                    panic = Some(Signature::from_panic(st, parts.next().unwrap_or("")));
                }
            }
            Ok(Msg::Closed(_)) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if start.elapsed() > opts.hang {
            let _ = child.kill();
            let _ = child.wait();
            return Some(Signature {
                kind: "hang".into(),
                stage,
                location: None,
            });
        }
    }
    let status = child.wait().ok()?;
    if panic.is_some() {
        return panic;
    }
    if status.success() {
        return None;
    }
    std::thread::sleep(Duration::from_millis(20));
    let stderr = tail.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Some(Signature::from_exit(status, &stage, &stderr))
}

/// Known findings: the `# fuzz: SIGNATURE` header lines of `dir`'s files.
pub fn known_signatures(dir: &Path) -> Vec<String> {
    let mut paths = Vec::new();
    super::inputs::collect_tsr(dir, &mut paths);
    let mut out = Vec::new();
    for p in paths {
        if let Ok(t) = std::fs::read_to_string(&p) {
            for l in t.lines().take_while(|l| l.starts_with('#')) {
                if let Some(s) = l.strip_prefix("# fuzz:") {
                    out.push(s.trim().to_string());
                }
            }
        }
    }
    out
}

fn rate(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

/// The stage lines of a summary: executions, per second of wall time, and
/// the mean time of one.
pub fn summary(c: &Counts, secs: f64) -> String {
    let mut s = format!(
        "inputs {} ({:.1}/s), clean {:.1}%, runs interrupted by the budget {}\n",
        c.inputs,
        rate(c.inputs, secs),
        100.0 * c.clean as f64 / c.inputs.max(1) as f64,
        c.interrupted
    );
    for st in Stage::ALL {
        let i = st as usize;
        s.push_str(&format!(
            "  {:<7}{:>10} executions {:>9.1}/s   {:>8.2} ms each\n",
            st.name(),
            c.runs[i],
            rate(c.runs[i], secs),
            c.nanos[i] as f64 / 1e6 / c.runs[i].max(1) as f64
        ));
    }
    s.push_str(&format!(
        "  total  {:>10} executions {:>9.1}/s\n",
        c.total_runs(),
        rate(c.total_runs(), secs)
    ));
    if c.cpu_ms > 0 {
        let cpu = c.cpu_ms as f64 / 1000.0;
        s.push_str(&format!(
            "  workers' CPU time {cpu:.1} s: {:.1} executions per CPU second; 10 million executions would take {:.1} h on 2 cores\n",
            rate(c.total_runs(), cpu),
            1e7 / rate(c.total_runs(), cpu).max(1e-9) / 2.0 / 3600.0
        ));
    }
    s
}

/// Runs the fuzzer; returns the failures that are not known findings.
pub fn run(opts: &Options) -> std::io::Result<(Counts, Vec<Found>, Vec<Found>)> {
    let exe = std::env::current_exe()?;
    std::fs::create_dir_all(opts.out.join("crashes"))?;
    let mut state = if opts.resume {
        resume_state(opts)?
    } else {
        None
    }
    .unwrap_or_else(|| RunState {
        seed: opts.seed,
        jobs: opts.jobs,
        next: (0..opts.jobs).collect(),
        ..RunState::default()
    });
    let start = Instant::now();
    let until = now_ms() + opts.seconds * 1000;
    let (tx, rx) = mpsc::channel();
    let mut slots: Vec<Slot> = Vec::new();
    let worker_args = |w: u64, from: u64| -> Vec<String> {
        let mut a = vec![
            "--worker".to_string(),
            "--seed".into(),
            opts.seed.to_string(),
            "--from".into(),
            from.to_string(),
            "--jobs".into(),
            opts.jobs.to_string(),
            "--until-ms".into(),
            until.to_string(),
        ];
        if let Some(m) = opts.max_inputs {
            // Inputs left for this worker.
            let done = (from - w) / opts.jobs;
            a.push("--max-inputs".into());
            a.push(m.saturating_sub(done).to_string());
        }
        a.extend(limit_args(opts));
        a
    };
    for w in 0..opts.jobs {
        let cwd = opts.out.join(format!("scratch-{w}"));
        std::fs::create_dir_all(&cwd)?;
        let from = state.next[w as usize];
        let mut child = spawn(&exe, opts, &worker_args(w, from), &cwd)?;
        let stderr = attach(w as usize, &mut child, &tx);
        slots.push(Slot {
            child,
            stderr,
            index: None,
            from,
            stage: "check".into(),
            began: Instant::now(),
            base: Counts::default(),
            current: Counts::default(),
            closed: false,
            finished: false,
            hung: false,
        });
    }
    let mut found: BTreeMap<Signature, Found> = BTreeMap::new();
    let mut last_status = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Msg::Line(w, line)) => {
                let slot = &mut slots[w];
                if let Some(i) = line.strip_prefix("B ") {
                    slot.index = i.parse().ok();
                    slot.stage = "check".into();
                    slot.began = Instant::now();
                } else if let Some(s) = line.strip_prefix("S ") {
                    slot.stage = s.to_string();
                } else if let Some(t) = line.strip_prefix("T ") {
                    if let Some(c) = Counts::decode(t) {
                        slot.current = c;
                    }
                } else if let Some(p) = line.strip_prefix("P ") {
                    let mut parts = p.splitn(3, ' ');
                    let index = parts.next().and_then(|i| i.parse().ok()).unwrap_or(0);
                    let stage = parts.next().unwrap_or("").to_string();
                    let msg = parts.next().unwrap_or("").replace("\\n", "\n");
                    record(
                        &mut found,
                        opts.seed,
                        Signature::from_panic(&stage, &msg),
                        index,
                        msg,
                    );
                }
            }
            Ok(Msg::Closed(w)) => slots[w].closed = true,
            Err(_) => {}
        }
        for (w, slot) in slots.iter_mut().enumerate() {
            if slot.finished {
                continue;
            }
            // Killed for a hang once; classified as one even after its
            // stdout closes and its status shows the kill's signal.
            if !slot.hung
                && slot.index.is_some()
                && slot.began.elapsed() > opts.hang
                && matches!(slot.child.try_wait(), Ok(None))
            {
                slot.hung = true;
                let _ = slot.child.kill();
            }
            let hung = slot.hung;
            let Ok(Some(status)) = slot.child.try_wait() else {
                continue;
            };
            // Drain what the worker wrote before it ended.
            if !slot.closed && !hung {
                continue;
            }
            let clean_end = status.success() && !hung;
            if clean_end {
                slot.finished = true;
                continue;
            }
            let index = slot.index.unwrap_or(w as u64);
            let sig = if hung {
                Signature {
                    kind: "hang".into(),
                    stage: slot.stage.clone(),
                    location: None,
                }
            } else {
                std::thread::sleep(Duration::from_millis(20));
                let tail = slot
                    .stderr
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                Signature::from_exit(status, &slot.stage, &tail)
            };
            let tail = slot
                .stderr
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            record(&mut found, opts.seed, sig, index, tail);
            // Restart after the input that ended it.
            let from = index + opts.jobs;
            let cwd = opts.out.join(format!("scratch-{w}"));
            let base = {
                let mut b = slot.base.clone();
                b.add(&slot.current);
                b.inputs += 1;
                b
            };
            if now_ms() >= until
                || opts
                    .max_inputs
                    .is_some_and(|m| (from - w as u64) / opts.jobs >= m)
            {
                slot.base = base;
                slot.current = Counts::default();
                slot.finished = true;
                continue;
            }
            let mut child = spawn(&exe, opts, &worker_args(w as u64, from), &cwd)?;
            let stderr = attach(w, &mut child, &tx);
            *slot = Slot {
                child,
                stderr,
                index: None,
                from,
                stage: "check".into(),
                began: Instant::now(),
                base,
                current: Counts::default(),
                closed: false,
                finished: false,
                hung: false,
            };
        }
        if last_status.elapsed() > Duration::from_secs(10) {
            let mut total = Counts::default();
            for s in &slots {
                total.add(&s.base);
                total.add(&s.current);
            }
            let secs = start.elapsed().as_secs_f64();
            eprintln!(
                "[{secs:>6.0}s] inputs {} ({:.1}/s) | check {} emit {} report {} run {} | {:.1} executions/s | failures {}",
                total.inputs,
                rate(total.inputs, secs),
                total.runs[0],
                total.runs[1],
                total.runs[2],
                total.runs[3],
                rate(total.total_runs(), secs),
                found.values().map(|f| f.count).sum::<u64>()
            );
            last_status = Instant::now();
        }
        if slots.iter().all(|s| s.finished) {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let mut total = Counts::default();
    for s in &slots {
        total.add(&s.base);
        total.add(&s.current);
    }
    eprint!("{}", summary(&total, secs));
    for (w, s) in slots.iter().enumerate() {
        // A worker has finished every input it began (or the run recorded it).
        state.next[w] = s.index.map_or(s.from, |i| i + opts.jobs);
    }
    state.slices += 1;
    state.seconds += secs;
    state.counts.add(&total);
    // Minimize and write each distinct failure.
    let known = opts
        .known
        .as_deref()
        .map(known_signatures)
        .unwrap_or_default();
    let corpus = Corpus::load(&opts.root);
    let scratch = opts.out.join("scratch-min");
    std::fs::create_dir_all(&scratch)?;
    let (mut new, mut old) = (Vec::new(), Vec::new());
    // Earlier slices' findings keep their files.
    let first = std::fs::read_dir(opts.out.join("crashes"))?.count();
    for (n, f) in found.into_values().enumerate() {
        let n = n + first;
        let (text, origin) = input(opts.seed, f.index, &corpus);
        let probe = scratch.join("probe.tsr");
        let coarse = f.sig.coarse();
        let mut fails = |t: &str| {
            std::fs::write(&probe, t).is_ok()
                && run_child(&exe, opts, &probe, &scratch).is_some_and(|s| s.coarse() == coarse)
        };
        let is_known = known.contains(&coarse);
        // Known findings are routed already: no time spent minimizing them.
        let small = if !is_known && fails(&text) {
            minimize(&text, &mut fails, opts.minimize)
        } else {
            text.clone()
        };
        let name = format!(
            "{n:03}-{}-{}.tsr",
            f.sig.kind.replace(' ', "-"),
            f.sig.stage
        );
        let detail: String = f
            .detail
            .lines()
            .take(6)
            .map(|l| format!("# {l}\n"))
            .collect();
        let body = format!(
            "# fuzz: {coarse}\n# seen {} times; first: seed {} index {} ({}); replay: fuzz --seed {} --print {}\n{detail}{small}",
            f.count,
            opts.seed,
            f.index,
            origin.name(),
            opts.seed,
            f.index
        );
        std::fs::write(opts.out.join("crashes").join(&name), body)?;
        eprintln!(
            "{}: {coarse} ({} times) -> {}",
            if is_known { "known" } else { "NEW" },
            f.count,
            opts.out.join("crashes").join(&name).display()
        );
        state.add_failure(if is_known { "known" } else { "new" }, f.count, &coarse);
        if is_known {
            old.push(f);
        } else {
            new.push(f);
        }
    }
    std::fs::write(RunState::path(&opts.out), state.encode())?;
    if state.slices > 1 {
        eprint!(
            "the whole run, {} slices (seed {}, {} jobs, resumed with --resume):\n{}  failures {} ({} new)\n",
            state.slices,
            state.seed,
            state.jobs,
            summary(&state.counts, state.seconds),
            state.failure_count(),
            state.failures.iter().filter(|f| f.0 == "new").map(|f| f.1).sum::<u64>()
        );
    }
    Ok((total, new, old))
}

/// Where a run in `out` keeps its state.
pub fn state_path(out: &Path) -> PathBuf {
    RunState::path(out)
}

/// The state of the run to continue, checked against the options: `None`
/// when `out` holds none (the run starts afresh).
fn resume_state(opts: &Options) -> std::io::Result<Option<RunState>> {
    let path = RunState::path(&opts.out);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    let st = RunState::decode(&text).map_err(|m| bad(format!("{}: {m}", path.display())))?;
    if st.seed != opts.seed || st.jobs != opts.jobs {
        return Err(bad(format!(
            "{} is a run with seed {} and {} jobs; resume it with those",
            path.display(),
            st.seed,
            st.jobs
        )));
    }
    Ok(Some(st))
}
