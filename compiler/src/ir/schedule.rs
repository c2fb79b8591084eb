//! Schedule IR: the launch plan of one whole-tensor function.
//!
//! Lowered from Graph IR. It holds the buffers (inputs, outputs, temporaries and
//! views, each with symbolic dims and a dtype) and an ordered list of launches;
//! each launch runs one fusion group of graph nodes with a kernel:
//!
//! * a maximal group of elementwise ops (unary, binary with broadcasting, casts,
//!   `where`, activations, `zeros`/`ones`/`full` as sources) whose inner nodes are
//!   used only inside the group becomes ONE generated kernel, built directly as Tile IR: the group's
//!   shape is viewed as `[R, C]` (C the last dim, R the product of the others), one
//!   program computes a `[BR, BC]` tile, and each input is loaded as a full tile, a
//!   row vector (`[C]`, broadcast down), a column (`[R]`, keepdims results, broadcast
//!   across) or a single element; scalars are kernel parameters or constants. Inputs
//!   broadcast along leading axes (`[N, M]` against `[B, H, N, M]`) switch the group
//!   to a kernel indexing every axis (`fused_nd`): any numpy broadcast is covered;
//! * `matmul` → `std.linalg` `gemm` (f16), `gemm_bf16`, `gemm_tf32` (f32 inputs:
//!   the only f32 gemm of the stdlib, so the launch records that it multiplies at
//!   tf32 precision) or `gemm_batched` (f16, batch dims equal, flattened): these write an f32 `C`;
//!   a narrower result dtype is a cast done by the consumer's fused kernel; a
//!   matmul no stdlib gemm covers (bf16/f32 with batch dims, broadcast batch dims)
//!   is a generated gemm (64 x 64 tiles, a K loop of `dot` in f32, batch indices
//!   per program);
//! * `softmax` (last axis, f32) → `std.nn` `softmax_rows` (the row fits 1024) or
//!   `softmax_rows_online`; over another axis or of another float dtype, a
//!   generated kernel (three loops over the axis: max, sum, normalise);
//!   `layer_norm`/`rms_norm` of f32 with f32 weights → `layer_norm_rows`/`rms_norm_rows`
//!   (the row must fit the kernel's BLOCK of 1024: recorded as a requirement when
//!   the row length is symbolic); other dtypes, missing weights or longer rows, a
//!   generated kernel (one program per row looping over it: mean, variance of the
//!   in-bounds lanes, normalise);
//!   `sum`/`max`/`mean` of f32 over the last axis → `std.reduce` `*_rows`; every
//!   other reduction (any axis, all axes, `min`, other dtypes) is a generated
//!   kernel looping over the reduced extent;
//! * `matmul(softmax(matmul(q, transpose(k, -2, -1)) * s, dim=-1), v)` (bf16, rank
//!   4) → `std.attention` `flash_attn` with `scale = s`;
//! * `reshape` is a view (buffers are contiguous row-major), `empty` an allocation;
//! * kernel calls are launched as written, in program order.
//!
//! `transpose` of the last two axes is a generated kernel (32 x 32 tiles, the batch
//! on grid axis 2). Everything else (transposes of other axes, `randn`, recursive
//! calls, integer matmuls) is a [`LowerError`]: not supported yet
//! (E0512 at `tsrc emit`).
//!
//! The dump lists the buffers, the launches in order (kernel, grid, graph nodes,
//! arguments with the view each kernel sees, requirements) and the outputs, then
//! every generated kernel in the Tile IR dump format. `verify` checks buffers,
//! views, write-before-read and arguments, and runs the Tile IR verifier on every
//! generated kernel.

use std::collections::HashMap;
use std::fmt::{self, Write};

use crate::check::dims::Dim;
use crate::check::DType;
use crate::ir::graph::{
    binary_name, render_constant, unary_name, Activation, Fill, GType, Graph, LowerError, NodeId,
    NodeKind, ReduceKind,
};
use crate::ir::tile::{
    self, Access, BinaryOp, Constant, Kernel, Op, OpKind, ParamKind, Region, Type, UnaryOp, Value,
};
use crate::syntax::span::Span;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId(pub u32);

#[derive(Clone, Debug, PartialEq)]
pub enum BufKind {
    /// Tensor parameter `i` of the function.
    Input(usize),
    /// Result `i` of the function.
    Output(usize),
    Temp,
    /// The same memory as another buffer, with other dims (same element count).
    View(BufId),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Buffer {
    pub name: String,
    pub kind: BufKind,
    pub dims: Vec<Dim>,
    pub dtype: DType,
    /// Allocated uninitialised by `empty` (and written, if at all, by kernel calls).
    pub alloc: bool,
}

/// A scalar computed on the host at launch time.
#[derive(Clone, Debug, PartialEq)]
pub enum ScalarExpr {
    Param(String),
    /// A dim or other integer known when the function is specialised.
    Index(Dim),
    Const(Constant),
    Unary(UnaryOp, Box<ScalarExpr>),
    Binary(BinaryOp, Box<ScalarExpr>, Box<ScalarExpr>),
    Cast(Box<ScalarExpr>, DType),
    /// `cdiv(a, k)`.
    CDiv(Box<ScalarExpr>, i64),
}

impl fmt::Display for ScalarExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScalarExpr::Param(p) => f.write_str(p),
            ScalarExpr::Index(d) => write!(f, "{d}"),
            ScalarExpr::Const(c) => f.write_str(&render_constant(c)),
            ScalarExpr::Unary(op, x) => write!(f, "{}({x})", unary_name(*op)),
            ScalarExpr::Binary(op, a, b) => write!(f, "{}({a}, {b})", binary_name(*op)),
            ScalarExpr::Cast(x, d) => write!(f, "{d}({x})"),
            ScalarExpr::CDiv(x, k) => write!(f, "cdiv({x}, {k})"),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum KernelRef {
    /// A kernel of the standard library: module path and name.
    Std {
        module: &'static str,
        name: &'static str,
    },
    /// A user kernel called by name, with its decorator's options.
    User(String),
    /// `Schedule::kernels[i]`.
    Generated(usize),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// A buffer passed with the dims the kernel sees (a view of it).
    Buffer {
        buf: BufId,
        dims: Vec<Dim>,
    },
    Scalar(ScalarExpr),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: KernelRef,
    /// The graph nodes this launch computes.
    pub nodes: Vec<NodeId>,
    /// `None`: the kernel's decorator grid, evaluated with the bound dims.
    pub grid: Option<Vec<ScalarExpr>>,
    /// Arguments by parameter name, in the kernel's parameter order.
    pub args: Vec<(String, Arg)>,
    /// Const parameters set by the launch (others keep their defaults).
    pub consts: Vec<(String, String)>,
    /// Facts the launch relies on that are not proven at compile time (`N <= 1024`).
    pub requires: Vec<String>,
    /// Buffers the launch writes.
    pub writes: Vec<BufId>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub name: String,
    pub buffers: Vec<Buffer>,
    pub launches: Vec<Launch>,
    /// Generated kernels (fusion groups), in Tile IR.
    pub kernels: Vec<Kernel>,
    pub outputs: Vec<BufId>,
}

impl Schedule {
    pub fn buffer(&self, b: BufId) -> &Buffer {
        &self.buffers[b.0 as usize]
    }

    /// The buffer owning the memory of `b` (through views).
    pub fn base(&self, mut b: BufId) -> BufId {
        let mut steps = 0;
        while let BufKind::View(of) = self.buffer(b).kind {
            b = of;
            steps += 1;
            if steps > self.buffers.len() {
                break;
            }
        }
        b
    }
}

type R<T> = Result<T, LowerError>;

/// `cdiv(d, k)`, folded when `d` is a constant.
fn cdiv(d: &Dim, k: i64) -> ScalarExpr {
    match d.as_const() {
        Some(c) => ScalarExpr::Index(Dim::constant((c + k - 1).div_euclid(k))),
        None => ScalarExpr::CDiv(Box::new(ScalarExpr::Index(d.clone())), k),
    }
}

/// How a fused kernel reads one input over its `[R, C]` domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Pattern {
    Full,
    Row,
    Col,
    One,
}

/// Row kernels hold a row in one tile of this many elements (their BLOCK default).
const ROW_BLOCK: i64 = 1024;

struct Lower<'g> {
    g: &'g Graph,
    uses: Vec<u32>,
    consumers: Vec<Vec<NodeId>>,
    buffers: Vec<Buffer>,
    buf_of: HashMap<NodeId, BufId>,
    launches: Vec<Launch>,
    kernels: Vec<Kernel>,
    temps: usize,
    cast_of: HashMap<NodeId, BufId>,
    f32_of: HashMap<NodeId, BufId>,
}

fn product(dims: &[Dim]) -> Option<Dim> {
    dims.iter()
        .try_fold(Dim::constant(1), |acc, d| acc.checked_mul(d))
}

fn is_elementwise(g: &Graph, n: NodeId) -> bool {
    let node = g.node(n);
    node.ty.is_tensor()
        && matches!(
            node.kind,
            NodeKind::Unary { .. }
                | NodeKind::Activation { .. }
                | NodeKind::Binary { .. }
                | NodeKind::Select { .. }
                | NodeKind::Cast { .. }
                | NodeKind::Fill(Fill::Zeros | Fill::Ones | Fill::Full(_))
        )
}

fn constant_of(dtype: DType, c: &Constant) -> Constant {
    let f = match c {
        Constant::Int(i) => *i as f64,
        Constant::Float(x) => *x,
        Constant::Bool(b) => *b as i64 as f64,
    };
    if dtype == DType::Bool {
        Constant::Bool(f != 0.0)
    } else if dtype.is_float() {
        Constant::Float(f)
    } else {
        Constant::Int(f as i64)
    }
}

fn zero_of(dtype: DType) -> Constant {
    constant_of(dtype, &Constant::Int(0))
}

impl<'g> Lower<'g> {
    fn span(&self, n: NodeId) -> Span {
        self.g.node(n).span
    }

    fn unsupported(&self, n: NodeId, what: impl Into<String>) -> LowerError {
        LowerError::new(self.span(n), what)
    }

    fn add_buffer(&mut self, name: String, kind: BufKind, dims: Vec<Dim>, dtype: DType) -> BufId {
        let id = BufId(self.buffers.len() as u32);
        self.buffers.push(Buffer {
            name,
            kind,
            dims,
            dtype,
            alloc: false,
        });
        id
    }

    fn temp(&mut self, dims: Vec<Dim>, dtype: DType) -> BufId {
        let name = format!("t{}", self.temps);
        self.temps += 1;
        self.add_buffer(name, BufKind::Temp, dims, dtype)
    }

    /// A buffer holding a tensor node's value in the node's dtype: a matmul's f32
    /// result for a narrower matmul is cast by a copy kernel (once per node).
    fn buf_as(&mut self, n: NodeId, user: NodeId) -> R<BufId> {
        let b = self.buf(n, user)?;
        let want = self.g.ty(n).dtype();
        if Some(self.buffers[b.0 as usize].dtype) == want {
            return Ok(b);
        }
        if let Some(c) = self.cast_of.get(&n) {
            return Ok(*c);
        }
        let t = self.temp(self.g.ty(n).dims().to_vec(), want.unwrap_or(DType::F32));
        self.fused(
            &Group {
                members: vec![],
                root: n,
                copy: true,
            },
            t,
        )?;
        self.cast_of.insert(n, t);
        Ok(t)
    }

    /// A buffer holding a float node's value as f32: a copy when its dtype is
    /// narrower (one kernel, also when the value sits in an f32 buffer: the copy
    /// rounds it to the node's dtype first, as the program says).
    fn buf_f32(&mut self, n: NodeId, user: NodeId) -> R<BufId> {
        let b = self.buf(n, user)?;
        if self.buffers[b.0 as usize].dtype == DType::F32
            && self.g.ty(n).dtype() == Some(DType::F32)
        {
            return Ok(b);
        }
        if let Some(c) = self.f32_of.get(&n) {
            return Ok(*c);
        }
        let t = self.temp(self.g.ty(n).dims().to_vec(), DType::F32);
        self.fused(
            &Group {
                members: vec![],
                root: n,
                copy: true,
            },
            t,
        )?;
        self.f32_of.insert(n, t);
        Ok(t)
    }

    /// The buffer holding a tensor node's value.
    fn buf(&self, n: NodeId, user: NodeId) -> R<BufId> {
        self.buf_of.get(&n).copied().ok_or_else(|| {
            self.unsupported(user, "an operand that is not materialised in a buffer")
        })
    }

    fn scalar(&self, n: NodeId) -> R<ScalarExpr> {
        let node = self.g.node(n);
        if !node.ty.is_scalar() {
            return Err(self.unsupported(n, "a tensor where a scalar is needed"));
        }
        Ok(match &node.kind {
            NodeKind::Param(p) => ScalarExpr::Param(self.g.params[*p].name.clone()),
            NodeKind::Const(c) => ScalarExpr::Const(*c),
            NodeKind::Index(d) => ScalarExpr::Index(d.clone()),
            NodeKind::Unary { op, x } => {
                ScalarExpr::Unary(*op, Box::new(self.scalar_as(*x, node.ty.dtype())?))
            }
            NodeKind::Binary { op, a, b } => {
                // Operands in one dtype: the result's, or for comparisons the
                // wider of the two.
                let (da, db) = (self.g.ty(*a).dtype(), self.g.ty(*b).dtype());
                let want = if op.is_comparison() {
                    match (da, db) {
                        (Some(x), Some(y)) => DType::join(x, y).or(Some(x)),
                        _ => da,
                    }
                } else {
                    node.ty.dtype()
                };
                ScalarExpr::Binary(
                    *op,
                    Box::new(self.scalar_as(*a, want)?),
                    Box::new(self.scalar_as(*b, want)?),
                )
            }
            NodeKind::Cast { x, to } => ScalarExpr::Cast(Box::new(self.scalar(*x)?), *to),
            _ => return Err(self.unsupported(n, "this scalar operation on the host")),
        })
    }

