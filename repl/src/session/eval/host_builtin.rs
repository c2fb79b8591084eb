//! The session builtins the host evaluates itself (`print`, `load_npy`,
//! `save_npy`, tensor creation, ...); the others go through a synthetic
//! function.

use tessera::check::builtins::{Builtin, Builtin as B};
use tessera::check::calls::out_of_range;
use tessera::check::stmt::int_fits;
use tessera::check::DType;
use tessera::diag::Diagnostic;
use tessera::exec::{self, Tensor, Value};
use tessera::syntax::ast::{Arg, Expr};

use super::super::Session;
use super::num::*;
use super::*;

impl Session {
    /// A builtin call in a top-level statement: the host evaluates the session
    /// builtins and tensor creation itself, the rest go through a synthetic
    /// function.
    pub(super) fn host_builtin(
        &mut self,
        id: Builtin,
        e: &Expr,
        args: &[Arg],
        text: &str,
    ) -> R<Val> {
        let name = id.name();
        // Creation fails without ending the session: a size that overflows
        // (E0712) or memory that cannot be had (E0713).
        let tensor = |t: Result<Tensor, exec::ExecError>| {
            t.map(|t| Val::Run(Value::Tensor(t)))
                .map_err(|err| err.to_diagnostic(e.span))
        };
        match id {
            B::Print => {
                let (mut parts, mut sep, mut end) = (Vec::new(), " ".to_string(), "\n".to_string());
                for a in args {
                    match a.name.as_ref().map(|n| n.name.as_str()) {
                        None => parts.push(self.eval(&a.value, text)?.to_string()),
                        Some(k @ ("sep" | "end")) => {
                            let v = match self.eval(&a.value, text)? {
                                Val::Str(v) => v,
                                other => {
                                    return Err(wrong_kind(
                                        a.value.span,
                                        format!(
                                            "`print`'s separators are strings, found {}",
                                            other.describe()
                                        ),
                                        "`print(x, y, sep=\", \", end=\"\\n\")`",
                                    ))
                                }
                            };
                            if k == "sep" {
                                sep = v;
                            } else {
                                end = v;
                            }
                        }
                        Some(other) => {
                            return Err(Diagnostic::new(
                                "E0205",
                                a.span,
                                format!("`print` has no keyword argument `{other}`"),
                            )
                            .with_primary_label("unknown keyword argument")
                            .with_help("`print(a, b, ..., sep=\" \", end=\"\\n\")`"))
                        }
                    }
                }
                self.pending_print.push(parts.join(&sep) + &end);
                Ok(Val::Run(Value::None))
            }
            B::AllReduce
            | B::Broadcast
            | B::Shard
            | B::Gather
            | B::AllGather
            | B::ReduceScatter => self.dist_builtin(name, e, args, text),
            B::Range => Err(unsupported(
                e.span,
                "`range` is only used by `for` loops in a session",
                "write `for i in range(n):`",
            )),
            B::Zeros | B::Ones | B::Empty | B::Randn => {
                let params: &[&str] = if id == B::Randn {
                    &["shape", "dtype", "seed"]
                } else {
                    &["shape", "dtype"]
                };
                let b = Self::bind(name, params, 1, args, e.span)?;
                let shape = self.shape_arg(b[0].expect("required"), text)?;
                let dtype = match b[1] {
                    Some(x) => self.dtype_arg(x, text)?,
                    None => DType::F32,
                };
                if id == B::Randn && !dtype.is_float() {
                    let at = b[1].map_or(e.span, |x| x.span);
                    return Err(Diagnostic::new(
                        "E0311",
                        at,
                        format!("`randn` makes floats; `{dtype}` is not a float dtype"),
                    )
                    .with_help("sample floats and convert: `randn(shape, f32).to(i32)`"));
                }
                match id {
                    // Made where the session's kernels run: on a GPU, zeros
                    // there (nothing to copy at the first launch).
                    B::Zeros | B::Empty => {
                        tensor(self.exec_device.zeros(&shape, dtype, &self.interrupt))
                    }
                    B::Ones => tensor(Tensor::try_full(&shape, dtype, 1.0, &self.interrupt)),
                    _ => {
                        let seed = match b.get(2).copied().flatten() {
                            Some(x) => self.int_arg(x, text, "a seed")?,
                            None => 0,
                        };
                        tensor(exec::rng::try_randn(
                            &shape,
                            dtype,
                            seed as u64,
                            &self.interrupt,
                        ))
                    }
                }
            }
            B::Full => {
                let b = Self::bind(name, &["shape", "value", "dtype"], 2, args, e.span)?;
                let shape = self.shape_arg(b[0].expect("required"), text)?;
                let vx = b[1].expect("required");
                let v = self.eval(vx, text)?;
                let value = num(&v).ok_or_else(|| {
                    wrong_kind(
                        vx.span,
                        format!("`full` fills with a number, found {}", v.describe()),
                        "`full([4, 8], 1.5, f32)`",
                    )
                })?;
                // As the checker (and the docs): `full`'s dtype defaults to f32.
                let dtype = match b[2] {
                    Some(x) => self.dtype_arg(x, text)?,
                    None => DType::F32,
                };
                if let Num::I(i) = value {
                    if dtype.is_int() && !int_fits(dtype, i) {
                        return Err(out_of_range(i, dtype, vx.span));
                    }
                }
                // As the checker: a float never fills an integer tensor implicitly.
                if matches!(value, Num::F(_)) && !dtype.is_float() {
                    return Err(Diagnostic::new(
                        "E0301",
                        vx.span,
                        format!(
                            "a `float` fill value for {} tensor",
                            tessera::diag::a_code(dtype)
                        ),
                    )
                    .with_help(format!(
                        "convert the value: `{}.to({dtype})`",
                        &text[vx.span.range()]
                    )));
                }
                tensor(Tensor::try_full(&shape, dtype, value.f(), &self.interrupt))
            }
            B::Arange => {
                let b = Self::bind(name, &["start", "end", "dtype"], 1, args, e.span)?;
                let first = self.int_arg(b[0].expect("required"), text, "`arange` bound")?;
                let (start, end) = match b[1] {
                    Some(x) => (first, self.int_arg(x, text, "`arange` bound")?),
                    None => (0, first),
                };
                let dtype = match b[2] {
                    Some(x) => self.dtype_arg(x, text)?,
                    None => DType::I32,
                };
                tensor(Tensor::try_arange(start, end, dtype, &self.interrupt))
            }
            B::Tensor => {
                let b = Self::bind(name, &["data", "dtype"], 1, args, e.span)?;
                let dx = b[0].expect("required");
                let data = self.eval(dx, text)?;
                let mut shape = Vec::new();
                let mut flat = Vec::new();
                let mut ints = Vec::new();
                let mut any_float = false;
                nested(&data, 0, &mut shape, &mut flat, &mut ints, &mut any_float).map_err(
                    |m| wrong_kind(dx.span, m, "`tensor([[1.0, 2.0], [3.0, 4.0]], f32)`"),
                )?;
                let dtype = match b[1] {
                    Some(x) => self.dtype_arg(x, text)?,
                    None if any_float => DType::F32,
                    None => DType::I32,
                };
                // As the checker: integers must be values of an integer dtype.
                if dtype.is_int() {
                    let outside = flat
                        .iter()
                        .find(|x| x.fract() == 0.0 && !int_fits(dtype, **x as i64));
                    if let Some(x) = outside {
                        return Err(out_of_range(*x as i64, dtype, dx.span));
                    }
                }
                if dtype.is_int() && !any_float {
                    // Exactly: an i64 above 2^53 does not survive f64.
                    return tensor(Tensor::try_from_ints(&shape, dtype, &ints, &self.interrupt));
                }
                tensor(Tensor::try_from_f64(&shape, dtype, &flat, &self.interrupt))
            }
            B::LoadNpy => {
                let b = Self::bind(name, &["path"], 1, args, e.span)?;
                let path = self.str_arg(b[0].expect("required"), text)?;
                exec::npy::load_npy(std::path::Path::new(&path), &self.interrupt)
                    .map(|t| Val::Run(Value::Tensor(t)))
                    .map_err(|err| err.to_diagnostic(e.span))
            }
            B::SaveNpy => {
                let b = Self::bind(name, &["tensor", "path"], 2, args, e.span)?;
                let tx = b[0].expect("required");
                let t = self.eval(tx, text)?;
                let Some(t) = t.tensor().cloned() else {
                    return Err(wrong_kind_of(
                        &t,
                        tx.span,
                        format!("`save_npy` saves a tensor, found {}", t.describe()),
                        "`save_npy(x, \"x.npy\")`",
                    ));
                };
                let path = self.str_arg(b[1].expect("required"), text)?;
                exec::npy::save_npy(&t, std::path::Path::new(&path), &self.interrupt)
                    .map(|_| Val::Run(Value::None))
                    .map_err(|err| err.to_diagnostic(e.span))
            }
            B::Len => {
                let b = Self::bind(name, &["x"], 1, args, e.span)?;
                let x = b[0].expect("required");
                match self.eval(x, text)? {
                    Val::Run(Value::Tensor(t)) if !t.shape().is_empty() => {
                        Ok(int(t.shape()[0] as i64))
                    }
                    Val::Run(Value::Tuple(v)) => Ok(int(v.len() as i64)),
                    Val::List(v) => Ok(int(v.len() as i64)),
                    Val::Str(s) => Ok(int(s.chars().count() as i64)),
                    other => Err(wrong_kind(
                        x.span,
                        format!(
                            "`len` takes a tensor of rank 1 or more, a tuple, a list or a string, found {}",
                            other.describe()
                        ),
                     "`len(x)` of a tensor is its first dim")),
                }
            }
            B::SetFloat32MatmulPrecision => {
                let b = Self::bind(name, &["precision"], 1, args, e.span)?;
                let px = b[0].expect("required");
                let p = self.str_arg(px, text)?;
                let tf32 = tessera::check::builtins::matmul_precision(&p).ok_or_else(|| {
                    Diagnostic::new(
                        "E0302",
                        px.span,
                        "the matmul precision is \"highest\" (full f32) or \"high\" (tf32)",
                    )
                    .with_help("`set_float32_matmul_precision(\"high\")` (PyTorch's \"medium\", bf16, is not offered)")
                })?;
                self.db.set_matmul_tf32(tf32);
                Ok(Val::Run(Value::None))
            }
            B::Cdiv => {
                let b = Self::bind(name, &["a", "b"], 2, args, e.span)?;
                let (ax, bx) = (b[0].expect("required"), b[1].expect("required"));
                let x = self.int_arg(ax, text, "`cdiv` operand")?;
                let y = self.int_arg(bx, text, "`cdiv` operand")?;
                if y == 0 {
                    // As for `//`: the checker folds a constant `cdiv` (E0315).
                    if self.is_constant(ax) && self.is_constant(bx) {
                        return Err(Diagnostic::new(
                            "E0315",
                            e.span,
                            format!(
                                "constant evaluation failed: division by zero in `cdiv({x}, {y})`"
                            ),
                        )
                        .with_help("the divisor of `cdiv(a, b)` must not be zero"));
                    }
                    return Err(division_by_zero(e.span));
                }
                Ok(int((x + y - 1).div_euclid(y)))
            }
            // Tensor computations: the checker types them, and a synthetic
            // whole-tensor function runs them on the device.
            B::ProgramId
            | B::NumPrograms
            | B::Load
            | B::Store
            | B::AtomicAdd
            | B::Dot
            | B::Min
            | B::Max
            | B::Sum
            | B::Mean
            | B::Exp
            | B::Exp2
            | B::Log
            | B::Log2
            | B::Sqrt
            | B::Rsqrt
            | B::Abs
            | B::Sigmoid
            | B::Tanh
            | B::Erf
            | B::Maximum
            | B::Minimum
            | B::Where
            | B::Matmul
            | B::Softmax
            | B::LayerNorm
            | B::RmsNorm
            | B::Relu
            | B::Gelu
            | B::Silu
            | B::Transpose
            | B::Reshape => self.synth_eval(e, text),
        }
    }

