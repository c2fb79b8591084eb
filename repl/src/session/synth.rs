//! Tensor expressions as synthetic whole-tensor functions.
//!
//! `y = softmax(x, dim=-1)` with a session tensor `x` of shape 4×1000 becomes
//!
//! ```text
//! def __repl_eval_7(x: Tensor[4, 1000, f32]):
//!     return softmax(x, dim=-1)
//! ```
//!
//! appended to the session source: the checker sees the concrete shapes (its
//! shape errors name real sizes), the executor runs the function's Schedule IR,
//! and diagnostics inside the expression are mapped back to the user's text.
//! Session scalars become `const` items (weak-typed literals, as typed);
//! host-only sub-expressions (`randn(...)`, `load_npy(...)`, indexing of a
//! session tensor) are evaluated first and passed as parameters.

use tessera::check::builtins::{Builtin, Builtin as B};
use tessera::check::DType;
use tessera::diag::{Diagnostic, Label};
use tessera::exec::dist::DistTensor;
use tessera::exec::{self, Tensor, Value};
use tessera::syntax::ast::{BinOp, Expr, ExprKind, Index};
use tessera::syntax::span::Span;

use super::eval::{unsupported, Val};
use super::{Session, SESSION_PATH};

/// Beyond this many distinct expressions, their names start afresh.
const SYNTH_NAMES_CAP: usize = 4096;

/// One piece of the synthetic expression text.
enum Piece {
    /// Text of the user's item at this (item-relative) span.
    Verbatim(Span),
    /// A value computed on the host, passed as a parameter; the span it came from.
    Temp(Val, Span),
    /// Generated text (operators of `x op= y`).
    Glue(String),
}

/// A synthetic function ready to check and run.
pub(super) struct Synth {
    pub(super) source: String,
    pub(super) name: String,
    /// The arguments, in parameter order (`Value::None` where the argument
    /// is distributed: see `dists`).
    pub(super) args: Vec<Value>,
    /// Each parameter's distributed argument, if it is one.
    pub(super) dists: Vec<Option<(DistTensor, &'static str)>>,
    /// Offset of the synthetic item and of the returned expression in `source`.
    pub(super) item_start: u32,
    pub(super) expr_start: u32,
    /// (start offset in `source`, end offset, piece's user span, whether verbatim).
    map: Vec<(u32, u32, Span, bool)>,
    /// The span of the whole expression in the user's item.
    pub(super) span: Span,
    /// Internal names and what the user wrote in their place, longest name
    /// first (`__t10` before `__t1`): messages must never show the former.
    shown: Vec<(String, String)>,
}

type R<T> = Result<T, Diagnostic>;

fn children(e: &Expr) -> Vec<&Expr> {
    match &e.kind {
        ExprKind::Unary { operand, .. } => vec![operand],
        ExprKind::Binary { lhs, rhs, .. } => vec![lhs, rhs],
        ExprKind::IfElse {
            cond,
            then,
            otherwise,
        } => vec![then, cond, otherwise],
        ExprKind::Call { func, args } => {
            let mut v = vec![&**func];
            v.extend(args.iter().map(|a| &a.value));
            v
        }
        ExprKind::Subscript { value, indices } => {
            let mut v = vec![&**value];
            for i in indices {
                match i {
                    Index::Expr(x) => v.push(x),
                    Index::Slice {
                        start, end, step, ..
                    } => v.extend([start, end, step].into_iter().flatten()),
                }
            }
            v
        }
        ExprKind::Attribute { value, .. } => vec![value],
        ExprKind::Tuple(items) | ExprKind::List(items) => items.iter().collect(),
        ExprKind::Dict(kv) => kv.iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => vec![],
    }
}

impl Session {
    /// Evaluates a tensor expression through a synthetic function.
    pub(crate) fn synth_eval(&mut self, e: &Expr, text: &str) -> R<Val> {
        let synth = self.synthesize(e, text)?;
        self.run_synth(synth)
    }

    /// `lhs op rhs` of evaluated values (for `x op= y`).
    pub(crate) fn synth_binary(
        &mut self,
        op: BinOp,
        lhs: (&Val, Span),
        rhs: (&Val, Span),
        span: Span,
        text: &str,
    ) -> R<Val> {
        let pieces = vec![
            Piece::Temp(lhs.0.clone(), lhs.1),
            Piece::Glue(format!(" {} ", op.symbol())),
            Piece::Temp(rhs.0.clone(), rhs.1),
        ];
        let synth = self.build(text, &pieces, &[], span)?;
        self.run_synth(synth)
    }

