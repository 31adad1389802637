// Host side of the decode kernels (issue 22): split-KV forward for short
// queries over a long cache, contiguous (jax_flash.attention) and paged
// (jax_flash.paged_attention). Compile-checked; NOT yet wired into the
// dispatch (ffi/cuda/handlers.cu), CMakeLists.txt or Python: that follows a
// GPU validation run (bash scripts/decode_check.sh on the H200).
//
// ## Design
// - Rows: the Tq new tokens x the G = N / K query heads of one key head,
//   token-major, in blocks of 64 rows (4 warps x one 16-row m16n8k16 m-tile);
//   with <= 32 rows the warps of an m-tile split each key tile instead
//   (kernel_traits.cuh). Each K/V row read serves all G heads. Q's fragments
//   stay in registers at head dims 64 / 128.
// - Grid (splits * m_blocks, K, sequences); K/V tiles of 64 keys through
//   4 / 3 / 2 cp.async stages at 64 / 128 / 256 (48 / 64 / 64 KB in flight
//   per block), 16-byte copies, one barrier per tile.
// - Splits: each (sequence, key head, row block) splits its own visible key
//   range into `splits` parts. One split writes out and lse directly (no
//   combine launch, no scratch: chosen without measurements, because it is
//   strictly less work); more write float partials that CombineSplitsKernel
//   merges by their logsumexps. The count comes from ChooseSplits (the SM
//   count and the kernel's occupancy: the count whose whole waves keep the
//   most block slots busy, fewest on ties; B=8 K=8 Tq=1 on an H200: 4
//   splits, 256 blocks, one wave) unless a caller forces one.
//
// ## Routing plan for the dispatch (handlers.cu, after GPU validation)
// In the CUDA forward handler, before the sm90 / sm80 / generic choice, send
// a call to decode::LaunchForward<Element, kPaddedHeadDim>(p, /*splits=*/0,
// scratch_out, scratch_lse, stream) when all of these hold:
//   - dtype f16 or bf16, seqlen_q <= 64 and seqlen_q < seqlen_k (square
//     prefill calls stay on the training kernels, which are faster there);
//   - decode::Unsupported(p) is "" (v1 leaves bias, mask arrays, segment
//     ids and dropout out on purpose: those calls, and scale <= 0 or
//     unaligned strides, stay on the training kernels; bias and key-only
//     masks are the next to add, both per-(row, key) reads in the masked
//     chunk path);
//   - decode::DecodeSmemBytes(head_dim) <= the device's opt-in shared memory
//     per block (sm_86 / sm_89 keep head dims above 64 on the other kernels).
// kPaddedHeadDim = 64 / 128 / 256 as the other families round. Backward:
// unchanged (the training kernels' backward; the decode forward writes the
// same lse, so residuals match).
// The paged handler (jax_flash_paged_fwd on CUDA, today the gather fallback
// in jax_flash/_paged_gather.py) calls decode::LaunchPagedForward for f16 /
// bf16 when UnsupportedPaged(p) is "" and the shared memory fits (float32
// stays on the gather path).
//
// ## Scratch the handler must request (an extra ffi_call result, float32)
// Python computes the same numbers at trace time from static shapes:
//   max_splits = DecodeMaxSplits(sequences, seqlen_q, num_heads, num_heads_k, seqlen_k)
//   (paged: sequences = outer * batch, seqlen_k = max_blocks * block_size)
//   scratch = DecodeScratchFloats(sequences, seqlen_q, num_heads, head_dim, max_splits)
// one flat float32 buffer of `scratch` elements (0 when max_splits == 1:
// request a 1-element dummy), passed as scratch_out = buf and scratch_lse =
// buf + DecodePartialOutFloats(...). The handler passes splits = 0 (auto,
// capped at max_splits); tests force counts through the same parameter.
// Nothing is allocated inside the handler (CUDA-graph safe).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/paged_params.h"
#include "common/params.h"
#include "cuda/decode/kernel_traits.cuh"

