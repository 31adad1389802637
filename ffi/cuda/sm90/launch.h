// Host launchers of the Hopper (sm_90a: wgmma + TMA + warp specialization)
// kernels; empty string on success, else a message naming the kernel and shape.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common/params.h"
#include "cuda/sm90/kernel_traits.cuh"

namespace jax_flash::cuda::sm90 {

// Shared memory (bytes) of the plain forward serving a head dim, for the
// dispatch to check against the device (sm_90's 227 KiB per block: 129 KiB
// at 64 with two consumer warpgroups, 145 KiB with three (kConsumersAt64),
// 193 KiB at 128, 225 KiB at 256).
inline int ForwardSmemBytes(int64_t head_dim) {
  return head_dim <= 64    ? FwdTraits<64>::kSmemBytes
         : head_dim <= 128 ? FwdTraits<128>::kSmemBytes
                           : FwdTraits<256>::kSmemBytes;
}

// kHeadDim 64, 128 or 256; p.shape.head_dim may be smaller (the tiles are
// zero-padded by TMA, which is exact for both products). No attention
// features; scale > 0; q, k, v, out 16-byte aligned with byte strides that
// are multiples of 16. Needs a compute capability 9.0 device.
template <typename Element, int kHeadDim>
std::string LaunchForward(const AttentionParams& p, cudaStream_t stream);

// The same for calls with attention features (launch_features_<dtype>.cu):
// query and key lengths, local windows, position offsets, segment ids
// (with or without their block summaries) and the soft cap, or those and a
// bias (float32 or the inputs' 16-bit type) or a boolean mask (not both),
// contiguous along the keys (neither with the soft cap), or those and
// dropout (kMasksDropout, without the soft cap). Other combinations are
// refused with a message (the sm80 forward serves them). Built for kHeadDim
// 64, 128 and 256 (at 256 without a bias, some variants on 64-key blocks;
// launch.cuh says why).
template <typename Element, int kHeadDim>
std::string LaunchForwardWithFeatures(const AttentionParams& p, cudaStream_t stream);

}  // namespace jax_flash::cuda::sm90
