//! The lexer: logos for the raw tokens, then a layout pass that turns line
//! structure into `Newline`, `Indent` and `Dedent` tokens, Python-style.
//!
//! * Indentation is spaces only; a tab in indentation is E0103 (it then counts as
//!   advancing to the next multiple of 8, so that lexing can go on).
//! * Lines join implicitly inside `()`, `[]` and `{}`, and explicitly after a `\`
//!   at the end of a line. Blank and comment-only lines are ignored.
//! * A dedent to a column that matches no outer level is E0104; an indent after a
//!   line that cannot open a block is E0105 (the line is then lexed as if it were
//!   not indented, so the parser does not report a cascade of errors).
//! * Invalid characters (E0107), unterminated strings (E0108) and malformed numbers
//!   (E0109) are reported here; the lexer always produces a token stream and never
//!   panics.

use logos::Logos;

use crate::diag::Diagnostic;
use crate::syntax::span::Span;

/// A token of the parser's input. Literal payloads borrow from the source text
/// (strings keep their quotes; `unescape` turns them into values).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tok<'a> {
    // keywords
    Def,
    Return,
    If,
    Elif,
    Else,
    For,
    In,
    While,
    Break,
    Continue,
    Pass,
    Import,
    From,
    As,
    And,
    Or,
    Not,
    Const,
    True,
    False,
    None,
    Inf,
    // literals and names
    Name(&'a str),
    Int(i64),
    Float(f64),
    Str(&'a str),
    // operators
    Plus,
    Minus,
    Star,
    Slash,
    DoubleSlash,
    Percent,
    DoubleStar,
    At,
    Amp,
    Pipe,
    Caret,
    Tilde,
    EqEq,
    NotEq,
    Lt,
    Le,
    Gt,
    Ge,
    Assign,
    PlusEq,
    MinusEq,
    StarEq,
    SlashEq,
    DoubleSlashEq,
    PercentEq,
    DoubleStarEq,
    AtEq,
    AmpEq,
    PipeEq,
    CaretEq,
    Arrow,
    Colon,
    Comma,
    Dot,
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    // layout
    Newline,
    Indent,
    Dedent,
    /// Stands for the missing indented block after a line that ends in `:`
    /// (already reported as E0106), so that the parser can go on.
    EmptyBlock,
    /// Stands for an unreadable part of a bracketed list (an argument, element or
    /// index) that the parser's repair pass cut out; never produced by `lex`.
    ErrorExpr,
}

impl Tok<'_> {
    /// How the token reads in an error message ("`def`", "name `x`", "end of line").
    pub fn describe(&self) -> String {
        match self {
            Tok::Name(n) => format!("name `{n}`"),
            Tok::Int(_) | Tok::Float(_) => "number".to_string(),
            Tok::Str(_) => "string literal".to_string(),
            Tok::Newline => "end of line".to_string(),
            Tok::Indent => "indent".to_string(),
            Tok::Dedent => "end of the indented block".to_string(),
            Tok::EmptyBlock => "a line that is not indented".to_string(),
            Tok::ErrorExpr => "an invalid expression".to_string(),
            other => format!("`{}`", other.symbol()),
        }
    }

    /// The source spelling of a keyword or operator token (empty for the others).
    pub fn symbol(&self) -> &'static str {
        match self {
            Tok::Def => "def",
            Tok::Return => "return",
            Tok::If => "if",
            Tok::Elif => "elif",
            Tok::Else => "else",
            Tok::For => "for",
            Tok::In => "in",
            Tok::While => "while",
            Tok::Break => "break",
            Tok::Continue => "continue",
            Tok::Pass => "pass",
            Tok::Import => "import",
            Tok::From => "from",
            Tok::As => "as",
            Tok::And => "and",
            Tok::Or => "or",
            Tok::Not => "not",
            Tok::Const => "const",
            Tok::True => "True",
            Tok::False => "False",
            Tok::None => "None",
            Tok::Inf => "inf",
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Star => "*",
            Tok::Slash => "/",
            Tok::DoubleSlash => "//",
            Tok::Percent => "%",
            Tok::DoubleStar => "**",
            Tok::At => "@",
            Tok::Amp => "&",
            Tok::Pipe => "|",
            Tok::Caret => "^",
            Tok::Tilde => "~",
            Tok::EqEq => "==",
            Tok::NotEq => "!=",
            Tok::Lt => "<",
            Tok::Le => "<=",
            Tok::Gt => ">",
            Tok::Ge => ">=",
            Tok::Assign => "=",
            Tok::PlusEq => "+=",
            Tok::MinusEq => "-=",
            Tok::StarEq => "*=",
            Tok::SlashEq => "/=",
            Tok::DoubleSlashEq => "//=",
            Tok::PercentEq => "%=",
            Tok::DoubleStarEq => "**=",
            Tok::AtEq => "@=",
            Tok::AmpEq => "&=",
            Tok::PipeEq => "|=",
            Tok::CaretEq => "^=",
            Tok::Arrow => "->",
            Tok::Colon => ":",
            Tok::Comma => ",",
            Tok::Dot => ".",
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBracket => "[",
            Tok::RBracket => "]",
            Tok::LBrace => "{",
            Tok::RBrace => "}",
            Tok::Name(_)
            | Tok::Int(_)
            | Tok::Float(_)
            | Tok::Str(_)
            | Tok::Newline
            | Tok::Indent
            | Tok::Dedent
            | Tok::EmptyBlock
            | Tok::ErrorExpr => "",
        }
    }
}

