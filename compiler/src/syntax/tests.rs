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
        Item::Stmt(s) => s.kind.clone(),
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
            let ExprKind::Call { args, .. } = &value.kind else {
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

// ------------------------------------------------------------------ lexer

fn kinds(text: &str) -> Vec<String> {
    lex(text)
        .tokens
        .iter()
        .map(|t| match t.1 {
            Tok::Newline => "NL".to_string(),
            Tok::Indent => "IN".to_string(),
            Tok::Dedent => "DE".to_string(),
            Tok::Name(n) => n.to_string(),
            Tok::Int(v) => v.to_string(),
            Tok::Float(v) => format!("{v:?}"),
            Tok::Str(s) => s.to_string(),
            other => other.symbol().to_string(),
        })
        .collect()
}

fn lex_codes(text: &str) -> Vec<&'static str> {
    lex(text).diagnostics.iter().map(|d| d.code).collect()
}

#[test]
fn layout_blocks() {
    assert_eq!(
        kinds("def f():\n    x = 1\n    if x:\n        y\n    z\nw\n").join(" "),
        "def f ( ) : NL IN x = 1 NL if x : NL IN y NL DE z NL DE w NL"
    );
    // blank lines, comment lines (at any column) and trailing comments are ignored
    assert_eq!(
        kinds("if a:  # c\n\n# top\n        # deep\n    b\n\n").join(" "),
        "if a : NL IN b NL DE"
    );
    // implicit joining inside brackets, explicit after a backslash
    assert_eq!(
        kinds("f(a,\n  b,\n\n)\nx = 1 + \\\n  2\n").join(" "),
        "f ( a , b , ) NL x = 1 + 2 NL"
    );
    // no trailing newline: NEWLINE and DEDENTs are still produced
    assert_eq!(
        kinds("if a:\n  if b:\n    c").join(" "),
        "if a : NL IN if b : NL IN c NL DE DE"
    );
    // CRLF line ends
    assert_eq!(
        kinds("if a:\r\n    b\r\n").join(" "),
        "if a : NL IN b NL DE"
    );
    assert!(kinds("").is_empty());
    assert!(kinds("# only a comment\n\n   \n").is_empty());
    assert!(lex("# c\n").diagnostics.is_empty());
}

#[test]
fn layout_errors() {
    assert_eq!(lex_codes("if a:\n\tb\n"), ["E0103"]);
    assert_eq!(lex_codes("if a:\n  \t b\n"), ["E0103"]);
    // a tab that makes the width ambiguous is reported once, not as an indent too
    assert_eq!(lex_codes("x = 1\n\ty = 2\n"), ["E0103"]);
    assert_eq!(lex_codes("def f():\n    x = 1\n    \ty = 2\n"), ["E0103"]);
    assert_eq!(
        lex_codes("def f():\n\tx = 1\n\ty = 2\n"),
        ["E0103", "E0103"]
    );
    // a tab inside a line is fine
    assert!(lex_codes("x =\t1\n").is_empty());
    assert_eq!(lex_codes("if a:\n    b\n  c\n"), ["E0104"]);
    assert_eq!(lex_codes("x\n    y\n"), ["E0105"]);
    // an indent after a block header with a missing `:` is left to the parser
    assert!(lex_codes("if a\n    b\n").is_empty());
    let d = &lex("if a:\n    b\n  c\n").diagnostics[0];
    assert_eq!(d.span, Span::new(14, 15));
}

