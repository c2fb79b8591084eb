//! Subscripts: tensor slices (the accesses a load or store takes), gathers
//! through index tiles (as ranges where they are affine `arange`s), indexing
//! constant lists, and placing index values on their axes.

use super::values::tile_type;
use super::{Lowerer, LV, R};
use crate::check::dims::Dim as SymDim;
use crate::check::{DType, Value as CValue};
use crate::diag::Diagnostic;
use crate::ir::tile::{Access, BinaryOp, Builder, Constant, Dim, OpKind, ParamKind, Type, Value};
use crate::syntax::ast::{BinOp, Expr, ExprKind, Index};
use crate::syntax::span::Span;

impl<'a> Lowerer<'a> {
    pub(super) fn subscript(&mut self, v: LV, indices: &[Index], span: Span) -> R<LV> {
        match v {
            LV::Tensor(t) => self.tensor_slice(t, indices, span),
            LV::List(items) => {
                let [Index::Expr(ie)] = indices else {
                    self.internal(span, "a list takes one constant index");
                    return Err(());
                };
                let iv = self.expr(ie)?;
                let i = self.const_int(&iv, ie.span, "the index")?;
                let j = if i < 0 { i + items.len() as i64 } else { i };
                match usize::try_from(j).ok().and_then(|j| items.get(j)) {
                    Some(x) => Ok(x.clone()),
                    None => {
                        self.internal(ie.span, format!("index {i} is out of range"));
                        Err(())
                    }
                }
            }
            LV::Val { v: x, weak, .. } => {
                // Tiles take compile-time indices and slices, `:` and `None`.
                let t = self.b.ty(x).clone();
                let mut cur = x;
                let mut shape = t.shape().to_vec();
                let mut axis = 0;
                for idx in indices {
                    if axis >= shape.len()
                        && !matches!(
                            idx,
                            Index::Expr(Expr {
                                kind: ExprKind::None,
                                ..
                            })
                        )
                    {
                        self.internal(idx.span(), "too many indices for the tile");
                        return Err(());
                    }
                    match idx {
                        Index::Expr(Expr {
                            kind: ExprKind::None,
                            ..
                        }) => {
                            shape.insert(axis, 1);
                            cur = self.b.push1(
                                OpKind::ExpandDims { x: cur, axis },
                                tile_type(shape.clone(), t.dtype()),
                            );
                            axis += 1;
                        }
                        Index::Slice {
                            start: None,
                            end: None,
                            step: None,
                            ..
                        } => axis += 1,
                        Index::Expr(e) => {
                            let n = shape[axis] as i64;
                            let iv = self.expr(e)?;
                            let i = self.const_int(&iv, e.span, "a tile index")?;
                            let j = if i < 0 { i + n } else { i };
                            if !(0..n).contains(&j) {
                                self.diags.push(Diagnostic::new(
                                    "E0413",
                                    e.span,
                                    format!("index {i} is out of range for axis {axis} of the tile (size {n})"),
                                ).with_help(format!("index a tile of size {n} with 0 to {}, or -{n} to -1", n - 1)));
                                return Err(());
                            }
                            shape.remove(axis);
                            cur = self.b.push1(
                                OpKind::Extract {
                                    x: cur,
                                    axis,
                                    start: j as u32,
                                    len: 1,
                                    drop: true,
                                },
                                tile_type(shape.clone(), t.dtype()),
                            );
                        }
                        Index::Slice {
                            start: a,
                            end: b,
                            step: None,
                            span: sp,
                        } => {
                            let n = shape[axis] as i64;
                            // Python's bounds: negative counts from the end, clamped.
                            let bound = |this: &mut Self, e: &Option<Expr>, dflt: i64| -> R<i64> {
                                let Some(e) = e else { return Ok(dflt) };
                                let lv = this.expr(e)?;
                                let c = this.const_int(&lv, e.span, "a tile slice bound")?;
                                Ok(if c < 0 { (c + n).max(0) } else { c.min(n) })
                            };
                            let lo = bound(self, a, 0)?;
                            let hi = bound(self, b, n)?;
                            if hi <= lo {
                                self.diags.push(
                                    Diagnostic::new(
                                        "E0405",
                                        *sp,
                                        format!("this slice of a tile of size {n} is empty ({lo} : {hi})"),
                                    )
                                    .with_help("slices of tiles must keep at least one element"),
                                );
                                return Err(());
                            }
                            if (lo, hi) != (0, n) {
                                shape[axis] = (hi - lo) as u32;
                                cur = self.b.push1(
                                    OpKind::Extract {
                                        x: cur,
                                        axis,
                                        start: lo as u32,
                                        len: (hi - lo) as u32,
                                        drop: false,
                                    },
                                    tile_type(shape.clone(), t.dtype()),
                                );
                            }
                            axis += 1;
                        }
                        other => {
                            self.unsupported(other.span(), "a slice of a tile with a step");
                            return Err(());
                        }
                    }
                }
                Ok(self.val(cur, weak))
            }
            other => {
                self.internal(span, format!("subscript of a {}", other.describe()));
                Err(())
            }
        }
    }

