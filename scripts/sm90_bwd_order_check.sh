#!/usr/bin/env bash
# Builds and runs tests/cuda/sm90_bwd_order_check.cu on a Hopper GPU: the
# sm90 backward's causal tile order in sections of (batch, key head) pairs
# against the former order (dK, dV bit for bit, dQ within a rounding step;
# sections sized and forced to 1 and 5 pairs), then both timed alternately
# at H = 64 / 128, T = 4096 and 16384 (PASS / FAIL per case, exit code 1 on
# any FAIL). Two kernels: builds in well under a minute.
#
#   bash scripts/sm90_bwd_order_check.sh              # from the worktree root
#   ARGS=--quick bash scripts/sm90_bwd_order_check.sh # the small cases only
#   STEP=build / STEP=run: only the build / only the run of a built binary
# Writes the binary and the log under ${OUT:-build-sm90-bwd-order-check}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-build-sm90-bwd-order-check}
mkdir -p "$out"
jax_include=$(python3 -c "import jax; print(jax.ffi.include_dir())")
if [[ "${STEP:-all}" != run ]]; then
  start=$(date +%s)
  nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr \
    -Iffi -isystem "$jax_include" -Xptxas -v \
    tests/cuda/sm90_bwd_order_check.cu -o "$out/sm90_bwd_order_check" 2> "$out/ptxas.log"
  echo "built in $(( $(date +%s) - start )) s"
  awk '/Compiling entry/ {n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n)}
       /spill stores/ {spill = $5 " B spill stores, " $9 " B loads"}
       /Used [0-9]+ registers/ && n ~ /BackwardKernel/ {print "  " n ": " $5 " registers, " spill}' "$out/ptxas.log"
fi
[[ "${STEP:-all}" == build ]] && exit 0
timeout "${CHECK_TIMEOUT:-300}" "$out/sm90_bwd_order_check" ${ARGS:-} 2>&1 | tee "$out/sm90_bwd_order_check.log"
