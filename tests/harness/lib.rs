//! Shared pieces of the end-to-end test runners: the `#~` annotation format of
//! `tests/ui/**/*.tsr`, matching expected against produced diagnostics, and the
//! format of `docs/diagnostics.md`.
//!
//! # Annotations
//!
//! * `#~ E0401` anywhere on a line: a diagnostic with code `E0401` whose primary
//!   span starts on this line; `#~^ E0401` means the line above, `#~^^` two above.
//! * After the code, zero or more double-quoted substrings (`\"` and `\\` escape)
//!   that must all occur in the message: `#~ E0401 "K" "64" "32"`.
//! * Several expectations on one line repeat the marker: `#~ E0201 "yy" #~ W0001`.
//! * A first line `# arch: sm_70` checks the file for that arch (default sm_90).
//! * A leading comment line `# emit: tile-ir [-D NAME=VALUE]...` also lowers every
//!   kernel of a file that checks cleanly, adding the lowering diagnostics (E0511,
//!   E0512), as `tsrc emit --emit tile-ir` reports them; `# emit: report
//!   [-D NAME=VALUE]...` compiles every kernel to Target IR and adds the resource
//!   diagnostics (W0003, W0004, E06xx), as `tsrc report` reports them; `# emit:
//!   schedule-ir` lowers every whole-tensor function to its launch plan and adds
//!   what does not lower (E0512), as `tsrc emit --emit schedule-ir` reports it.
//! * A leading comment line `# run` executes the file as a piped REPL session
//!   (`tessera repl < FILE`: statements and `:commands`, every input run even
//!   after an error) instead of checking it, and the session's diagnostics
//!   (check, session E072x and run-time E07xx errors) are matched.
//! * Matching is exact: every diagnostic (errors and warnings) must be expected and
//!   every expectation met; a file without annotations must produce nothing.

pub mod filecheck;
pub mod fuzzing;

use std::path::{Path, PathBuf};

use tessera::db::file_resources;
use tessera::db::{tile_ir_diagnostics, Database, SourceFile};
use tessera::diag::render::LineIndex;
use tessera::diag::Diagnostic;
use tessera::ir::tile::Specialization;
use tessera::target::Arch;

/// The repository root (the parent of the `tests/` package).
/// What a data-driven suite's binary was asked: the name filters given on
/// its command line (`cargo test --test ui -- NAME`) and whether
/// `TESSERA_BLESS=1` rewrites the expected outputs instead of comparing.
pub struct SuiteArgs {
    pub filters: Vec<String>,
    pub bless: bool,
}

impl SuiteArgs {
    pub fn from_env() -> SuiteArgs {
        SuiteArgs {
            filters: std::env::args()
                .skip(1)
                .filter(|a| !a.starts_with('-'))
                .collect(),
            bless: std::env::var_os("TESSERA_BLESS").is_some_and(|v| v == "1"),
        }
    }

    /// Whether the case named `name` runs: every case without filters.
    pub fn selects(&self, name: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| name.contains(f.as_str()))
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// One `#~` expectation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expectation {
    /// 1-based line the primary span must start on.
    pub line: u32,
    pub code: String,
    pub substrings: Vec<String>,
}

impl std::fmt::Display for Expectation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.code)?;
        for s in &self.substrings {
            write!(f, " {s:?}")?;
        }
        Ok(())
    }
}

fn is_code(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 5 && (b[0] == b'E' || b[0] == b'W') && b[1..].iter().all(u8::is_ascii_digit)
}

