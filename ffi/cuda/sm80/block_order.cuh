// The order in which the causal forward's blocks launch.
//
// Causal blocks differ in work: a query block sees the keys up to its
// diagonal. The GPU starts blocks in launch order, so with the plain grid
// (position, head, batch) the heaviest position of the last heads starts in
// the last wave and finishes alone on an otherwise idle GPU. The phased order launches
// the `chunk` heaviest positions of every (batch, head), then the next
// `chunk`, and so on: the lightest blocks go last (longest-processing-time
// first), while consecutive blocks still belong to one head, so the few heads
// in flight keep their K/V in L2. (The causal backward, which has no
// registers for decoded coordinates, instead launches on a grid with key
// blocks slowest: see DkvKernel.)
#pragma once

#include <cstdint>

#include "common/params.h"  // JAX_FLASH_HOST_DEVICE

namespace jax_flash::cuda::sm80 {

struct BlockOrder {
  int64_t positions = 0;  // block positions per (batch, head)
  int64_t chunk = 0;      // positions per phase; 0: the plain 3D grid
};

// A block's batch, head and rank: rank 0 is the heaviest position (the
// caller maps ranks to query or key blocks).
struct BlockCoord {
  int b, h, rank;  // 32-bit (the grid's limits): fewer registers held across the kernel
};

// Block `linear` of the phased order's 1D grid.
JAX_FLASH_HOST_DEVICE inline BlockCoord DecodePhased(const BlockOrder& order, int64_t linear,
                                                     int64_t heads, int64_t batch) {
  const int64_t per_phase = order.chunk * heads * batch;
  const int64_t phase = linear / per_phase;
  const int64_t first = phase * order.chunk;
  const int64_t count = order.positions - first < order.chunk ? order.positions - first : order.chunk;
  const int64_t rem = linear - phase * per_phase, bh = rem / count;
  return {int(bh / heads), int(bh % heads), int(first + rem % count)};
}

#ifdef __CUDACC__
__device__ __forceinline__ BlockCoord DecodeBlock(const BlockOrder& order, int64_t heads,
                                                  int64_t batch) {
  if (order.chunk == 0) return {int(blockIdx.z), int(blockIdx.y), int(blockIdx.x)};
  return DecodePhased(order, blockIdx.x, heads, batch);
}
#endif

// The phased order for `positions` per (batch, head) when `concurrent`
// blocks run at once and each head streams `bytes_per_head` that later
// blocks of the head reuse: at most 8 phases (the last is light), each
// large enough that the heads in flight (concurrent / chunk) keep their bytes
// within half of a 50 MiB L2. A 1D grid of positions * heads * batch blocks;
// the plain grid where that does not fit.
inline BlockOrder CausalBlockOrder(int64_t positions, int64_t heads, int64_t batch,
                                   int64_t bytes_per_head, int64_t concurrent) {
  constexpr int64_t kL2Budget = int64_t(24) << 20;
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  BlockOrder order{positions, 0};
  if (positions <= 0 || positions * heads * batch > 0x7fffffff) return order;
  const int64_t heads_in_l2 = bytes_per_head > 0 && kL2Budget / bytes_per_head > 1
                                  ? kL2Budget / bytes_per_head
                                  : 1;
  const int64_t chunk = ceil_div(positions, 8) > ceil_div(concurrent, heads_in_l2)
                            ? ceil_div(positions, 8)
                            : ceil_div(concurrent, heads_in_l2);
  order.chunk = chunk < positions ? chunk : positions;
  return order;
}

}  // namespace jax_flash::cuda::sm80
