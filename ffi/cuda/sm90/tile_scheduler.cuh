// The persistent grid's static schedule: the tiles (128 query rows, head,
// batch) in an order fixed per call, dealt in rounds of gridDim.x, one to
// each block (one per SM; Next). (The forward's feature variants take the
// same tiles in Decode's order from a counter instead, as blocks come free:
// fwd_kernel.cuh's for_each_taken_tile; their costs depend on segment ids.)
// Causal: query blocks from the last (the most keys) to the first, so the heaviest tiles run first and the light ones
// fill the end (LPT over sorted jobs); every other round is dealt in
// reverse, so the block that took a round's heaviest tile takes the next
// round's lightest (dealing in the same direction would leave block 0 about
// one heavy tile behind the last block at the end). Otherwise a head's query
// blocks are consecutive, so blocks running together share that head's K
// and V in L2.
//
// Causal orders (`section`):
//   0: one query block of all heads and batches before the next. The ~132
//      tiles in flight then belong to ~132 heads, and each re-reads its
//      head's K/V from HBM (little L2 reuse).
//   s > 0: FlashAttention-3's L2-aware order. The (batch, head) pairs, flat
//      as b * heads + h, form sections of s consecutive pairs (the launch
//      sizes s so that a section's K/V fits in L2 and it has at least two
//      rounds of tiles, CausalSection); section after section, each from
//      its last query block to its first, heads inner, each dealt in rounds
//      of its own (Next). The tiles in flight then span one or two
//      sections' heads, whose K/V stay in L2; heaviest first (LPT) and the
//      snake hold within each section. s >= heads * batch is order 0.
#pragma once

#include <cstdint>

namespace jax_flash::cuda::sm90 {

struct TileCoord {
  int m_block, h, b;
};

// 32-bit indices throughout (the launch requires fewer than 2^31 tiles): the
// tile loop's state lives through the consumer's whole body, where 64-bit
// values cost the registers that made the 256 kernel spill.
// Where a block is in its walk over the rounds (TileScheduler::Next).
struct TileCursor {
  int local = 0;       // round within the current section
  int first_tile = 0;  // the section's first tile
};

// n / d and n % d for 0 <= n < 2^31 by a divisor 1 <= d < 2^31 fixed per
// launch: a multiply-high, an add and a shift with the magic number set on
// the host (Granlund and Montgomery, 1994; CUTLASS's FastDivmod), exact for
// every such n. Decode's five int32 divisions by launch sizes took ~20
// instructions and several temporaries each, in the producer's 24 registers
// (a spill per tile) and ahead of every tile in both roles.
struct FastDivisor {
  uint32_t divisor = 1, multiplier = 1, shift = 0;

  FastDivisor() = default;
  // shift = ceil(log2 d), multiplier = floor(2^32 (2^shift - d) / d) + 1 (< 2^32).
  explicit FastDivisor(int d) : divisor(uint32_t(d)) {
    while ((uint64_t(1) << shift) < divisor) ++shift;
    multiplier = uint32_t((uint64_t(1) << 32) * ((uint64_t(1) << shift) - divisor) / divisor + 1);
  }
  __host__ __device__ int Div(int n) const {
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(uint32_t(n), multiplier);
#else
    const uint32_t hi = uint32_t((uint64_t(uint32_t(n)) * multiplier) >> 32);
#endif
    return int((hi + uint32_t(n)) >> shift);  // hi <= n < 2^31: no carry out of 32 bits
  }
};

struct TileScheduler {
  int m_blocks, heads, batch;
  bool causal;
  // The flat (batch, head) pair of the orders above: b * heads + h, or with
  // batch_inner h * batch + b, so that the batch rows of one head run
  // together. The launch sets it for a bias broadcast over the batch
  // (launch.cuh): each tile reads its rows' [128 x seqlen_k] of the bias,
  // which the tiles of the other batch rows then read from L2 (heads
  // innermost, the ~132 tiles in flight span ~4 heads of one batch row, and
  // a batch row's bias comes back from HBM a whole batch row of tiles
  // later). K and V differ per pair either way (a section still holds
  // `section` pairs' K/V).
  bool batch_inner = false;
  int section = 0;         // (batch, head) pairs per causal section; 0: one section of all
  int section_tiles = 0;   // tiles per section (SetSections)
  int section_rounds = 1;  // rounds per section (SetSections)
  // Decode's divisors (SetSections): query blocks, heads, tiles per section,
  // and the pairs of a full section and of the last one.
  FastDivisor by_m_blocks, by_heads, by_section_tiles, by_section_pairs, by_last_pairs, by_batch;

