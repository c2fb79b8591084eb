#!/usr/bin/env bash
# GPU check of the CUDA executor (needs an NVIDIA driver and GPU; CI has none):
# runs every tests/run/*.tsr with `tessera run --device cuda` and compares its
# stdout, stderr and exit status with the CPU's expected files (as
# repl/tests/run_files.rs does on the CPU): the same text, numbers within
# tolerance (scripts/gpu/same_output.py). DEVICE=cpu checks the script itself. With SANITIZE=1, every file also runs under
# compute-sanitizer (memcheck).
#   scripts/gpu/run-files.sh [TESSERA]
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
tessera="$(realpath "${1:-$root/target/release/tessera}")"
work="$(mktemp -d)"
status=0; passed=0; failed=0
for f in "$root"/tests/run/*.tsr; do
    stem="$(basename "$f" .tsr)"
    mkdir -p "$work/$stem" && cp "$f" "$work/$stem/"
    (cd "$work/$stem" && NO_COLOR=1 "$tessera" run "$stem.tsr" --device "${DEVICE:-cuda}" > out 2> err; echo $? > code)
    code=$(cat "$work/$stem/code")
    want_code=0; [ -f "$root/tests/run/$stem.stderr" ] && want_code=1
    ok=1
    python3 "$root/scripts/gpu/same_output.py" "$work/$stem/out" "$root/tests/run/$stem.stdout" || ok=0
    if [ -f "$root/tests/run/$stem.stderr" ]; then
        python3 "$root/scripts/gpu/same_output.py" "$work/$stem/err" "$root/tests/run/$stem.stderr" || ok=0
    else
        [ -s "$work/$stem/err" ] && ok=0
    fi
    [ "$code" = "$want_code" ] || ok=0
    if [ $ok = 1 ]; then passed=$((passed+1)); else
        failed=$((failed+1)); status=1
        echo "== FAIL $stem (exit $code, expected $want_code)"
        diff "$work/$stem/out" "$root/tests/run/$stem.stdout" | head -20
        head -20 "$work/$stem/err"
    fi
    if [ "${SANITIZE:-0}" = 1 ]; then
        (cd "$work/$stem" && compute-sanitizer --tool memcheck --print-limit 5 --error-exitcode 9 "$tessera" run "$stem.tsr" --device cuda > /dev/null 2> san; echo $? > sancode)
        if [ "$(cat "$work/$stem/sancode")" = 9 ]; then echo "== SANITIZER $stem"; head -30 "$work/$stem/san"; status=1; fi
    fi
done
echo "tests/run on cuda: $passed passed, $failed failed"
exit $status
