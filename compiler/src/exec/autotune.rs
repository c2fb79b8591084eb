//! `@autotune` on a GPU: a launch of a kernel with a search space times
//! every configuration of the space (each compiled for the launch's
//! arguments), keeps the fastest per value of the `key=` dims, and launches
//! it. The choice is kept for the session and on disk beside the compiled
//! kernels, so a later launch (or session) with the same key reuses it.
//!
//! A trial is one warm-up launch (which compiles) and then timed launches,
//! each timed on the GPU with CUDA events; a configuration's time is their
//! median. The tensors the kernel writes are saved on the GPU before the
//! trials and put back after them, so the real launch sees its arguments
//! as the user passed them. A configuration that fails to compile or launch
//! is skipped with a note. On the CPU, and where no GPU is open, the first
//! configuration of the space is used (`ir::tile::lower`'s rule).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use super::cuda::{Gpu, SavedTensors};
use super::launch::{prepare, signature};
use super::{ExecError, Interrupt, Value};
use crate::db::{self, Database, ItemSource, SourceFile};
use crate::syntax::ast::{self, ExprKind};
use crate::target::Arch;

/// Timed launches per configuration (after one warm-up launch), in
/// `ROUNDS` turns with the other configurations.
pub const TIMED_RUNS: usize = 12;
pub const ROUNDS: usize = 3;

/// One configuration: a value per tuned name, in the space's order.
pub type Config = Vec<(String, i64)>;

/// What tuning found for one key value.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuned {
    /// The key dims' values (`M=4096, N=4096`).
    pub key: Vec<(String, i64)>,
    /// Each configuration with its median time in ms, or why it was skipped.
    pub trials: Vec<(Config, Result<f64, String>)>,
    /// The index of the fastest in `trials`.
    pub best: usize,
    /// Whether the choice came from the disk cache (no trial ran now).
    pub from_disk: bool,
}

impl Tuned {
    pub fn best_config(&self) -> &Config {
        &self.trials[self.best].0
    }
}

