// What one decode launch computes, for the kernels: the query side, where
// each sequence's keys and values live (contiguous or paged), which keys each
// query sees, and where the splits' partial results go. One struct serves
// the contiguous call (jax_flash.attention with short queries) and the paged
// one (jax_flash.paged_attention), so one compiled kernel per dtype and head
// dim serves both; they differ only in KvSource's addressing and the mask.
#pragma once

#include <cstdint>

#include "common/mask_policy.h"
#include "common/paged_params.h"
#include "common/params.h"
#include "cuda/sm80/mma.cuh"

namespace jax_flash::cuda::decode {

struct DecodeArgs {
  // The query side of both paths: shape (batch = sequences, seqlen_k = the
  // longest key range), q / out / lse pointers and q_stride (shared by out),
  // scale, and for the contiguous path k / v / k_stride, is_causal and the
  // features that MaskPolicy::For reads. For a paged call the launcher
  // fills it from the PagedParams (queries are contiguous BTNH there).
  AttentionParams attn;
  PagedParams paged;  // the paged call's tables and pool (is_paged only)
  bool is_paged = false;
  int splits = 1;        // key ranges per sequence; 1: the kernel writes out and lse itself
  int m_blocks = 1;      // blocks of 64 packed rows per (sequence, key head)
  float* partial_out = nullptr;  // [splits][batch * heads * seqlen_q][head_dim] (splits > 1)
  float* partial_lse = nullptr;  // [splits][batch * heads * seqlen_q]
};

// The paged call's visibility as a MaskPolicy: query t of a sequence of
// length len sits at position len - Tq + t (diagonal = len - Tq) and sees
// keys max(0, pos - window_left) <= j <= pos, j < len. The same rule as the
// CPU's PagedMask (cpu/paged_cpu.cc), which indexes queries by position
// instead; tokens at negative positions (len < Tq) see nothing: zeros, lse
// -inf.
JAX_FLASH_HOST_DEVICE inline MaskPolicy PagedDecodeMask(const PagedParams& p, int64_t seq) {
  const int64_t len = p.SeqLength(seq);  // clamped into [0, max_blocks * block_size]
  MaskPolicy m;
  m.seqlen_q = p.shape.seqlen_q;
  m.seqlen_k = len;
  m.causal = true;
  m.window_left = p.window_left;
  m.window_right = -1;
  m.diagonal = len - p.shape.seqlen_q;
  return m;
}

// Where one (sequence, key head)'s key and value rows live. Contiguous: at
// k + j * row_stride. Paged: position j is row j % block_size of pool block
// table[j / block_size] (the id clamped into [0, num_blocks), as
// PagedParams::BlockId does), rows row_stride apart inside a block.
template <typename Element>
struct KvSource {
  const Element* k = nullptr;  // position 0 (contiguous) or pool block 0 (paged), this key head
  const Element* v = nullptr;
  int64_t row_stride = 0;        // elements between consecutive positions of one block
  const int32_t* table = nullptr;  // this sequence's block table row; null: contiguous
  int64_t block_stride = 0;      // elements between consecutive pool blocks
  int block_size = 0, num_blocks = 0;
  // log2(block_size) when it is a power of two, else -1: the tile loads
  // then split positions into (block, row) with a shift and a mask instead
  // of a division by the runtime block size (~20 instructions a division,
  // one per row of a gathered tile).
  int block_shift = -1;

  __device__ static KvSource For(const DecodeArgs& args, int64_t seq, int64_t hk) {
    KvSource kv;
    if (args.is_paged) {
      const PagedParams& p = args.paged;
      const PagedShape& s = p.shape;
      kv.row_stride = s.num_heads_k * s.head_dim;
      kv.block_stride = s.block_size * kv.row_stride;
      // The pool of this sequence's outer (vmapped) index, as CacheOffset.
      const int64_t pool = seq / s.batch * s.num_blocks * kv.block_stride + hk * s.head_dim;
      kv.k = static_cast<const Element*>(p.k_cache) + pool;
      kv.v = static_cast<const Element*>(p.v_cache) + pool;
      kv.table = p.block_tables + seq * s.max_blocks;
      kv.block_size = int(s.block_size);
      kv.num_blocks = int(s.num_blocks);
      kv.block_shift = (kv.block_size & (kv.block_size - 1)) == 0 ? __ffs(kv.block_size) - 1 : -1;
    } else {
      const AttentionParams& p = args.attn;
      const int64_t off = seq * p.k_stride.batch + hk * p.k_stride.head;
      kv.k = static_cast<const Element*>(p.k) + off;
      kv.v = static_cast<const Element*>(p.v) + off;
      kv.row_stride = p.k_stride.row;
    }
    return kv;
  }

