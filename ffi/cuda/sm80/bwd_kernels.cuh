// FlashAttention-2 backward on mma.sync, after DeltaAndClearKernel (delta =
// rowsum(dO * O), and the float32 dQ accumulator zeroed in the same pass).
// Default (fused), one pass per kBlockRows keys (BwdTraits: warps in key
// groups of 32 keys, the group's warps splitting queries and columns):
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
#include "cuda/generic/element.cuh"  // ToFloat
#include "cuda/logit_features.cuh"
#include "cuda/sm80/dq_accum.cuh"
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
  static_assert(kHeadDim <= 128, "the deterministic dQ pass serves head dims up to 128");
  constexpr int kQkUnroll = 4;  // k steps of S and dP: the next one's ldmatrix under this one's MMAs
  constexpr int kN = Tr::kNTiles, kD = kHeadDim / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_tile = SmemAddr(smem);                          // [kBlockRows][kHeadDim]
  const uint32_t do_tile = q_tile + Tr::kDqRows * Tr::kTileBytes;
  // Per stage: K then V, [kBlockCols][kHeadDim] each.
  const uint32_t kv_stages = do_tile + Tr::kDqRows * Tr::kTileBytes;

  const auto& s = p.shape;
  const int64_t b = blockIdx.z, h = blockIdx.y, hk = h / s.group();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t m0 = int64_t(blockIdx.x) * Tr::kDqRows;
  const int warp_row = warp * 16;
  const int d = int(s.head_dim);
  const int64_t q_off = b * p.q_stride.batch + h * p.q_stride.head;
  const int64_t k_off = b * p.k_stride.batch + hk * p.k_stride.head;
  const Element* k = static_cast<const Element*>(p.k) + k_off;
  const Element* v = static_cast<const Element*>(p.v) + k_off;

  LoadTileAsync<Tr::kDqRows, kHeadDim, Tr::kThreads>(
      q_tile, static_cast<const Element*>(p.q) + q_off, p.q_stride.row, m0, s.seqlen_q, d);
  LoadTileAsync<Tr::kDqRows, kHeadDim, Tr::kThreads>(
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

  const int64_t kv_end = p.is_causal ? min(s.seqlen_k, m0 + Tr::kDqRows) : s.seqlen_k;
  const int steps = int((kv_end + Tr::kDqBlockCols - 1) / Tr::kDqBlockCols);
  auto load_kv = [&](int step) {
    const uint32_t stage = kv_stages + (step % Tr::kStages) * Tr::kDqStageBytes;
    const int64_t n0 = int64_t(step) * Tr::kDqBlockCols;
    LoadTileAsync<Tr::kDqBlockCols, kHeadDim, Tr::kThreads>(stage, k, p.k_stride.row, n0, s.seqlen_k, d);
    LoadTileAsync<Tr::kDqBlockCols, kHeadDim, Tr::kThreads>(stage + Tr::kDqBlockCols * Tr::kTileBytes, v,
                                                          p.k_stride.row, n0, s.seqlen_k, d);
    CpAsyncCommit();
  };
  load_kv(0);
  for (int step = 0; step < steps; ++step) {
    CpAsyncWait<0>();
    __syncthreads();  // this step's K/V landed; every warp is done with the previous step's
    if (step + 1 < steps) load_kv(step + 1);  // into the stage the previous step used
    const int64_t n0 = int64_t(step) * Tr::kDqBlockCols;
    const uint32_t k_tile = kv_stages + (step % Tr::kStages) * Tr::kDqStageBytes;
    const uint32_t v_tile = k_tile + Tr::kDqBlockCols * Tr::kTileBytes;

    float sc[1][kN][4] = {}, dp[1][kN][4] = {};
    GemmSmemSmemT<Element, 1, kN, kHeadDim, kQkUnroll>(sc, q_tile, warp_row, k_tile, 0, lane);   // S
    GemmSmemSmemT<Element, 1, kN, kHeadDim, kQkUnroll>(dp, do_tile, warp_row, v_tile, 0, lane);  // dP
    const int col_limit = int(min(int64_t(Tr::kDqBlockCols), s.seqlen_k - n0));
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

// dQ[m0 .., columns] += dS K for this warp's share of the query block (32
// queries: two m-tiles) and of the head dim, from dS^T in shared
// memory ([key][query], so A comes through ldmatrix.trans) and the block's K
// tile; then float32 atomics into dq_accum (other key blocks add to the same
// rows).
//
// kGroupTiles > 0 (BwdTraits::kDqGroupTiles): groups of 8-column tiles
// outermost. dS's fragments for every k step are loaded once, then each group
// of kGroupTiles tiles runs all its k steps and sends its atomics, which
// drain under the next group's MMAs. (Summing all columns before any atomic
// left the whole burst, 32 atomics per warp at 256, to the load/store queue
// with the tensor cores idle: "LG throttle", and waits for queued atomics to
// release their registers, were a fifth of the 256 kernel's stall samples.)
// A group accumulates into 2 x kGroupTiles independent MMA chains.
template <typename Element, int kHeadDim, int kGroupTiles>
__device__ __forceinline__ void AccumulateDq(const AttentionParams& p, uint32_t ds_tile,
                                             uint32_t k_tile, int64_t b, int64_t h,
                                             int64_t m0, int warp, int lane) {
  using Tr = BwdTraits<kHeadDim>;
  constexpr int kC = kHeadDim / 8, kDsC = Tr::kBlockCols / 8;
  constexpr int kNt = Tr::kDqColsPerWarp / 8;  // 8-column tiles
  constexpr int kKSteps = Tr::kBlockRows / 16;
  static_assert(Tr::kWarps % Tr::kDqQParts == 0 && kNt % 2 == 0);
  const int q_part = warp / Tr::kDqDParts, tile0 = (warp % Tr::kDqDParts) * kNt;
  const auto& s = p.shape;
  const int d = int(s.head_dim);
  const int g = lane / 4, t = lane % 4;
  const SwizzledRows<kDsC> ds_rows(ds_tile, (lane / 16) * 8 + lane % 8, lane / 8 % 2);
  const SwizzledRows<kC> k_rows(k_tile, (lane / 8 % 2) * 8 + lane % 8, lane / 16);
  // The warp's 32 rows are four 8-row groups of the accumulator
  // (DqAccumLayout): m-tile mt, half hh is group 2 mt + hh. One check per
  // warp for the common case, all four groups full and every column real;
  // the query block at the end of a sequence and padded head dims take the
  // general path.
  const int64_t warp_row0 = m0 + q_part * 32;
  const bool common = (tile0 + kNt) * 8 <= d && DqAccumLayout::FullGroup(warp_row0 + 24, s.seqlen_q);
  float* const warp_dst = p.dq_accum + p.row_stat_index(b, h, warp_row0) * d;
  constexpr int kTileFloats = DqAccumLayout::kGroupRows * DqAccumLayout::kBlockCols;
  float* const lane_dst = warp_dst + tile0 * kTileFloats + DqAccumLayout::InGroup(true, g, 2 * t, d);
  // Atomics for tiles nt0 .. nt0 + kCount - 1 of acc ([m-tile][tile][4]).
  auto add = [&](int nt0, auto count, const float(&acc)[2][decltype(count)::value][4]) {
    constexpr int kCount = decltype(count)::value;
    if (common) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float* dst = lane_dst + (mt * 16 + hh * 8) * d + nt0 * kTileFloats;
#pragma unroll
          for (int nt = 0; nt < kCount; ++nt) {
#if __CUDA_ARCH__ >= 900
            // Hopper adds a float pair in one atomic (8-byte aligned: even column).
            atomicAdd(reinterpret_cast<float2*>(dst + nt * kTileFloats),
                      make_float2(acc[mt][nt][2 * hh], acc[mt][nt][2 * hh + 1]));
#else
            atomicAdd(dst + nt * kTileFloats, acc[mt][nt][2 * hh]);
            atomicAdd(dst + nt * kTileFloats + 1, acc[mt][nt][2 * hh + 1]);
#endif
          }
        }
      return;
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = mt * 16 + hh * 8;
        const bool full = DqAccumLayout::FullGroup(warp_row0 + r, s.seqlen_q);
        if (!full && warp_row0 + r + g >= s.seqlen_q) continue;
        float* dst = warp_dst + r * d + DqAccumLayout::InGroup(full, g, (tile0 + nt0) * 8 + 2 * t, d);
        const int tile_stride = DqAccumLayout::TileStride(full);
#pragma unroll
        for (int nt = 0; nt < kCount; ++nt) {
          if ((tile0 + nt0 + nt) * 8 + 2 * t < d) {
            atomicAdd(dst + nt * tile_stride, acc[mt][nt][2 * hh]);
            atomicAdd(dst + nt * tile_stride + 1, acc[mt][nt][2 * hh + 1]);
          }
        }
      }
  };
  if constexpr (kGroupTiles > 0) {
    static_assert(kNt % kGroupTiles == 0 && kGroupTiles % 2 == 0);
    uint32_t a[kKSteps][2][4];  // dS[queries of m-tile q_part * 2 + mt, keys 16 kk ..], from dS^T
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) LdMatrixX4Trans(a[kk][mt], ds_rows.At(kk * 16, (q_part * 2 + mt) * 2));
#pragma unroll
    for (int nt0 = 0; nt0 < kNt; nt0 += kGroupTiles) {
      float acc[2][kGroupTiles][4] = {};
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
        for (int nt = 0; nt < kGroupTiles; nt += 2) {
          uint32_t bf[4];  // K[keys 16 kk .., d-tiles tile0 + nt0 + nt and + 1]
          LdMatrixX4Trans(bf, k_rows.At(kk * 16, tile0 + nt0 + nt));
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            Mma16816<Element>(acc[mt][nt], a[kk][mt], bf[0], bf[1]);
            Mma16816<Element>(acc[mt][nt + 1], a[kk][mt], bf[2], bf[3]);
          }
        }
      add(nt0, std::integral_constant<int, kGroupTiles>{}, acc);
    }
  } else {
    float acc[2][kNt][4] = {};
#pragma unroll 2
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t a[2][4];  // dS[queries of m-tile q_part * 2 + mt, keys 16 kk ..], from dS^T [key][query]
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) LdMatrixX4Trans(a[mt], ds_rows.At(kk * 16, (q_part * 2 + mt) * 2));
#pragma unroll
      for (int nt = 0; nt < kNt; nt += 2) {
        uint32_t bf[4];  // K[keys 16 kk .., d-tiles tile0 + nt and + 1]
        LdMatrixX4Trans(bf, k_rows.At(kk * 16, tile0 + nt));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          Mma16816<Element>(acc[mt][nt], a[mt], bf[0], bf[1]);
          Mma16816<Element>(acc[mt][nt + 1], a[mt], bf[2], bf[3]);
        }
      }
    }
    add(0, std::integral_constant<int, kNt>{}, acc);
  }
}

