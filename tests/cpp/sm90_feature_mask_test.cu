// Host check of the sm90 forward's feature masks (ffi/cuda/sm90/feature_mask.cuh)
// against the definition of visibility (jax_flash/reference.py, offsets as in
// common/mask_policy.h), for random lengths, causal, windows, offsets and
// segment ids (documents with summaries, scattered ids, ids without
// summaries), at both key blocks (128; 80 at head dim 256):
//   - a tile's key blocks (FeatureKeyBlocks' KeyRange part) hold every
//     visible pair of its 128 rows, and a block the segment summaries call
//     empty (what its trim drops) holds none; SummarySpan, the kernel's
//     reading of the summaries, equals SegmentRanges::Span;
//   - FeatureBlockMask (FeatureRows::For once per tile, then Block per key
//     block), for every warp and lane of the two consumer warpgroups, marks
//     exactly the visible pairs of its fragment (rows g, g + 8; columns
//     8j + 2t + e), and skips the element work ("no check") exactly where
//     the policy says no pair needs one (NeedsBoundsCheck false, segment
//     ids all meeting), so the int32 fast test is the policy's;
//   - ColumnRangeBits, the masks of a column range, for every range;
//   - KeyBallotBits, a key-only mask's ballots in the fragment's layout,
//     at 128 and 64 keys;
//   - the backward's (bwd_kernel.cuh) the same from the key side: a tile of
//     128 keys' query blocks of 64 and of 128 (the Rows128 schedules;
//     FeatureQueryBlocks' QueryRange part)
//     hold every visible pair of its keys, a query block its segment trim
//     would drop holds none, and FeatureStepMask, for every warp and lane,
//     marks exactly the visible pairs of its S^T fragment (keys g, g + 8;
//     queries 8j + 2t + e; 64-bit words at 128 queries), and
//     FeatureStepClass calls a warp's step hidden or visible only where
//     every lane's bits are 0 or all ones;
//   - the backward's bias (BiasColumns: For once per tile, Load per step,
//     ToLogits), for every warp and lane of both consumer warpgroups and
//     every step and head, puts bias[b, h, query, key] / scale of each of
//     its S^T pairs where S^T's fragment holds that pair, for float32, bf16
//     and f16 biases broadcast over any of batch, heads and queries, 0 for
//     keys past S, the last row for queries past T, and reads nothing
//     outside the bias (each bias its exact size: AddressSanitizer, where
//     run_host_check has it, fails any other read).
// Exit status 0 = all hold.
#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

#include "cuda/sm90/feature_mask.cuh"

using namespace jax_flash;
using namespace jax_flash::cuda::sm90;

