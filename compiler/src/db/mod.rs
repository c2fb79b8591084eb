//! The salsa database every front door queries: its inputs, options and the
//! `Database` itself. The queries live in submodules by the layer they feed —
//! `front` (items, parsing, module scopes, checking), `tensor` (Graph and
//! Schedule IR of whole-tensor functions) and `kernel` (Tile IR, Target IR, PTX)
//! — and are re-exported here, so callers name them `db::tile_ir` and so on.
//! This is the only layer that calls into `ir/` and `backend/` with a database:
//! those layers take data, never `&dyn Db`.
//!
//! Incrementality comes from how a file is cut up: `file_items` splits a file into
//! top-level items and interns each item's *text* (`ItemSource`). Every per-item
//! query (`parse_item`, `check_item`) is keyed by that interned text, so its spans
//! are relative to the item and an edit elsewhere in the file — even one that moves
//! this item — leaves its key, and so its cached results, untouched. Cross-item
//! facts (signatures, consts, imports) flow through `module_scope`, which carries no
//! absolute spans and is therefore backdated when an edit changes only a body.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use file_map::FileMap;

use crate::check;
use crate::diag::Diagnostic;
use crate::syntax::{self, ast};
use crate::target::Arch;

mod front;
mod kernel;
mod tensor;

pub use front::*;
pub use kernel::*;
pub use tensor::*;

/// One source file: a path (real or virtual, e.g. `<repl>`) and its text.
#[salsa::input(debug)]
pub struct SourceFile {
    #[returns(ref)]
    pub path: PathBuf,
    #[returns(ref)]
    pub text: String,
}

/// Compilation options shared by every query.
#[salsa::input(debug)]
pub struct Options {
    #[returns(copy)]
    pub arch: Arch,
    /// f32 `matmul` without `precision=` multiplies at tf32 (the session's
    /// `set_float32_matmul_precision("high")`); ieee otherwise.
    #[returns(copy)]
    pub matmul_tf32: bool,
}

/// The text of one top-level item of one file.
#[salsa::interned(debug)]
pub struct ItemSource<'db> {
    #[returns(copy)]
    pub file: SourceFile,
    #[returns(ref)]
    pub text: String,
}

/// What queries need from the database beyond salsa itself: finding modules.
#[salsa::db]
pub trait Db: salsa::Database {
    /// The file for a dotted module path imported from `from`: `std.*` comes from the
    /// embedded stdlib, anything else from `PATH.tsr` next to the importing file.
    fn resolve_module(&self, from: SourceFile, path: &[String]) -> Option<SourceFile>;
}

/// The database behind `tsrc`, the REPL and the language server.
#[salsa::db]
#[derive(Clone)]
pub struct Database {
    storage: salsa::Storage<Self>,
    files: FileMap,
    options: Option<Options>,
    events: Arc<Mutex<Option<Vec<String>>>>,
    /// Created by `with_event_log`: salsa reports executions to `events`.
    logging: bool,
    /// Advanced by every write, so that computations on clones taken before it
    /// stop at their next `cancel::checkpoint`.
    generation: crate::cancel::Generation,
}

impl Default for Database {
    fn default() -> Self {
        Self::new()
    }
}

impl Database {
    /// A database without an event callback: salsa then builds no event for each
    /// memo it validates, which halves the cost of re-checking after an edit.
    pub fn new() -> Self {
        Self::with_storage(salsa::Storage::new(None), Arc::default(), false)
    }

    /// A database that can record which queries execute (`start_event_log`), for
    /// reuse tests and benchmarks.
    pub fn with_event_log() -> Self {
        let events: Arc<Mutex<Option<Vec<String>>>> = Arc::default();
        let log = events.clone();
        let storage = salsa::Storage::new(Some(Box::new(move |event: salsa::Event| {
            if let salsa::EventKind::WillExecute { database_key } = event.kind {
                if let Some(log) = &mut *log.lock().unwrap() {
                    log.push(format!("{database_key:?}"));
                }
            }
        })));
        Self::with_storage(storage, events, true)
    }

    fn with_storage(
        storage: salsa::Storage<Self>,
        events: Arc<Mutex<Option<Vec<String>>>>,
        logging: bool,
    ) -> Self {
        let mut db = Database {
            storage,
            files: FileMap::default(),
            options: None,
            events,
            logging,
            generation: Default::default(),
        };
        db.options = Some(Options::new(&db, Arch::default(), false));
        db
    }

    pub fn options(&self) -> Options {
        self.options.expect("options are set in Database::new")
    }

    /// The precision of f32 `matmul` without `precision=`: tf32 or ieee.
    pub fn set_matmul_tf32(&mut self, tf32: bool) {
        use salsa::Setter;
        let options = self.options();
        if options.matmul_tf32(self) != tf32 {
            self.generation.advance();
            options.set_matmul_tf32(self).to(tf32);
        }
    }

    /// The write count this handle was taken at: computations on a clone run in
    /// `cancel::scope` of it stop once the database is written to.
    pub fn generation(&self) -> crate::cancel::Generation {
        self.generation.clone()
    }

    pub fn set_arch(&mut self, arch: Arch) {
        use salsa::Setter;
        let options = self.options();
        if options.arch(self) != arch {
            self.generation.advance();
            options.set_arch(self).to(arch);
        }
    }

    /// A file with the given text, created or updated (virtual files included).
    pub fn set_source(&mut self, path: impl Into<PathBuf>, text: String) -> SourceFile {
        use salsa::Setter;
        let path = path.into();
        if let Some(file) = self.files.get(&path) {
            if file.text(self) != &text {
                self.generation.advance();
                file.set_text(self).to(text);
            }
            return file;
        }
        let file = SourceFile::new(self, path.clone(), text);
        self.files.insert(path, file);
        file
    }

