// Host launchers of the mma.sync (sm_80+) kernels; empty string on success.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common/params.h"
#include "cuda/sm80/kernel_traits.cuh"

namespace jax_flash::cuda::sm80 {

// Shared memory (bytes) of the kernels serving a head dim, for the dispatch
// to check against the device (sm_86/sm_89 allow 99 KB a block, sm_80 163 KB,
// sm_90 227 KB). The forward's: the smaller of the plain kernel and the
// feature variant, which serves plain calls where the plain one does not
// fit (LaunchForward).
template <int kHeadDim>
constexpr int ForwardSmemBytes() {
  constexpr int plain = FwdTraits<kHeadDim, false>::kSmemBytes;
  constexpr int features = FwdTraits<kHeadDim, true>::kSmemBytes;
  return plain < features ? plain : features;
}
inline int ForwardSmemBytes(int64_t head_dim) {
  return head_dim <= 64    ? ForwardSmemBytes<64>()
         : head_dim <= 128 ? ForwardSmemBytes<128>()
                           : ForwardSmemBytes<256>();
}
// The fused backward's extra dS^T tile runs where the sm_90a code does.
inline bool FusedBackwardOnSm90(bool deterministic, int compute_capability_major) {
  return !deterministic && compute_capability_major >= 9;
}
template <int kHeadDim>
constexpr int BackwardSmemBytes(bool deterministic, bool sm90) {
  using Tr = BwdTraits<kHeadDim>;
  if (!deterministic) return sm90 ? Tr::kFusedSm90SmemBytes : Tr::kDkvSmemBytes;
  return Tr::kDqSmemBytes > Tr::kDkvSmemBytes ? Tr::kDqSmemBytes : Tr::kDkvSmemBytes;
}
inline int BackwardSmemBytes(int64_t head_dim, bool deterministic, int compute_capability_major) {
  const bool sm90 = FusedBackwardOnSm90(deterministic, compute_capability_major);
  return head_dim <= 64    ? BackwardSmemBytes<64>(deterministic, sm90)
         : head_dim <= 128 ? BackwardSmemBytes<128>(deterministic, sm90)
                           : BackwardSmemBytes<256>(deterministic, sm90);
}

template <typename Element, int kHeadDim>
std::string LaunchForward(const AttentionParams& p, cudaStream_t stream);

// kHeadDim 64, 128 or 256 (256: fused only). Unless p.deterministic, p.dq_accum must hold
// batch * heads * seqlen_q * head_dim floats of scratch.
template <typename Element, int kHeadDim>
std::string LaunchBackward(const AttentionParams& p, cudaStream_t stream);

// dbias from the fused backward's feature kernel in its dbias-only mode
// (p.dk null; p.features.dbias or dbias_direct zeroed by the caller).
template <typename Element, int kHeadDim>
std::string LaunchBiasGradient(const AttentionParams& p, cudaStream_t stream);

}  // namespace jax_flash::cuda::sm80
