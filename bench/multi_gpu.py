#!/usr/bin/env python3
"""Tessera on several GPUs of one host against torch.distributed (NCCL), in one run.

Run from the repository root on a multi-GPU machine (see bench/README.md):

    python3 bench/multi_gpu.py --tessera target/release/tessera [--gpus 2,4] [--quick] \\
        --out results-multi.md

It builds nothing: Tessera runs as the `tessera` binary given by `--tessera`. NVLink
multicast stays off on both sides (NCCL_NVLS_ENABLE=0 and its siblings are set in this
process's environment, which every child inherits).

1. all_reduce bus bandwidth (`--only allreduce`), bf16, messages of 1 MiB to 1 GiB per
   GPU, for each GPU count of `--gpus`:
   * Tessera: one `tessera repl --device cuda --devices N` session per GPU count, fed
     statement by statement; per size `x = shard(randn([N * rows, cols], bf16), axis=0)`
     (each GPU's shard is the message), `y = all_reduce(x)` once (warm-up: the
     communicator is made on first use), then `:time all_reduce(x)`. The time is the
     wall median per run that `:time` prints: it includes the host's work per call
     (dispatch, the output's allocation, waiting for the GPUs). Where `:time` has a GPU
     part, it is the sum over the GPUs of their kernel and collective time measured with
     CUDA events, so its ÷ N (each GPU's mean time in the collective) is the second
     column. At the first size the script also checks the sums: it saves `gather(x)` and
     `gather(y)` and compares every shard of y with the sum of x's shards (in f64, with
     a bf16 tolerance).
   * torch.distributed, same run: N processes (torch.multiprocessing spawn, NCCL,
     MASTER_ADDR=127.0.0.1, a free port), each `dist.all_reduce(t)` on a bf16 tensor of
     the message size; 5 warm-up calls, then `--runs` calls each timed on the host as
     `all_reduce` + `torch.cuda.synchronize()` (as `:time` times Tessera: wall median),
     and `--runs` calls queued back to back between CUDA events (the event median, the
     second column). Each number is the largest of the ranks' medians. The timed tensor
     holds zeros (an in-place sum of random numbers would grow to inf over the runs; the
     values do not change the traffic); the sums are checked once on random numbers.
   * Bus bandwidth as nccl-tests computes it: algbw = bytes / time, busbw = algbw *
     2(N-1)/N (GB/s = 1e9 bytes/s). Tessera ÷ torch is busbw over busbw (above 1:
     Tessera is faster), wall against wall and GPU against events; the goal is >= 0.9.
2. Sharded GEMM scaling (`--only gemm`), bf16, A 16384x8192 sharded on rows, B 8192x8192:
   one `tessera repl --device cuda --devices N` session for N = 1 and each GPU count of
   `--gpus`, with A and B loaded from f32 .npy files of bf16 values written by this
   script; `a = shard(A, axis=0)`, `b = all_gather(shard(B, axis=0))` (B whole on every
   GPU, placed once, so that the timing is of the matmuls), then `c = matmul(a, b)` once
   and `:time c = matmul(a, b)`; then the same with `bh`, B as an ordinary (host) tensor,
   which each call places on the GPUs (its times are in the row's note). TFLOP/s = 2*M*N*K / time; scaling = t1 / tN, efficiency = scaling / N
   (goal >= 0.9). Both are given from the wall median (the elapsed time a user sees,
   host overhead included) and from the GPU median ÷ N (each GPU's mean kernel time:
   how the kernel fares on a smaller shard, blind to whether the GPUs ran at the same
   time). The error column is the largest |Tessera - torch.matmul| (torch's output is
   bf16, so its rounding is included). Peer row: torch.matmul on one GPU, CUDA-event
   median of `--runs` runs queued back to back.

3. Overlap of a collective with independent work inside one function (`--only overlap`),
   bf16, for each GPU count of `--gpus` above 1, every tensor replicated (`broadcast`):
   `overlapped(x, a, w)` all-reduces x (R x C, the message) and, not needing the result,
   multiplies a (M x K) by `w + x[0:K, :] * 0` (reading the collective's input is
   allowed while it runs); `serial(x, a, w)` is the same but for `g[0:K, :]` in place of
   `x[0:K, :]`, so the matmul must wait for the all-reduce. `comm(x)` and `compute(a, w)`
   time each part alone. Times are `:time`'s wall medians; overlap speed-up = serial ÷
   overlapped (1: none; at most (comm + compute) ÷ max(comm, compute)).

A failing row (a Tessera error, no torch, fewer GPUs than asked) says why; the table is
always written (`--out`), and the exit status is 0 when the script itself worked.

`--device cpu --tiny` checks the script on a machine without a GPU: Tessera with
`--device cpu --devices N` at tiny sizes (the numbers mean nothing; the peers say why
they are missing without torch or GPUs). `--self-test` checks the arithmetic, the
parsing and the table writing without running anything.
"""

import argparse
import copy
import glob
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu as G  # noqa: E402  (bench/gpu.py: sessions, `:time` parsing, tables)

torch = G.torch

# NVLink multicast off (it can take the host's shared GPUs out of service); children
# (Tessera's sessions and torch's ranks) inherit this environment.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}

MiB = 1 << 20
SIZES = [1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB]
QUICK_SIZES = [1 * MiB, 64 * MiB, 1024 * MiB]
TINY_SIZES = [4 << 10, 64 << 10]
COLS, TINY_COLS = 1024, 64
BF16 = 2  # bytes

