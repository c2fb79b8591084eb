//! Kernel queries: the Tile IR of a kernel item under a specialization, its
//! Target IR for the selected arch, the PTX or HIP module of a file's kernels, and
//! their resources (registers, shared memory, occupancy) estimated from Target IR.

use std::sync::Arc;

use super::*;
use crate::backend::resources::{self, Resources};

/// The Tile IR of one kernel item under a specialization (const parameter
/// values and specialised dims; see `ir::tile::Specialization`). The kernel is
/// checked first: its error diagnostics (item-relative spans) are returned
/// instead of lowering. Lowering errors (E0511, E0512) are item-relative too.
/// An item that is not a kernel gives an empty error list.
#[salsa::tracked(returns(ref))]
pub fn tile_ir<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
    spec: crate::ir::tile::Specialization,
) -> Result<Arc<crate::ir::tile::Kernel>, Vec<Diagnostic>> {
    let parsed = parse_item(db, item);
    let Some(ast::Item::Function(f)) = parsed.item.as_deref() else {
        return Err(Vec::new());
    };
    if !f.is_kernel() {
        return Err(Vec::new());
    }
    let errors: Vec<Diagnostic> = parsed
        .diagnostics
        .iter()
        .chain(check_item(db, item, options).diagnostics.iter())
        .filter(|d| d.is_error())
        .cloned()
        .collect();
    if !errors.is_empty() {
        return Err(errors);
    }
    // The target picks an `@autotune` space's default configuration: the
    // launch's (a GPU's) where the specialization names one, else the
    // session's.
    let arch = spec.arch.unwrap_or_else(|| options.arch(db));
    let for_arch = crate::ir::tile::Specialization {
        arch: Some(arch),
        ..spec
    };
    let k = crate::ir::tile::lower_kernel(f, module_scope(db, item.file(db)), &for_arch)?;
    crate::ir::tile::check_tile_sizes(&k, arch)?;
    Ok(Arc::new(k))
}

/// The Tile IR a launch with `dims` runs: `tile_ir` under `spec`, or, where
/// a tile shape needs dims that `spec` leaves to run time (`flash_attn`'s
/// `D`), under `spec` with those of `dims` fixed (found by lowering once).
/// Memoised per launch shape, so a relaunch neither lowers nor checks again.
#[salsa::tracked(returns(ref))]
pub fn launch_tile_ir<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
    spec: crate::ir::tile::Specialization,
    dims: std::collections::BTreeMap<String, i64>,
) -> Result<Arc<crate::ir::tile::Kernel>, Vec<Diagnostic>> {
    if let Ok(k) = tile_ir(db, item, options, spec.clone()) {
        return Ok(k.clone());
    }
    let parsed = parse_item(db, item);
    let Some(ast::Item::Function(f)) = parsed.item.as_deref() else {
        return Err(Vec::new());
    };
    // The launch's arch where it names one (a GPU's), else the session's.
    let for_arch = crate::ir::tile::Specialization {
        arch: Some(spec.arch.unwrap_or_else(|| options.arch(db))),
        ..spec.clone()
    };
    let k = crate::ir::tile::lower_kernel_with_dims(
        f,
        module_scope(db, item.file(db)),
        &for_arch,
        &dims,
    )?;
    // The kernel's values with the launch's options and arch, which are not
    // among them (an autotune configuration's `num_stages`).
    let full = crate::ir::tile::Specialization {
        trusted: spec.trusted,
        arch: spec.arch,
        ..crate::ir::tile::Specialization::of_launch(&k, &spec)
    };
    tile_ir(db, item, options, full).clone()
}

/// The lowering diagnostics (E0511, E0512) of every kernel of `file` under
/// `spec`, with absolute spans, in source order. Empty when the file has
/// check errors: those are what `file_diagnostics` reports.
pub fn tile_ir_diagnostics(
    db: &dyn Db,
    file: SourceFile,
    options: Options,
    spec: &crate::ir::tile::Specialization,
) -> Vec<Diagnostic> {
    if file_diagnostics(db, file, options)
        .iter()
        .any(|d| d.is_error())
    {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (_, item, offset) in file_kernels(db, file) {
        if let Err(diags) = tile_ir(db, item, options, spec.clone()) {
            out.extend(diags.iter().cloned().map(|d| d.shifted(offset)));
        }
    }
    out
}

/// The kernel items of a file in source order, with their names and offsets.
pub fn file_kernels<'db>(db: &'db dyn Db, file: SourceFile) -> Vec<(String, ItemSource<'db>, u32)> {
    file_items(db, file)
        .items
        .iter()
        .filter_map(
            |(source, offset)| match parse_item(db, *source).item.as_deref() {
                Some(ast::Item::Function(f)) if f.is_kernel() => {
                    Some((f.name.name.clone(), *source, *offset))
                }
                _ => None,
            },
        )
        .collect()
}

