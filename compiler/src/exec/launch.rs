//! Kernel launches: binding a kernel's signature to run-time values (dims,
//! dtypes, const and scalar parameters), specialising, evaluating the grid and
//! running the Tile IR on the CPU.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::cpu;
use super::{Device, ExecError, Interrupt, Value};
use crate::check::consts::eval_const;
use crate::check::scope::Entry;
use crate::check::{self, Ty};
use crate::db::{self, Database, Db, ItemSource, SourceFile};
use crate::ir::tile::{Kernel, Specialization};
use crate::syntax::ast;
use crate::target::Arch;

/// Launches kernel `kernel` of `file` (or of a `std` module the file can
/// import) on `args` (positional, in signature order, const parameters
/// included) and `named`; `grid` overrides the decorator's, on `device`.
/// Tensor arguments are written in place. Returns what the launch was given
/// to specialise the kernel (with an autotuned kernel's chosen
/// configuration), so a caller can show the variant that ran.
// A launch as a caller has it: what, where, with which arguments, on which
// device, stoppable.
#[allow(clippy::too_many_arguments)]
pub fn launch_kernel(
    db: &Database,
    file: SourceFile,
    kernel: &str,
    grid: Option<Vec<i64>>,
    args: &[Value],
    named: &[(String, Value)],
    device: &Device,
    interrupt: &Interrupt,
) -> Result<LaunchSpec, ExecError> {
    let (kfile, item) = find_kernel(db, file, kernel)?;
    launch_item(
        db, kfile, item, kernel, grid, args, named, device, interrupt,
    )
}

/// [`launch_kernel`] of the kernel `item` of `kfile` (named `kernel`): an
/// `@autotune` kernel is tuned on a GPU, whoever launches it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_item(
    db: &Database,
    kfile: SourceFile,
    item: ItemSource<'_>,
    kernel: &str,
    grid: Option<Vec<i64>>,
    args: &[Value],
    named: &[(String, Value)],
    device: &Device,
    interrupt: &Interrupt,
) -> Result<LaunchSpec, ExecError> {
    let sig = signature(db, item, kernel)?;
    let parsed = db::parse_item(db, item);
    if let Some(ast::Item::Function(f)) = parsed.item.as_deref() {
        if f.decorator("autotune").is_some() {
            // The parameters the caller gave are not tuned; the others take
            // the space's first configuration, unless a GPU tunes them.
            let explicit: std::collections::BTreeSet<String> = sig
                .params
                .iter()
                .take(args.len())
                .map(|p| p.name.clone())
                .chain(named.iter().map(|(n, _)| n.clone()))
                .collect();
            let first: BTreeMap<String, i64> =
                super::autotune::configurations(f, db, kfile, &explicit, None)
                    .swap_remove(0)
                    .into_iter()
                    .collect();
            let mut with_first = named.to_vec();
            for p in &sig.params {
                if let (true, Some(v)) = (p.is_const, first.get(&p.name)) {
                    with_first.push((p.name.clone(), Value::Int(*v)));
                }
            }
            let values = match_args(&sig, args, &with_first)?;
            interrupt.check()?;
            let (tuned, ran_on): (BTreeMap<String, i64>, _) = if let Device::Cuda(gpu) = device {
                let config = super::autotune::launch(
                    db, kfile, item, f, grid, &values, &explicit, gpu, interrupt,
                )?;
                (config.into_iter().collect(), Some(gpu.info().arch))
            } else {
                let (kernel, args, grid) = prepare(db, kfile, item, grid, &values, &first, None)?;
                device.run_grid(&kernel, &args, grid, interrupt)?;
                (first, None)
            };
            let mut spec = launch_spec_of(&sig, &values, &tuned)?;
            // Every const the caller left out took its value from the space
            // (or the parameter's default, which the space may override).
            spec.tuned = sig
                .params
                .iter()
                .filter(|p| p.is_const && !explicit.contains(&p.name))
                .map(|p| p.name.clone())
                .chain(tuned.into_keys())
                .collect();
            spec.ran_on = ran_on;
            return Ok(spec);
        }
    }
    let values = match_args(&sig, args, named)?;
    launch_bound(db, kfile, item, grid, &values, device, interrupt)?;
    launch_spec_of(&sig, &values, &BTreeMap::new())
}

