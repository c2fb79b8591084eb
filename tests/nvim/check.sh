#!/usr/bin/env bash
# Checks `tessera lsp` with a client nobody here wrote: Neovim's built-in LSP
# client, headless. Opens tests/nvim/error.tsr (one known E0402) and requires
# exactly that diagnostic, at the right place.
#
#   tests/nvim/check.sh [path/to/tessera]     (default: $TESSERA, else target/debug/tessera)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tessera=${1:-${TESSERA:-${CARGO_TARGET_DIR:-$root/target}/debug/tessera}}
tessera=$(cd "$(dirname "$tessera")" && pwd)/$(basename "$tessera")
if ! command -v nvim >/dev/null; then
  echo "tests/nvim/check.sh: nvim not found (apt-get install neovim)" >&2
  exit 1
fi
[ -x "$tessera" ] || { echo "tests/nvim/check.sh: no tessera binary at $tessera" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here/error.tsr" "$work/"
cd "$work"
TESSERA="$tessera" NVIM_LSP_OUT="$work/out.txt" XDG_CACHE_HOME="$work/cache" \
  timeout 60 nvim --headless -n -i NONE -u "$here/init.lua" error.tsr >/dev/null 2>&1 || true
[ -f out.txt ] || { echo "tests/nvim/check.sh: Neovim wrote no result" >&2; exit 1; }
echo "diagnostics Neovim received:"
sed 's/^/  /' out.txt
expected='8:31 E0402 error shapes [1024] and [2048] do not broadcast in `+`'
if [ "$(cat out.txt)" = "$expected" ]; then
  echo "nvim lsp check: 1 passed, 0 failed"
else
  echo "expected exactly: $expected" >&2
  echo "nvim lsp check: 0 passed, 1 failed"
  exit 1
fi
