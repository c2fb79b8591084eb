//! Publishing diagnostics: the checker's at once after an edit, then — once
//! the text has been still for a moment — again with the kernels' resource
//! diagnostics (see `crate::carry`); the other open documents once edits
//! pause. Compiler diagnostics become LSP ones here, with `codeDescription`
//! links into `docs/diagnostics.md`.

use std::path::Path;
use std::sync::atomic::Ordering;

use tessera::db::SourceFile;
use tower_lsp::lsp_types::*;

use crate::carry::KernelWarnings;
use crate::paths::Paths;
use crate::position::LineIndex;
use crate::server::{content_modified, Backend, Snapshot};

/// How long the text must stay unchanged before kernels are lowered for
/// their resource diagnostics.
const RESOURCES_DELAY: std::time::Duration = std::time::Duration::from_millis(150);

/// What one publication of a document's diagnostics holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// The checker's diagnostics (and the resource diagnostics of the
    /// kernels unchanged since the last estimate), published always.
    Checker,
    /// With the kernels' resource diagnostics; published if they differ
    /// from the last publication.
    Estimates,
}

impl Backend {
    /// Computes and publishes the diagnostics of `uri` at `version`: the
    /// checker's at once, then — once the text has been still for a moment,
    /// since lowering every kernel costs more than checking — again with the
    /// resource warnings of the kernels (W0003, W0004, E06xx).
    pub(crate) async fn publish(&self, uri: Url, version: i32) {
        if self.publish_once(&uri, version, Pass::Checker).await {
            let this = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(RESOURCES_DELAY).await;
                this.publish_once(&uri, version, Pass::Estimates).await;
            });
        }
    }

    /// The open documents and their versions, but `except`.
    pub(crate) fn open_versions(&self, except: Option<&Url>) -> Vec<(Url, i32)> {
        self.state
            .docs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(u, _)| Some(*u) != except)
            .map(|(u, d)| (u.clone(), d.version))
            .collect()
    }

    /// After a change to `changed`, the other open documents: one that imports
    /// it (or is imported by it) may have new diagnostics. Once the edits
    /// pause; each is published only if its diagnostics changed.
    pub(crate) fn refresh_others(&self, changed: Url) {
        let generation = self.state.edits.fetch_add(1, Ordering::SeqCst) + 1;
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(RESOURCES_DELAY).await;
            if this.state.edits.load(Ordering::SeqCst) != generation {
                return;
            }
            let open = this.open_versions(Some(&changed));
            for (u, v) in open {
                this.publish_once(&u, v, Pass::Estimates).await;
            }
        });
    }

    /// One publication; false when the version is stale or was cancelled.
    async fn publish_once(&self, uri: &Url, version: i32, pass: Pass) -> bool {
        let (carried, expected) = {
            let docs = self.state.docs.lock().unwrap_or_else(|e| e.into_inner());
            match docs.get(uri) {
                Some(d) if d.version == version => (
                    d.warnings.clone(),
                    (!Paths::is_stdlib(&d.path)).then(|| d.text.clone()),
                ),
                _ => return false,
            }
        };
        let u = uri.clone();
        let r = self
            .on_snapshot("diagnostics", None, move |s| {
                let Some(file) = s.file(&u) else {
                    return Ok(None);
                };
                // `didChange` records the version before it sets the text: a
                // snapshot taken in between has the previous text.
                if expected.is_some_and(|t| t != *file.text(&s.db)) {
                    return Err(content_modified());
                }
                let mut diags: Vec<tessera::diag::Diagnostic> = s.db.diagnostics(file).to_vec();
                let arch = s.options.arch(&s.db);
                if pass == Pass::Checker {
                    diags.extend(carried.carried(&s.db, file, arch, &s.spec));
                    return Ok(Some((self_convert(s, &u, file, &diags), None)));
                }
                let (_, extra) = tessera::db::file_resources(&s.db, file, s.options, &s.spec);
                // Only what an estimate says: a kernel that does not lower
                // (say, a const parameter without a default) is not an error
                // of the file.
                let extra: Vec<_> = extra
                    .into_iter()
                    .filter(|d| d.code.starts_with("W000") || d.code.starts_with("E060"))
                    .collect();
                let warnings = KernelWarnings::record(&s.db, file, arch, &s.spec, &extra);
                diags.extend(extra);
                Ok(Some((self_convert(s, &u, file, &diags), Some(warnings))))
            })
            .await;
        match r {
            Ok(Some((diags, warnings))) => {
                {
                    let mut docs = self.state.docs.lock().unwrap_or_else(|e| e.into_inner());
                    let Some(doc) = docs.get_mut(uri).filter(|d| d.version == version) else {
                        return false;
                    };
                    if let Some(w) = warnings {
                        doc.warnings = w;
                    }
                    // The checker's publication is the answer to an edit and
                    // always goes out; the later ones only when they add something.
                    if pass != Pass::Checker && doc.published.as_ref() == Some(&diags) {
                        return true;
                    }
                    doc.published = Some(diags.clone());
                }
                self.client
                    .publish_diagnostics(uri.clone(), diags, Some(version))
                    .await;
                true
            }
            Ok(None) => self.current_version(uri) == Some(version),
            _ => false,
        }
    }

    fn current_version(&self, uri: &Url) -> Option<i32> {
        self.state
            .docs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uri)
            .map(|d| d.version)
    }
}