    /// A host scalar converted to `want` when its own dtype differs, so that
    /// every host operation has operands of one dtype (`rsqrt(f32(D))`).
    fn scalar_as(&self, n: NodeId, want: Option<DType>) -> R<ScalarExpr> {
        let e = self.scalar(n)?;
        Ok(match (want, self.g.ty(n).dtype()) {
            (Some(w), Some(d)) if w != d => match e {
                ScalarExpr::Const(c) => ScalarExpr::Const(constant_of(w, &c)),
                e => ScalarExpr::Cast(Box::new(e), w),
            },
            _ => e,
        })
    }

    /// `[R, C]`: the product of the leading dims and the last dim.
    fn rows_cols(&self, dims: &[Dim], n: NodeId) -> R<(Dim, Dim)> {
        let Some((last, lead)) = dims.split_last() else {
            return Err(self.unsupported(n, "a rank-0 tensor"));
        };
        let r = product(lead).ok_or_else(|| self.unsupported(n, "a dim product that overflows"))?;
        Ok((r, last.clone()))
    }

    fn launch(&mut self, l: Launch) {
        self.launches.push(l);
    }

    /// Matches `matmul(softmax(matmul(q, transpose(k, -2, -1)) * s, dim=-1), v)`:
    /// returns (q, k, v, scale, absorbed nodes).
    fn attention(&self, n: NodeId) -> Option<(NodeId, NodeId, NodeId, ScalarExpr, Vec<NodeId>)> {
        let g = self.g;
        let single = |x: NodeId| self.uses[x.0 as usize] == 1;
        let NodeKind::MatMul { a: sm, b: v } = g.node(n).kind else {
            return None;
        };
        let NodeKind::Softmax { x: scaled, axis } = g.node(sm).kind else {
            return None;
        };
        if axis != 3 || !single(sm) {
            return None;
        }
        let (scores, scale) = match g.node(scaled).kind {
            NodeKind::Binary {
                op: BinaryOp::Mul,
                a,
                b,
            } if g.ty(b).is_scalar() => (a, self.scalar(b).ok()?),
            NodeKind::Binary {
                op: BinaryOp::Mul,
                a,
                b,
            } if g.ty(a).is_scalar() => (b, self.scalar(a).ok()?),
            NodeKind::Binary {
                op: BinaryOp::Div,
                a,
                b,
            } if g.ty(b).is_scalar() => (
                a,
                ScalarExpr::Binary(
                    BinaryOp::Div,
                    Box::new(ScalarExpr::Const(Constant::Float(1.0))),
                    Box::new(self.scalar(b).ok()?),
                ),
            ),
            _ => return None,
        };
        if !single(scaled) || !single(scores) {
            return None;
        }
        let NodeKind::MatMul { a: q, b: kt } = g.node(scores).kind else {
            return None;
        };
        let (NodeKind::Transpose { x: k, a: 2, b: 3 } | NodeKind::Transpose { x: k, a: 3, b: 2 }) =
            g.node(kt).kind
        else {
            return None;
        };
        if !single(kt) {
            return None;
        }
        let qt = g.ty(q);
        let bf16_4d = |t: &GType| t.dtype() == Some(DType::BF16) && t.dims().len() == 4;
        if !bf16_4d(qt) || g.ty(k) != qt || g.ty(v) != qt || g.ty(n) != qt {
            return None;
        }
        if g.ty(scaled).dtype() != Some(DType::BF16) {
            return None;
        }
        Some((q, k, v, scale, vec![kt, scores, scaled, sm]))
    }

    fn arg_buf(&self, buf: BufId, dims: Vec<Dim>) -> Arg {
        Arg::Buffer { buf, dims }
    }

    fn lower_matmul(&mut self, n: NodeId, out: Option<BufId>) -> R<()> {
        let g = self.g;
        let NodeKind::MatMul { a, b } = g.node(n).kind else {
            unreachable!("a matmul")
        };
        let dn = g.ty(n).dims();
        // numpy's 1-D operands: a row `[1, K]` on the left, a column `[K, 1]` on the right.
        let mut da = g.ty(a).dims().to_vec();
        if da.len() == 1 {
            da.insert(0, Dim::constant(1));
        }
        let mut db = g.ty(b).dims().to_vec();
        if db.len() == 1 {
            db.push(Dim::constant(1));
        }
        let (ba, bb) = (self.buf_as(a, n)?, self.buf_as(b, n)?);
        let dt = g.ty(a).dtype().unwrap_or(DType::F32);
        let overflow = || self.unsupported(n, "a dim product that overflows");
        // A right operand without batch dims: the left one's rows are all one `M`
        // (contiguous), so a plain gemm does it.
        let flat = db.len() == 2;
        let m = if flat {
            product(&da[..da.len() - 1]).ok_or_else(overflow)?
        } else {
            da[da.len() - 2].clone()
        };
        let (k, nn) = (da[da.len() - 1].clone(), db[db.len() - 1].clone());
        let c = match out {
            Some(o) if g.ty(n).dtype() == Some(DType::F32) => o,
            _ => self.temp(dn.to_vec(), DType::F32),
        };
        let (name, batched): (&'static str, bool) = match (dt, flat, da.len(), db.len()) {
            (DType::F16, true, _, _) => ("gemm", false),
            (DType::BF16, true, _, _) => ("gemm_bf16", false),
            (DType::F32, true, _, _) => ("gemm_tf32", false),
            (DType::F16, false, ra, rb) if ra == rb && da[..ra - 2] == db[..rb - 2] => {
                ("gemm_batched", true)
            }
            (d, ..) if d.is_float() && g.ty(b).dtype().is_some_and(DType::is_float) => {
                self.matmul_generated(n, &da, &db, ba, bb, c)?;
                self.buf_of.insert(n, c);
                return Ok(());
            }
            _ => {
                return Err(self.unsupported(
                    n,
                    format!(
                        "matmul of {} x {} (tensor cores multiply floats)",
                        g.ty(a),
                        g.ty(b)
                    ),
                ))
            }
        };
        let (bm, bn) = if name == "gemm_tf32" {
            (128, 64)
        } else {
            (128, 128)
        };
        let mut grid = vec![cdiv(&m, bm), cdiv(&nn, bn)];
        let args = if batched {
            let z =
                product(&da[..da.len() - 2]).ok_or_else(|| self.unsupported(n, "batch dims"))?;
            grid.push(ScalarExpr::Index(z.clone()));
            vec![
                (
                    "A".to_string(),
                    self.arg_buf(ba, vec![z.clone(), m.clone(), k.clone()]),
                ),
                (
                    "B".to_string(),
                    self.arg_buf(bb, vec![z.clone(), k, nn.clone()]),
                ),
                ("C".to_string(), self.arg_buf(c, vec![z, m, nn])),
            ]
        } else {
            vec![
                (
                    "A".to_string(),
                    self.arg_buf(ba, vec![m.clone(), k.clone()]),
                ),
                ("B".to_string(), self.arg_buf(bb, vec![k, nn.clone()])),
                ("C".to_string(), self.arg_buf(c, vec![m, nn])),
            ]
        };
        self.launch(Launch {
            kernel: KernelRef::Std {
                module: "std.linalg",
                name,
            },
            nodes: vec![n],
            grid: Some(grid),
            args,
            consts: vec![],
            requires: if name == "gemm_tf32" {
                vec!["f32 inputs multiplied at tf32 precision (tensor cores, sm_80+)".to_string()]
            } else {
                vec![]
            },
            writes: vec![c],
        });
        self.buf_of.insert(n, c);
        Ok(())
    }

    /// A row kernel over the `[R, C]` view of `x`: softmax, norms, reductions.
    fn lower_rows(&mut self, n: NodeId, out: Option<BufId>) -> R<()> {
        let g = self.g;
        let node = g.node(n);
        let x = match node.kind {
            NodeKind::Softmax { x, .. }
            | NodeKind::LayerNorm { x, .. }
            | NodeKind::RmsNorm { x, .. }
            | NodeKind::Reduce { x, .. } => x,
            _ => unreachable!("a row op"),
        };
        let xdims = g.ty(x).dims().to_vec();
        let (r, c) = self.rows_cols(&xdims, n)?;
        if !g.ty(x).dtype().is_some_and(DType::is_float) {
            return Err(self.unsupported(
                n,
                format!("this op on `{}` (its stdlib row kernel is f32)", g.ty(x)),
            ));
        }
        // The row kernels are f32: other float dtypes go through cast copies, and
        // the result stays in an f32 buffer that its users read with a cast.
        let bx = self.buf_f32(x, n)?;
        let fits = c.as_const().map(|c| c <= ROW_BLOCK);
        let mut requires = Vec::new();
        let last = xdims.len() - 1;
        let (module, name, fits_needed): (&'static str, &'static str, bool) = match &node.kind {
            NodeKind::Softmax { axis, .. } if *axis == last => {
                if fits == Some(true) {
                    ("std.nn", "softmax_rows", true)
                } else {
                    ("std.nn", "softmax_rows_online", false)
                }
            }
            NodeKind::LayerNorm { .. } => ("std.nn", "layer_norm_rows", true),
            NodeKind::RmsNorm { .. } => ("std.nn", "rms_norm_rows", true),
            NodeKind::Reduce {
                op, axis: Some(a), ..
            } if *a == last => match op {
                ReduceKind::Sum => ("std.reduce", "sum_rows", false),
                ReduceKind::Max => ("std.reduce", "max_rows", false),
                ReduceKind::Mean => ("std.reduce", "mean_rows", false),
                ReduceKind::Min => {
                    return Err(self
                        .unsupported(n, "`min` over an axis (std.reduce has sum, max and mean)"))
                }
            },
            NodeKind::Softmax { .. } => {
                return Err(self.unsupported(n, "softmax over an axis other than the last"))
            }
            _ => {
                return Err(self.unsupported(
                    n,
                    "a reduction over all axes or over an axis other than the last",
                ))
            }
        };
        if fits_needed && fits != Some(true) {
            if fits == Some(false) {
                return Err(self.unsupported(
                    n,
                    format!("`{name}` holds a row in {ROW_BLOCK} elements; this row has {c}"),
                ));
            }
            requires.push(format!("{c} <= {ROW_BLOCK}"));
        }
        let reduce = matches!(node.kind, NodeKind::Reduce { .. });
        let ob = match out {
            Some(o) => o,
            None => self.temp(node.ty.dims().to_vec(), DType::F32),
        };
        let out_dims = if reduce {
            vec![r.clone()]
        } else {
            vec![r.clone(), c.clone()]
        };
        let mut args = vec![(
            "x".to_string(),
            self.arg_buf(bx, vec![r.clone(), c.clone()]),
        )];
        let vec_arg = |s: &mut Self, w: NodeId| -> R<Arg> {
            if g.ty(w).dims() != [c.clone()] {
                return Err(s.unsupported(w, format!("a weight `{}` that is not `[{c}]`", g.ty(w))));
            }
            let bw = s.buf_f32(w, n)?;
            if s.buffers[bw.0 as usize].dtype != DType::F32 {
                return Err(
                    s.unsupported(w, format!("a weight `{}` that is not `[{c}]` f32", g.ty(w)))
                );
            }
            Ok(s.arg_buf(bw, vec![c.clone()]))
        };
        let eps_arg = |s: &Self, e: Option<NodeId>, default: f64| -> R<Arg> {
            Ok(Arg::Scalar(match e {
                Some(e) => s.scalar(e)?,
                None => ScalarExpr::Const(Constant::Float(default)),
            }))
        };
        let mut tail = Vec::new();
        match node.kind {
            NodeKind::LayerNorm {
                weight, bias, eps, ..
            } => {
                let (Some(w), Some(b)) = (weight, bias) else {
                    return Err(self.unsupported(
                        n,
                        "layer_norm without weight and bias (layer_norm_rows takes both)",
                    ));
                };
                args.push(("weight".into(), vec_arg(self, w)?));
                args.push(("bias".into(), vec_arg(self, b)?));
                tail.push(("eps".to_string(), eps_arg(self, eps, 1e-5)?));
            }
            NodeKind::RmsNorm { weight, eps, .. } => {
                let Some(w) = weight else {
                    return Err(
                        self.unsupported(n, "rms_norm without weight (rms_norm_rows takes one)")
                    );
                };
                args.push(("weight".into(), vec_arg(self, w)?));
                tail.push(("eps".to_string(), eps_arg(self, eps, 1e-6)?));
            }
            _ => {}
        }
        args.push(("out".to_string(), self.arg_buf(ob, out_dims)));
        args.extend(tail);
        self.launch(Launch {
            kernel: KernelRef::Std { module, name },
            nodes: vec![n],
            grid: Some(vec![ScalarExpr::Index(r)]),
            args,
            consts: vec![],
            requires,
            writes: vec![ob],
        });
        self.buf_of.insert(n, ob);
        Ok(())
    }

    fn lower_attention(
        &mut self,
        n: NodeId,
        (q, k, v, scale, absorbed): (NodeId, NodeId, NodeId, ScalarExpr, Vec<NodeId>),
        out: Option<BufId>,
    ) -> R<()> {
        let dims = self.g.ty(n).dims().to_vec();
        let (bq, bk, bv) = (self.buf_as(q, n)?, self.buf_as(k, n)?, self.buf_as(v, n)?);
        let o = match out {
            Some(o) => o,
            None => self.temp(dims.clone(), DType::BF16),
        };
        let bh = dims[0]
            .checked_mul(&dims[1])
            .ok_or_else(|| self.unsupported(n, "batch dims"))?;
        let mut nodes = absorbed;
        nodes.push(n);
        let full = |b| Arg::Buffer {
            buf: b,
            dims: dims.clone(),
        };
        self.launch(Launch {
            kernel: KernelRef::Std {
                module: "std.attention",
                name: "flash_attn",
            },
            nodes,
            grid: Some(vec![cdiv(&dims[2], 128), ScalarExpr::Index(bh)]),
            args: vec![
                ("q".into(), full(bq)),
                ("k".into(), full(bk)),
                ("v".into(), full(bv)),
                ("o".into(), full(o)),
                ("scale".into(), Arg::Scalar(scale)),
            ],
            consts: vec![("causal".into(), "False".into())],
            requires: vec![],
            writes: vec![o],
        });
        self.buf_of.insert(n, o);
        Ok(())
    }
}

