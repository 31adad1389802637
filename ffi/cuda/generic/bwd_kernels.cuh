// Generic backward: delta = rowsum(dout * out), then dQ (parallel over query
// rows) and dK/dV (parallel over key rows), each recomputing P from lse.
// Two passes instead of one with dQ atomics: every gradient element is owned
// by one warp, so results are deterministic and need no float32 scratch.
#pragma once

#include <math_constants.h>

#include "common/params.h"
#include "cuda/generic/block_io.cuh"
#include "cuda/generic/kernel_traits.cuh"
#include "cuda/logit_features.cuh"
#include "cuda/row_stats.cuh"

namespace jax_flash::cuda {

// One warp per query row. grid: (ceil(batch * heads * seqlen_q / 8)); block 256.
template <typename Element>
__global__ void __launch_bounds__(256) DeltaKernel(const AttentionParams p) {
  const auto& s = p.shape;
  const int64_t row_id = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;  // (b, h, i) flattened
  const int lane = threadIdx.x % 32;
  if (row_id >= s.batch * s.num_heads * s.seqlen_q) return;
  const int64_t i = row_id % s.seqlen_q, h = (row_id / s.seqlen_q) % s.num_heads;
  const int64_t b = row_id / (s.seqlen_q * s.num_heads);
  const int64_t off = b * p.q_stride.batch + h * p.q_stride.head + i * p.q_stride.row;
  const Element* o = static_cast<const Element*>(p.out) + off;
  const Element* dout = static_cast<const Element*>(p.dout) + off;
  float acc = 0.0f;
  for (int64_t c = lane; c < s.head_dim; c += 32) acc += ToFloat(o[c]) * ToFloat(dout[c]);
  acc = WarpSum(acc);
  if (lane == 0) static_cast<float*>(p.delta)[row_id] = acc;
}

// dQ = scale * dS K with dS = P * (dP * dropout - delta), dP = dO V^T, through
// the soft cap's derivative. kBiasGrad: instead of dQ, adds dS (the gradient
// of the logits) into the bias gradient at the bias's own (broadcast)
// offsets (AddDbias: float32 atomics, or stores where the bias is not broadcast).
// grid: (ceil(seqlen_q / kRowsPerBlock), num_heads, batch).
template <typename Element, int kHeadDim, bool kBiasGrad = false>
__global__ void __launch_bounds__(GenericTraits<kHeadDim>::kThreads)
    GenericDqKernel(const AttentionParams p) {
  using Tr = GenericTraits<kHeadDim>;
  constexpr int R = Tr::kRowsPerWarp, C = Tr::kColsPerLane, P = Tr::kTilePitch;
  extern __shared__ float smem[];
  float* q_s = smem;                                  // [kRowsPerBlock][kHeadDim], log2 units
  float* do_s = q_s + Tr::kRowsPerBlock * kHeadDim;   // [kRowsPerBlock][kHeadDim]
  float* k_s = do_s + Tr::kRowsPerBlock * kHeadDim;   // [kTile][P]
  float* v_s = k_s + Tr::kTile * P;                   // [kTile][P]

  const auto& s = p.shape;
  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / s.group();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t block_row0 = int64_t(blockIdx.x) * Tr::kRowsPerBlock;
  const int64_t warp_row0 = block_row0 + warp * R;
  const int d = int(s.head_dim);
  const int64_t q_off = b * p.q_stride.batch + h * p.q_stride.head;
  const int64_t k_off = b * p.k_stride.batch + hk * p.k_stride.head;
  const Element* k = static_cast<const Element*>(p.k) + k_off;
  const Element* v = static_cast<const Element*>(p.v) + k_off;

  StageRows<Tr::kRowsPerBlock, kHeadDim, Tr::kThreads>(
      q_s, kHeadDim, static_cast<const Element*>(p.q) + q_off, p.q_stride.row, block_row0,
      s.seqlen_q, d, float(p.scale) * kLog2e);
  StageRows<Tr::kRowsPerBlock, kHeadDim, Tr::kThreads>(
      do_s, kHeadDim, static_cast<const Element*>(p.dout) + q_off, p.q_stride.row, block_row0,
      s.seqlen_q, d, 1.0f);
  float lse2[R], delta[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = min(warp_row0 + r, s.seqlen_q - 1);  // rows past the end are discarded
    lse2[r] = Log2Lse(static_cast<float*>(p.lse)[p.row_stat_index(b, h, row)]);
    delta[r] = static_cast<float*>(p.delta)[p.row_stat_index(b, h, row)];
  }
  float acc[R][C] = {};

  const LogitFeatures lf = LogitFeatures::For(p, b, h);
  int64_t kv_lo, kv_hi;
  lf.mask.KeyRange(block_row0, block_row0 + Tr::kRowsPerBlock, &kv_lo, &kv_hi);
  for (int64_t t0 = kv_lo / Tr::kTile * Tr::kTile; t0 < kv_hi; t0 += Tr::kTile) {
    __syncthreads();
    StageRows<Tr::kTile, kHeadDim, Tr::kThreads>(k_s, P, k, p.k_stride.row, t0, s.seqlen_k, d, 1.0f);
    StageRows<Tr::kTile, kHeadDim, Tr::kThreads>(v_s, P, v, p.k_stride.row, t0, s.seqlen_k, d, 1.0f);
    __syncthreads();

    float score[R] = {}, dprob[R] = {};
    const float* k_row = k_s + lane * P;
    const float* v_row = v_s + lane * P;
    const float* q_warp = q_s + warp * R * kHeadDim;
    const float* do_warp = do_s + warp * R * kHeadDim;
#pragma unroll 8
    for (int c = 0; c < kHeadDim; ++c) {
      const float kc = k_row[c], vc = v_row[c];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        score[r] += q_warp[r * kHeadDim + c] * kc;
        dprob[r] += do_warp[r * kHeadDim + c] * vc;
      }
    }
    const int64_t key = t0 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = warp_row0 + r;
      float tanh_value;
      const float prob = exp2f(lf.Logit(score[r], row, key, &tanh_value) - lse2[r]);
      const float ds = prob == 0.0f ? 0.0f : prob * (dprob[r] * lf.DropFactor(row, key) - delta[r]);
      if constexpr (kBiasGrad) {
        const AttentionFeatures& f = p.features;
        if (row < s.seqlen_q && key < s.seqlen_k)
          AddDbias<Element, /*kCallStore=*/true>(f, f.BroadcastOffset(f.bias_stride, b, h), row, key, ds);
      }
      score[r] = lf.ChainSoftcap(ds, tanh_value);
    }
    if constexpr (!kBiasGrad) {
#pragma unroll 4
      for (int j = 0; j < Tr::kTile; ++j) {
        float ds[R];
#pragma unroll
        for (int r = 0; r < R; ++r) ds[r] = __shfl_sync(kFullMask, score[r], j);
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const float kj = k_s[j * P + c * 32 + lane];
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][c] += ds[r] * kj;
        }
      }
    }
  }

  if constexpr (kBiasGrad) return;
  Element* dq = static_cast<Element*>(p.dq) + q_off;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = warp_row0 + r;
    if (row >= s.seqlen_q) continue;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int col = c * 32 + lane;
      if (col < d) dq[row * p.q_stride.row + col] = FromFloat<Element>(acc[r][c] * float(p.scale));
    }
  }
}

