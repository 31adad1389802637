// Checks of the sm90 forward's building blocks on their own, run before the
// whole kernel so that a failure of it comes with its likely cause: the TMA
// copies with the 128-byte swizzle, the K-major descriptors of S = Q K^T,
// the accumulator fragment layout, the A-from-registers fragment layout and
// V's MN-major descriptor of O = P V. One block of two warpgroups (each its
// 64 rows of the 128-row Q tile, as in the kernel) computes S = Q K^T and
// O = P V for a given P, through the kernel's own descriptor helpers.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "check_helpers.cuh"
#include "cuda/sm90/kernel_traits.cuh"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/tensor_map.h"
#include "cuda/sm90/wgmma.cuh"

namespace sm90_check {

using namespace jax_flash::cuda::sm90;

using gpu_check::SynchronizeOrDie;

// s_out [128][kBlockN] float, p_in [128][kBlockN] 16-bit, o_out [128][kHeadDim] float.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(256, 1)
    BuildingBlocksKernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                         const __grid_constant__ CUtensorMap v_map, float* s_out, const Element* p_in,
                         float* o_out) {
  using Tr = FwdTraits<kHeadDim, 0, 2>;  // 256 threads: two consumer warpgroups
  constexpr int kBlockN = Tr::kBlockN;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t smem = (SmemAddress(smem_raw) + 1023u) & ~1023u;
  const uint32_t bar = smem + Tr::kBarrierOffset;
  if (threadIdx.x == 0) {
    MbarrierInit(bar, 1);
    FenceBarrierInit();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    MbarrierArriveExpectTx(bar, Tr::kQBytes + 2 * Tr::kKvTileBytes);
    LoadTile<Tr>(smem + Tr::kQOffset, Tr::kQChunkBytes, &q_map, bar, 0, 0, 0);
    LoadTile<Tr>(KTile<Tr>(smem, 0), Tr::kKvChunkBytes, &k_map, bar, 0, 0, 0);
    LoadTile<Tr>(VTile<Tr>(smem, 0), Tr::kKvChunkBytes, &v_map, bar, 0, 0, 0);
  }
  MbarrierWait(bar, 0);
  const int warpgroup = threadIdx.x / 128, lane = threadIdx.x % 32, warp = threadIdx.x % 128 / 32;
  const int g = lane / 4, t = lane % 4, row0 = 64 * warpgroup + 16 * warp + g;
  const uint32_t q_rows = smem + Tr::kQOffset + warpgroup * 64 * 128;

  float s[kBlockN / 2];
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk)
    WgmmaSS<Element, kBlockN>(s, KMajorDescriptor<Tr>(q_rows, Tr::kQChunkBytes, kk),
                              KMajorDescriptor<Tr>(KTile<Tr>(smem, 0), Tr::kKvChunkBytes, kk), kk > 0);
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegisters(s);
  // Documented layout: element 4j + 2hh + e is (row g + 8hh, column 8j + 2t + e).
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) s_out[(row0 + 8 * hh) * kBlockN + 8 * j + 2 * t + e] = s[4 * j + 2 * hh + e];

  // A fragments of P: register r of k16 step kk holds (row g + 8 (r % 2),
  // columns 16 kk + 8 (r / 2) + 2t, + 1).
  uint32_t p[kBlockN / 16][4];
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const Element* src = p_in + (row0 + 8 * (r % 2)) * kBlockN + 16 * kk + 8 * (r / 2) + 2 * t;
      p[kk][r] = PackPair<Element>(float(src[0]), float(src[1]));
    }
  float o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.0f;
  FenceRegisters(o);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk)
    WgmmaRS<Element, kHeadDim>(o, p[kk], VDescriptor<Tr>(VTile<Tr>(smem, 0), kk), 1);
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegisters(o);
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) o_out[(row0 + 8 * hh) * kHeadDim + 8 * j + 2 * t + e] = o[4 * j + 2 * hh + e];
}

template <typename Element>
float HostFloat(Element x) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) return __bfloat162float(x);
  else return __half2float(x);
}
template <typename Element>
Element HostElement(float x) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) return __float2bfloat16(x);
  else return __float2half(x);
}

