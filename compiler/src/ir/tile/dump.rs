//! The textual form of Tile IR (MLIR-like), for `tsrc emit --emit tile-ir`,
//! snapshots and debugging. Values print as `%N` (their index), tensor
//! parameters as `%name`; every op that defines values shows their types.
//!
//! ```text
//! kernel @vadd(%x: tensor<N x f32>, %y: tensor<N x f32>, %out: tensor<N x f32>)
//!     specialization {BLOCK = 1024} num_warps = 4 num_stages = 1 {
//!   %0 = program_id 0 : i32
//!   %2 = load %x[%1 : +1024] other 0 : tile<1024xf32>
//!   store %out[%1 : +1024], %4
//! }
//! ```
//!
//! A kernel compiled under divisibility assumptions (`-D N%4`) lists them after
//! its specialization: `specialization {BLOCK = 1024} assume {N % 4 == 0}`;
//! facts a launch derived from its own values, which need no entry check,
//! as `launch facts {N % 16 == 0}`.

use std::fmt::{self, Write};

use super::*;

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Scalar(d) => write!(f, "{d}"),
            Type::Tile { shape, dtype } => {
                f.write_str("tile<")?;
                for s in shape {
                    write!(f, "{s}x")?;
                }
                write!(f, "{dtype}>")
            }
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Static(n) => write!(f, "{n}"),
            Dim::Dynamic(s) => f.write_str(s),
        }
    }
}

impl fmt::Display for ParamKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamKind::Scalar(d) => write!(f, "{d}"),
            ParamKind::Tensor { dims, dtype } => {
                f.write_str("tensor<")?;
                for d in dims {
                    write!(f, "{d} x ")?;
                }
                write!(f, "{dtype}>")
            }
        }
    }
}

impl fmt::Display for Constant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Constant::Int(i) => write!(f, "{i}"),
            Constant::Float(x) if x.is_infinite() => {
                f.write_str(if *x > 0.0 { "inf" } else { "-inf" })
            }
            Constant::Float(x) => write!(f, "{x:?}"),
            Constant::Bool(b) => write!(f, "{b}"),
        }
    }
}

impl UnaryOp {
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Not => "not",
            UnaryOp::Invert => "invert",
            UnaryOp::Exp => "exp",
            UnaryOp::Exp2 => "exp2",
            UnaryOp::Log => "log",
            UnaryOp::Log2 => "log2",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Abs => "abs",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Erf => "erf",
        }
    }
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::FloorDiv => "floordiv",
            BinaryOp::Mod => "mod",
            BinaryOp::Pow => "pow",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
            BinaryOp::Eq => "cmp eq",
            BinaryOp::Ne => "cmp ne",
            BinaryOp::Lt => "cmp lt",
            BinaryOp::Le => "cmp le",
            BinaryOp::Gt => "cmp gt",
            BinaryOp::Ge => "cmp ge",
        }
    }
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Ieee => "ieee",
            Precision::Tf32 => "tf32",
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.dump())
    }
}

impl Kernel {
    /// The textual form (ends with a newline).
    pub fn dump(&self) -> String {
        let mut p = Printer {
            k: self,
            out: String::new(),
        };
        p.kernel();
        p.out
    }
}

struct Printer<'a> {
    k: &'a Kernel,
    out: String,
}