// grid: (ceil(seqlen_k / kBlockRows), num_heads_k, batch). Sums over the
// query heads of the key head's group (GQA) in registers. kFusedDq: also
// adds this key block's share of dQ into p.dq_accum (float32 atomics), so
// the separate dQ pass (and its recomputation of S and dP) is not needed.
// kFeatures: the variant for calls with attention features (p.features.Any()):
// block ranges and per-element visibility from the shared MaskPolicy, logits
// and dropout from LogitFeatures (fused only).
//
// Warp w holds keys 32 * (w / kQSplit) .. + 32 of the block; of each step's
// kBlockCols queries it computes S^T and dP^T for slice q_part = w % kQSplit
// (kQCols queries), and of dK and dV the columns kDkvCols * q_part ... Its
// own P^T and dS^T slices feed dV and dK from registers; the partners'
// slices come from shared memory after a barrier (the group's; the block's
// in the fused pass, whose dQ product then reads every warp's dS^T). Two
// barriers per step: that one, and the step's start (tiles landed; the
// previous step's P^T / dS^T readers done).
template <typename Element, int kHeadDim, bool kFusedDq, bool kFeatures = false>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1)
    DkvKernel(const AttentionParams p, const bool causal_order) {
  static_assert(kFusedDq || !kFeatures, "the deterministic dK/dV pass has no feature variant");
  using Tr = BwdTraits<kHeadDim>;
  static_assert(kFusedDq || kHeadDim <= 128, "the deterministic pass serves head dims up to 128");
  // The soft cap's tanh as the forward computes it (SoftcapRaw).
  constexpr bool kApproxTanh = std::is_same_v<Element, __nv_bfloat16>;
  constexpr int kM = Tr::kKeyMTiles, kSN = Tr::kSNTiles, kD = Tr::kDkvCols / 8;
  constexpr int kPtC = Tr::kBlockCols / 8;  // chunks per row of the P^T / dS^T tiles
  constexpr int kDqGroup = Tr::kDqGroupTiles;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t k_tile = SmemAddr(smem);                          // [kBlockRows][kHeadDim]
  const uint32_t v_tile = k_tile + Tr::kBlockRows * Tr::kTileBytes;
  // Per stage: Q then dO, [kBlockCols][kHeadDim] each; lse2 and delta [kBlockCols].
  const uint32_t qdo_stages = v_tile + Tr::kBlockRows * Tr::kTileBytes;
  float* row_stats = reinterpret_cast<float*>(smem + Tr::kRowStatsOffset);  // [kStages][2][kBlockCols]
  const uint32_t pt_tile = k_tile + Tr::kPtOffset;  // [kBlockRows][kBlockCols]
  const uint32_t ds_tile = k_tile + Tr::kDsOffset;  // [kBlockRows][kBlockCols]
  // Hopper: dS^T alternates between two tiles and a step's dQ runs in the
  // next step (Tr::kFusedSm90SmemBytes; the launch sizes shared memory to match).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kDeferDq = kFusedDq;
#else
  constexpr bool kDeferDq = false;
#endif
  auto ds_buffer = [&](int parity) {
    return kDeferDq && parity ? k_tile + Tr::kDs2Offset : ds_tile;
  };

  const auto& s = p.shape;
  // Grid (key block, key head, batch); with causal_order (key head, key
  // block, batch): within a batch, key block 0, which the most queries see,
  // of every head launches first and the lightest blocks last, so no heavy
  // block starts in the batch's final wave; and a batch's blocks run
  // together, so its heads' Q / dO rows and dQ accumulator stay in L2 while
  // their key blocks pass over them (with key blocks slowest over all
  // batches, a head's blocks ran far apart in time: each re-read its Q / dO
  // and re-added its dQ rows from HBM; the 256 causal backward at T=1024
  // took 0.81x of the non-causal time for 0.53x of the work). A list-
  // scheduling model puts this order's tail within 2% of the batch-blind
  // one. (Coordinates stay plain blockIdx reads: decoding a 1D order would
  // hold them in registers, which the 64 kernel spills. The feature
  // variants, with less room still, keep the plain grid.)
  const bool ordered = !kFeatures && causal_order;
  const int64_t b = blockIdx.z;
  const int64_t hk = ordered ? blockIdx.x : blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t(ordered ? blockIdx.y : blockIdx.x) * Tr::kBlockRows;  // first key
  const int group = warp / Tr::kQSplit, q_part = warp % Tr::kQSplit;
  const int warp_row = group * kM * 16;     // this warp's first key in the block
  const int q_col0 = q_part * Tr::kQCols;   // its queries of each step's S^T
  const int col_tile0 = q_part * kD;        // its first 8-column tile of dK/dV
  const int d = int(s.head_dim);
  const int64_t k_off = b * p.k_stride.batch + hk * p.k_stride.head;

  LoadTileAsync<Tr::kBlockRows, kHeadDim, Tr::kThreads>(
      k_tile, static_cast<const Element*>(p.k) + k_off, p.k_stride.row, n0, s.seqlen_k, d);
  LoadTileAsync<Tr::kBlockRows, kHeadDim, Tr::kThreads>(
      v_tile, static_cast<const Element*>(p.v) + k_off, p.k_stride.row, n0, s.seqlen_k, d);
  CpAsyncCommit();
  const float scale_log2 = float(p.scale) * kLog2e;
  float dk[kM][kD][4] = {}, dv[kM][kD][4] = {};
  // The bias-gradient pass (LaunchBiasGradient, the jax_flash_dbias call):
  // each step's dS goes into the bias gradient, and nothing else is done
  // (no dV, dK, dQ: p.dk is null). The same instantiation as the feature
  // backward, a runtime mode uniform over the grid, so the barriers it skips
  // are skipped by every thread of a block.
  // (A bias makes every step take the element-wise path, ElementwiseLogits,
  // which is where the dS is written.)
  const bool dbias_only = kFeatures && p.dk == nullptr;

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
    // Packed documents: only the query blocks of this key block's documents.
    const MaskPolicy policy = MaskPolicy::For(p, b, hk * s.group());
    if (policy.HasSegmentRanges() && m_steps > 0) {
      int first = int(m_start / Tr::kBlockCols), end = first + m_steps;
      TrimSegmentBlocks<Tr::kBlockCols, true>(policy, policy.KeyIds(n0, n0 + Tr::kBlockRows), &first, &end);
      m_start = int64_t(first) * Tr::kBlockCols;
      m_steps = end - first;
    }
    // A per-query mask's block summary (mask_blocks): only the query blocks
    // that see some of these keys for some query head of the group.
    if (p.features.mask_blocks && m_steps > 0) {
      int first = int(m_start / Tr::kBlockCols), end = first + m_steps;
      const int64_t heads = p.features.mask_blocks_stride.head == 0 ? 1 : s.group();
      TrimEmptyBlocks(&first, &end, [&](int m) {
        for (int64_t i = 0; i < heads; ++i)
          if (MaskBlocks::For(p.features, b, hk * s.group() + i)
                  .template SpanOf<Tr::kBlockCols, Tr::kBlockRows, true>(m * Tr::kBlockCols, int(n0)) &
              kMaskBlockSome)
            return false;
        return true;
      });
      m_start = int64_t(first) * Tr::kBlockCols;
      m_steps = end - first;
    }
  }
  // Key-only masks (KeyMaskReader): this block's keys summarized once per
  // query head of the group (up to 32 heads; more are taken as mixed). A
  // block that every head's mask hides has no steps (dK = dV = 0, no dQ).
  uint32_t mask_all_visible = 0;  // bit i: query head hk * group + i sees every key of the block
  if constexpr (kFeatures) {
    if (KeyMaskReader<Tr::kBlockRows>::Applies(MaskPolicy::For(p, b, hk * s.group()))) {
      const int heads = int(min(s.group(), int64_t(32)));
      bool all_hidden = heads == s.group();
      for (int i = 0; i < heads; ++i) {
        KeyMaskReader<Tr::kBlockRows> reader;
        reader.Load(MaskPolicy::For(p, b, hk * s.group() + i), n0);
        const KeyMaskBlock summary = reader.Summary();
        if (summary == KeyMaskBlock::kAllVisible) mask_all_visible |= 1u << i;
        all_hidden &= summary == KeyMaskBlock::kNoneVisible;
      }
      if (all_hidden) m_steps = 0;
    }
  }
  const int steps = int(s.group()) * m_steps;
  const bool key_tail = n0 + Tr::kBlockRows > s.seqlen_k;
  // A step's query head and first query, advanced (and stepped back)
  // without divisions. 32-bit (heads and query offsets fit): registers are
  // scarce here.
  struct StepPos {
    int h, m0;
  };
  const int m_first = int(m_start), m_last = int(m_start) + (m_steps - 1) * Tr::kBlockCols;
  auto advance = [&](StepPos pos) {
    if (pos.m0 == m_last) return StepPos{pos.h + 1, m_first};
    return StepPos{pos.h, pos.m0 + Tr::kBlockCols};
  };
  auto retreat = [&](StepPos pos) {
    if (pos.m0 == m_first) return StepPos{pos.h - 1, m_last};
    return StepPos{pos.h, pos.m0 - Tr::kBlockCols};
  };
  auto load_qdo = [&](int stage_index, StepPos pos) {
    const int64_t h = pos.h, m0 = pos.m0;
    const int64_t q_off = b * p.q_stride.batch + h * p.q_stride.head;
    const uint32_t stage = qdo_stages + stage_index * Tr::kStageBytes;
    const Element* q = static_cast<const Element*>(p.q) + q_off;
    const Element* dout = static_cast<const Element*>(p.dout) + q_off;
    const uint32_t do_stage = stage + Tr::kBlockCols * Tr::kTileBytes;
    if (m0 + Tr::kBlockCols <= s.seqlen_q && d == kHeadDim) {  // all but a tail's
      LoadFullTileAsync<Tr::kBlockCols, kHeadDim, Tr::kThreads>(stage, q, p.q_stride.row, m0);
      LoadFullTileAsync<Tr::kBlockCols, kHeadDim, Tr::kThreads>(do_stage, dout, p.q_stride.row, m0);
    } else {
      LoadTileAsync<Tr::kBlockCols, kHeadDim, Tr::kThreads>(stage, q, p.q_stride.row, m0, s.seqlen_q, d);
      LoadTileAsync<Tr::kBlockCols, kHeadDim, Tr::kThreads>(do_stage, dout, p.q_stride.row, m0, s.seqlen_q, d);
    }
    CpAsyncCommit();
    if (threadIdx.x < Tr::kBlockCols) {  // plain loads: visible after the next barrier
      float* stats = row_stats + stage_index * 2 * Tr::kBlockCols;
      const int64_t row = min(m0 + threadIdx.x, s.seqlen_q - 1);
      stats[threadIdx.x] = Log2Lse(static_cast<const float*>(p.lse)[p.row_stat_index(b, h, row)]);
      stats[Tr::kBlockCols + threadIdx.x] =
          static_cast<const float*>(p.delta)[p.row_stat_index(b, h, row)];
    }
  };

  // A warp's [kM x 16 keys][kQCols queries] fragment (P^T or dS^T) into a
  // [kBlockRows][kBlockCols] 16-bit tile, for its partners (and dQ): pairs of
  // queries are contiguous, and the swizzle spreads the 8 key rows of a
  // store over all banks. A thread's rows are g plus multiples of 8, so the
  // swizzle (chunk ^ row % 8) depends on the chunk alone: one address per
  // chunk, the rows as immediate offsets (SwizzledOffset per store cost two
  // integer instructions each).
  auto store_slice = [&](uint32_t tile, const float(&frag)[kM][kSN][4]) {
    const uint32_t row_base = tile + uint32_t((warp_row + g) * kPtC * 16 + 4 * t);
#pragma unroll
    for (int nt = 0; nt < kSN; ++nt) {
      const uint32_t addr = row_base + uint32_t(((q_col0 / 8 + nt) ^ g) * 16);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const uint32_t pair = Pack2<Element>(frag[mt][nt][2 * hh], frag[mt][nt][2 * hh + 1]);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr + uint32_t((mt * 16 + hh * 8) * kPtC * 16)),
                       "r"(pair));
        }
    }
  };

  // segments_all: the segment ids of every pair of the step meet (their
  // summaries say so), so the per-element checks skip them.
  // check_visibility false: every pair is visible, the feature path runs for
  // the logit transform (soft cap, bias) or dropout alone.
  auto run_step = [&](int stage_index, StepPos pos, auto masked, bool segments_all = false,
                      bool check_visibility = true) {
    constexpr bool kMasked = decltype(masked)::value;
    const int64_t h = pos.h, m0 = pos.m0;
    const uint32_t q_tile = qdo_stages + stage_index * Tr::kStageBytes;
    const uint32_t do_tile = q_tile + Tr::kBlockCols * Tr::kTileBytes;
    const float* lse2_s = row_stats + stage_index * 2 * Tr::kBlockCols;
    const float* delta_s = lse2_s + Tr::kBlockCols;

    const uint32_t ds_write = ds_buffer(stage_index);  // this step's dS^T tile
    float st[kM][kSN][4] = {}, dpt[kM][kSN][4] = {};
    GemmSmemSmemT<Element, kM, kSN, kHeadDim, Tr::kQkUnroll>(st, k_tile, warp_row, q_tile, q_col0, lane);    // S^T
    constexpr bool kPlainLogits = !(kFeatures && kMasked);
    // P^T = exp2(S^T scaled - lse2), zero where masked.
    auto exp_to_pt = [&] {
      // Block-relative int32 indices: key row r (of kBlockRows) and query
      // column c (of kBlockCols) see each other when r < key_limit, c <
      // query_limit and (not causal or r - c <= m0 - n0).
      const int key_limit = int(min(int64_t(Tr::kBlockRows), s.seqlen_k - n0));
      const int query_limit = int(min(int64_t(Tr::kBlockCols), s.seqlen_q - m0));
      const int diagonal =
          int(max(int64_t(-2 * Tr::kBlockRows), min(int64_t(2 * Tr::kBlockRows), m0 - n0)));
#pragma unroll
      for (int mt = 0; mt < kM; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSN; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int col = q_col0 + nt * 8 + 2 * t + (i % 2);
            float prob = FastExp2(fmaf(st[mt][nt][i], scale_log2, -lse2_s[col]));
            if constexpr (kMasked) {
              const int row = warp_row + mt * 16 + g + (i / 2) * 8;
              if (row >= key_limit || col >= query_limit || (p.is_causal && row - col > diagonal))
                prob = 0.0f;
            }
            st[mt][nt][i] = prob;  // P^T
          }
    };
    // dS^T = P^T (dP^T - delta), in dP^T's registers.
    auto ds_from_dpt = [&] {
#pragma unroll
      for (int mt = 0; mt < kM; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSN; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int col = q_col0 + nt * 8 + 2 * t + (i % 2);
            dpt[mt][nt][i] = st[mt][nt][i] * (dpt[mt][nt][i] - delta_s[col]);  // dS^T
          }
    };
    // P^T before the dP^T product where registers allow (Tr::kExpBeforeDp):
    // the exp2s (one MUFU per element) then complete under its MMAs instead
    // of following both products with the tensor cores idle.
    if constexpr (kPlainLogits && Tr::kExpBeforeDp) exp_to_pt();
    GemmSmemSmemT<Element, kM, kSN, kHeadDim, Tr::kQkUnroll>(dpt, v_tile, warp_row, do_tile, q_col0, lane);  // dP^T
    if constexpr (kPlainLogits && !Tr::kExpBeforeDp) {
      exp_to_pt();
      ds_from_dpt();
      store_slice(ds_write, dpt);
    }
    if constexpr (kPlainLogits) {
      // dV's own queries, from registers (the partners' come after the barrier).
      store_slice(pt_tile, st);
      GemmRegsSmem<Element, kM, kSN, kHeadDim, Tr::kDkvCols>(dv, st, do_tile, q_col0, lane, col_tile0);  // dV += P^T dO
    }
    if constexpr (!kPlainLogits) {
      LogitFeatures lf = LogitFeatures::For(p, b, h);
      if (segments_all) lf.mask = lf.mask.WithoutSegments();
      const bool softcap_only = lf.cap > 0.0f && !lf.bias;
      // Dropout's keep bits of this thread's pairs, bit 4 (2 nt + e) + w for
      // query column 8 nt + 2t + e and key n0 + warp_row + g + 8 w (w = 2 mt
      // + hh, a key group's 32-key run): one Philox call serves both query
      // columns e of n-tiles 2 np and 2 np + 1 (rows i0 and i0 + 8 of
      // DropoutPolicy) against the four keys.
      static_assert(kM == 2 && kSN * 8 <= 64 && kSN % 2 == 0, "four keys and two n-tiles per call, 64 bits");
      uint64_t keep = ~uint64_t(0);
      if (lf.dropout.active) {
        keep = 0;
#pragma unroll
        for (int np = 0; np < kSN / 2; ++np)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const uint64_t bits8 =
                lf.dropout.KeepBits8(lf.b, lf.h, m0 + q_col0 + np * 16 + 2 * t + e, n0 + warp_row + g);
            keep |= (bits8 & 0xFu) << (4 * (2 * (2 * np) + e)) | (bits8 >> 4) << (4 * (2 * (2 * np + 1) + e));
          }
      }
#pragma unroll
      for (int mt = 0; mt < kM; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int64_t key = n0 + warp_row + mt * 16 + g + hh * 8;
          constexpr uint32_t kAllBits = 2 * kSN == 32 ? ~0u : (1u << (2 * kSN)) - 1;
          const uint32_t visible =
              check_visibility ? VisibleBits<kSN, false>(lf.mask, key, m0 + q_col0 + 2 * t) : kAllBits;
          // The bias along the key row (query m0 + q_col0 + 2t + c at [c *
          // bias_row]), read before any is used (clamped columns, see
          // LastVisibleColumn).
          float bias_values[kSN][2] = {};
          if (lf.bias && visible)
            lf.LoadBiasRow<Element, false>((m0 + q_col0 + 2 * t) * lf.bias_row + key * lf.bias_col, lf.bias_row,
                                           LastVisibleColumn(visible), bias_values);
#pragma unroll
          for (int nt = 0; nt < kSN; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int col = q_col0 + nt * 8 + 2 * t + e, i = 2 * hh + e;
              float tanh_value = 0.0f, prob = 0.0f;
              if (visible >> (2 * nt + e) & 1u) {
                const float x = softcap_only
                                    ? lf.SoftcapRaw<kApproxTanh>(st[mt][nt][i], &tanh_value) * scale_log2
                                    : lf.Apply<true>(st[mt][nt][i] * scale_log2, bias_values[nt][e], &tanh_value);
                prob = FastExp2(x - lse2_s[col]);
              }
              const float drop =
                  !lf.dropout.active ? 1.0f
                  : keep >> (4 * (2 * nt + e) + 2 * mt + hh) & 1u ? lf.dropout.keep_scale : 0.0f;
              st[mt][nt][i] = prob * drop;  // P^T, dropped out (dV)
              // d(logit), the bias's gradient; through the soft cap, dS^T.
              const float dlogit = prob * (dpt[mt][nt][i] * drop - delta_s[col]);
              dpt[mt][nt][i] = dbias_only ? dlogit : lf.ChainSoftcap(dlogit, tanh_value);  // dS^T
            }
        }
      if (dbias_only) {
        // d(logit) is the bias's gradient where the bias is added: after
        // the soft cap (logit = softcap(scale q.k) + bias), before its chain
        // rule. Pairs past the ends are not written (their bias does not exist).
        const AttentionFeatures& f = p.features;
        const int64_t slice = f.BroadcastOffset(f.bias_stride, b, h);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int64_t key = n0 + warp_row + mt * 16 + g + hh * 8;
            if (key >= s.seqlen_k) continue;
#pragma unroll
            for (int nt = 0; nt < kSN; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int64_t query = m0 + q_col0 + nt * 8 + 2 * t + e;
                if (query < s.seqlen_q) AddDbias<Element>(f, slice, query, key, dpt[mt][nt][2 * hh + e]);
              }
          }
        return;
      }
      store_slice(pt_tile, st);
      GemmRegsSmem<Element, kM, kSN, kHeadDim, Tr::kDkvCols>(dv, st, do_tile, q_col0, lane, col_tile0);  // dV += P^T dO
    } else if constexpr (Tr::kExpBeforeDp) {
      ds_from_dpt();
    }
    if constexpr (!(kPlainLogits && !Tr::kExpBeforeDp)) store_slice(ds_write, dpt);
    GemmRegsSmem<Element, kM, kSN, kHeadDim, Tr::kDkvCols>(dk, dpt, q_tile, q_col0, lane, col_tile0);  // dK += dS^T Q
    // The partners' slices are in shared memory. The fused pass without a
    // second dS^T tile waits for every warp instead: dQ below reads all of dS^T.
    if constexpr (kFusedDq && !kDeferDq) {
      __syncthreads();
    } else {
      SyncWarpGroup<Tr::kQSplit>(group);
    }
