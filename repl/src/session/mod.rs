//! A Tessera session: what `tessera repl` and `tessera run` execute.
//!
//! Input is split into top-level items. Definitions (`def`, `@kernel`, `const`,
//! imports) accumulate in one session source file held by the salsa database,
//! so each new definition is checked incrementally against the earlier ones; a
//! definition that fails to check is not kept. Statements run one by one on
//! the host (see [`eval`]): scalars, creation builtins, indexing, kernel launches
//! and control flow directly, tensor expressions as a synthetic whole-tensor
//! function compiled with the concrete shapes of the session's tensors (see
//! [`synth`]). Every error is a diagnostic rendered against the session text
//! (`<repl>` and the line the user typed); it never ends the session and
//! nothing defined before it is lost.

mod dist;
mod eval;
mod snapshot;
mod synth;
#[cfg(test)]
mod tests;
mod workers;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera::check::builtins::Builtin;
use tessera::db::{Database, SourceFile};
use tessera::diag::render;
use tessera::diag::Diagnostic;
use tessera::exec::cuda::{Gpu, GpuInfo};
use tessera::exec::{Interrupt, Value};
use tessera::ir::tile::Specialization;
use tessera::syntax::{self, ast, span::Span};
use tessera::target::Arch;

pub use dist::MAX_DEVICES;
pub use eval::Val;
pub use snapshot::{is_state_file, Restored, ShellState, INPUT, MANIFEST};

/// The path of the session source in the database (not a real file).
const SESSION_PATH: &str = "<session>";

/// Where computations run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
    /// The GPU when a driver and a GPU are present, else the CPU (a choice
    /// made when the session starts; a session itself is on `Cpu` or `Cuda`).
    Auto,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
            Device::Auto => "auto",
        }
    }
}

/// The diagnostic of a GPU that cannot be used (E0721: no driver, no GPU),
/// at `span` (the option or command that asked for it).
pub fn device_unavailable(error: &tessera::exec::ExecError, span: Span) -> Diagnostic {
    error.to_diagnostic(span)
}

/// Drops the device copies on context `owner` of the tensors in `v`; true
/// when one of them was only there (its value is lost).
fn forget_device(v: &Val, owner: u64) -> bool {
    match v {
        Val::Run(r) => forget_value(r, owner),
        Val::List(items) => items.iter().fold(false, |l, x| forget_device(x, owner) | l),
        Val::Dist(d, _) => d
            .parts()
            .iter()
            .fold(false, |l, p| p.tensor.forget_device(owner) | l),
        Val::Str(_) | Val::DType(_) => false,
    }
}

fn forget_value(v: &tessera::exec::Value, owner: u64) -> bool {
    use tessera::exec::Value;
    match v {
        Value::Tensor(t) => t.forget_device(owner),
        Value::Tuple(items) => items.iter().fold(false, |l, x| forget_value(x, owner) | l),
        _ => false,
    }
}

/// A sticky error after which no fresh GPU context could be made in this
/// process (see [`Session::allow_restart`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Sticky {
    /// The variables dropped, as their values were only on the GPU.
    pub lost: Vec<String>,
    /// Why the driver made no fresh context.
    pub why: String,
    /// Where the session ran before the error.
    pub device: Device,
}

/// What the notes about a sticky error say about the variables.
pub fn lost_text(lost: &[String]) -> String {
    if lost.is_empty() {
        "no variable's value was only on the GPU".to_string()
    } else {
        let names: Vec<String> = lost.iter().map(|n| format!("`{n}`")).collect();
        format!(
            "lost, as their values were only on the GPU: {}",
            names.join(", ")
        )
    }
}

/// One top-level definition of the session source.
#[derive(Clone, Debug)]
struct Def {
    /// The names it binds (a `from` import may bind several).
    names: Vec<String>,
    /// Its text, ending in a newline.
    text: String,
    /// Where diagnostics about it point.
    origin: Origin,
}

#[derive(Clone, Debug, PartialEq)]
enum Origin {
    /// Typed in the session: the offset of its text in the session transcript.
    Input(u32),
    /// From `:load FILE` (or the file of `tessera run`).
    File(PathBuf),
}

/// The specialization a kernel last ran with, as `:emit`/`:resources`
/// show it on the session's arch.
pub struct LastLaunch {
    pub spec: Specialization,
    /// The tuning configuration it ran with (tuned on another arch, or the
    /// CPU's), where the session's arch takes another one, shown instead.
    pub ran_with: Option<String>,
}

