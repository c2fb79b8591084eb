//! Rendering of diagnostics: for terminals (ariadne) and for tools (JSON lines),
//! plus the byte-offset → line/column index both of them (and the language
//! server) use.
//!
//! Positions are 1-based; a column counts characters (not bytes), so a span
//! after `é` or `→` lands in the column a reader sees. Offsets past the end of the
//! text or inside a multi-byte character are clamped (to the end, or down to the
//! start of that character) rather than trusted, so a bad span can never make
//! rendering panic.

use std::ops::Range;

use ariadne::{CharSet, Color, Config, IndexType, Label as ALabel, Report, ReportKind, Source};
use codespan_reporting::files;
use serde::Serialize;

use super::{Diagnostic, Severity};
use crate::syntax::span::Span;

/// A 1-based line and character column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Position {
    pub line: u32,
    pub column: u32,
}

/// Line starts of one text (lines end at `\n`, `\r\n` or a lone `\r`, see
/// `syntax::lines`).
#[derive(Clone, Debug)]
pub struct LineIndex<'a> {
    text: &'a str,
    line_starts: Vec<usize>,
    /// Whether each line is all ASCII: there a column is a byte count, found
    /// without walking the line (a long line with many diagnostics would
    /// otherwise cost its length for each).
    ascii: Vec<bool>,
}

impl<'a> LineIndex<'a> {
    pub fn new(text: &'a str) -> Self {
        let line_starts: Vec<usize> = crate::syntax::lines::line_starts(text).collect();
        let ascii = (0..line_starts.len())
            .map(|i| {
                let end = line_starts.get(i + 1).copied().unwrap_or(text.len());
                text.as_bytes()[line_starts[i]..end].is_ascii()
            })
            .collect();
        LineIndex {
            text,
            line_starts,
            ascii,
        }
    }

    pub fn text(&self) -> &'a str {
        self.text
    }

    /// Number of lines (a text ending in `\n` has an empty last line).
    pub fn line_count(&self) -> usize {
        self.line_starts.len()
    }

    /// `offset` moved into the text and down onto a character boundary.
    pub fn clamp(&self, offset: u32) -> usize {
        let mut o = (offset as usize).min(self.text.len());
        while !self.text.is_char_boundary(o) {
            o -= 1;
        }
        o
    }

    /// A span with both ends clamped (see `clamp`) and `start <= end`.
    pub fn clamp_span(&self, span: Span) -> Range<usize> {
        let start = self.clamp(span.start);
        let end = self.clamp(span.end).max(start);
        start..end
    }

    /// 0-based index of the line holding `offset` (already clamped).
    fn line_of(&self, offset: usize) -> usize {
        match self.line_starts.binary_search(&offset) {
            Ok(line) => line,
            Err(next) => next - 1,
        }
    }

    /// Byte range of a 0-based line, without its line break.
    pub fn line_range(&self, line: usize) -> Range<usize> {
        let start = self.line_starts[line];
        let next = self.line_starts.get(line + 1).copied();
        let end = next.map_or(self.text.len(), |next| {
            start + crate::syntax::lines::strip_break(&self.text[start..next]).len()
        });
        start..end
    }

    /// The 1-based line and character column of a byte offset.
    pub fn position(&self, offset: u32) -> Position {
        let offset = self.clamp(offset);
        let line = self.line_of(offset);
        let range = self.line_range(line);
        let column = if self.ascii[line] {
            offset.min(range.end) - range.start
        } else {
            files::column_index(self.text, range, offset)
        };
        Position {
            line: line as u32 + 1,
            column: column as u32 + 1,
        }
    }

    /// The byte offset of a 1-based position; a column past the end of its line
    /// gives the line's end, a line past the end of the text the text's end.
    pub fn offset(&self, pos: Position) -> u32 {
        let Some(line) = (pos.line as usize).checked_sub(1) else {
            return 0;
        };
        if line >= self.line_count() {
            return self.text.len() as u32;
        }
        let range = self.line_range(line);
        let skip = (pos.column as usize).saturating_sub(1);
        let offset = self.text[range.clone()]
            .char_indices()
            .nth(skip)
            .map(|(i, _)| range.start + i)
            .unwrap_or(range.end);
        offset as u32
    }
}

