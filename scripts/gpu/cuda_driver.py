"""CUDA driver helpers for the GPU check scripts (ctypes, no other dependency):
loads the PTX module named by sys.argv[1] on import, then offers Buf, fn, launch,
close and bf16 conversions."""
import ctypes, math, random, struct, sys

cu = ctypes.CDLL("libcuda.so.1")


def ck(r, what=""):
    if r != 0:
        s = ctypes.c_char_p()
        cu.cuGetErrorString(r, ctypes.byref(s))
        raise RuntimeError(f"{what}: CUDA error {r} {s.value}")


ck(cu.cuInit(0))
dev = ctypes.c_int()
ck(cu.cuDeviceGet(ctypes.byref(dev), 0))
ctx = ctypes.c_void_p()
ck(cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev))
ptx = open(sys.argv[1], "rb").read() + b"\0"
mod = ctypes.c_void_p()
log = ctypes.create_string_buffer(8192)
opts = (ctypes.c_int * 2)(5, 6)  # CU_JIT_ERROR_LOG_BUFFER, _SIZE_BYTES
vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(8192))
r = cu.cuModuleLoadDataEx(ctypes.byref(mod), ptx, 2, opts, vals)
if r:
    print(log.value.decode())
ck(r, "load")


def fn(name):
    f = ctypes.c_void_p()
    ck(cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), name)
    return f


FMT = {"f32": "f", "f16": "e", "i32": "i", "bf16": "H"}


def bf16_bits(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def bf16_val(bits):
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


class Buf:
    def __init__(self, data, dt):
        self.dt, self.n = dt, len(data)
        raw = struct.pack(f"<{len(data)}{FMT[dt]}", *data)
        self.size = len(raw)
        self.ptr = ctypes.c_uint64()
        ck(cu.cuMemAlloc_v2(ctypes.byref(self.ptr), max(self.size, 4)))
        ck(cu.cuMemcpyHtoD_v2(self.ptr, raw, self.size))

    def get(self):
        out = ctypes.create_string_buffer(self.size)
        ck(cu.cuMemcpyDtoH_v2(out, self.ptr, self.size))
        return list(struct.unpack(f"<{self.n}{FMT[self.dt]}", out.raw))


def launch(name, grid, threads, args):
    f = fn(name)
    holders = []
    for a in args:
        if isinstance(a, Buf):
            holders.append(ctypes.c_uint64(a.ptr.value))
        elif isinstance(a, float):
            holders.append(ctypes.c_float(a))
        else:
            holders.append(ctypes.c_int32(a))
    arr = (ctypes.c_void_p * len(holders))(*[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
    g = list(grid) + [1] * (3 - len(grid))
    ck(cu.cuLaunchKernel(f, g[0], g[1], g[2], threads, 1, 1, 0, None, arr, None), "launch " + name)
    ck(cu.cuCtxSynchronize(), "sync " + name)


def close(a, b, tol, what):
    bad = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if not (abs(x - y) <= tol * (1 + abs(y)))]
    status = "ok" if not bad else f"FAIL {len(bad)}/{len(a)} e.g. {bad[:3]}"
    print(f"{what}: {status}")
    return not bad
