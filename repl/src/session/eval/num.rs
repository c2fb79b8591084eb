//! Host scalar arithmetic: the numbers of the session, their operators,
//! `.to(dtype)` casts and the errors of integer overflow and division by zero.

use tessera::check::DType;
use tessera::diag::Diagnostic;
use tessera::exec::{self, Value};
use tessera::syntax::ast::BinOp;
use tessera::syntax::span::Span;

use super::*;

/// A host scalar, for arithmetic.
#[derive(Clone, Copy, Debug)]
pub(super) enum Num {
    I(i64),
    F(f64),
}

pub(super) fn num(v: &Val) -> Option<Num> {
    match v {
        Val::Run(Value::Int(i)) => Some(Num::I(*i)),
        Val::Run(Value::Bool(b)) => Some(Num::I(*b as i64)),
        Val::Run(Value::Float(x)) => Some(Num::F(*x)),
        _ => None,
    }
}

impl Num {
    pub(super) fn f(self) -> f64 {
        match self {
            Num::I(i) => i as f64,
            Num::F(x) => x,
        }
    }
}

/// A number, or the element of a rank-0 tensor as a number of its kind.
pub(super) fn element(v: &Val) -> Option<Num> {
    match v {
        Val::Run(Value::Tensor(t)) if t.shape().is_empty() => Some(match t.int_at(0) {
            Some(i) => Num::I(i),
            None => Num::F(t.to_f64_vec()[0]),
        }),
        _ => num(v),
    }
}

pub(super) fn int(i: i64) -> Val {
    Val::Run(Value::Int(i))
}

pub(super) fn float(x: f64) -> Val {
    Val::Run(Value::Float(x))
}

pub(super) fn boolean(b: bool) -> Val {
    Val::Run(Value::Bool(b))
}

fn overflow(span: Span) -> Diagnostic {
    Diagnostic::new("E0724", span, "integer overflow").with_help("session integers are 64-bit")
}

/// The executor's code for an integer division by zero (E0704).
pub(crate) fn division_by_zero(span: Span) -> Diagnostic {
    exec::ExecError::new("E0704", "integer division by zero")
        .with_help("check the divisor before dividing")
        .to_diagnostic(span)
}

/// Operators the checker rejects on `bool` operands (E0311): arithmetic.
/// Comparisons, `and`/`or` and the bitwise operators take bools.
pub(super) fn bool_arith(op: BinOp) -> bool {
    use BinOp::*;
    matches!(op, Add | Sub | Mul | Div | FloorDiv | Mod | Pow)
}

/// `x.to(dtype)` of a host scalar, as a cast in a kernel does: floats round,
/// float to integer truncates and saturates (NaN to 0), integers wrap.
pub(super) fn cast_scalar(n: Num, d: DType) -> Val {
    if d == DType::Bool {
        return boolean(n.f() != 0.0);
    }
    if d.is_float() {
        return float(exec::round_to(d, n.f()));
    }
    int(match n {
        Num::I(i) => exec::wrap_int(d, i),
        Num::F(x) => exec::float_to_int(d, x),
    })
}

pub(super) fn arith(op: BinOp, a: Num, b: Num, span: Span) -> R<Val> {
    use BinOp::*;
    let both_int = matches!((a, b), (Num::I(_), Num::I(_)));
    Ok(match op {
        Add | Sub | Mul if both_int => {
            let (Num::I(x), Num::I(y)) = (a, b) else {
                unreachable!()
            };
            let r = match op {
                Add => x.checked_add(y),
                Sub => x.checked_sub(y),
                _ => x.checked_mul(y),
            };
            int(r.ok_or_else(|| overflow(span))?)
        }
        Add => float(a.f() + b.f()),
        Sub => float(a.f() - b.f()),
        Mul => float(a.f() * b.f()),
        Div => float(a.f() / b.f()),
        FloorDiv | Mod if both_int => {
            let (Num::I(x), Num::I(y)) = (a, b) else {
                unreachable!()
            };
            if y == 0 {
                return Err(division_by_zero(span));
            }
            // Python semantics: floor division, remainder with the divisor's sign.
            let mut q = x.wrapping_div(y);
            if x.wrapping_rem(y) != 0 && ((x < 0) != (y < 0)) {
                q -= 1;
            }
            if op == FloorDiv {
                int(q)
            } else {
                int(x - q * y)
            }
        }
        FloorDiv => float((a.f() / b.f()).floor()),
        Mod => {
            let (x, y) = (a.f(), b.f());
            float(x - (x / y).floor() * y)
        }
        Pow => match (a, b) {
            (Num::I(x), Num::I(y)) if y >= 0 => {
                int(x.checked_pow(y as u32).ok_or_else(|| overflow(span))?)
            }
            _ => float(a.f().powf(b.f())),
        },
        Lt => boolean(a.f() < b.f()),
        Le => boolean(a.f() <= b.f()),
        Gt => boolean(a.f() > b.f()),
        Ge => boolean(a.f() >= b.f()),
        Eq => boolean(a.f() == b.f()),
        Ne => boolean(a.f() != b.f()),
        And => boolean(a.f() != 0.0 && b.f() != 0.0),
        Or => boolean(a.f() != 0.0 || b.f() != 0.0),
        BitAnd | BitOr | BitXor => {
            let (Num::I(x), Num::I(y)) = (a, b) else {
                return Err(Diagnostic::new(
                    "E0314",
                    span,
                    "bitwise operators need integer operands",
                )
                .with_help(
                    "bitwise operators work on integers and bools: convert with `.to(i32)`",
                ));
            };
            int(match op {
                BitAnd => x & y,
                BitOr => x | y,
                _ => x ^ y,
            })
        }
        MatMul => {
            return Err(unsupported(
                span,
                "this operator is not evaluated on host values",
                "compute it inside a function or kernel",
            ))
        }
    })
}
