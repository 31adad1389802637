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
//     whole. The per-row bounds, the warp's id span and its rows' ids are
//     taken from the policy once per tile (FeatureRows, ten int32); a block
//     then costs a few compares, plus the key block's summaries (read a
//     block ahead by the consumer) and, on partial blocks, the bits;
//   - the soft cap on every logit, in raw units (LogitFeatures::SoftcapRaw's
//     formula and tanh: TanhApprox for bfloat16, FastTanh for float16), so
//     the sm80 backward recomputes the same probabilities.
// The sm90 backward's variants (bwd_kernel.cuh) take the same rules from the
// key side: a tile's query blocks (FeatureQueryBlocks) and one step's
// visibility with rows = keys (FeatureStepMask).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <algorithm>  // std::min / max: host and device (--expt-relaxed-constexpr)
#include <climits>
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
// consumers (and the producer) spill. Loaded as the two entries
// (SummaryEntries) and joined by Span(), so that a caller that loads a block
// ahead joins them only where it uses them (joining at the load waits for
// it).
struct SummaryEntries {
  int32_t first_lo = 0, first_hi = 0, last_lo = 0, last_hi = 0;
  __host__ __device__ IdSpan Span() const {
    return {std::min(first_lo, last_lo), std::max(first_hi, last_hi)};
  }
};
template <int kCount>
__host__ __device__ __forceinline__ SummaryEntries LoadSummaryEntries(const SegmentRanges& r, int p0) {
  static_assert(kSegmentBlock == 64 && (kCount == 16 || kCount == 64 || kCount == 80 || kCount == 128),
                "at most two entries");
  const int last = int(r.blocks) - 1;
  const int e1 = std::min((p0 + kCount - 1) / int(kSegmentBlock), last), e0 = std::min(p0 / int(kSegmentBlock), e1);
  const int32_t* x = r.ranges + 2 * e0;
  const int32_t* y = r.ranges + 2 * e1;
  return {x[0], x[1], y[0], y[1]};
}
template <int kCount>
__host__ __device__ __forceinline__ IdSpan SummarySpan(const SegmentRanges& r, int p0) {
  return LoadSummaryEntries<kCount>(r, p0).Span();
}

// The key blocks that query rows [m0, m0 + kBlockM) of (b, h) may see. One
// warp (TrimEmptyBlocks votes); every warp that calls it gets the same
// answer, which is what keeps the producer's and the consumers' ring
// positions in step.
// AttentionFeatures::BroadcastOffset with int32 batch indices (b < 2^31
// tiles here): its 64-bit divisions spilled the producer's 40 registers.
__host__ __device__ __forceinline__ int64_t BroadcastOffset32(const AttentionFeatures& f, const BroadcastStrides& st, int b,
                                                     int h) {
  int64_t off = int64_t(h) * st.head;
  for (int d = f.num_batch_dims - 1; d >= 0; --d) {
    const int n = int(f.batch_dims[d]);
    off += int64_t(b % n) * st.batch[d];
    b /= n;
  }
  return off;
}

// MaskBlocks::For with BroadcastOffset32 (the producer's registers).
__host__ __device__ __forceinline__ MaskBlocks SliceMaskBlocks(const AttentionFeatures& f, int b, int h) {
  return {f.mask_blocks + BroadcastOffset32(f, f.mask_blocks_stride, b, h), f.mask_block_rows, f.mask_block_cols};
}

// Which of the four 128-key blocks nb, nb + dir, nb + 2 dir, nb + 3 dir
// (the first `count` of them) of a key-only mask row `keys` have a visible
// key, as bits 0-3; keys at or past seqlen_k count as hidden.
// Warp-collective: lane l reads bytes 16 (l % 8) .. + 15 of block l / 8,
// one 16-byte load where the row is 16-byte aligned and the bytes lie in
// the sequence, so that a probe of four blocks is one round trip (the
// lane-per-block scan before, 128 dependent byte loads per lane, cost a
// tile's producer tens of thousands of cycles: the key-padding forward at
// 0.73x of the key-lengths one at the same visible keys, v26).
__device__ __forceinline__ uint32_t VisibleKeyBlocks4(const uint8_t* keys, int seqlen_k, int nb, int dir,
                                                      int count) {
  const int lane = threadIdx.x % 32, g = lane / 8;
  const int j = (nb + dir * g) * 128 + 16 * (lane % 8);
  bool any = false;
  if (g < count) {
    if ((reinterpret_cast<uintptr_t>(keys) & 15u) == 0 && j + 15 < seqlen_k) {
      const uint4 w = *reinterpret_cast<const uint4*>(keys + j);
      any = (w.x | w.y | w.z | w.w) != 0;
    } else {
#pragma unroll 4
      for (int i = 0; i < 16; ++i) any |= j + i < seqlen_k && keys[j + i] != 0;
    }
  }
  const uint32_t votes = __ballot_sync(0xffffffffu, any);
  uint32_t blocks = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) blocks |= uint32_t(((votes >> (8 * k)) & 0xffu) != 0) << k;
  return blocks;
}

// Drops the 128-key blocks of [*lo, *hi) that a key-only mask row hides
// entirely, from both ends (sm80's TrimHiddenKeyBlocks rule), four blocks
// per probe (VisibleKeyBlocks4). Warp-collective.
__device__ __forceinline__ void TrimHiddenKeyBlocks128(const uint8_t* keys, int seqlen_k, int* lo, int* hi) {
  while (*hi > *lo) {
    const int count = min(4, *hi - *lo);
    const uint32_t visible = VisibleKeyBlocks4(keys, seqlen_k, *hi - 1, -1, count);
    if (visible == 0) {
      *hi -= count;
      continue;
    }
    *hi -= __ffs(visible) - 1;
    break;
  }
  while (*hi > *lo) {
    const int count = min(4, *hi - *lo);
    const uint32_t visible = VisibleKeyBlocks4(keys, seqlen_k, *lo, 1, count);
    if (visible == 0) {
      *lo += count;
      continue;
    }
    *lo += __ffs(visible) - 1;
    break;
  }
}

// kMaskArray (kMasksBoolean, and the variants that take a key-only mask
// beside their features): a key-only boolean mask ([B|1, N|1, 1, S], key
// padding) also drops the key blocks it hides entirely from both ends
// (TrimHiddenKeyBlocks128), so that padding costs no copies and no
// products; that needs the head h (the mask may differ per head).
// kDenseMask (kMasksBoolean): a per-query mask's block summary trims them
// too.
template <int kBlockM, int kBlockN, bool kMaskArray = false, bool kDenseMask = false>
__device__ __forceinline__ KeyBlocks FeatureKeyBlocks(const AttentionParams& p, int m0, int b, int h = 0) {
  const MaskPolicy policy = MaskPolicy::ForWithoutMaskArray(p, b);
  int64_t lo, hi;
  policy.KeyRange(m0, int64_t(m0) + kBlockM, &lo, &hi);
  if (hi <= lo) return {0, 0};
  // 0 <= lo < hi <= seqlen_k < 2^31 - kBlockN here: the block indices in
  // int32 (64-bit divisions cost the producer's 24 registers spills).
  KeyBlocks kb{int(lo) / kBlockN, (int(hi) + kBlockN - 1) / kBlockN};
  // Packed documents: only the key blocks of this tile's documents
  // (TrimSegmentBlocks' rule, on SummarySpan).
  if (policy.HasSegmentRanges()) {
    const IdSpan rows = SummarySpan<kBlockM>(policy.q_ranges, m0);
    TrimEmptyBlocks(&kb.lo, &kb.hi, [&](int nb) {
      return Meet(rows, SummarySpan<kBlockN>(policy.kv_ranges, nb * kBlockN)) == SegmentMeet::kNone;
    });
  }
  if constexpr (kMaskArray) {
    // In int32 and with the keys contiguous (UnsupportedFeatures): 64-bit
    // indices spilled the producer's 40 registers.
    static_assert(kBlockN == 128 || kBlockN == 64, "VisibleKeyBlocks4: 128-key blocks, or pairs of 64");
    const AttentionFeatures& f = p.features;
    if (f.mask && f.mask_stride.row == 0 && kb.hi > kb.lo) {
      const uint8_t* keys = f.mask + BroadcastOffset32(f, f.mask_stride, b, h);
      if constexpr (kBlockN == 128) {
        TrimHiddenKeyBlocks128(keys, int(policy.seqlen_k), &kb.lo, &kb.hi);
      } else {
        // 64-key blocks (the 256 forward's): trimmed by the 128-key blocks
        // that hold them, whose hidden ones hide both halves.
        int lo = kb.lo / 2, hi = (kb.hi + 1) / 2;
        TrimHiddenKeyBlocks128(keys, int(policy.seqlen_k), &lo, &hi);
        kb.lo = max(kb.lo, 2 * lo);
        kb.hi = max(kb.lo, min(kb.hi, 2 * hi));
      }
    }
    // A per-query mask with its block summary: the key blocks it hides for
    // all of the tile's rows, from both ends (a prefix-LM or document mask's
    // blocks past its visible span; hidden blocks between visible ones are
    // still visited, masked whole by the consumers' summary reads).
    if (kDenseMask && f.mask_blocks && kb.hi > kb.lo) {
      const MaskBlocks blocks = SliceMaskBlocks(f, b, h);
      TrimEmptyBlocks(&kb.lo, &kb.hi, [&](int nb) {
        return !(blocks.SpanOf<kBlockM, kBlockN, true>(m0, nb * kBlockN) & kMaskBlockSome);
      });
    }
  }
  return kb;
}