GEMM = (16384, 8192, 8192)  # M, K, N: A is M x K (sharded on M), B is K x N
TINY_GEMM = (64, 32, 48)
# Overlap: the message x is R x C, the matmul M x K times K x C (about 1 ms and
# 0.5 ms on H100s).
OVERLAP = {"R": 8192, "C": 8192, "M": 2048, "K": 8192}
TINY_OVERLAP = {"R": 32, "C": 16, "M": 8, "K": 16}
OVERLAP_SRC = '''def comm(x: Tensor["R", "C", bf16]) -> Tensor["R", "C", bf16]:
    return all_reduce(x)

def compute(a: Tensor["M", "K", bf16], w: Tensor["K", "C", bf16]) -> Tensor["M", "C", bf16]:
    return matmul(a, w)

def overlapped(x: Tensor["R", "C", bf16], a: Tensor["M", "K", bf16], w: Tensor["K", "C", bf16]) -> Tensor["C", bf16]:
    g = all_reduce(x)
    c = matmul(a, w + x[0:K, :] * 0.0)
    return g[0, :] + c[0, :]

def serial(x: Tensor["R", "C", bf16], a: Tensor["M", "K", bf16], w: Tensor["K", "C", bf16]) -> Tensor["C", bf16]:
    g = all_reduce(x)
    c = matmul(a, w + g[0:K, :] * 0.0)
    return g[0, :] + c[0, :]
'''


# ---------------------------------------------------------------------------
# Arithmetic


def bus_bandwidth(nbytes, seconds, n):
    """(algbw, busbw) in bytes/s of an all-reduce of `nbytes` per rank over `n` ranks
    taking `seconds`, as nccl-tests defines them."""
    algbw = nbytes / seconds
    return algbw, algbw * 2 * (n - 1) / n


def message_shape(nbytes, cols):
    """(rows, cols) of one bf16 shard of `nbytes`."""
    if nbytes % (cols * BF16):
        raise ValueError(f"{nbytes} bytes is not a whole number of {cols}-column bf16 rows")
    return nbytes // (cols * BF16), cols


def scaling(t1, tn, n):
    """(t1 / tN, (t1 / tN) / N): the speed-up over one GPU and the parallel efficiency."""
    s = t1 / tn
    return s, s / n


def fmt_size(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def fmt_bw(bps):
    return "—" if bps is None else f"{bps / 1e9:.1f} GB/s" if bps >= 1e10 else f"{bps / 1e9:.3g} GB/s"


def fmt_ratio(r):
    return "—" if r is None else f"{r:.3g}"


def fmt_tflops(f):
    return "—" if f is None else f"{f / 1e12:.1f}" if f >= 1e13 else f"{f / 1e12:.3g}"


def parse_gpus(text):
    counts = sorted({int(t) for t in text.split(",") if t.strip()})
    if not counts or counts[0] < 1:
        raise ValueError(f"--gpus takes GPU counts of at least 1, e.g. 2,4 (got {text!r})")
    return counts


def default_gpus(available):
    """2 and 4 where the machine has them, else what it has."""
    counts = [n for n in (2, 4) if n <= available]
    if 1 <= available < 4 and available not in counts:
        counts.append(available)
    return counts


def bf16_sum_check(x, y, n):
    """Max |y_i - sum_j x_j| over y's shards i, and whether it is within a bf16
    tolerance: x and y are the gathered (whole) input and output, split as `shard`
    splits (numpy.array_split on axis 0) into n shards."""
    xs = np.array_split(x.astype(np.float64), n, axis=0)
    if len({s.shape for s in xs}) != 1:  # all_reduce needs equal shards
        return float("nan"), False
    want = sum(xs)
    # Every partial sum may round to bf16 (8 bits of mantissa): n roundings at most,
    # each within 2^-8 of the magnitudes summed so far.
    tol = n * 2.0**-8 * sum(np.abs(s) for s in xs) + 1e-6
    err, ok = 0.0, True
    for part in np.array_split(y.astype(np.float64), n, axis=0):
        if part.shape != want.shape:
            return float("nan"), False
        diff = np.abs(part - want)
        err = max(err, float(diff.max()) if diff.size else 0.0)
        ok = ok and bool(np.all(diff <= tol))
    return err, ok


# ---------------------------------------------------------------------------
# Tessera


def session_args(args, devices):
    a = copy.copy(args)
    a.devices = devices
    return a


def tessera_allreduce(args, n, sizes):
    """{size: result dict} of the Tessera all_reduce session on n devices; a result is
    {wall, gpu, runs, launches, note} or {failed: reason}."""
    results, repl = {}, None
    cols = TINY_COLS if args.tiny else COLS
    try:
        for i, size in enumerate(sizes):
            print(f"  Tessera, {n} devices, {fmt_size(size)}", flush=True)
            started = time.perf_counter()
            try:
                if repl is None or repl.p.poll() is not None:
                    if repl is not None:
                        repl.close()
                    repl = G.Repl(session_args(args, n), args.cache)
                rows, _ = message_shape(size, cols)
                repl.step(f"x = shard(randn([{n * rows}, {cols}], bf16, seed={i + 1}), axis=0)",
                          "y = all_reduce(x)")
                timing = time_stmt(repl, "all_reduce(x)")
                notes = [f"{timing['runs']} runs"]
                if timing["gpu"] is not None:
                    k = timing["launches"]
                    notes.append(f"{k} launch{'es' if k != 1 else ''} on the GPUs")
                if i == 0:
                    notes.append(check_tessera_sums(args, repl, n))
                results[size] = dict(timing, note="; ".join(notes))
                print(f"    {G.fmt_time(timing['wall'])} per run; the size took "
                      f"{time.perf_counter() - started:.1f} s (input, warm-up, `:time`)", flush=True)
            except G.Failed as e:
                results[size] = {"failed": str(e)}
                print(f"    failed: {e}", flush=True)
                if repl is not None and str(e).startswith("no answer from tessera"):
                    repl.p.kill()  # stuck: the next size starts a new session
                    repl.close()
                    repl = None
                try:  # a statement's error leaves the session running; a crash does not
                    if repl is not None:
                        repl.p.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
    finally:
        if repl is not None:
            repl.close()
    return results


def check_tessera_sums(args, repl, n):
    xp, yp = (os.path.join(args.work, f"{v}.npy") for v in "xy")
    try:
        repl.step(f'save_npy(gather(x).to(f32), "{xp}")', f'save_npy(gather(y).to(f32), "{yp}")')
        err, ok = bf16_sum_check(np.load(xp), np.load(yp), n)
    except G.Failed as e:
        return f"sums not checked: {e}"
    finally:
        for p in (xp, yp):
            if os.path.exists(p):
                os.remove(p)
    return f"sums right (max error {err:.3g})" if ok else f"WRONG SUMS: max error {err:.3g}"


def time_stmt(repl, stmt):
    """`:time STMT` in a live session: {wall, gpu, runs, launches}."""
    _, out = repl.step(":time " + stmt)
    timing = G.parse_time("\n".join(out))
    if timing is None:
        raise G.Failed("no `:time` line: " + (" / ".join(out)[-200:] or "no output"))
    return timing


def tessera_gemm(args, n, a_path, b_path, c_path):
    """`:time c = matmul(a, b)` with `a` sharded on rows and `b` replicated (placed on
    every device once, by `all_gather`), saving c to c_path; then the same with `b` a
    host tensor (`bh`), which the session places on the devices at each call, as
    result["host_b"]."""
    repl = G.Repl(session_args(args, n), args.cache)
    try:
        repl.step(f'a = shard(load_npy("{a_path}").to(bf16), axis=0)',
                  f'bh = load_npy("{b_path}").to(bf16)', "b = all_gather(shard(bh, axis=0))",
                  "c = matmul(a, b)")
        t = time_stmt(repl, "c = matmul(a, b)")
        try:
            repl.step(f'save_npy(gather(c).to(f32), "{c_path}")')
        except G.Failed as e:
            t["note_extra"] = f"result not saved: {e}"
        try:
            repl.step("c = matmul(a, bh)")
            t["host_b"] = time_stmt(repl, "c = matmul(a, bh)")
        except G.Failed as e:
            t["host_b"] = {"failed": str(e)}
        return t
    finally:
        repl.close()


# ---------------------------------------------------------------------------
# torch.distributed peer (its own process, so that a hang is bounded by --timeout)


def gpu_count():
    """GPUs this machine has, without making a CUDA context in this process."""
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, encoding="utf-8",
                           timeout=60)
        if p.returncode == 0:
            return sum(1 for l in p.stdout.splitlines() if l.startswith("GPU "))
    except (OSError, subprocess.TimeoutExpired):
        pass
    return torch.cuda.device_count() if torch is not None else 0