namespace {

struct Spec {
  int T, S;
  bool causal;
  int q_len, kv_len, offset;  // each only with its flag (lengths below 0 count as 0)
  bool q_lens, kv_lens, offsets;
  long long left, right;
  int segments;  // 0 none, 1 documents, 2 scattered, 3 documents without summaries
  int doc;       // document length (segments 1, 3)
  // The backward only: a key-only boolean mask ([1, 1, 1, S], one byte per
  // key; its key stride key_stride), empty when none.
  std::vector<uint8_t> key_mask;
  int key_stride = 1;
  // Or a per-query one ([1, 1, T, S]: query i's bytes from i * dense_row,
  // key stride key_stride), empty when none.
  std::vector<uint8_t> dense_mask;
  int dense_row = 0;
  // With it, its block summary (MaskBlocks: 64 x 64 entries, MaskSummary)
  // or none.
  bool summary = false;
};

// The per-query mask's block summary, as jax_flash/_kernel_call.py's
// mask_block_summary builds it: per 64 x 64 entry, kMaskBlockSome where a
// pair of the mask's T x S is visible, kMaskBlockAll where all are.
std::vector<uint8_t> MaskSummary(const Spec& c) {
  const int rows = (c.T + 63) / 64, cols = (c.S + 63) / 64;
  std::vector<uint8_t> blocks(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int col = 0; col < cols; ++col) {
      bool some = false, all = true;
      for (int i = 64 * r; i < std::min(c.T, 64 * r + 64); ++i)
        for (int j = 64 * col; j < std::min(c.S, 64 * col + 64); ++j) {
          const bool v = c.dense_mask[size_t(i) * c.dense_row + size_t(j) * c.key_stride] != 0;
          some |= v;
          all &= v;
        }
      blocks[size_t(r) * cols + col] = uint8_t((some ? kMaskBlockSome : 0) | (all ? kMaskBlockAll : 0));
    }
  return blocks;
}

// Whether the mask alone shows (want_visible) or hides every pair of
// queries [i0, i1) x keys [j0, j1), clipped to T x S.
bool MaskAll(const Spec& c, int i0, int i1, int j0, int j1, bool want_visible) {
  for (int i = i0; i < std::min(i1, c.T); ++i)
    for (int j = j0; j < std::min(j1, c.S); ++j)
      if ((c.dense_mask[size_t(i) * c.dense_row + size_t(j) * c.key_stride] != 0) != want_visible) return false;
  return true;
}

bool Visible(const Spec& c, const std::vector<int32_t>& q_ids, const std::vector<int32_t>& kv_ids, long long i,
             long long j) {
  const long long lq = c.q_lens ? std::max(0, std::min(c.q_len, c.T)) : c.T;
  const long long lk = c.kv_lens ? std::max(0, std::min(c.kv_len, c.S)) : c.S;
  const long long d = c.offsets ? c.offset : 0;
  if (i < 0 || j < 0 || i >= lq || j >= lk) return false;
  if (c.causal && j > i + d) return false;
  if (c.left >= 0 && j < i + d - c.left) return false;
  if (c.right >= 0 && j > i + d + c.right) return false;
  if (c.segments && q_ids[i] != kv_ids[j]) return false;
  if (!c.key_mask.empty() && c.key_mask[size_t(j) * c.key_stride] == 0) return false;
  if (!c.dense_mask.empty() && c.dense_mask[size_t(i) * c.dense_row + size_t(j) * c.key_stride] == 0) return false;
  return true;
}

std::vector<int32_t> Ids(const Spec& c, int len) {
  std::vector<int32_t> ids(len);
  for (int p = 0; p < len; ++p) ids[p] = c.segments == 2 ? (p / 37) % 3 : p / c.doc;
  return ids;
}

std::vector<int32_t> Ranges(const std::vector<int32_t>& ids) {
  const int len = int(ids.size()), blocks = int((len + kSegmentBlock - 1) / kSegmentBlock);
  std::vector<int32_t> r(2 * blocks);
  for (int e = 0; e < blocks; ++e) {
    int32_t lo = ids[e * kSegmentBlock], hi = lo;
    for (int p = int(e * kSegmentBlock); p < std::min<int>(len, int((e + 1) * kSegmentBlock)); ++p)
      lo = std::min(lo, ids[p]), hi = std::max(hi, ids[p]);
    r[2 * e] = lo, r[2 * e + 1] = hi;
  }
  return r;
}

template <int kBlockN>
long Check(const Spec& c, long* checked) {
  constexpr int kBlockM = 128;
  long failures = 0;
  const std::vector<int32_t> q_ids = c.segments ? Ids(c, c.T) : std::vector<int32_t>{};
  const std::vector<int32_t> kv_ids = c.segments ? Ids(c, c.S) : std::vector<int32_t>{};
  const std::vector<int32_t> q_ranges = c.segments == 1 || c.segments == 2 ? Ranges(q_ids) : std::vector<int32_t>{};
  const std::vector<int32_t> kv_ranges = c.segments == 1 || c.segments == 2 ? Ranges(kv_ids) : std::vector<int32_t>{};
  const int32_t q_len = c.q_len, kv_len = c.kv_len, offset = c.offset;
  AttentionParams p;
  p.shape = {1, c.T, c.S, 1, 1, 64};
  p.is_causal = c.causal;
  p.scale = 0.125;
  if (c.q_lens) p.features.q_seqlens = &q_len;
  if (c.kv_lens) p.features.kv_seqlens = &kv_len;
  if (c.offsets) p.features.position_offsets = &offset;
  p.features.window_left = c.left;
  p.features.window_right = c.right;
  if (c.segments) {
    p.features.q_segment_ids = q_ids.data();
    p.features.kv_segment_ids = kv_ids.data();
    if (!q_ranges.empty()) p.features.q_segment_ranges = q_ranges.data(), p.features.kv_segment_ranges = kv_ranges.data();
  }
  auto fail = [&](const char* what, int m0, int n0, long long i, long long j) {
    if (failures++ < 5)
      std::printf("FAIL %s (T %d S %d causal %d q_len %d(%d) kv_len %d(%d) offset %d(%d) window (%lld, %lld) segments %d "
                  "doc %d, block %d x %d: tile %d, keys %d, pair (%lld, %lld))\n",
                  what, c.T, c.S, int(c.causal), c.q_len, int(c.q_lens), c.kv_len, int(c.kv_lens), c.offset,
                  int(c.offsets), c.left, c.right,
                  c.segments, c.doc, kBlockM, kBlockN, m0, n0, i, j);
  };
  const MaskPolicy policy = MaskPolicy::For(p, 0, 0);
  for (int m0 = 0; m0 < c.T; m0 += kBlockM) {
    // FeatureKeyBlocks before its segment trim (a device-only warp vote).
    int64_t lo, hi;
    policy.KeyRange(m0, int64_t(m0) + kBlockM, &lo, &hi);
    const int n_lo = hi > lo ? int(lo / kBlockN) : 0, n_hi = hi > lo ? int((hi + kBlockN - 1) / kBlockN) : 0;
    for (long long i = m0; i < std::min(c.T, m0 + kBlockM); ++i)
      for (long long j = 0; j < c.S; ++j)
        if (Visible(c, q_ids, kv_ids, i, j) && (j < int64_t(n_lo) * kBlockN || j >= int64_t(n_hi) * kBlockN))
          fail("a visible pair outside the tile's key blocks", m0, -1, i, j);
    for (int nb = n_lo; nb < n_hi; ++nb) {
      const int n0 = nb * kBlockN;
      if (policy.HasSegmentRanges()) {
        // SummarySpan (what the kernel reads) is the policy's Span.
        const IdSpan rows = SummarySpan<kBlockM>(policy.q_ranges, m0), keys = SummarySpan<kBlockN>(policy.kv_ranges, n0);
        const IdSpan rows_ref = policy.QueryIds(m0, int64_t(m0) + kBlockM);
        const IdSpan keys_ref = policy.KeyIds(n0, int64_t(n0) + kBlockN);
        if (rows.lo != rows_ref.lo || rows.hi != rows_ref.hi || keys.lo != keys_ref.lo || keys.hi != keys_ref.hi)
          fail("SummarySpan differs from SegmentRanges::Span", m0, n0, -1, -1);
        for (int warp = 0; warp < 8; ++warp) {
          const IdSpan w = SummarySpan<16>(policy.q_ranges, m0 + 16 * warp);
          const IdSpan w_ref = policy.QueryIds(m0 + 16 * warp, int64_t(m0) + 16 * warp + 16);
          if (w.lo != w_ref.lo || w.hi != w_ref.hi) fail("SummarySpan<16> differs from Span", m0, n0, -1, -1);
        }
      }
      if (policy.HasSegmentRanges() &&
          Meet(SummarySpan<kBlockM>(policy.q_ranges, m0), SummarySpan<kBlockN>(policy.kv_ranges, n0)) ==
              SegmentMeet::kNone)
        for (long long i = m0; i < std::min(c.T, m0 + kBlockM); ++i)
          for (long long j = n0; j < std::min(c.S, n0 + kBlockN); ++j)
            if (Visible(c, q_ids, kv_ids, i, j)) fail("a visible pair in a block the trim drops", m0, n0, i, j);
      for (int warp = 0; warp < 8; ++warp)
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, t = lane % 4, warp_i0 = m0 + 16 * warp, row = warp_i0 + g;
          const BlockMask mask = FeatureBlockMask<kBlockN>(p, 0, warp_i0, row, t, n0);
          const bool skip = policy.Segments(warp_i0, int64_t(warp_i0) + 16, n0, int64_t(n0) + kBlockN) ==
                                SegmentMeet::kAll &&
                            !policy.NeedsBoundsCheck(warp_i0, int64_t(warp_i0) + 16, n0, int64_t(n0) + kBlockN);
          if (mask.check == skip) fail(skip ? "element masks where the policy needs none" : "a needed check skipped",
                                       m0, n0, row, -1);
          for (int hh = 0; hh < 2; ++hh)
            for (int j = 0; j < kBlockN / 8; ++j)
              for (int e = 0; e < 2; ++e) {
                const long long i = row + 8 * hh, col = n0 + 8 * j + 2 * t + e;
                const bool got = !mask.check || (mask.visible[hh] >> (2 * j + e) & 1u);
                // Rows and keys past the shape are never written or are
                // zero-filled by TMA: they must be hidden too (the row's lse).
                const bool want = i < c.T && col < c.S && Visible(c, q_ids, kv_ids, i, col);
                ++*checked;
                if (got != want) fail(got ? "a hidden pair marked visible" : "a visible pair hidden", m0, n0, i, col);
              }
        }
    }
  }
  return failures;
}

