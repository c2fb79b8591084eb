//! The parser: drives the lalrpop grammar (`grammar/tessera.lalrpop`) over the
//! layout token stream, turns lalrpop's errors into catalogue diagnostics with
//! human-worded expectations, and runs the small post-parse checks (break,
//! continue and return placement).
//!
//! Error recovery, from the finest to the coarsest:
//! 1. an error inside a closed bracket group is reported, the comma- (or colon-)
//!    separated part holding it is replaced by an `ERROR_EXPR` token (an
//!    `Expr::Error` in the tree) and the item is parsed again (`repair_range`);
//! 2. otherwise the grammar's `!` productions skip to the end of the statement
//!    (and the block it opens), and `Sink::salvage` keeps the shape its first
//!    tokens show (`x = ...`, `for i in ...:`), with `Expr::Error` inside;
//! 3. a `def` header that cannot be read keeps its name, parameter names and body;
//!    a decorator line that cannot be read keeps its place.
//!
//! Each error is reported once: follow-on reports on the same line as a lexical
//! error, on a mis-indented line, or for the same unclosed bracket are dropped.

use lalrpop_util::{lalrpop_mod, ErrorRecovery, ParseError};

use crate::diag::Diagnostic;
use crate::syntax::ast::*;
use crate::syntax::lexer::{self, Spanned, Tok};
use crate::syntax::span::Span;
use crate::syntax::ParsedItem;

lalrpop_mod!(
    #[allow(clippy::all, clippy::pedantic, unused, dead_code)]
    tessera
);

/// Where grammar actions report what they find besides the tree.
pub struct Sink<'a> {
    pub recovered: Vec<ErrorRecovery<u32, Tok<'a>, ()>>,
    pub diags: Vec<Diagnostic>,
    /// The whole token stream, to salvage what a bad statement shows of its shape.
    pub tokens: &'a [Spanned<'a>],
}

impl Sink<'_> {
    /// The statement kind for a statement that could not be parsed (tokens in
    /// `l..r`, and the block after it if any): its shape where its first tokens
    /// show it (`x = ...`, `x += ...`, `return ...`, `for i in ...:`, `while ...:`,
    /// `if ...:`) with `ExprKind::Error` for the unreadable part, so that names it
    /// binds and blocks it holds are still seen; `StmtKind::Error` otherwise.
    /// The parameter names of a `def` header that could not be parsed (tokens in
    /// `l..r`, after the function name): each comma-separated part of the
    /// parenthesised list that starts with a name gives a parameter with that name
    /// (its annotation and default are dropped), so the body still sees them.
    pub fn salvage_params(&self, l: u32, r: u32) -> Vec<Param> {
        let lo = self.tokens.partition_point(|t| t.0 < l);
        let hi = self.tokens.partition_point(|t| t.0 < r).max(lo);
        let toks = &self.tokens[lo..hi];
        let mut out: Vec<Param> = Vec::new();
        if !matches!(toks.first(), Some((_, Tok::LParen, _))) {
            return out;
        }
        let mut depth = 0usize;
        let mut at_part_start = false;
        for &(a, t, b) in toks {
            let was_start = std::mem::replace(&mut at_part_start, false);
            match t {
                Tok::LParen | Tok::LBracket | Tok::LBrace => {
                    depth += 1;
                    at_part_start = depth == 1;
                }
                Tok::RParen | Tok::RBracket | Tok::RBrace => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        break;
                    }
                }
                Tok::Comma if depth == 1 => at_part_start = true,
                Tok::Name(n)
                    if depth == 1 && was_start && !out.iter().any(|p| p.name.name == n) =>
                {
                    out.push(Param {
                        name: Ident::new(n, Span::new(a, b)),
                        ty: None,
                        default: None,
                        span: Span::new(a, b),
                    });
                }
                _ => {}
            }
        }
        out
    }

    pub fn salvage(&self, l: u32, r: u32, block: Option<Vec<Stmt>>) -> StmtKind {
        let lo = self.tokens.partition_point(|t| t.0 < l);
        let hi = self.tokens.partition_point(|t| t.0 < r).max(lo);
        let mut toks = &self.tokens[lo..hi];
        while let [(_, Tok::Indent | Tok::Dedent | Tok::EmptyBlock | Tok::Newline, _), rest @ ..] =
            toks
        {
            toks = rest;
        }
        let error_from = |i: usize| {
            let start = toks.get(i).map_or(r, |t| t.0);
            Expr::new(ExprKind::Error, Span::new(start, r.max(start)))
        };
        let name = |t: &Spanned<'_>| match t.1 {
            Tok::Name(n) => Some(Ident::new(n, Span::new(t.0, t.2))),
            _ => None,
        };
        let target = |id: Ident| Expr::new(ExprKind::Name(id.clone()), id.span);
        match (toks, block) {
            ([n, (_, Tok::Assign | Tok::Colon, _), ..], None) if name(n).is_some() => {
                StmtKind::Assign {
                    target: target(name(n).unwrap()),
                    ty: None,
                    value: error_from(2),
                }
            }
            ([n, (_, op, _), ..], None) if name(n).is_some() && aug_op(*op).is_some() => {
                StmtKind::AugAssign {
                    target: target(name(n).unwrap()),
                    op: aug_op(*op).unwrap(),
                    value: error_from(2),
                }
            }
            ([(_, Tok::Return, _)], None) => StmtKind::Return(None),
            ([(_, Tok::Return, _), ..], None) => StmtKind::Return(Some(error_from(1))),
            ([(_, Tok::For, _), n, (_, Tok::In, _), ..], Some(body)) if name(n).is_some() => {
                StmtKind::For {
                    target: name(n).unwrap(),
                    iter: error_from(3),
                    body,
                }
            }
            ([(_, Tok::While, _), ..], Some(body)) => StmtKind::While {
                cond: error_from(1),
                body,
            },
            ([(_, Tok::If, _), ..], Some(body)) => StmtKind::If {
                branches: vec![(error_from(1), body)],
                orelse: None,
            },
            _ => StmtKind::Error,
        }
    }

    pub fn decorator_without_def(&mut self, decorators: &[Decorator], stmt: Option<Span>) {
        let Some(last) = decorators.last() else {
            return;
        };
        let mut d = Diagnostic::new(
            "E0113",
            last.span,
            format!("decorator `@{}` is not followed by a `def`", last.name.name),
        )
        .with_primary_label("this decorator needs a function below it")
        .with_help("put the decorator directly above the `def` it applies to, or remove it");
        if let Some(s) = stmt {
            d = d.with_label(s, "this is not a `def`");
        }
        self.diags.push(d);
    }

    pub fn chained_comparison(&mut self, lhs: &Expr, op: Span) {
        self.diags.push(
            Diagnostic::new("E0101", op, "comparison operators cannot be chained")
                .with_primary_label("second comparison here")
                .with_label(lhs.span, "this is already a comparison")
                .with_help(
                    "write `a < b and b < c`, or add parentheses to compare a comparison's result",
                ),
        );
    }
}

