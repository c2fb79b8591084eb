//! Random valid kernels for the register estimate, deterministic from a seed.
//!
//! Each seed picks one shape of kernel (an elementwise chain over 1-D tiles,
//! a reduction over 2-D tiles, a loop accumulating tiles, a dot loop on
//! tensor cores, a gather through an index tile) and then its dtypes, tile
//! sizes, `num_warps`, masks and the chain of operations. Every kernel it
//! makes must check clean and compile on sm_70, sm_80 and sm_90: one that
//! does not is a bug in the compiler or here. Dtypes are those every one of
//! those archs supports (f8 only as stored data, converted to f32).

/// splitmix64: small, deterministic, good enough to pick among options.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xd1b5_4a32_d192_ed03)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Float dtypes a tile may be stored in (computed in f32 where narrower).
const STORED: [&str; 5] = ["f32", "f16", "bf16", "f32", "f8e4m3"];

/// The `.tsr` source of the kernel of `seed` (one kernel named `k`).
pub fn kernel(seed: u64) -> String {
    let mut r = Rng::new(seed);
    match r.below(6) {
        0 | 1 => elementwise(&mut r),
        2 => reduction(&mut r),
        3 => loop_accumulate(&mut r),
        4 => dot_loop(&mut r),
        _ => gather(&mut r),
    }
}

/// A chain of `min + (0..span)` elementwise f32 operations on `v` with the
/// values of `others`, as statements assigning `v`.
fn chain(r: &mut Rng, min: u64, span: u64, others: &[String], indent: &str) -> String {
    let len = min + r.below(span);
    let mut out = String::new();
    for _ in 0..len {
        let o = r.pick(others).clone();
        let c = format!("{}.{}", r.below(4), r.below(10));
        let e = match r.below(14) {
            0 => format!("v + {o}"),
            1 => format!("v * {o}"),
            2 => format!("v - {o} * {c}"),
            3 => format!("maximum(v, {o})"),
            4 => format!("minimum(v, {o}) + {c}"),
            5 => "exp(v * 0.5)".to_string(),
            6 => "sqrt(abs(v) + 1.0)".to_string(),
            7 => format!("where(v > {c}, v, {o})"),
            8 => format!("v / ({o} * {o} + 1.0)"),
            9 => "tanh(v)".to_string(),
            10 => format!("v * {c} + {o}"),
            11 => "rsqrt(v * v + 1.0)".to_string(),
            12 => "log(abs(v) + 1.0)".to_string(),
            _ => format!("fma_like(v, {o})"),
        };
        let e = if e.starts_with("fma_like") {
            format!("v * {o} + v")
        } else {
            e
        };
        out += &format!("{indent}v = {e}\n");
    }
    out
}

/// The fewest of `options` warps (else the most) that keep a tile of
/// `elems` f32 elements within 64 registers a thread.
fn warps_for(elems: u32, options: &[u32], r: &mut Rng) -> u32 {
    let w = *r.pick(options);
    let mut w = w;
    while elems / (32 * w) > 64 && w < 8 {
        w *= 2;
    }
    w
}

fn to_f32(e: &str, dtype: &str) -> String {
    if dtype == "f32" {
        e.to_string()
    } else {
        format!("{e}.to(f32)")
    }
}

fn from_f32(e: &str, dtype: &str) -> String {
    if dtype == "f32" {
        e.to_string()
    } else {
        format!("({e}).to({dtype})")
    }
}

/// Elementwise over 1-D tiles: `k` inputs, masked or not, a chain, a store.
fn elementwise(r: &mut Rng) -> String {
    let block = *r.pick(&[128u32, 256, 512, 1024, 2048]);
    let warps = *r.pick(&[1u32, 2, 4, 8]);
    let block = block.max(32 * warps);
    let inputs = 1 + r.below(4) as usize;
    let dtypes: Vec<&str> = (0..inputs).map(|_| *r.pick(&STORED)).collect();
    let out_ty = *r.pick(&["f32", "f16", "bf16"]);
    let masked = r.chance(50);
    let mut params: Vec<String> = dtypes
        .iter()
        .enumerate()
        .map(|(j, d)| format!("x{j}: Tensor[\"N\", {d}]"))
        .collect();
    params.push(format!("out: Tensor[\"N\", {out_ty}]"));
    let scalar = r.chance(40);
    if scalar {
        params.push("alpha: f32".into());
    }
    let mut body = format!("    offs = program_id(0) * {block} + arange(0, {block})\n");
    if masked {
        body += "    m = offs < N\n";
    }
    let mut names = Vec::new();
    for (j, d) in dtypes.iter().enumerate() {
        let ld = if masked {
            format!("load(x{j}[offs], mask=m, other=0.0)")
        } else {
            format!("load(x{j}[offs])")
        };
        body += &format!("    a{j} = {}\n", to_f32(&ld, d));
        names.push(format!("a{j}"));
    }
    if scalar {
        names.push("alpha".into());
    }
    body += "    v = a0\n";
    body += &chain(r, 1, 8, &names, "    ");
    let st = from_f32("v", out_ty);
    body += &if masked {
        format!("    store(out[offs], {st}, mask=m)\n")
    } else {
        format!("    store(out[offs], {st})\n")
    };
    format!(
        "@kernel(grid=(cdiv(N, {block}),), num_warps={warps})\ndef k({}):\n{body}",
        params.join(", ")
    )
}

