// Merges the splits' partial results of the split-KV forward: for each query
// row, partials O_s (normalized by their own sums) and lse_s (natural log)
// combine as
//   lse = log sum_s exp(lse_s),  out = sum_s exp(lse_s - lse) O_s,
// a split that saw no key (lse_s = -inf) contributing nothing, and a row no
// split saw getting zeros and lse -inf (the contract of every family).
// One warp per row: the lanes share the splits for the two reductions, then
// four columns each per pass (float4 reads, coalesced across the row).
#pragma once

#include <math_constants.h>

#include "common/row_end.h"
#include "cuda/decode/problem.cuh"
#include "cuda/sm80/mma.cuh"

namespace jax_flash::cuda::decode {

constexpr int kCombineWarps = 4;

template <typename Element>
__global__ void __launch_bounds__(kCombineWarps * 32) CombineSplitsKernel(const DecodeArgs args) {
  const AttentionParams& p = args.attn;
  const AttentionShape& s = p.shape;
  const int64_t all_rows = s.batch * s.num_heads * s.seqlen_q;
  const int64_t row = int64_t(blockIdx.x) * kCombineWarps + threadIdx.x / 32;  // row_stat_index order
  if (row >= all_rows) return;
  const int lane = threadIdx.x % 32;
  const int splits = args.splits, d = int(s.head_dim);
  const float* lse_s = args.partial_lse + row;  // split k at [k * all_rows]

  float m = -CUDART_INF_F;
  for (int k = lane; k < splits; k += 32) m = fmaxf(m, lse_s[k * all_rows]);
#pragma unroll
  for (int w = 16; w >= 1; w /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, w));
  float l = 0.0f;
  if (m != -CUDART_INF_F)
    for (int k = lane; k < splits; k += 32) l += __expf(lse_s[k * all_rows] - m);
#pragma unroll
  for (int w = 16; w >= 1; w /= 2) l += __shfl_xor_sync(0xffffffffu, l, w);
  const int64_t t = row % s.seqlen_q, h = row / s.seqlen_q % s.num_heads, b = row / (s.seqlen_q * s.num_heads);
  float inv = l > 0.0f ? 1.0f / l : 0.0f, lse = l > 0.0f ? m + logf(l) : -CUDART_INF_F;
  // Attention sinks (row_end.h, in log2 units there): the row's denominator
  // gains exp(sink - m); a row no split saw gets zeros and the sink's lse.
  if (const float sink2 = SinkLog2<float>(p.features, b, h, s.num_heads); sink2 > -CUDART_INF_F) {
    const RowEnd<float> end = EndRow(m * kLog2e, l, sink2);
    inv = end.scale, lse = end.lse;
  }
  Element* out = static_cast<Element*>(p.out) + b * p.q_stride.batch + t * p.q_stride.row + h * p.q_stride.head;
  const float* part = args.partial_out + row * d;  // split k at [k * all_rows * d]
  for (int c = 4 * lane; c < d; c += 128) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (m != -CUDART_INF_F) {
#pragma unroll 4
      for (int k = 0; k < splits; ++k) {
        const float f = __expf(lse_s[k * all_rows] - m) * inv;  // 0 for a split that saw nothing
        const float4 x = *reinterpret_cast<const float4*>(part + k * all_rows * d + c);
        acc.x += f * x.x, acc.y += f * x.y, acc.z += f * x.z, acc.w += f * x.w;
      }
    }
    uint2 packed;
    packed.x = sm80::Pack2<Element>(acc.x, acc.y);
    packed.y = sm80::Pack2<Element>(acc.z, acc.w);
    *reinterpret_cast<uint2*>(out + c) = packed;
  }
  if (lane == 0) static_cast<float*>(p.lse)[row] = lse;
}

}  // namespace jax_flash::cuda::decode
