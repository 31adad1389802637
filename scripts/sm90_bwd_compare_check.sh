#!/usr/bin/env bash
# Builds and runs one of the sm90 backward's A/B checks on a Hopper GPU, which
# compare one backward against another (tests/cuda/bwd_compare.cuh: bit for
# bit where both write each element once, dQ within a rounding step), then
# time both alternately at H = 64 / 128, T = 4096 and 16384 (PASS / FAIL per
# case, exit code 1 on any FAIL, 4 on a hang). A few kernels each: builds in
# well under a minute.
#   order          tests/cuda/sm90_bwd_order_check.cu: the causal tile order in
#                  sections of (batch, key head) pairs (sized, and forced to 1
#                  and 5 pairs) against the former order
#   deterministic  tests/cuda/sm90_bwd_deterministic_check.cu (issue 21): the
#                  deterministic variant (LaunchBackwardDeterministic: dQ's adds
#                  in ascending key block order) twice, on another tile order
#                  and with each candidate handoff (dq, dk, dv bit for bit),
#                  against the default backward; the ratio against 0.85x
#
#   bash scripts/sm90_bwd_compare_check.sh order              # from the worktree root
#   ARGS=--quick bash scripts/sm90_bwd_compare_check.sh deterministic  # the small cases only
#   STEP=build / STEP=run: only the build / only the run of a built binary
#   CHECK_TIMEOUT (default 540 s): the run's limit
# Writes the binary and the log under ${OUT:-build-sm90-bwd-<check>-check}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
check=${1:?which check: order or deterministic}
case $check in order|deterministic) ;; *) echo "unknown check $check (order, deterministic)"; exit 2 ;; esac
name=sm90_bwd_${check}_check
out=${OUT:-build-sm90-bwd-$check-check}
mkdir -p "$out"
jax_include=$(python3 -c "import jax; print(jax.ffi.include_dir())")
if [[ "${STEP:-all}" != run ]]; then
  start=$(date +%s)
  nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr \
    -Iffi -isystem "$jax_include" -Xptxas -v \
    "tests/cuda/$name.cu" -o "$out/$name" 2> "$out/ptxas.log"
  echo "built in $(( $(date +%s) - start )) s"
  awk '/Compiling entry/ {n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n)}
       /spill stores/ {spill = $5 " B spill stores, " $9 " B loads"}
       /Used [0-9]+ registers/ && n ~ /BackwardKernel/ {print "  " n ": " $5 " registers, " spill}' "$out/ptxas.log"
  if grep -q "C75[0-9][0-9]" "$out/ptxas.log"; then echo "  WARNING: ptxas serialized wgmma somewhere:"; grep "C75[0-9][0-9]" "$out/ptxas.log"; fi
fi
[[ "${STEP:-all}" == build ]] && exit 0
timeout "${CHECK_TIMEOUT:-540}" "$out/$name" ${ARGS:-} 2>&1 | tee "$out/$name.log"
