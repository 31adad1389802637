// Which keys each query sees: one policy for the forward, the backward, the
// CPU and the CUDA kernels. It answers two questions: which key range a block
// of queries visits (and which query range a block of keys is seen by), so
// blocks outside the causal/window/length bounds are skipped, not masked; and
// whether one (query, key) pair is visible, for the blocks that need a check.
// Segment ids (packed sequences) join the block questions through per-block
// [min, max] summaries: a block whose query and key id ranges are disjoint is
// empty (never visited), one whose ranges are the same single id needs no id
// check. Exact at block granularity for contiguous documents, and correct
// (a superset) for any ids.
#pragma once

#include <cstdint>

#include "common/params.h"

namespace jax_flash {

// The segment ids of a run of positions, as the closed range [lo, hi] of the
// ids found there (from the per-block summaries: possibly wider than exact).
struct IdSpan {
  int32_t lo, hi;
};

// How segment ids treat the pairs of a query span and a key span.
enum class SegmentMeet {
  kNone,  // no pair shares an id: the block is empty
  kSome,  // some may: check per element
  kAll,   // one id on both sides: every pair shares it
};

JAX_FLASH_HOST_DEVICE inline SegmentMeet Meet(IdSpan q, IdSpan k) {
  if (q.hi < k.lo || k.hi < q.lo) return SegmentMeet::kNone;
  if (q.lo == q.hi && k.lo == k.hi) return SegmentMeet::kAll;  // then q.lo == k.lo
  return SegmentMeet::kSome;
}

// One batch row's id summaries: entry e = (min, max) of positions
// [e * kSegmentBlock, (e + 1) * kSegmentBlock) (clipped to the length).
struct SegmentRanges {
  const int32_t* ranges = nullptr;  // [blocks][2], or null: unknown
  int64_t blocks = 0;

  // The ids of positions [r0, r1) (r1 > r0; clipped to the sequence).
  JAX_FLASH_HOST_DEVICE IdSpan Span(int64_t r0, int64_t r1) const {
    const int64_t last = Min((r1 - 1) / kSegmentBlock, blocks - 1);
    int64_t e = Min(r0 / kSegmentBlock, last);
    IdSpan span{ranges[2 * e], ranges[2 * e + 1]};
    for (++e; e <= last; ++e) {
      span.lo = ranges[2 * e] < span.lo ? ranges[2 * e] : span.lo;
      span.hi = ranges[2 * e + 1] > span.hi ? ranges[2 * e + 1] : span.hi;
    }
    return span;
  }

 private:
  JAX_FLASH_HOST_DEVICE static int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
};

// A per-query boolean mask's block summary (AttentionFeatures::mask_blocks,
// jax_flash/_kernel_call.py mask_block_summary) for one (batch, head) slice:
// entry (r, c) covers queries [r, r + 1) x keys [c, c + 1) in kMaskBlock
// units, bit kMaskBlockSome where one of its pairs is visible, kMaskBlockAll
// where all are. A block of any size is answered from the entries it
// overlaps: hidden whole when none has a visible pair, visible whole when
// all are full, exact at kMaskBlock granularity and correct (fewer skips)
// for blocks that are not aligned to it.
enum MaskBlockBits : uint32_t { kMaskBlockSome = 1, kMaskBlockAll = 2 };

struct MaskBlocks {
  const uint8_t* entries = nullptr;  // [rows][cols] of this slice, or null: no summary
  int32_t rows = 0, cols = 0;

  JAX_FLASH_HOST_DEVICE static MaskBlocks For(const AttentionFeatures& f, int64_t b, int64_t h) {
    MaskBlocks m;
    if (f.mask_blocks) {
      m.entries = f.mask_blocks + f.BroadcastOffset(f.mask_blocks_stride, b, h);
      m.rows = f.mask_block_rows;
      m.cols = f.mask_block_cols;
    }
    return m;
  }

  // The bits of queries [i0, i1) x keys [j0, j1) (i0 < i1, j0 < j1, i0 and
  // j0 inside the mask; ends past it are clamped): kMaskBlockSome when an
  // entry it overlaps has a visible pair, kMaskBlockAll when every entry is
  // visible whole. The host's reference (the tests); kernels call SpanOf.
  JAX_FLASH_HOST_DEVICE uint32_t Span(int i0, int i1, int j0, int j1) const {
    const int r1 = Min((i1 - 1) / int(kMaskBlock), rows - 1), c1 = Min((j1 - 1) / int(kMaskBlock), cols - 1);
    uint32_t some = 0, all = kMaskBlockAll;
    for (int r = Min(i0 / int(kMaskBlock), r1); r <= r1; ++r)
      for (int c = Min(j0 / int(kMaskBlock), c1); c <= c1; ++c) {
        const uint32_t e = entries[int64_t(r) * cols + c];
        some |= e;
        all &= e;
      }
    return (some & kMaskBlockSome) | all;
  }