/// What a launch of a kernel was given to specialise it: its const
/// parameters and the dims of its tensor arguments. Cheap to take at every
/// launch; [`compiled_specialization`] turns it into what the launch compiled.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaunchSpec {
    pub consts: Specialization,
    pub dims: BTreeMap<String, i64>,
    /// The integer scalar arguments (not const), for [`run_time_facts`].
    pub scalars: BTreeMap<String, i64>,
    /// Of an `@autotune` kernel, the consts among `consts` (and
    /// `num_warps`/`num_stages`) the caller left to its tuning space: the
    /// configuration chosen for `ran_on`, which another arch's space may
    /// not have.
    pub tuned: BTreeSet<String>,
    /// The arch the launch compiled for: its GPU's; `None` on the CPU, which
    /// takes a space's first configuration.
    pub ran_on: Option<Arch>,
}

impl LaunchSpec {
    /// The launch as it would compile for `arch`: where it ran for another
    /// arch (or on the CPU), without the values its tuning space chose
    /// there, so that `arch` takes the first configuration its space tries
    /// on it, as an untuned launch there would. Also returns whether values
    /// were left out.
    pub fn for_arch(&self, arch: Arch) -> (LaunchSpec, bool) {
        if self.tuned.is_empty() || self.ran_on == Some(arch) {
            return (self.clone(), false);
        }
        let mut spec = self.clone();
        spec.consts.values.retain(|k, _| !self.tuned.contains(k));
        spec.tuned.clear();
        spec.ran_on = Some(arch);
        (spec, true)
    }
}

/// The largest run-time divisor a launch assumes (`-D K%16`): 16 elements
/// are 32 bytes of f16, past any vector access's alignment need.
pub const MAX_ASSUMED_DIVISOR: u64 = 16;

/// What a launch's run-time values tell the compiler, as Triton specialises
/// its launches: every run-time dim and integer scalar is assumed divisible
/// by the largest power of two (up to [`MAX_ASSUMED_DIVISOR`]) that divides
/// it, and a dim that is 1 is fixed to 1. The compiled variant relies on
/// them (vector accesses, no per-element bounds checks where a whole tile is
/// in bounds), so they are part of its key; a later launch with other
/// values gets its own variant. Tensor base pointers need no fact: every
/// tensor is a whole allocation (256-byte aligned on a GPU).
pub fn run_time_facts(
    dims: &BTreeMap<String, i64>,
    scalars: &BTreeMap<String, i64>,
    spec: &mut Specialization,
) {
    let divisor = |v: i64| -> u64 {
        if v == 0 {
            MAX_ASSUMED_DIVISOR
        } else {
            (1u64 << v.unsigned_abs().trailing_zeros().min(63)).min(MAX_ASSUMED_DIVISOR)
        }
    };
    for (name, &v) in dims {
        if spec.values.contains_key(name) {
            continue;
        }
        if v == 1 {
            spec.values.insert(name.clone(), 1);
        } else if divisor(v) > 1 {
            spec.divisors.insert(name.clone(), divisor(v));
        }
    }
    for (name, &v) in scalars {
        if !dims.contains_key(name) && divisor(v) > 1 {
            spec.divisors.insert(name.clone(), divisor(v));
        }
    }
    // Facts of the values this launch passes: the kernel need not check them.
    spec.trusted = !spec.divisors.is_empty();
}

/// The non-const integer scalar arguments of a launch.
fn int_scalars(sig: &check::FnSig, values: &[(String, Value)]) -> BTreeMap<String, i64> {
    sig.params
        .iter()
        .zip(values)
        .filter(|(p, _)| !p.is_const && p.ty.dtype().is_some_and(|d| d.is_int()))
        .filter_map(|(p, (_, v))| match v {
            Value::Int(i) => Some((p.name.clone(), *i)),
            _ => None,
        })
        .collect()
}

/// The [`LaunchSpec`] of a launch of `kernel` with these arguments (the
/// untuned variant of an `@autotune` kernel: see [`launch_kernel`]).
pub fn launch_specialization(
    db: &Database,
    file: SourceFile,
    kernel: &str,
    args: &[Value],
    named: &[(String, Value)],
) -> Result<LaunchSpec, ExecError> {
    let (_, item) = find_kernel(db, file, kernel)?;
    let sig = signature(db, item, kernel)?;
    let values = match_args(&sig, args, named)?;
    launch_spec_of(&sig, &values, &BTreeMap::new())
}