/// Every `#~` expectation of a file, or a message saying which line is malformed.
pub fn parse_annotations(text: &str) -> Result<Vec<Expectation>, String> {
    let mut out = Vec::new();
    for (i, line) in tessera::syntax::lines::lines(text).enumerate() {
        let lineno = i as u32 + 1;
        let Some(start) = line.find("#~") else {
            continue;
        };
        for segment in line[start + 2..].split("#~") {
            let carets = segment.bytes().take_while(|b| *b == b'^').count() as u32;
            let target = lineno
                .checked_sub(carets)
                .filter(|l| *l >= 1)
                .ok_or_else(|| {
                    format!(
                        "line {lineno}: `#~{}` points above line 1",
                        "^".repeat(carets as usize)
                    )
                })?;
            let rest = segment[carets as usize..].trim_start();
            let code_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            let code = &rest[..code_end];
            if !is_code(code) {
                return Err(format!(
                    "line {lineno}: expected a code like E0401 after `#~`, found `{code}`"
                ));
            }
            let substrings =
                parse_quoted(&rest[code_end..]).map_err(|e| format!("line {lineno}: {e}"))?;
            out.push(Expectation {
                line: target,
                code: code.to_string(),
                substrings,
            });
        }
    }
    Ok(out)
}

/// `"a" "b c"` → `[a, b c]`; anything but whitespace between strings is an error.
fn parse_quoted(mut s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    loop {
        s = s.trim_start();
        if s.is_empty() {
            return Ok(out);
        }
        let Some(body) = s.strip_prefix('"') else {
            return Err(format!(
                "expected a double-quoted message substring, found `{s}`"
            ));
        };
        let mut value = String::new();
        let mut chars = body.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("unterminated message substring".to_string()),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, c @ ('"' | '\\'))) => value.push(c),
                    Some((_, c)) => {
                        value.push('\\');
                        value.push(c);
                    }
                    None => return Err("unterminated message substring".to_string()),
                },
                Some((_, c)) => value.push(c),
            }
        };
        out.push(value);
        s = &body[end + 1..];
    }
}

/// The arch named by a first line `# arch: NAME`, if there is one.
pub fn parse_arch_header(text: &str) -> Result<Option<Arch>, String> {
    let first = tessera::syntax::lines::lines(text).next().unwrap_or("");
    let Some(rest) = first.trim().strip_prefix('#') else {
        return Ok(None);
    };
    let Some(name) = rest.trim_start().strip_prefix("arch:") else {
        return Ok(None);
    };
    let name = name.trim();
    name.parse::<Arch>()
        .map(Some)
        .map_err(|e| format!("line 1: unknown architecture `{name}` ({e})"))
}

/// A produced diagnostic, reduced to what annotations talk about.
#[derive(Clone, Debug)]
pub struct Produced {
    pub line: u32,
    pub code: &'static str,
    pub message: String,
}

impl Produced {
    pub fn from_diagnostics(text: &str, diags: &[Diagnostic]) -> Vec<Produced> {
        let index = LineIndex::new(text);
        diags
            .iter()
            .map(|d| Produced {
                line: index.position(d.span.start).line,
                code: d.code,
                message: d.message.clone(),
            })
            .collect()
    }
}

impl std::fmt::Display for Produced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {} {}", self.line, self.code, self.message)
    }
}

fn satisfies(e: &Expectation, p: &Produced) -> bool {
    e.line == p.line
        && e.code == p.code
        && e.substrings.iter().all(|s| p.message.contains(s.as_str()))
}

/// The outcome of matching: indices of expectations and diagnostics left over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mismatch {
    pub missing: Vec<usize>,
    pub unexpected: Vec<usize>,
}

impl Mismatch {
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty()
    }
}

/// A maximum one-to-one matching of expectations to diagnostics (augmenting
/// paths, so `#~ E0201 "x"` and `#~ E0201` on one line match in either order).
pub fn match_all(expected: &[Expectation], produced: &[Produced]) -> Mismatch {
    let mut owner: Vec<Option<usize>> = vec![None; produced.len()];
    fn augment(
        e: usize,
        expected: &[Expectation],
        produced: &[Produced],
        seen: &mut [bool],
        owner: &mut [Option<usize>],
    ) -> bool {
        for p in 0..produced.len() {
            if seen[p] || !satisfies(&expected[e], &produced[p]) {
                continue;
            }
            seen[p] = true;
            if owner[p].is_none_or(|other| augment(other, expected, produced, seen, owner)) {
                owner[p] = Some(e);
                return true;
            }
        }
        false
    }
    let mut missing = Vec::new();
    for e in 0..expected.len() {
        let mut seen = vec![false; produced.len()];
        if !augment(e, expected, produced, &mut seen, &mut owner) {
            missing.push(e);
        }
    }
    let unexpected = (0..produced.len())
        .filter(|p| owner[*p].is_none())
        .collect();
    Mismatch {
        missing,
        unexpected,
    }
}

