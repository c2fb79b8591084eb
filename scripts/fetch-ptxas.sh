#!/usr/bin/env bash
# Installs NVIDIA's PTX assembler `ptxas` from the PyPI wheel nvidia-cuda-nvcc-cu12
# into a cache directory (no CUDA install needed) and prints the path of the binary.
# Quick and silent when the cache already holds a working ptxas.
#
#   scripts/fetch-ptxas.sh            # -> <repo>/.cache/ptxas/<version>/ptxas
#   TESSERA_PTXAS_CACHE=DIR  scripts/fetch-ptxas.sh
#   TESSERA_PTXAS_VERSION=X  scripts/fetch-ptxas.sh   (default: the pinned version below)
#
# Needs python3 with pip, and access to PyPI on the first run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version="${TESSERA_PTXAS_VERSION:-12.9.86}"
cache="${TESSERA_PTXAS_CACHE:-$root/.cache/ptxas}/$version"
bin="$cache/ptxas"

if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
    echo "$bin"
    exit 0
fi

python="$(command -v python3 || command -v python || true)"
if [ -z "$python" ]; then
    echo "fetch-ptxas: python3 (with pip) is needed to download nvidia-cuda-nvcc-cu12" >&2
    exit 1
fi

mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.download.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "fetch-ptxas: downloading nvidia-cuda-nvcc-cu12==$version from PyPI" >&2
"$python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --dest "$tmp" "nvidia-cuda-nvcc-cu12==$version" >&2

wheel="$(find "$tmp" -maxdepth 1 -name 'nvidia_cuda_nvcc_cu12-*.whl' | head -n 1)"
if [ -z "$wheel" ]; then
    echo "fetch-ptxas: pip did not produce a nvidia_cuda_nvcc_cu12 wheel" >&2
    exit 1
fi

# Only the one member: the wheel also holds nvcc, cicc and headers we do not need.
"$python" - "$wheel" "$tmp/ptxas" <<'PY'
import shutil, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    with z.open("nvidia/cuda_nvcc/bin/ptxas") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
chmod +x "$tmp/ptxas"
"$tmp/ptxas" --version >/dev/null
# Atomic, so that concurrent runs never see a half-written binary.
mv -f "$tmp/ptxas" "$bin"
echo "$bin"
