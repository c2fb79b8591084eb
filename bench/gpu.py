#!/usr/bin/env python3
"""Tessera on an NVIDIA GPU against its peers, in one run on one GPU.

Run from the repository root on a GPU machine (see bench/README.md):

    python3 bench/gpu.py --tessera target/release/tessera [--quick] [--only gemm,attn]

It builds nothing: Tessera runs as the `tessera` binary given by `--tessera`.

The workloads (gemm, attn, copy, softmax, norm, compile, launch; `--only` picks some,
`--quick` keeps one size of each) and their peers are listed in bench/README.md.

How Tessera is timed. Each throughput workload is one `tessera repl --device cuda`
session fed on stdin: it loads the inputs (written by this script as f32 .npy files
whose values are bf16 numbers, so both sides get the same bf16 inputs), runs the
statement once (compile and warm-up), then `:time STMT`, which prints the wall median
per run and the median of the run's summed kernel time measured with CUDA events
("median 1.234 ms over 50 runs; on the GPU: median 0.456 ms in 1 launch"). The GPU
median gives the throughput; wall - GPU is the host overhead per run. The result is
saved with `save_npy` for the error column. Peers are timed with CUDA events around
each run, all runs queued back to back after a warm-up (so the host's launch latency
is hidden, as it is for a kernel that follows another), median of `--runs` (>= 20).
Neither side flushes the L2 cache between runs. The two sides take turns: the session
stays open and runs `:time STMT` `--rounds` times (default 5), each followed by a
round of every peer's runs (`--runs` split over the rounds), and each side's number
is the median over its rounds. A GPU's clocks drift by up to 10-15% over a minute
(one kernel timed twice a minute apart in one run); timed in turns, both sides see
the same drift, so the ratio does not carry it.

The gemm table has one more row: the same `gemm_bf16` emitted with hints (`tessera
emit --emit ptx --kernel gemm_bf16 -D K%8 -D N%8 stdlib/std/linalg.tsr`, for the arch
the executor picks), compiled by the ptxas the executor uses with its options,
loaded with the driver API (ctypes) into torch's context and timed like a peer; its
note gives REPL GPU median / hinted (the issue asks for run-time specialisation to
come within 5% of the hinted variant). Two more rows: the variant of the launch's
facts compiled the same way, and the hinted PTX compiled by the driver's JIT.

`--cuda-arch sm_90` runs every Tessera kernel compiled for that arch (the executor's
TESSERA_CUDA_ARCH): on an H100, the `mma.sync`/`cp.async` path of pre-Hopper targets,
timed against the same peers in the same run.

How compile-to-launch is timed. `:time` cannot time one run, so the script drives a
live session statement by statement: it sends the setup (inputs moved to the GPU with
`.to("cuda")` so that no copy is counted), then the launch followed by
`print("<marker>")`, and wall-clocks until the marker comes back on stdout, less the
round trip of a marker alone (measured in the same session): Tessera text -> checked,
lowered, PTX, SASS, loaded, launched and finished (a launch waits for its kernel).
"cold" is the first launch in a process with a fresh TESSERA_CACHE_DIR, "cached" the
first launch in a second process with the same directory, "warm" a second launch in
the first process; the driver's own JIT cache is off (CUDA_CACHE_DISABLE=1), and the
note gives the counters of Tessera's kernel cache (`:device`) of both processes.
Triton's matmul with one fixed config (BM=BN=128, BK=32, 8 warps, 3 stages: the tile
of `gemm_bf16`) is timed in child processes of this script with a fresh, then reused
TRITON_CACHE_DIR: first call + synchronize, after its inputs and Triton's driver
helpers (built once per cache folder, not per kernel) exist. Each number is
the median of `--reps` processes.

The launch overhead is `:time vadd(x, y, out)` on 16 elements: wall median minus GPU
median. Tessera's events bracket the kernel alone (the stream waits at a gate until
the launch is queued: docs/gpu.md, "What `:time` measures"), so the overhead is
the host's whole share of a launch. The peers' wall
time is one call + synchronize from Python.

A workload that fails (a Tessera error, a missing peer such as no cuDNN backend)
gives a row with the reason; the table is always written (`--out`).

`--device cpu --tiny` checks the script itself on a machine without a GPU (tiny
sizes, Tessera's CPU executor, peers reported missing without torch).
"""

import argparse
import ast
import itertools
import json
import math
import os
import platform
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


class Failed(Exception):
    """A workload or one implementation of it could not run; the message is the reason."""


# ---------------------------------------------------------------------------
# Tessera sessions

TIME_RE = re.compile(
    r"median ([\d.]+) (s|ms|µs|ns) over (\d+) runs"
    r"(?:; on the GPU: median ([\d.]+) (s|ms|µs|ns) in (\d+) launch(?:es)?)?"
)
UNITS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}


def parse_time(text):
    """The first `:time` line in `text` as {wall, gpu, runs, launches} (seconds per
    run; gpu None where the line has no GPU part), or None where there is none."""
    m = TIME_RE.search(text)
    if not m:
        return None
    gpu = float(m.group(4)) * UNITS[m.group(5)] if m.group(4) else None
    return {"wall": float(m.group(1)) * UNITS[m.group(2)], "gpu": gpu,
            "runs": int(m.group(3)), "launches": int(m.group(6) or 0)}


def repl_command(args):
    """`tessera repl` on `args.device`; with `args.devices` set (bench/multi_gpu.py),
    on that many devices."""
    cmd = [args.tessera, "repl", "--device", args.device]
    devices = getattr(args, "devices", None)
    return cmd + ["--devices", str(devices)] if devices else cmd


def first_error(stderr, strict=False):
    """The first diagnostic's headline and help line; else, unless `strict`, the
    last line of stderr (notes and warnings are not errors)."""
    lines = [l.strip(" │─╭╰╯") for l in stderr.splitlines()]
    lines = [l.strip() for l in lines if l.strip()]
    for i, line in enumerate(lines):
        if line.startswith("error"):
            helps = [l for l in lines[i + 1:] if l.lower().startswith("help")]
            return line + (" — " + helps[0] if helps else "")
    return lines[-1] if lines and not strict else ""


def tessera_env(cache_dir, **extra):
    env = dict(os.environ, TESSERA_CACHE_DIR=cache_dir, **extra)
    env.pop("TESSERA_HISTORY", None)
    return env


def tessera_time(args, setup, stmt, after=()):
    """Runs setup, STMT once, `:time STMT`, then `after` in one piped session.

    Returns {wall, gpu, runs, launches, after, measured}: seconds per run (gpu None
    where `:time` shows no GPU part, e.g. on the CPU executor), the first error of
    `after`, and what a `:resources` in `after` measured on the GPU (or None)."""
    script = "\n".join(list(setup) + [stmt, ":time " + stmt] + list(after)) + "\n"
    try:
        p = subprocess.run(
            repl_command(args), input=script, encoding="utf-8",
            capture_output=True, timeout=args.timeout, env=tessera_env(args.cache))
    except FileNotFoundError:
        raise Failed(f"no tessera binary at {args.tessera}")
    except subprocess.TimeoutExpired:
        raise Failed(f"tessera session timed out after {args.timeout} s")
    timing = parse_time(p.stdout)
    if not timing:
        raise Failed(first_error(p.stderr) or f"no `:time` line (exit status {p.returncode})")
    # With a `:time` line, only a statement of `after` can have failed.
    after_err = (first_error(p.stderr) or "failed") if p.returncode != 0 else None
    return dict(timing, after=after_err, measured=measured_of(p.stdout))


def measured_of(text):
    """What a `:resources` line of `text` says the driver measured, or None."""
    m = re.search(r"^measured on .*?\): (.*)$", text, re.M)
    return m.group(1) if m else None


