// Launch templates of the sm80 kernels; instantiated per dtype in launch_<dtype>.cu.
#pragma once

#include <cstdint>

#include "cuda/generic/launch.cuh"  // CheckLaunch, PrepareSmem, CheckGrid, CeilDiv
#include "cuda/sm80/bwd_kernels.cuh"
#include "cuda/sm80/fwd_kernel.cuh"
#include "cuda/sm80/launch.h"

namespace jax_flash::cuda::sm80 {

// The launch order of a kernel's blocks (block_order.cuh): the phased order
// when causal, from how many blocks of `kernel` run at once on this GPU; the
// plain grid otherwise. `bytes_per_head`: what a head's blocks stream and
// share (K/V in the forward).
template <typename Kernel>
std::string OrderBlocks(const AttentionParams& p, Kernel kernel, int threads, int smem,
                        int64_t positions, int64_t heads, int64_t bytes_per_head,
                        BlockOrder* order, dim3* grid) {
  *order = BlockOrder{positions, 0};
  *grid = dim3(unsigned(positions), unsigned(heads), unsigned(p.shape.batch));
  if (!p.is_causal) return {};
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess)
    return "jax_flash: querying the GPU's block occupancy failed";
  *order = CausalBlockOrder(positions, heads, p.shape.batch, bytes_per_head,
                            int64_t(sms) * (per_sm > 0 ? per_sm : 1));
  if (order->chunk) *grid = dim3(unsigned(positions * heads * p.shape.batch));
  return {};
}

template <typename Element, int kHeadDim, bool kFeatures, bool kTransforms = kFeatures,
          bool kDropout = kTransforms, bool kSoftcap = kTransforms || kDropout>
std::string LaunchForwardVariant(const AttentionParams& p, cudaStream_t stream) {
  using Tr = FwdTraits<kHeadDim, kFeatures, kTransforms, kDropout, kSoftcap>;
  if (auto e = CheckGrid(p.shape); !e.empty()) return e;
  auto kernel = ForwardKernel<Element, kHeadDim, kFeatures, kTransforms, kDropout, kSoftcap>;
  if (auto e = PrepareSmem(kernel, Tr::kSmemBytes, "sm80 forward kernel"); !e.empty()) return e;
  BlockOrder order;
  dim3 grid;
  if (auto e = OrderBlocks(p, kernel, Tr::kThreads, Tr::kSmemBytes, CeilDiv(p.shape.seqlen_q, Tr::kBlockM),
                           p.shape.num_heads, p.shape.seqlen_k * p.shape.head_dim * 4, &order, &grid);
      !e.empty())
    return e;
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p, order);
  return CheckLaunch("sm80 forward kernel");
}

// The feature variant also serves plain calls on GPUs whose shared memory
// per block the plain kernel exceeds (ForwardSmemBytes: at 256 the pairs'
// 105.5 KiB against sm_86 / sm_89's 99 KiB).
template <typename Element, int kHeadDim>
std::string LaunchForward(const AttentionParams& p, cudaStream_t stream) {
  bool features = p.features.Any();
  if (!features && FwdTraits<kHeadDim, false>::kSmemBytes > FwdTraits<kHeadDim, true>::kSmemBytes) {
    int limit = 0;
    if (!SmemPerBlockLimit(&limit)) return "jax_flash: querying the GPU's shared memory failed";
    features = limit < FwdTraits<kHeadDim, false>::kSmemBytes;
  }
  if (!features) return LaunchForwardVariant<Element, kHeadDim, false>(p, stream);
  // At 128, calls without a bias run a two-m-tile variant (FwdTraits): masks
  // alone, masks and the soft cap, or those and dropout (whose Philox calls
  // spill 376 B there, yet it ran 1.6x the one-m-tile variant's speed;
  // docs/perf_history.md, v17). Their shared memory is the plain kernel's, which
  // fits wherever the 128 kernels run at all.
  if constexpr (kHeadDim == 128) {
    static_assert(FwdTraits<kHeadDim, true, false>::kSmemBytes <= FwdTraits<kHeadDim, false>::kSmemBytes);
    const bool dropout = p.features.dropout_rate > 0.0 && p.features.dropout_seed;
    if (!p.features.bias) {
      if (dropout) return LaunchForwardVariant<Element, kHeadDim, true, false, true>(p, stream);
      if (p.features.softcap > 0.0) return LaunchForwardVariant<Element, kHeadDim, true, false, false, true>(p, stream);
      return LaunchForwardVariant<Element, kHeadDim, true, false>(p, stream);
    }
  }
  return LaunchForwardVariant<Element, kHeadDim, true>(p, stream);
}