def peer_missing(args, n):
    """Why torch.distributed cannot run on n GPUs here, or None."""
    if torch is None:
        return "torch is not installed"
    try:
        import torch.distributed as dist
    except ImportError:
        return "torch.distributed is not available"
    if not dist.is_available() or not dist.is_nccl_available():
        return "torch has no NCCL backend"
    if args.gpus_here < n:
        return f"{n} GPUs needed, this machine has {args.gpus_here}"
    return None


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_allreduce(args, n, sizes):
    """{size: result dict} of torch.distributed's all_reduce on n GPUs: {wall, events,
    note} or {failed: reason}."""
    missing = peer_missing(args, n)
    if missing:
        return {s: {"failed": missing} for s in sizes}
    print(f"  torch.distributed, {n} GPUs, {len(sizes)} sizes", flush=True)
    prefix = os.path.join(args.work, f"torch-{n}")
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-peer", str(n),
           "--peer-sizes", ",".join(map(str, sizes)), "--runs", str(args.runs),
           "--peer-out", prefix]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         encoding="utf-8", start_new_session=True)
    try:
        out, err = p.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the ranks too: they are in its process group
        p.communicate()
        return {s: {"failed": f"torch.distributed timed out after {args.timeout} s"}
                for s in sizes}
    ranks = []
    for path in sorted(glob.glob(prefix + ".rank*.json")):
        with open(path, encoding="utf-8") as f:
            ranks.append(json.load(f))
        os.remove(path)
    if p.returncode != 0 or len(ranks) != n:
        lines = [l for l in (err or "").splitlines() if l.strip()]
        why = next((l for l in reversed(lines) if "Error" in l), lines[-1] if lines else "")
        return {s: {"failed": f"torch.distributed failed: {why.strip() or 'no output'}"}
                for s in sizes}
    return merge_ranks(ranks, sizes)


def merge_ranks(ranks, sizes):
    """{size: {wall, events, note, version}} from the ranks' reports: each time the
    largest of the ranks' medians (the collective ends when its slowest rank does)."""
    n = len(ranks)
    results = {}
    for s in sizes:
        per = [r["sizes"][str(s)] for r in ranks]
        errs = [r["check_error"] for r in ranks if r.get("check_error") is not None]
        note = f"{per[0]['runs']} runs; max of {n} ranks' medians"
        if errs and s == sizes[0]:
            ok = all(r["check_ok"] for r in ranks)
            note += (f"; sums right (max error {max(errs):.3g})" if ok
                     else f"; WRONG SUMS: max error {max(errs):.3g}")
        results[s] = {"wall": max(x["wall"] for x in per),
                      "events": max(x["events"] for x in per), "note": note,
                      "version": ranks[0]["version"]}
    return results


def torch_peer_main(n, sizes, runs, prefix):
    """Child process: spawns the n ranks and waits for them."""
    import torch.multiprocessing as mp
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    mp.spawn(torch_rank, args=(n, sizes, runs, prefix), nprocs=n, join=True)