/// One operand of an operator sequence: a factor with its `not` prefixes.
pub struct Operand {
    expr: Expr,
    /// The factor's full span (parentheses included).
    span: Span,
    /// Start offsets of the `not` prefixes, outermost first.
    nots: Vec<u32>,
}

impl Operand {
    pub fn new(expr: Expr, span: Span) -> Self {
        Operand {
            expr,
            span,
            nots: Vec::new(),
        }
    }

    pub fn with_not(mut self, at: u32) -> Self {
        self.nots.insert(0, at);
        self
    }
}

/// A flat sequence `operand (op operand)*` as read by the grammar; `finish`
/// arranges it by precedence. A lone operand (the common case) allocates nothing.
pub enum OpSeq {
    Single(Operand),
    Many(Vec<Operand>, Vec<(BinOp, Span)>),
}

impl OpSeq {
    pub fn new(o: Operand) -> Self {
        OpSeq::Single(o)
    }

    pub fn push(&mut self, op: BinOp, op_span: Span, o: Operand) {
        match self {
            OpSeq::Many(operands, ops) => {
                operands.push(o);
                ops.push((op, op_span));
            }
            OpSeq::Single(_) => {
                let OpSeq::Single(first) =
                    std::mem::replace(self, OpSeq::Many(Vec::new(), Vec::new()))
                else {
                    unreachable!("matched Single above")
                };
                *self = OpSeq::Many(vec![first, o], vec![(op, op_span)]);
            }
        }
    }

    pub fn finish(self, sink: &mut Sink<'_>) -> Expr {
        let (operands, ops) = match self {
            OpSeq::Single(o) if o.nots.is_empty() => return o.expr,
            OpSeq::Single(o) => (vec![o], Vec::new()),
            OpSeq::Many(operands, ops) => (operands, ops),
        };
        let mut c = Climb {
            operands,
            ops,
            i: 0,
            sink,
        };
        c.expr(0).0
    }
}

const NOT_PREC: u8 = 3;
const CMP_PREC: u8 = 4;

fn prec(op: BinOp) -> u8 {
    match op {
        BinOp::Or => 1,
        BinOp::And => 2,
        BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => CMP_PREC,
        BinOp::BitOr => 5,
        BinOp::BitXor => 6,
        BinOp::BitAnd => 7,
        BinOp::Add | BinOp::Sub => 8,
        BinOp::Mul | BinOp::Div | BinOp::FloorDiv | BinOp::Mod | BinOp::MatMul => 9,
        BinOp::Pow => 10,
    }
}

/// Precedence climbing over an `OpSeq`: `ops[k]` sits between `operands[k]` and
/// `operands[k + 1]`; `i` is the current operand (and the next operator).
struct Climb<'s, 'a> {
    operands: Vec<Operand>,
    ops: Vec<(BinOp, Span)>,
    i: usize,
    sink: &'s mut Sink<'a>,
}

impl Climb<'_, '_> {
    /// Reads operators of precedence `min` or more; returns the expression and its
    /// full span (parentheses of the outer operands included).
    fn expr(&mut self, min: u8) -> (Expr, Span) {
        let (mut lhs, mut full) = self.prefix(min);
        let mut lhs_is_cmp = false;
        // one report per chain: `a < b < c < …` is one mistake
        let mut chain_reported = false;
        while let Some(&(op, op_span)) = self.ops.get(self.i) {
            let p = prec(op);
            if p < min {
                break;
            }
            self.i += 1;
            let (rhs, rfull) = self.expr(p + 1);
            if op.is_comparison() && lhs_is_cmp && !chain_reported {
                self.sink.chained_comparison(&lhs, op_span);
                chain_reported = true;
            }
            full = Span::new(full.start, rfull.end);
            lhs = Expr::new(
                ExprKind::Binary {
                    op,
                    lhs: Box::new(lhs),
                    rhs: Box::new(rhs),
                },
                full,
            );
            lhs_is_cmp = op.is_comparison();
        }
        (lhs, full)
    }

