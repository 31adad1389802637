// Host launchers of the Hopper (sm_90a: wgmma + TMA + warp specialization)
// kernels; empty string on success, else a message naming the kernel and shape.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common/params.h"

namespace jax_flash::cuda::sm90 {

// kHeadDim 64, 128 or 256; p.shape.head_dim may be smaller (the tiles are
// zero-padded by TMA, which is exact for both products). No attention
// features; scale > 0; q, k, v, out 16-byte aligned with byte strides that
// are multiples of 16. Needs a compute capability 9.0 device.
template <typename Element, int kHeadDim>
std::string LaunchForward(const AttentionParams& p, cudaStream_t stream);

}  // namespace jax_flash::cuda::sm90