/// The body of a generated loop over K: (builder, induction variable, the loaded
/// tile in f32, carried values) -> the values to carry on.
type LoopBody<'a> = dyn FnMut(&mut KernelBuilder, Value, Value, &[Value]) -> Vec<Value> + 'a;

/// Builds one generated kernel in Tile IR.
struct KernelBuilder {
    ops: Vec<Op>,
    types: Vec<Type>,
    params: Vec<tile::Param>,
    span: Span,
}

impl KernelBuilder {
    fn emit(&mut self, kind: OpKind, ty: Type) -> Value {
        let v = Value(self.types.len() as u32);
        self.types.push(ty);
        self.ops.push(Op {
            results: vec![v],
            kind,
            span: self.span,
        });
        v
    }

    fn ty(&self, v: Value) -> &Type {
        &self.types[v.0 as usize]
    }

    /// A value defined by no op (a region argument, or a result pushed by hand).
    fn fresh(&mut self, ty: Type) -> Value {
        let v = Value(self.types.len() as u32);
        self.types.push(ty);
        v
    }

    fn cnst(&mut self, c: Constant, dtype: DType) -> Value {
        self.emit(OpKind::Const(constant_of(dtype, &c)), Type::Scalar(dtype))
    }

    fn tile_ty(shape: &[u32], dtype: DType) -> Type {
        Type::Tile {
            shape: shape.to_vec(),
            dtype,
        }
    }

    fn cast(&mut self, x: Value, to: DType) -> Value {
        let t = self.ty(x).clone();
        if t.dtype() == to {
            return x;
        }
        let ty = match t {
            Type::Scalar(_) => Type::Scalar(to),
            Type::Tile { shape, .. } => Type::Tile { shape, dtype: to },
        };
        self.emit(OpKind::Cast { x, to }, ty)
    }

    fn splat(&mut self, x: Value, shape: &[u32]) -> Value {
        let dt = self.ty(x).dtype();
        self.emit(
            OpKind::Splat {
                x,
                shape: shape.to_vec(),
            },
            Self::tile_ty(shape, dt),
        )
    }

    fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        let t = self.ty(a).clone();
        let ty = if op.is_comparison() {
            Self::tile_ty(t.shape(), DType::Bool)
        } else {
            t
        };
        self.emit(OpKind::Binary { op, a, b }, ty)
    }

    fn unary(&mut self, op: UnaryOp, x: Value) -> Value {
        let t = self.ty(x).clone();
        self.emit(OpKind::Unary { op, x }, t)
    }
}

impl Lower<'_> {
    /// A fused kernel that indexes every axis, for inputs broadcast along leading
    /// axes (`[N, M]` or `[B, 1, N]` against `[B, H, N, M]`). The group's shape is
    /// `[D0, .., R, C]`; program `(p, q)` computes the `[BR, BC]` tile at rows
    /// `(p % cdiv(R, BR)) * BR`, columns `q * BC` of the batch `p / cdiv(R, BR)`,
    /// which is split into one index per leading axis. An input broadcast along
    /// an axis reads index 0 there (a length-1 range on the last two axes, then
    /// broadcast). Symbolic dims the index arithmetic needs are scalar parameters.
    fn fused_nd(
        &mut self,
        grp: &Group,
        out: BufId,
        order: &[NodeId],
        leaves: &[NodeId],
        padded_of: &HashMap<NodeId, Vec<Dim>>,
    ) -> R<()> {
        let g = self.g;
        let root = grp.root;
        let dims = g.ty(root).dims().to_vec();
        let n = dims.len();
        if n < 2 {
            return Err(self.unsupported(root, "a broadcast the fused kernels do not cover"));
        }
        let dtype = self.buffers[out.0 as usize].dtype;
        let (r, c) = (dims[n - 2].clone(), dims[n - 1].clone());
        let z = product(&dims[..n - 2]).ok_or_else(|| self.unsupported(root, "batch dims"))?;
        let bc = c.as_const().map(|c| next_pow2(c).min(128)).unwrap_or(128);
        let mut br = (1024 / bc).max(1);
        if let Some(rc) = r.as_const() {
            br = br.min(next_pow2(rc));
        }
        let shape = [br as u32, bc as u32];
        let dim_of = |d: &Dim, k: usize| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(format!("D{k}")),
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![],
            span: g.node(root).span,
        };
        let mut args: Vec<(String, Arg)> = Vec::new();
        // The value of dim `k` in the kernel: a constant or a scalar parameter.
        let dim_value = |kb: &mut KernelBuilder, args: &mut Vec<(String, Arg)>, k: usize| match dims
            [k]
            .as_const()
        {
            Some(v) => kb.cnst(Constant::Int(v), DType::I32),
            None => {
                let idx = kb.params.len();
                let name = format!("d{k}");
                kb.params.push(tile::Param {
                    name: name.clone(),
                    kind: ParamKind::Scalar(DType::I32),
                });
                args.push((name, Arg::Scalar(ScalarExpr::Index(dims[k].clone()))));
                kb.emit(OpKind::ScalarParam(idx), Type::Scalar(DType::I32))
            }
        };
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let pid1 = kb.emit(OpKind::ProgramId(1), Type::Scalar(DType::I32));
        let kbr = kb.cnst(Constant::Int(br), DType::I32);
        let kbc = kb.cnst(Constant::Int(bc), DType::I32);
        let rv = dim_value(&mut kb, &mut args, n - 2);
        let brm1 = kb.cnst(Constant::Int(br - 1), DType::I32);
        let t = kb.binary(BinaryOp::Add, rv, brm1);
        let row_tiles = kb.binary(BinaryOp::FloorDiv, t, kbr);
        let batch = kb.binary(BinaryOp::FloorDiv, pid0, row_tiles);
        let rt = kb.binary(BinaryOp::Mod, pid0, row_tiles);
        let r0 = kb.binary(BinaryOp::Mul, rt, kbr);
        let c0 = kb.binary(BinaryOp::Mul, pid1, kbc);
        let zero = kb.cnst(Constant::Int(0), DType::I32);
        let mut index = vec![zero; n - 2];
        let mut rest = batch;
        for k in (0..n - 2).rev() {
            let dk = dim_value(&mut kb, &mut args, k);
            index[k] = kb.binary(BinaryOp::Mod, rest, dk);
            rest = kb.binary(BinaryOp::FloorDiv, rest, dk);
        }
        let mut vals: HashMap<NodeId, Value> = HashMap::new();
        let mut scalars: HashMap<NodeId, Value> = HashMap::new();
        let mut loaded: HashMap<(BufId, Vec<bool>), Value> = HashMap::new();
        for &l in leaves {
            let lt = g.ty(l);
            if lt.is_scalar() {
                if let NodeKind::Const(_) = g.node(l).kind {
                    continue;
                }
                let idx = kb.params.len();
                let sdt = lt.dtype().unwrap_or(DType::F32);
                kb.params.push(tile::Param {
                    name: format!("s{idx}"),
                    kind: ParamKind::Scalar(sdt),
                });
                args.push((format!("s{idx}"), Arg::Scalar(self.scalar(l)?)));
                let v = kb.emit(OpKind::ScalarParam(idx), Type::Scalar(sdt));
                scalars.insert(l, v);
                continue;
            }
            let b = self.buf(l, root)?;
            let bdt = self.buffers[b.0 as usize].dtype;
            let padded = &padded_of[&l];
            let full: Vec<bool> = padded.iter().zip(&dims).map(|(p, d)| p == d).collect();
            let tensor = match loaded.get(&(b, full.clone())) {
                Some(v) => *v,
                None => {
                    let idx = kb.params.len();
                    let mut access: Vec<Access> = (0..n - 2)
                        .map(|k| Access::Point(if full[k] { index[k] } else { zero }))
                        .collect();
                    let lr = if full[n - 2] { shape[0] } else { 1 };
                    let lc = if full[n - 1] { shape[1] } else { 1 };
                    access.push(Access::Range {
                        start: if full[n - 2] { r0 } else { zero },
                        len: lr,
                    });
                    access.push(Access::Range {
                        start: if full[n - 1] { c0 } else { zero },
                        len: lc,
                    });
                    let pdims = (0..n)
                        .map(|k| {
                            if full[k] {
                                dim_of(&dims[k], k)
                            } else {
                                tile::Dim::Static(1)
                            }
                        })
                        .collect();
                    let name = format!("x{idx}");
                    kb.params.push(tile::Param {
                        name: name.clone(),
                        kind: ParamKind::Tensor {
                            dims: pdims,
                            dtype: bdt,
                        },
                    });
                    args.push((
                        name,
                        Arg::Buffer {
                            buf: b,
                            dims: padded.clone(),
                        },
                    ));
                    let mut v = kb.emit(
                        OpKind::Load {
                            tensor: idx,
                            access,
                            mask: None,
                            other: zero_of(bdt),
                        },
                        KernelBuilder::tile_ty(&[lr, lc], bdt),
                    );
                    if [lr, lc] != shape {
                        v = kb.emit(
                            OpKind::Broadcast {
                                x: v,
                                shape: shape.to_vec(),
                            },
                            KernelBuilder::tile_ty(&shape, bdt),
                        );
                    }
                    loaded.insert((b, full), v);
                    v
                }
            };
            let v = kb.cast(tensor, lt.dtype().unwrap_or(bdt));
            vals.insert(l, v);
        }
        eval_members(&mut kb, g, grp, order, &mut vals, &scalars, &shape);
        let result = kb.cast(vals[&root], dtype);
        let idx = kb.params.len();
        kb.params.push(tile::Param {
            name: "out".into(),
            kind: ParamKind::Tensor {
                dims: (0..n).map(|k| dim_of(&dims[k], k)).collect(),
                dtype,
            },
        });
        args.push((
            "out".into(),
            Arg::Buffer {
                buf: out,
                dims: dims.clone(),
            },
        ));
        let mut access: Vec<Access> = index.iter().map(|i| Access::Point(*i)).collect();
        access.push(Access::Range {
            start: r0,
            len: shape[0],
        });
        access.push(Access::Range {
            start: c0,
            len: shape[1],
        });
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: idx,
                access,
                value: result,
                mask: None,
            },
            span: kb.span,
        });
        let kname = format!(
            "{}_{}{}",
            g.name,
            if grp.copy { "copy" } else { "fused" },
            self.kernels.len()
        );
        self.kernels.push(Kernel {
            name: kname,
            specialization: vec![],
            params: kb.params,
            num_warps: 4,
            num_stages: 1,
            body: Region {
                args: vec![],
                ops: kb.ops,
            },
            types: kb.types,
        });
        let rows = match (z.as_const(), r.as_const()) {
            (Some(zc), Some(rc)) => ScalarExpr::Index(Dim::constant(zc * ((rc + br - 1) / br))),
            _ => ScalarExpr::Binary(
                BinaryOp::Mul,
                Box::new(ScalarExpr::Index(z)),
                Box::new(cdiv(&r, br)),
            ),
        };
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes: if grp.copy {
                vec![root]
            } else {
                grp.members.clone()
            },
            grid: Some(vec![rows, cdiv(&c, bc)]),
            args,
            consts: vec![],
            requires: vec![],
            writes: vec![out],
        });
        Ok(())
    }
}

/// Computes the members of a fused group on `shape` tiles, after its leaves
/// (in `vals` and `scalars`).
fn eval_members(
    kb: &mut KernelBuilder,
    g: &Graph,
    grp: &Group,
    order: &[NodeId],
    vals: &mut HashMap<NodeId, Value>,
    scalars: &HashMap<NodeId, Value>,
    shape: &[u32],
) {
    // An operand as a [BR, BC] tile of dtype `want`.
    fn operand(
        kb: &mut KernelBuilder,
        g: &Graph,
        vals: &HashMap<NodeId, Value>,
        scalars: &HashMap<NodeId, Value>,
        x: NodeId,
        want: DType,
        shape: &[u32],
    ) -> Value {
        if let Some(v) = vals.get(&x) {
            return kb.cast(*v, want);
        }
        let s = match (&g.node(x).kind, scalars.get(&x)) {
            (_, Some(v)) => kb.cast(*v, want),
            (NodeKind::Const(c), None) => kb.cnst(*c, want),
            _ => unreachable!("every operand is a leaf or an earlier member"),
        };
        kb.splat(s, shape)
    }
    let is_const = |x: NodeId| matches!(g.node(x).kind, NodeKind::Const(_));
    for &m in order {
        if grp.copy {
            break;
        }
        let node = g.node(m);
        let dt = node.ty.dtype().unwrap_or(DType::F32);
        let v = match &node.kind {
            NodeKind::Unary { op, x } => {
                let x = operand(kb, g, vals, scalars, *x, dt, shape);
                kb.unary(*op, x)
            }
            NodeKind::Activation { act, x } => {
                let x = operand(kb, g, vals, scalars, *x, dt, shape);
                match act {
                    Activation::Relu => {
                        let z = kb.cnst(Constant::Int(0), dt);
                        let z = kb.splat(z, shape);
                        kb.binary(BinaryOp::Max, x, z)
                    }
                    Activation::Silu => {
                        let s = kb.unary(UnaryOp::Sigmoid, x);
                        kb.binary(BinaryOp::Mul, x, s)
                    }
                    Activation::Gelu => {
                        let k = kb.cnst(Constant::Float(std::f64::consts::FRAC_1_SQRT_2), dt);
                        let k = kb.splat(k, shape);
                        let t = kb.binary(BinaryOp::Mul, x, k);
                        let t = kb.unary(UnaryOp::Erf, t);
                        let one = kb.cnst(Constant::Float(1.0), dt);
                        let one = kb.splat(one, shape);
                        let t = kb.binary(BinaryOp::Add, one, t);
                        let h = kb.cnst(Constant::Float(0.5), dt);
                        let h = kb.splat(h, shape);
                        let hx = kb.binary(BinaryOp::Mul, h, x);
                        kb.binary(BinaryOp::Mul, hx, t)
                    }
                }
            }
            NodeKind::Binary { op, a, b } => {
                let want = if op.is_comparison() {
                    let (ta, tb) = (g.ty(*a).dtype(), g.ty(*b).dtype());
                    match (ta, tb) {
                        (Some(x), Some(y)) if is_const(*b) => {
                            let _ = y;
                            x
                        }
                        (Some(_), Some(y)) if is_const(*a) => y,
                        (Some(x), Some(y)) => DType::join(x, y).unwrap_or(x),
                        _ => dt,
                    }
                } else {
                    dt
                };
                let a = operand(kb, g, vals, scalars, *a, want, shape);
                let b = operand(kb, g, vals, scalars, *b, want, shape);
                kb.binary(*op, a, b)
            }
            NodeKind::Select { cond, a, b } => {
                let cv = operand(kb, g, vals, scalars, *cond, DType::Bool, shape);
                let a = operand(kb, g, vals, scalars, *a, dt, shape);
                let b = operand(kb, g, vals, scalars, *b, dt, shape);
                kb.emit(
                    OpKind::Select { cond: cv, a, b },
                    KernelBuilder::tile_ty(shape, dt),
                )
            }
            NodeKind::Cast { x, to } => {
                let xd = g.ty(*x).dtype().unwrap_or(*to);
                let x = operand(kb, g, vals, scalars, *x, xd, shape);
                kb.cast(x, *to)
            }
            NodeKind::Fill(Fill::Zeros) => {
                let z = kb.cnst(Constant::Int(0), dt);
                kb.splat(z, shape)
            }
            NodeKind::Fill(Fill::Ones) => {
                let z = kb.cnst(Constant::Int(1), dt);
                kb.splat(z, shape)
            }
            NodeKind::Fill(Fill::Full(v)) => operand(kb, g, vals, scalars, *v, dt, shape),
            _ => unreachable!("only elementwise nodes are fused"),
        };
        vals.insert(m, v);
    }
}

