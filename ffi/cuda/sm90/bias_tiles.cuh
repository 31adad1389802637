// The kMasksBiasTiles forward's bias (kernel_traits.cuh): a bias of the
// inputs' 16-bit type copied by TMA into shared memory, one tile of [64
// query rows][kBlockN keys] per consumer warpgroup, and read from there into
// S's accumulators (which S = Q K^T then adds the products to, as
// kMasksBias16's BiasRows does from global memory).
//
// Why: BiasRows loads a block's bias from global memory into S's registers
// right before S is issued, and the wgmma waits for all of the thread's 32
// loads: their round trip (L2, or HBM for a bias of many heads, ~1 us) lies
// on the warpgroup's path once per key block, against ~0.7 us of its two
// products at head dim 128 (the bias forward ran 0.54-0.57x of plain in
// v26-v30, nearly what that ratio predicts). Here the producer issues the
// copy of a warpgroup's next tile as soon as the warpgroup has read the
// current one, a whole block of time before it is needed, and the read is
// kBlockN / 16 ldmatrix.x4 per thread.
//
// Layout: a tile is kBlockN / 64 column chunks of [64 rows][64 keys], each
// row 128 bytes in TMA's 128-byte swizzle (16-byte piece c of row r stored
// at piece c ^ (r % 8)), as the K tiles; an 8 x 8 ldmatrix matrix is one
// piece of 8 consecutive rows, so its 8 row reads fall in 8 different
// bank groups. One tile per consumer warpgroup, each with a full and an
// empty mbarrier, past the forward's own shared memory (FwdTraits): at head
// dim 128 the block then takes 231,424 of sm_90's 232,448 bytes, so each
// warpgroup has one tile, not a ring: the copy of block i + 1 waits for the
// warpgroup's read of block i (at the start of its step i), which leaves it
// the step's products and softmax to land.
//
// The producer thread issues each copy as soon as its tile is free: its K/V
// copies then run with K a block ahead of V (ProduceTile says why).
// Keys past seqlen_k and rows past seqlen_q arrive as zeros (the masks hide
// those pairs, and those rows are not stored). A bias broadcast over the
// batch or the heads is mapped with that dimension of size 1 and read at
// coordinate 0 (BiasTilesCoordinate); one broadcast over the queries or the
// keys, or whose strides or base TMA cannot take, is kMasksBias16's
// (BiasTilesServe).
//
// Fragment: ldmatrix.x4 number p (0 .. kBlockN / 16 - 1) of a warp reads,
// of the warp's 16 rows, the 8 x 8 matrices (rows 8 hh .., keys 8 j ..) for
// matrix m = 0 .. 3: hh = m % 2, j = 2p + m / 2. Lane l gives the address
// of row l % 8 of matrix l / 8 and receives, per matrix, the pair (row l /
// 4, keys 2 (l % 4), + 1) in one word, lower key in the low half: S's
// accumulator layout (softmax.cuh: element 4j + 2hh + e is row g + 8hh,
// key 8j + 2t + e, g = l / 4, t = l % 4; FragmentPairsToLogits).
// Host-callable parts (the lane offsets and the conversion) for
// tests/cpp/sm90_bias_tiles_test.cu. The backward's tile: BwdBiasTile.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/params.h"
#include "cuda/sm80/mma.cuh"           // LdMatrixX4, LdMatrixX4Trans
#include "cuda/sm90/feature_mask.cuh"  // BiasColumns::BitsToFloat, BiasTilesServe
#include "cuda/sm90/tensor_map.h"
#include "cuda/sm90/tma.cuh"

