// Dropout on the sm90 kernels' wgmma fragments (the kMasksDropout and
// kPlainDropout variants):
// the shared DropoutPolicy's bits (common/mask_policy.h), so that every
// family drops the same pairs and a forward and a backward agree whichever
// family runs each.
//
// One Philox call serves 8 pairs: queries i0 and i0 + 8 (i0 % 16 < 8) x keys
// j0 + 8 w (j0 % 32 < 8, w = 0 .. 3). The forward's fragment (rows = queries
// g, g + 8 of the warp's 16; columns = keys 8j + 2t + e) holds all 8 of a
// call's pairs (its two rows x the n8 tiles 4r .. 4r + 3), so a key block of
// 128 costs a thread 8 calls for its 64 pairs. The backward's S^T fragment
// (rows = keys g, g + 8 of the warp's 16; columns = queries) holds two of a
// call's four keys (the warps 2v and 2v + 1 hold keys g + 8 w of the same
// 32-key group: w = 0, 1 and 2, 3), so it uses half of each call: a step of
// 64 queries costs 8 calls for 32 pairs.
//
// The forward drops P after the row sums (the normalizer ignores dropout),
// each compare feeding its select, while the previous PV runs, and scales O
// by 1 / (1 - rate) once in the epilogue; the backward packs a step's keep
// bits while S^T and dP^T run and takes dS = P (Z dP - delta) with Z = keep
// / (1 - rate), dV from keep ? P : 0, scaled once at its store.
// Host-callable for tests/cpp/sm90_dropout_test.cu (against
// DropoutPolicy::Factor per pair).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/mask_policy.h"
#include "common/params.h"

namespace jax_flash::cuda::sm90 {

struct FragmentDropout {
  uint32_t k0 = 0, k1 = 0;
  // Kept where a pair's 16 bits are at least DropoutPolicy's threshold,
  // compared as 32-bit words: the high half by word >= threshold_high, the
  // low half by (word << 16) >= threshold_high (threshold_high = threshold
  // << 16). A threshold of 2^16 (a rate within 2^-17 of 1: every pair
  // dropped) does not fit; then keep_scale is 0, which zeroes every kept
  // pair's contribution as well (the forward's O, the backward's Z and dV).
  uint32_t threshold_high = 0;
  uint32_t batch = 0, head = 0;  // the counter's words 3 and 2 (0 for a shared mask)
  uint32_t head_mask = 0;        // ~0, or 0 for a shared mask (WithHead)
  float keep_scale = 1.0f;

  // The policy of batch row b, head h (both warp-uniform). On the device the
  // key words go through a shuffle from lane 0: ptxas then knows them to be
  // warp-uniform and keeps each round's key in a uniform register (the
  // round's XOR takes it as an operand) instead of adding it per call.
  __host__ __device__ __forceinline__ static FragmentDropout For(const AttentionParams& p, int b, int h) {
    const DropoutPolicy d = DropoutPolicy::For(p, b);
    FragmentDropout f;
    f.k0 = d.k0;
    f.k1 = d.k1;
#ifdef __CUDA_ARCH__
    f.k0 = __shfl_sync(0xffffffffu, f.k0, 0);
    f.k1 = __shfl_sync(0xffffffffu, f.k1, 0);
#endif
    f.threshold_high = ThresholdHigh(d.threshold);
    f.keep_scale = KeepScale(d);
    f.batch = d.shared ? 0u : uint32_t(b);
    f.head_mask = d.shared ? 0u : ~0u;
    f.head = uint32_t(h) & f.head_mask;
    return f;
  }
  // threshold_high and keep_scale of a policy (the backward's launch puts
  // them in its kernel arguments: constants there, no registers).
  __host__ __device__ __forceinline__ static uint32_t ThresholdHigh(uint32_t threshold) {
    return threshold < 65536u ? threshold << 16 : 0u;
  }
  __host__ __device__ __forceinline__ static float KeepScale(const DropoutPolicy& d) {
    return d.threshold < 65536u ? d.keep_scale : 0.0f;
  }

