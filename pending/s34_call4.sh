# session 34 call 4 (carry ab/droppairs ab/px7): Philox4x32 with 7 rounds
# (pending/dropout-philox7.patch on plaintx + pairs) against 10: its dropout
# tests, then one round of the dropout cases at 128 and 64.
set -uo pipefail
export OUT=${OUT:-/tmp/gpu_out}; mkdir -p $OUT
root=$(pwd)
python3 -m pip install -q --no-deps --target /tmp/ab_site/px7 ab/px7/*.whl || exit 1
(cd /tmp && XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/ab_site/px7 timeout 100 python3 -m pytest -q -x -n 12 \
  -p no:cacheprovider $root/ab/px7/tests/test_sm90_dropout.py $root/ab/px7/tests/test_cpu_transforms.py \
  $root/ab/px7/tests/test_features.py -k "dropout or policy" 2>&1 | tail -3) || exit 1
AB_DIRS="ab/droppairs ab/px7" AB_ROUNDS=1 BENCH_ARGS="--impl jax_flash --head-dim 128 64 \
  --seqlen 4096 --cotangent random --cases plain:0 dropout:0 dropout:1" bash scripts/gpu_ab.sh 2>&1 | tail -9