#pragma unroll
    for (int j = 1; j < Tr::kQSplit; ++j) {
      const int c0 = ((q_part + j) % Tr::kQSplit) * Tr::kQCols;  // a partner's queries
      GemmSmemSmem<Element, kM, Tr::kQCols / 16, kPtC, kHeadDim / 8, Tr::kDkvCols>(
          dv, pt_tile, warp_row, c0, do_tile, c0, col_tile0, lane);
      GemmSmemSmem<Element, kM, Tr::kQCols / 16, kPtC, kHeadDim / 8, Tr::kDkvCols>(
          dk, ds_write, warp_row, c0, q_tile, c0, col_tile0, lane);
    }
    if constexpr (kFusedDq && !kDeferDq)
      AccumulateDq<Element, kHeadDim, kDqGroup>(p, ds_tile, k_tile, b, h, m0, warp, lane);
  };

  // The previous step (whose dQ is deferred) is retreat(pos), recomputed
  // where needed rather than held: with the late dQ it would be live across
  // the whole step, and so would a precomputed next step.
  StepPos pos{int(hk * s.group()), m_first};
  // A step's query ids (their block summaries; segments are per batch row).
  auto query_ids = [&](StepPos at) {
    return MaskPolicy::For(p, b, at.h).QueryIds(at.m0, at.m0 + Tr::kBlockCols);
  };
  IdSpan next_query_ids{0, 0};
  if constexpr (kFeatures) {
    if (steps > 0 && MaskPolicy::For(p, b, pos.h).HasSegmentRanges()) next_query_ids = query_ids(pos);
  }
  const bool late_dq = Tr::kDqPhaseShift && warp >= Tr::kWarps / 2;
  if (steps > 0) load_qdo(0, pos);
  for (int step = 0; step < steps; ++step) {
    CpAsyncWait<0>();
    // This step's tiles landed; every warp is done with the previous step's
    // (tiles, and P^T / dS^T slices, whose last reads were the partners'
    // dV / dK products and the dQ product).
    __syncthreads();
    if (step + 1 < steps) load_qdo((step + 1) & 1, advance(pos));  // into the stage the previous step used
    // The previous step's dQ, from its dS^T tile (every warp's slices are in
    // since the barrier above; this step writes the other tile, and the
    // previous one is rewritten only after the next step's barrier): here,
    // or for the late half of the warps after this step's work
    // (Tr::kDqPhaseShift).
    if constexpr (kDeferDq) {
      if (step > 0 && !late_dq && !dbias_only) {
        const StepPos prev = retreat(pos);
        AccumulateDq<Element, kHeadDim, kDqGroup>(p, ds_buffer((step - 1) & 1), k_tile, b, prev.h, prev.m0,
                                                  warp, lane);
      }
    }
    // Element masks only where a pair can be invisible: tails, and causal
    // query blocks that start before the key block ends.
    bool masked, segments_all = false, check = true;
    if constexpr (kFeatures) {
      MaskPolicy policy = MaskPolicy::For(p, b, pos.h);
      const int64_t head_in_group = pos.h - hk * s.group();
      if (head_in_group < 32 && (mask_all_visible >> head_in_group & 1u))
        policy.mask = nullptr;  // for NeedsCheck only: the mask hides none of the block's keys
      // A per-query mask's block summary: a step it shows whole needs no
      // mask check (read in the step, from the parameters: no state kept
      // across the loop, where registers are scarce).
      if (p.features.mask_blocks &&
          (MaskBlocks::For(p.features, b, pos.h).template SpanOf<Tr::kBlockCols, Tr::kBlockRows, true>(pos.m0, int(n0)) &
           kMaskBlockAll))
        policy.mask = nullptr;  // for NeedsCheck only
      if (policy.HasSegmentRanges()) {
        // The step's query ids were read at the previous step's start, so
        // their latency hid under it (the key block's come from L1).
        const IdSpan ids = next_query_ids;
        if (step + 1 < steps) next_query_ids = query_ids(advance(pos));
        segments_all = Meet(ids, policy.KeyIds(n0, n0 + Tr::kBlockRows)) == SegmentMeet::kAll;
        if (segments_all) policy = policy.WithoutSegments();  // for NeedsCheck
      }
      check = policy.NeedsCheck(pos.m0, pos.m0 + Tr::kBlockCols, n0, n0 + Tr::kBlockRows);
      masked = elementwise || check;
    } else {
      masked = key_tail || pos.m0 + Tr::kBlockCols > s.seqlen_q ||
               (p.is_causal && pos.m0 < n0 + Tr::kBlockRows);
    }
    if (masked) {
      run_step(step & 1, pos, std::true_type{}, segments_all, check);
    } else {
      run_step(step & 1, pos, std::false_type{});
    }
    if constexpr (kDeferDq && Tr::kDqPhaseShift) {
      if (step > 0 && late_dq && !dbias_only) {
        // The thread's indices read again here: what the dQ product derives
        // from them is then not held (or spilled) across run_step.
        const int thread = ThreadIndexInPlace();
        const StepPos prev = retreat(pos);
        AccumulateDq<Element, kHeadDim, kDqGroup>(p, ds_buffer((step - 1) & 1), k_tile, b, prev.h, prev.m0,
                                                  thread / 32, thread % 32);
      }
    }
    pos = advance(pos);
  }
  if constexpr (kDeferDq) {
    if (steps > 0 && !dbias_only) {
      __syncthreads();  // the last step's dS^T slices are in
      const StepPos last = retreat(pos);
      AccumulateDq<Element, kHeadDim, kDqGroup>(p, ds_buffer((steps - 1) & 1), k_tile, b, last.h, last.m0,
                                                warp, lane);
    }
  }

  CpAsyncWait<0>();  // a block whose keys no query sees never waited for its K/V copies
  if (dbias_only) return;
  const int64_t out_off = k_off;
  const int col0 = col_tile0 * 8;
  StoreAccumulator<Element, kM, Tr::kDkvCols>(dk, static_cast<Element*>(p.dk) + out_off + col0,
                                              p.k_stride.row, n0 + warp_row, s.seqlen_k, d - col0,
                                              float(p.scale), lane);
  StoreAccumulator<Element, kM, Tr::kDkvCols>(dv, static_cast<Element*>(p.dv) + out_off + col0,
                                              p.k_stride.row, n0 + warp_row, s.seqlen_k, d - col0,
                                              1.0f, lane);
}

