// Dense block kernels of the CPU path, written so that GCC/Clang vectorize
// them (compiled with -O3 and, by default, -march=native): register tiles of
// kRowTile x kColTile accumulators with the column loop innermost and
// contiguous. All blocks are padded so column counts are multiples of
// kColTile; only the row count may be ragged.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace jax_flash::cpu {

constexpr int kColTile = 16;  // one AVX-512 float vector, two AVX2 vectors
constexpr int kRowTile = 4;

// kColTile elements as one GCC/Clang vector: the compiler maps it onto
// whatever SIMD width the target has (one zmm, two ymm, four xmm). Plain
// arrays here were left scalar by GCC 12's SLP vectorizer.
// (An alias template with a dependent vector_size is silently dropped by GCC,
// hence one explicit typedef per element type.)
template <typename T> struct ColVecOf;
template <> struct ColVecOf<float> {
  typedef float type __attribute__((vector_size(sizeof(float) * kColTile)));
};
template <> struct ColVecOf<double> {
  typedef double type __attribute__((vector_size(sizeof(double) * kColTile)));
};
template <typename T>
using ColVec = typename ColVecOf<T>::type;
static_assert(sizeof(ColVec<float>) == sizeof(float) * kColTile);
static_assert(sizeof(ColVec<double>) == sizeof(double) * kColTile);

template <typename T>
inline ColVec<T> LoadVec(const T* p) {
  ColVec<T> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename T>
inline void StoreVec(T* p, ColVec<T> v) { std::memcpy(p, &v, sizeof(v)); }

// C[r][c] += sum_k A[r][k] * B[k][c] for a kRows x kColTile tile.
template <typename T, int kRows>
inline void GemmTile(int depth, const T* __restrict a, int lda,
                     const T* __restrict b, int ldb, T* __restrict c, int ldc) {
  ColVec<T> acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = LoadVec(c + r * ldc);
  for (int k = 0; k < depth; ++k) {
    const ColVec<T> brow = LoadVec(b + int64_t(k) * ldb);
    for (int r = 0; r < kRows; ++r) acc[r] += a[r * lda + k] * brow;
  }
  for (int r = 0; r < kRows; ++r) StoreVec(c + r * ldc, acc[r]);
}

// C[rows][cols] += A[rows][depth] * B[depth][cols]; cols % kColTile == 0.
template <typename T>
void GemmAcc(int rows, int cols, int depth, const T* a, int lda, const T* b,
             int ldb, T* c, int ldc) {
  int r = 0;
  for (; r + kRowTile <= rows; r += kRowTile)
    for (int j = 0; j < cols; j += kColTile)
      GemmTile<T, kRowTile>(depth, a + int64_t(r) * lda, lda, b + j, ldb,
                            c + int64_t(r) * ldc + j, ldc);
  for (; r < rows; ++r)
    for (int j = 0; j < cols; j += kColTile)
      GemmTile<T, 1>(depth, a + int64_t(r) * lda, lda, b + j, ldb,
                     c + int64_t(r) * ldc + j, ldc);
}

// dst[cols][rows] = src[rows][cols] (rows, cols <= block size).
template <typename T>
void Transpose(int rows, int cols, const T* src, int lds, T* dst, int ldd) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

// 2^x for float, vectorizable: 2^n (n = x rounded to an integer) by exponent
// bits times a degree-6 polynomial for 2^f, f = x - n in [-0.5, 0.5] (Cephes
// exp2f coefficients, relative error about 2e-7). Inputs below -126 (masked
// logits are -inf) give exactly 0. n comes from adding and subtracting
// 1.5 * 2^23 (round to nearest, exact for |x| < 2^22): GCC 12 does not
// vectorize std::floor here, and one call of it keeps a whole loop scalar.
inline float Exp2(float x) {
  const float xc = x < -126.0f ? -126.0f : (x > 127.0f ? 127.0f : x);
  const float n = (xc + 12582912.0f) - 12582912.0f;
  const float f = xc - n;
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x < -126.0f ? 0.0f : p * scale;
}
inline double Exp2(double x) { return std::exp2(x); }

// tanh for float, vectorizable (no libm call), within 1.8e-7 relative of the
// exact value (checked on every float). Below |x| = 0.625 an odd polynomial
// (Cephes tanhf), which keeps the relative accuracy near 0 that
// 1 - 2 / (e^2|x| + 1) loses to cancellation; above it that formula on Exp2,
// saturating to +-1 (Exp2 clamps at 2^127, so no inf / inf). Both are
// computed and one selected, so loops over it stay branch-free.
inline float Tanh(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = x + x * z * p;
  const float large = 1.0f - 2.0f / (Exp2(a * 2.8853900817779268f) + 1.0f);  // 2 log2(e) |x|
  return a < 0.625f ? small : std::copysign(large, x);
}
// float64 stays libm-exact: it is the reference-grade path.
inline double Tanh(double x) { return std::tanh(x); }

template <typename T>
constexpr T NegInf() { return -std::numeric_limits<T>::infinity(); }

}  // namespace jax_flash::cpu
