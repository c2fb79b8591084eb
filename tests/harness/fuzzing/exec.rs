//! One input through every stage, in process: `check`; emission of every IR
//! level, PTX for sm_70, sm_80, sm_90 and sm_90a (wgmma and TMA) and HIP for
//! gfx942 (64-lane waves, MFMA) and gfx1100 (32-lane waves, WMMA);
//! `report`'s estimate for each; and `tessera run`'s evaluator on the CPU, stopped
//! through its interrupt (E0706) once the input's run budget is spent, so an
//! input that loops forever is not a hang of the fuzzer. A panic in any stage
//! is caught and returned; the panic hook stays quiet while a fuzz input runs.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex, Once};
use std::time::{Duration, Instant};

use tessera::cli::{emit_with, EmitContext, EmitError, EmitKind};
use tessera::db::Database;
use tessera::diag::codes;
use tessera::diag::render::{render_human_all, render_json, LineIndex};
use tessera::diag::Diagnostic;
use tessera::ir::tile::Specialization;
use tessera::target::Arch;

/// The stages, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Check,
    Emit,
    Report,
    Run,
}

impl Stage {
    pub const ALL: [Stage; 4] = [Stage::Check, Stage::Emit, Stage::Report, Stage::Run];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Check => "check",
            Stage::Emit => "emit",
            Stage::Report => "report",
            Stage::Run => "run",
        }
    }

    pub fn parse(s: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|st| st.name() == s)
    }
}

/// The targets every input is emitted and estimated for: each code path of
/// the lowering (no asynchronous copies; `cp.async` and `mma.sync`; wgmma and
/// TMA; the two wave sizes and matrix units of the AMD arches, whose HIP
/// printer and estimate differ from the PTX ones).
pub const ARCHES: [Arch; 6] = [
    Arch::Sm70,
    Arch::Sm80,
    Arch::Sm90,
    Arch::Sm90a,
    Arch::Gfx942,
    Arch::Gfx1100,
];

/// Executions and time per stage, and how inputs ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub runs: [u64; 4],
    pub nanos: [u64; 4],
    pub inputs: u64,
    /// Inputs that checked without errors.
    pub clean: u64,
    /// Runs stopped by their budget (E0706).
    pub interrupted: u64,
    /// CPU time of the processes that ran the inputs (user and system), in
    /// milliseconds, where the platform says (Linux).
    pub cpu_ms: u64,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        for i in 0..4 {
            self.runs[i] += o.runs[i];
            self.nanos[i] += o.nanos[i];
        }
        self.inputs += o.inputs;
        self.clean += o.clean;
        self.interrupted += o.interrupted;
        self.cpu_ms += o.cpu_ms;
    }

    pub fn total_runs(&self) -> u64 {
        self.runs.iter().sum()
    }

    /// `inputs clean runs... nanos... interrupted`, for the worker protocol.
    pub fn encode(&self) -> String {
        let mut v = vec![self.inputs, self.clean, self.interrupted, self.cpu_ms];
        v.extend(self.runs);
        v.extend(self.nanos);
        v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
    }

    pub fn decode(s: &str) -> Option<Counts> {
        let v: Vec<u64> = s
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        (v.len() == 12).then(|| Counts {
            inputs: v[0],
            clean: v[1],
            interrupted: v[2],
            cpu_ms: v[3],
            runs: [v[4], v[5], v[6], v[7]],
            nanos: [v[8], v[9], v[10], v[11]],
        })
    }
}

/// User and system CPU time of this process so far, in milliseconds (Linux;
/// 0 elsewhere).
pub fn process_cpu_ms() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // The fields after the command name, which is in parentheses.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, in clock ticks (100 a second).
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) * 10
}

/// A panic caught in a stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub stage: Stage,
    /// The panic message and where it was raised (`... at path:line:col`).
    pub message: String,
}

/// Limits of one input.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Wall-clock time the CPU executor may spend before it is interrupted.
    pub run_budget: Duration,
    pub stages: Vec<Stage>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            run_budget: Duration::from_secs(2),
            stages: Stage::ALL.to_vec(),
        }
    }
}

static HOOK: Once = Once::new();
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);
/// Every panic of the process is quiet (the fuzz binary's workers, whose
/// executor panics on rayon threads too).
static QUIET_PROCESS: AtomicBool = AtomicBool::new(false);

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Installs the hook that records panic messages (quietly while a fuzz input
/// runs on this thread, or everywhere once `process_wide`).
pub fn quiet_panics(process_wide: bool) {
    if process_wide {
        QUIET_PROCESS.store(true, Ordering::SeqCst);
    }
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
                s.to_string()
            } else if let Some(s) = info.payload().downcast_ref::<String>() {
                s.clone()
            } else {
                "panic".to_string()
            };
            // Where in the project: the innermost frame in the workspace
            // (a panic inside the standard library, such as an overflow in
            // `Iterator::product`, is located at its caller).
            let at = project_frame(&std::backtrace::Backtrace::force_capture().to_string())
                .or_else(|| {
                    info.location()
                        .map(|l| format!("{}:{}", l.file(), l.line()))
                })
                .map(|l| format!(" at {l}"))
                .unwrap_or_default();
            *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{msg}{at}"));
            if !QUIET_PROCESS.load(Ordering::SeqCst) && !QUIET.with(Cell::get) {
                default(info);
            }
        }));
    });
}

