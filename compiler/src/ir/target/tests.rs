//! Target IR tests over hand-built Tile IR kernels, mirroring the reference
//! programs (vadd, row softmax, a tiled gemm with a carried accumulator) and
//! exercising every elementwise op, cast, mask and control-flow form: each
//! lowers and verifies for every NVIDIA arch (and `backend/ptx/tests.rs`
//! assembles them), and the layouts cover their tiles. The code-generation
//! rules over checked source are the codegen filetests, `tests/codegen/`.

use crate::check::DType;
use crate::ir::tile::{
    Access, BinaryOp, Constant, Dim, Kernel, Op, OpKind, Param, ParamKind, Precision, ReduceOp,
    Region, Type, UnaryOp, Value,
};
use crate::syntax::span::Span;
use crate::target::Arch;

use super::layout::{Layout, WarpOrder};
use super::{lower, verify::verify, Inst, MemTy, Space, Swizzle};
use crate::db::{file_kernels, target_ir, Database};
use crate::ir::tile::Specialization;

/// The first kernel of `src` as the front doors lower it (through the
/// database): Target IR for `arch` with `spec`, verified.
pub(crate) fn lower_source(src: &str, arch: Arch, spec: Specialization) -> super::Kernel {
    let mut db = Database::new();
    db.set_arch(arch);
    let file = db.set_source("/t/k.tsr", src.to_string());
    let (_, item, _) = file_kernels(&db, file)
        .into_iter()
        .next()
        .expect("a kernel");
    let k = (*target_ir(&db, item, db.options(), spec)
        .clone()
        .expect("it lowers"))
    .clone();
    verify(&k).unwrap_or_else(|e| panic!("verifier:\n{e}"));
    k
}

/// The stores of `k` to `space`, in program order: (memory type, values).
pub(crate) fn stores(k: &super::Kernel, space: Space) -> Vec<(MemTy, usize)> {
    let mut out = Vec::new();
    k.walk(&mut |i| {
        if let Inst::St {
            space: s, mem, src, ..
        } = i
        {
            if *s == space {
                out.push((*mem, src.len()));
            }
        }
    });
    out
}

/// Builds a Tile IR kernel op by op.
pub(crate) struct Builder {
    types: Vec<Type>,
    stack: Vec<Vec<Op>>,
    params: Vec<Param>,
}

pub(crate) fn tile(shape: &[u32], d: DType) -> Type {
    Type::Tile {
        shape: shape.to_vec(),
        dtype: d,
    }
}

pub(crate) fn tensor(name: &str, dims: &[&str], d: DType) -> Param {
    Param {
        name: name.into(),
        kind: ParamKind::Tensor {
            dims: dims
                .iter()
                .map(|s| match s.parse::<u64>() {
                    Ok(n) => Dim::Static(n),
                    Err(_) => Dim::Dynamic((*s).into()),
                })
                .collect(),
            dtype: d,
        },
    }
}

impl Builder {
    pub(crate) fn new(params: Vec<Param>) -> Builder {
        Builder {
            types: Vec::new(),
            stack: vec![Vec::new()],
            params,
        }
    }

    pub(crate) fn value(&mut self, t: Type) -> Value {
        self.types.push(t);
        Value(self.types.len() as u32 - 1)
    }

    pub(crate) fn op(&mut self, kind: OpKind, results: Vec<Type>) -> Vec<Value> {
        let results: Vec<Value> = results.into_iter().map(|t| self.value(t)).collect();
        self.stack.last_mut().unwrap().push(Op {
            results: results.clone(),
            kind,
            span: Span::default(),
        });
        results
    }

    pub(crate) fn one(&mut self, kind: OpKind, t: Type) -> Value {
        self.op(kind, vec![t])[0]
    }

    pub(crate) fn int(&mut self, n: i64) -> Value {
        self.one(OpKind::Const(Constant::Int(n)), Type::Scalar(DType::I32))
    }

    pub(crate) fn float(&mut self, f: f64) -> Value {
        self.one(OpKind::Const(Constant::Float(f)), Type::Scalar(DType::F32))
    }

    pub(crate) fn bin(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        let t = self.types[a.0 as usize].clone();
        let t = if op.is_comparison() {
            match t {
                Type::Scalar(_) => Type::Scalar(DType::Bool),
                Type::Tile { shape, .. } => tile(&shape, DType::Bool),
            }
        } else {
            t
        };
        self.one(OpKind::Binary { op, a, b }, t)
    }

    pub(crate) fn un(&mut self, op: UnaryOp, x: Value) -> Value {
        let t = self.types[x.0 as usize].clone();
        self.one(OpKind::Unary { op, x }, t)
    }

    pub(crate) fn splat(&mut self, x: Value, shape: &[u32]) -> Value {
        let d = self.types[x.0 as usize].dtype();
        self.one(
            OpKind::Splat {
                x,
                shape: shape.to_vec(),
            },
            tile(shape, d),
        )
    }

    pub(crate) fn cast(&mut self, x: Value, to: DType) -> Value {
        let t = match &self.types[x.0 as usize] {
            Type::Scalar(_) => Type::Scalar(to),
            Type::Tile { shape, .. } => tile(shape, to),
        };
        self.one(OpKind::Cast { x, to }, t)
    }

    pub(crate) fn load(&mut self, tensor: usize, access: Vec<Access>, other: Constant) -> Value {
        let d = match &self.params[tensor].kind {
            ParamKind::Tensor { dtype, .. } => *dtype,
            _ => panic!("not a tensor"),
        };
        let shape: Vec<u32> = access
            .iter()
            .filter_map(|a| match a {
                Access::Range { len, .. } => Some(*len),
                _ => None,
            })
            .collect();
        self.one(
            OpKind::Load {
                tensor,
                access,
                mask: None,
                other,
            },
            tile(&shape, d),
        )
    }

    pub(crate) fn store(&mut self, tensor: usize, access: Vec<Access>, value: Value) {
        self.op(
            OpKind::Store {
                tensor,
                access,
                value,
                mask: None,
            },
            vec![],
        );
    }

