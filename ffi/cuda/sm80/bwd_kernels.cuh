// FlashAttention-2 backward on mma.sync, as two deterministic passes after
// the generic delta kernel (no atomics, no float32 scratch):
//   dQ pass, per 128 query rows:  S = Q K^T, dP = dO V^T, dS = P (dP - delta), dQ += dS K
//   dK/dV pass, per 128 key rows: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q
// Computing the transposed products in the dK/dV pass leaves P^T and dS^T
// in the accumulator layout that feeds the next mma directly.
#pragma once

#include <math_constants.h>

#include "common/params.h"
#include "cuda/sm80/kernel_traits.cuh"
#include "cuda/sm80/mma.cuh"
#include "cuda/row_stats.cuh"
#include "cuda/sm80/warp_gemm.cuh"

namespace jax_flash::cuda::sm80 {

// grid: (ceil(seqlen_q / kBlockRows), num_heads, batch).
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1)
    DqKernel(const AttentionParams p) {
  using Tr = BwdTraits<kHeadDim>;
  constexpr int kN = Tr::kNTiles, kD = kHeadDim / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_tile = SmemAddr(smem);                          // [kBlockRows][kHeadDim]
  const uint32_t do_tile = q_tile + Tr::kBlockRows * Tr::kTileBytes;
  // Per stage: K then V, [kBlockCols][kHeadDim] each.
  const uint32_t kv_stages = do_tile + Tr::kBlockRows * Tr::kTileBytes;

  const auto& s = p.shape;
  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / s.group();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t m0 = int64_t(blockIdx.x) * Tr::kBlockRows;
  const int warp_row = warp * 16;
  const int d = int(s.head_dim);
  const int64_t q_off = b * p.q_stride.batch + h * p.q_stride.head;
  const int64_t k_off = b * p.k_stride.batch + hk * p.k_stride.head;
  const Element* k = static_cast<const Element*>(p.k) + k_off;
  const Element* v = static_cast<const Element*>(p.v) + k_off;

  LoadTileAsync<Tr::kBlockRows, kHeadDim, Tr::kThreads>(
      q_tile, static_cast<const Element*>(p.q) + q_off, p.q_stride.row, m0, s.seqlen_q, d);
  LoadTileAsync<Tr::kBlockRows, kHeadDim, Tr::kThreads>(
      do_tile, static_cast<const Element*>(p.dout) + q_off, p.q_stride.row, m0, s.seqlen_q, d);
  CpAsyncCommit();

  float lse2[2], delta[2];  // rows g and g + 8 of this warp's m-tile
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int64_t row = min(m0 + warp_row + g + hh * 8, s.seqlen_q - 1);  // tail rows: discarded
    lse2[hh] = Log2Lse(static_cast<const float*>(p.lse)[p.row_stat_index(b, h, row)]);
    delta[hh] = static_cast<const float*>(p.delta)[p.row_stat_index(b, h, row)];
  }
  const float scale_log2 = float(p.scale) * kLog2e;
  float dq[1][kD][4] = {};

  const int64_t kv_end = p.is_causal ? min(s.seqlen_k, m0 + Tr::kBlockRows) : s.seqlen_k;
  const int steps = int((kv_end + Tr::kBlockCols - 1) / Tr::kBlockCols);
  auto load_kv = [&](int step) {
    const uint32_t stage = kv_stages + (step % Tr::kStages) * Tr::kStageBytes;
    const int64_t n0 = int64_t(step) * Tr::kBlockCols;
    LoadTileAsync<Tr::kBlockCols, kHeadDim, Tr::kThreads>(stage, k, p.k_stride.row, n0, s.seqlen_k, d);
    LoadTileAsync<Tr::kBlockCols, kHeadDim, Tr::kThreads>(stage + Tr::kBlockCols * Tr::kTileBytes, v,
                                                          p.k_stride.row, n0, s.seqlen_k, d);
    CpAsyncCommit();
  };
  load_kv(0);
  for (int step = 0; step < steps; ++step) {
    CpAsyncWait<0>();
    __syncthreads();  // this step's K/V landed; every warp is done with the previous step's
    if (step + 1 < steps) load_kv(step + 1);  // into the stage the previous step used
    const int64_t n0 = int64_t(step) * Tr::kBlockCols;
    const uint32_t k_tile = kv_stages + (step % Tr::kStages) * Tr::kStageBytes;
    const uint32_t v_tile = k_tile + Tr::kBlockCols * Tr::kTileBytes;

    float sc[1][kN][4] = {}, dp[1][kN][4] = {};
    GemmSmemSmemT<Element, 1, kN, kHeadDim, 8>(sc, q_tile, warp_row, k_tile, 0, lane);   // S
    GemmSmemSmemT<Element, 1, kN, kHeadDim, 8>(dp, do_tile, warp_row, v_tile, 0, lane);  // dP
    const int col_limit = int(min(int64_t(Tr::kBlockCols), s.seqlen_k - n0));
    const int diagonal = int(m0 - n0);
#pragma unroll
    for (int nt = 0; nt < kN; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = warp_row + g + (i / 2) * 8, col = nt * 8 + 2 * t + (i % 2);
        const bool visible = col < col_limit && (!p.is_causal || col <= row + diagonal);
        const float prob = visible ? exp2f(sc[0][nt][i] * scale_log2 - lse2[i / 2]) : 0.0f;
        sc[0][nt][i] = prob * (dp[0][nt][i] - delta[i / 2]);  // dS
      }
    GemmRegsSmem<Element, 1, kN, kHeadDim>(dq, sc, k_tile, 0, lane);  // dQ += dS K
  }

  Element* dq_out = static_cast<Element*>(p.dq) + q_off;
  StoreAccumulator<Element, 1, kHeadDim>(dq, dq_out, p.q_stride.row, m0 + warp_row, s.seqlen_q, d,
                                         float(p.scale), lane);
}

