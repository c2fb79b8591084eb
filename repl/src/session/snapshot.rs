//! A session saved to a folder and restored from it: what `tessera repl`
//! writes before it replaces its process to get a fresh GPU context (see
//! `crate::restart`), and what the new process reads back.
//!
//! The folder holds `session.json` (definitions, transcript, variables,
//! device, synthetic names, last launches, the shell's state), one file per
//! tensor storage (`tN.npy` for the dtypes `.npy` holds exactly, `tN.bin`
//! with the raw elements for bf16 and the f8 formats, their dtype and shape
//! in the manifest) and `input`, the piped input read but not executed.
//! `session.json` is written last, under a temporary name renamed into
//! place, so a folder without it is a half-written state.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value as Json};
use tessera::check::DType;
use tessera::exec::npy;
use tessera::exec::{LaunchSpec, Tensor, Value};
use tessera::ir::tile::Specialization;

use super::{Def, Device, Origin, Session, Val, SESSION_PATH};

/// The manifest's name in the state folder.
pub const MANIFEST: &str = "session.json";
/// The unexecuted piped input's name in the state folder.
pub const INPUT: &str = "input";
/// Which layout of the folder this is: a state of another layout is refused.
const FORMAT: &str = "tessera-session-1";

/// What the front end keeps beside the session across a restart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShellState {
    /// Whether a statement or command failed so far (piped mode's exit status).
    pub failed: bool,
    /// Input read but not executed yet (piped mode), executed first on resume.
    pub input: Vec<u8>,
}

/// What a restored session reports.
#[derive(Clone, Debug, PartialEq)]
pub struct Restored {
    /// The variables that were lost (their values were only on the GPU).
    pub lost: Vec<String>,
    /// The device the session ran on.
    pub device: Device,
    pub shell: ShellState,
}

