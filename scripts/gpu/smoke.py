"""Smoke test: launch every entry of every PTX file given (grid 3x2x2, every
run-time dim 64, scalars 1, 64 MiB zeroed/random buffers) and report CUDA errors
(illegal address, misaligned access, illegal instruction...)."""
import ctypes, re, sys, random
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what=""):
    if r != 0:
        s = ctypes.c_char_p(); cu.cuGetErrorString(r, ctypes.byref(s))
        raise RuntimeError(f"{what}: CUDA error {r} {s.value}")
ck(cu.cuInit(0)); dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), 0))
ok = fail = 0
SIZE = 64 << 20
for path in sys.argv[1:]:
    ctx = ctypes.c_void_p(); ck(cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
    try:
        text = open(path).read()
        mod = ctypes.c_void_p()
        ck(cu.cuModuleLoadData(ctypes.byref(mod), text.encode() + b"\0"), "load")
        dyn = {m.group(1): int(m.group(2)) for m in re.finditer(r"// (\w+): (\d+) bytes of dynamic shared memory", text)}
        for m in re.finditer(r"\.visible \.entry (\w+)\((.*?)\)\n\.maxntid (\d+)", text, re.S):
            name, params, threads = m.group(1), m.group(2), int(m.group(3))
            f = ctypes.c_void_p(); ck(cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()))
            holders, bufs = [], []
            for ty in re.findall(r"\.param (\.\w+)", params):
                if ty == ".u64":
                    p = ctypes.c_uint64(); ck(cu.cuMemAlloc_v2(ctypes.byref(p), SIZE))
                    ck(cu.cuMemsetD8_v2(p, 0x3c, SIZE)); bufs.append(p); holders.append(ctypes.c_uint64(p.value))
                elif ty == ".f32": holders.append(ctypes.c_float(1.0))
                elif ty == ".f64": holders.append(ctypes.c_double(1.0))
                elif ty == ".s64": holders.append(ctypes.c_int64(64))
                elif ty == ".b16": holders.append(ctypes.c_uint16(0x3c00))
                else: holders.append(ctypes.c_int32(64))
            arr = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
            sm = dyn.get(name, 0)
            if sm: ck(cu.cuFuncSetAttribute(f, 8, sm), "attr")
            ck(cu.cuLaunchKernel(f, 3, 2, 2, threads, 1, 1, sm, None, arr, None), "launch " + name)
            ck(cu.cuCtxSynchronize(), "run " + name)
            for p in bufs: cu.cuMemFree_v2(p)
            ok += 1
    except RuntimeError as e:
        fail += 1
        print(f"FAIL {path}: {e}")
    cu.cuCtxDestroy_v2(ctx)
print(f"{ok} kernels ran, {fail} files failed")
