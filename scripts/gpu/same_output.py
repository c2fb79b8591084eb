"""Whether two outputs of a Tessera program agree: the same text, except that
numbers may differ within tolerance (the GPU contracts a*b+c into one FMA and
uses its own exp/log; the CPU executor rounds every operation), as
repl/tests/run_files.rs's run_files_on_cuda compares.
    python3 same_output.py GOT EXPECTED   (exit 1 and a diff line when they differ)"""
import re, sys

NUM = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")

def parts(text):
    text = "\n".join(line.rstrip() for line in text.rstrip().splitlines())
    return NUM.split(text), [float(x) for x in NUM.findall(text)]

def same(got, want, rtol=1e-3, atol=1e-5):
    (gt, gn), (wt, wn) = parts(got), parts(want)
    if gt != wt or len(gn) != len(wn):
        return False
    return all(abs(a - b) <= atol + rtol * abs(b) for a, b in zip(gn, wn))

if __name__ == "__main__":
    got, want = (open(p, encoding="utf-8", newline="").read().replace("\r", "") for p in sys.argv[1:3])
    ok = same(got, want)
    if not ok:
        for g, w in zip(got.splitlines(), want.splitlines()):
            if not same(g, w):
                print(f"  got:      {g}\n  expected: {w}")
                break
    sys.exit(0 if ok else 1)
