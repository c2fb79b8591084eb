//! Names, types, shapes and const evaluation (PLACEHOLDER until the checker lands).

use std::sync::Arc;

use crate::backend::arch::Arch;
use crate::diag::Diagnostic;
use crate::syntax::ast;

/// The names a module defines or imports. No absolute spans (see `db`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModuleScope {}

/// The result of checking one item: diagnostics with item-relative spans.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ItemCheck {
    pub diagnostics: Vec<Diagnostic>,
}

pub fn build_module_scope(
    _items: &[Arc<ast::Item>],
    _resolve: &dyn Fn(&[String]) -> Option<ModuleScope>,
) -> ModuleScope {
    ModuleScope::default()
}

pub fn module_diagnostics(
    _items: &[(Arc<ast::Item>, u32)],
    _resolve: &dyn Fn(&[String]) -> Option<ModuleScope>,
) -> Vec<Diagnostic> {
    Vec::new()
}

pub fn check_item(_item: &ast::Item, _scope: &ModuleScope, _arch: Arch) -> ItemCheck {
    ItemCheck::default()
}