#[test]
fn lexical_errors() {
    let l = lex("x = $$ + 1 ? y\n");
    assert_eq!(
        l.diagnostics
            .iter()
            .map(|d| (d.code, d.span))
            .collect::<Vec<_>>(),
        [("E0107", Span::new(4, 6)), ("E0107", Span::new(11, 12))]
    );
    // non-ASCII characters are reported whole
    let l = lex("x = é\n");
    assert_eq!(l.diagnostics[0].code, "E0107");
    assert_eq!(l.diagnostics[0].span, Span::new(4, 6));
    assert_eq!(lex_codes("x = 'abc\ny = 2\n"), ["E0108"]);
    assert_eq!(kinds("x = 'abc\ny = 2\n").join(" "), "x = 'abc NL y = 2 NL");
    assert_eq!(lex_codes("x = \"\"\"abc\n"), ["E0108"]);
    for bad in [
        "0x",
        "1__0",
        "1_",
        "99999999999999999999",
        "1e",
        "1e+",
        "12abc",
        "0x1g",
        "0b12",
        "0o8",
        "1e400",
    ] {
        let l = lex(bad);
        assert_eq!(lex_codes(bad), ["E0109"], "{bad}");
        assert_eq!(
            l.diagnostics[0].span,
            Span::new(0, bad.len() as u32),
            "{bad}"
        );
        assert_eq!(l.tokens.len(), 2, "{bad}: one number token and NEWLINE");
    }
    for good in [
        "0",
        "007",
        "1_000_000",
        "0x_80",
        "0xFF",
        "9223372036854775807",
        "1.5e-3",
        "1E5",
        ".5",
        "5.",
    ] {
        assert!(lex_codes(good).is_empty(), "{good}");
    }
    // strings: escapes, both quotes, an escaped newline
    assert_eq!(lexer::unescape(r#""a\tb\\c\"d""#), "a\tb\\c\"d");
    assert_eq!(lexer::unescape(r"'it\'s \q'"), "it's \\q");
    assert_eq!(p("'a\\\nb'"), "\"ab\"");
}

// ------------------------------------------------------------------ errors

/// (code, 1-based line of the primary span) for each diagnostic of a file.
fn at_lines(text: &str) -> Vec<(&'static str, usize)> {
    diags(text)
        .iter()
        .map(|d| {
            (
                d.code,
                text[..d.span.start as usize].matches('\n').count() + 1,
            )
        })
        .collect()
}

#[test]
fn error_codes_and_lines() {
    assert_eq!(at_lines("def f():\n"), [("E0106", 1)]);
    assert_eq!(at_lines("def f():\n    if x:\n    y = 1\n"), [("E0106", 3)]);
    assert_eq!(at_lines("def f():\n    for i in x:\n# c\n"), [("E0106", 2)]);
    assert_eq!(at_lines("if x:\nelse:\n    pass\n"), [("E0106", 2)]);
    assert_eq!(at_lines("x = 1; y = 2\n"), [("E0107", 1)]);
    assert_eq!(at_lines("x = (1,\n     2\ny = 3\n"), [("E0102", 1)]);
    assert_eq!(at_lines("x = [1,\n     2\n"), [("E0102", 1)]);
    assert_eq!(
        at_lines("def f():\n    x = g(1,\n    return x\n"),
        [("E0102", 2)]
    );
    assert_eq!(at_lines("x = 1 +\n"), [("E0101", 1)]);
    assert_eq!(at_lines("if x\n    pass\n"), [("E0101", 1)]);
    assert_eq!(
        at_lines("def f(x: Tensor[\"M\", f32]:\n    return x\n"),
        [("E0101", 1)]
    );
    assert_eq!(at_lines("@kernel\n@autotune()\n"), [("E0113", 2)]);
    assert_eq!(at_lines("@kernel\nx = 1\n"), [("E0113", 1)]);
    // a broken decorator line does not lose the def below it
    assert_eq!(at_lines("@\ndef f(): pass\n"), [("E0101", 1)]);
    assert_eq!(at_lines("@kernel(grid=)\ndef f(): pass\n"), [("E0101", 1)]);
    assert_eq!(
        at_lines("for i in range(3):\n    pass\ncontinue\n"),
        [("E0114", 3)]
    );
    assert_eq!(
        at_lines("def f():\n    while x:\n        break\n    break\n"),
        [("E0114", 4)]
    );
    assert_eq!(at_lines("if x:\n    return\n"), [("E0115", 2)]);
    assert_eq!(at_lines("f(a, k=1, b, c)\n"), [("E0112", 1), ("E0112", 1)]);
    assert_eq!(
        at_lines("@kernel(grid=1, 4)\ndef f(): pass\n"),
        [("E0112", 1)]
    );
    assert_eq!(at_lines("x + 1 = y\n"), [("E0110", 1)]);
    assert_eq!(at_lines("(a, f()) = y\n"), [("E0110", 1)]);
    assert_eq!(at_lines("[a, b] = y\n"), [("E0110", 1)]);
    assert_eq!(at_lines("f(x) += 1\n"), [("E0110", 1)]);
    assert_eq!(at_lines("a, b: i32 = y\n"), [("E0110", 1)]);
    assert_eq!(at_lines("x = a == not b\n"), [("E0101", 1)]);
    assert_eq!(at_lines("x = $\n"), [("E0107", 1)]);
    // a continuation line after an incomplete one is not an extra error
    assert_eq!(
        at_lines("def f(a, b):\n    x = a +\n        b\n    return x\n"),
        [("E0101", 2)]
    );
    assert_eq!(
        at_lines("def f(a, b):\n    x = a\n        b\n"),
        [("E0105", 3)]
    );
}

#[test]
fn error_messages_name_found_and_expected() {
    let d = &diags("x = (1 +)\n")[0];
    assert_eq!(d.code, "E0101");
    assert_eq!(d.message, "unexpected `)`");
    assert_eq!(d.help.as_deref(), Some("expected an expression"));
    assert_eq!(d.span, Span::new(8, 9));

    let d = &diags("def f(x)\n    pass\n")[0];
    assert_eq!(d.message, "unexpected end of line");
    assert_eq!(d.primary_label, "expected `->` or `:`");
    assert!(d.help.as_deref().unwrap().contains("add `:`"));

    let d = &diags("x = [1, 2)\n")[0];
    assert_eq!(d.help.as_deref(), Some("expected `,` or `]`"));

    let d = &diags("f(x, y\ny = 1\n")[0];
    assert_eq!((d.code, d.span), ("E0102", Span::new(1, 2)));
    assert_eq!(d.message, "unclosed `(`");
    assert!(d.labels[0].message.contains("expected"), "{:?}", d.labels);

    let d = &diags("x = a < b < c\n")[0];
    assert_eq!(d.message, "comparison operators cannot be chained");
    assert_eq!(d.span, Span::new(10, 11));
    assert!(d.help.as_deref().unwrap().contains("and"));

    let d = &diags("def f():\n    def g(): pass\n")[0];
    assert_eq!(d.message, "unexpected `def`");
    assert!(d.help.as_deref().unwrap().contains("top level"));

    let d = &diags("f(a=1, 2)\n")[0];
    assert_eq!(d.span, Span::new(7, 8));
    assert_eq!(d.labels[0].span, Span::new(2, 5));

    let d = &diags("@kernel\nx = 1\n")[0];
    assert_eq!(d.span, Span::new(0, 7));
    assert!(d.message.contains("`@kernel`"));
}

#[test]
fn recovery_reports_each_bad_statement_and_keeps_the_rest() {
    let text = "def f(x):\n    a = x +\n    b = 1\n    c = (2 3)\n    if x\n        d = 4\n    e = 5 5\n    return e\n";
    let p = parse_item(text);
    let lines: Vec<usize> = p
        .diagnostics
        .iter()
        .map(|d| text[..d.span.start as usize].matches('\n').count() + 1)
        .collect();
    assert_eq!(lines, [2, 4, 5, 7], "{:#?}", p.diagnostics);
    let Some(Item::Function(f)) = p.item else {
        panic!("no function")
    };
    let kinds: Vec<&str> = f
        .body
        .iter()
        .map(|s| match &s.kind {
            StmtKind::Error => "error",
            StmtKind::Assign { value, .. } if value.kind == ExprKind::Error => "assign-error",
            StmtKind::Assign { .. } => "assign",
            StmtKind::If { .. } => "if",
            StmtKind::Return(_) => "return",
            _ => "other",
        })
        .collect();
    // bad statements keep the shape their first tokens show
    assert_eq!(
        kinds,
        [
            "assign-error",
            "assign",
            "assign-error",
            "if",
            "assign-error",
            "return"
        ]
    );
    let StmtKind::If { branches, .. } = &f.body[3].kind else {
        panic!()
    };
    assert_eq!(
        branches[0].1.len(),
        1,
        "the block under the bad header is parsed"
    );
    assert!(matches!(branches[0].0.kind, ExprKind::Error));
    // a header that cannot be read still yields the function with its body
    let p = parse_item("def f(x: , y):\n    return 1\n");
    assert_eq!(p.diagnostics.len(), 1);
    let Some(Item::Function(f)) = p.item else {
        panic!("no function")
    };
    assert_eq!(f.name.name, "f");
    assert_eq!(f.body.len(), 1);
}

// ------------------------------------------------------------------ split_items

fn pieces(text: &str) -> Vec<&str> {
    split_items(text).iter().map(|s| &text[s.range()]).collect()
}

fn assert_tiles(text: &str, spans: &[Span]) {
    let mut at = 0;
    for s in spans {
        assert_eq!(s.start, at, "gap or overlap in {spans:?} for {text:?}");
        assert!(s.end > s.start, "empty range in {spans:?} for {text:?}");
        at = s.end;
    }
    assert_eq!(
        at as usize,
        text.len(),
        "ranges {spans:?} do not cover {text:?}"
    );
}

#[test]
fn split_items_cases() {
    let text = "# header\nimport a\n\nconst B = 1\n@kernel(\n  grid=(1,))\n@autotune\n# between\ndef f():\n    x = 1\n# comment at column 0 inside the body\n    y = (1,\n2)\n    s = \"\"\"\nnot an item\n\"\"\"\n\nif x:\n    pass\nelif y:\n    pass\nelse:\n    pass\nz = 1";
    let p = pieces(text);
    assert_eq!(p.len(), 5, "{p:#?}");
    assert!(p[0].starts_with("# header\nimport a"));
    assert!(p[1].starts_with("const B"));
    assert!(p[2].starts_with("@kernel(") && p[2].contains("y = (1,\n2)"));
    assert!(p[3].starts_with("if x:") && p[3].contains("else:"));
    assert_eq!(p[4], "z = 1");
    assert_tiles(text, &split_items(text));
    // each piece parses on its own
    for piece in &p {
        let parsed = parse_item(piece);
        assert!(
            parsed.diagnostics.is_empty(),
            "{piece:?}: {:#?}",
            parsed.diagnostics
        );
    }
    assert!(split_items("").is_empty());
    assert_eq!(pieces("  # only\n\n"), ["  # only\n\n"]);
    assert_eq!(pieces("  x = 1\ny = 2\n"), ["  x = 1\n", "y = 2\n"]);
}

#[test]
fn split_items_matches_the_lexer_on_the_corpus() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    let mut dirs = vec![
        root.join("tests/ui"),
        root.join("stdlib"),
        root.join("examples"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "tsr") {
                files.push(path);
            }
        }
    }
    assert!(
        files.len() > 50,
        "corpus not found under {}",
        root.display()
    );
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            split_items(&text),
            super::split_items_by_tokens(&text),
            "{}",
            path.display()
        );
    }
}

