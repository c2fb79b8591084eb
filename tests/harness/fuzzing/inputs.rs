//! Where inputs come from: generated programs, mutants of generated
//! programs, and mutants of the corpus (every `.tsr` under `tests/` and
//! `examples/`, and the standard library). Input `index` of a run with `seed`
//! is always the same text.

use std::path::{Path, PathBuf};

use super::gen;
use super::mutate::mutate;
use super::rng::Rng;

/// Programs to mutate, by name.
pub struct Corpus {
    pub files: Vec<(String, String)>,
}

impl Corpus {
    /// The standard library, `examples/` and `tests/` (but not the pending
    /// fuzz findings, which crash on purpose) under `root`.
    pub fn load(root: &Path) -> Corpus {
        let mut files: Vec<(String, String)> = tessera::stdlib::modules()
            .filter_map(|m| tessera::stdlib::source(m).map(|s| (m.to_string(), s.to_string())))
            .collect();
        let mut paths = Vec::new();
        collect_tsr(&root.join("examples"), &mut paths);
        collect_tsr(&root.join("tests"), &mut paths);
        paths.retain(|p| !p.components().any(|c| c.as_os_str() == "pending"));
        paths.sort();
        for p in paths {
            if let Ok(text) = std::fs::read_to_string(&p) {
                let name = p.strip_prefix(root).unwrap_or(&p).display().to_string();
                files.push((name, text));
            }
        }
        Corpus { files }
    }
}

pub fn collect_tsr(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_tsr(&path, out);
        } else if path.extension().is_some_and(|e| e == "tsr") {
            out.push(path);
        }
    }
}

/// How an input was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Generated,
    MutatedGenerated,
    MutatedCorpus,
    Corpus,
}

impl Origin {
    pub fn name(self) -> &'static str {
        match self {
            Origin::Generated => "generated",
            Origin::MutatedGenerated => "mutated generated",
            Origin::MutatedCorpus => "mutated corpus",
            Origin::Corpus => "corpus",
        }
    }
}

/// Input `index` of the run seeded `seed`.
pub fn input(seed: u64, index: u64, corpus: &Corpus) -> (String, Origin) {
    let mut rng = Rng::for_input(seed, index);
    let roll = rng.below(100);
    let mutations = |rng: &mut Rng| 1 + rng.below(4);
    if roll < 50 || corpus.files.is_empty() {
        (gen::program(&mut rng), Origin::Generated)
    } else if roll < 75 {
        let base = gen::program(&mut rng);
        let donor = if rng.chance(1, 2) {
            gen::program(&mut rng)
        } else {
            corpus.files[rng.below(corpus.files.len())].1.clone()
        };
        let n = mutations(&mut rng);
        (mutate(&mut rng, &base, &donor, n), Origin::MutatedGenerated)
    } else if roll < 97 {
        let base = &corpus.files[rng.below(corpus.files.len())].1;
        let donor = if rng.chance(1, 2) {
            gen::program(&mut rng)
        } else {
            corpus.files[rng.below(corpus.files.len())].1.clone()
        };
        let n = mutations(&mut rng);
        (mutate(&mut rng, base, &donor, n), Origin::MutatedCorpus)
    } else {
        let (_, text) = &corpus.files[rng.below(corpus.files.len())];
        (text.clone(), Origin::Corpus)
    }
}
