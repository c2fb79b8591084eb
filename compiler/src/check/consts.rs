//! Compile-time evaluation: folding of operators and of `cdiv`/`min`/`max` on
//! values (ints may be symbolic, see `dims`), and a small evaluator for module
//! `const`s and parameter defaults.

use super::builtins::Builtin;
use super::dims::Dim;
use super::types::{DType, Value};
use crate::syntax::ast::{BinOp, Expr, ExprKind, UnaryOp};
use crate::syntax::span::Span;

fn floor_div(a: i64, b: i64) -> Option<i64> {
    let q = a.checked_div(b)?;
    Some(if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    })
}

fn floor_mod(a: i64, b: i64) -> Option<i64> {
    let r = a.checked_rem(b)?;
    Some(if r != 0 && ((r < 0) != (b < 0)) {
        r + b
    } else {
        r
    })
}

fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Float(x) => Some(*x),
        Value::Int(d) => d.as_const().map(|i| i as f64),
        Value::Bool(b) => Some(*b as i64 as f64),
        _ => None,
    }
}

/// The help line of a failed constant evaluation (E0315), by its message.
pub fn failure_help(message: &str) -> &'static str {
    if message.contains("division by zero") {
        "make the divisor a non-zero constant"
    } else {
        "integer constants are 64-bit: use smaller values, or floats (e.g. `2.0 ** 63`)"
    }
}

/// Folds `a op b`. `Ok(None)`: not foldable (symbolic or non-constant);
/// `Err`: the evaluation itself fails (division by zero, overflow).
pub fn fold_binary(op: BinOp, a: &Value, b: &Value) -> Result<Option<Value>, String> {
    use BinOp::*;
    let overflow = || "integer overflow".to_string();
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => {
            let (cx, cy) = (x.as_const(), y.as_const());
            match op {
                Add => {
                    return x
                        .checked_add(y)
                        .map(|d| Some(Value::Int(d)))
                        .ok_or_else(overflow)
                }
                Sub => {
                    return x
                        .checked_sub(y)
                        .map(|d| Some(Value::Int(d)))
                        .ok_or_else(overflow)
                }
                Mul => {
                    return x
                        .checked_mul(y)
                        .map(|d| Some(Value::Int(d)))
                        .ok_or_else(overflow)
                }
                Eq if x == y => return Ok(Some(Value::Bool(true))),
                _ => {}
            }
            let (Some(p), Some(q)) = (cx, cy) else {
                return Ok(None);
            };
            let r = match op {
                FloorDiv | Mod if q == 0 => {
                    return Err(format!("division by zero in `{p} {} {q}`", op.symbol()))
                }
                FloorDiv => Value::int(floor_div(p, q).ok_or_else(overflow)?),
                Mod => Value::int(floor_mod(p, q).ok_or_else(overflow)?),
                Div if q == 0 => return Err(format!("division by zero in `{p} / {q}`")),
                Div => Value::Float(p as f64 / q as f64),
                Pow if q < 0 => Value::Float((p as f64).powf(q as f64)),
                Pow => Value::int(
                    p.checked_pow(u32::try_from(q).map_err(|_| overflow())?)
                        .ok_or_else(overflow)?,
                ),
                BitAnd => Value::int(p & q),
                BitOr => Value::int(p | q),
                BitXor => Value::int(p ^ q),
                Eq => Value::Bool(p == q),
                Ne => Value::Bool(p != q),
                Lt => Value::Bool(p < q),
                Le => Value::Bool(p <= q),
                Gt => Value::Bool(p > q),
                Ge => Value::Bool(p >= q),
                // `and`/`or` are bool-valued (their type is `bool`), not
                // Python's operand-valued form.
                And => Value::Bool(p != 0 && q != 0),
                Or => Value::Bool(p != 0 || q != 0),
                Add | Sub | Mul | MatMul => return Ok(None),
            };
            Ok(Some(r))
        }
        (Value::Bool(x), Value::Bool(y)) => Ok(match op {
            And | BitAnd => Some(Value::Bool(*x && *y)),
            Or | BitOr => Some(Value::Bool(*x || *y)),
            BitXor | Ne => Some(Value::Bool(x != y)),
            Eq => Some(Value::Bool(x == y)),
            _ => fold_binary(op, &Value::int(*x as i64), &Value::int(*y as i64))?,
        }),
        (Value::Str(x), Value::Str(y)) => Ok(match op {
            Eq => Some(Value::Bool(x == y)),
            Ne => Some(Value::Bool(x != y)),
            Add => Some(Value::Str(format!("{x}{y}"))),
            _ => None,
        }),
        _ => {
            let (Some(x), Some(y)) = (as_f64(a), as_f64(b)) else {
                return Ok(None);
            };
            Ok(Some(match op {
                Add => Value::Float(x + y),
                Sub => Value::Float(x - y),
                Mul => Value::Float(x * y),
                Div => Value::Float(x / y),
                FloorDiv => Value::Float((x / y).floor()),
                Mod => Value::Float(x - y * (x / y).floor()),
                Pow => Value::Float(x.powf(y)),
                Eq => Value::Bool(x == y),
                Ne => Value::Bool(x != y),
                Lt => Value::Bool(x < y),
                Le => Value::Bool(x <= y),
                Gt => Value::Bool(x > y),
                Ge => Value::Bool(x >= y),
                And => Value::Bool(x != 0.0 && y != 0.0),
                Or => Value::Bool(x != 0.0 || y != 0.0),
                _ => return Ok(None),
            }))
        }
    }
}