/// The [`LaunchSpec`] of matched arguments, with `tune`'s values (an
/// autotune configuration) among the consts.
fn launch_spec_of(
    sig: &check::FnSig,
    values: &[(String, Value)],
    tune: &BTreeMap<String, i64>,
) -> Result<LaunchSpec, ExecError> {
    let dims = bind_dims(sig, values)?;
    let mut spec = Specialization::new();
    for (p, (_, v)) in sig.params.iter().zip(values) {
        if p.is_const {
            match v {
                Value::Int(i) => {
                    spec.values.insert(p.name.clone(), *i);
                }
                Value::Bool(b) => {
                    spec.values.insert(p.name.clone(), *b as i64);
                }
                Value::Float(x) => {
                    spec.floats.insert(p.name.clone(), x.to_bits());
                }
                _ => {}
            }
        }
    }
    for (name, v) in tune {
        spec.values.insert(name.clone(), *v);
    }
    let scalars = int_scalars(sig, values);
    Ok(LaunchSpec {
        consts: spec,
        dims,
        scalars,
        tuned: BTreeSet::new(),
        ran_on: None,
    })
}

/// The specialization a launch with `launch` compiled `kernel` for, as the
/// launch itself picks it: the const parameters, only the dims its tile
/// shapes need (`flash_attn` gets `D`, and keeps `S`, `B`, `H` run-time
/// values), and the [`run_time_facts`] of the rest.
pub fn compiled_specialization(
    db: &Database,
    file: SourceFile,
    kernel: &str,
    launch: &LaunchSpec,
) -> Result<Specialization, ExecError> {
    let (_, item) = find_kernel(db, file, kernel)?;
    let parsed = db::parse_item(db, item);
    let Some(ast::Item::Function(f)) = parsed.item.as_deref() else {
        return Err(ExecError::new("E0707", "not a kernel").with_help(format!(
            "`{kernel}` is not a `@kernel`: call it instead of launching it"
        )));
    };
    let mut spec = launch.consts.clone();
    run_time_facts(&launch.dims, &launch.scalars, &mut spec);
    let k = specialise(db, item, f, spec, &launch.dims)?;
    Ok(Specialization::of_launch(&k, &launch.consts))
}

/// The file and item defining kernel `name`: `file` itself first, then the
/// standard library modules.
pub(crate) fn find_kernel<'db>(
    db: &'db Database,
    file: SourceFile,
    name: &str,
) -> Result<(SourceFile, ItemSource<'db>), ExecError> {
    if let Some((_, item, _)) = db::file_kernels(db, file)
        .into_iter()
        .find(|(n, _, _)| n == name)
    {
        return Ok((file, item));
    }
    for m in crate::stdlib::modules() {
        let path: Vec<String> = m.split('.').map(str::to_string).collect();
        if let Some(f) = db.resolve_module(file, &path) {
            if let Some((_, item, _)) = db::file_kernels(db, f)
                .into_iter()
                .find(|(n, _, _)| n == name)
            {
                return Ok((f, item));
            }
        }
    }
    Err(ExecError::new("E0707", format!("no kernel named `{name}`"))
        .with_help("define it with `@kernel` or import it from the standard library"))
}

pub(crate) fn signature(
    db: &Database,
    item: ItemSource<'_>,
    name: &str,
) -> Result<Arc<check::FnSig>, ExecError> {
    db::item_signature(db, item).clone().ok_or_else(|| {
        ExecError::new("E0709", format!("`{name}` has errors and cannot run"))
            .with_help("fix the errors reported for its definition first")
    })
}

/// The help line of an argument error: the signature, on one line.
fn signature_help(sig: &check::FnSig) -> String {
    format!("the signature is `{}`", sig.one_line())
}

