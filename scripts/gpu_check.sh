#!/usr/bin/env bash
# One device call: build with CUDA, run the whole test suite on the GPU, then
# the benchmark points given in BENCH_ARGS. Logs and JSON go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv | tee "$OUT/gpu.txt"
export CMAKE_BUILD_PARALLEL_LEVEL=16
start=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -v . > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

cd /tmp  # import the installed package, not the source tree
python3 -c "import jax, jax_flash; print(jax.__version__, jax.devices(), jax_flash.build_info())"
python3 -m pytest "$OLDPWD/tests" -q ${PYTEST_ARGS:-} > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -5 "$OUT/pytest.log"
if [ -n "${LONG_ARGS:-}" ]; then python3 "$OLDPWD/scripts/long_sequence.py" $LONG_ARGS 2>&1 | tail -3; fi
if [ -n "${BENCH_ARGS:-}" ]; then
  python3 -m jax_flash.benchmark $BENCH_ARGS --out "$OUT/bench" 2>&1 | tail -40
  cp "$OUT/bench/results.json" "$OUT/bench.json"; cp "$OUT/bench/results.md" "$OUT/bench.md"; cp "$OUT/bench/results.png" "$OUT/bench.png" 2>/dev/null
fi
if [ -n "${NCU:-}" ]; then
  # One profiled launch of each kernel family at H=128, T=4096, bf16 (forward and backward).
  cat > /tmp/ncu_case.py <<'PY'
import jax, jax.numpy as jnp, numpy as np, jax_flash
q, k, v = (jnp.asarray(np.random.default_rng(i).standard_normal((4, 4096, 16, 128)), jnp.bfloat16) for i in range(3))
f = jax.jit(jax.grad(lambda q, k, v: jnp.sum(jax_flash.attention(q, k, v).astype(jnp.float32)), (0, 1, 2)))
jax.block_until_ready(f(q, k, v))
PY
  timeout 240 ncu --clock-control none --kernel-name regex:"ForwardKernel|DqKernel|DkvKernel" --launch-count 3 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    python3 /tmp/ncu_case.py > "$OUT/ncu.txt" 2>&1
  grep -E "ForwardKernel|DqKernel|DkvKernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Stall|Warp Cycles Per Issued|Bank" "$OUT/ncu.txt" | head -60
fi
if [ -n "${EXAMPLES:-}" ]; then
  # Issue 5's larger config: tokens/s and final loss for flash vs cudnn vs xla.
  for impl in flash cudnn xla; do
    python3 "$OLDPWD/examples/train_gpt_flax.py" --depth 8 --width 512 --heads 8 --seq-len 2048 \
      --batch-size 8 --steps ${EXAMPLE_STEPS:-200} --log-every 50 --dtype bfloat16 --attention $impl \
      --no-progress --sample-chars 0 --out "$OUT/example_$impl" 2>&1 | grep -E "^step|^loss" | tail -3
  done
fi