    /// The tensor slice `load`, `store` or `atomic_add` takes (`what`): `T[slices]`,
    /// or a bare tensor `T`, which is the whole of it (`T[:, ..., :]`).
    pub(super) fn tensor_ref(&mut self, e: &Expr, what: &str) -> R<(usize, Vec<Access>, Vec<u32>)> {
        let lv = match self.expr(e)? {
            LV::Tensor(t) => self.tensor_slice(t, &[], e.span)?,
            lv => lv,
        };
        match lv {
            LV::Ref {
                tensor,
                access,
                shape,
            } => Ok((tensor, access, shape)),
            _ => {
                self.internal(e.span, format!("`{what}` takes a tensor slice"));
                Err(())
            }
        }
    }

    fn tensor_slice(&mut self, t: usize, indices: &[Index], span: Span) -> R<LV> {
        let ParamKind::Tensor { dims, .. } = self.params[t].kind.clone() else {
            self.internal(span, "subscript of a scalar parameter");
            return Err(());
        };
        if indices.len() > dims.len() {
            self.internal(span, "too many indices");
            return Err(());
        }
        let mut access = Vec::new();
        let mut shape = Vec::new();
        // The axes indexed by a tile, with the (not yet normalised) index tile.
        let mut gathers: Vec<(usize, Value)> = Vec::new();
        let zero = LV::Const {
            c: CValue::int(0),
            dtype: DType::I32,
            weak: true,
        };
        for (axis, d) in dims.iter().enumerate() {
            let idx = indices.get(axis);
            // `written`: the axis has a `:` in the source (else the subscript
            // leaves it out, or the tensor is taken whole).
            let full_len = |this: &mut Self, sp: Span, written: bool| -> R<u32> {
                match d {
                    Dim::Static(n) => Ok(*n as u32),
                    Dim::Dynamic(name) => {
                        let name = name.clone();
                        match SymDim::parse(&name) {
                            Ok(d) => this
                                .missing_dims
                                .extend(d.symbols().into_iter().map(String::from)),
                            Err(_) => this.missing_dims.push(name.clone()),
                        }
                        this.diags.push(
                            Diagnostic::new(
                                "E0511",
                                sp,
                                format!(
                                    "{} the tensor dim `{name}` needs its size at compile time: kernel `{}` must be specialised on `{name}`",
                                    if written { "`:` over" } else { "all of" },
                                    this.f.name.name
                                ),
                            )
                            .with_help(format!("give it a value when compiling, e.g. `-D {name}=128`")),
                        );
                        Err(())
                    }
                }
            };
            match idx {
                None => {
                    let n = full_len(self, span, false)?;
                    let s = self.const_of(&CValue::int(0), DType::I32, span)?;
                    access.push(Access::Range { start: s, len: n });
                    shape.push(n);
                }
                Some(Index::Expr(e)) => {
                    let v = self.expr(e)?;
                    let (idt, _, s) = self.info(&v, e.span)?;
                    if !idt.is_int() {
                        self.internal(e.span, format!("an index of type {idt}"));
                        return Err(());
                    }
                    if !s.is_empty() {
                        // An index tile: its dims join the slice's shape.
                        let LV::Val { v, .. } = v else {
                            self.internal(e.span, "an index tile that is not a value");
                            return Err(());
                        };
                        gathers.push((access.len(), v));
                        access.push(Access::Gather(v));
                        shape.extend(s);
                        continue;
                    }
                    // A negative constant index counts from the end (Python).
                    let v = match (&v, self.sym_of(&v).and_then(|d| d.as_const())) {
                        (LV::Const { .. }, Some(i)) if i < 0 => match d {
                            Dim::Static(n) => LV::Const {
                                c: CValue::int(*n as i64 + i),
                                dtype: DType::I32,
                                weak: true,
                            },
                            Dim::Dynamic(_) => {
                                let n = LV::Val {
                                    v: self.tensor_dim(t, axis),
                                    weak: false,
                                    sym: None,
                                };
                                self.binary(BinOp::Add, n, v.clone(), e.span, e, e)?
                            }
                        },
                        _ => v,
                    };
                    let iv = self.index_value(&v, e.span)?;
                    access.push(Access::Point(iv));
                }
                Some(Index::Slice {
                    start,
                    end,
                    step,
                    span: sp,
                }) => {
                    if step.is_some() {
                        self.internal(*sp, "a slice with a step");
                        return Err(());
                    }
                    let a = match start {
                        Some(e) => (self.expr(e)?, e.span),
                        None => (zero.clone(), *sp),
                    };
                    let len = match end {
                        None => {
                            let n = full_len(self, *sp, true)? as i64;
                            match self.sym_of(&a.0).and_then(|s| s.as_const()) {
                                Some(s0) => n - s0,
                                None => {
                                    self.internal(*sp, "a slice `a:` with a run-time start");
                                    return Err(());
                                }
                            }
                        }
                        Some(e) => {
                            let b = self.expr(e)?;
                            let diff = match (self.sym_of(&a.0), self.sym_of(&b)) {
                                (Some(x), Some(y)) => y.checked_sub(&x),
                                _ => None,
                            };
                            match diff {
                                Some(dd) => match dd.as_const() {
                                    Some(n) => n,
                                    None => {
                                        let lv = LV::Val {
                                            v: Value(0),
                                            weak: false,
                                            sym: Some(dd),
                                        };
                                        self.needs_const(*sp, &lv, "the length of this slice");
                                        return Err(());
                                    }
                                },
                                None => {
                                    self.internal(*sp, "a slice length that is not known");
                                    return Err(());
                                }
                            }
                        }
                    };
                    if len <= 0 || len > u32::MAX as i64 {
                        self.internal(*sp, format!("a slice of length {len}"));
                        return Err(());
                    }
                    let s = self.index_value(&a.0, a.1)?;
                    access.push(Access::Range {
                        start: s,
                        len: len as u32,
                    });
                    shape.push(len as u32);
                }
            }
        }
        if !gathers.is_empty() {
            access = self.gather_access(access, &shape, span)?;
        }
        Ok(LV::Ref {
            tensor: t,
            access,
            shape,
        })
    }

