// Thin wrappers over the sm_80 tensor-core and async-copy instructions used by
// the mma.sync kernels (also valid on sm_90): ldmatrix, mma.m16n8k16, cp.async.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace jax_flash::cuda::sm80 {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8
// and receives, per matrix, elements (row l / 4, cols 2 * (l % 4) + {0, 1}).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// As LdMatrixX4, each matrix transposed: lane l receives (rows 2 * (l % 4) + {0, 1}, col l / 4).
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D[16x8] += A[16x16] * B[16x8], float accumulators. Fragments (g = lane / 4,
// t = lane % 4): A {(g, 2t..), (g + 8, 2t..), (g, 8 + 2t..), (g + 8, 8 + 2t..)},
// B {(k = 2t.., n = g), (k = 8 + 2t.., n = g)}, D {(g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)}.
template <typename Element>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1);

template <>
__device__ __forceinline__ void Mma16816<__half>(float (&d)[4], const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void Mma16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to a packed pair of 16-bit elements (lo = a).
template <typename Element>
__device__ __forceinline__ uint32_t Pack2(float a, float b);

template <>
__device__ __forceinline__ uint32_t Pack2<__half>(float a, float b) {
  __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t Pack2<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&h);
}

// 16-byte global -> shared copy; when !valid the destination is zero-filled
// and nothing is read (src-size 0), which is how tails are predicated.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}

// The same, unpredicated: for copies known to be in range.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Waits for the kWarps consecutive warps of group `group` (named barrier
// 1 + group; 0 is __syncthreads): a backward key group, a forward warp pair.
template <int kWarps>
__device__ __forceinline__ void SyncWarpGroup(int group) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + group), "n"(kWarps * 32) : "memory");
}

// 32-bit shared-memory accesses by address (the kernels address shared
// memory as 32-bit offsets, as ldmatrix does; a generic pointer would cost
// two registers).
__device__ __forceinline__ void StSharedF32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ float LdSharedF32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows hold
// kChunks chunks (kChunks >= 8). XOR-ing the chunk with row % 8 spreads the 8
// rows an ldmatrix reads at one column over all 32 banks.
template <int kChunks>
__device__ __forceinline__ uint32_t SwizzledOffset(int row, int chunk) {
  static_assert(kChunks >= 8 && kChunks % 8 == 0);
  return uint32_t((row * kChunks + (chunk ^ (row & 7))) * 16);
}

// ldmatrix lane addresses in a swizzled tile, with the swizzle hoisted out
// of the k loop. A lane reads its row `row` plus offsets that are multiples
// of 8 rows (so row % 8, the swizzle's key, never changes), at chunk C + h:
// C even (usually a compile-time k step), h the lane's 0/1 chunk bit. Then
//   (C + h) ^ (row % 8) = (C & ~7) + ((C & 6) ^ (h ^ row % 8)),
// so each chunk costs one XOR with a per-lane constant, shared by every row
// tile the lane reads, instead of SwizzledOffset's multiply-XOR-add per read.
template <int kChunks>
struct SwizzledRows {
  static_assert(kChunks >= 8 && kChunks % 8 == 0);
  uint32_t base;  // the tile + this lane's row
  uint32_t key;   // (h ^ row % 8) * 16

  __device__ __forceinline__ SwizzledRows(uint32_t tile, int row, int h)
      : base(tile + uint32_t(row * kChunks * 16)), key(uint32_t(((h ^ row) & 7) * 16)) {}

  // Byte address of chunk c_even + h of row (row + row_offset); row_offset a
  // multiple of 8, c_even even. Equals tile + SwizzledOffset(row + row_offset,
  // c_even + h).
  __device__ __forceinline__ uint32_t At(int row_offset, int c_even) const {
    return base + uint32_t(row_offset * kChunks * 16 + (c_even & ~7) * 16) +
           (uint32_t((c_even & 6) * 16) ^ key);
  }
};

// The same interface for an unswizzled tile whose rows are kRowBytes apart:
// a pitch of 16 mod 128 bytes puts the 8 rows an ldmatrix reads at one column
// (or 8 rows of 32-bit stores) in distinct banks. Any column offset folds
// into the tile address, which a swizzle allows only in whole periods.
template <int kRowBytes>
struct PaddedRows {
  static_assert(kRowBytes % 128 == 16, "rows 16 bytes past a multiple of 128");
  uint32_t base;

