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

// 32-bit indices throughout (the launch requires fewer than 2^31 tiles): the
// tile loop's state lives through the consumer's whole body, where 64-bit
// values cost the registers that made the 256 kernel spill.
struct TileScheduler {
  int m_blocks, heads, batch;
  bool causal;

  __host__ __device__ int64_t Tiles() const { return int64_t(m_blocks) * heads * batch; }
  // Block `block`'s tile of round `round` (round r deals tiles r * blocks ..
  // r * blocks + blocks - 1; may be past Tiles() in the last round).
  __host__ __device__ int TileOf(int round, int block, int blocks) const {
    const bool reversed = causal && (round & 1);
    return round * blocks + (reversed ? blocks - 1 - block : block);
  }
  __host__ __device__ TileCoord Decode(int tile) const {
    if (causal) {
      const int rest = tile % (heads * batch);
      return {m_blocks - 1 - tile / (heads * batch), rest % heads, rest / heads};
    }
    const int rest = tile / m_blocks;
    return {tile % m_blocks, rest % heads, rest / heads};
  }
};

}  // namespace jax_flash::cuda::sm90
