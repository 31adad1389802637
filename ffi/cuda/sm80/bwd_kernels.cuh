// FlashAttention-2 backward on mma.sync, after the generic delta kernel.
// Default (fused), one pass per 128 key rows:
//   S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q, dQ += dS K
//   with dQ added into a float32 buffer by atomics, then rounded by DqConvertKernel.
// Deterministic (no atomics, bitwise reproducible), two passes:
//   dQ pass, per 128 query rows:  S = Q K^T, dP = dO V^T, dS = P (dP - delta), dQ += dS K
//   dK/dV pass as above without the dQ term.
// Computing the transposed products in the key-block pass leaves P^T and
// dS^T in the accumulator layout that feeds the next mma directly.
#pragma once

#include <math_constants.h>

#include <type_traits>

#include "common/mask_policy.h"
#include "common/params.h"
#include "cuda/logit_features.cuh"
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
  static_assert(Tr::kDSplit == 1, "the deterministic dQ pass serves head dims up to 128");
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
    GemmSmemSmemT<Element, 1, kN, kHeadDim, Tr::kQkUnroll>(sc, q_tile, warp_row, k_tile, 0, lane);   // S
    GemmSmemSmemT<Element, 1, kN, kHeadDim, Tr::kQkUnroll>(dp, do_tile, warp_row, v_tile, 0, lane);  // dP
    const int col_limit = int(min(int64_t(Tr::kBlockCols), s.seqlen_k - n0));
    const int diagonal = int(m0 - n0);
#pragma unroll
    for (int nt = 0; nt < kN; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = warp_row + g + (i / 2) * 8, col = nt * 8 + 2 * t + (i % 2);
        const bool visible = col < col_limit && (!p.is_causal || col <= row + diagonal);
        const float prob =
            visible ? FastExp2(fmaf(sc[0][nt][i], scale_log2, -lse2[i / 2])) : 0.0f;
        sc[0][nt][i] = prob * (dp[0][nt][i] - delta[i / 2]);  // dS
      }
    GemmRegsSmem<Element, 1, kN, kHeadDim>(dq, sc, k_tile, 0, lane);  // dQ += dS K
  }

  Element* dq_out = static_cast<Element*>(p.dq) + q_off;
  StoreAccumulator<Element, 1, kHeadDim>(dq, dq_out, p.q_stride.row, m0 + warp_row, s.seqlen_q, d,
                                         float(p.scale), lane);
}

// dQ[m0 + 16 mq .., dh * kDqCols ..] += dS K for this warp's quarter of the
// query block and half of the head dim, from dS^T in shared memory ([key]
// [query], so A comes through ldmatrix.trans) and the block's K tile; then
// float32 atomics into dq_accum (other key blocks add to the same rows).
// Columns go in chunks of at most 64 (32 accumulator registers), so head
// dim 256 does not need 64 registers on top of the dK/dV accumulators.
template <typename Element, int kHeadDim>
__device__ __forceinline__ void AccumulateDq(const AttentionParams& p, uint32_t ds_tile,
                                             uint32_t k_tile, int64_t b, int64_t h,
                                             int64_t m0, int warp, int lane) {
  using Tr = BwdTraits<kHeadDim>;
  constexpr int kC = kHeadDim / 8, kDsC = Tr::kBlockCols / 8;
  constexpr int kNt = Tr::kDqCols / 8 < 8 ? Tr::kDqCols / 8 : 8;  // 8-column tiles per chunk
  const int mq = warp % Tr::kDqMTiles, dh = warp / Tr::kDqMTiles;
  const auto& s = p.shape;
  const int d = int(s.head_dim);
  const int g = lane / 4, t = lane % 4;
  const SwizzledRows<kDsC> ds_rows(ds_tile, (lane / 16) * 8 + lane % 8, lane / 8 % 2);
  const SwizzledRows<kC> k_rows(k_tile, (lane / 8 % 2) * 8 + lane % 8, lane / 16);
#pragma unroll 1
  for (int chunk = 0; chunk < Tr::kDqCols / 8 / kNt; ++chunk) {
    const int tile0 = dh * (Tr::kDqCols / 8) + chunk * kNt;  // first 8-column tile
    float acc[kNt][4] = {};
#pragma unroll 2
    for (int kk = 0; kk < Tr::kBlockRows / 16; ++kk) {
      uint32_t a[4];  // dS[q 16 mq .., key 16 kk ..], from dS^T stored [key][query]
      LdMatrixX4Trans(a, ds_rows.At(kk * 16, mq * 2));
#pragma unroll
      for (int nt = 0; nt < kNt; nt += 2) {
        uint32_t bf[4];  // K[key 16 kk .., d-tiles tile0 + nt and + 1]
        LdMatrixX4Trans(bf, k_rows.At(kk * 16, tile0 + nt));
        Mma16816<Element>(acc[nt], a, bf[0], bf[1]);
        Mma16816<Element>(acc[nt + 1], a, bf[2], bf[3]);
      }
    }
    // One pointer per row (the columns are then immediate offsets) and one
    // column check per chunk: the padded head-dim case is the rare one.
    const bool all_cols = (tile0 + kNt) * 8 <= d;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int64_t row = m0 + mq * 16 + g + hh * 8;
      if (row >= s.seqlen_q) continue;
      float* dst = p.dq_accum + p.row_stat_index(b, h, row) * d + tile0 * 8 + 2 * t;
      if (all_cols) {
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
#if __CUDA_ARCH__ >= 900
          // Hopper adds a float pair in one atomic (8-byte aligned: even column).
          atomicAdd(reinterpret_cast<float2*>(dst + nt * 8),
                    make_float2(acc[nt][2 * hh], acc[nt][2 * hh + 1]));
#else
          atomicAdd(dst + nt * 8, acc[nt][2 * hh]);
          atomicAdd(dst + nt * 8 + 1, acc[nt][2 * hh + 1]);
#endif
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
          if ((tile0 + nt) * 8 + 2 * t < d) {
            atomicAdd(dst + nt * 8, acc[nt][2 * hh]);
            atomicAdd(dst + nt * 8 + 1, acc[nt][2 * hh + 1]);
          }
        }
      }
    }
  }
}