def torch_rank(rank, n, sizes, runs, prefix):
    """One rank: per size, the host-timed and the event-timed medians of all_reduce."""
    import torch.distributed as dist
    # The rank's GPU by set_device (not init_process_group's device_id, which some
    # torch versions hang with); the communicator is made at the first collective.
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=n)
    nccl = torch.cuda.nccl.version()  # a tuple in recent torch, an int before
    nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    report = {"rank": rank, "sizes": {}, "version": f"torch {torch.__version__}, NCCL {nccl}"}
    for i, size in enumerate(sizes):
        count = size // BF16
        if i == 0:
            # The sums, once, on random numbers: every rank makes every rank's input.
            gen = [torch.Generator(device=dev).manual_seed(1000 + r) for r in range(n)]
            xs = [torch.randn(count, generator=g, device=dev).to(torch.bfloat16) for g in gen]
            t = xs[rank].clone()
            dist.all_reduce(t)
            want = sum(x.double() for x in xs)
            tol = n * 2.0**-8 * sum(x.double().abs() for x in xs) + 1e-6
            diff = (t.double() - want).abs()
            report["check_error"] = diff.max().item()
            report["check_ok"] = bool((diff <= tol).all().item())
            del xs, want, tol, diff
        t = torch.zeros(count, dtype=torch.bfloat16, device=dev)
        for _ in range(5):  # the same count on every rank: a collective must match
            dist.all_reduce(t)
        torch.cuda.synchronize()
        walls = []
        for _ in range(runs):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(runs)]
        dist.barrier(device_ids=[rank])
        torch.cuda.synchronize()
        for start, end in events:
            start.record()
            dist.all_reduce(t)
            end.record()
        torch.cuda.synchronize()
        report["sizes"][str(size)] = {
            "wall": statistics.median(walls), "runs": runs,
            "events": statistics.median(s.elapsed_time(e) for s, e in events) * 1e-3}
        del t
        torch.cuda.empty_cache()
    dist.destroy_process_group()
    with open(f"{prefix}.rank{rank}.json", "w", encoding="utf-8") as f:
        json.dump(report, f)


# ---------------------------------------------------------------------------
# Benchmarks


def bench_allreduce(args):
    if args.sizes:
        sizes = [int(float(m) * MiB) for m in args.sizes.split(",")]
    else:
        sizes = TINY_SIZES if args.tiny else QUICK_SIZES if args.quick else SIZES
    for n in args.gpus:
        print(f"all_reduce on {n} GPUs", flush=True)
        if args.device == "cuda" and args.gpus_here < n:
            why = f"{n} GPUs needed, this machine has {args.gpus_here}"
            tess = {s: {"failed": why} for s in sizes}
        else:
            tess = tessera_allreduce(args, n, sizes)
        peer = torch_allreduce(args, n, sizes)
        emit(args, [allreduce_row(n, s, tess[s], peer[s]) for s in sizes])


def allreduce_row(n, size, tess, peer):
    """One table row; busbw from each time, the ratios of Tessera's over torch's."""
    def bw(t):
        return bus_bandwidth(size, t, n)[1] if t and n > 1 else None

    t_gpu = tess["gpu"] / n if tess.get("gpu") is not None else None
    r = {"section": "allreduce", "n": n, "size": size,
         "t_wall": tess.get("wall"), "t_gpu": t_gpu, "p_wall": peer.get("wall"),
         "p_events": peer.get("events"), "version": peer.get("version")}
    r.update(t_bw=bw(r["t_wall"]), t_gpu_bw=bw(t_gpu), p_bw=bw(r["p_wall"]),
             p_ev_bw=bw(r["p_events"]))
    r["ratio"] = r["t_bw"] / r["p_bw"] if r["t_bw"] and r["p_bw"] else None
    r["ratio_gpu"] = r["t_gpu_bw"] / r["p_ev_bw"] if r["t_gpu_bw"] and r["p_ev_bw"] else None
    notes = [f"Tessera: {tess['note']}" if "note" in tess else f"Tessera failed: {tess['failed']}",
             f"torch: {peer['note']}" if "note" in peer else f"torch failed: {peer['failed']}"]
    if n == 1:
        notes.append("one GPU: no bus traffic, no busbw")
    r["note"] = "; ".join(notes)
    print(f"    {n} GPUs {fmt_size(size):>8}: Tessera {G.fmt_time(r['t_wall'])} "
          f"{fmt_bw(r['t_bw'])}, torch {G.fmt_time(r['p_wall'])} {fmt_bw(r['p_bw'])}, "
          f"ratio {fmt_ratio(r['ratio'])}", flush=True)
    return r


def bench_gemm(args):
    m, k, nn = TINY_GEMM if args.tiny else GEMM
    counts = [1] + [n for n in args.gpus if n > 1]
    print(f"sharded GEMM {m}x{k}x{nn} on {', '.join(map(str, counts))} GPUs", flush=True)
    a_path = G.save_input(args, "A", (m, k), 1)
    b_path = G.save_input(args, "B", (k, nn), 2)
    results = {}
    for n in counts:
        c_path = os.path.join(args.work, f"C{n}.npy")
        if args.device == "cuda" and args.gpus_here < n:
            results[n] = ({"failed": f"{n} GPUs needed, this machine has {args.gpus_here}"}, None)
            continue
        print(f"  Tessera, {n} device{'s' if n > 1 else ''}", flush=True)
        try:
            t = tessera_gemm(args, n, a_path, b_path, c_path)
            results[n] = (t, c_path if os.path.exists(c_path) else None)
        except G.Failed as e:
            print(f"    failed: {e}", flush=True)
            results[n] = ({"failed": str(e)}, None)
    flops = 2.0 * m * k * nn
    peer, errors = gemm_peer(args, a_path, b_path, {n: r[1] for n, r in results.items()})
    rows = []
    base = results.get(1, ({}, None))[0]
    for n in counts:
        t, _ = results[n]
        rows.append(gemm_row(n, t, base, flops, errors.get(n)))
    rows.append(peer)
    for p in glob.glob(os.path.join(args.work, "*.npy")):
        os.remove(p)
    emit(args, rows)