/// The value of every parameter, in signature order (defaults filled in).
pub(crate) fn match_args(
    sig: &check::FnSig,
    args: &[Value],
    named: &[(String, Value)],
) -> Result<Vec<(String, Value)>, ExecError> {
    if args.len() > sig.params.len() {
        return Err(ExecError::new(
            "E0707",
            format!(
                "`{}` takes {} arguments, {} given",
                sig.name,
                sig.params.len(),
                args.len()
            ),
        )
        .with_help(signature_help(sig))
        .at_arg(sig.params.len()));
    }
    let mut out: Vec<Option<Value>> = vec![None; sig.params.len()];
    for (i, a) in args.iter().enumerate() {
        out[i] = Some(a.clone());
    }
    for (n, v) in named {
        let Some(i) = sig.params.iter().position(|p| &p.name == n) else {
            return Err(
                ExecError::new("E0707", format!("`{}` has no parameter `{n}`", sig.name))
                    .with_help(signature_help(sig))
                    .at_param(n),
            );
        };
        if out[i].is_some() {
            return Err(ExecError::new(
                "E0707",
                format!("parameter `{n}` of `{}` is given twice", sig.name),
            )
            .at_param(n)
            .with_help(format!("give `{n}` once")));
        }
        out[i] = Some(v.clone());
    }
    sig.params
        .iter()
        .zip(out)
        .map(|(p, v)| {
            let v = match v {
                Some(v) => v,
                None => match &p.default {
                    Some(d) => from_const(d).ok_or_else(|| {
                        ExecError::new(
                            "E0707",
                            format!("the default of `{}` cannot be used at run time", p.name),
                        )
                        .with_help(format!("pass `{}` explicitly", p.name))
                    })?,
                    None => {
                        return Err(ExecError::new(
                            "E0707",
                            format!("missing argument `{}` of `{}`", p.name, sig.name),
                        )
                        .with_help(signature_help(sig)))
                    }
                },
            };
            Ok((p.name.clone(), v))
        })
        .collect()
}

pub(crate) fn from_const(v: &check::Value) -> Option<Value> {
    Some(match v {
        check::Value::Int(d) => Value::Int(d.as_const()?),
        check::Value::Float(x) => Value::Float(*x),
        check::Value::Bool(b) => Value::Bool(*b),
        check::Value::None => Value::None,
        check::Value::Tuple(v) => Value::Tuple(v.iter().map(from_const).collect::<Option<_>>()?),
        _ => return None,
    })
}

fn to_const(v: &Value) -> Option<check::Value> {
    Some(match v {
        Value::Int(i) => check::Value::int(*i),
        Value::Float(x) => check::Value::Float(*x),
        Value::Bool(b) => check::Value::Bool(*b),
        Value::None => check::Value::None,
        Value::Tuple(v) => check::Value::Tuple(v.iter().map(to_const).collect::<Option<_>>()?),
        Value::Tensor(_) => return None,
    })
}

/// Binds tensor dims against a signature: every symbol gets one value, literal
/// and composite dims must match. Errors name the parameter, the dim and both
/// values.
pub(crate) fn bind_dims(
    sig: &check::FnSig,
    values: &[(String, Value)],
) -> Result<BTreeMap<String, i64>, ExecError> {
    let mut dims = BTreeMap::new();
    let mut later = Vec::new();
    for (p, (_, v)) in sig.params.iter().zip(values) {
        match (&p.ty, v) {
            (Ty::Tensor { dims: pd, dtype }, Value::Tensor(t)) => {
                if t.dtype() != *dtype {
                    return Err(ExecError::new(
                        "E0702",
                        format!(
                            "argument `{}` of `{}` must be {dtype}, got {}",
                            p.name,
                            sig.name,
                            crate::diag::with_article(&format!("{} tensor", t.dtype()))
                        ),
                    )
                    .with_help(format!("convert it with `.to({dtype})`"))
                    .at_param(&p.name));
                }
                if pd.len() != t.shape().len() {
                    return Err(ExecError::new(
                        "E0701",
                        format!(
                            "argument `{}` of `{}` must have {} dims, got shape {:?}",
                            p.name,
                            sig.name,
                            pd.len(),
                            t.shape()
                        ),
                    )
                    .with_help(signature_help(sig))
                    .at_param(&p.name));
                }
                for (axis, (d, &n)) in pd.iter().zip(t.shape()).enumerate() {
                    let n = n as i64;
                    if let Some(c) = d.as_const() {
                        if c != n {
                            return Err(dim_error(sig, &p.name, axis, &d.to_string(), c, n));
                        }
                    } else if let Some(s) = d.as_symbol() {
                        match dims.get(s) {
                            Some(&prev) if prev != n => {
                                return Err(dim_error(sig, &p.name, axis, s, prev, n))
                            }
                            _ => {
                                dims.insert(s.to_string(), n);
                            }
                        }
                    } else {
                        later.push((p.name.clone(), axis, d.clone(), n));
                    }
                }
            }
            (Ty::Tensor { .. }, other) => {
                return Err(ExecError::new(
                    "E0707",
                    format!(
                        "argument `{}` of `{}` must be a tensor, got {}",
                        p.name,
                        sig.name,
                        other.describe()
                    ),
                )
                .at_param(&p.name)
                .with_help(format!("pass a tensor for `{}`, e.g. `tensor([...])`", p.name)))
            }
            (Ty::Scalar { .. }, Value::Tensor(t)) => {
                return Err(ExecError::new(
                    "E0707",
                    format!(
                        "argument `{}` of `{}` must be a scalar, got {}",
                        p.name,
                        sig.name,
                        Value::Tensor(t.clone()).describe()
                    ),
                )
                .at_param(&p.name)
                .with_help(
                    format!("pass one number for `{}`; read one element of a tensor by indexing it, e.g. `t[0]`", p.name),
                ))
            }
            _ => {}
        }
    }
    for (name, axis, d, n) in later {
        let want = d
            .substitute(&|s| dims.get(s).map(|v| check::dims::Dim::constant(*v)))
            .and_then(|d| d.as_const());
        if let Some(w) = want {
            if w != n {
                return Err(dim_error(sig, &name, axis, &d.to_string(), w, n));
            }
        }
    }
    Ok(dims)
}

