// Host check of the sm90 backward's tile orders (bwd_kernel.cuh's BwdTile):
// for many (batch, key heads, key blocks) and section sizes, causal and
// not, with and without kSectionsAlways (the deterministic variant's
// sectioned non-causal order):
//   - every tile index names a distinct (key block, key head, batch), so the
//     grid covers each exactly once;
//   - a section of 0 or of at least every pair is the former order,
//     formula for formula (causal: key blocks outermost over all pairs;
//     otherwise a pair's key blocks consecutive);
//   - within each (batch, key head) pair the tile index grows with the key
//     block, or falls with it under keys_descending (the deterministic
//     variant waits only on lower indices: no deadlock), and, causal, key
//     blocks outermost within each section: its tiles contiguous, in
//     non-decreasing (descending: non-increasing) key block order;
// then BackwardCausalSection and L2SizedSection (bwd_launch.cuh) at the
// shapes their comments name; and the epilogue's dK / dV staging in the
// K / V tiles (CheckKeyStaging). Exit status 0 = all hold.
#include <cstdio>
#include <vector>

#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/bwd_launch.cuh"  // BackwardCausalSection, L2SizedSection

using jax_flash::AttentionShape;
using namespace jax_flash::cuda::sm90;

namespace {

int failures = 0;

void Expect(bool ok, const char* what, int B, int K, int key_blocks, int section, bool causal, bool always) {
  if (ok) return;
  if (++failures <= 20)
    std::printf("FAIL %s: B=%d K=%d key_blocks=%d section=%d causal=%d sections_always=%d\n", what, B, K, key_blocks,
                section, int(causal), int(always));
}

// descending: a.keys_descending (the deterministic variant's causal order
// since session 21; BwdTile takes it with kAlways only): each pair's key
// blocks in decreasing tile order, the former order's mirror within each pair.
template <bool kAlways>
void CheckOrder(int B, int K, int key_blocks, int section, bool causal, bool descending = false) {
  BackwardArgs a{};
  a.batch = B, a.num_heads_k = K, a.key_blocks = key_blocks, a.is_causal = causal, a.causal_section = section;
  a.keys_descending = descending;
  const bool flips = kAlways && descending;  // BwdTile's mirror of n_block
  const int pairs = B * K, tiles = pairs * key_blocks;
  const bool sectioned = (kAlways || causal) && section > 0 && section < pairs;
  std::vector<int> seen(tiles, 0), last_tile(pairs, -1), last_block(pairs, flips ? key_blocks : -1);
  bool bijective = true, former = true, ascending = true, outermost = true;
  int section_of_previous = -1, block_of_previous = -1;
  for (int t = 0; t < tiles; ++t) {
    const BwdTile tile(a, t, std::bool_constant<kAlways>{});
    const int pair = tile.b * K + tile.hk;
    if (tile.n_block < 0 || tile.n_block >= key_blocks || tile.hk < 0 || tile.hk >= K || tile.b < 0 || tile.b >= B) {
      bijective = false;
      continue;
    }
    seen[pair * key_blocks + tile.n_block] += 1;
    if (!sectioned) {
      const int n = causal ? t / pairs : t % key_blocks, p = causal ? t % pairs : t / key_blocks;
      former &= (flips ? key_blocks - 1 - tile.n_block : tile.n_block) == n && pair == p;
    }
    // Within a pair: key blocks in increasing (flips: decreasing) tile order.
    ascending &= (flips ? tile.n_block < last_block[pair] : tile.n_block > last_block[pair]) && t > last_tile[pair];
    last_block[pair] = tile.n_block, last_tile[pair] = t;
    if (sectioned && causal) {
      const int s = pair / section;  // sections of `section` consecutive pairs
      if (s == section_of_previous)
        outermost &= flips ? tile.n_block <= block_of_previous : tile.n_block >= block_of_previous;
      else outermost &= s > section_of_previous;  // each section's tiles contiguous, in order
      section_of_previous = s, block_of_previous = tile.n_block;
    }
  }
  for (int x : seen) bijective &= x == 1;
  Expect(bijective, "every (key block, key head, batch) exactly once", B, K, key_blocks, section, causal, kAlways);
  Expect(former, "the former order without sections", B, K, key_blocks, section, causal, kAlways);
  Expect(ascending,
         flips ? "key blocks of a pair in decreasing tile order" : "key blocks of a pair in increasing tile order", B,
         K, key_blocks, section, causal, kAlways);
  Expect(outermost, "causal: key blocks outermost within contiguous sections", B, K, key_blocks, section, causal,
         kAlways);
}

}  // namespace