    pub(crate) fn reduce(&mut self, op: ReduceOp, x: Value, axis: usize, keepdims: bool) -> Value {
        let t = self.types[x.0 as usize].clone();
        let mut shape = t.shape().to_vec();
        if keepdims {
            shape[axis] = 1;
        } else {
            shape.remove(axis);
        }
        let rt = if shape.is_empty() {
            Type::Scalar(t.dtype())
        } else {
            tile(&shape, t.dtype())
        };
        self.one(
            OpKind::Reduce {
                op,
                x,
                axis,
                keepdims,
            },
            rt,
        )
    }

    pub(crate) fn push(&mut self) {
        self.stack.push(Vec::new());
    }

    pub(crate) fn pop(&mut self, args: Vec<Value>, yields: Vec<Value>) -> Region {
        self.stack.last_mut().unwrap().push(Op {
            results: vec![],
            kind: OpKind::Yield(yields),
            span: Span::default(),
        });
        Region {
            args,
            ops: self.stack.pop().unwrap(),
        }
    }

    pub(crate) fn finish(mut self, name: &str, num_warps: u32) -> Kernel {
        Kernel {
            name: name.into(),
            specialization: vec![],
            divisibility: vec![],
            divisibility_trusted: false,
            params: self.params,
            num_warps,
            num_stages: 1,
            body: Region {
                args: vec![],
                ops: self.stack.pop().unwrap(),
            },
            types: self.types,
        }
    }
}

fn range(start: Value, len: u32) -> Access {
    Access::Range { start, len }
}

/// `vadd` from the language brief (BLOCK = 1024, 4 warps).
pub(crate) fn vadd() -> Kernel {
    let f = DType::F32;
    let mut b = Builder::new(vec![
        tensor("x", &["N"], f),
        tensor("y", &["N"], f),
        tensor("out", &["N"], f),
    ]);
    let pid = b.one(OpKind::ProgramId(0), Type::Scalar(DType::I32));
    let blk = b.int(1024);
    let i = b.bin(BinaryOp::Mul, pid, blk);
    let x = b.load(0, vec![range(i, 1024)], Constant::Int(0));
    let y = b.load(1, vec![range(i, 1024)], Constant::Int(0));
    let s = b.bin(BinaryOp::Add, x, y);
    b.store(2, vec![range(i, 1024)], s);
    b.finish("vadd", 4)
}

/// `softmax_rows` from the language brief (BLOCK = 1024, 4 warps).
pub(crate) fn softmax_rows() -> Kernel {
    let f = DType::F32;
    let mut b = Builder::new(vec![
        tensor("x", &["M", "N"], f),
        tensor("out", &["M", "N"], f),
    ]);
    let row = b.one(OpKind::ProgramId(0), Type::Scalar(DType::I32));
    let zero = b.int(0);
    let v = b.load(
        0,
        vec![Access::Point(row), range(zero, 1024)],
        Constant::Float(f64::NEG_INFINITY),
    );
    let m = b.reduce(ReduceOp::Max, v, 0, false);
    let ms = b.splat(m, &[1024]);
    let d = b.bin(BinaryOp::Sub, v, ms);
    let e = b.un(UnaryOp::Exp, d);
    let s = b.reduce(ReduceOp::Sum, e, 0, false);
    let ss = b.splat(s, &[1024]);
    let r = b.bin(BinaryOp::Div, e, ss);
    b.store(1, vec![Access::Point(row), range(zero, 1024)], r);
    b.finish("softmax_rows", 4)
}

/// A block of rows of an f16 matrix with a static row length: reduce along
/// axis 1, expand and broadcast back (the softmax of the stdlib), vectorised.
pub(crate) fn softmax_block_f16() -> Kernel {
    let h = DType::F16;
    let mut b = Builder::new(vec![
        tensor("x", &["M", "128"], h),
        tensor("out", &["M", "128"], h),
    ]);
    let pid = b.one(OpKind::ProgramId(0), Type::Scalar(DType::I32));
    let bm = b.int(16);
    let r0 = b.bin(BinaryOp::Mul, pid, bm);
    let zero = b.int(0);
    let x = b.load(
        0,
        vec![range(r0, 16), range(zero, 128)],
        Constant::Float(f64::NEG_INFINITY),
    );
    let x = b.cast(x, DType::F32);
    let m = b.reduce(ReduceOp::Max, x, 1, false);
    let me = b.one(
        OpKind::ExpandDims { x: m, axis: 1 },
        tile(&[16, 1], DType::F32),
    );
    let mb = b.one(
        OpKind::Broadcast {
            x: me,
            shape: vec![16, 128],
        },
        tile(&[16, 128], DType::F32),
    );
    let d = b.bin(BinaryOp::Sub, x, mb);
    let e = b.un(UnaryOp::Exp, d);
    let s = b.reduce(ReduceOp::Sum, e, 1, true);
    let sb = b.one(
        OpKind::Broadcast {
            x: s,
            shape: vec![16, 128],
        },
        tile(&[16, 128], DType::F32),
    );
    let r = b.bin(BinaryOp::Div, e, sb);
    let r = b.cast(r, h);
    b.store(1, vec![range(r0, 16), range(zero, 128)], r);
    b.finish("softmax_block_f16", 4)
}

/// The brief's tiled gemm (f16 in, f32 out) with a loop-carried accumulator.
pub(crate) fn gemm(bm: u32, bn: u32, bk: u32, num_warps: u32, h: DType) -> Kernel {
    gemm_p(bm, bn, bk, num_warps, h, Precision::Ieee)
}

