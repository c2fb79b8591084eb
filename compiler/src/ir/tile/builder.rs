//! A small helper to build Tile IR: allocates values with their types and
//! collects ops into (nested) regions. Used by lowering, generated kernels and tests.

use super::*;

#[derive(Default)]
pub struct Builder {
    /// The type of every value allocated so far.
    pub types: Vec<Type>,
    /// The ops of each open region, innermost last.
    stack: Vec<Vec<Op>>,
    /// The span given to new ops.
    pub span: Span,
}

impl Builder {
    pub fn new() -> Self {
        Builder {
            types: Vec::new(),
            stack: vec![Vec::new()],
            span: Span::default(),
        }
    }

    /// A fresh value of type `ty` (define it as an op result or region argument).
    pub fn value(&mut self, ty: Type) -> Value {
        self.types.push(ty);
        Value(self.types.len() as u32 - 1)
    }

    pub fn ty(&self, v: Value) -> &Type {
        &self.types[v.0 as usize]
    }

    /// The op defining `v`, if it is in a region still open (so `v` is visible).
    pub fn def(&self, v: Value) -> Option<&OpKind> {
        self.stack
            .iter()
            .rev()
            .flat_map(|ops| ops.iter().rev())
            .find(|op| op.results.contains(&v))
            .map(|op| &op.kind)
    }

    /// Appends an op defining fresh values of `results` types to the innermost region.
    pub fn push(&mut self, kind: OpKind, results: Vec<Type>) -> Vec<Value> {
        let results: Vec<Value> = results.into_iter().map(|t| self.value(t)).collect();
        self.push_op(Op {
            results: results.clone(),
            kind,
            span: self.span,
        });
        results
    }

    /// Appends an op with one result.
    pub fn push1(&mut self, kind: OpKind, ty: Type) -> Value {
        self.push(kind, vec![ty])[0]
    }

    /// Appends a ready-made op.
    pub fn push_op(&mut self, op: Op) {
        self.stack.last_mut().expect("an open region").push(op);
    }

    /// Opens a nested region; ops pushed until `end` go into it.
    pub fn begin(&mut self) {
        self.stack.push(Vec::new());
    }

    /// Reopens a closed region's ops as the innermost region (to append to it).
    pub fn resume(&mut self, ops: Vec<Op>) {
        self.stack.push(ops);
    }

    /// Inserts an op at `index` of the kernel body (for hoisted definitions).
    pub fn insert_entry(&mut self, index: usize, op: Op) {
        self.stack[0].insert(index, op);
    }

    /// Closes the innermost nested region.
    pub fn end(&mut self, args: Vec<Value>) -> Region {
        assert!(self.stack.len() > 1, "end() without begin()");
        let ops = self.stack.pop().expect("an open region");
        Region { args, ops }
    }

    /// The kernel body and the value types.
    pub fn finish(mut self) -> (Region, Vec<Type>) {
        assert_eq!(self.stack.len(), 1, "unclosed regions");
        let ops = self.stack.pop().expect("the body");
        (
            Region {
                args: Vec::new(),
                ops,
            },
            self.types,
        )
    }
}
