// Host check of the sm90 forward's bias tiles (ffi/cuda/sm90/bias_tiles.cuh,
// kMasksBiasTiles), at head dims 64 and 128 (128 keys a block, two consumer
// warpgroups), for bf16 and f16 biases:
//   - a tile filled as TMA's 128-byte swizzle writes a [64 rows][64 keys]
//     box (written here from the PTX definition: 16-byte piece c of row r
//     at piece c ^ (r % 8)), read by emulated ldmatrix.x4 at the lanes'
//     LaneOffset and turned into S's accumulators by ToLogits, gives every
//     lane of every warp exactly bias[row g + 8hh][key 8j + 2t + e] *
//     unscale at element 4j + 2hh + e (softmax.cuh's layout), the float
//     the backward's BiasColumns makes of the same bits;
//   - every ldmatrix row address is 16-byte aligned and inside the tile,
//     and the 8 rows of each matrix fall in 8 different 16-byte bank groups
//     (no bank conflict);
//   - the shared-memory map: tiles on 1024-byte atoms past the forward's
//     own map and the barriers, within sm_90's 227 KiB;
//   - the backward's tile (BwdBiasTile, head dim 128, 64-query steps): a
//     step's [64 queries][128 keys] in the same swizzle, read by emulated
//     ldmatrix.x4.trans at its lane offsets, gives every lane of both
//     consumer warpgroups bias[query 8j + 2t + e][key 64 w + 16 warp + g +
//     8hh] * unscale at S^T's element 4j + 2hh + e, conflict-free, and its
//     map past the backward's own;
//   - BiasFlatBatchStride and BiasTilesServe on broadcast, multi-dim batch,
//     misaligned and query-broadcast biases.
// Exit status 0 = all hold.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/sm90/bias_tiles.cuh"
#include "cuda/sm90/bwd_kernel_traits.cuh"
#include "cuda/sm90/kernel_traits.cuh"

using namespace jax_flash;
using namespace jax_flash::cuda::sm90;

