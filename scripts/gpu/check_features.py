"""Runs the kernels of tests/ui/valid/gather.tsr (tensors indexed with tiles:
gathers, scatters, an atomic histogram), the tile slices of
tests/ui/emit/tile_slices.tsr, the powers of tests/ui/valid/powers.tsr and the
dtype corners of tests/ui/emit/kernel_dtypes.tsr on the GPU and compares them
with references computed here. Out-of-range indices must
read `other=` and never be written.
Usage: check_features.py FILE.ptx   (scripts/gpu/check-brief.sh builds it)"""
import math, os, random, re, struct, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_driver  # noqa: E402  (loads sys.argv[1])
from cuda_driver import Buf, bf16_bits, bf16_val, close, launch  # noqa: E402

cuda_driver.FMT.update({"i64": "q", "f64": "d", "u8": "B", "u32": "I", "bool": "B"})
random.seed(7)
text = open(sys.argv[1]).read()
cdiv = lambda a, b: (a + b - 1) // b


def params(name):
    """The kernel's parameter names in order, and its block size."""
    body = text[text.index(f".entry {name}(") :]
    names = re.findall(rf"{name}_param_(\w+)", body[: body.index(")")])
    threads = int(re.search(r"\.maxntid (\d+)", body).group(1))
    return names, threads


def run(name, grid, **args):
    names, threads = params(name)
    launch(name, grid, threads, [args[n] for n in names])


def f32(n):
    """Values an f32 tensor holds exactly."""
    return [struct.unpack("<f", struct.pack("<f", random.uniform(-1, 1)))[0] for _ in range(n)]


ok = True
# Triton-style offsets: a masked contiguous range.
N = 3000
x, y = f32(N), f32(N)
out = Buf([0.0] * N, "f32")
run("vadd_offsets", [cdiv(N, 1024)], x=Buf(x, "f32"), y=Buf(y, "f32"), out=out, N=N)
ok &= close(out.get(), [a + b for a, b in zip(x, y)], 1e-6, "vadd_offsets (N=3000)")

# Embedding rows gathered by token (f16 table), tokens out of range read 0.
V, T = 50, 70
table = [float(v) for v in f32(V * 64)]
table = [round(v * 1024) / 1024 for v in table]  # exact in f16
tok = [random.randrange(V) for _ in range(T)]
tok[3], tok[10], tok[41] = -1, V, 1000
out = Buf([7.0] * (T * 64), "f32")
run("embedding", [cdiv(T, 32)], table=Buf(table, "f16"), tokens=Buf(tok, "i32"), out=out, V=V, T=T)
ref = [table[t * 64 + c] if 0 <= t < V else 0.0 for t in tok for c in range(64)]
ok &= close(out.get(), ref, 0.0, "embedding (V=50, T=70, 3 tokens out of range)")

# A permutation with i64 indices, some past the end, negative or past 2^32.
N = 600
x = f32(N)
perm = [random.randrange(N) for _ in range(N)]
perm[0], perm[1], perm[2], perm[3] = -1, N, (1 << 32) + 5, -(1 << 40)
out = Buf([0.0] * N, "f32")
run("permute", [cdiv(N, 256)], x=Buf(x, "f32"), perm=Buf(perm, "i64"), out=out, fill=-2.5, N=N)
ok &= close(out.get(), [x[p] if 0 <= p < N else -2.5 for p in perm], 0.0, "permute (i64 indices, 4 out of range)")

# A scatter of rows through a permutation.
x = f32(32 * 64)
p = list(range(32))
random.shuffle(p)
out = Buf([0.0] * (32 * 64), "f32")
run("scatter_rows", [1], x=Buf(x, "f32"), p=Buf(p, "i32"), out=out)
ref = [0.0] * (32 * 64)
for i in range(32):
    ref[p[i] * 64 : p[i] * 64 + 64] = x[i * 64 : i * 64 + 64]
