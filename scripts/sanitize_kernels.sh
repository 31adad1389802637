#!/usr/bin/env bash
# Shared-memory races, barrier misuse and out-of-bounds or misaligned memory
# accesses in the tensor-core kernels, on the GPU: runs small forward+backward
# calls (head dims 64 / 128 / 256, causal and not, lengths with tails, two
# query heads per key head; the sm90 forward where the GPU is 9.x and the
# sm80 one; the split-KV decode kernels, contiguous and paged; then the feature variants: packed documents, a
# window, key lengths, a key-padding mask, a bias and its gradient, soft cap,
# dropout; on 9.x the sm90 feature variants at 64 and 128 and sm80's forced;
# the generic kernels and the deterministic backward)
# under compute-sanitizer's racecheck, synccheck, memcheck and initcheck
# (reads of device memory nothing wrote), only our kernels instrumented.
# A kernel whose barriers are wrong can pass the numeric tests by timing
# luck; these tools see the hazard itself. Run from the repository root on
# the device after the package is installed (gpu_check.sh: SANITIZE=1).
#
#   bash scripts/sanitize_kernels.sh            # every kernel of ours
#   SANITIZE_KERNELS=DkvKernel bash scripts/sanitize_kernels.sh   # a name substring
#   SANITIZE_TOOLS=initcheck bash scripts/sanitize_kernels.sh     # some of the tools
#   SANITIZE_HEAD_DIMS=256 SANITIZE_FEATURES=0 SANITIZE_KERNELS=256Kernel bash scripts/sanitize_kernels.sh
#     # the plain calls at 256 alone (default and deterministic backward)
#   SANITIZE_FEATURE_HEAD_DIMS="64 128 256" ...   # the feature runs at those head dims
set -uo pipefail
# Logs go to $LOGS (gpu_check.sh's, bundled into its logs.tgz), else $OUT.
OUT=${LOGS:-${OUT:-/tmp/gpu_out}}
mkdir -p "$OUT"
tool_bin=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -z "$tool_bin" ]; then echo "sanitize: compute-sanitizer not found"; exit 1; fi
cat > /tmp/sanitize_case.py <<'PY'
import os, sys
import jax, jax.numpy as jnp, numpy as np, jax_flash
rng = np.random.default_rng(0)
# SANITIZE_HEAD_DIMS: the plain calls' head dims; SANITIZE_FEATURES=0 stops
# after them (a kernel family checked alone, e.g. the 256 backward).
head_dims = [int(x) for x in os.environ.get("SANITIZE_HEAD_DIMS", "64 128 256").split()]
for head_dim in head_dims:
    for causal in (False, True):
        # T=197: full query steps and a tail, whose last 8-row group of the dQ
        # accumulator is partial (row-major); 4 query heads on 2 key heads.
        q = jnp.asarray(rng.standard_normal((1, 197, 4, head_dim)), jnp.bfloat16)
        k, v = (jnp.asarray(rng.standard_normal((1, 197, 2, head_dim)), jnp.bfloat16) for _ in range(2))
        loss = lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, is_causal=causal).astype(jnp.float32))
        grads = jax.jit(jax.grad(loss, (0, 1, 2)))(q, k, v)
        assert all(bool(jnp.isfinite(g.astype(jnp.float32)).all()) for g in grads)
        # On 9.x the plain forward above is the sm90 kernel's; the sm80 one too.
        out = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, is_causal=causal, implementation="sm80"))(q, k, v)
        assert bool(jnp.isfinite(out.astype(jnp.float32)).all())
# The deterministic sm90 backward at 128 and 256 (dQ's adds ordered by
# counters; at 256 the reds from registers between WaitDqTurn and
# PassDqTurn), causal, same shapes.
for head_dim in [h for h in (128, 256) if h in head_dims]:
    q = jnp.asarray(rng.standard_normal((1, 197, 4, head_dim)), jnp.bfloat16)
    k, v = (jnp.asarray(rng.standard_normal((1, 197, 2, head_dim)), jnp.bfloat16) for _ in range(2))
    loss = lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, is_causal=True, deterministic=True).astype(jnp.float32))
    grads = jax.jit(jax.grad(loss, (0, 1, 2)))(q, k, v)
    assert all(bool(jnp.isfinite(g.astype(jnp.float32)).all()) for g in grads)
if os.environ.get("SANITIZE_FEATURES", "1") == "0":
    print("sanitize case done (plain calls only)")
    sys.exit(0)