/// `text` with the characters ariadne ends lines at but the language does not
/// (vertical tab, form feed, NEL, U+2028, U+2029) replaced by spaces of the same
/// byte length, so ariadne's line numbers are `LineIndex`'s.
pub fn text_for_ariadne(text: &str) -> std::borrow::Cow<'_, str> {
    let odd = |c: char| matches!(c, '\x0B' | '\x0C' | '\u{85}' | '\u{2028}' | '\u{2029}');
    if !text.contains(odd) {
        return std::borrow::Cow::Borrowed(text);
    }
    let same_width_space = |c: char| match c.len_utf8() {
        1 => ' ',
        2 => '\u{A0}',
        _ => '\u{2007}',
    };
    std::borrow::Cow::Owned(
        text.chars()
            .map(|c| if odd(c) { same_width_space(c) } else { c })
            .collect(),
    )
}

/// Human rendering of one diagnostic: `error[E0401]: message`, the file, line and
/// column, the source with the primary and secondary labels, and the help line.
/// `color` should be true only when writing to a terminal and `NO_COLOR` is unset.
pub fn render_human(path: &str, text: &str, diag: &Diagnostic, color: bool) -> String {
    render_human_all(path, text, std::slice::from_ref(diag), color)
}

/// Human rendering of several diagnostics of one file, each followed by a blank line.
pub fn render_human_all(path: &str, text: &str, diags: &[Diagnostic], color: bool) -> String {
    // A clean file renders nothing: skip indexing and copying its text (a
    // large generated file is most of `tsrc check`'s time otherwise).
    if diags.is_empty() {
        return String::new();
    }
    let index = LineIndex::new(text);
    let shown = text_for_ariadne(text);
    let source = Source::from(&*shown);
    let mut out = Vec::new();
    for diag in diags {
        write_report(path, &index, &source, diag, color, &mut out);
        out.push(b'\n');
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// How many diagnostics of one file [`render_human_capped`] prints: a generated
/// file can have thousands, and the first hundred say what is wrong.
pub const MAX_SHOWN: usize = 100;

/// Like [`render_human_all`], but after `limit` diagnostics one line says how
/// many more errors and warnings there are (`--message-format json` lists all).
pub fn render_human_capped(
    path: &str,
    text: &str,
    diags: &[Diagnostic],
    color: bool,
    limit: usize,
) -> String {
    if diags.len() <= limit {
        return render_human_all(path, text, diags, color);
    }
    let mut out = render_human_all(path, text, &diags[..limit], color);
    let rest = &diags[limit..];
    let count = |sev| rest.iter().filter(|d| d.severity == sev).count();
    let mut parts = Vec::new();
    for (n, word) in [
        (count(Severity::Error), "error"),
        (count(Severity::Warning), "warning"),
        (count(Severity::Note), "note"),
    ] {
        if n > 0 {
            parts.push(format!("{n} more {word}{}", if n == 1 { "" } else { "s" }));
        }
    }
    out.push_str(&format!(
        "note: {} in `{path}` not shown (only the first {limit} are); \
         `--message-format json` lists them all\n\n",
        parts.join(" and ")
    ));
    out
}

fn write_report(
    path: &str,
    index: &LineIndex<'_>,
    source: &Source<&str>,
    diag: &Diagnostic,
    color: bool,
    out: &mut Vec<u8>,
) {
    let (word, accent) = match diag.severity {
        Severity::Error => ("error", Color::Red),
        Severity::Warning => ("warning", Color::Yellow),
        Severity::Note => ("note", Color::Cyan),
    };
    let kind = format!("{word}[{}]", diag.code);
    let id = path.to_string();
    let primary = index.clamp_span(diag.span);
    let ranges: Vec<Range<usize>> = std::iter::once(primary.clone())
        .chain(diag.labels.iter().map(|l| index.clamp_span(l.span)))
        .collect();
    // A long line is shown clipped: ariadne prints each line whole, so a
    // generated line with thousands of diagnostics would cost its length for each.
    let clipped = Clipped::new(index, &ranges);
    let map = |r: &Range<usize>| match &clipped {
        Some(c) => c.map(r.start)..c.map(r.end),
        None => r.clone(),
    };
    let config = Config::new()
        .with_color(color)
        .with_index_type(IndexType::Byte)
        .with_char_set(CharSet::Unicode);
    // ariadne draws no underline for a label without a message: fall back to the
    // code's catalogue title so the primary span is always visible.
    let primary_message = if diag.primary_label.is_empty() {
        super::codes::lookup(diag.code).map_or("here", |c| c.title)
    } else {
        &diag.primary_label
    };
    // ariadne starts a new snippet (with a repeated, misleading `├─[ file:line:col ]`
    // header) whenever a label sorts before the line of the previous one, so labels
    // are ordered by the line they end on, the primary first within its line.
    let order = |r: &Range<usize>, secondary: bool| {
        let last = if r.is_empty() { r.start } else { r.end - 1 };
        let line = index.line_of(last) as i32;
        line.saturating_mul(2).saturating_add(secondary as i32)
    };
    let mut primary_label = ALabel::new((id.clone(), map(&primary)))
        .with_order(order(&primary, false))
        .with_message(primary_message);
    if color {
        primary_label = primary_label.with_color(accent);
    }
    let mut report = Report::build(
        ReportKind::Custom(&kind, accent),
        (id.clone(), map(&primary)),
    )
    .with_config(config)
    .with_message(&diag.message)
    .with_label(primary_label);
    for (label, range) in diag.labels.iter().zip(&ranges[1..]) {
        let mut l = ALabel::new((id.clone(), map(range)))
            .with_message(&label.message)
            .with_order(order(range, true));
        if color {
            l = l.with_color(Color::Blue);
        }
        report = report.with_label(l);
    }
    if let Some(help) = &diag.help {
        report = report.with_help(help);
    }
    // Writing into a Vec cannot fail, and the source is in the cache.
    let mut buf = Vec::new();
    match &clipped {
        None => {
            let _ = report.finish().write((id, source), &mut buf);
        }
        Some(c) => {
            let shown = text_for_ariadne(&c.text);
            let _ = report
                .finish()
                .write((id.clone(), Source::from(&*shown)), &mut buf);
            fix_header_column(&mut buf, &id, index, c, primary.start);
        }
    }
    if color {
        out.extend_from_slice(&buf);
    } else {
        // ariadne colours a custom report kind even with colour off.
        out.extend_from_slice(strip_ansi(&String::from_utf8_lossy(&buf)).as_bytes());
    }
}

/// Lines longer than this (in bytes) are shown clipped around their labels.
const CLIP_LINE_BYTES: usize = 200;
/// Characters kept on each side of a label's end on a clipped line.
const CLIP_CONTEXT_CHARS: usize = 40;
/// Marks where a clipped line leaves characters out.
const ELLIPSIS: &str = "…";

/// The lines a diagnostic shows, with each long one cut down to windows
/// around its labels' ends (joined by `…`). The text starts with one empty line
/// for each line before the first shown, so line numbers stay the file's.
struct Clipped {
    text: String,
    /// Pieces of the file kept, in order: `(start, end, start in text)`.
    kept: Vec<(usize, usize, usize)>,
}

impl Clipped {
    /// None when no line the ranges touch is long.
    fn new(index: &LineIndex<'_>, ranges: &[Range<usize>]) -> Option<Clipped> {
        let first = ranges.iter().map(|r| index.line_of(r.start)).min()?;
        let last = ranges.iter().map(|r| index.line_of(r.end)).max()?;
        if (first..=last).all(|l| index.line_range(l).len() <= CLIP_LINE_BYTES) {
            return None;
        }
        let text = index.text();
        let mut points: Vec<usize> = ranges.iter().flat_map(|r| [r.start, r.end]).collect();
        points.sort_unstable();
        let mut c = Clipped {
            text: "\n".repeat(first),
            kept: Vec::new(),
        };
        for line in first..=last {
            let range = index.line_range(line);
            if range.len() <= CLIP_LINE_BYTES {
                c.keep(text, range);
            } else {
                let lo = points.partition_point(|&p| p < range.start);
                let hi = points.partition_point(|&p| p <= range.end);
                let mut windows: Vec<Range<usize>> = Vec::new();
                let at = if lo == hi {
                    // A line a label only passes through: its start is enough.
                    &[range.start][..]
                } else {
                    &points[lo..hi]
                };
                for &p in at {
                    let w = back(text, p, range.start)..ahead(text, p, range.end);
                    match windows.last_mut() {
                        // Windows that touch (or nearly) are one.
                        Some(prev) if w.start <= prev.end + ELLIPSIS.len() => {
                            prev.end = prev.end.max(w.end)
                        }
                        _ => windows.push(w),
                    }
                }
                if windows[0].start > range.start {
                    c.text.push_str(ELLIPSIS);
                }
                for (i, w) in windows.iter().enumerate() {
                    if i > 0 {
                        c.text.push_str(ELLIPSIS);
                    }
                    c.keep(text, w.clone());
                }
                if windows.last().is_some_and(|w| w.end < range.end) {
                    c.text.push_str(ELLIPSIS);
                }
            }
            c.text.push('\n');
        }
        Some(c)
    }

    fn keep(&mut self, text: &str, r: Range<usize>) {
        self.kept.push((r.start, r.end, self.text.len()));
        self.text.push_str(&text[r]);
    }

    /// Where a label's end (one of the points kept) lies in the clipped text.
    fn map(&self, offset: usize) -> usize {
        let i = self.kept.partition_point(|k| k.1 < offset);
        match self.kept.get(i) {
            Some(&(start, _, at)) if start <= offset => at + (offset - start),
            // Not reached: every label's end is kept.
            _ => self.text.len(),
        }
    }
}

/// The offset `CLIP_CONTEXT_CHARS` characters before `p`, not before `floor`.
fn back(text: &str, p: usize, floor: usize) -> usize {
    text[floor..p]
        .char_indices()
        .rev()
        .take(CLIP_CONTEXT_CHARS)
        .last()
        .map_or(p, |(i, _)| floor + i)
}

/// The offset `CLIP_CONTEXT_CHARS` characters after `p`, not past `ceiling`.
fn ahead(text: &str, p: usize, ceiling: usize) -> usize {
    text[p..ceiling]
        .char_indices()
        .nth(CLIP_CONTEXT_CHARS)
        .map_or(ceiling, |(i, _)| p + i)
}

/// ariadne's `file:line:column` header counts the column in the clipped line;
/// this puts the file's column back.
fn fix_header_column(
    buf: &mut Vec<u8>,
    id: &str,
    index: &LineIndex<'_>,
    c: &Clipped,
    primary: usize,
) {
    let at = c.map(primary);
    let line_start = c.text[..at].rfind('\n').map_or(0, |i| i + 1);
    let shown = c.text[line_start..at].chars().count() + 1;
    let pos = index.position(primary as u32);
    if shown as u32 == pos.column {
        return;
    }
    let text = String::from_utf8_lossy(buf).into_owned();
    let wrong = format!(" {id}:{}:{shown} ", pos.line);
    // The header follows the message's first line.
    let from = text.find('\n').map_or(0, |i| i + 1);
    if let Some(i) = text[from..].find(&wrong) {
        let i = from + i;
        let right = format!(" {id}:{}:{} ", pos.line, pos.column);
        let mut fixed = String::with_capacity(text.len() + 8);
        fixed.push_str(&text[..i]);
        fixed.push_str(&right);
        fixed.push_str(&text[i + wrong.len()..]);
        *buf = fixed.into_bytes();
    }
}

/// `text` without ANSI escape sequences (`ESC [ ... final-byte`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// One labelled span in JSON output. Ends are exclusive (the position just after
/// the last character), like the language server protocol's ranges.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JsonLabel {
    pub line: u32,
    pub column: u32,
    pub end_line: u32,
    pub end_column: u32,
    pub message: String,
}

/// One diagnostic as `--message-format json` prints it (one object per line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JsonDiagnostic {
    pub code: &'static str,
    pub severity: &'static str,
    pub message: String,
    pub file: String,
    pub line: u32,
    pub column: u32,
    pub end_line: u32,
    pub end_column: u32,
    /// The message printed under the primary span; null when it has none.
    pub label: Option<String>,
    pub help: Option<String>,
    pub labels: Vec<JsonLabel>,
}

