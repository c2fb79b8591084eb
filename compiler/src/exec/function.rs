//! Whole-tensor functions, run through their Schedule IR: the buffers are
//! allocated (inputs alias the caller's tensors, views share their base's
//! memory), then every launch runs in order — generated kernels as given,
//! stdlib and user kernels specialised for the launch — and the outputs are
//! returned.

use std::collections::{BTreeMap, HashMap};

use super::cuda::nccl::RankPending;
use super::dist::{Done, Member};
use super::launch::{bind_dims, find_kernel, from_const, launch_item, match_args, signature};
use super::{cpu, rng, Device, ExecError, Interrupt, Tensor, Value};
use crate::check::dims::Dim;
use crate::check::DType;
use crate::db::{self, Database, Db, SourceFile};
use crate::ir::graph::Collective;
use crate::ir::schedule::{Arg, BufId, BufKind, KernelRef, Launch, ScalarExpr, Schedule, Step};
use crate::ir::tile::{BinaryOp, Constant, ParamKind, UnaryOp};

/// The help line of an error in what the compiler itself generated (a
/// schedule's launches, host variables and standard-library calls): no
/// program the checker accepts should reach it.
const COMPILER_BUG: &str =
    "the compiler generated this step, so this is a compiler bug: please report it with the program";

/// Runs whole-tensor function `func` of `file` on `args` and `named`; returns
/// its result (a `Tuple` when it returns several tensors).
pub fn run_function(
    db: &Database,
    file: SourceFile,
    func: &str,
    args: &[Value],
    named: &[(String, Value)],
    device: &Device,
    interrupt: &Interrupt,
) -> Result<Value, ExecError> {
    run_function_in(db, file, func, (args, named), device, interrupt, None)
}

/// [`run_function`] as member `spmd` of a group of devices that run it
/// together on their parts, meeting at its collectives (`exec::dist::group`);
/// `None`: alone, where a collective is a copy.
pub fn run_function_in(
    db: &Database,
    file: SourceFile,
    func: &str,
    (args, named): (&[Value], &[(String, Value)]),
    device: &Device,
    interrupt: &Interrupt,
    spmd: Option<&Member>,
) -> Result<Value, ExecError> {
    let (item, _) = db::function_item(db, file, func).ok_or_else(|| {
        ExecError::new("E0707", format!("no function named `{func}`"))
            .with_help("define it with `def` first")
    })?;
    let sig = signature(db, item, func)?;
    if sig.is_kernel {
        return Err(ExecError::new(
            "E0707",
            format!("`{func}` is a kernel; launch it instead of calling it as a function"),
        )
        .with_help(format!(
            "launch it with a grid: `{func}[(cdiv(N, BLOCK),)](...)`"
        )));
    }
    let values = match_args(&sig, args, named)?;
    let _depth = CallDepth::enter(func)?;
    // The schedule is lowered with the const parameters' defaults.
    for (p, (_, v)) in sig.params.iter().zip(&values) {
        if p.is_const {
            let default = p
                .default
                .as_ref()
                .and_then(from_const)
                .map(|d| d.to_string());
            if default.as_deref() != Some(v.to_string().as_str()) {
                return Err(ExecError::new(
                    "E0707",
                    format!(
                        "const parameter `{}` of `{func}` cannot be set by a run-time call yet",
                        p.name
                    ),
                )
                .with_help("whole-tensor functions run with their const defaults; call it from another function with a literal, or launch a kernel"));
            }
        }
    }
    let opts = db.options();
    let cannot_run = |e: crate::ir::graph::LowerError| {
        ExecError::new(
            "E0710",
            format!("`{func}` cannot run yet: {}", e.message),
        )
        .with_help("this construct is not lowered to kernels yet (`tsrc emit schedule-ir` shows the same error)")
    };
    // A generic function runs the instance its arguments' dtypes and ranks bind.
    let (sig, instance) = match instance_of(&sig, &values)? {
        Some(env) => {
            let (g, s) = db::instance_schedule(db, item, opts, &env).map_err(cannot_run)?;
            (
                std::sync::Arc::new(crate::check::generics::instantiate(&sig, &env)),
                Some((g, s)),
            )
        }
        None => (sig, None),
    };
    let mut dims = bind_dims(&sig, &values)?;
    // A shape computed from an integer parameter (`zeros([n], f32)`, `x[0:n]`)
    // has dims in its run-time symbol, which the checker names after it.
    for (name, v) in &values {
        if let Value::Int(i) = v {
            dims.entry(name.clone()).or_insert(*i);
        }
    }
    let (graph, schedule) = match instance {
        Some(gs) => gs,
        None => (
            db::graph_ir(db, item, opts).clone().map_err(cannot_run)?,
            db::schedule_ir(db, item, opts)
                .clone()
                .map_err(cannot_run)?,
        ),
    };
    let by_name: HashMap<&str, &Value> = values.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let params: Vec<Value> = graph
        .params
        .iter()
        .map(|p| {
            by_name
                .get(p.name.as_str())
                .map(|v| (*v).clone())
                .unwrap_or(Value::None)
        })
        .collect();
    let scalars: HashMap<String, Num> = values
        .iter()
        .filter_map(|(n, v)| {
            Some((
                n.clone(),
                match v {
                    Value::Int(i) => Num::I(*i),
                    Value::Bool(b) => Num::I(*b as i64),
                    Value::Float(x) => Num::F(*x),
                    _ => return None,
                },
            ))
        })
        .collect();
    run_schedule(
        db,
        file,
        &schedule,
        &dims,
        &params,
        &scalars,
        On {
            device,
            interrupt,
            spmd,
        },
    )
}

