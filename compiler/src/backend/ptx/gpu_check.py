"""Runs the test kernels' PTX on a GPU through the CUDA driver API (ctypes, no
other dependency) and compares with Python references. Usage: run.py FILE.ptx"""
import ctypes, math, random, struct, sys

cu = ctypes.CDLL("libcuda.so.1")


def ck(r, what=""):
    if r != 0:
        s = ctypes.c_char_p()
        cu.cuGetErrorString(r, ctypes.byref(s))
        raise RuntimeError(f"{what}: CUDA error {r} {s.value}")


ck(cu.cuInit(0))
dev = ctypes.c_int()
ck(cu.cuDeviceGet(ctypes.byref(dev), 0))
ctx = ctypes.c_void_p()
ck(cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
ptx = open(sys.argv[1], "rb").read() + b"\0"
mod = ctypes.c_void_p()
log = ctypes.create_string_buffer(8192)
opts = (ctypes.c_int * 2)(5, 6)  # CU_JIT_ERROR_LOG_BUFFER, _SIZE_BYTES
vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(8192))
r = cu.cuModuleLoadDataEx(ctypes.byref(mod), ptx, 2, opts, vals)
if r:
    print(log.value.decode())
ck(r, "load")


def fn(name):
    f = ctypes.c_void_p()
    ck(cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), name)
    return f


FMT = {"f32": "f", "f16": "e", "i32": "i", "bf16": "H"}


def bf16_bits(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def bf16_val(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


class Buf:
    def __init__(self, data, dt):
        self.dt, self.n = dt, len(data)
        raw = struct.pack(f"<{len(data)}{FMT[dt]}", *data)
        self.size = len(raw)
        self.ptr = ctypes.c_uint64()
        ck(cu.cuMemAlloc_v2(ctypes.byref(self.ptr), max(self.size, 4)))
        ck(cu.cuMemcpyHtoD_v2(self.ptr, raw, self.size))

    def get(self):
        out = ctypes.create_string_buffer(self.size)
        ck(cu.cuMemcpyDtoH_v2(out, self.ptr, self.size))
        return list(struct.unpack(f"<{self.n}{FMT[self.dt]}", out.raw))


def launch(name, grid, threads, args):
    f = fn(name)
    holders = []
    for a in args:
        if isinstance(a, Buf):
            holders.append(ctypes.c_uint64(a.ptr.value))
        elif isinstance(a, float):
            holders.append(ctypes.c_float(a))
        else:
            holders.append(ctypes.c_int32(a))
    arr = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    g = list(grid) + [1] * (3 - len(grid))
    ck(cu.cuLaunchKernel(f, g[0], g[1], g[2], threads, 1, 1, 0, None, arr, None), "launch " + name)
    ck(cu.cuCtxSynchronize(), "sync " + name)


def close(a, b, tol, what):
    bad = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if not (abs(x - y) <= tol * (1 + abs(y)))]
    status = "ok" if not bad else f"FAIL {len(bad)}/{len(a)} e.g. {bad[:3]}"
    print(f"{what}: {status}")
    return not bad


random.seed(0)
ok = True
cdiv = lambda a, b: (a + b - 1) // b

# vadd
N = 5000
x = [random.uniform(-1, 1) for _ in range(N)]
y = [random.uniform(-1, 1) for _ in range(N)]
bx, by, bo = Buf(x, "f32"), Buf(y, "f32"), Buf([7.0] * N, "f32")
launch("vadd", (cdiv(N, 1024),), 128, [bx, by, bo, N])
ok &= close(bo.get(), [a + b for a, b in zip(x, y)], 1e-6, "vadd")

# softmax_rows (row of N <= 1024)
M, N = 7, 1000
xs = [random.uniform(-3, 3) for _ in range(M * N)]
bx, bo = Buf(xs, "f32"), Buf([0.0] * (M * N), "f32")
launch("softmax_rows", (M,), 128, [bx, bo, M, N])
ref = []
for r in range(M):
    row = xs[r * N:(r + 1) * N]
    m = max(row)
    e = [math.exp(v - m) for v in row]
    s = sum(e)
    ref += [v / s for v in e]
ok &= close(bo.get(), ref, 1e-4, "softmax_rows")

# softmax_block_f16: [M, 128] f16, 16 rows per program
M = 37
xs = [float(struct.unpack("<e", struct.pack("<e", random.uniform(-3, 3)))[0]) for _ in range(M * 128)]
bx, bo = Buf(xs, "f16"), Buf([0.0] * (M * 128), "f16")
launch("softmax_block_f16", (cdiv(M, 16),), 128, [bx, bo, M])
ref = []
for r in range(M):
    row = xs[r * 128:(r + 1) * 128]
    m = max(row)
    e = [math.exp(v - m) for v in row]
    s = sum(e)
    ref += [v / s for v in e]
ok &= close(bo.get(), ref, 2e-3, "softmax_block_f16")


def rnd(dt):
    x = random.uniform(-1, 1)
    if dt == "f16":
        return float(struct.unpack("<e", struct.pack("<e", x))[0])
    if dt == "bf16":
        return bf16_val(bf16_bits(x))
    return x


def gemm_check(name, BM, BN, warps):
    global ok
    dt = name.split("_")[1]
    M, N, K = 100, 70, 50
    A = [rnd(dt) for _ in range(M * K)]
    B = [rnd(dt) for _ in range(K * N)]
    if dt == "bf16":
        ba, bb = Buf([bf16_bits(v) for v in A], "bf16"), Buf([bf16_bits(v) for v in B], "bf16")
    else:
        ba, bb = Buf(A, dt), Buf(B, dt)
    bc = Buf([0.0] * (M * N), "f32")
    launch(name, (cdiv(M, BM), cdiv(N, BN)), 32 * warps, [ba, bb, bc, M, K, N])
    ref = [sum(A[i * K + k] * B[k * N + j] for k in range(K)) for i in range(M) for j in range(N)]
    ok &= close(bc.get(), ref, 1e-3, name)


for name, bm, bn, w in [
    ("gemm_f16_64x64x32", 64, 64, 4),
    ("gemm_f16_128x128x32", 128, 128, 8),
    ("gemm_bf16_64x32x64", 64, 32, 4),
    ("gemm_f16_16x16x16", 16, 16, 4),
    ("gemm_f32_32x32x16", 32, 32, 2),
]:
    try:
        fn(name)
    except RuntimeError:
        continue
    gemm_check(name, bm, bn, w)
extra = sys.argv[2:]
for spec in extra:
    name, bm, bn, w = spec.split(":")
    gemm_check(name, int(bm), int(bn), int(w))

# causal_mask: s [S, S] f32, o [S, S] f32; rows m0..m0+64, cols 0..32
S = 100
s = [random.uniform(-1, 1) for _ in range(S * S)]
bs, bo = Buf(s, "f32"), Buf([5.0] * (S * S), "f32")
launch("causal_mask", (cdiv(S, 64),), 128, [bs, bo, S])
ref = [5.0] * (S * S)
for r in range(S):
    vals = [s[r * S + c] if r >= c else -math.inf for c in range(32)]
    m = max(vals)
    for c in range(32):
        ref[r * S + c] = vals[c] - m if vals[c] != -math.inf else -math.inf
got = bo.get()
ok &= close([g if g != -math.inf else -1e30 for g in got], [v if v != -math.inf else -1e30 for v in ref], 1e-6, "causal_mask")
print("ALL OK" if ok else "SOME FAILED")
sys.exit(0 if ok else 1)
