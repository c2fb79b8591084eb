//! Byte offsets ↔ LSP positions. LSP counts columns in UTF-16 code units (the
//! protocol's default encoding); the compiler's spans are byte offsets. Lines
//! end at `\n`, `\r\n` or a lone `\r`, as the protocol's positions count them.

use tower_lsp::lsp_types::{Position, Range};

/// Line starts of one text, for converting in both directions.
pub struct LineIndex<'a> {
    text: &'a str,
    starts: Vec<u32>,
    /// Whether each line is ASCII: its UTF-16 columns are then its byte
    /// offsets, so a position on a long line costs no scan of the line.
    ascii: Vec<bool>,
}

impl<'a> LineIndex<'a> {
    pub fn new(text: &'a str) -> Self {
        let starts: Vec<u32> = tessera::syntax::lines::line_starts(text)
            .map(|s| s as u32)
            .collect();
        let ascii = starts
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let end = starts.get(i + 1).map_or(text.len(), |&e| e as usize);
                text.as_bytes()[s as usize..end].is_ascii()
            })
            .collect();
        LineIndex {
            text,
            starts,
            ascii,
        }
    }

    /// The position of a byte offset (clamped to the text, and back to a char boundary).
    pub fn position(&self, offset: u32) -> Position {
        let mut offset = (offset as usize).min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = self.starts.partition_point(|&s| s as usize <= offset) - 1;
        let start = self.starts[line] as usize;
        let character = if self.ascii[line] {
            (offset - start) as u32
        } else {
            self.text[start..offset].encode_utf16().count() as u32
        };
        Position::new(line as u32, character)
    }

    pub fn range(&self, start: u32, end: u32) -> Range {
        Range::new(self.position(start), self.position(end))
    }

    /// The byte offset of a position; a column past the line's end (or a line
    /// past the last) is clamped, as the protocol asks.
    pub fn offset(&self, pos: Position) -> u32 {
        let Some(&start) = self.starts.get(pos.line as usize) else {
            return self.text.len() as u32;
        };
        let next = self
            .starts
            .get(pos.line as usize + 1)
            .map_or(self.text.len(), |&s| s as usize);
        // The line without its terminator (`\n`, `\r\n` or `\r`).
        let line = tessera::syntax::lines::strip_break(&self.text[start as usize..next]);
        let end = start as usize + line.len();
        if self.ascii[pos.line as usize] {
            return start + pos.character.min(line.len() as u32);
        }
        let mut units = 0u32;
        for (i, c) in line.char_indices() {
            if units >= pos.character {
                return start + i as u32;
            }
            units += c.len_utf16() as u32;
        }
        end as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_columns_round_trip() {
        // `é` is 2 bytes and 1 UTF-16 unit; `𝔸` is 4 bytes and 2 units.
        let text = "ab\né𝔸x = 1\n\nlast";
        let ix = LineIndex::new(text);
        let x = text.find('x').unwrap() as u32;
        assert_eq!(ix.position(x), Position::new(1, 3));
        assert_eq!(ix.offset(Position::new(1, 3)), x);
        assert_eq!(
            ix.offset(Position::new(1, 1)),
            text.find('𝔸').unwrap() as u32
        );
        assert_eq!(ix.position(text.len() as u32), Position::new(3, 4));
        // Clamping: past the end of a line, past the last line.
        assert_eq!(ix.offset(Position::new(0, 99)), 2);
        assert_eq!(ix.offset(Position::new(9, 0)), text.len() as u32);
        assert_eq!(ix.position(3), Position::new(1, 0));
    }

    #[test]
    fn a_lone_carriage_return_ends_a_line() {
        // `\r\n` is one terminator; `\r` alone and `\n` alone are one each.
        let text = "a\r\nb\rcd\ne\r";
        let ix = LineIndex::new(text);
        let at = |s: &str| text.find(s).unwrap() as u32;
        assert_eq!(ix.position(at("b")), Position::new(1, 0));
        assert_eq!(ix.position(at("cd")), Position::new(2, 0));
        assert_eq!(ix.position(at("e")), Position::new(3, 0));
        assert_eq!(ix.position(text.len() as u32), Position::new(4, 0));
        assert_eq!(ix.offset(Position::new(2, 1)), at("d"));
        // Past a line's end: before its terminator, whichever it is.
        assert_eq!(ix.offset(Position::new(0, 9)), 1);
        assert_eq!(ix.offset(Position::new(1, 9)), at("b") + 1);
        assert_eq!(ix.offset(Position::new(2, 9)), at("d") + 1);
        assert_eq!(ix.offset(Position::new(4, 0)), text.len() as u32);
    }
}
