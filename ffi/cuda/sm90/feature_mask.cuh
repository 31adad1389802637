// The attention features of the sm90 forward's feature variants (Features,
// kernel_traits.cuh), on wgmma accumulator fragments, with the shared
// MaskPolicy (common/mask_policy.h) and the CUDA kernels' helpers for it
// (cuda/logit_features.cuh), so the semantics are the sm80 forward's:
//   - a tile visits the key blocks [lo, hi) of KeyRange over its 128 query
//     rows (lengths, causal, window, position offsets: per batch row),
//     trimmed at both ends by the segment-id block summaries (blocks of
//     other documents); a tile with none writes zeros and lse -inf;
//   - per block and warp (16 rows), the masks are applied element by
//     element only where NeedsBoundsCheck or the segment summaries say a pair
//     may be hidden; a block whose ids all meet skips the id reads, one whose
//     ids never meet (between documents of non-contiguous ids) is hidden
//     whole;
//   - the soft cap on every logit, in raw units (LogitFeatures::SoftcapRaw's
//     formula and tanh: TanhApprox for bfloat16, FastTanh for float16), so
//     the sm80 backward recomputes the same probabilities.
// The sm90 backward's variants (bwd_kernel.cuh) take the same rules from the
// key side: a tile's query blocks (FeatureQueryBlocks) and one step's
// visibility with rows = keys (FeatureStepMask).
#pragma once

#include <cuda_bf16.h>
#include <math_constants.h>

#include <algorithm>  // std::min / max: host and device (--expt-relaxed-constexpr)
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/mask_policy.h"
#include "common/params.h"
#include "cuda/logit_features.cuh"
#include "cuda/row_stats.cuh"
#include "cuda/sm90/kernel_traits.cuh"  // Features

namespace jax_flash::cuda::sm90 {

// Key blocks [lo, hi) of one tile, visited from hi - 1 down to lo.
struct KeyBlocks {
  int lo, hi;
};

// The ids of positions [p0, p0 + kCount) (p0 a multiple of kCount) from one
// row's block summaries, in int32 from the entries directly: 16 query rows
// (or keys) and 64 (the backward's query blocks) lie in one kSegmentBlock
// entry, 128 rows or keys in two, and a block of 80 keys (at 256) in at most
// two (it ends at most 48 + 79 = 127 positions past an entry's start). The
// same answer as SegmentRanges::Span, whose 64-bit loop state made the
// consumers (and the producer) spill.
template <int kCount>
__host__ __device__ __forceinline__ IdSpan SummarySpan(const SegmentRanges& r, int p0) {
  static_assert(kSegmentBlock == 64 && (kCount == 16 || kCount == 64 || kCount == 80 || kCount == 128),
                "at most two entries");
  const int last = int(r.blocks) - 1;
  const int e1 = std::min((p0 + kCount - 1) / int(kSegmentBlock), last), e0 = std::min(p0 / int(kSegmentBlock), e1);
  const int32_t* x = r.ranges + 2 * e0;
  const int32_t* y = r.ranges + 2 * e1;
  return {std::min(x[0], y[0]), std::max(x[1], y[1])};
}

// The key blocks that query rows [m0, m0 + kBlockM) of (b, h) may see. One
// warp (TrimEmptyBlocks votes); every warp that calls it gets the same
// answer, which is what keeps the producer's and the consumers' ring
// positions in step.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ KeyBlocks FeatureKeyBlocks(const AttentionParams& p, int m0, int h, int b) {
  const MaskPolicy policy = MaskPolicy::For(p, b, h);
  int64_t lo, hi;
  policy.KeyRange(m0, int64_t(m0) + kBlockM, &lo, &hi);
  if (hi <= lo) return {0, 0};
  KeyBlocks kb{int(lo / kBlockN), int((hi + kBlockN - 1) / kBlockN)};
  // Packed documents: only the key blocks of this tile's documents
  // (TrimSegmentBlocks' rule, on SummarySpan).
  if (policy.HasSegmentRanges()) {
    const IdSpan rows = SummarySpan<kBlockM>(policy.q_ranges, m0);
    TrimEmptyBlocks(&kb.lo, &kb.hi, [&](int nb) {
      return Meet(rows, SummarySpan<kBlockN>(policy.kv_ranges, nb * kBlockN)) == SegmentMeet::kNone;
    });
  }
  return kb;
}

// Why a feature variant cannot serve p (empty: it can), forward and
// backward alike. Bias, a boolean mask and dropout stay on the sm80 kernels;
// the soft cap needs kMasksSoftcap.
inline std::string UnsupportedFeatures(const AttentionParams& p, Features variant) {
  const AttentionFeatures& f = p.features;
  if (variant == Features::kNone) return f.Any() ? "attention features need a feature variant" : "";
  if (f.bias || f.mask || f.dropout_rate > 0.0)
    return "a bias, a boolean mask and dropout are not supported (the sm80 kernels serve them)";
  if (f.softcap > 0.0 && variant != Features::kMasksSoftcap) return "the soft cap needs the kMasksSoftcap variant";
  return {};
}

