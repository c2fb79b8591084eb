//! The nesting-depth limit, and iterative drops of deep trees.
//!
//! Every pass after parsing (checker, constant evaluation, each IR lowering, its
//! dump and verifier, the executors, the editor queries) walks expressions and
//! blocks recursively. Rather than rewrite each of them as a loop, the depth of
//! a tree is bounded once, right after parsing: `limit_depth` measures an item
//! without recursion and replaces each part nested deeper than `MAX_DEPTH` by an
//! error node, with E0116, so that no later pass ever sees a deeper tree. A flat chain of `n` binary
//! operators (`1 + 1 + …`), attributes (`x.T.T…`), calls (`f()()…`) or
//! conditional expressions is `n` levels deep, so generated sums of thousands of
//! terms are accepted.
//!
//! The limit is sized to the stack the threads that run queries get
//! (`crate::stack::STACK_SIZE`): `tests::every_pass_handles_the_limit` runs every
//! pass on exactly `MAX_DEPTH` levels on a thread of that size, in a debug
//! build (whose frames are the largest).
//!
//! Dropping a tree recurses too, and a deep tree exists before it is measured
//! (inside the parser, and when it is refused): `Drop for Expr` and `Drop for
//! Stmt` take the children out and drop them from a work list.

use super::ast::*;
use super::span::Span;
use crate::diag::Diagnostic;

/// How deeply expressions and blocks may nest: each operator, call, subscript,
/// attribute, conditional expression, list or tuple level and each block counts
/// one.
pub const MAX_DEPTH: usize = 10_000;

/// Refuses what `item` nests deeper than `MAX_DEPTH`: each expression that goes
/// too deep (counting the blocks around it) becomes `ExprKind::Error`, each
/// statement too deep in blocks `StmtKind::Error`, with one E0116 for each, so
/// that the rest of the item keeps its shape (the names it assigns, its other
/// statements).
pub fn limit_depth(item: &mut Item) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let mut stmts: Vec<(&mut Stmt, usize)> = Vec::new();
    match item {
        Item::Import(_) | Item::FromImport(_) => {}
        Item::Const(c) => {
            limit_type(c.ty.as_mut(), 0, &mut out);
            limit_expr(&mut c.value, 0, &mut out);
        }
        Item::Function(f) => {
            for d in &mut f.decorators {
                for a in d.args.iter_mut().flatten() {
                    limit_expr(&mut a.value, 0, &mut out);
                }
            }
            for p in &mut f.params {
                limit_type(p.ty.as_mut(), 0, &mut out);
                if let Some(e) = &mut p.default {
                    limit_expr(e, 0, &mut out);
                }
            }
            limit_type(f.ret.as_mut(), 0, &mut out);
            stmts.extend(f.body.iter_mut().map(|s| (s, 1)));
        }
        Item::Stmt(s) => stmts.push((s, 0)),
    }
    while let Some((s, b)) = stmts.pop() {
        // a statement's expressions are a level below it
        if b >= MAX_DEPTH {
            out.push(too_deep(s.span));
            s.kind = StmtKind::Error;
            continue;
        }
        match &mut s.kind {
            StmtKind::Expr(e) | StmtKind::Return(Some(e)) => limit_expr(e, b, &mut out),
            StmtKind::Assign { target, ty, value } => {
                limit_expr(target, b, &mut out);
                limit_type(ty.as_mut(), b, &mut out);
                limit_expr(value, b, &mut out);
            }
            StmtKind::AugAssign { target, value, .. } => {
                limit_expr(target, b, &mut out);
                limit_expr(value, b, &mut out);
            }
            StmtKind::If { branches, orelse } => {
                // an `elif` chain is flat: each branch's block is one level
                for (c, body) in branches {
                    limit_expr(c, b, &mut out);
                    stmts.extend(body.iter_mut().map(|s| (s, b + 1)));
                }
                stmts.extend(orelse.iter_mut().flatten().map(|s| (s, b + 1)));
            }
            StmtKind::For { iter, body, .. } => {
                limit_expr(iter, b, &mut out);
                stmts.extend(body.iter_mut().map(|s| (s, b + 1)));
            }
            StmtKind::While { cond, body } => {
                limit_expr(cond, b, &mut out);
                stmts.extend(body.iter_mut().map(|s| (s, b + 1)));
            }
            StmtKind::Return(None)
            | StmtKind::Break
            | StmtKind::Continue
            | StmtKind::Pass
            | StmtKind::Error => {}
        }
    }
    out.sort_by_key(|d| d.span.start);
    out
}

