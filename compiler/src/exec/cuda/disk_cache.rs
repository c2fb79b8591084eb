//! The on-disk cache of compiled kernels: one file per cubin, named by a
//! hash of what the cubin depends on ([`Key`]), holding the cubin and what
//! ptxas reported when it was compiled ([`JitInfo`]). No driver calls: the
//! caller compiles and loads.
//!
//! Concurrent processes are safe: an entry is written to a temporary file in
//! the same folder and renamed into place, so a reader sees a whole entry or
//! none. An entry that cannot be read or does not decode (truncated, another
//! format, a digest mismatch) counts as absent and is overwritten by the next
//! compile; a folder that cannot be created or written only means no disk
//! cache. Neither is ever an error for the user.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha3::{Digest, Sha3_256};

use super::jit::JitInfo;

/// The first line of every entry; a new layout gets a new number.
const MAGIC: &str = "tessera-kernel-cache 1";

/// The folder cubins are kept in: `$TESSERA_CACHE_DIR/kernels`, else the
/// user's cache folder's `tessera/kernels` (`$XDG_CACHE_HOME`, else
/// `~/.cache`, on Linux). `None` when there is no home to put it in.
pub fn default_dir() -> Option<PathBuf> {
    let dir = dir_from(std::env::var_os("TESSERA_CACHE_DIR"), dirs::cache_dir())?;
    // A relative `TESSERA_CACHE_DIR` is the working folder's, shown whole.
    Some(std::path::absolute(&dir).unwrap_or(dir))
}

/// [`default_dir`] given the variable's value and the user's cache folder.
pub fn dir_from(
    tessera_cache_dir: Option<OsString>,
    user_cache: Option<PathBuf>,
) -> Option<PathBuf> {
    let root = match tessera_cache_dir {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => user_cache?.join("tessera"),
    };
    Some(root.join("kernels"))
}

/// What a cubin depends on, hashed: the PTX, the arch it was compiled for
/// (with the GPU's own compute capability), the driver whose JIT compiled it and the Tessera version that wrote the
/// entry (SHA3-256: stable across Rust releases, unlike std's hasher).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key([u8; 32]);

impl Key {
    pub fn new(ptx: &str, arch: &str, driver_version: i32) -> Key {
        let mut h = Sha3_256::new();
        // Each field with its length first, so no two field lists hash the
        // same bytes.
        for field in [
            MAGIC.as_bytes(),
            env!("CARGO_PKG_VERSION").as_bytes(),
            arch.as_bytes(),
            &driver_version.to_le_bytes(),
            ptx.as_bytes(),
        ] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field);
        }
        Key(h.finalize().into())
    }

    /// The entry's file name: the hash in hex.
    pub fn file_name(&self) -> String {
        format!("{}.cubin", hex(&self.0))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A cached compile: the cubin and ptxas's report on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub info: JitInfo,
    pub cubin: Vec<u8>,
}

/// The entry of `key` in `dir`, or `None` if there is none that reads back
/// whole.
pub fn load(dir: &Path, key: &Key) -> Option<Entry> {
    decode(&std::fs::read(dir.join(key.file_name())).ok()?)
}

/// Writes the entry of `key` in `dir` (creating it), replacing any there:
/// a temporary file in `dir`, renamed into place when whole.
pub fn store(dir: &Path, key: &Key, entry: &Entry) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".partial-")
        .tempfile_in(dir)?;
    tmp.write_all(&encode(entry))?;
    let path = dir.join(key.file_name());
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(path)
}

/// The entry as bytes: text header lines, then the cubin.
fn encode(entry: &Entry) -> Vec<u8> {
    let field = |v: Option<u64>| v.map_or("-".to_string(), |n| n.to_string());
    let mut out = format!(
        "{MAGIC}\nsha3 {}\nregs {}\nspill_stores {}\nspill_loads {}\nstack {}\ncubin {}\n",
        hex(&Sha3_256::digest(&entry.cubin)),
        field(entry.info.regs.map(u64::from)),
        field(entry.info.spill_stores),
        field(entry.info.spill_loads),
        field(entry.info.stack_bytes),
        entry.cubin.len()
    )
    .into_bytes();
    out.extend_from_slice(&entry.cubin);
    out
}

