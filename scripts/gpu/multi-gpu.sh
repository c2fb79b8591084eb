#!/bin/bash
# The multi-GPU checks, on a machine with 2 or more GPUs:
#   scripts/gpu/multi-gpu.sh TESSERA
# 1. tests/gpu/multi/placement.repl piped into `tessera repl --device cuda`:
#    tensors moved to cuda:1 stay there, launches and calls follow them,
#    arguments on two GPUs are E0736; stdout/stderr against placement.std*
#    (scripts/gpu/match_lines.py), and each GPU's launch count from :devices.
# 2. The same session with TESSERA_GPU_TRAP=scale: a fault on cuda:1 restarts
#    the process, which goes on.
# 3. Every tests/sharded/*.tsr with `tessera run --device cuda --devices N` for
#    N = 2 and 4 (as many as the machine has): stdout equals NAME.stdout, the
#    output on the CPU's virtual devices.
set -u
tessera=${1:?usage: multi-gpu.sh TESSERA}
root=$(cd "$(dirname "$0")/../.." && pwd)
export NCCL_NVLS_ENABLE=0
work=$(mktemp -d)
failed=0
n=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$n" -lt 2 ]; then echo "skip: $n GPU(s), the multi-GPU checks need 2"; exit 0; fi

echo "== 1. placement on $n GPUs"
d="$work/placement"; mkdir -p "$d"
(cd "$d" && NO_COLOR=1 "$tessera" repl --device cuda < "$root/tests/gpu/multi/placement.repl" > stdout 2> stderr; echo $? > code)
bad=""
[ "$(cat "$d/code")" = 1 ] || bad="$bad exit $(cat "$d/code") (want 1)"
python3 "$root/scripts/gpu/match_lines.py" "$d/stdout" "$root/tests/gpu/multi/placement.stdout" || bad="$bad stdout"
python3 "$root/scripts/gpu/match_lines.py" "$d/stderr" "$root/tests/gpu/multi/placement.stderr" || bad="$bad stderr"
# The first :devices: cuda:0 ran nothing yet (its one launch was refused), cuda:1 ran the rest.
first=$(grep -m2 "^[* ] cuda:[01] " "$d/stdout")
echo "$first" | grep -q "^\* cuda:0 .*in this session: 0 launches" || bad="$bad (cuda:0 launched before the move)"
echo "$first" | grep -Eq "^  cuda:1 .*in this session: [1-9][0-9]* launches" || bad="$bad (cuda:1 launched nothing)"
if [ -z "$bad" ]; then echo "PASS placement"; else
    echo "FAIL placement:$bad"; echo "stdout:"; cat "$d/stdout"; echo "stderr:"; cat "$d/stderr"; failed=1; fi

echo "== 2. a fault on cuda:1"
d="$work/fault"; mkdir -p "$d/tmp"
cat > "$d/in" <<'TSR'
@kernel(grid=(cdiv(N, 256),))
def scale(x: Tensor["N", f32], out: Tensor["N", f32]):
    i = program_id(0) * 256
    store(out[i : i + 256], load(x[i : i + 256]) * 2.0)

def twice(x: Tensor["N", f32]) -> Tensor["N", f32]:
    return x * 2.0

kept = arange(0, 8, f32)
x = kept.to("cuda:1")
out1 = zeros([8], f32).to("cuda:1")
scale(x, out1)
print("after", kept, twice(kept)[7])
TSR
(cd "$d" && TMPDIR="$d/tmp" TESSERA_GPU_TRAP=scale NO_COLOR=1 "$tessera" repl --device cuda < in > stdout 2> stderr; echo $? > code)
bad=""
[ "$(cat "$d/code")" = 1 ] || bad="$bad exit $(cat "$d/code") (want 1)"
grep -q "^error\[E0730\]" "$d/stderr" || bad="$bad (no E0730)"
grep -q "restarted its process" "$d/stderr" || bad="$bad (no restart note)"
grep -q "^after tensor(\[0.0000, 1.0000" "$d/stdout" || bad="$bad (the session did not go on)"
grep -q "tensor(14.0000, f32)" "$d/stdout" || bad="$bad (twice after the restart)"
[ -z "$(ls -A "$d/tmp")" ] || bad="$bad (left in TMPDIR)"
if [ -z "$bad" ]; then echo "PASS fault on cuda:1"; else
    echo "FAIL fault on cuda:1:$bad"; echo "stdout:"; cat "$d/stdout"; echo "stderr:"; cat "$d/stderr"; failed=1; fi
echo "== 3. sharded programs on the GPUs"
for count in 2 4; do
    [ "$n" -ge "$count" ] || { echo "skip: $count GPUs (the machine has $n)"; continue; }
    for f in "$root"/tests/sharded/*.tsr; do
        stem=$(basename "$f" .tsr)
        d="$work/sharded-$count-$stem"; mkdir -p "$d"; cp "$f" "$d/"
        start=$(date +%s.%N)
        (cd "$d" && NO_COLOR=1 "$tessera" run --device cuda --devices "$count" "$stem.tsr" > stdout 2> stderr; echo $? > code)
        took=$(python3 -c "import time; print(round(time.time() - $start, 1))")
        if [ "$(cat "$d/code")" = 0 ] && [ ! -s "$d/stderr" ] && cmp -s "$d/stdout" "$root/tests/sharded/$stem.stdout"; then
            echo "PASS $stem on $count GPUs (${took} s)"
        else
            echo "FAIL $stem on $count GPUs: exit $(cat "$d/code")"; cat "$d/stderr"
            diff "$d/stdout" "$root/tests/sharded/$stem.stdout" | head -20; failed=1
        fi
    done
done
exit $failed
