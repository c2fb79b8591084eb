"""Checks the f8_roundtrip test kernel (TESSERA_PTX_DIR modules) against exhaustive reference
tables of e4m3 and e5m2. Needs gpu_check.py next to it as run.py. Usage: f8.py FILE.ptx"""
import ctypes, math, random, struct, sys
exec(open("run.py").read().split("random.seed(0)")[0])
FMT["u8"] = "B"

def dec(c, e, m, bias, fn):
    s = -1.0 if c & 0x80 else 1.0
    c &= 0x7f
    E, M = c >> m, c & ((1 << m) - 1)
    if fn and c == 0x7f: return math.nan
    if not fn and E == (1 << e) - 1: return s * math.inf if M == 0 else math.nan
    if E == 0: return s * M * 2.0 ** (1 - bias - m)
    return s * (1 + M / 2 ** m) * 2.0 ** (E - bias)

def enc(x, e, m, bias, fn):
    if math.isnan(x): return 0x7f
    sign = 0x80 if (x < 0 or (x == 0 and math.copysign(1, x) < 0)) else 0
    a = abs(x)
    best = None
    for c in range(0x80):
        v = dec(c, e, m, bias, fn)
        if math.isnan(v) or math.isinf(v): continue
        d = abs(v - a)
        if best is None or d < best[0] or (d == best[0] and c % 2 == 0): best = (d, c)
    c = best[1]
    maxv = dec(0x7e if fn else 0x7b, e, m, bias, fn)
    if not fn:
        # overflow to inf beyond the rounding midpoint between max and 2^16
        if a >= (maxv + 65536.0) / 2: c = 0x7c
    return c | sign

f32 = lambda v: struct.unpack("<f", struct.pack("<f", v))[0]
random.seed(3)
xs = [0.0, -0.0, 1.0, -1.0, 448.0, 449.0, 480.0, 1e6, -1e6, math.inf, -math.inf, 57344.0, 61439.0, 61440.0, 70000.0,
      2.0 ** -6, 2.0 ** -7, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -14, 2.0 ** -16, 2.0 ** -17, 1.0625, 1.125, 1.1875, 0.3]
while len(xs) < 1024:
    xs.append(f32(random.choice([-1, 1]) * random.uniform(0, 1) * 2.0 ** random.randint(-20, 17)))
xs = [f32(v) for v in xs]
N = len(xs)
bx = Buf(xs, "f32")
q4, q5 = Buf([0] * N, "u8"), Buf([0] * N, "u8")
d4, d5 = Buf([0.0] * N, "f32"), Buf([0.0] * N, "f32")
launch("f8_roundtrip", ((N + 127) // 128,), 128, [bx, q4, q5, d4, d5, N])
ok = True
for name, buf, dbuf, fmt in [("e4m3", q4, d4, (4, 3, 7, True)), ("e5m2", q5, d5, (5, 2, 15, False))]:
    got = buf.get()
    ref = [enc(x, *fmt) for x in xs]
    bad = [(x, hex(g), hex(r)) for x, g, r in zip(xs, got, ref) if g != r]
    print(f"encode {name}: {'ok' if not bad else f'FAIL {len(bad)}: {bad[:6]}'}")
    ok &= not bad
    dgot = dbuf.get()
    dref = [dec(c, *fmt) for c in got]
    bad = [(hex(c), g, r) for c, g, r in zip(got, dgot, dref) if not (g == r or (math.isnan(g) and math.isnan(r)))]
    print(f"decode {name}: {'ok' if not bad else f'FAIL {len(bad)}: {bad[:6]}'}")
    ok &= not bad
print("ALL OK" if ok else "SOME FAILED")