// dbias = float32 sums rounded to the bias's 16-bit type, after the
// bias-gradient pass added into them by atomics. grid: (ceil(n / 256)); block 256.
template <typename Element>
__global__ void __launch_bounds__(256) DbiasConvertKernel(const float* sums, Element* dbias, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (i < n) dbias[i] = FromFloat<Element>(sums[i]);
}

// dV = P^T dO and dK = scale * dS^T Q for one block of key rows, summed over
// the query heads of the key head's group (GQA) without per-head buffers.
// grid: (ceil(seqlen_k / kRowsPerBlock), num_heads_k, batch).
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(GenericTraits<kHeadDim>::kThreads)
    GenericDkvKernel(const AttentionParams p) {
  using Tr = GenericTraits<kHeadDim>;
  constexpr int R = Tr::kRowsPerWarp, C = Tr::kColsPerLane, P = Tr::kTilePitch;
  extern __shared__ float smem[];
  float* k_s = smem;                                  // [kRowsPerBlock][kHeadDim]
  float* v_s = k_s + Tr::kRowsPerBlock * kHeadDim;    // [kRowsPerBlock][kHeadDim]
  float* q_s = v_s + Tr::kRowsPerBlock * kHeadDim;    // [kTile][P], log2 units
  float* do_s = q_s + Tr::kTile * P;                  // [kTile][P]
  float* lse2_s = do_s + Tr::kTile * P;               // [kTile]
  float* delta_s = lse2_s + Tr::kTile;                // [kTile]

  const auto& s = p.shape;
  const int64_t b = blockIdx.z, hk = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t block_row0 = int64_t(blockIdx.x) * Tr::kRowsPerBlock;
  const int64_t warp_row0 = block_row0 + warp * R;
  const int d = int(s.head_dim);
  const int64_t k_off = b * p.k_stride.batch + hk * p.k_stride.head;

  StageRows<Tr::kRowsPerBlock, kHeadDim, Tr::kThreads>(
      k_s, kHeadDim, static_cast<const Element*>(p.k) + k_off, p.k_stride.row, block_row0,
      s.seqlen_k, d, 1.0f);
  StageRows<Tr::kRowsPerBlock, kHeadDim, Tr::kThreads>(
      v_s, kHeadDim, static_cast<const Element*>(p.v) + k_off, p.k_stride.row, block_row0,
      s.seqlen_k, d, 1.0f);
  float dk_acc[R][C] = {}, dv_acc[R][C] = {};

  for (int64_t g = 0; g < s.group(); ++g) {
    const int64_t h = hk * s.group() + g;
    const int64_t q_off = b * p.q_stride.batch + h * p.q_stride.head;
    const Element* q = static_cast<const Element*>(p.q) + q_off;
    const Element* dout = static_cast<const Element*>(p.dout) + q_off;
    // Only query tiles that may see some key of the block (causal, window, lengths).
    const LogitFeatures lf = LogitFeatures::For(p, b, h);
    int64_t q_lo, q_hi;
    lf.mask.QueryRange(block_row0, block_row0 + Tr::kRowsPerBlock, &q_lo, &q_hi);
    for (int64_t t0 = q_lo; t0 < q_hi; t0 += Tr::kTile) {
      __syncthreads();
      StageRows<Tr::kTile, kHeadDim, Tr::kThreads>(q_s, P, q, p.q_stride.row, t0, s.seqlen_q, d,
                                                   float(p.scale) * kLog2e);
      StageRows<Tr::kTile, kHeadDim, Tr::kThreads>(do_s, P, dout, p.q_stride.row, t0, s.seqlen_q,
                                                   d, 1.0f);
      if (threadIdx.x < Tr::kTile) {
        const int64_t row = min(t0 + threadIdx.x, s.seqlen_q - 1);
        lse2_s[threadIdx.x] = Log2Lse(static_cast<float*>(p.lse)[p.row_stat_index(b, h, row)]);
        delta_s[threadIdx.x] = static_cast<float*>(p.delta)[p.row_stat_index(b, h, row)];
      }
      __syncthreads();

      float score[R] = {}, dprob[R] = {};  // lane's query against the warp's R keys
      const float* q_row = q_s + lane * P;
      const float* do_row = do_s + lane * P;
      const float* k_warp = k_s + warp * R * kHeadDim;
      const float* v_warp = v_s + warp * R * kHeadDim;
#pragma unroll 8
      for (int c = 0; c < kHeadDim; ++c) {
        const float qc = q_row[c], doc = do_row[c];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          score[r] += k_warp[r * kHeadDim + c] * qc;
          dprob[r] += v_warp[r * kHeadDim + c] * doc;
        }
      }
      const int64_t query = t0 + lane;
      const float lse2 = lse2_s[lane], delta = delta_s[lane];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t key = warp_row0 + r;
        float tanh_value;
        const float prob = exp2f(lf.Logit(score[r], query, key, &tanh_value) - lse2);
        const float drop = prob == 0.0f ? 0.0f : lf.DropFactor(query, key);
        score[r] = prob * drop;  // dV uses the dropped-out P
        dprob[r] = lf.ChainSoftcap(prob * (dprob[r] * drop - delta), tanh_value);  // dS
      }
#pragma unroll 4
      for (int j = 0; j < Tr::kTile; ++j) {
        float pj[R], dsj[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          pj[r] = __shfl_sync(kFullMask, score[r], j);
          dsj[r] = __shfl_sync(kFullMask, dprob[r], j);
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const float doj = do_s[j * P + c * 32 + lane];
          const float qj = q_s[j * P + c * 32 + lane];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            dv_acc[r][c] += pj[r] * doj;
            dk_acc[r][c] += dsj[r] * qj;
          }
        }
      }
    }
  }

  // q_s held q * scale * log2(e); dK = scale * dS^T q = acc * ln(2).
  Element* dk = static_cast<Element*>(p.dk) + k_off;
  Element* dv = static_cast<Element*>(p.dv) + k_off;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = warp_row0 + r;
    if (row >= s.seqlen_k) continue;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const int col = c * 32 + lane;
      if (col < d) {
        dk[row * p.k_stride.row + col] = FromFloat<Element>(dk_acc[r][c] * kLn2);
        dv[row * p.k_stride.row + col] = FromFloat<Element>(dv_acc[r][c]);
      }
    }
  }
}

}  // namespace jax_flash::cuda
