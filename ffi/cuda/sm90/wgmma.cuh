// Warpgroup MMA (wgmma, sm_90a): the four warps of a warpgroup issue one
// asynchronous m64nNk16 product with float32 accumulators in registers.
// Operands in shared memory are described by 64-bit matrix descriptors; this
// family stores every tile as TMA writes it with CU_TENSOR_MAP_SWIZZLE_128B:
// 64 16-bit columns (128 bytes) per row, 8-row atoms of 1024 bytes whose 16-
// byte chunks are XOR-swizzled by row % 8, wider tiles as several such
// column chunks one after another (tma.cuh, kernel_traits.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace jax_flash::cuda::sm90 {

// Descriptor of a 128-byte-swizzled tile starting at shared address `addr`.
// K-major operand (rows of 64 contiguous K elements): `stride_bytes` = 1024
// between 8-row atoms along M/N; `leading_bytes` unused (the hardware takes
// K inside one 128-byte row; a k16 step moves `addr` by 32 bytes, and the
// swizzle, applied to the final address bits, stays right because atoms are
// 1024-byte aligned). MN-major operand (rows of 64 contiguous M/N elements,
// one row per K): `stride_bytes` = 1024 between 8-row (8-K) atoms,
// `leading_bytes` = distance between 64-column chunks along M/N.
// Fields: start >> 4 [0,14), leading >> 4 [16,30), stride >> 4 [32,46),
// base offset [49,52) = 0 (1024-aligned atoms), swizzle mode [62,64) = 1 (128 B).
__device__ __forceinline__ uint64_t SmemDescriptor(uint32_t addr, uint32_t leading_bytes,
                                                   uint32_t stride_bytes) {
  uint64_t desc = uint64_t((addr & 0x3FFFF) >> 4);
  desc |= uint64_t((leading_bytes >> 4) & 0x3FFF) << 16;
  desc |= uint64_t((stride_bytes >> 4) & 0x3FFF) << 32;
  desc |= uint64_t(1) << 62;
  return desc;
}

// A product's descriptors as one base per operand plus constant byte
// offsets (the forward's products; the backward's uniform-descriptor
// schedules, BwdUniformDescriptors).
// SmemDescriptor(addr + offset) is the base's with offset >> 4 added to its
// low word when offset is a multiple of 16 and addr + offset < 2^18 (every
// shared address of a block is below 228 KiB, so the start field [0,14)
// never carries into the leading field above it). One 32-bit add per
// operand and wgmma instead of the field packing (mask, shifts, ors) of
// each KMajorDescriptor / MnMajorDescriptor; with a warp-uniform base
// (the warpgroup index broadcast by a shuffle) ptxas keeps both words in
// uniform registers, where HGMMA reads them (no R2UR).
struct UniformDescriptor {
  uint32_t lo, hi;
  __device__ __forceinline__ UniformDescriptor(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes) {
    const uint64_t d = SmemDescriptor(addr, leading_bytes, stride_bytes);
    lo = uint32_t(d);
    hi = uint32_t(d >> 32);
  }
  __device__ __forceinline__ uint64_t At(uint32_t offset) const { return uint64_t(hi) << 32 | (lo + (offset >> 4)); }
};
// The byte offsets of k16 step kk: KMajorDescriptor's and MnMajorDescriptor's.
constexpr uint32_t KMajorOffset(int chunk_bytes, int kk) { return uint32_t((kk / 4) * chunk_bytes + (kk % 4) * 32); }
constexpr uint32_t MnMajorOffset(int kk) { return uint32_t(kk * 16 * 128); }