/// What the raw number scanner found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Number {
    Int(i64),
    Float(f64),
    /// Malformed or out of range; the message says why.
    Bad(&'static str),
}

/// Raw tokens, as logos sees them (no layout yet).
#[derive(Logos, Clone, Copy, Debug, PartialEq)]
// Line breaks are `\n`, `\r\n` and a lone `\r` (see `syntax::lines`).
#[logos(skip r"[ \t\f\u{FEFF}]+")]
#[logos(skip(r"#[^\r\n]*", allow_greedy = true))]
#[logos(skip r"\\(\r\n|\r|\n)")]
pub(crate) enum Raw {
    #[regex(r"\r\n|\r|\n")]
    Newline,

    #[token("def")]
    Def,
    #[token("return")]
    Return,
    #[token("if")]
    If,
    #[token("elif")]
    Elif,
    #[token("else")]
    Else,
    #[token("for")]
    For,
    #[token("in")]
    In,
    #[token("while")]
    While,
    #[token("break")]
    Break,
    #[token("continue")]
    Continue,
    #[token("pass")]
    Pass,
    #[token("import")]
    Import,
    #[token("from")]
    From,
    #[token("as")]
    As,
    #[token("and")]
    And,
    #[token("or")]
    Or,
    #[token("not")]
    Not,
    #[token("const")]
    Const,
    #[token("True")]
    True,
    #[token("False")]
    False,
    #[token("None")]
    None,
    #[token("inf")]
    Inf,

    #[regex(r"[A-Za-z_][A-Za-z0-9_]*")]
    Name,

    #[regex(r"[0-9]", scan_number)]
    #[regex(r"\.[0-9]", scan_number)]
    Number(Number),

    /// `true` when terminated.
    #[token("\"", |lex| scan_string(lex, b'"'))]
    #[token("'", |lex| scan_string(lex, b'\''))]
    #[token("\"\"\"", |lex| scan_triple(lex, b'"'))]
    #[token("'''", |lex| scan_triple(lex, b'\''))]
    Str(bool),

    #[token("+")]
    Plus,
    #[token("-")]
    Minus,
    #[token("*")]
    Star,
    #[token("/")]
    Slash,
    #[token("//")]
    DoubleSlash,
    #[token("%")]
    Percent,
    #[token("**")]
    DoubleStar,
    #[token("@")]
    At,
    #[token("&")]
    Amp,
    #[token("|")]
    Pipe,
    #[token("^")]
    Caret,
    #[token("~")]
    Tilde,
    #[token("==")]
    EqEq,
    #[token("!=")]
    NotEq,
    #[token("<")]
    Lt,
    #[token("<=")]
    Le,
    #[token(">")]
    Gt,
    #[token(">=")]
    Ge,
    #[token("=")]
    Assign,
    #[token("+=")]
    PlusEq,
    #[token("-=")]
    MinusEq,
    #[token("*=")]
    StarEq,
    #[token("/=")]
    SlashEq,
    #[token("//=")]
    DoubleSlashEq,
    #[token("%=")]
    PercentEq,
    #[token("**=")]
    DoubleStarEq,
    #[token("@=")]
    AtEq,
    #[token("&=")]
    AmpEq,
    #[token("|=")]
    PipeEq,
    #[token("^=")]
    CaretEq,
    #[token("->")]
    Arrow,
    #[token(":")]
    Colon,
    #[token(",")]
    Comma,
    #[token(".")]
    Dot,
    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
}

