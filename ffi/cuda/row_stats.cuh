// Softmax helpers shared by the kernels of every CUDA family.
#pragma once

#include <math_constants.h>

#include "common/params.h"

namespace jax_flash::cuda {

// lse in log2 units; a row that saw no key (lse = -inf) gets +inf so that
// P = exp2(s - lse2) = 0 instead of inf.
__device__ __forceinline__ float Log2Lse(float lse) {
  return lse == -CUDART_INF_F ? CUDART_INF_F : lse * kLog2e;
}

// 2^x on the special-function unit (ex2.approx.ftz: ~2 ulp, -inf -> +0).
// exp2f adds range scaling around the same instruction to keep denormal
// results; a probability below 2^-126 cannot change a float32 row sum.
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace jax_flash::cuda