/// Checks one file through a fresh database, as `tsrc check --arch ARCH` would.
pub fn check_file(path: &Path, arch: Arch) -> std::io::Result<(String, Vec<Diagnostic>)> {
    if let Some(diags) = run_if_script(&path.display().to_string(), &std::fs::read_to_string(path)?)
    {
        return Ok((std::fs::read_to_string(path)?, diags));
    }
    let mut db = Database::new();
    db.set_arch(arch);
    let file = db.load_file(path)?;
    let text = file.text(&db).clone();
    let diags = diagnostics_with_emit(&db, file, &text);
    Ok((text, diags))
}

/// Checks a text under a virtual path.
pub fn check_text(path: &str, text: &str, arch: Arch) -> Vec<Diagnostic> {
    if let Some(diags) = run_if_script(path, text) {
        return diags;
    }
    let mut db = Database::new();
    db.set_arch(arch);
    let file = db.set_source(path, text.to_string());
    diagnostics_with_emit(&db, file, text)
}

/// Whether a leading comment line is `# run` (see the module docs).
pub fn has_run_header(text: &str) -> bool {
    tessera::syntax::lines::lines(text)
        .map_while(|l| l.trim().strip_prefix('#'))
        .any(|rest| rest.trim() == "run")
}

/// The diagnostics of `text` run as a piped session, for `# run` cases.
fn run_if_script(path: &str, text: &str) -> Option<Vec<Diagnostic>> {
    has_run_header(text).then(|| {
        tessera_repl::session::Session::new(path, false).run_script(text, &mut std::io::sink())
    })
}

/// What a leading `# emit: ...` comment asks the harness to run besides the checker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmitHeader {
    /// `# emit: tile-ir [-D NAME=VALUE]...`: lower every kernel to Tile IR
    /// (E0511, E0512), as `tsrc emit --emit tile-ir` does.
    TileIr(Specialization),
    /// `# emit: report [-D NAME=VALUE]...`: compile every kernel to Target IR
    /// and add the resource diagnostics (W0003, W0004, E06xx), as `tsrc report`
    /// does.
    Report(Specialization),
    /// `# emit: ptx [-D NAME=VALUE]...`: print every kernel's PTX and add
    /// the diagnostics of those that have none (E0615 on an AMD arch), as
    /// `tsrc emit --emit ptx` would.
    Ptx(Specialization),
    /// `# emit: hip [-D NAME=VALUE]...`: print every kernel's HIP and add
    /// the diagnostics of those that have none (E0615 on an NVIDIA arch), as
    /// `tsrc emit --emit hip` would.
    Hip(Specialization),
    /// `# emit: schedule-ir`: lower every whole-tensor function to its launch
    /// plan (E0512), as `tsrc emit --emit schedule-ir` does.
    ScheduleIr,
}