// grid: (ceil(seqlen_k / kBlockRows), num_heads_k, batch). Sums over the
// query heads of the key head's group (GQA) in registers. kFusedDq: also
// adds this key block's share of dQ into p.dq_accum (float32 atomics), so
// the separate dQ pass (and its recomputation of S and dP) is not needed.
// kFeatures: the variant for calls with attention features (p.features.Any()):
// block ranges and per-element visibility from the shared MaskPolicy, logits
// and dropout from LogitFeatures (fused only).
template <typename Element, int kHeadDim, bool kFusedDq, bool kFeatures = false>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1)
    DkvKernel(const AttentionParams p) {
  static_assert(kFusedDq || !kFeatures, "the deterministic dK/dV pass has no feature variant");
  using Tr = BwdTraits<kHeadDim>;
  static_assert(kFusedDq || Tr::kDSplit == 1, "the deterministic pass serves head dims up to 128");
  constexpr int kN = Tr::kNTiles, kD = Tr::kDkvCols / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t k_tile = SmemAddr(smem);                          // [kBlockRows][kHeadDim]
  const uint32_t v_tile = k_tile + Tr::kBlockRows * Tr::kTileBytes;
  // Per stage: Q then dO, [kBlockCols][kHeadDim] each; lse2 and delta [kBlockCols].
  const uint32_t qdo_stages = v_tile + Tr::kBlockRows * Tr::kTileBytes;
  float* row_stats = reinterpret_cast<float*>(smem + Tr::kRowStatsOffset);  // [kStages][2][kBlockCols]
  const uint32_t ds_tile = k_tile + Tr::kDsOffset;  // kFusedDq: [kBlockRows][kBlockCols]

  const auto& s = p.shape;
  const int64_t b = blockIdx.z, hk = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t(blockIdx.x) * Tr::kBlockRows;  // first key of the block
  // This warp's 16 keys, and which kDkvCols columns of dK/dV it holds.
  // (Spelled so that both are compile-time for kDSplit == 1.)
  const int warp_row = (Tr::kDSplit == 1 ? warp : warp % Tr::kKeyGroups) * 16;
  const int d_half = Tr::kDSplit == 1 ? 0 : warp / Tr::kKeyGroups;
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
  int64_t m_start = p.is_causal ? (n0 / Tr::kBlockCols) * Tr::kBlockCols : 0;
  int m_steps = int(max(int64_t(0), (s.seqlen_q - m_start + Tr::kBlockCols - 1) / Tr::kBlockCols));
  const bool elementwise = kFeatures && LogitFeatures::ElementwiseLogits(p);
  if constexpr (kFeatures) {
    // Lengths, causal and window bound the queries alike for every head.
    int64_t lo, hi;
    MaskPolicy::For(p, b, hk * s.group()).QueryRange(n0, n0 + Tr::kBlockRows, &lo, &hi);
    m_start = lo / Tr::kBlockCols * Tr::kBlockCols;
    m_steps = hi > lo ? int((hi - m_start + Tr::kBlockCols - 1) / Tr::kBlockCols) : 0;
  }
  const int steps = int(s.group()) * m_steps;
  const bool key_tail = n0 + Tr::kBlockRows > s.seqlen_k;
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

  auto run_step = [&](int step, auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    const int64_t h = hk * s.group() + step / m_steps;
    const int64_t m0 = m_start + int64_t(step % m_steps) * Tr::kBlockCols;
    const uint32_t q_tile = qdo_stages + (step % Tr::kStages) * Tr::kStageBytes;
    const uint32_t do_tile = q_tile + Tr::kBlockCols * Tr::kTileBytes;
    const float* lse2_s = row_stats + (step % Tr::kStages) * 2 * Tr::kBlockCols;
    const float* delta_s = lse2_s + Tr::kBlockCols;

    float st[1][kN][4] = {}, dpt[1][kN][4] = {};
    GemmSmemSmemT<Element, 1, kN, kHeadDim, Tr::kQkUnroll>(st, k_tile, warp_row, q_tile, 0, lane);    // S^T
    GemmSmemSmemT<Element, 1, kN, kHeadDim, Tr::kQkUnroll>(dpt, v_tile, warp_row, do_tile, 0, lane);  // dP^T
    // Block-relative int32 indices: key row r (of kBlockRows) and query
    // column c (of kBlockCols) see each other when r < key_limit, c <
    // query_limit and (not causal or r - c <= m0 - n0).
    const int key_limit = int(min(int64_t(Tr::kBlockRows), s.seqlen_k - n0));
    const int query_limit = int(min(int64_t(Tr::kBlockCols), s.seqlen_q - m0));
    const int diagonal = int(max(int64_t(-2 * Tr::kBlockRows), min(int64_t(2 * Tr::kBlockRows), m0 - n0)));
    if constexpr (kFeatures && kMasked) {
      const LogitFeatures lf = LogitFeatures::For(p, b, h);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int64_t key = n0 + warp_row + g + hh * 8;
        const uint32_t visible = VisibleBits<kN, false>(lf.mask, key, m0 + 2 * t);
        // The bias along the key row (query m0 + 2t + c at [c * bias_row]),
        // read before any is used (clamped columns, see LastVisibleColumn).
        float bias_values[kN][2] = {};
        if (lf.bias && visible) {
          const float* bias = lf.bias + (m0 + 2 * t) * lf.bias_row + key * lf.bias_col;
          const int last = LastVisibleColumn(visible);
#pragma unroll
          for (int nt = 0; nt < kN; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) bias_values[nt][e] = bias[min(8 * nt + e, last) * lf.bias_row];
        }
#pragma unroll
        for (int nt = 0; nt < kN; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = nt * 8 + 2 * t + e, i = 2 * hh + e;
            const int64_t query = m0 + col;
            float tanh_value = 0.0f, prob = 0.0f;
            if (visible >> (2 * nt + e) & 1u) {
              const float x = lf.Apply(st[0][nt][i] * scale_log2, bias_values[nt][e], &tanh_value);
              prob = FastExp2(x - lse2_s[col]);
            }
            const float drop = prob == 0.0f ? 0.0f : lf.DropFactor(query, key);
            st[0][nt][i] = prob * drop;  // P^T, dropped out (dV)
            dpt[0][nt][i] =
                lf.ChainSoftcap(prob * (dpt[0][nt][i] * drop - delta_s[col]), tanh_value);  // dS^T
          }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < kN; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int col = nt * 8 + 2 * t + (i % 2);
          float prob = FastExp2(fmaf(st[0][nt][i], scale_log2, -lse2_s[col]));
          if constexpr (kMasked) {
            const int row = warp_row + g + (i / 2) * 8;
            if (row >= key_limit || col >= query_limit || (p.is_causal && row - col > diagonal))
              prob = 0.0f;
          }
          st[0][nt][i] = prob;                                    // P^T
          dpt[0][nt][i] = prob * (dpt[0][nt][i] - delta_s[col]);  // dS^T
        }
    }
    if (kFusedDq && d_half == 0) {  // (both warps of a key group hold the same dS^T)
      // dS^T to shared memory for the dQ product; pairs of queries are
      // contiguous, and the swizzle spreads the 8 key rows over all banks.
#pragma unroll
      for (int nt = 0; nt < kN; ++nt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const uint32_t addr = ds_tile + (step % 2) * Tr::kDsBytes +
                                SwizzledOffset<Tr::kBlockCols / 8>(warp_row + g + hh * 8, nt) +
                                4 * t;
          const uint32_t pair = Pack2<Element>(dpt[0][nt][2 * hh], dpt[0][nt][2 * hh + 1]);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pair));
        }
    }
    constexpr int kCols = Tr::kDkvCols;
    const int col_tile0 = d_half * kCols / 8;
    GemmRegsSmem<Element, 1, kN, kHeadDim, kCols>(dv, st, do_tile, 0, lane, col_tile0);  // dV += P^T dO
    GemmRegsSmem<Element, 1, kN, kHeadDim, kCols>(dk, dpt, q_tile, 0, lane, col_tile0);  // dK += dS^T Q
  };
  // dQ of a step runs at the start of the next one (after its barrier, which
  // also makes every warp's dS^T rows visible), so a step needs one barrier;
  // dS^T alternates between two buffers.
  auto accumulate_dq = [&](int step) {
    const int64_t h = hk * s.group() + step / m_steps;
    const int64_t m0 = m_start + int64_t(step % m_steps) * Tr::kBlockCols;
    AccumulateDq<Element, kHeadDim>(p, ds_tile + (step % 2) * Tr::kDsBytes, k_tile, b, h, m0,
                                    warp, lane);
  };

  if (steps > 0) load_qdo(0);
  for (int step = 0; step < steps; ++step) {
    CpAsyncWait<0>();
    __syncthreads();  // this step's tiles landed; every warp is done with the previous step's
    if (step + 1 < steps) load_qdo(step + 1);  // into the stage the previous step used
    if (kFusedDq && step > 0) accumulate_dq(step - 1);
    // Element masks only where a pair can be invisible: tails, and causal
    // query blocks that start before the key block ends.
    const int64_t m0 = m_start + int64_t(step % m_steps) * Tr::kBlockCols;
    bool masked;
    if constexpr (kFeatures) {
      const int64_t h = hk * s.group() + step / m_steps;
      masked = elementwise || MaskPolicy::For(p, b, h).NeedsCheck(m0, m0 + Tr::kBlockCols, n0,
                                                                   n0 + Tr::kBlockRows);
    } else {
      masked = key_tail || m0 + Tr::kBlockCols > s.seqlen_q ||
               (p.is_causal && m0 < n0 + Tr::kBlockRows);
    }
    if (masked) {
      run_step(step, std::true_type{});
    } else {
      run_step(step, std::false_type{});
    }
  }

  if (kFusedDq && steps > 0) {
    __syncthreads();  // the last step's dS^T rows are in shared memory
    accumulate_dq(steps - 1);
  }
  CpAsyncWait<0>();  // a block whose keys no query sees never waited for its K/V copies
  const int64_t out_off = k_off;
  const int col0 = d_half * Tr::kDkvCols;
  StoreAccumulator<Element, 1, Tr::kDkvCols>(dk, static_cast<Element*>(p.dk) + out_off + col0,
                                             p.k_stride.row, n0 + warp_row, s.seqlen_k, d - col0,
                                             float(p.scale), lane);
  StoreAccumulator<Element, 1, Tr::kDkvCols>(dv, static_cast<Element*>(p.dv) + out_off + col0,
                                             p.k_stride.row, n0 + warp_row, s.seqlen_k, d - col0,
                                             1.0f, lane);
}