    /// The checker's type of `e` (`Tensor[4, f32]`), without running it.
    pub(crate) fn static_type(&mut self, e: &Expr, text: &str) -> R<String> {
        let synth = self.synthesize(e, text)?;
        let result = self.check_synth(&synth).map(|()| {
            let (item, _) = tessera::db::function_item(&self.db, self.file, &synth.name)
                .expect("the synthetic function is in the session source");
            let checked = tessera::db::check_item(&self.db, item, self.db.options());
            let lo = synth.expr_start - synth.item_start;
            let hi = synth.source.len() as u32 - synth.item_start - 1;
            checked
                .types
                .iter()
                .filter(|(s, _)| s.start == lo && s.end <= hi)
                .max_by_key(|(s, _)| s.len())
                .map(|(_, t)| t.clone())
                .unwrap_or_else(|| "unknown".to_string())
        });
        self.restore_source();
        result
    }

    fn synthesize(&mut self, e: &Expr, text: &str) -> R<Synth> {
        // Host-only sub-expressions become parameters; free names of session
        // variables become parameters or consts.
        let mut subst: Vec<&Expr> = Vec::new();
        let mut names: Vec<(String, Span)> = Vec::new();
        self.scan(e, true, &mut subst, &mut names);
        let mut pieces = Vec::new();
        let mut at = e.span.start;
        for x in subst {
            if x.span.start > at {
                pieces.push(Piece::Verbatim(Span::new(at, x.span.start)));
            }
            let v = self.eval(x, text)?;
            pieces.push(Piece::Temp(v, x.span));
            at = x.span.end;
        }
        if at < e.span.end {
            pieces.push(Piece::Verbatim(Span::new(at, e.span.end)));
        }
        self.build(text, &pieces, &names, e.span)
    }

