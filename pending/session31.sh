#!/usr/bin/env bash
# The timing owed for session 30's five forward patches, landed in 9f8256b
# on their correctness checks alone (README.md): one device call, carry
# ["ab/before", "ab/main", "ab/tma", "ab/ud", "ab/rows", "ab/cap",
# "ab/caponly"] (~56 MB), ~8 minutes:
#   ab/before   5d8a050's wheel (before the patches)
#   ab/main     9f8256b's (all five)
#   ab/tma ab/ud ab/rows ab/cap ab/caponly   5d8a050 + one patch each
#               (caponly: the soft cap fold + the kSoftcap variant)
# Rebuild any that is missing here with scripts/ab_wheel.sh (the patches:
# `git show 5d8a050:pending/sm90-fwd-<name>.patch > /tmp/<name>.patch`).
#   bash pending/session31.sh ab
# $OUT/ab_combo.md: before vs main, two rounds; ab_plain.md and ab_feat.md:
# each patch alone on the cases it targets, one round.
set -uo pipefail
stage=${1:?usage: bash pending/session31.sh ab}
export OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
t1024="--impl jax_flash --head-dim 64 128 256 --seqlen 1024 --causal 0 1 --cotangent random"
feat="--impl jax_flash --head-dim 128 --seqlen 4096 --cotangent random --cases plain:1 segments:1 window:1 softcap:0 prefix_lm_softcap:0 dropout:0 plain:0"
case "$stage" in
  ab)
    AB_DIRS="ab/before ab/main" AB_ROUNDS=2 BENCH_ARGS="$t1024;$feat" bash scripts/gpu_ab.sh
    cp "$OUT/ab.md" "$OUT/ab_combo.md"
    AB_DIRS="ab/before ab/tma ab/ud" AB_ROUNDS=1 BENCH_ARGS="$t1024" bash scripts/gpu_ab.sh
    cp "$OUT/ab.md" "$OUT/ab_plain.md"
    AB_DIRS="ab/before ab/rows ab/cap ab/caponly" AB_ROUNDS=1 BENCH_ARGS="$feat" bash scripts/gpu_ab.sh
    cp "$OUT/ab.md" "$OUT/ab_feat.md"
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
