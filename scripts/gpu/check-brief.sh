#!/usr/bin/env bash
# GPU check of the brief's kernels (needs an NVIDIA driver; not part of CI, which has
# no GPU): builds one PTX module of examples/flash_attn.tsr, gemm.tsr and
# softmax_rows.tsr per arch (sm_70, sm_80, sm_90 by default), head dim and causal
# flag, runs each on the GPU through the driver API and compares with f64
# references (scripts/gpu/check_brief.py); builds gemm.tsr under `-D K%8 -D N%8`
# per arch and checks it (scripts/gpu/check_gemm_div.py: numerics, and a trap for a
# K that breaks the assumption); then launches every kernel of every module once
# (scripts/gpu/smoke.py). Gathers, scatters, tile slices and powers: check_features.py.
#   [ARCHS="sm_70 sm_80 sm_90"] scripts/gpu/check-brief.sh [TSRC] [OUT_DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tsrc="${1:-$root/target/release/tsrc}"
out="${2:-$(mktemp -d)}"
cat "$root"/examples/{flash_attn,gemm,softmax_rows}.tsr > "$out/brief.tsr"
status=0
for arch in ${ARCHS:-sm_70 sm_80 sm_90}; do
    for d in 64 128; do
        for causal in 0 1; do
            ptx="$out/brief_${arch}_D${d}_c${causal}.ptx"
            "$tsrc" emit "$out/brief.tsr" --emit ptx --arch "$arch" -D D="$d" -D causal="$causal" -o "$ptx"
            # The brief's non-causal kernel does not mask keys past S (padding reads
            # 0, not -inf), so its non-causal check uses S a multiple of BN.
            s=$([ "$causal" = 1 ] && echo 100 || echo 128)
            echo "== $arch D=$d causal=$causal S=$s"
            S=$s python3 "$root/scripts/gpu/check_brief.py" "$ptx" "$d" "$causal" || status=1
        done
    done
done
# The gemm with run-time M, N, K under divisibility assumptions (-D K%8 -D N%8):
# cp.async-pipelined, checked against a reference, and trapping on K = 70.
for arch in ${ARCHS:-sm_70 sm_80 sm_90}; do
    ptx="$out/gemm_div8_${arch}.ptx"
    "$tsrc" emit "$root/examples/gemm.tsr" --emit ptx --arch "$arch" -D K%8 -D N%8 -o "$ptx"
    echo "== $arch gemm -D K%8 -D N%8"
    python3 "$root/scripts/gpu/check_gemm_div.py" "$ptx" || status=1
done
# Gathers, scatters, tile slices, powers and less common dtypes:
# tests/ui/valid/gather.tsr and powers.tsr, tests/ui/emit/kernel_dtypes.tsr and the
# kernels of tests/ui/emit/tile_slices.tsr that need no -D, in one module per arch.
python3 - "$root" "$out/gather.tsr" <<'PY'
import re, sys
root, dst = sys.argv[1], sys.argv[2]
slices = open(f"{root}/tests/ui/emit/tile_slices.tsr").read()
keep = [b for b in re.split(r"\n(?=@kernel)", slices) if re.search(r"def (halves|corner|first_rows)\(", b)]
valid = [open(f"{root}/tests/ui/{n}.tsr").read() for n in ("valid/gather", "valid/powers", "emit/kernel_dtypes")]
open(dst, "w").write("\n".join(valid) + "\n" + "\n".join(keep) + "\n")
PY
for arch in ${ARCHS:-sm_70 sm_80 sm_90}; do
    ptx="$out/gather_${arch}.ptx"
    "$tsrc" emit "$out/gather.tsr" --emit ptx --arch "$arch" -o "$ptx"
    echo "== $arch gathers, scatters, tile slices, powers"
    python3 "$root/scripts/gpu/check_features.py" "$ptx" || status=1
done
python3 "$root/scripts/gpu/smoke.py" "$out"/brief_*.ptx "$out"/gemm_div8_*.ptx "$out"/gather_*.ptx || status=1
exit $status
