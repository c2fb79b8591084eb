//! Calls: kernel launches with their grids and arguments, argument binding,
//! and the dtype and shape arguments of builtins.

use tessera::check::builtins::Builtin;
use tessera::check::scope::Entry;
use tessera::check::DType;
use tessera::diag::{with_article, Diagnostic};
use tessera::exec::{self, Value};
use tessera::syntax::ast::{Arg, Expr, ExprKind, Index};
use tessera::syntax::span::Span;

use super::super::Session;
use super::num::*;
use super::*;

impl Session {
    pub(super) fn call(&mut self, e: &Expr, func: &Expr, args: &[Arg], text: &str) -> R<Val> {
        // `k[grid](...)`: a launch with an explicit grid.
        if let ExprKind::Subscript { value, indices } = &func.kind {
            if let ExprKind::Name(id) = &value.kind {
                if let Some(kernel) = self.kernel_named(&id.name) {
                    let mut grid = Vec::new();
                    for i in indices {
                        let Index::Expr(x) = i else {
                            return Err(wrong_kind(
                                i.span(),
                                "a grid is a tuple of integers",
                                "launch as `k[(cdiv(N, 128),)](...)`",
                            ));
                        };
                        match self.eval(x, text)? {
                            Val::Run(Value::Int(n)) => grid.push(n),
                            Val::Run(Value::Tuple(vs)) => {
                                for v in vs {
                                    match v {
                                        Value::Int(n) => grid.push(n),
                                        other => {
                                            return Err(wrong_kind(
                                                x.span,
                                                format!(
                                                    "a grid dim must be an integer, found {}",
                                                    other.describe()
                                                ),
                                                "launch as `k[(cdiv(N, 128),)](...)`",
                                            ))
                                        }
                                    }
                                }
                            }
                            other => {
                                return Err(wrong_kind(
                                    x.span,
                                    format!(
                                        "a grid is a tuple of integers, found {}",
                                        other.describe()
                                    ),
                                    "launch as `k[(cdiv(N, 128),)](...)`",
                                ))
                            }
                        }
                    }
                    return self.launch(&kernel, Some(grid), args, text, e.span);
                }
            }
        }
        if let ExprKind::Attribute { value, attr } = &func.kind {
            if attr.name == "to" {
                let v = self.eval(value, text)?;
                if let Some(n) = num(&v) {
                    let [a] = args else {
                        return Err(Diagnostic::new("E0304", e.span, "`.to` takes one dtype")
                            .with_help("e.g. `x.to(f32)`"));
                    };
                    let d = self.dtype_arg(&a.value, text)?;
                    return Ok(cast_scalar(n, d));
                }
                let Some(t) = v.tensor().cloned() else {
                    return Err(wrong_kind_of(
                        &v,
                        value.span,
                        format!("`.to` converts a tensor, not a {}", v.describe()),
                        "`x.to(f16)` converts a tensor `x`",
                    ));
                };
                let [a] = args else {
                    return Err(Diagnostic::new("E0304", e.span, "`.to` takes one dtype")
                        .with_help("e.g. `x.to(f32)`"));
                };
                if let ExprKind::Str(place) = &a.value.kind {
                    return self.move_tensor(t, place, a.value.span);
                }
                let d = self.dtype_arg(&a.value, text)?;
                return t
                    .try_to(d, &self.interrupt)
                    .map(|t| Val::Run(Value::Tensor(t)))
                    .map_err(|err| err.to_diagnostic(e.span));
            }
            return self.synth_eval(e, text);
        }
        let ExprKind::Name(id) = &func.kind else {
            return self.synth_eval(e, text);
        };
        let name = id.name.as_str();
        if self.vars.contains_key(name) {
            return Err(Diagnostic::new(
                "E0309",
                func.span,
                format!(
                    "`{name}` is {}, not a function",
                    with_article(&self.vars[name].describe())
                ),
            )
            .with_help(
                format!("use `{name}` without `(...)`, or rename it if it hides a function of the same name"),
            ));
        }
        if let Some(kernel) = self.kernel_named(name) {
            return self.launch(&kernel, None, args, text, e.span);
        }
        let user_defined = self.defs.iter().any(|d| d.names.iter().any(|n| n == name));
        match Builtin::from_name(name) {
            Some(id) if !user_defined => self.host_builtin(id, e, args, text),
            _ => self.synth_eval(e, text),
        }
    }

    /// The kernel `name` launches in the session: one defined in it, or one
    /// imported into it (`from std.linalg import gemm_tf32 as mm` launches
    /// `gemm_tf32`).
    fn kernel_named(&self, name: &str) -> Option<String> {
        match tessera::db::module_scope(&self.db, self.file).get(name) {
            Some(Entry::Function(sig)) if sig.is_kernel => Some(sig.name.clone()),
            _ => None,
        }
    }

    fn launch(
        &mut self,
        name: &str,
        grid: Option<Vec<i64>>,
        args: &[Arg],
        text: &str,
        span: Span,
    ) -> R<Val> {
        let mut positional = Vec::new();
        let mut named = Vec::new();
        for a in args {
            let v = self.eval(&a.value, text)?;
            // A dtype or a string, also inside a list, is no run-time value.
            let Some(value) = v.to_value() else {
                return Err(wrong_kind_of(
                    &v,
                    a.value.span,
                    format!(
                        "a kernel argument cannot be {}",
                        with_article(&v.describe())
                    ),
                    "pass tensors, numbers or bools",
                ));
            };
            match &a.name {
                Some(n) => named.push((n.name.clone(), value)),
                None => positional.push(value),
            }
        }
        let device =
            self.device_for(positional.iter().chain(named.iter().map(|(_, v)| v)), span)?;
        let spec = exec::launch_kernel(
            &self.db,
            self.file,
            name,
            grid,
            &positional,
            &named,
            &device,
            &self.interrupt,
        )
        .map_err(|e| {
            let extra = e.arg.and_then(|i| {
                let mut positional = args.iter().filter(|a| a.name.is_none());
                let first = positional.nth(i)?.value.span;
                // the first argument too many to the last
                Some(
                    positional
                        .next_back()
                        .map_or(first, |l| first.to(l.value.span)),
                )
            });
            let at = e
                .param
                .as_deref()
                .and_then(|p| self.argument_span(name, p, args))
                .or(extra)
                .unwrap_or(span);
            e.to_diagnostic(at)
        })?;
        self.last_launch.insert(name.to_string(), spec);
        Ok(Val::Run(Value::None))
    }

