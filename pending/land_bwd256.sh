#!/usr/bin/env bash
# Lands the sm90 backward at head dim 256 once `bwd256` (its tests and its
# timing beside FA3, cuDNN and sm80's backward) and `bwd256_suite` (the
# whole suite and racecheck / synccheck against ab/bwd256) have passed:
# pending/sm90-bwd-256.patch, -deterministic and -operand-split (rebased
# onto ebf7bbc, the bias tiles' main, in session 37: the launch site's
# hand resolution is ab/stack_resolved_bias/bwd_launch.cuh's), and, with
# OPERANDS=1 (session 37 timed ab/bwd256ops 1.02-1.04x the query halves
# at T >= 4096), ab-bwd256-operands-default.patch. One commit; the
# patch files removed. Run here on a clean main. Then
# record the numbers in docs/perf_history.md and docs/PERF.md, and run
# .ci/run on a fresh clone (the 256 units add to CI's compile time: report
# it).
#   OPERANDS=0|1 bash pending/land_bwd256.sh "bwd256_suite: N passed, M skipped; racecheck 0, synccheck 0"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
[ -z "$(git status --porcelain -- ffi tests jax_flash scripts)" ] || { echo "main has uncommitted code changes"; exit 1; }
summary=${1:?usage: OPERANDS=0|1 bash pending/land_bwd256.sh "the suite's result"}
patches=(sm90-bwd-256 sm90-bwd-256-deterministic sm90-bwd-256-operand-split)
for p in "${patches[@]}"; do git apply --3way "pending/$p.patch"; done
if [ "${OPERANDS:-0}" = 1 ]; then git apply --3way pending/ab-bwd256-operands-default.patch; fi
if git diff --name-only --diff-filter=U | grep -q .; then
  echo "conflicts: resolve them (ab/stack_resolved_bias/bwd_launch.cuh has the launch site's), then commit by hand"
  exit 1
fi
git rm -q pending/sm90-bwd-256.patch pending/sm90-bwd-256-deterministic.patch pending/sm90-bwd-256-operand-split.patch \
  pending/ab-bwd256-operands-default.patch
git add -A ffi tests jax_flash scripts CMakeLists.txt
git commit -qm "sm90: the backward at head dim 256 (default and deterministic) lands

$summary."
git log --oneline -1