// A boolean mask the same for every query ([B|1, N|1, 1, S]: key padding):
// one byte per key, which the backward's feature variants read per S^T row
// (FeatureStepMask).
inline bool IsKeyOnlyMask(const AttentionFeatures& f) { return f.mask && f.mask_stride.row == 0; }

// The bias's stride between flat batch entries (the kernels' b) where one
// stride serves them all: 0 where it is broadcast over every batch dim, s
// where its batch dims' strides are those of a row-major [batch...] of
// stride s (size-1 dims aside, their strides never multiply); -1 otherwise.
// (A TMA map has one batch dimension: BiasTilesServe.)
__host__ __device__ __forceinline__ int64_t BiasFlatBatchStride(const AttentionFeatures& f) {
  int64_t stride = 0, next = 0;  // next: the stride the next outer dim must have
  bool first = true;
  for (int d = f.num_batch_dims - 1; d >= 0; --d) {
    const int64_t size = f.batch_dims[d], s = f.bias_stride.batch[d];
    if (size == 1) continue;
    if (s < 0 || (!first && s != next)) return -1;
    if (first) stride = s, first = false;
    next = s * size;
  }
  return stride;
}

// Whether the forward's kMasksBiasTiles (bias_tiles.cuh) can read p's bias:
// a 16-bit one (the inputs' type: DecodeFeatures admits no other) with one
// row per query (row stride not 0: TMA's box cannot repeat a row), keys
// contiguous, one flat batch stride (BiasFlatBatchStride), and the base and
// the row, head and batch strides in whole 16 bytes (TMA's rules; a
// broadcast dimension's stride is 0, and the map gives it size 1).
inline bool BiasTilesServe(const AttentionParams& p) {
  const AttentionFeatures& f = p.features;
  if (!f.bias || f.bias_type == BiasType::kAccum || f.bias_stride.col != 1 || f.bias_stride.row == 0) return false;
  if (reinterpret_cast<uintptr_t>(f.bias) % 16 != 0) return false;
  const int64_t batch = BiasFlatBatchStride(f);
  auto aligned = [](int64_t stride) { return stride >= 0 && stride % 8 == 0 && stride < (int64_t(1) << 39); };
  return aligned(f.bias_stride.row) && aligned(f.bias_stride.head) && aligned(batch);
}

// Why a feature variant cannot serve p (empty: it can), forward and
// backward alike. The soft cap needs kMasksSoftcap, a bias kMasksBias(16), a
// boolean mask kMasksBoolean (forward), dropout kMasksDropout; the pairs
// among them that no variant takes stay on the sm80 kernels. `beside`: a
// boolean mask the variant reads beside its own features: kKeyOnly (the
// forward's kMasksDropout, TakesKeyMaskBeside) a key-only one
// (IsKeyOnlyMask), kAny (the backward's kMasks, kMasksSoftcap and
// kMasksDropout, FeatureStepMask) any, kAnyForward (the forward's
// kMasksSoftcap, ReadsMaskArray) any.
enum class MaskBeside { kNone, kKeyOnly, kAny, kAnyForward };

inline std::string UnsupportedFeatures(const AttentionParams& p, Features variant,
                                       MaskBeside beside = MaskBeside::kNone) {
  // (kMasksSoftcap's backward at head dim 64 reads key-only masks only: ReadsDenseStepMask.)
  if (beside == MaskBeside::kAny && variant == Features::kMasksSoftcap && p.shape.head_dim <= 64)
    beside = MaskBeside::kKeyOnly;
  if (beside == MaskBeside::kAnyForward) beside = MaskBeside::kAny;
  if ((beside == MaskBeside::kKeyOnly && IsKeyOnlyMask(p.features)) || (beside == MaskBeside::kAny && p.features.mask)) {
    AttentionParams without = p;
    without.features.mask = nullptr;
    return UnsupportedFeatures(without, variant);
  }
  const AttentionFeatures& f = p.features;
  if (variant == Features::kNone) return f.Any() ? "attention features need a feature variant" : "";
  if (variant == Features::kPlainSoftcap || variant == Features::kPlainDropout) {
    if (!f.OnlyTransforms())
      return "the plain kernel's transforms take no lengths, segment ids, window, position offsets, bias or mask";
    if (variant == Features::kPlainSoftcap && !(f.softcap > 0.0 && !(f.dropout_rate > 0.0)))
      return "the kPlainSoftcap variant needs the soft cap without dropout";
    if (variant == Features::kPlainDropout && !(f.dropout_rate > 0.0 && f.dropout_seed && !(f.softcap > 0.0)))
      return "the kPlainDropout variant needs dropout (a rate and a seed) without the soft cap";
    return {};
  }
  if (variant == Features::kMasksDropout) {
    if (!(f.dropout_rate > 0.0) || !f.dropout_seed) return "the kMasksDropout variant needs dropout (a rate and a seed)";
    if (f.bias || f.mask || f.softcap > 0.0)
      return "dropout with a bias, a boolean mask or the soft cap is not supported (the sm80 kernels serve it)";
    return {};
  }
  if (AddsBias(variant)) {
    // The bias is loaded into S's accumulators before S = Q K^T adds the
    // products to it (BiasRows): there is no raw q.k left for a soft cap to
    // apply to before the bias, so that pair stays on the sm80 forward.
    if (f.mask || f.dropout_rate > 0.0)
      return "a boolean mask and dropout are not supported (the sm80 kernels serve them)";
    if (!f.bias) return "the kMasksBias variant needs a bias";
    // kMasksBias reads float32 (BiasRows<float>); kMasksBias16 the inputs'
    // 16-bit type (DecodeFeatures admits no other 16-bit bias).
    if (variant == Features::kMasksBias && f.bias_type != BiasType::kAccum)
      return "the kMasksBias variant reads a float32 bias";
    if (ReadsBias16(variant) && f.bias_type == BiasType::kAccum)
      return "the kMasksBias16 and kMasksBiasTiles variants read a bias of the inputs' 16-bit dtype";
    if (f.softcap > 0.0) return "a bias with the soft cap is not supported (the sm80 forward serves it)";
    if (f.bias_stride.col != 1)  // BiasRows::Load's immediate offsets
      return "the bias must be contiguous along the keys (one broadcast along them stays on the sm80 forward)";
    // (No parity or alignment requirement: a 16-bit bias with seqlen_k odd or
    // a base not 4-byte aligned takes BiasRows's element loads.)
    if (variant == Features::kMasksBiasTiles && !BiasTilesServe(p))
      return "the kMasksBiasTiles variant needs a bias with one row per query and its base and strides in whole "
             "16 bytes (kMasksBias16 serves the others)";
    return {};
  }
  if (variant == Features::kMasksBoolean) {
    if (!f.mask) return "the kMasksBoolean variant needs a boolean mask";
    if (f.bias || f.dropout_rate > 0.0 || f.softcap > 0.0)
      return "a boolean mask with a bias, dropout or the soft cap is not supported (the sm80 forward serves it)";
    if (f.mask_stride.col != 1)  // MaskArrayRows' column offsets
      return "the boolean mask must be contiguous along the keys (one broadcast along them stays on the sm80 forward)";
    return {};
  }
  if (f.bias || f.mask || f.dropout_rate > 0.0)
    return "a bias, a boolean mask and dropout are not supported (the sm80 kernels serve them)";
  if (f.softcap > 0.0 && !AppliesSoftcap(variant)) return "the soft cap needs the kMasksSoftcap or kSoftcap variant";
  if (variant == Features::kSoftcap && !(f.softcap > 0.0)) return "the kSoftcap variant needs the soft cap";
  return {};
}

