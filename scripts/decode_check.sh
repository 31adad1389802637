#!/usr/bin/env bash
# Builds and runs tests/cuda/decode_check.cu on the GPU: the decode kernels
# (ffi/cuda/decode/, split-KV forward, contiguous and paged) against a float
# reference on every case (PASS/FAIL per case and split count, exit code 1
# on any FAIL), then the decode timings of issue 22 beside the floor.
#
#   bash scripts/decode_check.sh                 # from the worktree root
#   ARGS=--quick bash scripts/decode_check.sh    # skip S = 33000 and the timings
#   ARCH=sm_80 bash scripts/decode_check.sh      # an A100 (default sm_90a)
#   SANITIZE=memcheck bash scripts/decode_check.sh   # seven short cases under compute-sanitizer
#   SANITIZE=racecheck bash scripts/decode_check.sh
# Writes the binary and the logs under ${OUT:-build-decode-check}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-build-decode-check}
mkdir -p "$out"
arch=${ARCH:-sm_90a}
jax_include=$(python3 -c "import jax; print(jax.ffi.include_dir())")
start=$(date +%s)
nvcc -gencode=arch=compute_${arch#sm_},code=$arch -O3 -std=c++17 --expt-relaxed-constexpr \
  -Iffi -isystem "$jax_include" -Xptxas -v \
  tests/cuda/decode_check.cu -o "$out/decode_check" 2> "$out/ptxas.log"
echo "built in $(( $(date +%s) - start )) s; registers / spills of the decode kernels:"
awk '/Compiling entry/ {n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n)}
     /spill stores/ {spill = $5 " B spill stores, " $9 " B loads"}
     /Used [0-9]+ registers/ && n ~ /decode/ {print "  " n ": " $5 " registers, " spill}' "$out/ptxas.log" \
  | (c++filt 2>/dev/null || cat)
# The program ends itself on a hung launch (20 s); the timeout is a backstop.
if [[ -n "${SANITIZE:-}" ]]; then
  # A few short cases under compute-sanitizer (memcheck: out-of-bounds reads
  # of a clamped table or a tail; racecheck: the stages' and merge's barriers).
  timeout "${CHECK_TIMEOUT:-540}" compute-sanitizer --tool "$SANITIZE" --error-exitcode 5 \
    "$out/decode_check" --sanitize 2>&1 | tee "$out/decode_check_$SANITIZE.log"
  exit "${PIPESTATUS[0]}"
fi
timeout "${CHECK_TIMEOUT:-540}" "$out/decode_check" ${ARGS:-} 2>&1 | tee "$out/decode_check.log"
exit "${PIPESTATUS[0]}"
