"""Where a kernel's warps wait, from Nsight Compute's per-instruction page:
`ncu -i report.ncu-rep --page source --print-source sass --csv`.

    python scripts/ncu_stalls.py ncu_4_4096_16_128_sass.csv [--top 30]

Prints the share of all stall samples per reason, per opcode (with each
opcode's top reasons) and the instructions with the most samples. Used by
scripts/gpu_check.sh (NCU_SOURCE=1), so the summary comes back in the call's
output beside the CSV. The first CSV line names the kernel; the second is
the header.
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(source: str) -> str:
    """HMMA for '@P0 HMMA.16816.F32.BF16 R4, ...' (predicate and modifiers dropped)."""
    words = source.split()
    if not words:
        return "?"
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def read(lines: list[str]) -> list[dict]:
    """One dict per instruction: address, source, samples, executed, and the stall_* counts."""
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), None)
    if start is None:
        return []
    rows = []
    for row in csv.DictReader(lines[start:]):
        if row.get("Source") is None:
            continue
        stalls = {k[len("stall_"):]: _number(v) for k, v in row.items()
                  if k and k.startswith("stall_") and "Not Issued" not in k}
        rows.append({"address": row.get("Address", ""), "source": row["Source"].strip(),
                     "samples": _number(row.get(SAMPLES, "0")), "executed": _number(row.get(EXECUTED, "0")),
                     "stalls": stalls})
    return rows


def summary(rows: list[dict], top: int = 25) -> str:
    total = sum(r["samples"] for r in rows) or 1.0
    reasons = collections.Counter()
    by_op = collections.defaultdict(collections.Counter)
    for r in rows:
        op = opcode(r["source"])
        by_op[op]["samples"] += r["samples"]
        by_op[op]["count"] += 1
        for reason, n in r["stalls"].items():
            reasons[reason] += n
            by_op[op][reason] += n
    pct = lambda n: f"{100 * n / total:5.1f}%"
    out = [f"{total:.0f} stall samples; by reason:"]
    out += [f"  {pct(n)} {reason}" for reason, n in reasons.most_common(10) if n]
    out.append("by opcode (top reasons):")
    for op, c in sorted(by_op.items(), key=lambda kv: -kv[1]["samples"])[:15]:
        top_reasons = ", ".join(f"{k} {100 * v / total:.1f}" for k, v in c.most_common()
                                if k not in ("samples", "count") and v)[:90]
        out.append(f"  {pct(c['samples'])} {op:8s} x{int(c['count']):<5d} {top_reasons}")
    out.append(f"top {top} instructions:")
    for r in sorted(rows, key=lambda r: -r["samples"])[:top]:
        worst = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["stalls"].items(), key=lambda kv: -kv[1])[:2] if v)
        out.append(f"  {pct(r['samples'])} {r['address'][-5:]:>5s} {r['source'][:64]:64s} {worst}")
    return "\n".join(out)


def levels(rows: list[dict], top: int = 8) -> str:
    """The kernel's instructions grouped by how often each ran (two
    significant digits): in a kernel of tiles and key blocks the largest
    groups are the per-block code (run blocks x warps times), the per-tile
    code (tiles x warps) and so on, so each level's instruction count says
    how much code runs per block or per tile (PERF.md v31: 1977 against
    1519 instructions a tile and warp, the feature kernel against the plain
    one over the same tiles)."""
    total_executed = sum(r["executed"] for r in rows) or 1.0
    total_samples = sum(r["samples"] for r in rows) or 1.0
    groups = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for r in rows:
        if r["executed"] <= 0:
            continue
        level = float(f"{r['executed']:.2g}")
        g = groups[level]
        g[0] += 1
        g[1] += r["executed"]
        g[2] += r["samples"]
    out = [f"{'runs per instruction':>21s} {'instructions':>12s} {'executed':>8s} {'samples':>8s}"]
    for level, (n, e, smp) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]:
        out.append(f"{level:21.0f} {n:12d} {100 * e / total_executed:7.1f}% {100 * smp / total_samples:7.1f}%")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=25, help="instructions listed")
    parser.add_argument("--levels", action="store_true", help="also the instructions grouped by how often each ran")
    args = parser.parse_args(argv)
    with open(args.csv) as f:
        rows = read(f.read().splitlines())
    if not rows:
        print("no per-instruction rows (did ncu write the source page?)")
        return 1
    print(summary(rows, args.top))
    if args.levels:
        print(levels(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
