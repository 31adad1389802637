// Host check of the sm90 forward's persistent tile order (tile_scheduler.cuh):
// for many shapes and grid sizes, the rounds deal every (query block, head,
// batch) to exactly one block, causal tiles come heaviest first round by
// round, and the causal work (keys per tile ~ query block + 1) ends balanced
// across blocks to within one tile's weight. Exit status 0 = all hold.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda/sm90/tile_scheduler.cuh"

using namespace jax_flash::cuda::sm90;

int main() {
  long configs = 0, failures = 0;
  auto expect = [&](bool ok, const char* what, int m_blocks, int heads, int batch, int grid) {
    if (ok) return;
    ++failures;
    std::printf("FAIL %s (m_blocks %d, heads %d, batch %d, grid %d)\n", what, m_blocks, heads, batch, grid);
  };
  for (int causal = 0; causal < 2; ++causal)
    for (int m_blocks : {1, 2, 3, 8, 32, 33})
      for (int heads : {1, 5, 16})
        for (int batch : {1, 2, 4})
          for (int grid : {1, 7, 132}) {
            ++configs;
            const TileScheduler s{m_blocks, heads, batch, bool(causal)};
            const int blocks = int(std::min<int64_t>(grid, s.Tiles()));
            std::vector<int> seen(s.Tiles(), 0);
            std::vector<long> work(blocks, 0);
            bool in_range = true, heaviest_first = true;
            for (int block = 0; block < blocks; ++block) {
              int last_m = m_blocks;
              for (int round = 0;; ++round) {
                const int tile = s.TileOf(round, block, blocks);
                if (tile >= s.Tiles()) break;
                const TileCoord c = s.Decode(tile);
                if (c.m_block < 0 || c.m_block >= m_blocks || c.h < 0 || c.h >= heads || c.b < 0 ||
                    c.b >= batch) {
                  in_range = false;
                  break;
                }
                ++seen[(int64_t(c.b) * heads + c.h) * m_blocks + c.m_block];
                if (causal && c.m_block > last_m) heaviest_first = false;
                last_m = c.m_block;
                work[block] += causal ? c.m_block + 1 : 1;
              }
            }
            expect(in_range, "coordinates in range", m_blocks, heads, batch, grid);
            expect(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }), "each tile once",
                   m_blocks, heads, batch, grid);
            if (causal) {
              expect(heaviest_first, "each block's tiles heaviest first", m_blocks, heads, batch, grid);
              const long spread = *std::max_element(work.begin(), work.end()) -
                                  *std::min_element(work.begin(), work.end());
              expect(spread <= m_blocks, "work balanced to one tile", m_blocks, heads, batch, grid);
            }
          }
  std::printf("%ld configurations, %ld failures\n", configs, failures);
  return failures == 0 ? 0 : 1;
}
