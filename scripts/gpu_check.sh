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
  cp "$OUT/bench/results.json" "$OUT/bench.json" 2>/dev/null; cp "$OUT/bench/results.md" "$OUT/bench.md" 2>/dev/null
fi