#[test]
fn split_items_is_robust_to_unfinished_code() {
    // an unclosed call does not swallow the next def
    let text = "def f():\n    g(1,\n\ndef h():\n    pass\n";
    assert_eq!(
        pieces(text),
        ["def f():\n    g(1,\n\n", "def h():\n    pass\n"]
    );
    let (items, d) = parse_file(text);
    assert_eq!(items.len(), 2);
    assert_eq!(
        d.iter().map(|d| (d.code, d.span.start)).collect::<Vec<_>>(),
        [("E0102", 14)]
    );
    // an unterminated one-line string ends at the end of its line
    assert_eq!(pieces("x = 'abc\ny = 1\n").len(), 2);
    // stray closers do not underflow
    assert_eq!(pieces(")\n]\nx\n").len(), 3);
    // diagnostics of later items are shifted to file offsets
    let (_, d) = parse_file("x = 1\ny = (\n");
    assert_eq!(d[0].span.start, 10);
}

#[test]
fn parse_file_reference_offsets() {
    let (items, d) = parse_file(REFERENCE[0]);
    assert!(d.is_empty());
    let names: Vec<&str> = items
        .iter()
        .map(|(i, _)| match i {
            Item::Import(_) => "import",
            Item::FromImport(_) => "from",
            Item::Const(_) => "const",
            Item::Function(f) => f.name.name.as_str(),
            Item::Stmt(_) => "stmt",
        })
        .collect();
    assert_eq!(names, ["from", "import", "const", "vadd", "scaled_sum"]);
    let (vadd, off) = &items[3];
    assert!(REFERENCE[0][*off as usize..].starts_with("@kernel"));
    let Item::Function(f) = vadd else { panic!() };
    let item_text = &REFERENCE[0][*off as usize..];
    assert_eq!(&item_text[f.name.span.range()], "vadd");
    assert_eq!(f.decorators[0].args.as_ref().map(Vec::len), Some(2));
}

