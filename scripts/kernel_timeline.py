"""Summarizes `ncu --metrics gpu__time_duration.sum --csv` output: each kernel
launch's duration in launch order, and the total per kernel name.

    python scripts/kernel_timeline.py timeline.csv

Used by scripts/gpu_check.sh (NCU_TIMELINE=1) to see where a call's time
goes outside its main kernels (the backward's delta and dQ-conversion passes,
XLA's own fusions). ncu's progress lines may precede the CSV; they are skipped.
"""

from __future__ import annotations

import collections
import csv
import sys


def launches(lines: list[str]) -> list[tuple[str, float]]:
    """(kernel name, microseconds) per launch, in launch order."""
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = csv.DictReader(lines[start:])
    out = []
    for row in rows:
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "")
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0,
                 "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}.get(unit)
        if scale is None:
            raise ValueError(f"unknown time unit {unit!r}")
        out.append((row["Kernel Name"], value * scale))
    return out


def summary(launch_list: list[tuple[str, float]]) -> str:
    total = sum(us for _, us in launch_list) or 1.0
    lines = [f"{'us':>10} {'share':>6}  kernel (launch order)"]
    lines += [f"{us:10.1f} {100 * us / total:5.1f}%  {name[:100]}" for name, us in launch_list]
    per_name = collections.Counter()
    for name, us in launch_list:
        per_name[name.split("(")[0][:100]] += us
    lines.append(f"{total:10.1f} 100.0%  total of {len(launch_list)} launches")
    lines.append("per kernel name:")
    lines += [f"{us:10.1f} {100 * us / total:5.1f}%  {name}" for name, us in per_name.most_common()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        launch_list = launches(f.read().splitlines())
    if not launch_list:
        print("no gpu__time_duration rows (did ncu run?)")
        return 1
    print(summary(launch_list))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
