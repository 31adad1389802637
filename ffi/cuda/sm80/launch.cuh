// Launch templates of the sm80 kernels; instantiated per dtype in launch_<dtype>.cu.
#pragma once

#include "cuda/generic/launch.cuh"  // CheckLaunch, PrepareSmem, CheckGrid, CeilDiv
#include "cuda/sm80/fwd_kernel.cuh"
#include "cuda/sm80/launch.h"

namespace jax_flash::cuda::sm80 {

template <typename Element, int kHeadDim>
std::string LaunchForward(const AttentionParams& p, cudaStream_t stream) {
  using Tr = FwdTraits<kHeadDim>;
  if (auto e = CheckGrid(p.shape); !e.empty()) return e;
  auto kernel = ForwardKernel<Element, kHeadDim>;
  if (auto e = PrepareSmem(kernel, Tr::kSmemBytes, "sm80 forward kernel"); !e.empty()) return e;
  const dim3 grid(unsigned(CeilDiv(p.shape.seqlen_q, Tr::kBlockM)), unsigned(p.shape.num_heads),
                  unsigned(p.shape.batch));
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  return CheckLaunch("sm80 forward kernel");
}

#define JAX_FLASH_INSTANTIATE_SM80(Element)                                                  \
  template std::string LaunchForward<Element, 64>(const AttentionParams&, cudaStream_t);  \
  template std::string LaunchForward<Element, 128>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchForward<Element, 256>(const AttentionParams&, cudaStream_t);

}  // namespace jax_flash::cuda::sm80
