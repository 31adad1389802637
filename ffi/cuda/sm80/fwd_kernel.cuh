// FlashAttention-2 forward on mma.sync (m16n8k16, float accumulation) for
// float16/bfloat16, any GPU from sm_80. One block per (kBlockM query rows,
// head, batch); K and V blocks stream through two shared-memory stages with
// cp.async: the next key block's K and V load during the whole of this
// block's QK^T, softmax and P V, and one barrier per key block suffices.
// At 256 (FwdTraits::kPairSplit) two warps share each 32 query rows, one
// per half of the keys (S) and of the columns (O), trading row maxima and P.
#pragma once

#include <math_constants.h>

#include <type_traits>

#include "common/mask_policy.h"
#include "common/params.h"
#include "common/row_end.h"
#include "cuda/logit_features.cuh"
#include "cuda/row_stats.cuh"
#include "cuda/sm80/block_order.cuh"
#include "cuda/sm80/kernel_traits.cuh"
#include "cuda/sm80/mma.cuh"
#include "cuda/sm80/warp_gemm.cuh"

namespace jax_flash::cuda::sm80 {

// Reduces this thread's 2 * kN values of one accumulator row (row half hh:
// elements 2hh, 2hh + 1 of each n-tile) with op, as a balanced tree: depth
// log2(2 kN) dependent operations instead of 2 kN in a chain. (The row
// maximum gates every exp2 of its row; with two warps per scheduler a chain
// of 16 FMNMX was latency the other warp could not always cover.)
template <int kN, typename Op>
__device__ __forceinline__ float RowHalfReduce(const float (&frag)[kN][4], int hh, Op op) {
  static_assert((kN & (kN - 1)) == 0, "a power of two of n-tiles");
  float v[kN];
#pragma unroll
  for (int nt = 0; nt < kN; ++nt) v[nt] = op(frag[nt][2 * hh], frag[nt][2 * hh + 1]);
#pragma unroll
  for (int width = kN / 2; width >= 1; width /= 2)
#pragma unroll
    for (int i = 0; i < width; ++i) v[i] = op(v[i], v[i + width]);
  return v[0];
}

// kFeatures: the variant for calls with attention features (p.features.Any());
// kTransforms: with the bias, dropout and soft cap; kDropout, kSoftcap: those
// alone beside the masks (FwdTraits).
template <typename Element, int kHeadDim, bool kFeatures, bool kTransforms = kFeatures,
          bool kDropout = kTransforms, bool kSoftcap = kTransforms || kDropout>
__global__ void __launch_bounds__(FwdTraits<kHeadDim, kFeatures, kTransforms, kDropout, kSoftcap>::kThreads, 1)
    ForwardKernel(const AttentionParams p, const BlockOrder order) {
  using Tr = FwdTraits<kHeadDim, kFeatures, kTransforms, kDropout, kSoftcap>;
  constexpr int kM = Tr::kMTiles, kN = Tr::kNTiles, kD = Tr::kDTiles;
  // The soft cap's tanh on the special-function unit for bfloat16 (FastTanh for float16).
  constexpr bool kApproxTanh = std::is_same_v<Element, __nv_bfloat16>;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_tile = SmemAddr(smem);                            // [kBlockM][kHeadDim]
  // Two stages (s = key block index % 2) of K then V, [kBlockN][kHeadDim]
  // each; with Tr::kSplitKv one K and one V tile (see next_stage).
  const uint32_t kv_stages = q_tile + Tr::kBlockM * kHeadDim * 2;
  constexpr uint32_t kTileBytes = Tr::kBlockN * kHeadDim * 2;

  const auto& s = p.shape;
  const BlockCoord blk = DecodeBlock(order, s.num_heads, s.batch);
  const int64_t b = blk.b, h = blk.h, hk = h / s.group();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // MMA fragment row / column-pair owner
  // Causal: the last query blocks see the most keys, so they are the heaviest
  // ranks (launched first).
  const int64_t positions = order.chunk ? order.positions : int64_t(gridDim.x);
  const int64_t m0 = (p.is_causal ? positions - 1 - blk.rank : int64_t(blk.rank)) * Tr::kBlockM;
  // With Tr::kPairSplit, warps 2i and 2i + 1 share the rows; `half` picks
  // the warp's keys of each block (S) and its columns of O.
  constexpr bool kPair = Tr::kPairSplit;
  const int half = kPair ? warp % 2 : 0;
  const int warp_row = warp / Tr::kSplit * kM * 16;  // first row of this warp inside the block
  const int key0 = half * kN * 8;                     // its first key of each key block
  const int col_tile0 = half * kD;                    // its first 8-column tile of O
  const int d = int(s.head_dim);
  // Pairs: the block's P [kBlockM][kBlockN] (each warp writes its rows x
  // keys, its partner reads them) and the halves' row statistics [2][kBlockM].
  // Their reuse needs no barrier of its own: a warp writes block nb's maxima
  // and P half only after block nb's before_qk barrier, which its partner
  // reaches only after its last reads of block nb + 1's (after that block's
  // after_qk barrier and pair barrier).
  const uint32_t p_tile = q_tile + Tr::kPairOffset;
  const uint32_t pair_stats = p_tile + Tr::kBlockM * Tr::kPRowBytes;
  // This thread's slot of row (mt, hh) in half `which`'s statistics (lane t == 0 writes).
  auto stat_slot = [&](int which, int mt, int hh) {
    return pair_stats + uint32_t((which * Tr::kBlockM + warp_row + mt * 16 + g + hh * 8) * 4);
  };

  const Element* q = static_cast<const Element*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head;
  const Element* k = static_cast<const Element*>(p.k) + b * p.k_stride.batch + hk * p.k_stride.head;
  const Element* v = static_cast<const Element*>(p.v) + b * p.k_stride.batch + hk * p.k_stride.head;

  const int64_t kv_end = p.is_causal ? min(s.seqlen_k, m0 + Tr::kBlockM) : s.seqlen_k;
  const int n_blocks = int((kv_end + Tr::kBlockN - 1) / Tr::kBlockN);
  // Key blocks from first_masked on need element masks: a tail block past
  // seqlen_k, and causal blocks reaching past the block's first query (kBlockM
  // is a multiple of kBlockN, so that starts at block m0 / kBlockN). The
  // blocks run last to first so the masked ones come first and the rest run
  // the loop body without any mask arithmetic.
  static_assert(Tr::kBlockM % Tr::kBlockN == 0);
  const int tail_free = s.seqlen_k % Tr::kBlockN == 0 ? n_blocks : n_blocks - 1;
  const int first_masked = p.is_causal ? min(tail_free, int(m0 / Tr::kBlockN)) : tail_free;
  // With features, the shared MaskPolicy bounds the key blocks (lengths,
  // causal, window) and says which ones need per-element work; a bias, soft
  // cap or dropout puts every block on the per-element path.
  // (Each variant sees only the features it has: LaunchForward.)
  const bool elementwise = kFeatures && LogitFeatures::ElementwiseLogits(p);
  int n_lo = 0, n_hi = n_blocks;
  if constexpr (kFeatures) {
    int64_t lo, hi;
    MaskPolicy::For(p, b, h).KeyRange(m0, m0 + Tr::kBlockM, &lo, &hi);
    n_lo = int(lo / Tr::kBlockN);
    n_hi = hi > lo ? int((hi + Tr::kBlockN - 1) / Tr::kBlockN) : n_lo;
    const MaskPolicy policy = MaskPolicy::For(p, b, h);
    if (KeyMaskReader<Tr::kBlockN>::Applies(policy)) TrimHiddenKeyBlocks<Tr::kBlockN>(policy, &n_lo, &n_hi);
    // Packed documents: only the key blocks of this block's documents.
    if (policy.HasSegmentRanges())
      TrimSegmentBlocks<Tr::kBlockN, false>(policy, policy.QueryIds(m0, m0 + Tr::kBlockM), &n_lo, &n_hi);
    // A per-query mask's block summary (mask_blocks): the key blocks it
    // hides for all of this block's rows, from both ends.
    if (p.features.mask_blocks && n_hi > n_lo) {
      const MaskBlocks blocks = MaskBlocks::For(p.features, b, h);
      TrimEmptyBlocks(&n_lo, &n_hi, [&](int nb) {
        return !(blocks.SpanOf<Tr::kBlockM, Tr::kBlockN, true>(int(m0), nb * Tr::kBlockN) &
                 kMaskBlockSome);
      });
    }
  }

  // Where key block nb's K and V tiles live.
  auto k_tile_of = [&](int nb) {
    return Tr::kSplitKv ? kv_stages : kv_stages + (nb & 1) * 2 * kTileBytes;
  };
  auto load_k = [&](int nb) {
    LoadTileAsync<Tr::kBlockN, kHeadDim, Tr::kThreads>(k_tile_of(nb), k, p.k_stride.row,
                                                       int64_t(nb) * Tr::kBlockN, s.seqlen_k, d);
  };
  auto load_v = [&](int nb) {
    LoadTileAsync<Tr::kBlockN, kHeadDim, Tr::kThreads>(k_tile_of(nb) + kTileBytes, v, p.k_stride.row,
                                                       int64_t(nb) * Tr::kBlockN, s.seqlen_k, d);
  };
  LoadTileAsync<Tr::kBlockM, kHeadDim, Tr::kThreads>(q_tile, q, p.q_stride.row, m0, s.seqlen_q, d);
  if (n_hi > n_lo) {  // blocks run last to first
    load_k(n_hi - 1);
    if constexpr (!Tr::kSplitKv) load_v(n_hi - 1);
  }
  CpAsyncCommit();

  float o[kM][kD][4] = {};
  // Running row maxima in log2 units (scale folded in) and this thread's
  // share of the row sums; [m-tile][row g or g + 8].
  float row_max[kM][2], row_sum[kM][2];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
    for (int hh = 0; hh < 2; ++hh) row_max[mt][hh] = -CUDART_INF_F, row_sum[mt][hh] = 0.0f;
  // The sm80 dispatch requires scale > 0, so max(scale * s) = scale * max(s)
  // and each probability is one FFMA and one ex2.
  const float scale_log2 = float(p.scale) * kLog2e;
  // How far (log2 units) a row's exponent offset may lag its running maximum:
  // probabilities up to 2^8 keep float sums of 2^20+ keys far from overflow.
  constexpr float kRescaleSlack = 8.0f;

  // The copy pipeline around block nb's two products. Two stages: before
  // S, block nb's K and V (and Q) landed and every warp is done with block
  // nb + 1, whose stage block nb - 1 now fills. Split K/V (one tile each):
  // before S, K landed and every warp is done with block nb + 1's V, so V
  // loads under S = Q K^T; after S, V landed and every warp is done with K,
  // so block nb - 1's K loads under the softmax and P V.
  auto before_qk = [&](int nb) {
    CpAsyncWait<0>();
    __syncthreads();
    if constexpr (Tr::kSplitKv) {
      load_v(nb);
    } else if (nb > n_lo) {
      load_k(nb - 1);
      load_v(nb - 1);
    }
    CpAsyncCommit();
  };
  auto after_qk = [&](int nb) {
    if constexpr (Tr::kSplitKv) {
      CpAsyncWait<0>();
      __syncthreads();
      if (nb > n_lo) load_k(nb - 1);
      CpAsyncCommit();
    }
  };
  // A block with nothing visible (a key-only mask hides it) only keeps the
  // pipeline going.
  auto skip_block = [&](int nb) {
    if constexpr (Tr::kSplitKv) {
      after_qk(nb);  // block nb + 1's V is no longer read; block nb - 1's K loads
    } else {
      before_qk(nb);
    }
  };

  // segments_all: the segment ids of every pair of the block meet (their
  // summaries say so), so the per-element checks skip them. check_visibility
  // false: every pair is visible, the masked path runs for the logit
  // transform (soft cap, bias) or dropout alone.
  auto process_block = [&](int nb, auto masked, bool segments_all = false, bool check_visibility = true) {
    constexpr bool kMasked = decltype(masked)::value;
    const int64_t n0 = int64_t(nb) * Tr::kBlockN;
    const uint32_t k_tile = k_tile_of(nb), v_tile = k_tile + kTileBytes;
    before_qk(nb);

    // S = Q K^T  [kM x 16 rows][kBlockN], raw (unscaled) logits.
    float acc[kM][kN][4] = {};
    GemmSmemSmemT<Element, kM, kN, kHeadDim, Tr::kQkUnroll>(acc, q_tile, warp_row, k_tile, key0, lane);

    if constexpr (kMasked) {
      if constexpr (!kFeatures) {
        // Block-relative int32 indices: key column c is visible to row r when
        // c < col_limit and (not causal or c <= r + diagonal).
        const int col_limit = int(min(int64_t(Tr::kBlockN), s.seqlen_k - n0));
        const int diagonal = int(m0 - n0);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt)
#pragma unroll
          for (int nt = 0; nt < kN; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int row = warp_row + mt * 16 + g + (i / 2) * 8;
              const int col = key0 + nt * 8 + 2 * t + (i % 2);
              if (col >= col_limit || (p.is_causal && col > row + diagonal))
                acc[mt][nt][i] = -CUDART_INF_F;
            }
      } else {
        // Built here, not kept across the loop: their fields would cost
        // registers the main loop does not have.
        LogitFeatures lf = LogitFeatures::For(p, b, h);
        if (segments_all) lf.mask = lf.mask.WithoutSegments();
        const bool transform = Tr::kTransforms && lf.NeedsTransform();
        const bool softcap_only = Tr::kSoftcap && lf.cap > 0.0f && !(Tr::kTransforms && lf.bias);
        const float inv_scale_log2 = 1.0f / scale_log2;
#pragma unroll
        for (int mt = 0; mt < kM; ++mt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int64_t row = m0 + warp_row + mt * 16 + g + hh * 8;
            constexpr uint32_t kAllBits = 2 * kN == 32 ? ~0u : (1u << (2 * kN)) - 1;
            const uint32_t visible =
                check_visibility ? VisibleBits<kN, true, Tr::kMaskReadChunk>(lf.mask, row, n0 + 2 * t) : kAllBits;
            // The row's bias values, read before any is used (clamped columns,
            // see LastVisibleColumn), so the reads overlap.
            float bias_values[kN][2] = {};
            if (Tr::kTransforms && lf.bias && visible)
              lf.LoadBiasRow<Element, true>(row * lf.bias_row + (n0 + 2 * t) * lf.bias_col, lf.bias_col,
                                            LastVisibleColumn(visible), bias_values);
#pragma unroll
            for (int nt = 0; nt < kN; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                float& x = acc[mt][nt][2 * hh + e];
                if (!(visible >> (2 * nt + e) & 1u)) {
                  x = -CUDART_INF_F;
                } else if (softcap_only) {
                  float unused_tanh;
                  x = lf.SoftcapRaw<kApproxTanh>(x, &unused_tanh);
                } else if (transform) {
                  float unused_tanh;
                  // Back in raw units, so the softmax below is shared with the plain path.
                  x = lf.Apply<true>(x * scale_log2, bias_values[nt][e], &unused_tanh) * inv_scale_log2;
                }
              }
          }
      }
    }

    // Online softmax; a row's 4 owners (lanes 4g..4g+3) combine by shuffles.
    // The exponent offset m (row_max) lags the true running maximum by up to
    // kRescaleSlack (log2 units): P = exp2(x - m) <= 2^kRescaleSlack is still
    // exact in float and 16-bit (only the exponent grows), and O and the sum
    // are rescaled only when some row of the warp outgrows the slack, which
    // past the first key blocks of a row is rare (the rescale is 4 * kM *
    // kDTiles FMULs plus an exp2 per row, and sits between the two GEMMs).
    // Pairs publish their maxima before after_qk's barrier and take the
    // partner's after it; holding the same rows and then the same maxima,
    // both take the same rescale decisions and keep the same row_max, so
    // their P halves share one exponent offset.
    if constexpr (!kPair) after_qk(nb);
    float blk_max[kM][2];
    bool grow = false;
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float mx = RowHalfReduce<kN>(acc[mt], hh, [](float a, float b) { return fmaxf(a, b); });
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if constexpr (kPair) {
          if (t == 0) StSharedF32(stat_slot(half, mt, hh), mx);
          blk_max[mt][hh] = mx;
        } else {
          blk_max[mt][hh] = mx * scale_log2;
          // False while the row has seen nothing visible (-inf > -inf).
          grow |= blk_max[mt][hh] > row_max[mt][hh] + kRescaleSlack;
        }
      }
    if constexpr (kPair) {
      after_qk(nb);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float partner = LdSharedF32(stat_slot(1 - half, mt, hh));
          blk_max[mt][hh] = fmaxf(blk_max[mt][hh], partner) * scale_log2;
          grow |= blk_max[mt][hh] > row_max[mt][hh] + kRescaleSlack;
        }
    }
    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
      for (int mt = 0; mt < kM; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float new_max = fmaxf(row_max[mt][hh], blk_max[mt][hh]);
          // exp2(-inf - finite) = 0; both -inf (nothing visible yet) keeps 1.
          const float alpha =
              new_max == -CUDART_INF_F ? 1.0f : FastExp2(row_max[mt][hh] - new_max);
          row_max[mt][hh] = new_max;
          row_sum[mt][hh] *= alpha;
#pragma unroll
          for (int dt = 0; dt < kD; ++dt) o[mt][dt][2 * hh] *= alpha, o[mt][dt][2 * hh + 1] *= alpha;
        }
    }
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        // Nothing visible yet (only possible in masked blocks): P = 0.
        const float m_use =
            (kMasked && row_max[mt][hh] == -CUDART_INF_F) ? 0.0f : row_max[mt][hh];
        // The sum stays a chain: P V does not wait for it.
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kN; ++nt)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const float e = FastExp2(fmaf(acc[mt][nt][2 * hh + j], scale_log2, -m_use));
            acc[mt][nt][2 * hh + j] = e;
            sum += e;
          }
        row_sum[mt][hh] += sum;  // the normalizer ignores dropout
      }
    if constexpr (kMasked && Tr::kDropout) {
      if (elementwise && p.features.dropout_rate > 0.0) {
        // This thread's pairs of an m-tile: rows g and g + 8 against keys
        // n0 + 8 nt + 2t + j. For each j and 32-key run, one Philox call
        // serves both rows and n-tiles 4 r .. 4 r + 3 (DropoutPolicy).
        static_assert(kN % 4 == 0 && !(kPair && kMasked), "whole 32-key runs per thread");
        const DropoutPolicy dropout = DropoutPolicy::For(p, b);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
          const int64_t row0 = m0 + warp_row + mt * 16 + g;
#pragma unroll
          for (int run = 0; run < kN / 4; ++run)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const uint32_t keep = dropout.KeepBits8(b, h, row0, n0 + 32 * run + 2 * t + j);
#pragma unroll
              for (int hh = 0; hh < 2; ++hh)
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                  float& x = acc[mt][4 * run + w][2 * hh + j];
                  x = keep >> (w + 4 * hh) & 1u ? x * dropout.keep_scale : 0.0f;
                }
            }
        }
      }
    }

    if constexpr (kPair) {
      // This warp's P for its partner, then its own keys' share of O (the
      // partner writes meanwhile), then the partner's. The column offsets
      // fold into the tile addresses (whole swizzle periods of V's rows).
      StoreFragmentPairs<Element, kM, kN, Tr::kPRowBytes>(acc, p_tile, warp_row, key0, lane);
      const uint32_t v_cols = v_tile + col_tile0 * 16;
      GemmRegsSmem<Element, kM, kN, kHeadDim, kD * 8>(o, acc, v_cols, key0, lane);
      SyncWarpGroup<2>(warp / 2);
      const int partner_key0 = (1 - half) * kN * 8;
      GemmSmemSmem<Element, kM, kN / 2, Tr::kPRowBytes / 16, kHeadDim / 8, kD * 8,
                   PaddedRows<Tr::kPRowBytes>>(o, p_tile + partner_key0 * 2, warp_row, 0, v_cols,
                                               partner_key0, 0, lane);
    } else {
      // O += P V
      GemmRegsSmem<Element, kM, kN, kHeadDim>(o, acc, v_tile, 0, lane);
    }
  };

  if constexpr (!kFeatures) {
    int nb = n_blocks - 1;
    for (; nb >= first_masked; --nb) process_block(nb, std::true_type{});
    for (; nb >= 0; --nb) process_block(nb, std::false_type{});
  } else {
    // A key-only mask is summarized per key block (KeyMaskReader), its bytes
    // read one block ahead: blocks it hides entirely only keep the copy
    // pipeline going, blocks it leaves visible skip the mask check.
    // Segment ids likewise by their block summaries, read a block ahead: a
    // key block of no document of this query block (between documents of
    // non-contiguous ids; trimming dropped those at the ends) only keeps the
    // pipeline going, one whose ids all equal the query block's single id
    // needs no id check.
    const MaskPolicy first_policy = MaskPolicy::For(p, b, h);
    const bool key_only_mask = KeyMaskReader<Tr::kBlockN>::Applies(first_policy);
    const bool segment_ranges = first_policy.HasSegmentRanges();
    KeyMaskReader<Tr::kBlockN> key_mask;
    if (key_only_mask && n_hi > n_lo) key_mask.Load(first_policy, int64_t(n_hi - 1) * Tr::kBlockN);
    auto key_ids = [&](const MaskPolicy& m, int nb) {
      return m.KeyIds(int64_t(nb) * Tr::kBlockN, int64_t(nb + 1) * Tr::kBlockN);
    };
    IdSpan next_key_ids{0, 0};
    if (segment_ranges && n_hi > n_lo) next_key_ids = key_ids(first_policy, n_hi - 1);
    // A per-query mask's block summary likewise: a block it hides whole is
    // skipped, one it shows whole needs no mask check. (Read in the block,
    // from the parameters: state kept across the loop for a read a block
    // ahead made these kernels spill, up to 300 bytes more at 128.)
    for (int nb = n_hi - 1; nb >= n_lo; --nb) {
      MaskPolicy policy = MaskPolicy::For(p, b, h);
      if (p.features.mask_blocks) {
        const uint32_t bits = MaskBlocks::For(p.features, b, h)
                                  .template SpanOf<Tr::kBlockM, Tr::kBlockN, true>(int(m0), nb * Tr::kBlockN);
        if (!(bits & kMaskBlockSome)) {
          skip_block(nb);
          continue;
        }
        if (bits & kMaskBlockAll) policy.mask = nullptr;  // for NeedsCheck only
      }
      if (key_only_mask) {
        const KeyMaskBlock summary = key_mask.Summary();
        if (nb > n_lo) key_mask.Load(policy, int64_t(nb - 1) * Tr::kBlockN);
        if (summary == KeyMaskBlock::kNoneVisible) {
          skip_block(nb);
          continue;
        }
        if (summary == KeyMaskBlock::kAllVisible) policy.mask = nullptr;  // for NeedsCheck only
      }
      bool segments_all = false;
      if (segment_ranges) {
        const IdSpan ids = next_key_ids;
        if (nb > n_lo) next_key_ids = key_ids(policy, nb - 1);
        const SegmentMeet meet = Meet(policy.QueryIds(m0, m0 + Tr::kBlockM), ids);
        if (meet == SegmentMeet::kNone) {
          skip_block(nb);
          continue;
        }
        segments_all = meet == SegmentMeet::kAll;
        if (segments_all) policy = policy.WithoutSegments();  // for NeedsCheck
      }
      const bool check = policy.NeedsCheck(m0, m0 + Tr::kBlockM, int64_t(nb) * Tr::kBlockN,
                                           int64_t(nb + 1) * Tr::kBlockN);
      if (elementwise || check) {
        process_block(nb, std::true_type{}, segments_all, check);
      } else {
        process_block(nb, std::false_type{});
      }
    }
  }
  CpAsyncWait<0>();

  // Epilogue: normalize rows, write lse, then out. Pairs add their halves'
  // sums (both were kept against the same row_max). The partner's last read
  // of pair_stats came before the last block's pair barrier.
  float* lse = static_cast<float*>(p.lse);
  const float sink2 = SinkLog2<float>(p.features, b, h, s.num_heads);  // -inf: no sinks
  if constexpr (kPair) {
#pragma unroll
    for (int mt = 0; mt < kM; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float& l = row_sum[mt][hh];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (t == 0) StSharedF32(stat_slot(half, mt, hh), l);
      }
    SyncWarpGroup<2>(warp / 2);
  }
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float l = row_sum[mt][hh];
      if constexpr (kPair) {
        l += LdSharedF32(stat_slot(1 - half, mt, hh));
      } else {
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
      }
      // No visible key: zeros (and the sink's lse; without sinks -inf).
      const RowEnd<float> end = EndRow(row_max[mt][hh], l, sink2);
#pragma unroll
      for (int dt = 0; dt < kD; ++dt) o[mt][dt][2 * hh] *= end.scale, o[mt][dt][2 * hh + 1] *= end.scale;
      const int64_t row = m0 + warp_row + mt * 16 + g + hh * 8;
      if (t == 0 && half == 0 && row < s.seqlen_q) lse[p.row_stat_index(b, h, row)] = end.lse;
    }
  Element* out = static_cast<Element*>(p.out) + b * p.q_stride.batch + h * p.q_stride.head;
  StoreAccumulator<Element, kM, kD * 8>(o, out + col_tile0 * 8, p.q_stride.row, m0 + warp_row,
                                        s.seqlen_q, d - col_tile0 * 8, 1.0f, lane);
}

}  // namespace jax_flash::cuda::sm80