  // Span(i0, i0 + kRows, j0, j0 + kCols) for the kernels' compile-time block
  // sizes: every entry the block can overlap, unrolled, each index clamped
  // to the block's last entry (a repeated entry changes neither the union
  // nor the intersection), so there is no trip count to compute. kAligned:
  // i0 and j0 are multiples of kMaskBlock (kRows / kMaskBlock entries per
  // side, rounded up; else one more). Span's loops, right on the host, never
  // hid a block in the Hopper forward's trim on the H200 (session 27's
  // tests/cuda/sm90_key_blocks_probe.cu: tile 0 of a causal mask kept all 32
  // key blocks); its sm_90a SASS (nvcc 13.0) reads as taking the inner trip
  // count from max(~c0, cols, ~c1) where -cols belongs, i.e. past the
  // block's entries into the next row's. SpanOf passes that probe.
  template <int kRows, int kCols, bool kAligned = false>
  JAX_FLASH_HOST_DEVICE uint32_t SpanOf(int i0, int j0) const {
    constexpr int kB = int(kMaskBlock);
    constexpr int kR = (kRows + kB - 1) / kB + (kAligned ? 0 : 1), kC = (kCols + kB - 1) / kB + (kAligned ? 0 : 1);
    const int r1 = Min((i0 + kRows - 1) / kB, rows - 1), c1 = Min((j0 + kCols - 1) / kB, cols - 1);
    const int r0 = Min(i0 / kB, r1), c0 = Min(j0 / kB, c1);
    uint32_t some = 0, all = kMaskBlockAll;
#pragma unroll
    for (int dr = 0; dr < kR; ++dr) {
      const uint8_t* row = entries + Min(r0 + dr, r1) * cols;
#pragma unroll
      for (int dc = 0; dc < kC; ++dc) {
        const uint32_t e = row[Min(c0 + dc, c1)];
        some |= e;
        all &= e;
      }
    }
    return (some & kMaskBlockSome) | all;
  }

 private:
  JAX_FLASH_HOST_DEVICE static int Min(int a, int b) { return a < b ? a : b; }
};

struct MaskPolicy {
  int64_t seqlen_q = 0, seqlen_k = 0;  // effective lengths (seq lengths applied)
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  // Query row i sits at key position i + diagonal (the batch entry's position
  // offset): causal sees keys j <= i + diagonal, the window
  // i + diagonal - left <= j <= i + diagonal + right.
  int64_t diagonal = 0;
  const int32_t* q_segments = nullptr;   // this batch row's ids, or null
  const int32_t* kv_segments = nullptr;
  SegmentRanges q_ranges, kv_ranges;  // their block summaries (ranges null: unknown)
  const uint8_t* mask = nullptr;  // this (batch, head) slice, or null
  int64_t mask_row = 0, mask_col = 0;

  JAX_FLASH_HOST_DEVICE static MaskPolicy For(const AttentionParams& p, int64_t b, int64_t h) {
    MaskPolicy m = ForWithoutMaskArray(p, b);
    const AttentionFeatures& f = p.features;
    if (f.mask) {
      m.mask = f.mask + f.BroadcastOffset(f.mask_stride, b, h);
      m.mask_row = f.mask_stride.row;
      m.mask_col = f.mask_stride.col;
    }
    return m;
  }