class Repl:
    """A live `tessera repl`, fed statements one step at a time for wall-clock timing."""

    def __init__(self, args, cache_dir):
        self.timeout = args.timeout
        self.err = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
        try:
            self.p = subprocess.Popen(
                repl_command(args), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=self.err, encoding="utf-8", bufsize=1,
                # The driver's own JIT cache would make a "cold" compile warm.
                env=tessera_env(cache_dir, CUDA_CACHE_DISABLE="1"))
        except FileNotFoundError:
            raise Failed(f"no tessera binary at {args.tessera}")
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.steps = 0
        self.err_seen = 0

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def step(self, *stmts):
        """Sends the statements and a marker print; returns (seconds until the
        marker came back, the lines printed before it). A new error fails."""
        self.steps += 1
        mark = f"@@bench-{self.steps}"
        text = "".join(s + "\n" for s in stmts) + f'print("{mark}")\n'
        t0 = time.perf_counter()
        try:
            self.p.stdin.write(text)
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            raise Failed(self._error() or "tessera exited")
        out = []
        while True:
            try:
                line = self.lines.get(timeout=max(1e-3, t0 + self.timeout - time.perf_counter()))
            except queue.Empty:
                raise Failed(f"no answer from tessera within {self.timeout} s")
            if line is None:
                self.lines.put(None)  # later steps see the end too
                raise Failed(self._error() or "tessera exited")
            if line == mark:
                break
            out.append(line)
        seconds = time.perf_counter() - t0
        err = self._error(strict=True)
        if err:
            raise Failed(err)
        return seconds, out

    def _error(self, strict=False):
        self.err.seek(self.err_seen)
        text = self.err.read()
        self.err_seen = self.err.tell()
        return first_error(text, strict)

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()
        self.err.close()


# ---------------------------------------------------------------------------
# Inputs, peers and measurements on this side


def bf16_values(shape, seed):
    """Standard normal f32 numbers rounded (to nearest even) to bf16 values."""
    x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    u = x.view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    u &= np.uint32(0xFFFF0000)
    return x


def save_input(args, name, shape, seed):
    path = os.path.join(args.work, name + ".npy")
    np.save(path, bf16_values(shape, seed))
    return path


def save_f8_input(args, name, shape, seed):
    """Standard normal numbers rounded to f8e4m3 values (by torch, as torch._scaled_mm's
    inputs are), saved as f32: both sides convert them to f8e4m3 exactly."""
    need_torch()
    path = os.path.join(args.work, name + ".npy")
    x = torch.from_numpy(bf16_values(shape, seed)).to(torch.float8_e4m3fn).float()
    np.save(path, x.numpy())
    return path


def need_torch():
    if torch is None:
        raise Failed("torch is not installed")
    if not torch.cuda.is_available():
        raise Failed("torch sees no CUDA GPU")


def gpu_tensor(path):
    """A bf16 tensor on the GPU from one of the f32 .npy inputs."""
    need_torch()
    return torch.from_numpy(np.load(path)).cuda().to(torch.bfloat16)


def time_peer(fn, runs):
    """Median seconds of fn() by CUDA events, after warm-up, runs queued back to back."""
    need_torch()
    fn()
    torch.cuda.synchronize()
    # Warm up for about 50 ms (at least 3 runs) so clocks and caches settle.
    t0 = time.perf_counter()
    n = 0
    while n < 3 or time.perf_counter() - t0 < 0.05:
        fn()
        torch.cuda.synchronize()
        n += 1
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(runs)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) * 1e-3


def max_error(tessera_out, peer_out):
    """Max |Tessera - peer| over all elements (nan if either has a nan)."""
    t = torch.from_numpy(np.load(tessera_out)).cuda()
    return (t - peer_out.float()).abs().max().item()


def free_gpu():
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def gpu_arch():
    """The arch Tessera's executor compiles for on this GPU (Arch::for_compute_capability),
    or the one `--cuda-arch` asks for (TESSERA_CUDA_ARCH)."""
    if os.environ.get("TESSERA_CUDA_ARCH", "").strip():
        return os.environ["TESSERA_CUDA_ARCH"].strip()
    need_torch()
    cc = torch.cuda.get_device_capability()
    if cc == (9, 0):
        return "sm_90a"
    for arch in ((9, 0), (8, 9), (8, 6), (8, 0), (7, 5), (7, 0)):
        if cc >= arch:
            return "sm_%d%d" % arch
    raise Failed(f"compute capability {cc} is older than sm_70")


