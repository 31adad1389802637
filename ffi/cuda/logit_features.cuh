// The attention features as the CUDA kernels see them, for one (batch,
// head): which keys are visible (the shared MaskPolicy), the logit transform
// (soft cap, then bias) and the dropout factor (the shared DropoutPolicy).
// Same order and formulas as the CPU's LogitTransform:
//   logit = softcap(scale * q.k) + bias, -inf where not visible.
#pragma once

#include <math_constants.h>

#include "common/mask_policy.h"
#include "common/params.h"
#include "cuda/generic/element.cuh"  // ToFloat, FromFloat
#include "cuda/row_stats.cuh"

namespace jax_flash::cuda {

// Which pairs of one row of an MMA accumulator fragment are visible, as
// bits: the fragment row `row` (a query in the forward, a key in the
// backward) against this thread's 2 * kNTiles columns c0 + 8 * nt + e, as bit
// 2 * nt + e. The same answer as MaskPolicy::Visible, but with the per-row
// work done once per block: lengths, causal and window become one int32
// column range, and only the mask array and segment ids are read per pair,
// kChunk n-tiles' worth at a time (all at once by default; fewer holds fewer
// registers in kernels that have none to spare).
template <int kNTiles, bool kRowsAreQueries, int kChunk = kNTiles>
JAX_FLASH_HOST_DEVICE uint32_t VisibleBits(const MaskPolicy& m, int64_t row, int64_t c0) {
  static_assert(2 * kNTiles <= 32, "one bit per fragment column");
  static_assert(kNTiles % kChunk == 0);
  constexpr int kCols = 8 * kNTiles;
  int64_t lo, hi;
  if constexpr (kRowsAreQueries) {
    m.KeyRange(row, row + 1, &lo, &hi);  // exact for one query
  } else {
    m.QueryRange(row, row + 1, &lo, &hi);  // exact for one key
  }
  // Relative to c0, clamped so that it fits 32 bits and compares against
  // compile-time column offsets.
  auto relative = [c0](int64_t x) {
    x -= c0;
    return int(x < -1 ? -1 : (x > kCols ? kCols : x));
  };
  const int lo_rel = relative(lo), hi_rel = relative(hi);
  uint32_t bits = 0;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = 8 * nt + e;
      if (c >= lo_rel && c < hi_rel) bits |= 1u << (2 * nt + e);
    }
  if (bits == 0 || !m.HasElementMasks()) return bits;
  // The reads below go to every column, clamped into [c0, c0 + hi_rel): in
  // bounds (bits != 0, so the row is inside its length and hi_rel >= 1), and
  // unconditional, so a chunk's are issued together. (Reading only where a
  // bit is set made each read wait for the previous one: one memory latency
  // per pair.)
  const int last = hi_rel - 1;
  uint32_t keep = ~0u;
  if (m.q_segments) {
    const int32_t id = kRowsAreQueries ? m.q_segments[row] : m.kv_segments[row];
    const int32_t* col_ids = (kRowsAreQueries ? m.kv_segments : m.q_segments) + c0;
#pragma unroll
    for (int nt0 = 0; nt0 < kNTiles; nt0 += kChunk) {
      int32_t ids[kChunk][2];
#pragma unroll
      for (int nt = 0; nt < kChunk; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) ids[nt][e] = col_ids[min(8 * (nt0 + nt) + e, last)];
#pragma unroll
      for (int nt = 0; nt < kChunk; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (ids[nt][e] != id) keep &= ~(1u << (2 * (nt0 + nt) + e));
    }
  }
  if (m.mask) {
    const int64_t row_stride = kRowsAreQueries ? m.mask_row : m.mask_col;
    const int64_t col_stride = kRowsAreQueries ? m.mask_col : m.mask_row;
    const uint8_t* mask = m.mask + row * row_stride + c0 * col_stride;
    if (col_stride == 0) {  // the same byte for the whole row (e.g. key padding in the backward)
      if (*mask == 0) keep = 0;
    } else {
#pragma unroll
      for (int nt0 = 0; nt0 < kNTiles; nt0 += kChunk) {
        uint8_t bytes[kChunk][2];
#pragma unroll
        for (int nt = 0; nt < kChunk; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) bytes[nt][e] = mask[min(8 * (nt0 + nt) + e, last) * col_stride];
#pragma unroll
        for (int nt = 0; nt < kChunk; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (bytes[nt][e] == 0) keep &= ~(1u << (2 * (nt0 + nt) + e));
      }
    }
  }
  return bits & keep;
}

// The largest fragment column offset 8 * nt + e whose bit is set in a
// nonzero VisibleBits result: per-pair reads (the bias) clamped to it stay in
// bounds and can all be issued at once.
__device__ inline int LastVisibleColumn(uint32_t visible) {
  const int k = 31 - __clz(visible);
  return 8 * (k >> 1) + (k & 1);
}

// Key-only masks: a `mask` that is the same for every query (query stride 0,
// e.g. [B, 1, 1, S] key padding) hides whole key blocks or none of their keys
// in the common case. One warp summarizes kKeys keys from j0 (keys past the
// effective length do not count; lengths bound them elsewhere): a block whose
// keys are all hidden contributes nothing, and one whose keys are all visible
// needs no per-element mask check. The bytes are read by Load and voted on by
// Summary, so a kernel can issue the reads a block ahead.
enum class KeyMaskBlock { kMixed, kAllVisible, kNoneVisible };

template <int kKeys>
struct KeyMaskReader {
  static_assert(kKeys % 32 == 0, "whole warps of keys");
  static constexpr int kPerLane = kKeys / 32;
  // Each lane's key bytes (consecutive lanes, consecutive keys): 1 visible, 0
  // hidden, 2 past the length.
  uint8_t bytes[kPerLane];

  __device__ static bool Applies(const MaskPolicy& m) { return m.mask && m.mask_row == 0; }

  __device__ void Load(const MaskPolicy& m, int64_t j0) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t j = j0 + i * 32 + lane;
      bytes[i] = j < m.seqlen_k ? uint8_t(m.mask[j * m.mask_col] != 0) : uint8_t(2);
    }
  }