    /// An access with index tiles (each `Access::Gather` holding the source
    /// index tile, its dims in place in `shape`) in the form Tile IR takes:
    /// 1-D tiles that are `arange(s, s + n) + x` become the range `s + x : +n`
    /// (contiguous, vectorisable); otherwise every axis becomes a gather of
    /// the whole shape (`i32`, indices past `i32` clamped to stay out of bounds).
    fn gather_access(&mut self, access: Vec<Access>, shape: &[u32], span: Span) -> R<Vec<Access>> {
        let mut ranges = Vec::new();
        for a in &access {
            if let Access::Gather(v) = a {
                let t = self.b.ty(*v).clone();
                match self.affine_start(*v) {
                    Some(start) if t.shape().len() == 1 => ranges.push(Access::Range {
                        start,
                        len: t.shape()[0],
                    }),
                    _ => break,
                }
            }
        }
        if ranges.len()
            == access
                .iter()
                .filter(|a| matches!(a, Access::Gather(_)))
                .count()
        {
            let mut ranges = ranges.into_iter();
            return Ok(access
                .into_iter()
                .map(|a| match a {
                    Access::Gather(_) => ranges.next().expect("one range per gather"),
                    a => a,
                })
                .collect());
        }
        let mut out = Vec::with_capacity(access.len());
        let mut pos = 0;
        for a in access {
            let (v, at) = match a {
                Access::Point(v) => (v, pos),
                Access::Range { start, len } => {
                    let start = self.index_i32(start);
                    let ar = self.b.push1(
                        OpKind::Arange { start, len },
                        tile_type(vec![len], DType::I32),
                    );
                    pos += 1;
                    (ar, pos - 1)
                }
                Access::Gather(v) => {
                    let r = self.b.ty(v).shape().len();
                    pos += r;
                    (v, pos - r)
                }
            };
            let v = self.index_i32(v);
            let g = self.place_axes(v, at, shape, span)?;
            out.push(Access::Gather(g));
        }
        Ok(out)
    }