/// The kernel items named `name` as a launch from `file` finds them:
/// `file`'s own, else those of the first standard-library module that has
/// one (`exec::launch`'s rule); empty when there is none.
pub fn kernels_named<'db>(
    db: &'db dyn Db,
    file: SourceFile,
    name: &str,
) -> Vec<(String, ItemSource<'db>, u32)> {
    let named = |f: SourceFile| -> Vec<(String, ItemSource<'db>, u32)> {
        file_kernels(db, f)
            .into_iter()
            .filter(|k| k.0 == name)
            .collect()
    };
    let own = named(file);
    if !own.is_empty() {
        return own;
    }
    for m in crate::stdlib::modules() {
        let path: Vec<String> = m.split('.').map(str::to_string).collect();
        if let Some(f) = db.resolve_module(file, &path) {
            let found = named(f);
            if !found.is_empty() {
                return found;
            }
        }
    }
    Vec::new()
}

/// The Target IR of one kernel item for `options`' arch: its Tile IR (see
/// `tile_ir`; its diagnostics are returned as they are) lowered by
/// `ir::target::lower` and verified. A construct the code generator cannot
/// lower yet is E0512 with the span of the Tile IR op (item-relative); a
/// kernel over `ir::target::MAX_KERNEL_INSTS` instructions is E0119.
#[salsa::tracked(returns(ref))]
pub fn target_ir<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
    spec: crate::ir::tile::Specialization,
) -> Result<Arc<crate::ir::target::Kernel>, Vec<Diagnostic>> {
    let tile = tile_ir(db, item, options, spec).clone()?;
    match crate::ir::target::lower(&tile, options.arch(db)) {
        Ok(k) => {
            debug_assert_eq!(crate::ir::target::verify::verify(&k), Ok(()));
            Ok(Arc::new(k))
        }
        Err(u) => Err(vec![match u.too_large {
            Some(help) => Diagnostic::new("E0119", u.span, u.message).with_help(help),
            None => Diagnostic::new("E0512", u.span, u.message).with_help(
                "`tessera run` runs it on the CPU; only its code generation for the GPU is missing",
            ),
        }]),
    }
}