    fn prefix(&mut self, min: u8) -> (Expr, Span) {
        let o = &mut self.operands[self.i];
        if !o.nots.is_empty() {
            // every `not` of this operand applies to the same comparison-level
            // operand: wrap it iteratively (no recursion per `not`)
            let nots = std::mem::take(&mut o.nots);
            let at = nots[0];
            if min > NOT_PREC {
                self.sink.diags.push(
                    Diagnostic::new(
                        "E0101",
                        Span::new(at, at + 3),
                        "`not` cannot follow this operator",
                    )
                    .with_primary_label("`not` binds more loosely than the operator before it")
                    .with_help("put the negation in parentheses: `a == (not b)`"),
                );
            }
            let (mut e, ifull) = self.expr(CMP_PREC);
            for &start in nots.iter().rev() {
                e = Expr::new(
                    ExprKind::Unary {
                        op: UnaryOp::Not,
                        operand: Box::new(e),
                    },
                    Span::new(start, ifull.end),
                );
            }
            return (e, Span::new(at, ifull.end));
        }
        let placeholder = Expr::new(ExprKind::Error, o.span);
        (std::mem::replace(&mut o.expr, placeholder), o.span)
    }
}

fn aug_op(t: Tok<'_>) -> Option<BinOp> {
    Some(match t {
        Tok::PlusEq => BinOp::Add,
        Tok::MinusEq => BinOp::Sub,
        Tok::StarEq => BinOp::Mul,
        Tok::SlashEq => BinOp::Div,
        Tok::DoubleSlashEq => BinOp::FloorDiv,
        Tok::PercentEq => BinOp::Mod,
        Tok::DoubleStarEq => BinOp::Pow,
        Tok::AtEq => BinOp::MatMul,
        Tok::AmpEq => BinOp::BitAnd,
        Tok::PipeEq => BinOp::BitOr,
        Tok::CaretEq => BinOp::BitXor,
        _ => return None,
    })
}

pub fn sp(l: u32, r: u32) -> Span {
    Span::new(l, r.max(l))
}

/// The end of a block: the end of its last statement (`default` when empty).
pub fn block_end(stmts: &[Stmt], default: u32) -> u32 {
    stmts.last().map_or(default, |s| s.span.end)
}

/// The value of adjacent string literals (concatenated, like Python).
pub fn str_value(parts: &[&str]) -> String {
    if let [one] = parts {
        return lexer::unescape(one);
    }
    parts.iter().map(|p| lexer::unescape(p)).collect()
}

pub fn make_function(
    name: Ident,
    type_params: Vec<TypeParam>,
    params: Vec<Param>,
    ret: Option<TypeExpr>,
    body: Vec<Stmt>,
    header_span: Span,
) -> Box<Function> {
    let docstring = match body.first().map(|s| &s.kind) {
        Some(StmtKind::Expr(Expr {
            kind: ExprKind::Str(s),
            ..
        })) => Some(clean_docstring(s)),
        _ => None,
    };
    let end = block_end(&body, header_span.end);
    Box::new(Function {
        decorators: Vec::new(),
        name,
        type_params,
        params,
        ret,
        docstring,
        body,
        span: Span::new(header_span.start, end),
        header_span,
    })
}

/// Docstring text without its common indentation and surrounding blank lines
/// (what Python's `inspect.cleandoc` does).
fn clean_docstring(s: &str) -> String {
    let mut lines = super::lines::lines(s);
    let first = lines.next().unwrap_or("").trim();
    let rest: Vec<&str> = lines.collect();
    let indent = rest
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let mut out: Vec<&str> = Vec::with_capacity(rest.len() + 1);
    out.push(first);
    for l in &rest {
        // `get`: whitespace of other widths (U+3000) must not split a character
        out.push(l.get(indent..).map_or_else(|| l.trim(), str::trim_end));
    }
    while out.last().is_some_and(|l| l.is_empty()) {
        out.pop();
    }
    while out.first().is_some_and(|l| l.is_empty()) {
        out.remove(0);
    }
    out.join("\n")
}

fn describe_expr(e: &Expr) -> &'static str {
    match &e.kind {
        ExprKind::Int(_)
        | ExprKind::Float(_)
        | ExprKind::Str(_)
        | ExprKind::Bool(_)
        | ExprKind::None => "a literal",
        ExprKind::Call { .. } => "a function call",
        ExprKind::Binary { op, .. } if op.is_comparison() => "a comparison",
        ExprKind::Binary { .. } | ExprKind::Unary { .. } => "an operator expression",
        ExprKind::IfElse { .. } => "a conditional expression",
        ExprKind::Tuple(_) => "a tuple",
        ExprKind::List(_) => "a list",
        ExprKind::Dict(_) => "a dict",
        ExprKind::Name(_) => "a name",
        ExprKind::Subscript { .. } => "a subscript",
        ExprKind::Attribute { .. } => "an attribute",
        ExprKind::Error => "an invalid expression",
    }
}

