// The attention features as the CUDA kernels see them, for one (batch,
// head): which keys are visible (the shared MaskPolicy), the logit transform
// (soft cap, then bias) and the dropout factor (the shared DropoutPolicy).
// Same order and formulas as the CPU's LogitTransform:
//   logit = softcap(scale * q.k) + bias, -inf where not visible.
#pragma once

#include <math_constants.h>

#include "common/mask_policy.h"
#include "common/params.h"

namespace jax_flash::cuda {

struct LogitFeatures {
  MaskPolicy mask;
  DropoutPolicy dropout;
  const float* bias = nullptr;  // this (batch, head) slice, float32 (the accumulation type)
  int64_t bias_row = 0, bias_col = 0;
  float cap = 0.0f;  // soft cap, 0 = off
  int64_t b = 0, h = 0;

  __device__ static LogitFeatures For(const AttentionParams& p, int64_t b, int64_t h) {
    const AttentionFeatures& f = p.features;
    LogitFeatures lf;
    lf.mask = MaskPolicy::For(p, b, h);
    lf.dropout = DropoutPolicy::For(p, b);
    if (f.bias) {
      lf.bias = static_cast<const float*>(f.bias) + f.BroadcastOffset(f.bias_stride, b, h);
      lf.bias_row = f.bias_stride.row;
      lf.bias_col = f.bias_stride.col;
    }
    lf.cap = float(f.softcap);
    lf.b = b;
    lf.h = h;
    return lf;
  }

  // The logit of (query i, key j) in log2 units from score = log2(e) * scale
  // * q.k; *tanh_value gets tanh(scale * q.k / cap) for the backward's chain
  // rule (0 without a soft cap). -inf when the pair is not visible.
  __device__ float Logit(float score, int64_t i, int64_t j, float* tanh_value) const {
    *tanh_value = 0.0f;
    if (!mask.Visible(i, j)) return -CUDART_INF_F;
    return Transform(score, i, j, tanh_value);
  }

  // Logit without the visibility check.
  __device__ float Transform(float score, int64_t i, int64_t j, float* tanh_value) const {
    *tanh_value = 0.0f;
    if (cap <= 0.0f && !bias) return score;
    float x = score * kLn2;  // scale * q.k
    if (cap > 0.0f) {
      *tanh_value = tanhf(x / cap);
      x = cap * *tanh_value;
    }
    if (bias) x += bias[i * bias_row + j * bias_col];
    return x * kLog2e;
  }

  // 0 (dropped) or 1 / (1 - rate); 1 without dropout.
  __device__ float DropFactor(int64_t i, int64_t j) const {
    return dropout.active ? dropout.Factor(b, h, i, j) : 1.0f;
  }

  // Whether logits need more than the scale (soft cap, bias) or P a dropout
  // factor: then every block takes the per-element path.
  __device__ static bool ElementwiseLogits(const AttentionParams& p) {
    const AttentionFeatures& f = p.features;
    return f.bias || f.softcap > 0.0 || (f.dropout_rate > 0.0 && f.dropout_seed);
  }

  // d(scale * q.k) from d(logit): the soft cap's derivative 1 - tanh^2.
  __device__ float ChainSoftcap(float dlogit, float tanh_value) const {
    return cap > 0.0f ? dlogit * (1.0f - tanh_value * tanh_value) : dlogit;
  }
};

}  // namespace jax_flash::cuda
