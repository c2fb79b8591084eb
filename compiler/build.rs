//! Builds the lalrpop grammar in `grammar/` and embeds `stdlib/` so that
//! `from std.nn import ...` works from any directory.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    // Read at run time, not `env!`: a build script binary copied along with a
    // target directory (worktrees, CI caches) must not point at its old checkout.
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("..");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());

    let grammar_dir = root.join("grammar");
    println!("cargo:rerun-if-changed={}", grammar_dir.display());
    lalrpop::Configuration::new()
        .set_in_dir(&grammar_dir)
        .set_out_dir(&out)
        .emit_rerun_directives(true)
        .process()
        .expect("lalrpop grammar");

    embed_stdlib(&root.join("stdlib"), &out.join("stdlib_files.rs"));
}

/// Writes `STDLIB_FILES: &[(&str, &str)]`: (module path such as `std.nn`, source).
fn embed_stdlib(dir: &Path, dest: &Path) {
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files = Vec::new();
    collect(dir, dir, &mut files);
    files.sort();
    let mut code = String::from("pub static STDLIB_FILES: &[(&str, &str)] = &[\n");
    for (module, path) in files {
        println!("cargo:rerun-if-changed={}", path.display());
        writeln!(
            code,
            "    ({module:?}, include_str!({:?})),",
            path.display().to_string()
        )
        .unwrap();
    }
    code.push_str("];\n");
    std::fs::write(dest, code).unwrap();
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            println!("cargo:rerun-if-changed={}", path.display());
            collect(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "tsr") {
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let module: Vec<String> = rel
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            out.push((module.join("."), path.canonicalize().unwrap()));
        }
    }
}
