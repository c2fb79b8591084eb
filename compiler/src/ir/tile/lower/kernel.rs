//! The kernel as a whole: autotune and specialised values, const parameters,
//! the parameter list with its dims and divisibility assumptions, the launch
//! options, then the body. Hoisted definitions (constants, tensor dims, scalar
//! parameters) go into the prologue at the top of the body, once each, so they
//! dominate every use.

use std::collections::HashMap;

use super::jumps::{contains_loop_return, flag, JumpTable, CONT, RET};
use super::reads::{Live, Reads};
use super::spec::Specialization;
use super::values::const_bits;
use super::{Lowerer, LV, R};
use crate::check::consts::eval_const;
use crate::check::dims::Dim as SymDim;
use crate::check::scope::{annotation, Annot};
use crate::check::{DType, Ty, Value as CValue};
use crate::diag::Diagnostic;
use crate::ir::tile::{Constant, Dim, Kernel, Op, OpKind, Param, ParamKind, Type, Value};
use crate::syntax::ast::{self, StmtKind};
use crate::syntax::span::Span;
use crate::target::{check_num_stages, check_num_warps};

impl<'a> Lowerer<'a> {
    /// E0513 when `name`, fixed to `value`, has an assumed divisor that does
    /// not divide it (`-D K=60 -D K%8`).
    fn check_divisor(&mut self, spec: &Specialization, name: &str, value: i64, span: Span) {
        let Some(&k) = spec.divisors.get(name) else {
            return;
        };
        if !self.divisors_checked.insert(name.to_string()) {
            return;
        }
        if value.rem_euclid(k as i64) != 0 {
            self.diags.push(
                Diagnostic::new(
                    "E0513",
                    span,
                    format!(
                        "`{name}` is {value} in kernel `{}`, which is not a multiple of {k} as `-D {name}%{k}` assumes",
                        self.f.name.name
                    ),
                )
                .with_help(format!(
                    "drop `-D {name}%{k}`, or give `{name}` a value that is a multiple of {k}"
                )),
            );
        }
    }