/// How a leaf (padded to the group's rank) is read in the flat `[R, C]` view.
fn classify(padded: &[Dim], dims: &[Dim]) -> Option<Pattern> {
    let rank = dims.len();
    let lead_ones = padded[..rank - 1].iter().all(Dim::is_one);
    if padded == dims {
        Some(Pattern::Full)
    } else if lead_ones && padded[rank - 1] == dims[rank - 1] {
        Some(Pattern::Row)
    } else if padded[rank - 1].is_one() && padded[..rank - 1] == dims[..rank - 1] {
        Some(Pattern::Col)
    } else if padded.iter().all(Dim::is_one) {
        Some(Pattern::One)
    } else {
        None
    }
}

struct Group {
    members: Vec<NodeId>,
    root: NodeId,
    /// The root is a leaf (a copy kernel: load, cast, store).
    copy: bool,
}

fn next_pow2(x: i64) -> i64 {
    let mut p = 1;
    while p < x && p < (1 << 20) {
        p *= 2;
    }
    p
}

impl Lower<'_> {
    /// Generates the fused kernel of a group and launches it, writing `out`.
    fn fused(&mut self, grp: &Group, out: BufId) -> R<()> {
        let g = self.g;
        let root = grp.root;
        let dims = g.ty(root).dims().to_vec();
        let dtype = self.buffers[out.0 as usize].dtype;
        let in_group = |x: NodeId| grp.members.contains(&x) && !(grp.copy && x == root);
        let order: Vec<NodeId> = if grp.copy {
            vec![root]
        } else {
            grp.members.clone()
        };
        // Leaves first: every operand outside the group, in order of first use.
        let mut leaves: Vec<NodeId> = Vec::new();
        for &m in &order {
            let ops = if grp.copy { vec![m] } else { g.operands(m) };
            for o in ops {
                if !in_group(o) && !leaves.contains(&o) {
                    leaves.push(o);
                }
            }
        }
        let (r, c) = self.rows_cols(&dims, root)?;
        // Every tensor leaf padded to the group's rank.
        let rank = dims.len();
        let mut padded_of: HashMap<NodeId, Vec<Dim>> = HashMap::new();
        for &l in &leaves {
            let ld = g.ty(l).dims();
            if g.ty(l).is_scalar() {
                continue;
            }
            if ld.len() > rank {
                return Err(self.unsupported(l, "an operand of higher rank than its result"));
            }
            let mut padded = vec![Dim::constant(1); rank - ld.len()];
            padded.extend(ld.iter().cloned());
            if padded.iter().zip(&dims).any(|(p, d)| p != d && !p.is_one()) {
                return Err(self.unsupported(
                    l,
                    format!(
                        "broadcasting `{}` to {} in a fused kernel",
                        g.ty(l),
                        crate::check::types::render_dims(&dims)
                    ),
                ));
            }
            padded_of.insert(l, padded);
        }
        // The flat `[R, C]` view serves when every input is full, a row, a
        // column or one element; otherwise the kernel indexes every axis.
        if padded_of.values().any(|p| classify(p, &dims).is_none()) {
            return self.fused_nd(grp, out, &order, &leaves, &padded_of);
        }
        let bc = c.as_const().map(|c| next_pow2(c).min(128)).unwrap_or(128);
        let mut br = (1024 / bc).max(1);
        if let Some(rc) = r.as_const() {
            br = br.min(next_pow2(rc));
        }
        let shape = [br as u32, bc as u32];
        let dim_of = |d: &Dim, name: &str| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name.to_string()),
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![],
            span: g.node(root).span,
        };
        let mut args: Vec<(String, Arg)> = Vec::new();
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let pid1 = kb.emit(OpKind::ProgramId(1), Type::Scalar(DType::I32));
        let kbr = kb.cnst(Constant::Int(br), DType::I32);
        let kbc = kb.cnst(Constant::Int(bc), DType::I32);
        let r0 = kb.binary(BinaryOp::Mul, pid0, kbr);
        let c0 = kb.binary(BinaryOp::Mul, pid1, kbc);
        // Values of nodes already computed in this kernel, at their graph dtype.
        let mut vals: HashMap<NodeId, Value> = HashMap::new();
        let mut loaded: HashMap<(BufId, Pattern), Value> = HashMap::new();
        let mut scalars: HashMap<NodeId, Value> = HashMap::new();
        for &l in &leaves {
            let lt = g.ty(l);
            if lt.is_scalar() {
                if let NodeKind::Const(_) = g.node(l).kind {
                    continue; // built where used, in the dtype it is used at
                }
                let idx = kb.params.len();
                let sdt = lt.dtype().unwrap_or(DType::F32);
                kb.params.push(tile::Param {
                    name: format!("s{idx}"),
                    kind: ParamKind::Scalar(sdt),
                });
                args.push((format!("s{idx}"), Arg::Scalar(self.scalar(l)?)));
                let v = kb.emit(OpKind::ScalarParam(idx), Type::Scalar(sdt));
                scalars.insert(l, v);
                continue;
            }
            let b = self.buf(l, root)?;
            let bdt = self.buffers[b.0 as usize].dtype;
            let pattern = classify(&padded_of[&l], &dims).expect("classified above");
            let tensor = match loaded.get(&(b, pattern)) {
                Some(v) => *v,
                None => {
                    let idx = kb.params.len();
                    let (pdims, view, access, lshape) = match pattern {
                        Pattern::Full => (
                            vec![dim_of(&r, "R"), dim_of(&c, "C")],
                            vec![r.clone(), c.clone()],
                            vec![
                                Access::Range {
                                    start: r0,
                                    len: shape[0],
                                },
                                Access::Range {
                                    start: c0,
                                    len: shape[1],
                                },
                            ],
                            vec![shape[0], shape[1]],
                        ),
                        Pattern::Row => (
                            vec![dim_of(&c, "C")],
                            vec![c.clone()],
                            vec![Access::Range {
                                start: c0,
                                len: shape[1],
                            }],
                            vec![shape[1]],
                        ),
                        Pattern::Col => (
                            vec![dim_of(&r, "R")],
                            vec![r.clone()],
                            vec![Access::Range {
                                start: r0,
                                len: shape[0],
                            }],
                            vec![shape[0]],
                        ),
                        Pattern::One => {
                            let z = kb.cnst(Constant::Int(0), DType::I32);
                            (
                                vec![tile::Dim::Static(1)],
                                vec![Dim::constant(1)],
                                vec![Access::Range { start: z, len: 1 }],
                                vec![1],
                            )
                        }
                    };
                    let name = format!("x{idx}");
                    kb.params.push(tile::Param {
                        name: name.clone(),
                        kind: ParamKind::Tensor {
                            dims: pdims,
                            dtype: bdt,
                        },
                    });
                    args.push((name, Arg::Buffer { buf: b, dims: view }));
                    let mut v = kb.emit(
                        OpKind::Load {
                            tensor: idx,
                            access,
                            mask: None,
                            other: zero_of(bdt),
                        },
                        KernelBuilder::tile_ty(&lshape, bdt),
                    );
                    if pattern != Pattern::Full {
                        let axis = if pattern == Pattern::Col { 1 } else { 0 };
                        let s = if pattern == Pattern::Col {
                            [shape[0], 1]
                        } else {
                            [1, lshape[0]]
                        };
                        v = kb.emit(
                            OpKind::ExpandDims { x: v, axis },
                            KernelBuilder::tile_ty(&s, bdt),
                        );
                        v = kb.emit(
                            OpKind::Broadcast {
                                x: v,
                                shape: shape.to_vec(),
                            },
                            KernelBuilder::tile_ty(&shape, bdt),
                        );
                    }
                    loaded.insert((b, pattern), v);
                    v
                }
            };
            let v = kb.cast(tensor, lt.dtype().unwrap_or(bdt));
            vals.insert(l, v);
        }
        eval_members(&mut kb, g, grp, &order, &mut vals, &scalars, &shape);
        let result = kb.cast(vals[&root], dtype);
        let idx = kb.params.len();
        kb.params.push(tile::Param {
            name: "out".into(),
            kind: ParamKind::Tensor {
                dims: vec![dim_of(&r, "R"), dim_of(&c, "C")],
                dtype,
            },
        });
        args.push((
            "out".into(),
            Arg::Buffer {
                buf: out,
                dims: vec![r.clone(), c.clone()],
            },
        ));
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: idx,
                access: vec![
                    Access::Range {
                        start: r0,
                        len: shape[0],
                    },
                    Access::Range {
                        start: c0,
                        len: shape[1],
                    },
                ],
                value: result,
                mask: None,
            },
            span: kb.span,
        });
        let kname = format!(
            "{}_{}{}",
            g.name,
            if grp.copy { "copy" } else { "fused" },
            self.kernels.len()
        );
        self.kernels.push(Kernel {
            name: kname,
            specialization: vec![],
            params: kb.params,
            num_warps: 4,
            num_stages: 1,
            body: Region {
                args: vec![],
                ops: kb.ops,
            },
            types: kb.types,
        });
        let mut nodes = grp.members.clone();
        if grp.copy {
            nodes = vec![root];
        }
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes,
            grid: Some(vec![cdiv(&r, br), cdiv(&c, bc)]),
            args,
            consts: vec![],
            requires: vec![],
            writes: vec![out],
        });
        Ok(())
    }
}

impl Lower<'_> {
    /// A generated kernel swapping the last two axes: one program writes a
    /// `[32, 32]` tile of `out[z]` from the transposed `[32, 32]` tile of `x[z]`.
    fn transpose(&mut self, n: NodeId, out: BufId) -> R<()> {
        let g = self.g;
        let NodeKind::Transpose { x, a, b } = g.node(n).kind else {
            unreachable!("a transpose")
        };
        let xd = g.ty(x).dims().to_vec();
        let rank = xd.len();
        if rank < 2 || a.min(b) != rank - 2 || a.max(b) != rank - 1 {
            return Err(self.unsupported(
                n,
                "`transpose` of axes other than the last two (no kernel for it yet)",
            ));
        }
        let z = product(&xd[..rank - 2]).ok_or_else(|| self.unsupported(n, "batch dims"))?;
        let (m, nn) = (xd[rank - 2].clone(), xd[rank - 1].clone());
        let bx = self.buf(x, n)?;
        let (bdt, odt) = (
            self.buffers[bx.0 as usize].dtype,
            self.buffers[out.0 as usize].dtype,
        );
        const T: u32 = 32;
        let dim_of = |d: &Dim, name: &str| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name.to_string()),
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![
                tile::Param {
                    name: "x0".into(),
                    kind: ParamKind::Tensor {
                        dims: vec![dim_of(&z, "Z"), dim_of(&m, "M"), dim_of(&nn, "N")],
                        dtype: bdt,
                    },
                },
                tile::Param {
                    name: "out".into(),
                    kind: ParamKind::Tensor {
                        dims: vec![dim_of(&z, "Z"), dim_of(&nn, "N"), dim_of(&m, "M")],
                        dtype: odt,
                    },
                },
            ],
            span: g.node(n).span,
        };
        let pid: Vec<Value> = (0..3)
            .map(|a| kb.emit(OpKind::ProgramId(a), Type::Scalar(DType::I32)))
            .collect();
        let kt = kb.cnst(Constant::Int(T as i64), DType::I32);
        let r0 = kb.binary(BinaryOp::Mul, pid[0], kt);
        let c0 = kb.binary(BinaryOp::Mul, pid[1], kt);
        let v = kb.emit(
            OpKind::Load {
                tensor: 0,
                access: vec![
                    Access::Point(pid[2]),
                    Access::Range { start: c0, len: T },
                    Access::Range { start: r0, len: T },
                ],
                mask: None,
                other: zero_of(bdt),
            },
            KernelBuilder::tile_ty(&[T, T], bdt),
        );
        let v = kb.emit(
            OpKind::Transpose { x: v },
            KernelBuilder::tile_ty(&[T, T], bdt),
        );
        let v = kb.cast(v, odt);
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: 1,
                access: vec![
                    Access::Point(pid[2]),
                    Access::Range { start: r0, len: T },
                    Access::Range { start: c0, len: T },
                ],
                value: v,
                mask: None,
            },
            span: kb.span,
        });
        let name = format!("{}_transpose{}", g.name, self.kernels.len());
        self.kernels.push(Kernel {
            name,
            specialization: vec![],
            params: kb.params,
            num_warps: 4,
            num_stages: 1,
            body: Region {
                args: vec![],
                ops: kb.ops,
            },
            types: kb.types,
        });
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes: vec![n],
            grid: Some(vec![
                cdiv(&nn, T as i64),
                cdiv(&m, T as i64),
                ScalarExpr::Index(z.clone()),
            ]),
            args: vec![
                (
                    "x0".into(),
                    Arg::Buffer {
                        buf: bx,
                        dims: vec![z.clone(), m.clone(), nn.clone()],
                    },
                ),
                (
                    "out".into(),
                    Arg::Buffer {
                        buf: out,
                        dims: vec![z, nn, m],
                    },
                ),
            ],
            consts: vec![],
            requires: vec![],
            writes: vec![out],
        });
        Ok(())
    }
}

