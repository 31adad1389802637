#!/usr/bin/env bash
# Builds and runs tests/cuda/sm90_bwd_check.cu on a Hopper GPU: the sm90
# backward's dq, dk, dv against a float reference on every case (PASS/FAIL
# per case, exit code 1 on any FAIL), then TFLOP/s at T=S=4096 beside the
# sm80 backward (which also runs every case, uncounted, to show what the
# tolerance allows a known-good kernel). The TFLOP/s table also times the
# other schedules beside the default lean-dQ (early-S, serial, +early-dP at
# head dim 64) and session 17's candidates (dQ-first, lean-dQ with uniform
# descriptors, both, both + diagonal-only masks, that + step counters; at
# head dim 64 also lean-dQ, dQF+unif and +count over 128-query steps, the
# M128 columns; bwd_kernel_traits.cuh), each checked on every case first,
# each candidate timed right after a lean-dQ timing (its "x lean-dQ" line).
# The feature cases (--features) check the package's feature variants
# (FeatureBwdSchedule: dQ-first + uniform descriptors, over 128-query steps
# at 64) and the schedules they replaced in session 19, lean-dQ and, at 64,
# dQ-first + uniform over 64-query steps, on every case (counted like the
# package's); their timing rows (T=S=4096: documents and a window, causal,
# and the soft cap, at head dims 128 and 64) time each of those right after
# the package's (the lean-dQ and dQFu64 columns), beside the plain sm90
# backward and sm80's feature backward. The bias variants (kMasksBias16,
# kMasksBias; dispatched since session 20) run
# on the bias cases and the bias timing rows of --features (no lean-dQ
# column there); on the same cases the sm90 bias-gradient pass
# (LaunchBiasGradientScheduled, dispatched since session 20) against a float
# reference of the summed dS, beside sm80's LaunchBiasGradient, and its own
# TFLOP/s table (4 H N per visible pair). The timed 4096 dbias rows compare
# 1-4 GiB on the host (the whole --features run took 123 s in session 20).
#
#   bash scripts/sm90_bwd_check.sh             # from the worktree root
#   SM80=0 bash scripts/sm90_bwd_check.sh      # without the sm80 comparison (faster build)
#   ARGS=--quick bash scripts/sm90_bwd_check.sh  # skip the 4096-long cases
#   ARGS=--features bash scripts/sm90_bwd_check.sh  # only the feature variants (--plain: only the plain kernels)
#   ARGS="--bias --quick" bash scripts/sm90_bwd_check.sh  # only the bias cases (kMasksBias16 and, at 128,
#                                               # kMasksBiasTiles beside it; the dbias pass), no 4096 rows
#   STEP=build / STEP=run: only the build (nvcc, ptxas summary) / only the run of a built binary
#   (pending/check_all.sh builds every check side by side, then runs them one at a time)
# Writes the binary and the log under ${OUT:-build-sm90-bwd-check}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-build-sm90-bwd-check}
mkdir -p "$out"
jax_include=$(python3 -c "import jax; print(jax.ffi.include_dir())")
defines=()
if [[ "${SM80:-1}" == 1 ]]; then defines+=(-DJAX_FLASH_CHECK_SM80); fi
if [[ "${STEP:-all}" != run ]]; then
start=$(date +%s)
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr \
  -Iffi -isystem "$jax_include" "${defines[@]}" -Xptxas -v \
  tests/cuda/sm90_bwd_check.cu -o "$out/sm90_bwd_check" 2> "$out/ptxas.log"
echo "built in $(( $(date +%s) - start )) s; registers / spills of the backward kernels:"
awk '/Compiling entry/ {n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n)}
     /spill stores/ {spill = $5 " B spill stores, " $9 " B loads"}
     /Used [0-9]+ registers/ && n ~ /BackwardKernel|BiasGradientKernel|DkvKernel/ {print "  " n ": " $5 " registers, " spill}' "$out/ptxas.log"
# The sm90 kernels' few spilled words are the producer warpgroup's (24
# registers, bwd_kernel_traits.cuh); where cuobjdump is at hand, the local
# accesses on each side of its setmaxnreg.dec show that the consumers have none.
if command -v cuobjdump > /dev/null; then
  cuobjdump -sass "$out/sm90_bwd_check" | awk '
    /Function :/ {name = $3; on = (index($0, "BackwardKernel") > 0 || index($0, "BiasGradientKernel") > 0) && index($0, "sm90") > 0; side = "consumer"; next}
    on && /USETMAXREG.DEALLOC/ {side = "producer"}
    on && /STL|LDL/ {count[name " " side]++}
    END {for (k in count) print "  local accesses " k ": " count[k]}'
fi
if grep -q "C75[0-9][0-9]" "$out/ptxas.log"; then echo "  WARNING: ptxas serialized wgmma somewhere:"; grep "C75[0-9][0-9]" "$out/ptxas.log"; fi
fi
[[ "${STEP:-all}" == build ]] && exit 0
# The program ends itself on a hung launch (20 s); the timeout is a backstop.
timeout "${CHECK_TIMEOUT:-600}" "$out/sm90_bwd_check" ${ARGS:-} 2>&1 | tee "$out/sm90_bwd_check.log"
