//! Unit tests of the lexer, the parser, item splitting and dim expressions.

use super::ast::*;
#[allow(unused_imports)]
use super::lexer::{lex, Tok};
use super::*;

/// The reference programs of LANGUAGE.md sections 3 and 9.
pub(crate) const REFERENCE: &[&str] = &[
    r#"from std.nn import softmax, layer_norm      # stdlib/ is the package `std`
import std.linalg as la

const BLOCK = 1024

@kernel(grid=(cdiv(N, BLOCK),), num_warps=4)
def vadd(x: Tensor["N", f32], y: Tensor["N", f32], out: Tensor["N", f32]):
    i = program_id(0) * BLOCK
    store(out[i : i + BLOCK], load(x[i : i + BLOCK]) + load(y[i : i + BLOCK]))

def scaled_sum(a: Tensor["M", "N", f32], b: Tensor["M", "N", f32]) -> Tensor["M", "N", f32]:
    return a * 0.5 + b
"#,
    r#"@kernel(grid=(M,), num_warps=4)
def softmax_rows(x: Tensor["M", "N", f32], out: Tensor["M", "N", f32], BLOCK: const = 1024):
    row = program_id(0)
    v = load(x[row, 0 : BLOCK], other=-inf)
    e = exp(v - max(v, axis=0))
    store(out[row, 0 : BLOCK], e / sum(e, axis=0))
"#,
    r#"@kernel(grid=(cdiv(M, BM), cdiv(N, BN)), num_warps=8, num_stages=3)
def gemm(A: Tensor["M", "K", f16], B: Tensor["K", "N", f16], C: Tensor["M", "N", f32],
         BM: const = 128, BN: const = 128, BK: const = 32):
    m0 = program_id(0) * BM
    n0 = program_id(1) * BN
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        acc = dot(load(A[m0 : m0 + BM, k : k + BK]), load(B[k : k + BK, n0 : n0 + BN]), acc)
    store(C[m0 : m0 + BM, n0 : n0 + BN], acc)
"#,
    r#"@kernel(grid=(cdiv(S, BM), B * H), num_warps=4, num_stages=2)
def flash_attn(q: Tensor["B", "H", "S", "D", bf16], k: Tensor["B", "H", "S", "D", bf16],
               v: Tensor["B", "H", "S", "D", bf16], o: Tensor["B", "H", "S", "D", bf16],
               scale: f32, causal: const bool = False, BM: const = 128, BN: const = 64):
    m0 = program_id(0) * BM
    b = program_id(1) // H
    h = program_id(1) % H
    qt = load(q[b, h, m0 : m0 + BM, :])
    m_i = full([BM], -inf, f32)
    l_i = zeros([BM], f32)
    acc = zeros([BM, D], f32)
    end = min(S, m0 + BM) if causal else S
    for n0 in range(0, end, BN):
        s = dot(qt, load(k[b, h, n0 : n0 + BN, :]).T) * scale
        if causal:
            s = where(arange(m0, m0 + BM)[:, None] >= arange(n0, n0 + BN)[None, :], s, -inf)
        m_new = maximum(m_i, max(s, axis=1))
        p = exp(s - m_new[:, None])
        alpha = exp(m_i - m_new)
        l_i = l_i * alpha + sum(p, axis=1)
        acc = acc * alpha[:, None] + dot(p.to(bf16), load(v[b, h, n0 : n0 + BN, :]))
        m_i = m_new
    store(o[b, h, m0 : m0 + BM, :], (acc / l_i[:, None]).to(bf16))
"#,
    r#"def attention(q: Tensor["B", "H", "S", "D", bf16], k: Tensor["B", "H", "S", "D", bf16],
              v: Tensor["B", "H", "S", "D", bf16]) -> Tensor["B", "H", "S", "D", bf16]:
    return matmul(softmax(matmul(q, transpose(k, -2, -1)) * rsqrt(D), dim=-1), v)
"#,
    r#"x = randn([4, 1000], f32, seed=0)
y = softmax(x, dim=-1)
sum(y, dim=-1)
"#,
];

fn parse_ok(text: &str) -> Item {
    let p = parse_item(text);
    assert!(
        p.diagnostics.is_empty(),
        "unexpected diagnostics for {text:?}: {:#?}",
        p.diagnostics
    );
    p.item.expect("an item")
}