/// [`encode`]'s inverse; `None` for anything else.
fn decode(bytes: &[u8]) -> Option<Entry> {
    // The header's 7 lines, then the cubin.
    let mut rest = bytes;
    let mut lines = Vec::with_capacity(7);
    for _ in 0..7 {
        let end = rest.iter().position(|&b| b == b'\n')?;
        lines.push(std::str::from_utf8(&rest[..end]).ok()?);
        rest = &rest[end + 1..];
    }
    if lines[0] != MAGIC {
        return None;
    }
    let names = [
        "sha3",
        "regs",
        "spill_stores",
        "spill_loads",
        "stack",
        "cubin",
    ];
    let field = |name: &str| -> Option<&str> {
        let i = names.iter().position(|n| *n == name)? + 1;
        lines[i].strip_prefix(name)?.strip_prefix(' ')
    };
    let digest = field("sha3")?.to_string();
    let number = |text: &str| -> Option<Option<u64>> {
        match text {
            "-" => Some(None),
            n => n.parse().ok().map(Some),
        }
    };
    let regs = number(field("regs")?)?;
    let info = JitInfo {
        regs: match regs {
            Some(r) => Some(u32::try_from(r).ok()?),
            None => None,
        },
        spill_stores: number(field("spill_stores")?)?,
        spill_loads: number(field("spill_loads")?)?,
        stack_bytes: number(field("stack")?)?,
    };
    let len: usize = field("cubin")?.parse().ok()?;
    if rest.len() != len || hex(&Sha3_256::digest(rest)) != digest {
        return None;
    }
    Some(Entry {
        info,
        cubin: rest.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry {
            info: JitInfo {
                regs: Some(26),
                spill_stores: Some(0),
                spill_loads: Some(8),
                stack_bytes: None,
            },
            // Bytes of every value, newlines and NULs included.
            cubin: (0..=255u8).chain(b"\n\n\x7fELF".iter().copied()).collect(),
        }
    }

    #[test]
    fn the_folder_is_the_variable_else_the_users_cache() {
        let home = Some(PathBuf::from("/home/u/.cache"));
        assert_eq!(
            dir_from(Some("/tmp/tc".into()), home.clone()),
            Some(PathBuf::from("/tmp/tc/kernels"))
        );
        assert_eq!(
            dir_from(None, home.clone()),
            Some(PathBuf::from("/home/u/.cache/tessera/kernels"))
        );
        // An empty variable is unset, as for most tools.
        assert_eq!(
            dir_from(Some("".into()), home),
            Some(PathBuf::from("/home/u/.cache/tessera/kernels"))
        );
        assert_eq!(dir_from(None, None), None);
    }

    #[test]
    fn the_key_depends_on_every_input() {
        let k = Key::new("ptx", "sm_90a", 12080);
        assert_eq!(k, Key::new("ptx", "sm_90a", 12080));
        assert_ne!(k, Key::new("ptx2", "sm_90a", 12080));
        assert_ne!(k, Key::new("ptx", "sm_90", 12080));
        assert_ne!(k, Key::new("ptx", "sm_90a", 12090));
        // Lengths are hashed: moving bytes between fields changes the key.
        assert_ne!(Key::new("a", "bc", 1), Key::new("ab", "c", 1));
        let name = k.file_name();
        assert_eq!(name.len(), 64 + ".cubin".len());
        assert!(name.ends_with(".cubin"));
        assert!(name[..64].bytes().all(|b| b.is_ascii_hexdigit()));
    }

    /// The hash is SHA3-256, fixed across releases: a known input's key.
    #[test]
    fn the_hash_is_sha3_256() {
        assert_eq!(
            hex(&Sha3_256::digest(b"abc")),
            "3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532"
        );
    }

    #[test]
    fn an_entry_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let kernels = dir.path().join("made/by/store");
        let key = Key::new("ptx", "sm_90a", 12080);
        assert_eq!(load(&kernels, &key), None);
        let path = store(&kernels, &key, &entry()).unwrap();
        assert_eq!(path, kernels.join(key.file_name()));
        assert_eq!(load(&kernels, &key), Some(entry()));
        // Overwriting replaces it; no temporary file is left behind.
        let mut other = entry();
        other.info = JitInfo::default();
        other.cubin.truncate(3);
        store(&kernels, &key, &other).unwrap();
        assert_eq!(load(&kernels, &key), Some(other));
        let names: Vec<_> = std::fs::read_dir(&kernels)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![OsString::from(key.file_name())]);
    }

    /// A damaged entry is absent, never an error, and the next store
    /// replaces it.
    #[test]
    fn a_corrupt_entry_is_absent_and_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let key = Key::new("ptx", "sm_90a", 12080);
        let path = store(dir.path(), &key, &entry()).unwrap();
        let whole = std::fs::read(&path).unwrap();
        let mut damaged = vec![
            Vec::new(),
            whole[..whole.len() - 1].to_vec(),
            [&whole[..], b"x"].concat(),
            b"not an entry\n".to_vec(),
            String::from_utf8_lossy(&whole)
                .replace("tessera-kernel-cache 1", "tessera-kernel-cache 0")
                .into_bytes(),
            String::from_utf8_lossy(&whole)
                .replace("regs 26", "regs x")
                .into_bytes(),
        ];
        // One flipped cubin byte: the digest no longer matches.
        let mut flipped = whole.clone();
        *flipped.last_mut().unwrap() ^= 1;
        damaged.push(flipped);
        for bytes in damaged {
            std::fs::write(&path, &bytes).unwrap();
            assert_eq!(load(dir.path(), &key), None, "{bytes:?}");
        }
        store(dir.path(), &key, &entry()).unwrap();
        assert_eq!(load(dir.path(), &key), Some(entry()));
    }

    /// A folder that cannot be made is an `Err` for the caller to ignore.
    #[test]
    fn an_unwritable_folder_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"").unwrap();
        let key = Key::new("ptx", "sm_90a", 12080);
        assert!(store(&file.join("kernels"), &key, &entry()).is_err());
        assert_eq!(load(&file.join("kernels"), &key), None);
    }

    /// Processes that store the same key at once leave one whole entry.
    #[test]
    fn concurrent_stores_leave_a_whole_entry() {
        let dir = tempfile::tempdir().unwrap();
        let key = Key::new("ptx", "sm_90a", 12080);
        let big = Entry {
            info: JitInfo::default(),
            cubin: vec![7u8; 1 << 20],
        };
        std::thread::scope(|s| {
            for i in 0..4 {
                let (dir, big) = (dir.path(), &big);
                s.spawn(move || {
                    for _ in 0..5 {
                        if i % 2 == 0 {
                            store(dir, &key, big).unwrap();
                        } else if let Some(e) = load(dir, &key) {
                            assert_eq!(&e, big);
                        }
                    }
                });
            }
        });
        assert_eq!(load(dir.path(), &key), Some(big));
    }
}