  // For() without the boolean mask array (mask stays null): for kernels whose
  // launch rejects a mask (the sm90 forward's feature variants), which then
  // carry none of BroadcastOffset's 64-bit divisions (code and registers in
  // the hot loops, even where the mask branch is never taken).
  JAX_FLASH_HOST_DEVICE static MaskPolicy ForWithoutMaskArray(const AttentionParams& p, int64_t b) {
    const AttentionFeatures& f = p.features;
    MaskPolicy m;
    m.seqlen_q = p.shape.seqlen_q;
    m.seqlen_k = p.shape.seqlen_k;
    if (f.q_seqlens) m.seqlen_q = Clamp(f.q_seqlens[b], m.seqlen_q);
    if (f.kv_seqlens) m.seqlen_k = Clamp(f.kv_seqlens[b], m.seqlen_k);
    m.causal = p.is_causal;
    m.window_left = f.window_left;
    m.window_right = f.window_right;
    if (f.position_offsets) m.diagonal = f.position_offsets[b];
    if (f.q_segment_ids && f.kv_segment_ids) {
      m.q_segments = f.q_segment_ids + b * p.shape.seqlen_q;
      m.kv_segments = f.kv_segment_ids + b * p.shape.seqlen_k;
      if (f.q_segment_ranges && f.kv_segment_ranges) {
        m.q_ranges.blocks = (p.shape.seqlen_q + kSegmentBlock - 1) / kSegmentBlock;
        m.kv_ranges.blocks = (p.shape.seqlen_k + kSegmentBlock - 1) / kSegmentBlock;
        m.q_ranges.ranges = f.q_segment_ranges + 2 * b * m.q_ranges.blocks;
        m.kv_ranges.ranges = f.kv_segment_ranges + 2 * b * m.kv_ranges.blocks;
      }
    }
    return m;
  }

  // kv_ranges of ForWithoutMaskArray(p, b) alone (ranges null without
  // segment ids and both sides' summaries; the same formulas, written out
  // there too: through this call the sm90 forward's producer warp, at its
  // 24-40 registers, spilled more), for code that needs only the key side's
  // summaries (the sm90 forward's consumers, once per tile) without the
  // rest of the policy's loads and 64-bit arithmetic.
  JAX_FLASH_HOST_DEVICE static SegmentRanges KeySegmentRanges(const AttentionParams& p, int64_t b) {
    const AttentionFeatures& f = p.features;
    SegmentRanges r;
    if (f.q_segment_ids && f.kv_segment_ids && f.q_segment_ranges && f.kv_segment_ranges) {
      r.blocks = (p.shape.seqlen_k + kSegmentBlock - 1) / kSegmentBlock;
      r.ranges = f.kv_segment_ranges + 2 * b * r.blocks;
    }
    return r;
  }

  // Keys [*lo, *hi) that query rows [i0, i1) may see (a superset of the
  // visible ones); empty when *lo >= *hi.
  JAX_FLASH_HOST_DEVICE void KeyRange(int64_t i0, int64_t i1, int64_t* lo, int64_t* hi) const {
    *lo = 0;
    *hi = i0 < seqlen_q ? seqlen_k : 0;
    if (causal) *hi = Min(*hi, i1 + diagonal);
    if (window_right >= 0) *hi = Min(*hi, i1 + diagonal + window_right);
    if (window_left >= 0) *lo = Max(*lo, i0 + diagonal - window_left);
  }

  // Query rows [*lo, *hi) that may see keys [j0, j1).
  JAX_FLASH_HOST_DEVICE void QueryRange(int64_t j0, int64_t j1, int64_t* lo, int64_t* hi) const {
    *lo = 0;
    *hi = j0 < seqlen_k ? seqlen_q : 0;
    if (causal) *lo = Max(*lo, j0 - diagonal);
    if (window_right >= 0) *lo = Max(*lo, j0 - diagonal - window_right);
    if (window_left >= 0) *hi = Min(*hi, j1 - diagonal + window_left);
  }

  // False when every pair of rows [i0, i1) x keys [j0, j1) is visible.
  JAX_FLASH_HOST_DEVICE bool NeedsCheck(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    return mask || (q_segments && Segments(i0, i1, j0, j1) != SegmentMeet::kAll) ||
           NeedsBoundsCheck(i0, i1, j0, j1);
  }

  // Whether lengths, causal or the window hide any pair of the block.
  JAX_FLASH_HOST_DEVICE bool NeedsBoundsCheck(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    return i1 > seqlen_q || j1 > seqlen_k || (causal && j1 - 1 > i0 + diagonal) ||
           (window_right >= 0 && j1 - 1 > i0 + diagonal + window_right) ||
           (window_left >= 0 && j0 < i1 - 1 + diagonal - window_left);
  }

  // Segment ids of rows [i0, i1) against keys [j0, j1) (kSome when there are
  // ids but no summaries; kAll without ids).
  JAX_FLASH_HOST_DEVICE SegmentMeet Segments(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    if (!q_segments) return SegmentMeet::kAll;
    if (!HasSegmentRanges()) return SegmentMeet::kSome;
    return Meet(QueryIds(i0, i1), KeyIds(j0, j1));
  }
  JAX_FLASH_HOST_DEVICE bool HasSegmentRanges() const { return q_segments && q_ranges.ranges; }
  // Id spans of query rows [i0, i1) and keys [j0, j1) (HasSegmentRanges()).
  JAX_FLASH_HOST_DEVICE IdSpan QueryIds(int64_t i0, int64_t i1) const { return q_ranges.Span(i0, i1); }
  JAX_FLASH_HOST_DEVICE IdSpan KeyIds(int64_t j0, int64_t j1) const { return kv_ranges.Span(j0, j1); }