/// A 2-D tile reduced along one axis (sum, max, min or mean), optionally
/// normalised by the reduction (x - max, x / sum), and stored.
fn reduction(r: &mut Rng) -> String {
    let bm = *r.pick(&[1u32, 2, 4, 8, 16, 32]);
    let bn = *r.pick(&[64u32, 128, 256, 512, 1024]);
    let warps = warps_for(bm * bn, &[1, 2, 4, 8], r);
    let dtype = *r.pick(&STORED);
    let axis = r.below(2);
    let op = *r.pick(&["sum", "max", "min", "mean"]);
    let normalise = r.chance(50);
    let mut body = format!(
        "    r0 = program_id(0) * {bm}\n    t = {}\n    v = t\n",
        to_f32(&format!("load(x[r0 : r0 + {bm}, 0 : {bn}])"), dtype)
    );
    body += &chain(r, 0, 4, &["t".to_string()], "    ");
    let (out_ty, store) = if normalise {
        body += &format!("    red = {op}(v, axis={axis}, keepdims=True)\n");
        body += &format!("    v = exp(v - red)\n    s = sum(v, axis={axis}, keepdims=True)\n");
        (
            format!("Tensor[\"M\", {bn}, f32]"),
            format!("    store(out[r0 : r0 + {bm}, 0 : {bn}], v / s)\n"),
        )
    } else if axis == 1 {
        body += &format!("    red = {op}(v, axis=1)\n");
        (
            "Tensor[\"M\", f32]".to_string(),
            format!("    store(out[r0 : r0 + {bm}], red)\n"),
        )
    } else {
        body += &format!("    red = {op}(v, axis=0)\n");
        (
            format!("Tensor[\"M\", {bn}, f32]"),
            format!("    store(out[program_id(0), 0 : {bn}], red)\n"),
        )
    };
    body += &store;
    format!(
        "@kernel(grid=(cdiv(M, {bm}),), num_warps={warps})\n\
         def k(x: Tensor[\"M\", {bn}, {dtype}], out: {out_ty}):\n{body}"
    )
}

/// A loop over a run-time length accumulating a function of loaded tiles
/// (sum, max or a product with a second input), then a chain and a store.
fn loop_accumulate(r: &mut Rng) -> String {
    let block = *r.pick(&[128u32, 256, 512, 1024]);
    let warps = *r.pick(&[1u32, 2, 4, 8]);
    let block = block.max(32 * warps);
    let rows = *r.pick(&[1u32, 2, 4]);
    let warps = warps_for(rows * block * 2, &[warps], r);
    let dtype = *r.pick(&STORED);
    let int = r.chance(20);
    let (dtype, acc_ty, zero) = if int {
        ("i32", "i32", "0")
    } else {
        (dtype, "f32", "0.0")
    };
    let two = r.chance(40);
    let masked = r.chance(50);
    let ld = |name: &str| {
        let e = if masked {
            format!("load({name}[r0 : r0 + {rows}, cols], mask=cols < K, other={zero})")
        } else {
            format!("load({name}[r0 : r0 + {rows}, k : k + {block}])")
        };
        if int {
            e
        } else {
            to_f32(&e, dtype)
        }
    };
    let mut body = format!(
        "    r0 = program_id(0) * {rows}\n    acc = zeros([{rows}, {block}], {acc_ty})\n    for k in range(0, K, {block}):\n"
    );
    if masked {
        body += &format!("        cols = k + arange(0, {block})\n");
    }
    let term = if two {
        format!("{} * {}", ld("x"), ld("y"))
    } else {
        ld("x")
    };
    let update = match r.below(3) {
        0 | 1 => format!("acc + {term}"),
        _ => format!("maximum(acc, {term})"),
    };
    body += &format!("        acc = {update}\n");
    let mut params = vec![format!("x: Tensor[\"M\", \"K\", {dtype}]")];
    if two {
        params.push(format!("y: Tensor[\"M\", \"K\", {dtype}]"));
    }
    if int {
        body += "    v = sum(acc, axis=1)\n";
        params.push("out: Tensor[\"M\", i32]".into());
    } else {
        body += "    v = sum(acc, axis=1)\n";
        body += &chain(r, 0, 3, &["v".to_string()], "    ");
        params.push("out: Tensor[\"M\", f32]".into());
    }
    body += &format!("    store(out[r0 : r0 + {rows}], v)\n");
    format!(
        "@kernel(grid=(cdiv(M, {rows}),), num_warps={warps})\ndef k({}):\n{body}",
        params.join(", ")
    )
}

