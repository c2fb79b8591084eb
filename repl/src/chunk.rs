//! Splitting non-interactive input into what the REPL would execute one at a
//! time: a command line, or statements/definitions, where a block ends at a
//! blank line or at the next line that starts in column 0 outside brackets
//! (`else`/`elif` and the `def` after a decorator continue it).

use crate::command;

/// Whether `buffer` (lines so far, each ending in `\n`) needs more lines: an
/// open bracket or block, or a decorator still waiting for its `def`.
pub fn needs_more(buffer: &str) -> bool {
    let last = buffer.trim_end_matches('\n').lines().last().unwrap_or("");
    if last.trim_start().starts_with('@') && !buffer.ends_with("\n\n") {
        return true;
    }
    tessera::syntax::needs_more_input(buffer)
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
    /// Bytes consumed so far (lines with their `\n`).
    at: u32,
}

impl Chunker {
    pub fn new() -> Self {
        Chunker::default()
    }

    /// Adds one line (without its newline); returns the inputs it completes.
    pub fn push_line(&mut self, line: &str) -> Vec<Chunk> {
        let mut done = Vec::new();
        let continues_block = line.starts_with([' ', '\t'])
            || line.trim().is_empty()
            || ["else", "elif"].iter().any(|k| line.starts_with(k))
            || line.starts_with("def ")
                && self
                    .buffer
                    .trim_end()
                    .lines()
                    .last()
                    .is_some_and(|l| l.trim_start().starts_with('@'));
        // Only an open block (not an open bracket) ends at a column-0 line.
        let open_bracket = tessera::syntax::needs_more_input(&format!("{}\n", self.buffer));
        if !self.buffer.is_empty() && !continues_block && !open_bracket && needs_more(&self.buffer)
        {
            done.extend(self.take());
        }
        let line_start = self.at;
        self.at += line.len() as u32 + 1;
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
        self.buffer.push('\n');
        if !needs_more(&self.buffer) {
            done.extend(self.take());
        }
        done
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
    for line in text.split('\n') {
        out.extend(c.push_line(line.strip_suffix('\r').unwrap_or(line)));
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
}