// How often each FeatureStepClass came up in CheckBackward (each must, or
// the class check proves nothing).
long class_counts[3] = {0, 0, 0};

// The backward's tiles (128 keys) and steps (kBlockM queries: 64, or 128
// for the Rows128 schedules, whose step masks are 64-bit words).
template <int kBlockM>
long CheckBackward(const Spec& c, long* checked) {
  constexpr int kBlockN = 128;
  long failures = 0;
  const std::vector<int32_t> q_ids = c.segments ? Ids(c, c.T) : std::vector<int32_t>{};
  const std::vector<int32_t> kv_ids = c.segments ? Ids(c, c.S) : std::vector<int32_t>{};
  const std::vector<int32_t> q_ranges = c.segments == 1 || c.segments == 2 ? Ranges(q_ids) : std::vector<int32_t>{};
  const std::vector<int32_t> kv_ranges = c.segments == 1 || c.segments == 2 ? Ranges(kv_ids) : std::vector<int32_t>{};
  const int32_t q_len = c.q_len, kv_len = c.kv_len, offset = c.offset;
  AttentionParams p;
  p.shape = {1, c.T, c.S, 1, 1, 64};
  p.is_causal = c.causal;
  p.scale = 0.125;
  if (c.q_lens) p.features.q_seqlens = &q_len;
  if (c.kv_lens) p.features.kv_seqlens = &kv_len;
  if (c.offsets) p.features.position_offsets = &offset;
  p.features.window_left = c.left;
  p.features.window_right = c.right;
  if (c.segments) {
    p.features.q_segment_ids = q_ids.data();
    p.features.kv_segment_ids = kv_ids.data();
    if (!q_ranges.empty()) p.features.q_segment_ranges = q_ranges.data(), p.features.kv_segment_ranges = kv_ranges.data();
  }
  if (!c.key_mask.empty()) {
    p.features.mask = c.key_mask.data();
    p.features.mask_stride.col = c.key_stride;  // row (query), head and batch strides 0
  }
  std::vector<uint8_t> summary;
  if (!c.dense_mask.empty()) {
    p.features.mask = c.dense_mask.data();
    p.features.mask_stride.row = c.dense_row;
    p.features.mask_stride.col = c.key_stride;
    if (c.summary) {
      summary = MaskSummary(c);
      p.features.mask_blocks = summary.data();
      p.features.mask_block_rows = (c.T + 63) / 64;
      p.features.mask_block_cols = (c.S + 63) / 64;
      p.features.mask_blocks_stride.row = p.features.mask_block_cols;
      p.features.mask_blocks_stride.col = 1;
    }
  }
  auto fail = [&](const char* what, int n0, int m0, long long i, long long j) {
    if (failures++ < 5)
      std::printf("FAIL backward: %s (key mask %d dense %d summary %d, T %d S %d causal %d q_len %d(%d) kv_len %d(%d) offset %d(%d) window (%lld, "
                  "%lld) segments %d doc %d: tile keys %d, step queries %d, pair (%lld, %lld))\n",
                  what, int(!c.key_mask.empty()), int(!c.dense_mask.empty()), int(c.summary), c.T, c.S, int(c.causal), c.q_len, int(c.q_lens), c.kv_len,
                  int(c.kv_lens), c.offset, int(c.offsets), c.left, c.right, c.segments, c.doc, n0, m0, i, j);
  };
  const MaskPolicy policy = MaskPolicy::For(p, 0, 0);
  for (int n0 = 0; n0 < c.S; n0 += kBlockN) {
    // FeatureQueryBlocks before its segment trim (a device-only warp vote).
    int64_t lo, hi;
    policy.QueryRange(n0, int64_t(n0) + kBlockN, &lo, &hi);
    const int m_lo = hi > lo ? int(lo / kBlockM) : 0, m_hi = hi > lo ? int((hi + kBlockM - 1) / kBlockM) : 0;
    for (long long j = n0; j < std::min(c.S, n0 + kBlockN); ++j)
      for (long long i = 0; i < c.T; ++i)
        if (Visible(c, q_ids, kv_ids, i, j) && (i < int64_t(m_lo) * kBlockM || i >= int64_t(m_hi) * kBlockM))
          fail("a visible pair outside the tile's query blocks", n0, -1, i, j);
    // The summary's answers, which the trims (FeatureKeyBlocks for the
    // forward's 128-row tiles, FeatureQueryBlocks for the backward's steps,
    // device-only warp votes) and the per-block reads (the forward
    // consumers' 64 rows, MaskBlockEntries; the backward's FeatureStepMask,
    // checked below) act on: no kMaskBlockSome only where the mask hides
    // every pair, kMaskBlockAll only where it shows every one.
    if (!summary.empty()) {
      const MaskBlocks blocks = MaskBlocks::For(p.features, 0, 0);
      for (int rows : {64, 128, kBlockM})
        for (int i0 = 0; i0 < c.T; i0 += rows) {
          const uint32_t bits = blocks.Span(i0, i0 + rows, n0, n0 + kBlockN);
          // The kernels' unrolled form (SpanOf) gives the same bits, aligned and not.
          const uint32_t unrolled = rows == 64    ? blocks.SpanOf<64, kBlockN, true>(i0, n0)
                                    : rows == 128 ? blocks.SpanOf<128, kBlockN, true>(i0, n0)
                                                  : blocks.SpanOf<kBlockM, kBlockN, true>(i0, n0);
          if (unrolled != bits) fail("SpanOf differs from Span", n0, i0, -1, -1);
          if (i0 + 40 < c.T && n0 + 56 < c.S && blocks.SpanOf<128, 16>(i0 + 40, n0 + 56) != blocks.Span(i0 + 40, i0 + 168, n0 + 56, n0 + 72))
            fail("SpanOf differs from Span (unaligned)", n0, i0 + 40, -1, -1);
          if (!(bits & kMaskBlockSome) && !MaskAll(c, i0, i0 + rows, n0, n0 + kBlockN, false))
            fail("the summary hides a block with a visible pair", n0, i0, -1, -1);
          if ((bits & kMaskBlockAll) && !MaskAll(c, i0, i0 + rows, n0, n0 + kBlockN, true))
            fail("the summary shows a block with a hidden pair", n0, i0, -1, -1);
          if (rows == 64 && (i0 / 64 + n0 / 128) % 7 == 0) {  // and the consumer's entries, on some blocks
            const uint8_t* row = blocks.entries + std::min(i0 / 64, blocks.rows - 1) * blocks.cols;
            const uint32_t joined = (row[n0 / 64] | row[std::min(n0 / 64 + 1, blocks.cols - 1)]) & kMaskBlockSome;
            const uint32_t both = row[n0 / 64] & row[std::min(n0 / 64 + 1, blocks.cols - 1)] & kMaskBlockAll;
            if ((joined | both) != bits) fail("two entries joined differ from Span", n0, i0, -1, -1);
          }
        }
    }
    for (int mb = m_lo; mb < m_hi; ++mb) {
      const int m0 = mb * kBlockM;
      if (policy.HasSegmentRanges()) {
        const IdSpan rows = SummarySpan<kBlockM>(policy.q_ranges, m0);
        const IdSpan rows_ref = policy.QueryIds(m0, int64_t(m0) + kBlockM);
        if (rows.lo != rows_ref.lo || rows.hi != rows_ref.hi) fail("SummarySpan<kBlockM> differs from Span", n0, m0, -1, -1);
        if (Meet(rows, SummarySpan<kBlockN>(policy.kv_ranges, n0)) == SegmentMeet::kNone)
          for (long long i = m0; i < std::min(c.T, m0 + kBlockM); ++i)
            for (long long j = n0; j < std::min(c.S, n0 + kBlockN); ++j)
              if (Visible(c, q_ids, kv_ids, i, j)) fail("a visible pair in a query block the trim drops", n0, m0, i, j);
      }
      for (int warp = 0; warp < 8; ++warp) {  // both consumer warpgroups' warps: keys n0 + 16 warp ..
        if (policy.HasSegmentRanges()) {
          const IdSpan w = SummarySpan<16>(policy.kv_ranges, n0 + 16 * warp);
          const IdSpan w_ref = policy.KeyIds(n0 + 16 * warp, int64_t(n0) + 16 * warp + 16);
          if (w.lo != w_ref.lo || w.hi != w_ref.hi) fail("SummarySpan<16> differs from Span (keys)", n0, m0, -1, -1);
        }
        // The warp's class (FeatureStepClass, made by the row-statistics
        // warp): hidden only where every lane's bits are 0, visible only
        // where they are all ones.
        const StepClass step_class = FeatureStepClass<kBlockM>(p, 0, 0, m0, n0 + 16 * warp);
        ++class_counts[step_class];
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, t = lane % 4, warp_j0 = n0 + 16 * warp, key = warp_j0 + g;
          const StepMaskBits<kBlockM> visible = FeatureStepMask<kBlockM>(p, 0, 0, m0, warp_j0, key, t);
          if ((step_class == kStepHidden && visible != 0) || (step_class == kStepVisible && ~visible != 0))
            fail(step_class == kStepHidden ? "a step classed hidden has visible bits"
                                           : "a step classed visible has hidden bits",
                 n0, m0, -1, key);
          for (int hh = 0; hh < 2; ++hh)
            for (int j = 0; j < kBlockM / 8; ++j)
              for (int e = 0; e < 2; ++e) {
                const long long kj = key + 8 * hh, qi = m0 + 8 * j + 2 * t + e;
                const bool got = visible >> (kBlockM / 4 * hh + 2 * j + e) & 1u;
                // Keys and queries past the shape are TMA's zero rows: hidden too.
                const bool want = qi < c.T && kj < c.S && Visible(c, q_ids, kv_ids, qi, kj);
                ++*checked;
                if (got != want) fail(got ? "a hidden pair marked visible" : "a visible pair hidden", n0, m0, qi, kj);
              }
        }
      }
    }
  }
  return failures;
}