/// C = A @ B over a K loop on tensor cores (f16 or f32 operands), with an
/// epilogue chain and a store in f32 or f16.
fn dot_loop(r: &mut Rng) -> String {
    let dtype = *r.pick(&["f16", "f16", "f32"]);
    let bm = *r.pick(&[16u32, 32, 64, 128]);
    let bn = *r.pick(&[16u32, 32, 64, 128]);
    let bk = *r.pick(&[16u32, 32, 64]);
    let warps = warps_for(bm * bn, &[1, 2, 4, 8], r);
    let stages = *r.pick(&[1u32, 2, 3]);
    let out_ty = *r.pick(&["f32", "f16"]);
    let bias = r.chance(40);
    let mut params = vec![
        format!("a: Tensor[\"M\", \"K\", {dtype}]"),
        format!("b: Tensor[\"K\", \"N\", {dtype}]"),
    ];
    if bias {
        params.push("bias: Tensor[\"N\", f32]".into());
    }
    params.push(format!("c: Tensor[\"M\", \"N\", {out_ty}]"));
    let mut body = format!(
        "    m0 = program_id(0) * {bm}\n    n0 = program_id(1) * {bn}\n    acc = zeros([{bm}, {bn}], f32)\n\
         \x20   for k in range(0, K, {bk}):\n\
         \x20       acc = dot(load(a[m0 : m0 + {bm}, k : k + {bk}]), load(b[k : k + {bk}, n0 : n0 + {bn}]), acc)\n\
         \x20   v = acc\n"
    );
    let mut others = vec!["acc".to_string()];
    if bias {
        body += &format!("    bv = load(bias[n0 : n0 + {bn}])[None, :]\n");
        others = vec!["bv".to_string()];
    }
    body += &chain(r, 0, 3, &others, "    ");
    body += &format!(
        "    store(c[m0 : m0 + {bm}, n0 : n0 + {bn}], {})\n",
        from_f32("v", out_ty)
    );
    format!(
        "@kernel(grid=(cdiv(M, {bm}), cdiv(N, {bn})), num_warps={warps}, num_stages={stages})\ndef k({}):\n{body}",
        params.join(", ")
    )
}

/// Rows of a table gathered through an index tile (i32 or i64), or single
/// elements through a permutation, then a chain and a store.
fn gather(r: &mut Rng) -> String {
    let idx_ty = *r.pick(&["i32", "i64"]);
    let dtype = *r.pick(&STORED);
    let warps = *r.pick(&[1u32, 2, 4]);
    if r.chance(50) {
        let bt = *r.pick(&[4u32, 8, 16, 32]);
        let width = *r.pick(&[32u32, 64, 128]);
        let mut body = format!(
            "    t0 = program_id(0) * {bt}\n    tok = load(ids[t0 : t0 + {bt}], other=0)\n    v = {}\n",
            to_f32(&format!("load(table[tok, 0 : {width}], other=0.0)"), dtype)
        );
        body += &chain(r, 0, 4, &["v".to_string()], "    ");
        body += &format!("    store(out[t0 : t0 + {bt}, :], v)\n");
        format!(
            "@kernel(grid=(cdiv(T, {bt}),), num_warps={warps})\n\
             def k(ids: Tensor[\"T\", {idx_ty}], table: Tensor[\"V\", {width}, {dtype}], out: Tensor[\"T\", {width}, f32]):\n{body}"
        )
    } else {
        let block = *r.pick(&[128u32, 256, 512]).max(&(32 * warps));
        let mut body = format!(
            "    i = program_id(0) * {block}\n    p = load(perm[i : i + {block}], other=-1)\n    v = {}\n",
            to_f32("load(x[p], other=0.0)", dtype)
        );
        body += &chain(r, 0, 4, &["v".to_string()], "    ");
        body += &format!("    store(out[i : i + {block}], v)\n");
        format!(
            "@kernel(grid=(cdiv(N, {block}),), num_warps={warps})\n\
             def k(x: Tensor[\"N\", {dtype}], perm: Tensor[\"N\", {idx_ty}], out: Tensor[\"N\", f32]):\n{body}"
        )
    }
}
