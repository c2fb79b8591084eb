//! Tensors over the session's devices: `shard`, `gather`, the collectives,
//! and tensor expressions run per device (docs/multi-gpu.md).
//!
//! The session has `devices` devices: virtual ones on the CPU (`cpu:0`, ...),
//! or the first GPUs (`cuda:0`, ...). `shard(x, axis=k)` splits a tensor over
//! them; an expression with a distributed operand is checked whole (the
//! shapes the user wrote), its Graph IR is given placements
//! (`exec::dist::infer`) and localized (each sharded axis a length every
//! device binds to its part's), and the lowered plan then runs on every
//! device at once (the session's worker threads), each on its parts, meeting
//! at the collectives. The collectives run on the host for the CPU's virtual
//! devices and through NCCL on GPUs.

use tessera::check::builtins::Builtin;
use tessera::diag::Diagnostic;
use tessera::exec::dist::{self, infer, DistTensor, Placement, ReduceOp};
use tessera::exec::{self, Value};
use tessera::syntax::ast::{Arg, Expr};
use tessera::syntax::span::Span;

use super::eval::Val;
use super::synth::Synth;
use super::Session;

type R<T> = Result<T, Diagnostic>;

/// The builtins of this module: evaluated by the host in top-level
/// statements (inside functions they are Graph IR collectives).
pub(crate) fn is_dist_builtin(id: Builtin) -> bool {
    matches!(
        id,
        Builtin::Shard
            | Builtin::Gather
            | Builtin::AllReduce
            | Builtin::AllGather
            | Builtin::ReduceScatter
            | Builtin::Broadcast
    )
}

/// The most devices a session may use.
pub const MAX_DEVICES: usize = 64;

fn dist_error(span: Span, message: impl Into<String>, help: impl Into<String>) -> Diagnostic {
    Diagnostic::new(dist::E_DIST, span, message.into()).with_help(help.into())
}

impl Session {
    /// How many devices distributed tensors spread over.
    pub fn device_count(&self) -> usize {
        self.devices
    }

    /// Sets the device count (`--devices`, `:device cpu N`); on a GPU, every
    /// one of the first `n` GPUs must open.
    pub fn set_device_count(&mut self, n: usize, span: Span) -> R<()> {
        if n == 0 || n > MAX_DEVICES {
            return Err(dist_error(
                span,
                format!("a session uses 1 to {MAX_DEVICES} devices, not {n}"),
                "e.g. `:device cpu 4` for four virtual CPU devices",
            ));
        }
        if self.kind() == "cuda" {
            for i in 0..n {
                self.gpu_for_move(i, span)?;
            }
        }
        self.devices = n;
        Ok(())
    }