impl JsonDiagnostic {
    pub fn new(path: &str, index: &LineIndex<'_>, diag: &Diagnostic) -> Self {
        let range = index.clamp_span(diag.span);
        let start = index.position(range.start as u32);
        let end = index.position(range.end as u32);
        JsonDiagnostic {
            code: diag.code,
            severity: diag.severity.as_str(),
            message: diag.message.clone(),
            file: path.to_string(),
            line: start.line,
            column: start.column,
            end_line: end.line,
            end_column: end.column,
            label: (!diag.primary_label.is_empty()).then(|| diag.primary_label.clone()),
            help: diag.help.clone(),
            labels: diag
                .labels
                .iter()
                .map(|l| {
                    let range = index.clamp_span(l.span);
                    let start = index.position(range.start as u32);
                    let end = index.position(range.end as u32);
                    JsonLabel {
                        line: start.line,
                        column: start.column,
                        end_line: end.line,
                        end_column: end.column,
                        message: l.message.clone(),
                    }
                })
                .collect(),
        }
    }
}

/// One diagnostic as a single line of JSON (no trailing newline).
pub fn render_json(path: &str, index: &LineIndex<'_>, diag: &Diagnostic) -> String {
    serde_json::to_string(&JsonDiagnostic::new(path, index, diag))
        .expect("a JsonDiagnostic always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Diagnostic;

    const GEMM_CALL: &str = "def f(a: Tensor[128, 64, f16], b: Tensor[32, 256, f16]):\n    \
        c = gemm(a, b)\n    return c\n";

    fn find(text: &str, needle: &str) -> Span {
        let start = text.find(needle).unwrap();
        Span::from_range(start..start + needle.len())
    }

    fn dim_conflict() -> Diagnostic {
        let t = GEMM_CALL;
        Diagnostic::new("E0401", find(t, "b)"), "dim `K` is bound to 64 and to 32")
            .with_primary_label("`K` is 32 here (dim 0 of `B`)")
            .with_label(find(t, "a,"), "`K` is 64 here (dim 1 of `A`)")
            .with_help("the inner dims of `A` and `B` must be equal")
    }

    #[test]
    fn positions_are_one_based_and_count_characters() {
        let text = "ab\n→x é\n\nlast";
        let idx = LineIndex::new(text);
        assert_eq!(idx.line_count(), 4);
        assert_eq!(idx.position(0), Position { line: 1, column: 1 });
        assert_eq!(idx.position(2), Position { line: 1, column: 3 });
        assert_eq!(idx.position(3), Position { line: 2, column: 1 });
        // `→` is 3 bytes: `x` is at byte 6, column 2.
        assert_eq!(idx.position(6), Position { line: 2, column: 2 });
        let e = text.find('é').unwrap() as u32;
        assert_eq!(idx.position(e), Position { line: 2, column: 4 });
        // Inside `é`: rounded down to its start.
        assert_eq!(idx.position(e + 1), Position { line: 2, column: 4 });
        assert_eq!(idx.position(e + 2), Position { line: 2, column: 5 });
        assert_eq!(
            idx.position(text.find("\n\n").unwrap() as u32 + 1),
            Position { line: 3, column: 1 }
        );
        assert_eq!(
            idx.position(text.len() as u32),
            Position { line: 4, column: 5 }
        );
        assert_eq!(idx.position(9999), Position { line: 4, column: 5 });
    }

    #[test]
    fn offset_inverts_position() {
        let text = "ab\n→x é\r\n\nlast";
        let idx = LineIndex::new(text);
        for (o, _) in text.char_indices().chain([(text.len(), ' ')]) {
            // the `\n` of a `\r\n` is inside one line break, not a position of its own
            if text[..o].ends_with('\r') && text[o..].starts_with('\n') {
                continue;
            }
            assert_eq!(idx.offset(idx.position(o as u32)) as usize, o, "offset {o}");
        }
        assert_eq!(
            idx.offset(Position {
                line: 1,
                column: 99
            }),
            2
        );
        assert_eq!(
            idx.offset(Position {
                line: 99,
                column: 1
            }),
            text.len() as u32
        );
    }

    #[test]
    fn empty_text_has_one_line() {
        let idx = LineIndex::new("");
        assert_eq!(idx.line_count(), 1);
        assert_eq!(idx.position(0), Position { line: 1, column: 1 });
        assert_eq!(idx.position(5), Position { line: 1, column: 1 });
    }

    #[test]
    fn human_error_with_labels_and_help() {
        let out = render_human("gemm_call.tsr", GEMM_CALL, &dim_conflict(), false);
        insta::assert_snapshot!(out);
    }

    #[test]
    fn human_warning_without_labels() {
        let text = "def f(x: f32):\n    unused = x * 2.0\n    return x\n";
        let d = Diagnostic::new(
            "W0001",
            find(text, "unused"),
            "variable `unused` is never used",
        )
        .with_help("remove it, or name it `_unused`");
        insta::assert_snapshot!(render_human("w.tsr", text, &d, false));
    }

    #[test]
    fn human_span_at_end_of_file_and_unicode() {
        let text = "# données → sortie\ndef f(x: f32):\n    return (x";
        let eof = text.len() as u32;
        let d = Diagnostic::new("E0102", Span::new(eof, eof), "unexpected end of input")
            .with_primary_label("expected `)`")
            .with_label(
                Span::new(
                    text.rfind('(').unwrap() as u32,
                    text.rfind('(').unwrap() as u32 + 1,
                ),
                "this `(` is never closed",
            );
        insta::assert_snapshot!(render_human("eof.tsr", text, &d, false));
    }

    #[test]
    fn human_label_above_the_primary_stays_in_one_snippet() {
        let text = "def k():\n    acc = zeros([16], f32)\n    for i in range(0, 4):\n        acc = zeros([32], f32)\n";
        let second = text.rfind("acc").unwrap() as u32;
        let first = text.find("acc").unwrap() as u32;
        let d = Diagnostic::new(
            "E0407",
            Span::new(second, second + 3),
            "`acc` changes shape in the loop",
        )
        .with_primary_label("now `Tile[32, f32]`")
        .with_label(
            Span::new(first, first + 3),
            "before the loop, `Tile[16, f32]`",
        );
        let out = render_human("loop.tsr", text, &d, false);
        assert!(!out.contains("├─["), "{out}");
        assert!(out.contains("loop.tsr:4:9"), "{out}");
        insta::assert_snapshot!(out);
    }

    #[test]
    fn human_rendering_survives_bad_spans() {
        let text = "é\nx";
        for span in [
            Span::new(1, 2),
            Span::new(50, 60),
            Span::new(3, 1),
            Span::new(0, 0),
        ] {
            let d = Diagnostic::new("E0107", span, "bad").with_label(span, "here");
            let out = render_human("bad.tsr", text, &d, false);
            assert!(out.starts_with("error[E0107]: bad"), "{out}");
        }
    }

    /// `x = é & é & … & é` with `n` terms (a non-ASCII name: clipping must cut
    /// on character boundaries and count columns in characters).
    fn long_line(n: usize) -> String {
        format!("x = {}\ny = 1\n", vec!["é"; n].join(" & "))
    }

    /// The span of the `i`th `é` of `long_line`.
    fn term(text: &str, i: usize) -> Span {
        let start = text.match_indices('é').nth(i).unwrap().0;
        Span::from_range(start..start + 'é'.len_utf8())
    }

    #[test]
    fn long_line_is_clipped_around_the_labels() {
        let text = long_line(3000);
        let d = Diagnostic::new("E0201", term(&text, 1500), "unknown name `é`")
            .with_primary_label("unknown name")
            .with_label(term(&text, 2990), "also here")
            .with_help("define it first");
        let out = render_human("long.tsr", &text, &d, false);
        // The column is the file's: 4 characters before the first term, 4 per term.
        assert!(out.contains("long.tsr:1:6005 "), "{out}");
        assert!(out.len() < 1500, "{} bytes:\n{out}", out.len());
        insta::assert_snapshot!(out);
        // The start and the end of a line stay unclipped where labelled.
        let d = Diagnostic::new("E0201", term(&text, 0), "unknown name `é`")
            .with_label(term(&text, 2999), "last");
        let out = render_human("long.tsr", &text, &d, false);
        assert!(out.contains("long.tsr:1:5 "), "{out}");
        assert!(out.contains(" 1 │ x = é & é"), "{out}");
        assert!(out.contains("& é\n"), "{out}");
    }

    #[test]
    fn clipped_rendering_does_not_grow_with_the_line() {
        let size = |n: usize| {
            let text = long_line(n);
            let d = Diagnostic::new("E0201", term(&text, n / 2), "unknown name `é`")
                .with_primary_label("unknown name");
            render_human("long.tsr", &text, &d, false).len()
        };
        // Only the header's column gets longer.
        assert!(size(100_000) <= size(1_000) + 3);
    }

    #[test]
    fn label_through_a_long_line_and_bad_spans_on_one() {
        let text = format!("if (\n{}\n):\n", "b + ".repeat(300));
        let open = text.find('(').unwrap() as u32;
        let close = text.rfind(')').unwrap() as u32;
        let d = Diagnostic::new("E0102", Span::new(open, close + 1), "bad group")
            .with_primary_label("this group");
        let out = render_human("group.tsr", &text, &d, false);
        assert!(out.contains("group.tsr:1:4 "), "{out}");
        assert!(out.contains(" 3 │ ├─▶ ):"), "{out}");
        assert!(out.len() < 1000, "{out}");
        // The long line itself is shown (clipped) when it holds a label's end.
        let plus = text.rfind('+').unwrap() as u32;
        let d = d.with_label(Span::new(plus, plus + 1), "the last `+`");
        let out = render_human("group.tsr", &text, &d, false);
        assert!(out.contains(" 2 │ │   …+ b + b + b"), "{out}");
        assert!(out.len() < 1500, "{out}");
        let text = long_line(500);
        let mid = term(&text, 250).start;
        for span in [
            Span::new(mid + 1, mid + 2),
            Span::new(mid, text.len() as u32 + 50),
            Span::new(mid + 9, mid),
            Span::new(0, text.len() as u32),
        ] {
            let d = Diagnostic::new("E0107", span, "bad").with_label(span, "here");
            let out = render_human("bad.tsr", &text, &d, false);
            assert!(out.starts_with("error[E0107]: bad"), "{out}");
        }
    }

    #[test]
    fn capped_rendering_counts_what_it_leaves_out() {
        let text = "x = a\n";
        let mut diags: Vec<Diagnostic> = (0..4)
            .map(|_| Diagnostic::new("E0201", Span::new(4, 5), "unknown name `a`"))
            .collect();
        diags.push(Diagnostic::new("W0001", Span::new(0, 1), "unused"));
        assert_eq!(
            render_human_capped("c.tsr", text, &diags, false, 5),
            render_human_all("c.tsr", text, &diags, false)
        );
        let out = render_human_capped("c.tsr", text, &diags, false, 2);
        assert_eq!(out.matches("error[E0201]").count(), 2);
        assert!(!out.contains("warning["), "{out}");
        assert!(out.ends_with(
            "note: 2 more errors and 1 more warning in `c.tsr` not shown (only the first 2 \
             are); `--message-format json` lists them all\n\n"
        ));
    }

    #[test]
    fn colour_only_when_asked() {
        let plain = render_human("gemm_call.tsr", GEMM_CALL, &dim_conflict(), false);
        let coloured = render_human("gemm_call.tsr", GEMM_CALL, &dim_conflict(), true);
        assert!(!plain.contains('\u{1b}'));
        assert!(coloured.contains('\u{1b}'));
    }

    #[test]
    fn json_line_has_the_documented_fields() {
        let idx = LineIndex::new(GEMM_CALL);
        let line = render_json("gemm_call.tsr", &idx, &dim_conflict());
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["code"], "E0401");
        assert_eq!(v["severity"], "error");
        assert_eq!(v["message"], "dim `K` is bound to 64 and to 32");
        assert_eq!(v["file"], "gemm_call.tsr");
        assert_eq!(
            (v["line"].as_u64(), v["column"].as_u64()),
            (Some(2), Some(17))
        );
        assert_eq!(
            (v["end_line"].as_u64(), v["end_column"].as_u64()),
            (Some(2), Some(19))
        );
        assert_eq!(v["label"], "`K` is 32 here (dim 0 of `B`)");
        assert_eq!(v["help"], "the inner dims of `A` and `B` must be equal");
        let labels = v["labels"].as_array().unwrap();
        assert_eq!(labels.len(), 1);
        assert_eq!(labels[0]["line"], 2);
        assert_eq!(labels[0]["column"], 14);
        assert_eq!(labels[0]["end_column"], 16);
        assert_eq!(labels[0]["message"], "`K` is 64 here (dim 1 of `A`)");

        let bare = Diagnostic::new("W0002", Span::new(0, 3), "unused import");
        let v: serde_json::Value =
            serde_json::from_str(&render_json("x.tsr", &idx, &bare)).unwrap();
        assert!(v["help"].is_null());
        assert!(v["label"].is_null());
        assert_eq!(v["severity"], "warning");
        assert_eq!(v["labels"].as_array().unwrap().len(), 0);

        // A note is neither: `note` in JSON and in the human header.
        let note = Diagnostic::new("W0006", Span::new(0, 3), "low occupancy, latency hidden");
        let v: serde_json::Value =
            serde_json::from_str(&render_json("x.tsr", &idx, &note)).unwrap();
        assert_eq!(v["severity"], "note");
        let human = render_human_all("x.tsr", "abc\n", &[note], false);
        assert!(human.starts_with("note[W0006]: "), "{human}");
    }
}
