// Tiling of the generic (SIMT, float32 arithmetic) kernels.
//
// Each warp owns kRowsPerWarp rows of the tensor it produces (query rows for
// the forward and dQ, key rows for dK/dV) and sweeps over the other side in
// tiles of 32 rows staged in shared memory: lane j scores row j of the tile
// (a full head-dim dot product), then the warp folds the 32 scores into its
// accumulators, each lane owning head-dim columns lane, lane + 32, ...
//
// These kernels are the portable, exact path for every dtype, head dim and
// GPU; the tensor-core kernels (mma.sync / wgmma) come on top of them.
#pragma once

namespace jax_flash::cuda {

template <int kHeadDim_>
struct GenericTraits {
  static constexpr int kHeadDim = kHeadDim_;  // padded head dim: 32, 64, 128 or 256
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256);
  static constexpr int kTile = 32;            // rows staged per step (one per lane)
  static constexpr int kColsPerLane = kHeadDim / 32;
  static constexpr int kRowsPerWarp = 4;
  // Fewer warps at 256 keep the dK/dV kernel's shared memory under 99 KB,
  // the opt-in limit of sm_86/sm_89.
  static constexpr int kWarps = kHeadDim >= 256 ? 4 : 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
  // Staged tiles are read one row per lane: a row pitch of kHeadDim + 1 floats
  // puts lane j's element d in bank (j + d) % 32, free of conflicts.
  static constexpr int kTilePitch = kHeadDim + 1;

  // Shared memory (floats) of each kernel.
  static constexpr int kFwdSmem = kRowsPerBlock * kHeadDim + 2 * kTile * kTilePitch;
  static constexpr int kDqSmem = 2 * kRowsPerBlock * kHeadDim + 2 * kTile * kTilePitch;
  static constexpr int kDkvSmem = 2 * kRowsPerBlock * kHeadDim + 2 * kTile * kTilePitch + 2 * kTile;
};

}  // namespace jax_flash::cuda
