//! The `tessera/emit` request: any IR level, PTX or HIP of one kernel or function,
//! from the same queries as `tsrc emit`. `Backend::emit` answers it on a
//! snapshot, with the `tessera.defines` setting under the request's own
//! defines; compiler errors come back as LSP diagnostics in the error's data.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera::db::{self, Database, Options, SourceFile};
use tessera::diag::Diagnostic;
use tessera::ir::tile::Specialization;
use tessera::target::Arch;
use tower_lsp::jsonrpc::{self, Error, ErrorCode};
use tower_lsp::lsp_types::{Position, Url};

use crate::diagnostics::self_convert;
use crate::server::{offset_of, Backend, REQUEST_FAILED};

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct EmitParams {
    pub uri: Url,
    /// `graph-ir`, `schedule-ir`, `tile-ir`, `target-ir`, `ptx` or `hip`.
    pub kind: String,
    pub arch: Option<String>,
    pub kernel: Option<String>,
    pub position: Option<Position>,
    #[serde(default)]
    pub defines: BTreeMap<String, i64>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct EmitResult {
    pub text: String,
    pub name: String,
}

/// Why nothing was emitted: a message, and the diagnostics behind it.
#[derive(Debug)]
pub enum EmitFailure {
    /// Bad parameters (unknown kind, no such kernel).
    Invalid(String),
    /// A valid request for output the arch does not have (PTX of an AMD arch,
    /// HIP of an NVIDIA one).
    Unsupported(String),
    /// The compiler's diagnostics (absolute spans in the file).
    Diagnostics(String, Vec<Diagnostic>),
}

pub const KINDS: [&str; 6] = [
    "graph-ir",
    "schedule-ir",
    "tile-ir",
    "target-ir",
    "ptx",
    "hip",
];

/// Emits `kind` for the kernel/function `name` or, without one, the one whose
/// item covers `offset`.
pub fn emit(
    db: &Database,
    options: Options,
    file: SourceFile,
    params: &EmitParams,
    offset: Option<u32>,
) -> Result<EmitResult, EmitFailure> {
    let kind = params.kind.as_str();
    if !KINDS.contains(&kind) {
        return Err(EmitFailure::Invalid(format!(
            "unknown kind `{kind}` (one of: {})",
            KINDS.join(", ")
        )));
    }
    let arch = options.arch(db);
    if kind == "ptx" && !arch.is_nvidia() {
        return Err(EmitFailure::Unsupported(format!(
            "PTX needs an NVIDIA target (sm_70 ... sm_90a), not {arch}: AMD targets have HIP (kind \"hip\")"
        )));
    }
    if kind == "hip" && arch.is_nvidia() {
        return Err(EmitFailure::Unsupported(format!(
            "HIP needs an AMD target (gfx90a, gfx942, gfx1100), not {arch}: NVIDIA targets have PTX (kind \"ptx\")"
        )));
    }
    let whole_tensor = matches!(kind, "graph-ir" | "schedule-ir");
    let name = match (&params.kernel, offset) {
        (Some(n), _) => n.clone(),
        (None, Some(off)) => match tessera::ide::enclosing_function(db, file, off) {
            Some((n, _)) => n,
            None => {
                return Err(EmitFailure::Invalid(
                    "the position is not inside a kernel or function".into(),
                ))
            }
        },
        (None, None) => return Err(EmitFailure::Invalid("give `kernel` or `position`".into())),
    };
    let errors: Vec<Diagnostic> = db::file_diagnostics(db, file, options)
        .iter()
        .filter(|d| d.is_error())
        .cloned()
        .collect();
    if !errors.is_empty() {
        return Err(failure(db, file, errors));
    }
    let shift = |d: &[Diagnostic], off: u32| {
        d.iter()
            .cloned()
            .map(|d| d.shifted(off))
            .collect::<Vec<_>>()
    };
    if whole_tensor {
        let functions = db::file_functions(db, file);
        let Some((_, item, offset)) = functions.into_iter().find(|f| f.0 == name) else {
            let is_kernel = db::file_kernels(db, file).iter().any(|k| k.0 == name);
            return Err(EmitFailure::Invalid(if is_kernel {
                format!("`{name}` is a kernel: Graph and Schedule IR exist for whole-tensor functions (use tile-ir)")
            } else {
                format!("no whole-tensor function `{name}` in this file")
            }));
        };
        let text = if kind == "graph-ir" {
            db::graph_ir(db, item, options)
                .as_ref()
                .map(|g| tessera::ir::graph::dump(g))
        } else {
            db::schedule_ir(db, item, options)
                .as_ref()
                .map(|s| tessera::ir::schedule::dump(s))
        };
        return text
            .map(|text| EmitResult {
                text,
                name: name.clone(),
            })
            .map_err(|e| failure(db, file, vec![e.clone().shifted(offset).diagnostic()]));
    }
    let kernels = db::file_kernels(db, file);
    let Some(kernel) = kernels.iter().find(|k| k.0 == name).cloned() else {
        let is_function = db::file_functions(db, file).iter().any(|f| f.0 == name);
        return Err(EmitFailure::Invalid(if is_function {
            format!("`{name}` is a whole-tensor function: use graph-ir or schedule-ir")
        } else {
            format!("no kernel `{name}` in this file")
        }));
    };
    let mut spec = Specialization::new();
    spec.values
        .extend(params.defines.iter().map(|(k, v)| (k.clone(), *v)));
    let (_, item, offset) = kernel.clone();
    let text = match kind {
        "tile-ir" => db::tile_ir(db, item, options, spec)
            .as_ref()
            .map(|k| k.dump())
            .map_err(|d| shift(d, offset)),
        "target-ir" => db::target_ir(db, item, options, spec)
            .as_ref()
            .map(|k| k.to_string())
            .map_err(|d| shift(d, offset)),
        "hip" => db::hip_module(db, &[kernel], options, &spec),
        _ => db::ptx_module(db, &[kernel], options, &spec),
    };
    text.map(|text| EmitResult { text, name })
        .map_err(|d| failure(db, file, d))
}

fn failure(db: &Database, file: SourceFile, diags: Vec<Diagnostic>) -> EmitFailure {
    let text = file.text(db);
    let ix = crate::position::LineIndex::new(text);
    let first = diags
        .first()
        .map(|d| {
            let p = ix.position(d.span.start);
            format!(
                "error[{}] at {}:{}: {}",
                d.code,
                p.line + 1,
                p.character + 1,
                d.message
            )
        })
        .unwrap_or_else(|| "nothing emitted".into());
    let more = if diags.len() > 1 {
        format!(" (and {} more)", diags.len() - 1)
    } else {
        String::new()
    };
    EmitFailure::Diagnostics(format!("{first}{more}"), diags)
}

impl Backend {
    /// `tessera/emit`: the handler, over [`emit`].
    pub async fn emit(&self, params: EmitParams) -> jsonrpc::Result<EmitResult> {
        let arch = match &params.arch {
            Some(a) => Some(a.parse::<Arch>().map_err(|_| {
                Error::invalid_params(format!(
                    "unknown arch `{a}` (one of: {})",
                    Arch::ALL.map(|a| a.name()).join(", ")
                ))
            })?),
            None => None,
        };
        self.on_snapshot("tessera/emit", arch, move |s| {
            let Some(file) = s.file(&params.uri) else {
                return Err(Error::invalid_params(format!(
                    "`{}` is not open or in the workspace",
                    params.uri
                )));
            };
            let offset = params.position.map(|p| offset_of(s, file, p));
            // The request's own defines name something of the kernel, as
            // `tsrc emit -D` checks them (the setting's may be for others).
            if matches!(params.kind.as_str(), "tile-ir" | "target-ir" | "ptx")
                && !params.defines.is_empty()
            {
                let mut kernels = tessera::db::file_kernels(&s.db, file);
                if let Some(k) = &params.kernel {
                    kernels.retain(|x| &x.0 == k);
                }
                let own: Vec<tessera::cli::Define> = params
                    .defines
                    .iter()
                    .map(|(n, v)| tessera::cli::Define::Value(n.clone(), *v))
                    .collect();
                if !kernels.is_empty() {
                    tessera::cli::specialization(&s.db, &kernels, &own)
                        .map_err(Error::invalid_params)?;
                }
            }
            // The setting's defines, under the request's own: a request
            // without any is specialised as every estimate is.
            let mut params = params;
            let mut defines = s.spec.values.clone();
            defines.append(&mut params.defines);
            params.defines = defines;
            match emit(&s.db, s.options, file, &params, offset) {
                Ok(r) => Ok(r),
                Err(EmitFailure::Invalid(m)) => Err(Error::invalid_params(m)),
                Err(EmitFailure::Unsupported(m)) => Err(Error {
                    code: ErrorCode::ServerError(REQUEST_FAILED),
                    message: m.into(),
                    data: None,
                }),
                Err(EmitFailure::Diagnostics(m, diags)) => Err(Error {
                    code: ErrorCode::ServerError(REQUEST_FAILED),
                    message: m.into(),
                    data: Some(
                        serde_json::to_value(self_convert(s, &params.uri, file, &diags))
                            .unwrap_or_default(),
                    ),
                }),
            }
        })
        .await
    }
}