// The additive bias of the kMasksBias variant, per consumer thread and tile:
// logit = scale * q.k + bias (sm80's LogitFeatures::Apply without the soft
// cap), which in the raw units of S that the softmax scales by scale *
// log2(e) (softmax.cuh) is q.k + bias / scale. So each block's values,
// times 1 / scale, are loaded into S's accumulators before its S = Q K^T is
// issued, and the wgmma adds the products to them from its first k-step
// (scale-d 1): the add costs the tensor cores nothing, the softmax stays the
// plain one, and no register is held for the bias beyond S's own (a block
// prefetched a block ahead would take 64 more per thread in float32, 32 in
// 16 bits, of the 232 whose highest is already R200 at 128; and staging the
// bias with TMA needs 64 KiB of shared memory per float32 128 x 128 stage,
// two stages for overlap, beside the forward's 193 KiB at 128). The loads
// are issued where S's registers come free (after the previous block's P is
// packed, before the ping-pong turn), so their latency runs under the other
// warpgroup's products. Hidden pairs are set to -inf by the masks after the
// product, as without a bias (a -inf bias element hides its pair too).
// Rows are clamped into the sequence for the reads, keys past it are not
// read (those pairs are hidden); a bias broadcast over batch, heads or
// queries has stride 0 there (BroadcastStrides). The bias is float32 (the
// accumulation type: AttentionFeatures, attention.py casts it); BiasT = a
// 16-bit type reads a 16-bit bias (kMasksBias16) at half the bytes.
//
// 16-bit: each thread's pair of adjacent columns 8j + 2t, 8j + 2t + 1 is one
// 32-bit word, loaded whole (32 loads per block instead of 64) where that
// is aligned: seqlen_k even (the row, head and batch strides, whole rows,
// are then even) and both row pointers 4-byte aligned, which `pairs` says
// per thread (uniform in practice; else the element loads below). The tail
// predicate is per pair then (limit is even). In both paths the select
// against a hidden key is on the raw bits (0: +0.0 in bf16 and f16), so the
// predicated load writes a register preset to 0 and the conversion (bf16:
// a shift and an AND; f16: HADD2.F32) is unpredicated and can wait for
// the multiply after the ping-pong turn, as float32's does. The first
// version selected on the converted float (cond ? float(x) : 0): ptxas then
// converted each element under its load's predicate right after the load
// (predicates are few), so every few loads the warp waited a memory round
// trip before issuing the next ones, before the turn, with 64 LDG.E.U16.
template <typename BiasT = float>
struct BiasRows {
  const BiasT* row[2];  // this thread's rows row and row + 8, from key 0
  int seqlen_k;
  bool pairs;  // 16-bit: column pairs as one aligned 32-bit word (Load)

  __device__ __forceinline__ static BiasRows For(const AttentionParams& p, int b, int h, int row) {
    const AttentionFeatures& f = p.features;
    const BiasT* base = static_cast<const BiasT*>(f.bias) + f.BroadcastOffset(f.bias_stride, b, h);
    const int q_last = int(p.shape.seqlen_q) - 1;
    BiasRows r;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) r.row[hh] = base + int64_t(min(row + 8 * hh, q_last)) * f.bias_stride.row;
    r.seqlen_k = int(p.shape.seqlen_k);
    r.pairs = false;
    if constexpr (sizeof(BiasT) == 2)
      r.pairs = (r.seqlen_k & 1) == 0 &&
                ((reinterpret_cast<uintptr_t>(r.row[0]) | reinterpret_cast<uintptr_t>(r.row[1])) & 3u) == 0;
    return r;
  }

  // Key block [n0, n0 + kBlockN)'s values of this thread's pairs (column 8j
  // + 2t + e of row hh at s[4j + 2hh + e], softmax.cuh's layout) times
  // `unscale` (1 / scale), into s: the accumulators its S = Q K^T adds to.
  // Keys contiguous (UnsupportedFeatures refuses a bias broadcast along
  // them): one address per row and block, the loads at immediate offsets
  // from it, each predicated on its key lying below seqlen_k (the tail
  // block's others read nothing, and the masks hide them).
  template <int kBlockN>
  __device__ __forceinline__ void Load(float (&s)[kBlockN / 2], int n0, int t, float unscale) const {
    const int limit = seqlen_k - n0 - 2 * t;  // columns 8j + e below it are keys
    if constexpr (sizeof(BiasT) == 4) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const BiasT* r = row[hh] + (n0 + 2 * t);
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            // (Selected before the multiply: a select of the product had ptxas
            // reload `unscale` from the constant bank per element.)
            const float x = 8 * j + e < limit ? r[8 * j + e] : 0.0f;
            s[4 * j + 2 * hh + e] = x * unscale;
          }
      }
    } else if (pairs) {
      uint32_t w[2][kBlockN / 8];  // (limit even: 8j < limit covers 8j + 1)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const uint32_t* r = reinterpret_cast<const uint32_t*>(row[hh] + (n0 + 2 * t));
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) w[hh][j] = 8 * j < limit ? r[4 * j] : 0u;
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) {
          const float2 x = PairToFloat2(w[hh][j]);
          s[4 * j + 2 * hh] = x.x * unscale;
          s[4 * j + 2 * hh + 1] = x.y * unscale;
        }
    } else {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const uint16_t* r = reinterpret_cast<const uint16_t*>(row[hh] + (n0 + 2 * t));
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const uint32_t x = 8 * j + e < limit ? uint32_t(r[8 * j + e]) : 0u;
            s[4 * j + 2 * hh + e] = BitsToFloat(x) * unscale;
          }
      }
    }
  }

 private:
  // A 16-bit element's bits (low half of x) / an aligned pair's word (the
  // lower address's element in the low half) as float.
  __device__ __forceinline__ static float BitsToFloat(uint32_t x) {
    if constexpr (std::is_same_v<BiasT, __nv_bfloat16>) return __uint_as_float(x << 16);
    else return __half2float(__ushort_as_half(static_cast<unsigned short>(x)));
  }
  __device__ __forceinline__ static float2 PairToFloat2(uint32_t x) {
    if constexpr (std::is_same_v<BiasT, __nv_bfloat16>) {
      return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
    } else {
      __half2 h;
      static_assert(sizeof(h) == sizeof(x));
      __builtin_memcpy(&h, &x, sizeof(x));
      return __half22float2(h);
    }
  }
};

// The additive bias of the sm90 backward's kMasksBias(16) variants
// (bwd_kernel.cuh), per consumer thread: the forward's BiasRows from the key
// side. The backward recomputes P from S^T = K Q^T, whose rows are keys, so
// the logits must be the forward's to the bit for P to match its lse: the
// same values bias * (1 / scale) (`unscale`, the same float as the
// forward's) in S^T's accumulators before the product, which then adds
// q.k from its first k-step (scale-d 1), as BiasRows + the forward's issue.
//
// This thread's pairs are keys `key`, `key` + 8 (rows hh) x queries m0 + 8j
// + 2t + e (columns), s[4j + 2hh + e] (softmax.cuh's layout, transposed).
// The bias is [query][key] with the keys contiguous, so the thread's two
// keys of one query are 8 elements apart and its two columns of a pair are
// two bias rows: no element pair of one word belongs to one thread (the
// forward's 32-bit pair trick does not apply). Each element is one load;
// a warp's load of one (j, e, hh) reads 4 rows (t) x 8 consecutive keys
// (g), 16 bytes of 16-bit bias per row, and the load of the other hh the
// other half of the same 32-byte sectors (L1 serves it).
//
// The loads go to `raw` (the element's bits, zero-extended to 32; float32:
// its bits) a step ahead, while the previous step's products run; ToLogits
// turns them into S^T's initial accumulators just before the step's S^T is
// issued, so that only raw's words (kBlockM / 2, as the forward's
// one-block prefetch would cost) stay live across the step's end, not
// floats beside S^T's. Keys past seqlen_k are not read (0: those pairs are
// hidden by FeatureStepMask anyway); queries past seqlen_q read the last
// row (their P is 0 by lse2 = +inf, StageRowStats), so every read lies in
// the bias. A bias broadcast over batch, heads or queries has stride 0
// there (BroadcastStrides); the batch part of the offset is taken once per
// tile (For), the head's per step (the steps run over the key head's group).
// Host-callable for tests/cpp/sm90_feature_mask_test.cu.
template <typename BiasT = float>
struct BiasColumns {
  const BiasT* keys;  // bias (b, head 0, query 0), key `key`
  bool key_in[2];     // key + 8 hh < seqlen_k

