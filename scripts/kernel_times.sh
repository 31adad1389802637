#!/usr/bin/env bash
# Every GPU kernel of scripts/profile_case.py's cases with its duration (Nsight
# Compute, one metric: quick, ~20 s a case): where a call's time goes outside
# its attention kernel (a mask's block summary, XLA's converts and pads).
# profile_case.py runs the call twice; the last launches are the warm run's.
#
#   KERNEL_CASES="prefix_lm striped softcap" bash scripts/kernel_times.sh   # the installed package
#   KERNEL_METRICS=gpu__time_duration.sum,sm__ops_path_tensor_src_bf16_dst_fp32.sum ...   # more columns
#     (the tensor ops count the blocks a kernel computes: 2 * 128 * 128 * H per S or O block)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd /tmp
export XLA_PYTHON_CLIENT_PREALLOCATE=false
for name in ${KERNEL_CASES:-prefix_lm}; do
  echo "== $name"
  timeout "${KERNEL_TIMEOUT:-120}" ncu --clock-control none --metrics "${KERNEL_METRICS:-gpu__time_duration.sum}" --csv \
    python3 "$root/scripts/profile_case.py" "$name" > "/tmp/kernel_times_$name.csv" 2> "/tmp/kernel_times_$name.err" ||
    { echo "ncu failed: $(tail -3 "/tmp/kernel_times_$name.err")"; continue; }
  python3 - "/tmp/kernel_times_$name.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
ident, name = head.index("ID"), head.index("Kernel Name")
metric, unit, value = head.index("Metric Name"), head.index("Metric Unit"), head.index("Metric Value")
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
launches = {}  # ID -> (kernel, {metric: value}); durations in us
for r in rows:
    kernel, values = launches.setdefault(r[ident], (r[name], {}))
    x = float(r[value].replace(",", "") or "nan")
    values[r[metric]] = x * scale.get(r[unit], 1.0) if r[metric] == "gpu__time_duration.sum" else x
times = list(launches.values())
extra = [m for m in times[0][1] if m != "gpu__time_duration.sum"] if times else []
# Every launch in order; the second run's are the last ones (the first run
# may hold one-time kernels, e.g. a constant's broadcast, so halves can be uneven).
for index, (kernel, values) in enumerate(times):
    more = "".join(f"  {m.split('__')[-1]}={values.get(m, float('nan')):.4g}" for m in extra)
    print(f"{index:3d} {values.get('gpu__time_duration.sum', float('nan')):10.1f} us  {kernel[:90]}{more}")
half = times[len(times) // 2:]
print(f"    {sum(v.get('gpu__time_duration.sum', 0.0) for _, v in half):10.1f} us  total of the last {len(half)} launches")
PY
done
