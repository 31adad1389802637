// Launch template of the sm90 backward; instantiated per dtype in bwd_launch_<dtype>.cu.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/generic/launch.cuh"    // CheckLaunch, PrepareSmem, CheckGrid, CeilDiv
#include "cuda/sm80/bwd_kernels.cuh"  // DeltaAndClearKernel, DqConvertKernel (reused as they are)
#include "cuda/sm90/bwd256_kernel.cuh"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/bwd_launch.h"
#include "cuda/sm90/tensor_map.h"
#include "cuda/sm90/tile_scheduler.cuh"  // SectionHeads

namespace jax_flash::cuda::sm90 {

// "sm90 backward kernel (B=.., Tq=.., Tk=.., N=.., K=.., H=.. in kHeadDim ..)" for errors.
inline std::string DescribeBackward(const AttentionShape& s, int head_dim_padded) {
  return "sm90 backward kernel (B=" + std::to_string(s.batch) + ", Tq=" + std::to_string(s.seqlen_q) +
         ", Tk=" + std::to_string(s.seqlen_k) + ", N=" + std::to_string(s.num_heads) +
         ", K=" + std::to_string(s.num_heads_k) + ", H=" + std::to_string(s.head_dim) + " in " +
         std::to_string(head_dim_padded) + ")";
}

// The tensor maps of Q, dO (kBlockM rows), K and V (kBlockN rows) and the
// kernel's arguments of a checked call: LaunchBackwardScheduled's and
// LaunchBiasGradientScheduled's. `bias`: a bias variant's (softcap_unscale
// then 1 / scale, below). A map's encoding error, else "".
template <typename Element, typename Tr>
std::string PrepareBackwardCall(const AttentionParams& p, bool bias, CUtensorMap* q_map, CUtensorMap* k_map,
                                CUtensorMap* v_map, CUtensorMap* do_map, BackwardArgs* out) {
  const auto& s = p.shape;
  constexpr CUtensorMapDataType kType = std::is_same_v<Element, __nv_bfloat16>
                                            ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                            : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // seqlen_q = 0 still needs valid maps; the kernel then loads no Q or dO
  // (no steps) and writes zero dK, dV.
  const int64_t seqlen_q_map = s.seqlen_q > 0 ? s.seqlen_q : 1;
  struct MapSpec {
    CUtensorMap* map;
    const void* base;
    int64_t seq, heads;
    const Strides& stride;
    int box_rows;
    const char* name;
  };
  const MapSpec specs[4] = {{q_map, p.q, seqlen_q_map, s.num_heads, p.q_stride, Tr::kBlockM, "q"},
                            {do_map, p.dout, seqlen_q_map, s.num_heads, p.q_stride, Tr::kBlockM, "dout"},
                            {k_map, p.k, s.seqlen_k, s.num_heads_k, p.k_stride, Tr::kBlockN, "k"},
                            {v_map, p.v, s.seqlen_k, s.num_heads_k, p.k_stride, Tr::kBlockN, "v"}};
  for (const MapSpec& m : specs)
    if (auto e = EncodeBtnhMap(m.map, kType, m.base, s.batch, m.seq, m.heads, s.head_dim, m.stride, m.box_rows,
                               m.name);
        !e.empty())
      return e;

  BackwardArgs& args = *out;
  args.dk = p.dk;
  args.dv = p.dv;
  args.lse = static_cast<const float*>(p.lse);
  args.delta = static_cast<const float*>(p.delta);
  args.dq_accum = p.dq_accum;
  args.k_stride = p.k_stride;
  args.batch = int(s.batch);
  args.seqlen_q = int(s.seqlen_q);
  args.seqlen_k = int(s.seqlen_k);
  args.num_heads = int(s.num_heads);
  args.num_heads_k = int(s.num_heads_k);
  args.group = int(s.group());
  args.head_dim = int(s.head_dim);
  args.key_blocks = int(CeilDiv(s.seqlen_k, Tr::kBlockN));
  args.scale_log2 = float(p.scale) * kLog2e;
  args.scale = float(p.scale);
  args.is_causal = p.is_causal;
  const SoftcapFactors cap = SoftcapFactors::For(p);
  args.softcap_scale = cap.scale_over_cap;
  // kMasksBias(16) (which refuses the soft cap): 1 / scale, the bias in
  // S^T's raw units, the very float the forward's launch computes
  // (launch.cuh), so that both build the same logits (BiasColumns).
  args.softcap_unscale = bias ? float(1.0 / p.scale) : cap.cap_over_scale;
  args.causal_section = 0;  // LaunchBackwardScheduled may size it
  args.keys_descending = false;  // LaunchBackwardDeterministic may set it
  const DropoutPolicy dropout = DropoutPolicy::For(p, 0);  // (the same threshold and scale for every batch row)
  args.dropout_threshold_high = FragmentDropout::ThresholdHigh(dropout.threshold);
  args.dropout_keep_scale = FragmentDropout::KeepScale(dropout);
  return {};
}

// The shape, size and alignment checks of every sm90 backward launch
// (LaunchBackwardScheduled, LaunchBackwardDeterministic,
// LaunchBiasGradientScheduled), after its own: "" or the error, through the
// caller's `fail` (its kernel's description in front). `writes_dq`: the
// call computes dq (dq, dk, dv and the dQ accumulator 16-byte aligned too,
// seqlen_q * head_dim within the dQ conversion's 32-bit index); else the
// bias-gradient pass, which reads q, k, v, out and dout only.
template <typename Tr, typename Fail>
std::string CheckBackwardCall(const AttentionParams& p, bool writes_dq, const Fail& fail) {
  const auto& s = p.shape;
  if (!(p.scale > 0.0)) return fail("needs scale > 0");
  if (s.head_dim < 8 || s.head_dim > Tr::kHeadDim || s.head_dim % 8 != 0)
    return fail("head_dim must be a multiple of 8 in [8, kHeadDim]");
  if (s.num_heads_k < 1 || s.num_heads % s.num_heads_k != 0) return fail("key heads must divide query heads");
  if (auto e = CheckGrid(s); !e.empty()) return e;  // sm80's delta and dQ conversion grids
  // Positions, steps and tile indices are int32 inside the kernel.
  if (s.seqlen_q > INT32_MAX - 2 * Tr::kBlockM || s.seqlen_k > INT32_MAX - Tr::kBlockN)
    return fail("seqlen_q and seqlen_k must be below 2^31 - 256");
  if (writes_dq && s.seqlen_q * s.head_dim / 8 > int64_t(INT32_MAX) - 256)  // DqConvertKernel's 32-bit index
    return fail("seqlen_q * head_dim must be below 2^34");
  const int64_t tiles = CeilDiv(s.seqlen_k, Tr::kBlockN) * s.num_heads_k * s.batch;
  if (tiles >= int64_t(INT32_MAX) || CeilDiv(s.seqlen_q, Tr::kBlockM) * s.group() >= int64_t(INT32_MAX))
    return fail("fewer than 2^31 tiles (128 keys x key heads x batch) and steps per call");
  if (writes_dq) {
    for (const void* ptr : {p.q, p.k, p.v, static_cast<const void*>(p.out), p.dout, static_cast<const void*>(p.dq),
                            static_cast<const void*>(p.dk), static_cast<const void*>(p.dv),
                            static_cast<const void*>(p.dq_accum)})
      if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
        return fail("q, k, v, out, dout, dq, dk, dv and the dQ accumulator must be 16-byte aligned");
  } else {
    for (const void* ptr : {p.q, p.k, p.v, static_cast<const void*>(p.out), p.dout})
      if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return fail("q, k, v, out and dout must be 16-byte aligned");
  }
  // dk, dv take k's strides; the delta pass and the conversion read out,
  // dout and write dq with q's, in 16-byte accesses (a size-1 dim's stride
  // only ever multiplies 0).
  auto misaligned = [](int64_t size, int64_t stride) { return size > 1 && (stride * 2) % 16 != 0; };
  if (misaligned(s.seqlen_q, p.q_stride.row) || misaligned(s.num_heads, p.q_stride.head) ||
      misaligned(s.batch, p.q_stride.batch) || misaligned(s.seqlen_k, p.k_stride.row) ||
      misaligned(s.num_heads_k, p.k_stride.head) || misaligned(s.batch, p.k_stride.batch))
    return fail("strides in bytes must be multiples of 16");
  return {};
}

// LaunchBackwardScheduled's `causal_section`: sized by BackwardCausalSection.
constexpr int kSizedCausalSection = -1;

// The fewest tiles a causal section should hold (BackwardCausalSection):
// 128 at head dim 128 (about one per SM: the H200 has 132), 256 at 64.
// Timed in session 21 (sm90_bwd_order_check.cu, bf16, causal, sections of
// 2^k pairs against the former order, which is 1.00): at 128 the smallest
// section of >= 128 tiles was the fastest at every shape (B = 4, T = 4096:
// 1.08; B = 16, T = 1024: 1.31; B = 2, T = 8192: 1.09; B = 1, T = 16384:
// 1.04; GQA 16:4, T = 4096: 1.03, where 64 tiles gave 0.95 and 32 0.91);
// at 64, >= 256 tiles was within 0.03 of the fastest (B = 4, T = 4096:
// 1.29, 512 tiles 1.32; B = 8, T = 2048: 1.27; B = 1, T = 16384: 1.06;
// GQA 32:8: 1.03, 128 tiles 1.06, 64 tiles 0.96). Fewer tiles than SMs
// leave SMs to the next section, whose heaviest tiles then overlap the
// first's; more pairs than that spread the blocks in flight over more
// heads' Q, dO and dQ rows (the former order: ~132 heads, each block
// re-reading its rows from HBM).
constexpr int CausalSectionTiles(int head_dim_padded) { return head_dim_padded <= 64 ? 256 : 128; }

// (batch, key head) pairs per section of a causal backward's tile order
// (BwdTile): the smallest power of two whose section holds `min_tiles`
// tiles (key_blocks per pair; CausalSectionTiles); 0 (one section of every
// pair: the former order) when that takes every pair. Non-causal calls
// ignore it. Examples: H = 128, T = 4096 (32 key blocks) -> 4 pairs; H = 64,
// T = 4096 -> 8; H = 128, T = 1024 -> 16; H = 128, T = 16384 -> 1.
inline int BackwardCausalSection(const AttentionShape& s, int64_t key_blocks, int64_t min_tiles) {
  const int64_t pairs = s.batch * s.num_heads_k;
  int64_t section = 1;
  while (section * key_blocks < min_tiles && section < pairs) section *= 2;
  return section >= pairs ? 0 : int(section);
}

// The deterministic variant's non-causal sections (LaunchBackwardDeterministic,
// kDeterministicSection; its check timed these): as many pairs as keep one
// section's Q, dO and float32 dQ accumulator rows (seqlen_q rows of each
// of a key head's `group` query heads) within kSectionL2Bytes, the
// forward's budget for a section's K/V (FlashAttention-3's 32 MiB; the
// H200 has 60 MiB of L2), a power of two as in SectionHeads; 0 (one
// section of all pairs) when that holds every pair. Examples at bf16:
// H = 64, T = 4096 -> 16 pairs (2 MiB each); H = 128, T = 4096 -> 8;
// H = 128, T = 16384 -> 2. (Session 20 sized the causal sections so too;
// session 21's timings replaced that by BackwardCausalSection.)
inline int L2SizedSection(const AttentionShape& s, int64_t element_bytes) {
  const int64_t pairs = s.batch * s.num_heads_k;
  const int64_t pair_bytes = s.group() * s.seqlen_q * s.head_dim * (2 * element_bytes + 4);
  const int64_t section = SectionHeads(pair_bytes, 1);
  return section >= pairs ? 0 : int(section);
}

// kFeatures: the kernel variant (kernel_traits.cuh's Features); kNone takes
// no attention features, kMasks lengths, windows, position offsets and
// segment ids, kMasksSoftcap those and the soft cap (UnsupportedFeatures).
// kMasksBias / kMasksBias16 (the masks and a float32 / 16-bit bias, on the
// dQ-first schedules; LaunchBackwardWithBias, bwd_launch_bias_*.cu, since
// session 20) recompute the forward's logits, q.k + bias /
// scale; the bias gradient is not theirs (the jax_flash_dbias pass).
// `causal_section`: BwdTile's pairs per causal section, kSizedCausalSection
// (BackwardCausalSection) or a count forced by the check program (a count
// of at least every pair: one section); 0, the default, the order before
// session 21 (the bias-gradient pass's). The package's backward launches
// pass kSizedCausalSection (since session 21: tests/cuda/
// sm90_bwd_order_check.cu timed the orders on the H200, CausalSectionTiles).
template <typename Element, int kHeadDim, BwdSchedule kSchedule, Features kFeatures = Features::kNone>
std::string LaunchBackwardScheduled(const AttentionParams& p, cudaStream_t stream, int causal_section = 0) {
  using Tr = BwdTraitsFor<kHeadDim, kSchedule>;
  static_assert(std::is_same_v<Element, __nv_bfloat16> || std::is_same_v<Element, __half>);
  static_assert(kHeadDim != 256 || kFeatures == Features::kNone || kFeatures == Features::kMasks ||
                    kFeatures == Features::kMasksSoftcap || kFeatures == Features::kMasksDropout,
                "the 256 backward takes plain calls, the masks' features, the soft cap and dropout only");
  const auto& s = p.shape;
  constexpr bool kBias = AddsBias(kFeatures);
  constexpr bool kPolicy = UsesMaskPolicy(kFeatures);
  const std::string what = DescribeBackward(s, kHeadDim) +
                           (kFeatures == Features::kNone          ? ""
                            : kFeatures == Features::kMasks       ? " with masks"
                            : kFeatures == Features::kMasksBias   ? " with masks and bias"
                            : kFeatures == Features::kMasksBias16 ? " with masks and 16-bit bias"
                            : kFeatures == Features::kMasksBiasTiles ? " with masks and 16-bit bias tiles"
                            : kFeatures == Features::kMasksDropout ? " with masks and dropout"
                            : kFeatures == Features::kPlainDropout ? " with dropout, causal or none"
                            : kFeatures == Features::kPlainSoftcap ? " with soft cap, causal or none"
                                                                  : " with masks and soft cap");
  auto fail = [&](const std::string& why) { return "jax_flash: " + what + ": " + why; };
  // (The masks' variants read a boolean mask per S^T row: FeatureStepMask;
  // the kPlain* transforms none.)
  if (auto why = UnsupportedFeatures(p, kFeatures, kPolicy && !kBias ? MaskBeside::kAny : MaskBeside::kNone);
      !why.empty())
    return fail(why);
  if constexpr (kBias) {
    if (p.features.dbias || p.features.dbias_direct)
      return fail("computes no bias gradient (the bias-gradient pass, LaunchBiasGradientScheduled, does)");
    if (kFeatures != Features::kMasksBiasTiles && !BiasRowsFit(p))  // BiasColumns::Load's 32-bit row offsets
      return fail("the bias's rows of one batch entry and head must span fewer than 2^32 elements");
  }
  if (p.deterministic) return fail("no deterministic variant yet (dQ is summed by atomic adds)");
  if (p.dq_accum == nullptr) return fail("needs the float32 dQ accumulator");
  if (auto e = CheckBackwardCall<Tr>(p, true, fail); !e.empty()) return e;
  const int64_t tiles = CeilDiv(s.seqlen_k, Tr::kBlockN) * s.num_heads_k * s.batch;
  if (s.batch == 0 || s.num_heads == 0) return {};  // nothing to write

  const int64_t rows = s.batch * s.num_heads * s.seqlen_q;
  if (rows > 0) {
    sm80::DeltaAndClearKernel<Element, kHeadDim>
        <<<unsigned(CeilDiv(rows, sm80::DeltaLayout<kHeadDim>::kRowsPerBlock)), 256, 0, stream>>>(p, true);
    if (auto e = CheckLaunch("delta kernel"); !e.empty()) return e + " (" + what + ")";
  }

  if (tiles > 0) {
    alignas(64) CUtensorMap q_map, k_map, v_map, do_map;
    BackwardArgs args;
    if (auto e = PrepareBackwardCall<Element, Tr>(p, kBias, &q_map, &k_map, &v_map, &do_map, &args); !e.empty())
      return e + " (" + what + ")";
    if (causal_section == kSizedCausalSection)
      causal_section = BackwardCausalSection(s, CeilDiv(s.seqlen_k, Tr::kBlockN), CausalSectionTiles(kHeadDim));
    const int64_t pairs = s.batch * s.num_heads_k;
    args.causal_section = causal_section > 0 && causal_section < pairs ? causal_section : 0;
    // kMasksBiasTiles: the bias's map (the forward's, EncodeBiasTilesMap: a
    // box is a 64-query step's rows); zeroed, unread, elsewhere.
    alignas(64) CUtensorMap bias_map{};
    if constexpr (kFeatures == Features::kMasksBiasTiles) {
      static_assert(Tr::kBlockM == 64, "BwdBiasTile: one box of rows per step");
      if (auto e = EncodeBiasTilesMap<Element>(&bias_map, p); !e.empty()) return e + " (" + what + ")";
    }
    // (Head dim 256: Backward256Kernel, plain, kMasks, kMasksSoftcap or
    // kMasksDropout; its schedule is its own, bwd256_kernel.cuh.)
    auto kernel = [] {
      if constexpr (kHeadDim == 256) return Backward256Kernel<Element, kFeatures>;
      else return BackwardKernel<Element, kHeadDim, kSchedule, kFeatures>;
    }();
    // (The dropout variants' keep-bit exchange, kMasksBiasTiles's tile.)
    constexpr int kSmem = BackwardVariantSmemBytes<Tr, kFeatures>();
    if (auto e = PrepareSmem(kernel, kSmem, "sm90 backward kernel"); !e.empty())
      return e + " (" + what + ")";
    RecordKernel(what);  // (test hook: common/test_hooks.h)
    if constexpr (kHeadDim == 256)  // (Backward256Kernel takes no bias)
      kernel<<<unsigned(tiles), Tr::kThreads, kSmem, stream>>>(q_map, k_map, v_map, do_map, args, p);
    else
      kernel<<<unsigned(tiles), Tr::kThreads, kSmem, stream>>>(q_map, k_map, v_map, do_map, args, p, bias_map);
    if (auto e = CheckLaunch("sm90 backward kernel"); !e.empty()) return e + " (" + what + ")";
  }

  if (s.seqlen_q > 0) {
    const dim3 convert_grid(unsigned(CeilDiv(s.seqlen_q * s.head_dim / 8, 256)), unsigned(s.num_heads),
                            unsigned(s.batch));
    sm80::DqConvertKernel<Element><<<convert_grid, 256, 0, stream>>>(p);
    if (auto e = CheckLaunch("dq convert kernel"); !e.empty()) return e + " (" + what + ")";
  }
  return {};
}

// The bias gradient on the sm90 bias variants' tiles (BiasGradientKernel:
// S^T, dP^T, P^T, dS^T per step, dS^T into p.features.dbias by float32
// atomic adds where the bias is broadcast, else into dbias_direct by
// stores of the bias's type; no dV, dK, dQ), after sm80's delta pass (delta
// only: no dQ accumulator, no conversion). sm80's LaunchBiasGradient's
// contract: a bias, a dbias target, no dk; the caller zeroes the target
// first (pairs of blocks no step visits are not written) and rounds float32
// sums into a 16-bit dbias after (BiasGradientImpl, handlers.cu). kMasksBias16
// for a bias of the inputs' type, kMasksBias for float32 (as the bias
// variants pick). Dispatched through sm90::LaunchBiasGradient (session 20).
template <typename Element, int kHeadDim, BwdSchedule kSchedule = FeatureBwdSchedule(kHeadDim)>
std::string LaunchBiasGradientScheduled(const AttentionParams& p, cudaStream_t stream) {
  using Tr = BwdTraitsFor<kHeadDim, kSchedule>;
  static_assert(std::is_same_v<Element, __nv_bfloat16> || std::is_same_v<Element, __half>);
  const auto& s = p.shape;
  const bool bias16 = p.features.bias_type != BiasType::kAccum;
  // kMasksBiasTiles at 128 (64-query steps) where the backward's would
  // serve: the bias from BwdBiasTile's tile, as the backward reads it.
  bool bias_tiles = false;
  if constexpr (kHeadDim == 128 && Tr::kBlockM == 64)
    bias_tiles = bias16 && BiasTilesServe(p) && DeviceHasSmem(BwdBiasTile<Tr>::kSmemBytes);
  const std::string what = "sm90 bias gradient (B=" + std::to_string(s.batch) + ", Tq=" + std::to_string(s.seqlen_q) +
                           ", Tk=" + std::to_string(s.seqlen_k) + ", N=" + std::to_string(s.num_heads) +
                           ", K=" + std::to_string(s.num_heads_k) + ", H=" + std::to_string(s.head_dim) + " in " +
                           std::to_string(kHeadDim) +
                           (bias_tiles ? ", 16-bit bias tiles)" : bias16 ? ", 16-bit bias)" : ", float32 bias)");
  auto fail = [&](const std::string& why) { return "jax_flash: " + what + ": " + why; };
  if (auto why = UnsupportedFeatures(p, bias16 ? Features::kMasksBias16 : Features::kMasksBias); !why.empty())
    return fail(why);
  if (!LogitFeatures::WritesDbias(p) || p.dk != nullptr)
    return fail("needs a dbias target (dbias or dbias_direct) and no dk");
  if (p.features.dbias && p.features.dbias_direct) return fail("takes one dbias target, not both");
  if (!BiasRowsFit(p))  // BiasColumns::Load's and StoreBiasGradient's 32-bit row offsets
    return fail("the bias's rows of one batch entry and head must span fewer than 2^32 elements");
  if (auto e = CheckBackwardCall<Tr>(p, false, fail); !e.empty()) return e;
  const int64_t tiles = CeilDiv(s.seqlen_k, Tr::kBlockN) * s.num_heads_k * s.batch;
  if (s.batch == 0 || s.num_heads == 0 || s.seqlen_q == 0 || tiles == 0) return {};  // nothing to add

  const int64_t rows = s.batch * s.num_heads * s.seqlen_q;
  sm80::DeltaAndClearKernel<Element, kHeadDim>
      <<<unsigned(CeilDiv(rows, sm80::DeltaLayout<kHeadDim>::kRowsPerBlock)), 256, 0, stream>>>(p, false);
  if (auto e = CheckLaunch("delta kernel"); !e.empty()) return e + " (" + what + ")";

  alignas(64) CUtensorMap q_map, k_map, v_map, do_map;
  BackwardArgs args;
  if (auto e = PrepareBackwardCall<Element, Tr>(p, true, &q_map, &k_map, &v_map, &do_map, &args); !e.empty())
    return e + " (" + what + ")";
  auto launch = [&](auto kernel, int smem_bytes, const CUtensorMap& bias_map) -> std::string {
    if (auto e = PrepareSmem(kernel, smem_bytes, "sm90 bias gradient kernel"); !e.empty())
      return e + " (" + what + ")";
    RecordKernel(what);  // (test hook: common/test_hooks.h)
    kernel<<<unsigned(tiles), Tr::kThreads, smem_bytes, stream>>>(q_map, k_map, v_map, do_map, args, p, bias_map);
    if (auto e = CheckLaunch("sm90 bias gradient kernel"); !e.empty()) return e + " (" + what + ")";
    return {};
  };
  if constexpr (kHeadDim == 128 && Tr::kBlockM == 64) {
    if (bias_tiles) {
      alignas(64) CUtensorMap bias_map;
      if (auto e = EncodeBiasTilesMap<Element>(&bias_map, p); !e.empty()) return e + " (" + what + ")";
      return launch(BiasGradientKernel<Element, kHeadDim, kSchedule, Features::kMasksBiasTiles>,
                    BwdBiasTile<Tr>::kSmemBytes, bias_map);
    }
  }
  alignas(64) const CUtensorMap unused{};  // (the tiles' map: unread by these)
  return launch(bias16 ? BiasGradientKernel<Element, kHeadDim, kSchedule, Features::kMasksBias16>
                       : BiasGradientKernel<Element, kHeadDim, kSchedule, Features::kMasksBias>,
                Tr::kSmemBytes, unused);
}

// The deterministic variant's counters (DqOrder, bwd_kernel.cuh): one
// int32 per (batch, query head, query block of the default schedule's
// kBlockM: 128 at head dim 64, 64 at 128).
template <int kHeadDim>
int64_t DeterministicCounterCount(const AttentionShape& s) {
  using Tr = BwdTraitsFor<kHeadDim, DefaultBwdSchedule(kHeadDim)>;
  return s.batch * s.num_heads * CeilDiv(s.seqlen_q, Tr::kBlockM);
}

// The deterministic sm90 backward (issue 21; the check program only, not
// dispatched: tests/cuda/sm90_bwd_deterministic_check.cu): plain calls
// (no attention features) at DefaultBwdSchedule, DeterministicBackwardKernel
// between the same delta pass and dQ conversion as LaunchBackward, dQ's
// float32 adds into each query block in key block order, so that dq (and
// dk, dv, which every schedule writes once per element) are the same bit
// for bit run to run; p.deterministic may be either. `order`: ascending,
// descending (each section's pairs' key blocks from the last, light first
// where causal), or kDefault: descending where causal, else ascending.
// `counters`: DeterministicCounterCount<kHeadDim>(p.shape) int32 of device
// scratch, zeroed here (cudaMemsetAsync on `stream`) before the kernel.
// `section`: BwdTile's pairs per section, for non-causal calls too
// (kSizedCausalSection: BackwardCausalSection's count; 0: the plain
// kernel's former orders, a non-causal head's key blocks side by side; a
// count), or kDeterministicSection: L2SizedSection's count non-causal;
// causal, 0 ascending, BackwardCausalSection's descending.
//
// Why those (a model of the waits, not timed yet: tiles dispatched in
// index order onto 132 SMs, equal steps, a block's counter raised ~1.1
// steps after its adds are issued, DqOrder; B = 4, T = 4096 and B = 1,
// T = 16384 at both head dims): key block n's tile waits unless it reaches
// each query block that long after key block n - 1's did. Non-causal,
// every tile starts at query block 0: side by side (section 0) a head's
// tiles start together and each lags the one before it by ~1.4 steps more
// (modelled 0.62-0.97x of the unordered kernel), while a section of G
// pairs starts consecutive key blocks G tiles apart (0.99-1.0x). Causal,
// key block n starts at query block 2n (n at kBlockM 128), two steps
// later in the order of query blocks than n - 1 at its own start, so it
// must start ~3.4 steps after it: the causal order over every pair gives
// that (0.94-1.0x), the L2-sized sections do not (0.67-0.76x).
// Timed (session 21, the check): 0.76-0.87x non-causal and causal alike,
// and causal under the default's sections since session 21 (0.63-0.74x of
// it through JAX). Descending causal (session 21): key block n starts at
// query block r n (r = kBlockN / kBlockM) and needs n + 1's adds there, which
// n + 1 made r steps into its tile, so the tiles of a pair may run side by
// side (in the default's sections) with r steps to spare, less the handoff.
// kHandoff: where DeterministicBackwardKernel raises and reads its counters
// (DqHandoff: the template default, kUnderS, and three candidates for the
// check program's A/B).
constexpr int kDeterministicSection = -2;
enum class DqKeyOrder { kDefault, kAscending, kDescending };
template <typename Element, int kHeadDim, DqHandoff kHandoff = DqHandoff::kUnderS>
std::string LaunchBackwardDeterministic(const AttentionParams& p, int* counters, cudaStream_t stream,
                                        int section = kDeterministicSection,
                                        DqKeyOrder order = DqKeyOrder::kDefault) {
  constexpr BwdSchedule kSchedule = DefaultBwdSchedule(kHeadDim);
  using Tr = BwdTraitsFor<kHeadDim, kSchedule>;
  static_assert(std::is_same_v<Element, __nv_bfloat16> || std::is_same_v<Element, __half>);
  const auto& s = p.shape;
  const std::string what = "deterministic " + DescribeBackward(s, kHeadDim);
  auto fail = [&](const std::string& why) { return "jax_flash: " + what + ": " + why; };
  if (auto why = UnsupportedFeatures(p, Features::kNone); !why.empty())
    return fail(why + " (the deterministic variant takes plain calls only)");
  if (p.dq_accum == nullptr) return fail("needs the float32 dQ accumulator");
  if (counters == nullptr || reinterpret_cast<uintptr_t>(counters) % 4 != 0)
    return fail("needs its int32 counters (DeterministicCounterCount of them), 4-byte aligned");
  if (auto e = CheckBackwardCall<Tr>(p, true, fail); !e.empty()) return e;
  const int64_t key_blocks = CeilDiv(s.seqlen_k, Tr::kBlockN);
  const int64_t tiles = key_blocks * s.num_heads_k * s.batch;
  const int64_t counter_count = DeterministicCounterCount<kHeadDim>(s);
  if (counter_count >= int64_t(INT32_MAX) || int64_t(Tr::kConsumerWarps) * key_blocks >= int64_t(INT32_MAX))
    return fail("fewer than 2^31 counters (batch x heads x query blocks) and key blocks / 8");  // DqOrder's int32
  if (s.batch == 0 || s.num_heads == 0) return {};  // nothing to write

  const int64_t rows = s.batch * s.num_heads * s.seqlen_q;
  if (rows > 0) {
    sm80::DeltaAndClearKernel<Element, kHeadDim>
        <<<unsigned(CeilDiv(rows, sm80::DeltaLayout<kHeadDim>::kRowsPerBlock)), 256, 0, stream>>>(p, true);
    if (auto e = CheckLaunch("delta kernel"); !e.empty()) return e + " (" + what + ")";
  }

  if (tiles > 0) {
    if (const cudaError_t e = cudaMemsetAsync(counters, 0, size_t(counter_count) * sizeof(int), stream);
        e != cudaSuccess)
      return fail(std::string("clearing the counters: ") + cudaGetErrorString(e));
    alignas(64) CUtensorMap q_map, k_map, v_map, do_map;
    BackwardArgs args;
    if (auto e = PrepareBackwardCall<Element, Tr>(p, false, &q_map, &k_map, &v_map, &do_map, &args); !e.empty())
      return e + " (" + what + ")";
    const bool descending = order == DqKeyOrder::kDescending || (order == DqKeyOrder::kDefault && p.is_causal);
    if (section == kDeterministicSection)
      section = !p.is_causal ? L2SizedSection(s, sizeof(Element)) : descending ? kSizedCausalSection : 0;
    if (section == kSizedCausalSection) section = BackwardCausalSection(s, key_blocks, CausalSectionTiles(kHeadDim));
    const int64_t pairs = s.batch * s.num_heads_k;
    args.causal_section = section > 0 && section < pairs ? section : 0;
    args.keys_descending = descending;
    // (Head dim 256: Deterministic256Kernel, which raises each counter at
    // its send, as kAtSend.)
    auto kernel = [] {
      if constexpr (kHeadDim == 256) return Deterministic256Kernel<Element>;
      else return DeterministicBackwardKernel<Element, kHeadDim, kSchedule, kHandoff>;
    }();
    if (auto e = PrepareSmem(kernel, Tr::kSmemBytes, "sm90 deterministic backward kernel"); !e.empty())
      return e + " (" + what + ")";
    kernel<<<unsigned(tiles), Tr::kThreads, Tr::kSmemBytes, stream>>>(q_map, k_map, v_map, do_map, args, p,
                                                                       counters);
    if (auto e = CheckLaunch("sm90 deterministic backward kernel"); !e.empty()) return e + " (" + what + ")";
  }

  if (s.seqlen_q > 0) {
    const dim3 convert_grid(unsigned(CeilDiv(s.seqlen_q * s.head_dim / 8, 256)), unsigned(s.num_heads),
                            unsigned(s.batch));
    sm80::DqConvertKernel<Element><<<convert_grid, 256, 0, stream>>>(p);
    if (auto e = CheckLaunch("dq convert kernel"); !e.empty()) return e + " (" + what + ")";
  }
  return {};
}

template <typename Element, int kHeadDim>
std::string LaunchBackward(const AttentionParams& p, cudaStream_t stream) {
  return LaunchBackwardScheduled<Element, kHeadDim, DefaultBwdSchedule(kHeadDim)>(p, stream, kSizedCausalSection);
}

// The feature variants at FeatureBwdSchedule (bwd_kernel_traits.cuh): kMasksSoftcap
// only where the soft cap is on, so that calls without it keep the
// masks-only variant's registers; kMasksDropout for dropout (without the
// soft cap, which it refuses). Where the soft cap or dropout is the call's
// only feature (AttentionFeatures::OnlyTransforms), the plain kernel's schedule with it
// (kPlainSoftcap, kPlainDropout: PlainTransformBwdSchedule).
template <typename Element, int kHeadDim>
std::string LaunchBackwardWithFeatures(const AttentionParams& p, cudaStream_t stream) {
  constexpr BwdSchedule kSchedule = FeatureBwdSchedule(kHeadDim);
  // Head dim 256: the masks' variant (Backward256Kernel<kMasks>), with the
  // soft cap kMasksSoftcap, with dropout kMasksDropout (their policy also
  // for calls whose only feature the transform is: the 256 steps' products
  // dwarf the bits, and two variants fewer to compile); the launch refuses
  // a bias and dropout with the soft cap by name (handlers.cu's
  // Sm90BackwardSupports keeps them on sm80's backward).
  if constexpr (kHeadDim == 256) {
    if (p.features.dropout_rate > 0.0 && p.features.dropout_seed)
      return LaunchBackwardScheduled<Element, 256, kSchedule, Features::kMasksDropout>(p, stream,
                                                                                      kSizedCausalSection);
    if (p.features.softcap > 0.0)
      return LaunchBackwardScheduled<Element, 256, kSchedule, Features::kMasksSoftcap>(p, stream,
                                                                                      kSizedCausalSection);
    return LaunchBackwardScheduled<Element, 256, kSchedule, Features::kMasks>(p, stream, kSizedCausalSection);
  } else {
    const bool plain = p.features.OnlyTransforms();
    if (p.features.dropout_rate > 0.0 && p.features.dropout_seed) {
      if (plain)
        return LaunchBackwardScheduled<Element, kHeadDim, PlainTransformBwdSchedule(kHeadDim, true),
                                       Features::kPlainDropout>(p, stream, kSizedCausalSection);
      return LaunchBackwardScheduled<Element, kHeadDim, DropoutBwdSchedule(kHeadDim), Features::kMasksDropout>(
          p, stream, kSizedCausalSection);
    }
    if (p.features.softcap > 0.0) {
      if (plain)
        return LaunchBackwardScheduled<Element, kHeadDim, PlainTransformBwdSchedule(kHeadDim, false),
                                       Features::kPlainSoftcap>(p, stream, kSizedCausalSection);
      return LaunchBackwardScheduled<Element, kHeadDim, kSchedule, Features::kMasksSoftcap>(p, stream,
                                                                                            kSizedCausalSection);
    }
    return LaunchBackwardScheduled<Element, kHeadDim, kSchedule, Features::kMasks>(p, stream, kSizedCausalSection);
  }
}

// The bias variants at FeatureBwdSchedule: kMasksBias16 where the bias has
// the inputs' 16-bit dtype, kMasksBias for a float32 one; at 128
// kMasksBiasTiles (BwdBiasTile) for a 16-bit one that TMA can read
// (BiasTilesServe) where the device has the shared memory (every 9.x part).
template <typename Element, int kHeadDim>
std::string LaunchBackwardWithBias(const AttentionParams& p, cudaStream_t stream) {
  constexpr BwdSchedule kSchedule = FeatureBwdSchedule(kHeadDim);
  if constexpr (kHeadDim == 128) {
    if (BiasTilesServe(p) && DeviceHasSmem(BwdBiasTile<BwdTraitsFor<kHeadDim, kSchedule>>::kSmemBytes))
      return LaunchBackwardScheduled<Element, kHeadDim, kSchedule, Features::kMasksBiasTiles>(p, stream,
                                                                                              kSizedCausalSection);
  }
  if (p.features.bias_type != BiasType::kAccum)
    return LaunchBackwardScheduled<Element, kHeadDim, kSchedule, Features::kMasksBias16>(p, stream,
                                                                                         kSizedCausalSection);
  return LaunchBackwardScheduled<Element, kHeadDim, kSchedule, Features::kMasksBias>(p, stream, kSizedCausalSection);
}

template <typename Element, int kHeadDim>
std::string LaunchBiasGradient(const AttentionParams& p, cudaStream_t stream) {
  return LaunchBiasGradientScheduled<Element, kHeadDim>(p, stream);
}

#define JAX_FLASH_INSTANTIATE_SM90_BWD(Element)                                            \
  template std::string LaunchBackward<Element, 64>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchBackward<Element, 128>(const AttentionParams&, cudaStream_t);

// In bwd_launch_256_<dtype>.cu: the 256 kernels (bwd256_kernel.cuh), plain
// calls, default and deterministic, their own objects so that CI's two
// cores compile them beside the others; the feature variants (kMasks,
// kMasksSoftcap, kMasksDropout) in bwd_launch_256_features_<dtype>.cu.
#define JAX_FLASH_INSTANTIATE_SM90_BWD_256(Element)                                         \
  template std::string LaunchBackward<Element, 256>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchBackwardDeterministicDefault<Element, 256>(const AttentionParams&, int*, cudaStream_t);
#define JAX_FLASH_INSTANTIATE_SM90_BWD_256_FEATURES(Element) \
  template std::string LaunchBackwardWithFeatures<Element, 256>(const AttentionParams&, cudaStream_t);

// In bwd_launch_features_<dtype>.cu, their own files, so that CI's two
// cores compile them beside the plain ones.
#define JAX_FLASH_INSTANTIATE_SM90_BWD_FEATURES(Element)                                               \
  template std::string LaunchBackwardWithFeatures<Element, 64>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchBackwardWithFeatures<Element, 128>(const AttentionParams&, cudaStream_t);

#define JAX_FLASH_INSTANTIATE_SM90_BWD_BIAS(Element)                                               \
  template std::string LaunchBackwardWithBias<Element, 64>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchBackwardWithBias<Element, 128>(const AttentionParams&, cudaStream_t); \
  template std::string LaunchBiasGradient<Element, 64>(const AttentionParams&, cudaStream_t);     \
  template std::string LaunchBiasGradient<Element, 128>(const AttentionParams&, cudaStream_t);

// The package's deterministic launch (bwd_launch.h): DqHandoff::kHelperWarp
// (since session 41; kAtSend before) and the default section
// (kDeterministicSection). kAtSend timed faster than kUnderS at 7 of 8
// shapes in session 21's check (0.82-0.87x of the default backward's
// speed against kUnderS's 0.76-0.87x); the helper warp, which takes the
// counters' waits and raises off the consumers, 1.04-1.15x kAtSend through
// JAX on the H200 (sessions 40 and 41: 0.83-0.95x of the default at H = 64
// / 128, T = 1024 / 4096; docs/bench/combo41_h200_ab.md). At 256
// Deterministic256Kernel raises its counters at its send either way.
template <typename Element, int kHeadDim>
std::string LaunchBackwardDeterministicDefault(const AttentionParams& p, int* counters, cudaStream_t stream) {
  static_assert(DeterministicCounterBlock(kHeadDim) == BwdTraitsFor<kHeadDim, DefaultBwdSchedule(kHeadDim)>::kBlockM,
                "bwd_launch.h's DeterministicCounters must count DeterministicCounterCount's blocks");
  return LaunchBackwardDeterministic<Element, kHeadDim, DqHandoff::kHelperWarp>(p, counters, stream);
}

// In bwd_launch_deterministic_<dtype>.cu (the deterministic variant's own
// objects, compiled beside the others).
#define JAX_FLASH_INSTANTIATE_SM90_BWD_DETERMINISTIC(Element)                                                \
  template std::string LaunchBackwardDeterministicDefault<Element, 64>(const AttentionParams&, int*,         \
                                                                       cudaStream_t);                        \
  template std::string LaunchBackwardDeterministicDefault<Element, 128>(const AttentionParams&, int*, cudaStream_t);

}  // namespace jax_flash::cuda::sm90