# The decode kernels (split-KV): 4 new queries over 700 cached keys, 4 query
# heads per key head, bottom-right causal as a window; then the paged pool.
q = jnp.asarray(rng.standard_normal((2, 4, 8, 128)), jnp.bfloat16)
k, v = (jnp.asarray(rng.standard_normal((2, 700, 2, 128)), jnp.bfloat16) for _ in range(2))
out = jax.jit(lambda q, k, v: jax_flash.attention(q, k, v, local_window_size=(700, 696)))(q, k, v)
assert bool(jnp.isfinite(out.astype(jnp.float32)).all()), "decode"
pool_k, pool_v = (jnp.asarray(rng.standard_normal((30, 64, 2, 128)), jnp.bfloat16) for _ in range(2))
tables = jnp.asarray(rng.permutation(30)[:24].reshape(2, 12), jnp.int32)
lengths = jnp.asarray([700, 333], jnp.int32)
out = jax.jit(jax_flash.paged_attention)(q, pool_k, pool_v, tables, lengths)
assert bool(jnp.isfinite(out.astype(jnp.float32)).all()), "paged decode"
# The feature variants (their own instantiations): packed documents, a
# window, key lengths, a key-padding mask, a bias with its gradient, soft
# cap, dropout. On 9.x segments, windows, lengths and the soft cap run the
# sm90 forward's and backward's feature variants (head dims 64 and 128:
# each its own kernels), so those also run once forced onto sm80's; the
# key-padding mask runs the sm90 forward's kMasksBoolean, sm80's backward.
t, n = 197, 2
ids = jnp.asarray(np.repeat(np.arange(3), [70, 64, t - 134])[None], jnp.int32)
mask = jnp.asarray(np.arange(t) < 150)[None, None, None, :]
# A prefix-LM mask (per query: the sm90 kernels read its block summary too,
# tails in both dims).
prefix = jnp.asarray(np.arange(t)[None, :] < np.maximum(np.arange(t)[:, None] + 1, 90))[None, None]
sm90_cases = {
    "dense mask": dict(mask=prefix),
    "segments": dict(is_causal=True, q_segment_ids=ids, kv_segment_ids=ids),
    "window": dict(is_causal=True, local_window_size=(40, 0)),
    "lengths": dict(key_value_seq_lengths=jnp.asarray([150], jnp.int32)),
    "softcap": dict(logits_soft_cap=30.0),
    # The soft cap or dropout alone runs the plain kernels' loops with it
    # (kPlainSoftcap, kPlainDropout); beside lengths, the masks' variants.
    "softcap causal": dict(logits_soft_cap=30.0, is_causal=True),
    "softcap lengths": dict(logits_soft_cap=30.0, key_value_seq_lengths=jnp.asarray([150], jnp.int32)),
    "dropout causal": dict(dropout_rate=0.1, dropout_rng=jax.random.key(2), is_causal=True),
    "dropout lengths": dict(dropout_rate=0.1, dropout_rng=jax.random.key(3),
                            key_value_seq_lengths=jnp.asarray([150], jnp.int32)),
}
sm80_cases = {
    "mask": dict(mask=mask),
    "dropout": dict(dropout_rate=0.1, dropout_rng=jax.random.key(1)),
}
# SANITIZE_FEATURE_HEAD_DIMS: the head dims of these feature runs.
feature_head_dims = [int(x) for x in os.environ.get("SANITIZE_FEATURE_HEAD_DIMS", "64 128").split()]
runs = [(h, name, kw) for h in feature_head_dims for name, kw in sm90_cases.items()]
runs += [(128, name + " on sm80", dict(kw, implementation="sm80")) for name, kw in sm90_cases.items()]
runs += [(128, name, kw) for name, kw in sm80_cases.items()]
for h, name, kwargs in runs:
    q, k, v = (jnp.asarray(rng.standard_normal((1, t, n, h)), jnp.bfloat16) for _ in range(3))
    loss = lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, **kwargs).astype(jnp.float32))
    grads = jax.jit(jax.grad(loss, (0, 1, 2)))(q, k, v)
    assert all(bool(jnp.isfinite(g.astype(jnp.float32)).all()) for g in grads), (h, name)
# A bias and its gradient: on 9.x the sm90 forward's kMasksBias16 (a bf16
# bias) and kMasksBias (float32), sm80's backward and its dbias-only pass
# (direct stores for the full-shape bias, float32 atomics and the convert
# for the broadcast bf16 one), at head dims 64 and 128; with 200 keys (rows
# of whole 16 bytes) the forward's kMasksBiasTiles (TMA copies and ldmatrix
# reads of its shared-memory tiles).
for h in (64, 128):
    for shape, dtype in (((1, n, t, t), jnp.bfloat16), ((1, 1, t, t), jnp.bfloat16), ((1, n, t, t), jnp.float32),
                         ((1, n, 200, 200), jnp.bfloat16), ((1, 1, 200, 200), jnp.bfloat16)):
        q, k, v = (jnp.asarray(rng.standard_normal((1, shape[2], n, h)), jnp.bfloat16) for _ in range(3))
        bias = jnp.asarray(rng.standard_normal(shape), dtype)
        loss = lambda q, k, v, bias: jnp.sum(jax_flash.attention(q, k, v, bias=bias).astype(jnp.float32))
        grads = jax.jit(jax.grad(loss, (0, 1, 2, 3)))(q, k, v, bias)
        assert all(bool(jnp.isfinite(g.astype(jnp.float32)).all()) for g in grads), ("bias", h, shape, dtype)