    /// Collects the outermost host-only sub-expressions of `e` (in source
    /// order) and the session variables it names outside them.
    fn scan<'e>(
        &self,
        e: &'e Expr,
        root: bool,
        subst: &mut Vec<&'e Expr>,
        names: &mut Vec<(String, Span)>,
    ) {
        match &e.kind {
            ExprKind::Name(id) => {
                if self.vars.contains_key(&id.name) && !names.iter().any(|(n, _)| *n == id.name) {
                    names.push((id.name.clone(), e.span));
                }
                return;
            }
            ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) | ExprKind::Str(_) => return,
            _ => {}
        }
        if !root && self.host_only(e) {
            subst.push(e);
            return;
        }
        let mut kids = children(e);
        kids.sort_by_key(|k| k.span.start);
        for k in kids {
            self.scan(k, false, subst, names);
        }
    }

    /// Sub-expressions the host computes before a synthetic function runs.
    fn host_only(&self, e: &Expr) -> bool {
        match &e.kind {
            ExprKind::Call { func, .. } => matches!(&func.kind, ExprKind::Name(id)
                if (matches!(
                    Builtin::from_name(&id.name),
                    Some(B::Randn | B::Ones | B::Empty | B::Tensor | B::Arange | B::LoadNpy | B::Len)
                ) || (Builtin::from_name(&id.name).is_some_and(super::dist::is_dist_builtin)
                    && !self.defs.iter().any(|d| d.names.contains(&id.name))))
                    && !self.vars.contains_key(&id.name)),
            ExprKind::Subscript { indices, .. } => self.host_indices(indices),
            ExprKind::Attribute { attr, .. } => attr.name == "shape" || attr.name == "dtype",
            _ => false,
        }
    }

    fn build(
        &mut self,
        text: &str,
        pieces: &[Piece],
        names: &[(String, Span)],
        span: Span,
    ) -> R<Synth> {
        let mut consts = String::new();
        let mut params: Vec<String> = Vec::new();
        let mut args = Vec::new();
        let mut dists = Vec::new();
        let mut bind = |pname: &str, v: &Val, at: Span, consts: &mut String| -> R<()> {
            match v {
                Val::Run(Value::Tensor(t)) => {
                    params.push(format!("{pname}: {}", tensor_type(t)));
                    args.push(Value::Tensor(t.clone()));
                    dists.push(None);
                }
                Val::Dist(d, kind) => {
                    params.push(format!("{pname}: {}", shape_type(d.shape(), d.dtype())));
                    args.push(Value::None);
                    dists.push(Some((d.clone(), *kind)));
                }
                Val::Run(Value::Int(i)) => consts.push_str(&format!("const {pname} = {i}\n")),
                Val::Run(Value::Bool(b)) => consts.push_str(&format!(
                    "const {pname} = {}\n",
                    if *b { "True" } else { "False" }
                )),
                Val::Run(Value::Float(x)) if !x.is_nan() => {
                    consts.push_str(&format!("const {pname} = {}\n", float_literal(*x)))
                }
                Val::DType(d) => consts.push_str(&format!("const {pname} = {d}\n")),
                other => {
                    return Err(unsupported(
                        at,
                        format!(
                            "{} cannot be used in a tensor expression",
                            tessera::diag::with_article(&other.describe())
                        ),
                        "use tensors and numbers here (index a tuple first: `s[0]`)",
                    ))
                }
            }
            Ok(())
        };
        for (n, at) in names {
            let v = self.vars[n].clone();
            bind(n, &v, *at, &mut consts)?;
        }
        let mut expr = String::new();
        let mut map = Vec::new();
        let mut temps = 0;
        let mut shown = Vec::new();
        for p in pieces {
            let start = expr.len() as u32;
            match p {
                Piece::Verbatim(s) => {
                    expr.push_str(&text[s.range()]);
                    map.push((start, expr.len() as u32, *s, true));
                }
                Piece::Temp(v, s) => {
                    let t = format!("__t{temps}");
                    temps += 1;
                    shown.push((t.clone(), user_text(text, *s)));
                    bind(&t, v, *s, &mut consts)?;
                    expr.push_str(&t);
                    map.push((start, expr.len() as u32, *s, false));
                }
                Piece::Glue(g) => {
                    expr.push_str(g);
                    map.push((start, expr.len() as u32, span, false));
                }
            }
        }
        // The same expression on the same kinds of values gets the same name,
        // so its second run finds everything compiled (the checked function,
        // its kernels and their PTX, the GPU's loaded modules) instead of
        // compiling a function that differs only in its name.
        let key = format!("{consts}{}\n{expr}", params.join(", "));
        if self.synth_names.len() >= SYNTH_NAMES_CAP {
            self.synth_names.clear();
        }
        let number = match self.synth_names.get(&key) {
            Some(&n) => n,
            None => {
                self.synth_count += 1;
                self.synth_names.insert(key, self.synth_count);
                self.synth_count
            }
        };
        let name = format!("{}{number}", tessera::check::stmt::SESSION_EVAL_PREFIX);
        shown.push((name.clone(), "the expression".to_string()));
        let defs = Session::session_text(&self.defs);
        let item_start = (defs.len() + consts.len()) as u32;
        let header = format!("def {name}({}):\n    return ", params.join(", "));
        let expr_start = item_start + header.len() as u32;
        // Multi-line expressions (inside brackets) keep their line breaks.
        let source = format!("{defs}{consts}{header}{expr}\n");
        for m in &mut map {
            m.0 += expr_start;
            m.1 += expr_start;
        }
        shown.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
        Ok(Synth {
            shown,
            source,
            name,
            args,
            dists,
            item_start: item_start - consts.len() as u32 + consts.len() as u32,
            expr_start,
            map,
            span,
        })
    }

    /// Puts the synthetic function into the session source and checks it;
    /// its first error is mapped to the user's text. The caller restores the
    /// source.
    pub(super) fn check_synth(&mut self, synth: &Synth) -> R<()> {
        self.db.set_source(SESSION_PATH, synth.source.clone());
        let defs_len = Session::session_text(&self.defs).len() as u32;
        let first = self
            .db
            .diagnostics(self.file)
            .iter()
            .find(|d| d.is_error() && d.span.start >= defs_len)
            .cloned();
        match first {
            Some(mut d) => {
                // The synthetic function only sees the variables the expression
                // names: suggest among all of the session's.
                if d.code == "E0201"
                    && !d
                        .help
                        .as_deref()
                        .is_some_and(|h| h.starts_with("did you mean"))
                {
                    if let Some(name) = d.message.split('`').nth(1) {
                        let names = self.names();
                        if let Some(s) =
                            tessera::check::suggest(name, names.iter().map(String::as_str))
                        {
                            d.help = Some(format!("did you mean `{s}`?"));
                        }
                    }
                }
                Err(map_back(&d, synth))
            }
            None => Ok(()),
        }
    }

    fn run_synth(&mut self, synth: Synth) -> R<Val> {
        // Distributed arguments, or a function that shards a tensor itself,
        // in a session of several devices: every device runs it. Otherwise
        // one device does (where a collective is the identity).
        let distributed = synth.dists.iter().any(Option::is_some);
        let result = self.check_synth(&synth).and_then(|()| {
            if distributed || (self.device_count() > 1 && self.shards_inside(&synth.name)) {
                return self.run_spmd(&synth);
            }

            let device = self.device_for(&synth.args, synth.span)?;
            exec::run_function(
                &self.db,
                self.file,
                &synth.name,
                &synth.args,
                &[],
                &device,
                &self.interrupt,
            )
            .map(Val::Run)
            .map_err(|e| unmangle(&e.to_diagnostic(synth.span), &synth))
        });
        self.restore_source();
        result
    }

    /// Whether the checked function `name` (with the functions it calls)
    /// shards a tensor.
    fn shards_inside(&self, name: &str) -> bool {
        let Some((item, _)) = tessera::db::function_item(&self.db, self.file, name) else {
            return false;
        };
        fn any(g: &tessera::ir::graph::Graph) -> bool {
            use tessera::ir::graph::{regions, Collective, NodeKind};
            g.nodes.iter().any(|n| {
                matches!(
                    n.kind,
                    NodeKind::Collective {
                        op: Collective::Shard { .. },
                        ..
                    }
                ) || regions(&n.kind).iter().any(|r| any(&r.graph))
            })
        }
        tessera::db::graph_ir(&self.db, item, self.db.options())
            .as_ref()
            .is_ok_and(|g| any(g))
    }

    pub(crate) fn restore_source(&mut self) {
        self.db
            .set_source(SESSION_PATH, Session::session_text(&self.defs));
    }
}