  // The same batch row's policy for head h (the backward's steps run over
  // the query heads of a key head's group).
  __host__ __device__ __forceinline__ FragmentDropout WithHead(int h) const {
    FragmentDropout f = *this;
    f.head = uint32_t(h) & head_mask;
    return f;
  }

  // Philox4x32 (kPhiloxRounds rounds) of counter (c0, c1, head, batch).
  __host__ __device__ __forceinline__ Philox4x32Words Bits(uint32_t c0, uint32_t c1) const {
    return Philox4x32(k0, k1, c0, c1, head, batch);
  }
  __host__ __device__ __forceinline__ bool KeptLow(uint32_t word) const { return (word << 16) >= threshold_high; }
  __host__ __device__ __forceinline__ bool KeptHigh(uint32_t word) const { return word >= threshold_high; }

  // The forward's dropout of key block [n0, n0 + kBlockN) (n0 a multiple of
  // 32) on this thread's P (softmax.cuh's layout: element 4j + 2hh + e is
  // row i0 + 8hh, key n0 + 8j + 2t + e; i0 the thread's first row, warp
  // row g, so i0 % 16 < 8): dropped pairs set to 0, kept ones unscaled (O
  // takes keep_scale once). The call of (r, e) serves keys n0 + 32r + 2t +
  // e + 8w, i.e. n8 tiles j = 4r + w, both rows; each compare feeds its
  // select directly (no bits packed: P is there when the bits are made).
  template <int kBlockN>
  __host__ __device__ __forceinline__ void ForwardDrop(float (&s)[kBlockN / 2], int i0, int n0, int t) const {
    static_assert(kBlockN % 32 == 0, "whole Philox calls of keys");
    const uint32_t c1 = uint32_t(i0 / 16 * 8 + i0 % 8);
#pragma unroll
    for (int r = 0; r < kBlockN / 32; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const Philox4x32Words bits = Bits(uint32_t((n0 / 32 + r) * 8 + 2 * t + e), c1);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          float* x = &s[4 * (4 * r + w) + e];  // row i0: x[0]; row i0 + 8: x[2]
          x[0] = KeptLow(bits.w[w]) ? x[0] : 0.0f;
          x[2] = KeptHigh(bits.w[w]) ? x[2] : 0.0f;
        }
      }
  }

