// Host-side launchers of the generic CUDA kernels. Each returns a message on
// failure (empty on success) so the FFI layer can turn it into ffi::Error.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common/params.h"

namespace jax_flash::cuda {

template <typename Element, int kHeadDim>
std::string LaunchGenericForward(const AttentionParams& p, cudaStream_t stream);

template <typename Element, int kHeadDim>
std::string LaunchGenericBackward(const AttentionParams& p, cudaStream_t stream);

// dbias (p.features.dbias or dbias_direct, zeroed by the caller) from the
// recomputed dS.
template <typename Element, int kHeadDim>
std::string LaunchGenericBiasGradient(const AttentionParams& p, cudaStream_t stream);

// dbias[i] = sums[i] rounded to Element, i < n: a 16-bit bias's gradient
// from its float32 sums.
template <typename Element>
std::string LaunchDbiasConvert(const float* sums, void* dbias, int64_t n, cudaStream_t stream);

}  // namespace jax_flash::cuda
