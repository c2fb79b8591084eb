"""Runs the kernels of scripts/gpu/semantics.tsr on the GPU and checks them against
f64 references and against what the CPU executor computed for the same inputs:
one meaning for each operation on the CPU and the GPU (docs/language.md, Semantics
decisions). f64 `dot` must be exact to f64 rounding, f32 `dot` (ieee by default) to
f32 rounding, `precision="tf32"` within tf32's; float-to-integer casts must equal
the rule (truncate, saturate, NaN to 0) and the CPU executor bit for bit.
Usage: check_semantics.py FILE.ptx DATA_DIR   (check-semantics.sh prepares DATA_DIR:
inputs and the CPU executor's outputs as .npy)"""
import os, re, sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_driver  # noqa: E402  (loads sys.argv[1])
from cuda_driver import Buf, launch  # noqa: E402

cuda_driver.FMT.update({"f64": "d", "i8": "b", "u8": "B"})
data = sys.argv[2]
load = lambda name: np.load(os.path.join(data, name))
cdiv = lambda a, b: (a + b - 1) // b
ok = True


def report(what, err, tol):
    global ok
    good = err <= tol
    ok &= good
    print(f"{what}: max error {err:.3e} (bound {tol:.1e}) {'ok' if good else 'FAIL'}")


def gemm(name, dt, tile, threads):
    a, b = load(f"{name}_a.npy"), load(f"{name}_b.npy")
    (m, k), n = a.shape, b.shape[1]
    c = Buf([0.0] * (m * n), dt)
    args = {"A": Buf(a.ravel().tolist(), dt), "B": Buf(b.ravel().tolist(), dt), "C": c, "M": m, "N": n, "K": k}
    launch(name, [cdiv(m, tile), cdiv(n, tile)], threads, [args[p] for p in params(name)])
    gpu = np.array(c.get(), dtype=np.float64).reshape(m, n)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    cpu = load(f"{name}_c.npy").astype(np.float64)
    return np.max(np.abs(gpu - ref) / scale), np.max(np.abs(cpu - ref) / scale), np.max(np.abs(gpu - cpu) / scale)


PTX = open(sys.argv[1]).read()


def params(name):
    """The kernel's parameter names in the order the PTX takes them."""
    body = PTX[PTX.index(f".entry {name}(") :]
    return re.findall(rf"{name}_param_(\w+)", body[: body.index(")")])


def threads(name):
    body = PTX[PTX.index(f".entry {name}(") :]
    return int(re.search(r"\.maxntid (\d+)", body).group(1))


# f64: error bounded by K * 2^-53 relative to sum |a||b|.
g, c, d = gemm("gemm_f64", "f64", 32, threads("gemm_f64"))
report("gemm_f64 GPU vs f64 reference", g, 64 * 2.0**-53)
report("gemm_f64 CPU vs f64 reference", c, 64 * 2.0**-53)
# ieee f32: K * 2^-24 (K = 300) relative; tf32 keeps 10 mantissa bits: 2 * 2^-11 per product.
g, c, d = gemm("gemm_f32", "f32", 64, threads("gemm_f32"))
report("gemm_f32 (ieee) GPU vs f64 reference", g, 300 * 2.0**-24)
report("gemm_f32 (ieee) CPU vs f64 reference", c, 300 * 2.0**-24)
report("gemm_f32 (ieee) GPU vs CPU", d, 300 * 2.0**-24)
g, c, d = gemm("gemm_tf32", "f32", 64, threads("gemm_tf32"))
report("gemm_tf32 GPU vs f64 reference", g, 2 * 2.0**-10)
report("gemm_tf32 CPU vs f64 reference", c, 2 * 2.0**-10)
# Both round the operands to tf32 the same way; only the order of the sums differs.
report("gemm_tf32 GPU vs CPU", d, 300 * 2.0**-24)
ieee_err = gemm("gemm_f32", "f32", 64, threads("gemm_f32"))[0]
print(f"tf32 error / ieee error on the GPU: {g / ieee_err:.0f}x")
ok &= g > ieee_err

# Casts: the documented rule, the GPU and the CPU executor agree exactly.
x = load("to_ints_x.npy").astype(np.float32)
n = len(x)
outs = {dt: Buf([0] * n, dt) for dt in ("i8", "u8", "i32")}
launch("to_ints", [cdiv(n, 128)], threads("to_ints"), [Buf(x.tolist(), "f32"), outs["i8"], outs["u8"], outs["i32"], n])
for dt, (lo, hi) in {"i8": (-128, 127), "u8": (0, 255), "i32": (-(2**31), 2**31 - 1)}.items():
    rule = [0 if np.isnan(v) else int(min(max(np.trunc(np.float64(v)), lo), hi)) for v in x]
    gpu = outs[dt].get()
    cpu = load(f"to_ints_{dt}.npy").astype(np.int64).tolist()
    bad = [(float(v), r, g_, c_) for v, r, g_, c_ in zip(x, rule, gpu, cpu) if not (r == g_ == c_)]
    ok &= not bad
    print(f"f32 -> {dt} on {n} values (NaN, ±inf, ±1e10, halves, edges): {'ok' if not bad else f'FAIL {len(bad)} e.g. (x, rule, gpu, cpu) {bad[:4]}'}")

print("all semantics checks passed" if ok else "SEMANTICS CHECK FAILED")
sys.exit(0 if ok else 1)
