//! A small FileCheck: `#CHECK:` directives matched against a compiler's output,
//! for the codegen filetests (`tests/harness/codegen.rs`, format in
//! `docs/testing.md`). After LLVM's FileCheck, of which it keeps the part the
//! filetests use.
//!
//! # Directives
//!
//! A directive is a line `#PREFIX[-KIND]: PATTERN` (leading whitespace allowed;
//! the default prefix is `CHECK`, a run may name others):
//!
//! * `#CHECK:` matches at or after the end of the previous match.
//! * `#CHECK-NEXT:` matches on the line right after the previous match's line.
//! * `#CHECK-SAME:` matches on the previous match's line, after it.
//! * `#CHECK-NOT:` must not match between the previous match and the next one
//!   (or the end of the section).
//! * `#CHECK-COUNT-N:` is `#CHECK:` N times in a row.
//! * `#CHECK-LABEL:` matches first, in order, and cuts the output into
//!   sections: the directives after a label match only inside its section (up
//!   to the next label's match), so a rule about one kernel stays in that
//!   kernel.
//!
//! # Patterns
//!
//! Literal text, trimmed; a run of spaces or tabs matches any run of spaces or
//! tabs (PTX indents with tabs). `{{REGEX}}` is a regular expression (`^` and
//! `$` match at line starts and ends);
//! `[[NAME:REGEX]]` captures what REGEX matched as `NAME`, and a later
//! `[[NAME]]` matches that text literally (`[[[NAME]]]` is the
//! value in brackets, as in a PTX address; `{{{REGEX}}` a brace, then the
//! regex, as in a PTX vector).
//!
//! # Invariants
//!
//! Matching is a pure function of the directives and the output; a failure
//! names the directive (its line in the test file), the pattern, where matching
//! started and the output around it, so a report is readable without rerunning.

use std::collections::HashMap;
use std::fmt::Write as _;

use regex::Regex;

/// What a directive asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Check,
    Next,
    Same,
    Not,
    Label,
    Count(usize),
}

impl Kind {
    fn suffix(self) -> String {
        match self {
            Kind::Check => String::new(),
            Kind::Next => "-NEXT".into(),
            Kind::Same => "-SAME".into(),
            Kind::Not => "-NOT".into(),
            Kind::Label => "-LABEL".into(),
            Kind::Count(n) => format!("-COUNT-{n}"),
        }
    }
}

/// One directive of a test file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directive {
    pub prefix: String,
    pub kind: Kind,
    pub pattern: String,
    /// 1-based line in the test file.
    pub line: u32,
}

impl std::fmt::Display for Directive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix == IMPLICIT {
            return write!(f, "line {}: --{IMPLICIT} {}", self.line, self.pattern);
        }
        write!(
            f,
            "line {}: #{}{}: {}",
            self.line,
            self.prefix,
            self.kind.suffix(),
            self.pattern
        )
    }
}

/// A line that looks like a directive: `#WORD[-KIND]:` with an upper-case
/// WORD. `None` for any other line.
fn split_directive(line: &str) -> Option<(&str, Result<Kind, String>, &str)> {
    let rest = line.trim_start().strip_prefix('#')?;
    let colon = rest.find(':')?;
    let (head, pattern) = (&rest[..colon], &rest[colon + 1..]);
    let word_end = head
        .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
        .unwrap_or(head.len());
    let (word, suffix) = head.split_at(word_end);
    if word.is_empty() || !word.starts_with(|c: char| c.is_ascii_uppercase()) {
        return None;
    }
    let kind = match suffix {
        "" => Ok(Kind::Check),
        "-NEXT" => Ok(Kind::Next),
        "-SAME" => Ok(Kind::Same),
        "-NOT" => Ok(Kind::Not),
        "-LABEL" => Ok(Kind::Label),
        s => match s.strip_prefix("-COUNT-").map(str::parse::<usize>) {
            Some(Ok(n)) if n > 0 => Ok(Kind::Count(n)),
            _ => Err(format!("unknown directive kind `{s}`")),
        },
    };
    if kind.is_err() && !suffix.starts_with('-') {
        return None;
    }
    Some((word, kind, pattern.trim()))
}

