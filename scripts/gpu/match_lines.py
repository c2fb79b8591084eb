"""Whether a file's lines match an expected file's: `[...]` alone on a line
matches any run of lines, a line ending in `[...]` matches any line that
starts with the text before it, every other line must be equal (trailing
spaces ignored). Prints the first mismatch and exits 1 when they differ.

  python3 match_lines.py GOT EXPECTED"""
import sys

def match(want, got):
    # Lines of `got` each prefix of `want` can end at (dynamic programming).
    ends = {0}
    for w in want:
        nxt = set()
        for i in ends:
            if w == "[...]":
                nxt.update(range(i, len(got) + 1))
            elif i < len(got) and (got[i] == w or (w.endswith("[...]") and got[i].startswith(w[:-5]))):
                nxt.add(i + 1)
        if not nxt:
            return False, w
        ends = nxt
    return len(got) in ends, None

def lines(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return [l.rstrip() for l in f.read().splitlines()]

got, want = lines(sys.argv[1]), lines(sys.argv[2])
ok, at = match(want, got)
if not ok:
    print(f"{sys.argv[1]} does not match {sys.argv[2]}" + (f" (no match for the line `{at}`)" if at else " (lines left over)"))
    sys.exit(1)