template <typename Element, int kHeadDim>
std::string LaunchBackward(const AttentionParams& p, cudaStream_t stream) {
  using Tr = BwdTraits<kHeadDim>;
  const auto& s = p.shape;
  if (auto e = CheckGrid(s); !e.empty()) return e;
  if (s.seqlen_q * s.head_dim / 8 > int64_t(INT32_MAX) - 256)  // DqConvertKernel's 32-bit index
    return "jax_flash: seqlen_q * head_dim must be below 2^34 for the sm80 backward";
  if (s.seqlen_q > int64_t(INT32_MAX) - 2 * Tr::kBlockCols)  // DkvKernel's 32-bit step positions
    return "jax_flash: seqlen_q must be below 2^31 - 256 for the sm80 backward";
  const int64_t rows = s.batch * s.num_heads * s.seqlen_q;
  const bool fused = !p.deterministic;
  if (fused && p.dq_accum == nullptr) return "jax_flash: the fused backward needs a float32 dQ accumulator";
  // delta, and (fused) the dQ accumulator cleared in the same pass.
  DeltaAndClearKernel<Element, kHeadDim>
      <<<unsigned(CeilDiv(rows, DeltaLayout<kHeadDim>::kRowsPerBlock)), 256, 0, stream>>>(p, fused);
  if (auto e = CheckLaunch("delta kernel"); !e.empty()) return e;

  // Causal key blocks differ in work (key block 0 is seen by every query):
  // the causal grid puts key blocks after heads, so within each batch every
  // head's heaviest block launches first and the batch's final wave holds
  // only light ones (DkvKernel).
  const int64_t key_blocks = CeilDiv(s.seqlen_k, Tr::kBlockRows);
  const bool causal_order = p.is_causal && !p.features.Any() && key_blocks <= 65535;
  const dim3 dkv_grid = causal_order
                            ? dim3(unsigned(s.num_heads_k), unsigned(key_blocks), unsigned(s.batch))
                            : dim3(unsigned(key_blocks), unsigned(s.num_heads_k), unsigned(s.batch));
  if (!fused) {
    if (p.features.Any() || kHeadDim > 128)
      return "jax_flash: no deterministic sm80 backward for these inputs (the dispatch runs generic)";
    if constexpr (kHeadDim <= 128) {
      auto dq_kernel = DqKernel<Element, kHeadDim>;
      if (auto e = PrepareSmem(dq_kernel, Tr::kDqSmemBytes, "sm80 dq kernel"); !e.empty()) return e;
      const dim3 dq_grid(unsigned(CeilDiv(s.seqlen_q, Tr::kDqRows)), unsigned(s.num_heads),
                         unsigned(s.batch));
      dq_kernel<<<dq_grid, Tr::kThreads, Tr::kDqSmemBytes, stream>>>(p);
      if (auto e = CheckLaunch("sm80 dq kernel"); !e.empty()) return e;
      auto dkv_kernel = DkvKernel<Element, kHeadDim, false>;
      if (auto e = PrepareSmem(dkv_kernel, Tr::kDkvSmemBytes, "sm80 dk/dv kernel"); !e.empty())
        return e;
      dkv_kernel<<<dkv_grid, Tr::kThreads, Tr::kDkvSmemBytes, stream>>>(p, causal_order);
      return CheckLaunch("sm80 dk/dv kernel");
    }
  }
  auto fused_kernel = p.features.Any() ? DkvKernel<Element, kHeadDim, true, true>
                                        : DkvKernel<Element, kHeadDim, true, false>;
  int device = 0, cc_major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
    return "jax_flash: querying the device's compute capability failed";
  const int smem = BackwardSmemBytes<kHeadDim>(false, FusedBackwardOnSm90(false, cc_major));
  if (auto e = PrepareSmem(fused_kernel, smem, "sm80 fused backward kernel"); !e.empty()) return e;
  fused_kernel<<<dkv_grid, Tr::kThreads, smem, stream>>>(p, causal_order);
  if (auto e = CheckLaunch("sm80 fused backward kernel"); !e.empty()) return e;
  const dim3 convert_grid(unsigned(CeilDiv(s.seqlen_q * s.head_dim / 8, 256)), unsigned(s.num_heads),
                          unsigned(s.batch));
  DqConvertKernel<Element><<<convert_grid, 256, 0, stream>>>(p);
  return CheckLaunch("dq convert kernel");
}

