#!/usr/bin/env bash
# GPU check of the brief's kernels (needs an NVIDIA driver; not part of CI, which has
# no GPU): builds one PTX module of examples/flash_attn.tsr, gemm.tsr and
# softmax_rows.tsr per arch (sm_70, sm_80, sm_90 by default), head dim and causal
# flag, runs each on the GPU through the driver API and compares with f64
# references (scripts/gpu/check_brief.py), then launches every kernel of every
# module once (scripts/gpu/smoke.py).
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
python3 "$root/scripts/gpu/smoke.py" "$out"/brief_*.ptx || status=1
exit $status