/// The directives of `text` for `prefixes`, in file order. A line that looks
/// like a directive of another prefix is an error when it names a kind (such as
/// `#CHEK-NOT:`) or its word contains `CHECK`, so a misspelt directive cannot
/// silently check nothing; `known` are the prefixes of the file's other runs.
pub fn parse_directives(
    text: &str,
    prefixes: &[String],
    known: &[String],
) -> Result<Vec<Directive>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let lineno = i as u32 + 1;
        let Some((word, kind, pattern)) = split_directive(line) else {
            continue;
        };
        let ours = prefixes.iter().any(|p| p == word);
        if !ours {
            let looks_like_one = kind != Ok(Kind::Check) || word.contains("CHECK");
            if looks_like_one && !known.iter().any(|p| p == word) {
                return Err(format!(
                    "line {lineno}: `#{word}...` is a directive of no run (the runs check {})",
                    known.join(", ")
                ));
            }
            continue;
        }
        let kind = kind.map_err(|e| format!("line {lineno}: {e}"))?;
        if pattern.is_empty() {
            return Err(format!("line {lineno}: the directive has no pattern"));
        }
        compile(pattern, &HashMap::new(), true).map_err(|e| format!("line {lineno}: {e}"))?;
        out.push(Directive {
            prefix: word.to_string(),
            kind,
            pattern: pattern.to_string(),
            line: lineno,
        });
    }
    Ok(out)
}