/// Reports E0110 unless `target` can be assigned to. `single`: the statement
/// takes one target (augmented or annotated assignment), not a tuple.
pub fn check_target(sink: &mut Sink<'_>, target: &Expr, single: bool) {
    match &target.kind {
        ExprKind::Name(_) | ExprKind::Subscript { .. } | ExprKind::Attribute { .. } | ExprKind::Error => {}
        ExprKind::Tuple(items) if !single && !items.is_empty() => {
            for t in items {
                check_target(sink, t, true);
            }
        }
        ExprKind::Tuple(_) if single => sink.diags.push(
            Diagnostic::new("E0110", target.span, "a tuple cannot be the target of this assignment")
                .with_primary_label("only one name, subscript or attribute is allowed here")
                .with_help("assign each element on its own line"),
        ),
        _ => sink.diags.push(
            Diagnostic::new("E0110", target.span, format!("cannot assign to {}", describe_expr(target)))
                .with_primary_label("not an assignable place")
                .with_help(if matches!(&target.kind, ExprKind::Binary { op, .. } if op.is_comparison()) {
                    "to compare, use `==` in a condition; to assign, put a name on the left of `=`"
                } else {
                    "the left of `=` must be a name, a subscript `t[i]`, an attribute `x.a` or a tuple of these"
                }),
        ),
    }
}

/// Reports E0112 for each positional argument after a keyword argument.
pub fn check_args(sink: &mut Sink<'_>, args: &[Arg]) {
    let mut first_kw: Option<&Arg> = None;
    for a in args {
        match (&a.name, first_kw) {
            (Some(_), None) => first_kw = Some(a),
            (None, Some(kw)) => sink.diags.push(
                Diagnostic::new(
                    "E0112",
                    a.span,
                    "positional argument follows a keyword argument",
                )
                .with_primary_label("positional argument")
                .with_label(kw.span, "first keyword argument here")
                .with_help("move positional arguments before the keyword arguments"),
            ),
            _ => {}
        }
    }
}

/// Parses one item's text (see `syntax::parse_item`).
pub fn parse(text: &str) -> ParsedItem {
    let lexed = lexer::lex(text);
    let mut diagnostics = lexed.diagnostics;
    if lexed.tokens.is_empty() {
        return ParsedItem {
            item: None,
            diagnostics,
        };
    }
    let tokens = &lexed.tokens;
    let ctx = ErrCtx {
        text,
        tokens,
        unclosed: &lexed.unclosed,
    };
    let mut syntax: Vec<Diagnostic> = Vec::new();
    // Parse; while an error sits inside a closed bracket group, report it, cut the
    // bad argument/element/index out (an ERROR_EXPR token takes its place) and parse
    // again, so that the rest of the statement keeps its tree. Errors that remain
    // are recovered at statement level.
    let mut toks: Vec<Spanned<'_>> = tokens.clone();
    let mut repaired: Vec<u32> = Vec::new();
    let (item, sink_diags) = loop {
        let mut sink = Sink {
            recovered: Vec::new(),
            diags: Vec::new(),
            tokens: &toks,
        };
        let result =
            tessera::ItemParser::new().parse(&mut sink, toks.iter().map(|&t| Ok::<_, ()>(t)));
        let mut errors: Vec<ParseError<u32, Tok<'_>, ()>> =
            sink.recovered.drain(..).map(|r| r.error).collect();
        let item = match result {
            Ok(item) => item.map(|b| *b),
            Err(e) => {
                errors.push(e);
                None
            }
        };
        // bounded: at most MAX_REPAIRS re-parses, and fewer for very large items
        let repair = if repaired.len() < MAX_REPAIRS
            && (repaired.len() + 1) * toks.len() <= REPAIR_TOKEN_BUDGET
        {
            errors
                .iter()
                .enumerate()
                .find_map(|(i, e)| repair_range(&toks, e, &repaired).map(|r| (i, r)))
        } else {
            None
        };
        if let Some((i, (range, at))) = repair {
            syntax.push(ctx.convert(errors.swap_remove(i)));
            repaired.push(at);
            let cut = if range.is_empty() {
                (at, Tok::ErrorExpr, at)
            } else {
                (toks[range.start].0, Tok::ErrorExpr, toks[range.end - 1].2)
            };
            drop(errors);
            drop(sink);
            toks.splice(range, [cut]);
            continue;
        }
        for e in errors {
            // an error on a cut-out part repeats one already reported
            if !matches!(
                e,
                ParseError::UnrecognizedToken {
                    token: (_, Tok::ErrorExpr, _),
                    ..
                }
            ) {
                syntax.push(ctx.convert(e));
            }
        }
        break (item, sink.diags);
    };
    // every later pass recurses through the tree: refuse one too deep for them
    let mut item = item;
    if let Some(item) = &mut item {
        diagnostics.extend(super::depth::limit_depth(item));
    }
    let mut sink_diags = sink_diags;
    // one report per place: recovery can meet the same bad token twice
    syntax.sort_by_key(|d| (d.span.start, d.span.end));
    syntax.dedup_by(|a, b| a.span == b.span && a.code == b.code);
    // an unclosed bracket is reported once, however many errors it caused
    let mut seen_unclosed = false;
    syntax.retain(|d| {
        if d.code == "E0102" && d.message.starts_with("unclosed") {
            !std::mem::replace(&mut seen_unclosed, true)
        } else {
            true
        }
    });
    // a line the lexer already reported as mis-indented needs no second report,
    // nor does an error that follows an invalid character on its line
    syntax.retain(|d| {
        !diagnostics.iter().any(|l| match l.code {
            "E0104" | "E0105" => l.span.start == d.span.start,
            "E0108" => same_line(text, l.span.start, d.span.start),
            "E0107" => {
                l.span.start <= d.span.start
                    && !text[l.span.start as usize..d.span.start as usize].contains('\n')
            }
            _ => false,
        })
    });
    // an indented line right after a line with a syntax error is most likely its
    // continuation (`x = a +` / `    b`): the first report is enough
    diagnostics.retain(|l| {
        l.code != "E0105" || {
            let line_start = super::lines::line_start(text, l.span.start as usize);
            let prev_start = super::lines::line_start(text, line_start.saturating_sub(1));
            line_start == 0
                || !syntax
                    .iter()
                    .any(|d| (prev_start as u32..line_start as u32).contains(&d.span.start))
        }
    });
    diagnostics.extend(syntax);
    diagnostics.append(&mut sink_diags);
    if let Some(item) = &item {
        check_placement(item, &mut diagnostics);
    }
    diagnostics.sort_by_key(|d| (d.span.start, d.span.end));
    ParsedItem { item, diagnostics }
}