    /// `v` as `arange(s, s + n) + x` (`x` scalars, added or subtracted, all
    /// `i32`): the scalar `s + x`, emitted; `None` for any other tile.
    fn affine_start(&mut self, v: Value) -> Option<Value> {
        if self.b.ty(v).dtype() != DType::I32 {
            return None;
        }
        let scalar_of = |b: &Builder, t: Value| match b.def(t) {
            Some(OpKind::Splat { x, .. }) => Some(*x),
            _ => None,
        };
        let (base, x, op) = match self.b.def(v)?.clone() {
            OpKind::Arange { start, .. } => return Some(start),
            // `arange(0, n) + x`: the start is `x` itself.
            OpKind::Binary {
                op: BinaryOp::Add,
                a,
                b,
            } if self.zero_arange(a) || self.zero_arange(b) => {
                let other = if self.zero_arange(a) { b } else { a };
                return scalar_of(&self.b, other);
            }
            OpKind::Binary {
                op: BinaryOp::Add,
                a,
                b,
            } => match (scalar_of(&self.b, a), scalar_of(&self.b, b)) {
                (_, Some(x)) => (a, x, BinaryOp::Add),
                (Some(x), _) => (b, x, BinaryOp::Add),
                _ => return None,
            },
            OpKind::Binary {
                op: BinaryOp::Sub,
                a,
                b,
            } => (a, scalar_of(&self.b, b)?, BinaryOp::Sub),
            _ => return None,
        };
        let s = self.affine_start(base)?;
        Some(
            self.b
                .push1(OpKind::Binary { op, a: s, b: x }, Type::Scalar(DType::I32)),
        )
    }

    /// Whether `v` is `arange(0, n)`.
    fn zero_arange(&self, v: Value) -> bool {
        match self.b.def(v) {
            Some(OpKind::Arange { start, .. }) => {
                matches!(self.b.def(*start), Some(OpKind::Const(Constant::Int(0))))
            }
            _ => false,
        }
    }

    /// An integer index (scalar or tile) as `i32`. Wider indices are clamped
    /// to the `i32` range first, so one past it stays out of bounds instead
    /// of wrapping into them.
    fn index_i32(&mut self, v: Value) -> Value {
        let t = self.b.ty(v).clone();
        let d = t.dtype();
        if d == DType::I32 {
            return v;
        }
        let mut v = v;
        if matches!(d, DType::I64 | DType::U32) {
            let shape = t.shape().to_vec();
            let bound = |this: &mut Self, op: BinaryOp, x: Value, c: i64| {
                let mut k = this.constant(Constant::Int(c), d);
                if !shape.is_empty() {
                    k = this.b.push1(
                        OpKind::Splat {
                            x: k,
                            shape: shape.clone(),
                        },
                        tile_type(shape.clone(), d),
                    );
                }
                this.b.push1(
                    OpKind::Binary { op, a: x, b: k },
                    tile_type(shape.clone(), d),
                )
            };
            if d == DType::I64 {
                v = bound(self, BinaryOp::Max, v, i32::MIN as i64);
            }
            v = bound(self, BinaryOp::Min, v, i32::MAX as i64);
        }
        self.b.push1(
            OpKind::Cast {
                x: v,
                to: DType::I32,
            },
            tile_type(t.shape().to_vec(), DType::I32),
        )
    }

    /// A tile (or scalar) whose axes are dims `at..` of `shape`, broadcast to
    /// `shape`: `[n]` at 1 of `[a, n, b]` is `[1, n, 1]` repeated.
    fn place_axes(&mut self, v: Value, at: usize, shape: &[u32], span: Span) -> R<Value> {
        let t = self.b.ty(v).clone();
        let d = t.dtype();
        let mut cur = t.shape().to_vec();
        let mut v = v;
        if !cur.is_empty() {
            for _ in 0..at {
                cur.insert(0, 1);
                v = self.b.push1(
                    OpKind::ExpandDims { x: v, axis: 0 },
                    tile_type(cur.clone(), d),
                );
            }
            while cur.len() < shape.len() {
                let axis = cur.len();
                cur.push(1);
                v = self
                    .b
                    .push1(OpKind::ExpandDims { x: v, axis }, tile_type(cur.clone(), d));
            }
        }
        let lv = LV::Val {
            v,
            weak: false,
            sym: None,
        };
        self.coerce(&lv, d, shape, span)
    }

    /// An integer index as an `i32` value (a wider one clamped to the `i32`
    /// range, which stays out of bounds: tensor dims are below 2^31).
    fn index_value(&mut self, lv: &LV, span: Span) -> R<Value> {
        let (d, weak, _) = self.info(lv, span)?;
        let d = if weak || !d.is_int() { DType::I32 } else { d };
        let v = self.materialize(lv, d, span)?;
        Ok(self.index_i32(v))
    }
}
