//! Lexing, parsing and the AST.
//!
//! A file is cut into top-level items by `split_items` (cheap: one pass of the raw
//! lexer), and each item's text is parsed on its own by `parse_item`, so every span
//! in an item's AST and diagnostics is relative to the item's text. `parse_file`
//! does both for callers that want a whole file at once.

pub mod ast;
pub mod depth;
pub mod dim;
pub mod lexer;
pub mod lines;
mod parser;
pub mod span;

pub use depth::MAX_DEPTH;

#[cfg(test)]
mod tests;

use crate::diag::Diagnostic;
use span::Span;

/// The result of parsing one top-level item's text.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedItem {
    /// `None` when the text holds no item (only blank lines and comments) or when
    /// the item could not be read at all; the diagnostics then say why.
    pub item: Option<ast::Item>,
    /// Lexical and syntax diagnostics, sorted by position, spans relative to the item.
    pub diagnostics: Vec<Diagnostic>,
}

/// Splits a file into the byte ranges of its top-level items.
///
/// A new item starts at each logical line whose first token is at column 0, except
/// a line continuing a bracket, an `else:`/`elif` line (top-level `if` statements)
/// and the `def` (or further decorators) following decorator lines. A decorator
/// followed by anything else than a `def` is an item of its own (E0113). Blank and
/// comment lines belong to the item before them (leading ones to the first item).
/// The ranges tile the text: they are contiguous, in order, and cover every byte.
/// A line at column 0 starting with `def`, `import`, `from` or `const` always starts
/// a new item, even inside an unclosed bracket, so that an unfinished call being
/// typed in one function does not swallow the rest of the file.
pub fn split_items(text: &str) -> Vec<Span> {
    // A byte scanner rather than the lexer: this runs over the whole file on every
    // keystroke, and only line starts, brackets, strings and comments matter here.
    // `tests::split_items_matches_the_lexer` holds it to the token-based definition.
    let b = text.as_bytes();
    let mut starts: Vec<u32> = Vec::new();
    let mut depth: u32 = 0;
    let mut at_line_start = true;
    // the current item so far consists of decorator lines only
    let mut decorators_only = false;
    let mut i = 0;
    while i < b.len() {
        if !at_line_start {
            // Inside a line only brackets, strings, comments, continuations and the
            // newline matter: skip everything else in a tight loop.
            while i < b.len() && !MID_LINE_SPECIAL[b[i] as usize] {
                i += 1;
            }
            if i == b.len() {
                break;
            }
        }
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\x0c' => {
                i += 1;
                continue;
            }
            b'\n' | b'\r' => {
                i += lines::break_len(b, i);
                if depth == 0 {
                    at_line_start = true;
                } else if item_keyword_at(b, i) {
                    // `def`/`import`/`from`/`const` at column 0 ends an unclosed bracket
                    depth = 0;
                    at_line_start = true;
                }
                continue;
            }
            b'#' => {
                i += b[i..]
                    .iter()
                    .position(|&x| lines::is_break_byte(x))
                    .unwrap_or(b.len() - i);
                continue;
            }
            b'\\' if lines::break_len(b, i + 1) > 0 => {
                // a continuation joins the lines: no new line starts, except that an
                // item keyword at column 0 still ends an unclosed bracket
                i += 1 + lines::break_len(b, i + 1);
                if depth > 0 && item_keyword_at(b, i) {
                    depth = 0;
                    at_line_start = true;
                }
                continue;
            }
            0xEF if b[i..].starts_with("\u{FEFF}".as_bytes()) => {
                i += 3;
                continue;
            }
            _ => {}
        }
        let s = i;
        let (kind, end) = scan_split_token(b, i);
        i = end;
        if at_line_start {
            at_line_start = false;
            let col0 = s == 0 || lines::is_break_byte(b[s - 1]);
            let is_deco = kind == SplitTok::At;
            if col0 {
                // decorators glue to the `def` (or further decorators) below them;
                // a decorator above anything else is an item of its own (E0113)
                let continues = kind == SplitTok::ElseElif
                    || (decorators_only
                        && !starts.is_empty()
                        && (kind == SplitTok::At || b[s..end] == *b"def"));
                if continues {
                    decorators_only = decorators_only && is_deco;
                } else {
                    starts.push(s as u32);
                    decorators_only = is_deco;
                }
            } else {
                if starts.is_empty() {
                    // indented code at the very start is an item of its own
                    starts.push(0);
                }
                decorators_only = false;
            }
        }
        match kind {
            SplitTok::Open => depth += 1,
            SplitTok::Close => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    tile_from_starts(starts, text.len() as u32)
}