/// At most this many repairs (re-parses) per item...
const MAX_REPAIRS: usize = 16;
/// ...and at most this many tokens parsed in all, so that a huge broken item
/// costs a few parses, not sixteen.
const REPAIR_TOKEN_BUDGET: usize = 200_000;

fn is_open(t: Tok<'_>) -> bool {
    matches!(t, Tok::LParen | Tok::LBracket | Tok::LBrace)
}

fn is_close(t: Tok<'_>) -> bool {
    matches!(t, Tok::RParen | Tok::RBracket | Tok::RBrace)
}

fn is_layout(t: Tok<'_>) -> bool {
    matches!(
        t,
        Tok::Newline | Tok::Indent | Tok::Dedent | Tok::EmptyBlock
    )
}

/// For an error on a token inside a closed bracket group: the token range of the
/// comma- (or, in `[]`/`{}`, colon-) separated part holding it, after a `name=`
/// keyword prefix, and the error token's offset. `None` when the error is not in
/// such a group, the group is a `def` parameter list or an import list, the
/// brackets do not match, or this token already caused a repair.
fn repair_range(
    toks: &[Spanned<'_>],
    e: &ParseError<u32, Tok<'_>, ()>,
    repaired: &[u32],
) -> Option<(std::ops::Range<usize>, u32)> {
    let ParseError::UnrecognizedToken {
        token: (l, tok, r), ..
    } = e
    else {
        return None;
    };
    if *tok == Tok::ErrorExpr || repaired.contains(l) {
        return None;
    }
    let from = toks.partition_point(|t| t.0 < *l);
    let idx = from
        + toks[from..]
            .iter()
            .position(|t| t.0 == *l && t.2 == *r && t.1 == *tok)?;
    // the innermost group opened before the error token
    let mut depth = 0usize;
    let mut open = None;
    for j in (0..idx).rev() {
        let t = toks[j].1;
        if is_close(t) {
            depth += 1;
        } else if is_open(t) {
            if depth == 0 {
                open = Some(j);
                break;
            }
            depth -= 1;
        } else if is_layout(t) {
            return None;
        }
    }
    let open = open?;
    let opener = toks[open].1;
    // not in parameter lists (the header recovery keeps their names) or imports
    if opener == Tok::LParen
        && open >= 2
        && matches!(
            (toks[open - 2].1, toks[open - 1].1),
            (Tok::Def, Tok::Name(_))
        )
    {
        return None;
    }
    if open >= 1 && toks[open - 1].1 == Tok::Import {
        return None;
    }
    // its closer, on the same logical line
    let mut depth = 0usize;
    let mut close = None;
    for (j, t) in toks.iter().enumerate().skip(open + 1) {
        if is_open(t.1) {
            depth += 1;
        } else if is_close(t.1) {
            if depth == 0 {
                close = Some(j);
                break;
            }
            depth -= 1;
        } else if is_layout(t.1) {
            return None;
        }
    }
    let close = close?;
    let matching = match opener {
        Tok::LParen => Tok::RParen,
        Tok::LBracket => Tok::RBracket,
        _ => Tok::RBrace,
    };
    if toks[close].1 != matching {
        return None;
    }
    let is_sep = |t: Tok<'_>| t == Tok::Comma || (opener != Tok::LParen && t == Tok::Colon);
    let mut start = open + 1;
    let mut depth = 0usize;
    for (j, t) in toks.iter().enumerate().take(idx).skip(open + 1) {
        if is_open(t.1) {
            depth += 1;
        } else if is_close(t.1) {
            depth = depth.saturating_sub(1);
        } else if depth == 0 && is_sep(t.1) {
            start = j + 1;
        }
    }
    let mut end = close;
    let mut depth = 0usize;
    for (j, t) in toks.iter().enumerate().take(close).skip(idx) {
        if is_open(t.1) {
            depth += 1;
        } else if is_close(t.1) {
            depth = depth.saturating_sub(1);
        } else if depth == 0 && is_sep(t.1) {
            end = j;
            break;
        }
    }
    if opener == Tok::LParen
        && start + 2 <= idx
        && matches!(
            (toks[start].1, toks[start + 1].1),
            (Tok::Name(_), Tok::Assign)
        )
    {
        start += 2;
    }
    let end = end.max(start);
    Some((start..end, *l))
}

/// Whether two offsets are on the same line of `text`.
fn same_line(text: &str, a: u32, b: u32) -> bool {
    let (lo, hi) = (a.min(b) as usize, a.max(b) as usize);
    !text[lo..hi.min(text.len())].contains('\n')
}

struct ErrCtx<'t, 'a> {
    text: &'t str,
    tokens: &'t [Spanned<'a>],
    unclosed: &'t [(Span, char)],
}