ok &= close(out.get(), ref, 0.0, "scatter_rows")

# An atomic histogram; values outside [0, 64) are dropped.
N = 5000
vals = [random.randrange(-3, 70) for _ in range(N)]
hist = Buf([0] * 64, "i32")
run("histogram", [cdiv(N, 512)], vals=Buf(vals, "i32"), hist=hist, N=N)
ref = [sum(1 for v in vals if v == b) for b in range(64)]
ok &= close(hist.get(), ref, 0.0, "histogram (N=5000)")

# Every other column of a bf16 matrix (an outer-product gather).
M = 40
xb = [bf16_bits(v) for v in f32(M * 64)]
out = Buf([0] * (M * 32), "bf16")
run("even_columns", [cdiv(M, 16)], x=Buf(xb, "bf16"), out=out, M=M)
ref = [bf16_val(xb[r * 64 + 2 * c]) for r in range(M) for c in range(32)]
ok &= close([bf16_val(b) for b in out.get()], ref, 0.0, "even_columns (bf16, M=40)")

# Tile slices and indices.
x = f32(16)
out = Buf([0.0] * 16, "f32")
run("halves", [1], x=Buf(x, "f32"), out=out)
ref = [2 * v for v in x[8:]] + x[12:] + [x[3], x[15] + x[0]]
ok &= close(out.get()[:14], ref, 1e-6, "halves (tile slices and indices)")
x = f32(64)
o, col = Buf([0.0] * 16, "f32"), Buf([0.0] * 8, "f32")
run("corner", [1], x=Buf(x, "f32"), out=o, col=col)
ok &= close(o.get(), [x[r * 8 + c] for r in range(2, 6) for c in range(4, 8)], 0.0, "corner t[2:6, 4:]")
ok &= close(col.get(), [x[r * 8 + 5] for r in range(8)], 0.0, "corner t[:, 5]")
xb = [bf16_bits(v) for v in f32(64 * 32)]
out = Buf([0] * 64, "bf16")
run("first_rows", [1], x=Buf(xb, "bf16"), out=out)
ref = [bf16_val(bf16_bits(bf16_val(xb[r * 32 + c]) + bf16_val(xb[(62 + r) * 32 + c]))) for r in range(2) for c in range(32)]
ok &= close([bf16_val(b) for b in out.get()], ref, 0.0, "first_rows t[0:2] + t[-2:] (bf16)")

# Powers: constant exponents, powf semantics for run-time ones, integer powers.
def powf(a, b):
    if b == 0:
        return 1.0
    if a < 0 and b != math.floor(b):
        return math.nan
    try:
        return math.pow(a, b)
    except (OverflowError, ZeroDivisionError, ValueError):
        return math.inf


def same(a, b, tol):
    return (math.isnan(a) and math.isnan(b)) or a == b or abs(a - b) <= tol * (1 + abs(b))


def wrap32(v):
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)


def ipow(a, b):
    if b < 0:
        return 1 if a == 1 else (-1 if b % 2 else 1) if a == -1 else 0
    return wrap32(a**b)


x = [2 * v for v in f32(16)]
x[0], x[1] = 0.0, -1.5
ks = [random.randrange(0, 9) for _ in range(16)]
out, iout = Buf([0.0] * 80, "f32"), Buf([0] * 48, "i32")
run("powers", [1], x=Buf(x, "f32"), e=Buf(ks, "i32"), out=out, iout=iout, p=0.75)
got = out.get()
refs = [[a**2 for a in x], [a**3 for a in x], [powf(a, 0.75) for a in x],
        [powf(a, -2.0) for a in x], [powf(a, k - 3.0) for a, k in zip(x, ks)]]
