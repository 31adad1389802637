# Session 42's third call (carry ab/main42 ab/bias256 .peers): check256,
# then T = 131072 / 262144 causal with the memory line, then the grid's
# H = 128 / 256 points at T = 4096 / 16384 beside cuDNN and FA3, within
# 570 s.
SECONDS=0
root=$(pwd)
bash pending/session31.sh check256 2>&1 | tail -100
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/ab_site/main42:$root/.peers
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
cd /tmp
echo "== long ($SECONDS s)"
timeout $((300 - SECONDS)) python3 -m jax_flash.benchmark --impl jax_flash fa3 cudnn --head-dim 128 \
  --seqlen 131072 262144 --tokens 131072 --width 2048 --causal 1 --iters 3 --cotangent random --memory \
  --out "$OUT/long42" 2>&1 | tail -14
echo "== grid ($SECONDS s)"
timeout $((570 - SECONDS)) python3 -m jax_flash.benchmark --impl jax_flash cudnn fa3 --head-dim 128 256 \
  --seqlen 4096 16384 --causal 0 1 --cotangent random --out "$OUT/grid42" 2>&1 | tail -40
echo "== end ($SECONDS s)"