fn too_deep(at: Span) -> Diagnostic {
    Diagnostic::new("E0116", at, "expression nested too deeply")
        .with_primary_label(format!("more than {MAX_DEPTH} levels deep here"))
        .with_help(
            "split it into several statements: assign parts (partial sums, inner calls) \
             to names first, or move an inner block into a function",
        )
}

/// Replaces `e` (inside `blocks` levels of blocks) by an error if it is too deep.
fn limit_expr(e: &mut Expr, blocks: usize, out: &mut Vec<Diagnostic>) {
    if let Some(at) = deeper_than(Node::Expr(e), MAX_DEPTH.saturating_sub(blocks)) {
        out.push(too_deep(at));
        *e = Expr::new(ExprKind::Error, e.span);
    }
}

fn limit_type(t: Option<&mut TypeExpr>, blocks: usize, out: &mut Vec<Diagnostic>) {
    let Some(mut t) = t else { return };
    // `const const … T` nests through `Const`; `Tensor[…]` holds expressions
    let mut level = blocks + 1;
    let mut inner: &TypeExpr = t;
    while let TypeExprKind::Const(Some(i)) = &inner.kind {
        level += 1;
        inner = i;
    }
    if level > MAX_DEPTH {
        out.push(too_deep(t.span));
        t.kind = TypeExprKind::Const(None);
        return;
    }
    while matches!(t.kind, TypeExprKind::Const(Some(_))) {
        let TypeExprKind::Const(Some(i)) = &mut t.kind else {
            unreachable!("matched above")
        };
        t = i;
    }
    if let TypeExprKind::Generic { args, .. } = &mut t.kind {
        for a in args {
            limit_expr(a, level, out);
        }
    }
}

enum Node<'a> {
    Expr(&'a Expr),
}

/// The span of the first node found deeper than `limit` below `root` (which is
/// level 1), walking with an explicit stack.
fn deeper_than(root: Node<'_>, limit: usize) -> Option<Span> {
    let mut work = vec![(root, 1)];
    while let Some((node, d)) = work.pop() {
        if d > limit {
            let Node::Expr(e) = node;
            return Some(e.span);
        }
        push_children(node, d + 1, &mut work);
    }
    None
}

fn push_children<'a>(node: Node<'a>, d: usize, work: &mut Vec<(Node<'a>, usize)>) {
    match node {
        Node::Expr(e) => match &e.kind {
            ExprKind::Int(_)
            | ExprKind::Float(_)
            | ExprKind::Str(_)
            | ExprKind::Bool(_)
            | ExprKind::None
            | ExprKind::Name(_)
            | ExprKind::Error => {}
            ExprKind::Unary { operand, .. } => work.push((Node::Expr(operand), d)),
            ExprKind::Binary { lhs, rhs, .. } => {
                work.push((Node::Expr(lhs), d));
                work.push((Node::Expr(rhs), d));
            }
            ExprKind::IfElse {
                cond,
                then,
                otherwise,
            } => {
                work.push((Node::Expr(cond), d));
                work.push((Node::Expr(then), d));
                work.push((Node::Expr(otherwise), d));
            }
            ExprKind::Call { func, args } => {
                work.push((Node::Expr(func), d));
                work.extend(args.iter().map(|a| (Node::Expr(&a.value), d)));
            }
            ExprKind::Subscript { value, indices } => {
                work.push((Node::Expr(value), d));
                for i in indices {
                    match i {
                        Index::Expr(e) => work.push((Node::Expr(e), d)),
                        Index::Slice {
                            start, end, step, ..
                        } => work.extend(
                            [start, end, step]
                                .into_iter()
                                .flatten()
                                .map(|e| (Node::Expr(e), d)),
                        ),
                    }
                }
            }
            ExprKind::Attribute { value, .. } => work.push((Node::Expr(value), d)),
            ExprKind::Tuple(v) | ExprKind::List(v) => {
                work.extend(v.iter().map(|e| (Node::Expr(e), d)));
            }
            ExprKind::Dict(v) => {
                for (k, x) in v {
                    work.push((Node::Expr(k), d));
                    work.push((Node::Expr(x), d));
                }
            }
        },
    }
}