  __host__ __device__ __forceinline__ static BiasColumns For(const AttentionParams& p, int b, int key) {
    const AttentionFeatures& f = p.features;
    BiasColumns c;
    c.keys = static_cast<const BiasT*>(f.bias) + f.BroadcastOffset(f.bias_stride, b, 0) + key;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) c.key_in[hh] = key + 8 * hh < p.shape.seqlen_k;
    return c;
  }

  // Step (h, m0)'s values of this thread's pairs into raw (selected on the
  // raw bits, as BiasRows: the predicated loads write registers preset to
  // 0 and the conversion in ToLogits is unpredicated). The row and head
  // strides are read from `p` (the kernel's constant bank) at each use.
  // The thread's first row (query q0 = m0 + 2t, clamped) is one 64-bit
  // pointer per step, opaque so that ptxas does not fold it back into
  // every element's address; each (j, e)'s row is then 8j + e rows on,
  // clamped to the last (rows >= 0 from there), at a 32-bit offset (the
  // launch checks that (seqlen_q - 1) * row stride fits: BiasRowsFit): a
  // min, a multiply and one wide multiply-add per (j, e), and the second
  // key's load at an immediate offset from the first's. (With 64-bit
  // element offsets ptxas spent ~10 instructions per (j, e) and held all
  // 16 addresses at once.)
  template <int kBlockM>
  __host__ __device__ __forceinline__ void Load(uint32_t (&raw)[kBlockM / 2], const AttentionParams& p, int h,
                                                int m0, int t) const {
    const AttentionFeatures& f = p.features;
    const uint32_t row_stride = uint32_t(f.bias_stride.row);
    const int q_last = int(p.shape.seqlen_q) - 1, q0 = std::min(m0 + 2 * t, q_last), rows_left = q_last - q0;
    const BiasT* first = keys + int64_t(h) * f.bias_stride.head + int64_t(q0) * f.bias_stride.row;
#ifdef __CUDA_ARCH__
    asm volatile("" : "+l"(first));
#endif
#pragma unroll
    for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const BiasT* row = first + uint32_t(std::min(8 * j + e, rows_left)) * row_stride;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          uint32_t x = 0;
          if constexpr (sizeof(BiasT) == 4) {
            if (key_in[hh]) x = LoadGlobal(reinterpret_cast<const unsigned int*>(row) + 8 * hh);
          } else {
            if (key_in[hh]) x = LoadGlobal(reinterpret_cast<const unsigned short*>(row) + 8 * hh);
          }
          raw[4 * j + 2 * hh + e] = x;
        }
      }
  }

  // *ptr through the read-only global path (ld.global.nc): the opaque
  // pointer above is generic to the compiler, which then issued generic
  // loads (LD); the bias is never written during the kernel.
  template <typename T>
  __host__ __device__ __forceinline__ static T LoadGlobal(const T* ptr) {
#ifdef __CUDA_ARCH__
    return __ldg(ptr);
#else
    return *ptr;
#endif
  }

  // raw's values times `unscale` (1 / scale) into s, S^T's accumulators.
  template <int kBlockM>
  __host__ __device__ __forceinline__ static void ToLogits(float (&s)[kBlockM / 2],
                                                           const uint32_t (&raw)[kBlockM / 2], float unscale) {
#pragma unroll
    for (int k = 0; k < kBlockM / 2; ++k) s[k] = BitsToFloat(raw[k]) * unscale;
  }

  // An element's bits (a 16-bit one in the low half) as float.
  __host__ __device__ __forceinline__ static float BitsToFloat(uint32_t x) {
    if constexpr (std::is_same_v<BiasT, __nv_bfloat16>) x <<= 16;
    if constexpr (std::is_same_v<BiasT, __half>) return __half2float(__ushort_as_half(static_cast<unsigned short>(x)));
    float y;
    __builtin_memcpy(&y, &x, sizeof(y));
    return y;
  }
};

