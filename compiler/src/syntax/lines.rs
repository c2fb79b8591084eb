//! What ends a line: `\n`, `\r\n` or a lone `\r`, as Python and the LSP spec
//! count them. The lexer, comments, the item splitter, diagnostic positions, the
//! REPL and the language server all use these, so a file has the same lines for
//! the compiler as for the editor.

/// Whether `b` may start a line break (`\n` or `\r`).
pub fn is_break_byte(b: u8) -> bool {
    b == b'\n' || b == b'\r'
}

/// Length of the line break starting at byte `i` of `b`: 2 for `\r\n`, 1 for a
/// lone `\r` or `\n`, 0 when no break starts there.
pub fn break_len(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(b'\n') => 1,
        Some(b'\r') if b.get(i + 1) == Some(&b'\n') => 2,
        Some(b'\r') => 1,
        _ => 0,
    }
}

/// Byte offsets where lines start: 0, then just after each break. A text ending
/// in a break has an empty last line.
pub fn line_starts(text: &str) -> impl Iterator<Item = usize> + '_ {
    let b = text.as_bytes();
    std::iter::once(0).chain(b.iter().enumerate().filter_map(move |(i, &c)| {
        // the `\r` of `\r\n` does not end a line on its own
        let ends = c == b'\n' || (c == b'\r' && b.get(i + 1) != Some(&b'\n'));
        ends.then_some(i + 1)
    }))
}

/// Start of the line holding byte `offset` (a `\r\n` belongs to the line it ends).
pub fn line_start(text: &str, offset: usize) -> usize {
    let b = text.as_bytes();
    let mut end = offset.min(b.len());
    // an offset between the `\r` and `\n` of one break is still on the line it ends
    if end > 0 && end < b.len() && b[end - 1] == b'\r' && b[end] == b'\n' {
        end -= 1;
    }
    b[..end]
        .iter()
        .rposition(|&c| is_break_byte(c))
        .map_or(0, |i| i + 1)
}

/// 0-based number of the line holding byte `offset`.
pub fn line_number(text: &str, offset: usize) -> usize {
    line_starts(text).take_while(|&s| s <= offset).count() - 1
}

/// `text` without one trailing line break.
pub fn strip_break(text: &str) -> &str {
    text.strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .or_else(|| text.strip_suffix('\r'))
        .unwrap_or(text)
}

/// The lines of `text` without their breaks, like `str::lines` but also ending
/// a line at a lone `\r`; a final break does not add an empty line.
pub fn lines(text: &str) -> impl Iterator<Item = &str> + '_ {
    let b = text.as_bytes();
    let mut pos = 0;
    std::iter::from_fn(move || {
        if pos >= b.len() {
            return None;
        }
        let start = pos;
        let mut i = pos;
        while i < b.len() && !is_break_byte(b[i]) {
            i += 1;
        }
        pos = i + break_len(b, i).max(1);
        Some(&text[start..i])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_break_ends_one_line() {
        let text = "a\nb\r\nc\rd\r\r\ne";
        let starts: Vec<usize> = line_starts(text).collect();
        assert_eq!(starts, [0, 2, 5, 7, 9, 11]);
        let ls: Vec<&str> = lines(text).collect();
        assert_eq!(ls, ["a", "b", "c", "d", "", "e"]);
        assert_eq!(lines("x\r").collect::<Vec<_>>(), ["x"]);
        assert_eq!(lines("").count(), 0);
        for (i, &s) in starts.iter().enumerate() {
            let end = starts.get(i + 1).copied().unwrap_or(text.len());
            for o in s..end {
                assert_eq!(line_start(text, o), s, "offset {o}");
            }
        }
        assert_eq!(line_start(text, text.len()), 11);
        assert_eq!(line_number(text, 0), 0);
        assert_eq!(line_number(text, 6), 2);
        assert_eq!(line_number(text, 7), 3);
        assert_eq!(line_number(text, text.len()), 5);
        assert_eq!(strip_break("x\r\n"), "x");
        assert_eq!(strip_break("x\r"), "x");
        assert_eq!(strip_break("x\n\n"), "x\n");
        assert_eq!(break_len(b"\r\n", 0), 2);
        assert_eq!(break_len(b"\r\n", 1), 1);
        assert_eq!(break_len(b"a", 0), 0);
    }
}