  // Whether no pair of the block can be visible: outside the structural key
  // range, or segment ids that never meet.
  JAX_FLASH_HOST_DEVICE bool BlockEmpty(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    int64_t lo, hi;
    KeyRange(i0, i1, &lo, &hi);
    return lo >= hi || j1 <= lo || j0 >= hi || Segments(i0, i1, j0, j1) == SegmentMeet::kNone;
  }

  // This policy for the pairs of one block whose segment ids all meet: the
  // per-element checks then skip the ids.
  JAX_FLASH_HOST_DEVICE MaskPolicy WithoutSegments() const {
    MaskPolicy m = *this;
    m.q_segments = m.kv_segments = nullptr;
    return m;
  }

  // Keys [*lo, *hi) inside the structural bounds (lengths, causal, window) of
  // query row i; the mask array and segment ids may hide more of them.
  JAX_FLASH_HOST_DEVICE void RowKeyBounds(int64_t i, int64_t* lo, int64_t* hi) const {
    KeyRange(i, i + 1, lo, hi);
  }

  // Whether pairs also need the mask array / segment ids checked.
  JAX_FLASH_HOST_DEVICE bool HasElementMasks() const { return mask || q_segments; }

  // The mask array and segment ids alone (call inside RowKeyBounds).
  JAX_FLASH_HOST_DEVICE bool ElementVisible(int64_t i, int64_t j) const {
    return (!q_segments || q_segments[i] == kv_segments[j]) &&
           (!mask || mask[i * mask_row + j * mask_col] != 0);
  }

  JAX_FLASH_HOST_DEVICE bool Visible(int64_t i, int64_t j) const {
    return i < seqlen_q && j < seqlen_k && (!causal || j <= i + diagonal) &&
           (window_left < 0 || j >= i + diagonal - window_left) &&
           (window_right < 0 || j <= i + diagonal + window_right) &&
           (!q_segments || q_segments[i] == kv_segments[j]) &&
           (!mask || mask[i * mask_row + j * mask_col] != 0);
  }

 private:
  JAX_FLASH_HOST_DEVICE static int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
  JAX_FLASH_HOST_DEVICE static int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; }
  JAX_FLASH_HOST_DEVICE static int64_t Clamp(int32_t len, int64_t full) {
    return len < 0 ? 0 : (len > full ? full : len);
  }
};

// Dropout's random bits: Philox4x32 with 7 rounds (kPhiloxRounds) keyed by
// the user's seed, the same bits on every platform and in the forward and
// backward, nothing stored.
// Each pair (query i, key j) takes 16 bits, so one call serves 8 pairs: two
// rows, i0 and i0 + 8 (i0 % 16 < 8), times four keys, j0 + 8 w (j0 % 32 < 8).
// With run = j / 32, lane = j % 8, word = (j % 32) / 8 and half = (i % 16) / 8,
// the counter is (run * 8 + lane, i / 16 * 8 + i % 8, h, b) and the pair's
// bits are the low (half 0) or high (half 1) 16 bits of output word `word`.
// That set of pairs is held by one thread in both tensor-core kernels: the
// forward's fragment rows g and g + 8 against keys 2t + e + 8 nt, the
// backward's keys g + 8 w of a 32-key group against queries 2t + e + 8 nt
// and + 8 (nt + 1). A pair is dropped when its 16 bits are below
// round(rate * 2^16): the drop probability is the rate rounded to a multiple
// of 2^-16 (kept ones are scaled by 1 / (1 - rate), as in jax).

// Philox-4x32's round multipliers and key increments (Salmon et al., 2011).
constexpr uint32_t kPhiloxMul0 = 0xD2511F53u, kPhiloxMul1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxKeyStep0 = 0x9E3779B9u, kPhiloxKeyStep1 = 0xBB67AE85u;
// Dropout's rounds. Salmon et al. found 7 the fewest with which Philox4x32
// passes TestU01's BigCrush and recommend 10 as a safety margin for general
// use; FlashAttention-2's dropout uses 7. The rounds are nearly half of a
// dropout kernel's issued instructions (the plain-loop sm90 forward at head
// dim 128: 482 of 985 a key block at 10), so 7 (10 until December 2026:
// masks drawn before then differ).
constexpr int kPhiloxRounds = 7;

