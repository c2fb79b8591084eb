//! Mutations of programs at the level of tokens, lines and statement blocks:
//! swapped dims and arguments, other dtypes, numbers at their extremes,
//! duplicated, deleted and spliced statements, deeper nesting, and raw byte
//! edits. A mutant is usually still close to valid, so it reaches past the
//! parser into the checker, lowering and execution.

use super::rng::Rng;

const DTYPES: &[&str] = &[
    "f64", "f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i64", "i32", "i16", "i8", "u32", "u8", "bool",
];

/// Numbers at the edges: zero, negative, 2^31, 2^32, 2^63 - 1, huge shapes.
const EXTREMES: &[&str] = &[
    "0",
    "-1",
    "1",
    "2",
    "3",
    "7",
    "17",
    "255",
    "256",
    "65536",
    "100000",
    "2147483647",
    "2147483648",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775807",
    "1_000_000_000",
    "0x7fffffff",
    "0.0",
    "-0.0",
    "1e30",
    "1e-30",
    "1e308",
    "-inf",
    "inf",
];

/// Words that fit many places of the grammar.
const VOCAB: &[&str] = &[
    "def",
    "return",
    "if",
    "else",
    "for",
    "in",
    "while",
    "break",
    "continue",
    "pass",
    "and",
    "or",
    "not",
    "const",
    "True",
    "False",
    "None",
    "@kernel",
    "@autotune",
    "grid",
    "num_warps",
    "num_stages",
    "Tensor",
    "Tile",
    "load",
    "store",
    "dot",
    "zeros",
    "full",
    "arange",
    "program_id",
    "cdiv",
    "range",
    "sum",
    "max",
    "exp",
    "where",
    "matmul",
    "softmax",
    ".T",
    ".to(f32)",
    ".shape",
    "[:, None]",
    "x",
    "N",
    "\"M\"",
    "\"4*D\"",
    "0",
    "1",
    "128",
    "1.0",
    "+",
    "-",
    "*",
    "/",
    "//",
    "%",
    "**",
    "==",
    "<",
    "&",
    "|",
    "~",
    "=",
    "+=",
    ":",
    ",",
    ".",
    "(",
    ")",
    "[",
    "]",
    "\n",
    "\n    ",
    "#",
    "\"",
    "\\",
    "\t",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Word,
    Number,
    Str,
    Punct,
    Space,
}

#[derive(Clone, Debug)]
struct Tok {
    kind: Kind,
    start: usize,
    end: usize,
}

fn tokens(text: &str) -> Vec<Tok> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        let c = b[i];
        let kind = if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            Kind::Word
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
            Kind::Number
        } else if c == b'"' || c == b'\'' {
            i += 1;
            while i < b.len() && b[i] != c && !tessera::syntax::lines::is_break_byte(b[i]) {
                i += 1;
            }
            i = (i + 1).min(b.len());
            Kind::Str
        } else if c.is_ascii_whitespace() {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            Kind::Space
        } else {
            i += 1;
            while i < b.len() && !b[i].is_ascii() {
                i += 1;
            }
            Kind::Punct
        };
        out.push(Tok {
            kind,
            start,
            end: i,
        });
    }
    out
}

/// The text of `text`'s tokens (whitespace runs included), in order.
pub fn pieces(text: &str) -> Vec<String> {
    tokens(text)
        .into_iter()
        .map(|t| text[t.start..t.end].to_string())
        .collect()
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// The lines `i..end` of the statement starting at line `i` (its block
/// included: the following lines indented deeper, blank lines inside).
fn block_end(lines: &[&str], i: usize) -> usize {
    let ind = indent_of(lines[i]);
    let mut end = i + 1;
    let mut j = i + 1;
    while j < lines.len() {
        if lines[j].trim().is_empty() {
            j += 1;
            continue;
        }
        if indent_of(lines[j]) <= ind {
            break;
        }
        j += 1;
        end = j;
    }
    end
}

fn reindent(lines: &[&str], to: usize) -> Vec<String> {
    let base = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| indent_of(l))
        .min()
        .unwrap_or(0);
    lines
        .iter()
        .map(|l| {
            if l.trim().is_empty() {
                String::new()
            } else {
                format!("{}{}", " ".repeat(to), &l[base.min(indent_of(l))..])
            }
        })
        .collect()
}

fn non_blank_lines(lines: &[&str]) -> Vec<usize> {
    (0..lines.len())
        .filter(|i| !lines[*i].trim().is_empty())
        .collect()
}

/// `text` with `n` mutations; `donor` supplies spliced statements.
pub fn mutate(rng: &mut Rng, text: &str, donor: &str, n: usize) -> String {
    let mut t = text.to_string();
    for _ in 0..n {
        t = mutate_once(rng, &t, donor);
    }
    t
}