class PtxKernel:
    """One kernel of a PTX text, loaded through the driver API (ctypes) into the
    context torch made current, and launched on torch's current stream, so that
    torch's tensors are its arguments and torch's events time it."""

    def __init__(self, ptx, name, ptxas=False):
        """`ptxas`: compile with the ptxas the executor finds (TESSERA_PTXAS, PATH,
        /usr/local/cuda/bin) and its options, then load the cubin, as the executor
        does; otherwise the driver compiles the PTX (cuModuleLoadDataEx)."""
        import ctypes as ct
        need_torch()
        self.ct, self.cu, self.name = ct, ct.CDLL("libcuda.so.1"), name
        torch.empty(1, device="cuda")  # torch's primary context is current from here
        ctx = ct.c_void_p()
        self.check(self.cu.cuCtxGetCurrent(ct.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            raise Failed("no current CUDA context to load the PTX into")
        module, log = ct.c_void_p(), ct.create_string_buffer(1 << 14)
        opts = (ct.c_int * 2)(5, 6)  # CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
        vals = (ct.c_void_p * 2)(ct.cast(log, ct.c_void_p), ct.c_void_p(1 << 14))
        if ptxas:
            tool = (os.environ.get("TESSERA_PTXAS") or shutil.which("ptxas")
                    or "/usr/local/cuda/bin/ptxas")
            with tempfile.TemporaryDirectory() as d:
                src, out = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
                with open(src, "w") as f:
                    f.write(ptx)
                arch = re.search(r"^\.target (\w+)", ptx, re.M).group(1)
                p = subprocess.run([tool, "-v", "-arch", arch, "-O3", "-o", out, src],
                                   capture_output=True, encoding="utf-8")
                if p.returncode != 0:
                    raise Failed(f"ptxas: {first_error(p.stderr)}")
                with open(out, "rb") as f:
                    cubin = f.read()
            r = self.cu.cuModuleLoadData(ct.byref(module), cubin)
        else:
            r = self.cu.cuModuleLoadDataEx(ct.byref(module), ptx.encode() + b"\0", 2, opts, vals)
        self.check(r, "cuModuleLoadDataEx: " + log.value.decode(errors="replace").strip())
        self.f = ct.c_void_p()
        self.check(self.cu.cuModuleGetFunction(ct.byref(self.f), module, name.encode()), name)
        # The launch ABI from the PTX: parameters in order, block size, dynamic smem.
        self.params = re.findall(rf"\.param \.(\w+) {name}_param_(\w+)", ptx)
        # TMA tensor maps (wgmma loops on sm_90a), by value after the other parameters;
        # the printer's comment names the tensor, the box and the swizzle.
        self.tmaps = [(n, [int(x) for x in box.split(", ")], int(sw)) for n, box, sw in re.findall(
            rf"// {name}_param_tmap\d+: tensor map of (\w+) \(param \d+\), box \[([\d, ]+)\] "
            r"innermost first, swizzle (\d+)B", ptx)]
        self.threads = int(re.search(r"\.maxntid (\d+)", ptx).group(1))
        dyn = re.search(rf"// {name}: (\d+) bytes of dynamic shared memory", ptx)
        self.smem = int(dyn.group(1)) if dyn else 0
        if self.smem:  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self.check(self.cu.cuFuncSetAttribute(self.f, 8, self.smem), "cuFuncSetAttribute")

    def check(self, r, what):
        if r != 0:
            raise Failed(f"{what}: CUDA error {r}")

    def __call__(self, grid, **values):
        """Launches with tensors (u64 parameters) and numbers by parameter name."""
        ct = self.ct
        held = [ct.c_uint64(values[n].data_ptr()) if t == "u64" else
                ct.c_float(values[n]) if t == "f32" else ct.c_int32(values[n])
                for t, n in self.params]
        addrs = [ct.addressof(h) for h in held]
        for n, box, sw in self.tmaps:
            buf, addr = self.tensor_map(values[n], box, sw)
            held.append(buf)
            addrs.append(addr)
        ptrs = (ct.c_void_p * len(addrs))(*addrs)
        stream = ct.c_void_p(torch.cuda.current_stream().cuda_stream)
        g = list(grid) + [1] * (3 - len(grid))
        self.check(self.cu.cuLaunchKernel(self.f, g[0], g[1], g[2], self.threads, 1, 1,
                                          self.smem, stream, ptrs, None), "launch " + self.name)

    def tensor_map(self, t, box, swizzle):
        """A tensor map of torch tensor `t` (row-major) as the executor encodes it: dims
        and byte strides innermost first, zeros out of bounds; (its buffer, 64-byte
        aligned address)."""
        ct, rank = self.ct, t.dim()
        # CU_TENSOR_MAP_DATA_TYPE_*: f8 tensors are bytes to TMA.
        dtype = {torch.bfloat16: 9, torch.float16: 6, torch.float32: 7,
                 torch.float8_e4m3fn: 0, torch.float8_e5m2: 0}[t.dtype]
        dims = (ct.c_uint64 * rank)(*reversed(t.shape))
        strides = (ct.c_uint64 * rank)(*[t.stride(rank - 2 - i) * t.element_size()
                                         for i in range(rank - 1)])
        boxes = (ct.c_uint32 * rank)(*box)
        ones = (ct.c_uint32 * rank)(*([1] * rank))
        buf = ct.create_string_buffer(128 + 64)
        addr = (ct.addressof(buf) + 63) // 64 * 64
        sw = {0: 0, 32: 1, 64: 2, 128: 3}[swizzle]
        # interleave none, L2 promotion 256 B, out-of-bounds fill none (zeros)
        self.check(self.cu.cuTensorMapEncodeTiled(
            ct.c_void_p(addr), dtype, rank, ct.c_void_p(t.data_ptr()), dims, strides, boxes,
            ones, 0, sw, 3, 0), "cuTensorMapEncodeTiled")
        return buf, addr


HINTS = ["K%8", "N%8"]
# The standard library's linalg module of the checkout this script is in.
LINALG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "stdlib", "std",
                      "linalg.tsr")


# The user-written GEMMs whose B is given as [N, K] (bf16 and f8e4m3).
GEMM_NT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemm_nt.tsr")


# The facts a launch at 4096³ or 8192³ derives (run-time specialisation): the same
# kernel through the driver API, to tell the REPL's launch path from code generation.
FACTS = ["M%16", "N%16", "K%16"]


def hinted_gemm(args, hints=HINTS, ptxas=True):
    """std.linalg's gemm_bf16 emitted with `-D K%8 -D N%8` (the variant the issue measured
    before run-time specialisation), or with other `hints`, loaded once per run."""
    key = "hinted_" + "_".join(hints) + ("_ptxas" if ptxas else "_jit")
    if key not in vars(args):
        try:
            src = LINALG
            cmd = [args.tsrc or args.tessera, "emit", "--emit", "ptx", "--arch", gpu_arch(),
                   "--kernel", "gemm_bf16", *(a for h in hints for a in ("-D", h)), src]
            p = subprocess.run(cmd, capture_output=True, encoding="utf-8")
            if p.returncode != 0:
                raise Failed(f"`{' '.join(cmd[1:])}`: {first_error(p.stderr)}")
            setattr(args, key, PtxKernel(p.stdout, "gemm_bf16", ptxas))
        except (Failed, OSError) as e:
            setattr(args, key, Failed(reason(e)))
    if isinstance(getattr(args, key), Failed):
        raise getattr(args, key)
    return getattr(args, key)


# ---------------------------------------------------------------------------
# Triton matmul (the usual tiled pattern with grouped tile order)

if triton is not None:
    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      GROUP_M: tl.constexpr):
        # Programs walk the C tiles in groups of GROUP_M tile rows, so that the
        # programs running together share columns of B in L2.
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BM)
        tiles_n = tl.cdiv(N, BN)
        per_group = GROUP_M * tiles_n
        first_m = (pid // per_group) * GROUP_M
        rows = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % rows
        pid_n = (pid % per_group) // rows
        # Rows and columns past the edge wrap around (their results are not
        # stored), so only K needs masks.
        rm = (pid_m * BM + tl.arange(0, BM)) % M
        rn = (pid_n * BN + tl.arange(0, BN)) % N
        rk = tl.arange(0, BK)
        a = a_ptr + rm[:, None] * s_am + rk[None, :] * s_ak
        b = b_ptr + rk[:, None] * s_bk + rn[None, :] * s_bn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            a_t = tl.load(a, mask=rk[None, :] < K - k0, other=0.0)
            b_t = tl.load(b, mask=rk[:, None] < K - k0, other=0.0)
            acc += tl.dot(a_t, b_t)
            a += BK * s_ak
            b += BK * s_bk
        cm = pid_m * BM + tl.arange(0, BM)
        cn = pid_n * BN + tl.arange(0, BN)
        c = c_ptr + cm[:, None] * s_cm + cn[None, :] * s_cn
        tl.store(c, acc, mask=(cm[:, None] < M) & (cn[None, :] < N))

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=i < n) + tl.load(y_ptr + i, mask=i < n),
                 mask=i < n)

    def _config(bm, bn, bk, warps, stages):
        return triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8},
                             num_warps=warps, num_stages=stages)

    matmul_tuned = triton.autotune(
        configs=[_config(128, 256, 64, 8, 3), _config(256, 128, 64, 8, 3),
                 _config(128, 128, 64, 8, 4), _config(128, 128, 32, 8, 3),
                 _config(64, 256, 32, 4, 4), _config(128, 64, 64, 4, 4)],
        key=["M", "N", "K"])(matmul_kernel)


def triton_matmul(a, b, c, fixed=False):
    """c = a @ b (f32 c); `fixed` launches the one config that compile timing uses."""
    M, K = a.shape
    N = b.shape[1]
    strides = (*a.stride(), *b.stride(), *c.stride())
    if fixed:
        grid = (triton.cdiv(M, 128) * triton.cdiv(N, 128),)
        matmul_kernel[grid](a, b, c, M, N, K, *strides, BM=128, BN=128, BK=32, GROUP_M=8,
                            num_warps=8, num_stages=3)
    else:
        grid = lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)
        matmul_tuned[grid](a, b, c, M, N, K, *strides)


def triton_compile_probe(n):
    """Child process: seconds of the fixed-config matmul's first and second call."""
    need_torch()
    if triton is None:
        raise Failed("triton is not installed")
    a = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.float32)
    # Triton builds its driver helpers once per cache folder, not per kernel: not timed.
    try:
        triton.runtime.driver.active.get_current_device()
    except Exception:
        pass
    torch.cuda.synchronize()
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        triton_matmul(a, b, c, fixed=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"first": times[0], "second": times[1]}))


# ---------------------------------------------------------------------------
# Throughput workloads

