//! The language server's every-prefix replay: each prefix of a file, as a
//! user typing it from the start would produce, is set as the document's text
//! in one database (incrementally, as the server does) and every query the
//! server answers from it runs in process: diagnostics (the checker's and the
//! estimate pass's), hover, completion, signature help, inlay hints, semantic
//! tokens and document symbols. None may panic, and every diagnostic must lie
//! inside its prefix.

use tessera::db::Database;
use tessera::ir::tile::Specialization;

use super::exec::{assert_well_formed, guarded, Failure, Stage};

/// What a replay did.
#[derive(Clone, Debug, Default)]
pub struct Replay {
    pub prefixes: u64,
    pub queries: u64,
}

/// Replays the prefixes of `text` ending every `stride` characters (and the
/// whole text); a failure names the prefix's length in bytes.
pub fn replay(text: &str, stride: usize, out: &mut Replay) -> Result<(), (usize, Failure)> {
    // The server runs its queries with the compiler's query stack.
    tessera::stack::with_stack(|| replay_here(text, stride, out))
        .expect("the system starts a thread for the queries")
}

fn replay_here(text: &str, stride: usize, out: &mut Replay) -> Result<(), (usize, Failure)> {
    let mut db = Database::new();
    let path = "/fuzz/prefix.tsr";
    let mut ends: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .step_by(stride.max(1))
        .collect();
    ends.push(text.len());
    ends.dedup();
    for end in ends {
        let prefix = &text[..end];
        let file = db.set_source(path, prefix.to_string());
        out.prefixes += 1;
        let queries = guarded(Stage::Check, || {
            let db = &db;
            let options = db.options();
            let spec = Specialization::new();
            let len = prefix.len() as u32;
            assert_well_formed(prefix, db.diagnostics(file));
            let (_, estimates) = tessera::db::file_resources(db, file, options, &spec);
            assert_well_formed(prefix, &estimates);
            let mut n = 2;
            let mut probes = vec![len, len.saturating_sub(1), len / 2];
            probes.dedup();
            for at in probes
                .into_iter()
                .filter(|o| prefix.is_char_boundary(*o as usize))
            {
                let _ = tessera_lsp::hover::hover(db, file, options, &spec, at);
                let _ = tessera_lsp::complete::items(db, options, file, at);
                let _ = tessera::ide::complete::signature_help(db, file, at);
                n += 3;
            }
            let _ = tessera::ide::inlay_hints(db, file, options, &spec, 0, len);
            let _ = tessera::ide::tokens::semantic_tokens(db, file);
            let _ = tessera::ide::document_symbols(db, file, options);
            n + 3
        })
        .map_err(|f| (end, f))?;
        out.queries += queries;
    }
    Ok(())
}
