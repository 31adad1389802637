"""Two kernels' per-instruction Nsight Compute pages side by side: where the
extra instructions and stall samples of one (a feature variant) go against
the other (the plain kernel at the same tiles), from
`ncu -i report.ncu-rep --page source --print-source sass --csv`
(scripts/profile_features.sh with PROFILE_SOURCE=1 leaves them in
profile.tgz as CASE_sass.csv).

    python scripts/ncu_compare.py packed_grad_sass.csv plain_grad_1024_sass.csv

Prints, for each kernel and side by side: warp instructions executed per
opcode (the largest differences first); and its code grouped by execution
count, which in these kernels names the code's role: the step loop's body
runs steps x consumer warps times, a tile's prologue and epilogue tiles x
warps, the producer's barrier spins an irregular count. Per count, the
instructions in that class, their stall samples, samples per execution and
the top stall reasons. Session 37 read the packed backward's extra time
this way: 897 instructions per consumer warp and step against plain's ~540,
all of it in the per-step code, the mask policy.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import sys

from ncu_stalls import EXECUTED, SAMPLES, _number

OPCODE = re.compile(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def load(path: str):
    """(opcode, executions, samples, {reason: samples}) per instruction."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[1], rows[2:]
    source, executed, samples = header.index("Source"), header.index(EXECUTED), header.index(SAMPLES)
    reasons = [(i, h[len("stall_"):]) for i, h in enumerate(header)
               if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for row in body:
        if len(row) <= max(source, executed, samples):
            continue
        match = OPCODE.match(row[source].strip())
        stalls = {name: _number(row[i]) for i, name in reasons if _number(row[i])}
        out.append((match.group(1) if match else "?", int(_number(row[executed])), _number(row[samples]), stalls))
    return out


def by_count(instructions, min_share: float):
    """Execution count -> [instructions, executions, samples, reasons] for
    the counts holding at least min_share of the samples or executions."""
    total_samples = sum(s for _, _, s, _ in instructions) or 1
    total_executed = sum(e for _, e, _, _ in instructions) or 1
    classes = collections.defaultdict(lambda: [0, 0, 0.0, collections.Counter()])
    for _, executed, samples, stalls in instructions:
        entry = classes[executed]
        entry[0] += 1
        entry[1] += executed
        entry[2] += samples
        entry[3].update(stalls)
    keep = {c: v for c, v in classes.items()
            if v[2] / total_samples >= min_share or v[1] / total_executed >= min_share}
    return sorted(keep.items(), key=lambda kv: -kv[1][2]), total_samples, total_executed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--opcodes", type=int, default=25, help="opcode rows to print")
    parser.add_argument("--min-share", type=float, default=0.01,
                        help="smallest share of samples or executions for a count class to print")
    args = parser.parse_args()
    kernels = [load(args.first), load(args.second)]
    counts = [collections.Counter(), collections.Counter()]
    for counter, instructions in zip(counts, kernels):
        for opcode, executed, _, _ in instructions:
            counter[opcode] += executed
    totals = [sum(c.values()) for c in counts]
    print(f"warp instructions executed: {totals[0] / 1e6:.2f}M against {totals[1] / 1e6:.2f}M "
          f"({totals[0] / max(totals[1], 1):.2f}x)")
    print(f"{'opcode':14s} {'first':>9s} {'second':>9s} {'difference':>11s}")
    for opcode in sorted(set(counts[0]) | set(counts[1]), key=lambda o: -abs(counts[0][o] - counts[1][o]))[:args.opcodes]:
        a, b = counts[0][opcode], counts[1][opcode]
        print(f"{opcode:14s} {a / 1e6:8.2f}M {b / 1e6:8.2f}M {(a - b) / 1e6:+10.2f}M")
    for name, instructions in zip((args.first, args.second), kernels):
        classes, total_samples, _ = by_count(instructions, args.min_share)
        print(f"\n{name}: {total_samples:.0f} stall samples; code by execution count")
        print(f"{'executions':>11s} {'instr':>6s} {'samples':>8s} {'share':>6s} {'per exec':>9s}  top reasons")
        for count, (n, _, samples, reasons) in classes:
            top = ", ".join(f"{r} {v:.0f}" for r, v in reasons.most_common(3))
            print(f"{count:11d} {n:6d} {samples:8.0f} {samples / total_samples:6.1%} "
                  f"{samples / max(count, 1):9.4f}  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