fn mutate_once(rng: &mut Rng, text: &str, donor: &str) -> String {
    let toks = tokens(text);
    let pick_tok = |rng: &mut Rng, f: &dyn Fn(&Tok) -> bool| -> Option<Tok> {
        let c: Vec<&Tok> = toks.iter().filter(|t| f(t)).collect();
        (!c.is_empty()).then(|| c[rng.below(c.len())].clone())
    };
    let replace = |t: &Tok, with: &str| format!("{}{with}{}", &text[..t.start], &text[t.end..]);
    match rng.below(17) {
        // A dtype for another.
        0 | 1 => {
            if let Some(t) = pick_tok(rng, &|t| {
                t.kind == Kind::Word && DTYPES.contains(&&text[t.start..t.end])
            }) {
                let with = rng.pick::<&str>(DTYPES);
                return replace(&t, with);
            }
        }
        // A number at an extreme.
        2..=4 => {
            if let Some(t) = pick_tok(rng, &|t| t.kind == Kind::Number) {
                let with = rng.pick::<&str>(EXTREMES);
                return replace(&t, with);
            }
        }
        // Two elements of a list, subscript or argument list swapped.
        5 | 6 => {
            if let Some(s) = swap_in_brackets(rng, text, &toks) {
                return s;
            }
        }
        // A statement (with its block) duplicated or deleted.
        7 | 8 => {
            let lines: Vec<&str> = tessera::syntax::lines::lines(text).collect();
            let cand = non_blank_lines(&lines);
            if !cand.is_empty() {
                let i = cand[rng.below(cand.len())];
                let end = block_end(&lines, i);
                let mut out: Vec<String> = lines[..i].iter().map(|s| s.to_string()).collect();
                if rng.chance(1, 2) {
                    out.extend(lines[i..end].iter().map(|s| s.to_string()));
                    out.extend(lines[i..].iter().map(|s| s.to_string()));
                } else {
                    out.extend(lines[end..].iter().map(|s| s.to_string()));
                }
                return out.join("\n") + "\n";
            }
        }
        // A statement block of another program spliced in, at this line's indentation.
        9 | 10 => {
            let lines: Vec<&str> = tessera::syntax::lines::lines(text).collect();
            let dl: Vec<&str> = tessera::syntax::lines::lines(donor).collect();
            let dc = non_blank_lines(&dl);
            if !dc.is_empty() {
                let d = dc[rng.below(dc.len())];
                let dend = block_end(&dl, d);
                let at = rng.below(lines.len() + 1);
                let ind = lines
                    .get(at)
                    .filter(|l| !l.trim().is_empty())
                    .map_or(0, |l| indent_of(l));
                let mut out: Vec<String> = lines[..at].iter().map(|s| s.to_string()).collect();
                out.extend(reindent(&dl[d..dend], ind));
                out.extend(lines[at..].iter().map(|s| s.to_string()));
                return out.join("\n") + "\n";
            }
        }
        // Deeper nesting: parentheses, blocks, long operator chains.
        11 | 12 => return deepen(rng, text, &toks),
        // A name for another name of the program.
        13 => {
            let words: Vec<&Tok> = toks.iter().filter(|t| t.kind == Kind::Word).collect();
            if words.len() >= 2 {
                let a = words[rng.below(words.len())].clone();
                let b = words[rng.below(words.len())];
                return replace(&a, &text[b.start..b.end]);
            }
        }
        // A parenthesised or bracketed subexpression replaced by one of another program.
        15 => {
            if let (Some(at), Some(from)) = (group(rng, text), group(rng, donor)) {
                return format!(
                    "{}{}{}",
                    &text[..at.0],
                    &donor[from.0..from.1],
                    &text[at.1..]
                );
            }
        }
        // A word of the vocabulary inserted between tokens.
        14 => {
            let at = if toks.is_empty() {
                0
            } else {
                toks[rng.below(toks.len())].start
            };
            return format!("{}{}{}", &text[..at], rng.pick(VOCAB), &text[at..]);
        }
        _ => {}
    }
    bytes(rng, text)
}