  __device__ KeyMaskBlock Summary() const {
    bool any_visible = false, any_hidden = false;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) any_visible |= bytes[i] == 1, any_hidden |= bytes[i] == 0;
    any_visible = __any_sync(0xffffffffu, any_visible);
    any_hidden = __any_sync(0xffffffffu, any_hidden);
    if (!any_hidden) return KeyMaskBlock::kAllVisible;
    return any_visible ? KeyMaskBlock::kMixed : KeyMaskBlock::kNoneVisible;
  }
};

// Drops the blocks nb of [*lo, *hi) for which empty(nb) holds from either end
// of the range, so they are never copied or scheduled. One warp (every warp
// that calls it gets the same answer); a lane tests one block, 32 blocks per
// vote.
template <typename Empty>
__device__ void TrimEmptyBlocks(int* lo, int* hi, Empty&& empty) {
  const int lane = threadIdx.x % 32;
  // Counts the empty blocks from `from` stepping by `dir`, up to `limit` blocks.
  auto empty_run = [&](int from, int dir, int limit) {
    int run = 0;
    while (run < limit) {
      const bool mine = run + lane < limit && empty(from + dir * (run + lane));
      const uint32_t votes = __ballot_sync(0xffffffffu, mine);
      const int found = votes == 0xffffffffu ? 32 : __ffs(~votes) - 1;
      run += found;
      if (found < 32) break;
    }
    return min(run, limit);
  };
  *hi -= empty_run(*hi - 1, -1, *hi - *lo);
  *lo += empty_run(*lo, 1, *hi - *lo);
}