/// `compiler/src/x.rs:12` of the first frame of `backtrace` in the project's crates.
fn project_frame(backtrace: &str) -> Option<String> {
    for line in backtrace.lines() {
        let Some(at) = line.trim().strip_prefix("at ") else {
            continue;
        };
        for krate in ["compiler/src/", "repl/src/", "lsp/src/"] {
            if let Some(i) = at.find(krate) {
                let rel = &at[i..];
                // path:line:col -> path:line
                let rel = rel.rsplit_once(':').map_or(rel, |(p, _)| p);
                return Some(rel.to_string());
            }
        }
    }
    None
}

pub(crate) fn guarded<T>(stage: Stage, f: impl FnOnce() -> T) -> Result<T, Failure> {
    quiet_panics(false);
    QUIET.with(|q| q.set(true));
    *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = None;
    let r = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    r.map_err(|payload| {
        let recorded = LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).take();
        let message = recorded.unwrap_or_else(|| {
            payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into())
        });
        Failure { stage, message }
    })
}

/// Diagnostics with known codes and spans inside `text` on character
/// boundaries, which render (human and JSON) without a panic.
pub fn assert_well_formed(text: &str, diags: &[Diagnostic]) {
    let ok = |s: tessera::syntax::span::Span| {
        s.start <= s.end
            && (s.end as usize) <= text.len()
            && text.is_char_boundary(s.start as usize)
            && text.is_char_boundary(s.end as usize)
    };
    for d in diags {
        assert!(codes::lookup(d.code).is_some(), "unknown code {}", d.code);
        assert!(
            ok(d.span),
            "{} span {:?} outside {} bytes / off a char boundary",
            d.code,
            d.span,
            text.len()
        );
        for l in &d.labels {
            assert!(
                ok(l.span),
                "{} label span {:?} outside the text",
                d.code,
                l.span
            );
        }
    }
    let _ = render_human_all("fuzz.tsr", text, diags, false);
    let index = LineIndex::new(text);
    for d in diags {
        let _ = render_json("fuzz.tsr", &index, d);
    }
}

/// Specialisations to emit under: none (the defaults); every tensor dim
/// divisible by 16, as a launch's own facts (the executor's run-time
/// specialisation for the usual sizes, under which loops take `cp.async`,
/// TMA and wgmma pipelines); and every tensor dim and default-less const at
/// 64, used when the defaults leave something unknown.
fn specialisations(db: &Database, file: tessera::db::SourceFile) -> Vec<Specialization> {
    let mut launch = Specialization::new();
    launch.trusted = true;
    let mut all64 = Specialization::new();
    for (_, item, _) in tessera::db::file_kernels(db, file) {
        if let Some(sig) = tessera::db::item_signature(db, item) {
            for p in &sig.params {
                if let tessera::check::Ty::Tensor { dims, .. } = &p.ty {
                    for d in dims {
                        for s in d.symbols() {
                            all64.values.insert(s.to_string(), 64);
                            launch.divisors.insert(s.to_string(), 16);
                        }
                    }
                }
                if p.is_const && !p.has_default {
                    all64.values.insert(p.name.clone(), 64);
                }
            }
        }
    }
    vec![Specialization::new(), launch, all64]
}

fn emit_all(db: &mut Database, file: tessera::db::SourceFile, text: &str) {
    let specs = specialisations(db, file);
    for (i, arch) in ARCHES.into_iter().enumerate() {
        db.set_arch(arch);
        let mut missing = false;
        let db = &*db;
        let kinds: &[EmitKind] = if i == 0 {
            &[
                EmitKind::GraphIr,
                EmitKind::ScheduleIr,
                EmitKind::TileIr,
                EmitKind::TargetIr,
                EmitKind::Ptx,
            ]
        } else if !arch.is_nvidia() {
            &[EmitKind::TargetIr, EmitKind::Hip]
        } else {
            &[EmitKind::TargetIr, EmitKind::Ptx]
        };
        for (si, spec) in specs.iter().enumerate() {
            // The all-64 specialisation only where the defaults left a value unknown.
            if si == 2 && !missing {
                break;
            }
            let cx = EmitContext {
                db,
                file,
                kernels: tessera::db::file_kernels(db, file),
                spec: spec.clone(),
                arch,
                function: None,
            };
            for kind in kinds {
                if si >= 1 && matches!(kind, EmitKind::GraphIr | EmitKind::ScheduleIr) {
                    continue;
                }
                match emit_with(&cx, *kind) {
                    Ok(_) | Err(EmitError::Usage(_)) => {}
                    Err(EmitError::Diagnostics(d)) => {
                        assert_well_formed(text, &d);
                        missing |= si == 0 && d.iter().any(|d| d.code == "E0511");
                    }
                }
            }
            // Every kernel's Target IR verifies (the query checks it only in
            // debug builds; the fuzzer runs in release).
            for (name, item, _) in &cx.kernels {
                if let Ok(k) = tessera::db::target_ir(db, *item, db.options(), spec.clone()) {
                    let verified = tessera::ir::target::verify::verify(k);
                    assert!(
                        verified.is_ok(),
                        "Target IR of {name} for {arch:?} does not verify: {verified:?}"
                    );
                }
            }
            if kinds.contains(&EmitKind::TileIr) {
                for (name, item, _) in &cx.kernels {
                    if let Ok(k) = tessera::db::tile_ir(db, *item, db.options(), spec.clone()) {
                        let errs = tessera::ir::tile::verify(k);
                        assert!(
                            errs.is_empty(),
                            "Tile IR of {name} does not verify: {errs:?}"
                        );
                    }
                }
            }
        }
    }
}

