//! The checker's state while walking one item: local bindings, symbols, and
//! what it reports (diagnostics, expression types, module names used).

use std::collections::BTreeSet;

use super::fxhash::{FxHashMap, FxHashSet};

use super::dims::{display_symbol, Dim};
use super::resources::Usage;
use super::scope::ModuleScope;
use super::types::{Ty, Value};
use crate::diag::Diagnostic;
use crate::syntax::span::Span;
use crate::target::Arch;

/// A checked expression: its type and, where known, its (possibly symbolic) value.
#[derive(Clone, Debug, PartialEq)]
pub struct Val {
    pub ty: Ty,
    pub value: Option<Value>,
}

impl Val {
    pub fn err() -> Val {
        Val {
            ty: Ty::Err,
            value: None,
        }
    }

    pub fn of(ty: Ty) -> Val {
        Val { ty, value: None }
    }

    pub fn with(ty: Ty, value: Option<Value>) -> Val {
        Val { ty, value }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindKind {
    Local,
    LoopVar,
    Param,
    ConstParam,
    /// A dim name of a tensor parameter, in scope as an `i32`.
    Dim,
}

#[derive(Clone, Debug)]
pub struct Binding {
    pub ty: Ty,
    pub value: Option<Value>,
    pub kind: BindKind,
    /// Where the name was (last) bound.
    pub span: Span,
    /// Bound on some paths only (one branch of an `if`, inside a loop).
    pub maybe_unbound: bool,
}

/// What the body of a loop being checked changed.
#[derive(Debug, Default)]
pub struct LoopFrame {
    /// See `Checker::loop_stamp`.
    pub stamp: u64,
    /// Names bound when the loop started that the body changed, with their
    /// bindings then.
    pub changed: FxHashMap<String, Binding>,
    /// Names bound since the loop started that the body changed outside its
    /// inner loops (those mark their own), repeats allowed.
    pub new_names: Vec<String>,
}

/// Facts about the kernel being checked.
#[derive(Clone, Debug, Default)]
pub struct KernelInfo {
    pub num_warps: Option<u64>,
    pub num_stages: Option<u64>,
    pub grid_rank: Option<usize>,
}

pub struct Checker<'a> {
    pub scope: &'a ModuleScope,
    pub arch: Arch,
    pub in_kernel: bool,
    /// Checking top-level statements (script variables are module globals).
    pub top_level: bool,
    pub kernel: KernelInfo,
    pub env: FxHashMap<String, Binding>,
    /// Old bindings of names changed inside an `if` branch, newest last, so a
    /// branch is undone and merged in time proportional to what it changed
    /// rather than to the whole environment.
    pub env_undo: Vec<(String, Option<Binding>)>,
    /// How many `if` branches are being checked (the undo log records only
    /// inside one).
    pub env_branches: usize,
    /// The loops being checked, innermost last: what each body changed, so a
    /// loop's end costs what it changed rather than a copy of the environment.
    pub loops: Vec<LoopFrame>,
    /// Per name, the `loop_stamp` when it was last bound where it was unbound:
    /// a name with a smaller stamp than a loop's was bound before the loop.
    /// Names bound without `env_insert` (parameters) have none: bound before.
    pub born: FxHashMap<String, u64>,
    /// Counts loops entered (a loop's stamp).
    pub loop_stamp: u64,
    /// Per loop body (by address) about to be checked: the names its body
    /// assigns that may be bound when the loop starts (see `loop_candidates`).
    pub loop_names: FxHashMap<*const super::super::syntax::ast::Stmt, Vec<String>>,
    /// Symbols standing for run-time values (loop variables, `program_id`
    /// results, scalar parameters); every other symbol is compile-time known
    /// (const parameters, tensor dims the kernel is specialised on).
    pub runtime_syms: FxHashSet<String>,
    /// Per name, the next `name#N` suffix `fresh_runtime` tries.
    pub fresh_next: FxHashMap<String, u32>,
    pub reads: FxHashSet<String>,
    /// Locals in order of first binding, for W0001.
    pub local_defs: Vec<(String, Span)>,
    pub uses: BTreeSet<String>,
    pub diags: Vec<Diagnostic>,
    pub types: Vec<(Span, String)>,
    /// See `ItemCheck::instances`.
    pub instances: Vec<(Span, String)>,
    /// The declared return type of the function being checked.
    pub ret: Option<(Ty, Span)>,
    pub fn_name: String,
    /// Every name the function body assigns (Python scoping: local throughout).
    pub fn_locals: FxHashSet<String>,
    pub loop_depth: u32,
    pub usage: Usage,
    /// When set, every checked expression's span and value, in walk order
    /// (for lowering to Graph IR, which reuses the checker's typing).
    pub expr_vals: Option<Vec<(Span, Val)>>,
    /// `reshape` shapes may hold one `-1`.
    pub allow_infer_dim: bool,
    /// What the dtype variables and batch runs of a generic function stand for.
    pub tenv: super::generics::TypeEnv,
    /// The next expression checked is a call's callee, where a function or
    /// builtin is expected (anywhere else one is E0316).
    pub callee: bool,
}

impl<'a> Checker<'a> {
    pub fn new(scope: &'a ModuleScope, arch: Arch) -> Self {
        Checker {
            scope,
            arch,
            in_kernel: false,
            callee: false,
            top_level: false,
            kernel: KernelInfo::default(),
            env: FxHashMap::default(),
            env_undo: Vec::new(),
            env_branches: 0,
            loops: Vec::new(),
            born: FxHashMap::default(),
            loop_stamp: 0,
            loop_names: FxHashMap::default(),
            runtime_syms: FxHashSet::default(),
            fresh_next: FxHashMap::default(),
            reads: FxHashSet::default(),
            local_defs: Vec::new(),
            uses: BTreeSet::new(),
            diags: Vec::new(),
            instances: Vec::new(),
            types: Vec::new(),
            ret: None,
            fn_name: String::new(),
            fn_locals: FxHashSet::default(),
            loop_depth: 0,
            usage: Usage::default(),
            expr_vals: None,
            allow_infer_dim: false,
            tenv: Default::default(),
        }
    }

