//! The builtin table: every builtin's parameters and where it may be used.
//! Typing rules live in `calls`.

/// Where a builtin may be called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ctx {
    /// Only inside `@kernel` bodies (E0503 elsewhere).
    Kernel,
    /// Only in whole-tensor code (E0508 inside a kernel).
    Tensor,
    /// Both: on tiles and scalars in kernels, on tensors and scalars elsewhere.
    Both,
    /// Only in top-level statements, which `tessera run` and `tessera repl`
    /// execute on the host (E0725 inside any function).
    Session,
}

/// Every builtin. The name is spelled only in the table (`Builtin::name`,
/// `Builtin::from_name`): each layer matches on the variant, so a builtin
/// added here without a rule in the checker, a lowering or an executor does
/// not compile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Builtin {
    ProgramId,
    NumPrograms,
    Arange,
    Load,
    Store,
    AtomicAdd,
    Dot,
    Cdiv,
    Min,
    Max,
    Sum,
    Mean,
    Exp,
    Exp2,
    Log,
    Log2,
    Sqrt,
    Rsqrt,
    Abs,
    Sigmoid,
    Tanh,
    Erf,
    Maximum,
    Minimum,
    Where,
    Zeros,
    Full,
    Range,
    Matmul,
    Softmax,
    LayerNorm,
    RmsNorm,
    Relu,
    Gelu,
    Silu,
    Transpose,
    Reshape,
    Empty,
    Ones,
    Randn,
    Tensor,
    Print,
    Len,
    LoadNpy,
    SaveNpy,
    SetFloat32MatmulPrecision,
    AllReduce,
    Broadcast,
    Shard,
    Gather,
    AllGather,
    ReduceScatter,
}

impl Builtin {
    /// Every builtin, in table order (`ALL[i] as usize == i`).
    pub const ALL: [Builtin; 52] = [
        Builtin::ProgramId,
        Builtin::NumPrograms,
        Builtin::Arange,
        Builtin::Load,
        Builtin::Store,
        Builtin::AtomicAdd,
        Builtin::Dot,
        Builtin::Cdiv,
        Builtin::Min,
        Builtin::Max,
        Builtin::Sum,
        Builtin::Mean,
        Builtin::Exp,
        Builtin::Exp2,
        Builtin::Log,
        Builtin::Log2,
        Builtin::Sqrt,
        Builtin::Rsqrt,
        Builtin::Abs,
        Builtin::Sigmoid,
        Builtin::Tanh,
        Builtin::Erf,
        Builtin::Maximum,
        Builtin::Minimum,
        Builtin::Where,
        Builtin::Zeros,
        Builtin::Full,
        Builtin::Range,
        Builtin::Matmul,
        Builtin::Softmax,
        Builtin::LayerNorm,
        Builtin::RmsNorm,
        Builtin::Relu,
        Builtin::Gelu,
        Builtin::Silu,
        Builtin::Transpose,
        Builtin::Reshape,
        Builtin::Empty,
        Builtin::Ones,
        Builtin::Randn,
        Builtin::Tensor,
        Builtin::Print,
        Builtin::Len,
        Builtin::LoadNpy,
        Builtin::SaveNpy,
        Builtin::SetFloat32MatmulPrecision,
        Builtin::AllReduce,
        Builtin::Broadcast,
        Builtin::Shard,
        Builtin::Gather,
        Builtin::AllGather,
        Builtin::ReduceScatter,
    ];

    /// The builtin spelled `name`, if any: the one place a name becomes an id.
    pub fn from_name(name: &str) -> Option<Builtin> {
        BUILTINS.iter().find(|b| b.name == name).map(|b| b.id)
    }

    pub fn info(self) -> &'static BuiltinInfo {
        &BUILTINS[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.info().name
    }
}

impl std::fmt::Display for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct BuiltinInfo {
    pub id: Builtin,
    pub name: &'static str,
    /// Parameter names in positional order (`axis` also accepts `dim=`).
    pub params: &'static [&'static str],
    /// How many leading parameters are required.
    pub required: usize,
    /// Extra positional arguments are allowed (`min`, `max`).
    pub variadic: bool,
    pub ctx: Ctx,
    pub doc: &'static str,
}