// An exactly representable bias value of element index i (small integers
// in halves: exact in bf16 and f16), for BiasColumns' check.
template <typename BiasT>
BiasT BiasValue(int64_t i) {
  const float x = float(i % 255) * 0.5f - 60.0f;
  if constexpr (std::is_same_v<BiasT, float>) return x;
  else if constexpr (std::is_same_v<BiasT, __nv_bfloat16>) return __float2bfloat16(x);
  else return __float2half(x);
}
template <typename BiasT>
float BiasFloat(BiasT x) {
  if constexpr (std::is_same_v<BiasT, float>) return x;
  else if constexpr (std::is_same_v<BiasT, __nv_bfloat16>) return __bfloat162float(x);
  else return __half2float(x);
}

// BiasColumns (the backward's bias) against bias[b, h, i, j] / scale at
// every S^T pair of every consumer lane, tile, head and step of kBlockM
// queries: [B|1, N|1, T|1, S], stride 0 along the broadcast dims.
template <typename BiasT, int kBlockM>
long CheckBiasColumns(int B, int N, int T, int S, int broadcast, long* checked) {
  const int bb = broadcast & 1 ? 1 : B, bn = broadcast & 2 ? 1 : N, bt = broadcast & 4 ? 1 : T;
  std::vector<BiasT> bias(size_t(bb) * bn * bt * S);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = BiasValue<BiasT>(int64_t(i) * 7 + 3);
  AttentionParams p;
  p.shape = {B, T, S, N, N, 64};
  p.scale = 0.125;
  p.features.bias = bias.data();
  p.features.num_batch_dims = 1;
  p.features.batch_dims[0] = B;
  p.features.bias_stride.col = 1;
  p.features.bias_stride.row = bt > 1 ? S : 0;
  p.features.bias_stride.head = bn > 1 ? int64_t(bt) * S : 0;
  p.features.bias_stride.batch[0] = bb > 1 ? int64_t(bn) * bt * S : 0;
  const float unscale = float(1.0 / p.scale);
  long failures = 0;
  if (!BiasRowsFit(p) && failures++ < 5) std::printf("FAIL BiasRowsFit refuses a small bias\n");
  for (int b = 0; b < B; ++b)
    for (int n0 = 0; n0 < S; n0 += 128)
      for (int key0 = n0; key0 < n0 + 128; key0 += 16)  // each warp's 16 keys (both warpgroups)
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, t = lane % 4, key = key0 + g;
          const auto columns = BiasColumns<BiasT>::For(p, b, key);
          for (int h = 0; h < N; ++h)
            for (int m0 = 0; m0 < T; m0 += kBlockM) {
              uint32_t raw[kBlockM / 2];
              float s[kBlockM / 2];
              columns.template Load<kBlockM>(raw, p, h, m0, t);
              BiasColumns<BiasT>::template ToLogits<kBlockM>(s, raw, unscale);
              for (int j = 0; j < kBlockM / 8; ++j)
                for (int hh = 0; hh < 2; ++hh)
                  for (int e = 0; e < 2; ++e) {
                    const int kj = key + 8 * hh, qi = std::min(m0 + 8 * j + 2 * t + e, T - 1);
                    const size_t at = ((size_t(bb > 1 ? b : 0) * bn + (bn > 1 ? h : 0)) * bt + (bt > 1 ? qi : 0)) * S + kj;
                    const float want = kj < S ? BiasFloat(bias[at]) * unscale : 0.0f;
                    const float got = s[4 * j + 2 * hh + e];
                    ++*checked;
                    if (got != want && failures++ < 5)
                      std::printf("FAIL BiasColumns<%d bytes, %d>: B %d N %d T %d S %d broadcast %d: b %d h %d step %d "
                                  "lane %d key %d query %d: %g, want %g\n",
                                  int(sizeof(BiasT)), kBlockM, B, N, T, S, broadcast, b, h, m0, lane, kj,
                                  m0 + 8 * j + 2 * t + e, got, want);
                  }
            }
        }
  // A slice past 2^32 elements is refused (the 32-bit row offsets).
  p.shape.seqlen_q = 70000;
  p.features.bias_stride.row = 70000;
  if (BiasRowsFit(p) && failures++ < 5) std::printf("FAIL BiasRowsFit admits a 70000 x 70000 slice\n");
  return failures;
}