// Whether BiasColumns::Load's 32-bit row offsets reach every bias row of a
// (batch, head): (seqlen_q - 1) * row stride < 2^32 elements (a [T, S]
// slice of up to 4G elements; broadcast rows, stride 0, always).
inline bool BiasRowsFit(const AttentionParams& p) {
  const int64_t stride = p.features.bias_stride.row;
  return stride >= 0 && (p.shape.seqlen_q <= 1 || stride <= int64_t(UINT32_MAX) / (p.shape.seqlen_q - 1));
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

// Which of this thread's pairs of one key block are visible: its rows `row`
// and `row` + 8, columns 8j + 2t + e (softmax.cuh's layout) as bit 2j + e
// of visible[hh]. Computed before the block's S = Q K^T is issued, while
// S's registers are still free: a uint32 per row is all that stays live
// across it.
struct BlockMask {
  uint32_t visible[2];
  bool check;  // false: every pair of the warp's rows is visible
};

// Thread t's BlockMask bits (bit 2j + e: fragment column 8j + 2t + e) of
// a key-only block from the warp's ballots of its key bytes: ballot i has
// bit l where key kBytes l + i is visible (MaskArrayRows::LoadKeys: kBytes
// = kBlockN / 32 bytes per lane). Host-callable for
// tests/cpp/sm90_feature_mask_test.cu.
//   128 keys: column c is key 4l + i with l = 2j + t / 2, i = 2 (t % 2) + e,
//     so shifting ballot i right by t / 2 puts column j's bit at 2j, and the
//     even bits of the e = 0 and e = 1 ballots interleave into bit 2j + e.
//   64 keys: column c is key 2l + i with l = 4j + t, i = e: bit 4j + t of
//     ballot e goes to bit 2j + e (shift right by t, then halve the bit
//     positions 4j to 2j: the classic compress of the even bits).
template <int kBlockN>
__host__ __device__ __forceinline__ uint32_t KeyBallotBits(const uint32_t (&w)[kBlockN / 32], int t) {
  if constexpr (kBlockN == 128) {
    const int shift = t >> 1;
    const uint32_t w0 = (t & 1) ? w[2] : w[0], w1 = (t & 1) ? w[3] : w[1];
    return ((w0 >> shift) & 0x55555555u) | ((w1 >> shift) & 0x55555555u) << 1;
  } else {
    static_assert(kBlockN == 64, "4 or 2 key bytes per lane");
    auto halve = [](uint32_t x) {  // bits 4j (j < 8) to 2j
      x &= 0x11111111u;
      x = (x | (x >> 1)) & 0x33333333u;
      x = (x | (x >> 2)) & 0x0f0f0f0fu;
      x = (x | (x >> 4)) & 0x00ff00ffu;
      return (x | (x >> 8)) & 0x0000ffffu;
    };
    return halve(w[0] >> t) | halve(w[1] >> t) << 1;
  }
}

// The boolean mask array of the kMasksBoolean variant (True = visible, as
// jax.nn.dot_product_attention), per consumer thread and tile, ANDed into
// the BlockMask of the structural bounds and segment ids (FeatureRows) in
// prepare(), before the block's S = Q K^T is issued: like those masks it
// leaves one uint32 per row live across the product, and its reads run
// while S's registers are free. Two cases, told apart once per tile:
//   - key-only (query stride 0: [B|1, N|1, 1, S] key padding): the
//     producer already dropped the key blocks it hides at both ends
//     (FeatureKeyBlocks); per block the warp reads the 128 key bytes once,
//     4 per lane (keys 4 lane + k, loaded a block ahead: KeyBytes), and
//     four ballots give every lane its fragment columns' bits (Apply); a
//     block whose keys are all visible sets no bit and keeps the
//     structural answer (check stays false where that needs none). This
//     is sm80's KeyMaskReader vote;
//   - any other (per-query rows: [.., T, S]): each thread reads its two
//     rows' bytes of its fragment columns 8j + 2t + e, the two adjacent
//     columns e = 0, 1 in one 16-bit load where the rows' addresses are
//     even (pairs), else bytes: the 32 (64) loads of a block that the
//     mask's block summary (MaskBlockEntries, when the call has one) does
//     not show or hide whole, and not for rows the bounds hide whole.
// Rows are clamped into the sequence for the reads and keys at or past
// seqlen_k are not read (the bounds hide those pairs). Fully hidden rows end
// with row_sum 0: out 0 and lse -inf (OnlineSoftmax::Lse, the epilogue), as
// sm80 and the CPU give.
struct MaskArrayRows {
  const uint8_t* row[2];  // this thread's rows `row`, `row` + 8, from key 0
  const uint8_t* keys;    // key-only: the (b, h) slice's one row (else null)
  int seqlen_k;
  bool pairs;  // every row address even: 16-bit loads of column pairs

  // A key-only block's bytes, keys n0 + kBytes lane + k in byte k (kBytes =
  // kBlockN / 32: 4 at 128, 2 at 64; 1 past seqlen_k: such keys are hidden
  // by the bounds and must not make a block look mixed). One register in
  // flight a block ahead (four bytes in four made kMasksDropout's
  // consumers spill at 128).
  struct KeyBytes {
    uint32_t word;
  };

  __device__ __forceinline__ static MaskArrayRows For(const AttentionParams& p, int b, int h, int row) {
    const AttentionFeatures& f = p.features;
    const uint8_t* base = f.mask + f.BroadcastOffset(f.mask_stride, b, h);
    const int q_last = int(p.shape.seqlen_q) - 1;
    MaskArrayRows r;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) r.row[hh] = base + int64_t(min(row + 8 * hh, q_last)) * f.mask_stride.row;
    r.keys = f.mask_stride.row == 0 ? base : nullptr;
    r.seqlen_k = int(p.shape.seqlen_k);
    r.pairs = ((reinterpret_cast<uintptr_t>(base) | uintptr_t(f.mask_stride.row)) & 1u) == 0;
    return r;
  }

  // The key bytes of block [n0, n0 + kBlockN) from a key-only row `keys`
  // (one 32-bit load, 16-bit at 64, where the lane's bytes are in the
  // sequence and aligned, as for a row of S % 4 == 0 keys).
  template <int kBlockN>
  __device__ __forceinline__ static KeyBytes LoadKeys(const uint8_t* keys, int seqlen_k, int n0, int lane) {
    static_assert(kBlockN == 128 || kBlockN == 64, "4 or 2 key bytes per lane");
    constexpr int kBytes = kBlockN / 32;
    const int j = n0 + kBytes * lane;
    if (((reinterpret_cast<uintptr_t>(keys) & (kBytes - 1u)) == 0) && j + kBytes - 1 < seqlen_k) {
      if constexpr (kBytes == 4) return {*reinterpret_cast<const uint32_t*>(keys + j)};
      else return {*reinterpret_cast<const uint16_t*>(keys + j)};
    }
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < kBytes; ++i) word |= uint32_t(j + i < seqlen_k ? keys[j + i] : uint8_t(1)) << (8 * i);
    return {word};
  }
  template <int kBlockN>
  __device__ __forceinline__ KeyBytes LoadKeys(int n0, int lane) const {
    return LoadKeys<kBlockN>(keys, seqlen_k, n0, lane);
  }

  // Key-only: the warp's ballots of the block's bytes (KeyBallotBits),
  // applied to both of the thread's rows.
  template <int kBlockN>
  __device__ __forceinline__ static void ApplyKeys(BlockMask& m, const KeyBytes& k, int t) {
    constexpr int kBytes = kBlockN / 32;
    uint32_t w[kBytes];
#pragma unroll
    for (int i = 0; i < kBytes; ++i) w[i] = __ballot_sync(0xffffffffu, ((k.word >> (8 * i)) & 0xffu) != 0);
    uint32_t all = w[0];
#pragma unroll
    for (int i = 1; i < kBytes; ++i) all &= w[i];
    if (all == 0xffffffffu) return;  // all visible
    const uint32_t bits = KeyBallotBits<kBlockN>(w, t);
    m.visible[0] &= bits;
    m.visible[1] &= bits;
    m.check = true;
  }

  // Per-query rows: this thread's bytes of key block [n0, n0 + kBlockN).
  // A block inside the keys loads all of its pairs (16-bit, the common
  // case; bytes, a row at a time, for odd row addresses) before it uses
  // any: with a bounds check per load, ptxas issued them two at a time,
  // each waiting for the previous one's use (16 L2 round trips per row
  // with pairs, 32 with bytes: a mixed block cost ~3x a plain one, v27).
  template <int kBlockN>
  __device__ __forceinline__ void ApplyRows(BlockMask& m, int n0, int t) const {
    const int limit = seqlen_k - n0 - 2 * t;  // columns 8j + e below it are keys
    if (pairs && n0 + kBlockN <= seqlen_k) {
      // Both rows' loads first (the rows are clamped into the sequence, so
      // a row the bounds hide is read harmlessly): one round trip a block.
      uint32_t x[2][kBlockN / 8];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
          x[hh][j] = *reinterpret_cast<const uint16_t*>(row[hh] + (n0 + 2 * t + 8 * j));
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        uint32_t bits = 0;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
          bits |= uint32_t((x[hh][j] & 0xffu) != 0) << (2 * j) | uint32_t((x[hh][j] >> 8) != 0) << (2 * j + 1);
        m.visible[hh] &= bits;
      }
      m.check = true;
      return;
    }
    if (n0 + kBlockN <= seqlen_k) {
      // Odd row addresses: bytes, a row's 2 kBlockN / 8 at once (both rows'
      // would hold 64 registers).
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        uint32_t x[kBlockN / 8][2];
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) x[j][e] = row[hh][n0 + 2 * t + 8 * j + e];
        uint32_t bits = 0;
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) bits |= uint32_t(x[j][e] != 0) << (2 * j + e);
        m.visible[hh] &= bits;
      }
      m.check = true;
      return;
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if (m.visible[hh] == 0) continue;  // the bounds hide the row's columns
      const uint8_t* r = row[hh] + (n0 + 2 * t);
      uint32_t bits = 0;
      if (pairs) {
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) {
          uint32_t x = 0;
          if (8 * j + 1 < limit) {
            x = *reinterpret_cast<const uint16_t*>(r + 8 * j);
          } else if (8 * j < limit) {
            x = r[8 * j];
          }
          bits |= uint32_t((x & 0xffu) != 0) << (2 * j) | uint32_t((x >> 8) != 0) << (2 * j + 1);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (8 * j + e < limit) bits |= uint32_t(r[8 * j + e] != 0) << (2 * j + e);
      }
      m.visible[hh] &= bits;
    }
    m.check = true;
  }
};

// kMasksBoolean's per-query mask with its block summary, in the consumer: the
// two entries of one key block (128 keys) for the warpgroup's 64 rows (one
// summary row: the warpgroup's first row is a multiple of 64), loaded a
// block ahead and joined where used (Bits: MaskBlocks::Span's answer).
// Without a summary both say kMaskBlockSome: every block reads its bytes.
struct MaskBlockEntries {
  uint32_t first = kMaskBlockSome, second = kMaskBlockSome;

  __device__ __forceinline__ uint32_t Bits() const {
    return ((first | second) & kMaskBlockSome) | (first & second & kMaskBlockAll);
  }
  // `row`: the summary row's entries (null: no summary), `cols` its length.
  template <int kBlockN>
  __device__ __forceinline__ static MaskBlockEntries Load(const uint8_t* row, int cols, int n0) {
    static_assert(kBlockN == 2 * kMaskBlock || kBlockN == kMaskBlock, "two entries per key block, or one");
    if (!row) return {};
    const int c = n0 / int(kMaskBlock);
    if constexpr (kBlockN == kMaskBlock) {
      const uint32_t e = row[c];
      return {e, e};
    } else {
      return {row[c], row[min(c + 1, cols - 1)]};
    }
  }
};

// The summary entries of key block [n0, n0 + kBlockN) (zeros without
// summaries: then unused). The consumer loads them one block ahead
// (FeatureRows::Block takes them), so that the loads are not waited for
// before the block's S is issued.
template <int kBlockN>
__host__ __device__ __forceinline__ SummaryEntries KeyBlockSummaries(const AttentionParams& p, int b, int n0) {
  const MaskPolicy policy = MaskPolicy::ForWithoutMaskArray(p, b);
  return policy.HasSegmentRanges() ? LoadSummaryEntries<kBlockN>(policy.kv_ranges, n0) : SummaryEntries{};
}

// Bit 2j + e (j < kTiles, e < 2) set where column 8j + e lies in [lo, hi),
// for lo and hi in [-1, 8 kTiles]: VisibleBits' per-column compares as
// masks, a handful of integer operations instead of 4 kTiles compares. For
// each e, the columns 8j + e in range are j in [ceil((lo - e) / 8),
// ceil((hi - e) / 8)) (numerators >= 5 - 8 + 7 > 0: plain shifts), bits
// 2j + e of the pattern 0x55555555 << e.
template <int kTiles>
__host__ __device__ __forceinline__ uint32_t ColumnRangeBits(int lo, int hi) {
  static_assert(2 * kTiles <= 32);
  auto below = [](int n) { return n >= 32 ? ~0u : (1u << n) - 1u; };  // bits [0, n), n in [0, 32]
  uint32_t bits = 0;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int j0 = (lo - e + 7) >> 3, j1 = (hi - e + 7) >> 3;
    bits |= (0x55555555u << e) & below(2 * j1) & ~below(2 * j0);
  }
  return bits & below(2 * kTiles);
}