/// Whether `def`, `import`, `from` or `const` starts at `i`.
fn item_keyword_at(b: &[u8], i: usize) -> bool {
    i < b.len() && b[i].is_ascii_alphabetic() && scan_split_token(b, i).0 == SplitTok::ItemKeyword
}

/// Bytes that matter to `split_items` after a line's first token.
static MID_LINE_SPECIAL: [bool; 256] = {
    let mut t = [false; 256];
    let special = b"\n\r#\\\"'()[]{}";
    let mut k = 0;
    while k < special.len() {
        t[special[k] as usize] = true;
        k += 1;
    }
    t
};

/// What `split_items` needs to know of a token.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SplitTok {
    /// `def`, `import`, `from`, `const`
    ItemKeyword,
    ElseElif,
    /// `@` (not `@=`)
    At,
    Open,
    Close,
    Other,
}

/// The token starting at `i` (not whitespace, a comment or a newline): its kind
/// and end. Strings follow the lexer's rules (escapes, unterminated strings end at
/// the line, an unterminated triple-quoted string at the end of the text); other
/// tokens may be cut shorter than the lexer would, which changes nothing here.
fn scan_split_token(b: &[u8], i: usize) -> (SplitTok, usize) {
    let c = b[i];
    match c {
        b'A'..=b'Z' | b'a'..=b'z' | b'_' => {
            let end = i + b[i..]
                .iter()
                .position(|x| !(x.is_ascii_alphanumeric() || *x == b'_'))
                .unwrap_or(b.len() - i);
            let kind = match &b[i..end] {
                b"def" | b"import" | b"from" | b"const" => SplitTok::ItemKeyword,
                b"else" | b"elif" => SplitTok::ElseElif,
                _ => SplitTok::Other,
            };
            (kind, end)
        }
        b'"' | b'\'' => {
            if b.get(i + 1) == Some(&c) && b.get(i + 2) == Some(&c) {
                let mut j = i + 3;
                while j < b.len() {
                    if b[j] == b'\\' {
                        j += 2;
                    } else if b[j] == c && b.get(j + 1) == Some(&c) && b.get(j + 2) == Some(&c) {
                        return (SplitTok::Other, j + 3);
                    } else {
                        j += 1;
                    }
                }
                (SplitTok::Other, b.len())
            } else {
                let mut j = i + 1;
                while j < b.len() {
                    match b[j] {
                        b'\\' => {
                            j += if b.get(j + 1) == Some(&b'\r') && b.get(j + 2) == Some(&b'\n') {
                                3
                            } else {
                                2
                            }
                        }
                        b'\n' | b'\r' => break,
                        x if x == c => return (SplitTok::Other, j + 1),
                        _ => j += 1,
                    }
                }
                (SplitTok::Other, j.min(b.len()))
            }
        }
        b'@' if b.get(i + 1) != Some(&b'=') => (SplitTok::At, i + 1),
        b'(' | b'[' | b'{' => (SplitTok::Open, i + 1),
        b')' | b']' | b'}' => (SplitTok::Close, i + 1),
        _ => (SplitTok::Other, i + 1),
    }
}

/// Contiguous ranges from item starts: the first begins at 0, the last ends at `len`.
fn tile_from_starts(mut starts: Vec<u32>, len: u32) -> Vec<Span> {
    if len == 0 {
        return Vec::new();
    }
    if starts.first() != Some(&0) {
        if starts.is_empty() {
            starts.push(0);
        } else {
            starts[0] = 0;
        }
    }
    let mut out = Vec::with_capacity(starts.len());
    for (i, &s) in starts.iter().enumerate() {
        let e = starts.get(i + 1).copied().unwrap_or(len);
        out.push(Span::new(s, e));
    }
    out
}