fn dim_error(
    sig: &check::FnSig,
    param: &str,
    axis: usize,
    dim: &str,
    want: i64,
    got: i64,
) -> ExecError {
    ExecError::new(
        "E0701",
        format!(
            "argument `{param}` of `{}`: dim {axis} (`{dim}`) is {got}, but `{dim}` = {want}",
            sig.name
        ),
    )
    .with_help(signature_help(sig))
    .at_param(param)
}

/// Launches a kernel item with its parameters' values (signature order).
pub(crate) fn launch_bound(
    db: &Database,
    kfile: SourceFile,
    item: ItemSource<'_>,
    grid: Option<Vec<i64>>,
    values: &[(String, Value)],
    device: &Device,
    interrupt: &Interrupt,
) -> Result<(), ExecError> {
    interrupt.check()?;
    let (kernel, args, grid) = prepare(db, kfile, item, grid, values, &BTreeMap::new(), None)?;
    device.run_grid(&kernel, &args, grid, interrupt)
}

/// A kernel of `file` (or the stdlib) specialised for `args` with its
/// decorator grid and run-time arguments, to be run by `cpu` tests.
#[cfg(test)]
pub(crate) fn prepared(db: &Database, file: SourceFile, kernel: &str, args: &[Value]) -> Prepared {
    let (kfile, item) = find_kernel(db, file, kernel).unwrap();
    let sig = signature(db, item, kernel).unwrap();
    let values = match_args(&sig, args, &[]).unwrap();
    prepare(db, kfile, item, None, &values, &BTreeMap::new(), None).unwrap()
}

/// A specialised kernel, its run-time arguments and its grid.
pub(crate) type Prepared = (Arc<Kernel>, Vec<cpu::Arg>, [i64; 3]);