// ColumnRangeBits against the per-column definition, for every range.
template <int kTiles>
long CheckColumnRangeBits() {
  long failures = 0;
  for (int lo = -1; lo <= 8 * kTiles; ++lo)
    for (int hi = -1; hi <= 8 * kTiles; ++hi) {
      uint32_t want = 0;
      for (int j = 0; j < kTiles; ++j)
        for (int e = 0; e < 2; ++e)
          if (8 * j + e >= lo && 8 * j + e < hi) want |= 1u << (2 * j + e);
      if (ColumnRangeBits<kTiles>(lo, hi) != want && failures++ < 5)
        std::printf("FAIL ColumnRangeBits<%d>(%d, %d) = %08x, want %08x\n", kTiles, lo, hi,
                    ColumnRangeBits<kTiles>(lo, hi), want);
    }
  return failures;
}

// KeyBallotBits (the forward's key-only mask, MaskArrayRows::ApplyKeys)
// against its definition: lane l's byte i is key kBytes l + i (LoadKeys),
// ballot i has bit l where it is visible, and thread t's bit 2j + e is
// fragment column 8j + 2t + e. Random ballots, and each single key alone.
template <int kBlockN>
long CheckKeyBallotBits(std::mt19937& rng, long* checked) {
  constexpr int kBytes = kBlockN / 32;
  long failures = 0;
  for (int n = 0; n < 2000 + kBlockN; ++n) {
    uint32_t w[kBytes];
    for (int i = 0; i < kBytes; ++i) w[i] = n < kBlockN ? 0u : uint32_t(rng());
    if (n < kBlockN) w[n % kBytes] = 1u << (n / kBytes);  // key n alone
    for (int t = 0; t < 4; ++t) {
      uint32_t want = 0;
      for (int j = 0; j < kBlockN / 8; ++j)
        for (int e = 0; e < 2; ++e) {
          const int key = 8 * j + 2 * t + e;
          want |= ((w[key % kBytes] >> (key / kBytes)) & 1u) << (2 * j + e);
        }
      const uint32_t got = KeyBallotBits<kBlockN>(w, t);
      ++*checked;
      if (got != want && failures++ < 5)
        std::printf("FAIL KeyBallotBits<%d> case %d t %d: %08x, want %08x\n", kBlockN, n, t, got, want);
    }
  }
  return failures;
}

}  // namespace