// Runs the probe with small integers and halves (exact in 16 bits and in the
// float accumulation), so any mismatch is a layout error, and reports where.
template <typename Element, int kHeadDim>
bool CheckBuildingBlocks(const char* type_name) {
  using Tr = FwdTraits<kHeadDim, 0, 2>;  // 256 threads: two consumer warpgroups
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kD = kHeadDim;
  std::vector<Element> hq(kM * kD), hk(kN * kD), hv(kN * kD), hp(kM * kN);
  auto value = [](int i, int j, int salt) { return float(((i * 7 + j * 3 + salt) % 9) - 4) * 0.5f; };
  for (int i = 0; i < kM; ++i)
    for (int d = 0; d < kD; ++d) hq[i * kD + d] = HostElement<Element>(value(i, d, 1));
  for (int j = 0; j < kN; ++j)
    for (int d = 0; d < kD; ++d) {
      hk[j * kD + d] = HostElement<Element>(value(j, d, 2));
      hv[j * kD + d] = HostElement<Element>(value(d, j, 5));
    }
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) hp[i * kN + j] = HostElement<Element>(value(i, j, 3));
  Element *q, *k, *v, *pin;
  float *s_out, *o_out;
  cudaMalloc(&q, hq.size() * 2), cudaMalloc(&k, hk.size() * 2), cudaMalloc(&v, hv.size() * 2);
  cudaMalloc(&pin, hp.size() * 2), cudaMalloc(&s_out, kM * kN * 4), cudaMalloc(&o_out, kM * kD * 4);
  cudaMemcpy(q, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(k, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(v, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(pin, hp.data(), hp.size() * 2, cudaMemcpyHostToDevice);
  constexpr CUtensorMapDataType kType =
      std::is_same_v<Element, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  alignas(64) CUtensorMap q_map, k_map, v_map;
  std::string err = EncodeBtnhMap(&q_map, kType, q, 1, kM, 1, kD, jax_flash::ContiguousBtnh(kM, 1, kD), kM, "q");
  if (err.empty()) err = EncodeBtnhMap(&k_map, kType, k, 1, kN, 1, kD, jax_flash::ContiguousBtnh(kN, 1, kD), kN, "k");
  if (err.empty()) err = EncodeBtnhMap(&v_map, kType, v, 1, kN, 1, kD, jax_flash::ContiguousBtnh(kN, 1, kD), kN, "v");
  auto kernel = BuildingBlocksKernel<Element, kHeadDim>;
  if (err.empty() &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes) != cudaSuccess)
    err = "cudaFuncSetAttribute failed";
  if (err.empty()) {
    kernel<<<1, 256, Tr::kSmemBytes>>>(q_map, k_map, v_map, s_out, pin, o_out);
    const cudaError_t e = SynchronizeOrDie("the building-block kernel");
    if (e != cudaSuccess) err = cudaGetErrorString(e);
  }
  bool ok = err.empty();
  if (!ok) {
    std::printf("building blocks %s H=%d: FAIL (%s)\n", type_name, kD, err.c_str());
    if (err.find("cudaFuncSetAttribute") == std::string::npos) std::exit(3);
  } else {
    std::vector<float> s(kM * kN), o(kM * kD);
    cudaMemcpy(s.data(), s_out, s.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(o.data(), o_out, o.size() * 4, cudaMemcpyDeviceToHost);
    int bad_s = 0, bad_o = 0, first_s = -1, first_o = -1;
    for (int i = 0; i < kM; ++i)
      for (int j = 0; j < kN; ++j) {
        double want = 0;
        for (int d = 0; d < kD; ++d) want += double(HostFloat(hq[i * kD + d])) * HostFloat(hk[j * kD + d]);
        if (std::fabs(s[i * kN + j] - want) > 1e-3 * (1 + std::fabs(want)) && bad_s++ == 0) first_s = i * kN + j;
      }
    for (int i = 0; i < kM; ++i)
      for (int d = 0; d < kD; ++d) {
        double want = 0;
        for (int j = 0; j < kN; ++j) want += double(HostFloat(hp[i * kN + j])) * HostFloat(hv[j * kD + d]);
        if (std::fabs(o[i * kD + d] - want) > 1e-3 * (1 + std::fabs(want)) && bad_o++ == 0) first_o = i * kD + d;
      }
    ok = bad_s == 0 && bad_o == 0;
    std::printf("building blocks %s H=%d (TMA 128B swizzle, S = Q K^T K-major, O = P V MN-major): %s", type_name,
                kD, ok ? "PASS\n" : "FAIL\n");
    if (bad_s)
      std::printf("  S: %d of %d wrong, first (row %d, key %d): got %g\n", bad_s, kM * kN, first_s / kN,
                  first_s % kN, s[first_s]);
    if (bad_o)
      std::printf("  O: %d of %d wrong, first (row %d, col %d): got %g\n", bad_o, kM * kD, first_o / kD,
                  first_o % kD, o[first_o]);
  }
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(pin), cudaFree(s_out), cudaFree(o_out);
  return ok;
}

}  // namespace sm90_check