fn codes(text: &str) -> Vec<&'static str> {
    let (_, d) = parse_file(text);
    d.iter().map(|d| d.code).collect()
}

fn diags(text: &str) -> Vec<crate::diag::Diagnostic> {
    parse_file(text).1
}

#[test]
fn reference_programs_parse_cleanly() {
    for (i, src) in REFERENCE.iter().enumerate() {
        let (items, d) = parse_file(src);
        assert!(d.is_empty(), "reference program {i}: {d:#?}");
        assert!(!items.is_empty());
    }
}

fn stmt_of(text: &str) -> StmtKind {
    match parse_ok(text) {
        Item::Stmt(s) => s.kind,
        other => panic!("expected a statement, got {other:?}"),
    }
}

fn expr_of(text: &str) -> Expr {
    match stmt_of(text) {
        StmtKind::Expr(e) => e,
        other => panic!("expected an expression statement, got {other:?}"),
    }
}

/// A compact s-expression rendering of an expression, for precedence tests.
fn sexp(e: &Expr) -> String {
    match &e.kind {
        ExprKind::Int(v) => v.to_string(),
        ExprKind::Float(v) => format!("{v:?}"),
        ExprKind::Str(s) => format!("{s:?}"),
        ExprKind::Bool(b) => b.to_string(),
        ExprKind::None => "None".into(),
        ExprKind::Name(n) => n.name.clone(),
        ExprKind::Unary { op, operand } => format!("({}{})", op.symbol(), sexp(operand)),
        ExprKind::Binary { op, lhs, rhs } => {
            format!("({} {} {})", sexp(lhs), op.symbol(), sexp(rhs))
        }
        ExprKind::IfElse {
            cond,
            then,
            otherwise,
        } => {
            format!(
                "({} if {} else {})",
                sexp(then),
                sexp(cond),
                sexp(otherwise)
            )
        }
        ExprKind::Call { func, args } => {
            let a: Vec<String> = args
                .iter()
                .map(|a| match &a.name {
                    Some(n) => format!("{}={}", n.name, sexp(&a.value)),
                    None => sexp(&a.value),
                })
                .collect();
            format!("{}({})", sexp(func), a.join(", "))
        }
        ExprKind::Subscript { value, indices } => {
            let ix: Vec<String> = indices
                .iter()
                .map(|i| match i {
                    Index::Expr(e) => sexp(e),
                    Index::Slice {
                        start, end, step, ..
                    } => {
                        let p = |x: &Option<Expr>| x.as_ref().map(sexp).unwrap_or_default();
                        match step {
                            Some(_) => format!("{}:{}:{}", p(start), p(end), p(step)),
                            None => format!("{}:{}", p(start), p(end)),
                        }
                    }
                })
                .collect();
            format!("{}[{}]", sexp(value), ix.join(", "))
        }
        ExprKind::Attribute { value, attr } => format!("{}.{}", sexp(value), attr.name),
        ExprKind::Tuple(v) => format!(
            "tuple({})",
            v.iter().map(sexp).collect::<Vec<_>>().join(", ")
        ),
        ExprKind::List(v) => format!("[{}]", v.iter().map(sexp).collect::<Vec<_>>().join(", ")),
        ExprKind::Dict(v) => format!(
            "{{{}}}",
            v.iter()
                .map(|(k, v)| format!("{}: {}", sexp(k), sexp(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        ExprKind::Error => "<error>".into(),
    }
}

fn p(text: &str) -> String {
    sexp(&expr_of(text))
}

#[test]
fn precedence_levels() {
    assert_eq!(p("a if b or c else d"), "(a if (b or c) else d)");
    assert_eq!(p("a or b and c"), "(a or (b and c))");
    assert_eq!(p("a and not b"), "(a and (not b))");
    assert_eq!(p("not a < b"), "(not (a < b))");
    assert_eq!(p("a < b | c"), "(a < (b | c))");
    assert_eq!(p("a | b ^ c"), "(a | (b ^ c))");
    assert_eq!(p("a ^ b & c"), "(a ^ (b & c))");
    assert_eq!(p("a & b + c"), "(a & (b + c))");
    assert_eq!(p("a + b * c"), "(a + (b * c))");
    assert_eq!(p("a - b - c"), "((a - b) - c)");
    assert_eq!(
        p("a * b // c % d / e @ f"),
        "(((((a * b) // c) % d) / e) @ f)"
    );
    assert_eq!(p("-a * b"), "((-a) * b)");
    assert_eq!(p("-x**2"), "(-(x ** 2))");
    assert_eq!(p("a ** b ** c"), "(a ** (b ** c))");
    assert_eq!(p("2 ** -1"), "(2 ** (-1))");
    assert_eq!(p("~a.b(c)[d]"), "(~a.b(c)[d])");
    assert_eq!(
        p("a if b else c if d else e"),
        "(a if b else (c if d else e))"
    );
    assert_eq!(p("x.T"), "x.T");
    assert_eq!(p("t.to(bf16)"), "t.to(bf16)");
    assert_eq!(
        p("vadd[(g0, g1)](x, y, BLOCK=256)"),
        "vadd[tuple(g0, g1)](x, y, BLOCK=256)"
    );
    assert_eq!(p("-inf"), "(-inf)");
    assert_eq!(p("(a + b) * c"), "((a + b) * c)");
}

#[test]
fn subscripts_slices_and_collections() {
    assert_eq!(p("x[i : i + B]"), "x[i:(i + B)]");
    assert_eq!(p("x[a:b:c, :, ::2, None, 3]"), "x[a:b:c, :, ::2, None, 3]");
    assert_eq!(p("t[:, None]"), "t[:, None]");
    assert_eq!(p("x[1:]"), "x[1:]");
    assert_eq!(p("[1, 2.5, \"s\"]"), "[1, 2.5, \"s\"]");
    assert_eq!(p("[]"), "[]");
    assert_eq!(p("()"), "tuple()");
    assert_eq!(p("(a,)"), "tuple(a)");
    assert_eq!(p("(a, b,)"), "tuple(a, b)");
    assert_eq!(
        p("{\"BM\": [64, 128], \"num_warps\": [4, 8]}"),
        "{\"BM\": [64, 128], \"num_warps\": [4, 8]}"
    );
    assert_eq!(p("f(a,\n  b,\n)"), "f(a, b)");
    assert_eq!(p("a, b"), "tuple(a, b)");
    assert_eq!(p("True and False or None"), "((true and false) or None)");
}

#[test]
fn literals() {
    assert_eq!(p("128"), "128");
    assert_eq!(p("0x80"), "128");
    assert_eq!(p("1_024"), "1024");
    assert_eq!(p("0b101"), "5");
    assert_eq!(p("0o17"), "15");
    assert_eq!(p("1.0"), "1.0");
    assert_eq!(p("1e-5"), "1e-5");
    assert_eq!(p(".5"), "0.5");
    assert_eq!(p("0.125"), "0.125");
    assert_eq!(p("2E3"), "2000.0");
    assert_eq!(p("1."), "1.0");
    assert_eq!(p("'a\\'b\\n'"), "\"a'b\\n\"");
    assert_eq!(p("\"a\" 'b'"), "\"ab\"");
    assert_eq!(p("\"\"\"multi\nline\"\"\""), "\"multi\\nline\"");
    assert_eq!(p("1 .T"), "1.T");
}

#[test]
fn statements() {
    match stmt_of("a, b = f(x)") {
        StmtKind::Assign {
            target, ty: None, ..
        } => assert_eq!(sexp(&target), "tuple(a, b)"),
        other => panic!("{other:?}"),
    }
    match stmt_of("x: Tile[BM, f32] = zeros([BM], f32)") {
        StmtKind::Assign {
            target,
            ty: Some(ty),
            ..
        } => {
            assert_eq!(sexp(&target), "x");
            assert!(
                matches!(ty.kind, TypeExprKind::Generic { ref base, ref args } if base.name == "Tile" && args.len() == 2)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        stmt_of("acc += 1"),
        StmtKind::AugAssign { op: BinOp::Add, .. }
    ));
    assert!(matches!(
        stmt_of("t[i] **= 2"),
        StmtKind::AugAssign { op: BinOp::Pow, .. }
    ));
    assert!(matches!(
        stmt_of("x.y //= 2"),
        StmtKind::AugAssign {
            op: BinOp::FloorDiv,
            ..
        }
    ));
    match stmt_of("if a:\n    x = 1\nelif b:\n    pass\nelse:\n    y = 2\n") {
        StmtKind::If { branches, orelse } => {
            assert_eq!(branches.len(), 2);
            assert_eq!(orelse.map(|b| b.len()), Some(1));
        }
        other => panic!("{other:?}"),
    }
    match stmt_of("for i in range(0, N, 4):\n    while i < 3:\n        i = i + 1\n        if i: break\n        continue\n") {
        StmtKind::For { target, body, .. } => {
            assert_eq!(target.name, "i");
            assert!(matches!(body[0].kind, StmtKind::While { ref body, .. } if body.len() == 3));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn items() {
    match parse_ok("from std.nn import (softmax, layer_norm as ln,)\n") {
        Item::FromImport(f) => {
            assert_eq!(f.module.len(), 2);
            assert_eq!(f.names[1].alias.as_ref().unwrap().name, "ln");
        }
        other => panic!("{other:?}"),
    }
    match parse_ok("import std.linalg as la") {
        Item::Import(i) => {
            assert_eq!(
                i.path.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
                ["std", "linalg"]
            );
            assert_eq!(i.alias.unwrap().name, "la");
        }
        other => panic!("{other:?}"),
    }
    match parse_ok("const BLOCK: i32 = 1024\n") {
        Item::Const(c) => {
            assert_eq!(c.name.name, "BLOCK");
            assert!(c.ty.is_some());
        }
        other => panic!("{other:?}"),
    }
    let text = "@autotune(space={\"BM\": [64, 128]}, key=[\"M\"])\n@kernel\ndef f(a: Tensor[\"4*D\", 128, f16], n: i32, c: const bool = False, k: const = 3) -> None:\n    \"\"\"Adds.\n\n    More.\n    \"\"\"\n    return\n";
    match parse_ok(text) {
        Item::Function(f) => {
            assert_eq!(f.decorators.len(), 2);
            assert!(f.decorators[1].args.is_none());
            assert!(f.is_kernel());
            assert_eq!(f.params.len(), 4);
            assert!(matches!(
                f.params[2].ty.as_ref().unwrap().kind,
                TypeExprKind::Const(Some(_))
            ));
            assert!(matches!(
                f.params[3].ty.as_ref().unwrap().kind,
                TypeExprKind::Const(None)
            ));
            assert_eq!(f.docstring.as_deref(), Some("Adds.\n\nMore."));
            assert_eq!(f.body.len(), 2);
            assert_eq!(f.span, Span::new(0, text.trim_end().len() as u32));
            assert_eq!(&text[f.header_span.range()], "def f(a: Tensor[\"4*D\", 128, f16], n: i32, c: const bool = False, k: const = 3) -> None");
        }
        other => panic!("{other:?}"),
    }
    match parse_ok("def one(x): return x + 1") {
        Item::Function(f) => assert!(matches!(f.body[0].kind, StmtKind::Return(Some(_)))),
        other => panic!("{other:?}"),
    }
}

#[test]
fn spans_are_item_relative_and_precise() {
    let text = "x = foo(a, b=1)\n";
    match stmt_of(text) {
        StmtKind::Assign { value, .. } => {
            assert_eq!(&text[value.span.range()], "foo(a, b=1)");
            let ExprKind::Call { args, .. } = value.kind else {
                panic!()
            };
            assert_eq!(&text[args[1].span.range()], "b=1");
        }
        other => panic!("{other:?}"),
    }
    let text = "y = (acc / l).to(bf16)";
    let StmtKind::Assign { value, .. } = stmt_of(text) else {
        panic!()
    };
    assert_eq!(&text[value.span.range()], "(acc / l).to(bf16)");
}

#[test]
fn basic_error_codes() {
    assert_eq!(codes("x = (1 +\n"), ["E0102"]);
    assert_eq!(codes("def f(:\n    pass\n"), ["E0101"]);
    assert_eq!(codes("f(a=1, b)\n"), ["E0112"]);
    assert_eq!(codes("f() = 1\n"), ["E0110"]);
    assert_eq!(codes("@kernel\nx = 1\n"), ["E0113"]);
    assert_eq!(codes("break\n"), ["E0114"]);
    assert_eq!(codes("return 1\n"), ["E0115"]);
    assert_eq!(codes("x = a < b < c\n"), ["E0101"]);
    let d = diags("def f(x):\n    y = x +\n");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].code, "E0101");
    assert!(d[0].message.contains("end of line"), "{}", d[0].message);
}