/// The identity of a reduction, as a constant of `dtype`.
fn neutral(op: ReduceKind, dtype: DType) -> Constant {
    let (lo, hi): (i64, i64) = match dtype {
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::I16 => (i16::MIN as i64, i16::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::I64 => (i64::MIN, i64::MAX),
        DType::U8 => (0, u8::MAX as i64),
        DType::U32 => (0, u32::MAX as i64),
        _ => (0, 1),
    };
    match (op, dtype) {
        (ReduceKind::Sum | ReduceKind::Mean, d) => zero_of(d),
        (ReduceKind::Max, DType::Bool) => Constant::Bool(false),
        (ReduceKind::Min, DType::Bool) => Constant::Bool(true),
        (ReduceKind::Max, d) if d.is_float() => Constant::Float(f64::NEG_INFINITY),
        (ReduceKind::Min, d) if d.is_float() => Constant::Float(f64::INFINITY),
        (ReduceKind::Max, _) => Constant::Int(lo),
        (ReduceKind::Min, _) => Constant::Int(hi),
    }
}

impl Lower<'_> {
    /// A generated reduction of one axis (or of everything): `x` is viewed as
    /// `[R, K, C]` (K the reduced extent, R and C the products of the dims before
    /// and after it), one program reduces `K` for one `r` and a block of `C`, looping over `K` in chunks; out-of-bounds lanes read the
    /// reduction's identity. Accumulates floats in f32.
    fn reduce_generated(&mut self, n: NodeId, out: BufId) -> R<()> {
        let g = self.g;
        let NodeKind::Reduce { op, x, axis, .. } = g.node(n).kind else {
            unreachable!("a reduction")
        };
        let xd = g.ty(x).dims().to_vec();
        let overflow = || self.unsupported(n, "a dim product that overflows");
        let (a, k, b) = match axis {
            Some(j) => (
                product(&xd[..j]).ok_or_else(overflow)?,
                xd[j].clone(),
                product(&xd[j + 1..]).ok_or_else(overflow)?,
            ),
            None => (
                Dim::constant(1),
                product(&xd).ok_or_else(overflow)?,
                Dim::constant(1),
            ),
        };
        let bx = self.buf(x, n)?;
        let bdt = self.buffers[bx.0 as usize].dtype;
        let odt = self.buffers[out.0 as usize].dtype;
        let xdt = g.ty(x).dtype().unwrap_or(bdt);
        let ndt = g.ty(n).dtype().unwrap_or(odt);
        let acc = if ndt == DType::F64 {
            DType::F64
        } else if ndt.is_float() {
            DType::F32
        } else {
            ndt
        };
        let bc = b.as_const().map(|b| next_pow2(b).min(32)).unwrap_or(32);
        let mut bk = (1024 / bc).max(1);
        if let Some(kc) = k.as_const() {
            bk = bk.min(next_pow2(kc).max(1));
        }
        let dim_of = |d: &Dim, name: &str| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name.to_string()),
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![
                tile::Param {
                    name: "x0".into(),
                    kind: ParamKind::Tensor {
                        dims: vec![dim_of(&a, "R"), dim_of(&k, "K"), dim_of(&b, "C")],
                        dtype: bdt,
                    },
                },
                tile::Param {
                    name: "out".into(),
                    kind: ParamKind::Tensor {
                        dims: vec![dim_of(&a, "R"), dim_of(&b, "C")],
                        dtype: odt,
                    },
                },
            ],
            span: g.node(n).span,
        };
        let (bc32, bk32) = (bc as u32, bk as u32);
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let pid1 = kb.emit(OpKind::ProgramId(1), Type::Scalar(DType::I32));
        let kbc = kb.cnst(Constant::Int(bc), DType::I32);
        let c0 = kb.binary(BinaryOp::Mul, pid1, kbc);
        let id = kb.emit(OpKind::Const(neutral(op, acc)), Type::Scalar(acc));
        let init = kb.splat(id, &[bc32]);
        let lo = kb.cnst(Constant::Int(0), DType::I32);
        let hi = match k.as_const() {
            Some(kc) => kb.cnst(Constant::Int(kc), DType::I32),
            None => kb.emit(
                OpKind::TensorDim { param: 0, axis: 1 },
                Type::Scalar(DType::I32),
            ),
        };
        let step = kb.cnst(Constant::Int(bk), DType::I32);
        let iv = kb.fresh(Type::Scalar(DType::I32));
        let acc_in = kb.fresh(KernelBuilder::tile_ty(&[bc32], acc));
        let outer = std::mem::take(&mut kb.ops);
        let ld = kb.emit(
            OpKind::Load {
                tensor: 0,
                access: vec![
                    Access::Point(pid0),
                    Access::Range {
                        start: iv,
                        len: bk32,
                    },
                    Access::Range {
                        start: c0,
                        len: bc32,
                    },
                ],
                mask: None,
                other: neutral(op, bdt),
            },
            KernelBuilder::tile_ty(&[bk32, bc32], bdt),
        );
        let v = kb.cast(ld, xdt);
        let v = kb.cast(v, acc);
        let (rop, bop) = match op {
            ReduceKind::Sum | ReduceKind::Mean => (tile::ReduceOp::Sum, BinaryOp::Add),
            ReduceKind::Max => (tile::ReduceOp::Max, BinaryOp::Max),
            ReduceKind::Min => (tile::ReduceOp::Min, BinaryOp::Min),
        };
        let r = kb.emit(
            OpKind::Reduce {
                op: rop,
                x: v,
                axis: 0,
                keepdims: false,
            },
            KernelBuilder::tile_ty(&[bc32], acc),
        );
        let next = kb.binary(bop, acc_in, r);
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Yield(vec![next]),
            span: kb.span,
        });
        let body_ops = std::mem::replace(&mut kb.ops, outer);
        let total = kb.fresh(KernelBuilder::tile_ty(&[bc32], acc));
        kb.ops.push(Op {
            results: vec![total],
            kind: OpKind::For {
                lo,
                hi,
                step,
                init: vec![init],
                body: Region {
                    args: vec![iv, acc_in],
                    ops: body_ops,
                },
            },
            span: kb.span,
        });
        let mut res = total;
        if op == ReduceKind::Mean {
            let kf = kb.cast(hi, acc);
            let kf = kb.splat(kf, &[bc32]);
            res = kb.binary(BinaryOp::Div, res, kf);
        }
        let res = kb.cast(res, ndt);
        let res = kb.cast(res, odt);
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: 1,
                access: vec![
                    Access::Point(pid0),
                    Access::Range {
                        start: c0,
                        len: bc32,
                    },
                ],
                value: res,
                mask: None,
            },
            span: kb.span,
        });
        let name = format!("{}_reduce{}", g.name, self.kernels.len());
        self.kernels.push(Kernel {
            name,
            specialization: vec![],
            params: kb.params,
            num_warps: 4,
            num_stages: 1,
            body: Region {
                args: vec![],
                ops: kb.ops,
            },
            types: kb.types,
        });
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes: vec![n],
            grid: Some(vec![ScalarExpr::Index(a.clone()), cdiv(&b, bc)]),
            args: vec![
                (
                    "x0".into(),
                    Arg::Buffer {
                        buf: bx,
                        dims: vec![a.clone(), k, b.clone()],
                    },
                ),
                (
                    "out".into(),
                    Arg::Buffer {
                        buf: out,
                        dims: vec![a, b],
                    },
                ),
            ],
            consts: vec![],
            requires: vec![],
            writes: vec![out],
        });
        Ok(())
    }
}

impl Lower<'_> {
    /// A generated softmax over any axis and float dtype: `x` viewed as
    /// `[R, K, C]` (K the softmax axis), one program handles one `r` and a block
    /// of `C` in three loops over `K`: the max, the sum of `exp(x - max)`, and the
    /// normalised values (f32 arithmetic; out-of-bounds lanes read -inf, which
    /// adds nothing and is never stored).
    fn softmax_generated(&mut self, n: NodeId, out: BufId) -> R<()> {
        let g = self.g;
        let NodeKind::Softmax { x, axis } = g.node(n).kind else {
            unreachable!("a softmax")
        };
        let xd = g.ty(x).dims().to_vec();
        let overflow = || self.unsupported(n, "a dim product that overflows");
        let a = product(&xd[..axis]).ok_or_else(overflow)?;
        let k = xd[axis].clone();
        let b = product(&xd[axis + 1..]).ok_or_else(overflow)?;
        let bx = self.buf(x, n)?;
        let bdt = self.buffers[bx.0 as usize].dtype;
        let odt = self.buffers[out.0 as usize].dtype;
        let xdt = g.ty(x).dtype().unwrap_or(bdt);
        let ndt = g.ty(n).dtype().unwrap_or(odt);
        let f = DType::F32;
        let bc = b.as_const().map(|b| next_pow2(b).min(32)).unwrap_or(32);
        let mut bk = (1024 / bc).max(1);
        if let Some(kc) = k.as_const() {
            bk = bk.min(next_pow2(kc).max(1));
        }
        let (bc32, bk32) = (bc as u32, bk as u32);
        let dim_of = |d: &Dim, name: &str| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name.to_string()),
        };
        let view = |d: &Dim| vec![dim_of(&a, "R"), dim_of(d, "K"), dim_of(&b, "C")];
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![
                tile::Param {
                    name: "x0".into(),
                    kind: ParamKind::Tensor {
                        dims: view(&k),
                        dtype: bdt,
                    },
                },
                tile::Param {
                    name: "out".into(),
                    kind: ParamKind::Tensor {
                        dims: view(&k),
                        dtype: odt,
                    },
                },
            ],
            span: g.node(n).span,
        };
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let pid1 = kb.emit(OpKind::ProgramId(1), Type::Scalar(DType::I32));
        let kbc = kb.cnst(Constant::Int(bc), DType::I32);
        let c0 = kb.binary(BinaryOp::Mul, pid1, kbc);
        let lo = kb.cnst(Constant::Int(0), DType::I32);
        let hi = match k.as_const() {
            Some(kc) => kb.cnst(Constant::Int(kc), DType::I32),
            None => kb.emit(
                OpKind::TensorDim { param: 0, axis: 1 },
                Type::Scalar(DType::I32),
            ),
        };
        let step = kb.cnst(Constant::Int(bk), DType::I32);
        let tile2 = [bk32, bc32];
        // One loop over K: `body(kb, iv, x_tile_f32, carried) -> yielded`.
        let looped =
            |kb: &mut KernelBuilder, init: Vec<Value>, body: &mut LoopBody<'_>| -> Vec<Value> {
                let iv = kb.fresh(Type::Scalar(DType::I32));
                let args: Vec<Value> = init
                    .iter()
                    .map(|v| {
                        let t = kb.ty(*v).clone();
                        kb.fresh(t)
                    })
                    .collect();
                let outer = std::mem::take(&mut kb.ops);
                let ld = kb.emit(
                    OpKind::Load {
                        tensor: 0,
                        access: vec![
                            Access::Point(pid0),
                            Access::Range {
                                start: iv,
                                len: bk32,
                            },
                            Access::Range {
                                start: c0,
                                len: bc32,
                            },
                        ],
                        mask: None,
                        other: neutral(ReduceKind::Max, bdt),
                    },
                    KernelBuilder::tile_ty(&tile2, bdt),
                );
                let v = kb.cast(ld, xdt);
                let v = kb.cast(v, f);
                let yielded = body(kb, iv, v, &args);
                kb.ops.push(Op {
                    results: vec![],
                    kind: OpKind::Yield(yielded),
                    span: kb.span,
                });
                let body_ops = std::mem::replace(&mut kb.ops, outer);
                let results: Vec<Value> = init
                    .iter()
                    .map(|v| {
                        let t = kb.ty(*v).clone();
                        kb.fresh(t)
                    })
                    .collect();
                let mut region_args = vec![iv];
                region_args.extend(args);
                kb.ops.push(Op {
                    results: results.clone(),
                    kind: OpKind::For {
                        lo,
                        hi,
                        step,
                        init,
                        body: Region {
                            args: region_args,
                            ops: body_ops,
                        },
                    },
                    span: kb.span,
                });
                results
            };
        let ninf = kb.emit(
            OpKind::Const(Constant::Float(f64::NEG_INFINITY)),
            Type::Scalar(f),
        );
        let m0 = kb.splat(ninf, &[bc32]);
        let m = looped(&mut kb, vec![m0], &mut |kb, _, v, c| {
            let r = kb.emit(
                OpKind::Reduce {
                    op: tile::ReduceOp::Max,
                    x: v,
                    axis: 0,
                    keepdims: false,
                },
                KernelBuilder::tile_ty(&[bc32], f),
            );
            vec![kb.binary(BinaryOp::Max, c[0], r)]
        })[0];
        let bcast = |kb: &mut KernelBuilder, row: Value| {
            let e = kb.emit(
                OpKind::ExpandDims { x: row, axis: 0 },
                KernelBuilder::tile_ty(&[1, bc32], f),
            );
            kb.emit(
                OpKind::Broadcast {
                    x: e,
                    shape: tile2.to_vec(),
                },
                KernelBuilder::tile_ty(&tile2, f),
            )
        };
        let zero = kb.cnst(Constant::Float(0.0), f);
        let s0 = kb.splat(zero, &[bc32]);
        let s = looped(&mut kb, vec![s0], &mut |kb, _, v, c| {
            let mb = bcast(kb, m);
            let d = kb.binary(BinaryOp::Sub, v, mb);
            let e = kb.unary(UnaryOp::Exp, d);
            let r = kb.emit(
                OpKind::Reduce {
                    op: tile::ReduceOp::Sum,
                    x: e,
                    axis: 0,
                    keepdims: false,
                },
                KernelBuilder::tile_ty(&[bc32], f),
            );
            vec![kb.binary(BinaryOp::Add, c[0], r)]
        })[0];
        looped(&mut kb, vec![], &mut |kb, iv, v, _| {
            let mb = bcast(kb, m);
            let sb = bcast(kb, s);
            let d = kb.binary(BinaryOp::Sub, v, mb);
            let e = kb.unary(UnaryOp::Exp, d);
            let y = kb.binary(BinaryOp::Div, e, sb);
            let y = kb.cast(y, ndt);
            let y = kb.cast(y, odt);
            kb.ops.push(Op {
                results: vec![],
                kind: OpKind::Store {
                    tensor: 1,
                    access: vec![
                        Access::Point(pid0),
                        Access::Range {
                            start: iv,
                            len: bk32,
                        },
                        Access::Range {
                            start: c0,
                            len: bc32,
                        },
                    ],
                    value: y,
                    mask: None,
                },
                span: kb.span,
            });
            vec![]
        });
        let name = format!("{}_softmax{}", g.name, self.kernels.len());
        self.kernels.push(Kernel {
            name,
            specialization: vec![],
            params: kb.params,
            num_warps: 4,
            num_stages: 1,
            body: Region {
                args: vec![],
                ops: kb.ops,
            },
            types: kb.types,
        });
        let dims = vec![a.clone(), k, b.clone()];
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes: vec![n],
            grid: Some(vec![ScalarExpr::Index(a), cdiv(&b, bc)]),
            args: vec![
                (
                    "x0".into(),
                    Arg::Buffer {
                        buf: bx,
                        dims: dims.clone(),
                    },
                ),
                ("out".into(), Arg::Buffer { buf: out, dims }),
            ],
            consts: vec![],
            requires: vec![],
            writes: vec![out],
        });
        Ok(())
    }
}