def row(section, workload, impl, *, seconds=None, rate=None, unit="", ratio=None,
        err=None, note=""):
    return {"section": section, "workload": workload, "impl": impl, "seconds": seconds,
            "rate": rate, "unit": unit, "ratio": ratio, "err": err, "note": note}


def reason(e):
    if isinstance(e, Failed):
        return str(e)
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def tessera_rounds(args, setup, stmt, after, between):
    """Like `tessera_time`, in a live session and `args.rounds` times: each round
    runs `:time STMT`, then `between()` (the peers' rounds), so that both sides are
    timed under the same clocks and temperature; the GPU's drift over a workload
    (up to 10-15% between two timings of one kernel a minute apart) then moves
    both alike. Returns the median over the rounds of each `:time` median."""
    repl = Repl(args, args.cache)
    try:
        repl.step(*setup, stmt)  # compile and warm up
        rounds = []
        for _ in range(max(1, args.rounds)):
            _, lines = repl.step(":time " + stmt)
            timing = parse_time("\n".join(lines))
            if not timing:
                raise Failed("no `:time` line")
            rounds.append(timing)
            between()
        try:
            _, lines = repl.step(*after)
            after_err = None
        except Failed as e:
            lines, after_err = [], str(e)
    finally:
        repl.close()
    gpus = [r["gpu"] for r in rounds if r["gpu"] is not None]
    return {"wall": statistics.median(r["wall"] for r in rounds),
            "gpu": statistics.median(gpus) if len(gpus) == len(rounds) else None,
            "runs": sum(r["runs"] for r in rounds), "launches": rounds[0]["launches"],
            "after": after_err, "measured": measured_of("\n".join(lines)),
            "rounds": len(rounds)}


def tessera_row(args, section, workload, amount, unit, session, between=None):
    """Tessera's row, and the path of its saved result (None where there is none).

    `session` is (setup statements, timed statement, statement saving the result to
    the path `out`, the kernel to ask `:resources` about, or None). With `between`,
    timed in rounds interleaved with it (`tessera_rounds`)."""
    setup, stmt, save, out, kernel = session
    try:
        # The driver's registers and occupancy of the variant that ran, where shown.
        resources = [f":resources {kernel}"] if kernel else []
        if between is None:
            timing = tessera_time(args, setup, stmt, [save] + resources)
        else:
            timing = tessera_rounds(args, setup, stmt, [save] + resources, between)
    except Failed as e:
        return row(section, workload, "Tessera", note=f"failed: {e}"), None
    t = timing["gpu"] if timing["gpu"] is not None else timing["wall"]
    note = f"wall {fmt_time(timing['wall'])} per run over {timing['runs']} runs"
    if timing.get("rounds", 1) > 1:
        note += f" in {timing['rounds']} rounds between the peers'"
    if timing["gpu"] is None:
        note += "; no GPU time in `:time`, throughput from the wall time"
    else:
        n = timing["launches"]
        note += (f", {n} launch{'es' if n != 1 else ''}, host overhead "
                 f"{fmt_time(timing['wall'] - timing['gpu'])}")
    if timing["measured"]:
        note += f"; {timing['measured']}"
    if not os.path.exists(out):
        note += f"; result not saved: {timing['after']}"
        out = None
    return row(section, workload, "Tessera", seconds=t, rate=amount / t, unit=unit,
               note=note), out