/// Scans the rest of a number whose first character (a digit, or `.` and a digit)
/// logos has matched. Consumes every identifier character that follows, so that
/// `1abc` or `0x1g` is one bad number rather than a number and a name.
fn scan_number(lex: &mut logos::Lexer<Raw>) -> Number {
    let first = lex.slice().as_bytes();
    let rest = lex.remainder().as_bytes();
    let mut n = 0;
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let radix =
        if first == b"0" && matches!(rest.first(), Some(b'x' | b'X' | b'o' | b'O' | b'b' | b'B')) {
            let r = match rest[0] {
                b'x' | b'X' => 16,
                b'o' | b'O' => 8,
                _ => 2,
            };
            n = 1;
            while n < rest.len() && is_ident(rest[n]) {
                n += 1;
            }
            Some(r)
        } else {
            None
        };
    if radix.is_none() {
        let starts_with_dot = first[0] == b'.';
        while n < rest.len() && (rest[n].is_ascii_digit() || rest[n] == b'_') {
            n += 1;
        }
        if !starts_with_dot
            && n < rest.len()
            && rest[n] == b'.'
            && !rest
                .get(n + 1)
                .is_some_and(|&b| b.is_ascii_alphabetic() && b != b'e' && b != b'E' || b == b'_')
        {
            n += 1;
            while n < rest.len() && (rest[n].is_ascii_digit() || rest[n] == b'_') {
                n += 1;
            }
        }
        if n < rest.len() && (rest[n] == b'e' || rest[n] == b'E') {
            // the exponent, signed; `1e` and `1e+` are bad numbers, reported whole
            n += 1;
            if n < rest.len() && (rest[n] == b'+' || rest[n] == b'-') {
                n += 1;
            }
            while n < rest.len() && (rest[n].is_ascii_digit() || rest[n] == b'_') {
                n += 1;
            }
        }
        while n < rest.len() && is_ident(rest[n]) {
            n += 1;
        }
    }
    lex.bump(n);
    let text = lex.slice();
    number_value(text, radix)
}

/// The value of a complete number literal.
pub(crate) fn number_value(text: &str, radix: Option<u32>) -> Number {
    let bytes = text.as_bytes();
    if let Some(radix) = radix {
        let digits = &text[2..];
        if digits.is_empty() || digits.trim_matches('_').is_empty() {
            return Number::Bad("this literal has no digits after its base prefix");
        }
        if !underscores_ok(digits.as_bytes(), true) {
            return Number::Bad("an underscore must sit between two digits");
        }
        let clean: String = digits.chars().filter(|&c| c != '_').collect();
        if !clean.chars().all(|c| c.is_digit(radix)) {
            return Number::Bad(match radix {
                16 => "invalid digit in a hexadecimal literal",
                8 => "invalid digit in an octal literal",
                _ => "invalid digit in a binary literal",
            });
        }
        return match u64::from_str_radix(&clean, radix) {
            Ok(v) if v <= i64::MAX as u64 => Number::Int(v as i64),
            _ => Number::Bad("integer literal is too large (the limit is 2**63 - 1)"),
        };
    }
    if bytes
        .iter()
        .any(|b| b.is_ascii_alphabetic() && *b != b'e' && *b != b'E')
    {
        return Number::Bad("invalid character in a numeric literal");
    }
    let is_float = bytes.iter().any(|&b| b == b'.' || b == b'e' || b == b'E');
    // underscores: only between digits
    for part in text.split(['.', 'e', 'E', '+', '-']) {
        if !underscores_ok(part.as_bytes(), false) {
            return Number::Bad("an underscore must sit between two digits");
        }
    }
    let clean: String = text.chars().filter(|&c| c != '_').collect();
    if is_float {
        // `1e` or `1.5e+` (an exponent without digits)
        if clean.ends_with(['e', 'E', '+', '-']) || clean.matches(['e', 'E']).count() > 1 {
            return Number::Bad("the exponent of this float literal has no digits");
        }
        match clean.parse::<f64>() {
            Ok(v) if v.is_finite() => Number::Float(v),
            Ok(_) => Number::Bad("float literal is too large"),
            Err(_) => Number::Bad("malformed float literal"),
        }
    } else {
        match clean.parse::<i64>() {
            Ok(v) => Number::Int(v),
            Err(_) => Number::Bad("integer literal is too large (the limit is 2**63 - 1)"),
        }
    }
}