// Drops key blocks of kKeys keys that a key-only mask hides entirely from
// either end of [*lo, *hi) (key padding); a lane reads its block's bytes back
// to back.
template <int kKeys>
__device__ void TrimHiddenKeyBlocks(const MaskPolicy& m, int* lo, int* hi) {
  TrimEmptyBlocks(lo, hi, [&](int nb) {
    const int64_t j0 = int64_t(nb) * kKeys;
    const int count = int(max(int64_t(0), min(int64_t(kKeys), m.seqlen_k - j0)));
    const uint8_t* bytes = m.mask + j0 * m.mask_col;
    bool any_visible = false;
#pragma unroll 16
    for (int i = 0; i < kKeys; ++i) any_visible |= i < count && bytes[i * m.mask_col] != 0;
    return !any_visible;
  });
}

// Drops the blocks of kBlock positions from [*lo, *hi) at either end whose
// segment ids never meet `other` (the id span of the block being processed):
// with packed documents, everything outside the documents that block
// belongs to. kBlocksAreQueries: the blocks are query blocks (else key blocks).
template <int kBlock, bool kBlocksAreQueries>
__device__ void TrimSegmentBlocks(const MaskPolicy& m, IdSpan other, int* lo, int* hi) {
  TrimEmptyBlocks(lo, hi, [&](int nb) {
    const int64_t r0 = int64_t(nb) * kBlock;
    const IdSpan ids = kBlocksAreQueries ? m.QueryIds(r0, r0 + kBlock) : m.KeyIds(r0, r0 + kBlock);
    return Meet(other, ids) == SegmentMeet::kNone;
  });
}

