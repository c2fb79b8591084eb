#!/usr/bin/env bash
# Every GPU check of the CUDA executor, on a machine with an NVIDIA driver and GPU
# (CI has none). Each part compares the GPU with the CPU executor, the reference:
#   1. LIBTEST exec::cuda --test-threads=1   (the compiler's lib test binary, if given)
#   2. scripts/gpu/run-files.sh: tests/run/*.tsr on the GPU vs their expected files
#   3. tests/repl/*.transcript inputs piped into `tessera repl` on the CPU and on the
#      GPU; outputs and exit codes agree (numbers within tolerance) except for the
#      differences listed in KNOWN below, each with its reason
#   4. tests/gpu/*.tsr run on both devices in scratch folders; stdout agrees and every
#      .npy agrees within its dtype's tolerance (scripts/gpu/compare_npy.py)
#   5. compute-sanitizer memcheck, racecheck and synccheck over every tests/gpu program
#   6. tests/gpu/restart.repl piped into `tessera repl --device cuda`: a kernel's fault,
#      the process restarts with the session; stdout and stderr against restart.std*
# It prints one summary line per part at the end and exits 1 if any part failed.
#
#   scripts/gpu/check-all.sh TESSERA [LIBTEST]
#
# DEVICE=cpu runs the "GPU" side on the CPU too (to check the script itself on a
# machine without a GPU; parts 5 and 6 are skipped). PARTS (default "1 2 3 4 5 6") picks the
# parts, e.g. to split a run into commands of bounded length. SAN_TOOLS (default "memcheck racecheck
# synccheck") and SAN_PROGRAMS (tests/gpu stems, default all) pick the sanitizer
# runs, SAN_TIMEOUT (seconds, default 300) bounds each; COMPUTE_SANITIZER names the
# binary if it is neither on PATH nor in /usr/local/cuda/bin. TESSERA_CACHE_DIR
# defaults to a fresh folder: each kernel compiles once, later processes load it.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ $# -ge 1 ] || { sed -n '2,25p' "$0"; exit 2; }
tessera="$(realpath "$1")"
libtest="${2:+$(realpath "$2")}"
device="${DEVICE:-cuda}"
work="$(mktemp -d)"
export NO_COLOR=1 TESSERA_HISTORY="$work/history"
export TESSERA_CACHE_DIR="${TESSERA_CACHE_DIR:-$work/cache}"
summary=()
failed=0
# record PART STATUS DETAIL: one line of the final summary; FAIL makes the exit status 1.
record() {
    summary+=("$(printf '%-26s %-4s %s' "$1" "$2" "$3")")
    [ "$2" = FAIL ] && failed=1
    return 0
}
# part N: whether PARTS asks for part N (a part not asked for is one summary line).
part() {
    [[ " ${PARTS:-1 2 3 4 5 6} " == *" $1 "* ]] && return 0
    record "$2" skip "not in PARTS"
    return 1
}
# The CPU reference hides the GPUs, so `:device cuda` in a transcript fails there as
# it does in CI, and nothing it runs can reach the GPU.
on_cpu() { CUDA_VISIBLE_DEVICES= "$tessera" "$@" --device cpu; }
on_dev() { "$tessera" "$@" --device "$device"; }
echo "tessera: $tessera; device: $device; scratch: $work"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

# 1. The executor's unit tests (they skip with a message when there is no GPU).
echo; echo "== 1. $(basename "${libtest:-LIBTEST}") exec::cuda"
if ! part 1 "1 exec::cuda unit tests"; then :
elif [ -z "$libtest" ]; then
    record "1 exec::cuda unit tests" skip "no LIBTEST given"
else
    (cd "$root" && "$libtest" exec::cuda --test-threads=1) > "$work/libtest.log" 2>&1
    code=$?
    grep -E "^test |test result|panicked" "$work/libtest.log"
    result="$(grep "test result" "$work/libtest.log" | tail -1)"
    if [ $code = 0 ]; then record "1 exec::cuda unit tests" PASS "${result#test result: }"
    else tail -30 "$work/libtest.log"; record "1 exec::cuda unit tests" FAIL "exit $code: ${result:-no result line}"; fi
fi

# 2. tests/run on the device vs the expected files.
echo; echo "== 2. tests/run"
if part 2 "2 tests/run"; then
    DEVICE="$device" "$root/scripts/gpu/run-files.sh" "$tessera" > "$work/run-files.log" 2>&1
    code=$?
    cat "$work/run-files.log"
    last="$(tail -1 "$work/run-files.log")"
    if [ $code = 0 ]; then record "2 tests/run" PASS "$last"; else record "2 tests/run" FAIL "$last"; fi
fi

