#include "cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "common/mask_policy.h"
#include "common/row_end.h"
#include "cpu/block_math.h"
#include "cpu/element.h"
#include "cpu/parallel.h"
#include "cpu/tiles.h"

namespace jax_flash::cpu {
namespace {

// Lanes of 32-bit words and their 64-bit products: one Philox call per lane.
typedef uint32_t PhiloxLanes __attribute__((vector_size(sizeof(uint32_t) * kBlockN / 4)));
typedef uint64_t PhiloxWide __attribute__((vector_size(sizeof(uint64_t) * kBlockN / 4)));

// The dropout factors of query row i for keys [k0, k0 + kBlockN) into f
// (k0 % 32 == 0): DropoutPolicy's kBlockN / 4 Philox calls that serve them,
// run side by side as SIMD lanes through Philox4x32's rounds. Lane
// l = run * 8 + lane serves keys k0 + run * 32 + lane + 8 * w (word w), so
// its counter is the block's first plus l. (A call lane by lane stays
// scalar: 5x slower. Each call also serves row i +- 8, whose own DropoutRow
// draws it again: the CPU keeps one row at a time.)
void DropoutRow(const DropoutPolicy& d, int64_t b, int64_t h, int64_t i, int64_t k0, float* f) {
  static_assert(kBlockN % 32 == 0);
  constexpr int kLanes = kBlockN / 4;
  uint32_t first[4];
  d.Counter(b, h, i, k0, first);
  PhiloxLanes c0, c1 = PhiloxLanes{} + first[1], c2 = PhiloxLanes{} + first[2],
                  c3 = PhiloxLanes{} + first[3];
  for (int l = 0; l < kLanes; ++l) c0[l] = first[0] + uint32_t(l);
  uint32_t key0 = d.k0, key1 = d.k1;
  for (int round = 0; round < kPhiloxRounds; ++round) {
    const PhiloxWide p0 = __builtin_convertvector(c0, PhiloxWide) * kPhiloxMul0;
    const PhiloxWide p1 = __builtin_convertvector(c2, PhiloxWide) * kPhiloxMul1;
    const PhiloxLanes hi0 = __builtin_convertvector(p0 >> 32, PhiloxLanes);
    const PhiloxLanes hi1 = __builtin_convertvector(p1 >> 32, PhiloxLanes);
    c0 = hi1 ^ c1 ^ key0;
    c1 = __builtin_convertvector(p1, PhiloxLanes);
    c2 = hi0 ^ c3 ^ key1;
    c3 = __builtin_convertvector(p0, PhiloxLanes);
    key0 += kPhiloxKeyStep0;
    key1 += kPhiloxKeyStep1;
  }
  // DropoutPolicy::Kept on every lane, as bit masks: all-ones (kept) and
  // the scale's bits, or 0. Row i takes the low or high 16 bits of each
  // word (its half, i % 16 / 8); word w of the calls of one run fills 8 keys.
  const uint32_t scale_bits = __builtin_bit_cast(uint32_t, d.keep_scale);
  const uint32_t shift = uint32_t(i % 16 / 8) * 16;
  const PhiloxLanes words[4] = {c0, c1, c2, c3};
  for (int w = 0; w < 4; ++w) {
    const PhiloxLanes factor_bits = (((words[w] >> shift) & 0xFFFFu) >= d.threshold) & scale_bits;
    for (int run = 0; run < kBlockN / 32; ++run)
      std::memcpy(f + run * 32 + w * 8, reinterpret_cast<const uint32_t*>(&factor_bits) + run * 8,
                  8 * sizeof(float));
  }
}

template <typename Element>
void ForwardTask(const AttentionParams& p, int64_t b, int64_t h, int64_t m_block) {
  using Acc = typename AccumFor<Element>::type;
  const auto& s = p.shape;
  const int d = int(s.head_dim), dp = PaddedHeadDim(d);
  const int64_t hk = h / s.group();
  const int64_t q0 = m_block * kBlockM;
  const int rows = int(std::min<int64_t>(kBlockM, s.seqlen_q - q0));
  const MaskPolicy mask = MaskPolicy::For(p, b, h);
  const DropoutPolicy dropout = DropoutPolicy::For(p, b);
  const Acc keep_scale = Acc(1.0 / (1.0 - p.features.dropout_rate));  // dropout's, in Acc
  const LogitTransform<Acc> logits(p, mask, b, h);

  const Element* q = static_cast<const Element*>(p.q) + b * p.q_stride.batch + h * p.q_stride.head;
  const Element* k = static_cast<const Element*>(p.k) + b * p.k_stride.batch + hk * p.k_stride.head;
  const Element* v = static_cast<const Element*>(p.v) + b * p.k_stride.batch + hk * p.k_stride.head;
  Element* out = static_cast<Element*>(p.out) + b * p.q_stride.batch + h * p.q_stride.head;

  thread_local std::vector<Acc> buf;
  buf.resize(size_t(kBlockM) * dp * 2 + size_t(dp) * kBlockN + size_t(kBlockN) * dp +
             kBlockM * kBlockN + 2 * kBlockM);
  Acc* q_blk = buf.data();                   // [kBlockM][dp]
  Acc* o_acc = q_blk + kBlockM * dp;         // [kBlockM][dp]
  Acc* kt_blk = o_acc + kBlockM * dp;        // [dp][kBlockN]  (K transposed)
  Acc* v_blk = kt_blk + dp * kBlockN;        // [kBlockN][dp]
  Acc* s_blk = v_blk + kBlockN * dp;         // [kBlockM][kBlockN] logits, then P
  Acc* row_max = s_blk + kBlockM * kBlockN;  // running max (log2 units)
  Acc* row_sum = row_max + kBlockM;          // running sum of P

  LoadRows(q, p.q_stride.row, q0, rows, d, Acc(1), q_blk, dp);
  std::fill(o_acc, o_acc + kBlockM * dp, Acc(0));
  std::fill(row_max, row_max + kBlockM, NegInf<Acc>());
  std::fill(row_sum, row_sum + kBlockM, Acc(0));

  int64_t kv_lo, kv_hi;
  mask.KeyRange(q0, q0 + rows, &kv_lo, &kv_hi);
  for (int64_t k0 = FloorTo(kv_lo, kBlockN); k0 < kv_hi; k0 += kBlockN) {
    if (mask.BlockEmpty(q0, q0 + rows, k0, k0 + kBlockN)) continue;  // e.g. another document's keys
    const int cols = int(std::min<int64_t>(kBlockN, s.seqlen_k - k0));
    if (MaskArrayHidesBlock(mask, q0, q0 + rows, k0, k0 + cols)) continue;
    LoadRowsTransposed(k, p.k_stride.row, k0, cols, d, dp, kt_blk);
    LoadRows(v, p.k_stride.row, k0, cols, d, Acc(1), v_blk, dp);
    std::fill(v_blk + cols * dp, v_blk + kBlockN * dp, Acc(0));

    std::fill(s_blk, s_blk + kBlockM * kBlockN, Acc(0));
    GemmAcc(rows, kBlockN, dp, q_blk, dp, kt_blk, kBlockN, s_blk, kBlockN);  // S = Q K^T
    logits.Apply(s_blk, q0, rows, k0, cols, nullptr);

    for (int r = 0; r < rows; ++r) {
      Acc* srow = s_blk + r * kBlockN;
      // The softmax normalizer ignores dropout.
      const Acc alpha = OnlineSoftmaxRow(srow, &row_max[r], &row_sum[r]);
      if (dropout.active) {
        float factors[kBlockN];
        DropoutRow(dropout, b, h, q0 + r, k0, factors);
        // The kept ones scaled in Acc (1 / (1 - rate) rounded to float32
        // would cost float64 its exactness).
        for (int c = 0; c < kBlockN; ++c) srow[c] = factors[c] != 0.0f ? srow[c] * keep_scale : Acc(0);
      }
      Acc* orow = o_acc + r * dp;
      for (int c = 0; c < dp; ++c) orow[c] *= alpha;
    }
    GemmAcc(rows, dp, kBlockN, s_blk, kBlockN, v_blk, dp, o_acc, dp);  // O += P V
  }

  const Acc sink2 = SinkLog2<Acc>(p.features, b, h, s.num_heads);  // -inf: no sinks
  for (int r = 0; r < rows; ++r) {
    const RowEnd<Acc> end = EndRow(row_max[r], row_sum[r], sink2);
    Element* orow = out + (q0 + r) * p.q_stride.row;
    for (int c = 0; c < d; ++c) orow[c] = FromFloat<Element>(o_acc[r * dp + c] * end.scale);
    static_cast<Acc*>(p.lse)[p.row_stat_index(b, h, q0 + r)] = end.lse;
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

// Recomputes one (query block, key block) tile of the backward: P (dropped
// out where dropout is on) into p_blk and dS = dlogits into ds_blk, both
// [kBlockM][kBlockN]; ds_raw_blk gets dS through the soft cap's derivative
// (the gradient of scale * q.k), which is dS itself without a soft cap.
template <typename Acc>
struct BackwardTile {
  Acc* q_blk;   // [kBlockM][dp] q rows, unscaled
  Acc* do_blk;  // [kBlockM][dp]
  Acc* kt_blk;  // [dp][kBlockN]
  Acc* vt_blk;  // [dp][kBlockN]
  Acc* p_blk;   // [kBlockM][kBlockN]
  Acc* ds_blk;  // [kBlockM][kBlockN]
  Acc* t_blk;   // [kBlockM][kBlockN] tanh values (soft cap)
  Acc* lse2;    // [kBlockM]
  Acc* delta;   // [kBlockM]

  static size_t Elements(int dp) {
    return size_t(dp) * kBlockN * 2 + size_t(kBlockM) * dp * 2 + size_t(kBlockM) * kBlockN * 3 +
           2 * kBlockM;
  }

  // Lays the tile's buffers out from `base` (Elements(dp) values).
  static BackwardTile Carve(Acc* base, int dp) {
    BackwardTile t;
    t.kt_blk = base;
    t.vt_blk = t.kt_blk + dp * kBlockN;
    t.q_blk = t.vt_blk + dp * kBlockN;
    t.do_blk = t.q_blk + kBlockM * dp;
    t.p_blk = t.do_blk + kBlockM * dp;
    t.ds_blk = t.p_blk + kBlockM * kBlockN;
    t.t_blk = t.ds_blk + kBlockM * kBlockN;
    t.lse2 = t.t_blk + kBlockM * kBlockN;
    t.delta = t.lse2 + kBlockM;
    return t;
  }
};

template <typename Element, typename Acc>
void ComputeBackwardTile(const AttentionParams& p, const LogitTransform<Acc>& logits,
                         const DropoutPolicy& dropout, int64_t b, int64_t h, const Element* q,
                         const Element* dout, int64_t q0, int rows, int64_t k0, int cols, int dp,
                         const BackwardTile<Acc>& t) {
  const int d = int(p.shape.head_dim);
  LoadRows(q, p.q_stride.row, q0, rows, d, Acc(1), t.q_blk, dp);
  LoadRows(dout, p.q_stride.row, q0, rows, d, Acc(1), t.do_blk, dp);
  for (int r = 0; r < rows; ++r) {
    const Acc l = static_cast<const Acc*>(p.lse)[p.row_stat_index(b, h, q0 + r)];
    // A row that saw no key (lse = -inf) must get P = 0, not inf.
    t.lse2[r] = l == NegInf<Acc>() ? -NegInf<Acc>() : l * Acc(kLog2eF64);
    t.delta[r] = static_cast<const Acc*>(p.delta)[p.row_stat_index(b, h, q0 + r)];
  }
  std::fill(t.p_blk, t.p_blk + kBlockM * kBlockN, Acc(0));
  std::fill(t.ds_blk, t.ds_blk + kBlockM * kBlockN, Acc(0));
  GemmAcc(rows, kBlockN, dp, t.q_blk, dp, t.kt_blk, kBlockN, t.p_blk, kBlockN);    // q.k
  GemmAcc(rows, kBlockN, dp, t.do_blk, dp, t.vt_blk, kBlockN, t.ds_blk, kBlockN);  // dP = dO V^T
  logits.Apply(t.p_blk, q0, rows, k0, cols, t.t_blk);
  for (int r = 0; r < rows; ++r) {
    Acc* prow = t.p_blk + r * kBlockN;
    Acc* dsrow = t.ds_blk + r * kBlockN;
    for (int c = 0; c < kBlockN; ++c) prow[c] = Exp2(prow[c] - t.lse2[r]);  // masked: exp2(-inf) = 0
    if (dropout.active) {
      float factors[kBlockN];  // the forward's, regenerated
      DropoutRow(dropout, b, h, q0 + r, k0, factors);
      const Acc keep_scale = Acc(1.0 / (1.0 - p.features.dropout_rate));  // in Acc, as the forward's
      for (int c = 0; c < kBlockN; ++c) {  // past `cols` P is 0
        const Acc f = factors[c] != 0.0f ? keep_scale : Acc(0);
        dsrow[c] = prow[c] * (dsrow[c] * f - t.delta[r]);  // dS uses the undropped P
        prow[c] *= f;                                      // dV uses the dropped one
      }
    } else {
      for (int c = 0; c < kBlockN; ++c) dsrow[c] = prow[c] * (dsrow[c] - t.delta[r]);
    }
  }
}

// Applies the soft cap's derivative: d(scale * q.k) = dS * (1 - tanh^2).
template <typename Acc>
void SoftcapChain(const AttentionParams& p, int rows, Acc* ds_blk, const Acc* t_blk) {
  if (p.features.softcap <= 0) return;
  for (int i = 0; i < rows * kBlockN; ++i) ds_blk[i] *= Acc(1) - t_blk[i] * t_blk[i];
}

// One task of the backward: key blocks n_block, n_block + num_splits, ... of
// key head hk, for every query head of its group. dK/dV accumulate in the
// task's buffers; dQ contributions go to dq_partial ([heads][seqlen_q][dp]
// for this batch entry and split), summed over splits afterwards in a fixed
// order so results are bitwise reproducible.
template <typename Element>
void BackwardTask(const AttentionParams& p, int64_t b, int64_t hk, int64_t split,
                  int64_t num_splits, typename AccumFor<Element>::type* dq_partial) {
  using Acc = typename AccumFor<Element>::type;
  const auto& s = p.shape;
  const int d = int(s.head_dim), dp = PaddedHeadDim(d);
  const int64_t k_base = b * p.k_stride.batch + hk * p.k_stride.head;
  const Element* k = static_cast<const Element*>(p.k) + k_base;
  const Element* v = static_cast<const Element*>(p.v) + k_base;
  Element* dk = static_cast<Element*>(p.dk) + k_base;
  Element* dv = static_cast<Element*>(p.dv) + k_base;
  const DropoutPolicy dropout = DropoutPolicy::For(p, b);
  // This task's dQ rows (its key head's query heads, in its split's
  // partial), zeroed here by the thread that fills them: no serial pass
  // over the whole partial before the tasks start.
  Acc* const dq_group = dq_partial + hk * s.group() * s.seqlen_q * dp;
  std::fill(dq_group, dq_group + s.group() * s.seqlen_q * dp, Acc(0));

  thread_local std::vector<Acc> buf;
  buf.resize(size_t(kBlockN) * dp * 3 + size_t(kBlockN) * kBlockM + BackwardTile<Acc>::Elements(dp));
  Acc* k_blk = buf.data();                    // [kBlockN][dp]
  Acc* dk_acc = k_blk + kBlockN * dp;         // [kBlockN][dp]
  Acc* dv_acc = dk_acc + kBlockN * dp;        // [kBlockN][dp]
  Acc* tr_blk = dv_acc + kBlockN * dp;        // [kBlockN][kBlockM] P^T or dS^T
  const BackwardTile<Acc> t = BackwardTile<Acc>::Carve(tr_blk + kBlockN * kBlockM, dp);

  const int64_t num_n_blocks = CeilDiv(s.seqlen_k, kBlockN);
  for (int64_t n_block = split; n_block < num_n_blocks; n_block += num_splits) {
    const int64_t k0 = n_block * kBlockN;
    const int cols = int(std::min<int64_t>(kBlockN, s.seqlen_k - k0));
    LoadRows(k, p.k_stride.row, k0, cols, d, Acc(1), k_blk, dp);
    std::fill(k_blk + cols * dp, k_blk + kBlockN * dp, Acc(0));
    LoadRowsTransposed(k, p.k_stride.row, k0, cols, d, dp, t.kt_blk);
    LoadRowsTransposed(v, p.k_stride.row, k0, cols, d, dp, t.vt_blk);
    std::fill(dk_acc, dk_acc + kBlockN * dp, Acc(0));
    std::fill(dv_acc, dv_acc + kBlockN * dp, Acc(0));

    for (int64_t g = 0; g < s.group(); ++g) {
      const int64_t h = hk * s.group() + g;
      const int64_t q_base = b * p.q_stride.batch + h * p.q_stride.head;
      const Element* q = static_cast<const Element*>(p.q) + q_base;
      const Element* dout = static_cast<const Element*>(p.dout) + q_base;
      Acc* dq_head = dq_partial + h * s.seqlen_q * dp;
      const MaskPolicy mask = MaskPolicy::For(p, b, h);
      const LogitTransform<Acc> logits(p, mask, b, h);
      int64_t q_lo, q_hi;
      mask.QueryRange(k0, k0 + kBlockN, &q_lo, &q_hi);
      for (int64_t q0 = FloorTo(q_lo, kBlockM); q0 < q_hi; q0 += kBlockM) {
        const int rows = int(std::min<int64_t>(kBlockM, s.seqlen_q - q0));
        if (mask.BlockEmpty(q0, q0 + rows, k0, k0 + kBlockN)) continue;
        if (MaskArrayHidesBlock(mask, q0, q0 + rows, k0, k0 + cols)) continue;
        ComputeBackwardTile<Element, Acc>(p, logits, dropout, b, h, q, dout, q0, rows, k0, cols,
                                          dp, t);
        Transpose(rows, kBlockN, t.p_blk, kBlockN, tr_blk, kBlockM);
        GemmAcc(kBlockN, dp, rows, tr_blk, kBlockM, t.do_blk, dp, dv_acc, dp);  // dV += P^T dO
        SoftcapChain(p, rows, t.ds_blk, t.t_blk);
        Transpose(rows, kBlockN, t.ds_blk, kBlockN, tr_blk, kBlockM);
        GemmAcc(kBlockN, dp, rows, tr_blk, kBlockM, t.q_blk, dp, dk_acc, dp);   // dK += dS^T Q
        GemmAcc(rows, dp, kBlockN, t.ds_blk, kBlockN, k_blk, dp, dq_head + q0 * dp, dp);  // dQ += dS K
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
  // The only split: its partial is dQ, so this task writes its heads' rows
  // (scaled) itself, while they are in its cache, instead of a pass after
  // every task.
  if (num_splits == 1) {
    for (int64_t g = 0; g < s.group(); ++g) {
      const int64_t h = hk * s.group() + g;
      Element* dq = static_cast<Element*>(p.dq) + b * p.q_stride.batch + h * p.q_stride.head;
      const Acc* rows = dq_partial + h * s.seqlen_q * dp;
      for (int64_t i = 0; i < s.seqlen_q; ++i)
        for (int c = 0; c < d; ++c) dq[i * p.q_stride.row + c] = FromFloat<Element>(rows[i * dp + c] * Acc(p.scale));
    }
  }
}

// Stores a task's summed dbias elements in the bias's element type.
template <typename T, typename Acc>
void StoreDbias(const Acc* sums, int64_t rows, int64_t cols, int64_t offset, int64_t row_stride,
                int64_t col_stride, void* out) {
  T* dst = static_cast<T*>(out) + offset;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if constexpr (std::is_same_v<T, Acc>) {
        dst[r * row_stride + c * col_stride] = sums[r * cols + c];
      } else {  // 16-bit (never with a float64 Acc: attention.py up-casts those)
        dst[r * row_stride + c * col_stride] = FromFloat<T>(float(sums[r * cols + c]));
      }
}

// dbias for one slice of the bias's own shape: the (batch, head) pairs that
// broadcast onto it, query rows [row0, row1) of it (all rows when the bias is
// broadcast over queries). Each task owns its dbias elements: no races, a
// fixed summation order. They are summed in the accumulation type in a
// buffer of the task's own (at most kBlockM x seqlen_k: O(T) memory) and
// stored once, rounded to the bias's type (a 16-bit bias gets a 16-bit
// gradient, rounded from the float32 sum).
template <typename Element>
void DbiasTask(const AttentionParams& p, const BiasShape& bias_shape, int64_t bias_slice_offset,
               int64_t row0, int64_t row1, void* dbias) {
  using Acc = typename AccumFor<Element>::type;
  const auto& s = p.shape;
  const AttentionFeatures& f = p.features;
  const int d = int(s.head_dim), dp = PaddedHeadDim(d);
  thread_local std::vector<Acc> buf;
  buf.resize(BackwardTile<Acc>::Elements(dp));
  const BackwardTile<Acc> t = BackwardTile<Acc>::Carve(buf.data(), dp);
  // [sum_rows][sum_cols]: the task's dbias elements (one row when the bias is
  // broadcast over queries, one column when over keys).
  const int64_t sum_rows = bias_shape.rows == 1 ? 1 : row1 - row0;
  const int64_t sum_cols = bias_shape.cols;
  const int64_t row_mul = bias_shape.rows == 1 ? 0 : 1, col_mul = bias_shape.cols == 1 ? 0 : 1;
  thread_local std::vector<Acc> sums_buf;
  sums_buf.assign(size_t(sum_rows * sum_cols), Acc(0));
  Acc* sums = sums_buf.data();

  for (int64_t b = 0; b < s.batch; ++b) {
    const DropoutPolicy dropout = DropoutPolicy::For(p, b);
    for (int64_t h = 0; h < s.num_heads; ++h) {
      if (f.BroadcastOffset(f.bias_stride, b, h) != bias_slice_offset) continue;
      const int64_t hk = h / s.group();
      const int64_t q_base = b * p.q_stride.batch + h * p.q_stride.head;
      const int64_t k_base = b * p.k_stride.batch + hk * p.k_stride.head;
      const Element* q = static_cast<const Element*>(p.q) + q_base;
      const Element* dout = static_cast<const Element*>(p.dout) + q_base;
      const Element* k = static_cast<const Element*>(p.k) + k_base;
      const Element* v = static_cast<const Element*>(p.v) + k_base;
      const MaskPolicy mask = MaskPolicy::For(p, b, h);
      const LogitTransform<Acc> logits(p, mask, b, h);
      for (int64_t q0 = row0; q0 < row1; q0 += kBlockM) {
        const int rows = int(std::min<int64_t>(kBlockM, row1 - q0));
        int64_t kv_lo, kv_hi;
        mask.KeyRange(q0, q0 + rows, &kv_lo, &kv_hi);
        for (int64_t k0 = FloorTo(kv_lo, kBlockN); k0 < kv_hi; k0 += kBlockN) {
          if (mask.BlockEmpty(q0, q0 + rows, k0, k0 + kBlockN)) continue;
          const int cols = int(std::min<int64_t>(kBlockN, s.seqlen_k - k0));
          if (MaskArrayHidesBlock(mask, q0, q0 + rows, k0, k0 + cols)) continue;
          LoadRowsTransposed(k, p.k_stride.row, k0, cols, d, dp, t.kt_blk);
          LoadRowsTransposed(v, p.k_stride.row, k0, cols, d, dp, t.vt_blk);
          ComputeBackwardTile<Element, Acc>(p, logits, dropout, b, h, q, dout, q0, rows, k0, cols,
                                            dp, t);
          for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c)
              sums[(q0 + r - row0) * row_mul * sum_cols + (k0 + c) * col_mul] += t.ds_blk[r * kBlockN + c];
        }
      }
    }
  }
  const int64_t offset = bias_slice_offset + row0 * f.bias_stride.row;
  switch (f.bias_type) {
    case BiasType::kAccum:
      StoreDbias<Acc>(sums, sum_rows, sum_cols, offset, f.bias_stride.row, f.bias_stride.col, dbias);
      break;
    case BiasType::kFloat16:
      StoreDbias<Float16>(sums, sum_rows, sum_cols, offset, f.bias_stride.row, f.bias_stride.col, dbias);
      break;
    case BiasType::kBFloat16:
      StoreDbias<BFloat16>(sums, sum_rows, sum_cols, offset, f.bias_stride.row, f.bias_stride.col, dbias);
      break;
  }
}

// Runs fn(b, h, m_block) for every (batch, query head, query block), in parallel.
template <typename Fn>
void ParallelOverQueryBlocks(const AttentionShape& s, Fn&& fn) {
  const int64_t m_blocks = CeilDiv(s.seqlen_q, kBlockM);
  ParallelFor(s.batch * s.num_heads * m_blocks, [&](int64_t t) {
    fn(t / (s.num_heads * m_blocks), (t / m_blocks) % s.num_heads, t % m_blocks);
  });
}

template <typename Element>
void ComputeDelta(const AttentionParams& p) {
  ParallelOverQueryBlocks(p.shape, [&](int64_t b, int64_t h, int64_t m_block) {
    DeltaTask<Element>(p, b, h, m_block);
  });
}

}  // namespace

template <typename Element>
void AttentionForward(const AttentionParams& p) {
  ParallelOverQueryBlocks(p.shape, [&](int64_t b, int64_t h, int64_t m_block) {
    ForwardTask<Element>(p, b, h, m_block);
  });
}

template <typename Element>
void AttentionBackward(const AttentionParams& p) {
  using Acc = typename AccumFor<Element>::type;
  const auto& s = p.shape;
  ComputeDelta<Element>(p);

  // Split each key head's key blocks over enough tasks to keep every thread
  // busy; each split owns a float dQ partial. Capped at 8 splits so the
  // partials stay a small multiple of dq (O(T) memory).
  const int64_t heads = s.batch * s.num_heads_k;
  const int64_t n_blocks = CeilDiv(s.seqlen_k, kBlockN);
  const int64_t num_splits =
      std::clamp<int64_t>(CeilDiv(NumThreads(), heads), 1, std::min<int64_t>(8, n_blocks));
  const int dp = PaddedHeadDim(s.head_dim);
  const int64_t per_batch_split = s.num_heads * s.seqlen_q * dp;  // one split's dQ of one batch entry
  // Uninitialized: each task zeroes the rows it owns.
  const std::unique_ptr<Acc[]> dq_partial(new Acc[size_t(num_splits * s.batch * per_batch_split)]);
  ParallelFor(heads * num_splits, [&](int64_t t) {
    const int64_t split = t % num_splits, head = t / num_splits;
    const int64_t b = head / s.num_heads_k, hk = head % s.num_heads_k;
    BackwardTask<Element>(p, b, hk, split, num_splits,
                          dq_partial.get() + (split * s.batch + b) * per_batch_split);
  });

  // dq = scale * sum over splits, in split order (one split: written by
  // its tasks).
  if (num_splits > 1) ParallelOverQueryBlocks(s, [&](int64_t b, int64_t h, int64_t m_block) {
    const int64_t q_end = std::min<int64_t>(s.seqlen_q, (m_block + 1) * kBlockM);
    Element* dq = static_cast<Element*>(p.dq) + b * p.q_stride.batch + h * p.q_stride.head;
    for (int64_t i = m_block * kBlockM; i < q_end; ++i) {
      for (int64_t c = 0; c < s.head_dim; ++c) {
        Acc acc = 0;
        for (int64_t sp = 0; sp < num_splits; ++sp)
          acc += dq_partial[size_t((sp * s.batch + b) * per_batch_split + (h * s.seqlen_q + i) * dp + c)];
        dq[i * p.q_stride.row + c] = FromFloat<Element>(acc * Acc(p.scale));
      }
    }
  });
}

template <typename Element>
void AttentionBiasGradient(const AttentionParams& p, const BiasShape& bias_shape, void* dbias) {
  ComputeDelta<Element>(p);
  // One task per bias slice (its leading dims and head), further split by
  // query blocks when the bias has a full query dim; together they write
  // every element (those no visible pair reaches as zeros).
  const int64_t slices = bias_shape.num_elements / (bias_shape.rows * bias_shape.cols);
  const int64_t row_blocks = bias_shape.rows == 1 ? 1 : CeilDiv(p.shape.seqlen_q, kBlockM);
  ParallelFor(slices * row_blocks, [&](int64_t t) {
    const int64_t slice = t / row_blocks, rb = t % row_blocks;
    const int64_t row0 = bias_shape.rows == 1 ? 0 : rb * kBlockM;
    const int64_t row1 = bias_shape.rows == 1 ? p.shape.seqlen_q
                                              : std::min<int64_t>(p.shape.seqlen_q, row0 + kBlockM);
    DbiasTask<Element>(p, bias_shape, slice * bias_shape.rows * bias_shape.cols, row0, row1, dbias);
  });
}

#define JAX_FLASH_INSTANTIATE_CPU(Element)                                   \
  template void AttentionForward<Element>(const AttentionParams&);           \
  template void AttentionBackward<Element>(const AttentionParams&);          \
  template void AttentionBiasGradient<Element>(const AttentionParams&, const BiasShape&, void*);

JAX_FLASH_INSTANTIATE_CPU(float)
JAX_FLASH_INSTANTIATE_CPU(double)
JAX_FLASH_INSTANTIATE_CPU(Float16)
JAX_FLASH_INSTANTIATE_CPU(BFloat16)

}  // namespace jax_flash::cpu