impl Lower<'_> {
    /// Whether a norm can run as its std.nn row kernel: f32 input, result and
    /// weights in f32 buffers, the weights it takes present, and a row that is not
    /// known to exceed the kernel's 1024.
    fn norm_fits_std(&self, n: NodeId) -> bool {
        let g = self.g;
        let (x, ws): (NodeId, Vec<Option<NodeId>>) = match g.node(n).kind {
            NodeKind::LayerNorm {
                x, weight, bias, ..
            } => (x, vec![weight, bias]),
            NodeKind::RmsNorm { x, weight, .. } => (x, vec![weight]),
            _ => return false,
        };
        let f32_buf = |v: NodeId| {
            g.ty(v).dtype() == Some(DType::F32)
                && self
                    .buf_of
                    .get(&v)
                    .is_some_and(|b| self.buffers[b.0 as usize].dtype == DType::F32)
        };
        let last = g.ty(x).dims().last().cloned();
        g.ty(n).dtype() == Some(DType::F32)
            && f32_buf(x)
            && ws.iter().all(|w| w.is_some_and(f32_buf))
            && ws.iter().flatten().all(|w| g.ty(*w).dims().len() == 1)
            && last.is_some_and(|c| c.as_const().is_none_or(|c| c <= ROW_BLOCK))
    }

    /// A generated layer norm or RMS norm over the last axis, any float dtype,
    /// any row length, weights optional: one program per row loops over the row
    /// in chunks (layer norm: mean, then the variance of the in-bounds lanes,
    /// then normalise; RMS norm: the mean square, then normalise), in f32.
    fn norm_generated(&mut self, n: NodeId, out: BufId) -> R<()> {
        let g = self.g;
        let (x, weight, bias, eps, layer) = match g.node(n).kind {
            NodeKind::LayerNorm {
                x,
                weight,
                bias,
                eps,
            } => (x, weight, bias, eps, true),
            NodeKind::RmsNorm { x, weight, eps } => (x, weight, None, eps, false),
            _ => unreachable!("a norm"),
        };
        let xd = g.ty(x).dims().to_vec();
        let (r, c) = self.rows_cols(&xd, n)?;
        for w in [weight, bias].into_iter().flatten() {
            if g.ty(w).dims().len() != 1 {
                return Err(self.unsupported(
                    w,
                    format!(
                        "a norm weight of shape `{}` (a vector over the last axis is)",
                        g.ty(w)
                    ),
                ));
            }
        }
        let bx = self.buf(x, n)?;
        let bdt = self.buffers[bx.0 as usize].dtype;
        let odt = self.buffers[out.0 as usize].dtype;
        let xdt = g.ty(x).dtype().unwrap_or(bdt);
        let ndt = g.ty(n).dtype().unwrap_or(odt);
        let f = DType::F32;
        let bk = c.as_const().map(|c| next_pow2(c).min(1024)).unwrap_or(1024);
        let bk32 = bk as u32;
        let dim_of = |d: &Dim, name: &str| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name.to_string()),
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![tile::Param {
                name: "x0".into(),
                kind: ParamKind::Tensor {
                    dims: vec![dim_of(&r, "R"), dim_of(&c, "C")],
                    dtype: bdt,
                },
            }],
            span: g.node(n).span,
        };
        let mut args = vec![(
            "x0".to_string(),
            Arg::Buffer {
                buf: bx,
                dims: vec![r.clone(), c.clone()],
            },
        )];
        let mut vec_params = Vec::new();
        for (name, w) in [("weight", weight), ("bias", bias)] {
            let Some(w) = w else { continue };
            let bw = self.buf(w, n)?;
            let wdt = self.buffers[bw.0 as usize].dtype;
            vec_params.push((kb.params.len(), wdt, g.ty(w).dtype().unwrap_or(wdt)));
            kb.params.push(tile::Param {
                name: name.into(),
                kind: ParamKind::Tensor {
                    dims: vec![dim_of(&c, "C")],
                    dtype: wdt,
                },
            });
            args.push((
                name.to_string(),
                Arg::Buffer {
                    buf: bw,
                    dims: vec![c.clone()],
                },
            ));
        }
        let out_idx = kb.params.len();
        kb.params.push(tile::Param {
            name: "out".into(),
            kind: ParamKind::Tensor {
                dims: vec![dim_of(&r, "R"), dim_of(&c, "C")],
                dtype: odt,
            },
        });
        args.push((
            "out".to_string(),
            Arg::Buffer {
                buf: out,
                dims: vec![r.clone(), c.clone()],
            },
        ));
        let eps_idx = kb.params.len();
        kb.params.push(tile::Param {
            name: "eps".into(),
            kind: ParamKind::Scalar(f),
        });
        args.push((
            "eps".to_string(),
            Arg::Scalar(match eps {
                Some(e) => self.scalar_as(e, Some(f))?,
                None => ScalarExpr::Const(Constant::Float(if layer { 1e-5 } else { 1e-6 })),
            }),
        ));
        let row = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let lo = kb.cnst(Constant::Int(0), DType::I32);
        let hi = match c.as_const() {
            Some(cc) => kb.cnst(Constant::Int(cc), DType::I32),
            None => kb.emit(
                OpKind::TensorDim { param: 0, axis: 1 },
                Type::Scalar(DType::I32),
            ),
        };
        let step = kb.cnst(Constant::Int(bk), DType::I32);
        let count = kb.cast(hi, f);
        let eps_v = kb.emit(OpKind::ScalarParam(eps_idx), Type::Scalar(f));
        let tile1 = [bk32];
        // One loop over the row: `body(kb, iv, x chunk in f32, carried)`.
        let looped = |kb: &mut KernelBuilder, init: Vec<Value>, body: &mut LoopBody<'_>| {
            let iv = kb.fresh(Type::Scalar(DType::I32));
            let carried: Vec<Value> = init
                .iter()
                .map(|v| {
                    let t = kb.ty(*v).clone();
                    kb.fresh(t)
                })
                .collect();
            let outer = std::mem::take(&mut kb.ops);
            let ld = kb.emit(
                OpKind::Load {
                    tensor: 0,
                    access: vec![
                        Access::Point(row),
                        Access::Range {
                            start: iv,
                            len: bk32,
                        },
                    ],
                    mask: None,
                    other: zero_of(bdt),
                },
                KernelBuilder::tile_ty(&tile1, bdt),
            );
            let v = kb.cast(ld, xdt);
            let v = kb.cast(v, f);
            let y = body(kb, iv, v, &carried);
            kb.ops.push(Op {
                results: vec![],
                kind: OpKind::Yield(y),
                span: kb.span,
            });
            let body_ops = std::mem::replace(&mut kb.ops, outer);
            let results: Vec<Value> = init
                .iter()
                .map(|v| {
                    let t = kb.ty(*v).clone();
                    kb.fresh(t)
                })
                .collect();
            let mut region_args = vec![iv];
            region_args.extend(carried);
            kb.ops.push(Op {
                results: results.clone(),
                kind: OpKind::For {
                    lo,
                    hi,
                    step,
                    init,
                    body: Region {
                        args: region_args,
                        ops: body_ops,
                    },
                },
                span: kb.span,
            });
            results
        };
        let reduce_sum = |kb: &mut KernelBuilder, v: Value| {
            kb.emit(
                OpKind::Reduce {
                    op: tile::ReduceOp::Sum,
                    x: v,
                    axis: 0,
                    keepdims: false,
                },
                Type::Scalar(f),
            )
        };
        let zero = kb.cnst(Constant::Float(0.0), f);
        // Layer norm: the mean first (out-of-bounds lanes read 0 and add nothing).
        let mean = if layer {
            let s = looped(&mut kb, vec![zero], &mut |kb, _, v, c| {
                let t = reduce_sum(kb, v);
                vec![kb.binary(BinaryOp::Add, c[0], t)]
            })[0];
            Some(kb.binary(BinaryOp::Div, s, count))
        } else {
            None
        };
        // The mean square of `x - mean` over the in-bounds lanes.
        let ss = looped(&mut kb, vec![zero], &mut |kb, iv, v, c| {
            let d = match mean {
                Some(m) => {
                    let mb = kb.splat(m, &tile1);
                    let d = kb.binary(BinaryOp::Sub, v, mb);
                    let idx = kb.emit(
                        OpKind::Arange {
                            start: iv,
                            len: bk32,
                        },
                        KernelBuilder::tile_ty(&tile1, DType::I32),
                    );
                    let cb = kb.splat(hi, &tile1);
                    let inb = kb.binary(BinaryOp::Lt, idx, cb);
                    let z = kb.splat(zero, &tile1);
                    kb.emit(
                        OpKind::Select {
                            cond: inb,
                            a: d,
                            b: z,
                        },
                        KernelBuilder::tile_ty(&tile1, f),
                    )
                }
                None => v,
            };
            let sq = kb.binary(BinaryOp::Mul, d, d);
            let t = reduce_sum(kb, sq);
            vec![kb.binary(BinaryOp::Add, c[0], t)]
        })[0];
        let ms = kb.binary(BinaryOp::Div, ss, count);
        let ms = kb.binary(BinaryOp::Add, ms, eps_v);
        let rstd = kb.unary(UnaryOp::Rsqrt, ms);
        looped(&mut kb, vec![], &mut |kb, iv, v, _| {
            let mut y = match mean {
                Some(m) => {
                    let mb = kb.splat(m, &tile1);
                    kb.binary(BinaryOp::Sub, v, mb)
                }
                None => v,
            };
            let rb = kb.splat(rstd, &tile1);
            y = kb.binary(BinaryOp::Mul, y, rb);
            for (i, &(p, wdt, wnode)) in vec_params.iter().enumerate() {
                let w = kb.emit(
                    OpKind::Load {
                        tensor: p,
                        access: vec![Access::Range {
                            start: iv,
                            len: bk32,
                        }],
                        mask: None,
                        other: zero_of(wdt),
                    },
                    KernelBuilder::tile_ty(&tile1, wdt),
                );
                let w = kb.cast(w, wnode);
                let w = kb.cast(w, f);
                let is_bias = weight.is_none() || i == 1;
                y = kb.binary(
                    if is_bias {
                        BinaryOp::Add
                    } else {
                        BinaryOp::Mul
                    },
                    y,
                    w,
                );
            }
            let y = kb.cast(y, ndt);
            let y = kb.cast(y, odt);
            kb.ops.push(Op {
                results: vec![],
                kind: OpKind::Store {
                    tensor: out_idx,
                    access: vec![
                        Access::Point(row),
                        Access::Range {
                            start: iv,
                            len: bk32,
                        },
                    ],
                    value: y,
                    mask: None,
                },
                span: kb.span,
            });
            vec![]
        });
        let name = format!(
            "{}_{}{}",
            g.name,
            if layer { "layer_norm" } else { "rms_norm" },
            self.kernels.len()
        );
        self.kernels.push(Kernel {
            name,
            specialization: vec![],
            params: kb.params,
            num_warps: 4,
            num_stages: 1,
            body: Region {
                args: vec![],
                ops: kb.ops,
            },
            types: kb.types,
        });
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes: vec![n],
            grid: Some(vec![ScalarExpr::Index(r)]),
            args,
            consts: vec![],
            requires: vec![],
            writes: vec![out],
        });
        Ok(())
    }
}

