// Host check of the sm90 forward's persistent tile orders (tile_scheduler.cuh):
// for many shapes, grid sizes and causal section sizes, the rounds deal every
// (query block, head, batch) to exactly one block; causal tiles come heaviest
// first within each section, in the whole order and in each block's own
// sequence; a section's tiles hold only its (batch, head) pairs; and with
// one section (order 0) the causal work (keys per tile ~ query block + 1)
// ends balanced across blocks to within one tile's weight. The sectioned
// orders' worst spread is printed (LPT holds per section only, so their
// balance is the timings' business). Exit status 0 = all hold.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda/sm90/tile_scheduler.cuh"

using namespace jax_flash::cuda::sm90;

namespace {

// Decode as plain int32 divisions (the definition FastDivisor replaces).
TileCoord ReferenceDecode(const TileScheduler& s, int tile) {
  const int pairs = s.heads * s.batch;
  if (s.causal) {
    const int sec = s.SectionPairs();
    const int first = tile / (sec * s.m_blocks) * sec;
    const int count = pairs - first < sec ? pairs - first : sec;
    const int rest = tile - first * s.m_blocks;
    const int bh = first + rest % count;
    return {s.m_blocks - 1 - rest / count, bh % s.heads, bh / s.heads};
  }
  const int rest = tile / s.m_blocks;
  return {tile % s.m_blocks, rest % s.heads, rest / s.heads};
}

// FastDivisor against / and % on divisors and dividends at the edges of
// their ranges (powers of two and their neighbours, 2^31 - 1) and random ones.
long CheckFastDivisor() {
  long failures = 0;
  uint64_t x = 88172645463325252ull;
  auto next = [&] { x ^= x << 13, x ^= x >> 7, x ^= x << 17; return uint32_t(x) & 0x7fffffffu; };
  std::vector<int> divisors = {1, 2, 3, 5, 6, 7, 10, 33, 100, 132, 1000, 65535, 65536, 65537, 0x7fffffff};
  for (int k = 2; k < 31; ++k) divisors.insert(divisors.end(), {(1 << k) - 1, 1 << k, (1 << k) + 1});
  for (int i = 0; i < 200; ++i) divisors.push_back(int(next() >> (next() % 31)) | 1);
  for (int d : divisors) {
    const FastDivisor f(d);
    std::vector<int> ns = {0, 1, d - 1, d, 0x7fffffff, 0x7ffffffe, 0x40000000};
    if (d < 0x7fffffff) ns.push_back(d + 1);
    for (int i = 0; i < 2000; ++i) ns.push_back(int(next() >> (next() % 31)));
    for (int n : ns)
      if (n >= 0 && f.Div(n) != n / d) {
        if (failures++ < 5) std::printf("FAIL FastDivisor(%d).Div(%d) = %d, want %d\n", d, n, f.Div(n), n / d);
      }
  }
  return failures;
}

}  // namespace

