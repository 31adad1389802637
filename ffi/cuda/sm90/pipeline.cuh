// The producer side of the forward: the block's mbarriers and the TMA copies
// of Q and of the K/V ring (one thread issues them all).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/params.h"
#include "cuda/sm90/bias_tiles.cuh"
#include "cuda/sm90/feature_mask.cuh"
#include "cuda/sm90/kernel_traits.cuh"
#include "cuda/sm90/tile_scheduler.cuh"  // FastDivisor
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace jax_flash::cuda::sm90 {

// What the kernel reads besides the tensor maps, in 32 bits (the feature
// variants also take the whole AttentionParams for the mask policy).
struct ForwardArgs {
  void* out;   // [B, Tq, N, H] strided like q
  float* lse;  // [B, N, Tq]
  Strides out_stride;
  int seqlen_q, seqlen_k, num_heads, head_dim;
  FastDivisor group;  // query heads per key head (the producer's h -> key head, without a division)
  float scale_log2;  // scale * log2(e), scale > 0
  bool is_causal;
  // The soft cap's SoftcapFactors (feature_mask.cuh; kMasksSoftcap only).
  // kMasksBias (which refuses the soft cap) takes 1 / scale in
  // softcap_unscale: the bias in S's raw units (BiasRows). A member of its
  // own would move the kernel parameters after ForwardArgs, hence every
  // other variant's SASS.
  float softcap_scale, softcap_unscale;
};

// The mbarriers of the block (kernel_traits.cuh). The block's k-th tile
// uses the Q pair in parity k & 1; the key blocks of all its tiles, counted
// in processing order across tiles (`pipe`), use stage pipe % kStages in
// parity (pipe / kStages) & 1 on all four of their barriers.
template <typename Tr>
struct Barriers {
  uint32_t base;
  __device__ uint32_t q_full() const { return base; }
  // Q free again: all consumer warpgroups are done with it (after their
  // last S, or, when Q doubles as the output staging, after the epilogue).
  __device__ uint32_t q_empty() const { return base + 8; }
  __device__ uint32_t k_full(int s) const { return base + 8 * (2 + s); }
  __device__ uint32_t v_full(int s) const { return base + 8 * (2 + Tr::kStages + s); }
  __device__ uint32_t k_empty(int s) const { return base + 8 * (2 + 2 * Tr::kStages + s); }
  __device__ uint32_t v_empty(int s) const { return base + 8 * (2 + 3 * Tr::kStages + s); }

  // By one thread, before the __syncthreads that publishes them. Empties
  // take one arrival per consumer warp (its lane 0, after its wgmma wait).
  __device__ void Init() const {
    MbarrierInit(q_full(), 1);
    MbarrierInit(q_empty(), Tr::kConsumerWarps);
    for (int s = 0; s < Tr::kStages; ++s) {
      MbarrierInit(k_full(s), 1);
      MbarrierInit(v_full(s), 1);
      MbarrierInit(k_empty(s), Tr::kConsumerWarps);
      MbarrierInit(v_empty(s), Tr::kConsumerWarps);
    }
    FenceBarrierInit();
  }
};

template <typename Tr>
__device__ __forceinline__ uint32_t KTile(uint32_t smem, int stage) {
  return smem + Tr::kKOffset + stage * Tr::kKvTileBytes;
}
template <typename Tr>
__device__ __forceinline__ uint32_t VTile(uint32_t smem, int stage) {
  return smem + Tr::kVOffset + stage * Tr::kKvTileBytes;
}

// wgmma descriptors of the tiles as LoadTile leaves them (wgmma.cuh).
// K-major operand (Q as A, K as B of S = Q K^T), k16 step kk: 32 bytes into
// the 128-byte rows of column chunk kk / 4; `tile` the tile's (or the
// warpgroup's first row's) address, `chunk_bytes` its column-chunk stride.
template <typename Tr>
__device__ __forceinline__ uint64_t KMajorDescriptor(uint32_t tile, int chunk_bytes, int kk) {
  return SmemDescriptor(tile + (kk / 4) * chunk_bytes + (kk % 4) * 32, 16, 1024);
}
// V as B of O += P V, k16 step kk (16 keys). V's tile is [keys][kHeadDim]
// row-major: N (head dim) contiguous, so MN-major, with 8-key atoms 1024
// bytes apart (stride) and 64-column chunks kKvChunkBytes apart (leading).
template <typename Tr>
__device__ __forceinline__ uint64_t VDescriptor(uint32_t v_tile, int kk) {
  return SmemDescriptor(v_tile + kk * 16 * 128, Tr::kKvChunkBytes, 1024);
}

// Copies one [rows][kHeadDim] tile as kChunks boxes of 64 columns.
template <typename Tr>
__device__ __forceinline__ void LoadTile(uint32_t dst, int chunk_bytes, const CUtensorMap* map,
                                         uint32_t bar, int row, int head, int batch) {
#pragma unroll
  for (int c = 0; c < Tr::kChunks; ++c)
    TmaLoad4d(dst + c * chunk_bytes, map, bar, c * Tr::kChunkCols, row, head, batch);
}

__device__ __forceinline__ void PrefetchTensorMaps(const CUtensorMap* q_map, const CUtensorMap* k_map,
                                                   const CUtensorMap* v_map) {
  PrefetchTensorMap(q_map);
  PrefetchTensorMap(k_map);
  PrefetchTensorMap(v_map);
}

// The feature variants' key blocks of the block's `tile_iter`-th tile, and
// the block's tile after it (taken tiles: fwd_kernel.cuh's
// for_each_taken_tile), in shared
// memory slot tile_iter & 1: written by the producer thread after
// q_empty's wait and before its arrival on q_full (release), read by the
// consumers after their wait on q_full (acquire). The consumers read a
// tile's slot before they release Q for the tile after it, and the producer
// writes that slot again only after that release (two tiles on).
// FeatureKeyBlocks (warp votes over chains of global loads) then runs once
// per tile, in the producer warp ahead of the copies, instead of also at the
// head of each consumer warp's tile.
template <typename Tr>
__device__ __forceinline__ uint32_t KeyBlocksSlot(uint32_t smem, int tile_iter) {
  return smem + Tr::kKeyBlocksOffset + 16 * (tile_iter & 1);
}
__device__ __forceinline__ void StoreKeyBlocks(uint32_t slot, KeyBlocks keys, int next_tile) {
  asm volatile("st.shared.v2.s32 [%0], {%1, %2};\n" ::"r"(slot), "r"(keys.lo), "r"(keys.hi) : "memory");
  asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(slot + 8), "r"(next_tile) : "memory");
}
__device__ __forceinline__ KeyBlocks LoadKeyBlocks(uint32_t slot) {
  KeyBlocks keys;
  asm volatile("ld.shared.v2.s32 {%0, %1}, [%2];\n" : "=r"(keys.lo), "=r"(keys.hi) : "r"(slot) : "memory");
  return keys;
}
__device__ __forceinline__ int LoadNextTile(uint32_t slot) {
  int next_tile;
  asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(next_tile) : "r"(slot + 8) : "memory");
  return next_tile;
}