/// Moves the children of `kind` out into `out`, leaving it without any.
fn take_expr_children(kind: &mut ExprKind, out: &mut Vec<Expr>) {
    match std::mem::replace(kind, ExprKind::None) {
        ExprKind::Unary { operand, .. } => out.push(*operand),
        ExprKind::Binary { lhs, rhs, .. } => {
            out.push(*lhs);
            out.push(*rhs);
        }
        ExprKind::IfElse {
            cond,
            then,
            otherwise,
        } => {
            out.push(*cond);
            out.push(*then);
            out.push(*otherwise);
        }
        ExprKind::Call { func, args } => {
            out.push(*func);
            out.extend(args.into_iter().map(|a| a.value));
        }
        ExprKind::Subscript { value, indices } => {
            out.push(*value);
            for i in indices {
                match i {
                    Index::Expr(e) => out.push(e),
                    Index::Slice {
                        start, end, step, ..
                    } => out.extend([start, end, step].into_iter().flatten()),
                }
            }
        }
        ExprKind::Attribute { value, .. } => out.push(*value),
        ExprKind::Tuple(v) | ExprKind::List(v) => out.extend(v),
        ExprKind::Dict(v) => {
            for (k, x) in v {
                out.push(k);
                out.push(x);
            }
        }
        leaf => *kind = leaf,
    }
}

fn has_children(kind: &ExprKind) -> bool {
    !matches!(
        kind,
        ExprKind::Int(_)
            | ExprKind::Float(_)
            | ExprKind::Str(_)
            | ExprKind::Bool(_)
            | ExprKind::None
            | ExprKind::Name(_)
            | ExprKind::Error
    )
}

impl Drop for Expr {
    fn drop(&mut self) {
        if !has_children(&self.kind) {
            return;
        }
        let mut work = Vec::new();
        take_expr_children(&mut self.kind, &mut work);
        while let Some(mut e) = work.pop() {
            // `e` is dropped at the end of this iteration without children left,
            // so this `drop` does not recurse
            take_expr_children(&mut e.kind, &mut work);
        }
    }
}

/// Moves the nested blocks of `kind` out into `out` (its expressions drop
/// themselves without recursion).
fn take_blocks(kind: &mut StmtKind, out: &mut Vec<Stmt>) {
    match kind {
        StmtKind::If { branches, orelse } => {
            for (_, b) in branches.iter_mut() {
                out.append(b);
            }
            out.extend(orelse.take().into_iter().flatten());
        }
        StmtKind::For { body, .. } | StmtKind::While { body, .. } => out.append(body),
        _ => {}
    }
}

impl Drop for Stmt {
    fn drop(&mut self) {
        let mut work = Vec::new();
        take_blocks(&mut self.kind, &mut work);
        while let Some(mut s) = work.pop() {
            take_blocks(&mut s.kind, &mut work);
        }
    }
}

impl Drop for TypeExpr {
    fn drop(&mut self) {
        let mut next = match &mut self.kind {
            TypeExprKind::Const(inner) => inner.take(),
            _ => None,
        };
        while let Some(mut t) = next {
            next = match &mut t.kind {
                TypeExprKind::Const(inner) => inner.take(),
                _ => None,
            };
        }
    }
}
