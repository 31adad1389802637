// Host check of the block classification in MaskPolicy (common/mask_policy.h)
// against per-element visibility (MaskPolicy::Visible): random lengths,
// causal, windows, position offsets (diagonals of either sign), masks and
// segment ids (sorted packed documents, unsorted,
// non-contiguous), with the segment ids' block summaries built as
// jax_flash.attention builds them (segment_block_ranges), and blocks of the
// kernels' sizes (64, 128) and of sizes that are not multiples of the
// summaries' (48, 96, 200), at any offset, tails past the lengths included.
// For every block it checks:
//   BlockEmpty          => no pair of the block is visible;
//   KeyRange, QueryRange of the block's rows / keys hold every visible pair;
//   !NeedsCheck         => every pair of the block is visible;
//   Segments == kAll    => every pair's ids are equal, and WithoutSegments()
//                          gives every pair the same visibility;
//   and, for packed documents (ids 0, 1, 2, ... in runs) without other masks
//   and blocks of whole summaries, that BlockEmpty is exact: a block it keeps
//   has a visible pair.
// Built with AddressSanitizer by tests/test_block_class.py, so reads past the
// id, summary or mask arrays fail too. Exit status 0 = all agree.
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "common/mask_policy.h"

using namespace jax_flash;

namespace {

// (min, max) of every kSegmentBlock ids, as attention.py's segment_block_ranges.
std::vector<int32_t> BlockRanges(const std::vector<int32_t>& ids) {
  const int64_t n = int64_t(ids.size()), blocks = (n + kSegmentBlock - 1) / kSegmentBlock;
  std::vector<int32_t> ranges(2 * blocks);
  for (int64_t e = 0; e < blocks; ++e) {
    const auto first = ids.begin() + e * kSegmentBlock;
    const auto last = ids.begin() + std::min(n, (e + 1) * kSegmentBlock);
    ranges[2 * e] = *std::min_element(first, last);
    ranges[2 * e + 1] = *std::max_element(first, last);
  }
  return ranges;
}

// Segment ids of one kind: 0 packed documents (sorted runs 0, 1, 2, ...),
// 1 unsorted random ids, 2 runs of non-contiguous ids (a document's id
// appears again later), 3 one id everywhere.
std::vector<int32_t> MakeIds(std::mt19937& rng, int n, int kind) {
  std::vector<int32_t> ids(n);
  if (kind == 1) {
    for (auto& x : ids) x = rng() % 4;
    return ids;
  }
  if (kind == 3) return std::vector<int32_t>(n, 7);
  int32_t id = 0;
  for (int i = 0; i < n;) {
    const int run = 1 + rng() % (kind == 0 ? 150 : 90);
    for (int r = 0; r < run && i < n; ++r) ids[i++] = id;
    id = kind == 0 ? id + 1 : int32_t(rng() % 4);
  }
  return ids;
}

struct Counts {
  long blocks = 0, empty = 0, full = 0, all_meet = 0, mismatched = 0;
};

}  // namespace