namespace jax_flash::cuda::decode {

// Shared memory (bytes) of the split forward at a head dim, for the dispatch
// to check against the device: 72 / 112 / 160 KB at 64 / 128 / 256, so
// sm_86 / sm_89 (99 KB a block) take only head dims up to 64 here and keep
// the training kernels above.
inline int DecodeSmemBytes(int64_t head_dim) {
  return head_dim <= 64    ? DecodeTraits<64>::kSmemBytes
         : head_dim <= 128 ? DecodeTraits<128>::kSmemBytes
                           : DecodeTraits<256>::kSmemBytes;
}

// The grid a split count may grow to: blocks of all splits together. 1024
// covers two waves of 2 blocks per SM on a 256-SM GPU (an H200 has 132) and
// bounds the scratch at 1024 x 64 rows x head_dim floats.
constexpr int64_t kMaxSplitBlocks = 1024;
constexpr int64_t kMaxSplits = 128;
constexpr int64_t kDecodeBlockRows = DecodeTraits<128>::kBlockM;  // the same at every head dim
constexpr int64_t kDecodeBlockKeys = DecodeTraits<128>::kBlockN;
constexpr int64_t kDecodeMinTilesPerSplit = DecodeTraits<128>::kMinTilesPerSplit;

inline int64_t DecodeCeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks of one split: sequences x key heads x blocks of 64 packed rows.
inline int64_t DecodeBlocksPerSplit(int64_t sequences, int64_t seqlen_q, int64_t num_heads,
                                    int64_t num_heads_k) {
  return sequences * num_heads_k * DecodeCeilDiv(seqlen_q * (num_heads / num_heads_k), kDecodeBlockRows);
}

// The most splits a call may use (what its scratch is sized for): at least
// kDecodeMinTilesPerSplit key tiles per split, at most kMaxSplitBlocks
// blocks in all, never more than kMaxSplits.
inline int64_t DecodeMaxSplits(int64_t sequences, int64_t seqlen_q, int64_t num_heads,
                               int64_t num_heads_k, int64_t seqlen_k) {
  const int64_t tiles = DecodeCeilDiv(seqlen_k, kDecodeBlockKeys);
  const int64_t by_work = std::max<int64_t>(1, tiles / kDecodeMinTilesPerSplit);
  const int64_t per_split = DecodeBlocksPerSplit(sequences, seqlen_q, num_heads, num_heads_k);
  const int64_t by_grid = std::max<int64_t>(1, kMaxSplitBlocks / std::max<int64_t>(1, per_split));
  return std::min({by_work, by_grid, kMaxSplits});
}

// Scratch of `splits` partials: out [splits][sequences * num_heads * seqlen_q][head_dim],
// then lse [splits][sequences * num_heads * seqlen_q]; none for one split.
inline int64_t DecodePartialOutFloats(int64_t sequences, int64_t seqlen_q, int64_t num_heads,
                                      int64_t head_dim, int64_t splits) {
  return splits > 1 ? splits * sequences * num_heads * seqlen_q * head_dim : 0;
}
inline int64_t DecodeScratchFloats(int64_t sequences, int64_t seqlen_q, int64_t num_heads,
                                   int64_t head_dim, int64_t splits) {
  return splits > 1 ? splits * sequences * num_heads * seqlen_q * (head_dim + 1) : 0;
}

// The split count whose grid keeps the most of the GPU's `slots` (SMs x
// resident blocks per SM) busy, counting whole waves of equally long blocks:
// use(s) = blocks / (waves * slots). A larger count must gain 2% to win, so
// ties go to fewer splits (less partial traffic, a shorter combine).
inline int ChooseSplits(int64_t blocks_per_split, int64_t max_splits, int64_t slots) {
  auto use = [&](int64_t s) {
    const int64_t blocks = s * blocks_per_split;
    return double(blocks) / double(DecodeCeilDiv(blocks, slots) * slots);
  };
  int64_t best = 1;
  double best_use = use(1);
  for (int64_t s = 2; s <= max_splits; ++s)
    if (use(s) > best_use + 0.02) best = s, best_use = use(s);
  return int(best);
}

// Why the decode path cannot take this contiguous call ("" if it can):
// features v1 leaves out, and what its 16-byte copies and 32-bit key
// positions need. The dispatch routes a call here only when it is "".
inline std::string Unsupported(const AttentionParams& p) {
  const AttentionFeatures& f = p.features;
  const AttentionShape& s = p.shape;
  if (f.bias) return "a bias";
  if (f.mask) return "a mask array";
  if (f.q_segment_ids || f.kv_segment_ids) return "segment ids";
  if (f.dropout_rate > 0.0) return "dropout";
  if (!(p.scale > 0.0)) return "scale <= 0";
  if (s.head_dim % 8 != 0 || s.head_dim > 256) return "head_dim not a multiple of 8 up to 256";
  if (s.num_heads_k <= 0 || s.num_heads % s.num_heads_k != 0) return "key heads not dividing query heads";
  if (s.seqlen_k >= (int64_t(1) << 31) - kDecodeBlockKeys || s.seqlen_q * s.group() >= (int64_t(1) << 31))
    return "sequences of 2^31 positions or more";
  if (s.batch > 65535 || s.num_heads_k > 65535) return "more than 65535 sequences or key heads";
  auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  auto odd = [](const Strides& st) { return st.batch % 8 || st.row % 8 || st.head % 8; };
  if (misaligned(p.q) || misaligned(p.k) || misaligned(p.v) || misaligned(p.out) || odd(p.q_stride) ||
      odd(p.k_stride))
    return "tensors or strides not 16-byte aligned";
  return {};
}
inline std::string UnsupportedPaged(const PagedParams& p) {
  const PagedShape& s = p.shape;
  if (!(p.scale > 0.0)) return "scale <= 0";
  if (s.head_dim % 8 != 0 || s.head_dim > 256) return "head_dim not a multiple of 8 up to 256";
  if (s.num_heads_k <= 0 || s.num_heads % s.num_heads_k != 0) return "key heads not dividing query heads";
  if (s.num_blocks < 1 || s.block_size < 1 || s.max_blocks < 1) return "an empty pool or table";
  if (s.max_seqlen() >= (int64_t(1) << 31) - kDecodeBlockKeys || s.num_blocks >= (int64_t(1) << 31) ||
      s.seqlen_q * s.group() >= (int64_t(1) << 31))
    return "tables of 2^31 positions or blocks or more";
  if (s.outer * s.batch > 65535 || s.num_heads_k > 65535) return "more than 65535 sequences or key heads";
  auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (misaligned(p.q) || misaligned(p.k_cache) || misaligned(p.v_cache) || misaligned(p.out))
    return "tensors not 16-byte aligned";
  return {};
}

// splits > 0: exactly that many (the caller's scratch holds them; tests);
// 0: ChooseSplits, capped at DecodeMaxSplits. Scratch may be null when the
// launch ends up with one split. kHeadDim 64, 128 or 256 (head_dim rounded
// up; head_dim % 8 == 0). *splits_used (if given) gets the count launched.
// "" on success, else a message naming the kernel and the shape.
template <typename Element, int kHeadDim>
std::string LaunchForward(const AttentionParams& p, int splits, float* scratch_out, float* scratch_lse,
                          cudaStream_t stream, int* splits_used = nullptr);
template <typename Element, int kHeadDim>
std::string LaunchPagedForward(const PagedParams& p, int splits, float* scratch_out, float* scratch_lse,
                               cudaStream_t stream, int* splits_used = nullptr);

}  // namespace jax_flash::cuda::decode