// Orders this thread's register writes (accumulators, A fragments) before
// the next wgmma reads them.
__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed groups are still running.
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers
// across the asynchronous region (between issue and wait they belong to the
// tensor cores).
template <int kCount>
__device__ __forceinline__ void FenceRegisters(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kCount>
__device__ __forceinline__ void FenceRegisters(uint32_t (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

#include "cuda/sm90/wgmma_asm.inc"

template <typename Element>
constexpr bool kIsBf16 = std::is_same_v<Element, __nv_bfloat16>;

// d[64 x N] (+)= A[64 x 16] B[16 x N]; A and B K-major in shared memory.
// Accumulator layout per warp w of the warpgroup (rows 16w..16w+15), as
// mma.sync's m16n8: d[4j + 2hh + e] = row g + 8hh, column 8j + 2t + e, with
// g = lane / 4, t = lane % 4.
template <typename Element, int N>
__device__ __forceinline__ void WgmmaSS(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc,
                                        int scale_d) {
  static_assert(N == 32 || N == 64 || N == 80 || N == 128 || N == 176, "add the width to scripts/gen_wgmma_asm.py");
  if constexpr (N == 32) {
    if constexpr (kIsBf16<Element>) JAX_FLASH_WGMMA_SS_32("bf16"); else JAX_FLASH_WGMMA_SS_32("f16");
  } else if constexpr (N == 64) {
    if constexpr (kIsBf16<Element>) JAX_FLASH_WGMMA_SS_64("bf16"); else JAX_FLASH_WGMMA_SS_64("f16");
  } else if constexpr (N == 80) {
    if constexpr (kIsBf16<Element>) JAX_FLASH_WGMMA_SS_80("bf16"); else JAX_FLASH_WGMMA_SS_80("f16");
  } else if constexpr (N == 128) {
    if constexpr (kIsBf16<Element>) JAX_FLASH_WGMMA_SS_128("bf16"); else JAX_FLASH_WGMMA_SS_128("f16");
  } else {
    if constexpr (kIsBf16<Element>) JAX_FLASH_WGMMA_SS_176("bf16"); else JAX_FLASH_WGMMA_SS_176("f16");
  }
}

// d[64 x N] (+)= A[64 x 16] B[16 x N]; A in registers (4 x 32-bit per thread,
// mma.sync's m16n8k16 A fragment: a[0] = (g, 2t..2t+1), a[1] = (g + 8, 2t..),
// a[2] = (g, 2t + 8..), a[3] = (g + 8, 2t + 8..)), B MN-major in shared memory.
template <typename Element, int N>
__device__ __forceinline__ void WgmmaRS(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b_desc,
                                        int scale_d) {
  static_assert(N == 64 || N == 128 || N == 256, "add the width to scripts/gen_wgmma_asm.py");
  if constexpr (N == 64) {
    if constexpr (kIsBf16<Element>) JAX_FLASH_WGMMA_RS_64("bf16"); else JAX_FLASH_WGMMA_RS_64("f16");
  } else if constexpr (N == 128) {
    if constexpr (kIsBf16<Element>) JAX_FLASH_WGMMA_RS_128("bf16"); else JAX_FLASH_WGMMA_RS_128("f16");
  } else {
    if constexpr (kIsBf16<Element>) JAX_FLASH_WGMMA_RS_256("bf16"); else JAX_FLASH_WGMMA_RS_256("f16");
  }
}

// d[64 x N] (+)= A[64 x 16] B[16 x N]; A and B MN-major in shared memory
// (M, N contiguous: both transposed by the hardware). The backward's dQ =
// dS K reads dS from its stored transpose dS^T and K from its own tile.
template <typename Element, int N>
__device__ __forceinline__ void WgmmaSSMn(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  static_assert(N == 64 || N == 128, "add the width to scripts/gen_wgmma_asm.py");
  if constexpr (N == 64) {
    if constexpr (kIsBf16<Element>) JAX_FLASH_WGMMA_SS_MN_64("bf16"); else JAX_FLASH_WGMMA_SS_MN_64("f16");
  } else {
    if constexpr (kIsBf16<Element>) JAX_FLASH_WGMMA_SS_MN_128("bf16"); else JAX_FLASH_WGMMA_SS_MN_128("f16");
  }
}

// d[64 x N] (+)= A[64 x 16] B[16 x N]; A K-major, B MN-major, both in shared
// memory. The 256 backward's dV += P^T dO and dK += dS^T Q, whose A (P^T,
// dS^T over the step's 64 queries) two warpgroups computed half each, so
// it cannot come from one warpgroup's registers (bwd256_kernel.cuh).
template <typename Element, int N>
__device__ __forceinline__ void WgmmaSSTransB(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc, int scale_d) {
  static_assert(N == 128, "add the width to scripts/gen_wgmma_asm.py");
  if constexpr (kIsBf16<Element>) JAX_FLASH_WGMMA_SS_TB_128("bf16"); else JAX_FLASH_WGMMA_SS_TB_128("f16");
}

// Two floats as one 32-bit register of two 16-bit values (low half = a).
template <typename Element>
__device__ __forceinline__ uint32_t PackPair(float a, float b) {
  if constexpr (kIsBf16<Element>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

}  // namespace jax_flash::cuda::sm90