pub(crate) fn gemm_p(
    bm: u32,
    bn: u32,
    bk: u32,
    num_warps: u32,
    h: DType,
    precision: Precision,
) -> Kernel {
    let mut b = Builder::new(vec![
        tensor("A", &["M", "K"], h),
        tensor("B", &["K", "N"], h),
        tensor("C", &["M", "N"], DType::F32),
    ]);
    let p0 = b.one(OpKind::ProgramId(0), Type::Scalar(DType::I32));
    let p1 = b.one(OpKind::ProgramId(1), Type::Scalar(DType::I32));
    let cbm = b.int(bm as i64);
    let cbn = b.int(bn as i64);
    let m0 = b.bin(BinaryOp::Mul, p0, cbm);
    let n0 = b.bin(BinaryOp::Mul, p1, cbn);
    let z = b.float(0.0);
    let acc0 = b.splat(z, &[bm, bn]);
    let lo = b.int(0);
    let hi = b.one(
        OpKind::TensorDim { param: 0, axis: 1 },
        Type::Scalar(DType::I32),
    );
    let step = b.int(bk as i64);
    b.push();
    let k = b.value(Type::Scalar(DType::I32));
    let acc = b.value(tile(&[bm, bn], DType::F32));
    let a = b.load(0, vec![range(m0, bm), range(k, bk)], Constant::Int(0));
    let bt = b.load(1, vec![range(k, bk), range(n0, bn)], Constant::Int(0));
    let d = b.one(
        OpKind::Dot {
            a,
            b: bt,
            acc: Some(acc),
            precision,
        },
        tile(&[bm, bn], DType::F32),
    );
    let body = b.pop(vec![k, acc], vec![d]);
    let res = b.op(
        OpKind::For {
            lo,
            hi,
            step,
            init: vec![acc0],
            body,
        },
        vec![tile(&[bm, bn], DType::F32)],
    )[0];
    b.store(2, vec![range(m0, bm), range(n0, bn)], res);
    let p = if precision == Precision::Tf32 {
        "tf32_"
    } else {
        ""
    };
    b.finish(&format!("gemm_{p}{}_{bm}x{bn}x{bk}", h.name()), num_warps)
}

/// Every elementwise op, casts between dtypes, a user mask, `where`, `arange`,
/// a loop whose trip count is a run-time scalar, `while`, `if` on a reduced
/// scalar, and `atomic_add`.
pub(crate) fn everything() -> Kernel {
    let f = DType::F32;
    let mut b = Builder::new(vec![
        tensor("x", &["N"], f),
        tensor("y", &["N"], DType::BF16),
        tensor("flags", &["N"], DType::Bool),
        tensor("idx", &["N"], DType::I8),
        tensor("out", &["N"], f),
        tensor("total", &["1"], f),
        Param {
            name: "alpha".into(),
            kind: ParamKind::Scalar(f),
        },
        Param {
            name: "steps".into(),
            kind: ParamKind::Scalar(DType::I32),
        },
    ]);
    let n = 256u32;
    let pid = b.one(OpKind::ProgramId(0), Type::Scalar(DType::I32));
    let c = b.int(n as i64);
    let i = b.bin(BinaryOp::Mul, pid, c);
    let x = b.load(0, vec![range(i, n)], Constant::Float(1.0));
    let y = b.load(1, vec![range(i, n)], Constant::Int(0));
    let y = b.cast(y, f);
    let fl = b.load(2, vec![range(i, n)], Constant::Bool(false));
    let ix = b.load(3, vec![range(i, n)], Constant::Int(0));
    let ix = b.cast(ix, DType::I32);
    let mut v = x;
    for u in [
        UnaryOp::Exp,
        UnaryOp::Exp2,
        UnaryOp::Log,
        UnaryOp::Log2,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Abs,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Erf,
        UnaryOp::Neg,
    ] {
        let t = b.un(u, v);
        v = b.bin(BinaryOp::Add, t, y);
    }
    for op in [
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::FloorDiv,
        BinaryOp::Mod,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
    ] {
        v = b.bin(op, v, x);
    }
    // Integer ops on arange and the i8 tensor.
    let ar = b.one(OpKind::Arange { start: i, len: n }, tile(&[n], DType::I32));
    let three = b.int(3);
    let t3 = b.splat(three, &[n]);
    let mut iv = b.bin(BinaryOp::Add, ar, ix);
    for op in [
        BinaryOp::FloorDiv,
        BinaryOp::Mod,
        BinaryOp::Mul,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Xor,
        BinaryOp::Max,
        BinaryOp::Min,
        BinaryOp::Sub,
    ] {
        iv = b.bin(op, iv, t3);
    }
    let iv = b.un(UnaryOp::Invert, iv);
    let iv8 = b.cast(iv, DType::I8);
    let ivf = b.cast(iv8, f);
    let lt = b.bin(BinaryOp::Lt, ivf, v);
    let nf = b.un(UnaryOp::Not, fl);
    let both = b.bin(BinaryOp::And, lt, nf);
    let ne = b.bin(BinaryOp::Ne, both, fl);
    let w = b.one(
        OpKind::Select {
            cond: ne,
            a: v,
            b: ivf,
        },
        tile(&[n], f),
    );
    // Round through bf16 and f16.
    let wb = b.cast(w, DType::BF16);
    let wh = b.cast(wb, DType::F16);
    let w = b.cast(wh, f);
    // Scale by alpha `steps` times in a loop.
    let alpha = b.one(OpKind::ScalarParam(6), Type::Scalar(f));
    let steps = b.one(OpKind::ScalarParam(7), Type::Scalar(DType::I32));
    let one = b.int(1);
    let zero = b.int(0);
    b.push();
    let k = b.value(Type::Scalar(DType::I32));
    let acc = b.value(tile(&[n], f));
    let al = b.splat(alpha, &[n]);
    let acc2 = b.bin(BinaryOp::Mul, acc, al);
    let body = b.pop(vec![k, acc], vec![acc2]);
    let w = b.op(
        OpKind::For {
            lo: zero,
            hi: steps,
            step: one,
            init: vec![w],
            body,
        },
        vec![tile(&[n], f)],
    )[0];
    // while j < 3: j = j + 1 (a scalar counter) then use it.
    b.push();
    let j = b.value(Type::Scalar(DType::I32));
    let cnd = b.bin(BinaryOp::Lt, j, three);
    let cond = b.pop(vec![j], vec![cnd]);
    b.push();
    let j2 = b.value(Type::Scalar(DType::I32));
    let j3 = b.bin(BinaryOp::Add, j2, one);
    let body = b.pop(vec![j2], vec![j3]);
    let jf = b.op(
        OpKind::While {
            init: vec![zero],
            cond,
            body,
        },
        vec![Type::Scalar(DType::I32)],
    )[0];
    let jf = b.cast(jf, f);
    let jt = b.splat(jf, &[n]);
    let w = b.bin(BinaryOp::Add, w, jt);
    // A masked store: only where flags.
    b.op(
        OpKind::Store {
            tensor: 4,
            access: vec![range(i, n)],
            value: w,
            mask: Some(fl),
        },
        vec![],
    );
    // if sum(w) > 0: total += sum(w) else: total += -sum(w)
    let s = b.reduce(ReduceOp::Sum, w, 0, false);
    let zf = b.float(0.0);
    let pos = b.bin(BinaryOp::Gt, s, zf);
    b.push();
    let then = b.pop(vec![], vec![s]);
    b.push();
    let ns = b.un(UnaryOp::Neg, s);
    let otherwise = b.pop(vec![], vec![ns]);
    let r = b.op(
        OpKind::If {
            cond: pos,
            then,
            otherwise,
        },
        vec![Type::Scalar(f)],
    )[0];
    b.op(
        OpKind::AtomicAdd {
            tensor: 5,
            access: vec![Access::Point(zero)],
            value: r,
            mask: None,
        },
        vec![],
    );
    b.finish("everything", 2)
}

