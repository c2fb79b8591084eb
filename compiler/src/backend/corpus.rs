//! The corpus the back-end tests compile: the kernels of the repository's
//! `.tsr` files, each with a specialization it lowers under.
//!
//! A kernel is in when its file checks cleanly for the arch and it lowers to
//! Tile IR with its defaults or, where that needs values (E0511), with every
//! tensor dim and every const parameter without a default set to 64.

use std::path::{Path, PathBuf};

use crate::db::{file_kernels, item_signature, tile_ir, Database, ItemSource};
use crate::ir::tile::Specialization;
use crate::target::Arch;

/// The repository root (the compiler crate's parent).
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `.tsr` files under `dirs` (relative to the repository root), sorted.
pub(crate) fn files(dirs: &[&str]) -> Vec<PathBuf> {
    let root = root();
    let mut files = Vec::new();
    let mut stack: Vec<PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "tsr") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// One kernel of the corpus, in the database that loaded its file.
pub(crate) struct CorpusKernel<'db> {
    pub name: String,
    pub item: ItemSource<'db>,
    /// The item's offset in its file.
    pub offset: u32,
    pub spec: Specialization,
}

/// Calls `f` with a database set to `arch` and the kernels of `path` that
/// lower to Tile IR (see the module doc); nothing when the file has check
/// errors for `arch`. Runs on a thread with the compiler's stack, as the
/// binaries do (the fuzz cases nest deeply).
pub(crate) fn with_kernels(
    path: &Path,
    arch: Arch,
    f: &mut (dyn FnMut(&Database, Vec<CorpusKernel<'_>>) + Send),
) {
    crate::stack::with_stack(|| kernels_of(path, arch, f)).expect("a thread for the corpus");
}

fn kernels_of(
    path: &Path,
    arch: Arch,
    f: &mut (dyn FnMut(&Database, Vec<CorpusKernel<'_>>) + Send),
) {
    let mut db = Database::new();
    db.set_arch(arch);
    let Ok(file) = db.load_file(path) else {
        return;
    };
    if db.diagnostics(file).iter().any(|d| d.is_error()) {
        return;
    }
    let mut at_64 = Specialization::new();
    let kernels = file_kernels(&db, file);
    for (_, item, _) in &kernels {
        let r = tile_ir(&db, *item, db.options(), Specialization::new());
        if !matches!(r, Err(d) if d.iter().any(|d| d.code == "E0511")) {
            continue;
        }
        let Some(sig) = item_signature(&db, *item) else {
            continue;
        };
        for p in &sig.params {
            if let crate::check::Ty::Tensor { dims, .. } = &p.ty {
                for d in dims {
                    for s in d.symbols() {
                        at_64.values.insert(s.to_string(), 64);
                    }
                }
            }
            if p.is_const && !p.has_default {
                at_64.values.insert(p.name.clone(), 64);
            }
        }
    }
    let mut out = Vec::new();
    for (name, item, offset) in kernels {
        let spec = match tile_ir(&db, item, db.options(), Specialization::new()) {
            Ok(_) => Specialization::new(),
            Err(_) => at_64.clone(),
        };
        if tile_ir(&db, item, db.options(), spec.clone()).is_err() {
            continue;
        }
        out.push(CorpusKernel {
            name,
            item,
            offset,
            spec,
        });
    }
    f(&db, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel of the standard library, the examples and the tests that
    /// checks cleanly for an AMD arch lowers to Target IR that verifies (see
    /// `backend::corpus` for the specialization each is lowered under).
    #[test]
    fn corpus_kernels_lower_and_verify_for_every_amd_arch() {
        use crate::db::target_ir;
        use crate::ir::target::verify::verify;
        let files = files(&["stdlib", "examples", "tests"]);
        let mut lowered = 0usize;
        let mut failures = Vec::new();
        for arch in [Arch::Gfx90a, Arch::Gfx942, Arch::Gfx1100] {
            for path in &files {
                with_kernels(path, arch, &mut |db, kernels| {
                    for k in kernels {
                        let where_ = format!("{arch} {}: {}", path.display(), k.name);
                        match target_ir(db, k.item, db.options(), k.spec.clone()) {
                            Ok(t) => {
                                if let Err(e) = verify(t) {
                                    failures.push(format!("{where_}: verify: {e}"));
                                }
                                lowered += 1;
                            }
                            // Over the size limit on purpose (their UI and fuzz cases).
                            Err(d) if d.iter().all(|d| d.code == "E0119") => {}
                            Err(d) => failures.push(format!("{where_}: {d:?}")),
                        }
                    }
                });
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        assert!(lowered >= 3 * 170, "{lowered}");
    }
}