    pub(super) fn kernel(&mut self, spec: &Specialization) -> R<Kernel> {
        let f = self.f;
        let scope = self.scope;
        // Autotune: the space's first configuration for the target applies
        // unless specialised.
        let tuned: HashMap<String, i64> =
            crate::check::scope::autotune_default(f, &|n| scope.const_value(n), spec.arch)
                .into_iter()
                .filter_map(|(name, v)| Some((name, v.as_int()?)))
                .collect();
        let mut const_vals: HashMap<String, CValue> = HashMap::new();
        // Const parameters first: a tensor dim may name one (`Tensor["M", "BM", f32]`).
        let annots: Vec<(&ast::Param, Annot)> = f
            .params
            .iter()
            .map(|p| {
                let annot = match &p.ty {
                    Some(t) => annotation(t, &|n| scope.const_value(n), &mut Vec::new()),
                    None => Annot::Ty(Ty::Err),
                };
                (p, annot)
            })
            .collect();
        let (consts, others): (Vec<_>, Vec<_>) = annots
            .into_iter()
            .partition(|(_, a)| matches!(a, Annot::Const(_)));
        let ordered = consts.into_iter().chain(others);
        for (p, annot) in ordered {
            let name = &p.name.name;
            match annot {
                Annot::Const(dt) => {
                    let given = spec.get(name).or_else(|| tuned.get(name).copied());
                    let default = p.default.as_ref().and_then(|d| {
                        eval_const(d, &|n| {
                            const_vals.get(n).cloned().or_else(|| scope.const_value(n))
                        })
                        .ok()
                    });
                    let is_bool = dt == Some(DType::Bool)
                        || (dt.is_none() && matches!(default, Some(CValue::Bool(_))));
                    let value = match (given, default) {
                        _ if spec.float(name).is_some() => {
                            CValue::Float(spec.float(name).expect("checked"))
                        }
                        (Some(i), _) if is_bool => CValue::Bool(i != 0),
                        (Some(i), _) => CValue::int(i),
                        (None, Some(v)) => v,
                        (None, None) => {
                            self.diags.push(
                                Diagnostic::new(
                                    "E0511",
                                    p.name.span,
                                    format!(
                                        "kernel `{}` needs a value for const parameter `{name}`, which has no default",
                                        f.name.name
                                    ),
                                )
                                .with_help(format!(
                                    "give it when compiling, e.g. `tsrc emit ... -D {name}=VALUE`, or add a default"
                                )),
                            );
                            continue;
                        }
                    };
                    let (dtype, weak) = match (&value, dt) {
                        (_, Some(d)) => (d, true),
                        (CValue::Int(_), None) => (DType::I32, true),
                        (CValue::Float(_), None) => (DType::F32, true),
                        (CValue::Bool(_), None) => (DType::Bool, true),
                        _ => {
                            // A dtype or string const parameter.
                            const_vals.insert(name.clone(), value.clone());
                            let lv = match value {
                                CValue::DType(d) => LV::DType(d),
                                CValue::Str(s) => LV::Str(s),
                                _ => LV::NoneV,
                            };
                            self.env.insert(name.clone(), lv);
                            continue;
                        }
                    };
                    if let Some(i) = value.as_int() {
                        self.specialization.insert(name.clone(), i);
                        self.check_divisor(spec, name, i, p.name.span);
                    }
                    const_vals.insert(name.clone(), value.clone());
                    self.env.insert(
                        name.clone(),
                        LV::Const {
                            c: value,
                            dtype,
                            weak,
                        },
                    );
                }
                Annot::Ty(Ty::Tensor { dims, dtype }) => {
                    let idx = self.params.len();
                    let mut pdims = Vec::new();
                    for (axis, d) in dims.iter().enumerate() {
                        let pd = if let Some(c) = d.as_const() {
                            Dim::Static(c as u64)
                        } else if let Some(sym) = d.as_symbol() {
                            let given = spec
                                .get(sym)
                                .or_else(|| const_vals.get(sym).and_then(CValue::as_int));
                            match given {
                                Some(v) => {
                                    self.specialization.insert(sym.to_string(), v);
                                    self.check_divisor(spec, sym, v, p.name.span);
                                    Dim::Static(v as u64)
                                }
                                None => {
                                    if let Some(&k) = spec.divisors.get(sym) {
                                        self.divisibility.insert(sym.to_string(), k);
                                    }
                                    Dim::Dynamic(sym.to_string())
                                }
                            }
                        } else {
                            // An affine dim ("4*D"): specialised when all its symbols are.
                            let sub = d.substitute(&|s| {
                                spec.get(s)
                                    .or_else(|| const_vals.get(s).and_then(CValue::as_int))
                                    .map(SymDim::constant)
                            });
                            match sub.and_then(|x| x.as_const()) {
                                Some(v) => {
                                    for s in d.symbols() {
                                        if let Some(x) = spec
                                            .get(s)
                                            .or_else(|| const_vals.get(s).and_then(CValue::as_int))
                                        {
                                            self.specialization.insert(s.to_string(), x);
                                        }
                                    }
                                    Dim::Static(v as u64)
                                }
                                None => Dim::Dynamic(d.to_string()),
                            }
                        };
                        // Dim names are in scope as i32 scalars (first binding wins).
                        if let Some(sym) = d.as_symbol() {
                            if !self.env.contains_key(sym) {
                                let lv = match &pd {
                                    Dim::Static(v) => LV::Const {
                                        c: CValue::int(*v as i64),
                                        dtype: DType::I32,
                                        weak: false,
                                    },
                                    Dim::Dynamic(_) => LV::Val {
                                        v: self.tensor_dim(idx, axis),
                                        weak: false,
                                        sym: Some(SymDim::symbol(sym)),
                                    },
                                };
                                self.env.insert(sym.to_string(), lv);
                            }
                        }
                        pdims.push(pd);
                    }
                    self.params.push(Param {
                        name: name.clone(),
                        kind: ParamKind::Tensor { dims: pdims, dtype },
                    });
                    self.env.insert(name.clone(), LV::Tensor(idx));
                }
                Annot::Ty(Ty::Scalar { dtype, .. }) => {
                    let idx = self.params.len();
                    self.params.push(Param {
                        name: name.clone(),
                        kind: ParamKind::Scalar(dtype),
                    });
                    let v = self.scalar_param(idx, dtype);
                    if let (Some(&k), true) = (spec.divisors.get(name), dtype.is_int()) {
                        self.divisibility.insert(name.clone(), k);
                    }
                    let sym = dtype.is_int().then(|| SymDim::symbol(name.clone()));
                    self.env.insert(
                        name.clone(),
                        LV::Val {
                            v,
                            weak: false,
                            sym,
                        },
                    );
                }
                _ => {
                    self.internal(
                        p.name.span,
                        format!("parameter `{name}` has no usable type"),
                    );
                    return Err(());
                }
            }
        }
        if !self.diags.is_empty() {
            return Err(());
        }
        let mut num_warps = tuned.get("num_warps").copied().unwrap_or(4);
        let mut num_stages = tuned.get("num_stages").copied().unwrap_or(1);
        if let Some(Some(args)) = f.decorator("kernel").map(|d| &d.args) {
            for a in args {
                let which = a.name.as_ref().map(|n| n.name.as_str());
                if !matches!(which, Some("num_warps" | "num_stages")) {
                    continue;
                }
                let v = eval_const(&a.value, &|n| {
                    const_vals.get(n).cloned().or_else(|| scope.const_value(n))
                })
                .ok()
                .and_then(|v| v.as_int());
                let Some(v) = v else {
                    self.internal(a.value.span, "the option is not a constant");
                    return Err(());
                };
                match which {
                    Some("num_warps") if !tuned.contains_key("num_warps") => num_warps = v,
                    Some("num_stages") if !tuned.contains_key("num_stages") => num_stages = v,
                    _ => {}
                }
            }
        }
        for (k, v) in [
            ("num_warps", &mut num_warps),
            ("num_stages", &mut num_stages),
        ] {
            if let Some(x) = spec.get(k) {
                *v = x;
            }
        }
        // Whichever way they came (decorator, autotune space, `-D`, a session
        // or an editor's defines), the options are checked here, where they
        // become the kernel's: the layouts divide by `num_warps`.
        let bad_warps = check_num_warps(num_warps).err().map(|m| ("E0607", m));
        let bad_stages = check_num_stages(num_stages).err().map(|m| ("E0608", m));
        if let Some((code, message)) = bad_warps.or(bad_stages) {
            self.diags.push(
                Diagnostic::new(
                    code,
                    f.name.span,
                    format!("kernel `{}`: {message}", f.name.name),
                )
                .with_help(if code == "E0607" {
                    crate::check::kernel::NUM_WARPS_HELP
                } else {
                    crate::check::kernel::NUM_STAGES_HELP
                }),
            );
            return Err(());
        }
        // A final bare `return` ends the kernel as falling off its end does.
        let body = match f.body.split_last() {
            Some((last, init)) if matches!(last.kind, StmtKind::Return(None)) => init,
            _ => &f.body[..],
        };
        self.jumps = JumpTable::new(body);
        if contains_loop_return(body) {
            // `if row >= M: return` guards the rest of the kernel; a `return`
            // in a loop breaks out of every loop and sets `returned`.
            self.env.insert(CONT.to_string(), flag(true));
            self.env.insert(RET.to_string(), flag(false));
        }
        self.reads = Reads::new(body);
        self.block(body, &Live::NONE)?;
        let b = std::mem::take(&mut self.b);
        let (body, types) = b.finish();
        let mut k = Kernel {
            name: f.name.name.clone(),
            specialization: self.specialization.clone().into_iter().collect(),
            divisibility: self.divisibility.clone().into_iter().collect(),
            divisibility_trusted: spec.trusted && !self.divisibility.is_empty(),
            params: std::mem::take(&mut self.params),
            num_warps: num_warps as u32,
            num_stages: num_stages as u32,
            body,
            types,
        };
        k.remove_dead_code();
        k.fuse_dot_accumulators();
        k.specialise_masks();
        k.order_programs();
        k.remove_dead_code();
        k.renumber();
        Ok(k)
    }