impl Printer<'_> {
    fn ty(&self, v: Value) -> String {
        match self.k.types.get(v.0 as usize) {
            Some(t) => t.to_string(),
            None => "<untyped>".to_string(),
        }
    }

    fn param(&self, i: usize) -> String {
        match self.k.params.get(i) {
            Some(p) => format!("%{}", p.name),
            None => format!("%<param {i}>"),
        }
    }

    fn kernel(&mut self) {
        let k = self.k;
        let params: Vec<String> = k
            .params
            .iter()
            .map(|p| format!("%{}: {}", p.name, p.kind))
            .collect();
        let spec: Vec<String> = k
            .specialization
            .iter()
            .map(|(n, v)| format!("{n} = {v}"))
            .collect();
        // Shown only when there are some, so kernels without them dump as before.
        let divisibility = if k.divisibility.is_empty() {
            String::new()
        } else {
            let d: Vec<String> = k
                .divisibility
                .iter()
                .map(|(n, d)| format!("{n} % {d} == 0"))
                .collect();
            // Trusted facts (a launch's own values) are not checked at entry.
            let how = if k.divisibility_trusted {
                "launch facts"
            } else {
                "assume"
            };
            format!(" {how} {{{}}}", d.join(", "))
        };
        let _ = writeln!(
            self.out,
            "kernel @{}({})\n    specialization {{{}}}{divisibility} num_warps = {} num_stages = {} {{",
            k.name,
            params.join(", "),
            spec.join(", "),
            k.num_warps,
            k.num_stages
        );
        if !k.body.args.is_empty() {
            let _ = writeln!(self.out, "  ^args({})", self.values_typed(&k.body.args));
        }
        self.ops(&k.body.ops, 1);
        self.out.push_str("}\n");
    }

    fn values(vs: &[Value]) -> String {
        vs.iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn values_typed(&self, vs: &[Value]) -> String {
        vs.iter()
            .map(|v| format!("{v}: {}", self.ty(*v)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn access(&self, tensor: usize, access: &[Access]) -> String {
        let parts: Vec<String> = access
            .iter()
            .map(|a| match a {
                Access::Point(v) => v.to_string(),
                Access::Range { start, len } => format!("{start} : +{len}"),
                Access::Gather(v) => format!("each {v}"),
            })
            .collect();
        format!("{}[{}]", self.param(tensor), parts.join(", "))
    }

    fn indent(&mut self, depth: usize) {
        for _ in 0..depth {
            self.out.push_str("  ");
        }
    }

    fn ops(&mut self, ops: &[Op], depth: usize) {
        for op in ops {
            self.op(op, depth);
        }
    }

    /// `{` region `}` with the closing brace at `depth`.
    fn region(&mut self, r: &Region, depth: usize) {
        self.out.push_str("{\n");
        self.ops(&r.ops, depth + 1);
        self.indent(depth);
        self.out.push('}');
    }

    fn op(&mut self, op: &Op, depth: usize) {
        self.indent(depth);
        if !op.results.is_empty() {
            let _ = write!(self.out, "{} = ", Self::values(&op.results));
        }
        let types = || {
            op.results
                .iter()
                .map(|v| self.ty(*v))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let text = match &op.kind {
            OpKind::Const(c) => format!("const {c} : {}", types()),
            OpKind::ProgramId(a) => format!("program_id {a} : {}", types()),
            OpKind::NumPrograms(a) => format!("num_programs {a} : {}", types()),
            OpKind::TensorDim { param, axis } => {
                format!("dim {}, {axis} : {}", self.param(*param), types())
            }
            OpKind::ScalarParam(i) => format!("param {} : {}", self.param(*i), types()),
            OpKind::Unary { op: u, x } => format!("{} {x} : {}", u.name(), types()),
            OpKind::Binary { op: b, a, b: bv } => {
                format!("{} {a}, {bv} : {}", b.name(), self.ty(*a))
            }
            OpKind::Select { cond, a, b } => format!("select {cond}, {a}, {b} : {}", types()),
            OpKind::Cast { x, to } => format!("cast {x} : {} to {to}", self.ty(*x)),
            OpKind::Splat { x, .. } => format!("splat {x} : {} -> {}", self.ty(*x), types()),
            OpKind::Broadcast { x, .. } => {
                format!("broadcast {x} : {} -> {}", self.ty(*x), types())
            }
            OpKind::ExpandDims { x, axis } => {
                format!("expand_dims {x}, {axis} : {} -> {}", self.ty(*x), types())
            }
            OpKind::Transpose { x } => format!("transpose {x} : {} -> {}", self.ty(*x), types()),
            OpKind::Extract {
                x,
                axis,
                start,
                len,
                drop,
            } => format!(
                "extract {x}, axis {axis}, {start} : +{len}{} : {} -> {}",
                if *drop { " drop" } else { "" },
                self.ty(*x),
                types()
            ),
            OpKind::Arange { start, len } => format!("arange {start}, {len} : {}", types()),
            OpKind::Load {
                tensor,
                access,
                mask,
                other,
            } => {
                let mask = mask.map(|m| format!(" mask {m}")).unwrap_or_default();
                format!(
                    "load {}{mask} other {other} : {}",
                    self.access(*tensor, access),
                    types()
                )
            }
            OpKind::Store {
                tensor,
                access,
                value,
                mask,
            }
            | OpKind::AtomicAdd {
                tensor,
                access,
                value,
                mask,
            } => {
                let name = if matches!(op.kind, OpKind::Store { .. }) {
                    "store"
                } else {
                    "atomic_add"
                };
                let mask = mask.map(|m| format!(" mask {m}")).unwrap_or_default();
                format!(
                    "{name} {}, {value}{mask} : {}",
                    self.access(*tensor, access),
                    self.ty(*value)
                )
            }
            OpKind::Dot {
                a,
                b,
                acc,
                precision,
            } => {
                let acc = acc.map(|c| format!(", {c}")).unwrap_or_default();
                format!(
                    "dot {a}, {b}{acc} precision {} : {}, {} -> {}",
                    precision.name(),
                    self.ty(*a),
                    self.ty(*b),
                    types()
                )
            }
            OpKind::Reduce {
                op: r,
                x,
                axis,
                keepdims,
            } => format!(
                "reduce {} {x}, axis {axis}{} : {} -> {}",
                r.name(),
                if *keepdims { " keepdims" } else { "" },
                self.ty(*x),
                types()
            ),
            OpKind::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let (iv, carried) = match body.args.split_first() {
                    Some((iv, rest)) => (iv.to_string(), rest),
                    None => ("%<no iv>".to_string(), &[][..]),
                };
                let iters: Vec<String> = carried
                    .iter()
                    .zip(init.iter().map(Some).chain(std::iter::repeat(None)))
                    .map(|(a, i)| match i {
                        Some(i) => format!("{a} = {i}"),
                        None => format!("{a} = %<missing>"),
                    })
                    .collect();
                let mut s = format!("for {iv} = {lo} to {hi} step {step} : {}", self.ty(*lo));
                if !iters.is_empty() || !init.is_empty() {
                    let _ = write!(s, " iter_args({}) -> ({})", iters.join(", "), types());
                }
                s.push(' ');
                self.out.push_str(&s);
                self.region(body, depth);
                self.out.push('\n');
                return;
            }
            OpKind::While { init, cond, body } => {
                let args: Vec<String> = cond
                    .args
                    .iter()
                    .zip(init.iter())
                    .map(|(a, i)| format!("{a} = {i}"))
                    .collect();
                let _ = write!(self.out, "while ({}) -> ({}) ", args.join(", "), types());
                self.region(cond, depth);
                let _ = write!(self.out, " do ({}) ", Self::values(&body.args));
                self.region(body, depth);
                self.out.push('\n');
                return;
            }
            OpKind::If {
                cond,
                then,
                otherwise,
            } => {
                if op.results.is_empty() {
                    let _ = write!(self.out, "if {cond} ");
                } else {
                    let _ = write!(self.out, "if {cond} -> ({}) ", types());
                }
                self.region(then, depth);
                self.out.push_str(" else ");
                self.region(otherwise, depth);
                self.out.push('\n');
                return;
            }
            OpKind::Yield(vs) => {
                if vs.is_empty() {
                    "yield".to_string()
                } else {
                    let tys: Vec<String> = vs.iter().map(|v| self.ty(*v)).collect();
                    format!("yield {} : {}", Self::values(vs), tys.join(", "))
                }
            }
        };
        self.out.push_str(&text);
        self.out.push('\n');
    }
}
