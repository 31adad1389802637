// Host check of the sm90 forward's persistent tile orders (tile_scheduler.cuh):
// for many shapes, grid sizes and causal section sizes, the rounds deal every
// (query block, head, batch) to exactly one block (the (batch, head) pairs
// flat with heads or, batch_inner, batch rows innermost); causal tiles come
// heaviest first within each section, in the whole order and in each
// block's own sequence; a section's tiles hold only its (batch, head)
// pairs; and with one section (order 0) the causal work (keys per tile ~
// query block + 1) ends balanced across blocks to within one tile's weight. The sectioned
// orders' worst spread is printed (LPT holds per section only, so their
// balance is the timings' business). Then the plain kernel's key blocks per
// tile (fwd_kernel.cuh's PlainKeyBlocks, FirstMaskedKeyBlock) against brute force, for
// 128-row tiles (two consumer warpgroups, both masking from the tile's first
// row) and 192-row tiles (three, each from its own): every visible pair in a
// visited block, the visited ones exact, blocks before the first masked one
// fully visible to the warpgroup's rows, and (three consumers) that first
// one not. Exit status 0 = all hold.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda/sm90/fwd_kernel.cuh"  // PlainKeyBlocks, FirstMaskedKeyBlock
#include "cuda/sm90/tile_scheduler.cuh"

using namespace jax_flash::cuda::sm90;

