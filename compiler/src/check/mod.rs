//! The type and shape checker.
//!
//! * `scope` — what a module defines and imports ([`ModuleScope`]): signatures
//!   and const values only, no spans, nothing from bodies (so salsa reuses the
//!   other items' checks after an edit inside one body).
//! * `check_item` — checks one item against its module's scope: diagnostics
//!   with item-relative spans, the type of each expression and binding (for
//!   hover), the item's signature, and the module names it uses (for W0002).
//!
//! The walk lives in `expr`, `calls`, `stmt` and `kernel`; `dims` holds symbolic
//! dims, `consts` compile-time folding, `types` dtypes and types, `builtins` the
//! builtin table, `resources` the E06xx limits. Nothing here knows about salsa.

pub mod builtins;
pub mod calls;
pub mod consts;
pub mod ctx;
pub mod dims;
pub mod expr;
pub mod fxhash;
pub mod generics;
pub mod kernel;
pub mod resources;
pub mod scope;
pub mod stmt;
pub mod types;

#[cfg(test)]
mod tests;

use crate::diag::Diagnostic;
use crate::syntax::ast::{self, Item};
use crate::syntax::span::Span;
use crate::target::Arch;

pub use scope::{
    build_module_scope, build_module_scope_with, module_diagnostics, unused_imports, Entry, FnSig,
    ModuleScope, ParamSig, ScopeItem,
};
pub use types::{DType, Ty, Value};

/// The signature of a `def` or kernel, for hover.
#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    pub name: String,
    /// The name's span (item-relative).
    pub span: Span,
    /// `@kernel\ndef gemm(A: Tensor[M, K, f16], ...) -> ...`
    pub rendered: String,
    pub doc: Option<String>,
}

/// The result of checking one item. Spans are relative to the item's text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ItemCheck {
    pub diagnostics: Vec<Diagnostic>,
    /// The type of every non-literal expression and binding, rendered
    /// (`Tile[128, 64, bf16]`, `Tensor[M, N, f32]`), in walk order.
    pub types: Vec<(Span, String)>,
    pub signature: Option<Signature>,
    /// Module-level names the item refers to (sorted), for unused-import warnings.
    pub uses: Vec<String>,
    /// Calls of generic functions: the call's span and what its dtype
    /// variables and batch runs are bound to (`T = bf16, *B = [Z, M]`), for hover.
    pub instances: Vec<(Span, String)>,
}

impl ItemCheck {
    /// The innermost recorded type at an item-relative offset.
    pub fn type_at(&self, offset: u32) -> Option<&str> {
        self.types
            .iter()
            .filter(|(s, _)| s.contains(offset))
            .min_by_key(|(s, _)| s.len())
            .map(|(_, t)| t.as_str())
    }
}

/// A close match for `name` among `candidates` ("did you mean").
pub fn suggest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .filter(|c| *c != name)
        .map(|c| (strsim::damerau_levenshtein(name, c), c))
        .filter(|(d, c)| *d <= limit || (c.eq_ignore_ascii_case(name)))
        .min_by_key(|(d, c)| (*d, c.len(), *c))
        .map(|(_, c)| c)
}

impl ctx::Checker<'_> {
    pub fn into_check(self, f: Option<&ast::Function>) -> ItemCheck {
        let signature = f.map(|f| {
            let scope = self.scope;
            let rendered = match scope.get(&f.name.name) {
                Some(Entry::Function(sig)) if sig.params.len() == f.params.len() => {
                    sig.rendered.clone()
                }
                _ => scope::signature(f, &|n| scope.const_value(n)).rendered,
            };
            Signature {
                name: f.name.name.clone(),
                span: f.name.span,
                rendered,
                doc: f.docstring.clone(),
            }
        });
        let mut diagnostics = self.diags;
        diagnostics.sort_by_key(|d| (d.span.start, d.span.end));
        ItemCheck {
            diagnostics,
            types: self.types,
            instances: self.instances,
            signature,
            uses: self.uses.into_iter().collect(),
        }
    }
}

/// Checks one item against its module's scope.
pub fn check_item(item: &Item, scope: &ModuleScope, arch: Arch) -> ItemCheck {
    match item {
        Item::Function(f) => kernel::check_function(f, scope, arch),
        Item::Const(c) => {
            let mut ch = ctx::Checker::new(scope, arch);
            ch.top_level = true;
            let v = ch.expr(&c.value);
            if !v.ty.is_err() && ch.diags.is_empty() && !ch.is_compile_time(&v.value) {
                ch.report(
                    Diagnostic::new("E0310", c.value.span, format!("the value of `const {}` is not a compile-time constant", c.name.name))
                        .with_help("constants are built from literals, other constants, arithmetic, `cdiv`, `min` and `max`"),
                );
            }
            if let Some(t) = &c.ty {
                let mut ann = Vec::new();
                let a = scope::annotation(t, &|n| scope.const_value(n), &mut ann);
                ch.diags.extend(ann);
                if let (
                    scope::Annot::Ty(Ty::Scalar { dtype, .. }),
                    Ty::Scalar { dtype: vd, weak },
                ) = (&a, &v.ty)
                {
                    let ok = if *weak {
                        !vd.is_float() || dtype.is_float()
                    } else {
                        vd.widens_to(*dtype)
                    };
                    if !ok {
                        ch.report(
                            Diagnostic::new(
                                "E0301",
                                c.value.span,
                                format!("`{}` does not fit `{dtype}`", v.ty),
                            )
                            .with_label(t.span, "declared here")
                            .with_help(format!(
                                "write a value that `{dtype}` holds, or change the declared dtype"
                            )),
                        );
                    }
                }
            }
            ch.record(c.name.span, &v.ty);
            ch.into_check(None)
        }
        Item::Stmt(s) => {
            let mut ch = ctx::Checker::new(scope, arch);
            ch.top_level = true;
            ch.block(std::slice::from_ref(s));
            ch.into_check(None)
        }
        Item::Import(_) | Item::FromImport(_) => ItemCheck::default(),
    }
}