namespace {

int failures = 0;

void Expect(bool ok, const char* what) {
  if (!ok) {
    ++failures;
    if (failures <= 20) std::printf("FAIL: %s\n", what);
  }
}

// 16-bit bits of a float in BiasT (round to nearest).
template <typename BiasT>
uint16_t ToBits(float x) {
  BiasT y;
  if constexpr (std::is_same_v<BiasT, __nv_bfloat16>) y = __float2bfloat16(x);
  else y = __float2half(x);
  uint16_t bits;
  std::memcpy(&bits, &y, 2);
  return bits;
}

// The byte of element (row, key) of a warpgroup's tile as TMA's 128-byte
// swizzle stores the boxes of 64 keys (chunks 8 KiB apart).
int SwizzledByte(int row, int key) {
  const int chunk = key / 64, col_byte = (key % 64) * 2;
  return chunk * 64 * 128 + row * 128 + (((col_byte / 16) ^ (row % 8)) * 16) + col_byte % 16;
}

// One ldmatrix.x4's 32 row addresses (`addr`, bytes into a tile of
// `tile_bytes`): each 16-byte aligned and inside the tile, and the 8 rows
// of each matrix (lanes 8m .. 8m + 7) in 8 different 16-byte bank groups.
void CheckRowAddresses(const uint32_t (&addr)[32], int tile_bytes, const char* name) {
  char what[160];
  for (int lane = 0; lane < 32; ++lane) {
    std::snprintf(what, sizeof what, "%s: ldmatrix row addresses 16-byte aligned, inside the tile", name);
    Expect(addr[lane] % 16 == 0 && addr[lane] + 16 <= uint32_t(tile_bytes), what);
  }
  for (int m = 0; m < 4; ++m) {
    bool groups[8] = {};
    for (int i = 0; i < 8; ++i) groups[(addr[8 * m + i] / 16) % 8] = true;
    bool all = true;
    for (bool g : groups) all = all && g;
    std::snprintf(what, sizeof what, "%s: a matrix's 8 rows in 8 different bank groups", name);
    Expect(all, what);
  }
}

template <typename Tr, typename BiasT>
void CheckFragments(std::mt19937& rng, const char* name) {
  using Tiles = BiasTiles<Tr>;
  constexpr int kBlockN = Tr::kBlockN;
  std::uniform_real_distribution<float> value(-30.0f, 30.0f);
  // Bias values of the warpgroup's 64 rows x the block's keys, as bits.
  std::vector<uint16_t> bias(64 * kBlockN);
  for (auto& b : bias) b = ToBits<BiasT>(value(rng));
  std::vector<uint8_t> tile(Tiles::kTileBytes, 0xAB);
  for (int r = 0; r < 64; ++r)
    for (int k = 0; k < kBlockN; ++k) std::memcpy(&tile[SwizzledByte(r, k)], &bias[r * kBlockN + k], 2);
  const float unscale = 1.0f / 0.0883883f;

  for (int warp = 0; warp < 4; ++warp) {
    float s[32][kBlockN / 2];
    for (int lane = 0; lane < 32; ++lane)
      for (float& x : s[lane]) x = -12345.0f;
    for (int p = 0; p < Tiles::kLoads; ++p) {
      uint32_t addr[32];
      for (int lane = 0; lane < 32; ++lane) addr[lane] = Tiles::LaneOffset(warp, lane, p);
      CheckRowAddresses(addr, Tiles::kTileBytes, name);
      // ldmatrix.x4: lane l receives, of matrix m, row l / 4 (the row lane
      // 8m + l / 4 addressed), bytes 4 (l % 4) .. + 3 of it.
      for (int lane = 0; lane < 32; ++lane) {
        uint32_t r[4];
        for (int m = 0; m < 4; ++m) std::memcpy(&r[m], &tile[addr[8 * m + lane / 4] + 4 * (lane % 4)], 4);
        FragmentPairsToLogits<BiasT, kBlockN>(s[lane], r, p, unscale);
      }
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, t = lane % 4;
      for (int j = 0; j < kBlockN / 8; ++j)
        for (int hh = 0; hh < 2; ++hh)
          for (int e = 0; e < 2; ++e) {
            const int row = 16 * warp + g + 8 * hh, key = 8 * j + 2 * t + e;
            const float want = BiasColumns<BiasT>::BitsToFloat(bias[row * kBlockN + key]) * unscale;
            const float got = s[lane][4 * j + 2 * hh + e];
            if (std::memcmp(&want, &got, 4) != 0) {
              char what[200];
              std::snprintf(what, sizeof what, "%s warp %d lane %d element %d: %g, want bias[%d][%d] = %g", name,
                            warp, lane, 4 * j + 2 * hh + e, got, row, key, want);
              Expect(false, what);
            }
          }
    }
  }
}

// The backward's: a step's [kBlockM queries][128 keys] as TMA writes its
// two 64-key boxes, each consumer warpgroup's S^T fragments by
// ldmatrix.x4.trans (lane l receives, of matrix m, the elements (row 2 (l %
// 4), column l / 4) and (row 2 (l % 4) + 1, column l / 4), the rows
// addressed by lanes 8m .. 8m + 7).
template <typename Tr, typename BiasT>
void CheckBackwardFragments(std::mt19937& rng, const char* name) {
  using Tile = BwdBiasTile<Tr>;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN;
  std::uniform_real_distribution<float> value(-30.0f, 30.0f);
  std::vector<uint16_t> bias(kBlockM * kBlockN);  // [query][key]
  for (auto& b : bias) b = ToBits<BiasT>(value(rng));
  std::vector<uint8_t> tile(Tile::kTileBytes, 0xAB);
  for (int q = 0; q < kBlockM; ++q)
    for (int k = 0; k < kBlockN; ++k) {
      const int chunk = k / 64, col_byte = (k % 64) * 2;
      const int byte = chunk * Tile::kChunkBytes + q * 128 + (((col_byte / 16) ^ (q % 8)) * 16) + col_byte % 16;
      std::memcpy(&tile[byte], &bias[q * kBlockN + k], 2);
    }
  const float unscale = 1.0f / 0.0883883f;
  for (int w = 0; w < 2; ++w)
    for (int warp = 0; warp < 4; ++warp) {
      float st[32][kBlockM / 2];
      for (int p = 0; p < Tile::kLoads; ++p) {
        uint32_t addr[32];
        for (int lane = 0; lane < 32; ++lane) addr[lane] = Tile::LaneOffset(w, warp, lane, p);
        CheckRowAddresses(addr, Tile::kTileBytes, name);
        for (int lane = 0; lane < 32; ++lane) {
          uint32_t r[4];
          for (int m = 0; m < 4; ++m) {
            uint16_t lo, hi;
            std::memcpy(&lo, &tile[addr[8 * m + 2 * (lane % 4)] + 2 * (lane / 4)], 2);
            std::memcpy(&hi, &tile[addr[8 * m + 2 * (lane % 4) + 1] + 2 * (lane / 4)], 2);
            r[m] = uint32_t(lo) | uint32_t(hi) << 16;
          }
          FragmentPairsToLogits<BiasT, kBlockM>(st[lane], r, p, unscale);
        }
      }
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        for (int j = 0; j < kBlockM / 8; ++j)
          for (int hh = 0; hh < 2; ++hh)
            for (int e = 0; e < 2; ++e) {
              const int query = 8 * j + 2 * t + e, key = 64 * w + 16 * warp + g + 8 * hh;
              const float want = BiasColumns<BiasT>::BitsToFloat(bias[query * kBlockN + key]) * unscale;
              const float got = st[lane][4 * j + 2 * hh + e];
              if (std::memcmp(&want, &got, 4) != 0) {
                char what[200];
                std::snprintf(what, sizeof what, "%s warpgroup %d warp %d lane %d element %d: %g, want bias[%d][%d]",
                              name, w, warp, lane, 4 * j + 2 * hh + e, got, query, key);
                Expect(false, what);
              }
            }
      }
    }
}