// A bias value as float, from any of the element types a bias comes in.
__device__ __forceinline__ float BiasValue(const float* p) { return *p; }
__device__ __forceinline__ float BiasValue(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float BiasValue(const __nv_bfloat16* p) { return __bfloat162float(*p); }

struct LogitFeatures {
  MaskPolicy mask;
  DropoutPolicy dropout;
  // This (batch, head) slice: float32, or the inputs' 16-bit type as given
  // (bias_type; attention.py passes only the query's own 16-bit type), read
  // without a float32 copy. The type is a runtime switch, uniform over the
  // grid, so a bias adds no kernel instantiations.
  const void* bias = nullptr;
  BiasType bias_type = BiasType::kAccum;
  int64_t bias_row = 0, bias_col = 0;
  float cap = 0.0f;  // soft cap, 0 = off
  float inv_cap = 0.0f;
  float scale_over_cap = 0.0f, cap_over_scale = 0.0f;  // the soft cap on raw q.k (SoftcapRaw)
  int64_t b = 0, h = 0;

  __device__ static LogitFeatures For(const AttentionParams& p, int64_t b, int64_t h) {
    const AttentionFeatures& f = p.features;
    LogitFeatures lf;
    lf.mask = MaskPolicy::For(p, b, h);
    lf.dropout = DropoutPolicy::For(p, b);
    if (f.bias) {
      const int64_t off = f.BroadcastOffset(f.bias_stride, b, h);
      lf.bias_type = f.bias_type;
      lf.bias = f.bias_type == BiasType::kAccum ? static_cast<const void*>(static_cast<const float*>(f.bias) + off)
                                                : static_cast<const void*>(static_cast<const uint16_t*>(f.bias) + off);
      lf.bias_row = f.bias_stride.row;
      lf.bias_col = f.bias_stride.col;
    }
    lf.cap = float(f.softcap);
    lf.inv_cap = f.softcap > 0 ? float(1.0 / f.softcap) : 0.0f;
    lf.scale_over_cap = f.softcap > 0 ? float(p.scale / f.softcap) : 0.0f;
    lf.cap_over_scale = f.softcap > 0 ? float(f.softcap / p.scale) : 0.0f;
    lf.b = b;
    lf.h = h;
    return lf;
  }

  // The logit of (query i, key j) in log2 units from score = log2(e) * scale
  // * q.k; *tanh_value gets tanh(scale * q.k / cap) for the backward's chain
  // rule (0 without a soft cap). -inf when the pair is not visible.
  __device__ float Logit(float score, int64_t i, int64_t j, float* tanh_value) const {
    *tanh_value = 0.0f;
    if (!mask.Visible(i, j)) return -CUDART_INF_F;
    return Transform(score, i, j, tanh_value);
  }

  // Whether Transform does more than return its score.
  __device__ bool NeedsTransform() const { return cap > 0.0f || bias; }

  // The bias at element `at` of this slice (a switch on its type).
  __device__ float BiasAt(int64_t at) const {
    switch (bias_type) {
      case BiasType::kFloat16: return BiasValue(static_cast<const __half*>(bias) + at);
      case BiasType::kBFloat16: return BiasValue(static_cast<const __nv_bfloat16*>(bias) + at);
      default: return BiasValue(static_cast<const float*>(bias) + at);
    }
  }

  // Logit without the visibility check.
  __device__ float Transform(float score, int64_t i, int64_t j, float* tanh_value) const {
    return Apply(score, bias ? BiasAt(i * bias_row + j * bias_col) : 0.0f, tanh_value);
  }

  // Soft cap, then the bias value (0 without a bias), on score = log2(e) *
  // scale * q.k; in log2 units like Logit. kFastTanh: FastTanh instead of
  // tanhf (the tensor-core kernels, forward and backward alike, so that the
  // backward recomputes the forward's probabilities).
  template <bool kFastTanh = false>
  __device__ float Apply(float score, float bias_value, float* tanh_value) const {
    *tanh_value = 0.0f;
    if (cap <= 0.0f && !bias) return score;
    float x = score * kLn2;  // scale * q.k
    if (cap > 0.0f) {
      *tanh_value = kFastTanh ? FastTanh(x * inv_cap) : tanhf(x / cap);
      x = cap * *tanh_value;
    }
    return (x + bias_value) * kLog2e;
  }

  // The soft cap alone (no bias) on a raw dot product q.k, in raw units:
  // cap / scale * tanh(scale / cap * q.k), so that the caller's softmax
  // (which multiplies by scale * log2(e)) stays the plain one; *tanh_value
  // gets the tanh for the backward's chain rule. Two multiplies and one
  // tanh (Apply's path costs ~10 instructions more per element). kApprox:
  // TanhApprox (bfloat16), else FastTanh.
  template <bool kApprox>
  __device__ float SoftcapRaw(float raw, float* tanh_value) const {
    const float x = raw * scale_over_cap;
    *tanh_value = kApprox ? TanhApprox(x) : FastTanh(x);
    return *tanh_value * cap_over_scale;
  }

  // kN x 2 bias values of one fragment row for the tensor-core kernels:
  // values[nt][e] = bias[at + min(8 nt + e, last) * stride] (clamped to the
  // last visible column, see LastVisibleColumn), all reads issued before any
  // is used. Element: the kernel's 16-bit type, which a 16-bit bias has.
  // Two ways to switch on the type, for the kernels' register budgets
  // (ptxas, bf16, sm_80): kPerElement, one byte pointer and a select per
  // value, is what the forward takes (its 64 feature kernel spilled 8 B with
  // a branch per row, 4 B this way); the backward's feature kernels take the
  // branch per row, two typed copies of the unrolled reads (the select
  // spilled more there: 280 / 360 B at 64 against 268 / 324).
  template <typename Element, bool kPerElement, int kN>
  __device__ void LoadBiasRow(int64_t at, int64_t stride, int last, float (&values)[kN][2]) const {
    const bool wide = bias_type == BiasType::kAccum;
    if constexpr (kPerElement) {
      const int shift = wide ? 2 : 1;
      const char* row = static_cast<const char*>(bias) + (at << shift);
      const int64_t byte_stride = stride << shift;
#pragma unroll
      for (int nt = 0; nt < kN; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const char* p = row + min(8 * nt + e, last) * byte_stride;
          values[nt][e] = wide ? *reinterpret_cast<const float*>(p) : ToFloat(*reinterpret_cast<const Element*>(p));
        }
    } else {
      auto load = [&](const auto* row) {
#pragma unroll
        for (int nt = 0; nt < kN; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) values[nt][e] = BiasValue(row + min(8 * nt + e, last) * stride);
      };
      if (wide) {
        load(static_cast<const float*>(bias) + at);
      } else {
        load(static_cast<const Element*>(bias) + at);
      }
    }
  }

  // 0 (dropped) or 1 / (1 - rate); 1 without dropout.
  __device__ float DropFactor(int64_t i, int64_t j) const {
    return dropout.active ? dropout.Factor(b, h, i, j) : 1.0f;
  }

  // Whether logits need more than the scale (soft cap, bias) or P a dropout
  // factor: then every block takes the per-element path (which skips the
  // visibility work where the mask policy says a block needs none).
  JAX_FLASH_HOST_DEVICE static bool ElementwiseLogits(const AttentionParams& p) {
    const AttentionFeatures& f = p.features;
    return f.bias || f.softcap > 0.0 || (f.dropout_rate > 0.0 && f.dropout_seed);
  }

  // Whether a bias-gradient pass is on (p.features.dbias or dbias_direct).
  JAX_FLASH_HOST_DEVICE static bool WritesDbias(const AttentionParams& p) {
    return p.features.dbias || p.features.dbias_direct;
  }

  // d(scale * q.k) from d(logit): the soft cap's derivative 1 - tanh^2.
  __device__ float ChainSoftcap(float dlogit, float tanh_value) const {
    return cap > 0.0f ? dlogit * (1.0f - tanh_value * tanh_value) : dlogit;
  }
};

// Adds d(logit) of (batch b, head h, query i, key j) to the bias gradient:
// by a float32 atomic into f.dbias where the bias is broadcast (several
// (b, h, i, j) share an element; zeroed first, rounded into a 16-bit dbias
// after), or by a plain store into f.dbias_direct, of the bias's type, where
// it is not (each element has exactly one writer; zeroed first for the pairs
// no block visits). `slice`: BroadcastOffset(bias_stride, b, h). Element:
// the kernel's input type (a 16-bit bias has it). kCallStore: the typed
// store as a call (StoreDbiasDirect): the generic 256 bias-gradient kernel,
// capped at 168 registers, spilled 28 B with it inline (none as a call);
// the sm80 kernel, at 255 registers, would pay for a call's saved registers
// instead and keeps it inline.
template <typename Element>
__device__ __noinline__ void StoreDbiasDirect(void* dbias, BiasType type, int64_t at, float ds) {
  if (type == BiasType::kAccum) {
    static_cast<float*>(dbias)[at] = ds;
  } else {
    static_cast<Element*>(dbias)[at] = FromFloat<Element>(ds);
  }
}

template <typename Element, bool kCallStore = false>
__device__ __forceinline__ void AddDbias(const AttentionFeatures& f, int64_t slice, int64_t i, int64_t j,
                                         float ds) {
  const int64_t at = slice + i * f.bias_stride.row + j * f.bias_stride.col;
  if (f.dbias) {
    if (ds != 0.0f) atomicAdd(f.dbias + at, ds);
  } else if constexpr (kCallStore) {
    StoreDbiasDirect<Element>(f.dbias_direct, f.bias_type, at, ds);
  } else if (f.bias_type == BiasType::kAccum) {
    static_cast<float*>(f.dbias_direct)[at] = ds;
  } else {
    static_cast<Element*>(f.dbias_direct)[at] = FromFloat<Element>(ds);
  }
}

}  // namespace jax_flash::cuda