/// The instance of a generic function that run-time arguments bind (`None`
/// for a function that is not generic); a conflict is the checker's error
/// (E0320, E0321, E0414) reported at run time.
fn instance_of(
    sig: &crate::check::FnSig,
    values: &[(String, Value)],
) -> Result<Option<crate::check::generics::TypeEnv>, ExecError> {
    use crate::check::generics::{bind_call, CallArg};
    use crate::check::{dims::Dim, Ty};
    if sig.generics.is_none() {
        return Ok(None);
    }
    let tys: Vec<(usize, Ty)> = values
        .iter()
        .filter_map(|(name, v)| {
            let j = sig.params.iter().position(|p| p.name == *name)?;
            match v {
                Value::Tensor(t) => Some((
                    j,
                    Ty::Tensor {
                        dims: t.shape().iter().map(|d| Dim::constant(*d as i64)).collect(),
                        dtype: t.dtype(),
                    },
                )),
                _ => None,
            }
        })
        .collect();
    let args: Vec<CallArg<'_>> = tys
        .iter()
        .map(|(j, ty)| CallArg {
            param: *j,
            ty,
            span: crate::syntax::span::Span::new(0, 0),
        })
        .collect();
    bind_call(sig, &args).map(Some).map_err(|diags| {
        let d = &diags[0];
        let e = ExecError::new(d.code, d.message.clone());
        match &d.help {
            Some(h) => e.with_help(h.clone()),
            None => e,
        }
    })
}

/// Nesting of `run_function` on this thread (recursive `Call` steps), capped
/// so that runaway recursion is an error, not a stack overflow.
struct CallDepth;

const MAX_CALL_DEPTH: usize = 200;