/// Whether `name` is a file a saved state has (what a resume may delete).
pub fn is_state_file(name: &str) -> bool {
    if [MANIFEST, INPUT].contains(&name) || name == format!("{MANIFEST}.tmp") {
        return true;
    }
    let stem = name
        .strip_suffix(".npy")
        .or_else(|| name.strip_suffix(".bin"));
    stem.and_then(|s| s.strip_prefix('t'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Dtypes whose `.npy` form is exact (bf16 and the f8 formats are not).
fn npy_exact(d: DType) -> bool {
    !matches!(d, DType::BF16 | DType::F8E4M3 | DType::F8E5M2)
}

fn path_text(p: &Path) -> Result<&str, String> {
    p.to_str()
        .ok_or_else(|| format!("the path `{}` is not UTF-8", p.display()))
}

/// Tensors are written once per storage, so that aliases (`b = a`,
/// reshaped views) stay aliases.
struct Writer<'a> {
    dir: &'a Path,
    session: &'a Session,
    storages: Vec<Tensor>,
    entries: Vec<Json>,
}

impl Writer<'_> {
    fn tensor(&mut self, t: &Tensor) -> Result<Json, String> {
        let index = match self.storages.iter().position(|s| s.same_storage(t)) {
            Some(i) => i,
            None => {
                let i = self.storages.len();
                let dtype = t.dtype();
                let file = if npy_exact(dtype) {
                    let file = format!("t{i}.npy");
                    npy::save_npy(t, &self.dir.join(&file), &self.session.interrupt)
                        .map_err(|e| e.message)?;
                    file
                } else {
                    let file = format!("t{i}.bin");
                    std::fs::write(self.dir.join(&file), npy::raw_bytes(t))
                        .map_err(|e| format!("cannot write `{file}`: {e}"))?;
                    file
                };
                self.entries.push(json!({
                    "file": file,
                    "dtype": dtype.name(),
                    "shape": t.shape(),
                }));
                self.storages.push(t.clone());
                i
            }
        };
        Ok(json!({ "tensor": index, "shape": t.shape() }))
    }

    fn value(&mut self, v: &Value) -> Result<Json, String> {
        Ok(match v {
            Value::Tensor(t) => self.tensor(t)?,
            Value::Int(i) => json!({ "int": i }),
            // As bits: JSON has no NaN or infinities, and the value stays exact.
            Value::Float(f) => json!({ "float": f.to_bits() }),
            Value::Bool(b) => json!({ "bool": b }),
            Value::None => json!("None"),
            Value::Tuple(items) => {
                let items: Result<Vec<Json>, String> =
                    items.iter().map(|x| self.value(x)).collect();
                json!({ "tuple": items? })
            }
        })
    }

    fn val(&mut self, v: &Val) -> Result<Json, String> {
        Ok(match v {
            Val::Run(v) => self.value(v)?,
            Val::Str(s) => json!({ "str": s }),
            Val::DType(d) => json!({ "dtype": d.name() }),
            Val::List(items) => {
                let items: Result<Vec<Json>, String> = items.iter().map(|x| self.val(x)).collect();
                json!({ "list": items? })
            }
            Val::Dist(d, kind) => {
                use tessera::exec::dist::Placement;
                let parts: Result<Vec<Json>, String> = d
                    .parts()
                    .iter()
                    .map(|p| Ok(json!({ "device": p.device, "tensor": self.tensor(&p.tensor)? })))
                    .collect();
                let (placement, arg) = match d.placement() {
                    Placement::Sharded { axis } => ("sharded", json!(axis)),
                    Placement::Replicated => ("replicated", Json::Null),
                    Placement::Partial(op) => ("partial", json!(op.name())),
                };
                json!({ "dist": {
                    "kind": kind, "placement": placement, "arg": arg,
                    "shape": d.shape(), "dtype": d.dtype().name(), "parts": parts?,
                } })
            }
        })
    }
}

fn spec_json(s: &LaunchSpec) -> Json {
    json!({
        "values": s.consts.values,
        "divisors": s.consts.divisors,
        "floats": s.consts.floats,
        "dims": s.dims,
        "scalars": s.scalars,
        "tuned": s.tuned,
        "ran_on": s.ran_on.map(|a| a.to_string()),
    })
}

impl Session {
    /// Writes the session to `dir` (an empty folder): `device` is where it
    /// ran, `lost` the variables a sticky error took (named by the resumed
    /// session), `shell` the front end's part.
    pub fn save_state(
        &self,
        dir: &Path,
        device: Device,
        lost: &[String],
        shell: &ShellState,
    ) -> Result<(), String> {
        let mut w = Writer {
            dir,
            session: self,
            storages: Vec::new(),
            entries: Vec::new(),
        };
        let mut vars = Map::new();
        for (name, v) in &self.vars {
            vars.insert(name.clone(), w.val(v)?);
        }
        let defs: Result<Vec<Json>, String> = self
            .defs
            .iter()
            .map(|d| {
                let origin = match &d.origin {
                    Origin::Input(at) => json!({ "input": at }),
                    Origin::File(p) => json!({ "file": path_text(p)? }),
                };
                Ok(json!({ "names": d.names, "text": d.text, "origin": origin }))
            })
            .collect();
        let loaded: Result<Vec<&str>, String> = self.loaded.iter().map(|p| path_text(p)).collect();
        let last_launch: Map<String, Json> = self
            .last_launch
            .iter()
            .map(|(k, s)| (k.clone(), spec_json(s)))
            .collect();
        let manifest = json!({
            "format": FORMAT,
            "defs": defs?,
            "loaded": loaded?,
            "transcript": self.transcript,
            "device": device.name(),
            "devices": self.devices,
            "synth_count": self.synth_count,
            "synth_names": self.synth_names,
            "last_launch": last_launch,
            "storages": w.entries,
            "vars": vars,
            "lost": lost,
            "failed": shell.failed,
        });
        std::fs::write(dir.join(INPUT), &shell.input)
            .map_err(|e| format!("cannot write `{INPUT}`: {e}"))?;
        let text = serde_json::to_string(&manifest).map_err(|e| e.to_string())?;
        let tmp = dir.join(format!("{MANIFEST}.tmp"));
        std::fs::write(&tmp, text).map_err(|e| format!("cannot write `{MANIFEST}`: {e}"))?;
        std::fs::rename(&tmp, dir.join(MANIFEST))
            .map_err(|e| format!("cannot write `{MANIFEST}`: {e}"))
    }

    /// Replaces this session's definitions, variables, transcript and
    /// kernel bookkeeping by the state saved in `dir`. Nothing changes when
    /// the state is missing, half-written or corrupt (the error says what).
    /// The device is not opened here: the caller puts the session on
    /// `Restored::device`.
    pub fn restore_state(&mut self, dir: &Path) -> Result<Restored, String> {
        let text = std::fs::read_to_string(dir.join(MANIFEST)).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                format!("`{MANIFEST}` is missing (the state was not written completely)")
            }
            _ => format!("cannot read `{MANIFEST}`: {e}"),
        })?;
        let m: Json =
            serde_json::from_str(&text).map_err(|e| format!("`{MANIFEST}` is corrupt: {e}"))?;
        if m.get("format").and_then(Json::as_str) != Some(FORMAT) {
            return Err(format!("`{MANIFEST}` is not a state this tessera writes"));
        }
        let r = Reader {
            dir,
            m: &m,
            session: self,
        };
        let defs = r.defs()?;
        let loaded = r
            .strings("loaded")?
            .into_iter()
            .map(PathBuf::from)
            .collect();
        let transcript = r.str("transcript")?.to_string();
        // Diagnostics about a typed definition point into the transcript.
        let inside = |d: &Def| match d.origin {
            Origin::Input(at) => {
                (at as usize)
                    .checked_add(d.text.len())
                    .is_some_and(|end| end <= transcript.len())
                    && transcript.is_char_boundary(at as usize)
            }
            Origin::File(_) => true,
        };
        if !defs.iter().all(inside) {
            return Err(bad("defs"));
        }
        let device = match r.str("device")? {
            "cuda" => Device::Cuda,
            "cpu" => Device::Cpu,
            d => return Err(format!("unknown device `{d}`")),
        };
        // The device count of `--devices` / `:device cpu N` (GPUs open when used).
        let devices = match &m["devices"] {
            Json::Null => 1,
            v => r.u64(v, "devices")? as usize,
        };
        if !(1..=super::dist::MAX_DEVICES).contains(&devices) {
            return Err(bad("devices"));
        }
        let synth_count = r.u64(&m["synth_count"], "synth_count")?;
        let synth_names: HashMap<String, u64> = r
            .object(&m["synth_names"], "synth_names")?
            .iter()
            .map(|(k, v)| Ok((k.clone(), r.u64(v, "synth_names")?)))
            .collect::<Result<_, String>>()?;
        let mut last_launch = BTreeMap::new();
        for (k, v) in r.object(&m["last_launch"], "last_launch")? {
            last_launch.insert(k.clone(), r.spec(v)?);
        }
        let storages = r.storages()?;
        let mut vars = BTreeMap::new();
        for (k, v) in r.object(&m["vars"], "vars")? {
            vars.insert(k.clone(), r.val(v, &storages)?);
        }
        let lost = r.strings("lost")?;
        let failed = m["failed"].as_bool().ok_or_else(|| bad("failed"))?;
        let input =
            std::fs::read(dir.join(INPUT)).map_err(|e| format!("cannot read `{INPUT}`: {e}"))?;
        self.db
            .set_source(SESSION_PATH, Session::session_text(&defs));
        self.defs = defs;
        self.loaded = loaded;
        self.transcript = transcript;
        self.synth_count = synth_count;
        self.synth_names = synth_names;
        self.last_launch = last_launch;
        self.vars = vars;
        self.devices = devices;
        Ok(Restored {
            lost,
            device,
            shell: ShellState { failed, input },
        })
    }
}