// What one consumer thread's masks need of the policy for a whole tile, in
// int32, computed once per tile (FeatureRows::For): rebuilding the policy
// per key block (its loads of lengths and offsets, its 64-bit bounds) sat
// in front of every block's S = Q K^T. The thread's rows are `row` and
// `row` + 8 of the warp's 16 from `warp_i0`; on the device the whole warp
// calls For with one warp_i0 and row = warp_i0 + lane / 4 (the warp's
// bounds come from lanes 0 and 31 by shuffles), on the host any row.
struct FeatureRows {
  // Structural bounds (lengths, causal, window, offsets): row hh sees keys
  // [lo[hh], hi[hh]) (MaskPolicy::KeyRange of one query), clamped to
  // [0, 2^31 - 1]; the compared columns lie in [0, 2^31 - 1), so the clamps
  // change no answer. Every row of the warp sees all keys of
  // [full_lo, full_hi) (the warp's last row's lo, the smaller hi of its
  // first and last rows: lo grows with the row, hi too up to the length,
  // past which it is 0), so a block inside it passes NeedsBoundsCheck.
  int lo[2], hi[2];
  int full_lo, full_hi;
  IdSpan warp_ids;  // SummarySpan of the warp's rows (with summaries)
  int32_t row_ids[2];  // the rows' segment ids (clamped into seqlen_q; with ids)

  template <int kBlockN>
  __host__ __device__ __forceinline__ static FeatureRows For(const AttentionParams& p, int b, int warp_i0, int row) {
    const MaskPolicy policy = MaskPolicy::ForWithoutMaskArray(p, b);
    auto clamp = [](int64_t x) { return int(x < 0 ? 0 : x > INT32_MAX ? INT32_MAX : x); };
    FeatureRows r{};
    int64_t lo, hi;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      policy.KeyRange(row + 8 * hh, int64_t(row) + 8 * hh + 1, &lo, &hi);
      r.lo[hh] = clamp(lo), r.hi[hh] = clamp(hi);
    }
#ifdef __CUDA_ARCH__
    // The warp's first and last rows are lane 0's first and lane 31's
    // second (row = warp_i0 + lane / 4): their bounds by shuffles, not two
    // more 64-bit KeyRange calls per thread (the whole warp calls For with
    // one warp_i0).
    const int first_hi = __shfl_sync(0xffffffffu, r.hi[0], 0);
    const int last_lo = __shfl_sync(0xffffffffu, r.lo[1], 31), last_hi = __shfl_sync(0xffffffffu, r.hi[1], 31);
    r.full_lo = last_lo, r.full_hi = std::min(first_hi, last_hi);
#else
    policy.KeyRange(warp_i0, int64_t(warp_i0) + 1, &lo, &hi);
    r.full_hi = clamp(hi);
    policy.KeyRange(int64_t(warp_i0) + 15, int64_t(warp_i0) + 16, &lo, &hi);
    r.full_lo = clamp(lo), r.full_hi = std::min(r.full_hi, clamp(hi));
#endif
    if (policy.HasSegmentRanges()) r.warp_ids = SummarySpan<16>(policy.q_ranges, warp_i0);
    if (policy.q_segments) {
      const int q_last = int(p.shape.seqlen_q) - 1;
      r.row_ids[0] = policy.q_segments[std::min(row, q_last)];
      r.row_ids[1] = policy.q_segments[std::min(row + 8, q_last)];
    }
    return r;
  }

  // MaskPolicy::Visible for the pairs of key block [n0, n0 + kBlockN) (the
  // structural bounds, then the segment ids), skipping the element work
  // where the warp's rows need none (NeedsBoundsCheck's answer from
  // full_lo / full_hi; MaskPolicy::Segments from warp_ids and `keys`, the
  // block's KeyBlockSummaries). `t`: the thread's column pair (lane % 4).
  template <int kBlockN>
  __host__ __device__ __forceinline__ BlockMask Block(const AttentionParams& p, int b, int n0, int t,
                                                      const SummaryEntries& keys) const {
    constexpr int kTiles = kBlockN / 8, kCols = 8 * kTiles;
    static_assert(2 * kTiles <= 32, "one bit per column of the thread's row");
    const AttentionFeatures& f = p.features;
    const bool segments = f.q_segment_ids && f.kv_segment_ids;
    const SegmentMeet meet = !segments                                        ? SegmentMeet::kAll
                             : !(f.q_segment_ranges && f.kv_segment_ranges) ? SegmentMeet::kSome
                                                                              : Meet(warp_ids, keys.Span());
    if (meet == SegmentMeet::kNone) return {{0u, 0u}, true};
    const bool ids = meet == SegmentMeet::kSome;
    if (!ids && n0 >= full_lo && n0 + kBlockN <= full_hi) return {{~0u, ~0u}, false};
    // VisibleBits' column test on the int32 bounds: column c0 + 8j + e is
    // visible to row hh when it lies in [lo[hh], hi[hh]) (ColumnRangeBits).
    const int c0 = n0 + 2 * t;
    auto relative = [&](int x) { return std::min(std::max(x - c0, -1), kCols); };
    BlockMask m{{ColumnRangeBits<kTiles>(relative(lo[0]), relative(hi[0])),
                 ColumnRangeBits<kTiles>(relative(lo[1]), relative(hi[1]))},
                true};
    if (ids) {
      // Reads clamped into the sequence (positions past it are hidden by
      // the bounds: a visited key block starts below seqlen_k).
      const int k_last = int(p.shape.seqlen_k) - 1 - n0;
      const int32_t* key_ids = f.kv_segment_ids + int64_t(b) * p.shape.seqlen_k + n0;
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int32_t id = key_ids[std::min(8 * j + 2 * t + e, k_last)];
          if (id != row_ids[0]) m.visible[0] &= ~(1u << (2 * j + e));
          if (id != row_ids[1]) m.visible[1] &= ~(1u << (2 * j + e));
        }
    }
    return m;
  }
};

// One block's mask from scratch (FeatureRows::For, then Block): what the
// consumer computes, in one call. Host-callable for
// tests/cpp/sm90_feature_mask_test.cu.
template <int kBlockN>
__host__ __device__ __forceinline__ BlockMask FeatureBlockMask(const AttentionParams& p, int b, int warp_i0, int row,
                                                               int t, int n0) {
  return FeatureRows::For<kBlockN>(p, b, warp_i0, row).template Block<kBlockN>(p, b, n0, t, KeyBlockSummaries<kBlockN>(p, b, n0));
}

// The softmax scale (log2 units) of logits ApplyFeatures soft-capped:
// scale_log2 times cap / scale, the factor it leaves out (cap > 0, so the
// row maxima commute with it as with the scale).
__host__ __device__ __forceinline__ float SoftcapSoftmaxScale(float scale_log2, SoftcapFactors cap) {
  return scale_log2 * cap.cap_over_scale;
}

// The soft cap's tanh of every element in place, tanh(x scale_over_cap),
// without its factor cap / scale (LogitFeatures::SoftcapRaw's tanh:
// TanhApprox for bfloat16, FastTanh for float16): the forward's softmax
// and the backward's P take that factor into their scale, and the
// backward's dS its derivative 1 - tanh^2.
template <typename Element, int N>
__device__ __forceinline__ void SoftcapTanh(float (&x)[N], float scale_over_cap) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const float y = x[k] * scale_over_cap;
    x[k] = std::is_same_v<Element, __nv_bfloat16> ? TanhApprox(y) : FastTanh(y);
  }
}

