//! Settings: `workspace/didChangeConfiguration` (and `initializationOptions`)
//! — `tessera.arch`, `tessera.docsUrl` and `tessera.defines`, the last parsed
//! exactly as `tsrc report -D` parses it and its names checked against the
//! workspace's kernels. A changed arch or defines re-publishes every open
//! document's diagnostics.

use std::path::PathBuf;

use serde_json::Value as Json;
use tessera::db::Database;
use tessera::ir::tile::Specialization;
use tessera::target::Arch;
use tower_lsp::lsp_types::{DidChangeConfigurationParams, MessageType, Url};

use crate::server::Backend;

impl Backend {
    pub(crate) async fn handle_did_change_configuration(
        &self,
        params: DidChangeConfigurationParams,
    ) {
        let settings = params
            .settings
            .get("tessera")
            .cloned()
            .unwrap_or(params.settings);
        let settings = self.apply_settings(&settings);
        self.report_setting_errors(&settings.errors).await;
        if settings.defines_changed {
            self.check_define_names().await;
        }
        match settings.arch {
            // set_arch re-publishes.
            Some(arch) => self.set_arch(&arch).await,
            None if settings.defines_changed => self.republish().await,
            None => {}
        }
    }

    async fn set_arch(&self, arch: &str) {
        let parsed: std::result::Result<Arch, _> = arch.parse();
        match parsed {
            Ok(a) => {
                {
                    let mut db = self.state.db.lock().unwrap_or_else(|e| e.into_inner());
                    db.set_arch(a);
                }
                self.republish().await;
            }
            Err(_) => {
                self.client
                    .show_message(
                        MessageType::ERROR,
                        format!(
                            "tessera.arch: unknown arch `{arch}` (one of: {})",
                            Arch::ALL.map(|a| a.name()).join(", ")
                        ),
                    )
                    .await
            }
        }
    }

    /// Re-publishes the diagnostics of every open document and asks the
    /// client to refresh its inlay hints: after a change of arch or defines.
    async fn republish(&self) {
        let open = self.open_versions(None);
        for (u, v) in open {
            self.publish(u, v).await;
        }
        let _ = self.client.inlay_hint_refresh().await;
    }

    /// Applies `docsUrl` and `defines`; returns the `arch` to set, whether the
    /// defines changed, and the errors of bad `defines` entries (those are skipped).
    pub(crate) fn apply_settings(&self, v: &Json) -> Settings {
        if let Some(url) = v.get("docsUrl").and_then(Json::as_str) {
            *self
                .state
                .docs_url
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Url::parse(url).ok();
        }
        let mut out = Settings {
            arch: v.get("arch").and_then(Json::as_str).map(String::from),
            defines_changed: false,
            errors: Vec::new(),
        };
        if let Some(d) = v.get("defines") {
            let (spec, errors) = parse_defines(d);
            out.errors = errors;
            let mut current = self.state.defines.lock().unwrap_or_else(|e| e.into_inner());
            out.defines_changed = *current != spec;
            *current = spec;
        }
        out
    }

    /// Reports the `tessera.defines` names that no kernel of the workspace
    /// has, each as `-D NAME` reports it (the entry still applies: a kernel
    /// added later may have it). Runs once the workspace is loaded.
    pub(crate) async fn check_define_names(&self) {
        if !*self.state.workspace_loaded.borrow() {
            return;
        }
        let mut paths = self
            .state
            .workspace
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        paths.extend(
            self.state
                .docs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .map(|d| d.path.clone()),
        );
        let errors = self
            .on_snapshot("tessera.defines", None, move |s| {
                Ok(unknown_defines(&s.db, &paths, &s.spec))
            })
            .await
            .unwrap_or_default();
        self.report_setting_errors(&errors).await;
    }

    async fn report_setting_errors(&self, errors: &[String]) {
        for e in errors {
            self.client
                .show_message(MessageType::ERROR, format!("tessera.defines: {e}"))
                .await;
        }
    }
}

/// What a settings object asked for.
pub(crate) struct Settings {
    pub(crate) arch: Option<String>,
    pub(crate) defines_changed: bool,
    pub(crate) errors: Vec<String>,
}

/// Each define of `spec` that no kernel of the files at `paths` has, with the
/// message `-D NAME` gets (`tessera::cli::specialization`).
fn unknown_defines(db: &Database, paths: &[PathBuf], spec: &Specialization) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut kernels = Vec::new();
    for p in paths {
        if let Some(f) = db.file(p) {
            if seen.insert(p.clone()) {
                kernels.extend(tessera::db::file_kernels(db, f));
            }
        }
    }
    spec.values
        .iter()
        .filter_map(|(n, v)| {
            let d = [tessera::ir::tile::Define::Value(n.clone(), *v)];
            tessera::cli::specialization_among(db, &kernels, &d, "no kernel in the workspace").err()
        })
        .collect()
}

/// `tessera.defines` (`{"D": 64, "causal": true}`) → the specialization
/// `tsrc report -D D=64 -D causal=True` makes: each entry goes through the
/// parser of `-D`, so names and values mean exactly what they mean there.
/// `null` (a cleared setting) is no defines; bad entries come back as errors.
fn parse_defines(v: &Json) -> (Specialization, Vec<String>) {
    let mut spec = Specialization::new();
    let mut errors = Vec::new();
    let Some(map) = v.as_object() else {
        if !v.is_null() {
            errors.push(format!("expected an object NAME → integer, got `{v}`"));
        }
        return (spec, errors);
    };
    for (name, value) in map {
        let text = match value {
            Json::String(s) => s.clone(),
            Json::Number(_) | Json::Bool(_) => value.to_string(),
            _ => {
                errors.push(format!("`{name}`: `{value}` is not an integer"));
                continue;
            }
        };
        // num_warps and num_stages are held to their ranges here too, so a bad
        // value is one message rather than an error on every kernel.
        let range = |n: &str, x: i64| match n {
            "num_warps" => tessera::target::check_num_warps(x),
            "num_stages" => tessera::target::check_num_stages(x),
            _ => Ok(()),
        };
        match Specialization::parse_define(&format!("{name}={text}")) {
            Ok((n, x)) => match range(&n, x) {
                Ok(()) => {
                    spec.values.insert(n, x);
                }
                Err(e) => errors.push(e),
            },
            Err(e) => errors.push(e),
        }
    }
    (spec, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defines_parse_like_dash_d() {
        let (spec, errors) =
            parse_defines(&serde_json::json!({"D": 64, "causal": true, "BM": "0x80"}));
        assert!(errors.is_empty(), "{errors:?}");
        let expected = Specialization::new()
            .with("D", 64)
            .with("causal", 1)
            .with("BM", 128);
        assert_eq!(spec, expected);
        let (spec, errors) = parse_defines(&serde_json::json!({"D": 1.5, "2x": 3, "S": 8}));
        assert_eq!(spec, Specialization::new().with("S", 8));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(parse_defines(&Json::Null), (Specialization::new(), vec![]));
        // Out of range: skipped with a message (`num_warps=0` divided by zero).
        let (spec, errors) =
            parse_defines(&serde_json::json!({"num_warps": 0, "num_stages": 9, "BM": 64}));
        assert_eq!(spec, Specialization::new().with("BM", 64));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].contains("found 0") || errors[1].contains("found 0"),
            "{errors:?}"
        );
        let (spec, errors) = parse_defines(&serde_json::json!({"num_warps": 8, "num_stages": 3}));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            spec,
            Specialization::new()
                .with("num_warps", 8)
                .with("num_stages", 3)
        );
    }
}