// Issued by one thread for the block's `tile_iter`-th tile: K and V of key
// blocks keys.hi - 1 down to keys.lo into the ring (from ring position
// `pipe`), each stage as soon as all consumer warps released it, and Q once
// the previous tile released it (q_empty), after the first K: where Q
// doubles as the output staging, that K copy then runs under the previous
// tile's epilogue; a tile without key blocks gets no Q copy. Producer waits
// on empties start from parity 1: a fresh barrier counts its "previous"
// phase as done. kPublishKeys (feature variants): also publishes `keys`
// and `next_tile` for the consumers (KeyBlocksSlot) before q_full's arrival.
// kBiasTiles (kMasksBiasTiles): also each block's bias tiles (BiasTiles,
// from `bias_map` at head `bias_h`, batch row `bias_b`), in an order of
// their own (below).
template <typename Tr, bool kPublishKeys = false, bool kBiasTiles = false>
__device__ __forceinline__ void ProduceTile(const CUtensorMap* q_map, const CUtensorMap* k_map,
                                            const CUtensorMap* v_map, Barriers<Tr> bars, uint32_t smem,
                                            int m0, int h, int hk, int b, KeyBlocks keys, int pipe,
                                            int tile_iter, int next_tile = 0, const CUtensorMap* bias_map = nullptr,
                                            int bias_h = 0, int bias_b = 0) {
  const uint32_t q_parity = (tile_iter & 1) ^ 1;
  auto publish = [&] {
    if constexpr (kPublishKeys) StoreKeyBlocks(KeyBlocksSlot<Tr>(smem, tile_iter), keys, next_tile);
  };
  if (keys.hi <= keys.lo) {
    // A tile with no visible key block (lengths, offsets, documents) only
    // writes zeros and lse -inf: Q is not copied, a plain arrival completes
    // q_full's phase (after the previous tile released Q, as a copy would).
    MbarrierWait(bars.q_empty(), q_parity);
    publish();
    MbarrierArrive(bars.q_full());
    return;
  }
  // The ring position of the next key block as a stage and its parity,
  // advanced per block (no division per block), and the block's first key.
  int stage = pipe % Tr::kStages;
  uint32_t parity = (pipe / Tr::kStages) & 1;
  int n0 = (keys.hi - 1) * Tr::kBlockN;
  const int n_end = keys.lo * Tr::kBlockN;
  auto load_k = [&] {
    MbarrierWait(bars.k_empty(stage), parity ^ 1);
    MbarrierArriveExpectTx(bars.k_full(stage), Tr::kKvTileBytes);
    LoadTile<Tr>(KTile<Tr>(smem, stage), Tr::kKvChunkBytes, k_map, bars.k_full(stage), n0, hk, b);
  };
  auto advance = [&] {
    if (++stage == Tr::kStages) stage = 0, parity ^= 1;
    n0 -= Tr::kBlockN;
  };
  auto load_v = [&](int v_stage, uint32_t v_parity, int v_n0) {
    MbarrierWait(bars.v_empty(v_stage), v_parity ^ 1);
    MbarrierArriveExpectTx(bars.v_full(v_stage), Tr::kKvTileBytes);
    LoadTile<Tr>(VTile<Tr>(smem, v_stage), Tr::kKvChunkBytes, v_map, bars.v_full(v_stage), v_n0, hk, b);
  };
  auto load_q = [&] {
    MbarrierWait(bars.q_empty(), q_parity);
    publish();
    MbarrierArriveExpectTx(bars.q_full(), Tr::kQBytes);
    LoadTile<Tr>(smem + Tr::kQOffset, Tr::kQChunkBytes, q_map, bars.q_full(), m0, h, b);
  };
  if constexpr (kBiasTiles) {
    // K and the bias tiles one block ahead of V (FlashAttention-3's
    // producer order), each block's first warpgroup's tile before the
    // previous block's V and the others' after it. In ping-pong, with
    // warpgroup w's step j over [j + w / 2, j + 1 + w / 2) (in steps), the
    // producer's gates are: K_{j+1} the end of both S_{j-1} (~j - 0.2),
    // warpgroup 0's tile j + 1 its read of tile j (j), V_j the release of
    // its stage's previous V (the end of both steps j - 1: j + 0.5),
    // warpgroup 1's tile j + 1 its read of tile j (j + 0.5). So each tile
    // has a whole step to land, K 1.2 and V 0.5 as before (in the order K,
    // bias, V, warpgroup 0's tile j + 1 waited behind V_j: half a step; K
    // too).
    const BiasTiles<Tr> tiles{smem};
    uint32_t bias_parity = pipe & 1;  // one tile per warpgroup: the block count's parity
    int v_stage = stage, v_n0 = n0;
    uint32_t v_parity = parity;
    load_k();
    load_q();
#pragma unroll
    for (int w = 0; w < Tr::kConsumerWarpgroups; ++w) tiles.Issue(w, bias_map, n0, m0, bias_h, bias_b, bias_parity);
    bias_parity ^= 1;
    advance();
#pragma unroll 1
    while (n0 >= n_end) {
      load_k();
      tiles.Issue(0, bias_map, n0, m0, bias_h, bias_b, bias_parity);
      load_v(v_stage, v_parity, v_n0);
      if (++v_stage == Tr::kStages) v_stage = 0, v_parity ^= 1;
      v_n0 -= Tr::kBlockN;
#pragma unroll
      for (int w = 1; w < Tr::kConsumerWarpgroups; ++w) tiles.Issue(w, bias_map, n0, m0, bias_h, bias_b, bias_parity);
      bias_parity ^= 1;
      advance();
    }
    load_v(v_stage, v_parity, v_n0);  // the last block's
    return;
  }
  // The first block, with Q after its K (peeled: m0, h and the Q parity are
  // then dead in the loop below, which holds only the ring state, n0 and
  // the coordinates of K/V: the producer has 24 registers at 256).
  load_k();
  load_q();
  load_v(stage, parity, n0);
  advance();
  // Not unrolled: the copies gain nothing from it, and the unrolled loop's
  // state is what spilled the producer's 24 registers (ptxas: 80 B of
  // spills in the plain kernels, before this loop lost Q and the divisions).
#pragma unroll 1
  while (n0 >= n_end) {
    load_k();
    load_v(stage, parity, n0);
    advance();
  }
}

}  // namespace jax_flash::cuda::sm90
