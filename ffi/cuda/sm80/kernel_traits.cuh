// Tile sizes of the mma.sync (sm_80+) kernels, chosen per padded head dim in
// this one place. Each warp owns kMTiles 16-row MMA tiles of the query block;
// the block sweeps key blocks of kBlockN rows.
#pragma once

namespace jax_flash::cuda::sm80 {

template <int kHeadDim_>
struct FwdTraits {
  static constexpr int kHeadDim = kHeadDim_;  // 64, 128 or 256
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256);
  // Two m-tiles per warp reuse every K/V fragment loaded from shared memory
  // twice (halving shared-memory traffic per MMA); at 256 the output
  // accumulators alone would then take 256 registers, so 8 warps x 1 m-tile.
  static constexpr int kWarps = kHeadDim == 256 ? 8 : 4;
  static constexpr int kMTiles = kHeadDim == 256 ? 1 : 2;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kWarps * kMTiles * 16;  // 128
  // 64 keys per block: S (32 floats per m-tile) plus O fit in 255 registers.
  static constexpr int kBlockN = 64;
  static constexpr int kNTiles = kBlockN / 8;   // n8 tiles of S per m-tile
  static constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of O per m-tile
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kQkUnroll = kHeadDim == 256 ? 1 : 8;  // measured: fewest spills
  // Q, K and V tiles, 16-bit elements.
  static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * kHeadDim * 2;
};

}  // namespace jax_flash::cuda::sm80
