#!/usr/bin/env bash
# Lands session 36's stack on main once `stack36_suite` has passed on the
# device (the whole suite, the check programs' bias cases, racecheck and
# synccheck against ab/stack36): the bias tiles, the bias's batch-inner
# order and the 7-round Philox, applied in that order (the tree ab/stack36
# was built from), one commit, the three patch files removed. Run here on
# a clean main; then record the suite's numbers in docs/perf_history.md and
# docs/PERF.md, and run .ci/run on a fresh clone before the session ends.
#   bash pending/land_stack36.sh "suite: N passed, M skipped; racecheck 0, synccheck 0"
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
[ -z "$(git status --porcelain -- ffi tests jax_flash scripts)" ] || { echo "main has uncommitted code changes"; exit 1; }
summary=${1:?usage: bash pending/land_stack36.sh "the suite's result"}
for p in sm90-bias-tiles sm90-fwd-bias-batch-inner dropout-philox7; do
  git apply "pending/$p.patch"
done
git rm -q pending/sm90-bias-tiles.patch pending/sm90-fwd-bias-batch-inner.patch pending/dropout-philox7.patch
git add -A ffi tests jax_flash scripts docs README.md CMakeLists.txt
git commit -qm "sm90: the bias through shared memory (kMasksBiasTiles), its batch-inner order, and the 7-round Philox land

Measured in session 36 on an H100 (perf_history v34): bias at 128 0.57 / 0.70 -> 0.77 / 0.83 of plain
non-causal, dropout 1.05-1.17x. stack36_suite: $summary."
git log --oneline -1
