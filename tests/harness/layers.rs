//! The structure rules of `docs/architecture.md`, checked on the source text
//! (`cargo test -p tessera-tests --test layers`):
//!
//! * every Rust source file of the compiler, the REPL and the language server
//!   opens with a `//!` module doc saying what it is;
//! * the layers point one way: [`FORBIDDEN`] lists, per directory of
//!   `compiler/src`, the modules its code must not name. A rule of
//!   [`Scope::Code`] spares test code (a `#[cfg(test)] mod` and its file, and
//!   the item after any other `#[cfg(test)]`), so tests may build a database;
//!   a rule of [`Scope::All`] holds for tests too: no test of the IR calls code
//!   generation, and no test of the target table reaches above it.

use std::path::{Path, PathBuf};

use tessera_tests::workspace_root;

/// Directories whose every `.rs` file needs a module doc.
const DOCUMENTED: &[&str] = &["compiler/src", "repl/src", "lsp/src", "tests/harness"];

/// Which code of a layer a rule of [`FORBIDDEN`] holds for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    /// Non-test code only: tests may use the module (the database, to set up
    /// a case as a user would).
    Code,
    /// Test code too: the layer's tests must not depend on the module either.
    All,
}

/// `(layer, module, scope, why)`: code under `compiler/src/LAYER/` must not
/// name `crate::MODULE` (or `tessera::MODULE`). One row per rule.
#[rustfmt::skip]
const FORBIDDEN: &[(&str, &str, Scope, &str)] = &[
    ("syntax",  "db",      Scope::Code, "the query layer calls the parser, not the reverse"),
    ("diag",    "db",      Scope::Code, "diagnostics are plain data"),
    ("check",   "db",      Scope::Code, "the checker takes a module scope, not a database"),
    ("ir",      "db",      Scope::Code, "lowering takes checked items and scopes as data"),
    ("backend", "db",      Scope::Code, "the back end takes Target IR, returns text and numbers"),
    ("check",   "backend", Scope::All,  "target facts are in `target`; the checker never needs a back end"),
    ("ir",      "backend", Scope::All,  "IR never imports code generation; PTX tests belong to `backend`"),
    ("target",  "db",      Scope::All,  "target facts are data below every layer"),
    ("target",  "check",   Scope::All,  "target facts are data below every layer"),
    ("target",  "ir",      Scope::All,  "target facts are data below every layer"),
    ("target",  "backend", Scope::All,  "target facts are data below every layer"),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_source_file_has_a_module_doc() {
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in DOCUMENTED {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} files", files.len());
    let missing: Vec<String> = files
        .iter()
        .filter(|f| !read(f).starts_with("//!"))
        .map(|f| f.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "these files do not open with a `//!` module doc saying what they are: {missing:#?}"
    );
}

/// The module `#[cfg(test)] mod NAME;` declares beside `file`: `NAME.rs` or
/// `NAME/mod.rs` in the directory that holds `file`'s children.
fn test_module_files(file: &Path, text: &str) -> Vec<PathBuf> {
    let dir = match file.file_stem().and_then(|s| s.to_str()) {
        Some("mod" | "lib" | "main") => file.parent().unwrap().to_path_buf(),
        Some(stem) => file.parent().unwrap().join(stem),
        None => return Vec::new(),
    };
    let mut out = Vec::new();
    let mut after_cfg_test = false;
    for line in text.lines().map(str::trim) {
        if line == "#[cfg(test)]" {
            after_cfg_test = true;
            continue;
        }
        if after_cfg_test && !line.starts_with("#[") {
            let decl = line
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub ");
            if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                out.push(dir.join(format!("{name}.rs")));
                out.push(dir.join(name).join("mod.rs"));
            }
            after_cfg_test = false;
        }
    }
    out
}