// delta = rowsum(dO * O) in 16-byte loads: kHeadDim / 8 lanes per query
// row, each with 8 columns of O and dO. With `clear_dq` it also zeroes the
// row's float32 dQ accumulator (the fused backward adds into it), so the
// accumulator is not cleared by a pass of its own. Rows: the query rows of
// every (batch, head), flattened. grid: (ceil(rows / kRowsPerBlock)); block 256.
template <int kHeadDim>
struct DeltaLayout {
  static constexpr int kLanesPerRow = kHeadDim / 8;
  static constexpr int kRowsPerBlock = 256 / kLanesPerRow;
};

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(256) DeltaAndClearKernel(const AttentionParams p, bool clear_dq) {
  using L = DeltaLayout<kHeadDim>;
  const auto& s = p.shape;
  const int64_t row_id = int64_t(blockIdx.x) * L::kRowsPerBlock + threadIdx.x / L::kLanesPerRow;
  const int c = (threadIdx.x % L::kLanesPerRow) * 8;  // first of this lane's 8 columns
  const int d = int(s.head_dim);                      // a multiple of 8, at most kHeadDim
  const bool active = row_id < s.batch * s.num_heads * s.seqlen_q && c < d;
  float acc = 0.0f;
  if (active) {
    const int64_t i = row_id % s.seqlen_q, h = (row_id / s.seqlen_q) % s.num_heads;
    const int64_t b = row_id / (s.seqlen_q * s.num_heads);
    const int64_t off = b * p.q_stride.batch + h * p.q_stride.head + i * p.q_stride.row + c;
    const uint4 o_bits = *reinterpret_cast<const uint4*>(static_cast<const Element*>(p.out) + off);
    const uint4 do_bits = *reinterpret_cast<const uint4*>(static_cast<const Element*>(p.dout) + off);
    const Element* o = reinterpret_cast<const Element*>(&o_bits);
    const Element* dout = reinterpret_cast<const Element*>(&do_bits);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc = fmaf(ToFloat(o[k]), ToFloat(dout[k]), acc);
    if (clear_dq) {
      float4* dq = reinterpret_cast<float4*>(p.dq_accum + row_id * d + c);
      dq[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      dq[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  // The row's lanes are consecutive and aligned to their count (a power of 2).
#pragma unroll
  for (int width = L::kLanesPerRow / 2; width > 0; width /= 2)
    acc += __shfl_xor_sync(0xffffffffu, acc, width);
  if (row_id < s.batch * s.num_heads * s.seqlen_q && c == 0) static_cast<float*>(p.delta)[row_id] = acc;
}

// dQ = scale * dq_accum, rounded to the element type; one thread per 8
// columns (two 16-byte loads, one 16-byte store). grid: (ceil(seqlen_q *
// head_dim / 8 / 256), num_heads, batch) (CheckGrid), so a thread finds its
// row and columns with one 32-bit division (three 64-bit ones per thread
// held the pass to 3.3 TB/s).
template <typename Element>
__global__ void __launch_bounds__(256) DqConvertKernel(const AttentionParams p) {
  const auto& s = p.shape;
  const int octets_per_row = int(s.head_dim / 8);  // head_dim is a multiple of 8 here
  const int idx = int(blockIdx.x) * 256 + int(threadIdx.x);
  if (idx >= s.seqlen_q * octets_per_row) return;
  const int i = idx / octets_per_row, c = (idx - i * octets_per_row) * 8;
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int group_row = i & ~(DqAccumLayout::kGroupRows - 1);
  const int d = int(s.head_dim);
  const float4* acc = reinterpret_cast<const float4*>(
      p.dq_accum + p.row_stat_index(b, h, group_row) * d +
      DqAccumLayout::InGroup(DqAccumLayout::FullGroup(group_row, s.seqlen_q), i - group_row, c, d));
  const float4 lo = acc[0], hi = acc[1];
  const float scale = float(p.scale);
  Element* dq = static_cast<Element*>(p.dq) + b * p.q_stride.batch + h * p.q_stride.head + i * p.q_stride.row + c;
  *reinterpret_cast<uint4*>(dq) =
      make_uint4(Pack2<Element>(lo.x * scale, lo.y * scale), Pack2<Element>(lo.z * scale, lo.w * scale),
                 Pack2<Element>(hi.x * scale, hi.y * scale), Pack2<Element>(hi.z * scale, hi.w * scale));
}

}  // namespace jax_flash::cuda::sm80