fn report_all(db: &mut Database, file: tessera::db::SourceFile, text: &str) {
    // The defaults, and the launch facts (`specialisations`).
    let specs = specialisations(db, file);
    for arch in ARCHES {
        db.set_arch(arch);
        let db = &*db;
        for spec in &specs[..2] {
            let mut rows = Vec::new();
            for (_, item, offset) in tessera::db::file_kernels(db, file) {
                match tessera::db::kernel_resources(db, item, offset, db.options(), spec) {
                    Ok((r, d)) => {
                        assert_well_formed(text, &d);
                        rows.push(r);
                    }
                    Err(d) => assert_well_formed(text, &d),
                }
            }
            let _ = tessera::backend::resources::render_table(&rows);
            let _ = tessera::backend::resources::render_json(&rows);
        }
    }
}

/// Runs `text` as `tessera run` does, interrupted after `budget`; returns
/// whether the budget stopped it.
fn run_budgeted(text: &str, budget: Duration) -> bool {
    let mut session = tessera_repl::session::Session::new("fuzz.tsr", false);
    let interrupt = session.interrupt().clone();
    let (done, wait) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let watchdog = s.spawn(move || {
            if wait.recv_timeout(budget).is_ok() {
                return false;
            }
            // Each statement clears the flag as it starts: keep setting it
            // until the run returns.
            loop {
                interrupt.trigger();
                match wait.recv_timeout(Duration::from_millis(5)) {
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    _ => return true,
                }
            }
        });
        let mut out = std::io::sink();
        let mut err = std::io::sink();
        let r = catch_unwind(AssertUnwindSafe(|| {
            session.run_file(text, &mut out, &mut err)
        }));
        let _ = done.send(());
        let stopped = watchdog.join().unwrap_or(false);
        if let Err(p) = r {
            std::panic::resume_unwind(p);
        }
        stopped
    })
}

/// Runs the stages of `limits` on `text`, adding to `counts`; `on_stage` is
/// told each stage before it starts (the worker reports it to its parent).
/// The stages run on a thread with the compiler's query stack
/// (`tessera::stack::with_stack`), as the binaries and the language server
/// run them.
pub fn execute(
    text: &str,
    limits: &Limits,
    counts: &mut Counts,
    on_stage: &mut (dyn FnMut(Stage) + Send),
) -> Result<(), Failure> {
    tessera::stack::with_stack(|| execute_here(text, limits, counts, on_stage))
        .expect("the system starts a thread for the stages")
}

/// [`execute`] on the calling thread, which must already have the compiler's
/// query stack (a worker runs all its inputs on one such thread: a thread
/// per input costs more than some inputs' stages).
pub fn execute_here(
    text: &str,
    limits: &Limits,
    counts: &mut Counts,
    on_stage: &mut (dyn FnMut(Stage) + Send),
) -> Result<(), Failure> {
    counts.inputs += 1;
    let mut db = Database::new();
    let mut file = None;
    let mut clean = false;
    for stage in Stage::ALL {
        if !limits.stages.contains(&stage) {
            continue;
        }
        if matches!(stage, Stage::Emit | Stage::Report) && !clean {
            continue;
        }
        on_stage(stage);
        let start = Instant::now();
        match stage {
            Stage::Check => {
                let f = guarded(stage, || {
                    let f = db.set_source("fuzz.tsr", text.to_string());
                    let diags = db.diagnostics(f).to_vec();
                    assert_well_formed(text, &diags);
                    (f, !diags.iter().any(|d| d.is_error()))
                })?;
                file = Some(f.0);
                clean = f.1;
                counts.clean += u64::from(clean);
            }
            Stage::Emit => {
                let f = file.expect("checked first");
                guarded(stage, || emit_all(&mut db, f, text))?;
            }
            Stage::Report => {
                let f = file.expect("checked first");
                guarded(stage, || report_all(&mut db, f, text))?;
            }
            Stage::Run => {
                let stopped = guarded(stage, || run_budgeted(text, limits.run_budget))?;
                counts.interrupted += u64::from(stopped);
            }
        }
        let i = stage as usize;
        counts.runs[i] += 1;
        counts.nanos[i] += start.elapsed().as_nanos() as u64;
    }
    Ok(())
}