/// The specialised kernel, its run-time arguments and its grid; `tune`
/// gives values of const parameters, `num_warps` and `num_stages` that
/// replace the launch's (an autotune configuration). `arch`: the GPU's,
/// where the kernel runs on one: an `@autotune` space's values that `tune`
/// and the launch leave open come from its first configuration tried there
/// (without it, from the session's arch: the CPU's choice).
pub(crate) fn prepare(
    db: &Database,
    kfile: SourceFile,
    item: ItemSource<'_>,
    grid: Option<Vec<i64>>,
    values: &[(String, Value)],
    tune: &BTreeMap<String, i64>,
    arch: Option<crate::target::Arch>,
) -> Result<Prepared, ExecError> {
    let parsed = db::parse_item(db, item);
    let Some(ast::Item::Function(f)) = parsed.item.as_deref() else {
        return Err(ExecError::new("E0707", "not a kernel")
            .with_help("launch a `@kernel` function; call other functions directly"));
    };
    let sig = signature(db, item, &f.name.name)?;
    let dims = bind_dims(&sig, values)?;
    let mut spec = Specialization::new();
    spec.arch = arch;
    let mut lookup: BTreeMap<String, check::Value> = dims
        .iter()
        .map(|(k, v)| (k.clone(), check::Value::int(*v)))
        .collect();
    for (p, (_, v)) in sig.params.iter().zip(values) {
        if p.is_const {
            match (v, &p.default) {
                (Value::Int(i), _) => {
                    spec.values.insert(p.name.clone(), *i);
                }
                (Value::Bool(b), _) => {
                    spec.values.insert(p.name.clone(), *b as i64);
                }
                // A float for an integer (or bool) const would change the
                // kernel's shapes and loop bounds into floats: refuse it here.
                (Value::Float(_), default)
                    if p.ty.dtype().is_some_and(|d| !d.is_float())
                        || (p.ty.is_err()
                            && matches!(
                                default,
                                Some(check::Value::Int(_) | check::Value::Bool(_))
                            )) =>
                {
                    return Err(ExecError::new(
                        "E0707",
                        format!(
                            "const parameter `{}` of `{}` is an integer, got a float",
                            p.name, sig.name
                        ),
                    )
                    .with_help(format!("pass an integer, e.g. `{}=128`", p.name))
                    .at_param(&p.name))
                }
                (Value::Float(x), _) => {
                    spec.floats.insert(p.name.clone(), x.to_bits());
                }
                (other, _) => {
                    return Err(ExecError::new(
                        "E0707",
                        format!(
                            "const parameter `{}` of `{}` must be an int, float or bool, got {}",
                            p.name,
                            sig.name,
                            other.describe()
                        ),
                    )
                    .at_param(&p.name)
                    .with_help(format!("pass a number, `True` or `False` for `{}`", p.name)))
                }
            }
        }
        if let Some(c) = to_const(v) {
            lookup.insert(p.name.clone(), c);
        }
    }
    for (name, v) in tune {
        spec.values.insert(name.clone(), *v);
        lookup.insert(name.clone(), check::Value::int(*v));
    }
    run_time_facts(&dims, &int_scalars(&sig, values), &mut spec);
    let kernel = specialise(db, item, f, spec, &dims)?;
    let grid = match grid {
        Some(g) => g,
        None => decorator_grid(db, kfile, f, &lookup)?,
    };
    if grid.is_empty() || grid.len() > 3 {
        return Err(ExecError::new(
            "E0703",
            format!("a grid has 1 to 3 dims, got {}", grid.len()),
        )
        .with_help("give a grid of 1 to 3 sizes, e.g. `k[(cdiv(N, BLOCK),)](...)`"));
    }
    let g3 = [
        grid[0],
        grid.get(1).copied().unwrap_or(1),
        grid.get(2).copied().unwrap_or(1),
    ];
    let by_name: BTreeMap<&str, &Value> = values.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let args = kernel
        .params
        .iter()
        .map(|p| {
            Ok(match by_name.get(p.name.as_str()) {
                Some(Value::Tensor(t)) => cpu::Arg::Tensor(t.clone()),
                Some(Value::Int(i)) => cpu::Arg::Int(*i),
                Some(Value::Bool(b)) => cpu::Arg::Int(*b as i64),
                Some(Value::Float(x)) => cpu::Arg::Float(*x),
                Some(other) => {
                    return Err(ExecError::new(
                        "E0707",
                        format!(
                            "argument `{}` of `{}` cannot be {}",
                            p.name,
                            sig.name,
                            other.describe()
                        ),
                    )
                    .at_param(&p.name)
                    .with_help(format!("pass a tensor or a number for `{}`", p.name)))
                }
                None => {
                    return Err(ExecError::new(
                        "E0707",
                        format!("missing argument `{}` of `{}`", p.name, sig.name),
                    )
                    .with_help(signature_help(&sig)))
                }
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((kernel, args, g3))
}

/// The Tile IR of a kernel specialised on `spec` and on the dims its tile
/// shapes need (taken from `dims`), through the database's cache.
fn specialise(
    db: &Database,
    item: ItemSource<'_>,
    f: &ast::Function,
    spec: Specialization,
    dims: &BTreeMap<String, i64>,
) -> Result<Arc<Kernel>, ExecError> {
    let opts = db.options();
    let compile_error = |diags: &[crate::diag::Diagnostic]| {
        let first = diags.first();
        ExecError::new(
            "E0709",
            format!(
                "kernel `{}` cannot be compiled for this launch: {}",
                f.name.name,
                first.map_or("it has errors".to_string(), |d| format!(
                    "[{}] {}",
                    d.code, d.message
                ))
            ),
        )
        .with_help(
            first
                .and_then(|d| d.help.clone())
                .unwrap_or_else(|| "see `tsrc check` for the kernel's diagnostics".into()),
        )
    };
    db::launch_tile_ir(db, item, opts, spec, dims.clone())
        .clone()
        .map_err(|d| compile_error(&d))
}

/// Evaluates `@kernel(grid=...)` with the launch's dims, consts and scalars.
fn decorator_grid(
    db: &Database,
    kfile: SourceFile,
    f: &ast::Function,
    lookup: &BTreeMap<String, check::Value>,
) -> Result<Vec<i64>, ExecError> {
    let no_grid = || {
        ExecError::new("E0703", format!("kernel `{}` has no grid", f.name.name))
            .with_help("give one in the decorator, `@kernel(grid=(...))`, or at the launch")
    };
    let deco = f.decorator("kernel").ok_or_else(no_grid)?;
    let arg = deco
        .args
        .iter()
        .flatten()
        .find(|a| a.name.as_ref().is_some_and(|n| n.name == "grid"))
        .ok_or_else(no_grid)?;
    let scope = db::module_scope(db, kfile);
    let look = |n: &str| -> Option<check::Value> {
        lookup.get(n).cloned().or_else(|| match scope.get(n) {
            Some(Entry::Const { value, .. }) => value.clone(),
            _ => None,
        })
    };
    let v = eval_const(&arg.value, &look).map_err(|e| {
        ExecError::new(
            "E0703",
            format!("the grid of `{}` cannot be evaluated: {e:?}", f.name.name),
        )
        .with_help(
            "write the grid from integers, the kernel's dims and its `const` parameters, e.g. `grid=(cdiv(N, BLOCK),)`",
        )
    })?;
    let as_int = |v: &check::Value| {
        v.as_int().ok_or_else(|| {
            ExecError::new(
                "E0703",
                format!("the grid of `{}` is not made of integers", f.name.name),
            )
            .with_help(
                "write the grid from integers, the kernel's dims and its `const` parameters, e.g. `grid=(cdiv(N, BLOCK),)`",
            )
        })
    };
    match &v {
        check::Value::Tuple(items) => items.iter().map(as_int).collect(),
        other => Ok(vec![as_int(other)?]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::DType;
    use crate::exec::Tensor;

    /// A tuned kernel launched on the CPU takes its space's first
    /// configuration; asked about sm_90a, whose first configuration differs
    /// (`gemm_tf32`: BN = 128 over four stages), the launch gives way to
    /// that one, and on the arch it ran for it is kept.
    #[test]
    fn a_tuned_launch_gives_way_to_another_archs_configuration() {
        let mut db = Database::new();
        let file = db.set_source("/t.tsr", "from std.linalg import gemm_tf32\n".into());
        let t = |r, c| Value::Tensor(Tensor::zeros(&[r, c], DType::F32));
        let args = [t(40, 24), t(24, 8), t(40, 8)];
        let launch = launch_kernel(
            &db,
            file,
            "gemm_tf32",
            None,
            &args,
            &[],
            &Device::Cpu,
            &Interrupt::new(),
        )
        .unwrap();
        assert_eq!(launch.ran_on, None);
        assert!(launch.tuned.contains("BN"));
        let bn = |db: &Database, launch: &LaunchSpec| {
            compiled_specialization(db, file, "gemm_tf32", launch)
                .unwrap()
                .values["BN"]
        };
        assert_eq!(bn(&db, &launch), 64);
        let (sm90a, moved) = launch.for_arch(Arch::Sm90a);
        assert!(moved && !sm90a.consts.values.contains_key("BN"));
        db.set_arch(Arch::Sm90a);
        assert_eq!(bn(&db, &sm90a), 128);
        // Ran for sm_90a: kept as it ran.
        let ran = LaunchSpec {
            ran_on: Some(Arch::Sm90a),
            ..launch.clone()
        };
        assert_eq!(ran.for_arch(Arch::Sm90a), (ran.clone(), false));
        // Nothing tuned (the caller gave every const): nothing to give way.
        let given = LaunchSpec {
            tuned: BTreeSet::new(),
            ..launch
        };
        assert!(!given.for_arch(Arch::Sm90a).1);
    }
}