def gemm_row(n, t, base, flops, err):
    r = {"section": "gemm", "impl": f"Tessera, {n} GPU{'s' if n > 1 else ''}", "n": n,
         "wall": t.get("wall"), "gpu": t.get("gpu"), "err": err}
    r["gpu_n"] = r["gpu"] / n if r["gpu"] is not None else None
    r["tf_wall"] = flops / r["wall"] if r["wall"] else None
    r["tf_gpu"] = flops / r["gpu_n"] if r["gpu_n"] else None
    r["scale"] = r["eff"] = r["eff_gpu"] = None
    if r["wall"] and base.get("wall"):
        r["scale"], r["eff"] = scaling(base["wall"], r["wall"], n)
    if r["gpu_n"] and base.get("gpu"):
        r["eff_gpu"] = scaling(base["gpu"], r["gpu_n"], n)[1]
    if "failed" in t:
        r["note"] = f"failed: {t['failed']}"
    else:
        k = t["launches"]
        r["note"] = f"{t['runs']} runs" + (
            f", {k} launch{'es' if k != 1 else ''}, host overhead (wall − GPU ÷ N) "
            f"{G.fmt_time(r['wall'] - r['gpu_n'])}" if t["gpu"] is not None
            else "; no GPU time in `:time`")
        if t.get("note_extra"):
            r["note"] += "; " + t["note_extra"]
        host = t.get("host_b")
        if host and "failed" in host:
            r["note"] += f"; with b an ordinary (host) tensor: failed: {host['failed']}"
        elif host:
            r["note"] += (f"; with b an ordinary (host) tensor: wall "
                          f"{G.fmt_time(host['wall'])}" + (
                              f", GPU ÷ N {G.fmt_time(host['gpu'] / n)}"
                              if host["gpu"] is not None else ""))
    print(f"    {r['impl']}: wall {G.fmt_time(r['wall'])}, GPU÷N {G.fmt_time(r['gpu_n'])}, "
          f"{fmt_tflops(r['tf_wall'])} TFLOP/s (wall), efficiency {fmt_ratio(r['eff'])}",
          flush=True)
    return r


def gemm_peer(args, a_path, b_path, saved):
    """torch.matmul's row, and {n: max |Tessera on n GPUs - torch|}; without torch or a
    GPU, the errors are against numpy's f64 product (tiny sizes only)."""
    row = {"section": "gemm", "impl": "torch.matmul, 1 GPU (cuBLAS, bf16 out)", "n": 1,
           "wall": None, "gpu": None, "gpu_n": None, "tf_wall": None, "tf_gpu": None,
           "scale": None, "eff": None, "eff_gpu": None, "err": None}
    errors = {}
    m, k = np.load(a_path, mmap_mode="r").shape
    nn = np.load(b_path, mmap_mode="r").shape[1]
    try:
        G.need_torch()
        t = {"a": G.gpu_tensor(a_path), "b": G.gpu_tensor(b_path)}
        result = torch.matmul(t["a"], t["b"])
        s = G.time_peer(lambda: torch.matmul(t["a"], t["b"]), args.runs)
        row.update(gpu=s, gpu_n=s, tf_gpu=2.0 * m * k * nn / s,
                   note=f"CUDA-event median of {args.runs} runs")
        for n, path in saved.items():
            if path:
                errors[n] = G.max_error(path, result)
        t, result = None, None
        G.free_gpu()
    except Exception as e:  # a missing peer is a row, not an abort
        row["note"] = f"failed: {G.reason(e)}"
        if args.tiny:
            want = np.load(a_path).astype(np.float64) @ np.load(b_path).astype(np.float64)
            for n, path in saved.items():
                if path:
                    errors[n] = float(np.abs(np.load(path) - want).max())
            row["note"] += "; errors are against numpy's f64 product"
    return row, errors


def bench_overlap(args):
    d = TINY_OVERLAP if args.tiny else OVERLAP
    counts = [n for n in args.gpus if n > 1]
    print(f"overlap: all_reduce of {d['R']}x{d['C']} with a {d['M']}x{d['K']}x{d['C']} "
          f"matmul on {', '.join(map(str, counts))} GPUs", flush=True)
    src = os.path.join(args.work, "overlap.tsr")
    with open(src, "w", encoding="utf-8") as f:
        f.write(OVERLAP_SRC)
    rows = []
    for n in counts:
        r = {"section": "overlap", "n": n}
        if args.device == "cuda" and args.gpus_here < n:
            r["failed"] = f"{n} GPUs needed, this machine has {args.gpus_here}"
            rows.append(r)
            continue
        repl = None
        try:
            repl = G.Repl(session_args(args, n), args.cache)
            repl.step(f':load {src}',
                      f"x = broadcast(randn([{d['R']}, {d['C']}], bf16, seed=1))",
                      f"a = broadcast(randn([{d['M']}, {d['K']}], bf16, seed=2))",
                      f"w = broadcast(randn([{d['K']}, {d['C']}], bf16, seed=3))")
            for name, stmt in (("comm", "g = comm(x)"), ("compute", "c = compute(a, w)"),
                               ("serial", "s = serial(x, a, w)"),
                               ("overlapped", "o = overlapped(x, a, w)")):
                repl.step(stmt)  # warm-up: compiles, makes the communicator
                r[name] = time_stmt(repl, stmt)["wall"]
            # Both give the same numbers (the zeros added change nothing).
            _, out = repl.step("print(max(abs(gather(s).to(f32) - gather(o).to(f32))))")
            r["diff"] = " ".join(out).strip()
        except G.Failed as e:
            r["failed"] = str(e)
            print(f"    failed: {e}", flush=True)
        finally:
            if repl is not None:
                repl.close()
        rows.append(r)
    emit(args, rows)


# ---------------------------------------------------------------------------
# Report