/// One PTX module holding `kernels` (items with their file offsets, as
/// `file_kernels` gives them) for `options`' arch, or every diagnostic of
/// every kernel that failed (absolute spans).
pub fn ptx_module<'db>(
    db: &'db dyn Db,
    kernels: &[(String, ItemSource<'db>, u32)],
    options: Options,
    spec: &crate::ir::tile::Specialization,
) -> Result<String, Vec<Diagnostic>> {
    module_of_kernels(
        kernels,
        |item| kernel_ptx(db, item, options, spec.clone()),
        // Refused only for an AMD arch and no kernels (each kernel would
        // have said E0615): nothing to point at.
        |printed| crate::backend::ptx::module_of(options.arch(db), printed).map_err(|_| ()),
    )
}

/// One module of `kernels`: each kernel's text from `kernel` (cached per
/// kernel), joined by `module`; or every diagnostic of every kernel that
/// failed, shifted to the file's offsets.
fn module_of_kernels<'a, 'db: 'a>(
    kernels: &[(String, ItemSource<'db>, u32)],
    kernel: impl Fn(ItemSource<'db>) -> &'a Result<String, Vec<Diagnostic>>,
    module: impl FnOnce(&[&str]) -> Result<String, ()>,
) -> Result<String, Vec<Diagnostic>> {
    let mut printed = Vec::new();
    let mut diags = Vec::new();
    for (_, item, offset) in kernels {
        match kernel(*item) {
            Ok(text) => printed.push(text.as_str()),
            Err(d) => diags.extend(d.iter().cloned().map(|d| d.shifted(*offset))),
        }
    }
    if diags.is_empty() {
        module(&printed).map_err(|()| Vec::new())
    } else {
        Err(diags)
    }
}

/// The PTX `.entry` of one kernel item (see `target_ir`; its diagnostics are
/// returned as they are, item-relative). Cached per kernel, so an edit to one
/// kernel of a file reprints only that kernel.
#[salsa::tracked(returns(ref))]
pub fn kernel_ptx<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
    spec: crate::ir::tile::Specialization,
) -> Result<String, Vec<Diagnostic>> {
    let target = target_ir(db, item, options, spec).clone()?;
    crate::backend::ptx::kernel_text(&target).map_err(|e| {
        vec![
            Diagnostic::new("E0615", kernel_name_span(db, item), e.to_string()).with_help(format!(
                "emit HIP for {}, or pick an NVIDIA `--arch` for PTX",
                e.0
            )),
        ]
    })
}

/// One HIP translation unit holding `kernels` (items with their file
/// offsets, as `file_kernels` gives them) for `options`' arch, or every
/// diagnostic of every kernel that failed (absolute spans).
pub fn hip_module<'db>(
    db: &'db dyn Db,
    kernels: &[(String, ItemSource<'db>, u32)],
    options: Options,
    spec: &crate::ir::tile::Specialization,
) -> Result<String, Vec<Diagnostic>> {
    module_of_kernels(
        kernels,
        |item| kernel_hip(db, item, options, spec.clone()),
        // Refused only for an NVIDIA arch and no kernels (each kernel would
        // have said E0615): nothing to point at.
        |printed| crate::backend::hip::module_of(options.arch(db), printed).map_err(|_| ()),
    )
}

/// The HIP definition of one kernel item (see `target_ir`; its diagnostics
/// are returned as they are, item-relative): E0615 for an NVIDIA arch, or
/// for an instruction HIP cannot express. Cached per kernel, as `kernel_ptx`.
#[salsa::tracked(returns(ref))]
pub fn kernel_hip<'db>(
    db: &'db dyn Db,
    item: ItemSource<'db>,
    options: Options,
    spec: crate::ir::tile::Specialization,
) -> Result<String, Vec<Diagnostic>> {
    use crate::backend::hip::HipError;
    let target = target_ir(db, item, options, spec).clone()?;
    crate::backend::hip::kernel_text(&target).map_err(|e| {
        let help = match &e {
            HipError::NotAmd(a) => {
                format!(
                    "emit PTX for {a}, or pick an AMD `--arch` (gfx90a, gfx942, gfx1100) for HIP"
                )
            }
            HipError::Inexpressible { .. } => {
                "emit PTX for an NVIDIA arch, or run the kernel on the CPU".to_string()
            }
        };
        vec![Diagnostic::new("E0615", kernel_name_span(db, item), e.to_string()).with_help(help)]
    })
}

/// The HIP translation unit of every kernel of `file` (see `hip_module`).
#[salsa::tracked(returns(ref))]
pub fn hip(
    db: &dyn Db,
    file: SourceFile,
    options: Options,
    spec: crate::ir::tile::Specialization,
) -> Result<String, Vec<Diagnostic>> {
    hip_module(db, &file_kernels(db, file), options, &spec)
}

/// The span of a kernel item's name (item-relative), where a diagnostic about
/// the whole kernel points.
fn kernel_name_span(db: &dyn Db, item: ItemSource<'_>) -> crate::syntax::span::Span {
    match parse_item(db, item).item.as_deref() {
        Some(ast::Item::Function(f)) => f.name.span,
        _ => crate::syntax::span::Span::new(0, 0),
    }
}

/// The PTX module of every kernel of `file` (see `ptx_module`).
#[salsa::tracked(returns(ref))]
pub fn ptx(
    db: &dyn Db,
    file: SourceFile,
    options: Options,
    spec: crate::ir::tile::Specialization,
) -> Result<String, Vec<Diagnostic>> {
    ptx_module(db, &file_kernels(db, file), options, &spec)
}

/// The resources of one kernel item of a file under `spec` on `options`' arch:
/// its Target IR (`target_ir`, over `tile_ir`), then the estimate. `Ok` holds
/// the resources and their diagnostics (W0003, W0004, or the E06xx of a block
/// that cannot run); `Err` the diagnostics that stopped compilation (check or
/// lowering errors, E0512 for what Target IR cannot lower yet). Spans are absolute (`offset` is
/// the item's start in the file).
pub fn kernel_resources(
    db: &dyn Db,
    item: ItemSource<'_>,
    offset: u32,
    options: Options,
    spec: &crate::ir::tile::Specialization,
) -> Result<(Resources, Vec<Diagnostic>), Vec<Diagnostic>> {
    let target = target_ir(db, item, options, spec.clone())
        .as_ref()
        .map_err(|d| {
            d.iter()
                .cloned()
                .map(|d| d.shifted(offset))
                .collect::<Vec<_>>()
        })?;
    let resources = resources::of_target(target);
    let name_span = kernel_name_span(db, item);
    let mut diags = resources.diagnostics_hiding(name_span.shift(offset), target.hides_latency());
    diags.extend(target.notes.iter().map(|n| {
        Diagnostic::new(n.code, n.span.shift(offset), n.message.clone())
            .with_primary_label(n.label)
            .with_help(n.help.clone())
    }));
    Ok((resources, diags))
}

/// [`kernel_resources`] for every kernel of a file: the resources of those that
/// compile, and every diagnostic (absolute spans), in source order. Nothing when
/// the file has check errors (those are `file_diagnostics`).
pub fn file_resources(
    db: &dyn Db,
    file: SourceFile,
    options: Options,
    spec: &crate::ir::tile::Specialization,
) -> (Vec<Resources>, Vec<Diagnostic>) {
    let mut rows = Vec::new();
    let mut diags = Vec::new();
    if file_diagnostics(db, file, options)
        .iter()
        .any(|d| d.is_error())
    {
        return (rows, diags);
    }
    for (_, item, offset) in file_kernels(db, file) {
        match kernel_resources(db, item, offset, options, spec) {
            Ok((r, d)) => {
                rows.push(r);
                diags.extend(d);
            }
            Err(d) => diags.extend(d),
        }
    }
    (rows, diags)
}