template <typename Tr>
void CheckMap(const char* name) {
  using Tiles = BiasTiles<Tr>;
  char what[160];
  std::snprintf(what, sizeof what, "%s: barriers past the forward's map, tiles on 1024-byte atoms past them", name);
  Expect(Tiles::kBarrierOffset >= Tr::kKeyBlocksOffset + 32 && Tiles::kOffset % 1024 == 0 &&
             Tiles::kOffset >= Tiles::kBarrierOffset + 16 * Tr::kConsumerWarpgroups,
         what);
  std::snprintf(what, sizeof what, "%s: %d bytes within 227 KiB", name, Tiles::kSmemBytes);
  Expect(Tiles::kSmemBytes <= 227 * 1024 && Tiles::kSmemBytes >= Tiles::kOffset + 2 * Tiles::kTileBytes + 1024, what);
  std::printf("%s: bias tiles at %d, %d bytes of shared memory (the forward's %d)\n", name, Tiles::kOffset,
              Tiles::kSmemBytes, Tr::kSmemBytes);
}

void CheckServe() {
  __nv_bfloat16* base = reinterpret_cast<__nv_bfloat16*>(uintptr_t(1) << 20);  // 16-byte aligned, never read
  AttentionParams p;
  p.shape = {2, 300, 1000, 4, 2, 128};
  AttentionFeatures& f = p.features;
  f.bias = base;
  f.bias_type = BiasType::kBFloat16;
  f.num_batch_dims = 1;
  f.batch_dims[0] = 2;
  f.bias_stride.col = 1, f.bias_stride.row = 1000, f.bias_stride.head = 300 * 1000;
  f.bias_stride.batch[0] = 4 * 300 * 1000;
  Expect(BiasFlatBatchStride(f) == 4 * 300 * 1000 && BiasTilesServe(p), "[B,N,T,S] served");
  f.bias_stride.batch[0] = 0, f.bias_stride.head = 0;
  Expect(BiasFlatBatchStride(f) == 0 && BiasTilesServe(p), "[1,1,T,S] served (batch and heads at 0)");
  f.bias_stride.row = 0;
  Expect(!BiasTilesServe(p), "a query-broadcast bias is not (kMasksBias16's)");
  f.bias_stride.row = 1000;
  f.bias = base + 4;  // 8 bytes off
  Expect(!BiasTilesServe(p), "a base not 16-byte aligned is not");
  f.bias = base;
  p.shape.seqlen_k = 999, f.bias_stride.row = 999;
  Expect(!BiasTilesServe(p), "rows not in whole 16 bytes are not");
  p.shape.seqlen_k = 1000, f.bias_stride.row = 1000;
  f.bias_type = BiasType::kAccum;
  Expect(!BiasTilesServe(p), "a float32 bias is not");
  f.bias_type = BiasType::kBFloat16;
  // Two batch dims [3, 2] (vmap over a batched call): row-major strides
  // flatten, a broadcast inner dim under a varying outer one does not.
  f.num_batch_dims = 2;
  f.batch_dims[0] = 3, f.batch_dims[1] = 2;
  f.bias_stride.batch[0] = 2 * 8000, f.bias_stride.batch[1] = 8000;
  Expect(BiasFlatBatchStride(f) == 8000 && BiasTilesServe(p), "row-major batch dims flatten");
  f.bias_stride.batch[0] = 8000, f.bias_stride.batch[1] = 0;
  Expect(BiasFlatBatchStride(f) == -1 && !BiasTilesServe(p), "an inner broadcast under an outer stride does not");
  f.bias_stride.batch[0] = 0, f.bias_stride.batch[1] = 0;
  Expect(BiasFlatBatchStride(f) == 0 && BiasTilesServe(p), "broadcast over every batch dim");
  f.batch_dims[1] = 1, f.bias_stride.batch[0] = 8000, f.bias_stride.batch[1] = 12345;
  Expect(BiasFlatBatchStride(f) == 8000 && BiasTilesServe(p), "a size-1 batch dim's stride is ignored");
  f.batch_dims[1] = 2, f.bias_stride.batch[0] = 8000, f.bias_stride.batch[1] = -8000;
  Expect(BiasFlatBatchStride(f) == -1 && !BiasTilesServe(p), "a negative batch stride is not");
  Expect(BiasTilesCoordinate(0, 7) == 0 && BiasTilesCoordinate(16, 7) == 7, "broadcast coordinates at 0");
}

}  // namespace