# The generic kernels (SIMT, float32 arithmetic): float32 inputs, then 16-bit
# inputs forced onto them with a broadcast bias and its gradient (the
# generic bias-gradient pass); and the deterministic backward: sm80's
# two-pass dK/dV + dQ kernels for a plain call, the generic kernels with a
# feature.
generic_runs = [
    (jnp.float32, dict(is_causal=True)),
    (jnp.bfloat16, dict(implementation="generic", is_causal=True)),
    (jnp.bfloat16, dict(deterministic=True)),
    (jnp.bfloat16, dict(deterministic=True, local_window_size=(40, 0))),
]
for dtype, kwargs in generic_runs:
    q = jnp.asarray(rng.standard_normal((1, t, 4, 64)), dtype)
    k, v = (jnp.asarray(rng.standard_normal((1, t, 2, 64)), dtype) for _ in range(2))
    loss = lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v, **kwargs).astype(jnp.float32))
    grads = jax.jit(jax.grad(loss, (0, 1, 2)))(q, k, v)
    assert all(bool(jnp.isfinite(g.astype(jnp.float32)).all()) for g in grads), ("generic", dtype, kwargs)
q, k, v = (jnp.asarray(rng.standard_normal((1, t, n, 64)), jnp.bfloat16) for _ in range(3))
bias = jnp.asarray(rng.standard_normal((1, 1, t, t)), jnp.bfloat16)
loss = lambda q, k, v, bias: jnp.sum(jax_flash.attention(q, k, v, bias=bias, implementation="generic").astype(jnp.float32))
grads = jax.jit(jax.grad(loss, (0, 1, 2, 3)))(q, k, v, bias)
assert all(bool(jnp.isfinite(g.astype(jnp.float32)).all()) for g in grads), "generic bias"
print("sanitize case done")
PY
# Each tool's run in a process group of its own, killed whole at its limit
# and when this script is stopped: `timeout` stops compute-sanitizer alone,
# and its python target (session 31: an initcheck run cut off by an outer
# timeout) kept the GPU busy under the timings that came after.
running=""
trap '[ -n "$running" ] && kill -KILL -- "-$running" 2> /dev/null' EXIT
trap 'exit 143' TERM INT
limited() {  # seconds command ...: the command's exit status, 137 when it ran past the limit
  local limit=$1
  shift
  setsid "$@" &
  running=$!
  (sleep "$limit"; kill -KILL -- "-$running" 2> /dev/null) &
  local watchdog=$! rc=0
  wait "$running" || rc=$?
  kill "$watchdog" 2> /dev/null
  wait "$watchdog" 2> /dev/null
  running=""
  return $rc
}
status=0
for tool in ${SANITIZE_TOOLS:-racecheck synccheck memcheck initcheck}; do
  log="$OUT/sanitize_$tool.log"
  # Only our kernels (their names hold the namespace): XLA's are not ours to
  # check. Except initcheck: it tracks the writes of instrumented kernels
  # only, so with our kernels alone every read of an operand that an XLA
  # kernel wrote (the cotangent dO, say) looked uninitialized (33,732 reports
  # in DeltaAndClearKernel). It instruments everything and counts the
  # reports inside our kernels.
  filter="kns=${SANITIZE_KERNELS:-jax_flash}"
  if [ "$tool" = initcheck ]; then
    # (Unfiltered, the case ran past 125 s on the H200; XLA's autotuning
    # launches most of the kernels, so it is off here.)
    rc=0
    limited 600 env --chdir=/tmp XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" "$tool_bin" --tool initcheck \
      --print-limit 100000 python3 /tmp/sanitize_case.py > "$log" 2>&1 || rc=$?
    ours=$(grep -cE "^=========     at .*${SANITIZE_KERNELS:-jax_flash}" "$log")
    echo "sanitize initcheck: rc=$rc; $ours reports in our kernels; $(grep -E "ERROR SUMMARY" "$log" | tail -1)"
    [ $rc -ne 0 ] || [ "$ours" != 0 ] && status=1 && grep -E "^=========     at .*jax_flash" "$log" | sort | uniq -c | head -15
    continue
  fi
  rc=0
  limited 300 env --chdir=/tmp "$tool_bin" --tool "$tool" --kernel-name "$filter" \
    --error-exitcode 3 python3 /tmp/sanitize_case.py > "$log" 2>&1 || rc=$?
  if [ $rc -ne 0 ] && grep -qiE "unrecognized|invalid option|unknown option" "$log"; then
    # Older tools spell the filter --filter.
    rc=0
    limited 300 env --chdir=/tmp "$tool_bin" --tool "$tool" --filter "$filter" \
      --error-exitcode 3 python3 /tmp/sanitize_case.py > "$log" 2>&1 || rc=$?
  fi
  echo "sanitize $tool: rc=$rc; $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard" "$log" | tail -2 | tr '\n' ' ')"
  [ $rc -ne 0 ] && status=1 && grep -E "Error|Warning|hazard|Race" "$log" | head -15
done
exit $status