/// The lines of `text` outside test code: from a `#[cfg(test)]` inline
/// `mod … {` to the end of the file (test modules come last), and the one item
/// line after any other `#[cfg(test)]`, are left out.
fn non_test_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut after_cfg_test = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t == "#[cfg(test)]" {
            after_cfg_test = true;
            continue;
        }
        if after_cfg_test {
            if t.starts_with("#[") {
                continue;
            }
            after_cfg_test = false;
            if t.contains("mod ") && t.ends_with('{') {
                break;
            }
            continue;
        }
        out.push((i + 1, line));
    }
    out
}

/// The numbered lines of `text` a rule of `scope` reads.
fn lines_in_scope(scope: Scope, text: &str) -> Vec<(usize, &str)> {
    match scope {
        Scope::Code => non_test_lines(text),
        Scope::All => text.lines().enumerate().map(|(i, l)| (i + 1, l)).collect(),
    }
}

/// The first path segments a line names after `crate::` or `tessera::`,
/// including each member of a `crate::{a, b::c}` group.
fn named_modules(line: &str) -> Vec<&str> {
    let code = line.split("//").next().unwrap_or("");
    let mut out = Vec::new();
    for prefix in ["crate::", "tessera::"] {
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // `my_crate::`, not `crate::`
            }
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                out.extend(
                    group[..end]
                        .split(',')
                        .map(|m| m.trim().split("::").next().unwrap()),
                );
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                out.push(&rest[..end]);
            }
        }
    }
    out
}

#[test]
fn layers_import_only_below_them() {
    let src = workspace_root().join("compiler/src");
    let mut violations = Vec::new();
    let mut checked = 0;
    for (layer, forbidden, scope, why) in FORBIDDEN {
        let mut files = Vec::new();
        rust_files(&src.join(layer), &mut files);
        let texts: Vec<(PathBuf, String)> =
            files.into_iter().map(|f| (f.clone(), read(&f))).collect();
        let test_files: Vec<PathBuf> = texts
            .iter()
            .flat_map(|(f, t)| test_module_files(f, t))
            .collect();
        for (file, text) in &texts {
            if *scope == Scope::Code && test_files.contains(file) {
                continue;
            }
            let lines = lines_in_scope(*scope, text);
            checked += 1;
            for (n, line) in lines {
                if named_modules(line).contains(forbidden) {
                    violations.push(format!(
                        "{}:{n}: `{layer}` names `{forbidden}` ({why}): {}",
                        file.strip_prefix(&src).unwrap().display(),
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(checked > 30, "checked only {checked} files");
    assert!(
        violations.is_empty(),
        "layering violations:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_checks_see_what_they_forbid() {
    assert_eq!(named_modules("use crate::db::{self, Db};"), ["db"]);
    assert_eq!(
        named_modules("use crate::{backend::arch::Arch, db};"),
        ["backend", "db"]
    );
    assert_eq!(
        named_modules("    db: &dyn tessera::db::Db, // crate::ir"),
        ["db"]
    );
    assert!(named_modules("use my_crate::db;").is_empty());
    let text = "use crate::ir;\n#[cfg(test)]\nuse crate::db::Database;\nfn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::db;\n}\n";
    let lines: Vec<&str> = non_test_lines(text).into_iter().map(|(_, l)| l).collect();
    assert_eq!(lines, ["use crate::ir;", "fn f() {}"]);
    // A rule over test code too reads the test module.
    let all: Vec<&str> = lines_in_scope(Scope::All, text)
        .into_iter()
        .flat_map(|(_, l)| named_modules(l))
        .collect();
    assert_eq!(all, ["ir", "db", "db"]);
    let ir_backend = FORBIDDEN.iter().find(|r| (r.0, r.1) == ("ir", "backend"));
    assert_eq!(ir_backend.map(|r| r.2), Some(Scope::All));
    let file = Path::new("/x/ir/mod.rs");
    let decl = "#[cfg(test)]\nmod lower_tests;\nmod tile;\n";
    assert_eq!(
        test_module_files(file, decl),
        [
            Path::new("/x/ir/lower_tests.rs"),
            Path::new("/x/ir/lower_tests/mod.rs")
        ]
    );
}