  // Element offset of pool block `logical` of this sequence (paged).
  __device__ int64_t BlockBase(int logical) const {
    const int id = table[logical];
    return int64_t(id < 0 ? 0 : (id >= num_blocks ? num_blocks - 1 : id)) * block_stride;
  }

  // Element offset of position pos of this sequence (paged), the block by
  // shift and mask where the block size allows (the 64-bit j0 / block_size
  // it replaces was a ~25-instruction division per tile, on the path to the
  // tile's first copy). 32-bit positions: the launcher checks
  // max_blocks * block_size < 2^31 - kDecodeBlockKeys.
  __device__ int64_t WholeTileBase(unsigned pos) const {
    const unsigned bs = unsigned(block_size);
    const unsigned logical = block_shift >= 0 ? pos >> block_shift : pos / bs;
    return BlockBase(int(logical)) + int64_t(pos - logical * bs) * row_stride;
  }

  // Copies positions [j0, j0 + kRows) of K and V into two swizzled shared
  // tiles (SwizzledOffset); positions >= end and columns >= head_dim read as
  // zero (end > j0; j0 a multiple of kRows). Contiguous tiles, and paged ones
  // whose block size is a multiple of kRows (so a tile never straddles
  // blocks), are one strided run: the sm80 LoadTileAsync. Power-of-two block
  // sizes below kRows take one table entry per pass of rows; other block
  // sizes gather row by row. 32-bit positions in the paged paths (the
  // launcher checks max_blocks * block_size < 2^31 - kRows).
  template <int kRows, int kHeadDim, int kThreads>
  __device__ void LoadTileAsync(uint32_t k_dst, uint32_t v_dst, int64_t j0, int64_t end,
                                int head_dim) const {
    if (!table || block_size % kRows == 0) {
      const int64_t base = table ? WholeTileBase(unsigned(j0)) : j0 * row_stride;
      sm80::LoadTileAsync<kRows, kHeadDim, kThreads>(k_dst, k + base, row_stride, 0, end - j0, head_dim);
      sm80::LoadTileAsync<kRows, kHeadDim, kThreads>(v_dst, v + base, row_stride, 0, end - j0, head_dim);
      return;
    }
    // The thread -> (row, chunk) map of sm80::LoadTileAsync, with the rows'
    // offsets looked up through the table. K and V share the lookups.
    constexpr int kChunks = kHeadDim / 8;
    constexpr int kThreadsPerRow = kThreads / 8 < kChunks ? kThreads / 8 : kChunks;
    constexpr int kColPasses = kChunks / kThreadsPerRow;
    constexpr int kRowStep = kThreads / kThreadsPerRow;
    static_assert(kThreadsPerRow % 8 == 0 && kRowStep % 8 == 0 && kRows % kRowStep == 0);
    static_assert((kRows & (kRows - 1)) == 0 && (kRowStep & (kRowStep - 1)) == 0);
    constexpr int kRowPasses = kRows / kRowStep;
    const int r = threadIdx.x / kThreadsPerRow, c = threadIdx.x % kThreadsPerRow;
    const uint32_t dst = sm80::SwizzledOffset<kChunks>(r, c);
    const int rows_left = int(end - j0) - r;
    if (block_shift >= 0 && block_size >= kRowStep) {
      // A power of two in [kRowStep, kRows): it divides kRows, so the tile
      // starts a block, and pass i's kRowStep rows (i * kRowStep + r, r <
      // kRowStep) all lie in entry (i * kRowStep) >> shift of the tile's,
      // at row (i * kRowStep) % block_size + r of that block: one
      // warp-uniform table read and one block offset per pass, no per-row
      // division, no shuffles (block 16 at head dim 128: 4 entries, 2
      // passes each). sm_90a SASS per warp and tile, K and V: ~162
      // instructions here, ~400 in the row-by-row gather below, ~140 for a
      // contiguous tile's copies (of ~800 a tile in all at Tq = 16, G = 4).
      const unsigned shift = unsigned(block_shift), mask = unsigned(block_size) - 1;
      const unsigned first = unsigned(j0) >> shift;
      const unsigned last_logical = unsigned(end - 1) >> shift;  // entries past it may not exist
      // Every pass's table read before the first copy, so that all of them
      // are in flight together: one round trip per tile, not one per pass
      // (ptxas issued the gather's per-row lookups each just before its
      // copies). Passes sharing an entry read the same word (an L1 hit).
      int id[kRowPasses];
#pragma unroll
      for (int i = 0; i < kRowPasses; ++i)
        id[i] = table[min(first + (unsigned(i * kRowStep) >> shift), last_logical)];
      // 32-bit byte offsets inside a block: a block of <= 32 rows of at most
      // 65535 key heads x 256 columns is < 2^31 bytes (the launcher's head
      // limits), so one 32 x 32 -> 64-bit multiply-add places each pass.
      // Every copy's source stays inside the pool, also for the masked ones
      // (zero bytes read): rows past `end` take the last entry's block (ids
      // clamped), and columns past head_dim column 0 of the row, so no
      // per-copy select of a fallback pointer is needed.
      const uint32_t row_bytes = uint32_t(row_stride) * uint32_t(sizeof(Element));
      const uint32_t block_bytes = uint32_t(block_size) * row_bytes;
      const char* k_bytes = reinterpret_cast<const char*>(k);
      const char* v_bytes = reinterpret_cast<const char*>(v);
#pragma unroll
      for (int i = 0; i < kRowPasses; ++i) {
        const int block = max(0, min(id[i], num_blocks - 1));
        const uint32_t row = (unsigned(i * kRowStep) & mask) + unsigned(r);  // in its block
#pragma unroll
        for (int j = 0; j < kColPasses; ++j) {
          const int chunk = c + j * kThreadsPerRow;
          const bool col_ok = chunk * 8 < head_dim;
          const bool valid = col_ok && i * kRowStep < rows_left;
          const uint32_t at = dst + uint32_t((i * kRowStep * kChunks + j * kThreadsPerRow) * 16);
          const uint32_t in_block = row * row_bytes + uint32_t(col_ok ? chunk * 8 * int(sizeof(Element)) : 0);
          const uint64_t src = uint64_t(uint32_t(block)) * block_bytes + in_block;
          sm80::CpAsync16(k_dst + at, k_bytes + src, valid);
          sm80::CpAsync16(v_dst + at, v_bytes + src, valid);
        }
      }
      return;
    }
    // The tile's 64 positions lie in at most 64 consecutive table entries
    // from `first`: each lane reads two of them (entries past the last
    // position's read that one, which exists), and every row takes its
    // block's id from the lane holding it. Two loads in flight per lane and
    // one round trip per tile; with a lookup per row, ptxas issued each
    // load just before its copies, one round trip after another (8 per
    // tile at 128).
    static_assert(kRows <= 64, "two table entries per lane");
    const unsigned last = unsigned(end - 1), bs = unsigned(block_size);
    const unsigned first = unsigned(j0) / bs, last_logical = last / bs;
    const int lane = threadIdx.x % 32;
    const int ids_low = table[min(first + lane, last_logical)];
    const int ids_high = table[min(first + 32 + lane, last_logical)];
    unsigned within[kRowPasses];
    int id[kRowPasses];
#pragma unroll
    for (int i = 0; i < kRowPasses; ++i) {
      const unsigned pos = min(unsigned(j0) + unsigned(r + i * kRowStep), last);
      const unsigned logical = pos / bs;
      within[i] = pos - logical * bs;
      const unsigned entry = logical - first;  // 0 .. 63
      const int low = __shfl_sync(0xffffffffu, ids_low, entry % 32);
      const int high = __shfl_sync(0xffffffffu, ids_high, entry % 32);
      id[i] = entry < 32 ? low : high;
    }
    int64_t offset[kRowPasses];
#pragma unroll
    for (int i = 0; i < kRowPasses; ++i) {
      const int block = id[i] < 0 ? 0 : (id[i] >= num_blocks ? num_blocks - 1 : id[i]);
      offset[i] = int64_t(block) * block_stride + int64_t(within[i]) * row_stride;
    }
#pragma unroll
    for (int i = 0; i < kRowPasses; ++i)
#pragma unroll
      for (int j = 0; j < kColPasses; ++j) {
        const int chunk = c + j * kThreadsPerRow;
        const bool valid = chunk * 8 < head_dim && i * kRowStep < rows_left;
        const uint32_t at = dst + uint32_t((i * kRowStep * kChunks + j * kThreadsPerRow) * 16);
        const int64_t src = offset[i] + chunk * 8;
        sm80::CpAsync16(k_dst + at, valid ? static_cast<const void*>(k + src) : k, valid);
        sm80::CpAsync16(v_dst + at, valid ? static_cast<const void*>(v + src) : v, valid);
      }
  }
};

}  // namespace jax_flash::cuda::decode
