//! Resource warnings carried across edits.
//!
//! A document's diagnostics are published twice per edit: the checker's at
//! once, and 150 ms later with the kernels' resource diagnostics (W0003,
//! W0004, the note W0006, E06xx), which need the kernels lowered. Without care the second
//! kind would vanish at every keystroke and come back a moment later. The
//! first publication therefore repeats the last resource diagnostics of every
//! kernel whose text has not changed since (same arch and defines): its
//! lowering is the same, so they are what the second publication will say.

use tessera::db::{file_kernels, Database, SourceFile};
use tessera::diag::Diagnostic;
use tessera::ir::tile::Specialization;
use tessera::syntax::span::Span;
use tessera::target::Arch;

/// The resource diagnostics of each kernel of one document, by kernel text.
#[derive(Clone, Debug, Default)]
pub struct KernelWarnings {
    arch: Option<Arch>,
    spec: Specialization,
    /// (a kernel's code, its diagnostics relative to the code's start), for
    /// the kernels that have any
    kernels: Vec<(String, Vec<Diagnostic>)>,
}

/// The code of a kernel item without the blank and comment lines around it
/// (they belong to whichever item is next to them, and change with edits that
/// do not touch the kernel), and its offset in the item.
fn code_of(item: &str) -> (u32, &str) {
    let is_code = |l: &str| {
        let t = l.trim_start();
        !t.is_empty() && !t.starts_with('#')
    };
    let mut start = 0;
    let mut end = 0;
    let mut seen = false;
    let mut at = 0;
    for line in item.split_inclusive('\n') {
        if is_code(line) {
            if !seen {
                start = at;
                seen = true;
            }
            end = at + line.trim_end().len();
        }
        at += line.len();
    }
    (start as u32, &item[start..end.max(start)])
}

/// `d` with every span moved from an item at `from` to one at `to`.
fn relocate(mut d: Diagnostic, from: u32, to: u32) -> Diagnostic {
    let map = |s: Span| Span::new(s.start - from + to, s.end - from + to);
    d.span = map(d.span);
    for l in &mut d.labels {
        l.span = map(l.span);
    }
    d
}

impl KernelWarnings {
    /// Attributes `diags` (absolute spans; the resource diagnostics of the
    /// whole file) to the kernels whose items hold all their spans.
    pub fn record(
        db: &Database,
        file: SourceFile,
        arch: Arch,
        spec: &Specialization,
        diags: &[Diagnostic],
    ) -> Self {
        let kernels = file_kernels(db, file)
            .into_iter()
            .map(|(_, item, start)| {
                let (at, code) = code_of(item.text(db));
                let start = start + at;
                let end = start + code.len() as u32;
                let inside = |s: Span| s.start >= start && s.end <= end;
                let own = diags
                    .iter()
                    .filter(|d| inside(d.span) && d.labels.iter().all(|l| inside(l.span)))
                    .map(|d| relocate(d.clone(), start, 0))
                    .collect();
                (code.to_string(), own)
            })
            .filter(|(_, own): &(String, Vec<Diagnostic>)| !own.is_empty())
            .collect();
        KernelWarnings {
            arch: Some(arch),
            spec: spec.clone(),
            kernels,
        }
    }

    /// The recorded diagnostics of the kernels of `file` whose text is
    /// unchanged, at their current places.
    pub fn carried(
        &self,
        db: &Database,
        file: SourceFile,
        arch: Arch,
        spec: &Specialization,
    ) -> Vec<Diagnostic> {
        if self.kernels.is_empty() || self.arch != Some(arch) || self.spec != *spec {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (_, item, start) in file_kernels(db, file) {
            let (at, code) = code_of(item.text(db));
            if let Some((_, diags)) = self.kernels.iter().find(|(c, _)| c == code) {
                out.extend(diags.iter().map(|d| relocate(d.clone(), 0, start + at)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_of_an_item_leaves_out_comments_and_blank_lines_around_it() {
        let item = "# doc\n\n@kernel\ndef k():\n    # body\n    pass\n\n# next\n\n";
        let (at, code) = code_of(item);
        assert_eq!(code, "@kernel\ndef k():\n    # body\n    pass");
        assert_eq!(&item[at as usize..][..7], "@kernel");
        assert_eq!(code_of("# only\n"), (0, ""));
    }

    #[test]
    fn unchanged_kernels_keep_their_warnings_at_their_new_place() {
        let a = "@kernel(grid=(1,), num_warps=4)\ndef a(x: Tensor[\"N\", f32]):\n    v = load(x[0 : 128])\n";
        let b = "\n\n@kernel(grid=(1,), num_warps=4)\ndef b(x: Tensor[\"N\", f32]):\n    v = load(x[0 : 64])\n";
        let mut db = Database::new();
        let file = db.set_source("/t/carry.tsr", format!("{a}{b}"));
        let spec = Specialization::new();
        let b_name = (a.len() + b.find("def b").unwrap() + 4) as u32;
        let warning = |at: u32| Diagnostic::new("W0004", Span::new(at, at + 1), "low occupancy");
        let note = |at: u32| Diagnostic::new("W0006", Span::new(at, at + 1), "latency hidden");
        let recorded = KernelWarnings::record(
            &db,
            file,
            Arch::Sm90,
            &spec,
            &[warning(b_name), note(b_name)],
        );

        // Text inserted above `b`, comments around it: its warning moves with it.
        let file = db.set_source("/t/carry.tsr", format!("# note\n{a}\n# b:{b}\n# end\n"));
        let carried = recorded.carried(&db, file, Arch::Sm90, &spec);
        assert_eq!(carried.len(), 2);
        assert_eq!(carried[0].span, Span::new(b_name + 12, b_name + 13));
        // A note stays a note (the server publishes it as Information).
        assert_eq!(carried[1].severity, tessera::diag::Severity::Note);
        assert_eq!(carried[1].span, carried[0].span);
        // Another arch or other defines: nothing is carried.
        assert!(recorded.carried(&db, file, Arch::Sm80, &spec).is_empty());
        let d = Specialization::new().with("D", 64);
        assert!(recorded.carried(&db, file, Arch::Sm90, &d).is_empty());
        // `b` itself edited: its warning waits for the next estimate.
        let edited = b.replace("0 : 64", "0 : 32");
        let file = db.set_source("/t/carry.tsr", format!("{a}{edited}"));
        assert!(recorded.carried(&db, file, Arch::Sm90, &spec).is_empty());
    }
}
