// Host launchers of the Hopper backward (bwd_kernel.cuh); empty string on
// success, else a message naming the kernel and shape.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "common/params.h"
#include "cuda/sm90/bwd_kernel_traits.cuh"

namespace jax_flash::cuda::sm90 {

// Whether every variant of the sm90 backward (plain, features, bias,
// deterministic) has an instantiation for this head dim: up to 128 (64
// and 128 padded).
inline bool BackwardCoversHeadDim(int64_t head_dim) { return head_dim >= 1 && head_dim <= 128; }
// Whether its plain kernels (LaunchBackward) have: up to 256 (above 128
// Backward256Kernel, bwd256_kernel.cuh, which also takes the masks'
// features, LaunchBackwardWithFeatures<256>; every other call at 256 runs
// sm80's).
inline bool PlainBackwardCoversHeadDim(int64_t head_dim) { return head_dim >= 1 && head_dim <= 256; }

// Shared memory (bytes) of the backward serving a head dim, for the
// dispatch to check against the device: up to 128 the largest of the plain
// kernel's, the feature variants' (both 128-query steps at 64, 64-query
// steps at 128) and the dropout variants' (64-query steps, with their
// keep-bit exchange: KeepExchange), above it the 256 kernel's.
inline int BackwardSmemBytes(int64_t head_dim) {
  constexpr int k64 = std::max({BwdTraitsFor<64, DefaultBwdSchedule(64)>::kSmemBytes,
                                BwdTraitsFor<64, FeatureBwdSchedule(64)>::kSmemBytes,
                                KeepExchange<BwdTraitsFor<64, DropoutBwdSchedule(64)>>::kSmemBytes,
                                KeepExchange<BwdTraitsFor<64, PlainTransformBwdSchedule(64, true)>>::kSmemBytes});
  constexpr int k128 = std::max({BwdTraitsFor<128, DefaultBwdSchedule(128)>::kSmemBytes,
                                 BwdTraitsFor<128, FeatureBwdSchedule(128)>::kSmemBytes,
                                 KeepExchange<BwdTraitsFor<128, DropoutBwdSchedule(128)>>::kSmemBytes,
                                 KeepExchange<BwdTraitsFor<128, PlainTransformBwdSchedule(128, true)>>::kSmemBytes});
  return head_dim <= 64 ? k64 : head_dim <= 128 ? k128 : Bwd256Traits::kSmemBytes;
}

// kHeadDim 64 or 128; p.shape.head_dim a multiple of 8 up to kHeadDim. No
// attention features, not deterministic (dQ is summed by float atomics in
// the copy engine), scale > 0, p.dq_accum holding batch * heads * seqlen_q *
// head_dim floats of scratch; q, k, v, out, dout, dq, dk, dv 16-byte
// aligned with byte strides that are multiples of 16. Runs sm80's delta
// pass (which also zeroes dq_accum), the sm90 kernel, then sm80's dQ
// conversion. Needs a compute capability 9.0 device.
template <typename Element, int kHeadDim>
std::string LaunchBackward(const AttentionParams& p, cudaStream_t stream);

// The same for calls with attention features (bwd_launch_features_<dtype>.cu):
// query and key lengths, local windows, position offsets, segment ids (with
// or without their block summaries) and the soft cap, with the semantics of
// the sm90 forward's feature variants and of sm80's backward (the soft cap's
// gradient through the same tanh), or those and dropout (kMasksDropout:
// the same Philox bits as every family, dropout.cuh). A bias (the bias
// variants), a boolean mask or dropout with the soft cap is refused with a
// message (sm80's backward serves those). kHeadDim 64, 128, and 256
// (bwd_launch_256_<dtype>.cu: the masks' features alone, Backward256Kernel's
// kMasks; the soft cap and dropout refused there too).
template <typename Element, int kHeadDim>
std::string LaunchBackwardWithFeatures(const AttentionParams& p, cudaStream_t stream);

// Query rows per deterministic counter (DeterministicCounterCount,
// bwd_launch.cuh: the default schedule's kBlockM, 128 at head dim 64, 64 at
// 128), checked against it where the launch is instantiated.
constexpr int DeterministicCounterBlock(int head_dim) {
  return head_dim <= 64 ? BwdTraitsFor<64, DefaultBwdSchedule(64)>::kBlockM
                        : BwdTraitsFor<128, DefaultBwdSchedule(128)>::kBlockM;
}

// DeterministicCounterCount at the instantiation serving head_dim (<= 128):
// the int32 counters LaunchBackwardDeterministicDefault needs beside the dQ
// accumulator. (jax_flash/_kernel_call.py sizes them as ceil(seqlen_q / 64)
// per (batch, head), every schedule's smallest kBlockM.)
inline int64_t DeterministicCounters(const AttentionShape& s) {
  const int64_t block = DeterministicCounterBlock(int(s.head_dim));
  return s.batch * s.num_heads * ((s.seqlen_q + block - 1) / block);
}

// The deterministic backward of plain calls (bwd_launch_deterministic_<dtype>.cu,
// dispatched for deterministic=True since session 21):
// LaunchBackwardDeterministic (bwd_launch.cuh) at DqHandoff::kAtSend and
// its default section: dQ's float32 adds into each query block
// in ascending key block order, so dq, dk and dv are the same bit for bit
// run to run. LaunchBackward's contract (the dQ accumulator in p.dq_accum,
// no attention features) plus `counters`: DeterministicCounters(p.shape)
// int32 of device scratch, 4-byte aligned, zeroed by the launch.
// kHeadDim 64, 128.
template <typename Element, int kHeadDim>
std::string LaunchBackwardDeterministicDefault(const AttentionParams& p, int* counters, cudaStream_t stream);

// Whether the bias variants (kMasksBias16 for a bias of the inputs' 16-bit
// dtype, kMasksBias for a float32 one) take this call's bias: contiguous
// along the keys, rows whose offsets fit BiasColumns' 32 bits, with the
// masks' features but no boolean mask, dropout or soft cap
// (bwd_launch_bias_bf16.cu).
bool BackwardTakesBias(const AttentionParams& p);

// The same calls as LaunchBackwardWithFeatures with a bias (BackwardTakesBias)
// on the dQ-first feature schedules (bwd_launch_bias_<dtype>.cu: their own
// files, so that CI's two cores compile them beside the others). dbias is
// not theirs (the jax_flash_dbias call). kHeadDim 64, 128.
template <typename Element, int kHeadDim>
std::string LaunchBackwardWithBias(const AttentionParams& p, cudaStream_t stream);

// The bias gradient alone (the jax_flash_dbias call; BackwardTakesBias's
// calls, p.dk null): BiasGradientKernel at FeatureBwdSchedule, into
// p.features.dbias_direct (typed stores, a full-shape bias) or
// p.features.dbias (float32 adds, zeroed by the caller). kHeadDim 64, 128.
template <typename Element, int kHeadDim>
std::string LaunchBiasGradient(const AttentionParams& p, cudaStream_t stream);

}  // namespace jax_flash::cuda::sm90