/// `# emit: tile-ir|report [-D NAME=VALUE|-D NAME%DIVISOR]...` (or `# emit:
/// schedule-ir`, for whole-tensor functions) among a file's leading comment
/// lines: the case also lowers every kernel (as `tsrc emit --emit tile-ir` or
/// `tsrc report` would), so emit-time diagnostics (E0511, E0512, W0003, W0004)
/// can be tested and documented. `Ok(None)` without the header.
pub fn parse_emit_header(text: &str) -> Result<Option<EmitHeader>, String> {
    for (i, line) in tessera::syntax::lines::lines(text).enumerate() {
        let Some(rest) = line.trim().strip_prefix('#') else {
            break;
        };
        let Some(args) = rest.trim_start().strip_prefix("emit:") else {
            continue;
        };
        let mut words = args.split_whitespace();
        let kind = words.next();
        if kind == Some("schedule-ir") {
            return Ok(Some(EmitHeader::ScheduleIr));
        }
        if !matches!(kind, Some("tile-ir" | "report" | "ptx" | "hip")) {
            return Err(format!(
                "line {}: only `# emit: tile-ir`, `# emit: report`, `# emit: ptx`, `# emit: hip` and `# emit: schedule-ir` are supported",
                i + 1
            ));
        }
        let mut spec = Specialization::new();
        while let Some(w) = words.next() {
            let def = match w.strip_prefix("-D") {
                Some("") => words.next().unwrap_or(""),
                Some(d) => d,
                None => {
                    return Err(format!(
                        "line {}: expected `-D NAME=VALUE`, found `{w}`",
                        i + 1
                    ))
                }
            };
            let d = Specialization::parse_define_arg(def)
                .map_err(|e| format!("line {}: {e}", i + 1))?;
            spec.add(&d);
        }
        return Ok(Some(match kind {
            Some("report") => EmitHeader::Report(spec),
            Some("ptx") => EmitHeader::Ptx(spec),
            Some("hip") => EmitHeader::Hip(spec),
            _ => EmitHeader::TileIr(spec),
        }));
    }
    Ok(None)
}

/// The file's diagnostics, plus its lowering (or report) diagnostics under an
/// emit header.
fn diagnostics_with_emit(db: &Database, file: SourceFile, text: &str) -> Vec<Diagnostic> {
    let mut diags = db.diagnostics(file).to_vec();
    match parse_emit_header(text) {
        Ok(Some(EmitHeader::TileIr(spec))) => {
            diags.extend(tile_ir_diagnostics(db, file, db.options(), &spec));
        }
        Ok(Some(EmitHeader::Report(spec))) => {
            diags.extend(file_resources(db, file, db.options(), &spec).1);
        }
        Ok(Some(EmitHeader::Ptx(spec))) if !diags.iter().any(|d| d.is_error()) => {
            if let Err(d) = tessera::db::ptx(db, file, db.options(), spec) {
                diags.extend(d.iter().cloned());
            }
        }
        Ok(Some(EmitHeader::Hip(spec))) if !diags.iter().any(|d| d.is_error()) => {
            if let Err(d) = tessera::db::hip(db, file, db.options(), spec) {
                diags.extend(d.iter().cloned());
            }
        }
        Ok(Some(EmitHeader::ScheduleIr)) if !diags.iter().any(|d| d.is_error()) => {
            for (_, item, offset) in tessera::db::file_functions(db, file) {
                if let Err(e) = tessera::db::schedule_ir(db, item, db.options()) {
                    diags.push(e.clone().shifted(offset).diagnostic());
                }
            }
        }
        _ => {}
    }
    diags
}

/// One entry of `docs/diagnostics.md`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocEntry {
    pub code: String,
    pub title: String,
    /// 1-based line of the heading.
    pub line: usize,
    /// The first ```` ```tsr ```` block of the section, if any.
    pub example: Option<String>,
}

