"""Compares a session's output on the GPU with the CPU executor's, allowing only
differences listed in advance:

    python3 compare_transcript.py GOT EXPECTED [CPU_REGEX=>GPU_REGEX ...]

Lines are aligned with their numbers blanked, so lines that agree up to numbers are
compared within same_output.py's tolerance. Every other run of differing lines (a
hunk) must be explained by one of the given pairs: CPU_REGEX found in the
EXPECTED side of the hunk and GPU_REGEX in the GOT side (re.search over the hunk's
lines joined by newlines; `^$` matches an empty side). Exit 1 naming the first
unexplained hunk. A listed difference that does not occur is reported (it may have
been fixed) but is not a failure: with DEVICE=cpu both sides are the CPU's."""
import difflib
import re
import sys

from same_output import NUM, same


def hunks(got, want):
    """Differing runs of lines as (want_lines, got_lines); number-only changes are
    differences only when out of tolerance."""
    blank = lambda lines: [NUM.sub("#", line.rstrip()) for line in lines]
    out = []
    matcher = difflib.SequenceMatcher(None, blank(want), blank(got), autojunk=False)
    for op, w0, w1, g0, g1 in matcher.get_opcodes():
        if op != "equal":
            out.append((want[w0:w1], got[g0:g1]))
            continue
        for w, g in zip(want[w0:w1], got[g0:g1]):
            if not same(g, w):
                out.append(([w], [g]))
    return out


def main(got_path, want_path, allowed):
    read = lambda p: open(p, encoding="utf-8").read().replace("\r", "").splitlines()
    pairs = [tuple(re.compile(x) for x in a.split("=>", 1)) for a in allowed]
    seen = set()
    for want, got in hunks(read(got_path), read(want_path)):
        w, g = "\n".join(want), "\n".join(got)
        hit = next((i for i, (cw, cg) in enumerate(pairs) if cw.search(w) and cg.search(g)), None)
        if hit is None:
            print("  unexplained difference:")
            print("\n".join(f"    cpu:  {line}" for line in want[:8]) or "    cpu:  (nothing)")
            print("\n".join(f"    cuda: {line}" for line in got[:8]) or "    cuda: (nothing)")
            return 1
        print(f"  expected difference: {allowed[hit]}")
        seen.add(hit)
    for i, a in enumerate(allowed):
        if i not in seen:
            print(f"  listed difference not seen: {a}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
