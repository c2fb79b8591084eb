#!/usr/bin/env python3
"""GPU check of the compiled-kernel cache (needs an NVIDIA driver and GPU).

Runs the same program in separate `tessera run --device cuda` processes that
share a fresh TESSERA_CACHE_DIR, and times, by the processes' wall times:

  base  the program's definitions and tensors, without its kernel launches
  cold  the whole program with an empty cache (the driver's JIT compiles)
  warm  the whole program again, in a new process (cubins from the disk cache)

`warm - base` is what the launches cost a new process with the cache filled:
loading the cubins from disk, the launches and their (small) copies. The
issue's goal is <= 50 ms per kernel. Each time is the median of RUNS runs
(cold runs get a fresh cache folder each). Then a REPL session (`:load` and
`:device`) in one more process shows the cache's counters: every kernel from
disk, none compiled.

  scripts/gpu/cache_check.py [TESSERA]     (default target/release/tessera)
  DEVICE=cpu scripts/gpu/cache_check.py    checks the script itself on the CPU
"""

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESSERA = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                          os.path.join(ROOT, "target/release/tessera"))
DEVICE = os.environ.get("DEVICE", "cuda")
RUNS = int(os.environ.get("RUNS", "3"))
GOAL_MS = 50.0

DEFS = "".join(open(os.path.join(ROOT, "examples", f)).read() + "\n"
               for f in ("flash_attn.tsr", "gemm.tsr", "vadd.tsr"))
TENSORS = """
q = zeros([1, 2, 256, 128], bf16)
o = zeros([1, 2, 256, 128], bf16)
a = zeros([256, 256], f16)
c = zeros([256, 256], f32)
x = zeros([4096], f32)
y = zeros([4096], f32)
"""
LAUNCHES = [
    "flash_attn(q, q, q, o, 0.125, causal=True)",
    "gemm(a, a, c)",
    "vadd(x, x, y)",
]


def run(program, cache):
    """Wall seconds of one `tessera run` of `program` with cache folder `cache`."""
    with tempfile.NamedTemporaryFile("w", suffix=".tsr", delete=False) as f:
        f.write(program)
    env = dict(os.environ, TESSERA_CACHE_DIR=cache, NO_COLOR="1")
    start = time.perf_counter()
    p = subprocess.run([TESSERA, "run", f.name, "--device", DEVICE], env=env,
                       capture_output=True, text=True)
    took = time.perf_counter() - start
    os.unlink(f.name)
    if p.returncode != 0:
        sys.exit(f"tessera run failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return took


def main():
    base_program = DEFS + TENSORS
    program = base_program + "\n".join(LAUNCHES) + "\n"
    work = tempfile.mkdtemp(prefix="tessera-cache-check-")
    base = statistics.median(run(base_program, os.path.join(work, "base"))
                             for _ in range(RUNS))
    colds = []
    for i in range(RUNS):
        colds.append(run(program, os.path.join(work, f"cold{i}")))
    cache = os.path.join(work, f"cold{RUNS - 1}")
    warm = statistics.median(run(program, cache) for _ in range(RUNS))
    cold = statistics.median(colds)
    n = len(LAUNCHES)
    print(f"{n} kernels, median of {RUNS} processes each, device {DEVICE}")
    print(f"base (no launches)       {base * 1e3:9.1f} ms")
    print(f"cold (empty cache)       {cold * 1e3:9.1f} ms   launches +{(cold - base) * 1e3:.1f} ms")
    per_kernel = (warm - base) * 1e3 / n
    print(f"warm (cache from disk)   {warm * 1e3:9.1f} ms   launches +{(warm - base) * 1e3:.1f} ms"
          f" = {per_kernel:.1f} ms a kernel (goal <= {GOAL_MS:.0f})")
    status = 0
    if DEVICE == "cuda":
        entries = [e for e in os.listdir(os.path.join(cache, "kernels")) if e.endswith(".cubin")]
        print(f"cache folder: {len(entries)} cubins")
        if len(entries) != n:
            print(f"FAIL: expected {n} cubins")
            status = 1
        if per_kernel > GOAL_MS:
            print("FAIL: over the goal")
            status = 1
    # A REPL in one more process: its counters say where the kernels came from.
    defs = os.path.join(work, "defs.tsr")
    with open(defs, "w") as f:
        f.write(DEFS)
    session = f":load {defs}\n" + TENSORS.strip() + "\n" + "\n".join(LAUNCHES) + "\n:device\n"
    env = dict(os.environ, TESSERA_CACHE_DIR=cache, NO_COLOR="1")
    p = subprocess.run([TESSERA, "repl", "--device", DEVICE], input=session, env=env,
                       capture_output=True, text=True)
    print(p.stdout.strip())
    if p.returncode != 0 or p.stderr.strip():
        print(f"FAIL: the REPL session: exit {p.returncode}\n{p.stderr}")
        status = 1
    if DEVICE == "cuda":
        m = re.search(r"kernel cache: .*: (\d+) compiled, (\d+) from disk", p.stdout)
        if not m or (int(m.group(1)), int(m.group(2))) != (0, n):
            print(f"FAIL: expected 0 compiled, {n} from disk")
            status = 1
    print("cache check:", "FAIL" if status else "ok")
    shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
