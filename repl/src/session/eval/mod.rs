//! Statements and expressions run on the host: scalars, creation builtins,
//! indexing, `.shape`/`.dtype`/`.to()`, kernel launches, calls of `print`,
//! `load_npy`/`save_npy`, and `if`/`for`/`while` on host values. Anything else
//! that computes on tensors is compiled as a synthetic whole-tensor function
//! (see `synth`) and run by the executor.
//!
//! # Layout of this module
//!
//! [`Val`], [`Flow`] and the diagnostic helpers live here; the evaluator is
//! `impl Session` spread over files by concern:
//!
//! | file | holds |
//! |------|-------|
//! | `stmt.rs` | statements, assignments, conditions, `for` ranges |
//! | `expr.rs` | names, `const`s, expressions, what the host evaluates |
//! | `index.rs` | indexing tensors, tuples and lists on the host |
//! | `call.rs` | calls, kernel launches, argument binding |
//! | `host_builtin.rs` | the builtins the host evaluates itself |
//! | `num.rs` | host scalar arithmetic and casts |
//!
//! A method or item is `pub(super)` only where a sibling file uses it.

mod call;
mod expr;
mod host_builtin;
mod index;
mod num;
mod stmt;

use std::fmt;

use tessera::check::DType;
use tessera::diag::Diagnostic;
use tessera::exec::dist::DistTensor;
use tessera::exec::{Tensor, Value};
use tessera::syntax::span::Span;

/// A session value: what the executor computes, plus host-only values.
#[derive(Clone, Debug)]
pub enum Val {
    Run(Value),
    Str(String),
    DType(DType),
    List(Vec<Val>),
    /// A tensor spread over the session's devices (`shard`), with the kind of
    /// device that holds its parts (`cpu` or `cuda`).
    Dist(DistTensor, &'static str),
}

impl Val {
    fn tensor(&self) -> Option<&Tensor> {
        match self {
            Val::Run(Value::Tensor(t)) => Some(t),
            _ => None,
        }
    }

    /// A short description for messages (`tensor[4, 8] f32`, `int`).
    pub fn describe(&self) -> String {
        match self {
            Val::Run(v) => v.describe(),
            Val::Str(_) => "str".into(),
            Val::DType(_) => "dtype".into(),
            Val::List(v) => format!("list of {}", v.len()),
            Val::Dist(d, kind) => {
                let mut dims: Vec<String> = d.shape().iter().map(|n| n.to_string()).collect();
                dims.push(d.dtype().to_string());
                format!(
                    "Tensor[{}] {}",
                    dims.join(", "),
                    d.describe_placement(&|i| format!("{kind}:{i}"))
                )
            }
        }
    }

    /// The value as the executor takes it (lists become tuples).
    fn to_value(&self) -> Option<Value> {
        match self {
            Val::Run(v) => Some(v.clone()),
            Val::List(items) => items
                .iter()
                .map(Val::to_value)
                .collect::<Option<Vec<_>>>()
                .map(Value::Tuple),
            Val::Str(_) | Val::DType(_) | Val::Dist(..) => None,
        }
    }
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Run(v) => write!(f, "{v}"),
            Val::Str(s) => write!(f, "{s}"),
            Val::DType(d) => write!(f, "{d}"),
            // The whole value, as `gather` gives it: the same text on any
            // number of devices.
            Val::Dist(d, _) => match d.gather(&tessera::exec::Interrupt::new()) {
                Ok(t) => write!(f, "{t}"),
                Err(e) => write!(f, "<{}: {}>", e.code, e.message),
            },
            Val::List(items) => {
                f.write_str("[")?;
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    match x {
                        Val::Str(s) => write!(f, "{s:?}")?,
                        _ => write!(f, "{x}")?,
                    }
                }
                f.write_str("]")
            }
        }
    }
}

/// How a block ended.
pub(crate) enum Flow {
    Normal,
    Break,
    Continue,
}

type R<T> = Result<T, Diagnostic>;

/// An unsupported session construct (E0720).
pub(crate) fn unsupported(span: Span, what: impl Into<String>, help: &str) -> Diagnostic {
    Diagnostic::new("E0720", span, what.into()).with_help(help.to_string())
}

/// A value of the wrong kind (E0302), with a help line that shows the kind
/// expected.
fn wrong_kind(span: Span, message: impl Into<String>, help: &str) -> Diagnostic {
    Diagnostic::new("E0302", span, message.into()).with_help(help.to_string())
}

/// [`wrong_kind`] for the value `found`: a distributed tensor where an
/// ordinary one is needed gets the help that says how to make it one.
fn wrong_kind_of(found: &Val, span: Span, message: impl Into<String>, help: &str) -> Diagnostic {
    match found {
        Val::Dist(..) => wrong_kind(
            span,
            message,
            "this tensor is spread over the session's devices: `gather(x)` gives it whole, as an ordinary tensor (docs/multi-gpu.md)",
        ),
        _ => wrong_kind(span, message, help),
    }
}