  __device__ __forceinline__ PaddedRows(uint32_t tile, int row, int h)
      : base(tile + uint32_t(row * kRowBytes + h * 16)) {}
  __device__ __forceinline__ uint32_t At(int row_offset, int c_even) const {
    return base + uint32_t(row_offset * kRowBytes + c_even * 16);
  }
};

// threadIdx.x, read where it is used: the compiler cannot hoist a volatile
// read out of a loop, so what is computed from it is not kept live across
// the loop (in a kernel at its register limit, such values get spilled).
__device__ __forceinline__ int ThreadIndexInPlace() {
  int thread;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(thread));
  return thread;
}

// Copies rows [row0, row0 + kRows) x [0, kHeadDim) of a 16-bit tensor into a
// swizzled shared tile; rows >= num_rows and columns >= head_dim read as zero.
// head_dim must be a multiple of 8 (whole 16-byte chunks). kThreadsPerRow
// threads share a row (all its chunks, or 16 at a time when there are fewer
// than 8 * kChunks threads); a thread always copies the same chunk columns,
// kRowStep rows apart. kRowStep and kThreadsPerRow are multiples of 8, so
// every copy of a thread shares one swizzle and only the base address moves.
template <int kRows, int kHeadDim, int kThreads, typename Element>
__device__ __forceinline__ void LoadTileAsync(uint32_t smem_tile, const Element* src,
                                              int64_t row_stride, int64_t row0,
                                              int64_t num_rows, int head_dim) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kThreadsPerRow = kThreads / 8 < kChunks ? kThreads / 8 : kChunks;
  constexpr int kColPasses = kChunks / kThreadsPerRow;
  constexpr int kRowStep = kThreads / kThreadsPerRow;
  static_assert(kThreads % kThreadsPerRow == 0 && kChunks % kThreadsPerRow == 0 &&
                kThreadsPerRow % 8 == 0 && kRowStep % 8 == 0 && kRows % kRowStep == 0);
  const int r = threadIdx.x / kThreadsPerRow, c = threadIdx.x % kThreadsPerRow;
  const uint32_t dst = smem_tile + SwizzledOffset<kChunks>(r, c);
  // One 64-bit multiply per tile, then a constant byte step per copy (a
  // product per copy, with the strides re-read from the parameters, cost
  // ~12 instructions a copy in the key-block loops).
  const char* g = reinterpret_cast<const char*>(src + (row0 + r) * row_stride + c * 8);
  const int64_t step_bytes = int64_t(kRowStep) * row_stride * int64_t(sizeof(Element));
  const int64_t rows_left = num_rows - row0 - r;
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; ++i) {
#pragma unroll
    for (int j = 0; j < kColPasses; ++j) {
      // Chunk c + j * kThreadsPerRow: the swizzle's XOR touches only the low
      // 3 bits of the chunk, so the pass offset adds on.
      const int chunk = c + j * kThreadsPerRow;
      const bool valid = chunk * 8 < head_dim && i * kRowStep < rows_left;
      CpAsync16(dst + (i * kRowStep * kChunks + j * kThreadsPerRow) * 16,
                valid ? static_cast<const void*>(g + j * kThreadsPerRow * 16) : src, valid);
    }
    g += step_bytes;
  }
}

// LoadTileAsync for a tile wholly in range (row0 + kRows <= num_rows and
// head_dim == kHeadDim): no bounds checks and no predicated source per copy,
// ~5 instructions a copy fewer. Callers choose it per tile (the backward's
// steps, all but a tail's).
template <int kRows, int kHeadDim, int kThreads, typename Element>
__device__ __forceinline__ void LoadFullTileAsync(uint32_t smem_tile, const Element* src,
                                                  int64_t row_stride, int64_t row0) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kThreadsPerRow = kThreads / 8 < kChunks ? kThreads / 8 : kChunks;
  constexpr int kColPasses = kChunks / kThreadsPerRow;
  constexpr int kRowStep = kThreads / kThreadsPerRow;
  const int r = threadIdx.x / kThreadsPerRow, c = threadIdx.x % kThreadsPerRow;
  const uint32_t dst = smem_tile + SwizzledOffset<kChunks>(r, c);
  const char* g = reinterpret_cast<const char*>(src + (row0 + r) * row_stride + c * 8);
  const int64_t step_bytes = int64_t(kRowStep) * row_stride * int64_t(sizeof(Element));
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; ++i) {
#pragma unroll
    for (int j = 0; j < kColPasses; ++j)
      CpAsync16(dst + (i * kRowStep * kChunks + j * kThreadsPerRow) * 16, g + j * kThreadsPerRow * 16);
    g += step_bytes;
  }
}

}  // namespace jax_flash::cuda::sm80
