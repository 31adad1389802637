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

// tanh from one exp2 and one approximate reciprocal (MUFU.EX2, MUFU.RCP and
// three more instructions; tanhf takes ~20 and a branch): absolute error
// ~3e-7 over the whole range (saturating to +-1; the relative error grows
// only near 0, where the soft cap's logit c * tanh(x / c) keeps an absolute
// error of ~3e-7 c, far below a 16-bit input's rounding of the logits).
__device__ __forceinline__ float FastTanh(float x) {
  const float e = FastExp2(x * (2.0f * kLog2e));  // exp(2x): +inf for large x, 0 for very negative
  return 1.0f - __fdividef(2.0f, 1.0f + e);       // 2 / inf = 0
}

// tanh on the special-function unit (tanh.approx.f32, sm_75+: one MUFU,
// relative error ~2^-11): for bfloat16 inputs, whose own rounding of a logit
// (2^-9 relative) is four times larger; float16 keeps FastTanh.
__device__ __forceinline__ float TanhApprox(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace jax_flash::cuda
