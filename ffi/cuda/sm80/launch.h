// Host launchers of the mma.sync (sm_80+) kernels; empty string on success.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common/params.h"

namespace jax_flash::cuda::sm80 {

template <typename Element, int kHeadDim>
std::string LaunchForward(const AttentionParams& p, cudaStream_t stream);

// kHeadDim 64 or 128.
template <typename Element, int kHeadDim>
std::string LaunchBackward(const AttentionParams& p, cudaStream_t stream);

}  // namespace jax_flash::cuda::sm80
