#!/usr/bin/env bash
# fwd_order_poly's body (pending/check_all.sh): main's package timed, then the
# patched copy `dir` (sm90-fwd-mask-descending + sm90-poly-exp2) built once
# per POLY_EVERY value (-DJAX_FLASH_POLY_EXP2_EVERY through CMAKE_ARGS; 0 is
# the descending order alone), its mask and soft cap tests and the PolyExp2
# host check run on the first build, and each timed. bf16 times every case;
# float16 (whose tanh is two MUFU operations) plain and the soft cap.
#   bash pending/fwd_order_poly.sh ROOT DIR
set -euo pipefail
root=$1 dir=$2
# (ORDER_POLY_BENCH replaces the shape options: a dry run on a CPU, say.)
read -r -a bench <<< "--impl jax_flash ${ORDER_POLY_BENCH:---head-dim 128 --seqlen 4096} --cotangent random"
bf16=(plain:0 softcap:0 prefix_lm:0 prefix_lm_softcap:0 striped_mask:0)
f16=(plain:0 softcap:0)
table() {  # dtype label cases...
  local dtype=$1 label=$2
  shift 2
  python3 -m jax_flash.benchmark "${bench[@]}" --dtype "$dtype" --cases "$@" --out "/tmp/order_poly_${label}_$dtype" |
    grep -A30 'Feature cost' | grep -E '^\| (plain|softcap|prefix|striped)' || true
}
python3 -m pip install -q --no-build-isolation --no-deps "$root"
cd /tmp
echo "== main"
table bfloat16 main "${bf16[@]}"
table float16 main "${f16[@]}"
first=1
for every in ${POLY_EVERY:-2 0}; do
  CMAKE_ARGS="-DCMAKE_CUDA_FLAGS=-DJAX_FLASH_POLY_EXP2_EVERY=$every" \
    python3 -m pip install -q --no-build-isolation --no-deps "$dir"
  if [ "$first" = 1 ]; then
    python3 -m pytest -q -p no:cacheprovider -n 12 "$dir/tests/test_features.py" "$dir/tests/test_poly_exp2.py" \
      -k "soft or poly or mask" | tail -2
    first=0
  fi
  echo "== patched, POLY_EVERY=$every"
  table bfloat16 "$every" "${bf16[@]}"
  [ "$every" = 0 ] || table float16 "$every" "${f16[@]}"
done
