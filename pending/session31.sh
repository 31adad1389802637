#!/usr/bin/env bash
# Session 31's device calls for the five waiting forward patches, built here
# as wheels (ab/NAME, scripts/ab_wheel.sh; carry the ab/ folders named):
#   land:   the whole suite against ab/combo (main + all five patches), the
#           four sanitizers on it, then main vs combo timed (2 rounds).
#   ablate: each patch alone beside main, on the cases it targets.
set -uo pipefail
stage=${1:?usage: bash pending/session31.sh land|ablate}
export OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
t1024="--impl jax_flash --head-dim 64 128 256 --seqlen 1024 --causal 0 1 --cotangent random"
feat="--impl jax_flash --head-dim 128 --seqlen 4096 --cotangent random --cases plain:1 segments:1 window:1 softcap:0 prefix_lm_softcap:0 dropout:0 plain:0"
case "$stage" in
  land)
    AB_DIRS="ab/combo" AB_TESTS="tests" AB_PYTEST_ARGS="-n 12 -p no:cacheprovider" bash scripts/gpu_ab.sh
    cp /tmp/ab_pytest_combo.log "$OUT/pytest_combo.log" 2>/dev/null
    start=$(date +%s)
    PYTHONPATH=/tmp/ab_site/combo timeout 200 bash scripts/sanitize_kernels.sh > "$OUT/sanitize.log" 2>&1
    echo "== sanitize rc $? in $(( $(date +%s) - start )) s"; tail -15 "$OUT/sanitize.log"
    AB_DIRS="ab/main ab/combo" AB_ROUNDS=2 BENCH_ARGS="$t1024;$feat" bash scripts/gpu_ab.sh
    ;;
  ab)  # main vs combo (2 rounds), then each patch alone on the cases it targets (1 round)
    AB_DIRS="ab/main ab/combo" AB_ROUNDS=2 BENCH_ARGS="$t1024;$feat" bash scripts/gpu_ab.sh
    cp "$OUT/ab.md" "$OUT/ab_combo.md"
    AB_DIRS="ab/tma ab/ud" AB_ROUNDS=1 BENCH_ARGS="$t1024" bash scripts/gpu_ab.sh
    cp "$OUT/ab.md" "$OUT/ab_plain.md"
    AB_DIRS="ab/rows ab/cap ab/caponly" AB_ROUNDS=1 BENCH_ARGS="$feat" bash scripts/gpu_ab.sh
    cp "$OUT/ab.md" "$OUT/ab_feat.md"
    ;;
esac