for i, (name, ref) in enumerate(zip(["t ** 2", "t ** 3.0", "t ** p", "t ** -2", "t ** (k - 3)"], refs)):
    bad = [(j, g, r) for j, (g, r) in enumerate(zip(got[i * 16 : i * 16 + 16], ref)) if not same(g, r, 1e-5)]
    print(f"powers {name}: {'ok' if not bad else f'FAIL {bad[:3]}'}")
    ok &= not bad
igot = iout.get()
irefs = [[wrap32(k**3) for k in ks], [ipow(k, k) for k in ks], [ipow(k - 2, k - 5) for k in ks]]
for i, (name, ref) in enumerate(zip(["k ** 3", "k ** k", "(k - 2) ** (k - 5)"], irefs)):
    ok &= close(igot[i * 16 : i * 16 + 16], ref, 0.0, f"powers {name}")

# Dtype corners: unsigned negation, bool reductions and ordering, f64/i64
# reductions with f16/i64/f64 atomics, min/max of three, a run-time step with break.
a = [(i * 7) % 256 for i in range(64)]
b = [(i * 1000003) % (1 << 32) for i in range(64)]
f = [1 if i % 3 == 0 else 0 for i in range(64)]
o, aa = Buf([0] * 64, "u32"), Buf([0, 0], "bool")
run("small_ints", [1], a=Buf(a, "u8"), b=Buf(b, "u32"), flags=Buf(f, "bool"), out=o, any_all=aa)
ref = [((-y) % (1 << 32) + y + ((-x) % 256)) % (1 << 32) for x, y in zip(a, b)]
ok &= close(o.get(), ref, 0.0, "small_ints -u32, abs(u32), -u8")
anyf = int(any(f) or (not f[0] and a[0] > 3))
allf = int(all(fv or av > 3 for fv, av in zip(f, a)))
ok &= close(aa.get(), [anyf, allf], 0.0, "small_ints bool max/min/ordering")
N = 1000
xs = [random.uniform(-1, 1) for _ in range(N)]
ks = [random.randrange(0, 1 << 40) for _ in range(N)]
tot, big, hist = Buf([0.0], "f64"), Buf([0], "i64"), Buf([0.0] * 8, "f16")
run("wide_sums", [cdiv(N, 128)], x=Buf(xs, "f64"), k=Buf(ks, "i64"), total=tot, big=big, hist=hist, N=N)
ok &= close(tot.get(), [sum(xs)], 1e-12, "wide_sums f64 sum + f64 atomic")
# Masked-off lanes of the last block load 0, which its min sees.
bref = sum(max(ks[i : i + 128]) + min(ks[i : i + 128] + [0] * (i + 128 - min(N, i + 128))) for i in range(0, N, 128))
ok &= close(big.get(), [bref], 0.0, "wide_sums i64 max/min + i64 atomic")
ok &= close(hist.get(), [sum(1 for v in ks if v % 8 == j) for j in range(8)], 0.0, "wide_sums f16 atomic")
xs = [random.uniform(-3, 3) for _ in range(32)]
xh = [struct.unpack("<e", struct.pack("<e", v))[0] for v in xs]
yh = Buf([0.0] * 32, "f16")
run("clamp3", [1], x=Buf(xh, "f16"), y=yh, lo=-0.5)
ok &= close(yh.get(), [max(v, -0.5, -1.0) for v in xh], 0.0, "clamp3 max of three, .to(x.dtype)")
N = 50
xs = [i * 0.25 for i in range(N)]
for step, limit in [(3, 6.0), (7, 100.0), (-1, 0.0)]:
    o = Buf([0.0], "f32")
    run("strided_until", [1], x=Buf(xs, "f32"), out=o, step=step, limit=limit, N=N)
    acc, i = 0.0, 0
    while (step > 0 and i < N) or (step < 0 and i > N):
        if xs[i] > limit:
            break
        acc, i = acc + xs[i], i + step
    ok &= close(o.get(), [acc], 1e-6, f"strided_until step={step}")

print("ALL OK" if ok else "SOME FAILED")
sys.exit(0 if ok else 1)