def compare(args, section, workload, amount, unit, session, inputs, peers):
    """Rows for one workload: Tessera's (see `tessera_row`), then each peer's: `inputs`
    names the .npy inputs given to the peers as bf16 GPU tensors, and each peer is
    (name, fn(tensors) -> result, compare its result with Tessera's?)."""
    print(workload, flush=True)
    try:
        need_torch()
        tensors, missing = {k: gpu_tensor(p) for k, p in inputs.items()}, None
    except Exception as e:
        tensors, missing = None, reason(e)
    # Each peer runs once (its result, for the error column), then is timed in
    # rounds between Tessera's (`tessera_rounds`), `--runs` runs in all.
    results, times, failed = {}, {}, {}
    for name, fn, *_ in peers:
        try:
            if missing:
                raise Failed(missing)
            results[name] = fn(tensors)
            times[name] = []
        except Exception as e:
            failed[name] = reason(e)
    per_round = max(10, args.runs // max(1, args.rounds))

    def peer_round():
        for name, fn, *_ in peers:
            if name in times and name not in failed:
                try:
                    times[name].append(time_peer(lambda: fn(tensors), per_round))
                except Exception as e:
                    failed[name] = reason(e)
    rounds_run = []
    t_row, out = tessera_row(args, section, workload, amount, unit, session,
                             lambda: rounds_run.append(peer_round()))
    if not rounds_run:  # Tessera failed before its first round: the peers alone
        for _ in range(max(1, args.rounds)):
            peer_round()
    rows, t_rate = [t_row], t_row["rate"]
    for name, fn, with_err, *note_fn in peers:
        try:
            if name in failed:
                raise Failed(failed[name])
            result = results.pop(name)
            s = statistics.median(times[name])
            ratio = t_rate * s / amount if t_rate else None
            err, notes = None, [note_fn[0](ratio)] if note_fn else []
            if with_err and out is not None:
                try:
                    err = max_error(out, result)
                except Exception as e:
                    notes.append(f"no error: {reason(e)}")
            note = "; ".join(n for n in notes if n)
            rows.append(row(section, workload, name, seconds=s, rate=amount / s, unit=unit,
                            ratio=ratio, err=err, note=note))
        except Exception as e:  # a missing backend or a failing peer is a row, not an abort
            rows.append(row(section, workload, name, note=f"failed: {reason(e)}"))
        result = None
        free_gpu()
    for r in rows:
        ratio = "" if r["ratio"] is None else f"Tessera/this {r['ratio']:.3g}"
        print(f"  {r['impl']:32} {fmt_time(r['seconds']):>11} {fmt_rate(r):>16}  {ratio}"
              f"  {r['note']}", flush=True)
    tensors = None
    free_gpu()
    for f in os.listdir(args.work):  # inputs and outputs can be GBs
        if f.endswith(".npy"):
            os.remove(os.path.join(args.work, f))
    emit(args, rows)


def gemm_configs():
    """The configurations of `gemm_bf16`'s `@autotune` space in the standard library that
    the executor tries on this GPU's arch (`"arch"`, docs/language.md change 45; the
    space's first where none names it), each as `-D NAME=VALUE` hints; `[[]]` where the
    kernel has no space. The space's text is a Python literal: a dict of lists (every
    combination) or a list of dicts."""
    src = open(LINALG).read()
    m = re.search(r"@autotune\(space=((?:(?!@autotune|\ndef ).)*?), key=\[[^\]]*\]\)\s*\n"
                  r"@kernel[^\n]*\ndef gemm_bf16\(", src, re.S)
    if not m:
        return [[]]
    space = ast.literal_eval(m.group(1))
    if isinstance(space, dict):
        space = [dict(zip(space, c)) for c in itertools.product(*space.values())]
    arch = gpu_arch()

    def names(c):
        a = c.get("arch")
        return None if a is None else [a] if isinstance(a, str) else list(a)

    tried = [c for c in space if names(c) is None or arch in names(c)] or space[:1]
    return [[f"{k}={v}" for k, v in c.items() if k != "arch"] for c in tried]


def gemm_tile(hints=()):
    """`gemm_bf16`'s BM and BN under `hints` (`-D` values), else its defaults, read from
    the standard library."""
    src = open(LINALG).read()
    sig = re.search(r"def gemm_bf16\(.*?\):", src, re.S).group(0)
    given = dict(h.split("=", 1) for h in hints if "=" in h)
    return tuple(int(given.get(n) or re.search(rf"{n}: const = (\d+)", sig).group(1))
                 for n in ("BM", "BN"))


def f32_out(t, a="a", b="b"):
    """cuBLAS's product of two 16-bit matrices with an f32 result, the work of a
    Tessera GEMM writing an f32 C (`out_dtype`: torch 2.8 and later)."""
    return torch.mm(t[a], t[b], out_dtype=torch.float32)


def tf32_matmul(t, a, b, transpose_b=False):
    """cuBLAS's tf32 product (`allow_tf32`) of inputs `a` and `b` of `t`, as f32
    (converted once, exactly, and not timed again); `b.t()` where `transpose_b`."""
    for x in (a, b):
        if x + "32" not in t:
            t[x + "32"] = t[x].float()
    rhs = t[b + "32"].t() if transpose_b else t[b + "32"]
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return torch.matmul(t[a + "32"], rhs)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def bench_gemm(args):
    for n in [128] if args.tiny else [4096] if args.quick else [4096, 8192]:
        a, b = save_input(args, "a", (n, n), 1), save_input(args, "b", (n, n), 2)
        c = os.path.join(args.work, "c.npy")
        setup = ["from std.linalg import gemm_bf16", f'a = load_npy("{a}").to(bf16)',
                 f'b = load_npy("{b}").to(bf16)', f"c = zeros([{n}, {n}], f32)"]
        session = (setup, "gemm_bf16(a, b, c)", f'save_npy(c, "{c}")', c, "gemm_bf16")

        def tri(t):
            if triton is None:
                raise Failed("triton is not installed")
            if "c" not in t:
                t["c"] = torch.empty(n, n, device="cuda", dtype=torch.float32)
            triton_matmul(t["a"], t["b"], t["c"])
            return t["c"]

        def hinted(t, hints=HINTS, ptxas=True):
            if "c" not in t:
                t["c"] = torch.empty(n, n, device="cuda", dtype=torch.float32)
            bm, bn = gemm_tile(hints)
            grid = (-(-n // bm), -(-n // bn))  # the decorator's grid at this tile
            hinted_gemm(args, hints, ptxas)(grid, A=t["a"], B=t["b"], C=t["c"], M=n, K=n, N=n)
            return t["c"]

        def vs_hinted(ratio):
            return (f"REPL GPU median / hinted = {1 / ratio:.3f} (issue's goal: within 5%)"
                    if ratio else "")

        # The REPL tunes gemm_bf16's autotune space: the variants emitted here
        # are the configurations it tries on this arch.
        bks = gemm_configs()
        peers = [("torch.matmul (cuBLAS, bf16 out)", lambda t: torch.matmul(t["a"], t["b"]), True),
                 ("torch.mm out_dtype=f32 (cuBLAS, f32 out)", f32_out, True),
                 ("Triton matmul (f32 out)", tri, True)]
        for bk in bks:
            at = f" at {', '.join(bk)}" if bk else ""
            peers += [(f"gemm_bf16 hinted ({' '.join('-D ' + h for h in HINTS)}){at}, ptxas "
                       "as the executor's", lambda t, bk=bk: hinted(t, HINTS + bk), True,
                       vs_hinted),
                      (f"gemm_bf16 with the launch's facts "
                       f"({' '.join('-D ' + h for h in FACTS)}){at}, ptxas as the executor's",
                       lambda t, bk=bk: hinted(t, FACTS + bk), True)]
        peers.append(("gemm_bf16 hinted, the driver's JIT (cuModuleLoadData of the PTX)",
                      lambda t: hinted(t, HINTS + bks[-1], False), True))
        compare(args, "gemm", f"gemm bf16 {n}³", 2.0 * n**3, "TFLOP/s", session,
                {"a": a, "b": b}, peers)
    if args.tiny or args.quick:
        return
    # The Hopper issue's other GEMMs: f16 (std `gemm`, the same kernel source)
    # and a skinny K, against cuBLAS only (with its bf16/f16 and its f32 result).
    for kernel, dt, (m, k, n) in (("gemm", "f16", (4096, 4096, 4096)),
                                  ("gemm", "f16", (8192, 8192, 8192)),
                                  ("gemm_bf16", "bf16", (8192, 1024, 8192))):
        a, b = save_input(args, "a", (m, k), 1), save_input(args, "b", (k, n), 2)
        c = os.path.join(args.work, "c.npy")
        setup = [f"from std.linalg import {kernel}", f'a = load_npy("{a}").to({dt})',
                 f'b = load_npy("{b}").to({dt})', f"c = zeros([{m}, {n}], f32)"]
        session = (setup, f"{kernel}(a, b, c)", f'save_npy(c, "{c}")', c, kernel)

        def operands(t, dt=dt):
            if dt == "f16":
                for x in "ab":
                    if x + "16" not in t:  # converted once, not timed again
                        t[x + "16"] = t[x].half()
                return "a16", "b16"
            return "a", "b"

        def cublas(t):
            a, b = operands(t)
            return torch.matmul(t[a], t[b])

        def cublas_f32(t):
            return f32_out(t, *operands(t))

        compare(args, "gemm", f"gemm {dt} {m}×{k}×{n} (std {kernel})", 2.0 * m * n * k,
                "TFLOP/s", session, {"a": a, "b": b},
                [(f"torch.matmul (cuBLAS, {dt} out)", cublas, True),
                 ("torch.mm out_dtype=f32 (cuBLAS, f32 out)", cublas_f32, True)])
    # The same products with a bf16 C (`gemm_bf16_out`), torch.matmul's own result.
    for (m, k, n) in ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 1024, 8192)):
        a, b = save_input(args, "a", (m, k), 1), save_input(args, "b", (k, n), 2)
        c = os.path.join(args.work, "c.npy")
        setup = ["from std.linalg import gemm_bf16_out", f'a = load_npy("{a}").to(bf16)',
                 f'b = load_npy("{b}").to(bf16)', f"c = zeros([{m}, {n}], bf16)"]
        session = (setup, "gemm_bf16_out(a, b, c)", f'save_npy(c.to(f32), "{c}")', c,
                   "gemm_bf16_out")
        compare(args, "gemm", f"gemm bf16 {m}×{k}×{n}, bf16 C (std gemm_bf16_out)",
                2.0 * m * n * k, "TFLOP/s", session, {"a": a, "b": b},
                [("torch.matmul (cuBLAS, bf16 out)", lambda t: torch.matmul(t["a"], t["b"]),
                  True)])
    # std.linalg's gemm_tf32 (B as [K, N]: on sm_90a its stages are transposed in
    # shared memory for wgmma) against cuBLAS's tf32 (`allow_tf32`; bf16 values,
    # exact in tf32, as for the [N, K] rows below).
    for (m, k, n) in ((4096, 4096, 4096), (8192, 8192, 8192)):
        a, b = save_input(args, "a", (m, k), 1), save_input(args, "b", (k, n), 2)
        c = os.path.join(args.work, "c.npy")
        setup = ["from std.linalg import gemm_tf32", f'a = load_npy("{a}").to(f32)',
                 f'b = load_npy("{b}").to(f32)', f"c = zeros([{m}, {n}], f32)"]
        session = (setup, "gemm_tf32(a, b, c)", f'save_npy(c, "{c}")', c, "gemm_tf32")

        compare(args, "gemm", f"gemm f32 {m}×{k}×{n} at tf32 (std gemm_tf32)", 2.0 * m * n * k,
                "TFLOP/s", session, {"a": a, "b": b},
                [("torch.matmul allow_tf32 (cuBLAS, f32 out)",
                  lambda t: tf32_matmul(t, "a", "b"), True)])
    # B given as [N, K] (bench/gemm_nt.tsr): bf16 against cuBLAS on the same layout,
    # f8e4m3 against torch._scaled_mm (its default accumulation, promoted to f32
    # as Tessera's is, and its fast one, which is not), and tf32 against cuBLAS's
    # tf32 (`allow_tf32`; the inputs are bf16 values, exact in tf32, so both round
    # nothing and compute the same products).
    for kernel, dt, (m, k, n) in (("gemm_nt", "bf16", (8192, 8192, 8192)),
                                  ("gemm_tf32_nt", "f32", (4096, 4096, 4096)),
                                  ("gemm_tf32_nt", "f32", (8192, 8192, 8192)),
                                  ("gemm_f8", "f8e4m3", (4096, 4096, 4096)),
                                  ("gemm_f8", "f8e4m3", (8192, 8192, 8192)),
                                  ("gemm_f8", "f8e4m3", (8192, 1024, 8192))):
        try:
            save = save_f8_input if dt == "f8e4m3" else save_input
            a, bt = save(args, "a", (m, k), 1), save(args, "bt", (n, k), 2)
        except Exception as e:
            emit(args, [row("gemm", f"gemm {dt} {m}×{k}×{n}, B as [N, K]", "Tessera",
                            note=f"failed: {reason(e)}")])
            continue
        c = os.path.join(args.work, "c.npy")
        cdt = "f32" if dt == "f32" else "bf16"
        setup = [f':load {GEMM_NT}', f'a = load_npy("{a}").to({dt})',
                 f'bt = load_npy("{bt}").to({dt})', f"c = zeros([{m}, {n}], {cdt})"]
        session = (setup, f"{kernel}(a, bt, c)", f'save_npy(c.to(f32), "{c}")', c, kernel)
        one = torch.ones((), device="cuda") if torch is not None else None

        def scaled_mm(t, fast):
            for x in ("a", "bt"):
                if x + "8" not in t:  # converted once (exactly), not timed again
                    t[x + "8"] = t[x].to(torch.float8_e4m3fn)
            return torch._scaled_mm(t["a8"], t["bt8"].t(), scale_a=one, scale_b=one,
                                    out_dtype=torch.bfloat16, use_fast_accum=fast)

        peers = ([("torch._scaled_mm (cuBLAS, f32 accumulation promoted)",
                   lambda t: scaled_mm(t, False), True),
                  ("torch._scaled_mm use_fast_accum (cuBLAS, not promoted)",
                   lambda t: scaled_mm(t, True), True)] if dt == "f8e4m3" else
                 [("torch.matmul(a, bt.t()) allow_tf32 (cuBLAS, f32 out)",
                   lambda t: tf32_matmul(t, "a", "bt", transpose_b=True), True)]
                 if dt == "f32" else
                 [("torch.matmul(a, bt.t()) (cuBLAS, bf16 out)",
                   lambda t: torch.matmul(t["a"], t["bt"].t()), True)])
        compare(args, "gemm", f"gemm {dt} {m}×{k}×{n}, B as [N, K] (bench {kernel})",
                2.0 * m * n * k, "TFLOP/s", session, {"a": a, "bt": bt}, peers)


def bench_attn(args):
    if args.tiny:
        cases = [(128, 64, False), (128, 64, True)]
    elif args.quick:
        cases = [(2048, 128, False), (2048, 128, True)]
    else:
        cases = [(s, d, c) for d in (64, 128) for s in (2048, 8192, 16384) for c in (False, True)]
    for s, d, causal in cases:
        b, h = (1, 2) if args.tiny else (16384 // s, 2048 // d)
        inputs = {t: save_input(args, t, (b, h, s, d), seed) for t, seed in zip("qkv", (3, 4, 5))}
        o = os.path.join(args.work, "o.npy")
        setup = ["from std.attention import flash_attn"]
        setup += [f'{t} = load_npy("{p}").to(bf16)' for t, p in inputs.items()]
        setup += [f"o = zeros([{b}, {h}, {s}, {d}], bf16)"]
        stmt = f"flash_attn(q, k, v, o, {1.0 / math.sqrt(d)!r}, causal={causal})"
        session = (setup, stmt, f'save_npy(o.to(f32), "{o}")', o, "flash_attn")

        def sdpa(backend):
            def fn(t):
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    return F.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=causal)
            return fn

        peers = [("SDPA flash", sdpa("FLASH_ATTENTION"), True),
                 ("SDPA cuDNN", sdpa("CUDNN_ATTENTION"), True)]
        flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
        name = f"attention B={b} H={h} S={s} D={d}{' causal' if causal else ''}"
        compare(args, "attn", name, flops, "TFLOP/s", session, inputs, peers)


def bench_rows(args, section):
    """softmax, or layer_norm and rms_norm, over the last axis, bf16, vs torch and a copy."""
    sizes = ([(64, 256)] if args.tiny else [(16384, 4096)] if args.quick
             else [(16384, 4096), (4096, 65536)])
    kinds = ["softmax"] if section == "softmax" else ["layer_norm", "rms_norm"]
    for (m, n), kind in [(size, kind) for size in sizes for kind in kinds]:
        inputs = {"x": save_input(args, "x", (m, n), 6)}
        y = os.path.join(args.work, "y.npy")
        setup = [f'x = load_npy("{inputs["x"]}").to(bf16)']
        if kind == "softmax":
            stmt = "y = softmax(x, dim=-1)"
            peer = ("torch.softmax", lambda t: torch.softmax(t["x"], dim=-1), True)
        elif kind == "layer_norm":
            inputs.update(w=save_input(args, "w", (n,), 7), b=save_input(args, "b", (n,), 8))
            setup += [f'w = load_npy("{inputs["w"]}").to(bf16)',
                      f'bias = load_npy("{inputs["b"]}").to(bf16)']
            stmt = "y = layer_norm(x, w, bias, eps=1e-5)"
            peer = ("F.layer_norm",
                    lambda t: F.layer_norm(t["x"], (n,), t["w"], t["b"], 1e-5), True)
        else:
            inputs.update(w=save_input(args, "w", (n,), 7))
            setup += [f'w = load_npy("{inputs["w"]}").to(bf16)']
            stmt = "y = rms_norm(x, w, eps=1e-6)"
            peer = ("F.rms_norm", lambda t: F.rms_norm(t["x"], (n,), t["w"], 1e-6), True)

        def copy(t):
            if "y" not in t:
                t["y"] = torch.empty_like(t["x"])
            return t["y"].copy_(t["x"])

        session = (setup, stmt, f'save_npy(y.to(f32), "{y}")', y, None)
        name = f"{stmt.split()[2].split('(')[0]} bf16 {m}×{n}"
        # One read and one write of the bf16 matrix (weight and bias are negligible).
        compare(args, section, name, 2.0 * m * n * 2, "GB/s", session, inputs,
                [peer, ("copy (y.copy_(x))", copy, False)])


COPY = """@kernel(grid=(cdiv(N, BLOCK),), num_warps=4)
def copy_kernel(x: Tensor["N", bf16], y: Tensor["N", bf16], BLOCK: const = 4096):
    i = program_id(0) * BLOCK
    store(y[i : i + BLOCK], load(x[i : i + BLOCK]))
"""


def bench_copy(args):
    """A user-written copy kernel (one BLOCK-wide tile a program) vs torch's `copy_`,
    bf16, flat: 16384×4096 elements, and (not --quick) a ragged length whose last
    program is cut short (the masked boundary tile)."""
    sizes = ([64 * 256] if args.tiny else [16384 * 4096] if args.quick
             else [16384 * 4096, 16384 * 4096 - 1000])
    for n in sizes:
        inputs = {"x": save_input(args, "x", (n,), 9)}
        y = os.path.join(args.work, "y.npy")
        setup = [COPY, f'x = load_npy("{inputs["x"]}").to(bf16)', f"y = zeros([{n}], bf16)"]
        session = (setup, "copy_kernel(x, y)", f'save_npy(y.to(f32), "{y}")', y, "copy_kernel")

        def copy(t):
            if "y" not in t:
                t["y"] = torch.empty_like(t["x"])
            return t["y"].copy_(t["x"])

        # One read and one write of n bf16 elements.
        compare(args, "copy", f"copy bf16 {n} elements (BLOCK 4096)", 2.0 * n * 2, "GB/s",
                session, inputs, [("copy (y.copy_(x))", copy, True)])


def compile_cases(args):
    """(kernel, setup statements, launch statement, variables to move to the GPU) for
    compile-to-launch timing, at the sizes of the throughput workloads (the values do
    not matter: `ones` is quicker to make than `randn`)."""
    n = 128 if args.tiny else 4096
    gemm = ["from std.linalg import gemm_bf16", f"a = ones([{n}, {n}], bf16)",
            f"b = ones([{n}, {n}], bf16)", f"c = zeros([{n}, {n}], f32)"]
    cases = [(f"gemm_bf16 {n}³", gemm, "gemm_bf16(a, b, c)", "abc")]
    for d, causal in ((64, False), (128, True)):
        b, h, s = (1, 2, 128) if args.tiny else (8, 2048 // d, 2048)
        shape = f"[{b}, {h}, {s}, {d}]"
        setup = ["from std.attention import flash_attn"]
        setup += [f"{t} = ones({shape}, bf16)" for t in "qkvo"]
        stmt = f"flash_attn(q, k, v, o, {1.0 / math.sqrt(d)!r}, causal={causal})"
        cases.append((f"flash_attn S={s} D={d}{' causal' if causal else ''}", setup, stmt, "qkvo"))
    m, n = (64, 256) if args.tiny else (16384, 4096)
    x = [f"x = ones([{m}, {n}], bf16)"]
    cases.append((f"softmax bf16 {m}×{n}", x, "y = softmax(x, dim=-1)", "x"))
    wb = [f"w = ones([{n}], bf16)", f"bias = zeros([{n}], bf16)"]
    cases.append((f"layer_norm bf16 {m}×{n}", x + wb, "y = layer_norm(x, w, bias)", "x"))
    return cases


CACHE_RE = re.compile(r"\d+ compiled, \d+ from disk, \d+ reused")


def first_launch(args, cache_dir, setup, stmt, moved, warm):
    """Seconds of the first (and, if `warm`, the second) launch in a new session,
    net of the marker's round trip; and the `:device` line about the cache."""
    repl = Repl(args, cache_dir)
    try:
        moves = [f'{v} = {v}.to("cuda")' for v in moved] if args.device == "cuda" else []
        repl.step(*setup, *moves)
        trip = statistics.median(repl.step()[0] for _ in range(5))
        times = [repl.step(stmt)[0] - trip for _ in range(2 if warm else 1)]
        _, device = repl.step(":device")
        counts = [CACHE_RE.search(l) for l in device if l.startswith("kernel cache")]
        return times, counts[0].group(0) if counts and counts[0] else ""
    finally:
        repl.close()


def bench_compile(args):
    for kernel, setup, stmt, moved in compile_cases(args):
        print(f"compile-to-launch: {kernel}", flush=True)
        cold, warm, cached, notes = [], [], [], ""
        try:
            for rep in range(args.reps):
                cache_dir = tempfile.mkdtemp(prefix="cache-", dir=args.work)
                (c, w), first = first_launch(args, cache_dir, setup, stmt, moved, warm=True)
                (h,), second = first_launch(args, cache_dir, setup, stmt, moved, warm=False)
                if first or second:  # the kernel cache's counters, from `:device`
                    notes = f"first process: {first or '?'}; second: {second or '?'}"
                cold.append(c), warm.append(w), cached.append(h)
                shutil.rmtree(cache_dir, ignore_errors=True)
            emit(args, [compile_row(f"Tessera {kernel}", cold, cached, warm, notes)])
        except Failed as e:
            print(f"  failed: {e}", flush=True)
            emit(args, [row("compile", f"Tessera {kernel}", "", note=f"failed: {e}")])
    print("compile-to-launch: Triton matmul (fixed config)", flush=True)
    try:
        cold, warm, cached = [], [], []
        for rep in range(args.reps):
            cache_dir = tempfile.mkdtemp(prefix="triton-", dir=args.work)
            first = triton_child(args, cache_dir)
            again = triton_child(args, cache_dir)
            cold.append(first["first"]), warm.append(first["second"])
            cached.append(again["first"])
            shutil.rmtree(cache_dir, ignore_errors=True)
        emit(args, [compile_row(f"Triton matmul bf16 {128 if args.tiny else 4096}³",
                                cold, cached, warm, "BM=BN=128, BK=32, 8 warps, 3 stages")])
    except Failed as e:
        print(f"  failed: {e}", flush=True)
        emit(args, [row("compile", "Triton matmul", "", note=f"failed: {e}")])


def compile_row(name, cold, cached, warm, note):
    med = statistics.median
    r = row("compile", name, "", note=note)
    r.update(cold=med(cold), cached=med(cached), warm=med(warm), reps=len(cold))
    print(f"  cold {fmt_time(r['cold'])}, cached {fmt_time(r['cached'])}, "
          f"warm {fmt_time(r['warm'])}  {note}", flush=True)
    return r


def triton_child(args, cache_dir):
    env = dict(os.environ, TRITON_CACHE_DIR=cache_dir, CUDA_CACHE_DISABLE="1")
    n = "128" if args.tiny else "4096"
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--triton-probe", n],
                           capture_output=True, encoding="utf-8", env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        raise Failed(f"Triton compile probe timed out after {args.timeout} s")
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise Failed(tail)
    return json.loads(lines[-1])


VADD = """@kernel(grid=(cdiv(N, BLOCK),))
def vadd(x: Tensor["N", f32], y: Tensor["N", f32], out: Tensor["N", f32], BLOCK: const = 16):
    i = program_id(0) * BLOCK
    store(out[i : i + BLOCK], load(x[i : i + BLOCK]) + load(y[i : i + BLOCK]))
"""


def bench_launch(args):
    """Wall time of one launch of a 16-element kernel minus its GPU time."""
    print("launch overhead: vadd on 16 f32 elements", flush=True)
    rows = []
    setup = [VADD, "x = randn([16], f32, seed=1)", "y = randn([16], f32, seed=2)",
             "out = zeros([16], f32)"]
    try:
        t = tessera_time(args, setup, "vadd(x, y, out)")
        over = t["wall"] - t["gpu"] if t["gpu"] is not None else None
        goal = ("no GPU time in `:time`" if over is None
                else f"goal ≤ 20 µs {'met' if over <= 20e-6 else 'not met'}")
        rows.append(launch_row("Tessera REPL `:time vadd(x, y, out)`", t["wall"], t["gpu"], over,
                               f"{t['runs']} runs; {goal}"))
    except Failed as e:
        rows.append(launch_row("Tessera REPL", None, None, None, f"failed: {e}"))
    t = {}

    def triton_add():
        if triton is None:
            raise Failed("triton is not installed")
        add_kernel[(1,)](t["x"], t["y"], t["out"], 16, BLOCK=16)

    peers = [("torch.add(x, y, out=out)", lambda: torch.add(t["x"], t["y"], out=t["out"])),
             ("Triton add kernel", triton_add)]
    for name, fn in peers:
        try:
            need_torch()
            if not t:
                t.update(x=torch.randn(16, device="cuda"), y=torch.randn(16, device="cuda"),
                         out=torch.empty(16, device="cuda"))
            wall = wall_per_call(fn, args.runs * 10)
            gpu = time_peer(fn, args.runs)
            rows.append(launch_row(name, wall, gpu, wall - gpu, "call + synchronize, from Python"))
        except Exception as e:  # a failing peer is a row
            rows.append(launch_row(name, None, None, None, f"failed: {reason(e)}"))
    emit(args, rows)


def wall_per_call(fn, runs):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def launch_row(name, wall, gpu, over, note):
    r = row("launch", "launch", name, note=note)
    r.update(wall=wall, gpu=gpu, over=over)
    print(f"  {name}: wall {fmt_time(wall)}, GPU {fmt_time(gpu)}, "
          f"overhead {fmt_time(over)}  {note}", flush=True)
    return r


# ---------------------------------------------------------------------------
# Report

def fmt_time(s):
    if s is None:
        return "—"
    if s >= 1.0:
        return f"{s:.3f} s"
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} µs"

def fmt_rate(r):
    if r["rate"] is None:
        return "—"
    v = r["rate"] / (1e12 if r["unit"] == "TFLOP/s" else 1e9)
    return f"{v:.1f} {r['unit']}" if v >= 10 else f"{v:.3g} {r['unit']}"


def fmt_err(e):
    return "—" if e is None else "nan" if math.isnan(e) else f"{e:.3g}"


def table(title, head, cells, intro=""):
    out = [f"## {title}", ""] + ([intro, ""] if intro else [])
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(c) + " |" for c in cells] + [""]