/// `BM=128, num_warps=8`.
pub fn config_text(c: &[(String, i64)]) -> String {
    c.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The configurations of `@autotune(space=...)` in order (the product of a
/// dict of lists, or a list of dicts: `check::scope::autotune_configs`)
/// tried on `arch` (a configuration's `"arch"`; `None`, the CPU: all), less
/// the names in `explicit` (a launch passes them), without repeats. Where
/// none is tried on `arch`, the space's first (as `tsrc` compiles it).
pub(crate) fn configurations(
    f: &ast::Function,
    db: &Database,
    kfile: SourceFile,
    explicit: &BTreeSet<String>,
    arch: Option<Arch>,
) -> Vec<Config> {
    let scope = db::module_scope(db, kfile);
    let mut out: Vec<Config> = Vec::new();
    for c in crate::check::scope::autotune_configs_for(f, &|n| scope.const_value(n), arch) {
        let c: Config = c
            .values
            .into_iter()
            .filter(|(n, _)| !explicit.contains(n))
            .filter_map(|(n, v)| Some((n, v.as_int()?)))
            .collect();
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// The configurations kernel `name`'s `@autotune` space tries on `arch`
/// (`None`: the CPU, which launches the first of them), for `:autotune`
/// before a launch; `None` where `name` is no kernel of `file` or the
/// standard library, or has no space.
pub fn space_of(
    db: &Database,
    file: SourceFile,
    name: &str,
    arch: Option<Arch>,
) -> Option<Vec<Config>> {
    let (kfile, item) = super::launch::find_kernel(db, file, name).ok()?;
    let parsed = db::parse_item(db, item);
    let Some(ast::Item::Function(f)) = parsed.item.as_deref() else {
        return None;
    };
    f.decorator("autotune")?;
    Some(configurations(f, db, kfile, &BTreeSet::new(), arch))
}

/// The const parameters a launch passes itself (not tuned), by value: each
/// is part of the tuning key, as it makes another kernel (`causal=True`
/// attention skips blocks the unmasked one computes, and its best tile may
/// differ).
fn explicit_consts(
    f: &ast::Function,
    values: &[(String, Value)],
    explicit: &BTreeSet<String>,
) -> Vec<(String, i64)> {
    f.params
        .iter()
        .filter(|p| {
            explicit.contains(&p.name.name)
                && matches!(&p.ty, Some(t) if matches!(t.kind, ast::TypeExprKind::Const(_)))
        })
        .filter_map(|p| {
            let v = match values.iter().find(|(n, _)| *n == p.name.name)?.1 {
                Value::Int(i) => i,
                Value::Bool(b) => i64::from(b),
                _ => return None,
            };
            Some((p.name.name.clone(), v))
        })
        .collect()
}

/// The dims `key=[...]` names.
fn key_names(f: &ast::Function) -> Vec<String> {
    let Some(Some(args)) = f.decorator("autotune").map(|d| &d.args) else {
        return Vec::new();
    };
    args.iter()
        .filter(|a| a.name.as_ref().is_some_and(|n| n.name == "key"))
        .flat_map(|a| match &a.value.kind {
            ExprKind::List(items) | ExprKind::Tuple(items) => items
                .iter()
                .filter_map(|e| match &e.kind {
                    ExprKind::Str(s) => Some(s.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// Launches autotuned kernel `item` on the GPU: the tuned configuration for
/// the launch's key (tuning first when there is none). `explicit` are the
/// parameters the caller gave: they are not tuned.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    db: &Database,
    kfile: SourceFile,
    item: ItemSource<'_>,
    f: &ast::Function,
    grid: Option<Vec<i64>>,
    values: &[(String, Value)],
    explicit: &BTreeSet<String>,
    gpu: &Gpu,
    interrupt: &Interrupt,
) -> Result<Config, ExecError> {
    let sig = signature(db, item, &f.name.name)?;
    let dims = super::launch::bind_dims(&sig, values)?;
    let all = configurations(f, db, kfile, explicit, Some(gpu.info().arch));
    let mut key: Vec<(String, i64)> = key_names(f)
        .into_iter()
        .filter_map(|k| dims.get(&k).map(|v| (k, *v)))
        .collect();
    key.extend(explicit_consts(f, values, explicit));
    let id = TuneId::new(&f.name.name, item.text(db), &key, gpu);
    let tuned = match gpu.tuned(&id.text) {
        Some(t) => t,
        None => {
            let t = match id.load(gpu, &key) {
                Some(t) => t,
                None => {
                    let t = tune(db, kfile, item, f, &grid, values, all, key, gpu, interrupt)?;
                    id.store(gpu, &t);
                    t
                }
            };
            gpu.remember_tuned(&f.name.name, &id.text, t.clone());
            t
        }
    };
    let (kernel, args, g) = prepare(
        db,
        kfile,
        item,
        grid,
        values,
        &tuned.best_config().iter().cloned().collect(),
        Some(gpu.info().arch),
    )?;
    gpu.launch(&kernel, &args, g, interrupt)?;
    Ok(tuned.best_config().clone())
}

/// Times every configuration; the tensors the kernel writes are put back
/// afterwards.
#[allow(clippy::too_many_arguments)]
fn tune(
    db: &Database,
    kfile: SourceFile,
    item: ItemSource<'_>,
    f: &ast::Function,
    grid: &Option<Vec<i64>>,
    values: &[(String, Value)],
    all: Vec<Config>,
    key: Vec<(String, i64)>,
    gpu: &Gpu,
    interrupt: &Interrupt,
) -> Result<Tuned, ExecError> {
    let progress = std::io::stderr().is_terminal();
    let mut saved: Option<SavedTensors> = None;
    let mut trials = Vec::with_capacity(all.len());
    let mut best: Option<(usize, f64)> = None;
    // Every configuration specialised first, so that ptxas compiles them
    // side by side; then each is timed.
    let prepared: Vec<_> = all
        .iter()
        .map(|c| {
            let tune: BTreeMap<String, i64> = c.iter().cloned().collect();
            prepare(
                db,
                kfile,
                item,
                grid.clone(),
                values,
                &tune,
                Some(gpu.info().arch),
            )
        })
        .collect();
    let kernels: Vec<_> = prepared
        .iter()
        .flatten()
        .map(|(k, _, _)| k.clone())
        .collect();
    gpu.compile_ahead(&kernels);
    // Each configuration is launched once (compiling and loading it), then
    // all are timed in turns, `ROUNDS` rounds of their share of
    // `TIMED_RUNS`: a GPU's clocks drift over the seconds a tuning takes,
    // and configurations timed one after the other would carry it.
    let mut runs: Vec<Result<(super::launch::Prepared, Vec<f64>), String>> = Vec::new();
    for p in prepared {
        interrupt.check()?;
        let warmed = p.and_then(|(k, a, g)| {
            if saved.is_none() {
                saved = Some(gpu.save_written(&k, &a)?);
            }
            gpu.launch(&k, &a, g, interrupt)?;
            Ok((k, a, g))
        });
        runs.push(match warmed {
            Ok(p) => Ok((p, Vec::with_capacity(TIMED_RUNS))),
            // Ctrl-C and a context the fault broke end tuning.
            Err(e) if e.code == "E0706" || gpu.is_broken() => return Err(e),
            Err(e) => Err(format!("[{}] {}", e.code, e.message)),
        });
    }
    for round in 0..ROUNDS {
        for run in &mut runs {
            let Ok(((k, a, g), times)) = run else {
                continue;
            };
            let timed = (0..TIMED_RUNS / ROUNDS).try_for_each(|_| -> Result<(), ExecError> {
                let before = gpu.kernel_time();
                gpu.launch(k, a, *g, interrupt)?;
                times.push((gpu.kernel_time() - before).as_secs_f64() * 1e3);
                Ok(())
            });
            match timed {
                Ok(()) => {}
                Err(e) if e.code == "E0706" || gpu.is_broken() => return Err(e),
                Err(e) => *run = Err(format!("[{}] {}", e.code, e.message)),
            }
        }
        if progress {
            eprint!(
                "\rautotune {}: {} configurations, round {}/{ROUNDS}\x1b[K",
                f.name.name,
                runs.len(),
                round + 1
            );
            let _ = std::io::stderr().flush();
        }
    }
    for (i, (c, run)) in all.into_iter().zip(runs).enumerate() {
        let result = run.map(|(_, mut times)| {
            times.sort_by(f64::total_cmp);
            times[times.len() / 2]
        });
        if let Ok(ms) = result {
            if best.is_none_or(|(_, b)| ms < b) {
                best = Some((i, ms));
            }
        }
        trials.push((c, result));
    }
    if progress {
        eprint!("\r\x1b[K");
    }
    if let Some(s) = saved {
        gpu.restore_written(s)?;
    }
    let Some((best, _)) = best else {
        let notes: Vec<String> = trials
            .iter()
            .filter_map(|(c, r)| r.as_ref().err().map(|e| format!("{}: {e}", config_text(c))))
            .collect();
        return Err(ExecError::new(
            "E0709",
            format!(
                "no configuration of `{}`'s autotune space ran: {}",
                f.name.name,
                notes.join("; ")
            ),
        )
        .with_help("fix the kernel for one configuration at least, or change the space"));
    };
    Ok(Tuned {
        key,
        trials,
        best,
        from_disk: false,
    })
}

/// Where a tuning result is kept: its identity (kernel, its source text, the
/// key's values, the GPU) and the disk file named by its hash.
struct TuneId {
    text: String,
}

impl TuneId {
    fn new(name: &str, source: &str, key: &[(String, i64)], gpu: &Gpu) -> TuneId {
        let info = gpu.info();
        TuneId {
            text: format!(
                "{name}\n{}\n{} {}.{} {} {}\n{source}",
                config_text(key),
                info.name,
                info.compute_capability.0,
                info.compute_capability.1,
                info.arch,
                env!("CARGO_PKG_VERSION"),
            ),
        }
    }

    fn path(&self, gpu: &Gpu) -> Option<PathBuf> {
        use sha3::{Digest, Sha3_256};
        let hash = Sha3_256::digest(self.text.as_bytes());
        let hex: String = hash.iter().take(16).map(|b| format!("{b:02x}")).collect();
        Some(gpu.cache_dir()?.join("autotune").join(format!("{hex}.txt")))
    }

    /// A choice stored by an earlier session: its identity, then one line
    /// per trial (`ms` or `skipped`, then the configuration), the best first.
    fn load(&self, gpu: &Gpu, key: &[(String, i64)]) -> Option<Tuned> {
        let text = std::fs::read_to_string(self.path(gpu)?).ok()?;
        let body = text.strip_prefix(&self.text)?.strip_prefix("\n--\n")?;
        let mut trials = Vec::new();
        for line in body.lines() {
            let (time, config) = line.split_once('\t')?;
            let config: Config = if config.is_empty() {
                Vec::new()
            } else {
                config
                    .split(", ")
                    .map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((k.to_string(), v.parse().ok()?))
                    })
                    .collect::<Option<_>>()?
            };
            let result = match time.parse::<f64>() {
                Ok(ms) => Ok(ms),
                Err(_) => Err(time.to_string()),
            };
            trials.push((config, result));
        }
        let best = trials
            .iter()
            .enumerate()
            .filter_map(|(i, (_, r))| r.as_ref().ok().map(|ms| (i, *ms)))
            .min_by(|a, b| a.1.total_cmp(&b.1))?
            .0;
        Some(Tuned {
            key: key.to_vec(),
            trials,
            best,
            from_disk: true,
        })
    }

    /// Stores `t` (temp file and rename, as the kernel cache does); a
    /// folder that cannot be written only means no disk copy.
    fn store(&self, gpu: &Gpu, t: &Tuned) {
        let Some(path) = self.path(gpu) else { return };
        let Some(dir) = path.parent() else { return };
        let mut text = format!("{}\n--\n", self.text);
        for (c, r) in &t.trials {
            let time = match r {
                Ok(ms) => format!("{ms}"),
                Err(e) => e.replace(['\t', '\n'], " "),
            };
            text.push_str(&format!("{time}\t{}\n", config_text(c)));
        }
        let _ = std::fs::create_dir_all(dir).and_then(|()| {
            let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
            tmp.write_all(text.as_bytes())?;
            tmp.persist(&path).map(|_| ()).map_err(|e| e.error)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU trial of each configuration of a listed space: the kernel's
    /// `num_stages` and `BN`. A configuration leaves open what it does not
    /// name, which the first configuration tried on the GPU's arch gives
    /// (here: none, so the decorator's), never another configuration's.
    #[test]
    fn a_configuration_takes_nothing_from_another() {
        let src = "@autotune(space=[{\"arch\": \"sm_90a\"}, {\"BN\": 128, \"arch\": \"sm_90a\"}, {\"BN\": 64, \"num_stages\": 2}], key=[\"N\"])\n@kernel(grid=(1,), num_warps=4, num_stages=4)\ndef k(x: Tensor[\"N\", f32], BN: const = 256):\n    store(x[0 : BN], zeros([BN], f32))\n";
        let mut db = Database::new();
        let file = db.set_source("t.tsr", src.to_string());
        let (kfile, item) = super::super::launch::find_kernel(&db, file, "k").expect("kernel");
        let x = crate::exec::tensor::Tensor::zeros(&[512], crate::check::DType::F32);
        let values = vec![("x".to_string(), Value::Tensor(x))];
        let trial = |tune: &[(&str, i64)], arch| {
            let tune: BTreeMap<String, i64> =
                tune.iter().map(|(n, v)| (n.to_string(), *v)).collect();
            let (k, _, _) =
                prepare(&db, kfile, item, None, &values, &tune, arch).expect("prepared");
            let bn = k
                .specialization
                .iter()
                .find(|(n, _)| n == "BN")
                .map(|(_, v)| *v);
            (k.num_stages, bn)
        };
        let gpu = Some(Arch::Sm90a);
        assert_eq!(trial(&[], gpu), (4, Some(256)));
        assert_eq!(trial(&[("BN", 128)], gpu), (4, Some(128)));
        assert_eq!(trial(&[("BN", 64), ("num_stages", 2)], gpu), (2, Some(64)));
        // On sm_90 only the last configuration is tried: it is the default.
        assert_eq!(trial(&[], Some(Arch::Sm90)), (2, Some(64)));
    }

    fn configs_of(src: &str, explicit: &[&str]) -> Vec<String> {
        configs_on(src, explicit, None)
    }

    fn configs_on(src: &str, explicit: &[&str], arch: Option<Arch>) -> Vec<String> {
        let (items, diags) = crate::syntax::parse_file(src);
        assert!(diags.is_empty(), "{diags:?}");
        let Some((ast::Item::Function(f), _)) = items.first() else {
            panic!("a function");
        };
        let mut db = Database::new();
        let file = db.set_source("t.tsr", src.to_string());
        let explicit: BTreeSet<String> = explicit.iter().map(|s| s.to_string()).collect();
        configurations(f, &db, file, &explicit, arch)
            .iter()
            .map(|c| config_text(c))
            .collect()
    }

    #[test]
    fn configurations_are_the_product_of_a_dict_or_the_list_as_written() {
        let kernel = "@kernel(grid=(1,))\ndef k(x: Tensor[\"N\", f32], BM: const = 64, BN: const = 64):\n    pass\n";
        let product = format!(
            "@autotune(space={{\"BM\": [64, 128], \"num_warps\": [4, 8, 16]}}, key=[\"N\"])\n{kernel}"
        );
        let all = configs_of(&product, &[]);
        assert_eq!(all.len(), 6);
        assert_eq!(all[0], "BM=64, num_warps=4");
        assert_eq!(all[5], "BM=128, num_warps=16");
        // A name the launch passes is not tuned: its repeats go.
        assert_eq!(configs_of(&product, &["BM"]).len(), 3);
        let list = format!(
            "@autotune(space=[{{\"BM\": 128, \"BN\": 64}}, {{\"BM\": 64, \"BN\": 128}}, {{\"BM\": 64, \"BN\": 64, \"num_warps\": 8}}], key=[\"N\"])\n{kernel}"
        );
        assert_eq!(
            configs_of(&list, &[]),
            [
                "BM=128, BN=64",
                "BM=64, BN=128",
                "BM=64, BN=64, num_warps=8"
            ]
        );
        assert_eq!(
            configs_of(&list, &["BN"]),
            ["BM=128", "BM=64", "BM=64, num_warps=8"]
        );
        assert_eq!(configs_of(kernel, &[]), [""]);
    }

    /// A configuration that names archs is tried on those only; the CPU
    /// (no arch) sees every one, and an arch none names gets the first.
    #[test]
    fn configurations_naming_archs_are_tried_on_those_only() {
        let src = "@autotune(space=[{\"BK\": 32, \"arch\": [\"sm_80\", \"sm_90\"]}, \
                   {\"BM\": 256, \"BK\": 32, \"arch\": \"sm_90\"}, {\"BK\": 64, \"arch\": \"sm_90a\"}], key=[\"N\"])\n\
                   @kernel(grid=(1,))\n\
                   def k(x: Tensor[\"N\", f32], BM: const = 128, BK: const = 32):\n    pass\n";
        assert_eq!(
            configs_on(src, &[], Some(Arch::Sm90)),
            ["BK=32", "BM=256, BK=32"]
        );
        assert_eq!(configs_on(src, &[], Some(Arch::Sm80)), ["BK=32"]);
        assert_eq!(configs_on(src, &[], Some(Arch::Sm90a)), ["BK=64"]);
        assert_eq!(configs_on(src, &[], Some(Arch::Sm75)), ["BK=32"]);
        assert_eq!(configs_on(src, &[], None).len(), 3);
        // Passing BK leaves BM the only tuned name on sm_90.
        assert_eq!(configs_on(src, &["BK"], Some(Arch::Sm90)), ["", "BM=256"]);
    }

    /// A const the launch passes (not tuned) is part of the key; tensors,
    /// scalars and the tuned consts are not.
    #[test]
    fn explicit_consts_join_the_key() {
        let src = "@autotune(space={\"BM\": [64, 128]}, key=[\"S\"])\n\
                   @kernel(grid=(cdiv(S, BM),))\n\
                   def k(x: Tensor[\"S\", f32], n: i32, causal: const bool = False, BM: const = 64):\n    \
                   pass\n";
        let (items, diags) = crate::syntax::parse_file(src);
        assert!(diags.is_empty(), "{diags:?}");
        let Some((ast::Item::Function(f), _)) = items.first() else {
            panic!("a function");
        };
        let values = vec![
            ("n".to_string(), Value::Int(7)),
            ("causal".to_string(), Value::Bool(true)),
            ("BM".to_string(), Value::Int(64)),
        ];
        let explicit: BTreeSet<String> = ["n", "causal"].map(String::from).into();
        assert_eq!(
            explicit_consts(f, &values, &explicit),
            vec![("causal".to_string(), 1)]
        );
        assert!(explicit_consts(f, &values, &BTreeSet::new()).is_empty());
    }
}