// grid: (ceil(seqlen_k / kBlockRows), num_heads_k, batch). Sums over the
// query heads of the key head's group (GQA) in registers.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1)
    DkvKernel(const AttentionParams p) {
  using Tr = BwdTraits<kHeadDim>;
  constexpr int kN = Tr::kNTiles, kD = kHeadDim / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t k_tile = SmemAddr(smem);                          // [kBlockRows][kHeadDim]
  const uint32_t v_tile = k_tile + Tr::kBlockRows * Tr::kTileBytes;
  // Per stage: Q then dO, [kBlockCols][kHeadDim] each; lse2 and delta [kBlockCols].
  const uint32_t qdo_stages = v_tile + Tr::kBlockRows * Tr::kTileBytes;
  float* row_stats = reinterpret_cast<float*>(smem + Tr::kRowStatsOffset);  // [kStages][2][kBlockCols]

  const auto& s = p.shape;
  const int64_t b = blockIdx.z, hk = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t(blockIdx.x) * Tr::kBlockRows;  // first key of the block
  const int warp_row = warp * 16;
  const int d = int(s.head_dim);
  const int64_t k_off = b * p.k_stride.batch + hk * p.k_stride.head;

  LoadTileAsync<Tr::kBlockRows, kHeadDim, Tr::kThreads>(
      k_tile, static_cast<const Element*>(p.k) + k_off, p.k_stride.row, n0, s.seqlen_k, d);
  LoadTileAsync<Tr::kBlockRows, kHeadDim, Tr::kThreads>(
      v_tile, static_cast<const Element*>(p.v) + k_off, p.k_stride.row, n0, s.seqlen_k, d);
  CpAsyncCommit();
  const float scale_log2 = float(p.scale) * kLog2e;
  float dk[1][kD][4] = {}, dv[1][kD][4] = {};

  // Steps run over (query head of the group, query block) pairs, flattened so
  // the next step's tiles can load whatever head they belong to. Causal:
  // queries before the block's first key see none of its keys.
  const int64_t m_start = p.is_causal ? (n0 / Tr::kBlockCols) * Tr::kBlockCols : 0;
  const int m_steps = int(max(int64_t(0), (s.seqlen_q - m_start + Tr::kBlockCols - 1) / Tr::kBlockCols));
  const int steps = int(s.group()) * m_steps;
  auto load_qdo = [&](int step) {
    const int64_t h = hk * s.group() + step / m_steps;
    const int64_t m0 = m_start + int64_t(step % m_steps) * Tr::kBlockCols;
    const int64_t q_off = b * p.q_stride.batch + h * p.q_stride.head;
    const uint32_t stage = qdo_stages + (step % Tr::kStages) * Tr::kStageBytes;
    LoadTileAsync<Tr::kBlockCols, kHeadDim, Tr::kThreads>(
        stage, static_cast<const Element*>(p.q) + q_off, p.q_stride.row, m0, s.seqlen_q, d);
    LoadTileAsync<Tr::kBlockCols, kHeadDim, Tr::kThreads>(
        stage + Tr::kBlockCols * Tr::kTileBytes, static_cast<const Element*>(p.dout) + q_off,
        p.q_stride.row, m0, s.seqlen_q, d);
    CpAsyncCommit();
    if (threadIdx.x < Tr::kBlockCols) {  // plain loads: visible after the next barrier
      float* stats = row_stats + (step % Tr::kStages) * 2 * Tr::kBlockCols;
      const int64_t row = min(m0 + threadIdx.x, s.seqlen_q - 1);
      stats[threadIdx.x] = Log2Lse(static_cast<const float*>(p.lse)[p.row_stat_index(b, h, row)]);
      stats[Tr::kBlockCols + threadIdx.x] =
          static_cast<const float*>(p.delta)[p.row_stat_index(b, h, row)];
    }
  };
  if (steps > 0) load_qdo(0);
  for (int step = 0; step < steps; ++step) {
    CpAsyncWait<0>();
    __syncthreads();  // this step's tiles landed; every warp is done with the previous step's
    if (step + 1 < steps) load_qdo(step + 1);  // into the stage the previous step used
    const int64_t m0 = m_start + int64_t(step % m_steps) * Tr::kBlockCols;
    const uint32_t q_tile = qdo_stages + (step % Tr::kStages) * Tr::kStageBytes;
    const uint32_t do_tile = q_tile + Tr::kBlockCols * Tr::kTileBytes;
    const float* lse2_s = row_stats + (step % Tr::kStages) * 2 * Tr::kBlockCols;
    const float* delta_s = lse2_s + Tr::kBlockCols;

    float st[1][kN][4] = {}, dpt[1][kN][4] = {};
    GemmSmemSmemT<Element, 1, kN, kHeadDim, 2>(st, k_tile, warp_row, q_tile, 0, lane);    // S^T
    GemmSmemSmemT<Element, 1, kN, kHeadDim, 2>(dpt, v_tile, warp_row, do_tile, 0, lane);  // dP^T
#pragma unroll
    for (int nt = 0; nt < kN; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t key = n0 + warp_row + g + (i / 2) * 8;
        const int col = nt * 8 + 2 * t + (i % 2);
        const int64_t query = m0 + col;
        const bool visible =
            query < s.seqlen_q && key < s.seqlen_k && (!p.is_causal || key <= query);
        const float prob = visible ? exp2f(st[0][nt][i] * scale_log2 - lse2_s[col]) : 0.0f;
        st[0][nt][i] = prob;                                  // P^T
        dpt[0][nt][i] = prob * (dpt[0][nt][i] - delta_s[col]);  // dS^T
      }
    GemmRegsSmem<Element, 1, kN, kHeadDim>(dv, st, do_tile, 0, lane);  // dV += P^T dO
    GemmRegsSmem<Element, 1, kN, kHeadDim>(dk, dpt, q_tile, 0, lane);  // dK += dS^T Q
  }

  CpAsyncWait<0>();  // a block whose keys no query sees never waited for its K/V copies
  const int64_t out_off = k_off;
  StoreAccumulator<Element, 1, kHeadDim>(dk, static_cast<Element*>(p.dk) + out_off, p.k_stride.row,
                                         n0 + warp_row, s.seqlen_k, d, float(p.scale), lane);
  StoreAccumulator<Element, 1, kHeadDim>(dv, static_cast<Element*>(p.dv) + out_off, p.k_stride.row,
                                         n0 + warp_row, s.seqlen_k, d, 1.0f, lane);
}

}  // namespace jax_flash::cuda::sm80