/// `_` only between two digits: not leading (unless after a base prefix, where
/// `0x_80` is allowed like Python), not trailing, never doubled.
fn underscores_ok(part: &[u8], after_prefix: bool) -> bool {
    if part.is_empty() {
        return true;
    }
    if part[part.len() - 1] == b'_' || (!after_prefix && part[0] == b'_') {
        return false;
    }
    !part.windows(2).any(|w| w == b"__")
}

/// Scans a one-line string after its opening quote. Returns whether it is closed
/// on the same line; an unterminated string ends before the newline.
fn scan_string(lex: &mut logos::Lexer<Raw>, quote: u8) -> bool {
    let rest = lex.remainder().as_bytes();
    let mut i = 0;
    while i < rest.len() {
        match rest[i] {
            b'\\' => {
                // an escaped newline continues the string on the next line
                i += if rest.get(i + 1) == Some(&b'\r') && rest.get(i + 2) == Some(&b'\n') {
                    3
                } else {
                    2
                };
            }
            b'\n' | b'\r' => break,
            b if b == quote => {
                lex.bump(i + 1);
                return true;
            }
            _ => i += 1,
        }
    }
    let end = i.min(rest.len());
    // do not leave the lexer inside a UTF-8 sequence
    let mut end = end;
    while end < rest.len() && !lex.remainder().is_char_boundary(end) {
        end += 1;
    }
    lex.bump(end);
    false
}

/// Scans a triple-quoted string after its opening quotes (it may span lines).
fn scan_triple(lex: &mut logos::Lexer<Raw>, quote: u8) -> bool {
    let rest = lex.remainder().as_bytes();
    let mut i = 0;
    while i < rest.len() {
        if rest[i] == b'\\' {
            i += 2;
            continue;
        }
        if rest[i] == quote && rest.get(i + 1) == Some(&quote) && rest.get(i + 2) == Some(&quote) {
            lex.bump(i + 3);
            return true;
        }
        i += 1;
    }
    lex.bump(rest.len());
    false
}

/// The value of a string token's source text (quotes included): escapes
/// `\n \t \r \0 \\ \' \"` and an escaped newline are translated, any other
/// backslash is kept as written.
pub fn unescape(raw: &str) -> String {
    let (open, close) = if raw.starts_with("\"\"\"") || raw.starts_with("'''") {
        (3, 3)
    } else {
        (1, 1)
    };
    let q = raw.as_bytes().first().copied().unwrap_or(b'"');
    let inner_start = open.min(raw.len());
    let closed =
        raw.len() >= open + close && raw.as_bytes()[raw.len() - close..].iter().all(|&b| b == q);
    let inner_end = if closed { raw.len() - close } else { raw.len() };
    let inner = &raw[inner_start..inner_end.max(inner_start)];
    if !inner.contains('\\') {
        return inner.to_string();
    }
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('0') => out.push('\0'),
            Some('\\') => out.push('\\'),
            Some('\'') => out.push('\''),
            Some('"') => out.push('"'),
            Some('\n') => {}
            Some('\r') => {
                if chars.peek() == Some(&'\n') {
                    chars.next();
                }
            }
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            Option::None => out.push('\\'),
        }
    }
    out
}

/// A token with its byte range, as the parser takes it.
pub type Spanned<'a> = (u32, Tok<'a>, u32);

/// The output of `lex`.
#[derive(Debug)]
pub struct Lexed<'a> {
    pub tokens: Vec<Spanned<'a>>,
    pub diagnostics: Vec<Diagnostic>,
    /// Brackets still open at the end of the input (outermost first): the opener's
    /// span and character.
    pub unclosed: Vec<(Span, char)>,
}