/// Parses `docs/diagnostics.md`: a section per code, opened by a level-2 heading
/// `## E0401: title` (an em dash, en dash or hyphen may stand for the colon), and
/// holding a fenced block opened by ```` ```tsr ```` with an example that produces
/// that code. Other level-2 headings (an introduction, say) are not entries.
pub fn parse_diagnostics_doc(md: &str) -> Vec<DocEntry> {
    let mut entries: Vec<DocEntry> = Vec::new();
    let mut in_entry = false;
    let mut fence: Option<(bool, String)> = None; // (is the entry's example, text)
    for (i, line) in md.lines().enumerate() {
        if let Some((is_example, body)) = &mut fence {
            if line.trim_start().starts_with("```") {
                if *is_example {
                    let last = entries.last_mut().expect("an example belongs to an entry");
                    last.example = Some(std::mem::take(body));
                }
                fence = None;
            } else {
                body.push_str(line);
                body.push('\n');
            }
            continue;
        }
        if let Some(info) = line.trim_start().strip_prefix("```") {
            let wants = in_entry
                && info.trim() == "tsr"
                && entries.last().is_some_and(|e| e.example.is_none());
            fence = Some((wants, String::new()));
            continue;
        }
        if line.starts_with("# ") || line.starts_with("## ") {
            in_entry = false;
        }
        if let Some(rest) = line.strip_prefix("## ") {
            let rest = rest.trim();
            let code = rest.get(..5).unwrap_or("");
            if is_code(code) {
                let title = rest[5..]
                    .trim_start()
                    .trim_start_matches([':', '—', '–', '-'])
                    .trim()
                    .to_string();
                entries.push(DocEntry {
                    code: code.to_string(),
                    title,
                    line: i + 1,
                    example: None,
                });
                in_entry = true;
            }
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(line: u32, code: &str, subs: &[&str]) -> Expectation {
        Expectation {
            line,
            code: code.to_string(),
            substrings: subs.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn prod(line: u32, code: &'static str, message: &str) -> Produced {
        Produced {
            line,
            code,
            message: message.to_string(),
        }
    }

    #[test]
    fn annotations_parse() {
        let text = "# arch: sm_70\nx = y #~ E0201 \"yy\" #~ W0001\n\n  #~^^ E0401 \"K\" \"64\" \"a \\\"q\\\"\"\n";
        let got = parse_annotations(text).unwrap();
        assert_eq!(
            got,
            vec![
                exp(2, "E0201", &["yy"]),
                exp(2, "W0001", &[]),
                exp(2, "E0401", &["K", "64", "a \"q\""]),
            ]
        );
        assert_eq!(parse_arch_header(text).unwrap(), Some(Arch::Sm70));
        assert_eq!(parse_arch_header("x = 1\n").unwrap(), None);
        assert!(parse_arch_header("# arch: sm_99\n").is_err());
    }

    #[test]
    fn malformed_annotations_are_errors() {
        assert!(parse_annotations("x #~ 0401\n").is_err());
        assert!(parse_annotations("x #~ E0401 K\n").is_err());
        assert!(parse_annotations("x #~ E0401 \"K\n").is_err());
        assert!(parse_annotations("#~^ E0401\n").is_err());
        assert!(parse_annotations("x #~\n").is_err());
    }

    #[test]
    fn matching_is_exact_and_order_independent() {
        let produced = vec![
            prod(3, "E0201", "unknown name `xx`"),
            prod(3, "E0201", "unknown name `y`"),
        ];
        // The unspecific expectation comes first and must not steal `xx`.
        let expected = vec![exp(3, "E0201", &[]), exp(3, "E0201", &["xx"])];
        assert!(match_all(&expected, &produced).is_empty());

        let m = match_all(&[exp(3, "E0201", &["zz"])], &produced);
        assert_eq!(m.missing, vec![0]);
        assert_eq!(m.unexpected, vec![0, 1]);

        let m = match_all(&[exp(4, "E0201", &[])], &produced[..1]);
        assert_eq!((m.missing.len(), m.unexpected.len()), (1, 1));
        assert!(match_all(&[], &[]).is_empty());
        assert_eq!(match_all(&[], &produced).unexpected, vec![0, 1]);
    }

    #[test]
    fn docs_entries_parse() {
        let md = "# Diagnostics\n\n## How to read\n\n```tsr\nignored\n```\n\n## E0401: dim bound twice\n\ntext\n\n```tsr\n# arch: sm_80\nbad()\n```\n\n```tsr\nsecond\n```\n\n## W0001 — unused variable\n\n```text\nnot tsr\n```\n\n## E0402\n```tsr\nx\n```\n";
        let got = parse_diagnostics_doc(md);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].code, "E0401");
        assert_eq!(got[0].title, "dim bound twice");
        assert_eq!(got[0].example.as_deref(), Some("# arch: sm_80\nbad()\n"));
        assert_eq!(got[1].code, "W0001");
        assert_eq!(got[1].title, "unused variable");
        assert_eq!(got[1].example, None);
        assert_eq!(got[2].example.as_deref(), Some("x\n"));
    }
}
