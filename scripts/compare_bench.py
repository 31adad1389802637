"""Side-by-side TFLOP/s of several benchmark runs (``python -m jax_flash.benchmark`` JSON).

    python scripts/compare_bench.py main=a/results.json wip=b/results.json
    python scripts/compare_bench.py main=a/1.json,a/2.json wip=b/1.json,b/2.json

One row per (impl, variant, H, T, causal) point; per run its forward and
backward TFLOP/s, and each run's ratio to the first. A run given as several
comma-separated files is their union (e.g. two benchmark invocations); a
point measured in several of them (repeated rounds, gpu_ab.sh's AB_ROUNDS)
shows the mean and, after it, the rounds' spread (half the range, percent of
the mean).

Rows named key_padding_mask (the mask variant's earlier name) count as mask.
Since the benchmark began counting only visible pairs (jax_flash/benchmark.py's
docstring), kv_lengths and mask rows count 7/8 of their earlier FLOPs (across
that change compare their times, not TFLOP/s), and the bias variant is another
bias ([1, N, T, S] in the inputs' dtype, not [B, N, T, S] float32). Plain rows
count as before.
"""

from __future__ import annotations

import json
import sys

# Earlier variant names -> the benchmark's current ones.
VARIANT_ALIASES = {"key_padding_mask": "mask"}


def load(spec: str):
    name, _, paths = spec.partition("=")
    rows = []
    for path in paths.split(","):
        with open(path) as f:
            rows += json.load(f)["rows"]
    rounds = {}
    for r in rows:
        variant = r.get("variant", "plain")
        key = (r["impl"], VARIANT_ALIASES.get(variant, variant), r["head_dim"], r["seqlen"], int(r["causal"]))
        rounds.setdefault(key, []).append(r)
    points = {}
    for key, rs in rounds.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            points[key] = rs[0]
            continue
        point = dict(ok[0])
        for field in ("fwd_tflops", "bwd_tflops"):
            values = [r[field] for r in ok]
            point[field] = sum(values) / len(values)
            point[field + "_spread"] = (max(values) - min(values)) / 2 / point[field] if len(values) > 1 else None
        points[key] = point
    return name, points


def main(argv):
    runs = [load(spec) for spec in argv]
    if not runs:
        raise SystemExit(__doc__)
    names = [name for name, _ in runs]
    header = "| impl | variant | H | T | causal | " + " | ".join(
        f"{n} fwd | {n} bwd" for n in names) + " |"
    lines = [header, "|" + "---|" * (5 + 2 * len(names))]
    base = runs[0][1]
    keys = sorted({k for _, pts in runs for k in pts})
    for key in keys:
        cells = []
        for _, pts in runs:
            r = pts.get(key)
            if r is None or "error" in r:
                cells += ["err" if r else "-", ""]
                continue
            cell = []
            for field in ("fwd_tflops", "bwd_tflops"):
                b = base.get(key)
                ratio = ""
                if b and "error" not in b and b[field] > 0 and pts is not base:
                    ratio = f" ({r[field] / b[field]:.2f}x)"
                spread = r.get(field + "_spread")
                spread = f" ±{100 * spread:.0f}%" if spread is not None else ""
                cell.append(f"{r[field]:.1f}{spread}{ratio}")
            cells += cell
        lines.append("| " + " | ".join(str(k) for k in key) + " | " + " | ".join(cells) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