/// `split_items` as first defined, over the lexer's raw tokens: the reference the
/// byte scanner is tested against.
#[cfg(test)]
pub(crate) fn split_items_by_tokens(text: &str) -> Vec<Span> {
    use lexer::Raw;
    let bytes = text.as_bytes();
    let mut starts: Vec<u32> = Vec::new();
    let mut depth: u32 = 0;
    let mut at_line_start = true;
    // the current item so far consists of decorator lines only
    let mut decorators_only = false;
    for (raw, s, _) in lexer::raw_tokens(text) {
        if raw == Some(Raw::Newline) {
            if depth == 0 {
                at_line_start = true;
            }
            continue;
        }
        let col0 = s == 0 || lines::is_break_byte(bytes[s - 1]);
        if depth > 0 && col0 && matches!(raw, Some(Raw::Def | Raw::Import | Raw::From | Raw::Const))
        {
            depth = 0;
            at_line_start = true;
        }
        if at_line_start {
            at_line_start = false;
            let is_deco = raw == Some(Raw::At);
            if col0 {
                // decorators glue to the `def` (or further decorators) below them;
                // a decorator above anything else is an item of its own (E0113)
                let continues = matches!(raw, Some(Raw::Else | Raw::Elif))
                    || (decorators_only
                        && !starts.is_empty()
                        && matches!(raw, Some(Raw::Def | Raw::At)));
                if continues {
                    decorators_only = decorators_only && is_deco;
                } else {
                    starts.push(s as u32);
                    decorators_only = is_deco;
                }
            } else {
                if starts.is_empty() {
                    // indented code at the very start is an item of its own
                    starts.push(0);
                }
                decorators_only = false;
            }
        }
        match raw {
            Some(Raw::LParen | Raw::LBracket | Raw::LBrace) => depth += 1,
            Some(Raw::RParen | Raw::RBracket | Raw::RBrace) => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    tile_from_starts(starts, text.len() as u32)
}

/// Whether `text` (an interactive input so far) needs more lines before it can
/// be parsed: a bracket or triple-quoted string is still open, the last line
/// opens a block (ends in `:`), or the input ends inside an indented block (the
/// REPL convention: a blank line ends a block).
pub fn needs_more_input(text: &str) -> bool {
    let lexed = lexer::lex(text);
    if !lexed.unclosed.is_empty() {
        return true;
    }
    if lexed
        .diagnostics
        .iter()
        .any(|d| d.code == "E0108" && text[d.span.range()].len() == 3)
    {
        return true;
    }
    if lines::strip_break(text).ends_with('\\') {
        return true;
    }
    let last_line = lines::strip_break(text);
    let ends_blank = last_line.len() < text.len()
        && (last_line.is_empty() || lines::strip_break(last_line).len() < last_line.len());
    let toks = &lexed.tokens;
    let last_real = toks.iter().rev().find(|t| {
        !matches!(
            t.1,
            lexer::Tok::Newline | lexer::Tok::Dedent | lexer::Tok::Indent | lexer::Tok::EmptyBlock
        )
    });
    match last_real {
        None => false,
        Some((_, lexer::Tok::Colon, _)) => !ends_blank,
        Some(_) => !ends_blank && toks.iter().any(|t| t.1 == lexer::Tok::Indent),
    }
}

/// Parses one item's text (as cut by `split_items`); spans are relative to `text`.
pub fn parse_item(text: &str) -> ParsedItem {
    parser::parse(text)
}

/// Splits and parses a whole file: each item with the offset of its text, and
/// every diagnostic with absolute spans.
pub fn parse_file(text: &str) -> (Vec<(ast::Item, u32)>, Vec<Diagnostic>) {
    let mut items = Vec::new();
    let mut diagnostics = Vec::new();
    for range in split_items(text) {
        let parsed = parse_item(&text[range.range()]);
        diagnostics.extend(
            parsed
                .diagnostics
                .into_iter()
                .map(|d| d.shifted(range.start)),
        );
        if let Some(item) = parsed.item {
            items.push((item, range.start));
        }
    }
    (items, diagnostics)
}