/// The regular expression of a pattern. `[[NAME]]` takes its value from
/// `vars`; with `lenient`, an unknown one (a syntax check before matching)
/// matches anything.
fn compile(pattern: &str, vars: &HashMap<String, String>, lenient: bool) -> Result<Regex, String> {
    // `^` and `$` are line starts and ends.
    let mut re = String::from("(?m)");
    let mut rest = pattern;
    let mut literal = String::new();
    let flush = |literal: &mut String, re: &mut String| {
        let mut in_space = false;
        for c in literal.chars() {
            if c == ' ' || c == '\t' {
                if !in_space {
                    re.push_str("[ \\t]+");
                }
                in_space = true;
            } else {
                re.push_str(&regex::escape(c.encode_utf8(&mut [0; 4])));
                in_space = false;
            }
        }
        literal.clear();
    };
    while !rest.is_empty() {
        if rest.starts_with("{{{") {
            // A literal `{` before a regex: `{{{%r}}` is `{` + `{{%r}}`.
            literal.push('{');
            rest = &rest[1..];
        } else if let Some(body) = rest.strip_prefix("{{") {
            let end = body
                .find("}}")
                .ok_or_else(|| format!("`{{{{` without `}}}}` in `{pattern}`"))?;
            flush(&mut literal, &mut re);
            re.push_str(&format!("(?:{})", &body[..end]));
            rest = &body[end + 2..];
        } else if rest.starts_with("[[[") {
            // A literal `[` before a variable: `[[[A]]]` is `[` + `[[A]]` + `]`.
            literal.push('[');
            rest = &rest[1..];
        } else if let Some(body) = rest.strip_prefix("[[") {
            let end = body
                .find("]]")
                .ok_or_else(|| format!("`[[` without `]]` in `{pattern}`"))?;
            flush(&mut literal, &mut re);
            let inner = &body[..end];
            match inner.split_once(':') {
                Some((name, sub)) => re.push_str(&format!("(?P<{name}>{sub})")),
                None => match vars.get(inner) {
                    Some(v) => re.push_str(&regex::escape(v)),
                    None if lenient => re.push_str(".*?"),
                    None => return Err(format!(
                        "`[[{inner}]]` is not defined before its use (a capture is usable from the next directive on, such as a `-SAME`)"
                    )),
                },
            }
            rest = &body[end + 2..];
        } else {
            let c = rest.chars().next().expect("not empty");
            literal.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    flush(&mut literal, &mut re);
    Regex::new(&re).map_err(|e| format!("bad pattern `{pattern}`: {e}"))
}

/// The output, with a line index for reports.
struct Output<'a> {
    text: &'a str,
    /// Byte offset of the start of each line.
    starts: Vec<usize>,
}

impl<'a> Output<'a> {
    fn new(text: &'a str) -> Output<'a> {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Output { text, starts }
    }

    /// 0-based line of a byte offset.
    fn line_of(&self, at: usize) -> usize {
        self.starts.partition_point(|&s| s <= at) - 1
    }

    fn line_text(&self, line: usize) -> &'a str {
        let start = self.starts[line];
        let end = self.starts.get(line + 1).map_or(self.text.len(), |e| e - 1);
        &self.text[start..end]
    }

    /// Lines `from..=to` (0-based, clamped), numbered 1-based, `>` marking `mark`.
    fn excerpt(&self, from: usize, to: usize, mark: Option<usize>) -> String {
        let last = self.starts.len() - 1;
        let to = to.min(last);
        let mut s = String::new();
        for l in from.min(to)..=to {
            let m = if Some(l) == mark { '>' } else { ' ' };
            let _ = writeln!(s, "  {m}{:>5} | {}", l + 1, self.line_text(l));
        }
        s
    }
}

/// A match: byte range.
#[derive(Clone, Copy)]
struct Found {
    start: usize,
    end: usize,
}

/// Lines of context shown after where matching started.
const CONTEXT: usize = 8;

const IMPLICIT: &str = "implicit-check-not";

/// An `--implicit-check-not` pattern of a run (its line is the header's): a
/// `#CHECK-NOT` that holds over the whole output.
pub fn implicit_not(pattern: &str, line: u32) -> Result<Directive, String> {
    compile(pattern, &HashMap::new(), true).map_err(|e| format!("line {line}: {e}"))?;
    Ok(Directive {
        prefix: IMPLICIT.to_string(),
        kind: Kind::Not,
        pattern: pattern.to_string(),
        line,
    })
}

/// Checks `output` against `directives` (of one run, in file order) and the
/// run's `implicit` nots. `Err` is the report of the first failure.
pub fn check(directives: &[Directive], implicit: &[Directive], output: &str) -> Result<(), String> {
    let out = Output::new(output);
    let implicit: Vec<&Directive> = implicit.iter().collect();
    check_nots(&out, &implicit, &HashMap::new(), 0, output.len())?;
    let mut vars = HashMap::new();

    // Labels first, in order; each cuts a section.
    let mut labels: Vec<(usize, Found)> = Vec::new(); // (directive index, match)
    let mut cursor = 0;
    for (i, d) in directives.iter().enumerate() {
        if d.kind != Kind::Label {
            continue;
        }
        let re = compile(&d.pattern, &vars, false).map_err(|e| format!("{d}\n{e}"))?;
        match re.find_at(output, cursor) {
            Some(m) => {
                let f = Found {
                    start: m.start(),
                    end: m.end(),
                };
                labels.push((i, f));
                cursor = f.end;
            }
            None => {
                return Err(no_match(&out, d, &re, cursor, output.len(), None));
            }
        }
    }

    // Sections: the directives before the first label, then each label's.
    let mut sections: Vec<(std::ops::Range<usize>, usize, usize, Option<Found>)> = Vec::new();
    let first_label = labels.first().map_or(directives.len(), |l| l.0);
    let first_start = labels.first().map_or(output.len(), |l| l.1.start);
    sections.push((0..first_label, 0, first_start, None));
    for (n, (i, f)) in labels.iter().enumerate() {
        let (next_dir, next_start) = labels
            .get(n + 1)
            .map_or((directives.len(), output.len()), |l| (l.0, l.1.start));
        sections.push((i + 1..next_dir, f.end, next_start, Some(*f)));
    }

    for (dirs, start, end, label) in sections {
        let label_d = label.map(|_| &directives[dirs.start - 1]);
        let mut cursor = start;
        let mut prev: Option<(Found, &Directive)> = label.zip(label_d);
        let mut nots: Vec<&Directive> = Vec::new();
        for d in &directives[dirs] {
            let times = match d.kind {
                Kind::Not => {
                    nots.push(d);
                    continue;
                }
                Kind::Label => unreachable!("labels cut the sections"),
                Kind::Next | Kind::Same if prev.is_none() => {
                    return Err(format!(
                        "{d}\na -NEXT or -SAME needs a previous match in its section to follow"
                    ))
                }
                Kind::Count(n) => n,
                _ => 1,
            };
            let re = compile(&d.pattern, &vars, false).map_err(|e| format!("{d}\n{e}"))?;
            for nth in 0..times {
                let Some(caps) = re.captures_at(output, cursor).filter(|c| {
                    let m = c.get(0).expect("group 0");
                    m.end() <= end
                }) else {
                    let mut r = no_match(&out, d, &re, cursor, end, prev.map(|p| p.1));
                    if times > 1 {
                        let _ = writeln!(r, "({nth} of the {times} matches were found)");
                    }
                    return Err(r);
                };
                let m = caps.get(0).expect("group 0");
                let f = Found {
                    start: m.start(),
                    end: m.end(),
                };
                let between = &output[cursor..f.start];
                let newlines = between.matches('\n').count();
                let wrong_line = match d.kind {
                    Kind::Next => (newlines != 1).then_some("on the line after the previous match"),
                    Kind::Same => (newlines != 0).then_some("on the previous match's line"),
                    _ => None,
                };
                if let Some(where_) = wrong_line {
                    let want = out.line_of(cursor) + usize::from(d.kind == Kind::Next);
                    let got = out.line_of(f.start);
                    let mut r = format!(
                        "{d}\nthe pattern must match {where_} (output line {}), but its first match is on output line {}\n",
                        want + 1,
                        got + 1
                    );
                    let _ = write!(
                        r,
                        "{}",
                        out.excerpt(want.saturating_sub(2), want + 2, Some(want))
                    );
                    return Err(r);
                }
                check_nots(&out, &nots, &vars, cursor, f.start)?;
                nots.clear();
                for name in re.capture_names().flatten() {
                    if let Some(v) = caps.name(name) {
                        vars.insert(name.to_string(), v.as_str().to_string());
                    }
                }
                cursor = f.end;
                prev = Some((f, d));
            }
        }
        check_nots(&out, &nots, &vars, cursor, end)?;
    }
    Ok(())
}

/// No `#CHECK-NOT` of `nots` matches in `from..to`.
fn check_nots(
    out: &Output,
    nots: &[&Directive],
    vars: &HashMap<String, String>,
    from: usize,
    to: usize,
) -> Result<(), String> {
    for d in nots {
        let re = compile(&d.pattern, vars, false).map_err(|e| format!("{d}\n{e}"))?;
        if let Some(m) = re.find_at(out.text, from).filter(|m| m.end() <= to) {
            let line = out.line_of(m.start());
            return Err(format!(
                "{d}\nthe forbidden pattern matches output line {} (`{}`), in the range searched from output line {} to {}:\n{}",
                line + 1,
                m.as_str(),
                out.line_of(from) + 1,
                out.line_of(to.saturating_sub(1).max(from)) + 1,
                out.excerpt(line.saturating_sub(3), line + 3, Some(line))
            ));
        }
    }
    Ok(())
}

/// The report of a directive that matched nowhere in `from..to`.
fn no_match(
    out: &Output,
    d: &Directive,
    re: &Regex,
    from: usize,
    to: usize,
    after: Option<&Directive>,
) -> String {
    let start = out.line_of(from);
    let last = out.line_of(to.saturating_sub(1).max(from));
    let mut r = format!(
        "{d}\nno match for the pattern (as a regex: `{}`)\n",
        re.as_str()
    );
    let after = match after {
        Some(p) => format!(", after the match of line {}", p.line),
        None => String::new(),
    };
    let _ = writeln!(
        r,
        "searched output lines {} to {}{after}; matching started here:",
        start + 1,
        last + 1
    );
    r.push_str(&out.excerpt(start, (start + CONTEXT).min(last), Some(start)));
    if start + CONTEXT < last {
        let _ = writeln!(r, "         ... ({} more lines)", last - start - CONTEXT);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(checks: &str, output: &str) -> Result<(), String> {
        let d = parse_directives(checks, &["CHECK".to_string()], &["CHECK".to_string()])?;
        check(&d, &[], output)
    }

    const OUT: &str = "\
.entry a
\tld.global.v4.f32 {%f1, %f2}, [%rd1];
\tadd.f32 %f3, %f1, %f2;
\tst.global.f32 [%rd2], %f3;
.entry b
\tld.global.f32 %f1, [%rd1];
\tst.global.f32 [%rd2], %f1;
";

    #[test]
    fn checks_match_in_order() {
        run("#CHECK: ld.global.v4\n#CHECK: st.global", OUT).unwrap();
        let e = run("#CHECK: st.global\n#CHECK: ld.global.v4", OUT).unwrap_err();
        assert!(e.contains("line 2: #CHECK: ld.global.v4"), "{e}");
        assert!(e.contains("no match"), "{e}");
        assert!(e.contains("searched output lines 4 to 7"), "{e}");
    }

    #[test]
    fn whitespace_runs_match_tabs_and_regexes_and_variables() {
        run("#CHECK: add.f32 %f3, {{%f[0-9]+}}, %f2", OUT).unwrap();
        run(
            "#CHECK: ld.global.v4.f32 {[[A:%f[0-9]+]]\n#CHECK: add.f32 %f3, [[A]]",
            OUT,
        )
        .unwrap();
        let e = run(
            "#CHECK: ld.global.v4.f32 {[[A:%f[0-9]+]]\n#CHECK: add.f32 %f3, %f2, [[A]]",
            OUT,
        )
        .unwrap_err();
        assert!(e.contains("no match"), "{e}");
        // Tabs in the output, a space in the pattern.
        run("#CHECK: .entry a\n#CHECK-NEXT: ld.global.v4.f32 {", OUT).unwrap();
    }

    #[test]
    fn next_and_same_check_the_line() {
        run(
            "#CHECK: .entry a\n#CHECK-NEXT: ld.global\n#CHECK-SAME: [%rd1]",
            OUT,
        )
        .unwrap();
        let e = run("#CHECK: .entry a\n#CHECK-NEXT: add.f32", OUT).unwrap_err();
        assert!(
            e.contains("on the line after the previous match (output line 2)"),
            "{e}"
        );
        assert!(e.contains("first match is on output line 3"), "{e}");
        let e = run("#CHECK: .entry a\n#CHECK-SAME: ld.global", OUT).unwrap_err();
        assert!(e.contains("previous match's line"), "{e}");
        let e = run("#CHECK-NEXT: .entry a", OUT).unwrap_err();
        assert!(e.contains("needs a previous match"), "{e}");
    }

    #[test]
    fn not_between_matches_and_to_the_end() {
        run(
            "#CHECK: .entry a\n#CHECK-NOT: ld.global.f32\n#CHECK: .entry b",
            OUT,
        )
        .unwrap();
        let e = run(
            "#CHECK: .entry a\n#CHECK-NOT: add.f32\n#CHECK: .entry b",
            OUT,
        )
        .unwrap_err();
        assert!(e.contains("matches output line 3"), "{e}");
        assert!(e.contains(">    3 | \tadd.f32"), "{e}");
        let e = run("#CHECK: .entry b\n#CHECK-NOT: st.global", OUT).unwrap_err();
        assert!(e.contains("matches output line 7"), "{e}");
    }

    #[test]
    fn labels_confine_their_checks() {
        // `ld.global.f32` occurs only in b: a's section must not see it.
        run("#CHECK-LABEL: .entry b\n#CHECK: ld.global.f32", OUT).unwrap();
        let e = run(
            "#CHECK-LABEL: .entry a\n#CHECK: ld.global.f32\n#CHECK-LABEL: .entry b",
            OUT,
        )
        .unwrap_err();
        assert!(e.contains("searched output lines 1 to 4"), "{e}");
        let e = run(
            "#CHECK-LABEL: .entry a\n#CHECK-NOT: ld.global.f32 \n#CHECK-LABEL: .entry b",
            OUT,
        );
        assert!(e.is_ok(), "{e:?}");
        let e = run("#CHECK-LABEL: .entry c", OUT).unwrap_err();
        assert!(e.contains("no match"), "{e}");
    }

    #[test]
    fn implicit_nots_hold_everywhere() {
        let d = parse_directives("#CHECK: .entry b", &["CHECK".to_string()], &[]).unwrap();
        check(&d, &[implicit_not("ld.global.v8", 1).unwrap()], OUT).unwrap();
        let e = check(&d, &[implicit_not("add.f32", 1).unwrap()], OUT).unwrap_err();
        assert!(e.contains("line 1: --implicit-check-not add.f32"), "{e}");
        assert!(e.contains("matches output line 3"), "{e}");
    }

    #[test]
    fn count_matches_that_many_times() {
        run("#CHECK-COUNT-2: st.global.f32", OUT).unwrap();
        let e = run("#CHECK-COUNT-3: st.global.f32", OUT).unwrap_err();
        assert!(e.contains("(2 of the 3 matches were found)"), "{e}");
    }

    #[test]
    fn misspelt_and_malformed_directives_are_errors() {
        let p = ["CHECK".to_string()];
        assert!(parse_directives("#CHEK-NOT: x", &p, &p).is_err());
        assert!(parse_directives("#CHECKX: x", &p, &p).is_err());
        assert!(parse_directives("#CHECK-NEXXT: x", &p, &p).is_err());
        assert!(parse_directives("#CHECK:   ", &p, &p).is_err());
        assert!(parse_directives("#CHECK: {{(}}", &p, &p).is_err());
        // Ordinary comments are not directives.
        let d = parse_directives("# A note: text\n#TODO: later\nx = 1 # y: z", &p, &p).unwrap();
        assert!(d.is_empty());
        // Another run's prefix is fine.
        let both = ["CHECK".to_string(), "SM70".to_string()];
        let d = parse_directives("#SM70-NOT: cp.async\n#CHECK: x", &p, &both).unwrap();
        assert_eq!(d.len(), 1);
    }
}