    /// Reads a file from disk into the database.
    pub fn load_file(&mut self, path: &Path) -> std::io::Result<SourceFile> {
        let text = std::fs::read_to_string(path)?;
        Ok(self.set_source(path.to_path_buf(), text))
    }

    /// The file at `path`, if the database has it.
    pub fn file(&self, path: &Path) -> Option<SourceFile> {
        self.files.get(path)
    }

    /// Every diagnostic of `file` under the current options.
    pub fn diagnostics(&self, file: SourceFile) -> &[Diagnostic] {
        file_diagnostics(self, file, self.options())
    }

    /// Starts recording which queries execute (for reuse tests and benchmarks).
    /// Only a database made by `with_event_log` can record.
    pub fn start_event_log(&self) {
        assert!(
            self.logging,
            "start_event_log needs a database made by Database::with_event_log"
        );
        *self.events.lock().unwrap() = Some(Vec::new());
    }

    /// The queries executed since `start_event_log`, as `query(id)` strings.
    pub fn take_event_log(&self) -> Vec<String> {
        self.events
            .lock()
            .unwrap()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

#[salsa::db]
impl salsa::Database for Database {}

#[salsa::db]
impl Db for Database {
    fn resolve_module(&self, from: SourceFile, path: &[String]) -> Option<SourceFile> {
        if path.first().map(String::as_str) == Some("std") {
            let dotted = path.join(".");
            let key = PathBuf::from(format!("<{dotted}>"));
            if let Some(file) = self.files.get(&key) {
                return Some(file);
            }
            let text = crate::stdlib::source(&dotted)?;
            let file = SourceFile::new(self, key.clone(), text.to_string());
            self.files.insert(key, file);
            return Some(file);
        }
        // User modules live next to the importing file; read on first use, like the
        // lazy inputs of salsa's examples. Later edits arrive through `set_source`.
        let mut candidate = from
            .path(self)
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        for part in path {
            candidate.push(part);
        }
        candidate.set_extension("tsr");
        if let Some(file) = self.files.get(&candidate) {
            return Some(file);
        }
        let text = std::fs::read_to_string(&candidate).ok()?;
        let file = SourceFile::new(self, candidate.clone(), text);
        self.files.insert(candidate, file);
        Some(file)
    }
}

/// A small path → file map that is cheap to clone with the database (snapshots).
mod file_map {
    use super::SourceFile;
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, RwLock};

    #[derive(Clone, Default)]
    pub struct FileMap(Arc<RwLock<HashMap<PathBuf, SourceFile>>>);

    impl FileMap {
        pub fn get(&self, path: &Path) -> Option<SourceFile> {
            self.0.read().unwrap().get(path).copied()
        }

        pub fn insert(&self, path: PathBuf, file: SourceFile) {
            self.0.write().unwrap().insert(path, file);
        }
    }
}

#[cfg(test)]
mod reuse_tests {
    use super::*;

    const TEXT: &str = "const B = 64\n\n@kernel(grid=(cdiv(N, B),))\ndef k(x: Tensor[\"N\", f32]):\n    i = program_id(0) * B\n    store(x[i : i + B], load(x[i : i + B]) * 2.0)\n\ndef f(a: Tensor[\"M\", f32]) -> Tensor[\"M\", f32]:\n    return a * 0.5\n\ndef g(a: Tensor[\"M\", f32]) -> Tensor[\"M\", f32]:\n    return f(a) + a\n";

    #[test]
    fn body_edit_rechecks_only_that_function() {
        let mut db = Database::with_event_log();
        let file = db.set_source("r.tsr", TEXT.to_string());
        assert!(
            db.diagnostics(file).is_empty(),
            "{:?}",
            db.diagnostics(file)
        );
        let scope_before = module_scope(&db, file).clone();
        db.start_event_log();
        db.set_source("r.tsr", TEXT.replace("a * 0.5", "a * 0.25"));
        assert!(db.diagnostics(file).is_empty());
        let log = db.take_event_log();
        let checks: Vec<&String> = log
            .iter()
            .filter(|e| e.starts_with("check_item("))
            .collect();
        assert_eq!(
            checks.len(),
            1,
            "only the edited function is re-checked: {log:?}"
        );
        assert_eq!(
            &scope_before,
            module_scope(&db, file),
            "the module scope is unchanged by a body edit"
        );
        // A signature edit changes the scope and re-checks its users.
        db.start_event_log();
        db.set_source(
            "r.tsr",
            TEXT.replace(
                "def f(a: Tensor[\"M\", f32])",
                "def f(a: Tensor[\"M\", f16])",
            ),
        );
        let diags = db.diagnostics(file).to_vec();
        let log = db.take_event_log();
        assert!(
            log.iter().filter(|e| e.starts_with("check_item(")).count() >= 2,
            "{log:?}"
        );
        assert!(diags.iter().any(|d| d.code == "E0301"), "{diags:?}");
    }

    #[test]
    fn import_cycles_do_not_panic() {
        let mut db = Database::new();
        db.set_source("/v/b.tsr", "from a import f\n\ndef g(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return f(x)\n".to_string());
        let a = db.set_source(
            "/v/a.tsr",
            "import a\nfrom b import g\n\ndef f(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return g(x) + a.f(x)\n".to_string(),
        );
        assert!(db.diagnostics(a).is_empty(), "{:?}", db.diagnostics(a));
    }
}