namespace {

// The flat (batch, head) pair of a tile's coordinates: b * heads + h, or
// with batch_inner h * batch + b (TileScheduler::batch_inner).
int FlatPair(const TileScheduler& s, const TileCoord& c) {
  return s.batch_inner ? c.h * s.batch + c.b : c.b * s.heads + c.h;
}

// Decode as plain int32 divisions (the definition FastDivisor replaces).
TileCoord ReferenceDecode(const TileScheduler& s, int tile) {
  const int pairs = s.heads * s.batch;
  int m_block, pair;
  if (s.causal) {
    const int sec = s.SectionPairs();
    const int first = tile / (sec * s.m_blocks) * sec;
    const int count = pairs - first < sec ? pairs - first : sec;
    const int rest = tile - first * s.m_blocks;
    m_block = s.m_blocks - 1 - rest / count, pair = first + rest % count;
  } else {
    m_block = tile % s.m_blocks, pair = tile / s.m_blocks;
  }
  if (s.batch_inner) return {m_block, pair / s.batch, pair % s.batch};
  return {m_block, pair % s.heads, pair / s.heads};
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

// Key blocks of kBlockM-row tiles of 64-row consumer warpgroups (128 keys),
// by brute force over the pairs (query row i, key j): visible when j <
// seqlen_k and, causal, j <= i (the kernels' top-left diagonal). Returns the
// failures; `most_masked` the largest count of key blocks a causal tile
// masks (its diagonal and the seqlen_k tail).
template <int kBlockM>
long CheckKeyBlocks(long* configs, int* most_masked) {
  constexpr int kBlockN = 128, kConsumers = kBlockM / 64;
  long failures = 0;
  auto expect = [&](bool ok, const char* what, int tq, int tk, bool causal, int m0, int w, int n) {
    if (ok) return;
    if (++failures <= 20)
      std::printf("FAIL %s (kBlockM %d, Tq %d, Tk %d, causal %d, m0 %d, warpgroup %d, key block %d)\n", what,
                  kBlockM, tq, tk, int(causal), m0, w, n);
  };
  for (int causal = 0; causal < 2; ++causal)
    for (int tq : {1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 300, 383, 384, 385, 1000, 1024})
      for (int tk : {1, 77, 127, 128, 129, 191, 192, 255, 256, 300, 1000, 1024}) {
        ++*configs;
        for (int m0 = 0; m0 < tq; m0 += kBlockM) {
          ForwardArgs args{};
          args.seqlen_k = tk, args.is_causal = causal;
          const KeyBlocks keys = PlainKeyBlocks<FwdTraits<64, kBlockN, kConsumers>>(args, m0);
          if (keys.lo != 0) expect(false, "key blocks from 0", tq, tk, causal, m0, -1, keys.lo);
          const int n_hi = keys.hi;
          auto visible = [&](int i, int j) { return j < tk && (!causal || j <= i); };
          // Visited blocks: exactly those with a visible pair of the tile's
          // rows (computed rows, past seqlen_q too); all of the real rows' pairs.
          for (int n = 0; n * kBlockN < tk + kBlockN; ++n) {
            bool any = false;
            for (int i = m0; i < m0 + kBlockM && !any; ++i)
              for (int j = n * kBlockN; j < (n + 1) * kBlockN && !any; ++j) any = visible(i, j);
            expect(any == (n < n_hi), "visited key blocks exact", tq, tk, causal, m0, -1, n);
          }
          int masked_blocks = 0;
          for (int w = 0; w < kConsumers; ++w) {
            const int r0 = m0 + 64 * w;  // the warpgroup's rows [r0, r0 + 64)
            const int first = FirstMaskedKeyBlock<kBlockN>(tk, causal, kConsumers == 2 ? m0 : r0);
            for (int n = 0; n < n_hi; ++n) {
              bool all = true;
              for (int i = r0; i < r0 + 64 && all; ++i)
                for (int j = n * kBlockN; j < (n + 1) * kBlockN && all; ++j) all = visible(i, j);
              if (n < first) expect(all, "unmasked blocks fully visible", tq, tk, causal, m0, w, n);
              if (kConsumers == 3 && n == first)
                expect(!all, "the first masked block needs masks", tq, tk, causal, m0, w, n);
            }
          }
          // The tile's masked blocks: its first warpgroup's (the most).
          const int tile_first = FirstMaskedKeyBlock<kBlockN>(tk, causal, m0);
          masked_blocks = n_hi > tile_first ? n_hi - tile_first : 0;
          if (causal && masked_blocks > *most_masked) *most_masked = masked_blocks;
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
  for (int batch_inner = 0; batch_inner < 2; ++batch_inner)
  for (int causal = 0; causal < 2; ++causal)
    for (int section : {0, 1, 2, 3, 4, 16, 1000})
      for (int m_blocks : {1, 2, 3, 8, 32, 33})
        for (int heads : {1, 5, 16})
          for (int batch : {1, 2, 4})
            for (int grid : {1, 7, 132}) {
              if (!causal && section > 0) continue;  // sections order causal tiles only
              ++configs;
              TileScheduler s{m_blocks, heads, batch, bool(causal)};
              s.batch_inner = batch_inner;
              const int blocks = int(std::min<int64_t>(grid, s.Tiles()));
              s.SetSections(section, blocks);  // as the launch does
              const int pairs = heads * batch;
              const int sec = section > 0 && section < pairs ? section : pairs;
              std::vector<int> seen(s.Tiles(), 0);
              std::vector<long> work(blocks, 0);
              bool in_range = true, heaviest_first = true, own_pairs = true, order_heaviest_first = true;
              bool decodes = true;
              for (int t = 0; t < s.Tiles(); ++t) {
                const TileCoord a = s.Decode<true>(t), r = ReferenceDecode(s, t);
                decodes &= a.m_block == r.m_block && a.h == r.h && a.b == r.b;
              }
              expect(decodes, "Decode equals the plain divisions", m_blocks, heads, batch, grid, section);
              // The order itself: tile t + 1 never heavier than tile t of the same section.
              for (int t = 0; t + 1 < s.Tiles(); ++t) {
                const TileCoord a = s.Decode<true>(t), c = s.Decode<true>(t + 1);
                const int sa = FlatPair(s, a) / sec, sc = FlatPair(s, c) / sec;
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
                  const TileCoord c = s.Decode<true>(tile);
                  if (c.m_block < 0 || c.m_block >= m_blocks || c.h < 0 || c.h >= heads || c.b < 0 ||
                      c.b >= batch) {
                    in_range = false;
                    break;
                  }
                  ++seen[(int64_t(c.b) * heads + c.h) * m_blocks + c.m_block];
                  const int pair_section = FlatPair(s, c) / sec;
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
  // DefaultCausalOrder: sections up to head dim 128; at 256 up to 2 MiB of
  // K/V per key head (T <= 2048 in 16 bits), order 0 above (PERF.md v31).
  // The launch passes the kernel's head dim and the real head dim's bytes.
  auto expect_order = [&](int kernel_dim, int head_dim, int64_t seqlen_k, CausalOrder want) {
    const CausalOrder got = DefaultCausalOrder(kernel_dim, seqlen_k * 2 * head_dim * 2);
    if (got == want) return;
    ++failures;
    std::printf("FAIL DefaultCausalOrder(%d, H=%d T=%lld) = %d, want %d\n", kernel_dim, head_dim,
                (long long)seqlen_k, int(got), int(want));
  };
  expect_order(64, 64, 131072, CausalOrder::kSections);
  expect_order(128, 128, 16384, CausalOrder::kSections);
  expect_order(256, 256, 1024, CausalOrder::kSections);
  expect_order(256, 256, 2048, CausalOrder::kSections);
  expect_order(256, 256, 2049, CausalOrder::kAllHeads);
  expect_order(256, 256, 4096, CausalOrder::kAllHeads);
  expect_order(256, 200, 2600, CausalOrder::kSections);  // 2.08 MB of a padded head dim's real bytes
  expect_order(256, 200, 2700, CausalOrder::kAllHeads);
  for (int rows : {128, 192}) {
    int most_masked = 0;
    failures += rows == 128 ? CheckKeyBlocks<128>(&configs, &most_masked) : CheckKeyBlocks<192>(&configs, &most_masked);
    std::printf("%d-row tiles: at most %d masked key blocks per causal tile\n", rows, most_masked);
    if (most_masked > 2) ++failures, std::printf("FAIL more than two masked key blocks per causal tile\n");
  }
  std::printf("%ld configurations, %ld failures\n", configs, failures);
  return failures == 0 ? 0 : 1;
}
