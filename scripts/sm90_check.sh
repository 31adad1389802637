#!/usr/bin/env bash
# Builds and runs tests/cuda/sm90_fwd_check.cu on a Hopper GPU: the sm90
# forward against a float reference on every case (PASS/FAIL per case, exit
# code 1 on any FAIL), then TFLOP/s at T=S=4096 beside the sm80 forward.
#
#   bash scripts/sm90_check.sh             # from the worktree root
#   SM80=0 bash scripts/sm90_check.sh      # without the sm80 comparison (faster build)
#   ARGS=--quick bash scripts/sm90_check.sh  # skip the 4096-long cases
#   ARGS="--plain" / ARGS="--features" bash scripts/sm90_check.sh  # one half (each fits a 10-minute slot)
#   ARGS=--bias / ARGS=--mask bash scripts/sm90_check.sh  # the bias / boolean mask variant's cases and timings
#   ARGS="--h64" bash scripts/sm90_check.sh  # head dim 64 only: two against three consumer warpgroups
#   STEP=build / STEP=run: only the build (nvcc, ptxas summary) / only the run of a built binary
#   (pending/check_all.sh builds every check side by side, then runs them one at a time)
# Writes the binary and the log under ${OUT:-build-sm90-check}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-build-sm90-check}
mkdir -p "$out"
jax_include=$(python3 -c "import jax; print(jax.ffi.include_dir())")
defines=()
if [[ "${SM80:-1}" == 1 ]]; then defines+=(-DJAX_FLASH_CHECK_SM80); fi
if [[ "${STEP:-all}" != run ]]; then
start=$(date +%s)
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr \
  -Iffi -isystem "$jax_include" "${defines[@]}" -Xptxas -v \
  tests/cuda/sm90_fwd_check.cu -o "$out/sm90_fwd_check" 2> "$out/ptxas.log"
echo "built in $(( $(date +%s) - start )) s; registers / spills of the sm90 kernels:"
awk '/Compiling entry/ {n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n)}
     /spill stores/ {spill = $5 " B spill stores, " $9 " B loads"}
     /Used [0-9]+ registers/ && n ~ /ForwardKernel/ {print "  " n ": " $5 " registers, " spill}' "$out/ptxas.log"
# Whose the spilled words are (producer / consumers, inside the key-block
# loops or not) and each role's highest register, where cuobjdump is at hand.
if command -v cuobjdump > /dev/null; then python3 scripts/sm90_locals.py "$out/sm90_fwd_check" || true; fi
fi
[[ "${STEP:-all}" == build ]] && exit 0
# The program ends itself on a hung launch (20 s); the timeout is a backstop.
timeout "${CHECK_TIMEOUT:-480}" "$out/sm90_fwd_check" ${ARGS:-} 2>&1 | tee "$out/sm90_fwd_check.log"