fn closer(open: char) -> char {
    match open {
        '(' => ')',
        '[' => ']',
        _ => '}',
    }
}

impl ErrCtx<'_, '_> {
    fn line_of(&self, offset: u32) -> usize {
        super::lines::line_number(self.text, offset as usize)
    }

    /// The innermost bracket left open at the end that was opened before `at` on an
    /// earlier line (the likely cause of an error at `at`).
    fn unclosed_before(&self, at: u32) -> Option<(Span, char)> {
        let &(span, c) = self.unclosed.iter().rev().find(|(s, _)| s.end <= at)?;
        (at as usize >= self.text.len() || self.line_of(span.start) < self.line_of(at))
            .then_some((span, c))
    }

    fn unclosed_diag(&self, open: Span, c: char, at: Span, expected: &[String]) -> Diagnostic {
        let mut d = Diagnostic::new("E0102", open, format!("unclosed `{c}`"))
            .with_primary_label(format!("`{c}` opened here is never closed"))
            .with_help(format!("add `{}` where the bracketed part ends", closer(c)));
        let found = if at.start as usize >= self.text.len() {
            "the input ends here".to_string()
        } else {
            let exp = human_expected(expected);
            if exp.is_empty() {
                "the parser stopped here".to_string()
            } else {
                format!("expected {exp} here")
            }
        };
        d = d.with_label(at, found);
        d
    }

    fn convert(&self, e: ParseError<u32, Tok<'_>, ()>) -> Diagnostic {
        match e {
            ParseError::UnrecognizedToken {
                token: (l, tok, r),
                expected,
            } => self.unrecognized(Span::new(l, r), tok, &expected),
            ParseError::UnrecognizedEof { location, expected } => {
                let at = Span::new(location, location);
                if let Some((open, c)) = self.unclosed.last().copied() {
                    return self.unclosed_diag(open, c, at, &expected);
                }
                if only_block(&expected) {
                    return self.expected_block(self.last_line_span());
                }
                let exp = human_expected(&expected);
                let d = Diagnostic::new("E0102", self.last_line_span(), "unexpected end of input")
                    .with_primary_label("the item ends here");
                d.with_help(if exp.is_empty() {
                    "complete the last line, or remove it".to_string()
                } else {
                    format!("expected {exp}")
                })
            }
            ParseError::ExtraToken { token: (l, tok, r) } => {
                self.unrecognized(Span::new(l, r), tok, &[])
            }
            ParseError::InvalidToken { location } => Diagnostic::new(
                "E0101",
                Span::new(location, location + 1),
                "unexpected token",
            )
            .with_help("remove this character, or put it inside a string"),
            ParseError::User { .. } => Diagnostic::new("E0101", Span::new(0, 0), "syntax error")
                .with_help("compare this item with the grammar in docs/language.md"),
        }
    }

    /// The span of the last real token (the end of the item's last line).
    fn last_line_span(&self) -> Span {
        self.tokens
            .iter()
            .rev()
            .find(|t| {
                !matches!(
                    t.1,
                    Tok::Newline | Tok::Dedent | Tok::Indent | Tok::EmptyBlock
                )
            })
            .map_or(Span::new(0, 0), |t| Span::new(t.0, t.2))
    }

    fn expected_block(&self, at: Span) -> Diagnostic {
        Diagnostic::new("E0106", at, "expected an indented block")
            .with_primary_label("the block should start on the next line, indented")
            .with_help("indent the body of the statement ending in `:` (or write `pass` for an empty body)")
    }

    /// The real token that follows a zero-width layout token at `at`.
    fn token_at(&self, at: u32) -> Span {
        let i = self.tokens.partition_point(|t| t.0 < at);
        self.tokens[i..]
            .iter()
            .find(|t| !matches!(t.1, Tok::Indent | Tok::Dedent | Tok::EmptyBlock))
            .map_or(Span::new(at, at), |t| Span::new(t.0, t.2))
    }