  __host__ __device__ int64_t Tiles() const { return int64_t(m_blocks) * heads * batch; }
  // Pairs per section: all of them (one section) unless causal and sectioned.
  __host__ __device__ int SectionPairs() const {
    const int pairs = heads * batch;
    return causal && section > 0 && section < pairs ? section : pairs;
  }
  // The order (`pairs` per causal section, 0: order 0) dealt to `blocks`
  // blocks; the launch calls it before every launch, the rounds being per grid.
  // Host only (the divisors' magic numbers).
  void SetSections(int pairs, int blocks) {
    section = pairs;
    const int s = SectionPairs(), all = heads * batch;
    section_tiles = s * m_blocks;
    section_rounds = (section_tiles + blocks - 1) / blocks;
    by_m_blocks = FastDivisor(m_blocks);
    by_heads = FastDivisor(heads);
    by_batch = FastDivisor(batch);
    by_section_tiles = FastDivisor(section_tiles);
    by_section_pairs = FastDivisor(s);
    by_last_pairs = FastDivisor(all - (all - 1) / s * s);  // the last section's pairs
  }
  // Block `block`'s tile of its next round (and the cursor on to the round
  // after): Tiles() when the block has no tiles left, -1 when it has none in
  // this round but may in later ones. Each section is dealt in rounds of its
  // own, round r of a section its tiles r * blocks .. r * blocks + blocks - 1
  // (causal: every other round reversed), so every section is balanced like
  // the whole of order 0 (to within one tile, the lightest ones at its end);
  // its last round may leave blocks without a tile, which go on to the next
  // section's first round. (Dealing the sectioned order in one run of rounds
  // put section boundaries mid-round, and each one tilted the balance: at 32
  // query blocks x 64 pairs in sections of 16 on 132 blocks, the busiest
  // block had 1.29x the mean work.) Order 0 and non-causal calls are one
  // section. Counters and host-computed sizes, not divisions: the producer
  // has 24 registers.
  __host__ __device__ int Next(TileCursor& c, int block, int blocks) const {
    const int tiles = int(Tiles());
    if (c.first_tile >= tiles) return tiles;
    const int pos = c.local * blocks + (causal && (c.local & 1) ? blocks - 1 - block : block);
    const int tile = pos < tiles - c.first_tile && pos < section_tiles ? c.first_tile + pos : -1;
    if (++c.local == section_rounds) c.local = 0, c.first_tile += section_tiles;
    return tile;
  }
  // Both roles decode every tile with this one function (and the consumer
  // again for its epilogue), so they agree on each tile's coordinates and
  // hence on its key blocks and barrier phases. Divisions by FastDivisor
  // (SetSections must have run).
  // kBatchInner: whether this kernel honours batch_inner (the bias
  // variants; elsewhere the flag stays false and its branch out of the
  // code: in the dropout kernels it cost loop spills).
  template <bool kBatchInner = false>
  __host__ __device__ TileCoord Decode(int tile) const {
    int rest = tile, m_block;
    if (causal) {
      // The sections before this tile's are full (s pairs x m_blocks tiles
      // each); the last one holds the remaining pairs. Order 0 is one
      // section: first = 0, count = all pairs.
      const int s = int(by_section_pairs.divisor);
      const int first = by_section_tiles.Div(tile) * s;
      const bool last = heads * batch - first < s;
      const FastDivisor& count = last ? by_last_pairs : by_section_pairs;
      rest = tile - first * m_blocks;
      const int q = count.Div(rest);
      m_block = m_blocks - 1 - q;
      rest = first + (rest - q * int(count.divisor));  // the flat pair
    } else {
      const int q = by_m_blocks.Div(tile);
      m_block = tile - q * m_blocks;
      rest = q;
    }
    if (kBatchInner && batch_inner) {  // the flat pair h * batch + b
      const int h = by_batch.Div(rest);
      return {m_block, h, rest - h * batch};
    }
    const int b = by_heads.Div(rest);  // b * heads + h
    return {m_block, rest - b * heads, b};
  }
};

// Bytes of K and V per key head that one causal section may hold in L2
// (FlashAttention-3's figure for the H100's 50 MiB: 32 MiB of K/V).
constexpr int64_t kSectionL2Bytes = int64_t(32) << 20;

// The sectioned order's pairs per section for K/V of `kv_head_bytes` (seqlen_k
// x (head dim of K + of V) x element size) per key head: as many key heads as
// fit in kSectionL2Bytes (at least one), rounded down to a power of two as in
// FlashAttention-3, times the query heads sharing each key head (`group`),
// which read the same K/V.
inline int64_t SectionHeads(int64_t kv_head_bytes, int64_t group) {
  int64_t kv_heads = 1;
  while (kv_head_bytes > 0 && 2 * kv_heads * kv_head_bytes <= kSectionL2Bytes) kv_heads *= 2;
  return kv_heads * group;
}

// TileScheduler::section for a causal call of `pairs` (batch, head) pairs and
// `m_blocks` query blocks on `blocks` blocks: SectionHeads, widened (by whole
// groups) to at least two rounds of tiles per section, since a section of
// fewer tiles than blocks leaves the rest idle while it runs (its rounds are
// its own); 0 (order 0) when one section holds every pair.
inline int CausalSection(int64_t kv_head_bytes, int64_t group, int64_t m_blocks, int64_t pairs, int64_t blocks) {
  int64_t s = SectionHeads(kv_head_bytes, group);
  const int64_t min_pairs = (2 * blocks + m_blocks - 1) / m_blocks;
  if (s < min_pairs) s = (min_pairs + group - 1) / group * group;
  return s >= pairs ? 0 : int(s);
}

// The causal tile order (launch.cuh's LaunchForwardScheduled): kAllHeads is
// order 0 (query block by query block over all heads), kSections
// FlashAttention-3's L2-aware sections (TileScheduler::SetSections with
// CausalSection's size). kDefault: sections at head dims up to 128, where the
// H200 measured them 1.10-1.16x faster at B=4 T=4096 causal (H=64 N=32: 409
// vs 373 TFLOP/s; H=128 N=16: 615 vs 529) and even at T=1024 or N=16 at 64.
// At 256 sections only while a key head's K and V take at most
// kSectionsAt256Bytes (seqlen_k <= 2048 in 16 bits): measured (PERF v31,
// B*T = 16384, N = 8, bf16, forward TFLOP/s all heads -> sections) 335 ->
// 405 at T = 1024 and 457 -> 493 at 2048, where order 0's ~132 tiles in
// flight span ~128 heads whose K/V (128 MiB) miss L2 on every tile (ncu:
// DRAM 76% busy, 3.65 TB/s, the traffic of every tile reading its keys from
// HBM), but 561 -> 547 at 4096, 638 -> 568 at 8192, 680 -> 656 at 16384,
// where the tiles are long enough for order 0's reuse within a round.
// (Host-callable: tests/cpp/sm90_tile_scheduler_test.cu.)
enum class CausalOrder { kDefault, kAllHeads, kSections };
constexpr int64_t kSectionsAt256Bytes = int64_t(2) << 20;
constexpr CausalOrder DefaultCausalOrder(int head_dim, int64_t kv_head_bytes) {
  return head_dim <= 128 || kv_head_bytes <= kSectionsAt256Bytes ? CausalOrder::kSections : CausalOrder::kAllHeads;
}

}  // namespace jax_flash::cuda::sm90