// dQ = scale * dq_accum, rounded to the element type; one thread per pair of
// columns. grid: (ceil(batch * heads * seqlen_q * head_dim / 2 / 256)).
template <typename Element>
__global__ void __launch_bounds__(256) DqConvertKernel(const AttentionParams p) {
  const auto& s = p.shape;
  const int64_t pairs_per_row = s.head_dim / 2;  // head_dim is a multiple of 8 here
  const int64_t idx = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (idx >= s.batch * s.num_heads * s.seqlen_q * pairs_per_row) return;
  const int64_t c = (idx % pairs_per_row) * 2, row_id = idx / pairs_per_row;
  const int64_t i = row_id % s.seqlen_q, h = (row_id / s.seqlen_q) % s.num_heads;
  const int64_t b = row_id / (s.seqlen_q * s.num_heads);
  const float2 acc = *reinterpret_cast<const float2*>(p.dq_accum + row_id * s.head_dim + c);
  const float scale = float(p.scale);
  Element* dq = static_cast<Element*>(p.dq) + b * p.q_stride.batch + h * p.q_stride.head +
                i * p.q_stride.row + c;
  *reinterpret_cast<uint32_t*>(dq) = Pack2<Element>(acc.x * scale, acc.y * scale);
}

}  // namespace jax_flash::cuda::sm80
