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

// dbias (p.features.dbias, dbias_bytes of float32) from the recomputed dS.
template <typename Element, int kHeadDim>
std::string LaunchGenericBiasGradient(const AttentionParams& p, size_t dbias_bytes,
                                      cudaStream_t stream);

}  // namespace jax_flash::cuda
