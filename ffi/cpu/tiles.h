// The CPU path's shared tile pieces: block sizes, loads of key/value/query
// rows into padded Acc tiles, the logit transform (scale, soft cap, bias,
// visibility by MaskPolicy) and one row of the online softmax. Used by the
// contiguous kernels (attention_cpu.cc) and the paged forward (paged_cpu.cc),
// so both apply the same arithmetic and the same visibility rule.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/mask_policy.h"
#include "common/params.h"
#include "cpu/block_math.h"
#include "cpu/element.h"

namespace jax_flash::cpu {

// Query and key block sizes. 64 x 64 float blocks (16 KB each) keep the
// working set of one task (S, P, a few Q/K/V tiles) inside L2.
constexpr int kBlockM = 64;
constexpr int kBlockN = 64;
static_assert(kBlockN % kColTile == 0);

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether the policy's boolean mask array hides every pair of rows [i0, i1)
// x keys [j0, j1) (both already inside the sequences): such a block
// (a prefix-LM's upper triangle, a per-query mask's empty patches) is
// skipped like a structurally empty one, forward and backward alike; its
// pairs would add exp2(-inf) = 0. A scan of the block's bytes that stops at
// the first visible one, 8 at a time where the keys are contiguous: a
// visible block costs a few loads, a hidden one rows x keys bytes against
// its rows x keys x head_dim x 4 FLOPs. False without a mask array.
inline bool MaskArrayHidesBlock(const MaskPolicy& m, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (!m.mask || i1 <= i0 || j1 <= j0) return false;
  if (m.mask_row == 0) i1 = i0 + 1;  // key-only: one row stands for all
  for (int64_t i = i0; i < i1; ++i) {
    const uint8_t* row = m.mask + i * m.mask_row;
    int64_t j = j0;
    if (m.mask_col == 1) {
      for (; j + 8 <= j1; j += 8) {
        uint64_t word;
        std::memcpy(&word, row + j, 8);
        if (word != 0) return false;
      }
    }
    for (; j < j1; ++j)
      if (row[j * m.mask_col] != 0) return false;
  }
  return true;
}
inline int64_t FloorTo(int64_t a, int64_t b) { return a / b * b; }
inline int PaddedHeadDim(int64_t d) { return int(CeilDiv(d, kColTile) * kColTile); }

// Loads `rows` rows into dst[rows][ld] as Acc, multiplied by `mul`; columns
// past head_dim are zero. row_ptr(r) is the r-th row's first element: a fixed
// stride for contiguous tensors, a block-table lookup for a paged cache.
template <typename Element, typename Acc, typename RowPtr>
void LoadRowsFrom(RowPtr row_ptr, int rows, int head_dim, Acc mul, Acc* dst, int ld) {
  for (int r = 0; r < rows; ++r) {
    const Element* s = row_ptr(r);
    Acc* d = dst + r * ld;
    for (int c = 0; c < head_dim; ++c) d[c] = Acc(ToFloat(s[c])) * mul;
    for (int c = head_dim; c < ld; ++c) d[c] = Acc(0);
  }
}

// Loads `rows` rows transposed: dst[c][r], zero-padded to
// [padded_dim][kBlockN] (rows past `rows` and columns past head_dim are zero).
template <typename Element, typename Acc, typename RowPtr>
void LoadRowsTransposedFrom(RowPtr row_ptr, int rows, int head_dim, int padded_dim, Acc* dst) {
  std::fill(dst, dst + int64_t(padded_dim) * kBlockN, Acc(0));
  for (int r = 0; r < rows; ++r) {
    const Element* s = row_ptr(r);
    for (int c = 0; c < head_dim; ++c) dst[c * kBlockN + r] = Acc(ToFloat(s[c]));
  }
}

// Rows [row0, row0 + rows) of one head of a contiguous tensor, as above.
template <typename Element, typename Acc>
void LoadRows(const Element* src, int64_t row_stride, int64_t row0, int rows,
              int head_dim, Acc mul, Acc* dst, int ld) {
  LoadRowsFrom<Element>([&](int r) { return src + (row0 + r) * row_stride; }, rows, head_dim,
                        mul, dst, ld);
}

template <typename Element, typename Acc>
void LoadRowsTransposed(const Element* src, int64_t row_stride, int64_t row0,
                        int rows, int head_dim, int padded_dim, Acc* dst) {
  LoadRowsTransposedFrom<Element>([&](int r) { return src + (row0 + r) * row_stride; }, rows,
                                  head_dim, padded_dim, dst);
}

// Turns a block of raw dot products q.k into logits in log2 units, in place:
// x = log2(e) * (softcap(scale * q.k) + bias), -inf where the policy hides the
// pair. With a soft cap, tanh_out (unless null: the forward has no use for
// it) receives tanh(scale * q.k / cap) for the backward's chain rule.
// Everything past `rows` x `cols` of the block is -inf.
// One bias row (element type T) added to a row of logits, then in log2 units.
template <typename Acc, typename T>
inline void AddBiasRow(Acc* srow, const T* brow, int cols, int64_t col_stride, Acc log2e) {
  for (int c = 0; c < cols; ++c) srow[c] = (srow[c] + Acc(ToFloat(brow[c * col_stride]))) * log2e;
}

template <typename Acc>
struct LogitTransform {
  const AttentionParams& p;
  const MaskPolicy& mask;
  const void* bias = nullptr;  // this (batch, head) slice, of bias_type, or null
  BiasType bias_type = BiasType::kAccum;
  int64_t bias_row = 0, bias_col = 0;
  Acc scale, cap;

