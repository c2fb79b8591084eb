#!/usr/bin/env bash
# CPU executor throughput against numpy on this machine, in one run:
# gemm f32 1024^3 (GFLOP/s) and row softmax f32 4096x4096 (GB/s: one read and
# one write of the matrix). numpy comes from PyPI into .cache/bench-venv.
# Usage: bench/cpu.sh [GEMM_N] [SOFTMAX_N]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1024}
S=${2:-4096}
VENV=.cache/bench-venv
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet numpy
fi
cargo build --quiet --release -p tessera-compiler --bench exec
BIN=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/exec-* | grep -v '\.d$' | head -1)
TSR=$("$BIN" "$N" "$S")
NPY=$("$VENV/bin/python" - "$N" "$S" <<'PY'
import sys, time
import numpy as np
n, s = int(sys.argv[1]), int(sys.argv[2])
def bench(f, runs=5):
    f()
    ts = []
    for _ in range(runs):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2]
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
t = bench(lambda: a @ b)
print(f"numpy matmul f32 {n}x{n}x{n}: {t*1e3:.2f} ms, {2*n**3/t/1e9:.1f} GFLOP/s")
x = rng.standard_normal((s, s), dtype=np.float32)
def softmax():
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
t = bench(softmax)
print(f"numpy softmax f32 {s}x{s}: {t*1e3:.2f} ms, {2*4*s*s/t/1e9:.2f} GB/s")
PY
)
echo "$TSR"
echo "$NPY"
python3 - "$TSR" "$NPY" <<'PY'
import re, sys
t, n = sys.argv[1].splitlines(), sys.argv[2].splitlines()
num = lambda line: float(re.findall(r"([\d.]+) (?:GFLOP|GB)/s", line)[0])
print(f"gemm:    tessera/numpy = {num(t[0]) / num(n[0]):.2f}")
print(f"softmax: tessera/numpy = {num(t[1]) / num(n[1]):.2f}")
PY
