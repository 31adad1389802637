// Host check of the causal forward's phased block order (block_order.cuh):
// for grids of many shapes, CausalBlockOrder's 1D grid decodes to every
// (batch, head, rank) exactly once, phases launch heaviest ranks first (rank
// / chunk never decreases along the grid), consecutive blocks of a phase stay
// in one head, and the chunk follows its rule. Exit status 0 = all hold.
#include <cstdio>
#include <vector>

#include "cuda/sm80/block_order.cuh"

using namespace jax_flash::cuda::sm80;

namespace {

long configs = 0, failures = 0;

void Expect(bool ok, const char* what, int64_t positions, int64_t heads, int64_t batch) {
  if (ok) return;
  ++failures;
  std::printf("FAIL %s (positions %lld, heads %lld, batch %lld)\n", what, (long long)positions,
              (long long)heads, (long long)batch);
}

void CheckGrid(int64_t positions, int64_t heads, int64_t batch, int64_t bytes_per_head,
               int64_t concurrent) {
  ++configs;
  const BlockOrder order = CausalBlockOrder(positions, heads, batch, bytes_per_head, concurrent);
  Expect(order.positions == positions, "positions kept", positions, heads, batch);
  if (order.chunk == 0) return;  // the plain grid
  Expect(order.chunk >= (positions + 7) / 8 && order.chunk <= positions, "chunk within [n/8, n]",
         positions, heads, batch);
  std::vector<int> seen(size_t(positions * heads * batch), 0);
  int64_t last_phase = 0;
  BlockCoord prev{-1, -1, -1};
  for (int64_t linear = 0; linear < positions * heads * batch; ++linear) {
    const BlockCoord c = DecodePhased(order, linear, heads, batch);
    if (c.b < 0 || c.b >= batch || c.h < 0 || c.h >= heads || c.rank < 0 || c.rank >= positions) {
      Expect(false, "coordinates in range", positions, heads, batch);
      return;
    }
    ++seen[size_t((int64_t(c.b) * heads + c.h) * positions + c.rank)];
    const int64_t phase = c.rank / order.chunk;
    Expect(phase >= last_phase, "phases in order", positions, heads, batch);
    // Within a phase, a head's ranks are consecutive and ascending.
    if (phase == last_phase && c.b == prev.b && c.h == prev.h)
      Expect(c.rank == prev.rank + 1, "ranks ascending within a head", positions, heads, batch);
    last_phase = phase;
    prev = c;
  }
  for (int n : seen) {
    if (n != 1) {
      Expect(false, "each block exactly once", positions, heads, batch);
      break;
    }
  }
}

}  // namespace

int main() {
  for (int64_t positions : {1, 2, 3, 7, 8, 9, 31, 32, 33, 64, 128, 129, 1000})
    for (int64_t heads : {1, 3, 16})
      for (int64_t batch : {1, 2, 5})
        for (int64_t bytes : {int64_t(0), int64_t(1) << 19, int64_t(8) << 20, int64_t(64) << 20})
          for (int64_t concurrent : {1, 132, 264}) CheckGrid(positions, heads, batch, bytes, concurrent);
  // The chunk rule at the benchmark's shapes (H200: 264 forward blocks at once).
  auto chunk = [](int64_t positions, int64_t heads, int64_t batch, int64_t bytes) {
    return CausalBlockOrder(positions, heads, batch, bytes, 264).chunk;
  };
  ++configs;
  // T=16384, H=128: K/V 8 MiB per head, 3 heads in 24 MiB: 88 positions per phase.
  Expect(chunk(128, 16, 1, int64_t(16384) * 128 * 4) == 88, "chunk at T=16384", 128, 16, 1);
  // T=1024, H=128: 0.5 MiB per head, 48 heads: ceil(264 / 48) = 6 >= ceil(8 / 8).
  Expect(chunk(8, 16, 16, int64_t(1024) * 128 * 4) == 6, "chunk at T=1024", 8, 16, 16);
  // Small K/V: at most 8 phases.
  Expect(chunk(64, 32, 4, 1024) == 8, "at most 8 phases", 64, 32, 4);
  // A grid past 2^31 - 1 blocks keeps the plain grid.
  Expect(chunk(int64_t(1) << 20, 64, 64, 0) == 0, "plain grid past 2^31 blocks", 1 << 20, 64, 64);
  std::printf("%ld configurations, %ld failures\n", configs, failures);
  return failures == 0 ? 0 : 1;
}