    // ---- hoisted definitions ----

    fn hoist(&mut self, kind: OpKind, ty: Type) -> Value {
        let v = self.b.value(ty);
        self.b.insert_entry(
            self.prologue,
            Op {
                results: vec![v],
                kind,
                span: Span::default(),
            },
        );
        self.prologue += 1;
        v
    }

    pub(super) fn tensor_dim(&mut self, param: usize, axis: usize) -> Value {
        if let Some(v) = self.dims.get(&(param, axis)) {
            return *v;
        }
        let v = self.hoist(OpKind::TensorDim { param, axis }, Type::Scalar(DType::I32));
        self.dims.insert((param, axis), v);
        v
    }

    fn scalar_param(&mut self, idx: usize, dtype: DType) -> Value {
        if let Some(v) = self.scalar_params.get(&idx) {
            return *v;
        }
        let v = self.hoist(OpKind::ScalarParam(idx), Type::Scalar(dtype));
        self.scalar_params.insert(idx, v);
        v
    }

    pub(super) fn constant(&mut self, c: Constant, dtype: DType) -> Value {
        let key = (dtype, const_bits(c));
        if let Some(v) = self.consts.get(&key) {
            return *v;
        }
        let v = self.hoist(OpKind::Const(c), Type::Scalar(dtype));
        self.consts.insert(key, v);
        v
    }

    /// A compile-time value as a constant of `dtype`.
    pub(super) fn const_of(&mut self, c: &CValue, dtype: DType, span: Span) -> R<Value> {
        let k = match (c, dtype) {
            (CValue::Bool(b), DType::Bool) => Constant::Bool(*b),
            (CValue::Bool(b), d) if d.is_int() => Constant::Int(*b as i64),
            (CValue::Bool(b), d) if d.is_float() => Constant::Float(*b as i64 as f64),
            (CValue::Int(_), DType::Bool) => Constant::Bool(c.as_int() != Some(0)),
            (CValue::Int(_), d) if d.is_int() => match c.as_int() {
                Some(i) => Constant::Int(i),
                None => {
                    self.internal(span, format!("`{c}` is not a constant"));
                    return Err(());
                }
            },
            (CValue::Int(_), _) => match c.as_int() {
                Some(i) => Constant::Float(i as f64),
                None => {
                    self.internal(span, format!("`{c}` is not a constant"));
                    return Err(());
                }
            },
            (CValue::Float(x), d) if d.is_float() => Constant::Float(*x),
            (CValue::Float(x), d) if d.is_int() => Constant::Int(*x as i64),
            (CValue::Float(x), _) => Constant::Bool(*x != 0.0),
            _ => {
                self.internal(span, format!("`{c}` is not a number"));
                return Err(());
            }
        };
        Ok(self.constant(k, dtype))
    }
}
