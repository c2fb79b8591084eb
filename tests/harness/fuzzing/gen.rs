//! Generation of valid programs: kernels (loads and stores over tensors,
//! elementwise chains, reductions, `dot` loops, masks, gathers, const
//! parameters, autotune), whole-tensor functions, and top-level statements
//! that create small tensors and launch or call them, across dtypes and
//! shapes. Most of what it writes passes `check` (the fuzzer measures how
//! much), so emission, the estimate and the CPU executor see real programs.

use super::rng::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dt {
    F64,
    F32,
    F16,
    Bf16,
    F8,
    I64,
    I32,
    I16,
    I8,
    U32,
    U8,
}

use Dt::*;

impl Dt {
    fn name(self) -> &'static str {
        match self {
            F64 => "f64",
            F32 => "f32",
            F16 => "f16",
            Bf16 => "bf16",
            F8 => "f8e4m3",
            I64 => "i64",
            I32 => "i32",
            I16 => "i16",
            I8 => "i8",
            U32 => "u32",
            U8 => "u8",
        }
    }

    fn is_float(self) -> bool {
        matches!(self, F64 | F32 | F16 | Bf16 | F8)
    }

    /// Transcendental math and `**` are rejected on f64 tiles.
    fn has_math(self) -> bool {
        matches!(self, F32 | F16 | Bf16)
    }

    fn is_unsigned(self) -> bool {
        matches!(self, U32 | U8)
    }
}

const ELEM_DTYPES: &[Dt] = &[
    F32, F32, F32, F16, Bf16, F64, I32, I32, I64, I16, I8, U8, U32,
];
const FLOAT_DTYPES: &[Dt] = &[F32, F32, F16, Bf16, F64];
const DOT_DTYPES: &[Dt] = &[F16, F16, Bf16, F32, F8];
const WARPS: &[u32] = &[1, 2, 4, 4, 4, 8];

/// One generated program.
pub fn program(rng: &mut Rng) -> String {
    let mut g = Gen {
        rng,
        defs: Vec::new(),
        host: Vec::new(),
        kernels: 0,
        seeds: 0,
        launchable: Vec::new(),
    };
    let n_kernels = g.rng.range(1, 3);
    for _ in 0..n_kernels {
        g.kernel();
    }
    let n_functions = g.rng.range(0, 2);
    for _ in 0..n_functions {
        g.function();
    }
    if g.rng.chance(1, 6) {
        g.host_control();
    }
    let mut text = String::new();
    // Statements may come before the definitions they use (definitions are
    // added first), so either order is valid.
    let host_first = g.rng.chance(1, 5);
    let defs = g.defs.join("\n");
    let host = g.host.join("");
    if host_first {
        text.push_str(&host);
        text.push('\n');
        text.push_str(&defs);
    } else {
        text.push_str(&defs);
        text.push('\n');
        text.push_str(&host);
    }
    text
}

/// An elementwise kernel a whole-tensor function can launch.
#[derive(Clone)]
struct Launchable {
    name: String,
    dt: Dt,
    alpha: Option<Dt>,
    has_grid: bool,
}

struct Gen<'a> {
    rng: &'a mut Rng,
    defs: Vec<String>,
    host: Vec<String>,
    kernels: u32,
    seeds: u32,
    launchable: Vec<Launchable>,
}