    fn str_arg(&mut self, x: &Expr, text: &str) -> R<String> {
        match self.eval(x, text)? {
            Val::Str(s) => Ok(s),
            other => Err(wrong_kind(
                x.span,
                format!("expected a string (a path), found {}", other.describe()),
                "write the path in quotes: `\"x.npy\"`",
            )),
        }
    }
}

fn nested(
    v: &Val,
    depth: usize,
    shape: &mut Vec<usize>,
    flat: &mut Vec<f64>,
    ints: &mut Vec<i64>,
    any_float: &mut bool,
) -> Result<(), String> {
    let items: Vec<Val> = match v {
        Val::List(items) => items.clone(),
        Val::Run(Value::Tuple(items)) => items.iter().cloned().map(Val::Run).collect(),
        other => {
            if depth < shape.len() {
                return Err("the nested lists of `tensor` are not rectangular".into());
            }
            return match num(other) {
                Some(Num::I(i)) => {
                    flat.push(i as f64);
                    ints.push(i);
                    Ok(())
                }
                Some(Num::F(x)) => {
                    *any_float = true;
                    flat.push(x);
                    Ok(())
                }
                None => Err(format!(
                    "`tensor` takes nested lists of numbers, found {}",
                    other.describe()
                )),
            };
        }
    };
    if depth == shape.len() {
        if !flat.is_empty() {
            return Err("the nested lists of `tensor` are not rectangular".into());
        }
        shape.push(items.len());
    } else if shape[depth] != items.len() {
        return Err("the nested lists of `tensor` are not rectangular".into());
    }
    for x in &items {
        nested(x, depth + 1, shape, flat, ints, any_float)?;
    }
    Ok(())
}
