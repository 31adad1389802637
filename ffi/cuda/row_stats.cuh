// Per-row statistics shared by the backward kernels of every CUDA family.
#pragma once

#include <math_constants.h>

#include "common/params.h"

namespace jax_flash::cuda {

// lse in log2 units; a row that saw no key (lse = -inf) gets +inf so that
// P = exp2(s - lse2) = 0 instead of inf.
__device__ __forceinline__ float Log2Lse(float lse) {
  return lse == -CUDART_INF_F ? CUDART_INF_F : lse * kLog2e;
}

}  // namespace jax_flash::cuda