namespace jax_flash::cuda::sm90 {

// The tiles' tensor map of p's bias, the forward's and the backward's alike
// (boxes of 64 keys x 64 rows in the 128-byte swizzle: one warpgroup's
// rows, or one 64-query step): EncodeBtnhMap's [batch, seq, heads,
// head_dim] with the keys in place of the head dim, a dimension the bias
// is broadcast along of size 1 (the kernels read it at 0:
// BiasTilesCoordinate), and seqlen_q or seqlen_k of 0 mapped as 1 (a map
// has no empty dimension; no copy reads one then: the backward writes dK =
// dV = 0 for keys no query sees).
template <typename Element>
inline std::string EncodeBiasTilesMap(CUtensorMap* map, const AttentionParams& p) {
  const AttentionFeatures& f = p.features;
  const AttentionShape& s = p.shape;
  const int64_t batch_stride = BiasFlatBatchStride(f);
  constexpr CUtensorMapDataType kType =
      std::is_same_v<Element, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return EncodeBtnhMap(map, kType, f.bias, batch_stride == 0 ? 1 : s.batch, s.seqlen_q > 0 ? s.seqlen_q : 1,
                       f.bias_stride.head == 0 ? 1 : s.num_heads, s.seqlen_k > 0 ? s.seqlen_k : 1,
                       Strides{batch_stride, f.bias_stride.row, f.bias_stride.head}, 64, "bias");
}

// Whether this device has the shared memory of a kernel taking `bytes`
// (the tiles' variants take 216-231 KiB: every 9.x part has 227).
inline bool DeviceHasSmem(int bytes) {
  int device = 0, optin = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
         optin >= bytes;
}

// The tensor map's coordinate of batch row b or head h: 0 where the bias is
// broadcast along that dimension (stride 0; the map has it of size 1).
__host__ __device__ __forceinline__ int BiasTilesCoordinate(int64_t stride, int index) {
  return stride == 0 ? 0 : index;
}

// Load p's four words of a fragment (matrix m = 0 .. 3 in r[m]: rows 8hh ..
// x columns 8j .., hh = m % 2, j = 2p + m / 2; the lower column in the low
// half), times `unscale` (1 / scale), into accumulators whose element 4j +
// 2hh + e is row g + 8hh, column 8j + 2t + e (S's in the forward, S^T's in
// the backward, softmax.cuh's layout): the floats BiasColumns makes of the
// same bits. `kCols`: the fragment's columns (keys, or the backward's queries).
template <typename BiasT, int kCols>
__host__ __device__ __forceinline__ void FragmentPairsToLogits(float (&s)[kCols / 2], const uint32_t (&r)[4], int p,
                                                               float unscale) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int k = 4 * (2 * p + m / 2) + 2 * (m % 2);
    s[k] = BiasColumns<BiasT>::BitsToFloat(r[m] & 0xffffu) * unscale;
    s[k + 1] = BiasColumns<BiasT>::BitsToFloat(r[m] >> 16) * unscale;
  }
}

