#!/usr/bin/env bash
# GPU check that each operation means on the GPU what it means on the CPU
# (docs/language.md, Semantics decisions): f64 and f32 `dot` (ieee and tf32) against
# f64 references, float-to-integer casts against the rule and the CPU executor.
# Not part of CI (no GPU there). Two steps, so the GPU machine needs neither cargo nor
# the tessera binary:
#   scripts/gpu/check-semantics.sh prepare OUT_DIR [TSRC] [TESSERA]   (needs numpy; no GPU)
#       emits the PTX for sm_70/80/90, writes the inputs and runs the same kernels on
#       the CPU executor (`tessera run`), keeping its outputs as .npy in OUT_DIR
#   scripts/gpu/check-semantics.sh check OUT_DIR                       (needs a GPU)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
step="$1"
out="$(mkdir -p "$2" && cd "$2" && pwd)"
archs="${ARCHS:-sm_70 sm_80 sm_90}"
if [ "$step" = prepare ]; then
    tsrc="${3:-$root/target/release/tsrc}"
    tessera="${4:-$root/target/release/tessera}"
    for arch in $archs; do
        "$tsrc" emit "$root/scripts/gpu/semantics.tsr" --emit ptx --arch "$arch" -o "$out/semantics_$arch.ptx"
    done
    python3 - "$out" <<'PY'
import sys
import numpy as np
out = sys.argv[1]
rng = np.random.default_rng(11)
# Ragged shapes: no dim a multiple of the tile, K not a multiple of 16.
for name, dt, (m, k, n) in [("gemm_f64", np.float64, (100, 50, 70)),
                            ("gemm_f32", np.float32, (130, 300, 90)),
                            ("gemm_tf32", np.float32, (130, 300, 90))]:
    np.save(f"{out}/{name}_a.npy", rng.uniform(-1, 1, (m, k)).astype(dt))
    np.save(f"{out}/{name}_b.npy", rng.uniform(-1, 1, (k, n)).astype(dt))
edges = [np.nan, -np.nan, np.inf, -np.inf, 1e10, -1e10, 3e9, -3e9, 2147483520.0, -2147483648.0,
         127.9, -128.9, 128.0, -129.0, 255.5, 256.0, -0.5, 0.5, -1.5, 1.5, 0.0, -0.0, 300.7, -300.7]
x = np.concatenate([np.array(edges), rng.uniform(-400, 400, 300 - len(edges))]).astype(np.float32)
np.save(f"{out}/to_ints_x.npy", x)
PY
    # The CPU executor runs the same kernels on the same inputs.
    {
        cat "$root/scripts/gpu/semantics.tsr"
        for g in gemm_f64 gemm_f32 gemm_tf32; do
            dt=f32; [ "$g" = gemm_f64 ] && dt=f64
            cat <<TSR
${g}_a = load_npy("${g}_a.npy")
${g}_b = load_npy("${g}_b.npy")
m_${g}, k_${g} = ${g}_a.shape
n_${g} = ${g}_b.shape[1]
${g}_c = zeros([m_${g}, n_${g}], $dt)
${g}(${g}_a, ${g}_b, ${g}_c)
save_npy(${g}_c, "${g}_c.npy")
TSR
        done
        cat <<'TSR'
x = load_npy("to_ints_x.npy")
n = x.shape[0]
o8 = zeros([n], i8)
ou = zeros([n], u8)
o32 = zeros([n], i32)
to_ints(x, o8, ou, o32)
save_npy(o8, "to_ints_i8.npy")
save_npy(ou, "to_ints_u8.npy")
save_npy(o32, "to_ints_i32.npy")
TSR
    } > "$out/cpu.tsr"
    (cd "$out" && "$tessera" run cpu.tsr)
    echo "prepared $out"
elif [ "$step" = check ]; then
    status=0
    for arch in $archs; do
        echo "== $arch"
        python3 "$root/scripts/gpu/check_semantics.py" "$out/semantics_$arch.ptx" "$out" || status=1
    done
    exit $status
else
    echo "usage: $0 prepare|check OUT_DIR [TSRC] [TESSERA]" >&2
    exit 2
fi