int main() {
  std::mt19937 rng(20261205);
  using Tr128 = FwdTraits<128, 0, 2>;
  using Tr64 = FwdTraits<64, 0, 2>;
  CheckMap<Tr128>("head dim 128");
  CheckMap<Tr64>("head dim 64, two consumers");
  using Bwd128 = BwdTraitsFor<128, FeatureBwdSchedule(128)>;
  {
    using Tile = BwdBiasTile<Bwd128>;
    Expect(Tile::kBarrierOffset >= Bwd128::kBarrierOffset + 8 * Bwd128::kBarriers && Tile::kOffset % 1024 == 0 &&
               Tile::kOffset >= Tile::kBarrierOffset + 16 && Tile::kSmemBytes <= 227 * 1024,
           "the backward's tile past its barriers, on a 1024-byte atom, within 227 KiB");
    std::printf("backward, head dim 128: bias tile at %d, %d bytes of shared memory (the backward's %d)\n",
                Tile::kOffset, Tile::kSmemBytes, Bwd128::kSmemBytes);
  }
  for (int round = 0; round < 4; ++round) {
    CheckFragments<Tr128, __nv_bfloat16>(rng, "bf16, 128");
    CheckFragments<Tr128, __half>(rng, "f16, 128");
    CheckFragments<Tr64, __nv_bfloat16>(rng, "bf16, 64");
    CheckFragments<Tr64, __half>(rng, "f16, 64");
    CheckBackwardFragments<Bwd128, __nv_bfloat16>(rng, "backward bf16, 128");
    CheckBackwardFragments<Bwd128, __half>(rng, "backward f16, 128");
  }
  CheckServe();
  std::printf("sm90 bias tiles: %d failures\n", failures);
  return failures == 0 ? 0 : 1;
}
