#!/usr/bin/env bash
# Builds, tests and packages the VS Code extension in editors/vscode:
#   npm ci        exact versions from package-lock.json; npm's download cache is kept
#                 in .cache/npm (TESSERA_NPM_CACHE overrides) so later runs and CI
#                 reuse it; skipped when node_modules already matches the lockfile
#   npm run build TypeScript -> out/
#   npm test      grammar tests (vscode-tmgrammar-test, test/grammar/*.tsr) and unit
#                 tests (node --test: server lookup, emit views, manifest, language
#                 configuration, grammar against the compiler's keyword/dtype/builtin
#                 tables, and the extension's messages against a real `tessera lsp`)
#   vsce package  into .cache/vscode-vsix/ (ignored), then checks the .vsix is there
#
# The client tests run against the `tessera` binary named by TESSERA_BIN; without it the
# script builds one with `cargo build -p tessera-repl --bin tessera` (debug profile).
# TESSERA_BIN=none skips those tests (they are then reported as skipped).
#
# Needs Node.js 20 or newer with npm, and the npm registry on the first run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
ext="$root/editors/vscode"

fail() {
    echo "vscode-check: error: $*" >&2
    exit 1
}

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "vscode-check: error: node and npm are needed to build and test the VS Code extension" >&2
    echo "vscode-check:        (editors/vscode); install Node.js 20 or newer with npm" >&2
    echo "vscode-check:        (Debian/Ubuntu: apt-get install nodejs npm) and run this again." >&2
    exit 2
fi
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
    fail "Node.js $(node --version) is too old: the extension's tools need Node.js 20 or newer"
fi

if [ -z "${TESSERA_BIN:-}" ]; then
    command -v cargo >/dev/null 2>&1 ||
        fail "cargo is needed to build the tessera binary for the client tests (or set TESSERA_BIN=/path/to/tessera, or TESSERA_BIN=none)"
    echo "vscode-check: building tessera (cargo build -p tessera-repl --bin tessera)"
    TESSERA_BIN="$(cd "$root" && cargo build --quiet -p tessera-repl --bin tessera --message-format=json-render-diagnostics |
        node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{for(const l of s.split("\n")){try{const m=JSON.parse(l);if(m.reason==="compiler-artifact"&&m.executable&&m.target.name==="tessera")console.log(m.executable)}catch{}}})')" ||
        fail "cargo build -p tessera-repl --bin tessera failed"
    [ -x "$TESSERA_BIN" ] || fail "cargo build did not report the tessera executable"
fi
if [ "$TESSERA_BIN" = none ]; then
    unset TESSERA_BIN
    echo "vscode-check: TESSERA_BIN=none: the client tests against tessera lsp are skipped"
else
    # The client tests start the server from a temporary workspace: a relative path
    # given by the caller would not resolve there.
    case "$TESSERA_BIN" in
    /*) ;;
    *) TESSERA_BIN="$PWD/$TESSERA_BIN" ;;
    esac
    [ -x "$TESSERA_BIN" ] || fail "TESSERA_BIN=$TESSERA_BIN is not an executable tessera binary"
    export TESSERA_BIN
    echo "vscode-check: client tests run against $TESSERA_BIN lsp"
fi

export npm_config_cache="${TESSERA_NPM_CACHE:-$root/.cache/npm}"
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
cd "$ext"

echo "vscode-check: node $(node --version), npm $(npm --version), cache $npm_config_cache"

# npm ci starts from an empty node_modules every time; skip it when node_modules was
# installed by this script from the same lockfile with the same node (stamp below).
stamp="node_modules/.tessera-vscode-check"
want="$(node -p 'process.version') $(sha256sum package-lock.json | cut -d" " -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "vscode-check: node_modules is up to date with package-lock.json, skipping npm ci"
else
    # No install scripts: no dependency needs one (the only one, @vscode/vsce-sign's,
    # sets up package signing, which `vsce package` does not use).
    npm ci --prefer-offline --ignore-scripts --no-progress ||
        fail "npm ci failed in editors/vscode (is the npm registry reachable, or the cache in $npm_config_cache complete?)"
    echo "$want" >"$stamp"
fi

npm run build || fail "npm run build (tsc) failed in editors/vscode"

npm test || fail "npm test failed in editors/vscode (grammar or unit tests, see above)"

out="$root/.cache/vscode-vsix"
version="$(node -p 'require("./package.json").version')"
vsix="$out/tessera-$version.vsix"
mkdir -p "$out"
rm -f "$vsix"
# No repository URL is published for Tessera yet, hence --allow-missing-repository.
npx --no-install @vscode/vsce package --allow-missing-repository --out "$vsix" ||
    fail "vsce package failed in editors/vscode"
[ -s "$vsix" ] || fail "vsce package reported success but $vsix is missing or empty"
echo "vscode-check: packaged $vsix ($(wc -c <"$vsix") bytes)"
