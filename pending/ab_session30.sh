#!/usr/bin/env bash
# Session 30's four waiting forward patches (README.md) on the device from
# wheels built here, in three calls of one stage each (carry ["ab"]):
#
#   here:  for v in tma:sm90-fwd-tma-store rows:sm90-fwd-feature-rows cap:sm90-fwd-softcap-fold \
#                   ud:sm90-fwd-uniform-desc; do
#            bash scripts/ab_wheel.sh ${v%%:*} pending/${v#*:}.patch; done; bash scripts/ab_wheel.sh main
#          bash scripts/ab_wheel.sh caponly pending/sm90-fwd-softcap-fold.patch pending/sm90-fwd-softcap-only.patch
#   device: bash pending/ab_session30.sh tests    # each candidate's tests against its wheel (~4 min)
#           bash pending/ab_session30.sh bench1   # main, tma, ud: T = 1024 and the short-tile features
#           bash pending/ab_session30.sh bench2   # main, rows, cap: the feature cases
#
# $OUT/ab.md: the comparison (scripts/compare_bench.py), $OUT/ab.log the runs.
# The six wheels with their tests, examples, scripts and ffi/ copies are
# ~48 MB of the device call's 64 MiB carry: carry ab/ alone (no .peers).
set -uo pipefail
stage=${1:?usage: bash pending/ab_session30.sh tests|bench1|bench2}
export OUT=${OUT:-/tmp/gpu_out}
case "$stage" in
  tests)
    # The TMA store touches every forward at 64 and 128; the rows patch the
    # feature variants; the soft cap fold the soft cap's.
    AB_DIRS="ab/tma" AB_TESTS="tests/test_attention.py tests/test_features.py tests/test_sinks.py tests/test_paged.py" \
      AB_PYTEST_ARGS="-n 12" bash scripts/gpu_ab.sh
    AB_DIRS="ab/rows" AB_TESTS="tests/test_features.py" AB_PYTEST_ARGS="-n 12" bash scripts/gpu_ab.sh
    AB_DIRS="ab/cap ab/caponly" AB_TESTS="tests/test_features.py tests/test_attention.py" AB_K="softcap or soft_cap" \
      AB_PYTEST_ARGS="-n 12" bash scripts/gpu_ab.sh
    AB_DIRS="ab/ud" AB_TESTS="tests/test_attention.py tests/test_features.py" AB_PYTEST_ARGS="-n 12" \
      bash scripts/gpu_ab.sh
    ;;
  bench1)
    AB_DIRS="ab/main ab/tma ab/ud" AB_ROUNDS=2 \
      BENCH_ARGS="--impl jax_flash --head-dim 128 256 --seqlen 1024 --causal 0 1 --cotangent random;--impl jax_flash --head-dim 128 --seqlen 4096 --cotangent random --cases plain:1 segments:1 window:1 plain:0" \
      bash scripts/gpu_ab.sh
    ;;
  bench2)
    AB_DIRS="ab/main ab/rows ab/cap ab/caponly" AB_ROUNDS=2 \
      BENCH_ARGS="--impl jax_flash --head-dim 128 --seqlen 4096 --cotangent random --cases plain:1 segments:1 window:1 softcap:0 prefix_lm_softcap:0 plain:0" \
      bash scripts/gpu_ab.sh
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