impl Lower<'_> {
    /// A generated batched gemm for the matmuls no stdlib gemm covers (bf16 or
    /// f32 with batch dims, broadcast batch dims): operands padded to one rank
    /// (`da`, `db`: `[batch.., M, K]`, `[batch.., K, N]`), one program per
    /// `(batch x M tile, N tile)`, a loop over K with `dot` into an f32
    /// accumulator, written to the f32 buffer `c`; a batch axis an operand lacks
    /// (size 1) reads index 0.
    fn matmul_generated(
        &mut self,
        n: NodeId,
        da: &[Dim],
        db: &[Dim],
        ba: BufId,
        bb: BufId,
        c: BufId,
    ) -> R<()> {
        let g = self.g;
        let nb = da.len().max(db.len()) - 2;
        let pad = |d: &[Dim]| {
            let mut p = vec![Dim::constant(1); nb + 2 - d.len()];
            p.extend(d.iter().cloned());
            p
        };
        let (pa, pb) = (pad(da), pad(db));
        let batch: Vec<Dim> = (0..nb)
            .map(|k| {
                if pa[k].is_one() {
                    pb[k].clone()
                } else {
                    pa[k].clone()
                }
            })
            .collect();
        let (m, kd, nn) = (pa[nb].clone(), pa[nb + 1].clone(), pb[nb + 1].clone());
        let z = product(&batch).ok_or_else(|| self.unsupported(n, "batch dims"))?;
        let NodeKind::MatMul { a, b } = g.node(n).kind else {
            unreachable!("a matmul")
        };
        let dt = g.ty(n).dtype().unwrap_or(DType::F32);
        let (adt, bdt) = (
            self.buffers[ba.0 as usize].dtype,
            self.buffers[bb.0 as usize].dtype,
        );
        let (bm, bn, bk) = (64i64, 64i64, 32i64);
        let (bm32, bn32, bk32) = (bm as u32, bn as u32, bk as u32);
        let dim_of = |d: &Dim, name: String| match d.as_const() {
            Some(v) => tile::Dim::Static(v as u64),
            None => tile::Dim::Dynamic(name),
        };
        let operand_dims = |p: &[Dim], inner: [(&Dim, &str); 2]| -> Vec<tile::Dim> {
            let mut v: Vec<tile::Dim> = (0..nb)
                .map(|k| {
                    if p[k].is_one() {
                        tile::Dim::Static(1)
                    } else {
                        dim_of(&p[k], format!("Z{k}"))
                    }
                })
                .collect();
            v.push(dim_of(inner[0].0, inner[0].1.to_string()));
            v.push(dim_of(inner[1].0, inner[1].1.to_string()));
            v
        };
        let mut kb = KernelBuilder {
            ops: vec![],
            types: vec![],
            params: vec![
                tile::Param {
                    name: "A".into(),
                    kind: ParamKind::Tensor {
                        dims: operand_dims(&pa, [(&m, "M"), (&kd, "K")]),
                        dtype: adt,
                    },
                },
                tile::Param {
                    name: "B".into(),
                    kind: ParamKind::Tensor {
                        dims: operand_dims(&pb, [(&kd, "K"), (&nn, "N")]),
                        dtype: bdt,
                    },
                },
                tile::Param {
                    name: "C".into(),
                    kind: ParamKind::Tensor {
                        dims: operand_dims(&batch, [(&m, "M"), (&nn, "N")]),
                        dtype: DType::F32,
                    },
                },
            ],
            span: g.node(n).span,
        };
        let mut args: Vec<(String, Arg)> = vec![
            (
                "A".into(),
                Arg::Buffer {
                    buf: ba,
                    dims: pa.clone(),
                },
            ),
            (
                "B".into(),
                Arg::Buffer {
                    buf: bb,
                    dims: pb.clone(),
                },
            ),
            ("C".into(), {
                let mut d = batch.clone();
                d.push(m.clone());
                d.push(nn.clone());
                Arg::Buffer { buf: c, dims: d }
            }),
        ];
        let value_of =
            |kb: &mut KernelBuilder, args: &mut Vec<(String, Arg)>, d: &Dim, name: String| match d
                .as_const()
            {
                Some(v) => kb.cnst(Constant::Int(v), DType::I32),
                None => {
                    let idx = kb.params.len();
                    kb.params.push(tile::Param {
                        name: name.clone(),
                        kind: ParamKind::Scalar(DType::I32),
                    });
                    args.push((name, Arg::Scalar(ScalarExpr::Index(d.clone()))));
                    kb.emit(OpKind::ScalarParam(idx), Type::Scalar(DType::I32))
                }
            };
        let pid0 = kb.emit(OpKind::ProgramId(0), Type::Scalar(DType::I32));
        let pid1 = kb.emit(OpKind::ProgramId(1), Type::Scalar(DType::I32));
        let kbm = kb.cnst(Constant::Int(bm), DType::I32);
        let kbn = kb.cnst(Constant::Int(bn), DType::I32);
        let mv = value_of(&mut kb, &mut args, &m, "m".into());
        let bm1 = kb.cnst(Constant::Int(bm - 1), DType::I32);
        let t = kb.binary(BinaryOp::Add, mv, bm1);
        let m_tiles = kb.binary(BinaryOp::FloorDiv, t, kbm);
        let zi = kb.binary(BinaryOp::FloorDiv, pid0, m_tiles);
        let mt = kb.binary(BinaryOp::Mod, pid0, m_tiles);
        let m0 = kb.binary(BinaryOp::Mul, mt, kbm);
        let n0 = kb.binary(BinaryOp::Mul, pid1, kbn);
        let zero = kb.cnst(Constant::Int(0), DType::I32);
        let mut index = vec![zero; nb];
        let mut rest = zi;
        for k in (0..nb).rev() {
            let dk = value_of(&mut kb, &mut args, &batch[k], format!("z{k}"));
            index[k] = kb.binary(BinaryOp::Mod, rest, dk);
            rest = kb.binary(BinaryOp::FloorDiv, rest, dk);
        }
        let points = |p: &[Dim]| -> Vec<Access> {
            (0..nb)
                .map(|k| Access::Point(if p[k].is_one() { zero } else { index[k] }))
                .collect()
        };
        let f0 = kb.cnst(Constant::Float(0.0), DType::F32);
        let acc0 = kb.splat(f0, &[bm32, bn32]);
        let lo = kb.cnst(Constant::Int(0), DType::I32);
        let hi = value_of(&mut kb, &mut args, &kd, "k".into());
        let step = kb.cnst(Constant::Int(bk), DType::I32);
        let iv = kb.fresh(Type::Scalar(DType::I32));
        let acc_in = kb.fresh(KernelBuilder::tile_ty(&[bm32, bn32], DType::F32));
        let outer = std::mem::take(&mut kb.ops);
        let mut acc_a = points(&pa);
        acc_a.push(Access::Range {
            start: m0,
            len: bm32,
        });
        acc_a.push(Access::Range {
            start: iv,
            len: bk32,
        });
        let ta = kb.emit(
            OpKind::Load {
                tensor: 0,
                access: acc_a,
                mask: None,
                other: zero_of(adt),
            },
            KernelBuilder::tile_ty(&[bm32, bk32], adt),
        );
        let mut acc_b = points(&pb);
        acc_b.push(Access::Range {
            start: iv,
            len: bk32,
        });
        acc_b.push(Access::Range {
            start: n0,
            len: bn32,
        });
        let tb = kb.emit(
            OpKind::Load {
                tensor: 1,
                access: acc_b,
                mask: None,
                other: zero_of(bdt),
            },
            KernelBuilder::tile_ty(&[bk32, bn32], bdt),
        );
        // Operands at their graph dtypes, then both at the product's.
        let ta = kb.cast(ta, g.ty(a).dtype().unwrap_or(adt));
        let ta = kb.cast(ta, dt);
        let tb = kb.cast(tb, g.ty(b).dtype().unwrap_or(bdt));
        let tb = kb.cast(tb, dt);
        let next = kb.emit(
            OpKind::Dot {
                a: ta,
                b: tb,
                acc: Some(acc_in),
                precision: tile::Precision::Ieee,
            },
            KernelBuilder::tile_ty(&[bm32, bn32], DType::F32),
        );
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Yield(vec![next]),
            span: kb.span,
        });
        let body_ops = std::mem::replace(&mut kb.ops, outer);
        let total = kb.fresh(KernelBuilder::tile_ty(&[bm32, bn32], DType::F32));
        kb.ops.push(Op {
            results: vec![total],
            kind: OpKind::For {
                lo,
                hi,
                step,
                init: vec![acc0],
                body: Region {
                    args: vec![iv, acc_in],
                    ops: body_ops,
                },
            },
            span: kb.span,
        });
        let mut acc_c: Vec<Access> = index.iter().map(|i| Access::Point(*i)).collect();
        acc_c.push(Access::Range {
            start: m0,
            len: bm32,
        });
        acc_c.push(Access::Range {
            start: n0,
            len: bn32,
        });
        kb.ops.push(Op {
            results: vec![],
            kind: OpKind::Store {
                tensor: 2,
                access: acc_c,
                value: total,
                mask: None,
            },
            span: kb.span,
        });
        let name = format!("{}_matmul{}", g.name, self.kernels.len());
        self.kernels.push(Kernel {
            name,
            specialization: vec![],
            params: kb.params,
            num_warps: 4,
            num_stages: 1,
            body: Region {
                args: vec![],
                ops: kb.ops,
            },
            types: kb.types,
        });
        let rows = match (z.as_const(), m.as_const()) {
            (Some(zc), Some(mc)) => ScalarExpr::Index(Dim::constant(zc * ((mc + bm - 1) / bm))),
            _ => ScalarExpr::Binary(
                BinaryOp::Mul,
                Box::new(ScalarExpr::Index(z)),
                Box::new(cdiv(&m, bm)),
            ),
        };
        self.launch(Launch {
            kernel: KernelRef::Generated(self.kernels.len() - 1),
            nodes: vec![n],
            grid: Some(vec![rows, cdiv(&nn, bn)]),
            args,
            consts: vec![],
            requires: vec![],
            writes: vec![c],
        });
        Ok(())
    }
}

/// Lowers a graph to its launch plan.
pub fn lower(g: &Graph) -> Result<Schedule, LowerError> {
    let uses = g.use_counts();
    let mut consumers = vec![Vec::new(); g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for o in crate::ir::graph::operands(&n.kind) {
            consumers[o.0 as usize].push(NodeId(i as u32));
        }
    }
    let mut l = Lower {
        g,
        uses,
        consumers,
        buffers: Vec::new(),
        buf_of: HashMap::new(),
        launches: Vec::new(),
        kernels: Vec::new(),
        temps: 0,
        cast_of: HashMap::new(),
        f32_of: HashMap::new(),
    };
    for (i, p) in g.params.iter().enumerate() {
        if let GType::Tensor { dims, dtype } = &p.ty {
            let b = l.add_buffer(p.name.clone(), BufKind::Input(i), dims.clone(), *dtype);
            if let Some(n) = g.nodes.iter().position(|n| n.kind == NodeKind::Param(i)) {
                l.buf_of.insert(NodeId(n as u32), b);
            }
        }
    }
    // Fusion: an elementwise node whose users are all elementwise and already in
    // one group, with no kernel call between it and them, joins that group (so a
    // value used twice inside one chain, as in `t * sigmoid(t)`, is computed once
    // in registers); results and other nodes root their own group.
    let n = g.nodes.len();
    let is_output = |x: usize| g.outputs.contains(&NodeId(x as u32));
    let mut root_of: Vec<NodeId> = (0..n).map(|i| NodeId(i as u32)).collect();
    for i in (0..n).rev() {
        let id = NodeId(i as u32);
        let users = &l.consumers[i];
        if !is_elementwise(g, id) || is_output(i) || users.is_empty() {
            continue;
        }
        let root = root_of[users[0].0 as usize];
        let last = users.iter().map(|u| u.0 as usize).max().unwrap_or(i);
        let effect_between = g.nodes[i + 1..last]
            .iter()
            .any(|x| matches!(x.kind, NodeKind::KernelCall { .. }));
        if !effect_between
            && users
                .iter()
                .all(|u| is_elementwise(g, *u) && root_of[u.0 as usize] == root)
        {
            root_of[i] = root;
        }
    }
    // Attention patterns: the final matmul absorbs its producers.
    let mut absorbed = vec![false; n];
    let mut attention = HashMap::new();
    for i in 0..n {
        if let Some(m) = l.attention(NodeId(i as u32)) {
            for a in &m.4 {
                absorbed[a.0 as usize] = true;
            }
            attention.insert(i, m);
        }
    }
    // Output buffers for results a launch can write directly.
    let mut out_for: HashMap<NodeId, BufId> = HashMap::new();
    let mut outputs = Vec::new();
    for (k, &o) in g.outputs.iter().enumerate() {
        let node = g.node(o);
        let name = if g.outputs.len() == 1 {
            "out".to_string()
        } else {
            format!("out{k}")
        };
        let GType::Tensor { dims, dtype } = &node.ty else {
            return Err(LowerError::new(
                node.span,
                "returning a scalar from a whole-tensor function",
            ));
        };
        let b = l.add_buffer(name, BufKind::Output(k), dims.clone(), *dtype);
        outputs.push(b);
        let direct = match &node.kind {
            _ if out_for.contains_key(&o) => false,
            _ if is_elementwise(g, o) => true,
            NodeKind::MatMul { .. } => {
                *dtype == DType::F32 || attention.contains_key(&(o.0 as usize))
            }
            NodeKind::LayerNorm { .. } | NodeKind::RmsNorm { .. } => {
                *dtype == DType::F32 || !l.norm_fits_std(o)
            }
            NodeKind::Softmax { .. }
            | NodeKind::Reduce { .. }
            | NodeKind::Transpose { .. }
            | NodeKind::Fill(Fill::Empty) => true,
            _ => false,
        };
        if direct {
            out_for.insert(o, b);
        }
    }
    for i in 0..n {
        let id = NodeId(i as u32);
        let node = g.node(id);
        if absorbed[i] || node.ty.is_scalar() || matches!(node.kind, NodeKind::Param(_)) {
            continue;
        }
        let out = out_for.get(&id).copied();
        if is_elementwise(g, id) {
            if root_of[i] != id {
                continue;
            }
            let members: Vec<NodeId> = (0..=i)
                .map(|j| NodeId(j as u32))
                .filter(|&j| root_of[j.0 as usize] == id && is_elementwise(g, j))
                .collect();
            let dims = node.ty.dims().to_vec();
            let b = match out {
                Some(b) => b,
                None => l.temp(dims, node.ty.dtype().unwrap_or(DType::F32)),
            };
            l.fused(
                &Group {
                    members,
                    root: id,
                    copy: false,
                },
                b,
            )?;
            l.buf_of.insert(id, b);
            continue;
        }
        match &node.kind {
            NodeKind::MatMul { .. } => match attention.remove(&i) {
                Some(m) => l.lower_attention(id, m, out)?,
                None => l.lower_matmul(id, out)?,
            },
            NodeKind::Reduce { op, x, axis, .. }
                if !(*op != ReduceKind::Min
                    && *axis == Some(g.ty(*x).dims().len().saturating_sub(1))
                    && g.ty(*x).dtype() == Some(DType::F32)
                    && l.buf(*x, id)
                        .is_ok_and(|b| l.buffers[b.0 as usize].dtype == DType::F32)) =>
            {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.reduce_generated(id, b)?;
                l.buf_of.insert(id, b);
            }
            NodeKind::LayerNorm { .. } | NodeKind::RmsNorm { .. } if !l.norm_fits_std(id) => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.norm_generated(id, b)?;
                l.buf_of.insert(id, b);
            }
            NodeKind::Softmax { x, axis }
                if !(*axis + 1 == g.ty(*x).dims().len()
                    && g.ty(*x).dtype() == Some(DType::F32)
                    && l.buf(*x, id)
                        .is_ok_and(|b| l.buffers[b.0 as usize].dtype == DType::F32)) =>
            {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.softmax_generated(id, b)?;
                l.buf_of.insert(id, b);
            }
            NodeKind::Softmax { .. }
            | NodeKind::LayerNorm { .. }
            | NodeKind::RmsNorm { .. }
            | NodeKind::Reduce { .. } => l.lower_rows(id, out)?,
            NodeKind::Reshape { x } => {
                let base = l.buf(*x, id)?;
                let name = format!("v{}", l.buffers.len());
                let dtype = l.buffers[base.0 as usize].dtype;
                let v = l.add_buffer(name, BufKind::View(base), node.ty.dims().to_vec(), dtype);
                l.buf_of.insert(id, v);
            }
            NodeKind::Fill(Fill::Empty) => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.buffers[b.0 as usize].alloc = true;
                l.buf_of.insert(id, b);
            }
            NodeKind::KernelCall {
                kernel,
                grid,
                args,
                consts,
            } => {
                let mut largs = Vec::new();
                let mut writes = Vec::new();
                for (name, a) in args {
                    if g.ty(*a).is_scalar() {
                        largs.push((name.clone(), Arg::Scalar(l.scalar(*a)?)));
                    } else {
                        let b = l.buf_as(*a, id)?;
                        writes.push(b);
                        largs.push((
                            name.clone(),
                            Arg::Buffer {
                                buf: b,
                                dims: g.ty(*a).dims().to_vec(),
                            },
                        ));
                    }
                }
                let grid = match grid {
                    Some(gr) => Some(gr.iter().map(|x| l.scalar(*x)).collect::<R<Vec<_>>>()?),
                    None => None,
                };
                l.launch(Launch {
                    kernel: KernelRef::User(kernel.clone()),
                    nodes: vec![id],
                    grid,
                    args: largs,
                    consts: consts
                        .iter()
                        .map(|(n, v)| (n.clone(), v.to_string()))
                        .collect(),
                    requires: vec![],
                    writes,
                });
            }
            NodeKind::Transpose { .. } => {
                let b = match out {
                    Some(b) => b,
                    None => l.temp(
                        node.ty.dims().to_vec(),
                        node.ty.dtype().unwrap_or(DType::F32),
                    ),
                };
                l.transpose(id, b)?;
                l.buf_of.insert(id, b);
            }
            NodeKind::Fill(Fill::Randn { .. }) => {
                return Err(l.unsupported(id, "`randn` (no random-number kernel yet)"))
            }
            NodeKind::Call { func, .. } => {
                return Err(l.unsupported(
                    id,
                    format!("the call to `{func}`: it is recursive, its definition cannot be found, its dims do not bind or a const argument is not a literal"),
                ))
            }
            other => return Err(l.unsupported(id, format!("{other:?}"))),
        }
    }
    // Results not written in place: copy (and cast) into the output buffer.
    for (k, &o) in g.outputs.iter().enumerate() {
        let ob = outputs[k];
        if l.buf_of.get(&o) == Some(&ob) {
            continue;
        }
        l.buf(o, o)?;
        l.fused(
            &Group {
                members: vec![],
                root: o,
                copy: true,
            },
            ob,
        )?;
    }
    let s = Schedule {
        name: g.name.clone(),
        buffers: l.buffers,
        launches: l.launches,
        kernels: l.kernels,
        outputs,
    };
    Ok(s)
}

