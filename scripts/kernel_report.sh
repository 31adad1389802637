#!/usr/bin/env bash
# Registers, spills and per-loop SASS of the mma.sync kernels, without a GPU:
# compiles one forward and one backward instantiation per head dim (bf16)
# for one architecture and prints `ptxas -v` and scripts/sass_loops.py.
# Run before sending a kernel change to the device (spills and loop sizes are
# the first things a change moves).
#
#   bash scripts/kernel_report.sh                 # sm_90a, head dims 64 128 256
#   ARCH=80 HEAD_DIMS=128 bash scripts/kernel_report.sh
#   KERNELS=Backward bash scripts/kernel_report.sh    # one family only
#
# Needs nvcc, and cuobjdump for the loop statistics (skipped without it; the
# nvidia-cuda-cuobjdump wheel has one).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
ARCH=${ARCH:-90a}
HEAD_DIMS=${HEAD_DIMS:-64 128 256}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
jax_include=$(python3 -c "import jax; print(jax.ffi.include_dir())")
for which in Forward Backward; do
  cat > "$work/$which.cu" <<CU
#include "cuda/sm80/launch.cuh"
namespace jax_flash::cuda::sm80 {
template std::string Launch$which<__nv_bfloat16, HEAD_DIM>(const AttentionParams&, cudaStream_t);
}
CU
done
for hd in $HEAD_DIMS; do
  for which in ${KERNELS:-Forward Backward}; do
    cubin="$work/${which}_$hd.cubin"
    if ! nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_${ARCH%a},code=sm_$ARCH \
      -Xptxas -v -Iffi -isystem "$jax_include" -DHEAD_DIM="$hd" -cubin -o "$cubin" "$work/$which.cu" \
      > "$work/ptxas.log" 2>&1; then
      grep -E "error" "$work/ptxas.log" | head -20 >&2  # else the failure would pass silently
      exit 1
    fi
    awk '/Compiling entry/ {n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n)}
           /spill stores/ {spill = $5 " B spill stores, " $9 " B loads"}
           /Used [0-9]+ registers/ {print n ": " $5 " registers, " spill}' "$work/ptxas.log" |
      sed -E 's/_ZN9jax_flash4cuda(4sm80)?[0-9]+//; s/I13__nv_bfloat16//; s/E+vNS_15AttentionParamsE(NS1_10BlockOrderE|b)?//'
    if command -v cuobjdump > /dev/null; then
      python3 scripts/sass_loops.py "$cubin" 'ForwardKernel|DkvKernel|DqKernel'
    fi
  done
done