/// A transposed 2-D tile (layout relabelled) stored through a conversion, and
/// an arange broadcast against a row (the causal mask of flash attention).
pub(crate) fn causal_mask() -> Kernel {
    let f = DType::F32;
    let mut b = Builder::new(vec![
        tensor("s", &["S", "S"], f),
        tensor("o", &["S", "S"], f),
    ]);
    let p0 = b.one(OpKind::ProgramId(0), Type::Scalar(DType::I32));
    let c = b.int(64);
    let m0 = b.bin(BinaryOp::Mul, p0, c);
    let zero = b.int(0);
    let s = b.load(0, vec![range(m0, 64), range(zero, 32)], Constant::Int(0));
    let rows = b.one(
        OpKind::Arange { start: m0, len: 64 },
        tile(&[64], DType::I32),
    );
    let cols = b.one(
        OpKind::Arange {
            start: zero,
            len: 32,
        },
        tile(&[32], DType::I32),
    );
    let re = b.one(
        OpKind::ExpandDims { x: rows, axis: 1 },
        tile(&[64, 1], DType::I32),
    );
    let ce = b.one(
        OpKind::ExpandDims { x: cols, axis: 0 },
        tile(&[1, 32], DType::I32),
    );
    let rb = b.one(
        OpKind::Broadcast {
            x: re,
            shape: vec![64, 32],
        },
        tile(&[64, 32], DType::I32),
    );
    let cb = b.one(
        OpKind::Broadcast {
            x: ce,
            shape: vec![64, 32],
        },
        tile(&[64, 32], DType::I32),
    );
    let keep = b.bin(BinaryOp::Ge, rb, cb);
    let ninf = b.float(f64::NEG_INFINITY);
    let ni = b.splat(ninf, &[64, 32]);
    let m = b.one(
        OpKind::Select {
            cond: keep,
            a: s,
            b: ni,
        },
        tile(&[64, 32], f),
    );
    let t = b.one(OpKind::Transpose { x: m }, tile(&[32, 64], f));
    let t2 = b.one(OpKind::Transpose { x: t }, tile(&[64, 32], f));
    let mx = b.reduce(ReduceOp::Max, t, 0, false);
    let mxe = b.one(OpKind::ExpandDims { x: mx, axis: 1 }, tile(&[64, 1], f));
    let mxb = b.one(
        OpKind::Broadcast {
            x: mxe,
            shape: vec![64, 32],
        },
        tile(&[64, 32], f),
    );
    let out = b.bin(BinaryOp::Sub, t2, mxb);
    b.store(1, vec![range(m0, 64), range(zero, 32)], out);
    b.finish("causal_mask", 4)
}

/// 8-bit floats: `xq = x.to(f8)` stored as f8, and f8 tensors loaded and
/// stored as f32 (both formats).
pub(crate) fn f8_roundtrip() -> Kernel {
    let f = DType::F32;
    let mut b = Builder::new(vec![
        tensor("x", &["N"], f),
        tensor("q4", &["N"], DType::F8E4M3),
        tensor("q5", &["N"], DType::F8E5M2),
        tensor("d4", &["N"], f),
        tensor("d5", &["N"], f),
    ]);
    let pid = b.one(OpKind::ProgramId(0), Type::Scalar(DType::I32));
    let c = b.int(128);
    let i = b.bin(BinaryOp::Mul, pid, c);
    let x = b.load(0, vec![range(i, 128)], Constant::Int(0));
    let x4 = b.cast(x, DType::F8E4M3);
    b.store(1, vec![range(i, 128)], x4);
    let x5 = b.cast(x, DType::F8E5M2);
    b.store(2, vec![range(i, 128)], x5);
    for (t, out) in [(1, 3), (2, 4)] {
        let q = b.load(t, vec![range(i, 128)], Constant::Int(0));
        let qf = b.cast(q, f);
        b.store(out, vec![range(i, 128)], qf);
    }
    b.finish("f8_roundtrip", 4)
}

pub(crate) fn all_kernels() -> Vec<Kernel> {
    vec![
        vadd(),
        softmax_rows(),
        softmax_block_f16(),
        gemm(64, 64, 32, 4, DType::F16),
        gemm(128, 128, 32, 8, DType::F16),
        gemm(64, 32, 64, 4, DType::BF16),
        gemm(16, 16, 16, 4, DType::F16),
        gemm(32, 32, 16, 2, DType::F32),
        gemm_p(64, 64, 32, 4, DType::F32, Precision::Tf32),
        everything(),
        causal_mask(),
        f8_roundtrip(),
    ]
}

const NV: [Arch; 7] = [
    Arch::Sm70,
    Arch::Sm75,
    Arch::Sm80,
    Arch::Sm86,
    Arch::Sm89,
    Arch::Sm90,
    Arch::Sm90a,
];

#[test]
fn every_test_kernel_lowers_and_verifies_for_every_nvidia_arch() {
    for k in all_kernels() {
        for arch in NV {
            let t = lower(&k, arch).unwrap_or_else(|d| panic!("{} {arch}: {}", k.name, d.message));
            if let Err(e) = verify(&t) {
                panic!("{} {arch}: verifier:\n{e}", k.name);
            }
        }
    }
}

const AMD: [Arch; 3] = [Arch::Gfx90a, Arch::Gfx942, Arch::Gfx1100];

#[test]
fn every_test_kernel_lowers_and_verifies_for_every_amd_arch() {
    for k in all_kernels() {
        for arch in AMD {
            let t = lower(&k, arch).unwrap_or_else(|d| panic!("{} {arch}: {}", k.name, d.message));
            if let Err(e) = verify(&t) {
                panic!("{} {arch}: verifier:\n{e}", k.name);
            }
            let wave = arch.info().warp_size;
            assert_eq!(t.num_threads, k.num_warps * wave, "{} {arch}", k.name);
        }
    }
}