def markdown(rows, header):
    out = ["# Tessera multi-GPU benchmark", "", *header, ""]
    ar = [r for r in rows if r["section"] == "allreduce"]
    if ar:
        intro = (
            "busbw = size / time × 2(N−1)/N (nccl-tests). Wall: Tessera's `:time` wall median "
            "per run (host overhead included) and torch's `all_reduce` + "
            "`torch.cuda.synchronize()` timed on the host. GPU: Tessera's `:time` GPU median "
            "(summed over the N GPUs) ÷ N, and torch's CUDA-event median of back-to-back "
            "calls. Tessera ÷ torch is busbw over busbw (goal ≥ 0.9).")
        out += G.table(
            "all_reduce (sum, bf16), bus bandwidth",
            ["GPUs", "size per GPU", "Tessera wall", "Tessera busbw", "torch wall",
             "torch busbw", "Tessera ÷ torch", "Tessera GPU ÷ N", "busbw (GPU)",
             "torch events", "busbw (events)", "Tessera ÷ torch (GPU)", "note"],
            [[str(r["n"]), fmt_size(r["size"]), G.fmt_time(r["t_wall"]), fmt_bw(r["t_bw"]),
              G.fmt_time(r["p_wall"]), fmt_bw(r["p_bw"]), fmt_ratio(r["ratio"]),
              G.fmt_time(r["t_gpu"]), fmt_bw(r["t_gpu_bw"]), G.fmt_time(r["p_events"]),
              fmt_bw(r["p_ev_bw"]), fmt_ratio(r["ratio_gpu"]), r["note"]] for r in ar],
            intro)
        versions = sorted({r["version"] for r in ar if r.get("version")})
        if versions:
            out += [f"Peer: {', '.join(versions)}.", ""]
    gm = [r for r in rows if r["section"] == "gemm"]
    if gm:
        intro = (
            "A (M×K) sharded on rows over N GPUs times B (K×N) replicated on every GPU "
            "(`all_gather(shard(B, axis=0))`, placed once; the note gives the time with B an "
            "ordinary host tensor, which each call places on the GPUs). Wall: `:time`'s "
            "wall median (host overhead included); GPU ÷ N: its GPU median (summed over the "
            "GPUs) ÷ N. TFLOP/s = 2·M·N·K / time; scaling = t1 / tN; efficiency = scaling / N "
            "(goal ≥ 0.9), from the wall and from GPU ÷ N. Error: max |Tessera − torch.matmul| "
            "(torch's bf16 output rounding included).")
        out += G.table(
            "Sharded GEMM (bf16)",
            ["implementation", "wall median", "GPU ÷ N", "TFLOP/s (wall)", "TFLOP/s (GPU ÷ N)",
             "scaling (wall)", "efficiency (wall)", "efficiency (GPU ÷ N)", "max abs error",
             "note"],
            [[r["impl"], G.fmt_time(r["wall"]), G.fmt_time(r["gpu_n"]), fmt_tflops(r["tf_wall"]),
              fmt_tflops(r["tf_gpu"]), fmt_ratio(r["scale"]), fmt_ratio(r["eff"]),
              fmt_ratio(r["eff_gpu"]), G.fmt_err(r["err"]), r["note"]] for r in gm],
            intro)
    ov = [r for r in rows if r["section"] == "overlap"]
    if ov:
        intro = (
            "Inside one function: an all_reduce of x and a matmul that does not need its "
            "result (`overlapped`), against the same ops with the matmul reading the "
            "all_reduce's result (`serial`); `comm` and `compute` time each part alone. "
            "`:time` wall medians. Speed-up = serial ÷ overlapped (1: no overlap); its "
            "ceiling is (comm + compute) ÷ max(comm, compute).")

        def cells(r):
            if "failed" in r:
                return [str(r["n"])] + ["—"] * 6 + [f"failed: {r['failed']}"]
            ceiling = (r["comm"] + r["compute"]) / max(r["comm"], r["compute"])
            return [str(r["n"]), G.fmt_time(r["comm"]), G.fmt_time(r["compute"]),
                    G.fmt_time(r["serial"]), G.fmt_time(r["overlapped"]),
                    fmt_ratio(r["serial"] / r["overlapped"]), fmt_ratio(ceiling),
                    f"largest difference of serial and overlapped: {r.get('diff', '?')}"]
        out += G.table(
            "Overlap of a collective with compute in one function (bf16)",
            ["GPUs", "comm", "compute", "serial", "overlapped", "speed-up", "ceiling", "note"],
            [cells(r) for r in ov], intro)
    failed = [r for r in rows if r["section"] == "failed"]
    for r in failed:
        out += [f"**{r['what']} failed**: {r['note']}", ""]
    return "\n".join(out)


def emit(args, rows):
    """Adds rows to the report and rewrites it, so a run cut short keeps what it measured."""
    args.rows += rows
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(markdown(args.rows, args.header))


def header(args):
    version = G.tessera_version(args.tessera)
    gpus = "no GPU (nvidia-smi found none)"
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                           capture_output=True, encoding="utf-8", timeout=60)
        names = [l.strip() for l in p.stdout.splitlines() if l.strip()]
        if p.returncode == 0 and names:
            gpus = f"{len(names)} × {names[0]}" if len(set(names)) == 1 else "; ".join(names)
    except (OSError, subprocess.TimeoutExpired):
        pass
    tv = torch.__version__ if torch is not None else "not installed"
    m, k, n = TINY_GEMM if args.tiny else GEMM
    lines = [f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, host {platform.node()}",
             f"- GPUs: {gpus}; Tessera device `{args.device}`; GPU counts {args.gpus}",
             f"- {version} ({args.tessera}); torch {tv}; numpy {np.__version__}",
             f"- GEMM shape: M={m}, K={k}, N={n}",
             "- environment: " + ", ".join(f"{k}={os.environ.get(k)}" for k in NO_MULTICAST),
             f"- command: `{' '.join(sys.argv)}`"]
    try:
        p = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, encoding="utf-8",
                           timeout=60)
        if p.returncode == 0 and p.stdout.strip():
            lines += ["", "GPU topology (`nvidia-smi topo -m`):", "", "```",
                      *p.stdout.rstrip().splitlines(), "```"]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return lines


