// Generic forward: out = softmax(logits) v and lse, online softmax, with every
// attention feature (LogitFeatures: masks, lengths, segments, window, soft
// cap, bias, dropout).
#pragma once

#include <math_constants.h>

#include "common/params.h"
#include "common/row_end.h"
#include "cuda/generic/block_io.cuh"
#include "cuda/generic/kernel_traits.cuh"
#include "cuda/logit_features.cuh"

namespace jax_flash::cuda {

// grid: (ceil(seqlen_q / kRowsPerBlock), num_heads, batch); block: kThreads.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(GenericTraits<kHeadDim>::kThreads)
    GenericForwardKernel(const AttentionParams p) {
  using Tr = GenericTraits<kHeadDim>;
  constexpr int R = Tr::kRowsPerWarp, C = Tr::kColsPerLane, P = Tr::kTilePitch;
  extern __shared__ float smem[];
  float* q_s = smem;                                 // [kRowsPerBlock][kHeadDim], log2 units
  float* k_s = q_s + Tr::kRowsPerBlock * kHeadDim;   // [kTile][P]
  float* v_s = k_s + Tr::kTile * P;                  // [kTile][P]

  const auto& s = p.shape;
  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / s.group();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t block_row0 = int64_t(blockIdx.x) * Tr::kRowsPerBlock;
  const int64_t warp_row0 = block_row0 + warp * R;
  const int d = int(s.head_dim);

  const Element* q = static_cast<const Element*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head;
  const Element* k = static_cast<const Element*>(p.k) + b * p.k_stride.batch + hk * p.k_stride.head;
  const Element* v = static_cast<const Element*>(p.v) + b * p.k_stride.batch + hk * p.k_stride.head;

  StageRows<Tr::kRowsPerBlock, kHeadDim, Tr::kThreads>(q_s, kHeadDim, q, p.q_stride.row, block_row0,
                                                       s.seqlen_q, d, float(p.scale) * kLog2e);
  float acc[R][C] = {};
  float row_max[R], lane_sum[R];  // lane_sum: this lane's share of the row sum
#pragma unroll
  for (int r = 0; r < R; ++r) row_max[r] = -CUDART_INF_F, lane_sum[r] = 0.0f;

  // Only key tiles that some row of the block may see (causal, window, lengths).
  const LogitFeatures lf = LogitFeatures::For(p, b, h);
  int64_t kv_lo, kv_hi;
  lf.mask.KeyRange(block_row0, block_row0 + Tr::kRowsPerBlock, &kv_lo, &kv_hi);
  for (int64_t t0 = kv_lo / Tr::kTile * Tr::kTile; t0 < kv_hi; t0 += Tr::kTile) {
    __syncthreads();  // previous tile fully consumed
    StageRows<Tr::kTile, kHeadDim, Tr::kThreads>(k_s, P, k, p.k_stride.row, t0, s.seqlen_k, d, 1.0f);
    StageRows<Tr::kTile, kHeadDim, Tr::kThreads>(v_s, P, v, p.k_stride.row, t0, s.seqlen_k, d, 1.0f);
    __syncthreads();

    float score[R] = {};  // lane's key against the warp's R query rows
    const float* k_row = k_s + lane * P;
    const float* q_warp = q_s + warp * R * kHeadDim;
#pragma unroll 8
    for (int c = 0; c < kHeadDim; ++c) {
      const float kc = k_row[c];
#pragma unroll
      for (int r = 0; r < R; ++r) score[r] += q_warp[r * kHeadDim + c] * kc;
    }
    const int64_t key = t0 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float unused_tanh;
      const float x = lf.Logit(score[r], warp_row0 + r, key, &unused_tanh);
      const float m_new = fmaxf(row_max[r], WarpMax(x));
      // Nothing visible yet: keep P = 0 instead of exp2(-inf + inf) = NaN.
      const float m_use = m_new == -CUDART_INF_F ? 0.0f : m_new;
      const float alpha = exp2f(row_max[r] - m_use);
      const float prob = exp2f(x - m_use);
      lane_sum[r] = lane_sum[r] * alpha + prob;  // the normalizer ignores dropout
      score[r] = prob == 0.0f ? 0.0f : prob * lf.DropFactor(warp_row0 + r, key);
      row_max[r] = m_new;
#pragma unroll
      for (int c = 0; c < C; ++c) acc[r][c] *= alpha;
    }
#pragma unroll 4
    for (int j = 0; j < Tr::kTile; ++j) {
      float pj[R];
#pragma unroll
      for (int r = 0; r < R; ++r) pj[r] = __shfl_sync(kFullMask, score[r], j);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float vj = v_s[j * P + c * 32 + lane];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][c] += pj[r] * vj;
      }
    }
  }

  Element* out = static_cast<Element*>(p.out) + b * p.q_stride.batch + h * p.q_stride.head;
  const float sink2 = SinkLog2<float>(p.features, b, h, s.num_heads);  // -inf: no sinks
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = warp_row0 + r;
    const float l = WarpSum(lane_sum[r]);
    if (row >= s.seqlen_q) continue;
    const RowEnd<float> end = EndRow(row_max[r], l, sink2);  // no visible key: zeros (and the sink's lse)
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int col = c * 32 + lane;
      if (col < d) out[row * p.q_stride.row + col] = FromFloat<Element>(acc[r][c] * end.scale);
    }
    if (lane == 0) static_cast<float*>(p.lse)[p.row_stat_index(b, h, row)] = end.lse;
  }
}

}  // namespace jax_flash::cuda
