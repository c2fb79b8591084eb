//! Indexing on the host: tensor, tuple and list subscripts with host
//! integers, and the integers they take.

use tessera::check::DType;
use tessera::diag::{with_article, Diagnostic};
use tessera::exec::{IndexItem, Value};
use tessera::syntax::ast::{Expr, ExprKind, Index};
use tessera::syntax::span::Span;

use super::super::Session;
use super::*;

impl Session {
    pub(super) fn index(
        &mut self,
        v: Val,
        vspan: Span,
        indices: &[Index],
        text: &str,
        span: Span,
    ) -> R<Val> {
        let items = self.index_items(indices, text)?;
        match v {
            Val::Run(Value::Tensor(t)) => t
                .index(&items, &self.interrupt)
                .map(|t| Val::Run(Value::Tensor(t)))
                .map_err(|e| e.to_diagnostic(span)),
            Val::Run(Value::Tuple(vals)) => {
                let seq: Vec<Val> = vals.into_iter().map(Val::Run).collect();
                index_seq(seq, &items, span)
            }
            Val::List(seq) => index_seq(seq, &items, span),
            other => Err(wrong_kind_of(
                &other,
                vspan,
                format!("{} cannot be indexed", with_article(&other.describe())),
                "index a tensor, a tuple or a list: `t[0]`",
            )),
        }
    }

    pub(super) fn index_items(&mut self, indices: &[Index], text: &str) -> R<Vec<IndexItem>> {
        let mut items = Vec::new();
        for i in indices {
            items.push(match i {
                Index::Expr(x) if matches!(x.kind, ExprKind::None) => IndexItem::NewAxis,
                Index::Expr(x) => IndexItem::Int(self.index_int(x, text)?),
                Index::Slice {
                    start, end, step, ..
                } => {
                    let mut part = |p: &Option<Expr>| -> R<Option<i64>> {
                        match p {
                            Some(x) => self.int_arg(x, text, "a slice bound").map(Some),
                            None => Ok(None),
                        }
                    };
                    IndexItem::Slice {
                        start: part(start)?,
                        stop: part(end)?,
                        step: part(step)?,
                    }
                }
            });
        }
        Ok(items)
    }

    /// An integer index. An integer tensor of rank 1 or more would be a
    /// gather, which is E0512 as in the checker (a kernel does it).
    fn index_int(&mut self, x: &Expr, text: &str) -> R<i64> {
        let v = self.eval(x, text)?;
        if let Val::Run(Value::Tensor(t)) = &v {
            if !t.shape().is_empty() && !t.dtype().is_float() && t.dtype() != DType::Bool {
                return Err(Diagnostic::new(
                    "E0512",
                    x.span,
                    "indexing a tensor with an integer tensor (a gather) is not supported in whole-tensor code yet",
                )
                .with_help("gather in a `@kernel` with `load(x[idx])` and launch it from the function"));
            }
        }
        self.int_value(v, x.span, "an index")
    }

    pub(super) fn int_arg(&mut self, x: &Expr, text: &str, what: &str) -> R<i64> {
        let v = self.eval(x, text)?;
        self.int_value(v, x.span, what)
    }

    fn int_value(&self, v: Val, span: Span, what: &str) -> R<i64> {
        match v {
            Val::Run(Value::Int(i)) => Ok(i),
            Val::Run(Value::Tensor(ref t))
                if t.shape().is_empty() && !t.dtype().is_float() && t.dtype() != DType::Bool =>
            {
                Ok(t.int_at(0).expect("an integer tensor"))
            }
            other => Err(wrong_kind(
                span,
                format!("{what} must be an integer, found {}", other.describe()),
                "write an integer (a literal, a dim or an integer variable)",
            )),
        }
    }
}

fn index_seq(seq: Vec<Val>, items: &[IndexItem], span: Span) -> R<Val> {
    match items {
        [IndexItem::Int(i)] => {
            let n = seq.len() as i64;
            let j = if *i < 0 { i + n } else { *i };
            if j < 0 || j >= n {
                return Err(Diagnostic::new(
                    "E0413",
                    span,
                    format!("index {i} is out of range for {n} items"),
                )
                .with_help(if n == 0 {
                    "it has no items".to_string()
                } else {
                    format!(
                        "its indices are 0 to {} (or -{n} to -1, counting from the end)",
                        n - 1
                    )
                }));
            }
            Ok(seq[j as usize].clone())
        }
        _ => Err(wrong_kind(
            span,
            "a tuple or list takes one integer index",
            "index with one integer: `t[0]`",
        )),
    }
}
