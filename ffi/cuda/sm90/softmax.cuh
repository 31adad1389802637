// Masking and online softmax on wgmma accumulator fragments. A consumer
// thread holds two rows of S (row g and g + 8 of its warp's 16): element
// 4j + 2hh + e is row g + 8hh, column 8j + 2t + e (wgmma.cuh); a row's
// other columns live in lanes 4g .. 4g + 3, reached by two shuffles.
#pragma once

#include <math_constants.h>

#include <cmath>  // INFINITY (CUDART_INF_F is device-only, and the host pass parses this)
#include <cstdint>

#include "common/params.h"
#include "cuda/row_stats.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace jax_flash::cuda::sm90 {

// Hides the logits the block's position makes invisible, block-relative in
// int32: column c is visible to row r when c < col_limit (the seqlen_k tail)
// and, causal, c <= r + diagonal (diagonal = first query - first key).
template <int kBlockN>
__device__ __forceinline__ void MaskLogits(float (&s)[kBlockN / 2], int row0, int t, int col_limit,
                                           int diagonal, bool causal) {
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * j + 2 * t + e;
        if (col >= col_limit || (causal && col > row0 + 8 * hh + diagonal)) s[4 * j + 2 * hh + e] = -CUDART_INF_F;
      }
}

// v[0] = max(v[0 .. 2 kWidth)), by halving (recursion, not a loop: the
// unroller gave up on the loop inside the consumer and put v on the stack).
template <int kWidth, int kN>
__device__ __forceinline__ void FoldMax(float (&v)[kN]) {
  if constexpr (kWidth >= 1) {
#pragma unroll
    for (int i = 0; i < kWidth; ++i) v[i] = fmaxf(v[i], v[i + kWidth]);
    FoldMax<kWidth / 2>(v);
  }
}

// Running maxima and sums of this thread's two rows. The maxima are in log2
// units with the scale folded in (scale > 0, so max(scale * s) = scale *
// max(s), and each probability is one FFMA and one ex2).
template <int kBlockN, int kHeadDim>
struct OnlineSoftmax {
  // How far a row's exponent offset may lag its running maximum (sm80's
  // forward: P <= 2^8 stays exact in float and 16 bits, and O is rescaled
  // only when some row of the warp outgrows it, rare past the first blocks).
  static constexpr float kRescaleSlack = 8.0f;
  float row_max[2];
  float row_sum[2];  // this thread's share (its columns)
  float scale_log2;

  __device__ __forceinline__ explicit OnlineSoftmax(float scale_log2_)
      : row_max{-INFINITY, -INFINITY}, row_sum{0.0f, 0.0f}, scale_log2(scale_log2_) {}

  // Takes block S's row maxima. Returns true (warp-uniform) when O and the
  // sums must be multiplied by alpha, which the caller does with Rescale,
  // possibly later (while O is still being written by the tensor cores);
  // row_sum is rescaled here.
  __device__ __forceinline__ bool UpdateMax(const float (&s)[kBlockN / 2], float (&alpha)[2]) {
    float blk_max[2];
    bool grow = false;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      // A balanced tree: depth log2(kBlockN / 4) instead of a kBlockN / 4
      // chain ahead of every exp2 of the row.
      float v[kBlockN / 8];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) v[j] = fmaxf(s[4 * j + 2 * hh], s[4 * j + 2 * hh + 1]);
      constexpr int kTiles = kBlockN / 8, kPow2 = kTiles >= 16 ? 16 : 8;  // 16 or 10 tiles
      static_assert(kTiles >= kPow2 && kTiles < 2 * kPow2);
#pragma unroll
      for (int i = 0; i < kTiles - kPow2; ++i) v[i] = fmaxf(v[i], v[i + kPow2]);
      FoldMax<kPow2 / 2>(v);
      float mx = v[0];
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      blk_max[hh] = mx * scale_log2;
      grow |= blk_max[hh] > row_max[hh] + kRescaleSlack;  // false while both are -inf
    }
    if (!__any_sync(0xffffffffu, grow)) return false;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float new_max = fmaxf(row_max[hh], blk_max[hh]);
      // exp2(-inf - finite) = 0; both -inf (nothing visible yet) keeps 1.
      alpha[hh] = new_max == -CUDART_INF_F ? 1.0f : FastExp2(row_max[hh] - new_max);
      row_max[hh] = new_max;
      row_sum[hh] *= alpha[hh];
    }
    return true;
  }

  __device__ __forceinline__ static void Rescale(float (&o)[kHeadDim / 2], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) o[4 * j + 2 * hh] *= alpha[hh], o[4 * j + 2 * hh + 1] *= alpha[hh];
  }

  // S = exp2(S scale_log2 - row_max) in place (float P), adding to the row
  // sums. kMasked: rows may have seen nothing visible yet (row_max -inf),
  // whose P must be 0.
  template <bool kMasked>
  __device__ __forceinline__ void Exponentiate(float (&s)[kBlockN / 2]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float m_use = (kMasked && row_max[hh] == -CUDART_INF_F) ? 0.0f : row_max[hh];
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[4 * j + 2 * hh + e];
          x = FastExp2(fmaf(x, scale_log2, -m_use));
          sum += x;
        }
      row_sum[hh] += sum;
    }
  }

  // Float P as 16-bit wgmma A fragments: k16 step kk covers n8 tiles 2kk and
  // 2kk + 1, p[kk] = {(g, 2kk), (g + 8, 2kk), (g, 2kk + 1), (g + 8, 2kk + 1)}
  // (row, n8 tile; each register the tile's columns 2t, 2t + 1).
  template <typename Element>
  __device__ __forceinline__ static void ToFragments(const float (&s)[kBlockN / 2],
                                                     uint32_t (&p)[kBlockN / 16][4]) {
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        p[j / 2][(j % 2) * 2 + hh] = PackPair<Element>(s[4 * j + 2 * hh], s[4 * j + 2 * hh + 1]);
  }

  // The whole row's sum (combined over its 4 owners) for row hh.
  __device__ __forceinline__ float RowSum(int hh) const {
    float l = row_sum[hh];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    return l;
  }
};

}  // namespace jax_flash::cuda::sm90