// The epilogue's dK / dV staging (KeyRowPiece, StageKeyGradient,
// StoreStagedKeyRows): the fragment pairs each consumer thread stores
// (rows row0, row0 + 8 of its warpgroup's 64, columns 8j + 2t, + 1) land
// at distinct bytes inside the warpgroup's own part of the K / V tile;
// every 16-byte piece the stores read back holds its row's columns 8c ..
// 8c + 7 in order; a warp's 4-byte stores hit 32 distinct banks and each
// 8-thread phase of the 16-byte reads 8 distinct 16-byte bank groups.
// The 64 / 128 kernels' warpgroups own 64 rows each (row band = warpgroup,
// every column); the 256 kernel's (column_halves) share the tile's 64 rows
// and own kColumns columns each (pieces from piece0 = warpgroup x
// kColumns / 8: two 64-column chunks).
template <typename Tr, int kColumns = Tr::kHeadDim>
void CheckKeyStaging(const char* name, bool column_halves = false) {
  constexpr int kPieces = kColumns / 8;
  const int bytes = Tr::kKvTileBytes;
  auto expect = [&](bool ok, const char* what, int wg, int row, int piece) {
    if (!ok && ++failures <= 20)
      std::printf("FAIL %s: %s (warpgroup %d, row %d, piece %d)\n", name, what, wg, row, piece);
    return ok;
  };
  // Whether byte `at` lies in warpgroup wg's part of the tile.
  auto owned = [&](uint32_t at, int band, int piece0) {
    const int chunk = int(at / Tr::kKvChunkBytes), row_band = int(at % Tr::kKvChunkBytes) / 128 / 64;
    return row_band == band && chunk >= piece0 / 8 && chunk < (piece0 + kPieces + 7) / 8;
  };
  std::vector<int> owner(bytes, -1);  // byte -> tile row * kHeadDim + tile column
  for (int wg = 0; wg < 2; ++wg) {
    const int band = column_halves ? 0 : wg, piece0 = column_halves ? wg * kPieces : 0;
    for (int warp = 0; warp < 4; ++warp)
      for (int hh = 0; hh < 2; ++hh)
        for (int j = 0; j < kPieces; ++j) {
          bool bank_used[32] = {};
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4, t = lane % 4, row = warp * 16 + g + 8 * hh;
            const uint32_t at = KeyRowPiece<Tr>(0, band, row, piece0 + j) + 4 * t;
            if (!expect(at + 4 <= uint32_t(bytes) && owned(at, band, piece0),
                        "a pair staged outside the warpgroup's part", wg, row, j))
              continue;
            expect(!bank_used[(at / 4) % 32], "a warp's pair stores share a bank", wg, row, j);
            bank_used[(at / 4) % 32] = true;
            for (int e = 0; e < 2; ++e)
              for (int half = 0; half < 2; ++half) {
                int& o = owner[at + 2 * e + half];
                expect(o == -1, "two pairs staged at one byte", wg, row, j);
                o = (band * 64 + row) * Tr::kHeadDim + 8 * (piece0 + j) + 2 * t + e;
              }
          }
        }
  }
  for (int wg = 0; wg < 2; ++wg) {
    const int band = column_halves ? 0 : wg, piece0 = column_halves ? wg * kPieces : 0;
    for (int k = 0; k < 64 * kPieces / 128; ++k)
      for (int phase = 0; phase < 128 / 8; ++phase) {
        bool group_used[8] = {};
        for (int tid = 8 * phase; tid < 8 * phase + 8; ++tid) {
          // StoreStagedKeyRows' piece of thread tid in round k.
          const int q = tid + 128 * k, row = q / kPieces, c = piece0 + q % kPieces;
          const uint32_t at = KeyRowPiece<Tr>(0, band, row, c);
          if (!expect(at + 16 <= uint32_t(bytes) && owned(at, band, piece0), "a piece read outside the part", wg, row,
                      c))
            continue;
          expect(!group_used[(at / 16) % 8], "a read phase's pieces share banks", wg, row, c);
          group_used[(at / 16) % 8] = true;
          for (int b = 0; b < 16; ++b)
            expect(owner[at + b] == (band * 64 + row) * Tr::kHeadDim + 8 * c + b / 2,
                   "a piece read back holds other columns", wg, row, c);
        }
      }
  }
  // Every byte of the staged parts written once (the 64 / 128 tiles' two
  // bands, the 256 tile's 64 rows).
  int written = 0;
  for (int o : owner) written += o >= 0;
  if (written != 2 * 64 * kColumns * 2 && ++failures <= 20)
    std::printf("FAIL %s: %d bytes staged, expected %d\n", name, written, 2 * 64 * kColumns * 2);
}