/// A Tessera session: definitions, variables and the transcript diagnostics point into.
pub struct Session {
    db: Database,
    file: SourceFile,
    defs: Vec<Def>,
    vars: BTreeMap<String, Val>,
    /// The name diagnostics show (`<repl>` or the path of a `tessera run` file).
    shown: String,
    /// Everything executed so far, so that a diagnostic names its session line.
    transcript: String,
    interrupt: Interrupt,
    device: Device,
    /// Where kernels run (the GPU once `:device cuda` or `--device` opened it).
    exec_device: tessera::exec::Device,
    /// The GPU, kept once opened so that switching back to it keeps its
    /// compiled kernels.
    gpu: Option<Arc<Gpu>>,
    /// The other GPUs a tensor was moved to (`x.to("cuda:1")`), by ordinal.
    more_gpus: BTreeMap<usize, Arc<Gpu>>,
    /// How many devices `shard` spreads over (see `dist`).
    devices: usize,
    /// The threads that run the devices of a distributed call.
    workers: workers::Workers,
    /// The plans distributed calls ran, by expression and placements.
    localized: std::collections::HashMap<String, Arc<dist::Plan>>,
    color: bool,
    /// Files added with `:load`, in order (for `:reload`).
    loaded: Vec<PathBuf>,
    synth_count: u64,
    /// The number of each synthetic function's text (see `synth::build`).
    synth_names: std::collections::HashMap<String, u64>,
    /// `print` output of the running statement, written when it ends.
    pending_print: Vec<String>,
    /// When set, diagnostics are collected here instead of rendered.
    collected: Option<Vec<Diagnostic>>,
    /// When set, the transcript offset of the command being run (scripts,
    /// whose transcript is the whole text already).
    command_base: Option<u32>,
    /// Each kernel's specialization at its last launch in the session: what
    /// `:emit` and `:resources` use without `-D`.
    last_launch: BTreeMap<String, tessera::exec::LaunchSpec>,
    /// The last input executed, parsed (see `execute_at`).
    last_parse: Option<(String, Arc<ParsedInput>)>,
    /// Whether the front end can restart the process after a sticky error.
    can_restart: bool,
    /// A sticky error left for the front end to restart the process.
    sticky: Option<Sticky>,
}

/// An input's items with their ranges, and its syntax errors.
type ParsedInput = (Vec<(ast::Item, Span)>, Vec<Diagnostic>);

impl Session {
    /// A session whose diagnostics name `shown` (`<repl>`).
    pub fn new(shown: &str, color: bool) -> Session {
        let mut db = Database::new();
        let file = db.set_source(SESSION_PATH, String::new());
        Session {
            db,
            file,
            defs: Vec::new(),
            vars: BTreeMap::new(),
            shown: shown.to_string(),
            transcript: String::new(),
            interrupt: Interrupt::new(),
            device: Device::Cpu,
            exec_device: tessera::exec::Device::Cpu,
            gpu: None,
            more_gpus: BTreeMap::new(),
            devices: 1,
            workers: workers::Workers::default(),
            localized: std::collections::HashMap::new(),
            color,
            loaded: Vec::new(),
            synth_count: 0,
            synth_names: std::collections::HashMap::new(),
            pending_print: Vec::new(),
            collected: None,
            command_base: None,
            last_launch: BTreeMap::new(),
            last_parse: None,
            can_restart: false,
            sticky: None,
        }
    }

    /// Lets a sticky error that no fresh context in this process can
    /// recover from wait in [`Session::take_sticky`] for the front end (which
    /// restarts the process) instead of moving the session to the CPU.
    pub fn allow_restart(&mut self, allow: bool) {
        self.can_restart = allow;
    }

    /// The sticky error waiting for a restart, if one does. The session runs
    /// on the CPU meanwhile, the lost variables already dropped.
    pub fn take_sticky(&mut self) -> Option<Sticky> {
        self.sticky.take()
    }

    /// Says that the session goes on on the CPU after `sticky`, as the
    /// process could not be restarted (`restart`: why not).
    pub fn sticky_on_cpu(&self, sticky: &Sticky, restart: Option<&str>, err: &mut dyn Write) {
        let restart = restart.map_or(String::new(), |r| {
            format!("; the session could not restart its process ({r})")
        });
        let _ = writeln!(
            err,
            "note: the GPU's context was unusable after that error and no fresh one can be made: {}{restart}; the session runs on the CPU now ({}); definitions and the other values are kept",
            sticky.why,
            lost_text(&sticky.lost)
        );
    }

