//! Splitting non-interactive input into what the REPL would execute one at a
//! time: a command line, or statements/definitions, where a block ends at a
//! blank line or at the next line that starts in column 0 outside brackets
//! (`else`/`elif`, and the decorator or `def` after a decorator, continue it).

use crate::command;

/// Whether `buffer` (lines so far, each ending in `\n`) needs more lines: an
/// open bracket or block, or a decorator still waiting for its `def`.
pub fn needs_more(buffer: &str) -> bool {
    let last = tessera::syntax::lines::lines(buffer.trim_end_matches('\n'))
        .last()
        .unwrap_or("");
    if last.trim_start().starts_with('@') && !ends_blank(buffer) {
        return true;
    }
    tessera::syntax::needs_more_input(buffer)
}

/// Whether `buffer` ends in an empty line (two line breaks).
fn ends_blank(buffer: &str) -> bool {
    use tessera::syntax::lines::strip_break;
    let once = strip_break(buffer);
    once.len() < buffer.len() && strip_break(once).len() < once.len()
}

/// One input: its text and its byte offset in the whole input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub offset: u32,
    pub text: String,
}

/// Feeds lines, hands back complete inputs.
#[derive(Default)]
pub struct Chunker {
    buffer: String,
    start: u32,
    /// Bytes consumed so far (lines with their line breaks).
    at: u32,
}

impl Chunker {
    pub fn new() -> Self {
        Chunker::default()
    }

    /// Adds one line (without its line break, taken to be `\n`); returns the
    /// inputs it completes.
    pub fn push_line(&mut self, line: &str) -> Vec<Chunk> {
        self.push_line_ending(line, "\n")
    }

    /// `push_line` for a line ending in `brk` (`\n`, `\r\n` or `\r`) in the
    /// input: a chunk's text is then a slice of the input, so that its spans
    /// shifted by its offset are the input's.
    pub fn push_line_ending(&mut self, line: &str, brk: &str) -> Vec<Chunk> {
        let mut done = Vec::new();
        let continues_block = line.starts_with([' ', '\t'])
            || line.trim().is_empty()
            || ["else", "elif"].iter().any(|k| line.starts_with(k))
            // The `def` (or the next decorator) after a decorator.
            || (line.starts_with("def ") || line.starts_with('@'))
                && tessera::syntax::lines::lines(self.buffer.trim_end())
                    .last()
                    .is_some_and(|l| l.trim_start().starts_with('@'));
        // Only an open block (not an open bracket) ends at a column-0 line.
        let open_bracket = tessera::syntax::needs_more_input(&format!("{}\n", self.buffer));
        if !self.buffer.is_empty() && !continues_block && !open_bracket && needs_more(&self.buffer)
        {
            done.extend(self.take());
        }
        let line_start = self.at;
        self.at += (line.len() + brk.len()) as u32;
        if self.buffer.is_empty() {
            self.start = line_start;
            if command::is_command(line) {
                done.push(Chunk {
                    offset: line_start,
                    text: line.to_string(),
                });
                return done;
            }
        }
        self.buffer.push_str(line);
        self.buffer.push_str(brk);
        if !needs_more(&self.buffer) {
            done.extend(self.take());
        }
        done
    }

    /// The lines of the input still open (each with a `\n`).
    pub fn pending(&self) -> &str {
        &self.buffer
    }

    /// The input still open at the end.
    pub fn finish(&mut self) -> Option<Chunk> {
        self.take()
    }

    fn take(&mut self) -> Option<Chunk> {
        let text = std::mem::take(&mut self.buffer);
        (!text.trim().is_empty()).then_some(Chunk {
            offset: self.start,
            text,
        })
    }
}

/// Every input of `text`, in order.
pub fn chunks(text: &str) -> Vec<Chunk> {
    let mut c = Chunker::new();
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut start = 0;
    loop {
        let mut end = start;
        while end < b.len() && !tessera::syntax::lines::is_break_byte(b[end]) {
            end += 1;
        }
        let break_len = tessera::syntax::lines::break_len(b, end);
        let brk = if break_len == 0 {
            "\n"
        } else {
            &text[end..end + break_len]
        };
        out.extend(c.push_line_ending(&text[start..end], brk));
        if break_len == 0 {
            break;
        }
        start = end + break_len;
    }
    out.extend(c.finish());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_commands_and_offsets() {
        let text = "x = 1\n:type x\nfor i in range(2):\n    x += i\nprint(x)\n@kernel(grid=(1,))\ndef k(a: Tensor[4, f32]):\n    pass\n\ny = (1 +\n2)\n";
        let got: Vec<(u32, &str)> = chunks(text)
            .iter()
            .map(|c| (c.offset, &text[c.offset as usize..c.offset as usize + 1]))
            .collect();
        let starts: Vec<&str> = got.iter().map(|g| g.1).collect();
        assert_eq!(starts, ["x", ":", "f", "p", "@", "y"]);
        let all = chunks(text);
        assert_eq!(all[2].text, "for i in range(2):\n    x += i\n");
        assert_eq!(
            all[4].text,
            "@kernel(grid=(1,))\ndef k(a: Tensor[4, f32]):\n    pass\n\n"
        );
        assert_eq!(all[5].text, "y = (1 +\n2)\n");
    }

    #[test]
    fn stacked_decorators_stay_with_their_def() {
        let text = "@autotune(space={\"B\": [1, 2]})\n@kernel(grid=(1,))\ndef k(a: Tensor[4, f32], B: const):\n    pass\nx = 1\n";
        let all = chunks(text);
        let texts: Vec<&str> = all.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "@autotune(space={\"B\": [1, 2]})\n@kernel(grid=(1,))\ndef k(a: Tensor[4, f32], B: const):\n    pass\n",
                "x = 1\n"
            ]
        );
    }

    #[test]
    fn every_line_break_ends_a_line_and_chunks_are_slices() {
        let text = "x = 1\r\ny = (1 +\r2)\rfor i in range(2):\r\n    x += i\r\rprint(x)";
        let all = chunks(text);
        let texts: Vec<&str> = all.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "x = 1\r\n",
                "y = (1 +\r2)\r",
                "for i in range(2):\r\n    x += i\r\r",
                "print(x)\n"
            ]
        );
        for c in &all[..3] {
            assert_eq!(
                &text[c.offset as usize..c.offset as usize + c.text.len()],
                c.text
            );
        }
    }
}