# 3. REPL transcripts: their inputs piped into a session on each device. A line typed
# then cancelled (`TEXT<ctrl-c>`) is never submitted, so it is dropped; a transcript
# that interrupts a running statement needs a terminal (repl/tests/transcripts.rs
# covers it on the CPU) and is skipped.
# Differences that are expected, as "TRANSCRIPT|CPU_REGEX=>GPU_REGEX|why":
KNOWN=(
    "alloc_limits|GiB of memory is available=>GiB of memory is available|the free memory that E0713's help names changes between the two runs"
    "errors|E0721=>(?m)^cuda:[0-9]|\`:device cuda\` fails where the GPUs are hidden and works on the GPU"
    "errors|(?m)^cpu\$=>memory: |\`:device\` says cpu on the CPU and names the GPU and its memory on it"
    "messages|no GPU is open=>has not been tuned in this session|\`:autotune\` without a GPU says none is open; on the GPU, that the kernel was not tuned"
    "alloc_limits|MemAvailable in /proc/meminfo=>free on the GPU|E0713's help names the memory of the device that refused: the host's or the GPU's"
    "tuned_elsewhere|sm_90a takes first \\(it ran with the configuration its tuning space gives the CPU\\)=>gemm_tf32. as it last ran|on an sm_90a GPU the kernel ran with sm_90a's configuration"
    "tuned_elsewhere|gemm_tf32. as it last ran: BK=32, BM=128, BN=64=>sm_80 takes first \\(it ran with the configuration tuned on sm_9|on the GPU the kernel ran with its own arch's configuration, which sm_80 replaces"
)
echo; echo "== 3. REPL transcripts, cpu vs $device"
if part 3 "3 REPL transcripts"; then
    same=0; differ=0; skipped=""
    mkdir -p "$work/repl"
    for t in "$root"/tests/repl/*.transcript; do
        stem="$(basename "$t" .transcript)"
        if grep -qx "<ctrl-c>" "$t"; then skipped="$skipped $stem"; echo "$stem: skipped (interrupts a running statement)"; continue; fi
        sed -n -e '/<ctrl-c>$/d' -e 's/^tessera> \{0,1\}//p' -e 's/^\.\.\.     //p' -e 's/^\.\.\.$//p' "$t" > "$work/repl/$stem.in"
        (cd "$root" && on_cpu repl < "$work/repl/$stem.in" > "$work/repl/$stem.cpu" 2>&1; echo $? > "$work/repl/$stem.cpu.code")
        (cd "$root" && on_dev repl < "$work/repl/$stem.in" > "$work/repl/$stem.dev" 2>&1; echo $? > "$work/repl/$stem.dev.code")
        allowed=()
        for k in "${KNOWN[@]}"; do
            IFS='|' read -r name pair why <<< "$k"
            [ "$name" = "$stem" ] && allowed+=("$pair")
        done
        if ! cmp -s "$work/repl/$stem.cpu.code" "$work/repl/$stem.dev.code"; then
            echo "$stem: DIFFERS: exit $(cat "$work/repl/$stem.dev.code") on $device, $(cat "$work/repl/$stem.cpu.code") on cpu"
            differ=$((differ+1))
        elif (cd "$root/scripts/gpu" && python3 compare_transcript.py "$work/repl/$stem.dev" "$work/repl/$stem.cpu" ${allowed[@]+"${allowed[@]}"}) > "$work/repl/$stem.cmp"; then
            echo "$stem: same"; sed 's/^/  /' "$work/repl/$stem.cmp"
            same=$((same+1))
        else
            echo "$stem: DIFFERS"; cat "$work/repl/$stem.cmp"
            differ=$((differ+1))
        fi
    done
    detail="$same agree, $differ differ${skipped:+; skipped:$skipped}"
    if [ $differ = 0 ]; then record "3 REPL transcripts" PASS "$detail"; else record "3 REPL transcripts" FAIL "$detail"; fi
fi

# 4. tests/gpu programs on both devices: stdout and every .npy output.
echo; echo "== 4. tests/gpu, cpu vs $device"
if part 4 "4 tests/gpu outputs"; then
    ok=0; bad=""
    for f in "$root"/tests/gpu/*.tsr; do
        stem="$(basename "$f" .tsr)"
        for side in cpu dev; do
            mkdir -p "$work/gpu/$stem/$side" && cp "$f" "$work/gpu/$stem/$side/"
            (cd "$work/gpu/$stem/$side" && "on_$side" run "$stem.tsr" > stdout 2> stderr; echo $? > code)
        done
        d="$work/gpu/$stem"
        if [ "$(cat "$d/cpu/code")" != 0 ] || [ "$(cat "$d/dev/code")" != 0 ]; then
            echo "$stem: FAIL: exit $(cat "$d/dev/code") on $device, $(cat "$d/cpu/code") on cpu"
            head -20 "$d/dev/stderr" "$d/cpu/stderr"
            bad="$bad $stem"; continue
        fi
        # Nothing on stderr: a GPU error (which ends the run) is reported there.
        if [ -s "$d/dev/stderr" ] || [ -s "$d/cpu/stderr" ]; then
            echo "$stem: FAIL: it wrote to stderr"; head -20 "$d/dev/stderr" "$d/cpu/stderr"
            bad="$bad $stem"; continue
        fi
        echo "$stem:"
        python3 "$root/scripts/gpu/compare_npy.py" "$d/dev" "$d/cpu"
        npy=$?
        python3 "$root/scripts/gpu/same_output.py" "$d/dev/stdout" "$d/cpu/stdout"
        out=$?
        if [ $npy = 0 ] && [ $out = 0 ]; then ok=$((ok+1)); else
            [ $out = 0 ] || echo "  stdout differs"
            bad="$bad $stem"
        fi
    done
    # Every stdlib kernel and function must be called by some program here.
    uncalled=""
    for name in $(sed -n 's/^def \([A-Za-z_0-9]*\).*/\1/p' "$root"/stdlib/std/*.tsr); do
        grep -qE "(^|[^A-Za-z_0-9.])$name\(" "$root"/tests/gpu/*.tsr || uncalled="$uncalled $name"
    done
    [ -z "$uncalled" ] || { echo "stdlib definitions no tests/gpu program calls:$uncalled"; bad="$bad (uncalled:$uncalled)"; }
    if [ -z "$bad" ] && [ $ok -gt 0 ]; then record "4 tests/gpu outputs" PASS "$ok programs agree"
    else record "4 tests/gpu outputs" FAIL "$ok agree; failed:${bad:- no programs}"; fi
fi

# 5. compute-sanitizer over every tests/gpu program, each tool in turn.
echo; echo "== 5. compute-sanitizer"
sanitizer="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
if ! part 5 "5 compute-sanitizer"; then :
elif [ "$device" != cuda ]; then
    record "5 compute-sanitizer" skip "DEVICE=$device"
elif [ ! -x "$sanitizer" ]; then
    record "5 compute-sanitizer" FAIL "no compute-sanitizer (set COMPUTE_SANITIZER)"
else
    runs=0; bad=""
    for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
        for f in "$root"/tests/gpu/*.tsr; do
            stem="$(basename "$f" .tsr)"
            [ -z "${SAN_PROGRAMS:-}" ] || [[ " $SAN_PROGRAMS " == *" $stem "* ]] || continue
            d="$work/san/$tool/$stem"
            mkdir -p "$d" && cp "$f" "$d/"
            start=$SECONDS
            (cd "$d" && timeout "${SAN_TIMEOUT:-300}" "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 10 \
                "$tessera" run "$stem.tsr" --device cuda > out 2> err; echo $? > code)
            code=$(cat "$d/code")
            summary_line="$(grep -hE "(ERROR|RACECHECK|SYNCCHECK) SUMMARY" "$d/out" "$d/err" | tail -1)"
            echo "$tool $stem: exit $code in $((SECONDS-start)) s: ${summary_line:-no summary line}"
            runs=$((runs+1))
            if [ "$code" != 0 ]; then
                case $code in
                    86) why="sanitizer errors" ;; 124) why="timed out after ${SAN_TIMEOUT:-300} s" ;; *) why="exit $code" ;;
                esac
                echo "  $why:"; grep -h "^=========" "$d/out" "$d/err" | head -30 | sed 's/^/    /'; grep -hv "^=========" "$d/err" | head -10 | sed 's/^/    /'
                bad="$bad $tool:$stem($why)"
            fi
        done
    done
    if [ -z "$bad" ]; then record "5 compute-sanitizer" PASS "$runs runs, no errors"
    else record "5 compute-sanitizer" FAIL "$runs runs; failed:$bad"; fi
fi

# 6. A sticky error in a piped session: the process restarts (a fresh context) and
# the session goes on. Its temporary folder (under TMPDIR) must be gone afterwards.
echo; echo "== 6. restart after a sticky error"
if ! part 6 "6 restart after a fault"; then :
elif [ "$device" != cuda ]; then
    record "6 restart after a fault" skip "DEVICE=$device"
else
    d="$work/restart"; mkdir -p "$d/tmp"
    (cd "$d" && TMPDIR="$d/tmp" TESSERA_GPU_TRAP=poke "$tessera" repl --device cuda < "$root/tests/gpu/restart.repl" > stdout 2> stderr; echo $? > code)
    bad=""
    [ "$(cat "$d/code")" = 1 ] || bad="$bad exit $(cat "$d/code") (want 1: statements failed)"
    python3 "$root/scripts/gpu/match_lines.py" "$d/stdout" "$root/tests/gpu/restart.stdout" || bad="$bad stdout"
    python3 "$root/scripts/gpu/match_lines.py" "$d/stderr" "$root/tests/gpu/restart.stderr" || bad="$bad stderr"
    [ -z "$(ls -A "$d/tmp")" ] || bad="$bad (left in TMPDIR: $(ls "$d/tmp"))"
    if [ -z "$bad" ]; then record "6 restart after a fault" PASS "2 restarts, outputs as expected"
    else
        echo "stdout:"; cat "$d/stdout"; echo "stderr:"; cat "$d/stderr"
        record "6 restart after a fault" FAIL "$bad"
    fi
fi

echo; echo "== summary ($device; outputs kept in $work)"
printf '%s\n' "${summary[@]}"
exit $failed