// The features on S = Q K^T of one key block (raw logits): soft-capped
// (kSoftcap), then -inf where `mask` hides the pair. The soft cap leaves
// tanh(s scale / cap) alone, without its factor cap / scale: the caller's
// softmax takes that factor into its scale (SoftcapSoftmaxScale), one
// multiply per logit fewer (the soft cap's forward was 3 instructions a
// logit beside the exponential: two multiplies and the tanh).
template <typename Element, int kBlockN, bool kSoftcap>
__device__ __forceinline__ void ApplyFeatures(float (&s)[kBlockN / 2], SoftcapFactors cap, const BlockMask& mask) {
  if constexpr (kSoftcap) SoftcapTanh<Element>(s, cap.scale_over_cap);
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
// A key-only boolean mask (the variants that read it per S^T row,
// FeatureStepMask) that hides all of the block's keys for every query head
// of the tile's group (`group` heads from h) leaves it no steps: its dK and
// dV are zeros, with no copies or products.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ KeyBlocks FeatureQueryBlocks(const AttentionParams& p, int n0, int h, int b,
                                                        int group = 1) {
  const MaskPolicy policy = MaskPolicy::For(p, b, h);
  int64_t lo, hi;
  policy.QueryRange(n0, int64_t(n0) + kBlockN, &lo, &hi);
  if (hi <= lo) return {0, 0};
  const AttentionFeatures& f = p.features;
  // (VisibleKeyBlocks4 reads 128-key blocks: the 256 kernel's 64-key tiles
  // keep their steps, whose bits then hide the keys.)
  if constexpr (kBlockN == 128) {
    if (f.mask && f.mask_stride.row == 0) {
      const int heads = f.mask_stride.head == 0 ? 1 : group;  // (a mask broadcast over heads: one row)
      const uint8_t* row = f.mask + BroadcastOffset32(f, f.mask_stride, b, h);
      bool any = false;
#pragma unroll 1
      for (int g = 0; g < heads && !any; ++g, row += f.mask_stride.head)
        any = VisibleKeyBlocks4(row, int(policy.seqlen_k), n0 / 128, 1, 1) != 0;
      if (!any) return {0, 0};
    }
  }
  KeyBlocks mb{int(lo / kBlockM), int((hi + kBlockM - 1) / kBlockM)};
  if (policy.HasSegmentRanges()) {
    const IdSpan keys = SummarySpan<kBlockN>(policy.kv_ranges, n0);
    TrimEmptyBlocks(&mb.lo, &mb.hi, [&](int m) {
      return Meet(SummarySpan<kBlockM>(policy.q_ranges, m * kBlockM), keys) == SegmentMeet::kNone;
    });
  }
  // A per-query mask's block summary: the query blocks it hides from these
  // keys for every query head of the group, from both ends.
  if (f.mask_blocks && mb.hi > mb.lo) {
    const int heads = f.mask_blocks_stride.head == 0 ? 1 : group;
    const MaskBlocks first = SliceMaskBlocks(f, b, h);
    TrimEmptyBlocks(&mb.lo, &mb.hi, [&](int m) {
      MaskBlocks blocks = first;
#pragma unroll 1
      for (int g = 0; g < heads; ++g, blocks.entries += f.mask_blocks_stride.head)
        if (blocks.SpanOf<kBlockM, kBlockN, true>(m * kBlockM, n0) & kMaskBlockSome) return false;
      return true;
    });
  }
  return mb;
}

// Which of this thread's pairs of one backward step are visible: S^T's rows
// `key` and `key` + 8 (keys; of the warp's 16 from warp_j0) against its
// columns, queries m0 + 8j + 2t + e (j < kBlockM / 8), as bit 2j + e, the
// second row's bits from bit kBlockM / 4 (16 in one word at 64 queries per
// step; 32 in a 64-bit word at 128, the Rows128 schedules: StepMaskBits).
// All ones where the warp's 16 keys x kBlockM
// queries need no element check (NeedsBoundsCheck and the segment
// summaries, as FeatureBlockMask), 0 where their ids never meet. Computed
// while the step's S^T runs, before dP^T is issued (bwd_kernel.cuh: under
// dP^T a branch made ptxas serialize every wgmma), and applied as selects.
// Host-callable for tests/cpp/sm90_feature_mask_test.cu.
template <int kBlockM>
using StepMaskBits = std::conditional_t<kBlockM == 64, uint32_t, uint64_t>;

// A per-query boolean mask's bits of one backward step, in FeatureStepMask's
// layout: the bytes of keys `key` and `key` + 8 (row stride `row`, column
// stride `col` from the (batch, head) slice `mask`) for queries m0 + 8j +
// 2t + e, positions clamped into the sequences (the bounds hide the pairs
// past them). The loads go in groups of four queries, each group's
// addresses made to depend on the bits so far, so that ptxas does not put
// all 2 kBlockM / 4 bytes in flight beside dK, dV and S^T.
template <int kBlockM>
__host__ __device__ __forceinline__ StepMaskBits<kBlockM> DenseStepMask(const AttentionParams& p, const uint8_t* mask,
                                                                        int64_t row, int64_t col, int m0, int key,
                                                                        int t) {
  using Bits = StepMaskBits<kBlockM>;
  constexpr int kTiles = kBlockM / 8, kRowBits = 2 * kTiles;
  const int k_last = int(p.shape.seqlen_k) - 1, q_last = int(p.shape.seqlen_q) - 1;
  const int64_t key0 = int64_t(std::min(key, k_last)) * col, key1 = int64_t(std::min(key + 8, k_last)) * col;
  Bits visible = ~Bits(0);
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#ifdef __CUDA_ARCH__
    if (j % 2 == 0 && j > 0) {
      uint32_t chain = 0;
      if constexpr (sizeof(Bits) == 8) asm volatile("" : "+r"(chain) : "l"(visible));
      else asm volatile("" : "+r"(chain) : "r"(visible));
      mask += chain;  // (chain is 0: an ordering, not an offset)
    }
#endif
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const uint8_t* r = mask + int64_t(std::min(m0 + 8 * j + 2 * t + e, q_last)) * row;
      if (r[key0] == 0) visible &= ~(Bits(1) << (2 * j + e));
      if (r[key1] == 0) visible &= ~(Bits(1) << (kRowBits + 2 * j + e));
    }
  }
  return visible;
}
// The tests of one warp's step (its 16 keys from warp_j0 x kBlockM queries
// from m0) that need no element: the mask policy, whether no pair can be
// visible (`hidden`: the segment summaries never meet, or a per-query
// mask's block summary hides them all), and what is left to read per
// element: a key-only mask's bytes (`key_mask`), a per-query mask's
// (`dense`; null where its block summary shows every pair), segment ids
// (meet == kSome). FeatureStepMask starts here; FeatureStepClass repeats
// these tests field by field (at the producer's registers), held to the
// bits by the host test.
// kDenseMask: the variant takes a per-query mask too (ReadsDenseStepMask).
struct StepScreen {
  MaskPolicy policy;
  const uint8_t* dense = nullptr;
  SegmentMeet meet = SegmentMeet::kAll;
  bool key_mask = false, hidden = false;
};
template <int kBlockM, bool kDenseMask>
__host__ __device__ __forceinline__ StepScreen ScreenStep(const AttentionParams& p, int b, int h, int m0,
                                                          int warp_j0) {
  StepScreen screen{MaskPolicy::For(p, b, h)};
  const MaskPolicy& policy = screen.policy;
  // A boolean mask (UnsupportedFeatures' MaskBeside::kAny): key-only, or
  // per query where the variant reads one.
  if (policy.mask) {
    if (!kDenseMask || policy.mask_row == 0) screen.key_mask = true;
    else screen.dense = policy.mask;
  }
  if (policy.q_segments)
    screen.meet = policy.HasSegmentRanges()
                      ? Meet(SummarySpan<kBlockM>(policy.q_ranges, m0), SummarySpan<16>(policy.kv_ranges, warp_j0))
                      : SegmentMeet::kSome;
  if (screen.meet == SegmentMeet::kNone) {
    screen.hidden = true;
    return screen;
  }
  if constexpr (kDenseMask) {
    // The mask's block summary over the step's queries and the warp's 16
    // keys: hidden whole (no pair to read), visible whole (none either), or
    // read pair by pair.
    if (screen.dense && p.features.mask_blocks) {
      const uint32_t bits = SliceMaskBlocks(p.features, b, h).SpanOf<kBlockM, 16, true>(m0, warp_j0);
      if (!(bits & kMaskBlockSome)) screen.hidden = true;
      if (bits & kMaskBlockAll) screen.dense = nullptr;
    }
  }
  return screen;
}

