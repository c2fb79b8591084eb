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

#[derive(Clone, Copy, Debug)]
pub struct Builtin {
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
    params: &'static [&'static str],
    required: usize,
    ctx: Ctx,
    doc: &'static str,
) -> Builtin {
    Builtin {
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

pub const BUILTINS: &[Builtin] = &[
    // kernel builtins
    b(
        "program_id",
        &["axis"],
        1,
        Ctx::Kernel,
        "program_id(axis) -> i32: this program's index along a grid axis",
    ),
    b(
        "num_programs",
        &["axis"],
        1,
        Ctx::Kernel,
        "num_programs(axis) -> i32: the grid's size along an axis",
    ),
    b(
        "arange",
        &["start", "end"],
        2,
        Ctx::Kernel,
        "arange(a, b) -> Tile[b-a, i32]",
    ),
    b(
        "load",
        &["ptr", "mask", "other"],
        1,
        Ctx::Kernel,
        "load(T[slices], mask=, other=) -> Tile",
    ),
    b(
        "store",
        &["ptr", "value", "mask"],
        2,
        Ctx::Kernel,
        "store(T[slices], tile, mask=)",
    ),
    b(
        "atomic_add",
        &["ptr", "value", "mask"],
        2,
        Ctx::Kernel,
        "atomic_add(T[slices], tile, mask=)",
    ),
    b(
        "dot",
        &["a", "b", "acc", "precision"],
        2,
        Ctx::Kernel,
        "dot(Tile[M,K,T], Tile[K,N,T], acc=) -> Tile[M,N,f32]",
    ),
    // scalar / tile / tensor builtins
    b(
        "cdiv",
        &["a", "b"],
        2,
        Ctx::Both,
        "cdiv(a, b): ceil(a / b) on integers",
    ),
    Builtin {
        name: "min",
        params: RED,
        required: 1,
        variadic: true,
        ctx: Ctx::Both,
        doc: "min(a, b) on scalars, or min(t, axis=, keepdims=) a reduction",
    },
    Builtin {
        name: "max",
        params: RED,
        required: 1,
        variadic: true,
        ctx: Ctx::Both,
        doc: "max(a, b) on scalars, or max(t, axis=, keepdims=) a reduction",
    },
    b("sum", RED, 1, Ctx::Both, "sum(t, axis=, keepdims=)"),
    b("mean", RED, 1, Ctx::Both, "mean(t, axis=, keepdims=)"),
    b("exp", X, 1, Ctx::Both, "elementwise e^x"),
    b("exp2", X, 1, Ctx::Both, "elementwise 2^x"),
    b("log", X, 1, Ctx::Both, "elementwise natural logarithm"),
    b("log2", X, 1, Ctx::Both, "elementwise base-2 logarithm"),
    b("sqrt", X, 1, Ctx::Both, "elementwise square root"),
    b("rsqrt", X, 1, Ctx::Both, "elementwise 1/sqrt(x)"),
    b("abs", X, 1, Ctx::Both, "elementwise absolute value"),
    b("sigmoid", X, 1, Ctx::Both, "elementwise 1/(1+e^-x)"),
    b("tanh", X, 1, Ctx::Both, "elementwise hyperbolic tangent"),
    b("erf", X, 1, Ctx::Both, "elementwise error function"),
    b(
        "maximum",
        &["a", "b"],
        2,
        Ctx::Both,
        "elementwise maximum with broadcasting",
    ),
    b(
        "minimum",
        &["a", "b"],
        2,
        Ctx::Both,
        "elementwise minimum with broadcasting",
    ),
    b(
        "where",
        &["cond", "a", "b"],
        3,
        Ctx::Both,
        "where(cond, a, b): elementwise select",
    ),
    b(
        "zeros",
        &["shape", "dtype"],
        1,
        Ctx::Both,
        "zeros(shape, dtype=f32)",
    ),
    b(
        "full",
        &["shape", "value", "dtype"],
        2,
        Ctx::Both,
        "full(shape, value, dtype=f32)",
    ),
    b(
        "range",
        &["start", "stop", "step"],
        1,
        Ctx::Both,
        "range(a, b, step): loop bounds",
    ),
    // whole-tensor builtins
    b(
        "matmul",
        &["a", "b", "precision"],
        2,
        Ctx::Tensor,
        "matmul(a, b, precision=\"ieee\"): batched matrix product, batch dims broadcast; `precision=\"tf32\"` rounds f32 operands to tf32",
    ),
    b(
        "softmax",
        &["x", "axis"],
        1,
        Ctx::Tensor,
        "softmax(x, dim=-1)",
    ),
    b(
        "layer_norm",
        &["x", "weight", "bias", "eps"],
        1,
        Ctx::Tensor,
        "layer_norm(x, weight=, bias=, eps=1e-5) over the last dim",
    ),
    b(
        "rms_norm",
        &["x", "weight", "eps"],
        1,
        Ctx::Tensor,
        "rms_norm(x, weight=, eps=1e-6) over the last dim",
    ),
    b("relu", X, 1, Ctx::Tensor, "elementwise max(x, 0)"),
    b("gelu", X, 1, Ctx::Tensor, "elementwise GELU"),
    b("silu", X, 1, Ctx::Tensor, "elementwise x * sigmoid(x)"),
    b(
        "transpose",
        &["x", "a", "b"],
        3,
        Ctx::Tensor,
        "transpose(x, a, b): swaps two dims",
    ),
    b(
        "reshape",
        &["x", "shape"],
        2,
        Ctx::Tensor,
        "reshape(x, shape): same number of elements",
    ),
    b(
        "empty",
        &["shape", "dtype"],
        1,
        Ctx::Tensor,
        "empty(shape, dtype=f32)",
    ),
    b(
        "ones",
        &["shape", "dtype"],
        1,
        Ctx::Tensor,
        "ones(shape, dtype=f32)",
    ),
    b(
        "randn",
        &["shape", "dtype", "seed"],
        1,
        Ctx::Tensor,
        "randn(shape, dtype=f32, seed=)",
    ),
    b(
        "tensor",
        &["data", "dtype"],
        1,
        Ctx::Tensor,
        "tensor(nested lists, dtype=)",
    ),
    // session builtins: host operations of top-level statements
    Builtin {
        name: "print",
        params: &["value"],
        required: 0,
        variadic: true,
        ctx: Ctx::Session,
        doc: "print(a, b, ..., sep=\" \", end=\"\\n\"): writes the values separated by `sep`, then `end`",
    },
    b(
        "len",
        X,
        1,
        Ctx::Session,
        "len(x): the size of a tensor's first dim, or the length of a tuple, list or string",
    ),
    b(
        "load_npy",
        &["path"],
        1,
        Ctx::Session,
        "load_npy(path) -> Tensor: reads a .npy file (shape and dtype are known at run time)",
    ),
    b(
        "save_npy",
        &["tensor", "path"],
        2,
        Ctx::Session,
        "save_npy(tensor, path): writes a .npy file that numpy reads",
    ),
    b(
        "set_float32_matmul_precision",
        &["precision"],
        1,
        Ctx::Session,
        "set_float32_matmul_precision(\"highest\" | \"high\"): how later f32 `matmul`s without `precision=` multiply: \"highest\" (the default) in full f32, \"high\" at tf32, as in PyTorch",
    ),
];

/// The session builtins, for messages.
pub const SESSION_BUILTINS: &str =
    "`print`, `len`, `load_npy`, `save_npy`, `set_float32_matmul_precision`";

/// The values `set_float32_matmul_precision` takes, and whether each means tf32.
pub fn matmul_precision(name: &str) -> Option<bool> {
    match name {
        "highest" | "ieee" => Some(false),
        "high" | "tf32" => Some(true),
        _ => None,
    }
}

pub fn lookup(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

pub fn is_builtin(name: &str) -> bool {
    lookup(name).is_some()
}

pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().map(|b| b.name)
}
