//! Where documents live: `file://` URIs ↔ database paths, and the stdlib.
//!
//! The stdlib is embedded in the binary; the database knows its modules as
//! `<std.nn>`. So that "go to definition" into the stdlib opens a real file in
//! any editor, the server writes the modules, read-only, to a cache directory
//! (`$XDG_CACHE_HOME/tessera/stdlib-VERSION/std/nn.tsr`, else `~/.cache/...`,
//! else the temp dir) and maps those files back to `<std.nn>`. Edits to them in
//! an editor are ignored: the embedded text is what every import sees.

use std::path::{Path, PathBuf};

use tower_lsp::lsp_types::Url;

pub struct Paths {
    stdlib_dir: PathBuf,
}

impl Paths {
    /// Writes the stdlib modules under the cache directory (if not there already).
    pub fn new() -> Self {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        let stdlib_dir = base
            .join("tessera")
            .join(format!("stdlib-{}", env!("CARGO_PKG_VERSION")));
        for module in tessera::stdlib::modules() {
            let path = module_file(&stdlib_dir, module);
            let text = tessera::stdlib::source(module).unwrap_or("");
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text) {
                if let Some(dir) = path.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                // A read-only copy from an older build of the same version.
                if let Ok(meta) = std::fs::metadata(&path) {
                    let mut perms = meta.permissions();
                    #[allow(clippy::permissions_set_readonly_false)]
                    perms.set_readonly(false);
                    let _ = std::fs::set_permissions(&path, perms);
                }
                if std::fs::write(&path, text).is_ok() {
                    if let Ok(meta) = std::fs::metadata(&path) {
                        let mut perms = meta.permissions();
                        perms.set_readonly(true);
                        let _ = std::fs::set_permissions(&path, perms);
                    }
                }
            }
        }
        let stdlib_dir = stdlib_dir.canonicalize().unwrap_or(stdlib_dir);
        Paths { stdlib_dir }
    }

    /// The database path of a document: `<std.nn>` for the stdlib copies, the
    /// URI itself for a document not on disk (VS Code's `untitled:Untitled-1`;
    /// it imports nothing but the stdlib).
    pub fn db_path(&self, uri: &Url) -> Option<PathBuf> {
        if uri.scheme() != "file" {
            return Some(PathBuf::from(uri.as_str()));
        }
        let path = uri.to_file_path().ok()?;
        let canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
        if let Ok(rel) = canonical.strip_prefix(&self.stdlib_dir) {
            let module = rel.with_extension("");
            let dotted: Vec<String> = module
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            return Some(PathBuf::from(format!("<{}>", dotted.join("."))));
        }
        Some(path)
    }

    /// The URI of a database path (`<std.nn>` → the cached copy).
    pub fn uri(&self, path: &Path) -> Option<Url> {
        let s = path.to_string_lossy();
        if let Some(module) = s.strip_prefix('<').and_then(|m| m.strip_suffix('>')) {
            return Url::from_file_path(module_file(&self.stdlib_dir, module)).ok();
        }
        if !path.is_absolute() {
            // A document not on disk (see `db_path`); a one-letter scheme
            // would be a Windows drive.
            if let Ok(url) = Url::parse(&s) {
                if url.scheme().len() > 1 && url.scheme() != "file" {
                    return Some(url);
                }
            }
        }
        Url::from_file_path(path).ok()
    }

    /// Whether a database path is a stdlib module (read-only in the editor).
    pub fn is_stdlib(path: &Path) -> bool {
        path.to_string_lossy().starts_with("<std")
    }
}

impl Default for Paths {
    fn default() -> Self {
        Self::new()
    }
}

fn module_file(dir: &Path, module: &str) -> PathBuf {
    let mut p = dir.to_path_buf();
    for part in module.split('.') {
        p.push(part);
    }
    p.set_extension("tsr");
    p
}

/// The `.tsr` files under a workspace folder (hidden folders, `target` and
/// `node_modules` skipped; at most 2,000 files).
pub fn workspace_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<_> = entries.filter_map(|e| e.ok()).collect();
        entries.sort_by_key(|e| e.path());
        for e in entries {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(ty) = e.file_type() else { continue };
            if ty.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "node_modules" {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|x| x == "tsr") {
                out.push(path);
                if out.len() >= 2000 {
                    return out;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_not_on_disk_keep_their_uri() {
        let paths = Paths::new();
        let untitled = Url::parse("untitled:Untitled-1").unwrap();
        let path = paths.db_path(&untitled).unwrap();
        assert_eq!(paths.uri(&path), Some(untitled));
        let file = Url::parse("file:///tmp/a.tsr").unwrap();
        assert_eq!(paths.db_path(&file), Some(PathBuf::from("/tmp/a.tsr")));
        assert_eq!(paths.uri(Path::new("/tmp/a.tsr")), Some(file));
        let std = paths.uri(Path::new("<std.nn>")).unwrap();
        assert_eq!(paths.db_path(&std), Some(PathBuf::from("<std.nn>")));
    }
}