int main() {
  std::mt19937 rng(20261201);
  Counts n;
  const int sizes[] = {48, 64, 96, 128, 200};
  for (int trial = 0; trial < 1500; ++trial) {
    const int tq = 1 + rng() % 400, tk = 1 + rng() % 400;
    const int id_kind = rng() % 4;
    const bool packed_only = trial % 3 == 0;  // packed documents and nothing else: exactness
    // Exact-size arrays, so AddressSanitizer sees any read past their ends.
    std::vector<int32_t> q_ids = MakeIds(rng, tq, packed_only ? 0 : id_kind);
    std::vector<int32_t> kv_ids = packed_only && tq == tk ? q_ids : MakeIds(rng, tk, packed_only ? 0 : id_kind);
    const std::vector<int32_t> q_ranges = BlockRanges(q_ids), kv_ranges = BlockRanges(kv_ids);
    const int mask_kind = packed_only ? 0 : rng() % 4;  // none, [T, S], key padding [1, S], [T, 1]
    const int mask_rows = mask_kind == 2 ? 1 : tq, mask_cols = mask_kind == 3 ? 1 : tk;
    std::vector<uint8_t> mask(mask_rows * mask_cols);
    for (auto& x : mask) x = rng() % 4 != 0;

    MaskPolicy m;
    m.seqlen_q = tq;
    m.seqlen_k = tk;
    if (!packed_only) {
      m.seqlen_q -= rng() % 3 == 0 ? int(rng() % tq) : 0;  // effective lengths
      m.seqlen_k -= rng() % 3 == 0 ? int(rng() % tk) : 0;
      m.causal = rng() % 2;
      m.window_left = rng() % 2 ? int(rng() % 120) : -1;
      m.window_right = rng() % 2 ? int(rng() % 120) : -1;
      // Position offsets (a ring shard, new tokens over a cache), either sign.
      m.diagonal = rng() % 3 == 0 ? int(rng() % 400) - 200 : 0;
    }
    const bool with_ids = packed_only || rng() % 4 != 0;
    if (with_ids) {
      m.q_segments = q_ids.data();
      m.kv_segments = kv_ids.data();
      m.q_ranges = SegmentRanges{q_ranges.data(), int64_t(q_ranges.size() / 2)};
      m.kv_ranges = SegmentRanges{kv_ranges.data(), int64_t(kv_ranges.size() / 2)};
    }
    if (mask_kind) {
      m.mask = mask.data();
      m.mask_row = mask_kind == 2 ? 0 : mask_cols;
      m.mask_col = mask_kind == 3 ? 0 : 1;
    }
    const int bm = sizes[rng() % 5], bn = sizes[rng() % 5];
    for (int64_t i0 = 0; i0 < tq; i0 += bm)
      for (int64_t j0 = 0; j0 < tk; j0 += bn) {
        const int64_t i1 = i0 + bm, j1 = j0 + bn;  // may pass the arrays' ends (tails)
        bool any_visible = false, all_visible = true, ids_equal = true, same_without = true;
        bool in_ranges = true;  // every visible pair inside KeyRange / QueryRange of its block
        int64_t k_lo, k_hi, q_lo, q_hi;
        m.KeyRange(i0, i1, &k_lo, &k_hi);
        m.QueryRange(j0, j1, &q_lo, &q_hi);
        const MaskPolicy without = m.WithoutSegments();
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = j0; j < j1; ++j) {
            const bool in = i < tq && j < tk;
            const bool v = in && m.Visible(i, j);
            any_visible |= v;
            all_visible &= v;
            if (v) in_ranges &= k_lo <= j && j < k_hi && q_lo <= i && i < q_hi;
            if (in && with_ids) ids_equal &= q_ids[i] == kv_ids[j];
            same_without &= v == (in && without.Visible(i, j));
          }
        const bool empty = m.BlockEmpty(i0, i1, j0, j1);
        const bool needs_check = m.NeedsCheck(i0, i1, j0, j1);
        const bool all_meet = with_ids && m.Segments(i0, i1, j0, j1) == SegmentMeet::kAll;
        bool ok = !(empty && any_visible) && !(!needs_check && !all_visible) && in_ranges;
        if (all_meet) ok &= ids_equal && same_without;
        if (packed_only && bm % kSegmentBlock == 0 && bn % kSegmentBlock == 0)
          ok &= empty == !any_visible;
        n.mismatched += !ok;
        ++n.blocks;
        n.empty += empty;
        n.full += !needs_check;
        n.all_meet += all_meet;
        if (!ok && n.mismatched <= 5)
          std::printf("mismatch: trial %d block [%ld, %ld) x [%ld, %ld) empty=%d any=%d check=%d all=%d\n",
                      trial, long(i0), long(i1), long(j0), long(j1), empty, any_visible, needs_check,
                      all_visible);
      }
  }
  std::printf("checked %ld blocks (%ld empty, %ld full, %ld of one segment), %ld mismatched\n",
              n.blocks, n.empty, n.full, n.all_meet, n.mismatched);
  // The classes the kernels act on must all have occurred.
  return n.mismatched == 0 && n.empty > 0 && n.full > 0 && n.all_meet > 0 ? 0 : 1;
}