int main() {
  long failures = CheckColumnRangeBits<16>() + CheckColumnRangeBits<10>();
  std::mt19937 rng(1234);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  long configs = 0, checked = 0;
  failures += CheckKeyBallotBits<128>(rng, &checked) + CheckKeyBallotBits<64>(rng, &checked);
  for (int n = 0; n < 400; ++n) {
    Spec c;
    c.T = uniform(1, 700);
    c.S = uniform(1, 700);
    c.causal = uniform(0, 1);
    c.q_lens = uniform(0, 3) == 0;
    c.q_len = uniform(-5, c.T + 10);
    c.kv_lens = uniform(0, 3) == 0;
    c.kv_len = uniform(-5, c.S + 10);
    c.offsets = uniform(0, 3) == 0;
    c.offset = uniform(-300, 300);
    const int window = uniform(0, 4);
    c.left = window == 1 || window == 3 ? uniform(0, 300) : -1;
    c.right = window == 2 || window == 3 ? uniform(0, 300) : -1;
    c.segments = uniform(0, 4) % 4;
    c.doc = uniform(1, 400);
    failures += Check<128>(c, &checked);
    failures += Check<80>(c, &checked);
    failures += CheckBackward<64>(c, &checked);
    failures += CheckBackward<128>(c, &checked);
    // The backward again with a key-only boolean mask (key padding): random
    // bytes (0 or nonzero), some 16-key runs all hidden and some all
    // visible, contiguous or strided along the keys.
    c.key_stride = uniform(1, 3);
    c.key_mask.assign(size_t(c.S) * c.key_stride, 0);
    for (int j = 0; j < c.S; ++j) {
      const int run = j / 16 % 4;  // 0: random, 1: hidden, 2, 3: visible
      c.key_mask[size_t(j) * c.key_stride] =
          uint8_t(run == 1 ? 0 : run >= 2 ? uniform(1, 255) : uniform(0, 1) * uniform(1, 255));
    }
    failures += CheckBackward<64>(c, &checked);
    failures += CheckBackward<128>(c, &checked);
    c.key_mask.clear();
    // And with a per-query boolean mask: random bytes, patches of 16 x 16,
    // 64 x 64 or 96 x 96 pairs all hidden or all visible (the larger ones
    // make whole summary entries hidden or visible), rows padded (dense_row
    // >= S * key_stride); without its block summary and with it.
    c.dense_row = c.S * c.key_stride + uniform(0, 5);
    c.dense_mask.assign(size_t(c.T) * c.dense_row, 0);
    static const int kSides[3] = {16, 64, 96};
    const int side = kSides[uniform(0, 2)];
    for (int i = 0; i < c.T; ++i)
      for (int j = 0; j < c.S; ++j) {
        const int patch = (i / side + j / side) % 4;  // 0: random, 1: hidden, 2, 3: visible
        c.dense_mask[size_t(i) * c.dense_row + size_t(j) * c.key_stride] =
            uint8_t(patch == 1 ? 0 : patch >= 2 ? uniform(1, 255) : uniform(0, 1) * uniform(1, 255));
      }
    for (bool summary : {false, true}) {
      c.summary = summary;
      failures += CheckBackward<64>(c, &checked);
      failures += CheckBackward<128>(c, &checked);
    }
    c.summary = false;
    c.dense_mask.clear();
    ++configs;
  }
  // The backward's bias: random shapes (tails in T and S, S below one
  // warp's keys), every broadcast, all three types, both step sizes.
  for (int n = 0; n < 24; ++n) {
    const int B = uniform(1, 3), N = uniform(1, 3), T = uniform(1, 300), S = uniform(1, 300), broadcast = n % 8;
    failures += CheckBiasColumns<float, 64>(B, N, T, S, broadcast, &checked);
    failures += CheckBiasColumns<__nv_bfloat16, 64>(B, N, T, S, broadcast, &checked);
    failures += CheckBiasColumns<__half, 128>(B, N, T, S, broadcast, &checked);
    failures += CheckBiasColumns<__nv_bfloat16, 128>(B, N, T, S, broadcast, &checked);
    ++configs;
  }
  std::printf("backward step classes: %ld hidden, %ld visible, %ld checked per element\n", class_counts[kStepHidden],
              class_counts[kStepVisible], class_counts[kStepCheck]);
  for (long count : class_counts)
    if (count == 0 && failures++ < 5) std::printf("FAIL a backward step class never came up\n");
  std::printf("%ld configurations, %ld pairs checked, %ld failures\n", configs, checked, failures);
  return failures == 0 ? 0 : 1;
}
