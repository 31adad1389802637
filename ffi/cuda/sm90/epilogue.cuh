// The forward's epilogue for one consumer warpgroup: O normalized, lse, and
// O through shared memory into coalesced 16-byte stores of [B, Tq, N, H].
#pragma once

#include <cstdint>

#include "common/row_end.h"
#include "cuda/sm90/bulk_reduce.cuh"
#include "cuda/sm90/kernel_traits.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/softmax.cuh"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace jax_flash::cuda::sm90 {

// Thread t of a quad (t = lane % 4) holds a[u] = columns 8 (4g + u) + 2t,
// + 1 of its row (u = 0 .. 3, two 16-bit values a word, the wgmma
// accumulator's layout); afterwards it holds the whole 16-byte chunk
// 4g + t of that row, columns 8 (4g + t) + 0 .. 7 in order: a 4 x 4
// transpose over the quad, its 2 x 2 blocks swapped with lane t ^ 2, then
// the elements within each block with lane t ^ 1 (four shuffles, no
// dynamically indexed registers).
__device__ __forceinline__ void QuadTranspose(uint32_t (&a)[4], int t) {
  const bool hi = t & 2, lo = t & 1;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const uint32_t r = __shfl_xor_sync(0xffffffffu, hi ? a[e] : a[2 + e], 2);
    if (hi) a[e] = r; else a[2 + e] = r;
  }
#pragma unroll
  for (int f = 0; f < 2; ++f) {
    const uint32_t r = __shfl_xor_sync(0xffffffffu, lo ? a[2 * f] : a[2 * f + 1], 1);
    if (lo) a[2 * f] = r; else a[2 * f + 1] = r;
  }
}

// One 16-byte chunk of an output row at `dst` (columns col .. col + 7; the
// launch checks alignment), or, for a head dim that is not a multiple of 8,
// the row's last partial chunk element by element (constant indices keep w
// in registers).
template <typename Element>
__device__ __forceinline__ void StoreChunk(Element* dst, const uint32_t (&w)[4], int col, int head_dim) {
  if (col + 8 <= head_dim) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    uint16_t* dst16 = reinterpret_cast<uint16_t*>(dst);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (e < head_dim - col) dst16[e] = uint16_t(w[e / 2] >> (16 * (e % 2)));
  }
}

// O normalized into [B, Tq, N, H] and the lse, for one consumer warpgroup.
// With an output staging of its own (Tr::kSeparateStaging) through
// `staging`, the warpgroup's own 64 rows of a Q-shaped tile, written in Q's
// layout (TMA's 128-byte swizzle): row r's 16-byte chunk k of column chunk
// c sits at chunk k ^ (r % 8), so a warp's fragment writes (8 rows x 4
// pairs) hit 32 distinct banks; then one thread stores it by TMA through
// `o_map` (a 64-row box of out), a bulk group the next tile's epilogue (or
// the kernel's end) waits for before the staging is rewritten. (Until v31
// every thread read 16-byte chunks back and stored them itself: ~270 of the
// epilogue's ~570 instructions a tile and warp, 16% of the T = 1024
// forward's, by scripts/sass_lines.py.)
// Without one (256: Q and the K/V ring fill shared memory) straight from
// the registers, each quad's pairs transposed into 16-byte chunks
// (QuadTranspose; a warp's store then covers 8 rows x 64 contiguous bytes),
// so that no shared memory is written and Q is free at the tile's last S
// (the staging in Q's rows held the next tile's Q back until both
// warpgroups' epilogues: ~10% of the consumers' stall samples at 256, T =
// 1024 causal, waited on q_full; PERF v31).
// `row0`: the thread's first row within the warpgroup, `m0` the
// warpgroup's first query row; `sink2` the head's attention sink in log2
// units (SinkLog2; -inf: none).
template <typename Element, typename Tr>
__device__ __forceinline__ void StoreOutput(const ForwardArgs& a,
                                            const OnlineSoftmax<Tr::kBlockN, Tr::kHeadDim>& softmax,
                                            float (&o)[Tr::kHeadDim / 2], uint32_t staging,
                                            const CUtensorMap* o_map, int barrier_id,
                                            int row0, int m0, int h, int b, float sink2) {
  constexpr int kHeadDim = Tr::kHeadDim;
  const int tid = threadIdx.x % 128, t = tid % 4;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    // No visible key: zeros (and the sink's lse; without sinks -inf).
    const RowEnd<float> end = EndRow(softmax.row_max[hh], softmax.RowSum(hh), sink2);
#pragma unroll
    for (int j = 0; j < kHeadDim / 8; ++j) o[4 * j + 2 * hh] *= end.scale, o[4 * j + 2 * hh + 1] *= end.scale;
    const int row = m0 + row0 + 8 * hh;
    if (t == 0 && row < a.seqlen_q) a.lse[(int64_t(b) * a.num_heads + h) * a.seqlen_q + row] = end.lse;
  }
  if constexpr (!Tr::kSeparateStaging) {
    Element* out = static_cast<Element*>(a.out) + int64_t(b) * a.out_stride.batch + int64_t(h) * a.out_stride.head;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = m0 + row0 + 8 * hh;
#pragma unroll
      for (int g = 0; g < kHeadDim / 32; ++g) {
        uint32_t w[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) w[u] = PackPair<Element>(o[4 * (4 * g + u) + 2 * hh], o[4 * (4 * g + u) + 2 * hh + 1]);
        QuadTranspose(w, t);
        const int col = 8 * (4 * g + t);
        if (row < a.seqlen_q && col < a.head_dim)
          StoreChunk(out + int64_t(row) * a.out_stride.row + col, w, col, a.head_dim);
      }
    }
    return;
  }
  // The previous tile's stores have read the staging (their issuing thread
  // waits before the barrier).
  if (tid == 0) BulkWaitRead<0>();
  NamedBarrierSync(barrier_id, 128);
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = row0 + 8 * hh;
      const uint32_t addr = staging + (j / 8) * Tr::kQChunkBytes + r * 128 + (((j % 8) ^ (r % 8)) * 16) + 4 * t;
      const uint32_t v = PackPair<Element>(o[4 * j + 2 * hh], o[4 * j + 2 * hh + 1]);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
    }
  // Every thread's writes, then one thread's TMA stores of the warpgroup's
  // 64 rows, a 64-column chunk each (the staging is in the map's 128-byte
  // swizzle; rows past seqlen_q and columns past head_dim are not written).
  FenceProxyAsync();
  NamedBarrierSync(barrier_id, 128);
  if (tid == 0) {
#pragma unroll
    for (int c = 0; c < kHeadDim / 64; ++c) TmaStore4d(o_map, staging + c * Tr::kQChunkBytes, 64 * c, m0, h, b);
    BulkCommit();
  }
}

}  // namespace jax_flash::cuda::sm90