// The soft cap's factors on raw q.k (LogitFeatures::For's, in the same float
// arithmetic): x -> cap_over_scale * tanh(scale_over_cap * x).
struct SoftcapFactors {
  float scale_over_cap = 0.0f, cap_over_scale = 0.0f;
  static SoftcapFactors For(const AttentionParams& p) {
    const double cap = p.features.softcap;
    return cap > 0 ? SoftcapFactors{float(p.scale / cap), float(cap / p.scale)} : SoftcapFactors{};
  }
};

// MaskPolicy::Segments for one warp's 16 query rows from i0 against key
// block [n0, n0 + kBlockN) (SummarySpan).
template <int kBlockN>
__host__ __device__ __forceinline__ SegmentMeet WarpSegmentMeet(const MaskPolicy& m, int i0, int n0) {
  if (!m.q_segments) return SegmentMeet::kAll;
  if (!m.HasSegmentRanges()) return SegmentMeet::kSome;
  return Meet(SummarySpan<16>(m.q_ranges, i0), SummarySpan<kBlockN>(m.kv_ranges, n0));
}

// Which of this thread's pairs of one key block are visible: its rows `row`
// and `row` + 8, columns 8j + 2t + e (softmax.cuh's layout) as bit 2j + e
// of visible[hh]. Computed before the block's S = Q K^T is issued, while
// S's registers are still free (the id reads then also run under the
// product): a uint32 per row is all that stays live across it.
struct BlockMask {
  uint32_t visible[2];
  bool check;  // false: every pair of the warp's rows is visible
};

// MaskPolicy::Visible for the pairs above (the structural bounds by
// VisibleBits, then the segment ids), skipping the element work where the
// warp's 16 rows from `warp_i0` need none (NeedsBoundsCheck, WarpSegmentMeet).
// Host-callable for tests/cpp/sm90_feature_mask_test.cu.
template <int kBlockN>
__host__ __device__ __forceinline__ BlockMask FeatureBlockMask(const AttentionParams& p, int b, int h, int warp_i0, int row,
                                                      int t, int n0) {
  constexpr int kTiles = kBlockN / 8;
  static_assert(2 * kTiles <= 32, "VisibleBits: one bit per column of the thread's row");
  // Opaque b and h: the policy's fields are rebuilt here for every block
  // (a few loads from the parameters) instead of being hoisted out of the
  // key-block loop, where the consumer has no registers to hold them.
  const MaskPolicy policy = MaskPolicy::For(p, b, h);
  const SegmentMeet meet = WarpSegmentMeet<kBlockN>(policy, warp_i0, n0);
  if (meet == SegmentMeet::kNone) return {{0u, 0u}, true};
  const bool ids = meet == SegmentMeet::kSome;
  if (!ids && !policy.NeedsBoundsCheck(warp_i0, int64_t(warp_i0) + 16, n0, int64_t(n0) + kBlockN))
    return {{~0u, ~0u}, false};
  // Lengths, causal, window and offsets (no element masks: the ids follow).
  const MaskPolicy bounds = policy.WithoutSegments();
  BlockMask m{{VisibleBits<kTiles, true>(bounds, row, int64_t(n0) + 2 * t),
               VisibleBits<kTiles, true>(bounds, int64_t(row) + 8, int64_t(n0) + 2 * t)},
              true};
  if (ids) {
    // Reads clamped into the sequences (positions past them are hidden by
    // the bounds: a visited key block starts below seqlen_k).
    const int q_last = int(p.shape.seqlen_q) - 1, k_last = int(p.shape.seqlen_k) - 1 - n0;
    const int32_t id0 = policy.q_segments[std::min(row, q_last)];
    const int32_t id1 = policy.q_segments[std::min(row + 8, q_last)];
    const int32_t* key_ids = policy.kv_segments + n0;
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int32_t id = key_ids[std::min(8 * j + 2 * t + e, k_last)];
        if (id != id0) m.visible[0] &= ~(1u << (2 * j + e));
        if (id != id1) m.visible[1] &= ~(1u << (2 * j + e));
      }
  }
  return m;
}

