"""Runs the brief's kernels (one PTX module from tsrc holding flash_attn, gemm and
softmax_rows) on the GPU and compares them with f64 Python references.
Usage: check_brief.py FILE.ptx D CAUSAL   (scripts/gpu/check-brief.sh builds the modules)"""
import ctypes, math, os, random, struct, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_driver import Buf, bf16_bits, bf16_val, ck, close, cu, fn  # noqa: E402  (loads sys.argv[1])
D, causal = int(sys.argv[2]), int(sys.argv[3])
random.seed(1)
ok = True
cdiv = lambda a, b: (a + b - 1) // b
dyn = {}
for line in open(sys.argv[1]):
    if "bytes of dynamic shared memory" in line:
        name, rest = line[3:].split(":", 1)
        dyn[name.strip()] = int(rest.split()[0])

def launch2(name, grid, threads, args):
    f = fn(name)
    sm = dyn.get(name, 0)
    if sm:
        ck(cu.cuFuncSetAttribute(f, 8, sm), "attr")  # MAX_DYNAMIC_SHARED_SIZE_BYTES
    holders = []
    for a in args:
        if isinstance(a, Buf): holders.append(ctypes.c_uint64(a.ptr.value))
        elif isinstance(a, float): holders.append(ctypes.c_float(a))
        else: holders.append(ctypes.c_int32(a))
    arr = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    g = list(grid) + [1] * (3 - len(grid))
    ck(cu.cuLaunchKernel(f, g[0], g[1], g[2], threads, 1, 1, sm, None, arr, None), "launch " + name)
    ck(cu.cuCtxSynchronize(), "sync " + name)

# flash attention: B=1, H=2, S=100
B, H, S = 1, 2, int(os.environ.get("S", "100"))
n = B * H * S * D
q = [bf16_val(bf16_bits(random.uniform(-1, 1))) for _ in range(n)]
k = [bf16_val(bf16_bits(random.uniform(-1, 1))) for _ in range(n)]
v = [bf16_val(bf16_bits(random.uniform(-1, 1))) for _ in range(n)]
bq, bk, bv = (Buf([bf16_bits(x) for x in t], "bf16") for t in (q, k, v))
bo = Buf([0] * n, "bf16")
scale = 1.0 / math.sqrt(D)
launch2("flash_attn", (cdiv(S, 128), B * H), 128, [bq, bk, bv, bo, scale, B, H, S])
got = [bf16_val(b) for b in bo.get()]
ref = []
for bh in range(B * H):
    base = bh * S * D
    for i in range(S):
        qi = q[base + i * D: base + i * D + D]
        sc = []
        for j in range(S):
            if causal and j > i:
                sc.append(-math.inf); continue
            kj = k[base + j * D: base + j * D + D]
            sc.append(sum(a * b for a, b in zip(qi, kj)) * scale)
        m = max(sc)
        p = [math.exp(x - m) for x in sc]
        l = sum(p)
        for d in range(D):
            ref.append(sum(p[j] * v[base + j * D + d] for j in range(S)) / l)
ok &= close(got, ref, 2e-2, f"flash_attn D={D} causal={causal}")

# gemm (f16 -> f32), BM=BN=128, 8 warps
SPEC = os.environ.get("GEMM_SPEC") == "1"
M, N, K = (200, 160, 96) if SPEC else (200, 150, 70)
A = [float(struct.unpack("<e", struct.pack("<e", random.uniform(-1, 1)))[0]) for _ in range(M * K)]
Bm = [float(struct.unpack("<e", struct.pack("<e", random.uniform(-1, 1)))[0]) for _ in range(K * N)]
ba, bb, bc = Buf(A, "f16"), Buf(Bm, "f16"), Buf([0.0] * (M * N), "f32")
launch2("gemm", (cdiv(M, 128), cdiv(N, 128)), 256, [ba, bb, bc, M] if SPEC else [ba, bb, bc, M, K, N])
ref = [sum(A[i * K + kk] * Bm[kk * N + j] for kk in range(K)) for i in range(M) for j in range(N)]
ok &= close(bc.get(), ref, 1e-3, "gemm")

# softmax_rows (BLOCK=1024)
M, N = 5, (160 if SPEC else 777)
xs = [random.uniform(-3, 3) for _ in range(M * N)]
bx, bo = Buf(xs, "f32"), Buf([0.0] * (M * N), "f32")
launch2("softmax_rows", (M,), 128, [bx, bo, M, N])
ref = []
for r in range(M):
    row = xs[r * N:(r + 1) * N]; m = max(row); e = [math.exp(t - m) for t in row]; s = sum(e)
    ref += [t / s for t in e]
ok &= close(bo.get(), ref, 1e-4, "softmax_rows")
print("ALL OK" if ok else "SOME FAILED")