int main() {
  int cases = 0;
  CheckKeyStaging<BwdTraits<128>>("key staging at 128");
  CheckKeyStaging<BwdTraits<64>>("key staging at 64");
  CheckKeyStaging<BwdTraits<64, 128>>("key staging at 64, 128-query steps");
  CheckKeyStaging<Bwd256Traits, Bwd256Traits::kColumns>("key staging at 256 (column halves)", true);
  cases += 4;
  for (int B : {1, 2, 3, 4})
    for (int K : {1, 2, 3, 8})
      for (int key_blocks : {1, 2, 7, 32})
        for (int section : {0, 1, 2, 3, 5, 16, 1000})
          for (bool causal : {false, true}) {
            CheckOrder<false>(B, K, key_blocks, section, causal);
            CheckOrder<true>(B, K, key_blocks, section, causal);
            CheckOrder<true>(B, K, key_blocks, section, causal, true);
            CheckOrder<false>(B, K, key_blocks, section, causal, true);  // the plain kernels ignore it
            cases += 4;
          }
  // BackwardCausalSection (the causal sections, since session 21): the
  // smallest power of two of pairs whose section holds CausalSectionTiles
  // tiles (128 keys each); 0 when that takes every pair. L2SizedSection
  // (the deterministic variant's non-causal sections): pairs whose Q, dO and
  // float32 dQ rows fit 32 MiB, a power of two; 0 when that holds every pair.
  struct Sized {
    AttentionShape shape;
    int causal, l2;
  };
  const Sized sized[] = {
      {{4, 4096, 4096, 32, 32, 64}, 8, 16},   // 32 key blocks, 256 tiles at 64; 2 MiB per pair
      {{4, 4096, 4096, 16, 16, 128}, 4, 8},   // 128 tiles at 128; 4 MiB
      {{1, 16384, 16384, 32, 32, 64}, 2, 4},  // 128 key blocks; 8 MiB
      {{1, 16384, 16384, 16, 16, 128}, 1, 2}, // 16 MiB
      {{4, 4096, 4096, 16, 4, 128}, 4, 2},    // GQA 4: 16 MiB per key head
      {{16, 1024, 1024, 16, 16, 128}, 16, 32}, // 8 key blocks; 256 pairs of 1 MiB: 32 fit
      {{1, 1024, 1024, 8, 8, 64}, 0, 0},      // 8 pairs x 8 key blocks < 256 tiles; 8 pairs of 0.5 MiB fit
      {{2, 1000, 1000, 3, 3, 128}, 0, 0},     // 6 pairs x 8 key blocks < 128 tiles (a tail key block)
  };
  for (const Sized& c : sized) {
    const int64_t key_blocks = (c.shape.seqlen_k + 127) / 128;
    const int padded = c.shape.head_dim <= 64 ? 64 : 128;
    const int got = BackwardCausalSection(c.shape, key_blocks, CausalSectionTiles(padded));
    const int got_l2 = L2SizedSection(c.shape, 2);
    if (got != c.causal || got_l2 != c.l2) {
      ++failures;
      std::printf("FAIL sections of B=%lld T=%lld N=%lld K=%lld H=%lld: BackwardCausalSection %d (want %d), "
                  "L2SizedSection %d (want %d)\n",
                  (long long)c.shape.batch, (long long)c.shape.seqlen_q, (long long)c.shape.num_heads,
                  (long long)c.shape.num_heads_k, (long long)c.shape.head_dim, got, c.causal, got_l2, c.l2);
    }
  }
  std::printf("%d tile orders and %d section sizes checked: %d failures\n", cases, int(sizeof sized / sizeof *sized),
              failures);
  return failures ? 1 : 0;
}