impl Gen<'_> {
    fn fresh_kernel(&mut self) -> String {
        self.kernels += 1;
        format!("k{}", self.kernels)
    }

    /// A host expression for a tensor of `dt` and `shape` with varied values.
    fn host_tensor(&mut self, dt: Dt, shape: &[i64]) -> String {
        self.seeds += 1;
        let dims = shape
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let count: i64 = shape.iter().product();
        if dt.is_float() {
            match self.rng.below(4) {
                0 => format!("full([{dims}], 1.5, {})", dt.name()),
                1 if dt == F32 => format!("randn([{dims}], f32, seed={})", self.seeds),
                _ => format!(
                    "randn([{dims}], f32, seed={}).to({})",
                    self.seeds,
                    dt.name()
                ),
            }
        } else {
            let modulus = self.rng.range(2, 100);
            match self.rng.below(3) {
                0 => format!("ones([{dims}], {})", dt.name()),
                _ => format!(
                    "reshape(arange(0, {count}, i32) % {modulus}, [{dims}]).to({})",
                    dt.name()
                ),
            }
        }
    }

    fn literal(&mut self, dt: Dt) -> String {
        if dt.is_float() {
            self.rng
                .pick(&["0.5", "2.0", "1.0", "-1.25", "0.001", "3.0", "0.0"])
                .to_string()
        } else {
            self.rng.range(1, 7).to_string()
        }
    }

    /// An elementwise expression of dtype `dt` over `vars` (all of `dt` and
    /// one broadcast-compatible shape).
    fn expr(&mut self, vars: &[String], dt: Dt, depth: u32) -> String {
        if depth == 0 || self.rng.chance(1, 4) {
            return if self.rng.chance(1, 8) {
                format!("({} * {})", self.rng.pick(vars).clone(), self.literal(dt))
            } else {
                self.rng.pick(vars).clone()
            };
        }
        let a = self.expr(vars, dt, depth - 1);
        let b = self.expr(vars, dt, depth - 1);
        if dt.is_float() {
            let n = if dt.has_math() { 16 } else { 10 };
            match self.rng.below(n) {
                0 => format!("({a} + {b})"),
                1 => format!("({a} - {b})"),
                2 => format!("({a} * {b})"),
                3 => format!("({a} / ({b} * {b} + 1.0))"),
                4 => format!("({a} * {})", self.literal(dt)),
                5 => format!("maximum({a}, {b})"),
                6 => format!("minimum({a}, {b})"),
                7 => format!("where({a} > {b}, {a}, {b})"),
                8 => format!("abs({a})"),
                9 => format!("(-{a})"),
                10 => format!("exp(minimum({a}, 10.0))"),
                11 => format!("sigmoid({a})"),
                12 => format!("tanh({a})"),
                13 => format!("sqrt(abs({a}))"),
                14 => format!("log(abs({a}) + 1.0)"),
                _ => format!("({a} ** 2)"),
            }
        } else {
            match self.rng.below(11) {
                0 => format!("({a} + {b})"),
                1 => format!("({a} - {b})"),
                2 => format!("({a} * {b})"),
                3 => format!("({a} & {b})"),
                4 => format!("({a} | {b})"),
                5 => format!("({a} ^ {b})"),
                6 => format!("maximum({a}, {b})"),
                7 => format!("minimum({a}, {b})"),
                8 => format!("where({a} > {b}, {a}, {b})"),
                9 => format!("({a} // {})", self.literal(dt)),
                _ if dt.is_unsigned() => format!("({a} % {})", self.literal(dt)),
                _ => format!("abs({a})"),
            }
        }
    }

    /// A chain of assignments `t0 = ...` over `vars`; returns the last name.
    fn chain(&mut self, body: &mut String, vars: &mut Vec<String>, dt: Dt, indent: &str) -> String {
        let n = self.rng.range(1, 4);
        let mut last = vars[0].clone();
        for i in 0..n {
            let name = format!("t{i}");
            let depth = self.rng.range(1, 3) as u32;
            let e = self.expr(vars, dt, depth);
            body.push_str(&format!("{indent}{name} = {e}\n"));
            vars.push(name.clone());
            last = name;
        }
        last
    }

    fn decorator(&mut self, grid: Option<&str>, extra: &str) -> String {
        self.decorator_for(grid, extra, 0)
    }

    /// `@kernel` with at least enough warps that no tile of `elems` f32
    /// elements takes more than 128 registers a thread (E0602 refuses a
    /// tile past 255, so a generated program would not check).
    fn decorator_for(&mut self, grid: Option<&str>, extra: &str, elems: i64) -> String {
        let fits = |w: u32| elems <= 32 * 128 * i64::from(w);
        let w = *self.rng.pick(WARPS);
        let w = if fits(w) { w } else { 8 };
        let warps = if fits(4) && self.rng.chance(1, 5) {
            String::new()
        } else {
            format!(", num_warps={w}")
        };
        match grid {
            Some(g) => format!("@kernel(grid={g}{warps}{extra})\n"),
            None => format!("@kernel({}{extra})\n", warps.trim_start_matches(", ")),
        }
    }

    fn kernel(&mut self) {
        match self.rng.below(16) {
            0 => self.stdlib_kernel(),
            1..=4 => self.elementwise(),
            5 | 6 => self.rows(),
            7 | 8 => self.tile2d(),
            9 | 10 => self.gemm(),
            11 | 12 => self.loop_reduce(),
            13 | 14 => self.gather(),
            _ => self.attention(),
        }
    }

    /// One program per BLOCK elements: slices or offsets with a mask.
    fn elementwise(&mut self) {
        let name = self.fresh_kernel();
        let dt = *self.rng.pick(ELEM_DTYPES);
        let block = *self.rng.pick(&[16i64, 32, 64, 128, 256, 1024]);
        let has_grid = self.rng.chance(4, 5);
        let alpha = self
            .rng
            .chance(1, 3)
            .then(|| if dt.is_float() { F32 } else { I32 });
        let autotune = has_grid && self.rng.chance(1, 6);
        let mut text = String::new();
        if autotune {
            text.push_str(&format!(
                "@autotune(space={{\"BLOCK\": [{}, {}], \"num_warps\": [2, 4]}}, key=[\"N\"])\n",
                block,
                block * 2
            ));
        }
        text.push_str(&self.decorator(has_grid.then_some("(cdiv(N, BLOCK),)"), ""));
        // The block size's default from a module-level const, sometimes.
        let block_default = if self.rng.chance(1, 4) {
            let c = format!("B_{name}");
            self.defs.push(format!("const {c} = {block}\n"));
            c
        } else {
            block.to_string()
        };
        let alpha_param = alpha.map_or(String::new(), |a| format!(", alpha: {}", a.name()));
        let flag = self.rng.chance(1, 5);
        let flag_param = if flag {
            ", flip: const bool = False"
        } else {
            ""
        };
        text.push_str(&format!(
            "def {name}(x: Tensor[\"N\", {d}], y: Tensor[\"N\", {d}], out: Tensor[\"N\", {d}]{alpha_param}{flag_param}, BLOCK: const = {block_default}):\n",
            d = dt.name()
        ));
        let masked = self.rng.chance(1, 2);
        let (dst, mask) = if masked {
            text.push_str(
                "    offs = program_id(0) * BLOCK + arange(0, BLOCK)\n    m = offs < N\n",
            );
            text.push_str(
                "    a = load(x[offs], mask=m, other=0)\n    b = load(y[offs], mask=m)\n",
            );
            ("out[offs]", ", mask=m")
        } else {
            text.push_str("    i = program_id(0) * BLOCK\n");
            text.push_str("    a = load(x[i : i + BLOCK])\n    b = load(y[i : i + BLOCK])\n");
            ("out[i : i + BLOCK]", "")
        };
        let mut vars = vec!["a".to_string(), "b".to_string()];
        if alpha.is_some() {
            text.push_str("    c = a * alpha\n");
            vars.push("c".into());
        }
        let mut last = self.chain(&mut text, &mut vars, dt, "    ");
        if flag {
            let e = self.expr(&vars, dt, 1);
            text.push_str(&format!(
                "    if flip:\n        r = {e}\n    else:\n        r = {last}\n"
            ));
            last = "r".into();
        }
        if self.rng.chance(1, 4) {
            let steps = self.rng.range(0, 3);
            text.push_str(&format!(
                "    acc = zeros([BLOCK], {})\n    for s in range(0, {steps}):\n        acc = acc + {last}\n",
                dt.name()
            ));
            last = "acc".into();
        }
        text.push_str(&format!("    store({dst}, {last}{mask})\n"));
        self.defs.push(text);

        let n = self.rng.range(1, 700);
        let x = format!("x_{name}");
        let y = format!("y_{name}");
        let o = format!("o_{name}");
        let mut host = String::new();
        host.push_str(&format!("{x} = {}\n", self.host_tensor(dt, &[n])));
        host.push_str(&format!("{y} = {}\n", self.host_tensor(dt, &[n])));
        host.push_str(&format!("{o} = zeros([{n}], {})\n", dt.name()));
        let alpha_arg = match alpha {
            Some(F32) => ", 0.75",
            Some(_) => ", 3",
            None => "",
        };
        let mut kwargs = String::new();
        if flag && self.rng.chance(1, 2) {
            kwargs.push_str(", flip=True");
        }
        let explicit = !has_grid || self.rng.chance(1, 5);
        let launch_block = if explicit && self.rng.chance(1, 2) {
            let b = *self.rng.pick(&[8i64, 64, 512]);
            kwargs.push_str(&format!(", BLOCK={b}"));
            b
        } else {
            block
        };
        let grid = if explicit {
            format!("[(cdiv({n}, {launch_block}),)]")
        } else {
            String::new()
        };
        host.push_str(&format!("{name}{grid}({x}, {y}, {o}{alpha_arg}{kwargs})\n"));
        host.push_str(&self.show(&o, n <= 8));
        self.host.push(host);
        self.launchable.push(Launchable {
            name,
            dt,
            alpha,
            has_grid,
        });
    }

    /// A kernel of the standard library, imported and launched.
    fn stdlib_kernel(&mut self) {
        if self.defs.iter().any(|d| d.contains("import softmax_rows")) {
            return self.elementwise();
        }
        self.defs
            .push("from std.nn import softmax_rows\n".to_string());
        let m = self.rng.range(1, 6);
        let n = self.rng.range(1, 1024);
        let host = format!(
            "xs = {}\nos = zeros([{m}, {n}], f32)\nsoftmax_rows(xs, os)\nprint(sum(os, dim=1))\n",
            self.host_tensor(F32, &[m, n])
        );
        self.host.push(host);
    }

    /// A statement that prints something of a host tensor.
    fn show(&mut self, t: &str, small: bool) -> String {
        match self.rng.below(5) {
            0 if small => format!("print({t})\n"),
            1 => format!("print({t}.shape, {t}.dtype)\n"),
            2 => format!("print({t}[0])\n"),
            _ => format!("print(sum({t}.to(f64)))\n"),
        }
    }

    /// One program per row, the row in one tile, a reduction along it.
    fn rows(&mut self) {
        let name = self.fresh_kernel();
        let dt = *self.rng.pick(ELEM_DTYPES);
        let bn = *self.rng.pick(&[16i64, 32, 64, 128]);
        let mut text = self.decorator(Some("(M,)"), "");
        text.push_str(&format!(
            "def {name}(x: Tensor[\"M\", \"N\", {d}], out: Tensor[\"M\", \"N\", {d}], BN: const = {bn}):\n    row = program_id(0)\n",
            d = dt.name()
        ));
        let masked = self.rng.chance(1, 2);
        let red = *self.rng.pick(&["sum", "max", "min"]);
        let other = match red {
            "max" if dt.is_float() => "-inf",
            _ => "0",
        };
        let (dst, mask) = if masked {
            text.push_str("    cols = arange(0, BN)\n    m = cols < N\n");
            text.push_str(&format!(
                "    v = load(x[row, cols], mask=m, other={other})\n"
            ));
            ("out[row, cols]", ", mask=m")
        } else {
            text.push_str(&format!("    v = load(x[row, 0 : BN], other={other})\n"));
            ("out[row, 0 : BN]", "")
        };
        if dt.has_math() && self.rng.chance(1, 2) {
            text.push_str("    e = exp(v - max(v, axis=0))\n    r = e / sum(e, axis=0)\n");
        } else {
            text.push_str(&format!("    s = {red}(v, axis=0)\n    w = v - s\n"));
            let mut vars = vec!["v".to_string(), "w".to_string()];
            let last = self.chain(&mut text, &mut vars, dt, "    ");
            text.push_str(&format!("    r = {last}\n"));
        }
        text.push_str(&format!("    store({dst}, r{mask})\n"));
        self.defs.push(text);
        let m = self.rng.range(1, 12);
        let n = self.rng.range(1, bn + 8);
        let x = format!("x_{name}");
        let o = format!("o_{name}");
        let host = format!(
            "{x} = {}\n{o} = zeros([{m}, {n}], {})\n{name}({x}, {o})\n{}",
            self.host_tensor(dt, &[m, n]),
            dt.name(),
            self.show(&o, m * n <= 8)
        );
        self.host.push(host);
    }

    /// 2-D tiles over a 2-D grid: reductions with keepdims, broadcasting, a
    /// transposed copy, row sums by atomics.
    fn tile2d(&mut self) {
        let name = self.fresh_kernel();
        let dt = *self.rng.pick(ELEM_DTYPES);
        let bm = *self.rng.pick(&[1i64, 4, 16, 32]);
        let bn = *self.rng.pick(&[8i64, 16, 32, 64]);
        let transpose = self.rng.chance(1, 3);
        let atomics = matches!(dt, F32 | I32 | I64) && self.rng.chance(1, 3);
        let mut text = self.decorator(Some("(cdiv(M, BM), cdiv(N, BN))"), "");
        let d = dt.name();
        let mut params = format!("x: Tensor[\"M\", \"N\", {d}], out: Tensor[\"M\", \"N\", {d}]");
        if transpose {
            params.push_str(&format!(", tr: Tensor[\"N\", \"M\", {d}]"));
        }
        if atomics {
            params.push_str(&format!(", rs: Tensor[\"M\", {d}]"));
        }
        text.push_str(&format!(
            "def {name}({params}, BM: const = {bm}, BN: const = {bn}):\n    m0 = program_id(0) * BM\n    n0 = program_id(1) * BN\n    t = load(x[m0 : m0 + BM, n0 : n0 + BN])\n"
        ));
        let red = *self.rng.pick(&["sum", "max", "min"]);
        let axis = self.rng.below(2);
        text.push_str(&format!(
            "    r = {red}(t, axis={axis}, keepdims=True).to({d})\n"
        ));
        let mut vars = vec!["t".to_string(), "r".to_string()];
        if self.rng.chance(1, 3) {
            text.push_str(&format!(
                "    u = load(x[m0 : m0 + BM, n0]).to({d})\n    p = u[:, None] * t\n"
            ));
            vars.push("p".into());
        }
        let last = self.chain(&mut text, &mut vars, dt, "    ");
        text.push_str(&format!(
            "    store(out[m0 : m0 + BM, n0 : n0 + BN], t + {last})\n"
        ));
        if transpose {
            text.push_str("    store(tr[n0 : n0 + BN, m0 : m0 + BM], t.T)\n");
        }
        if atomics {
            text.push_str("    atomic_add(rs[m0 : m0 + BM], sum(t, axis=1))\n");
        }
        self.defs.push(text);
        let m = self.rng.range(1, 40);
        let n = self.rng.range(1, 70);
        let x = format!("x_{name}");
        let o = format!("o_{name}");
        let mut host = format!(
            "{x} = {}\n{o} = zeros([{m}, {n}], {d})\n",
            self.host_tensor(dt, &[m, n])
        );
        let mut args = format!("{x}, {o}");
        if transpose {
            host.push_str(&format!("tr_{name} = zeros([{n}, {m}], {d})\n"));
            args.push_str(&format!(", tr_{name}"));
        }
        if atomics {
            host.push_str(&format!("rs_{name} = zeros([{m}], {d})\n"));
            args.push_str(&format!(", rs_{name}"));
        }
        host.push_str(&format!("{name}({args})\n"));
        host.push_str(&self.show(&o, m * n <= 8));
        if transpose {
            host.push_str(&self.show(&format!("tr_{name}"), false));
        }
        self.host.push(host);
    }

    /// A tiled matrix product with a `dot` loop and an epilogue.
    fn gemm(&mut self) {
        let name = self.fresh_kernel();
        let dt = *self.rng.pick(DOT_DTYPES);
        let d = dt.name();
        // Up to 128 x 128 x 64 and four stages: the tiles and pipelines that
        // take wgmma and TMA on sm_90a (and MFMA/WMMA on the AMD arches).
        let bm = *self.rng.pick(&[16i64, 32, 64, 128]);
        let bn = *self.rng.pick(&[16i64, 32, 64, 128]);
        let bk = *self.rng.pick(&[16i64, 32, 64]);
        let stages = self.rng.range(1, 5);
        let bt = self.rng.chance(1, 3);
        let grid = "(cdiv(M, BM), cdiv(N, BN))";
        let mut text = self.decorator_for(Some(grid), &format!(", num_stages={stages}"), bm * bn);
        let b_ty = if bt { "\"N\", \"K\"" } else { "\"K\", \"N\"" };
        text.push_str(&format!(
            "def {name}(A: Tensor[\"M\", \"K\", {d}], B: Tensor[{b_ty}, {d}], C: Tensor[\"M\", \"N\", f32], BM: const = {bm}, BN: const = {bn}, BK: const = {bk}):\n    m0 = program_id(0) * BM\n    n0 = program_id(1) * BN\n    acc = zeros([BM, BN], f32)\n    for k in range(0, K, BK):\n        a = load(A[m0 : m0 + BM, k : k + BK])\n"
        ));
        if bt {
            text.push_str("        b = load(B[n0 : n0 + BN, k : k + BK]).T\n");
        } else {
            text.push_str("        b = load(B[k : k + BK, n0 : n0 + BN])\n");
        }
        let tf32 = if dt == F32 && self.rng.chance(1, 2) {
            ", precision=\"tf32\""
        } else {
            ""
        };
        let step = match self.rng.below(3) {
            0 => format!("acc = dot(a, b, acc{tf32})"),
            1 => format!("acc += dot(a, b{tf32})"),
            _ if tf32.is_empty() => "acc = acc + a @ b".to_string(),
            _ => format!("acc = dot(a, b, acc{tf32})"),
        };
        text.push_str(&format!("        {step}\n"));
        let epilogue = *self.rng.pick(&[
            "acc",
            "maximum(acc, 0.0)",
            "acc * 0.5",
            "where(acc > 0.0, acc, acc * 0.1)",
            "acc - max(acc, axis=1, keepdims=True)",
        ]);
        text.push_str(&format!(
            "    store(C[m0 : m0 + BM, n0 : n0 + BN], {epilogue})\n"
        ));
        self.defs.push(text);
        let m = self.rng.range(1, 70);
        let n = self.rng.range(1, 70);
        let k = self.rng.range(1, 70);
        let a = self.host_tensor(dt, &[m, k]);
        let b = if bt {
            self.host_tensor(dt, &[n, k])
        } else {
            self.host_tensor(dt, &[k, n])
        };
        let host = format!(
            "a_{name} = {a}\nb_{name} = {b}\nc_{name} = zeros([{m}, {n}], f32)\n{name}(a_{name}, b_{name}, c_{name})\n{}",
            self.show(&format!("c_{name}"), false)
        );
        self.host.push(host);
    }

    /// Flash attention as a user writes it: a loop over key blocks with two
    /// dots, an online softmax and, sometimes, a causal mask (the loops
    /// whose dots take wgmma with P from registers and q copied once by TMA
    /// on sm_90a, `mma.sync` before it, MFMA/WMMA on the AMD arches).
    fn attention(&mut self) {
        let name = self.fresh_kernel();
        let dt = *self.rng.pick(&[F16, Bf16]);
        let d = dt.name();
        let dh = *self.rng.pick(&[16i64, 32, 64, 128]);
        let bm = *self.rng.pick(&[16i64, 32, 64, 128]);
        let bn = *self.rng.pick(&[16i64, 32, 64, 128]);
        let causal = self.rng.chance(1, 2);
        let stages = self.rng.range(1, 3);
        let mut text = self.decorator_for(
            Some("(cdiv(S, BM), H)"),
            &format!(", num_stages={stages}"),
            bm * dh.max(bn),
        );
        text.push_str(&format!(
            "def {name}(q: Tensor[\"H\", \"S\", {dh}, {d}], k: Tensor[\"H\", \"S\", {dh}, {d}], v: Tensor[\"H\", \"S\", {dh}, {d}], o: Tensor[\"H\", \"S\", {dh}, {d}], scale: f32, BM: const = {bm}, BN: const = {bn}):\n    h = program_id(1)\n    m0 = program_id(0) * BM\n    qt = load(q[h, m0 : m0 + BM, :])\n    m_i = full([BM], -inf, f32)\n    l_i = zeros([BM], f32)\n    acc = zeros([BM, {dh}], f32)\n"
        ));
        let end = if causal { "min(S, m0 + BM)" } else { "S" };
        text.push_str(&format!(
            "    for n0 in range(0, {end}, BN):\n        s = dot(qt, load(k[h, n0 : n0 + BN, :]).T) * scale\n"
        ));
        if causal {
            text.push_str("        s = where(arange(m0, m0 + BM)[:, None] >= arange(n0, n0 + BN)[None, :], s, -inf)\n");
        }
        text.push_str(&format!(
            "        s = where(arange(n0, n0 + BN)[None, :] < S, s, -inf)\n        m_new = maximum(m_i, max(s, axis=1))\n        p = exp(s - m_new[:, None])\n        alpha = exp(m_i - m_new)\n        l_i = l_i * alpha + sum(p, axis=1)\n        acc = acc * alpha[:, None] + dot(p.to({d}), load(v[h, n0 : n0 + BN, :]))\n        m_i = m_new\n    store(o[h, m0 : m0 + BM, :], (acc / l_i[:, None]).to({d}))\n"
        ));
        self.defs.push(text);
        let heads = self.rng.range(1, 3);
        let seq = self.rng.range(1, 100);
        let mut host = String::new();
        for t in ["q", "k", "v"] {
            let x = self.host_tensor(dt, &[heads, seq, dh]);
            host.push_str(&format!("{t}_{name} = {x}\n"));
        }
        host.push_str(&format!(
            "o_{name} = zeros([{heads}, {seq}, {dh}], {d})\n{name}(q_{name}, k_{name}, v_{name}, o_{name}, 0.125)\n{}",
            self.show(&format!("o_{name}"), false)
        ));
        self.host.push(host);
    }

    /// A row reduction with a `for` or `while` loop carrying a tile, and
    /// branches with `break`/`continue`.
    fn loop_reduce(&mut self) {
        let name = self.fresh_kernel();
        let dt = *self.rng.pick(FLOAT_DTYPES);
        let d = dt.name();
        let block = *self.rng.pick(&[8i64, 32, 128]);
        let mut text = self.decorator(Some("(M,)"), "");
        text.push_str(&format!(
            "def {name}(x: Tensor[\"M\", \"N\", {d}], out: Tensor[\"M\", {d}], limit: i32, BLOCK: const = {block}):\n    row = program_id(0)\n    acc = zeros([BLOCK], {d})\n"
        ));
        let use_while = self.rng.chance(1, 2);
        let ind = "        ";
        if use_while {
            text.push_str("    c = 0\n    while c < N:\n");
        } else {
            text.push_str("    for c in range(0, N, BLOCK):\n");
        }
        text.push_str(&format!("{ind}v = load(x[row, c : c + BLOCK])\n"));
        match self.rng.below(3) {
            0 => text.push_str(&format!("{ind}if c > limit:\n{ind}    break\n")),
            1 if !use_while => {
                text.push_str(&format!("{ind}if row % 2 == 1:\n{ind}    continue\n"))
            }
            _ => {}
        }
        let vars = vec!["v".to_string(), "acc".to_string()];
        let e = self.expr(&vars, dt, 2);
        text.push_str(&format!("{ind}acc = acc + {e}\n"));
        if use_while {
            text.push_str(&format!("{ind}c += BLOCK\n"));
        }
        if self.rng.chance(1, 2) {
            text.push_str("    store(out[row], sum(acc, axis=0))\n");
        } else {
            text.push_str(&format!(
                "    store(out[row : row + 1], max(acc, axis=0, keepdims=True).to({d}))\n"
            ));
        }
        self.defs.push(text);
        let m = self.rng.range(1, 10);
        let n = self.rng.range(0, 300).max(1);
        let limit = self.rng.range(-5, 400);
        let host = format!(
            "x_{name} = {}\no_{name} = zeros([{m}], {d})\n{name}(x_{name}, o_{name}, {limit})\n{}",
            self.host_tensor(dt, &[m, n]),
            self.show(&format!("o_{name}"), m <= 8)
        );
        self.host.push(host);
    }

    /// Gathers through an index tensor, a masked scatter, a histogram by atomics.
    fn gather(&mut self) {
        let name = self.fresh_kernel();
        let dt = *self.rng.pick(ELEM_DTYPES);
        let d = dt.name();
        let it = *self.rng.pick(&[I32, I64]);
        let block = *self.rng.pick(&[8i64, 16, 64]);
        let hist = self.rng.chance(1, 2);
        let mut text = self.decorator(Some("(cdiv(K, BLOCK),)"), "");
        let hist_param = if hist { ", hist: Tensor[8, i32]" } else { "" };
        text.push_str(&format!(
            "def {name}(x: Tensor[\"N\", {d}], idx: Tensor[\"K\", {}], out: Tensor[\"K\", {d}]{hist_param}, BLOCK: const = {block}):\n    j = program_id(0) * BLOCK + arange(0, BLOCK)\n    i = load(idx[j], mask=j < K)\n    v = load(x[i], other={})\n",
            it.name(),
            if dt.is_float() { "-1.0" } else { "0" }
        ));
        let mut vars = vec!["v".to_string()];
        let last = self.chain(&mut text, &mut vars, dt, "    ");
        text.push_str(&format!("    store(out[j], {last}, mask=j < K)\n"));
        if hist {
            text.push_str("    atomic_add(hist[i % 8], 1, mask=j < K)\n");
        }
        self.defs.push(text);
        let n = self.rng.range(1, 50);
        let k = self.rng.range(1, 40);
        let idx: Vec<String> = (0..k)
            .map(|_| self.rng.range(-3, n + 3).to_string())
            .collect();
        let mut host = format!(
            "x_{name} = {}\ni_{name} = tensor([{}], {})\no_{name} = zeros([{k}], {d})\n",
            self.host_tensor(dt, &[n]),
            idx.join(", "),
            it.name()
        );
        if hist {
            host.push_str(&format!(
                "h_{name} = zeros([8], i32)\n{name}(x_{name}, i_{name}, o_{name}, h_{name})\nprint(h_{name})\n"
            ));
        } else {
            host.push_str(&format!("{name}(x_{name}, i_{name}, o_{name})\n"));
        }
        host.push_str(&self.show(&format!("o_{name}"), k <= 8));
        self.host.push(host);
    }

    fn function(&mut self) {
        if !self.launchable.is_empty() && self.rng.chance(1, 3) {
            return self.launching_function();
        }
        let fname = format!("f{}", self.defs.len());
        let dt = *self.rng.pick(&[F32, F32, F16, Bf16, F64]);
        let d = dt.name();
        let m = self.rng.range(1, 24);
        let n = self.rng.range(1, 24);
        match self.rng.below(3) {
            0 => {
                let mut text = format!(
                    "def {fname}(a: Tensor[\"M\", \"N\", {d}], b: Tensor[\"M\", \"N\", {d}], s: f32) -> Tensor[\"M\", \"N\", {d}]:\n    c = a * s + b\n"
                );
                let op = *self.rng.pick(&[
                    "softmax(c, dim=-1)",
                    "softmax(c, dim=0)",
                    "relu(c)",
                    "gelu(c)",
                    "silu(c)",
                    "layer_norm(c)",
                    "rms_norm(c)",
                    "exp(minimum(c, 5.0))",
                    "where(c > b, c, b)",
                    "maximum(c, a)",
                    "transpose(transpose(c, 0, 1), 0, 1)",
                    "c.T.T",
                    "c - mean(c, dim=-1, keepdims=True)",
                    "c / (sum(abs(c), dim=0, keepdims=True) + 1.0)",
                    "tanh(c) * sigmoid(c)",
                    "reshape(reshape(c, [-1]), [M, N])",
                ]);
                text.push_str(&format!("    d = {op}\n    return d\n"));
                self.defs.push(text);
                let host = format!(
                    "a_{fname} = {}\nb_{fname} = {}\nr_{fname} = {fname}(a_{fname}, b_{fname}, {})\n{}",
                    self.host_tensor(dt, &[m, n]),
                    self.host_tensor(dt, &[m, n]),
                    self.literal(F32),
                    self.show(&format!("r_{fname}"), m * n <= 8)
                );
                self.host.push(host);
            }
            1 => {
                let k = self.rng.range(1, 24);
                let (sig_b, call_b, bshape) = if self.rng.chance(1, 2) {
                    (
                        format!("b: Tensor[\"K\", \"N\", {d}]"),
                        "matmul(a, b)",
                        [k, n],
                    )
                } else {
                    (
                        format!("b: Tensor[\"N\", \"K\", {d}]"),
                        "a @ transpose(b, 0, 1)",
                        [n, k],
                    )
                };
                let text = format!(
                    "def {fname}(a: Tensor[\"M\", \"K\", {d}], {sig_b}) -> Tensor[\"M\", \"N\", {d}]:\n    return {call_b}\n"
                );
                self.defs.push(text);
                let host = format!(
                    "a_{fname} = {}\nb_{fname} = {}\nr_{fname} = {fname}(a_{fname}, b_{fname})\n{}",
                    self.host_tensor(dt, &[m, k]),
                    self.host_tensor(dt, &bshape),
                    self.show(&format!("r_{fname}"), false)
                );
                self.host.push(host);
            }
            _ => {
                let red = *self.rng.pick(&["sum", "max", "min", "mean"]);
                let text = format!(
                    "def {fname}(a: Tensor[\"M\", \"N\", {d}]) -> Tensor[\"M\", {d}]:\n    return {red}(a, dim=1)\n"
                );
                self.defs.push(text);
                let host = format!(
                    "a_{fname} = {}\nr_{fname} = {fname}(a_{fname})\n{}",
                    self.host_tensor(dt, &[m, n]),
                    self.show(&format!("r_{fname}"), m <= 8)
                );
                self.host.push(host);
            }
        }
    }

    /// A whole-tensor function that allocates and launches an elementwise kernel.
    fn launching_function(&mut self) {
        let k = self.launchable[self.rng.below(self.launchable.len())].clone();
        let fname = format!("f{}", self.defs.len());
        let d = k.dt.name();
        let alpha = match k.alpha {
            Some(F32) => ", 1.5",
            Some(_) => ", 2",
            None => "",
        };
        let grid = if k.has_grid && self.rng.chance(2, 3) {
            String::new()
        } else {
            "[(cdiv(N, 64),)]".to_string()
        };
        let block = if grid.is_empty() { "" } else { ", BLOCK=64" };
        let text = format!(
            "def {fname}(x: Tensor[\"N\", {d}], y: Tensor[\"N\", {d}]) -> Tensor[\"N\", {d}]:\n    out = empty([N], {d})\n    {}{grid}(x, y, out{alpha}{block})\n    return out\n",
            k.name
        );
        self.defs.push(text);
        let n = self.rng.range(1, 300);
        let host = format!(
            "x_{fname} = {}\nr_{fname} = {fname}(x_{fname}, x_{fname})\n{}",
            self.host_tensor(k.dt, &[n]),
            self.show(&format!("r_{fname}"), n <= 8)
        );
        self.host.push(host);
    }

    /// Host scalars and control flow around launches.
    fn host_control(&mut self) {
        let n = self.rng.range(0, 6);
        let mut host = format!("total = 0\nfor i in range({n}):\n    if i % 2 == 0:\n        continue\n    total += i\n");
        if let Some(k) = self.launchable.first().cloned() {
            let d = k.dt.name();
            let alpha = match k.alpha {
                Some(F32) => ", 0.5",
                Some(_) => ", 1",
                None => "",
            };
            let grid = if k.has_grid { "" } else { "[(4,)]" };
            host.push_str(&format!(
                "v = zeros([37], {d})\nfor j in range(2):\n    {}{grid}(v, v, v{alpha})\n",
                k.name
            ));
        }
        host.push_str("print(total, cdiv(total + 7, 4))\n");
        self.host.push(host);
    }
}
