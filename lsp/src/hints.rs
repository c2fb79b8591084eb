//! Inlay hints: `tessera::ide::inlay_hints`, plus the estimate of every
//! kernel that has no error of its own while the file has errors elsewhere.
//!
//! `ide::inlay_hints` gives no kernel estimate at all in a file with an error
//! (as `tsrc report` prints no report for it). While typing, the file is
//! rarely free of errors for long, and the estimates of every kernel would
//! blink out at each half-typed name. A kernel whose own text has no error
//! keeps its hint: an error elsewhere that changes its estimate (an unknown
//! const, a broken import) shows up as an error in its own text, where the
//! name is used. The hover already estimates such kernels; the hints now agree.

use tessera::db::{file_diagnostics, file_kernels, parse_item, Database, Options, SourceFile};
use tessera::ide::{self, InlayHint};
use tessera::ir::tile::Specialization;
use tessera::syntax::ast::Item;

/// The inlay hints of `file` within the byte range `[from, to]`.
pub fn inlay_hints(
    db: &Database,
    file: SourceFile,
    options: Options,
    spec: &Specialization,
    from: u32,
    to: u32,
) -> Vec<InlayHint> {
    let mut hints = ide::inlay_hints(db, file, options, spec, from, to);
    let errors: Vec<(u32, u32)> = file_diagnostics(db, file, options)
        .iter()
        .filter(|d| d.is_error())
        .map(|d| (d.span.start, d.span.end))
        .collect();
    if errors.is_empty() {
        return hints;
    }
    for (_, item, start) in file_kernels(db, file) {
        let end = start + item.text(db).len() as u32;
        if end < from || start > to {
            continue;
        }
        if errors.iter().any(|&(s, e)| s < end && e >= start) {
            continue;
        }
        let Some(Item::Function(f)) = parse_item(db, item).item.as_deref() else {
            continue;
        };
        let offset = f.header_span.end + start;
        if hints.iter().any(|h| h.offset == offset && !h.is_type) {
            continue;
        }
        let label = match ide::kernel_estimate(db, item, start, options, spec) {
            Ok(r) => ide::estimate_line(&r),
            // Only what a value would fix: any other failure may come from
            // the errors elsewhere.
            Err(why) if !why.needs.is_empty() => ide::no_estimate_line(&why),
            Err(_) => continue,
        };
        hints.push(InlayHint {
            offset,
            label,
            is_type: false,
        });
    }
    hints.sort_by_key(|h| h.offset);
    hints
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "@kernel(grid=(cdiv(N, 256),), num_warps=4)
def good(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32]):
    i = program_id(0) * 256
    store(out[i : i + 256], load(x[i : i + 256]) * 2.0)
";

    fn estimates(text: &str) -> Vec<(u32, String)> {
        let mut db = Database::new();
        let file = db.set_source("/t/hints.tsr", text.to_string());
        let options = db.options();
        inlay_hints(
            &db,
            file,
            options,
            &Specialization::new(),
            0,
            text.len() as u32,
        )
        .into_iter()
        .filter(|h| !h.is_type)
        .map(|h| (h.offset, h.label))
        .collect()
    }

    #[test]
    fn a_kernel_keeps_its_estimate_while_another_has_an_error() {
        let clean = estimates(GOOD);
        assert_eq!(clean.len(), 1, "{clean:?}");
        assert!(clean[0].1.starts_with("≈ ") && clean[0].1.contains("regs"));
        let broken = "\n\n@kernel(grid=(1,), num_warps=4)
def broken(x: Tensor[\"N\", f32]):
    v = laod(x[0 : 128])
";
        let text = format!("{GOOD}{broken}");
        // The same estimate at the same place; none for the broken kernel.
        assert_eq!(estimates(&text), clean);
        // An error in the kernel itself: no estimate.
        let text = GOOD.replace("load(x", "laod(x");
        assert_eq!(estimates(&text), vec![]);
    }
}