// The bias gradient on the tensor cores: the fused backward's feature
// variant in its dbias-only mode (p.dk null: S, P, dP and dS per tile, dS
// into p.features.dbias or dbias_direct, no dV / dK / dQ). No new kernel
// instantiation: the kernel is the one LaunchBackward runs for feature calls.
// Two of the backward's five GEMMs. The caller zeroes the target first and
// rounds float32 sums into a 16-bit dbias after.
template <typename Element, int kHeadDim>
std::string LaunchBiasGradient(const AttentionParams& p, cudaStream_t stream) {
  using Tr = BwdTraits<kHeadDim>;
  const auto& s = p.shape;
  if (auto e = CheckGrid(s); !e.empty()) return e;
  if (s.seqlen_q > int64_t(INT32_MAX) - 2 * Tr::kBlockCols)  // DkvKernel's 32-bit step positions
    return "jax_flash: seqlen_q must be below 2^31 - 256 for the sm80 bias gradient";
  if (!p.features.bias || p.dk != nullptr || !LogitFeatures::WritesDbias(p))
    return "jax_flash: the sm80 bias gradient needs a bias, a dbias target and no dk";
  const int64_t rows = s.batch * s.num_heads * s.seqlen_q;
  DeltaAndClearKernel<Element, kHeadDim>
      <<<unsigned(CeilDiv(rows, DeltaLayout<kHeadDim>::kRowsPerBlock)), 256, 0, stream>>>(p, false);
  if (auto e = CheckLaunch("delta kernel"); !e.empty()) return e;
  auto kernel = DkvKernel<Element, kHeadDim, true, true>;
  int device = 0, cc_major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
    return "jax_flash: querying the device's compute capability failed";
  const int smem = BackwardSmemBytes<kHeadDim>(false, FusedBackwardOnSm90(false, cc_major));
  if (auto e = PrepareSmem(kernel, smem, "sm80 bias gradient kernel"); !e.empty()) return e;
  const dim3 grid(unsigned(CeilDiv(s.seqlen_k, Tr::kBlockRows)), unsigned(s.num_heads_k), unsigned(s.batch));
  kernel<<<grid, Tr::kThreads, smem, stream>>>(p, false);
  return CheckLaunch("sm80 bias gradient kernel");
}

#define JAX_FLASH_INSTANTIATE_SM80(Element)                                                  \
  template std::string LaunchForward<Element, 64>(const AttentionParams&, cudaStream_t);  \
  template std::string LaunchForward<Element, 128>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchForward<Element, 256>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchBackward<Element, 64>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchBackward<Element, 128>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchBackward<Element, 256>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchBiasGradient<Element, 64>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchBiasGradient<Element, 128>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchBiasGradient<Element, 256>(const AttentionParams&, cudaStream_t);

}  // namespace jax_flash::cuda::sm80