const fn b(
    name: &'static str,
    id: Builtin,
    params: &'static [&'static str],
    required: usize,
    ctx: Ctx,
    doc: &'static str,
) -> BuiltinInfo {
    BuiltinInfo {
        id,
        name,
        params,
        required,
        variadic: false,
        ctx,
        doc,
    }
}

const X: &[&str] = &["x"];
const RED: &[&str] = &["x", "axis", "keepdims"];

/// Row `i` is the builtin whose id is `i` (tested).
pub const BUILTINS: &[BuiltinInfo] = &[
    // kernel builtins
    b(
        "program_id",
        Builtin::ProgramId,
        &["axis"],
        1,
        Ctx::Kernel,
        "program_id(axis) -> i32: this program's index along a grid axis",
    ),
    b(
        "num_programs",
        Builtin::NumPrograms,
        &["axis"],
        1,
        Ctx::Kernel,
        "num_programs(axis) -> i32: the grid's size along an axis",
    ),
    b(
        "arange",
        Builtin::Arange,
        &["start", "end"],
        2,
        Ctx::Kernel,
        "arange(a, b) -> Tile[b-a, i32]",
    ),
    b(
        "load",
        Builtin::Load,
        &["ptr", "mask", "other"],
        1,
        Ctx::Kernel,
        "load(T[slices], mask=, other=) -> Tile",
    ),
    b(
        "store",
        Builtin::Store,
        &["ptr", "value", "mask"],
        2,
        Ctx::Kernel,
        "store(T[slices], tile, mask=)",
    ),
    b(
        "atomic_add",
        Builtin::AtomicAdd,
        &["ptr", "value", "mask"],
        2,
        Ctx::Kernel,
        "atomic_add(T[slices], tile, mask=)",
    ),
    b(
        "dot",
        Builtin::Dot,
        &["a", "b", "acc", "precision"],
        2,
        Ctx::Kernel,
        "dot(Tile[M,K,T], Tile[K,N,T], acc=) -> Tile[M,N,f32]",
    ),
    // scalar / tile / tensor builtins
    b(
        "cdiv",
        Builtin::Cdiv,
        &["a", "b"],
        2,
        Ctx::Both,
        "cdiv(a, b): ceil(a / b) on integers",
    ),
    BuiltinInfo {
        name: "min",
        id: Builtin::Min,
        params: RED,
        required: 1,
        variadic: true,
        ctx: Ctx::Both,
        doc: "min(a, b) on scalars, or min(t, axis=, keepdims=) a reduction",
    },
    BuiltinInfo {
        name: "max",
        id: Builtin::Max,
        params: RED,
        required: 1,
        variadic: true,
        ctx: Ctx::Both,
        doc: "max(a, b) on scalars, or max(t, axis=, keepdims=) a reduction",
    },
    b("sum", Builtin::Sum, RED, 1, Ctx::Both, "sum(t, axis=, keepdims=)"),
    b("mean", Builtin::Mean, RED, 1, Ctx::Both, "mean(t, axis=, keepdims=)"),
    b("exp", Builtin::Exp, X, 1, Ctx::Both, "elementwise e^x"),
    b("exp2", Builtin::Exp2, X, 1, Ctx::Both, "elementwise 2^x"),
    b("log", Builtin::Log, X, 1, Ctx::Both, "elementwise natural logarithm"),
    b("log2", Builtin::Log2, X, 1, Ctx::Both, "elementwise base-2 logarithm"),
    b("sqrt", Builtin::Sqrt, X, 1, Ctx::Both, "elementwise square root"),
    b("rsqrt", Builtin::Rsqrt, X, 1, Ctx::Both, "elementwise 1/sqrt(x)"),
    b("abs", Builtin::Abs, X, 1, Ctx::Both, "elementwise absolute value"),
    b("sigmoid", Builtin::Sigmoid, X, 1, Ctx::Both, "elementwise 1/(1+e^-x)"),
    b("tanh", Builtin::Tanh, X, 1, Ctx::Both, "elementwise hyperbolic tangent"),
    b("erf", Builtin::Erf, X, 1, Ctx::Both, "elementwise error function"),
    b(
        "maximum",
        Builtin::Maximum,
        &["a", "b"],
        2,
        Ctx::Both,
        "elementwise maximum with broadcasting",
    ),
    b(
        "minimum",
        Builtin::Minimum,
        &["a", "b"],
        2,
        Ctx::Both,
        "elementwise minimum with broadcasting",
    ),
    b(
        "where",
        Builtin::Where,
        &["cond", "a", "b"],
        3,
        Ctx::Both,
        "where(cond, a, b): elementwise select",
    ),
    b(
        "zeros",
        Builtin::Zeros,
        &["shape", "dtype"],
        1,
        Ctx::Both,
        "zeros(shape, dtype=f32)",
    ),
    b(
        "full",
        Builtin::Full,
        &["shape", "value", "dtype"],
        2,
        Ctx::Both,
        "full(shape, value, dtype=f32)",
    ),
    b(
        "range",
        Builtin::Range,
        &["start", "stop", "step"],
        1,
        Ctx::Both,
        "range(a, b, step): loop bounds",
    ),
    // whole-tensor builtins
    b(
        "matmul",
        Builtin::Matmul,
        &["a", "b", "precision"],
        2,
        Ctx::Tensor,
        "matmul(a, b, precision=\"ieee\"): batched matrix product, batch dims broadcast; `precision=\"tf32\"` rounds f32 operands to tf32",
    ),
    b(
        "softmax",
        Builtin::Softmax,
        &["x", "axis"],
        1,
        Ctx::Tensor,
        "softmax(x, dim=-1)",
    ),
    b(
        "layer_norm",
        Builtin::LayerNorm,
        &["x", "weight", "bias", "eps"],
        1,
        Ctx::Tensor,
        "layer_norm(x, weight=, bias=, eps=1e-5) over the last dim",
    ),
    b(
        "rms_norm",
        Builtin::RmsNorm,
        &["x", "weight", "eps"],
        1,
        Ctx::Tensor,
        "rms_norm(x, weight=, eps=1e-6) over the last dim",
    ),
    b("relu", Builtin::Relu, X, 1, Ctx::Tensor, "elementwise max(x, 0)"),
    b("gelu", Builtin::Gelu, X, 1, Ctx::Tensor, "elementwise GELU"),
    b("silu", Builtin::Silu, X, 1, Ctx::Tensor, "elementwise x * sigmoid(x)"),
    b(
        "transpose",
        Builtin::Transpose,
        &["x", "a", "b"],
        3,
        Ctx::Tensor,
        "transpose(x, a, b): swaps two dims",
    ),
    b(
        "reshape",
        Builtin::Reshape,
        &["x", "shape"],
        2,
        Ctx::Tensor,
        "reshape(x, shape): same number of elements",
    ),
    b(
        "empty",
        Builtin::Empty,
        &["shape", "dtype"],
        1,
        Ctx::Tensor,
        "empty(shape, dtype=f32)",
    ),
    b(
        "ones",
        Builtin::Ones,
        &["shape", "dtype"],
        1,
        Ctx::Tensor,
        "ones(shape, dtype=f32)",
    ),
    b(
        "randn",
        Builtin::Randn,
        &["shape", "dtype", "seed"],
        1,
        Ctx::Tensor,
        "randn(shape, dtype=f32, seed=)",
    ),
    b(
        "tensor",
        Builtin::Tensor,
        &["data", "dtype"],
        1,
        Ctx::Tensor,
        "tensor(nested lists, dtype=)",
    ),
    // session builtins: host operations of top-level statements
    BuiltinInfo {
        name: "print",
        id: Builtin::Print,
        params: &["value"],
        required: 0,
        variadic: true,
        ctx: Ctx::Session,
        doc: "print(a, b, ..., sep=\" \", end=\"\\n\"): writes the values separated by `sep`, then `end`",
    },
    b(
        "len",
        Builtin::Len,
        X,
        1,
        Ctx::Session,
        "len(x): the size of a tensor's first dim, or the length of a tuple, list or string",
    ),
    b(
        "load_npy",
        Builtin::LoadNpy,
        &["path"],
        1,
        Ctx::Session,
        "load_npy(path) -> Tensor: reads a .npy file (shape and dtype are known at run time)",
    ),
    b(
        "save_npy",
        Builtin::SaveNpy,
        &["tensor", "path"],
        2,
        Ctx::Session,
        "save_npy(tensor, path): writes a .npy file that numpy reads",
    ),
    b(
        "set_float32_matmul_precision",
        Builtin::SetFloat32MatmulPrecision,
        &["precision"],
        1,
        Ctx::Session,
        "set_float32_matmul_precision(\"highest\" | \"high\"): how later f32 `matmul`s without `precision=` multiply: \"highest\" (the default) in full f32, \"high\" at tf32, as in PyTorch",
    ),
    // collectives over the devices' parts of a distributed tensor (docs/multi-gpu.md)
    b(
        "all_reduce",
        Builtin::AllReduce,
        &["x", "op"],
        1,
        Ctx::Tensor,
        "all_reduce(x, op=\"sum\"): every device's part becomes the elementwise sum (max, min, mean) of all parts; the shape is unchanged",
    ),
    b(
        "broadcast",
        Builtin::Broadcast,
        &["x", "src"],
        1,
        Ctx::Tensor,
        "broadcast(x, src=0): every device's part becomes a copy of part `src`",
    ),
    b(
        "shard",
        Builtin::Shard,
        &["x", "axis", "devices"],
        1,
        Ctx::Tensor,
        "shard(x, axis=0, devices=[...]): splits a tensor along `axis` over the session's devices",
    ),
    b(
        "gather",
        Builtin::Gather,
        X,
        1,
        Ctx::Tensor,
        "gather(x): a distributed tensor made whole, as one tensor",
    ),
    b(
        "all_gather",
        Builtin::AllGather,
        X,
        1,
        Ctx::Tensor,
        "all_gather(x): a sharded tensor made whole on every device",
    ),
    b(
        "reduce_scatter",
        Builtin::ReduceScatter,
        &["x", "axis", "op"],
        1,
        Ctx::Tensor,
        "reduce_scatter(x, axis=0, op=\"sum\"): device i gets block i along `axis` of the parts' reduction",
    ),
];

