// Checks of the sm90 backward's own building blocks, run before the whole
// kernel so that a failure of it comes with its likely cause: S^T = K Q^T
// (K-major descriptors with the query tile as B, N = 64), dK = dS^T Q (A
// fragments from the accumulator layout, Q's MN-major descriptor; dV = P^T
// dO is the same product with dO), and dQ = dS K through the dS^T tile in
// shared memory (StoreDsTranspose's swizzle, WgmmaSSMn's two MN-major
// descriptors, the column split at 128 / key split at 64). One block of two
// warpgroups (each its 64 keys, as in the kernel), through the kernel's own
// helpers, on small integers and halves (exact in 16 bits and in float).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "check_helpers.cuh"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/tensor_map.h"

namespace sm90_bwd_check {

using namespace jax_flash::cuda::sm90;

// st_out [128 keys][64 queries], dk_out [128 keys][kHeadDim], dq_out [2
// warpgroups][64 queries][kHeadDim] (each warpgroup's share: its columns at
// 128, its keys' partial sum at 64), all float; ds_in [128 keys][64 queries].
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(256, 1)
    BwdBlocksKernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                    const Element* ds_in, float* st_out, float* dk_out, float* dq_out) {
  using Tr = BwdTraits<kHeadDim>;
  constexpr int kM = Tr::kBlockM;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t smem = (SmemAddress(smem_raw) + 1023u) & ~1023u;
  const uint32_t bar = smem + Tr::kBarrierOffset;
  if (threadIdx.x == 0) {
    MbarrierInit(bar, 1);
    FenceBarrierInit();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    MbarrierArriveExpectTx(bar, Tr::kQTileBytes + Tr::kKvTileBytes);
    LoadTile<Tr>(smem + Tr::kQOffset, Tr::kQChunkBytes, &q_map, bar, 0, 0, 0);
    LoadTile<Tr>(smem + Tr::kKOffset, Tr::kKvChunkBytes, &k_map, bar, 0, 0, 0);
  }
  MbarrierWait(bar, 0);
  const int warpgroup = threadIdx.x / 128, lane = threadIdx.x % 32, warp = threadIdx.x % 128 / 32;
  const int g = lane / 4, t = lane % 4, row0 = 16 * warp + g, key0 = 64 * warpgroup + row0;
  const uint32_t q_tile = smem + Tr::kQOffset, k_rows = smem + Tr::kKOffset + warpgroup * 64 * 128;

  float st[kM / 2];
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk)
    WgmmaSS<Element, kM>(st, KMajorDescriptor<Tr>(k_rows, Tr::kKvChunkBytes, kk),
                         KMajorDescriptor<Tr>(q_tile, Tr::kQChunkBytes, kk), kk > 0 ? 1 : 0);
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegisters(st);
#pragma unroll
  for (int j = 0; j < kM / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) st_out[(key0 + 8 * hh) * kM + 8 * j + 2 * t + e] = st[4 * j + 2 * hh + e];

  // dS^T in the accumulator layout, then as the kernel turns it into A fragments.
  float ds[kM / 2];
#pragma unroll
  for (int j = 0; j < kM / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) ds[4 * j + 2 * hh + e] = gpu_check::ToFloat(ds_in[(key0 + 8 * hh) * kM + 8 * j + 2 * t + e]);
  uint32_t ds_frag[kM / 16][4];
  OnlineSoftmax<kM, kHeadDim>::template ToFragments<Element>(ds, ds_frag);

  float dk[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) dk[i] = 0.0f;
  FenceRegisters(dk);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kM / 16; ++kk)
    WgmmaRS<Element, kHeadDim>(dk, ds_frag[kk], MnMajorDescriptor(q_tile, Tr::kQChunkBytes, kk), 1);
  WgmmaCommit();
  WgmmaWait<0>();
  FenceRegisters(dk);
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) dk_out[(key0 + 8 * hh) * kHeadDim + 8 * j + 2 * t + e] = dk[4 * j + 2 * hh + e];

  StoreDsTranspose<Tr>(smem + Tr::kDsOffset, ds_frag, warpgroup, row0, t);
  FenceProxyAsync();
  __syncthreads();
  float dq[Tr::kDqCols / 2];
  IssueDqProduct<Element, Tr>(dq, DqDsRows<Tr>(smem + Tr::kDsOffset, warpgroup),
                              DqKCols<Tr>(smem + Tr::kKOffset, warpgroup));
  WgmmaWait<0>();
  FenceRegisters(dq);
  const int col0 = Tr::kDqSplitColumns ? Tr::kDqCols * warpgroup : 0;
  float* out = dq_out + warpgroup * kM * kHeadDim;
#pragma unroll
  for (int j = 0; j < Tr::kDqCols / 8; ++j)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int e = 0; e < 2; ++e) out[(row0 + 8 * hh) * kHeadDim + col0 + 8 * j + 2 * t + e] = dq[4 * j + 2 * hh + e];
}