fn bad(what: &str) -> String {
    format!("`{MANIFEST}` is corrupt: a bad `{what}`")
}

struct Reader<'a> {
    dir: &'a Path,
    m: &'a Json,
    session: &'a Session,
}

impl Reader<'_> {
    fn str(&self, key: &str) -> Result<&str, String> {
        self.m[key].as_str().ok_or_else(|| bad(key))
    }

    fn strings(&self, key: &str) -> Result<Vec<String>, String> {
        self.m[key]
            .as_array()
            .ok_or_else(|| bad(key))?
            .iter()
            .map(|s| s.as_str().map(String::from).ok_or_else(|| bad(key)))
            .collect()
    }

    fn object<'j>(&self, v: &'j Json, what: &str) -> Result<&'j Map<String, Json>, String> {
        v.as_object().ok_or_else(|| bad(what))
    }

    fn u64(&self, v: &Json, what: &str) -> Result<u64, String> {
        v.as_u64().ok_or_else(|| bad(what))
    }

    fn i64_map(&self, v: &Json, what: &str) -> Result<BTreeMap<String, i64>, String> {
        self.object(v, what)?
            .iter()
            .map(|(k, x)| Ok((k.clone(), x.as_i64().ok_or_else(|| bad(what))?)))
            .collect()
    }

    fn u64_map(&self, v: &Json, what: &str) -> Result<BTreeMap<String, u64>, String> {
        self.object(v, what)?
            .iter()
            .map(|(k, x)| Ok((k.clone(), self.u64(x, what)?)))
            .collect()
    }

    fn spec(&self, v: &Json) -> Result<LaunchSpec, String> {
        let mut consts = Specialization::new();
        consts.values = self.i64_map(&v["values"], "last_launch")?;
        consts.divisors = self.u64_map(&v["divisors"], "last_launch")?;
        consts.floats = self.u64_map(&v["floats"], "last_launch")?;
        // Absent from the states of earlier versions: nothing tuned.
        let tuned = match &v["tuned"] {
            Json::Null => Default::default(),
            t => t
                .as_array()
                .ok_or_else(|| bad("last_launch"))?
                .iter()
                .map(|n| {
                    n.as_str()
                        .map(String::from)
                        .ok_or_else(|| bad("last_launch"))
                })
                .collect::<Result<_, _>>()?,
        };
        let ran_on = match &v["ran_on"] {
            Json::Null => None,
            a => Some(
                a.as_str()
                    .and_then(|a| a.parse().ok())
                    .ok_or_else(|| bad("last_launch"))?,
            ),
        };
        Ok(LaunchSpec {
            consts,
            dims: self.i64_map(&v["dims"], "last_launch")?,
            scalars: self.i64_map(&v["scalars"], "last_launch")?,
            tuned,
            ran_on,
        })
    }

    fn defs(&self) -> Result<Vec<Def>, String> {
        let list = self.m["defs"].as_array().ok_or_else(|| bad("defs"))?;
        list.iter()
            .map(|d| {
                let names = d["names"]
                    .as_array()
                    .ok_or_else(|| bad("defs"))?
                    .iter()
                    .map(|n| n.as_str().map(String::from).ok_or_else(|| bad("defs")))
                    .collect::<Result<Vec<_>, _>>()?;
                let text = d["text"].as_str().ok_or_else(|| bad("defs"))?.to_string();
                let origin = if let Some(at) = d["origin"]["input"].as_u64() {
                    Origin::Input(u32::try_from(at).map_err(|_| bad("defs"))?)
                } else if let Some(p) = d["origin"]["file"].as_str() {
                    Origin::File(PathBuf::from(p))
                } else {
                    return Err(bad("defs"));
                };
                Ok(Def {
                    names,
                    text,
                    origin,
                })
            })
            .collect()
    }

    fn shape(&self, v: &Json) -> Result<Vec<usize>, String> {
        v.as_array()
            .ok_or_else(|| bad("shape"))?
            .iter()
            .map(|d| {
                d.as_u64()
                    .and_then(|d| usize::try_from(d).ok())
                    .ok_or_else(|| bad("shape"))
            })
            .collect()
    }

    fn storages(&self) -> Result<Vec<Tensor>, String> {
        let list = self.m["storages"]
            .as_array()
            .ok_or_else(|| bad("storages"))?;
        list.iter()
            .map(|s| {
                let file = s["file"].as_str().ok_or_else(|| bad("storages"))?;
                if !is_state_file(file) {
                    return Err(bad("storages"));
                }
                let dtype = s["dtype"]
                    .as_str()
                    .and_then(DType::from_name)
                    .ok_or_else(|| bad("storages"))?;
                let shape = self.shape(&s["shape"])?;
                let path = self.dir.join(file);
                let interrupt = &self.session.interrupt;
                let t = if file.ends_with(".npy") {
                    npy::load_npy(&path, interrupt).map_err(|e| e.message)?
                } else {
                    let bytes =
                        std::fs::read(&path).map_err(|e| format!("cannot read `{file}`: {e}"))?;
                    npy::from_raw_bytes(&shape, dtype, &bytes, interrupt)
                        .map_err(|e| format!("`{file}`: {}", e.message))?
                };
                if t.dtype() != dtype || t.shape() != shape.as_slice() {
                    return Err(format!(
                        "`{file}` holds a {}{:?}, the manifest says {dtype}{shape:?}",
                        t.dtype(),
                        t.shape()
                    ));
                }
                Ok(t)
            })
            .collect()
    }

    fn value(&self, v: &Json, storages: &[Tensor]) -> Result<Value, String> {
        if v.as_str() == Some("None") {
            return Ok(Value::None);
        }
        let err = || bad("vars");
        Ok(if let Some(i) = v.get("tensor") {
            let t = i
                .as_u64()
                .and_then(|i| storages.get(usize::try_from(i).ok()?))
                .ok_or_else(err)?;
            let shape = self.shape(&v["shape"])?;
            Value::Tensor(t.view(&shape).ok_or_else(err)?)
        } else if let Some(i) = v.get("int") {
            Value::Int(i.as_i64().ok_or_else(err)?)
        } else if let Some(f) = v.get("float") {
            Value::Float(f64::from_bits(self.u64(f, "vars")?))
        } else if let Some(b) = v.get("bool") {
            Value::Bool(b.as_bool().ok_or_else(err)?)
        } else if let Some(items) = v.get("tuple") {
            Value::Tuple(
                items
                    .as_array()
                    .ok_or_else(err)?
                    .iter()
                    .map(|i| self.value(i, storages))
                    .collect::<Result<_, _>>()?,
            )
        } else {
            return Err(err());
        })
    }

    fn val(&self, v: &Json, storages: &[Tensor]) -> Result<Val, String> {
        if let Some(s) = v.get("str") {
            return Ok(Val::Str(s.as_str().ok_or_else(|| bad("vars"))?.to_string()));
        }
        if let Some(d) = v.get("dtype") {
            let d = d.as_str().and_then(DType::from_name);
            return Ok(Val::DType(d.ok_or_else(|| bad("vars"))?));
        }
        if let Some(items) = v.get("list") {
            let items = items.as_array().ok_or_else(|| bad("vars"))?;
            return Ok(Val::List(
                items
                    .iter()
                    .map(|i| self.val(i, storages))
                    .collect::<Result<_, _>>()?,
            ));
        }
        if let Some(d) = v.get("dist") {
            return self.dist(d, storages);
        }
        self.value(v, storages).map(Val::Run)
    }

    /// A distributed tensor's parts, saved as host tensors (the GPUs' copies
    /// are gone with the process; the parts go back to their devices at
    /// their next use).
    fn dist(&self, d: &Json, storages: &[Tensor]) -> Result<Val, String> {
        use tessera::exec::dist::{DistTensor, Part, Placement, ReduceOp};
        let err = || bad("vars");
        let kind = match d["kind"].as_str() {
            Some("cpu") => "cpu",
            Some("cuda") => "cuda",
            _ => return Err(err()),
        };
        let placement = match d["placement"].as_str() {
            Some("sharded") => Placement::Sharded {
                axis: d["arg"].as_u64().ok_or_else(err)? as usize,
            },
            Some("replicated") => Placement::Replicated,
            Some("partial") => Placement::Partial(
                d["arg"]
                    .as_str()
                    .and_then(ReduceOp::parse)
                    .ok_or_else(err)?,
            ),
            _ => return Err(err()),
        };
        let dtype = d["dtype"]
            .as_str()
            .and_then(DType::from_name)
            .ok_or_else(err)?;
        let shape = self.shape(&d["shape"])?;
        let mut parts = Vec::new();
        for p in d["parts"].as_array().ok_or_else(err)? {
            let device = p["device"].as_u64().ok_or_else(err)? as usize;
            let Value::Tensor(tensor) = self.value(&p["tensor"], storages)? else {
                return Err(err());
            };
            parts.push(Part { device, tensor });
        }
        if parts.is_empty() {
            return Err(err());
        }
        Ok(Val::Dist(
            DistTensor::from_parts(shape, dtype, placement, parts),
            kind,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::session::tests::run;

    fn ok(s: &mut Session, input: &str) -> String {
        let (ok, out, err) = run(s, input);
        assert!(ok, "{input}: {err}");
        out
    }

    /// A tensor of `dtype` from raw bytes (NaN payloads and all).
    fn raw(dtype: DType, shape: &[usize], bytes: &[u8]) -> Val {
        let t = npy::from_raw_bytes(shape, dtype, bytes, &tessera::exec::Interrupt::new()).unwrap();
        Val::Run(Value::Tensor(t))
    }

    /// Every dtype, with bit patterns `.npy` through f32 would not keep
    /// (NaN payloads, negative zero, f8 NaN).
    fn every_dtype(s: &mut Session) {
        let cases: [(&str, DType, Vec<u8>); 13] = [
            (
                "f64",
                DType::F64,
                [f64::from_bits(0x7ff0_0000_dead_beef), -0.0, 1.5]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ),
            (
                "f32",
                DType::F32,
                [f32::from_bits(0x7fc1_2345), -0.0, f32::INFINITY]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ),
            ("f16", DType::F16, vec![0x01, 0x7e, 0x00, 0x80, 0x00, 0x3c]),
            (
                "bf16",
                DType::BF16,
                vec![0x81, 0x7f, 0x00, 0x80, 0x80, 0x3f],
            ),
            ("f8e4m3", DType::F8E4M3, vec![0x7f, 0xff, 0x80]),
            ("f8e5m2", DType::F8E5M2, vec![0x7d, 0xfe, 0x3c]),
            (
                "i64",
                DType::I64,
                [i64::MIN, -1, 7]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ),
            (
                "i32",
                DType::I32,
                [i32::MIN, -1, 7]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ),
            (
                "i16",
                DType::I16,
                [i16::MIN, -1, 7]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ),
            ("i8", DType::I8, vec![0x80, 0xff, 7]),
            (
                "u32",
                DType::U32,
                [u32::MAX, 0, 7]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect(),
            ),
            ("u8", DType::U8, vec![255, 0, 7]),
            ("bool", DType::Bool, vec![1, 0, 1]),
        ];
        for (name, dtype, bytes) in cases {
            s.vars.insert(format!("t_{name}"), raw(dtype, &[3], &bytes));
        }
        // Rank 0 and no elements, in both file formats.
        let scalar = (-2.5f32).to_le_bytes();
        s.vars.insert("rank0".into(), raw(DType::F32, &[], &scalar));
        s.vars.insert("empty".into(), raw(DType::I16, &[2, 0], &[]));
        s.vars
            .insert("empty_bf16".into(), raw(DType::BF16, &[0], &[]));
    }

    /// `a` and `b` hold the same values: tensors bit for bit, with the same
    /// dtype and shape.
    fn same_val(a: &Val, b: &Val) -> bool {
        fn same(a: &Value, b: &Value) -> bool {
            match (a, b) {
                (Value::Tensor(x), Value::Tensor(y)) => {
                    x.dtype() == y.dtype()
                        && x.shape() == y.shape()
                        && npy::raw_bytes(x) == npy::raw_bytes(y)
                }
                (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
                (Value::Tuple(x), Value::Tuple(y)) => {
                    x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
                }
                _ => format!("{a:?}") == format!("{b:?}"),
            }
        }
        match (a, b) {
            (Val::Run(x), Val::Run(y)) => same(x, y),
            (Val::List(x), Val::List(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_val(x, y))
            }
            (Val::Dist(x, kx), Val::Dist(y, ky)) => {
                kx == ky
                    && x.placement() == y.placement()
                    && x.shape() == y.shape()
                    && x.devices() == y.devices()
                    && x.parts().iter().zip(y.parts()).all(|(p, q)| {
                        same(
                            &Value::Tensor(p.tensor.clone()),
                            &Value::Tensor(q.tensor.clone()),
                        )
                    })
            }
            _ => format!("{a:?}") == format!("{b:?}"),
        }
    }

    fn tensor<'a>(s: &'a Session, name: &str) -> &'a Tensor {
        match &s.vars[name] {
            Val::Run(Value::Tensor(t)) => t,
            v => panic!("{name} is {v:?}"),
        }
    }

    /// A session with definitions typed and loaded, every kind of value,
    /// synthetic functions and a kernel's last launch.
    fn busy_session(dir: &Path) -> Session {
        let mut s = Session::new("<repl>", false);
        let lib = dir.join("lib.tsr");
        std::fs::write(
            &lib,
            "def triple(x: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return x * 3.0\n",
        )
        .unwrap();
        ok(&mut s, "import std.nn as nn\n");
        ok(&mut s, "const K = 4\n");
        ok(
            &mut s,
            "@kernel(grid=(cdiv(N, BLOCK),))\ndef scale(x: Tensor[\"N\", f32], out: Tensor[\"N\", f32], BLOCK: const = 4):\n    i = program_id(0) * BLOCK\n    store(out[i : i + BLOCK], load(x[i : i + BLOCK]) * 2.0)\n\n",
        );
        ok(
            &mut s,
            "def twice_plus(x: Tensor[\"N\", f32], y: Tensor[\"N\", f32]) -> Tensor[\"N\", f32]:\n    return x * 2.0 + y\n\n",
        );
        let (mut out, mut err) = (Vec::new(), Vec::new());
        s.load(&lib, &mut out, &mut err).unwrap();
        ok(
            &mut s,
            "a = arange(0, 10, f32)\nb = zeros([10], f32)\nscale(a, b)\n",
        );
        ok(
            &mut s,
            "c = twice_plus(a, b)\nd = nn.softmax(reshape(a, [2, 5]))\n",
        );
        ok(&mut s, "alias = a\nview = reshape(a, [5, 2])\n");
        ok(&mut s, "n = 3\nf = 2.5\nyes = True\nnothing = None\npair = (1, 2.0)\nshape = b.shape\nkind = b.dtype\nname = \"tessera\"\n");
        every_dtype(&mut s);
        // Distributed values over three virtual devices: sharded (ragged),
        // partial and replicated.
        s.set_device_count(3, tessera::syntax::span::Span::new(0, 0))
            .unwrap();
        ok(
            &mut s,
            "xs = shard(reshape(arange(0, 20, f32), [5, 4]), axis=0)
cols = sum(xs, axis=0)
whole = broadcast(ones([4], f32))
",
        );
        s.vars.insert(
            "nan".into(),
            Val::Run(Value::Float(f64::from_bits(0x7ff8_0000_0000_0042))),
        );
        s.vars.insert(
            "mixed".into(),
            Val::List(vec![
                Val::Str("x".into()),
                Val::Run(Value::Tuple(vec![
                    Value::Int(1),
                    Value::None,
                    Value::Tensor(tensor(&s, "b").clone()),
                ])),
            ]),
        );
        s
    }

    #[test]
    fn a_saved_session_is_restored_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let mut s = busy_session(dir.path());
        assert!(s.synth_count > 0 && !s.last_launch.is_empty());
        let shell = ShellState {
            failed: true,
            input: b"print(n)\n:type a\n".to_vec(),
        };
        s.save_state(&state, Device::Cuda, &["gone".to_string()], &shell)
            .unwrap();
        let mut r = Session::new("<repl>", false);
        let restored = r.restore_state(&state).unwrap();
        assert_eq!(
            restored,
            Restored {
                lost: vec!["gone".to_string()],
                device: Device::Cuda,
                shell,
            }
        );
        assert_eq!(r.names(), s.names());
        assert_eq!(format!("{:?}", r.defs), format!("{:?}", s.defs));
        assert_eq!(r.loaded, s.loaded);
        assert_eq!(r.transcript, s.transcript);
        assert_eq!(
            (r.synth_count, &r.synth_names),
            (s.synth_count, &s.synth_names)
        );
        assert_eq!(r.last_launch, s.last_launch);
        assert_eq!(r.devices, 3);
        assert_eq!(r.vars.len(), s.vars.len());
        for (name, v) in &s.vars {
            assert!(
                same_val(v, &r.vars[name]),
                "{name}: {v:?} vs {:?}",
                r.vars[name]
            );
        }
        // Aliases stay aliases (a write through one shows in the others),
        // and only they.
        let shares = |s: &Session| {
            let t: Vec<&Tensor> = s
                .vars
                .values()
                .filter_map(|v| match v {
                    Val::Run(Value::Tensor(t)) => Some(t),
                    _ => None,
                })
                .collect();
            let mut pairs = Vec::new();
            for i in 0..t.len() {
                for j in i + 1..t.len() {
                    pairs.push(t[i].same_storage(t[j]));
                }
            }
            pairs
        };
        assert_eq!(shares(&r), shares(&s));
        assert!(tensor(&s, "a").same_storage(tensor(&s, "alias")));
        // Later statements give the same output, and diagnostics the same lines.
        for input in [
            "a[0] = 5.0\nprint(alias[0], view[0, 0])",
            "twice_plus(triple(a), c)",
            "scale(c, b)\nb",
            "nn.softmax(reshape(a, [2, 5]))[1]",
            ":emit ptx scale",
            "print(gather(all_reduce(cols) + whole), gather(xs * 2.0))",
            "print(n + K, f, yes, nothing, pair, shape, kind, name)",
            "undefined_name + 1",
        ] {
            let run_both = |s: &mut Session| {
                let (mut out, mut err) = (Vec::new(), Vec::new());
                let (_, ok) = crate::shell::execute(s, input, &mut out, &mut err);
                (
                    ok,
                    String::from_utf8(out).unwrap(),
                    String::from_utf8(err).unwrap(),
                )
            };
            let want = run_both(&mut s);
            assert_eq!(run_both(&mut r), want, "{input}");
        }
        // The synthetic function of an expression seen before keeps its name.
        assert_eq!(r.synth_count, s.synth_count);
    }

    #[test]
    fn a_missing_or_corrupt_state_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let s = busy_session(dir.path());
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let restore = || {
            let mut r = Session::new("<repl>", false);
            let e = r.restore_state(&state).unwrap_err();
            assert!(r.names().is_empty() && r.transcript.is_empty(), "{e}");
            e
        };
        assert!(restore().contains("`session.json` is missing"));
        s.save_state(&state, Device::Cpu, &[], &ShellState::default())
            .unwrap();
        let manifest = std::fs::read_to_string(state.join(MANIFEST)).unwrap();
        std::fs::write(state.join(MANIFEST), &manifest[..manifest.len() / 2]).unwrap();
        assert!(restore().contains("`session.json` is corrupt"));
        std::fs::write(state.join(MANIFEST), manifest.replace(FORMAT, "other")).unwrap();
        assert!(restore().contains("not a state this tessera writes"));
        std::fs::write(state.join(MANIFEST), &manifest).unwrap();
        let t0 = std::fs::read(state.join("t0.npy")).unwrap();
        std::fs::remove_file(state.join("t0.npy")).unwrap();
        assert!(restore().contains("t0.npy"));
        std::fs::write(state.join("t0.npy"), t0).unwrap();
        let bin = std::fs::read_dir(&state)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "bin"))
            .unwrap();
        std::fs::write(&bin, [1u8]).unwrap();
        let name = bin.file_name().unwrap().to_string_lossy().into_owned();
        assert!(restore().contains(&name));
        std::fs::write(
            state.join(MANIFEST),
            manifest.replace("\"synth_count\":", "\"synth_count\":-"),
        )
        .unwrap();
        assert!(restore().contains("bad `synth_count`"));
        let far = manifest.replacen("\"input\":", "\"input\":9999999", 1);
        assert_ne!(far, manifest);
        std::fs::write(state.join(MANIFEST), far).unwrap();
        assert!(restore().contains("bad `defs`"));
    }

    #[test]
    fn only_state_files_are_state_files() {
        for name in [
            "session.json",
            "session.json.tmp",
            "input",
            "t0.npy",
            "t12.bin",
        ] {
            assert!(is_state_file(name), "{name}");
        }
        for name in [
            "t.npy",
            "tx.bin",
            "../t0.npy",
            "t0.npy.bak",
            "notes.txt",
            "/etc/passwd",
        ] {
            assert!(!is_state_file(name), "{name}");
        }
    }
}