/// A row reduction's butterfly spans the whole wave: lane masks up to 32 on
/// CDNA's 64-wide waves, up to 16 on RDNA3's 32-wide ones.
#[test]
fn reductions_shuffle_across_the_whole_wave() {
    fn masks(insts: &[Inst], out: &mut Vec<u32>) {
        for i in insts {
            match i {
                Inst::ShflXor { lane_mask, .. } => out.push(*lane_mask),
                Inst::For { body, .. } => masks(body, out),
                Inst::While { cond, body, .. } => {
                    masks(cond, out);
                    masks(body, out);
                }
                Inst::If {
                    then, otherwise, ..
                } => {
                    masks(then, out);
                    masks(otherwise, out);
                }
                _ => {}
            }
        }
    }
    for (arch, top) in [(Arch::Sm90, 16), (Arch::Gfx942, 32), (Arch::Gfx1100, 16)] {
        let t = lower(&softmax_rows(), arch).unwrap();
        let mut m = Vec::new();
        masks(&t.body, &mut m);
        assert_eq!(m.iter().max(), Some(&top), "{arch}: {m:?}");
    }
}

#[test]
fn blocked_layout_covers_every_element_once_per_replica() {
    for (shape, warps) in [
        (vec![1024u32], 4u32),
        (vec![16, 128], 4),
        (vec![64, 32], 8),
        (vec![3, 100], 4),
        (vec![8], 4),
        (vec![1, 1], 2),
        (vec![128, 128], 8),
    ] {
        let l = Layout::blocked(&shape, warps, 32, 4);
        let n: u64 = shape.iter().map(|&d| d as u64).product();
        let threads = warps * 32;
        let mut count = vec![0u32; n as usize];
        for t in 0..threads {
            for s in &l.slots {
                let mut lin = 0u64;
                for d in 0..shape.len() {
                    let base: u32 = l.terms[d]
                        .iter()
                        .map(|tm| ((t >> tm.shift) & ((1 << tm.bits) - 1)) * tm.mul)
                        .sum();
                    let c = base + s[d];
                    assert!(c < shape[d], "{shape:?}: coordinate {c} out of range");
                    lin = lin * shape[d] as u64 + c as u64;
                }
                count[lin as usize] += 1;
            }
        }
        let rep = 1u32
            << l.replication_mask(threads.trailing_zeros() as u8)
                .count_ones();
        assert!(
            count.iter().all(|&c| c == rep),
            "{shape:?} x{warps}: counts {:?}, replication {rep}",
            &count[..count.len().min(16)]
        );
    }
}

/// The `[row, column]` of slot `slot` of thread `t` in a 2-D layout.
fn element_at(l: &Layout, t: u32, slot: &[u32]) -> (u32, u32) {
    let at = |d: usize| -> u32 {
        l.terms[d]
            .iter()
            .map(|tm| ((t >> tm.shift) & ((1 << tm.bits) - 1)) * tm.mul)
            .sum::<u32>()
            + slot[d]
    };
    (at(0), at(1))
}

/// Checks that every thread's every slot of the `[rows, cols]` layout `l`
/// over `threads` holds the element `want(thread, slot index)`, and that
/// every element is held once.
fn holds_each_element_once(
    l: &Layout,
    [rows, cols]: [u32; 2],
    threads: u32,
    want: impl Fn(u32, u32) -> (u32, u32),
) {
    let mut count = vec![0u32; (rows * cols) as usize];
    for t in 0..threads {
        for (si, s) in l.slots.iter().enumerate() {
            let (r, c) = element_at(l, t, s);
            assert_eq!(
                (r, c),
                want(t, si as u32),
                "{rows}x{cols}: thread {t} slot {si}"
            );
            count[(r * cols + c) as usize] += 1;
        }
    }
    assert!(count.iter().all(|&c| c == 1), "{rows}x{cols}");
}

#[test]
fn mma884_accumulator_matches_the_isa_fragment_map() {
    // PTX ISA, "Matrix Fragments for mma.m8n8k4" (.f32 accumulators): in the
    // 8x8 tile of quad-pair q (lanes 4q..4q+3, 4q+16..4q+19), register i of lane
    // l holds row (l & 1) + (i & 2) + 4 (l >> 4 & 1), column (l & 2) + (i & 1) + (i & 4).
    // Quad-pair bit 0 picks the row half, bit 1 the column half of the 16x16 tile.
    for (rows, cols, warps) in [
        (16u32, 16u32, 1u32),
        (64, 64, 4),
        (128, 128, 8),
        (32, 64, 4),
    ] {
        let l = Layout::mma884_accumulator(rows, cols, warps, WarpOrder::RowsFirst).unwrap();
        let (wm, wn) = match l.kind {
            super::LayoutKind::Mma { warps, .. } => (warps[0], warps[1]),
            _ => unreachable!(),
        };
        assert_eq!(wm * wn, warps);
        let (tm, tn) = (rows / wm, cols / wn);
        holds_each_element_once(&l, [rows, cols], warps * 32, |t, si| {
            let (lane, w) = (t % 32, t / 32);
            let q = (lane >> 2) & 3;
            let (tile, i) = (si / 8, si % 8);
            let (im, jn) = (tile / (tn / 16), tile % (tn / 16));
            let er = (w % wm) * tm
                + 16 * im
                + 8 * (q & 1)
                + (lane & 1)
                + (i & 2)
                + 4 * ((lane >> 4) & 1);
            let ec = (w / wm) * tn + 16 * jn + 8 * (q >> 1) + (lane & 2) + (i & 1) + (i & 4);
            (er, ec)
        });
    }
    assert!(Layout::mma884_accumulator(16, 8, 1, WarpOrder::RowsFirst).is_none());
}

