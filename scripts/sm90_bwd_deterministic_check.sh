#!/usr/bin/env bash
# Builds and runs tests/cuda/sm90_bwd_deterministic_check.cu on a Hopper GPU
# (issue 21): the sm90 backward's deterministic variant
# (LaunchBackwardDeterministic: dQ's adds in ascending key block order)
# twice and on another tile order (dq, dk, dv bit for bit), against the
# default backward (dk, dv bit for bit, dq within a rounding step), then
# both timed alternately at H = 64 / 128, T = 4096 and 16384, causal and not
# (PASS / FAIL per case, the ratio against the 0.85x target, exit code 1 on
# any FAIL, 4 on a hang). Six kernels: builds in well under a minute.
#
#   bash scripts/sm90_bwd_deterministic_check.sh              # from the worktree root
#   ARGS=--quick bash scripts/sm90_bwd_deterministic_check.sh # the small cases only
#   STEP=build / STEP=run: only the build / only the run of a built binary
#   CHECK_TIMEOUT (default 540 s): the run's limit (a hang inside a timing)
# Writes the binary and the log under ${OUT:-build-sm90-bwd-deterministic-check}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-build-sm90-bwd-deterministic-check}
mkdir -p "$out"
jax_include=$(python3 -c "import jax; print(jax.ffi.include_dir())")
if [[ "${STEP:-all}" != run ]]; then
  start=$(date +%s)
  nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr \
    -Iffi -isystem "$jax_include" -Xptxas -v \
    tests/cuda/sm90_bwd_deterministic_check.cu -o "$out/sm90_bwd_deterministic_check" 2> "$out/ptxas.log"
  echo "built in $(( $(date +%s) - start )) s"
  awk '/Compiling entry/ {n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n)}
       /spill stores/ {spill = $5 " B spill stores, " $9 " B loads"}
       /Used [0-9]+ registers/ && n ~ /BackwardKernel/ {print "  " n ": " $5 " registers, " spill}' "$out/ptxas.log"
fi
[[ "${STEP:-all}" == build ]] && exit 0
timeout "${CHECK_TIMEOUT:-540}" "$out/sm90_bwd_deterministic_check" ${ARGS:-} 2>&1 | tee "$out/sm90_bwd_deterministic_check.log"