    /// The span of the argument that kernel `kernel`'s parameter `param` got:
    /// the keyword argument of that name, else the positional one in its place.
    fn argument_span(&self, kernel: &str, param: &str, args: &[Arg]) -> Option<Span> {
        if let Some(a) = args
            .iter()
            .find(|a| a.name.as_ref().is_some_and(|n| n.name == param))
        {
            return Some(a.value.span);
        }
        let sig = match tessera::db::module_scope(&self.db, self.file).get(kernel) {
            Some(Entry::Function(sig)) => sig.clone(),
            _ => return None,
        };
        let index = sig.params.iter().position(|p| p.name == param)?;
        args.iter()
            .filter(|a| a.name.is_none())
            .nth(index)
            .map(|a| a.value.span)
    }

    /// `x.to("cuda")`, `x.to("cpu")`: where `x`'s elements live (every alias
    /// of `x` moves with it; the value is `x` itself).
    fn move_tensor(&mut self, t: Tensor, place: &str, span: Span) -> R<Val> {
        use tessera::check::builtins::{place_named, Place};
        match place_named(place) {
            Some(Place::Cpu) => t.to_host(),
            Some(Place::Cuda(ordinal)) => {
                let gpu = self.gpu_for_move(ordinal, span)?;
                gpu.to_device(&t).map_err(|err| err.to_diagnostic(span))?;
            }
            None => {
                return Err(Diagnostic::new(
                    "E0312",
                    span,
                    format!("`.to()` takes a dtype or a device, found \"{place}\""),
                )
                .with_help(
                    "devices are \"cpu\", \"cuda\" (GPU 0) and \"cuda:N\" (GPU N; `:devices` lists them): `x.to(\"cuda:1\")`",
                ));
            }
        }
        Ok(Val::Run(Value::Tensor(t)))
    }

    pub(super) fn dtype_arg(&mut self, x: &Expr, text: &str) -> R<DType> {
        match self.eval(x, text)? {
            Val::DType(d) => Ok(d),
            other => Err(wrong_kind(
                x.span,
                format!(
                    "expected a dtype (`f32`, `f16`, ...), found {}",
                    other.describe()
                ),
                "name a dtype: `f32`, `f16`, `bf16`, `i32`, ...",
            )),
        }
    }

    pub(super) fn shape_arg(&mut self, x: &Expr, text: &str) -> R<Vec<usize>> {
        let v = self.eval(x, text)?;
        let items: Vec<Val> = match v {
            Val::List(items) => items,
            Val::Run(Value::Tuple(items)) => items.into_iter().map(Val::Run).collect(),
            Val::Run(Value::Int(n)) => vec![int(n)],
            other => {
                return Err(wrong_kind(
                    x.span,
                    format!("a shape is a list of integers, found {}", other.describe()),
                    "`zeros([4, 8], f32)`",
                ))
            }
        };
        items
            .iter()
            .map(|v| match v {
                Val::Run(Value::Int(n)) if *n >= 0 => Ok(*n as usize),
                other => Err(wrong_kind(
                    x.span,
                    format!("a shape holds sizes ≥ 0, found {other}"),
                    "`zeros([4, 8], f32)`",
                )),
            })
            .collect()
    }

    /// Binds `args` to the parameter names `params` (the first `required` are
    /// required).
    pub(in crate::session) fn bind<'a>(
        name: &str,
        params: &[&str],
        required: usize,
        args: &'a [Arg],
        span: Span,
    ) -> R<Vec<Option<&'a Expr>>> {
        let mut bound: Vec<Option<&Expr>> = vec![None; params.len()];
        let mut next = 0;
        for a in args {
            let i = match &a.name {
                Some(n) => params.iter().position(|p| *p == n.name).ok_or_else(|| {
                    Diagnostic::new(
                        "E0205",
                        n.span,
                        format!("`{name}` has no parameter `{}`", n.name),
                    )
                    .with_help(format!("its parameters: {}", params.join(", ")))
                })?,
                None => {
                    let i = next;
                    next += 1;
                    i
                }
            };
            if i >= params.len() {
                return Err(Diagnostic::new(
                    "E0304",
                    span,
                    format!("`{name}` takes at most {} arguments", params.len()),
                )
                .with_help(format!("`{name}` takes ({})", params.join(", "))));
            }
            if bound[i].is_some() {
                return Err(Diagnostic::new(
                    "E0206",
                    a.span,
                    format!("`{}` is given twice", params[i]),
                )
                .with_help(format!(
                    "give `{}` once: remove this argument or the first one",
                    params[i]
                )));
            }
            bound[i] = Some(&a.value);
        }
        if let Some(missing) = (0..required).find(|i| bound[*i].is_none()) {
            return Err(Diagnostic::new(
                "E0304",
                span,
                format!("`{name}` needs `{}`", params[missing]),
            )
            .with_help(format!("`{name}({})`", params.join(", "))));
        }
        Ok(bound)
    }
}
