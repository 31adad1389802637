#!/usr/bin/env bash
# Every GPU kernel of scripts/profile_case.py's cases with its duration (Nsight
# Compute, one metric: quick, ~20 s a case): where a call's time goes outside
# its attention kernel (a mask's block summary, XLA's converts and pads).
# profile_case.py runs the call twice; the second run's kernels are the warm ones.
#
#   KERNEL_CASES="prefix_lm striped softcap" bash scripts/kernel_times.sh   # the installed package
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd /tmp
export XLA_PYTHON_CLIENT_PREALLOCATE=false
for name in ${KERNEL_CASES:-prefix_lm}; do
  echo "== $name"
  timeout "${KERNEL_TIMEOUT:-120}" ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    python3 "$root/scripts/profile_case.py" "$name" > "/tmp/kernel_times_$name.csv" 2> "/tmp/kernel_times_$name.err" ||
    { echo "ncu failed: $(tail -3 "/tmp/kernel_times_$name.err")"; continue; }
  python3 - "/tmp/kernel_times_$name.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
name, unit, value = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
times = [(r[name], float(r[value].replace(",", "")) * scale.get(r[unit], 1.0)) for r in rows]
half = times[len(times) // 2:]  # the second of the two runs
for kernel, us in half:
    print(f"{us:10.1f} us  {kernel[:110]}")
print(f"{sum(us for _, us in half):10.1f} us  total of the second run ({len(half)} kernels)")
PY
done