int main() {
  long configs = 0, failures = CheckFastDivisor();
  double worst_sectioned_spread = 0;  // in tiles of the heaviest weight
  auto expect = [&](bool ok, const char* what, int m_blocks, int heads, int batch, int grid, int section) {
    if (ok) return;
    ++failures;
    std::printf("FAIL %s (m_blocks %d, heads %d, batch %d, grid %d, section %d)\n", what, m_blocks, heads,
                batch, grid, section);
  };
  for (int causal = 0; causal < 2; ++causal)
    for (int section : {0, 1, 2, 3, 4, 16, 1000})
      for (int m_blocks : {1, 2, 3, 8, 32, 33})
        for (int heads : {1, 5, 16})
          for (int batch : {1, 2, 4})
            for (int grid : {1, 7, 132}) {
              if (!causal && section > 0) continue;  // sections order causal tiles only
              ++configs;
              TileScheduler s{m_blocks, heads, batch, bool(causal)};
              const int blocks = int(std::min<int64_t>(grid, s.Tiles()));
              s.SetSections(section, blocks);  // as the launch does
              const int pairs = heads * batch;
              const int sec = section > 0 && section < pairs ? section : pairs;
              std::vector<int> seen(s.Tiles(), 0);
              std::vector<long> work(blocks, 0);
              bool in_range = true, heaviest_first = true, own_pairs = true, order_heaviest_first = true;
              bool decodes = true;
              for (int t = 0; t < s.Tiles(); ++t) {
                const TileCoord a = s.Decode(t), r = ReferenceDecode(s, t);
                decodes &= a.m_block == r.m_block && a.h == r.h && a.b == r.b;
              }
              expect(decodes, "Decode equals the plain divisions", m_blocks, heads, batch, grid, section);
              // The order itself: tile t + 1 never heavier than tile t of the same section.
              for (int t = 0; t + 1 < s.Tiles(); ++t) {
                const TileCoord a = s.Decode(t), c = s.Decode(t + 1);
                const int sa = (a.b * heads + a.h) / sec, sc = (c.b * heads + c.h) / sec;
                if (causal && sa == sc && c.m_block > a.m_block) order_heaviest_first = false;
                if (causal && sc < sa) order_heaviest_first = false;  // sections in order
              }
              for (int block = 0; block < blocks; ++block) {
                int last_m = m_blocks, last_section = -1;
                TileCursor cursor;
                for (int round = 0;; ++round) {
                  const int tile = s.Next(cursor, block, blocks);
                  if (tile >= s.Tiles()) break;
                  if (round > 4 * s.Tiles() + 1000) {  // a block that never ends
                    in_range = false;
                    break;
                  }
                  if (tile < 0) continue;  // none this round (the end of a section)
                  const TileCoord c = s.Decode(tile);
                  if (c.m_block < 0 || c.m_block >= m_blocks || c.h < 0 || c.h >= heads || c.b < 0 ||
                      c.b >= batch) {
                    in_range = false;
                    break;
                  }
                  ++seen[(int64_t(c.b) * heads + c.h) * m_blocks + c.m_block];
                  const int pair_section = (c.b * heads + c.h) / sec;
                  if (pair_section != tile / (sec * m_blocks)) own_pairs = false;
                  if (causal && pair_section == last_section && c.m_block > last_m) heaviest_first = false;
                  last_m = c.m_block;
                  last_section = pair_section;
                  work[block] += causal ? c.m_block + 1 : 1;
                }
              }
              expect(in_range, "coordinates in range", m_blocks, heads, batch, grid, section);
              expect(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }), "each tile once",
                     m_blocks, heads, batch, grid, section);
              if (causal) {
                expect(own_pairs, "a section's tiles are its own pairs'", m_blocks, heads, batch, grid, section);
                expect(order_heaviest_first, "the order heaviest first per section", m_blocks, heads, batch, grid,
                       section);
                expect(heaviest_first, "each block's tiles heaviest first per section", m_blocks, heads, batch,
                       grid, section);
                const long spread = *std::max_element(work.begin(), work.end()) -
                                    *std::min_element(work.begin(), work.end());
                // Sectioned: each section balanced to one tile (the lightest
                // ones end it), so a tile's weight per section at most.
                const int sections = (pairs + sec - 1) / sec;
                expect(spread <= m_blocks * sections, "work balanced to one tile per section", m_blocks, heads,
                       batch, grid, section);
                if (sec < pairs) worst_sectioned_spread = std::max(worst_sectioned_spread, double(spread) / m_blocks);
              }
            }
  std::printf("sectioned orders: worst spread %.2f heaviest tiles\n", worst_sectioned_spread);
  // SectionHeads: a power of two of key heads, at least one, times the group.
  auto expect_section = [&](int64_t bytes, int64_t group, int want) {
    const int got = int(SectionHeads(bytes, group));
    if (got == want) return;
    ++failures;
    std::printf("FAIL SectionHeads(%lld, %lld) = %d, want %d\n", (long long)bytes, (long long)group, got, want);
  };
  expect_section(int64_t(4096) * 256 * 2, 1, 16);  // T=4096 H=128 bf16: 2 MiB per key head
  expect_section(int64_t(4096) * 256 * 2, 4, 64);  // GQA: 4 query heads read each
  expect_section(int64_t(1024) * 256 * 2, 1, 64);
  expect_section(int64_t(3) << 20, 1, 8);          // 10.67 fit: rounded down to 8
  expect_section(int64_t(64) << 20, 2, 2);         // one key head over L2: still one
  // CausalSection: at least two rounds of tiles per section, whole groups,
  // 0 when one section would hold every pair.
  auto expect_causal = [&](int64_t bytes, int64_t group, int64_t m_blocks, int64_t pairs, int want) {
    const int got = CausalSection(bytes, group, m_blocks, pairs, 132);
    if (got == want) return;
    ++failures;
    std::printf("FAIL CausalSection(%lld, %lld, %lld, %lld) = %d, want %d\n", (long long)bytes, (long long)group,
                (long long)m_blocks, (long long)pairs, got, want);
  };
  expect_causal(int64_t(4096) * 256 * 2, 1, 32, 64, 16);    // H=128 T=4096 B=4 N=16: 4 sections
  expect_causal(int64_t(4096) * 256 * 2, 1, 32, 16, 0);     // one section: order 0
  expect_causal(int64_t(1024) * 512 * 2, 1, 8, 256, 33);    // H=256 T=1024: 32 x 8 < 264 tiles, widened
  expect_causal(int64_t(4) << 20, 2, 8, 256, 34);           // 8 x 2 pairs widened by whole groups
  expect_causal(int64_t(65536) * 256 * 2, 1, 512, 64, 1);   // one key head over L2
  std::printf("%ld configurations, %ld failures\n", configs, failures);
  return failures == 0 ? 0 : 1;
}
