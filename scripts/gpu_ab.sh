#!/usr/bin/env bash
# A/B of kernel versions in one device call: builds each source tree named in
# AB_DIRS (made here with scripts/export_refs.sh; ab/ is git-ignored, so pass
# carry=["ab"] to the device run), or installs the wheel a folder of AB_DIRS
# holds instead (built here by scripts/ab_wheel.sh: no compile time on the
# device; ab_wheel.sh copies the variant's tests/ beside it for AB_TESTS),
# runs the same benchmark points (BENCH_ARGS;
# several sets separated by ';'; AB_ROUNDS rounds, default 1) with each, and
# optionally each tree's tests against its own build (AB_TESTS: test files
# relative to the tree, e.g. "tests/test_attention.py"; AB_K: a pytest -k
# expression; AB_TEST_DIRS: only these trees, e.g. the candidate when the
# base was tested before; AB_PYTEST_ARGS: more pytest arguments, e.g.
# "-n 12"). Writes $OUT/ab.md (the comparison) and $OUT/ab.log.
#
#   AB_DIRS="ab/main ab/wip-x" BENCH_ARGS="--impl jax_flash --head-dim 128 --seqlen 16384 --causal 0" \
#     bash scripts/gpu_ab.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
LOG="$OUT/ab.log"
root=$(pwd)
export XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$LOG"
# Builds, then tests, run side by side (compile-bound, 16 host cores); the
# benchmarks run one tree at a time so their timings do not disturb each other.
dirs=(${AB_DIRS:?set AB_DIRS to source trees, e.g. ab/main ab/wip-x})
export CMAKE_BUILD_PARALLEL_LEVEL=$(( 16 / ${#dirs[@]} > 2 ? 16 / ${#dirs[@]} : 2 ))
start=$(date +%s)
for dir in "${dirs[@]}"; do
  name=$(basename "$dir")
  wheel=$(ls "$root/$dir"/*.whl 2> /dev/null | head -1)
  if [ -n "$wheel" ]; then  # built on the CPU machine (scripts/ab_wheel.sh): installed, not compiled
    python3 -m pip install --no-deps --target "/tmp/ab_site/$name" "$wheel" \
      > "/tmp/ab_build_$name.log" 2>&1 || touch "/tmp/ab_build_$name.failed" &
  else
    python3 -m pip install --no-build-isolation --no-deps --target "/tmp/ab_site/$name" "$root/$dir" \
      > "/tmp/ab_build_$name.log" 2>&1 || touch "/tmp/ab_build_$name.failed" &
  fi
done
wait
echo "== builds: $(( $(date +%s) - start )) s" | tee -a "$LOG"
built=()
for dir in "${dirs[@]}"; do
  name=$(basename "$dir")
  if [ -e "/tmp/ab_build_$name.failed" ]; then
    echo "== $name: build FAILED" | tee -a "$LOG"; grep -E "error|Error" "/tmp/ab_build_$name.log" | head -20 >> "$LOG"
  else
    built+=("$dir")
  fi
done
if [ -n "${AB_TESTS:-}" ]; then
  # Each tree's tests against its own build; from /tmp so the tree is not imported.
  start=$(date +%s)
  tested=()
  for dir in "${built[@]}"; do
    [[ -z "${AB_TEST_DIRS:-}" || " $AB_TEST_DIRS " == *" $dir "* ]] && tested+=("$dir")
  done
  for dir in "${tested[@]}"; do
    name=$(basename "$dir")
    paths=()
    for t in $AB_TESTS; do paths+=("$root/$dir/$t"); done
    (cd /tmp && PYTHONPATH="/tmp/ab_site/$name" python3 -m pytest -q "${paths[@]}" ${AB_K:+-k "$AB_K"} ${AB_PYTEST_ARGS:-} \
      > "/tmp/ab_pytest_$name.log" 2>&1) &
  done
  wait
  echo "== tests: $(( $(date +%s) - start )) s" | tee -a "$LOG"
  for dir in "${tested[@]}"; do
    name=$(basename "$dir")
    echo "   $name pytest: $(tail -1 /tmp/ab_pytest_$name.log)" | tee -a "$LOG"
    grep -E "^FAILED" "/tmp/ab_pytest_$name.log" | head -10 | tee -a "$LOG"
  done
fi
results=()
if [ -n "${BENCH_ARGS:-}" ]; then
  # BENCH_ARGS may hold several argument sets separated by ';' (e.g. a plain
  # grid and one feature point); each tree runs all of them. AB_ROUNDS=N
  # repeats the trees N times, every other round in reverse order, so drift
  # of the GPU's clocks over the call falls on every tree alike; the table
  # shows each point's mean and spread over the rounds.
  IFS=';' read -ra bench_sets <<< "$BENCH_ARGS"
  declare -A jsons_of
  for round in $(seq 1 "${AB_ROUNDS:-1}"); do
    order=("${built[@]}")
    if [ $((round % 2)) -eq 0 ]; then
      order=(); for ((j = ${#built[@]} - 1; j >= 0; j--)); do order+=("${built[$j]}"); done
    fi
    for dir in "${order[@]}"; do
      name=$(basename "$dir")
      echo "== $name: benchmark, round $round" >> "$LOG"
      for i in "${!bench_sets[@]}"; do
        out="/tmp/ab_out/$name/r$round/$i"
        (cd /tmp && PYTHONPATH="/tmp/ab_site/$name" python3 -m jax_flash.benchmark ${bench_sets[$i]} --out "$out" \
          >> "$LOG" 2>&1)
        [ -f "$out/results.json" ] && jsons_of[$name]+="${jsons_of[$name]:+,}$out/results.json"
      done
      # Partial comparison after each tree, so a call cut off by its limit still reports.
      results=()
      for d in "${built[@]}"; do
        n=$(basename "$d")
        [ -n "${jsons_of[$n]:-}" ] && results+=("$n=${jsons_of[$n]}")
      done
      [ ${#results[@]} -gt 0 ] && python3 "$root/scripts/compare_bench.py" "${results[@]}" > "$OUT/ab.md"
    done
  done
fi
[ ${#results[@]} -gt 0 ] && cat "$OUT/ab.md"
