"""Compares the .npy files two runs of the same tests/gpu program wrote (the GPU's
against the CPU executor's), element by element within a per-dtype tolerance:

    python3 compare_npy.py GOT_DIR REF_DIR      (exit 1 listing the offenders)

It prints one line per file (max abs error, max rel error, and the worst ratio of
error to bound), and fails
when a file is missing on either side, the shapes differ, NaN/inf sit in
different places, or an element is off by more than

    |got - ref| <= rtol * |ref| + atol * max|ref|      (max over the file)

The dtype is taken from the file name's last `_TOKEN` (f16, bf16, f32, f64, f8dot): save_npy
widens bf16 to f32, so the array's own dtype cannot tell. Why these numbers:

* f32 (rtol 1e-4, atol 1e-5): about 800 ulps (eps 1.2e-7). The GPU contracts
  a*b+c into one FMA, uses its own exp/log/rsqrt approximations (a few ulps, more
  for exp of large arguments after range reduction), and sums in a different order
  (tree reductions, tiled dot products) than the CPU. An N-term sum reordered
  differs by about sqrt(N)*eps*sqrt(N)*rms = N*eps*rms: 3000 terms of randn give
  ~4e-4 absolute on sums up to ~150, i.e. ~3e-6 of the array's largest magnitude;
  the atol term scales with max|ref|, which grows with the reduction length, so
  long sums and K=1001 products stay inside it while short ones are held tight.
* f16 (rtol 1e-2, atol 2e-3): rtol is ten ulps (spacing 2^-10). Both devices
  accumulate low-precision reductions and dot products in f32 (docs/language.md),
  so the differences are the final rounding to f16 (one ulp when the f32 values
  sit on either side of a rounding boundary), the f32 differences above, and
  chains of f16 elementwise ops whose intermediates one device rounds and the
  other keeps (a flipped rounding of x - max in a softmax moves exp by up to
  2^-11 * |x - max|, ~0.3% for |x - max| ~ 6). atol is two ulps of the largest
  value: a cancellation (x - mean, a product near 0) loses to the operands' size.
* bf16 (rtol 2e-2, atol 1e-2): under three ulps relative (spacing 2^-7 = 7.8e-3)
  and about one ulp of the largest value; the same reasons with an 8-bit
  significand (a flipped rounding of x - max moves a softmax's exp by ~1.2%).
  Flash attention rounds P to bf16 before the second product, so one flipped
  rounding there moves an output by ~|v| * 2^-8 * p, within atol.
* f8dot (rtol 1e-3, atol 1e-3; f32 values): the f32 results of f8 dots on sm_90a's
  wgmma. Its tensor cores sum 8-bit products at about 14 bits, aligned to the
  largest addend (2^-13 ~ 1.2e-4 of it a step), in groups of at most 128 of K
  that the code adds into the f32 accumulator on the FMA units
  (ir/target/lower/mma/wgmma.rs): the error is a few 1e-4 of the output's scale
  at K = 512 (measured 3.3e-4), where the f32 tolerance allows 1e-5.
* f64 (rtol 1e-9, atol 1e-12): FMA contraction and approximations only. Except
  the outputs of the generated row kernels (softmax, layer_norm, rms_norm: file
  names in F32_MATH), whose arithmetic is f32 for every dtype on both devices
  (ir/schedule/generate): they get f32's tolerance, and the report says so.
"""
import os
import sys

import numpy as np

TOL = {"f16": (1e-2, 2e-3), "bf16": (2e-2, 1e-2), "f32": (1e-4, 1e-5), "f64": (1e-9, 1e-12),
       "f8dot": (1e-3, 1e-3)}
# f64 outputs computed in f32 arithmetic on both devices (see the docstring).
F32_MATH = ("softmax_", "layer_norm_", "rms_norm_")


def dtype_of(name, array):
    token = name[: -len(".npy")].rsplit("_", 1)[-1]
    if token in TOL:
        return token
    return {np.float16: "f16", np.float32: "f32", np.float64: "f64"}.get(array.dtype.type)


def compare(got, ref, dt):
    """None when `got` agrees with `ref`, else why not; and (max abs, max rel, bound)."""
    if got.shape != ref.shape:
        return f"shape {got.shape} vs {ref.shape}", None
    if dt is None:  # integers and bools: exact
        bad = int(np.count_nonzero(got != ref))
        return (f"{bad} elements differ" if bad else None), (0.0, 0.0, 0.0)
    g, r = got.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(r)
    inf = np.isinf(r)
    if (not np.array_equal(np.isfinite(g), finite) or not np.array_equal(np.isnan(g), np.isnan(r))
            or not np.array_equal(g[inf], r[inf])):
        return "NaN or inf in different places", None
    rtol, atol = TOL[dt]
    g, r = g[finite], r[finite]
    if r.size == 0:
        return None, (0.0, 0.0, 0.0)
    scale = float(np.abs(r).max()) or 1.0
    err = np.abs(g - r)
    bound = rtol * np.abs(r) + atol * scale
    rel = err / np.maximum(np.abs(r), atol * scale)
    stats = (float(err.max()), float(rel.max()), float((err / bound).max()))
    over = int(np.count_nonzero(err > bound))
    if over:
        i = int(np.argmax(err - bound))
        return f"{over} of {r.size} elements out of tolerance (worst: got {float(g[i])!r}, expected {float(r[i])!r})", stats
    return None, stats


def main(got_dir, ref_dir):
    got_files = {f for f in os.listdir(got_dir) if f.endswith(".npy")}
    ref_files = {f for f in os.listdir(ref_dir) if f.endswith(".npy")}
    offenders = [f"{f}: missing on the reference side" for f in sorted(got_files - ref_files)]
    offenders += [f"{f}: not written" for f in sorted(ref_files - got_files)]
    for name in sorted(got_files & ref_files):
        got, ref = np.load(os.path.join(got_dir, name)), np.load(os.path.join(ref_dir, name))
        dt = dtype_of(name, ref)
        note = ""
        if dt == "f64" and name.startswith(F32_MATH):
            dt, note = "f32", "  (f64 in f32 arithmetic on both devices)"
        why, stats = compare(got, ref, dt)
        if stats:
            print(f"  {name:48} {dt or 'exact':5} max abs {stats[0]:.3g}  max rel {stats[1]:.3g}  err/bound {stats[2]:.3g}{note}")
        if why:
            offenders.append(f"{name}: {why}")
    for line in offenders:
        print(f"  OFFENDER {line}")
    print(f"{len(got_files & ref_files)} files compared, {len(offenders)} offenders")
    return 1 if offenders or not ref_files else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