/// A raw byte inserted, deleted or replaced (the result is made UTF-8).
fn bytes(rng: &mut Rng, text: &str) -> String {
    let mut b = text.as_bytes().to_vec();
    let pool = b" \n\t()[]:,.=#\"'0123456789+-*/@abcxyzMNK_";
    let byte = if rng.chance(4, 5) {
        *rng.pick(pool)
    } else {
        rng.next_u64() as u8
    };
    let len = b.len();
    match rng.below(3) {
        0 => b.insert(rng.below(len + 1), byte),
        1 if len > 0 => {
            let at = rng.below(len);
            let n = rng.range(1, 12) as usize;
            b.drain(at..(at + n).min(len));
        }
        _ if len > 0 => {
            let at = rng.below(len);
            b[at] = byte;
        }
        _ => b.push(byte),
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// The byte range of a random balanced `(...)` or `[...]` group of `text`.
fn group(rng: &mut Rng, text: &str) -> Option<(usize, usize)> {
    let toks = tokens(text);
    let opens: Vec<usize> = toks
        .iter()
        .enumerate()
        .filter(|(_, t)| t.kind == Kind::Punct && matches!(&text[t.start..t.end], "[" | "("))
        .map(|(i, _)| i)
        .collect();
    if opens.is_empty() {
        return None;
    }
    let o = opens[rng.below(opens.len())];
    let mut depth = 0;
    for t in &toks[o..] {
        if t.kind != Kind::Punct {
            continue;
        }
        match &text[t.start..t.end] {
            "[" | "(" | "{" => depth += 1,
            "]" | ")" | "}" => {
                depth -= 1;
                if depth == 0 {
                    return Some((toks[o].start, t.end));
                }
            }
            _ => {}
        }
    }
    None
}

/// Swaps two top-level elements inside a `[...]` or `(...)` group.
fn swap_in_brackets(rng: &mut Rng, text: &str, toks: &[Tok]) -> Option<String> {
    let opens: Vec<usize> = toks
        .iter()
        .enumerate()
        .filter(|(_, t)| t.kind == Kind::Punct && matches!(&text[t.start..t.end], "[" | "("))
        .map(|(i, _)| i)
        .collect();
    if opens.is_empty() {
        return None;
    }
    let o = opens[rng.below(opens.len())];
    let mut depth = 0;
    let mut commas = vec![toks[o].end];
    let mut close = None;
    for t in toks.iter().skip(o) {
        if t.kind != Kind::Punct {
            continue;
        }
        match &text[t.start..t.end] {
            "[" | "(" | "{" => depth += 1,
            "]" | ")" | "}" => {
                depth -= 1;
                if depth == 0 {
                    close = Some(t.start);
                    break;
                }
            }
            "," if depth == 1 => commas.push(t.start),
            _ => {}
        }
    }
    let close = close?;
    let mut bounds = commas.clone();
    bounds.push(close);
    let n = bounds.len() - 1;
    if n < 2 {
        return None;
    }
    let parts: Vec<&str> = (0..n)
        .map(|k| {
            let s = if k == 0 { bounds[0] } else { bounds[k] + 1 };
            &text[s..bounds[k + 1]]
        })
        .collect();
    let a = rng.below(n);
    let b = rng.below(n);
    let mut p: Vec<&str> = parts.clone();
    p.swap(a, b);
    let mut out = String::from(&text[..bounds[0]]);
    out.push_str(&p.join(","));
    out.push_str(&text[close..]);
    Some(out)
}

fn deepen(rng: &mut Rng, text: &str, toks: &[Tok]) -> String {
    // Depths mostly moderate, sometimes far past what a stack holds.
    let depth = if rng.chance(1, 10) {
        rng.range(200, 20_000) as usize
    } else {
        rng.range(2, 60) as usize
    };
    let atoms: Vec<&Tok> = toks
        .iter()
        .filter(|t| matches!(t.kind, Kind::Word | Kind::Number))
        .collect();
    match rng.below(4) {
        0 if !atoms.is_empty() => {
            let t = atoms[rng.below(atoms.len())];
            let atom = &text[t.start..t.end];
            format!(
                "{}{}{atom}{}{}",
                &text[..t.start],
                "(".repeat(depth),
                ")".repeat(depth),
                &text[t.end..]
            )
        }
        1 if !atoms.is_empty() => {
            let t = atoms[rng.below(atoms.len())];
            let atom = &text[t.start..t.end];
            let op = *rng.pick(&[" + ", " * ", " - ", " ** ", " & ", " == "]);
            let chain = vec![atom; depth.min(5000)].join(op);
            format!("{}({chain}){}", &text[..t.start], &text[t.end..])
        }
        2 if !atoms.is_empty() => {
            let t = atoms[rng.below(atoms.len())];
            let suffix = *rng.pick(&[".T", "[:, None]", "[0]", ".to(f32)"]);
            format!(
                "{}{}{}",
                &text[..t.end],
                suffix.repeat(depth.min(5000)),
                &text[t.end..]
            )
        }
        _ => {
            // A statement wrapped in nested blocks.
            let lines: Vec<&str> = tessera::syntax::lines::lines(text).collect();
            let cand = non_blank_lines(&lines);
            if cand.is_empty() {
                return text.to_string();
            }
            let i = cand[rng.below(cand.len())];
            let end = block_end(&lines, i);
            let ind = indent_of(lines[i]);
            let levels = depth.min(300);
            let mut out: Vec<String> = lines[..i].iter().map(|s| s.to_string()).collect();
            for l in 0..levels {
                let header = *rng.pick(&["if True:", "for _q in range(1):", "while False:"]);
                out.push(format!("{}{header}", " ".repeat(ind + 4 * l)));
            }
            out.extend(reindent(&lines[i..end], ind + 4 * levels));
            out.extend(lines[end..].iter().map(|s| s.to_string()));
            out.join("\n") + "\n"
        }
    }
}
