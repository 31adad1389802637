// Shared-memory staging and warp reductions used by every generic kernel.
#pragma once

#include <cstdint>

#include "cuda/generic/element.cuh"

namespace jax_flash::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float WarpMax(float x) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

__device__ __forceinline__ float WarpSum(float x) {
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

// dst[r][c] = src[row0 + r][c] * mul for r < kRows, c < kHeadDim, as float.
// Rows at or past `num_rows` and columns at or past head_dim read as zero, so
// padded lanes contribute nothing to dot products. All threads of the block
// take part; consecutive threads read consecutive columns (coalesced).
template <int kRows, int kHeadDim, int kThreads, typename Element>
__device__ __forceinline__ void StageRows(float* dst, int pitch, const Element* src,
                                          int64_t row_stride, int64_t row0,
                                          int64_t num_rows, int head_dim, float mul) {
  for (int idx = threadIdx.x; idx < kRows * kHeadDim; idx += kThreads) {
    const int r = idx / kHeadDim, c = idx % kHeadDim;
    const int64_t row = row0 + r;
    float x = 0.0f;
    if (row < num_rows && c < head_dim) x = ToFloat(src[row * row_stride + c]) * mul;
    dst[r * pitch + c] = x;
  }
}

}  // namespace jax_flash::cuda