/// Lexes `text` and applies the layout rules.
pub fn lex(text: &str) -> Lexed<'_> {
    let mut tokens: Vec<Spanned<'_>> = Vec::with_capacity(text.len() / 3 + 4);
    let mut diagnostics = Vec::new();
    // indentation levels: (column, whether an Indent token was emitted for it)
    let mut levels: Vec<(u32, bool)> = vec![(0, true)];
    let mut brackets: Vec<(Span, char)> = Vec::new();
    let mut at_line_start = true;
    // the first token of the current logical line, to know whether it may open a block
    let mut line_first: Option<Raw> = None;
    let mut last_in_line: Option<Raw> = None;
    let mut pending_invalid: Option<Span> = None;
    let mut last_span = Span::default();
    // the `:` ending a block header line, until the next line shows its block
    let mut pending_block: Option<Span> = None;
    let bytes = text.as_bytes();

    let mut lx = Raw::lexer(text);
    while let Some(res) = lx.next() {
        let range = lx.span();
        let span = Span::new(range.start as u32, range.end as u32);
        let raw = match res {
            Ok(raw) => raw,
            Err(()) => {
                pending_invalid = Some(match pending_invalid {
                    Some(p) if p.end == span.start => p.to(span),
                    Some(p) => {
                        diagnostics.push(invalid_char(text, p));
                        span
                    }
                    None => span,
                });
                continue;
            }
        };
        if let Some(p) = pending_invalid.take() {
            diagnostics.push(invalid_char(text, p));
        }
        if raw == Raw::Newline {
            if brackets.is_empty() && !at_line_start {
                tokens.push((span.start, Tok::Newline, span.end));
                at_line_start = true;
                if last_in_line == Some(Raw::Colon) && opens_block(line_first) {
                    pending_block = Some(last_span);
                }
            }
            continue;
        }
        if at_line_start {
            at_line_start = false;
            let line_start = super::lines::line_start(text, range.start);
            let mut col = 0u32;
            let mut tab: Option<usize> = None;
            for (i, &b) in bytes[line_start..range.start].iter().enumerate() {
                match b {
                    b'\t' => {
                        tab.get_or_insert(line_start + i);
                        col = (col / 8 + 1) * 8;
                    }
                    b' ' => col += 1,
                    // form feed resets the column, like Python; a byte-order mark counts nothing
                    0x0c => col = 0,
                    _ => {}
                }
            }
            if let Some(t) = tab {
                diagnostics.push(
                    Diagnostic::new(
                        "E0103",
                        Span::new(t as u32, t as u32 + 1),
                        "tab in indentation",
                    )
                    .with_primary_label("tab here")
                    .with_help("indent with spaces only"),
                );
            }
            let top = levels.last().map_or(0, |l| l.0);
            if tab.is_some()
                && !levels.iter().any(|l| l.0 == col)
                && !(col > top && last_in_line == Some(Raw::Colon))
            {
                // the tab is reported; read the line at the current level rather
                // than guess a width and report an indentation error as well
                col = top;
            }
            if let Some(colon) = pending_block.take() {
                if col <= top {
                    missing_block(&mut tokens, &mut diagnostics, colon, Some(span));
                }
            }
            if col > top {
                if last_in_line == Some(Raw::Colon) || opens_block(line_first) {
                    levels.push((col, true));
                    tokens.push((span.start, Tok::Indent, span.start));
                } else {
                    levels.push((col, false));
                    diagnostics.push(
                        Diagnostic::new("E0105", Span::new(span.start, span.end), "unexpected indent")
                            .with_primary_label("this line is indented more than the line before it")
                            .with_help("only the body of a `def`, `if`, `elif`, `else`, `for` or `while` is indented"),
                    );
                }
            } else if col < top {
                loop {
                    let n = levels.len();
                    if n < 2 || levels[n - 1].0 <= col {
                        break;
                    }
                    let below = levels[n - 2].0;
                    if below < col {
                        // between two levels: report it and keep the line in the
                        // inner block, so that the parser sees one block
                        diagnostics.push(
                            Diagnostic::new(
                                "E0104",
                                span,
                                "unindent does not match any outer indentation level",
                            )
                            .with_primary_label(format!("this line starts at column {}", col + 1))
                            .with_help(format!(
                                "indent this line to column {} or {} to match an enclosing block",
                                below + 1,
                                levels[n - 1].0 + 1
                            )),
                        );
                        break;
                    }
                    let (_, real) = levels.pop().unwrap();
                    if real {
                        // a dedent sits right after the newline that ends the block
                        let at = last_newline_end(&tokens).unwrap_or(span.start);
                        tokens.push((at, Tok::Dedent, at));
                    }
                }
            }
            line_first = Some(raw);
        }
        last_in_line = Some(raw);
        last_span = span;
        let tok = match raw {
            Raw::Newline => unreachable!("handled above"),
            Raw::Def => Tok::Def,
            Raw::Return => Tok::Return,
            Raw::If => Tok::If,
            Raw::Elif => Tok::Elif,
            Raw::Else => Tok::Else,
            Raw::For => Tok::For,
            Raw::In => Tok::In,
            Raw::While => Tok::While,
            Raw::Break => Tok::Break,
            Raw::Continue => Tok::Continue,
            Raw::Pass => Tok::Pass,
            Raw::Import => Tok::Import,
            Raw::From => Tok::From,
            Raw::As => Tok::As,
            Raw::And => Tok::And,
            Raw::Or => Tok::Or,
            Raw::Not => Tok::Not,
            Raw::Const => Tok::Const,
            Raw::True => Tok::True,
            Raw::False => Tok::False,
            Raw::None => Tok::None,
            Raw::Inf => Tok::Inf,
            Raw::Name => Tok::Name(lx.slice()),
            Raw::Number(Number::Int(v)) => Tok::Int(v),
            Raw::Number(Number::Float(v)) => Tok::Float(v),
            Raw::Number(Number::Bad(why)) => {
                diagnostics.push(
                    Diagnostic::new("E0109", span, format!("invalid numeric literal `{}`", lx.slice()))
                        .with_primary_label(why)
                        .with_help("write integers as `128`, `0x80` or `1_024` and floats as `1.0`, `1e-5` or `.5`"),
                );
                if lx.slice().contains(['.', 'e', 'E']) && !lx.slice().starts_with("0x") {
                    Tok::Float(0.0)
                } else {
                    Tok::Int(0)
                }
            }
            Raw::Str(closed) => {
                if !closed {
                    let triple = lx.slice().starts_with("\"\"\"") || lx.slice().starts_with("'''");
                    let opener = Span::new(span.start, span.start + if triple { 3 } else { 1 });
                    diagnostics.push(
                        Diagnostic::new("E0108", opener, "unterminated string literal")
                            .with_primary_label("this string is never closed")
                            .with_help(if triple {
                                "close the string with matching triple quotes"
                            } else {
                                "close the string with a matching quote on the same line"
                            }),
                    );
                }
                Tok::Str(lx.slice())
            }
            Raw::Plus => Tok::Plus,
            Raw::Minus => Tok::Minus,
            Raw::Star => Tok::Star,
            Raw::Slash => Tok::Slash,
            Raw::DoubleSlash => Tok::DoubleSlash,
            Raw::Percent => Tok::Percent,
            Raw::DoubleStar => Tok::DoubleStar,
            Raw::At => Tok::At,
            Raw::Amp => Tok::Amp,
            Raw::Pipe => Tok::Pipe,
            Raw::Caret => Tok::Caret,
            Raw::Tilde => Tok::Tilde,
            Raw::EqEq => Tok::EqEq,
            Raw::NotEq => Tok::NotEq,
            Raw::Lt => Tok::Lt,
            Raw::Le => Tok::Le,
            Raw::Gt => Tok::Gt,
            Raw::Ge => Tok::Ge,
            Raw::Assign => Tok::Assign,
            Raw::PlusEq => Tok::PlusEq,
            Raw::MinusEq => Tok::MinusEq,
            Raw::StarEq => Tok::StarEq,
            Raw::SlashEq => Tok::SlashEq,
            Raw::DoubleSlashEq => Tok::DoubleSlashEq,
            Raw::PercentEq => Tok::PercentEq,
            Raw::DoubleStarEq => Tok::DoubleStarEq,
            Raw::AtEq => Tok::AtEq,
            Raw::AmpEq => Tok::AmpEq,
            Raw::PipeEq => Tok::PipeEq,
            Raw::CaretEq => Tok::CaretEq,
            Raw::Arrow => Tok::Arrow,
            Raw::Colon => Tok::Colon,
            Raw::Comma => Tok::Comma,
            Raw::Dot => Tok::Dot,
            Raw::LParen => Tok::LParen,
            Raw::RParen => Tok::RParen,
            Raw::LBracket => Tok::LBracket,
            Raw::RBracket => Tok::RBracket,
            Raw::LBrace => Tok::LBrace,
            Raw::RBrace => Tok::RBrace,
        };
        match tok {
            Tok::LParen => brackets.push((span, '(')),
            Tok::LBracket => brackets.push((span, '[')),
            Tok::LBrace => brackets.push((span, '{')),
            Tok::RParen | Tok::RBracket | Tok::RBrace => {
                brackets.pop();
            }
            _ => {}
        }
        tokens.push((span.start, tok, span.end));
    }
    if let Some(p) = pending_invalid.take() {
        diagnostics.push(invalid_char(text, p));
    }
    let end = text.len() as u32;
    if !at_line_start {
        tokens.push((end, Tok::Newline, end));
        if brackets.is_empty() && last_in_line == Some(Raw::Colon) && opens_block(line_first) {
            pending_block = Some(last_span);
        }
    }
    if let Some(colon) = pending_block.take() {
        missing_block(&mut tokens, &mut diagnostics, colon, None);
    }
    let dedent_at = last_newline_end(&tokens).unwrap_or(end);
    for &(_, real) in levels[1..].iter().rev() {
        if real {
            tokens.push((dedent_at, Tok::Dedent, dedent_at));
        }
    }
    Lexed {
        tokens,
        diagnostics,
        unclosed: brackets,
    }
}

