// Tile sizes of the mma.sync (sm_80+) kernels, chosen per padded head dim in
// this one place. Each warp owns kMTiles 16-row MMA tiles of the query block;
// the block sweeps key blocks of kBlockN rows.
#pragma once

namespace jax_flash::cuda::sm80 {

template <int kHeadDim_, bool kFeatures_ = false>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;  // 64, 128 or 256
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256);
  // Two m-tiles per warp reuse every K/V fragment loaded from shared memory
  // twice (halving shared-memory traffic per MMA); at 256 the output
  // accumulators alone would then take 256 registers, so 8 warps x 1 m-tile.
  // The variant with attention features (masks, bias, soft cap, dropout per
  // element) keeps one m-tile: its per-element code needs the registers.
  static constexpr bool kFeatures = kFeatures_;
  static constexpr int kWarps = kHeadDim == 256 ? 8 : 4;
  // The feature variants keep one m-tile per warp for register room, except
  // at 64, where two fit (as in the plain kernel: half the K/V fragment reads
  // per MMA).
  static constexpr int kMTiles = kHeadDim == 256 || (kFeatures && kHeadDim > 64) ? 1 : 2;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kWarps * kMTiles * 16;  // 128
  // Keys per block: 64 (S, 32 floats per m-tile, plus O fit in 255
  // registers; per key block the QK^T B fragments feed twice as many MMAs as
  // with 32 and the fixed per-block work is halved); at 256, 32 keys keep
  // the two K/V stages and Q at 128 KiB (an A100 has 164 KiB per block).
  static constexpr int kBlockN = kHeadDim == 256 ? 32 : 64;
  static constexpr int kNTiles = kBlockN / 8;   // n8 tiles of S per m-tile
  static constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of O per m-tile
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  // QK^T k steps unrolled: fully (no spills since the swizzle left the k
  // loop), except 4 of 8 at 128 with two m-tiles, where 64 keys leave no
  // room for more.
  static constexpr int kQkUnroll = kHeadDim == 128 && kMTiles == 2 ? 4 : kHeadDim / 16;
  // Q, then two stages of K and V tiles, 16-bit elements.
  static constexpr int kSmemBytes = (kBlockM + 4 * kBlockN) * kHeadDim * 2;
};

}  // namespace jax_flash::cuda::sm80

namespace jax_flash::cuda::sm80 {

// Backward kernels. 8 warps of one 16-row m-tile each. The deterministic dQ
// pass owns 128 queries sweeping key blocks of 64; the dK/dV (fused) pass
// owns a key block sweeping query blocks of 64. At head dim 256 the dK and dV
// accumulators of 16 keys would take 256 registers, so pairs of warps share a
// key group, each holding half of the head dim (kDSplit = 2, 64-key blocks;
// both recompute the group's S and dP). The deterministic pass has no 256
// variant: deterministic=True at 256 runs the generic kernels.
template <int kHeadDim_>
struct BwdTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256);
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kDSplit = kHeadDim == 256 ? 2 : 1;  // warps per key group
  static constexpr int kKeyGroups = kWarps / kDSplit;
  static constexpr int kDkvCols = kHeadDim / kDSplit;  // dK/dV columns per warp
  static constexpr int kBlockRows = kKeyGroups * 16;  // rows each block owns (queries or keys)
  static constexpr int kBlockCols = 64;           // rows of the other side per step
  // k-steps unrolled in S and dP: 4 lets the next k-step's ldmatrix issue
  // under this one's MMAs, with no spills since the swizzle left the loop
  // (8, the full unroll at 128, spills 16 B).
  static constexpr int kQkUnroll = 4;
  static constexpr int kNTiles = kBlockCols / 8;
  static constexpr int kTileBytes = kHeadDim * 2;  // one row of a 16-bit tile
  // Two [kBlockRows] tiles (Q, dO or K, V) and two [kBlockCols] tiles (K, V
  // or Q, dO) per pipeline stage, plus lse/delta for kBlockCols rows per stage
  // in the dK/dV kernel. Two stages: the next step's tiles load while this
  // one computes (one block per SM at 255 registers leaves nothing else to
  // hide the copy behind).
  static constexpr int kStages = 2;
  static constexpr int kStageBytes = 2 * kBlockCols * kTileBytes;
  static constexpr int kRowStatsOffset = 2 * kBlockRows * kTileBytes + kStages * kStageBytes;
  static constexpr int kSmemBytes = kRowStatsOffset + kStages * 2 * kBlockCols * 4;
  // The fused kernel (dQ by float32 atomics) also keeps dS^T [kBlockRows
  // keys][kBlockCols queries], 16-bit, for dQ = dS K across the warps; two
  // of them, as a step's dQ runs during the next step.
  static constexpr int kDsOffset = kSmemBytes;
  static constexpr int kDsBytes = kBlockRows * kBlockCols * 2;
  static constexpr int kFusedSmemBytes = kDsOffset + 2 * kDsBytes;
  // dQ = dS K splits the [kBlockCols][kHeadDim] product over the 8 warps:
  // 4 query m-tiles x 2 halves of the head dim.
  static constexpr int kDqMTiles = kBlockCols / 16;
  static_assert(kWarps == 2 * kDqMTiles);
  static constexpr int kDqCols = kHeadDim / 2;
};

}  // namespace jax_flash::cuda::sm80
