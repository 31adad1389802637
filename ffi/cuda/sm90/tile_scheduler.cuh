// The persistent grid's static schedule: each block (one per SM) takes the
// tiles (128 query rows, head, batch) blockIdx.x, + gridDim.x, ... in an
// order fixed per call. Causal: query blocks from the last (the most keys)
// to the first, all heads and batches of one query block before the next, so
// the heaviest tiles run first and the light ones fill the end of the wave
// (LPT over sorted jobs). Otherwise a head's query blocks are consecutive, so
// blocks running together share that head's K and V in L2.
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
  __device__ TileCoord Decode(int64_t tile) const {
    if (causal) {
      const int64_t rest = tile % (int64_t(heads) * batch);
      return {m_blocks - 1 - int(tile / (int64_t(heads) * batch)), int(rest % heads), int(rest / heads)};
    }
    const int64_t rest = tile / m_blocks;
    return {int(tile % m_blocks), int(rest % heads), int(rest / heads)};
  }
};

}  // namespace jax_flash::cuda::sm90