// The features on S = Q K^T of one key block (raw logits): soft-capped
// (kSoftcap), then -inf where `mask` hides the pair.
template <typename Element, int kBlockN, bool kSoftcap>
__device__ __forceinline__ void ApplyFeatures(float (&s)[kBlockN / 2], SoftcapFactors cap, const BlockMask& mask) {
  if constexpr (kSoftcap) {
#pragma unroll
    for (int k = 0; k < kBlockN / 2; ++k) {
      const float x = s[k] * cap.scale_over_cap;
      s[k] = (std::is_same_v<Element, __nv_bfloat16> ? TanhApprox(x) : FastTanh(x)) * cap.cap_over_scale;
    }
  }
  if (!mask.check) return;
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (!(mask.visible[hh] >> (2 * j + e) & 1u)) s[4 * j + 2 * hh + e] = -CUDART_INF_F;
}

// The backward's query blocks of kBlockM rows that may see the keys [n0, n0 +
// kBlockN) of batch row b, as [lo, hi) block indices: the mask policy's
// QueryRange (lengths, causal, window, position offsets: the same for every
// head of the batch row), trimmed at both ends by the segment-id block
// summaries (sm80's TrimSegmentBlocks rule, on SummarySpan). Warp-collective
// (TrimEmptyBlocks votes): every warp of the block calls it and gets the same
// answer, which keeps the producer's and the consumers' steps in step.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ KeyBlocks FeatureQueryBlocks(const AttentionParams& p, int n0, int h, int b) {
  const MaskPolicy policy = MaskPolicy::For(p, b, h);
  int64_t lo, hi;
  policy.QueryRange(n0, int64_t(n0) + kBlockN, &lo, &hi);
  if (hi <= lo) return {0, 0};
  KeyBlocks mb{int(lo / kBlockM), int((hi + kBlockM - 1) / kBlockM)};
  if (policy.HasSegmentRanges()) {
    const IdSpan keys = SummarySpan<kBlockN>(policy.kv_ranges, n0);
    TrimEmptyBlocks(&mb.lo, &mb.hi, [&](int m) {
      return Meet(SummarySpan<kBlockM>(policy.q_ranges, m * kBlockM), keys) == SegmentMeet::kNone;
    });
  }
  return mb;
}

// Which of this thread's pairs of one backward step are visible: S^T's rows
// `key` and `key` + 8 (keys; of the warp's 16 from warp_j0) against its
// columns, queries m0 + 8j + 2t + e (j < kBlockM / 8), as bit 2j + e, the
// second row's bits from bit 16. ~0u where the warp's 16 keys x kBlockM
// queries need no element check (NeedsBoundsCheck and the segment
// summaries, as FeatureBlockMask), 0 where their ids never meet. Computed
// while the step's S^T runs, before dP^T is issued (bwd_kernel.cuh: under
// dP^T a branch made ptxas serialize every wgmma), and applied as selects.
// Host-callable for tests/cpp/sm90_feature_mask_test.cu.
template <int kBlockM>
__host__ __device__ __forceinline__ uint32_t FeatureStepMask(const AttentionParams& p, int b, int h, int m0,
                                                             int warp_j0, int key, int t) {
  constexpr int kTiles = kBlockM / 8;
  static_assert(2 * kTiles == 16, "two 16-bit rows in one word");
  const MaskPolicy policy = MaskPolicy::For(p, b, h);
  SegmentMeet meet = SegmentMeet::kAll;
  if (policy.q_segments)
    meet = policy.HasSegmentRanges()
               ? Meet(SummarySpan<kBlockM>(policy.q_ranges, m0), SummarySpan<16>(policy.kv_ranges, warp_j0))
               : SegmentMeet::kSome;
  if (meet == SegmentMeet::kNone) return 0u;
  const bool ids = meet == SegmentMeet::kSome;
  if (!ids && !policy.NeedsBoundsCheck(m0, int64_t(m0) + kBlockM, warp_j0, int64_t(warp_j0) + 16)) return ~0u;
  const MaskPolicy bounds = policy.WithoutSegments();
  uint32_t visible = VisibleBits<kTiles, false>(bounds, key, int64_t(m0) + 2 * t) |
                     VisibleBits<kTiles, false>(bounds, int64_t(key) + 8, int64_t(m0) + 2 * t) << 16;
  if (ids) {
    // Reads clamped into the sequences (positions past them are hidden by
    // the bounds; a visited query block starts below seqlen_q).
    const int k_last = int(p.shape.seqlen_k) - 1, q_last = int(p.shape.seqlen_q) - 1 - m0;
    const int32_t id0 = policy.kv_segments[std::min(key, k_last)];
    const int32_t id1 = policy.kv_segments[std::min(key + 8, k_last)];
    const int32_t* query_ids = policy.q_segments + m0;
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int32_t id = query_ids[std::min(8 * j + 2 * t + e, q_last)];
        if (id != id0) visible &= ~(1u << (2 * j + e));
        if (id != id1) visible &= ~(1u << (16 + 2 * j + e));
      }
  }
  return visible;
}

}  // namespace jax_flash::cuda::sm90