    fn unrecognized(&self, span: Span, tok: Tok<'_>, expected: &[String]) -> Diagnostic {
        let at_end = span.start as usize >= self.text.len();
        if let Some((open, c)) = self.unclosed_before(span.start) {
            if at_end || !matches!(tok, Tok::Indent) {
                return self.unclosed_diag(open, c, span, expected);
            }
        }
        if tok == Tok::Indent {
            return Diagnostic::new("E0105", self.token_at(span.start), "unexpected indent")
                .with_primary_label("this line is indented more than the line before it")
                .with_help(
                    "only the body of a `def`, `if`, `elif`, `else`, `for` or `while` is indented",
                );
        }
        // (only right after a block header's `:`; after a recovered error the
        // block is one option among others)
        let after_colon = self.text.get(self.last_line_before(span.start).range()) == Some(":");
        if only_block(expected) && after_colon {
            let at = match tok {
                Tok::Dedent | Tok::Newline => self.last_line_before(span.start),
                _ => span,
            };
            return self.expected_block(at);
        }
        // (a missing final newline reads as one: same report as with it)
        let found = if at_end && tok == Tok::Dedent {
            "end of input".to_string()
        } else if let Tok::Int(_) | Tok::Float(_) = tok {
            format!("number `{}`", &self.text[span.range()])
        } else {
            tok.describe()
        };
        let span = match tok {
            Tok::Dedent => self.token_at(span.start),
            _ => span,
        };
        let exp = human_expected(expected);
        let mut d = Diagnostic::new("E0101", span, format!("unexpected {found}"));
        let prev = self.tokens[..self.tokens.partition_point(|t| t.0 < span.start)]
            .last()
            .map(|t| t.1);
        match (hint(tok, prev, expected), exp.is_empty()) {
            (Some(h), true) => d = d.with_help(h),
            (Some(h), false) => d = d.with_primary_label(format!("expected {exp}")).with_help(h),
            (None, false) => d = d.with_help(format!("expected {exp}")),
            (None, true) => {
                d = d.with_help("remove it, or check the line for a missing operator or bracket")
            }
        }
        d
    }

    /// The last real token before `at` (for errors found on a layout token).
    fn last_line_before(&self, at: u32) -> Span {
        let i = self.tokens.partition_point(|t| t.0 < at);
        self.tokens[..i]
            .iter()
            .rev()
            .find(|t| {
                !matches!(
                    t.1,
                    Tok::Newline | Tok::Dedent | Tok::Indent | Tok::EmptyBlock
                )
            })
            .map_or(Span::new(at, at), |t| Span::new(t.0, t.2))
    }
}

/// The parser wants an indented block and nothing else.
fn only_block(expected: &[String]) -> bool {
    !expected.is_empty() && expected.iter().all(|e| e == "INDENT" || e == "EMPTY_BLOCK")
}

/// A more specific help line for common mistakes.
fn hint(tok: Tok<'_>, prev: Option<Tok<'_>>, expected: &[String]) -> Option<String> {
    let expects = |s: &str| expected.iter().any(|e| e == s);
    if let Some(Tok::Name(kw)) = prev {
        if let Some(h) = python_only(kw) {
            return Some(h);
        }
        if matches!(tok, Tok::Str(_))
            && matches!(
                kw.to_ascii_lowercase().as_str(),
                "r" | "b" | "f" | "u" | "rb" | "br" | "fr" | "rf"
            )
        {
            return Some(format!(
                "string prefixes such as `{kw}\"...\"` are not supported: write a plain string"
            ));
        }
    }
    match tok {
        Tok::Name("is") => Some("use `==` and `!=` to compare (there is no `is`)".into()),
        Tok::Name(kw) if python_only(kw).is_some() => python_only(kw),
        Tok::Not if !expects("NAME") => {
            Some("`in` is only used in `for` loops; there is no `not in` test".into())
        }
        Tok::In if !expects("NAME") => Some("`in` is only used in `for` loops".into()),
        Tok::For if expects("\"]\"") || expects("\")\"") => {
            Some("comprehensions are not supported; build the value with a `for` loop".into())
        }
        Tok::Assign if expects("NEWLINE") && !expects("\"==\"") => {
            Some("chained assignment `a = b = c` is not supported: assign on separate lines".into())
        }
        Tok::Newline if expects("\":\"") => {
            Some("add `:` at the end of this line to open a block".into())
        }
        Tok::Assign if expects("\"==\"") || expects("\":\"") => {
            Some("use `==` to compare; `=` assigns".into())
        }
        Tok::Def => {
            Some("functions are defined at top level (nested `def` is not supported)".into())
        }
        Tok::Import | Tok::From => Some("imports go at top level".into()),
        Tok::Else | Tok::Elif => Some(format!(
            "`{}` must line up with an `if` whose block ends right above it",
            tok.symbol()
        )),
        Tok::Const => Some(
            "`const` declarations go at top level; in a parameter list write `NAME: const = value`"
                .into(),
        ),
        _ => None,
    }
}

/// Help for Python statements and keywords that Tessera does not have.
fn python_only(word: &str) -> Option<String> {
    let what = match word {
        "class" => "classes are not part of Tessera: use functions and kernels",
        "lambda" => "`lambda` is not supported: define a function with `def`",
        "with" | "try" | "except" | "finally" | "raise" | "assert" | "del" | "global"
        | "nonlocal" | "yield" | "async" | "await" => {
            "this Python statement is not part of Tessera"
        }
        "print" => "`print` is a function here: write `print(x)`",
        _ => return None,
    };
    Some(what.to_string())
}