struct Philox4x32Words {
  uint32_t w[4];
};

// kRounds: the tests also check Random123's 10-round known answers.
template <int kRounds = kPhiloxRounds>
JAX_FLASH_HOST_DEVICE inline Philox4x32Words Philox4x32(uint32_t k0, uint32_t k1, uint32_t c0,
                                                        uint32_t c1, uint32_t c2, uint32_t c3) {
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t p0 = uint64_t(kPhiloxMul0) * c0, p1 = uint64_t(kPhiloxMul1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kPhiloxKeyStep0;
    k1 += kPhiloxKeyStep1;
  }
  return Philox4x32Words{{c0, c1, c2, c3}};
}

struct DropoutPolicy {
  uint32_t k0 = 0, k1 = 0;
  uint32_t threshold = 0;  // drop when a pair's 16 bits are below it
  float keep_scale = 1.0f;
  bool active = false;
  bool shared = false;  // counter ignores (batch, head): flax's broadcast_dropout

  JAX_FLASH_HOST_DEVICE static DropoutPolicy For(const AttentionParams& p, int64_t b) {
    const AttentionFeatures& f = p.features;
    DropoutPolicy d;
    if (f.dropout_rate <= 0.0 || !f.dropout_seed) return d;
    const int64_t per_seed = p.shape.batch / f.seed_count;  // vmapped keys come first
    const uint32_t* seed = f.dropout_seed + 2 * (b / per_seed);
    d.k0 = seed[0];
    d.k1 = seed[1];
    d.threshold = Threshold(f.dropout_rate);
    d.keep_scale = float(1.0 / (1.0 - f.dropout_rate));
    d.active = true;
    d.shared = f.dropout_shared;
    return d;
  }

  // round(rate * 2^16) (rate < 1, so at most 2^16: a rate within 2^-17 of 1
  // drops everything).
  JAX_FLASH_HOST_DEVICE static uint32_t Threshold(double rate) { return uint32_t(rate * 65536.0 + 0.5); }

  // The counter of the Philox call that serves pair (i, j) (see above).
  JAX_FLASH_HOST_DEVICE void Counter(int64_t b, int64_t h, int64_t i, int64_t j, uint32_t c[4]) const {
    if (shared) b = h = 0;
    c[0] = uint32_t(j / 32 * 8 + j % 8);
    c[1] = uint32_t(i / 16 * 8 + i % 8);
    c[2] = uint32_t(h);
    c[3] = uint32_t(b);
  }

  JAX_FLASH_HOST_DEVICE Philox4x32Words Bits(int64_t b, int64_t h, int64_t i, int64_t j) const {
    uint32_t c[4];
    Counter(b, h, i, j, c);
    return Philox4x32(k0, k1, c[0], c[1], c[2], c[3]);
  }

  // Whether the pair whose word is `word` and row half `half` is kept.
  JAX_FLASH_HOST_DEVICE bool Kept(uint32_t word, int half) const {
    return (half ? word >> 16 : word & 0xFFFFu) >= threshold;
  }

  // Which of the 8 pairs of one call are kept: rows i0 and i0 + 8
  // (i0 % 16 < 8) against keys j0 + 8 w (j0 % 32 < 8), as bit w + 4 * half
  // (half 1: row i0 + 8). The tensor-core kernels take a whole call per use.
  JAX_FLASH_HOST_DEVICE uint32_t KeepBits8(int64_t b, int64_t h, int64_t i0, int64_t j0) const {
    const Philox4x32Words bits = Bits(b, h, i0, j0);
    uint32_t keep = 0;
    for (int w = 0; w < 4; ++w)
      keep |= uint32_t(Kept(bits.w[w], 0)) << w | uint32_t(Kept(bits.w[w], 1)) << (w + 4);
    return keep;
  }

  // The multiplier of P for element (b, h, i, j) alone, 0 (dropped) or
  // 1 / (1 - rate), at the cost of a whole call. The word is picked by
  // selects, not by indexing bits.w at run time, which would put the array
  // in a GPU thread's local memory.
  JAX_FLASH_HOST_DEVICE float Factor(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const Philox4x32Words bits = Bits(b, h, i, j);
    const int64_t word = j % 32 / 8;
    const uint32_t w = word == 0 ? bits.w[0] : word == 1 ? bits.w[1] : word == 2 ? bits.w[2] : bits.w[3];
    return Kept(w, int(i % 16 / 8)) ? keep_scale : 0.0f;
  }
};

}  // namespace jax_flash