thread_local! {
    static DEPTH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl CallDepth {
    fn enter(func: &str) -> Result<CallDepth, ExecError> {
        let d = DEPTH.with(|d| d.get());
        if d >= MAX_CALL_DEPTH {
            return Err(ExecError::new(
                "E0710",
                format!("`{func}` recurses more than {MAX_CALL_DEPTH} calls deep"),
            )
            .with_help("check the recursion's base case"));
        }
        DEPTH.with(|c| c.set(d + 1));
        Ok(CallDepth)
    }
}

impl Drop for CallDepth {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

#[derive(Clone, Copy, Debug)]
enum Num {
    I(i64),
    F(f64),
}

impl Num {
    fn f(self) -> f64 {
        match self {
            Num::I(i) => i as f64,
            Num::F(x) => x,
        }
    }
}

fn dim_value(d: &Dim, env: &BTreeMap<String, i64>) -> Result<i64, ExecError> {
    d.substitute(&|s| env.get(s).map(|v| Dim::constant(*v)))
        .and_then(|d| d.as_const())
        .ok_or_else(|| {
            ExecError::new("E0710", format!("dim `{d}` is not bound by the arguments"))
                .with_help(format!("pass a tensor argument whose shape gives `{d}`"))
        })
}

fn dims_of(ds: &[Dim], env: &BTreeMap<String, i64>) -> Result<Vec<usize>, ExecError> {
    ds.iter()
        .map(|d| {
            let v = dim_value(d, env)?;
            if v < 0 {
                return Err(
                    ExecError::new("E0701", format!("dim `{d}` evaluates to {v}"))
                        .with_help(format!("pass tensors whose shapes make `{d}` 0 or more")),
                );
            }
            Ok(v as usize)
        })
        .collect()
}

fn scalar(
    e: &ScalarExpr,
    env: &BTreeMap<String, i64>,
    params: &HashMap<String, Num>,
) -> Result<Num, ExecError> {
    Ok(match e {
        ScalarExpr::Param(p) => *params.get(p).ok_or_else(|| {
            ExecError::new("E0707", format!("missing scalar argument `{p}`"))
                .with_help(format!("pass a value for `{p}`"))
        })?,
        ScalarExpr::Index(d) => Num::I(dim_value(d, env)?),
        ScalarExpr::Const(c) => match c {
            Constant::Int(i) => Num::I(*i),
            Constant::Float(x) => Num::F(*x),
            Constant::Bool(b) => Num::I(*b as i64),
        },
        ScalarExpr::Unary(op, x) => {
            let x = scalar(x, env, params)?;
            match (op, x) {
                (UnaryOp::Neg, Num::I(i)) => Num::I(i.wrapping_neg()),
                (UnaryOp::Not, v) => Num::I((v.f() == 0.0) as i64),
                (UnaryOp::Invert, Num::I(i)) => Num::I(!i),
                (UnaryOp::Abs, Num::I(i)) => Num::I(i.wrapping_abs()),
                (op, v) => {
                    let x = v.f();
                    Num::F(match op {
                        UnaryOp::Neg => -x,
                        UnaryOp::Exp => x.exp(),
                        UnaryOp::Exp2 => x.exp2(),
                        UnaryOp::Log => x.ln(),
                        UnaryOp::Log2 => x.log2(),
                        UnaryOp::Sqrt => x.sqrt(),
                        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
                        UnaryOp::Abs => x.abs(),
                        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
                        UnaryOp::Tanh => x.tanh(),
                        UnaryOp::Erf => cpu::erf64(x),
                        // Integer-only ops, taken above; the checker admits no float operand.
                        UnaryOp::Not | UnaryOp::Invert => x,
                    })
                }
            }
        }
        ScalarExpr::Binary(op, a, b) => {
            let (a, b) = (scalar(a, env, params)?, scalar(b, env, params)?);
            match (a, b) {
                (Num::I(x), Num::I(y)) if *op != BinaryOp::Div => {
                    if matches!(op, BinaryOp::FloorDiv | BinaryOp::Mod) && y == 0 {
                        return Err(ExecError::new("E0704", "integer division by zero")
                            .with_help("a launch argument divides by a zero size or parameter"));
                    }
                    Num::I(match op {
                        // Wrapping, as integer arithmetic on the device.
                        BinaryOp::Add => x.wrapping_add(y),
                        BinaryOp::Sub => x.wrapping_sub(y),
                        BinaryOp::Mul => x.wrapping_mul(y),
                        BinaryOp::FloorDiv => {
                            x.wrapping_div_euclid(y)
                                - if y < 0 && x.wrapping_rem_euclid(y) != 0 {
                                    1
                                } else {
                                    0
                                }
                        }
                        BinaryOp::Mod => (x.wrapping_rem(y)).wrapping_add(y).wrapping_rem(y),
                        BinaryOp::Pow => x.wrapping_pow(y.clamp(0, u32::MAX as i64) as u32),
                        BinaryOp::Max => x.max(y),
                        BinaryOp::Min => x.min(y),
                        BinaryOp::And => x & y,
                        BinaryOp::Or => x | y,
                        BinaryOp::Xor => x ^ y,
                        BinaryOp::Eq => (x == y) as i64,
                        BinaryOp::Ne => (x != y) as i64,
                        BinaryOp::Lt => (x < y) as i64,
                        BinaryOp::Le => (x <= y) as i64,
                        BinaryOp::Gt => (x > y) as i64,
                        BinaryOp::Ge => (x >= y) as i64,
                        BinaryOp::Div => unreachable!(),
                    })
                }
                (a, b) => {
                    let (x, y) = (a.f(), b.f());
                    let t = |c: bool| Num::I(c as i64);
                    match op {
                        BinaryOp::Add => Num::F(x + y),
                        BinaryOp::Sub => Num::F(x - y),
                        BinaryOp::Mul => Num::F(x * y),
                        BinaryOp::Div => Num::F(x / y),
                        BinaryOp::FloorDiv => Num::F((x / y).floor()),
                        BinaryOp::Mod => Num::F(x - y * (x / y).floor()),
                        BinaryOp::Pow => Num::F(x.powf(y)),
                        BinaryOp::Max => Num::F(x.max(y)),
                        BinaryOp::Min => Num::F(x.min(y)),
                        BinaryOp::And => t(x != 0.0 && y != 0.0),
                        BinaryOp::Or => t(x != 0.0 || y != 0.0),
                        BinaryOp::Xor => t((x != 0.0) != (y != 0.0)),
                        BinaryOp::Eq => t(x == y),
                        BinaryOp::Ne => t(x != y),
                        BinaryOp::Lt => t(x < y),
                        BinaryOp::Le => t(x <= y),
                        BinaryOp::Gt => t(x > y),
                        BinaryOp::Ge => t(x >= y),
                    }
                }
            }
        }
        ScalarExpr::Cast(x, d) => {
            let v = scalar(x, env, params)?;
            match v {
                _ if d.is_float() => Num::F(super::round_to(*d, v.f())),
                Num::I(i) => Num::I(super::tensor::wrap_int(*d, i)),
                Num::F(x) => Num::I(super::tensor::float_to_int(*d, x)),
            }
        }
        ScalarExpr::Var(v) => *params.get(&format!("${v}")).ok_or_else(|| {
            ExecError::new(
                "E0710",
                format!("host variable `${v}` is read before it is set"),
            )
            .with_help(COMPILER_BUG)
        })?,
        ScalarExpr::CDiv(x, k) => {
            let v = scalar(x, env, params)?;
            match v {
                Num::I(i) => Num::I((i + k - 1).div_euclid(*k)),
                Num::F(f) => Num::F((f / *k as f64).ceil()),
            }
        }
    })
}

fn to_value(n: Num) -> Value {
    match n {
        Num::I(i) => Value::Int(i),
        Num::F(x) => Value::Float(x),
    }
}

fn run_schedule(
    db: &Database,
    file: SourceFile,
    s: &Schedule,
    env: &BTreeMap<String, i64>,
    params: &[Value],
    scalars: &HashMap<String, Num>,
    on: On,
) -> Result<Value, ExecError> {
    let On {
        device,
        interrupt,
        spmd,
    } = on;
    // Base buffers first, then views of them.
    let mut mem: Vec<Option<Tensor>> = vec![None; s.buffers.len()];
    for (i, b) in s.buffers.iter().enumerate() {
        let shape = dims_of(&b.dims, env)?;
        mem[i] = match &b.kind {
            BufKind::Input(p) => match params.get(*p) {
                Some(Value::Tensor(t)) => Some(t.view(&shape).ok_or_else(|| {
                    ExecError::new(
                        "E0701",
                        format!(
                            "input `{}` has shape {:?}, expected {shape:?}",
                            b.name,
                            t.shape()
                        ),
                    )
                    .with_help(format!("pass a tensor of shape {shape:?} for `{}`", b.name))
                })?),
                _ => {
                    return Err(ExecError::new(
                        "E0707",
                        format!("input `{}` must be a tensor", b.name),
                    )
                    .with_help(format!("pass a tensor for `{}`", b.name)))
                }
            },
            BufKind::View(_) => None,
            BufKind::Output(_) | BufKind::Temp => Some(device.zeros(&shape, b.dtype, interrupt)?),
        };
    }
    let mut scalars = scalars.clone();
    let ctx = Ctx {
        db,
        file,
        s,
        env,
        mem: &mem,
        device,
        interrupt,
        spmd,
        running: Default::default(),
    };
    let ran = run_steps(&ctx, &s.steps, &mut scalars);
    // The outputs are read after this: every collective joined (also
    // after an error, so that no buffer is reused while one runs).
    let joined = ctx.join_running(None);
    ran?;
    joined?;
    let outs = s
        .outputs
        .iter()
        .zip(&s.scalar_outputs)
        .map(|(o, &scalar)| {
            let shape = dims_of(&s.buffer(*o).dims, env)?;
            let t = view(&ctx, *o, &shape)?;
            if !scalar {
                return Ok(Value::Tensor(t));
            }
            // Integers are read as integers: an i64 result above 2^53 would
            // lose its low bits through f64.
            Ok(match (t.dtype(), t.int_at(0)) {
                (DType::Bool, Some(b)) => Value::Bool(b != 0),
                (_, Some(i)) => Value::Int(i),
                (_, None) => Value::Float(t.to_f64_vec()[0]),
            })
        })
        .collect::<Result<Vec<_>, ExecError>>()?;
    Ok(match outs.len() {
        // A function that returns nothing (it launched kernels for their
        // stores) gives None, as in Python.
        0 => Value::None,
        1 => outs.into_iter().next().unwrap(),
        _ => Value::Tuple(outs),
    })
}

/// Where a schedule's kernels run, the flag that stops them, and the group
/// of devices it runs with (if any).
#[derive(Clone, Copy)]
pub struct On<'a> {
    pub device: &'a Device,
    pub interrupt: &'a Interrupt,
    pub spmd: Option<&'a Member>,
}

/// Runs `schedule`, a plan lowered by the caller (one device's part of a
/// distributed call: `exec::dist::infer::localize`), on `params` in its
/// parameter order, with its dims bound by `dims`.
pub fn run_schedule_on(
    db: &Database,
    file: SourceFile,
    schedule: &Schedule,
    dims: &BTreeMap<String, i64>,
    params: &[Value],
    on: On,
) -> Result<Value, ExecError> {
    run_schedule(db, file, schedule, dims, params, &HashMap::new(), on)
}

/// What the steps of one schedule run share.
struct Ctx<'a> {
    db: &'a Database,
    file: SourceFile,
    s: &'a Schedule,
    env: &'a BTreeMap<String, i64>,
    mem: &'a [Option<Tensor>],
    device: &'a Device,
    interrupt: &'a Interrupt,
    spmd: Option<&'a Member>,
    /// Collectives still running on the GPUs, with the base buffers they
    /// read (input) and write (output): joined before the first step that
    /// writes the input or touches the output (or any step but a launch),
    /// so that the launches between run while they do.
    running: std::cell::RefCell<Vec<(RankPending, Touches)>>,
}