const EXPR_START: &[&str] = &[
    "NAME",
    "INT",
    "FLOAT",
    "STR",
    "\"(\"",
    "\"[\"",
    "\"{\"",
    "\"-\"",
    "\"+\"",
    "\"~\"",
    "\"not\"",
    "\"True\"",
    "\"False\"",
    "\"None\"",
    "\"inf\"",
];
const STMT_START: &[&str] = &[
    "\"return\"",
    "\"pass\"",
    "\"break\"",
    "\"continue\"",
    "\"if\"",
    "\"for\"",
    "\"while\"",
];
const OPERATORS: &[&str] = &[
    "\"+\"", "\"-\"", "\"*\"", "\"/\"", "\"//\"", "\"%\"", "\"**\"", "\"@\"", "\"&\"", "\"|\"",
    "\"^\"", "\"==\"", "\"!=\"", "\"<\"", "\"<=\"", "\">\"", "\">=\"", "\"and\"", "\"or\"",
    "\"if\"", "\"(\"", "\"[\"", "\".\"",
];
const AUG: &[&str] = &[
    "\"+=\"", "\"-=\"", "\"*=\"", "\"/=\"", "\"//=\"", "\"%=\"", "\"**=\"", "\"@=\"", "\"&=\"",
    "\"|=\"", "\"^=\"",
];

/// lalrpop's expected terminals in human words: "`:`, `)` or an expression".
pub fn human_expected(expected: &[String]) -> String {
    let has = |s: &str| expected.iter().any(|e| e == s);
    let mut words: Vec<String> = Vec::new();
    let mut skip: Vec<&str> = Vec::new();
    let expr = has("NAME") && has("INT") && has("\"(\"");
    if expr {
        skip.extend(EXPR_START);
    }
    let stmt = expr && has("\"pass\"") && has("\"return\"");
    if stmt {
        skip.extend(STMT_START);
    }
    let ops = OPERATORS
        .iter()
        .filter(|o| has(o) && !skip.contains(o))
        .count()
        >= 5;
    if ops {
        skip.extend(OPERATORS);
    }
    if AUG.iter().filter(|o| has(o)).count() >= 3 {
        skip.extend(AUG);
    }
    let mut tail: Vec<String> = Vec::new();
    for e in expected {
        if skip.contains(&e.as_str()) {
            continue;
        }
        let w = match e.as_str() {
            "NAME" => "a name".to_string(),
            "INT" | "FLOAT" => "a number".to_string(),
            "STR" => "a string".to_string(),
            "NEWLINE" => "end of line".to_string(),
            "INDENT" => "an indented block".to_string(),
            "EMPTY_BLOCK" | "ERROR_EXPR" => continue,
            "DEDENT" => "end of the block".to_string(),
            other => format!("`{}`", other.trim_matches('"')),
        };
        if !words.contains(&w) {
            words.push(w);
        }
    }
    if ops {
        tail.push("an operator".into());
    }
    if stmt {
        tail.push("a statement".into());
    } else if expr {
        tail.push("an expression".into());
    }
    // `end of line` reads best last
    if let Some(i) = words.iter().position(|w| w == "end of line") {
        let w = words.remove(i);
        tail.push(w);
    }
    words.extend(tail);
    match words.len() {
        0 => String::new(),
        1 => words.pop().unwrap(),
        n => {
            let last = words.pop().unwrap();
            let mut s = words.join(", ");
            if n > 8 {
                s = words[..6].join(", ") + ", ...";
            }
            format!("{s} or {last}")
        }
    }
}

/// E0114 (`break`/`continue` outside a loop) and E0115 (`return` outside a `def`).
fn check_placement(item: &Item, out: &mut Vec<Diagnostic>) {
    match item {
        Item::Function(f) => walk(&f.body, true, false, out),
        Item::Stmt(s) => walk(std::slice::from_ref(s), false, false, out),
        _ => {}
    }
}

fn walk(stmts: &[Stmt], in_def: bool, in_loop: bool, out: &mut Vec<Diagnostic>) {
    for s in stmts {
        match &s.kind {
            StmtKind::Break | StmtKind::Continue if !in_loop => {
                let kw = if matches!(s.kind, StmtKind::Break) {
                    "break"
                } else {
                    "continue"
                };
                out.push(
                    Diagnostic::new("E0114", s.span, format!("`{kw}` outside a loop"))
                        .with_primary_label(format!(
                            "`{kw}` must be inside a `for` or `while` body"
                        ))
                        .with_help("remove it, or move it into the loop it is meant for"),
                );
            }
            StmtKind::Return(_) if !in_def => out.push(
                Diagnostic::new("E0115", s.span, "`return` outside a function")
                    .with_primary_label("not inside a `def`")
                    .with_help("`return` is only allowed in the body of a `def`"),
            ),
            StmtKind::If { branches, orelse } => {
                for (_, b) in branches {
                    walk(b, in_def, in_loop, out);
                }
                if let Some(b) = orelse {
                    walk(b, in_def, in_loop, out);
                }
            }
            StmtKind::For { body, .. } | StmtKind::While { body, .. } => {
                walk(body, in_def, true, out)
            }
            _ => {}
        }
    }
}