pub fn fold_unary(op: UnaryOp, v: &Value) -> Option<Value> {
    match (op, v) {
        (UnaryOp::Neg, Value::Int(d)) => d.checked_neg().map(Value::Int),
        (UnaryOp::Neg, Value::Float(x)) => Some(Value::Float(-x)),
        (UnaryOp::Pos, Value::Int(_) | Value::Float(_)) => Some(v.clone()),
        (UnaryOp::Not, Value::Bool(b)) => Some(Value::Bool(!b)),
        (UnaryOp::Not, Value::Int(d)) => d.as_const().map(|i| Value::Bool(i == 0)),
        (UnaryOp::Invert, Value::Int(d)) => d.as_const().map(|i| Value::int(!i)),
        (UnaryOp::Invert, Value::Bool(b)) => Some(Value::Bool(!b)),
        _ => None,
    }
}

/// Folds a call of a scalar builtin (`cdiv`, `min`, `max`, `abs`).
pub fn fold_call(b: Builtin, args: &[Value]) -> Result<Option<Value>, String> {
    let ints: Option<Vec<i64>> = args
        .iter()
        .map(|a| match a {
            Value::Int(d) => d.as_const(),
            _ => None,
        })
        .collect();
    match (b, ints.as_deref()) {
        (Builtin::Cdiv, Some([a, b])) => {
            if *b == 0 {
                return Err(format!("division by zero in `cdiv({a}, {b})`"));
            }
            let r = floor_div(
                a.checked_add(b.checked_sub(1).ok_or("integer overflow")?)
                    .ok_or("integer overflow")?,
                *b,
            )
            .ok_or("integer overflow")?;
            Ok(Some(Value::int(r)))
        }
        (Builtin::Min, Some(v)) if !v.is_empty() => Ok(v.iter().min().map(|x| Value::int(*x))),
        (Builtin::Max, Some(v)) if !v.is_empty() => Ok(v.iter().max().map(|x| Value::int(*x))),
        (Builtin::Abs, Some([a])) => {
            Ok(Some(Value::int(a.checked_abs().ok_or("integer overflow")?)))
        }
        (Builtin::Min | Builtin::Max, None) => {
            let fl: Option<Vec<f64>> = args.iter().map(as_f64).collect();
            Ok(fl.filter(|v| !v.is_empty()).map(|v| {
                let init = if b == Builtin::Min {
                    f64::INFINITY
                } else {
                    f64::NEG_INFINITY
                };
                Value::Float(v.into_iter().fold(init, |acc, x| {
                    if b == Builtin::Min {
                        acc.min(x)
                    } else {
                        acc.max(x)
                    }
                }))
            }))
        }
        _ => Ok(None),
    }
}

