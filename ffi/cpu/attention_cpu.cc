#include "cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/block_math.h"
#include "cpu/element.h"
#include "cpu/parallel.h"

namespace jax_flash::cpu {
namespace {

// Query and key block sizes. 64 x 64 float blocks (16 KB each) keep the
// working set of one task (S, P, a few Q/K/V tiles) inside L2.
constexpr int kBlockM = 64;
constexpr int kBlockN = 64;
static_assert(kBlockN % kColTile == 0);

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int PaddedHeadDim(int64_t d) { return int(CeilDiv(d, kColTile) * kColTile); }

// Loads rows [row0, row0 + rows) of one head into dst[rows][ld] as Acc,
// multiplied by `mul`; columns past head_dim are zero.
template <typename Element, typename Acc>
void LoadRows(const Element* src, int64_t row_stride, int64_t row0, int rows,
              int head_dim, Acc mul, Acc* dst, int ld) {
  for (int r = 0; r < rows; ++r) {
    const Element* s = src + (row0 + r) * row_stride;
    Acc* d = dst + r * ld;
    for (int c = 0; c < head_dim; ++c) d[c] = Acc(ToFloat(s[c])) * mul;
    for (int c = head_dim; c < ld; ++c) d[c] = Acc(0);
  }
}

// Loads rows [row0, row0 + rows) transposed: dst[c][r], zero-padded to
// [ld_rows][kBlockN] (rows past `rows` and columns past head_dim are zero).
template <typename Element, typename Acc>
void LoadRowsTransposed(const Element* src, int64_t row_stride, int64_t row0,
                        int rows, int head_dim, int padded_dim, Acc* dst) {
  std::fill(dst, dst + int64_t(padded_dim) * kBlockN, Acc(0));
  for (int r = 0; r < rows; ++r) {
    const Element* s = src + (row0 + r) * row_stride;
    for (int c = 0; c < head_dim; ++c) dst[c * kBlockN + r] = Acc(ToFloat(s[c]));
  }
}

// Is key `key` hidden from query `query`? (tails and the causal mask)
inline bool Masked(bool causal, int64_t query, int64_t key, int64_t seqlen_k) {
  return key >= seqlen_k || (causal && key > query);
}

template <typename Element>
void ForwardTask(const AttentionParams& p, int64_t b, int64_t h, int64_t m_block) {
  using Acc = typename AccumFor<Element>::type;
  const auto& s = p.shape;
  const int d = int(s.head_dim), dp = PaddedHeadDim(d);
  const int64_t hk = h / s.group();
  const int64_t q0 = m_block * kBlockM;
  const int rows = int(std::min<int64_t>(kBlockM, s.seqlen_q - q0));

  const Element* q = static_cast<const Element*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head;
  const Element* k = static_cast<const Element*>(p.k) + b * p.k_stride.batch + hk * p.k_stride.head;
  const Element* v = static_cast<const Element*>(p.v) + b * p.k_stride.batch + hk * p.k_stride.head;
  Element* out = static_cast<Element*>(p.out) + b * p.q_stride.batch + h * p.q_stride.head;

  thread_local std::vector<Acc> buf;
  buf.resize(size_t(kBlockM) * dp * 2 + size_t(dp) * kBlockN + size_t(kBlockN) * dp +
             kBlockM * kBlockN + 2 * kBlockM);
  Acc* q_blk = buf.data();                   // [kBlockM][dp], pre-scaled to log2 units
  Acc* o_acc = q_blk + kBlockM * dp;         // [kBlockM][dp]
  Acc* kt_blk = o_acc + kBlockM * dp;        // [dp][kBlockN]  (K transposed)
  Acc* v_blk = kt_blk + dp * kBlockN;        // [kBlockN][dp]
  Acc* s_blk = v_blk + kBlockN * dp;         // [kBlockM][kBlockN] logits, then P
  Acc* row_max = s_blk + kBlockM * kBlockN;  // running max (log2 units)
  Acc* row_sum = row_max + kBlockM;          // running sum of P

  const Acc scale_log2 = Acc(p.scale) * Acc(kLog2eF64);
  LoadRows(q, p.q_stride.row, q0, rows, d, scale_log2, q_blk, dp);
  std::fill(o_acc, o_acc + kBlockM * dp, Acc(0));
  std::fill(row_max, row_max + kBlockM, NegInf<Acc>());
  std::fill(row_sum, row_sum + kBlockM, Acc(0));

  // Causal: query q0 + rows - 1 is the last to look; keys past it are unseen.
  const int64_t kv_end = p.is_causal ? std::min(s.seqlen_k, q0 + rows) : s.seqlen_k;
  for (int64_t k0 = 0; k0 < kv_end; k0 += kBlockN) {
    const int cols = int(std::min<int64_t>(kBlockN, s.seqlen_k - k0));
    LoadRowsTransposed(k, p.k_stride.row, k0, cols, d, dp, kt_blk);
    LoadRows(v, p.k_stride.row, k0, cols, d, Acc(1), v_blk, dp);
    std::fill(v_blk + cols * dp, v_blk + kBlockN * dp, Acc(0));

    std::fill(s_blk, s_blk + kBlockM * kBlockN, Acc(0));
    GemmAcc(rows, kBlockN, dp, q_blk, dp, kt_blk, kBlockN, s_blk, kBlockN);  // S = Q K^T

    const bool needs_mask = cols < kBlockN || (p.is_causal && k0 + kBlockN - 1 > q0);
    for (int r = 0; r < rows; ++r) {
      Acc* srow = s_blk + r * kBlockN;
      if (needs_mask)
        for (int c = 0; c < kBlockN; ++c)
          if (Masked(p.is_causal, q0 + r, k0 + c, s.seqlen_k)) srow[c] = NegInf<Acc>();
      Acc mx = row_max[r];
      for (int c = 0; c < kBlockN; ++c) mx = std::max(mx, srow[c]);
      // A row with nothing visible yet keeps P = 0 (exp2(-inf - 0)).
      const Acc m_use = mx == NegInf<Acc>() ? Acc(0) : mx;
      const Acc alpha = Exp2(row_max[r] - m_use);
      Acc sum = 0;
      for (int c = 0; c < kBlockN; ++c) {
        srow[c] = Exp2(srow[c] - m_use);
        sum += srow[c];
      }
      row_sum[r] = row_sum[r] * alpha + sum;
      row_max[r] = mx;
      Acc* orow = o_acc + r * dp;
      for (int c = 0; c < dp; ++c) orow[c] *= alpha;
    }
    GemmAcc(rows, dp, kBlockN, s_blk, kBlockN, v_blk, dp, o_acc, dp);  // O += P V
  }

  for (int r = 0; r < rows; ++r) {
    const Acc l = row_sum[r];
    const Acc inv = l > 0 ? Acc(1) / l : Acc(0);
    Element* orow = out + (q0 + r) * p.q_stride.row;
    for (int c = 0; c < d; ++c) orow[c] = FromFloat<Element>(o_acc[r * dp + c] * inv);
    static_cast<Acc*>(p.lse)[p.row_stat_index(b, h, q0 + r)] =
        l > 0 ? (row_max[r] + std::log2(l)) * Acc(kLn2F64) : NegInf<Acc>();
  }
}

// delta[i] = sum_c dout[i][c] * out[i][c] for one block of query rows.
template <typename Element>
void DeltaTask(const AttentionParams& p, int64_t b, int64_t h, int64_t m_block) {
  using Acc = typename AccumFor<Element>::type;
  const auto& s = p.shape;
  const int64_t base = b * p.q_stride.batch + h * p.q_stride.head;
  const Element* o = static_cast<const Element*>(p.out) + base;
  const Element* dout = static_cast<const Element*>(p.dout) + base;
  const int64_t q_end = std::min<int64_t>(s.seqlen_q, (m_block + 1) * kBlockM);
  for (int64_t i = m_block * kBlockM; i < q_end; ++i) {
    Acc acc = 0;
    for (int64_t c = 0; c < s.head_dim; ++c)
      acc += Acc(ToFloat(o[i * p.q_stride.row + c])) * Acc(ToFloat(dout[i * p.q_stride.row + c]));
    static_cast<Acc*>(p.delta)[p.row_stat_index(b, h, i)] = acc;
  }
}

// One task of the backward: key blocks n_block, n_block + stride, ... of key
// head hk, for every query head of its group. dK/dV accumulate in the task's
// buffers; dQ contributions go to dq_partial ([heads][seqlen_q][dp] floats for
// this batch entry and split), summed over splits afterwards in a fixed order
// so results are bitwise reproducible.
template <typename Element>
void BackwardTask(const AttentionParams& p, int64_t b, int64_t hk, int64_t split,
                  int64_t num_splits, typename AccumFor<Element>::type* dq_partial) {
  using Acc = typename AccumFor<Element>::type;
  const auto& s = p.shape;
  const int d = int(s.head_dim), dp = PaddedHeadDim(d);
  const Acc scale_log2 = Acc(p.scale) * Acc(kLog2eF64);
  const int64_t k_base = b * p.k_stride.batch + hk * p.k_stride.head;
  const Element* k = static_cast<const Element*>(p.k) + k_base;
  const Element* v = static_cast<const Element*>(p.v) + k_base;
  Element* dk = static_cast<Element*>(p.dk) + k_base;
  Element* dv = static_cast<Element*>(p.dv) + k_base;

  thread_local std::vector<Acc> buf;
  buf.resize(size_t(kBlockN) * dp * 3 + size_t(dp) * kBlockN * 2 + size_t(kBlockM) * dp * 2 +
             size_t(kBlockM) * kBlockN * 3 + 2 * kBlockM);
  Acc* k_blk = buf.data();                    // [kBlockN][dp]
  Acc* dk_acc = k_blk + kBlockN * dp;         // [kBlockN][dp]
  Acc* dv_acc = dk_acc + kBlockN * dp;        // [kBlockN][dp]
  Acc* kt_blk = dv_acc + kBlockN * dp;        // [dp][kBlockN]
  Acc* vt_blk = kt_blk + dp * kBlockN;        // [dp][kBlockN]
  Acc* q_blk = vt_blk + dp * kBlockN;         // [kBlockM][dp]
  Acc* do_blk = q_blk + kBlockM * dp;         // [kBlockM][dp]
  Acc* p_blk = do_blk + kBlockM * dp;         // [kBlockM][kBlockN] P, then dS
  Acc* dp_blk = p_blk + kBlockM * kBlockN;    // [kBlockM][kBlockN] dP
  Acc* t_blk = dp_blk + kBlockM * kBlockN;    // [kBlockN][kBlockM] P^T or dS^T
  Acc* lse2 = t_blk + kBlockN * kBlockM;      // lse in log2 units per query row
  Acc* delta = lse2 + kBlockM;

  const int64_t num_n_blocks = CeilDiv(s.seqlen_k, kBlockN);
  for (int64_t n_block = split; n_block < num_n_blocks; n_block += num_splits) {
    const int64_t k0 = n_block * kBlockN;
    const int cols = int(std::min<int64_t>(kBlockN, s.seqlen_k - k0));
    LoadRows(k, p.k_stride.row, k0, cols, d, Acc(1), k_blk, dp);
    std::fill(k_blk + cols * dp, k_blk + kBlockN * dp, Acc(0));
    LoadRowsTransposed(k, p.k_stride.row, k0, cols, d, dp, kt_blk);
    LoadRowsTransposed(v, p.k_stride.row, k0, cols, d, dp, vt_blk);
    std::fill(dk_acc, dk_acc + kBlockN * dp, Acc(0));
    std::fill(dv_acc, dv_acc + kBlockN * dp, Acc(0));

    for (int64_t g = 0; g < s.group(); ++g) {
      const int64_t h = hk * s.group() + g;
      const int64_t q_base = b * p.q_stride.batch + h * p.q_stride.head;
      const Element* q = static_cast<const Element*>(p.q) + q_base;
      const Element* dout = static_cast<const Element*>(p.dout) + q_base;
      Acc* dq_head = dq_partial + h * s.seqlen_q * dp;
      // Causal: only queries i >= k0 see this key block.
      const int64_t q_start = p.is_causal ? (k0 / kBlockM) * kBlockM : 0;
      for (int64_t q0 = q_start; q0 < s.seqlen_q; q0 += kBlockM) {
        const int rows = int(std::min<int64_t>(kBlockM, s.seqlen_q - q0));
        LoadRows(q, p.q_stride.row, q0, rows, d, Acc(1), q_blk, dp);
        LoadRows(dout, p.q_stride.row, q0, rows, d, Acc(1), do_blk, dp);
        for (int r = 0; r < rows; ++r) {
          const Acc l = static_cast<const Acc*>(p.lse)[p.row_stat_index(b, h, q0 + r)];
          // A row that saw no key (lse = -inf) must get P = 0, not inf.
          lse2[r] = l == NegInf<Acc>() ? -NegInf<Acc>() : l * Acc(kLog2eF64);
          delta[r] = static_cast<const Acc*>(p.delta)[p.row_stat_index(b, h, q0 + r)];
        }
        std::fill(p_blk, p_blk + kBlockM * kBlockN, Acc(0));
        std::fill(dp_blk, dp_blk + kBlockM * kBlockN, Acc(0));
        GemmAcc(rows, kBlockN, dp, q_blk, dp, kt_blk, kBlockN, p_blk, kBlockN);    // S = Q K^T
        GemmAcc(rows, kBlockN, dp, do_blk, dp, vt_blk, kBlockN, dp_blk, kBlockN);  // dP = dO V^T
        const bool needs_mask = cols < kBlockN || (p.is_causal && k0 + kBlockN - 1 > q0);
        for (int r = 0; r < rows; ++r) {
          Acc* prow = p_blk + r * kBlockN;
          const Acc* dprow = dp_blk + r * kBlockN;
          for (int c = 0; c < kBlockN; ++c) prow[c] = Exp2(prow[c] * scale_log2 - lse2[r]);
          if (needs_mask)
            for (int c = 0; c < kBlockN; ++c)
              if (Masked(p.is_causal, q0 + r, k0 + c, s.seqlen_k)) prow[c] = 0;
          Transpose(1, kBlockN, prow, kBlockN, t_blk + r, kBlockM);  // P^T column r
          for (int c = 0; c < kBlockN; ++c) prow[c] *= dprow[c] - delta[r];  // dS
        }
        GemmAcc(kBlockN, dp, rows, t_blk, kBlockM, do_blk, dp, dv_acc, dp);  // dV += P^T dO
        Transpose(rows, kBlockN, p_blk, kBlockN, t_blk, kBlockM);
        GemmAcc(kBlockN, dp, rows, t_blk, kBlockM, q_blk, dp, dk_acc, dp);   // dK += dS^T Q
        GemmAcc(rows, dp, kBlockN, p_blk, kBlockN, k_blk, dp, dq_head + q0 * dp, dp);  // dQ += dS K
      }
    }
    for (int r = 0; r < cols; ++r) {
      Element* dkrow = dk + (k0 + r) * p.k_stride.row;
      Element* dvrow = dv + (k0 + r) * p.k_stride.row;
      for (int c = 0; c < d; ++c) {
        dkrow[c] = FromFloat<Element>(dk_acc[r * dp + c] * Acc(p.scale));
        dvrow[c] = FromFloat<Element>(dv_acc[r * dp + c]);
      }
    }
  }
}

}  // namespace

template <typename Element>
void AttentionForward(const AttentionParams& p) {
  const auto& s = p.shape;
  const int64_t m_blocks = CeilDiv(s.seqlen_q, kBlockM);
  ParallelFor(s.batch * s.num_heads * m_blocks, [&](int64_t t) {
    ForwardTask<Element>(p, t / (s.num_heads * m_blocks), (t / m_blocks) % s.num_heads,
                         t % m_blocks);
  });
}

template <typename Element>
void AttentionBackward(const AttentionParams& p) {
  using Acc = typename AccumFor<Element>::type;
  const auto& s = p.shape;
  const int64_t m_blocks = CeilDiv(s.seqlen_q, kBlockM);
  ParallelFor(s.batch * s.num_heads * m_blocks, [&](int64_t t) {
    DeltaTask<Element>(p, t / (s.num_heads * m_blocks), (t / m_blocks) % s.num_heads,
                       t % m_blocks);
  });

  // Split each key head's key blocks over enough tasks to keep every thread
  // busy; each split owns a float dQ partial. Capped at 8 splits so the
  // partials stay a small multiple of dq (O(T) memory).
  const int64_t heads = s.batch * s.num_heads_k;
  const int64_t n_blocks = CeilDiv(s.seqlen_k, kBlockN);
  const int64_t num_splits =
      std::clamp<int64_t>(CeilDiv(NumThreads(), heads), 1, std::min<int64_t>(8, n_blocks));
  const int dp = PaddedHeadDim(s.head_dim);
  const int64_t per_batch_split = s.num_heads * s.seqlen_q * dp;  // one split's dQ of one batch entry
  std::vector<Acc> dq_partial(size_t(num_splits * s.batch * per_batch_split), Acc(0));
  ParallelFor(heads * num_splits, [&](int64_t t) {
    const int64_t split = t % num_splits, head = t / num_splits;
    const int64_t b = head / s.num_heads_k, hk = head % s.num_heads_k;
    BackwardTask<Element>(p, b, hk, split, num_splits,
                          dq_partial.data() + (split * s.batch + b) * per_batch_split);
  });

  // dq = scale * sum over splits, in split order.
  ParallelFor(s.batch * s.num_heads * m_blocks, [&](int64_t t) {
    const int64_t b = t / (s.num_heads * m_blocks), h = (t / m_blocks) % s.num_heads;
    const int64_t q_end = std::min<int64_t>(s.seqlen_q, (t % m_blocks + 1) * kBlockM);
    Element* dq = static_cast<Element*>(p.dq) + b * p.q_stride.batch + h * p.q_stride.head;
    for (int64_t i = (t % m_blocks) * kBlockM; i < q_end; ++i) {
      for (int64_t c = 0; c < s.head_dim; ++c) {
        Acc acc = 0;
        for (int64_t sp = 0; sp < num_splits; ++sp)
          acc += dq_partial[size_t((sp * s.batch + b) * per_batch_split + (h * s.seqlen_q + i) * dp + c)];
        dq[i * p.q_stride.row + c] = FromFloat<Element>(acc * Acc(p.scale));
      }
    }
  });
}

template void AttentionForward<float>(const AttentionParams&);
template void AttentionForward<double>(const AttentionParams&);
template void AttentionForward<Float16>(const AttentionParams&);
template void AttentionForward<BFloat16>(const AttentionParams&);
template void AttentionBackward<float>(const AttentionParams&);
template void AttentionBackward<double>(const AttentionParams&);
template void AttentionBackward<Float16>(const AttentionParams&);
template void AttentionBackward<BFloat16>(const AttentionParams&);

}  // namespace jax_flash::cpu