  // The backward's keep bits of one step for this thread's S^T fragment
  // (keys `key` + 8hh, key = the warpgroup's first key + 16 warp + g;
  // queries m0 + 8j + 2t + e; m0 a multiple of 16): bit kRowBits hh + 2j + e
  // (FeatureStepMask's layout: kRowBits = kBlockM / 4) of the result,
  // 32 bits at kBlockM = 64, 64 at 128, 16 (of 32) at 32 (the 256 backward's
  // query halves: m0 the half's first query). Packed, so that they are made while
  // S^T and dP^T run (the tensor cores are otherwise idle while both
  // warpgroups turn them into P and dS). The call of (jp, e) serves queries
  // m0 + 16jp + 2t + e (+ 8: j = 2jp + 1) and the key group of `key`, whose
  // words w = 2 (warp % 2) + hh are this thread's.
  template <int kBlockM, typename Bits_ = std::conditional_t<kBlockM <= 64, uint32_t, uint64_t>>
  __host__ __device__ __forceinline__ Bits_ BackwardKeepBits(int key, int m0, int t) const {
    static_assert(kBlockM == 32 || kBlockM == 64 || kBlockM == 128, "16, 32 or 64 keep bits");
    constexpr int kRowBits = kBlockM / 4;
    const uint32_t c0 = uint32_t(key / 32 * 8 + key % 8);
    const bool upper = key % 32 >= 16;  // words 2, 3 (the odd warp of the pair)
    Bits_ keep = 0;
    uint32_t c1 = uint32_t(m0 / 16 * 8 + 2 * t);  // + 8 jp + e
#pragma unroll
    for (int jp = 0; jp < kBlockM / 16; ++jp) {
      // At 128 queries, calls in groups of 4: the next group's counter made
      // to depend on the bits so far, so that ptxas cannot start all 16
      // calls at once (their words and states beside dK, dV and dS^T in
      // flight spilled, 18 local accesses per step at head dim 64).
      if (kBlockM == 128 && jp % 2 == 0 && jp > 0) ChainAfter(c1, keep);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const Philox4x32Words bits = Bits(c0, c1 + uint32_t(8 * jp + e));
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const uint32_t word = upper ? bits.w[2 + hh] : bits.w[hh];
          const int bit = kRowBits * hh + 2 * (2 * jp) + e;  // j = 2jp (half 0); j + 1: bit + 2
          keep |= Bits_(KeptLow(word)) << bit | Bits_(KeptHigh(word)) << (bit + 2);
        }
      }
    }
    return keep;
  }

  // BackwardKeepBits<64>'s bits, each Philox call made once per warp pair:
  // the warps 2v and 2v + 1 of a warpgroup hold keys g + 8 w of the same
  // 32-key group (w = 0, 1 and 2, 3), so each lane's calls are its partner
  // lane's (lane l of the other warp) and BackwardKeepBits uses half of each
  // call's words in both. Here the warp of parity e (= upper: keys 16 .. 31
  // of the group) makes the calls of queries m0 + 16jp + 2t + e (+ 8) alone,
  // and from their words both its own bits (`own`: the bits of column
  // parity e in its fragment) and its partner's (`other`: the same bits of
  // the partner's fragment, from the other two words). own | the partner's
  // other is BackwardKeepBits<64>: 4 calls a step instead of 8.
  struct KeepHalves {
    uint32_t own, other;
  };
  __host__ __device__ __forceinline__ KeepHalves BackwardKeepHalves(int key, int m0, int t) const {
    constexpr int kRowBits = 16;
    const uint32_t c0 = uint32_t(key / 32 * 8 + key % 8);
    const bool upper = key % 32 >= 16;
    const int e = upper ? 1 : 0;
    const uint32_t c1 = uint32_t(m0 / 16 * 8 + 2 * t + e);  // + 8 jp
    // Packed at column parity 0's positions (constants: no shift per bit),
    // then moved to parity e by one shift per word.
    KeepHalves halves{0u, 0u};
#pragma unroll
    for (int jp = 0; jp < 4; ++jp) {
      const Philox4x32Words bits = Bits(c0, c1 + uint32_t(8 * jp));
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const uint32_t mine = upper ? bits.w[2 + hh] : bits.w[hh];
        const uint32_t theirs = upper ? bits.w[hh] : bits.w[2 + hh];
        const int bit = kRowBits * hh + 2 * (2 * jp);  // j = 2jp (half 0); j + 1: bit + 2
        halves.own |= uint32_t(KeptLow(mine)) << bit | uint32_t(KeptHigh(mine)) << (bit + 2);
        halves.other |= uint32_t(KeptLow(theirs)) << bit | uint32_t(KeptHigh(theirs)) << (bit + 2);
      }
    }
    halves.own <<= e;
    halves.other <<= e;
    return halves;
  }

 private:
  // x, as far as the compiler knows, computed from `after` (an empty asm
  // that reads it): what derives from x waits for `after`.
  template <typename T>
  __host__ __device__ __forceinline__ static void ChainAfter(uint32_t& x, T after) {
#ifdef __CUDA_ARCH__
    if constexpr (sizeof(T) == 8) asm volatile("" : "+r"(x) : "l"(after));
    else asm volatile("" : "+r"(x) : "r"(after));
#else
    (void)after;
#endif
  }
};

}  // namespace jax_flash::cuda::sm90