  LogitTransform(const AttentionParams& params, const MaskPolicy& m, int64_t b, int64_t h)
      : p(params), mask(m), scale(Acc(params.scale)), cap(Acc(params.features.softcap)) {
    const AttentionFeatures& f = params.features;
    if (f.bias) {
      const int64_t off = f.BroadcastOffset(f.bias_stride, b, h);
      bias_type = f.bias_type;
      switch (bias_type) {
        case BiasType::kAccum: bias = static_cast<const Acc*>(f.bias) + off; break;
        case BiasType::kFloat16: bias = static_cast<const Float16*>(f.bias) + off; break;
        case BiasType::kBFloat16: bias = static_cast<const BFloat16*>(f.bias) + off; break;
      }
      bias_row = f.bias_stride.row;
      bias_col = f.bias_stride.col;
    }
  }

  void Apply(Acc* s, int64_t q0, int rows, int64_t k0, int cols, Acc* tanh_out) const {
    const Acc log2e = Acc(kLog2eF64);
    // One pass per block row: the multipliers fold scale, cap and log2(e)
    // (log2(e) after the bias when there is one).
    const Acc out_mul = bias ? Acc(1) : log2e;
    if (cap > 0) {
      const Acc in_mul = scale / cap, cap_mul = cap * out_mul;
      for (int r = 0; r < rows; ++r) {
        Acc* srow = s + r * kBlockN;
        if (tanh_out) {
          Acc* trow = tanh_out + r * kBlockN;
          for (int c = 0; c < kBlockN; ++c) {
            trow[c] = Tanh(srow[c] * in_mul);
            srow[c] = trow[c] * cap_mul;
          }
        } else {
          for (int c = 0; c < kBlockN; ++c) srow[c] = Tanh(srow[c] * in_mul) * cap_mul;
        }
      }
    } else {
      const Acc mul = scale * out_mul;
      for (int i = 0; i < rows * kBlockN; ++i) s[i] *= mul;
    }
    if (bias) {
      // Columns past `cols` are masked below. One switch per row: a 16-bit
      // bias is widened as it is read, never copied.
      for (int r = 0; r < rows; ++r) {
        Acc* srow = s + r * kBlockN;
        const int64_t off = (q0 + r) * bias_row + k0 * bias_col;
        switch (bias_type) {
          case BiasType::kAccum:
            AddBiasRow(srow, static_cast<const Acc*>(bias) + off, cols, bias_col, log2e);
            break;
          case BiasType::kFloat16:
            AddBiasRow(srow, static_cast<const Float16*>(bias) + off, cols, bias_col, log2e);
            break;
          case BiasType::kBFloat16:
            AddBiasRow(srow, static_cast<const BFloat16*>(bias) + off, cols, bias_col, log2e);
            break;
        }
      }
    }
    // Segment ids that are one and the same id over the whole block (their
    // block summaries say so) need no per-element check.
    const MaskPolicy block_mask =
        mask.Segments(q0, q0 + rows, k0, k0 + kBlockN) == SegmentMeet::kAll ? mask.WithoutSegments() : mask;
    if (block_mask.NeedsCheck(q0, q0 + rows, k0, k0 + kBlockN)) {
      // Per row: the structural bounds as a column range, then the mask array
      // and segment ids element by element only where they exist.
      for (int r = 0; r < rows; ++r) {
        Acc* srow = s + r * kBlockN;
        int64_t lo, hi;
        block_mask.RowKeyBounds(q0 + r, &lo, &hi);
        const int c_lo = int(std::clamp<int64_t>(lo - k0, 0, kBlockN));
        const int c_hi = int(std::clamp<int64_t>(std::min<int64_t>(hi, k0 + cols) - k0, c_lo, kBlockN));
        for (int c = 0; c < c_lo; ++c) srow[c] = NegInf<Acc>();
        for (int c = c_hi; c < kBlockN; ++c) srow[c] = NegInf<Acc>();
        if (block_mask.HasElementMasks())
          for (int c = c_lo; c < c_hi; ++c)
            if (!block_mask.ElementVisible(q0 + r, k0 + c)) srow[c] = NegInf<Acc>();
      }
    }
  }
};

// One row of the online softmax over a new block of logits (log2 units, -inf
// where hidden): updates the running max and sum, turns srow into P =
// exp2(logit - max) and returns the factor that rescales the row's output
// accumulator. A row with nothing visible yet keeps P = 0 (exp2(-inf - 0)).
template <typename Acc>
inline Acc OnlineSoftmaxRow(Acc* srow, Acc* row_max, Acc* row_sum) {
  Acc mx = *row_max;
  for (int c = 0; c < kBlockN; ++c) mx = std::max(mx, srow[c]);
  const Acc m_use = mx == NegInf<Acc>() ? Acc(0) : mx;
  const Acc alpha = Exp2(*row_max - m_use);
  Acc sum = 0;
  for (int c = 0; c < kBlockN; ++c) {
    srow[c] = Exp2(srow[c] - m_use);
    sum += srow[c];
  }
  *row_sum = *row_sum * alpha + sum;
  *row_max = mx;
  return alpha;
}

}  // namespace jax_flash::cpu