/// `Tensor[4, 1000, f32]`.
fn tensor_type(t: &Tensor) -> String {
    shape_type(t.shape(), t.dtype())
}

/// `Tensor[4, 1000, f32]` of a shape and dtype.
fn shape_type(shape: &[usize], dtype: DType) -> String {
    let mut parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    parts.push(dtype.to_string());
    format!("Tensor[{}]", parts.join(", "))
}

/// A float as a literal the lexer reads back to the same value.
fn float_literal(x: f64) -> String {
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let s = format!("{x:?}");
    if s.contains('.') || s.contains('e') {
        s
    } else {
        format!("{s}.0")
    }
}

/// Maps a diagnostic about the synthetic source back to the user's item.
fn map_back(d: &Diagnostic, synth: &Synth) -> Diagnostic {
    let map_span = |s: Span| -> Option<Span> {
        synth
            .map
            .iter()
            .find(|(a, b, _, _)| s.start >= *a && s.end <= *b)
            .map(|(a, _, user, verbatim)| {
                if *verbatim {
                    Span::new(user.start + (s.start - a), user.start + (s.end - a))
                } else {
                    *user
                }
            })
    };
    let mut out = unmangle(d, synth);
    out.span = map_span(d.span).unwrap_or(synth.span);
    out.labels = out
        .labels
        .iter()
        .filter_map(|l| {
            map_span(l.span).map(|span| Label {
                span,
                message: l.message.clone(),
            })
        })
        .collect();
    out
}

/// What the user wrote at `span` of `text`, on one line, for messages.
fn user_text(text: &str, span: Span) -> String {
    let raw = text.get(span.range()).unwrap_or("").trim();
    let one_line = raw.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.is_empty() {
        "the value".to_string()
    } else {
        one_line
    }
}

/// `d` with the synthetic function's internal names replaced by the user's
/// text in its message, help and labels.
fn unmangle(d: &Diagnostic, synth: &Synth) -> Diagnostic {
    let fix = |s: &str| -> String {
        let mut s = s.to_string();
        for (internal, user) in &synth.shown {
            s = replace_name(&s, internal, user);
        }
        s
    };
    let mut out = d.clone();
    out.message = fix(&d.message);
    out.help = d.help.as_deref().map(fix);
    for l in &mut out.labels {
        l.message = fix(&l.message);
    }
    out
}

/// `s` with every whole-word occurrence of `name` replaced by `by`.
fn replace_name(s: &str, name: &str, by: &str) -> String {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find(name) {
        let before = rest[..i].chars().next_back();
        let after = rest[i + name.len()..].chars().next();
        out.push_str(&rest[..i]);
        if before.is_some_and(word) || after.is_some_and(word) {
            out.push_str(name);
        } else {
            out.push_str(by);
        }
        rest = &rest[i + name.len()..];
    }
    out.push_str(rest);
    out
}