template <int kBlockM, bool kDenseMask = true>
__host__ __device__ __forceinline__ StepMaskBits<kBlockM> FeatureStepMask(const AttentionParams& p, int b, int h,
                                                                          int m0, int warp_j0, int key, int t) {
  using Bits = StepMaskBits<kBlockM>;
  constexpr int kTiles = kBlockM / 8, kRowBits = 2 * kTiles;
  static_assert(kBlockM == 64 || kBlockM == 128, "two rows of 2 kBlockM / 8 bits in one word");
  const StepScreen screen = ScreenStep<kBlockM, kDenseMask>(p, b, h, m0, warp_j0);
  if (screen.hidden) return Bits(0);
  const MaskPolicy& policy = screen.policy;
  // Key-only: the bytes of the thread's two keys (clamped into the
  // sequence: keys past it are hidden by the bounds) hide or keep each row
  // whole. Per query: every pair's byte (DenseStepMask), ANDed into the
  // rest of the policy's answer, which goes without it.
  Bits rows = ~Bits(0);
  if (screen.key_mask) {
    const int k_last = int(p.shape.seqlen_k) - 1;
    if (policy.mask[int64_t(std::min(key, k_last)) * policy.mask_col] == 0) rows &= ~((Bits(1) << kRowBits) - 1);
    if (policy.mask[int64_t(std::min(key + 8, k_last)) * policy.mask_col] == 0) rows &= (Bits(1) << kRowBits) - 1;
  }
  if constexpr (kDenseMask)
    if (screen.dense) rows &= DenseStepMask<kBlockM>(p, screen.dense, policy.mask_row, policy.mask_col, m0, key, t);
  const bool ids = screen.meet == SegmentMeet::kSome;
  if (!ids && !policy.NeedsBoundsCheck(m0, int64_t(m0) + kBlockM, warp_j0, int64_t(warp_j0) + 16)) return rows;
  // The bounds (lengths, causal, window, offsets): key k is seen by the
  // queries [lo, hi) of QueryRange (exact for one key), the thread's
  // columns m0 + 2t + 8j + e as ColumnRangeBits, a handful of integer
  // operations where VisibleBits' per-column compares cost 4 kTiles compares
  // and selects a key on every partial step (the window's left edge and the
  // diagonal: 4 of a window tile's 10 steps).
  constexpr int64_t kCols = 8 * kTiles;
  const int64_t c0 = int64_t(m0) + 2 * t;
  auto relative = [&](int64_t x) { return int(x - c0 < -1 ? -1 : (x - c0 > kCols ? kCols : x - c0)); };
  auto query_bits = [&](int64_t k) {
    int64_t lo, hi;
    policy.QueryRange(k, k + 1, &lo, &hi);
    return Bits(ColumnRangeBits<kTiles>(relative(lo), relative(hi)));
  };
  Bits visible = query_bits(key) | query_bits(int64_t(key) + 8) << kRowBits;
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
        if (id != id0) visible &= ~(Bits(1) << (2 * j + e));
        if (id != id1) visible &= ~(Bits(1) << (kRowBits + 2 * j + e));
      }
  }
  return visible & rows;
}

// What one warp's step needs (ScreenStep's tests, kDenseMask as there):
// kStepHidden where FeatureStepMask's bits are 0 for every lane,
// kStepVisible where they are all ones (no mask bytes, ids or bounds to
// check), kStepCheck otherwise. The backward's producer warp 3
// (bwd_kernel.cuh, StageStepClasses) makes it for the consumer warps a step or
// two ahead of them, so that their steps without element work skip the
// policy (~300 instructions per warp and step, on the step's path).
// A key-only mask (key padding) is read here for all 16 keys of the warp
// (FeatureStepMask reads a thread's two): all hidden makes the step hidden,
// all shown leaves the other tests to decide, keys past the sequence
// (clamped reads, as there) being the bounds' to hide.
enum StepClass : uint32_t { kStepHidden = 0, kStepVisible = 1, kStepCheck = 2 };
// ScreenStep's tests again, field by field from the parameters (the
// producer runs it at 24 registers: built through MaskPolicy::For, with
// its 64-bit fields and BroadcastOffset's 64-bit divisions, the step loop
// that ran it was 1442 instructions with 135 local accesses at 128;
// session 38). Every hiding test first (segment
// summaries that never meet, a per-query mask's summary, a key-only mask
// hiding all 16 keys), then those that leave pairs to check; the bounds
// last, only where nothing else asked for a check. The host test holds it
// to FeatureStepMask's bits for every warp and step of its configurations.
template <int kBlockM, bool kDenseMask = true>
__host__ __device__ __forceinline__ StepClass FeatureStepClass(const AttentionParams& p, int b, int h, int m0,
                                                               int warp_j0) {
  const AttentionFeatures& f = p.features;
  bool check = false;
  if (f.q_segment_ids && f.kv_segment_ids) {
    if (f.q_segment_ranges && f.kv_segment_ranges) {
      // MaskPolicy's summaries of this batch row (ForWithoutMaskArray), in
      // 32-bit arithmetic.
      const int q_blocks = int((p.shape.seqlen_q + kSegmentBlock - 1) / kSegmentBlock);
      const int k_blocks = int((p.shape.seqlen_k + kSegmentBlock - 1) / kSegmentBlock);
      const SegmentRanges q{f.q_segment_ranges + 2 * int64_t(b) * q_blocks, q_blocks};
      const SegmentRanges k{f.kv_segment_ranges + 2 * int64_t(b) * k_blocks, k_blocks};
      const SegmentMeet meet = Meet(SummarySpan<kBlockM>(q, m0), SummarySpan<16>(k, warp_j0));
      if (meet == SegmentMeet::kNone) return kStepHidden;
      check = meet == SegmentMeet::kSome;
    } else {
      check = true;
    }
  }
  if (f.mask) {
    if (kDenseMask && f.mask_stride.row != 0) {
      // A per-query mask: its block summary over the step's queries and the
      // warp's 16 keys, else every pair read.
      if (f.mask_blocks) {
        const uint32_t bits = SliceMaskBlocks(f, b, h).SpanOf<kBlockM, 16, true>(m0, warp_j0);
        if (!(bits & kMaskBlockSome)) return kStepHidden;
        if (!(bits & kMaskBlockAll)) check = true;
      } else {
        check = true;
      }
    } else {
      // Key-only: the warp's 16 key bytes (clamped into the sequence: keys
      // past it are the bounds' to hide): none shown hides the step, some
      // leave it to check.
      const int k_last = int(p.shape.seqlen_k) - 1;
      const uint8_t* keys = f.mask + BroadcastOffset32(f, f.mask_stride, b, h);
      const int64_t col = f.mask_stride.col;
      int shown = 0;
#ifdef __CUDA_ARCH__
      // Contiguous, aligned and inside the sequence: one 16-byte load.
      if (col == 1 && warp_j0 + 15 <= k_last && (reinterpret_cast<uintptr_t>(keys + warp_j0) & 15u) == 0) {
        const uint4 w = *reinterpret_cast<const uint4*>(keys + warp_j0);
        const uint32_t zero_bytes = __vcmpeq4(w.x, 0u) | __vcmpeq4(w.y, 0u) | __vcmpeq4(w.z, 0u) | __vcmpeq4(w.w, 0u);
        shown = (w.x | w.y | w.z | w.w) == 0 ? 0 : zero_bytes == 0 ? 16 : 1;
      } else
#endif
      {
        for (int j = 0; j < 16; ++j) shown += keys[int64_t(std::min(warp_j0 + j, k_last)) * col] != 0;
      }
      if (shown == 0) return kStepHidden;
      if (shown < 16) check = true;
    }
  }
  if (check) return kStepCheck;
  // MaskPolicy::NeedsBoundsCheck over queries [m0, m0 + kBlockM) x keys
  // [warp_j0, warp_j0 + 16), its lengths and diagonal read here.
  int64_t seqlen_q = p.shape.seqlen_q, seqlen_k = p.shape.seqlen_k;
  if (f.q_seqlens) seqlen_q = std::min<int64_t>(std::max(f.q_seqlens[b], 0), seqlen_q);
  if (f.kv_seqlens) seqlen_k = std::min<int64_t>(std::max(f.kv_seqlens[b], 0), seqlen_k);
  const int64_t i0 = m0, i1 = int64_t(m0) + kBlockM, j0 = warp_j0, j1 = int64_t(warp_j0) + 16;
  const int64_t diagonal = f.position_offsets ? f.position_offsets[b] : 0;
  const bool bounds = i1 > seqlen_q || j1 > seqlen_k || (p.is_causal && j1 - 1 > i0 + diagonal) ||
                      (f.window_right >= 0 && j1 - 1 > i0 + diagonal + f.window_right) ||
                      (f.window_left >= 0 && j0 < i1 - 1 + diagonal - f.window_left);
  return bounds ? kStepCheck : kStepVisible;
}

}  // namespace jax_flash::cuda::sm90