# ---------------------------------------------------------------------------
# Self-test: the arithmetic, parsing and report, without Tessera, torch or a GPU


class SelfTest(unittest.TestCase):
    def test_bus_bandwidth_as_nccl_tests(self):
        # nccl-tests, 8 ranks: 1 GiB in 5 ms is algbw 214.75 GB/s, busbw 375.81 GB/s.
        alg, bus = bus_bandwidth(1 << 30, 5e-3, 8)
        self.assertAlmostEqual(alg / 1e9, 214.748, places=2)
        self.assertAlmostEqual(bus / 1e9, 375.809, places=2)
        self.assertEqual(bus_bandwidth(1000, 1.0, 2), (1000.0, 1000.0))
        self.assertEqual(bus_bandwidth(1000, 1.0, 4)[1], 1500.0)
        self.assertEqual(bus_bandwidth(1000, 1.0, 1)[1], 0.0)

    def test_message_shapes(self):
        for size in SIZES + QUICK_SIZES:
            rows, cols = message_shape(size, COLS)
            self.assertEqual(rows * cols * BF16, size)
        for size in TINY_SIZES:
            rows, cols = message_shape(size, TINY_COLS)
            self.assertEqual(rows * cols * BF16, size)
        with self.assertRaises(ValueError):
            message_shape(1000, COLS)

    def test_scaling(self):
        self.assertEqual(scaling(4.0, 2.0, 2), (2.0, 1.0))
        s, e = scaling(3.2e-3, 0.9e-3, 4)
        self.assertAlmostEqual(s, 3.5556, places=3)
        self.assertAlmostEqual(e, 0.8889, places=3)

    def test_time_lines(self):
        t = G.parse_time("x\nmedian 1.234 ms over 50 runs; on the GPU: median 456.0 µs in 2 launches\n")
        self.assertAlmostEqual(t["wall"], 1.234e-3)
        self.assertAlmostEqual(t["gpu"], 456e-6)
        self.assertEqual((t["runs"], t["launches"]), (50, 2))
        t = G.parse_time("median 950 ns over 3 runs; on the GPU: median 1.500 s in 1 launch")
        self.assertAlmostEqual(t["wall"], 950e-9)
        self.assertEqual((t["gpu"], t["launches"]), (1.5, 1))
        t = G.parse_time("median 2.000 s over 3 runs")
        self.assertEqual((t["wall"], t["gpu"], t["launches"]), (2.0, None, 0))
        self.assertIsNone(G.parse_time("error[E0001]: nothing timed"))

    def test_gpu_counts(self):
        self.assertEqual(parse_gpus("4,2,2"), [2, 4])
        with self.assertRaises(ValueError):
            parse_gpus("0")
        self.assertEqual(default_gpus(8), [2, 4])
        self.assertEqual(default_gpus(4), [2, 4])
        self.assertEqual(default_gpus(3), [2, 3])
        self.assertEqual(default_gpus(2), [2])
        self.assertEqual(default_gpus(1), [1])
        self.assertEqual(default_gpus(0), [])

    def test_sum_check(self):
        rng = np.random.default_rng(0)
        x = G.bf16_values((6, 8), 3)  # 3 shards of 2 rows
        want = sum(np.array_split(x.astype(np.float64), 3))
        y = np.concatenate([want] * 3).astype(np.float32)
        self.assertEqual(bf16_sum_check(x, y, 3), (0.0, True))
        y[4, 5] += 1.0
        err, ok = bf16_sum_check(x, y, 3)
        self.assertFalse(ok)
        self.assertGreaterEqual(err, 0.99)
        # Uneven rows: shards as numpy.array_split makes them cannot be equal.
        self.assertFalse(bf16_sum_check(rng.standard_normal((5, 2)),
                                        rng.standard_normal((5, 2)), 2)[1])

    def test_rows_and_report(self):
        ok = allreduce_row(4, 1 << 30, {"wall": 4e-3, "gpu": 4 * 3.5e-3, "runs": 50,
                                        "launches": 2, "note": "50 runs"},
                           {"wall": 3.6e-3, "events": 3.5e-3, "note": "50 runs",
                            "version": "torch x, NCCL y"})
        # 2^30 B in 4 ms over 4 GPUs: algbw 268.4 GB/s, busbw 1.5 times that.
        self.assertAlmostEqual(ok["t_bw"], (1 << 30) / 4e-3 * 1.5)
        self.assertAlmostEqual(ok["t_gpu"], 3.5e-3)
        self.assertAlmostEqual(ok["ratio"], 0.9)
        self.assertAlmostEqual(ok["ratio_gpu"], 1.0)
        bad = allreduce_row(4, 1 << 20, {"failed": "error[E0001]: no shard"},
                            {"failed": "torch is not installed"})
        self.assertIsNone(bad["ratio"])
        one = allreduce_row(1, 1 << 20, {"wall": 1e-4, "gpu": None, "runs": 3, "launches": 0,
                                         "note": "3 runs"}, {"failed": "x"})
        self.assertIsNone(one["t_bw"])
        base = {"wall": 4e-3, "gpu": 3.8e-3, "runs": 20, "launches": 1}
        g1 = gemm_row(1, base, base, 2.0 * 8, None)
        g2 = gemm_row(2, {"wall": 2.2e-3, "gpu": 2 * 1.9e-3, "runs": 20, "launches": 2},
                      base, 2.0 * 8, 0.5)
        g4 = gemm_row(4, {"failed": "no GPUs"}, base, 2.0 * 8, None)
        self.assertAlmostEqual(g1["eff"], 1.0)
        self.assertAlmostEqual(g2["eff"], 4e-3 / 2.2e-3 / 2)
        self.assertAlmostEqual(g2["eff_gpu"], 1.0)
        self.assertIsNone(g4["eff"])
        text = markdown([ok, bad, one, g1, g2, g4,
                         {"section": "failed", "what": "gemm", "note": "boom"}], ["- header"])
        for want in ("| 4 | 1 GiB | 4.000 ms | 402.7 GB/s | 3.600 ms | 447.4 GB/s | 0.9 | 3.500 ms "
                     "| 460.2 GB/s | 3.500 ms | 460.2 GB/s | 1 |",
                     "Tessera failed: error[E0001]: no shard; torch failed: torch is not installed",
                     "one GPU: no bus traffic", "| Tessera, 4 GPUs | — |", "failed: no GPUs",
                     "Peer: torch x, NCCL y.", "**gemm failed**: boom"):
            self.assertIn(want, text)
        for line in text.splitlines():
            if line.startswith("| 4 | 1 GiB"):
                self.assertEqual(line.count("|"), 14)  # 13 columns

    def test_merge_ranks(self):
        def rank(r, walls, ok=True):
            return {"rank": r, "version": "torch 9, NCCL 2.28.9", "check_error": 0.01 * r,
                    "check_ok": ok,
                    "sizes": {str(s): {"wall": w, "events": w / 2, "runs": 20}
                              for s, w in walls.items()}}
        merged = merge_ranks([rank(0, {4096: 1.0, 8192: 3.0}), rank(1, {4096: 2.0, 8192: 1.0})],
                             [4096, 8192])
        self.assertEqual((merged[4096]["wall"], merged[4096]["events"]), (2.0, 1.0))
        self.assertEqual(merged[8192]["wall"], 3.0)
        self.assertIn("sums right (max error 0.01)", merged[4096]["note"])
        self.assertNotIn("sums", merged[8192]["note"])  # checked at the first size only
        bad = merge_ranks([rank(0, {4096: 1.0}), rank(1, {4096: 1.0}, ok=False)], [4096])
        self.assertIn("WRONG SUMS", bad[4096]["note"])

    def test_sizes(self):
        self.assertEqual([fmt_size(s) for s in SIZES],
                         ["1 MiB", "4 MiB", "16 MiB", "64 MiB", "256 MiB", "1 GiB"])
        self.assertEqual(fmt_size(4096), "4 KiB")