/// Compiler diagnostics → LSP diagnostics of the document `uri`.
pub(crate) fn self_convert(
    s: &Snapshot,
    uri: &Url,
    file: SourceFile,
    diags: &[tessera::diag::Diagnostic],
) -> Vec<Diagnostic> {
    let ix = LineIndex::new(file.text(&s.db));
    let docs = s
        .paths
        .docs_url
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    diags
        .iter()
        .map(|d| {
            let mut message = d.message.clone();
            if !d.primary_label.is_empty() {
                message.push_str(&format!(" ({})", d.primary_label));
            }
            if let Some(h) = &d.help {
                message.push_str(&format!("\nhelp: {h}"));
            }
            let related: Vec<DiagnosticRelatedInformation> = d
                .labels
                .iter()
                .map(|l| DiagnosticRelatedInformation {
                    location: Location::new(uri.clone(), ix.range(l.span.start, l.span.end)),
                    message: l.message.clone(),
                })
                .collect();
            Diagnostic {
                range: ix.range(d.span.start, d.span.end),
                severity: Some(match d.severity {
                    tessera::diag::Severity::Error => DiagnosticSeverity::ERROR,
                    tessera::diag::Severity::Warning => DiagnosticSeverity::WARNING,
                    tessera::diag::Severity::Note => DiagnosticSeverity::INFORMATION,
                }),
                code: Some(NumberOrString::String(d.code.to_string())),
                code_description: docs.as_ref().map(|base| {
                    let mut href = base.clone();
                    href.set_fragment(Some(&anchor(d.code)));
                    CodeDescription { href }
                }),
                source: Some("tessera".into()),
                message,
                related_information: (!related.is_empty()).then_some(related),
                tags: None,
                data: d.help.as_ref().map(|h| serde_json::json!({ "help": h })),
            }
        })
        .collect()
}

/// The default `codeDescription` base: `docs/diagnostics.md` of the source
/// tree this binary was built from, when it is still there.
pub(crate) fn default_docs_url() -> Option<Url> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/diagnostics.md");
    let path = path.canonicalize().ok()?;
    Url::from_file_path(path).ok()
}

/// GitHub's anchor of a heading `## E0401: title` (`#e0401-title`).
fn anchor(code: &str) -> String {
    let title = tessera::diag::codes::lookup(code).map_or("", |c| c.title);
    let heading = format!("{code}: {title}").to_lowercase();
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_follow_the_docs_headings() {
        let docs = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/diagnostics.md"
        ))
        .unwrap();
        for code in tessera::diag::codes::CATALOGUE.iter().map(|c| c.code) {
            let heading = docs
                .lines()
                .find(|l| l.starts_with(&format!("## {code}:")))
                .unwrap_or_else(|| panic!("no `## {code}:` heading in docs/diagnostics.md"));
            let title = heading.trim_start_matches("## ");
            let slug: String = title
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect();
            assert_eq!(anchor(code), slug);
        }
    }
}
