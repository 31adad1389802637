// Which keys each query sees: one policy for the forward, the backward, the
// CPU and the CUDA kernels. It answers two questions: which key range a block
// of queries visits (and which query range a block of keys is seen by), so
// blocks outside the causal/window/length bounds are skipped, not masked; and
// whether one (query, key) pair is visible, for the blocks that need a check.
#pragma once

#include <cstdint>

#include "common/params.h"

namespace jax_flash {

struct MaskPolicy {
  int64_t seqlen_q = 0, seqlen_k = 0;  // effective lengths (seq lengths applied)
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  const int32_t* q_segments = nullptr;   // this batch row's ids, or null
  const int32_t* kv_segments = nullptr;
  const uint8_t* mask = nullptr;  // this (batch, head) slice, or null
  int64_t mask_row = 0, mask_col = 0;

  JAX_FLASH_HOST_DEVICE static MaskPolicy For(const AttentionParams& p, int64_t b, int64_t h) {
    const AttentionFeatures& f = p.features;
    MaskPolicy m;
    m.seqlen_q = p.shape.seqlen_q;
    m.seqlen_k = p.shape.seqlen_k;
    if (f.q_seqlens) m.seqlen_q = Clamp(f.q_seqlens[b], m.seqlen_q);
    if (f.kv_seqlens) m.seqlen_k = Clamp(f.kv_seqlens[b], m.seqlen_k);
    m.causal = p.is_causal;
    m.window_left = f.window_left;
    m.window_right = f.window_right;
    if (f.q_segment_ids && f.kv_segment_ids) {
      m.q_segments = f.q_segment_ids + b * p.shape.seqlen_q;
      m.kv_segments = f.kv_segment_ids + b * p.shape.seqlen_k;
    }
    if (f.mask) {
      m.mask = f.mask + f.BroadcastOffset(f.mask_stride, b, h);
      m.mask_row = f.mask_stride.row;
      m.mask_col = f.mask_stride.col;
    }
    return m;
  }

  // Keys [*lo, *hi) that query rows [i0, i1) may see (a superset of the
  // visible ones); empty when *lo >= *hi.
  JAX_FLASH_HOST_DEVICE void KeyRange(int64_t i0, int64_t i1, int64_t* lo, int64_t* hi) const {
    *lo = 0;
    *hi = i0 < seqlen_q ? seqlen_k : 0;
    if (causal) *hi = Min(*hi, i1);
    if (window_right >= 0) *hi = Min(*hi, i1 + window_right);
    if (window_left >= 0) *lo = Max(*lo, i0 - window_left);
  }

  // Query rows [*lo, *hi) that may see keys [j0, j1).
  JAX_FLASH_HOST_DEVICE void QueryRange(int64_t j0, int64_t j1, int64_t* lo, int64_t* hi) const {
    *lo = 0;
    *hi = j0 < seqlen_k ? seqlen_q : 0;
    if (causal) *lo = Max(*lo, j0);
    if (window_right >= 0) *lo = Max(*lo, j0 - window_right);
    if (window_left >= 0) *hi = Min(*hi, j1 + window_left);
  }

  // False when every pair of rows [i0, i1) x keys [j0, j1) is visible.
  JAX_FLASH_HOST_DEVICE bool NeedsCheck(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
    return mask || q_segments || i1 > seqlen_q || j1 > seqlen_k || (causal && j1 - 1 > i0) ||
           (window_right >= 0 && j1 - 1 > i0 + window_right) ||
           (window_left >= 0 && j0 < i1 - 1 - window_left);
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
    return i < seqlen_q && j < seqlen_k && (!causal || j <= i) &&
           (window_left < 0 || j >= i - window_left) && (window_right < 0 || j <= i + window_right) &&
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

// Dropout keep decision for element (b, h, i, j): Philox-4x32-10 keyed by the
// user's seed, counter (j, i, h, b) — the same bits on every platform and in
// the forward and backward, with nothing stored.
JAX_FLASH_HOST_DEVICE inline uint32_t Philox4x32First(uint32_t k0, uint32_t k1, uint32_t c0,
                                                      uint32_t c1, uint32_t c2, uint32_t c3) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

struct DropoutPolicy {
  uint32_t k0 = 0, k1 = 0;
  uint32_t threshold = 0;  // drop when bits < threshold
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
    d.threshold = uint32_t(f.dropout_rate * 4294967296.0);
    d.keep_scale = float(1.0 / (1.0 - f.dropout_rate));
    d.active = true;
    d.shared = f.dropout_shared;
    return d;
  }

  // Multiplier of P for element (b, h, i, j): 0 (dropped) or 1 / (1 - rate).
  JAX_FLASH_HOST_DEVICE float Factor(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (shared) b = h = 0;
    const uint32_t bits = Philox4x32First(k0, k1, uint32_t(j), uint32_t(i), uint32_t(h), uint32_t(b));
    return bits < threshold ? 0.0f : keep_scale;
  }
};

}  // namespace jax_flash