/// The session builtins, for messages: "`print`, `len`, ...".
pub fn session_builtins() -> String {
    let names: Vec<String> = BUILTINS
        .iter()
        .filter(|b| b.ctx == Ctx::Session)
        .map(|b| format!("`{}`", b.name))
        .collect();
    names.join(", ")
}

/// The reductions of `all_reduce` and `reduce_scatter` (`op=`).
pub const REDUCE_OPS: [&str; 4] = ["sum", "max", "min", "mean"];

/// The values `set_float32_matmul_precision` takes, and whether each means tf32.
pub fn matmul_precision(name: &str) -> Option<bool> {
    match name {
        "highest" | "ieee" => Some(false),
        "high" | "tf32" => Some(true),
        _ => None,
    }
}

pub fn lookup(name: &str) -> Option<&'static BuiltinInfo> {
    Builtin::from_name(name).map(Builtin::info)
}

pub fn is_builtin(name: &str) -> bool {
    lookup(name).is_some()
}

pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().map(|b| b.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_index_the_table_and_names_round_trip() {
        assert_eq!(Builtin::ALL.len(), BUILTINS.len());
        for (i, (&b, row)) in Builtin::ALL.iter().zip(BUILTINS).enumerate() {
            assert_eq!(b as usize, i, "`{}` is out of order in `ALL`", row.name);
            assert_eq!(row.id, b, "row {i} (`{}`) carries the wrong id", row.name);
            assert_eq!(Builtin::from_name(b.name()), Some(b));
            assert_eq!(b.info().name, row.name);
        }
        let mut names: Vec<&str> = names().collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BUILTINS.len(), "a builtin name is repeated");
        assert_eq!(Builtin::from_name("no_such_builtin"), None);
    }
}

/// A place `x.to(...)` moves a tensor to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Cpu,
    /// GPU N (`"cuda"` is GPU 0).
    Cuda(usize),
}

/// `"cpu"`, `"cuda"` or `"cuda:N"` as a [`Place`]; any other string is none.
pub fn place_named(s: &str) -> Option<Place> {
    match s.strip_prefix("cuda:") {
        Some(n) if !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit()) => {
            n.parse().ok().map(Place::Cuda)
        }
        Some(_) => None,
        None => match s {
            "cpu" => Some(Place::Cpu),
            "cuda" => Some(Place::Cuda(0)),
            _ => None,
        },
    }
}