# ---------------------------------------------------------------------------


SECTIONS = ["allreduce", "gemm", "overlap"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tessera", default="target/release/tessera", help="the tessera binary")
    ap.add_argument("--gpus", default=None,
                    help="GPU counts, e.g. 2,4 (default: 2 and 4 where the machine has them, "
                         "else what it has; --tiny: 2)")
    ap.add_argument("--out", default="bench/results-multi.md", help="markdown table to write")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma list of " + ",".join(SECTIONS))
    ap.add_argument("--quick", action="store_true", help="all_reduce at 1 MiB, 64 MiB and 1 GiB")
    ap.add_argument("--sizes", help="all_reduce message sizes in MiB per GPU, e.g. 1,16,256 (instead of the default list)")
    ap.add_argument("--runs", type=int, default=50, help="timed runs per peer (>= 20)")
    ap.add_argument("--timeout", type=int, default=900,
                    help="seconds per Tessera session and per torch.distributed run")
    ap.add_argument("--tmp", default=None, help="folder for inputs and results")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="Tessera's device (cpu only to check this script)")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes, to check this script")
    ap.add_argument("--self-test", action="store_true",
                    help="check the arithmetic, parsing and report, then exit")
    ap.add_argument("--torch-peer", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--peer-sizes", default="", help=argparse.SUPPRESS)
    ap.add_argument("--peer-out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.stdout.reconfigure(encoding="utf-8", errors="replace")
    for k, v in NO_MULTICAST.items():
        os.environ[k] = v
    if args.self_test:
        prog = unittest.main(argv=[sys.argv[0], "-v"], exit=False,
                             defaultTest="SelfTest", module=sys.modules[__name__])
        sys.exit(0 if prog.result.wasSuccessful() else 1)
    args.runs = max(args.runs, 20)
    if args.torch_peer is not None:
        torch_peer_main(args.torch_peer, [int(s) for s in args.peer_sizes.split(",")],
                        args.runs, args.peer_out)
        return
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown part {', '.join(unknown)} (choose from {', '.join(SECTIONS)})")
    args.gpus_here = gpu_count()
    try:
        args.gpus = (parse_gpus(args.gpus) if args.gpus
                     else [2] if args.device == "cpu" else default_gpus(args.gpus_here))
    except ValueError as e:
        ap.error(str(e))
    args.tessera = os.path.abspath(args.tessera)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.work = tempfile.mkdtemp(prefix="tessera-multi-", dir=args.tmp)
    args.cache = os.path.join(args.work, "cache")
    args.rows, args.header = [], header(args)
    emit(args, [])
    if not args.gpus:
        emit(args, [{"section": "failed", "what": "everything",
                     "note": "no GPU on this machine (use --device cpu --tiny to check the script)"}])
    benches = {"allreduce": bench_allreduce, "gemm": bench_gemm, "overlap": bench_overlap}
    try:
        for section in SECTIONS:
            if section in only and args.gpus:
                started = time.perf_counter()
                try:
                    benches[section](args)
                except Exception as e:  # keep the other part and the table
                    print(f"{section}: {G.reason(e)}", flush=True)
                    emit(args, [{"section": "failed", "what": section, "note": G.reason(e)}])
                print(f"[{section}: {time.perf_counter() - started:.0f} s]", flush=True)
    finally:
        shutil.rmtree(args.work, ignore_errors=True)
    emit(args, [])
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
