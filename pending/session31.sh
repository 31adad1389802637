#!/usr/bin/env bash
# The device plan, in order (each call ~4-8 minutes of wall time; the
# first adds ~85 s of cold start; a warm machine goes back after 30 s
# idle, so issue the calls back to back). Session 42 (perf_history.md
# v40, on an H100: no H200 came) ran detdefer_ab, bias256_debug,
# detdefer_suite (the whole suite on main + the deferred deterministic
# turn, which landed), check256, the grid's 128 / 256 points and the long
# sequences. Lessons kept: a failed start costs 90-180 s, a refusal
# while none_now holds 15 s: read `status` first and wait out none_now;
# when the kind flips to nvidia-h100-x1, a call without `kind` takes the
# H100; once a machine is warm, issue the next call at once. Next:
#   1. bash pending/session31.sh biasbwd256_suite   carry ab/biasbwd256   (~9.5 min)
#      (the whole suite on main + the 256 forward's bias tiles + the proxy
#      fence + the 256 backward's bias variants; its test_bias16 runs the
#      256 tiles over 16 key blocks, where they failed at random without the
#      fence. Green: land pending/sm90-fwd-bias-256.patch,
#      sm90-bias-tiles-proxy-fence.patch, sm90-bwd-bias-256.patch; red in
#      the tiles only: `tiles256` on ab/bias256fence says whether the fence
#      is the fix)
#   2. bash pending/session31.sh bias_ab det256_parts   carry ab/main42 ab/biasbwd256 ab/detdefer ab/detpassatsend ab/detnowait ab/detnowaitnopass   (~10 min)
#      (the fence's cost at 64 / 128, the 256 forward's tiles and backward's
#      bias against sm80's; the deterministic 256's parts)
#   3. bash pending/session31.sh grid36   carry ab/main42 .peers   (~9 min, on an H200)
#   4. bash pending/session31.sh long_profile det256_profile   carry ab/main42   (~8 min)
#   5. bash pending/session31.sh features36 / e2e   carry ab/main42 .peers
#   6. bash pending/session31.sh softcap_poly       carry ab/main ab/plaintx ab/poly4 ab/poly2
# (30 device minutes a session: 1-2 fit one session with their suites.)
# ab/main is 78e438f (ab24e31's kernels; softcap_poly's baseline, the
# poly wheels being on it), the rest named here on older mains (good for
# timing what they change; a suite that lands a patch runs on a wheel of
# that patch on the main it lands on).
#
# The timing owed for session 30's five forward patches, landed in 9f8256b
# on their correctness checks alone (README.md): one device call, carry
# ["ab/before", "ab/main", "ab/tma", "ab/ud", "ab/rows", "ab/cap",
# "ab/caponly"] (~56 MB), ~8 minutes:
#   ab/before   5d8a050's wheel (before the patches)
#   ab/main     main's (all five; rebuilt on e962199 in session 32, the
#               same CUDA sources as 9f8256b, its benchmark recording
#               fwd_bwd_temp_bytes)
#   ab/tma ab/ud ab/rows ab/cap ab/caponly   5d8a050 + one patch each
#               (caponly: the soft cap fold + the kSoftcap variant)
# Rebuild any that is missing here with scripts/ab_wheel.sh (the patches:
# `git show 5d8a050:pending/sm90-fwd-<name>.patch > /tmp/<name>.patch`).
#   bash pending/session31.sh ab
#
# The 256 backward (pending/sm90-bwd-256.patch, then its deterministic
# variant pending/sm90-bwd-256-deterministic.patch and the operand-split
# candidate pending/sm90-bwd-256-operand-split.patch; wheel ab/bwd256 =
# main + the three, `bash scripts/ab_wheel.sh bwd256 pending/sm90-bwd-256.patch
# pending/sm90-bwd-256-deterministic.patch
# pending/sm90-bwd-256-operand-split.patch` here; ab/bwd256plain = main +
# the first alone; ab/bwd256ops = main + all three 256 patches with the
# operand split made the default, pending/ab-bwd256-operands-default.patch),
# two calls, carry ["ab/bwd256", "ab/bwd256ops", ".peers"] (~35 MB):
#   bash pending/session31.sh bwd256         # ~6 min
#   bash pending/session31.sh bwd256_suite   # ~9 min (carry ["ab/bwd256"])
# First its own 256 tests (fast, so that a wrong kernel shows in a minute),
# then bwd256 beside FA3, cuDNN and sm80's backward at 256
# (jax_flash_sm80), the operand split's; then the whole suite against the
# wheel, and racecheck and synccheck on the 256 kernels (after the suite:
# a sanitizer that outlives its limit must not share the GPU with timings).
# $OUT/ab_combo.md: before vs main, two rounds; ab_plain.md and ab_feat.md:
# each patch alone on the cases it targets, one round.
set -uo pipefail
# Several stages run in one call in the order given (each call starts cold,
# ~85 s of the budget): e.g. `bash pending/session31.sh bwd256 dethelper`.
[ $# -gt 0 ] || { echo "usage: bash pending/session31.sh STAGE... (ab bias_ab long_profile det256_parts biasbwd256_ab biasbwd256_suite fence_ab bias256fence_suite tiles256 check256 detdefer_suite detdefer_ab main_suite bias256_debug combo41_suite combo41_ab det256_profile dethelper_suite stack40_ab stack40_suite rangebits bwd256 bwd256_suite dethelper dethelper_ab e2e packed_profile dropout_profile softcap_poly classwarp classwarp_suite masks256 masks256_suite epi256 epi256_suite features36 grid36 packed_fwd_profile sanitize_all stepclass stepclass_suite t1024_profile window_profile)"; exit 2; }
export OUT=${OUT:-/tmp/gpu_out}
# Main's wheel (scripts/ab_wheel.sh NAME on main's HEAD): the harness,
# profile and baseline stages time it.
M=${MAIN_WHEEL:-main42}
mkdir -p "$OUT"
t1024="--impl jax_flash --head-dim 64 128 256 --seqlen 1024 --causal 0 1 --cotangent random"
feat="--impl jax_flash --head-dim 128 --seqlen 4096 --cotangent random --cases plain:1 segments:1 window:1 softcap:0 prefix_lm_softcap:0 dropout:0 plain:0"
# The whole suite against wheel ab/NAME within LIMIT seconds (12 workers),
# its log in $OUT/pytest_NAME.log; PYTHONPATH stays on the wheel for what
# follows (the sanitizers).
suite_against() {
  local name=$1 limit=$2 root
  root=$(pwd)
  python3 -m pip install -q --no-deps --target /tmp/ab_site/$name ab/$name/*.whl || exit 1
  export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/ab_site/$name
  (cd /tmp && timeout "$limit" python3 -m pytest -q -n 12 -p no:cacheprovider "$root/ab/$name/tests" \
    > "$OUT/pytest_$name.log" 2>&1)
  tail -3 "$OUT/pytest_$name.log"; grep "^FAILED" "$OUT/pytest_$name.log" | head -20
}
# suite_against NAME LIMIT, then racecheck and synccheck on the sm90
# kernels (with the wheel's own sanitize_kernels.sh) if the call is still
# under START seconds, until 570 s (a sanitizer that outlives the call's
# limit must not share the GPU with timings).
suite_then_sanitizers() {
  local name=$1 limit=$2 start=$3
  suite_against "$name" "$limit"
  if [ $SECONDS -lt "$start" ]; then
    SANITIZE_KERNELS=sm90 SANITIZE_TOOLS="racecheck synccheck" \
      timeout $((${SANITIZE_DEADLINE:-570} - SECONDS)) bash "ab/$name/scripts/sanitize_kernels.sh" 2>&1 | tail -6
  else
    echo "the sanitizers left for a later call (${SECONDS} s used)"
  fi
}
# Some of wheel ab/NAME's own tests against it within LIMIT seconds (12
# workers, stopping at the first failure): the test files named, the tests
# -k EXPR selects; a failure or the limit ends the call (pipefail).
tests_against() {
  local name=$1 limit=$2 expr=$3 root files=()
  shift 3
  root=$(pwd)
  for f in "$@"; do files+=("$root/ab/$name/tests/$f"); done
  python3 -m pip install -q --no-deps --target /tmp/ab_site/$name ab/$name/*.whl || exit 1
  (cd /tmp && XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/ab_site/$name timeout "$limit" \
    python3 -m pytest -q -x -n 12 -p no:cacheprovider "${files[@]}" -k "$expr" 2>&1 | tail -6) || exit 1
}
# Nsight Compute with source counters (scripts/profile_features.sh) on
# PROFILE_CASES against wheel ab/NAME, within LIMIT seconds a case.
profile_against() {
  local name=$1 limit=$2 cases=$3
  python3 -m pip install -q --no-deps --target /tmp/ab_site/$name ab/$name/*.whl || exit 1
  PYTHONPATH=/tmp/ab_site/$name SKIP_BUILD=1 PROFILE_SOURCE=1 PROFILE_TIMEOUT=$limit PROFILE_CASES="$cases" \
    bash scripts/profile_features.sh 2>&1 | tail -70
}
for stage in "$@"; do
echo "== stage $stage ($(date +%T))"
case "$stage" in
  ab|ab_parts)
    # (Session 32's estimate: ~7 s a case and wheel, ~6 min for before /
    # main over two rounds, ~5 min for the per-patch ablations; so `ab`
    # runs those only while the call's 10 minutes allow, and `ab_parts`
    # runs them alone.)
    if [ "$stage" = ab ]; then
      AB_DIRS="ab/before ab/main" AB_ROUNDS=2 BENCH_ARGS="$t1024;$feat" bash scripts/gpu_ab.sh
      cp "$OUT/ab.md" "$OUT/ab_combo.md"
    fi
    if [ "$stage" = ab_parts ] || [ $SECONDS -lt 330 ]; then
      AB_DIRS="ab/before ab/tma ab/ud" AB_ROUNDS=1 BENCH_ARGS="$t1024" bash scripts/gpu_ab.sh
      cp "$OUT/ab.md" "$OUT/ab_plain.md"
    else
      echo "ablations of the plain cases left for stage ab_parts (${SECONDS} s used)"
    fi
    if [ "$stage" = ab_parts ] || [ $SECONDS -lt 400 ]; then
      AB_DIRS="ab/before ab/rows ab/cap ab/caponly" AB_ROUNDS=1 BENCH_ARGS="$feat" bash scripts/gpu_ab.sh
      cp "$OUT/ab.md" "$OUT/ab_feat.md"
    else
      echo "ablations of the feature cases left for stage ab_parts (${SECONDS} s used)"
    fi
    ;;
  bwd256)
    root=$(pwd)
    for w in main bwd256 bwd256ops; do
      python3 -m pip install -q --no-deps --target /tmp/ab_site/$w ab/$w/*.whl || exit 1
    done
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    (cd /tmp && PYTHONPATH=/tmp/ab_site/bwd256 timeout 200 python3 -m pytest -q -x -n 8 -p no:cacheprovider \
      "$root/ab/bwd256/tests/test_attention.py" -k "256" 2>&1 | tail -15)
    (cd /tmp && PYTHONPATH=/tmp/ab_site/bwd256ops timeout 150 python3 -m pytest -q -x -n 8 -p no:cacheprovider \
      "$root/ab/bwd256ops/tests/test_attention.py" -k "256 and not deterministic" 2>&1 | tail -4)
    export PYTHONPATH=/tmp/ab_site/bwd256:$root/.peers LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
    (cd /tmp && python3 -m jax_flash.benchmark --impl jax_flash jax_flash_sm80 jax_flash_deterministic fa3 cudnn --head-dim 256 \
      --seqlen 1024 4096 16384 --causal 0 1 --cotangent random --out "$OUT/bench_bwd256" 2>&1 | grep "^|" | tail -36)
    export PYTHONPATH=/tmp/ab_site/bwd256ops:$root/.peers
    (cd /tmp && python3 -m jax_flash.benchmark --impl jax_flash --head-dim 256 --seqlen 1024 4096 16384 \
      --causal 0 1 --cotangent random --out "$OUT/bench_bwd256ops" 2>&1 | grep "^|" | tail -8)
    ;;
  bwd256_suite)
    # (ab/bwd256ops: main ebf7bbc + the three 256 patches + the operand
    # split as the default, what lands with OPERANDS=1; rebuilt in session
    # 37.)
    # (Session 38: BWD256_WHEEL=bwd256v38, the three + the flip rebased
    # onto 6723446, the step class and staged epilogue's main; the 256
    # kernel keeps the direct dK / dV stores, StoreKeyGradient.)
    w=${BWD256_WHEEL:-bwd256ops}
    suite_against $w 400
    # The sanitizers on the 256 kernels (after the suite: a sanitizer that
    # outlives its limit must not share the GPU with timings).
    # (memcheck in a later call: three tools did not fit beside the suite.)
    # (Session 38: synccheck first. On bwd256v38 it found the operand
    # split's warpgroups meeting at kPBarrier / kDsBarrier from different
    # bar.sync instructions, the .aligned form's misuse: bwd256v38b uses
    # barrier.sync there; racecheck crashed, a segfault of the tool's run.)
    SANITIZE_KERNELS=256Kernel SANITIZE_TOOLS="${BWD256_TOOLS:-synccheck racecheck}" \
      timeout $((${BWD256_DEADLINE:-570} - SECONDS)) bash ab/$w/scripts/sanitize_kernels.sh 2>&1 | tail -8
    ;;
  dethelper)
    # pending/sm90-bwd-det-helper.patch's check program, built here (carry
    # ["ab/dethelper"]; rebuild: from a tree with the patch applied,
    # `OUT=$PWD/ab/dethelper STEP=build bash scripts/sm90_bwd_compare_check.sh
    # deterministic`, 15-30 s on 2 cores): every case bit for bit run to run
    # and against the default, then the timed table with the kHelperWarp
    # column ("helper") beside kAtSend's (the package's).
    # The quick cases first under a short limit (a hang in the new
    # handoff then costs 2 minutes, not 9), then the whole table.
    OUT=ab/dethelper STEP=run ARGS=--quick CHECK_TIMEOUT=120 bash scripts/sm90_bwd_compare_check.sh deterministic \
      2>&1 | tail -20 || exit 1
    if [ $SECONDS -lt 400 ]; then
      OUT=ab/dethelper STEP=run CHECK_TIMEOUT=$((560 - SECONDS)) bash scripts/sm90_bwd_compare_check.sh deterministic \
        2>&1 | tail -40
    else
      echo "the full table left for a later call (${SECONDS} s used); dethelper_ab times it through JAX"
    fi
    ;;
  e2e)
    # Issue 21's end to end and its memory line, on main's wheel (carry
    # ["ab/main", ".peers"]; rebuild ab/main on main first: its benchmark
    # records fwd_bwd_temp_bytes since session 32), ~6 min: the Flax example
    # (8 layers, width 512, head dim 64, bf16, 100 steps) with jax_flash
    # against --attention cudnn at T = 2048 and 8192 (tokens/s, loss
    # curves within 2%), then T = 131072 and 262144 causal (B = 1, N = 16,
    # H = 128: issue 20 and 21 ask 0.9x of FA3 there) beside FA3 and cuDNN: time
    # and XLA's temporary allocation of each one's fwd+bwd.
    root=$(pwd)
    python3 -m pip install -q --no-deps --target /tmp/ab_site/$M ab/$M/*.whl || exit 1
    export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/ab_site/$M:$root/.peers
    export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
    ex="--depth 8 --width 512 --heads 8 --steps 100 --log-every 10 --dtype bfloat16 --no-progress --sample-chars 0"
    for tb in 2048:8 8192:2; do
      (cd /tmp && python3 "$root/scripts/train_compare.py" --runs one attention=cudnn --timeout 200 \
        --out "$OUT/e2e_${tb%%:*}" --json "$OUT/e2e_${tb%%:*}.json" -- --seq-len ${tb%%:*} --batch-size ${tb##*:} $ex \
        2>&1 | grep -v "^ *[0-9]* " | tail -4)
    done
    (cd /tmp && python3 -m jax_flash.benchmark --impl jax_flash fa3 cudnn --head-dim 128 --seqlen 131072 262144 \
      --tokens 131072 --width 2048 --causal 1 --iters 3 --cotangent random --memory --out "$OUT/bench_long" 2>&1 | tail -16)
    ;;
  dethelper_ab)
    # The helper warp through JAX (issue 21 measures deterministic=True
    # against the default there; carry ["ab/stack36", "ab/dethelperjax"],
    # ~5 min): main (ebf7bbc's code) against main + sm90-bwd-det-helper.patch
    # (rebased onto ebf7bbc, its wheel rebuilt in session 37) with the
    # helper as the package's handoff (ab-det-helper-default.patch), each
    # timing jax_flash and jax_flash_deterministic, two rounds; the
    # deterministic / default ratio per wheel is the target's (>= 0.87).
    AB_DIRS="ab/$M ab/${DETHELPER_WHEEL:-dethelperjax41}" AB_ROUNDS=2 BENCH_ARGS="--impl jax_flash jax_flash_deterministic \
      --head-dim 64 128 --seqlen 1024 4096 --causal 0 1 --cotangent random" bash scripts/gpu_ab.sh
    ;;
  softcap_poly)
    # pending/sm90-fwd-softcap-poly.patch (session 33, after the plain
    # transforms): part of kPlainSoftcap's exponentials on the FMA pipe
    # (PolyExp2, session 29's, there measured slower on kMasksSoftcap's
    # issue-bound loop), carry ["ab/main", "ab/plaintx", "ab/poly4",
    # "ab/poly2"], ~6 min: the soft-cap tests against each poly wheel,
    # then main, the plain transforms alone, and every 4th / every 2nd n8
    # tile's exponentials polynomial, one round, plain and soft-cap cases at
    # 64 and 128 (issue 19: soft cap <= 1.15x of plain's time).
    for w in poly4 poly2; do
      tests_against $w 150 "soft_cap or softcap or poly_exp2" test_features.py test_attention.py test_poly_exp2.py
    done
    AB_DIRS="ab/main ab/plaintx ab/poly4 ab/poly2" AB_ROUNDS=1 BENCH_ARGS="--impl jax_flash --head-dim 64 128 \
      --seqlen 4096 --cotangent random --cases plain:0 plain:1 softcap:0 softcap:1" bash scripts/gpu_ab.sh
    ;;
  dropout_profile)
    # Where the dropout kernels' time goes (issue 19: the forward 0.68 of
    # plain at 128 with the 7-round Philox, target 0.77; carry
    # ["ab/stack36"], ~5 min): stall reasons per instruction of the dropout
    # forward and backward and of the plain forward beside them (the
    # non-causal B = 4 T = 4096 cases), for the next step: whether the
    # forward's softmax phase is issue-bound (fewer Philox calls: 8-bit
    # thresholds, a semantic change) or latency-bound (the next block's
    # keep bits made while the warpgroup waits on its own products).
    profile_against $M 100 "dropout:ForwardKernel default:ForwardKernel dropout_grad:BackwardKernel"
    ;;
  packed_profile)
    # Issue 19's largest gap, the packed documents' backward (0.55 of plain
    # causal against FA3's 0.69; plain at T = 1024 causal, the same tiles,
    # 0.65): Nsight Compute with source counters on main's sm90 backward,
    # packed_grad against plain_grad_1024 (carry ["ab/main"], ~3 min; after
    # bwd256 in the same call, which installs main's wheel).
    profile_against main 80 "packed_grad:BackwardKernel plain_grad_1024:BackwardKernel"
    ;;
  features36)
    # Issue 19's table on one harness run (carry ["ab/main41", ".peers"],
    # ~6 min): --preset features with cuDNN and FA3 beside, on main's wheel.
    root=$(pwd)
    python3 -m pip install -q --no-deps --target /tmp/ab_site/$M ab/$M/*.whl || exit 1
    export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/ab_site/$M:$root/.peers
    export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
    (cd /tmp && timeout 540 python3 -m jax_flash.benchmark --preset features --impl jax_flash cudnn fa3 \
      --cotangent random --out "$OUT/features36" 2>&1 | tail -40)
    ;;
  grid36)
    # Issues 20 and 21's closing run (carry ["ab/main41", ".peers"], ~9
    # min): the standard grid (H = 64 / 128 / 256, T = 1024 / 4096 / 16384,
    # causal and not, B = 16384 / T, N = 2048 / H) beside cuDNN and FA3 in
    # one process, then T = 131072 and 262144 causal with the memory line.
    # On main's wheel (since 87b700f the 256 backward is sm90's).
    root=$(pwd)
    python3 -m pip install -q --no-deps --target /tmp/ab_site/$M ab/$M/*.whl || exit 1
    export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/ab_site/$M:$root/.peers
    export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
    (cd /tmp && timeout 380 python3 -m jax_flash.benchmark --impl jax_flash cudnn fa3 --head-dim 64 128 256 \
      --seqlen 1024 4096 16384 --causal 0 1 --cotangent random --out "$OUT/grid36" 2>&1 | tail -40)
    (cd /tmp && timeout $((560 - SECONDS)) python3 -m jax_flash.benchmark --impl jax_flash fa3 cudnn --head-dim 128 \
      --seqlen 131072 262144 --tokens 131072 --width 2048 --causal 1 --iters 3 --cotangent random --memory \
      --out "$OUT/long36" 2>&1 | tail -12)
    ;;
  packed_fwd_profile)
    # Issue 19's packed and window forward (0.91x / 1.00x of FA3, v35):
    # the same profile as packed_profile's, on the forward kernel, packed
    # documents against plain T = 1024 causal (the same tiles) and one
    # document (carry ["ab/stack36"], ~3 min): whether the forward's
    # per-block policy (FeatureBlockMask) costs what the backward's did.
    profile_against $M 80 "packed:ForwardKernel plain_1024:ForwardKernel one_doc_1024:ForwardKernel"
    ;;
  stepclass)
    # Session 37's two backward candidates (carry ["ab/stack36",
    # "ab/stepclass", "ab/epi"], ~8 min): ab/stepclass = main (ebf7bbc,
    # whose code ab/stack36 is) + pending/sm90-bwd-step-class.patch (the
    # row-statistics warp classes each consumer warp's step, hidden /
    # visible / check, from the mask policy a step or two ahead; the
    # consumers skip FeatureStepMask's ~300 instructions per step where no
    # element needs a check); ab/epi = that + pending/sm90-bwd-staged-epilogue.patch
    # (dK and dV through the K / V tiles' shared memory and 16-byte
    # stores; the last reduce's wait for its read only). Session 37's
    # profiles: main's packed backward 897 instructions per consumer warp
    # and step against plain's ~540, 1.25x its time; the T = 1024 causal
    # backward's epilogue 14% of its stall samples (the store queue).
    # The backward feature tests against ab/epi (both patches), then one
    # round of each wheel: packed and window (issue 19: bwd 0.55 / 0.52 of
    # plain, FA3 0.62 / 0.59), key padding and key lengths (their steps
    # classed by the keys: bwd 0.83 / 0.86 of plain, target 0.9), plain at
    # T = 1024 (issue 21: 0.87-0.89x FA3) and 4096, at 128 and 64.
    tests_against epi 200 "" test_features.py test_bias16.py test_sm90_dropout.py test_sinks.py
    AB_DIRS="ab/stack36 ab/stepclass ab/epi" AB_ROUNDS=1 BENCH_ARGS="--impl jax_flash --head-dim 128 64 --seqlen 4096 \
      --cotangent random --cases segments:1 window:1 mask:0 kv_lengths:0 plain:1;--impl jax_flash --head-dim 128 64 --seqlen 1024 \
      --causal 0 1 --cotangent random" bash scripts/gpu_ab.sh
    ;;
  stepclass_suite)
    # Once `stepclass` has timed them faster (carry ["ab/epi",
    # "ab/epi_check"], ~9 min;
    # ab/stepclass instead if only the step class won): the whole suite
    # against both patches, then racecheck and synccheck on the sm90
    # kernels (the class bytes are a new producer -> consumer handoff
    # through shared memory, the staged dK / dV a reuse of the K / V
    # tiles); all pass: land them. First the backward check program's
    # feature cases (ab/epi_check: built here in session 37 from main +
    # both patches, `STEP=build bash scripts/sm90_bwd_check.sh`; carry it
    # too): every feature variant against its float64 reference in C++,
    # and the kernel alone timed beside the former lean-dQ schedule.
    OUT=ab/epi_check STEP=run ARGS="--features --quick" CHECK_TIMEOUT=100 bash scripts/sm90_bwd_check.sh 2>&1 \
      | grep -v PASS | tail -25
    echo "backward check rc ${PIPESTATUS[0]}"
    suite_then_sanitizers ${STEPCLASS_WHEEL:-epi} 360 480
    ;;
  t1024_profile)
    # Issue 20's last forward gap, H = 128 at T = 1024 (0.86x / 0.88x of
    # FA3 non-causal / causal, v31; carry ["ab/main", ".peers"], ~4 min):
    # Nsight Compute on our plain forward (plain_1024: B = 16, causal) with
    # source counters, then on FA3's forward kernel at the same shape (the
    # benchmark's fa3 call; its kernels are the ones named *Fwd*), the same
    # sections, for the cycle, issue and stall comparison.
    root=$(pwd)
    python3 -m pip install -q --no-deps --target /tmp/ab_site/$M ab/$M/*.whl || exit 1
    PYTHONPATH=/tmp/ab_site/$M SKIP_BUILD=1 PROFILE_SOURCE=1 PROFILE_TIMEOUT=100 \
      PROFILE_CASES="plain_1024:ForwardKernel" bash scripts/profile_features.sh 2>&1 | tail -40
    export PYTHONPATH=/tmp/ab_site/$M:$root/.peers XLA_PYTHON_CLIENT_PREALLOCATE=false
    export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
    (cd /tmp && timeout 200 ncu --clock-control none --kernel-name regex:"Fwd|fwd" --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section InstructionStats \
      --section SchedulerStats --section LaunchStats -o /tmp/profile_logs/fa3_1024 \
      python3 -m jax_flash.benchmark --impl fa3 --head-dim 128 --seqlen 1024 --causal 1 --iters 3 \
      --out /tmp/fa3_prof > /tmp/profile_logs/fa3_1024.log 2>&1)
    ncu -i /tmp/profile_logs/fa3_1024.ncu-rep --print-details all > /tmp/profile_logs/fa3_1024.txt 2>&1
    grep -E "Kernel|Duration|Compute \(SM\) Throughput|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|Registers Per|Grid Size" \
      /tmp/profile_logs/fa3_1024.txt | head -24
    (cd /tmp/profile_logs && tar czf "$OUT/profile.tgz" --exclude='*.ncu-rep' .)
    ;;
  epi256)
    # pending/sm90-bwd256-staged-epilogue.patch (session 38: the 256
    # backward's dK / dV through its K / V tiles' chunks and 16-byte stores,
    # as 6723446 did at 64 / 128, where T = 1024 causal gained 1.03-1.07x;
    # carry ["ab/main40", "ab/epi256"], ~5 min): the 256 tests against the
    # wheel, then one round at 256, T = 1024 and 4096, causal and not.
    tests_against epi256 200 "256" test_attention.py test_key_head_copies.py
    AB_DIRS="ab/$M ab/epi256" AB_ROUNDS=2 BENCH_ARGS="--impl jax_flash jax_flash_deterministic --head-dim 256 \
      --seqlen 1024 4096 --causal 0 1 --cotangent random" bash scripts/gpu_ab.sh
    ;;
  epi256_suite)
    # If epi256 timed faster (carry ["ab/epi256"], ~8 min): the whole suite
    # against it, then synccheck, racecheck and memcheck on the 256 kernels
    # alone (the plain calls, default and deterministic): land it.
    suite_against epi256 400
    SANITIZE_HEAD_DIMS=256 SANITIZE_FEATURES=0 SANITIZE_KERNELS=256Kernel SANITIZE_TOOLS="synccheck racecheck memcheck" \
      timeout $((570 - SECONDS)) bash ab/epi256/scripts/sanitize_kernels.sh 2>&1 | tail -8
    ;;
  classwarp)
    # pending/sm90-bwd-step-class-warp.patch (session 38: the step classes
    # made by producer warp 2 instead of the row-statistics warp 1, and
    # FeatureStepClass written field by field; carry ["ab/main40",
    # "ab/classwarp"], ~7 min): the backward feature tests against the
    # wheel, then one round of the feature backward cases at 128 and 64
    # (issue 19: packed and window gained 1.02-1.03x / 1.00x from the class
    # itself in v36, while warp 1's step loop, which lse, delta and the
    # classes share on their way to do_full, grew from 183 instructions and
    # 4 local accesses to 1442 and 135).
    tests_against classwarp 200 "" test_features.py test_bias16.py test_sm90_dropout.py test_sinks.py
    AB_DIRS="ab/$M ab/classwarp" AB_ROUNDS=1 BENCH_ARGS="--impl jax_flash --head-dim 128 64 --seqlen 4096 \
      --cotangent random --cases segments:1 window:1 mask:0 kv_lengths:0 plain:1 softcap:0 dropout:0" bash scripts/gpu_ab.sh
    ;;
  classwarp_suite)
    # If classwarp timed faster (carry ["ab/classwarp", "ab/classwarp_check"],
    # ~9 min; ab/classwarp_check: `OUT=$PWD/ab/classwarp_check STEP=build
    # bash scripts/sm90_bwd_check.sh` in a tree with the patch applied): the
    # backward check program's feature cases, the whole suite, racecheck
    # and synccheck on the sm90 kernels (do_full's count changes: a new
    # warp's arrivals and class stores); then land it.
    # (Session 39, with ~9 device minutes left: CLASSWARP_LIMITS="300 400"
    # and SANITIZE_DEADLINE=520 fit the call into them.)
    OUT=ab/classwarp_check STEP=run ARGS="--features --quick" CHECK_TIMEOUT=100 bash scripts/sm90_bwd_check.sh 2>&1 \
      | grep -v PASS | tail -25
    echo "backward check rc ${PIPESTATUS[0]}"
    suite_then_sanitizers classwarp ${CLASSWARP_LIMITS:-360 480}
    ;;
  masks256)
    # pending/sm90-bwd256-masks.patch (session 38, after the 256 epilogue
    # patch: Backward256Kernel's kMasks, lengths, windows, offsets, segment
    # ids and boolean masks on the sm90 backward at 256, which ran sm80's;
    # carry ["ab/main40", "ab/masks256"], ~8 min): the 256 feature tests
    # (and the dispatch test) against the wheel, then one round of the
    # features at 256 against main (sm80's backward there).
    # The plain 256 rows time the epilogue patch (ab/masks256 carries it;
    # plain calls never run kMasks), so `epi256` need not run on its own.
    tests_against masks256 240 "256" test_features.py test_attention.py test_position_offsets.py
    AB_DIRS="ab/$M ab/masks256" AB_ROUNDS=1 BENCH_ARGS="--impl jax_flash --head-dim 256 --seqlen 4096 \
      --cotangent random --cases segments:1 window:1 mask:0 kv_lengths:0 plain:1;--impl jax_flash \
      jax_flash_deterministic --head-dim 256 --seqlen 1024 4096 --causal 0 1 --cotangent random" bash scripts/gpu_ab.sh
    ;;
  masks256_suite)
    # If masks256 passed and timed faster (carry ["ab/masks256"], ~9 min):
    # the whole suite, then synccheck, racecheck and memcheck on the 256
    # kernels with the masks (the plain 256 calls, then the feature runs at
    # 256: SANITIZE_HEAD_DIMS=256 with the features on); land both patches.
    suite_against masks256 400
    # (This tree's script: SANITIZE_FEATURE_HEAD_DIMS is newer than the wheel.)
    SANITIZE_HEAD_DIMS=256 SANITIZE_FEATURE_HEAD_DIMS=256 SANITIZE_KERNELS=256Kernel \
      SANITIZE_TOOLS="synccheck racecheck memcheck" timeout $((570 - SECONDS)) bash scripts/sanitize_kernels.sh 2>&1 | tail -8
    ;;
  rangebits)
    # pending/sm90-bwd-step-mask-range-bits.patch (session 39: the backward
    # FeatureStepMask's bounds as ColumnRangeBits of QueryRange, the
    # forward's int32 column-range trick, for VisibleBits' per-column
    # compares; carry ["ab/main40", "ab/rangebits"], ~6 min; build
    # ab/rangebits with `bash scripts/ab_wheel.sh rangebits
    # pending/sm90-bwd-step-mask-range-bits.patch`): the backward feature
    # tests against it, then one round of the partial-step-heavy cases.
    tests_against rangebits 200 "" test_features.py test_position_offsets.py test_sinks.py
    AB_DIRS="ab/$M ab/rangebits" AB_ROUNDS=1 BENCH_ARGS="--impl jax_flash --head-dim 128 64 256 --seqlen 4096 \
      --cotangent random --cases window:1 segments:1 kv_lengths:0 plain:1" bash scripts/gpu_ab.sh
    ;;
  dethelper_suite)
    # The helper warp as the package's handoff, rebased onto 6965bd5 in
    # session 40 (carry ["ab/dethelper41", "ab/dethelperjax41"], ~9.5 min;
    # ab/dethelper41: the check program of main + both patches,
    # `OUT=$PWD/ab/dethelper41 STEP=build bash scripts/sm90_bwd_compare_check.sh
    # deterministic` in that tree, 16 s here; ab/dethelperjax41:
    # `bash scripts/ab_wheel.sh dethelperjax41 pending/sm90-bwd-det-helper.patch
    # pending/ab-det-helper-default.patch`): the check program's quick cases
    # (every case bit for bit run to run and against the default), the
    # whole suite, racecheck and synccheck; then, with dethelper_ab's v38
    # timing (0.84-0.94x of the default), land both patches.
    OUT=ab/dethelper41 STEP=run ARGS=--quick CHECK_TIMEOUT=100 bash scripts/sm90_bwd_compare_check.sh deterministic \
      2>&1 | tail -12
    echo "deterministic check rc ${PIPESTATUS[0]}"
    suite_then_sanitizers dethelperjax41 ${DETHELPER_LIMITS:-360 470}
    ;;
  det256_profile)
    # Where the deterministic 256 backward's time goes (v38: 0.64-0.68x of
    # the default, issue 21 asks >= 0.85; carry ["ab/main41"], ~4 min):
    # Nsight Compute with source counters on Deterministic256Kernel against
    # Backward256Kernel at B = 4, T = 4096, N = 8, non-causal. The question
    # for the next change: is it the chain of key blocks (each waits for
    # the one before at every query block, so a wave of tiles pays ~64 red
    # and fence latencies: then split the accumulator by key-block parity,
    # two chains of half the length summed in a fixed order by the
    # conversion), or the per-warp spin and fence inside each step (then a
    # handoff off the consumers, which 256's full shared memory makes hard)?
    profile_against $M 120 "det256_grad:Deterministic256Kernel default256_grad:Backward256Kernel"
    ;;
  stack40_ab)
    # Session 40's stack (carry ["ab/main40", "ab/all40", "ab/main38",
    # "ab/dethelperjax"], ~9 min): ab/all40 = main + the class warp + the
    # range bits (backward, 64 / 128; the range bits also at 256) + the
    # forward's features at 256 (pending/sm90-fwd-features-256.patch:
    # kMasks, kSoftcap, kPlainSoftcap at 256 instead of sm80's forward) +
    # the soft cap and dropout on the 256 backward (pending/sm90-bwd256-
    # softcap.patch, sm90-bwd256-dropout.patch: kMasksSoftcap and
    # kMasksDropout by query halves instead of sm80's backward). One round
    # of the backward feature cases at 128 and 64 (the class warp and range
    # bits), then at 256 (the forward columns: the features patch alone;
    # the backward's: the range bits, and the 256 patches on the soft cap
    # and dropout rows); then, while the call has time, dethelper_ab on its own
    # wheels (main38 and dethelperjax, the same older main).
    AB_DIRS="ab/$M ab/all40" AB_ROUNDS=1 BENCH_ARGS="--impl jax_flash --head-dim 128 64 --seqlen 4096 \
      --cotangent random --cases segments:1 window:1 mask:0 kv_lengths:0 plain:1;--impl jax_flash --head-dim 256 \
      --seqlen 4096 --cotangent random --cases segments:1 window:1 kv_lengths:0 softcap:0 softcap:1 dropout:0 plain:1" \
      bash scripts/gpu_ab.sh
    cp "$OUT/ab.md" "$OUT/ab_stack40.md"
    if [ $SECONDS -lt 330 ]; then
      AB_DIRS="ab/main38 ab/dethelperjax" AB_ROUNDS=1 BENCH_ARGS="--impl jax_flash jax_flash_deterministic \
        --head-dim 64 128 --seqlen 1024 4096 --causal 0 1 --cotangent random" bash scripts/gpu_ab.sh
      cp "$OUT/ab.md" "$OUT/ab_dethelper.md"
    else
      echo "dethelper_ab left for a later call (${SECONDS} s used)"
    fi
    ;;
  detdefer_suite)
    # The whole suite on main + the deterministic 256 backward's deferred
    # dQ turn (pending/sm90-bwd256-det-deferred-pass.patch; carry
    # ["ab/detdefer"], ~9.5 min), then racecheck and synccheck on the sm90
    # kernels: main's own suite too (every other kernel is main's).
    suite_then_sanitizers detdefer ${MAIN_LIMITS:-360 470}
    ;;
  detdefer_ab)
    # The deferred dQ turn timed (carry ["ab/main42", "ab/detdefer"], ~4
    # min): deterministic and default at 256 (v39: 0.63-0.68x; predicted
    # 0.78-0.9x if the per-step fence is the cost), two rounds, then the
    # deterministic tests against the candidate.
    AB_DIRS="ab/$M ab/detdefer" AB_ROUNDS=${DET_ROUNDS:-2} AB_TESTS="tests/test_attention.py" AB_K="deterministic" \
      AB_TEST_DIRS=ab/detdefer BENCH_ARGS="--impl jax_flash jax_flash_deterministic --head-dim 256 --seqlen 1024 \
      4096 --causal 0 1 --cotangent random" bash scripts/gpu_ab.sh
    ;;
  check256)
    # The 64-key variants at 256 over 5 or more key blocks (session 42:
    # the bias tiles failed there, randomly), on main's wheel, then the
    # bias tiles' wheel over 1 .. 16 key blocks (carry ["ab/main42",
    # "ab/bias256"], ~1.5 min).
    for w in $M bias256; do
      python3 -m pip install -q --no-deps --target /tmp/ab_site/$w ab/$w/*.whl || exit 1
    done
    (cd /tmp && XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/ab_site/$M timeout 150 \
      python3 "$OLDPWD/pending/check_256_blocks.py" 2>&1 | grep -v "Warn\|astype\|jnp.asarray" | tail -70)
    (cd /tmp && XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/ab_site/bias256 timeout 90 \
      python3 "$OLDPWD/pending/check_256_blocks.py" tiles256 2>&1 | grep -v "Warn\|astype\|jnp.asarray" | tail -30)
    ;;
  fence_ab)
    # The proxy fence's cost and the 256 tiles' speed (carry ["ab/main42",
    # "ab/bias256fence"], ~4 min): a bf16 bias [1, N, T, S] at 64 / 128
    # (the landed tiles, now fenced: predicted <= 1% slower) and 256 (sm80's
    # forward against the tiles: v39 4.3-4.7x), two rounds.
    AB_DIRS="ab/$M ab/bias256fence" AB_ROUNDS=${FENCE_ROUNDS:-2} BENCH_ARGS="--impl jax_flash --head-dim 64 128 256 \
      --seqlen 4096 --cotangent random --cases bias:0 bias:1 plain:0" bash scripts/gpu_ab.sh
    ;;
  bias256fence_suite)
    # The whole suite on main + the 256 bias tiles + the proxy fence (carry
    # ["ab/bias256fence"], ~9.5 min), then racecheck and synccheck: lands both.
    suite_then_sanitizers bias256fence ${MAIN_LIMITS:-360 470}
    ;;
  long_profile)
    # Why the causal backward at T = 131072 runs 0.86x of FA3 when T =
    # 16384 runs 0.93x (v40, H100; carry ["ab/main42"], ~4 min): Nsight
    # Compute on BackwardKernel at both (L2 hit rate, DRAM throughput, the
    # stall reasons). A whole head's Q, dO and float32 dQ rows are 128 MiB
    # at 131072 (16 MiB at 16384), over the L2's 50-60 MiB: do the blocks
    # in flight keep to a band of rows, or re-read them from HBM? A second
    # suspect (session 42, on paper): past the first wave every tile of a
    # head starts as the one before it ends, 2 query blocks further on and
    # 2 steps shorter, so at 131072 the tiles in flight walk the SAME query
    # block in step (key block n starts at query block 2n, lasts 2048 - 2n
    # steps), and their dQ reduce-adds meet on the same 32 KiB of the
    # accumulator at once: look at the L2's red / atomic throughput and the
    # bulk-reduce waits. At 16384 the first wave is the whole head, its
    # tiles 2 blocks apart. A fix would stagger the walks a little (a few
    # blocks per tile, keeping one band for L2), not spread them. (FA3's
    # backward LPT scheduler, hopper/tile_scheduler.hpp, sizes its sections
    # to 40 MB of Q, dO and dQ accumulator per (head, batch): at 131072 one
    # head is 128 MiB, so its order is ours, key blocks of one head in
    # order, each walking up from its diagonal; so the order alone does not
    # explain the gap.)
    profile_against $M 200 "long_grad_16384:BackwardKernel long_grad_131072:BackwardKernel"
    ;;
  det256_parts)
    # Where the deterministic 256 backward's time goes, by removal (carry
    # ["ab/detdefer", "ab/detpassatsend", "ab/detnowait", "ab/detnowaitnopass"], ~6 min; the
    # two candidates are A/B builds, not for landing:
    # pending/ab-det256-nowait.patch drops each step's wait for its turn,
    # ab-det256-nowait-nopass.patch the pass too, leaving the default's
    # work in the deterministic kernel's split and tile order). main's
    # (ab/detdefer) 0.61-0.68 of the default on the H100: what each part
    # costs, before det256_profile says why.
    # ab/detpassatsend (pending/sm90-bwd256-det-pass-at-send.patch, a
    # candidate to land): the pass a whole step after its reds, at the
    # next send, when they have drained (predicted 1.1-1.2x if the fence's
    # drain is what the nowait-nopass build gains over nowait).
    AB_DIRS="ab/detdefer ab/detpassatsend ab/detnowait ab/detnowaitnopass" AB_ROUNDS=1 BENCH_ARGS="--impl jax_flash \
      jax_flash_deterministic --head-dim 256 --seqlen 1024 4096 --causal 0 1 --cotangent random" bash scripts/gpu_ab.sh
    ;;
  bias_ab)
    # The three 256 bias patches against main (carry ["ab/main42",
    # "ab/biasbwd256"], ~4 min, one round): a bf16 bias [1, N, T, S] at 64
    # / 128 (the landed tiles, now fenced: predicted <= 1% slower), at 256
    # (sm80's forward and backward on main42; the tiles forward, v39
    # 4.3-4.7x, and Backward256Kernel's kMasksBias16, predicted 0.75-0.85
    # of plain from 0.39), and plain at each.
    AB_DIRS="ab/$M ab/biasbwd256" AB_ROUNDS=${BIAS_ROUNDS:-1} BENCH_ARGS="--impl jax_flash --head-dim 64 128 256 \
      --seqlen 4096 --cotangent random --cases bias:0 bias:1 plain:0" bash scripts/gpu_ab.sh
    ;;
  biasbwd256_ab)
    # The 256 backward's bias variants (carry ["ab/main42", "ab/biasbwd256"],
    # ~4 min): a bf16 bias [1, N, T, S] and a float32 one at 256, fwd / bwd
    # (sm80's forward and backward on main42; the tiles forward and
    # kMasksBias16 / kMasksBias backward on the candidate), and plain.
    AB_DIRS="ab/$M ab/biasbwd256" AB_ROUNDS=${BIAS_ROUNDS:-1} BENCH_ARGS="--impl jax_flash --head-dim 256 \
      --seqlen 4096 1024 --cotangent random --cases bias:0 bias:1 plain:0" bash scripts/gpu_ab.sh
    ;;
  biasbwd256_suite)
    # The whole suite on main + the 256 forward's bias tiles + the proxy
    # fence + the 256 backward's bias variants (carry ["ab/biasbwd256"],
    # ~9.5 min), then racecheck and synccheck: lands the three.
    suite_then_sanitizers biasbwd256 ${MAIN_LIMITS:-360 470}
    ;;
  tiles256)
    # The bias tiles at 256 with the proxy fence (carry ["ab/bias256fence"],
    # ~1 min): every case of check_256_blocks.py's tiles256 (5 .. 64 key
    # blocks, three times each, and the 64 / 128 tiles over 32 blocks).
    w=${TILES_WHEEL:-bias256fence}
    python3 -m pip install -q --no-deps --target /tmp/ab_site/$w ab/$w/*.whl || exit 1
    (cd /tmp && XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/ab_site/$w timeout 150 \
      python3 "$OLDPWD/pending/check_256_blocks.py" tiles256 2>&1 | grep -v "Warn\|astype\|jnp.asarray" | tail -30)
    ;;
  main_suite)
    # The whole suite on main's wheel, then racecheck and synccheck on the
    # sm90 kernels (carry ["ab/main42"], ~9.5 min; session 41 landed
    # 366e068 on a suite of a wheel holding its kernels beside two
    # patches it dropped).
    suite_then_sanitizers $M ${MAIN_LIMITS:-360 470}
    ;;
  bias256_debug)
    # The 256 bias tiles' non-causal failure (session 41, perf_history.md
    # v39; carry ["ab/bias256"]: `bash scripts/ab_wheel.sh bias256
    # pending/sm90-fwd-bias-256.patch`, ~5 min): the failing tests three
    # times (does it fail every time, in the same elements?), the forward
    # alone against float64 over a small matrix (T = 64 / 200, S = 64 /
    # 128 / 264, causal or not: which block counts fail), then racecheck and
    # synccheck on that forward alone (a race between the tile's copy and
    # its reads, new with the overlap schedule, would show there).
    python3 -m pip install -q --no-deps --target /tmp/ab_site/bias256 ab/bias256/*.whl || exit 1
    root=$(pwd)
    for i in $(seq ${BIAS_REPS:-3}); do
      (cd /tmp && XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/ab_site/bias256 timeout 60 python3 -m pytest -q \
        -p no:cacheprovider "$root/ab/bias256/tests/test_bias16.py" -k "1xNxTxS-256" 2>&1 | grep -E "Error:|passed|failed")
    done
    cat > /tmp/bias256_case.py <<'PY'
import sys
import jax, jax.numpy as jnp, numpy as np, jax_flash
from jax_flash import reference
rng = np.random.default_rng(1)
small = len(sys.argv) > 1
b, n, kh = 2, 4, 2  # test_bias16's (GQA 4:2)
shapes = [(200, 264)] if small else [(200, 264), (200, 200), (64, 64), (64, 128), (128, 320), (200, 128)]
for dtype in (jnp.float16, jnp.bfloat16):
    for t, s in shapes:
        for causal in (False, True):
            for bias_batch in (1, b):
                q = jnp.asarray(rng.standard_normal((b, t, n, 256)), dtype)
                k, v = (jnp.asarray(rng.standard_normal((b, s, kh, 256)), dtype) for _ in range(2))
                bias = jnp.asarray(rng.standard_normal((bias_batch, n, t, s)) * 2.0, dtype)
                out = np.asarray(jax_flash.attention(q, k, v, bias, is_causal=causal), np.float64)
                if small:
                    continue
                again = np.asarray(jax_flash.attention(q, k, v, bias, is_causal=causal), np.float64)
                f64 = lambda x: np.asarray(x, np.float64)
                want = np.asarray(reference.attention(f64(q), f64(k), f64(v), f64(bias), is_causal=causal))
                err = np.abs(out - want)
                bad = np.argwhere(err > 0.02 * (1 + np.abs(want)))
                where = sorted(set((int(x[0]), int(x[1]) // 64, int(x[2])) for x in bad))[:6]
                print(f"{jnp.dtype(dtype).name} T={t} S={s} causal={int(causal)} bias[{bias_batch},N,T,S]: "
                      f"max err {err.max():.3g}, {len(bad)} bad (batch, row//64, head) {where}, "
                      f"same twice {np.array_equal(out, again)}", flush=True)
PY
    for i in $(seq ${BIAS_CASE_REPS:-2}); do
      (cd /tmp && PYTHONPATH=/tmp/ab_site/bias256 timeout 150 python3 /tmp/bias256_case.py 2>&1 | grep -v Warning | tail -50)
    done
    san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
    for tool in racecheck synccheck; do
      (cd /tmp && PYTHONPATH=/tmp/ab_site/bias256 timeout ${BIAS_SAN_LIMIT:-150} "$san" --tool $tool --kernel-name regex:ForwardKernel \
        python3 /tmp/bias256_case.py small 2>&1 | grep -E "ERROR SUMMARY|Hazard|Error|hazard" | head -8)
    done
    ;;
  combo41_suite)
    # Session 41: one suite for five pending patches together (carry
    # ["ab/dethelper41", "ab/combo41b", "ab/combo41d"], ~9.5 min):
    # ab/combo41b = main + the helper warp as the deterministic handoff
    # (sm90-bwd-det-helper.patch, ab-det-helper-default.patch) + the
    # two-chain deterministic 256 backward (sm90-bwd256-det-two-chains-on-
    # helper.patch, the same patch rebased onto the helper) + dropout alone
    # at 256 on the sm90 forward (sm90-fwd-dropout-256.patch) + a bias at
    # 256 on the sm90 forward (sm90-fwd-bias-256-on-combo.patch: the tiles
    # on 64-key blocks); ab/combo41d = that + a boolean mask at 256 on the
    # sm90 forward (sm90-fwd-mask-256-on-combo.patch) + the rest of the
    # forward's features at 256 (sm90-fwd-features-256-on-mask.patch: a
    # mask beside the soft cap, dropout beside the masks, one dispatch for
    # every head dim). The helper's check
    # program's quick cases (bit for bit run to run and against the
    # default), combo41d's 256 tests under -x (a wrong kernel shows in a
    # minute; if one fails, the suite runs on combo41b), then the whole
    # suite, racecheck and synccheck.
    OUT=ab/dethelper41 STEP=run ARGS=--quick CHECK_TIMEOUT=100 bash scripts/sm90_bwd_compare_check.sh deterministic \
      2>&1 | tail -12
    echo "deterministic check rc ${PIPESTATUS[0]}"
    W=${COMBO:-combo41d}
    if [ "$W" = combo41d ]; then
      root=$(pwd)
      python3 -m pip install -q --no-deps --target /tmp/ab_site/combo41d ab/combo41d/*.whl || exit 1
      if ! (cd /tmp && XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/ab_site/combo41d timeout 150 \
            python3 -m pytest -q -x -n 12 -p no:cacheprovider "$root/ab/combo41d/tests/test_attention.py" \
            "$root/ab/combo41d/tests/test_features.py" "$root/ab/combo41d/tests/test_bias16.py" -k 256 2>&1 | tail -8;
            exit "${PIPESTATUS[0]}"); then
        echo "combo41d's 256 tests failed: the suite runs on combo41b"
        W=combo41b
      fi
    fi
    echo "suite on $W"
    suite_then_sanitizers $W ${COMBO_LIMITS:-330 440}
    ;;
  combo41_ab)
    # The six patches timed (carry ["ab/main41", "ab/combo41d"], ~8 min at
    # COMBO_ROUNDS=1): deterministic and default at 64 / 128 (the helper;
    # v38: 0.84-0.94x of the default, issue 21 asks >= 0.85), at 256 (the
    # two chains; v38 0.64-0.68x, predicted 0.75-0.85x), and dropout, a
    # bf16 bias [1, N, T, S], a key-padding mask and a prefix-LM mask at
    # 256 (sm80's forward before; predicted 2.5-3.5x, 1.8-2.5x, ~2x, ~2x).
    AB_DIRS="ab/$M ab/${COMBO:-combo41d}" AB_ROUNDS=${COMBO_ROUNDS:-1} BENCH_ARGS="--impl jax_flash \
      jax_flash_deterministic --head-dim 256 --seqlen 1024 4096 --causal 0 1 --cotangent random;--impl jax_flash \
      --head-dim 256 --seqlen 4096 --cotangent random --cases dropout:0 dropout:1 bias:0 bias:1 mask:0 prefix_lm:0 \
      softcap:0 plain:0;--impl jax_flash jax_flash_deterministic --head-dim 128 64 --seqlen 4096 1024 --causal 0 1 \
      --cotangent random" bash scripts/gpu_ab.sh
    ;;
  stack40_suite)
    # If stack40_ab timed faster (carry ["ab/all40", "ab/stack40_check"],
    # ~9.5 min; ab/stack40_check: the backward check program of main + the
    # class warp + the range bits, which the 256 patches do not touch):
    # the check program's feature cases, the whole suite, racecheck and
    # synccheck on the sm90 kernels; then land the five patches.
    OUT=ab/stack40_check STEP=run ARGS="--features --quick" CHECK_TIMEOUT=100 bash scripts/sm90_bwd_check.sh 2>&1 \
      | grep -v PASS | tail -25
    echo "backward check rc ${PIPESTATUS[0]}"
    suite_then_sanitizers all40 ${STACK40_LIMITS:-360 470}
    ;;
  window_profile)
    # Issue 19's window backward (~0.89x of FA3's own ratio after v36; the
    # step class, which removed ~300 instructions of a visible step, left
    # it at 1.00x: not issue-bound there), carry ["ab/main40"], ~4 min:
    # Nsight Compute with source counters on the window backward against
    # plain T = 1024 causal (similar steps a tile) and the packed one.
    profile_against $M 100 "window_grad:BackwardKernel plain_grad_1024:BackwardKernel packed_grad:BackwardKernel"
    ;;
  sanitize_all)
    # Every sm90 kernel of main's wheel under synccheck, racecheck and
    # memcheck (carry ["ab/main41"], ~9 min). Session 38's run of the same
    # script with SANITIZE_KERNELS=256Kernel crashed every tool (rc 139,
    # no report), while a 256-only case was clean: sm90 (session 37's
    # filter, clean then) tells whether the crash follows the filter.
    python3 -m pip install -q --no-deps --target /tmp/ab_site/$M ab/$M/*.whl || exit 1
    export PYTHONPATH=/tmp/ab_site/$M XLA_PYTHON_CLIENT_PREALLOCATE=false
    SANITIZE_KERNELS=sm90 SANITIZE_TOOLS="synccheck racecheck memcheck" \
      timeout $((570 - SECONDS)) bash ab/$M/scripts/sanitize_kernels.sh 2>&1 | tail -12
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
done