template <typename Tr>
struct BiasTiles {
  static_assert(Tr::kBlockN % 64 == 0, "whole 64-key chunks of 128 bytes");
  static constexpr int kWarpgroups = Tr::kConsumerWarpgroups;
  static constexpr int kChunks = Tr::kBlockN / 64;
  static constexpr int kChunkBytes = 64 * 128;  // [64 rows][64 keys], one TMA box
  static constexpr int kTileBytes = kChunks * kChunkBytes;
  static constexpr int kLoads = Tr::kBlockN / 16;  // ldmatrix.x4 per thread and block
  // Past the key-block slots (two of 16 bytes): the barriers, 16 bytes per
  // warpgroup (full, empty), then the tiles on 1024-byte atoms.
  static constexpr int kBarrierOffset = Tr::kKeyBlocksOffset + 2 * 16;
  static constexpr int kOffset = (kBarrierOffset + 16 * kWarpgroups + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = kOffset + kWarpgroups * kTileBytes + 1024;  // (+ the base's alignment)
  static_assert(kSmemBytes <= 227 * 1024, "over sm_90's 227 KiB per block");

  uint32_t smem;  // the block's shared memory, 1024-byte aligned

  __device__ __forceinline__ uint32_t full(int w) const { return smem + kBarrierOffset + 16 * w; }
  __device__ __forceinline__ uint32_t empty(int w) const { return smem + kBarrierOffset + 16 * w + 8; }
  __device__ __forceinline__ uint32_t tile(int w) const { return smem + kOffset + w * kTileBytes; }

  // By the thread that initializes the forward's Barriers, before them (their
  // Init's fence publishes these too). Full: the producer's expect_tx; empty:
  // one arrival per thread of the warpgroup, each after its own reads (as
  // the backward's stage empties: one per warp after a __syncwarp, which
  // ptxas drops in converged code, left racecheck to see the reads
  // unordered with the next writes, session 19).
  __device__ __forceinline__ void Init() const {
#pragma unroll
    for (int w = 0; w < kWarpgroups; ++w) {
      MbarrierInit(full(w), 1);
      MbarrierInit(empty(w), 128);
    }
  }

  // The producer thread: warpgroup w's tile of key block [n0, n0 + kBlockN)
  // (its rows from m0 + 64 w) in phase `parity` (the block's count across
  // the block's tiles, & 1: one tile per warpgroup, so the phase flips
  // every block), once the warpgroup has read the one before. Waits on
  // empties start from parity 1, as the ring's.
  __device__ __forceinline__ void Issue(int w, const CUtensorMap* map, int n0, int m0, int head, int batch,
                                        uint32_t parity) const {
    MbarrierWait(empty(w), parity ^ 1);
    MbarrierArriveExpectTx(full(w), kTileBytes);
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
      TmaLoad4d(tile(w) + c * kChunkBytes, map, full(w), n0 + 64 * c, m0 + 64 * w, head, batch);
  }

  // Byte offset in a warpgroup's tile of lane `lane`'s row for load p of
  // warp `warp` (0 .. 3): row 16 warp + 8 hh + l % 8 of matrix m = l / 8,
  // keys 8j .. 8j + 7 (j = 2p + m / 2), piece j % 8 of chunk j / 8, swizzled.
  __host__ __device__ __forceinline__ static uint32_t LaneOffset(int warp, int lane, int p) {
    const int m = lane / 8, row = 16 * warp + 8 * (m % 2) + lane % 8, j = 2 * p + m / 2;
    return uint32_t((j / 8) * kChunkBytes + row * 128 + (((j % 8) ^ (row % 8)) << 4));
  }

  // Consumer warpgroup w: its tile of the block in phase `parity` into S's
  // accumulators s (times `unscale`), then the tile released to the
  // producer (every thread's arrival, after its reads are in registers:
  // its release lets the next copy overwrite).
  template <typename BiasT>
  __device__ __forceinline__ void Load(float (&s)[Tr::kBlockN / 2], int w, int warp, int lane, uint32_t parity,
                                       float unscale) const {
    MbarrierWait(full(w), parity);
    const uint32_t base = tile(w);
    uint32_t r[kLoads][4];
#pragma unroll
    for (int p = 0; p < kLoads; ++p) sm80::LdMatrixX4(r[p], base + LaneOffset(warp, lane, p));
#pragma unroll
    for (int p = 0; p < kLoads; ++p) FragmentPairsToLogits<BiasT, Tr::kBlockN>(s, r[p], p, unscale);
    MbarrierArrive(empty(w));
  }
};

// The backward's bias tile (kMasksBiasTiles in bwd_kernel.cuh, head dim
// 128): a step's [kBlockM queries][kBlockN keys] of the bias, copied by the
// producer thread after the step's Q and dO (two boxes of 64 keys, the
// forward's map) and read by each consumer warpgroup into S^T's
// accumulators by ldmatrix.trans (its 64 keys are chunk w). One tile, not a
// ring: the copy of step i + 1 waits for every consumer thread's read of
// step i's (at the start of its step i), a step ahead of its use. In place
// of BiasColumns' 32 two-byte loads per thread and step (rows `kBlockM`
// apart: a load per element) and their addresses; queries past seqlen_q
// arrive as zeros instead of the last row (their P is 0 either way: lse2
// +inf). At 128 the kernel then takes 216,064 bytes; at 64 (128-query
// steps, 32 KiB a tile) it would not fit, and kMasksBias16 stays.
//
// Fragment: ldmatrix.x4.trans number p (0 .. kBlockM / 16 - 1) of warp
// `warp` reads the 8 x 8 matrices (queries 8 j .., keys 16 warp + 8 hh ..)
// for m = 0 .. 3: hh = m % 2, j = 2p + m / 2; lane l gives the address of
// query row 8j + l % 8 of matrix l / 8 and receives, transposed, the pair
// (queries 8j + 2 (l % 4), + 1; key 16 warp + 8hh + l / 4): S^T's layout
// (element 4j + 2hh + e is key g + 8hh, query 8j + 2t + e), the same
// element order as the forward's fragments (FragmentPairsToLogits).
template <typename Tr>
struct BwdBiasTile {
  static_assert(Tr::kBlockN == 128 && Tr::kConsumerWarpgroups == 2, "warpgroup w's 64 keys are chunk w");
  static constexpr int kChunkBytes = Tr::kBlockM * 128;  // [kBlockM queries][64 keys]
  static constexpr int kTileBytes = 2 * kChunkBytes;
  static constexpr int kLoads = Tr::kBlockM / 16;  // ldmatrix.x4.trans per thread and step
  // Past the traits' barriers: full, empty, then the tile on a 1024-byte atom.
  static constexpr int kBarrierOffset = Tr::kBarrierOffset + 8 * Tr::kBarriers;
  static constexpr int kOffset = (kBarrierOffset + 16 + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = kOffset + kTileBytes + 1024;  // (+ the base's alignment)
  static_assert(kSmemBytes <= 227 * 1024, "over sm_90's 227 KiB per block");

  uint32_t smem;  // the block's shared memory, 1024-byte aligned

  __device__ __forceinline__ uint32_t full() const { return smem + kBarrierOffset; }
  __device__ __forceinline__ uint32_t empty() const { return smem + kBarrierOffset + 8; }

  // By the thread that initializes BwdBarriers, before them (their Init's
  // fence publishes these too). Empty: one arrival per consumer thread.
  __device__ __forceinline__ void Init() const {
    MbarrierInit(full(), 1);
    MbarrierInit(empty(), 32 * Tr::kConsumerWarps);
  }

  // The producer thread: step i's tile (queries from m0, the tile's keys
  // from n0), phase i & 1, once every consumer has read step i - 1's.
  __device__ __forceinline__ void Issue(const CUtensorMap* map, int n0, int m0, int head, int batch,
                                        uint32_t parity) const {
    MbarrierWait(empty(), parity ^ 1);
    MbarrierArriveExpectTx(full(), kTileBytes);
#pragma unroll
    for (int c = 0; c < 2; ++c)
      TmaLoad4d(smem + kOffset + c * kChunkBytes, map, full(), n0 + 64 * c, m0, head, batch);
  }

  // Byte offset in the tile of lane `lane`'s row for load p of warp `warp`
  // (0 .. 3) of consumer warpgroup w: query row 8j + l % 8 (j = 2p + m / 2),
  // keys 16 warp + 8 hh .. + 7 of chunk w (piece 2 warp + hh), swizzled.
  __host__ __device__ __forceinline__ static uint32_t LaneOffset(int w, int warp, int lane, int p) {
    const int m = lane / 8, row = 8 * (2 * p + m / 2) + lane % 8, piece = 2 * warp + m % 2;
    return uint32_t(w * kChunkBytes + row * 128 + ((piece ^ (row % 8)) << 4));
  }

  // Consumer warpgroup w: step `parity`'s tile into S^T's accumulators
  // (times `unscale`), then released (every thread's arrival).
  template <typename BiasT>
  __device__ __forceinline__ void Load(float (&st)[Tr::kBlockM / 2], int w, int warp, int lane, uint32_t parity,
                                       float unscale) const {
    MbarrierWait(full(), parity);
    const uint32_t base = smem + kOffset;
    uint32_t r[kLoads][4];
#pragma unroll
    for (int p = 0; p < kLoads; ++p) sm80::LdMatrixX4Trans(r[p], base + LaneOffset(w, warp, lane, p));
#pragma unroll
    for (int p = 0; p < kLoads; ++p) FragmentPairsToLogits<BiasT, Tr::kBlockM>(st, r[p], p, unscale);
    MbarrierArrive(empty());
  }
};

}  // namespace jax_flash::cuda::sm90
