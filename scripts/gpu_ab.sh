#!/usr/bin/env bash
# A/B of kernel versions in one device call: builds each source tree named in
# AB_DIRS (made here with scripts/export_refs.sh; ab/ is git-ignored, so pass
# carry=["ab"] to the device run), runs the same benchmark points (BENCH_ARGS)
# with each, and optionally each tree's tests against its own build (AB_TESTS:
# test files relative to the tree, e.g. "tests/test_attention.py"; AB_K: a
# pytest -k expression). Writes $OUT/ab.md (the comparison) and $OUT/ab.log.
#
#   AB_DIRS="ab/main ab/wip-x" BENCH_ARGS="--impl jax_flash --head-dim 128 --seqlen 16384 --causal 0" \
#     bash scripts/gpu_ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
LOG="$OUT/ab.log"
root=$(pwd)
export CMAKE_BUILD_PARALLEL_LEVEL=16 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$LOG"
results=()
for dir in ${AB_DIRS:?set AB_DIRS to source trees, e.g. ab/main ab/wip-x}; do
  name=$(basename "$dir")
  site=/tmp/ab_site/$name
  start=$(date +%s)
  if ! python3 -m pip install --no-build-isolation --no-deps --target "$site" "$root/$dir" \
      > "/tmp/ab_build_$name.log" 2>&1; then
    echo "== $name: build FAILED" | tee -a "$LOG"; tail -30 "/tmp/ab_build_$name.log" >> "$LOG"
    continue
  fi
  echo "== $name: built in $(( $(date +%s) - start )) s" | tee -a "$LOG"
  if [ -n "${AB_TESTS:-}" ]; then
    # Tests of that tree against its own build; from /tmp so the tree is not imported.
    paths=()
    for t in $AB_TESTS; do paths+=("$root/$dir/$t"); done
    (cd /tmp && PYTHONPATH="$site" python3 -m pytest -q "${paths[@]}" ${AB_K:+-k "$AB_K"} \
      > "/tmp/ab_pytest_$name.log" 2>&1)
    echo "   pytest: $(tail -1 /tmp/ab_pytest_$name.log)" | tee -a "$LOG"
    grep -E "^FAILED" "/tmp/ab_pytest_$name.log" | head -10 >> "$LOG"
  fi
  if [ -n "${BENCH_ARGS:-}" ]; then
    (cd /tmp && PYTHONPATH="$site" python3 -m jax_flash.benchmark $BENCH_ARGS --out "/tmp/ab_out/$name" \
      >> "$LOG" 2>&1)
    [ -f "/tmp/ab_out/$name/results.json" ] && results+=("$name=/tmp/ab_out/$name/results.json")
  fi
done
[ ${#results[@]} -gt 0 ] && python3 "$root/scripts/compare_bench.py" "${results[@]}" | tee "$OUT/ab.md"
