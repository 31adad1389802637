#!/usr/bin/env bash
# Nsight Compute over scripts/profile_case.py's cases, one device call: the
# package built and installed (SKIP_BUILD=1 reuses it), then per case the
# named kernels' duration and main sections (and, PROFILE_SOURCE=1, the
# per-instruction stall samples summarized by scripts/ncu_stalls.py), all
# logs bundled into $OUT/profile.tgz and the summaries on stdout.
#
#   PROFILE_CASES="packed:ForwardKernel plain_1024:ForwardKernel" bash scripts/profile_features.sh
#
# A wheel from scripts/ab_wheel.sh instead of a build here: install it with
# `pip install --no-deps --target /tmp/ab_site/NAME ab/NAME/*.whl` and run
# with PYTHONPATH=/tmp/ab_site/NAME SKIP_BUILD=1. With PROFILE_SOURCE=1 the
# per-instruction CSVs in profile.tgz can be read per source line here:
# scripts/sass_lines.py CSV OBJECT, the object the same translation unit
# compiled here with -lineinfo (nvcc ... -lineinfo -c ffi/cuda/sm90/launch_*.cu),
# and two cases against each other with scripts/ncu_compare.py A.csv B.csv.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-/tmp/profile_out}
LOGS=/tmp/profile_logs
mkdir -p "$OUT" "$LOGS"
if [ -z "${SKIP_BUILD:-}" ]; then
  start=$(date +%s)
  (cd "$root" && CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -v . > "$LOGS/build.log" 2>&1) ||
    { tail -40 "$LOGS/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - start )) s"
fi
cd /tmp
export XLA_PYTHON_CLIENT_PREALLOCATE=false
sections="--section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
  --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats --section LaunchStats ${PROFILE_SOURCE:+--section SourceCounters}"
summary="Kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|L2 Hit|DRAM Throughput|Registers Per|Grid Size"
for spec in ${PROFILE_CASES:-packed:ForwardKernel plain_1024:ForwardKernel one_doc_1024:ForwardKernel}; do
  name=${spec%%:*} kernels=${spec#*:}
  # The second run's launch of each kernel (the first compiles and warms).
  timeout ${PROFILE_TIMEOUT:-150} ncu --clock-control none --kernel-name regex:"$kernels" --launch-skip ${PROFILE_SKIP:-1} \
    --launch-count ${PROFILE_COUNT:-1} $sections -o "$LOGS/$name" python3 "$root/scripts/profile_case.py" "$name" > "$LOGS/$name.log" 2>&1
  ncu -i "$LOGS/$name.ncu-rep" --print-details all > "$LOGS/$name.txt" 2>&1
  echo "== $name ($kernels)"; grep -E "$summary" "$LOGS/$name.txt" | grep -v "^ *--" | head -30
  if [ -n "${PROFILE_SOURCE:-}" ]; then
    ncu -i "$LOGS/$name.ncu-rep" --page source --print-source sass --csv > "$LOGS/${name}_sass.csv" 2>&1
    python3 "$root/scripts/ncu_stalls.py" "$LOGS/${name}_sass.csv" --top 25 --levels
  fi
  (cd "$LOGS" && tar czf "$OUT/profile.tgz" --exclude='*.ncu-rep' .)
done