    /// The specialization kernel `name` was compiled with at its last launch
    /// in this session (`None` if it has not run, or no longer compiles so).
    pub fn last_launch(&self, name: &str) -> Option<LastLaunch> {
        let launch = self.last_launch.get(name)?;
        // A tuning configuration chosen on another arch (or the CPU's)
        // gives way to this arch's own first one.
        let arch = self.db.options().arch(&self.db);
        let (spec, retargeted) = launch.for_arch(arch);
        let spec = tessera::exec::compiled_specialization(&self.db, self.file, name, &spec).ok()?;
        let changed = retargeted
            && launch.tuned.iter().any(|k| {
                spec.values
                    .get(k)
                    .is_some_and(|v| launch.consts.values.get(k) != Some(v))
            });
        let ran_with = changed.then(|| match launch.ran_on {
            Some(a) => format!("the configuration tuned on {a}"),
            None => "the configuration its tuning space gives the CPU".to_string(),
        });
        Some(LastLaunch { spec, ran_with })
    }

    /// The flag a Ctrl-C handler sets to stop the running computation.
    pub fn interrupt(&self) -> &Interrupt {
        &self.interrupt
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// Runs what follows on the CPU.
    pub fn use_cpu(&mut self) {
        self.device = Device::Cpu;
        self.exec_device = tessera::exec::Device::Cpu;
    }

    /// GPU 0, opened the first time it is asked for.
    fn open_gpu(&mut self) -> Result<Arc<Gpu>, tessera::exec::ExecError> {
        Ok(match &self.gpu {
            Some(g) => g.clone(),
            None => {
                let g = Arc::new(Gpu::open(0)?);
                self.gpu = Some(g.clone());
                g
            }
        })
    }

    /// The GPU `x.to("cuda:N")` moves to (opened the first time; GPU 0 is
    /// the session's); E0721 at `span` without one.
    pub(crate) fn gpu_for_move(
        &mut self,
        ordinal: usize,
        span: Span,
    ) -> Result<Arc<Gpu>, Diagnostic> {
        let opened = if ordinal == 0 {
            self.open_gpu()
        } else if let Some(g) = self.more_gpus.get(&ordinal) {
            Ok(g.clone())
        } else {
            Gpu::open(ordinal).map(|g| {
                let g = Arc::new(g);
                self.more_gpus.insert(ordinal, g.clone());
                g
            })
        };
        opened.map_err(|e| device_unavailable(&e, span))
    }

    /// Where a launch or call with `args` runs: on a session that runs on a
    /// GPU, the GPU whose copy of its tensor arguments is theirs (a tensor
    /// stays on the GPU it was made on or moved to), else the session's
    /// device. Tensors on two GPUs are E0736 at `span`.
    pub(crate) fn device_for<'v>(
        &self,
        args: impl IntoIterator<Item = &'v Value>,
        span: Span,
    ) -> Result<tessera::exec::Device, Diagnostic> {
        if !matches!(self.exec_device, tessera::exec::Device::Cuda(_)) {
            return Ok(self.exec_device.clone());
        }
        fn tensors<'a>(v: &'a Value, out: &mut Vec<&'a tessera::exec::Tensor>) {
            match v {
                Value::Tensor(t) => out.push(t),
                Value::Tuple(items) => items.iter().for_each(|i| tensors(i, out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        for v in args {
            tensors(v, &mut all);
        }
        let gpus: Vec<&Arc<Gpu>> = self.open_gpus().collect();
        let mut found: Option<(&Arc<Gpu>, &tessera::exec::Tensor)> = None;
        for t in all {
            let Some(owner) = t.device_owner() else {
                continue;
            };
            let Some(g) = gpus.iter().find(|g| g.owner() == owner) else {
                continue;
            };
            match found {
                Some((f, first)) if f.owner() != owner => {
                    let on = |g: &Gpu, t: &tessera::exec::Tensor| {
                        format!(
                            "{} on cuda:{}",
                            Value::Tensor(t.clone()).describe(),
                            g.info().ordinal
                        )
                    };
                    return Err(Diagnostic::new(
                        "E0736",
                        span,
                        format!(
                            "the tensor arguments are on two GPUs: {} and {}",
                            on(f, first),
                            on(g, t)
                        ),
                    )
                    .with_help(format!(
                        "move them to one GPU first, e.g. `x.to(\"cuda:{}\")`",
                        f.info().ordinal
                    )));
                }
                Some(_) => {}
                None => found = Some((g, t)),
            }
        }
        Ok(match found {
            Some((g, _)) => tessera::exec::Device::Cuda(g.clone()),
            None => self.exec_device.clone(),
        })
    }

    /// The GPU, if one is open.
    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        self.gpu.as_ref()
    }

    /// Every GPU the session has opened (its own and those tensors were
    /// moved to).
    pub fn open_gpus(&self) -> impl Iterator<Item = &Arc<Gpu>> {
        self.gpu.iter().chain(self.more_gpus.values())
    }

    /// After an error: when it left the GPU's context unusable (a sticky
    /// error), makes a fresh context, drops the variables whose values were
    /// only on the GPU and says which; definitions and other values are kept.
    fn recover_gpu(&mut self, err: &mut dyn Write) {
        // Another GPU's sticky error: its tensors are lost as the session
        // GPU's would be; the session GPU's case below says what happens next
        // (a fresh context, else a restart of the process).
        let broken: Vec<usize> = self
            .more_gpus
            .iter()
            .filter(|(_, g)| g.is_broken())
            .map(|(k, _)| *k)
            .collect();
        for ordinal in broken {
            if let Some(old) = self.more_gpus.remove(&ordinal) {
                self.recover_other_gpu(old, err);
            }
        }
        let Some(old) = self.gpu.clone().filter(|g| g.is_broken()) else {
            return;
        };
        let owner = old.owner();
        let lost = self.drop_values_only_on(owner);
        let lost_text = lost_text(&lost);
        // The session's hold on the old GPU goes first: the driver makes no
        // fresh context while the broken one exists.
        self.gpu = None;
        let on_gpu = matches!(self.exec_device, tessera::exec::Device::Cuda(_));
        self.exec_device = tessera::exec::Device::Cpu;
        match Gpu::reopen(old) {
            Ok(fresh) => {
                let fresh = Arc::new(fresh);
                if on_gpu {
                    self.exec_device = tessera::exec::Device::Cuda(fresh.clone());
                }
                self.gpu = Some(fresh);
                let _ = writeln!(
                    err,
                    "note: the GPU's context was unusable after that error; the session made a fresh one ({lost_text}); definitions are kept"
                );
            }
            Err(e) => {
                let device = self.device;
                self.gpu = None;
                self.use_cpu();
                let sticky = Sticky {
                    lost,
                    why: e.help.unwrap_or(e.message),
                    device: if on_gpu { Device::Cuda } else { device },
                };
                self.no_fresh_context(sticky, err);
            }
        }
    }

    /// Drops the variables whose values were only on the GPU context
    /// `owner` (a sticky error lost them); their names, for the note.
    fn drop_values_only_on(&mut self, owner: u64) -> Vec<String> {
        let lost: Vec<String> = self
            .vars
            .iter()
            .filter(|(_, v)| forget_device(v, owner))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &lost {
            self.vars.remove(name);
        }
        lost
    }

    /// No fresh context after a sticky error: the front end restarts the
    /// process where it can, else the session goes on on the CPU.
    fn no_fresh_context(&mut self, sticky: Sticky, err: &mut dyn Write) {
        if self.can_restart {
            self.sticky = Some(sticky);
        } else {
            self.use_cpu();
            self.sticky_on_cpu(&sticky, None, err);
        }
    }

    /// After a sticky error on a GPU other than the session's: drops the
    /// variables only it held and asks for a fresh context, else restarts
    /// the process as for the session's GPU.
    fn recover_other_gpu(&mut self, old: Arc<Gpu>, err: &mut dyn Write) {
        let owner = old.owner();
        let ordinal = old.info().ordinal;
        let lost = self.drop_values_only_on(owner);
        match Gpu::reopen(old) {
            Ok(fresh) => {
                self.more_gpus.insert(ordinal, Arc::new(fresh));
                let _ = writeln!(
                    err,
                    "note: cuda:{ordinal}'s context was unusable after that error; the session made a fresh one ({}); definitions are kept",
                    lost_text(&lost)
                );
            }
            Err(e) => {
                let sticky = Sticky {
                    lost,
                    why: e.help.unwrap_or(e.message),
                    device: self.device,
                };
                self.no_fresh_context(sticky, err);
            }
        }
    }

    /// Runs what follows on GPU 0, opening it the first time: its
    /// description, or E0721 (no driver, no GPU) with the session unchanged.
    pub fn use_cuda(&mut self) -> Result<GpuInfo, tessera::exec::ExecError> {
        let gpu = self.open_gpu()?;
        self.device = Device::Cuda;
        self.exec_device = tessera::exec::Device::Cuda(gpu.clone());
        Ok(gpu.info().clone())
    }

    /// The GPU the session runs on, if it runs on one.
    pub fn gpu_info(&self) -> Option<&GpuInfo> {
        match &self.exec_device {
            tessera::exec::Device::Cuda(g) => Some(g.info()),
            tessera::exec::Device::Cpu => None,
        }
    }

    pub fn database(&self) -> &Database {
        &self.db
    }

    pub fn database_mut(&mut self) -> &mut Database {
        &mut self.db
    }

    /// The session source file (every definition so far).
    pub fn source_file(&self) -> SourceFile {
        self.file
    }

    /// Session variables and defined names, for completion.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.vars.keys().cloned().collect();
        for d in &self.defs {
            names.extend(d.names.iter().cloned());
        }
        names.sort();
        names.dedup();
        names
    }

    /// What may follow `NAME.` for each name that has members: a session
    /// value's attributes and methods (the checker's table), a module's
    /// definitions (`import std.nn as nn`), a namespace's modules (`std`).
    pub fn members(&self) -> BTreeMap<String, Vec<String>> {
        use tessera::check::scope::Entry;
        let mut out = BTreeMap::new();
        for (name, v) in &self.vars {
            if matches!(
                v,
                Val::Run(Value::Tensor(_) | Value::Int(_) | Value::Float(_) | Value::Bool(_))
            ) {
                let m = tessera::check::expr::VALUE_MEMBERS
                    .iter()
                    .map(|s| s.to_string());
                out.insert(name.clone(), m.collect());
            }
        }
        let scope = tessera::db::module_scope(&self.db, self.file);
        for name in scope.names() {
            let names: Vec<String> = match scope.get(name) {
                Some(Entry::Module(m)) => m.names().map(String::from).collect(),
                Some(Entry::Namespace(map)) => map.keys().cloned().collect(),
                _ => continue,
            };
            out.insert(name.to_string(), names);
        }
        out
    }

    pub fn variable(&self, name: &str) -> Option<&Val> {
        self.vars.get(name)
    }

    /// Executes `input` (one or more top-level items, as typed): definitions are
    /// added, statements run, expression statements print their value to `out`.
    /// Diagnostics go to `err`. Stops at the first error; returns whether there
    /// was none.
    pub fn execute(&mut self, input: &str, out: &mut dyn Write, err: &mut dyn Write) -> bool {
        let base = self.append_transcript(input);
        self.execute_at(input, base, true, out, err)
    }

    /// Executes `text`, the content of a file shown as `shown`: its definitions
    /// first (so statements may use functions defined below them), then its
    /// statements in order. Diagnostics point into the file.
    pub fn run_file(&mut self, text: &str, out: &mut dyn Write, err: &mut dyn Write) -> bool {
        self.transcript = text.to_string();
        let (items, syntax_errors) = parse_input(text);
        if !syntax_errors.is_empty() {
            self.render(&syntax_errors, err);
            return false;
        }
        let mut defs = Vec::new();
        for (item, range) in &items {
            if !matches!(item, ast::Item::Stmt(_)) {
                defs.push((item.clone(), text[range.range()].to_string(), range.start));
            }
        }
        if let Err(diags) = self.add_defs(defs) {
            self.render(&diags, err);
            return false;
        }
        for (item, range) in &items {
            if let ast::Item::Stmt(s) = item {
                let item_text = &text[range.range()];
                if let Err(d) = self.run_statement(s, item_text, false, out) {
                    // The run ends here: no fresh context is needed (the
                    // diagnostic says the context became unusable).
                    self.render(&[d.shifted(range.start)], err);
                    return false;
                }
            }
        }
        true
    }

    /// Executes `input`, already in the transcript at `at`, without printing
    /// expression values (`:time`).
    pub fn execute_quiet(
        &mut self,
        input: &str,
        at: u32,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> bool {
        self.execute_at(input, at, false, out, err)
    }

    /// The type of the expression `text` (in the transcript at `at`): the
    /// value's for what the host computes without running anything, the
    /// checker's otherwise (nothing runs).
    pub fn type_of(&mut self, text: &str, at: u32) -> Result<String, Vec<Diagnostic>> {
        let parsed = syntax::parse_item(text);
        let errors: Vec<Diagnostic> = parsed
            .diagnostics
            .into_iter()
            .filter(|d| d.is_error())
            .map(|d| d.shifted(at))
            .collect();
        if !errors.is_empty() {
            return Err(errors);
        }
        let e = match parsed.item {
            Some(ast::Item::Stmt(mut s)) if matches!(s.kind, ast::StmtKind::Expr(_)) => {
                match std::mem::replace(&mut s.kind, ast::StmtKind::Pass) {
                    ast::StmtKind::Expr(e) => e,
                    _ => unreachable!("matched above"),
                }
            }
            _ => {
                return Err(vec![Diagnostic::new(
                    "E0722",
                    Span::new(at, at + text.len() as u32),
                    "`:type` takes an expression",
                )
                .with_help("`:type x * 2.0`")])
            }
        };
        if let ast::ExprKind::Name(id) = &e.kind {
            if let Some(v) = self.vars.get(&id.name) {
                return Ok(value_type(v));
            }
        }
        // Host values the checker cannot type inside the synthetic function
        // (`len(x)`, `x[0] * 2`, `load_npy(path)`): computed, cheaply.
        let reads_npy = matches!(&e.kind, ast::ExprKind::Call { func, .. }
            if matches!(&func.kind, ast::ExprKind::Name(id)
                if Builtin::from_name(&id.name) == Some(Builtin::LoadNpy)));
        if self.is_host_scalar(&e) || reads_npy {
            return self
                .eval(&e, text)
                .map(|v| value_type(&v))
                .map_err(|d| vec![d.shifted(at)]);
        }
        self.static_type(&e, text).map_err(|d| vec![d.shifted(at)])
    }

    fn append_transcript(&mut self, input: &str) -> u32 {
        let base = self.transcript.len() as u32;
        self.transcript.push_str(input);
        if !input.ends_with('\n') {
            self.transcript.push('\n');
        }
        base
    }

    fn execute_at(
        &mut self,
        input: &str,
        base: u32,
        print_values: bool,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> bool {
        // `:time` and a user's up-arrow run the same text again: parse it once.
        let parsed = match &self.last_parse {
            Some((text, parsed)) if text == input => parsed.clone(),
            _ => {
                let parsed = Arc::new(parse_input(input));
                self.last_parse = Some((input.to_string(), parsed.clone()));
                parsed
            }
        };
        let (items, syntax_errors) = (&parsed.0, &parsed.1);
        if !syntax_errors.is_empty() {
            let shifted: Vec<Diagnostic> = syntax_errors
                .iter()
                .map(|d| d.clone().shifted(base))
                .collect();
            self.render(&shifted, err);
            return false;
        }
        for (item, range) in items {
            let item_text = &input[range.range()];
            let result = match &item {
                ast::Item::Stmt(s) => self
                    .run_statement(s, item_text, print_values, out)
                    .map_err(|d| vec![d.shifted(base + range.start)]),
                _ => self.add_defs(vec![(
                    item.clone(),
                    item_text.to_string(),
                    base + range.start,
                )]),
            };
            if let Err(diags) = result {
                self.render(&diags, err);
                self.recover_gpu(err);
                return false;
            }
        }
        true
    }

    /// Renders diagnostics whose spans point into the transcript.
    pub fn render(&mut self, diags: &[Diagnostic], err: &mut dyn Write) {
        if let Some(c) = &mut self.collected {
            c.extend(diags.iter().cloned());
            return;
        }
        let _ = err.write_all(
            render::render_human_capped(
                &self.shown,
                &self.transcript,
                diags,
                self.color,
                render::MAX_SHOWN,
            )
            .as_bytes(),
        );
        let _ = err.flush();
    }

    /// Renders diagnostics whose spans point into `text` (shown under the session's name).
    pub fn render_against(&self, text: &str, diags: &[Diagnostic], err: &mut dyn Write) {
        let _ = err.write_all(
            render::render_human_capped(&self.shown, text, diags, self.color, render::MAX_SHOWN)
                .as_bytes(),
        );
        let _ = err.flush();
    }

    /// Appends a command line to the transcript and returns its offset (for
    /// diagnostics about it).
    pub fn note_command(&mut self, line: &str) -> u32 {
        match self.command_base {
            Some(at) => at,
            None => self.append_transcript(line),
        }
    }

    /// Runs `text` as a piped session would (every input, errors or not), with
    /// `text` as the transcript; returns the diagnostics instead of rendering
    /// them (the UI harness's `# run` cases).
    pub fn run_script(&mut self, text: &str, out: &mut dyn Write) -> Vec<Diagnostic> {
        self.transcript = text.to_string();
        self.collected = Some(Vec::new());
        let mut sink = std::io::sink();
        for chunk in crate::chunk::chunks(text) {
            if crate::command::is_command(&chunk.text) {
                self.command_base = Some(chunk.offset);
                let (next, _) = crate::command::run(self, &chunk.text, out, &mut sink);
                self.command_base = None;
                if next == crate::command::Next::Quit {
                    break;
                }
            } else {
                self.execute_at(&chunk.text, chunk.offset, true, out, &mut sink);
            }
        }
        self.collected.take().unwrap_or_default()
    }

    fn session_text(defs: &[Def]) -> String {
        let mut text = String::new();
        for d in defs {
            text.push_str(&d.text);
            if !d.text.ends_with('\n') {
                text.push('\n');
            }
        }
        text
    }

    /// Adds definitions typed at `offset`s of the transcript, replacing earlier
    /// definitions of the same names; nothing is kept when any has an error.
    fn add_defs(&mut self, items: Vec<(ast::Item, String, u32)>) -> Result<(), Vec<Diagnostic>> {
        let mut new_defs = Vec::new();
        for (item, text, offset) in items {
            let names = defined_names(&item);
            for n in &names {
                if self.vars.contains_key(n) {
                    // A definition shadows a variable of the same name.
                    self.vars.remove(n);
                }
            }
            new_defs.push(Def {
                names,
                text,
                origin: Origin::Input(offset),
            });
        }
        self.install(new_defs, |_| false)
    }

    /// Replaces the definitions that `drop` selects (and those binding the names
    /// of `new`) by `new`, checks the result and keeps it only when the new
    /// definitions have no errors (their diagnostics are returned, mapped to the
    /// transcript).
    fn install(
        &mut self,
        new: Vec<Def>,
        drop: impl Fn(&Def) -> bool,
    ) -> Result<(), Vec<Diagnostic>> {
        let new_names: Vec<&String> = new.iter().flat_map(|d| d.names.iter()).collect();
        let mut defs: Vec<Def> = self
            .defs
            .iter()
            .filter(|d| !drop(d) && !d.names.iter().any(|n| new_names.contains(&n)))
            .cloned()
            .collect();
        let first_new = defs.len();
        defs.extend(new);
        let text = Self::session_text(&defs);
        self.db.set_source(SESSION_PATH, text.clone());
        // Where each definition starts in the session source.
        let mut starts = Vec::with_capacity(defs.len());
        let mut at = 0u32;
        for d in &defs {
            starts.push(at);
            at += d.text.len() as u32 + u32::from(!d.text.ends_with('\n'));
        }
        let mut errors = Vec::new();
        let mut file_errors: Vec<(PathBuf, Diagnostic)> = Vec::new();
        for d in self.db.diagnostics(self.file) {
            if !d.is_error() {
                continue;
            }
            let Some(i) = starts.iter().rposition(|s| *s <= d.span.start) else {
                continue;
            };
            if i < first_new {
                continue;
            }
            let end = starts[i] + defs[i].text.len() as u32;
            match &defs[i].origin {
                Origin::Input(offset) => errors.push(relocate(d, starts[i], end, *offset)),
                Origin::File(path) => {
                    file_errors.push((path.clone(), relocate(d, starts[i], end, 0)))
                }
            }
        }
        if errors.is_empty() && file_errors.is_empty() {
            self.defs = defs;
            return Ok(());
        }
        // Restore the previous source.
        let old = Self::session_text(&self.defs);
        self.db.set_source(SESSION_PATH, old);
        if errors.is_empty() {
            // Errors inside a loaded file that checked on its own (an interaction
            // with session definitions): point at the file.
            let (path, d) = &file_errors[0];
            let mut d = d.clone();
            d.message = format!("in `{}`: {}", path.display(), d.message);
            errors.push(Diagnostic {
                span: Span::new(0, 0),
                ..d
            });
        }
        Err(errors)
    }

    /// `:load FILE`: checks the file on its own (diagnostics name the file),
    /// adds its definitions, then runs its top-level statements in order as
    /// `tessera run` does (their `print` output goes to `out`; expression
    /// statements do not print). The definitions stay when a statement fails;
    /// its diagnostic is rendered against the file. Returns how many
    /// statements ran.
    pub fn load(
        &mut self,
        path: &Path,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> Result<usize, LoadError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| LoadError::Unreadable(e.to_string()))?;
        let shown = path.display().to_string();
        let mut scratch = Database::new();
        let file = scratch.set_source(path, text.clone());
        let diags = scratch.diagnostics(file).to_vec();
        if diags.iter().any(|d| d.is_error()) {
            let _ = err.write_all(
                render::render_human_capped(&shown, &text, &diags, self.color, render::MAX_SHOWN)
                    .as_bytes(),
            );
            return Err(LoadError::Errors);
        }
        let mut new = Vec::new();
        let mut statements = Vec::new();
        for (item, range) in parse_input(&text).0 {
            if let ast::Item::Stmt(s) = item {
                statements.push((s, range));
                continue;
            }
            new.push(Def {
                names: defined_names(&item),
                text: text[range.range()].to_string(),
                origin: Origin::File(path.to_path_buf()),
            });
        }
        let owned = path.to_path_buf();
        if let Err(diags) = self.install(new, |d| d.origin == Origin::File(owned.clone())) {
            self.render(&diags, err);
            return Err(LoadError::Errors);
        }
        if !self.loaded.contains(&owned) {
            self.loaded.push(owned);
        }
        for (i, (s, range)) in statements.iter().enumerate() {
            if let Err(d) = self.run_statement(s, &text[range.range()], false, out) {
                let d = d.shifted(range.start);
                let _ = err.write_all(
                    render::render_human_all(&shown, &text, &[d], self.color).as_bytes(),
                );
                self.recover_gpu(err);
                return Err(LoadError::StatementFailed { ran: i });
            }
        }
        Ok(statements.len())
    }

    /// The files `:reload` reads again.
    pub fn loaded_files(&self) -> &[PathBuf] {
        &self.loaded
    }

    /// The definitions from `file` (names), for `:load` feedback.
    pub fn names_from(&self, path: &Path) -> Vec<String> {
        self.defs
            .iter()
            .filter(|d| d.origin == Origin::File(path.to_path_buf()))
            .flat_map(|d| d.names.iter().cloned())
            .collect()
    }

    /// Sets the target architecture used by checks, `:emit` and `:resources`.
    pub fn set_arch(&mut self, arch: Arch) {
        self.db.set_arch(arch);
    }
}

/// Why `:load` added nothing.
#[derive(Debug)]
pub enum LoadError {
    /// The file cannot be read (the I/O message).
    Unreadable(String),
    /// Its diagnostics were rendered.
    Errors,
    /// Its definitions were added, and a top-level statement failed after
    /// `ran` others succeeded (the diagnostic was rendered against the file).
    StatementFailed { ran: usize },
}

/// The items of `text` with their ranges; items that did not parse are left
/// out (their diagnostics come from [`parse_errors`]).
/// The items of `text` with their ranges, and its syntax errors (absolute
/// spans), from one parse.
fn parse_input(text: &str) -> ParsedInput {
    let mut items = Vec::new();
    let mut errors = Vec::new();
    for range in syntax::split_items(text) {
        let parsed = syntax::parse_item(&text[range.range()]);
        errors.extend(
            parsed
                .diagnostics
                .into_iter()
                .filter(|d| d.is_error())
                .map(|d| d.shifted(range.start)),
        );
        if let Some(i) = parsed.item {
            items.push((i, range));
        }
    }
    (items, errors)
}

fn defined_names(item: &ast::Item) -> Vec<String> {
    match item {
        ast::Item::Import(i) => vec![i.alias.as_ref().unwrap_or(&i.path[0]).name.clone()],
        ast::Item::FromImport(i) => i
            .names
            .iter()
            .map(|n| n.alias.as_ref().unwrap_or(&n.name).name.clone())
            .collect(),
        ast::Item::Const(c) => vec![c.name.name.clone()],
        ast::Item::Function(f) => vec![f.name.name.clone()],
        ast::Item::Stmt(_) => vec![],
    }
}

/// `d` with spans inside `[start, end]` moved to `to + (span - start)`; a
/// primary span outside becomes the item's whole range, labels outside are dropped.
pub(crate) fn relocate(d: &Diagnostic, start: u32, end: u32, to: u32) -> Diagnostic {
    let inside = |s: Span| s.start >= start && s.end <= end;
    let map = |s: Span| Span::new(s.start - start + to, s.end - start + to);
    let mut out = d.clone();
    out.span = if inside(d.span) {
        map(d.span)
    } else {
        Span::new(to, to + (end - start))
    };
    out.labels = d
        .labels
        .iter()
        .filter(|l| inside(l.span))
        .map(|l| tessera::diag::Label {
            span: map(l.span),
            message: l.message.clone(),
        })
        .collect();
    out
}

/// The type of a session value, written as in source (`Tensor[4, 1000, f32]`).
pub fn value_type(v: &Val) -> String {
    match v {
        Val::Run(Value::Tensor(t)) => {
            let mut parts: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
            parts.push(t.dtype().to_string());
            format!("Tensor[{}]", parts.join(", "))
        }
        Val::Run(Value::Int(_)) => "int".into(),
        Val::Run(Value::Float(_)) => "float".into(),
        Val::Run(Value::Bool(_)) => "bool".into(),
        Val::Run(Value::None) => "None".into(),
        Val::Run(Value::Tuple(items)) => {
            let parts: Vec<String> = items
                .iter()
                .map(|x| value_type(&Val::Run(x.clone())))
                .collect();
            format!("({})", parts.join(", "))
        }
        Val::Str(_) => "str".into(),
        Val::DType(_) => "dtype".into(),
        Val::List(items) => format!("list of {}", items.len()),
        Val::Dist(d, _) => {
            let mut parts: Vec<String> = d.shape().iter().map(|d| d.to_string()).collect();
            parts.push(d.dtype().to_string());
            format!(
                "Tensor[{}] ({})",
                parts.join(", "),
                placement_word(d.placement())
            )
        }
    }
}

/// `sharded on axis 0`, `replicated`, `partial sum`.
pub fn placement_word(p: tessera::exec::dist::Placement) -> String {
    use tessera::exec::dist::Placement;
    match p {
        Placement::Sharded { axis } => format!("sharded on axis {axis}"),
        Placement::Replicated => "replicated".into(),
        Placement::Partial(op) => format!("partial {}", op.name()),
    }
}

/// `Value` → `Val`.
impl From<Value> for Val {
    fn from(v: Value) -> Val {
        Val::Run(v)
    }
}
