"""Runs the gemm of examples/gemm.tsr compiled under `-D K%8 -D N%8` (run-time M, N,
K; rows assumed 16-byte aligned, so its operands go through cp.async, or 16-byte
vector loads of f16 on sm_70) on the GPU:
with K and N multiples of 8 (but not of the tiles) it must match an f64 reference;
with K = 70 its entry check must trap, so the launch fails instead of computing
garbage. The trap leaves the context unusable, so it runs last.
Usage: check_gemm_div.py FILE.ptx   (scripts/gpu/check-brief.sh builds it)"""
import ctypes, os, random, re, struct, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_driver import Buf, ck, close, cu, fn  # noqa: E402  (loads sys.argv[1])

random.seed(3)
text = open(sys.argv[1]).read()
dyn = {m.group(1): int(m.group(2)) for m in re.finditer(r"// (\w+): (\d+) bytes of dynamic shared memory", text)}
cdiv = lambda a, b: (a + b - 1) // b


def launch(M, N, K, A, Bm):
    """Launches gemm (BM = BN = 128, 8 warps); returns (launch or sync status, C buffer)."""
    ba, bb, bc = Buf(A, "f16"), Buf(Bm, "f16"), Buf([0.0] * (M * N), "f32")
    f = fn("gemm")
    sm = dyn.get("gemm", 0)
    if sm:
        ck(cu.cuFuncSetAttribute(f, 8, sm), "attr")  # MAX_DYNAMIC_SHARED_SIZE_BYTES
    holders = [ctypes.c_uint64(b.ptr.value) for b in (ba, bb, bc)] + [ctypes.c_int32(x) for x in (M, K, N)]
    arr = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    r = cu.cuLaunchKernel(f, cdiv(M, 128), cdiv(N, 128), 1, 256, 1, 1, sm, None, arr, None)
    return (r or cu.cuCtxSynchronize()), bc


def f16(n):
    return [float(struct.unpack("<e", struct.pack("<e", random.uniform(-1, 1)))[0]) for _ in range(n)]


# cp.async exists from sm_80 on; sm_70 gets 16-byte vector loads instead.
target = int(re.search(r"\.target\s+sm_(\d+)", text).group(1))
staged = "cp.async" if target >= 80 else "ld.global.v4"
ok = "// assume K % 8 == 0 (-D K%8); trap otherwise" in text and staged in text
print(f"gemm K%8 N%8: assumption comment and {staged} in the PTX: {'ok' if ok else 'FAIL'}")
M, N, K = 200, 152, 72
A, Bm = f16(M * K), f16(K * N)
r, bc = launch(M, N, K, A, Bm)
ck(r, "gemm K%8 N%8")
ref = [sum(A[i * K + kk] * Bm[kk * N + j] for kk in range(K)) for i in range(M) for j in range(N)]
ok &= close(bc.get(), ref, 1e-3, f"gemm K%8 N%8 (M={M} N={N} K={K})")
# A K that breaks the assumption: the kernel must trap (any launch error), not run.
r, _ = launch(64, 64, 70, f16(64 * 70), f16(70 * 64))
print(f"gemm K%8 N%8 launched with K=70: {'trapped (CUDA error %d): ok' % r if r else 'FAIL: ran to completion'}")
ok &= r != 0
print("ALL OK" if ok else "SOME FAILED")
sys.exit(0 if ok else 1)