    /// `cpu` or `cuda`: what the session's devices are.
    pub(crate) fn kind(&self) -> &'static str {
        match self.exec_device {
            exec::Device::Cuda(_) => "cuda",
            exec::Device::Cpu => "cpu",
        }
    }

    /// Where device `i`'s part runs.
    fn exec_device_of(&mut self, i: usize, kind: &str, span: Span) -> R<exec::Device> {
        Ok(match kind {
            "cuda" => exec::Device::Cuda(self.gpu_for_move(i, span)?),
            _ => exec::Device::Cpu,
        })
    }

    /// Puts each part on its device (a GPU's copy; nothing on the CPU).
    fn placed(&mut self, d: DistTensor, kind: &'static str, span: Span) -> R<Val> {
        if kind == "cuda" {
            for p in d.parts() {
                let gpu = self.gpu_for_move(p.device, span)?;
                gpu.to_device(&p.tensor)
                    .map_err(|e| e.to_diagnostic(span))?;
            }
        }
        Ok(Val::Dist(d, kind))
    }

    /// `shard`, `gather` and the collectives.
    pub(super) fn dist_builtin(
        &mut self,
        name: &str,
        e: &Expr,
        args: &[Arg],
        text: &str,
    ) -> R<Val> {
        // The parameters are the checker's (its builtin table).
        let allowed = Builtin::from_name(name)
            .expect("a builtin of the table")
            .info()
            .params;
        let bound = Self::bind(name, allowed, 1, args, e.span)?;
        let mut given: Vec<(&str, Val, Span)> = Vec::new();
        for (key, a) in allowed.iter().zip(bound) {
            if let Some(a) = a {
                given.push((key, self.eval(a, text)?, a.span));
            }
        }
        let get = |k: &str| {
            given
                .iter()
                .find(|(n, ..)| *n == k)
                .map(|(_, v, s)| (v.clone(), *s))
        };
        let Some((x, x_span)) = get("x") else {
            return Err(
                Diagnostic::new("E0304", e.span, format!("`{name}` takes a tensor"))
                    .with_help(format!("`{name}({})`", allowed.join(", "))),
            );
        };
        let int = |k: &str, default: i64| -> R<i64> {
            match get(k) {
                None => Ok(default),
                Some((Val::Run(Value::Int(i)), _)) => Ok(i),
                Some((v, s)) => Err(dist_error(
                    s,
                    format!("`{k}` is an integer, found {}", v.describe()),
                    format!("e.g. `{name}(x, {k}=0)`"),
                )),
            }
        };
        let op = |default: ReduceOp| -> R<ReduceOp> {
            match get("op") {
                None => Ok(default),
                Some((Val::Str(s), span)) => ReduceOp::parse(&s).ok_or_else(|| {
                    dist_error(
                        span,
                        format!("unknown reduction `{s}`"),
                        format!(
                            "`op` is one of {}",
                            ReduceOp::NAMES.map(|n| format!("\"{n}\"")).join(", ")
                        ),
                    )
                }),
                Some((v, span)) => Err(dist_error(
                    span,
                    format!("`op` is a string, found {}", v.describe()),
                    "e.g. `op=\"sum\"`",
                )),
            }
        };
        let interrupt = self.interrupt.clone();
        let run =
            |r: Result<DistTensor, exec::ExecError>| r.map_err(|err| err.to_diagnostic(e.span));
        if name == "shard" {
            let t = match x {
                Val::Run(Value::Tensor(t)) => t,
                Val::Dist(..) => {
                    return Err(dist_error(
                        x_span,
                        "this tensor is already distributed",
                        "`gather` it first to shard it another way",
                    ))
                }
                other => {
                    return Err(dist_error(
                        x_span,
                        format!(
                            "`shard` splits a tensor, not {}",
                            tessera::diag::with_article(&other.describe())
                        ),
                        "e.g. `shard(randn([8, 4], f32), axis=0)`",
                    ))
                }
            };
            let axis_span = get("axis").map(|(_, s)| s).unwrap_or(e.span);
            let axis = dist::normalize_axis(int("axis", 0)?, t.shape().len(), "shard")
                .map_err(|err| err.to_diagnostic(axis_span))?;
            let devices = self.devices_arg(get("devices"))?;
            let kind = self.kind();
            let d = run(dist::shard(&t, axis, &devices, &interrupt))?;
            return self.placed(d, kind, e.span);
        }
        let (d, kind) = match x {
            Val::Dist(d, kind) => (d, kind),
            Val::Run(Value::Tensor(t)) if name == "gather" => {
                return Ok(Val::Run(Value::Tensor(t)))
            }
            // From the session to every device: a replicated tensor, placed
            // once (a whole tensor in a sharded expression is copied to the
            // devices at every call).
            Val::Run(Value::Tensor(t)) if name == "broadcast" => {
                if let Some((_, span)) = get("src") {
                    return Err(dist_error(
                        span,
                        "`src` picks a part, and a whole tensor has none",
                        "`broadcast(x)` copies a whole tensor to every device",
                    ));
                }
                let devices: Vec<usize> = (0..self.devices).collect();
                let kind = self.kind();
                let d = run(dist::replicate(&t, &devices, &interrupt))?;
                return self.placed(d, kind, e.span);
            }
            other => {
                return Err(dist_error(
                    x_span,
                    format!(
                        "`{name}` takes a distributed tensor, found {}",
                        other.describe()
                    ),
                    "`shard(x, axis=0)` spreads a tensor over the session's devices",
                ))
            }
        };
        // On GPUs the collectives go through NCCL, each part on its GPU.
        let gpus: Vec<std::sync::Arc<tessera::exec::cuda::Gpu>> = if kind == "cuda" {
            d.devices()
                .into_iter()
                .map(|i| self.gpu_for_move(i, e.span))
                .collect::<R<_>>()?
        } else {
            Vec::new()
        };
        let site = if kind == "cuda" {
            dist::Site::Gpus(&gpus)
        } else {
            dist::Site::Host
        };
        let out = match name {
            "gather" => {
                let t = d
                    .gather(&interrupt)
                    .map_err(|err| err.to_diagnostic(e.span))?;
                return Ok(Val::Run(Value::Tensor(t)));
            }
            "all_reduce" => run(dist::all_reduce(&d, op(ReduceOp::Sum)?, site, &interrupt))?,
            "all_gather" => run(dist::all_gather(&d, site, &interrupt))?,
            "reduce_scatter" => {
                let axis_span = get("axis").map(|(_, s)| s).unwrap_or(e.span);
                let axis = dist::normalize_axis(int("axis", 0)?, d.shape().len(), "reduce_scatter")
                    .map_err(|err| err.to_diagnostic(axis_span))?;
                run(dist::reduce_scatter(
                    &d,
                    op(ReduceOp::Sum)?,
                    axis,
                    site,
                    &interrupt,
                ))?
            }
            "broadcast" => {
                let src = int("src", 0)?;
                let span = get("src").map(|(_, s)| s).unwrap_or(e.span);
                let src = usize::try_from(src).map_err(|_| {
                    dist_error(
                        span,
                        format!("`src` is a part's index, not {src}"),
                        "e.g. `src=0`",
                    )
                })?;
                run(dist::broadcast(&d, src, site, &interrupt)).map_err(|mut err| {
                    err.span = span;
                    err
                })?
            }
            other => unreachable!("not a distribution builtin: {other}"),
        };
        self.placed(out, kind, e.span)
    }

    /// `devices=[0, 2]`: distinct indices of the session's devices; all of
    /// them by default.
    fn devices_arg(&self, arg: Option<(Val, Span)>) -> R<Vec<usize>> {
        let Some((v, span)) = arg else {
            return Ok((0..self.devices).collect());
        };
        let help = format!(
            "`devices` lists device numbers, e.g. `devices=[0, 1]`; this session has {} (`:device {} N` sets how many)",
            self.devices,
            self.kind()
        );
        let Val::List(items) = v else {
            return Err(dist_error(
                span,
                format!("`devices` is a list, found {}", v.describe()),
                help,
            ));
        };
        let mut out = Vec::new();
        for it in items {
            match it {
                Val::Run(Value::Int(i)) if i >= 0 && (i as usize) < self.devices => {
                    if out.contains(&(i as usize)) {
                        return Err(dist_error(
                            span,
                            format!("device {i} is listed twice"),
                            help,
                        ));
                    }
                    out.push(i as usize)
                }
                Val::Run(Value::Int(i)) => {
                    return Err(dist_error(
                        span,
                        format!(
                            "there is no device {i}: the session has {} ({}:0 to {}:{})",
                            self.devices,
                            self.kind(),
                            self.kind(),
                            self.devices - 1
                        ),
                        help,
                    ))
                }
                other => {
                    return Err(dist_error(
                        span,
                        format!("a device is a number, found {}", other.describe()),
                        help,
                    ))
                }
            }
        }
        if out.is_empty() {
            return Err(dist_error(span, "`devices` is empty", help));
        }
        Ok(out)
    }

    /// Runs a checked synthetic function with distributed arguments (or
    /// collectives) once per device (see the module docs).
    pub(super) fn run_spmd(&mut self, synth: &Synth) -> R<Val> {
        let span = synth.span;
        let mut devices: Option<(Vec<usize>, &'static str)> = None;
        for (d, kind) in synth.dists.iter().flatten() {
            let these = d.devices();
            match &devices {
                Some((ds, k)) if *ds != these || k != kind => {
                    return Err(Diagnostic::new(
                        infer::E_PLACEMENT,
                        span,
                        "these distributed tensors are on different devices",
                    )
                    .with_help("shard them over the same `devices=`"))
                }
                _ => devices = Some((these, kind)),
            }
        }
        // Whole arguments only (a function that shards inside): every device
        // of the session.
        let (devices, kind) = devices.unwrap_or_else(|| ((0..self.devices).collect(), self.kind()));
        let options = self.db.options();
        let graph_of = |s: &Session, name: &str| {
            let (item, _) = tessera::db::function_item(&s.db, s.file, name)
                .expect("the synthetic function is in the session source");
            tessera::db::graph_ir(&s.db, item, options).clone()
        };
        let lowered = |e: tessera::ir::graph::LowerError| {
            Diagnostic::new(
                "E0512",
                span,
                format!("this expression cannot be lowered: {e}"),
            )
            .with_help("write it with the operations the compiler lowers (docs/language.md)")
        };
        let global = graph_of(self, &synth.name).map_err(lowered)?;
        let placements: Vec<Placement> = synth
            .dists
            .iter()
            .map(|d| {
                d.as_ref()
                    .map_or(Placement::Replicated, |(d, _)| d.placement())
            })
            .collect();
        let at_user = |e: infer::PlacementError| {
            let mut d = Diagnostic::new(infer::E_PLACEMENT, span, e.message).with_help(e.help);
            // The op's span, when it lies inside the user's expression.
            let lo = synth.expr_start - synth.item_start;
            if e.span.start >= lo {
                let s = Span::new(e.span.start - lo + span.start, e.span.end - lo + span.start);
                if s.end <= span.end {
                    d.span = s;
                }
            }
            d
        };
        // The plan each device runs: the localized graph, lowered once per
        // expression and placements (its kernels are then compiled once).
        let key = format!("{}\n{placements:?}", synth.source);
        let plan = match self.localized.get(&key) {
            Some(p) => p.clone(),
            None => {
                let inferred = infer::infer(&global, &placements).map_err(at_user)?;
                let (local, symbols) = infer::localize(&global, &inferred).map_err(at_user)?;
                if cfg!(debug_assertions) {
                    if let Err(e) = tessera::ir::graph::verify(&local) {
                        panic!(
                            "localized Graph IR: {e}\n{}",
                            tessera::ir::graph::dump(&local)
                        );
                    }
                }
                let schedule = tessera::ir::schedule::lower(&local).map_err(lowered)?;
                let plan = std::sync::Arc::new(Plan {
                    schedule,
                    symbols,
                    inferred,
                });
                if self.localized.len() >= PLANS_CAP {
                    self.localized.clear();
                }
                self.localized.insert(key, plan.clone());
                plan
            }
        };
        let inferred = &plan.inferred;

        // Each device's arguments: its parts, and the whole arguments (split
        // where they were demanded sharded).
        let n = devices.len();
        let mut jobs = Vec::with_capacity(n);
        for (k, &dev) in devices.iter().enumerate() {
            let device = self.exec_device_of(dev, kind, span)?;
            let mut args = Vec::with_capacity(synth.args.len());
            for (i, a) in synth.args.iter().enumerate() {
                let arg = match (&synth.dists[i], a, inferred.params[i]) {
                    (Some((d, _)), ..) => Value::Tensor(d.parts()[k].tensor.clone()),
                    (None, Value::Tensor(t), Placement::Sharded { axis }) => {
                        let sizes = dist::split_sizes(t.shape()[axis], n)
                            .map_err(|e| e.to_diagnostic(span))?;
                        let start: usize = sizes[..k].iter().sum();
                        Value::Tensor(
                            t.narrow(axis, start, sizes[k], &self.interrupt)
                                .map_err(|e| e.to_diagnostic(span))?,
                        )
                    }
                    // A whole tensor used whole on every device: each GPU gets
                    // its own copy (one storage keeps one device copy).
                    (None, Value::Tensor(t), _) if kind == "cuda" && k > 0 => Value::Tensor(
                        t.try_deep_clone(&self.interrupt)
                            .map_err(|e| e.to_diagnostic(span))?,
                    ),
                    (None, v, _) => v.clone(),
                };
                args.push(arg);
            }
            jobs.push((dev, device, args));
        }
        // The devices run at once, one thread each (on GPUs: each thread
        // launches on its own GPU), each on a snapshot of the database.
        // They meet at the function's collectives (`exec::dist::group`).
        let group = dist::Group::new(n);
        let members = group.members();
        type Outcome = Result<Value, exec::ExecError>;
        let work: Vec<Box<dyn FnOnce() -> Outcome + Send>> = jobs
            .iter()
            .zip(members)
            .enumerate()
            .map(|(k, ((_, device, args), member))| {
                let db = self.db.clone();
                let file = self.file;
                let plan = plan.clone();
                // Each device's lengths of the sharded axes.
                let dims: std::collections::BTreeMap<String, i64> = plan
                    .symbols
                    .iter()
                    .map(|(name, extent)| {
                        let sizes = dist::split_sizes(*extent as usize, n).unwrap_or_default();
                        (name.clone(), sizes.get(k).copied().unwrap_or(0) as i64)
                    })
                    .collect();
                let (device, args, interrupt) =
                    (device.clone(), args.clone(), self.interrupt.clone());
                Box::new(move || {
                    let on = exec::On {
                        device: &device,
                        interrupt: &interrupt,
                        spmd: Some(&member),
                    };
                    let r = exec::run_schedule_on(&db, file, &plan.schedule, &dims, &args, on);
                    // The snapshot goes before the caller sets the source again.
                    drop(db);
                    if let Err(e) = &r {
                        member.group.abort(e);
                    }
                    r
                }) as Box<dyn FnOnce() -> Outcome + Send>
            })
            .collect();
        let outcomes: Vec<Outcome> = self.workers.run(work).map_err(|e| {
            exec::ExecError::new("E0713", format!("cannot start a thread for a device: {e}"))
                .with_help("use fewer devices (`:device cpu N`)")
                .to_diagnostic(span)
        })?;
        // The first device's own error, not another's "stopped" after it.
        let failed = |(dev, e): (&usize, &exec::ExecError)| {
            let mut d = e.to_diagnostic(span);
            d.message = format!("on {kind}:{dev}: {}", d.message);
            d
        };
        let errors: Vec<(&usize, &exec::ExecError)> = jobs
            .iter()
            .zip(&outcomes)
            .filter_map(|((dev, ..), r)| r.as_ref().err().map(|e| (dev, e)))
            .collect();
        if let Some(first) = errors
            .iter()
            .find(|(_, e)| !e.message.starts_with("another device stopped"))
            .or(errors.first())
        {
            return Err(failed(*first));
        }
        let results: Vec<Value> = outcomes
            .into_iter()
            .map(|r| r.expect("no errors"))
            .collect();
        assemble(&results, &inferred.outputs, &devices, kind, span)
    }
}

