// Launch templates of the decode kernels; instantiated per dtype in
// launch_<dtype>.cu (one split-forward kernel and one combine kernel per
// dtype and head dim serve both the contiguous and the paged call).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "cuda/decode/combine_kernel.cuh"
#include "cuda/decode/fwd_kernel.cuh"
#include "cuda/decode/kernel_traits.cuh"
#include "cuda/decode/launch.h"
#include "cuda/generic/launch.cuh"  // CheckLaunch, PrepareSmem

namespace jax_flash::cuda::decode {

static_assert(DecodeTraits<64>::kBlockM == kDecodeBlockRows && DecodeTraits<256>::kBlockM == kDecodeBlockRows &&
              DecodeTraits<64>::kBlockN == kDecodeBlockKeys && DecodeTraits<256>::kBlockN == kDecodeBlockKeys,
              "the host's split and scratch arithmetic assumes one tile shape");

constexpr int kMaxDevices = 64;

inline std::string ShapeText(const AttentionShape& s) {
  return " (sequences " + std::to_string(s.batch) + ", seqlen_q " + std::to_string(s.seqlen_q) + ", keys up to " +
         std::to_string(s.seqlen_k) + ", heads " + std::to_string(s.num_heads) + "/" + std::to_string(s.num_heads_k) +
         ", head_dim " + std::to_string(s.head_dim) + ")";
}

// Both calls end here; args.attn describes the query side (and, for the
// contiguous call, everything else).
template <typename Element, int kHeadDim>
std::string LaunchSplitForward(DecodeArgs args, int splits, float* scratch_out, float* scratch_lse,
                               cudaStream_t stream, int* splits_used, const char* what) {
  using Tr = DecodeTraits<kHeadDim>;
  const AttentionShape& s = args.attn.shape;
  auto fail = [&](const std::string& why) { return std::string("jax_flash: ") + what + ": " + why + ShapeText(s); };
  if (s.head_dim > kHeadDim) return fail("head_dim above the kernel's " + std::to_string(kHeadDim));
  if (s.batch == 0 || s.seqlen_q == 0 || s.num_heads == 0) return {};  // nothing to write
  auto kernel = SplitForwardKernel<Element, kHeadDim>;
  if (auto e = PrepareSmem(kernel, Tr::kSmemBytes, what); !e.empty()) return e + ShapeText(s);
  args.m_blocks = int(DecodeCeilDiv(s.seqlen_q * s.group(), Tr::kBlockM));
  const int64_t per_split = DecodeBlocksPerSplit(s.batch, s.seqlen_q, s.num_heads, s.num_heads_k);
  if (splits <= 0) {
    // SMs x resident blocks of this kernel, per device, asked once (the
    // queries cost microseconds, a decode step tens of them).
    static std::atomic<int> slots_of_device[kMaxDevices] = {};
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return fail("querying the current GPU failed");
    int slots = device < kMaxDevices ? slots_of_device[device].load(std::memory_order_relaxed) : 0;
    if (slots == 0) {
      int sms = 0, per_sm = 0;
      if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Tr::kThreads, Tr::kSmemBytes) != cudaSuccess)
        return fail("querying the GPU's multiprocessors and occupancy failed");
      slots = sms * (per_sm > 0 ? per_sm : 1);
      if (device < kMaxDevices) slots_of_device[device].store(slots, std::memory_order_relaxed);
    }
    const int64_t max_splits = DecodeMaxSplits(s.batch, s.seqlen_q, s.num_heads, s.num_heads_k, s.seqlen_k);
    splits = ChooseSplits(per_split, max_splits, slots);
  }
  if (int64_t(splits) * args.m_blocks > int64_t(INT32_MAX)) return fail("too many splits for the grid");
  if (splits > 1 && (!scratch_out || !scratch_lse)) return fail("more than one split needs the float32 scratch");
  args.splits = splits;
  args.partial_out = scratch_out;
  args.partial_lse = scratch_lse;
  if (splits_used) *splits_used = splits;
  const dim3 grid(unsigned(splits * args.m_blocks), unsigned(s.num_heads_k), unsigned(s.batch));
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(args);
  if (auto e = CheckLaunch(what); !e.empty()) return e + ShapeText(s);
  if (splits == 1) return {};  // the kernel wrote out and lse itself
  const int64_t rows = s.batch * s.num_heads * s.seqlen_q;
  CombineSplitsKernel<Element><<<unsigned(DecodeCeilDiv(rows, kCombineWarps)), kCombineWarps * 32, 0, stream>>>(args);
  if (auto e = CheckLaunch("the decode combine kernel"); !e.empty()) return e + ShapeText(s);
  return {};
}

template <typename Element, int kHeadDim>
std::string LaunchForward(const AttentionParams& p, int splits, float* scratch_out, float* scratch_lse,
                          cudaStream_t stream, int* splits_used) {
  if (auto why = Unsupported(p); !why.empty())
    return "jax_flash: the decode split forward does not take " + why + ShapeText(p.shape);
  DecodeArgs args;
  args.attn = p;
  return LaunchSplitForward<Element, kHeadDim>(args, splits, scratch_out, scratch_lse, stream, splits_used,
                                               "the decode split forward");
}

template <typename Element, int kHeadDim>
std::string LaunchPagedForward(const PagedParams& p, int splits, float* scratch_out, float* scratch_lse,
                               cudaStream_t stream, int* splits_used) {
  const PagedShape& ps = p.shape;
  DecodeArgs args;
  // The query side: contiguous [sequences, Tq, N, H] with lse [sequences, N, Tq].
  AttentionParams& a = args.attn;
  a.shape = {ps.outer * ps.batch, ps.seqlen_q, ps.max_seqlen(), ps.num_heads, ps.num_heads_k, ps.head_dim};
  a.q_stride = ContiguousBtnh(ps.seqlen_q, ps.num_heads, ps.head_dim);
  a.q = p.q, a.out = p.out, a.lse = p.lse;
  a.scale = p.scale;
  a.features.softcap = p.softcap;  // the mask is PagedDecodeMask's
  if (auto why = UnsupportedPaged(p); !why.empty())
    return "jax_flash: the decode paged forward does not take " + why + ShapeText(a.shape);
  args.paged = p;
  args.is_paged = true;
  return LaunchSplitForward<Element, kHeadDim>(args, splits, scratch_out, scratch_lse, stream, splits_used,
                                               "the decode paged forward");
}

#define JAX_FLASH_INSTANTIATE_DECODE(Element, kHeadDim)                                                   \
  template std::string LaunchForward<Element, kHeadDim>(const AttentionParams&, int, float*, float*,     \
                                                        cudaStream_t, int*);                             \
  template std::string LaunchPagedForward<Element, kHeadDim>(const PagedParams&, int, float*, float*,    \
                                                             cudaStream_t, int*);

}  // namespace jax_flash::cuda::decode