def markdown(rows, header):
    out = ["# Tessera GPU benchmark", "", *header, ""]
    titles = {"gemm": "GEMM (bf16 in, f32 accumulation)", "attn": "Flash-attention forward (bf16)",
              "copy": "Copy kernel (bf16, `store(y[i:i+BLOCK], load(x[i:i+BLOCK]))`)",
              "softmax": "Softmax over the last axis (bf16)",
              "norm": "Layer norm and RMS norm over the last axis (bf16)"}
    intro = ("Tessera's time is the GPU median of `:time` (its wall time is in the note); "
             "Tessera ÷ this is Tessera's throughput over the peer's (above 1: Tessera is "
             "faster); the error is the largest |Tessera − peer| over the result (against "
             "torch.matmul it includes the rounding of torch's bf16 output).")
    for section, title in titles.items():
        sec = [r for r in rows if r["section"] == section]
        if sec:
            out += table(title, ["workload", "implementation", "median time", "throughput",
                                 "Tessera ÷ this", "max abs error vs Tessera", "note"],
                         [[r["workload"], r["impl"], fmt_time(r["seconds"]), fmt_rate(r),
                           "—" if r["ratio"] is None else f"{r['ratio']:.3g}",
                           fmt_err(r["err"]), r["note"]] for r in sec], intro)
            intro = ""
    comp = [r for r in rows if r["section"] == "compile"]
    if comp:
        out += table("Compile-to-launch", ["kernel", "cold", "cached", "warm", "note"],
                     [[r["workload"], *(fmt_time(r.get(k)) for k in ("cold", "cached", "warm")),
                       r["note"]] for r in comp],
                     "cold: fresh cache directory; cached: a new process, same directory; "
                     "warm: the second launch in the first process; median of the processes.")
    launch = [r for r in rows if r["section"] == "launch"]
    if launch:
        out += table("Host overhead of one launch",
                     ["implementation", "wall median", "GPU median", "overhead", "note"],
                     [[r["impl"], *(fmt_time(r.get(k)) for k in ("wall", "gpu", "over")),
                       r["note"]] for r in launch])
    return "\n".join(out)