/// Whether a logical line starting with `first` opens an indented block.
fn opens_block(first: Option<Raw>) -> bool {
    matches!(
        first,
        Some(Raw::Def | Raw::If | Raw::Elif | Raw::Else | Raw::For | Raw::While)
    )
}

/// E0106 for a block header whose next line (`next`, or the end of input) is not
/// indented, and the `EmptyBlock` token that stands for the missing block.
fn missing_block(
    tokens: &mut Vec<Spanned<'_>>,
    diagnostics: &mut Vec<Diagnostic>,
    colon: Span,
    next: Option<Span>,
) {
    // reported on the line that should be indented (like Python), or at the `:`
    // when the input ends first
    let d = match next {
        Some(next) => Diagnostic::new("E0106", next, "expected an indented block")
            .with_primary_label("this line should be indented")
            .with_label(colon, "the block opened here has no body"),
        None => Diagnostic::new("E0106", colon, "expected an indented block")
            .with_primary_label("this `:` opens a block, but no indented line follows"),
    }
    .with_help("indent the body under the line ending in `:` (write `pass` for an empty body)");
    diagnostics.push(d);
    let at = last_newline_end(tokens).unwrap_or(colon.end);
    tokens.push((at, Tok::EmptyBlock, at));
}

fn last_newline_end(tokens: &[Spanned<'_>]) -> Option<u32> {
    tokens.iter().rev().find_map(|t| match t.1 {
        Tok::Newline => Some(t.2),
        Tok::Dedent | Tok::EmptyBlock => Some(t.0),
        _ => None,
    })
}

fn invalid_char(text: &str, span: Span) -> Diagnostic {
    let (mut a, mut b) = (span.start as usize, span.end as usize);
    while a > 0 && !text.is_char_boundary(a) {
        a -= 1;
    }
    while b < text.len() && !text.is_char_boundary(b) {
        b += 1;
    }
    let span = Span::new(a as u32, b as u32);
    let s = &text[a..b];
    let shown: String = s.chars().take(8).collect();
    let mut d = Diagnostic::new(
        "E0107",
        span,
        format!("invalid character `{}` in the source", shown.escape_debug()),
    )
    .with_primary_label("not part of any token");
    if s.starts_with('!') {
        d = d.with_help("use `not x` for logical negation and `!=` for inequality");
    } else if s.starts_with(';') {
        d = d.with_help("put each statement on its own line");
    } else if s.starts_with(['$', '?', '`']) {
        d = d.with_help("remove this character");
    } else if s.starts_with(char::is_alphanumeric) {
        d = d.with_help(
            "names are made of ASCII letters, digits and `_`; other text goes in strings and comments",
        );
    } else {
        d = d.with_help("remove it, or put it inside a string or a comment");
    }
    d
}

/// The raw token stream without layout, for `split_items`: (token, start, end).
#[cfg(test)]
pub(crate) fn raw_tokens(text: &str) -> impl Iterator<Item = (Option<Raw>, usize, usize)> + '_ {
    let mut lx = Raw::lexer(text);
    std::iter::from_fn(move || {
        let res = lx.next()?;
        let r = lx.span();
        Some((res.ok(), r.start, r.end))
    })
}
