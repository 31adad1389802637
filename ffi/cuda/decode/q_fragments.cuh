// S = Q K^T with Q's A fragments held in registers: a decode warp multiplies
// the same 16 query rows by every 16-key chunk of its split, so reading Q
// from shared memory once per chunk (sm80::GemmSmemSmemT) would be a third
// of the kernel's shared-memory reads when a warp takes all 4 chunks of a
// tile (64 packed rows). Same fragment layouts and swizzled addressing as
// the sm80 GEMMs (warp_gemm.cuh), built from their ldmatrix / mma wrappers.
#pragma once

#include "cuda/sm80/mma.cuh"

namespace jax_flash::cuda::decode {

// The A fragments of rows [row0, row0 + 16) x all kHeadDim columns of a
// swizzled 16-bit tile, one per k step of 16 columns.
template <int kHeadDim>
__device__ __forceinline__ void LoadQFragments(uint32_t (&q)[kHeadDim / 16][4], uint32_t tile, int row0,
                                               int lane) {
  const sm80::SwizzledRows<kHeadDim / 8> rows(tile, row0 + (lane / 8 % 2) * 8 + lane % 8, lane / 16);
#pragma unroll
  for (int ks = 0; ks < kHeadDim / 16; ++ks) sm80::LdMatrixX4(q[ks], rows.At(0, 2 * ks));
}

// acc[nt] += Q (registers) x B^T for B rows b_row0 + 8 nt .. of a swizzled
// [rows][kHeadDim] tile (keys): sm80::GemmSmemSmemT with kM = 1 and A from q.
template <typename Element, int kN, int kHeadDim>
__device__ __forceinline__ void GemmQRegsSmemT(float (&acc)[1][kN][4], const uint32_t (&q)[kHeadDim / 16][4],
                                               uint32_t b_tile, int b_row0, int lane) {
  static_assert(kN % 2 == 0);
  const sm80::SwizzledRows<kHeadDim / 8> b_rows(b_tile, b_row0 + (lane / 16) * 8 + lane % 8, lane / 8 % 2);
#pragma unroll
  for (int ks = 0; ks < kHeadDim / 16; ++ks)
#pragma unroll
    for (int nt = 0; nt < kN; nt += 2) {
      uint32_t b[4];  // n-tiles nt and nt + 1, k halves 0 and 1
      sm80::LdMatrixX4(b, b_rows.At(nt * 8, 2 * ks));
      sm80::Mma16816<Element>(acc[0][nt], q[ks], b[0], b[1]);
      sm80::Mma16816<Element>(acc[0][nt + 1], q[ks], b[2], b[3]);
    }
}

}  // namespace jax_flash::cuda::decode
