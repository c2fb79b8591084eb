//! The corpus the validation tests measure: the `.tsr` files of named
//! directories of the repository, and the specializations a kernel is
//! measured under.

use std::path::{Path, PathBuf};

use tessera::db::{tile_ir, Database, ItemSource};
use tessera::ir::tile::Specialization;

/// The repository root (the compiler crate's parent).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `.tsr` files of `dirs` (relative to the repository root; with their
/// subdirectories where the flag is set), sorted.
pub fn tsr_files(dirs: &[(&str, bool)]) -> Vec<PathBuf> {
    fn walk(dir: &Path, deep: bool, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                if deep {
                    walk(&p, deep, out);
                }
            } else if p.extension().is_some_and(|x| x == "tsr") {
                out.push(p);
            }
        }
    }
    let root = root();
    let mut files = Vec::new();
    for &(dir, deep) in dirs {
        walk(&root.join(dir), deep, &mut files);
    }
    files.sort();
    files
}

/// The specializations a kernel is measured under: none, or, for a kernel
/// that needs a value for `D` (flash attention's head dim), the brief's 64
/// and 128.
pub fn specializations(db: &Database, item: ItemSource<'_>) -> Vec<(String, Specialization)> {
    let plain = Specialization::new();
    match tile_ir(db, item, db.options(), plain.clone()) {
        Err(d)
            if d.iter()
                .any(|d| d.code == "E0511" && d.message.contains("`D`")) =>
        {
            [64, 128]
                .map(|v| (format!("[D={v}]"), Specialization::new().with("D", v)))
                .to_vec()
        }
        _ => vec![(String::new(), plain)],
    }
}