/// Why a module-level constant expression could not be evaluated.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstError {
    /// A name that is not a known constant.
    NotConst { name: String, span: Span },
    /// The expression is of a form constants cannot take.
    Unsupported(Span),
    /// The evaluation failed (division by zero, overflow).
    Failed { message: String, span: Span },
}

/// Evaluates a constant expression; `lookup` gives the values of names.
pub fn eval_const(e: &Expr, lookup: &dyn Fn(&str) -> Option<Value>) -> Result<Value, ConstError> {
    match &e.kind {
        ExprKind::Int(i) => Ok(Value::int(*i)),
        ExprKind::Float(x) => Ok(Value::Float(*x)),
        ExprKind::Bool(b) => Ok(Value::Bool(*b)),
        ExprKind::Str(s) => Ok(Value::Str(s.clone())),
        ExprKind::None => Ok(Value::None),
        ExprKind::Name(id) => {
            if let Some(v) = lookup(&id.name) {
                return Ok(v);
            }
            if let Some(d) = DType::from_name(&id.name) {
                return Ok(Value::DType(d));
            }
            Err(ConstError::NotConst {
                name: id.name.clone(),
                span: id.span,
            })
        }
        ExprKind::Unary { op, operand } => {
            let v = eval_const(operand, lookup)?;
            fold_unary(*op, &v).ok_or(ConstError::Unsupported(e.span))
        }
        ExprKind::Binary { op, lhs, rhs } => {
            let a = eval_const(lhs, lookup)?;
            let b = eval_const(rhs, lookup)?;
            match fold_binary(*op, &a, &b) {
                Ok(Some(v)) => Ok(v),
                Ok(None) => Err(ConstError::Unsupported(e.span)),
                Err(message) => Err(ConstError::Failed {
                    message,
                    span: e.span,
                }),
            }
        }
        ExprKind::IfElse {
            cond,
            then,
            otherwise,
        } => match eval_const(cond, lookup)? {
            Value::Bool(true) => eval_const(then, lookup),
            Value::Bool(false) => eval_const(otherwise, lookup),
            _ => Err(ConstError::Unsupported(cond.span)),
        },
        ExprKind::Tuple(items) | ExprKind::List(items) => items
            .iter()
            .map(|i| eval_const(i, lookup))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Tuple),
        ExprKind::Call { func, args } => {
            let ExprKind::Name(f) = &func.kind else {
                return Err(ConstError::Unsupported(e.span));
            };
            let b = match Builtin::from_name(&f.name) {
                Some(b @ (Builtin::Cdiv | Builtin::Min | Builtin::Max | Builtin::Abs))
                    if args.iter().all(|a| a.name.is_none()) =>
                {
                    b
                }
                _ => return Err(ConstError::Unsupported(e.span)),
            };
            let vals = args
                .iter()
                .map(|a| eval_const(&a.value, lookup))
                .collect::<Result<Vec<_>, _>>()?;
            match fold_call(b, &vals) {
                Ok(Some(v)) => Ok(v),
                Ok(None) => Err(ConstError::Unsupported(e.span)),
                Err(message) => Err(ConstError::Failed {
                    message,
                    span: e.span,
                }),
            }
        }
        _ => Err(ConstError::Unsupported(e.span)),
    }
}

/// `Value::Int` of a dim, for callers that build values from dims.
pub fn dim_value(d: Dim) -> Value {
    Value::Int(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding() {
        assert_eq!(
            fold_call(Builtin::Cdiv, &[Value::int(1000), Value::int(128)]).unwrap(),
            Some(Value::int(8))
        );
        assert!(fold_call(Builtin::Cdiv, &[Value::int(1), Value::int(0)]).is_err());
        assert_eq!(
            fold_binary(BinOp::FloorDiv, &Value::int(-7), &Value::int(2)).unwrap(),
            Some(Value::int(-4))
        );
        assert_eq!(
            fold_binary(BinOp::Mod, &Value::int(-7), &Value::int(2)).unwrap(),
            Some(Value::int(1))
        );
        let r = Value::Int(Dim::symbol("r"));
        let end = fold_binary(BinOp::Add, &r, &Value::int(64))
            .unwrap()
            .unwrap();
        assert_eq!(
            fold_binary(BinOp::Sub, &end, &r).unwrap(),
            Some(Value::int(64))
        );
    }
}
