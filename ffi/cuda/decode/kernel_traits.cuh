// Tile sizes of the decode (split-KV, short-query) kernels, per padded head
// dim, in this one place. See launch.h for the design and the dispatch plan.
#pragma once

namespace jax_flash::cuda::decode {

template <int kHeadDim_>
struct DecodeTraits {
  static constexpr int kHeadDim = kHeadDim_;  // 64, 128 or 256
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256);
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  // A block owns up to 64 packed query rows (Tq tokens x the G query heads of
  // one key head, token-major: row R is token R / G of head R % G), one
  // 16-row m-tile per warp at most. With fewer rows (a decode step: Tq = 1,
  // G = 4 fills 4 rows) the warps holding the same m-tile split each key
  // tile between them instead of repeating empty m-tiles: rows <= 16 -> 4
  // warps on one m-tile, each 16 of the tile's 64 keys; <= 32 -> 2 x 2; more
  // -> 4 m-tiles, each warp all 64 keys. A warp always computes 16-key
  // chunks (m16n8k16 with two n-tiles), so one compiled body serves every
  // arrangement; the warps' partial softmax states merge once per block.
  static constexpr int kRowsPerTile = 16;
  static constexpr int kBlockM = kWarps * kRowsPerTile;  // 64
  static constexpr int kBlockN = 64;                     // keys per K/V tile (one pipeline stage)
  static constexpr int kChunkKeys = 16;
  static constexpr int kChunkNTiles = kChunkKeys / 8;
  static constexpr int kChunksPerTile = kBlockN / kChunkKeys;  // 4
  static constexpr int kChunks = kHeadDim / 8;                 // 16-byte chunks per row
  // Decoding reads each K/V byte once: the kernel is bound by memory, and
  // what keeps HBM busy is the bytes in flight per SM (Little's law: ~33
  // B/ns per SM on an H200 times ~1 us of loaded latency, ~33 KB, more under
  // contention). Stages of one 64-key K and V tile each (16 KB at 64, 32 KB
  // at 128, 64 KB at 256); kStages - 1 of them are in flight while one is
  // computed: 48 / 64 / 64 KB per block, with 3 / 2 / 1 blocks per H200 SM
  // (the shared memory below), and every size fits an A100's 163 KB.
  static constexpr int kStages = kHeadDim == 64 ? 4 : kHeadDim == 128 ? 3 : 2;
  static constexpr int kTileBytes = kBlockN * kHeadDim * 2;  // one K or V tile, 16-bit
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kSmemBytes = kQBytes + kStages * kStageBytes;
  // Q's A fragments stay in registers across the loop (q_fragments.cuh):
  // 16 / 32 registers at 64 / 128; at 256 the 64 they would take are not
  // there (O alone holds 128), so Q is read from shared memory per chunk.
  static constexpr bool kQInRegisters = kHeadDim <= 128;
  // The block-end merge of the warps' softmax states reuses the stages:
  // per warp 16 rows of O (float, rows padded by 8 floats so that the 8
  // rows of a fragment store spread over the banks), then (max, sum) per row.
  static constexpr int kMergeRowFloats = kHeadDim + 8;
  static constexpr int kMergeOFloats = kWarps * kRowsPerTile * kMergeRowFloats;
  static constexpr int kMergeBytes = (kMergeOFloats + kWarps * kRowsPerTile * 2) * 4;
  static_assert(kMergeBytes <= kStages * kStageBytes);
  // The host splits a sequence's keys into at most tiles / kMinTilesPerSplit
  // parts: a split's fixed costs (Q load, merge, its partial's write and
  // read back by the combine) stay small beside >= 4 tiles of K/V.
  static constexpr int kMinTilesPerSplit = 4;
};

}  // namespace jax_flash::cuda::decode