/// `Layout::wgmma_accumulator`: thread `t` (lane `l`, warp `w` of
/// warpgroup `g`), slot `s` of tile `j` holds wgmma's element of the
/// warpgroup's `j`-th m64 instruction: row `64 t g + 64 j + 16 w + l / 4
/// (+ 8)`, column `8 c + 2 (l % 4) (+ 1)`; every element once. With one
/// tile a warp it maps as `mma_accumulator`.
#[test]
fn wgmma_accumulator_gives_each_instruction_the_rows_it_reads() {
    for (rows, cols, warps) in [
        (128u32, 128u32, 4u32),
        (256, 128, 8),
        (256, 64, 4),
        (64, 64, 4),
        (128, 256, 8),
    ] {
        let l = Layout::wgmma_accumulator(rows, cols, warps).unwrap();
        let tiles = rows / (16 * warps);
        let per_tile = cols / 8 * 4;
        holds_each_element_once(&l, [rows, cols], warps * 32, |t, si| {
            let (lane, w, g) = (t % 32, t / 32 % 4, t / 128);
            let (j, i) = (si / per_tile, si % per_tile);
            let (cb, e) = (i / 4, i % 4);
            let er = 64 * tiles * g + 64 * j + 16 * w + lane / 4 + 8 * (e / 2);
            (er, 8 * cb + 2 * (lane % 4) + e % 2)
        });
        if tiles == 1 {
            let m = Layout::mma_accumulator(rows, cols, warps, WarpOrder::RowsFirst).unwrap();
            holds_each_element_once(&l, [rows, cols], warps * 32, |t, si| {
                element_at(&m, t, &m.slots[si as usize])
            });
        }
    }
    assert!(Layout::wgmma_accumulator(96, 64, 4).is_none());
    assert!(Layout::wgmma_accumulator(128, 64, 2).is_none());
}

/// The asynchronous-copy plan of the brief's gemm and flash attention, as
/// `lower` decides it: the operand loads are the candidates everywhere; on
/// sm_80+ they are pipelined over `num_stages` when their rows are provably
/// 16-byte aligned (K and N fixed; D fixed), gemm's one dot is rotated (its
/// first k step loaded an iteration early; attention's two dots are not) or,
/// on sm_90a, runs on wgmma (copied one iteration less ahead: a wgmma group
/// stays in flight),
/// attention's q is copied once before its loop (on sm_90a its two dots run
/// on wgmma, each waited for where it is issued), and without that proof they
/// stay in registers.
/// Hopper's n-major operand layout: 128-byte panels of a tile's rows, each
/// stored whole (`[rows, 128 B]`) and swizzled as 128-byte rows.
#[test]
fn panel_swizzle_stores_128_byte_panels_one_after_another() {
    let sw = Swizzle::panels(512, 32);
    // Row 0: panel p at p * 32 * 128, chunks in place.
    assert_eq!(sw.offset(0, 0, 2), 0);
    assert_eq!(sw.offset(0, 64, 2), 4096);
    assert_eq!(sw.offset(0, 200, 2), 3 * 4096 + 16);
    // Row 9 of panel 1, chunk 2: chunk 2 ^ (9 % 8) = 3.
    assert_eq!(sw.offset(9, 64 + 16, 2), 4096 + 9 * 128 + 3 * 16);
    // Every element of a [32, 256] 16-bit tile at its own 16-bit slot.
    let mut seen = std::collections::HashSet::new();
    for r in 0..32 {
        for c in 0..256 {
            assert!(seen.insert(sw.offset(r, c, 2)));
        }
    }
    assert!(seen.iter().all(|&o| o < 32 * 512));
}

/// A wgmma `a` one warpgroup reads as two m64 instructions (each warp two
/// 16-row tiles): the `j`-th instruction reads stored rows `64 j ..`, of
/// which warp `w` gets the 16 from `64 j + 16 w`; they hold its logical
/// tile `j`, rows `32 w + 16 j ..`. The XOR phase stays the logical row's,
/// every element has its own slot, and `shift` answers only for whole
/// 256-row blocks (none here) and columns.
#[test]
fn warpgroup_order_stores_each_warps_tiles_where_its_instructions_read_them() {
    let sw = Swizzle::panels(256, 128).in_warpgroup_order(2);
    for w in 0..4 {
        for j in 0..2 {
            for r in 0..16 {
                assert_eq!(sw.stored_row(32 * w + 16 * j + r), 64 * j + 16 * w + r);
            }
        }
    }
    // Block 1 of 128 rows (a second warpgroup) keeps its place.
    assert_eq!(sw.stored_row(128 + 16), 128 + 64);
    // Row 16 (warp 0's tile 1) is stored at row 64; chunk 3 ^ (16 % 8).
    assert_eq!(sw.offset(16, 24, 2), 64 * 128 + 3 * 16);
    // Column 64 is in the second panel (128 rows of 128 bytes on).
    assert_eq!(sw.offset(16, 64, 2), 128 * 128 + 64 * 128);
    let mut seen = std::collections::HashSet::new();
    for r in 0..128 {
        for c in 0..128 {
            assert!(seen.insert(sw.offset(r, c, 2)));
        }
    }
    assert!(seen.iter().all(|&o| o < 128 * 256));
    assert_eq!(sw.shift(8, 0), None);
    assert_eq!(sw.shift(0, 64), Some(128 * 128));
    // One tile a warp changes nothing.
    let one = Swizzle::panels(256, 64).in_warpgroup_order(1);
    assert_eq!(one.stored_row(37), 37);
    assert_eq!(one.shift(8, 0), Swizzle::panels(256, 64).shift(8, 0));
}

/// `Swizzle::shift` is exactly the difference of `offset`s wherever it
/// answers, for every chunk start of the tile (row-major swizzles of 32 to
/// 512-byte rows and 128-byte panels), and answers for whole periods.
#[test]
fn swizzle_shift_is_the_offset_difference_for_whole_periods() {
    let swizzles = [32, 64, 128, 256, 512]
        .map(Swizzle::for_rows)
        .into_iter()
        .chain([Swizzle::panels(256, 64), Swizzle::panels(512, 32)]);
    for sw in swizzles {
        let (rows, cols) = (32, sw.row_bytes / 2);
        let mut answered = 0;
        for dr in 0..rows {
            for dc in (0..cols).step_by(8) {
                let Some(shift) = sw.shift(dr, dc) else {
                    continue;
                };
                answered += 1;
                for r in 0..rows - dr {
                    for c in (0..cols - dc).step_by(8) {
                        assert_eq!(
                            sw.offset(r + dr, c + dc, 2),
                            sw.offset(r, c, 2) + shift,
                            "{sw:?} ({r}, {c}) + ({dr}, {dc})"
                        );
                    }
                }
            }
        }
        // Rows 8 apart (a whole period) and the columns after the
        // swizzle's span always shift.
        assert_eq!(sw.shift(8, 0), Some(sw.offset(8, 0, 2)), "{sw:?}");
        assert!(answered >= rows as usize / 8, "{sw:?}");
        assert!(sw.shift(1, 0).is_none(), "{sw:?}");
    }
}

