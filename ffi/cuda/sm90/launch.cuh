// Launch template of the sm90 forward; instantiated per dtype in launch_<dtype>.cu.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/generic/launch.cuh"  // CheckLaunch, PrepareSmem, CeilDiv
#include "cuda/sm90/fwd_kernel.cuh"
#include "cuda/sm90/launch.h"
#include "cuda/sm90/tensor_map.h"

namespace jax_flash::cuda::sm90 {

// "sm90 forward kernel (B=.., Tq=.., Tk=.., N=.., K=.., H=.. in kHeadDim ..)" for errors.
inline std::string DescribeForward(const AttentionShape& s, int head_dim_padded) {
  return "sm90 forward kernel (B=" + std::to_string(s.batch) + ", Tq=" + std::to_string(s.seqlen_q) +
         ", Tk=" + std::to_string(s.seqlen_k) + ", N=" + std::to_string(s.num_heads) +
         ", K=" + std::to_string(s.num_heads_k) + ", H=" + std::to_string(s.head_dim) + " in " +
         std::to_string(head_dim_padded) + ")";
}

// The consumer warpgroups of a variant: kConsumers if given, else the head
// dim's default (kernel_traits.cuh's DefaultConsumers) for the plain kernel
// and 2 for the feature variants: their tile of 192 rows would need
// SummarySpan over three segment-summary entries (feature_mask.cuh takes
// at most two) and their masks' registers next to S, P and O in 160.
template <int kHeadDim, Features kFeatures, int kConsumers>
constexpr int VariantConsumers() {
  return kConsumers > 0 ? kConsumers : kFeatures == Features::kNone ? DefaultConsumers(kHeadDim) : 2;
}

// max_blocks > 0 caps the persistent grid (tests: several tiles per block);
// kBlockN 0 is the head dim's default key block (kernel_traits.cuh);
// section_pairs > 0 overrides CausalSection's size under kSections (tests:
// many sections, a partial last one); kConsumers 0: VariantConsumers'
// default (the check program instantiates 2 and 3 at 64 for its A/B).
template <typename Element, int kHeadDim, Schedule kSchedule, int kBlockN = 0, Features kFeatures = Features::kNone,
          int kConsumers = 0>
std::string LaunchForwardScheduled(const AttentionParams& p, cudaStream_t stream, int max_blocks = 0,
                                   CausalOrder order = CausalOrder::kDefault, int section_pairs = 0) {
  constexpr int kC = VariantConsumers<kHeadDim, kFeatures, kConsumers>();
  using Tr = FwdTraits<kHeadDim, kBlockN, kC>;
  static_assert(std::is_same_v<Element, __nv_bfloat16> || std::is_same_v<Element, __half>);
  static_assert(kFeatures == Features::kNone || Tr::kBlockN <= 128, "VisibleBits: 32 bits per fragment row");
  static_assert(kFeatures != Features::kMasksBoolean || Tr::kBlockN == 128 || Tr::kBlockN == 64,
                "MaskArrayRows: 4 or 2 key bytes per lane");
  static_assert(kFeatures != Features::kMasksBiasTiles || kHeadDim <= 128,
                "BiasTiles: no room for them beside 256's K/V ring");
  static_assert(kFeatures == Features::kNone || kC == 2, "feature variants: two consumers (VariantConsumers)");
  const auto& s = p.shape;
  const std::string what = DescribeForward(s, kHeadDim) +
                           (kFeatures == Features::kNone          ? ""
                            : kFeatures == Features::kMasks       ? " with masks"
                            : kFeatures == Features::kMasksBias   ? " with masks and bias"
                            : kFeatures == Features::kMasksBias16 ? " with masks and 16-bit bias"
                            : kFeatures == Features::kMasksBiasTiles ? " with masks and 16-bit bias tiles"
                            : kFeatures == Features::kMasksBoolean ? " with masks and boolean mask"
                            : kFeatures == Features::kMasksDropout ? " with masks and dropout"
                            : kFeatures == Features::kSoftcap      ? " with masks and soft cap, no boolean mask"
                            : kFeatures == Features::kPlainSoftcap ? " with soft cap, causal or none"
                            : kFeatures == Features::kPlainDropout ? " with dropout, causal or none"
                                                                  : " with masks and soft cap") +
                           (kC == 2 ? "" : ", three consumer warpgroups");
  auto fail = [&](const std::string& why) { return "jax_flash: " + what + ": " + why; };
  // kMasksSoftcap reads any boolean mask beside the soft cap
  // (ReadsMaskArray), kMasksDropout a key-only one (TakesKeyMaskBeside).
  const MaskBeside beside = kFeatures == Features::kMasksSoftcap ? MaskBeside::kAnyForward
                            : TakesKeyMaskBeside(kFeatures)      ? MaskBeside::kKeyOnly
                                                                 : MaskBeside::kNone;
  if (auto why = UnsupportedFeatures(p, kFeatures, beside); !why.empty()) return fail(why);
  if (beside != MaskBeside::kNone && p.features.mask && p.features.mask_stride.col != 1)
    return fail("the boolean mask must be contiguous along the keys (MaskArrayRows)");
  if (!(p.scale > 0.0)) return fail("needs scale > 0 (the row maxima are taken before scaling)");
  if (s.head_dim < 1 || s.head_dim > kHeadDim) return fail("head_dim must be in [1, kHeadDim]");
  if (s.num_heads_k < 1 || s.num_heads % s.num_heads_k != 0)
    return fail("key heads must divide query heads");
  if (s.seqlen_q == 0 || s.batch == 0 || s.num_heads == 0) return {};  // nothing to write
  // Positions and tile indices are int32 inside the kernel (the grid is
  // one-dimensional, so batch and heads have no grid limits of their own).
  if (s.seqlen_q > INT32_MAX - Tr::kBlockM || s.seqlen_k > INT32_MAX - Tr::kBlockN)
    return fail("seqlen_q and seqlen_k must be below 2^31 - 256");
  if (CeilDiv(s.seqlen_q, Tr::kBlockM) * s.num_heads * s.batch >= int64_t(INT32_MAX))
    return fail("fewer than 2^31 tiles (" + std::to_string(Tr::kBlockM) + " query rows x heads x batch) per call");
  for (const void* ptr : {p.q, p.k, p.v, static_cast<const void*>(p.out)})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return fail("q, k, v and out must be 16-byte aligned");
  // The epilogue's 16-byte stores use q's strides for out (a size-1 dim's
  // stride only ever multiplies 0).
  auto misaligned = [](int64_t size, int64_t stride) { return size > 1 && (stride * 2) % 16 != 0; };
  if (misaligned(s.seqlen_q, p.q_stride.row) || misaligned(s.num_heads, p.q_stride.head) ||
      misaligned(s.batch, p.q_stride.batch))
    return fail("q's (and out's) strides in bytes must be multiples of 16");

  constexpr CUtensorMapDataType kType = std::is_same_v<Element, __nv_bfloat16>
                                            ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // seqlen_k = 0 still needs a valid map; the kernel then loads no key block.
  const int64_t seqlen_k_map = s.seqlen_k > 0 ? s.seqlen_k : 1;
  alignas(64) CUtensorMap q_map, k_map, v_map;
  if (auto e = EncodeBtnhMap(&q_map, kType, p.q, s.batch, s.seqlen_q, s.num_heads, s.head_dim,
                             p.q_stride, Tr::kBlockM, "q");
      !e.empty())
    return e + " (" + what + ")";
  if (auto e = EncodeBtnhMap(&k_map, kType, p.k, s.batch, seqlen_k_map, s.num_heads_k, s.head_dim,
                             p.k_stride, Tr::kBlockN, "k");
      !e.empty())
    return e + " (" + what + ")";
  if (auto e = EncodeBtnhMap(&v_map, kType, p.v, s.batch, seqlen_k_map, s.num_heads_k, s.head_dim,
                             p.k_stride, Tr::kBlockN, "v");
      !e.empty())
    return e + " (" + what + ")";

  // The output's map (q's strides, 64-row boxes: one consumer warpgroup's
  // rows per store), for the epilogue's TMA stores from its own staging
  // (Tr::kSeparateStaging; 256 stores from the registers).
  alignas(64) CUtensorMap o_map;
  if (auto e = EncodeBtnhMap(&o_map, kType, p.out, s.batch, s.seqlen_q, s.num_heads, s.head_dim, p.q_stride, 64,
                             "out");
      !e.empty())
    return e + " (" + what + ")";

  ForwardArgs args;
  args.out = p.out;
  args.lse = static_cast<float*>(p.lse);
  args.out_stride = p.q_stride;
  args.seqlen_q = int(s.seqlen_q);
  args.seqlen_k = int(s.seqlen_k);
  args.num_heads = int(s.num_heads);
  args.group = FastDivisor(int(s.group()));
  args.head_dim = int(s.head_dim);
  args.scale_log2 = float(p.scale) * kLog2e;
  args.is_causal = p.is_causal;
  const SoftcapFactors cap = SoftcapFactors::For(p);
  args.softcap_scale = cap.scale_over_cap;
  constexpr bool kBias = AddsBias(kFeatures);
  args.softcap_unscale = kBias ? float(1.0 / p.scale) : cap.cap_over_scale;

  auto kernel = ForwardKernel<Element, kHeadDim, Tr::kBlockN, kSchedule, kFeatures, kC>;
  // kMasksBiasTiles: the bias's map (EncodeBiasTilesMap: one consumer
  // warpgroup's 64 rows x one 128-byte column chunk a box). Other variants
  // pass it zeroed, unread.
  alignas(64) CUtensorMap bias_map{};
  if constexpr (kFeatures == Features::kMasksBiasTiles)
    if (auto e = EncodeBiasTilesMap<Element>(&bias_map, p); !e.empty()) return e + " (" + what + ")";

  constexpr int kSmemBytes = ForwardKernelSmemBytes<Tr, kFeatures>();
  if (auto e = PrepareSmem(kernel, kSmemBytes, "sm90 forward kernel"); !e.empty())
    return e + " (" + what + ")";
  // One block per SM (its shared memory and 384 or 512 threads at their
  // registers allow no second), looping over the tiles.
  TileScheduler scheduler{int(CeilDiv(s.seqlen_q, Tr::kBlockM)), int(s.num_heads), int(s.batch), p.is_causal};
  // A bias broadcast over the batch: its batch rows of a head together, so
  // that they share each tile's bias rows in L2 (TileScheduler::batch_inner).
  if constexpr (kBias) scheduler.batch_inner = s.batch > 1 && BiasFlatBatchStride(p.features) == 0;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return fail("querying the GPU's multiprocessor count failed");
  int64_t blocks = std::min<int64_t>(scheduler.Tiles(), sms);
  if (max_blocks > 0) blocks = std::min<int64_t>(blocks, max_blocks);
  // Sections of key heads whose K and V (the real head dim's bytes) fit in L2.
  // (Below 2^30 tiles: the sections' int32 tile counters may run one
  // section past the last tile.)
  const int64_t kv_head_bytes = s.seqlen_k * 2 * s.head_dim * int64_t(sizeof(Element));
  const bool sections =
      p.is_causal && scheduler.Tiles() < (int64_t(1) << 30) &&
      (order == CausalOrder::kDefault ? DefaultCausalOrder(kHeadDim, kv_head_bytes) : order) == CausalOrder::kSections;
  int pairs = 0;
  if (sections)
    pairs = section_pairs > 0 ? section_pairs
                              : CausalSection(kv_head_bytes, s.group(), scheduler.m_blocks, s.num_heads * s.batch, blocks);
  scheduler.SetSections(pairs, int(blocks));
  RecordKernel(what);  // (test hook: common/test_hooks.h)
  kernel<<<unsigned(blocks), Tr::kThreads, kSmemBytes, stream>>>(q_map, k_map, v_map, o_map, args, scheduler, p,
                                                                   bias_map);
  if (auto e = CheckLaunch("sm90 forward kernel"); !e.empty()) return e + " (" + what + ")";
  return {};
}

// The product's plain forward: at 64 kConsumersAt64 consumer warpgroups
// (kernel_traits.cuh: 3), but 2 for causal calls of up to 1024 queries,
// where 3 measured 0.95x of 2 on the H200 (its 192-row tiles: few per row,
// each with its diagonal's masked blocks) and 1.08x from 4096 on.
template <typename Element, int kHeadDim>
std::string LaunchForward(const AttentionParams& p, cudaStream_t stream) {
  constexpr Schedule kSchedule = FwdTraits<kHeadDim>::kDefaultSchedule;
  if constexpr (kHeadDim == 64 && kConsumersAt64 == 3) {
    if (p.is_causal && p.shape.seqlen_q <= 1024)
      return LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, Features::kNone, 2>(p, stream);
  }
  return LaunchForwardScheduled<Element, kHeadDim, kSchedule>(p, stream);
}

// The feature variants (kernel_traits.cuh's Features) at the head dim's
// default schedule and key block, on two consumer warpgroups
// (VariantConsumers): kMasksSoftcap only where the soft cap is on, so that
// calls without it keep the masks-only variant's registers.
//
// At 256 the variants that read a boolean mask's bytes or draw dropout run
// on 64-key blocks (kBlockN64), the others on 256's 80: MaskArrayRows
// reads 4 or 2 key bytes per lane (128 or 64 keys), a dense mask's summary
// has one entry per 64 keys, and ForwardDrop's Philox calls serve whole
// 32-key groups. A key-only mask trims a tile's 64-key blocks by the
// 128-key blocks that hold them (FeatureKeyBlocks). ptxas at 256 (bf16):
// no consumer local access in the key-block loops of kMasks, kSoftcap,
// kPlainSoftcap and kPlainDropout; 5 in kMasksDropout's, 10 in
// kMasksBoolean's and 14 in kMasksSoftcap's (the mask's bytes of a block,
// loaded before any is used). A bias at 256 stays on sm80's forward
// (handlers.cu): its tiles on 64-key blocks (two stages of 80-key K and V
// leave them no room) gave wrong non-causal results on the H200 in
// session 41 (pending/sm90-fwd-bias-256.patch).
template <typename Element, int kHeadDim>
std::string LaunchForwardWithFeatures(const AttentionParams& p, cudaStream_t stream) {
  constexpr Schedule kSchedule = FwdTraits<kHeadDim>::kDefaultSchedule;
  constexpr int kBlockN64 = kHeadDim == 256 ? 64 : 0;  // (0: the head dim's default key block)
  // A bias: kMasksBias for a float32 one, kMasksBias16 for one of the
  // inputs' 16-bit dtype (its loads into S's accumulators; no soft cap with
  // either). On the H200 (session 19, sm90_check --bias, B=4 T=S=4096
  // H=128 bf16) a [B,N,T,S] bias ran 354 TFLOP/s as bf16, 277 as float32.
  // kMasksBiasTiles (the 16-bit bias through shared memory) where
  // BiasTilesServe says TMA can read it and the device has the shared
  // memory (every 9.x part has: 231,424 of its 232,448 bytes at 128).
  if (p.features.bias) {
    if constexpr (kHeadDim == 256) {
      return "jax_flash: " + DescribeForward(p.shape, kHeadDim) + ": a bias at head dim 256 (the sm80 forward "
             "serves it)";
    } else {
      if (p.features.bias_type != BiasType::kAccum) {
        if (BiasTilesServe(p) && DeviceHasSmem(BiasTiles<FwdTraits<kHeadDim, 0, 2>>::kSmemBytes))
          return LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, Features::kMasksBiasTiles>(p, stream);
        return LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, Features::kMasksBias16>(p, stream);
      }
      return LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, Features::kMasksBias>(p, stream);
    }
  }
  // A boolean mask: kMasksBoolean (its reads into the masks' bits; no soft
  // cap or dropout with it, which that variant refuses), except beside the
  // soft cap, which kMasksSoftcap reads (ReadsMaskArray), and a key-only
  // one beside dropout, which kMasksDropout reads (TakesKeyMaskBeside).
  const bool mask_beside =
      p.features.softcap > 0.0 || (IsKeyOnlyMask(p.features) && p.features.dropout_rate > 0.0);
  if (p.features.mask && !mask_beside)
    return LaunchForwardScheduled<Element, kHeadDim, kSchedule, kBlockN64, Features::kMasksBoolean>(p, stream);
  // Dropout (without the soft cap, which that variant refuses):
  // kPlainDropout when it is the call's only feature (causal or not),
  // kMasksDropout beside the masks' features.
  if (p.features.dropout_rate > 0.0 && p.features.dropout_seed) {
    if (p.features.OnlyTransforms())
      return LaunchForwardScheduled<Element, kHeadDim, kSchedule, kBlockN64, Features::kPlainDropout>(p, stream);
    return LaunchForwardScheduled<Element, kHeadDim, kSchedule, kBlockN64, Features::kMasksDropout>(p, stream);
  }
  // The soft cap: kPlainSoftcap when it is the call's only feature,
  // kMasksSoftcap beside a boolean mask, kSoftcap (the same without the
  // mask's code) beside the masks' other features.
  if (p.features.softcap > 0.0) {
    if (p.features.OnlyTransforms())
      return LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, Features::kPlainSoftcap>(p, stream);
    if (p.features.mask)
      return LaunchForwardScheduled<Element, kHeadDim, kSchedule, kBlockN64, Features::kMasksSoftcap>(p, stream);
    return LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, Features::kSoftcap>(p, stream);
  }
  return LaunchForwardScheduled<Element, kHeadDim, kSchedule, 0, Features::kMasks>(p, stream);
}

#define JAX_FLASH_INSTANTIATE_SM90(Element)                                                 \
  template std::string LaunchForward<Element, 64>(const AttentionParams&, cudaStream_t);  \
  template std::string LaunchForward<Element, 128>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchForward<Element, 256>(const AttentionParams&, cudaStream_t);

// In launch_features_<dtype>.cu, their own files: the feature variants
// double the sm90 build's compile time. At 256 in
// launch_features_256_<dtype>.cu (seven variants; LaunchForwardWithFeatures
// gives their local accesses), so that CI's two cores compile them beside
// the 64 / 128 variants.
#define JAX_FLASH_INSTANTIATE_SM90_FEATURES(Element)                                                 \
  template std::string LaunchForwardWithFeatures<Element, 64>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchForwardWithFeatures<Element, 128>(const AttentionParams&, cudaStream_t);
#define JAX_FLASH_INSTANTIATE_SM90_FEATURES_256(Element) \
  template std::string LaunchForwardWithFeatures<Element, 256>(const AttentionParams&, cudaStream_t);

}  // namespace jax_flash::cuda::sm90