/// The base buffers a running collective reads and writes.
struct Touches {
    input: BufId,
    output: BufId,
}

impl Ctx<'_> {
    /// Joins the running collectives that conflict with a launch passing
    /// `passed` and writing `written` (base buffers; `None`: every
    /// collective).
    fn join_running(&self, launch: Option<(&[BufId], &[BufId])>) -> Result<(), ExecError> {
        let mut running = self.running.borrow_mut();
        let mut first_error = None;
        let mut i = 0;
        while i < running.len() {
            let t = &running[i].1;
            let hit = launch.is_none_or(|(passed, written)| {
                passed.contains(&t.output) || written.contains(&t.input)
            });
            if hit {
                let (p, _) = running.swap_remove(i);
                if let Err(e) = p.join() {
                    first_error.get_or_insert(e);
                }
            } else {
                i += 1;
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The base buffers a launch passes.
    fn launch_buffers(&self, l: &Launch) -> Vec<BufId> {
        l.args
            .iter()
            .filter_map(|(_, a)| match a {
                Arg::Buffer { buf, .. } => Some(self.s.base(*buf)),
                Arg::Scalar(_) => None,
            })
            .collect()
    }
}

/// The tensor of buffer `buf` (its base's memory) seen with `shape`.
fn view(ctx: &Ctx, buf: crate::ir::schedule::BufId, shape: &[usize]) -> Result<Tensor, ExecError> {
    let s = ctx.s;
    let base = ctx.mem[s.base(buf).0 as usize]
        .as_ref()
        .expect("a base buffer is allocated");
    base.view(shape).ok_or_else(|| {
        ExecError::new(
            "E0701",
            format!(
                "buffer `{}` of {} elements viewed as {shape:?}",
                s.buffer(buf).name,
                base.numel()
            ),
        )
        .with_help(
            "the arguments' shapes disagree with the shapes the function declares; check them against its signature",
        )
    })
}

/// Runs steps in order; host variables live in `scalars` as `$name`.
fn run_steps(
    ctx: &Ctx,
    steps: &[Step],
    scalars: &mut HashMap<String, Num>,
) -> Result<(), ExecError> {
    let (db, file, s, env, interrupt) = (ctx.db, ctx.file, ctx.s, ctx.env, ctx.interrupt);
    for step in steps {
        interrupt.check()?;
        // A launch waits only for the collectives whose output it passes or
        // whose input it writes; every other step for all of them.
        match step {
            Step::Launch(l) => {
                let written: Vec<BufId> = l.writes.iter().map(|b| ctx.s.base(*b)).collect();
                ctx.join_running(Some((&ctx.launch_buffers(l), &written)))?
            }
            _ => ctx.join_running(None)?,
        }
        let l = match step {
            Step::Launch(l) => l,
            Step::HostRandn { buf, seed, .. } => {
                let seed = match scalar(seed, env, scalars)? {
                    Num::I(i) => i as u64,
                    Num::F(x) => x as i64 as u64,
                };
                let t = view(ctx, *buf, &dims_of(&s.buffer(*buf).dims, env)?)?;
                t.assign(
                    &rng::try_randn(t.shape(), t.dtype(), seed, interrupt)?,
                    interrupt,
                )?;
                continue;
            }
            Step::HostData { buf, values, .. } => {
                let t = view(ctx, *buf, &dims_of(&s.buffer(*buf).dims, env)?)?;
                let data: Vec<f64> = values
                    .iter()
                    .map(|c| match c {
                        Constant::Int(i) => *i as f64,
                        Constant::Float(x) => *x,
                        Constant::Bool(b) => *b as i64 as f64,
                    })
                    .collect();
                if data.len() != t.numel() {
                    return Err(ExecError::new(
                        "E0701",
                        format!(
                            "a tensor literal of {} values fills a buffer of {} elements",
                            data.len(),
                            t.numel()
                        ),
                    )
                    .with_help("a tensor literal needs as many values as its shape has elements"));
                }
                // Integer literals into an integer buffer exactly (an i64
                // above 2^53 does not survive f64).
                let ints: Option<Vec<i64>> = values
                    .iter()
                    .map(|c| match c {
                        Constant::Int(i) => Some(*i),
                        _ => None,
                    })
                    .collect();
                let value = match ints {
                    Some(is) if t.dtype().is_int() => {
                        Tensor::try_from_ints(t.shape(), t.dtype(), &is, interrupt)?
                    }
                    _ => Tensor::try_from_f64(t.shape(), t.dtype(), &data, interrupt)?,
                };
                t.assign(&value, interrupt)?;
                continue;
            }
            Step::Call {
                func, args, out, ..
            } => {
                // A call that is not inlined (recursion): the callee's own schedule.
                let mut named = Vec::new();
                for (name, a) in args {
                    named.push((
                        name.clone(),
                        match a {
                            Arg::Buffer { buf, dims } => {
                                Value::Tensor(view(ctx, *buf, &dims_of(dims, env)?)?)
                            }
                            Arg::Scalar(e) => to_value(scalar(e, env, scalars)?),
                        },
                    ));
                }
                let result = run_function_in(
                    db,
                    file,
                    func,
                    (&[], &named),
                    ctx.device,
                    interrupt,
                    ctx.spmd,
                )?;
                let Value::Tensor(r) = result else {
                    return Err(ExecError::new(
                        "E0710",
                        format!("the call of `{func}` does not give one tensor"),
                    )
                    .with_help(format!("make `{func}` return one tensor")));
                };
                let t = view(ctx, *out, r.shape())?;
                if t.dtype() != r.dtype() {
                    return Err(ExecError::new(
                        "E0702",
                        format!("`{func}` returned {}, expected {}", r.dtype(), t.dtype()),
                    )
                    .with_help(format!(
                        "convert the result in `{func}`: `return x.to({})`",
                        t.dtype()
                    )));
                }
                t.assign(&r, interrupt)?;
                continue;
            }
            Step::Collective {
                op, input, output, ..
            } => {
                let src = view(ctx, *input, &dims_of(&s.buffer(*input).dims, env)?)?;
                let dst = view(ctx, *output, &dims_of(&s.buffer(*output).dims, env)?)?;
                match ctx.spmd {
                    // Its own piece of a whole tensor: no other device needed.
                    Some(m) if matches!(op, Collective::Shard { .. }) => {
                        let Collective::Shard { axis } = *op else {
                            unreachable!("matched")
                        };
                        let sizes = super::dist::split_sizes(src.shape()[axis], m.group.size())?;
                        let start = sizes[..m.rank].iter().sum();
                        dst.assign(
                            &src.narrow(axis, start, sizes[m.rank], interrupt)?,
                            interrupt,
                        )?;
                    }
                    Some(m) => {
                        // On GPUs, NCCL writes the output buffer in place and
                        // runs on while the next launches that do not pass
                        // its buffers do.
                        let into = matches!(ctx.device, Device::Cuda(_)).then_some(&dst);
                        match m
                            .group
                            .collective_into(m.rank, *op, &src, into, ctx.device, interrupt)?
                        {
                            Done::Running(p) => ctx.running.borrow_mut().push((
                                p,
                                Touches {
                                    input: s.base(*input),
                                    output: s.base(*output),
                                },
                            )),
                            Done::Ready(mine) => {
                                if !dst.assign_on_device(&mine)? {
                                    dst.assign(&mine, interrupt)?;
                                }
                            }
                        }
                    }
                    None => dst.assign(&src, interrupt)?,
                }
                continue;
            }
            Step::SetVar { var, value } => {
                let v = scalar(value, env, scalars)?;
                scalars.insert(format!("${var}"), v);
                continue;
            }
            Step::If {
                cond,
                then,
                otherwise,
            } => {
                let c = scalar(cond, env, scalars)?.f() != 0.0;
                run_steps(ctx, if c { then } else { otherwise }, scalars)?;
                continue;
            }
            Step::For {
                var,
                lo,
                hi,
                step,
                body,
            } => {
                let as_int =
                    |e: &ScalarExpr, scalars: &HashMap<String, Num>| -> Result<i64, ExecError> {
                        Ok(match scalar(e, env, scalars)? {
                            Num::I(i) => i,
                            Num::F(x) => x as i64,
                        })
                    };
                let (mut i, h, st) = (
                    as_int(lo, scalars)?,
                    as_int(hi, scalars)?,
                    as_int(step, scalars)?,
                );
                if st == 0 {
                    return Err(ExecError::new("E0703", "`range` step is zero")
                        .with_help("a loop step must be non-zero"));
                }
                while (st > 0 && i < h) || (st < 0 && i > h) {
                    ctx.interrupt.check()?;
                    scalars.insert(format!("${var}"), Num::I(i));
                    run_steps(ctx, body, scalars)?;
                    i += st;
                }
                continue;
            }
            Step::While { cond, test, body } => {
                loop {
                    ctx.interrupt.check()?;
                    run_steps(ctx, cond, scalars)?;
                    if scalar(test, env, scalars)?.f() == 0.0 {
                        break;
                    }
                    run_steps(ctx, body, scalars)?;
                }
                continue;
            }
        };
        for r in &l.requires {
            check_requirement(r, env)?;
        }
        let grid = match &l.grid {
            Some(g) => Some(
                g.iter()
                    .map(|e| Ok(scalar(e, env, scalars)?.f() as i64))
                    .collect::<Result<Vec<i64>, ExecError>>()?,
            ),
            None => None,
        };
        let mut args: Vec<(String, Value)> = Vec::new();
        for (name, a) in &l.args {
            args.push((
                name.clone(),
                match a {
                    Arg::Buffer { buf, dims } => {
                        Value::Tensor(view(ctx, *buf, &dims_of(dims, env)?)?)
                    }
                    Arg::Scalar(e) => to_value(scalar(e, env, scalars)?),
                },
            ));
        }
        match &l.kernel {
            KernelRef::Generated(ki) => {
                let k = &s.kernels[*ki];
                let by: HashMap<&str, &Value> = args.iter().map(|(n, v)| (n.as_str(), v)).collect();
                let kargs = k
                    .params
                    .iter()
                    .map(|p| match (by.get(p.name.as_str()), &p.kind) {
                        (Some(Value::Tensor(t)), ParamKind::Tensor { .. }) => {
                            Ok(cpu::Arg::Tensor(t.clone()))
                        }
                        (Some(Value::Int(i)), ParamKind::Scalar(_)) => Ok(cpu::Arg::Int(*i)),
                        (Some(Value::Float(x)), ParamKind::Scalar(_)) => Ok(cpu::Arg::Float(*x)),
                        _ => Err(ExecError::new(
                            "E0710",
                            format!("launch of `{}`: no argument for `{}`", k.name, p.name),
                        )
                        .with_help(COMPILER_BUG)),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let g = grid.ok_or_else(|| {
                    ExecError::new(
                        "E0710",
                        format!("generated kernel `{}` has no grid", k.name),
                    )
                    .with_help(COMPILER_BUG)
                })?;
                let g3 = [
                    g[0],
                    g.get(1).copied().unwrap_or(1),
                    g.get(2).copied().unwrap_or(1),
                ];
                ctx.device.run_grid(k, &kargs, g3, interrupt)?;
            }
            KernelRef::Std { .. } | KernelRef::User(_) => {
                let (kfile, item) = match &l.kernel {
                    KernelRef::Std { module, name } => {
                        let path: Vec<String> = module.split('.').map(str::to_string).collect();
                        let kfile = db.resolve_module(file, &path).ok_or_else(|| {
                            ExecError::new("E0710", format!("standard module `{module}` not found"))
                                .with_help(COMPILER_BUG)
                        })?;
                        let (item, _) = db::function_item(db, kfile, name).ok_or_else(|| {
                            ExecError::new("E0710", format!("`{module}.{name}` not found"))
                                .with_help(COMPILER_BUG)
                        })?;
                        (kfile, item)
                    }
                    KernelRef::User(name) => find_kernel(db, file, name)?,
                    KernelRef::Generated(_) => unreachable!("matched above"),
                };
                let on = On {
                    device: ctx.device,
                    interrupt,
                    spmd: ctx.spmd,
                };
                launch_std_or_user(db, kfile, item, grid, args, &l.consts, on)?;
            }
        }
    }
    Ok(())
}

/// A stdlib or user kernel launched from a schedule: arguments by name, the
/// launch's consts, the rest from the signature's defaults.
fn launch_std_or_user(
    db: &Database,
    kfile: SourceFile,
    item: db::ItemSource<'_>,
    grid: Option<Vec<i64>>,
    args: Vec<(String, Value)>,
    consts: &[(String, String)],
    on: On,
) -> Result<(), ExecError> {
    let mut named = args;
    for (n, v) in consts {
        let v = match v.as_str() {
            "True" => Value::Bool(true),
            "False" => Value::Bool(false),
            v => Value::Int(v.parse().map_err(|_| {
                ExecError::new("E0710", format!("const `{n}` = `{v}` is not an integer"))
                    .with_help(format!("give `{n}` an integer, `True` or `False`"))
            })?),
        };
        named.push((n.clone(), v));
    }
    let name = match db::parse_item(db, item).item.as_deref() {
        Some(crate::syntax::ast::Item::Function(f)) => f.name.name.clone(),
        _ => "kernel".to_string(),
    };
    launch_item(
        db,
        kfile,
        item,
        &name,
        grid,
        &[],
        &named,
        on.device,
        on.interrupt,
    )?;
    Ok(())
}

/// Checks a launch requirement on sizes (`N <= 1024`) that could not be
/// proven at compile time. Sides are sums of products of dims and integers.
fn check_requirement(r: &str, env: &BTreeMap<String, i64>) -> Result<(), ExecError> {
    let eval = |side: &str| -> Option<i64> {
        side.split('+')
            .map(|term| {
                term.split('*')
                    .map(|f| {
                        let f = f.trim();
                        f.parse::<i64>().ok().or_else(|| env.get(f).copied())
                    })
                    .try_fold(1i64, |acc, f| acc.checked_mul(f?))
            })
            // An overflowing side is one that cannot be checked (E0711).
            .try_fold(0i64, |acc, t| acc.checked_add(t?))
    };
    let unchecked = || {
        ExecError::new(
            "E0711",
            format!("the launch requires `{r}`, which cannot be checked"),
        )
        .with_help(
            "the sizes in the requirement overflow a 64-bit integer; launch with smaller tensors",
        )
    };
    // `nonempty max: N`: the reduced extent of a `max`, `min` or `mean`.
    if let Some((op, extent)) = r
        .strip_prefix("nonempty ")
        .and_then(|rest| rest.split_once(": "))
    {
        let n = eval(extent).ok_or_else(unchecked)?;
        return if n > 0 {
            Ok(())
        } else {
            let extent = extent.trim();
            let what = if extent.parse::<i64>().is_ok() {
                "an empty axis".to_string()
            } else {
                format!("an empty extent (`{extent}` = 0)")
            };
            Err(
                ExecError::new("E0317", format!("`{op}` of {what} has no value"))
                    .with_help("only `sum` of nothing is defined (0); reduce a non-empty axis"),
            )
        };
    }
    // Other requirements describe the target (`f32 inputs multiplied at tf32
    // precision`): the CPU executes the same Tile IR (it rounds to tf32 too).
    let Some((lhs, rhs)) = r.split_once("<=") else {
        return Ok(());
    };
    let (a, b) = (
        eval(lhs).ok_or_else(unchecked)?,
        eval(rhs).ok_or_else(unchecked)?,
    );
    if a <= b {
        Ok(())
    } else {
        Err(ExecError::new(
            "E0711",
            format!("the launch requires `{r}`, but `{}` = {a}", lhs.trim()),
        )
        .with_help("the stdlib kernel chosen for this op holds a whole row; a longer row is not supported by this function's schedule yet"))
    }
}
