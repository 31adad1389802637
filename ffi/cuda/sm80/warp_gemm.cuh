// The warp-level matrix products every mma.sync kernel is built from.
// Shared tiles are swizzled (SwizzledOffset), kHeadDim 16-bit columns unless said.
//
//   GemmSmemSmemT: acc[m][n] += sum_d A[m][d] * B[n][d]   (S = Q K^T and kin)
//   GemmRegsSmem:  out[m][d] += sum_n P[m][n] * B[n][d]   (O = P V and kin)
//   GemmSmemSmem:  the same with A in shared memory        (dV += P^T dO from a partner's P^T)
//
// A warp owns kM 16-row m-tiles of A (rows a_row0 + 16 * mt ..); the n extent
// is kN 8-column tiles. In GemmRegsSmem the left operand is an accumulator of
// the first: m16n8k16's float accumulator layout, rounded to 16 bits, is
// exactly its A-fragment layout, so P never leaves registers.
#pragma once

#include "cuda/sm80/mma.cuh"

namespace jax_flash::cuda::sm80 {

template <typename Element, int kM, int kN, int kHeadDim, int kUnroll>
__device__ __forceinline__ void GemmSmemSmemT(float (&acc)[kM][kN][4], uint32_t a_tile,
                                              int a_row0, uint32_t b_tile, int b_row0,
                                              int lane) {
  static_assert(kN % 2 == 0);
  constexpr int kC = kHeadDim / 8;
  const SwizzledRows<kC> a_rows(a_tile, a_row0 + (lane / 8 % 2) * 8 + lane % 8, lane / 16);
  const SwizzledRows<kC> b_rows(b_tile, b_row0 + (lane / 16) * 8 + lane % 8, lane / 8 % 2);
  // k steps by groups of 4 (8 chunks, one swizzle period): inside a group
  // every address is the group's base plus a per-lane constant, so a loop
  // over groups (kUnroll k steps per iteration, a multiple of 4) needs no
  // address arithmetic per k step beyond one add per group (a loop over
  // single k steps recomputed the swizzle at each: ~2 integer instructions
  // per ldmatrix).
  static_assert(kUnroll % 4 == 0 && (kHeadDim / 16) % kUnroll == 0);
#pragma unroll kUnroll / 4
  for (int kg = 0; kg < kHeadDim / 64; ++kg) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c_even = kg * 8 + j * 2;
      uint32_t a[kM][4];
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) LdMatrixX4(a[mt], a_rows.At(mt * 16, c_even));
#pragma unroll
      for (int nt = 0; nt < kN; nt += 2) {
        uint32_t b[4];  // n-tiles nt and nt + 1, k halves 0 and 1
        LdMatrixX4(b, b_rows.At(nt * 8, c_even));
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
          Mma16816<Element>(acc[mt][nt], a[mt], b[0], b[1]);
          Mma16816<Element>(acc[mt][nt + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
}

// kOutCols columns of B from 8-column tile b_col_tile0 on (all by default;
// b_col_tile0 even).
template <typename Element, int kM, int kN, int kHeadDim, int kOutCols = kHeadDim>
__device__ __forceinline__ void GemmRegsSmem(float (&out)[kM][kOutCols / 8][4],
                                             const float (&p)[kM][kN][4], uint32_t b_tile,
                                             int b_row0, int lane, int b_col_tile0 = 0) {
  constexpr int kC = kHeadDim / 8;
  const SwizzledRows<kC> b_rows(b_tile, b_row0 + (lane / 8 % 2) * 8 + lane % 8, lane / 16);
#pragma unroll
  for (int kk = 0; kk < kN / 2; ++kk) {
    uint32_t a[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      a[mt][0] = Pack2<Element>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      a[mt][1] = Pack2<Element>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      a[mt][2] = Pack2<Element>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      a[mt][3] = Pack2<Element>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dt = 0; dt < kOutCols / 8; dt += 2) {
      uint32_t b[4];  // transposed: k rows kk*16.., d-tiles dt and dt + 1
      LdMatrixX4Trans(b, b_rows.At(kk * 16, b_col_tile0 + dt));
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        Mma16816<Element>(out[mt][dt], a[mt], b[0], b[1]);
        Mma16816<Element>(out[mt][dt + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// out[m][d] += sum_k A[m][k] * B[k][d] with both operands in shared memory:
// A rows a_row0 + 16 * mt .. of a tile with kAChunks 16-byte chunks per row
// (swizzled, or as ARows says), from column a_col0 (a multiple of 16) over
// kKSteps * 16 columns; B rows b_row0 + k of a tile with kBChunks chunks per
// row, columns from 8-column tile b_col_tile0 (even) on.
template <typename Element, int kM, int kKSteps, int kAChunks, int kBChunks, int kOutCols,
          typename ARows = SwizzledRows<kAChunks>>
__device__ __forceinline__ void GemmSmemSmem(float (&out)[kM][kOutCols / 8][4], uint32_t a_tile,
                                             int a_row0, int a_col0, uint32_t b_tile, int b_row0,
                                             int b_col_tile0, int lane) {
  const ARows a_rows(a_tile, a_row0 + (lane / 8 % 2) * 8 + lane % 8, lane / 16);
  const SwizzledRows<kBChunks> b_rows(b_tile, b_row0 + (lane / 8 % 2) * 8 + lane % 8, lane / 16);
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    uint32_t a[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) LdMatrixX4(a[mt], a_rows.At(mt * 16, a_col0 / 8 + ks * 2));
#pragma unroll
    for (int dt = 0; dt < kOutCols / 8; dt += 2) {
      uint32_t b[4];  // transposed: k rows ks*16.., d-tiles dt and dt + 1
      LdMatrixX4Trans(b, b_rows.At(ks * 16, b_col_tile0 + dt));
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        Mma16816<Element>(out[mt][dt], a[mt], b[0], b[1]);
        Mma16816<Element>(out[mt][dt + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Writes an accumulator [kM x 16][kN x 8], rounded to 16 bits, into rows
// row0 + 16 * mt .. and columns col0 + 8 * nt .. of a PaddedRows<kRowBytes>
// tile, where GemmSmemSmem reads it back as an A operand. One address per
// thread: every store is it plus a constant.
template <typename Element, int kM, int kN, int kRowBytes>
__device__ __forceinline__ void StoreFragmentPairs(const float (&acc)[kM][kN][4], uint32_t tile,
                                                   int row0, int col0, int lane) {
  const uint32_t base = tile + uint32_t((row0 + lane / 4) * kRowBytes + (col0 + 2 * (lane % 4)) * 2);
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        const uint32_t addr = base + uint32_t((mt * 16 + hh * 8) * kRowBytes + nt * 16);
        const uint32_t pair = Pack2<Element>(acc[mt][nt][2 * hh], acc[mt][nt][2 * hh + 1]);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pair) : "memory");
      }
}

// Writes rows of a [kM x 16][kHeadDim] accumulator, times `mul`, as pairs of
// 16-bit elements: row r = row0 + 16 * mt + g (+8), columns < head_dim.
template <typename Element, int kM, int kHeadDim>
__device__ __forceinline__ void StoreAccumulator(const float (&acc)[kM][kHeadDim / 8][4],
                                                 Element* dst, int64_t row_stride, int64_t row0,
                                                 int64_t num_rows, int head_dim, float mul,
                                                 int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int64_t row = row0 + mt * 16 + g + hh * 8;
      if (row >= num_rows) continue;
#pragma unroll
      for (int dt = 0; dt < kHeadDim / 8; ++dt) {
        const int col = dt * 8 + 2 * t;
        if (col < head_dim)
          *reinterpret_cast<uint32_t*>(dst + row * row_stride + col) =
              Pack2<Element>(acc[mt][dt][2 * hh] * mul, acc[mt][dt][2 * hh + 1] * mul);
      }
    }
}

}  // namespace jax_flash::cuda::sm80