// ------------------------------------------------------------------ properties

mod props {
    use super::*;
    use proptest::prelude::*;

    const SOUP: &[&str] = &[
        "def", "return", "if", "elif", "else", "for", "in", "while", "break", "continue", "pass",
        "import", "from", "as", "and", "or", "not", "const", "True", "False", "None", "inf", "x",
        "Tensor", "f32", "1", "0x", "1_", "2.5", "1e", "\"s\"", "'t", "\"\"\"", "+", "-", "*", "/",
        "//", "%", "**", "@", "&", "|", "^", "~", "==", "!=", "<", "<=", ">", ">=", "=", "+=",
        "**=", "->", ":", ",", ".", "(", ")", "[", "]", "{", "}", "\n", "\n    ", "\n  ", "\n\t",
        " ", "# c", "\\\n", "$", "é", "\r\n",
    ];

    fn soup() -> impl Strategy<Value = String> {
        proptest::collection::vec(proptest::sample::select(SOUP), 0..60).prop_map(|v| v.join(" "))
    }

    fn check(text: &str) {
        let spans = split_items(text);
        if !text.is_empty() {
            assert_tiles(text, &spans);
        }
        for s in &spans {
            let piece = &text[s.range()];
            let p = parse_item(piece);
            for d in &p.diagnostics {
                assert!(d.span.end as usize <= piece.len(), "{d:?} out of {piece:?}");
                assert!(crate::diag::codes::lookup(d.code).is_some());
            }
        }
        let l = lex(text);
        assert!(
            l.tokens.windows(2).all(|w| w[0].0 <= w[1].0),
            "tokens out of order"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        /// The byte scanner behind `split_items` cuts exactly where the token-based
        /// definition does, tokens glued at column 0 included.
        #[test]
        fn split_items_matches_the_lexer(
            parts in proptest::collection::vec(proptest::sample::select(SOUP), 0..80),
            seps in proptest::collection::vec(proptest::sample::select(&["", "", " ", "\n", "\n\n", "\r\n", "\u{FEFF}"][..]), 80),
        ) {
            let mut text = String::new();
            for (p, sep) in parts.iter().zip(&seps) {
                text.push_str(p);
                text.push_str(sep);
            }
            prop_assert_eq!(split_items(&text), crate::syntax::split_items_by_tokens(&text), "{:?}", text);
        }

        #[test]
        fn random_text_never_panics(text in "\\PC{0,80}") {
            check(&text);
        }

        #[test]
        fn token_soup_never_panics(text in soup()) {
            check(&text);
        }

        #[test]
        fn docstring_content_never_panics(body in "(\\PC|\n|\t|\u{3000}){0,40}") {
            let text = format!("def f():\n    \"\"\"{body}\"\"\"\n    pass\n");
            check(&text);
        }

        #[test]
        fn reference_mutations_never_panic(i in 0usize..6, cut in 0usize..2000, junk in proptest::sample::select(SOUP)) {
            let src = REFERENCE[i];
            let mut at = cut % (src.len() + 1);
            while !src.is_char_boundary(at) {
                at -= 1;
            }
            let text = format!("{}{}{}", &src[..at], junk, &src[at..]);
            check(&text);
        }
    }
}

#[test]
fn missing_blocks_keep_the_item() {
    // the header's body is missing: reported once, and the item (with an error
    // statement standing for the body) is still produced
    for text in [
        "def f():\n",
        "def f():\n    if x:\n",
        "def f():\n    if x:\n    y = 1\n    return y\n",
    ] {
        let p = parse_item(text);
        assert_eq!(
            p.diagnostics.iter().map(|d| d.code).collect::<Vec<_>>(),
            ["E0106"],
            "{text:?}"
        );
        assert!(matches!(p.item, Some(Item::Function(_))), "{text:?}");
    }
    // primary span: the line that should be indented; label: the opening `:`
    let d = &parse_item("def f():\n    if x:\n    y = 1\n").diagnostics[0];
    assert_eq!(d.span, Span::new(23, 24));
    assert_eq!(d.labels[0].span, Span::new(17, 18));
    // at the end of the item, the `:` itself
    let d = &parse_item("def f():\n    if x:\n").diagnostics[0];
    assert_eq!(d.span, Span::new(17, 18));
}

#[test]
fn hints_for_python_habits() {
    let help = |t: &str| diags(t)[0].help.clone().unwrap_or_default();
    assert!(help("x = [i for i in y]\n").contains("comprehensions"));
    assert!(help("x = y = 1\n").contains("chained assignment"));
    assert!(help("class A:\n    pass\n").contains("classes"));
    assert!(help("x = a is b\n").contains("`==`"));
    assert!(help("x = a not in b\n").contains("`in`"));
    assert!(help("if x = 1:\n    pass\n").contains("`==`"));
    assert!(help("else:\n    pass\n").contains("line up"));
    assert!(help("x = f\"{y}\"\n").contains("string prefixes"));
}

#[test]
fn needs_more_input_for_the_repl() {
    assert!(!needs_more_input(""));
    assert!(!needs_more_input("x = 1\n"));
    assert!(
        !needs_more_input("x = 1 +\n"),
        "complete, but an error: report it"
    );
    assert!(needs_more_input("x = f(1,\n"));
    assert!(needs_more_input("s = \"\"\"doc\n"));
    assert!(needs_more_input("x = 1 + \\\n"));
    assert!(needs_more_input("def f():\n"));
    assert!(needs_more_input("def f():\n    return 1\n"));
    assert!(!needs_more_input("def f():\n    return 1\n\n"));
    assert!(!needs_more_input("if x: pass\n"));
}

#[test]
fn byte_order_mark_and_form_feed() {
    let text = "\u{FEFF}import a\ndef f():\n    pass\n";
    let (items, d) = parse_file(text);
    assert!(d.is_empty(), "{d:#?}");
    assert_eq!(items.len(), 2);
    assert!(lex("\x0cx = 1\n").diagnostics.is_empty());
}

#[test]
fn deep_nesting_is_refused_not_overflowed() {
    // later passes (and `check_placement`) recurse up to the limit: on the
    // stack that the binaries give them
    crate::stack::with_stack(deep_nesting).unwrap();
}

fn deep_nesting() {
    use crate::syntax::MAX_DEPTH;
    let deep = MAX_DEPTH + 1;
    for text in [
        format!("x = {}1\n", "-".repeat(deep)),
        format!("x = {}1\n", "not ".repeat(deep)),
        format!("x = {}{}\n", "[".repeat(deep), "]".repeat(deep)),
        format!("x = {}\n", vec!["1"; deep + 1].join(" + ")),
        format!("x = {}\n", vec!["1"; deep + 1].join(" ** ")),
        format!("x = y{}\n", ".T".repeat(deep)),
        format!("x = f{}\n", "()".repeat(deep)),
        format!("x = {}1\n", "1 if c else ".repeat(deep)),
    ] {
        let parsed = parse_item(&text);
        assert_eq!(parsed.diagnostics.len(), 1, "{:?}", parsed.diagnostics);
        let d = &parsed.diagnostics[0];
        assert_eq!(d.code, "E0116");
        assert!(d.message.contains("too deeply"));
        // the statement keeps its shape (`x` is still assigned)
        match parsed.item {
            Some(Item::Stmt(Stmt {
                kind: StmtKind::Assign { ref value, .. },
                ..
            })) => assert_eq!(value.kind, ExprKind::Error),
            ref other => panic!("{other:?}"),
        }
    }
    // blocks count: a statement inside more blocks than the limit
    let mut text = String::from("def f():\n");
    for level in 1..=deep {
        text += &" ".repeat(level);
        text += "if c:\n";
    }
    text += &" ".repeat(deep + 1);
    text += "pass\n";
    let blocks = parse_item(&text);
    assert_eq!(blocks.diagnostics.len(), 1, "{:?}", blocks.diagnostics);
    assert_eq!(blocks.diagnostics[0].code, "E0116");
    // exactly at the limit is accepted; brackets alone add no depth
    for text in [
        format!("x = {}1\n", "-".repeat(MAX_DEPTH - 1)),
        format!("x = {}\n", vec!["1"; MAX_DEPTH].join(" + ")),
        format!("x = {}1{}\n", "(".repeat(deep), ")".repeat(deep)),
    ] {
        assert!(parse_item(&text).diagnostics.is_empty());
    }
    assert_eq!(p("not not a < b"), "(not (not (a < b)))");
    assert_eq!(p("a and not not b"), "(a and (not (not b)))");
}

#[test]
fn missing_final_newline_reads_the_same() {
    for (a, b) in [
        ("x = 1 +\n", "x = 1 +"),
        ("def f():\n    return (\n", "def f():\n    return ("),
        ("if x\n", "if x"),
    ] {
        let da: Vec<_> = diags(a).into_iter().map(|d| (d.code, d.message)).collect();
        let db: Vec<_> = diags(b).into_iter().map(|d| (d.code, d.message)).collect();
        assert_eq!(da, db, "{a:?} vs {b:?}");
    }
    assert!(diags("x = 1").is_empty());
    assert!(diags("def f():\n    return 1").is_empty());
}

#[test]
fn salvaged_statement_shapes() {
    let body = |text: &str| match parse_item(text).item {
        Some(Item::Function(f)) => f.body,
        other => panic!("{other:?}"),
    };
    let b = body("def f(x):\n    for i in range(3) x:\n        y = i\n    while x y:\n        pass\n    x += = 1\n    return )\n    y = 1 +\n    z: = 3\n");
    assert!(
        matches!(&b[0].kind, StmtKind::For { target, body, .. } if target.name == "i" && body.len() == 1)
    );
    assert!(matches!(&b[1].kind, StmtKind::While { body, .. } if body.len() == 1));
    assert!(matches!(
        &b[2].kind,
        StmtKind::AugAssign { op: BinOp::Add, .. }
    ));
    assert!(matches!(
        &b[3].kind,
        StmtKind::Return(Some(Expr {
            kind: ExprKind::Error,
            ..
        }))
    ));
    assert!(
        matches!(&b[4].kind, StmtKind::Assign { target, .. } if matches!(&target.kind, ExprKind::Name(n) if n.name == "y"))
    );
    assert!(matches!(&b[5].kind, StmtKind::Assign { .. }));
    // unrecognisable statements stay errors
    let b = body("def f(x):\n    ) = 1\n");
    assert!(matches!(b[0].kind, StmtKind::Error));
}

#[test]
fn salvaged_def_header_keeps_parameter_names() {
    let p = parse_item(
        "def f(x: Tensor[\"M\", f32], y: , z: i32 = (1, 2), w) -> :\n    return x + y\n",
    );
    assert_eq!(p.diagnostics.len(), 1);
    let Some(Item::Function(f)) = p.item else {
        panic!("no function")
    };
    let names: Vec<&str> = f.params.iter().map(|p| p.name.name.as_str()).collect();
    assert_eq!(names, ["x", "y", "z", "w"]);
    assert_eq!(f.body.len(), 1);
}

#[test]
fn errors_inside_brackets_are_cut_out_and_the_rest_kept() {
    let expr = |text: &str| {
        let p = parse_item(text);
        let d: Vec<_> = p
            .diagnostics
            .iter()
            .map(|d| (d.code, d.span.start))
            .collect();
        let e = match p.item {
            Some(Item::Stmt(Stmt {
                kind: StmtKind::Assign { ref value, .. },
                ..
            })) => sexp(value),
            Some(Item::Stmt(Stmt {
                kind: StmtKind::Expr(ref e),
                ..
            })) => sexp(e),
            other => panic!("{other:?}"),
        };
        (e, d)
    };
    assert_eq!(
        expr("x = f(a, b c, d)\n"),
        ("f(a, <error>, d)".to_string(), vec![("E0101", 11)])
    );
    assert_eq!(
        expr("store(out[i], load(x[i : ]) + )\n"),
        ("store(out[i], <error>)".to_string(), vec![("E0101", 30)])
    );
    assert_eq!(
        expr("y = g(k=, n=2)\n"),
        ("g(k=<error>, n=2)".to_string(), vec![("E0101", 8)])
    );
    assert_eq!(
        expr("z = [1, 2 3, 4]\n"),
        ("[1, <error>, 4]".to_string(), vec![("E0101", 10)])
    );
    assert_eq!(
        expr("z = t[a b, 1:]\n"),
        ("t[<error>, 1:]".to_string(), vec![("E0101", 8)])
    );
    assert_eq!(
        expr("z = f(g(1 2), h(3 4))\n"),
        (
            "f(g(<error>), h(<error>))".to_string(),
            vec![("E0101", 10), ("E0101", 18)]
        )
    );
    // mismatched brackets are not repaired: the statement is
    assert_eq!(expr("x = [1, 2)\n").1, vec![("E0101", 9)]);
    // a type annotation with a bad dim keeps the parameters and their other types
    let p = parse_item("def f(x: Tensor[\"M\" f32], y: f32):\n    return x\n");
    assert_eq!(p.diagnostics.len(), 1);
    let Some(Item::Function(f)) = p.item else {
        panic!()
    };
    assert_eq!(f.params.len(), 2);
    assert!(f.params[1].ty.is_some());
}

#[test]
fn stdlib_parses_cleanly() {
    let mut n = 0;
    for module in crate::stdlib::modules() {
        let text = crate::stdlib::source(module).unwrap();
        let (items, d) = parse_file(text);
        assert!(d.is_empty(), "{module}: {d:#?}");
        assert!(!items.is_empty(), "{module} has items");
        n += 1;
    }
    assert!(n > 0, "the stdlib is embedded");
}

// ------------------------------------------------------------------ span invariants

/// Every node's span lies inside its parent's and inside the text.
fn check_spans(item: &Item, len: u32) {
    fn within(outer: Span, inner: Span, what: &str) {
        assert!(
            outer.start <= inner.start && inner.end <= outer.end,
            "{what} span {inner:?} outside {outer:?}"
        );
    }
    fn expr(outer: Span, e: &Expr) {
        within(outer, e.span, "expr");
        let s = e.span;
        match &e.kind {
            ExprKind::Unary { operand, .. } => expr(s, operand),
            ExprKind::Binary { lhs, rhs, .. } => {
                expr(s, lhs);
                expr(s, rhs);
                assert!(lhs.span.end <= rhs.span.start, "operands out of order");
            }
            ExprKind::IfElse {
                cond,
                then,
                otherwise,
            } => {
                expr(s, cond);
                expr(s, then);
                expr(s, otherwise);
            }
            ExprKind::Call { func, args } => {
                expr(s, func);
                for a in args {
                    within(s, a.span, "arg");
                    expr(a.span, &a.value);
                }
            }
            ExprKind::Subscript { value, indices } => {
                expr(s, value);
                for i in indices {
                    within(s, i.span(), "index");
                    if let Index::Slice {
                        start,
                        end,
                        step,
                        span,
                    } = i
                    {
                        for x in [start, end, step].into_iter().flatten() {
                            expr(*span, x);
                        }
                    }
                }
            }
            ExprKind::Attribute { value, attr } => {
                expr(s, value);
                within(s, attr.span, "attr");
            }
            ExprKind::Tuple(v) | ExprKind::List(v) => v.iter().for_each(|x| expr(s, x)),
            ExprKind::Dict(v) => v.iter().for_each(|(k, x)| {
                expr(s, k);
                expr(s, x);
            }),
            ExprKind::Name(n) => within(s, n.span, "name"),
            _ => {}
        }
    }
    fn block(outer: Span, b: &[Stmt]) {
        for st in b {
            stmt(outer, st);
        }
    }
    fn stmt(outer: Span, st: &Stmt) {
        within(outer, st.span, "stmt");
        let s = st.span;
        match &st.kind {
            StmtKind::Expr(e) | StmtKind::Return(Some(e)) => expr(s, e),
            StmtKind::Assign { target, value, .. } | StmtKind::AugAssign { target, value, .. } => {
                expr(s, target);
                expr(s, value);
            }
            StmtKind::If { branches, orelse } => {
                for (c, b) in branches {
                    expr(s, c);
                    block(s, b);
                }
                if let Some(b) = orelse {
                    block(s, b);
                }
            }
            StmtKind::For { target, iter, body } => {
                within(s, target.span, "for target");
                expr(s, iter);
                block(s, body);
            }
            StmtKind::While { cond, body } => {
                expr(s, cond);
                block(s, body);
            }
            _ => {}
        }
    }
    let all = Span::new(0, len);
    within(all, item.span(), "item");
    match item {
        Item::Function(f) => {
            within(f.span, f.header_span, "header");
            for d in &f.decorators {
                within(f.span, d.span, "decorator");
            }
            for p in &f.params {
                within(f.header_span, p.span, "param");
                if let Some(d) = &p.default {
                    expr(p.span, d);
                }
            }
            block(f.span, &f.body);
        }
        Item::Stmt(s) => stmt(all, s),
        Item::Const(c) => expr(c.span, &c.value),
        _ => {}
    }
}

#[test]
fn reference_spans_nest() {
    for src in REFERENCE {
        for r in split_items(src) {
            let text = &src[r.range()];
            if let Some(item) = parse_item(text).item {
                check_spans(&item, text.len() as u32);
            }
        }
    }
}

mod span_props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        /// Broken programs still give trees whose spans nest.
        #[test]
        fn mutated_spans_nest(i in 0usize..6, cut in 0usize..2000, len in 0usize..6, junk in "[ a-z0-9()\\[\\]:,=+*.\\n]{0,4}") {
            let src = REFERENCE[i];
            let mut at = cut % (src.len() + 1);
            while !src.is_char_boundary(at) {
                at -= 1;
            }
            let mut end = (at + len).min(src.len());
            while !src.is_char_boundary(end) {
                end -= 1;
            }
            let text = format!("{}{}{}", &src[..at], junk, &src[end..]);
            for r in split_items(&text) {
                let piece = &text[r.range()];
                if let Some(item) = parse_item(piece).item {
                    check_spans(&item, piece.len() as u32);
                }
            }
        }
    }
}

#[test]
fn docstrings_with_odd_whitespace() {
    let text = "def f():\n    \"\"\"a\n  b\n\u{3000}c\n\t\td\"\"\"\n    pass\n";
    let Some(Item::Function(f)) = parse_item(text).item else {
        panic!()
    };
    assert_eq!(f.docstring.as_deref(), Some("a\nb\nc\nd"));
    let Some(Item::Function(f)) = parse_item("def f():\n    'one line'\n").item else {
        panic!()
    };
    assert_eq!(f.docstring.as_deref(), Some("one line"));
}

#[test]
fn parse_item_on_two_statements_reports_the_second() {
    // parse_item takes one item (as cut by split_items); the REPL should use
    // parse_file for several lines
    let p = parse_item("x = 1\ny = 2\n");
    assert_eq!(p.diagnostics.len(), 1, "{:#?}", p.diagnostics);
    assert_eq!(p.diagnostics[0].span.start, 6);
    let (items, d) = parse_file("x = 1\ny = 2\n");
    assert_eq!((items.len(), d.len()), (2, 0));
}