template <typename Element, int kHeadDim>
bool CheckBwdBuildingBlocks(const char* type_name) {
  using Tr = BwdTraits<kHeadDim>;
  constexpr int kM = Tr::kBlockM, kN = Tr::kBlockN, kD = kHeadDim;
  std::vector<Element> hq(kM * kD), hk(kN * kD), hds(kN * kM);
  auto value = [](int i, int j, int salt) { return float(((i * 7 + j * 3 + salt) % 9) - 4) * 0.5f; };
  for (int i = 0; i < kM; ++i)
    for (int d = 0; d < kD; ++d) hq[i * kD + d] = gpu_check::FromFloat<Element>(value(i, d, 1));
  for (int j = 0; j < kN; ++j) {
    for (int d = 0; d < kD; ++d) hk[j * kD + d] = gpu_check::FromFloat<Element>(value(j, d, 2));
    for (int i = 0; i < kM; ++i) hds[j * kM + i] = gpu_check::FromFloat<Element>(value(j, i, 3));
  }
  auto f = [](Element x) { return double(gpu_check::ToFloat(x)); };
  Element *q, *k, *ds;
  float *st_out, *dk_out, *dq_out;
  CHECK_CUDA(cudaMalloc(&q, hq.size() * 2));
  CHECK_CUDA(cudaMalloc(&k, hk.size() * 2));
  CHECK_CUDA(cudaMalloc(&ds, hds.size() * 2));
  CHECK_CUDA(cudaMalloc(&st_out, kN * kM * 4));
  CHECK_CUDA(cudaMalloc(&dk_out, kN * kD * 4));
  CHECK_CUDA(cudaMalloc(&dq_out, 2 * kM * kD * 4));
  CHECK_CUDA(cudaMemset(dq_out, 0, 2 * kM * kD * 4));
  CHECK_CUDA(cudaMemcpy(q, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(k, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(ds, hds.data(), hds.size() * 2, cudaMemcpyHostToDevice));
  constexpr CUtensorMapDataType kType =
      std::is_same_v<Element, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  alignas(64) CUtensorMap q_map, k_map;
  std::string err = EncodeBtnhMap(&q_map, kType, q, 1, kM, 1, kD, jax_flash::ContiguousBtnh(kM, 1, kD), kM, "q");
  if (err.empty()) err = EncodeBtnhMap(&k_map, kType, k, 1, kN, 1, kD, jax_flash::ContiguousBtnh(kN, 1, kD), kN, "k");
  auto kernel = BwdBlocksKernel<Element, kHeadDim>;
  if (err.empty() &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes) != cudaSuccess)
    err = "cudaFuncSetAttribute failed";
  if (err.empty()) {
    kernel<<<1, 256, Tr::kSmemBytes>>>(q_map, k_map, ds, st_out, dk_out, dq_out);
    const cudaError_t e = gpu_check::SynchronizeOrDie("the backward building-block kernel");
    if (e != cudaSuccess) {
      std::printf("backward building blocks %s H=%d: FAIL (%s)\n", type_name, kD, cudaGetErrorString(e));
      std::exit(3);  // the context is gone
    }
  }
  bool ok = err.empty();
  if (!ok) {
    std::printf("backward building blocks %s H=%d: FAIL (%s)\n", type_name, kD, err.c_str());
  } else {
    std::vector<float> st(kN * kM), dk(kN * kD), dq(2 * kM * kD);
    CHECK_CUDA(cudaMemcpy(st.data(), st_out, st.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(dk.data(), dk_out, dk.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(dq.data(), dq_out, dq.size() * 4, cudaMemcpyDeviceToHost));
    auto wrong = [](double got, double want) { return std::fabs(got - want) > 1e-3 * (1 + std::fabs(want)); };
    int bad_st = 0, bad_dk = 0, bad_dq = 0;
    for (int j = 0; j < kN; ++j)
      for (int i = 0; i < kM; ++i) {
        double want = 0;
        for (int d = 0; d < kD; ++d) want += f(hk[j * kD + d]) * f(hq[i * kD + d]);
        if (wrong(st[j * kM + i], want) && bad_st++ == 0)
          std::printf("  S^T first wrong at (key %d, query %d): got %g want %g\n", j, i, st[j * kM + i], want);
      }
    for (int j = 0; j < kN; ++j)
      for (int d = 0; d < kD; ++d) {
        double want = 0;
        for (int i = 0; i < kM; ++i) want += f(hds[j * kM + i]) * f(hq[i * kD + d]);
        if (wrong(dk[j * kD + d], want) && bad_dk++ == 0)
          std::printf("  dK first wrong at (key %d, col %d): got %g want %g\n", j, d, dk[j * kD + d], want);
      }
    for (int i = 0; i < kM; ++i)
      for (int d = 0; d < kD; ++d) {
        double want = 0;
        for (int j = 0; j < kN; ++j) want += f(hds[j * kM + i]) * f(hk[j * kD + d]);
        // The column split leaves each column in one warpgroup's slot (the
        // other's is zero); the key split leaves partial sums in both.
        const double got = double(dq[i * kD + d]) + dq[kM * kD + i * kD + d];
        if (wrong(got, want) && bad_dq++ == 0)
          std::printf("  dQ first wrong at (query %d, col %d): got %g want %g\n", i, d, got, want);
      }
    ok = bad_st == 0 && bad_dk == 0 && bad_dq == 0;
    std::printf("backward building blocks %s H=%d (S^T = K Q^T, dK = dS^T Q MN-major, dQ = dS K via dS^T smem, "
                "both MN-major): %s (wrong: S^T %d, dK %d, dQ %d)\n",
                type_name, kD, ok ? "PASS" : "FAIL", bad_st, bad_dk, bad_dq);
  }
  cudaFree(q), cudaFree(k), cudaFree(ds), cudaFree(st_out), cudaFree(dk_out), cudaFree(dq_out);
  return ok;
}

}  // namespace sm90_bwd_check