#[test]
fn pipeline_plans_of_the_brief_kernels() {
    use crate::db::{file_kernels, tile_ir, Database};
    use crate::ir::tile::Specialization;
    let src = include_str!("../tile/testdata/brief.tsr");
    let plan = |arch: Arch, name: &str, spec: Specialization| {
        let mut db = Database::new();
        db.set_arch(arch);
        let file = db.set_source("/t/brief.tsr", src.to_string());
        let (_, item, _) = file_kernels(&db, file)
            .into_iter()
            .find(|k| k.0 == name)
            .unwrap();
        let tk = tile_ir(&db, item, db.options(), spec).clone().unwrap();
        let (_, plan) = super::lower::lower_with_plan(&tk, arch).unwrap();
        plan.to_string()
    };
    let fixed = || Specialization::new().with("K", 96).with("N", 160);
    let d64 = || Specialization::new().with("D", 64);
    #[rustfmt::skip]
    let cases = [
        (Arch::Sm80, "gemm", fixed(), "\
cp.async on sm_80, num_stages = 3
candidates: %41 A[128, 32], %42 B[32, 128]
loop %39: pipelined over 3 stages, copied 2 iterations ahead: %41 A[128, 32], %42 B[32, 128]; the dot's first k step read an iteration early
"),
        (Arch::Sm90a, "gemm", fixed(), "\
cp.async on sm_90a, num_stages = 3
candidates: %41 A[128, 32], %42 B[32, 128]
loop %39: pipelined over 3 stages, copied 2 iterations ahead: %41 A[128, 32], %42 B[32, 128]; the dot on wgmma, the copies by TMA
"),
        (Arch::Sm80, "gemm", Specialization::new(), "\
cp.async on sm_80, num_stages = 3
candidates: %41 A[128, 32], %42 B[32, 128]
load %41 A[128, 32]: in registers
load %42 B[32, 128]: in registers
"),
        (Arch::Sm80, "flash_attn", d64(), "\
cp.async on sm_80, num_stages = 2
candidates: %14 q[128, 64], %22 k[64, 64], %42 v[64, 64]
load %14 q[128, 64]: deferred to its dot
loop %18: copied once before it: %14; pipelined over 2 stages, copied 1 iteration ahead: %22 k[64, 64], %42 v[64, 64]
"),
        (Arch::Sm90a, "flash_attn", d64(), "\
cp.async on sm_90a, num_stages = 2
candidates: %14 q[128, 64], %22 k[64, 64], %42 v[64, 64]
load %14 q[128, 64]: deferred to its dot
loop %18: copied once before it: %14 by TMA; pipelined over 2 stages, copied 1 iteration ahead: %22 k[64, 64], %42 v[64, 64]; the dots on wgmma, the copies by TMA
"),
        (Arch::Sm75, "flash_attn", d64(), "\
no cp.async on sm_75: every load goes through registers
"),
    ];
    for (arch, name, spec, want) in cases {
        assert_eq!(plan(arch, name, spec), want, "{arch} {name}");
    }
}

#[test]
fn wgmma_loops_copy_their_stages_by_tma_on_sm_90a_only() {
    use crate::db::{file_kernels, tile_ir, Database};
    use crate::ir::target::TensorMap;
    use crate::ir::tile::Specialization;
    let src = include_str!("../tile/testdata/brief.tsr");
    let lowered = |arch: Arch| {
        let mut db = Database::new();
        db.set_arch(arch);
        let file = db.set_source("/t/brief.tsr", src.to_string());
        let (_, item, _) = file_kernels(&db, file)
            .into_iter()
            .find(|k| k.0 == "gemm")
            .unwrap();
        let spec = Specialization::new().with("K", 96).with("N", 160);
        let tk = tile_ir(&db, item, db.options(), spec).clone().unwrap();
        super::lower::lower_with_plan(&tk, arch).unwrap().0
    };
    let k = lowered(Arch::Sm90a);
    assert_eq!(verify(&k), Ok(()));
    // a: 128 rows of 32 bf16 (64-byte rows, 64-byte swizzle); b: 32 rows
    // in 64-column panels of 128 bytes.
    let map = |tensor: usize, name: &str, box_dims: [u32; 2], swizzle| TensorMap {
        tensor,
        name: name.into(),
        box_dims: box_dims.to_vec(),
        swizzle,
    };
    assert_eq!(
        k.tensor_maps,
        vec![map(0, "A", [32, 128], 64), map(1, "B", [64, 32], 128)]
    );
    let mut count = std::collections::HashMap::new();
    k.walk(&mut |i| {
        let name = match i {
            Inst::TmaLoad { coords, .. } => {
                assert_eq!(coords.len(), 2);
                "tma"
            }
            Inst::MbarInit { .. } => "init",
            Inst::MbarWait { .. } => "wait",
            Inst::MbarExpectTx { bytes, .. } => {
                // 128 x 32 + 32 x 128 bf16 a stage.
                assert_eq!(*bytes, 16384);
                "expect"
            }
            Inst::CpAsync { .. } | Inst::CpAsyncWait { .. } => "cp.async",
            Inst::Barrier => "barrier",
            _ => return,
        };
        *count.entry(name).or_insert(0) += 1;
    });
    // Three stages, a full and an empty barrier each; the two stages copied
    // before the loop and the one in it, each a box of a and two panels of
    // b; the waits on the stage and (thread 0) on its release; a barrier
    // after the initialisation and one after the loop.
    assert_eq!(count.get("init"), Some(&6));
    assert_eq!(count.get("expect"), Some(&3));
    assert_eq!(count.get("tma"), Some(&9));
    assert_eq!(count.get("wait"), Some(&2));
    assert_eq!(count.get("barrier"), Some(&2));
    assert_eq!(count.get("cp.async"), None);
    let dump = k.to_string();
    assert!(dump.contains("tensor_map 0 of A: box [32, 128] (innermost first), swizzle 64B"));
    assert!(dump.contains("tma_load ["));
    // sm_90 has no wgmma, so neither TMA: its mma.sync loop keeps cp.async.
    let k = lowered(Arch::Sm90);
    assert!(k.tensor_maps.is_empty());
    let mut tma = false;
    k.walk(&mut |i| tma |= matches!(i, Inst::TmaLoad { .. } | Inst::MbarWait { .. }));
    assert!(!tma);
}

#[test]
fn a_bf16_wgmma_tile_is_stored_by_tma_over_the_free_arena() {
    use crate::db::{file_kernels, tile_ir, Database};
    use crate::ir::target::TensorMap;
    use crate::ir::tile::Specialization;
    let src = "\
@kernel(grid=(cdiv(M, BM), cdiv(N, BN)), num_warps=4, num_stages=3)
def g(A: Tensor[\"M\", \"K\", bf16], B: Tensor[\"K\", \"N\", bf16], C: Tensor[\"M\", \"N\", DT],
      BM: const = 64, BN: const = 128, BK: const = 64):
    m0 = program_id(0) * BM
    n0 = program_id(1) * BN
    acc = zeros([BM, BN], f32)
    for k in range(0, K, BK):
        acc = dot(load(A[m0 : m0 + BM, k : k + BK]), load(B[k : k + BK, n0 : n0 + BN]), acc)
    store(C[m0 : m0 + BM, n0 : n0 + BN], acc.to(DT))
";
    let lowered = |arch: Arch, dt: &str| {
        let mut db = Database::new();
        db.set_arch(arch);
        let file = db.set_source("/t/g.tsr", src.replace("DT", dt));
        let (_, item, _) = file_kernels(&db, file).into_iter().next().unwrap();
        let spec = Specialization::new().with("K", 256).with("N", 200);
        let tk = tile_ir(&db, item, db.options(), spec).clone().unwrap();
        super::lower::lower(&tk, arch).unwrap()
    };
    let count = |k: &super::Kernel| {
        let mut n = std::collections::HashMap::new();
        k.walk(&mut |i| {
            let name = match i {
                Inst::TmaStore { coords, .. } => {
                    assert_eq!(coords.len(), 2);
                    "tma_store"
                }
                Inst::BulkCommit => "commit",
                Inst::BulkWaitRead { pending: 0 } => "wait",
                Inst::St {
                    space: Space::Global,
                    ..
                } => "st.global",
                Inst::St {
                    space: Space::Shared,
                    ..
                } => "st.shared",
                _ => return,
            };
            *n.entry(name).or_insert(0) += 1;
        });
        n
    };
    let k = lowered(Arch::Sm90a, "bf16");
    assert_eq!(verify(&k), Ok(()));
    // Two boxes of 64 bf16 columns by 64 rows; a thread's 32 words (its 64
    // accumulators in pairs) written to shared memory, no global store.
    assert_eq!(
        k.tensor_maps.last(),
        Some(&TensorMap {
            tensor: 2,
            name: "C".into(),
            box_dims: vec![64, 64],
            swizzle: 128,
        })
    );
    let n = count(&k);
    assert_eq!(n.get("tma_store"), Some(&2));
    assert_eq!(n.get("commit"), Some(&1));
    assert_eq!(n.get("wait"), Some(&1));
    assert_eq!(n.get("st.shared"), Some(&32));
    assert_eq!(n.get("st.global"), None);
    // The 16 KiB tile overlays the stages (3 x 24 KiB): the arena keeps its
    // size, which the stages and their barriers set.
    let tile = k.smem.iter().find(|b| b.name == "staged0").unwrap();
    assert_eq!((tile.offset, tile.bytes), (0, 16384));
    let others = k
        .smem
        .iter()
        .filter(|b| b.name != "staged0")
        .map(|b| b.offset + b.bytes)
        .max()
        .unwrap();
    assert_eq!(k.smem_bytes(), others);
    assert!(k.to_string().contains("tma_store map"));
    // f32 (a quad writes whole sectors) stores as before.
    let n = count(&lowered(Arch::Sm90a, "f32"));
    assert_eq!((n.get("tma_store"), n.get("st.shared")), (None, None));
    assert!(n.get("st.global").is_some_and(|&c| c > 0));
    // Without TMA (sm_90's mma.sync path) the bf16 tile is read back in
    // 16-byte runs, 8 bf16 a thread, and stored as such: 8 loads of 4 words
    // a thread, and the same words stored (fast path and masked path).
    let k = lowered(Arch::Sm90, "bf16");
    assert_eq!(verify(&k), Ok(()));
    let n = count(&k);
    assert_eq!((n.get("tma_store"), n.get("st.shared")), (None, Some(&32)));
    let (mut reads, mut words) = (0, 0);
    k.walk(&mut |i| match i {
        Inst::Ld {
            space: Space::Shared,
            dst,
            ..
        } if dst.len() == 4 => reads += 1,
        Inst::St {
            space: Space::Global,
            mem: MemTy::U32,
            src,
            ..
        } => {
            assert_eq!(src.len(), 4, "{i:?}");
            words += 1
        }
        _ => {}
    });
    assert_eq!((reads, words), (8, 16));
}

#[test]
fn the_verifier_rejects_tma_stores_where_the_arch_has_no_tma() {
    let mut k = super::Kernel {
        name: "k".into(),
        arch: Arch::Sm80,
        num_threads: 32,
        params: vec![],
        tensor_maps: vec![],
        smem: vec![],
        regs: vec![super::RegTy::U32, super::RegTy::U64, super::RegTy::I32],
        body: vec![
            Inst::TmaStore {
                src: super::Reg(0),
                src_offset: 0,
                map: super::Reg(1),
                coords: vec![super::Operand::Reg(super::Reg(2))],
            },
            Inst::BulkCommit,
            Inst::BulkWaitRead { pending: 0 },
        ],
        layouts: vec![],
        notes: vec![],
    };
    let errors = verify(&k).unwrap_err();
    assert!(errors.contains("has no TMA"), "{errors}");
    assert!(errors.contains("has no bulk copies"), "{errors}");
    k.arch = Arch::Sm90a;
    let errors = verify(&k).err().unwrap_or_default();
    assert!(!errors.contains("has no"), "{errors}");
}