def tessera_version(path):
    """`tessera --version` of the binary at `path`, or why there is none."""
    try:
        return subprocess.run([path, "--version"], capture_output=True,
                              encoding="utf-8").stdout.strip()
    except OSError:
        return f"no binary at {path}"


def header(args):
    version = tessera_version(args.tessera)
    gpu = "no GPU seen by torch"
    if torch is not None and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name()
    tv = torch.__version__ if torch is not None else "not installed"
    trv = triton.__version__ if triton is not None else "not installed"
    return [f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, host {platform.node()}",
            f"- GPU: {gpu}; Tessera device `{args.device}`"
            + (f", compiling for {args.cuda_arch} (`--cuda-arch`)" if args.cuda_arch else ""),
            f"- {version} ({args.tessera}); torch {tv}; triton {trv}; numpy {np.__version__}",
            f"- command: `{' '.join(sys.argv)}`"]


SECTIONS = ["gemm", "attn", "copy", "softmax", "norm", "compile", "launch"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tessera", default="target/release/tessera", help="the tessera binary")
    ap.add_argument("--tsrc", default=None,
                    help="binary for the hinted gemm's `emit` (default: the tessera binary)")
    ap.add_argument("--out", default="bench/results.md", help="markdown table to write")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma list of " + ",".join(SECTIONS))
    ap.add_argument("--quick", action="store_true", help="one size per workload")
    ap.add_argument("--runs", type=int, default=50, help="timed runs per peer (>= 20)")
    ap.add_argument("--reps", type=int, default=3, help="processes per compile timing")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds of Tessera's and the peers' timings, interleaved")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per Tessera session")
    ap.add_argument("--tmp", default=None, help="folder for inputs, outputs and caches")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="Tessera's device (cpu only to check this script)")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes, to check this script")
    ap.add_argument("--cuda-arch", default=None,
                    help="compile Tessera's kernels for this older NVIDIA arch "
                         "(TESSERA_CUDA_ARCH; sm_90 on an H100: the mma.sync path)")
    ap.add_argument("--triton-probe", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    # The report has µ, × and ³ in it, whatever the locale.
    sys.stdout.reconfigure(encoding="utf-8", errors="replace")
    if args.triton_probe is not None:
        try:
            triton_compile_probe(args.triton_probe)
        except Failed as e:
            sys.exit(f"{e}")
        return
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown workload {', '.join(unknown)} (choose from {', '.join(SECTIONS)})")
    args.runs = max(args.runs, 20)
    args.reps = 1 if args.quick else max(args.reps, 1)
    args.tessera = os.path.abspath(args.tessera)
    args.tsrc = args.tsrc and os.path.abspath(args.tsrc)
    if args.cuda_arch:
        os.environ["TESSERA_CUDA_ARCH"] = args.cuda_arch
    # Cleans up (and keeps the report) when a time limit stops the run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.work = tempfile.mkdtemp(prefix="tessera-bench-", dir=args.tmp)
    args.cache = os.path.join(args.work, "cache")
    args.rows, args.header = [], header(args)
    benches = {"gemm": bench_gemm, "attn": bench_attn, "copy": bench_copy,
               "softmax": lambda a: bench_rows(a, "softmax"),
               "norm": lambda a: bench_rows(a, "norm"),
               "compile": bench_compile, "launch": bench_launch}
    try:
        for section in SECTIONS:
            if section in only:
                started = time.perf_counter()
                try:
                    benches[section](args)
                except Exception as e:  # keep the other sections and the table
                    print(f"{section}: {reason(e)}", flush=True)
                    emit(args, [row(section, section, section, note=f"failed: {reason(e)}")])
                print(f"[{section}: {time.perf_counter() - started:.0f} s]", flush=True)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    emit(args, [])
    print(f"\nwrote {args.out}")


def emit(args, rows):
    """Adds rows to the report and rewrites it, so a run cut short keeps what it measured."""
    args.rows += rows
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(markdown(args.rows, args.header))


if __name__ == "__main__":
    main()
