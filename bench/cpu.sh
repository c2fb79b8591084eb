#!/usr/bin/env bash
# CPU executor throughput against numpy on this machine, in one run:
# gemm f32 1024^3 (GFLOP/s) and row softmax f32 4096x4096 (GB/s: one read and
# one write of the matrix). numpy comes from PyPI into .cache/bench-venv.
#
# The two run in alternation, ROUNDS times (default 3), each round timing 5
# runs after a warm-up, so that both see the same phases of a shared machine.
# The summary compares the best runs (the speed each reaches when the machine
# lets it) and the medians.
# Usage: bench/cpu.sh [GEMM_N] [SOFTMAX_N]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1024}
S=${2:-4096}
ROUNDS=${ROUNDS:-3}
VENV=.cache/bench-venv
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet numpy
fi
cargo build --quiet --release -p tessera-compiler --bench exec
BIN=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/exec-* | grep -v '\.d$' | head -1)
NUMPY=$(cat <<'PY'
import sys, time
import numpy as np
n, s = int(sys.argv[1]), int(sys.argv[2])
def bench(f, runs=5):
    f()
    ts = []
    for _ in range(runs):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2], ts[0]
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
med, best = bench(lambda: a @ b)
g = lambda t: 2 * n**3 / t / 1e9
print(f"numpy matmul f32 {n}x{n}x{n}: median {med*1e3:.2f} ms {g(med):.1f} GFLOP/s, best {best*1e3:.2f} ms {g(best):.1f} GFLOP/s")
x = rng.standard_normal((s, s), dtype=np.float32)
def softmax():
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
med, best = bench(softmax)
gb = lambda t: 2 * 4 * s * s / t / 1e9
print(f"numpy softmax f32 {s}x{s}: median {med*1e3:.2f} ms {gb(med):.2f} GB/s, best {best*1e3:.2f} ms {gb(best):.2f} GB/s")
PY
)
LOG=$(mktemp)
for round in $(seq "$ROUNDS"); do
    "$BIN" "$N" "$S" | tee -a "$LOG"
    "$VENV/bin/python" -c "$NUMPY" "$N" "$S" | tee -a "$LOG"
done
python3 - "$LOG" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) (\w+) .*: median [\d.]+ ms ([\d.]+) \S+, best [\d.]+ ms ([\d.]+) (\S+)", line)
    if m:
        who, op = m.group(1), "gemm" if "mat" in m.group(2) or "gemm" in m.group(2) else "softmax"
        rows.setdefault((who, op), []).append((float(m.group(3)), float(m.group(4)), m.group(5)))
for op in ["gemm", "softmax"]:
    t, n = rows[("tessera", op)], rows[("numpy", op)]
    unit = t[0][2]
    tb, nb = max(r[1] for r in t), max(r[1] for r in n)
    tm, nm = statistics.median(r[0] for r in t), statistics.median(r[0] for r in n)
    print(f"{op:8} best: tessera {tb:.1f} / numpy {nb:.1f} {unit} = {tb / nb:.2f}   "
          f"median: tessera {tm:.1f} / numpy {nm:.1f} {unit} = {tm / nm:.2f}")
PY
rm -f "$LOG"