/// The function's result from each device's results: one distributed value
/// per output, placed as inferred.
fn assemble(
    results: &[Value],
    placements: &[Placement],
    devices: &[usize],
    kind: &'static str,
    span: Span,
) -> R<Val> {
    let outputs = |v: &Value| -> Vec<Value> {
        match v {
            Value::Tuple(items) if placements.len() > 1 => items.clone(),
            other => vec![other.clone()],
        }
    };
    let per_device: Vec<Vec<Value>> = results.iter().map(outputs).collect();
    let mut vals = Vec::with_capacity(placements.len());
    for (j, &placement) in placements.iter().enumerate() {
        let mut parts = Vec::with_capacity(devices.len());
        for (k, &dev) in devices.iter().enumerate() {
            match per_device[k].get(j) {
                Some(Value::Tensor(t)) => parts.push(dist::Part {
                    device: dev,
                    tensor: t.clone(),
                }),
                // A scalar computed alike on every device.
                Some(v) if placement == Placement::Replicated => {
                    if k == 0 {
                        vals.push(Val::Run(v.clone()));
                    }
                }
                _ => {
                    return Err(Diagnostic::new(
                        infer::E_PLACEMENT,
                        span,
                        "this gives a partial scalar: each device holds a part of it",
                    )
                    .with_help("compute it as a tensor (e.g. `sum(x, axis=0)`) and `all_reduce` or `gather` it"))
                }
            }
        }
        if parts.is_empty() {
            continue;
        }
        let first = &parts[0].tensor;
        let mut shape = first.shape().to_vec();
        if let Placement::Sharded { axis } = placement {
            shape[axis] = parts.iter().map(|p| p.tensor.shape()[axis]).sum();
        }
        let dtype = first.dtype();
        vals.push(Val::Dist(
            DistTensor::from_parts(shape, dtype, placement, parts),
            kind,
        ));
    }
    Ok(if vals.len() == 1 {
        vals.pop().expect("one value")
    } else {
        Val::List(vals)
    })
}

/// Beyond this many plans, the cache of localized plans starts afresh.
const PLANS_CAP: usize = 256;

/// What each device of a distributed call runs (see the module docs).
pub(crate) struct Plan {
    schedule: tessera::ir::schedule::Schedule,
    /// The sharded axes' length symbols and the whole lengths they split.
    symbols: Vec<(String, i64)>,
    inferred: infer::Inferred,
}
