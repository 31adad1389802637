"""Nsight Compute's per-instruction counts by source line: which lines of the
kernel's source its executed instructions and stall samples come from.

    python scripts/sass_lines.py packed_sass.csv launch_features_bf16.o [--frame fwd_kernel.cuh]
    python scripts/sass_lines.py packed_sass.csv features.o --against plain_1024_sass.csv plain.o

The CSV is `ncu -i X.ncu-rep --page source --print-source sass --csv` (what
scripts/profile_features.sh writes with PROFILE_SOURCE=1); the object (or
cubin) is the same translation unit compiled here with `-lineinfo` (for
sm_90a, the package's flags), which leaves the SASS as it was: the script
checks that the profiled instructions equal the local ones at their
offsets (branch targets, addresses and reuse flags aside; at least 99.9%
of them, all of them in every profile read so far) and refuses a worse
match, so a device build without line info can be read against a local
build with it. Each instruction goes to its source line
(`nvdisasm -gi`'s inlining chain: by default the innermost frame, or with
`--frame SUFFIX` the innermost frame in a file ending in SUFFIX, e.g. the
kernel's own fwd_kernel.cuh line that inlined a helper). Printed per line:
instructions in the binary, warp-level instructions executed, stall samples.
`--against` subtracts a second kernel's counts line by line (another
instantiation of the same sources: e.g. the feature variant against the
plain kernel over the same tiles), sorted by the difference.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_stalls import read  # noqa: E402

FUNCTION = re.compile(r"^\.text\.(\S+):$")
LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")


def parse(text: str) -> dict[str, list[tuple[int, str, tuple]]]:
    """Per function of `nvdisasm -gi -c` output: (offset, instruction text,
    inlining chain innermost first as (file, line) pairs)."""
    functions: dict[str, list] = {}
    name, chain, pending = None, (), []
    for raw in text.splitlines():
        line = raw.strip()
        m = FUNCTION.match(line)
        if m:
            name, chain, pending = m.group(1), (), []
            functions[name] = []
            continue
        m = LINE.search(line)
        if m:
            pending.append((m.group(1), int(m.group(2))))
            continue
        m = INSTRUCTION.search(line)
        if m and name:
            if pending:
                chain, pending = tuple(pending), []
            functions[name].append((int(m.group(1), 16), m.group(2), chain))
    return functions


def disassemble(path: str) -> dict[str, list[tuple[int, str, tuple]]]:
    """parse() of every cubin of the object (or the cubin) at `path`."""
    with tempfile.TemporaryDirectory() as tmp:
        cubins = [path]
        if not path.endswith(".cubin"):
            subprocess.run(["cuobjdump", "-xelf", "all", os.path.abspath(path)], cwd=tmp, check=True,
                           capture_output=True)
            cubins = [os.path.join(tmp, f) for f in sorted(os.listdir(tmp)) if f.endswith(".cubin")]
        functions: dict[str, list] = {}
        for cubin in cubins:
            functions.update(parse(subprocess.run(["nvdisasm", "-gi", "-c", cubin], check=True,
                                                  capture_output=True, text=True).stdout))
    return functions


def _normalize(text: str) -> str:
    """The instruction without branch targets and addresses (ncu prints
    absolute ones, nvdisasm labels), operand reuse flags (nvdisasm only) or
    spacing."""
    text = re.sub(r"`\([^)]*\)|0x[0-9a-f]{6,}", "T", text).replace(".reuse", "")
    return " ".join(text.replace(";", "").split())


def match(rows: list[dict], functions: dict) -> tuple[str, list]:
    """The local function whose instructions equal the profiled ones at the
    same offsets; ValueError when none does."""
    base = int(rows[0]["address"], 16)
    profiled = {int(r["address"], 16) - base: _normalize(r["source"]) for r in rows}
    best, best_score = None, -1.0
    for name, code in functions.items():
        if abs(len(code) - len(profiled)) > 2:
            continue
        same = sum(1 for off, text, _ in code if profiled.get(off) == _normalize(text))
        score = same / max(len(profiled), 1)
        if score > best_score:
            best, best_score = name, score
    if best is None or best_score < 0.999:
        raise ValueError(f"no local function matches the profile (best {best_score:.3f}: {best}); "
                         "compile the same source, flags and compiler with -lineinfo")
    return best, functions[best]


def by_line(rows: list[dict], code: list, frame: str | None) -> dict:
    base = int(rows[0]["address"], 16)
    counts = {int(r["address"], 16) - base: r for r in rows}
    out = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for off, _, chain in code:
        key = ("?", 0)
        if chain:
            key = chain[0]
            if frame:
                key = next((c for c in chain if c[0].endswith(frame)), chain[0])
        r = counts.get(off)
        out[key][0] += 1
        if r:
            out[key][1] += r["executed"]
            out[key][2] += r["samples"]
    return out


def _label(key: tuple) -> str:
    return f"{os.path.basename(key[0])}:{key[1]}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("object", help="the same translation unit compiled here with -lineinfo (.o or .cubin)")
    parser.add_argument("--frame", help="attribute to the innermost frame in a file ending in this")
    parser.add_argument("--against", nargs=2, metavar=("CSV", "OBJECT"), help="subtract this kernel's counts")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)

    def load(csv_path: str, obj: str) -> tuple[str, dict, float, float]:
        with open(csv_path) as f:
            rows = read(f.read().splitlines())
        name, code = match(rows, disassemble(obj))
        return name, by_line(rows, code, args.frame), sum(r["executed"] for r in rows), sum(r["samples"] for r in rows)

    name, lines, executed, samples = load(args.csv, args.object)
    print(f"{name[:110]}: {executed:.0f} warp instructions executed, {samples:.0f} stall samples")
    if args.against:
        other_name, other, other_executed, other_samples = load(*args.against)
        print(f"against {other_name[:102]}: {other_executed:.0f} executed, {other_samples:.0f} samples")
        keys = set(lines) | set(other)
        diff = {k: [lines.get(k, [0, 0, 0])[i] - other.get(k, [0, 0, 0])[i] for i in range(3)] for k in keys}
        print(f"{'line':40s} {'instrs':>7s} {'executed':>12s} {'samples':>8s}  (this minus that)")
        for k, (n, e, s) in sorted(diff.items(), key=lambda kv: -abs(kv[1][1]))[:args.top]:
            print(f"{_label(k):40s} {n:+7d} {e:+12.0f} {s:+8.0f}")
        return 0
    print(f"{'line':40s} {'instrs':>7s} {'executed':>12s} {'share':>6s} {'samples':>8s} {'share':>6s}")
    for k, (n, e, s) in sorted(lines.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{_label(k):40s} {n:7d} {e:12.0f} {100 * e / max(executed, 1):5.1f}% {s:8.0f} "
              f"{100 * s / max(samples, 1):5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
