// Launch templates of the generic kernels; instantiated once per dtype in
// launch_<dtype>.cu so the (slow) device compilation spreads over a few
// translation units that build in parallel.
#pragma once

#include <cstdint>

#include "common/test_hooks.h"
#include "cuda/generic/bwd_kernels.cuh"
#include "cuda/generic/fwd_kernel.cuh"
#include "cuda/generic/launch.h"

namespace jax_flash::cuda {

// The error of the launch just made (empty: none). Every launcher ends its
// launches here, so a test's injected failure (common/test_hooks.h) takes
// each one's error path.
inline std::string CheckLaunch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return std::string("jax_flash: launching ") + what + " failed: " + cudaGetErrorString(err);
  if (TakeInjectedLaunchFailure())
    return std::string("jax_flash: launching ") + what + " failed: an injected failure (test hook)";
  return {};
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The current GPU's shared memory per block (with opt-in), or false.
inline bool SmemPerBlockLimit(int* limit) {
  int device = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
             cudaSuccess;
}

// Raises the kernel's dynamic shared-memory limit when it needs more than the
// default 48 KB; reports a device that cannot give that much.
template <typename Kernel>
std::string PrepareSmem(Kernel kernel, int bytes, const char* what) {
  int limit = 0;
  if (!SmemPerBlockLimit(&limit)) return CheckLaunch(what);
  if (bytes > limit) {
    return std::string("jax_flash: ") + what + " needs " + std::to_string(bytes) +
           " bytes of shared memory; this GPU allows " + std::to_string(limit);
  }
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) !=
      cudaSuccess) {
    return CheckLaunch(what);
  }
  return {};
}

// Grids put batch on z (limit 65535) and heads on y (limit 65535).
inline std::string CheckGrid(const AttentionShape& s) {
  if (s.batch > 65535 || s.num_heads > 65535)
    return "jax_flash: batch and heads must each be at most 65535 on the GPU";
  return {};
}

template <typename Element, int kHeadDim>
std::string LaunchGenericForward(const AttentionParams& p, cudaStream_t stream) {
  using Tr = GenericTraits<kHeadDim>;
  if (auto e = CheckGrid(p.shape); !e.empty()) return e;
  auto kernel = GenericForwardKernel<Element, kHeadDim>;
  constexpr int smem = Tr::kFwdSmem * sizeof(float);
  if (auto e = PrepareSmem(kernel, smem, "forward kernel"); !e.empty()) return e;
  const dim3 grid(unsigned(CeilDiv(p.shape.seqlen_q, Tr::kRowsPerBlock)),
                  unsigned(p.shape.num_heads), unsigned(p.shape.batch));
  kernel<<<grid, Tr::kThreads, smem, stream>>>(p);
  return CheckLaunch("forward kernel");
}

template <typename Element, int kHeadDim>
std::string LaunchGenericBackward(const AttentionParams& p, cudaStream_t stream) {
  using Tr = GenericTraits<kHeadDim>;
  const auto& s = p.shape;
  if (auto e = CheckGrid(s); !e.empty()) return e;

  const int64_t rows = s.batch * s.num_heads * s.seqlen_q;
  DeltaKernel<Element><<<unsigned(CeilDiv(rows, 8)), 256, 0, stream>>>(p);
  if (auto e = CheckLaunch("delta kernel"); !e.empty()) return e;

  auto dq_kernel = GenericDqKernel<Element, kHeadDim>;
  constexpr int dq_smem = Tr::kDqSmem * sizeof(float);
  if (auto e = PrepareSmem(dq_kernel, dq_smem, "dq kernel"); !e.empty()) return e;
  const dim3 dq_grid(unsigned(CeilDiv(s.seqlen_q, Tr::kRowsPerBlock)), unsigned(s.num_heads),
                     unsigned(s.batch));
  dq_kernel<<<dq_grid, Tr::kThreads, dq_smem, stream>>>(p);
  if (auto e = CheckLaunch("dq kernel"); !e.empty()) return e;

  auto dkv_kernel = GenericDkvKernel<Element, kHeadDim>;
  constexpr int dkv_smem = Tr::kDkvSmem * sizeof(float);
  if (auto e = PrepareSmem(dkv_kernel, dkv_smem, "dk/dv kernel"); !e.empty()) return e;
  const dim3 dkv_grid(unsigned(CeilDiv(s.seqlen_k, Tr::kRowsPerBlock)), unsigned(s.num_heads_k),
                      unsigned(s.batch));
  dkv_kernel<<<dkv_grid, Tr::kThreads, dkv_smem, stream>>>(p);
  return CheckLaunch("dk/dv kernel");
}

template <typename Element, int kHeadDim>
std::string LaunchGenericBiasGradient(const AttentionParams& p, cudaStream_t stream) {
  using Tr = GenericTraits<kHeadDim>;
  const auto& s = p.shape;
  if (auto e = CheckGrid(s); !e.empty()) return e;
  const int64_t rows = s.batch * s.num_heads * s.seqlen_q;
  DeltaKernel<Element><<<unsigned(CeilDiv(rows, 8)), 256, 0, stream>>>(p);
  if (auto e = CheckLaunch("delta kernel"); !e.empty()) return e;
  auto kernel = GenericDqKernel<Element, kHeadDim, /*kBiasGrad=*/true>;
  constexpr int smem = Tr::kDqSmem * sizeof(float);
  if (auto e = PrepareSmem(kernel, smem, "bias gradient kernel"); !e.empty()) return e;
  const dim3 grid(unsigned(CeilDiv(s.seqlen_q, Tr::kRowsPerBlock)), unsigned(s.num_heads),
                  unsigned(s.batch));
  kernel<<<grid, Tr::kThreads, smem, stream>>>(p);
  return CheckLaunch("bias gradient kernel");
}

template <typename Element>
std::string LaunchDbiasConvert(const float* sums, void* dbias, int64_t n, cudaStream_t stream) {
  if (n <= 0) return {};
  if (CeilDiv(n, 256) > int64_t(INT32_MAX)) return "jax_flash: the bias has too many elements for the GPU";
  DbiasConvertKernel<Element><<<unsigned(CeilDiv(n, 256)), 256, 0, stream>>>(sums, static_cast<Element*>(dbias), n);
  return CheckLaunch("dbias convert kernel");
}

#define JAX_FLASH_INSTANTIATE_GENERIC(Element)                                            \
  template std::string LaunchGenericForward<Element, 32>(const AttentionParams&, cudaStream_t);  \
  template std::string LaunchGenericForward<Element, 64>(const AttentionParams&, cudaStream_t);  \
  template std::string LaunchGenericForward<Element, 128>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchGenericForward<Element, 256>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchGenericBackward<Element, 32>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchGenericBackward<Element, 64>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchGenericBackward<Element, 128>(const AttentionParams&, cudaStream_t);\
  template std::string LaunchGenericBackward<Element, 256>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchGenericBiasGradient<Element, 32>(const AttentionParams&, cudaStream_t);  \
  template std::string LaunchGenericBiasGradient<Element, 64>(const AttentionParams&, cudaStream_t);  \
  template std::string LaunchGenericBiasGradient<Element, 128>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchGenericBiasGradient<Element, 256>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchDbiasConvert<Element>(const float*, void*, int64_t, cudaStream_t);

}  // namespace jax_flash::cuda
