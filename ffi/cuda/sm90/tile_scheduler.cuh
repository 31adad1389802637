// The persistent grid's static schedule: the tiles (128 query rows, head,
// batch) in an order fixed per call, dealt in rounds of gridDim.x, one to
// each block (one per SM). Causal: query blocks from the last (the most
// keys) to the first, all heads and batches of one query block before the
// next, so the heaviest tiles run first and the light ones fill the end
// (LPT over sorted jobs); every other round is dealt in reverse, so the
// block that took a round's heaviest tile takes the next round's lightest
// (dealing in the same direction would leave block 0 about one heavy tile
// behind the last block at the end). Otherwise a head's query blocks are
// consecutive, so blocks running together share that head's K and V in L2.
#pragma once

#include <cstdint>

namespace jax_flash::cuda::sm90 {

struct TileCoord {
  int m_block, h, b;
};

struct TileScheduler {
  int m_blocks, heads, batch;
  bool causal;

  __host__ __device__ int64_t Tiles() const { return int64_t(m_blocks) * heads * batch; }
  // Block `block`'s tile of round `round` (may be past Tiles() in the last).
  __host__ __device__ int64_t TileOf(int64_t round, int block, int blocks) const {
    const bool reversed = causal && (round & 1);
    return round * blocks + (reversed ? blocks - 1 - block : block);
  }
  __host__ __device__ TileCoord Decode(int64_t tile) const {
    if (causal) {
      const int64_t rest = tile % (int64_t(heads) * batch);
      return {m_blocks - 1 - int(tile / (int64_t(heads) * batch)), int(rest % heads), int(rest / heads)};
    }
    const int64_t rest = tile / m_blocks;
    return {int(tile % m_blocks), int(rest % heads), int(rest / heads)};
  }
};

}  // namespace jax_flash::cuda::sm90
