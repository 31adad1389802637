// Paged attention on the CPU: the blocked online softmax of attention_cpu.cc
// (same tiles, logit transform, visibility policy and softmax row update,
// cpu/tiles.h), with keys and values gathered 64 positions at a time through
// the block table instead of read at a fixed stride. O(T) memory: one set of
// 64-row tiles per task, never a [Tq, S] buffer.
//
// One task per (sequence, key head, block of packed query rows). The G query
// heads that share a key head (GQA) are packed into the rows of one tile,
// head-major: row R is query head g = R / Tq of the group at token t = R % Tq.
// A decode step (Tq = 1) with 4 heads per key head then reads each key and
// value row once for 4 query rows instead of once per query head.
#include "cpu/paged_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/mask_policy.h"
#include "cpu/block_math.h"
#include "cpu/element.h"
#include "cpu/parallel.h"
#include "cpu/tiles.h"

namespace jax_flash::cpu {
namespace {

// Visibility of one sequence in absolute positions: a query at position i
// (len - Tq + t, negative for tokens before the sequence's start) sees keys
// max(0, i - window_left) <= j <= i, j < len. MaskPolicy's causal rule is
// top-left aligned, which is exactly this once queries are indexed by their
// positions; its seqlen_q = len keeps every real query row (all positions are
// below len) and hides nothing else.
MaskPolicy PagedMask(const PagedParams& p, int64_t len) {
  MaskPolicy m;
  m.seqlen_q = len;
  m.seqlen_k = len;
  m.causal = true;
  m.window_left = p.window_left;
  m.window_right = -1;
  return m;
}

template <typename Element>
void PagedTask(const PagedParams& p, int64_t seq, int64_t hk, int64_t m_block) {
  using Acc = typename AccumFor<Element>::type;
  const PagedShape& s = p.shape;
  const int d = int(s.head_dim), dp = PaddedHeadDim(d);
  const int64_t group = s.group(), tq = s.seqlen_q;
  const int64_t r0 = m_block * kBlockM;
  const int rows = int(std::min<int64_t>(kBlockM, group * tq - r0));
  const int64_t len = p.SeqLength(seq);
  const int64_t first_pos = len - tq;  // position of token t = 0
  const MaskPolicy mask = PagedMask(p, len);
  // LogitTransform reads scale, soft cap and bias (none) from AttentionParams.
  AttentionParams logit_params;
  logit_params.scale = p.scale;
  logit_params.features.softcap = p.softcap;
  const LogitTransform<Acc> logits(logit_params, mask, 0, 0);

  const Element* q = static_cast<const Element*>(p.q);
  const Element* k_cache = static_cast<const Element*>(p.k_cache);
  const Element* v_cache = static_cast<const Element*>(p.v_cache);
  Element* out = static_cast<Element*>(p.out);
  auto head_of = [&](int r) { return hk * group + (r0 + r) / tq; };
  auto token_of = [&](int r) { return (r0 + r) % tq; };

  thread_local std::vector<Acc> buf;
  buf.resize(size_t(kBlockM) * dp * 2 + size_t(dp) * kBlockN + size_t(kBlockN) * dp +
             kBlockM * kBlockN + 2 * kBlockM);
  Acc* q_blk = buf.data();                   // [kBlockM][dp] packed query rows
  Acc* o_acc = q_blk + kBlockM * dp;         // [kBlockM][dp]
  Acc* kt_blk = o_acc + kBlockM * dp;        // [dp][kBlockN]  (K transposed)
  Acc* v_blk = kt_blk + dp * kBlockN;        // [kBlockN][dp]
  Acc* s_blk = v_blk + kBlockN * dp;         // [kBlockM][kBlockN] logits, then P
  Acc* row_max = s_blk + kBlockM * kBlockN;  // running max (log2 units)
  Acc* row_sum = row_max + kBlockM;          // running sum of P

  LoadRowsFrom<Element>([&](int r) { return q + p.QueryOffset(seq, token_of(r), head_of(r)); },
                        rows, d, Acc(1), q_blk, dp);
  std::fill(o_acc, o_acc + kBlockM * dp, Acc(0));
  std::fill(row_max, row_max + kBlockM, NegInf<Acc>());
  std::fill(row_sum, row_sum + kBlockM, Acc(0));

  // The tokens of the block's rows: a stretch of one head's, or all of them
  // once the block reaches into the next head.
  const bool one_head = rows <= tq - token_of(0);
  const int64_t t_lo = one_head ? token_of(0) : 0;
  const int64_t t_hi = one_head ? token_of(rows - 1) : tq - 1;
  int64_t kv_lo, kv_hi;
  mask.KeyRange(first_pos + t_lo, first_pos + t_hi + 1, &kv_lo, &kv_hi);
  for (int64_t k0 = FloorTo(std::max<int64_t>(kv_lo, 0), kBlockN); k0 < kv_hi; k0 += kBlockN) {
    const int cols = int(std::min<int64_t>(kBlockN, len - k0));
    // Positions k0 .. k0 + cols of this sequence, wherever their blocks lie.
    auto key_row = [&](const Element* cache) {
      return [&, cache](int c) { return cache + p.CacheOffset(seq, k0 + c, hk); };
    };
    LoadRowsTransposedFrom<Element>(key_row(k_cache), cols, d, dp, kt_blk);
    LoadRowsFrom<Element>(key_row(v_cache), cols, d, Acc(1), v_blk, dp);
    std::fill(v_blk + cols * dp, v_blk + kBlockN * dp, Acc(0));

    std::fill(s_blk, s_blk + kBlockM * kBlockN, Acc(0));
    GemmAcc(rows, kBlockN, dp, q_blk, dp, kt_blk, kBlockN, s_blk, kBlockN);  // S = Q K^T
    // The transform takes consecutive query positions: one call per run of
    // rows of one head (the tokens t0 .. t0 + n of head g).
    for (int r = 0; r < rows;) {
      const int run = int(std::min<int64_t>(rows - r, tq - token_of(r)));
      logits.Apply(s_blk + r * kBlockN, first_pos + token_of(r), run, k0, cols, nullptr);
      r += run;
    }
    for (int r = 0; r < rows; ++r) {
      Acc* srow = s_blk + r * kBlockN;
      const Acc alpha = OnlineSoftmaxRow(srow, &row_max[r], &row_sum[r]);
      Acc* orow = o_acc + r * dp;
      for (int c = 0; c < dp; ++c) orow[c] *= alpha;
    }
    GemmAcc(rows, dp, kBlockN, s_blk, kBlockN, v_blk, dp, o_acc, dp);  // O += P V
  }

  // Rows that saw no key (tokens at negative positions) get zeros and lse -inf.
  for (int r = 0; r < rows; ++r) {
    const Acc l = row_sum[r];
    const Acc inv = l > 0 ? Acc(1) / l : Acc(0);
    const int64_t t = token_of(r), h = head_of(r);
    Element* orow = out + p.QueryOffset(seq, t, h);
    for (int c = 0; c < d; ++c) orow[c] = FromFloat<Element>(o_acc[r * dp + c] * inv);
    static_cast<Acc*>(p.lse)[p.LseIndex(seq, h, t)] =
        l > 0 ? (row_max[r] + std::log2(l)) * Acc(kLn2F64) : NegInf<Acc>();
  }
}

}  // namespace

template <typename Element>
void PagedAttentionForward(const PagedParams& p) {
  const PagedShape& s = p.shape;
  const int64_t m_blocks = CeilDiv(s.group() * s.seqlen_q, kBlockM);
  const int64_t per_seq = s.num_heads_k * m_blocks;
  ParallelFor(s.outer * s.batch * per_seq, [&](int64_t task) {
    const int64_t seq = task / per_seq, rest = task % per_seq;
    PagedTask<Element>(p, seq, rest / m_blocks, rest % m_blocks);
  });
}

template void PagedAttentionForward<float>(const PagedParams&);
template void PagedAttentionForward<double>(const PagedParams&);
template void PagedAttentionForward<Float16>(const PagedParams&);
template void PagedAttentionForward<BFloat16>(const PagedParams&);

}  // namespace jax_flash::cpu