    pub fn report(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    pub fn record(&mut self, span: Span, ty: &Ty) {
        if !ty.is_err() {
            self.types.push((span, ty.to_string()));
        }
    }

    /// A fresh run-time symbol for a value bound to `name`.
    pub fn fresh_runtime(&mut self, name: &str) -> Dim {
        let taken = self.runtime_syms.contains(name)
            || matches!(
                self.env.get(name).map(|b| b.kind),
                Some(BindKind::Dim | BindKind::ConstParam)
            );
        if !taken {
            self.runtime_syms.insert(name.to_string());
            return Dim::symbol(name.to_string());
        }
        // `name#2`, `name#3`, ... are taken in order (only this function adds
        // run-time symbols), so the search resumes after the last one handed
        // out instead of rescanning them all: a name assigned n times costs n.
        let mut n = self.fresh_next.get(name).copied().unwrap_or(2);
        let mut sym = format!("{name}#{n}");
        while self.runtime_syms.contains(&sym) {
            n += 1;
            sym = format!("{name}#{n}");
        }
        self.fresh_next.insert(name.to_string(), n + 1);
        self.runtime_syms.insert(sym.clone());
        Dim::symbol(sym)
    }

    /// The first run-time symbol in `d` (display form), if any.
    pub fn runtime_symbol(&self, d: &Dim) -> Option<String> {
        d.symbols()
            .into_iter()
            .find(|s| self.runtime_syms.contains(*s))
            .map(|s| display_symbol(s).to_string())
    }

    /// Whether a value is known at compile time.
    pub fn is_compile_time(&self, v: &Option<Value>) -> bool {
        match v {
            None => false,
            Some(Value::Int(d)) => self.runtime_symbol(d).is_none(),
            Some(Value::Tuple(items)) => {
                items.iter().all(|i| self.is_compile_time(&Some(i.clone())))
            }
            Some(_) => true,
        }
    }

    /// Binds a local variable.
    pub fn bind_local(&mut self, name: &str, mut val: Val, span: Span) {
        if let Ty::Scalar { dtype, .. } = &val.ty {
            if dtype.is_int() && !matches!(val.value, Some(Value::Int(_))) {
                val.value = Some(Value::Int(self.fresh_runtime(name)));
            }
        }
        self.record(span, &val.ty);
        if !self.env.contains_key(name) && !self.top_level && !val.ty.is_err() {
            self.local_defs.push((name.to_string(), span));
        }
        let kind = match self.env.get(name) {
            Some(b) if b.kind == BindKind::LoopVar => BindKind::LoopVar,
            _ => BindKind::Local,
        };
        self.env_insert(
            name.to_string(),
            Binding {
                ty: val.ty,
                value: val.value,
                kind,
                span,
                maybe_unbound: false,
            },
        );
    }

    /// Binds `name`, logging the old binding inside an `if` branch.
    pub fn env_insert(&mut self, name: String, b: Binding) {
        let old = self.env.insert(name.clone(), b);
        self.note_loop_change(&name, old.as_ref());
        if self.env_branches > 0 {
            self.env_undo.push((name, old));
        }
    }

    /// Whether `name` was bound before the loop of `stamp` started (it is
    /// bound now).
    pub fn bound_before(&self, name: &str, stamp: u64) -> bool {
        self.born.get(name).is_none_or(|&s| s < stamp)
    }

    /// Records in the innermost loop's frame that `name` changes; `old` is
    /// its binding until now (`None`: unbound).
    fn note_loop_change(&mut self, name: &str, old: Option<&Binding>) {
        if old.is_none() {
            self.born.insert(name.to_string(), self.loop_stamp);
        }
        let Some(stamp) = self.loops.last().map(|f| f.stamp) else {
            return;
        };
        let before = old.is_some() && self.bound_before(name, stamp);
        let Some(f) = self.loops.last_mut() else {
            return;
        };
        match old {
            Some(old) if before => {
                if !f.changed.contains_key(name) {
                    f.changed.insert(name.to_string(), old.clone());
                }
            }
            _ => f.new_names.push(name.to_string()),
        }
    }

    /// The binding of `name` for changing, its old value logged inside an
    /// `if` branch.
    pub fn env_mut(&mut self, name: &str) -> Option<&mut Binding> {
        if self.env_branches > 0 {
            if let Some(b) = self.env.get(name) {
                self.env_undo.push((name.to_string(), Some(b.clone())));
            }
        }
        if self
            .loops
            .last()
            .is_some_and(|f| !f.changed.contains_key(name))
        {
            if let Some(b) = self.env.get(name).cloned() {
                self.note_loop_change(name, Some(&b));
            }
        }
        self.env.get_mut(name)
    }
}