fn arg_str(s: &Schedule, a: &Arg) -> String {
    match a {
        Arg::Buffer { buf, dims } => {
            let b = s.buffer(*buf);
            if *dims == b.dims {
                b.name.clone()
            } else {
                format!("{} as {}", b.name, crate::check::types::render_dims(dims))
            }
        }
        Arg::Scalar(e) => e.to_string(),
    }
}

/// Checks the plan: arguments name existing buffers with the right element
/// count, every buffer a launch reads was written (or is an input or an
/// allocation) before, every output is written, and generated kernels are
/// well-formed Tile IR with one argument per parameter.
pub fn verify(s: &Schedule) -> Result<(), String> {
    let err = |m: String| Err(format!("schedule `{}`: {m}", s.name));
    let count = |d: &[Dim]| product(d);
    for (i, b) in s.buffers.iter().enumerate() {
        if let BufKind::View(of) = b.kind {
            if of.0 as usize >= i {
                return err(format!("view `{}` of a later buffer", b.name));
            }
            if count(&b.dims) != count(&s.buffer(of).dims) {
                return err(format!("view `{}` changes the element count", b.name));
            }
        }
    }
    let mut written: Vec<bool> = s
        .buffers
        .iter()
        .map(|b| b.alloc || matches!(b.kind, BufKind::Input(_)))
        .collect();
    for (li, l) in s.launches.iter().enumerate() {
        for (name, a) in &l.args {
            if let Arg::Buffer { buf, dims } = a {
                if buf.0 as usize >= s.buffers.len() {
                    return err(format!("launch {li}: `{name}` names no buffer"));
                }
                if count(dims) != count(&s.buffer(*buf).dims) {
                    return err(format!(
                        "launch {li}: `{name}` is viewed with another element count"
                    ));
                }
                let base = s.base(*buf);
                if !l.writes.contains(buf) && !written[base.0 as usize] {
                    return err(format!(
                        "launch {li}: `{name}` reads `{}` before it is written",
                        s.buffer(*buf).name
                    ));
                }
            }
        }
        for w in &l.writes {
            written[s.base(*w).0 as usize] = true;
        }
        if let Some(g) = &l.grid {
            if g.is_empty() || g.len() > 3 {
                return err(format!("launch {li}: a grid of rank {}", g.len()));
            }
        }
        if let KernelRef::Generated(k) = l.kernel {
            let Some(kernel) = s.kernels.get(k) else {
                return err(format!("launch {li}: no generated kernel {k}"));
            };
            if kernel.params.len() != l.args.len()
                || kernel.params.iter().zip(&l.args).any(|(p, (n, a))| {
                    p.name != *n
                        || match (&p.kind, a) {
                            (ParamKind::Tensor { dims, dtype }, Arg::Buffer { buf, dims: ad }) => {
                                dims.len() != ad.len() || *dtype != s.buffer(*buf).dtype
                            }
                            (ParamKind::Scalar(_), Arg::Scalar(_)) => false,
                            _ => true,
                        }
                })
            {
                return err(format!(
                    "launch {li}: arguments do not match `{}`'s parameters",
                    kernel.name
                ));
            }
            verify_kernel(kernel)?;
            let errors = tile::verify(kernel);
            if !errors.is_empty() {
                return err(format!(
                    "generated kernel `{}`: {}",
                    kernel.name,
                    errors.join("; ")
                ));
            }
        }
    }
    for o in &s.outputs {
        if !written[s.base(*o).0 as usize] {
            return err(format!("output `{}` is never written", s.buffer(*o).name));
        }
    }
    Ok(())
}

/// A structural check of a generated Tile IR kernel: values defined once and
/// before use (region arguments at the region's start), elementwise operands
/// of equal types, loads and stores matching their accesses, loop bounds of one
/// integer type, loop bodies yielding their carried types. (The Tile IR
/// verifier proper checks every typing rule.)
pub fn verify_kernel(k: &Kernel) -> Result<(), String> {
    let mut defined = vec![false; k.types.len()];
    verify_region(k, &k.body, &mut defined, None).map_err(|m| format!("kernel `{}`: {m}", k.name))
}

fn verify_region(
    k: &Kernel,
    r: &Region,
    defined: &mut Vec<bool>,
    carried: Option<&[Value]>,
) -> Result<(), String> {
    let define = |v: Value, defined: &mut Vec<bool>| match defined.get_mut(v.0 as usize) {
        Some(d) if !*d => {
            *d = true;
            Ok(())
        }
        _ => Err(format!("%{} defined twice or without a type", v.0)),
    };
    for a in &r.args {
        define(*a, defined)?;
    }
    for (i, op) in r.ops.iter().enumerate() {
        let access_uses = |a: &[Access]| -> Vec<Value> {
            a.iter()
                .map(|a| match a {
                    Access::Point(v) | Access::Range { start: v, .. } => *v,
                })
                .collect()
        };
        let uses: Vec<Value> = match &op.kind {
            OpKind::Unary { x, .. }
            | OpKind::Transpose { x }
            | OpKind::Cast { x, .. }
            | OpKind::Splat { x, .. }
            | OpKind::Broadcast { x, .. }
            | OpKind::ExpandDims { x, .. }
            | OpKind::Reduce { x, .. } => vec![*x],
            OpKind::Binary { a, b, .. } => vec![*a, *b],
            OpKind::Select { cond, a, b } => vec![*cond, *a, *b],
            OpKind::Load { access, .. } => access_uses(access),
            OpKind::Store { access, value, .. } => {
                let mut u = access_uses(access);
                u.push(*value);
                u
            }
            OpKind::For {
                lo, hi, step, init, ..
            } => [*lo, *hi, *step]
                .into_iter()
                .chain(init.iter().copied())
                .collect(),
            OpKind::Yield(vs) => vs.clone(),
            _ => vec![],
        };
        for u in &uses {
            if !defined.get(u.0 as usize).copied().unwrap_or(false) {
                return Err(format!("op {i}: %{} used before its definition", u.0));
            }
        }
        match &op.kind {
            OpKind::Binary { a, b, .. } | OpKind::Select { a, b, .. } if k.ty(*a) != k.ty(*b) => {
                return Err(format!("op {i}: operands of different types"))
            }
            OpKind::Load { tensor, access, .. } | OpKind::Store { tensor, access, .. } => {
                let Some(ParamKind::Tensor { dims, .. }) = k.params.get(*tensor).map(|p| &p.kind)
                else {
                    return Err(format!("op {i}: param {tensor} is not a tensor"));
                };
                if dims.len() != access.len() {
                    return Err(format!("op {i}: access rank differs from the tensor's"));
                }
                let lens: Vec<u32> = access
                    .iter()
                    .filter_map(|a| match a {
                        Access::Range { len, .. } => Some(*len),
                        Access::Point(_) => None,
                    })
                    .collect();
                let tile = match &op.kind {
                    OpKind::Store { value, .. } => k.ty(*value).shape().to_vec(),
                    _ => k.types[op.results[0].0 as usize].shape().to_vec(),
                };
                if lens != tile {
                    return Err(format!("op {i}: tile shape differs from the access"));
                }
            }
            OpKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let t = k.ty(*lo);
                if !matches!(t, Type::Scalar(d) if d.is_int()) || k.ty(*hi) != t || k.ty(*step) != t
                {
                    return Err(format!(
                        "op {i}: loop bounds of different or non-integer types"
                    ));
                }
                if body.args.len() != init.len() + 1 || op.results.len() != init.len() {
                    return Err(format!("op {i}: loop arity"));
                }
                verify_region(k, body, defined, Some(init))?;
            }
            OpKind::Yield(vs) => {
                let Some(c) = carried else {
                    return Err(format!("op {i}: a yield in the kernel body"));
                };
                if vs.len() != c.len() || vs.iter().zip(c).any(|(v, c)| k.ty(*v) != k.ty(*c)) {
                    return Err(format!(
                        "op {i}: the yield does not match the carried values"
                    ));
                }
            }
            _ => {}
        }
        for res in &op.results {
            define(*res, defined)?;
        }
    }
    if carried.is_some() && !matches!(r.ops.last().map(|o| &o.kind), Some(OpKind::Yield(_))) {
        return Err("a loop body that does not end with a yield".into());
    }
    Ok(())
}

/// The textual dump: buffers, launches in order, outputs, then the generated kernels.
pub fn dump(s: &Schedule) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "schedule {}", s.name);
    let _ = writeln!(out, "buffers:");
    for b in &s.buffers {
        let kind = match &b.kind {
            BufKind::Input(_) => "input".to_string(),
            BufKind::Output(_) => "output".to_string(),
            BufKind::Temp => "temp".to_string(),
            BufKind::View(of) => format!("view of {}", s.buffer(*of).name),
        };
        let kind = if b.alloc {
            format!("{kind} (empty)")
        } else {
            kind
        };
        let t = GType::Tensor {
            dims: b.dims.clone(),
            dtype: b.dtype,
        };
        let _ = writeln!(out, "  {}: {t} {kind}", b.name);
    }
    let _ = writeln!(out, "launches:");
    for (i, l) in s.launches.iter().enumerate() {
        let kname = match &l.kernel {
            KernelRef::Std { module, name } => format!("{module}.{name}"),
            KernelRef::User(n) => n.clone(),
            KernelRef::Generated(k) => format!("{} (generated)", s.kernels[*k].name),
        };
        let grid = match &l.grid {
            Some(g) => format!(
                "({}{})",
                g.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                if g.len() == 1 { "," } else { "" }
            ),
            None => "@kernel".into(),
        };
        let nodes: Vec<String> = l.nodes.iter().map(|n| n.to_string()).collect();
        let _ = writeln!(
            out,
            "  {i}: {kname} grid={grid} nodes=[{}]",
            nodes.join(", ")
        );
        let args: Vec<String> = l
            .args
            .iter()
            .map(|(n, a)| format!("{n}={}", arg_str(s, a)))
            .chain(l.consts.iter().map(|(n, v)| format!("{n}={v}")))
            .collect();
        let _ = writeln!(out, "       ({})", args.join(", "));
        for r in &l.requires {
            let _ = writeln!(out, "       requires {r}");
        }
    }
    let outs: Vec<&str> = s
        .outputs
        .iter()
        .map(|o| s.buffer(*o).name.as_str())
        .collect();
    let _ = writeln!(out, "outputs: {}", outs.join(", "));
    for k in &s.kernels {
        out.push('\n');
        out.push_str(&k.dump());
    }
    out
}
